//! An etcd member that accepts TCP connections but does not answer: the process is
//! stopped (`SIGSTOP`: a hung etcd, a stalled disk), so the kernel still completes
//! connections on its client port and nothing is ever answered on them. Requests and
//! lease keepalives the client balances onto it hang until a timeout. The daemons must
//! take it out of rotation: no healthy agent self-fences, a death during the hang is
//! fenced once and promptly, and the store logs which endpoint it stopped using.
//!
//! Before the store probed members with a linearizable read (it only tried a TCP
//! connect, which a stopped process still accepts), every healthy agent self-fenced in
//! both in-process scenarios and deaths took 7-24 s to fence.
//!
//! The hang ends as it does in production, with SIGCONT — except a hung *leader* on an
//! etcd without the fix for etcd-io/etcd#15247 (Debian 12's 3.4.23), which is SIGKILLed
//! and restarted instead (see [`end_hang`]). The tests then check what the resumed
//! member did: a resumed follower or a restarted leader revokes no live lease and gets
//! no healthy node fenced. A *continued leader* may still revoke live leases on 3.5.16
//! (the fix does not cover a frozen process, see [`end_hang`]): each node it did that
//! to must have stopped its I/O and been fenced at most once, the others untouched.
//! `scripts/test-all` runs this file on 3.4.23 and on Debian 13's 3.5.16 (`FENCED_ETCD`).
//!
//! Each test prints its measurements and the etcd version (`eprintln!`, shown with
//! `--nocapture`).

mod common;

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::cluster::{EtcdCluster, Fleet, Stopped};
use common::process::FencedRun;
use common::*;
use fenced::store::EtcdStore;
use test_support::EtcdVersion;

/// The tests of this file run one at a time (timing is their subject; see
/// `etcd_faults.rs`).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Everything the in-process daemons log (all tests of this binary; each test reads
/// from the offset it started at).
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (before `Fleet::new`, whose own is then ignored)
/// and returns the log offset of this test's start.
fn capture_log() -> usize {
    // The store's "back in rotation" line is at info.
    let filter = std::env::var("FENCED_TEST_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(format!(
            "{filter},fenced::store=info"
        )))
        .with_ansi(false)
        .with_writer(|| LogWriter)
        .try_init();
    LOG.lock().unwrap().len()
}

fn log_since(offset: usize) -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap()[offset..]).into_owned()
}

/// How a hang ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum HangEnd {
    /// SIGCONT: the member resumed where it stopped, as a hung etcd does in production.
    Continued,
    /// SIGKILL and a restart on its data dir (the 3.4.23 workaround, see [`end_hang`]).
    Restarted,
}

impl HangEnd {
    fn describe(self) -> &'static str {
        match self {
            Self::Continued => "SIGCONT",
            Self::Restarted => "SIGKILL + restart (this etcd has etcd-io/etcd#15247)",
        }
    }
}

/// Ends the hang of member `i`: SIGCONT, as in production. Except a stopped *leader*
/// on an etcd without the fix for etcd-io/etcd#12528 / #15247 (3.4 before 3.4.31, 3.5
/// before 3.5.13: Debian 12's 3.4.23), which is SIGKILLed and restarted instead: there a
/// leader that stalls for longer than a lease's TTL and then resumes may still act as
/// the lessor for a moment and revoke every lease it saw no renewal for, although the
/// new leader renewed them. We hit it in CI on 3.4.23: at SIGCONT all three healthy
/// members' leases were revoked and the daemons fenced each other.
///
/// The fix (etcd-io/etcd#16822, in 3.5.16) makes a leader confirm its leadership before
/// it revokes, but skips that check while its raft loop ticked recently, and a process
/// continued after SIGSTOP ticks at once. Measured on 3.5.16: after SIGCONT the old
/// leader still proposed revocations (its log: `failed to revoke lease ... lease not
/// found` for an already expired one) and revoked live leases in 8 of 16 runs of the
/// binaries test and 2 of 8 of the in-process one (both times all three healthy
/// nodes'). The README's etcd section documents it for operators.
fn end_hang(stopped: Stopped, etcd: &mut EtcdCluster, i: usize, which: Which) -> HangEnd {
    if which == Which::Leader && !EtcdVersion::current().has_stale_leader_revoke_check() {
        // No SIGCONT after the kill: the PID is reaped and may be reused.
        std::mem::forget(stopped);
        etcd.kill(i); // SIGKILL ends a stopped process too
        etcd.restart(i);
        HangEnd::Restarted
    } else {
        drop(stopped); // SIGCONT
        HangEnd::Continued
    }
}

