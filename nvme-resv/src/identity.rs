//! Which namespace a device node is: the namespace's globally unique identifiers, its
//! controller's vendor, serial and model numbers and its subsystem NQN, decoded from
//! Identify data.
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
//!   report it.
//! - Namespace Identification Descriptor list (CNS 03h), Base Specification 2.0c
//!   section 5.17.2 ("Identify Data Structures", CNS 03h), figure "Identify - Namespace
//!   Identification Descriptor" (figure 277 of revision 2.0): up to 4096 bytes of
//!   descriptors, each NIDT (byte 00, Namespace Identifier Type), NIDL (byte 01,
//!   Namespace Identifier Length), bytes 03:02 reserved, then NIDL bytes of NID from
//!   byte 04. Types: 1h EUI-64 (NIDL 8h, a copy of EUI64), 2h NGUID (NIDL 10h, a copy
//!   of NGUID), 3h UUID (NIDL 10h, RFC 4122), 4h Command Set Identifier (NIDL 1h). A
//!   NIDL of 0h ends the list; a host ignores types it does not know; a controller
//!   returns at most one descriptor of each type. The UUID is reported only here
//!   (revision 1.3 on); the Linux kernel target gives every namespace a random one.
//! - Identify Controller (CNS 01h), Base Specification 2.0c section 5.17.2.1, figure
//!   "Identify Controller Data Structure": VID bytes 01:00 (PCI Vendor ID), SN bytes
//!   23:04 (Serial Number, ASCII, space padded), MN bytes 63:24 (Model Number, ASCII,
//!   space padded), SUBNQN bytes 1023:768, the NVM Subsystem NVMe Qualified Name,
//!   UTF-8, NUL-terminated (all zero when not reported: before revision 1.2.1). The
//!   serial and model numbers are those of the NVM subsystem: every controller of a
//!   subsystem (each port of a dual-ported SSD, each EBS Multi-Attach attachment)
//!   reports the same.

use std::fmt;
use std::str::FromStr;

/// Identify Namespace: first byte of NGUID.
pub const NGUID_OFFSET: usize = 104;
/// NGUID length in bytes.
pub const NGUID_LEN: usize = 16;
/// Identify Namespace: first byte of EUI64.
pub const EUI64_OFFSET: usize = 120;
/// EUI64 length in bytes.
pub const EUI64_LEN: usize = 8;
/// UUID length in bytes (descriptor type 3h).
pub const UUID_LEN: usize = 16;
/// Identify Controller: first byte of VID (PCI Vendor ID, little endian).
pub const VID_OFFSET: usize = 0;
/// Identify Controller: first byte of SN.
pub const SN_OFFSET: usize = 4;
/// SN field length in bytes.
pub const SN_LEN: usize = 20;
/// Identify Controller: first byte of MN.
pub const MN_OFFSET: usize = 24;
/// MN field length in bytes.
pub const MN_LEN: usize = 40;
/// Identify Controller: first byte of SUBNQN.
pub const SUBNQN_OFFSET: usize = 768;
/// SUBNQN field length in bytes.
pub const SUBNQN_LEN: usize = 256;
/// A Namespace Identification Descriptor's header: NIDT, NIDL, two reserved bytes.
pub const DESCRIPTOR_HEADER_LEN: usize = 4;

/// PCI vendor id of Amazon's NVMe controllers (EBS and instance store).
pub const AMAZON_VID: u16 = 0x1d0f;
/// The model number of an EBS volume's controller.
pub const EBS_MODEL: &str = "Amazon Elastic Block Store";

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
    /// A Namespace Identification Descriptor runs past the end of the list.
    #[error(
        "namespace identification descriptor at byte {offset} (NIDT {nidt:#04x}, NIDL {nidl}) runs past the end of the {len}-byte list"
    )]
    DescriptorTruncated {
        /// Offset of the descriptor in the list.
        offset: usize,
        /// Its NIDT.
        nidt: u8,
        /// Its NIDL (0 when the header itself is cut).
        nidl: usize,
        /// Bytes in the list.
        len: usize,
    },
    /// A descriptor of a known type with another length than the specification's.
    #[error(
        "namespace identification descriptor at byte {offset}: NIDT {nidt:#04x} has NIDL {expected} in the specification, the device says {nidl}"
    )]
    DescriptorLength {
        /// Offset of the descriptor in the list.
        offset: usize,
        /// Its NIDT.
        nidt: u8,
        /// Its NIDL.
        nidl: usize,
        /// The specification's NIDL for that type.
        expected: usize,
    },
    /// Two descriptors of one type: the specification forbids it, and which of them
    /// names the namespace would be a guess.
    #[error(
        "namespace identification descriptors at bytes {first} and {second} both have NIDT {nidt:#04x}"
    )]
    DuplicateDescriptor {
        /// The repeated NIDT.
        nidt: u8,
        /// Offset of the first.
        first: usize,
        /// Offset of the second.
        second: usize,
    },
    /// The descriptor list and Identify Namespace report different values for one
    /// identifier (the descriptor must be a copy of the field).
    #[error(
        "the {field} descriptor ({descriptor}) differs from Identify Namespace's {field} field ({field_value})"
    )]
    DescriptorMismatch {
        /// NGUID or EUI64.
        field: &'static str,
        /// The descriptor's value, hex.
        descriptor: String,
        /// The field's value, hex.
        field_value: String,
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

fn array<const N: usize>(
    buf: &[u8],
    name: &'static str,
    start: usize,
) -> Result<[u8; N], IdentifyError> {
    let mut out = [0u8; N];
    out.copy_from_slice(field(buf, name, start, N)?);
    Ok(out)
}

/// NGUID and EUI64 from an Identify Namespace data structure, as stored (byte 104
/// first); zero when not reported.
pub fn parse_namespace_ids(
    buf: &[u8],
) -> Result<([u8; NGUID_LEN], [u8; EUI64_LEN]), IdentifyError> {
    Ok((
        array(buf, "NGUID", NGUID_OFFSET)?,
        array(buf, "EUI64", EUI64_OFFSET)?,
    ))
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

/// The trailing spaces and NULs of an ASCII field removed, as Linux does before it
/// names a namespace by its serial and model numbers (`wwid_show`).
fn trim_padding(raw: &[u8]) -> Vec<u8> {
    let end = raw
        .iter()
        .rposition(|b| *b != b' ' && *b != 0)
        .map_or(0, |i| i + 1);
    raw[..end].to_vec()
}

/// What Identify Controller says about who made the controller and which subsystem
/// it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ControllerIds {
    /// VID: PCI Vendor ID.
    pub vid: u16,
    /// SN without its padding (trailing spaces and NULs); empty: not reported.
    pub serial: Vec<u8>,
    /// MN without its padding.
    pub model: Vec<u8>,
    /// SUBNQN (empty: not reported).
    pub subnqn: String,
}

/// VID, SN, MN and SUBNQN from an Identify Controller data structure.
pub fn parse_controller(buf: &[u8]) -> Result<ControllerIds, IdentifyError> {
    let vid = array::<2>(buf, "VID", VID_OFFSET)?;
    Ok(ControllerIds {
        vid: u16::from_le_bytes(vid),
        serial: trim_padding(field(buf, "SN", SN_OFFSET, SN_LEN)?),
        model: trim_padding(field(buf, "MN", MN_OFFSET, MN_LEN)?),
        subnqn: parse_subnqn(buf)?,
    })
}

/// Namespace Identifier Type (NIDT): an open newtype, as a device may report a type
/// this crate does not know (and ignores, as the specification asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nidt(pub u8);

impl Nidt {
    /// IEEE Extended Unique Identifier (1h).
    pub const EUI64: Self = Self(1);
    /// Namespace Globally Unique Identifier (2h).
    pub const NGUID: Self = Self(2);
    /// Namespace UUID (3h).
    pub const UUID: Self = Self(3);
    /// Command Set Identifier (4h).
    pub const CSI: Self = Self(4);

    /// The NIDL the specification gives this type; `None` for a type this crate does
    /// not know (skipped by its own NIDL).
    pub fn nidl(self) -> Option<usize> {
        match self {
            Self::EUI64 => Some(EUI64_LEN),
            Self::NGUID => Some(NGUID_LEN),
            Self::UUID => Some(UUID_LEN),
            Self::CSI => Some(1),
            _ => None,
        }
    }
}

/// The Namespace Identification Descriptor list, decoded: each known identifier as
/// the device reported it (`None`: no descriptor of that type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NamespaceDescriptors {
    /// Type 1h.
    pub eui64: Option<[u8; EUI64_LEN]>,
    /// Type 2h.
    pub nguid: Option<[u8; NGUID_LEN]>,
    /// Type 3h.
    pub uuid: Option<[u8; UUID_LEN]>,
    /// Type 4h: the namespace's I/O Command Set (0h NVM).
    pub csi: Option<u8>,
}

