//! The controller (runs in every daemon, any number of replicas): membership watch,
//! authoritative sweep, and the driver that runs a [`FenceRun`] against a
//! [`FenceStore`] (etcd in the product) and a [`Fencer`]. The driver decides nothing:
//! it performs each [`FenceAction`] the run returns and feeds the outcome back.
//!
//! Controllers announce themselves (`controller/live/<id>`, bound to their lease) and
//! follow each other's presence with one watch ([`Roster`]). From it each decides
//! alone who acts ([`fence_duty`], [`SweepClock`]): for a death, the first-ranked
//! controller claims at once and two standbys check once each, later, claiming only
//! what nobody claimed; the rest leave it to them and to the sweep. One controller
//! runs the full sweep each period and stamps it; the next in order takes over when
//! the stamps stop. The claim transaction still decides who fences.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::EventType;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::clock::unix_ms;
use crate::core::{
    ClaimOutcome, Confirmation, FenceAction, FenceDuty, FenceFailure, FenceRun, FenceState,
    FenceStep, OperatorWaits, Roster, StepFailure, SweepClock, SweepDuty, Trigger, Victim,
    check_claim_age, fence_duty, instance_or_unknown, is_own_node, plan_sweep, retry_claim,
    standby_verdict,
};
use crate::fencer::{Fencer, fault, fault_scope};
use crate::metrics::Observer;
use crate::node::NodeId;
use crate::ports::FenceStore;
use crate::store::{
    Abort, ClaimGuard, EtcdStore, Finish, StoreError, apply_controller_event, count_round_trips,
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
    /// Where fences, sweeps and task health are reported (metrics, `/healthz`).
    pub observer: Observer,
    /// The lease this controller's presence (`controller/live/<id>`) is bound to: the
    /// agent's membership lease when both run in one daemon, so the presence goes
    /// exactly when the membership does. `None`: the controller grants its own lease
    /// of [`presence_ttl`](Self::presence_ttl) and keeps it alive.
    pub presence_lease: Option<i64>,
    /// TTL of the controller's own presence lease (when `presence_lease` is `None`):
    /// how long a dead controller may still be ranked first for a death (its standbys
    /// step in after [`standby_step`](Self::standby_step) each).
    pub presence_ttl: Duration,
    /// How long the standby of rank `k` waits (`k` × this) before it checks whether
    /// a death it saw was claimed. Longer than a claim transaction takes; it is added
    /// to a fence only when the first-ranked controller died unnoticed.
    pub standby_step: Duration,
    /// Set by the daemon when its node starts an intentional departure: the
    /// membership and the presence it then loses are the leave's doing, not an
    /// incident, and are logged as such.
    pub leaving: Arc<AtomicBool>,
}

impl ControllerConfig {
    /// Defaults: sweep every 30 s, starting at once; watch from now; own presence
    /// lease of 5 s; standbys 500 ms apart.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            sweep_interval: Duration::from_secs(30),
            sweep_on_start: true,
            watch_from: None,
            own_node: None,
            observer: Observer::default(),
            presence_lease: None,
            presence_ttl: Duration::from_secs(5),
            standby_step: Duration::from_millis(500),
            leaving: Arc::default(),
        }
    }

    /// This node is leaving on purpose ([`leaving`](Self::leaving)).
    fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }
}

/// Counters (for tests, benches and `status`).
#[derive(Debug, Default)]
pub struct ControllerStats {
    /// Fences this controller completed (generation bumped).
    pub fenced: AtomicU64,
    /// Fence attempts that failed (still owed).
    pub failed: AtomicU64,
    /// Fences skipped (claimed elsewhere, not owed, or left to a higher-ranked
    /// controller: see `left_to_peers`).
    pub skipped: AtomicU64,
    /// Deaths seen on the watch and left to higher-ranked controllers: without a
    /// request (rank 3 and beyond), or after a standby's check found them in hand.
    pub left_to_peers: AtomicU64,
    /// Standby checks sent (one small read each).
    pub standby_checks: AtomicU64,
    /// etcd round trips of everything done about deaths seen on the watch (standby
    /// checks, claims, finishing and abort transactions), summed.
    pub watch_round_trips: AtomicU64,
    /// Full sweeps completed (each one read of the key space).
    pub sweeps: AtomicU64,
    /// Sweep ticks left to the period's sweeper.
    pub sweeps_skipped: AtomicU64,
    /// Watch (re)connections.
    pub watch_starts: AtomicU64,
    /// Compacted-watch restarts.
    pub watch_compacted: AtomicU64,
    /// etcd round trips of the last completed fence's claim and finish transactions.
    pub last_fence_round_trips: AtomicU64,
}

