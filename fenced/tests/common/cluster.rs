//! Fault harness on real components: an etcd cluster of N members on loopback (free
//! ports, temp dirs, members killed and restarted by PID; `test_support::cluster`), a
//! TCP proxy that delays every byte by a delay switchable at run time, and a fleet of
//! in-process agents and controllers connected to any list of endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fenced::agent::{Agent, AgentConfig};
use fenced::controller::{Controller, ControllerConfig};
use fenced::fencer::Fencer;
use fenced::store::{EtcdStore, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::{Daemon, RunningAgent, TTL, device, host_id, key_of, node};

/// Claim TTL of the fleet: longer than the client's 5 s request timeout, so a fence
/// whose finishing transaction timed out during an election still holds its claim
/// when it retries (with the common harness's 3 s the claim is gone by then).
pub const FLEET_CLAIM_TTL: Duration = Duration::from_secs(10);

// Each test binary compiles this module and uses only part of it.
#[allow(unused_imports)]
pub use test_support::cluster::EtcdCluster;
#[allow(unused_imports)]
pub use test_support::{etcd_binary, free_port};

/// A loopback TCP proxy that holds every chunk of bytes for `delay` before forwarding
/// it, in each direction (so a request-response round trip costs 2 × delay more). The
/// delay is read when a chunk arrives and can be changed at any time; order is kept.
pub struct DelayProxy {
    port: u16,
    delay_ms: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        let task = tokio::spawn(async move {
            // Dropped with the accept task: aborting it closes every connection.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((down, _)) = listener.accept().await else {
                    continue;
                };
                let Ok(up) = tokio::net::TcpStream::connect(upstream).await else {
                    continue; // the client sees the connection closed, like a dead server
                };
                let _ = down.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                conns.spawn(pump(dr, uw, delay.clone()));
                conns.spawn(pump(ur, dw, delay.clone()));
                while conns.try_join_next().is_some() {}
            }
        });
        Self {
            port,
            delay_ms,
            task,
        }
    }

    /// The proxy's client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sets the delay added in each direction (applies to bytes arriving from now on).
    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads chunks from `from` and writes each to `to` once its delay has passed. A
/// separate reader keeps reading meanwhile, so the delay adds latency, not a
/// bandwidth limit.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        // The other side closed: pass the close on (after the queued bytes).
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let d = Duration::from_millis(delay_ms.load(Ordering::SeqCst));
                if tx
                    .send((tokio::time::Instant::now() + d, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// A member stopped with SIGSTOP (it accepts connections and answers nothing),
/// continued (SIGCONT) when dropped, so a failing test never leaves a stopped etcd
/// behind. Only PIDs the harness started are signalled.
pub struct Stopped(i32);

impl Stopped {
    /// Stops `pid`, the PID of a member the harness spawned (`EtcdCluster::pid`).
    pub fn new(pid: u32) -> Self {
        let pid = i32::try_from(pid).expect("pid");
        // SAFETY: kill(2) with the PID of a child the harness spawned and still owns.
        let r = unsafe { libc::kill(pid, libc::SIGSTOP) };
        assert_eq!(r, 0, "SIGSTOP {pid}: {}", std::io::Error::last_os_error());
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above; the child has not been reaped (the cluster owns it).
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Agents and controllers connected to `endpoints` (all etcd members, or a proxy),
/// sharing one in-memory namespace.
pub struct Fleet {
    /// What the daemons connect to.
    pub endpoints: Vec<String>,
    /// The shared namespace.
    pub ns: device::Namespace,
    /// Key root.
    pub root: String,
}

impl Fleet {
    /// A fleet using `endpoints`.
    pub fn new(endpoints: Vec<String>) -> Self {
        super::init_tracing();
        Self {
            endpoints,
            ns: device::Namespace::new(),
            root: "/fenced-faults".into(),
        }
    }

    /// A store on the fleet's endpoints, with the options `fenced run` uses for the
    /// fleet's lease TTL.
    pub async fn store(&self) -> EtcdStore {
        self.store_on(&self.endpoints).await
    }

    /// A store on other endpoints (e.g. etcd directly, around a proxy), same root.
    pub async fn store_on(&self, endpoints: &[String]) -> EtcdStore {
        let opts = StoreOptions::for_lease_ttl(TTL);
        EtcdStore::connect_with(endpoints, &self.root, FLEET_CLAIM_TTL, &opts)
            .await
            .expect("connect to the test etcd")
    }

    /// The agent settings of the common harness (TTL 2 s, margin 2 × TTL).
    pub fn agent_cfg(&self, n: &str) -> AgentConfig {
        let mut c = AgentConfig::new(node(n), format!("i-{n}"));
        c.ttl = TTL;
        c.self_fence_margin = 2 * TTL;
        c.device_check_interval = Duration::from_millis(200);
        c.join_timeout = Duration::from_secs(10);
        c
    }

    /// Starts an agent with `cfg` on `store` and runs it in a task.
    pub async fn agent_with(&self, store: EtcdStore, cfg: AgentConfig) -> RunningAgent {
        let n = cfg.node.as_str().to_owned();
        let agent = Agent::start(store, cfg, Some(Arc::new(self.host(&n))), key_of(&n))
            .await
            .expect("agent start");
        RunningAgent::spawn(agent)
    }

    /// Starts an agent on the fleet's endpoints.
    pub async fn agent(&self, n: &str) -> RunningAgent {
        self.agent_with(self.store().await, self.agent_cfg(n)).await
    }

    /// The host handle of node `n` on the shared namespace.
    pub fn host(&self, n: &str) -> device::Host {
        self.ns.host(host_id(n))
    }

    /// The NVMe fencer of node `n` (preempt-and-abort through its host handle).
    pub fn nvme_fencer(&self, n: &str) -> Arc<dyn Fencer> {
        super::nvme_fencer(&self.ns, n)
    }

    /// An agent plus a controller fencing with its host's NVMe handle: one daemon.
    pub async fn daemon(&self, n: &str) -> Daemon {
        self.daemon_with(n, self.nvme_fencer(n)).await
    }

    /// An agent plus a controller fencing with `fencer`.
    pub async fn daemon_with(&self, n: &str, fencer: Arc<dyn Fencer>) -> Daemon {
        let agent = self.agent(n).await;
        let mut cfg = ControllerConfig::new(n);
        cfg.sweep_interval = Duration::from_millis(500);
        cfg.own_node = Some(node(n));
        // As `fenced run` does: the controller's presence goes with the membership.
        cfg.presence_lease = Some(agent.lease);
        let controller = Controller::new(self.store().await, fencer, cfg);
        let ctl_task = controller.spawn();
        Daemon {
            agent,
            controller,
            ctl_task,
        }
    }
}
