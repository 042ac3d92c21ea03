//! The `fenced` binary as child processes against a real etcd: clear one-line errors,
//! SIGKILL death fenced by the survivors, `fenced leave` not fenced.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::{FencedRun, etcdctl, fenced, status_json, stderr, stdout, wait};

#[test]
fn invalid_node_id_is_one_clear_line() {
    let o = fenced()
        .args(["run", "--fencer", "none", "--node-id", "a/b"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("fenced: invalid node id \"a/b\""), "{e}");
}

/// Flag over environment variable over config file, observed through the one setting
/// whose bad value names itself in the error line: the node id.
#[test]
fn flag_beats_env_beats_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("fenced.toml");
    std::fs::write(&conf, "node_id = \"file/id\"\nfencer = \"none\"\n").unwrap();
    let run = |flag: Option<&str>, env: Option<&str>| {
        let mut c = fenced();
        c.args(["run", "--config"])
            .arg(&conf)
            .env_remove("FENCED_NODE_ID");
        if let Some(f) = flag {
            c.args(["--node-id", f]);
        }
        if let Some(e) = env {
            c.env("FENCED_NODE_ID", e);
        }
        let o = c.output().unwrap();
        assert!(!o.status.success());
        stderr(&o)
    };
    let e = run(Some("flag/id"), Some("env/id"));
    assert!(e.starts_with("fenced: invalid node id \"flag/id\""), "{e}");
    let e = run(None, Some("env/id"));
    assert!(e.starts_with("fenced: invalid node id \"env/id\""), "{e}");
    let e = run(None, None);
    assert!(e.starts_with("fenced: invalid node id \"file/id\""), "{e}");
}

#[test]
fn config_file_errors_name_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("fenced.toml");
    for (text, key) in [
        ("node_id = \"n1\"\nttl = 5\n", "ttl"),
        ("node_id = \"n1\"\nttl_secs = \"five\"\n", "ttl_secs"),
    ] {
        std::fs::write(&conf, text).unwrap();
        let o = fenced()
            .args(["run", "--config"])
            .arg(&conf)
            .output()
            .unwrap();
        assert!(!o.status.success());
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        let want = format!("fenced: invalid config {}: key `{key}`: ", conf.display());
        assert!(e.starts_with(&want), "{e}");
    }
}

#[test]
fn unreachable_etcd_is_retried_with_backoff_then_reported() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed again when the listener drops
    let t0 = Instant::now();
    let o = fenced()
        .args(["run", "--fencer", "none", "--node-id", "n1"])
        .args(["--etcd-endpoints", &format!("http://127.0.0.1:{port}")])
        .args(["--connect-timeout-secs", "3"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("retrying in"), "{e}");
    let last = e.lines().last().unwrap();
    assert!(
        last.starts_with("fenced: etcd unreachable at http://127.0.0.1:"),
        "{e}"
    );
    // Words, not the client's Debug output; which setting named the endpoint.
    assert!(
        last.contains("(from --etcd-endpoints or FENCED_ETCD_ENDPOINTS)")
            && last.contains(
                ": connection refused (nothing listens there); check that etcd runs there"
            ),
        "{last}"
    );
    for debug in ["tonic::", "Os {", "ConnectError(", "attempts;"] {
        assert!(!last.contains(debug), "{debug} in {last}");
    }
    assert!(t0.elapsed() >= Duration::from_secs(1));
}

/// `fenced run --fencer nvme --block-device <dev>` as node n1.
fn run_nvme(dev: &Path) -> Output {
    fenced()
        .args([
            "run",
            "--fencer",
            "nvme",
            "--node-id",
            "n1",
            "--block-device",
        ])
        .arg(dev)
        .output()
        .unwrap()
}

#[test]
fn nvme_fencer_on_a_device_without_reservations_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    let o = run_nvme(&file);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("fenced: cannot open"), "{e}");
    let o = fenced()
        .args(["run", "--fencer", "nvme", "--node-id", "n1"])
        .output()
        .unwrap();
    assert!(stderr(&o).contains("--fencer nvme needs --block-device"));
}

