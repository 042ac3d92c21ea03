//! Cross-check with an independent peer, nvme-cli: state created by `nvme-resv` is
//! reported identically by `nvme resv-report --eds -o json`, and state created by
//! nvme-cli is reported identically by `nvme-resv report -o json` (and by the library).
//! The JSON documents are compared as whole values, field by field.

use hwtests::{Host, nvme_cli, nvme_resv_cli, report, run_json, run_ok, setup};
use nvme_resv::{Acquire, Register, ReservationType, Reservations};
use serde_json::Value;

fn cli_report(h: &Host) -> Value {
    run_json(
        nvme_cli()
            .arg("resv-report")
            .arg(&h.path)
            .args(["--eds", "-o", "json"]),
    )
}

fn our_cli_report(h: &Host) -> Value {
    run_json(
        nvme_resv_cli()
            .arg("report")
            .arg(&h.path)
            .args(["-o", "json"]),
    )
}

fn assert_all_agree(hosts: &[Host], what: &str) -> Value {
    let mut reference: Option<Value> = None;
    for h in hosts {
        let nvme_cli = cli_report(h);
        let ours = our_cli_report(h);
        let lib = report(h).to_nvme_cli_json();
        let first = reference.get_or_insert_with(|| nvme_cli.clone());
        assert_eq!(&nvme_cli, first, "{what}: nvme-cli differs between hosts");
        assert_eq!(
            ours, nvme_cli,
            "{what}: `nvme-resv report -o json` through host {} differs from nvme-cli",
            h.name
        );
        assert_eq!(
            lib, nvme_cli,
            "{what}: ReservationStatus::to_nvme_cli_json through host {} differs from nvme-cli",
            h.name
        );
    }
    let reference = reference.expect("at least one host");
    println!("{what}: nvme-cli, nvme-resv CLI and library agree: {reference}");
    reference
}

fn hex(k: nvme_resv::Key) -> String {
    format!("{:#x}", k.0)
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn state_created_by_nvme_resv_is_reported_identically_by_nvme_cli() {
    let hosts = setup();
    let a = &hosts[0];
    // Empty state first.
    let empty = assert_all_agree(&hosts, "no registrants");
    assert_eq!(empty["regctl"], 0);

    a.ns.register(&Register::register(a.key()))
        .expect("A register");
    a.ns.acquire(&Acquire::acquire(
        a.key(),
        ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
    ))
    .expect("A acquire");
    for h in &hosts[1..] {
        h.ns.register(&Register::register(h.key()))
            .expect("register");
    }
    let v = assert_all_agree(&hosts, "A holds WERO, all registered");
    assert_eq!(v["rtype"], 3);
    assert_eq!(v["regctl"], hosts.len());
    let rkeys: Vec<u64> = v["regctlext"]
        .as_array()
        .expect("regctlext array")
        .iter()
        .map(|r| r["rkey"].as_u64().expect("rkey number"))
        .collect();
    for h in &hosts {
        assert!(rkeys.contains(&h.key().0), "{} missing in {v}", h.name);
    }

    // An all-registrants type and a preempt, created by nvme-resv.
    let b = &hosts[1];
    b.ns.acquire(&Acquire::preempt(
        b.key(),
        a.key(),
        ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
    ))
    .expect("B preempts A");
    let v = assert_all_agree(&hosts, "B preempted A, EAAR");
    assert_eq!(v["rtype"], 6);
    assert_eq!(v["regctl"], hosts.len() - 1);
    hwtests::clear_all(&hosts);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn state_created_by_nvme_cli_is_reported_identically_by_nvme_resv() {
    let hosts = setup();
    let (a, b) = (&hosts[0], &hosts[1]);
    for h in [b, a] {
        run_ok(
            nvme_cli()
                .arg("resv-register")
                .arg(&h.path)
                .arg(format!("--nrkey={}", hex(h.key())))
                .arg("--rrega=0"),
        );
    }
    run_ok(
        nvme_cli()
            .arg("resv-acquire")
            .arg(&b.path)
            .arg(format!("--crkey={}", hex(b.key())))
            .args(["--rtype=4", "--racqa=0"]),
    );
    let v = assert_all_agree(&hosts, "nvme-cli: B holds EARO, A registered");
    assert_eq!(v["rtype"], 4);
    let st = report(a);
    assert_eq!(st.holder().map(|r| r.rkey), Some(b.key()));
    assert_eq!(st.holder().map(|r| r.hostid), Some(b.hostid));
    assert!(st.is_registered(a.key()));

    // nvme-cli: A preempts B (racqa=1), then replaces its key with IEKEY.
    run_ok(
        nvme_cli()
            .arg("resv-acquire")
            .arg(&a.path)
            .arg(format!("--crkey={}", hex(a.key())))
            .arg(format!("--prkey={}", hex(b.key())))
            .args(["--rtype=1", "--racqa=1"]),
    );
    run_ok(
        nvme_cli()
            .arg("resv-register")
            .arg(&a.path)
            .arg(format!("--nrkey={}", hex(a.other_key())))
            .args(["--rrega=2", "--iekey"]),
    );
    let v = assert_all_agree(&hosts, "nvme-cli: A preempted B, WE, replaced key");
    assert_eq!(v["rtype"], 1);
    assert_eq!(v["regctl"], 1);
    let st = report(b);
    assert_eq!(st.holder().map(|r| r.rkey), Some(a.other_key()));
    assert!(!st.is_registered(b.key()));
    hwtests::clear_all(&hosts);
}
