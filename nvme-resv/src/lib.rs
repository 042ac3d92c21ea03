//! NVMe persistent reservations over Linux passthrough ioctls.
//!
//! Terms and field names follow the NVM Express Base Specification, revision 2.0c:
//! section 8.19 ("Reservations") for the rules, sections 7.2-7.5 for the Reservation
//! Acquire, Register, Release and Report commands, 5.17 for Identify; and the NVM
//! Command Set Specification 1.0c for the Identify Namespace fields (RESCAP, FLBAS,
//! LBA formats). Where the specification leaves room, behaviour follows the Linux NVMe
//! target (`drivers/nvme/target/pr.c`); see [`model`].
//!
//! The API is split so that everything that can be checked without hardware is:
//! [`cmd`] holds the pure command encoders, [`report`] the report parser, [`status`]
//! the NVMe status decoding, [`identity`] the namespace identifiers (UUID, NGUID,
//! EUI-64, serial number, subsystem NQN) from Identify data, [`model`] an in-memory model of the specification's
//! reservation rules. [`Namespace`] is the real device; [`Reservations`] is the trait
//! both the device and the model implement. [`node`] holds the rule for valid node ids
//! ([`NodeId`]) and [`raw`] any other passthrough command through a safe function.
//!
//! Feature flags: `cli` (default) builds the `nvme-resv` binary; `json` adds
//! [`ReservationStatus::to_nvme_cli_json`]. The library alone needs neither.
//!
//! # Example
//!
//! Fencing a host: B preempts A's registration and reservation, after which A's writes
//! are refused. Shown on the model; the same calls work on a [`Namespace`] opened
//! with `Namespace::open("/dev/nvme0n1")`.
//!
//! ```
//! use nvme_resv::{model, Access, Acquire, HostId, Register, ReservationType, Reservations};
//!
//! # fn main() -> nvme_resv::Result<()> {
//! let ns = model::Namespace::new();
//! let (a, b) = (ns.host(HostId([0xa; 16])), ns.host(HostId([0xb; 16])));
//! let (ka, kb) = (nvme_resv::key_for_node("node-a"), nvme_resv::key_for_node("node-b"));
//! let rtype = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
//!
//! a.register(&Register::register(ka))?;
//! a.acquire(&Acquire::acquire(ka, rtype))?;
//! b.register(&Register::register(kb))?;
//!
//! // B fences A: A's key is removed and the reservation moves to B.
//! b.acquire(&Acquire::preempt(kb, ka, rtype))?;
//! let err = a.check(Access::Write).unwrap_err();
//! assert!(err.is_reservation_conflict());
//!
//! let status = b.report()?;
//! assert!(!status.is_registered(ka));
//! assert_eq!(status.holder().map(|h| h.rkey), Some(kb));
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod cmd;
mod error;
pub mod identity;
pub mod model;
pub mod namespace;
pub mod node;
mod passthru;
pub mod raw;
pub mod report;
pub mod status;
mod sys;

use std::fmt;
use std::hash::Hasher;

pub use cmd::{Acquire, AcquireAction, Cptpl, Register, RegisterAction, Release, ReleaseAction};
pub use error::{Error, Operation, ReportError, Result};
pub use identity::{
    ControllerIds, IdentifyError, IdentityKind, MatchRule, NamespaceDescriptors, NamespaceId,
    NamespaceIdentity,
};
pub use namespace::{Capabilities, Namespace, ReportFormat};
pub use node::{InvalidNodeId, NodeId};
pub use report::{RegisteredController, ReservationStatus};
pub use status::NvmeStatus;

/// A reservation key (CRKEY / NRKEY / PRKEY in the specification): 64 bits chosen by
/// the host. This crate never registers the value 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Key(pub u64);

