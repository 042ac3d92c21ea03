//! The synchronous engine: `pwrite`/`pread` (or `pwritev2` with `RWF_DSYNC`) on the
//! calling thread, behind the same request/completion API as the io_uring engine. Used
//! where io_uring is unavailable (sysctl `kernel.io_uring_disabled`, seccomp filters in
//! containers) or on request.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Op, Result, Step, step};
use crate::sys;
use crate::writer::{Completion, Fence, Req};

#[derive(Debug)]
pub(crate) struct SyncEngine {
    file: File,
    dsync: bool,
    align: usize,
    pub(crate) fence: Fence,
    inject: VecDeque<i32>,
    syscalls: u64,
}

impl SyncEngine {
    pub(crate) fn new(file: File, dsync: bool, align: usize, fence: Fence) -> Self {
        Self {
            file,
            dsync,
            align: align.max(1),
            fence,
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

    /// Runs a whole request: continues short transfers, resubmits EINTR/EAGAIN, maps
    /// the result, and records a conflict in the fence.
    fn run(&mut self, op: Op, buf: &mut IoSlice<'_>, offset: u64) -> Result<()> {
        let len = buf.len();
        let mut done = 0usize;
        let mut again = 0u32;
        loop {
            let res = self.once(buf.tail(done), offset + done as u64);
            match step(op, offset, len, done, &mut again, self.align, res) {
                Step::Done => return Ok(()),
                Step::Continue { .. } if op == Op::Write && self.fence.is_fenced() => {
                    return Err(Error::ReservationConflict { offset, len });
                }
                Step::Continue { done: d } => {
                    if d == done && again > 0 {
                        std::thread::yield_now();
                    }
                    done = d;
                }
                Step::Fail(e) => return self.fence.judge(Err(e), std::time::Instant::now()),
            }
        }
    }

    pub(crate) fn start(&mut self, mut req: Req, ready: &mut VecDeque<Completion>) {
        let result = match req.op {
            Op::Write => self.run(
                Op::Write,
                &mut IoSlice::Write(req.buf.as_slice()),
                req.offset,
            ),
            Op::Read => self.run(
                Op::Read,
                &mut IoSlice::Read(req.buf.as_mut_slice()),
                req.offset,
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

    pub(crate) fn write_blocking(&mut self, buf: &[u8], offset: u64) -> Result<()> {
        self.run(Op::Write, &mut IoSlice::Write(buf), offset)
    }

    pub(crate) fn read_blocking(&mut self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.run(Op::Read, &mut IoSlice::Read(buf), offset)
    }
}

enum IoSlice<'a> {
    Write(&'a [u8]),
    Read(&'a mut [u8]),
}

enum IoBuf<'a> {
    Write(&'a [u8]),
    Read(&'a mut [u8]),
}

impl IoSlice<'_> {
    fn len(&self) -> usize {
        match self {
            IoSlice::Write(b) => b.len(),
            IoSlice::Read(b) => b.len(),
        }
    }

    fn tail(&mut self, from: usize) -> IoBuf<'_> {
        match self {
            IoSlice::Write(b) => IoBuf::Write(&b[from..]),
            IoSlice::Read(b) => IoBuf::Read(&mut b[from..]),
        }
    }
}
