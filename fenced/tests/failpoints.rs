//! Failure atomicity, step by step: an error injected at any fence step leaves the
//! fence owed and unbumped; once the fault clears, the sweep completes it exactly once.
//! Run with `cargo test -p fenced --features failpoints --test failpoints`.
#![cfg(feature = "failpoints")]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_at_any_step_leaves_the_fence_owed_then_the_sweep_finishes_it() {
    let scenario = fail::FailScenario::setup();
    let c = Cluster::new();
    let store = c.store().await;
    let a1 = c.agent("n1", 0).await;
    let (ctl, t) = c
        .controller(c.nvme_fencer("n1"), c.controller_cfg("c1"))
        .await;
    for (i, step) in [
        "fence::claim",
        "fence::sever",
        "fence::verify",
        "fence::bump",
    ]
    .into_iter()
    .enumerate()
    {
        let victim = format!("v{i}");
        fail::cfg(step, "return").unwrap();
        let a = c.agent(&victim, 0).await;
        a.kill();
        store.revoke(a.lease).await.unwrap();
        wait_until("an attempt failed", Duration::from_secs(20), || async {
            ctl.stats().failed.load(Ordering::Relaxed) >= (i as u64 + 1) * 2
        })
        .await;
        assert_eq!(generation(&store, &victim).await, 0, "{step}: never bumped");
        fail::remove(step);
        wait_until("sweep finishes", Duration::from_secs(20), || async {
            generation(&store, &victim).await == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(generation(&store, &victim).await, 1, "{step}: exactly once");
        assert!(store.status().await.unwrap().owed.is_empty());
    }
    t.abort();
    a1.kill();
    scenario.teardown();
}

/// Regression (found by `tests/fault_schedules.rs`): a controller that stalls between
/// its claim and the preempt for longer than the claim's lifetime must not preempt
/// when it wakes up. Its claim has expired, the dead node has started afresh and
/// joined, and the preempt would sever that new, healthy incarnation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_that_stalled_past_its_claim_does_not_sever_a_fresh_start() {
    let scenario = fail::FailScenario::setup();
    let c = Cluster::new();
    let store = c.store().await;
    let a1 = c.agent("n1", 0).await;
    // The first fence to reach `sever` stalls 4.5 s; the claim TTL is 3 s.
    fail::cfg("fence::sever", "1*return(c1=sleep:4500)").unwrap();
    let (_ctl, t) = c
        .controller(c.nvme_fencer("n1"), c.controller_cfg("c1"))
        .await;
    let v = c.agent("v", 1).await;
    v.kill();
    let killed = std::time::Instant::now();
    store.revoke(v.lease).await.unwrap();
    wait_until(
        "the stalled fence holds the claim",
        Duration::from_secs(5),
        || async { !store.status().await.unwrap().claims.is_empty() },
    )
    .await;
    // A fresh start joins as soon as no claim blocks it.
    let fresh = c.agent("v", 1).await;
    assert!(
        killed.elapsed() < Duration::from_millis(4500),
        "the fresh start joined only after the stalled fence woke"
    );
    tokio::time::sleep(Duration::from_millis(4500 + 1500).saturating_sub(killed.elapsed())).await;
    assert!(
        common::device::can_write(&c.host("v")),
        "the stalled fence preempted the fresh start's key"
    );
    assert!(!fresh.task.is_finished(), "the fresh start self-fenced");
    let s = store.status().await.unwrap();
    assert!(s.members.iter().any(|(n, _)| n == "v"));
    assert!(s.owed.is_empty() && s.claims.is_empty(), "{s:?}");
    t.abort();
    fresh.kill();
    a1.kill();
    scenario.teardown();
}

/// A fencer that records, when it is asked to sever, how long the claim on its victim
/// has left by etcd's own count (LeaseTimeToLive of the claim's lease), then confirms.
#[derive(Debug)]
struct ClaimLeft {
    store: fenced::store::EtcdStore,
    seen: std::sync::Mutex<Vec<i64>>,
}