impl fmt::Display for Key {
    /// `0x`-prefixed hexadecimal, as nvme-cli's options accept it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// The key [`key_for_node`] returns for a node whose FNV-1a hash is 0. A hash of
/// exactly 0 is possible and 0 cannot be registered, so it is mapped to this constant:
/// the FNV-1a 64 offset basis, which is also the hash of the empty id (node ids are
/// never empty, so no real node collides with it).
pub const ZERO_HASH_KEY: Key = Key(0xcbf2_9ce4_8422_2325);

/// The reservation key of a node: FNV-1a 64 of its node id's UTF-8 bytes. Any survivor
/// can compute the key of any other node without a registry. Never returns `Key(0)`.
///
/// Hashes any string; to refuse ids that `fenced` refuses (empty, `/`, ...) validate
/// with [`NodeId::new`] first and use [`NodeId::key`].
pub fn key_for_node(node_id: &str) -> Key {
    let mut h = fnv::FnvHasher::default();
    h.write(node_id.as_bytes());
    nonzero_key(h.finish())
}

fn nonzero_key(hash: u64) -> Key {
    if hash == 0 { ZERO_HASH_KEY } else { Key(hash) }
}

/// Reservation Type (RTYPE), NVM Command Set spec figure "Reservation Type Encoding".
/// An open newtype: a device may report a value this crate does not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReservationType(pub u8);

impl ReservationType {
    /// No reservation is held (as reported by Reservation Report).
    pub const NONE: Self = Self(0);
    /// Write Exclusive.
    pub const WRITE_EXCLUSIVE: Self = Self(1);
    /// Exclusive Access.
    pub const EXCLUSIVE_ACCESS: Self = Self(2);
    /// Write Exclusive - Registrants Only.
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: Self = Self(3);
    /// Exclusive Access - Registrants Only.
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: Self = Self(4);
    /// Write Exclusive - All Registrants.
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: Self = Self(5);
    /// Exclusive Access - All Registrants.
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: Self = Self(6);
    /// The six types a reservation can be acquired with, in encoding order.
    pub const ALL: [Self; 6] = [
        Self::WRITE_EXCLUSIVE,
        Self::EXCLUSIVE_ACCESS,
        Self::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
        Self::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
        Self::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        Self::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
    ];

    /// Whether this is one of the six acquirable types (1..=6).
    pub const fn is_valid(self) -> bool {
        matches!(self.0, 1..=6)
    }

    /// Write Exclusive or Exclusive Access: only the holder has access.
    pub const fn is_holder_only(self) -> bool {
        matches!(self.0, 1 | 2)
    }

    /// Registrants Only types (3, 4): registrants have access, one holder.
    pub const fn is_registrants_only(self) -> bool {
        matches!(self.0, 3 | 4)
    }

    /// All Registrants types (5, 6): every registrant is a reservation holder.
    pub const fn is_all_registrants(self) -> bool {
        matches!(self.0, 5 | 6)
    }

    /// Whether non-holders lose read access too (Exclusive Access types 2, 4, 6).
    pub const fn is_exclusive_access(self) -> bool {
        matches!(self.0, 2 | 4 | 6)
    }

    /// The specification's name, `None` for values it does not define.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "No Reservation",
            1 => "Write Exclusive",
            2 => "Exclusive Access",
            3 => "Write Exclusive - Registrants Only",
            4 => "Exclusive Access - Registrants Only",
            5 => "Write Exclusive - All Registrants",
            6 => "Exclusive Access - All Registrants",
            _ => return None,
        })
    }

    /// RESCAP bit advertising support of this type (Identify Namespace byte 31).
    pub const fn rescap_bit(self) -> Option<u8> {
        if self.is_valid() {
            Some(1 << self.0)
        } else {
            None
        }
    }
}

impl fmt::Display for ReservationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0),
            None => write!(f, "Reserved ({})", self.0),
        }
    }
}

/// A 128-bit host identifier (extended data structure) or a 64-bit one (regular data
/// structure, zero-extended in the low 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HostId(pub [u8; 16]);

impl fmt::Display for HostId {
    /// 32 lowercase hex digits in byte order, as nvme-cli prints an extended host ID.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// An I/O access a host may attempt, for the access matrix of section 8.19.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// A read command (Read, Compare, Verify).
    Read,
    /// A write command (Write, Write Zeroes, Write Uncorrectable, DSM deallocate).
    Write,
}

