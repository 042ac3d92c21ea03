//! `fence_nvme_check`: the watchdog companion. Run by the `watchdog` daemon as its
//! test binary (`test-binary = /usr/sbin/fence_nvme_check`): exits 2 when this node's
//! key, as `fence_nvme -o on` recorded it, is gone from any device (the node was
//! fenced, so the watchdog reboots it), 1 when a device cannot be read, 0 otherwise.
//!
//! Arguments: `test` (what watchdog passes; ignored), `repair N` (watchdog's repair
//! call: exits N, nothing can be repaired), `--state-file PATH`, `--timeout SECONDS`.

use std::path::PathBuf;
use std::time::Duration;

use fence_nvme::options::DEFAULT_STATE_FILE;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut state = PathBuf::from(DEFAULT_STATE_FILE);
    let mut timeout = Duration::from_secs(10);
    let mut i = 0;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1)) {
            ("test", _) => i += 1,
            ("repair", Some(code)) => std::process::exit(code.parse().unwrap_or(1)),
            ("--state-file", Some(p)) => {
                state = PathBuf::from(p);
                i += 2;
            }
            ("--timeout", Some(s)) => match s.parse() {
                Ok(n) => {
                    timeout = Duration::from_secs(n);
                    i += 2;
                }
                Err(_) => usage(&format!("--timeout {s:?}: not a whole number of seconds")),
            },
            (a, _) => usage(&format!("unexpected argument {a:?}")),
        }
    }
    let out = fence_nvme::agent::check(&state, &fence_nvme::real_devices(), timeout);
    for l in &out.stderr {
        eprintln!("{l}");
    }
    std::process::exit(out.code);
}

fn usage(why: &str) -> ! {
    eprintln!(
        "fence_nvme_check: {why}\nusage: fence_nvme_check [test] [--state-file PATH] [--timeout SECONDS] | repair CODE"
    );
    std::process::exit(1)
}
