//! What the views read back: the rows of `fenced status`, the audit records of
//! `fenced audit`, and the decoders of the JSON records (liveness, audit) behind them.
//! [`super::view`] builds them from its one read of the key space.

use std::collections::BTreeMap;

use crate::core::AuditRecord;
use crate::core::attest::LivenessRecord;
use crate::keys::{self, AuditKind, Malformed};

/// A record under the root that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MalformedRecord {
    /// The key, escaped (one line).
    pub key: String,
    /// Why it does not decode.
    pub why: String,
    /// What the sweep and the views do with it.
    pub effect: &'static str,
    /// The key's mod revision: a rewrite of the key is a new report.
    #[serde(skip)]
    pub mod_revision: i64,
}

/// A status view for `fenced status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Status {
    /// Live members and their instance ids.
    pub members: Vec<(String, String)>,
    /// Generations.
    pub generations: Vec<(String, u64)>,
    /// Owed fences (intents) and their instance ids.
    pub owed: Vec<(String, String)>,
    /// Fence marks.
    pub done: Vec<(String, u64)>,
    /// Claims held and their holders.
    pub claims: Vec<(String, String)>,
    /// Departure markers.
    pub departed: Vec<String>,
    /// Arena owners.
    pub arenas: Vec<(String, String)>,
    /// Free arenas.
    pub free_arenas: Vec<String>,
    /// Number of audit records.
    pub audit_records: usize,
    /// Records that do not decode, with what is done about them.
    pub malformed: Vec<MalformedRecord>,
    /// The revision the read saw.
    pub revision: i64,
    /// One row per node any record names.
    pub nodes: BTreeMap<String, NodeRow>,
}

/// One node as `fenced status` shows it: everything the records say about it, from
/// the one read (stable JSON format: fenced/README.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeRow {
    /// Holds membership (a live lease).
    pub member: bool,
    /// Its instance id: the membership's, else the one recorded at its last join.
    pub instance: Option<String>,
    /// Unix ms of the agent's last recorded lease renewal (`liveness/<node>`, the
    /// agent's clock): known only from a record of an older version, which stamped
    /// it at every renewal (`liveness_refresh_ms` 0); `None` otherwise, as today's
    /// agents record no renewal (their stamp is [`NodeRow::liveness_stamp_unix_ms`]).
    pub last_renewal_unix_ms: Option<u64>,
    /// Unix ms of the agent's last liveness stamp (`liveness/<node>`, the agent's
    /// clock): when it last proved itself alive in a record. Written when the agent
    /// starts and refreshed every [`NodeRow::liveness_refresh_ms`]. A member's lease
    /// was renewed within `lease_ttl_ms` whatever this says: etcd holds it.
    pub liveness_stamp_unix_ms: Option<u64>,
    /// The TTL of the lease it renews (ms), from the same record.
    pub lease_ttl_ms: Option<u64>,
    /// How often the agent refreshes that stamp (ms), from the same record: a node
    /// that stopped did so at most this long after its stamp. 0: a record of an older
    /// version, stamped at every renewal.
    pub liveness_refresh_ms: Option<u64>,
    /// `gen/<node>` (`None`: absent or malformed, see `malformed`).
    pub generation: Option<u64>,
    /// A fence is owed: what the sweep would do now.
    pub owed: Option<Owed>,
    /// The controller holding a fence claim on it.
    pub claim_holder: Option<String>,
    /// It left a departure marker.
    pub departed: bool,
    /// `fence_done/<node>`: the generation its last completed fence bumped it to.
    pub fenced_to: Option<u64>,
    /// Its last completed fence (from the audit records).
    pub last_fence: Option<FenceSummary>,
    /// Failed fence attempts recorded, and the last one.
    pub failed_attempts: usize,
    /// The last failed attempt.
    pub last_failure: Option<FenceSummary>,
    /// Arenas it owns (the arena index).
    pub arenas: Vec<String>,
}

