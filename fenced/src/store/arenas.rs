//! The arena pool: arenas, per-node claims of them, adoption and release.
//!
//! An arena is free when `arena_pool/<arena>` exists and no key under
//! `arena_claim/<arena>/` does (layout: [`crate::keys`]). A node writes only its own
//! claim keys `arena_claim/<arena>/<node>` and its index `arena_node/<node>/`; the
//! claim is created in a transaction that compares the whole `arena_claim/<arena>/`
//! range empty, so an arena has at most one owner, and a release or a fence deletes
//! one node's claim, never another's.
//!
//! Records of the layout before per-node claims (`arena_owner/<arena>` = owner,
//! `arena_free/<arena>`) are converted by [`EtcdStore::add_free_arenas`] for the
//! arenas it is given (`--seed-arenas`), and [`EtcdStore::legacy_arenas`] lists what
//! is left, which `fenced run` refuses to start next to.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::{EtcdStore, Result, StoreError, absent, kvs, live_member, prefix, prefix_keys_only};
use crate::keys::{decode_arena_name, decode_node_id};
use crate::node::NodeId;

/// A well-formed arena record of the layout before per-node claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyArena {
    /// The key, as text.
    pub key: String,
    /// The arena it names.
    pub arena: String,
    /// The owner (`arena_owner/<arena>`); `None` for `arena_free/<arena>`.
    pub owner: Option<NodeId>,
    /// The key's mod revision (the conversion is conditioned on it).
    pub mod_revision: i64,
}

impl std::fmt::Display for LegacyArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some(o) => write!(f, "{} = {o}", self.key),
            None => write!(f, "{}", self.key),
        }
    }
}

/// The claim compare: no key under `arena_claim/<arena>/` (a range compare is true
/// when every key in the range matches, and when the range is empty).
fn unclaimed(claims_of: String) -> Compare {
    Compare::version(claims_of, CompareOp::Equal, 0).with_prefix()
}

impl EtcdStore {
    /// Puts arenas into the pool (`--seed-arenas`, administration, tests). An arena
    /// the older layout records (`arena_owner/<arena>`, `arena_free/<arena>`) is
    /// converted in the same transaction: its owner's claim is created (if no claim of
    /// the arena exists) and the old keys deleted, conditioned on their revisions. A
    /// conversion that loses a race is left as it was, for [`Self::legacy_arenas`] to
    /// report.
    pub async fn add_free_arenas(&self, arenas: &[String]) -> Result<()> {
        let legacy = self.legacy_arenas().await?;
        let k = &self.keys;
        for a in arenas {
            let mut when = Vec::new();
            let mut ops = vec![TxnOp::put(k.arena_pool(a), "", None)];
            for r in legacy.iter().filter(|r| &r.arena == a) {
                when.push(Compare::mod_revision(
                    r.key.clone(),
                    CompareOp::Equal,
                    r.mod_revision,
                ));
                ops.push(TxnOp::delete(r.key.clone(), None));
                if let Some(owner) = &r.owner {
                    when.push(unclaimed(k.arena_claims_of(a)));
                    ops.push(TxnOp::put(k.arena_claim(a, owner), "", None));
                    ops.push(TxnOp::put(k.arena_node(owner, a), "", None));
                }
            }
            if when.is_empty() {
                // Already in the pool: no rewrite (each start seeds again).
                when.push(absent(k.arena_pool(a)));
            } else {
                tracing::info!(step = "seed_arenas", arena = %a, "converting the arena's records of the layout before per-node claims");
            }
            let txn = Txn::new().when(when).and_then(ops);
            self.txn("add_free_arena", txn).await?;
        }
        Ok(())
    }

    /// The well-formed arena records of the layout before per-node claims (one
    /// transaction). Malformed ones are left to `fenced status`, which lists them.
    pub async fn legacy_arenas(&self) -> Result<Vec<LegacyArena>> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.legacy_arena_owner_prefix(), prefix()),
            TxnOp::get(k.legacy_arena_free_prefix(), prefix_keys_only()),
        ]);
        let resp = self.txn("legacy_arenas", txn).await?;
        let ops = resp.op_responses();
        let mut out = Vec::new();
        for (op, p, owned) in [
            (&ops[0], k.legacy_arena_owner_prefix(), true),
            (&ops[1], k.legacy_arena_free_prefix(), false),
        ] {
            for kv in kvs(op) {
                let Ok(arena) = k.decode_arena_key(&p, kv.key()) else {
                    continue;
                };
                let owner = if owned {
                    match decode_node_id(kv.value()) {
                        Ok(o) => Some(o),
                        Err(_) => continue,
                    }
                } else {
                    None
                };
                out.push(LegacyArena {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    arena,
                    owner,
                    mod_revision: kv.mod_revision(),
                });
            }
        }
        Ok(out)
    }

    /// `claim_arena`: create-only claim of a free arena, conditioned on our live
    /// membership, the arena being in the pool, no claim of it by anyone, and no
    /// owner in the older layout. Returns whether we got it. Writes only our own keys.
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
                Compare::version(k.arena_pool(arena), CompareOp::Greater, 0),
                unclaimed(k.arena_claims_of(arena)),
                absent(k.legacy_arena_owner(arena)),
            ])
            .and_then(vec![
                TxnOp::put(k.arena_claim(arena, node), "", None),
                TxnOp::put(k.arena_node(node, arena), "", None),
            ]);
        Ok(self.txn("claim_arena", txn).await?.succeeded())
    }

    /// The free pool: arenas in the pool that no claim names (one transaction).
    pub async fn free_arenas(&self) -> Result<Vec<String>> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.arena_pool_prefix(), prefix_keys_only()),
            TxnOp::get(k.arena_claim_prefix(), prefix_keys_only()),
        ]);
        let resp = self.txn("free_arenas", txn).await?;
        let ops = resp.op_responses();
        let claimed: std::collections::HashSet<String> = kvs(&ops[1])
            .iter()
            .filter_map(|kv| k.decode_arena_claim_key(kv.key()).ok().map(|(a, _)| a))
            .collect();
        let pool = k.arena_pool_prefix();
        Ok(kvs(&ops[0])
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key()).ok()?.strip_prefix(&pool)?;
                decode_arena_name(name).ok().map(str::to_owned)
            })
            .filter(|a| !claimed.contains(a))
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

    /// `release_own_arenas`: gives one arena back (only if we own it): deletes our
    /// claim and our index entry, nothing of anyone else's.
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
                Compare::version(k.arena_claim(arena, node), CompareOp::Greater, 0),
            ])
            .and_then(vec![
                TxnOp::delete(k.arena_claim(arena, node), None),
                TxnOp::delete(k.arena_node(node, arena), None),
            ]);
        Ok(self.txn("release_arena", txn).await?.succeeded())
    }
}
