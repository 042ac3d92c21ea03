//! The watchdog companions, `fence_nvme_check` and `fence_nvme_check_hardreboot`, as
//! fence-agents ship `fence_scsi_check` and `fence_scsi_check_hardreboot`: the
//! `watchdog` daemon runs each file of its `test-directory` (`/etc/watchdog.d`) as
//! `NAME test` every interval, and on a non-zero exit as `NAME repair CODE`; when the
//! repair exits non-zero too, the daemon reboots the host (its own shutdown: processes
//! signalled, file systems synced and unmounted).
//!
//! Both run [`crate::agent::check`]: 0 when this node's key is registered on every
//! device `on` recorded, 2 when it is gone from any (this node was fenced), 1 when a
//! device cannot be read. The hard-reboot variant, on 2 only, reboots at once with
//! `reboot(2)` `RB_AUTOBOOT` and no sync, before the daemon's orderly shutdown could
//! write the fenced node's dirty pages (refused by the device by now, but a writeback
//! stuck on them can hang that shutdown). The reboot is a parameter of [`run`], so tests
//! prove it is reached (and only then) without rebooting anything.
//!
//! Arguments: `test` (ignored), `repair CODE` (exits CODE: nothing can be repaired),
//! `--state-file PATH`, `--timeout SECONDS` (default 10).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{self, Opener, Outcome};
use crate::options::DEFAULT_STATE_FILE;

/// Which companion runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `fence_nvme_check`: reports; the watchdog daemon reboots the host its way.
    Check,
    /// `fence_nvme_check_hardreboot`: reboots at once, unsynced, when the key is gone.
    HardReboot,
}

impl Variant {
    /// The installed name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Check => "fence_nvme_check",
            Self::HardReboot => "fence_nvme_check_hardreboot",
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Check the key (the `test` call, or no argument).
    Check {
        /// The record `fence_nvme -o on` wrote.
        state_file: PathBuf,
        /// How long every device has to answer.
        timeout: Duration,
    },
    /// watchdog's `repair CODE`: exit CODE.
    Repair(i32),
}

/// Parses the arguments (without the program name). The error is the usage message.
pub fn parse_args<S: AsRef<str>>(variant: Variant, args: &[S]) -> Result<Request, String> {
    let mut state_file = PathBuf::from(DEFAULT_STATE_FILE);
    let mut timeout = Duration::from_secs(10);
    let mut i = 0;
    let usage = |why: String| {
        format!(
            "{name}: {why}\nusage: {name} [test] [--state-file PATH] [--timeout SECONDS] | repair CODE",
            name = variant.name()
        )
    };
    while i < args.len() {
        match (args[i].as_ref(), args.get(i + 1).map(AsRef::as_ref)) {
            ("test", _) => i += 1,
            ("repair", Some(code)) => {
                return code
                    .parse()
                    .map(Request::Repair)
                    .map_err(|_| usage(format!("repair {code:?}: not an exit code")));
            }
            ("--state-file", Some(p)) => {
                state_file = PathBuf::from(p);
                i += 2;
            }
            ("--timeout", Some(s)) => {
                timeout = s.parse().map(Duration::from_secs).map_err(|_| {
                    usage(format!("--timeout {s:?}: not a whole number of seconds"))
                })?;
                i += 2;
            }
            (a, _) => return Err(usage(format!("unexpected argument {a:?}"))),
        }
    }
    Ok(Request::Check {
        state_file,
        timeout,
    })
}

