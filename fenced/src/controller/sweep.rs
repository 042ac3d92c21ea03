//! The reconciliation sweep: when this controller sweeps ([`SweepClock`]), and one
//! sweep (one read of the key space, [`plan_sweep`], the owed fences, the stamp).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::task::JoinSet;

use super::Controller;
use super::fence::checked_instance;
use crate::core::{
    ClaimGuard, FenceState, SweepClock, SweepDuty, Trigger, is_own_node, plan_sweep,
};
use crate::ports::FenceStore;
use crate::store::StoreError;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Revision of the snapshot.
    pub revision: i64,
    /// Stale intents/marks dropped for live members.
    pub dropped: usize,
    /// Departures honoured.
    pub honoured: usize,
    /// Fences completed.
    pub fenced: usize,
    /// Fences attempted but not completed.
    pub not_completed: usize,
}

/// The sweep loop runs beside the watch (see `spawn_watch_and_sweep`).
impl<S: FenceStore> Controller<S> {
    /// Sweeps at start (unless `sweep_on_start` is off) and when kicked (a compacted
    /// watch), whoever sweeps the period; every `sweep_interval` only when the
    /// [`SweepClock`] says this controller is the period's sweeper.
    pub(super) async fn sweep_loop(self: Arc<Self>) {
        let mut forced = self.cfg.sweep_on_start;
        if !forced {
            forced = tokio::select! {
                _ = tokio::time::sleep(self.cfg.sweep_interval) => false,
                _ = self.sweep_now.notified() => true,
            };
        }
        let mut clock = SweepClock::default();
        loop {
            // Tests stop the sweep task here (`task::sweep=return`) to see it noticed.
            fail::fail_point!("task::sweep", |_| ());
            let duty = clock.tick(&self.lock_roster(), &self.cfg.id);
            if forced || duty.sweeps() {
                if let SweepDuty::SweepStale { ticks } = &duty {
                    tracing::info!(
                        step = "sweep",
                        ticks,
                        "no other controller stamped a sweep for {ticks} periods: sweeping"
                    );
                }
                match self.sweep_once().await {
                    Ok(r) => tracing::debug!(step = "sweep", ?r, ?duty, "sweep done"),
                    Err(e) => tracing::warn!(step = "sweep", error = %e, "sweep failed"),
                }
            } else {
                self.stats.sweeps_skipped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(step = "sweep", ?duty, "sweep left to the period's sweeper");
            }
            forced = tokio::select! {
                _ = tokio::time::sleep(self.cfg.sweep_interval) => false,
                _ = self.sweep_now.notified() => true,
            };
        }
    }
}

impl<S: FenceStore> Controller<S> {
    /// One authoritative sweep: one range-read transaction, then the owed fences
    /// (concurrently), then the stamp that tells the other controllers a sweep ran.
    pub async fn sweep_once(self: &Arc<Self>) -> Result<SweepReport, StoreError> {
        let t0 = Instant::now();
        let mut seen = None;
        let r = self.sweep_run(&mut seen).await;
        self.cfg.observer.sweep_done(t0.elapsed(), r.is_ok(), seen);
        if r.is_ok()
            && let Err(e) = self.store.stamp_sweep(&self.cfg.id).await
        {
            // The next in the sweep order takes over after a few periods; harmless.
            tracing::warn!(step = "sweep", error = %e, "stamping the sweep failed");
        }
        r
    }

    async fn sweep_run(
        self: &Arc<Self>,
        seen: &mut Option<(usize, usize, usize)>,
    ) -> Result<SweepReport, StoreError> {
        let (snap, revision) = self.store.sweep_snapshot().await?;
        let plan = plan_sweep(&snap);
        *seen = Some((snap.members.len(), snap.claims.len(), plan.fence.len()));
        let mut report = SweepReport {
            revision,
            honoured: plan.honoured.len(),
            ..SweepReport::default()
        };
        for node in &plan.drop_stale {
            if self.store.drop_stale(node).await? {
                tracing::info!(step = "sweep", node = %node, "member re-registered: dropped stale intent and fence mark");
                report.dropped += 1;
            }
        }
        let mut set = JoinSet::new();
        self.lock_needs_operator()
            .keep_owed(|node| plan.fence.iter().any(|o| o.victim.node == *node));
        for owed in plan.fence {
            if is_own_node(self.cfg.own_node.as_ref(), &owed.victim.node) {
                continue;
            }
            let instance = checked_instance(owed.victim.clone()).instance;
            if self
                .lock_needs_operator()
                .waits(&owed.victim.node, &instance)
            {
                tracing::debug!(step = "sweep", node = %owed.victim.node, "fence owed, waiting for an operator (not retried)");
                report.not_completed += 1;
                continue;
            }
            let this = self.clone();
            tracing::info!(step = "sweep", node = %owed.victim.node, reason = %owed.reason, "fence owed");
            set.spawn(async move {
                this.fence(owed.victim, Trigger::Sweep, ClaimGuard::Sweep(owed.guard))
                    .await
            });
        }
        while let Some(r) = set.join_next().await {
            match r {
                Ok(FenceState::Fenced { .. }) => report.fenced += 1,
                Ok(FenceState::Skipped { .. }) => {}
                Ok(
                    FenceState::Failed { .. }
                    | FenceState::Superseded { .. }
                    | FenceState::Owed
                    | FenceState::Claimed { .. }
                    | FenceState::Severed { .. },
                )
                | Err(_) => report.not_completed += 1,
            }
        }
        self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
        Ok(report)
    }
}