/// The controller, over the store `S` (etcd in the product; the in-memory
/// [`MemStore`](crate::ports::mem::MemStore) in unit tests of its logic).
#[derive(Debug)]
pub struct Controller<S: FenceStore = EtcdStore> {
    store: S,
    fencer: Arc<dyn Fencer>,
    cfg: ControllerConfig,
    stats: ControllerStats,
    sweep_now: Notify,
    /// The live controllers, as the presence watch shows them.
    roster: std::sync::Mutex<Roster>,
    /// Fences only an operator can complete: the sweep leaves them owed without trying
    /// again ([`OperatorWaits`] says until when).
    needs_operator: std::sync::Mutex<OperatorWaits>,
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

/// First pause before starting a stopped task again; doubles up to [`MAX_RESTART_BACKOFF`].
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause before starting a stopped task again.
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// Runs the task `run` builds and, whenever it stops (returns, panics), reports it
/// stopped (`/healthz` fails, `fenced_task_up` 0), logs why and starts it again after a
/// backoff: a dead controller loop must not go unnoticed, and must not stay dead. The
/// backoff resets after a run that lasted a minute.
async fn supervise<F, Fut>(observer: Observer, task: &'static str, mut run: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut backoff = RESTART_BACKOFF;
    loop {
        let running = observer.task_running(task);
        let started = Instant::now();
        // Its own task, so a panic is caught here; dropping the set aborts it.
        let mut one = JoinSet::new();
        one.spawn(run());
        let why = match one.join_next().await {
            Some(Ok(())) | None => "returned".to_owned(),
            Some(Err(e)) if e.is_panic() => "panicked".to_owned(),
            Some(Err(e)) => e.to_string(),
        };
        running.stopped(why.clone());
        if started.elapsed() > Duration::from_secs(60) {
            backoff = RESTART_BACKOFF;
        }
        tracing::error!(task, why = %why, restart_in = ?backoff, "task {task} stopped ({why}): starting it again in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RESTART_BACKOFF);
        observer.task_restarted(task);
    }
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

impl<S: FenceStore> Controller<S> {
    /// A controller fencing with `fencer`.
    pub fn new(store: S, fencer: Arc<dyn Fencer>, cfg: ControllerConfig) -> Arc<Self> {
        if !fencer.severs() {
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
            roster: std::sync::Mutex::new(Roster::default()),
            needs_operator: std::sync::Mutex::default(),
        })
    }

    /// The live controllers as this controller sees them.
    pub fn roster(&self) -> Roster {
        self.lock_roster().clone()
    }

    /// Replaces the view of the live controllers (unit tests; the presence watch
    /// maintains it in the product).
    pub fn set_roster(&self, roster: Roster) {
        *self.lock_roster() = roster;
    }

    fn lock_roster(&self) -> std::sync::MutexGuard<'_, Roster> {
        self.roster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counters.
    pub fn stats(&self) -> &ControllerStats {
        &self.stats
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Asks the sweep loop to run now.
    pub fn kick_sweep(&self) {
        self.sweep_now.notify_one();
    }
}

/// The watch loop needs etcd's membership watch stream: only over [`EtcdStore`].
impl Controller<EtcdStore> {
    /// Runs the watch and sweep loops until the returned task is aborted (dropping the
    /// task aborts every fence it started, like a process death). Each loop is
    /// supervised: one that stops (returns, panics) is reported to the observer
    /// (`/healthz` fails) and started again with backoff.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut fences = JoinSet::new();
            let sweeper = this.clone();
            fences.spawn(supervise(this.cfg.observer.clone(), "sweep", move || {
                sweeper.clone().sweep_loop()
            }));
            let watcher = this.clone();
            fences.spawn(supervise(
                this.cfg.observer.clone(),
                "controller_watch",
                move || watcher.clone().watch_loop(),
            ));
            let present = this.clone();
            fences.spawn(supervise(
                this.cfg.observer.clone(),
                "presence",
                move || present.clone().presence_loop(),
            ));
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
            while fences.join_next().await.is_some() {}
        })
    }

