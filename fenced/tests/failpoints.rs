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
