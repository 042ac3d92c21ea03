//! Reservation command encoders (pure: no I/O).
//!
//! NVM Express Base Specification 2.0c, section 7 (I/O commands common to all command
//! sets): 7.2 Reservation Acquire (opcode 11h), 7.3 Reservation Register (0Dh),
//! 7.4 Reservation Release (15h), 7.5 Reservation Report (0Eh). Field names are the
//! specification's mnemonics.

use crate::error::{Error, Operation, Result};
use crate::{Key, ReservationType};

/// Reservation Register Action (RREGA), CDW10 bits 2:0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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

/// Command opcodes (Base Specification 2.0c, "Opcodes for I/O Commands" and "Opcodes
/// for Admin Commands").
pub mod opcode {
    /// Reservation Register.
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    /// Reservation Report.
    pub const RESERVATION_REPORT: u8 = 0x0e;
    /// Reservation Acquire.
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RESERVATION_RELEASE: u8 = 0x15;
    /// Identify (admin command, Base Specification 2.0c section 5.17).
    pub const ADMIN_IDENTIFY: u8 = 0x06;
    /// Get Features (admin command, Base Specification 2.0c section 5.15).
    pub const ADMIN_GET_FEATURES: u8 = 0x0a;
}

/// Identify Controller or Namespace Structure (CNS) values, Base Specification 2.0c
/// section 5.17.1, figure "CNS Values".
pub mod cns {
    /// Identify Namespace data structure for the specified NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Namespace Identification Descriptor list for the specified NSID.
    pub const DESCRIPTORS: u8 = 0x03;
}

/// Identify Command Dword 10 (Base 2.0c 5.17.1): CNS in bits 7:0, CNTID 31:16 zero.
pub const fn identify_cdw10(cns: u8) -> u32 {
    cns as u32
}

/// Feature Identifier of Reservation Persistence (Base 2.0c section 5.27.1,
/// "Reservation Persistence (Feature Identifier 83h)"): namespace specific, dword 0 of
/// the completion has PTPL in bit 0.
pub const FID_RESERVATION_PERSISTENCE: u8 = 0x83;

/// Get Features Select (SEL), CDW10 bits 10:8 (Base 2.0c 5.15, "Get Features - Select").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FeatureSelect {
    /// The value in use now (000b).
    Current,
    /// The value after a reset (001b).
    Default,
    /// The value kept across a power cycle (010b).
    Saved,
}

/// Get Features Command Dword 10 (Base 2.0c 5.15): FID in bits 7:0, SEL in bits 10:8.
pub const fn get_features_cdw10(fid: u8, sel: FeatureSelect) -> u32 {
    let sel = match sel {
        FeatureSelect::Current => 0,
        FeatureSelect::Default => 1,
        FeatureSelect::Saved => 2,
    };
    fid as u32 | sel << 8
}

/// The Reservation Persistence feature's PTPL bit from the completion's dword 0:
/// whether reservations and registrants persist through a power loss now.
pub const fn ptpl_from_dword0(dw0: u32) -> bool {
    dw0 & 1 != 0
}

const IEKEY_BIT: u32 = 1 << 3;
const RTYPE_SHIFT: u32 = 8;
const CPTPL_SHIFT: u32 = 30;

impl RegisterAction {
    /// The RREGA encoding.
    pub const fn rrega(self) -> u8 {
        match self {
            Self::Register => 0b000,
            Self::Unregister => 0b001,
            Self::Replace => 0b010,
        }
    }

    /// Decodes RREGA; `None` for reserved values.
    pub const fn from_rrega(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Register),
            1 => Some(Self::Unregister),
            2 => Some(Self::Replace),
            _ => None,
        }
    }
}

impl Cptpl {
    /// The CPTPL encoding.
    pub const fn cptpl(self) -> u8 {
        match self {
            Self::NoChange => 0b00,
            Self::Clear => 0b10,
            Self::Persist => 0b11,
        }
    }

    /// Decodes CPTPL; `None` for the reserved value 01b and out-of-range values.
    pub const fn from_cptpl(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::NoChange),
            2 => Some(Self::Clear),
            3 => Some(Self::Persist),
            _ => None,
        }
    }
}

impl AcquireAction {
    /// The RACQA encoding.
    pub const fn racqa(self) -> u8 {
        match self {
            Self::Acquire => 0b000,
            Self::Preempt => 0b001,
            Self::PreemptAndAbort => 0b010,
        }
    }

    /// Decodes RACQA; `None` for reserved values.
    pub const fn from_racqa(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Acquire),
            1 => Some(Self::Preempt),
            2 => Some(Self::PreemptAndAbort),
            _ => None,
        }
    }
}

