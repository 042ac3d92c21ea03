//! Fencers: the second, out-of-etcd confirmation that a node can no longer write.
//!
//! A [`Fencer`] performs the `sever` and `verify` steps. It is asynchronous (boxed
//! futures, so `Arc<dyn Fencer>` works) because the EBS fencer polls a cloud API; the
//! NVMe fencer's blocking ioctls run on `spawn_blocking`.
//!
//! - [`nvme`]: [`NvmeFencer`] (preempt, then the report must show the victim's key
//!   gone; before it, [`NamespaceCheck`]: the device must be the recorded shared
//!   namespace). The reservation [`Device`] itself is `crate::device`'s.
//! - [`levels`]: [`FencingLevels`], fencers tried in order until one confirms.
//! - `ebs` (feature `ebs`): the EBS force-detach fencer.
//! - Here: the trait, its error, [`NoneFencer`] (single signal) and
//!   [`AttestedFencer`] (operator attestation).

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use nvme_resv::{AcquireAction, Key};

use crate::core::{FenceStep, Victim};

#[cfg(feature = "ebs")]
pub mod ebs;
pub mod levels;
pub mod nvme;

// What a fencer established: defined in the I/O-free core, which records it.
pub use crate::core::Confirmation;
#[cfg(feature = "failpoints")]
pub use crate::fault::fault_hits;
// The fail-point engine lives in `crate::fault`; these paths stay for its users.
pub use crate::fault::{FaultEffect, FaultHit, FaultInjected};
pub(crate) use crate::fault::{fault, fault_scope};
pub use levels::{FencingLevels, LevelFailure, LevelFailures};
// The device's words under their former paths (see `crate::device`).
pub use crate::device::{
    Device, NamespaceCheck, NamespaceRecord, RESERVATION_TYPE, key_registered, other_ebs_volume,
};
pub use nvme::{NvmeFencer, PreemptMode};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A fence that could not be confirmed. The generation is not bumped.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed: {cause}")]
pub struct FenceError {
    /// The step that failed (`sever` or `verify`).
    pub step: FenceStep,
    /// Why.
    #[source]
    pub cause: FenceCause,
}

impl FenceError {
    /// A failure at `step` described by `message`: for fencers outside this crate,
    /// whose causes [`FenceCause`] cannot list.
    pub fn new(step: FenceStep, message: impl Into<String>) -> Self {
        Self::at(
            step,
            FenceCause::Other {
                message: message.into(),
            },
        )
    }

    /// A failure at `step` for `cause`.
    pub fn at(step: FenceStep, cause: FenceCause) -> Self {
        Self { step, cause }
    }
}

impl From<FaultInjected> for FenceError {
    fn from(f: FaultInjected) -> Self {
        Self::at(f.step, FenceCause::Injected(f))
    }
}

