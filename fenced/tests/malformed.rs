//! Garbage under every prefix the store reads, against a real etcd and real `fenced run`
//! processes: the sweep still fences a real death, logs each malformed record once,
//! and `fenced status` lists every one of them (issue 15, "one malformed value stops
//! every controller's sweep").

mod common;

use std::time::{Duration, Instant};

use common::etcd::Etcd;
use common::process::{FencedRun, status_json};

const ROOT: &str = "/bad/";

async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each kind of garbage under each prefix: (key under [`ROOT`], value).
fn garbage() -> Vec<(Vec<u8>, Vec<u8>)> {
    let kv = |k: &str, v: &[u8]| (k.as_bytes().to_vec(), v.to_vec());
    let huge = vec![b'7'; 512 * 1024];
    let mut g = vec![
        // gen/: non-numeric, negative, overflow, empty, non-UTF-8, huge, JSON, extra
        // path segment, no node at all, a node id with a space.
        kv("gen/zz", b"zz"),
        kv("gen/g-neg", b"-1"),
        kv("gen/g-overflow", b"18446744073709551616"),
        kv("gen/g-empty", b""),
        kv("gen/g-bytes", b"\xff\xfe\x00"),
        kv("gen/g-huge", &huge),
        kv("gen/g-json", br#"{"generation":1}"#),
        kv("gen/n7/extra", b"1"),
        kv("gen/", b"1"),
        kv("gen/bad id", b"1"),
        // membership/: JSON and non-UTF-8 instance ids, an extra segment.
        kv("membership/m-json", br#"{"instance":"i-1"}"#),
        kv("membership/m-bytes", b"\xc3\x28"),
        kv("membership/m1/extra", b"i-1"),
        // fence_pending/: JSON instance (the intent still counts: fenced), huge.
        kv("fence_pending/p-json", br#"["i-1"]"#),
        kv("fence_pending/p-huge", &[b'i'; 4096]),
        // fence_done/: negative, text.
        kv("fence_done/d-neg", b"-1"),
        kv("fence_done/d-text", b"done"),
        // fence_claim/: a forged log line as holder, extra segment.
        kv("fence_claim/c-nl", b"n1/i-1\nERROR forged"),
        kv("fence_claim/c1/x", b"n1/i-1"),
        // departed/: non-UTF-8.
        kv("departed/dep-bytes", b"\x80abc"),
        // instance/: JSON, empty node.
        kv("instance/ins-json", br#"{"id":"i-9"}"#),
        kv("instance/", b"i-1"),
        // arena_node/: extra segment, bad node, missing arena.
        kv("arena_node/n9/a1/extra", b""),
        kv("arena_node/bad node/a1", b""),
        kv("arena_node/n9", b""),
        // arena_owner/: owner not a node id, extra segment.
        kv("arena_owner/ao1", b"not a node!"),
        kv("arena_owner/ao2/x", b"n1"),
        // arena_free/: arena name with a space.
        kv("arena_free/free one", b""),
        // arena_claim/: no node segment, arena name with a space, extra segment.
        kv("arena_claim/ac1", b""),
        kv("arena_claim/a c/n1", b""),
        kv("arena_claim/ac2/n1/x", b""),
        // arena_pool/: arena name with a space.
        kv("arena_pool/pool one", b""),
        // liveness/: text, negative.
        kv("liveness/l-text", b"yesterday"),
        kv("liveness/l-neg", b"-5"),
        // audit/: text where JSON is expected, JSON of the wrong shape, bad key.
        kv("audit/n9/00000000000000000001", b"not json"),
        kv("audit/n9/00000000000000000002", br#"["a"]"#),
        kv("audit/n9/zz", br#"{"node":"n9"}"#),
    ];
    for (k, _) in &mut g {
        let mut full = ROOT.as_bytes().to_vec();
        full.append(k);
        *k = full;
    }
    g
}

/// The keys the sweep itself reads (the views read the rest).
fn read_by_sweep(key: &str) -> bool {
    [
        "gen/",
        "membership/",
        "fence_pending/",
        "fence_done/",
        "fence_claim/",
        "departed/",
        "instance/",
        "arena_node/",
    ]
    .iter()
    .any(|p| key.starts_with(&format!("{ROOT}{p}")))
}

/// The key as the daemon's log and `fenced status` show it (lossy, escaped).
fn shown_key(key: &[u8]) -> String {
    String::from_utf8_lossy(key).escape_debug().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_under_every_prefix_does_not_stop_the_sweep() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    for (k, v) in garbage() {
        client.put(k, v, None).await.unwrap();
    }
    let get = |key: &'static str| {
        let mut c = client.clone();
        async move {
            c.get(format!("{ROOT}{key}"), None)
                .await
                .unwrap()
                .kvs()
                .first()
                .map(|kv| kv.value().to_vec())
        }
    };

    // n2 joins alone, then dies by SIGKILL while no controller runs anywhere: only a
    // sweep (n1's, at its start and every second after) can fence it.
    let mut n2 = FencedRun::start(&etcd.endpoint(), ROOT, "n2", dir.path(), &[], &[]);
    wait_for("n2 joined", || async {
        get("membership/n2").await.is_some()
    })
    .await;
    n2.kill();
    wait_for("n2's lease expired", || async {
        get("membership/n2").await.is_none()
    })
    .await;
    assert_eq!(get("gen/n2").await.as_deref(), Some(&b"0"[..]));

    let n1 = FencedRun::start(&etcd.endpoint(), ROOT, "n1", dir.path(), &[], &[]);
    wait_for("n2 fenced by n1's sweep", || async {
        get("gen/n2").await.as_deref() == Some(&b"1"[..])
    })
    .await;
    let audit = get("audit/n2/00000000000000000001").await.unwrap();
    let audit: serde_json::Value = serde_json::from_slice(&audit).unwrap();
    assert_eq!(audit["trigger"], "sweep", "{audit}");
    assert_eq!(audit["fenced_by"], "n1/i-n1", "{audit}");

    // An intent whose instance id is garbage still counts: p-json is fenced too.
    wait_for("p-json fenced (its intent counts)", || async {
        get("gen/p-json").await.as_deref() == Some(&b"1"[..])
    })
    .await;
    // A node whose generation is garbage is owed a fence, which is attempted (the
    // intent is recorded) but never bumps the unreadable value.
    wait_for("the fence of zz attempted", || async {
        get("fence_pending/zz").await.is_some()
    })
    .await;
    assert_eq!(get("gen/zz").await.as_deref(), Some(&b"zz"[..]));

    // Several more sweeps (1 s apart), then each malformed record the sweep reads is
    // in n1's log exactly once: at most once for the records a fence rewrote or
    // cleared meanwhile (an intent is rewritten by its claim and cleared when done).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = n1.log();
    let mut still = Vec::new();
    for (k, v) in garbage() {
        let now = client.clone().get(k.clone(), None).await.unwrap();
        if now.kvs().first().is_some_and(|kv| kv.value() == v) {
            still.push(k);
        }
    }
    assert!(
        still.len() >= garbage().len() - 3,
        "only fenced intents change"
    );
    for (k, _) in garbage()
        .iter()
        .filter(|(k, _)| read_by_sweep(&shown_key(k)))
    {
        let key = shown_key(k);
        let lines = log
            .lines()
            .filter(|l| l.contains("does not decode") && l.contains(&format!("key={key} why=")))
            .count();
        let want = if still.contains(k) { 1..=1 } else { 0..=1 };
        assert!(
            want.contains(&lines),
            "{lines} log lines for {key:?}:\n{log}"
        );
    }

    // `fenced status` lists every malformed record, each with why and what is done.
    let st = status_json(&etcd, ROOT);
    let listed: Vec<&str> = st["malformed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    for k in &still {
        let key = shown_key(k);
        assert!(listed.contains(&key.as_str()), "{key:?} not in {listed:?}");
    }
    for m in st["malformed"].as_array().unwrap() {
        assert!(!m["why"].as_str().unwrap().is_empty(), "{m}");
        assert!(!m["effect"].as_str().unwrap().is_empty(), "{m}");
        assert!(m.to_string().len() < 1000, "bounded: {m}");
    }
    // The well-formed records are all there.
    assert_eq!(st["nodes"]["n2"]["generation"], 1, "{st}");
    assert_eq!(st["nodes"]["n2"]["last_fence"]["trigger"], "sweep", "{st}");
    // The node whose generation is garbage shows as owed, generation unknown.
    assert!(st["nodes"]["zz"]["generation"].is_null(), "{st}");
    assert!(!st["nodes"]["zz"]["owed"].is_null(), "{st}");
}
