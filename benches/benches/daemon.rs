//! The `fenced` daemon as a process.
//!
//! 1. Detection to fence complete: three `fenced run` daemons (agent + controller each,
//!    `--fencer none`, TTL 5 s) on a real local etcd; SIGKILL one daemon and time the
//!    SIGKILL to the generation bump of its node (seen by a watch on `gen/<node>`).
//!    The killed node is restarted (fresh instance) between samples.
//! 2. Footprint: one idle `fenced run` in a cluster with 1 000 members (held by this
//!    bench on one lease): RSS (VmRSS, VmHWM) and CPU time over a window.
//!
//! Needs the `fenced` binary: `$FENCED_BIN`, else `fenced` next to this bench's
//! profile directory (`cargo build -p fenced` first; benches/scripts/daemon.sh does).
//! Quick (default): 1 detection sample, a 3 s footprint window.
//! Full: `FENCED_BENCH_FULL=1`: 20 detection samples, a 30 s window.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use benches::{Etcd, Summary, full_mode, runtime, samples};
use etcd_client::{Client, EventType, PutOptions, Txn, TxnOp, WatchOptions};

const TTL_SECS: u64 = 5;

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

/// A `fenced run` child, SIGKILLed by PID on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(
        bin: &PathBuf,
        ep: &str,
        root: &str,
        node: &str,
        instance: &str,
        dir: &std::path::Path,
    ) -> Self {
        let log = dir.join(format!("{node}-{instance}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        // Each incarnation stands for a fresh host (a replacement or a reboot): on the same
        // boot id a fenced node's restart is refused (exit 5, `fenced unfence`).
        let boot_id = dir.join(format!("{node}-{instance}.boot_id"));
        std::fs::write(&boot_id, format!("{node}-{instance}-boot\n")).expect("boot id file");
        let child = Command::new(bin)
            .args(["run", "--etcd-endpoints", ep, "--root", root])
            .args(["--fencer", "none", "--node-id", node])
            .args(["--instance-id", instance])
            .args(["--ttl-secs", &TTL_SECS.to_string()])
            .args(["--sweep-secs", "30", "--claim-ttl-secs", "30"])
            .env("RUST_LOG", "warn")
            .env("FENCED_LOG", "warn")
            .env("FENCED_BOOT_ID_FILE", &boot_id)
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Self { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        // Child::kill sends SIGKILL to exactly this PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
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
            for d in logs {
                eprintln!(
                    "--- {}\n{}",
                    d.log.display(),
                    std::fs::read_to_string(&d.log).unwrap_or_default()
                );
            }
            panic!("{what} did not join within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn detection(bin: &PathBuf, etcd: &Etcd, n: usize, dir: &std::path::Path) {
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
    let mut lat = Vec::new();
    for s in 0..n {
        // The generation n3 joined with (its first join writes `gen/n3` in a second
        // transaction: wait for it, so that write is not taken for the bump).
        let t_gen = Instant::now();
        let before = loop {
            let r = client
                .get(format!("{root}gen/n3"), None)
                .await
                .expect("get gen");
            if let Some(kv) = r.kvs().first() {
                break kv
                    .value_str()
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .expect("generation value");
            }
            assert!(
                t_gen.elapsed() < Duration::from_secs(30),
                "gen/n3 never written"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut stream = client
            .watch(format!("{root}gen/n3"), Some(WatchOptions::new()))
            .await
            .expect("watch");
        let pid = daemons[2].pid();
        let t0 = Instant::now();
        daemons[2].kill();
        loop {
            let msg =
                tokio::time::timeout(Duration::from_secs(4 * TTL_SECS + 10), stream.message())
                    .await
                    .unwrap_or_else(|_| {
                        panic!("sample {s}: no bump of n3 after SIGKILL of pid {pid}")
                    })
                    .expect("watch")
                    .expect("watch open");
            let bumped = msg.events().iter().any(|e| {
                e.event_type() == EventType::Put
                    && e.kv()
                        .and_then(|kv| kv.value_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .is_some_and(|g| g > before)
            });
            if bumped {
                break;
            }
        }
        let d = t0.elapsed();
        println!(
            "daemon/detect: sample {s}: SIGKILL -> bump {:.3}s",
            d.as_secs_f64()
        );
        lat.push(d);
        // A fresh instance of n3 rejoins for the next sample.
        daemons[2] = Daemon::start(bin, &ep, root, "n3", &format!("{}", s + 1), dir);
        let refs: Vec<&Daemon> = daemons.iter().collect();
        wait_member(
            &mut client,
            &format!("{root}membership/n3"),
            "restarted n3",
            &refs,
        )
        .await;
    }
    let sm = Summary::of(&lat).expect("samples");
    println!("daemon/detect: SIGKILL -> generation bump, TTL {TTL_SECS}s, 3 daemons: {sm}");
    println!(
        "BENCH detect n={} p50_s={:.3} p99_s={:.3} max_s={:.3} ttl_s={TTL_SECS}",
        sm.n,
        sm.p50.as_secs_f64(),
        sm.p99.as_secs_f64(),
        sm.max.as_secs_f64()
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

async fn footprint(
    bin: &PathBuf,
    etcd: &Etcd,
    members: usize,
    window: Duration,
    dir: &std::path::Path,
) {
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
    let pid = d.pid();
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

fn main() {
    let Some(bin) = fenced_bin() else {
        println!(
            "daemon: SKIPPED: no fenced binary (run `cargo build -p fenced` or set FENCED_BIN); \
             benches/scripts/daemon.sh builds it"
        );
        return;
    };
    let n = samples(1, 20);
    let window = if full_mode() {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(3)
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = runtime();
    let etcd = Etcd::start();
    let only = std::env::var("FENCED_BENCH_ONLY").unwrap_or_default();
    if only.is_empty() || only == "footprint" {
        rt.block_on(footprint(&bin, &etcd, 1_000, window, dir.path()));
    }
    if only.is_empty() || only == "detect" {
        rt.block_on(detection(&bin, &etcd, n, dir.path()));
    }
}
