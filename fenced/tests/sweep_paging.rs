//! The sweep's read of the key space past etcd-client's answer limit, on a real etcd:
//! the read comes in pages at one revision, so it works at any cluster size, and the
//! sweep fences from it (the claim's mod-revision guards hold).
//!
//! One test lowers the answer limit far below a small cluster's key space; the other
//! reads 100,000 nodes with the default limits, an 18.7 MB key space that the read of
//! one transaction refused ("decoded message length too large: found 18667556 bytes,
//! the limit is: 4194304 bytes"; that read failed past ~22,000 nodes of this shape).
//! Seeding 100,000 nodes takes 7-10 s, the whole test ~30 s in a debug build
//! (`--nocapture` prints the times).

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions, TxnOp};
use fenced::NodeId;
use fenced::controller::{Controller, ControllerConfig};
use fenced::fencer::NoneFencer;
use fenced::keys::Keys;
use fenced::store::{EtcdStore, StoreOptions, count_round_trips};

fn node(i: usize) -> NodeId {
    NodeId::new(&format!("node-{i:06}")).expect("node id")
}

async fn store(etcd: &test_support::Etcd, root: &str, opts: &StoreOptions) -> EtcdStore {
    EtcdStore::connect_with(&[etcd.endpoint()], root, Duration::from_secs(30), opts)
        .await
        .expect("connect")
}

/// `n` nodes at generation 3 with their instance records, all live members but every
/// `owed_every`-th (owed a fence: known, not a member, never fenced), of which every
/// other has its intent recorded. Transactions of at most 128 puts, 4 in flight.
/// Returns the owed nodes.
async fn seed(client: &Client, k: &Keys, n: usize, owed_every: usize) -> Vec<NodeId> {
    let lease = client
        .clone()
        .lease_grant(3600, None)
        .await
        .expect("lease")
        .id();
    let mut ops = Vec::with_capacity(3 * n);
    let mut owed = Vec::new();
    for i in 0..n {
        let id = node(i);
        let instance = format!("i-{i:017x}");
        ops.push(TxnOp::put(k.generation(&id), "3", None));
        ops.push(TxnOp::put(k.instance(&id), instance.clone(), None));
        if i % owed_every == 0 {
            if owed.len() % 2 == 0 {
                ops.push(TxnOp::put(k.pending(&id), instance, None));
            }
            owed.push(id);
        } else {
            let lease = Some(PutOptions::new().with_lease(lease));
            ops.push(TxnOp::put(k.membership(&id), instance, lease));
        }
    }
    test_support::seed::put_all(client, ops).await;
    owed
}

/// The sweep's read, `fenced status`'s and a whole sweep over the seeded key space:
/// every record is there, read at one revision, and the sweep fences exactly the owed
/// nodes. Returns the round trips of the sweep's read.
async fn read_and_sweep(store: EtcdStore, n: usize, owed: &[NodeId]) -> u64 {
    let t0 = Instant::now();
    let (read, trips) = count_round_trips(store.sweep_snapshot()).await;
    let (snap, rev) = read.expect("the sweep's read");
    println!(
        "sweep read of {n} nodes: {trips} round trips, {:.1?}",
        t0.elapsed()
    );
    assert_eq!(snap.generations.len(), n);
    assert_eq!(snap.instances.len(), n);
    assert_eq!(snap.members.len(), n - owed.len());
    assert_eq!(snap.pending.len(), owed.len().div_ceil(2));
    assert!(
        snap.generations
            .values()
            .all(|&(g, mod_rev)| g == 3 && mod_rev > 0 && mod_rev <= rev),
        "every record read at or before revision {rev}"
    );
    for (i, id) in owed.iter().enumerate() {
        assert!(!snap.members.contains_key(id));
        assert_eq!(snap.pending.contains_key(id), i % 2 == 0);
    }

    let t0 = Instant::now();
    let status = store.status().await.expect("the status read");
    println!("status read of {n} nodes: {:.1?}", t0.elapsed());
    assert!(status.revision >= rev);
    assert_eq!(status.nodes.len(), n);
    assert_eq!(
        status.nodes.values().filter(|r| r.owed.is_some()).count(),
        owed.len()
    );

    let mut cfg = ControllerConfig::new("sweeper");
    cfg.sweep_on_start = false;
    let ctrl = Controller::new(store, Arc::new(NoneFencer), cfg);
    let t0 = Instant::now();
    let report = ctrl.sweep_once().await.expect("sweep");
    println!(
        "sweep of {n} nodes fencing {}: {:.1?}",
        owed.len(),
        t0.elapsed()
    );
    assert_eq!(report.fenced, owed.len(), "{report:?}");
    let (after, _) = ctrl.store().sweep_snapshot().await.expect("read");
    for id in owed {
        assert_eq!(after.generations[id].0, 4, "{id} fenced once");
        assert!(after.done.contains_key(id));
    }
    trips
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_space_larger_than_the_answer_limit_is_read_in_pages() {
    let etcd = test_support::Etcd::start();
    // 3,000 nodes take ~560 KB of answer; the read accepts 64 KiB per answer and
    // sizes pages to 16 KiB.
    let opts = StoreOptions {
        read_page_bytes: 16 << 10,
        read_max_response_bytes: 64 << 10,
        ..StoreOptions::default()
    };
    let store = store(&etcd, "/paging", &opts).await;
    let n = 3_000;
    let owed = seed(&store.client(), store.keys(), n, 100).await;
    // What one transaction would have had to accept.
    let one_shot = store
        .client()
        .kv_client()
        .max_decoding_message_size(64 << 10)
        .get(
            store.keys().root(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await;
    assert!(
        one_shot
            .as_ref()
            .is_err_and(|e| e.to_string().contains("message length too large")),
        "the key space must not fit one answer: {one_shot:?}"
    );
    let trips = read_and_sweep(store, n, &owed).await;
    assert!(
        trips >= 15,
        "~560 KB in pages of ~16 KiB: {trips} round trips"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_nodes_are_swept_with_the_default_limits() {
    let etcd = test_support::Etcd::start();
    let store = store(&etcd, "/paging-100k", &StoreOptions::default()).await;
    let n = 100_000;
    let t0 = Instant::now();
    let owed = seed(&store.client(), store.keys(), n, 10_000).await;
    println!(
        "seeded {n} nodes ({} owed) in {:.1?}",
        owed.len(),
        t0.elapsed()
    );
    let trips = read_and_sweep(store, n, &owed).await;
    assert!(trips > 1, "{trips}");
}
