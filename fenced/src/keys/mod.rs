//! The etcd key layout, under a configurable root (DESIGN.md, seed 000).
//!
//! ```text
//! <root>/membership/<node>            lease-bound, value = instance id
//! <root>/gen/<node>                   decimal generation
//! <root>/fence_pending/<node>         durable intent, value = instance id (may be empty)
//! <root>/fence_claim/<node>           create-only, lease-bound, value = controller id
//! <root>/fence_done/<node>            generation the fence bumped the node to
//! <root>/departed/<node>              departure marker, value = instance id
//! <root>/arena_pool/<arena>           the arena exists (seeded; never deleted by a claim)
//! <root>/arena_claim/<arena>/<node>   the node's claim: created only while no key
//!                                     under arena_claim/<arena>/ exists (one owner)
//! <root>/arena_node/<node>/<arena>    index: arenas a node owns (one range read)
//! <root>/audit/<node>/<generation>    JSON audit record of each fence
//! <root>/liveness/<node>              JSON: the lease the agent renews, its TTL, margin;
//!                                     written at start, refreshed every 30 s
//! <root>/instance/<node>              instance id the node last joined with
//! <root>/boot/<node>                  JSON: boot id and generation of the last join
//! <root>/namespace                    create-only, JSON identity of the shared
//!                                     namespace (its kind: UUID, NGUID, EUI-64 or
//!                                     vid-serial-model-nsid; subsystem NQN)
//! <root>/controller/live/<id>         a running controller's presence, bound to its
//!                                     lease; value = the node it runs on (may be empty)
//! <root>/controller/sweep_done        id of the controller that last completed a full
//!                                     sweep (its mod revision dates the sweep)
//! ```
//!
//! An arena is free when it is in the pool and no claim names it. A claim key names
//! its node, so etcd's RBAC can grant a node exactly its own claims
//! (`arena_claim/<arena>/<node>` for each arena, `crate::store::roles`), while the claim
//! transaction's compare on the whole `arena_claim/<arena>/` range keeps one owner per
//! arena. The layout before it (`arena_owner/<arena>` = owner, `arena_free/<arena>`)
//! named those keys by arena only, so every node had to write every arena's; such
//! records are converted by `--seed-arenas` and refused by `fenced run` otherwise
//! (`crate::store::arenas`).
//!
//! `controller/` is read by the controllers only (one watch each): it orders who
//! claims a death first and who sweeps (`core::Roster`), never who may.
//!
//! Everything read back from etcd is decoded by the functions of `keys/decode.rs`
//! (`decode_*`, re-exported here) and the key parsers of [`Keys`], each returning a
//! typed [`Malformed`] instead of guessing: a value another tool, an operator or a bug
//! wrote must never stop the sweep for every other node, nor be taken for something
//! it does not say.

mod decode;

pub use decode::{
    MAX_ID_TEXT, Malformed, decode_arena_name, decode_id_text, decode_node_id, decode_u64, shown,
};

use crate::node::NodeId;

/// Where an `audit/` key points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditKey {
    /// The fenced (or unfenced) node.
    pub node: NodeId,
    /// The generation the fence bumped the node to, or (a failed attempt, an unfence)
    /// the generation it found.
    pub generation: u64,
    /// What the record is, from the key's suffix.
    pub kind: AuditKind,
}

/// What an audit record records, named by its key's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditKind {
    /// `<generation>`: a fence that bumped the generation.
    Fence,
    /// `<generation>.failed.<ms>`: an attempt that could not be confirmed (decided at
    /// Unix milliseconds `unix_ms`).
    Failed {
        /// Unix milliseconds of the decision.
        unix_ms: u64,
    },
    /// `<generation>.unfence.<ms>`: an operator's `fenced unfence` (at `unix_ms`).
    Unfence {
        /// Unix milliseconds of the unfence.
        unix_ms: u64,
    },
}

impl AuditKind {
    /// The word `fenced audit` and its JSON use: `fence`, `failed` or `unfence`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fence => "fence",
            Self::Failed { .. } => "failed",
            Self::Unfence { .. } => "unfence",
        }
    }
}

