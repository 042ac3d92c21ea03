//! The agent's transactions: join, depart, leases, generation, liveness, and the
//! membership watch.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp, WatchOptions,
    WatchStream,
};

use super::{EtcdStore, Result, StoreError, absent, kvs, parse_u64, revision};
use crate::core::attest::LivenessRecord;
use crate::node::NodeId;

/// The result of a join transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    /// `create_revision` of our `membership/<node>`: the departure and arena claims
    /// are conditioned on it (our membership, still live).
    pub membership_rev: i64,
    /// Our generation when we joined.
    pub generation: u64,
}

impl EtcdStore {
    /// Grants a lease of `ttl`.
    pub async fn grant(&self, ttl: Duration) -> Result<i64> {
        self.rt();
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let r = self
            .client()
            .lease_grant(secs, None)
            .await
            .map_err(|e| StoreError::classify("lease_grant", e))?;
        Ok(r.id())
    }

    /// Revokes a lease (deleting every key bound to it).
    pub async fn revoke(&self, lease: i64) -> Result<()> {
        self.rt();
        self.client()
            .lease_revoke(lease)
            .await
            .map_err(|e| StoreError::classify("lease_revoke", e))?;
        Ok(())
    }

    /// Opens a keepalive stream for `lease`.
    pub async fn keep_alive(&self, lease: i64) -> Result<(LeaseKeeper, LeaseKeepAliveStream)> {
        self.rt();
        self.client()
            .lease_keep_alive(lease)
            .await
            .map_err(|e| StoreError::classify("lease_keep_alive", e))
    }

    /// Remaining TTL of `lease` in seconds (<= 0: gone). etcd-client reports an expired
    /// lease on the keepalive stream only as a string, so the agent asks directly.
    pub async fn lease_ttl(&self, lease: i64) -> Result<i64> {
        self.rt();
        let r = self
            .client()
            .lease_time_to_live(lease, None)
            .await
            .map_err(|e| StoreError::classify("lease_time_to_live", e))?;
        Ok(r.ttl())
    }

    /// Opens the membership watch from `start_rev` (0: from now), with previous values
    /// (the instance id of a deleted member).
    pub async fn watch_membership(&self, start_rev: i64) -> Result<WatchStream> {
        self.rt();
        let mut opts = WatchOptions::new().with_prefix().with_prev_key();
        if start_rev > 0 {
            opts = opts.with_start_revision(start_rev);
        }
        self.client()
            .watch(self.keys.membership_prefix(), Some(opts))
            .await
            .map_err(|e| StoreError::classify("watch", e))
    }

    /// `join`: `membership/<node>` on `lease` (value = instance id), dropping a stale
    /// intent, mark and departure marker, reading our generation. Refused (returns
    /// `None`) while a controller holds a fence claim on us or we are already a member.
    pub async fn join(&self, node: &NodeId, instance: &str, lease: i64) -> Result<Option<Joined>> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![absent(k.claim(node)), absent(k.membership(node))])
            .and_then(vec![
                TxnOp::put(
                    k.membership(node),
                    instance,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::delete(k.pending(node), None),
                TxnOp::delete(k.done(node), None),
                TxnOp::delete(k.departed(node), None),
                TxnOp::get(k.generation(node), None),
                TxnOp::put(k.instance(node), instance, None),
            ]);
        let resp = self.txn("join", txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let membership_rev = revision(&resp);
        let ops = resp.op_responses();
        let generation = match kvs(&ops[4]).first() {
            Some(kv) => parse_u64(kv)?,
            None => {
                // First join ever: make the node known to the sweep by `gen/`.
                let txn = Txn::new()
                    .when(vec![absent(k.generation(node))])
                    .and_then(vec![TxnOp::put(k.generation(node), "0", None)]);
                self.txn("join", txn).await?;
                0
            }
        };
        Ok(Some(Joined {
            membership_rev,
            generation,
        }))
    }

    /// `read_own_generation` (and anyone's): the generation and its mod revision.
    pub async fn generation(&self, node: &NodeId) -> Result<(u64, i64)> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.generation(node), None)
            .await
            .map_err(|e| StoreError::classify("read_generation", e))?;
        match r.kvs().first() {
            Some(kv) => Ok((parse_u64(kv)?, kv.mod_revision())),
            None => Ok((0, 0)),
        }
    }

    /// Records the agent's liveness at a lease renewal: the lease it renews and how
    /// long it can outlive it ([`LivenessRecord`]), so `fenced attest` judges
    /// freshness by asking etcd about the lease, not by reading this host's clock.
    pub async fn put_liveness(&self, node: &NodeId, record: &LivenessRecord) -> Result<()> {
        self.rt();
        self.client()
            .put(self.keys.liveness(node), record.encode(), None)
            .await
            .map_err(|e| StoreError::classify("liveness", e))?;
        Ok(())
    }

    /// Is `membership/<node>` still ours (created at `membership_rev`)?
    pub async fn is_member(&self, node: &NodeId, membership_rev: i64) -> Result<bool> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.membership(node), None)
            .await
            .map_err(|e| StoreError::classify("membership", e))?;
        Ok(r.kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == membership_rev))
    }

    /// `depart`: one transaction conditioned on our own live membership puts
    /// `departed/<node>` and deletes `membership/<node>`. `false`: not a member any more
    /// (a node whose lease expired cannot exempt itself).
    pub async fn depart(&self, node: &NodeId, instance: &str, membership_rev: i64) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.membership(node),
                CompareOp::Equal,
                membership_rev,
            )])
            .and_then(vec![
                TxnOp::put(k.departed(node), instance, None),
                TxnOp::delete(k.membership(node), None),
            ]);
        Ok(self.txn("depart", txn).await?.succeeded())
    }
}
