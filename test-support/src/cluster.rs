//! An etcd cluster of N members on loopback: free ports, temp data dirs, members
//! started, killed and restarted by PID (`Child::kill`), every member SIGKILLed and
//! reaped on drop. Used by fenced's fault tests (`tests/etcd_faults.rs`,
//! `tests/hung_member.rs`) and the fleet bench (`benches/benches/fleet.rs`).
//!
//! [`EtcdCluster::leader`] needs the `cluster` feature: it asks the members through
//! etcd-client, which the plain launcher ([`crate::etcd`]) does not need.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::etcd::{etcd_binary, free_port};

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// An etcd cluster on loopback. Ports and data dirs are chosen by [`EtcdCluster::new`],
/// so clients can be pointed at the endpoints before any member runs.
#[derive(Debug)]
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
        crate::etcd::healthy(self.members[i].client_port)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// A cluster planned with no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
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

    #[cfg(feature = "cluster")]
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

    #[cfg(feature = "cluster")]
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
