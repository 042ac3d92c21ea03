//! A partitioned node, on real components: the `fenced` binary of one node runs in its
//! own network namespace, joined to the host by a veth pair (a private /30, no other
//! route), and reaches a real etcd through it; two peer daemons run on the host over
//! loopback. The test cuts the veth link and measures what each side does.
//!
//! Needs root (CAP_NET_ADMIN) and iproute2's `ip netns`; without them the tests fail
//! and say so. Nothing is routed beyond the /30: the namespace has no default route.
//!
//! The partitioned node has no reservation-capable device (the host has no NVMe), so
//! every daemon runs `--fencer none`: peers bump the generation on lease expiry alone
//! (single-signal; the audit record says access was NOT severed and no arena is
//! released). "Self-fence" is then everything the agent itself does: its I/O gate
//! closes (the process exits with status 3, so nothing it hosts writes again), its log
//! says `SELF-FENCED`, and it stops petting its watchdog — here a plain file standing
//! in for `/dev/watchdog`, which grows by one byte per pet and never gets the `V`
//! that would disarm a real one.
//!
//! Ordering to know about: the documented margin is 2 × TTL, so the peers bump the
//! generation (at about TTL after the cut) *before* the node self-fences (at about the
//! margin). With single-signal fencing the node's device access is unsevered for that
//! difference; only a fencer that severs (NVMe preempt, EBS detach) closes the gap.
//! Both tests print the measured times (`--nocapture`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fenced::NodeId;
use fenced::store::EtcdStore;

/// Lease TTL of every daemon (etcd's effective minimum).
const TTL_SECS: u64 = 2;
/// The documented default self-fence margin: 2 × TTL.
const MARGIN: Duration = Duration::from_secs(2 * TTL_SECS);
/// `fenced run`'s exit status after a self-fence.
const EXIT_SELF_FENCED: i32 = 3;
const FENCED: &str = env!("CARGO_BIN_EXE_fenced");

fn run_ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e} (install iproute2)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> String {
    run_ip(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Fails (never skips) when the test cannot do what it claims.
fn require_privileges() {
    // Effective uid: the second field of `Uid:` in /proc/self/status.
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|st| {
            st.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned))
        });
    assert!(
        euid.as_deref() == Some("0"),
        "the partition tests need root (CAP_NET_ADMIN) to create a network namespace and a \
         veth pair: run `cargo test -p fenced --test partition` as root"
    );
    if let Err(e) = run_ip(&["netns", "list"]) {
        panic!("the partition tests need iproute2 with `ip netns` (apt-get install iproute2): {e}");
    }
}

/// A network namespace joined to the host by a veth pair with a private /30
/// (`10.254.X.1` host side, `.2` inside). Deleted on drop, also after a panic:
/// deleting the namespace destroys the veth end inside it, and with it the pair.
struct Net {
    ns: String,
    host_if: String,
    host_addr: Ipv4Addr,
}

impl Net {
    fn new(tag: &str) -> Self {
        let pid = std::process::id();
        let in_use = ip(&["-4", "-o", "addr", "show"]);
        // One /30 per run and test, avoiding any 10.254.X.0/24 already on this host.
        let third = (0..=255u32)
            .map(|i| (pid.wrapping_mul(31) + u32::from(tag.as_bytes()[0]) + i) % 256)
            .find(|x| !in_use.contains(&format!("10.254.{x}.")))
            .expect("a free 10.254.X.0/30");
        let third = u8::try_from(third).expect("< 256");
        let net = Self {
            ns: format!("fenced-{tag}-{pid}"),
            host_if: format!("fh{tag}{}", pid % 1_000_000),
            host_addr: Ipv4Addr::new(10, 254, third, 1),
        };
        let peer_if = format!("fp{tag}{}", pid % 1_000_000);
        let node_cidr = format!("10.254.{third}.2/30");
        let host_cidr = format!("{}/30", net.host_addr);
        ip(&["netns", "add", &net.ns]);
        ip(&[
            "link",
            "add",
            &net.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &peer_if,
        ]);
        ip(&["link", "set", &peer_if, "netns", &net.ns]);
        ip(&["addr", "add", &host_cidr, "dev", &net.host_if]);
        ip(&["link", "set", &net.host_if, "up"]);
        net.exec_ip(&["addr", "add", &node_cidr, "dev", &peer_if]);
        net.exec_ip(&["link", "set", &peer_if, "up"]);
        net.exec_ip(&["link", "set", "lo", "up"]);
        let routes = net.exec_ip(&["-4", "route", "show"]);
        assert!(
            !routes.contains("default"),
            "the namespace must have no default route: {routes}"
        );
        net
    }

