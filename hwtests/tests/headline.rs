//! The headline claim, on a real NVMe target: once B preempts A's registration, A's
//! very next O_DIRECT write through `blockio` fails with a typed `ReservationConflict`
//! (EBADE), while the surviving registrants keep writing.
//!
//! Run with `--include-ignored --test-threads=1` (see the crate docs).

use blockio::{AlignedBuf, DirectWriter, EngineKind, Options};
use hwtests::{Host, Outcome, report, setup};
use nvme_resv::{Access, Acquire, Register, ReservationType, Reservations};

const WERO: ReservationType = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;

fn pattern(align: usize, len: usize, byte: u8) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len, align).expect("aligned buffer");
    buf.as_mut_slice().fill(byte);
    buf
}

fn writer(h: &Host, engine: EngineKind) -> DirectWriter {
    let w = DirectWriter::open(&h.path, Options::default().engine(engine))
        .unwrap_or_else(|e| panic!("host {}: open {}: {e}", h.name, h.path.display()));
    if engine != EngineKind::Auto {
        assert_eq!(
            w.engine(),
            engine,
            "host {}: engine actually in use",
            h.name
        );
    }
    w
}

fn read_back(h: &Host, offset: u64, len: usize, align: usize) -> Vec<u8> {
    let w = writer(h, EngineKind::Sync);
    let mut buf = AlignedBuf::zeroed(len, align).expect("aligned buffer");
    w.read_at(&mut buf, offset)
        .unwrap_or_else(|e| panic!("host {}: read at {offset}: {e}", h.name));
    buf.as_slice().to_vec()
}

fn headline(engine: EngineKind, abort: bool) {
    let hosts = setup();
    let (a, b) = (&hosts[0], &hosts[1]);
    let survivors: Vec<&Host> = hosts[1..].iter().collect();

    // A registers and holds Write Exclusive - Registrants Only; B and C register.
    a.ns.register(&Register::register(a.key()))
        .expect("A register");
    a.ns.acquire(&Acquire::acquire(a.key(), WERO))
        .expect("A acquire WERO");
    for h in &survivors {
        h.ns.register(&Register::register(h.key()))
            .unwrap_or_else(|e| panic!("{} register: {e}", h.name));
    }

    // A writes through blockio.
    let mut wa = writer(a, engine);
    let align = wa.alignment();
    let len = align.max(4096);
    let a_data = pattern(align, len, 0xa1);
    wa.write_at(&a_data, 0)
        .expect("A holds the reservation: its write succeeds");
    assert!(!wa.is_fenced());
    println!(
        "A wrote {len} bytes at 0 through blockio ({:?} engine)",
        wa.engine()
    );

    // B preempts A's key: a library call.
    let before = report(b);
    let cmd = if abort {
        Acquire::preempt_and_abort(b.key(), a.key(), WERO)
    } else {
        Acquire::preempt(b.key(), a.key(), WERO)
    };
    b.ns.acquire(&cmd).expect("B preempts A");

    // A's next write fails with the typed conflict, at the offset and length it asked for.
    let offset = len as u64;
    let err = wa
        .write_at(&a_data, offset)
        .expect_err("A was preempted: its next write must fail");
    assert!(
        err.is_reservation_conflict(),
        "expected ReservationConflict, got {err:?}"
    );
    match err {
        blockio::Error::ReservationConflict { offset: o, len: l } => {
            assert_eq!((o, l as u64), (offset, len as u64), "conflict context");
        }
        other => panic!("expected Error::ReservationConflict, got {other:?}"),
    }
    assert!(wa.is_fenced(), "a conflict must leave the writer fenced");
    // Fenced writers fail fast: same typed error without touching the device.
    let again = wa.write_at(&a_data, 2 * offset).expect_err("fenced writer");
    assert!(again.is_reservation_conflict(), "{again:?}");
    // The refusal is the device's, not only the writer's state: a fresh O_DIRECT
    // write from A is refused too, while A may still read (WERO).
    assert_eq!(a.probe(Access::Write), Outcome::Denied);
    assert_eq!(a.probe(Access::Read), Outcome::Allowed);

    // B and C still write through blockio, and their data lands.
    for (i, h) in survivors.iter().enumerate() {
        let mut w = writer(h, engine);
        let data = pattern(align, len, 0xb0 + i as u8);
        let off = (4 + i as u64) * len as u64;
        w.write_at(&data, off)
            .unwrap_or_else(|e| panic!("survivor {} write: {e:?}", h.name));
        assert_eq!(
            read_back(hosts.last().unwrap(), off, len, align),
            data.as_slice()
        );
    }
    // A's write from before the preempt is on the device; its refused one is not.
    assert_eq!(read_back(b, 0, len, align), a_data.as_slice());
    assert_ne!(read_back(b, offset, len, align), a_data.as_slice());

    // The report no longer lists A; B holds the reservation; the preempt bumped the
    // generation once.
    let after = report(b);
    assert!(!after.is_registered(a.key()), "A still listed: {after:?}");
    for h in &survivors {
        assert!(
            after.is_registered(h.key()),
            "{} missing: {after:?}",
            h.name
        );
    }
    assert_eq!(after.rtype, WERO);
    assert_eq!(after.holder().map(|r| r.rkey), Some(b.key()));
    assert_eq!(
        after.generation,
        before.generation + 1,
        "{before:?} -> {after:?}"
    );
    assert_eq!(usize::from(after.regctl), survivors.len());
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn preempted_host_write_is_reservation_conflict_io_uring() {
    headline(EngineKind::IoUring, false);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn preempted_host_write_is_reservation_conflict_sync_engine() {
    headline(EngineKind::Sync, false);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn preempt_and_abort_fences_the_holder_io_uring() {
    headline(EngineKind::IoUring, true);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn preempt_and_abort_fences_the_holder_sync_engine() {
    headline(EngineKind::Sync, true);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn unregistered_host_cannot_write_under_registrants_only() {
    let hosts = setup();
    let (a, b) = (&hosts[0], &hosts[1]);
    a.ns.register(&Register::register(a.key()))
        .expect("A register");
    a.ns.acquire(&Acquire::acquire(a.key(), WERO))
        .expect("A acquire");
    let mut wb = writer(b, EngineKind::Auto);
    let align = wb.alignment();
    let buf = pattern(align, align.max(4096), 0x0b);
    let err = wb.write_at(&buf, 0).expect_err("B is not registered");
    assert!(err.is_reservation_conflict(), "{err:?}");
    // Registering is all B needs (registrants-only type).
    b.ns.register(&Register::register(b.key()))
        .expect("B register");
    let mut wb = writer(b, EngineKind::Auto);
    wb.write_at(&buf, 0).expect("B registered: write allowed");
}
