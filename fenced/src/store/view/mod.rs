//! One read of the key space: the sweep's snapshot and `fenced status` are two views of
//! it, so both see one revision.
//!
//! The read comes in pages (`pager`, the I/O; the rest of this module is pure
//! decoding and its malformed-record policy): each page is one transaction of range reads,
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

use etcd_client::KeyValue;

use super::{EtcdStore, Result, StoreError, prefix};
use crate::core::SweepSnapshot;
use crate::keys::{AuditKind, Keys, Malformed, decode_id_text, decode_u64};
use crate::node::NodeId;

mod pager;

pub(in crate::store) use pager::Reader;
pub use pager::encoded_len;

pub use super::rows::{
    AuditItem, AuditView, FenceSummary, MalformedRecord, NodeRow, Owed, Status, decode_audit,
    decode_liveness,
};

/// Effects of malformed records (see the module docs): the malformed-record policy.
/// It stays in this pure decoder rather than `core/`: each effect is decided where the
/// record is decoded (one match arm each), and the core sees only decoded facts.
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
}

mod status;

impl EtcdStore {
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
    use crate::core::attest::LivenessRecord;
    use crate::store::rows::MAX_AUDIT_BYTES;
    use proptest::prelude::*;

    /// One record type: what the controller and `fenced unfence` write is what
    /// `fenced audit` reads back, field for field, and a fence record's JSON keeps the
    /// keys it has always had (operators' tools read them).
    #[test]
    fn the_audit_record_written_is_the_record_read_back() {
        let ok = br#"{"node":"n2","instance":"i-2","fenced_by":"n1/i-1","trigger":"sweep","signals":["membership expired"],"fencer":"nvme","fencer_result":"confirmed","generation_before":0,"generation_after":1,"arenas_released":["a1"],"claim_ms":3,"sever_ms":4,"total_ms":9,"unix_ms":1700,"steps":["claim","sever"]}"#;
        let fence = decode_audit(ok).unwrap();
        assert_eq!(fence.to_json().as_bytes(), &ok[..], "written as read");
        let unfence = crate::core::AuditRecord {
            action: crate::core::AuditRecord::UNFENCE.to_owned(),
            node: "n3".into(),
            generation: Some(2),
            joined_generation: Some(1),
            boot_id: "b-1".into(),
            reason: "app stopped".into(),
            operator: "alice".into(),
            uid: Some(0),
            host: "h3".into(),
            unix_ms: 1800,
            ..Default::default()
        };
        let json = unfence.to_json();
        assert_eq!(decode_audit(json.as_bytes()).unwrap(), unfence);
        for absent in [
            "fencer",
            "steps",
            "generation_before",
            "claim_ms",
            "trigger",
        ] {
            assert!(
                !json.contains(absent),
                "{absent} in an unfence record: {json}"
            );
        }
    }

    #[test]
    fn audit_records_decode_and_garbage_is_typed() {
        let ok = br#"{"node":"n2","instance":"i-2","fenced_by":"n1/i-1","trigger":"sweep","signals":["membership expired"],"fencer":"nvme","fencer_result":"confirmed","generation_before":0,"generation_after":1,"arenas_released":["a1"],"claim_ms":3,"sever_ms":4,"total_ms":9,"unix_ms":1700,"steps":["claim","sever"]}"#;
        let a = decode_audit(ok).unwrap();
        assert_eq!((a.node.as_str(), a.generation_after), ("n2", Some(1)));
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

        use etcd_client::{Client, PutOptions, Txn, TxnOp};

        use super::super::pager::READ_ATTEMPTS;
        use super::*;
        use crate::store::{StoreOptions, count_round_trips};

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