/// How long after the hang ends the tests wait before they check what the resumed
/// member did: etcd-io/etcd#15247 revoked the leases at once, and the controllers fenced
/// their holders within a sweep (500 ms; 1 s for the binaries); 3 × TTL leaves room
/// for a loaded machine.
const AFTER_RESUME: Duration = Duration::from_secs(6);

/// The remaining TTL of each lease in `leases` (-1: revoked or expired), asked of etcd
/// directly, so the answer does not depend on the daemons' own view.
async fn lease_ttls(endpoints: &[String], leases: &[i64]) -> Vec<i64> {
    let opts = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(5));
    let mut c = etcd_client::Client::connect(endpoints, Some(opts))
        .await
        .expect("connect to the test etcd");
    let mut out = Vec::new();
    for &l in leases {
        let ttl = c
            .lease_time_to_live(l, None)
            .await
            .unwrap_or_else(|e| panic!("TimeToLive of lease {l:x}: {e}"))
            .ttl();
        out.push(ttl);
    }
    out
}

/// Writes the log of the member that hung to `<tmp>/hung_member_<test>.etcd.log` (kept
/// after the cluster's temp dir is gone) and prints its path.
fn keep_etcd_log(etcd: &EtcdCluster, hung: usize, test: &str) {
    let f = std::env::temp_dir().join(format!("hung_member_{test}.etcd.log"));
    if std::fs::write(&f, etcd.log(hung)).is_ok() {
        eprintln!("  hung member's etcd log: {}", f.display());
    }
}

/// The live members (nodes whose membership key is on a live lease).
async fn members(store: &EtcdStore) -> Vec<String> {
    let mut m: Vec<String> = store
        .status()
        .await
        .expect("status")
        .members
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    m.sort();
    m
}

