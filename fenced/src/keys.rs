//! The etcd key layout, under a configurable root (DESIGN.md, seed 000).
//!
//! ```text
//! <root>/membership/<node>            lease-bound, value = instance id
//! <root>/gen/<node>                   decimal generation
//! <root>/fence_pending/<node>         durable intent, value = instance id (may be empty)
//! <root>/fence_claim/<node>           create-only, lease-bound, value = controller id
//! <root>/fence_done/<node>            generation the fence bumped the node to
//! <root>/departed/<node>              departure marker, value = instance id
//! <root>/arena_owner/<arena>          owner node id (create-only claim)
//! <root>/arena_node/<node>/<arena>    index: arenas a node owns (one range read)
//! <root>/arena_free/<arena>           free pool
//! <root>/audit/<node>/<generation>    JSON audit record of each fence
//! <root>/liveness/<node>              Unix ms of the agent's last lease renewal
//! <root>/namespace                    create-only, JSON identity of the shared
//!                                     namespace (NGUID, EUI-64, subsystem NQN)
//! ```

use crate::node::NodeId;

/// The key layout under one root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    root: String,
}

macro_rules! node_key {
    ($(#[$m:meta])* $name:ident, $prefix_fn:ident, $seg:literal) => {
        $(#[$m])*
        pub fn $name(&self, node: &NodeId) -> String {
            format!("{}{}/{}", self.root, $seg, node)
        }
        /// The prefix every key of this family starts with.
        pub fn $prefix_fn(&self) -> String {
            format!("{}{}/", self.root, $seg)
        }
    };
}

impl Keys {
    /// A layout under `root` (e.g. `/fenced/`); a trailing `/` is added when missing.
    pub fn new(root: &str) -> Self {
        let mut root = root.to_owned();
        if !root.ends_with('/') {
            root.push('/');
        }
        Self { root }
    }

    /// The root, ending in `/`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `namespace`: the identity of the shared namespace, recorded by the first join
    /// (create-only).
    pub fn namespace(&self) -> String {
        format!("{}namespace", self.root)
    }

    node_key!(
        /// `membership/<node>`: lease-bound, value = instance id.
        membership, membership_prefix, "membership"
    );
    node_key!(
        /// `gen/<node>`: the node's generation.
        generation, generation_prefix, "gen"
    );
    node_key!(
        /// `fence_pending/<node>`: the durable fence intent.
        pending, pending_prefix, "fence_pending"
    );
    node_key!(
        /// `fence_claim/<node>`: the lease-bound claim of one controller.
        claim, claim_prefix, "fence_claim"
    );
    node_key!(
        /// `fence_done/<node>`: the generation a completed fence bumped the node to.
        done, done_prefix, "fence_done"
    );
    node_key!(
        /// `departed/<node>`: the intentional-departure marker.
        departed, departed_prefix, "departed"
    );

    node_key!(
        /// `liveness/<node>`: Unix milliseconds of the agent's last lease renewal.
        liveness, liveness_prefix, "liveness"
    );

    node_key!(
        /// `instance/<node>`: the instance id the node last joined with. It has no
        /// lease, so a sweep that finds the node already gone (its membership value
        /// lost with it) still knows which attachment an EBS fence must detach.
        instance, instance_prefix, "instance"
    );

    /// `arena_owner/<arena>`: owner of one arena.
    pub fn arena_owner(&self, arena: &str) -> String {
        format!("{}arena_owner/{arena}", self.root)
    }
    /// `arena_free/<arena>`: the arena is in the free pool.
    pub fn arena_free(&self, arena: &str) -> String {
        format!("{}arena_free/{arena}", self.root)
    }
    /// The free-pool prefix.
    pub fn arena_free_prefix(&self) -> String {
        format!("{}arena_free/", self.root)
    }
    /// `arena_node/<node>/<arena>`: index of the arenas `node` owns.
    pub fn arena_node(&self, node: &NodeId, arena: &str) -> String {
        format!("{}arena_node/{node}/{arena}", self.root)
    }
    /// `arena_node/<node>/`: one range read lists every arena `node` owns.
    pub fn arena_node_prefix(&self, node: &NodeId) -> String {
        format!("{}arena_node/{node}/", self.root)
    }
    /// `arena_node/`: every node's arenas.
    pub fn arena_node_all_prefix(&self) -> String {
        format!("{}arena_node/", self.root)
    }
    /// `audit/<node>/<generation>` (zero-padded so keys sort by generation).
    pub fn audit(&self, node: &NodeId, generation: u64) -> String {
        format!("{}audit/{node}/{generation:020}", self.root)
    }
    /// `audit/`: every audit record.
    pub fn audit_prefix(&self) -> String {
        format!("{}audit/", self.root)
    }

    /// The node id at the end of `key` when it lies directly under `prefix`.
    pub fn node_of(&self, prefix: &str, key: &[u8]) -> Option<NodeId> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(prefix)?;
        NodeId::new(rest).ok()
    }

    /// `(node, arena)` of an `arena_node/<node>/<arena>` key.
    pub fn arena_node_of(&self, key: &[u8]) -> Option<(NodeId, String)> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.arena_node_all_prefix())?;
        let (node, arena) = rest.split_once('/')?;
        Some((NodeId::new(node).ok()?, arena.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_parse_back() {
        let k = Keys::new("/fenced");
        let n = NodeId::new("n1").unwrap();
        assert_eq!(k.membership(&n), "/fenced/membership/n1");
        assert_eq!(k.generation(&n), "/fenced/gen/n1");
        assert_eq!(k.pending(&n), "/fenced/fence_pending/n1");
        assert_eq!(k.claim(&n), "/fenced/fence_claim/n1");
        assert_eq!(k.done(&n), "/fenced/fence_done/n1");
        assert_eq!(k.departed(&n), "/fenced/departed/n1");
        assert_eq!(k.arena_node(&n, "a7"), "/fenced/arena_node/n1/a7");
        assert_eq!(k.audit(&n, 3), "/fenced/audit/n1/00000000000000000003");
        assert_eq!(
            k.node_of(&k.membership_prefix(), k.membership(&n).as_bytes()),
            Some(n.clone())
        );
        assert_eq!(
            k.arena_node_of(k.arena_node(&n, "a7").as_bytes()),
            Some((n, "a7".to_owned()))
        );
        // A node id is never a prefix of another node's arena index.
        let n10 = NodeId::new("n10").unwrap();
        assert!(
            !k.arena_node(&n10, "a")
                .starts_with(&k.arena_node_prefix(&NodeId::new("n1").unwrap()))
        );
    }
}
