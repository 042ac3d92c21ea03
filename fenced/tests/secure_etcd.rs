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

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::process::FencedRun;
use common::secure::{SecureEtcd, password_file, tls_args};
use fenced::store::EtcdSecurity;
use test_support::etcd::{Etcd, EtcdOptions};
use test_support::tls::Pki;

const ROOT: &str = "/sec/";

fn fenced() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fenced"))
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
    let (o, took) = status(&sec.endpoint(), &s);
    let m = missing.display().to_string();
    assert_one_line("missing key", &o, took, limit, &[&m, "--etcd-key"]);

    // A CA that did not sign the server's certificate.
    let other = Pki::new("another CA");
    let mut s = sec.security("ops");
    s.ca = Some(other.ca());
    let (o, took) = status(&sec.endpoint(), &s);
    let ca = other.ca().display().to_string();
    assert_one_line(
        "bad CA",
        &o,
        took,
        limit,
        &["TLS handshake failed", "UnknownIssuer", &ca],
    );

    // An expired client certificate: the server refuses the handshake.
    let expired = sec.pki.expired_client("ops");
    let mut s = sec.security("ops");
    s.cert = Some(expired.cert.clone());
    s.key = Some(expired.key);
    let (o, took) = status(&sec.endpoint(), &s);
    let cert = expired.cert.display().to_string();
    assert_one_line(
        "expired client certificate",
        &o,
        took,
        limit,
        &["expired 2001-01-01", &cert],
    );

    // TLS files with a plaintext endpoint: refused before connecting.
    let (o, took) = status(
        &sec.endpoint().replace("https://", "http://"),
        &sec.security("ops"),
    );
    assert_one_line("http endpoint", &o, took, limit, &["not https://"]);

    // A server whose certificate names another host.
    let wrong = Etcd::start_with(&EtcdOptions {
        tls: Some(sec.pki.server_for("elsewhere", &["db.example.com"])),
        ..EtcdOptions::default()
    });
    let (o, took) = status(&wrong.endpoint(), &sec.security("ops"));
    assert_one_line(
        "wrong host",
        &o,
        took,
        limit,
        &["TLS handshake failed", "NotValidForName"],
    );

    // `fenced run` waits for an unreachable etcd forever, but not for one that
    // refuses its certificate: it exits with the same one line.
    let mut s = sec.security("n1");
    s.ca = Some(other.ca());
    let t0 = Instant::now();
    let o = fenced()
        .args(["run", "--fencer", "none", "--node-id", "n1", "--root", ROOT])
        .args(["--etcd-endpoints", &sec.endpoint()])
        .args(tls_args(&s))
        .env("FENCED_LOG", "error")
        .output()
        .unwrap();
    assert_one_line(
        "run with a bad CA",
        &o,
        t0.elapsed(),
        limit,
        &["refused the connection", "UnknownIssuer", &ca],
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_fence_over_tls_with_certificate_and_password_identities() {
    // Tokens live 3 s; the run outlasts several and restarts the member, which
    // forgets every simple token.
    let mut sec = SecureEtcd::start(Some(3)).await;
    sec.add_prefix_role("fenced", ROOT).await;
    // Node a: user and password (from a file). Node b: its certificate's CN.
    sec.add_user("a", Some("pw-of-a"), &["fenced"]).await;
    sec.add_user("b", None, &["fenced"]).await;
    sec.add_user("ops", None, &["fenced"]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut a_sec = EtcdSecurity {
        ca: Some(sec.pki.ca()),
        user: Some("a".into()),
        password_file: Some(password_file(dir.path(), "a.pw", "pw-of-a")),
        ..EtcdSecurity::default()
    };
    // Node a also presents a certificate (the server requires one); its CN is not a
    // user, so the identity etcd uses is the password's.
    let a_cert = sec.pki.client("a-host");
    a_sec.cert = Some(a_cert.cert);
    a_sec.key = Some(a_cert.key);
    let a_args = tls_args(&a_sec);
    let b_args = sec.args("b");
    let a_args: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let ep = sec.endpoint();
    // TTL 2 s (FencedRun's); the margin covers the member restart.
    let ttl = ["--self-fence-margin-secs", "10"];
    let mut a = FencedRun::start(
        &ep,
        ROOT,
        "a",
        dir.path(),
        &[&a_args[..], &ttl].concat(),
        &[],
    );
    let mut b = FencedRun::start(
        &ep,
        ROOT,
        "b",
        dir.path(),
        &[&b_args[..], &ttl].concat(),
        &[],
    );

    let ops = sec.store("ops", ROOT).await.expect("operator store");
    let logs = || format!("--- a\n{}\n--- b\n{}", a.log(), b.log());
    wait_for(
        "a and b joined",
        Duration::from_secs(30),
        logs,
        async || {
            ops.status().await.is_ok_and(|s| {
                ["a", "b"]
                    .iter()
                    .all(|n| s.members.iter().any(|(m, _)| m == n))
            })
        },
    )
    .await;

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
    let log = a.log();
    assert!(!log.contains("refused"), "a saw a refusal: {log}");
}
