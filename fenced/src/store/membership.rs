//! The agent's transactions: join, depart, leases, generation, liveness, and the
//! membership watch.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp, WatchOptions,
    WatchStream,
};

use super::{EtcdStore, Result, StoreError, absent, kvs, parse_u64, revision, text};
use crate::core::attest::LivenessRecord;
use crate::node::NodeId;

/// `boot/<node>`: which boot of the host the node last joined from, and the
/// generation it joined with (or that `fenced unfence` acknowledged).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BootRecord {
    /// The host's boot id (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// The node's generation at that join (or unfence).
    pub generation: u64,
    /// Who wrote it: [`BootRecord::BY_JOIN`], [`BootRecord::BY_UNFENCE`] or
    /// [`BootRecord::BY_LEAVE`].
    pub by: String,
}

impl BootRecord {
    /// Written by the agent's join.
    pub const BY_JOIN: &'static str = "join";
    /// Written by `fenced unfence`.
    pub const BY_UNFENCE: &'static str = "unfence";
    /// Written by the agent's departure transaction (a clean leave: the key was
    /// unregistered by the instance that registered it).
    pub const BY_LEAVE: &'static str = "leave";

    /// The record as stored.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "boot_id": self.boot_id,
            "generation": self.generation,
            "by": self.by,
        })
        .to_string()
    }
}

