//! One read of the key space: the sweep's snapshot and `fenced status` are two views of
//! it, so both see one revision.
//!
//! The read comes in pages ([`Reader`]): each page is one transaction of range reads,
//! every page after the first pinned to the first one's revision and resuming after
//! the last key read, so the pages add up to one point-in-time view (the claim's
//! guards compare mod revisions of that view). A page is sized to about
//! [`StoreOptions::read_page_bytes`] from what the earlier pages measured, so a
//! cluster of 100,000 nodes stays far under etcd-client's 4 MiB answer limit, while a
//! small one is one page, one round trip. A page that still comes back too large is
//! read again smaller; a revision compacted away mid-read restarts the read at the
//! newest revision (a few times, then a clear error).
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

use std::future::Future;

use etcd_client::{Client, GetOptions, KeyValue, KvClient, Txn, TxnOp, TxnOpResponse};

use super::{EtcdStore, Result, StoreError, StoreOptions, prefix};
use crate::core::SweepSnapshot;
use crate::core::attest::LivenessRecord;
use crate::keys::{AuditKind, Keys, Malformed, decode_id_text, decode_node_id, decode_u64};
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
                failed: matches!(key.kind, AuditKind::Failed { .. }),
                kind: key.kind,
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

/// Everything under the root that the sweep and `fenced status` look at, as read at
/// one revision (each field: the key-value pairs under one prefix, in key order).
struct KeySpace {
    /// The revision every page was read at.
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
        // Only an older agent's record, stamped at every renewal, dates a renewal.
        r.last_renewal_unix_ms = Some(l.unix_ms).filter(|_| l.refresh_ms == 0);
        r.liveness_stamp_unix_ms = Some(l.unix_ms);
        r.lease_ttl_ms = Some(l.ttl_ms);
        r.liveness_refresh_ms = Some(l.refresh_ms);
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
        if matches!(a.kind, AuditKind::Unfence { .. }) {
            // An operator's permission to register again, not a fence: `fenced audit`
            // shows it.
            continue;
        }
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

/// What a range of the read returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Keys and values.
    Values,
    /// Keys only: the records whose value no view reads.
    Keys,
    /// Only the number of keys (read with the first page).
    Count,
}

/// One prefix range of the read, with a guess of its bytes per record as decoded
/// (key, value, revisions, framing) that sizes the first page. Later pages use what
/// the earlier ones measured.
#[derive(Debug, Clone)]
struct Span {
    prefix: String,
    want: Want,
    guess: usize,
}

/// Bytes per record the first page assumes: a node record (`gen/`, `membership/`,
/// ...: a key naming a node, a short value, revisions and a lease)...
const NODE_RECORD_GUESS: usize = 80;
/// ...an arena record (a key naming a node and an arena, or an arena and its owner)...
const ARENA_RECORD_GUESS: usize = 120;
/// ...a liveness stamp (a small JSON object)...
const LIVENESS_GUESS: usize = 160;
/// ...and an audit record (JSON with the fence's steps; at most 64 KiB, usually under 1).
const AUDIT_GUESS: usize = 1024;

/// How many times a read cut by compaction is started again at the newest revision.
const READ_ATTEMPTS: u32 = 3;

/// The ranges of the read, in the order [`KeySpace`] takes them.
fn spans(k: &Keys, scope: Scope) -> Vec<Span> {
    let span = |prefix, want, guess| Span {
        prefix,
        want,
        guess,
    };
    let mut v = vec![
        span(k.generation_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.pending_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.done_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.membership_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.departed_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.arena_node_all_prefix(), Want::Keys, ARENA_RECORD_GUESS),
        span(k.claim_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.instance_prefix(), Want::Values, NODE_RECORD_GUESS),
        span(k.arena_claim_prefix(), Want::Keys, ARENA_RECORD_GUESS),
        span(k.arena_pool_prefix(), Want::Keys, ARENA_RECORD_GUESS),
        span(k.audit_prefix(), Want::Count, 0),
    ];
    if scope == Scope::Status {
        v.push(span(k.liveness_prefix(), Want::Values, LIVENESS_GUESS));
        v.push(span(k.audit_prefix(), Want::Values, AUDIT_GUESS));
        // The arena layout before per-node claims (listed, never used).
        v.push(span(
            k.legacy_arena_owner_prefix(),
            Want::Values,
            ARENA_RECORD_GUESS,
        ));
        v.push(span(
            k.legacy_arena_free_prefix(),
            Want::Keys,
            ARENA_RECORD_GUESS,
        ));
    }
    v
}

