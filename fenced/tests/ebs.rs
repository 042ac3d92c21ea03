//! The EBS fencer against a real EC2 API peer (moto's server, started on loopback by
//! the test itself) through the real AWS SDK client with an endpoint override, and end
//! to end through the controller with a real etcd (tests/common).

mod common;
mod ebs_peer;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, future};
use fenced::agent::Agent;
use fenced::controller::Controller;
use fenced::core::Victim;
use fenced::ebs::{
    EbsConfig, EbsError, EbsFencer, Ec2ErrorKind, Ec2Op, PollLimits, StaticInstances,
};
use fenced::fencer::{FenceCause, Fencer};
use fenced::node::NodeId;
use fenced::store::EtcdStore;

use ebs_peer::{Corrupt, Moto, Proxy};

const CLAIM_TTL: Duration = Duration::from_secs(120);

fn config(url: &str, volume: &str, limits: PollLimits) -> EbsConfig {
    EbsConfig {
        volume_id: volume.to_owned(),
        region: Some("us-east-1".to_owned()),
        endpoint_url: Some(url.to_owned()),
        limits,
    }
}

fn limits(deadline: Duration) -> PollLimits {
    PollLimits {
        deadline,
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(400),
        redetach_after: Duration::from_secs(30),
    }
}

async fn fencer(url: &str, volume: &str, limits: PollLimits) -> EbsFencer {
    let cfg = config(url, volume, limits);
    let sdk = ebs_peer::sdk_config(&cfg).await;
    EbsFencer::from_sdk_config(&cfg, &sdk, CLAIM_TTL).expect("fencer")
}

fn victim(instance: &str) -> Victim {
    Victim {
        node: NodeId::new("n1").unwrap(),
        instance: instance.to_owned(),
    }
}

#[tokio::test]
async fn fence_detaches_and_describe_confirms() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (inst, vol) = ebs_peer::attached_volume(&ec2).await;
    assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![inst.clone()]);

    let f = fencer(&moto.url(), &vol, PollLimits::default()).await;
    let t = Instant::now();
    let c = f.fence(&victim(&inst)).await.expect("fence");
    let took = t.elapsed();
    eprintln!("ebs fence against moto: {took:?} ({})", c.evidence);
    assert!(c.severed);
    assert_eq!(c.fencer, "ebs");
    assert!(c.evidence.contains(&inst), "{}", c.evidence);
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());

    // A retry of a completed fence (another controller, the sweep) is confirmed again.
    let c = f.fence(&victim(&inst)).await.expect("second fence");
    assert!(c.severed);
    assert!(
        c.evidence.contains("InvalidAttachment.NotFound"),
        "{}",
        c.evidence
    );

    // Warm latency: a fresh attachment fenced by the warm client.
    let mut times = Vec::new();
    for _ in 0..5 {
        ebs_peer::attach(&ec2, &vol, &inst).await;
        let t = Instant::now();
        assert!(f.fence(&victim(&inst)).await.expect("fence").severed);
        times.push(t.elapsed());
        assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
    }
    times.sort();
    eprintln!(
        "ebs fence against moto, warm: min {:?} median {:?} max {:?}",
        times[0], times[2], times[4]
    );
}

#[tokio::test]
async fn never_attached_volume_is_already_severed() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let inst = ebs_peer::run_instance(&ec2).await;
    let vol = ebs_peer::create_volume(&ec2).await;
    let f = fencer(&moto.url(), &vol, PollLimits::default()).await;
    let c = f.fence(&victim(&inst)).await.expect("fence");
    assert!(c.severed);
    assert!(c.evidence.contains("no attachment"), "{}", c.evidence);
}

#[tokio::test]
async fn unknown_volume_is_a_typed_error_not_a_fence() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let inst = ebs_peer::run_instance(&ec2).await;
    let f = fencer(&moto.url(), "vol-0123456789abcdef0", PollLimits::default()).await;
    let e = f.sever(&victim(&inst)).await.unwrap_err();
    match &e {
        EbsError::VolumeNotFound { op, source, .. } => {
            assert_eq!(*op, Ec2Op::DetachVolume);
            assert_eq!(source.kind, Ec2ErrorKind::VolumeNotFound);
            assert_eq!(source.code.as_deref(), Some("InvalidVolume.NotFound"));
        }
        other => panic!("expected VolumeNotFound, got {other:?}"),
    }
    assert!(!e.is_retryable());
    // Through the Fencer trait: a FenceError carrying the typed cause.
    let fe = f.fence(&victim(&inst)).await.unwrap_err();
    assert!(
        matches!(&fe.cause, FenceCause::Ebs(EbsError::VolumeNotFound { .. })),
        "{fe}"
    );
}

