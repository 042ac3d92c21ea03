//! A single-member etcd for one test or bench.
//!
//! The binary is `$FENCED_ETCD`, else the older per-crate names `$FENCED_TEST_ETCD`
//! (fenced's tests) and `$FENCED_BENCH_ETCD` (benches), else Debian's `/usr/bin/etcd`
//! (`apt-get install etcd-server`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variables naming the etcd binary, first set (non-empty) wins.
pub const ETCD_ENV: [&str; 3] = ["FENCED_ETCD", "FENCED_TEST_ETCD", "FENCED_BENCH_ETCD"];

/// How long [`Etcd::start`] waits for `/health`: generous, because the build machines
/// are shared and a cold start under load has taken several seconds.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary: the first of [`ETCD_ENV`] that is set, else `/usr/bin/etcd`.
pub fn etcd_binary() -> String {
    ETCD_ENV
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "/usr/bin/etcd".to_owned())
}

/// Whether the etcd whose client port is `client_port` on 127.0.0.1 answers
/// `/health` with `"health":"true"` (it is up and its cluster has a leader).
pub fn healthy(client_port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", client_port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

/// A free loopback TCP port (bound, then released: another process may take it before
/// the caller binds it, which [`Etcd::start`] reports as a failed start with etcd's log).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// A running single-member etcd; SIGKILLed (by PID) and reaped on drop, its data dir
/// removed.
#[derive(Debug)]
pub struct Etcd {
    child: Child,
    dir: tempfile::TempDir,
    client_port: u16,
}

impl Etcd {
    /// Starts etcd on two free loopback ports (client, peer) with a temp data dir, and
    /// waits until `/health` answers `true` (at most [`HEALTH_TIMEOUT`]).
    ///
    /// # Panics
    /// When the binary cannot be started, exits early, or is not healthy in time; the
    /// message carries etcd's log.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cp, pp) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let child = Command::new(etcd_binary())
            .args(["--name", "n1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--logger=zap", "--log-outputs=stderr"])
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .arg(format!("--initial-cluster=n1={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e} (apt-get install etcd-server, or set FENCED_ETCD)",
                    etcd_binary()
                )
            });
        let mut etcd = Self {
            child,
            dir,
            client_port: cp,
        };
        let t0 = Instant::now();
        while !etcd.healthy() {
            if let Ok(Some(status)) = etcd.child.try_wait() {
                panic!(
                    "etcd exited before it was healthy ({status}); log: {}",
                    etcd.log()
                );
            }
            assert!(
                t0.elapsed() < HEALTH_TIMEOUT,
                "etcd not healthy after {HEALTH_TIMEOUT:?}; log: {}",
                etcd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }

    fn healthy(&self) -> bool {
        healthy(self.client_port)
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The server's log so far (empty if it cannot be read).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// The server's PID (for a test that kills or inspects it itself).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The temp directory holding `data/` and `etcd.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to exactly this PID; wait reaps it, so the PID is not
        // reused while a zombie.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        // A reaped process has no /proc entry.
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn starts_answers_on_its_endpoint_and_is_killed_on_drop() {
        let etcd = Etcd::start();
        let pid = etcd.pid();
        let ep = etcd.endpoint();
        assert!(ep.starts_with("http://127.0.0.1:"), "{ep}");
        assert!(etcd.healthy());
        assert!(alive(pid));
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe of etcd");
        assert!(
            exe.file_name()
                .is_some_and(|n| n.to_string_lossy().contains("etcd")),
            "{}",
            exe.display()
        );
        assert!(etcd.dir().join("data").is_dir());
        assert!(!etcd.log().is_empty(), "etcd logged nothing");
        let dir = etcd.dir().to_owned();
        drop(etcd);
        assert!(!alive(pid), "etcd {pid} still running after drop");
        assert!(!dir.exists(), "{} not removed", dir.display());
    }

    #[test]
    fn two_servers_get_distinct_ports() {
        let (a, b) = (Etcd::start(), Etcd::start());
        assert_ne!(a.endpoint(), b.endpoint());
        assert!(a.healthy() && b.healthy());
    }
}
