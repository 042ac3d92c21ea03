//! The systemd notification protocol (`sd_notify(3)`): one datagram per state change
//! on the unix socket named by `NOTIFY_SOCKET`, and the watchdog period from
//! `WATCHDOG_USEC`/`WATCHDOG_PID`.
//!
//! Our own dozen lines on std's `UnixDatagram` instead of a crate: the protocol is one
//! `sendto` of `KEY=value` lines, std reaches abstract socket names (`@...`) on Linux,
//! and no dependency (nor `unsafe` env mutation) is needed for it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// `NOTIFY_SOCKET` or `WATCHDOG_USEC` could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is neither an absolute path nor an abstract name (`@...`).
    #[error(
        "NOTIFY_SOCKET={value:?} is neither an absolute path nor an abstract socket name (@...): start fenced from systemd (Type=notify) or unset NOTIFY_SOCKET"
    )]
    BadSocket {
        /// The variable's value.
        value: String,
    },
    /// The notification socket could not be created or addressed.
    #[error("cannot use the systemd notification socket {value:?}: {source}")]
    Socket {
        /// The variable's value.
        value: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `WATCHDOG_USEC` is not a positive number of microseconds.
    #[error(
        "WATCHDOG_USEC={value:?} is not a positive number of microseconds (check WatchdogSec= in the unit)"
    )]
    BadWatchdogUsec {
        /// The variable's value.
        value: String,
    },
}

/// Where the service manager listens, if it does; sending never fails the daemon
/// (a manager that went away is logged, not fatal).
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier that sends nothing (not started by systemd; unit tests).
    pub fn disabled() -> Self {
        Self {
            target: None,
            watchdog: None,
        }
    }

    /// From this process's environment: `NOTIFY_SOCKET` (unset: sends nothing),
    /// `WATCHDOG_USEC` (only if `WATCHDOG_PID` is unset or is this process).
    pub fn from_env() -> Result<Self, NotifyError> {
        let socket = std::env::var("NOTIFY_SOCKET").ok();
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        Self::from_vars(socket.as_deref(), usec.as_deref(), pid.as_deref())
    }

    fn from_vars(
        socket: Option<&str>,
        usec: Option<&str>,
        pid: Option<&str>,
    ) -> Result<Self, NotifyError> {
        let target = match socket.filter(|s| !s.is_empty()) {
            None => None,
            Some(value) => {
                let io = |source| NotifyError::Socket {
                    value: value.to_owned(),
                    source,
                };
                let addr = if let Some(name) = value.strip_prefix('@') {
                    SocketAddr::from_abstract_name(name.as_bytes()).map_err(io)?
                } else if value.starts_with('/') {
                    SocketAddr::from_pathname(value).map_err(io)?
                } else {
                    return Err(NotifyError::BadSocket {
                        value: value.to_owned(),
                    });
                };
                let sock = UnixDatagram::unbound().map_err(io)?;
                // A manager that stopped reading must not stall the daemon.
                sock.set_nonblocking(true).map_err(io)?;
                Some((sock, addr))
            }
        };
        let ours = pid.is_none_or(|p| p.trim() == std::process::id().to_string());
        let watchdog = match usec.filter(|_| ours) {
            None => None,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(us) if us > 0 => Some(Duration::from_micros(us)),
                _ => {
                    return Err(NotifyError::BadWatchdogUsec {
                        value: v.to_owned(),
                    });
                }
            },
        };
        Ok(Self { target, watchdog })
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// The watchdog period systemd enforces (`WatchdogSec=`), if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `state` (newline-separated `KEY=value` assignments).
    pub fn send(&self, state: &str) {
        let Some((sock, addr)) = &self.target else {
            return;
        };
        if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
            tracing::warn!(error = %e, state, "cannot notify the service manager");
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// `STATUS=`: what the daemon is doing.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    /// `WATCHDOG=1`: the daemon is healthy.
    pub fn watchdog_ping(&self) {
        self.send("WATCHDOG=1");
    }
}