#[tokio::test]
async fn unknown_instance_is_severed_only_by_describe() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let survivor = ebs_peer::run_instance(&ec2).await;
    let vol = ebs_peer::create_volume(&ec2).await;
    ebs_peer::attach(&ec2, &vol, &survivor).await;
    let f = fencer(&moto.url(), &vol, PollLimits::default())
        .await
        // The survivor is another node's instance.
        .with_known_instances(Arc::new(StaticInstances(vec![(
            "n2".to_owned(),
            survivor.clone(),
        )])));
    // A terminated (unknown) instance has no attachment: severed, and the survivor's
    // attachment is untouched.
    let c = f
        .fence(&victim("i-0123456789abcdef0"))
        .await
        .expect("fence");
    assert!(c.severed);
    assert!(
        c.evidence.contains("InvalidInstanceID.NotFound"),
        "{}",
        c.evidence
    );
    assert!(
        c.evidence.contains("1 other live attachment"),
        "{}",
        c.evidence
    );
    assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![survivor]);
}

/// A wrong (well-formed) instance id for the victim: EC2 answers
/// `InvalidInstanceID.NotFound`, and the volume is attached to the victim's real
/// instance, which no other node is recorded on. Its absence from the attachment list
/// is no evidence: not severed, and nothing is detached.
#[tokio::test]
async fn a_wrong_instance_id_is_not_severed() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (real, vol) = ebs_peer::attached_volume(&ec2).await;
    let peer = ebs_peer::run_instance(&ec2).await;
    for known in [vec![], vec![("n2".to_owned(), peer.clone())]] {
        let f = fencer(&moto.url(), &vol, PollLimits::default())
            .await
            .with_known_instances(Arc::new(StaticInstances(known)));
        let e = f.sever(&victim("i-0123456789abcdef0")).await.unwrap_err();
        match &e {
            EbsError::UnknownAttachment(u) => assert_eq!(u.others, vec![real.clone()]),
            other => panic!("expected UnknownAttachment, got {other:?}"),
        }
        assert!(e.to_string().contains("may be wrong"), "{e}");
        assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![real.clone()]);
    }
}

/// Damaged answers are never evidence: a `DescribeVolumes` answer without its
/// `attachmentSet`, or cut short, and a `DetachVolume` answered
/// `InvalidInstanceID.NotFound` for an instance that is attached, leave the fence
/// unconfirmed (retried until the deadline, then owed).
#[tokio::test]
async fn damaged_answers_never_confirm() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    for corrupt in [
        Corrupt::DropAttachmentSet,
        Corrupt::Truncate,
        Corrupt::InstanceNotFound,
    ] {
        let (inst, vol) = ebs_peer::attached_volume(&ec2).await;
        let proxy = Proxy::start(moto.addr).await;
        proxy.set_corrupt(corrupt);
        let f = fencer(&proxy.url(), &vol, limits(Duration::from_secs(2))).await;
        let e = f.sever(&victim(&inst)).await.unwrap_err();
        eprintln!("{corrupt:?}: {e}");
        let EbsError::Unconfirmed {
            last_error,
            last_state,
            ..
        } = &e
        else {
            panic!("{corrupt:?}: expected Unconfirmed, got {e:?}");
        };
        if corrupt == Corrupt::InstanceNotFound {
            // Not forwarded: the attachment is intact and DescribeVolumes says so.
            assert_eq!(last_state.as_deref(), Some("attached"), "{e}");
            assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![inst.clone()]);
        } else {
            let last = last_error.as_ref().expect("the malformed answer");
            assert!(
                last.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains("malformed answer"),
                "{corrupt:?}: {e}"
            );
        }
        assert!(proxy.describes() >= 2, "{corrupt:?}: retried");
        // The same fence through an undamaged proxy is confirmed.
        proxy.set_corrupt(Corrupt::Nothing);
        assert!(f.sever(&victim(&inst)).await.expect("undamaged").severed);
    }
}

