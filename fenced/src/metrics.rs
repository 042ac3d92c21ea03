//! What a running daemon tells its operator: Prometheus metrics, `/healthz` (every task
//! that should run is running), `/readyz` (joined with a fresh lease), the systemd
//! watchdog's condition and `STATUS=` lines.
//!
//! [`Observer`] is one cheap, cloneable handle that the controller and the agent report
//! into (a counter increment, a task start or stop, a tick of the self-fencing clock);
//! [`serve`] answers HTTP on `--metrics-listen`. The HTTP side is a minimal HTTP/1.1
//! responder on tokio (one `GET` per connection, `Connection: close`): three fixed
//! paths do not need a web framework.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::core::{FenceState, Trigger};
use crate::notify::Notifier;

/// The agent's last tick older than this: the agent loop is stalled (it ticks every
/// 100 ms).
const AGENT_STALE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FenceLabels {
    result: &'static str,
    trigger: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    endpoint: String,
    verdict: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationResultLabels {
    operation: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandStatusLabels {
    command: &'static str,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

type SecondsGauge = Gauge<f64, AtomicU64>;

/// `fenced_fences_total`'s `result` label: every value [`Observer::fence_ended`] gives.
const FENCE_RESULTS: [&str; 3] = ["fenced", "skipped", "failed"];
/// `fenced_sweeps_total`'s `result` label.
const SWEEP_RESULTS: [&str; 2] = ["ok", "error"];

fn step_histogram() -> Histogram {
    // 1 ms .. ~33 s: a claim transaction to a slow EBS detach.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

struct Metrics {
    registry: Registry,
    fences: Family<FenceLabels, Counter>,
    fence_step: Family<StepLabels, Histogram>,
    fences_owed: Gauge,
    claims_held: Gauge,
    members_seen: Gauge,
    lease_age: SecondsGauge,
    margin_left: SecondsGauge,
    device_unanswered: SecondsGauge,
    watch_restarts: Counter,
    sweeps: Family<ResultLabels, Counter>,
    sweep_seconds: Histogram,
    task_up: Family<TaskLabels, Gauge>,
    task_restarts: Family<TaskLabels, Counter>,
    ready: Gauge,
    endpoint_in_rotation: Family<EndpointLabels, Gauge>,
    endpoint_probe: Family<EndpointLabels, Histogram>,
    endpoint_trouble: Family<ProbeLabels, Counter>,
    etcd_requests: Family<OperationResultLabels, Counter>,
    etcd_request_seconds: Family<OperationLabels, Histogram>,
    device_seconds: Family<CommandLabels, Histogram>,
    device_commands: Family<CommandStatusLabels, Counter>,
}

impl Metrics {
    fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("fenced"),
            fences: Family::default(),
            fence_step: Family::new_with_constructor(step_histogram),
            fences_owed: Gauge::default(),
            claims_held: Gauge::default(),
            members_seen: Gauge::default(),
            lease_age: SecondsGauge::default(),
            margin_left: SecondsGauge::default(),
            device_unanswered: SecondsGauge::default(),
            watch_restarts: Counter::default(),
            sweeps: Family::default(),
            sweep_seconds: step_histogram(),
            task_up: Family::default(),
            task_restarts: Family::default(),
            ready: Gauge::default(),
            endpoint_in_rotation: Family::default(),
            endpoint_probe: Family::new_with_constructor(step_histogram),
            endpoint_trouble: Family::default(),
            etcd_requests: Family::default(),
            etcd_request_seconds: Family::new_with_constructor(step_histogram),
            device_seconds: Family::new_with_constructor(step_histogram),
            device_commands: Family::default(),
        };
        let r = &mut m.registry;
        r.register(
            "fences",
            "Fences run by this controller, by result (fenced, skipped, failed) and trigger (watch, sweep, operator)",
            m.fences.clone(),
        );
        r.register(
            "fence_step_duration_seconds",
            "Duration of each fence step (claim, sever, finish, abort)",
            m.fence_step.clone(),
        );
        r.register(
            "fences_owed",
            "Fences owed at the last sweep (nodes whose fence is not done)",
            m.fences_owed.clone(),
        );
        r.register(
            "claims_held",
            "Fence claims held in the cluster at the last sweep",
            m.claims_held.clone(),
        );
        r.register(
            "members_seen",
            "Members in the membership at the last sweep",
            m.members_seen.clone(),
        );
        r.register(
            "lease_age_seconds",
            "Time since the membership lease was last renewed (as the agent's self-fencing clock measures it)",
            m.lease_age.clone(),
        );
        r.register(
            "self_fence_margin_left_seconds",
            "Time left before the agent self-fences if the lease is not renewed",
            m.margin_left.clone(),
        );
        r.register(
            "device_unanswered_seconds",
            "How long the agent's reservation report of the shared device has gone unanswered once past the stall limit (a hung path or target); 0 while it answers",
            m.device_unanswered.clone(),
        );
        r.register(
            "watch_restarts",
            "Membership watch restarts after the first start (channel failed, canceled, compacted)",
            m.watch_restarts.clone(),
        );
        r.register(
            "sweeps",
            "Reconciliation sweeps by result (ok, error)",
            m.sweeps.clone(),
        );
        r.register(
            "sweep_duration_seconds",
            "Duration of a reconciliation sweep, its fences included",
            m.sweep_seconds.clone(),
        );
        r.register(
            "task_up",
            "1 while a task that should run is running (controller_watch, sweep, keepalive), 0 once it stopped",
            m.task_up.clone(),
        );
        r.register(
            "task_restarts",
            "Restarts of a stopped task",
            m.task_restarts.clone(),
        );
        r.register(
            "etcd_endpoint_in_rotation",
            "1 while the etcd client balances requests onto the endpoint, 0 while it is out of rotation (probed with two or more endpoints)",
            m.endpoint_in_rotation.clone(),
        );
        r.register(
            "etcd_endpoint_probe_duration_seconds",
            "Duration of each endpoint probe (TCP connect, a linearizable count-only read and Status, bounded by the probe timeout)",
            m.endpoint_probe.clone(),
        );
        r.register(
            "etcd_endpoint_probe_failures",
            "Endpoint probes that did not find the endpoint serving, by verdict (degraded, silent, refused)",
            m.endpoint_trouble.clone(),
        );
        // By operation: etcd-client balances the store's requests over the endpoints
        // inside its channel and does not say which one served a request, so they
        // cannot be attributed to an endpoint (the probes above are, per endpoint).
        r.register(
            "etcd_requests",
            "The store's etcd requests by operation (gRPC method: Range, Txn, Put, LeaseGrant, ...) and result (ok, a gRPC code such as unavailable, transport when no answer came, abandoned when the caller stopped waiting); not by endpoint: etcd-client balances them over the endpoints without saying which served one",
            m.etcd_requests.clone(),
        );
        r.register(
            "etcd_request_duration_seconds",
            "Time until etcd answered each of the store's requests, by operation (for the Watch and LeaseKeepAlive streams: until the stream was open)",
            m.etcd_request_seconds.clone(),
        );
        r.register(
            "device_command_duration_seconds",
            "Duration of each reservation command on the shared namespace (register, acquire, release, report), the agent's and the fencer's",
            m.device_seconds.clone(),
        );
        r.register(
            "device_commands",
            "Reservation commands by result: ok, the NVMe status code (SCT/SC, e.g. 0x083 reservation conflict), ioctl_error or other",
            m.device_commands.clone(),
        );
        // Counters an alert is written on exist from the start at 0 (the Prometheus
        // convention): `increase(fenced_fences_total{result="failed"}[5m])` has a
        // series to read before the first fence, and a new daemon's first fence is an
        // increase from 0 rather than a series that appears.
        for result in FENCE_RESULTS {
            for trigger in [Trigger::Watch, Trigger::Sweep, Trigger::Operator] {
                drop(m.fences.get_or_create(&FenceLabels {
                    result,
                    trigger: trigger_name(trigger),
                }));
            }
        }
        for result in SWEEP_RESULTS {
            drop(m.sweeps.get_or_create(&ResultLabels { result }));
        }
        r.register(
            "ready",
            "1 while joined with a fresh lease (what /readyz answers)",
            m.ready.clone(),
        );
        m
    }
}

#[derive(Debug, Clone)]
enum TaskState {
    Running,
    Stopped { why: String },
}

#[derive(Debug, Clone, Copy)]
struct AgentTick {
    at: Instant,
    lease_age: Duration,
    ttl: Duration,
    keepalive_running: bool,
}

#[derive(Debug, Default)]
struct State {
    tasks: BTreeMap<&'static str, TaskState>,
    joined: bool,
    /// A controller-only daemon (`--role controller`) runs no agent: readiness does
    /// not wait for its lease.
    no_agent: bool,
    agent: Option<AgentTick>,
    /// The agent's device check unanswered this long (core::device_health).
    device_stalled: Option<Duration>,
    /// What `STATUS=` says besides the fences in progress.
    status: String,
    fencing: BTreeSet<String>,
}

struct Inner {
    metrics: Metrics,
    state: Mutex<State>,
    notifier: Mutex<Option<Arc<Notifier>>>,
}

/// The daemon's metrics, task health and readiness; cheap to clone. The default is a
/// fresh handle nobody serves (unit tests, library users).
#[derive(Clone)]
pub struct Observer(Arc<Inner>);

impl Default for Observer {
    fn default() -> Self {
        Self(Arc::new(Inner {
            metrics: Metrics::new(),
            state: Mutex::new(State::default()),
            notifier: Mutex::new(None),
        }))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

/// Marks its task stopped when dropped: on return, on panic and on abort alike, so a
/// stopped task looks different from an idle one.
#[derive(Debug)]
pub struct TaskGuard {
    observer: Observer,
    task: &'static str,
    why: Option<String>,
}

impl TaskGuard {
    /// Records why the task stopped (kept until it runs again).
    pub fn stopped(mut self, why: impl Into<String>) {
        self.why = Some(why.into());
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let why = self.why.take().unwrap_or_else(|| "stopped".to_owned());
        self.observer
            .set_task(self.task, TaskState::Stopped { why });
    }
}

fn trigger_name(t: Trigger) -> &'static str {
    match t {
        Trigger::Watch => "watch",
        Trigger::Sweep => "sweep",
        Trigger::Operator => "operator",
    }
}

impl Observer {
    /// A fresh handle.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn m(&self) -> &Metrics {
        &self.0.metrics
    }

    /// Sends `STATUS=` lines through `n` from now on.
    pub fn set_notifier(&self, n: Arc<Notifier>) {
        *self
            .0
            .notifier
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(n);
    }

    fn notifier(&self) -> Option<Arc<Notifier>> {
        self.0
            .notifier
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets what `STATUS=` says (fences in progress are appended) and sends it.
    pub fn set_status(&self, status: impl Into<String>) {
        self.state().status = status.into();
        self.send_status();
    }

    fn send_status(&self) {
        let line = {
            let s = self.state();
            if s.fencing.is_empty() {
                s.status.clone()
            } else {
                let nodes: Vec<&str> = s.fencing.iter().map(String::as_str).collect();
                format!("{}; fencing {}", s.status, nodes.join(", "))
            }
        };
        if let Some(n) = self.notifier() {
            n.status(&line);
        }
    }

    fn set_task(&self, task: &'static str, st: TaskState) {
        let up = i64::from(matches!(st, TaskState::Running));
        self.m().task_up.get_or_create(&TaskLabels { task }).set(up);
        self.state().tasks.insert(task, st);
    }

    /// `task` (started now) must keep running; `/healthz` fails once the returned
    /// guard is dropped.
    pub fn task_running(&self, task: &'static str) -> TaskGuard {
        self.set_task(task, TaskState::Running);
        TaskGuard {
            observer: self.clone(),
            task,
            why: None,
        }
    }

    /// A stopped `task` is being started again.
    pub fn task_restarted(&self, task: &'static str) {
        self.m()
            .task_restarts
            .get_or_create(&TaskLabels { task })
            .inc();
    }

    /// Joined, unfenced, arenas claimed: `READY=1` with `status`.
    pub fn ready(&self, status: impl Into<String>) {
        let status = status.into();
        self.state().status.clone_from(&status);
        self.set_joined(true);
        if let Some(n) = self.notifier() {
            n.ready(&status);
        }
    }

    /// A daemon without an agent (`--role controller`) is running: `READY=1`;
    /// readiness is then "running, not leaving", with no lease to be fresh.
    pub fn ready_without_agent(&self, status: impl Into<String>) {
        self.state().no_agent = true;
        self.ready(status);
    }

    /// We joined (READY) or stopped being a member (leaving, self-fenced).
    pub fn set_joined(&self, joined: bool) {
        self.state().joined = joined;
        self.update_ready(Instant::now());
    }

    /// The agent's device check has been unanswered for this long (`None`: the
    /// device answers). `/healthz` turns red while it is set; the gauge
    /// `fenced_device_unanswered_seconds` shows it.
    pub fn device_stalled(&self, unanswered: Option<Duration>) {
        self.state().device_stalled = unanswered;
        self.m()
            .device_unanswered
            .set(unanswered.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// One tick of the agent's self-fencing clock: the lease was last renewed
    /// `lease_age` ago, `margin_left` remains before self-fencing (zero: self-fenced).
    pub fn agent_tick(
        &self,
        now: Instant,
        lease_age: Duration,
        margin_left: Duration,
        ttl: Duration,
        keepalive_running: bool,
    ) {
        self.m().lease_age.set(lease_age.as_secs_f64());
        self.m().margin_left.set(margin_left.as_secs_f64());
        let keepalive_was = {
            let mut s = self.state();
            s.agent = Some(AgentTick {
                at: now,
                lease_age,
                ttl,
                keepalive_running,
            });
            s.tasks
                .get("keepalive")
                .map(|t| matches!(t, TaskState::Running))
        };
        if keepalive_was != Some(keepalive_running) {
            let st = if keepalive_running {
                TaskState::Running
            } else {
                TaskState::Stopped {
                    why: "the lease keepalive task ended".to_owned(),
                }
            };
            self.set_task("keepalive", st);
        }
        self.update_ready(now);
    }

    fn update_ready(&self, now: Instant) {
        let ready = self.ready_at(now).is_ok();
        self.m().ready.set(i64::from(ready));
    }

    /// `Ok` while every task that should run is running and the agent's loop ticks;
    /// `Err` says which stopped and why.
    pub fn healthz(&self, now: Instant) -> Result<(), String> {
        let s = self.state();
        let stopped: Vec<String> = s
            .tasks
            .iter()
            .filter_map(|(t, st)| match st {
                TaskState::Running => None,
                TaskState::Stopped { why } => Some(format!("{t} stopped ({why})")),
            })
            .collect();
        if !stopped.is_empty() {
            return Err(stopped.join("; "));
        }
        if let Some(a) = s.agent {
            let since = now.saturating_duration_since(a.at);
            if since > AGENT_STALE {
                return Err(format!(
                    "agent loop stalled: no self-fencing check for {:.1}s",
                    since.as_secs_f64()
                ));
            }
        }
        if let Some(d) = s.device_stalled {
            return Err(format!(
                "the shared device has not answered a reservation report for {:.0}s",
                d.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// `Ok` while joined with a fresh lease: renewed within its TTL, by the agent's
    /// last tick, which is recent.
    pub fn ready_at(&self, now: Instant) -> Result<(), String> {
        let s = self.state();
        if !s.joined {
            return Err("not a member (starting, leaving or self-fenced)".to_owned());
        }
        if s.no_agent {
            return Ok(());
        }
        let Some(a) = s.agent else {
            return Err("the agent has not checked its lease yet".to_owned());
        };
        let since = now.saturating_duration_since(a.at);
        if since > AGENT_STALE {
            return Err(format!(
                "agent loop stalled: no lease check for {:.1}s",
                since.as_secs_f64()
            ));
        }
        if !a.keepalive_running {
            return Err("the lease keepalive task ended".to_owned());
        }
        if a.lease_age >= a.ttl {
            return Err(format!(
                "lease not renewed for {:.1}s (TTL {}s)",
                a.lease_age.as_secs_f64(),
                a.ttl.as_secs()
            ));
        }
        Ok(())
    }

    /// What the systemd watchdog needs before `WATCHDOG=1`: healthy and ready.
    pub fn watchdog_ok(&self, now: Instant) -> Result<(), String> {
        self.healthz(now)?;
        self.ready_at(now)
    }

    /// A fence of `node` started.
    pub fn fence_started(&self, node: &str) {
        self.state().fencing.insert(node.to_owned());
        self.send_status();
    }

    /// A fence of `node` ended in `state`.
    pub fn fence_ended(&self, node: &str, trigger: Trigger, state: &FenceState) {
        let result = match state {
            FenceState::Fenced { .. } => "fenced",
            FenceState::Skipped { .. } => "skipped",
            FenceState::Failed { .. }
            | FenceState::Superseded { .. }
            | FenceState::Owed
            | FenceState::Claimed { .. }
            | FenceState::Severed { .. } => "failed",
        };
        debug_assert!(FENCE_RESULTS.contains(&result));
        self.m()
            .fences
            .get_or_create(&FenceLabels {
                result,
                trigger: trigger_name(trigger),
            })
            .inc();
        self.state().fencing.remove(node);
        self.send_status();
    }

    /// One fence step took `d`.
    pub fn fence_step(&self, step: &'static str, d: Duration) {
        self.m()
            .fence_step
            .get_or_create(&StepLabels { step })
            .observe(d.as_secs_f64());
    }

    /// The membership watch was started again.
    pub fn watch_restarted(&self) {
        self.m().watch_restarts.inc();
    }

    /// A sweep ended after `d`; `seen`: (members, claims, owed) of its snapshot.
    pub fn sweep_done(&self, d: Duration, ok: bool, seen: Option<(usize, usize, usize)>) {
        let result = SWEEP_RESULTS[usize::from(!ok)];
        self.m()
            .sweeps
            .get_or_create(&ResultLabels { result })
            .inc();
        self.m().sweep_seconds.observe(d.as_secs_f64());
        if let Some((members, claims, owed)) = seen {
            let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            self.m().members_seen.set(g(members));
            self.m().claims_held.set(g(claims));
            self.m().fences_owed.set(g(owed));
        }
    }

    /// One probe round of the store's etcd endpoints.
    pub fn endpoints_probed(&self, states: &[crate::store::EndpointState]) {
        for s in states {
            let endpoint = EndpointLabels {
                endpoint: s.endpoint.clone(),
            };
            self.m()
                .endpoint_in_rotation
                .get_or_create(&endpoint)
                .set(i64::from(s.in_rotation));
            self.m()
                .endpoint_probe
                .get_or_create(&endpoint)
                .observe(s.probe.as_secs_f64());
            if s.verdict != "serves" {
                self.m()
                    .endpoint_trouble
                    .get_or_create(&ProbeLabels {
                        endpoint: s.endpoint.clone(),
                        verdict: s.verdict,
                    })
                    .inc();
            }
        }
    }

    /// One request of the store's channel ([`crate::store::RequestHook`]).
    pub fn etcd_request(&self, operation: &'static str, took: Duration, result: &'static str) {
        self.m()
            .etcd_requests
            .get_or_create(&OperationResultLabels { operation, result })
            .inc();
        if result != "abandoned" {
            self.m()
                .etcd_request_seconds
                .get_or_create(&OperationLabels { operation })
                .observe(took.as_secs_f64());
        }
    }

    fn device_command<T>(&self, command: &'static str, d: Duration, r: &nvme_resv::Result<T>) {
        self.m()
            .device_seconds
            .get_or_create(&CommandLabels { command })
            .observe(d.as_secs_f64());
        let status = match r {
            Ok(_) => "ok".to_owned(),
            Err(e) => match (e.status(), e) {
                (Some(st), _) => format!("{:#05x}", st.code()),
                (None, nvme_resv::Error::Ioctl { .. }) => "ioctl_error".to_owned(),
                (None, _) => "other".to_owned(),
            },
        };
        self.m()
            .device_commands
            .get_or_create(&CommandStatusLabels { command, status })
            .inc();
    }

    /// The metrics in the Prometheus text format (0.0.4).
    pub fn encode(&self) -> String {
        self.update_ready(Instant::now());
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.m().registry);
        out
    }
}

/// A reservation device whose every command is timed and counted by status
/// (`fenced_device_command_duration_seconds`, `fenced_device_commands_total`); the
/// commands themselves pass through unchanged.
pub struct ObservedDevice {
    inner: crate::fencer::Device,
    observer: Observer,
}

impl ObservedDevice {
    /// `inner`, reporting to `observer`.
    pub fn wrap(inner: crate::fencer::Device, observer: Observer) -> crate::fencer::Device {
        Arc::new(Self { inner, observer })
    }

    fn timed<T>(
        &self,
        command: &'static str,
        f: impl FnOnce() -> nvme_resv::Result<T>,
    ) -> nvme_resv::Result<T> {
        let t0 = Instant::now();
        let r = f();
        self.observer.device_command(command, t0.elapsed(), &r);
        r
    }
}

impl std::fmt::Debug for ObservedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservedDevice").finish_non_exhaustive()
    }
}

impl nvme_resv::Reservations for ObservedDevice {
    fn register(&self, cmd: &nvme_resv::Register) -> nvme_resv::Result<()> {
        self.timed("register", || self.inner.register(cmd))
    }
    fn acquire(&self, cmd: &nvme_resv::Acquire) -> nvme_resv::Result<()> {
        self.timed("acquire", || self.inner.acquire(cmd))
    }
    fn release(&self, cmd: &nvme_resv::Release) -> nvme_resv::Result<()> {
        self.timed("release", || self.inner.release(cmd))
    }
    fn report(&self) -> nvme_resv::Result<nvme_resv::ReservationStatus> {
        self.timed("report", || self.inner.report())
    }
    // Forwarded explicitly: the trait's default answers Unsupported, and a fencer whose
    // device cannot identify itself refuses every fence (the namespace check).
    fn identity(&self) -> nvme_resv::Result<nvme_resv::NamespaceIdentity> {
        self.timed("identify", || self.inner.identity())
    }
}

/// Reports every probe round of `store`'s etcd endpoints to `observer`, until dropped,
/// and every request of the store as it is answered (from now on, not only while this
/// runs).
pub async fn follow_endpoints(store: crate::store::EtcdStore, observer: Observer) {
    let o = observer.clone();
    store.observe_requests(Arc::new(move |op, took, result| {
        o.etcd_request(op, took, result);
    }));
    let mut rx = store.endpoint_rotation();
    loop {
        let states = rx.borrow_and_update().clone();
        observer.endpoints_probed(&states);
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 8 * 1024;
/// A client that has not sent its request by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until dropped.
pub async fn serve(listener: TcpListener, observer: Observer) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let observer = observer.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(READ_TIMEOUT, answer(conn, &observer)).await;
                });
            }
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut conn: TcpStream, observer: &Observer) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return respond(&mut conn, 431, "text/plain", "request head too large\n").await;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut words = text.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(&mut conn, 405, "text/plain", "only GET\n").await;
    }
    let now = Instant::now();
    let verdict = |r: Result<(), String>| match r {
        Ok(()) => (200, "ok\n".to_owned()),
        Err(why) => (503, format!("{why}\n")),
    };
    let (code, ctype, body) = match path {
        "/metrics" => (
            200,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            observer.encode(),
        ),
        "/healthz" => {
            let (c, b) = verdict(observer.healthz(now));
            (c, "text/plain", b)
        }
        "/readyz" => {
            let (c, b) = verdict(observer.ready_at(now));
            (c, "text/plain", b)
        }
        _ => (
            404,
            "text/plain",
            "not found: /metrics, /healthz, /readyz\n".to_owned(),
        ),
    };
    let body = if method == "HEAD" {
        String::new()
    } else {
        body
    };
    respond(&mut conn, code, ctype, &body).await
}

async fn respond(conn: &mut TcpStream, code: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

/// Sends `WATCHDOG=1` every quarter `period` (at most every 500 ms) while `observer`
/// says the daemon is healthy and ready ([`Observer::watchdog_ok`]): lease fresh, agent
/// loop ticking, controller and keepalive tasks running. Runs until dropped.
pub async fn watchdog_loop(notifier: Arc<Notifier>, observer: Observer, period: Duration) {
    let mut tick = tokio::time::interval((period / 4).min(Duration::from_millis(500)));
    let mut withheld = false;
    loop {
        tick.tick().await;
        match observer.watchdog_ok(std::time::Instant::now()) {
            Ok(()) => {
                if withheld {
                    tracing::info!("systemd watchdog: healthy again, pinging");
                    withheld = false;
                }
                notifier.watchdog_ping();
            }
            Err(why) => {
                if !withheld {
                    tracing::warn!(why = %why, "systemd watchdog: not pinging ({why}); systemd kills the daemon if this lasts WatchdogSec");
                    withheld = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_requests_are_counted_by_operation_and_result() {
        let o = Observer::new();
        o.etcd_request("Range", Duration::from_millis(3), "ok");
        o.etcd_request("Range", Duration::from_millis(900), "unavailable");
        o.etcd_request("Txn", Duration::from_secs(2), "abandoned");
        let m = o.encode();
        for line in [
            "fenced_etcd_requests_total{operation=\"Range\",result=\"ok\"} 1",
            "fenced_etcd_requests_total{operation=\"Range\",result=\"unavailable\"} 1",
            "fenced_etcd_requests_total{operation=\"Txn\",result=\"abandoned\"} 1",
            "fenced_etcd_request_duration_seconds_count{operation=\"Range\"} 2",
        ] {
            assert!(m.lines().any(|l| l == line), "{line} in\n{m}");
        }
        // An abandoned request has no answer time.
        assert!(
            !m.contains("fenced_etcd_request_duration_seconds_count{operation=\"Txn\"}"),
            "{m}"
        );
    }

    #[test]
    fn a_stopped_task_is_unhealthy_until_it_runs_again() {
        let o = Observer::new();
        let now = Instant::now();
        let g = o.task_running("sweep");
        assert_eq!(o.healthz(now), Ok(()));
        g.stopped("returned");
        assert_eq!(o.healthz(now), Err("sweep stopped (returned)".to_owned()));
        assert!(o.encode().contains("fenced_task_up{task=\"sweep\"} 0"));
        let _g = o.task_running("sweep");
        assert_eq!(o.healthz(now), Ok(()));
    }

    #[test]
    fn ready_only_while_joined_with_a_fresh_lease() {
        let o = Observer::new();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(2);
        assert!(o.ready_at(t0).is_err());
        o.set_joined(true);
        assert!(o.ready_at(t0).unwrap_err().contains("not checked"));
        o.agent_tick(
            t0,
            Duration::from_millis(500),
            Duration::from_secs(3),
            ttl,
            true,
        );
        assert_eq!(o.ready_at(t0), Ok(()));
        assert_eq!(o.watchdog_ok(t0), Ok(()));
        // The lease outlived its TTL: not ready, no watchdog ping, still healthy.
        o.agent_tick(
            t0,
            Duration::from_millis(2100),
            Duration::from_secs(1),
            ttl,
            true,
        );
        assert!(o.ready_at(t0).unwrap_err().contains("not renewed"));
        assert!(o.watchdog_ok(t0).is_err());
        assert_eq!(o.healthz(t0), Ok(()));
        // The agent stopped ticking: unhealthy.
        let later = t0 + Duration::from_secs(2);
        assert!(o.healthz(later).unwrap_err().contains("stalled"));
        // The keepalive task ended.
        o.agent_tick(later, Duration::ZERO, Duration::from_secs(4), ttl, false);
        assert!(o.healthz(later).unwrap_err().contains("keepalive stopped"));
        o.set_joined(false);
        assert!(o.ready_at(later).unwrap_err().contains("not a member"));
        // A controller-only daemon has no lease to wait for.
        let c = Observer::new();
        c.ready_without_agent("controller c1 running");
        assert_eq!(c.watchdog_ok(Instant::now()), Ok(()));
    }

    #[test]
    fn alerting_counters_exist_at_zero_before_anything_happens() {
        let text = Observer::new().encode();
        for result in ["fenced", "skipped", "failed"] {
            for trigger in ["watch", "sweep", "operator"] {
                let line =
                    format!("fenced_fences_total{{result=\"{result}\",trigger=\"{trigger}\"}} 0\n");
                assert!(text.contains(&line), "{line} missing from:\n{text}");
            }
        }
        assert!(
            text.contains("fenced_sweeps_total{result=\"ok\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("fenced_sweeps_total{result=\"error\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn fences_are_counted_by_result_and_trigger() {
        let o = Observer::new();
        o.fence_started("n1");
        o.fence_step("claim", Duration::from_millis(3));
        o.fence_ended("n1", Trigger::Watch, &FenceState::Fenced { generation: 1 });
        o.fence_ended("n2", Trigger::Sweep, &FenceState::Owed);
        let text = o.encode();
        assert!(
            text.contains("fenced_fences_total{result=\"fenced\",trigger=\"watch\"} 1"),
            "{text}"
        );
        assert!(text.contains("fenced_fences_total{result=\"failed\",trigger=\"sweep\"} 1"));
        assert!(text.contains("fenced_fence_step_duration_seconds_count{step=\"claim\"} 1"));
    }

    #[test]
    fn the_observed_device_identifies_its_namespace() {
        use nvme_resv::{HostId, NamespaceIdentity, Reservations};
        let ns = nvme_resv::model::Namespace::new();
        let id = NamespaceIdentity {
            nguid: [0x5a; 16],
            subnqn: "nqn.2014-08.org.fenced:test".to_owned(),
            ..NamespaceIdentity::default()
        };
        ns.set_identity(id.clone());
        let dev = ObservedDevice::wrap(Arc::new(ns.host(HostId([0xa; 16]))), Observer::new());
        assert_eq!(dev.identity().unwrap(), id);
    }

    #[test]
    fn device_commands_are_timed_and_counted_by_status() {
        use nvme_resv::{
            Acquire, AcquireAction, Cptpl, HostId, Key, Register, RegisterAction, Reservations,
        };
        let o = Observer::new();
        let ns = nvme_resv::model::Namespace::new();
        let dev = ObservedDevice::wrap(Arc::new(ns.host(HostId([0xa; 16]))), o.clone());
        let register = Register {
            rrega: RegisterAction::Register,
            crkey: Key(0),
            nrkey: Key(7),
            iekey: false,
            cptpl: Cptpl::NoChange,
        };
        dev.register(&register).unwrap();
        assert!(dev.report().unwrap().is_registered(Key(7)));
        // Acquire with a key we do not hold: the device answers Reservation Conflict.
        let e = dev
            .acquire(&Acquire {
                racqa: AcquireAction::Acquire,
                rtype: crate::fencer::RESERVATION_TYPE,
                crkey: Key(8),
                prkey: Key(0),
                iekey: false,
            })
            .unwrap_err();
        assert!(e.is_reservation_conflict(), "{e}");
        let text = o.encode();
        for line in [
            "fenced_device_commands_total{command=\"register\",status=\"ok\"} 1",
            "fenced_device_commands_total{command=\"report\",status=\"ok\"} 1",
            "fenced_device_commands_total{command=\"acquire\",status=\"0x083\"} 1",
            "fenced_device_command_duration_seconds_count{command=\"acquire\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }

    #[tokio::test]
    async fn http_answers_the_three_paths() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let o = Observer::new();
        let _g = o.task_running("sweep");
        tokio::spawn(serve(listener, o.clone()));
        let get = |path: &'static str| async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200 OK\r\n"));
        let r = get("/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503 "), "{r}");
        assert!(r.ends_with("not a member (starting, leaving or self-fenced)\n"));
        let m = get("/metrics?x=1").await;
        assert!(m.contains("Content-Type: text/plain; version=0.0.4"), "{m}");
        assert!(m.contains("fenced_task_up{task=\"sweep\"} 1"), "{m}");
        assert!(get("/nope").await.starts_with("HTTP/1.1 404 "));
    }
}