/// A namespace with reservations, as seen from one host.
///
/// Implemented by [`Namespace`] (the real device, through passthrough ioctls) and by
/// [`model::Host`] (a host's handle on the in-memory model). Every method returns
/// `Err` when the device answers with a non-success status; in particular a
/// reservation conflict is `Err(e)` with `e.is_reservation_conflict()`, never `Ok`.
pub trait Reservations {
    /// Reservation Register (register / unregister / replace).
    fn register(&self, cmd: &Register) -> Result<()>;
    /// Reservation Acquire (acquire / preempt / preempt-and-abort).
    fn acquire(&self, cmd: &Acquire) -> Result<()>;
    /// Reservation Release (release / clear).
    fn release(&self, cmd: &Release) -> Result<()>;
    /// Reservation Report, every registrant included.
    fn report(&self) -> Result<ReservationStatus>;
    /// Which namespace this is ([`NamespaceIdentity`]: UUID, NGUID, EUI-64, serial
    /// number, subsystem NQN).
    /// The default answers [`Error::Unsupported`]: a handle that cannot identify its
    /// namespace must not be taken for any particular one.
    fn identity(&self) -> Result<NamespaceIdentity> {
        Err(Error::Unsupported {
            op: Operation::IdentifyNamespace,
        })
    }
}

/// Forwarding through references and smart pointers, so that `&T`, `Box<dyn
/// Reservations + Send + Sync>` and `Arc<dyn ...>` are themselves `Reservations`.
macro_rules! forward_reservations {
    ($($ty:ty),*) => {$(
        impl<T: Reservations + ?Sized> Reservations for $ty {
            fn register(&self, cmd: &Register) -> Result<()> {
                (**self).register(cmd)
            }
            fn acquire(&self, cmd: &Acquire) -> Result<()> {
                (**self).acquire(cmd)
            }
            fn release(&self, cmd: &Release) -> Result<()> {
                (**self).release(cmd)
            }
            fn report(&self) -> Result<ReservationStatus> {
                (**self).report()
            }
            fn identity(&self) -> Result<NamespaceIdentity> {
                (**self).identity()
            }
        }
    )*};
}
forward_reservations!(&T, Box<T>, std::sync::Arc<T>);

/// The README's example, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_for_node_is_fnv1a_64() {
        // Reference vectors of FNV-1a 64 (Fowler/Noll/Vo test suite).
        assert_eq!(key_for_node("a"), Key(0xaf63_dc4c_8601_ec8c));
        assert_eq!(key_for_node("foobar"), Key(0x8594_4171_f739_67e8));
        assert_eq!(key_for_node(""), ZERO_HASH_KEY);
        assert_ne!(key_for_node("node-1"), key_for_node("node-2"));
        assert_eq!(key_for_node("node-1"), key_for_node("node-1"));
    }

    #[test]
    fn zero_hash_maps_to_documented_nonzero_key() {
        assert_eq!(nonzero_key(0), ZERO_HASH_KEY);
        assert_ne!(ZERO_HASH_KEY, Key(0));
        assert_eq!(nonzero_key(5), Key(5));
    }

    #[test]
    fn reservation_type_classes() {
        let rt = ReservationType::ALL;
        assert_eq!(rt.map(|t| t.0), [1, 2, 3, 4, 5, 6]);
        assert!(rt.iter().all(|t| t.is_valid()));
        assert!(!ReservationType::NONE.is_valid() && !ReservationType(7).is_valid());
        assert_eq!(rt.map(|t| t.rescap_bit().unwrap()), [2, 4, 8, 16, 32, 64]);
        assert_eq!(ReservationType(9).to_string(), "Reserved (9)");
        assert_eq!(
            ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY.to_string(),
            "Write Exclusive - Registrants Only (3)"
        );
    }

    #[test]
    fn host_id_and_key_display() {
        let h = HostId(core::array::from_fn(|i| i as u8 * 0x11));
        assert_eq!(h.to_string(), "00112233445566778899aabbccddeeff");
        assert_eq!(Key(0xbeef).to_string(), "0xbeef");
    }

    #[test]
    fn trait_objects_are_usable() {
        fn takes(_: &dyn Reservations) {}
        let m = model::Namespace::new();
        let h: Box<dyn Reservations + Send + Sync> = Box::new(m.host(HostId([1; 16])));
        takes(&h);
        let a: std::sync::Arc<dyn Reservations + Send + Sync> =
            std::sync::Arc::new(m.host(HostId([2; 16])));
        takes(&a);
        assert!(a.report().unwrap().registrants.is_empty());
    }
}
