//! Preempt-then-verify latency on a real reservation-capable namespace, three ways in
//! one run, interleaved so that noise hits all three alike:
//!
//! - `raw`: the physical floor: the same two `NVME_IOCTL_IO_CMD` passthrough ioctls
//!   (Reservation Acquire with RACQA, then an extended Reservation Report into a
//!   4 KiB buffer) from a minimal loop, no parsing, no allocation;
//! - `lib`: `nvme_resv::Namespace` `acquire(preempt[-and-abort])` + `report()` and the
//!   check that the victim's key is gone (what the NVMe fencer does);
//! - `cli`: nvme-cli as two processes, as a shell fencer would: `nvme resv-acquire
//!   --racqa=N` then `nvme resv-report --eds -o json` (output captured, not parsed).
//!
//! Host B preempts host A's key; between timed iterations A re-registers (untimed)
//! and the result is checked through the library (untimed). Run in the hwtests guest
//! by `benches/scripts/guest-preempt.sh`; on real hardware:
//! `guest_preempt /dev/nvmeAn1 /dev/nvmeBn1` (DESTROYS the namespace's reservations).
//!
//! Environment: `PREEMPT_ITERS` (default 200) iterations of raw and lib per action;
//! `PREEMPT_CLI_EVERY` (default 4): one nvme-cli sample every that many iterations;
//! `PREEMPT_NVME` (default `nvme`).
#![deny(unsafe_code)]

use std::os::fd::AsFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benches::Summary;
use nvme_resv::{Acquire, AcquireAction, Key, Namespace, Register, ReservationType, Reservations};

mod sys {
    //! The floor: the two passthrough commands through `nvme_resv::raw` (the crate's
    //! command layout and ioctl numbers, no parsing, no allocation).
    use std::os::fd::BorrowedFd;

    use nvme_resv::raw::{self, Command, Data, Queue};

    /// The namespace id of `fd`.
    pub fn nsid(fd: BorrowedFd<'_>) -> std::io::Result<u32> {
        raw::namespace_id(fd)
    }

    /// The floor: preempt + report as two bare ioctls. Panics on a non-zero return.
    pub fn raw_once(
        fd: BorrowedFd<'_>,
        nsid: u32,
        racqa: u8,
        crkey: u64,
        prkey: u64,
        report: &mut [u8; super::REPORT_LEN],
    ) {
        let mut data = [0u8; 16];
        data[..8].copy_from_slice(&crkey.to_le_bytes());
        data[8..].copy_from_slice(&prkey.to_le_bytes());
        let acq =
            Command::new(0x11, nsid).cdw10(u32::from(racqa) | (u32::from(super::RTYPE.0) << 8));
        let r = raw::submit(fd, Queue::Io, &acq, Data::ToDevice(&data)).ret;
        assert_eq!(r, 0, "raw acquire returned {r:#x}");
        let rep = Command::new(0x0e, nsid)
            .cdw10((super::REPORT_LEN / 4 - 1) as u32)
            .cdw11(1); // EDS: extended data structure
        let r = raw::submit(fd, Queue::Io, &rep, Data::FromDevice(&mut report[..])).ret;
        assert_eq!(r, 0, "raw report returned {r:#x}");
    }
}

const RTYPE: ReservationType = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
const REPORT_LEN: usize = 4096;

fn lib_once(ns: &Namespace, racqa: AcquireAction, crkey: Key, prkey: Key) {
    let cmd = match racqa {
        AcquireAction::Preempt => Acquire::preempt(crkey, prkey, RTYPE),
        _ => Acquire::preempt_and_abort(crkey, prkey, RTYPE),
    };
    ns.acquire(&cmd).expect("library preempt");
    let st = ns.report().expect("library report");
    assert!(
        !st.is_registered(prkey),
        "library: victim key still registered"
    );
}