#[tokio::test]
async fn slow_detach_is_polled_until_describe_shows_it_gone() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (inst, vol) = ebs_peer::attached_volume(&ec2).await;
    let proxy = Proxy::start(moto.addr).await;
    let delay = Duration::from_millis(1500);
    proxy.set_detach_delay(delay);

    let f = fencer(&proxy.url(), &vol, limits(Duration::from_secs(20))).await;
    let t = Instant::now();
    let c = f.fence(&victim(&inst)).await.expect("fence");
    let took = t.elapsed();
    eprintln!(
        "slow detach ({delay:?}) confirmed after {took:?}: {}",
        c.evidence
    );
    assert!(c.severed);
    // "detaching" from DetachVolume did not end the fence: only DescribeVolumes did,
    // after moto had really detached.
    assert!(took >= delay, "{took:?}");
    assert!(c.evidence.contains("answered detaching"), "{}", c.evidence);
    assert_eq!(proxy.detaches(), 1);
    assert_eq!(proxy.forwarded_detaches(), 1);
    assert!(proxy.describes() >= 3, "{} polls", proxy.describes());
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
}

#[tokio::test]
async fn peer_stopped_mid_fence_is_unconfirmed_then_completes() {
    let moto = Moto::start();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (inst, vol) = ebs_peer::attached_volume(&ec2).await;
    let proxy = Proxy::start(moto.addr).await;
    proxy.set_detach_delay(Duration::from_secs(2));

    let deadline = Duration::from_secs(4);
    let f = fencer(&proxy.url(), &vol, limits(deadline)).await;
    let (f2, v) = (f.clone(), victim(&inst));
    let t = Instant::now();
    let run = tokio::spawn(async move { f2.sever(&v).await });
    // Stop the peer once the detach was accepted and a poll saw the attachment.
    while proxy.describes() < 2 {
        assert!(t.elapsed() < deadline, "fence did not poll");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    moto.stop();
    let e = run.await.unwrap().unwrap_err();
    let took = t.elapsed();
    eprintln!("stopped peer: unconfirmed after {took:?}: {e}");
    match &e {
        EbsError::Unconfirmed {
            polls, last_state, ..
        } => {
            assert!(*polls >= 1);
            assert_eq!(last_state.as_deref(), Some("attached"));
        }
        other => panic!("expected Unconfirmed, got {other:?}"),
    }
    assert!(e.is_retryable());
    assert!(
        took >= deadline && took < deadline + Duration::from_secs(2),
        "{took:?}"
    );

    // The peer comes back: the retry (the sweep's) confirms the fence.
    moto.resume();
    proxy.set_detach_delay(Duration::ZERO);
    let c = f
        .sever(&victim(&inst))
        .await
        .expect("retry after the peer is back");
    assert!(c.severed);
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
}

#[derive(Debug)]
struct NoCredentials;

impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::ready(Err(CredentialsError::not_loaded(
            "test: no credentials configured",
        )))
    }
}

#[tokio::test]
async fn missing_credentials_fail_loudly_and_at_once() {
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (inst, vol) = ebs_peer::attached_volume(&ec2).await;
    let proxy = Proxy::start(moto.addr).await;
    let cfg = config(&proxy.url(), &vol, PollLimits::default());
    let sdk = cfg
        .loader()
        .credentials_provider(NoCredentials)
        .load()
        .await;
    let f = EbsFencer::from_sdk_config(&cfg, &sdk, CLAIM_TTL).unwrap();
    let t = Instant::now();
    let e = f.sever(&victim(&inst)).await.unwrap_err();
    match &e {
        EbsError::Denied { source, .. } => assert_eq!(source.kind, Ec2ErrorKind::Denied),
        other => panic!("expected Denied, got {other:?}"),
    }
    assert!(!e.is_retryable());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // Nothing reached the peer, and the attachment is intact.
    assert_eq!(proxy.detaches() + proxy.describes(), 0);
    assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![inst]);
}

