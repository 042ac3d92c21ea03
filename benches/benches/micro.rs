//! Criterion micro-benchmarks of the pure code on the fencing path: Reservation Report
//! parsing (1 / 16 / 64 registrants, extended and regular layouts), command encoding,
//! key derivation (reservation key and etcd keys), the in-memory model's operations, and
//! a controller's rank for a death among 1,000 controllers (`duty/`: what every
//! controller computes for every death, against a full sort, the code before
//! 2026-12-01 19:00 UTC, as the named peer).
//!
//! `cargo bench -p benches --bench micro`; `cargo test -p benches --benches` runs each
//! once.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fenced::NodeId;
use fenced::keys::Keys;
use nvme_resv::report::{self, RegisteredController, ReservationStatus};
use nvme_resv::{
    Acquire, HostId, Key, Register, Release, ReservationType, Reservations, key_for_node, model,
};

fn host_id(i: usize) -> HostId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
    id[15] = 0xa5;
    HostId(id)
}

fn status(registrants: usize, extended: bool) -> ReservationStatus {
    ReservationStatus {
        generation: 42,
        rtype: ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
        regctl: registrants as u16,
        ptpls: false,
        registrants: (0..registrants)
            .map(|i| RegisteredController {
                cntlid: 0xffff,
                rcsts: u8::from(i == 0),
                hostid: if extended {
                    host_id(i)
                } else {
                    // The regular layout carries 64-bit host ids, zero-extended.
                    let mut id = host_id(i).0;
                    id[8..].fill(0);
                    HostId(id)
                },
                rkey: key_for_node(&format!("node-{i}")),
            })
            .collect(),
        extended,
    }
}

fn report_parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("report_parse");
    for n in [1usize, 16, 64] {
        for extended in [true, false] {
            let s = status(n, extended);
            let buf = report::encode(&s);
            // The benchmark must parse what it claims to: check the round trip once.
            assert_eq!(report::parse(&buf, extended).expect("parse"), s);
            g.throughput(Throughput::Bytes(buf.len() as u64));
            let name = if extended { "extended" } else { "regular" };
            g.bench_with_input(BenchmarkId::new(name, n), &buf, |b, buf| {
                b.iter(|| report::parse(black_box(buf), extended).expect("parse"))
            });
        }
    }
    g.finish();
}

fn command_encoding(c: &mut Criterion) {
    let mut g = c.benchmark_group("encode");
    let (own, victim) = (key_for_node("n1"), key_for_node("n3"));
    let rtype = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
    g.bench_function("preempt_and_abort", |b| {
        b.iter(|| {
            let cmd = Acquire::preempt_and_abort(black_box(own), black_box(victim), rtype);
            (cmd.cdw10(), cmd.data())
        })
    });
    g.bench_function("register_iekey", |b| {
        b.iter(|| {
            let cmd = Register::register(black_box(own)).with_iekey(true);
            (cmd.cdw10(), cmd.data())
        })
    });
    g.bench_function("release", |b| {
        b.iter(|| {
            let cmd = Release::release(black_box(own), rtype);
            (cmd.cdw10(), cmd.data())
        })
    });
    g.bench_function("report_64", |b| {
        b.iter(|| {
            let len = report::report_len(true, black_box(64));
            (
                nvme_resv::cmd::report_cdw10(len),
                nvme_resv::cmd::report_cdw11(true),
            )
        })
    });
    g.bench_function("report_encode_64", |b| {
        let s = status(64, true);
        b.iter(|| report::encode(black_box(&s)))
    });
    g.finish();
}

fn key_derivation(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys");
    let id = "ip-10-0-12-34.eu-west-1.compute.internal";
    g.bench_function("key_for_node", |b| b.iter(|| key_for_node(black_box(id))));
    let keys = Keys::new("/fenced/prod");
    let node = NodeId::new(id).expect("valid node id");
    g.bench_function("etcd_generation_key", |b| {
        b.iter(|| keys.generation(black_box(&node)))
    });
    let key = keys.membership(&node);
    let prefix = keys.membership_prefix();
    g.bench_function("etcd_node_of", |b| {
        b.iter(|| keys.node_of(black_box(&prefix), black_box(key.as_bytes())))
    });
    g.bench_function("node_id_validate", |b| {
        b.iter(|| NodeId::new(black_box(id)))
    });
    g.finish();
}

