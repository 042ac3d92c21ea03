//! The io_uring and synchronous engines are interchangeable: the same random sequence
//! of aligned writes (blocking and queued, overlapping, flushed) leaves byte-identical
//! contents, equal to an in-memory model, on temp files and on loop devices.

mod common;

use std::path::Path;

use blockio::{AlignedBuf, Completion, DirectWriter, EngineKind, Options, RingSetup, SubmitMode};
use proptest::prelude::*;

const BLOCKS: u64 = 64;

#[derive(Debug, Clone)]
struct WriteOp {
    block: u64,
    blocks: u64,
    seed: u8,
    queued: bool,
    flush_after: bool,
}

fn write_op() -> impl Strategy<Value = WriteOp> {
    (
        0..BLOCKS,
        1..=8u64,
        any::<u8>(),
        any::<bool>(),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(block, blocks, seed, queued, flush_after)| WriteOp {
            block: block.min(BLOCKS - blocks),
            blocks,
            seed,
            queued,
            flush_after,
        })
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 7) as u8).rotate_left(i as u32 % 8))
        .collect()
}

fn check_all_ok(done: Vec<Completion>) {
    for c in done {
        if let Err(e) = c.result {
            panic!("request {} at {} failed: {e}", c.tag, c.offset);
        }
    }
}

/// Applies `ops` through a writer on `path` with `engine`, and returns what the device
/// holds afterwards, read back through the writer (queued reads).
fn apply(path: &Path, engine: EngineKind, ops: &[WriteOp]) -> Vec<u8> {
    apply_with(path, Options::default().engine(engine), engine, ops)
}

/// [`apply`] with `opts` (its queue depth is set to 4).
fn apply_with(path: &Path, opts: Options, engine: EngineKind, ops: &[WriteOp]) -> Vec<u8> {
    let mut w = DirectWriter::open(path, opts.queue_depth(4))
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    assert_eq!(w.engine(), engine);
    let bs = w.alignment();
    let total = BLOCKS as usize * bs;
    assert!(w.size() >= total as u64);
    w.write_at(&AlignedBuf::zeroed(total, bs).expect("buf"), 0)
        .expect("zero the range");

    // Queued writes in flight: overlapping ones may complete in any order, so a write
    // that overlaps one in flight waits for the queue to drain first.
    let mut in_flight: Vec<(u64, u64)> = Vec::new();
    for (tag, op) in ops.iter().enumerate() {
        let (start, end) = (op.block, op.block + op.blocks);
        let overlaps = in_flight.iter().any(|&(s, e)| start < e && s < end);
        if overlaps || (!op.queued && !in_flight.is_empty()) || in_flight.len() == w.queue_depth() {
            let mut done = Vec::new();
            w.wait_all(&mut done).expect("wait");
            check_all_ok(done);
            in_flight.clear();
        }
        let len = op.blocks as usize * bs;
        let buf = AlignedBuf::from_slice(&pattern(op.seed, len), bs).expect("buf");
        let offset = op.block * bs as u64;
        if op.queued {
            w.submit_write(buf, offset, tag as u64).expect("submit");
            in_flight.push((start, end));
            if tag % 3 == 0 {
                w.submit().expect("submit batch");
            }
        } else {
            w.write_at(&buf, offset).expect("write");
        }
        if op.flush_after {
            w.flush().expect("flush");
            let mut done = Vec::new();
            w.reap(0, &mut done).expect("reap");
            check_all_ok(done);
            in_flight.clear();
        }
    }
    let mut done = Vec::new();
    w.wait_all(&mut done).expect("wait");
    check_all_ok(done);
    w.flush().expect("flush");

    // Read back in 4 queued reads.
    let chunk = total / 4;
    for i in 0..4u64 {
        let buf = AlignedBuf::zeroed(chunk, bs).expect("buf");
        w.submit_read(buf, i * chunk as u64, i)
            .expect("submit read");
    }
    let mut reads = Vec::new();
    while reads.len() < 4 {
        w.reap(4 - reads.len(), &mut reads).expect("reap reads");
    }
    reads.sort_by_key(|c| c.tag);
    let mut data = Vec::with_capacity(total);
    for c in reads {
        c.result.as_ref().expect("read");
        data.extend_from_slice(c.buf.as_slice());
    }
    // Cross-check with a blocking read.
    let mut whole = AlignedBuf::zeroed(total, bs).expect("buf");
    w.read_at(&mut whole, 0).expect("read_at");
    assert_eq!(
        whole.as_slice(),
        &data[..],
        "queued and blocking reads disagree"
    );
    data
}

fn model(bs: usize, ops: &[WriteOp]) -> Vec<u8> {
    let mut m = vec![0u8; BLOCKS as usize * bs];
    for op in ops {
        let off = op.block as usize * bs;
        let len = op.blocks as usize * bs;
        m[off..off + len].copy_from_slice(&pattern(op.seed, len));
    }
    m
}

/// Every way the io_uring engine can be set up and wait.
fn ring_options() -> impl Strategy<Value = Options> {
    (
        prop_oneof![
            Just(RingSetup::Auto),
            Just(RingSetup::Cooperative),
            Just(RingSetup::Plain),
            Just(RingSetup::SqPoll { idle_ms: 10 }),
        ],
        any::<bool>(),
        prop_oneof![
            Just(SubmitMode::Auto),
            Just(SubmitMode::WithWait),
            Just(SubmitMode::Separate),
            Just(SubmitMode::Eager),
        ],
        prop_oneof![Just(0u64), Just(20)],
    )
        .prop_map(|(setup, single_issuer, submit, spin_us)| {
            Options::default()
                .engine(EngineKind::IoUring)
                .ring_setup(setup)
                .single_issuer(single_issuer)
                .submit_mode(submit)
                .spin_before_wait(std::time::Duration::from_micros(spin_us))
        })
}

