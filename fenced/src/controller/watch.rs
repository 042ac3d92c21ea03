//! The membership watch: each DELETE seen is a death, and what this controller does
//! about it is [`fence_duty`]'s answer (claim, stand by and check, or leave it).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinSet;

use super::Controller;
use crate::core::{
    ClaimGuard, FenceDuty, FenceState, StandbyClaim, Trigger, Victim, fence_duty, is_own_node,
    standby_check_timeout, standby_decision,
};
use crate::ports::{FenceStore, MembershipChange, MembershipFeed, MembershipWatch, WatchNext};
use crate::store::count_round_trips;

/// The watch loop takes its events through the port ([`MembershipFeed`]): etcd's
/// watch in the product, the twin's event log in tests.
impl<S: MembershipFeed> Controller<S> {
    pub(super) async fn watch_loop(self: Arc<Self>) {
        let mut fences = JoinSet::new();
        // Start from "now": whatever happened before is the sweep's (it runs at once).
        let mut last_rev: i64 = self.cfg.watch_from.map_or(0, |r| r - 1);
        let mut backoff = Duration::from_millis(100);
        let mut started_before = false;
        loop {
            let _ = self.store.prepare_claim_lease().await;
            let start = if last_rev > 0 { last_rev + 1 } else { 0 };
            let mut stream = match self.store.membership_events(start).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(step = "watch_resume", error = %e, ?backoff, "membership watch failed, retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            self.stats.watch_starts.fetch_add(1, Ordering::Relaxed);
            if started_before {
                self.cfg.observer.watch_restarted();
            }
            started_before = true;
            tracing::info!(
                step = "watch_resume",
                from_revision = start,
                "membership watch started"
            );
            loop {
                let events = match stream.next().await {
                    WatchNext::Events(events) => events,
                    WatchNext::Closed => {
                        tracing::warn!(
                            step = "watch_resume",
                            "fencing watch channel closed, reconnecting"
                        );
                        break;
                    }
                    WatchNext::Failed(e) => {
                        tracing::warn!(step = "watch_resume", error = %e, "fencing watch channel failed, reconnecting");
                        break;
                    }
                    WatchNext::Compacted { compact_revision } => {
                        backoff = Duration::from_millis(100);
                        // Resuming would spin: start from now and let the sweep cover the gap.
                        self.stats.watch_compacted.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            step = "watch_compacted",
                            last_revision = last_rev,
                            compact_revision,
                            "watch revision compacted; restarting from now, sweep covers the gap"
                        );
                        last_rev = 0;
                        self.kick_sweep();
                        break;
                    }
                    WatchNext::Canceled { reason } => {
                        backoff = Duration::from_millis(100);
                        tracing::warn!(
                            step = "watch_resume",
                            reason,
                            "watch canceled, reconnecting"
                        );
                        break;
                    }
                };
                backoff = Duration::from_millis(100);
                for ev in events {
                    last_rev = last_rev.max(ev.revision);
                    let MembershipChange::Gone { node, instance } = ev.change else {
                        continue;
                    };
                    if is_own_node(self.cfg.own_node.as_ref(), &node) {
                        if self.cfg.is_leaving() {
                            tracing::info!(step = "watch_delete", node = %node, "our own membership is gone: left");
                        } else {
                            tracing::warn!(step = "watch_delete", node = %node, "our own membership is gone: our agent self-fences (it watches its key), the peers fence us");
                        }
                        continue;
                    }
                    // An id outside the rule is fenced as "instance unknown"
                    // (`instance_or_unknown`; the adapter decodes the bytes).
                    let instance = match instance {
                        Some(Ok(i)) => i,
                        Some(Err(e)) => {
                            tracing::warn!(step = "watch_delete", node = %node, error = %e, "membership value is not an instance id: fencing with the instance unknown");
                            String::new()
                        }
                        None => String::new(),
                    };
                    let deleted_rev = ev.revision;
                    tracing::info!(step = "watch_delete", node = %node, instance = %instance, revision = deleted_rev, "membership DELETE");
                    let this = self.clone();
                    fences.spawn(async move {
                        this.on_delete(Victim { node, instance }, deleted_rev).await;
                    });
                }
                while fences.try_join_next().is_some() {}
            }
            tokio::time::sleep(backoff).await;
        }
    }
}

impl<S: FenceStore> Controller<S> {
    /// A membership DELETE at `deleted_rev` seen on the watch: what [`fence_duty`]
    /// says this controller does about it. `None`: left to a higher-ranked
    /// controller (and, should it fail, to the sweep).
    pub async fn on_delete(&self, victim: Victim, deleted_rev: i64) -> Option<FenceState> {
        let duty = fence_duty(
            &self.lock_roster(),
            &self.cfg.id,
            &victim.node,
            self.cfg.standby_step,
        );
        let (state, rts) = count_round_trips(self.act_on_delete(duty, victim, deleted_rev)).await;
        self.stats
            .watch_round_trips
            .fetch_add(rts, Ordering::Relaxed);
        state
    }

    async fn act_on_delete(
        &self,
        duty: FenceDuty,
        victim: Victim,
        deleted_rev: i64,
    ) -> Option<FenceState> {
        let guard = ClaimGuard::Watch { deleted_rev };
        let left = |why: &dyn std::fmt::Display| {
            tracing::info!(step = "watch_delete", node = %victim.node, ?duty, "left to peers: {why}");
            self.stats.left_to_peers.fetch_add(1, Ordering::Relaxed);
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
        };
        match duty {
            FenceDuty::Claim => {}
            FenceDuty::LeaveToPeers { rank } => {
                left(&format_args!("ranked {rank}"));
                return None;
            }
            FenceDuty::Standby { rank, after } => {
                tokio::time::sleep(after).await;
                self.stats.standby_checks.fetch_add(1, Ordering::Relaxed);
                // A check waiting on a member that stopped answering must not hold the
                // fence up: past its timeout it is doubt, and doubt claims
                // ([`standby_decision`]).
                let timeout = standby_check_timeout(self.cfg.standby_step);
                let answer =
                    match tokio::time::timeout(timeout, self.store.fence_check(&victim.node)).await
                    {
                        Ok(Ok(check)) => Ok(check),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err(format!("no answer within {timeout:?}")),
                    };
                match standby_decision(answer.as_ref().ok(), deleted_rev) {
                    Err(why) => {
                        left(&format_args!("standby of rank {rank}: {why}"));
                        return None;
                    }
                    Ok(StandbyClaim::Unclaimed) => {
                        tracing::warn!(step = "watch_delete", node = %victim.node, rank, waited = ?after, "nobody claimed this death: the standby claims it");
                    }
                    Ok(StandbyClaim::Doubt) => {
                        let error = answer.err().unwrap_or_default();
                        tracing::warn!(step = "watch_delete", node = %victim.node, rank, error = %error, "standby check failed: claiming");
                    }
                }
            }
        }
        Some(self.fence(victim, Trigger::Watch, guard).await)
    }
}
