//! Sweep scaling: a key space with N known nodes (`gen/<node>` and the `instance/<node>`
//! record of their last join), 99% of them live members and 1% owed a fence (known, not
//! a member, never fenced), on a real local etcd. Measures
//! - the sweep's read (`EtcdStore::sweep_snapshot`): wall time, etcd requests (the
//!   store's round-trip counter: one per page of the read) and bytes of keys and
//!   values read, and of the answers as etcd-client decodes them (protobuf);
//! - a whole `Controller::sweep_once` that also fences the 1% (`none` fencer):
//!   wall time and etcd requests;
//! - steady-state sweeps with nothing owed;
//! - where the read's time goes, interleaved with the reads above: the same ranges
//!   read by one transaction with etcd-client alone (etcd's work + gRPC + protobuf
//!   decode; the store's read before it was paged, with the answer limit raised so it
//!   works at 100 000), and the same decode the store does into a `SweepSnapshot`,
//!   done here on that response with fenced's public key parser (`Keys::node_of`);
//!   the bytes that transaction reads.
//!
//! Quick (default): N = 1 000, 1 repetition. Full (`FENCED_BENCH_FULL=1 cargo bench -p
//! benches --bench sweep_scale`): N = 1 000, 10 000 and 100 000, 7 snapshot reads and
//! 5 sweeps. `FENCED_BENCH_READ_PAGE_BYTES` sets the stores' `read_page_bytes`
//! (default: `StoreOptions`'s, 1 MiB).

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{Etcd, Summary, full_mode, runtime, samples};

