//! The real `fenced` binary as a child process (`fenced run`), for tests of what a
//! deployment runs: SIGKILLed by PID on drop, its log (stderr) kept in a file.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A `fenced run` child process, killed (SIGKILL, by PID) on drop.
pub struct FencedRun {
    child: Child,
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
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fenced"));
        cmd.args(["run", "--fencer", "none", "--node-id", node, "--root", root])
            .args(["--etcd-endpoints", endpoints])
            .args(["--ttl-secs", "2", "--sweep-secs", "1"])
            .args(["--instance-id", &format!("i-{node}")])
            .args(extra)
            .env("FENCED_LOG", "info")
            .env_remove("FAILPOINTS")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the daemon's log file"));
        let child = cmd.spawn().expect("spawn `fenced run`");
        Self { child, log }
    }

    /// Everything the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// SIGKILL: the process ends wherever it is, with no chance to clean up.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the daemon");
        self.child.wait().expect("reap the daemon");
    }
}

impl Drop for FencedRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
