//! The reads of the operator commands: what `fenced attest` judges one node by.

use etcd_client::{GetOptions, Txn, TxnOp};

use super::{EtcdStore, Result, count, kvs, parse_u64, revision, text};
use crate::core::attest::{AttestView, Liveness, LivenessRecord};
use crate::node::NodeId;

impl EtcdStore {
    /// Everything [`crate::core::attest::judge`] looks at for `node`: one read-only
    /// transaction over its records, then (when its liveness record names a lease)
    /// etcd's `LeaseTimeToLive` for that lease. Returns the view and the revision of
    /// the transaction. Writes nothing.
    pub async fn attest_view(&self, node: &NodeId) -> Result<(AttestView, i64)> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.generation(node), None),
            TxnOp::get(k.instance(node), None),
            TxnOp::get(k.membership(node), None),
            TxnOp::get(k.pending(node), None),
            TxnOp::get(k.done(node), None),
            TxnOp::get(k.departed(node), None),
            TxnOp::get(k.claim(node), None),
            TxnOp::get(k.liveness(node), None),
            TxnOp::get(
                k.arena_node_prefix(node),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self.txn("attest_view", txn).await?;
        let rev = revision(&resp);
        let ops = resp.op_responses();
        let one = |i: usize| kvs(&ops[i]).first();
        let known = (0..8).any(|i| one(i).is_some());
        let generation = one(0).map(parse_u64).transpose()?.unwrap_or(0);
        let done = match one(4) {
            Some(kv) => Some((parse_u64(kv)?, kv.mod_revision())),
            None => None,
        };
        let liveness = match one(7) {
            None => Liveness::Missing,
            Some(kv) => match LivenessRecord::parse(&text(kv)) {
                Err(why) => Liveness::Unjudgeable { why },
                Ok(record) => {
                    let ttl_left_s = match self.lease_ttl(record.lease).await {
                        Ok(t) => t,
                        // etcd answers TTL -1 for a lease it does not hold; a
                        // "lease not found" error says the same.
                        Err(e) if e.is_lease_gone() => -1,
                        Err(e) => return Err(e),
                    };
                    Liveness::Lease { record, ttl_left_s }
                }
            },
        };
        let view = AttestView {
            known,
            member: one(2).is_some(),
            claim: one(6).map(text),
            generation,
            pending: one(3).map(|kv| (text(kv), kv.mod_revision())),
            done,
            departed: one(5).map(|kv| (text(kv), kv.mod_revision())),
            instance: one(1).map(text),
            liveness,
            arenas: count(&ops[8]),
        };
        Ok((view, rev))
    }
}