impl ReleaseAction {
    /// The RRELA encoding.
    pub const fn rrela(self) -> u8 {
        match self {
            Self::Release => 0b000,
            Self::Clear => 0b001,
        }
    }

    /// Decodes RRELA; `None` for reserved values.
    pub const fn from_rrela(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Release),
            1 => Some(Self::Clear),
            _ => None,
        }
    }
}

impl Register {
    /// Register `nrkey` (RREGA 000b). Fails with [`Error::ZeroKey`] when sent if
    /// `nrkey` is 0.
    // The spec action names are the clearest constructor names.
    #[allow(clippy::self_named_constructors)]
    pub const fn register(nrkey: Key) -> Self {
        Self {
            rrega: RegisterAction::Register,
            crkey: Key(0),
            nrkey,
            iekey: false,
            cptpl: Cptpl::NoChange,
        }
    }

    /// Replace this host's key `crkey` with `nrkey` (RREGA 010b).
    pub const fn replace(crkey: Key, nrkey: Key) -> Self {
        Self {
            rrega: RegisterAction::Replace,
            crkey,
            nrkey,
            iekey: false,
            cptpl: Cptpl::NoChange,
        }
    }

    /// Unregister this host, whose key is `crkey` (RREGA 001b). With
    /// [`with_iekey(true)`](Self::with_iekey) the key is not checked.
    pub const fn unregister(crkey: Key) -> Self {
        Self {
            rrega: RegisterAction::Unregister,
            crkey,
            nrkey: Key(0),
            iekey: false,
            cptpl: Cptpl::NoChange,
        }
    }

    /// Sets IEKEY (Ignore Existing Key).
    pub const fn with_iekey(mut self, iekey: bool) -> Self {
        self.iekey = iekey;
        self
    }

    /// Sets CPTPL.
    pub const fn with_cptpl(mut self, cptpl: Cptpl) -> Self {
        self.cptpl = cptpl;
        self
    }

    /// Command Dword 10 (Base 2.0c 7.3, "Reservation Register – Command Dword 10"): RREGA bits 2:0, IEKEY bit 3,
    /// CPTPL bits 31:30.
    pub const fn cdw10(&self) -> u32 {
        self.rrega.rrega() as u32
            | if self.iekey { IEKEY_BIT } else { 0 }
            | (self.cptpl.cptpl() as u32) << CPTPL_SHIFT
    }

    /// The 16-byte Reservation Register data structure (Base 2.0c 7.3, "Reservation Register Data Structure"): CRKEY bytes 7:0,
    /// NRKEY bytes 15:8, little endian.
    pub fn data(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&self.crkey.0.to_le_bytes());
        d[8..].copy_from_slice(&self.nrkey.0.to_le_bytes());
        d
    }

    /// Checks what this crate refuses before sending: registering (or replacing with)
    /// the key 0.
    pub fn validate(&self) -> Result<()> {
        match self.rrega {
            RegisterAction::Register | RegisterAction::Replace if self.nrkey.0 == 0 => {
                Err(Error::ZeroKey {
                    op: Operation::Register,
                })
            }
            _ => Ok(()),
        }
    }
}

impl Acquire {
    /// Acquire a reservation of type `rtype` with this host's key `crkey` (RACQA 000b).
    // The spec action names are the clearest constructor names.
    #[allow(clippy::self_named_constructors)]
    pub const fn acquire(crkey: Key, rtype: ReservationType) -> Self {
        Self {
            racqa: AcquireAction::Acquire,
            rtype,
            crkey,
            prkey: Key(0),
            iekey: false,
        }
    }

    /// Preempt the registrants whose key is `prkey` (and the reservation, if `prkey`
    /// is the holder's key), taking a reservation of type `rtype` (RACQA 001b).
    pub const fn preempt(crkey: Key, prkey: Key, rtype: ReservationType) -> Self {
        Self {
            racqa: AcquireAction::Preempt,
            rtype,
            crkey,
            prkey,
            iekey: false,
        }
    }

    /// Like [`Acquire::preempt`], and abort the preempted hosts' commands (RACQA 010b).
    pub const fn preempt_and_abort(crkey: Key, prkey: Key, rtype: ReservationType) -> Self {
        Self {
            racqa: AcquireAction::PreemptAndAbort,
            rtype,
            crkey,
            prkey,
            iekey: false,
        }
    }

    /// Sets IEKEY (the specification makes it reserved here since revision 1.3;
    /// nvmet answers Invalid Field).
    pub const fn with_iekey(mut self, iekey: bool) -> Self {
        self.iekey = iekey;
        self
    }

