//! [`Options`] for [`DirectWriter::open`](crate::DirectWriter::open).

use std::sync::Arc;
use std::time::Duration;

use crate::probe::FenceProbe;

/// Which engine carries the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EngineKind {
    /// io_uring if the kernel lets this process use it, else the synchronous engine
    /// (the choice is logged and reported by
    /// [`DirectWriter::engine`](crate::DirectWriter::engine)). One exception: a file
    /// on tmpfs with a queue depth below [`SubmitMode::AUTO_SEPARATE_MIN_QD`] gets the
    /// synchronous engine. io_uring cannot write tmpfs without handing every request
    /// to a worker thread, and with so few requests in flight that hand-off (two
    /// wake-ups per write) is the whole cost: on a 2-vCPU machine `pwrite` made ~4×
    /// the IOPS of io_uring at queue depth 1 (benches/README.md, "blockio vs fio").
    #[default]
    Auto,
    /// io_uring only: opening fails if it is unavailable.
    IoUring,
    /// Synchronous `pwrite`/`pread` on the calling thread.
    Sync,
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineKind::Auto => "auto",
            EngineKind::IoUring => "io_uring",
            EngineKind::Sync => "sync",
        })
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(EngineKind::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(EngineKind::IoUring),
            "sync" => Ok(EngineKind::Sync),
            other => Err(format!("unknown engine {other:?} (auto, io_uring, sync)")),
        }
    }
}

/// How the io_uring is set up: who runs a finished request's completion work, and who
/// submits. Ignored by the synchronous engine.
///
/// On a device (a virtio disk here) the time between a request finishing and this
/// thread seeing it is what limits IOPS at a fixed queue depth; on a CPU-bound target
/// (tmpfs) the cost per request is. The variants trade these; `benches/README.md`
/// ("blockio vs fio") has the measurements behind the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RingSetup {
    /// [`Cooperative`](RingSetup::Cooperative) for everything: block devices, files on
    /// disk file systems and on tmpfs. The default. Measured on a 2-vCPU virtual
    /// machine with nothing else running (benches/README.md, "blockio vs fio"): with
    /// [`SubmitMode::Eager`] on a virtio disk (4 KiB random writes, queue depth 32) the
    /// cooperative ring made 0.88–0.96× fio's IOPS where the plain one made 0.80×, and
    /// at queue depth 1 the two were level; on tmpfs — where every direct write is a
    /// memory copy in an io_uring worker thread and each completion would interrupt
    /// this thread — the plain ring fell behind under load (0.73–1.00×). (Measurements
    /// taken under heavy load earlier had put the plain ring ahead on the disk; on a
    /// quiet machine it was not.)
    /// [`DirectWriter::ring_setup`](crate::DirectWriter::ring_setup) reports the choice.
    #[default]
    Auto,
    /// `IORING_SETUP_COOP_TASKRUN | TASKRUN_FLAG` (Linux 5.19): completion work waits
    /// until this thread enters the kernel, so a running thread is never interrupted
    /// for it. With [`Options::single_issuer`] also `SINGLE_ISSUER | DEFER_TASKRUN`.
    Cooperative,
    /// No task-run flags: completion work interrupts the thread and runs at once (an
    /// inter-processor interrupt when it runs on another CPU). With
    /// [`Options::single_issuer`] also `SINGLE_ISSUER`.
    Plain,
    /// `IORING_SETUP_SQPOLL`: a kernel thread polls the submission queue (and runs the
    /// completion work), so submitting costs no system call. It spins on a CPU of its
    /// own while requests come, and sleeps after `idle_ms` without any. If the kernel
    /// refuses, the ring is set up [`Plain`](RingSetup::Plain) and
    /// [`DirectWriter::ring_setup`](crate::DirectWriter::ring_setup) says so.
    SqPoll {
        /// Milliseconds without submissions after which the kernel thread sleeps.
        idle_ms: u32,
    },
}

