//! `fenced leave`: ask the running daemon, over its control socket, to leave (quiesce,
//! return its arenas, depart) and wait for its answer.
//!
//! No process is signalled: the pid file is read only for the control socket it
//! names (see [`crate::control`]), so a pid file holding `-1`, `0`, `1`, a stale pid
//! or a symlink can make `leave` fail, never make it hit another process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::control::{self, ControlError, Outcome};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("daemon").required(true).args(["pid_file", "control_socket"])))]
pub struct LeaveArgs {
    /// The daemon's pid file (`run --pid-file`); only the control socket it names is
    /// used.
    #[arg(long, env = "FENCED_PID_FILE")]
    pid_file: Option<PathBuf>,
    /// The daemon's control socket (`run --control-socket`); wins over --pid-file.
    #[arg(long, env = "FENCED_CONTROL_SOCKET")]
    control_socket: Option<PathBuf>,
    /// How long to wait for the daemon to finish leaving.
    #[arg(long, default_value = "30")]
    timeout_secs: u64,
}

/// `fenced leave` failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaveError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("the daemon could not complete its leave: {reason} (peers will fence it)")]
    Incomplete { reason: String },
    #[error("the daemon self-fenced instead of leaving: {reason} (peers will fence it)")]
    SelfFenced { reason: String },
}

pub async fn leave(args: LeaveArgs) -> Result<ExitCode, LeaveError> {
    let socket = match (args.control_socket, &args.pid_file) {
        (Some(s), _) => s,
        (None, Some(p)) => control::socket_of_pid_file(p)?,
        (None, None) => unreachable!("clap requires one of them"),
    };
    let timeout = Duration::from_secs(args.timeout_secs);
    match control::request_leave(&socket, timeout).await? {
        Outcome::Left => {
            println!("daemon on {} left", socket.display());
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Incomplete(reason) => Err(LeaveError::Incomplete { reason }),
        Outcome::SelfFenced(reason) => Err(LeaveError::SelfFenced { reason }),
    }
}