/// `WatchdogSec=` (`watchdog`) must fit the lease timing. At most the self-fence
/// `margin`: a hung daemon (no self-fencing check runs) is killed no later than a
/// healthy one would have self-fenced. Above `margin - ttl`: pings stop once the lease
/// is older than its TTL, and a lease that lapses but is renewed within the margin is
/// the self-fencing clock's to judge, not systemd's. `Err` says what to set.
pub fn check_watchdog_timing(
    watchdog: Duration,
    ttl: Duration,
    margin: Duration,
) -> Result<(), String> {
    let s = |d: Duration| d.as_secs_f64();
    let floor = margin.saturating_sub(ttl);
    if watchdog > margin {
        return Err(format!(
            "WatchdogSec={:.1}s is longer than the self-fence margin {:.1}s: a hung daemon would outlive the moment it should have self-fenced; set WatchdogSec= to at most {:.1}s",
            s(watchdog),
            s(margin),
            s(margin)
        ));
    }
    if watchdog <= floor || watchdog < Duration::from_secs(1) {
        return Err(format!(
            "WatchdogSec={:.1}s is too short: the daemon stops pinging when its lease is older than the TTL ({:.1}s) and would be killed before the self-fence margin ({:.1}s) decides; set WatchdogSec= above {:.1}s (and at least 1s), at most {:.1}s",
            s(watchdog),
            s(ttl),
            s(margin),
            s(floor),
            s(margin)
        ));
    }
    Ok(())
}

/// A status is one assignment: a newline would start another.
fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_reach_a_path_socket_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::from_vars(path.to_str(), None, None).unwrap();
        n.status("waiting for etcd\nat x");
        n.ready("member at generation 3");
        n.watchdog_ping();
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        for _ in 0..3 {
            let len = rx.recv(&mut buf).unwrap();
            got.push(String::from_utf8_lossy(&buf[..len]).into_owned());
        }
        assert_eq!(
            got,
            [
                "STATUS=waiting for etcd at x",
                "READY=1\nSTATUS=member at generation 3",
                "WATCHDOG=1"
            ]
        );
    }

    #[test]
    fn abstract_names_and_bad_values() {
        let name = format!("fenced-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let n = Notifier::from_vars(Some(&format!("@{name}")), None, None).unwrap();
        n.stopping("leaving");
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=leaving");

        let e = Notifier::from_vars(Some("relative/sock"), None, None).unwrap_err();
        assert!(e.to_string().contains("neither an absolute path"), "{e}");
        let e = Notifier::from_vars(None, Some("soon"), None).unwrap_err();
        assert!(e.to_string().contains("WATCHDOG_USEC=\"soon\""), "{e}");
        // Unset socket: nothing is sent, nothing fails.
        assert!(!Notifier::from_vars(None, None, None).unwrap().enabled());
    }

    #[test]
    fn watchdog_sec_must_fit_between_margin_minus_ttl_and_margin() {
        let (ttl, margin) = (Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(
            check_watchdog_timing(Duration::from_secs(8), ttl, margin),
            Ok(())
        );
        assert_eq!(check_watchdog_timing(margin, ttl, margin), Ok(()));
        let e = check_watchdog_timing(Duration::from_secs(11), ttl, margin).unwrap_err();
        assert!(e.contains("at most 10.0s"), "{e}");
        let e = check_watchdog_timing(Duration::from_secs(5), ttl, margin).unwrap_err();
        assert!(e.contains("above 5.0s"), "{e}");
        let e = check_watchdog_timing(
            Duration::from_millis(500),
            Duration::from_secs(2),
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(e.contains("at least 1s"), "{e}");
    }

    #[test]
    fn the_watchdog_period_is_ours_only_for_our_pid() {
        let ours = std::process::id().to_string();
        let n = Notifier::from_vars(None, Some("3000000"), Some(&ours)).unwrap();
        assert_eq!(n.watchdog(), Some(Duration::from_secs(3)));
        let n = Notifier::from_vars(None, Some("3000000"), Some("1")).unwrap();
        assert_eq!(n.watchdog(), None);
        let n = Notifier::from_vars(None, Some("3000000"), None).unwrap();
        assert_eq!(n.watchdog(), Some(Duration::from_secs(3)));
    }
}
