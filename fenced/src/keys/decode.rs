//! Decoding what is read back from etcd: every value and key segment goes through a
//! function here, which returns a typed [`Malformed`] instead of guessing (the key
//! layout that names what is decoded is in the parent module).

use crate::node::{InvalidNodeId, NodeId};

/// Longest identifier text (instance id, controller id) accepted from etcd.
pub const MAX_ID_TEXT: usize = 255;
/// Longest decimal number accepted from etcd (`u64::MAX` has 20 digits; a little room
/// for surrounding whitespace).
const MAX_NUMBER_TEXT: usize = 32;
/// How many characters of a bad value an error shows.
const SHOWN_CHARS: usize = 48;

/// Why a key or a value read back from etcd does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// The key is not UTF-8.
    #[error("key is not valid UTF-8")]
    KeyNotUtf8,
    /// The key's node segment is not a valid node id.
    #[error("key does not name a node: {0}")]
    KeyNode(#[source] InvalidNodeId),
    /// The key has a path segment where the layout has none.
    #[error("key has an unexpected path segment {segment} after the {after}")]
    ExtraSegment {
        /// What the key names before the extra segment (`node id`, `arena`).
        after: &'static str,
        /// The extra part, escaped and shortened.
        segment: String,
    },
    /// The key lacks a segment the layout has.
    #[error("key lacks its {what}")]
    MissingSegment {
        /// The missing part.
        what: &'static str,
    },
    /// A key or value segment names an arena with a character arena names do not use.
    #[error("arena name {name} is not valid: {why}")]
    ArenaName {
        /// The name, escaped and shortened.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// The value is not UTF-8.
    #[error("value is not valid UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 {
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// The value is longer than any value of this kind.
    #[error("value is {len} bytes, longer than the {max} a {what} may have")]
    TooLong {
        /// What the value should be.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value is not a decimal number that fits.
    #[error("value {value} is not a {what} (a decimal number 0..=18446744073709551615): {why}")]
    NotANumber {
        /// What the value should be.
        what: &'static str,
        /// The value, escaped and shortened.
        value: String,
        /// Why (`empty`, `not a digit`, `too large`).
        why: &'static str,
    },
    /// The value contains a character identifiers of this kind never contain.
    #[error(
        "value {value} is not a {what}: character {ch:?} not allowed (A-Z a-z 0-9 . _ - : / @)"
    )]
    BadChar {
        /// What the value should be.
        what: &'static str,
        /// The value, escaped and shortened.
        value: String,
        /// The first character refused.
        ch: char,
    },
    /// An arena record of the layout before per-node claims (`arena_owner/`,
    /// `arena_free/`).
    #[error(
        "arena record of the layout before per-node claims (now arena_pool/<arena> and arena_claim/<arena>/<node>)"
    )]
    LegacyArenaLayout,
    /// The value is not the JSON record fenced writes.
    #[error("value is not a {what}: {why}")]
    NotJson {
        /// What the value should be.
        what: &'static str,
        /// The JSON parser's reason.
        why: String,
    },
}

/// `bytes` as a quoted, escaped string of at most 48 characters (the rest
/// elided with its length), safe to put on one log line.
pub fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text.chars().take(SHOWN_CHARS).collect();
    let cut = out.len() < text.len();
    out = format!("\"{}\"", out.escape_debug());
    if cut {
        out.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    out
}

/// A decimal `u64` (a generation, a Unix millisecond time). Surrounding ASCII
/// whitespace is tolerated (`etcdctl put` by hand); signs, fractions, JSON and
/// anything above `u64::MAX` are not.
pub fn decode_u64(what: &'static str, value: &[u8]) -> Result<u64, Malformed> {
    if value.len() > MAX_NUMBER_TEXT {
        return Err(Malformed::TooLong {
            what,
            len: value.len(),
            max: MAX_NUMBER_TEXT,
        });
    }
    let text = std::str::from_utf8(value).map_err(|e| Malformed::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let digits = text.trim_ascii();
    let bad = |why| Malformed::NotANumber {
        what,
        value: shown(value),
        why,
    };
    if digits.is_empty() {
        return Err(bad("empty"));
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("not a digit"));
    }
    digits.parse().map_err(|_| bad("too large"))
}

