//! [`DirectWriter`]: the public face of both engines.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::error::{Error, Op, Result};
use crate::fence::Fence;
use crate::geometry::{Geometry, learn_geometry, probe_err};
use crate::options::{EngineKind, Options, RingSetup, SubmitMode};
use crate::req::{Completion, Rejected, Req};
use crate::sync::SyncEngine;
use crate::sys::buf::AlignedBuf;
use crate::sys::ring::{Ring, RingConfig};

/// Linux caps one read or write at `MAX_RW_COUNT` (`INT_MAX & PAGE_MASK`) bytes.
const MAX_RW_COUNT: usize = 0x7fff_f000;

#[derive(Debug)]
enum Engine {
    Ring(Box<Ring>),
    Sync(SyncEngine),
}

impl Engine {
    fn in_flight(&self) -> usize {
        match self {
            Engine::Ring(r) => r.in_flight(),
            Engine::Sync(_) => 0,
        }
    }
}

#[derive(Debug)]
struct Inner {
    // Dropped first: the ring drains its in-flight requests before anything else goes.
    engine: Engine,
    /// Judges every raw result the engine collects, and holds the fenced state.
    fence: Fence,
    ready: VecDeque<Completion>,
    closed: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Requests never reaped still run to their end under the writer's judgment (a
        // short write is continued), as they would have if reaped. The ring's own Drop
        // only makes sure the kernel is done with their buffers.
        if let Engine::Ring(r) = &mut self.engine
            && let Err(e) = r.drain_all(&mut self.ready, &mut self.fence)
        {
            tracing::warn!(error = %e, "io_uring: draining the writer's requests on drop failed");
        }
    }
}

