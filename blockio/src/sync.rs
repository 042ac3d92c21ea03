//! The synchronous engine: `pwrite`/`pread` (or `pwritev2` with `RWF_DSYNC`) on the
//! calling thread, behind the same request/completion API as the io_uring engine. Used
//! where io_uring is unavailable (sysctl `kernel.io_uring_disabled`, seccomp filters in
//! containers) or on request.
//!
//! It only performs system calls: every raw result goes to the writer's [`Judge`],
//! which says whether to submit the rest or what the request's outcome is.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use crate::error::{Op, Result};
use crate::req::{Completion, Judge, Next, Progress, Req};
use crate::sys;

#[derive(Debug)]
pub(crate) struct SyncEngine {
    file: File,
    dsync: bool,
    inject: VecDeque<i32>,
    syscalls: u64,
}

impl SyncEngine {
    pub(crate) fn new(file: File, dsync: bool) -> Self {
        Self {
            file,
            dsync,
            inject: VecDeque::new(),
            syscalls: 0,
        }
    }

    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) fn inject(&mut self, res: i32) {
        self.inject.push_back(res);
    }

    /// Number of read/write system calls made so far.
    pub(crate) fn syscalls(&self) -> u64 {
        self.syscalls
    }

    /// One system call at `offset` over `buf`, as a raw result (`n` or `-errno`).
    fn once(&mut self, buf: IoBuf<'_>, offset: u64) -> i32 {
        if let Some(res) = self.inject.pop_front() {
            return res;
        }
        self.syscalls += 1;
        let r = match buf {
            IoBuf::Write(b) if self.dsync => {
                sys::pwrite2(self.file.as_fd(), b, offset, libc::RWF_DSYNC)
            }
            IoBuf::Write(b) => self.file.write_at(b, offset),
            IoBuf::Read(b) => self.file.read_at(b, offset),
        };
        match r {
            // At most the request length, which is below i32::MAX (MAX_RW_COUNT).
            Ok(n) => n as i32,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// Runs a whole request, submitting the rest for as long as `judge` says so.
    fn run(
        &mut self,
        op: Op,
        buf: &mut IoBuf<'_>,
        offset: u64,
        judge: &mut impl Judge,
    ) -> Result<()> {
        let mut p = Progress::new(op, offset, buf.len());
        loop {
            let done = p.done;
            let res = self.once(buf.tail(done), offset + done as u64);
            match judge.judge(&mut p, res, std::time::Instant::now()) {
                Next::Resubmit => {
                    if p.done == done && p.again > 0 {
                        std::thread::yield_now();
                    }
                }
                Next::Finish(result) => return result,
            }
        }
    }

    pub(crate) fn start(
        &mut self,
        mut req: Req,
        ready: &mut VecDeque<Completion>,
        judge: &mut impl Judge,
    ) {
        let result = match req.op {
            Op::Write => self.run(
                Op::Write,
                &mut IoBuf::Write(req.buf.as_slice()),
                req.offset,
                judge,
            ),
            Op::Read => self.run(
                Op::Read,
                &mut IoBuf::Read(req.buf.as_mut_slice()),
                req.offset,
                judge,
            ),
        };
        ready.push_back(Completion {
            tag: req.tag,
            op: req.op,
            offset: req.offset,
            len: req.buf.len(),
            buf: req.buf,
            result,
        });
    }

    pub(crate) fn write_blocking(
        &mut self,
        buf: &[u8],
        offset: u64,
        judge: &mut impl Judge,
    ) -> Result<()> {
        self.run(Op::Write, &mut IoBuf::Write(buf), offset, judge)
    }

    pub(crate) fn read_blocking(
        &mut self,
        buf: &mut [u8],
        offset: u64,
        judge: &mut impl Judge,
    ) -> Result<()> {
        self.run(Op::Read, &mut IoBuf::Read(buf), offset, judge)
    }
}

/// The bytes of one request: the source of a write or the destination of a read.
enum IoBuf<'a> {
    Write(&'a [u8]),
    Read(&'a mut [u8]),
}

impl IoBuf<'_> {
    fn len(&self) -> usize {
        match self {
            IoBuf::Write(b) => b.len(),
            IoBuf::Read(b) => b.len(),
        }
    }

    /// The part from byte `from` on, for the next system call.
    fn tail(&mut self, from: usize) -> IoBuf<'_> {
        match self {
            IoBuf::Write(b) => IoBuf::Write(&b[from..]),
            IoBuf::Read(b) => IoBuf::Read(&mut b[from..]),
        }
    }
}
