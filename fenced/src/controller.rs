//! The controller (runs in every daemon, any number of replicas): membership watch,
//! authoritative sweep, and the driver that runs a [`FenceRun`] against etcd and a
//! [`Fencer`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::EventType;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::core::{
    ClaimOutcome, Confirmation, FenceAction, FenceRun, FenceState, FenceStep, Trigger, Victim,
    honour_departure, plan_sweep,
};
use crate::fencer::{Fencer, fault, fault_scope};
use crate::node::NodeId;
use crate::store::{
    ClaimGuard, ClaimRefusal, ClaimResult, EtcdStore, StoreError, count_round_trips,
};

/// Controller settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// This controller's id (written into claims and audit records).
    pub id: String,
    /// Reconciliation sweep period (default 30 s).
    pub sweep_interval: Duration,
    /// Sweep as soon as the controller starts (default). Off only in tests that must
    /// prove a later trigger (compaction) starts the sweep.
    pub sweep_on_start: bool,
    /// Start the membership watch from this revision instead of "now" (a controller
    /// resuming after downtime).
    pub watch_from: Option<i64>,
    /// The node this controller runs on: never fenced by itself (its own agent
    /// self-fences when it loses membership; the peers fence it).
    pub own_node: Option<NodeId>,
}

impl ControllerConfig {
    /// Defaults: sweep every 30 s, starting at once; watch from now.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            sweep_interval: Duration::from_secs(30),
            sweep_on_start: true,
            watch_from: None,
            own_node: None,
        }
    }
}

/// Counters (for tests, benches and `status`).
#[derive(Debug, Default)]
pub struct ControllerStats {
    /// Fences this controller completed (generation bumped).
    pub fenced: AtomicU64,
    /// Fence attempts that failed (still owed).
    pub failed: AtomicU64,
    /// Fences skipped (claimed elsewhere, not owed).
    pub skipped: AtomicU64,
    /// Sweeps completed.
    pub sweeps: AtomicU64,
    /// Watch (re)connections.
    pub watch_starts: AtomicU64,
    /// Compacted-watch restarts.
    pub watch_compacted: AtomicU64,
    /// etcd round trips of the last completed fence's claim and finish transactions.
    pub last_fence_round_trips: AtomicU64,
}

/// The controller.
#[derive(Debug)]
pub struct Controller {
    store: EtcdStore,
    fencer: Arc<dyn Fencer>,
    cfg: ControllerConfig,
    stats: ControllerStats,
    sweep_now: Notify,
}

/// A transaction whose answer a fail point lost: it committed, the caller sees a
/// timeout (the ambiguity a real deadline leaves).
fn answer_lost(op: &'static str) -> StoreError {
    StoreError::Unavailable {
        op,
        source: etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
            "fail point: answer lost",
        )),
    }
}