impl std::fmt::Display for RingSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RingSetup::Auto => f.write_str("auto"),
            RingSetup::Cooperative => f.write_str("cooperative"),
            RingSetup::Plain => f.write_str("plain"),
            RingSetup::SqPoll { idle_ms } => write!(f, "sqpoll:{idle_ms}"),
        }
    }
}

impl std::str::FromStr for RingSetup {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(RingSetup::Auto),
            "cooperative" | "coop" => Ok(RingSetup::Cooperative),
            "plain" => Ok(RingSetup::Plain),
            "sqpoll" => Ok(RingSetup::SqPoll { idle_ms: 10 }),
            other => match other.strip_prefix("sqpoll:").map(str::parse) {
                Some(Ok(idle_ms)) => Ok(RingSetup::SqPoll { idle_ms }),
                _ => Err(format!(
                    "unknown ring setup {other:?} (auto, cooperative, plain, sqpoll[:IDLE_MS])"
                )),
            },
        }
    }
}

/// When requests queued with [`submit_write`](crate::DirectWriter::submit_write) reach
/// the kernel if the caller does not [`submit`](crate::DirectWriter::submit) them
/// itself: at once, in the `io_uring_enter` that waits for a completion, or in a call of
/// their own just before it. Ignored by the synchronous engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SubmitMode {
    /// [`WithWait`](SubmitMode::WithWait) at a queue depth below
    /// [`SubmitMode::AUTO_SEPARATE_MIN_QD`]; from there on
    /// [`Eager`](SubmitMode::Eager) for a block device or a file on a disk file system,
    /// [`Separate`](SubmitMode::Separate) for a file on tmpfs. The default.
    /// [`DirectWriter::submit_mode`](crate::DirectWriter::submit_mode) reports the
    /// choice; benches/README.md ("blockio vs fio") has the measurements behind it.
    #[default]
    Auto,
    /// One system call submits and waits: the fewest calls per request. With few
    /// requests in flight nothing is likely to finish between the two halves of a
    /// separate submission, so splitting only adds a call.
    WithWait,
    /// A wait first submits without waiting, collecting what finished meanwhile, and
    /// sleeps in a second call only if nothing did. With many requests in flight
    /// something usually did, and its replacement then goes out without a sleep and
    /// wake-up in between; when nothing did, the wait costs one more call.
    Separate,
    /// Every request goes to the kernel as it is queued: `submit_write` and
    /// `submit_read` make one `io_uring_enter` that submits it and collects what
    /// finished, without waiting (fio's pattern: one call per request). Where the
    /// kernel issues a direct write inside that call (block devices, ext4, xfs), the
    /// device gets each request the moment a slot frees, instead of when the caller
    /// next waits. Where it hands every write to a worker thread (tmpfs), one call per
    /// request costs more than it gains. What the call collects is judged there, as in
    /// a [`reap`](crate::DirectWriter::reap) (so after an `EIO` the submission may wait
    /// out the fence probe's settle period, as the synchronous engine's does), and a
    /// request queued after a conflict was seen fails fast. If the call fails, the
    /// request stays queued and the next `submit` or `reap` enters the kernel again
    /// and reports the error.
    Eager,
}

impl SubmitMode {
    /// The shallowest queue [`SubmitMode::Auto`] submits separately or eagerly at.
    pub const AUTO_SEPARATE_MIN_QD: usize = 8;

    /// The mode a writer with this queue depth uses, on tmpfs or not: never `Auto`.
    pub(crate) fn resolve(self, queue_depth: usize, tmpfs: bool) -> SubmitMode {
        match self {
            SubmitMode::Auto if queue_depth < Self::AUTO_SEPARATE_MIN_QD => SubmitMode::WithWait,
            SubmitMode::Auto if tmpfs => SubmitMode::Separate,
            SubmitMode::Auto => SubmitMode::Eager,
            other => other,
        }
    }
}