use etcd_client::{GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use fenced::NodeId;
use fenced::controller::{Controller, ControllerConfig};
use fenced::core::SweepSnapshot;
use fenced::fencer::NoneFencer;
use fenced::keys::Keys;
use fenced::store::{EtcdStore, StoreOptions, encoded_len};
use test_support::seed::put_all;

fn main() {
    let sizes: &[usize] = if full_mode() {
        &[1_000, 10_000, 100_000]
    } else {
        &[1_000]
    };
    let reads = samples(1, 7);
    let sweeps = samples(1, 5);
    let rt = runtime();
    let etcd = Etcd::start();
    for &n in sizes {
        rt.block_on(run(&etcd, n, reads, sweeps));
    }
}

/// The one-transaction read may be far larger than etcd-client's default 4 MiB answer
/// limit (18.7 MB at 100 000 nodes).
const BARE_ANSWER_LIMIT: usize = 256 << 20;

/// The stores' options: the defaults, with `FENCED_BENCH_READ_PAGE_BYTES` if set.
fn store_options() -> StoreOptions {
    let mut opts = StoreOptions::default();
    if let Ok(v) = std::env::var("FENCED_BENCH_READ_PAGE_BYTES") {
        opts.read_page_bytes = v.parse().expect("FENCED_BENCH_READ_PAGE_BYTES: bytes");
    }
    opts
}

async fn run(etcd: &Etcd, n: usize, reads: usize, sweeps: usize) {
    let root = format!("/bench-sweep-{n}");
    let ep = vec![etcd.endpoint()];
    let opts = store_options();
    let store = EtcdStore::connect_with(&ep, &root, Duration::from_secs(30), &opts)
        .await
        .expect("connect");
    let keys: Keys = store.keys().clone();
    let client = store.client();
    let lease = store.grant(Duration::from_secs(3600)).await.expect("grant");
    let owed_every = 100; // 1%
    let nodes: Vec<NodeId> = (0..n)
        .map(|i| NodeId::new(&format!("node-{i:05}")).expect("node id"))
        .collect();
    let owed: Vec<&NodeId> = nodes.iter().step_by(owed_every).collect();
    let t_pop = Instant::now();
    let mut ops = Vec::with_capacity(3 * n);
    for (i, node) in nodes.iter().enumerate() {
        ops.push(TxnOp::put(keys.generation(node), "3", None));
        ops.push(TxnOp::put(keys.instance(node), format!("i-{i:017x}"), None));
        if i % owed_every != 0 {
            ops.push(TxnOp::put(
                keys.membership(node),
                format!("i-{i:017x}"),
                Some(PutOptions::new().with_lease(lease)),
            ));
        }
    }
    put_all(&client, ops).await;
    println!(
        "sweep_scale[{n}]: populated {n} nodes ({} owed) in {:.1?}",
        owed.len(),
        t_pop.elapsed()
    );

    // The sweep's read alone, interleaved with its breakdown: the bare transaction and
    // the decode of its response.
    let mut read_lat = Vec::new();
    let mut read_rts = Vec::new();
    let mut raw_lat = Vec::new();
    let mut copy_lat = Vec::new();
    let mut decode_lat = Vec::new();
    let mut bytes = 0;
    let mut answer_bytes = 0;
    let mut bare = client
        .kv_client()
        .max_decoding_message_size(BARE_ANSWER_LIMIT);
    for _ in 0..reads {
        let rt0 = store.round_trips();
        let t0 = Instant::now();
        let (snap, _) = store.sweep_snapshot().await.expect("sweep read");
        read_lat.push(t0.elapsed());
        read_rts.push(store.round_trips() - rt0);
        assert_eq!(snap.generations.len(), n);
        assert_eq!(snap.members.len(), n - owed.len());

        let t0 = Instant::now();
        let resp = bare.txn(sweep_txn(&keys)).await.expect("bare sweep txn");
        raw_lat.push(t0.elapsed());
        // `op_responses()` deep-copies every key and value (etcd-client 0.21 has no
        // owning accessor); the store calls it once per snapshot.
        let t0 = Instant::now();
        let ops = resp.op_responses();
        copy_lat.push(t0.elapsed());
        let t0 = Instant::now();
        let decoded = decode_like_the_store(&keys, &ops);
        decode_lat.push(t0.elapsed());
        // Nothing writes between the two reads: a difference is this copy drifting
        // from the store's read.
        assert_eq!(
            decoded, snap,
            "the bare copy no longer reads what the store does"
        );
        bytes = ops
            .iter()
            .flat_map(kvs)
            .map(|kv| kv.key().len() + kv.value().len())
            .sum::<usize>();
        answer_bytes = ops.iter().flat_map(kvs).map(encoded_len).sum::<usize>();
    }

    // Whole sweeps that each fence the owed 1%: reset the owed nodes' fence marks
    // between sweeps so each sweep has the same work.
    let ctrl_store = EtcdStore::connect_with(&ep, &root, Duration::from_secs(30), &opts)
        .await
        .expect("connect");
    let mut cfg = ControllerConfig::new("sweeper");
    cfg.sweep_on_start = false;
    let ctrl = Controller::new(ctrl_store, Arc::new(NoneFencer), cfg);
    ctrl.store()
        .prepare_claim_lease()
        .await
        .expect("claim lease");
    let mut sweep_lat = Vec::new();
    let mut sweep_rts = Vec::new();
    for _ in 0..sweeps {
        let rt0 = ctrl.store().round_trips();
        let t0 = Instant::now();
        let report = ctrl.sweep_once().await.expect("sweep");
        sweep_lat.push(t0.elapsed());
        sweep_rts.push(ctrl.store().round_trips() - rt0);
        assert_eq!(report.fenced, owed.len(), "sweep fenced {report:?}");
        let reset: Vec<TxnOp> = owed
            .iter()
            .map(|node| TxnOp::delete(keys.done(node), None))
            .collect();
        put_all(&client, reset).await;
        ctrl.store()
            .prepare_claim_lease()
            .await
            .expect("claim lease");
    }
    // Steady state: nothing owed (the owed nodes are marked done).
    for node in &owed {
        ctrl.store()
            .client()
            .put(keys.done(node), "4", None)
            .await
            .expect("mark done");
    }
    let mut idle_lat = Vec::new();
    let mut idle_rts = 0;
    for _ in 0..sweeps {
        let rt0 = ctrl.store().round_trips();
        let t0 = Instant::now();
        let report = ctrl.sweep_once().await.expect("sweep");
        idle_lat.push(t0.elapsed());
        idle_rts = idle_rts.max(ctrl.store().round_trips() - rt0);
        assert_eq!(report.fenced, 0);
    }
    let idle = Summary::of(&idle_lat).expect("samples");

    let read = Summary::of(&read_lat).expect("samples");
    let sweep = Summary::of(&sweep_lat).expect("samples");
    let max = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    println!("sweep_scale[{n}]: snapshot read {read}");
    let raw = Summary::of(&raw_lat).expect("samples");
    let copy = Summary::of(&copy_lat).expect("samples");
    let decode = Summary::of(&decode_lat).expect("samples");
    println!("sweep_scale[{n}]:   bare etcd-client txn {raw}");
    println!("sweep_scale[{n}]:   TxnResponse::op_responses() copy {copy}");
    println!("sweep_scale[{n}]:   decode into maps {decode}");
    println!(
        "sweep_scale[{n}]: snapshot read etcd requests {} (max), bytes of keys+values read {bytes}, of answers (protobuf) {answer_bytes}",
        max(&read_rts)
    );
    println!(
        "sweep_scale[{n}]: sweep fencing {} owed {sweep}; etcd requests {} (max)",
        owed.len(),
        max(&sweep_rts)
    );
    println!(
        "sweep_scale[{n}]: steady-state sweep (nothing owed) {idle}; etcd requests {idle_rts} (max)"
    );
    println!(
        "BENCH sweep_scale n={n} page_bytes={} read_p50_ms={:.3} raw_txn_p50_ms={:.3} copy_p50_ms={:.3} decode_p50_ms={:.3} read_requests={} bytes={bytes} answer_bytes={answer_bytes} sweep_p50_ms={:.3} sweep_requests={} idle_p50_ms={:.3} idle_requests={idle_rts}",
        opts.read_page_bytes,
        read.p50.as_secs_f64() * 1e3,
        raw.p50.as_secs_f64() * 1e3,
        copy.p50.as_secs_f64() * 1e3,
        decode.p50.as_secs_f64() * 1e3,
        max(&read_rts),
        sweep.p50.as_secs_f64() * 1e3,
        max(&sweep_rts),
        idle.p50.as_secs_f64() * 1e3
    );
}

/// The sweep's read as `EtcdStore::sweep_snapshot` issues it (`key_space` with
/// `Scope::Sweep` in `fenced/src/store/view.rs`) when the key space fits one page: one
/// transaction of ten prefix ranges and an audit count, with the same options, in the
/// same order (the store's pages add a limit to each range and, after the first, a
/// start key and the first page's revision).
///
/// A copy rather than the store's own, because the breakdown needs what the store
/// keeps private: the transaction before it is sent (to time etcd-client alone) and
/// its response before the decode (to time the copy and the decode apart, and to
/// count the bytes). `run` asserts that this copy decodes to the store's snapshot, so
/// a change to the store's read that this misses fails the bench.
fn sweep_txn(keys: &Keys) -> Txn {
    let all = || Some(GetOptions::new().with_prefix());
    let keys_only = || Some(GetOptions::new().with_prefix().with_keys_only());
    Txn::new().and_then(vec![
        TxnOp::get(keys.generation_prefix(), all()),
        TxnOp::get(keys.pending_prefix(), all()),
        TxnOp::get(keys.done_prefix(), all()),
        TxnOp::get(keys.membership_prefix(), all()),
        TxnOp::get(keys.departed_prefix(), all()),
        TxnOp::get(keys.arena_node_all_prefix(), keys_only()),
        TxnOp::get(keys.claim_prefix(), all()),
        TxnOp::get(keys.instance_prefix(), all()),
        TxnOp::get(keys.arena_claim_prefix(), keys_only()),
        TxnOp::get(keys.arena_pool_prefix(), keys_only()),
        TxnOp::get(
            keys.audit_prefix(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
    ])
}

/// The key-value pairs of one range of the response.
fn kvs(r: &TxnOpResponse) -> &[KeyValue] {
    match r {
        TxnOpResponse::Get(g) => g.kvs(),
        _ => &[],
    }
}

/// The decode `sweep_snapshot` does (node id parsed and validated from each key, values
/// copied into `BTreeMap`s), on a response of [`sweep_txn`].
fn decode_like_the_store(keys: &Keys, ops: &[TxnOpResponse]) -> SweepSnapshot {
    let text = |kv: &KeyValue| String::from_utf8_lossy(kv.value()).into_owned();
    let mut s = SweepSnapshot::default();
    for kv in kvs(&ops[0]) {
        if let Some(n) = keys.node_of(&keys.generation_prefix(), kv.key()) {
            let g: u64 = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .expect("generation value");
            s.generations.insert(n, (g, kv.mod_revision()));
        }
    }
    for kv in kvs(&ops[1]) {
        if let Some(n) = keys.node_of(&keys.pending_prefix(), kv.key()) {
            s.pending.insert(n, (text(kv), kv.mod_revision()));
        }
    }
    for kv in kvs(&ops[2]) {
        if let Some(n) = keys.node_of(&keys.done_prefix(), kv.key()) {
            s.done.insert(n, kv.mod_revision());
        }
    }
    for kv in kvs(&ops[3]) {
        if let Some(n) = keys.node_of(&keys.membership_prefix(), kv.key()) {
            s.members.insert(n, text(kv));
        }
    }
    for kv in kvs(&ops[4]) {
        if let Some(n) = keys.node_of(&keys.departed_prefix(), kv.key()) {
            s.departed.insert(n, (text(kv), kv.mod_revision()));
        }
    }
    for kv in kvs(&ops[5]) {
        if let Some((n, _)) = keys.arena_node_of(kv.key()) {
            *s.arenas.entry(n).or_default() += 1;
        }
    }
    for kv in kvs(&ops[6]) {
        if let Some(n) = keys.node_of(&keys.claim_prefix(), kv.key()) {
            s.claims.insert(n);
        }
    }
    for kv in kvs(&ops[7]) {
        if let Some(n) = keys.node_of(&keys.instance_prefix(), kv.key()) {
            s.instances.insert(n, text(kv));
        }
    }
    s
}