/// The paged read's KV client (answers up to
/// [`StoreOptions::read_max_response_bytes`]) and its page size.
#[derive(Clone)]
pub(super) struct Reader {
    kv: KvClient,
    page_bytes: usize,
    max_response_bytes: usize,
}

impl Reader {
    pub(super) fn new(client: &Client, opts: &StoreOptions) -> Self {
        Self {
            kv: client
                .kv_client()
                .max_decoding_message_size(opts.read_max_response_bytes),
            page_bytes: opts.read_page_bytes.max(1),
            max_response_bytes: opts.read_max_response_bytes,
        }
    }
}

/// The first key after every key that starts with `prefix` (etcd's prefix range end).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // Every key starts with the empty prefix: etcd reads `\0` as "to the end".
    vec![0]
}

/// Bytes of a protobuf varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes `kv` takes in a range answer: the `KeyValue` message and its framing (the
/// size etcd-client's answer limit counts).
fn encoded_len(kv: &KeyValue) -> usize {
    let bytes = |n: usize| match n {
        0 => 0,
        n => 1 + varint_len(n as u64) + n,
    };
    // Negative numbers (none expected) take 10 bytes, as `v as u64` does.
    let int = |v: i64| match v {
        0 => 0,
        v => 1 + varint_len(v as u64),
    };
    let body = bytes(kv.key().len())
        + bytes(kv.value().len())
        + int(kv.create_revision())
        + int(kv.mod_revision())
        + int(kv.version())
        + int(kv.lease());
    1 + varint_len(body as u64) + body
}

/// Where one span of the read stands.
#[derive(Default)]
struct Cursor {
    /// The key the next page starts at (`None`: the span's prefix).
    resume: Option<Vec<u8>>,
    done: bool,
    /// Records read so far, and the bytes they took, which size the next pages.
    records: usize,
    bytes: usize,
}

/// The spans as read at one revision.
struct Paged {
    revision: i64,
    /// Per span: the key-value pairs in key order ([`Want::Count`]: none).
    kvs: Vec<Vec<KeyValue>>,
    /// Per span: the number of keys ([`Want::Count`] only).
    counts: Vec<usize>,
}

/// How far a read got (for the error when compaction keeps cutting it).
#[derive(Default, Clone, Copy)]
struct Progress {
    revision: i64,
    pages: u32,
}

/// A page came back larger than the client accepts.
fn too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large"))
}

/// A store error whose cause is our own explanation (`code`: how it classifies).
fn explained(code: tonic::Code, why: String) -> etcd_client::Error {
    etcd_client::Error::GRpcStatus(tonic::Status::new(code, why))
}

impl EtcdStore {
    /// Reads everything the sweep and `fenced status` look at, at one revision, in
    /// pages (`op` names it in errors).
    async fn key_space(&self, op: &'static str, scope: Scope) -> Result<KeySpace> {
        self.key_space_with(op, scope, |_, _| async {}).await
    }