/// A key under `controller/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerKey {
    /// `controller/live/<id>`.
    Live(String),
    /// `controller/sweep_done`.
    SweepDone,
}

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
        /// `liveness/<node>`: the lease the agent renews, its TTL and self-fence margin
        /// (`core::attest::LivenessRecord`, JSON), written when the agent starts and
        /// refreshed every 30 s (older versions: at each renewal). The lease, not this
        /// record, proves the node alive.
        liveness, liveness_prefix, "liveness"
    );

    node_key!(
        /// `instance/<node>`: the instance id the node last joined with. It has no
        /// lease, so a sweep that finds the node already gone (its membership value
        /// lost with it) still knows which attachment an EBS fence must detach.
        instance, instance_prefix, "instance"
    );

    node_key!(
        /// `boot/<node>`: the host's boot id and the node's generation at its last
        /// join (or at `fenced unfence`). A start on the same boot whose generation
        /// moved past it was fenced since: it is refused (`crate::agent::boot`).
        boot, boot_prefix, "boot"
    );

    /// `controller/`: presence of the controllers and the sweep stamp (one watch).
    pub fn controller_prefix(&self) -> String {
        format!("{}controller/", self.root)
    }
    /// `controller/live/<id>`: controller `id` runs (lease-bound).
    pub fn controller_live(&self, id: &str) -> String {
        format!("{}controller/live/{id}", self.root)
    }
    /// `controller/sweep_done`: who completed the last full sweep.
    pub fn sweep_done(&self) -> String {
        format!("{}controller/sweep_done", self.root)
    }

    /// What a key under `controller/` is. Controller ids may contain `/` (they are
    /// `<node>/<instance>`): everything after `live/` is the id.
    pub fn decode_controller_key(&self, key: &[u8]) -> Result<ControllerKey, Malformed> {
        let key = std::str::from_utf8(key).map_err(|_| Malformed::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(&self.controller_prefix())
            .ok_or(Malformed::MissingSegment { what: "prefix" })?;
        if rest == "sweep_done" {
            return Ok(ControllerKey::SweepDone);
        }
        let id = rest
            .strip_prefix("live/")
            .ok_or(Malformed::MissingSegment {
                what: "controller id",
            })?;
        if id.is_empty() {
            return Err(Malformed::MissingSegment {
                what: "controller id",
            });
        }
        decode_id_text("controller id", id.as_bytes()).map(ControllerKey::Live)
    }

    /// `arena_pool/<arena>`: the arena exists (free when no claim names it).
    pub fn arena_pool(&self, arena: &str) -> String {
        format!("{}arena_pool/{arena}", self.root)
    }
    /// `arena_pool/`: every arena.
    pub fn arena_pool_prefix(&self) -> String {
        format!("{}arena_pool/", self.root)
    }
    /// `arena_claim/<arena>/<node>`: `node`'s claim of `arena`.
    pub fn arena_claim(&self, arena: &str, node: &NodeId) -> String {
        format!("{}arena_claim/{arena}/{node}", self.root)
    }
    /// `arena_claim/<arena>/`: every claim of one arena (a claim is created only while
    /// this range is empty).
    pub fn arena_claims_of(&self, arena: &str) -> String {
        format!("{}arena_claim/{arena}/", self.root)
    }
    /// `arena_claim/`: every claim.
    pub fn arena_claim_prefix(&self) -> String {
        format!("{}arena_claim/", self.root)
    }
    /// `arena_owner/<arena>` of the layout before per-node claims (converted by
    /// `--seed-arenas`, never written).
    pub fn legacy_arena_owner(&self, arena: &str) -> String {
        format!("{}arena_owner/{arena}", self.root)
    }
    /// `arena_owner/` of the layout before per-node claims.
    pub fn legacy_arena_owner_prefix(&self) -> String {
        format!("{}arena_owner/", self.root)
    }
    /// `arena_free/<arena>` of the layout before per-node claims.
    pub fn legacy_arena_free(&self, arena: &str) -> String {
        format!("{}arena_free/{arena}", self.root)
    }
    /// `arena_free/` of the layout before per-node claims.
    pub fn legacy_arena_free_prefix(&self) -> String {
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
    /// `audit/<node>/<generation:020>.unfence.<unix_ms>`: an operator's unfence of a
    /// node at `generation`.
    pub fn audit_unfence(&self, node: &NodeId, generation: u64, unix_ms: u64) -> String {
        format!("{}.unfence.{unix_ms}", self.audit(node, generation))
    }
    /// `audit/`: every audit record.
    pub fn audit_prefix(&self) -> String {
        format!("{}audit/", self.root)
    }

    /// The node id at the end of `key` when it lies directly under `prefix`.
    pub fn node_of(&self, prefix: &str, key: &[u8]) -> Option<NodeId> {
        self.decode_node_key(prefix, key).ok()
    }

    /// The node id of a key under `prefix` (`<prefix><node>`), or why it names none.
    /// A key not under `prefix` at all is [`Malformed::MissingSegment`].
    pub fn decode_node_key(&self, prefix: &str, key: &[u8]) -> Result<NodeId, Malformed> {
        let key = std::str::from_utf8(key).map_err(|_| Malformed::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(prefix)
            .ok_or(Malformed::MissingSegment { what: "prefix" })?;
        if let Some((node, extra)) = rest.split_once('/') {
            NodeId::new(node).map_err(Malformed::KeyNode)?;
            return Err(Malformed::ExtraSegment {
                after: "node id",
                segment: shown(extra.as_bytes()),
            });
        }
        NodeId::new(rest).map_err(Malformed::KeyNode)
    }

    /// `(node, arena)` of an `arena_node/<node>/<arena>` key.
    pub fn arena_node_of(&self, key: &[u8]) -> Option<(NodeId, String)> {
        let (node, arena) = self.decode_arena_node_key(key).ok()?;
        Some((node, arena.ok()?))
    }

    /// `(node, arena)` of an `arena_node/<node>/<arena>` key. The outer error: no node
    /// can be named. The inner one: the node is named but the arena part is malformed
    /// (the sweep still counts it as an arena the node owns: when in doubt, fence).
    #[allow(clippy::type_complexity)]
    pub fn decode_arena_node_key(
        &self,
        key: &[u8],
    ) -> Result<(NodeId, Result<String, Malformed>), Malformed> {
        let key = std::str::from_utf8(key).map_err(|_| Malformed::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(&self.arena_node_all_prefix())
            .ok_or(Malformed::MissingSegment { what: "prefix" })?;
        let (node, arena) = rest
            .split_once('/')
            .ok_or(Malformed::MissingSegment { what: "arena" })?;
        let node = NodeId::new(node).map_err(Malformed::KeyNode)?;
        let arena = match arena.split_once('/') {
            Some((_, extra)) => Err(Malformed::ExtraSegment {
                after: "arena",
                segment: shown(extra.as_bytes()),
            }),
            None => decode_arena_name(arena).map(str::to_owned),
        };
        Ok((node, arena))
    }

    /// The arena named by a key under `prefix` (`arena_pool/`; the older layout's
    /// `arena_owner/`, `arena_free/`).
    pub fn decode_arena_key(&self, prefix: &str, key: &[u8]) -> Result<String, Malformed> {
        let key = std::str::from_utf8(key).map_err(|_| Malformed::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(prefix)
            .ok_or(Malformed::MissingSegment { what: "prefix" })?;
        if let Some((_, extra)) = rest.split_once('/') {
            return Err(Malformed::ExtraSegment {
                after: "arena",
                segment: shown(extra.as_bytes()),
            });
        }
        decode_arena_name(rest).map(str::to_owned)
    }

    /// `(arena, node)` of an `arena_claim/<arena>/<node>` key.
    pub fn decode_arena_claim_key(&self, key: &[u8]) -> Result<(String, NodeId), Malformed> {
        let key = std::str::from_utf8(key).map_err(|_| Malformed::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(&self.arena_claim_prefix())
            .ok_or(Malformed::MissingSegment { what: "prefix" })?;
        let (arena, node) = rest
            .split_once('/')
            .ok_or(Malformed::MissingSegment { what: "node id" })?;
        let arena = decode_arena_name(arena)?.to_owned();
        if let Some((node, extra)) = node.split_once('/') {
            NodeId::new(node).map_err(Malformed::KeyNode)?;
            return Err(Malformed::ExtraSegment {
                after: "node id",
                segment: shown(extra.as_bytes()),
            });
        }
        Ok((arena, NodeId::new(node).map_err(Malformed::KeyNode)?))
    }

    /// `audit/<node>/<generation:020>`, `audit/<node>/<generation:020>.failed.<ms>` or
    /// `audit/<node>/<generation:020>.unfence.<ms>`.
    pub fn decode_audit_key(&self, key: &[u8]) -> Result<AuditKey, Malformed> {
        let key = std::str::from_utf8(key).map_err(|_| Malformed::KeyNotUtf8)?;
        let rest = key
            .strip_prefix(&self.audit_prefix())
            .ok_or(Malformed::MissingSegment { what: "prefix" })?;
        let (node, tail) = rest
            .split_once('/')
            .ok_or(Malformed::MissingSegment { what: "generation" })?;
        let node = NodeId::new(node).map_err(Malformed::KeyNode)?;
        let (generation, kind) = if let Some((g, ms)) = tail.split_once(".failed.") {
            let unix_ms = decode_u64("failure time", ms.as_bytes())?;
            (g, AuditKind::Failed { unix_ms })
        } else if let Some((g, ms)) = tail.split_once(".unfence.") {
            let unix_ms = decode_u64("unfence time", ms.as_bytes())?;
            (g, AuditKind::Unfence { unix_ms })
        } else {
            (tail, AuditKind::Fence)
        };
        Ok(AuditKey {
            node,
            generation: decode_u64("generation", generation.as_bytes())?,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::InvalidNodeId;

    #[test]
    fn controller_keys_parse_back() {
        let k = Keys::new("/fenced");
        assert_eq!(
            k.controller_live("n1/i-1"),
            "/fenced/controller/live/n1/i-1"
        );
        assert_eq!(
            k.decode_controller_key(k.controller_live("n1/i-1").as_bytes()),
            Ok(ControllerKey::Live("n1/i-1".into()))
        );
        assert_eq!(
            k.decode_controller_key(k.sweep_done().as_bytes()),
            Ok(ControllerKey::SweepDone)
        );
        assert!(k.sweep_done().starts_with(&k.controller_prefix()));
        for bad in [
            "/fenced/controller/live/",
            "/fenced/controller/other",
            "/fenced/controller/live/a b",
            "/fenced/membership/n1",
        ] {
            assert!(k.decode_controller_key(bad.as_bytes()).is_err(), "{bad}");
        }
    }

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
        assert_eq!(k.boot(&n), "/fenced/boot/n1");
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

    #[test]
    fn keys_with_extra_segments_or_bad_nodes_are_named() {
        let k = Keys::new("/r");
        let p = k.generation_prefix();
        assert_eq!(
            k.decode_node_key(&p, b"/r/gen/n1"),
            Ok(NodeId::new("n1").unwrap())
        );
        assert!(matches!(
            k.decode_node_key(&p, b"/r/gen/n1/x"),
            Err(Malformed::ExtraSegment { .. })
        ));
        assert!(matches!(
            k.decode_node_key(&p, b"/r/gen/"),
            Err(Malformed::KeyNode(InvalidNodeId::Empty))
        ));
        assert!(matches!(
            k.decode_node_key(&p, b"/r/gen/\xff"),
            Err(Malformed::KeyNotUtf8)
        ));
        let (n, a) = k.decode_arena_node_key(b"/r/arena_node/n1/a/b").unwrap();
        assert_eq!(n.as_str(), "n1");
        assert!(matches!(a, Err(Malformed::ExtraSegment { .. })));
        assert!(k.decode_arena_node_key(b"/r/arena_node/n1").is_err());
        assert_eq!(
            k.decode_audit_key(b"/r/audit/n1/00000000000000000003"),
            Ok(AuditKey {
                node: NodeId::new("n1").unwrap(),
                generation: 3,
                kind: AuditKind::Fence
            })
        );
        assert_eq!(
            k.decode_audit_key(b"/r/audit/n1/00000000000000000002.failed.1700")
                .unwrap()
                .kind,
            AuditKind::Failed { unix_ms: 1700 }
        );
        // What `fenced unfence` writes reads back as an unfence (it was read as a
        // 42-byte generation, so `check` warned after every unfence).
        let unfence = k.audit_unfence(&NodeId::new("n1").unwrap(), 4, 1_700_000_000_123);
        assert_eq!(
            k.decode_audit_key(unfence.as_bytes()),
            Ok(AuditKey {
                node: NodeId::new("n1").unwrap(),
                generation: 4,
                kind: AuditKind::Unfence {
                    unix_ms: 1_700_000_000_123
                }
            })
        );
        assert!(
            k.decode_audit_key(b"/r/audit/n1/00000000000000000002.unfence.x")
                .is_err()
        );
        assert!(k.decode_audit_key(b"/r/audit/n1/x").is_err());
        assert!(
            k.decode_arena_key(&k.arena_pool_prefix(), b"/r/arena_pool/a/b")
                .is_err()
        );
        let n1 = NodeId::new("n1").unwrap();
        assert_eq!(
            k.decode_arena_claim_key(k.arena_claim("a7", &n1).as_bytes()),
            Ok(("a7".to_owned(), n1.clone()))
        );
        assert!(matches!(
            k.decode_arena_claim_key(b"/r/arena_claim/a7/n1/x"),
            Err(Malformed::ExtraSegment { .. })
        ));
        assert!(matches!(
            k.decode_arena_claim_key(b"/r/arena_claim/a7"),
            Err(Malformed::MissingSegment { .. })
        ));
        assert!(matches!(
            k.decode_arena_claim_key(b"/r/arena_claim/a 7/n1"),
            Err(Malformed::ArenaName { .. })
        ));
        // One arena's claim range holds no other arena's claims.
        assert!(
            !k.arena_claim("a70", &n1)
                .starts_with(&k.arena_claims_of("a7"))
        );
        assert!(
            k.arena_claim("a7", &n1)
                .starts_with(&k.arena_claims_of("a7"))
        );
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        /// Bytes that look like what could sit in etcd: anything, or text around the
        /// shapes the decoders accept.
        fn value() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                "[0-9+ -]{0,30}".prop_map(String::into_bytes),
                "[a-zA-Z0-9._:/@{}\"\n-]{0,300}".prop_map(String::into_bytes),
                any::<u64>().prop_map(|n| n.to_string().into_bytes()),
            ]
        }

        fn key(k: &Keys) -> impl Strategy<Value = Vec<u8>> {
            let root = k.root().to_owned();
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..80),
                (
                    prop::sample::select(vec![
                        "gen/",
                        "membership/",
                        "fence_pending/",
                        "fence_done/",
                        "fence_claim/",
                        "departed/",
                        "instance/",
                        "liveness/",
                        "arena_node/",
                        "arena_pool/",
                        "arena_claim/",
                        "arena_owner/",
                        "arena_free/",
                        "audit/",
                    ]),
                    "[a-z0-9./_ -]{0,40}",
                    proptest::collection::vec(any::<u8>(), 0..4),
                )
                    .prop_map(move |(p, tail, raw)| {
                        let mut b = format!("{root}{p}{tail}").into_bytes();
                        b.extend(raw);
                        b
                    }),
            ]
        }

        proptest! {
            /// Every value decoder returns a value or a typed error whose message is
            /// one line of bounded length, and what it accepts round-trips.
            #[test]
            fn value_decoders_never_panic(v in value()) {
                for r in [
                    decode_u64("generation", &v).map(|n| n.to_string()),
                    decode_id_text("instance id", &v),
                    decode_node_id(&v).map(|n| n.to_string()),
                ] {
                    match r {
                        Ok(s) => prop_assert!(s.len() <= MAX_ID_TEXT),
                        Err(e) => {
                            let m = e.to_string();
                            prop_assert!(!m.contains('\n') && m.len() < 400, "{}", m);
                        }
                    }
                }
                let s = shown(&v);
                prop_assert!(!s.contains('\n') && s.len() < 300, "{}", s);
                if let Ok(n) = decode_u64("generation", &v) {
                    prop_assert_eq!(decode_u64("generation", n.to_string().as_bytes()), Ok(n));
                }
                if let Ok(t) = decode_id_text("instance id", &v) {
                    prop_assert_eq!(t.as_bytes(), &v[..]);
                }
            }

            /// Every key parser returns a decoded key or a typed error, and a decoded
            /// node id re-encodes to the same key.
            #[test]
            fn key_decoders_never_panic(k in key(&Keys::new("/r/"))) {
                let keys = Keys::new("/r/");
                for p in [keys.generation_prefix(), keys.membership_prefix(), keys.pending_prefix()] {
                    if let Ok(n) = keys.decode_node_key(&p, &k) {
                        prop_assert_eq!(format!("{p}{n}").into_bytes(), k.clone());
                    }
                }
                if let Ok((n, Ok(a))) = keys.decode_arena_node_key(&k) {
                    prop_assert_eq!(keys.arena_node(&n, &a).into_bytes(), k.clone());
                }
                if let Ok(a) = keys.decode_arena_key(&keys.arena_pool_prefix(), &k) {
                    prop_assert_eq!(keys.arena_pool(&a).into_bytes(), k.clone());
                }
                if let Ok((a, n)) = keys.decode_arena_claim_key(&k) {
                    prop_assert_eq!(keys.arena_claim(&a, &n).into_bytes(), k.clone());
                }
                let _ = keys.decode_audit_key(&k);
            }
        }
    }
}
