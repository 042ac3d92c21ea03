//! Instance ids: the value of `membership/<node>`, `fence_pending/<node>`,
//! `departed/<node>` and `instance/<node>`, and what the EBS fencer detaches.
//!
//! An instance id comes from the command line, the host (EC2 asset tag, machine id,
//! hostname) or etcd, where any client with write access may have put anything. It
//! reaches log lines, audit records and EC2 API calls, so it is checked against one
//! rule wherever it enters: 1 to [`MAX_INSTANCE_ID_LEN`] characters from
//! `[A-Za-z0-9._:-]`, starting with a letter or digit. EC2 ids (`i-0123456789abcdef0`),
//! machine ids (32 hex digits) and DNS host names all fit.

/// Longest instance id accepted.
pub const MAX_INSTANCE_ID_LEN: usize = 128;

/// Why a string is not a valid instance id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInstanceId {
    /// The id is empty.
    #[error("invalid instance id: empty")]
    Empty,
    /// The id is longer than [`MAX_INSTANCE_ID_LEN`].
    #[error("invalid instance id {id:?}: longer than {MAX_INSTANCE_ID_LEN} characters")]
    TooLong {
        /// The refused id.
        id: String,
    },
    /// A character outside `[A-Za-z0-9._:-]`, or a first character that is not a
    /// letter or digit.
    #[error(
        "invalid instance id {id:?}: character {ch:?} not allowed (use A-Z a-z 0-9 . _ : -, starting with a letter or digit, e.g. an EC2 id i-0123456789abcdef0)"
    )]
    BadChar {
        /// The refused id.
        id: String,
        /// The first offending character.
        ch: char,
    },
}

/// Checks `id` against the instance id rule.
pub fn check_instance_id(id: &str) -> Result<(), InvalidInstanceId> {
    if id.is_empty() {
        return Err(InvalidInstanceId::Empty);
    }
    if id.len() > MAX_INSTANCE_ID_LEN {
        return Err(InvalidInstanceId::TooLong { id: id.to_owned() });
    }
    for (i, ch) in id.chars().enumerate() {
        let ok = ch.is_ascii_alphanumeric() || (i > 0 && matches!(ch, '.' | '_' | ':' | '-'));
        if !ok {
            return Err(InvalidInstanceId::BadChar {
                id: id.to_owned(),
                ch,
            });
        }
    }
    Ok(())
}

/// An instance id read back from etcd: kept when it satisfies the rule, otherwise
/// replaced by the empty id ("not known"), which every consumer already handles (a
/// sweep of a node known only by `gen/` has none). The caller logs the refusal.
pub fn from_etcd(value: &[u8]) -> Result<String, InvalidInstanceId> {
    let text = String::from_utf8_lossy(value);
    check_instance_id(&text)?;
    Ok(text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ec2_ids_machine_ids_and_host_names() {
        for id in [
            "i-0123456789abcdef0",
            "i-12345678",
            "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            "ip-10-0-0-1.ec2.internal",
            "guest-n1",
            "host:1",
        ] {
            assert_eq!(check_instance_id(id), Ok(()), "{id}");
        }
    }

    #[test]
    fn refuses_what_could_forge_a_log_line_or_a_key() {
        assert_eq!(check_instance_id(""), Err(InvalidInstanceId::Empty));
        for (id, ch) in [
            ("i-1\nforged", '\n'),
            ("i-1\rx", '\r'),
            ("i 1", ' '),
            ("i-1/x", '/'),
            ("-i", '-'),
            ("i-\u{1b}[2J", '\u{1b}'),
            ("i-é", 'é'),
        ] {
            assert!(
                matches!(check_instance_id(id), Err(InvalidInstanceId::BadChar { ch: c, .. }) if c == ch),
                "{id:?}"
            );
        }
        assert!(matches!(
            check_instance_id(&"a".repeat(129)),
            Err(InvalidInstanceId::TooLong { .. })
        ));
        let msg = check_instance_id("i-1\nforged").unwrap_err().to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(
            msg.starts_with("invalid instance id \"i-1\\nforged\""),
            "{msg}"
        );
    }

    #[test]
    fn values_from_etcd_are_checked_too() {
        assert_eq!(from_etcd(b"i-1").as_deref(), Ok("i-1"));
        assert!(from_etcd(b"i-1\n2026-12-01 INFO forged").is_err());
        assert!(from_etcd(&[0xff, 0xfe]).is_err());
    }
}
