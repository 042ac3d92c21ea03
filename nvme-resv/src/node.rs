//! Node identifiers: one rule for which strings name a node, shared by every tool that
//! derives a reservation key from a node id ([`NodeId::key`], [`key_for_node`]) and by
//! `fenced`, which embeds the id in etcd keys.

use std::fmt;

use crate::{Key, key_for_node};

/// Longest node id accepted (a DNS label).
pub const MAX_NODE_ID_LEN: usize = 63;

/// A validated node id: 1..=63 characters from `[A-Za-z0-9._-]`, starting with an
/// alphanumeric character.
///
/// `fenced` embeds the id in etcd keys such as `membership/<node>` and in the prefix
/// `arena_node/<node>/`; a `/` (or an empty id) would let one node's keys fall under
/// another node's prefix, so such ids are refused up front rather than escaped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

/// Why a string is not a valid [`NodeId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidNodeId {
    /// The id is empty.
    #[error("invalid node id: empty")]
    Empty,
    /// The id is longer than [`MAX_NODE_ID_LEN`].
    #[error("invalid node id {id:?}: longer than {MAX_NODE_ID_LEN} characters")]
    TooLong {
        /// The refused id.
        id: String,
    },
    /// The id contains a character outside `[A-Za-z0-9._-]` or does not start with an
    /// alphanumeric character.
    #[error(
        "invalid node id {id:?}: character {ch:?} not allowed (use A-Z a-z 0-9 . _ -, starting with a letter or digit; keys must not be ambiguous)"
    )]
    BadChar {
        /// The refused id.
        id: String,
        /// The first offending character.
        ch: char,
    },
}

impl NodeId {
    /// Validates `id`.
    pub fn new(id: &str) -> Result<Self, InvalidNodeId> {
        if id.is_empty() {
            return Err(InvalidNodeId::Empty);
        }
        if id.len() > MAX_NODE_ID_LEN {
            return Err(InvalidNodeId::TooLong { id: id.to_owned() });
        }
        for (i, ch) in id.chars().enumerate() {
            let ok = ch.is_ascii_alphanumeric() || (i > 0 && matches!(ch, '.' | '_' | '-'));
            if !ok {
                return Err(InvalidNodeId::BadChar {
                    id: id.to_owned(),
                    ch,
                });
            }
        }
        Ok(Self(id.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This node's reservation key: [`key_for_node`] of the id.
    pub fn key(&self) -> Key {
        key_for_node(&self.0)
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for NodeId {
    type Err = InvalidNodeId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_ids() {
        for id in ["n1", "node-a", "ip-10-0-0-1.ec2.internal", "A_b"] {
            assert_eq!(NodeId::new(id).unwrap().as_str(), id);
        }
    }

    #[test]
    fn refuses_ambiguous_ids() {
        assert_eq!(NodeId::new(""), Err(InvalidNodeId::Empty));
        assert!(matches!(
            NodeId::new("a/b"),
            Err(InvalidNodeId::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            NodeId::new("-a"),
            Err(InvalidNodeId::BadChar { ch: '-', .. })
        ));
        assert!(matches!(
            NodeId::new("a b"),
            Err(InvalidNodeId::BadChar { ch: ' ', .. })
        ));
        assert!(matches!(
            NodeId::new(&"x".repeat(64)),
            Err(InvalidNodeId::TooLong { .. })
        ));
        let msg = NodeId::new("a/b").unwrap_err().to_string();
        assert!(msg.starts_with("invalid node id \"a/b\""), "{msg}");
    }

    #[test]
    fn key_is_key_for_node_of_the_id() {
        let id = NodeId::new("node-1").unwrap();
        assert_eq!(id.key(), key_for_node("node-1"));
        assert_eq!(id.key(), Key(0xe696_ecc2_2078_79c3));
    }
}
