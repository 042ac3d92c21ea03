//! Register / replace (IEKEY) / unregister / acquire / release / clear / preempt paths
//! and the generation counter against the real target, step by step, with
//! `nvme_resv::model` driven through the same commands: after every step the outcome,
//! the generation increment and the reported state must match the expectation written
//! here and must match between device and model.

use hwtests::{Shape, Twin, setup};
use nvme_resv::{Acquire, HostId, Key, Register, Release, ReservationType, Reservations, Result};

const WE: ReservationType = ReservationType::WRITE_EXCLUSIVE;
const EA: ReservationType = ReservationType::EXCLUSIVE_ACCESS;
const WERO: ReservationType = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
const WEAR: ReservationType = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
const EAAR: ReservationType = ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Ok,
    Conflict,
    InvalidField,
    Other(u16),
}

fn classify(r: &Result<()>) -> Class {
    match r {
        Ok(()) => Class::Ok,
        Err(e) if e.is_reservation_conflict() => Class::Conflict,
        Err(e) => match e.status() {
            Some(s) if s.sct() == 0 && s.sc() == 0x02 => Class::InvalidField,
            Some(s) => Class::Other(s.0),
            None => panic!("not a device status: {e}"),
        },
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Reg(Register),
    Acq(Acquire),
    Rel(Release),
}

fn apply(r: &dyn Reservations, op: &Op) -> Result<()> {
    match op {
        Op::Reg(c) => r.register(c),
        Op::Acq(c) => r.acquire(c),
        Op::Rel(c) => r.release(c),
    }
}

struct Step {
    what: &'static str,
    host: usize,
    op: Op,
    expect: Class,
    /// Generation increment this step must cause.
    gen_delta: u32,
    /// Expected state after the step: rtype and (host, key, holds) of every registrant.
    rtype: ReservationType,
    regs: &'static [(usize, u8, bool)],
}

/// Keys by host and variant: `k(host, 0)` is the host's usual key, `k(host, 1)` its
/// replacement.
fn k(host: usize, variant: u8) -> Key {
    Key(0x1000 * (host as u64 + 1) + u64::from(variant))
}

const A: usize = 0;
const B: usize = 1;
const C: usize = 2;

fn steps() -> Vec<Step> {
    use Class::*;
    let reg = |h, v| Op::Reg(Register::register(k(h, v)));
    let none = ReservationType::NONE;
    vec![
        Step {
            what: "A registers",
            host: A,
            op: reg(A, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false)],
        },
        Step {
            what: "A registers the same key again",
            host: A,
            op: reg(A, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false)],
        },
        Step {
            what: "A registers a different key while registered",
            host: A,
            op: reg(A, 1),
            expect: Conflict,
            gen_delta: 0,
            rtype: none,
            regs: &[(A, 0, false)],
        },
        Step {
            what: "B registers",
            host: B,
            op: reg(B, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false)],
        },
        Step {
            what: "C (unregistered) acquires",
            host: C,
            op: Op::Acq(Acquire::acquire(k(C, 0), WE)),
            expect: Conflict,
            gen_delta: 0,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false)],
        },
        Step {
            what: "A acquires with a wrong CRKEY",
            host: A,
            op: Op::Acq(Acquire::acquire(k(A, 1), WERO)),
            expect: Conflict,
            gen_delta: 0,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false)],
        },
        Step {
            what: "A acquires WERO",
            host: A,
            op: Op::Acq(Acquire::acquire(k(A, 0), WERO)),
            expect: Ok,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "A acquires WERO again",
            host: A,
            op: Op::Acq(Acquire::acquire(k(A, 0), WERO)),
            expect: Ok,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "A acquires another type while holding",
            host: A,
            op: Op::Acq(Acquire::acquire(k(A, 0), WE)),
            expect: Conflict,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "B acquires while A holds",
            host: B,
            op: Op::Acq(Acquire::acquire(k(B, 0), WERO)),
            expect: Conflict,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "A (holder) replaces its key",
            host: A,
            op: Op::Reg(Register::replace(k(A, 0), k(A, 1))),
            expect: Ok,
            gen_delta: 1,
            rtype: WERO,
            regs: &[(A, 1, true), (B, 0, false)],
        },
        Step {
            what: "A replaces with a stale CRKEY",
            host: A,
            op: Op::Reg(Register::replace(k(A, 0), k(A, 2))),
            expect: Conflict,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 1, true), (B, 0, false)],
        },
        Step {
            what: "A replaces with IEKEY (CRKEY ignored)",
            host: A,
            op: Op::Reg(Register::replace(Key(0x77), k(A, 0)).with_iekey(true)),
            expect: Ok,
            gen_delta: 1,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "A releases with the wrong type",
            host: A,
            op: Op::Rel(Release::release(k(A, 0), WE)),
            expect: Conflict,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "B (not holder) releases: no effect",
            host: B,
            op: Op::Rel(Release::release(k(B, 0), WERO)),
            expect: Ok,
            gen_delta: 0,
            rtype: WERO,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "A releases",
            host: A,
            op: Op::Rel(Release::release(k(A, 0), WERO)),
            expect: Ok,
            gen_delta: 0,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false)],
        },
        Step {
            what: "A acquires WE",
            host: A,
            op: Op::Acq(Acquire::acquire(k(A, 0), WE)),
            expect: Ok,
            gen_delta: 0,
            rtype: WE,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "B preempts with PRKEY 0 (not an all-registrants type)",
            host: B,
            op: Op::Acq(Acquire::preempt(k(B, 0), Key(0), EA)),
            expect: InvalidField,
            gen_delta: 0,
            rtype: WE,
            regs: &[(A, 0, true), (B, 0, false)],
        },
        Step {
            what: "B preempts the holder A, taking EA",
            host: B,
            op: Op::Acq(Acquire::preempt(k(B, 0), k(A, 0), EA)),
            expect: Ok,
            gen_delta: 1,
            rtype: EA,
            regs: &[(B, 0, true)],
        },
        Step {
            what: "A (preempted) unregisters",
            host: A,
            op: Op::Reg(Register::unregister(k(A, 0))),
            expect: Conflict,
            gen_delta: 0,
            rtype: EA,
            regs: &[(B, 0, true)],
        },
        Step {
            what: "B unregisters with a wrong CRKEY",
            host: B,
            op: Op::Reg(Register::unregister(k(B, 1))),
            expect: Conflict,
            gen_delta: 0,
            rtype: EA,
            regs: &[(B, 0, true)],
        },
        Step {
            what: "B (holder) unregisters: reservation released",
            host: B,
            op: Op::Reg(Register::unregister(k(B, 0))),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[],
        },
        Step {
            what: "A registers",
            host: A,
            op: reg(A, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false)],
        },
        Step {
            what: "B registers",
            host: B,
            op: reg(B, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false)],
        },
        Step {
            what: "C registers",
            host: C,
            op: reg(C, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false), (C, 0, false)],
        },
        Step {
            what: "B preempts C without a reservation: C unregistered",
            host: B,
            op: Op::Acq(Acquire::preempt(k(B, 0), k(C, 0), WE)),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false)],
        },
        Step {
            what: "C registers again",
            host: C,
            op: reg(C, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[(A, 0, false), (B, 0, false), (C, 0, false)],
        },
        Step {
            what: "A acquires WEAR: every registrant holds",
            host: A,
            op: Op::Acq(Acquire::acquire(k(A, 0), WEAR)),
            expect: Ok,
            gen_delta: 0,
            rtype: WEAR,
            regs: &[(A, 0, true), (B, 0, true), (C, 0, true)],
        },
        Step {
            what: "A unregisters: the all-registrants reservation stays",
            host: A,
            op: Op::Reg(Register::unregister(k(A, 0))),
            expect: Ok,
            gen_delta: 1,
            rtype: WEAR,
            regs: &[(B, 0, true), (C, 0, true)],
        },
        Step {
            what: "B preempts C's key in WEAR: C unregistered, type stays",
            host: B,
            op: Op::Acq(Acquire::preempt(k(B, 0), k(C, 0), WEAR)),
            expect: Ok,
            gen_delta: 1,
            rtype: WEAR,
            regs: &[(B, 0, true)],
        },
        Step {
            what: "A registers",
            host: A,
            op: reg(A, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: WEAR,
            regs: &[(A, 0, true), (B, 0, true)],
        },
        Step {
            what: "C registers",
            host: C,
            op: reg(C, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: WEAR,
            regs: &[(A, 0, true), (B, 0, true), (C, 0, true)],
        },
        Step {
            what: "C preempts with PRKEY 0 in WEAR: all others removed, C holds EAAR",
            host: C,
            op: Op::Acq(Acquire::preempt(k(C, 0), Key(0), EAAR)),
            expect: Ok,
            gen_delta: 1,
            rtype: EAAR,
            regs: &[(C, 0, true)],
        },
        Step {
            what: "A registers",
            host: A,
            op: reg(A, 0),
            expect: Ok,
            gen_delta: 1,
            rtype: EAAR,
            regs: &[(A, 0, true), (C, 0, true)],
        },
        Step {
            what: "A clears with a wrong CRKEY",
            host: A,
            op: Op::Rel(Release::clear(k(A, 1))),
            expect: Conflict,
            gen_delta: 0,
            rtype: EAAR,
            regs: &[(A, 0, true), (C, 0, true)],
        },
        Step {
            what: "A clears",
            host: A,
            op: Op::Rel(Release::clear(k(A, 0))),
            expect: Ok,
            gen_delta: 1,
            rtype: none,
            regs: &[],
        },
        Step {
            what: "B (unregistered) clears",
            host: B,
            op: Op::Rel(Release::clear(k(B, 0))),
            expect: Conflict,
            gen_delta: 0,
            rtype: none,
            regs: &[],
        },
    ]
}

/// Runs every step through `target(host)`, checking outcome, generation increment and
/// state after each; stops at the first disagreement and describes it.
fn run_sequence<'a>(
    label: &str,
    hostids: &[HostId],
    target: &dyn Fn(usize) -> &'a dyn Reservations,
) -> std::result::Result<(), String> {
    let report = |i: usize| {
        target(i)
            .report()
            .map_err(|e| format!("{label}: report: {e}"))
    };
    let mut generation = report(0)?.generation;
    for (n, s) in steps().iter().enumerate() {
        let outcome = apply(target(s.host), &s.op);
        let st = report(0)?;
        let shape = Shape::of(&st);
        let expected = Shape {
            rtype: s.rtype,
            registrants: s
                .regs
                .iter()
                .map(|&(h, v, holds)| (hostids[h], (k(h, v), holds)))
                .collect(),
        };
        let delta = st.generation.wrapping_sub(generation);
        let mut wrong = Vec::new();
        if classify(&outcome) != s.expect {
            wrong.push(format!("outcome {outcome:?}, expected {:?}", s.expect));
        }
        if delta != s.gen_delta {
            wrong.push(format!(
                "generation +{delta} ({generation} -> {}), expected +{}",
                st.generation, s.gen_delta
            ));
        }
        if shape != expected {
            wrong.push(format!("state {shape:?}, expected {expected:?}"));
        }
        if usize::from(st.regctl) != s.regs.len() {
            wrong.push(format!("regctl {}, expected {}", st.regctl, s.regs.len()));
        }
        if !wrong.is_empty() {
            return Err(format!(
                "{label} disagrees at step {n} ({}, host {}):\n  {}",
                s.what,
                char::from(b'A' + s.host as u8),
                wrong.join("\n  ")
            ));
        }
        generation = st.generation;
        println!("{label}: ok step {n}: {} (generation {generation})", s.what);
    }
    Ok(())
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,/dev/nvmeCn1 or run hwtests/guest/run"]
fn register_acquire_release_preempt_paths_and_generation() {
    let hosts = setup();
    assert!(
        hosts.len() >= 3,
        "this sequence needs three hosts (HWTEST_NVME_HOSTS with three devices)"
    );
    let hostids: Vec<HostId> = hosts.iter().map(|h| h.hostid).collect();
    let twin = Twin::new(&hosts);
    let device = run_sequence("device", &hostids, &|i| &hosts[i].ns);
    let model = run_sequence("model", &hostids, &|i| &twin.hosts[i]);
    hwtests::clear_all(&hosts);
    let failures: Vec<String> = [device, model]
        .into_iter()
        .filter_map(|r| r.err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Replace from a host that is not registered. The NVMe specification's Replace is
/// "change the key of a registrant"; Linux 7.3's nvmet registers the host with NRKEY
/// when IEKEY is set, instead of answering Reservation Conflict (observed both through
/// `nvme-resv` and through nvme-cli). The model must do what the device does, with and
/// without IEKEY.
#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn replace_from_an_unregistered_host() {
    let hosts = setup();
    let twin = Twin::new(&hosts);
    let (a, b) = (&hosts[0], &hosts[1]);
    // A registered and holding WERO, on both.
    for r in [&a.ns as &dyn Reservations, &twin.hosts[0]] {
        r.register(&Register::register(a.key()))
            .expect("A register");
        r.acquire(&Acquire::acquire(a.key(), WERO))
            .expect("A acquire");
    }
    let cases = [
        ("without IEKEY", Register::replace(Key(0x1234), b.key())),
        (
            "with IEKEY",
            Register::replace(Key(0), b.key()).with_iekey(true),
        ),
    ];
    let mut observed = Vec::new();
    for (what, cmd) in cases {
        let mut row = Vec::new();
        for (label, r, b_r) in [
            (
                "device",
                &a.ns as &dyn Reservations,
                &b.ns as &dyn Reservations,
            ),
            ("model", &twin.hosts[0], &twin.hosts[1]),
        ] {
            let before = r.report().expect("report").generation;
            let outcome = b_r.register(&cmd);
            let after = r.report().expect("report");
            let seen = (
                classify(&outcome),
                after.is_registered(b.key()),
                after.generation.wrapping_sub(before),
                after.holder().map(|h| h.rkey),
            );
            println!("Replace {what} from unregistered B, {label}: {outcome:?} -> {seen:?}");
            row.push(seen);
        }
        observed.push((what, row));
    }
    // What the device did (pinned, so a kernel change is noticed).
    assert_eq!(
        observed[0].1[0],
        (Class::Conflict, false, 0, Some(a.key())),
        "device, Replace without IEKEY from an unregistered host"
    );
    assert_eq!(
        observed[1].1[0],
        (Class::Ok, true, 1, Some(a.key())),
        "device, Replace with IEKEY from an unregistered host"
    );

    // The same through nvme-cli (an independent encoder): C replaces with IEKEY.
    if let Some(c) = hosts.get(2) {
        hwtests::run_ok(
            hwtests::nvme_cli()
                .arg("resv-register")
                .arg(&c.path)
                .arg(format!("--nrkey={:#x}", c.key().0))
                .args(["--rrega=2", "--iekey"]),
        );
        assert!(
            hwtests::report(a).is_registered(c.key()),
            "nvme-cli's Replace with IEKEY registered C"
        );
    }
    hwtests::clear_all(&hosts);

    for (what, row) in &observed {
        assert_eq!(
            row[1], row[0],
            "nvme_resv::model disagrees with the device on Replace {what} from an \
             unregistered host: (outcome, registered, generation delta, holder key) = \
             model {:?}, device {:?}",
            row[1], row[0]
        );
    }
}
