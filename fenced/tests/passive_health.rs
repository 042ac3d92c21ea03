//! Passive endpoint health (`fenced::store` `health`): what an idle store costs etcd,
//! and how fast a hung member leaves rotation once a request goes slow.
//!
//! The store used to probe every endpoint every 500 ms (a TCP connect, a linearizable
//! read and `Status` each): one idle daemon with three endpoints cost etcd 12 requests
//! and 6 new connections per second. It now probes when one of its requests fails or
//! goes unanswered for `health_timeout`, and otherwise every 5–15 s.
//!
//! etcd's own `/metrics` count the requests (`grpc_server_handled_total`), so the
//! numbers do not depend on the daemon's view of itself. `measure_idle_daemon_cost`
//! (ignored: a minute per binary) prints what one idle `fenced run` costs etcd, for
//! this build and optionally another (`FENCED_BASELINE_BIN`, e.g. main's), in the same
//! run; run it under `unshare -rn` (loopback brought up) for the connection counts.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{EtcdCluster, Stopped};
use common::*;
use fenced::store::{EndpointState, EtcdStore, StoreOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// The tests of this file run one at a time (they measure time and counts).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `GET path` on `addr` (HTTP/1.0), the body.
async fn http_get(addr: &str, path: &str) -> String {
    let mut c = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    c.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// `grpc_server_handled_total` of every member, summed per gRPC method: the unary
/// requests etcd answered (a stream counts when it ends).
async fn handled(etcd: &EtcdCluster) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for i in 0..etcd.len() {
        let addr = etcd.addr(i).to_string();
        for line in http_get(&addr, "/metrics").await.lines() {
            let Some(rest) = line.strip_prefix("grpc_server_handled_total{") else {
                continue;
            };
            let method = rest
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|m| m.split('"').next())
                .unwrap_or("?")
                .to_owned();
            let v: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            *out.entry(method).or_insert(0.0) += v;
        }
    }
    out
}

fn delta(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

fn opts() -> StoreOptions {
    StoreOptions::for_lease_ttl(TTL)
}

async fn store(etcd: &EtcdCluster, root: &str) -> EtcdStore {
    EtcdStore::connect_with(&etcd.endpoints(), root, CLAIM_TTL, &opts())
        .await
        .expect("connect to the test etcd")
}

/// An idle store on three endpoints sends etcd next to nothing: over 8 s at most two
/// probe rounds (3 reads each, plus `Status` for a read slower than a quarter of the
/// probe timeout). Probing every 500 ms, as before, sent 16 rounds: 96 requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_store_probes_etcd_rarely() {
    let _serial = SERIAL.lock().await;
    let etcd = EtcdCluster::new(3).start();
    let store = store(&etcd, "/passive-idle").await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    assert!(store.observe_requests(Arc::new(move |op, _, result| {
        s.lock().unwrap().push((op, result));
    })));
    // The hook sees the store's own requests, by operation.
    store.generation(&node("x")).await.expect("read");
    assert!(
        seen.lock().unwrap().contains(&("Range", "ok")),
        "{:?}",
        seen.lock().unwrap()
    );
    let rotation = store.endpoint_rotation();
    assert_eq!(rotation.borrow().len(), 3, "probed at connect");
    assert!(rotation.borrow().iter().all(|e| e.in_rotation));

    let window = Duration::from_secs(8);
    let before = handled(&etcd).await;
    tokio::time::sleep(window).await;
    let after = handled(&etcd).await;
    let d = delta(&before, &after);
    let probes = d.get("Range").copied().unwrap_or(0.0) + d.get("Status").copied().unwrap_or(0.0);
    eprintln!(
        "etcd {}: an idle store on 3 endpoints sent {probes} probe requests in {window:?} ({:.2}/s); all requests: {d:?}",
        test_support::EtcdVersion::current(),
        probes / window.as_secs_f64()
    );
    assert!(
        probes <= 12.0,
        "an idle store sent {probes} probe requests in {window:?}: {d:?}"
    );
    // Nothing else either (no request of the store's own).
    let total: f64 = d.values().sum();
    assert_eq!(total, probes, "{d:?}");
}

/// Waits (up to 20 s for each change of `rotation`) until `hung_ep` is out of rotation:
/// when it was seen out.
async fn out_of_rotation(
    rotation: &mut watch::Receiver<Vec<EndpointState>>,
    hung_ep: &str,
) -> Instant {
    loop {
        let out = tokio::time::timeout(Duration::from_secs(20), rotation.changed()).await;
        assert!(
            matches!(out, Ok(Ok(()))),
            "{hung_ep} not out of rotation within 20 s"
        );
        let states = rotation.borrow_and_update().clone();
        if states
            .iter()
            .any(|e| e.endpoint == hung_ep && !e.in_rotation)
        {
            return Instant::now();
        }
    }
}

/// A read: when it was sent, and how long it took once answered.
type Read = (Instant, Arc<Mutex<Option<Duration>>>);