/// An owed fence, as the sweep sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Owed {
    /// Why (the sweep's reason).
    pub why: String,
    /// An intent (`fence_pending/<node>`) is recorded.
    pub intent_recorded: bool,
    /// A controller holds the claim: the fence is in progress there.
    pub in_progress_by: Option<String>,
    /// Owed since no earlier than: the node's last liveness stamp (its lease expired
    /// up to the stamp's refresh period plus one TTL after). `None`: no stamp was ever
    /// recorded.
    pub since_unix_ms: Option<u64>,
}

/// One fence attempt, from its audit record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FenceSummary {
    /// Unix ms of the decision.
    pub unix_ms: u64,
    /// The controller.
    pub by: String,
    /// What started it.
    pub trigger: String,
    /// The fencer and its result.
    pub fencer: String,
    /// `confirmed`, `single_signal` or `failed: ...`.
    pub result: String,
    /// Generation before.
    pub generation_before: u64,
    /// Generation after.
    pub generation_after: u64,
}

impl FenceSummary {
    pub(super) fn of(a: &AuditRecord) -> Self {
        Self {
            unix_ms: a.unix_ms,
            by: a.fenced_by.clone(),
            trigger: a.trigger.clone(),
            fencer: a.fencer.clone(),
            result: a.fencer_result.clone(),
            generation_before: a.generation_before.unwrap_or_default(),
            generation_after: a.generation_after.unwrap_or_default(),
        }
    }
}

/// One audit record as read back: where it is and what it says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditItem {
    /// Its key (escaped).
    pub key: String,
    /// The fenced node.
    pub node: String,
    /// A failed attempt (the key's `.failed.<ms>` suffix).
    pub failed: bool,
    /// What the record is, from the key's suffix; in JSON `fence`, `failed` (an
    /// attempt) or `unfence` (an operator's `fenced unfence`).
    #[serde(serialize_with = "audit_kind_word")]
    pub kind: AuditKind,
    /// The record.
    pub record: AuditRecord,
}

fn audit_kind_word<S: serde::Serializer>(kind: &AuditKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.as_str())
}

/// The audit records under one prefix, as `fenced audit` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditView {
    /// The revision the read saw.
    pub revision: i64,
    /// Records that decode, in key order (per node, by generation).
    pub records: Vec<AuditItem>,
    /// Records that do not.
    pub malformed: Vec<MalformedRecord>,
}

/// Largest liveness record accepted (fenced writes about 100 bytes).
pub(super) const MAX_LIVENESS_BYTES: usize = 1024;

/// Decodes one `liveness/` value: the JSON [`LivenessRecord`] the agent writes at start
/// and then rarely (the previous version's, written at each renewal without
/// `refresh_ms`, decodes too; a bare number, written by older versions still, is
/// refused with why).
pub fn decode_liveness(value: &[u8]) -> Result<LivenessRecord, Malformed> {
    if value.len() > MAX_LIVENESS_BYTES {
        return Err(Malformed::TooLong {
            what: "liveness record",
            len: value.len(),
            max: MAX_LIVENESS_BYTES,
        });
    }
    let text = std::str::from_utf8(value).map_err(|e| Malformed::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    LivenessRecord::parse(text).map_err(|why| Malformed::NotJson {
        what: "JSON liveness record",
        why: keys::shown(why.as_bytes()),
    })
}

/// Largest audit record accepted (fenced writes well under 4 KiB).
pub(super) const MAX_AUDIT_BYTES: usize = 64 * 1024;

/// Decodes one `audit/` value: the JSON object fenced writes.
pub fn decode_audit(value: &[u8]) -> Result<AuditRecord, Malformed> {
    if value.len() > MAX_AUDIT_BYTES {
        return Err(Malformed::TooLong {
            what: "audit record",
            len: value.len(),
            max: MAX_AUDIT_BYTES,
        });
    }
    let bad = |why: String| Malformed::NotJson {
        what: "JSON audit record",
        why: keys::shown(why.as_bytes()),
    };
    let v: serde_json::Value = serde_json::from_slice(value).map_err(|e| bad(e.to_string()))?;
    match v.get("node") {
        Some(serde_json::Value::String(_)) if v.is_object() => {}
        _ => return Err(bad("not an object with a \"node\" string".into())),
    }
    serde_json::from_value(v).map_err(|e| bad(e.to_string()))
}
