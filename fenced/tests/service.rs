//! `fenced run` as a service, on real components: the real binary against a real etcd,
//! a real `NOTIFY_SOCKET` datagram socket standing in for systemd, and HTTP scrapes of
//! `--metrics-listen`.
//!
//! - The notification protocol: `READY=1` comes after the join (STATUS lines before
//!   it), `WATCHDOG=1` follows while the lease is fresh, and stops when etcd is frozen
//!   (SIGSTOP, by the PID of the etcd this test started) well before the daemon
//!   self-fences (its last STATUS).
//! - A `WatchdogSec=` that does not fit the lease timing fails the start.
//! - `/metrics` during a real fence: the fence, step and sweep counters move.
//! - `/healthz` turns red when the sweep task is stopped by the `task::sweep` fail point
//!   (feature `failpoints`), and the stopped task is started again.
//!
//! Run with `cargo test -p fenced --features failpoints --test service`.

mod common;

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::FencedRun;
use common::{generation, wait_members, wait_until};
use fenced::store::EtcdStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The tests start daemons whose timing is the subject: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A datagram socket playing systemd's notification socket: every message with the
/// time it arrived.
struct NotifySocket {
    path: std::path::PathBuf,
    got: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl NotifySocket {
    fn bind(dir: &std::path::Path) -> Self {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind the notification socket");
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while !s.load(Ordering::SeqCst) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    g.lock().unwrap().push((Instant::now(), msg));
                }
            }
        });
        Self {
            path,
            got,
            stop,
            reader: Some(reader),
        }
    }

    fn messages(&self) -> Vec<(Instant, String)> {
        self.got.lock().unwrap().clone()
    }

    fn has(&self, prefix: &str) -> bool {
        self.messages().iter().any(|(_, m)| m.starts_with(prefix))
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// A test's own etcd, its endpoint, a scratch directory, and a store under `root`.
async fn etcd_and_store(root: &str) -> (Etcd, String, tempfile::TempDir, EtcdStore) {
    let etcd = Etcd::start();
    let ep = etcd.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let store = EtcdStore::connect(std::slice::from_ref(&ep), root, Duration::from_secs(3))
        .await
        .unwrap();
    (etcd, ep, dir, store)
}

/// Waits until the daemon has sent `READY=1`, at most `limit`.
async fn wait_ready(notify: &NotifySocket, limit: Duration) {
    wait_until("READY", limit, || async { notify.has("READY=1") }).await;
}

/// Waits until the daemon's process has ended, at most `limit`.
async fn wait_exit(a: &mut FencedRun, limit: Duration) {
    wait_until("the daemon exits", limit, || {
        let running = a.running();
        async move { !running }
    })
    .await;
}

/// SIGSTOP/SIGCONT to the etcd this test started (by its PID, never by name).
fn signal_etcd(etcd: &Etcd, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(etcd.pid()).unwrap());
    nix::sys::signal::kill(pid, sig).expect("signal our etcd");
}

