//! Which namespace a device node is: the namespace's globally unique identifiers and
//! its controller's subsystem NQN, decoded from Identify data.
//!
//! Device names (`/dev/nvme0n1`) are assigned in probe order and move between boots; a
//! fencer that preempts on the wrong namespace finds the victim's key absent there and
//! would call that a confirmed fence. These identifiers let a caller check that two
//! hosts (or one host across boots) talk to the same namespace.
//!
//! Layouts (every offset pinned by a test below):
//! - Identify Namespace (CNS 00h), NVM Command Set Specification 1.0c, figure
//!   "Identify Namespace Data Structure, NVM Command Set": NGUID bytes 119:104
//!   (Namespace Globally Unique Identifier, 16 bytes), EUI64 bytes 127:120 (IEEE
//!   Extended Unique Identifier, 8 bytes). Each is zero when the controller does not
//!   report it (Base Specification 2.0c section 4.5 "Namespace Identification"
//!   descriptors; a namespace reports at least one of NGUID, EUI64, UUID from revision
//!   1.3 on).
//! - Identify Controller (CNS 01h), Base Specification 2.0c section 5.17.2.1, figure
//!   "Identify Controller Data Structure": SUBNQN bytes 1023:768, the NVM Subsystem NVMe
//!   Qualified Name, UTF-8, NUL-terminated (all zero when not reported: before revision
//!   1.2.1).

use std::fmt;

/// Identify Namespace: first byte of NGUID.
pub const NGUID_OFFSET: usize = 104;
/// NGUID length in bytes.
pub const NGUID_LEN: usize = 16;
/// Identify Namespace: first byte of EUI64.
pub const EUI64_OFFSET: usize = 120;
/// EUI64 length in bytes.
pub const EUI64_LEN: usize = 8;
/// Identify Controller: first byte of SUBNQN.
pub const SUBNQN_OFFSET: usize = 768;
/// SUBNQN field length in bytes.
pub const SUBNQN_LEN: usize = 256;

/// Why Identify data could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentifyError {
    /// The buffer ends before the field does.
    #[error("identify data of {len} bytes is too short for {field} (bytes {start}..{end})")]
    Truncated {
        /// The field's specification name.
        field: &'static str,
        /// First byte of the field.
        start: usize,
        /// One past its last byte.
        end: usize,
        /// Bytes available.
        len: usize,
    },
    /// SUBNQN is not UTF-8.
    #[error("SUBNQN is not UTF-8 (invalid byte at offset {offset} of the field)")]
    SubnqnNotUtf8 {
        /// Offset of the first invalid byte within the field.
        offset: usize,
    },
}

fn field<'a>(
    buf: &'a [u8],
    name: &'static str,
    start: usize,
    len: usize,
) -> Result<&'a [u8], IdentifyError> {
    let end = start + len;
    buf.get(start..end).ok_or(IdentifyError::Truncated {
        field: name,
        start,
        end,
        len: buf.len(),
    })
}

/// NGUID and EUI64 from an Identify Namespace data structure, as stored (byte 104
/// first); zero when not reported.
pub fn parse_namespace_ids(
    buf: &[u8],
) -> Result<([u8; NGUID_LEN], [u8; EUI64_LEN]), IdentifyError> {
    let mut nguid = [0u8; NGUID_LEN];
    nguid.copy_from_slice(field(buf, "NGUID", NGUID_OFFSET, NGUID_LEN)?);
    let mut eui64 = [0u8; EUI64_LEN];
    eui64.copy_from_slice(field(buf, "EUI64", EUI64_OFFSET, EUI64_LEN)?);
    Ok((nguid, eui64))
}

/// SUBNQN from an Identify Controller data structure: the bytes before the first NUL
/// (the whole field when there is none); empty when not reported.
pub fn parse_subnqn(buf: &[u8]) -> Result<String, IdentifyError> {
    let raw = field(buf, "SUBNQN", SUBNQN_OFFSET, SUBNQN_LEN)?;
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    match std::str::from_utf8(&raw[..end]) {
        Ok(s) => Ok(s.to_owned()),
        Err(e) => Err(IdentifyError::SubnqnNotUtf8 {
            offset: e.valid_up_to(),
        }),
    }
}

/// What identifies a namespace across hosts and boots: its NGUID or, when it reports
/// none, its EUI-64, qualified by the subsystem NQN.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NamespaceIdentity {
    /// NGUID as stored in Identify Namespace (all zero: not reported).
    pub nguid: [u8; NGUID_LEN],
    /// EUI64 as stored in Identify Namespace (all zero: not reported).
    pub eui64: [u8; EUI64_LEN],
    /// The controller's subsystem NQN (empty: not reported).
    pub subnqn: String,
}

