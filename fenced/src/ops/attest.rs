//! `fenced attest`: an operator-attested fence. The operator confirmed out of band
//! that the node is gone and supplies the second confirmation; [`check`] refuses
//! while the node is a member or renewed its liveness recently.

use std::process::ExitCode;
use std::sync::Arc;

use fenced::NodeId;
use fenced::controller::{Controller, ControllerConfig};
use fenced::core::{FenceState, Trigger, Victim};
use fenced::fencer::AttestedFencer;
use fenced::store::ClaimGuard;

use super::OpError;
use crate::config::EtcdArgs;

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
    /// Who attests (default $USER).
    #[arg(long, env = "USER", default_value = "operator")]
    operator: String,
    /// Refuse when the node renewed its liveness less than this many seconds ago.
    #[arg(long, default_value = "30")]
    fresh_secs: u64,
    /// Fence even if its liveness is fresh (you are certain).
    #[arg(long)]
    force_ignore_liveness: bool,
}

/// Why an attestation is refused (by [`check`]) or did not complete.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("--reason must describe your out-of-band evidence")]
    NoReason,
    #[error("refusing to fence {node}: it is still a member (membership key present)")]
    StillMember { node: NodeId },
    #[error(
        "refusing to fence {node}: it renewed its liveness {age_s}s ago (< {fresh_s}s); use --force-ignore-liveness if you are certain"
    )]
    LivenessFresh {
        node: NodeId,
        age_s: u64,
        fresh_s: u64,
    },
    #[error("fence of {node} not completed: {state:?}")]
    NotCompleted { node: NodeId, state: FenceState },
}

/// What the store says about the node an operator attests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// Its membership key is present.
    pub member: bool,
    /// Its last liveness renewal (Unix ms), if any was ever recorded.
    pub liveness_ms: Option<u64>,
}

/// The attest rule, pure: refused while `node` is a member (even with `force`), or
/// when it renewed its liveness less than `fresh_secs` before `now_ms` (unless
/// `force`). A liveness stamp in the future counts as age 0.
pub fn check(
    node: &NodeId,
    seen: Observed,
    now_ms: u64,
    fresh_secs: u64,
    force: bool,
) -> Result<(), AttestError> {
    if seen.member {
        return Err(AttestError::StillMember { node: node.clone() });
    }
    if let Some(ms) = seen.liveness_ms {
        let age_s = now_ms.saturating_sub(ms) / 1000;
        if age_s < fresh_secs && !force {
            return Err(AttestError::LivenessFresh {
                node: node.clone(),
                age_s,
                fresh_s: fresh_secs,
            });
        }
    }
    Ok(())
}

pub async fn attest(args: AttestArgs) -> Result<ExitCode, OpError> {
    let node = NodeId::new(&args.node_id)?;
    if args.reason.trim().is_empty() {
        return Err(AttestError::NoReason.into());
    }
    let store = super::connect(&args.etcd).await?;
    let (liveness_ms, member) = store
        .liveness(&node)
        .await
        .map_err(OpError::store("read the node's liveness"))?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
    check(
        &node,
        Observed {
            member,
            liveness_ms,
        },
        now_ms,
        args.fresh_secs,
        args.force_ignore_liveness,
    )?;
    let instance = store
        .intent_instance(&node)
        .await
        .map_err(OpError::store("read the node's instance"))?;
    // Read back from etcd: an id outside the rule is recorded as unknown.
    let instance = if fenced::instance::check_instance_id(&instance).is_ok() {
        instance
    } else {
        String::new()
    };
    let operator = args.operator;
    let fencer = Arc::new(AttestedFencer {
        operator: operator.clone(),
        reason: args.reason,
    });
    let controller = Controller::new(
        store,
        fencer,
        ControllerConfig::new(format!("attest/{operator}")),
    );
    let state = controller
        .fence(
            Victim {
                node: node.clone(),
                instance,
            },
            Trigger::Operator,
            // An attestation is its own trigger: there is no DELETE to anchor the
            // fence-mark guard to, and the operator asked for this fence explicitly.
            ClaimGuard::IgnoreDeparture {
                deleted_rev: i64::MAX,
            },
        )
        .await;
    match state {
        FenceState::Fenced { generation } => {
            println!("fenced {node}: generation now {generation} (attested by {operator})");
            Ok(ExitCode::SUCCESS)
        }
        state => Err(AttestError::NotCompleted { node, state }.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn n1() -> NodeId {
        NodeId::new("n1").unwrap()
    }

    fn gone(liveness_ms: Option<u64>) -> Observed {
        Observed {
            member: false,
            liveness_ms,
        }
    }

    #[test]
    fn a_member_is_refused_even_with_force() {
        let seen = Observed {
            member: true,
            liveness_ms: Some(NOW - 3_600_000),
        };
        for force in [false, true] {
            let e = check(&n1(), seen, NOW, 30, force).unwrap_err();
            assert!(matches!(e, AttestError::StillMember { .. }), "{e}");
            assert!(e.to_string().contains("still a member"), "{e}");
        }
    }

    #[test]
    fn fresh_liveness_is_refused_unless_forced() {
        let e = check(&n1(), gone(Some(NOW - 29_999)), NOW, 30, false).unwrap_err();
        assert!(
            matches!(
                e,
                AttestError::LivenessFresh {
                    age_s: 29,
                    fresh_s: 30,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("renewed its liveness 29s ago"),
            "{e}"
        );
        check(&n1(), gone(Some(NOW - 29_999)), NOW, 30, true).unwrap();
    }

    #[test]
    fn stale_or_absent_liveness_is_accepted() {
        check(&n1(), gone(Some(NOW - 30_000)), NOW, 30, false).unwrap();
        check(&n1(), gone(None), NOW, 30, false).unwrap();
    }

    #[test]
    fn a_stamp_from_the_future_counts_as_fresh() {
        let e = check(&n1(), gone(Some(NOW + 5_000)), NOW, 30, false).unwrap_err();
        assert!(
            matches!(e, AttestError::LivenessFresh { age_s: 0, .. }),
            "{e}"
        );
    }
}
