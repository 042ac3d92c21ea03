//! Drives a `DirectWriter` the way fio drives a file, and prints one JSON line with the
//! IOPS and bandwidth, so `benches/scripts/blockio-vs-fio.sh` can put both side by side.
//!
//! ```text
//! bench_write --path FILE --rw randwrite|write --bs 4096 --qd 32 --runtime 5 \
//!             [--size BYTES] [--engine auto|io_uring|sync] [--dsync] [--no-single-issuer]
//!             [--registered-buffers]
//! ```
//! `--registered-buffers` (or `BLOCKIO_BENCH_REGISTERED_BUFFERS=1` in the environment,
//! so the comparison script runs unchanged) writes from `qd` registered (fixed)
//! buffers (`Options::registered_buffers`, `WRITE_FIXED`).
//! The ring is set up for a single issuer with deferred task work, as fio's io_uring
//! engine sets up its own (`--no-single-issuer` turns that off).
//! Keeps `qd` writes in flight: every completion is replaced at once, and all
//! replacements go to the kernel in one submission. Random offsets are uniform over
//! the `bs`-aligned blocks of the first `size` bytes (default: the whole file/device).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use blockio::{AlignedBuf, Completion, DirectWriter, EngineKind, Options};

struct Args {
    path: String,
    random: bool,
    bs: usize,
    qd: usize,
    runtime: Duration,
    size: Option<u64>,
    engine: EngineKind,
    dsync: bool,
    single_issuer: bool,
    registered: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        path: String::new(),
        random: true,
        bs: 4096,
        qd: 1,
        runtime: Duration::from_secs(5),
        size: None,
        engine: EngineKind::Auto,
        dsync: false,
        single_issuer: true,
        registered: std::env::var("BLOCKIO_BENCH_REGISTERED_BUFFERS").is_ok_and(|v| v == "1"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{k}: {e}"));
        match k.as_str() {
            "--path" => a.path = v()?,
            "--rw" => {
                a.random = match v()?.as_str() {
                    "randwrite" => true,
                    "write" => false,
                    other => return Err(format!("--rw {other}: randwrite or write")),
                }
            }
            "--bs" => a.bs = num(v()?)? as usize,
            "--qd" => a.qd = num(v()?)?.max(1) as usize,
            "--runtime" => {
                a.runtime = Duration::from_secs_f64(v()?.parse().map_err(|e| format!("{k}: {e}"))?)
            }
            "--size" => a.size = Some(num(v()?)?),
            "--engine" => a.engine = v()?.parse()?,
            "--dsync" => a.dsync = true,
            "--no-single-issuer" => a.single_issuer = false,
            "--registered-buffers" => a.registered = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.path.is_empty() {
        return Err("--path is required".into());
    }
    Ok(a)
}

/// xorshift64*: cheap, good enough to spread offsets.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn run(a: &Args) -> Result<String, Box<dyn std::error::Error>> {
    let mut opts = Options::default()
        .engine(a.engine)
        .queue_depth(a.qd)
        .dsync(a.dsync)
        .single_issuer(a.single_issuer);
    if a.registered {
        opts = opts.registered_buffers(a.qd, a.bs);
    }
    let mut w = DirectWriter::open(&a.path, opts)?;
    let size = a.size.unwrap_or(w.size()).min(w.size());
    let blocks = size / a.bs as u64;
    if blocks == 0 {
        return Err(format!("{} is smaller than one block of {}", a.path, a.bs).into());
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seq = 0u64;
    let mut next_offset = |rng: &mut Rng| {
        let block = if a.random {
            rng.next() % blocks
        } else {
            let b = seq;
            seq = (seq + 1) % blocks;
            b
        };
        block * a.bs as u64
    };

    let mut free: Vec<AlignedBuf> = (0..a.qd)
        .map(|i| {
            let mut b = match w.registered_buffer() {
                Some(b) => b,
                None => AlignedBuf::zeroed(a.bs, w.alignment().max(4096))?,
            };
            for (j, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = (i * 131 + j * 7) as u8;
            }
            Ok(b)
        })
        .collect::<Result<_, blockio::Error>>()?;
    let mut done: Vec<Completion> = Vec::with_capacity(a.qd);
    // Steady state only: IOs that complete before the deadline, over the time to the
    // deadline (fio's time_based window); the drain afterwards is not counted.
    let mut ios = 0u64;
    let start = Instant::now();
    let deadline = start + a.runtime;
    let mut window: Option<(u64, f64)> = None;
    loop {
        if window.is_none() {
            while let Some(buf) = free.pop() {
                let off = next_offset(&mut rng);
                w.submit_write(buf, off, 0).map_err(|r| r.error)?;
            }
        }
        if w.in_flight() == 0 {
            break;
        }
        w.reap(1, &mut done)?;
        for c in done.drain(..) {
            c.result?;
            ios += 1;
            free.push(c.buf);
        }
        if window.is_none() {
            let now = Instant::now();
            if now >= deadline {
                window = Some((ios, (now - start).as_secs_f64()));
            }
        }
    }
    let (ios, secs) = window.unwrap_or((ios, start.elapsed().as_secs_f64()));
    let iops = ios as f64 / secs;
    Ok(format!(
        "{{\"tool\":\"blockio\",\"engine\":\"{}\",\"rw\":\"{}\",\"bs\":{},\"qd\":{},\"ios\":{},\"seconds\":{:.3},\"iops\":{:.1},\"bw_bytes\":{:.0},\"fixed_file\":{},\"registered_buffers\":{}}}",
        w.engine(),
        if a.random { "randwrite" } else { "write" },
        a.bs,
        a.qd,
        ios,
        secs,
        iops,
        iops * a.bs as f64,
        w.uses_fixed_file(),
        w.registered_buffer_requests() > 0
    ))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_write: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench_write: {e}");
            ExitCode::FAILURE
        }
    }
}