/// An `O_DIRECT` writer (and reader) on a block device or a regular file.
///
/// The one property callers rely on: when the device refuses a request because of a
/// persistent reservation (`EBADE`), the request fails with
/// [`Error::ReservationConflict`], nothing is retried, and the writer becomes *fenced*:
/// every later write fails fast with the same error without reaching the device.
/// Reads and [`flush`](DirectWriter::flush) still go to the device; the device decides.
///
/// Requests must be aligned to [`alignment`](DirectWriter::alignment) (offset, length
/// and buffer address) and lie within [`size`](DirectWriter::size); others are refused
/// before submission. Regular files are never extended.
#[derive(Debug)]
pub struct DirectWriter {
    inner: Mutex<Inner>,
    // The writer's own descriptor, for fsync; the engine holds a duplicate.
    file: File,
    path: PathBuf,
    engine_kind: EngineKind,
    fallback: Option<Error>,
    fixed_file: bool,
    geometry: Geometry,
    queue_depth: usize,
    /// The submit mode in use (`Auto` resolved); the synchronous engine ignores it.
    submit_mode: SubmitMode,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn inner_mut(m: &mut Mutex<Inner>) -> &mut Inner {
    m.get_mut().unwrap_or_else(PoisonError::into_inner)
}

impl DirectWriter {
    /// Opens `path` (a block device or a regular file) read-write with `O_DIRECT`,
    /// learns its alignment and size, and starts the engine `options` asks for.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<DirectWriter> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|source| {
                if source.raw_os_error() == Some(libc::EINVAL) {
                    Error::DirectIoUnsupported {
                        path: path.to_path_buf(),
                    }
                } else {
                    Error::Open {
                        path: path.to_path_buf(),
                        source,
                    }
                }
            })?;
        let geometry = learn_geometry(&file, path)?;
        let dup = || file.try_clone().map_err(probe_err("dup", path));
        let queue_depth = options.queue_depth;
        let submit_mode = options.submit_mode.resolve(queue_depth, geometry.tmpfs);
        let ring_cfg = RingConfig {
            queue_depth,
            register_file: options.register_file,
            dsync: options.dsync,
            single_issuer: options.single_issuer,
            setup: match options.ring_setup {
                RingSetup::Auto => RingSetup::Cooperative,
                other => other,
            },
            spin: options.spin_before_wait,
            separate_submit: submit_mode == SubmitMode::Separate,
            registered_buffers: options.registered_buffers,
            buf_align: geometry.offset_align.max(geometry.mem_align),
        };
        let sync = |f: File| Engine::Sync(SyncEngine::new(f, options.dsync));
        let mut fallback = None;
        let engine = match options.engine {
            EngineKind::Sync => sync(dup()?),
            EngineKind::IoUring => Engine::Ring(Box::new(Ring::new(dup()?, ring_cfg)?)),
            EngineKind::Auto
                if geometry.tmpfs && queue_depth < SubmitMode::AUTO_SEPARATE_MIN_QD =>
            {
                tracing::debug!(
                    path = %path.display(),
                    queue_depth,
                    "blockio: tmpfs at a shallow queue: the synchronous engine (io_uring would hand every write to a worker thread)"
                );
                sync(dup()?)
            }
            EngineKind::Auto => match Ring::new(dup()?, ring_cfg) {
                Ok(r) => Engine::Ring(Box::new(r)),
                Err(e @ (Error::Ring { .. } | Error::Unsupported { .. })) => {
                    tracing::warn!(
                        path = %path.display(),
                        error = %e,
                        "blockio: io_uring is unavailable; using the synchronous pwrite engine"
                    );
                    fallback = Some(e);
                    sync(dup()?)
                }
                Err(e) => return Err(e),
            },
        };
        let (engine_kind, fixed_file) = match &engine {
            Engine::Ring(r) => (EngineKind::IoUring, r.fixed_file()),
            Engine::Sync(_) => (EngineKind::Sync, false),
        };
        tracing::info!(
            path = %path.display(),
            engine = %engine_kind,
            queue_depth,
            offset_align = geometry.offset_align,
            mem_align = geometry.mem_align,
            size = geometry.size,
            dsync = options.dsync,
            "blockio: opened with O_DIRECT"
        );
        Ok(DirectWriter {
            inner: Mutex::new(Inner {
                engine,
                fence: Fence::new(
                    geometry.offset_align,
                    options.fence_probe,
                    options.fence_probe_settle,
                ),
                ready: VecDeque::new(),
                closed: false,
            }),
            file,
            path: path.to_path_buf(),
            engine_kind,
            fallback,
            fixed_file,
            geometry,
            queue_depth,
            submit_mode,
        })
    }

    /// The engine actually in use: [`EngineKind::IoUring`] or [`EngineKind::Sync`].
    pub fn engine(&self) -> EngineKind {
        self.engine_kind
    }

    /// Why [`EngineKind::Auto`] fell back to the synchronous engine, if it did.
    pub fn fallback_reason(&self) -> Option<&Error> {
        self.fallback.as_ref()
    }

    /// Whether the io_uring engine uses a registered (fixed) file.
    pub fn uses_fixed_file(&self) -> bool {
        self.fixed_file
    }

    /// How the io_uring engine's ring is set up (the kernel may have refused the
    /// [`Options::ring_setup`] asked for); `None` for the synchronous engine.
    pub fn ring_setup(&self) -> Option<RingSetup> {
        match &lock(&self.inner).engine {
            Engine::Ring(r) => Some(r.setup()),
            Engine::Sync(_) => None,
        }
    }

    /// When queued requests reach the kernel ([`SubmitMode::Auto`] resolved for this
    /// file and queue depth), or `None` for the synchronous engine, which performs each
    /// request as it is queued.
    pub fn submit_mode(&self) -> Option<SubmitMode> {
        (self.engine_kind == EngineKind::IoUring).then_some(self.submit_mode)
    }

    /// Whether the io_uring engine has registered (fixed) buffers to lend
    /// ([`Options::registered_buffers`]).
    pub fn uses_registered_buffers(&self) -> bool {
        match &lock(&self.inner).engine {
            Engine::Ring(r) => r.has_registered_buffers(),
            Engine::Sync(_) => false,
        }
    }

    /// Lends one of the registered (fixed) buffers set up with
    /// [`Options::registered_buffers`], or `None` when there are none or all are lent.
    /// Queue it with [`submit_write`](DirectWriter::submit_write) /
    /// [`submit_read`](DirectWriter::submit_read) like any buffer; it comes back in the
    /// [`Completion`]. Its contents are whatever it last held. Dropping it returns it
    /// to the pool.
    pub fn registered_buffer(&self) -> Option<AlignedBuf> {
        match &lock(&self.inner).engine {
            Engine::Ring(r) => r.registered_buffer(),
            Engine::Sync(_) => None,
        }
    }

    /// How many requests were handed to the kernel with a registered buffer
    /// (`READ_FIXED`/`WRITE_FIXED`).
    pub fn registered_buffer_requests(&self) -> u64 {
        match &lock(&self.inner).engine {
            Engine::Ring(r) => r.fixed_buf_pushed(),
            Engine::Sync(_) => 0,
        }
    }

    /// The path this writer opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The alignment that satisfies every direct-I/O rule at once: offsets, lengths and
    /// buffer addresses that are multiples of it are accepted.
    pub fn alignment(&self) -> usize {
        self.geometry.offset_align.max(self.geometry.mem_align)
    }

    /// Required alignment of offsets and lengths (the logical block size on a device).
    pub fn offset_alignment(&self) -> usize {
        self.geometry.offset_align
    }

    /// Required alignment of buffer addresses.
    pub fn memory_alignment(&self) -> usize {
        self.geometry.mem_align
    }

    /// Size in bytes of the device (`BLKGETSIZE64`) or file (at open).
    pub fn size(&self) -> u64 {
        self.geometry.size
    }

    /// Whether the path is a block device.
    pub fn is_block_device(&self) -> bool {
        self.geometry.block_device
    }

    /// The configured queue depth.
    pub fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    /// True once the device refused a request because of a reservation.
    pub fn is_fenced(&self) -> bool {
        lock(&self.inner).fence.is_fenced()
    }

    /// The offset and length of the first request the device refused with a
    /// reservation conflict.
    pub fn fenced_at(&self) -> Option<(u64, usize)> {
        lock(&self.inner).fence.first()
    }

    /// Requests outstanding: submitted (or queued) and not yet returned by
    /// [`reap`](DirectWriter::reap).
    pub fn in_flight(&self) -> usize {
        let inner = lock(&self.inner);
        inner.engine.in_flight() + inner.ready.len()
    }

    /// Writes all of `buf` at `offset` and waits for the result. Requests queued with
    /// [`submit_write`](DirectWriter::submit_write) that finish meanwhile are kept for
    /// [`reap`](DirectWriter::reap).
    pub fn write_at(&mut self, buf: &AlignedBuf, offset: u64) -> Result<()> {
        let inner = inner_mut(&mut self.inner);
        check_request(
            &self.geometry,
            inner,
            Op::Write,
            offset,
            buf.len(),
            buf.as_ptr() as usize,
        )?;
        match &mut inner.engine {
            Engine::Ring(r) => {
                r.write_blocking(buf.as_slice(), offset, &mut inner.ready, &mut inner.fence)
            }
            Engine::Sync(s) => s.write_blocking(buf.as_slice(), offset, &mut inner.fence),
        }
    }

    /// Reads `buf.len()` bytes at `offset` into `buf` and waits for the result.
    pub fn read_at(&self, buf: &mut AlignedBuf, offset: u64) -> Result<()> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        check_request(
            &self.geometry,
            inner,
            Op::Read,
            offset,
            buf.len(),
            buf.as_ptr() as usize,
        )?;
        match &mut inner.engine {
            Engine::Ring(r) => r.read_blocking(
                buf.as_mut_slice(),
                offset,
                &mut inner.ready,
                &mut inner.fence,
            ),
            Engine::Sync(s) => s.read_blocking(buf.as_mut_slice(), offset, &mut inner.fence),
        }
    }

    fn submit_req(&mut self, req: Req) -> Result<(), Rejected> {
        let qd = self.queue_depth;
        let inner = inner_mut(&mut self.inner);
        let addr = req.buf.as_ptr() as usize;
        if let Err(error) = check_request(
            &self.geometry,
            inner,
            req.op,
            req.offset,
            req.buf.len(),
            addr,
        ) {
            return Err(Rejected {
                error,
                buf: req.buf,
            });
        }
        if inner.engine.in_flight() + inner.ready.len() >= qd {
            return Err(Rejected {
                error: Error::QueueFull { queue_depth: qd },
                buf: req.buf,
            });
        }
        match &mut inner.engine {
            Engine::Ring(r) => {
                r.start(req).map_err(|(error, req)| Rejected {
                    error,
                    buf: req.buf,
                })?;
                if self.submit_mode == SubmitMode::Eager
                    && let Err(e) = r.reap(0, &mut inner.ready, &mut inner.fence)
                {
                    // The request is queued either way: the next submit or reap
                    // enters the kernel again and reports an error that persists.
                    tracing::debug!(error = %e, "blockio: eager submission failed; the request stays queued");
                }
                Ok(())
            }
            Engine::Sync(s) => {
                s.start(req, &mut inner.ready, &mut inner.fence);
                Ok(())
            }
        }
    }

    /// Queues a write of all of `buf` at `offset`. It reaches the kernel at the next
    /// [`submit`](DirectWriter::submit) or [`reap`](DirectWriter::reap), or at once
    /// with [`SubmitMode::Eager`] (the synchronous engine performs it now). Its [`Completion`] carries `tag` and hands
    /// `buf` back. A refused request hands `buf` back in the [`Rejected`].
    pub fn submit_write(&mut self, buf: AlignedBuf, offset: u64, tag: u64) -> Result<(), Rejected> {
        self.submit_req(Req {
            op: Op::Write,
            tag,
            offset,
            buf,
        })
    }

    /// Queues a read of `buf.len()` bytes at `offset` into `buf`; see
    /// [`submit_write`](DirectWriter::submit_write).
    pub fn submit_read(&mut self, buf: AlignedBuf, offset: u64, tag: u64) -> Result<(), Rejected> {
        self.submit_req(Req {
            op: Op::Read,
            tag,
            offset,
            buf,
        })
    }

    /// Hands every queued request to the kernel in one system call, without waiting.
    /// Returns how many were submitted.
    pub fn submit(&mut self) -> Result<usize> {
        match &mut inner_mut(&mut self.inner).engine {
            Engine::Ring(r) => r.submit(),
            Engine::Sync(_) => Ok(0),
        }
    }

    /// Submits what is queued, waits until at least `min` requests have finished (or
    /// none is outstanding), and appends every finished request to `out`. Returns how
    /// many were appended.
    pub fn reap(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let inner = inner_mut(&mut self.inner);
        if inner.ready.len() < min
            && let Engine::Ring(r) = &mut inner.engine
        {
            let want = min - inner.ready.len();
            r.reap(want, &mut inner.ready, &mut inner.fence)?;
        } else if let Engine::Ring(r) = &mut inner.engine {
            // Pick up what is already done without blocking.
            r.reap(0, &mut inner.ready, &mut inner.fence)?;
        }
        let n = inner.ready.len();
        out.extend(inner.ready.drain(..));
        Ok(n)
    }

    /// Waits for every outstanding request and appends all completions to `out`.
    pub fn wait_all(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        let inner = inner_mut(&mut self.inner);
        if let Engine::Ring(r) = &mut inner.engine {
            r.drain_all(&mut inner.ready, &mut inner.fence)?;
        }
        let n = inner.ready.len();
        out.extend(inner.ready.drain(..));
        Ok(n)
    }

    /// Waits for every request in flight (their completions stay available to
    /// [`reap`](DirectWriter::reap)), then makes all completed writes durable
    /// (`fsync`: a cache flush on a block device).
    pub fn flush(&mut self) -> Result<()> {
        let inner = inner_mut(&mut self.inner);
        if inner.closed {
            return Err(Error::Closed);
        }
        if let Engine::Ring(r) = &mut inner.engine {
            r.drain_all(&mut inner.ready, &mut inner.fence)?;
        }
        self.file
            .sync_all()
            .map_err(|source| Error::Flush { source })
    }

    /// Waits for every request in flight and refuses all later requests with
    /// [`Error::Closed`]. Completions not yet reaped stay available to
    /// [`reap`](DirectWriter::reap). Dropping the writer also waits.
    pub fn close(&mut self) -> Result<()> {
        let inner = inner_mut(&mut self.inner);
        if let Engine::Ring(r) = &mut inner.engine {
            r.drain_all(&mut inner.ready, &mut inner.fence)?;
        }
        inner.closed = true;
        Ok(())
    }

    /// Makes the next request's result `res` (a byte count, or `-errno` such as
    /// `-libc::EBADE`) instead of the device's. The request is not performed: the
    /// io_uring engine submits a NOP in its place, the synchronous engine skips the
    /// system call. For tests of fencing paths only.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn inject_completion(&mut self, res: i32) {
        match &mut inner_mut(&mut self.inner).engine {
            Engine::Ring(r) => r.inject(res),
            Engine::Sync(s) => s.inject(res),
        }
    }

    /// How often the ring entered the kernel without waiting (polls) and to wait.
    #[cfg(test)]
    pub(crate) fn ring_enters(&self) -> (u64, u64) {
        match &lock(&self.inner).engine {
            Engine::Ring(r) => r.enters(),
            Engine::Sync(_) => (0, 0),
        }
    }

    /// How many requests reached the kernel so far (io_uring SQEs submitted, or
    /// read/write system calls): lets tests prove that a fenced writer submits nothing.
    pub fn requests_submitted(&self) -> u64 {
        match &lock(&self.inner).engine {
            Engine::Ring(r) => r.submitted_total(),
            Engine::Sync(s) => s.syscalls(),
        }
    }
}

