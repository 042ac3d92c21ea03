//! The store's HTTP/2 keepalive against etcd's ping policy.
//!
//! etcd (grpc-go) lets a client PING at most every `--grpc-keepalive-min-time` (5 s by
//! default) and never on a connection without streams; each PING sooner is a strike,
//! and at the third it closes the connection (`GOAWAY too_many_pings`) with every
//! stream on it. With PINGs every 2 s, a quiet watch against a 3-member cluster lost
//! its connection every 6–15 s ("h2 protocol error: error reading a body from
//! connection"): the controllers' presence watch restarted and re-announced all the
//! time, the membership watch resumed, and every restart was a warning in the log.

mod common;

use std::time::Duration;

use common::cluster::EtcdCluster;
use fenced::store::{EtcdStore, StoreOptions};

/// A quiet membership watch on a store connected to all three members (as a daemon's)
/// stays open for 30 s: no error, no end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_watch_keeps_its_connection_to_a_three_member_cluster() {
    let etcd = EtcdCluster::new(3).start();
    let opts = StoreOptions::for_lease_ttl(Duration::from_secs(5));
    let store = EtcdStore::connect_with(&etcd.endpoints(), "/ka/", Duration::from_secs(10), &opts)
        .await
        .expect("connect");
    let mut watch = store.watch_membership(0).await.expect("watch");
    let quiet = Duration::from_secs(30);
    let outcome = tokio::time::timeout(quiet, async {
        loop {
            match watch.message().await {
                // etcd's answer to the watch's creation.
                Ok(Some(m)) if m.created() && m.events().is_empty() => continue,
                other => return other,
            }
        }
    })
    .await;
    if let Ok(r) = outcome {
        panic!(
            "the quiet watch ended within {quiet:?} (HTTP/2 PING interval {:?}): {r:?}",
            opts.keepalive_interval
        );
    }
}
