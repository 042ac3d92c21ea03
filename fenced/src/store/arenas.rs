//! The arena pool: free arenas, claims of them, adoption and release.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{EtcdStore, Result, StoreError, absent, kvs, live_member, prefix_keys_only};
use crate::node::NodeId;

impl EtcdStore {
    /// Puts arenas into the free pool unless someone owns them (administration, tests).
    pub async fn add_free_arenas(&self, arenas: &[String]) -> Result<()> {
        for a in arenas {
            let txn = Txn::new()
                .when(vec![absent(self.keys.arena_owner(a))])
                .and_then(vec![TxnOp::put(self.keys.arena_free(a), "", None)]);
            self.txn("add_free_arena", txn).await?;
        }
        Ok(())
    }

    /// `claim_arena`: create-only claim of a free arena, conditioned on our live
    /// membership. Returns whether we got it.
    pub async fn claim_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![
                live_member(k, node, membership_rev),
                Compare::version(k.arena_free(arena), CompareOp::Greater, 0),
                absent(k.arena_owner(arena)),
            ])
            .and_then(vec![
                TxnOp::delete(k.arena_free(arena), None),
                TxnOp::put(k.arena_owner(arena), node.as_str(), None),
                TxnOp::put(k.arena_node(node, arena), "", None),
            ]);
        Ok(self.txn("claim_arena", txn).await?.succeeded())
    }

    /// The free pool.
    pub async fn free_arenas(&self) -> Result<Vec<String>> {
        self.rt();
        let p = self.keys.arena_free_prefix();
        let r = self
            .client()
            .get(p.clone(), prefix_keys_only())
            .await
            .map_err(|e| StoreError::classify("free_arenas", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                std::str::from_utf8(kv.key())
                    .ok()?
                    .strip_prefix(&p)
                    .map(str::to_owned)
            })
            .collect())
    }

    /// The arenas the records say `node` owns, read in a transaction conditioned on
    /// our live membership (`None`: not a member any more). An agent adopts arenas
    /// from an earlier incarnation only this way, after `unfence`: a plain read could
    /// adopt an arena that a fence in flight (claimed while we were not a member) is
    /// about to free (found by the protocol model).
    pub async fn adopt_arenas(
        &self,
        node: &NodeId,
        membership_rev: i64,
    ) -> Result<Option<Vec<String>>> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![live_member(k, node, membership_rev)])
            .and_then(vec![TxnOp::get(
                k.arena_node_prefix(node),
                prefix_keys_only(),
            )]);
        let resp = self.txn("adopt_arenas", txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let ops = resp.op_responses();
        Ok(Some(
            kvs(&ops[0])
                .iter()
                .filter_map(|kv| k.arena_node_of(kv.key()).map(|(_, a)| a))
                .collect(),
        ))
    }

    /// The arenas the records say `node` owns (a plain read, for status and tests).
    pub async fn owned_arenas(&self, node: &NodeId) -> Result<Vec<String>> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.arena_node_prefix(node), prefix_keys_only())
            .await
            .map_err(|e| StoreError::classify("owned_arenas", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| self.keys.arena_node_of(kv.key()).map(|(_, a)| a))
            .collect())
    }

    /// `release_own_arenas`: gives one arena back (only if we own it).
    ///
    /// Conditioned on our live membership as well as on ownership: a node whose lease
    /// expired while it was leaving may already have been claimed for a fence that read
    /// this arena as ours and will free it after the bump; returning it ourselves now
    /// would let another node claim it first and then lose it under live writes (found
    /// by the protocol model, `fenced/tests/protocol_model.rs`).
    pub async fn release_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![
                live_member(k, node, membership_rev),
                Compare::value(k.arena_owner(arena), CompareOp::Equal, node.as_str()),
            ])
            .and_then(vec![
                TxnOp::delete(k.arena_owner(arena), None),
                TxnOp::delete(k.arena_node(node, arena), None),
                TxnOp::put(k.arena_free(arena), "", None),
            ]);
        Ok(self.txn("release_arena", txn).await?.succeeded())
    }
}
