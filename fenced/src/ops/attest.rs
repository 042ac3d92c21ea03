//! `fenced attest`: an operator-attested fence. The operator confirmed out of band
//! that the node is gone and supplies the second confirmation. What is refused and
//! when is [`fenced::core::attest::judge`], a pure function of what etcd shows
//! ([`EtcdStore::attest_view`](fenced::store::EtcdStore::attest_view)); this file does
//! the I/O: read, judge, wait out the node's self-fence margin or preempt its key on
//! the shared device, then fence through the controller (claim guarded by the
//! revisions judged, so nothing that changed since is acted on).
//!
//! Exit status: 0 when fenced, and 0 when the node was already fenced since its last
//! membership (the line says "already fenced at generation G"; nothing is written);
//! 1 when refused or not completed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use fenced::NodeId;
use fenced::controller::{Controller, ControllerConfig};
use fenced::core::attest::{AttestRequest, Refusal, Verdict, judge};
use fenced::core::{Confirmation, FenceState, Trigger, Victim};
use fenced::fencer::{
    AttestedFencer, BoxFuture, FenceError, Fencer, NamespaceCheck, NamespaceRecord, NvmeFencer,
    PreemptMode,
};
use fenced::store::{Approval, ClaimGuard};
use nvme_resv::Key;

use super::OpError;
use crate::config::{EtcdArgs, PreemptArg};
use crate::connect::{OpenError, open_device};

#[derive(Debug, clap::Args)]
pub struct AttestArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// The node to fence.
    #[arg(long)]
    node_id: String,
    /// Your out-of-band evidence, recorded verbatim in the audit record.
    #[arg(long)]
    reason: String,
    /// Who attests. Ignored when etcd authenticates this command (--etcd-user, or a
    /// client certificate): the audit record names that identity. Default: $SUDO_USER,
    /// else $USER, else the uid.
    #[arg(long)]
    operator: Option<String>,
    /// Fence even if its liveness is unknown (no record) or its agent's lease is
    /// still alive in etcd (you are certain). Never overrides "unknown node", "still a
    /// member", "being fenced" or "already fenced".
    #[arg(long, alias = "force-ignore-liveness")]
    force: bool,
    /// This host can reach the shared namespace: preempt NODE's reservation key here
    /// and require the report to show it gone before fencing (needs --own-node-id).
    #[arg(long)]
    block_device: Option<PathBuf>,
    /// With --block-device: the node id this host's fenced runs as; its registered key
    /// preempts NODE's.
    #[arg(long, env = "FENCED_NODE_ID")]
    own_node_id: Option<String>,
    /// With --block-device: the Reservation Acquire action.
    #[arg(long, value_enum, default_value = "preempt-and-abort")]
    preempt: PreemptArg,
    /// Distinct operator identities the fence needs: with 2, it waits until a second
    /// operator runs `fenced approve --node-id NODE` (identities as etcd authenticated
    /// them: --etcd-user, else the certificate CN). 1 or 2; default: `approvals` in
    /// the config file, else 1.
    #[arg(long, env = "FENCED_APPROVALS")]
    approvals: Option<u32>,
    /// With --approvals 2: give up after this many seconds without the approval
    /// (1..=86400; default: `approval_timeout_secs` in the config file, else 600).
    #[arg(long, env = "FENCED_APPROVAL_TIMEOUT_SECS")]
    approval_timeout_secs: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// The node whose attested fence you approve.
    #[arg(long)]
    node_id: String,
    /// Your own out-of-band evidence, recorded in the audit record.
    #[arg(long)]
    reason: String,
    /// Who approves. Ignored when etcd authenticates this command (--etcd-user, or a
    /// client certificate). Default: $SUDO_USER, else $USER, else the uid.
    #[arg(long)]
    operator: Option<String>,
}

