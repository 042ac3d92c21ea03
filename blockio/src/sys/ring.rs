//! The io_uring engine: keeps up to `queue_depth` requests in flight, batches their
//! submission and reaps their completions.
//!
//! Soundness rests on one rule: a request's buffer outlives the request. Queued
//! requests own their [`AlignedBuf`] inside their slot until the completion is reaped;
//! blocking requests borrow the caller's buffer and the call does not return before the
//! completion is reaped; `Drop` waits for every request still in flight (and leaks the
//! buffers if it cannot).
//!
//! The ring interprets no result: every completion goes to the writer's [`Judge`],
//! which says whether to submit the rest of the request or how it ended.
//!
//! How it is set up ([`RingSetup`]) and how it waits (a separate submission first,
//! polling before sleeping) change only when requests reach the kernel and when their
//! completions are collected, never what a result means; with SQPOLL the kernel thread
//! may take an entry as soon as it is pushed, which the buffer rule above already
//! covers (a slot's buffer lives until its completion is reaped).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use io_uring::{IoUring, Probe, opcode, squeue, types};

use crate::error::{Error, Op, Result};
use crate::options::RingSetup;
use crate::req::{Completion, Judge, Next, Progress, Req};
use crate::sys::buf::{AlignedBuf, BufPool};

/// Settings the ring is built with.
#[derive(Debug, Clone)]
pub(crate) struct RingConfig {
    pub queue_depth: usize,
    pub register_file: bool,
    pub dsync: bool,
    /// Set up the ring for a single submitting thread (with deferred task work when
    /// the setup is cooperative).
    pub single_issuer: bool,
    /// Who runs completion work and who submits.
    pub setup: RingSetup,
    /// How long a wait polls before it sleeps.
    pub spin: Duration,
    /// A wait submits what is queued in a call of its own before it waits.
    pub separate_submit: bool,
    /// Registered (fixed) buffers to set up: how many, of how many bytes.
    pub registered_buffers: Option<(usize, usize)>,
    /// Alignment of the registered buffers.
    pub buf_align: usize,
}

#[derive(Debug)]
enum SlotBuf {
    /// The slot owns the buffer until its completion is reaped.
    Owned(AlignedBuf),
    /// A blocking call's buffer: that call waits for the completion before returning.
    Borrowed { addr: usize },
}

#[derive(Debug)]
struct Slot {
    tag: u64,
    /// What was asked (`len` is the buffer's length) and how much is done; only
    /// `done` (at most `len`) and `again` change after the slot is filled.
    p: Progress,
    buf: SlotBuf,
    /// A result to report instead of the device's (fault injection); the request is
    /// then submitted as a NOP and never reaches the device.
    injected: Option<i32>,
    /// For blocking slots: the outcome, once known.
    finished: Option<Result<()>>,
}

impl Slot {
    fn addr(&self) -> usize {
        match &self.buf {
            SlotBuf::Owned(b) => b.as_ptr() as usize,
            SlotBuf::Borrowed { addr } => *addr,
        }
    }
}

/// The io_uring engine.
pub(crate) struct Ring {
    // Field order matters: the ring is dropped (after Drop::drop drained it) before the
    // file it writes to.
    ring: IoUring,
    file: File,
    fixed_file: bool,
    /// The setup in use (the requested one, or what the kernel accepted instead).
    setup: RingSetup,
    spin: Duration,
    separate_submit: bool,
    /// Calls into the kernel that did not wait, and that did (for tests).
    polls: u64,
    waits: u64,
    write_flags: i32,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    in_flight: usize,
    cqes: Vec<(u64, i32)>,
    inject: VecDeque<i32>,
    submitted_total: u64,
    // Declared after `ring`: the registered memory outlives the ring's registration.
    pool: Option<BufPool>,
    fixed_buf_pushed: u64,
}

