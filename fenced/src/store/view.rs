//! One read of the key space: the sweep's snapshot and `fenced status` are two views of
//! it, so both cost one transaction and see one revision.
//!
//! Every key and value is decoded with the typed decoders of [`crate::keys`]. A record
//! that does not decode never fails the read: it is listed as a [`MalformedRecord`]
//! (the sweep logs each once per key and revision; `fenced status` shows them all)
//! and the rest of the snapshot stands. What each kind of malformed record does to
//! the sweep is chosen so that doubt never spares a node a fence:
//!
//! - a key that names no valid node (bad id, extra path segment, not UTF-8): skipped;
//!   no daemon can hold such an id, so there is nothing to fence;
//! - `gen/<node>` that is not a number: the node stays known, so a node that is not a
//!   member is still owed a fence. That fence fails at the generation read (a CAS bump
//!   needs the number; inventing one could move the generation backwards or reuse one
//!   a writer's guard holds), keeps its intent and claim until the claim expires, and
//!   is retried every claim TTL: it never bumps, never releases the node's arenas,
//!   shows as owed in `fenced status` and `fenced check`, and completes by itself once
//!   an operator repairs the value;
//! - an unreadable instance or controller id (`membership/`, `fence_pending/`,
//!   `departed/`, `fence_claim/`, `instance/`): the record still counts (a member is a
//!   member, an intent is owed, a claim is held), its text is treated as unknown;
//! - `fence_done/<node>` that is not a number: the mark still counts (the protocol
//!   reads only its presence and revision, written with the bump);
//! - an `arena_node/<node>/<arena>` whose arena part is malformed: still counted as
//!   an arena the node owns, so a departure is not honoured on its strength;
//! - `arena_claim/`, `arena_pool/`, `liveness/` and `audit/` records are read by the
//!   views only, which show them as malformed (`fenced attest` decodes the liveness
//!   record of the node it judges itself, and refuses what does not decode);
//! - `arena_owner/` and `arena_free/`, the arena layout before per-node claims: read
//!   by `fenced status` only, which lists every such key (`fenced run` refuses to
//!   start next to a well-formed one until `--seed-arenas` converts it).

use std::collections::{BTreeMap, HashSet};

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::{EtcdStore, Result, StoreError, count, prefix, prefix_keys_only, revision};
use crate::core::SweepSnapshot;
use crate::core::attest::LivenessRecord;
use crate::keys::{Keys, Malformed, decode_id_text, decode_node_id, decode_u64};
use crate::node::NodeId;

pub use super::rows::{
    AuditEntry, AuditItem, AuditView, FenceSummary, MalformedRecord, NodeRow, Owed, Status,
    decode_audit, decode_liveness, json_text,
};

/// Effects of malformed records (see the module docs).
mod effect {
    pub const KEY: &str = "skipped: the key names no node or arena of the layout";
    pub const GENERATION: &str = "node kept: fenced when not a member, but the fence fails at the generation read (never bumped) until the value is repaired";
    pub const ID_TEXT: &str = "record still counts; its id is treated as unknown";
    pub const DONE: &str = "fence mark still counts (only its presence is read)";
    pub const ARENA: &str = "still counted as an arena the node owns";
    pub const VIEW: &str = "shown as unknown by the views; the sweep does not read it";
    pub const LEGACY: &str = "not read: fenced run refuses to start until --seed-arenas naming the arena converts it (stop every older fenced first)";
}

/// Decodes audit key-value pairs: the items, and the malformed ones into `bad`.
fn audit_items(k: &Keys, kvs: &[KeyValue], bad: &mut Findings) -> Vec<AuditItem> {
    let mut items = Vec::new();
    for kv in kvs {
        let decoded = k
            .decode_audit_key(kv.key())
            .and_then(|key| decode_audit(kv.value()).map(|a| (key, a)));
        match decoded {
            Ok((key, record)) => items.push(AuditItem {
                key: escaped_key(kv.key()),
                node: key.node.as_str().to_owned(),
                failed: key.failed_unix_ms.is_some(),
                record,
            }),
            Err(e) => bad.add(kv, &e, effect::VIEW),
        }
    }
    items
}