fn engines_agree(
    a: &Path,
    b: &Path,
    ring_opts: Options,
    ops: &[WriteOp],
) -> Result<(), TestCaseError> {
    let ring = apply_with(a, ring_opts, EngineKind::IoUring, ops);
    let sync = apply(b, EngineKind::Sync, ops);
    let bs = ring.len() / BLOCKS as usize;
    prop_assert!(ring == sync, "io_uring and sync contents differ");
    prop_assert!(ring == model(bs, ops), "contents differ from the model");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engines_leave_identical_files(
        ops in prop::collection::vec(write_op(), 1..40),
        ring_opts in ring_options(),
    ) {
        let dir = common::test_dir();
        let a = common::zero_file(dir.path(), "uring.img", 1 << 20);
        let b = common::zero_file(dir.path(), "sync.img", 1 << 20);
        engines_agree(&a, &b, ring_opts, &ops)?;
        // The files themselves, read without the writer, are identical too.
        prop_assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
    }
}

/// Queued one-block writes at `(block, seed)` through registered (fixed) buffers, then
/// the whole range read back through registered buffers. Returns the contents and how
/// many requests used a registered buffer.
fn apply_registered(path: &Path, ops: &[(u64, u8)]) -> (Vec<u8>, u64) {
    const QD: usize = 8;
    let probe =
        DirectWriter::open(path, Options::default().engine(EngineKind::Sync)).expect("open");
    let bs = probe.alignment();
    drop(probe);
    let mut w = DirectWriter::open(
        path,
        Options::default()
            .engine(EngineKind::IoUring)
            .queue_depth(QD)
            .registered_buffers(QD, bs),
    )
    .expect("open");
    assert!(w.uses_registered_buffers(), "registration refused");
    let mut in_flight: Vec<u64> = Vec::new();
    let mut done = Vec::new();
    for (tag, &(block, seed)) in ops.iter().enumerate() {
        if in_flight.contains(&block) || in_flight.len() == QD {
            w.wait_all(&mut done).expect("wait");
            in_flight.clear();
            // Completed buffers go back to the pool when dropped.
            for c in done.drain(..) {
                c.result.expect("write");
            }
        }
        let mut buf = w.registered_buffer().expect("a free registered buffer");
        assert!(buf.is_registered());
        buf.as_mut_slice().copy_from_slice(&pattern(seed, bs));
        w.submit_write(buf, block * bs as u64, tag as u64)
            .expect("submit");
        in_flight.push(block);
    }
    w.wait_all(&mut done).expect("wait");
    for c in done.drain(..) {
        c.result.expect("write");
    }
    let mut data = vec![0u8; BLOCKS as usize * bs];
    for chunk in 0..BLOCKS / QD as u64 {
        for i in 0..QD as u64 {
            let block = chunk * QD as u64 + i;
            let buf = w.registered_buffer().expect("a free registered buffer");
            w.submit_read(buf, block * bs as u64, block).expect("read");
        }
        w.wait_all(&mut done).expect("wait");
        for c in done.drain(..) {
            c.result.as_ref().expect("read");
            let off = c.tag as usize * bs;
            data[off..off + bs].copy_from_slice(c.buf.as_slice());
        }
    }
    (data, w.registered_buffer_requests())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Registered buffers carry the same bytes as the synchronous engine with plain
    /// buffers, and every request really used one.
    #[test]
    fn registered_buffers_leave_identical_files(
        ops in prop::collection::vec((0..BLOCKS, any::<u8>()), 1..80),
    ) {
        let dir = common::test_dir();
        let a = common::zero_file(dir.path(), "fixed.img", 1 << 20);
        let b = common::zero_file(dir.path(), "sync.img", 1 << 20);
        let (fixed, used) = apply_registered(&a, &ops);
        let as_ops: Vec<WriteOp> = ops
            .iter()
            .map(|&(block, seed)| WriteOp { block, blocks: 1, seed, queued: false, flush_after: false })
            .collect();
        let sync = apply(&b, EngineKind::Sync, &as_ops);
        let bs = sync.len() / BLOCKS as usize;
        prop_assert!(fixed == sync, "registered-buffer and sync contents differ");
        prop_assert!(fixed == model(bs, &as_ops), "contents differ from the model");
        prop_assert_eq!(used, ops.len() as u64 + BLOCKS, "requests that used a registered buffer");
    }
}

#[test]
fn engines_leave_identical_loop_devices() {
    if !nix_is_root() {
        eprintln!("SKIPPED engines_leave_identical_loop_devices: loop devices need root");
        return;
    }
    let dir = common::test_dir();
    let fa = common::zero_file(dir.path(), "loop-a.img", 1 << 20);
    let fb = common::zero_file(dir.path(), "loop-b.img", 1 << 20);
    let (la, lb) = match (common::LoopDev::attach(&fa), common::LoopDev::attach(&fb)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("SKIPPED engines_leave_identical_loop_devices: {e}");
            return;
        }
    };
    let w = DirectWriter::open(&la.path, Options::default()).expect("open loop device");
    assert!(w.is_block_device());
    assert_eq!(w.size(), 1 << 20, "BLKGETSIZE64 of the loop device");
    drop(w);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(prop::collection::vec(write_op(), 1..40), ring_options()),
            |(ops, ring_opts)| engines_agree(&la.path, &lb.path, ring_opts, &ops),
        )
        .expect("engines agree on loop devices");
    drop((la, lb));
    // The backing files hold the same bytes.
    assert_eq!(std::fs::read(&fa).unwrap(), std::fs::read(&fb).unwrap());
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
