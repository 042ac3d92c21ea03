//! Reservation Report data structures and their parser (pure: no I/O).

use crate::{HostId, Key, ReservationType};

/// One Registered Controller (regular) or Registered Controller Extended data structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredController {
    /// Controller ID (nvmet reports 0xffff: dynamic controller model).
    pub cntlid: u16,
    /// Reservation Status: bit 0 set when this registrant holds the reservation.
    pub rcsts: u8,
    /// Host Identifier (64-bit ids zero-extended when the regular structure was used).
    pub hostid: HostId,
    /// Reservation Key.
    pub rkey: Key,
}

/// A parsed Reservation Report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationStatus {
    /// Generation (GEN; `gen` is a reserved word in Rust 2024): incremented by the device on every preempt, clear, and
    /// registration change per the specification.
    pub generation: u32,
    /// Reservation Type held, `ReservationType::NONE` when none is held.
    pub rtype: ReservationType,
    /// Number of Registered Controllers (REGCTL), as the device reported it.
    pub regctl: u16,
    /// Persist Through Power Loss State.
    pub ptpls: bool,
    /// Every registrant (the buffer is grown until all fit).
    pub registrants: Vec<RegisteredController>,
    /// Whether the extended data structure (128-bit host ids) was used.
    pub extended: bool,
}

// nvme-resv helper: ReservationStatus::holder(), ::is_registered(Key), parse_regular(),
// parse_extended(), nvme-cli compatible JSON (gen, rtype, regctl, ptpls,
// regctlext[{cntlid, rcsts, hostid, rkey}]).