/// Which views a read serves: the sweep's ranges, or those plus what only the
/// operator's views show (liveness stamps, audit records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Sweep,
    Status,
}

/// Everything under the root that the sweep and `fenced status` look at, as read by one
/// transaction (each field: the key-value pairs under one prefix, in key order).
struct KeySpace {
    /// The transaction's revision.
    revision: i64,
    generations: Vec<KeyValue>,
    pending: Vec<KeyValue>,
    done: Vec<KeyValue>,
    members: Vec<KeyValue>,
    departed: Vec<KeyValue>,
    /// The arena index `arena_node/<node>/<arena>` (keys only).
    arena_nodes: Vec<KeyValue>,
    claims: Vec<KeyValue>,
    instances: Vec<KeyValue>,
    /// The claims `arena_claim/<arena>/<node>` (keys only).
    arena_claims: Vec<KeyValue>,
    /// The pool `arena_pool/<arena>` (keys only).
    arena_pool: Vec<KeyValue>,
    /// Number of audit records (counted, not read).
    audit_records: usize,
    /// `liveness/` ([`Scope::Status`] only).
    liveness: Vec<KeyValue>,
    /// `audit/` with values ([`Scope::Status`] only).
    audits: Vec<KeyValue>,
    /// The older layout's `arena_owner/` and `arena_free/` ([`Scope::Status`] only).
    legacy_arenas: Vec<KeyValue>,
}

/// The key-value pairs of a range read, taken out of the answer.
fn take_kvs(op: TxnOpResponse) -> Vec<KeyValue> {
    match op {
        TxnOpResponse::Get(mut g) => g.take_kvs(),
        _ => Vec::new(),
    }
}

/// A key as one escaped line (at most 300 characters).
fn escaped_key(key: &[u8]) -> String {
    let text = String::from_utf8_lossy(key);
    let mut out: String = text.chars().take(300).collect::<String>();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out.escape_debug().to_string()
}

/// Collects the malformed records met while decoding.
#[derive(Default)]
struct Findings(Vec<MalformedRecord>);

impl Findings {
    fn add(&mut self, kv: &KeyValue, why: &Malformed, effect: &'static str) {
        self.0.push(MalformedRecord {
            key: escaped_key(kv.key()),
            why: why.to_string(),
            effect,
            mod_revision: kv.mod_revision(),
        });
    }

    /// The node of a `<prefix><node>` key, or `None` (recorded) when it names none.
    fn node(&mut self, k: &Keys, prefix: &str, kv: &KeyValue) -> Option<NodeId> {
        k.decode_node_key(prefix, kv.key())
            .map_err(|e| self.add(kv, &e, effect::KEY))
            .ok()
    }

    /// The value as an id text, or empty (recorded) when it is not one.
    fn id_text(&mut self, kv: &KeyValue, what: &'static str) -> String {
        decode_id_text(what, kv.value())
            .map_err(|e| self.add(kv, &e, effect::ID_TEXT))
            .unwrap_or_default()
    }
}

/// The decoded key space: the sweep's snapshot plus what the views add.
struct Decoded {
    snapshot: SweepSnapshot,
    /// `fence_done/<node>` values that decode.
    done_generations: BTreeMap<NodeId, u64>,
    /// `fence_claim/<node>` holders.
    claim_holders: BTreeMap<NodeId, String>,
    /// Arenas each node owns, by name (the well-formed ones).
    arena_names: BTreeMap<NodeId, Vec<String>>,
    malformed: Vec<MalformedRecord>,
}

