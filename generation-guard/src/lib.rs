//! The generation guard: a storage tool puts it into every metadata transaction, so
//! that a fenced node's late metadata writes are refused.
//!
//! A fencing controller (such as `fenced`) keeps each node's generation at
//! `<root>gen/<node>` in etcd and increments it when it fences the node. A writer reads
//! its generation once (when it joins) and guards every metadata transaction with
//! "`gen/<node>` still equals my generation": after the node is fenced the compare
//! fails and the transaction does nothing.
//!
//! ```no_run
//! # async fn demo(mut client: etcd_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use etcd_client::TxnOp;
//! use generation_guard::GenerationGuard;
//!
//! // The generation this writer read when it joined.
//! let guard = GenerationGuard::new("/fenced/", "n1", 4);
//! let txn = guard.txn(vec![TxnOp::put("/meta/inode/7", "extent 12", None)]);
//! let resp = client.txn(txn).await?;
//! if GenerationGuard::refused(&resp) {
//!     // We were fenced: stop writing, do not retry.
//! }
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![deny(missing_docs)]

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnResponse};

/// The key segment under the root that holds the generations.
pub const GENERATION_SEGMENT: &str = "gen";

/// `<root>gen/<node>`, a `/` added after `root` when missing.
pub fn generation_key(root: &str, node: &str) -> String {
    let sep = if root.ends_with('/') { "" } else { "/" };
    format!("{root}{sep}{GENERATION_SEGMENT}/{node}")
}

/// Where a node's generation is kept: a root prefix (`str`, `String`: see
/// [`generation_key`]), or a key layout that owns its keys (e.g. fenced's `Keys`).
pub trait GenerationKey {
    /// The etcd key holding `node`'s generation.
    fn generation_key(&self, node: &str) -> String;
}

impl GenerationKey for str {
    fn generation_key(&self, node: &str) -> String {
        generation_key(self, node)
    }
}

impl GenerationKey for String {
    fn generation_key(&self, node: &str) -> String {
        generation_key(self, node)
    }
}

/// "`gen/<node>` still equals the writer's generation".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationGuard {
    key: String,
    generation: u64,
}

impl GenerationGuard {
    /// The guard of `node` writing at `generation`, its generation kept where `layout`
    /// says (a root prefix such as `"/fenced/"`, or a key layout).
    pub fn new(
        layout: &(impl GenerationKey + ?Sized),
        node: &(impl AsRef<str> + ?Sized),
        generation: u64,
    ) -> Self {
        Self::for_key(layout.generation_key(node.as_ref()), generation)
    }

    /// The guard comparing the value at `key` with `generation`.
    pub fn for_key(key: impl Into<String>, generation: u64) -> Self {
        Self {
            key: key.into(),
            generation,
        }
    }

    /// The etcd key compared.
    pub fn key(&self) -> &str {
        &self.key
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout_with_and_without_trailing_slash() {
        assert_eq!(generation_key("/fenced/", "n1"), "/fenced/gen/n1");
        assert_eq!(generation_key("/fenced", "n1"), "/fenced/gen/n1");
        let g = GenerationGuard::new("/fenced/", "n1", 4);
        assert_eq!((g.key(), g.generation()), ("/fenced/gen/n1", 4));
        assert_eq!(
            GenerationGuard::new(&String::from("/x"), "n2", 1).key(),
            "/x/gen/n2"
        );
    }

    #[test]
    fn compare_is_value_equal_to_the_decimal_generation() {
        // `Compare` has no `PartialEq`; its `Debug` shows every field.
        let dbg = |c: Compare| format!("{c:?}");
        let c = GenerationGuard::for_key("/fenced/gen/n1", 17).compare();
        assert_eq!(
            dbg(c.clone()),
            dbg(Compare::value("/fenced/gen/n1", CompareOp::Equal, "17"))
        );
        assert_ne!(
            dbg(c),
            dbg(Compare::value("/fenced/gen/n1", CompareOp::Equal, "18"))
        );
    }
}

/// The README's example, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
