//! Issue 27 (invariant 9) against a real etcd with in-process daemons on the
//! in-memory model of the namespace (`nvme_resv::model`, held to the kernel target by
//! hwtests): the target loses every registration and the reservation while a node is
//! fenced and its host could still write.

mod common;

use std::time::{Duration, Instant};

use common::*;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_members_register_again_and_shut_the_fenced_host_out() {
    let c = Cluster::new();
    let store = c.store().await;
    let d1 = c.daemon("n1", 0).await;
    let d2 = c.daemon("n2", 0).await;
    let d3 = c.daemon("n3", 0).await;
    // n3 is fenced: its lease lost (its host's application would keep writing).
    store.revoke(d3.agent.lease).await.unwrap();
    wait_until("n3 fenced", WAIT, || async {
        generation(&store, "n3").await == 1
    })
    .await;
    assert!(!device::can_write(&c.host("n3")));

    // The target restarts without persistence: nothing survives, every host writes.
    assert!(!c.ns.lose_state());
    let t0 = Instant::now();
    assert!(device::can_write(&c.host("n3")), "the window opened");
    wait_until("the fenced host refused again", WAIT, || async {
        !device::can_write(&c.host("n3"))
    })
    .await;
    let window = t0.elapsed();
    eprintln!("window until the fenced host was refused again: {window:?}");

    // Both live members registered again; they run on, their generations unchanged;
    // the fenced node's key stays off the device.
    wait_until("both live members registered again", WAIT, || async {
        registered(&c.host("n1"), "n1") && registered(&c.host("n1"), "n2")
    })
    .await;
    assert!(!registered(&c.host("n1"), "n3"));
    assert!(device::can_write(&c.host("n1")) && device::can_write(&c.host("n2")));
    assert_eq!(generation(&store, "n1").await, 0);
    assert_eq!(generation(&store, "n2").await, 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!d1.agent.task.is_finished() && !d2.agent.task.is_finished());
    assert!(d1.agent.gate.is_open() && d2.agent.gate.is_open());
    assert!(!device::can_write(&c.host("n3")));
    d1.kill();
    d2.kill();
    d3.kill();
}
