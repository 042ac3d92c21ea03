//! The Prometheus side: the registry, what each report of the [`Observer`] counts, and
//! the device wrapper and etcd-endpoint follower that report into it.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Observer;
use crate::core::{FenceState, Trigger};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FenceLabels {
    pub(super) result: &'static str,
    pub(super) trigger: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StepLabels {
    pub(super) step: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndpointLabels {
    pub(super) endpoint: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ProbeLabels {
    pub(super) endpoint: String,
    pub(super) verdict: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OperationLabels {
    pub(super) operation: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OperationResultLabels {
    pub(super) operation: &'static str,
    pub(super) result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CommandLabels {
    pub(super) command: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CommandStatusLabels {
    pub(super) command: &'static str,
    pub(super) status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TaskLabels {
    pub(super) task: &'static str,
}

pub(super) type SecondsGauge = Gauge<f64, AtomicU64>;

/// `fenced_fences_total`'s `result` label: every value [`Observer::fence_ended`] gives.
pub(super) const FENCE_RESULTS: [&str; 3] = ["fenced", "skipped", "failed"];
/// `fenced_sweeps_total`'s `result` label.
pub(super) const SWEEP_RESULTS: [&str; 2] = ["ok", "error"];

pub(super) fn step_histogram() -> Histogram {
    // 1 ms .. ~33 s: a claim transaction to a slow EBS detach.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

pub(super) struct Metrics {
    pub(super) registry: Registry,
    pub(super) fences: Family<FenceLabels, Counter>,
    pub(super) fence_step: Family<StepLabels, Histogram>,
    pub(super) fences_owed: Gauge,
    pub(super) claims_held: Gauge,
    pub(super) members_seen: Gauge,
    pub(super) lease_age: SecondsGauge,
    pub(super) margin_left: SecondsGauge,
    pub(super) device_unanswered: SecondsGauge,
    pub(super) watch_restarts: Counter,
    pub(super) lost_states: Family<ResultLabels, Counter>,
    pub(super) sweeps: Family<ResultLabels, Counter>,
    pub(super) sweep_seconds: Histogram,
    pub(super) task_up: Family<TaskLabels, Gauge>,
    pub(super) task_restarts: Family<TaskLabels, Counter>,
    pub(super) ready: Gauge,
    pub(super) endpoint_in_rotation: Family<EndpointLabels, Gauge>,
    pub(super) endpoint_probe: Family<EndpointLabels, Histogram>,
    pub(super) endpoint_trouble: Family<ProbeLabels, Counter>,
    pub(super) etcd_requests: Family<OperationResultLabels, Counter>,
    pub(super) etcd_request_seconds: Family<OperationLabels, Histogram>,
    pub(super) device_seconds: Family<CommandLabels, Histogram>,
    pub(super) device_commands: Family<CommandStatusLabels, Counter>,
}

impl Metrics {
    pub(super) fn new() -> Self {
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
            lost_states: Family::default(),
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
            "lost_state_recoveries",
            "Times the agent found the shared device's reservation state lost (a target restart or power loss without persistence), by what it did: registered (its key again, live member with its generation unchanged) or self_fenced",
            m.lost_states.clone(),
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

pub(super) fn trigger_name(t: Trigger) -> &'static str {
    match t {
        Trigger::Watch => "watch",
        Trigger::Sweep => "sweep",
        Trigger::Operator => "operator",
    }
}

impl Observer {
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

    /// The agent found the device's reservation state lost and `registered` its key
    /// again (else it self-fenced).
    pub fn lost_state(&self, registered: bool) {
        let result = if registered {
            "registered"
        } else {
            "self_fenced"
        };
        self.m()
            .lost_states
            .get_or_create(&ResultLabels { result })
            .inc();
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

    pub(crate) fn device_command<T>(
        &self,
        command: &'static str,
        d: Duration,
        r: &nvme_resv::Result<T>,
    ) {
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