/// The peer checks signatures (moto recomputes SigV4 with botocore, an independent
/// implementation): the fencer's signed calls are accepted with the right secret, and a
/// wrong secret is refused as `Denied`, not retried, and detaches nothing.
#[tokio::test]
async fn the_peer_verifies_our_sigv4_signatures() {
    let moto = Moto::start(); // its own: authentication is global to the process
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (key_id, secret) = ec2.iam_user_with_ec2_access("fencer").await;
    let (inst, vol) = ebs_peer::attached_volume(&ec2).await;
    let cfg = config(&moto.url(), &vol, PollLimits::default());
    let signed_with = |secret: &str| {
        let loader = cfg
            .loader()
            .credentials_provider(aws_credential_types::Credentials::new(
                key_id.clone(),
                secret.to_owned(),
                None,
                None,
                "test",
            ));
        async move { loader.load().await }
    };

    ec2.enforce_auth(true).await;
    let bad =
        EbsFencer::from_sdk_config(&cfg, &signed_with("not-the-secret").await, CLAIM_TTL).unwrap();
    let e = bad.sever(&victim(&inst)).await.unwrap_err();
    match &e {
        EbsError::Denied { source, .. } => {
            // EC2 answers a bad signature with AuthFailure (other services say
            // SignatureDoesNotMatch).
            assert!(
                matches!(
                    source.code.as_deref(),
                    Some("AuthFailure" | "SignatureDoesNotMatch")
                ),
                "{e}"
            );
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    let good = EbsFencer::from_sdk_config(&cfg, &signed_with(&secret).await, CLAIM_TTL).unwrap();
    let c = good.fence(&victim(&inst)).await.expect("signed fence");
    assert!(c.severed, "{}", c.evidence);
    ec2.enforce_auth(false).await;
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
}

#[tokio::test]
async fn limits_beyond_the_claim_ttl_are_refused() {
    let cfg = config("http://127.0.0.1:9", "vol-1", limits(CLAIM_TTL));
    let sdk = ebs_peer::sdk_config(&cfg).await;
    let e = EbsFencer::from_sdk_config(&cfg, &sdk, CLAIM_TTL).unwrap_err();
    assert!(matches!(e, EbsError::BadLimits { .. }), "{e:?}");
}

// End to end through the controller: a real etcd (tests/common), an agent whose
// membership value is a moto instance id, and a controller fencing with EBS.

fn ebs_limits_for_tests() -> PollLimits {
    // Below the tests' short claim TTL (3 s), as the fencer requires.
    limits(Duration::from_millis(1500))
}

async fn ebs_controller(
    cluster: &common::Cluster,
    url: &str,
    vol: &str,
) -> (Arc<Controller>, tokio::task::JoinHandle<()>) {
    let cfg = config(url, vol, ebs_limits_for_tests());
    let sdk = ebs_peer::sdk_config(&cfg).await;
    let f = EbsFencer::from_sdk_config(&cfg, &sdk, common::CLAIM_TTL)
        .expect("ebs fencer")
        .with_known_instances(Arc::new(cluster.store().await));
    cluster
        .controller(Arc::new(f), cluster.controller_cfg("n2"))
        .await
}

async fn ebs_agent(cluster: &common::Cluster, n: &str, instance: &str) -> common::RunningAgent {
    let mut cfg = cluster.agent_cfg(n, 1);
    cfg.instance = instance.to_owned();
    // An EBS-only cluster: no reservation device.
    let agent = Agent::start(cluster.store().await, cfg, None, common::key_of(n))
        .await
        .expect("agent start");
    common::RunningAgent::spawn(agent)
}

/// Waits until the controller counts a failed fence attempt, at most 30 s.
async fn wait_failed_attempt(ctl: &Controller) {
    common::wait_until(
        "a failed EBS fence attempt",
        Duration::from_secs(30),
        || {
            let failed = ctl.stats().failed.load(Ordering::Relaxed);
            async move { failed >= 1 }
        },
    )
    .await;
}

/// Agent n1 (recorded with `instance`) and an EBS controller on `url` started, n1
/// SIGKILLed, and the controller's first fence attempt failed: the killed agent and
/// the controller.
async fn n1_killed_and_a_fence_failed(
    cluster: &common::Cluster,
    instance: &str,
    url: &str,
    vol: &str,
) -> (
    common::RunningAgent,
    Arc<Controller>,
    tokio::task::JoinHandle<()>,
) {
    let a1 = ebs_agent(cluster, "n1", instance).await;
    let (ctl, task) = ebs_controller(cluster, url, vol).await;
    a1.kill();
    wait_failed_attempt(&ctl).await;
    (a1, ctl, task)
}

/// Waits until n1's generation is 1 (`what`: who fenced it), at most 30 s.
async fn wait_n1_fenced(what: &str, store: &EtcdStore) {
    common::wait_until(what, Duration::from_secs(30), || {
        let store = store.clone();
        async move { common::generation(&store, "n1").await == 1 }
    })
    .await;
}

/// Whether the `fencer_result` of some record of `audit` contains every fragment of
/// `says`.
fn a_result_says(audit: &[serde_json::Value], says: &[&str]) -> bool {
    audit.iter().any(|r| {
        let r = r["fencer_result"].to_string();
        says.iter().all(|s| r.contains(s))
    })
}

/// Asserts n1's fence is owed, not done: generation 0, and its intent pending with
/// `instance`.
async fn assert_n1_owed(store: &EtcdStore, instance: &str) {
    assert_eq!(common::generation(store, "n1").await, 0);
    let (snap, _) = store.sweep_snapshot().await.unwrap();
    assert_eq!(
        snap.pending.get(&common::node("n1")).map(|p| p.0.as_str()),
        Some(instance)
    );
}

/// A node that died while no controller was watching (all restarting, or the watch
/// lagging) is found by the sweep with its membership, and the instance id in it,
/// already gone: the fence must still know which attachment to detach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_fence_of_a_node_gone_before_any_controller_saw_it_detaches_its_instance() {
    let cluster = common::Cluster::new();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (i1, vol) = ebs_peer::attached_volume(&ec2).await;
    let store = cluster.store().await;
    let a1 = ebs_agent(&cluster, "n1", &i1).await;
    a1.kill();
    store.revoke(a1.lease).await.unwrap();
    assert!(store.status().await.unwrap().members.is_empty());

    // Only now a controller starts: no DELETE event will ever reach it.
    let (ctl, task) = ebs_controller(&cluster, &moto.url(), &vol).await;
    wait_n1_fenced("n1 fenced by the sweep", &store).await;
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
    let audit = store.audit_records(&common::node("n1")).await.unwrap();
    let last = audit.last().expect("an audit record");
    assert_eq!(last["trigger"], "sweep", "{last}");
    assert_eq!(last["instance"], i1.as_str(), "{last}");
    assert_eq!(last["fencer_result"], "confirmed", "{last}");
    assert_eq!(ctl.stats().failed.load(Ordering::Relaxed), 0);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_ebs_fence_bump() {
    let cluster = common::Cluster::new();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (i1, vol) = ebs_peer::attached_volume(&ec2).await;
    let store = cluster.store().await;
    store
        .add_free_arenas(&["arena-0".to_owned(), "arena-1".to_owned()])
        .await
        .unwrap();

    let a1 = ebs_agent(&cluster, "n1", &i1).await;
    assert_eq!(a1.arenas.len(), 1);
    let (ctl, task) = ebs_controller(&cluster, &moto.url(), &vol).await;
    assert_eq!(common::generation(&store, "n1").await, 0);

    let t = Instant::now();
    a1.kill(); // SIGKILL-style: the keepalive stops, the lease expires
    wait_n1_fenced("n1 fenced (generation 1)", &store).await;
    eprintln!(
        "lease expiry -> EBS fence -> bump: {:?} after the kill (TTL {:?})",
        t.elapsed(),
        common::TTL
    );

    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
    let n1 = common::node("n1");
    assert!(store.owned_arenas(&n1).await.unwrap().is_empty());
    assert!(store.free_arenas().await.unwrap().contains(&a1.arenas[0]));
    let audit = store.audit_records(&n1).await.unwrap();
    let last = audit.last().expect("an audit record");
    assert_eq!(last["fencer"], "ebs", "{last}");
    assert_eq!(last["fencer_result"], "confirmed", "{last}");
    assert_eq!(last["instance"], i1.as_str(), "{last}");
    assert!(
        last["signals"]
            .to_string()
            .contains("DescribeVolumes lists no attachment"),
        "{last}"
    );
    assert_eq!(ctl.stats().fenced.load(Ordering::Relaxed), 1);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_down_fence_stays_owed_until_the_sweep_completes_it() {
    let cluster = common::Cluster::new();
    let moto = Moto::start(); // its own: it is stopped
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (i1, vol) = ebs_peer::attached_volume(&ec2).await;
    let store = cluster.store().await;
    store
        .add_free_arenas(&["arena-0".to_owned()])
        .await
        .unwrap();

    let a1 = ebs_agent(&cluster, "n1", &i1).await;
    let (ctl, task) = ebs_controller(&cluster, &moto.url(), &vol).await;
    moto.stop();
    a1.kill();
    wait_failed_attempt(&ctl).await;
    // Not confirmed: no bump, the arena still recorded as n1's, the intent still owed.
    let n1 = common::node("n1");
    assert_n1_owed(&store, &i1).await;
    assert_eq!(store.owned_arenas(&n1).await.unwrap(), a1.arenas);
    let audit = store.audit_records(&n1).await.unwrap();
    assert!(a_result_says(&audit, &["not confirmed"]), "{audit:?}");

    // EC2 answers again: the sweep (every 500 ms in the tests) completes the fence.
    moto.resume();
    wait_n1_fenced("the sweep fences n1", &store).await;
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
    assert!(store.owned_arenas(&n1).await.unwrap().is_empty());
    let (snap, _) = store.sweep_snapshot().await.unwrap();
    assert!(!snap.pending.contains_key(&n1));
    task.abort();
}

/// Through the controller, with real etcd: a `DescribeVolumes` answer without its
/// `attachmentSet` (the detach itself went through) is not a confirmation: no bump, the
/// intent stays owed, the audit records the failed attempt; once the answers are whole
/// again the sweep completes the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_attachment_set_leaves_the_fence_owed() {
    let cluster = common::Cluster::new();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (i1, vol) = ebs_peer::attached_volume(&ec2).await;
    let proxy = Proxy::start(moto.addr).await;
    proxy.set_corrupt(Corrupt::DropAttachmentSet);
    let store = cluster.store().await;
    let (_a1, _ctl, task) = n1_killed_and_a_fence_failed(&cluster, &i1, &proxy.url(), &vol).await;
    let n1 = common::node("n1");
    assert_n1_owed(&store, &i1).await;
    let audit = store.audit_records(&n1).await.unwrap();
    assert!(
        a_result_says(&audit, &["not confirmed", "attachmentSet"]),
        "{audit:?}"
    );
    assert!(
        audit.iter().all(|r| r["fencer_result"] != "confirmed"),
        "{audit:?}"
    );

    proxy.set_corrupt(Corrupt::Nothing);
    wait_n1_fenced("the sweep fences n1", &store).await;
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
    task.abort();
}

/// Through the controller: a node registered with a wrong instance id (an agent started
/// without the daemon's join check, as a node without `--ebs-volume-id` or an older
/// daemon would) is not "fenced" by a detach that EC2 answers
/// `InvalidInstanceID.NotFound`: its real instance stays attached, so the fence stays
/// owed and the audit records why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_registered_with_a_wrong_instance_id_stays_owed() {
    let cluster = common::Cluster::new();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (real, vol) = ebs_peer::attached_volume(&ec2).await;
    let wrong = "i-0123456789abcdef0";
    let store = cluster.store().await;
    let (_a1, _ctl, task) = n1_killed_and_a_fence_failed(&cluster, wrong, &moto.url(), &vol).await;
    let n1 = common::node("n1");
    assert_n1_owed(&store, wrong).await;
    let audit = store.audit_records(&n1).await.unwrap();
    assert!(
        a_result_says(&audit, &["not confirmed", real.as_str()]),
        "{audit:?}"
    );
    assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![real]);
    task.abort();
}