    /// Command Dword 10 (Base 2.0c 7.2, "Reservation Acquire – Command Dword 10"): RACQA bits 2:0, IEKEY bit 3, RTYPE bits 15:8.
    pub const fn cdw10(&self) -> u32 {
        self.racqa.racqa() as u32
            | if self.iekey { IEKEY_BIT } else { 0 }
            | (self.rtype.0 as u32) << RTYPE_SHIFT
    }

    /// The 16-byte Reservation Acquire data structure (Base 2.0c 7.2, "Reservation Acquire Data Structure"): CRKEY bytes 7:0,
    /// PRKEY bytes 15:8, little endian.
    pub fn data(&self) -> [u8; 16] {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&self.crkey.0.to_le_bytes());
        d[8..].copy_from_slice(&self.prkey.0.to_le_bytes());
        d
    }
}

impl Release {
    /// Release the reservation of type `rtype` held with key `crkey` (RRELA 000b).
    // The spec action names are the clearest constructor names.
    #[allow(clippy::self_named_constructors)]
    pub const fn release(crkey: Key, rtype: ReservationType) -> Self {
        Self {
            rrela: ReleaseAction::Release,
            rtype,
            crkey,
            iekey: false,
        }
    }

    /// Clear: release any reservation and remove every registrant (RRELA 001b).
    pub const fn clear(crkey: Key) -> Self {
        Self {
            rrela: ReleaseAction::Clear,
            rtype: ReservationType::NONE,
            crkey,
            iekey: false,
        }
    }

    /// Sets IEKEY (reserved since revision 1.3; nvmet answers Invalid Field).
    pub const fn with_iekey(mut self, iekey: bool) -> Self {
        self.iekey = iekey;
        self
    }

    /// Command Dword 10 (Base 2.0c 7.4, "Reservation Release – Command Dword 10"): RRELA bits 2:0, IEKEY bit 3, RTYPE bits 15:8.
    pub const fn cdw10(&self) -> u32 {
        self.rrela.rrela() as u32
            | if self.iekey { IEKEY_BIT } else { 0 }
            | (self.rtype.0 as u32) << RTYPE_SHIFT
    }

    /// The 8-byte Reservation Release data structure (Base 2.0c 7.4): CRKEY, little endian.
    pub fn data(&self) -> [u8; 8] {
        self.crkey.0.to_le_bytes()
    }
}

/// Reservation Report Command Dword 10 (Base 2.0c 7.5, "Reservation Report – Command Dword 10"): NUMD, the
/// zero-based number of dwords to transfer, for a buffer of `len` bytes (rounded down
/// to whole dwords; `len` must be at least 4).
pub const fn report_cdw10(len: usize) -> u32 {
    ((len / 4) as u32).saturating_sub(1)
}