    fn exec_ip(&self, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", &self.ns, "ip"];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Cuts the link on the host side: the node's packets are lost silently, as behind
    /// a failed switch port (the node's own interface stays up).
    fn cut(&self) {
        ip(&["link", "set", &self.host_if, "down"]);
    }

    fn heal(&self) {
        ip(&["link", "set", &self.host_if, "up"]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = run_ip(&["netns", "del", &self.ns]);
        // Normally gone with the namespace; covers a failure between the two creations.
        let _ = run_ip(&["link", "del", &self.host_if]);
    }
}

/// A real single-member etcd listening on loopback and on the veth's host address (the
/// shared launcher listens on loopback only). SIGKILLed by PID on drop.
struct Etcd {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Etcd {
    fn start(extra: Ipv4Addr) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (port, peer_port) = (test_support::free_port(), test_support::free_port());
        let local = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
        let child = Command::new(test_support::etcd_binary())
            .args(["--name", "n1", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg(format!(
                "--listen-client-urls={local},http://{extra}:{port}"
            ))
            .arg(format!("--advertise-client-urls={local}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=n1={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", test_support::etcd_binary()));
        let mut etcd = Self { child, dir, port };
        let t0 = Instant::now();
        while !etcd.healthy() {
            if let Ok(Some(st)) = etcd.child.try_wait() {
                panic!("etcd exited ({st}): {}", etcd.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "etcd not healthy: {}",
                etcd.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }

    fn healthy(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.contains("\"health\":\"true\"")
    }

    fn endpoint_on(&self, addr: Ipv4Addr) -> String {
        format!("http://{addr}:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `fenced run` process (inside the namespace: `ip netns exec`, which execs, so the
/// PID is the daemon's). SIGKILLed by PID on drop unless it already exited.
struct Daemon {
    node: String,
    child: Child,
    log: PathBuf,
    pid_file: PathBuf,
    watchdog: PathBuf,
    exit: Option<ExitStatus>,
}

impl Daemon {
    fn spawn(dir: &Path, node: &str, endpoint: &str, root: &str, netns: Option<&str>) -> Self {
        let log = dir.join(format!("{node}.log"));
        let pid_file = dir.join(format!("{node}.pid"));
        let watchdog = dir.join(format!("{node}.watchdog"));
        std::fs::write(&watchdog, b"").expect("watchdog file");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, FENCED]);
                c
            }
            None => Command::new(FENCED),
        };
        let out = std::fs::File::create(&log).expect("daemon log");
        let err = out.try_clone().expect("daemon log");
        cmd.args(["run", "--fencer", "none", "--log-json"])
            .args(["--node-id", node, "--instance-id", &format!("i-{node}")])
            .args(["--etcd-endpoints", endpoint, "--root", root])
            .args(["--ttl-secs", &TTL_SECS.to_string()])
            .args(["--sweep-secs", "1", "--claim-ttl-secs", "5"])
            .arg("--pid-file")
            .arg(&pid_file)
            .arg("--watchdog-device")
            .arg(&watchdog)
            .env("FENCED_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().expect("spawn fenced");
        Self {
            node: node.to_owned(),
            child,
            log,
            pid_file,
            watchdog,
            exit: None,
        }
    }

    /// The daemon's JSON log events (a torn last line is skipped).
    fn events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Events whose message or fields contain `text`.
    fn find(&self, text: &str) -> Vec<serde_json::Value> {
        self.events()
            .into_iter()
            .filter(|e| e["fields"].to_string().contains(text))
            .collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait");
        }
        self.exit
    }

    fn pets(&self) -> u64 {
        std::fs::metadata(&self.watchdog).map_or(0, |m| m.len())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// etcd, the namespace, two host daemons `a`, `b` and the partitioned daemon `p`.
struct Setup {
    // Dropped in this order: daemons, then etcd, then the network.
    a: Daemon,
    b: Daemon,
    p: Daemon,
    store: EtcdStore,
    etcd: Etcd,
    net: Net,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(tag: &str) -> Self {
        require_privileges();
        let net = Net::new(tag);
        let etcd = Etcd::start(net.host_addr);
        let dir = tempfile::tempdir().expect("temp dir");
        let root = format!("/partition-{tag}");
        let local = etcd.endpoint_on(Ipv4Addr::LOCALHOST);
        let a = Daemon::spawn(dir.path(), "a", &local, &root, None);
        let b = Daemon::spawn(dir.path(), "b", &local, &root, None);
        let p = Daemon::spawn(
            dir.path(),
            "p",
            &etcd.endpoint_on(net.host_addr),
            &root,
            Some(&net.ns),
        );
        let store = EtcdStore::connect(&[local], &root, Duration::from_secs(5))
            .await
            .expect("connect to the test etcd");
        let mut s = Self {
            a,
            b,
            p,
            store,
            etcd,
            net,
            _dir: dir,
        };
        let t0 = Instant::now();
        loop {
            let members = s.status().await.members;
            if members.len() == 3 {
                break;
            }
            for d in [&mut s.a, &mut s.b, &mut s.p] {
                if let Some(st) = d.exited() {
                    panic!("daemon {} exited ({st}): {}", d.node, d.log_text());
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "three members not seen (got {members:?}); p's log: {}",
                s.p.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Let the partitioned agent pet its watchdog for a while.
        tokio::time::sleep(Duration::from_millis(500)).await;
        s
    }

    async fn generation(&self, n: &str) -> u64 {
        let node = NodeId::new(n).expect("node id");
        patiently("generation", || self.store.generation(&node))
            .await
            .0
    }

    async fn audits(&self, n: &str) -> Vec<serde_json::Value> {
        let node = NodeId::new(n).expect("node id");
        patiently("audit records", || self.store.audit_records(&node)).await
    }

    async fn status(&self) -> fenced::store::Status {
        patiently("status", || self.store.status()).await
    }
}

/// The test's own reads of etcd (over loopback, never partitioned) retried for up to
/// 20 s: on a shared build machine a disk stall can make etcd miss the request
/// timeout, which is not what these tests are about.
async fn patiently<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, fenced::store::StoreError>>,
{
    let t0 = Instant::now();
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && t0.elapsed() < Duration::from_secs(20) => {
                eprintln!("test etcd read `{what}` failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("test etcd read `{what}` failed: {e}"),
        }
    }
}

/// When things happened after the cut.
#[derive(Debug, Default)]
struct Seen {
    self_fence: Option<Duration>,
    bump: Option<Duration>,
    exit: Option<Duration>,
}

/// Polls every 20 ms until `done(seen)` or `limit`.
async fn watch(
    s: &mut Setup,
    g0: u64,
    cut: Instant,
    limit: Duration,
    done: fn(&Seen) -> bool,
) -> Seen {
    let mut seen = Seen::default();
    while !done(&seen) {
        let t = cut.elapsed();
        assert!(
            t < limit,
            "after {t:?}: {seen:?}; p's log:\n{}\na's log:\n{}\netcd's log:\n{}",
            s.p.log_text(),
            s.a.log_text(),
            s.etcd.log()
        );
        if seen.self_fence.is_none() && !s.p.find("SELF-FENCED").is_empty() {
            seen.self_fence = Some(t);
        }
        if seen.bump.is_none() && s.generation("p").await > g0 {
            seen.bump = Some(t);
        }
        if seen.exit.is_none() && s.p.exited().is_some() {
            seen.exit = Some(t);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen
}

/// The self-fence came within the margin of the last renewal before the cut (renewals
/// run every TTL/3), and not before it.
fn assert_within_margin(at: Duration) {
    let renew_every = Duration::from_millis(TTL_SECS * 1000 / 3);
    assert!(
        at >= MARGIN - renew_every - Duration::from_millis(200),
        "self-fenced {at:?} after the cut: before the margin {MARGIN:?}"
    );
    assert!(
        at <= MARGIN + Duration::from_secs(1),
        "self-fenced {at:?} after the cut: later than the margin {MARGIN:?} + 1 s"
    );
}

/// Exactly one bump of `p`, its audit record, nothing owed, no departure marker.
async fn assert_fenced_once(s: &Setup, g0: u64) {
    assert_eq!(s.generation("p").await, g0 + 1, "p bumped exactly once");
    let audits = s.audits("p").await;
    assert_eq!(audits.len(), 1, "one audit record: {audits:?}");
    let audit = audits[0].to_string();
    assert!(audit.contains("single-signal"), "audit: {audit}");
    let st = s.status().await;
    assert!(
        st.done.contains(&("p".to_owned(), g0 + 1)),
        "fence mark: {:?}",
        st.done
    );
    assert!(
        !st.owed.iter().any(|(n, _)| n == "p"),
        "owed: {:?}",
        st.owed
    );
    assert!(
        !st.departed.iter().any(|n| n == "p"),
        "departed: {:?}",
        st.departed
    );
    assert!(
        !st.members.iter().any(|(n, _)| n == "p"),
        "members: {:?}",
        st.members
    );
    let fenced_by: usize = [&s.a, &s.b]
        .iter()
        .map(|d| {
            d.find("node fenced")
                .iter()
                .filter(|e| e["fields"]["node"] == "p")
                .count()
        })
        .sum();
    assert_eq!(fenced_by, 1, "one `node fenced` line across the peers");
}

fn assert_self_fence_line(p: &Daemon) {
    let lines = p.find("SELF-FENCED");
    assert_eq!(lines.len(), 1, "one self-fence line: {lines:?}");
    assert_eq!(lines[0]["fields"]["step"], "self_fence");
    assert_eq!(lines[0]["level"], "ERROR");
}

/// The agent stopped petting its watchdog at the self-fence and never disarmed it.
fn assert_watchdog_left_armed(p: &Daemon, pets_before_cut: u64) {
    let pets = std::fs::read(&p.watchdog).expect("watchdog file");
    assert!(
        pets_before_cut >= 3,
        "the agent petted its watchdog only {pets_before_cut} times before the cut"
    );
    assert!(
        !pets.contains(&b'V'),
        "a self-fenced agent must not disarm its watchdog (magic close 'V' written)"
    );
    // Petted every 100 ms until the margin ran out: never more than margin + slack.
    let after_cut = pets.len() as u64 - pets_before_cut;
    assert!(
        after_cut <= 2 * MARGIN.as_millis() as u64 / 100,
        "{after_cut} pets after the cut: the agent kept petting past its self-fence"
    );
}

/// The link to etcd is cut and stays cut: the agent self-fences within the margin
/// (log, exit status 3, watchdog no longer petted), the peers fence it exactly once,
/// and after the link comes back nothing changes: no second bump, no departure marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_node_self_fences_and_is_fenced_once() {
    let mut s = Setup::start("sf").await;
    let g0 = s.generation("p").await;
    let pets = s.p.pets();
    let cut = Instant::now();
    s.net.cut();
    let seen = watch(&mut s, g0, cut, Duration::from_secs(30), |s| {
        s.self_fence.is_some() && s.bump.is_some() && s.exit.is_some()
    })
    .await;
    let (sf, bump) = (seen.self_fence.unwrap(), seen.bump.unwrap());
    println!(
        "partition: cut -> bump {bump:?}, cut -> self-fence {sf:?}, cut -> exit {:?} (TTL {TTL_SECS} s, margin {MARGIN:?})",
        seen.exit.unwrap()
    );
    assert_within_margin(sf);
    assert_eq!(
        s.p.exited().and_then(|st| st.code()),
        Some(EXIT_SELF_FENCED),
        "p's exit status; log:\n{}",
        s.p.log_text()
    );
    assert_self_fence_line(&s.p);
    assert_watchdog_left_armed(&s.p, pets);
    assert!(
        !s.p.pid_file.exists(),
        "a stopped daemon removes its pid file"
    );
    // Link back: three sweeps later, still exactly one fence and no departure.
    s.net.heal();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_fenced_once(&s, g0).await;
    assert!(
        s.a.exited().is_none() && s.b.exited().is_none(),
        "peers still running"
    );
}

/// The node is asked to leave (`fenced leave`) just after its link is cut. Its leave
/// cannot reach etcd: it self-fences at the margin while still trying, the peers fence
/// it, and when the link comes back its departure transaction is refused (its
/// membership expired) and logged: no departure marker, no second bump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departure_after_expiry_is_refused_when_the_link_returns() {
    let mut s = Setup::start("lv").await;
    let g0 = s.generation("p").await;
    let pets = s.p.pets();
    let cut = Instant::now();
    s.net.cut();
    let leave = Command::new(FENCED)
        .args(["leave", "--timeout-secs", "60", "--pid-file"])
        .arg(&s.p.pid_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fenced leave");
    let seen = watch(&mut s, g0, cut, Duration::from_secs(30), |s| {
        s.self_fence.is_some() && s.bump.is_some()
    })
    .await;
    let (sf, bump) = (seen.self_fence.unwrap(), seen.bump.unwrap());
    assert_within_margin(sf);
    assert!(
        s.p.exited().is_none(),
        "the leave must still be retrying before the link returns; log:\n{}",
        s.p.log_text()
    );
    // The leave's first request waits for its timeout before it is retried: heal only
    // once the retry is under way, so the retry path is what meets the healed link.
    let t0 = Instant::now();
    while s.p.find("etcd unreachable while leaving").is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(15) && s.p.exited().is_none(),
            "the leave never logged that etcd is unreachable; log:\n{}",
            s.p.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!s.p.find("I/O stopped, leaving").is_empty());
    assert!(s.p.find("departure refused").is_empty());
    let healed = Instant::now();
    s.net.heal();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.p.exited() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "p did not finish leaving after the link came back; log:\n{}",
            s.p.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let refused_after = healed.elapsed();
    println!(
        "partition + leave: cut -> bump {bump:?}, cut -> self-fence {sf:?}, link back -> departure refused and exit {refused_after:?}"
    );
    assert_eq!(
        status.code(),
        Some(EXIT_SELF_FENCED),
        "p's exit status; log:\n{}",
        s.p.log_text()
    );
    let refused = s.p.find("departure refused");
    assert_eq!(
        refused.len(),
        1,
        "one refusal line; log:\n{}",
        s.p.log_text()
    );
    assert_eq!(refused[0]["fields"]["step"], "depart");
    assert_eq!(refused[0]["level"], "ERROR");
    assert!(
        s.p.find("departed").is_empty(),
        "p must not report a departure"
    );
    assert_self_fence_line(&s.p);
    assert_watchdog_left_armed(&s.p, pets);
    // `fenced leave` reports what the daemon answered on its control socket: it
    // self-fenced instead of leaving.
    let out = leave.wait_with_output().expect("fenced leave");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "fenced leave: {err}");
    assert!(
        err.starts_with("fenced: the daemon self-fenced instead of leaving: ")
            && err.lines().count() == 1,
        "fenced leave: {err}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_fenced_once(&s, g0).await;
}