#[test]
fn block_device_links_are_resolved_and_missing_paths_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    std::fs::write(&file, vec![0u8; 4096]).unwrap();
    // A /dev/disk/by-id style link: the error names the device it resolves to.
    let link = dir.path().join("nvme-eui.0011");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let o = run_nvme(&link);
    let e = stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.starts_with(&format!(
            "fenced: cannot open {}",
            file.canonicalize().unwrap().display()
        )),
        "{e}"
    );
    let o = run_nvme(&dir.path().join("nvme-gone"));
    let e = stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.starts_with(&format!(
            "fenced: cannot open {}: No such file or directory",
            dir.path().join("nvme-gone").display()
        )),
        "{e}"
    );
    // More than the OS error: which setting, and what to give instead.
    assert!(
        e.contains("check --block-device") && e.contains("/dev/disk/by-id/"),
        "{e}"
    );
}

fn daemon(etcd: &Etcd, node: &str, dir: &Path) -> FencedRun {
    let pid_file = dir.join(format!("{node}.pid"));
    let pid_file = pid_file.to_str().expect("a UTF-8 temp dir");
    FencedRun::start(
        &etcd.endpoint(),
        "/cli",
        node,
        dir,
        &["--pid-file", pid_file],
        &[],
    )
}

fn status(etcd: &Etcd) -> serde_json::Value {
    status_json(etcd, "/cli")
}

fn generation(s: &serde_json::Value, node: &str) -> Option<u64> {
    s["nodes"][node]["generation"].as_u64()
}

/// Nodes holding membership in a `fenced status -o json` document.
fn members(s: &serde_json::Value) -> usize {
    s["nodes"]
        .as_object()
        .map_or(0, |n| n.values().filter(|r| r["member"] == true).count())
}