/// Why a fence was not confirmed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceCause {
    /// The victim's key is our own: preempting it would fence ourselves.
    #[error("victim key {:#x} equals our own key: refusing to preempt ourselves", key.0)]
    VictimIsSelf {
        /// The key.
        key: Key,
    },
    /// The device refused or failed the preempt, and the report still lists the key.
    #[error("{racqa:?} of key {:#x} failed: {source}", key.0)]
    Preempt {
        /// The Reservation Acquire action sent.
        racqa: AcquireAction,
        /// The victim's key.
        key: Key,
        /// The device's answer (a Reservation Conflict, an OS error...).
        #[source]
        source: nvme_resv::Error,
    },
    /// The reservation report, read to verify the preempt, failed.
    #[error("reservation report failed: {source}")]
    Report {
        /// The device's answer.
        #[source]
        source: nvme_resv::Error,
    },
    /// The preempt reported success but the report still lists the victim's key (a
    /// device that lies, or a registration that came back).
    #[error(
        "{racqa:?} of key {:#x} reported success but the key is still registered (generation {generation})",
        key.0
    )]
    KeyStillRegistered {
        /// The Reservation Acquire action sent.
        racqa: AcquireAction,
        /// The victim's key.
        key: Key,
        /// The report's generation.
        generation: u32,
    },
    /// The report is no evidence that the victim is cut off although its key may be
    /// gone ([`nvme_resv::report::fence_evidence`]): typically no reservation is held
    /// (with none, every host may write), lost between our acquire and the report.
    #[error("key {:#x} is not cut off: {why}; the fence stays owed (the next attempt acquires the reservation first)", key.0)]
    NotCutOff {
        /// The victim's key.
        key: Key,
        /// Why the report is not evidence.
        why: nvme_resv::report::NotCutOff,
    },
    /// No reservation was held, and acquiring one (we are a registrant) failed: a
    /// preempt without a reservation only unregisters the key, so none was sent.
    #[error(
        "no reservation is held on the shared namespace (with none every host may write, so a preempt cuts nothing) and acquiring {rtype} with our key {:#x} failed: {source}; the fence stays owed",
        key.0
    )]
    AcquireReservation {
        /// Our key.
        key: Key,
        /// The type asked for.
        rtype: nvme_resv::ReservationType,
        /// The device's answer.
        #[source]
        source: nvme_resv::Error,
    },
    /// Our own key is not registered: we were fenced ourselves, so our word on anyone
    /// else's fence is worth nothing.
    #[error("our own key {:#x} is not registered: we are fenced", key.0)]
    ControllerNotRegistered {
        /// Our key.
        key: Key,
    },
    /// Our device is not the namespace the cluster shares: a preempt there would
    /// prove nothing about the victim, so none is sent.
    #[error(
        "our device is not the cluster's shared namespace (recorded: {expected}; ours: {found}): not preempting there; check --block-device (use a /dev/disk/by-id path)"
    )]
    WrongNamespace {
        /// The recorded namespace (boxed: an identity carries serial and model
        /// numbers, and every fence result carries this error's size).
        expected: Box<nvme_resv::NamespaceIdentity>,
        /// Our device's.
        found: Box<nvme_resv::NamespaceIdentity>,
    },
    /// Identifying our device (to check it is the shared namespace) failed.
    #[error("cannot identify our device to check it is the shared namespace: {source}")]
    Identify {
        /// The device's answer.
        #[source]
        source: nvme_resv::Error,
    },
    /// The recorded namespace could not be read.
    #[error("cannot read the recorded shared namespace: {message}")]
    NamespaceRecord {
        /// What failed.
        message: String,
    },
    /// The blocking task that ran a device command panicked or was cancelled.
    #[error("fencer task failed: {source}")]
    Task {
        /// The task's end.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A fail point failed the step (feature `failpoints`).
    #[error(transparent)]
    Injected(#[from] FaultInjected),
    /// A fail point let the step run and lost its answer (feature `failpoints`).
    #[error("fail point fence::{}: {done}, answer lost", step.name())]
    AnswerLost {
        /// The point's step.
        step: FenceStep,
        /// What was performed before the answer was lost.
        done: &'static str,
    },
    /// The EBS fencer did not confirm.
    #[cfg(feature = "ebs")]
    #[error("ebs: {0}")]
    Ebs(#[source] ebs::EbsError),
    /// No fencing level confirmed.
    #[error("no fencing level confirmed: {0}")]
    NoLevelConfirmed(#[source] LevelFailures),
    /// A fencer outside this crate failed ([`FenceError::new`]).
    #[error("{message}")]
    Other {
        /// What failed, and why.
        message: String,
    },
}

impl FenceCause {
    /// Whether only an operator can make a fence of this victim succeed (its record in
    /// etcd, not the device or the cloud, is what is wrong): the controller then tries
    /// once and does not retry every sweep ([`crate::controller::Controller`]).
    pub fn needs_operator(&self) -> bool {
        match self {
            #[cfg(feature = "ebs")]
            Self::Ebs(e) => e.needs_operator(),
            Self::NoLevelConfirmed(levels) => {
                !levels.0.is_empty()
                    && levels.0.iter().all(|l| match l {
                        levels::LevelFailure::Failed { error, .. } => error.cause.needs_operator(),
                        levels::LevelFailure::NotSevered { .. } => false,
                    })
            }
            _ => false,
        }
    }
}

impl From<crate::device::NamespaceMismatch> for FenceCause {
    fn from(why: crate::device::NamespaceMismatch) -> Self {
        match why {
            crate::device::NamespaceMismatch::Wrong { expected, found } => {
                Self::WrongNamespace { expected, found }
            }
            crate::device::NamespaceMismatch::Unreadable { message } => {
                Self::NamespaceRecord { message }
            }
        }
    }
}

/// Something that severs a node's access to the shared device and confirms it.
pub trait Fencer: Send + Sync + fmt::Debug {
    /// `nvme`, `ebs`, `none`.
    fn name(&self) -> &'static str;
    /// Whether this fencer severs device access at all. `false` is single-signal mode
    /// (generations bumped on lease expiry alone, arenas never released): the
    /// controller warns about it when it starts.
    fn severs(&self) -> bool {
        true
    }
    /// Sever `victim`'s access and verify it. `Ok` with `severed: false` means
    /// single-signal mode (nothing severed; arenas are never released).
    fn fence<'a>(&'a self, victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>>;
}

/// Single-signal mode: the generation is bumped on lease expiry alone. It stops a node
/// publishing metadata, not writing bytes, so arenas are never released.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoneFencer;

impl Fencer for NoneFencer {
    fn name(&self) -> &'static str {
        "none"
    }
    fn severs(&self) -> bool {
        false
    }
    fn fence<'a>(&'a self, _victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async {
            Ok(Confirmation {
                fencer: "none".to_owned(),
                severed: false,
                evidence: "single-signal: lease expiry only, device access NOT severed".to_owned(),
            })
        })
    }
}

