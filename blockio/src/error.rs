//! The crate's one error type, with its classification methods. Raw request results
//! become these errors in one place, the writer's judge (`crate::fence`).
//!
//! # Why `EBADE` means "fenced"
//! When an NVMe controller refuses a command because of a reservation (status
//! *Reservation Conflict*, 0x83, NVMe Base Specification 2.0, section 8.19), the Linux
//! NVMe driver completes the block request with `BLK_STS_RESV_CONFLICT` (named
//! `BLK_STS_NEXUS` before Linux 6.5), and the block layer turns that status into
//! `-EBADE` for the submitter, through `pwrite(2)` and io_uring alike. SCSI persistent
//! reservations take the same path. No other block-layer status maps to `EBADE`, so an
//! `EBADE` from a direct write is the device saying "this host is not allowed to write":
//! its registration was preempted, or it never held one. It is never retried here.

use std::io;
use std::path::PathBuf;

/// Which kind of request an error or a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// An `O_DIRECT` read.
    Read,
    /// An `O_DIRECT` write.
    Write,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
        })
    }
}

/// Everything that can go wrong in `blockio`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device refused the request because of a persistent reservation (`EBADE`):
    /// this host has been fenced. The writer refuses every later write with this same
    /// error, without submitting it.
    #[error(
        "reservation conflict on {len} bytes at offset {offset}: this host's access was \
         preempted (EBADE); it has been fenced"
    )]
    ReservationConflict {
        /// Byte offset of the refused request.
        offset: u64,
        /// Length in bytes of the refused request.
        len: usize,
    },

    /// Opening the device or file failed.
    #[error("cannot open {path} with O_DIRECT")]
    Open {
        /// The path given to [`DirectWriter::open`](crate::DirectWriter::open).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The file system holding this file does not support `O_DIRECT`.
    #[error("{path} does not support O_DIRECT (its file system refuses direct I/O)")]
    DirectIoUnsupported {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The direct-I/O alignment of this file could not be learned: statx reports no
    /// `STATX_DIOALIGN` and the file system block size is not usable either.
    #[error(
        "cannot learn the O_DIRECT alignment of {path}: statx reports no STATX_DIOALIGN \
         and the file system block size is not a power of two >= 512"
    )]
    UnknownAlignment {
        /// The path that was opened.
        path: PathBuf,
    },

    /// The path is neither a block device nor a regular file.
    #[error("{path} is neither a block device nor a regular file")]
    NotBlockOrFile {
        /// The path that was opened.
        path: PathBuf,
    },

    /// A system call used to learn the device's geometry failed.
    #[error("{call} failed on {path}")]
    Probe {
        /// The call, e.g. `BLKSSZGET`.
        call: &'static str,
        /// The path that was opened.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// An aligned buffer could not be allocated with this length and alignment.
    #[error(
        "invalid aligned buffer: {len} bytes aligned to {align} (length must be > 0, alignment a power of two)"
    )]
    InvalidBuffer {
        /// Requested length.
        len: usize,
        /// Requested alignment.
        align: usize,
    },

    /// The request's offset is not a multiple of the device's offset alignment.
    #[error("offset {offset} is not a multiple of the direct-I/O alignment {align}")]
    MisalignedOffset {
        /// Offending offset.
        offset: u64,
        /// Required alignment in bytes.
        align: usize,
    },

    /// The request's length is zero or not a multiple of the device's alignment.
    #[error("length {len} is not a non-zero multiple of the direct-I/O alignment {align}")]
    MisalignedLength {
        /// Offending length.
        len: usize,
        /// Required alignment in bytes.
        align: usize,
    },

    /// The buffer's address is not aligned as the device requires.
    #[error("buffer at {addr:#x} is not aligned to the direct-I/O memory alignment {align}")]
    MisalignedBuffer {
        /// Address of the buffer.
        addr: usize,
        /// Required alignment in bytes.
        align: usize,
    },

    /// The request is larger than one io_uring request can carry.
    #[error("request of {len} bytes is larger than the maximum of {max}")]
    RequestTooLarge {
        /// Requested length.
        len: usize,
        /// Largest supported length.
        max: usize,
    },

    /// The request reaches past the end of the device (or of the file, which is never
    /// extended).
    #[error("{len} bytes at offset {offset} reach past the end of the device ({size} bytes)")]
    OutOfBounds {
        /// Offset of the request.
        offset: u64,
        /// Length of the request.
        len: usize,
        /// Size of the device or file.
        size: u64,
    },

    /// The queue already holds `queue_depth` requests that were not reaped.
    #[error("queue full: {queue_depth} requests outstanding; reap completions first")]
    QueueFull {
        /// The configured queue depth.
        queue_depth: usize,
    },

    /// A write made partial progress and the rest could not be written (the device
    /// wrote nothing more, or stopped at a point from which the rest is misaligned).
    #[error("short {op}: {done} of {len} bytes at offset {offset}")]
    Short {
        /// The kind of request.
        op: Op,
        /// Offset of the request.
        offset: u64,
        /// Length of the request.
        len: usize,
        /// Bytes transferred before the request stopped.
        done: usize,
    },

    /// The device failed the request with an OS error other than a reservation conflict.
    #[error("{op} of {len} bytes at offset {offset} failed")]
    Io {
        /// The kind of request.
        op: Op,
        /// Offset of the request.
        offset: u64,
        /// Length of the request.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// A write failed with `EIO` and the [`FenceProbe`](crate::FenceProbe) consulted to
    /// classify it failed too, so it is unknown whether this host was fenced (a
    /// preempt-and-abort fails in-flight writes with `EIO`). Treat it as fenced: never
    /// retry the write. The writer is not marked fenced; the device still refuses
    /// every later write of a fenced host.
    #[error(
        "{len}-byte write at offset {offset} failed with EIO and the fence probe could not tell whether this host was fenced ({probe}); it may have been: do not retry it"
    )]
    FenceUnverified {
        /// Offset of the request.
        offset: u64,
        /// Length of the request.
        len: usize,
        /// The write's OS error (`EIO`).
        #[source]
        source: io::Error,
        /// Why the probe could not decide.
        probe: crate::probe::ProbeError,
    },

    /// Flushing (fsync) failed: earlier writes may not be durable.
    #[error("flush (fsync) failed")]
    Flush {
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Setting up or entering the io_uring failed.
    #[error("io_uring {call} failed")]
    Ring {
        /// What was being done (`setup`, `enter`, `probe`, ...).
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The kernel's io_uring lacks an operation this writer needs.
    #[error("io_uring does not support {opcode} on this kernel")]
    Unsupported {
        /// Name of the missing opcode, e.g. `IORING_OP_WRITE`.
        opcode: &'static str,
    },

    /// The writer was closed with [`DirectWriter::close`](crate::DirectWriter::close).
    #[error("the writer is closed")]
    Closed,
}

impl Error {
    /// True when the device refused a request because of a reservation: the host has
    /// been fenced and must stop writing.
    pub fn is_reservation_conflict(&self) -> bool {
        matches!(self, Error::ReservationConflict { .. })
    }

    /// True when the failed request may have been refused because this host was fenced,
    /// so it must never be retried: a [`ReservationConflict`](Error::ReservationConflict),
    /// a [`FenceUnverified`](Error::FenceUnverified) write, or any write that failed with
    /// `EIO` (a preempt-and-abort fails in-flight writes with `EIO`).
    ///
    /// The last case is conservative: the error alone cannot tell whether a
    /// [`FenceProbe`](crate::FenceProbe) already cleared it. A writer opened with
    /// [`Options::fence_probe`](crate::Options::fence_probe) turns every `EIO` write
    /// the probe finds fenced into `ReservationConflict`, so its callers may treat a
    /// remaining `EIO` [`Io`](Error::Io) error as an ordinary I/O error; without a
    /// probe, treat it as fenced.
    pub fn may_be_fenced(&self) -> bool {
        match self {
            Error::ReservationConflict { .. } | Error::FenceUnverified { .. } => true,
            Error::Io {
                op: Op::Write,
                source,
                ..
            } => source.raw_os_error() == Some(libc::EIO),
            _ => false,
        }
    }

    /// True for errors the caller may retry as is: a full queue (after reaping), or an
    /// interrupted/again request the engine gave up resubmitting.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::QueueFull { .. } => true,
            Error::Io { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }

    /// True when the request was refused before submission because its offset,
    /// length or buffer is misaligned.
    pub fn is_misaligned(&self) -> bool {
        matches!(
            self,
            Error::MisalignedOffset { .. }
                | Error::MisalignedLength { .. }
                | Error::MisalignedBuffer { .. }
        )
    }

    /// True when io_uring cannot be used here (disabled by sysctl or seccomp, or
    /// lacking an operation), so the synchronous engine is the way to go.
    pub fn is_uring_unavailable(&self) -> bool {
        match self {
            Error::Unsupported { .. } => true,
            Error::Ring { call, source } => {
                *call == "setup"
                    && matches!(
                        source.raw_os_error(),
                        Some(libc::EPERM | libc::ENOSYS | libc::EACCES | libc::EINVAL)
                    )
            }
            _ => false,
        }
    }
}

/// Crate result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_refusals_mean_uring_unavailable() {
        for errno in [libc::EPERM, libc::ENOSYS] {
            let e = Error::Ring {
                call: "setup",
                source: io::Error::from_raw_os_error(errno),
            };
            assert!(e.is_uring_unavailable());
        }
        assert!(
            Error::Unsupported {
                opcode: "IORING_OP_WRITE"
            }
            .is_uring_unavailable()
        );
        let enter = Error::Ring {
            call: "enter",
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert!(!enter.is_uring_unavailable());
    }
}
