//! Capability detection and typed errors on the real device: the regular report
//! structure is refused with Host Identifier Inconsistent Format (128-bit host IDs in
//! use) and the default report falls back to what works; a namespace without
//! reservations says so up front; a passthrough write from a preempted host returns the
//! reservation-conflict NVMe status (positive ioctl return, not an errno).

use std::os::fd::AsFd;

use hwtests::{Outcome, noresv_path, open_direct, report, setup, sys};
use nvme_resv::status::Completion;
use nvme_resv::{
    Access, Acquire, Key, Namespace, NvmeStatus, Register, ReportFormat, ReservationType,
    Reservations,
};

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn reservation_namespace_reports_its_capabilities() {
    let hosts = setup();
    let caps = hosts[0].ns.capabilities().expect("capabilities");
    println!("{}: {caps:?}", hosts[0].path.display());
    assert!(
        caps.reservations,
        "ONCS/RESCAP say no reservations: {caps:?}"
    );
    for rtype in ReservationType::ALL {
        assert!(
            caps.supports(rtype),
            "type {rtype:?} not in RESCAP: {caps:?}"
        );
    }
    assert!(caps.iekey, "IEKEY not reported: {caps:?}");
    assert!(caps.lba_size == 512 || caps.lba_size == 4096, "{caps:?}");
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn regular_report_is_host_id_inconsistent_then_extended_works() {
    let hosts = setup();
    let (a, b) = (&hosts[0], &hosts[1]);
    a.ns.register(&Register::register(a.key()))
        .expect("A register");
    b.ns.register(&Register::register(b.key()))
        .expect("B register");

    let err =
        a.ns.report_with(ReportFormat::Regular)
            .expect_err("128-bit host IDs are in use: the regular structure must be refused");
    let status = err
        .status()
        .unwrap_or_else(|| panic!("not a device status: {err:?}"));
    assert_eq!(
        (status.sct(), status.sc()),
        (
            NvmeStatus::HOST_ID_INCONSISTENT_FORMAT.sct(),
            NvmeStatus::HOST_ID_INCONSISTENT_FORMAT.sc()
        ),
        "{err}"
    );
    assert!(!err.is_reservation_conflict());
    println!("regular report refused as expected: {err}");

    // The default report (extended first) works and is extended.
    let st = report(a);
    assert!(st.extended, "{st:?}");
    assert!(
        st.is_registered(a.key()) && st.is_registered(b.key()),
        "{st:?}"
    );
    let explicit =
        a.ns.report_with(ReportFormat::Extended)
            .expect("extended report");
    assert_eq!(explicit, st);
    hwtests::clear_all(&hosts);
}

#[test]
#[ignore = "needs a namespace without reservation support: set HWTEST_NVME_NORESV (hwtests/guest/run does)"]
fn namespace_without_resv_enable_is_reported_as_unsupported() {
    let path = noresv_path()
        .expect("HWTEST_NVME_NORESV is not set: name a namespace without reservation support");
    let ns = Namespace::open(&path).expect("open");
    let caps = ns.capabilities().expect("capabilities");
    println!("{}: {caps:?}", path.display());
    assert!(!caps.reservations, "{caps:?}");
    for rtype in ReservationType::ALL {
        assert!(!caps.supports(rtype), "{caps:?}");
    }
    // A reservation command on it fails with a clear, non-conflict error.
    let err = ns
        .register(&Register::register(Key(0x5eed)))
        .expect_err("reservations are not enabled on this namespace");
    assert!(!err.is_reservation_conflict(), "{err:?}");
    println!("register on the no-reservation namespace: {err}");
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn passthrough_write_from_preempted_host_is_typed_reservation_conflict() {
    let hosts = setup();
    let (a, b) = (&hosts[0], &hosts[1]);
    let rtype = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
    a.ns.register(&Register::register(a.key()))
        .expect("A register");
    a.ns.acquire(&Acquire::acquire(a.key(), rtype))
        .expect("A acquire");
    b.ns.register(&Register::register(b.key()))
        .expect("B register");

    let lba = a.ns.capabilities().expect("capabilities").lba_size as usize;
    let mut raw = vec![0x3cu8; lba * 2];
    let start = raw.as_ptr().align_offset(lba);
    let block = &mut raw[start..start + lba];
    let slba = (hwtests::PROBE_OFFSET / lba as u64) + 1;

    let fa = open_direct(&a.path).expect("open A");
    let fb = open_direct(&b.path).expect("open B");
    let (ret, c) =
        sys::passthru_write_one_block(fa.as_fd(), a.ns.nsid(), slba, block).expect("ioctl");
    assert!(
        matches!(c, Completion::Success { .. }),
        "A holds the reservation: passthrough write succeeds, got {ret:#x} {c:?}"
    );

    b.ns.acquire(&Acquire::preempt(b.key(), a.key(), rtype))
        .expect("B preempts A");

    let (ret, c) = sys::passthru_write_one_block(fa.as_fd(), a.ns.nsid(), slba, block)
        .expect("the kernel returns the NVMe status, not an errno");
    assert!(ret > 0, "expected a positive NVMe status, got {ret}");
    let Completion::Status(status) = c else {
        panic!("expected Completion::Status, got {c:?}");
    };
    println!("preempted host's passthrough write: ioctl returned {ret:#x} = {status}");
    assert!(status.is_reservation_conflict(), "{status}");
    assert_eq!(
        (status.sct(), status.sc()),
        (
            NvmeStatus::RESERVATION_CONFLICT.sct(),
            NvmeStatus::RESERVATION_CONFLICT.sc()
        ),
        "{status}"
    );
    assert!(
        status.dnr(),
        "nvmet sets Do Not Retry on a conflict: {status}"
    );
    // The same refusal through the block layer is EBADE.
    assert_eq!(a.probe(Access::Write), Outcome::Denied);
    // B's passthrough write is accepted.
    let (ret, c) =
        sys::passthru_write_one_block(fb.as_fd(), b.ns.nsid(), slba, block).expect("ioctl");
    assert!(
        matches!(c, Completion::Success { .. }),
        "B survives: {ret:#x} {c:?}"
    );
    assert!(!report(b).is_registered(a.key()));
    hwtests::clear_all(&hosts);
}