/// Reservation Report Command Dword 11 (Base 2.0c 7.5): EDS, bit 0.
pub const fn report_cdw11(extended: bool) -> u32 {
    extended as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: Key = Key(0x0123_4567_89ab_cdef);
    const K2: Key = Key(0xfedc_ba98_7654_3210);

    /// Base Specification 2.0c section 7.3 "Reservation Register command": Command
    /// Dword 10 (RREGA 2:0, IEKEY 3, CPTPL 31:30) and the data structure (CRKEY 7:0,
    /// NRKEY 15:8).
    #[test]
    fn register_cdw10_and_data() {
        let c = Register::register(K1);
        assert_eq!(c.cdw10(), 0b000);
        assert_eq!(&c.data()[..8], &[0; 8], "CRKEY unused by register");
        assert_eq!(&c.data()[8..], &K1.0.to_le_bytes());

        let c = Register::unregister(K1);
        assert_eq!(c.cdw10(), 0b001);
        assert_eq!(&c.data()[..8], &K1.0.to_le_bytes());

        let c = Register::replace(K1, K2);
        assert_eq!(c.cdw10(), 0b010);
        assert_eq!(
            c.data(),
            [
                0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, 0x10, 0x32, 0x54, 0x76, 0x98, 0xba,
                0xdc, 0xfe
            ]
        );

        // IEKEY is bit 3.
        assert_eq!(Register::unregister(K1).with_iekey(true).cdw10(), 0b1001);
        // CPTPL is bits 31:30: 10b clear, 11b persist.
        assert_eq!(
            Register::register(K1).with_cptpl(Cptpl::Clear).cdw10(),
            0x8000_0000
        );
        assert_eq!(
            Register::register(K1)
                .with_cptpl(Cptpl::Persist)
                .with_iekey(true)
                .cdw10(),
            0xc000_0008
        );
        assert_eq!(
            Register::register(K1).with_cptpl(Cptpl::NoChange).cdw10(),
            0
        );
    }

    #[test]
    fn register_refuses_zero_nrkey_only() {
        assert!(matches!(
            Register::register(Key(0)).validate(),
            Err(Error::ZeroKey { .. })
        ));
        assert!(Register::replace(K1, Key(0)).validate().is_err());
        assert!(
            Register::unregister(Key(0))
                .with_iekey(true)
                .validate()
                .is_ok()
        );
        assert!(Register::register(K1).validate().is_ok());
    }

    /// Base Specification 2.0c section 7.2 "Reservation Acquire command": RACQA 2:0,
    /// IEKEY 3, RTYPE 15:8; data CRKEY 7:0, PRKEY 15:8.
    #[test]
    fn acquire_cdw10_and_data() {
        for (i, rtype) in ReservationType::ALL.into_iter().enumerate() {
            let n = i as u32 + 1;
            assert_eq!(Acquire::acquire(K1, rtype).cdw10(), n << 8);
            assert_eq!(Acquire::preempt(K1, K2, rtype).cdw10(), n << 8 | 0b001);
            assert_eq!(
                Acquire::preempt_and_abort(K1, K2, rtype).cdw10(),
                n << 8 | 0b010
            );
        }
        let c = Acquire::preempt(K1, K2, ReservationType::WRITE_EXCLUSIVE).with_iekey(true);
        assert_eq!(c.cdw10(), 0x0109);
        assert_eq!(&c.data()[..8], &K1.0.to_le_bytes());
        assert_eq!(&c.data()[8..], &K2.0.to_le_bytes());
        assert_eq!(
            &Acquire::acquire(K1, ReservationType::EXCLUSIVE_ACCESS).data()[8..],
            &[0; 8]
        );
    }

    /// Base Specification 2.0c section 7.4 "Reservation Release command": RRELA 2:0,
    /// IEKEY 3, RTYPE 15:8; data CRKEY 7:0.
    #[test]
    fn release_cdw10_and_data() {
        let c = Release::release(K1, ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS);
        assert_eq!(c.cdw10(), 0x0600);
        assert_eq!(c.data(), K1.0.to_le_bytes());
        let c = Release::clear(K2);
        assert_eq!(c.cdw10(), 0b001);
        assert_eq!(c.with_iekey(true).cdw10(), 0b1001);
        assert_eq!(c.data(), K2.0.to_le_bytes());
    }

    /// Base Specification 2.0c section 7.5 "Reservation Report command": NUMD
    /// (zero-based dwords) in CDW10, EDS in CDW11 bit 0.
    #[test]
    fn report_dwords() {
        assert_eq!(report_cdw10(4096), 1023);
        assert_eq!(report_cdw10(64), 15);
        assert_eq!(report_cdw10(4), 0);
        assert_eq!(report_cdw11(true), 1);
        assert_eq!(report_cdw11(false), 0);
    }

    /// Base Specification 2.0c 5.17.1 (Identify CDW10: CNS 7:0) and 5.15 (Get
    /// Features CDW10: FID 7:0, SEL 10:8); FID 83h's dword 0: PTPL in bit 0.
    #[test]
    fn admin_dwords() {
        assert_eq!(opcode::ADMIN_GET_FEATURES, 0x0a);
        assert_eq!(identify_cdw10(cns::DESCRIPTORS), 0x03);
        assert_eq!(identify_cdw10(cns::CONTROLLER), 0x01);
        assert_eq!(
            get_features_cdw10(FID_RESERVATION_PERSISTENCE, FeatureSelect::Current),
            0x083
        );
        assert_eq!(
            get_features_cdw10(FID_RESERVATION_PERSISTENCE, FeatureSelect::Saved),
            0x283
        );
        assert_eq!(get_features_cdw10(0x82, FeatureSelect::Default), 0x182);
        assert!(ptpl_from_dword0(1) && ptpl_from_dword0(0xffff_ffff));
        assert!(!ptpl_from_dword0(0) && !ptpl_from_dword0(0xffff_fffe));
    }

    #[test]
    fn action_encodings_round_trip() {
        for v in 0..8u8 {
            if let Some(a) = RegisterAction::from_rrega(v) {
                assert_eq!(a.rrega(), v);
            }
            if let Some(a) = AcquireAction::from_racqa(v) {
                assert_eq!(a.racqa(), v);
            }
            if let Some(a) = ReleaseAction::from_rrela(v) {
                assert_eq!(a.rrela(), v);
            }
        }
        assert_eq!(RegisterAction::from_rrega(3), None);
        assert_eq!(AcquireAction::from_racqa(3), None);
        assert_eq!(ReleaseAction::from_rrela(2), None);
        assert_eq!(Cptpl::from_cptpl(1), None);
        assert_eq!(Cptpl::from_cptpl(3), Some(Cptpl::Persist));
    }
}