/// Reads through `store` every 100 ms and records each read's latency and result: what
/// a client of the daemon's store sees while a member hangs.
fn spawn_reader(store: EtcdStore) -> tokio::task::JoinHandle<Vec<(Duration, bool)>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        loop {
            let t = Instant::now();
            let ok = store.generation(&node("d1")).await.is_ok();
            out.push((t.elapsed(), ok));
            if out.len() >= 120 {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Watches the captured log from `offset` for a line naming `endpoint` and containing
/// `what`; returns how long after `from` it appeared (`None` within 15 s).
fn spawn_log_watch(
    offset: usize,
    endpoint: String,
    what: &'static str,
    from: Instant,
) -> tokio::task::JoinHandle<Option<Duration>> {
    tokio::spawn(async move {
        while from.elapsed() < Duration::from_secs(15) {
            if log_since(offset)
                .lines()
                .any(|l| l.contains(&endpoint) && l.contains(what))
            {
                return Some(from.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    })
}

/// Polls `n`'s generation (errors retried) and returns the time from `at` to the
/// first read of generation 1; panics on a second bump or after `timeout`.
async fn time_to_fence(store: &EtcdStore, n: &str, at: Instant, timeout: Duration) -> Duration {
    loop {
        if let Ok((g, _)) = store.generation(&node(n)).await {
            assert!(g <= 1, "{n} bumped to {g}: more than once");
            if g == 1 {
                return at.elapsed();
            }
        }
        assert!(at.elapsed() < timeout, "{n} not fenced within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A healthy kill -> bump takes about TTL plus the watch or sweep (~0.5 s); measured
/// during a hang with the fix: 1.6–2.9 s (follower), 2.0–4.4 s (leader), 4.0–5.0 s
/// (binaries). The bounds leave room for a loaded 2-core CI machine; the old code
/// failed them (7–24 s) and, independently, the self-fence, slow-read and log checks.
const FENCE_BOUND: Duration = Duration::from_secs(6);

/// With the leader hung, leases expire only once a new one is elected (~1.5 s; a
/// SIGKILLed leader delays fences as much, `etcd_faults.rs`).
const FENCE_BOUND_LEADER: Duration = Duration::from_secs(7);

/// How long after the hang the store must have taken the member out of rotation
/// (the first request the hang holds past the slow threshold TTL/4 = 500 ms starts a
/// probe round, whose read times out after TTL/4 = 500 ms, + scheduling slack).
const OUT_OF_ROTATION_BOUND: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Which {
    Follower,
    Leader,
}

/// Three daemons and two victims on a 3-member cluster; one member (a follower or the
/// leader) is stopped; v1 dies 300 ms into the hang, v2 3 s into it; the hang lasts
/// 3 x TTL + 2 s.
async fn hung_member_scenario(which: Which) {
    let _serial = SERIAL.lock().await;
    let log0 = capture_log();
    let t_test = Instant::now();
    let mut etcd = EtcdCluster::new(3).start();
    let fleet = Fleet::new(etcd.endpoints());
    let store = fleet.store().await;
    let mut daemons = Vec::new();
    for n in ["d1", "d2", "d3"] {
        daemons.push(fleet.daemon(n).await);
    }
    let v1 = fleet.agent("v1").await;
    let v2 = fleet.agent("v2").await;
    let leader = etcd.leader(Duration::from_secs(5)).await;
    let hung = match which {
        Which::Leader => leader,
        Which::Follower => (0..etcd.len()).find(|&i| i != leader).unwrap(),
    };
    let hung_ep = etcd.endpoint(hung);
    let bound = match which {
        Which::Leader => FENCE_BOUND_LEADER,
        Which::Follower => FENCE_BOUND,
    };
    // Let every daemon's connections spread over the members (requests, watches,
    // keepalive streams), so some of them sit on the member about to hang.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reader = spawn_reader(fleet.store().await);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let t_hang = Instant::now();
    let stopped = Stopped::new(etcd.pid(hung).expect("member runs"));
    let out_watch = spawn_log_watch(log0, hung_ep.clone(), "out of rotation", t_hang);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t1 = Instant::now();
    v1.kill();
    let fenced1 = time_to_fence(&store, "v1", t1, Duration::from_secs(25)).await;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(t_hang.elapsed())).await;
    let t2 = Instant::now();
    v2.kill();
    let fenced2 = time_to_fence(&store, "v2", t2, Duration::from_secs(25)).await;
    let new_leader = if which == Which::Leader {
        let others: Vec<usize> = (0..etcd.len()).filter(|&i| i != hung).collect();
        Some(others.into_iter().find(|&i| etcd.healthy(i)))
    } else {
        None
    };
    // Stay hung past 3 x TTL (and past the agents' 2 x TTL self-fence margin).
    tokio::time::sleep((3 * TTL + Duration::from_secs(2)).saturating_sub(t_hang.elapsed())).await;
    let hang_lasted = t_hang.elapsed();
    let agents_alive: Vec<bool> = daemons
        .iter()
        .map(|d| !d.agent.task.is_finished())
        .collect();
    let log_hung = log_since(log0);
    let out_line = log_hung
        .lines()
        .find(|l| l.contains(&hung_ep) && l.contains("out of rotation"))
        .map(str::to_owned);

    let out_after = out_watch.await.unwrap();
    // What the hang did to the healthy daemons, read before it ends (see `end_hang`).
    let mut healthy = Vec::new();
    for d in &daemons {
        let n = d.agent.node.as_str();
        healthy.push((
            n,
            generation(&store, n).await,
            device::can_write(&fleet.host(n)),
        ));
    }
    let t_end = Instant::now();
    let ended = end_hang(stopped, &mut etcd, hung, which);
    let back_after = spawn_log_watch(log0, hung_ep.clone(), "back in rotation", t_end)
        .await
        .unwrap();
    // What the resumed (or restarted) member did to the healthy daemons.
    tokio::time::sleep(AFTER_RESUME.saturating_sub(t_end.elapsed())).await;
    let leases: Vec<i64> = daemons.iter().map(|d| d.agent.lease).collect();
    let ttls_after = lease_ttls(&etcd.endpoints(), &leases).await;
    let members_after = members(&store).await;
    let mut healthy_after = Vec::new();
    for d in &daemons {
        let n = d.agent.node.as_str();
        healthy_after.push((
            n,
            !d.agent.task.is_finished(),
            d.agent.gate.is_open(),
            generation(&store, n).await,
            device::can_write(&fleet.host(n)),
        ));
    }
    let reads = reader.await.unwrap();
    let slow_reads: Vec<u128> = reads
        .iter()
        .filter(|(d, _)| *d > Duration::from_millis(500))
        .map(|(d, _)| d.as_millis())
        .collect();
    let failed_reads = reads.iter().filter(|(_, ok)| !ok).count();
    let ctl_failed: Vec<u64> = daemons
        .iter()
        .map(|d| d.controller.stats().failed.load(Ordering::Relaxed))
        .collect();
    let ctl_fenced: Vec<u64> = daemons
        .iter()
        .map(|d| d.controller.stats().fenced.load(Ordering::Relaxed))
        .collect();
    let spurious: Vec<&str> = daemons
        .iter()
        .zip(&agents_alive)
        .filter(|(_, alive)| !**alive)
        .map(|(d, _)| d.agent.node.as_str())
        .collect();

    eprintln!(
        "3-member etcd {}, {which:?} m{} SIGSTOPped for {:.1} s (TTL {TTL:?}, sweep 500 ms){}",
        EtcdVersion::current(),
        hung + 1,
        hang_lasted.as_secs_f32(),
        match new_leader {
            Some(Some(l)) => format!("; m{} healthy (leader elected) after the fences", l + 1),
            Some(None) => "; no other member healthy after the fences".into(),
            None => String::new(),
        }
    );
    eprintln!(
        "  kill->bump: v1 (killed 300 ms into the hang) {} ms, v2 (3 s into it) {} ms; bound {} ms",
        fenced1.as_millis(),
        fenced2.as_millis(),
        bound.as_millis()
    );
    eprintln!(
        "  reads every 100 ms through a store: {} of {} over 500 ms {slow_reads:?}, {failed_reads} failed",
        slow_reads.len(),
        reads.len()
    );
    eprintln!("  healthy agents self-fenced during the hang: {spurious:?}");
    eprintln!("  controllers fenced {ctl_fenced:?}, failed attempts {ctl_failed:?}");
    eprintln!(
        "  out of rotation {out_after:?} after SIGSTOP (bound {OUT_OF_ROTATION_BOUND:?}); store log: {}",
        out_line.as_deref().unwrap_or("(no out-of-rotation line)")
    );
    eprintln!(
        "  hang ended by {}; back in rotation {back_after:?} after",
        ended.describe()
    );
    eprintln!(
        "  {AFTER_RESUME:?} after: healthy leases' TTLs {ttls_after:?}, members {members_after:?}, (node, running, I/O gate open, generation, device writable) {healthy_after:?}"
    );
    if ttls_after.iter().any(|t| *t <= 0) {
        eprintln!(
            "  etcd {} REVOKED LIVE LEASES when the hang ended by {} (etcd-io/etcd#15247 with a frozen process)",
            EtcdVersion::current(),
            ended.describe()
        );
    }
    eprintln!("  test took {:.1} s", t_test.elapsed().as_secs_f32());
    let log_file = std::env::temp_dir().join(format!("hung_member_{which:?}.log"));
    if std::fs::write(&log_file, log_since(log0)).is_ok() {
        eprintln!("  daemons' log: {}", log_file.display());
    }
    keep_etcd_log(&etcd, hung, &format!("{which:?}"));

    assert!(
        spurious.is_empty(),
        "healthy agents self-fenced: {spurious:?}"
    );
    for v in ["v1", "v2"] {
        assert_eq!(generation(&store, v).await, 1, "{v}: one bump");
        let audits = fences_of(&store, v).await;
        assert_eq!(audits.len(), 1, "{v}: one completed fence: {audits:?}");
        assert_eq!(audits[0]["fencer_result"], "confirmed", "{v}");
    }
    for (n, g, writes) in &healthy {
        assert_eq!(*g, 0, "healthy {n} was fenced during the hang");
        assert!(
            *writes,
            "healthy {n} lost its device access during the hang"
        );
    }
    assert!(
        fenced1 <= bound && fenced2 <= bound,
        "fenced in {fenced1:?} / {fenced2:?}, bound {bound:?}"
    );
    assert!(
        slow_reads.len() <= 2,
        "reads kept hanging on the stopped member: {slow_reads:?} ms"
    );
    let out_line = out_line.unwrap_or_else(|| {
        panic!("the store did not log {hung_ep} out of rotation; log:\n{log_hung}")
    });
    assert!(out_line.contains("etcd_endpoint"), "step field: {out_line}");
    assert!(
        out_after.is_some_and(|d| d <= OUT_OF_ROTATION_BOUND),
        "out of rotation after {out_after:?}, bound {OUT_OF_ROTATION_BOUND:?}"
    );
    // The line is logged once per transition, not once per probe.
    let per_daemon = log_hung
        .lines()
        .filter(|l| l.contains(&hung_ep) && l.contains("out of rotation"))
        .count();
    // One store per agent, controller and reader (and the test's own).
    assert!(
        per_daemon <= 2 * daemons.len() + 2 + 2,
        "logged {per_daemon} times: once per store and transition expected"
    );
    assert!(
        back_after.is_some(),
        "{hung_ep} back in rotation after the hang ended: {}",
        log_since(log0)
            .lines()
            .filter(|l| l.contains("etcd_endpoint"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // What the resumed member did. A resumed follower or a restarted leader revokes no
    // live lease; a continued leader may (see `end_hang`), and then each node it did
    // that to has self-fenced (its I/O gate closed) and was fenced at most once, its
    // device access severed if so (when all three leases go, the fenced controllers'
    // preempts fail and the last fence stays owed: safe, the node stopped its I/O).
    // The others are untouched.
    let revoked: Vec<&str> = healthy
        .iter()
        .map(|h| h.0)
        .zip(&ttls_after)
        .filter(|(_, ttl)| **ttl <= 0)
        .map(|(n, _)| n)
        .collect();
    assert!(
        revoked.is_empty() || (which == Which::Leader && ended == HangEnd::Continued),
        "live leases of {revoked:?} revoked after the hang ended by {}: TTLs {ttls_after:?}",
        ended.describe()
    );
    let kept: Vec<&str> = healthy
        .iter()
        .map(|h| h.0)
        .filter(|n| !revoked.contains(n))
        .collect();
    assert_eq!(
        members_after,
        kept,
        "members after the hang ended by {} (revoked: {revoked:?})",
        ended.describe()
    );
    for (n, running, gate_open, g, writes) in &healthy_after {
        if revoked.contains(n) {
            assert!(
                !*running && !*gate_open,
                "{n} did not self-fence after etcd revoked its lease"
            );
            assert!(*g <= 1, "{n} fenced {g} times");
            let audits = fences_of(&store, n).await;
            assert_eq!(audits.len() as u64, *g, "{n}: fences {audits:?}");
            assert!(
                *g == 0 || !*writes,
                "{n} fenced but still has device access"
            );
        } else {
            assert!(
                *running && *gate_open,
                "healthy {n} self-fenced after the hang ended"
            );
            assert_eq!(*g, 0, "healthy {n} was fenced after the hang ended");
            assert!(
                *writes,
                "healthy {n} lost its device access after the hang ended"
            );
        }
    }
    for d in daemons {
        d.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_follower_is_taken_out_of_rotation_and_a_death_is_fenced_once() {
    hung_member_scenario(Which::Follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_leader_is_taken_out_of_rotation_and_a_death_is_fenced_once() {
    hung_member_scenario(Which::Leader).await;
}

fn fenced_run(endpoints: &str, n: &str, dir: &std::path::Path) -> FencedRun {
    FencedRun::start(endpoints, "/hung", n, dir, &[], &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_binaries_survive_a_hung_leader_and_fence_a_peer_once() {
    let _serial = SERIAL.lock().await;
    capture_log();
    let mut etcd = EtcdCluster::new(3).start();
    let eps = etcd.endpoints().join(",");
    let dir = tempfile::tempdir().unwrap();
    let mut n1 = fenced_run(&eps, "n1", dir.path());
    let mut n2 = fenced_run(&eps, "n2", dir.path());
    let mut n3 = fenced_run(&eps, "n3", dir.path());
    let fleet = Fleet {
        root: "/hung".into(),
        ..Fleet::new(etcd.endpoints())
    };
    let store = fleet.store().await;
    wait_members(&store, &["n1", "n2", "n3"]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = etcd.leader(Duration::from_secs(5)).await;
    let hung_ep = etcd.endpoint(leader);
    let t_hang = Instant::now();
    let stopped = Stopped::new(etcd.pid(leader).expect("leader runs"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    n2.kill();
    let took = time_to_fence(&store, "n2", t, Duration::from_secs(25)).await;
    tokio::time::sleep((3 * TTL + Duration::from_secs(2)).saturating_sub(t_hang.elapsed())).await;
    let survivors: Vec<(bool, String)> = [&mut n1, &mut n3]
        .into_iter()
        .map(|d| (d.running(), d.log()))
        .collect();
    let gens = (
        generation(&store, "n1").await,
        generation(&store, "n3").await,
    );
    let n2_fences = fences_of(&store, "n2").await.len();
    let hang_lasted = t_hang.elapsed();
    let t_end = Instant::now();
    let ended = end_hang(stopped, &mut etcd, leader, Which::Leader);
    // What the resumed (or restarted) leader did to the survivors.
    tokio::time::sleep(AFTER_RESUME.saturating_sub(t_end.elapsed())).await;
    let running_after = (n1.running(), n3.running());
    let gens_after = (
        generation(&store, "n1").await,
        generation(&store, "n3").await,
    );
    let members_after = members(&store).await;
    let n2_fences_after = fences_of(&store, "n2").await;
    eprintln!(
        "fenced binaries, 3-member etcd {}, leader m{} SIGSTOPped for {:.1} s: SIGKILLed n2 fenced in {} ms (TTL 2 s); n1, n3 running: {:?}",
        EtcdVersion::current(),
        leader + 1,
        hang_lasted.as_secs_f32(),
        took.as_millis(),
        survivors.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    eprintln!(
        "  hang ended by {}; {AFTER_RESUME:?} after: n1, n3 running {running_after:?}, generations {gens_after:?}, members {members_after:?}",
        ended.describe()
    );
    keep_etcd_log(&etcd, leader, "binaries");
    for (i, (alive, log)) in survivors.iter().enumerate() {
        assert!(*alive, "survivor {i} exited: {log}");
        assert!(
            log.lines()
                .any(|l| l.contains(&hung_ep) && l.contains("out of rotation")),
            "survivor {i} took the hung leader out of rotation: {log}"
        );
    }
    assert_eq!(n2_fences, 1);
    assert_eq!(gens, (0, 0), "n1, n3 not fenced during the hang");
    assert!(
        took <= FENCE_BOUND_LEADER,
        "fenced in {took:?}, bound {FENCE_BOUND_LEADER:?}"
    );
    // What the resumed leader did: a restarted one revokes no live lease; a continued
    // one may (see `end_hang`), and then each survivor whose lease it revoked has left
    // the members and exited (self-fenced), and was fenced at most once (a daemon's
    // controller exits with its agent, so two revoked survivors may both be gone before
    // either fences the other: the fence stays owed). The others are untouched.
    let after = [
        ("n1", running_after.0, gens_after.0),
        ("n3", running_after.1, gens_after.1),
    ];
    let revoked: Vec<&str> = after
        .iter()
        .filter(|(n, ..)| !members_after.iter().any(|m| m == n))
        .map(|(n, ..)| *n)
        .collect();
    if !revoked.is_empty() {
        eprintln!(
            "  etcd {} REVOKED THE LIVE LEASES of {revoked:?} when the hang ended by {} (etcd-io/etcd#15247 with a frozen process)",
            EtcdVersion::current(),
            ended.describe()
        );
    }
    assert!(
        revoked.is_empty() || ended == HangEnd::Continued,
        "live leases of {revoked:?} revoked after the hang ended by {}",
        ended.describe()
    );
    for (n, running, g) in after {
        let log = if n == "n1" { n1.log() } else { n3.log() };
        if revoked.contains(&n) {
            assert!(!running, "{n} runs on after etcd revoked its lease: {log}");
            assert!(g <= 1, "{n} fenced {g} times");
            let audits = fences_of(&store, n).await;
            assert!(
                audits.len() == g as usize,
                "{n}: generation {g}, fences {audits:?}"
            );
        } else {
            assert!(running, "{n} exited after the hang ended: {log}");
            assert_eq!(g, 0, "{n} fenced after the hang ended");
        }
    }
    assert_eq!(
        n2_fences_after.len(),
        1,
        "n2 fenced once after the hang ended by {}: {n2_fences_after:?}\nn1 {}\nn3 {}",
        ended.describe(),
        n1.log(),
        n3.log()
    );
}
