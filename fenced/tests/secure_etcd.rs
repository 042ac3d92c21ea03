//! `fenced` against a locked-down etcd (issue 16): TLS with certificates the test
//! generates, `--client-cert-auth`, and authentication enabled through etcd's auth API.
//!
//! - A misconfigured TLS setup (missing key file, a CA that did not sign the server,
//!   a server certificate for another host, an expired client certificate) is one
//!   error line naming the file, within a bounded time, from the operator commands and
//!   from `fenced run` (which otherwise waits for etcd forever): no retry loop.
//! - A full fence over TLS with both identities (certificate CN, user and password
//!   from a file): two `fenced run` daemons, one SIGKILLed, the other fences it (watch,
//!   claim, bump, audit), across a member restart that drops every auth token.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::process::FencedRun;
use common::secure::{SecureEtcd, password_file, tls_args};
use fenced::store::{EtcdSecurity, EtcdStore};
use test_support::etcd::{Etcd, EtcdOptions};
use test_support::tls::Pki;

const ROOT: &str = "/sec/";

fn fenced() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fenced"))
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `fenced status` on `endpoint` with `security`; its output and how long it took.
fn status(endpoint: &str, security: &EtcdSecurity) -> (Output, Duration) {
    let t0 = Instant::now();
    let o = fenced()
        .args(["status", "--root", ROOT, "--etcd-endpoints", endpoint])
        .args(tls_args(security))
        .env_remove("FENCED_ETCD_PASSWORD")
        .output()
        .unwrap();
    (o, t0.elapsed())
}

/// Asserts a failure printed as exactly one `fenced: ` line containing every
/// fragment of `expect`, within `limit`.
fn assert_one_line(what: &str, o: &Output, took: Duration, limit: Duration, expect: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "{what}: succeeded: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: not one line: {err}");
    assert!(lines[0].starts_with("fenced: "), "{what}: {err}");
    for e in expect {
        assert!(lines[0].contains(e), "{what}: {e:?} missing from: {err}");
    }
    assert!(
        took < limit,
        "{what}: took {took:?} (limit {limit:?}): {err}"
    );
}

/// `fenced status` on `endpoint` with `security` fails as exactly one line containing
/// every fragment of `expect`, within `limit`.
fn status_fails(
    what: &str,
    endpoint: &str,
    security: &EtcdSecurity,
    limit: Duration,
    expect: &[&str],
) {
    let (o, took) = status(endpoint, security);
    assert_one_line(what, &o, took, limit, expect);
}

