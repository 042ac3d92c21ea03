//! The daemon's local control channel: its pid file and its control socket.
//!
//! `fenced leave` never signals a process. It asks the daemon over the control socket
//! (a unix socket, mode 0660: root and the daemon's group) and waits for the answer;
//! the pid file is only the hint that names the socket. A pid file can be stale, hold
//! `-1` (`kill(-1)` signals every process) or be replaced by a symlink; a socket is
//! answered only by the daemon that bound it.
//!
//! Pid file (`--pid-file`): created with `O_NOFOLLOW` (a symlink is refused), locked
//! with `flock` while the daemon runs (a second daemon on the same file is refused
//! before it touches etcd), removed when the daemon exits:
//!
//! ```text
//! <pid>
//! start_time <clock ticks after boot, /proc/<pid>/stat field 22>
//! control_socket <path>
//! ```
//!
//! Protocol: the client sends `leave\n`; the daemon answers `leaving\n` at once and,
//! once the agent has stopped, one of `left\n`, `incomplete <reason>\n` or
//! `self-fenced <reason>\n`, then exits.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::config::file_kind;

/// Largest pid file read back.
const MAX_PID_FILE_BYTES: u64 = 4096;
/// Longest request line.
const MAX_REQUEST_BYTES: u64 = 64;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The request of `fenced leave`.
pub const LEAVE: &str = "leave";
/// Longest unix socket path (`sun_path` holds 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The pid file or the control socket could not be set up or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("cannot open pid file {}: {source} (choose a --pid-file in a writable directory)", path.display())]
    OpenPidFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pid file {} is a symbolic link: refusing to follow it (remove it or choose another --pid-file)", path.display())]
    PidFileSymlink { path: PathBuf },
    #[error("pid file {} is a {kind}, not a regular file (choose another --pid-file)", path.display())]
    PidFileNotAFile { path: PathBuf, kind: &'static str },
    #[error("pid file {} is locked by a running fenced{}: stop it first (`fenced leave --pid-file {}`) or choose another --pid-file", path.display(), holder.map(|p| format!(" (pid {p})")).unwrap_or_default(), path.display())]
    PidFileLocked { path: PathBuf, holder: Option<i32> },
    #[error("cannot write pid file {}: {source}", path.display())]
    WritePidFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read pid file {}: {source} (is the daemon running? it removes its pid file when it exits)", path.display())]
    ReadPidFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pid file {} names no control socket (written by an older fenced, or not by fenced): stop that daemon with its service manager; `fenced leave` signals no process it cannot prove is its own", path.display())]
    NoSocketInPidFile { path: PathBuf },
    #[error("control socket path {} is longer than {MAX_SOCKET_PATH} bytes: choose a shorter --control-socket", path.display())]
    SocketPathTooLong { path: PathBuf },
    #[error("control socket {} exists and is a {kind}, not a socket: remove it or choose another --control-socket", path.display())]
    SocketPathTaken { path: PathBuf, kind: &'static str },
    #[error("control socket {} is answered by a running fenced: stop it first (`fenced leave --control-socket {}`) or choose another --control-socket", path.display(), path.display())]
    SocketInUse { path: PathBuf },
    #[error("cannot listen on control socket {}: {source} (choose a --control-socket in a writable directory)", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no fenced answers on control socket {}: {source} (is the daemon running?)", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the daemon on {} closed the control socket without saying it left (it may have crashed: peers fence it)", path.display())]
    NoAnswer { path: PathBuf },
    #[error("the daemon on {} refused: {answer}", path.display())]
    Refused { path: PathBuf, answer: String },
    #[error("the daemon on {} is still leaving after {}s: wait, then check `fenced status`", path.display(), timeout.as_secs())]
    Timeout { path: PathBuf, timeout: Duration },
}

/// The start time of process `pid` in clock ticks after boot (`/proc/<pid>/stat`,
/// field 22); with the pid it names one process for the life of the system.
pub fn start_time(pid: &str) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may contain anything; the
    // fields after the last ')' start with field 3.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(22 - 3))
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("/proc/{pid}/stat has no start time"),
            )
        })
}

/// The running daemon's pid file: locked for as long as this value lives, removed
/// on drop.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    _lock: Flock<File>,
}