impl fenced::fencer::Fencer for ClaimLeft {
    fn name(&self) -> &'static str {
        "claim-left"
    }
    fn fence<'a>(
        &'a self,
        victim: &'a fenced::core::Victim,
    ) -> fenced::fencer::BoxFuture<'a, Result<fenced::core::Confirmation, fenced::fencer::FenceError>>
    {
        Box::pin(async move {
            let got = self
                .store
                .client()
                .get(self.store.keys().claim(&victim.node), None)
                .await
                .unwrap();
            let lease = got.kvs().first().expect("sever without a claim").lease();
            let left = self.store.lease_ttl(lease).await.unwrap();
            self.seen.lock().unwrap().push(left);
            Ok(fenced::core::Confirmation {
                fencer: "claim-left".into(),
                severed: true,
                evidence: format!("claim lease has {left} s left"),
            })
        })
    }
}

/// Issue 26, hole 3, on real etcd: the sever is bounded by the claim's real time left.
/// Claim TTL 8 s: claims refused for 1.5 s (the victim still a member; the spare lease
/// ages, keeping its real grant time), then a won claim that stalls 2.5 s before the
/// sever (less than the half TTL the old rule allowed from the claim). The lease then
/// has about 4 s left, less than the 4 s a sever may take plus the 1 s margin: the
/// sever must be refused, never run with too little left. The next fence (a fresh
/// lease, no stall) severs with the budget covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sever_never_runs_with_less_claim_left_than_it_may_take() {
    use fenced::core::{ClaimBudget, FenceFailure, FenceState, FenceStep, Trigger, Victim};
    let scenario = fail::FailScenario::setup();
    let c = Cluster::new();
    let ttl = Duration::from_secs(8);
    let store = fenced::store::EtcdStore::connect(&[c.etcd.endpoint()], &c.root, ttl)
        .await
        .unwrap();
    let budget = ClaimBudget::new(ttl);
    let needed = i64::try_from((budget.sever() + budget.margin()).as_secs()).unwrap();
    let fencer = std::sync::Arc::new(ClaimLeft {
        store: store.clone(),
        seen: Default::default(),
    });
    let ctl = fenced::controller::Controller::new(
        store.clone(),
        fencer.clone(),
        c.controller_cfg("c-hole3"),
    );
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
    while t0.elapsed() < Duration::from_millis(1500) {
        let st = ctl.fence(victim.clone(), Trigger::Watch, guard).await;
        assert!(matches!(st, FenceState::Skipped { .. }), "{st:?}");
        refused += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.client().delete(member, None).await.unwrap();
    fail::cfg("fence::sever", "1*return(c-hole3=sleep:2500)").unwrap();
    let st = ctl.fence(victim.clone(), Trigger::Watch, guard).await;
    let seen = fencer.seen.lock().unwrap().clone();
    eprintln!(
        "after {refused} refused claims and a 2.5 s stall: {st:?}; claim left at the sever (s): {seen:?}"
    );
    assert!(
        seen.iter().all(|&left| left >= needed),
        "a sever ran with {seen:?} s left on its claim, less than the {needed} s a sever may take plus the margin (claim TTL {ttl:?})"
    );
    assert!(
        matches!(
            st,
            FenceState::Failed {
                step: FenceStep::Sever,
                error: FenceFailure::ClaimMayHaveExpired { .. }
            }
        ),
        "{st:?}"
    );
    assert_eq!(generation(&store, "n9").await, 0, "bumped without a sever");
    // The fence stays owed; the next attempt takes a fresh lease and severs.
    fail::remove("fence::sever");
    let st = ctl.fence(victim, Trigger::Watch, guard).await;
    assert!(matches!(st, FenceState::Fenced { generation: 1 }), "{st:?}");
    let seen = fencer.seen.lock().unwrap().clone();
    assert!(
        seen.len() == 1 && seen[0] >= needed,
        "claim left at the sever (s): {seen:?}"
    );
    scenario.teardown();
}
