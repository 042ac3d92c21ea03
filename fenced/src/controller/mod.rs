//! The controller (runs in every daemon, any number of replicas): membership watch,
//! authoritative sweep, and the driver that runs a [`FenceRun`](crate::core::FenceRun)
//! against a [`FenceStore`] (etcd in the product) and a [`Fencer`]. The driver decides
//! nothing: it performs each [`FenceAction`](crate::core::FenceAction) the run returns
//! and feeds the outcome back.
//!
//! Controllers announce themselves (`controller/live/<id>`, bound to their lease) and
//! follow each other's presence with one watch ([`Roster`]). From it each decides
//! alone who acts ([`fence_duty`](crate::core::fence_duty),
//! [`SweepClock`](crate::core::SweepClock)): for a death, the first-ranked controller
//! claims at once and two standbys check once each, later, claiming only what nobody
//! claimed; the rest leave it to them and to the sweep. One controller runs the full
//! sweep each period and stamps it; the next in order takes over when the stamps
//! stop. The claim transaction still decides who fences.
//!
//! One loop or job per file: `watch` (membership DELETEs, taken through the
//! [`MembershipFeed`] port, and what this controller does about each), `presence` (the roster of live controllers), `sweep` (the
//! reconciliation sweep), `fence` (the driver of one fence); here the controller
//! itself, its settings and counters, and the supervisor that keeps each loop running.

mod fence;
mod presence;
mod sweep;
mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::core::{OperatorWaits, Roster};
use crate::fencer::Fencer;
use crate::node::NodeId;
use crate::observe::Observer;
use crate::ports::{FenceStore, MembershipFeed};
use crate::store::EtcdStore;

pub use sweep::SweepReport;

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

    fn lock_needs_operator(&self) -> std::sync::MutexGuard<'_, OperatorWaits> {
        self.needs_operator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<S: MembershipFeed> Controller<S> {
    /// Runs the watch and sweep loops, without presence, until the returned task is
    /// aborted: the roster stays as set ([`set_roster`](Self::set_roster); by default
    /// out of sync, so this controller claims every death at once and sweeps every
    /// period, as if alone). The controller over the twin runs this way; the product
    /// runs [`spawn`](Controller::spawn).
    pub fn spawn_watch_and_sweep(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        self.spawn_loops(|_| {})
    }

    /// The supervised sweep and watch loops, the spare claim lease, and what `more`
    /// adds to the set.
    fn spawn_loops(
        self: &Arc<Self>,
        more: impl FnOnce(&mut JoinSet<()>) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
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
            more(&mut fences);
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
}

/// Presence is an etcd lease and a watch of `controller/`: only over [`EtcdStore`].
impl Controller<EtcdStore> {
    /// Runs the watch, sweep and presence loops until the returned task is aborted
    /// (dropping the task aborts every fence it started, like a process death). Each
    /// loop is supervised: one that stops (returns, panics) is reported to the
    /// observer (`/healthz` fails) and started again with backoff.
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let present = self.clone();
        self.spawn_loops(move |fences| {
            fences.spawn(supervise(
                present.cfg.observer.clone(),
                "presence",
                move || present.clone().presence_loop(),
            ));
        })
    }
}

/// The controller's decisions against the in-memory store: logic only (the protocol on
/// a real etcd is `tests/fencing.rs`, `tests/failpoints.rs`, `tests/fault_schedules.rs`).
#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::core::{
        ClaimGuard, Confirmation, FenceFailure, FenceState, FenceStep, SkipReason, Trigger, Victim,
    };
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

    /// Waits (up to 5 s) until `done` holds.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !done() {
            assert!(t0.elapsed() < Duration::from_secs(5), "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Controller `c1` over `store`, its loops running on the twin's membership log,
    /// no sweep at start (so what is fenced, the watch fenced).
    async fn watching(
        store: &MemStore,
        fencer: &Arc<Scripted>,
        watch_from: Option<i64>,
    ) -> (Arc<Controller<MemStore>>, tokio::task::JoinHandle<()>) {
        let mut cfg = ControllerConfig::new("c1");
        cfg.sweep_on_start = false;
        cfg.watch_from = watch_from;
        let c = Controller::new(store.clone(), fencer.clone() as Arc<dyn Fencer>, cfg);
        let task = c.spawn_watch_and_sweep();
        if watch_from.is_none() {
            until("watch started", || {
                c.stats().watch_starts.load(Ordering::SeqCst) >= 1
            })
            .await;
        }
        (c, task)
    }

    #[tokio::test]
    async fn the_watch_loop_fences_a_death_from_the_twins_log() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let (c, task) = watching(&store, &fencer, None).await;
        dead(&store, "n1");
        until("n1 fenced", || c.stats().fenced.load(Ordering::SeqCst) == 1).await;
        assert_eq!(store.generation(&n("n1")), 1);
        assert_eq!(*fencer.instances.lock().unwrap(), ["i-n1"]);
        assert_eq!(c.stats().sweeps.load(Ordering::SeqCst), 0);
        task.abort();
    }

    #[tokio::test]
    async fn a_watch_that_ends_resumes_after_the_last_revision_it_saw() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        let (c, task) = watching(&store, &fencer, None).await;
        store.join(&n("n1"), "i-n1");
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The watch ends and n1 dies before it is back: a watch from "now" would miss
        // the DELETE; one resumed after the last revision seen delivers it.
        store.end_watches();
        store.expire(&n("n1"));
        until("n1 fenced", || c.stats().fenced.load(Ordering::SeqCst) == 1).await;
        assert_eq!(c.stats().watch_starts.load(Ordering::SeqCst), 2);
        assert_eq!(c.stats().sweeps.load(Ordering::SeqCst), 0);
        task.abort();
    }

    #[tokio::test]
    async fn a_compacted_watch_restarts_from_now_and_the_sweep_covers_the_gap() {
        let store = MemStore::new();
        let fencer = Arc::new(Scripted::default());
        store.join(&n("n0"), "i-n0");
        // The controller resumes from n1's join; history up to n1's death is compacted.
        let from = store.join(&n("n1"), "i-n1");
        let died = store.expire(&n("n1"));
        store.compact(died + 1);
        let (c, task) = watching(&store, &fencer, Some(from)).await;
        until("the sweep fenced n1, the watch is back", || {
            c.stats().sweeps.load(Ordering::SeqCst) == 1
                && c.stats().watch_starts.load(Ordering::SeqCst) == 2
        })
        .await;
        assert_eq!(c.stats().fenced.load(Ordering::SeqCst), 1);
        assert_eq!(c.stats().watch_compacted.load(Ordering::SeqCst), 1);
        assert_eq!(store.generation(&n("n1")), 1);
        task.abort();
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
