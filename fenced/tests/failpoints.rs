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