#[tokio::test]
async fn systemd_sees_ready_after_the_join_and_watchdog_pings_stop_when_the_lease_is_not_renewed() {
    let _serial = SERIAL.lock().await;
    let root = "/service-notify";
    let (etcd, ep, dir, store) = etcd_and_store(root).await;
    let notify = NotifySocket::bind(dir.path());
    // TTL 2 s, margin 6 s: WatchdogSec must lie in (4 s, 6 s].
    let sock = notify.path.to_str().unwrap().to_owned();
    let mut a = FencedRun::start(
        &ep,
        root,
        "a",
        dir.path(),
        &[
            "--self-fence-margin-secs",
            "6",
            "--seed-arenas",
            "arena-1",
            "--arenas",
            "1",
        ],
        &[("NOTIFY_SOCKET", &sock), ("WATCHDOG_USEC", "5000000")],
    );
    // The moment READY arrives, etcd already holds what it promises: the membership
    // and the claimed arena (the join and the claim come before it, not after).
    wait_ready(&notify, Duration::from_secs(20)).await;
    let at_ready = store.status().await.unwrap();
    assert_eq!(at_ready.members, [("a".to_owned(), "i-a".to_owned())]);
    assert_eq!(at_ready.arenas, [("arena-1".to_owned(), "a".to_owned())]);
    wait_until("three watchdog pings", Duration::from_secs(10), || async {
        notify
            .messages()
            .iter()
            .filter(|(_, m)| m == "WATCHDOG=1")
            .count()
            >= 3
    })
    .await;

    let frozen_at = Instant::now();
    signal_etcd(&etcd, nix::sys::signal::Signal::SIGSTOP);
    wait_until(
        "the daemon self-fences",
        Duration::from_secs(20),
        || async { notify.has("STATUS=self-fenced") },
    )
    .await;
    signal_etcd(&etcd, nix::sys::signal::Signal::SIGCONT);
    let self_fenced_at = Instant::now();
    wait_exit(&mut a, Duration::from_secs(10)).await;

    let msgs = notify.messages();
    let text: Vec<&str> = msgs.iter().map(|(_, m)| m.as_str()).collect();
    let log = a.log();
    // Before READY: only STATUS lines, waiting for etcd first.
    let ready = text
        .iter()
        .position(|m| m.starts_with("READY=1\n"))
        .unwrap_or_else(|| panic!("no READY=1 in {text:?}\n{log}"));
    assert!(
        text[0].starts_with("STATUS=waiting for etcd at http://127.0.0.1:"),
        "{text:?}"
    );
    assert!(
        text[..ready].iter().all(|m| m.starts_with("STATUS=")),
        "{text:?}"
    );
    assert_eq!(text[ready], "READY=1\nSTATUS=member a at generation 0");
    // The join (and the arena claim) happened before READY was sent.
    let joined_logged = log.find("joined membership").expect("join logged");
    assert!(joined_logged > 0);
    // No WATCHDOG before READY.
    assert!(
        !text[..ready].contains(&"WATCHDOG=1"),
        "watchdog before READY: {text:?}"
    );
    // Pings while healthy, then none: the last one came well before the self-fence
    // (the lease is stale after its 2 s TTL; the margin runs to 6 s).
    let last_ping = msgs
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(t, _)| *t)
        .max()
        .unwrap();
    let (fenced_at, fenced_msg) = msgs
        .iter()
        .find(|(_, m)| m.starts_with("STATUS=self-fenced"))
        .unwrap();
    assert!(
        fenced_msg.contains("lease not renewed"),
        "self-fence reason: {fenced_msg}"
    );
    assert!(last_ping > frozen_at, "pings stopped before etcd froze");
    let quiet = fenced_at.saturating_duration_since(last_ping);
    assert!(
        quiet >= Duration::from_millis(2500),
        "WATCHDOG=1 went on until {quiet:?} before the self-fence: pings must stop once the lease is older than its TTL\n{text:?}"
    );
    assert!(self_fenced_at >= *fenced_at);
    // Nothing after the self-fence status but possibly more status.
    let after: Vec<&&str> = text
        .iter()
        .skip_while(|m| !m.starts_with("STATUS=self-fenced"))
        .filter(|m| **m == "WATCHDOG=1")
        .collect();
    assert!(after.is_empty(), "WATCHDOG after the self-fence: {text:?}");
}

#[tokio::test]
async fn a_watchdog_period_that_does_not_fit_the_lease_timing_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    // TTL 2 s, margin 4 s (2 x TTL): 20 s is longer than the margin. No etcd needed:
    // the check comes before the first connection.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args([
            "run",
            "--fencer",
            "none",
            "--node-id",
            "a",
            "--ttl-secs",
            "2",
        ])
        .args(["--etcd-endpoints", "http://127.0.0.1:1"])
        .env("WATCHDOG_USEC", "20000000")
        .env("NOTIFY_SOCKET", dir.path().join("absent.sock"))
        .env_remove("FAILPOINTS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "fenced: systemd watchdog: WatchdogSec=20.0s is longer than the self-fence margin 4.0s"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("set WatchdogSec= to at most 4.0s"),
        "{stderr}"
    );
}