/// The identifier a [`NamespaceIdentity`] is compared by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NamespaceId {
    /// A non-zero NGUID.
    Nguid([u8; NGUID_LEN]),
    /// A non-zero EUI-64 (the NGUID was zero).
    Eui64([u8; EUI64_LEN]),
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl NamespaceIdentity {
    /// Builds the identity from raw Identify Namespace and Identify Controller data.
    pub fn from_identify(namespace: &[u8], controller: &[u8]) -> Result<Self, IdentifyError> {
        let (nguid, eui64) = parse_namespace_ids(namespace)?;
        Ok(Self {
            nguid,
            eui64,
            subnqn: parse_subnqn(controller)?,
        })
    }

    /// The NGUID when non-zero, else the EUI-64 when non-zero, else `None`: the
    /// namespace cannot be told apart from another namespace of its subsystem.
    pub fn id(&self) -> Option<NamespaceId> {
        if self.nguid != [0; NGUID_LEN] {
            Some(NamespaceId::Nguid(self.nguid))
        } else if self.eui64 != [0; EUI64_LEN] {
            Some(NamespaceId::Eui64(self.eui64))
        } else {
            None
        }
    }

    /// Whether the namespace reports an NGUID or an EUI-64.
    pub fn is_identified(&self) -> bool {
        self.id().is_some()
    }

    /// Whether `self` and `other` name the same namespace: the same identifier (NGUID,
    /// else EUI-64; both absent counts as the same) in the same subsystem.
    pub fn same_namespace(&self, other: &Self) -> bool {
        self.id() == other.id() && self.subnqn == other.subnqn
    }

    /// The NGUID as 32 lowercase hex digits in byte order (nvme-cli's `nguid`).
    pub fn nguid_hex(&self) -> String {
        hex(&self.nguid)
    }

    /// The EUI-64 as 16 lowercase hex digits in byte order (nvme-cli's `eui64`).
    pub fn eui64_hex(&self) -> String {
        hex(&self.eui64)
    }

    /// Builds an identity from [`nguid_hex`](Self::nguid_hex) and
    /// [`eui64_hex`](Self::eui64_hex) forms; `None` when either is not exactly that
    /// many hex digits.
    pub fn from_hex(nguid: &str, eui64: &str, subnqn: impl Into<String>) -> Option<Self> {
        Some(Self {
            nguid: unhex(nguid)?,
            eui64: unhex(eui64)?,
            subnqn: subnqn.into(),
        })
    }
}