    /// [`Self::key_space`], running `between(pages_read, revision)` before each page
    /// after the first (the tests write and compact there).
    async fn key_space_with<F, Fut>(
        &self,
        op: &'static str,
        scope: Scope,
        between: F,
    ) -> Result<KeySpace>
    where
        F: FnMut(u32, i64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let spans = spans(&self.keys, scope);
        let read = self.read_spans(op, &spans, between).await?;
        let audit_records = read.counts.get(10).copied().unwrap_or(0);
        let mut ranges = read.kvs.into_iter();
        let mut next = || ranges.next().unwrap_or_default();
        let (generations, pending, done, members, departed) =
            (next(), next(), next(), next(), next());
        let (arena_nodes, claims, instances, arena_claims, arena_pool) =
            (next(), next(), next(), next(), next());
        let _audit_count = next();
        Ok(KeySpace {
            revision: read.revision,
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

    /// Reads `spans` at one revision, starting again at the newest revision when
    /// compaction removes the one being read before the last page (at most
    /// [`READ_ATTEMPTS`] times).
    async fn read_spans<F, Fut>(
        &self,
        op: &'static str,
        spans: &[Span],
        mut between: F,
    ) -> Result<Paged>
    where
        F: FnMut(u32, i64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut cause = None;
        let mut progress = Progress::default();
        for attempt in 1..=READ_ATTEMPTS {
            progress = Progress::default();
            match self
                .read_pages(op, spans, &mut between, &mut progress)
                .await
            {
                Err(StoreError::Compacted { source, .. }) => {
                    tracing::info!(
                        step = op,
                        attempt,
                        revision = progress.revision,
                        pages = progress.pages,
                        cause = %source,
                        "the revision of a paged read was compacted before its last page; reading again at the newest revision"
                    );
                    cause = Some(source);
                }
                other => return other,
            }
        }
        let cause = cause.map_or_else(String::new, |c| c.to_string());
        Err(StoreError::Compacted {
            op,
            source: explained(
                tonic::Code::OutOfRange,
                format!(
                    "the key space is read in pages at one revision, and etcd compacted that revision before the last page on each of {READ_ATTEMPTS} attempts (the last at revision {}, after {} pages): compaction runs more often than one read takes; keep more history (etcd --auto-compaction-retention) or raise read_page_bytes so the read takes fewer pages (last cause: {cause})",
                    progress.revision, progress.pages
                ),
            ),
        })
    }

    /// One attempt of [`Self::read_spans`].
    async fn read_pages<F, Fut>(
        &self,
        op: &'static str,
        spans: &[Span],
        between: &mut F,
        progress: &mut Progress,
    ) -> Result<Paged>
    where
        F: FnMut(u32, i64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut cursors: Vec<Cursor> = spans.iter().map(|_| Cursor::default()).collect();
        let mut out = Paged {
            revision: 0,
            kvs: spans.iter().map(|_| Vec::new()).collect(),
            counts: vec![0; spans.len()],
        };
        // What a page may hold; both shrink when a page comes back too large.
        let mut budget = self.reader.page_bytes;
        let mut width = spans.len();
        loop {
            let open: Vec<usize> = (0..spans.len())
                .filter(|&i| !cursors[i].done)
                .take(width)
                .collect();
            if open.is_empty() {
                return Ok(out);
            }
            if progress.pages > 0 {
                between(progress.pages, out.revision).await;
            }
            let listing = open
                .iter()
                .filter(|&&i| spans[i].want != Want::Count)
                .count()
                .max(1);
            let mut ops = Vec::with_capacity(open.len());
            let mut limits = Vec::with_capacity(open.len());
            for &i in &open {
                let (span, cursor) = (&spans[i], &cursors[i]);
                let per_record = match cursor.records {
                    0 => span.guess,
                    n => cursor.bytes.div_ceil(n),
                }
                .max(1);
                let limit = (budget / listing / per_record).max(1);
                let mut o = GetOptions::new()
                    .with_range(prefix_end(span.prefix.as_bytes()))
                    .with_revision(out.revision);
                o = match span.want {
                    Want::Count => o.with_count_only(),
                    Want::Keys => o.with_keys_only().with_limit(limit as i64),
                    Want::Values => o.with_limit(limit as i64),
                };
                limits.push(if span.want == Want::Count { 0 } else { limit });
                let start = cursor
                    .resume
                    .clone()
                    .unwrap_or_else(|| span.prefix.as_bytes().to_vec());
                ops.push(TxnOp::get(start, Some(o)));
            }
            self.rt();
            let answer = self.reader.kv.clone().txn(Txn::new().and_then(ops)).await;
            let resp = match answer {
                Ok(r) => r,
                Err(e) if too_large(&e) => {
                    if limits.iter().any(|&l| l > 1) {
                        budget = (budget / 2).max(1);
                    } else if open.len() > 1 {
                        width = (open.len() / 2).max(1);
                    } else {
                        let span = &spans[open[0]];
                        let after = cursors[open[0]]
                            .resume
                            .as_deref()
                            .map_or_else(|| "its first key".to_owned(), escaped_key);
                        return Err(StoreError::Other {
                            op,
                            source: explained(
                                tonic::Code::OutOfRange,
                                format!(
                                    "one record under {} (at or after {after}) is larger than the read accepts ({} bytes; etcd-client: {e}): raise read_max_response_bytes, or repair or delete the record",
                                    escaped_key(span.prefix.as_bytes()),
                                    self.reader.max_response_bytes
                                ),
                            ),
                        });
                    }
                    tracing::debug!(
                        step = op,
                        budget,
                        width,
                        "a page of the read came back too large; reading it again smaller"
                    );
                    continue;
                }
                Err(e) => return Err(StoreError::classify(op, e)),
            };
            if out.revision == 0 {
                out.revision = resp.header().map_or(0, |h| h.revision());
            }
            let answers = resp.op_responses();
            if answers.len() != open.len() {
                return Err(StoreError::Other {
                    op,
                    source: explained(
                        tonic::Code::Internal,
                        format!(
                            "etcd answered {} of the {} range reads of a page",
                            answers.len(),
                            open.len()
                        ),
                    ),
                });
            }
            for (answer, &i) in answers.into_iter().zip(&open) {
                let TxnOpResponse::Get(mut g) = answer else {
                    return Err(StoreError::Other {
                        op,
                        source: explained(
                            tonic::Code::Internal,
                            "etcd answered a range read with something else".to_owned(),
                        ),
                    });
                };
                let cursor = &mut cursors[i];
                if spans[i].want == Want::Count {
                    out.counts[i] = usize::try_from(g.count()).unwrap_or(usize::MAX);
                    cursor.done = true;
                    continue;
                }
                let kvs = g.take_kvs();
                cursor.records += kvs.len();
                cursor.bytes += kvs.iter().map(encoded_len).sum::<usize>();
                match (g.more(), kvs.last()) {
                    (false, _) => cursor.done = true,
                    (true, Some(last)) => {
                        let mut resume = last.key().to_vec();
                        resume.push(0);
                        cursor.resume = Some(resume);
                    }
                    (true, None) => {
                        return Err(StoreError::Other {
                            op,
                            source: explained(
                                tonic::Code::Internal,
                                format!(
                                    "etcd said more records follow under {} but sent none",
                                    escaped_key(spans[i].prefix.as_bytes())
                                ),
                            ),
                        });
                    }
                }
                out.kvs[i].extend(kvs);
            }
            progress.revision = out.revision;
            progress.pages += 1;
        }
    }

    /// `sweep`: the snapshot of every node's records and the revision it was read at
    /// (one round trip unless the key space is larger than a page). Records that do not decode are left out as the module docs
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

    /// Everything `fenced status` shows, read at one revision.
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
            refresh_ms: 31_000,
        };
        assert_eq!(decode_liveness(r.encode().as_bytes()), Ok(r));
        for bad in [&b"1700"[..], b"yesterday", b"{}", b"\xff", &[b' '; 2000]] {
            assert!(decode_liveness(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefix_ends_and_record_sizes() {
        assert_eq!(prefix_end(b"/f/gen/"), b"/f/gen0".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(
            [0, 1, 127, 128, 16_383, 16_384, u64::MAX].map(varint_len),
            [1, 1, 1, 2, 2, 3, 10]
        );
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

    /// The paged read against a real etcd, with the writes and compactions timed
    /// between its pages (only the read machinery can time them).
    mod paging {
        use std::sync::{Arc, Mutex};
        use std::time::Duration;

        use etcd_client::{Client, PutOptions};

        use super::*;
        use crate::store::count_round_trips;

        async fn store(
            etcd: &test_support::Etcd,
            root: &str,
            page_bytes: usize,
            max: usize,
        ) -> EtcdStore {
            let opts = StoreOptions {
                read_page_bytes: page_bytes,
                read_max_response_bytes: max,
                ..StoreOptions::default()
            };
            EtcdStore::connect_with(&[etcd.endpoint()], root, Duration::from_secs(30), &opts)
                .await
                .expect("connect")
        }

        fn node(i: usize) -> NodeId {
            NodeId::new(&format!("n{i:03}")).expect("node id")
        }

        /// `n` nodes at generation 1 with an instance record; every fourth is not a
        /// member (owed a fence), every eighth has its intent recorded; a liveness
        /// stamp and an audit record for node 0.
        async fn seed(client: &mut Client, k: &Keys, n: usize) {
            let lease = client.lease_grant(3600, None).await.expect("lease").id();
            let mut ops = Vec::new();
            for i in 0..n {
                let id = node(i);
                ops.push(TxnOp::put(k.generation(&id), "1", None));
                ops.push(TxnOp::put(k.instance(&id), format!("i-{i:017x}"), None));
                if i % 4 != 0 {
                    let lease = Some(PutOptions::new().with_lease(lease));
                    ops.push(TxnOp::put(k.membership(&id), format!("i-{i:017x}"), lease));
                }
                if i % 8 == 0 {
                    ops.push(TxnOp::put(k.pending(&id), format!("i-{i:017x}"), None));
                }
            }
            let stamp = LivenessRecord {
                lease,
                ttl_ms: 2000,
                margin_ms: 4000,
                unix_ms: 1700,
                refresh_ms: 30_000,
            };
            ops.push(TxnOp::put(k.liveness(&node(0)), stamp.encode(), None));
            ops.push(TxnOp::put(
                k.audit(&node(0), 1),
                r#"{"node":"n000","generation_after":1,"unix_ms":1700}"#,
                None,
            ));
            let mut ops = ops.into_iter().peekable();
            while ops.peek().is_some() {
                let batch: Vec<TxnOp> = ops.by_ref().take(128).collect();
                client.txn(Txn::new().and_then(batch)).await.expect("seed");
            }
        }

        /// A write that lands between two pages: a new node sorting after every
        /// other, a generation moved, a membership gone.
        async fn write_between(mut client: Client, k: Keys, page: u32) -> i64 {
            let late = NodeId::new(&format!("zz{page}")).expect("node id");
            let resp = client
                .txn(Txn::new().and_then(vec![
                    TxnOp::put(k.generation(&late), "1", None),
                    TxnOp::put(k.membership(&late), "i-late", None),
                    TxnOp::put(k.generation(&node(0)), format!("{}", 10 + page), None),
                    TxnOp::delete(k.membership(&node(1)), None),
                ]))
                .await
                .expect("write between pages");
            resp.header().expect("header").revision()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn tiny_pages_read_one_revision_and_writes_between_pages_do_not_appear() {
            let etcd = test_support::Etcd::start();
            let one_page = store(&etcd, "/paging-a", 1 << 20, 4 << 20).await;
            let k = one_page.keys().clone();
            let mut client = one_page.client();
            seed(&mut client, &k, 10).await;
            let (_, trips) = count_round_trips(one_page.sweep_snapshot()).await;
            assert_eq!(trips, 1, "a small key space is one page");

            // Page size 1: every range reads one record per page, and before each page
            // after the first, a write changes what the read covers.
            let tiny = store(&etcd, "/paging-a", 1, 4 << 20).await;
            let seen = Arc::new(Mutex::new(Vec::new()));
            let hook = |page: u32, rev: i64| {
                let (client, k, seen) = (client.clone(), k.clone(), seen.clone());
                async move {
                    let wrote = write_between(client, k, page).await;
                    seen.lock().expect("lock").push((rev, wrote));
                }
            };
            let check_seen = |want_rev: i64| {
                let seen = std::mem::take(&mut *seen.lock().expect("lock"));
                assert!(seen.len() >= 9, "a write before each later page: {seen:?}");
                assert!(
                    seen.iter()
                        .all(|&(rev, wrote)| rev == want_rev && wrote > want_rev),
                    "every page at the first page's revision, every write after it: {seen:?}"
                );
            };

            let want_status = one_page.status().await.expect("status");
            let want_rev = want_status.revision;
            let (space, trips) =
                count_round_trips(tiny.key_space_with("status", Scope::Status, hook)).await;
            let space = space.expect("paged status read");
            assert!(
                trips >= 10,
                "10 nodes, pages of 1 record: {trips} round trips"
            );
            assert_eq!(space.revision, want_rev);
            assert_eq!(
                serde_json::to_value(space.status(&k)).expect("json"),
                serde_json::to_value(want_status).expect("json"),
                "the paged status view is the one-page view at the same revision"
            );
            check_seen(want_rev);

            let (want, want_rev) = one_page.sweep_snapshot().await.expect("one-page read");
            let (space, trips) =
                count_round_trips(tiny.key_space_with("sweep", Scope::Sweep, hook)).await;
            let space = space.expect("paged sweep read");
            assert!(trips >= 10, "{trips} round trips");
            assert_eq!(space.revision, want_rev);
            assert_eq!(
                space.decode(&k).snapshot,
                want,
                "writes made between pages must not appear"
            );
            check_seen(want_rev);
            // The writes landed: a fresh read sees them.
            let (now, _) = one_page.sweep_snapshot().await.expect("read");
            assert_ne!(now, want);
            assert!(
                now.generations
                    .contains_key(&NodeId::new("zz1").expect("id"))
            );
            assert!(!now.members.contains_key(&node(1)));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_revision_compacted_mid_read_restarts_the_read_at_the_newest() {
            let etcd = test_support::Etcd::start();
            let tiny = store(&etcd, "/paging-b", 1, 4 << 20).await;
            let k = tiny.keys().clone();
            let mut client = tiny.client();
            seed(&mut client, &k, 10).await;
            let (_, first_rev) = tiny.sweep_snapshot().await.expect("read");

            // Before the second page of the first attempt only: move a generation and
            // compact up to that write, so the first attempt's revision is gone.
            let calls = Arc::new(Mutex::new(Vec::new()));
            let hook = |page: u32, rev: i64| {
                let (mut client, k, calls) = (client.clone(), k.clone(), calls.clone());
                async move {
                    let first = calls.lock().expect("lock").is_empty();
                    calls.lock().expect("lock").push((page, rev));
                    if first {
                        let wrote = write_between(client.clone(), k, 7).await;
                        client.compact(wrote, None).await.expect("compact");
                    }
                }
            };
            let space = tiny
                .key_space_with("sweep", Scope::Sweep, hook)
                .await
                .expect("the read restarts after the compaction");
            let calls = calls.lock().expect("lock").clone();
            assert_eq!(calls[0].1, first_rev, "{calls:?}");
            assert!(space.revision > first_rev, "{calls:?}");
            assert!(
                calls[1..].iter().all(|&(_, rev)| rev == space.revision),
                "the second attempt reads at one newer revision: {calls:?}"
            );
            let snap = space.decode(&k).snapshot;
            assert_eq!(
                snap.generations[&node(0)].0,
                17,
                "the second attempt sees the write"
            );
            assert!(!snap.members.contains_key(&node(1)));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_read_compacted_on_every_attempt_fails_with_a_clear_error() {
            let etcd = test_support::Etcd::start();
            let tiny = store(&etcd, "/paging-c", 1, 4 << 20).await;
            let k = tiny.keys().clone();
            let mut client = tiny.client();
            seed(&mut client, &k, 4).await;
            let calls = Arc::new(Mutex::new(0u32));
            let hook = |page: u32, _rev: i64| {
                let (mut client, k, calls) = (client.clone(), k.clone(), calls.clone());
                async move {
                    *calls.lock().expect("lock") += 1;
                    let wrote = write_between(client.clone(), k, page).await;
                    client.compact(wrote, None).await.expect("compact");
                }
            };
            let Err(e) = tiny.key_space_with("sweep", Scope::Sweep, hook).await else {
                panic!("a read compacted on every attempt must fail");
            };
            assert!(e.is_compacted(), "{e}");
            let m = e.to_string();
            assert!(
                m.contains("on each of 3 attempts") && m.contains("--auto-compaction-retention"),
                "{m}"
            );
            assert_eq!(*calls.lock().expect("lock"), READ_ATTEMPTS);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_page_over_the_answer_limit_is_read_again_smaller() {
            let etcd = test_support::Etcd::start();
            let one_page = store(&etcd, "/paging-d", 1 << 20, 4 << 20).await;
            let k = one_page.keys().clone();
            let mut client = one_page.client();
            seed(&mut client, &k, 300).await;
            let (want, rev) = one_page.sweep_snapshot().await.expect("one-page read");

            // Pages sized for 1 MiB, answers refused past 16 KiB: the first page
            // (~30 KB) is refused and read again in halves.
            let small = store(&etcd, "/paging-d", 1 << 20, 16 << 10).await;
            let (read, trips) = count_round_trips(small.sweep_snapshot()).await;
            assert_eq!(read.expect("paged read"), (want, rev));
            assert!(
                trips >= 3,
                "one refused page and at least two more: {trips}"
            );

            // One record larger than any answer the read accepts: a clear error.
            client
                .put(k.generation(&node(999)), vec![b'7'; 20 << 10], None)
                .await
                .expect("put");
            let e = small
                .sweep_snapshot()
                .await
                .expect_err("a record past the limit");
            let m = e.to_string();
            assert!(
                m.contains("larger than the read accepts")
                    && m.contains("/paging-d/gen/")
                    && m.contains("read_max_response_bytes"),
                "{m}"
            );
        }
    }
}