/// `GET path` over HTTP/1.1: (status code, body).
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: fenced\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).await.ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The text of `GET /metrics` on `addr`.
async fn metrics(addr: &str) -> String {
    get(addr, "/metrics").await.unwrap().1
}

/// The sum of the samples of `metric` whose labels contain every one of `labels`.
fn sample(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            let (base, labelset) = name.split_once('{').unwrap_or((name, ""));
            (base == metric && labels.iter().all(|x| labelset.contains(x)))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[tokio::test]
async fn metrics_move_with_a_real_fence_and_health_is_green_while_running() {
    let _serial = SERIAL.lock().await;
    let root = "/service-metrics";
    let (_etcd, ep, dir, store) = etcd_and_store(root).await;
    let addr = format!("127.0.0.1:{}", test_support::etcd::free_port());
    // a also gets an endpoint where nothing listens: probed, out of rotation.
    let dead = format!("http://127.0.0.1:{}", test_support::etcd::free_port());
    let notify = NotifySocket::bind(dir.path());
    let sock = notify.path.to_str().unwrap().to_owned();
    let mut v = FencedRun::start(&ep, root, "v", dir.path(), &[], &[]);
    let a = FencedRun::start(
        &format!("{ep},{dead}"),
        root,
        "a",
        dir.path(),
        &["--metrics-listen", &addr],
        &[("NOTIFY_SOCKET", &sock)],
    );
    wait_members(&store, &["v", "a"]).await;
    wait_until("a is ready", Duration::from_secs(10), || async {
        get(&addr, "/readyz").await.is_some_and(|(c, _)| c == 200)
    })
    .await;
    assert_eq!(get(&addr, "/healthz").await, Some((200, "ok\n".to_owned())));
    let before = metrics(&addr).await;
    assert_eq!(sample(&before, "fenced_fences_total", &[]), 0.0, "{before}");
    assert_eq!(sample(&before, "fenced_ready", &[]), 1.0, "{before}");
    assert_eq!(
        sample(&before, "fenced_task_up", &["task=\"sweep\""]),
        1.0,
        "{before}"
    );
    assert_eq!(
        sample(&before, "fenced_task_up", &["task=\"controller_watch\""]),
        1.0
    );
    assert_eq!(
        sample(&before, "fenced_task_up", &["task=\"keepalive\""]),
        1.0
    );
    // Renewed every TTL/3; at most the margin (4 s) while the daemon runs.
    let lease_age = sample(&before, "fenced_lease_age_seconds", &[]);
    assert!((0.0..4.0).contains(&lease_age), "{before}");
    assert!(sample(&before, "fenced_self_fence_margin_left_seconds", &[]) > 2.0);
    let live_ep = format!("endpoint=\"{ep}\"");
    let dead_ep = format!("endpoint=\"{dead}\"");
    assert_eq!(
        sample(&before, "fenced_etcd_endpoint_in_rotation", &[&live_ep]),
        1.0,
        "{before}"
    );
    assert!(
        before
            .lines()
            .any(|l| l == format!("fenced_etcd_endpoint_in_rotation{{{dead_ep}}} 0")),
        "{before}"
    );
    assert!(
        sample(
            &before,
            "fenced_etcd_endpoint_probe_failures_total",
            &[&dead_ep, "verdict=\"refused\""]
        ) >= 1.0
    );
    assert_eq!(
        sample(
            &before,
            "fenced_etcd_endpoint_probe_failures_total",
            &[&live_ep]
        ),
        0.0
    );
    assert!(
        sample(
            &before,
            "fenced_etcd_endpoint_probe_duration_seconds_count",
            &[&live_ep]
        ) >= 1.0
    );

    v.kill();
    wait_until("v fenced", Duration::from_secs(20), || async {
        generation(&store, "v").await == 1
    })
    .await;
    // The counters are updated as the fence returns: a moment after the bump.
    wait_until("the fence counted", Duration::from_secs(5), || async {
        let m = metrics(&addr).await;
        sample(&m, "fenced_fences_total", &["result=\"fenced\""]) == 1.0
    })
    .await;
    let after = metrics(&addr).await;
    for step in ["claim", "sever", "finish"] {
        assert!(
            sample(
                &after,
                "fenced_fence_step_duration_seconds_count",
                &[&format!("step=\"{step}\"")]
            ) >= 1.0,
            "step {step}: {after}"
        );
    }
    assert_eq!(
        sample(&after, "fenced_fences_total", &["result=\"failed\""]),
        0.0
    );
    assert!(sample(&after, "fenced_sweeps_total", &["result=\"ok\""]) >= 1.0);
    assert!(sample(&after, "fenced_sweep_duration_seconds_count", &[]) >= 1.0);
    // The next sweep sees one member (a) and nothing owed.
    wait_until(
        "a sweep after the fence",
        Duration::from_secs(5),
        || async {
            let m = metrics(&addr).await;
            sample(&m, "fenced_members_seen", &[]) == 1.0
                && sample(&m, "fenced_fences_owed", &[]) == 0.0
        },
    )
    .await;
    assert_eq!(get(&addr, "/healthz").await.unwrap().0, 200);
    // systemd's status line named the fence while it ran, and dropped it after.
    let statuses: Vec<String> = notify
        .messages()
        .into_iter()
        .map(|(_, m)| m)
        .filter(|m| m.starts_with("STATUS="))
        .collect();
    let fencing = statuses
        .iter()
        .position(|m| m == "STATUS=member a at generation 0; fencing v")
        .unwrap_or_else(|| panic!("{statuses:?}"));
    assert_eq!(
        statuses[fencing + 1..].last().map(String::as_str),
        Some("STATUS=member a at generation 0"),
        "{statuses:?}"
    );
    drop(a);
}

#[tokio::test]
async fn a_leave_sends_stopping_and_the_daemon_exits_cleanly() {
    let _serial = SERIAL.lock().await;
    let root = "/service-leave";
    let (_etcd, ep, dir, store) = etcd_and_store(root).await;
    let notify = NotifySocket::bind(dir.path());
    let sock = notify.path.to_str().unwrap().to_owned();
    let pid_file = dir.path().join("fenced.pid");
    let pid_arg = pid_file.to_str().unwrap().to_owned();
    let mut a = FencedRun::start(
        &ep,
        root,
        "a",
        dir.path(),
        &["--pid-file", &pid_arg],
        &[("NOTIFY_SOCKET", &sock)],
    );
    wait_members(&store, &["a"]).await;
    wait_ready(&notify, Duration::from_secs(10)).await;
    let logged_before_leave = a.log().len();
    // What the unit's ExecStop= runs.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args(["leave", "--pid-file", &pid_arg])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}\n{}", a.log());
    // `leave` returns with the daemon's answer; the process exits right after.
    wait_exit(&mut a, Duration::from_secs(5)).await;
    let text: Vec<String> = notify.messages().into_iter().map(|(_, m)| m).collect();
    let ready = text.iter().position(|m| m.starts_with("READY=1")).unwrap();
    let stopping = text
        .iter()
        .position(|m| m.starts_with("STOPPING=1\nSTATUS=leaving: a quiesces I/O"))
        .unwrap_or_else(|| panic!("no STOPPING=1 in {text:?}"));
    assert!(ready < stopping, "{text:?}");
    let log = a.log();
    assert!(log.contains("departed: marker written"), "{log}");
    // A leave is not an incident: nothing warns (its own controller saw its
    // membership and presence go, and said so at INFO).
    let warnings: Vec<&str> = log[logged_before_leave..]
        .lines()
        .filter(|l| l.contains(" WARN "))
        .collect();
    assert!(warnings.is_empty(), "a clean leave warned: {warnings:#?}");
}

/// Daemon a under `root` on `etcd`, with `/metrics` on a free port and the fail points
/// `failpoints`, once its `/healthz` is red (503); the daemon and the address.
#[cfg(feature = "failpoints")]
async fn healthz_red(
    etcd: &Etcd,
    root: &str,
    dir: &std::path::Path,
    failpoints: &str,
) -> (FencedRun, String) {
    let addr = format!("127.0.0.1:{}", test_support::etcd::free_port());
    let a = FencedRun::start(
        &etcd.endpoint(),
        root,
        "a",
        dir,
        &["--metrics-listen", &addr],
        &[("FAILPOINTS", failpoints)],
    );
    wait_until("/healthz red", Duration::from_secs(15), || async {
        get(&addr, "/healthz").await.is_some_and(|(c, _)| c == 503)
    })
    .await;
    (a, addr)
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn healthz_turns_red_when_the_sweep_task_stops_and_the_task_is_restarted() {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (a, addr) = healthz_red(&etcd, "/service-health", dir.path(), "task::sweep=return").await;
    let (_, body) = get(&addr, "/healthz").await.unwrap();
    assert_eq!(body, "sweep stopped (returned)\n");
    // Noticed and started again with backoff (1 s, 2 s, ...); each start stops again.
    wait_until("the sweep restarted", Duration::from_secs(10), || async {
        let m = metrics(&addr).await;
        sample(&m, "fenced_task_restarts_total", &["task=\"sweep\""]) >= 2.0
    })
    .await;
    let m = metrics(&addr).await;
    assert!(
        m.lines().any(|l| l == "fenced_task_up{task=\"sweep\"} 0"),
        "{m}"
    );
    assert_eq!(
        sample(&m, "fenced_task_up", &["task=\"controller_watch\""]),
        1.0
    );
    assert_eq!(sample(&m, "fenced_sweeps_total", &[]), 0.0, "{m}");
    // Still a member with a fresh lease: ready, not healthy.
    assert_eq!(get(&addr, "/readyz").await.unwrap().0, 200);
    assert!(
        a.log()
            .contains("task sweep stopped (returned): starting it again in"),
        "{}",
        a.log()
    );
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn a_sweep_task_that_stopped_once_runs_again_and_healthz_turns_green() {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (_a, addr) = healthz_red(
        &etcd,
        "/service-health-once",
        dir.path(),
        "task::sweep=1*return",
    )
    .await;
    wait_until("/healthz green again", Duration::from_secs(10), || async {
        get(&addr, "/healthz").await.is_some_and(|(c, _)| c == 200)
    })
    .await;
    wait_until("a sweep ran", Duration::from_secs(5), || async {
        let m = metrics(&addr).await;
        sample(&m, "fenced_sweeps_total", &["result=\"ok\""]) >= 1.0
            && sample(&m, "fenced_task_restarts_total", &["task=\"sweep\""]) == 1.0
    })
    .await;
}

/// `systemd-analyze verify` on the shipped units (`packaging/systemd/`), with no
/// warning at all (an unknown or misspelt directive is only a warning). The units
/// name the packaged binary, /usr/bin/fenced; verify checks that ExecStart= and ExecStop=
/// are executable, so it checks a copy that names the binary this test was built with.
/// `--man=no`: the man page comes with the package.
#[test]
fn the_shipped_units_pass_systemd_analyze_verify() {
    let units = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd");
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for name in ["fenced.service", "example-app.service"] {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        if name == "fenced.service" {
            assert!(text.contains("\nType=notify\n") && text.contains("\nWatchdogSec="));
            assert!(text.contains("\nExecStart=/usr/bin/fenced run "));
            assert!(
                text.contains("\nExecStop=/usr/bin/fenced leave --pid-file /run/fenced/fenced.pid")
            );
        } else {
            assert!(text.contains("\nBindsTo=fenced.service\n"));
            assert!(text.contains("\nAfter=fenced.service\n"));
        }
        let local = text.replace("/usr/bin/fenced", env!("CARGO_BIN_EXE_fenced"));
        let p = dir.path().join(name);
        std::fs::write(&p, local).unwrap();
        paths.push(p);
    }
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&paths)
        .output()
        .expect("run systemd-analyze (package systemd; scripts/install-deps installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        format!("{stdout}{stderr}").trim(),
        "",
        "systemd-analyze verify warned"
    );
}