/// A node whose recorded instance id is not an EC2 id cannot be fenced by EBS until an
/// operator acts: the controller tries once (one failed audit record, one error line)
/// and the fence stays owed, but it is not retried every sweep (it used to be: one
/// failed attempt and one more audit record per sweep period, forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_recorded_with_a_non_ec2_instance_id_is_refused_once_not_retried_forever() {
    let cluster = common::Cluster::new();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (real, vol) = ebs_peer::attached_volume(&ec2).await;
    let store = cluster.store().await;
    // Passes the generic instance rule (so it reaches the fencer), not EC2's.
    let (_a1, ctl, task) =
        n1_killed_and_a_fence_failed(&cluster, "host-17", &moto.url(), &vol).await;
    // Ten sweep periods (500 ms each) after the first attempt.
    let sweeps = ctl.stats().sweeps.load(Ordering::Relaxed);
    common::wait_until("ten more sweeps", Duration::from_secs(30), || {
        let now = ctl.stats().sweeps.load(Ordering::Relaxed);
        async move { now >= sweeps + 10 }
    })
    .await;
    let n1 = common::node("n1");
    assert_eq!(ctl.stats().failed.load(Ordering::Relaxed), 1, "retried");
    let audit = store.audit_records(&n1).await.unwrap();
    assert_eq!(audit.len(), 1, "one attempt, one record: {audit:?}");
    assert!(
        audit[0]["fencer_result"]
            .to_string()
            .contains("is not an EC2 instance id"),
        "{audit:?}"
    );
    // Still owed, never bumped, the volume untouched.
    assert_eq!(common::generation(&store, "n1").await, 0);
    let (snap, _) = store.sweep_snapshot().await.unwrap();
    assert!(snap.pending.contains_key(&n1), "no longer owed: {snap:?}");
    assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![real]);
    task.abort();
}

