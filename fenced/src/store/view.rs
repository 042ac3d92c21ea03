//! The reads of the key space behind the sweep and `fenced status`.

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp};

use super::{
    EtcdStore, Result, StoreError, count, kvs, parse_u64, prefix, prefix_keys_only, revision, text,
};
use crate::core::SweepSnapshot;
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

impl EtcdStore {
    /// `sweep`: one transaction of range reads.
    pub async fn sweep_snapshot(&self) -> Result<(SweepSnapshot, i64)> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.generation_prefix(), prefix()),
            TxnOp::get(k.pending_prefix(), prefix()),
            TxnOp::get(k.done_prefix(), prefix()),
            TxnOp::get(k.membership_prefix(), prefix()),
            TxnOp::get(k.departed_prefix(), prefix()),
            TxnOp::get(k.arena_node_all_prefix(), prefix_keys_only()),
            TxnOp::get(k.claim_prefix(), prefix_keys_only()),
            TxnOp::get(k.instance_prefix(), prefix()),
        ]);
        let resp = self.txn("sweep", txn).await?;
        let ops = resp.op_responses();
        let mut s = SweepSnapshot::default();
        for kv in kvs(&ops[0]) {
            if let Some(n) = k.node_of(&k.generation_prefix(), kv.key()) {
                s.generations.insert(n, (parse_u64(kv)?, kv.mod_revision()));
            }
        }
        for kv in kvs(&ops[1]) {
            if let Some(n) = k.node_of(&k.pending_prefix(), kv.key()) {
                s.pending.insert(n, (text(kv), kv.mod_revision()));
            }
        }
        for kv in kvs(&ops[2]) {
            if let Some(n) = k.node_of(&k.done_prefix(), kv.key()) {
                s.done.insert(n, kv.mod_revision());
            }
        }
        for kv in kvs(&ops[3]) {
            if let Some(n) = k.node_of(&k.membership_prefix(), kv.key()) {
                s.members.insert(n, text(kv));
            }
        }
        for kv in kvs(&ops[4]) {
            if let Some(n) = k.node_of(&k.departed_prefix(), kv.key()) {
                s.departed.insert(n, (text(kv), kv.mod_revision()));
            }
        }
        for kv in kvs(&ops[5]) {
            if let Some((n, _)) = k.arena_node_of(kv.key()) {
                *s.arenas.entry(n).or_default() += 1;
            }
        }
        for kv in kvs(&ops[6]) {
            if let Some(n) = k.node_of(&k.claim_prefix(), kv.key()) {
                s.claims.insert(n);
            }
        }
        for kv in kvs(&ops[7]) {
            if let Some(n) = k.node_of(&k.instance_prefix(), kv.key()) {
                s.instances.insert(n, text(kv));
            }
        }
        Ok((s, revision(&resp)))
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

    /// Everything `fenced status` shows, in one transaction.
    pub async fn status(&self) -> Result<Status> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.membership_prefix(), prefix()),
            TxnOp::get(k.generation_prefix(), prefix()),
            TxnOp::get(k.pending_prefix(), prefix()),
            TxnOp::get(k.done_prefix(), prefix()),
            TxnOp::get(k.claim_prefix(), prefix()),
            TxnOp::get(k.departed_prefix(), prefix_keys_only()),
            TxnOp::get(format!("{}arena_owner/", k.root()), prefix()),
            TxnOp::get(k.arena_free_prefix(), prefix_keys_only()),
            TxnOp::get(
                k.audit_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self.txn("status", txn).await?;
        let ops = resp.op_responses();
        let tail = |prefix: String, kv: &KeyValue| {
            String::from_utf8_lossy(kv.key())
                .strip_prefix(&prefix)
                .unwrap_or_default()
                .to_owned()
        };
        let pairs = |i: usize, prefix: String| -> Vec<(String, String)> {
            kvs(&ops[i])
                .iter()
                .map(|kv| (tail(prefix.clone(), kv), text(kv)))
                .collect()
        };
        let nums = |i: usize, prefix: String| -> Vec<(String, u64)> {
            kvs(&ops[i])
                .iter()
                .map(|kv| (tail(prefix.clone(), kv), parse_u64(kv).unwrap_or(0)))
                .collect()
        };
        Ok(Status {
            members: pairs(0, k.membership_prefix()),
            generations: nums(1, k.generation_prefix()),
            owed: pairs(2, k.pending_prefix()),
            done: nums(3, k.done_prefix()),
            claims: pairs(4, k.claim_prefix()),
            departed: kvs(&ops[5])
                .iter()
                .map(|kv| tail(k.departed_prefix(), kv))
                .collect(),
            arenas: pairs(6, format!("{}arena_owner/", k.root())),
            free_arenas: kvs(&ops[7])
                .iter()
                .map(|kv| tail(k.arena_free_prefix(), kv))
                .collect(),
            audit_records: count(&ops[8]),
        })
    }
}