/// Checks a request before submission; the order makes a fenced writer fail fast.
fn check_request(
    g: &Geometry,
    inner: &Inner,
    op: Op,
    offset: u64,
    len: usize,
    addr: usize,
) -> Result<()> {
    if inner.closed {
        return Err(Error::Closed);
    }
    if op == Op::Write && inner.fence.is_fenced() {
        return Err(Error::ReservationConflict { offset, len });
    }
    if offset % g.offset_align as u64 != 0 {
        return Err(Error::MisalignedOffset {
            offset,
            align: g.offset_align,
        });
    }
    if len == 0 || len % g.offset_align != 0 {
        return Err(Error::MisalignedLength {
            len,
            align: g.offset_align,
        });
    }
    if addr % g.mem_align != 0 {
        return Err(Error::MisalignedBuffer {
            addr,
            align: g.mem_align,
        });
    }
    if len > MAX_RW_COUNT {
        return Err(Error::RequestTooLarge {
            len,
            max: MAX_RW_COUNT,
        });
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= g.size => Ok(()),
        _ => Err(Error::OutOfBounds {
            offset,
            len,
            size: g.size,
        }),
    }
}

#[cfg(test)]
mod tests {
    //! The fenced state and the error mapping, driven by injected completion results
    //! through the real engines on a temp file.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::options::SubmitMode;
    use crate::probe::{FenceProbe, FenceVerdict};