/// `fenced run` as node `node` (no fencer) on `endpoint` with `args`, for a start that
/// ends (logging errors only); its output and how long it took.
fn run_exits(endpoint: &str, node: &str, args: &[String]) -> (Output, Duration) {
    let t0 = Instant::now();
    let o = fenced()
        .args(["run", "--fencer", "none", "--node-id", node, "--root", ROOT])
        .args(["--etcd-endpoints", endpoint])
        .args(args)
        .env("FENCED_LOG", "error")
        .output()
        .unwrap();
    (o, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_misconfiguration_is_one_line_naming_the_file() {
    let sec = SecureEtcd::start(None).await;
    sec.add_prefix_role("reader", ROOT).await;
    sec.add_user("ops", None, &["reader"]).await;
    let limit = Duration::from_secs(8);

    // The working setup first, so the failures below are the files' fault.
    let (o, _) = status(&sec.endpoint(), &sec.security("ops"));
    assert!(o.status.success(), "status over TLS: {}", stderr(&o));

    // A key file that does not exist.
    let mut s = sec.security("ops");
    let missing = sec.pki.dir().join("no-such-key.pem");
    s.key = Some(missing.clone());
    let m = missing.display().to_string();
    status_fails(
        "missing key",
        &sec.endpoint(),
        &s,
        limit,
        &[&m, "--etcd-key"],
    );

    // A CA that did not sign the server's certificate.
    let other = Pki::new("another CA");
    let mut s = sec.security("ops");
    s.ca = Some(other.ca());
    let ca = other.ca().display().to_string();
    status_fails(
        "bad CA",
        &sec.endpoint(),
        &s,
        limit,
        &["TLS handshake failed", "UnknownIssuer", &ca],
    );

    // An expired client certificate: the server refuses the handshake.
    let expired = sec.pki.expired_client("ops");
    let mut s = sec.security("ops");
    s.cert = Some(expired.cert.clone());
    s.key = Some(expired.key);
    let cert = expired.cert.display().to_string();
    status_fails(
        "expired client certificate",
        &sec.endpoint(),
        &s,
        limit,
        &["expired 2001-01-01", &cert],
    );

    // No client certificate, to a server that requires one: under TLS 1.3 the server
    // closes each connection after the client's handshake; on the third in a row that
    // is taken for a refusal, not an unreachable etcd.
    let mut s = sec.security("ops");
    s.cert = None;
    s.key = None;
    status_fails(
        "no client certificate",
        &sec.endpoint(),
        &s,
        limit,
        &[
            "refused the connection",
            "no client certificate",
            &sec.endpoint(),
        ],
    );

    // TLS files with a plaintext endpoint: refused before connecting.
    status_fails(
        "http endpoint",
        &sec.endpoint().replace("https://", "http://"),
        &sec.security("ops"),
        limit,
        &["not https://"],
    );

    // A server whose certificate names another host.
    let wrong = Etcd::start_with(&EtcdOptions {
        tls: Some(sec.pki.server_for("elsewhere", &["db.example.com"])),
        ..EtcdOptions::default()
    });
    status_fails(
        "wrong host",
        &wrong.endpoint(),
        &sec.security("ops"),
        limit,
        &[
            "TLS handshake failed",
            "certificate not valid for name \"127.0.0.1\"",
        ],
    );

    // `fenced run` waits for an unreachable etcd forever, but not for one that
    // refuses its certificate: it exits with the same one line.
    let mut s = sec.security("n1");
    s.ca = Some(other.ca());
    let (o, took) = run_exits(&sec.endpoint(), "n1", &tls_args(&s));
    assert_one_line(
        "run with a bad CA",
        &o,
        took,
        limit,
        &[
            "refused the connection",
            "UnknownIssuer",
            &ca,
            &sec.endpoint(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "run with a bad CA: {}",
        stderr(&o)
    );

    // The server refuses a client certificate another CA signed: under TLS 1.3 the
    // client sees the server's alert (BadCertificate) or only a closed connection,
    // which on the third attempt in a row ends the start too.
    let mut s = sec.security("n1");
    let foreign = other.client("n1");
    s.cert = Some(foreign.cert.clone());
    s.key = Some(foreign.key);
    let (o, took) = run_exits(&sec.endpoint(), "n1", &tls_args(&s));
    let cert = foreign.cert.display().to_string();
    assert_one_line(
        "run with a client certificate of another CA",
        &o,
        took,
        limit,
        &["refused the connection", &cert, &sec.endpoint()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

/// Waits until `f` holds, polling every 100 ms, at most `limit`; on a timeout the
/// panic carries `logs()`.
async fn wait_for(
    what: &str,
    limit: Duration,
    logs: impl Fn() -> String,
    mut f: impl AsyncFnMut() -> bool,
) {
    let t0 = Instant::now();
    while !f().await {
        assert!(
            t0.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; logs:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `--- <name>` and the log of each daemon, for a timeout's panic.
fn logs_of(runs: &[(&str, &FencedRun)]) -> String {
    runs.iter()
        .map(|(name, run)| format!("--- {name}\n{}", run.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until every node of `nodes` is a member, at most 30 s.
async fn wait_joined(ops: &EtcdStore, nodes: &[&str], logs: impl Fn() -> String) {
    wait_for(
        &format!("{} joined", nodes.join(" and ")),
        Duration::from_secs(30),
        logs,
        async || {
            ops.status()
                .await
                .is_ok_and(|s| nodes.iter().all(|n| s.members.iter().any(|(m, _)| m == n)))
        },
    )
    .await;
}

/// `fenced etcd-roles --apply` as etcd's root for `nodes` (comma-separated), with the
/// flags `extra`; what it printed.
fn apply_roles(sec: &SecureEtcd, nodes: &str, extra: &[&str]) -> String {
    let o = fenced()
        .args(["etcd-roles", "--root", ROOT, "--nodes", nodes, "--apply"])
        .args(extra)
        .args(["--etcd-endpoints", &sec.endpoint()])
        .args(sec.args("root"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "etcd-roles: {}{out}", stderr(&o));
    out
}

/// The certificate flags of `cn` followed by `extra`.
fn args_of(sec: &SecureEtcd, cn: &str, extra: &[&str]) -> Vec<String> {
    let mut args = sec.args(cn);
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// The two daemons of a full fence over TLS, started with `flags` (and a with
/// `a_env`) and joined, and the store of `ops`: all three hold role `fenced`
/// (read-write on ROOT); node a is a user with a password (written to a file in
/// `dir`), node b and `ops` are identified by their certificates' CNs.
async fn a_and_b_joined(
    sec: &SecureEtcd,
    dir: &Path,
    flags: &[&str],
    a_env: &[(&str, &str)],
) -> (FencedRun, FencedRun, EtcdStore) {
    sec.add_prefix_role("fenced", ROOT).await;
    // Node a: user and password (from a file). Node b: its certificate's CN.
    sec.add_user("a", Some("pw-of-a"), &["fenced"]).await;
    sec.add_user("b", None, &["fenced"]).await;
    sec.add_user("ops", None, &["fenced"]).await;
    // Node a also presents a certificate (the server requires one); its CN is not a
    // user, so the identity etcd uses is the password's.
    let a_cert = sec.pki.client("a-host");
    let a_sec = EtcdSecurity {
        ca: Some(sec.pki.ca()),
        cert: Some(a_cert.cert),
        key: Some(a_cert.key),
        user: Some("a".into()),
        password_file: Some(password_file(dir, "a.pw", "pw-of-a")),
        ..EtcdSecurity::default()
    };
    let ep = sec.endpoint();
    let (a_tls, b_args) = (tls_args(&a_sec), args_of(sec, "b", flags));
    let a_args = [strs(&a_tls), flags.to_vec()].concat();
    let a = FencedRun::start(&ep, ROOT, "a", dir, &a_args, a_env);
    let b = FencedRun::start(&ep, ROOT, "b", dir, &strs(&b_args), &[]);
    let ops = sec.store("ops", ROOT).await.expect("operator store");
    wait_joined(&ops, &["a", "b"], || logs_of(&[("a", &a), ("b", &b)])).await;
    (a, b, ops)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fence_over_tls_with_certificate_and_password_identities() {
    // Tokens live 3 s; the run outlasts several and restarts the member, which
    // forgets every simple token.
    let mut sec = SecureEtcd::start(Some(3)).await;
    let dir = tempfile::tempdir().unwrap();
    // TTL 2 s (FencedRun's); the margin covers the member restart.
    let ttl = ["--self-fence-margin-secs", "10"];
    let (mut a, mut b, ops) = a_and_b_joined(&sec, dir.path(), &ttl, &[]).await;

    // Outlast the token TTL twice, then restart the member: a's token is gone.
    tokio::time::sleep(Duration::from_secs(7)).await;
    sec.etcd.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.running(), "a exited: {}", a.log());
    assert!(b.running(), "b exited: {}", b.log());

    let node_b = fenced::NodeId::new("b").unwrap();
    let (gen_before, _) = ops.generation(&node_b).await.unwrap();
    b.kill();
    let logs = || format!("--- a\n{}\n--- etcd\n{}", a.log(), sec.etcd.log());
    wait_for("a fenced b", Duration::from_secs(40), logs, async || {
        ops.generation(&node_b)
            .await
            .is_ok_and(|(g, _)| g > gen_before)
    })
    .await;
    let audit = ops.audit_records(&node_b).await.unwrap();
    let last = audit.last().expect("an audit record of b's fence");
    assert_eq!(last["generation_before"], gen_before, "{last}");
    assert!(
        last.to_string().contains("\"a/"),
        "the fence was not a's: {last}"
    );
    assert!(a.running(), "a exited: {}", a.log());
    // No request of a's was refused by etcd's auth (`StoreError::Denied`, "etcd
    // refused ..."; RBAC's "permission denied"). Not any "refused": while the member
    // restarts, a request may meet "Connection refused", which is no refusal of a's
    // credentials (it failed this test under load).
    let log = a.log();
    for refusal in ["etcd refused", "permission denied"] {
        assert!(!log.contains(refusal), "a saw a refusal ({refusal}): {log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_node_roles_confine_each_node_to_its_own_keys() {
    let sec = SecureEtcd::start(None).await;
    let ep = sec.endpoint();
    // The roles, applied through the binary as etcd's root.
    let out = apply_roles(&sec, "a,b", &[]);
    assert!(
        out.contains("etcdctl role grant-permission fenced-node-a readwrite /sec/membership/a"),
        "{out}"
    );
    sec.add_user("ctl", None, &["fenced-controller"]).await;
    sec.add_user("ops", None, &["fenced-operator"]).await;

    // Agents with their node's credentials only; the controller on its own.
    let dir = tempfile::tempdir().unwrap();
    let agent = |n: &str| args_of(&sec, n, &["--role", "agent"]);
    let (a_args, b_args) = (agent("a"), agent("b"));
    let c_args = args_of(&sec, "ctl", &["--role", "controller"]);
    let mut a = FencedRun::start(&ep, ROOT, "a", dir.path(), &strs(&a_args), &[]);
    let mut b = FencedRun::start(&ep, ROOT, "b", dir.path(), &strs(&b_args), &[]);
    let mut c = FencedRun::start(&ep, ROOT, "ctl", dir.path(), &strs(&c_args), &[]);
    let ops = sec.store("ops", ROOT).await.expect("operator store");
    wait_joined(&ops, &["a", "b"], || {
        logs_of(&[("a", &a), ("b", &b), ("ctl", &c)])
    })
    .await;

    // Node b's credentials cannot write node a's keys, nor any generation.
    let mut root = sec.client("root").await;
    let snapshot = async |root: &mut etcd_client::Client| {
        let mut out = Vec::new();
        for k in [
            "membership/a",
            "departed/a",
            "arena_node/a/x",
            "gen/a",
            "gen/b",
        ] {
            let r = root.get(format!("{ROOT}{k}"), None).await.unwrap();
            out.push((k, r.kvs().first().map(|kv| kv.value().to_vec())));
        }
        out
    };
    let before = snapshot(&mut root).await;
    let mut as_b = sec.client("b").await;
    for k in [
        "membership/a",
        "departed/a",
        "liveness/a",
        "arena_node/a/x",
        "gen/a",
        "gen/b",
        "fence_claim/a",
    ] {
        let e = put_denied("b", &mut as_b, &format!("{ROOT}{k}"), "forged").await;
        assert!(e.to_string().contains("permission denied"), "{k}: {e}");
    }
    // Through fenced's own transactions too: b departing a.
    let store_b = sec.store("b", ROOT).await.expect("b's store");
    let node_a = fenced::NodeId::new("a").unwrap();
    let a_rev = membership_rev(&mut root, "a").await;
    let e = store_b
        .depart(&node_a, "i-a", a_rev, None)
        .await
        .unwrap_err();
    assert!(e.is_denied(), "{e}");
    assert_eq!(
        snapshot(&mut root).await,
        before,
        "b's attempts changed a key"
    );
    // A daemon started with b's certificate as another node is refused in one line
    // naming the identity presented and the node it tried to act as.
    let (o, _) = run_exits(&ep, "c", &args_of(&sec, "b", &["--role", "agent"]));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("etcd refused node c's own keys to identity \"b\"")
            && e.contains("run it as --node-id b"),
        "{e}"
    );
    for debug in ["tonic::", "Status {", "Os {"] {
        assert!(!e.contains(debug), "{debug} in {e}");
    }
    assert_eq!(
        snapshot(&mut root).await,
        before,
        "the refused start changed a key"
    );
    assert!(a.running(), "a exited: {}", a.log());
    let live = root.get(format!("{ROOT}liveness/a"), None).await.unwrap();
    assert!(
        !String::from_utf8_lossy(live.kvs()[0].value()).contains("forged"),
        "liveness/a forged"
    );

    // The roles are enough for the protocol: b dies, the controller-only daemon
    // fences it (claim, bump, audit) and a keeps running.
    let node_b = fenced::NodeId::new("b").unwrap();
    b.kill();
    let logs = || logs_of(&[("a", &a), ("ctl", &c)]);
    wait_for("ctl fenced b", Duration::from_secs(40), logs, async || {
        ops.generation(&node_b).await.is_ok_and(|(g, _)| g == 1)
    })
    .await;
    let audit = ops.audit_records(&node_b).await.unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert!(audit[0].to_string().contains("\"ctl/"), "{}", audit[0]);
    assert!(a.running(), "a exited: {}", a.log());
    assert!(c.running(), "ctl exited: {}", c.log());
}

/// The prefixes of the arena keys.
const ARENA_PREFIXES: [&str; 3] = ["arena_pool/", "arena_claim/", "arena_node/"];
/// The prefixes of the arena keys before per-node claims, whose keys name no node.
const LEGACY_ARENA_PREFIXES: [&str; 2] = ["arena_owner/", "arena_free/"];

/// Every key under `prefixes` (below ROOT) and its value, read as root.
async fn keys_under(root: &mut etcd_client::Client, prefixes: &[&str]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for p in prefixes {
        let r = root
            .get(
                format!("{ROOT}{p}"),
                Some(etcd_client::GetOptions::new().with_prefix()),
            )
            .await
            .unwrap();
        for kv in r.kvs() {
            out.push((
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.value().to_vec(),
            ));
        }
    }
    out
}

/// The create revision of node `n`'s membership key, read as root.
async fn membership_rev(root: &mut etcd_client::Client, n: &str) -> i64 {
    let m = root
        .get(format!("{ROOT}membership/{n}"), None)
        .await
        .unwrap();
    m.kvs()[0].create_revision()
}

/// Puts `value` at `key` with `who`'s client and asserts etcd refused it
/// (`StoreError::is_denied`); the refusal.
async fn put_denied(
    who: &str,
    client: &mut etcd_client::Client,
    key: &str,
    value: &str,
) -> fenced::store::StoreError {
    let e = client
        .put(key, value, None)
        .await
        .expect_err(&format!("{who} wrote {key}"));
    let e = fenced::store::StoreError::classify("put", e);
    assert!(e.is_denied(), "{key}: {e}");
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_claim_or_release_another_nodes_arena() {
    let sec = SecureEtcd::start(None).await;
    let ep = sec.endpoint();
    let out = apply_roles(&sec, "a,b", &["--arenas", "x,y,z"]);
    assert!(
        out.contains("etcdctl role grant-permission fenced-node-a readwrite /sec/arena_claim/x/a"),
        "{out}"
    );
    sec.add_user("ops", None, &["fenced-operator"]).await;
    // Agents only, one arena each, from the pool `--apply` seeded.
    let dir = tempfile::tempdir().unwrap();
    let agent = |n: &str| args_of(&sec, n, &["--role", "agent", "--arena-count", "1"]);
    let (a_args, b_args) = (agent("a"), agent("b"));
    let mut a = FencedRun::start(&ep, ROOT, "a", dir.path(), &strs(&a_args), &[]);
    let mut b = FencedRun::start(&ep, ROOT, "b", dir.path(), &strs(&b_args), &[]);
    let ops = sec.store("ops", ROOT).await.expect("operator store");
    let logs = || logs_of(&[("a", &a), ("b", &b)]);
    wait_for(
        "a and b each own an arena",
        Duration::from_secs(30),
        logs,
        async || {
            ops.status().await.is_ok_and(|s| {
                ["a", "b"]
                    .iter()
                    .all(|n| s.arenas.iter().filter(|(_, o)| o == n).count() == 1)
            })
        },
    )
    .await;
    let st = ops.status().await.unwrap();
    let owned_by = |n: &str| {
        st.arenas
            .iter()
            .find(|(_, o)| o == n)
            .map(|(a, _)| a.clone())
            .unwrap()
    };
    let (arena_a, arena_b) = (owned_by("a"), owned_by("b"));
    assert_eq!(st.free_arenas.len(), 1, "{:?}", st.free_arenas);
    let (node_a, node_b) = (
        fenced::NodeId::new("a").unwrap(),
        fenced::NodeId::new("b").unwrap(),
    );
    let mut root = sec.client("root").await;
    let (a_rev, b_rev) = (
        membership_rev(&mut root, "a").await,
        membership_rev(&mut root, "b").await,
    );
    let before = keys_under(&mut root, &ARENA_PREFIXES).await;
    assert!(
        before
            .iter()
            .any(|(k, _)| k == &format!("{ROOT}arena_claim/{arena_a}/a")),
        "{before:?}"
    );

    // Through fenced's own transactions with b's credentials: releasing a's arena
    // is refused by etcd (a's claim key is not b's to delete); claiming it is
    // refused by the claim's compare (a holds it).
    let store_b = sec.store("b", ROOT).await.expect("b's store");
    let e = store_b
        .release_arena(&node_a, a_rev, &arena_a)
        .await
        .expect_err("b released a's arena");
    assert!(e.is_denied(), "{e}");
    assert!(e.to_string().contains("permission denied"), "{e}");
    assert!(
        !store_b
            .claim_arena(&node_b, b_rev, &arena_a)
            .await
            .expect("b's claim transaction"),
        "b claimed a's arena"
    );
    // Writing the keys directly: a's claim and index, and the pool.
    let mut as_b = sec.client("b").await;
    let claim_a = format!("{ROOT}arena_claim/{arena_a}/a");
    for k in [
        claim_a.clone(),
        format!("{ROOT}arena_node/a/{arena_a}"),
        format!("{ROOT}arena_pool/{arena_a}"),
        format!("{ROOT}arena_pool/{arena_b}"),
    ] {
        put_denied("b", &mut as_b, &k, "forged").await;
        let e = as_b
            .delete(k.as_str(), None)
            .await
            .expect_err(&format!("b deleted {k}"));
        let e = fenced::store::StoreError::classify("delete", e);
        assert!(e.is_denied(), "{k}: {e}");
    }
    // Nor the layout before per-node claims, whose keys name no node.
    for k in LEGACY_ARENA_PREFIXES {
        put_denied("b", &mut as_b, &format!("{ROOT}{k}{arena_a}"), "b").await;
    }
    assert_eq!(
        keys_under(&mut root, &ARENA_PREFIXES).await,
        before,
        "b's attempts changed an arena key"
    );
    assert_eq!(store_b.owned_arenas(&node_b).await.unwrap(), [arena_b]);
    assert!(a.running(), "a exited: {}", a.log());
    assert!(b.running(), "b exited: {}", b.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arena_records_of_the_older_layout_are_refused_until_converted() {
    let sec = SecureEtcd::start(None).await;
    let ep = sec.endpoint();
    apply_roles(&sec, "a,b", &["--arenas", "x,y"]);
    sec.add_user("ctl", None, &["fenced-controller"]).await;
    sec.add_user("ops", None, &["fenced-operator"]).await;
    // What an older fenced left: a owns x, y is free.
    let mut root = sec.client("root").await;
    for (k, v) in [
        ("arena_owner/x", "a"),
        ("arena_node/a/x", ""),
        ("arena_free/y", ""),
    ] {
        root.put(format!("{ROOT}{k}"), v, None).await.unwrap();
    }
    let run = |n: &str, extra: &[&str]| {
        run_exits(
            &ep,
            n,
            &args_of(&sec, n, &[&["--arena-count", "1"][..], extra].concat()),
        )
    };
    // An agent refuses to start next to them, naming them and the way out.
    let (o, took) = run("b", &["--role", "agent"]);
    assert_one_line(
        "older layout",
        &o,
        took,
        Duration::from_secs(8),
        &[
            "layout before per-node claims",
            "/sec/arena_owner/x = a",
            "/sec/arena_free/y",
            "--seed-arenas",
        ],
    );
    // A node's credentials cannot convert them.
    let (o, took) = run("b", &["--role", "agent", "--seed-arenas", "x,y"]);
    assert_one_line(
        "conversion with a node's credentials",
        &o,
        took,
        Duration::from_secs(8),
        &["cannot seed", "permission denied"],
    );
    let legacy =
        async |root: &mut etcd_client::Client| keys_under(root, &LEGACY_ARENA_PREFIXES).await.len();
    assert_eq!(legacy(&mut root).await, 2);

    // The controller converts them at its start: a keeps x, y is free.
    let dir = tempfile::tempdir().unwrap();
    let c_args = args_of(
        &sec,
        "ctl",
        &["--role", "controller", "--seed-arenas", "x,y"],
    );
    let mut c = FencedRun::start(&ep, ROOT, "ctl", dir.path(), &strs(&c_args), &[]);
    let ops = sec.store("ops", ROOT).await.expect("operator store");
    let logs = || c.log();
    wait_for(
        "the conversion",
        Duration::from_secs(30),
        logs,
        async || {
            ops.status().await.is_ok_and(|s| {
                s.arenas == [("x".to_owned(), "a".to_owned())] && s.free_arenas == ["y"]
            })
        },
    )
    .await;
    assert_eq!(legacy(&mut root).await, 0);
    // b starts now, and claims y: x is a's.
    let b_args = args_of(&sec, "b", &["--role", "agent", "--arena-count", "1"]);
    let mut b = FencedRun::start(&ep, ROOT, "b", dir.path(), &strs(&b_args), &[]);
    let logs = || logs_of(&[("b", &b), ("ctl", &c)]);
    wait_for("b claimed y", Duration::from_secs(30), logs, async || {
        ops.status().await.is_ok_and(|s| {
            s.arenas.contains(&("y".to_owned(), "b".to_owned()))
                && s.arenas.contains(&("x".to_owned(), "a".to_owned()))
        })
    })
    .await;
    assert!(b.running(), "b exited: {}", b.log());
    assert!(c.running(), "ctl exited: {}", c.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_nodes_role_makes_it_self_fence() {
    let sec = SecureEtcd::start(None).await;
    let ep = sec.endpoint();
    apply_roles(&sec, "a,b,c", &[]);
    sec.add_user("ops", None, &["fenced-operator"]).await;
    // a: agent only; b: agent and controller (node role plus the controller role).
    sec.client("root")
        .await
        .user_grant_role("b", "fenced-controller")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a_args = args_of(&sec, "a", &["--role", "agent"]);
    // b, the fencer, gets a wide margin: a spurious self-fence of b under a loaded
    // machine would leave no one to fence a.
    let b_args = args_of(&sec, "b", &["--self-fence-margin-secs", "10"]);
    let mut a = FencedRun::start(&ep, ROOT, "a", dir.path(), &strs(&a_args), &[]);
    let b = FencedRun::start(&ep, ROOT, "b", dir.path(), &strs(&b_args), &[]);
    let ops = sec.store("ops", ROOT).await.expect("operator store");
    wait_joined(&ops, &["a", "b"], || logs_of(&[("a", &a), ("b", &b)])).await;

    sec.client("root")
        .await
        .user_revoke_role("a", "fenced-node-a")
        .await
        .unwrap();
    let t0 = Instant::now();
    while a.running() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "a still running 20 s after its role was revoked: {}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = a.log();
    assert!(log.contains("self-fenced"), "{log}");
    assert!(log.contains("etcd refuses this node's writes"), "{log}");
    // And b fenced it once its lease expired.
    let node_a = fenced::NodeId::new("a").unwrap();
    let logs = || logs_of(&[("a", &a), ("b", &b)]);
    wait_for("b fenced a", Duration::from_secs(40), logs, async || {
        ops.generation(&node_a).await.is_ok_and(|(g, _)| g >= 1)
    })
    .await;
    let done = ops.audit_records(&node_a).await.unwrap();
    let done: Vec<_> = done
        .iter()
        .filter(|r| r["generation_after"] != r["generation_before"])
        .collect();
    assert_eq!(done.len(), 1, "a fenced more than once: {done:?}");
    assert_eq!(ops.generation(&node_a).await.unwrap().0, 1);
    // c has a role and a seeded generation but never started: b's sweeps (one a
    // second all along) know it and leave it alone, there is nothing to cut off.
    let node_c = fenced::NodeId::new("c").unwrap();
    assert_eq!(ops.generation(&node_c).await.unwrap().0, 0);
    let audit_c = ops.audit_records(&node_c).await.unwrap();
    assert!(audit_c.is_empty(), "c was fenced: {audit_c:?}");
}

/// A fault under TLS and auth: the etcd member is SIGKILLed and restarted while a
/// fence waits before its finishing transaction (`fence::bump`); the restarted member
/// has forgotten every auth token, and the fence completes once, re-authenticated.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_killed_mid_fence_over_tls_and_auth() {
    let mut sec = SecureEtcd::start(Some(3)).await;
    let dir = tempfile::tempdir().unwrap();
    let margin = ["--self-fence-margin-secs", "10", "--claim-ttl-secs", "20"];
    let (mut a, mut b, ops) = a_and_b_joined(
        &sec,
        dir.path(),
        &margin,
        &[("FAILPOINTS", "fence::bump=return(a/*=sleep:4000)")],
    )
    .await;
    b.kill();
    // The claim is taken; the fence now waits 4 s before its finishing transaction.
    let mut root = sec.client("root").await;
    let t0 = Instant::now();
    loop {
        let r = root
            .get(format!("{ROOT}fence_claim/b"), None)
            .await
            .unwrap();
        if !r.kvs().is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no claim on b: {}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sec.etcd.restart();
    let node_b = fenced::NodeId::new("b").unwrap();
    // Still mid-fence: the restart came between the claim and the bump.
    let g = root.get(format!("{ROOT}gen/b"), None).await.unwrap();
    assert_eq!(
        g.kvs()[0].value(),
        b"0",
        "the fence finished before the restart"
    );
    let logs = || format!("--- a\n{}\n--- etcd\n{}", a.log(), sec.etcd.log());
    wait_for("a fenced b", Duration::from_secs(40), logs, async || {
        ops.generation(&node_b).await.is_ok_and(|(g, _)| g == 1)
    })
    .await;
    let audit = ops.audit_records(&node_b).await.unwrap();
    let done: Vec<_> = audit
        .iter()
        .filter(|r| r["generation_after"] != r["generation_before"])
        .collect();
    assert_eq!(done.len(), 1, "{audit:?}");
    assert!(a.running(), "a exited: {}", a.log());
}

/// Roles for nodes a and b applied, users `operators` with the operator role, a and b
/// started as agents only (nothing fences b but an operator) and joined, then b
/// SIGKILLed and its lease expired. The running a, and the first operator's store.
async fn b_down_with_operators(
    sec: &SecureEtcd,
    dir: &Path,
    operators: &[&str],
) -> (FencedRun, EtcdStore) {
    let ep = sec.endpoint();
    apply_roles(sec, "a,b", &[]);
    for op in operators {
        sec.add_user(op, None, &["fenced-operator"]).await;
    }
    let agent = |n: &str| args_of(sec, n, &["--role", "agent"]);
    let (a_args, b_args) = (agent("a"), agent("b"));
    let a = FencedRun::start(&ep, ROOT, "a", dir, &strs(&a_args), &[]);
    let mut b = FencedRun::start(&ep, ROOT, "b", dir, &strs(&b_args), &[]);
    let ops = sec
        .store(operators[0], ROOT)
        .await
        .unwrap_or_else(|e| panic!("{}'s store: {e:?}", operators[0]));
    wait_joined(&ops, &["a", "b"], || logs_of(&[("a", &a), ("b", &b)])).await;
    b.kill();
    wait_for(
        "b's lease expired",
        Duration::from_secs(20),
        String::new,
        async || {
            ops.status()
                .await
                .is_ok_and(|s| !s.members.iter().any(|(m, _)| m == "b"))
        },
    )
    .await;
    (a, ops)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attest_needs_the_operator_role_and_records_the_authenticated_identity() {
    let sec = SecureEtcd::start(None).await;
    let ep = sec.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let (_a, ops) = b_down_with_operators(&sec, dir.path(), &["alice"]).await;
    let attest = |cn: &str| {
        fenced()
            .args(["attest", "--root", ROOT, "--node-id", "b"])
            .args(["--reason", "powered off; confirmed on the BMC"])
            .args(["--etcd-endpoints", &ep])
            .args(sec.args(cn))
            .env("USER", "mallory")
            .env_remove("FENCED_NODE_ID")
            .output()
            .unwrap()
    };
    // Node a's credentials (no operator role): etcd refuses the fence.
    let o = attest("a");
    let err = stderr(&o);
    assert!(!o.status.success(), "a attested: {err}");
    assert!(err.contains("permission denied"), "{err}");
    let node_b = fenced::NodeId::new("b").unwrap();
    assert_eq!(ops.generation(&node_b).await.unwrap().0, 0);
    // Alice (operator role, identified by her certificate) fences b; the record names
    // her, not $USER.
    let o = attest("alice");
    assert!(o.status.success(), "alice: {}", stderr(&o));
    assert_eq!(ops.generation(&node_b).await.unwrap().0, 1);
    let audit = ops.audit_records(&node_b).await.unwrap();
    let rec = audit.last().unwrap().to_string();
    assert!(rec.contains("alice"), "{rec}");
    assert!(!rec.contains("mallory"), "{rec}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_person_attest_waits_for_a_second_distinct_operator() {
    let sec = SecureEtcd::start(None).await;
    let ep = sec.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let (_a, ops) = b_down_with_operators(&sec, dir.path(), &["alice", "bob"]).await;
    let node_b = fenced::NodeId::new("b").unwrap();
    // The number of operators from the config file, or from the flags.
    let config = dir.path().join("fenced.toml");
    std::fs::write(&config, "approvals = 2\napproval_timeout_secs = 2\n").unwrap();
    let attest = |how: &[&str]| {
        let mut c = fenced();
        c.args(["attest", "--root", ROOT, "--node-id", "b"])
            .args(how)
            .args(["--reason", "alice: powered off at the PDU"])
            .args(["--etcd-endpoints", &ep])
            .args(sec.args("alice"))
            .env_remove("FENCED_NODE_ID");
        c
    };
    let approve = |cn: &str| {
        fenced()
            .args(["approve", "--root", ROOT, "--node-id", "b"])
            .args(["--reason", &format!("{cn}: saw it dark on the BMC")])
            .args(["--etcd-endpoints", &ep])
            .args(sec.args(cn))
            .output()
            .unwrap()
    };
    // No approval in time: nothing fenced.
    let t0 = Instant::now();
    let o = attest(&["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("no approval of b's fence by a second operator"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert_eq!(ops.generation(&node_b).await.unwrap().0, 0);
    // Nothing pending: approve refuses.
    let o = approve("bob");
    assert!(
        !o.status.success() && stderr(&o).contains("awaits approval"),
        "{}",
        stderr(&o)
    );

    // Alice requests; she cannot approve herself; Bob approves; the fence happens.
    let pending = attest(&["--approvals", "2", "--approval-timeout-secs", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(
        "alice's request",
        Duration::from_secs(20),
        String::new,
        async || ops.approvals(&node_b).await.is_ok_and(|a| !a.is_empty()),
    )
    .await;
    let o = approve("alice");
    assert!(!o.status.success(), "alice approved her own request");
    assert!(stderr(&o).contains("distinct operator"), "{}", stderr(&o));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        ops.generation(&node_b).await.unwrap().0,
        0,
        "fenced on one approval"
    );
    let o = approve("bob");
    assert!(o.status.success(), "bob: {}", stderr(&o));
    let out = tokio::task::spawn_blocking(move || pending.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "attest: {}", stderr(&out));
    assert_eq!(ops.generation(&node_b).await.unwrap().0, 1);
    let rec = ops
        .audit_records(&node_b)
        .await
        .unwrap()
        .last()
        .unwrap()
        .to_string();
    for s in [
        "alice+bob",
        "alice: powered off at the PDU",
        "bob: saw it dark on the BMC",
    ] {
        assert!(rec.contains(s), "{s:?} not in {rec}");
    }
    assert!(
        ops.approvals(&node_b).await.unwrap().is_empty(),
        "request left behind"
    );
}