impl KeySpace {
    /// Decodes the ranges the sweep reads: its snapshot (with the mod revisions its
    /// claims are guarded by) and the records that do not decode.
    fn decode(&self, k: &Keys) -> Decoded {
        let mut s = SweepSnapshot::default();
        let mut bad = Findings::default();
        let mut done_generations = BTreeMap::new();
        let mut claim_holders = BTreeMap::new();
        let mut arena_names: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for kv in &self.generations {
            let Some(n) = bad.node(k, &k.generation_prefix(), kv) else {
                continue;
            };
            match decode_u64("generation", kv.value()) {
                Ok(g) => {
                    s.generations.insert(n, (g, kv.mod_revision()));
                }
                Err(e) => {
                    bad.add(kv, &e, effect::GENERATION);
                    s.unreadable_generations.insert(n);
                }
            }
        }
        for kv in &self.pending {
            if let Some(n) = bad.node(k, &k.pending_prefix(), kv) {
                let instance = bad.id_text(kv, "instance id");
                s.pending.insert(n, (instance, kv.mod_revision()));
            }
        }
        for kv in &self.done {
            if let Some(n) = bad.node(k, &k.done_prefix(), kv) {
                match decode_u64("generation", kv.value()) {
                    Ok(g) => {
                        done_generations.insert(n.clone(), g);
                    }
                    Err(e) => bad.add(kv, &e, effect::DONE),
                }
                s.done.insert(n, kv.mod_revision());
            }
        }
        for kv in &self.members {
            if let Some(n) = bad.node(k, &k.membership_prefix(), kv) {
                let instance = bad.id_text(kv, "instance id");
                s.members.insert(n, instance);
            }
        }
        for kv in &self.departed {
            if let Some(n) = bad.node(k, &k.departed_prefix(), kv) {
                let instance = bad.id_text(kv, "instance id");
                s.departed.insert(n, (instance, kv.mod_revision()));
            }
        }
        for kv in &self.arena_nodes {
            match k.decode_arena_node_key(kv.key()) {
                Err(e) => bad.add(kv, &e, effect::KEY),
                Ok((n, arena)) => {
                    match arena {
                        Ok(a) => arena_names.entry(n.clone()).or_default().push(a),
                        Err(e) => bad.add(kv, &e, effect::ARENA),
                    }
                    *s.arenas.entry(n).or_default() += 1;
                }
            }
        }
        for kv in &self.claims {
            if let Some(n) = bad.node(k, &k.claim_prefix(), kv) {
                let holder = bad.id_text(kv, "controller id");
                claim_holders.insert(n.clone(), holder);
                s.claims.insert(n);
            }
        }
        for kv in &self.instances {
            if let Some(n) = bad.node(k, &k.instance_prefix(), kv) {
                match decode_id_text("instance id", kv.value()) {
                    Ok(i) => {
                        s.instances.insert(n, i);
                    }
                    Err(e) => bad.add(kv, &e, effect::ID_TEXT),
                }
            }
        }
        Decoded {
            snapshot: s,
            done_generations,
            claim_holders,
            arena_names,
            malformed: bad.0,
        }
    }

    /// The operator's view: the records as they decode, and those that do not.
    fn status(&self, k: &Keys) -> Status {
        let mut d = self.decode(k);
        let mut bad = Findings(std::mem::take(&mut d.malformed));
        let s = &d.snapshot;
        let name = |n: &NodeId| n.as_str().to_owned();
        let mut arenas = Vec::new();
        for kv in &self.arena_claims {
            match k.decode_arena_claim_key(kv.key()) {
                Ok((a, o)) => arenas.push((a, o.as_str().to_owned())),
                Err(e) => bad.add(kv, &e, effect::VIEW),
            }
        }
        let claimed: HashSet<&str> = arenas.iter().map(|(a, _)| a.as_str()).collect();
        let mut free_arenas = Vec::new();
        for kv in &self.arena_pool {
            match k.decode_arena_key(&k.arena_pool_prefix(), kv.key()) {
                Ok(a) if claimed.contains(a.as_str()) => {}
                Ok(a) => free_arenas.push(a),
                Err(e) => bad.add(kv, &e, effect::VIEW),
            }
        }
        for kv in &self.legacy_arenas {
            let owner_prefix = k.legacy_arena_owner_prefix();
            let (prefix, owned) = if kv.key().starts_with(owner_prefix.as_bytes()) {
                (owner_prefix, true)
            } else {
                (k.legacy_arena_free_prefix(), false)
            };
            let decoded = k.decode_arena_key(&prefix, kv.key()).and_then(|_| {
                if owned {
                    decode_node_id(kv.value()).map(|_| ())
                } else {
                    Ok(())
                }
            });
            match decoded {
                Ok(()) => bad.add(kv, &Malformed::LegacyArenaLayout, effect::LEGACY),
                Err(e) => bad.add(kv, &e, effect::VIEW),
            }
        }
        let mut liveness = BTreeMap::new();
        for kv in &self.liveness {
            if let Some(n) = bad.node(k, &k.liveness_prefix(), kv) {
                match decode_liveness(kv.value()) {
                    Ok(r) => {
                        liveness.insert(n, r);
                    }
                    Err(e) => bad.add(kv, &e, effect::VIEW),
                }
            }
        }
        let audits = audit_items(k, &self.audits, &mut bad);
        let nodes = rows(&d, &liveness, &audits);
        Status {
            members: s
                .members
                .iter()
                .map(|(n, i)| (name(n), i.clone()))
                .collect(),
            generations: s.generations.iter().map(|(n, g)| (name(n), g.0)).collect(),
            owed: s
                .pending
                .iter()
                .map(|(n, p)| (name(n), p.0.clone()))
                .collect(),
            done: d
                .done_generations
                .iter()
                .map(|(n, g)| (name(n), *g))
                .collect(),
            claims: d
                .claim_holders
                .iter()
                .map(|(n, h)| (name(n), h.clone()))
                .collect(),
            departed: s.departed.keys().map(name).collect(),
            arenas,
            free_arenas,
            audit_records: self.audit_records.max(self.audits.len()),
            malformed: bad.0,
            revision: self.revision,
            nodes,
        }
    }
}

