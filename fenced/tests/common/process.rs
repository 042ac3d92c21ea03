//! The real `fenced` binary as a child process, for tests of what a deployment runs:
//! the command and its output as text, `fenced run` killed by PID on drop (its log,
//! stderr, kept in a file), `fenced status -o json`, `etcdctl`, and a blocking poll.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::etcd::Etcd;

/// `fenced` (the binary of this build), with nothing set yet.
pub fn fenced() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fenced"))
}

/// A command's stdout, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stderr, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The arguments of `fenced run --fencer none` as node `node` (instance `i-<node>`)
/// under `root` on `endpoints`, TTL 2 s, sweep 1 s.
pub fn run_args(endpoints: &str, root: &str, node: &str) -> Vec<String> {
    let instance = format!("i-{node}");
    [
        "run",
        "--fencer",
        "none",
        "--node-id",
        node,
        "--root",
        root,
        "--etcd-endpoints",
        endpoints,
        "--ttl-secs",
        "2",
        "--sweep-secs",
        "1",
        "--instance-id",
        &instance,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A child process (`.0`), killed (SIGKILL, by PID) and reaped on drop.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fenced status -o json` under `root` on `etcd`: the document.
pub fn status_json(etcd: &Etcd, root: &str) -> serde_json::Value {
    let o = fenced()
        .args(["status", "-o", "json", "--root", root])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .output()
        .unwrap();
    assert!(o.status.success(), "status failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `etcdctl` with `args` against `etcd`; its stdout.
pub fn etcdctl(etcd: &Etcd, args: &[&str]) -> String {
    let o = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &etcd.endpoint()])
        .args(args)
        .output()
        .expect("etcdctl (Debian etcd-client)");
    assert!(o.status.success(), "etcdctl {args:?}: {}", stderr(&o));
    stdout(&o)
}

/// Polls `f` every 100 ms (blocking) until it returns true; fails the test if
/// `timeout` passes first.
pub fn wait_within(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`wait_within`] 60 s.
pub fn wait(what: &str, f: impl FnMut() -> bool) {
    wait_within(what, Duration::from_secs(60), f);
}

/// A `fenced run` child process, killed (SIGKILL, by PID) on drop.
pub struct FencedRun {
    child: Daemon,
    log: PathBuf,
}

impl FencedRun {
    /// Starts `fenced run --fencer none` as node `node` (instance `i-<node>`) under
    /// `root` on `endpoints`, TTL 2 s, sweep 1 s, logging at info to `<dir>/<node>.log`;
    /// `extra` arguments are appended and `env` is added to the environment (the
    /// test's own `FAILPOINTS` is never inherited).
    pub fn start(
        endpoints: &str,
        root: &str,
        node: &str,
        dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let log = dir.join(format!("{node}.log"));
        let mut cmd = fenced();
        cmd.args(run_args(endpoints, root, node))
            .args(extra)
            .env("FENCED_LOG", "info")
            .env_remove("FAILPOINTS")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the daemon's log file"));
        let child = Daemon(cmd.spawn().expect("spawn `fenced run`"));
        Self { child, log }
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.0.try_wait().expect("try_wait")
    }

    /// Waits for the process to exit: its status.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.0.wait().expect("wait for the daemon")
    }

    /// SIGKILL: the process ends wherever it is, with no chance to clean up.
    pub fn kill(&mut self) {
        self.child.0.kill().expect("SIGKILL the daemon");
        self.child.0.wait().expect("reap the daemon");
    }
}