fn cli_once(nvme: &str, dev: &str, racqa: u8, crkey: Key, prkey: Key) {
    let st = Command::new(nvme)
        .args(["resv-acquire", dev])
        .arg(format!("--crkey={:#x}", crkey.0))
        .arg(format!("--prkey={:#x}", prkey.0))
        .arg(format!("--rtype={}", RTYPE.0))
        .arg(format!("--racqa={racqa}"))
        .stdout(Stdio::null())
        .status()
        .expect("spawn nvme resv-acquire");
    assert!(st.success(), "nvme resv-acquire failed: {st}");
    let out = Command::new(nvme)
        .args(["resv-report", dev, "--eds", "-o", "json"])
        .stderr(Stdio::inherit())
        .output()
        .expect("spawn nvme resv-report");
    assert!(
        out.status.success() && !out.stdout.is_empty(),
        "nvme resv-report failed"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dev_a, dev_b) = match args.as_slice() {
        [a, b] => (a.clone(), b.clone()),
        _ => {
            let hosts = std::env::var("HWTEST_NVME_HOSTS").unwrap_or_default();
            let v: Vec<&str> = hosts.split(',').filter(|s| !s.is_empty()).collect();
            assert!(
                v.len() >= 2,
                "usage: guest_preempt DEV_A DEV_B (or HWTEST_NVME_HOSTS=A,B[,C])"
            );
            (v[0].to_owned(), v[1].to_owned())
        }
    };
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let iters = env("PREEMPT_ITERS", 200);
    let cli_every = env("PREEMPT_CLI_EVERY", 4).max(1);
    let nvme = std::env::var("PREEMPT_NVME").unwrap_or_else(|_| "nvme".to_owned());
    let a = Namespace::open(&dev_a).expect("open A");
    let b = Namespace::open(&dev_b).expect("open B");
    let (ka, kb) = (
        nvme_resv::key_for_node("bench-a"),
        nvme_resv::key_for_node("bench-b"),
    );
    // Clean slate: unregister both hosts whatever their keys (IEKEY), then A holds
    // WERO and B is a registrant.
    for h in [&a, &b] {
        let _ = h.register(&Register::unregister(Key(1)).with_iekey(true));
    }
    a.register(&Register::register(ka)).expect("register A");
    a.acquire(&Acquire::acquire(ka, RTYPE)).expect("A acquires");
    b.register(&Register::register(kb)).expect("register B");

    let bfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev_b)
        .expect("open B raw");
    let bfd = bfile.as_fd();
    let nsid = sys::nsid(bfd).expect("nsid");
    let mut report = Box::new([0u8; REPORT_LEN]);
    let restore = || {
        a.register(&Register::register(ka)).expect("A re-registers");
    };
    println!(
        "guest_preempt: A={dev_a} B={dev_b} nsid={nsid} iterations={iters} cli every {cli_every}"
    );
    for (racqa, action) in [
        (2u8, AcquireAction::PreemptAndAbort),
        (1u8, AcquireAction::Preempt),
    ] {
        let (mut raw, mut lib, mut cli) = (Vec::new(), Vec::new(), Vec::new());
        let warmup = 5;
        for i in 0..iters + warmup {
            restore();
            let t = Instant::now();
            sys::raw_once(bfd, nsid, racqa, kb.0, ka.0, &mut report);
            let d = t.elapsed();
            assert!(
                !b.report().expect("check").is_registered(ka),
                "raw: A still registered"
            );
            if i >= warmup {
                raw.push(d);
            }
            restore();
            let t = Instant::now();
            lib_once(&b, action, kb, ka);
            let d = t.elapsed();
            if i >= warmup {
                lib.push(d);
            }
            if i >= warmup && i % cli_every == 0 {
                restore();
                let t = Instant::now();
                cli_once(&nvme, &dev_b, racqa, kb, ka);
                let d = t.elapsed();
                assert!(
                    !b.report().expect("check").is_registered(ka),
                    "cli: A still registered"
                );
                cli.push(d);
            }
        }
        let (r, l, c) = (
            Summary::of(&raw).expect("raw"),
            Summary::of(&lib).expect("lib"),
            Summary::of(&cli).expect("cli"),
        );
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("guest_preempt racqa={racqa} raw: {r}");
        println!("guest_preempt racqa={racqa} lib: {l}");
        println!("guest_preempt racqa={racqa} cli: {c}");
        println!(
            "BENCH guest_preempt racqa={racqa} raw_p50_ms={:.4} lib_p50_ms={:.4} cli_p50_ms={:.3} raw_mean_ms={:.4} lib_mean_ms={:.4} cli_mean_ms={:.3} lib_over_raw_p50={:.3} lib_over_raw_mean={:.3} cli_over_lib_p50={:.1}",
            ms(r.p50),
            ms(l.p50),
            ms(c.p50),
            ms(r.mean),
            ms(l.mean),
            ms(c.mean),
            l.p50.as_secs_f64() / r.p50.as_secs_f64(),
            l.mean.as_secs_f64() / r.mean.as_secs_f64(),
            c.p50.as_secs_f64() / l.p50.as_secs_f64()
        );
    }
    // Leave the namespace without our registrations.
    for h in [&a, &b] {
        let _ = h.register(&Register::unregister(Key(1)).with_iekey(true));
    }
    println!("guest_preempt: done");
}