/// Reads every 50 ms through `store`, each in its own task.
fn spawn_reads(store: EtcdStore, until: Instant) -> tokio::task::JoinHandle<Vec<Read>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        while Instant::now() < until {
            let sent = Instant::now();
            let took = Arc::new(Mutex::new(None));
            let (s, t) = (store.clone(), took.clone());
            tokio::spawn(async move {
                let _ = s.generation(&node("x")).await;
                *t.lock().unwrap() = Some(sent.elapsed());
            });
            out.push((sent, took));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        out
    })
}

/// A follower hangs 1 s after the store connected, long before the first idle probe
/// (5 s at the earliest): the requests balanced onto it go slow, and the first of them
/// has the store probe at once. The member is out of rotation within about a probe
/// timeout (500 ms with a 2 s lease) of the moment that request went slow; probing
/// only when idle, it stayed in rotation for 5–15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_member_leaves_rotation_soon_after_the_first_slow_request() {
    let _serial = SERIAL.lock().await;
    let etcd = EtcdCluster::new(3).start();
    let leader = etcd.leader(Duration::from_secs(5)).await;
    let hung = (0..etcd.len()).find(|&i| i != leader).unwrap();
    let hung_ep = etcd.endpoint(hung);
    let store = store(&etcd, "/passive-hung").await;
    let slow_after = opts().health_timeout;
    let mut rotation = store.endpoint_rotation();
    rotation.borrow_and_update();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let t_hang = Instant::now();
    let stopped = Stopped::new(etcd.pid(hung).expect("member runs"));
    let reads = spawn_reads(store.clone(), t_hang + Duration::from_secs(3));
    let t_out = out_of_rotation(&mut rotation, &hung_ep).await;
    let reads = reads.await.unwrap();
    drop(stopped);
    // The first request that went slow: unanswered `slow_after` after it was sent.
    let first_slow = reads
        .iter()
        .filter(|(sent, took)| {
            let took = *took.lock().unwrap();
            took.is_none_or(|d| d > slow_after) && *sent + slow_after <= t_out
        })
        .map(|(sent, _)| *sent)
        .min()
        .expect("a read went slow before the member left rotation");
    let went_slow = first_slow + slow_after;
    let after_slow = t_out.saturating_duration_since(went_slow);
    let slow_reads = reads
        .iter()
        .filter(|(_, t)| t.lock().unwrap().is_none_or(|d| d > slow_after))
        .count();
    eprintln!(
        "etcd {}: follower m{} SIGSTOPped; first slow read sent {} ms into the hang; out of rotation {} ms after it went slow ({} ms after SIGSTOP); {slow_reads} of {} reads slower than {slow_after:?}",
        test_support::EtcdVersion::current(),
        hung + 1,
        first_slow.duration_since(t_hang).as_millis(),
        after_slow.as_millis(),
        t_out.duration_since(t_hang).as_millis(),
        reads.len()
    );
    // Probe timeout 500 ms + scheduling slack on a loaded 2-core machine.
    assert!(
        after_slow <= Duration::from_millis(1200),
        "out of rotation {after_slow:?} after the first request went slow"
    );
}

/// `grpc_server_started_total` of `method` on member `i` (streams opened there).
async fn started_on(etcd: &EtcdCluster, i: usize, method: &str) -> f64 {
    let want = format!("grpc_method=\"{method}\"");
    http_get(&etcd.addr(i).to_string(), "/metrics")
        .await
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&want))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The lease keepalive stream is the only traffic, and it sits on the member that
/// hangs: the renewal sent after the hang goes unanswered, and awaiting it through
/// `EtcdStore::observed` (as the agent does) has the store probe at once. The member
/// is out of rotation about a probe timeout after the renewal went slow; without the
/// hook, nothing but the idle probe (5–15 s after connecting) would notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_unanswered_on_a_hung_member_takes_it_out_of_rotation() {
    let _serial = SERIAL.lock().await;
    let etcd = EtcdCluster::new(3).start();
    let store = store(&etcd, "/passive-keepalive").await;
    let slow_after = opts().health_timeout;
    let mut rotation = store.endpoint_rotation();
    rotation.borrow_and_update();
    let lease = store.grant(Duration::from_secs(10)).await.expect("grant");
    let (mut keeper, mut msgs) = store.keep_alive(lease).await.expect("keepalive stream");
    // Which member holds the stream: the one that saw it open.
    let mut holder = None;
    for i in 0..etcd.len() {
        if started_on(&etcd, i, "LeaseKeepAlive").await > 0.0 {
            holder = Some(i);
        }
    }
    let hung = holder.expect("a member saw the keepalive stream open");
    let hung_ep = etcd.endpoint(hung);
    let stopped = Stopped::new(etcd.pid(hung).expect("member runs"));
    let sent = Instant::now();
    keeper.keep_alive().await.expect("renewal sent");
    let renewal = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .observed("LeaseKeepAlive", msgs.message())
                .await
                .is_ok_and(|m| m.is_some())
        })
    };
    let t_out = out_of_rotation(&mut rotation, &hung_ep).await;
    // Finished with an answer (an error, e.g. the connection torn down by the HTTP/2
    // PING timeout, is no answer).
    let answered = if renewal.is_finished() {
        renewal.await.unwrap_or(false)
    } else {
        renewal.abort();
        false
    };
    drop(stopped);
    let after_slow = t_out.saturating_duration_since(sent + slow_after);
    eprintln!(
        "etcd {}: keepalive stream on m{} SIGSTOPped; out of rotation {} ms after the renewal was sent ({} ms after it went slow)",
        test_support::EtcdVersion::current(),
        hung + 1,
        t_out.duration_since(sent).as_millis(),
        after_slow.as_millis()
    );
    assert!(!answered, "the hung member answered the renewal");
    assert!(
        after_slow <= Duration::from_millis(1200),
        "out of rotation {after_slow:?} after the renewal went slow"
    );
}

