//! Only the cluster's namespace counts (issue 14 section 2), on a real etcd with the
//! reservation model standing in for two namespaces: the first join records the shared
//! namespace's identity; a node on another namespace is refused before it registers
//! anything; a controller whose device is another namespace does not fence (the fence
//! stays owed and audited) while a controller on the shared one completes it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use fenced::agent::{Agent, AgentError};
use fenced::fencer::{Fencer, NamespaceCheck, NvmeFencer, PreemptMode};
use nvme_resv::{NamespaceIdentity, Register, Reservations};

fn id(b: u8) -> NamespaceIdentity {
    NamespaceIdentity {
        nguid: [b; 16],
        eui64: [0; 8],
        subnqn: "nqn.2014-08.org.fenced:test".into(),
        ..nvme_resv::NamespaceIdentity::default()
    }
}

/// The shared namespace has identity 1; `other` (identity 2) is another
/// reservation-capable namespace.
fn two_namespaces(c: &Cluster) -> device::Namespace {
    c.ns.set_identity(id(1));
    let other = device::Namespace::new();
    other.set_identity(id(2));
    other
}

async fn start(c: &Cluster, n: &str, host: device::Host) -> Result<Agent, AgentError> {
    let mut cfg = c.agent_cfg(n, 0);
    cfg.namespace = Some(host.identity().unwrap());
    Agent::start(c.store().await, cfg, Some(Arc::new(host)), key_of(n)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_another_namespace_is_refused_before_registering() {
    let c = Cluster::new();
    let other = two_namespaces(&c);
    let store = c.store().await;
    let n1 = RunningAgent::spawn(start(&c, "n1", c.host("n1")).await.unwrap());
    assert_eq!(store.namespace_record().await.unwrap(), Some(id(1)));

    let err = start(&c, "n2", other.host(host_id("n2")))
        .await
        .unwrap_err();
    let AgentError::WrongNamespace { recorded, ours, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!((&**recorded, &**ours), (&id(1), &id(2)));
    let text = err.to_string();
    assert!(
        text.contains(&format!("recorded at /fenced-test/namespace: {}", id(1)))
            && text.contains(&format!("this node's device: {}", id(2)))
            && text.contains("nothing was registered"),
        "{text}"
    );
    eprintln!("refused: {text}");
    // Nothing of n2 anywhere: not a member, no generation, no key on either device.
    let st = store.status().await.unwrap();
    assert!(!st.members.iter().any(|(m, _)| m == "n2"), "{st:?}");
    assert!(!st.generations.iter().any(|(m, _)| m == "n2"), "{st:?}");
    assert!(other.snapshot().registrants.is_empty());
    assert!(!c.ns.snapshot().is_registered(key_of("n2")));
    // The record is unchanged, and a node on the shared namespace still joins.
    assert_eq!(store.namespace_record().await.unwrap(), Some(id(1)));
    let n3 = start(&c, "n3", c.host("n3")).await.unwrap();
    assert!(c.ns.snapshot().is_registered(key_of("n3")));
    drop(n3);
    n1.kill();
}

/// A controller's NVMe fencer on `host`, checking against the etcd record.
fn checked_fencer(
    c_store: fenced::store::EtcdStore,
    host: device::Host,
    n: &str,
) -> Arc<dyn Fencer> {
    Arc::new(
        NvmeFencer::new(Arc::new(host), key_of(n), PreemptMode::PreemptAndAbort).with_namespace(
            NamespaceCheck {
                joined: id(1),
                record: Some(Arc::new(c_store)),
            },
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_on_another_namespace_leaves_the_fence_owed() {
    let c = Cluster::new();
    let other = two_namespaces(&c);
    let store = c.store().await;
    let victim = RunningAgent::spawn(start(&c, "n1", c.host("n1")).await.unwrap());
    // Controller x's device is the other namespace, where it is registered: without the
    // check, the victim's key is "already absent" there and the fence "confirmed".
    let hx = other.host(host_id("x"));
    hx.register(&Register::register(key_of("x"))).unwrap();
    let mut cfg = c.controller_cfg("x");
    cfg.sweep_interval = Duration::from_millis(300);
    let (x, x_task) = c
        .controller(checked_fencer(store.clone(), hx, "x"), cfg)
        .await;

    victim.kill();
    wait_until("x's failed attempt", Duration::from_secs(20), || async {
        x.stats().failed.load(std::sync::atomic::Ordering::Relaxed) >= 2
    })
    .await;
    assert_eq!(generation(&store, "n1").await, 0, "bumped without evidence");
    let st = store.status().await.unwrap();
    assert!(st.owed.iter().any(|(n, _)| n == "n1"), "not owed: {st:?}");
    assert!(
        c.ns.snapshot().is_registered(key_of("n1")),
        "n1 was preempted"
    );
    let audits = store.audit_records(&node("n1")).await.unwrap();
    let failed = audits
        .iter()
        .find(|a| a["generation_after"] == a["generation_before"])
        .unwrap_or_else(|| panic!("no failed attempt audited: {audits:?}"));
    let result = failed["fencer_result"].as_str().unwrap();
    assert!(
        result.contains("not the cluster's shared namespace")
            && result.contains(&id(1).to_string())
            && result.contains(&id(2).to_string()),
        "{result}"
    );
    eprintln!("x's attempt: {result}");

    // A controller on the shared namespace completes the owed fence, once.
    let hy = c.host("y");
    hy.register(&Register::register(key_of("y"))).unwrap();
    x_task.abort();
    let (_y, _y_task) = c
        .controller(
            checked_fencer(store.clone(), hy, "y"),
            c.controller_cfg("y"),
        )
        .await;
    wait_until("n1 fenced by y", Duration::from_secs(20), || async {
        generation(&store, "n1").await == 1
    })
    .await;
    assert!(!c.ns.snapshot().is_registered(key_of("n1")));
    assert_eq!(fences_of(&store, "n1").await.len(), 1);
}

/// The record a fenced of issue 14 wrote for the namespace of NGUID `[1; 16]`.
const OLD_RECORD: &str = r#"{"nguid":"01010101010101010101010101010101","eui64":"0000000000000000","subnqn":"nqn.2014-08.org.fenced:test"}"#;

async fn put_raw(c: &Cluster, key: &str, value: &str) {
    let mut client = etcd_client::Client::connect([c.etcd.endpoint()], None)
        .await
        .expect("connect to the test etcd");
    client.put(key, value, None).await.expect("put");
}

async fn get_raw(c: &Cluster, key: &str) -> String {
    let mut client = etcd_client::Client::connect([c.etcd.endpoint()], None)
        .await
        .expect("connect to the test etcd");
    let r = client.get(key, None).await.expect("get");
    String::from_utf8_lossy(r.kvs()[0].value()).into_owned()
}

/// Upgrade (issue 27): a cluster whose `<root>/namespace` was recorded by an earlier
/// fenced (NGUID only, no kind) keeps its record; a node of this version, whose device
/// now also reports a UUID (nvmet gives every namespace one), joins on it; a node on
/// another NGUID is refused; the fencer's check accepts the shared one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_nguid_record_keeps_matching_after_the_upgrade() {
    let c = Cluster::new();
    let key = format!("{}/namespace", c.root);
    put_raw(&c, &key, OLD_RECORD).await;
    let mut now = id(1);
    now.uuid = [0x3c; 16];
    now.serial = b"1b2c3d4e5f60".to_vec();
    now.nsid = 1;
    assert_eq!(now.kind(), Some(nvme_resv::IdentityKind::Uuid));
    c.ns.set_identity(now.clone());
    let other = device::Namespace::new();
    let mut other_id = now.clone();
    other_id.nguid = [2; 16];
    other.set_identity(other_id);

    let n1 = start(&c, "n1", c.host("n1"))
        .await
        .expect("n1 joins on the old record");
    assert_eq!(
        get_raw(&c, &key).await,
        OLD_RECORD,
        "the record was rewritten"
    );
    let e = start(&c, "n2", other.host(host_id("n2")))
        .await
        .unwrap_err();
    assert!(matches!(e, AgentError::WrongNamespace { .. }), "{e:?}");
    let store = c.store().await;
    let check = NamespaceCheck {
        joined: now.clone(),
        record: Some(Arc::new(store.clone())),
    };
    check.check(now.clone()).await.expect("the fencer's check");
    drop(n1);
}

/// A namespace named by its UUID only (the kernel target's default), then one named
/// by its serial number only (an EBS volume): the first join records which kind it
/// holds; the same namespace through another host joins; another namespace of that
/// kind is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uuid_and_serial_identities_are_recorded_with_their_kind() {
    let uuid_only = |b: u8| NamespaceIdentity {
        uuid: [b; 16],
        serial: b"1b2c3d4e5f60".to_vec(),
        model: b"Linux".to_vec(),
        nsid: 1,
        subnqn: "nqn.2014-08.org.fenced:test".into(),
        ..NamespaceIdentity::default()
    };
    let ebs = |vol: &str| NamespaceIdentity {
        vid: 0x1d0f,
        serial: vol.as_bytes().to_vec(),
        model: b"Amazon Elastic Block Store".to_vec(),
        nsid: 1,
        ..NamespaceIdentity::default()
    };
    for (ours, theirs, kind) in [
        (uuid_only(1), uuid_only(2), "uuid"),
        (
            ebs("vol0123456789abcdef0"),
            ebs("vol0fedcba9876543210"),
            "vid-serial-model-nsid",
        ),
    ] {
        let c = Cluster::new();
        c.ns.set_identity(ours.clone());
        let other = device::Namespace::new();
        other.set_identity(theirs);
        let n1 = start(&c, "n1", c.host("n1")).await.expect("n1 joins");
        let record = get_raw(&c, &format!("{}/namespace", c.root)).await;
        assert!(record.contains(&format!(r#""kind":"{kind}""#)), "{record}");
        assert!(
            record.contains(&format!(r#""wwid":"{}""#, ours.wwid())),
            "{record}"
        );
        let store = c.store().await;
        assert!(
            store
                .namespace_record()
                .await
                .unwrap()
                .unwrap()
                .same_namespace(&ours)
        );
        let n2 = start(&c, "n2", c.host("n2"))
            .await
            .expect("n2 joins the same namespace");
        let e = start(&c, "n3", other.host(host_id("n3")))
            .await
            .unwrap_err();
        assert!(matches!(e, AgentError::WrongNamespace { .. }), "{e:?}");
        assert!(!other.snapshot().is_registered(key_of("n3")));
        drop((n1, n2));
    }
}

/// `fenced status` (the binary) on the cluster's etcd under `root`: its text.
fn status_text(c: &Cluster, root: &str) -> String {
    let o = common::process::fenced()
        .args([
            "status",
            "--root",
            root,
            "--etcd-endpoints",
            &c.etcd.endpoint(),
        ])
        .output()
        .expect("run the fenced binary");
    assert!(o.status.success(), "{}", common::process::stderr(&o));
    common::process::stdout(&o)
}

fn namespace_line(text: &str) -> String {
    text.lines()
        .find(|l| l.starts_with("namespace: "))
        .unwrap_or_else(|| panic!("no namespace line: {text}"))
        .to_owned()
}

/// Issue 27 section 2: the first join records its device's persistence with the
/// namespace's identity and `fenced status` shows both on one line; a record written
/// before the field existed still decodes (a join on it still matches, its status
/// says "not recorded").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_namespace_with_the_persistence_its_first_join_recorded() {
    use fenced::core::Persistence;
    use fenced::store::RecordedPersistence;
    let c = Cluster::new();
    c.ns.set_identity(id(1));
    let store = c
        .store()
        .await
        .with_namespace_persistence(Some(Persistence::Unsupported));
    let mut cfg = c.agent_cfg("n1", 0);
    cfg.namespace = Some(c.host("n1").identity().unwrap());
    let n1 = Agent::start(
        store.clone(),
        cfg,
        Some(Arc::new(c.host("n1"))),
        key_of("n1"),
    )
    .await
    .unwrap();
    let rec = store.namespace_record_full().await.unwrap().unwrap();
    assert_eq!(rec.identity, id(1));
    assert_eq!(
        rec.persistence,
        RecordedPersistence::Known(Persistence::Unsupported)
    );
    let line = namespace_line(&status_text(&c, &c.root));
    eprintln!("{line}");
    assert_eq!(
        line,
        format!(
            "namespace: {}; {} (as the first join found it)",
            id(1),
            Persistence::Unsupported.describe()
        )
    );
    drop(n1);

    // A record as fenced wrote it before it recorded the persistence.
    let old = r#"{"kind":"nguid","wwid":"eui.01010101010101010101010101010101","nguid":"01010101010101010101010101010101","eui64":"0000000000000000","subnqn":"nqn.2014-08.org.fenced:test"}"#;
    common::process::etcdctl(&c.etcd, &["put", "/old/namespace", old]);
    let old_store = fenced::store::EtcdStore::connect(&[c.etcd.endpoint()], "/old", CLAIM_TTL)
        .await
        .unwrap();
    assert_eq!(old_store.namespace_record().await.unwrap(), Some(id(1)));
    let rec = old_store.namespace_record_full().await.unwrap().unwrap();
    assert_eq!(rec.persistence, RecordedPersistence::NotRecorded);
    let line = namespace_line(&status_text(&c, "/old"));
    eprintln!("{line}");
    assert!(
        line.starts_with(&format!("namespace: {}; persistence not recorded", id(1))),
        "{line}"
    );
    // A join on the old record still matches (and does not rewrite it).
    let mut cfg = c.agent_cfg("n2", 0);
    cfg.namespace = Some(c.host("n2").identity().unwrap());
    let n2 = Agent::start(
        old_store
            .clone()
            .with_namespace_persistence(Some(Persistence::On)),
        cfg,
        Some(Arc::new(c.host("n2"))),
        key_of("n2"),
    )
    .await
    .unwrap();
    assert_eq!(
        old_store
            .namespace_record_full()
            .await
            .unwrap()
            .unwrap()
            .persistence,
        RecordedPersistence::NotRecorded
    );
    drop(n2);
}
