//! blockio throughput on a temp file (on `BLOCKIO_BENCH_DIR`, default `/var/tmp`):
//! 4 KiB random writes at QD 1 (both engines) and QD 32, and 1 MiB sequential writes.
//! For the side-by-side comparison with fio, see `benches/scripts/blockio-vs-fio.sh`.

use std::path::PathBuf;
use std::time::Duration;

use blockio::{AlignedBuf, Completion, DirectWriter, EngineKind, Options};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const FILE_SIZE: u64 = 64 << 20;

struct Target {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// A temp file of FILE_SIZE bytes, written once so benchmarks overwrite allocated blocks.
fn target() -> Target {
    let base = std::env::var_os("BLOCKIO_BENCH_DIR").unwrap_or_else(|| "/var/tmp".into());
    let dir = tempfile::Builder::new()
        .prefix("blockio-bench-")
        .tempdir_in(base)
        .expect("temp dir");
    let path = dir.path().join("bench.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(FILE_SIZE))
        .expect("create");
    let mut w =
        DirectWriter::open(&path, Options::default().engine(EngineKind::Sync)).expect("open");
    let chunk = AlignedBuf::zeroed(1 << 20, 4096).expect("buf");
    for i in 0..FILE_SIZE >> 20 {
        w.write_at(&chunk, i << 20).expect("lay out");
    }
    Target { _dir: dir, path }
}

impl Target {
    /// The io_uring writer of the queued benches: `queue_depth` requests in flight,
    /// single issuer (as fio runs).
    fn queued_writer(&self, queue_depth: usize) -> DirectWriter {
        DirectWriter::open(
            &self.path,
            Options::default()
                .engine(EngineKind::IoUring)
                .queue_depth(queue_depth)
                .single_issuer(true),
        )
        .expect("open")
    }
}

struct Offsets {
    state: u64,
    blocks: u64,
    bs: u64,
}

impl Offsets {
    fn new(bs: u64) -> Self {
        Offsets {
            state: 0x9e37_79b9_7f4a_7c15,
            blocks: FILE_SIZE / bs,
            bs,
        }
    }
    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state % self.blocks) * self.bs
    }
}

fn write_4k_qd1(c: &mut Criterion) {
    let t = target();
    let mut g = c.benchmark_group("blockio/4k-randwrite-qd1");
    g.throughput(Throughput::Elements(1));
    for engine in [EngineKind::IoUring, EngineKind::Sync] {
        let mut w = DirectWriter::open(&t.path, Options::default().engine(engine).queue_depth(1))
            .expect("open");
        let buf = AlignedBuf::from_slice(&[0x5a; 4096], w.alignment().max(4096)).expect("buf");
        let mut off = Offsets::new(4096);
        g.bench_function(BenchmarkId::from_parameter(engine), |b| {
            b.iter(|| w.write_at(&buf, off.next()).expect("write"))
        });
    }
    g.finish();
}

/// Keeps `qd` writes of `bs` bytes in flight until `n` have completed.
fn queued(
    w: &mut DirectWriter,
    bufs: &mut Vec<AlignedBuf>,
    n: u64,
    mut offset: impl FnMut() -> u64,
) {
    let mut done: Vec<Completion> = Vec::with_capacity(bufs.len());
    let mut submitted = 0;
    let mut completed = 0;
    while completed < n {
        while submitted < n {
            let Some(buf) = bufs.pop() else { break };
            w.submit_write(buf, offset(), submitted)
                .map_err(|r| r.error)
                .expect("submit");
            submitted += 1;
        }
        w.reap(1, &mut done).expect("reap");
        for c in done.drain(..) {
            c.result.expect("write");
            completed += 1;
            bufs.push(c.buf);
        }
    }
}

fn write_4k_qd32(c: &mut Criterion) {
    let t = target();
    let mut g = c.benchmark_group("blockio/4k-randwrite-qd32");
    const N: u64 = 256;
    g.throughput(Throughput::Elements(N));
    let mut w = t.queued_writer(32);
    let mut bufs: Vec<AlignedBuf> = (0..32)
        .map(|_| AlignedBuf::from_slice(&[0xa5; 4096], 4096).expect("buf"))
        .collect();
    let mut off = Offsets::new(4096);
    g.bench_function("io_uring", |b| {
        b.iter(|| queued(&mut w, &mut bufs, N, || off.next()))
    });
    g.finish();
}

fn write_1m_seq(c: &mut Criterion) {
    let t = target();
    let mut g = c.benchmark_group("blockio/1m-write-qd8");
    const N: u64 = 32;
    g.throughput(Throughput::Bytes(N << 20));
    let mut w = t.queued_writer(8);
    let mut bufs: Vec<AlignedBuf> = (0..8)
        .map(|_| AlignedBuf::zeroed(1 << 20, 4096).expect("buf"))
        .collect();
    let mut next = 0u64;
    g.bench_function("io_uring", |b| {
        b.iter(|| {
            queued(&mut w, &mut bufs, N, || {
                let o = next;
                next = (next + (1 << 20)) % FILE_SIZE;
                o
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = write_4k_qd1, write_4k_qd32, write_1m_seq
}
criterion_main!(benches);