impl fmt::Display for NamespaceIdentity {
    /// `NGUID <hex> in <subnqn>`, `EUI-64 <hex> in <subnqn>`, or `no NGUID or EUI-64
    /// in <subnqn>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id() {
            Some(NamespaceId::Nguid(n)) => write!(f, "NGUID {}", hex(&n))?,
            Some(NamespaceId::Eui64(e)) => write!(f, "EUI-64 {}", hex(&e))?,
            None => f.write_str("no NGUID or EUI-64")?,
        }
        if self.subnqn.is_empty() {
            f.write_str(" (no subsystem NQN)")
        } else {
            write!(f, " in {}", self.subnqn)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Identify Namespace with NGUID 00 11 .. ff at 104..120 and EUI64 a0..a7 at
    /// 120..128 (NVM Command Set 1.0c, "Identify Namespace Data Structure").
    fn ns_fixture() -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        for i in 0..16 {
            b[104 + i] = (i as u8) * 0x11;
        }
        for i in 0..8 {
            b[120 + i] = 0xa0 + i as u8;
        }
        // Neighbours that must not leak in: NVMSETID..(103) and LBAF0 at 128.
        b[103] = 0xee;
        b[128] = 0xee;
        b
    }

    /// Identify Controller with SUBNQN at 768 (Base 2.0c 5.17.2.1).
    fn ctrl_fixture(nqn: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[767] = b'x';
        b[768..768 + nqn.len()].copy_from_slice(nqn);
        b
    }

    #[test]
    fn field_offsets_are_the_specification_s() {
        assert_eq!((NGUID_OFFSET, NGUID_OFFSET + NGUID_LEN), (104, 120));
        assert_eq!((EUI64_OFFSET, EUI64_OFFSET + EUI64_LEN), (120, 128));
        assert_eq!((SUBNQN_OFFSET, SUBNQN_OFFSET + SUBNQN_LEN), (768, 1024));
    }

    #[test]
    fn decodes_nguid_eui64_and_subnqn() {
        let (nguid, eui64) = parse_namespace_ids(&ns_fixture()).unwrap();
        assert_eq!(nguid[0], 0x00);
        assert_eq!(nguid[15], 0xff);
        assert_eq!(eui64, [0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7]);
        let id =
            NamespaceIdentity::from_identify(&ns_fixture(), &ctrl_fixture(b"nqn.2014-08.org.x:s"))
                .unwrap();
        assert_eq!(id.subnqn, "nqn.2014-08.org.x:s");
        assert_eq!(id.nguid_hex(), "00112233445566778899aabbccddeeff");
        assert_eq!(id.eui64_hex(), "a0a1a2a3a4a5a6a7");
        assert_eq!(
            id.to_string(),
            "NGUID 00112233445566778899aabbccddeeff in nqn.2014-08.org.x:s"
        );
        // A field filling all 256 bytes has no NUL.
        let full = [b'n'; 256];
        assert_eq!(parse_subnqn(&ctrl_fixture(&full)).unwrap().len(), 256);
    }

    #[test]
    fn nguid_first_then_eui64_then_nothing() {
        let mut id = NamespaceIdentity::from_identify(&ns_fixture(), &ctrl_fixture(b"s")).unwrap();
        assert!(matches!(id.id(), Some(NamespaceId::Nguid(_))));
        id.nguid = [0; 16];
        assert_eq!(id.id(), Some(NamespaceId::Eui64(id.eui64)));
        assert_eq!(id.to_string(), "EUI-64 a0a1a2a3a4a5a6a7 in s");
        id.eui64 = [0; 8];
        assert_eq!(id.id(), None);
        assert!(!id.is_identified());
        id.subnqn.clear();
        assert_eq!(id.to_string(), "no NGUID or EUI-64 (no subsystem NQN)");
    }

    #[test]
    fn same_namespace_needs_same_id_and_subsystem() {
        let a = NamespaceIdentity::from_identify(&ns_fixture(), &ctrl_fixture(b"s")).unwrap();
        let mut b = a.clone();
        assert!(a.same_namespace(&b));
        // Another EUI-64 does not matter while the NGUIDs agree.
        b.eui64 = [1; 8];
        assert!(a.same_namespace(&b));
        b.nguid[3] ^= 1;
        assert!(!a.same_namespace(&b));
        let mut c = a.clone();
        c.subnqn = "t".into();
        assert!(!a.same_namespace(&c));
        // NGUID on one side only: different identifiers.
        let mut d = a.clone();
        d.nguid = [0; 16];
        assert!(!a.same_namespace(&d));
    }

    #[test]
    fn hex_round_trip_and_refusals() {
        let a = NamespaceIdentity::from_identify(&ns_fixture(), &ctrl_fixture(b"s")).unwrap();
        let b = NamespaceIdentity::from_hex(&a.nguid_hex(), &a.eui64_hex(), "s").unwrap();
        assert_eq!(a, b);
        assert!(NamespaceIdentity::from_hex("00", &a.eui64_hex(), "s").is_none());
        assert!(NamespaceIdentity::from_hex(&a.nguid_hex(), "zz00000000000000", "s").is_none());
        // Multi-byte UTF-8 of the right byte length is not hex (and must not panic).
        assert!(NamespaceIdentity::from_hex(&"é".repeat(16), &a.eui64_hex(), "s").is_none());
    }

    #[test]
    fn short_buffers_and_bad_utf8_are_errors() {
        assert_eq!(
            parse_namespace_ids(&[0; 119]),
            Err(IdentifyError::Truncated {
                field: "NGUID",
                start: 104,
                end: 120,
                len: 119
            })
        );
        assert!(matches!(
            parse_namespace_ids(&[0; 127]),
            Err(IdentifyError::Truncated { field: "EUI64", .. })
        ));
        assert!(parse_namespace_ids(&[0; 128]).is_ok());
        assert!(matches!(
            parse_subnqn(&[0; 1023]),
            Err(IdentifyError::Truncated {
                field: "SUBNQN",
                ..
            })
        ));
        assert_eq!(
            parse_subnqn(&ctrl_fixture(&[b'a', 0xff, b'b'])),
            Err(IdentifyError::SubnqnNotUtf8 { offset: 1 })
        );
    }

    proptest! {
        #[test]
        fn decoders_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..1100)) {
            match parse_namespace_ids(&buf) {
                Ok((n, e)) => {
                    prop_assert!(buf.len() >= 128);
                    prop_assert_eq!(&n[..], &buf[104..120]);
                    prop_assert_eq!(&e[..], &buf[120..128]);
                }
                Err(IdentifyError::Truncated { end, len, .. }) => prop_assert!(len < end),
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
            match parse_subnqn(&buf) {
                Ok(s) => {
                    prop_assert!(buf.len() >= 1024);
                    prop_assert!(s.len() <= 256 && !s.contains('\0'));
                }
                Err(IdentifyError::Truncated { len, .. }) => prop_assert!(len < 1024),
                Err(IdentifyError::SubnqnNotUtf8 { offset }) => prop_assert!(offset < 256),
            }
        }

        #[test]
        fn hex_forms_round_trip(nguid in any::<[u8; 16]>(), eui64 in any::<[u8; 8]>()) {
            let a = NamespaceIdentity { nguid, eui64, subnqn: "s".into() };
            let b = NamespaceIdentity::from_hex(&a.nguid_hex(), &a.eui64_hex(), "s");
            prop_assert_eq!(Some(a), b);
        }

        #[test]
        fn from_hex_never_panics(n in ".{0,40}", e in ".{0,20}") {
            let _ = NamespaceIdentity::from_hex(&n, &e, "s");
        }
    }
}
