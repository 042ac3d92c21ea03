//! Randomized fault schedules on a real etcd (issue 8): three in-process controllers
//! per schedule fence agents that die (lease revoked, or left to expire) while fail
//! points make fence steps fail, stall, or crash the controller in the middle of the
//! step (the controller's task is aborted while its fence is stopped at the point).
//!
//! After each schedule settles: every dead node was bumped exactly once, no arena was
//! returned to the free pool while its owner's key was still registered on the shared
//! namespace (checked by a watch on the free pool, at the moment each release lands),
//! the audit records agree, nothing is owed and no claim is left behind; the node that
//! stayed alive and the node that left cleanly were not fenced.
//!
//! One etcd serves every schedule; each has its own key root, namespace and names, and
//! many run at once. Fail points are process-global, so each schedule's faults target
//! its own controllers by id (`fenced::fencer::FaultEffect` documents the syntax).
//!
//! `cargo test -p fenced --features failpoints --test fault_schedules -- --nocapture`
//! Environment: `FENCED_FAULT_SEED` (base seed; printed, random by default),
//! `FENCED_FAULT_SCHEDULES` (default 200), `FENCED_FAULT_ONLY` (run one schedule, by
//! index), `FENCED_FAULT_PARALLEL` (schedules at once, default 16),
//! `FENCED_FAULT_STALL_MS` (stop etcd that long, 4 s into the run). A schedule's plan
//! is reproduced exactly from the seed and index; its timing is not.
#![cfg(feature = "failpoints")]

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::device::{Namespace, can_write};
use common::*;
use etcd_client::{EventType, WatchOptions};
use fenced::agent::{Agent, AgentExit};
use fenced::controller::Controller;
use fenced::core::Confirmation;
use fenced::core::FenceStep;
use fenced::fencer::{
    BoxFuture, FaultEffect, FaultHit, Fencer, NvmeFencer, PreemptMode, fault_hits,
};
use fenced::store::EtcdStore;
use nvme_resv::{Cptpl, Key, Register, RegisterAction, Reservations};
use tokio::task::JoinHandle;

/// The fence steps that have a fail point.
const STEPS: [FenceStep; 5] = [
    FenceStep::Claim,
    FenceStep::Sever,
    FenceStep::Verify,
    FenceStep::Bump,
    FenceStep::ReleaseClaim,
];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| {
        let v = v.trim();
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    })
}

/// splitmix64: small, seedable, good enough to pick schedules.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, index: u64) -> Self {
        Self(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The step fails, `budget` times.
    Error { budget: usize },
    /// The step is performed but its answer is lost, `budget` times.
    Lost { budget: usize },
    /// The step waits `ms`, `budget` times.
    Sleep { ms: u64, budget: usize },
    /// The controller crashes at the step (once).
    Crash,
}

impl Kind {
    fn effect(self) -> String {
        match self {
            Kind::Error { .. } => "error".into(),
            Kind::Lost { .. } => "lost".into(),
            Kind::Sleep { ms, .. } => format!("sleep:{ms}"),
            Kind::Crash => "crash".into(),
        }
    }
    fn budget(self) -> usize {
        match self {
            Kind::Error { budget } | Kind::Lost { budget } | Kind::Sleep { budget, .. } => budget,
            Kind::Crash => 1,
        }
    }
    fn matches(self, effect: FaultEffect) -> bool {
        matches!(
            (self, effect),
            (Kind::Error { .. }, FaultEffect::Error)
                | (Kind::Lost { .. }, FaultEffect::Lost)
                | (Kind::Sleep { .. }, FaultEffect::Sleep(_))
                | (Kind::Crash, FaultEffect::Crash)
        )
    }
}

#[derive(Debug, Clone)]
struct Fault {
    step: FenceStep,
    /// A controller id, or the schedule's prefix followed by `*`.
    target: String,
    kind: Kind,
}

impl Fault {
    fn point(&self) -> String {
        format!("fence::{}", self.step.name())
    }
    fn covers(&self, hit: &FaultHit) -> bool {
        let target = match self.target.strip_suffix('*') {
            Some(prefix) => hit.controller.starts_with(prefix),
            None => hit.controller == self.target,
        };
        target && hit.step == self.step && self.kind.matches(hit.effect)
    }
}

/// One dying node: its arenas and whether its lease is revoked (else it expires).
#[derive(Debug, Clone)]
struct Victim {
    node: String,
    arenas: usize,
    revoke: bool,
    /// A fresh agent of the same node starts this long after the death (it joins as
    /// soon as no fence claim blocks it).
    rejoin_ms: Option<u64>,
}

#[derive(Debug, Clone)]
struct Plan {
    prefix: String,
    victims: Vec<Victim>,
    /// A node that stays alive (never fenced), with this many arenas.
    survivor: Option<usize>,
    /// A node that leaves cleanly (departure honoured, never fenced).
    leaver: Option<usize>,
    faults: Vec<Fault>,
    /// How long a crashed controller stays down before it restarts.
    restart_ms: u64,
}

