//! An agent whose own membership key disappears while it runs self-fences (issue 14
//! section 2): against a real etcd, with no reservation device, so nothing on a device
//! would stop it otherwise (`--fencer none`, EBS).

mod common;

use std::time::{Duration, Instant};

use common::*;
use fenced::agent::{Agent, AgentExit};

/// Starts `n` with no reservation device.
async fn agent_without_device(c: &Cluster, n: &str) -> RunningAgent {
    let agent = Agent::start(c.store().await, c.agent_cfg(n, 0), None, key_of(n))
        .await
        .expect("agent start");
    RunningAgent::spawn(agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_our_membership_key_self_fences_within_the_ttl() {
    let c = Cluster::new();
    let store = c.store().await;
    let a = agent_without_device(&c, "n1").await;
    let other = agent_without_device(&c, "n2").await;
    wait_members(&store, &["n1", "n2"]).await;
    assert!(a.gate.is_open());

    // Anyone (an operator, a tool) deletes n1's key; its lease keeps being renewed.
    let key = store.keys().membership(&node("n1"));
    let t0 = Instant::now();
    let deleted = store.client().delete(key.clone(), None).await.unwrap();
    assert_eq!(deleted.deleted(), 1, "{key} was not there");

    let exit = tokio::time::timeout(2 * TTL, a.task)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "n1 kept running {:?} after its membership was deleted",
                2 * TTL
            )
        })
        .unwrap();
    let took = t0.elapsed();
    let AgentExit::SelfFenced { reason } = &exit else {
        panic!("{exit:?}")
    };
    assert!(
        reason.contains(&format!("our membership {key} was deleted at revision")),
        "{reason}"
    );
    assert!(a.gate.is_fenced(), "the I/O gate is still open");
    assert!(took < TTL, "self-fenced only after {took:?}");
    eprintln!("n1 self-fenced {took:?} after its membership key was deleted");

    // The other node is untouched and still a member.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(other.gate.is_open() && !other.task.is_finished());
    assert!(
        store
            .status()
            .await
            .unwrap()
            .members
            .iter()
            .any(|(m, _)| m == "n2")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_own_leave_is_not_a_lost_membership() {
    let c = Cluster::new();
    let a = agent_without_device(&c, "n1").await;
    let gate = a.gate.clone();
    assert_eq!(a.leave().await, AgentExit::Left);
    assert!(!gate.is_fenced());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_deleted_and_created_again_by_someone_else_self_fences() {
    let c = Cluster::new();
    let store = c.store().await;
    let a = agent_without_device(&c, "n1").await;
    let key = store.keys().membership(&node("n1"));
    // Deleted and put again at once: the key exists again, but it is not ours (a
    // check of the key's presence would miss it; the watch does not).
    let mut client = store.client();
    client.delete(key.clone(), None).await.unwrap();
    client.put(key.clone(), "i-impostor", None).await.unwrap();
    let exit = tokio::time::timeout(2 * TTL, a.task)
        .await
        .expect("n1 kept running after its membership was replaced")
        .unwrap();
    assert!(matches!(exit, AgentExit::SelfFenced { .. }), "{exit:?}");
    assert!(a.gate.is_fenced());
}

/// The first report blocks until the test lets it go.
#[derive(Debug)]
struct FirstReportBlocks {
    reached: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    go: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl device::BeforeReport for FirstReportBlocks {
    fn before_report(&self) {
        if let Some(reached) = self.reached.lock().unwrap().take() {
            let _ = reached.send(());
            if let Some(go) = self.go.lock().unwrap().take() {
                let _ = go.recv_timeout(Duration::from_secs(20));
            }
        }
    }
}

/// Issue 26, hole 4: the membership is lost (its lease revoked) while `unfence` waits
/// on the device; the key is then registered and `claim_arenas` finds the membership
/// gone. The start fails, and the key must not stay on the device (the next start on
/// this boot is refused, so nothing else would remove it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_loses_its_membership_after_registering_unregisters() {
    let c = Cluster::new();
    let store = c.store_with_arenas(&["a1"]).await;
    let (reached_tx, reached_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    let dev = std::sync::Arc::new(device::Forwarding {
        host: c.host("n1"),
        hook: FirstReportBlocks {
            reached: std::sync::Mutex::new(Some(reached_tx)),
            go: std::sync::Mutex::new(Some(go_rx)),
        },
    });
    let start = tokio::spawn(Agent::start(
        c.store().await,
        c.agent_cfg("n1", 1),
        Some(dev),
        key_of("n1"),
    ));
    // `unfence` checked the membership and now reads the report: revoke the lease.
    tokio::task::spawn_blocking(move || reached_rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("unfence never read the report");
    let key = store.keys().membership(&node("n1"));
    let got = store.client().get(key.clone(), None).await.unwrap();
    let lease = got.kvs().first().expect("n1 is a member").lease();
    store.client().lease_revoke(lease).await.unwrap();
    go_tx.send(()).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), start)
        .await
        .expect("start hung")
        .unwrap();
    let Err(e) = r else {
        panic!("the start succeeded without its membership")
    };
    assert!(e.to_string().contains("lost during start-up"), "{e}");
    assert!(
        !registered(&c.host("n1"), "n1"),
        "the key stayed registered after the failed start: {:?}",
        c.ns.snapshot()
    );
}

/// Once `hang` is set, a report blocks (a hung NVMe path, multipath queueing with no
/// path) until the test ends.
#[derive(Debug)]
struct HangsOnDemand {
    hang: std::sync::atomic::AtomicBool,
    reached: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl device::BeforeReport for HangsOnDemand {
    fn before_report(&self) {
        if self.hang.load(std::sync::atomic::Ordering::SeqCst) {
            if let Some(reached) = self.reached.lock().unwrap().take() {
                let _ = reached.send(());
            }
            // Until the test ends (its sender dropped), or a minute.
            let _ = self
                .release
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(60));
        }
    }
}

/// Issue 26, hole 5: the device stops answering (its report hangs) and then the
/// node's lease is revoked. The agent self-fences on time: its device check runs off
/// its loop, so the membership watch and the lease verdict do not wait for the
/// device. (It used to await the report inside its loop: no self-fence until the
/// device answered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_device_does_not_hold_up_the_self_fence() {
    let c = Cluster::new();
    let store = c.store().await;
    let (reached_tx, reached_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let dev = std::sync::Arc::new(device::Forwarding {
        host: c.host("n1"),
        hook: HangsOnDemand {
            hang: std::sync::atomic::AtomicBool::new(false),
            reached: std::sync::Mutex::new(Some(reached_tx)),
            release: std::sync::Mutex::new(release_rx),
        },
    });
    let agent = Agent::start(
        c.store().await,
        c.agent_cfg("n1", 0),
        Some(dev.clone()),
        key_of("n1"),
    )
    .await
    .expect("agent start");
    let a = RunningAgent::spawn(agent);
    wait_members(&store, &["n1"]).await;
    dev.hook
        .hang
        .store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::task::spawn_blocking(move || reached_rx.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the agent never checked the device");
    // The device hangs in the agent's check; now the node loses its lease.
    let key = store.keys().membership(&node("n1"));
    let got = store.client().get(key.clone(), None).await.unwrap();
    let lease = got.kvs().first().expect("n1 is a member").lease();
    let t0 = Instant::now();
    store.client().lease_revoke(lease).await.unwrap();
    let exit = tokio::time::timeout(2 * TTL, a.task)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "n1 did not self-fence within {:?} while its device hung",
                2 * TTL
            )
        })
        .unwrap();
    assert!(matches!(exit, AgentExit::SelfFenced { .. }), "{exit:?}");
    assert!(a.gate.is_fenced(), "the I/O gate is still open");
    eprintln!(
        "self-fenced {:?} after the lease was revoked, device still hung",
        t0.elapsed()
    );
    drop(release_tx);
}
