//! The generation guard: other storage tools put it into every metadata transaction,
//! so that a fenced node's late metadata writes are refused.
//!
//! ```no_run
//! # async fn demo(mut client: etcd_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use etcd_client::TxnOp;
//! use fenced::{guard::GenerationGuard, keys::Keys, NodeId};
//!
//! let keys = Keys::new("/fenced");
//! let me = NodeId::new("n1")?;
//! // The generation this writer read when it joined (Agent::generation()).
//! let guard = GenerationGuard::new(&keys, &me, 4);
//! let txn = guard.txn(vec![TxnOp::put("/meta/inode/7", "extent 12", None)]);
//! let resp = client.txn(txn).await?;
//! if GenerationGuard::refused(&resp) {
//!     // We were fenced: stop writing, do not retry.
//! }
//! # Ok(()) }
//! ```

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};

use crate::keys::Keys;
use crate::node::NodeId;

/// "`gen/<node>` still equals the writer's generation".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationGuard {
    key: String,
    generation: u64,
}

impl GenerationGuard {
    /// The guard of `node` writing at `generation`.
    pub fn new(keys: &Keys, node: &NodeId, generation: u64) -> Self {
        Self {
            key: keys.generation(node),
            generation,
        }
    }

    /// The generation the writer holds.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The compare to add to a transaction.
    pub fn compare(&self) -> Compare {
        Compare::value(
            self.key.clone(),
            CompareOp::Equal,
            self.generation.to_string(),
        )
    }

    /// A transaction performing `ops` only while the writer's generation is current.
    pub fn txn(&self, ops: Vec<TxnOp>) -> Txn {
        self.txn_with(Vec::new(), ops)
    }

    /// Like [`txn`](Self::txn), with the caller's own compares added.
    pub fn txn_with(&self, mut compares: Vec<Compare>, ops: Vec<TxnOp>) -> Txn {
        compares.push(self.compare());
        Txn::new().when(compares).and_then(ops)
    }

    /// Whether a guarded transaction was refused. (With `txn_with`, a refusal may also
    /// be the caller's own compare.)
    pub fn refused(resp: &TxnResponse) -> bool {
        !resp.succeeded()
    }
}