impl std::fmt::Display for SubmitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SubmitMode::Auto => "auto",
            SubmitMode::WithWait => "with-wait",
            SubmitMode::Separate => "separate",
            SubmitMode::Eager => "eager",
        })
    }
}

impl std::str::FromStr for SubmitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(SubmitMode::Auto),
            "with-wait" => Ok(SubmitMode::WithWait),
            "separate" => Ok(SubmitMode::Separate),
            "eager" => Ok(SubmitMode::Eager),
            other => Err(format!(
                "unknown submit mode {other:?} (auto, with-wait, separate, eager)"
            )),
        }
    }
}

/// Default of [`Options::fence_probe_settle`].
pub const DEFAULT_FENCE_PROBE_SETTLE: Duration = Duration::from_secs(1);

/// How to open a [`DirectWriter`](crate::DirectWriter). A builder: start from
/// `Options::default()` and chain setters.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) queue_depth: usize,
    pub(crate) engine: EngineKind,
    pub(crate) dsync: bool,
    pub(crate) register_file: bool,
    pub(crate) single_issuer: bool,
    pub(crate) ring_setup: RingSetup,
    pub(crate) spin_before_wait: Duration,
    pub(crate) submit_mode: SubmitMode,
    pub(crate) fence_probe: Option<Arc<dyn FenceProbe>>,
    pub(crate) fence_probe_settle: Duration,
    pub(crate) registered_buffers: Option<(usize, usize)>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            queue_depth: 32,
            engine: EngineKind::Auto,
            dsync: false,
            register_file: true,
            single_issuer: false,
            ring_setup: RingSetup::Auto,
            spin_before_wait: Duration::ZERO,
            submit_mode: SubmitMode::Auto,
            fence_probe: None,
            fence_probe_settle: DEFAULT_FENCE_PROBE_SETTLE,
            registered_buffers: None,
        }
    }
}

impl Options {
    /// The most requests outstanding (submitted and not yet reaped) at once; at least 1.
    /// Default 32.
    pub fn queue_depth(mut self, queue_depth: usize) -> Self {
        self.queue_depth = queue_depth.clamp(1, 4096);
        self
    }

    /// The engine to use. Default [`EngineKind::Auto`].
    pub fn engine(mut self, engine: EngineKind) -> Self {
        self.engine = engine;
        self
    }

    /// Makes every write durable before it completes (`RWF_DSYNC` per request). On a
    /// block device with a volatile write cache, Linux sends such an `O_DIRECT` write
    /// with Force Unit Access (FUA) when the device supports it, and a cache flush
    /// after it otherwise. Default off: call
    /// [`DirectWriter::flush`](crate::DirectWriter::flush) instead.
    pub fn dsync(mut self, dsync: bool) -> Self {
        self.dsync = dsync;
        self
    }

    /// Same as [`Options::dsync`]: Linux offers FUA to user space only through
    /// `RWF_DSYNC`/`O_DSYNC` on direct writes.
    pub fn fua(self, fua: bool) -> Self {
        self.dsync(fua)
    }

    /// Registers the file with io_uring (a fixed file) to save a file-table lookup per
    /// request. Default on; ignored by the synchronous engine.
    pub fn register_file(mut self, register: bool) -> Self {
        self.register_file = register;
        self
    }

    /// Promises that only the thread that opens the writer will use it, so the ring
    /// is set up with `IORING_SETUP_SINGLE_ISSUER` (Linux 6.0), and with the
    /// [cooperative](RingSetup::Cooperative) setup also `IORING_SETUP_DEFER_TASKRUN`
    /// (6.1: completion work runs when this thread reaps, not as interrupts).
    /// Requests from another thread then fail (`EEXIST`). Default off; the benchmark
    /// driver turns it on, as fio does.
    pub fn single_issuer(mut self, single: bool) -> Self {
        self.single_issuer = single;
        self
    }

