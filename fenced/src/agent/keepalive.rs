//! The membership lease's keepalive: renewals published as (when, time left) for the
//! self-fencing clock. etcd-specific (etcd-client's keepalive stream).

use std::time::{Duration, Instant};

use crate::clock::unix_ms;
use crate::core::attest::LivenessRecord;
use crate::core::{LeaseReading, lease_reading};
use crate::node::NodeId;
use crate::store::EtcdStore;

/// Keeps `lease` alive from the moment it is granted (a slow start must not let it
/// expire), publishing each renewal as (when, remaining TTL); TTL 0: the lease is gone,
/// or this agent gave it up (etcd refuses its writes): self-fence now.
///
/// After renewals it also does, at a bounded rate, what [`Duties`] schedules: it
/// records `liveness/<node>` (the lease, its TTL and the self-fence `margin`:
/// `fenced attest` asks etcd about the lease) at the first renewal and then every
/// [`LIVENESS_REFRESH`], and in between checks every [`WRITE_PERMISSION_CHECK`] that
/// etcd still lets this node write its own keys.
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
        let mut duties = Duties::default();
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
                    let now = Instant::now();
                    let Some(duty) = duties.due(now).filter(|_| left > 0) else {
                        continue;
                    };
                    // Best effort, and bounded: a request balanced onto a member that
                    // stopped answering would hold the next renewal for the whole
                    // request timeout (5 s), past a short lease's expiry.
                    let done = match duty {
                        Duty::Stamp => {
                            let record = LivenessRecord {
                                lease,
                                ttl_ms: millis(ttl),
                                margin_ms: millis(margin),
                                unix_ms: unix_ms(),
                                refresh_ms: millis(LIVENESS_REFRESH + renew_every),
                            };
                            tokio::time::timeout(renew_every, store.put_liveness(&node, &record))
                                .await
                        }
                        Duty::CheckPermission => {
                            tokio::time::timeout(
                                renew_every,
                                store.check_own_write_permission(&node),
                            )
                            .await
                        }
                    };
                    duties.done(duty, now, matches!(done, Ok(Ok(()))));
                    if let Ok(Err(e)) = &done
                        && e.is_denied()
                    {
                        // Our credentials may no longer write our own keys (the node's
                        // etcd role was revoked): we cannot leave, nor claim or give
                        // back an arena. Stop renewing and self-fence now (the check
                        // runs only every few seconds: waiting out the margin on top
                        // would leave the node writing for longer); the lease expires
                        // and a controller fences us.
                        tracing::error!(node = %node, error = %e, "etcd refuses this node's writes (its etcd role revoked?): stopping lease renewal and self-fencing now; this node is fenced when its lease expires");
                        drop(stream.take());
                        let _ = tx.send((Instant::now(), 0));
                        // Keep `tx` open: a closed channel would wake the agent's loop
                        // without pause until the watchdog fires.
                        std::future::pending::<()>().await;
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

/// How often a running agent rewrites `liveness/<node>`. The record only names the
/// lease `fenced attest` asks etcd about, which does not change while the agent runs,
/// so nothing needs it rewritten at each renewal: the lease's renewals prove liveness
/// and cost etcd no revision. It is still refreshed, rarely, because its wall-clock
/// stamp is how `fenced status` and `fenced check` date a fence owed since the node
/// stopped (at most this plus a renewal period late). 30 s: one revision per node per
/// 30 s (issue 19's bound is 0.05 writes/s per idle node; the per-renewal write of
/// older versions was ~0.6/s at TTL 5 s), and an owed fence is dated within 30 s.
pub(crate) const LIVENESS_REFRESH: Duration = Duration::from_secs(30);

/// How often, between refreshes, the agent asks etcd whether it may still write its
/// own keys ([`EtcdStore::check_own_write_permission`]: no revision, one raft entry).
/// A node whose etcd role is revoked self-fences within about this long; the
/// per-renewal write of older versions found it at the next renewal.
pub(crate) const WRITE_PERMISSION_CHECK: Duration = Duration::from_secs(15);

/// What the keepalive asks of etcd after a renewal, besides the renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Duty {
    /// Write `liveness/<node>`.
    Stamp,
    /// Check that etcd still lets us write our own keys, writing nothing.
    CheckPermission,
}