/// An injected fault as a store error (the step's etcd request was never sent).
fn fault_error(e: crate::fault::FaultInjected) -> StoreError {
    StoreError::Malformed {
        key: "fail point".into(),
        what: e.to_string(),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

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

impl Controller {
    /// A controller fencing with `fencer`.
    pub fn new(store: EtcdStore, fencer: Arc<dyn Fencer>, cfg: ControllerConfig) -> Arc<Self> {
        if fencer.name() == "none" {
            tracing::warn!(
                controller = %cfg.id,
                "SINGLE-SIGNAL FENCING: no fencer configured; generations are bumped on lease \
                 expiry alone, device access is NOT severed and arenas of fenced nodes are NEVER \
                 released"
            );
        }
        Arc::new(Self {
            store,
            fencer,
            cfg,
            stats: ControllerStats::default(),
            sweep_now: Notify::new(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> &ControllerStats {
        &self.stats
    }

    /// The store.
    pub fn store(&self) -> &EtcdStore {
        &self.store
    }

    /// Asks the sweep loop to run now.
    pub fn kick_sweep(&self) {
        self.sweep_now.notify_one();
    }

    /// Runs the watch and sweep loops until the returned task is aborted (dropping the
    /// task aborts every fence it started, like a process death).
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut fences = JoinSet::new();
            let sweeper = this.clone();
            fences.spawn(async move { sweeper.sweep_loop().await });
            let leases = this.store.clone();
            fences.spawn(async move {
                // Keep a fresh spare claim lease ready, so a claim never waits on a grant.
                loop {
                    if let Err(e) = leases.prepare_claim_lease().await {
                        tracing::debug!(error = %e, "preparing a claim lease failed");
                    }
                    tokio::time::sleep(leases.claim_ttl() / 8).await;
                }
            });
            this.watch_loop(&mut fences).await;
        })
    }

    async fn sweep_loop(self: Arc<Self>) {
        if !self.cfg.sweep_on_start {
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.sweep_interval) => {}
                _ = self.sweep_now.notified() => {}
            }
        }
        loop {
            match self.sweep_once().await {
                Ok(r) => tracing::debug!(step = "sweep", ?r, "sweep done"),
                Err(e) => tracing::warn!(step = "sweep", error = %e, "sweep failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.sweep_interval) => {}
                _ = self.sweep_now.notified() => {}
            }
        }
    }

    async fn watch_loop(self: &Arc<Self>, fences: &mut JoinSet<()>) {
        // Start from "now": whatever happened before is the sweep's (it runs at once).
        let mut last_rev: i64 = self.cfg.watch_from.map_or(0, |r| r - 1);
        let mut backoff = Duration::from_millis(100);
        loop {
            let _ = self.store.prepare_claim_lease().await;
            let start = if last_rev > 0 { last_rev + 1 } else { 0 };
            let mut stream = match self.store.watch_membership(start).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(step = "watch_resume", error = %e, ?backoff, "membership watch failed, retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            self.stats.watch_starts.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                step = "watch_resume",
                from_revision = start,
                "membership watch started"
            );
            loop {
                let msg = match stream.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => {
                        tracing::warn!(
                            step = "watch_resume",
                            "fencing watch channel closed, reconnecting"
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(step = "watch_resume", error = %e, "fencing watch channel failed, reconnecting");
                        break;
                    }
                };
                backoff = Duration::from_millis(100);
                if msg.canceled() {
                    if msg.compact_revision() > 0 {
                        // Resuming would spin: start from now and let the sweep cover the gap.
                        self.stats.watch_compacted.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            step = "watch_compacted",
                            last_revision = last_rev,
                            compact_revision = msg.compact_revision(),
                            "watch revision compacted; restarting from now, sweep covers the gap"
                        );
                        last_rev = 0;
                        self.kick_sweep();
                    } else {
                        tracing::warn!(
                            step = "watch_resume",
                            reason = msg.cancel_reason(),
                            "watch canceled, reconnecting"
                        );
                    }
                    break;
                }
                for ev in msg.events() {
                    let Some(kv) = ev.kv() else { continue };
                    last_rev = last_rev.max(kv.mod_revision());
                    if ev.event_type() != EventType::Delete {
                        continue;
                    }
                    let keys = self.store.keys();
                    let Some(node) = keys.node_of(&keys.membership_prefix(), kv.key()) else {
                        continue;
                    };
                    if self.cfg.own_node.as_ref() == Some(&node) {
                        tracing::warn!(step = "watch_delete", node = %node, "our own membership is gone: left to the agent (self-fence) and the peers");
                        continue;
                    }
                    // Anyone with write access to etcd may have put anything there:
                    // an id outside the rule is fenced as "instance unknown".
                    let instance = match ev.prev_kv().map(|p| crate::instance::from_etcd(p.value()))
                    {
                        Some(Ok(i)) => i,
                        Some(Err(e)) => {
                            tracing::warn!(step = "watch_delete", node = %node, error = %e, "membership value is not an instance id: fencing with the instance unknown");
                            String::new()
                        }
                        None => String::new(),
                    };
                    let deleted_rev = kv.mod_revision();
                    tracing::info!(step = "watch_delete", node = %node, instance = %instance, revision = deleted_rev, "membership DELETE");
                    let this = self.clone();
                    fences.spawn(async move {
                        this.fence(
                            Victim { node, instance },
                            Trigger::Watch,
                            ClaimGuard::Watch { deleted_rev },
                        )
                        .await;
                    });
                }
                while fences.try_join_next().is_some() {}
            }
            tokio::time::sleep(backoff).await;
        }
    }

    /// One authoritative sweep: one range-read transaction, then the owed fences
    /// (concurrently).
    pub async fn sweep_once(self: &Arc<Self>) -> Result<SweepReport, StoreError> {
        let (snap, revision) = self.store.sweep_snapshot().await?;
        let plan = plan_sweep(&snap);
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
        for owed in plan.fence {
            if self.cfg.own_node.as_ref() == Some(&owed.victim.node) {
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
                _ => report.not_completed += 1,
            }
        }
        self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
        Ok(report)
    }

    async fn claim_with_retry(
        &self,
        victim: &Victim,
        guard: ClaimGuard,
        lose_first_answer: bool,
    ) -> Result<ClaimResult, StoreError> {
        let mut delay = Duration::from_millis(50);
        for attempt in 0.. {
            let mut r = self.store.claim(victim, &self.cfg.id, guard).await;
            if lose_first_answer && attempt == 0 {
                r = r.and_then(|_| Err(answer_lost("claim")));
            }
            match r {
                Err(e) if e.is_retryable() && attempt < 4 => {
                    tracing::warn!(step = "claim", node = %victim.node, error = %e, "claim failed, retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                r => return r,
            }
        }
        unreachable!("the loop returns")
    }

    /// `sever` + `verify` through `fencer`, unless the claim may have expired since
    /// `claiming` (the start of the claim transaction). A controller that stalled
    /// between its claim and the preempt (CPU starvation, a paused process) must not
    /// preempt any more: once the claim is gone the victim may have started afresh
    /// and joined, and the preempt would sever the new, healthy incarnation (found by
    /// `tests/fault_schedules.rs`: a 3.4 s stall before `sever` with a 3 s claim TTL).
    /// The fence stays owed; whoever claims next decides again.
    async fn sever(
        &self,
        fencer: &dyn Fencer,
        victim: &Victim,
        claiming: Instant,
    ) -> Result<Confirmation, (FenceStep, String)> {
        let lose = fault(FenceStep::Sever)
            .await
            .map_err(|m| (FenceStep::Sever, m.to_string()))?;
        let held = claiming.elapsed();
        if held > self.store.claim_ttl() / 2 {
            tracing::warn!(step = "sever", node = %victim.node, claimed_ago = ?held, claim_ttl = ?self.store.claim_ttl(), "claim may have expired: not severing");
            return Err((
                FenceStep::Sever,
                format!(
                    "not severed: claimed {held:?} ago, the claim (TTL {:?}) may have expired",
                    self.store.claim_ttl()
                ),
            ));
        }
        let r = fencer
            .fence(victim)
            .await
            .map_err(|e| (e.step, e.cause.to_string()));
        if lose {
            return r.and_then(|_| {
                Err((
                    FenceStep::Sever,
                    "fail point fence::sever: fencer ran, answer lost".to_owned(),
                ))
            });
        }
        r
    }

    /// Runs one fence of `victim` to a terminal state. Every `Err` leaves the fence owed.
    pub async fn fence(&self, victim: Victim, trigger: Trigger, guard: ClaimGuard) -> FenceState {
        let fencer = self.fencer.clone();
        self.fence_with(&*fencer, victim, trigger, guard).await
    }

    /// Like [`fence`](Self::fence) with another Fencer (operator attestation).
    pub async fn fence_with(
        &self,
        fencer: &dyn Fencer,
        victim: Victim,
        trigger: Trigger,
        guard: ClaimGuard,
    ) -> FenceState {
        let scope = victim.clone();
        fault_scope(
            &self.cfg.id,
            &scope,
            self.run_fence(fencer, victim, trigger, guard),
        )
        .await
    }

    async fn run_fence(
        &self,
        fencer: &dyn Fencer,
        victim: Victim,
        trigger: Trigger,
        guard: ClaimGuard,
    ) -> FenceState {
        let mut critical = 0;
        let (mut run, _) = FenceRun::new(
            victim.clone(),
            trigger,
            &self.cfg.id,
            fencer.name(),
            Instant::now(),
        );
        // The claim's lease was granted at most a quarter TTL before this; it is never
        // renewed.
        let claiming = Instant::now();
        let (mut claimed, claim_rts) = count_round_trips(async {
            let lose = fault(FenceStep::Claim).await.map_err(fault_error)?;
            self.claim_with_retry(&victim, guard, lose).await
        })
        .await;
        critical += claim_rts;
        if let (
            Ok(ClaimResult::Refused(ClaimRefusal::Departed { arenas })),
            ClaimGuard::Watch { deleted_rev },
        ) = (&claimed, guard)
        {
            if honour_departure(*arenas) {
                tracing::info!(step = "claim", node = %victim.node, "departure marker honoured: node owns no arena, not fenced");
            } else {
                run.add_signal(format!(
                    "departure marker ignored: arena records show {} owned",
                    arenas.map_or("unknown".to_owned(), |n| n.to_string())
                ));
                claimed = self
                    .claim_with_retry(&victim, ClaimGuard::IgnoreDeparture { deleted_rev }, false)
                    .await;
            }
        }
        let outcome = match claimed {
            Ok(ClaimResult::Outcome(o)) => Ok(o),
            Ok(ClaimResult::Refused(r)) => Ok(ClaimOutcome::NotOwed {
                why: match r {
                    ClaimRefusal::Member => "node is a member again".to_owned(),
                    ClaimRefusal::Departed { .. } => "departed cleanly, owns no arena".to_owned(),
                    ClaimRefusal::AlreadyFenced => {
                        "already fenced: a fence mark was written after this DELETE".to_owned()
                    }
                    ClaimRefusal::SnapshotAged => {
                        "sweep snapshot aged: fence completed elsewhere or state changed".to_owned()
                    }
                },
            }),
            Err(e) => Err(e.to_string()),
        };
        let won = match &outcome {
            Ok(ClaimOutcome::Won {
                generation_rev,
                claim_rev,
                arenas,
                ..
            }) => Some((*generation_rev, *claim_rev, arenas.clone())),
            _ => None,
        };
        let won_claim = won.is_some();
        let mut action = run.on_claim(outcome, Instant::now());
        if action == FenceAction::Sever {
            let r = self.sever(fencer, &victim, claiming).await;
            action = run.on_sever(r, Instant::now(), unix_ms());
        }
        match (action, won) {
            (
                FenceAction::Finish {
                    from,
                    release_arenas,
                    audit,
                },
                Some((generation_rev, claim_rev, arenas)),
            ) => {
                let bump = async {
                    let lose = fault(FenceStep::Bump).await.map_err(fault_error)?;
                    let json = serde_json::to_string(&*audit).unwrap_or_default();
                    let r = self
                        .store
                        .finish(
                            &victim.node,
                            from,
                            generation_rev,
                            claim_rev,
                            release_arenas.then_some(arenas.as_slice()),
                            json,
                        )
                        .await;
                    if lose {
                        return r.and_then(|_| Err(answer_lost("finish")));
                    }
                    r
                };
                let (r, finish_rts) = count_round_trips(bump).await;
                critical += finish_rts;
                run.on_finish(r.map_err(|e| e.to_string()));
                self.stats
                    .last_fence_round_trips
                    .store(critical, Ordering::Relaxed);
                if let FenceState::Fenced { generation } = run.state() {
                    tracing::info!(
                        target: "fenced::audit",
                        step = "release_claim",
                        node = %victim.node,
                        instance = %victim.instance,
                        generation_before = from,
                        generation_after = generation,
                        fencer = %audit.fencer,
                        fencer_result = %audit.fencer_result,
                        arenas_released = audit.arenas_released.len(),
                        total_ms = audit.total_ms,
                        audit = %serde_json::to_string(&*audit).unwrap_or_default(),
                        "node fenced"
                    );
                }
            }
            (FenceAction::Abort { audit }, Some((_, claim_rev, _))) => {
                let json = serde_json::to_string(&*audit).unwrap_or_default();
                tracing::error!(
                    target: "fenced::audit",
                    step = "release_claim",
                    node = %victim.node,
                    fencer_result = %audit.fencer_result,
                    audit = %json,
                    "fence NOT confirmed: generation not bumped, fence stays owed (sweep retries)"
                );
                let abort = async {
                    let lose = fault(FenceStep::ReleaseClaim).await.map_err(fault_error)?;
                    let r = self
                        .store
                        .abort(
                            &victim.node,
                            claim_rev,
                            audit.generation_before,
                            audit.unix_ms,
                            json,
                        )
                        .await;
                    if lose {
                        return r.and_then(|()| Err(answer_lost("abort")));
                    }
                    r
                };
                if let Err(e) = abort.await {
                    tracing::warn!(node = %victim.node, error = %e, "releasing the claim failed; it expires with its lease");
                }
            }
            _ => {}
        }
        if won_claim {
            // Refill the spare claim lease, off the critical path.
            let store = self.store.clone();
            tokio::spawn(async move { store.prepare_claim_lease().await });
        }
        let state = run.state().clone();
        match &state {
            FenceState::Fenced { .. } => self.stats.fenced.fetch_add(1, Ordering::Relaxed),
            FenceState::Skipped { why } => {
                tracing::info!(node = %victim.node, trigger = ?trigger, why = %why, "fence skipped");
                self.stats.skipped.fetch_add(1, Ordering::Relaxed)
            }
            other => {
                tracing::warn!(node = %victim.node, trigger = ?trigger, state = ?other, "retrying incomplete fence later");
                self.stats.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        state
    }
}
