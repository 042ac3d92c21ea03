//! Drives a `DirectWriter` the way fio drives a file, and prints one JSON line with the
//! IOPS and bandwidth, so `benches/scripts/blockio-vs-fio.sh` can put both side by side.
//!
//! ```text
//! bench_write --path FILE --rw randwrite|write --bs 4096 --qd 32 --runtime 5 \
//!             [--size BYTES] [--engine auto|io_uring|sync] [--dsync] [--no-single-issuer]
//!             [--registered-buffers] [--setup auto|cooperative|plain|sqpoll[:IDLE_MS]]
//!             [--spin-us N] [--submit auto|with-wait|separate|eager] [--refill batch|eager]
//! ```
//! `--registered-buffers` (or `BLOCKIO_BENCH_REGISTERED_BUFFERS=1` in the environment,
//! so the comparison script runs unchanged) writes from `qd` registered (fixed)
//! buffers (`Options::registered_buffers`, `WRITE_FIXED`).
//! The ring is set up for a single issuer with deferred task work, as fio's io_uring
//! engine sets up its own (`--no-single-issuer` turns that off).
//! Keeps `qd` writes in flight: every completion is replaced at once. How:
//! - `--refill batch` (the default): the replacements of all the completions one reap
//!   returned are queued, and go to the kernel in the same `io_uring_enter` that waits
//!   for the next completion (one system call per wait);
//! - `--refill eager`: each replacement is submitted on its own at once, collecting
//!   whatever finished meanwhile in the same call (fio's pattern with its default
//!   `iodepth_batch_submit=1`: one system call per I/O).
//!
//! `--setup` picks the [`RingSetup`], `--submit` the [`SubmitMode`], and `--spin-us`
//! sets [`Options::spin_before_wait`] in microseconds. With none of these the driver runs the library's defaults.
//! `--legacy` is the setting every earlier measurement used (io_uring, cooperative,
//! single issuer, batch refill, no spin), kept as a named peer for A/B runs.
//! Random offsets are uniform over the `bs`-aligned blocks of the first `size` bytes
//! (default: the whole file/device).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use blockio::{AlignedBuf, Completion, DirectWriter, EngineKind, Options, RingSetup, SubmitMode};

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
    setup: Option<RingSetup>,
    spin: Option<Duration>,
    submit: Option<SubmitMode>,
    eager: bool,
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
        setup: None,
        spin: None,
        submit: None,
        eager: false,
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
            "--setup" => a.setup = Some(v()?.parse()?),
            "--submit" => a.submit = Some(v()?.parse()?),
            "--spin-us" => a.spin = Some(Duration::from_micros(num(v()?)?)),
            "--refill" => {
                a.eager = match v()?.as_str() {
                    "batch" => false,
                    "eager" => true,
                    other => return Err(format!("--refill {other}: batch or eager")),
                }
            }
            "--legacy" => {
                a.engine = EngineKind::IoUring;
                a.setup = Some(RingSetup::Cooperative);
                a.spin = Some(Duration::ZERO);
                a.submit = Some(SubmitMode::WithWait);
                a.single_issuer = true;
                a.eager = false;
            }
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
    if let Some(setup) = a.setup {
        opts = opts.ring_setup(setup);
    }
    if let Some(mode) = a.submit {
        opts = opts.submit_mode(mode);
    }
    if let Some(spin) = a.spin {
        opts = opts.spin_before_wait(spin);
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
    let mut collect = |done: &mut Vec<Completion>,
                       free: &mut Vec<AlignedBuf>,
                       window: &mut Option<(u64, f64)>|
     -> Result<(), blockio::Error> {
        for c in done.drain(..) {
            c.result?;
            ios += 1;
            free.push(c.buf);
        }
        if window.is_none() {
            let now = Instant::now();
            if now >= deadline {
                *window = Some((ios, (now - start).as_secs_f64()));
            }
        }
        Ok(())
    };
    loop {
        while window.is_none()
            && let Some(buf) = free.pop()
        {
            let off = next_offset(&mut rng);
            w.submit_write(buf, off, 0).map_err(|r| r.error)?;
            if a.eager {
                // Submit this one now, and pick up what finished meanwhile.
                w.reap(0, &mut done)?;
                collect(&mut done, &mut free, &mut window)?;
            }
        }
        if w.in_flight() == 0 {
            break;
        }
        w.reap(1, &mut done)?;
        collect(&mut done, &mut free, &mut window)?;
    }
    let ios = window.map_or(ios, |(n, _)| n);
    let secs = window.map_or_else(|| start.elapsed().as_secs_f64(), |(_, s)| s);
    let iops = ios as f64 / secs;
    Ok(format!(
        "{{\"tool\":\"blockio\",\"engine\":\"{}\",\"rw\":\"{}\",\"bs\":{},\"qd\":{},\"ios\":{},\"seconds\":{:.3},\"iops\":{:.1},\"bw_bytes\":{:.0},\"fixed_file\":{},\"registered_buffers\":{},\"setup\":\"{}\",\"spin_us\":{},\"refill\":\"{}\",\"submit\":\"{}\"}}",
        w.engine(),
        if a.random { "randwrite" } else { "write" },
        a.bs,
        a.qd,
        ios,
        secs,
        iops,
        iops * a.bs as f64,
        w.uses_fixed_file(),
        w.registered_buffer_requests() > 0,
        w.ring_setup().map_or("none".into(), |s| s.to_string()),
        a.spin.unwrap_or_default().as_micros(),
        if a.eager { "eager" } else { "batch" },
        w.submit_mode().map_or("none".into(), |m| m.to_string()),
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