/// Three registrants, `a` holding Write Exclusive - Registrants Only.
fn model_with_three() -> (model::Namespace, [model::Host; 3], [Key; 3]) {
    let ns = model::Namespace::new();
    let hosts = [
        ns.host(host_id(0)),
        ns.host(host_id(1)),
        ns.host(host_id(2)),
    ];
    let keys = [key_for_node("a"), key_for_node("b"), key_for_node("c")];
    for (h, k) in hosts.iter().zip(keys) {
        h.register(&Register::register(k)).expect("register");
    }
    hosts[0]
        .acquire(&Acquire::acquire(
            keys[0],
            ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
        ))
        .expect("acquire");
    (ns, hosts, keys)
}

fn model_operations(c: &mut Criterion) {
    let mut g = c.benchmark_group("model");
    let rtype = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
    g.bench_function("report_3", |b| {
        let (_ns, hosts, _) = model_with_three();
        b.iter(|| hosts[1].report().expect("report"))
    });
    g.bench_function("check_write", |b| {
        let (_ns, hosts, _) = model_with_three();
        b.iter(|| hosts[2].check(black_box(nvme_resv::Access::Write)))
    });
    // The fence as the NVMe fencer issues it: preempt-and-abort of the holder by a
    // registrant, then the verifying report; the victim re-registers (outside the
    // timed part would need iter_batched's setup, which rebuilds the whole model).
    g.bench_function("preempt_and_abort_then_report", |b| {
        b.iter_batched(
            model_with_three,
            |(ns, hosts, keys)| {
                hosts[1]
                    .acquire(&Acquire::preempt_and_abort(keys[1], keys[0], rtype))
                    .expect("preempt");
                let r = hosts[1].report().expect("report");
                assert!(!r.is_registered(keys[0]));
                (ns, r)
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("register_unregister", |b| {
        let (_ns, hosts, _) = model_with_three();
        let k = key_for_node("z");
        let extra = hosts[0].namespace().host(host_id(9));
        b.iter(|| {
            extra.register(&Register::register(k)).expect("register");
            extra
                .register(&Register::unregister(k))
                .expect("unregister");
        })
    });
    g.finish();
}

/// A controller's rank for a death, among 1,000 live controllers: the O(n) count in
/// `Roster::fence_rank` against sorting all of them by (key, id), which is what it
/// computed before (each comparison hashing both sides).
fn death_duty(c: &mut Criterion) {
    let mut g = c.benchmark_group("duty");
    let n = 1000;
    let ids: Vec<String> = (0..n).map(|i| format!("node-{i:04}")).collect();
    let roster = fenced::core::Roster::listed(
        ids.iter()
            .map(|id| (id.clone(), Some(NodeId::new(id).unwrap()))),
        None,
    );
    let victim = NodeId::new("node-0007").unwrap();
    let me = "node-0500";
    g.bench_function("fence_rank_1000", |b| {
        b.iter(|| roster.fence_rank(black_box(me), black_box(&victim)))
    });
    g.bench_function("full_sort_rank_1000", |b| {
        b.iter(|| {
            let subject = black_box(&victim).as_str().as_bytes();
            let mut order: Vec<&str> = ids
                .iter()
                .map(String::as_str)
                .filter(|id| *id != victim.as_str())
                .collect();
            order.sort_by_key(|id| (fenced::core::rendezvous(subject, id), *id));
            order.iter().position(|id| *id == black_box(me))
        })
    });
    g.bench_function("fence_order_1000", |b| {
        b.iter(|| roster.fence_order(black_box(me), black_box(&victim)))
    });
    g.finish();
}

criterion_group!(
    benches,
    report_parsing,
    command_encoding,
    key_derivation,
    model_operations,
    death_duty
);
criterion_main!(benches);
