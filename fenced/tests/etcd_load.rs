//! What an idle daemon costs etcd's history, and what fenced says about etcd's space
//! (issue 19), against a real etcd:
//!
//! - an idle `fenced run` makes at most one revision per liveness refresh (30 s):
//!   within the 0.05 writes/s bound, where the per-renewal liveness write of the
//!   previous version made 1.5/s at TTL 2 s; the record is still refreshed (it dates an
//!   owed fence);
//! - a NOSPACE alarm: `fenced run` refuses to start in one line saying what to do, and
//!   `fenced check` is CRITICAL;
//! - a history never compacted and longer than the threshold: `fenced check` WARNING,
//!   gone once etcd compacts;
//! - a record written by the previous version (at every renewal, no `refresh_ms`)
//!   still dates its renewal in `fenced status`.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::{FencedRun, fenced, stderr, stdout};
use test_support::EtcdOptions;

const ROOT: &str = "/load/";

async fn client(etcd: &Etcd) -> etcd_client::Client {
    etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap()
}

/// A key's value and mod revision.
async fn get(c: &mut etcd_client::Client, key: &str) -> Option<(String, i64)> {
    let r = c.get(key, None).await.unwrap();
    r.kvs().first().map(|kv| {
        (
            String::from_utf8_lossy(kv.value()).into_owned(),
            kv.mod_revision(),
        )
    })
}

async fn revision(c: &mut etcd_client::Client) -> i64 {
    c.get("/", None).await.unwrap().header().unwrap().revision()
}

/// The value of the un-labelled counter `name` on etcd's `/metrics`.
fn metric(etcd: &Etcd, name: &str) -> f64 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", etcd.client_port())).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

