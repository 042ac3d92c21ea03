//! Preempt-and-abort while the victim has a full io_uring queue of O_DIRECT writes in
//! flight: no write that reached the kernel after the preempt completed succeeds, the
//! writer ends fenced, and the device holds exactly the data of the writes that were
//! reported successful.
//!
//! With blockio's fence probe (a Reservation Report through the victim's own
//! controller), *every* failed write is the typed `ReservationConflict`, including the
//! ones nvmet fails with EIO while it drains the victim's controller. Without a probe
//! those stay `Io` errors (EIO), which `Error::may_be_fenced` flags; that variant is
//! kept to show the difference the probe makes.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use blockio::{
    AlignedBuf, Completion, DirectWriter, EngineKind, FenceProbe, FenceVerdict, Options,
    ProbeError, ReservationProbe,
};
use hwtests::{Outcome, report, setup};
use nvme_resv::{Access, Acquire, Namespace, Register, ReservationType, Reservations};

const WERO: ReservationType = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
/// Where the writes go: 8 MiB into the namespace, away from the other tests' blocks.
const REGION: u64 = 8 << 20;
const BLOCK: usize = 4096;
/// Upper bound on writes (16 MiB of distinct blocks); the preempt comes long before.
const MAX_WRITES: u64 = 4096;
const QUEUE_DEPTH: usize = 32;

/// What became of one write.
struct Done {
    tag: u64,
    result: blockio::Result<()>,
}

fn offset(tag: u64) -> u64 {
    REGION + tag * BLOCK as u64
}

fn fill(buf: &mut AlignedBuf, tag: u64) {
    let s = buf.as_mut_slice();
    s.fill(0xa5);
    s[..8].copy_from_slice(&(tag + 1).to_le_bytes());
}

/// The real probe, with a record of every answer and when it came (for the report line
/// and to show that the EIO path was exercised).
#[derive(Debug)]
struct Recorded {
    inner: ReservationProbe<Namespace>,
    verdicts: Mutex<Vec<(Instant, Result<FenceVerdict, String>)>>,
}