impl Plan {
    fn new(seed: u64, index: usize) -> Self {
        let mut rng = Rng::new(seed, index as u64);
        let prefix = format!("s{index}-");
        let victims = (0..rng.range(1, 3))
            .map(|v| Victim {
                node: format!("{prefix}v{v}"),
                arenas: rng.range(0, 2) as usize,
                revoke: rng.chance(70),
                rejoin_ms: rng.chance(20).then(|| rng.range(0, 2500)),
            })
            .collect();
        let survivor = rng.chance(50).then(|| rng.range(0, 2) as usize);
        let leaver = rng.chance(25).then(|| rng.range(0, 2) as usize);
        let mut faults = Vec::new();
        let wide = format!("{prefix}*");
        // The first 20 schedules each force one (step, kind) pair on the whole
        // schedule, so every pair is injected in every run; the rest are random.
        let forced = (index < 20).then(|| (STEPS[index % 5], (index / 5) as u64));
        for round in 0..(if rng.chance(35) { 2 } else { 1 }) {
            let forced = forced.filter(|_| round == 0);
            let step = match forced {
                Some((step, _)) => step,
                None => STEPS[rng.below(STEPS.len() as u64) as usize],
            };
            let roll = match forced {
                Some((_, 0)) => 0,
                Some((_, 1)) => 30,
                Some((_, 2)) => 45,
                Some(_) => 99,
                None => rng.below(100),
            };
            let kind = match roll {
                0..30 => Kind::Error {
                    budget: rng.range(1, 4) as usize,
                },
                30..45 => Kind::Lost {
                    budget: rng.range(1, 3) as usize,
                },
                45..70 => Kind::Sleep {
                    ms: if rng.chance(15) {
                        // Longer than the claim TTL: the claim expires under the fence.
                        rng.range(3200, 4000)
                    } else {
                        rng.range(20, 800)
                    },
                    budget: rng.range(1, 3) as usize,
                },
                _ => Kind::Crash,
            };
            // A crash past the claim reaches only the controller that won it, so it
            // targets the whole schedule; errors, sleeps and claim crashes pick one
            // controller or all.
            let target = if forced.is_some()
                || (kind == Kind::Crash && step != FenceStep::Claim)
                || rng.chance(50)
            {
                wide.clone()
            } else {
                format!("{prefix}c{}", rng.range(1, 3))
            };
            if step == FenceStep::ReleaseClaim {
                // `release_claim` runs only after a failed sever or verify.
                faults.push(Fault {
                    step: if rng.chance(50) {
                        FenceStep::Sever
                    } else {
                        FenceStep::Verify
                    },
                    target: target.clone(),
                    kind: Kind::Error {
                        budget: rng.range(1, 3) as usize,
                    },
                });
            }
            faults.push(Fault { step, target, kind });
        }
        // One fault per (point, target): the fail point's argument holds one effect each.
        let mut seen = Vec::new();
        faults.retain(|f| {
            let key = (f.point(), f.target.clone());
            let fresh = !seen.contains(&key);
            seen.push(key);
            fresh
        });
        // A crash is checked against the claim it holds: no sleep may outlive the claim.
        if faults.iter().any(|f| f.kind == Kind::Crash) {
            for f in &mut faults {
                if let Kind::Sleep { ms, .. } = &mut f.kind {
                    *ms = (*ms).min(400);
                }
            }
        }
        Self {
            prefix,
            victims,
            survivor,
            leaver,
            faults,
            restart_ms: rng.range(0, 1500),
        }
    }

    fn controllers(&self) -> Vec<String> {
        (1..=3).map(|c| format!("{}c{c}", self.prefix)).collect()
    }
}

/// Every active fault, by fail point and target; each point's `fail` configuration is
/// rebuilt from this when it changes (all schedules share the process's fail points).
static TABLE: Mutex<BTreeMap<String, BTreeMap<String, String>>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn set_fault(f: &Fault, on: bool) {
    let mut table = lock(&TABLE);
    let entries = table.entry(f.point()).or_default();
    if on {
        entries.insert(f.target.clone(), f.kind.effect());
    } else {
        entries.remove(&f.target);
    }
    if entries.is_empty() {
        fail::remove(f.point());
    } else {
        let arg = entries
            .iter()
            .map(|(t, e)| format!("{t}={e}"))
            .collect::<Vec<_>>()
            .join(",");
        fail::cfg(f.point(), &format!("return({arg})")).expect("fail point configuration");
    }
}

/// What all schedules did (the summary line).
#[derive(Debug, Default)]
struct Totals {
    schedules: usize,
    victims: usize,
    revoked: usize,
    expired: usize,
    survivors: usize,
    live_expired: usize,
    rejoined: usize,
    rejoin_failed: usize,
    leavers: usize,
    leaves_incomplete: usize,
    setup_retries: usize,
    /// Fail point hits by (step, effect).
    hits: BTreeMap<(String, &'static str), usize>,
    /// Controllers aborted while stopped at a point, by step.
    crashes: BTreeMap<String, usize>,
    restarts: usize,
    crash_states_checked: usize,
    long_sleeps: usize,
    arenas_released: usize,
    failed_attempts_audited: usize,
    settle_ms: Vec<u64>,
}

fn effect_name(e: FaultEffect) -> &'static str {
    match e {
        FaultEffect::Error => "error",
        FaultEffect::Lost => "lost",
        FaultEffect::Sleep(_) => "sleep",
        FaultEffect::Crash => "crash",
    }
}

struct Ctl {
    id: String,
    task: Option<JoinHandle<()>>,
}