fn nid<const N: usize>(nid: &[u8], offset: usize, nidt: u8) -> Result<[u8; N], IdentifyError> {
    <[u8; N]>::try_from(nid).map_err(|_| IdentifyError::DescriptorLength {
        offset,
        nidt,
        nidl: nid.len(),
        expected: N,
    })
}

/// Decodes a Namespace Identification Descriptor list (the CNS 03h data, normally
/// 4096 bytes). The list ends at a NIDL of 0, at the end of `buf`, or where fewer than
/// a header's bytes remain and they are all zero.
pub fn parse_descriptors(buf: &[u8]) -> Result<NamespaceDescriptors, IdentifyError> {
    let mut out = NamespaceDescriptors::default();
    let mut seen: Vec<(u8, usize)> = Vec::new();
    let mut offset = 0;
    while offset < buf.len() {
        let rest = &buf[offset..];
        let nidt = rest[0];
        let nidl = usize::from(rest.get(1).copied().unwrap_or(0));
        if rest.len() < DESCRIPTOR_HEADER_LEN {
            if rest.iter().all(|b| *b == 0) {
                break;
            }
            return Err(IdentifyError::DescriptorTruncated {
                offset,
                nidt,
                nidl,
                len: buf.len(),
            });
        }
        if nidl == 0 {
            break;
        }
        let start = offset + DESCRIPTOR_HEADER_LEN;
        let value = buf
            .get(start..start + nidl)
            .ok_or(IdentifyError::DescriptorTruncated {
                offset,
                nidt,
                nidl,
                len: buf.len(),
            })?;
        let ty = Nidt(nidt);
        if let Some(expected) = ty.nidl() {
            if let Some((_, first)) = seen.iter().find(|(t, _)| *t == nidt) {
                return Err(IdentifyError::DuplicateDescriptor {
                    nidt,
                    first: *first,
                    second: offset,
                });
            }
            seen.push((nidt, offset));
            if nidl != expected {
                return Err(IdentifyError::DescriptorLength {
                    offset,
                    nidt,
                    nidl,
                    expected,
                });
            }
        }
        match ty {
            Nidt::EUI64 => out.eui64 = Some(nid(value, offset, nidt)?),
            Nidt::NGUID => out.nguid = Some(nid(value, offset, nidt)?),
            Nidt::UUID => out.uuid = Some(nid(value, offset, nidt)?),
            Nidt::CSI => out.csi = Some(nid::<1>(value, offset, nidt)?[0]),
            // Reserved and newer types: ignored, as the specification asks.
            _ => {}
        }
        offset = start + nidl;
    }
    Ok(out)
}

/// Which kind of identifier names a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdentityKind {
    /// The namespace UUID (descriptor type 3h).
    Uuid,
    /// The NGUID.
    Nguid,
    /// The IEEE EUI-64.
    Eui64,
    /// Linux's fallback for a namespace with none of the three: the controller's PCI
    /// vendor id, serial number and model number, and the namespace id.
    VidSerialModelNsid,
}

impl IdentityKind {
    /// Every kind, in the order a namespace is named by ([`NamespaceIdentity::id`]).
    pub const ALL: [Self; 4] = [
        Self::Uuid,
        Self::Nguid,
        Self::Eui64,
        Self::VidSerialModelNsid,
    ];