impl FenceProbe for Recorded {
    fn probe(&self) -> Result<FenceVerdict, ProbeError> {
        let r = self.inner.probe();
        self.verdicts.lock().expect("lock").push((
            Instant::now(),
            r.as_ref().map(|v| *v).map_err(|e| e.to_string()),
        ));
        r
    }
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn preempt_and_abort_with_a_full_queue_in_flight() {
    // Whether nvmet fails some of A's writes with EIO (they reach it while it drains A's
    // controller) or all with EBADE depends on timing. Repeat until a round took the
    // EIO path, so the probe's classification is proven, not just allowed; every round
    // asserts that each failed write is ReservationConflict.
    let min_rounds: usize = std::env::var("HWTEST_INFLIGHT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let max_rounds = min_rounds.max(MAX_ROUNDS);
    let mut eio_rounds = 0;
    let mut rounds = 0;
    while rounds < max_rounds && (rounds < min_rounds || eio_rounds == 0) {
        rounds += 1;
        if preempt_and_abort_in_flight(true) > 0 {
            eio_rounds += 1;
        }
    }
    println!(
        "{eio_rounds} of {rounds} rounds had writes fail with EIO before the fence was known; the probe classified each as fenced"
    );
    assert!(
        eio_rounds > 0,
        "no round of {rounds} had a write fail with EIO: the probe path was not exercised"
    );
}

/// Rounds of the probed test at most, unless `HWTEST_INFLIGHT_ROUNDS` asks for more.
const MAX_ROUNDS: usize = 12;

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn preempt_and_abort_with_a_full_queue_in_flight_without_a_probe() {
    preempt_and_abort_in_flight(false);
}

/// One round; returns how many failed writes came back from the device as EIO (with a
/// probe: how many times the probe was consulted; without: the unclassified EIOs).
fn preempt_and_abort_in_flight(with_probe: bool) -> usize {
    let hosts = setup();
    let (a, b) = (&hosts[0], &hosts[1]);

    // B zeroes the region first (no reservation yet), so refused writes are visible
    // as zeros afterwards.
    let mut wb =
        DirectWriter::open(&b.path, Options::default().engine(EngineKind::Sync)).expect("B open");
    let align = wb.alignment().max(BLOCK);
    let zeros = AlignedBuf::zeroed(1 << 20, align).expect("buffer");
    let region_len = MAX_WRITES * BLOCK as u64;
    for off in (REGION..REGION + region_len).step_by(1 << 20) {
        wb.write_at(&zeros, off).expect("B zeroes the region");
    }

    a.ns.register(&Register::register(a.key()))
        .expect("A register");
    a.ns.acquire(&Acquire::acquire(a.key(), WERO))
        .expect("A acquire");
    b.ns.register(&Register::register(b.key()))
        .expect("B register");

    // A's probe reads the report through A's own controller: reservation commands are
    // not failed while nvmet drains that controller's I/O.
    let probe = Arc::new(Recorded {
        inner: ReservationProbe::new(Namespace::open(&a.path).expect("A's namespace"), a.key())
            .host_id(a.hostid),
        verdicts: Mutex::new(Vec::new()),
    });
    let mut opts = Options::default()
        .engine(EngineKind::IoUring)
        .queue_depth(QUEUE_DEPTH);
    if with_probe {
        // The probed rounds also write from registered (fixed) buffers, so WRITE_FIXED
        // meets the real conflict and abort too; the unprobed one uses plain buffers.
        opts = opts
            .fence_probe(probe.clone())
            .registered_buffers(QUEUE_DEPTH, BLOCK);
    }
    let mut wa = DirectWriter::open(&a.path, opts).expect("A open");
    assert_eq!(wa.engine(), EngineKind::IoUring);
    assert_eq!(wa.uses_registered_buffers(), with_probe);

    let preempt_done: OnceLock<Instant> = OnceLock::new();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let mut submitted_at: Vec<Instant> = Vec::new();
    let mut done: Vec<Done> = Vec::new();
    let mut rejected_after_fence = 0u64;

    std::thread::scope(|s| {
        let preempt_done = &preempt_done;
        s.spawn(move || {
            // Preempt once A has had some writes completed.
            go_rx.recv().expect("go signal");
            b.ns.acquire(&Acquire::preempt_and_abort(b.key(), a.key(), WERO))
                .expect("B preempt-and-abort");
            preempt_done.set(Instant::now()).expect("set once");
        });

        let mut free: Vec<AlignedBuf> = (0..QUEUE_DEPTH)
            .map(|_| {
                wa.registered_buffer()
                    .unwrap_or_else(|| AlignedBuf::zeroed(BLOCK, align).expect("buffer"))
            })
            .collect();
        let mut tag = 0u64;
        let mut signalled = false;
        let mut out = Vec::new();
        loop {
            let mut queued = 0;
            while tag < MAX_WRITES {
                let Some(mut buf) = free.pop() else { break };
                fill(&mut buf, tag);
                // The instant before this request may reach the kernel: an eager
                // submission (blockio's default on a block device from queue depth 8)
                // hands it over inside `submit_write`, a batched one at `submit` below.
                let t = Instant::now();
                match wa.submit_write(buf, offset(tag), tag) {
                    Ok(()) => {
                        submitted_at.push(t);
                        tag += 1;
                        queued += 1;
                    }
                    Err(rej) => {
                        assert!(
                            rej.error.is_reservation_conflict(),
                            "a fenced writer refuses with the typed conflict: {rej}"
                        );
                        rejected_after_fence += 1;
                        free.push(rej.buf);
                        break;
                    }
                }
            }
            if queued > 0 {
                wa.submit().expect("submit");
            }
            out.clear();
            if wa.in_flight() > 0 {
                wa.reap(1, &mut out).expect("reap");
            }
            for c in out.drain(..) {
                let Completion {
                    tag, result, buf, ..
                } = c;
                done.push(Done { tag, result });
                free.push(buf);
            }
            if !signalled && done.len() >= 64 {
                go_tx.send(()).expect("signal the preempting thread");
                signalled = true;
            }
            let settled = preempt_done
                .get()
                .is_some_and(|p| p.elapsed() > Duration::from_millis(300));
            if (wa.is_fenced() && wa.in_flight() == 0 && settled) || tag >= MAX_WRITES {
                break;
            }
        }
        if !signalled {
            go_tx.send(()).expect("signal");
        }
        wa.wait_all(&mut out).expect("wait_all");
        done.extend(out.drain(..).map(|c| Done {
            tag: c.tag,
            result: c.result,
        }));
    });

    let preempt_done = *preempt_done.get().expect("the preempt completed");
    let ok: Vec<&Done> = done.iter().filter(|c| c.result.is_ok()).collect();
    let conflicts = done
        .iter()
        .filter(|c| {
            c.result
                .as_ref()
                .is_err_and(|e| e.is_reservation_conflict())
        })
        .count();
    // Without a probe, tolerated besides the conflict: EIO, only for a request that was
    // already in flight while the preempt-and-abort ran. nvmet aborts by draining the
    // victim's per-controller reference; a command arriving meanwhile completes with
    // Internal Error, which the block layer reports as EIO. Its data must not be on the
    // device (checked below like every failed write). With the probe, none is tolerated.
    let mut aborted = 0;
    let mut others = Vec::new();
    for c in &done {
        match &c.result {
            Err(e) if e.is_reservation_conflict() => {}
            Err(e @ blockio::Error::Io { source, .. })
                if !with_probe
                    && source.raw_os_error() == Some(libc::EIO)
                    // It may have reached the kernel before the preempt completed.
                    && submitted_at[c.tag as usize] <= preempt_done =>
            {
                assert!(e.may_be_fenced(), "{e:?}");
                aborted += 1;
            }
            Err(e) => others.push(format!("tag {}: {e:?}", c.tag)),
            Ok(()) => {}
        }
    }
    let timeline = probe.verdicts.lock().expect("lock").clone();
    let verdicts: Vec<&Result<FenceVerdict, String>> = timeline.iter().map(|(_, v)| v).collect();
    // How long the device took to show the registration gone after the first probe.
    let settled_ms = match (timeline.first(), timeline.last()) {
        (Some((t0, _)), Some((t1, _))) => t1.duration_since(*t0).as_secs_f64() * 1e3,
        _ => 0.0,
    };
    let late_ok: Vec<u64> = ok
        .iter()
        .filter(|c| submitted_at[c.tag as usize] > preempt_done)
        .map(|c| c.tag)
        .collect();
    println!(
        "A ({}) submitted {} writes at QD {QUEUE_DEPTH}: {} completed ok, {conflicts} \
         refused with ReservationConflict, {aborted} failed with EIO while the abort ran \
         (unclassified), {} other errors, {rejected_after_fence} refused by the fenced \
         writer before submission; fence probe answers for EIOs before the fence: \
         {verdicts:?} over {settled_ms:.1} ms; first fenced request {:?}; ok after the \
         preempt returned: {late_ok:?}",
        if with_probe {
            "with fence probe"
        } else {
            "no probe"
        },
        submitted_at.len(),
        ok.len(),
        others.len(),
        wa.fenced_at(),
    );
    assert!(
        others.is_empty(),
        "failed writes not classified as fenced: {others:#?}"
    );
    // Answers are "not fenced" while nvmet still lists A (it fails A's commands before
    // it unregisters A), then "fenced"; never an error, and the last one is "fenced".
    assert!(
        verdicts.iter().all(|v| v.is_ok()),
        "probe errors: {verdicts:?}"
    );
    if let Some(last) = verdicts.last() {
        assert_eq!(**last, Ok(FenceVerdict::Fenced), "{verdicts:?}");
    }
    if with_probe {
        let failed = done.iter().filter(|c| c.result.is_err()).count();
        assert_eq!(
            failed, conflicts,
            "every failed write is ReservationConflict"
        );
    } else {
        assert!(verdicts.is_empty(), "no probe was configured");
    }
    assert!(
        late_ok.is_empty(),
        "writes submitted after the preempt succeeded: {late_ok:?}"
    );
    assert!(ok.len() >= 64, "A wrote before the preempt");
    assert!(
        conflicts >= 1,
        "A's writes after the preempt were refused by the device"
    );
    assert!(wa.is_fenced());
    if with_probe {
        assert!(
            wa.registered_buffer_requests() >= ok.len() as u64,
            "A's writes went out as WRITE_FIXED: {}",
            wa.registered_buffer_requests()
        );
    }
    let buf = AlignedBuf::zeroed(BLOCK, align).expect("buffer");
    assert!(
        wa.write_at(&buf, REGION)
            .expect_err("fenced")
            .is_reservation_conflict()
    );
    assert_eq!(a.probe(Access::Write), Outcome::Denied);

    // The device holds exactly the successful writes.
    let ok_tags: std::collections::BTreeSet<u64> = ok.iter().map(|c| c.tag).collect();
    let mut rb = AlignedBuf::zeroed(BLOCK, align).expect("buffer");
    for tag in 0..submitted_at.len() as u64 {
        wb.read_at(&mut rb, offset(tag)).expect("B reads back");
        let head = u64::from_le_bytes(rb.as_slice()[..8].try_into().expect("8 bytes"));
        if ok_tags.contains(&tag) {
            assert_eq!(
                head,
                tag + 1,
                "write {tag} reported ok but is not on the device"
            );
        } else {
            assert_eq!(
                head, 0,
                "write {tag} was refused but its data is on the device"
            );
        }
    }
    let st = report(b);
    assert!(!st.is_registered(a.key()), "{st:?}");
    assert_eq!(st.holder().map(|r| r.rkey), Some(b.key()));
    hwtests::clear_all(&hosts);
    if with_probe { verdicts.len() } else { aborted }
}
