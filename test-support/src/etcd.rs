//! A single-member etcd for one test or bench, and the version of the etcd under test.
//!
//! The binary is `$FENCED_ETCD`, else the older per-crate names `$FENCED_TEST_ETCD`
//! (fenced's tests) and `$FENCED_BENCH_ETCD` (benches), else Debian's `/usr/bin/etcd`
//! (`apt-get install etcd-server`: 3.4.23 on Debian 12). `scripts/install-deps` unpacks
//! Debian 13's etcd 3.5 at `/var/tmp/fenced-etcd-3.5/usr/bin/etcd`, and
//! `scripts/test-all` runs the etcd-facing suites once per version.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Environment variables naming the etcd binary, first set (non-empty) wins.
pub const ETCD_ENV: [&str; 3] = ["FENCED_ETCD", "FENCED_TEST_ETCD", "FENCED_BENCH_ETCD"];

/// How long [`Etcd::start`] waits for `/health`: generous, because the build machines
/// are shared and a cold start under load has taken several seconds.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary: the first of [`ETCD_ENV`] that is set, else `/usr/bin/etcd`.
///
/// The first call in a process also prints the binary's version to stderr (`etcd 3.5.16
/// (/path)`, shown with a failing test's output or `--nocapture`), so every test run
/// names the etcd it ran against, whichever launcher starts it.
pub fn etcd_binary() -> String {
    let _ = detected_version();
    binary_from_env()
}

fn binary_from_env() -> String {
    ETCD_ENV
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "/usr/bin/etcd".to_owned())
}

/// `etcd --version` of [`etcd_binary`], run once per process and printed.
fn detected_version() -> &'static Result<EtcdVersion, String> {
    static VERSION: OnceLock<Result<EtcdVersion, String>> = OnceLock::new();
    VERSION.get_or_init(|| {
        let bin = binary_from_env();
        let v = EtcdVersion::of(&bin);
        match &v {
            Ok(v) => eprintln!("test-support: etcd {v} ({bin})"),
            Err(e) => eprintln!("test-support: etcd version unknown: {e}"),
        }
        v
    })
}

/// The version of an etcd server binary, as `etcd --version` reports it.
///
/// Tests use it where etcd releases behave differently (see
/// [`EtcdVersion::has_stale_leader_revoke_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    /// 3 for every etcd this project supports.
    pub major: u32,
    /// 4 (Debian 12), 5 (Debian 13), 6...
    pub minor: u32,
    /// Patch release.
    pub patch: u32,
}

impl EtcdVersion {
    /// The version of the etcd that the tests start ([`etcd_binary`]), detected once per
    /// process.
    ///
    /// # Panics
    /// When the binary cannot be run or does not print an `etcd Version: X.Y.Z` line; the
    /// message names the binary and what to do.
    pub fn current() -> Self {
        match detected_version() {
            Ok(v) => *v,
            Err(e) => panic!("{e}"),
        }
    }

    /// Runs `binary --version` and parses its `etcd Version: X.Y.Z` line.
    ///
    /// # Errors
    /// A message naming the binary and the cause: it cannot be run (the OS error), exits
    /// with a failure, or prints no version line.
    pub fn of(binary: &str) -> Result<Self, String> {
        let out = Command::new(binary)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                format!(
                    "cannot run `{binary} --version`: {e} (apt-get install etcd-server, \
                     scripts/install-deps for etcd 3.5, or set FENCED_ETCD)"
                )
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "`{binary} --version` failed ({}): {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Self::parse(&text).ok_or_else(|| {
            format!("`{binary} --version` printed no `etcd Version: X.Y.Z` line: {text}")
        })
    }

    /// Parses the output of `etcd --version` (its `etcd Version: 3.4.23` line).
    pub fn parse(version_output: &str) -> Option<Self> {
        let v = version_output
            .lines()
            .find_map(|l| l.trim().strip_prefix("etcd Version:"))?
            .trim();
        // Pre-releases (`3.6.0-rc.1`) count as their release.
        let v = v.split(['-', '+']).next()?;
        let mut parts = v.split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(Self {
            major,
            minor,
            patch,
        })
    }

    /// Whether this etcd has etcd-io/etcd#16822's fix for etcd-io/etcd#15247 (a *leader*
    /// that stalls for longer than a lease's TTL and then resumes may still act as the
    /// lessor for a moment and revoke every lease it saw no renewal for, although the
    /// new leader renewed them): before revoking, the leader confirms its leadership.
    /// Released in 3.4.31 (#17465) and 3.5.13 (#17425); in 3.6 from the start. Debian
    /// 12's 3.4.23 lacks it, Debian 13's 3.5.16 has it.
    ///
    /// The fix is partial: the check is skipped while the raft loop ticked within the
    /// last three ticks, which covers a leader whose raft loop is blocked (slow disk) but
    /// not one whose whole process froze (SIGSTOP, a paused VM): its ticker resumes with
    /// it. Measured with `fenced/tests/hung_member.rs` on 3.5.16: a leader stopped for
    /// 8 s and continued still revoked live leases in about half of the runs.
    pub fn has_stale_leader_revoke_check(self) -> bool {
        match (self.major, self.minor) {
            (3, 4) => self.patch >= 31,
            (3, 5) => self.patch >= 13,
            (major, minor) => (major, minor) > (3, 5),
        }
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
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
    /// Plaintext `/health` listener of a TLS server (`--listen-metrics-urls`).
    health_port: Option<u16>,
    tls: bool,
    /// The arguments it was started with ([`Etcd::restart`]).
    args: Vec<std::ffi::OsString>,
}