    /// The stable name (`uuid`, `nguid`, `eui64`, `vid-serial-model-nsid`), as
    /// recorded and printed in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Uuid => "uuid",
            Self::Nguid => "nguid",
            Self::Eui64 => "eui64",
            Self::VidSerialModelNsid => "vid-serial-model-nsid",
        }
    }
}

impl fmt::Display for IdentityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An identity kind name that is not one of [`IdentityKind::as_str`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown namespace identity kind {0:?}: expected uuid, nguid, eui64 or vid-serial-model-nsid"
)]
pub struct UnknownIdentityKind(pub String);

impl FromStr for IdentityKind {
    type Err = UnknownIdentityKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownIdentityKind(s.to_owned()))
    }
}

/// How a [`NamespaceIdentity`] that serves as the reference (a recorded identity) is
/// compared with another ([`NamespaceIdentity::same_namespace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum MatchRule {
    /// By the identifier [`NamespaceIdentity::id`] names it by: the other identity
    /// must report the same value of that kind.
    #[default]
    ByIdentifier,
    /// The rule of identities recorded before UUIDs and serial numbers were read:
    /// NGUID, else EUI-64, else neither, compared as a whole (the other's NGUID and
    /// EUI-64 decide; its UUID and serial number are not looked at).
    NguidEui64,
}

/// What identifies a namespace across hosts and boots: its UUID, NGUID or EUI-64, or
/// (none reported) its controller's vendor id, serial and model numbers with the
/// namespace id; qualified by the subsystem NQN.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NamespaceIdentity {
    /// NGUID as stored in Identify Namespace, or its descriptor when the field is zero
    /// (all zero: not reported).
    pub nguid: [u8; NGUID_LEN],
    /// EUI64 as stored in Identify Namespace, or its descriptor when the field is zero
    /// (all zero: not reported).
    pub eui64: [u8; EUI64_LEN],
    /// The namespace UUID from the descriptor list (all zero: not reported).
    pub uuid: [u8; UUID_LEN],
    /// Identify Controller VID.
    pub vid: u16,
    /// Identify Controller SN without padding (empty: not reported).
    pub serial: Vec<u8>,
    /// Identify Controller MN without padding.
    pub model: Vec<u8>,
    /// The namespace id.
    pub nsid: u32,
    /// The controller's subsystem NQN (empty: not reported).
    pub subnqn: String,
    /// How this identity is compared when it is the reference.
    pub rule: MatchRule,
}

/// The identifier a [`NamespaceIdentity`] is compared by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NamespaceId {
    /// A non-zero namespace UUID.
    Uuid([u8; UUID_LEN]),
    /// A non-zero NGUID.
    Nguid([u8; NGUID_LEN]),
    /// A non-zero EUI-64.
    Eui64([u8; EUI64_LEN]),
    /// No UUID, NGUID or EUI-64: the controller's vendor id, serial number (not empty)
    /// and model number, and the namespace id.
    VidSerialModelNsid {
        /// PCI vendor id.
        vid: u16,
        /// Serial number without padding.
        serial: Vec<u8>,
        /// Model number without padding.
        model: Vec<u8>,
        /// Namespace id.
        nsid: u32,
    },
}

