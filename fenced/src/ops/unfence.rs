//! `fenced unfence`: the operator's explicit, audited permission for a node fenced
//! since its last join to register again from the same boot of its host (the restart
//! rule, `fenced::agent::boot`). It rewrites the node's boot record to its current
//! generation and writes an audit record with the reason verbatim and who gave it, in
//! one transaction. Refused while the node is a member, and for a node that never
//! joined.

use std::process::ExitCode;

use fenced::NodeId;
use fenced::core::AuditRecord;
use fenced::store::{BootRecord, RestartState};

use super::OpError;
use crate::config::EtcdArgs;

#[derive(Debug, clap::Args)]
pub struct UnfenceArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// The fenced node whose next start may register again.
    #[arg(long)]
    node_id: String,
    /// Why it is safe (e.g. "app on host3 stopped and checked"), recorded verbatim.
    #[arg(long)]
    reason: String,
    /// Who unfences. Ignored when etcd authenticates this command (--etcd-user, or a
    /// client certificate): the audit record names that identity. Default: $SUDO_USER,
    /// else $USER, else the uid.
    #[arg(long)]
    operator: Option<String>,
}

/// Why `fenced unfence` refused.
#[derive(Debug, thiserror::Error)]
pub enum UnfenceError {
    #[error("--reason must say why the node may write again (e.g. what you stopped or checked)")]
    NoReason,
    #[error("refusing to unfence {node}: no such node (it never joined: no generation recorded)")]
    UnknownNode { node: NodeId },
    #[error(
        "refusing to unfence {node}: it is a member (membership key present); it was not refused, or another host uses its id"
    )]
    StillMember { node: NodeId },
    #[error(
        "{node}'s records kept changing while unfencing (a join or a fence in progress): try again"
    )]
    Changed { node: NodeId },
}

/// What `fenced unfence` decides from what it read, pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Rewrite the boot record to this one.
    Unfence(BootRecord),
    /// The node's next start is not refused anyway.
    Nothing(String),
}

/// The unfence rule: refused for an unknown node or a member; nothing to do when the
/// node has no boot record or was not fenced since its last join.
pub fn decide(node: &NodeId, seen: &RestartState) -> Result<Decision, UnfenceError> {
    if seen.generation_rev == 0 {
        return Err(UnfenceError::UnknownNode { node: node.clone() });
    }
    if seen.member {
        return Err(UnfenceError::StillMember { node: node.clone() });
    }
    match &seen.boot {
        None => Ok(Decision::Nothing(format!(
            "{node} has no boot record (it never joined with one): its next start is not refused"
        ))),
        Some(b) if b.generation >= seen.generation => Ok(Decision::Nothing(format!(
            "{node} was not fenced since its last {} (generation {}): its next start is not refused",
            b.by, b.generation
        ))),
        Some(b) => Ok(Decision::Unfence(BootRecord {
            boot_id: b.boot_id.clone(),
            generation: seen.generation,
            by: BootRecord::BY_UNFENCE.to_owned(),
        })),
    }
}

/// The (effective) uid of this process: the owner of `/proc/self`.
pub async fn unfence(args: UnfenceArgs) -> Result<ExitCode, OpError> {
    let node = NodeId::new(&args.node_id)?;
    if args.reason.trim().is_empty() {
        return Err(UnfenceError::NoReason.into());
    }
    let operator = super::operator::resolve(&args.etcd, args.operator)?;
    let store = super::connect(&args.etcd).await?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    for _ in 0..3 {
        let seen = store
            .restart_state(&node)
            .await
            .map_err(OpError::store("read the node's records"))?;
        let record = match decide(&node, &seen)? {
            Decision::Nothing(why) => {
                println!("{why}");
                return Ok(ExitCode::SUCCESS);
            }
            Decision::Unfence(r) => r,
        };
        let unix_ms = fenced::clock::unix_ms();
        let fenced_from = seen.boot.as_ref().map_or(0, |b| b.generation);
        let audit = AuditRecord {
            action: AuditRecord::UNFENCE.to_owned(),
            node: node.to_string(),
            generation: Some(seen.generation),
            joined_generation: Some(fenced_from),
            boot_id: record.boot_id.clone(),
            reason: args.reason.clone(),
            operator: operator.clone(),
            uid: super::operator::uid(),
            host: host.clone(),
            unix_ms,
            ..AuditRecord::default()
        };
        if store
            .unfence(&node, &seen, &record, unix_ms, audit.to_json())
            .await
            .map_err(OpError::store("write the unfence"))?
        {
            tracing::warn!(node = %node, generation = seen.generation, operator = %operator, reason = %args.reason, "unfenced by the operator");
            println!(
                "unfenced {node} at generation {} (fenced since generation {fenced_from}) by {operator}: its next start may register its key again",
                seen.generation
            );
            return Ok(ExitCode::SUCCESS);
        }
    }
    Err(UnfenceError::Changed { node }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(boot: Option<u64>, generation: u64, generation_rev: i64, member: bool) -> RestartState {
        RestartState {
            boot: boot.map(|g| BootRecord {
                boot_id: "b1".into(),
                generation: g,
                by: BootRecord::BY_JOIN.into(),
            }),
            boot_rev: 3,
            generation,
            generation_rev,
            member,
            revision: 9,
        }
    }

    #[test]
    fn refuses_unknown_nodes_and_members_and_rewrites_a_fenced_nodes_record() {
        let n = NodeId::new("n3").unwrap();
        let e = decide(&n, &seen(None, 0, 0, false)).unwrap_err();
        assert!(e.to_string().contains("no such node"), "{e}");
        let e = decide(&n, &seen(Some(0), 1, 5, true)).unwrap_err();
        assert!(e.to_string().contains("it is a member"), "{e}");
        assert_eq!(
            decide(&n, &seen(Some(0), 2, 5, false)).unwrap(),
            Decision::Unfence(BootRecord {
                boot_id: "b1".into(),
                generation: 2,
                by: "unfence".into()
            })
        );
        assert!(matches!(
            decide(&n, &seen(Some(2), 2, 5, false)).unwrap(),
            Decision::Nothing(_)
        ));
        assert!(matches!(
            decide(&n, &seen(None, 2, 5, false)).unwrap(),
            Decision::Nothing(_)
        ));
    }
}
