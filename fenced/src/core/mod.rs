//! The decision core: no I/O, no clock. Events in, actions out; time is an argument.
//!
//! The controller's fence of one node is a [`FenceRun`]: the driver (see
//! `controller.rs`) performs each [`FenceAction`] against etcd or a Fencer and feeds
//! the outcome back. Which nodes a sweep owes a fence is [`plan_sweep`]; whether a
//! departure marker is honoured is [`honour_departure`]; how a refused claim ranks its
//! reasons is [`claim_outcome`]; the agent's self-fencing
//! clock is [`Watchdog`] (fed by [`lease_reading`]); whether a stalled controller may
//! still sever is [`check_claim_age`]; the agent's device checks are [`check_device`].
//! What `fenced attest` refuses, and when it fences, is [`attest::judge`]. Which
//! controller claims a death first and which sweeps the period is [`fence_duty`] and
//! [`SweepClock`], over the [`Roster`] of live controllers. The controller's small
//! rules (its own node, a refused instance id, claim retries, fences waiting for an
//! operator) are [`is_own_node`], [`instance_or_unknown`], [`retry_claim`] and
//! [`OperatorWaits`]. After the target lost its reservation state (invariant 9), whether
//! a missing key was preempted or lost is [`missing_key`], and whether the agent may
//! register again is [`recover`] and [`after_register`].

use std::fmt;

use serde::Serialize;

use crate::node::NodeId;

/// One named step of the fence protocol. Several steps share one etcd transaction,
/// but each keeps its name in logs, in the audit record and as a fail point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceStep {
    /// Write `fence_pending/<node>` (durable intent).
    RecordIntent,
    /// Create-only, lease-bound `fence_claim/<node>`.
    Claim,
    /// Sweep path only: the snapshot the sweep decided from is still current.
    RecheckIntent,
    /// Read `gen/<node>` (start of the CAS).
    ReadGeneration,
    /// The Fencer severs the victim's device access.
    Sever,
    /// The Fencer confirms the severance (re-read report: victim key gone).
    Verify,
    /// CAS `gen/<node>` to generation + 1.
    Bump,
    /// Write `fence_done/<node>`.
    MarkDone,
    /// Delete `fence_pending/<node>`.
    ClearIntent,
    /// Return the victim's arenas to the free pool (only when a Fencer confirmed).
    ReleaseArenas,
    /// Delete `fence_claim/<node>`.
    ReleaseClaim,
}

impl FenceStep {
    /// The step's name (shared with the stateright model).
    pub fn name(self) -> &'static str {
        match self {
            Self::RecordIntent => "record_intent",
            Self::Claim => "claim",
            Self::RecheckIntent => "recheck_intent",
            Self::ReadGeneration => "read_generation",
            Self::Sever => "sever",
            Self::Verify => "verify",
            Self::Bump => "bump",
            Self::MarkDone => "mark_done",
            Self::ClearIntent => "clear_intent",
            Self::ReleaseArenas => "release_arenas",
            Self::ReleaseClaim => "release_claim",
        }
    }

    /// The steps the claim transaction performs for `trigger`.
    pub fn claim_txn(trigger: Trigger) -> &'static [FenceStep] {
        match trigger {
            Trigger::Watch => &[Self::RecordIntent, Self::Claim, Self::ReadGeneration],
            // `fenced attest` guards its claim like the sweep: on the revisions it judged.
            Trigger::Sweep | Trigger::Operator => &[
                Self::RecordIntent,
                Self::Claim,
                Self::RecheckIntent,
                Self::ReadGeneration,
            ],
        }
    }

    /// The steps the finishing transaction performs.
    pub fn finish_txn(release_arenas: bool) -> &'static [FenceStep] {
        if release_arenas {
            &[
                Self::Bump,
                Self::MarkDone,
                Self::ClearIntent,
                Self::ReleaseArenas,
                Self::ReleaseClaim,
            ]
        } else {
            &[
                Self::Bump,
                Self::MarkDone,
                Self::ClearIntent,
                Self::ReleaseClaim,
            ]
        }
    }
}

impl fmt::Display for FenceStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What started a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A DELETE of `membership/<node>` seen on the watch.
    Watch,
    /// The reconciliation sweep found the fence owed.
    Sweep,
    /// An operator attested out of band that the node is gone (`fenced attest`).
    Operator,
}

impl Trigger {
    /// The trigger's name, as the audit record writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Watch => "watch",
            Self::Sweep => "sweep",
            Self::Operator => "operator",
        }
    }
}

/// The node being fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// Its node id.
    pub node: NodeId,
    /// Its instance id (empty when never known, e.g. a sweep of a node known only by `gen/`).
    pub instance: String,
}

/// What a Fencer established.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confirmation {
    /// The fencer's name (`nvme`, `ebs`, `none`).
    pub fencer: String,
    /// True when device access was severed and the severance verified; false for
    /// single-signal mode (no second confirmation: arenas are never released).
    pub severed: bool,
    /// Human-readable evidence (e.g. "key 0x… absent from report, generation 7").
    pub evidence: String,
}

mod agent;
pub mod attest;
mod audit;
mod claim;
mod controller;
mod duty;
mod fence;
mod lost_state;
mod sweep;
#[cfg(test)]
mod tests;

pub use agent::*;
pub use audit::*;
pub use claim::*;
pub use controller::*;
pub use duty::*;
pub use fence::*;
pub use lost_state::*;
pub use sweep::*;
