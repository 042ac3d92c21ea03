//! The `fenced` daemon as a process.
//!
//! 1. Detection to fence complete: three `fenced run` daemons (agent + controller each,
//!    `--fencer none`, lease TTL `FENCED_BENCH_TTL`, default 5 s) on a real local etcd;
//!    SIGKILL one daemon and time the SIGKILL to the generation bump of its node (seen by
//!    a watch on the key root), split at the membership DELETE (lease expiry) into
//!    "etcd noticed" and "controllers fenced". The killed node is restarted (fresh
//!    instance) between deaths; the survivors must live through every death.
//! 2. Footprint: one idle `fenced run` in a cluster with 1 000 members (held by this
//!    bench on one lease): RSS (VmRSS, VmHWM) and CPU time over a window.
//! 3. Soak: `FENCED_BENCH_SOAK_DAEMONS` (3) daemons run for `FENCED_BENCH_SOAK_SECS`
//!    while whatever loads the machine runs (plus `FENCED_BENCH_SOAK_BURN` busy threads
//!    of this bench): none may exit, self-fence, leave or be fenced. A watch on the key
//!    root fails the soak on any membership DELETE, generation bump, fence intent, claim,
//!    mark, departure or audit record. How close a lease came to expiring: the leases'
//!    remaining TTLs polled every 0.2 s, beside a control lease this bench keeps alive
//!    itself (etcd-client alone, a renewal every TTL/3: its round trips are etcd's and
//!    the machine's share of a late renewal); the `liveness/<node>` writes are counted.
//!
//! Every daemon runs in its own PID namespace (`unshare --pid --fork --kill-child`) when
//! this process may create one (root), so a signal it sends reaches only that namespace;
//! the bench signals only the `unshare` it started (whose death SIGKILLs the daemon).
//!
//! Needs the `fenced` binary: `$FENCED_BIN`, else `fenced` next to this bench's
//! profile directory (`cargo build -p fenced` first; benches/scripts/daemon.sh does).
//! Quick (default): 1 death, a 3 s footprint window, a 5 s soak.
//! Full: `FENCED_BENCH_FULL=1`: 20 deaths, a 30 s window, a 600 s soak.
//! `FENCED_BENCH_DEATHS` (else `FENCED_BENCH_SAMPLES`) sets the number of deaths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use benches::{Etcd, Summary, full_mode, runtime, samples};
use etcd_client::{Client, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};

/// Lease TTL of every daemon: `FENCED_BENCH_TTL` seconds, default 5.
fn ttl_secs() -> u64 {
    env_u64("FENCED_BENCH_TTL").unwrap_or(5)
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name}={v:?}: not a whole number ({e})"),
    }
}

fn fenced_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("FENCED_BIN") {
        return Some(PathBuf::from(p));
    }
    // target/<profile>/deps/daemon-<hash> -> target/<profile>/fenced, then the other
    // profile.
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let target = profile_dir.parent()?;
    [
        profile_dir.join("fenced"),
        target.join("release/fenced"),
        target.join("debug/fenced"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Whether `unshare --pid --fork --kill-child --mount-proc` works here (root, or a
/// kernel that lets this user create the namespaces).
fn pid_namespaces() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let ok = Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "--mount-proc", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            println!(
                "daemon: note: `unshare --pid` is not permitted here: the daemons run in this \
                 PID namespace (the bench still signals only the processes it started)"
            );
        }
        ok
    })
}

/// The 1-, 5- and 15-minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// A `fenced run` child (inside its own PID namespace when possible), SIGKILLed on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
    node: String,
    exit: Option<ExitStatus>,
}

