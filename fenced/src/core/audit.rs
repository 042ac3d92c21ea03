//! The audit record: what one fence attempt or one unfence leaves under
//! `audit/<node>/…`, one type written and read back.

use serde::{Deserialize, Serialize};

use super::FenceStep;
#[cfg(doc)]
use super::{FenceRun, Trigger};

/// An audit record (stored as JSON under `audit/<node>/…`, and logged): one type for
/// every record, written by the controller's [`FenceRun`] (a fence or a failed
/// attempt) and by `fenced unfence` (`action` [`AuditRecord::UNFENCE`]), and read back by
/// `fenced audit` and `fenced status` (`store::decode_audit`). Read back, every field
/// is optional, so a record an older version wrote still decodes; the names of the
/// trigger and the steps are kept as words, so one from a newer version does too.
/// The fields of the other kind are empty and not written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AuditRecord {
    /// `unfence` for an operator's unfence; not written for a fence.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// The fenced (or unfenced) node.
    pub node: String,
    /// Its instance id.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub instance: String,
    /// The controller that fenced it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fenced_by: String,
    /// What started the fence: a [`Trigger`]'s name (`watch`, `sweep`, `operator`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub trigger: String,
    /// The signals seen (membership expiry, departure marker ignored, device evidence).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub signals: Vec<String>,
    /// The fencer and its result.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fencer: String,
    /// `confirmed`, `single_signal` or `failed: …`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fencer_result: String,
    /// Generation before the fence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_before: Option<u64>,
    /// Generation after (equal to before when the fence failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_after: Option<u64>,
    /// Arenas returned to the free pool (not written when none was).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub arenas_released: Vec<String>,
    /// Milliseconds per step group: claim transaction, sever+verify.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_ms: Option<u64>,
    /// Milliseconds spent in the Fencer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sever_ms: Option<u64>,
    /// Milliseconds from the start of the run to the finishing transaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<u64>,
    /// Wall-clock time of the decision (Unix milliseconds), supplied by the driver.
    pub unix_ms: u64,
    /// The steps performed, in order: [`FenceStep`] names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<String>,
    /// An unfence: the node's generation it was unfenced at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// An unfence: the generation the node had joined with before its fence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub joined_generation: Option<u64>,
    /// An unfence: the boot id the node's next start may join with.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// An unfence: the operator's reason, verbatim.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// An unfence: who gave it (see `fenced unfence`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// An unfence: the uid of the process that wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// An unfence: the host the operator ran it on.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host: String,
}

impl AuditRecord {
    /// The `action` of an operator's unfence.
    pub const UNFENCE: &'static str = "unfence";

    /// Whether the record lists `step` among the steps performed.
    pub fn has_step(&self, step: FenceStep) -> bool {
        self.steps.iter().any(|s| s == step.name())
    }

    /// The record as the one-line JSON stored under `audit/` and logged.
    pub fn to_json(&self) -> String {
        // Strings, numbers and lists of strings only: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}