/// The per-schedule world: a root on the shared etcd, a namespace, three controllers.
struct World {
    endpoint: String,
    root: String,
    ns: Namespace,
    store: EtcdStore,
    /// Controllers fence with [`Liar`] (the checks' own test).
    liar: bool,
}

/// A fencer that confirms without severing anything: the schedules' checks must
/// catch it.
#[derive(Debug)]
struct Liar;

impl Fencer for Liar {
    fn name(&self) -> &'static str {
        "nvme"
    }
    fn fence<'a>(&'a self, _victim: &'a fenced::core::Victim) -> BoxFuture<'a, FenceResult> {
        Box::pin(async {
            Ok(Confirmation {
                fencer: "nvme".into(),
                severed: true,
                evidence: "lying: nothing was preempted".into(),
            })
        })
    }
}

type FenceResult = Result<Confirmation, fenced::fencer::FenceError>;

/// Why a schedule failed: its set-up could not complete (the machine or etcd stalled
/// before any fault; the schedule is run again), or it broke something.
#[derive(Debug)]
enum Failure {
    Setup(String),
    Broken(String),
}

fn broken(e: impl std::fmt::Display) -> Failure {
    Failure::Broken(e.to_string())
}

/// Retries a harness read or write for up to 20 s: the checks must not fail because
/// a loaded machine stalled etcd for a moment.
async fn retry<T, F, Fut>(what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, fenced::store::StoreError>>,
{
    let t0 = Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                tracing::warn!(what, error = %e, "harness request failed, retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

impl World {
    async fn connect(&self) -> Result<EtcdStore, String> {
        retry("connect", || {
            EtcdStore::connect(std::slice::from_ref(&self.endpoint), &self.root, CLAIM_TTL)
        })
        .await
    }

    fn can_write(&self, n: &str) -> bool {
        can_write(&self.ns.host(host_id(n)))
    }

    async fn start_controller(&self, id: &str) -> Result<Ctl, String> {
        let fencer: Arc<dyn Fencer> = if self.liar {
            Arc::new(Liar)
        } else {
            Arc::new(NvmeFencer::new(
                Arc::new(self.ns.host(host_id(id))),
                key_of(id),
                PreemptMode::PreemptAndAbort,
            ))
        };
        let mut cfg = fenced::controller::ControllerConfig::new(id);
        cfg.sweep_interval = Duration::from_millis(500);
        let controller = Controller::new(self.connect().await?, fencer, cfg);
        let task = Some(controller.spawn());
        Ok(Ctl {
            id: id.to_owned(),
            task,
        })
    }

    /// Starts the agent of `n` on the shared namespace (`what`: "start" or "restart",
    /// for the error).
    async fn start_agent(
        &self,
        c: &Cluster,
        n: &str,
        arenas: usize,
        what: &str,
    ) -> Result<Agent, String> {
        Agent::start(
            self.connect().await?,
            c.agent_cfg(n, arenas),
            Some(Arc::new(self.ns.host(host_id(n)))),
            key_of(n),
        )
        .await
        .map_err(|e| format!("agent {n} {what}: {e}"))
    }

    async fn agent(&self, c: &Cluster, n: &str, arenas: usize) -> Result<RunningAgent, String> {
        let agent = self.start_agent(c, n, arenas, "start").await?;
        Ok(RunningAgent::spawn(agent))
    }

    /// A fresh start of `n`: the agent and the generation it joined with.
    async fn rejoin(
        &self,
        c: &Cluster,
        n: &str,
        arenas: usize,
    ) -> Result<(RunningAgent, u64), String> {
        let agent = self.start_agent(c, n, arenas, "restart").await?;
        let generation = agent.generation();
        Ok((RunningAgent::spawn(agent), generation))
    }

    async fn generation(&self, n: &str) -> Result<u64, String> {
        let n = node(n);
        retry("read a generation", || self.store.generation(&n))
            .await
            .map(|g| g.0)
    }

    async fn status(&self) -> Result<fenced::store::Status, String> {
        retry("status", || self.store.status()).await
    }

    /// Revokes a dead agent's lease (already expired under a stall: fine).
    async fn revoke(&self, lease: i64) -> Result<(), String> {
        retry("revoke", || async {
            match self.store.revoke(lease).await {
                Err(e) if e.is_lease_gone() => Ok(()),
                r => r,
            }
        })
        .await
    }
}

/// Registers a controller's own key: a fencer preempts only as a registrant.
fn register_controller(ns: &Namespace, id: &str) {
    ns.host(host_id(id))
        .register(&Register {
            rrega: RegisterAction::Register,
            crkey: Key(0),
            nrkey: key_of(id),
            iekey: false,
            cptpl: Cptpl::NoChange,
        })
        .expect("register the controller's key");
}

/// Watches the schedule's keys from before the first death: every arena a fence
/// returns to the free pool (an audit record in the same revision) must belong to a
/// node whose key is gone from the namespace at that moment. (A node that gives its
/// own arenas back when it leaves has quiesced first; that is the protocol's.)
fn watch_free_pool(
    world: &Arc<World>,
    violations: Arc<Mutex<Vec<String>>>,
) -> impl std::future::Future<Output = Result<JoinHandle<()>, String>> {
    let world = world.clone();
    async move {
        let keys = world.store.keys().clone();
        let audit_prefix = keys.audit_prefix();
        let mut client = world.store.client();
        let mut stream = client
            .watch(
                keys.root(),
                Some(WatchOptions::new().with_prefix().with_prev_key()),
            )
            .await
            .map_err(|e| format!("watch the schedule's keys: {e}"))?;
        Ok(tokio::spawn(async move {
            loop {
                let msg = match stream.message().await {
                    Ok(Some(msg)) => msg,
                    end => {
                        // The checks would go blind: that fails the schedule.
                        lock(&violations).push(format!("free-pool watch ended: {end:?}"));
                        return;
                    }
                };
                let mut audited = Vec::new();
                for ev in msg.events() {
                    let Some(kv) = ev.kv() else { continue };
                    if ev.event_type() == EventType::Put
                        && kv.key().starts_with(audit_prefix.as_bytes())
                    {
                        audited.push(kv.mod_revision());
                    }
                }
                // A fence frees an arena by deleting its owner's claim
                // `arena_claim/<arena>/<owner>` (the key names the owner).
                for ev in msg.events() {
                    let Some(kv) = ev.kv() else { continue };
                    if ev.event_type() != EventType::Delete {
                        continue;
                    }
                    let Ok((arena, owner)) = keys.decode_arena_claim_key(kv.key()) else {
                        continue;
                    };
                    let rev = kv.mod_revision();
                    if !audited.contains(&rev) {
                        continue;
                    }
                    let owner = owner.as_str();
                    if !world.can_write(owner) {
                        continue;
                    }
                    // Registered now: a fresh start of the owner that joined after this
                    // release may have registered it since. Anything else is a release
                    // before severance.
                    let joined = world
                        .store
                        .client()
                        .get(keys.membership(&node(owner)), None)
                        .await
                        .ok()
                        .and_then(|r| r.kvs().first().map(etcd_client::KeyValue::create_revision));
                    if joined.is_none_or(|j| j < rev) {
                        lock(&violations).push(format!(
                            "arena {arena} returned to the free pool (rev {rev}) while its owner \
                             {owner} can still write (key registered, membership {joined:?})"
                        ));
                    }
                }
            }
        }))
    }
}

/// What one schedule did.
#[derive(Debug, Default)]
struct Outcome {
    hits: Vec<FaultHit>,
    crashes: Vec<FenceStep>,
    restarts: usize,
    crash_states_checked: usize,
    arenas_released: usize,
    failed_attempts_audited: usize,
    /// Live nodes whose lease expired under a stall (fenced, legitimately).
    live_expired: usize,
    /// Fresh starts of dead nodes that joined again, and that could not.
    rejoined: usize,
    rejoin_failed: usize,
    /// Every node's final generation (checked against its audit records).
    generations: Vec<(String, u64)>,
    /// The leaving node did not finish leaving (it was fenced, legitimately).
    leave_incomplete: bool,
    settle: Duration,
}

/// Checks the state a crashed fence left: the controller really stopped inside `step`.
/// `Ok(false)`: not checked, the check came too late to be sure the claim was still
/// held (a stalled machine).
async fn check_crash_state(world: &World, hit: &FaultHit) -> Result<bool, String> {
    let status = world.status().await?;
    let late = hit.at.elapsed() > Duration::from_millis(500);
    let held = status
        .claims
        .iter()
        .any(|(n, by)| *n == hit.node && *by == hit.controller);
    let generation = world.generation(&hit.node).await?;
    let writes = world.can_write(&hit.node);
    let ok = match hit.step {
        // Before the claim transaction: nothing of this attempt is in etcd.
        FenceStep::Claim => true,
        // Claimed, not yet preempted.
        FenceStep::Sever => held && writes && generation == 0,
        // Preempted, not confirmed, not bumped.
        FenceStep::Verify | FenceStep::Bump => held && !writes && generation == 0,
        // A failed fence holding its claim.
        FenceStep::ReleaseClaim => held && generation == 0,
        _ => false,
    };
    if ok {
        Ok(true)
    } else if late {
        Ok(false)
    } else {
        Err(format!(
            "crash of {} at {} on {}: claim held {held}, key registered {writes}, generation \
             {generation} (claims {:?})",
            hit.controller, hit.step, hit.node, status.claims
        ))
    }
}

async fn run_schedule(
    c: Arc<Cluster>,
    root: String,
    plan: Plan,
    liar: bool,
) -> Result<Outcome, Failure> {
    let setup = Failure::Setup;
    let world = {
        let endpoint = c.etcd.endpoint();
        let store = retry("connect", || {
            EtcdStore::connect(std::slice::from_ref(&endpoint), &root, CLAIM_TTL)
        })
        .await
        .map_err(setup)?;
        Arc::new(World {
            endpoint,
            root,
            ns: Namespace::new(),
            store,
            liar,
        })
    };
    let ids = plan.controllers();
    for id in &ids {
        register_controller(&world.ns, id);
    }
    let p = &plan.prefix;
    let wanted = plan.victims.iter().map(|v| v.arenas).sum::<usize>()
        + plan.survivor.unwrap_or(0)
        + plan.leaver.unwrap_or(0);
    let arenas: Vec<String> = (0..wanted).map(|a| format!("{p}a{a}")).collect();
    retry("add free arenas", || world.store.add_free_arenas(&arenas))
        .await
        .map_err(setup)?;

    // Agents first (their arenas are known before anyone dies), then the controllers.
    let mut agents = Vec::new();
    let survivor_name = format!("{p}live");
    let leaver_name = format!("{p}leaves");
    let mut names: Vec<(&str, usize)> = plan
        .victims
        .iter()
        .map(|v| (v.node.as_str(), v.arenas))
        .collect();
    names.extend(plan.survivor.map(|n| (survivor_name.as_str(), n)));
    names.extend(plan.leaver.map(|n| (leaver_name.as_str(), n)));
    for (n, arenas) in names {
        match world.agent(&c, n, arenas).await {
            Ok(a) => agents.push(a),
            Err(e) => {
                for a in &agents {
                    a.kill();
                    let _ = world.revoke(a.lease).await;
                }
                return Err(Failure::Setup(e));
            }
        }
    }
    let leaver = plan.leaver.and_then(|_| agents.pop());
    let survivor = plan.survivor.and_then(|_| agents.pop());
    let victims = agents;
    let violations = Arc::new(Mutex::new(Vec::new()));
    let watcher = watch_free_pool(&world, violations.clone())
        .await
        .map_err(setup)?;
    let mut ctls: Vec<Ctl> = Vec::new();
    for id in &ids {
        match world.start_controller(id).await {
            Ok(ctl) => ctls.push(ctl),
            Err(e) => {
                for t in ctls.iter_mut().filter_map(|c| c.task.take()) {
                    t.abort();
                }
                for a in victims.iter().chain(&survivor).chain(&leaver) {
                    a.kill();
                    let _ = world.revoke(a.lease).await;
                }
                watcher.abort();
                return Err(Failure::Setup(e));
            }
        }
    }

    let result = drive(
        &c, &world, &plan, &arenas, &mut ctls, &victims, &survivor, leaver,
    )
    .await;

    for ctl in &mut ctls {
        if let Some(t) = ctl.task.take() {
            t.abort();
        }
    }
    for f in &plan.faults {
        set_fault(f, false);
    }
    let rejoined = result.as_ref().map_or(&[][..], |(_, r)| r.as_slice());
    for a in survivor.iter().chain(rejoined) {
        a.kill();
        let _ = world.revoke(a.lease).await;
    }
    watcher.abort();
    let mut found = lock(&violations).clone();
    let mut outcome = match result {
        Ok((o, _)) if found.is_empty() => o,
        Ok(_) => return Err(Failure::Broken(found.join("; "))),
        Err(e) => {
            found.push(e);
            return Err(Failure::Broken(found.join("; ")));
        }
    };
    // Audit: one audited bump per generation step of every node (a dead node was
    // bumped exactly once per death); arenas released only with a confirmed severance.
    for (v, generation) in outcome.generations.clone() {
        let n = node(&v);
        let records = retry("audit records", || world.store.audit_records(&n))
            .await
            .map_err(broken)?;
        let mut bumps = 0;
        for r in &records {
            let result = r["fencer_result"].as_str().unwrap_or_default();
            let released = r["arenas_released"].as_array().map_or(0, Vec::len);
            let before = r["generation_before"].as_u64().unwrap_or_default();
            let after = r["generation_after"].as_u64().unwrap_or_default();
            if after > before {
                bumps += 1;
                outcome.arenas_released += released;
            } else {
                outcome.failed_attempts_audited += 1;
            }
            if released > 0 && result != "confirmed" {
                return Err(Failure::Broken(format!(
                    "{v}: arenas released by an unconfirmed fence: {r}"
                )));
            }
        }
        if bumps != generation {
            return Err(Failure::Broken(format!(
                "{v}: {bumps} audited bumps, generation {generation}: {records:?}"
            )));
        }
    }
    outcome.hits = fault_hits(p);
    Ok(outcome)
}

/// Kills the victims under the plan's faults, crashes and restarts controllers, then
/// waits for the system to settle and checks it.
#[allow(clippy::too_many_arguments)]
async fn drive(
    c: &Arc<Cluster>,
    world: &Arc<World>,
    plan: &Plan,
    arenas: &[String],
    ctls: &mut [Ctl],
    victims: &[RunningAgent],
    survivor: &Option<RunningAgent>,
    leaver: Option<RunningAgent>,
) -> Result<(Outcome, Vec<RunningAgent>), String> {
    let mut outcome = Outcome::default();
    for f in &plan.faults {
        set_fault(f, true);
    }
    let mut active: Vec<bool> = vec![true; plan.faults.len()];
    let mut rejoins = Vec::new();
    for (a, v) in victims.iter().zip(&plan.victims) {
        a.kill();
        if v.revoke {
            world.revoke(a.lease).await?;
        }
        if let Some(ms) = v.rejoin_ms {
            let (c, world, v) = (c.clone(), world.clone(), v.clone());
            rejoins.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                (v.node.clone(), world.rejoin(&c, &v.node, v.arenas).await)
            }));
        }
    }
    let leaver_name = leaver.as_ref().map(|l| l.node.to_string());
    let leaving = leaver.map(|l| tokio::spawn(l.leave()));
    let t0 = Instant::now();
    let mut seen = 0;
    let mut down: Vec<(usize, Instant)> = Vec::new();
    let mut last_gen_check = Instant::now();
    // Fault phase: until every fault is spent, every victim is bumped, or 8 s.
    loop {
        let hits = fault_hits(&plan.prefix);
        for hit in &hits[seen..] {
            for (i, f) in plan.faults.iter().enumerate() {
                if active[i] && f.covers(hit) {
                    let used = hits.iter().filter(|h| f.covers(h)).count();
                    if used >= f.kind.budget() {
                        set_fault(f, false);
                        active[i] = false;
                    }
                }
            }
            if hit.effect == FaultEffect::Crash {
                let Some(at) = ctls.iter().position(|c| c.id == hit.controller) else {
                    return Err(format!("unknown controller {}", hit.controller));
                };
                if let Some(task) = ctls[at].task.take() {
                    task.abort();
                    let _ = task.await;
                    if check_crash_state(world, hit).await? {
                        outcome.crash_states_checked += 1;
                    }
                    outcome.crashes.push(hit.step);
                    down.push((at, Instant::now()));
                }
            }
        }
        seen = hits.len();
        if t0.elapsed() > Duration::from_secs(8) {
            // Faults that never found their target are dropped.
            for (f, on) in plan.faults.iter().zip(&mut active) {
                if *on {
                    set_fault(f, false);
                    *on = false;
                }
            }
        }
        // Restart crashed controllers once their crash fault is spent.
        let crash_pending = plan
            .faults
            .iter()
            .zip(&active)
            .any(|(f, on)| *on && f.kind == Kind::Crash);
        let mut still_down = Vec::new();
        for (at, since) in down.drain(..) {
            if !crash_pending && since.elapsed() >= Duration::from_millis(plan.restart_ms) {
                let id = ctls[at].id.clone();
                ctls[at] = world.start_controller(&id).await?;
                outcome.restarts += 1;
            } else {
                still_down.push((at, since));
            }
        }
        down = still_down;
        if down.is_empty() && (!active.iter().any(|a| *a) || t0.elapsed() > Duration::from_secs(8))
        {
            break;
        }
        if last_gen_check.elapsed() > Duration::from_millis(250) {
            last_gen_check = Instant::now();
            let mut all = true;
            for v in &plan.victims {
                all &= world.generation(&v.node).await? >= 1;
            }
            if all && down.is_empty() {
                break;
            }
        }
        if t0.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "fault phase did not end: crashed controllers {down:?} not restarted"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for f in &plan.faults {
        set_fault(f, false);
    }
    // Dead nodes and the generation each must end at; live nodes and the generation
    // each joined with.
    let mut dead: Vec<(String, u64)> = Vec::new();
    let mut live: Vec<(String, u64, Vec<String>)> = Vec::new();
    let mut rejoined = Vec::new();
    for r in rejoins {
        let (name, r) = r.await.map_err(|e| format!("rejoin task: {e}"))?;
        match r {
            Ok((agent, generation)) => {
                outcome.rejoined += 1;
                live.push((name, generation, agent.arenas.clone()));
                rejoined.push(agent);
            }
            Err(e) => {
                tracing::info!(node = %name, error = %e, "fresh start failed: stays dead");
                outcome.rejoin_failed += 1;
            }
        }
    }
    for v in &plan.victims {
        if !live.iter().any(|(n, ..)| *n == v.node) {
            dead.push((v.node.clone(), 1));
        }
    }
    if let Some(s) = survivor {
        live.push((s.node.to_string(), 0, s.arenas.clone()));
    }
    if let (Some(l), Some(name)) = (leaving, leaver_name) {
        let exit = l.await.map_err(|e| format!("leaver: {e}"))?;
        if exit == AgentExit::Left {
            outcome.generations.push((name, 0));
        } else {
            // It could not finish leaving (its lease expired under a stall): the
            // peers owe it a fence like any dead node.
            outcome.leave_incomplete = true;
            dead.push((name, 1));
        }
    }
    match settle_and_check(world, arenas, &mut outcome, dead, live).await {
        // The fresh starts stop after the controllers (else they would be fenced).
        Ok(()) => Ok((outcome, rejoined)),
        Err(e) => {
            for a in &rejoined {
                a.kill();
            }
            Err(e)
        }
    }
}

/// Waits until every dead node is bumped to its generation, nothing is owed and no
/// claim is held, then checks one snapshot. A live node whose lease expires meanwhile
/// (a stalled machine) is dead from then on, and the system must settle again.
async fn settle_and_check(
    world: &World,
    arenas: &[String],
    outcome: &mut Outcome,
    mut dead: Vec<(String, u64)>,
    mut live: Vec<(String, u64, Vec<String>)>,
) -> Result<(), String> {
    let t0 = Instant::now();
    let (status, could_write) = loop {
        let settle_from = Instant::now();
        let deadline = Duration::from_secs(30);
        loop {
            let status = world.status().await?;
            let mut bumped = true;
            for (v, want) in &dead {
                bumped &= world.generation(v).await? >= *want;
            }
            let dead_member = status
                .members
                .iter()
                .any(|(n, _)| dead.iter().any(|(d, _)| d == n));
            if bumped && status.owed.is_empty() && status.claims.is_empty() && !dead_member {
                break;
            }
            if settle_from.elapsed() > deadline {
                return Err(format!(
                    "did not settle in {deadline:?}: owed {:?}, claims {:?}, members {:?}, \
                     generations {:?}",
                    status.owed, status.claims, status.members, status.generations
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        outcome.settle += t0.elapsed();
        // Late or duplicated events must not bump again: look once more after a while,
        // at one snapshot. Live nodes' keys are read first: a node the snapshot still
        // shows a member was one all along, so nobody may have preempted it.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let could_write: Vec<bool> = live.iter().map(|(n, ..)| world.can_write(n)).collect();
        let status = world.status().await?;
        let gone: Vec<usize> = (0..live.len())
            .filter(|&i| !status.members.iter().any(|(m, _)| *m == live[i].0))
            .collect();
        if gone.is_empty() {
            break (status, could_write);
        }
        for i in gone.into_iter().rev() {
            // Its lease expired under a stall (it self-fences): it is owed a fence.
            let (n, g, _) = live.remove(i);
            outcome.live_expired += 1;
            dead.push((n, g + 1));
        }
    };
    let generation = |n: &str| {
        status
            .generations
            .iter()
            .find(|(m, _)| m == n)
            .map_or(0, |(_, g)| *g)
    };
    for (v, want) in &dead {
        let g = generation(v);
        if g != *want {
            return Err(format!("{v}: generation {g} after settling (want {want})"));
        }
        if world.can_write(v) {
            return Err(format!("{v}: bumped but its key is still registered"));
        }
        outcome.generations.push((v.clone(), g));
    }
    if !status.owed.is_empty() || !status.claims.is_empty() {
        return Err(format!(
            "after settling: owed {:?}, claims {:?}",
            status.owed, status.claims
        ));
    }
    let owner = |arena: &String| {
        status
            .arenas
            .iter()
            .find(|(a, _)| a == arena)
            .map(|(_, o)| o.clone())
    };
    // Live nodes were never fenced, kept their keys and own their arenas.
    for ((n, joined, owned), wrote) in live.iter().zip(&could_write) {
        let g = generation(n);
        if g != *joined {
            let audit = world.store.audit_records(&node(n)).await;
            return Err(format!(
                "live node {n} joined at generation {joined} but is at {g}; audit {audit:?}"
            ));
        }
        if !wrote {
            return Err(format!("live node {n} lost its key"));
        }
        for arena in owned {
            if owner(arena).as_deref() != Some(n.as_str()) {
                return Err(format!("live node {n}: arena {arena} not its own any more"));
            }
        }
        outcome.generations.push((n.clone(), g));
    }
    // No arena is lost or left to a dead node.
    for arena in arenas {
        match owner(arena) {
            Some(o) if dead.iter().any(|(d, _)| *d == o) => {
                return Err(format!("arena {arena} still owned by dead node {o}"));
            }
            Some(_) => {}
            None if status.free_arenas.contains(arena) => {}
            None => return Err(format!("arena {arena} neither owned nor free")),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomized_fault_schedules_keep_the_invariants() {
    let scenario = fail::FailScenario::setup();
    let seed = env_u64("FENCED_FAULT_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Rng::new(t.as_nanos() as u64, u64::from(std::process::id())).next()
    });
    let count = env_u64("FENCED_FAULT_SCHEDULES").unwrap_or(200) as usize;
    let parallel = env_u64("FENCED_FAULT_PARALLEL").unwrap_or(16).max(1) as usize;
    let only = env_u64("FENCED_FAULT_ONLY").map(|i| i as usize);
    println!("fault schedules: FENCED_FAULT_SEED={seed:#x}");
    let indices: Vec<usize> = match only {
        Some(i) => vec![i],
        None => (0..count).collect(),
    };
    let c = Arc::new(Cluster::new());
    let started = Instant::now();
    if let Some(ms) = env_u64("FENCED_FAULT_STALL_MS") {
        // A stalled etcd (SIGSTOP, then SIGCONT) 4 s into the run: leases of live
        // nodes may expire; such nodes must then be fenced exactly once.
        let pid = c.etcd.pid().to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let signal = |s: &str| {
                std::process::Command::new("kill")
                    .args([s, &pid])
                    .status()
                    .expect("kill")
            };
            println!("fault schedules: etcd stopped for {ms} ms");
            signal("-STOP");
            tokio::time::sleep(Duration::from_millis(ms)).await;
            signal("-CONT");
        });
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut tasks = Vec::new();
    for &i in &indices {
        let plan = Plan::new(seed, i);
        let (c, gate) = (c.clone(), gate.clone());
        tasks.push((
            i,
            plan.clone(),
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("semaphore");
                // A set-up that a stalled machine broke before any fault is run again.
                let mut setups = Vec::new();
                for attempt in 0..3 {
                    let root = format!("/fault-{seed:016x}/{i}/{attempt}");
                    match run_schedule(c.clone(), root, plan.clone(), false).await {
                        Err(Failure::Setup(e)) => setups.push(e),
                        r => return (r, setups.len()),
                    }
                }
                (Err(Failure::Setup(setups.join("; "))), setups.len())
            }),
        ));
    }
    let mut totals = Totals::default();
    let mut failures = Vec::new();
    for (i, plan, task) in tasks {
        let r = match task.await {
            Ok((r, setups)) => {
                totals.setup_retries += setups;
                r.map_err(|f| match f {
                    Failure::Setup(e) => format!("set-up failed 3 times: {e}"),
                    Failure::Broken(e) => e,
                })
            }
            Err(e) => Err(format!("schedule task failed: {e}")),
        };
        match r {
            Ok(o) => {
                totals.schedules += 1;
                totals.victims += plan.victims.len();
                totals.revoked += plan.victims.iter().filter(|v| v.revoke).count();
                totals.expired += plan.victims.iter().filter(|v| !v.revoke).count();
                totals.survivors += usize::from(plan.survivor.is_some());
                totals.leavers += usize::from(plan.leaver.is_some());
                totals.live_expired += o.live_expired;
                totals.rejoined += o.rejoined;
                totals.rejoin_failed += o.rejoin_failed;
                totals.leaves_incomplete += usize::from(o.leave_incomplete);
                for h in &o.hits {
                    *totals
                        .hits
                        .entry((h.step.name().to_owned(), effect_name(h.effect)))
                        .or_default() += 1;
                    if matches!(h.effect, FaultEffect::Sleep(d) if d > CLAIM_TTL) {
                        totals.long_sleeps += 1;
                    }
                }
                for s in &o.crashes {
                    *totals.crashes.entry(s.name().to_owned()).or_default() += 1;
                }
                totals.restarts += o.restarts;
                totals.crash_states_checked += o.crash_states_checked;
                totals.arenas_released += o.arenas_released;
                totals.failed_attempts_audited += o.failed_attempts_audited;
                totals
                    .settle_ms
                    .push(u64::try_from(o.settle.as_millis()).unwrap_or(u64::MAX));
            }
            Err(e) => failures.push(format!(
                "schedule {i} (reproduce: FENCED_FAULT_SEED={seed:#x} FENCED_FAULT_ONLY={i}): \
                 {e}\n  plan: {plan:?}"
            )),
        }
    }
    let elapsed = started.elapsed();
    totals.settle_ms.sort_unstable();
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    let mut detail = String::new();
    for ((step, kind), n) in &totals.hits {
        *by_kind.entry(kind).or_default() += n;
        let _ = write!(detail, " {step}/{kind}={n}");
    }
    let crashes: usize = totals.crashes.values().sum();
    println!(
        "fault schedules: seed {seed:#x}: {} schedules ok, {} failed, in {:.1} s; victims {} \
         (revoked {}, expired {}), fresh starts {} ({} refused), live nodes {}, live nodes expired under load then \
         fenced {}, leaving nodes {} ({} could not \
         finish, then fenced); set-ups retried {}; faults injected {} \
         (error {}, lost answer {}, sleep {} of which {} beyond the claim TTL, crash {}):{detail}; \
         controllers crashed mid-step {crashes} {:?} (state at the crash checked for {}), \
         restarted {}; arenas released {}, failed \
         attempts audited {}; settle p50 {} ms max {} ms",
        totals.schedules,
        failures.len(),
        elapsed.as_secs_f64(),
        totals.victims,
        totals.revoked,
        totals.expired,
        totals.rejoined + totals.rejoin_failed,
        totals.rejoin_failed,
        totals.survivors,
        totals.live_expired,
        totals.leavers,
        totals.leaves_incomplete,
        totals.setup_retries,
        by_kind.values().sum::<usize>(),
        by_kind.get("error").copied().unwrap_or(0),
        by_kind.get("lost").copied().unwrap_or(0),
        by_kind.get("sleep").copied().unwrap_or(0),
        totals.long_sleeps,
        by_kind.get("crash").copied().unwrap_or(0),
        totals.crashes,
        totals.crash_states_checked,
        totals.restarts,
        totals.arenas_released,
        totals.failed_attempts_audited,
        totals
            .settle_ms
            .get(totals.settle_ms.len() / 2)
            .copied()
            .unwrap_or(0),
        totals.settle_ms.last().copied().unwrap_or(0),
    );
    scenario.teardown();
    assert!(
        failures.is_empty(),
        "{} of {} schedules broke an invariant (seed {seed:#x}):\n{}",
        failures.len(),
        indices.len(),
        failures.join("\n")
    );
    if only.is_none() && count >= 20 {
        // The run must really have exercised every step with every kind of fault.
        for step in STEPS {
            for kind in ["error", "lost", "sleep", "crash"] {
                let n = totals
                    .hits
                    .get(&(step.name().to_owned(), kind))
                    .copied()
                    .unwrap_or(0);
                assert!(n > 0, "no {kind} fault hit at {step} in {count} schedules");
            }
            assert!(
                totals.crashes.get(step.name()).copied().unwrap_or(0) > 0,
                "no controller crashed at {step}"
            );
        }
    }
}

/// The checks themselves: a fencer that confirms without preempting lets arenas return
/// to the free pool while their dead owner's key is still registered, and the free-pool
/// watch must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checks_catch_a_fencer_that_does_not_sever() {
    let c = Arc::new(Cluster::new());
    let plan = Plan {
        prefix: "liar-".into(),
        victims: vec![Victim {
            node: "liar-v0".into(),
            arenas: 2,
            revoke: true,
            rejoin_ms: None,
        }],
        survivor: Some(1),
        leaver: None,
        faults: Vec::new(),
        restart_ms: 0,
    };
    let err = match run_schedule(c, "/liar".into(), plan, true).await {
        Err(Failure::Broken(e)) => e,
        other => panic!("a fencer that severs nothing must be caught: {other:?}"),
    };
    assert!(
        err.contains("returned to the free pool") && err.contains("can still write"),
        "{err}"
    );
}