/// Why an attestation is refused or did not complete.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("--reason must describe your out-of-band evidence")]
    NoReason,
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(
        "--block-device needs --own-node-id (or FENCED_NODE_ID): the node this host runs as, whose registered key preempts"
    )]
    NoOwnNode,
    #[error("refusing to fence {node} from its own host (--own-node-id is the node attested)")]
    OwnNode { node: NodeId },
    #[error(transparent)]
    Device(#[from] OpenError),
    #[error(
        "refusing to preempt from {}: this host's key {:#x} (node {own}) is not registered on it; run attest on a host whose fenced daemon is running with this device",
        path.display(),
        key.0
    )]
    NotRegistered {
        path: PathBuf,
        own: NodeId,
        key: Key,
    },
    #[error(
        "refusing to preempt from {}: it is not the cluster's shared namespace (recorded at <root>/namespace: {expected}; {}: {found}); device names move between boots: name the shared namespace by its /dev/disk/by-id path",
        path.display(),
        path.display()
    )]
    WrongNamespace {
        path: PathBuf,
        expected: Box<nvme_resv::NamespaceIdentity>,
        found: Box<nvme_resv::NamespaceIdentity>,
    },
    #[error(
        "refusing to preempt from {}: no shared namespace is recorded at <root>/namespace (a fenced daemon with --fencer nvme records it at its first join), so nothing says this device is the one the node writes; attest without --block-device, or check --root",
        path.display()
    )]
    NoNamespaceRecord { path: PathBuf },
    #[error("cannot identify {} to check it is the shared namespace: {source}", path.display())]
    Identify {
        path: PathBuf,
        #[source]
        source: nvme_resv::Error,
    },
    #[error("cannot read the recorded shared namespace (<root>/namespace): {message}")]
    NamespaceRecord { message: String },
    #[error("cannot read the reservation report of {}: {source}", path.display())]
    Report {
        path: PathBuf,
        #[source]
        source: nvme_resv::Error,
    },
    #[error("fence of {node} not completed: {what}; the fence stays owed (`fenced status`), retry")]
    NotCompleted { node: NodeId, what: String },
    #[error(
        "no approval of {node}'s fence by a second operator within {secs}s (requested by {by}): nothing fenced; a second operator runs `fenced approve --node-id {node}`"
    )]
    NotApproved { node: NodeId, by: String, secs: u64 },
    #[error(
        "no attested fence of {node} awaits approval{mine}: nothing approved (`fenced attest --approvals 2` requests one)"
    )]
    NothingToApprove { node: NodeId, mine: &'static str },
}

/// The attestation as a [`Fencer`]: when the attesting host has the shared device,
/// the victim's key is preempted and verified gone first; the confirmation records
/// both that device evidence and the operator's words (and the liveness judged).
#[derive(Debug)]
struct Attestation {
    attested: AttestedFencer,
    liveness: String,
    device: Option<NvmeFencer>,
}

impl Fencer for Attestation {
    fn name(&self) -> &'static str {
        if self.device.is_some() {
            "operator+nvme"
        } else {
            "operator"
        }
    }

    fn fence<'a>(&'a self, victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async move {
            let device = match &self.device {
                Some(nvme) => Some(nvme.fence(victim).await?),
                None => None,
            };
            let attested = self.attested.fence(victim).await?;
            let mut evidence = format!("{}; liveness: {}", attested.evidence, self.liveness);
            if let Some(d) = device {
                evidence = format!("{evidence}; {}: {}", d.fencer, d.evidence);
            }
            Ok(Confirmation {
                fencer: self.name().to_owned(),
                severed: true,
                evidence,
            })
        })
    }
}

/// Opens `path`, requires it to be the namespace recorded at `<root>/namespace` (the
/// controller's check: a key absent from another namespace proves nothing) and `own`'s
/// key to be registered there (reads only), so a host that could not preempt, or
/// would preempt on the wrong namespace, is refused before any command that changes
/// the device or etcd. The fencer identifies the device again at the fence.
async fn device_fencer(
    path: PathBuf,
    own: NodeId,
    mode: PreemptMode,
    store: &fenced::store::EtcdStore,
) -> Result<NvmeFencer, AttestError> {
    let recorded = store
        .namespace_record()
        .await
        .map_err(|e| AttestError::NamespaceRecord {
            message: e.to_string(),
        })?;
    let p = path.clone();
    let device = tokio::task::spawn_blocking(move || open_device(&p))
        .await
        .map_err(|e| AttestError::NotCompleted {
            node: own.clone(),
            what: format!("device task failed: {e}"),
        })??;
    let record: Arc<dyn NamespaceRecord> = Arc::new(store.clone());
    checked_fencer(device, path, own, mode, recorded, Some(record)).await
}

