//! A restart does not unfence (issue 14, part 1): the `fenced` binary as child processes
//! against a real etcd (`--fencer none`, no device). A node fenced since its last join
//! whose daemon starts again on the same boot of its host is refused (exit status 5,
//! nothing written to etcd); a new boot id (a reboot) or `fenced unfence` lets it join.
//!
//! The boot id is read from `FENCED_BOOT_ID_FILE` (a test-only override of
//! /proc/sys/kernel/random/boot_id): every daemon here runs on one machine, and a test
//! "reboots" a node's host by writing a new id into its file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::{Daemon, etcdctl, fenced, run_args, status_json, stderr, wait};

const ROOT: &str = "/restart";

fn boot_file(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("{node}.boot_id"))
}

/// Starts `fenced run` for `node`, its boot id read from `<dir>/<node>.boot_id`.
fn daemon(etcd: &Etcd, node: &str, dir: &Path) -> Daemon {
    daemon_with(etcd, node, dir, &[], &[])
}

fn daemon_with(
    etcd: &Etcd,
    node: &str,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
) -> Daemon {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{node}.log")))
        .unwrap();
    Daemon(
        fenced()
            .args(run_args(&etcd.endpoint(), ROOT, node))
            .arg("--pid-file")
            .arg(dir.join(format!("{node}.pid")))
            .env("FENCED_BOOT_ID_FILE", boot_file(dir, node))
            .env("FENCED_LOG", "info")
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Starts `node` and expects it to exit within 20 s (a refused start): its status and
/// log. A daemon still running then joined instead: the test fails.
fn refused_start(etcd: &Etcd, node: &str, dir: &Path) -> (ExitStatus, String) {
    let log = dir.join(format!("{node}.log"));
    let before = std::fs::read_to_string(&log).map_or(0, |s| s.len());
    let mut d = daemon(etcd, node, dir);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = d.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{node}'s daemon is still running: it started instead of being refused; status: {}",
            status(etcd)["nodes"]
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    (status, text[before..].to_owned())
}

fn status(etcd: &Etcd) -> serde_json::Value {
    status_json(etcd, ROOT)
}

fn generation(etcd: &Etcd, node: &str) -> Option<u64> {
    status(etcd)["nodes"][node]["generation"].as_u64()
}

fn is_member(etcd: &Etcd, node: &str) -> bool {
    status(etcd)["nodes"][node]["member"] == true
}

/// The store's revision and every key under the root with its value.
fn dump(etcd: &Etcd) -> (i64, String) {
    let v: serde_json::Value =
        serde_json::from_str(&etcdctl(etcd, &["get", ROOT, "--prefix", "-w", "json"])).unwrap();
    (
        v["header"]["revision"].as_i64().unwrap(),
        v["kvs"].to_string(),
    )
}

fn unfence(etcd: &Etcd, node: &str, reason: &str) -> Output {
    fenced()
        .args(["unfence", "--root", ROOT, "--node-id", node])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .args(["--reason", reason, "--operator", "alice"])
        .output()
        .unwrap()
}

fn leave(dir: &Path, node: &str, mut d: Daemon) {
    let o = fenced()
        .args(["leave", "--pid-file"])
        .arg(dir.join(format!("{node}.pid")))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(d.0.wait().unwrap().success());
}

#[test]
fn a_fenced_node_restarted_on_the_same_boot_is_refused_until_reboot_or_unfence() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    std::fs::write(boot_file(dir, "n1"), "boot-n1\n").unwrap();
    std::fs::write(boot_file(dir, "n3"), "boot-a\n").unwrap();
    let d1 = daemon(&etcd, "n1", dir);
    let mut d3 = daemon(&etcd, "n3", dir);
    wait("n1 and n3 members", || {
        is_member(&etcd, "n1") && is_member(&etcd, "n3")
    });
    // The join recorded n3's boot.
    let boot = etcdctl(&etcd, &["get", "/restart/boot/n3", "--print-value-only"]);
    let boot: serde_json::Value = serde_json::from_str(boot.trim()).unwrap();
    assert_eq!(
        boot,
        serde_json::json!({"boot_id": "boot-a", "generation": 0, "by": "join"})
    );

    // n3's daemon dies (its host stays up, its application may still run): fenced.
    d3.0.kill().unwrap();
    d3.0.wait().unwrap();
    wait("n3 fenced", || generation(&etcd, "n3") == Some(1));

    // Unfence is refused for a member and for a node that never existed.
    let o = unfence(&etcd, "n1", "testing");
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("refusing to unfence n1: it is a member"),
        "{}",
        stderr(&o)
    );
    let o = unfence(&etcd, "ghost", "testing");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no such node"), "{}", stderr(&o));

    // Nothing else writes etcd from here: n1 leaves (a clean leave, no fence).
    leave(dir, "n1", d1);
    let before = dump(&etcd);

    // n3's daemon starts again on the same boot: refused, exit 5, etcd untouched.
    let (st, log) = refused_start(&etcd, "n3", dir);
    assert_eq!(st.code(), Some(5), "{log}");
    assert!(
        log.contains("n3 was fenced since its last join (generation 0 at join, now 1)"),
        "{log}"
    );
    assert!(log.contains("Reboot the host"), "{log}");
    assert!(
        log.contains("fenced unfence --node-id n3 --reason"),
        "{log}"
    );
    assert_eq!(dump(&etcd), before, "a refused start changed etcd");

    // n1 left cleanly (never fenced): it starts again on the same boot.
    let _d1 = daemon(&etcd, "n1", dir);
    wait("n1 member again", || is_member(&etcd, "n1"));

    // The operator unfences n3 (audited, reason verbatim); its next start joins.
    let reason = "app on host3 stopped by hand; checked no writer left";
    let o = unfence(&etcd, "n3", reason);
    assert!(o.status.success(), "{}", stderr(&o));
    let audit = etcdctl(
        &etcd,
        &[
            "get",
            "--prefix",
            "/restart/audit/n3/",
            "--print-value-only",
        ],
    );
    assert!(
        audit.contains(&format!("\"reason\":\"{reason}\"")),
        "{audit}"
    );
    assert!(audit.contains("\"operator\":\"alice\""), "{audit}");
    assert!(audit.contains("\"action\":\"unfence\""), "{audit}");
    // The unfence's record reads back as an unfence, not as a malformed record (it was
    // read as a 42-byte generation, so `check` stayed WARNING after every unfence).
    let o = fenced()
        .args([
            "check",
            "--root",
            ROOT,
            "--etcd-endpoints",
            &etcd.endpoint(),
            // Judged here: the records, not the etcd release under them.
            "--accept-etcd-version",
            &test_support::etcd::EtcdVersion::current().to_string(),
        ])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(line.contains("malformed=0"), "{line}");
    assert_eq!(o.status.code(), Some(0), "{line}{}", stderr(&o));
    let o = fenced()
        .args([
            "audit",
            "--root",
            ROOT,
            "--etcd-endpoints",
            &etcd.endpoint(),
        ])
        .args(["--node", "n3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let shown = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        shown.contains("n3 UNFENCED at generation 1 by alice") && shown.contains(reason),
        "{shown}"
    );
    assert!(shown.contains("fenced, generation 0 -> 1"), "{shown}");
    let mut d3 = daemon(&etcd, "n3", dir);
    wait("n3 member after unfence", || is_member(&etcd, "n3"));
    // A member cannot be unfenced.
    let o = unfence(&etcd, "n3", "testing");
    assert!(stderr(&o).contains("it is a member"), "{}", stderr(&o));

    // Fenced again: the unfence was for one fence only.
    d3.0.kill().unwrap();
    d3.0.wait().unwrap();
    wait("n3 fenced again", || generation(&etcd, "n3") == Some(2));
    let (st, log) = refused_start(&etcd, "n3", dir);
    assert_eq!(st.code(), Some(5), "{log}");
    assert!(log.contains("(generation 1 at join, now 2)"), "{log}");

    // A reboot of n3's host (a new boot id): it joins.
    std::fs::write(boot_file(dir, "n3"), "boot-b\n").unwrap();
    let _d3 = daemon(&etcd, "n3", dir);
    wait("n3 member after reboot", || is_member(&etcd, "n3"));
}

/// `--on-fence`: a daemon that self-fences (here: etcd stops answering, so its lease
/// is not renewed) runs its hook, or reboots through SysRq `b`, then exits 3. The
/// reboot is not real: `FENCED_SYSRQ_TRIGGER_FILE` (test-only) points it at a file.
#[test]
fn on_fence_runs_the_hook_or_requests_the_reboot_then_exits_3() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    for n in ["n1", "n2", "n3"] {
        std::fs::write(boot_file(dir, n), format!("boot-{n}\n")).unwrap();
    }
    let marker = dir.join("hook-ran");
    let hook = format!(
        "exec:echo \"$FENCED_NODE_ID $FENCED_GENERATION $FENCED_FENCE_REASON\" > {}",
        marker.display()
    );
    let sysrq = dir.join("sysrq-trigger");
    std::fs::write(&sysrq, "").unwrap();
    let mut d1 = daemon_with(&etcd, "n1", dir, &["--on-fence", &hook], &[]);
    let mut d2 = daemon_with(
        &etcd,
        "n2",
        dir,
        &["--on-fence", "reboot"],
        &[("FENCED_SYSRQ_TRIGGER_FILE", &sysrq)],
    );
    // The default: exit only.
    let mut d3 = daemon(&etcd, "n3", dir);
    wait("three members", || {
        is_member(&etcd, "n1") && is_member(&etcd, "n2") && is_member(&etcd, "n3")
    });
    // etcd stops answering: no renewal, each daemon self-fences at 2 x TTL (4 s).
    let etcd_pid = nix::unistd::Pid::from_raw(i32::try_from(etcd.pid()).unwrap());
    nix::sys::signal::kill(etcd_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let exit = |d: &mut Daemon| {
        let t0 = Instant::now();
        loop {
            if let Some(s) = d.0.try_wait().unwrap() {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "no self-fence");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (s1, s2, s3) = (exit(&mut d1), exit(&mut d2), exit(&mut d3));
    nix::sys::signal::kill(etcd_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let log = |n: &str| std::fs::read_to_string(dir.join(format!("{n}.log"))).unwrap();
    assert_eq!(s1.code(), Some(3), "{}", log("n1"));
    assert_eq!(s2.code(), Some(3), "{}", log("n2"));
    assert_eq!(s3.code(), Some(3), "{}", log("n3"));
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        ran.starts_with("n1 0 lease not renewed"),
        "hook: {ran:?}; {}",
        log("n1")
    );
    assert!(
        log("n1").contains("on-fence hook finished"),
        "{}",
        log("n1")
    );
    assert_eq!(
        std::fs::read_to_string(&sysrq).unwrap(),
        "b",
        "{}",
        log("n2")
    );
    assert!(
        log("n2").contains("rebooting the host now (SysRq b)"),
        "{}",
        log("n2")
    );
    assert!(!log("n3").contains("on-fence"), "{}", log("n3"));
}

#[test]
fn a_bad_on_fence_or_an_unreadable_boot_id_is_one_clear_line() {
    let o = fenced()
        .args([
            "run",
            "--fencer",
            "none",
            "--node-id",
            "n1",
            "--on-fence",
            "halt",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o).trim(),
        "fenced: invalid --on-fence \"halt\": use exit, reboot or exec:COMMAND (a non-empty shell command)"
    );
    let o = fenced()
        .args(["run", "--fencer", "none", "--node-id", "n1"])
        .env("FENCED_BOOT_ID_FILE", "/nonexistent/boot_id")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.starts_with("fenced: cannot read the boot id from /nonexistent/boot_id: No such file"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

/// The join is conditioned on the generation the restart check read: a fence that
/// completes between the check and the join refuses the join (the agent then reads and
/// checks again), so the join never records a generation it did not check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_is_refused_when_the_generation_moved_since_the_check() {
    use fenced::NodeId;
    use fenced::store::EtcdStore;
    let etcd = Etcd::start();
    let store = EtcdStore::connect(&[etcd.endpoint()], ROOT, Duration::from_secs(30))
        .await
        .unwrap();
    let n3 = NodeId::new("n3").unwrap();
    let seen = store.restart_state(&n3).await.unwrap();
    assert_eq!((seen.generation, seen.generation_rev), (0, 0));
    assert_eq!(seen.boot, None);
    let lease = store.grant(Duration::from_secs(5)).await.unwrap();
    let joined = store
        .join(&n3, "i-n3", lease, &seen, Some("boot-a"))
        .await
        .unwrap()
        .expect("first join");
    assert_eq!(joined.generation, 0);
    store.revoke(lease).await.unwrap();

    let seen = store.restart_state(&n3).await.unwrap();
    assert_eq!(seen.boot.as_ref().map(|b| b.generation), Some(0));
    // A fence lands after the check.
    etcdctl(&etcd, &["put", "/restart/gen/n3", "1"]);
    let lease = store.grant(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        store
            .join(&n3, "i-n3", lease, &seen, Some("boot-a"))
            .await
            .unwrap(),
        None,
        "joined at a generation the restart check did not see"
    );
    let again = store.restart_state(&n3).await.unwrap();
    assert_eq!(again.generation, 1);
    assert!(!again.member);
    assert_eq!(
        again.boot, seen.boot,
        "a refused join rewrote the boot record"
    );
}

/// Starts node `n`'s agent on the cluster's shared namespace, on boot `boot`.
async fn start_on_boot(
    c: &common::Cluster,
    n: &str,
    boot: &str,
) -> Result<fenced::agent::Agent, fenced::agent::AgentError> {
    let mut cfg = c.agent_cfg(n, 0);
    cfg.boot_id = Some(boot.into());
    fenced::agent::Agent::start(
        c.store().await,
        cfg,
        Some(std::sync::Arc::new(c.host(n))),
        common::key_of(n),
    )
    .await
}

/// A daemon that dies without leaving (SIGKILL, a crash): its lease goes at once (so
/// the next start need not wait for it), and its key stays on the device.
async fn die(c: &common::Cluster, agent: fenced::agent::Agent) {
    let lease = agent.lease();
    drop(agent);
    c.store().await.revoke(lease).await.unwrap();
}

fn registered(c: &common::Cluster, n: &str) -> bool {
    common::registered(&c.host("n0"), n)
}

/// The fence's `sever`, done by n0's host: preempt (and abort) n1's key. The fence
/// has not completed (no bump), so the start check alone lets n1 in.
fn preempt(c: &common::Cluster, victim: &str) {
    use nvme_resv::{Acquire, AcquireAction, Cptpl, Key, Register, RegisterAction, Reservations};
    let h = c.host("n0");
    h.register(&Register {
        rrega: RegisterAction::Register,
        crkey: Key(0),
        nrkey: common::key_of("n0"),
        iekey: false,
        cptpl: Cptpl::NoChange,
    })
    .unwrap();
    h.acquire(&Acquire {
        racqa: AcquireAction::PreemptAndAbort,
        rtype: fenced::fencer::RESERVATION_TYPE,
        crkey: common::key_of("n0"),
        prkey: common::key_of(victim),
        iekey: false,
    })
    .unwrap();
    assert!(!registered(c, victim), "preempted");
}

/// The once-per-boot rule (the model's finding 4): an instance that joins before a
/// fence completes passes the restart check; if the fence preempts the key meanwhile,
/// registering it again would let an application an earlier instance fed (still
/// running) write again. Real etcd, the in-memory namespace: n1's daemon registers on
/// boot b1 and dies; a fence preempts n1's key (not finished: no bump); a new daemon on
/// b1 joins, finds the key gone, and refuses to register (nothing sent to the device,
/// n1's host still cannot write). A new boot registers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_removed_on_this_boot_is_not_registered_again() {
    use fenced::agent::AgentError;
    let c = common::Cluster::new();
    let a = start_on_boot(&c, "n1", "b1").await.expect("first start");
    assert!(common::device::can_write(&c.host("n1")));
    die(&c, a).await;
    preempt(&c, "n1");
    let store = c.store().await;
    let n1 = common::node("n1");
    assert_eq!(store.generation(&n1).await.unwrap().0, 0, "not fenced yet");

    let e = start_on_boot(&c, "n1", "b1").await.unwrap_err();
    let AgentError::KeyRemovedSameBoot(e) = e else {
        panic!("registered again on the same boot: {e}");
    };
    assert!(
        e.to_string()
            .contains("key was removed from the device on this boot"),
        "{e}"
    );
    assert!(!registered(&c, "n1"), "registered again on the same boot");
    assert!(!common::device::can_write(&c.host("n1")));

    // A reboot ended every writer of b1: register again.
    let b = start_on_boot(&c, "n1", "b2")
        .await
        .expect("start after a reboot");
    assert!(registered(&c, "n1"));
    assert!(common::device::can_write(&c.host("n1")));
    drop(b);
}

/// A clean leave unregisters the key and records `by: leave`: a restart on the same
/// boot (`systemctl restart fenced`) registers again. But an instance that found the
/// key already registered (an earlier instance's, whose application may still run)
/// does not record it: after its leave, the next start on this boot is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_lets_the_next_start_on_this_boot_register_only_if_it_registered() {
    use fenced::agent::{AgentError, AgentExit};
    let c = common::Cluster::new();
    let store = c.store().await;
    let n1 = common::node("n1");
    let a = start_on_boot(&c, "n1", "b1").await.expect("first start");
    assert_eq!(
        common::RunningAgent::spawn(a).leave().await,
        AgentExit::Left
    );
    assert!(!registered(&c, "n1"), "the leave unregistered the key");
    let rec = store.restart_state(&n1).await.unwrap().boot.unwrap();
    assert_eq!((rec.boot_id.as_str(), rec.by.as_str()), ("b1", "leave"));

    // Same boot after the leave: registers again.
    let b = start_on_boot(&c, "n1", "b1")
        .await
        .expect("restart after a leave");
    assert!(registered(&c, "n1"));
    assert!(common::device::can_write(&c.host("n1")));
    // It dies without leaving; the next instance finds the key registered (b's), so it
    // did not register it, and its leave keeps the join's record.
    die(&c, b).await;
    let d = start_on_boot(&c, "n1", "b1")
        .await
        .expect("restart after a crash");
    assert_eq!(
        common::RunningAgent::spawn(d).leave().await,
        AgentExit::Left
    );
    assert!(!registered(&c, "n1"));
    let rec = store.restart_state(&n1).await.unwrap().boot.unwrap();
    assert_eq!((rec.boot_id.as_str(), rec.by.as_str()), ("b1", "join"));
    let e = start_on_boot(&c, "n1", "b1").await.unwrap_err();
    assert!(matches!(e, AgentError::KeyRemovedSameBoot(_)), "{e}");
    assert!(!registered(&c, "n1"));
}