impl PidFile {
    /// Creates `path` without following a symlink, locks it (refused while another
    /// daemon holds it) and writes our pid, start time and control socket.
    pub fn create(path: &Path, control_socket: Option<&Path>) -> Result<Self, ControlError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|source| open_error(path, source))?;
        let ft = file
            .metadata()
            .map_err(|source| open_error(path, source))?
            .file_type();
        if !ft.is_file() {
            return Err(ControlError::PidFileNotAFile {
                path: path.to_owned(),
                kind: file_kind(ft),
            });
        }
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
                let mut text = String::new();
                let _ = (&mut file)
                    .take(MAX_PID_FILE_BYTES)
                    .read_to_string(&mut text);
                return Err(ControlError::PidFileLocked {
                    path: path.to_owned(),
                    holder: text.lines().next().and_then(|l| l.trim().parse().ok()),
                });
            }
            Err((_, errno)) => {
                return Err(ControlError::OpenPidFile {
                    path: path.to_owned(),
                    source: errno.into(),
                });
            }
        };
        let me = std::process::id();
        let started = start_time("self").map_err(|source| ControlError::WritePidFile {
            path: path.to_owned(),
            source,
        })?;
        let mut text = format!("{me}\nstart_time {started}\n");
        if let Some(s) = control_socket {
            text.push_str(&format!("control_socket {}\n", s.display()));
        }
        let write = |f: &mut File| -> std::io::Result<()> {
            f.set_len(0)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()
        };
        write(&mut lock).map_err(|source| ControlError::WritePidFile {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self {
            path: path.to_owned(),
            _lock: lock,
        })
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Removed while still locked: no other daemon can have taken it over.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn open_error(path: &Path, source: std::io::Error) -> ControlError {
    if source.raw_os_error() == Some(libc::ELOOP) {
        ControlError::PidFileSymlink {
            path: path.to_owned(),
        }
    } else {
        ControlError::OpenPidFile {
            path: path.to_owned(),
            source,
        }
    }
}

/// Reads the control socket a pid file names; the file is opened without following
/// a symlink, must be a regular file and is read up to 4 KiB.
pub fn socket_of_pid_file(path: &Path) -> Result<PathBuf, ControlError> {
    let read_err = |source| ControlError::ReadPidFile {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| match open_error(path, source) {
            ControlError::OpenPidFile { source, .. } => read_err(source),
            e => e,
        })?;
    let ft = file.metadata().map_err(read_err)?.file_type();
    if !ft.is_file() {
        return Err(ControlError::PidFileNotAFile {
            path: path.to_owned(),
            kind: file_kind(ft),
        });
    }
    let mut text = String::new();
    file.take(MAX_PID_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    text.lines()
        .find_map(|l| l.strip_prefix("control_socket "))
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| ControlError::NoSocketInPidFile {
            path: path.to_owned(),
        })
}

/// How the daemon ended, as told to the `fenced leave` waiting on the socket.
#[derive(Debug, Clone)]
pub enum Outcome {
    Left,
    Incomplete(String),
    SelfFenced(String),
}

impl Outcome {
    fn line(&self) -> String {
        let one = |r: &str| crate::logging::escape(r);
        match self {
            Self::Left => "left\n".to_owned(),
            Self::Incomplete(r) => format!("incomplete {}\n", one(r)),
            Self::SelfFenced(r) => format!("self-fenced {}\n", one(r)),
        }
    }
}

/// The daemon's listening control socket; the path is removed on drop.
#[derive(Debug)]
pub struct ControlSocket {
    path: PathBuf,
    waiters: Arc<Mutex<Vec<OwnedWriteHalf>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ControlSocket {
    /// Binds `path` (mode 0660). A stale socket left by a killed daemon is replaced; a
    /// socket a live daemon answers, or a path that is not a socket, is refused.
    /// Each `leave` request is sent on `leave`.
    pub fn bind(path: &Path, leave: mpsc::Sender<()>) -> Result<Self, ControlError> {
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(ControlError::SocketPathTooLong {
                path: path.to_owned(),
            });
        }
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(ControlError::SocketInUse {
                        path: path.to_owned(),
                    });
                }
                std::fs::remove_file(path).map_err(|source| ControlError::Bind {
                    path: path.to_owned(),
                    source,
                })?;
            }
            Ok(m) => {
                return Err(ControlError::SocketPathTaken {
                    path: path.to_owned(),
                    kind: file_kind(m.file_type()),
                });
            }
            Err(_) => {}
        }
        let bind_err = |source| ControlError::Bind {
            path: path.to_owned(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)) {
            let _ = std::fs::remove_file(path);
            return Err(bind_err(e));
        }
        let waiters = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(serve(listener, leave, waiters.clone()));
        Ok(Self {
            path: path.to_owned(),
            waiters,
            task,
        })
    }

    /// Tells every `fenced leave` waiting how the daemon ended.
    pub async fn answer(&self, outcome: &Outcome) {
        self.task.abort();
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(|p| p.into_inner()));
        let line = outcome.line();
        for mut w in waiters {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), w.write_all(line.as_bytes())).await;
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve(
    listener: UnixListener,
    leave: mpsc::Sender<()>,
    waiters: Arc<Mutex<Vec<OwnedWriteHalf>>>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let leave = leave.clone();
        let waiters = waiters.clone();
        tokio::spawn(async move {
            let peer = stream.peer_cred().ok();
            let (read, mut write) = stream.into_split();
            // The socket's mode admits root and the daemon's group; the credentials
            // are checked too, as the mode is set only just after bind.
            if !peer.is_some_and(|p| allowed(p.uid(), p.gid(), p.pid())) {
                tracing::warn!(
                    step = "control",
                    peer_uid = peer.map(|p| p.uid()),
                    peer_pid = peer.and_then(|p| p.pid()),
                    "control socket: request from a user outside root and the daemon's user and group refused"
                );
                let _ = write
                    .write_all(b"refused not root, the daemon's user or its group\n")
                    .await;
                return;
            }
            let mut line = String::new();
            let got = tokio::time::timeout(
                REQUEST_TIMEOUT,
                BufReader::new(read.take(MAX_REQUEST_BYTES)).read_line(&mut line),
            )
            .await;
            let request = line.trim();
            if !matches!(got, Ok(Ok(_))) || request != LEAVE {
                tracing::warn!(
                    step = "control",
                    request = ?request,
                    peer_uid = peer.map(|p| p.uid()),
                    "control socket: unknown request refused"
                );
                let _ = write.write_all(b"refused unknown request\n").await;
                return;
            }
            tracing::info!(
                step = "control",
                peer_uid = peer.map(|p| p.uid()),
                peer_pid = peer.and_then(|p| p.pid()),
                "leave requested on the control socket"
            );
            if write.write_all(b"leaving\n").await.is_err() {
                return;
            }
            waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(write);
            let _ = leave.send(()).await;
        });
    }
}