/// The checks of [`device_fencer`] on an opened `device`: its identity is `recorded`
/// (refused when none is recorded, or another namespace, naming both identities), and
/// `own`'s key is registered there. The fencer checks the identity again at the fence
/// (against `record` read then, else `recorded`).
async fn checked_fencer(
    device: fenced::fencer::Device,
    path: PathBuf,
    own: NodeId,
    mode: PreemptMode,
    recorded: Option<nvme_resv::NamespaceIdentity>,
    record: Option<Arc<dyn NamespaceRecord>>,
) -> Result<NvmeFencer, AttestError> {
    let Some(expected) = recorded else {
        return Err(AttestError::NoNamespaceRecord { path });
    };
    let key = nvme_resv::key_for_node(own.as_str());
    let d = device.clone();
    let (found, report) = tokio::task::spawn_blocking(move || (d.identity(), d.report()))
        .await
        .map_err(|e| AttestError::NotCompleted {
            node: own.clone(),
            what: format!("device task failed: {e}"),
        })?;
    let found = found.map_err(|source| AttestError::Identify {
        path: path.clone(),
        source,
    })?;
    if !expected.same_namespace(&found) {
        return Err(AttestError::WrongNamespace {
            path,
            expected: Box::new(expected),
            found: Box::new(found),
        });
    }
    let report = report.map_err(|source| AttestError::Report {
        path: path.clone(),
        source,
    })?;
    if !report.is_registered(key) {
        return Err(AttestError::NotRegistered { path, own, key });
    }
    Ok(
        NvmeFencer::new(device, key, mode).with_namespace(NamespaceCheck {
            joined: expected,
            record,
        }),
    )
}

fn now_ms() -> u64 {
    fenced::clock::unix_ms()
}

