//! `--on-fence`: what the daemon does to the rest of the host when it self-fences or
//! finds its reservation key preempted. The daemon itself stops every write it issues
//! (its I/O gate); an application on the same host is a separate process, which this
//! action stops.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node::NodeId;

/// Where the kernel takes magic SysRq commands.
pub const SYSRQ_TRIGGER: &str = "/proc/sysrq-trigger";

/// The action taken on a self-fence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OnFence {
    /// Exit (status 3) and nothing else: the application must notice by itself (its
    /// writes fail with a reservation conflict; its unit is bound to fenced's).
    #[default]
    Exit,
    /// Reboot the host at once through the magic SysRq `b` (no sync, no unmount):
    /// every process of this boot ends, and the next boot may join again.
    Reboot,
    /// Run this shell command (e.g. `systemctl stop myapp`), bounded in time, then exit.
    Exec(String),
}

/// `--on-fence` is not `exit`, `reboot` or `exec:CMD`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --on-fence {0:?}: use exit, reboot or exec:COMMAND (a non-empty shell command)")]
pub struct InvalidOnFence(pub String);

impl std::str::FromStr for OnFence {
    type Err = InvalidOnFence;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exit" => Ok(Self::Exit),
            "reboot" => Ok(Self::Reboot),
            _ => match s.strip_prefix("exec:") {
                Some(cmd) if !cmd.trim().is_empty() => Ok(Self::Exec(cmd.to_owned())),
                _ => Err(InvalidOnFence(s.to_owned())),
            },
        }
    }
}

impl std::fmt::Display for OnFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exit => f.write_str("exit"),
            Self::Reboot => f.write_str("reboot"),
            Self::Exec(cmd) => write!(f, "exec:{cmd}"),
        }
    }
}

/// Settings of the action: the hook's time limit and the SysRq file (a test points it
/// at a temporary file so that `reboot` can be checked without rebooting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnFenceConfig {
    /// The action.
    pub action: OnFence,
    /// How long an `exec` hook may run before it is killed.
    pub hook_timeout: Duration,
    /// The magic SysRq trigger ([`SYSRQ_TRIGGER`]).
    pub sysrq_trigger: PathBuf,
}

impl Default for OnFenceConfig {
    fn default() -> Self {
        Self {
            action: OnFence::Exit,
            hook_timeout: Duration::from_secs(30),
            sysrq_trigger: PathBuf::from(SYSRQ_TRIGGER),
        }
    }
}

/// What the action did (logged; the daemon exits after it either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFenceOutcome {
    /// Nothing to do.
    Exit,
    /// `b` was written to the SysRq trigger (on a real host, we do not get here).
    RebootRequested,
    /// The reboot request failed: the daemon exits; the watchdog, if armed, reboots.
    RebootFailed(String),
    /// The hook ran and exited with this status (`None`: killed by a signal).
    HookExited(Option<i32>),
    /// The hook did not finish in time and was killed.
    HookTimedOut,
    /// The hook could not be started.
    HookFailed(String),
}

/// Writes `b` (reboot now) to the SysRq trigger. Deliberately not `s` (sync) first:
/// syncing writes dirty pages of the shared device after we decided to stop writing it
/// (with a lease lost but the key not yet preempted, those writes would land), and a
/// sync can block for minutes on a device that stopped answering, delaying the reboot
/// the fence counts on. fence_scsi's hard-reboot check and TrueNAS's fencing daemon do
/// the same.
fn reboot_now(sysrq: &Path) -> Result<(), std::io::Error> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(sysrq)?;
    f.write_all(b"b")
}

/// Checks, before the daemon joins, that `--on-fence reboot` could reboot: the SysRq
/// trigger is a regular file (procfs shows it as one; a FIFO or a directory is refused,
/// never waited on) that this process may open for writing. Nothing is written. Under
/// systemd, `ProtectKernelTunables=yes` mounts `/proc/sysrq-trigger` read-only, so the
/// open fails with "Read-only file system": found at start, not when the host must go
/// down.
pub fn check_reboot(sysrq: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let meta = std::fs::metadata(sysrq)
        .map_err(|e| format!("cannot use --on-fence reboot: {}: {e}", sysrq.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "cannot use --on-fence reboot: {} is a {}, not the SysRq trigger",
            sysrq.display(),
            crate::files::file_kind(meta.file_type())
        ));
    }
    let hint = if sysrq == Path::new(SYSRQ_TRIGGER) {
        " (under systemd, ProtectKernelTunables=yes makes it read-only: add a drop-in with ProtectKernelTunables=no; run fenced as root)"
    } else {
        ""
    };
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(sysrq)
        .map(drop)
        .map_err(|e| {
            format!(
                "cannot use --on-fence reboot: cannot open {} for writing: {e}{hint}",
                sysrq.display()
            )
        })
}

