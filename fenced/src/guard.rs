//! The generation guard, from the `generation-guard` crate (which needs only
//! `etcd-client`, so storage tools can use it without the daemon's dependencies),
//! with fenced's key layout as its [`GenerationKey`].
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

pub use generation_guard::{GenerationGuard, GenerationKey};

use crate::keys::Keys;

impl GenerationKey for Keys {
    /// `<root>gen/<node>`, the same key as [`Keys::generation`] (pinned by a test).
    fn generation_key(&self, node: &str) -> String {
        generation_guard::generation_key(self.root(), node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeId;

    #[test]
    fn guard_compares_the_key_the_store_bumps() {
        for root in ["/fenced/", "/fenced", "/a/b/"] {
            let keys = Keys::new(root);
            let node = NodeId::new("n1").unwrap();
            let g = GenerationGuard::new(&keys, &node, 7);
            assert_eq!(g.key(), keys.generation(&node), "{root}");
            assert_eq!(g.generation(), 7);
        }
    }
}