/// Records our request and waits (polling every 500 ms, at most `limit`) for an
/// approval by another identity written after it; the request is dropped either way.
async fn await_approval(
    store: &fenced::store::EtcdStore,
    node: &NodeId,
    me: &str,
    reason: &str,
    limit: Duration,
) -> Result<Approval, OpError> {
    let asked = now_ms();
    store
        .put_approval(
            node,
            &Approval {
                identity: me.to_owned(),
                reason: reason.to_owned(),
                unix_ms: asked,
            },
        )
        .await
        .map_err(OpError::store("record the approval request"))?;
    eprintln!(
        "fenced: waiting up to {}s for a second operator: `fenced approve --node-id {node} --reason ...`",
        limit.as_secs()
    );
    let t0 = tokio::time::Instant::now();
    let found = loop {
        let all = store
            .approvals(node)
            .await
            .map_err(OpError::store("read the approvals"))?;
        if let Some(a) = all
            .into_iter()
            .find(|a| a.identity != me && a.unix_ms >= asked)
        {
            break Some(a);
        }
        if t0.elapsed() >= limit {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let _ = store.clear_approvals(node).await;
    found.ok_or_else(|| {
        AttestError::NotApproved {
            node: node.clone(),
            by: me.to_owned(),
            secs: limit.as_secs(),
        }
        .into()
    })
}

/// `fenced approve`: the second operator's approval of a pending `--approvals 2`
/// attestation, by a different identity than the one that requested it.
pub async fn approve(args: ApproveArgs) -> Result<ExitCode, OpError> {
    let node = NodeId::new(&args.node_id)?;
    if args.reason.trim().is_empty() {
        return Err(AttestError::NoReason.into());
    }
    let me = super::operator::resolve(&args.etcd, args.operator)?;
    let store = super::connect(&args.etcd).await?;
    let pending = store
        .approvals(&node)
        .await
        .map_err(OpError::store("read the approvals"))?;
    if pending.is_empty() {
        return Err(AttestError::NothingToApprove { node, mine: "" }.into());
    }
    if pending.iter().all(|a| a.identity == me) {
        return Err(AttestError::NothingToApprove {
            node,
            mine: " by another operator (you requested it: a second, distinct operator must approve)",
        }
        .into());
    }
    store
        .put_approval(
            &node,
            &Approval {
                identity: me.clone(),
                reason: args.reason,
                unix_ms: now_ms(),
            },
        )
        .await
        .map_err(OpError::store("record the approval"))?;
    println!("approved the attested fence of {node} as {me}");
    Ok(ExitCode::SUCCESS)
}

pub async fn attest(args: AttestArgs) -> Result<ExitCode, OpError> {
    let node = NodeId::new(&args.node_id)?;
    if args.reason.trim().is_empty() {
        return Err(AttestError::NoReason.into());
    }
    let own = match (&args.block_device, &args.own_node_id) {
        (None, _) => None,
        (Some(_), None) => return Err(AttestError::NoOwnNode.into()),
        (Some(_), Some(o)) => Some(NodeId::new(o)?),
    };
    if own.as_ref() == Some(&node) {
        return Err(AttestError::OwnNode { node }.into());
    }
    let file = crate::config::load_file(args.etcd.config_path().as_deref())?;
    let approval = crate::config::ApprovalSettings::resolve(
        args.approvals,
        args.approval_timeout_secs,
        &file,
    )?;
    let operator = super::operator::resolve(&args.etcd, args.operator)?;
    let store = super::connect(&args.etcd).await?;
    let (view, _) = store
        .attest_view(&node)
        .await
        .map_err(OpError::store("read the node's records"))?;
    let req = AttestRequest {
        force: args.force,
        device_fence: args.block_device.is_some(),
    };
    let (victim, guard, wait, liveness) = match judge(&node, &view, req)
        .map_err(AttestError::from)?
    {
        Verdict::AlreadyFenced { generation, arenas } => {
            println!("{node} already fenced at generation {generation}: nothing done");
            if arenas > 0 {
                eprintln!(
                    "fenced: {node} still owns {arenas} arena(s): its fence was single-signal (no severance confirmed), so they were not released; they stay {node}'s, and it adopts them again when it rejoins (after a reboot of its host, or `fenced unfence --node-id {node}` and a restart)"
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        Verdict::Fence {
            victim,
            guard,
            wait,
            liveness,
        } => (victim, guard, wait, liveness),
    };
    let device = match (args.block_device, own) {
        (Some(path), Some(own)) => {
            let mode = match args.preempt {
                PreemptArg::Preempt => PreemptMode::Preempt,
                PreemptArg::PreemptAndAbort => PreemptMode::PreemptAndAbort,
            };
            Some(device_fencer(path, own, mode, &store).await?)
        }
        _ => None,
    };
    let (operator, reason) = if approval.approvals == 2 {
        let approver =
            await_approval(&store, &node, &operator, &args.reason, approval.timeout).await?;
        (
            format!("{operator}+{}", approver.identity),
            format!(
                "{} (approved by {}: {})",
                args.reason, approver.identity, approver.reason
            ),
        )
    } else {
        (operator, args.reason)
    };
    if !wait.is_zero() {
        eprintln!(
            "fenced: {node}'s lease is gone from etcd; waiting {:.1}s (its self-fence margin minus its lease TTL) so its agent has stopped writing",
            wait.as_secs_f32()
        );
        tokio::time::sleep(wait).await;
    }
    let fencer = Arc::new(Attestation {
        attested: AttestedFencer {
            operator: operator.clone(),
            reason,
        },
        liveness,
        device,
    });
    let controller = Controller::new(
        store,
        fencer,
        ControllerConfig::new(format!("attest/{operator}")),
    );
    // Guarded by the revisions judged: a fence, an intent, a departure or a join since
    // the read refuses the claim instead of bumping a second time.
    let state = controller
        .fence(victim, Trigger::Operator, ClaimGuard::Sweep(guard))
        .await;
    match state {
        FenceState::Fenced { generation } => {
            println!("fenced {node}: generation now {generation} (attested by {operator})");
            Ok(ExitCode::SUCCESS)
        }
        FenceState::Skipped { why } => Err(AttestError::NotCompleted {
            node,
            what: format!("its records changed since they were read ({why})"),
        }
        .into()),
        FenceState::Failed { step, error } => Err(AttestError::NotCompleted {
            node,
            what: format!("{step} failed: {error}"),
        }
        .into()),
        state => Err(AttestError::NotCompleted {
            node,
            what: format!("{state:?}"),
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use nvme_resv::model::Namespace;
    use nvme_resv::{HostId, Register, RegisterAction, Reservations};

    use super::*;

    fn host(ns: &Namespace, node: &str) -> nvme_resv::model::Host {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&nvme_resv::key_for_node(node).0.to_be_bytes());
        let h = ns.host(HostId(id));
        h.register(&Register {
            rrega: RegisterAction::Register,
            crkey: Key(0),
            nrkey: nvme_resv::key_for_node(node),
            iekey: false,
            cptpl: nvme_resv::Cptpl::NoChange,
        })
        .unwrap();
        h
    }

    fn attestation(device: Option<NvmeFencer>) -> Attestation {
        Attestation {
            attested: AttestedFencer {
                operator: "alice".into(),
                reason: "n2 powered off at the PDU".into(),
            },
            liveness: "lease 0x1 gone from etcd".into(),
            device,
        }
    }

    fn n2() -> Victim {
        Victim {
            node: NodeId::new("n2").unwrap(),
            instance: String::new(),
        }
    }

    #[tokio::test]
    async fn with_the_device_the_key_is_preempted_first_and_both_are_recorded() {
        let ns = Namespace::new();
        let h1 = host(&ns, "n1");
        host(&ns, "n2");
        let nvme = NvmeFencer::new(
            Arc::new(h1),
            nvme_resv::key_for_node("n1"),
            PreemptMode::default(),
        );
        let a = attestation(Some(nvme));
        assert_eq!(a.name(), "operator+nvme");
        let c = a.fence(&n2()).await.unwrap();
        assert!(!ns.snapshot().is_registered(nvme_resv::key_for_node("n2")));
        assert!(c.severed);
        assert!(
            c.evidence
                .starts_with("attested by alice: n2 powered off at the PDU; liveness: lease 0x1"),
            "{}",
            c.evidence
        );
        assert!(
            c.evidence.contains("; nvme: key ") && c.evidence.contains("absent from report"),
            "{}",
            c.evidence
        );
    }

    #[tokio::test]
    async fn a_preempt_that_fails_fails_the_attestation() {
        let ns = Namespace::new();
        // n1 is not registered: its preempt is a Reservation Conflict.
        let h1 = ns.host(HostId([1; 16]));
        host(&ns, "n2");
        let nvme = NvmeFencer::new(
            Arc::new(h1),
            nvme_resv::key_for_node("n1"),
            PreemptMode::default(),
        );
        let e = attestation(Some(nvme)).fence(&n2()).await.unwrap_err();
        assert!(e.to_string().starts_with("sever failed"), "{e}");
        assert!(ns.snapshot().is_registered(nvme_resv::key_for_node("n2")));
    }

    fn identity(b: u8) -> nvme_resv::NamespaceIdentity {
        nvme_resv::NamespaceIdentity {
            nguid: [b; 16],
            eui64: [0; 8],
            subnqn: "nqn.test:s".into(),
            ..Default::default()
        }
    }

    /// Issue 26, hole 2: `--block-device` naming another namespace (device names move
    /// between boots) is refused before anything is sent, naming both identities; so
    /// is a cluster with no recorded namespace. The recorded one is accepted.
    #[tokio::test]
    async fn attest_refuses_a_device_that_is_not_the_recorded_namespace() {
        let other = Namespace::new();
        other.set_identity(identity(2));
        let h1 = host(&other, "n1");
        // The victim is not registered on this other namespace: without the check its
        // key's absence here would be "confirmed".
        let path = PathBuf::from("/dev/nvme9n2");
        let n1 = NodeId::new("n1").unwrap();
        let e = checked_fencer(
            Arc::new(h1.clone()),
            path.clone(),
            n1.clone(),
            PreemptMode::default(),
            Some(identity(1)),
            None,
        )
        .await
        .unwrap_err();
        let AttestError::WrongNamespace {
            expected, found, ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!((&**expected, &**found), (&identity(1), &identity(2)));
        let msg = e.to_string();
        assert!(
            msg.contains(&identity(1).to_string()) && msg.contains(&identity(2).to_string()),
            "{msg}"
        );
        assert_eq!(
            other.snapshot().generation,
            1,
            "a command changed the device"
        );
        let e = checked_fencer(
            Arc::new(h1),
            path.clone(),
            n1.clone(),
            PreemptMode::default(),
            None,
            None,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, AttestError::NoNamespaceRecord { .. }), "{e:?}");
        // The recorded namespace: accepted, and the fence goes through.
        let shared = Namespace::new();
        shared.set_identity(identity(1));
        let h1 = host(&shared, "n1");
        host(&shared, "n2");
        let f = checked_fencer(
            Arc::new(h1),
            path,
            n1,
            PreemptMode::default(),
            Some(identity(1)),
            None,
        )
        .await
        .unwrap();
        assert!(f.fence(&n2()).await.unwrap().severed);
        assert!(
            !shared
                .snapshot()
                .is_registered(nvme_resv::key_for_node("n2"))
        );
    }

    #[tokio::test]
    async fn without_the_device_the_operator_and_the_liveness_are_recorded() {
        let a = attestation(None);
        assert_eq!(a.name(), "operator");
        let c = a.fence(&n2()).await.unwrap();
        assert_eq!(
            c.evidence,
            "attested by alice: n2 powered off at the PDU; liveness: lease 0x1 gone from etcd"
        );
    }
}