    const LEN: u64 = 1 << 20;

    fn temp_file() -> (tempfile::TempDir, PathBuf) {
        let base = std::env::var_os("BLOCKIO_TEST_DIR").unwrap_or_else(|| "/var/tmp".into());
        let dir = tempfile::tempdir_in(base).expect("temp dir");
        let path = dir.path().join("dev.img");
        File::create(&path)
            .and_then(|f| f.set_len(LEN))
            .expect("create");
        (dir, path)
    }

    fn base(engine: EngineKind) -> Options {
        Options::default().engine(engine).queue_depth(8)
    }

    fn open(path: &Path, engine: EngineKind) -> DirectWriter {
        open_opts(path, base(engine))
    }

    fn open_opts(path: &Path, opts: Options) -> DirectWriter {
        let engine = opts.engine;
        let w = DirectWriter::open(path, opts).expect("open");
        assert_eq!(w.engine(), engine);
        w
    }

    /// `e` is the write of `want_len` bytes at offset 0 failing with a plain `EIO`.
    fn assert_write_eio_at_0(e: &Error, want_len: usize) {
        match e {
            Error::Io {
                op: Op::Write,
                offset: 0,
                len,
                source,
            } => {
                assert_eq!(*len, want_len);
                assert_eq!(source.raw_os_error(), Some(libc::EIO));
            }
            other => panic!("{other:?}"),
        }
    }

    fn w_geometry_tmpfs(path: &Path) -> bool {
        open(path, EngineKind::Sync).geometry.tmpfs
    }

    /// Every way the io_uring engine can be set up and driven, for tests that must hold
    /// in all of them.
    fn ring_variants() -> Vec<Options> {
        let mut v = Vec::new();
        for setup in [
            RingSetup::Cooperative,
            RingSetup::Plain,
            RingSetup::SqPoll { idle_ms: 10 },
        ] {
            for single_issuer in [false, true] {
                for submit in [
                    SubmitMode::WithWait,
                    SubmitMode::Separate,
                    SubmitMode::Eager,
                ] {
                    for spin in [Duration::ZERO, Duration::from_micros(50)] {
                        v.push(
                            base(EngineKind::IoUring)
                                .ring_setup(setup)
                                .single_issuer(single_issuer)
                                .submit_mode(submit)
                                .spin_before_wait(spin),
                        );
                    }
                }
            }
        }
        v
    }

    /// The fencing, short-write and EINTR/EAGAIN rules hold however the ring is set up
    /// and however it waits: the engine still hands every raw result to the one judge.
    #[test]
    fn every_ring_setup_and_wait_keeps_the_judgment() {
        for opts in ring_variants() {
            let what = format!(
                "{} single_issuer={} {} spin={:?}",
                opts.ring_setup, opts.single_issuer, opts.submit_mode, opts.spin_before_wait
            );
            eprintln!("{what}");
            conflict_fences_and_fails_fast(opts.clone());
            conflict_among_queued_requests(opts.clone());
            short_and_interrupted_requests_complete(opts);
        }
    }

    /// The setup asked for is the one in use (this kernel accepts all of them), and a
    /// separate submission is what the submit mode says.
    #[test]
    fn ring_setup_and_submit_mode_take_effect() {
        let (_d, path) = temp_file();
        for setup in [
            RingSetup::Cooperative,
            RingSetup::Plain,
            RingSetup::SqPoll { idle_ms: 10 },
        ] {
            let w = open_opts(&path, base(EngineKind::IoUring).ring_setup(setup));
            assert_eq!(w.ring_setup(), Some(setup));
            if matches!(setup, RingSetup::SqPoll { .. }) {
                // The kernel's polling thread is one of this process's threads; it
                // names itself once it first runs, which on a loaded machine may be a
                // moment after the ring was set up.
                let sqpoll_threads = || {
                    std::fs::read_dir("/proc/self/task")
                        .expect("/proc/self/task")
                        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                        .filter(|comm| comm.starts_with("iou-sqp"))
                        .count()
                };
                let deadline = Instant::now() + Duration::from_secs(10);
                while sqpoll_threads() == 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                assert!(sqpoll_threads() > 0, "no iou-sqp thread with {setup}");
            }
        }
        assert_eq!(open(&path, EngineKind::Sync).ring_setup(), None);
        // The default ring is cooperative on a disk file system and on tmpfs; the
        // default submission is eager on the disk and separate on tmpfs from queue
        // depth 8 on, and with the wait below it.
        assert!(!w_geometry_tmpfs(&path));
        let w = open(&path, EngineKind::IoUring);
        assert_eq!(w.ring_setup(), Some(RingSetup::Cooperative));
        assert_eq!(w.submit_mode(), Some(SubmitMode::Eager));
        drop(w);
        assert_eq!(
            open_opts(&path, base(EngineKind::IoUring).queue_depth(1)).submit_mode(),
            Some(SubmitMode::WithWait)
        );
        assert_eq!(open(&path, EngineKind::Sync).submit_mode(), None);
        // Auto keeps io_uring on a disk file system at any queue depth.
        for qd in [1, 32] {
            let w = DirectWriter::open(
                &path,
                Options::default().engine(EngineKind::Auto).queue_depth(qd),
            )
            .expect("open");
            assert_eq!(w.engine(), EngineKind::IoUring, "queue depth {qd}");
        }
        match tempfile::tempdir_in("/dev/shm") {
            Ok(shm) => {
                let p = shm.path().join("dev.img");
                File::create(&p)
                    .and_then(|f| f.set_len(LEN))
                    .expect("create");
                match DirectWriter::open(&p, base(EngineKind::IoUring)) {
                    Ok(w) => {
                        assert_eq!(w.ring_setup(), Some(RingSetup::Cooperative));
                        assert_eq!(w.submit_mode(), Some(SubmitMode::Separate));
                        drop(w);
                        // Auto: the synchronous engine below queue depth 8 on tmpfs
                        // (not a fallback), io_uring from 8 on.
                        let auto = |qd| {
                            DirectWriter::open(
                                &p,
                                Options::default().engine(EngineKind::Auto).queue_depth(qd),
                            )
                            .expect("open on tmpfs")
                        };
                        let w = auto(SubmitMode::AUTO_SEPARATE_MIN_QD - 1);
                        assert_eq!(w.engine(), EngineKind::Sync);
                        assert!(w.fallback_reason().is_none());
                        assert_eq!(w.ring_setup(), None);
                        assert_eq!(
                            auto(SubmitMode::AUTO_SEPARATE_MIN_QD).engine(),
                            EngineKind::IoUring
                        );
                        assert_eq!(auto(32).engine(), EngineKind::IoUring);
                    }
                    Err(Error::DirectIoUnsupported { .. }) => {
                        eprintln!("SKIPPED the tmpfs case: no O_DIRECT on tmpfs here")
                    }
                    Err(e) => panic!("open on /dev/shm: {e:?}"),
                }
            }
            Err(e) => eprintln!("SKIPPED the tmpfs case: no /dev/shm ({e})"),
        }

        // A queued write and a wait for it: an eager submission hands it to the kernel
        // before the wait; with a separate submission the first call into the kernel
        // only submits (a poll), and the wait, if any, comes after.
        for (mode, qd, resolved) in [
            (SubmitMode::WithWait, 1, SubmitMode::WithWait),
            (SubmitMode::Separate, 32, SubmitMode::Separate),
            (SubmitMode::Eager, 32, SubmitMode::Eager),
            (SubmitMode::Eager, 1, SubmitMode::Eager),
            (SubmitMode::Auto, 1, SubmitMode::WithWait),
            (
                SubmitMode::Auto,
                SubmitMode::AUTO_SEPARATE_MIN_QD - 1,
                SubmitMode::WithWait,
            ),
            (
                SubmitMode::Auto,
                SubmitMode::AUTO_SEPARATE_MIN_QD,
                SubmitMode::Eager,
            ),
            (SubmitMode::Auto, 32, SubmitMode::Eager),
        ] {
            let mut w = open_opts(
                &path,
                base(EngineKind::IoUring).queue_depth(qd).submit_mode(mode),
            );
            assert_eq!(
                w.submit_mode(),
                Some(resolved),
                "{mode} at queue depth {qd}"
            );
            let a = w.alignment();
            w.submit_write(filled(&w, a, 0x5a), 0, 7).expect("submit");
            assert_eq!(
                w.requests_submitted(),
                u64::from(resolved == SubmitMode::Eager),
                "{mode} at queue depth {qd}: submitted before the wait"
            );
            let mut out = Vec::new();
            w.reap(1, &mut out).expect("reap");
            assert_eq!(out.len(), 1);
            out[0].result.as_ref().expect("written");
            let (polls, _waits) = w.ring_enters();
            assert_eq!(
                polls > 0,
                resolved != SubmitMode::WithWait,
                "{mode} at queue depth {qd}: {polls} polls"
            );
            assert_eq!(on_disk(&path, 0, a), vec![0x5a; a]);
        }
    }