    /// Sweeps at start (unless `sweep_on_start` is off) and when kicked (a compacted
    /// watch), whoever sweeps the period; every `sweep_interval` only when the
    /// [`SweepClock`] says this controller is the period's sweeper.
    async fn sweep_loop(self: Arc<Self>) {
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

    /// Announces this controller and follows the others' presence (and the sweep
    /// stamp) into the [`Roster`]. Whenever the watch or the lease fails, the roster
    /// is marked out of sync (this controller then claims every death at once and
    /// sweeps every period, as if alone) and the session starts again.
    async fn presence_loop(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let t0 = Instant::now();
            let why = self.presence_session().await;
            self.lock_roster().lost_sync();
            if t0.elapsed() > Duration::from_secs(10) {
                backoff = Duration::from_millis(100);
            }
            if self.cfg.is_leaving() {
                // Not an incident, and nothing to restart: the daemon stops this
                // controller once the departure is done.
                tracing::info!(
                    step = "presence",
                    "controller presence ended: this node left"
                );
                std::future::pending::<()>().await;
            }
            if why.is_denied() {
                // An older role without `controller/`: safe (this controller acts as
                // if alone), but every death costs a claim more.
                tracing::warn!(step = "presence", error = %why, "etcd refuses this controller's presence under controller/: run `fenced etcd-roles --apply` again (the controller role writes controller/); until then it claims every death at once and sweeps every period");
                backoff = Duration::from_secs(60);
            } else {
                tracing::warn!(step = "presence", error = %why, ?backoff, "controller presence lost (claiming every death at once and sweeping every period until it is back): retrying");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// One presence session: lease, announce, list, then watch (and keep our own
    /// lease alive) until something fails; returns why.
    async fn presence_session(&self) -> StoreError {
        let closed = |what: &str| StoreError::Unavailable {
            op: "presence",
            source: etcd_client::Error::WatchError(what.to_owned()),
        };
        let ttl = self.cfg.presence_ttl;
        let (lease, mut own) = match self.cfg.presence_lease {
            Some(lease) => (lease, None),
            None => {
                let lease = match self.store.grant(ttl).await {
                    Ok(l) => l,
                    Err(e) => return e,
                };
                match self.store.keep_alive(lease).await {
                    Ok(k) => (lease, Some(k)),
                    Err(e) => return e,
                }
            }
        };
        if let Err(e) = self
            .store
            .announce_controller(&self.cfg.id, self.cfg.own_node.as_ref(), lease)
            .await
        {
            return e;
        }
        let (roster, revision) = match self.store.roster().await {
            Ok(r) => r,
            Err(e) => return e,
        };
        let mut stream = match self.store.watch_controllers(revision + 1).await {
            Ok(s) => s,
            Err(e) => return e,
        };
        tracing::info!(
            step = "presence",
            controllers = roster.len(),
            "controller presence announced; following {} live controllers",
            roster.len()
        );
        self.set_roster(roster);
        let own_key = self.store.keys().controller_live(&self.cfg.id);
        let mut renew = tokio::time::interval((ttl / 3).max(Duration::from_millis(200)));
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let keeping = own.is_some();
        loop {
            tokio::select! {
                msg = stream.message() => {
                    let msg = match msg {
                        Ok(Some(m)) => m,
                        Ok(None) => return closed("presence watch closed"),
                        Err(e) => return StoreError::classify("watch", e),
                    };
                    if msg.canceled() {
                        return closed("presence watch canceled (compacted?)");
                    }
                    let mut roster = self.lock_roster();
                    for ev in msg.events() {
                        apply_controller_event(self.store.keys(), &mut roster, ev);
                        let ours = ev.kv().is_some_and(|kv| kv.key() == own_key.as_bytes());
                        if ours && ev.event_type() == EventType::Delete {
                            return closed("our presence key was deleted");
                        }
                    }
                }
                answer = async {
                    match &mut own {
                        Some((_, answers)) => answers.message().await,
                        None => std::future::pending().await,
                    }
                } => match answer {
                    Ok(Some(a)) if a.ttl() > 0 => {}
                    Ok(Some(_)) => return closed("presence lease expired"),
                    Ok(None) => return closed("presence keepalive stream closed"),
                    Err(e) => return StoreError::classify("lease_keep_alive", e),
                },
                _ = renew.tick(), if keeping => {
                    if let Some((keeper, _)) = &mut own
                        && let Err(e) = keeper.keep_alive().await
                    {
                        return StoreError::classify("lease_keep_alive", e);
                    }
                }
            }
        }
    }

    async fn watch_loop(self: Arc<Self>) {
        let mut fences = JoinSet::new();
        // Start from "now": whatever happened before is the sweep's (it runs at once).
        let mut last_rev: i64 = self.cfg.watch_from.map_or(0, |r| r - 1);
        let mut backoff = Duration::from_millis(100);
        let mut started_before = false;
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
                    if is_own_node(self.cfg.own_node.as_ref(), &node) {
                        if self.cfg.is_leaving() {
                            tracing::info!(step = "watch_delete", node = %node, "our own membership is gone: left");
                        } else {
                            tracing::warn!(step = "watch_delete", node = %node, "our own membership is gone: our agent self-fences (it watches its key), the peers fence us");
                        }
                        continue;
                    }
                    // An id outside the rule is fenced as "instance unknown"
                    // (`instance_or_unknown`; `from_etcd` also decodes the bytes).
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
                // fence up: past one step it is doubt, and doubt claims.
                let check = tokio::time::timeout(
                    self.cfg.standby_step,
                    self.store.fence_check(&victim.node),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::Unavailable {
                        op: "fence_check",
                        source: etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                            format!("no answer within {:?}", self.cfg.standby_step),
                        )),
                    })
                });
                match check {
                    Ok(check) => {
                        if let Err(why) = standby_verdict(&check, deleted_rev) {
                            left(&format_args!("standby of rank {rank}: {why}"));
                            return None;
                        }
                        tracing::warn!(step = "watch_delete", node = %victim.node, rank, waited = ?after, "nobody claimed this death: the standby claims it");
                    }
                    // Doubt claims: the claim transaction is the arbiter.
                    Err(e) => {
                        tracing::warn!(step = "watch_delete", node = %victim.node, rank, error = %e, "standby check failed: claiming");
                    }
                }
            }
        }
        Some(self.fence(victim, Trigger::Watch, guard).await)
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

    fn lock_needs_operator(&self) -> std::sync::MutexGuard<'_, OperatorWaits> {
        self.needs_operator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn claim_with_retry(
        &self,
        victim: &Victim,
        guard: ClaimGuard,
        lose_first_answer: bool,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut delay = Duration::from_millis(50);
        for attempt in 0.. {
            let mut r = self.store.claim(victim, &self.cfg.id, guard).await;
            if lose_first_answer && attempt == 0 {
                r = r.and_then(|_| Err(answer_lost("claim")));
            }
            match r {
                Err(e) if retry_claim(attempt, e.is_retryable()) => {
                    tracing::warn!(step = "claim", node = %victim.node, error = %e, "claim failed, retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                r => return r,
            }
        }
        unreachable!("the loop returns")
    }

    /// `sever` + `verify` through `fencer`, unless [`check_claim_age`] says the claim
    /// taken at `claiming` (the start of the claim transaction) may have expired: then
    /// the fence stays owed and whoever claims next decides again.
    async fn sever(
        &self,
        fencer: &dyn Fencer,
        victim: &Victim,
        claiming: Instant,
    ) -> Result<Confirmation, StepFailure> {
        let failed = |step, failure| StepFailure { step, failure };
        let lose = fault(FenceStep::Sever).await.map_err(|m| {
            failed(
                FenceStep::Sever,
                FenceFailure::Injected {
                    what: m.to_string(),
                },
            )
        })?;
        let held = claiming.elapsed();
        if let Err(failure) = check_claim_age(held, self.store.claim_ttl()) {
            tracing::warn!(step = "sever", node = %victim.node, claimed_ago = ?held, claim_ttl = ?self.store.claim_ttl(), "claim may have expired: not severing");
            return Err(failed(FenceStep::Sever, failure));
        }
        let r = fencer.fence(victim).await.map_err(|e| {
            if e.cause.needs_operator() {
                tracing::error!(step = "sever", node = %victim.node, error = %e.cause, "this fence needs an operator: it stays owed and this controller does not retry it until the node's record changes (see the error for what to do; `fenced check` turns CRITICAL while it is owed)");
                self.lock_needs_operator()
                    .record(victim.node.clone(), victim.instance.clone());
            }
            failed(
                e.step,
                FenceFailure::Fencer {
                    message: e.cause.to_string(),
                },
            )
        });
        if lose {
            return r.and_then(|_| {
                Err(failed(
                    FenceStep::Sever,
                    FenceFailure::Injected {
                        what: "fail point fence::sever: fencer ran, answer lost".to_owned(),
                    },
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
        let victim = checked_instance(victim);
        let scope = victim.clone();
        let node = victim.node.to_string();
        self.cfg.observer.fence_started(&node);
        let state = fault_scope(
            &self.cfg.id,
            &scope,
            self.run_fence(fencer, victim, trigger, guard),
        )
        .await;
        self.cfg.observer.fence_ended(&node, trigger, &state);
        state
    }

    async fn run_fence(
        &self,
        fencer: &dyn Fencer,
        victim: Victim,
        trigger: Trigger,
        guard: ClaimGuard,
    ) -> FenceState {
        let mut critical = 0;
        let (mut run, mut action) = FenceRun::new(
            victim.clone(),
            trigger,
            &self.cfg.id,
            fencer.name(),
            Instant::now(),
        );
        // The claim's lease was granted at most a quarter TTL before this; it is never
        // renewed.
        let claiming = Instant::now();
        let as_failure = |e: StoreError| FenceFailure::Store {
            cause: e.to_string(),
        };
        loop {
            let step_started = Instant::now();
            let step = match &action {
                FenceAction::Claim | FenceAction::ClaimIgnoringDeparture => "claim",
                FenceAction::Sever => "sever",
                FenceAction::Finish { .. } => "finish",
                FenceAction::Abort { .. } => "abort",
                FenceAction::Stop => "stop",
            };
            action = match action {
                FenceAction::Claim => {
                    let (claimed, claim_rts) = count_round_trips(async {
                        let lose = fault(FenceStep::Claim).await.map_err(fault_error)?;
                        self.claim_with_retry(&victim, guard, lose).await
                    })
                    .await;
                    critical += claim_rts;
                    run.on_claim(claimed.map_err(as_failure), Instant::now())
                }
                FenceAction::ClaimIgnoringDeparture => {
                    tracing::info!(step = "claim", node = %victim.node, "departure marker not honoured: the node still owns arenas, claiming with the marker ignored");
                    let claimed = self
                        .claim_with_retry(&victim, guard.ignoring_departure(), false)
                        .await;
                    run.on_claim(claimed.map_err(as_failure), Instant::now())
                }
                FenceAction::Sever => {
                    let r = self.sever(fencer, &victim, claiming).await;
                    run.on_sever(r, Instant::now(), unix_ms())
                }
                FenceAction::Finish {
                    from,
                    generation_rev,
                    claim_rev,
                    release_arenas,
                    arenas,
                    audit,
                } => {
                    let bump = async {
                        let lose = fault(FenceStep::Bump).await.map_err(fault_error)?;
                        let json = serde_json::to_string(&*audit).unwrap_or_default();
                        let r = self
                            .store
                            .finish(Finish {
                                node: &victim.node,
                                from,
                                generation_rev,
                                claim_rev,
                                release: release_arenas.then_some(arenas.as_slice()),
                                audit_json: json,
                            })
                            .await;
                        if lose {
                            return r.and_then(|_| Err(answer_lost("finish")));
                        }
                        r
                    };
                    let (r, finish_rts) = count_round_trips(bump).await;
                    critical += finish_rts;
                    let next = run.on_finish(r.map_err(as_failure));
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
                    next
                }
                FenceAction::Abort { claim_rev, audit } => {
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
                            .abort(Abort {
                                node: &victim.node,
                                claim_rev,
                                generation: audit.generation_before,
                                unix_ms: audit.unix_ms,
                                audit_json: json,
                            })
                            .await;
                        if lose {
                            return r.and_then(|()| Err(answer_lost("abort")));
                        }
                        r
                    };
                    if let Err(e) = abort.await {
                        tracing::warn!(node = %victim.node, error = %e, "releasing the claim failed; it expires with its lease");
                    }
                    FenceAction::Stop
                }
                FenceAction::Stop => break,
            };
            self.cfg.observer.fence_step(step, step_started.elapsed());
        }
        if run.won_claim() {
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
            other @ (FenceState::Failed { .. }
            | FenceState::Superseded { .. }
            | FenceState::Owed
            | FenceState::Claimed { .. }
            | FenceState::Severed { .. }) => {
                tracing::warn!(node = %victim.node, trigger = ?trigger, state = ?other, "retrying incomplete fence later");
                self.stats.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        state
    }
}

/// A victim's instance id came from etcd: one outside the rule is fenced as
/// "instance unknown" ([`instance_or_unknown`]), logged here.
fn checked_instance(mut victim: Victim) -> Victim {
    let (instance, refused) = instance_or_unknown(std::mem::take(&mut victim.instance));
    if let Some(e) = refused {
        tracing::warn!(node = %victim.node, error = %e, "instance id read from etcd refused: fencing with the instance unknown");
    }
    victim.instance = instance;
    victim
}

/// The controller's decisions against the in-memory store: logic only (the protocol on
/// a real etcd is `tests/fencing.rs`, `tests/failpoints.rs`, `tests/fault_schedules.rs`).
#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::core::{FenceFailure, SkipReason};
    use crate::fencer::{BoxFuture, FenceError};
    use crate::ports::mem::MemStore;

    /// A Fencer answering from a script (confirmed when the script is empty), that
    /// can run a store action while "severing" (e.g. let the claim expire).
    #[derive(Default)]
    struct Scripted {
        answers: Mutex<VecDeque<Result<(), FenceStep>>>,
        calls: AtomicU64,
        during: Option<Box<dyn Fn() + Send + Sync>>,
        /// The instance id of each victim handed to the fencer.
        instances: Mutex<Vec<String>>,
    }

    impl std::fmt::Debug for Scripted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Scripted")
        }
    }

    impl Scripted {
        fn failing(step: FenceStep) -> Self {
            let s = Self::default();
            s.answers.lock().unwrap().push_back(Err(step));
            s
        }
        fn calls(&self) -> u64 {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Fencer for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn fence<'a>(
            &'a self,
            victim: &'a Victim,
        ) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.instances.lock().unwrap().push(victim.instance.clone());
            if let Some(f) = &self.during {
                f();
            }
            let answer = self.answers.lock().unwrap().pop_front().unwrap_or(Ok(()));
            Box::pin(async move {
                match answer {
                    Ok(()) => Ok(Confirmation {
                        fencer: "scripted".into(),
                        severed: true,
                        evidence: format!("{} severed", victim.node),
                    }),
                    Err(step) => Err(FenceError::new(step, "key still registered")),
                }
            })
        }
    }

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn victim(node: &str) -> Victim {
        Victim {
            node: n(node),
            instance: format!("i-{node}"),
        }
    }

    fn controller(store: &MemStore, fencer: &Arc<Scripted>) -> Arc<Controller<MemStore>> {
        Controller::new(
            store.clone(),
            fencer.clone() as Arc<dyn Fencer>,
            ControllerConfig::new("c1"),
        )
    }

    /// A store, a fencer that confirms every fence, and controller `c1` over both.
    fn rig() -> (MemStore, Arc<Scripted>, Arc<Controller<MemStore>>) {
        rig_with(Scripted::default())
    }

    /// A store, `fencer`, and controller `c1` over both.
    fn rig_with(fencer: Scripted) -> (MemStore, Arc<Scripted>, Arc<Controller<MemStore>>) {
        let store = MemStore::new();
        let fencer = Arc::new(fencer);
        let c = controller(&store, &fencer);
        (store, fencer, c)
    }

    /// `c` fences `node` (instance `i-<node>`) for the watched DELETE at `deleted_rev`.
    async fn watched_fence(c: &Controller<MemStore>, node: &str, deleted_rev: i64) -> FenceState {
        c.fence(
            victim(node),
            Trigger::Watch,
            ClaimGuard::Watch { deleted_rev },
        )
        .await
    }

    /// `node` joined with arena `a-<node>` and its lease expired: the DELETE's revision.
    fn dead(store: &MemStore, node: &str) -> i64 {
        store.join(&n(node), &format!("i-{node}"));
        store.give_arena(&n(node), &format!("a-{node}"));
        store.expire(&n(node))
    }

    #[tokio::test]
    async fn a_watched_death_is_fenced_once_and_its_arenas_freed() {
        let (store, fencer, c) = rig();
        let deleted_rev = dead(&store, "n1");
        let state = watched_fence(&c, "n1", deleted_rev).await;
        assert_eq!(state, FenceState::Fenced { generation: 1 });
        assert_eq!(store.generation(&n("n1")), 1);
        assert!(!store.owed(&n("n1")) && !store.claimed(&n("n1")));
        assert!(store.state().free.contains("a-n1"));
        // The same DELETE delivered again (a second controller, a replay): not owed.
        let again = watched_fence(&c, "n1", deleted_rev).await;
        assert_eq!(
            again,
            FenceState::Skipped {
                why: SkipReason::NotOwed(crate::core::Refusal::AlreadyFenced)
            }
        );
        assert_eq!((fencer.calls(), store.generation(&n("n1"))), (1, 1));
        assert_eq!(c.stats().fenced.load(Ordering::SeqCst), 1);
        assert_eq!(c.stats().skipped.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_instance_id_outside_the_rule_never_reaches_the_fencer() {
        let (store, fencer, c) = rig();
        let deleted_rev = dead(&store, "n1");
        let crafted = Victim {
            node: n("n1"),
            instance: "i-1\n2026-01-01T00:00:00Z INFO forged".into(),
        };
        let state = c
            .fence(crafted, Trigger::Watch, ClaimGuard::Watch { deleted_rev })
            .await;
        assert_eq!(state, FenceState::Fenced { generation: 1 });
        assert_eq!(*fencer.instances.lock().unwrap(), [String::new()]);
    }

    #[tokio::test]
    async fn a_departure_refused_for_owned_arenas_is_claimed_again_and_fenced() {
        let (store, fencer, c) = rig();
        store.join(&n("n1"), "i-n1");
        store.give_arena(&n("n1"), "a1");
        let deleted_rev = store.mark_departed(&n("n1"));
        let state = watched_fence(&c, "n1", deleted_rev).await;
        assert_eq!(state, FenceState::Fenced { generation: 1 });
        assert_eq!(fencer.calls(), 1);
        let audit = store.state().audit.last().cloned().unwrap();
        assert!(
            audit
                .3
                .contains("departure marker ignored: arena records show 1 owned"),
            "{audit:?}"
        );
    }

    #[tokio::test]
    async fn a_clean_departure_owning_nothing_is_not_fenced() {
        let (store, fencer, c) = rig();
        store.join(&n("n1"), "i-n1");
        let deleted_rev = store.mark_departed(&n("n1"));
        let state = watched_fence(&c, "n1", deleted_rev).await;
        let FenceState::Skipped { why } = state else {
            panic!("{state:?}")
        };
        assert_eq!(why.to_string(), "departed cleanly, owns no arena");
        assert_eq!((fencer.calls(), store.generation(&n("n1"))), (0, 0));
        assert!(!store.owed(&n("n1")));
        // The sweep honours it too.
        let r = c.sweep_once().await.unwrap();
        assert_eq!((r.honoured, r.fenced), (1, 0));
    }

    #[tokio::test]
    async fn a_claim_held_elsewhere_is_left_to_its_holder() {
        let (store, fencer, c) = rig();
        let deleted_rev = dead(&store, "n1");
        store.hold_claim(&n("n1"), "c2");
        let state = watched_fence(&c, "n1", deleted_rev).await;
        assert_eq!(
            state,
            FenceState::Skipped {
                why: SkipReason::HeldBy("c2".into())
            }
        );
        assert_eq!(fencer.calls(), 0);
        // The sweep leaves it to the holder as well.
        let r = c.sweep_once().await.unwrap();
        assert_eq!((r.fenced, r.not_completed), (0, 0));
        assert_eq!(store.generation(&n("n1")), 0);
    }

    #[tokio::test]
    async fn an_unconfirmed_fence_stays_owed_and_the_sweep_finishes_it() {
        let (store, fencer, c) = rig_with(Scripted::failing(FenceStep::Verify));
        let deleted_rev = dead(&store, "n1");
        let state = watched_fence(&c, "n1", deleted_rev).await;
        let FenceState::Failed {
            step: FenceStep::Verify,
            error: FenceFailure::Fencer { message },
        } = state
        else {
            panic!("{state:?}")
        };
        assert_eq!(message, "key still registered");
        // Not bumped, still owed, claim given back, the failed attempt audited.
        assert_eq!(store.generation(&n("n1")), 0);
        assert!(store.owed(&n("n1")) && !store.claimed(&n("n1")));
        assert!(store.state().audit.iter().any(|a| a.2));
        assert!(!store.state().free.contains("a-n1"));
        assert_eq!(c.stats().failed.load(Ordering::SeqCst), 1);
        let r = c.sweep_once().await.unwrap();
        assert_eq!((r.fenced, r.not_completed), (1, 0));
        assert_eq!(store.generation(&n("n1")), 1);
        assert!(!store.owed(&n("n1")));
        assert_eq!(fencer.calls(), 2);
    }

    #[tokio::test]
    async fn a_claim_lost_before_the_bump_writes_nothing_and_stays_owed() {
        let store = MemStore::new();
        let expiring = store.clone();
        let fencer = Arc::new(Scripted {
            during: Some(Box::new(move || expiring.expire_claim(&n("n1")))),
            ..Scripted::default()
        });
        let c = controller(&store, &fencer);
        let deleted_rev = dead(&store, "n1");
        let state = watched_fence(&c, "n1", deleted_rev).await;
        assert_eq!(
            state,
            FenceState::Failed {
                step: FenceStep::Bump,
                error: FenceFailure::ClaimLost
            }
        );
        assert_eq!(store.generation(&n("n1")), 0);
        assert!(store.owed(&n("n1")));
        assert!(!store.state().free.contains("a-n1"));
    }

    #[tokio::test]
    async fn a_failed_finish_leaves_the_fence_owed_until_the_claim_expires() {
        let (store, _, c) = rig();
        let deleted_rev = dead(&store, "n1");
        store.fail_next("finish", 1);
        let state = watched_fence(&c, "n1", deleted_rev).await;
        assert!(
            matches!(
                &state,
                FenceState::Failed {
                    step: FenceStep::Bump,
                    error: FenceFailure::Store { .. }
                }
            ),
            "{state:?}"
        );
        assert_eq!(store.generation(&n("n1")), 0);
        assert!(store.owed(&n("n1")));
        // Our claim is still held (it expires with its lease): the sweep leaves it.
        assert!(store.claimed(&n("n1")));
        assert_eq!(c.sweep_once().await.unwrap().fenced, 0);
        store.expire_claim(&n("n1"));
        assert_eq!(c.sweep_once().await.unwrap().fenced, 1);
        assert_eq!(store.generation(&n("n1")), 1);
    }

    #[tokio::test]
    async fn an_unreachable_store_at_claim_is_retried() {
        let (store, _, c) = rig();
        let deleted_rev = dead(&store, "n1");
        store.fail_next("claim", 2);
        let state = watched_fence(&c, "n1", deleted_rev).await;
        assert_eq!(state, FenceState::Fenced { generation: 1 });
        // Past the retries: a failure at the claim, nothing written.
        let deleted_rev = dead(&store, "n2");
        store.fail_next("claim", 5);
        let state = watched_fence(&c, "n2", deleted_rev).await;
        assert!(
            matches!(
                state,
                FenceState::Failed {
                    step: FenceStep::Claim,
                    ..
                }
            ),
            "{state:?}"
        );
        assert!(!store.owed(&n("n2")) && !store.claimed(&n("n2")));
    }

    /// Controllers `c0..c4` in view; `ranked[k]` is the id of rank `k` for `victim`.
    fn ranked(victim: &str) -> (Roster, Vec<String>) {
        let roster = Roster::listed((0..5).map(|i| (format!("c{i}"), None)), None);
        let mut ids: Vec<String> = (0..5).map(|i| format!("c{i}")).collect();
        ids.sort_by_key(|id| roster.fence_rank(id, &n(victim)));
        (roster, ids)
    }

    fn ranked_controller(
        store: &MemStore,
        fencer: &Arc<Scripted>,
        roster: &Roster,
        id: &str,
    ) -> Arc<Controller<MemStore>> {
        let mut cfg = ControllerConfig::new(id);
        cfg.standby_step = Duration::from_millis(1);
        let c = Controller::new(store.clone(), fencer.clone() as Arc<dyn Fencer>, cfg);
        c.set_roster(roster.clone());
        c
    }

    #[tokio::test]
    async fn only_the_first_rank_claims_a_death_and_its_standbys_only_check() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let deleted_rev = dead(&store, "n1");
        let (roster, ids) = ranked("n1");
        let ctls: Vec<_> = ids
            .iter()
            .map(|id| ranked_controller(&store, &fencer, &roster, id))
            .collect();
        let first = ctls[0].on_delete(victim("n1"), deleted_rev).await;
        assert_eq!(first, Some(FenceState::Fenced { generation: 1 }));
        for c in &ctls[1..] {
            assert_eq!(c.on_delete(victim("n1"), deleted_rev).await, None);
        }
        assert_eq!(store.calls("claim"), 1, "one claim transaction");
        assert_eq!(store.calls("fence_check"), 2, "ranks 1 and 2 checked");
        assert_eq!((fencer.calls(), store.generation(&n("n1"))), (1, 1));
        let left: u64 = ctls
            .iter()
            .map(|c| c.stats().left_to_peers.load(Ordering::SeqCst))
            .sum();
        assert_eq!(left, 4);
        assert_eq!(ctls[1].stats().standby_checks.load(Ordering::SeqCst), 1);
        assert_eq!(ctls[3].stats().standby_checks.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_standby_claims_a_death_nobody_claimed() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let deleted_rev = dead(&store, "n1");
        let (roster, ids) = ranked("n1");
        // The first rank never acts (dead, still announced).
        let second = ranked_controller(&store, &fencer, &roster, &ids[1]);
        let third = ranked_controller(&store, &fencer, &roster, &ids[2]);
        assert_eq!(
            second.on_delete(victim("n1"), deleted_rev).await,
            Some(FenceState::Fenced { generation: 1 })
        );
        assert_eq!(third.on_delete(victim("n1"), deleted_rev).await, None);
        assert_eq!((store.calls("claim"), store.calls("fence_check")), (1, 2));
        assert_eq!(store.generation(&n("n1")), 1);
    }

    #[tokio::test]
    async fn a_standby_whose_check_fails_claims() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let deleted_rev = dead(&store, "n1");
        let (roster, ids) = ranked("n1");
        let second = ranked_controller(&store, &fencer, &roster, &ids[1]);
        store.fail_next("fence_check", 1);
        assert_eq!(
            second.on_delete(victim("n1"), deleted_rev).await,
            Some(FenceState::Fenced { generation: 1 })
        );
    }

    #[tokio::test]
    async fn a_standby_leaves_a_claim_in_hand_and_a_departure() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let (roster, ids) = ranked("n1");
        let second = ranked_controller(&store, &fencer, &roster, &ids[1]);
        let deleted_rev = dead(&store, "n1");
        store.hold_claim(&n("n1"), "elsewhere");
        assert_eq!(second.on_delete(victim("n1"), deleted_rev).await, None);
        store.join(&n("n2"), "i-n2");
        let deleted_rev = store.mark_departed(&n("n2"));
        let (roster, ids) = ranked("n2");
        let second = ranked_controller(&store, &fencer, &roster, &ids[1]);
        assert_eq!(second.on_delete(victim("n2"), deleted_rev).await, None);
        assert_eq!(store.calls("claim"), 0);
        assert_eq!(fencer.calls(), 0);
    }

    #[tokio::test]
    async fn a_controller_whose_view_is_out_of_sync_claims_at_once() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let deleted_rev = dead(&store, "n1");
        let (mut roster, ids) = ranked("n1");
        roster.lost_sync();
        let last = ranked_controller(&store, &fencer, &roster, &ids[4]);
        assert_eq!(
            last.on_delete(victim("n1"), deleted_rev).await,
            Some(FenceState::Fenced { generation: 1 })
        );
        assert_eq!(store.calls("fence_check"), 0);
    }

    #[tokio::test]
    async fn a_sweep_is_stamped_and_a_failed_stamp_fails_nothing() {
        let (store, _, c) = rig();
        dead(&store, "n1");
        assert_eq!(c.sweep_once().await.unwrap().fenced, 1);
        assert_eq!(store.state().sweep_stamps, ["c1"]);
        store.fail_next("stamp_sweep", 1);
        assert!(c.sweep_once().await.is_ok());
        assert_eq!(store.state().sweep_stamps, ["c1"]);
        // A failed sweep is not stamped.
        store.fail_next("sweep_snapshot", 1);
        assert!(c.sweep_once().await.is_err());
        assert_eq!(store.state().sweep_stamps, ["c1"]);
    }

    #[tokio::test]
    async fn the_sweep_drops_stale_marks_of_members_and_spares_its_own_node() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let mut cfg = ControllerConfig::new("c1");
        cfg.own_node = Some(n("self"));
        let c = Controller::new(store.clone(), fencer.clone() as Arc<dyn Fencer>, cfg);
        // n1 was fenced, then rejoined: its mark is stale.
        dead(&store, "n1");
        assert_eq!(c.sweep_once().await.unwrap().fenced, 1);
        store.join(&n("n1"), "i-n1b");
        // Our own node's membership is gone: the peers fence it, not us.
        dead(&store, "self");
        let r = c.sweep_once().await.unwrap();
        assert_eq!((r.dropped, r.fenced), (1, 0));
        assert!(store.state().done.is_empty());
        assert_eq!(store.generation(&n("self")), 0);
        assert_eq!(fencer.calls(), 1);
    }
}
