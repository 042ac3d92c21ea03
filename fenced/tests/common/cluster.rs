//! Fault harness on real components: an etcd cluster of N members on loopback (free
//! ports, temp dirs, members killed and restarted by PID), a TCP proxy that delays
//! every byte by a delay switchable at run time, and a fleet of in-process agents and
//! controllers connected to any list of endpoints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

pub use test_support::{etcd_binary, free_port};

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// An etcd cluster on loopback. Ports and data dirs are chosen by [`EtcdCluster::new`],
/// so clients can be pointed at the endpoints before any member runs.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
}

impl EtcdCluster {
    /// Plans `n` members (nothing started yet).
    pub fn new(n: usize) -> Self {
        let members = (1..=n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            members,
        }
    }

    /// Starts every member and waits until each answers `/health` (at most 20 s).
    ///
    /// A port chosen by [`free_port`] is free only until someone else binds it (other
    /// tests, or an outgoing connection's source port): when a member cannot bind its
    /// peer port, the members get new peer ports and fresh data dirs (at most three
    /// tries). Client ports stay, as clients may already point at them.
    pub fn start(mut self) -> Self {
        for attempt in 1..=3 {
            for i in 0..self.members.len() {
                self.spawn(i);
            }
            let up =
                (0..self.members.len()).try_for_each(|i| self.wait_up(i, Duration::from_secs(20)));
            let Err(why) = up else { return self };
            let peer_taken = self.members.iter().any(|m| {
                why.contains(&format!(
                    "127.0.0.1:{}: bind: address already in use",
                    m.peer_port
                ))
            });
            assert!(attempt < 3 && peer_taken, "{why}");
            for i in 0..self.members.len() {
                if let Some(mut c) = self.members[i].child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                let _ = std::fs::remove_dir_all(self.data_dir(i));
                self.members[i].peer_port = free_port();
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// Waits until member `i` answers `/health`; `Err` (with its log) when it exits or
    /// `timeout` passes.
    fn wait_up(&mut self, i: usize, timeout: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            if self.healthy(i) {
                return Ok(());
            }
            let exited = self.members[i]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.members[i].child = None;
                return Err(format!(
                    "etcd member {i} exited ({status}); log: {}",
                    self.log(i)
                ));
            }
            if t0.elapsed() > timeout {
                return Err(format!(
                    "etcd member {i} not healthy after {timeout:?}; log: {}",
                    self.log(i)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// Starts member `i` (again: on its existing data dir, which etcd prefers to the
    /// initial-cluster flags).
    fn spawn(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} already runs");
        let initial = self.initial_cluster();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("log file");
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(etcd_binary())
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.data_dir(i))
            .args(["--logger=zap", "--log-outputs=stderr"])
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .arg(format!("--initial-cluster={initial}"))
            .arg("--initial-cluster-token=fenced-faults")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e} (apt-get install etcd-server)",
                    etcd_binary()
                )
            });
        self.members[i].child = Some(child);
    }

    /// `/health` of member `i` answers true (it is up and the cluster has a leader).
    pub fn healthy(&self, i: usize) -> bool {
        test_support::healthy(self.members[i].client_port)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Client address of member `i` (for a proxy).
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port))
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// PID of member `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Is member `i` running (started by us and not killed)?
    pub fn running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// SIGKILL member `i` (exactly its PID: `Child::kill`) and reap it.
    pub fn kill(&mut self, i: usize) {
        let mut child = self.members[i].child.take().expect("member runs");
        child.kill().expect("SIGKILL etcd member");
        let _ = child.wait();
    }

    /// Restarts member `i` on its data dir and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
        if let Err(why) = self.wait_up(i, Duration::from_secs(20)) {
            panic!("{why}");
        }
    }

    /// The index of the current leader, asked through the maintenance status API of
    /// the running members (the member whose own id is the leader id it reports).
    /// Waits up to `timeout` for the running members to agree on one.
    pub async fn leader(&self, timeout: Duration) -> usize {
        let t0 = Instant::now();
        loop {
            let mut votes = Vec::new();
            for i in (0..self.members.len()).filter(|&i| self.running(i)) {
                if let Some((me, leader)) = self.status(i).await {
                    votes.push((i, me, leader));
                }
            }
            let leaders: Vec<usize> = votes
                .iter()
                .filter(|(_, me, leader)| me == leader)
                .map(|(i, _, _)| *i)
                .collect();
            let agreed = votes
                .first()
                .is_some_and(|first| votes.iter().all(|v| v.2 == first.2 && v.2 != 0));
            if leaders.len() == 1 && agreed {
                return leaders[0];
            }
            assert!(
                t0.elapsed() < timeout,
                "no agreed leader after {timeout:?}: {votes:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// (own member id, leader id) of member `i` from its status endpoint.
    async fn status(&self, i: usize) -> Option<(u64, u64)> {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1));
        let mut c = etcd_client::Client::connect([self.endpoint(i)], Some(opts))
            .await
            .ok()?;
        let s = c.status().await.ok()?;
        Some((s.header()?.member_id(), s.leader()))
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                // Child::kill sends SIGKILL to exactly this PID.
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

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
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("FENCED_TEST_LOG")
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
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