    fn filled(w: &DirectWriter, len: usize, byte: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(len, w.alignment()).expect("buf");
        b.as_mut_slice().fill(byte);
        b
    }

    fn on_disk(path: &Path, offset: u64, len: usize) -> Vec<u8> {
        let data = std::fs::read(path).expect("read back");
        data[offset as usize..offset as usize + len].to_vec()
    }

    fn conflict_fences_and_fails_fast(opts: Options) {
        let engine = opts.engine;
        let (_d, path) = temp_file();
        let mut w = open_opts(&path, opts);
        let a = w.alignment();
        let buf = filled(&w, 4 * a, 0x5a);
        w.write_at(&buf, 0).expect("first write");
        assert!(!w.is_fenced());

        w.inject_completion(-libc::EBADE);
        let before = w.requests_submitted();
        let off = 8 * a as u64;
        let err = w.write_at(&buf, off).expect_err("injected EBADE");
        assert!(
            matches!(err, Error::ReservationConflict { offset, len } if offset == off && len == 4 * a),
            "{err:?}"
        );
        assert!(w.is_fenced());
        assert_eq!(w.fenced_at(), Some((off, 4 * a)));
        // The refused write did not land (the engine never performed it).
        assert!(on_disk(&path, off, 4 * a).iter().all(|&b| b == 0));

        // Fail fast: the same typed error, and nothing reaches the kernel.
        let submitted = w.requests_submitted();
        assert!(submitted > before || engine == EngineKind::Sync);
        let again = w.write_at(&buf, 16 * a as u64).expect_err("fenced");
        assert!(
            matches!(again, Error::ReservationConflict { offset, .. } if offset == 16 * a as u64)
        );
        let rejected = w.submit_write(buf.clone(), 0, 7).expect_err("fenced");
        assert!(rejected.error.is_reservation_conflict());
        assert_eq!(rejected.buf, buf, "the buffer is handed back");
        assert_eq!(
            w.requests_submitted(),
            submitted,
            "a fenced writer submitted a request"
        );
        assert!(on_disk(&path, 16 * a as u64, 4 * a).iter().all(|&b| b == 0));

        // Reads still go to the device (it decides), and see the first write.
        let mut rb = AlignedBuf::zeroed(4 * a, a).expect("buf");
        w.read_at(&mut rb, 0).expect("read while fenced");
        assert_eq!(rb, buf);
    }

    on_each_engine!(conflict_fences_and_fails_fast via base);