/// One row per node any record names: the sweep's plan says which fences are owed and
/// why, the audit records which fences happened.
fn rows(
    d: &Decoded,
    liveness: &BTreeMap<NodeId, LivenessRecord>,
    audits: &[AuditItem],
) -> BTreeMap<String, NodeRow> {
    let s = &d.snapshot;
    let mut rows: BTreeMap<String, NodeRow> = BTreeMap::new();
    fn row<'a>(rows: &'a mut BTreeMap<String, NodeRow>, n: &NodeId) -> &'a mut NodeRow {
        rows.entry(n.as_str().to_owned()).or_default()
    }
    for n in s.generations.keys().chain(&s.unreadable_generations) {
        row(&mut rows, n).generation = s.generations.get(n).map(|g| g.0);
    }
    for (n, i) in &s.members {
        let r = row(&mut rows, n);
        r.member = true;
        r.instance = Some(i.clone()).filter(|i| !i.is_empty());
    }
    for (n, i) in &s.instances {
        let r = row(&mut rows, n);
        if r.instance.is_none() {
            r.instance = Some(i.clone()).filter(|i| !i.is_empty());
        }
    }
    for n in s.pending.keys().chain(s.done.keys()).chain(s.claims.iter()) {
        row(&mut rows, n);
    }
    for n in s.departed.keys() {
        row(&mut rows, n).departed = true;
    }
    for (n, g) in &d.done_generations {
        row(&mut rows, n).fenced_to = Some(*g);
    }
    for (n, h) in &d.claim_holders {
        row(&mut rows, n).claim_holder = Some(h.clone()).filter(|h| !h.is_empty());
    }
    for (n, a) in &d.arena_names {
        row(&mut rows, n).arenas = a.clone();
    }
    for (n, l) in liveness {
        let r = row(&mut rows, n);
        r.last_renewal_unix_ms = Some(l.unix_ms);
        r.lease_ttl_ms = Some(l.ttl_ms);
    }
    let plan = crate::core::plan_sweep(s);
    let owed = plan
        .fence
        .iter()
        .map(|o| (&o.victim.node, o.reason.clone()))
        .chain(
            plan.claimed
                .iter()
                .map(|n| (n, "claimed: a fence is in progress".to_owned())),
        );
    for (n, why) in owed {
        let since = liveness.get(n).map(|l| l.unix_ms);
        let r = row(&mut rows, n);
        r.owed = Some(Owed {
            why,
            intent_recorded: s.pending.contains_key(n),
            in_progress_by: r.claim_holder.clone(),
            since_unix_ms: since,
        });
    }
    for a in audits {
        let r = rows.entry(a.node.clone()).or_default();
        let summary = FenceSummary::of(&a.record);
        if a.failed {
            r.failed_attempts += 1;
            if r.last_failure
                .as_ref()
                .is_none_or(|l| l.unix_ms <= summary.unix_ms)
            {
                r.last_failure = Some(summary);
            }
        } else if r
            .last_fence
            .as_ref()
            .is_none_or(|l| l.generation_after <= summary.generation_after)
        {
            r.last_fence = Some(summary);
        }
    }
    rows
}

