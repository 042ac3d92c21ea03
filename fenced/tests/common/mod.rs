//! Shared test harness: a real etcd per test, the shared namespace, in-process daemons.
#![allow(dead_code)]

pub mod cluster;
pub mod device;
pub mod etcd;
pub mod process;
pub mod secure;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced::NodeId;
use fenced::agent::{Agent, AgentConfig, AgentExit, IoGate};
use fenced::controller::{Controller, ControllerConfig};
use fenced::fencer::{Fencer, NvmeFencer, PreemptMode};
use fenced::guard::GenerationGuard;
use fenced::store::EtcdStore;
use nvme_resv::{HostId, Key, Reservations};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Lease TTL used by the tests (etcd's effective minimum).
pub const TTL: Duration = Duration::from_secs(2);
/// Claim TTL used by the tests (short, so a dead controller's claim expires quickly).
pub const CLAIM_TTL: Duration = Duration::from_secs(3);

/// The reservation key of a node.
pub fn key_of(node: &str) -> Key {
    nvme_resv::key_for_node(node)
}

/// A distinct host id per node.
pub fn host_id(node: &str) -> HostId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&key_of(node).0.to_be_bytes());
    id[15] = 1;
    HostId(id)
}

/// Whether node `n`'s key is registered, as `host` reads the reservation report.
pub fn registered(host: &device::Host, n: &str) -> bool {
    host.report()
        .unwrap()
        .registrants
        .iter()
        .any(|r| r.rkey == key_of(n))
}

pub fn node(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

/// The test's log (`FENCED_TEST_LOG`, default `warn`) in the test's output; the first
/// subscriber installed in the binary wins.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCED_TEST_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// etcd + a namespace + a key root.
pub struct Cluster {
    pub etcd: etcd::Etcd,
    pub ns: device::Namespace,
    pub root: String,
}

impl Cluster {
    pub fn new() -> Self {
        init_tracing();
        Self {
            etcd: etcd::Etcd::start(),
            ns: device::Namespace::new(),
            root: "/fenced-test".into(),
        }
    }

    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(&[self.etcd.endpoint()], &self.root, CLAIM_TTL)
            .await
            .expect("connect to the test etcd")
    }

    /// A store on the cluster, once `arenas` are in the free pool.
    pub async fn store_with_arenas(&self, arenas: &[&str]) -> EtcdStore {
        let store = self.store().await;
        let arenas: Vec<String> = arenas.iter().map(|&a| a.to_owned()).collect();
        store.add_free_arenas(&arenas).await.unwrap();
        store
    }

    pub fn host(&self, n: &str) -> device::Host {
        self.ns.host(host_id(n))
    }

    pub fn nvme_fencer(&self, n: &str) -> Arc<dyn Fencer> {
        nvme_fencer(&self.ns, n)
    }

    pub fn controller_cfg(&self, id: &str) -> ControllerConfig {
        let mut c = ControllerConfig::new(id);
        c.sweep_interval = Duration::from_millis(500);
        // A controller alone: its presence lease as short as a membership's.
        c.presence_ttl = TTL;
        c
    }

    pub async fn controller(
        &self,
        fencer: Arc<dyn Fencer>,
        cfg: ControllerConfig,
    ) -> (Arc<Controller>, JoinHandle<()>) {
        let c = Controller::new(self.store().await, fencer, cfg);
        let t = c.spawn();
        (c, t)
    }

    pub fn agent_cfg(&self, n: &str, arenas: usize) -> AgentConfig {
        let mut c = AgentConfig::new(node(n), format!("i-{n}"));
        c.ttl = TTL;
        c.self_fence_margin = 2 * TTL;
        c.arenas = arenas;
        c.device_check_interval = Duration::from_millis(200);
        c.join_timeout = Duration::from_secs(10);
        c
    }

    /// Starts an agent (join, unfence, arenas) and runs it in a task.
    pub async fn agent(&self, n: &str, arenas: usize) -> RunningAgent {
        let agent = Agent::start(
            self.store().await,
            self.agent_cfg(n, arenas),
            Some(Arc::new(self.host(n))),
            key_of(n),
        )
        .await
        .expect("agent start");
        RunningAgent::spawn(agent)
    }

    /// An agent plus a controller fencing with its host's NVMe handle: one daemon.
    pub async fn daemon(&self, n: &str, arenas: usize) -> Daemon {
        let agent = self.agent(n, arenas).await;
        let mut cfg = self.controller_cfg(n);
        cfg.own_node = Some(node(n));
        // As `fenced run` does: the controller's presence goes with the membership.
        cfg.presence_lease = Some(agent.lease);
        let (controller, ctl_task) = self.controller(self.nvme_fencer(n), cfg).await;
        Daemon {
            agent,
            controller,
            ctl_task,
        }
    }
}

pub struct RunningAgent {
    pub node: NodeId,
    pub gate: IoGate,
    pub guard: GenerationGuard,
    pub membership_rev: i64,
    pub lease: i64,
    pub arenas: Vec<String>,
    leave: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<AgentExit>,
}

impl RunningAgent {
    pub fn spawn(agent: Agent) -> Self {
        let (tx, rx) = oneshot::channel::<()>();
        Self {
            node: agent.node().clone(),
            gate: agent.gate(),
            guard: agent.guard(),
            membership_rev: agent.membership_rev(),
            lease: agent.lease(),
            arenas: agent.arenas().to_vec(),
            leave: Some(tx),
            task: tokio::spawn(agent.run(async move {
                let _ = rx.await;
            })),
        }
    }

    /// SIGKILL-style death: the task (and its keepalive) stops; the lease expires.
    pub fn kill(&self) {
        self.task.abort();
    }

    /// `fenced leave`.
    pub async fn leave(mut self) -> AgentExit {
        let _ = self.leave.take().unwrap().send(());
        self.task.await.unwrap()
    }
}

pub struct Daemon {
    pub agent: RunningAgent,
    pub controller: Arc<Controller>,
    pub ctl_task: JoinHandle<()>,
}

impl Daemon {
    pub fn kill(&self) {
        self.agent.kill();
        self.ctl_task.abort();
    }
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        assert!(
            t0.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (up to 20 s) until every node of `nodes` is a member (has joined).
pub async fn wait_members(store: &EtcdStore, nodes: &[&str]) {
    wait_until(
        &format!("{nodes:?} joined"),
        Duration::from_secs(20),
        || async {
            store
                .status()
                .await
                .is_ok_and(|s| nodes.iter().all(|n| s.members.iter().any(|(m, _)| m == n)))
        },
    )
    .await;
}

/// The NVMe fencer of node `n` on `ns` (preempt-and-abort through its host handle).
pub fn nvme_fencer(ns: &device::Namespace, n: &str) -> Arc<dyn Fencer> {
    Arc::new(NvmeFencer::new(
        Arc::new(ns.host(host_id(n))),
        key_of(n),
        PreemptMode::PreemptAndAbort,
    ))
}

/// Completed fences of `n` in its audit records (the generation changed; failed
/// attempts excluded).
pub async fn fences_of(store: &EtcdStore, n: &str) -> Vec<serde_json::Value> {
    store
        .audit_records(&node(n))
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a["generation_after"] != a["generation_before"])
        .collect()
}

/// The generation of `n` in etcd.
pub async fn generation(store: &EtcdStore, n: &str) -> u64 {
    store.generation(&node(n)).await.unwrap().0
}