    fn conflict_among_queued_requests(opts: Options) {
        let engine = opts.engine;
        let (_d, path) = temp_file();
        let mut w = open_opts(&path, opts);
        let a = w.alignment();
        // Requests 0 and 1 are fine, request 2 is refused. Request 3 was queued before
        // the conflict was known on io_uring, so it runs; the synchronous engine
        // performed request 2 at submission, so request 3 fails fast. An eager
        // submission may have collected request 2's result while submitting it (an
        // injected result completes at once, except on an SQPOLL ring's own time);
        // then request 3 fails fast too.
        let eager = w.submit_mode() == Some(SubmitMode::Eager);
        let mut refused_3 = false;
        for tag in 0..4u64 {
            if tag == 2 {
                w.inject_completion(-libc::EBADE);
            }
            let r = w.submit_write(filled(&w, a, tag as u8 + 1), tag * a as u64, tag);
            match r {
                Err(r) if tag == 3 => {
                    assert!(
                        engine == EngineKind::Sync || eager,
                        "only a writer that performed or submitted request 2 at once can know the conflict at submission: {:?}",
                        r.error
                    );
                    assert!(r.error.is_reservation_conflict());
                    assert!(on_disk(&path, 3 * a as u64, a).iter().all(|&b| b == 0));
                    refused_3 = true;
                }
                r => {
                    assert!(
                        tag != 3 || engine != EngineKind::Sync,
                        "the sync engine knew the conflict at submission"
                    );
                    r.expect("submit");
                }
            }
        }
        let mut out = Vec::new();
        w.wait_all(&mut out).expect("wait");
        out.sort_by_key(|c| c.tag);
        let expected = if refused_3 { 3 } else { 4 };
        assert_eq!(out.len(), expected);
        for c in &out {
            assert_eq!((c.offset, c.len), (c.tag * a as u64, a));
            if c.tag == 2 {
                assert!(
                    matches!(c.result, Err(Error::ReservationConflict { offset, len }) if offset == 2 * a as u64 && len == a),
                    "{:?}",
                    c.result
                );
            } else {
                c.result.as_ref().expect("unaffected request");
                assert_eq!(on_disk(&path, c.offset, a), vec![c.tag as u8 + 1; a]);
            }
        }
        assert!(w.is_fenced());
        assert_eq!(w.fenced_at(), Some((2 * a as u64, a)));
        let r = w.submit_write(filled(&w, a, 9), 0, 9).expect_err("fenced");
        assert!(r.error.is_reservation_conflict());
    }

    on_each_engine!(conflict_among_queued_requests via base);

    fn short_and_interrupted_requests_complete(opts: Options) {
        let (_d, path) = temp_file();
        let mut w = open_opts(&path, opts);
        let a = w.alignment();
        let buf = filled(&w, 4 * a, 0x77);

        // A short write of one block: the rest is submitted from there. (The injected
        // result replaces the first submission, so block 0 is never written.)
        w.inject_completion(a as i32);
        w.write_at(&buf, 0).expect("short write continued");
        assert!(on_disk(&path, 0, a).iter().all(|&b| b == 0));
        assert_eq!(on_disk(&path, a as u64, 3 * a), vec![0x77; 3 * a]);

        // EINTR and EAGAIN are resubmitted.
        w.inject_completion(-libc::EINTR);
        w.inject_completion(-libc::EAGAIN);
        w.write_at(&buf, 8 * a as u64)
            .expect("interrupted write resubmitted");
        assert_eq!(on_disk(&path, 8 * a as u64, 4 * a), vec![0x77; 4 * a]);

        // A short write that stops at a misaligned point is reported precisely.
        w.inject_completion(100);
        let e = w
            .write_at(&buf, 16 * a as u64)
            .expect_err("misaligned short write");
        assert!(
            matches!(e, Error::Short { op: Op::Write, offset, len, done: 100 } if offset == 16 * a as u64 && len == 4 * a),
            "{e:?}"
        );

        // Other errnos are I/O errors with context, and do not fence.
        w.inject_completion(-libc::EIO);
        let e = w.write_at(&buf, 0).expect_err("EIO");
        assert_write_eio_at_0(&e, 4 * a);
        assert!(!w.is_fenced());
        w.write_at(&buf, 0).expect("still writable after EIO");
    }

    on_each_engine!(short_and_interrupted_requests_complete via base);

    /// A probe whose answer the test sets, counting its calls (an in-memory fake for
    /// the classification logic; the real probe is proven in hwtests).
    #[derive(Debug)]
    struct FakeProbe {
        answer: Mutex<Option<FenceVerdict>>,
        /// Answers `Fenced` from this call on (counted from 1), like nvmet removing the
        /// registration a moment after the victim's commands started failing.
        fenced_from_call: Mutex<Option<usize>>,
        calls: std::sync::atomic::AtomicUsize,
    }

    /// The settle time the probed tests use.
    const SETTLE: Duration = Duration::from_millis(150);

    impl FakeProbe {
        fn new(answer: Option<FenceVerdict>) -> Arc<Self> {
            Arc::new(Self {
                answer: Mutex::new(answer),
                fenced_from_call: Mutex::new(None),
                calls: Default::default(),
            })
        }