#[test]
fn daemons_fence_a_killed_peer_and_not_one_that_left() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let _d1 = daemon(&etcd, "n1", dir.path());
    let mut d2 = daemon(&etcd, "n2", dir.path());
    let d3 = daemon(&etcd, "n3", dir.path());
    wait("three members", || members(&status(&etcd)) == 3);
    // SIGKILL n2: single-signal fencing bumps its generation on expiry.
    d2.kill();
    wait("n2 fenced", || generation(&status(&etcd), "n2") == Some(1));
    let s = status(&etcd);
    let owed: Vec<_> = s["nodes"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| !r["owed"].is_null())
        .collect();
    assert!(owed.is_empty(), "{s}");
    assert_eq!(s["audit_records"], 1);
    // `fenced leave` for n3: over the control socket its pid file names; quiesce,
    // depart; exit 0; never fenced.
    let o = fenced()
        .args(["leave", "--pid-file"])
        .arg(dir.path().join("n3.pid"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut d3 = d3;
    assert!(d3.wait().success());
    std::thread::sleep(Duration::from_secs(4)); // TTL + several sweeps
    let s = status(&etcd);
    assert_eq!(generation(&s, "n3"), Some(0), "{s}");
    assert_eq!(s["nodes"]["n3"]["departed"], true, "{s}");
    assert_eq!(s["audit_records"], 1);
    let log = std::fs::read_to_string(dir.path().join("n1.log")).unwrap();
    assert!(
        log.contains("SINGLE-SIGNAL FENCING"),
        "loud warning at start"
    );
    let text = fenced()
        .args([
            "status",
            "--root",
            "/cli",
            "--etcd-endpoints",
            &etcd.endpoint(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let n2 = text
        .lines()
        .find(|l| l.starts_with("n2 "))
        .unwrap_or_else(|| panic!("no row for n2: {text}"));
    assert!(n2.contains("0 -> 1 at "), "{text}");
    assert!(
        n2.contains("by n1/i-n1") || n2.contains("by n3/i-n3"),
        "{text}"
    );
}

#[test]
fn operator_attestation_is_refused_while_member_then_fences_once_with_the_reason() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let mut d1 = daemon(&etcd, "n1", dir.path());
    wait("n1 member", || members(&status(&etcd)) == 1);
    let attest = |extra: &[&str]| {
        fenced()
            .args([
                "attest",
                "--root",
                "/cli",
                "--node-id",
                "n1",
                "--operator",
                "alice",
            ])
            .args(["--etcd-endpoints", &etcd.endpoint()])
            .args([
                "--reason",
                "host n1 powered off; confirmed on the BMC console",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = attest(&[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("still a member"), "{}", stderr(&o));
    d1.kill();
    wait("n1's membership expired", || members(&status(&etcd)) == 0);
    // Its lease is gone from etcd: attest waits out its self-fence margin (4 s)
    // minus its TTL (2 s), then fences. (Freshness judged by etcd: tests/attest.rs.)
    let o = attest(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("waiting 2.0s"), "{}", stderr(&o));
    let s = status(&etcd);
    assert_eq!(generation(&s, "n1"), Some(1));
    assert_eq!(s["audit_records"], 1);
    // The old flag still parses; a second attest does not bump again.
    let o = attest(&["--force-ignore-liveness"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("n1 already fenced at generation 1"),
        "{}",
        stdout(&o)
    );
    let s = status(&etcd);
    assert_eq!(generation(&s, "n1"), Some(1));
    assert_eq!(s["audit_records"], 1);
    // The reason is in the audit record verbatim.
    let v = etcdctl(
        &etcd,
        &["get", "--prefix", "/cli/audit/n1/", "--print-value-only"],
    );
    assert!(
        v.contains("attested by alice: host n1 powered off; confirmed on the BMC console"),
        "{v}"
    );
    assert!(v.contains("\"trigger\":\"operator\""), "{v}");
}

/// `fenced etcd-roles` without `--apply` prints what `--apply` does: its commands, run
/// as a shell script against one etcd, leave the same roles, users and keys as
/// `--apply` against another (the generation and fence-mark seeding included, which
/// the printed commands once left out).
#[test]
fn etcd_roles_prints_exactly_what_apply_does() {
    let printed_on = Etcd::start();
    let applied_on = Etcd::start();
    let roles = |etcd: &Etcd, apply: bool| {
        let mut c = fenced();
        c.args([
            "etcd-roles",
            "--root",
            "/r",
            "--nodes",
            "a,b",
            "--arenas",
            "x,y",
        ])
        .args(["--etcd-endpoints", &etcd.endpoint()]);
        if apply {
            c.arg("--apply");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let script = roles(&printed_on, false);
    assert!(
        script.contains(&format!(
            "export ETCDCTL_ENDPOINTS='{}'",
            printed_on.endpoint()
        )),
        "{script}"
    );
    let o = std::process::Command::new("sh")
        .args(["-euc", &script])
        .output()
        .unwrap();
    assert!(o.status.success(), "{script}\n{}", stderr(&o));
    roles(&applied_on, true);
    let state = |etcd: &Etcd| {
        let mut out = vec![
            etcdctl(etcd, &["role", "list"]),
            etcdctl(etcd, &["user", "list"]),
        ];
        for role in etcdctl(etcd, &["role", "list"]).lines() {
            out.push(etcdctl(etcd, &["role", "get", role]));
        }
        for user in etcdctl(etcd, &["user", "list"]).lines() {
            out.push(etcdctl(etcd, &["user", "get", user]));
        }
        out.push(etcdctl(etcd, &["get", "/r", "--prefix"]));
        out.join("\n")
    };
    let printed = state(&printed_on);
    assert!(printed.contains("/r/gen/a\n0\n"), "{printed}");
    assert!(printed.contains("/r/fence_done/b\n0\n"), "{printed}");
    assert!(printed.contains("/r/arena_pool/y\n"), "{printed}");
    assert_eq!(printed, state(&applied_on));
}
