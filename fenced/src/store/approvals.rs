//! Two-person attested fences (`fenced attest --approvals 2`, `fenced approve`):
//! `approval/<node>/<identity>` holds one operator's request or approval (JSON:
//! identity, reason, Unix ms). Only the operator role writes it; the sweep and the
//! views never read it.

use etcd_client::{DeleteOptions, GetOptions};

use super::{EtcdStore, Result, StoreError};
use crate::node::NodeId;

/// One operator's request or approval of an attested fence.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Approval {
    /// The identity etcd authenticated (user or certificate CN).
    pub identity: String,
    /// Their out-of-band evidence, verbatim.
    pub reason: String,
    /// When it was written (Unix milliseconds).
    pub unix_ms: u64,
}

impl EtcdStore {
    fn approval_key(&self, node: &NodeId, identity: &str) -> String {
        format!("{}approval/{node}/{identity}", self.keys.root())
    }

    fn approval_prefix(&self, node: &NodeId) -> String {
        format!("{}approval/{node}/", self.keys.root())
    }

    /// Records `a` for `node` (replacing an earlier one of the same identity).
    pub async fn put_approval(&self, node: &NodeId, a: &Approval) -> Result<()> {
        self.rt();
        let value = serde_json::to_string(a).unwrap_or_default();
        self.client()
            .put(self.approval_key(node, &a.identity), value, None)
            .await
            .map_err(|e| StoreError::classify("put_approval", e))?;
        Ok(())
    }

    /// Every request and approval recorded for `node` (values that do not decode are
    /// skipped).
    pub async fn approvals(&self, node: &NodeId) -> Result<Vec<Approval>> {
        self.rt();
        let r = self
            .client()
            .get(
                self.approval_prefix(node),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| StoreError::classify("approvals", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect())
    }

    /// Drops every request and approval of `node` (the fence is done or abandoned).
    pub async fn clear_approvals(&self, node: &NodeId) -> Result<()> {
        self.rt();
        self.client()
            .delete(
                self.approval_prefix(node),
                Some(DeleteOptions::new().with_prefix()),
            )
            .await
            .map_err(|e| StoreError::classify("clear_approvals", e))?;
        Ok(())
    }
}