        fn calls(&self) -> usize {
            self.calls.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl FenceProbe for FakeProbe {
        fn probe(&self) -> std::result::Result<FenceVerdict, crate::ProbeError> {
            let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let from = *self.fenced_from_call.lock().expect("lock");
            if from.is_some_and(|k| n >= k) {
                return Ok(FenceVerdict::Fenced);
            }
            let answer = *self.answer.lock().expect("lock");
            answer.ok_or_else(|| "report failed: no path to the namespace".into())
        }
    }

    /// Requests queued here reach the kernel together at the wait (an eager
    /// submission would judge each one on its own, at its submission).
    fn open_probed(path: &Path, engine: EngineKind, probe: &Arc<FakeProbe>) -> DirectWriter {
        let w = DirectWriter::open(
            path,
            Options::default()
                .engine(engine)
                .queue_depth(8)
                .submit_mode(SubmitMode::Separate)
                .fence_probe(probe.clone())
                .fence_probe_settle(SETTLE),
        )
        .expect("open");
        assert_eq!(w.engine(), engine);
        w
    }

    fn eio_with_probe_saying_fenced(engine: EngineKind) {
        let (_d, path) = temp_file();
        let probe = FakeProbe::new(Some(FenceVerdict::Fenced));
        let mut w = open_probed(&path, engine, &probe);
        let a = w.alignment();
        let buf = filled(&w, 2 * a, 0x3c);
        w.write_at(&buf, 0)
            .expect("a write that succeeds never probes");
        assert_eq!(probe.calls(), 0);

        // EIO on a read is not about fencing: no probe, still an I/O error.
        w.inject_completion(-libc::EIO);
        let mut rb = AlignedBuf::zeroed(2 * a, a).expect("buf");
        let e = w.read_at(&mut rb, 0).expect_err("injected read EIO");
        assert!(matches!(e, Error::Io { op: Op::Read, .. }), "{e:?}");
        assert_eq!(probe.calls(), 0);

        w.inject_completion(-libc::EIO);
        let off = 4 * a as u64;
        let e = w.write_at(&buf, off).expect_err("injected EIO");
        assert!(
            matches!(e, Error::ReservationConflict { offset, len } if offset == off && len == 2 * a),
            "{e:?}"
        );
        assert!(e.may_be_fenced() && !e.is_retryable());
        assert_eq!(probe.calls(), 1);
        assert!(w.is_fenced());
        assert_eq!(w.fenced_at(), Some((off, 2 * a)));

        // Fenced: later writes fail fast without reaching the kernel or the probe.
        let submitted = w.requests_submitted();
        let e = w.write_at(&buf, 0).expect_err("fenced");
        assert!(e.is_reservation_conflict());
        assert_eq!(w.requests_submitted(), submitted);
        assert_eq!(probe.calls(), 1);
        assert!(on_disk(&path, off, 2 * a).iter().all(|&b| b == 0));
    }

    on_each_engine!(eio_with_probe_saying_fenced);

    fn eio_with_probe_saying_not_fenced(engine: EngineKind) {
        let (_d, path) = temp_file();
        let probe = FakeProbe::new(Some(FenceVerdict::NotFenced));
        let mut w = open_probed(&path, engine, &probe);
        let a = w.alignment();
        let buf = filled(&w, a, 0x11);
        w.inject_completion(-libc::EIO);
        let t = Instant::now();
        let e = w.write_at(&buf, 0).expect_err("injected EIO");
        let waited = t.elapsed();
        assert_write_eio_at_0(&e, a);
        assert!(!e.is_reservation_conflict() && !e.is_retryable());
        // "Not fenced" is only believed once it held for the settle time.
        assert!(waited >= SETTLE, "reported after {waited:?}");
        assert!(probe.calls() >= 2, "asked again: {}", probe.calls());
        assert!(!w.is_fenced());
        w.write_at(&buf, 0)
            .expect("still writable: the probe cleared it");
        assert_eq!(on_disk(&path, 0, a), vec![0x11; a]);

        // The device removes the registration a moment after the EIO (nvmet kills the
        // victim's command reference first): the probe says "not fenced" twice, then
        // "fenced". The write is a conflict, found before the settle time is over.
        let before = probe.calls();
        *probe.fenced_from_call.lock().expect("lock") = Some(before + 3);
        w.inject_completion(-libc::EIO);
        let t = Instant::now();
        let e = w.write_at(&buf, a as u64).expect_err("EIO, fenced now");
        assert!(e.is_reservation_conflict(), "{e:?}");
        assert_eq!(probe.calls(), before + 3);
        assert!(t.elapsed() < SETTLE, "{:?}", t.elapsed());
        assert!(w.is_fenced());
        assert_eq!(w.fenced_at(), Some((a as u64, a)));
    }

    /// A genuine device error failing a whole queue: the EIOs reaped together share one
    /// settle period instead of waiting one each.
    #[test]
    fn eio_on_many_queued_writes_waits_one_settle_period() {
        let (_d, path) = temp_file();
        let probe = FakeProbe::new(Some(FenceVerdict::NotFenced));
        let mut w = open_probed(&path, EngineKind::IoUring, &probe);
        let a = w.alignment();
        for tag in 0..8u64 {
            w.inject_completion(-libc::EIO);
            w.submit_write(filled(&w, a, 1), tag * a as u64, tag)
                .expect("submit");
        }
        let t = Instant::now();
        let mut out = Vec::new();
        w.wait_all(&mut out).expect("wait");
        let waited = t.elapsed();
        assert_eq!(out.len(), 8);
        for c in &out {
            let e = c.result.as_ref().expect_err("EIO");
            assert!(matches!(e, Error::Io { .. }), "{e:?}");
        }
        assert!(!w.is_fenced());
        assert!(waited >= SETTLE, "{waited:?}");
        assert!(
            waited < 4 * SETTLE,
            "8 EIOs waited {waited:?}: one settle period each?"
        );
    }

    on_each_engine!(eio_with_probe_saying_not_fenced);

    fn eio_when_the_probe_fails(engine: EngineKind) {
        let (_d, path) = temp_file();
        let probe = FakeProbe::new(None);
        let mut w = open_probed(&path, engine, &probe);
        let a = w.alignment();
        let buf = filled(&w, a, 0x22);
        w.inject_completion(-libc::EIO);
        let e = w.write_at(&buf, 0).expect_err("injected EIO");
        match &e {
            Error::FenceUnverified {
                offset: 0,
                len,
                source,
                probe,
            } => {
                assert_eq!(*len, a);
                assert_eq!(source.raw_os_error(), Some(libc::EIO));
                assert!(probe.to_string().contains("no path"), "{probe}");
            }
            other => panic!("{other:?}"),
        }
        assert!(e.may_be_fenced() && !e.is_retryable() && !e.is_reservation_conflict());
        assert!(e.to_string().contains("do not retry"), "{e}");
        assert!(
            !e.to_string().contains("  "),
            "one line, single spaces: {e}"
        );
        assert_eq!(probe.calls(), 1);
        // Not fenced locally: the device decides the next write.
        assert!(!w.is_fenced());
        w.write_at(&buf, 0)
            .expect("the device accepts the next write");
    }

    on_each_engine!(eio_when_the_probe_fails);

    fn eio_without_a_probe(engine: EngineKind) {
        let (_d, path) = temp_file();
        let mut w = open(&path, engine);
        let a = w.alignment();
        let buf = filled(&w, a, 0x33);
        w.inject_completion(-libc::EIO);
        let e = w.write_at(&buf, 0).expect_err("injected EIO");
        assert!(
            matches!(&e, Error::Io { op: Op::Write, source, .. } if source.raw_os_error() == Some(libc::EIO)),
            "{e:?}"
        );
        assert!(
            e.may_be_fenced(),
            "an unclassified write EIO may be a fence"
        );
        assert!(!e.is_retryable() && !e.is_reservation_conflict());
        assert!(!w.is_fenced());

        // Once fenced, reads failing with EIO stay I/O errors: reads are not fenced.
        // (A write failing with EIO after the fence is in `eio_among_queued_writes`.)
        w.inject_completion(-libc::EBADE);
        let e = w.write_at(&buf, 0).expect_err("EBADE");
        assert!(e.is_reservation_conflict());
        w.inject_completion(-libc::EIO);
        let mut rb = AlignedBuf::zeroed(a, a).expect("buf");
        let e = w
            .read_at(&mut rb, 0)
            .expect_err("read EIO stays an I/O error");
        assert!(!e.may_be_fenced(), "{e:?}");
    }

    on_each_engine!(eio_without_a_probe);

    /// The shape of a preempt-and-abort on io_uring: queued writes, one fails with EIO
    /// before any EBADE, later ones with EBADE and EIO. With a probe every failure is
    /// a conflict and the probe runs once; without one only the EBADE and the EIO
    /// after it are.
    fn eio_among_queued_writes(with_probe: bool) {
        let (_d, path) = temp_file();
        let probe = FakeProbe::new(Some(FenceVerdict::Fenced));
        let mut w = if with_probe {
            open_probed(&path, EngineKind::IoUring, &probe)
        } else {
            // Queued together, as with the probe.
            open_opts(
                &path,
                base(EngineKind::IoUring).submit_mode(SubmitMode::Separate),
            )
        };
        let a = w.alignment();
        let results = [0, -libc::EIO, -libc::EBADE, -libc::EIO];
        for (tag, res) in results.iter().enumerate() {
            if *res != 0 {
                w.inject_completion(*res);
            }
            let tag = tag as u64;
            w.submit_write(filled(&w, a, tag as u8 + 1), tag * a as u64, tag)
                .expect("submit");
        }
        let mut out = Vec::new();
        w.wait_all(&mut out).expect("wait");
        out.sort_by_key(|c| c.tag);
        assert_eq!(out.len(), 4);
        out[0].result.as_ref().expect("the first write succeeds");
        assert!(
            out[2]
                .result
                .as_ref()
                .is_err_and(Error::is_reservation_conflict)
        );
        assert!(
            out[3]
                .result
                .as_ref()
                .is_err_and(Error::is_reservation_conflict)
        );
        let first = out[1].result.as_ref().expect_err("EIO");
        if with_probe {
            assert!(first.is_reservation_conflict(), "{first:?}");
            assert_eq!(probe.calls(), 1, "one probe; the fence answers the rest");
            assert_eq!(w.fenced_at(), Some((a as u64, a)));
        } else {
            assert!(
                matches!(first, Error::Io { .. }) && first.may_be_fenced(),
                "{first:?}"
            );
            assert_eq!(w.fenced_at(), Some((2 * a as u64, a)));
        }
        for c in &out[1..] {
            assert!(on_disk(&path, c.offset, a).iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn eio_among_queued_writes_with_a_probe() {
        eio_among_queued_writes(true);
    }

    #[test]
    fn eio_among_queued_writes_without_a_probe() {
        eio_among_queued_writes(false);
    }

    /// A fence probe is caller code: if it panics while a blocking write's request may
    /// be in the kernel, the process aborts instead of unwinding past the caller's
    /// buffer (which the caller could then free under the kernel). Run in a child
    /// process, which must die of SIGABRT.
    #[test]
    fn a_panicking_probe_during_a_blocking_write_aborts() {
        const CHILD: &str = "BLOCKIO_PANICKING_PROBE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            #[derive(Debug)]
            struct Panics;
            impl FenceProbe for Panics {
                fn probe(&self) -> std::result::Result<FenceVerdict, crate::ProbeError> {
                    panic!("the fence probe panicked");
                }
            }
            let (_d, path) = temp_file();
            let opts = Options::default()
                .engine(EngineKind::IoUring)
                .fence_probe(Arc::new(Panics));
            let mut w = DirectWriter::open(&path, opts).expect("open");
            let buf = filled(&w, w.alignment(), 0x66);
            w.inject_completion(-libc::EIO);
            let _ = w.write_at(&buf, 0);
            return;
        }
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "writer::tests::a_panicking_probe_during_a_blocking_write_aborts",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the child");
        // Without the guard the child does not die: the unwound request's completion
        // was consumed, so draining the ring on drop waits for it forever.
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait for the child").is_none() {
            if Instant::now() > deadline {
                child.kill().expect("kill the child");
                let out = child.wait_with_output().expect("child output");
                panic!(
                    "the child hung instead of aborting: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("child output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{:?}: {stderr}",
            out.status
        );
        assert!(stderr.contains("aborting to stay memory-safe"), "{stderr}");
    }

    #[test]
    fn registered_buffers_are_lent_returned_and_used() {
        let (_d, path) = temp_file();
        let probe =
            DirectWriter::open(&path, Options::default().engine(EngineKind::Sync)).expect("open");
        let a = probe.alignment();
        assert!(!probe.uses_registered_buffers());
        assert!(probe.registered_buffer().is_none(), "sync engine: none");
        drop(probe);

        let mut w = DirectWriter::open(
            &path,
            Options::default()
                .engine(EngineKind::IoUring)
                .queue_depth(4)
                .registered_buffers(2, 2 * a),
        )
        .expect("open");
        assert!(w.uses_registered_buffers());
        let mut b0 = w.registered_buffer().expect("first");
        let b1 = w.registered_buffer().expect("second");
        assert!(w.registered_buffer().is_none(), "only two");
        assert_eq!(b0.len(), 2 * a);
        assert_eq!(b0.as_ptr() as usize % a, 0);
        assert!(!b1.clone().is_registered(), "a clone is a plain buffer");
        drop(b1);
        let b1 = w.registered_buffer().expect("returned on drop");

        // A short write through a registered buffer continues inside it.
        b0.as_mut_slice().fill(0x44);
        w.inject_completion(a as i32);
        w.submit_write(b0, 0, 0).expect("submit");
        let mut out = Vec::new();
        w.wait_all(&mut out).expect("wait");
        let c = out.pop().expect("one completion");
        c.result.expect("short write continued");
        assert!(c.buf.is_registered(), "the buffer comes back");
        assert!(
            on_disk(&path, 0, a).iter().all(|&x| x == 0),
            "injected part"
        );
        assert_eq!(on_disk(&path, a as u64, a), vec![0x44; a]);
        // The NOP standing in for the injected result used no buffer; the rest did.
        assert_eq!(w.registered_buffer_requests(), 1);

        // A conflict on a registered buffer fences as any other.
        w.inject_completion(-libc::EBADE);
        w.submit_write(b1, 4 * a as u64, 1).expect("submit");
        w.wait_all(&mut out).expect("wait");
        let c = out.pop().expect("one completion");
        assert!(c.result.as_ref().is_err_and(Error::is_reservation_conflict));
        assert!(w.is_fenced());
        drop(c);
        assert!(w.registered_buffer().is_some());
    }
}