/// Whether a peer may use the control socket: root, the daemon's own user, or a
/// member (primary or supplementary, from `/proc/<pid>/status`) of its group.
fn allowed(uid: u32, gid: u32, pid: Option<i32>) -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to our effective uid and gid.
    let Ok(me) = std::fs::metadata("/proc/self") else {
        return uid == 0;
    };
    if uid == 0 || uid == me.uid() || gid == me.gid() {
        return true;
    }
    let Some(pid) = pid else { return false };
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|g| g.split_whitespace().any(|g| g.parse() == Ok(me.gid())))
    })
}

/// `fenced leave`: asks the daemon on `path` to leave and waits (at most `timeout`)
/// for its answer.
pub async fn request_leave(path: &Path, timeout: Duration) -> Result<Outcome, ControlError> {
    let io = |source| ControlError::Io {
        path: path.to_owned(),
        source,
    };
    let stream = tokio::time::timeout(Duration::from_secs(5), UnixStream::connect(path))
        .await
        .map_err(|_| ControlError::Connect {
            path: path.to_owned(),
            source: std::io::ErrorKind::TimedOut.into(),
        })?
        .map_err(|source| ControlError::Connect {
            path: path.to_owned(),
            source,
        })?;
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("{LEAVE}\n").as_bytes())
        .await
        .map_err(io)?;
    let mut lines = BufReader::new(read.take(4096)).lines();
    let answer = async {
        loop {
            let Some(line) = lines.next_line().await.map_err(io)? else {
                return Err(ControlError::NoAnswer {
                    path: path.to_owned(),
                });
            };
            match line.split_once(' ').unwrap_or((line.as_str(), "")) {
                ("leaving", _) => {}
                ("left", _) => return Ok(Outcome::Left),
                ("incomplete", r) => return Ok(Outcome::Incomplete(r.to_owned())),
                ("self-fenced", r) => return Ok(Outcome::SelfFenced(r.to_owned())),
                _ => {
                    return Err(ControlError::Refused {
                        path: path.to_owned(),
                        answer: crate::logging::escape(&line),
                    });
                }
            }
        }
    };
    tokio::time::timeout(timeout, answer)
        .await
        .map_err(|_| ControlError::Timeout {
            path: path.to_owned(),
            timeout,
        })?
}
