//! NVMe persistent reservations over Linux passthrough ioctls.
//!
//! Terms and field names follow the NVM Express Base Specification, revision 2.0c,
//! section 8.19 ("Reservations") and the NVM Command Set Specification 1.0c,
//! section 3.2.4-3.2.7 / 4.1.3.x (Reservation Register, Acquire, Release, Report).
//!
//! The API is split so that everything that can be checked without hardware is:
//! [`cmd`] holds the pure command encoders, [`report`] the report parser, [`status`]
//! the NVMe status decoding, [`model`] an in-memory model of the specification's
//! reservation rules. [`Namespace`] is the real device; [`Reservations`] is the trait
//! both the device and the model implement.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod cmd;
mod error;
pub mod model;
mod namespace;
pub mod report;
pub mod status;
mod sys;

pub use cmd::{
    Acquire, AcquireAction, Cptpl, Register, RegisterAction, Release, ReleaseAction,
};
pub use error::{Error, Result};
pub use report::{RegisteredController, ReservationStatus};




/// A reservation key (CRKEY / NRKEY / PRKEY in the specification): 64 bits chosen by
/// the host. This crate never registers the value 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Key(pub u64);

/// The key [`key_for_node`] returns for a node whose FNV-1a hash is 0: FNV-1a 64 of
/// the empty string's offset basis is never 0 for short ids, but a hash of exactly
/// 0 is possible, and 0 cannot be registered, so it is mapped to this constant.
pub const ZERO_HASH_KEY: Key = Key(0xcbf2_9ce4_8422_2325);

/// The reservation key of a node: FNV-1a 64 of its node id. Any survivor can compute
/// the key of any other node without a registry. Never returns `Key(0)`.
pub fn key_for_node(node_id: &str) -> Key {
    let _ = node_id;
    unimplemented!()
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
}

/// A 128-bit host identifier (extended data structure) or a 64-bit one (regular data
/// structure, zero-extended in the low 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HostId(pub [u8; 16]);

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
}