fn ring_err(call: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Ring { call, source }
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.file.as_raw_fd())
            .field("fixed_file", &self.fixed_file)
            .field("setup", &self.setup)
            .field("queue_depth", &self.slots.len())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Ring {
    /// Builds the ring, probes the operations it needs and registers the file.
    pub(crate) fn new(file: File, cfg: RingConfig) -> Result<Ring> {
        let qd = cfg.queue_depth.max(1);
        let entries = u32::try_from(qd.next_power_of_two())
            .map_err(|_| ring_err("setup")(io::Error::from_raw_os_error(libc::EINVAL)))?;
        let build = |setup: RingSetup| {
            let mut b = IoUring::builder();
            b.setup_cqsize(entries.saturating_mul(2));
            match setup {
                // Completions are reaped by the submitting thread, so nothing needs an
                // IPI to run them early (COOP_TASKRUN, Linux 5.19); TASKRUN_FLAG tells
                // us when task work is pending. A single issuer may defer it until it
                // reaps (6.1).
                RingSetup::Cooperative => {
                    b.setup_coop_taskrun().setup_taskrun_flag();
                    if cfg.single_issuer {
                        b.setup_single_issuer().setup_defer_taskrun();
                    }
                }
                // The writer resolves `Auto` before building the ring.
                RingSetup::Plain | RingSetup::Auto => {
                    if cfg.single_issuer {
                        b.setup_single_issuer();
                    }
                }
                // The kernel thread is the only submitter: SINGLE_ISSUER and
                // DEFER_TASKRUN do not apply.
                RingSetup::SqPoll { idle_ms } => {
                    b.setup_sqpoll(idle_ms);
                }
            }
            b.build(entries)
        };
        let (ring, setup) = match build(cfg.setup) {
            Ok(r) => (r, cfg.setup),
            // Older kernels refuse SQPOLL without privileges (EPERM before 5.11) or
            // flags they do not know (EINVAL).
            Err(e)
                if matches!(cfg.setup, RingSetup::SqPoll { .. })
                    && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EPERM)) =>
            {
                tracing::warn!(error = %e, "io_uring: SQPOLL refused; using the plain setup");
                match build(RingSetup::Plain) {
                    Ok(r) => (r, RingSetup::Plain),
                    Err(e) => return Err(ring_err("setup")(e)),
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::debug!("io_uring: setup flags refused (kernel < 5.19?); using none");
                let r = IoUring::builder()
                    .setup_cqsize(entries.saturating_mul(2))
                    .build(entries)
                    .map_err(ring_err("setup"))?;
                (r, RingSetup::Plain)
            }
            Err(e) => return Err(ring_err("setup")(e)),
        };

        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(ring_err("probe"))?;
        for (code, name) in [
            (opcode::Write::CODE, "IORING_OP_WRITE"),
            (opcode::Read::CODE, "IORING_OP_READ"),
            (opcode::Nop::CODE, "IORING_OP_NOP"),
        ] {
            if !probe.is_supported(code) {
                return Err(Error::Unsupported { opcode: name });
            }
        }

        // A registered file saves an fget/fput per request; not having one only costs
        // that, so a refusal is not an error.
        let fixed_file = cfg.register_file
            && match ring.submitter().register_files(&[file.as_raw_fd()]) {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!(error = %e, "io_uring: registering the file failed; using a plain fd");
                    false
                }
            };

        let pool = match cfg.registered_buffers {
            Some((count, len))
                if probe.is_supported(opcode::WriteFixed::CODE)
                    && probe.is_supported(opcode::ReadFixed::CODE) =>
            {
                let pool = BufPool::new(count, len, cfg.buf_align)?;
                let iovecs = pool.iovecs();
                // SAFETY: each iovec is one of the pool's allocations with its exact
                // length. The pool is kept in the Ring, declared after (so dropped
                // after) the IoUring whose closing ends the registration; buffers lent
                // from it keep the memory alive through their own Arc and return it
                // to the pool instead of freeing it.
                match unsafe { ring.submitter().register_buffers(&iovecs) } {
                    Ok(()) => Some(pool),
                    Err(e) => {
                        tracing::warn!(error = %e, count, len, "io_uring: registering buffers failed (RLIMIT_MEMLOCK?); not using fixed buffers");
                        None
                    }
                }
            }
            Some(_) => {
                tracing::warn!(
                    "io_uring: READ_FIXED/WRITE_FIXED unsupported; not using fixed buffers"
                );
                None
            }
            None => None,
        };

        Ok(Ring {
            ring,
            file,
            fixed_file,
            setup,
            spin: cfg.spin,
            separate_submit: cfg.separate_submit,
            polls: 0,
            waits: 0,
            write_flags: if cfg.dsync { libc::RWF_DSYNC } else { 0 },
            slots: (0..qd).map(|_| None).collect(),
            free: (0..qd).rev().collect(),
            in_flight: 0,
            cqes: Vec::with_capacity(entries as usize * 2),
            inject: VecDeque::new(),
            submitted_total: 0,
            pool,
            fixed_buf_pushed: 0,
        })
    }

    /// Requests the kernel holds (submitted or pushed, not yet reaped).
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether the ring uses a registered (fixed) file.
    pub(crate) fn fixed_file(&self) -> bool {
        self.fixed_file
    }

    /// The setup in use.
    pub(crate) fn setup(&self) -> RingSetup {
        self.setup
    }

    /// Calls into the kernel that did not wait, and that did.
    #[cfg(test)]
    pub(crate) fn enters(&self) -> (u64, u64) {
        (self.polls, self.waits)
    }

    fn sqpoll(&self) -> bool {
        matches!(self.setup, RingSetup::SqPoll { .. })
    }

    /// Number of SQEs handed to the kernel so far (tests use it to prove that a fenced
    /// writer submits nothing).
    pub(crate) fn submitted_total(&self) -> u64 {
        self.submitted_total
    }

    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) fn inject(&mut self, res: i32) {
        self.inject.push_back(res);
    }

    fn entry(&self, idx: usize) -> squeue::Entry {
        let Some(s) = self.slots[idx].as_ref() else {
            unreachable!("entry for an empty slot")
        };
        if s.injected.is_some() {
            return opcode::Nop::new().build().user_data(idx as u64);
        }
        let p = &s.p;
        let ptr = (s.addr() + p.done) as *mut u8;
        // Lengths are checked against MAX_RW_COUNT (< u32::MAX) before submission.
        let len = (p.len - p.done) as u32;
        let off = p.offset + p.done as u64;
        if let Some(index) = self.fixed_index(s) {
            // `ptr..ptr+len` lies inside registered buffer `index` (the slot owns it).
            let e = match (p.op, self.fixed_file) {
                (Op::Write, true) => opcode::WriteFixed::new(types::Fixed(0), ptr, len, index)
                    .offset(off)
                    .rw_flags(self.write_flags)
                    .build(),
                (Op::Write, false) => {
                    opcode::WriteFixed::new(types::Fd(self.file.as_raw_fd()), ptr, len, index)
                        .offset(off)
                        .rw_flags(self.write_flags)
                        .build()
                }
                (Op::Read, true) => opcode::ReadFixed::new(types::Fixed(0), ptr, len, index)
                    .offset(off)
                    .build(),
                (Op::Read, false) => {
                    opcode::ReadFixed::new(types::Fd(self.file.as_raw_fd()), ptr, len, index)
                        .offset(off)
                        .build()
                }
            };
            return e.user_data(idx as u64);
        }
        let e = match (p.op, self.fixed_file) {
            (Op::Write, true) => opcode::Write::new(types::Fixed(0), ptr, len)
                .offset(off)
                .rw_flags(self.write_flags)
                .build(),
            (Op::Write, false) => opcode::Write::new(types::Fd(self.file.as_raw_fd()), ptr, len)
                .offset(off)
                .rw_flags(self.write_flags)
                .build(),
            (Op::Read, true) => opcode::Read::new(types::Fixed(0), ptr, len)
                .offset(off)
                .build(),
            (Op::Read, false) => opcode::Read::new(types::Fd(self.file.as_raw_fd()), ptr, len)
                .offset(off)
                .build(),
        };
        e.user_data(idx as u64)
    }

    /// The registered-buffer index for slot `s`, when it owns a buffer lent from this
    /// ring's pool.
    fn fixed_index(&self, s: &Slot) -> Option<u16> {
        match (&self.pool, &s.buf) {
            (Some(pool), SlotBuf::Owned(b)) => pool.index_of(b),
            _ => None,
        }
    }

    /// Lends one of the registered buffers, if the ring has them and one is free.
    pub(crate) fn registered_buffer(&self) -> Option<AlignedBuf> {
        self.pool.as_ref()?.take()
    }

    /// Whether the ring has registered buffers.
    pub(crate) fn has_registered_buffers(&self) -> bool {
        self.pool.is_some()
    }

    /// Number of SQEs pushed with a registered buffer.
    pub(crate) fn fixed_buf_pushed(&self) -> u64 {
        self.fixed_buf_pushed
    }

    /// Pushes the SQE of slot `idx`; submits first if the SQ is full.
    fn push(&mut self, idx: usize) -> Result<()> {
        // An injected result replaces one submission, as it replaces one system call in
        // the synchronous engine.
        if let Some(s) = self.slots[idx].as_mut() {
            s.injected = self.inject.pop_front();
        }
        let entry = self.entry(idx);
        let fixed = self.slots[idx]
            .as_ref()
            .is_some_and(|s| s.injected.is_none() && self.fixed_index(s).is_some());
        loop {
            // SAFETY: the entry points into slot `idx`'s buffer, at most `len - done`
            // bytes from `addr + done`, inside that buffer (`len` is the buffer's length,
            // set when the slot was filled; `done <= len`, which `drain` enforces on what
            // the judge returns). The buffer stays valid until
            // the entry's completion is reaped: an owned buffer lives in the slot, which
            // is only emptied when its CQE is processed (or leaked by Drop if draining
            // fails); a borrowed buffer belongs to a blocking call that does not return
            // before the slot's completion is reaped. The fd (or fixed file 0) is
            // self.file, which outlives the ring. A fixed-buffer entry names registered
            // buffer `index`, which is this slot's own buffer (`index_of` checked it was
            // lent from this ring's pool), so the range lies inside that registration.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                self.fixed_buf_pushed += u64::from(fixed);
                // The kernel thread of an SQPOLL ring may take the entry from now on.
                if self.sqpoll() {
                    self.submitted_total += 1;
                }
                return Ok(());
            }
            self.submit()?;
        }
    }

    fn alloc_slot(&mut self, slot: Slot) -> Option<usize> {
        let idx = self.free.pop()?;
        self.slots[idx] = Some(slot);
        self.in_flight += 1;
        Some(idx)
    }

    fn release_slot(&mut self, idx: usize) -> Option<Slot> {
        let s = self.slots[idx].take()?;
        self.free.push(idx);
        self.in_flight -= 1;
        Some(s)
    }

    /// Queues a request that owns its buffer. It reaches the kernel at the next
    /// `submit`/`reap`. A failure hands the request back.
    pub(crate) fn start(&mut self, req: Req) -> Result<(), (Error, Req)> {
        if self.free.is_empty() {
            let queue_depth = self.slots.len();
            return Err((Error::QueueFull { queue_depth }, req));
        }
        let slot = Slot {
            tag: req.tag,
            p: Progress::new(req.op, req.offset, req.buf.len()),
            buf: SlotBuf::Owned(req.buf),
            injected: None,
            finished: None,
        };
        let Some(idx) = self.alloc_slot(slot) else {
            unreachable!("a free slot was checked above")
        };
        if let Err(e) = self.push(idx) {
            // Nothing referencing the slot reached the SQ: take the buffer back.
            let Some(s) = self.release_slot(idx) else {
                unreachable!("slot was just filled")
            };
            let SlotBuf::Owned(buf) = s.buf else {
                unreachable!("start fills owned slots")
            };
            return Err((
                e,
                Req {
                    op: s.p.op,
                    tag: s.tag,
                    offset: s.p.offset,
                    buf,
                },
            ));
        }
        Ok(())
    }

    /// Hands every queued SQE to the kernel without waiting.
    pub(crate) fn submit(&mut self) -> Result<usize> {
        self.enter(0)
    }

    fn enter(&mut self, want: usize) -> Result<usize> {
        if want > 0 {
            self.waits += 1;
        }
        // An SQPOLL ring counts its entries when they are pushed (`push`).
        let count = !self.sqpoll();
        loop {
            let queued = self.ring.submission().len();
            match self.ring.submit_and_wait(want) {
                Ok(n) => {
                    if count {
                        self.submitted_total += n as u64;
                    }
                    return Ok(n);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    // Interrupted while waiting; the SQEs may have been consumed.
                    if count {
                        self.submitted_total += (queued - self.ring.submission().len()) as u64;
                    }
                    if want == 0 || !self.ring.completion().is_empty() {
                        return Ok(0);
                    }
                }
                // The CQ is full: the caller drains it and comes back.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(0),
                Err(e) => {
                    return Err(Error::Ring {
                        call: "enter",
                        source: e,
                    });
                }
            }
        }
    }

    /// Processes every available CQE: hands its result to `judge`, submits the rest of
    /// the request if it says so, and moves finished owned requests to `ready`.
    fn drain(&mut self, ready: &mut VecDeque<Completion>, judge: &mut impl Judge) -> Result<usize> {
        // Every completion copied below finished in the kernel before this instant.
        let observed = Instant::now();
        self.cqes.clear();
        self.cqes
            .extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        let mut finished = 0;
        for i in 0..self.cqes.len() {
            let (ud, res) = self.cqes[i];
            let idx = ud as usize;
            let Some(s) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
                tracing::error!(
                    user_data = ud,
                    "io_uring: completion for an unknown request"
                );
                continue;
            };
            let res = s.injected.take().unwrap_or(res);
            // The judge works on a copy: the slot keeps the request as submitted and
            // takes back only the progress, bounded by the request's length (the SQEs
            // built from it must stay inside the buffer).
            let mut p = s.p;
            let next = judge.judge(&mut p, res, observed);
            s.p.done = p.done.min(s.p.len);
            s.p.again = p.again;
            let outcome = match next {
                Next::Resubmit => match self.push(idx) {
                    Ok(()) => continue,
                    // The rest never reached the ring: finish the request with the
                    // error, or it would be waited for forever.
                    Err(e) => Err(e),
                },
                Next::Finish(outcome) => outcome,
            };
            let Some(s) = self.slots[idx].as_mut() else {
                unreachable!("slot checked above")
            };
            finished += 1;
            if matches!(s.buf, SlotBuf::Borrowed { .. }) {
                s.finished = Some(outcome);
                continue;
            }
            let Some(s) = self.release_slot(idx) else {
                unreachable!("slot checked above")
            };
            let SlotBuf::Owned(buf) = s.buf else {
                unreachable!("borrowed slots are handled above")
            };
            ready.push_back(Completion {
                tag: s.tag,
                op: s.p.op,
                offset: s.p.offset,
                len: s.p.len,
                buf,
                result: outcome,
            });
        }
        Ok(finished)
    }

    /// Submits what is queued and runs pending task work without waiting, so that
    /// every completion already finished in the kernel is visible in the CQ.
    fn poll(&mut self) -> Result<()> {
        self.polls += 1;
        if self.sqpoll() {
            // The kernel thread submits and runs the completion work; this only wakes
            // it if it went to sleep (and flushes an overflowed CQ).
            return self.enter(0).map(drop);
        }
        let to_submit = self.ring.submission().len();
        loop {
            // SAFETY: no extended argument is passed (None, size 0); the SQEs being
            // submitted satisfy the invariants stated in `push`.
            let r = unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(
                    to_submit as u32,
                    0,
                    io_uring::EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            match r {
                Ok(n) => {
                    self.submitted_total += n as u64;
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => {
                    return Err(Error::Ring {
                        call: "enter",
                        source: e,
                    });
                }
            }
        }
    }

    /// Submits what is queued and waits until at least `min` more requests finished
    /// (or none is in flight); `min == 0` collects what is finished without waiting.
    pub(crate) fn reap(
        &mut self,
        min: usize,
        ready: &mut VecDeque<Completion>,
        judge: &mut impl Judge,
    ) -> Result<()> {
        let mut got = self.drain(ready, judge)?;
        if min > 0 && got >= min && self.ring.submission().is_empty() {
            return Ok(());
        }
        let mut spin_until = None;
        loop {
            if got < min {
                if self.separate_submit && !self.ring.submission().is_empty() {
                    // Hand the queued requests to the kernel first, and wait in a
                    // second call only if none finished meanwhile.
                    self.poll()?;
                } else if !self.spin.is_zero()
                    && Instant::now()
                        < *spin_until.get_or_insert_with(|| Instant::now() + self.spin)
                {
                    // Polling: no sleep, so no wake-up to wait for when one finishes.
                    self.poll()?;
                } else {
                    self.enter((min - got).min(self.in_flight))?;
                }
            } else {
                self.poll()?;
            }
            got += self.drain(ready, judge)?;
            if got >= min || self.in_flight == 0 {
                return Ok(());
            }
        }
    }

    /// Runs one request on a borrowed buffer and waits for it; other requests that
    /// finish meanwhile go to `ready`.
    fn run_borrowed(
        &mut self,
        op: Op,
        addr: usize,
        len: usize,
        offset: u64,
        ready: &mut VecDeque<Completion>,
        judge: &mut impl Judge,
    ) -> Result<()> {
        while self.free.is_empty() {
            self.reap(1, ready, judge)?;
        }
        let slot = Slot {
            tag: u64::MAX,
            p: Progress::new(op, offset, len),
            buf: SlotBuf::Borrowed { addr },
            injected: None,
            finished: None,
        };
        let Some(idx) = self.alloc_slot(slot) else {
            unreachable!("waited for a free slot")
        };
        if let Err(e) = self.push(idx) {
            // The SQE did not reach the ring: nothing references the buffer.
            self.release_slot(idx);
            return Err(e);
        }
        // The judge runs caller code (a fence probe): if it panics, unwinding must not
        // leave this call while the kernel may still use the caller's buffer.
        let unwinding = AbortOnUnwind;
        let mut failures = 0u32;
        loop {
            if let Some(result) = self.slots[idx].as_mut().and_then(|s| s.finished.take()) {
                self.release_slot(idx);
                std::mem::forget(unwinding);
                return result;
            }
            let waited = self.reap(1, ready, judge);
            if let Err(e) = waited {
                // The kernel may hold a pointer into the caller's buffer: returning now
                // would let it be freed under a live request.
                failures += 1;
                tracing::error!(error = %e, "io_uring: waiting for a request on a borrowed buffer failed");
                if failures > 1000 {
                    eprintln!(
                        "blockio: io_uring cannot reap a request that uses a caller's buffer: {e}; aborting to stay memory-safe"
                    );
                    std::process::abort();
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }

    /// Writes `buf` at `offset` and waits for the result.
    pub(crate) fn write_blocking(
        &mut self,
        buf: &[u8],
        offset: u64,
        ready: &mut VecDeque<Completion>,
        judge: &mut impl Judge,
    ) -> Result<()> {
        // `buf` stays borrowed for the whole call, which waits for the completion.
        let addr = buf.as_ptr() as usize;
        self.run_borrowed(Op::Write, addr, buf.len(), offset, ready, judge)
    }

    /// Reads into `buf` from `offset` and waits for the result.
    pub(crate) fn read_blocking(
        &mut self,
        buf: &mut [u8],
        offset: u64,
        ready: &mut VecDeque<Completion>,
        judge: &mut impl Judge,
    ) -> Result<()> {
        // `buf` stays mutably borrowed for the whole call, which waits for the completion.
        let addr = buf.as_mut_ptr() as usize;
        self.run_borrowed(Op::Read, addr, buf.len(), offset, ready, judge)
    }

    /// Waits for every request in flight; their completions go to `ready`.
    pub(crate) fn drain_all(
        &mut self,
        ready: &mut VecDeque<Completion>,
        judge: &mut impl Judge,
    ) -> Result<()> {
        while self.in_flight > 0 {
            self.reap(self.in_flight, ready, judge)?;
        }
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.in_flight == 0 {
            return;
        }
        let mut sink = VecDeque::new();
        if let Err(e) = self.drain_all(&mut sink, &mut Discard) {
            tracing::error!(error = %e, in_flight = self.in_flight, "io_uring: could not drain on drop; leaking the buffers of requests still in flight");
            for s in self.slots.iter_mut().filter_map(Option::take) {
                if let SlotBuf::Owned(buf) = s.buf {
                    std::mem::forget(buf);
                }
            }
        }
    }
}

/// The judge of a ring dropped with requests still in flight (the writer drains its own
/// first; this is what is left if that failed): nobody will see their outcome, so each
/// ends at its first completion, after which the kernel no longer uses its buffer.
struct Discard;

impl Judge for Discard {
    fn judge(&mut self, _: &mut Progress, _: i32, _: Instant) -> Next {
        Next::Finish(Err(Error::Closed))
    }
}

/// Armed while a blocking call's request may be in the kernel; dropped only by
/// unwinding, and then aborts: returning would let the caller's buffer be freed under a
/// live request.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!(
            "blockio: a panic while a request on a caller's buffer was in flight; aborting to stay memory-safe"
        );
        std::process::abort();
    }
}