/// What etcd saw over `window`: requests answered by method, stream messages
/// received, and new TCP connections (`None` outside a private network namespace)
/// less the measurement's own (one per member and scrape).
async fn etcd_load(
    etcd: &EtcdCluster,
    window: Duration,
) -> (BTreeMap<String, f64>, f64, Option<u64>) {
    let opens0 = passive_opens();
    let before = handled(etcd).await;
    let msgs0 = stream_msgs(etcd).await;
    tokio::time::sleep(window).await;
    let after = handled(etcd).await;
    let msgs1 = stream_msgs(etcd).await;
    let opens1 = passive_opens();
    let scrapes = 4 * etcd.len() as u64;
    (
        delta(&before, &after),
        msgs1 - msgs0,
        opens0
            .zip(opens1)
            .map(|(a, b)| (b - a).saturating_sub(scrapes)),
    )
}

fn per_second(load: &(BTreeMap<String, f64>, f64, Option<u64>), window: Duration) -> String {
    let s = window.as_secs_f64();
    let (d, msgs, opens) = load;
    let unary: f64 = d.values().sum();
    format!(
        "{:.2} requests/s ({}), {:.2} messages received/s (unary requests and stream messages), {} new connections/s",
        unary / s,
        d.iter()
            .map(|(k, v)| format!("{k} {:.2}/s", v / s))
            .collect::<Vec<_>>()
            .join(", "),
        msgs / s,
        opens.map_or_else(
            || "n/a (run under unshare -rn)".to_owned(),
            |n| format!("{:.2}", n as f64 / s)
        ),
    )
}

/// What one idle `fenced run` (defaults: TTL 5 s, sweep 30 s) with three endpoints
/// costs a 3-member etcd over `window`, after 10 s to settle.
async fn idle_cost(bin: &str, etcd: &EtcdCluster, node: &str, window: Duration) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("fenced.log");
    let mut child = std::process::Command::new(bin)
        .args(["run", "--fencer", "none", "--node-id", node])
        .args(["--root", &format!("/cost-{node}")])
        .args(["--etcd-endpoints", &etcd.endpoints().join(",")])
        .args(["--instance-id", &format!("i-{node}")])
        .env("FENCED_LOG", "info")
        .env_remove("FAILPOINTS")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let load = etcd_load(etcd, window).await;
    let _ = child.kill();
    let _ = child.wait();
    format!("{bin}: {}", per_second(&load, window))
}

/// `grpc_server_msg_received_total` of every member (stream messages included).
async fn stream_msgs(etcd: &EtcdCluster) -> f64 {
    let mut n = 0.0;
    for i in 0..etcd.len() {
        for line in http_get(&etcd.addr(i).to_string(), "/metrics")
            .await
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        {
            n += line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
        }
    }
    n
}

/// TCP passive opens of this network namespace (`/proc/net/snmp`), when it is a
/// private one (no other process's connections counted).
fn passive_opens() -> Option<u64> {
    let private = std::env::var_os("FENCED_PRIVATE_NETNS").is_some();
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let i = names.split_whitespace().position(|n| n == "PassiveOpens")?;
    let v = values.split_whitespace().nth(i)?.parse().ok()?;
    private.then_some(v)
}

/// Prints what one idle daemon costs etcd, for this build and `FENCED_BASELINE_BIN`.
/// `FENCED_MEASURE_SECS` sets the window (default 60). For connection counts run it in
/// a private network namespace:
/// `unshare -rn sh -c 'ip link set lo up; FENCED_PRIVATE_NETNS=1 cargo test ...'`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement (a minute per binary): prints numbers, asserts nothing"]
async fn measure_idle_daemon_cost() {
    let _serial = SERIAL.lock().await;
    let window = Duration::from_secs(
        std::env::var("FENCED_MEASURE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let etcd = EtcdCluster::new(3).start();
    let mut bins = Vec::new();
    if let Ok(b) = std::env::var("FENCED_BASELINE_BIN") {
        bins.push(b);
    }
    bins.push(env!("CARGO_BIN_EXE_fenced").to_owned());
    // No daemon: what etcd sees without one (its members' own connections).
    let quiet = etcd_load(&etcd, window).await;
    eprintln!(
        "etcd {}, 3 members; over {window:?} with no daemon: {}",
        test_support::EtcdVersion::current(),
        per_second(&quiet, window)
    );
    for (i, b) in bins.iter().enumerate() {
        let line = idle_cost(b, &etcd, &format!("n{i}"), window).await;
        eprintln!("over {window:?}: {line}");
    }
}