/// Runs a companion. `reboot` is called only by [`Variant::HardReboot`] and only when
/// the check exits 2; it returns only if the reboot could not be done (its error is
/// reported and the exit stays 2, so the watchdog daemon reboots the host its own way).
pub fn run<S: AsRef<str>>(
    variant: Variant,
    args: &[S],
    opener: &Arc<dyn Opener>,
    reboot: &mut dyn FnMut() -> io::Error,
) -> Outcome {
    let (state_file, timeout) = match parse_args(variant, args) {
        Ok(Request::Check {
            state_file,
            timeout,
        }) => (state_file, timeout),
        Ok(Request::Repair(code)) => {
            return Outcome {
                code,
                ..Outcome::default()
            };
        }
        Err(usage) => {
            return Outcome {
                code: 1,
                stderr: vec![usage],
                ..Outcome::default()
            };
        }
    };
    let mut out = agent::check(&state_file, opener, timeout);
    if variant == Variant::HardReboot && out.code == 2 {
        // Printed before the call: nothing is printed after a reboot that works.
        for l in out.stderr.drain(..) {
            eprintln!("{l}");
        }
        eprintln!(
            "{}: this node was fenced: rebooting now (reboot(2) RB_AUTOBOOT, no sync)",
            variant.name()
        );
        let e = reboot();
        out.stderr.push(format!(
            "{}: the immediate reboot failed: {e}; exit 2 so that the watchdog daemon reboots this node",
            variant.name()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use nvme_resv::model;
    use nvme_resv::{Acquire, HostId, Register, ReservationType, Reservations};

    use super::*;
    use crate::state::LocalState;

    struct Hosts(HashMap<PathBuf, model::Host>);

    impl Opener for Hosts {
        fn open(&self, path: &Path) -> nvme_resv::Result<agent::Device> {
            match self.0.get(path) {
                Some(h) => Ok(Box::new(h.clone())),
                None => Err(nvme_resv::Error::NotNvme {
                    path: path.to_path_buf(),
                }),
            }
        }
    }

    /// Host `a` registered as node na on one namespace, its record in `dir`.
    fn setup(dir: &Path) -> (model::Namespace, Arc<dyn Opener>, String) {
        let ns = model::Namespace::new();
        let a = ns.host(HostId([b'a'; 16]));
        let key = nvme_resv::key_for_node("na");
        a.register(&Register::register(key)).unwrap();
        a.acquire(&Acquire::acquire(
            key,
            ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        ))
        .unwrap();
        let state = dir.join("state");
        LocalState {
            node: Some("na".into()),
            key,
            devices: vec!["/dev/a1".into()],
        }
        .store(&state)
        .unwrap();
        let opener: Arc<dyn Opener> =
            Arc::new(Hosts(HashMap::from([(PathBuf::from("/dev/a1"), a)])));
        (ns, opener, state.to_str().unwrap().to_owned())
    }

    fn fence_na(ns: &model::Namespace) {
        let b = ns.host(HostId([b'b'; 16]));
        let kb = nvme_resv::key_for_node("nb");
        b.register(&Register::register(kb)).unwrap();
        b.acquire(&Acquire::preempt_and_abort(
            kb,
            nvme_resv::key_for_node("na"),
            ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        ))
        .unwrap();
    }

    #[test]
    fn hard_reboot_only_when_the_key_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (ns, opener, state) = setup(dir.path());
        let reboots = std::cell::Cell::new(0);
        let mut reboot = || {
            reboots.set(reboots.get() + 1);
            io::Error::new(io::ErrorKind::PermissionDenied, "refused by the test")
        };
        // Registered: 0, no reboot, either variant.
        for v in [Variant::Check, Variant::HardReboot] {
            let o = run(v, &["test", "--state-file", &state], &opener, &mut reboot);
            assert_eq!(o.code, 0, "{o}");
        }
        // A device that cannot be read: 1, no reboot (the key is not known to be gone).
        let none: Arc<dyn Opener> = Arc::new(Hosts(HashMap::new()));
        let o = run(
            Variant::HardReboot,
            &["test", "--state-file", &state],
            &none,
            &mut reboot,
        );
        assert_eq!(o.code, 1, "{o}");
        // Not unfenced yet: 0, no reboot.
        let missing = dir.path().join("absent").to_str().unwrap().to_owned();
        let o = run(
            Variant::HardReboot,
            &["--state-file", &missing],
            &opener,
            &mut reboot,
        );
        assert_eq!(o.code, 0, "{o}");
        // watchdog's repair call: never a reboot.
        let o = run(Variant::HardReboot, &["repair", "2"], &opener, &mut reboot);
        assert_eq!(o.code, 2);
        assert_eq!(reboots.get(), 0);

        fence_na(&ns);
        // The plain check reports 2 and leaves the reboot to the daemon.
        let o = run(
            Variant::Check,
            &["test", "--state-file", &state],
            &opener,
            &mut reboot,
        );
        assert_eq!((o.code, reboots.get()), (2, 0), "{o}");
        // The hard-reboot variant reboots; when that fails it says so and still exits 2.
        let o = run(
            Variant::HardReboot,
            &["test", "--state-file", &state],
            &opener,
            &mut reboot,
        );
        assert_eq!((o.code, reboots.get()), (2, 1), "{o}");
        assert!(
            o.stderr
                .last()
                .unwrap()
                .contains("the immediate reboot failed"),
            "{o}"
        );
    }

    #[test]
    fn arguments() {
        assert_eq!(
            parse_args(Variant::Check, &["test"]),
            Ok(Request::Check {
                state_file: DEFAULT_STATE_FILE.into(),
                timeout: Duration::from_secs(10)
            })
        );
        assert_eq!(
            parse_args(
                Variant::Check,
                &["--timeout", "3", "--state-file", "/x", "test"]
            ),
            Ok(Request::Check {
                state_file: "/x".into(),
                timeout: Duration::from_secs(3)
            })
        );
        assert_eq!(
            parse_args(Variant::HardReboot, &["repair", "5"]),
            Ok(Request::Repair(5))
        );
        for bad in [
            &["--timeout", "soon"][..],
            &["--bogus"],
            &["repair", "x"],
            &["--state-file"],
        ] {
            let e = parse_args(Variant::HardReboot, bad).unwrap_err();
            assert!(
                e.starts_with("fence_nvme_check_hardreboot: ") && e.contains("usage:"),
                "{bad:?}: {e}"
            );
        }
    }
}
