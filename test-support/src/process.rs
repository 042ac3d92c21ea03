//! Child processes of a test, bounded in time: a binary under test that hangs is
//! killed, so the test fails instead of hanging with it.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// Waits for `child` (polling every 20 ms) until `deadline`: its exit status, or, once
/// `deadline` has passed, `None` after killing it (SIGKILL, by its PID) and reaping it.
pub fn wait_or_kill(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(s) = child.try_wait().expect("try_wait on a child of the test") {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
