//! The membership lease's keepalive: renewals published as (when, time left) for the
//! self-fencing clock. etcd-specific (etcd-client's keepalive stream).

use std::time::{Duration, Instant};

use crate::clock::unix_ms;
use crate::core::attest::LivenessRecord;
use crate::core::{LeaseReading, lease_reading};
use crate::node::NodeId;
use crate::store::EtcdStore;

/// Keeps `lease` alive from the moment it is granted (a slow start must not let it
/// expire), publishing each renewal as (when, remaining TTL); TTL 0: the lease is gone.
/// After each renewal it records `liveness/<node>` (the lease, its TTL and the
/// self-fence `margin`: `fenced attest` asks etcd about the lease).
///
/// "When" is the time the renewing request was *sent*: etcd renewed the lease at or
/// after that instant, so the self-fence margin measured from it never overestimates
/// what is left. A slow answer (a loaded etcd, a starved guest) is still a renewal: it
/// is awaited for up to a TTL instead of being dropped as a failure. When the stream
/// breaks, etcd is asked for the lease's remaining TTL, which dates its last renewal.
///
/// When the store takes an etcd endpoint out of rotation (it stopped serving: hung,
/// stalled, cut off), the stream is reopened at once (opening it renews the lease): the
/// old stream may sit on that member, and waiting a TTL for its answer let a 2 s lease
/// expire. Reopening and the TTL question are bounded by TTL/2, as either may wait on a
/// member that never answers (`tests/hung_member.rs`).
pub(super) fn spawn_keepalive(
    store: EtcdStore,
    node: NodeId,
    lease: i64,
    ttl: Duration,
    margin: Duration,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<(Instant, i64)>,
) {
    let (tx, rx) = tokio::sync::watch::channel((
        Instant::now(),
        i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
    ));
    let task = tokio::spawn(async move {
        let mut removals = store.endpoint_removals();
        let mut stream = store.keep_alive(lease).await.ok();
        let renew_every = (ttl / 3).max(Duration::from_millis(200));
        // Reopening a stream (and asking for the lease's TTL) may wait on a member that
        // stopped answering: bounded, so the next attempt lands elsewhere.
        let open_within = ttl / 2;
        let full_ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let mut tick = tokio::time::interval(renew_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The newest renewal published: an older one is never published after it.
        let mut last = Instant::now();
        let mut broken_since: Option<Instant> = None;
        let mut publish = |at: Instant, left: i64| {
            if left <= 0 {
                tracing::error!(step = "lease_expired", node = %node, "membership lease expired");
                let _ = tx.send((Instant::now(), 0));
            } else if at > last {
                last = at;
                let _ = tx.send((at, left));
            }
        };
        loop {
            tick.tick().await;
            let sent = Instant::now();
            let renewed = match &mut stream {
                Some((keeper, msgs)) => match keeper.keep_alive().await {
                    Ok(()) => tokio::select! {
                        r = tokio::time::timeout(ttl, msgs.message()) => match r {
                            Ok(Ok(Some(resp))) => Some(resp.ttl()),
                            _ => None,
                        },
                        Ok(()) = removals.changed() => {
                            tracing::info!(node = %node, "an etcd endpoint was taken out of rotation: reopening the lease keepalive stream");
                            let opened = Instant::now();
                            stream = open_keepalive(&store, lease, open_within).await;
                            if stream.is_some() {
                                publish(opened, full_ttl);
                            } else {
                                tick.reset_immediately();
                            }
                            continue;
                        }
                    },
                    Err(_) => None,
                },
                None => None,
            };
            match renewed {
                Some(left) => {
                    if let Some(since) = broken_since.take() {
                        tracing::info!(node = %node, after = ?since.elapsed(), "lease keepalive restored");
                    }
                    publish(sent, left);
                    if left > 0 {
                        // Best effort, and bounded: a put balanced onto a member that
                        // stopped answering would hold the next renewal for the whole
                        // request timeout (5 s), past a short lease's expiry.
                        let record = LivenessRecord {
                            lease,
                            ttl_ms: millis(ttl),
                            margin_ms: millis(margin),
                            unix_ms: unix_ms(),
                        };
                        let put =
                            tokio::time::timeout(renew_every, store.put_liveness(&node, &record))
                                .await;
                        if let Ok(Err(e)) = &put
                            && e.is_denied()
                        {
                            // Our credentials may no longer write our own keys (the
                            // node's etcd role was revoked): stop renewing, as if cut off.
                            // The lease expires, a controller fences us, and the
                            // watchdog self-fences at the margin.
                            tracing::error!(node = %node, error = %e, "etcd refuses this node's writes (its etcd role revoked?): stopping lease renewal; this node self-fences at the margin and is fenced when its lease expires");
                            // Keep `tx` open: a closed channel would wake the agent's
                            // loop without pause until the watchdog fires.
                            drop(stream.take());
                            std::future::pending::<()>().await;
                        }
                    }
                }
                None => {
                    if broken_since.is_none() {
                        broken_since = Some(sent);
                        tracing::warn!(node = %node, "lease keepalive got no answer: reopening the stream");
                    }
                    // The stream broke or stalled (etcd unreachable or slow): reopen it,
                    // and ask etcd directly how long the lease has left (etcd-client
                    // reports an expired lease on the stream only as a string).
                    let opened = Instant::now();
                    stream = open_keepalive(&store, lease, open_within).await;
                    if stream.is_some() {
                        publish(opened, full_ttl);
                    }
                    let asked = Instant::now();
                    if let Ok(Ok(left)) =
                        tokio::time::timeout(open_within, store.lease_ttl(lease)).await
                    {
                        match lease_reading(ttl, left, asked) {
                            LeaseReading::Expired => publish(asked, 0),
                            LeaseReading::RenewedNoEarlierThan { at, left } => publish(at, left),
                            LeaseReading::Unknown => {}
                        }
                    }
                }
            }
        }
    });
    (task, rx)
}

/// Opens a lease keepalive stream. etcd-client sends a first renewal and waits for its
/// answer, which a member that stopped answering never gives (and a follower whose
/// leader hangs forwards it there): bounded by `within`. `Some`: the lease was renewed
/// at or after the call.
async fn open_keepalive(
    store: &EtcdStore,
    lease: i64,
    within: Duration,
) -> Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> {
    tokio::time::timeout(within, store.keep_alive(lease))
        .await
        .ok()
        .and_then(Result::ok)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
