//! The controllers' own keys (`controller/`): each controller's presence, bound to its
//! lease, the sweep stamp, and the one-request check a standby makes before claiming
//! a death (see `core::duty`). These order who claims first and who sweeps; none of
//! them is read by a guard of the fence path.

use etcd_client::{EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions, WatchStream};

use super::{EtcdStore, Result, StoreError, count, kvs, prefix};
use crate::core::{FenceCheck, Roster, SweepStamp};
use crate::keys::{ControllerKey, Keys, decode_id_text};
use crate::node::NodeId;

/// The node a presence value names (`None`: empty, or not a node id: such a
/// controller is never left out of a death's order, which costs at most one request).
fn presence_node(value: &[u8]) -> Option<NodeId> {
    let text = std::str::from_utf8(value).ok()?;
    NodeId::new(text).ok()
}

/// The stamp a `controller/sweep_done` value and revision make (an unreadable writer
/// is shown escaped: it is only compared with this controller's own id).
fn stamp(value: &[u8], revision: i64) -> SweepStamp {
    SweepStamp {
        by: decode_id_text("controller id", value).unwrap_or_else(|_| crate::keys::shown(value)),
        revision,
    }
}

/// Applies one watch event under `controller/` to `roster`. Keys outside the layout
/// are ignored (logged at debug: they order nothing).
pub fn apply_controller_event(
    keys: &Keys,
    roster: &mut Roster,
    event: &etcd_client::Event,
) -> Option<()> {
    let kv = event.kv()?;
    let key = match keys.decode_controller_key(kv.key()) {
        Ok(k) => k,
        Err(e) => {
            tracing::debug!(key = %crate::keys::shown(kv.key()), error = %e, "key under controller/ ignored");
            return None;
        }
    };
    match (event.event_type(), key) {
        (EventType::Put, ControllerKey::Live(id)) => roster.put(id, presence_node(kv.value())),
        (EventType::Delete, ControllerKey::Live(id)) => roster.remove(&id),
        (EventType::Put, ControllerKey::SweepDone) => {
            roster.stamped(stamp(kv.value(), kv.mod_revision()));
        }
        (EventType::Delete, ControllerKey::SweepDone) => {}
    }
    Some(())
}

impl EtcdStore {
    /// Announces controller `id` (running on `node`, if any) with `lease`: the key goes
    /// with the lease.
    pub async fn announce_controller(
        &self,
        id: &str,
        node: Option<&NodeId>,
        lease: i64,
    ) -> Result<()> {
        self.rt();
        let value = node.map_or_else(String::new, |n| n.as_str().to_owned());
        self.client()
            .put(
                self.keys.controller_live(id),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(|e| StoreError::classify("announce_controller", e))?;
        Ok(())
    }

    /// The live controllers and the sweep stamp, one read, and its revision (the watch
    /// resumes after it).
    pub async fn roster(&self) -> Result<(Roster, i64)> {
        self.rt();
        let resp = self
            .client()
            .get(self.keys.controller_prefix(), prefix())
            .await
            .map_err(|e| StoreError::classify("roster", e))?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut live = Vec::new();
        let mut last = None;
        for kv in resp.kvs() {
            match self.keys.decode_controller_key(kv.key()) {
                Ok(ControllerKey::Live(id)) => live.push((id, presence_node(kv.value()))),
                Ok(ControllerKey::SweepDone) => last = Some(stamp(kv.value(), kv.mod_revision())),
                Err(e) => {
                    tracing::debug!(key = %crate::keys::shown(kv.key()), error = %e, "key under controller/ ignored");
                }
            }
        }
        Ok((Roster::listed(live, last), rev))
    }

    /// Watches `controller/` from `start_rev`.
    pub async fn watch_controllers(&self, start_rev: i64) -> Result<WatchStream> {
        self.rt();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(start_rev);
        self.client()
            .watch(self.keys.controller_prefix(), Some(opts))
            .await
            .map_err(|e| StoreError::classify("watch", e))
    }

    /// Stamps a completed full sweep by controller `id`.
    pub async fn stamp_sweep(&self, id: &str) -> Result<()> {
        self.rt();
        self.client()
            .put(self.keys.sweep_done(), id, None)
            .await
            .map_err(|e| StoreError::classify("stamp_sweep", e))?;
        Ok(())
    }

    /// A standby's check of `node` before it claims: claim, fence mark, departure
    /// marker and membership, one transaction (counts and revisions only).
    pub async fn fence_check(&self, node: &NodeId) -> Result<FenceCheck> {
        let k = &self.keys;
        let count_only = || Some(GetOptions::new().with_count_only());
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.claim(node), count_only()),
            TxnOp::get(k.done(node), keys_only()),
            TxnOp::get(k.departed(node), count_only()),
            TxnOp::get(k.membership(node), count_only()),
        ]);
        let resp = self.txn("fence_check", txn).await?;
        let ops = resp.op_responses();
        let n = |i: usize| ops.get(i).map_or(0, count);
        Ok(FenceCheck {
            claimed: n(0) > 0,
            done_rev: ops
                .get(1)
                .and_then(|o| kvs(o).first().map(etcd_client::KeyValue::mod_revision))
                .unwrap_or(0),
            departed: n(2) > 0,
            member: n(3) > 0,
        })
    }
}