async fn wait_for(what: &str, log: &Path, mut f: impl AsyncFnMut() -> bool) {
    let t0 = Instant::now();
    while !f().await {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 19's bound on an idle node's writes beyond its lease keepalive.
const BOUND_WRITES_PER_S: f64 = 0.05;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_daemon_makes_at_most_one_revision_per_liveness_refresh() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let mut d = FencedRun::start(&etcd.endpoint(), ROOT, "n1", dir.path(), &[], &[]);
    let log = dir.path().join("n1.log");
    let mut c = client(&etcd).await;
    let key = format!("{ROOT}liveness/n1");
    wait_for("n1 joined and recorded its lease", &log, async || {
        get(&mut c, &key).await.is_some()
            && get(&mut c, &format!("{ROOT}membership/n1")).await.is_some()
    })
    .await;
    let (first, first_rev) = get(&mut c, &key).await.unwrap();
    let record: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(record["ttl_ms"], 2000, "{record}");
    assert!(record["refresh_ms"].as_u64() >= Some(30_000), "{record}");

    // Idle: renewals every 667 ms, a sweep every second. 35 s spans one refresh. Every
    // write under the root is seen on a watch, so the node's own writes are told apart
    // from the cluster's one sweep stamp per period (`controller/sweep_done`, written by
    // whichever controller swept: per cluster, not per node).
    let window = Duration::from_secs(35);
    let mut events = c
        .watch(ROOT, Some(etcd_client::WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let (rev0, proposals0) = (
        revision(&mut c).await,
        metric(&etcd, "etcd_server_proposals_committed_total"),
    );
    let t0 = Instant::now();
    let (mut node_writes, mut stamps) = (Vec::new(), 0);
    let stamp_key = format!("{ROOT}controller/sweep_done");
    let _ = tokio::time::timeout(window, async {
        while let Ok(Some(m)) = events.message().await {
            for e in m.events() {
                let Some(kv) = e.kv() else { continue };
                if kv.mod_revision() <= rev0 {
                    continue;
                }
                let k = String::from_utf8_lossy(kv.key()).into_owned();
                if k == stamp_key {
                    stamps += 1;
                } else {
                    node_writes.push(k);
                }
            }
        }
    })
    .await;
    let secs = t0.elapsed().as_secs_f64();
    let (rev1, proposals1) = (
        revision(&mut c).await,
        metric(&etcd, "etcd_server_proposals_committed_total"),
    );
    assert!(d.running(), "the daemon exited: {}", d.log());
    let revisions = rev1 - rev0;
    println!(
        "idle node over {secs:.1}s: {revisions} revisions ({:.3}/s): {} by the node {node_writes:?}, {stamps} sweep stamps (one per sweep period, per cluster); {} raft proposals ({:.3}/s)",
        revisions as f64 / secs,
        node_writes.len(),
        proposals1 - proposals0,
        (proposals1 - proposals0) / secs,
    );
    let allowed = (BOUND_WRITES_PER_S * window.as_secs_f64()).floor() as usize;
    assert!(
        node_writes.len() <= allowed,
        "{} writes by the node in {secs:.1}s: more than {BOUND_WRITES_PER_S}/s: {node_writes:?}",
        node_writes.len()
    );
    assert!(
        stamps <= window.as_secs() as usize + 1,
        "{stamps} sweep stamps in {secs:.1}s with a 1 s sweep period"
    );
    // The one write is the refresh of the stamp, which dates an owed fence.
    let (now, now_rev) = get(&mut c, &key).await.unwrap();
    let now: serde_json::Value = serde_json::from_str(&now).unwrap();
    assert!(now_rev > first_rev, "liveness/n1 never refreshed");
    assert!(now["unix_ms"].as_u64() > record["unix_ms"].as_u64());
    assert_eq!(now["lease"], record["lease"]);
}

/// Puts values of 60 kB until etcd (quota 1 MiB) raises its NOSPACE alarm.
async fn fill(c: &mut etcd_client::Client) {
    let v = vec![b'x'; 60_000];
    for i in 0..200 {
        if let Err(e) = c.put(format!("/filler/{i}"), v.clone(), None).await {
            assert!(e.to_string().contains("database space exceeded"), "{e}");
            return;
        }
    }
    panic!("no NOSPACE alarm after 12 MB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nospace_alarm_refuses_the_start_and_check_is_critical() {
    let etcd = Etcd::start_with(&EtcdOptions {
        extra_args: vec!["--quota-backend-bytes=1048576".into()],
        ..EtcdOptions::default()
    });
    let mut c = client(&etcd).await;
    fill(&mut c).await;
    let rev = revision(&mut c).await;

    let t0 = Instant::now();
    let o = fenced()
        .args(["run", "--fencer", "none", "--node-id", "n1", "--root", ROOT])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .args(["--ttl-secs", "2"])
        .env("FENCED_LOG", "warn")
        .output()
        .unwrap();
    assert!(!o.status.success(), "started: {}", stderr(&o));
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    let e = stderr(&o);
    let line = e
        .lines()
        .find(|l| l.starts_with("fenced: "))
        .unwrap_or_else(|| panic!("no error line: {e}"));
    assert!(
        line.starts_with("fenced: refusing to start: etcd member ")
            && line.contains("raised its NOSPACE alarm")
            && line.contains("etcdctl alarm disarm"),
        "{e}"
    );
    assert_eq!(revision(&mut c).await, rev, "the refused start wrote");

    let o = fenced()
        .args(["check", "--root", ROOT])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .output()
        .unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{}", stderr(&o));
    assert!(
        out.starts_with("FENCED CRITICAL - etcd member ") && out.contains("NOSPACE"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_never_compacted_is_a_warning_until_etcd_compacts() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    for i in 0..600 {
        c.put("/churn", i.to_string(), None).await.unwrap();
    }
    let etcd_version = test_support::etcd::EtcdVersion::current().to_string();
    let check = |threshold: &str| {
        let o = fenced()
            .args(["check", "--root", ROOT])
            .args(["--etcd-endpoints", &etcd.endpoint()])
            .args(["--history-warning-revisions", threshold])
            // This test is about history, not about the etcd release under it.
            .args(["--accept-etcd-version", &etcd_version])
            .output()
            .unwrap();
        (o.status.code(), stdout(&o))
    };
    let (code, out) = check("500");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.starts_with("FENCED WARNING - etcd never compacted its history (")
            && out.contains("revisions kept)")
            && out.contains("--auto-compaction-mode"),
        "{out}"
    );
    // Under the threshold, or once etcd compacted: no warning.
    assert_eq!(check("100000").0, Some(0));
    let rev = revision(&mut c).await;
    c.compact(rev, None).await.unwrap();
    let (code, out) = check("500");
    assert_eq!(code, Some(0), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_daemons_per_renewal_record_still_shows_its_renewal() {
    let etcd = Etcd::start();
    let mut c = client(&etcd).await;
    c.put(format!("{ROOT}gen/old"), "0", None).await.unwrap();
    c.put(
        format!("{ROOT}liveness/old"),
        r#"{"lease":7,"ttl_ms":5000,"margin_ms":10000,"unix_ms":1700000000000}"#,
        None,
    )
    .await
    .unwrap();
    let o = fenced()
        .args(["status", "-o", "json", "--root", ROOT])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let old = &st["nodes"]["old"];
    assert_eq!(old["last_renewal_unix_ms"], 1_700_000_000_000u64, "{st}");
    assert_eq!(old["liveness_stamp_unix_ms"], 1_700_000_000_000u64, "{st}");
    assert_eq!(old["liveness_refresh_ms"], 0, "{st}");
    assert_eq!(old["owed"]["since_unix_ms"], 1_700_000_000_000u64, "{st}");
    assert!(st["malformed"].as_array().unwrap().is_empty(), "{st}");
}