/// The schedule of the keepalive's [`Duty`]s; time enters as an argument. The
/// record is written at the first renewal, and retried at each renewal until a write
/// lands (`fenced attest` needs it), then every [`LIVENESS_REFRESH`]; between
/// refreshes a permission check runs every [`WRITE_PERMISSION_CHECK`]. Once the record
/// is written, a failed request is retried no sooner than a check period later, so an
/// etcd that refuses writes (its space alarm) is not hammered.
#[derive(Debug, Default)]
struct Duties {
    /// When the record was last written.
    stamped: Option<Instant>,
    /// When a duty was last attempted.
    tried: Option<Instant>,
}

impl Duties {
    /// The duty due at `now`, if any.
    fn due(&self, now: Instant) -> Option<Duty> {
        let since = |t: Instant| now.saturating_duration_since(t);
        match (self.stamped, self.tried) {
            (None, _) => Some(Duty::Stamp),
            (Some(_), Some(t)) if since(t) < WRITE_PERMISSION_CHECK => None,
            (Some(s), _) if since(s) >= LIVENESS_REFRESH => Some(Duty::Stamp),
            (Some(_), _) => Some(Duty::CheckPermission),
        }
    }

    /// `duty`, attempted at `at`, succeeded or not.
    fn done(&mut self, duty: Duty, at: Instant, ok: bool) {
        self.tried = Some(at);
        if duty == Duty::Stamp && ok {
            self.stamped = Some(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renewals every `every` for `over`: the duties run, and when.
    fn run(every: Duration, over: Duration, ok: bool) -> Vec<(Duration, Duty)> {
        let t0 = Instant::now();
        let mut d = Duties::default();
        let mut out = Vec::new();
        let mut t = Duration::ZERO;
        while t <= over {
            if let Some(duty) = d.due(t0 + t) {
                d.done(duty, t0 + t, ok);
                out.push((t, duty));
            }
            t += every;
        }
        out
    }

    #[test]
    fn the_record_is_written_at_start_then_every_refresh_with_checks_between() {
        let every = Duration::from_millis(1_667);
        let done = run(every, Duration::from_secs(300), true);
        let stamps: Vec<Duration> = done
            .iter()
            .filter(|(_, d)| *d == Duty::Stamp)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(stamps[0], Duration::ZERO);
        // At most one write per LIVENESS_REFRESH, at least one per refresh plus a
        // renewal period: 10 in 300 s, where a write per renewal made 180.
        assert!((9..=10).contains(&stamps.len()), "{stamps:?}");
        for w in stamps.windows(2) {
            assert!(w[1] - w[0] >= LIVENESS_REFRESH, "{stamps:?}");
            assert!(w[1] - w[0] <= LIVENESS_REFRESH + every, "{stamps:?}");
        }
        // Some duty (a write or a check) at least every check period plus a renewal.
        for w in done.windows(2) {
            assert!(w[1].0 - w[0].0 >= WRITE_PERMISSION_CHECK, "{done:?}");
            assert!(
                w[1].0 - w[0].0 <= WRITE_PERMISSION_CHECK + every,
                "{done:?}"
            );
        }
        assert!(done.iter().any(|(_, d)| *d == Duty::CheckPermission));
    }

    #[test]
    fn failures_are_retried_a_check_period_later_and_the_first_write_at_once() {
        let every = Duration::from_millis(1_667);
        // The first write is retried at each renewal until it lands...
        let mut d = Duties::default();
        let t0 = Instant::now();
        d.done(Duty::Stamp, t0, false);
        assert_eq!(d.due(t0 + every), Some(Duty::Stamp));
        // ...later ones no sooner than a check period after the failed attempt.
        let done = run(every, Duration::from_secs(120), false);
        assert!(done.iter().all(|(_, d)| *d == Duty::Stamp), "{done:?}");
        assert!(done.len() >= 60, "{done:?}");
        let mut d = Duties::default();
        d.done(Duty::Stamp, t0, true);
        let t = t0 + LIVENESS_REFRESH;
        assert_eq!(d.due(t), Some(Duty::Stamp));
        d.done(Duty::Stamp, t, false);
        assert_eq!(d.due(t + every), None);
        assert_eq!(d.due(t + WRITE_PERMISSION_CHECK), Some(Duty::Stamp));
    }
}
