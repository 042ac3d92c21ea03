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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn an_exit_before_the_deadline_is_its_status() {
        let mut child = Command::new("sh").args(["-c", "exit 7"]).spawn().unwrap();
        let status = wait_or_kill(&mut child, Instant::now() + Duration::from_secs(10));
        assert_eq!(status.and_then(|s| s.code()), Some(7));
    }

    #[test]
    fn a_child_past_the_deadline_is_killed_and_reaped() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let t0 = Instant::now();
        assert_eq!(
            wait_or_kill(&mut child, t0 + Duration::from_millis(200)),
            None
        );
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "waited out the sleep"
        );
        // Reaped: nothing left to wait for, and the status says SIGKILL.
        let status = child.try_wait().unwrap().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }
}
