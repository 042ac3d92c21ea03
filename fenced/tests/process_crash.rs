//! A controller *process* that dies in the middle of a fence, on real components: real
//! `fenced run` daemons (built with feature `failpoints`) on a real etcd. One daemon is
//! stopped at a protocol step by its `FAILPOINTS` environment variable (the `crash`
//! effect parks the fence there for good), then SIGKILLed by PID while parked: no
//! graceful shutdown, no lease revoked, no claim given back. A daemon started
//! afterwards must finish what the dead one left: the victim is fenced exactly once,
//! the dead controller's own node is fenced exactly once, and nothing stays owed or
//! claimed.
//!
//! `fault_schedules.rs` crashes controllers hundreds of times, but in-process (a task
//! aborted while parked, its store still connected); these tests are the same crash as
//! a real process death. Every daemon uses `--fencer none` (the host has no NVMe; the
//! device half of a fence is covered by the fault schedules and the guest demo), so the
//! steps that can be crashed here are `claim` (before the claim transaction) and `bump`
//! (claimed, before the finishing transaction).
//!
//! Run with `cargo test -p fenced --features failpoints --test process_crash`.
#![cfg(feature = "failpoints")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::FencedRun;
use common::{fences_of, generation, wait_members, wait_until};
use fenced::store::EtcdStore;

/// Lease TTL of every daemon (`FencedRun`'s, etcd's effective minimum).
const TTL_SECS: &str = "2";
/// Claim TTL of every daemon: a dead controller's claim expires this long after it
/// was taken.
const CLAIM_TTL: Duration = Duration::from_secs(3);

/// The tests start daemons whose timing is the subject: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `fenced run` for `node` under `root`, with the test's claim TTL and `failpoints`.
fn daemon(
    endpoint: &str,
    root: &str,
    node: &str,
    dir: &Path,
    failpoints: Option<&str>,
) -> FencedRun {
    let claim_ttl = CLAIM_TTL.as_secs().to_string();
    let env: Vec<(&str, &str)> = failpoints.map(|f| ("FAILPOINTS", f)).into_iter().collect();
    FencedRun::start(
        endpoint,
        root,
        node,
        dir,
        &["--claim-ttl-secs", &claim_ttl],
        &env,
    )
}

/// Kills controller `a`'s process while its fence of `v` is parked at `step`, then
/// checks that daemon `b`, started after the death, finishes everything exactly once.
async fn controller_process_killed_at(step: &str) {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start();
    let ep = etcd.endpoint();
    let root = format!("/process-crash-{step}");
    let dir = tempfile::tempdir().unwrap();
    let store = EtcdStore::connect(std::slice::from_ref(&ep), &root, CLAIM_TTL)
        .await
        .unwrap();

    // v is the victim; a is the only controller while v dies, and stops at `step`.
    let mut v = daemon(&ep, &root, "v", dir.path(), None);
    let failpoints = format!("fence::{step}=return(a/*=crash)");
    let mut a = daemon(&ep, &root, "a", dir.path(), Some(&failpoints));
    wait_members(&store, &["v", "a"]).await;

    let t_kill_v = Instant::now();
    v.kill();
    let parked = format!("step={step}");
    wait_until(
        &format!("a's fence of v parked at {step}"),
        Duration::from_secs(20),
        || async {
            a.log()
                .lines()
                .any(|l| l.contains("fail point") && l.contains(&parked) && l.contains("node=v"))
        },
    )
    .await;
    let parked_after = t_kill_v.elapsed();
    let st = store.status().await.unwrap();
    match step {
        // Parked before the claim transaction: nothing of the fence is in etcd.
        "claim" => {
            assert!(st.claims.is_empty(), "nothing claimed yet: {st:?}");
            assert!(st.owed.is_empty(), "no intent recorded yet: {st:?}");
        }
        // Parked after the claim, before the finishing transaction.
        "bump" => {
            assert_eq!(
                st.claims,
                vec![("v".to_string(), "a/i-a".to_string())],
                "a holds the claim on v: {st:?}"
            );
            assert!(st.owed.iter().any(|(n, _)| n == "v"), "{st:?}");
        }
        other => unreachable!("no crash test for step {other}"),
    }
    assert_eq!(generation(&store, "v").await, 0, "nothing bumped yet");
    assert!(a.running(), "a is alive, parked: {}", a.log());

    // The controller process dies mid-step. Only then does another daemon start, so
    // everything it does comes from what etcd holds, not from a live peer.
    let t_kill_a = Instant::now();
    a.kill();
    let mut b = daemon(&ep, &root, "b", dir.path(), None);

    wait_until(
        "b fenced v and a, nothing owed or claimed",
        Duration::from_secs(30),
        || async {
            let Ok(st) = store.status().await else {
                return false;
            };
            let gens: Vec<u64> = ["v", "a"]
                .iter()
                .map(|n| {
                    st.generations
                        .iter()
                        .find(|(m, _)| m == n)
                        .map_or(0, |(_, g)| *g)
                })
                .collect();
            gens == [1, 1] && st.owed.is_empty() && st.claims.is_empty()
        },
    )
    .await;
    let settled_after = t_kill_a.elapsed();

    // Run on for several sweeps: nothing is fenced a second time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(generation(&store, "v").await, 1, "v bumped exactly once");
    assert_eq!(generation(&store, "a").await, 1, "a bumped exactly once");
    assert_eq!(generation(&store, "b").await, 0, "b untouched");
    for n in ["v", "a"] {
        let fences = fences_of(&store, n).await;
        assert_eq!(fences.len(), 1, "one completed fence of {n}: {fences:?}");
        assert_eq!(
            fences[0]["fenced_by"], "b/i-b",
            "the surviving daemon fenced {n}: {fences:?}"
        );
    }
    // The dead controller never completed (nor recorded a failed attempt of) anything.
    let by_a: Vec<_> = store
        .audit_records(&common::node("v"))
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r["fenced_by"] == "a/i-a")
        .collect();
    assert!(by_a.is_empty(), "a died before its step: {by_a:?}");
    let st = store.status().await.unwrap();
    assert!(
        st.owed.is_empty() && st.claims.is_empty(),
        "settled: {st:?}"
    );
    assert!(b.running(), "b runs on: {}", b.log());
    let blog = b.log();
    assert!(!blog.contains("panicked"), "{blog}");
    eprintln!(
        "a parked at {step} {} ms after v's SIGKILL; a SIGKILLed there; b started and \
         finished v's and a's fences {} ms later (TTL {TTL_SECS} s, claim TTL {} s)",
        parked_after.as_millis(),
        settled_after.as_millis(),
        CLAIM_TTL.as_secs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_process_killed_before_its_claim_leaves_the_fence_to_the_sweep() {
    controller_process_killed_at("claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_process_killed_holding_a_claim_leaves_one_bump_to_a_survivor() {
    controller_process_killed_at("bump").await;
}