/// Operator-attested fence (seeds 001/002): a person confirmed out of band that the
/// node is gone and supplies the second confirmation. The reason is recorded verbatim
/// in the audit record. It counts as a severance (arenas are released): the operator
/// vouches for it, and `fenced attest` refuses while the node is a member or its
/// liveness is fresh.
#[derive(Debug, Clone)]
pub struct AttestedFencer {
    /// Who attests.
    pub operator: String,
    /// The out-of-band evidence, verbatim.
    pub reason: String,
}

impl Fencer for AttestedFencer {
    fn name(&self) -> &'static str {
        "operator"
    }
    fn fence<'a>(&'a self, _victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async move {
            Ok(Confirmation {
                fencer: "operator".to_owned(),
                severed: true,
                evidence: format!("attested by {}: {}", self.operator, self.reason),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeId;

    /// `node` with no instance id (the fencer tests of this module and `nvme`).
    pub(super) fn victim(node: &str) -> Victim {
        Victim {
            node: NodeId::new(node).unwrap(),
            instance: String::new(),
        }
    }

    #[tokio::test]
    async fn none_fencer_is_single_signal() {
        let c = NoneFencer.fence(&victim("b")).await.unwrap();
        assert!(!c.severed);
        // The typed property the controller's single-signal warning reads.
        assert!(!NoneFencer.severs());
    }

    #[tokio::test]
    async fn attested_fencer_records_the_reason_verbatim() {
        let f = AttestedFencer {
            operator: "alice".into(),
            reason: "host b powered off at the PDU".into(),
        };
        let c = f.fence(&victim("b")).await.unwrap();
        assert!(c.severed && f.severs());
        assert_eq!(
            c.evidence,
            "attested by alice: host b powered off at the PDU"
        );
    }

    #[test]
    fn errors_name_the_step_and_the_cause() {
        let e = FenceError::at(
            FenceStep::Verify,
            FenceCause::KeyStillRegistered {
                racqa: AcquireAction::Preempt,
                key: Key(0xb),
                generation: 7,
            },
        );
        assert_eq!(
            e.to_string(),
            "verify failed: Preempt of key 0xb reported success but the key is still registered (generation 7)"
        );
        let e = FenceError::new(FenceStep::Sever, "the PDU did not answer");
        assert_eq!(e.to_string(), "sever failed: the PDU did not answer");
        let e = FenceError::from(FaultInjected {
            step: FenceStep::Verify,
        });
        assert_eq!(
            (e.step, e.to_string()),
            (
                FenceStep::Verify,
                "verify failed: fail point fence::verify".into()
            )
        );
    }
}
