//! What both engines and the writer share: requests, their progress between
//! submissions, the [`Judge`] an engine asks after every raw result, and the
//! [`Completion`] and [`Rejected`] handed back to the caller.
//!
//! A leaf: it knows nothing of the engines or the writer, so each of them can depend on
//! it without depending on one another.

use std::time::Instant;

use crate::error::{Error, Op, Result};
use crate::sys::buf::AlignedBuf;

/// A queued request as handed to an engine.
#[derive(Debug)]
pub(crate) struct Req {
    pub op: Op,
    pub tag: u64,
    pub offset: u64,
    pub buf: AlignedBuf,
}

/// Where one request stands between its submissions: what the [`Judge`] needs to decide
/// what a raw result means for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    pub op: Op,
    /// Byte offset of the whole request.
    pub offset: u64,
    /// Length in bytes of the whole request.
    pub len: usize,
    /// Bytes transferred so far; the next submission covers `done..len`.
    pub done: usize,
    /// How many times a result said "nothing happened, submit again" (`EINTR`/`EAGAIN`).
    pub again: u32,
}

impl Progress {
    /// A request not yet submitted.
    pub(crate) fn new(op: Op, offset: u64, len: usize) -> Self {
        Self {
            op,
            offset,
            len,
            done: 0,
            again: 0,
        }
    }
}

/// What an engine does with a request after the [`Judge`] saw its latest raw result.
#[derive(Debug)]
pub(crate) enum Next {
    /// Submit the rest, `progress.done..len` (the judge updated the progress).
    Resubmit,
    /// The request is over, with this outcome.
    Finish(Result<()>),
}

/// Judges raw results. Engines never interpret a result (`cqe.res`, or `n`/`-errno`
/// from a system call) themselves: they hand each one to the writer's judge
/// (`crate::fence::Fence`) and do what it says.
pub(crate) trait Judge {
    /// The meaning of `res`, the raw result of the latest submission of the request at
    /// `progress`; `observed` is when the engine collected it (it finished in the
    /// kernel before that).
    fn judge(&mut self, progress: &mut Progress, res: i32, observed: Instant) -> Next;
}

/// The result of one queued request, with its buffer handed back.
#[derive(Debug)]
pub struct Completion {
    /// The caller's tag given at submission.
    pub tag: u64,
    /// Read or write.
    pub op: Op,
    /// Byte offset of the request.
    pub offset: u64,
    /// Length of the request in bytes (the buffer's length).
    pub len: usize,
    /// The request's buffer; for a successful read it holds the data.
    pub buf: AlignedBuf,
    /// `Ok` when all `len` bytes were transferred.
    pub result: Result<()>,
}

/// A request the writer did not accept, with its buffer handed back.
#[derive(Debug)]
pub struct Rejected {
    /// Why it was refused.
    pub error: Error,
    /// The caller's buffer, untouched.
    pub buf: AlignedBuf,
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request rejected: {}", self.error)
    }
}

impl std::error::Error for Rejected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Error {
        r.error
    }
}
