//! One read of the key space: the sweep's snapshot and `fenced status` are two views of
//! it, so both cost one transaction and see one revision.

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::{
    EtcdStore, Result, StoreError, count, parse_u64, prefix, prefix_keys_only, revision, text,
};
use crate::core::SweepSnapshot;
use crate::keys::Keys;
use crate::node::NodeId;

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
    arena_owners: Vec<KeyValue>,
    /// The free pool (keys only).
    free_arenas: Vec<KeyValue>,
    /// Number of audit records (counted, not read).
    audit_records: usize,
}

/// The key-value pairs of a range read, taken out of the answer.
fn take_kvs(op: TxnOpResponse) -> Vec<KeyValue> {
    match op {
        TxnOpResponse::Get(mut g) => g.take_kvs(),
        _ => Vec::new(),
    }
}

impl KeySpace {
    /// The sweep's view: what each node's records say, with the mod revisions its
    /// claims are guarded by.
    fn sweep(&self, k: &Keys) -> Result<SweepSnapshot> {
        let mut s = SweepSnapshot::default();
        for kv in &self.generations {
            if let Some(n) = k.node_of(&k.generation_prefix(), kv.key()) {
                s.generations.insert(n, (parse_u64(kv)?, kv.mod_revision()));
            }
        }
        for kv in &self.pending {
            if let Some(n) = k.node_of(&k.pending_prefix(), kv.key()) {
                s.pending.insert(n, (text(kv), kv.mod_revision()));
            }
        }
        for kv in &self.done {
            if let Some(n) = k.node_of(&k.done_prefix(), kv.key()) {
                s.done.insert(n, kv.mod_revision());
            }
        }
        for kv in &self.members {
            if let Some(n) = k.node_of(&k.membership_prefix(), kv.key()) {
                s.members.insert(n, text(kv));
            }
        }
        for kv in &self.departed {
            if let Some(n) = k.node_of(&k.departed_prefix(), kv.key()) {
                s.departed.insert(n, (text(kv), kv.mod_revision()));
            }
        }
        for kv in &self.arena_nodes {
            if let Some((n, _)) = k.arena_node_of(kv.key()) {
                *s.arenas.entry(n).or_default() += 1;
            }
        }
        for kv in &self.claims {
            if let Some(n) = k.node_of(&k.claim_prefix(), kv.key()) {
                s.claims.insert(n);
            }
        }
        for kv in &self.instances {
            if let Some(n) = k.node_of(&k.instance_prefix(), kv.key()) {
                s.instances.insert(n, text(kv));
            }
        }
        Ok(s)
    }

    /// The operator's view: the records as they are, by key suffix (malformed numbers
    /// shown as 0).
    fn status(&self, k: &Keys) -> Status {
        let tail = |prefix: &str, kv: &KeyValue| {
            String::from_utf8_lossy(kv.key())
                .strip_prefix(prefix)
                .unwrap_or_default()
                .to_owned()
        };
        let pairs = |kvs: &[KeyValue], prefix: String| -> Vec<(String, String)> {
            kvs.iter().map(|kv| (tail(&prefix, kv), text(kv))).collect()
        };
        let nums = |kvs: &[KeyValue], prefix: String| -> Vec<(String, u64)> {
            kvs.iter()
                .map(|kv| (tail(&prefix, kv), parse_u64(kv).unwrap_or(0)))
                .collect()
        };
        let names = |kvs: &[KeyValue], prefix: String| -> Vec<String> {
            kvs.iter().map(|kv| tail(&prefix, kv)).collect()
        };
        Status {
            members: pairs(&self.members, k.membership_prefix()),
            generations: nums(&self.generations, k.generation_prefix()),
            owed: pairs(&self.pending, k.pending_prefix()),
            done: nums(&self.done, k.done_prefix()),
            claims: pairs(&self.claims, k.claim_prefix()),
            departed: names(&self.departed, k.departed_prefix()),
            arenas: pairs(&self.arena_owners, arena_owner_prefix(k)),
            free_arenas: names(&self.free_arenas, k.arena_free_prefix()),
            audit_records: self.audit_records,
        }
    }
}

/// `arena_owner/`.
fn arena_owner_prefix(k: &Keys) -> String {
    format!("{}arena_owner/", k.root())
}

impl EtcdStore {
    /// Reads everything the sweep and `fenced status` look at, in one transaction
    /// (`op` names it in errors).
    async fn key_space(&self, op: &'static str) -> Result<KeySpace> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.generation_prefix(), prefix()),
            TxnOp::get(k.pending_prefix(), prefix()),
            TxnOp::get(k.done_prefix(), prefix()),
            TxnOp::get(k.membership_prefix(), prefix()),
            TxnOp::get(k.departed_prefix(), prefix()),
            TxnOp::get(k.arena_node_all_prefix(), prefix_keys_only()),
            TxnOp::get(k.claim_prefix(), prefix()),
            TxnOp::get(k.instance_prefix(), prefix()),
            TxnOp::get(arena_owner_prefix(k), prefix()),
            TxnOp::get(k.arena_free_prefix(), prefix_keys_only()),
            TxnOp::get(
                k.audit_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self.txn(op, txn).await?;
        let ops = resp.op_responses();
        let audit_records = ops.last().map_or(0, count);
        let mut ranges = ops.into_iter().map(take_kvs);
        let mut next = || ranges.next().unwrap_or_default();
        Ok(KeySpace {
            revision: revision(&resp),
            generations: next(),
            pending: next(),
            done: next(),
            members: next(),
            departed: next(),
            arena_nodes: next(),
            claims: next(),
            instances: next(),
            arena_owners: next(),
            free_arenas: next(),
            audit_records,
        })
    }

    /// `sweep`: the snapshot of every node's records and the revision it was read at,
    /// one transaction.
    pub async fn sweep_snapshot(&self) -> Result<(SweepSnapshot, i64)> {
        let space = self.key_space("sweep").await?;
        Ok((space.sweep(&self.keys)?, space.revision))
    }

    /// Everything `fenced status` shows, in one transaction.
    pub async fn status(&self) -> Result<Status> {
        Ok(self.key_space("status").await?.status(&self.keys))
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
