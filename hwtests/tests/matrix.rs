//! The access matrix of every reservation type — holder, registrant and non-registrant,
//! reads and writes — asserted three ways at once: the NVMe specification's table
//! (written out below), the real target (O_DIRECT I/O, EBADE = denied), and
//! `nvme_resv::model` driven through the same commands. A disagreement of any one of
//! the three fails the test with the whole table.

use hwtests::{Host, Outcome, Shape, Twin, clear_all, report, setup};
use nvme_resv::{Access, Acquire, Register, ReservationType, Reservations};

/// Whether (read, write) is allowed, NVMe Base Specification 2.0c, section 8.19.1,
/// "Command Behavior in the Presence of a Reservation" (figure of the same name).
struct Row {
    rtype: ReservationType,
    holder: (bool, bool),
    registrant: (bool, bool),
    non_registrant: (bool, bool),
}

const TABLE: [Row; 7] = [
    // Registrants but no reservation: no restriction.
    Row {
        rtype: ReservationType::NONE,
        holder: (true, true),
        registrant: (true, true),
        non_registrant: (true, true),
    },
    Row {
        rtype: ReservationType::WRITE_EXCLUSIVE,
        holder: (true, true),
        registrant: (true, false),
        non_registrant: (true, false),
    },
    Row {
        rtype: ReservationType::EXCLUSIVE_ACCESS,
        holder: (true, true),
        registrant: (false, false),
        non_registrant: (false, false),
    },
    Row {
        rtype: ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
        holder: (true, true),
        registrant: (true, true),
        non_registrant: (true, false),
    },
    Row {
        rtype: ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
        holder: (true, true),
        registrant: (true, true),
        non_registrant: (false, false),
    },
    Row {
        rtype: ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        holder: (true, true),
        registrant: (true, true),
        non_registrant: (true, false),
    },
    Row {
        rtype: ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
        holder: (true, true),
        registrant: (true, true),
        non_registrant: (false, false),
    },
];

/// Which host plays which role; with only two hosts the registrant and the
/// non-registrant are the same host in two separate passes.
fn role_passes(n: usize) -> Vec<(usize, Option<usize>, Option<usize>)> {
    if n >= 3 {
        vec![(0, Some(1), Some(2))]
    } else {
        vec![(0, Some(1), None), (0, None, Some(1))]
    }
}

fn model_outcome(h: &nvme_resv::model::Host, access: Access) -> Outcome {
    match h.check(access) {
        Ok(()) => Outcome::Allowed,
        Err(e) if e.is_reservation_conflict() => Outcome::Denied,
        Err(e) => panic!("model check({access:?}) failed with a non-conflict error: {e}"),
    }
}

fn establish(hosts: &[Host], twin: &Twin, holder: usize, registrant: Option<usize>, row: &Row) {
    let h = &hosts[holder];
    let steps: Vec<(usize, Register)> = std::iter::once((holder, Register::register(h.key())))
        .chain(registrant.map(|r| (r, Register::register(hosts[r].key()))))
        .collect();
    for (i, cmd) in steps {
        hosts[i]
            .ns
            .register(&cmd)
            .unwrap_or_else(|e| panic!("{} register: {e}", hosts[i].name));
        twin.hosts[i]
            .register(&cmd)
            .unwrap_or_else(|e| panic!("model {} register: {e}", hosts[i].name));
    }
    if row.rtype != ReservationType::NONE {
        let cmd = Acquire::acquire(h.key(), row.rtype);
        h.ns.acquire(&cmd)
            .unwrap_or_else(|e| panic!("{} acquire {:?}: {e}", h.name, row.rtype));
        twin.hosts[holder]
            .acquire(&cmd)
            .unwrap_or_else(|e| panic!("model acquire {:?}: {e}", row.rtype));
    }
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set HWTEST_NVME_HOSTS=/dev/nvmeAn1,/dev/nvmeBn1,... or run hwtests/guest/run"]
fn access_matrix_of_every_type_agrees_with_spec_and_model() {
    let hosts = setup();
    let mut lines = Vec::new();
    let mut mismatches = 0;
    for row in &TABLE {
        for (holder, registrant, non_registrant) in role_passes(hosts.len()) {
            clear_all(&hosts);
            let twin = Twin::new(&hosts);
            establish(&hosts, &twin, holder, registrant, row);

            // The model and the device agree on the resulting state.
            let real = report(&hosts[0]);
            let model = twin.hosts[0].report().expect("model report");
            assert_eq!(
                Shape::of(&real),
                Shape::of(&model),
                "rtype {:?}: device and model disagree on the state",
                row.rtype
            );

            let roles = [
                ("holder", Some(holder), row.holder),
                ("registrant", registrant, row.registrant),
                ("non-registrant", non_registrant, row.non_registrant),
            ];
            for (role, idx, (read, write)) in roles {
                let Some(i) = idx else { continue };
                for (access, allowed) in [(Access::Read, read), (Access::Write, write)] {
                    let spec = Outcome::from_allowed(allowed);
                    let device = hosts[i].probe(access);
                    let modeled = model_outcome(&twin.hosts[i], access);
                    let ok = spec == device && device == modeled;
                    if !ok {
                        mismatches += 1;
                    }
                    lines.push(format!(
                        "{:<4} rtype {} {:<14} (host {}) {:<5?}: spec {:<7?} device {:<7?} model {:<7?}",
                        if ok { "ok" } else { "FAIL" },
                        row.rtype.0,
                        role,
                        hosts[i].name,
                        access,
                        spec,
                        device,
                        modeled
                    ));
                }
            }
        }
    }
    clear_all(&hosts);
    let table = lines.join("\n");
    println!("{table}");
    assert_eq!(mismatches, 0, "access matrix mismatches:\n{table}");
    // 7 rows x 3 roles x 2 accesses, whatever the number of passes.
    assert_eq!(lines.len(), 7 * 3 * 2);
}
