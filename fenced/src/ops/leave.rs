//! `fenced leave`: SIGTERM the running daemon (it quiesces, returns its arenas and
//! departs) and wait for it to exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::unistd::Pid;

#[derive(Debug, clap::Args)]
pub struct LeaveArgs {
    /// The daemon's pid file.
    #[arg(long, env = "FENCED_PID_FILE")]
    pid_file: PathBuf,
    /// How long to wait for the daemon to finish leaving.
    #[arg(long, default_value = "30")]
    timeout_secs: u64,
}

/// `fenced leave` failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaveError {
    #[error("cannot read pid file {}: {source} (is the daemon running?)", path.display())]
    ReadPidFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pid file {} does not hold a pid", path.display())]
    NotAPid { path: PathBuf },
    #[error("cannot signal pid {pid}: {source}")]
    Signal {
        pid: Pid,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("daemon {pid} still running after {timeout:?}")]
    StillRunning { pid: Pid, timeout: Duration },
}

pub async fn leave(args: LeaveArgs) -> Result<ExitCode, LeaveError> {
    let pid_file = args.pid_file;
    let timeout = Duration::from_secs(args.timeout_secs);
    let text = std::fs::read_to_string(&pid_file).map_err(|source| LeaveError::ReadPidFile {
        path: pid_file.clone(),
        source,
    })?;
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| LeaveError::NotAPid { path: pid_file })?;
    let pid = Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .map_err(|source| LeaveError::Signal { pid, source })?;
    let t0 = Instant::now();
    // A zombie (exited, not yet reaped by its parent) still answers signal 0.
    let alive = |pid: Pid| {
        nix::sys::signal::kill(pid, None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
    };
    while alive(pid) {
        if t0.elapsed() > timeout {
            return Err(LeaveError::StillRunning { pid, timeout });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("daemon {pid} left");
    Ok(ExitCode::SUCCESS)
}
