//! `fenced attest` as a child process against a real etcd (issue 14, part 3): an
//! unknown node is refused, missing liveness is "unknown", freshness is etcd's answer
//! about the agent's lease (never a wall-clock comparison), and a node already fenced
//! is reported, not bumped again; a node a controller is fencing is refused. Refusals
//! write nothing: the etcd revision is unchanged.
//!
//! The `--block-device` path (preempt first) needs a reservation-capable namespace:
//! here only its refusals before any write; its logic is unit-tested in
//! `src/ops/attest.rs` on the `nvme_resv` model, and it runs for real on the guest's
//! kernel NVMe target in `scenarios/guest-attest.sh`.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::{FencedRun, etcdctl, fenced, stderr, stdout, wait};

const ROOT: &str = "/att/";

fn attest(etcd: &Etcd, node: &str, extra: &[&str]) -> Output {
    fenced()
        .args(["attest", "--root", ROOT, "--node-id", node])
        .args(["--operator", "alice"])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .args(["--reason", "host powered off; confirmed on the BMC console"])
        .args(extra)
        .env_remove("FENCED_NODE_ID")
        .output()
        .unwrap()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The store's current revision.
fn revision(etcd: &Etcd) -> u64 {
    json(&etcdctl(etcd, &["get", "/", "-w", "json"]))["header"]["revision"]
        .as_u64()
        .unwrap()
}

fn put(etcd: &Etcd, key: &str, value: &str) {
    etcdctl(etcd, &["put", &format!("{ROOT}{key}"), value]);
}

fn get(etcd: &Etcd, key: &str) -> Option<String> {
    let v = etcdctl(
        etcd,
        &["get", &format!("{ROOT}{key}"), "--print-value-only"],
    );
    let v = v.trim_end_matches('\n');
    (!v.is_empty()).then(|| v.to_owned())
}

fn generation(etcd: &Etcd, node: &str) -> Option<u64> {
    get(etcd, &format!("gen/{node}")).map(|g| g.parse().unwrap())
}

fn audit(etcd: &Etcd, node: &str) -> Vec<serde_json::Value> {
    etcdctl(
        etcd,
        &[
            "get",
            "--prefix",
            &format!("{ROOT}audit/{node}/"),
            "--print-value-only",
        ],
    )
    .lines()
    .filter(|l| !l.is_empty())
    .map(json)
    .collect()
}

/// A lease of `ttl_s` granted directly in etcd: its id.
fn grant(etcd: &Etcd, ttl_s: u64) -> i64 {
    json(&etcdctl(
        etcd,
        &["lease", "grant", &ttl_s.to_string(), "-w", "json"],
    ))["ID"]
        .as_i64()
        .unwrap()
}

/// The records a join leaves for `node` (generation, instance), without liveness.
fn joined_once(etcd: &Etcd, node: &str) {
    put(etcd, &format!("gen/{node}"), "0");
    put(etcd, &format!("instance/{node}"), &format!("i-{node}"));
}

/// A liveness record naming `lease`, with the victim's wall clock at `unix_ms`.
fn liveness(etcd: &Etcd, node: &str, lease: i64, ttl_ms: u64, margin_ms: u64, unix_ms: u64) {
    put(
        etcd,
        &format!("liveness/{node}"),
        &format!(
            r#"{{"lease":{lease},"ttl_ms":{ttl_ms},"margin_ms":{margin_ms},"unix_ms":{unix_ms}}}"#
        ),
    );
}

/// Asserts `o` failed with one line containing `want`, and etcd's revision is `rev`.
fn refused(etcd: &Etcd, o: &Output, want: &str, rev: u64) {
    assert!(!o.status.success(), "not refused: {}", stdout(o));
    let e = stderr(o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("fenced: refusing to fence") && e.contains(want),
        "{e}"
    );
    assert_eq!(revision(etcd), rev, "a refusal wrote to etcd");
}

fn daemon(etcd: &Etcd, node: &str, dir: &Path) -> FencedRun {
    FencedRun::start(&etcd.endpoint(), ROOT, node, dir, &[], &[])
}

#[test]
fn a_node_that_never_joined_is_refused_and_nothing_is_written() {
    let etcd = Etcd::start();
    // Another node exists: the root is in use, only the attested id is unknown.
    joined_once(&etcd, "n1");
    let rev = revision(&etcd);
    for extra in [&[][..], &["--force"]] {
        let o = attest(&etcd, "ghost", extra);
        refused(&etcd, &o, "ghost: no such node (it never joined", rev);
    }
    assert_eq!(generation(&etcd, "ghost"), None);
    assert!(audit(&etcd, "ghost").is_empty());
}

#[test]
fn missing_liveness_is_unknown_refused_without_force_and_accepted_with_it() {
    let etcd = Etcd::start();
    joined_once(&etcd, "n1");
    let rev = revision(&etcd);
    let o = attest(&etcd, "n1", &[]);
    refused(&etcd, &o, "liveness is unknown (no liveness record)", rev);
    // A wall-clock stamp (what older versions wrote) cannot be judged by etcd either.
    put(&etcd, "liveness/n1", "1800000000000");
    let rev = revision(&etcd);
    let o = attest(&etcd, "n1", &[]);
    refused(&etcd, &o, "written by an older fenced", rev);
    let o = attest(&etcd, "n1", &["--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim(),
        "fenced n1: generation now 1 (attested by alice)"
    );
    assert_eq!(generation(&etcd, "n1"), Some(1));
    let a = audit(&etcd, "n1");
    assert_eq!(a.len(), 1);
    let signals = a[0]["signals"].to_string();
    assert!(
        signals.contains("attested by alice: host powered off; confirmed on the BMC console")
            && signals.contains("liveness not checked (--force)"),
        "{signals}"
    );
    assert_eq!(a[0]["trigger"], "operator");
    assert_eq!(a[0]["fencer"], "operator");
}

/// Freshness is etcd's answer about the lease the record names. The victim's wall
/// clock stamp is set to 1970 and to the far future: the old rule (operator's clock
/// minus victim's stamp) would have called the first stale and the second fresh;
/// neither matters now.
#[test]
fn freshness_is_the_lease_in_etcd_not_any_wall_clock() {
    let etcd = Etcd::start();
    joined_once(&etcd, "n1");
    let lease = grant(&etcd, 60);
    // The record says TTL 2 s, margin 3 s: once etcd drops the lease, attest waits 1 s.
    liveness(&etcd, "n1", lease, 2_000, 3_000, 0);
    let rev = revision(&etcd);
    let o = attest(&etcd, "n1", &[]);
    refused(&etcd, &o, "its agent is alive by etcd's clock (lease", rev);
    liveness(&etcd, "n1", lease, 2_000, 3_000, u64::MAX / 2);
    etcdctl(&etcd, &["lease", "revoke", &format!("{lease:x}")]);
    let t0 = Instant::now();
    let o = attest(&etcd, "n1", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("lease is gone from etcd; waiting 1.0s"),
        "{}",
        stderr(&o)
    );
    assert!(t0.elapsed() >= Duration::from_secs(1));
    assert_eq!(generation(&etcd, "n1"), Some(1));
    let signals = audit(&etcd, "n1")[0]["signals"].to_string();
    assert!(
        signals.contains(&format!("lease {lease:#x} gone from etcd")),
        "{signals}"
    );
}

/// A real daemon records the lease it renews; once it is killed and its lease is
/// gone, attest fences it (after its self-fence margin); a second attest reports it
/// already fenced and changes nothing.
#[test]
fn a_dead_daemon_is_fenced_once_and_a_second_attest_changes_nothing() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let mut d1 = daemon(&etcd, "n1", dir.path());
    wait("n1's liveness record", || {
        get(&etcd, "liveness/n1").is_some()
    });
    let record = json(&get(&etcd, "liveness/n1").unwrap());
    let membership = json(&etcdctl(
        &etcd,
        &["get", &format!("{ROOT}membership/n1"), "-w", "json"],
    ));
    assert_eq!(
        record["lease"], membership["kvs"][0]["lease"],
        "the record names the membership lease"
    );
    assert_eq!(
        (record["ttl_ms"].as_u64(), record["margin_ms"].as_u64()),
        (Some(2000), Some(4000))
    );
    // (Its agent refreshes the record every 30 s, so the revision may move here.)
    let o = attest(&etcd, "n1", &["--force"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("n1: it is still a member"),
        "{}",
        stderr(&o)
    );
    assert_eq!(generation(&etcd, "n1"), Some(0));
    d1.kill();
    wait("n1's membership expired", || {
        get(&etcd, "membership/n1").is_none()
    });
    let o = attest(&etcd, "n1", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("waiting 2.0s"), "{}", stderr(&o));
    assert_eq!(generation(&etcd, "n1"), Some(1));
    let rev = revision(&etcd);
    for extra in [&[][..], &["--force"]] {
        let o = attest(&etcd, "n1", extra);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            stdout(&o).trim(),
            "n1 already fenced at generation 1: nothing done"
        );
        assert_eq!(
            revision(&etcd),
            rev,
            "an already-fenced node was written to"
        );
    }
    assert_eq!(generation(&etcd, "n1"), Some(1));
    assert_eq!(audit(&etcd, "n1").len(), 1);
}

/// A node whose lease etcd no longer holds, fenceable on the rules.
fn dead_node(etcd: &Etcd, node: &str) {
    joined_once(etcd, node);
    let lease = grant(etcd, 60);
    liveness(etcd, node, lease, 2_000, 2_000, 0);
    etcdctl(etcd, &["lease", "revoke", &format!("{lease:x}")]);
}

#[test]
fn a_fence_in_progress_is_refused_and_nothing_is_written() {
    let etcd = Etcd::start();
    dead_node(&etcd, "n1");
    put(&etcd, "fence_claim/n1", "n2/i-n2");
    let rev = revision(&etcd);
    for extra in [&[][..], &["--force"]] {
        let o = attest(&etcd, "n1", extra);
        refused(&etcd, &o, "controller n2/i-n2 is fencing it now", rev);
    }
    assert_eq!(generation(&etcd, "n1"), Some(0));
}

/// With `--block-device`, everything about the device is checked before the first
/// write: a path that is no reservation-capable namespace fails the command with
/// etcd untouched (the device path itself runs in `scenarios/guest-attest.sh`).
#[test]
fn a_device_that_cannot_be_used_fails_before_anything_is_written() {
    let etcd = Etcd::start();
    dead_node(&etcd, "n1");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    let dev = file.to_str().unwrap();
    let rev = revision(&etcd);
    let o = attest(&etcd, "n1", &["--block-device", dev]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--block-device needs --own-node-id"),
        "{}",
        stderr(&o)
    );
    let o = attest(&etcd, "n1", &["--block-device", dev, "--own-node-id", "n1"]);
    assert!(
        stderr(&o).contains("refusing to fence n1 from its own host"),
        "{}",
        stderr(&o)
    );
    let o = attest(&etcd, "n1", &["--block-device", dev, "--own-node-id", "n2"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with(&format!("fenced: cannot open {dev}")), "{e}");
    assert_eq!(revision(&etcd), rev, "a failed attest wrote to etcd");
    assert_eq!(generation(&etcd, "n1"), Some(0));
}