impl EtcdStore {
    /// Reads everything the sweep and `fenced status` look at, in one transaction
    /// (`op` names it in errors).
    async fn key_space(&self, op: &'static str, scope: Scope) -> Result<KeySpace> {
        let k = &self.keys;
        let mut ops = vec![
            TxnOp::get(k.generation_prefix(), prefix()),
            TxnOp::get(k.pending_prefix(), prefix()),
            TxnOp::get(k.done_prefix(), prefix()),
            TxnOp::get(k.membership_prefix(), prefix()),
            TxnOp::get(k.departed_prefix(), prefix()),
            TxnOp::get(k.arena_node_all_prefix(), prefix_keys_only()),
            TxnOp::get(k.claim_prefix(), prefix()),
            TxnOp::get(k.instance_prefix(), prefix()),
            TxnOp::get(k.arena_claim_prefix(), prefix_keys_only()),
            TxnOp::get(k.arena_pool_prefix(), prefix_keys_only()),
            TxnOp::get(
                k.audit_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ];
        if scope == Scope::Status {
            ops.push(TxnOp::get(k.liveness_prefix(), prefix()));
            ops.push(TxnOp::get(k.audit_prefix(), prefix()));
            ops.push(TxnOp::get(k.legacy_arena_owner_prefix(), prefix()));
            ops.push(TxnOp::get(k.legacy_arena_free_prefix(), prefix_keys_only()));
        }
        let resp = self.txn(op, Txn::new().and_then(ops)).await?;
        let ops = resp.op_responses();
        let audit_records = ops.get(10).map_or(0, count);
        let mut ranges = ops.into_iter().map(take_kvs);
        let mut next = || ranges.next().unwrap_or_default();
        let (generations, pending, done, members, departed) =
            (next(), next(), next(), next(), next());
        let (arena_nodes, claims, instances, arena_claims, arena_pool) =
            (next(), next(), next(), next(), next());
        let _audit_count = next();
        Ok(KeySpace {
            revision: revision(&resp),
            generations,
            pending,
            done,
            members,
            departed,
            arena_nodes,
            claims,
            instances,
            arena_claims,
            arena_pool,
            audit_records,
            liveness: next(),
            audits: next(),
            legacy_arenas: [next(), next()].concat(),
        })
    }

    /// `sweep`: the snapshot of every node's records and the revision it was read at,
    /// one transaction. Records that do not decode are left out as the module docs
    /// say and logged once per key (again only when the key is rewritten).
    pub async fn sweep_snapshot(&self) -> Result<(SweepSnapshot, i64)> {
        let space = self.key_space("sweep", Scope::Sweep).await?;
        let decoded = space.decode(&self.keys);
        self.report_malformed(&decoded.malformed);
        Ok((decoded.snapshot, space.revision))
    }

    /// Logs each malformed record not reported yet (by key and mod revision) and
    /// forgets the keys that decode again, so the sweep's log is not flooded and a
    /// later breakage of a repaired key is reported.
    fn report_malformed(&self, found: &[MalformedRecord]) {
        let mut seen = self
            .malformed_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for r in found {
            if seen.insert(r.key.clone(), r.mod_revision) != Some(r.mod_revision) {
                tracing::warn!(
                    step = "sweep",
                    key = %r.key,
                    why = %r.why,
                    effect = r.effect,
                    "record under the fenced root does not decode; the sweep goes on without it (logged once per key; `fenced status` lists it). Repair or delete the key"
                );
            }
        }
        let current: HashSet<&str> = found.iter().map(|r| r.key.as_str()).collect();
        seen.retain(|k, _| current.contains(k.as_str()));
    }

    /// Everything `fenced status` shows, in one transaction.
    pub async fn status(&self) -> Result<Status> {
        Ok(self
            .key_space("status", Scope::Status)
            .await?
            .status(&self.keys))
    }

    /// The audit records (of `node`, or all), decoded, in one range read.
    pub async fn audit_view(&self, node: Option<&NodeId>) -> Result<AuditView> {
        self.rt();
        let p = match node {
            Some(n) => format!("{}{n}/", self.keys.audit_prefix()),
            None => self.keys.audit_prefix(),
        };
        let r = self
            .client()
            .get(p, prefix())
            .await
            .map_err(|e| StoreError::classify("audit", e))?;
        let mut bad = Findings::default();
        let records = audit_items(&self.keys, r.kvs(), &mut bad);
        Ok(AuditView {
            revision: r.header().map_or(0, |h| h.revision()),
            records,
            malformed: bad.0,
        })
    }

    /// Audit records of `node` (JSON), oldest first.
    pub async fn audit_records(&self, node: &NodeId) -> Result<Vec<serde_json::Value>> {
        self.rt();
        let r = self
            .client()
            .get(format!("{}{node}/", self.keys.audit_prefix()), prefix())
            .await
            .map_err(|e| StoreError::classify("audit", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rows::MAX_AUDIT_BYTES;
    use proptest::prelude::*;

    #[test]
    fn audit_records_decode_and_garbage_is_typed() {
        let ok = br#"{"node":"n2","instance":"i-2","fenced_by":"n1/i-1","trigger":"sweep","signals":["membership expired"],"fencer":"nvme","fencer_result":"confirmed","generation_before":0,"generation_after":1,"arenas_released":["a1"],"claim_ms":3,"sever_ms":4,"total_ms":9,"unix_ms":1700,"steps":["claim","sever"]}"#;
        let a = decode_audit(ok).unwrap();
        assert_eq!((a.node.as_str(), a.generation_after), ("n2", 1));
        assert_eq!(a.trigger, "sweep");
        for bad in [
            &b"not json"[..],
            br#"["a"]"#,
            b"{}",
            br#"{"node":1}"#,
            br#"{"node":"n1","generation_after":-1}"#,
            b"\xff",
        ] {
            assert!(
                matches!(decode_audit(bad), Err(Malformed::NotJson { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            decode_audit(&vec![b' '; MAX_AUDIT_BYTES + 1]),
            Err(Malformed::TooLong { .. })
        ));
    }

    #[test]
    fn liveness_records_decode_and_old_stamps_are_refused() {
        let r = LivenessRecord {
            lease: 7,
            ttl_ms: 2000,
            margin_ms: 4000,
            unix_ms: 1700,
        };
        assert_eq!(decode_liveness(r.encode().as_bytes()), Ok(r));
        for bad in [&b"1700"[..], b"yesterday", b"{}", b"\xff", &[b' '; 2000]] {
            assert!(decode_liveness(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// The liveness decoder returns a record or a typed one-line error.
        #[test]
        fn liveness_decoder_never_panics(
            raw in proptest::collection::vec(any::<u8>(), 0..200),
            lease in any::<i64>(),
            ms in any::<u64>(),
        ) {
            let json = format!(r#"{{"lease":{lease},"ttl_ms":{ms},"margin_ms":1,"unix_ms":{ms}}}"#);
            prop_assert!(decode_liveness(json.as_bytes()).is_ok());
            if let Err(e) = decode_liveness(&raw) {
                let m = e.to_string();
                prop_assert!(!m.contains('\n') && m.len() < 400, "{}", m);
            }
        }

        /// The audit decoder returns a record or a typed one-line error for any bytes,
        /// and for JSON objects of any shape.
        #[test]
        fn audit_decoder_never_panics(
            raw in proptest::collection::vec(any::<u8>(), 0..400),
            node in "[a-z0-9\n\"]{0,8}",
            after in any::<i64>(),
            extra in "[a-z]{0,8}",
        ) {
            let json = format!(r#"{{"node":{node:?},"generation_after":{after},"{extra}":[1,{{}}]}}"#);
            for v in [raw.as_slice(), json.as_bytes()] {
                match decode_audit(v) {
                    Ok(_) => {
                        let parsed = serde_json::from_slice::<serde_json::Value>(v);
                        prop_assert!(parsed.is_ok_and(|x| x.is_object()));
                    }
                    Err(e) => {
                        let m = e.to_string();
                        prop_assert!(!m.contains('\n') && m.len() < 400, "{}", m);
                    }
                }
            }
        }
    }
}