/// An identifier written as text (instance id, controller id `node/instance`): at
/// most [`MAX_ID_TEXT`] bytes of `A-Z a-z 0-9 . _ - : / @` — the characters of node
/// ids, EC2 instance ids, machine ids and the controller ids built from them. Empty is
/// allowed (an instance id that was never known).
pub fn decode_id_text(what: &'static str, value: &[u8]) -> Result<String, Malformed> {
    if value.len() > MAX_ID_TEXT {
        return Err(Malformed::TooLong {
            what,
            len: value.len(),
            max: MAX_ID_TEXT,
        });
    }
    let text = std::str::from_utf8(value).map_err(|e| Malformed::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '@');
    match text.chars().find(|c| !allowed(*c)) {
        Some(ch) => Err(Malformed::BadChar {
            what,
            value: shown(value),
            ch,
        }),
        None => Ok(text.to_owned()),
    }
}

/// A node id written as a value (the older layout's `arena_owner/<arena>`).
pub fn decode_node_id(value: &[u8]) -> Result<NodeId, Malformed> {
    if value.len() > crate::node::MAX_NODE_ID_LEN {
        return Err(Malformed::TooLong {
            what: "node id",
            len: value.len(),
            max: crate::node::MAX_NODE_ID_LEN,
        });
    }
    let text = std::str::from_utf8(value).map_err(|e| Malformed::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    NodeId::new(text).map_err(Malformed::KeyNode)
}

/// An arena name: 1..=[`MAX_ID_TEXT`] bytes of `A-Z a-z 0-9 . _ -` (no `/`: the name
/// is the last segment of `arena_node/<node>/<arena>`).
pub fn decode_arena_name(name: &str) -> Result<&str, Malformed> {
    let bad = |why| Malformed::ArenaName {
        name: shown(name.as_bytes()),
        why,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > MAX_ID_TEXT {
        return Err(bad("too long"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(bad("character outside A-Z a-z 0-9 . _ -"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_decode_strictly() {
        assert_eq!(decode_u64("generation", b"0"), Ok(0));
        assert_eq!(decode_u64("generation", b" 42\n"), Ok(42));
        assert_eq!(
            decode_u64("generation", b"18446744073709551615"),
            Ok(u64::MAX)
        );
        for bad in [
            &b""[..],
            b"zz",
            b"-1",
            b"+1",
            b"1.5",
            b"18446744073709551616",
            b"{\"gen\":1}",
            b"\xff\xfe",
            &[b'7'; 100],
        ] {
            let e = decode_u64("generation", bad).unwrap_err();
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        assert!(matches!(
            decode_u64("generation", b"-1"),
            Err(Malformed::NotANumber {
                why: "not a digit",
                ..
            })
        ));
        assert!(matches!(
            decode_u64("generation", b"99999999999999999999"),
            Err(Malformed::NotANumber {
                why: "too large",
                ..
            })
        ));
    }

    #[test]
    fn id_text_refuses_json_control_characters_and_huge_values() {
        assert_eq!(
            decode_id_text("instance id", b"i-0abc"),
            Ok("i-0abc".into())
        );
        assert_eq!(decode_id_text("instance id", b""), Ok(String::new()));
        assert_eq!(
            decode_id_text("controller id", b"n1/i-1"),
            Ok("n1/i-1".into())
        );
        assert!(matches!(
            decode_id_text("instance id", b"{\"id\":1}"),
            Err(Malformed::BadChar { ch: '{', .. })
        ));
        assert!(matches!(
            decode_id_text("instance id", b"i-1\nforged log line"),
            Err(Malformed::BadChar { ch: '\n', .. })
        ));
        assert!(matches!(
            decode_id_text("instance id", &[b'a'; 4096]),
            Err(Malformed::TooLong { len: 4096, .. })
        ));
        assert!(matches!(
            decode_id_text("instance id", b"\xff"),
            Err(Malformed::NotUtf8 { offset: 0 })
        ));
    }

    #[test]
    fn shown_is_one_escaped_line_of_bounded_length() {
        let s = shown(&[b'\n'; 10_000]);
        assert!(!s.contains('\n') && s.len() < 200, "{s}");
        assert!(s.ends_with("(10000 bytes)"), "{s}");
    }
}