// The `fenced` binary itself: two daemons configured with `--ebs-volume-id` (EBS alone,
// as on gp3: no --block-device), a SIGKILLed one fenced by the other through moto.

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fenced_bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_fenced"))
}

fn ebs_daemon(
    etcd: &common::etcd::Etcd,
    node: &str,
    instance: &str,
    vol: &str,
    url: &str,
    dir: &std::path::Path,
) -> Child {
    let log = std::fs::File::create(dir.join(format!("{node}.log"))).unwrap();
    Child(
        fenced_bin()
            .args([
                "run",
                "--node-id",
                node,
                "--root",
                "/ebs-cli",
                "--instance-id",
                instance,
            ])
            .args(["--etcd-endpoints", &etcd.endpoint()])
            .args(["--ttl-secs", "2", "--sweep-secs", "1"])
            .args([
                "--ebs-volume-id",
                vol,
                "--ebs-region",
                "us-east-1",
                "--ebs-endpoint-url",
                url,
            ])
            // Static test credentials through the standard chain's environment
            // provider; no instance metadata service on a test machine.
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .env("FENCED_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn cli_status(etcd: &common::etcd::Etcd, root: &str) -> serde_json::Value {
    let o = fenced_bin()
        .args(["status", "-o", "json", "--root", root])
        .args(["--etcd-endpoints", &etcd.endpoint()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn cli_generation(s: &serde_json::Value, node: &str) -> Option<u64> {
    s["nodes"][node]["generation"].as_u64()
}

/// Nodes holding membership in a `fenced status -o json` document.
fn cli_members(s: &serde_json::Value) -> usize {
    s["nodes"]
        .as_object()
        .map_or(0, |n| n.values().filter(|r| r["member"] == true).count())
}

// Multi-threaded: the proxy's tasks run while this thread blocks on the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_fence_a_killed_peer_by_ebs_detach() {
    let etcd = common::etcd::Etcd::start();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let i1 = ebs_peer::run_instance(&ec2).await;
    let i2 = ebs_peer::run_instance(&ec2).await;
    let vol = ebs_peer::create_volume(&ec2).await;
    ebs_peer::attach(&ec2, &vol, &i1).await;
    // Each daemon checks at start that the volume is attached to its instance: i2 is a
    // second (Multi-Attach) attachment, which moto lacks and the proxy adds.
    let proxy = Proxy::start(moto.addr).await;
    proxy.add_attachment(&vol, &i2);
    let dir = tempfile::tempdir().unwrap();
    let mut d1 = ebs_daemon(&etcd, "n1", &i1, &vol, &proxy.url(), dir.path());
    let _d2 = ebs_daemon(&etcd, "n2", &i2, &vol, &proxy.url(), dir.path());
    let wait = |what: &str, f: &dyn Fn(&serde_json::Value) -> bool| {
        let t0 = Instant::now();
        loop {
            let s = cli_status(&etcd, "/ebs-cli");
            if f(&s) {
                return s;
            }
            let logs: Vec<String> = ["n1", "n2"]
                .iter()
                .map(|n| {
                    std::fs::read_to_string(dir.path().join(format!("{n}.log"))).unwrap_or_default()
                })
                .collect();
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what}: {s}\n{logs:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait("two members", &|s| cli_members(s) == 2);
    d1.0.kill().unwrap();
    d1.0.wait().unwrap();
    let s = wait("n1 fenced", &|s| cli_generation(s, "n1") == Some(1));
    let owed = s["nodes"].as_object().unwrap().values();
    assert!(owed.filter(|r| !r["owed"].is_null()).count() == 0, "{s}");
    assert!(ebs_peer::attached_to(&ec2, &vol).await.is_empty());
    let log = std::fs::read_to_string(dir.path().join("n2.log")).unwrap();
    assert!(log.contains("DescribeVolumes lists no attachment"), "{log}");
}

/// `fenced run` with the EBS fencer, refused at start with one clear line and nothing
/// written to etcd: an instance the volume is not attached to (an existing instance, an
/// unknown one), an id not in EC2 form (configured, or from IMDS), an `--instance-id`
/// that IMDS contradicts, a plain-http endpoint off this host (flag or
/// `AWS_ENDPOINT_URL`).
// Multi-threaded: the proxy's tasks run while this thread waits for the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_start_is_refused_for_a_wrong_instance_or_a_clear_text_endpoint() {
    let etcd = common::etcd::Etcd::start();
    let moto = Moto::shared();
    let ec2 = ebs_peer::client(&moto.url()).await;
    let (i1, vol) = ebs_peer::attached_volume(&ec2).await;
    let other = ebs_peer::run_instance(&ec2).await;
    let url = moto.url();
    let imds = Proxy::start(moto.addr).await;
    let imds_url = imds.url();
    let run = |case: &Case<'_>| {
        let mut c = fenced_bin();
        c.args(["run", "--node-id", "n1", "--root", "/ebs-join"])
            .args(["--etcd-endpoints", &etcd.endpoint()])
            .args(["--ebs-volume-id", &vol, "--ebs-region", "us-east-1"])
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_ENDPOINT_URL")
            .stdin(std::process::Stdio::null());
        if let Some(i) = case.instance {
            c.args(["--instance-id", i]);
        }
        if let Some(u) = case.url {
            c.args(["--ebs-endpoint-url", u]);
        }
        if let Some(u) = case.env_url {
            c.env("AWS_ENDPOINT_URL", u);
        }
        if case.imds {
            // moto also serves IMDSv2 (token, then meta-data; through the proxy, which
            // completes its token answer); its instance id is `i-fake`, not an EC2 id.
            c.env_remove("AWS_EC2_METADATA_DISABLED")
                .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds_url);
        } else {
            c.env("AWS_EC2_METADATA_DISABLED", "true");
        }
        // Bounded: a daemon that was not refused would run on (and is killed).
        let t = Instant::now();
        let mut child = c
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = child.wait_with_output().unwrap();
        (o, t.elapsed())
    };
    struct Case<'a> {
        what: &'a str,
        instance: Option<&'a str>,
        url: Option<&'a str>,
        env_url: Option<&'a str>,
        imds: bool,
        want: &'a str,
    }
    let case = |what, instance, want| Case {
        what,
        instance,
        url: Some(&url),
        env_url: None,
        imds: false,
        want,
    };
    let not_attached = "is not attached to this instance";
    let cases = [
        case("attached elsewhere", Some(&other), not_attached),
        case(
            "unknown instance",
            Some("i-0123456789abcdef0"),
            not_attached,
        ),
        case("not an EC2 id", Some("i-typo"), "is not an EC2 instance id"),
        Case {
            imds: true,
            ..case(
                "IMDS disagrees with --instance-id",
                Some(&i1),
                "but the instance metadata service says this instance is \"i-fake\"",
            )
        },
        Case {
            imds: true,
            ..case(
                "IMDS answers an id not in EC2 form",
                None,
                "\"i-fake\" (from the instance metadata service) is not an EC2 instance id",
            )
        },
        Case {
            url: Some("http://ec2.us-east-1.amazonaws.com"),
            ..case("http flag off loopback", Some(&i1), "clear text")
        },
        Case {
            url: None,
            env_url: Some("http://10.1.2.3:80"),
            ..case("AWS_ENDPOINT_URL off loopback", Some(&i1), "clear text")
        },
    ];
    for c in &cases {
        let what = c.what;
        let (o, took) = run(c);
        let err = String::from_utf8_lossy(&o.stderr);
        eprintln!("{what}: {:?} in {took:?}: {err}", o.status.code());
        assert!(took < Duration::from_secs(30), "{what}: not refused: {err}");
        assert!(!o.status.success(), "{what}: started");
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("fenced: ")).collect();
        assert_eq!(lines.len(), 1, "{what}: {err}");
        assert!(lines[0].contains(c.want), "{what}: {err}");
        // Nothing was written to etcd: its revision is still the empty store's.
        let s = cli_status(&etcd, "/ebs-join");
        assert_eq!(s["nodes"], serde_json::json!({}), "{what}: {s}");
        assert_eq!(s["revision"], 1, "{what}: {s}");
    }
    // The volume's attachments are untouched.
    assert_eq!(ebs_peer::attached_to(&ec2, &vol).await, vec![i1]);
}