impl NamespaceId {
    /// Its kind.
    pub fn kind(&self) -> IdentityKind {
        match self {
            Self::Uuid(_) => IdentityKind::Uuid,
            Self::Nguid(_) => IdentityKind::Nguid,
            Self::Eui64(_) => IdentityKind::Eui64,
            Self::VidSerialModelNsid { .. } => IdentityKind::VidSerialModelNsid,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let v = decode_hex(s)?;
    <[u8; N]>::try_from(v.as_slice()).ok()
}

/// Bytes from an even number of hex digits; `None` for anything else.
pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// A UUID in its canonical form: 8-4-4-4-12 lowercase hex digits, byte order (as
/// Linux's `%pU` and nvme-cli print a namespace UUID).
pub fn uuid_text(uuid: &[u8; UUID_LEN]) -> String {
    let h = hex(uuid);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A UUID from its canonical form (either case); `None` for anything else.
pub fn parse_uuid(s: &str) -> Option<[u8; UUID_LEN]> {
    let groups: Vec<&str> = s.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    unhex(&groups.concat())
}

fn nonzero<const N: usize>(a: [u8; N]) -> Option<[u8; N]> {
    (a != [0; N]).then_some(a)
}

/// A field's bytes as text for people: ASCII as is, anything else escaped.
fn text(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

impl NamespaceIdentity {
    /// Builds the identity from raw Identify data: Identify Namespace (CNS 00h),
    /// Identify Controller (CNS 01h) and the Namespace Identification Descriptor list
    /// (CNS 03h; `None` when the controller does not support it) of namespace `nsid`.
    ///
    /// The NGUID and EUI-64 come from Identify Namespace, or from their descriptors
    /// when the fields are zero; both non-zero and different is an error (the
    /// descriptor is a copy of the field).
    pub fn from_identify(
        nsid: u32,
        namespace: &[u8],
        controller: &[u8],
        descriptors: Option<&[u8]>,
    ) -> Result<Self, IdentifyError> {
        let (nguid, eui64) = parse_namespace_ids(namespace)?;
        let ctrl = parse_controller(controller)?;
        let descs = descriptors
            .map(parse_descriptors)
            .transpose()?
            .unwrap_or_default();
        Self::from_parts(nsid, nguid, eui64, ctrl, &descs)
    }

    /// The identity from decoded parts (see [`from_identify`](Self::from_identify)).
    pub fn from_parts(
        nsid: u32,
        nguid: [u8; NGUID_LEN],
        eui64: [u8; EUI64_LEN],
        ctrl: ControllerIds,
        descs: &NamespaceDescriptors,
    ) -> Result<Self, IdentifyError> {
        fn merge<const N: usize>(
            name: &'static str,
            field: [u8; N],
            desc: Option<[u8; N]>,
        ) -> Result<[u8; N], IdentifyError> {
            match (nonzero(field), desc.and_then(nonzero)) {
                (Some(f), Some(d)) if f != d => Err(IdentifyError::DescriptorMismatch {
                    field: name,
                    descriptor: hex(&d),
                    field_value: hex(&f),
                }),
                (Some(f), _) => Ok(f),
                (None, d) => Ok(d.unwrap_or([0; N])),
            }
        }
        Ok(Self {
            nguid: merge("NGUID", nguid, descs.nguid)?,
            eui64: merge("EUI64", eui64, descs.eui64)?,
            uuid: descs.uuid.unwrap_or_default(),
            vid: ctrl.vid,
            serial: ctrl.serial,
            model: ctrl.model,
            nsid,
            subnqn: ctrl.subnqn,
            rule: MatchRule::ByIdentifier,
        })
    }

    /// The identifier of `kind` when the namespace reports it.
    pub fn id_of(&self, kind: IdentityKind) -> Option<NamespaceId> {
        match kind {
            IdentityKind::Uuid => nonzero(self.uuid).map(NamespaceId::Uuid),
            IdentityKind::Nguid => nonzero(self.nguid).map(NamespaceId::Nguid),
            IdentityKind::Eui64 => nonzero(self.eui64).map(NamespaceId::Eui64),
            IdentityKind::VidSerialModelNsid => {
                (!self.serial.is_empty()).then(|| NamespaceId::VidSerialModelNsid {
                    vid: self.vid,
                    serial: self.serial.clone(),
                    model: self.model.clone(),
                    nsid: self.nsid,
                })
            }
        }
    }

    /// What names the namespace: the first it reports of UUID, NGUID, EUI-64, then the
    /// vendor id, serial and model numbers with the nsid (when it reports a serial
    /// number); `None`: it cannot be told apart from another namespace of its
    /// subsystem.
    ///
    /// The order is Linux's (`wwid_show` in `drivers/nvme/host/core.c`), so that the
    /// identity named here is the one an operator sees in `/sys/block/nvmeXnY/wwid`
    /// and in udev's `/dev/disk/by-id/nvme-<wwid>` links ([`wwid`](Self::wwid)); EBS
    /// volumes, which report none of the three, are named by Linux's fallback too.
    pub fn id(&self) -> Option<NamespaceId> {
        IdentityKind::ALL.into_iter().find_map(|k| self.id_of(k))
    }

    /// The identifier of the rule of identities recorded before this crate read UUIDs
    /// and serial numbers ([`MatchRule::NguidEui64`]): NGUID, else EUI-64.
    pub fn nguid_eui64_id(&self) -> Option<NamespaceId> {
        self.id_of(IdentityKind::Nguid)
            .or_else(|| self.id_of(IdentityKind::Eui64))
    }

    /// Whether the namespace reports any identifier ([`id`](Self::id) is `Some`).
    pub fn is_identified(&self) -> bool {
        self.id().is_some()
    }

    /// Whether `other` (a device's identity now) is the namespace `self` (the
    /// reference, e.g. the recorded one) names: the same subsystem NQN, and under
    /// [`MatchRule::ByIdentifier`] the same value of the kind `self` is named by
    /// (`other` may report more: a UUID it did not report before does not matter;
    /// both unidentified counts as the same); under [`MatchRule::NguidEui64`], the same
    /// NGUID-else-EUI-64.
    pub fn same_namespace(&self, other: &Self) -> bool {
        if self.subnqn != other.subnqn {
            return false;
        }
        match self.rule {
            MatchRule::NguidEui64 => self.nguid_eui64_id() == other.nguid_eui64_id(),
            MatchRule::ByIdentifier => match self.id() {
                None => other.id().is_none(),
                Some(id) => other.id_of(id.kind()).as_ref() == Some(&id),
            },
        }
    }

    /// The kind this identity is named by (`None`: unidentified).
    pub fn kind(&self) -> Option<IdentityKind> {
        self.id().map(|id| id.kind())
    }

    /// The NGUID as 32 lowercase hex digits in byte order (nvme-cli's `nguid`).
    pub fn nguid_hex(&self) -> String {
        hex(&self.nguid)
    }

    /// The EUI-64 as 16 lowercase hex digits in byte order (nvme-cli's `eui64`).
    pub fn eui64_hex(&self) -> String {
        hex(&self.eui64)
    }

    /// The UUID in canonical form (all zero when not reported).
    pub fn uuid_text(&self) -> String {
        uuid_text(&self.uuid)
    }

    /// The serial number's bytes as hex (the form of Linux's fallback name).
    pub fn serial_hex(&self) -> String {
        hex(&self.serial)
    }

    /// The model number's bytes as hex.
    pub fn model_hex(&self) -> String {
        hex(&self.model)
    }

    /// The serial number as text (non-ASCII bytes escaped).
    pub fn serial_text(&self) -> String {
        text(&self.serial)
    }

    /// The model number as text (non-ASCII bytes escaped).
    pub fn model_text(&self) -> String {
        text(&self.model)
    }

    /// The name Linux gives the namespace in `/sys/block/nvmeXnY/wwid` (and udev in
    /// `/dev/disk/by-id/nvme-<wwid>`): `uuid.<uuid>`, `eui.<nguid>`, `eui.<eui64>`, or
    /// `nvme.<vid>-<serial hex>-<model hex>-<nsid>`.
    pub fn wwid(&self) -> String {
        if let Some(NamespaceId::Uuid(u)) = self.id_of(IdentityKind::Uuid) {
            return format!("uuid.{}", uuid_text(&u));
        }
        if let Some(n) = nonzero(self.nguid) {
            return format!("eui.{}", hex(&n));
        }
        if let Some(e) = nonzero(self.eui64) {
            return format!("eui.{}", hex(&e));
        }
        format!(
            "nvme.{:04x}-{}-{}-{:08x}",
            self.vid,
            hex(&self.serial),
            hex(&self.model),
            self.nsid
        )
    }

    /// The EBS volume id (`vol-…`) when this is an EBS volume's namespace (Amazon's
    /// vendor id, model "Amazon Elastic Block Store"): EC2 reports the volume id
    /// without its dash as the serial number (`vol0123…`). `None` otherwise, or when the
    /// serial number is not of that form.
    pub fn ebs_volume_id(&self) -> Option<String> {
        if self.vid != AMAZON_VID || self.model != EBS_MODEL.as_bytes() {
            return None;
        }
        let rest = self.serial.strip_prefix(b"vol")?;
        if rest.is_empty() || !rest.iter().all(u8::is_ascii_alphanumeric) {
            return None;
        }
        Some(format!("vol-{}", text(rest)))
    }

    /// Builds an identity from [`nguid_hex`](Self::nguid_hex) and
    /// [`eui64_hex`](Self::eui64_hex) forms; `None` when either is not exactly that
    /// many hex digits.
    pub fn from_hex(nguid: &str, eui64: &str, subnqn: impl Into<String>) -> Option<Self> {
        Some(Self {
            nguid: unhex(nguid)?,
            eui64: unhex(eui64)?,
            subnqn: subnqn.into(),
            ..Self::default()
        })
    }
}

impl fmt::Display for NamespaceIdentity {
    /// `UUID <uuid>`, `NGUID <hex>`, `EUI-64 <hex>`, `serial "<sn>" (vid 0x…, model
    /// "<mn>", nsid n)` or `no UUID, NGUID, EUI-64 or serial number`, then `in <subnqn>`
    /// (or `(no subsystem NQN)`). An identity compared by the NGUID-else-EUI-64 rule
    /// prints as it did before the others were read.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = match self.rule {
            MatchRule::NguidEui64 => self.nguid_eui64_id(),
            MatchRule::ByIdentifier => self.id(),
        };
        match id {
            Some(NamespaceId::Uuid(u)) => write!(f, "UUID {}", uuid_text(&u))?,
            Some(NamespaceId::Nguid(n)) => write!(f, "NGUID {}", hex(&n))?,
            Some(NamespaceId::Eui64(e)) => write!(f, "EUI-64 {}", hex(&e))?,
            Some(NamespaceId::VidSerialModelNsid {
                vid,
                serial,
                model,
                nsid,
            }) => write!(
                f,
                "serial \"{}\" (vid {vid:#06x}, model \"{}\", nsid {nsid})",
                text(&serial),
                text(&model)
            )?,
            None if self.rule == MatchRule::NguidEui64 => f.write_str("no NGUID or EUI-64")?,
            None => f.write_str("no UUID, NGUID, EUI-64 or serial number")?,
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

    /// Identify Controller with VID (bytes 1:0), SN (23:4) and MN (63:24) space padded
    /// as the specification says, and SUBNQN.
    fn ctrl_with(vid: u16, sn: &str, mn: &str, nqn: &str) -> Vec<u8> {
        let mut b = ctrl_fixture(nqn.as_bytes());
        b[0..2].copy_from_slice(&vid.to_le_bytes());
        b[2..4].copy_from_slice(&0x1d0fu16.to_le_bytes()); // SSVID: not part of the identity
        b[4..24].fill(b' ');
        b[4..4 + sn.len()].copy_from_slice(sn.as_bytes());
        b[24..64].fill(b' ');
        b[24..24 + mn.len()].copy_from_slice(mn.as_bytes());
        b[64..72].copy_from_slice(b"1.0     "); // FR, the neighbour after MN
        b
    }

    /// A descriptor list of (NIDT, NID) in order, zero padded to 4096 bytes.
    fn descs(list: &[(u8, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (t, v) in list {
            b.extend_from_slice(&[*t, v.len() as u8, 0, 0]);
            b.extend_from_slice(v);
        }
        b.resize(4096, 0);
        b
    }

    const UUID: [u8; 16] = [
        0x3f, 0x1c, 0x5d, 0x6e, 0x07, 0x28, 0x49, 0x4a, 0x8b, 0x9c, 0xad, 0xbe, 0xcf, 0xd0, 0xe1,
        0xf2,
    ];

    /// An EBS io2 volume's namespace, as EC2 presents it: vendor 1d0f, serial the volume
    /// id without its dash, model "Amazon Elastic Block Store", NGUID and EUI-64 zero, an
    /// empty descriptor list, nsid 1.
    fn ebs(volume: &str) -> NamespaceIdentity {
        NamespaceIdentity::from_identify(
            1,
            &vec![0u8; 4096],
            &ctrl_with(AMAZON_VID, volume, EBS_MODEL, ""),
            Some(&vec![0u8; 4096]),
        )
        .unwrap()
    }

    #[test]
    fn field_offsets_are_the_specification_s() {
        assert_eq!((NGUID_OFFSET, NGUID_OFFSET + NGUID_LEN), (104, 120));
        assert_eq!((EUI64_OFFSET, EUI64_OFFSET + EUI64_LEN), (120, 128));
        assert_eq!((SUBNQN_OFFSET, SUBNQN_OFFSET + SUBNQN_LEN), (768, 1024));
        assert_eq!(VID_OFFSET, 0);
        assert_eq!((SN_OFFSET, SN_OFFSET + SN_LEN), (4, 24));
        assert_eq!((MN_OFFSET, MN_OFFSET + MN_LEN), (24, 64));
        assert_eq!(DESCRIPTOR_HEADER_LEN, 4);
        assert_eq!(
            [Nidt::EUI64, Nidt::NGUID, Nidt::UUID, Nidt::CSI].map(Nidt::nidl),
            [Some(8), Some(16), Some(16), Some(1)]
        );
        assert_eq!(Nidt(0).nidl(), None);
    }

    #[test]
    fn decodes_nguid_eui64_and_subnqn() {
        let (nguid, eui64) = parse_namespace_ids(&ns_fixture()).unwrap();
        assert_eq!(nguid[0], 0x00);
        assert_eq!(nguid[15], 0xff);
        assert_eq!(eui64, [0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7]);
        let id = NamespaceIdentity::from_identify(
            1,
            &ns_fixture(),
            &ctrl_fixture(b"nqn.2014-08.org.x:s"),
            None,
        )
        .unwrap();
        assert_eq!(id.subnqn, "nqn.2014-08.org.x:s");
        assert_eq!(id.nguid_hex(), "00112233445566778899aabbccddeeff");
        assert_eq!(id.eui64_hex(), "a0a1a2a3a4a5a6a7");
        // The text form of an NGUID identity is the one fenced has always logged.
        assert_eq!(
            id.to_string(),
            "NGUID 00112233445566778899aabbccddeeff in nqn.2014-08.org.x:s"
        );
        assert_eq!(id.wwid(), "eui.00112233445566778899aabbccddeeff");
        // A field filling all 256 bytes has no NUL.
        let full = [b'n'; 256];
        assert_eq!(parse_subnqn(&ctrl_fixture(&full)).unwrap().len(), 256);
    }

    #[test]
    fn decodes_vid_serial_and_model_without_padding() {
        let c = parse_controller(&ctrl_with(0x1b36, "SN 1", "QEMU NVMe Ctrl", "nqn.x")).unwrap();
        assert_eq!(c.vid, 0x1b36);
        assert_eq!(c.serial, b"SN 1"); // inner spaces kept, trailing padding not
        assert_eq!(c.model, b"QEMU NVMe Ctrl");
        assert_eq!(c.subnqn, "nqn.x");
        // NUL padding (seen on some devices) is padding too; a full field has none.
        let mut b = ctrl_with(1, "", "", "");
        b[4..24].copy_from_slice(b"ABCDEFGHIJKLMNOPQRS\0");
        b[24..64].fill(b'M');
        let c = parse_controller(&b).unwrap();
        assert_eq!(c.serial, b"ABCDEFGHIJKLMNOPQRS");
        assert_eq!(c.model, [b'M'; 40]);
        // All spaces: no serial number.
        assert!(
            parse_controller(&ctrl_with(1, "", "m", ""))
                .unwrap()
                .serial
                .is_empty()
        );
        assert_eq!(
            parse_controller(&[0; 63]),
            Err(IdentifyError::Truncated {
                field: "MN",
                start: 24,
                end: 64,
                len: 63
            })
        );
    }

    #[test]
    fn descriptor_list_decodes_each_type_and_skips_unknown_ones() {
        let list = descs(&[
            (0x7f, &[9, 9, 9, 9, 9]), // a type from the future: skipped by its NIDL
            (3, &UUID),
            (1, &[1, 2, 3, 4, 5, 6, 7, 8]),
            (4, &[0]),
            (2, &[0xab; 16]),
        ]);
        let d = parse_descriptors(&list).unwrap();
        assert_eq!(d.uuid, Some(UUID));
        assert_eq!(d.eui64, Some([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(d.nguid, Some([0xab; 16]));
        assert_eq!(d.csi, Some(0));
        // An empty list, and a list that fills the buffer exactly.
        assert_eq!(
            parse_descriptors(&[0; 4096]).unwrap(),
            NamespaceDescriptors::default()
        );
        let mut exact = vec![3, 16, 0, 0];
        exact.extend_from_slice(&UUID);
        assert_eq!(parse_descriptors(&exact).unwrap().uuid, Some(UUID));
        // NIDL 0 ends the list: what follows is not read.
        let mut b = descs(&[(3, &UUID)]);
        b[20] = 1; // NIDT 1 with NIDL 0
        b[24..40].fill(0xff);
        assert_eq!(parse_descriptors(&b).unwrap().eui64, None);
        // Fewer than a header's bytes left, all zero: the end.
        exact.extend_from_slice(&[0, 0]);
        assert!(parse_descriptors(&exact).is_ok());
        assert_eq!(
            parse_descriptors(&[]).unwrap(),
            NamespaceDescriptors::default()
        );
    }

    #[test]
    fn descriptor_list_errors_name_the_descriptor() {
        // A NID running past the end of the data.
        let mut b = vec![3, 16, 0, 0];
        b.extend_from_slice(&[1; 10]);
        assert_eq!(
            parse_descriptors(&b),
            Err(IdentifyError::DescriptorTruncated {
                offset: 0,
                nidt: 3,
                nidl: 16,
                len: 14
            })
        );
        // A header cut short, not zero.
        let mut b = vec![4, 1, 0, 0, 0];
        b.extend_from_slice(&[1, 8]);
        assert!(matches!(
            parse_descriptors(&b),
            Err(IdentifyError::DescriptorTruncated {
                offset: 5,
                nidt: 1,
                nidl: 8,
                len: 7
            })
        ));
        // A known type with another length.
        let b = descs(&[(1, &[0; 8]), (2, &[7; 8])]);
        assert_eq!(
            parse_descriptors(&b),
            Err(IdentifyError::DescriptorLength {
                offset: 12,
                nidt: 2,
                nidl: 8,
                expected: 16
            })
        );
        // The same type twice.
        let b = descs(&[(3, &UUID), (4, &[0]), (3, &[0x11; 16])]);
        assert_eq!(
            parse_descriptors(&b),
            Err(IdentifyError::DuplicateDescriptor {
                nidt: 3,
                first: 0,
                second: 25
            })
        );
        let e = parse_descriptors(&b).unwrap_err().to_string();
        assert!(e.contains("bytes 0 and 25") && e.contains("0x03"), "{e}");
    }

    #[test]
    fn a_uuid_only_namespace_is_named_by_its_uuid() {
        // The Linux kernel target's default: a random UUID in the descriptor list, NGUID
        // and EUI-64 zero; nvmet's serial number is reported too, but comes later.
        let id = NamespaceIdentity::from_identify(
            1,
            &vec![0u8; 4096],
            &ctrl_with(0, "a1b2c3d4e5f6", "Linux", "nqn.t"),
            Some(&descs(&[(3, &UUID), (4, &[0])])),
        )
        .unwrap();
        assert_eq!(id.id(), Some(NamespaceId::Uuid(UUID)));
        assert_eq!(id.kind(), Some(IdentityKind::Uuid));
        assert_eq!(
            id.to_string(),
            "UUID 3f1c5d6e-0728-494a-8b9c-adbecfd0e1f2 in nqn.t"
        );
        assert_eq!(id.wwid(), "uuid.3f1c5d6e-0728-494a-8b9c-adbecfd0e1f2");
        assert_eq!(parse_uuid(&id.uuid_text()), Some(UUID));
        assert_eq!(
            parse_uuid("3F1C5D6E-0728-494A-8B9C-ADBECFD0E1F2"),
            Some(UUID)
        );
        for bad in [
            "",
            "3f1c5d6e0728494a8b9cadbecfd0e1f2",
            "3f1c5d6e-0728-494a-8b9c-adbecfd0e1f",
            "3f1c5d6e-0728-494a-8b9c-adbecfd0e1fz",
        ] {
            assert_eq!(parse_uuid(bad), None, "{bad}");
        }
        // Another namespace UUID is another namespace; the same one through another
        // controller (another serial number would not matter) is the same.
        let mut other = id.clone();
        other.uuid[15] ^= 1;
        assert!(!id.same_namespace(&other));
        let mut via_b = id.clone();
        via_b.serial = b"other".to_vec();
        assert!(id.same_namespace(&via_b));
    }

    #[test]
    fn linux_order_uuid_then_nguid_then_eui64_then_serial() {
        let mut id = NamespaceIdentity::from_identify(
            7,
            &ns_fixture(),
            &ctrl_with(0x8086, "PHM123", "INTEL SSD", "s"),
            Some(&descs(&[(3, &UUID)])),
        )
        .unwrap();
        assert!(matches!(id.id(), Some(NamespaceId::Uuid(_))));
        id.uuid = [0; 16];
        assert!(matches!(id.id(), Some(NamespaceId::Nguid(_))));
        id.nguid = [0; 16];
        assert_eq!(id.id(), Some(NamespaceId::Eui64(id.eui64)));
        assert_eq!(id.to_string(), "EUI-64 a0a1a2a3a4a5a6a7 in s");
        assert_eq!(id.wwid(), "eui.a0a1a2a3a4a5a6a7");
        id.eui64 = [0; 8];
        assert_eq!(id.kind(), Some(IdentityKind::VidSerialModelNsid));
        assert_eq!(
            id.to_string(),
            "serial \"PHM123\" (vid 0x8086, model \"INTEL SSD\", nsid 7) in s"
        );
        id.serial.clear();
        assert_eq!(id.id(), None);
        assert!(!id.is_identified());
        id.subnqn.clear();
        assert_eq!(
            id.to_string(),
            "no UUID, NGUID, EUI-64 or serial number (no subsystem NQN)"
        );
    }

    #[test]
    fn descriptors_fill_in_zero_fields_and_must_agree_with_set_ones() {
        // NGUID and EUI-64 only in the descriptor list.
        let id = NamespaceIdentity::from_identify(
            1,
            &vec![0u8; 4096],
            &ctrl_fixture(b"s"),
            Some(&descs(&[(2, &[0x42; 16]), (1, &[0x24; 8])])),
        )
        .unwrap();
        assert_eq!((id.nguid, id.eui64), ([0x42; 16], [0x24; 8]));
        // The same NGUID in both places is fine; a different one is refused.
        let ns = ns_fixture();
        let same = descs(&[(2, &ns[104..120])]);
        assert!(NamespaceIdentity::from_identify(1, &ns, &ctrl_fixture(b"s"), Some(&same)).is_ok());
        let e = NamespaceIdentity::from_identify(
            1,
            &ns,
            &ctrl_fixture(b"s"),
            Some(&descs(&[(2, &[0x42; 16])])),
        )
        .unwrap_err();
        assert!(
            matches!(e, IdentifyError::DescriptorMismatch { field: "NGUID", .. }),
            "{e:?}"
        );
    }

    #[test]
    fn an_ebs_volume_is_named_by_vendor_serial_model_and_nsid() {
        let a = ebs("vol0123456789abcdef0");
        assert_eq!(a.kind(), Some(IdentityKind::VidSerialModelNsid));
        assert!(a.is_identified());
        assert_eq!(a.serial_text(), "vol0123456789abcdef0");
        assert_eq!(a.model_text(), "Amazon Elastic Block Store");
        // Linux's name for it; the model's hex is the one of published by-id listings.
        assert_eq!(
            a.wwid(),
            format!(
                "nvme.1d0f-{}-416d617a6f6e20456c617374696320426c6f636b2053746f7265-00000001",
                hex(b"vol0123456789abcdef0")
            )
        );
        assert_eq!(a.ebs_volume_id().as_deref(), Some("vol-0123456789abcdef0"));
        assert_eq!(
            a.to_string(),
            "serial \"vol0123456789abcdef0\" (vid 0x1d0f, model \"Amazon Elastic Block Store\", nsid 1) (no subsystem NQN)"
        );
        // Two volumes differ; the same volume through another attachment does not.
        let b = ebs("vol0fedcba9876543210");
        assert_ne!(a.id(), b.id());
        assert!(!a.same_namespace(&b) && !b.same_namespace(&a));
        assert!(a.same_namespace(&ebs("vol0123456789abcdef0")));
        // Another namespace id, model or vendor is another namespace.
        for change in [
            (|i: &mut NamespaceIdentity| i.nsid = 2) as fn(&mut NamespaceIdentity),
            |i| i.vid = 0x1d0e,
            |i| i.model = b"Amazon EC2 NVMe Instance Storage".to_vec(),
        ] {
            let mut c = a.clone();
            change(&mut c);
            assert!(!a.same_namespace(&c), "{c}");
        }
        // Not EBS: no volume id.
        let mut c = a.clone();
        c.model = b"Amazon EC2 NVMe Instance Storage".to_vec();
        assert_eq!(c.ebs_volume_id(), None);
        c = a.clone();
        c.serial = b"AWS1234".to_vec();
        assert_eq!(c.ebs_volume_id(), None);
    }

    #[test]
    fn a_controller_without_a_serial_number_leaves_the_namespace_unidentified() {
        let id = ebs("");
        assert_eq!(id.id(), None);
        // Linux still names it (an empty serial field).
        assert!(id.wwid().starts_with("nvme.1d0f--416d"), "{}", id.wwid());
        // Two unidentified namespaces of one subsystem cannot be told apart.
        assert!(id.same_namespace(&ebs("")));
        assert!(!id.same_namespace(&ebs("vol1")));
    }

    #[test]
    fn same_namespace_needs_same_id_and_subsystem() {
        let a =
            NamespaceIdentity::from_identify(1, &ns_fixture(), &ctrl_fixture(b"s"), None).unwrap();
        let mut b = a.clone();
        assert!(a.same_namespace(&b));
        // Another EUI-64 does not matter while the NGUIDs agree.
        b.eui64 = [1; 8];
        assert!(a.same_namespace(&b));
        // Nor a UUID the device reports now and did not before.
        b.uuid = UUID;
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
    fn the_nguid_eui64_rule_compares_as_before() {
        // A reference recorded before UUIDs were read: NGUID only.
        let mut old = NamespaceIdentity::from_hex(
            "00112233445566778899aabbccddeeff",
            "0000000000000000",
            "s",
        )
        .unwrap();
        old.rule = MatchRule::NguidEui64;
        assert_eq!(
            old.to_string(),
            "NGUID 00112233445566778899aabbccddeeff in s"
        );
        // The same device read today reports a UUID too (nvmet always does): it still
        // matches, and so it does under the new rule with the recorded NGUID.
        let mut now = NamespaceIdentity::from_identify(
            1,
            &ns_fixture(),
            &ctrl_with(0, "x", "Linux", "s"),
            Some(&descs(&[(3, &UUID)])),
        )
        .unwrap();
        now.eui64 = [0; 8];
        assert_eq!(now.kind(), Some(IdentityKind::Uuid));
        assert!(old.same_namespace(&now));
        now.nguid[0] ^= 1;
        assert!(!old.same_namespace(&now));
        // An old unidentified reference matches a device with no NGUID or EUI-64,
        // whatever UUID or serial it reports now (as it did), and not one with an NGUID.
        let mut none = NamespaceIdentity::from_hex(&"0".repeat(32), &"0".repeat(16), "s").unwrap();
        none.rule = MatchRule::NguidEui64;
        assert_eq!(none.to_string(), "no NGUID or EUI-64 in s");
        now.nguid = [0; 16];
        assert!(none.same_namespace(&now));
        now.eui64 = [5; 8];
        assert!(!none.same_namespace(&now));
    }

    #[test]
    fn kind_names_round_trip() {
        for k in IdentityKind::ALL {
            assert_eq!(k.as_str().parse::<IdentityKind>(), Ok(k));
        }
        assert!("wwid".parse::<IdentityKind>().is_err());
    }

    #[test]
    fn hex_round_trip_and_refusals() {
        let a =
            NamespaceIdentity::from_identify(0, &ns_fixture(), &ctrl_fixture(b"s"), None).unwrap();
        let b = NamespaceIdentity::from_hex(&a.nguid_hex(), &a.eui64_hex(), "s").unwrap();
        assert_eq!(a, b);
        assert!(NamespaceIdentity::from_hex("00", &a.eui64_hex(), "s").is_none());
        assert!(NamespaceIdentity::from_hex(&a.nguid_hex(), "zz00000000000000", "s").is_none());
        // Multi-byte UTF-8 of the right byte length is not hex (and must not panic).
        assert!(NamespaceIdentity::from_hex(&"é".repeat(16), &a.eui64_hex(), "s").is_none());
        assert_eq!(decode_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex(""), Some(vec![]));
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

    /// A descriptor list as a device would build it from these identifiers.
    fn encode(d: &NamespaceDescriptors, unknown: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut list: Vec<(u8, Vec<u8>)> = unknown.to_vec();
        if let Some(v) = d.eui64 {
            list.push((1, v.to_vec()));
        }
        if let Some(v) = d.nguid {
            list.push((2, v.to_vec()));
        }
        if let Some(v) = d.uuid {
            list.push((3, v.to_vec()));
        }
        if let Some(v) = d.csi {
            list.push((4, vec![v]));
        }
        let refs: Vec<(u8, &[u8])> = list.iter().map(|(t, v)| (*t, v.as_slice())).collect();
        descs(&refs)
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
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
            if let Ok(c) = parse_controller(&buf) {
                prop_assert!(c.serial.len() <= SN_LEN && c.model.len() <= MN_LEN);
                prop_assert!(c.serial.last().is_none_or(|b| *b != b' ' && *b != 0));
            }
        }

        /// Any bytes: an answer or a typed error, never a panic; an answer's
        /// identifiers are bytes of the list.
        #[test]
        fn descriptor_decoder_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            match parse_descriptors(&buf) {
                Ok(d) => {
                    if let Some(u) = d.uuid {
                        prop_assert!(buf.windows(16).any(|w| w == u));
                    }
                }
                Err(IdentifyError::DescriptorTruncated { offset, len, .. }) => {
                    prop_assert!(offset < len && len == buf.len());
                }
                Err(IdentifyError::DescriptorLength { nidl, expected, .. }) => prop_assert_ne!(nidl, expected),
                Err(IdentifyError::DuplicateDescriptor { first, second, .. }) => prop_assert!(first < second),
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
        }

        /// Any set of identifiers, in any order, among descriptors of unknown types,
        /// decodes to itself.
        #[test]
        fn descriptor_lists_round_trip(
            eui64 in proptest::option::of(any::<[u8; 8]>()),
            nguid in proptest::option::of(any::<[u8; 16]>()),
            uuid in proptest::option::of(any::<[u8; 16]>()),
            csi in proptest::option::of(any::<u8>()),
            unknown in proptest::collection::vec((5u8..=255, proptest::collection::vec(any::<u8>(), 1..40)), 0..4),
        ) {
            let d = NamespaceDescriptors { eui64, nguid, uuid, csi };
            prop_assert_eq!(parse_descriptors(&encode(&d, &unknown)), Ok(d));
        }

        #[test]
        fn hex_forms_round_trip(nguid in any::<[u8; 16]>(), eui64 in any::<[u8; 8]>(), uuid in any::<[u8; 16]>()) {
            let a = NamespaceIdentity { nguid, eui64, subnqn: "s".into(), ..NamespaceIdentity::default() };
            let b = NamespaceIdentity::from_hex(&a.nguid_hex(), &a.eui64_hex(), "s");
            prop_assert_eq!(Some(a), b);
            prop_assert_eq!(parse_uuid(&uuid_text(&uuid)), Some(uuid));
        }

        #[test]
        fn from_hex_never_panics(n in ".{0,40}", e in ".{0,20}") {
            let _ = NamespaceIdentity::from_hex(&n, &e, "s");
            let _ = parse_uuid(&n);
            let _ = decode_hex(&e);
        }
    }
}