/// How [`Etcd::start_with`] secures the client port.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// Serve clients over TLS with this server certificate and key (PEM files) and
    /// trust client certificates signed by `ca`.
    pub tls: Option<crate::tls::ServerFiles>,
    /// `--client-cert-auth`: clients must present a certificate signed by the CA; with
    /// auth enabled its CN is the etcd user.
    pub client_cert_auth: bool,
    /// `--auth-token-ttl` in seconds (simple tokens; etcd's default is 300).
    pub auth_token_ttl_secs: Option<u32>,
    /// Further server flags, as given (e.g. `--quota-backend-bytes=…`).
    pub extra_args: Vec<String>,
}

impl Etcd {
    /// Starts etcd on two free loopback ports (client, peer) with a temp data dir, and
    /// waits until `/health` answers `true` (at most [`HEALTH_TIMEOUT`]).
    ///
    /// # Panics
    /// When the binary cannot be started, exits early, or is not healthy in time; the
    /// message carries etcd's log.
    pub fn start() -> Self {
        Self::start_with(&EtcdOptions::default())
    }

    /// [`Etcd::start`] with TLS and client-certificate options: the client port speaks
    /// `https://` when `opts.tls` is set ([`Etcd::endpoint`] says so), and `/health` is
    /// then polled on a plaintext metrics port of its own.
    ///
    /// # Panics
    /// As [`Etcd::start`].
    pub fn start_with(opts: &EtcdOptions) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cp, pp) = (free_port(), free_port());
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{cp}");
        let peer = format!("http://127.0.0.1:{pp}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log file");
        let mut cmd = Command::new(etcd_binary());
        cmd.args(["--name", "n1", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--logger=zap", "--log-outputs=stderr"])
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .arg(format!("--initial-cluster=n1={peer}"));
        let mut health_port = None;
        if let Some(tls) = &opts.tls {
            let hp = free_port();
            health_port = Some(hp);
            cmd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg(format!("--listen-metrics-urls=http://127.0.0.1:{hp}"));
        }
        if opts.client_cert_auth {
            cmd.arg("--client-cert-auth");
        }
        if let Some(ttl) = opts.auth_token_ttl_secs {
            cmd.arg(format!("--auth-token-ttl={ttl}"));
        }
        cmd.args(&opts.extra_args);
        let args: Vec<std::ffi::OsString> = cmd.get_args().map(ToOwned::to_owned).collect();
        let child = cmd
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
            health_port,
            tls: opts.tls.is_some(),
            args,
        };
        etcd.wait_healthy();
        etcd
    }

    /// SIGKILLs the server and starts it again on the same ports and data dir (a
    /// member restart: leases and keys survive, simple auth tokens do not), then waits
    /// for `/health`.
    ///
    /// # Panics
    /// As [`Etcd::start`].
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("log file");
        self.child = Command::new(etcd_binary())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("restart etcd");
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let etcd = self;
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
    }

    fn healthy(&self) -> bool {
        healthy(self.health_port.unwrap_or(self.client_port))
    }

    /// The client URL, `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
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
    fn parses_the_version_lines_of_debians_etcd_releases() {
        let bookworm = "etcd Version: 3.4.23\nGit SHA: Not provided (use ./build instead of go build)\nGo Version: go1.19.8\nGo OS/Arch: linux/amd64\n";
        let trixie = "etcd Version: 3.5.16\nGit SHA: Not provided (use ./build instead of go build)\nGo Version: go1.24.0\nGo OS/Arch: linux/amd64\n";
        let v34 = EtcdVersion::parse(bookworm).unwrap();
        let v35 = EtcdVersion::parse(trixie).unwrap();
        assert_eq!((v34.major, v34.minor, v34.patch), (3, 4, 23));
        assert_eq!(v35.to_string(), "3.5.16");
        assert!(v34 < v35);
        assert_eq!(
            EtcdVersion::parse("etcd Version: 3.6.0-rc.1\n").map(|v| v.to_string()),
            Some("3.6.0".into())
        );
        for bad in [
            "",
            "etcd Version: 3.5\n",
            "etcd Version: x.y.z\n",
            "Version: 3.5.16",
        ] {
            assert_eq!(EtcdVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn stale_leader_revoke_check_is_in_releases_from_the_fix_on() {
        let v = |s: &str| EtcdVersion::parse(&format!("etcd Version: {s}")).unwrap();
        for buggy in ["3.3.27", "3.4.23", "3.4.30", "3.5.0", "3.5.12"] {
            assert!(!v(buggy).has_stale_leader_revoke_check(), "{buggy}");
        }
        for fixed in ["3.4.31", "3.4.37", "3.5.13", "3.5.16", "3.6.0", "4.0.0"] {
            assert!(v(fixed).has_stale_leader_revoke_check(), "{fixed}");
        }
    }

    #[test]
    fn the_binary_under_test_reports_its_version() {
        let v = EtcdVersion::of(&etcd_binary()).expect("etcd --version");
        assert_eq!(v, EtcdVersion::current());
        assert_eq!(v.major, 3, "{v}");
        let missing = EtcdVersion::of("/nonexistent/etcd").unwrap_err();
        assert!(
            missing.contains("/nonexistent/etcd") && missing.contains("FENCED_ETCD"),
            "{missing}"
        );
    }

    #[test]
    fn two_servers_get_distinct_ports() {
        let (a, b) = (Etcd::start(), Etcd::start());
        assert_ne!(a.endpoint(), b.endpoint());
        assert!(a.healthy() && b.healthy());
    }
}
