//! Reservation command encoders (pure: no I/O).
//!
//! NVM Command Set Specification 1.0c: Reservation Register (opcode 0x0d),
//! Reservation Report (0x0e), Reservation Acquire (0x11), Reservation Release (0x15).

use crate::{Key, ReservationType};

/// Reservation Register Action (RREGA), CDW10 bits 2:0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegisterAction {
    /// Register Reservation Key (000b).
    Register,
    /// Unregister Reservation Key (001b).
    Unregister,
    /// Replace Reservation Key (010b).
    Replace,
}

/// Change Persist Through Power Loss State (CPTPL), CDW10 bits 31:30.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Cptpl {
    /// No change to the PTPL state (00b).
    #[default]
    NoChange,
    /// Reservations are released and registrants cleared on power on (10b).
    Clear,
    /// Reservations and registrants persist across a power loss (11b).
    Persist,
}

/// A Reservation Register command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Register {
    /// RREGA.
    pub rrega: RegisterAction,
    /// Current Reservation Key (ignored by the device for `Register` unless IEKEY=0 and
    /// the host is already registered).
    pub crkey: Key,
    /// New Reservation Key (`Register`, `Replace`).
    pub nrkey: Key,
    /// Ignore Existing Key.
    pub iekey: bool,
    /// CPTPL.
    pub cptpl: Cptpl,
}

/// Reservation Acquire Action (RACQA), CDW10 bits 2:0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcquireAction {
    /// Acquire (000b).
    Acquire,
    /// Preempt (001b).
    Preempt,
    /// Preempt and Abort (010b).
    PreemptAndAbort,
}

/// A Reservation Acquire command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquire {
    /// RACQA.
    pub racqa: AcquireAction,
    /// RTYPE.
    pub rtype: ReservationType,
    /// Current Reservation Key: this host's registered key.
    pub crkey: Key,
    /// Preempt Reservation Key: the key to preempt (`Preempt`, `PreemptAndAbort`).
    pub prkey: Key,
    /// Ignore Existing Key.
    pub iekey: bool,
}

/// Reservation Release Action (RRELA), CDW10 bits 2:0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseAction {
    /// Release (000b).
    Release,
    /// Clear (001b).
    Clear,
}

/// A Reservation Release command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// RRELA.
    pub rrela: ReleaseAction,
    /// RTYPE (must match the held reservation for `Release`).
    pub rtype: ReservationType,
    /// Current Reservation Key.
    pub crkey: Key,
    /// Ignore Existing Key.
    pub iekey: bool,
}

// Constructors every caller uses: Register::register(nrkey), Register::replace(crkey,
// nrkey), Register::unregister(crkey), Acquire::acquire(crkey, rtype),
// Acquire::preempt(crkey, prkey, rtype), Acquire::preempt_and_abort(crkey, prkey,
// rtype), Release::release(crkey, rtype), Release::clear(crkey), plus `with_iekey()`
// and `with_cptpl()` builders, and `cdw10()` / data-buffer encoders.
// (nvme-resv helper: implement.)