impl Daemon {
    fn start(bin: &Path, ep: &str, root: &str, node: &str, instance: &str, dir: &Path) -> Self {
        let log = dir.join(format!("{node}-{instance}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        // Each incarnation stands for a fresh host (a replacement or a reboot): on the same
        // boot id a fenced node's restart is refused (exit 5, `fenced unfence`).
        let boot_id = dir.join(format!("{node}-{instance}.boot_id"));
        std::fs::write(&boot_id, format!("{node}-{instance}-boot\n")).expect("boot id file");
        let mut cmd = if pid_namespaces() {
            // unshare forks the daemon as PID 1 of a new namespace and SIGKILLs it when
            // unshare itself dies; it exits with the daemon's status.
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
                .arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let child = cmd
            .args(["run", "--etcd-endpoints", ep, "--root", root])
            .args(["--fencer", "none", "--node-id", node])
            .args(["--instance-id", instance])
            .args(["--ttl-secs", &ttl_secs().to_string()])
            .args(["--sweep-secs", "30", "--claim-ttl-secs", "30"])
            .env("RUST_LOG", "warn")
            .env("FENCED_LOG", "warn")
            .env("FENCED_BOOT_ID_FILE", &boot_id)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Self {
            child,
            log,
            node: node.to_owned(),
            exit: None,
        }
    }

    /// The PID of the `fenced` process itself (as this namespace sees it): the child,
    /// or the child of the `unshare` child.
    fn fenced_pid(&self) -> u32 {
        let pid = self.child.id();
        if !pid_namespaces() {
            return pid;
        }
        let t0 = Instant::now();
        loop {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if let Some(c) = children.split_whitespace().next() {
                return c.parse().expect("a pid in /proc/<pid>/task/<pid>/children");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "unshare (pid {pid}) started no daemon within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `Some(status)` once the daemon has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().expect("try_wait");
        }
        self.exit
    }

    fn kill(&mut self) {
        // Child::kill sends SIGKILL to exactly the PID this bench started (the daemon, or
        // the unshare whose death SIGKILLs the daemon).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

fn dump_logs(daemons: &[&Daemon]) {
    for d in daemons {
        eprintln!("--- {}\n{}", d.log.display(), d.log_text());
    }
}

async fn wait_member(client: &mut Client, key: &str, what: &str, logs: &[&Daemon]) {
    let t0 = Instant::now();
    loop {
        let r = client.get(key, None).await.expect("get");
        if !r.kvs().is_empty() {
            return;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            dump_logs(logs);
            panic!("{what} did not join within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of `gen/<node>` once written (a first join writes it in a second
/// transaction: wait for it, so that write is not taken for a bump).
async fn generation(client: &mut Client, key: &str) -> u64 {
    let t0 = Instant::now();
    loop {
        let r = client.get(key, None).await.expect("get gen");
        if let Some(kv) = r.kvs().first() {
            return kv
                .value_str()
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .expect("generation value");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{key} never written"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One death, timed at the bench's watch on the key root.
struct Death {
    /// SIGKILL to the generation bump.
    total: Duration,
    /// SIGKILL to the membership DELETE (etcd expired the lease and revoked it).
    to_delete: Option<Duration>,
    /// How long before the SIGKILL the last `liveness/<node>` write (which follows a
    /// renewal) was seen.
    renewed_before_kill: Option<Duration>,
}

/// A fraction in [0, 1) for death `s`, spread evenly (golden-ratio sequence): where the
/// SIGKILL falls within the renewal period.
fn phase(s: usize) -> f64 {
    (s as f64 * 0.618_033_988_749_895).fract()
}

async fn detection(bin: &Path, etcd: &Etcd, n: usize, dir: &Path) {
    let ttl = ttl_secs();
    let ep = etcd.endpoint();
    let root = "/bench-detect/";
    let mut client = Client::connect([ep.as_str()], None).await.expect("connect");
    let mut daemons: Vec<Daemon> = (1..=3)
        .map(|i| Daemon::start(bin, &ep, root, &format!("n{i}"), "0", dir))
        .collect();
    for i in 1..=3 {
        let refs: Vec<&Daemon> = daemons.iter().collect();
        wait_member(
            &mut client,
            &format!("{root}membership/n{i}"),
            &format!("n{i}"),
            &refs,
        )
        .await;
    }
    let (membership, gen_key, liveness) = (
        format!("{root}membership/n3"),
        format!("{root}gen/n3"),
        format!("{root}liveness/n3"),
    );
    let renew_period = Duration::from_secs(ttl) / 3;
    let load_start = loadavg();
    let mut deaths = Vec::new();
    for s in 0..n {
        let before = generation(&mut client, &gen_key).await;
        let mut stream = client
            .watch(root, Some(WatchOptions::new().with_prefix()))
            .await
            .expect("watch");
        // Let the SIGKILL fall anywhere in the renewal period, noting the renewals seen.
        let mut renewed_at = None;
        let kill_at = Instant::now() + renew_period.mul_f64(1.0 + phase(s));
        while let Ok(msg) = tokio::time::timeout_at(kill_at.into(), stream.message()).await {
            let msg = msg.expect("watch").expect("watch open");
            let seen = Instant::now();
            for e in msg.events() {
                if e.event_type() == EventType::Put
                    && e.kv().is_some_and(|kv| kv.key() == liveness.as_bytes())
                {
                    renewed_at = Some(seen);
                }
            }
        }
        let pid = daemons[2].child.id();
        let t0 = Instant::now();
        daemons[2].kill();
        let mut deleted_at = None;
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(4 * ttl + 10), stream.message())
                .await
                .unwrap_or_else(|_| {
                    let refs: Vec<&Daemon> = daemons.iter().collect();
                    dump_logs(&refs);
                    panic!("death {s}: no bump of n3 after SIGKILL of pid {pid}")
                })
                .expect("watch")
                .expect("watch open");
            let seen = Instant::now();
            let mut bumped = false;
            for e in msg.events() {
                let Some(kv) = e.kv() else { continue };
                match e.event_type() {
                    EventType::Delete if kv.key() == membership.as_bytes() => {
                        deleted_at.get_or_insert(seen);
                    }
                    EventType::Put if kv.key() == gen_key.as_bytes() => {
                        bumped |= kv
                            .value_str()
                            .ok()
                            .and_then(|v| v.parse::<u64>().ok())
                            .is_some_and(|g| g > before);
                    }
                    _ => {}
                }
            }
            if bumped {
                break;
            }
        }
        let death = Death {
            total: t0.elapsed(),
            to_delete: deleted_at.map(|d| d - t0),
            renewed_before_kill: renewed_at.map(|r| t0 - r),
        };
        let secs =
            |d: Option<Duration>| d.map_or("?".into(), |d| format!("{:.3}s", d.as_secs_f64()));
        println!(
            "daemon/detect: death {s}: SIGKILL -> bump {:.3}s (-> membership DELETE {}, DELETE -> bump {}; last renewal seen {} before the SIGKILL)",
            death.total.as_secs_f64(),
            secs(death.to_delete),
            secs(death.to_delete.map(|d| death.total - d)),
            secs(death.renewed_before_kill),
        );
        deaths.push(death);
        let gone: Vec<String> = daemons[..2]
            .iter_mut()
            .filter_map(|d| d.exited().map(|st| format!("{} ({st})", d.node)))
            .collect();
        if !gone.is_empty() {
            let refs: Vec<&Daemon> = daemons.iter().collect();
            dump_logs(&refs);
            panic!("death {s}: survivor(s) exited: {}", gone.join(", "));
        }
        // A fresh instance of n3 rejoins for the next death.
        daemons[2] = Daemon::start(bin, &ep, root, "n3", &format!("{}", s + 1), dir);
        let refs: Vec<&Daemon> = daemons.iter().collect();
        wait_member(&mut client, &membership, "restarted n3", &refs).await;
    }
    let load_end = loadavg();
    let total: Vec<Duration> = deaths.iter().map(|d| d.total).collect();
    let sm = Summary::of(&total).expect("deaths");
    println!(
        "daemon/detect: SIGKILL -> generation bump, TTL {ttl}s, 3 daemons: {sm} (load average {load_start} -> {load_end})"
    );
    let to_delete: Vec<Duration> = deaths.iter().filter_map(|d| d.to_delete).collect();
    let after_delete: Vec<Duration> = deaths
        .iter()
        .filter_map(|d| d.to_delete.map(|x| d.total - x))
        .collect();
    // Lease expiry is due TTL after the last renewal; what comes on top is etcd's
    // expiry check, the revoke's commit and the watch delivery.
    let past_expiry: Vec<Duration> = deaths
        .iter()
        .filter_map(|d| {
            let since_renewal = d.to_delete? + d.renewed_before_kill?;
            Some(since_renewal.saturating_sub(Duration::from_secs(ttl)))
        })
        .collect();
    for (what, v) in [
        ("SIGKILL -> membership DELETE", &to_delete),
        ("membership DELETE -> bump", &after_delete),
        (
            "DELETE seen past TTL after the last renewal seen",
            &past_expiry,
        ),
    ] {
        if let Some(sm) = Summary::of(v) {
            println!("daemon/detect: {what}: {sm}");
        }
    }
    let p99 = |v: &[Duration]| Summary::of(v).map_or(f64::NAN, |s| s.p99.as_secs_f64());
    let p50 = |v: &[Duration]| Summary::of(v).map_or(f64::NAN, |s| s.p50.as_secs_f64());
    println!(
        "BENCH detect n={} p50_s={:.3} p99_s={:.3} max_s={:.3} ttl_s={ttl} to_delete_p50_s={:.3} to_delete_p99_s={:.3} delete_to_bump_p50_s={:.3} delete_to_bump_p99_s={:.3} past_expiry_p50_s={:.3} past_expiry_p99_s={:.3} load_start={load_start:?} load_end={load_end:?}",
        sm.n,
        sm.p50.as_secs_f64(),
        sm.p99.as_secs_f64(),
        sm.max.as_secs_f64(),
        p50(&to_delete),
        p99(&to_delete),
        p50(&after_delete),
        p99(&after_delete),
        p50(&past_expiry),
        p99(&past_expiry),
    );
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// utime + stime in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &s[s.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

async fn footprint(bin: &Path, etcd: &Etcd, members: usize, window: Duration, dir: &Path) {
    let ep = etcd.endpoint();
    let root = "/bench-idle/";
    let mut client = Client::connect([ep.as_str()], None).await.expect("connect");
    let lease = client.lease_grant(3600, None).await.expect("grant").id();
    let mut ops = Vec::new();
    for i in 0..members {
        ops.push(TxnOp::put(format!("{root}gen/m{i:04}"), "0", None));
        ops.push(TxnOp::put(
            format!("{root}membership/m{i:04}"),
            format!("i-{i}"),
            Some(PutOptions::new().with_lease(lease)),
        ));
    }
    for chunk in ops.chunks(128) {
        client
            .txn(Txn::new().and_then(chunk.to_vec()))
            .await
            .expect("populate");
    }
    let d = Daemon::start(bin, &ep, root, "observer", "0", dir);
    wait_member(
        &mut client,
        &format!("{root}membership/observer"),
        "observer",
        &[&d],
    )
    .await;
    // Let start-up (first sweep, arena claim) finish before the window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = d.fenced_pid();
    let c0 = cpu_ticks(pid);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let ticks = cpu_ticks(pid) - c0;
    let secs = t0.elapsed().as_secs_f64();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let rss = proc_status_kib(pid, "VmRSS:");
    let hwm = proc_status_kib(pid, "VmHWM:");
    let cpu_pct = 100.0 * ticks as f64 / hz / secs;
    println!(
        "daemon/footprint: idle fenced, {members} members: VmRSS {:.1} MiB, VmHWM {:.1} MiB, CPU {cpu_pct:.2}% over {secs:.0}s",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!(
        "BENCH footprint members={members} rss_mib={:.1} hwm_mib={:.1} cpu_pct={cpu_pct:.2} window_s={secs:.0} binary={}",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        bin.display()
    );
    drop(d);
}

/// Busy threads of this process, stopped on drop.
struct Burners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Burners {
    fn start(n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                    }
                    x
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What the soak's watch on the key root saw that must not happen in a quiet cluster.
fn forbidden(root: &str, key: &[u8], event: EventType) -> Option<&'static str> {
    let key = std::str::from_utf8(key).ok()?.strip_prefix(root)?;
    let family = key.split('/').next()?;
    match (family, event) {
        ("membership", EventType::Delete) => Some("membership DELETE (lease expired or left)"),
        ("gen", EventType::Put) => Some("generation bump (a fence)"),
        ("fence_pending", EventType::Put) => Some("fence intent"),
        ("fence_claim", EventType::Put) => Some("fence claim"),
        ("fence_done", EventType::Put) => Some("fence mark"),
        ("departed", EventType::Put) => Some("departure (a leave)"),
        ("audit", EventType::Put) => Some("audit record (a fence)"),
        _ => None,
    }
}

/// How close one lease came to expiring, from its remaining TTL polled every
/// [`LEASE_POLL`] (etcd answers in whole seconds, rounded down: 0 means under 1 s left,
/// more than TTL - 1 s since its last renewal reached etcd).
#[derive(Default)]
struct LeaseWatch {
    min_left: Option<i64>,
    polls: u64,
    under_1s: u64,
    /// Start of the current run of "under 1 s" answers.
    low_since: Option<Instant>,
    /// Longest run of "under 1 s" answers, first to last.
    longest_low: Duration,
}

const LEASE_POLL: Duration = Duration::from_millis(200);

impl LeaseWatch {
    fn record(&mut self, left: i64, at: Instant) {
        self.polls += 1;
        self.min_left = Some(self.min_left.map_or(left, |m| m.min(left)));
        if left <= 0 {
            self.under_1s += 1;
            let since = *self.low_since.get_or_insert(at);
            self.longest_low = self.longest_low.max(at - since);
        } else {
            self.low_since = None;
        }
    }

    fn describe(&self) -> String {
        format!(
            "least left {}s, under 1 s left in {} of {} polls, longest such run {:.1}s",
            self.min_left.map_or("?".into(), |m| m.to_string()),
            self.under_1s,
            self.polls,
            self.longest_low.as_secs_f64()
        )
    }
}

/// A control: a lease of the same TTL kept alive by this bench with etcd-client alone
/// (a renewal every TTL/3, nothing else on its path), so the soak tells etcd's and the
/// machine's share of a late renewal from the daemon's. Returns the lease and a task
/// that yields the renewals' round trips and how many got no answer within the TTL.
async fn control_lease(
    ep: &str,
    ttl: u64,
    stop: Arc<AtomicBool>,
) -> (i64, tokio::task::JoinHandle<(Vec<Duration>, u64)>) {
    let mut client = Client::connect([ep], None).await.expect("connect");
    let lease = client
        .lease_grant(i64::try_from(ttl).expect("ttl"), None)
        .await
        .expect("grant control lease")
        .id();
    let task = tokio::spawn(async move {
        let (mut keeper, mut msgs) = client.lease_keep_alive(lease).await.expect("keepalive");
        let mut tick = tokio::time::interval(Duration::from_secs(ttl) / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut rtts, mut lost) = (Vec::new(), 0);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let sent = Instant::now();
            if keeper.keep_alive().await.is_err() {
                lost += 1;
                continue;
            }
            match tokio::time::timeout(Duration::from_secs(ttl), msgs.message()).await {
                Ok(Ok(Some(r))) if r.ttl() > 0 => rtts.push(sent.elapsed()),
                _ => lost += 1,
            }
        }
        (rtts, lost)
    });
    (lease, task)
}

async fn soak(bin: &Path, etcd: &Etcd, nodes: usize, duration: Duration, burn: usize, dir: &Path) {
    let ttl = ttl_secs();
    let ep = etcd.endpoint();
    let root = "/bench-soak/";
    let mut client = Client::connect([ep.as_str()], None).await.expect("connect");
    let mut daemons: Vec<Daemon> = (1..=nodes)
        .map(|i| Daemon::start(bin, &ep, root, &format!("s{i}"), "0", dir))
        .collect();
    let mut leases = BTreeMap::new();
    let mut generations = BTreeMap::new();
    for d in &daemons {
        let refs: Vec<&Daemon> = daemons.iter().collect();
        let key = format!("{root}membership/{}", d.node);
        wait_member(&mut client, &key, &d.node, &refs).await;
        let r = client
            .get(key.as_str(), None)
            .await
            .expect("get membership");
        leases.insert(d.node.clone(), r.kvs()[0].lease());
        let g = generation(&mut client, &format!("{root}gen/{}", d.node)).await;
        generations.insert(d.node.clone(), g);
    }
    let rev = client
        .get(
            root,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("get root")
        .header()
        .expect("header")
        .revision();
    let mut stream = client
        .watch(
            root,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(rev + 1),
            ),
        )
        .await
        .expect("watch");
    let load_start = loadavg();
    println!(
        "daemon/soak: {nodes} daemons, TTL {ttl}s, {}s, {burn} busy threads; load average {load_start}",
        duration.as_secs()
    );
    let stop_control = Arc::new(AtomicBool::new(false));
    let (control, control_task) = control_lease(&ep, ttl, stop_control.clone()).await;
    leases.insert("control".to_owned(), control);
    let burners = Burners::start(burn);
    let t0 = Instant::now();
    let mut end = t0 + duration;
    // After the first violation, watch on long enough to see what followed (the lease's
    // expiry and the fence a death causes), then stop.
    let mut cut_short = false;
    let mut exited: BTreeMap<String, ExitStatus> = BTreeMap::new();
    let mut violations: Vec<String> = Vec::new();
    // Per node: when its last liveness write was seen, the longest gap between two.
    let mut last_live: BTreeMap<String, Instant> = BTreeMap::new();
    let mut max_gap: BTreeMap<String, Duration> = BTreeMap::new();
    let mut renewals = 0u64;
    let mut lease_watch: BTreeMap<String, LeaseWatch> = BTreeMap::new();
    let mut loads = vec![load_start.clone()];
    let mut next_load = t0 + Duration::from_secs(60);
    let mut poll = tokio::time::interval(LEASE_POLL);
    let liveness_prefix = format!("{root}liveness/");
    while Instant::now() < end {
        if !violations.is_empty() && !cut_short {
            cut_short = true;
            end = end.min(Instant::now() + Duration::from_secs(2 * ttl + 2));
        }
        tokio::select! {
            msg = stream.message() => {
                let msg = msg.expect("watch").expect("watch open");
                let seen = Instant::now();
                for e in msg.events() {
                    let Some(kv) = e.kv() else { continue };
                    if let Some(what) = forbidden(root, kv.key(), e.event_type()) {
                        violations.push(format!(
                            "{:.1}s: {what}: {}",
                            t0.elapsed().as_secs_f64(),
                            String::from_utf8_lossy(kv.key())
                        ));
                    }
                    let node = kv
                        .key_str()
                        .ok()
                        .and_then(|k| k.strip_prefix(liveness_prefix.as_str()));
                    if let (Some(node), EventType::Put) = (node, e.event_type()) {
                        renewals += 1;
                        if let Some(prev) = last_live.insert(node.to_owned(), seen) {
                            let gap = max_gap.entry(node.to_owned()).or_default();
                            *gap = (*gap).max(seen - prev);
                        }
                    }
                }
            }
            _ = poll.tick() => {
                for (node, lease) in &leases {
                    if let Ok(r) = client.lease_time_to_live(*lease, None).await {
                        lease_watch.entry(node.clone()).or_default().record(r.ttl(), Instant::now());
                    }
                }
                for d in &mut daemons {
                    if let Some(st) = d.exited()
                        && exited.insert(d.node.clone(), st).is_none()
                    {
                        violations.push(format!(
                            "{:.1}s: daemon {} exited ({st})",
                            t0.elapsed().as_secs_f64(),
                            d.node
                        ));
                    }
                }
                if Instant::now() >= next_load {
                    next_load += Duration::from_secs(60);
                    let l = loadavg();
                    println!("daemon/soak: {:.0}s: load average {l}", t0.elapsed().as_secs_f64());
                    loads.push(l);
                }
            }
        }
    }
    drop(burners);
    stop_control.store(true, Ordering::Relaxed);
    let (control_rtts, control_lost) = control_task.await.expect("control lease task");
    leases.remove("control");
    let elapsed = t0.elapsed();
    let load_end = loadavg();
    loads.push(load_end.clone());
    // The cluster as it ends: every member present on its first lease, every
    // generation as it was, no fence record.
    for (node, lease) in &leases {
        let r = client
            .get(format!("{root}membership/{node}"), None)
            .await
            .expect("get membership");
        match r.kvs().first() {
            Some(kv) if kv.lease() == *lease => {}
            Some(kv) => violations.push(format!(
                "{node}: membership on lease {:x}, joined on {lease:x}",
                kv.lease()
            )),
            None => violations.push(format!("{node}: membership gone at the end")),
        }
        let g = generation(&mut client, &format!("{root}gen/{node}")).await;
        if g != generations[node] {
            violations.push(format!("{node}: generation {} -> {g}", generations[node]));
        }
    }
    for family in ["fence_done/", "audit/", "fence_pending/", "departed/"] {
        let n = client
            .get(
                format!("{root}{family}"),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .expect("count")
            .count();
        if n != 0 {
            violations.push(format!("{n} key(s) under {root}{family} at the end"));
        }
    }
    // What the daemons logged (warn and above).
    let mut logged = 0;
    for d in &mut daemons {
        let text = d.log_text();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        logged += lines.len();
        for l in lines.iter().take(5) {
            println!("daemon/soak: {} logged: {l}", d.node);
        }
        if text.contains("SELF-FENCED") {
            violations.push(format!("{} logged a self-fence", d.node));
        }
        if let Some(st) = d.exited()
            && !exited.contains_key(&d.node)
        {
            violations.push(format!("daemon {} exited ({st})", d.node));
        }
    }
    let gap_max = max_gap.values().max().copied().unwrap_or_default();
    let left_min = lease_watch
        .iter()
        .filter(|(n, _)| n.as_str() != "control")
        .filter_map(|(_, w)| w.min_left)
        .min()
        .unwrap_or(-1);
    let low_runs = lease_watch
        .iter()
        .filter(|(n, _)| n.as_str() != "control")
        .map(|(_, w)| w.under_1s)
        .sum::<u64>();
    for (node, w) in &lease_watch {
        println!("daemon/soak: lease of {node}: {}", w.describe());
    }
    let control_rtt = Summary::of(&control_rtts);
    if let Some(sm) = &control_rtt {
        println!(
            "daemon/soak: control lease (this bench's own keepalive every TTL/3): renewal round trip {sm}; {control_lost} renewal(s) unanswered within the TTL"
        );
    }
    println!(
        "daemon/soak: {:.0}s, {nodes} daemons, TTL {ttl}s: {} violation(s); {renewals} liveness writes, longest gap between two of one node {:.3}s (a write is skipped when it takes over TTL/3: not the renewal gap) (per node: {}); least lease TTL left seen {left_min}s (whole seconds, polled every 0.2 s; under 1 s in {low_runs} polls); {logged} warn/error log lines; load averages {}",
        elapsed.as_secs_f64(),
        violations.len(),
        gap_max.as_secs_f64(),
        max_gap
            .iter()
            .map(|(n, g)| format!("{n} {:.3}s", g.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        loads.join(" | "),
    );
    println!(
        "BENCH soak secs={:.0} daemons={nodes} ttl_s={ttl} burn={burn} violations={} liveness_writes={renewals} max_renewal_gap_s={:.3} min_lease_ttl_left_s={left_min} polls_under_1s={low_runs} control_rtt_p99_ms={:.1} control_rtt_max_ms={:.1} control_lost={control_lost} log_lines={logged} load_start={load_start:?} load_end={load_end:?}",
        elapsed.as_secs_f64(),
        violations.len(),
        gap_max.as_secs_f64(),
        control_rtt.map_or(f64::NAN, |s| s.p99.as_secs_f64() * 1e3),
        control_rtt.map_or(f64::NAN, |s| s.max.as_secs_f64() * 1e3),
    );
    if !violations.is_empty() {
        let refs: Vec<&Daemon> = daemons.iter().collect();
        dump_logs(&refs);
        panic!(
            "daemon/soak: a quiet cluster saw what only a death causes:\n  {}",
            violations.join("\n  ")
        );
    }
}

fn main() {
    let Some(bin) = fenced_bin() else {
        println!(
            "daemon: SKIPPED: no fenced binary (run `cargo build -p fenced` or set FENCED_BIN); \
             benches/scripts/daemon.sh builds it"
        );
        return;
    };
    let deaths = env_u64("FENCED_BENCH_DEATHS").map_or_else(
        || samples(1, 20),
        |n| usize::try_from(n).expect("FENCED_BENCH_DEATHS"),
    );
    let window = if full_mode() {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(3)
    };
    let soak_secs = env_u64("FENCED_BENCH_SOAK_SECS").unwrap_or(if full_mode() { 600 } else { 5 });
    let soak_nodes = env_u64("FENCED_BENCH_SOAK_DAEMONS").unwrap_or(3);
    let burn = env_u64("FENCED_BENCH_SOAK_BURN").unwrap_or(0);
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = runtime();
    let etcd = Etcd::start();
    let only = std::env::var("FENCED_BENCH_ONLY").unwrap_or_default();
    if !["", "footprint", "detect", "soak"].contains(&only.as_str()) {
        panic!("FENCED_BENCH_ONLY={only:?}: use footprint, detect or soak");
    }
    if only.is_empty() || only == "footprint" {
        rt.block_on(footprint(&bin, &etcd, 1_000, window, dir.path()));
    }
    if only.is_empty() || only == "detect" {
        rt.block_on(detection(&bin, &etcd, deaths, dir.path()));
    }
    if only.is_empty() || only == "soak" {
        rt.block_on(soak(
            &bin,
            &etcd,
            usize::try_from(soak_nodes).expect("FENCED_BENCH_SOAK_DAEMONS"),
            Duration::from_secs(soak_secs),
            usize::try_from(burn).expect("FENCED_BENCH_SOAK_BURN"),
            dir.path(),
        ));
    }
}
