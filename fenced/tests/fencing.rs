//! The protocol against a real etcd (started per test on free loopback ports) with
//! in-process agents and controllers sharing one namespace.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use fenced::agent::AgentExit;
use fenced::core::{Confirmation, Victim};
use fenced::fencer::{BoxFuture, FenceError, Fencer};
use fenced::guard::GenerationGuard;
use nvme_resv::Reservations;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_death_is_fenced_once_and_arenas_return() {
    let c = Cluster::new();
    let store = c.store_with_arenas(&["a1", "a2", "a3"]).await;
    let d1 = c.daemon("n1", 1).await;
    let d2 = c.daemon("n2", 1).await;
    let d3 = c.daemon("n3", 1).await;
    assert_eq!(d3.agent.arenas.len(), 1);
    let victim_arena = d3.agent.arenas[0].clone();
    assert!(registered(&c.host("n1"), "n3"));
    assert!(device::can_write(&c.host("n3")));

    d3.kill();
    wait_until("n3 fenced", WAIT, || async {
        generation(&store, "n3").await == 1
    })
    .await;

    let st = store.status().await.unwrap();
    assert!(st.owed.is_empty(), "intent cleared: {:?}", st.owed);
    assert!(st.claims.is_empty(), "claim released: {:?}", st.claims);
    assert!(st.done.contains(&("n3".into(), 1)));
    assert!(
        st.free_arenas.contains(&victim_arena),
        "arena back in the pool"
    );
    assert!(!registered(&c.host("n1"), "n3"), "victim key preempted");
    assert!(
        !device::can_write(&c.host("n3")),
        "the device refuses the victim's writes"
    );
    let audits = fences_of(&store, "n3").await;
    assert_eq!(audits.len(), 1, "{audits:?}");
    assert_eq!(audits[0]["fencer_result"], "confirmed");
    assert_eq!(audits[0]["instance"], "i-n3");
    assert_eq!(
        audits[0]["arenas_released"],
        serde_json::json!([victim_arena])
    );

    // Survivors stay members and keep writing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(generation(&store, "n3").await, 1, "fenced exactly once");
    assert_eq!(generation(&store, "n1").await, 0);
    assert!(device::can_write(&c.host("n1")) && device::can_write(&c.host("n2")));
    assert!(!d1.agent.task.is_finished() && !d2.agent.task.is_finished());
    let fenced: u64 = [&d1, &d2]
        .iter()
        .map(|d| d.controller.stats().fenced.load(Ordering::Relaxed))
        .sum();
    assert_eq!(fenced, 1);
    // The critical path: claim transaction + finishing transaction.
    let rts: Vec<u64> = [&d1, &d2]
        .iter()
        .filter(|d| d.controller.stats().fenced.load(Ordering::Relaxed) == 1)
        .map(|d| {
            d.controller
                .stats()
                .last_fence_round_trips
                .load(Ordering::Relaxed)
        })
        .collect();
    assert_eq!(rts.len(), 1);
    assert!(
        rts[0] <= 3,
        "critical path took {} etcd round trips",
        rts[0]
    );
    eprintln!("critical path etcd round trips: {}", rts[0]);
    d1.kill();
    d2.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intentional_departure_is_not_fenced() {
    let c = Cluster::new();
    let store = c.store_with_arenas(&["a1", "a2"]).await;
    let d1 = c.daemon("n1", 1).await;
    let d2 = c.daemon("n2", 1).await;
    let arena = d2.agent.arenas[0].clone();
    d2.ctl_task.abort();
    let gate = d2.agent.gate.clone();
    assert_eq!(d2.agent.leave().await, AgentExit::Left);
    assert!(!gate.is_open(), "quiesced");
    let st = store.status().await.unwrap();
    assert!(st.departed.contains(&"n2".to_owned()));
    assert!(st.free_arenas.contains(&arena));
    assert!(!st.members.iter().any(|(n, _)| n == "n2"));
    // Several sweeps later: still not fenced.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(generation(&store, "n2").await, 0);
    assert!(fences_of(&store, "n2").await.is_empty());
    assert!(store.status().await.unwrap().owed.is_empty());
    assert!(d1.controller.stats().sweeps.load(Ordering::Relaxed) >= 2);
    d1.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_node_cannot_forge_its_departure() {
    let c = Cluster::new();
    let store = c.store_with_arenas(&["a1", "a2"]).await;
    let d1 = c.daemon("n1", 1).await;
    // n2: a partitioned node. Its agent stops renewing (hung), its lease expires.
    let a2 = c.agent("n2", 1).await;
    let (rev2, arena2) = (a2.membership_rev, a2.arenas[0].clone());
    a2.kill();
    wait_until("n2 fenced", WAIT, || async {
        generation(&store, "n2").await == 1
    })
    .await;
    // It comes back and tries to declare its departure intentional: refused.
    let n2 = node("n2");
    assert!(!store.depart(&n2, "i-n2", rev2, None).await.unwrap());
    assert!(
        !store
            .status()
            .await
            .unwrap()
            .departed
            .contains(&"n2".to_owned())
    );
    assert!(store.status().await.unwrap().free_arenas.contains(&arena2));

    // n3 forges a marker by a plain write while it still owns an arena, then dies:
    // the arena records are checked, not believed.
    let a3 = c.agent("n3", 1).await;
    let mut client = store.client();
    client
        .put(store.keys().departed(&node("n3")), "i-n3", None)
        .await
        .unwrap();
    a3.kill();
    wait_until("n3 fenced despite the marker", WAIT, || async {
        generation(&store, "n3").await == 1
    })
    .await;
    let audits = fences_of(&store, "n3").await;
    assert_eq!(audits.len(), 1);
    let signals = audits[0]["signals"].to_string();
    assert!(signals.contains("departure marker ignored"), "{signals}");
    d1.kill();
}

/// A fencer that severs and then hangs for ever: its controller "dies" between
/// preempt and bump when the test aborts it.
#[derive(Debug)]
struct HangAfterSever(Arc<dyn Fencer>, Arc<tokio::sync::Notify>);

impl Fencer for HangAfterSever {
    fn name(&self) -> &'static str {
        "nvme"
    }
    fn fence<'a>(&'a self, v: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async move {
            let _ = self.0.fence(v).await;
            self.1.notify_one();
            std::future::pending().await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_killed_between_preempt_and_bump_is_finished_once_by_the_sweep() {
    let c = Cluster::new();
    let store = c.store().await;
    let a1 = c.agent("n1", 0).await;
    let a2 = c.agent("n2", 0).await;
    let severed = Arc::new(tokio::sync::Notify::new());
    let hang: Arc<dyn Fencer> = Arc::new(HangAfterSever(c.nvme_fencer("n1"), severed.clone()));
    let (_ca, ta) = c.controller(hang, c.controller_cfg("ca")).await;
    a2.kill();
    tokio::time::timeout(WAIT, severed.notified())
        .await
        .expect("preempt happened");
    assert!(!registered(&c.host("n1"), "n2"), "preempted");
    ta.abort(); // the controller dies holding the claim, before the bump
    let st = store.status().await.unwrap();
    assert_eq!(st.owed.len(), 1, "intent left behind");
    assert_eq!(st.claims.len(), 1, "claim left behind");
    assert_eq!(generation(&store, "n2").await, 0, "not bumped");

    let (cb, tb) = c
        .controller(c.nvme_fencer("n1"), c.controller_cfg("cb"))
        .await;
    wait_until("sweep finishes the fence", WAIT, || async {
        generation(&store, "n2").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(generation(&store, "n2").await, 1, "exactly once");
    let audits = fences_of(&store, "n2").await;
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0]["trigger"], "sweep");
    assert_eq!(audits[0]["fenced_by"], "cb");
    assert_eq!(cb.stats().fenced.load(Ordering::Relaxed), 1);
    assert!(store.status().await.unwrap().owed.is_empty());
    tb.abort();
    a1.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_racing_fence_exactly_once() {
    let c = Cluster::new();
    let store = c.store().await;
    let agents = [
        c.agent("n1", 0).await,
        c.agent("n2", 0).await,
        c.agent("n3", 0).await,
    ];
    let victim = c.agent("n9", 0).await;
    let mut ctls = Vec::new();
    for n in ["n1", "n2", "n3"] {
        let mut cfg = c.controller_cfg(n);
        cfg.sweep_interval = Duration::from_millis(200);
        ctls.push(c.controller(c.nvme_fencer(n), cfg).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // watches established
    // Death: the lease goes away; every controller sees the same DELETE.
    victim.kill();
    store.revoke(victim.lease).await.unwrap();
    wait_until("n9 fenced", WAIT, || async {
        generation(&store, "n9").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // many more sweeps
    assert_eq!(generation(&store, "n9").await, 1);
    assert_eq!(fences_of(&store, "n9").await.len(), 1);
    let fenced: u64 = ctls
        .iter()
        .map(|(c, _)| c.stats().fenced.load(Ordering::Relaxed))
        .sum();
    assert_eq!(fenced, 1);
    let skipped: u64 = ctls
        .iter()
        .map(|(c, _)| c.stats().skipped.load(Ordering::Relaxed))
        .sum();
    eprintln!("racing controllers: 1 fence, {skipped} skipped attempts");
    for (_, t) in &ctls {
        t.abort();
    }
    for a in &agents {
        a.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_compaction_restarts_from_now_and_the_sweep_fences() {
    let c = Cluster::new();
    let store = c.store().await;
    let a1 = c.agent("n1", 0).await;
    let victim = c.agent("n5", 0).await;
    let start = store.sweep_snapshot().await.unwrap().1;
    victim.kill();
    store.revoke(victim.lease).await.unwrap();
    // Later history, then compaction past the revision the controller resumes from.
    let mut client = store.client();
    for i in 0..5 {
        client.put("/other/k", i.to_string(), None).await.unwrap();
    }
    let now = client
        .get("/other/k", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    client.compact(now, None).await.unwrap();
    // A controller resuming from before the DELETE, with no periodic sweep soon:
    // only the compaction notice can trigger the sweep that fences n5.
    let mut cfg = c.controller_cfg("c1");
    cfg.watch_from = Some(start + 1);
    cfg.sweep_on_start = false;
    cfg.sweep_interval = Duration::from_secs(3600);
    let (ctl, t) = c.controller(c.nvme_fencer("n1"), cfg).await;
    wait_until("n5 fenced by the sweep", WAIT, || async {
        generation(&store, "n5").await == 1
    })
    .await;
    assert!(ctl.stats().watch_compacted.load(Ordering::Relaxed) >= 1);
    let audits = fences_of(&store, "n5").await;
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0]["trigger"], "sweep");
    t.abort();
    a1.kill();
}

/// A fencer whose device never confirms.
#[derive(Debug)]
struct NeverConfirms;

impl Fencer for NeverConfirms {
    fn name(&self) -> &'static str {
        "nvme"
    }
    fn fence<'a>(&'a self, _: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async {
            Err(FenceError::new(
                fenced::core::FenceStep::Verify,
                "key still registered",
            ))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconfirmed_fence_stays_owed_and_reregistration_drops_the_intent() {
    let c = Cluster::new();
    let store = c.store().await;
    let a1 = c.agent("n1", 0).await;
    let a4 = c.agent("n4", 0).await;
    let (ctl, t) = c
        .controller(Arc::new(NeverConfirms), c.controller_cfg("c1"))
        .await;
    a4.kill();
    wait_until("failed attempts recorded", WAIT, || async {
        ctl.stats().failed.load(Ordering::Relaxed) >= 2
    })
    .await;
    assert_eq!(
        generation(&store, "n4").await,
        0,
        "an unconfirmed fence never bumps"
    );
    let st = store.status().await.unwrap();
    assert_eq!(
        st.owed,
        vec![("n4".to_owned(), "i-n4".to_owned())],
        "still owed"
    );
    // n4's lease expires... and the node recovers and re-registers.
    let a4b = c.agent("n4", 0).await;
    assert!(
        store.status().await.unwrap().owed.is_empty(),
        "join dropped the intent"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(generation(&store, "n4").await, 0);
    assert!(store.status().await.unwrap().owed.is_empty());

    // A stale intent and mark next to a live membership: the sweep drops them.
    let mut client = store.client();
    client
        .put(store.keys().pending(&node("n4")), "i-n4", None)
        .await
        .unwrap();
    client
        .put(store.keys().done(&node("n4")), "0", None)
        .await
        .unwrap();
    wait_until("sweep drops the stale intent", WAIT, || async {
        let st = store.status().await.unwrap();
        st.owed.is_empty() && st.done.is_empty()
    })
    .await;
    assert_eq!(generation(&store, "n4").await, 0);
    t.abort();
    a1.kill();
    a4b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_leaves_twice_is_fenced_twice() {
    let c = Cluster::new();
    let store = c.store().await;
    let a1 = c.agent("n1", 0).await;
    let (_ctl, t) = c
        .controller(c.nvme_fencer("n1"), c.controller_cfg("c1"))
        .await;
    for round in 1..=2u64 {
        let a = c.agent("n6", 0).await;
        assert_eq!(
            a.guard.generation(),
            round - 1,
            "joins at the current generation"
        );
        a.kill();
        wait_until("n6 fenced", WAIT, || async {
            generation(&store, "n6").await == round
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(generation(&store, "n6").await, 2);
    assert_eq!(fences_of(&store, "n6").await.len(), 2);
    t.abort();
    a1.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_agent_self_fences_and_its_metadata_writes_are_refused() {
    let c = Cluster::new();
    let store = c.store().await;
    let d1 = c.daemon("n1", 0).await;
    let mut d2 = c.daemon("n2", 0).await;
    let guard: GenerationGuard = d2.agent.guard.clone();
    let (lease2, gate2) = (d2.agent.lease, d2.agent.gate.clone());
    // n2's lease is lost while its process keeps running (a partition that heals).
    store.revoke(lease2).await.unwrap();
    wait_until("n2 fenced", WAIT, || async {
        generation(&store, "n2").await == 1
    })
    .await;
    let task = &d2.agent.task;
    wait_until("n2's agent stops", WAIT, || async { task.is_finished() }).await;
    // Its own controller never tried to fence its own node: the peer did.
    assert_eq!(d2.controller.stats().failed.load(Ordering::Relaxed), 0);
    assert_eq!(d2.controller.stats().fenced.load(Ordering::Relaxed), 0);
    d2.ctl_task.abort();
    let exit = (&mut d2.agent.task).await.unwrap();
    assert!(matches!(exit, AgentExit::SelfFenced { .. }), "{exit:?}");
    assert!(gate2.is_fenced());
    assert!(!device::can_write(&c.host("n2")));
    assert!(!registered(&c.host("n1"), "n2"), "never re-registered");
    // Its late metadata transaction is refused by the generation guard.
    let mut client = store.client();
    let resp = client
        .txn(guard.txn(vec![etcd_client::TxnOp::put("/meta/x", "late", None)]))
        .await
        .unwrap();
    assert!(GenerationGuard::refused(&resp));
    assert!(client.get("/meta/x", None).await.unwrap().kvs().is_empty());
    // A live node's guarded write goes through.
    let resp = client
        .txn(
            d1.agent
                .guard
                .txn(vec![etcd_client::TxnOp::put("/meta/y", "ok", None)]),
        )
        .await
        .unwrap();
    assert!(!GenerationGuard::refused(&resp));
    d1.kill();
}

/// Why the daemon holds Write Exclusive - All Registrants: with Registrants Only, a
/// preempt issued by the holder itself leaves the victim registered (Linux nvmet, and
/// nvme-resv's model of it); with All Registrants the victim's key is removed.
#[test]
fn holder_can_fence_only_under_an_all_registrants_reservation() {
    use nvme_resv::{
        Acquire, AcquireAction, Cptpl, Key, Register, RegisterAction, ReservationType,
    };
    for (rtype, removed) in [
        (ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY, false),
        (fenced::fencer::RESERVATION_TYPE, true),
    ] {
        let ns = nvme_resv::model::Namespace::new();
        let (a, b) = (ns.host(host_id("a")), ns.host(host_id("b")));
        for (h, k) in [(&a, Key(0xa)), (&b, Key(0xb))] {
            h.register(&Register {
                rrega: RegisterAction::Register,
                crkey: Key(0),
                nrkey: k,
                iekey: false,
                cptpl: Cptpl::NoChange,
            })
            .unwrap();
        }
        a.acquire(&Acquire {
            racqa: AcquireAction::Acquire,
            rtype,
            crkey: Key(0xa),
            prkey: Key(0),
            iekey: false,
        })
        .unwrap();
        a.acquire(&Acquire {
            racqa: AcquireAction::PreemptAndAbort,
            rtype,
            crkey: Key(0xa),
            prkey: Key(0xb),
            iekey: false,
        })
        .unwrap();
        let r = a.report().unwrap();
        assert_eq!(
            !r.registrants.iter().any(|x| x.rkey == Key(0xb)),
            removed,
            "{rtype:?}: {r:?}"
        );
        assert_eq!(b.check(nvme_resv::Access::Write).is_err(), removed);
    }
}

/// A DELETE event that reaches a controller after another controller already finished
/// the fence (and released its claim) must not win a fresh claim and bump again:
/// invariant 2, each departure bumps exactly once. Found by benches/fence_path with
/// three racing controllers (8 of 300 fences bumped twice); replayed deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_delete_event_after_the_fence_does_not_bump_again() {
    use etcd_client::EventType;
    let c = Cluster::new();
    let store = c.store().await;
    let survivor = c.agent("n1", 0).await;
    let victim = c.agent("n9", 0).await;
    let mut watch = store.watch_membership(0).await.unwrap();
    victim.kill();
    store.revoke(victim.lease).await.unwrap();
    let deleted_rev = loop {
        let msg = watch.message().await.unwrap().expect("watch ended");
        let delete = msg.events().iter().find(|e| {
            e.event_type() == EventType::Delete
                && e.kv().is_some_and(|kv| kv.key().ends_with(b"/n9"))
        });
        if let Some(e) = delete {
            break e.kv().unwrap().mod_revision();
        }
    };
    let victim_of = || Victim {
        node: node("n9"),
        instance: "i-n9".into(),
    };

    // Controllers not spawned (no watch, no sweep of their own): the test plays the
    // event deliveries itself.
    let first = fenced::controller::Controller::new(
        c.store().await,
        c.nvme_fencer("n1"),
        c.controller_cfg("c1"),
    );
    let state = first
        .fence(
            victim_of(),
            fenced::core::Trigger::Watch,
            fenced::store::ClaimGuard::Watch { deleted_rev },
        )
        .await;
    assert!(
        matches!(state, fenced::core::FenceState::Fenced { generation: 1 }),
        "{state:?}"
    );

    // The same DELETE, delivered late to another controller: nothing is owed.
    let late = fenced::controller::Controller::new(
        c.store().await,
        c.nvme_fencer("n1"),
        c.controller_cfg("c2"),
    );
    let state = late
        .fence(
            victim_of(),
            fenced::core::Trigger::Watch,
            fenced::store::ClaimGuard::Watch { deleted_rev },
        )
        .await;
    assert!(
        matches!(state, fenced::core::FenceState::Skipped { .. }),
        "late DELETE was acted on: {state:?}"
    );
    assert_eq!(generation(&store, "n9").await, 1);
    assert_eq!(fences_of(&store, "n9").await.len(), 1);
    survivor.kill();
}

/// An expired node can neither give back nor adopt arenas: both are conditioned on its
/// live membership. Otherwise a node leaving as its lease expires could return an
/// arena that a fence in flight (which read it as the node's) frees again after the
/// bump, under its next owner's writes; and a restarted node whose new lease expired
/// could adopt an arena the pending fence is about to free. Both were found by the
/// protocol model (`tests/protocol_model.rs`, invariant 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_node_can_neither_return_nor_adopt_arenas() {
    let c = Cluster::new();
    let store = c.store_with_arenas(&["a1"]).await;
    let n1 = c.agent("n1", 1).await;
    assert_eq!(n1.arenas, vec!["a1".to_owned()]);
    // While a member, adoption reads the records.
    assert_eq!(
        store
            .adopt_arenas(&n1.node, n1.membership_rev)
            .await
            .unwrap(),
        Some(vec!["a1".to_owned()])
    );

    n1.kill();
    store.revoke(n1.lease).await.unwrap();

    assert!(
        !store
            .release_arena(&n1.node, n1.membership_rev, "a1")
            .await
            .unwrap(),
        "an expired node returned its arena itself"
    );
    assert_eq!(store.owned_arenas(&n1.node).await.unwrap(), vec!["a1"]);
    assert!(store.free_arenas().await.unwrap().is_empty());
    assert_eq!(
        store
            .adopt_arenas(&n1.node, n1.membership_rev)
            .await
            .unwrap(),
        None,
        "an expired node adopted arenas"
    );
}

/// Issue 26, hole 3: a claim lease that was not won is kept as the spare with its real
/// age. Before, each refused claim restamped it as fresh, so after many refusals a won
/// claim could carry a lease with seconds left while `check_claim_age` (which counts
/// from the claim) still allowed the sever. Real etcd, claim TTL 4 s: claims refused
/// for 3 s (the victim still a member), then won; the claim's lease must still have
/// at least half its TTL (what `check_claim_age` lets the sever use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_won_after_many_refusals_has_its_ttl_left() {
    let c = Cluster::new();
    let ttl = Duration::from_secs(4);
    let store = fenced::store::EtcdStore::connect(&[c.etcd.endpoint()], &c.root, ttl)
        .await
        .unwrap();
    let n = node("n9");
    let victim = Victim {
        node: n.clone(),
        instance: "i-n9".into(),
    };
    let member = store.keys().membership(&n);
    store
        .client()
        .put(member.clone(), "i-n9", None)
        .await
        .unwrap();
    let guard = fenced::store::ClaimGuard::Watch { deleted_rev: 1 };
    let t0 = std::time::Instant::now();
    let mut refused = 0;
    while t0.elapsed() < Duration::from_secs(3) {
        let r = store.claim(&victim, "c1", guard).await.unwrap();
        assert!(
            !matches!(r, fenced::core::ClaimOutcome::Won { .. }),
            "claimed a member"
        );
        refused += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    store.client().delete(member, None).await.unwrap();
    let r = store.claim(&victim, "c1", guard).await.unwrap();
    assert!(matches!(r, fenced::core::ClaimOutcome::Won { .. }), "{r:?}");
    let got = store
        .client()
        .get(store.keys().claim(&n), None)
        .await
        .unwrap();
    let lease = got.kvs().first().expect("no claim").lease();
    let left = store.lease_ttl(lease).await.unwrap();
    eprintln!(
        "claim won after {refused} refused claims over 3 s: its lease has {left} s of {ttl:?} left"
    );
    assert!(
        left >= i64::try_from((ttl / 2).as_secs()).unwrap(),
        "the won claim's lease has {left} s left of {ttl:?}: the sever that check_claim_age allows (up to TTL/2 after the claim) could outlive it"
    );
}