    /// How the io_uring is set up; see [`RingSetup`]. Default [`RingSetup::Auto`].
    pub fn ring_setup(mut self, setup: RingSetup) -> Self {
        self.ring_setup = setup;
        self
    }

    /// Before a [`reap`](crate::DirectWriter::reap) that has to wait goes to sleep in
    /// the kernel, it polls for completions for up to this long (each poll a
    /// non-blocking `io_uring_enter`). A sleeping thread pays a wake-up per completion
    /// (on a virtual machine, the vCPU's halt and wake-up too), which at a fixed queue
    /// depth lowers IOPS; polling spends CPU instead, only while requests are in
    /// flight and only up to this long per wait. Default zero: sleep at once — on a
    /// shared 2-vCPU machine 20 µs of polling lost IOPS on both a virtio disk and tmpfs
    /// (where the polling thread takes the CPU the io_uring worker needs to finish the
    /// write it waits for), at more CPU per I/O; it can pay off only with a CPU to spare.
    pub fn spin_before_wait(mut self, spin: Duration) -> Self {
        self.spin_before_wait = spin;
        self
    }

    /// When queued requests reach the kernel; see [`SubmitMode`]. Default
    /// [`SubmitMode::Auto`].
    pub fn submit_mode(mut self, mode: SubmitMode) -> Self {
        self.submit_mode = mode;
        self
    }

    /// Sets up `count` buffers of `len` bytes (aligned to the device's
    /// [`alignment`](crate::DirectWriter::alignment)) registered with the io_uring
    /// (`IORING_REGISTER_BUFFERS`, fixed buffers): requests queued with a buffer lent by
    /// [`DirectWriter::registered_buffer`](crate::DirectWriter::registered_buffer) use
    /// `READ_FIXED`/`WRITE_FIXED`, which saves pinning the buffer's pages on every
    /// request. A lent buffer returns to the writer's pool when dropped. If the kernel
    /// refuses (e.g. `RLIMIT_MEMLOCK` on kernels before 5.12) the writer works without
    /// them; [`DirectWriter::uses_registered_buffers`](crate::DirectWriter::uses_registered_buffers)
    /// tells. Ignored by the synchronous engine. Default: none.
    pub fn registered_buffers(mut self, count: usize, len: usize) -> Self {
        self.registered_buffers = Some((count, len));
        self
    }

    /// Classifies writes that fail with `EIO` by asking `probe` whether this host is
    /// fenced: if it is, the write fails with
    /// [`Error::ReservationConflict`](crate::Error::ReservationConflict) and the writer
    /// becomes fenced. A preempt-and-abort fails in-flight writes with `EIO`, which
    /// without a probe is indistinguishable from a media error; see
    /// the [`probe`](crate::probe) module for the rules, and its `ReservationProbe`
    /// (feature `nvme-resv`) for an NVMe implementation. Default: none.
    pub fn fence_probe(mut self, probe: Arc<dyn FenceProbe>) -> Self {
        self.fence_probe = Some(probe);
        self
    }

    /// How long after a write failed with `EIO` the [fence probe](Options::fence_probe)
    /// must still say "not fenced" before the failure is reported as an ordinary I/O
    /// error. Until then a "not fenced" answer is asked again (pauses of 2 ms doubling
    /// to 50 ms), because a device may fail the preempted host's commands a moment
    /// before it removes the registration: Linux nvmet (7.3) kills the victim
    /// controller's command reference, which fails its new commands, before it
    /// unregisters the victim. A "fenced" answer ends the wait at once, so only genuine
    /// I/O errors pay it, once per batch of completions reaped together. Default
    /// [`DEFAULT_FENCE_PROBE_SETTLE`] (1 s).
    pub fn fence_probe_settle(mut self, settle: Duration) -> Self {
        self.fence_probe_settle = settle;
        self
    }
}