/// What a start reads before writing anything ([`EtcdStore::restart_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartState {
    /// `boot/<node>`, if the node ever joined with a boot id.
    pub boot: Option<BootRecord>,
    /// `mod_revision` of `boot/<node>` (0: absent).
    pub boot_rev: i64,
    /// `gen/<node>` (0 when absent).
    pub generation: u64,
    /// `mod_revision` of `gen/<node>` (0: absent, the node never joined).
    pub generation_rev: i64,
    /// `membership/<node>` is present.
    pub member: bool,
    /// The store revision of the read.
    pub revision: i64,
}

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

    /// What a start reads before it writes anything: the boot record of the node's last
    /// join, its generation (and that key's revision, which the join is conditioned on)
    /// and whether it is a member. One read; nothing is written.
    pub async fn restart_state(&self, node: &NodeId) -> Result<RestartState> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.boot(node), None),
            TxnOp::get(k.generation(node), None),
            TxnOp::get(k.membership(node), None),
        ]);
        let resp = self.txn("restart_state", txn).await?;
        let ops = resp.op_responses();
        let (boot, boot_rev) = match kvs(&ops[0]).first() {
            Some(kv) => (
                Some(
                    serde_json::from_slice::<BootRecord>(kv.value()).map_err(|e| {
                        StoreError::Malformed {
                            key: k.boot(node),
                            what: format!("{:?}: {e}", text(kv)),
                        }
                    })?,
                ),
                kv.mod_revision(),
            ),
            None => (None, 0),
        };
        let (generation, generation_rev) = match kvs(&ops[1]).first() {
            Some(kv) => (parse_u64(kv)?, kv.mod_revision()),
            None => (0, 0),
        };
        Ok(RestartState {
            boot,
            boot_rev,
            generation,
            generation_rev,
            member: !kvs(&ops[2]).is_empty(),
            revision: revision(&resp),
        })
    }

    /// `join`: `membership/<node>` on `lease` (value = instance id), dropping a stale
    /// intent, mark and departure marker, and recording `boot/<node>` (this host's boot
    /// id and the generation joined with) when `boot_id` is given. The generation is
    /// the one `seen` read: the join is conditioned on `gen/<node>` being unchanged
    /// since, so a fence completing between the restart check and the join refuses the
    /// join (the caller reads and checks again). Refused (returns `None`) while a
    /// controller holds a fence claim on us, we are already a member, or our generation
    /// moved.
    pub async fn join(
        &self,
        node: &NodeId,
        instance: &str,
        lease: i64,
        seen: &RestartState,
        boot_id: Option<&str>,
    ) -> Result<Option<Joined>> {
        let k = &self.keys;
        let mut ops = vec![
            TxnOp::put(
                k.membership(node),
                instance,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::delete(k.pending(node), None),
            TxnOp::delete(k.done(node), None),
            TxnOp::delete(k.departed(node), None),
            TxnOp::put(k.instance(node), instance, None),
        ];
        if seen.generation_rev == 0 {
            // First join ever: make the node known to the sweep by `gen/`.
            ops.push(TxnOp::put(k.generation(node), "0", None));
        }
        if let Some(boot_id) = boot_id {
            let record = BootRecord {
                boot_id: boot_id.to_owned(),
                generation: seen.generation,
                by: BootRecord::BY_JOIN.to_owned(),
            };
            ops.push(TxnOp::put(k.boot(node), record.to_json(), None));
        }
        let txn = Txn::new()
            .when(vec![
                absent(k.claim(node)),
                absent(k.membership(node)),
                Compare::mod_revision(k.generation(node), CompareOp::Equal, seen.generation_rev),
            ])
            .and_then(ops);
        let resp = self.txn("join", txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(Some(Joined {
            membership_rev: revision(&resp),
            generation: seen.generation,
        }))
    }

    /// `unfence` (operator): rewrites `boot/<node>` to the current generation and
    /// writes `audit_json` at `audit/<node>/<generation>.unfence.<unix_ms>`, in one
    /// transaction conditioned on what `seen` read (no membership, generation and boot
    /// record unchanged). `false`: something changed meanwhile, nothing written.
    pub async fn unfence(
        &self,
        node: &NodeId,
        seen: &RestartState,
        record: &BootRecord,
        unix_ms: u64,
        audit_json: String,
    ) -> Result<bool> {
        let k = &self.keys;
        let audit_key = k.audit_unfence(node, seen.generation, unix_ms);
        let txn = Txn::new()
            .when(vec![
                absent(k.membership(node)),
                Compare::mod_revision(k.generation(node), CompareOp::Equal, seen.generation_rev),
                Compare::mod_revision(k.boot(node), CompareOp::Equal, seen.boot_rev),
            ])
            .and_then(vec![
                TxnOp::put(k.boot(node), record.to_json(), None),
                TxnOp::put(audit_key, audit_json, None),
            ]);
        Ok(self.txn("unfence", txn).await?.succeeded())
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

    /// Records the agent's liveness record: the lease it renews and how long it can
    /// outlive it ([`LivenessRecord`]), so `fenced attest` judges freshness by asking
    /// etcd about the lease, not by reading this host's clock. Written at start and
    /// then every [`LivenessRecord::refresh_ms`], not at every renewal: each put is a
    /// new revision of history.
    pub async fn put_liveness(&self, node: &NodeId, record: &LivenessRecord) -> Result<()> {
        self.rt();
        self.client()
            .put(self.keys.liveness(node), record.encode(), None)
            .await
            .map_err(|e| StoreError::classify("liveness", e))?;
        Ok(())
    }

    /// Asks etcd whether this node may still write its own `liveness/<node>`, writing
    /// nothing: a transaction whose guard can never hold (a version below 0) and whose
    /// success branch puts the key. etcd checks the permission of every operation of
    /// both branches before it evaluates the guard, so a node whose role was revoked
    /// gets [`StoreError::Denied`]; otherwise the guard fails and no revision is made
    /// (it is still one raft entry, unlike a read, which would not see a write-only
    /// revocation nor one hidden by a controller role that reads the whole root).
    pub async fn check_own_write_permission(&self, node: &NodeId) -> Result<()> {
        let key = self.keys.liveness(node);
        let txn = Txn::new()
            .when(vec![Compare::version(key.clone(), CompareOp::Less, 0)])
            .and_then(vec![TxnOp::put(key, "", None)]);
        self.txn("write_permission", txn).await?;
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
    /// `departed/<node>` (and `boot/<node>` = `boot`, a [`BootRecord::BY_LEAVE`]
    /// record, when given) and deletes `membership/<node>`. `false`: not a member any
    /// more (a node whose lease expired cannot exempt itself, nor rewrite its record).
    pub async fn depart(
        &self,
        node: &NodeId,
        instance: &str,
        membership_rev: i64,
        boot: Option<&BootRecord>,
    ) -> Result<bool> {
        let k = &self.keys;
        let mut ops = vec![
            TxnOp::put(k.departed(node), instance, None),
            TxnOp::delete(k.membership(node), None),
        ];
        if let Some(b) = boot {
            ops.push(TxnOp::put(k.boot(node), b.to_json(), None));
        }
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.membership(node),
                CompareOp::Equal,
                membership_rev,
            )])
            .and_then(ops);
        Ok(self.txn("depart", txn).await?.succeeded())
    }
}
