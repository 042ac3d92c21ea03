//! The agent's join and a running controller on the in-memory twin (`MemStore`) and
//! the NVMe reservation model (`nvme_resv::model::Namespace`), no etcd: three nodes
//! join through the agent's join (`Agent::check_restart`, `Agent::join_membership`
//! over the `JoinStore` port) and register on the shared namespace with the agent's
//! `register_and_hold`; a controller on n1 runs its watch and sweep loops over the
//! twin's membership log (`Controller::spawn_watch_and_sweep`) and fences with the
//! `NvmeFencer` on the model. What the real etcd adds (leases that run out by
//! themselves, transactions, the watch over gRPC) is `tests/fencing.rs` and
//! `tests/controllers.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fenced::agent::{Agent, AgentConfig, AgentError};
use fenced::controller::{Controller, ControllerConfig};
use fenced::device::{Device, RESERVATION_TYPE, register_and_hold};
use fenced::fencer::{Fencer, NvmeFencer, PreemptMode};
use fenced::node::NodeId;
use fenced::ports::JoinStore;
use fenced::ports::mem::MemStore;
use nvme_resv::model::{Host, Namespace};
use nvme_resv::{Access, Cptpl, HostId, Key, key_for_node};

/// One host of the test: its agent settings, its handle on the namespace, its key and
/// its membership lease.
struct Node {
    cfg: AgentConfig,
    host: Host,
    key: Key,
    lease: i64,
}

fn settings(i: u8) -> AgentConfig {
    let node = NodeId::new(&format!("n{i}")).unwrap();
    let mut cfg = AgentConfig::new(node, format!("i-n{i}"));
    cfg.boot_id = Some(format!("boot-of-n{i}"));
    cfg
}

/// Host `n<i>` starts: the restart rule, a lease, the join, then its key registered
/// and the reservation held on the namespace (what `Agent::start` does, without the
/// keepalive task and arenas).
async fn start(store: &MemStore, ns: &Namespace, i: u8) -> Node {
    let cfg = settings(i);
    let seen = Agent::check_restart(store, &cfg).await.unwrap();
    let lease = store.grant(cfg.ttl).await.unwrap();
    let (joined, _) = Agent::join_membership(store, &cfg, lease, seen, || {})
        .await
        .unwrap();
    assert_eq!(joined.generation, 0);
    let host = ns.host(HostId([i; 16]));
    let key = key_for_node(cfg.node.as_str());
    let device: Device = Arc::new(host.clone());
    assert_eq!(
        register_and_hold(&device, key, false, Cptpl::NoChange).unwrap(),
        RESERVATION_TYPE
    );
    Node {
        cfg,
        host,
        key,
        lease,
    }
}

async fn until(what: &str, done: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_expires_is_fenced_on_the_device_by_the_watching_controller() {
    let store = MemStore::new();
    let ns = Namespace::new();
    let mut nodes = Vec::new();
    for i in 1..=3 {
        nodes.push(start(&store, &ns, i).await);
    }
    let [n1, n2, n3] = &nodes[..] else {
        unreachable!()
    };
    // The controller runs in n1's daemon: n1's key, n1's handle on the namespace.
    let fencer = NvmeFencer::new(Arc::new(n1.host.clone()), n1.key, PreemptMode::default());
    let mut cfg = ControllerConfig::new("c-n1");
    cfg.own_node = Some(n1.cfg.node.clone());
    // No sweep at start: what gets fenced, the membership watch fenced.
    cfg.sweep_on_start = false;
    let controller = Controller::new(store.clone(), Arc::new(fencer) as Arc<dyn Fencer>, cfg);
    let task = controller.spawn_watch_and_sweep();
    until("the membership watch is open", || {
        controller.stats().watch_starts.load(Ordering::SeqCst) >= 1
    })
    .await;
    assert!(n3.host.check(Access::Write).is_ok());

    // n3 stops renewing: its lease runs out on the twin, its membership is deleted.
    assert_eq!(store.lease_of(&n3.cfg.node), Some(n3.lease));
    assert!(store.expire_lease(n3.lease));
    until("n3 fenced", || {
        controller.stats().fenced.load(Ordering::SeqCst) == 1
    })
    .await;

    // On the device: n3's key is gone, the reservation excludes it, the others write.
    let report = ns.snapshot();
    assert!(!report.is_registered(n3.key), "{report:?}");
    assert!(report.is_registered(n1.key) && report.is_registered(n2.key));
    assert_eq!(report.rtype, RESERVATION_TYPE);
    let refused = n3.host.check(Access::Write).unwrap_err();
    assert!(refused.is_reservation_conflict(), "{refused}");
    assert!(n1.host.check(Access::Write).is_ok() && n2.host.check(Access::Write).is_ok());

    // In the store: generation bumped, fence owed no more, the audit record written.
    assert_eq!(store.generation(&n3.cfg.node), 1);
    assert!(!store.owed(&n3.cfg.node) && !store.claimed(&n3.cfg.node));
    let audit = store.state().audit.clone();
    assert_eq!(audit.len(), 1, "{audit:?}");
    let (node, generation, failed, json) = &audit[0];
    assert_eq!((node, *generation, *failed), (&n3.cfg.node, 1, false));
    let record: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(record["fencer"], "nvme", "{record}");
    assert_eq!(record["fenced_by"], "c-n1", "{record}");
    assert_eq!(record["instance"], "i-n3", "{record}");
    assert_eq!(record["fencer_result"], "confirmed", "{record}");
    assert_eq!(
        (
            record["generation_before"].as_u64(),
            record["generation_after"].as_u64()
        ),
        (Some(0), Some(1))
    );
    // The watch did it: no sweep ran, nobody else was touched.
    assert_eq!(controller.stats().sweeps.load(Ordering::SeqCst), 0);
    assert_eq!(store.generation(&n1.cfg.node), 0);
    assert_eq!(store.generation(&n2.cfg.node), 0);

    // n3 starting again on the same boot is refused by the agent's restart rule,
    // before it writes anything.
    let again = Agent::check_restart(&store, &n3.cfg).await.unwrap_err();
    assert!(matches!(again, AgentError::FencedSameBoot(_)), "{again}");
    task.abort();
}

#[tokio::test]
async fn a_revoked_lease_ends_the_membership_and_a_join_is_refused_while_a_fence_is_claimed() {
    let store = MemStore::new();
    let ns = Namespace::new();
    let n1 = start(&store, &ns, 1).await;
    let n2 = start(&store, &ns, 2).await;
    // n2's lease is revoked (the agent's give-up path revokes it): its membership goes.
    store.revoke(n2.lease).await.unwrap();
    assert!(!store.state().members.contains_key(&n2.cfg.node));
    // A join of n2 while a controller holds a claim on it is refused until the join
    // timeout; the agent revokes the lease it took.
    store.hold_claim(&n2.cfg.node, "c-elsewhere");
    let mut cfg = settings(2);
    cfg.join_timeout = Duration::from_millis(300);
    let seen = Agent::check_restart(&store, &cfg).await.unwrap();
    let lease = store.grant(cfg.ttl).await.unwrap();
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let refused = Agent::join_membership(&store, &cfg, lease, seen, || {
        stopped.store(true, Ordering::SeqCst)
    })
    .await
    .unwrap_err();
    assert!(
        matches!(refused, AgentError::JoinRefused { .. }),
        "{refused}"
    );
    assert!(stopped.load(Ordering::SeqCst));
    assert!(!store.state().leases.contains_key(&lease));
    assert!(n1.host.check(Access::Write).is_ok());
}
