//! What a running daemon tells its operator: Prometheus metrics, `/healthz` (every task
//! that should run is running), `/readyz` (joined with a fresh lease), the systemd
//! watchdog's condition and `STATUS=` lines.
//!
//! [`Observer`] is one cheap, cloneable handle that the controller and the agent report
//! into (a counter increment, a task start or stop, a tick of the self-fencing clock);
//! [`serve`] answers HTTP on `--metrics-listen`. The HTTP side is a minimal HTTP/1.1
//! responder on tokio (one `GET` per connection, `Connection: close`): three fixed
//! paths do not need a web framework.
//!
//! One job per file: `metrics` (the Prometheus registry and what each report counts;
//! the device wrapper that reports each command is `crate::device::ObservedDevice`), `readiness` (task health, `/healthz`,
//! `/readyz` and the watchdog's condition), `http` (the endpoint) and `watchdog`
//! (the systemd watchdog loop); here the [`Observer`] handle itself and its
//! `STATUS=` line.

mod http;
mod metrics;
mod readiness;
mod watchdog;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::notify::Notifier;

pub use http::serve;
use metrics::Metrics;
pub use metrics::follow_endpoints;
pub use readiness::TaskGuard;
pub use watchdog::watchdog_loop;

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
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::core::{FenceState, Trigger};

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
        let dev = crate::device::ObservedDevice::wrap(
            Arc::new(ns.host(HostId([0xa; 16]))),
            Observer::new(),
        );
        assert_eq!(dev.identity().unwrap(), id);
    }

    #[test]
    fn device_commands_are_timed_and_counted_by_status() {
        use nvme_resv::{
            Acquire, AcquireAction, Cptpl, HostId, Key, Register, RegisterAction, Reservations,
        };
        let o = Observer::new();
        let ns = nvme_resv::model::Namespace::new();
        let dev =
            crate::device::ObservedDevice::wrap(Arc::new(ns.host(HostId([0xa; 16]))), o.clone());
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
                rtype: crate::device::RESERVATION_TYPE,
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