/// Runs the action for `node` (at `generation`) that self-fenced for `reason`.
/// An `exec` hook gets `FENCED_NODE_ID`, `FENCED_GENERATION` and `FENCED_FENCE_REASON`
/// in its environment; it is killed after `hook_timeout`.
pub async fn on_fence(
    cfg: &OnFenceConfig,
    node: &NodeId,
    generation: u64,
    reason: &str,
) -> OnFenceOutcome {
    match &cfg.action {
        OnFence::Exit => OnFenceOutcome::Exit,
        OnFence::Reboot => {
            tracing::error!(step = "on_fence", node = %node, sysrq = %cfg.sysrq_trigger.display(), "rebooting the host now (SysRq b)");
            match reboot_now(&cfg.sysrq_trigger) {
                Ok(()) => OnFenceOutcome::RebootRequested,
                Err(e) => {
                    let why = format!(
                        "cannot write to {}: {e} (is fenced running as root?)",
                        cfg.sysrq_trigger.display()
                    );
                    tracing::error!(step = "on_fence", node = %node, error = %why, "reboot failed");
                    OnFenceOutcome::RebootFailed(why)
                }
            }
        }
        OnFence::Exec(cmd) => {
            tracing::warn!(step = "on_fence", node = %node, hook = %cmd, "running the on-fence hook");
            let child = tokio::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(cmd)
                .env("FENCED_NODE_ID", node.as_str())
                .env("FENCED_GENERATION", generation.to_string())
                .env("FENCED_FENCE_REASON", reason)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) => {
                    let why = format!("cannot start /bin/sh -c {cmd:?}: {e}");
                    tracing::error!(step = "on_fence", node = %node, error = %why, "on-fence hook failed");
                    return OnFenceOutcome::HookFailed(why);
                }
            };
            match tokio::time::timeout(cfg.hook_timeout, child.wait()).await {
                Ok(Ok(status)) => {
                    tracing::warn!(step = "on_fence", node = %node, status = ?status.code(), "on-fence hook finished");
                    OnFenceOutcome::HookExited(status.code())
                }
                Ok(Err(e)) => OnFenceOutcome::HookFailed(format!("waiting for the hook: {e}")),
                Err(_) => {
                    let _ = child.kill().await;
                    tracing::error!(step = "on_fence", node = %node, timeout = ?cfg.hook_timeout, "on-fence hook still running: killed");
                    OnFenceOutcome::HookTimedOut
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_actions_and_refuses_the_rest() {
        assert_eq!("exit".parse(), Ok(OnFence::Exit));
        assert_eq!("reboot".parse(), Ok(OnFence::Reboot));
        assert_eq!(
            "exec:systemctl stop app".parse(),
            Ok(OnFence::Exec("systemctl stop app".into()))
        );
        assert!("exec:".parse::<OnFence>().is_err());
        assert!("halt".parse::<OnFence>().is_err());
        assert_eq!(OnFence::Exec("x y".into()).to_string(), "exec:x y");
    }

    #[tokio::test]
    async fn reboot_writes_b_to_the_sysrq_trigger() {
        // A temporary file stands in for /proc/sysrq-trigger.
        let dir = tempfile::tempdir().unwrap();
        let sysrq = dir.path().join("sysrq-trigger");
        std::fs::write(&sysrq, "").unwrap();
        let cfg = OnFenceConfig {
            action: OnFence::Reboot,
            sysrq_trigger: sysrq.clone(),
            ..OnFenceConfig::default()
        };
        let n = NodeId::new("n1").unwrap();
        assert_eq!(
            on_fence(&cfg, &n, 1, "test").await,
            OnFenceOutcome::RebootRequested
        );
        assert_eq!(std::fs::read_to_string(&sysrq).unwrap(), "b");
        let missing = OnFenceConfig {
            sysrq_trigger: dir.path().join("no/such"),
            ..cfg
        };
        assert!(matches!(
            on_fence(&missing, &n, 1, "test").await,
            OnFenceOutcome::RebootFailed(_)
        ));
    }

    #[tokio::test]
    async fn a_hook_gets_the_node_and_generation_and_is_killed_when_late() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker");
        let n = NodeId::new("n1").unwrap();
        let cfg = OnFenceConfig {
            action: OnFence::Exec(format!(
                "echo \"$FENCED_NODE_ID $FENCED_GENERATION $FENCED_FENCE_REASON\" > {}",
                marker.display()
            )),
            ..OnFenceConfig::default()
        };
        assert_eq!(
            on_fence(&cfg, &n, 7, "preempted").await,
            OnFenceOutcome::HookExited(Some(0))
        );
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap(),
            "n1 7 preempted\n"
        );
        let late = OnFenceConfig {
            action: OnFence::Exec("sleep 30".into()),
            hook_timeout: Duration::from_millis(200),
            ..OnFenceConfig::default()
        };
        let t0 = std::time::Instant::now();
        assert_eq!(
            on_fence(&late, &n, 7, "x").await,
            OnFenceOutcome::HookTimedOut
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
