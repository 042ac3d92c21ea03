//! NVMe completion status (NVM Express Base Specification 2.0c, section 4.6.1.2,
//! figure 92 "Completion Queue Entry: Status Field") and the one function that decodes
//! a passthrough ioctl's return value.
//!
//! Linux hands the status field back without the Phase Tag, so bit 0 of the value here
//! is bit 0 of SC: SC is bits 7:0, SCT bits 10:8, CRD bits 12:11, More bit 13, DNR
//! bit 14.

use std::fmt;
use std::io;

/// An NVMe status field as the Linux passthrough ioctls return it (Phase Tag removed).
///
/// An open newtype: a device may answer with a code this crate does not name. Compare
/// codes with [`NvmeStatus::code`] (or the predicates), never with `==` on the raw
/// value, which includes the DNR / More / CRD flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NvmeStatus(pub u16);

impl NvmeStatus {
    const SC_MASK: u16 = 0x00ff;
    const SCT_SHIFT: u16 = 8;
    const SCT_MASK: u16 = 0x7;
    const CRD_SHIFT: u16 = 11;
    const CRD_MASK: u16 = 0x3;
    /// More (M), bit 13: more status information is in the Error Information log.
    pub const MORE: u16 = 1 << 13;
    /// Do Not Retry (DNR), bit 14.
    pub const DNR: u16 = 1 << 14;

    /// Status Code Type 0h: Generic Command Status.
    pub const SCT_GENERIC: u8 = 0;
    /// Status Code Type 1h: Command Specific Status.
    pub const SCT_COMMAND_SPECIFIC: u8 = 1;
    /// Status Code Type 2h: Media and Data Integrity Errors.
    pub const SCT_MEDIA: u8 = 2;
    /// Status Code Type 3h: Path Related Status.
    pub const SCT_PATH: u8 = 3;

    /// Successful Completion (generic 00h).
    pub const SUCCESS: Self = Self::generic(0x00);
    /// Invalid Command Opcode (generic 01h); nvmet also answers it for an unknown
    /// RREGA / RACQA / RRELA.
    pub const INVALID_OPCODE: Self = Self::generic(0x01);
    /// Invalid Field in Command (generic 02h).
    pub const INVALID_FIELD: Self = Self::generic(0x02);
    /// Data Transfer Error (generic 04h).
    pub const DATA_TRANSFER_ERROR: Self = Self::generic(0x04);
    /// Internal Error (generic 06h).
    pub const INTERNAL: Self = Self::generic(0x06);
    /// Command Abort Requested (generic 07h).
    pub const ABORT_REQUESTED: Self = Self::generic(0x07);
    /// Invalid Namespace or Format (generic 0Bh).
    pub const INVALID_NAMESPACE: Self = Self::generic(0x0b);
    /// Host Identifier Inconsistent Format (generic 18h): e.g. a Reservation Report
    /// without the extended data structure while 128-bit host identifiers are in use.
    pub const HOST_ID_INCONSISTENT_FORMAT: Self = Self::generic(0x18);
    /// LBA Out of Range (generic 80h).
    pub const LBA_OUT_OF_RANGE: Self = Self::generic(0x80);
    /// Namespace Not Ready (generic 82h).
    pub const NAMESPACE_NOT_READY: Self = Self::generic(0x82);
    /// Reservation Conflict (generic 83h).
    pub const RESERVATION_CONFLICT: Self = Self::generic(0x83);

    /// A status with SCT 0 (generic) and the given SC, no flags.
    pub const fn generic(sc: u8) -> Self {
        Self(sc as u16)
    }

    /// A status from SCT and SC, no flags.
    pub const fn new(sct: u8, sc: u8) -> Self {
        Self((((sct as u16) & Self::SCT_MASK) << Self::SCT_SHIFT) | sc as u16)
    }

    /// Status Code (SC), bits 7:0.
    pub const fn sc(self) -> u8 {
        (self.0 & Self::SC_MASK) as u8
    }

    /// Status Code Type (SCT), bits 10:8.
    pub const fn sct(self) -> u8 {
        ((self.0 >> Self::SCT_SHIFT) & Self::SCT_MASK) as u8
    }

    /// Command Retry Delay (CRD), bits 12:11.
    pub const fn crd(self) -> u8 {
        ((self.0 >> Self::CRD_SHIFT) & Self::CRD_MASK) as u8
    }

    /// More (M), bit 13.
    pub const fn more(self) -> bool {
        self.0 & Self::MORE != 0
    }

    /// Do Not Retry (DNR), bit 14.
    pub const fn dnr(self) -> bool {
        self.0 & Self::DNR != 0
    }

    /// SCT and SC only (bits 10:0): the value to compare codes with.
    pub const fn code(self) -> u16 {
        self.0 & ((Self::SCT_MASK << Self::SCT_SHIFT) | Self::SC_MASK)
    }

    /// The same status with DNR set.
    pub const fn with_dnr(self) -> Self {
        Self(self.0 | Self::DNR)
    }

    /// The same status with More set.
    pub const fn with_more(self) -> Self {
        Self(self.0 | Self::MORE)
    }

    /// Whether SCT/SC say Successful Completion.
    pub const fn is_success(self) -> bool {
        self.code() == Self::SUCCESS.code()
    }

    /// Whether SCT/SC say Reservation Conflict, whatever the flags.
    pub const fn is_reservation_conflict(self) -> bool {
        self.code() == Self::RESERVATION_CONFLICT.code()
    }

    /// Whether the code is the same as `other`'s, ignoring DNR, More and CRD.
    pub const fn same_code(self, other: Self) -> bool {
        self.code() == other.code()
    }

    /// A short name for the codes this crate knows, `None` otherwise.
    pub fn name(self) -> Option<&'static str> {
        const NAMES: [(NvmeStatus, &str); 12] = [
            (NvmeStatus::SUCCESS, "Successful Completion"),
            (NvmeStatus::INVALID_OPCODE, "Invalid Command Opcode"),
            (NvmeStatus::INVALID_FIELD, "Invalid Field in Command"),
            (NvmeStatus::DATA_TRANSFER_ERROR, "Data Transfer Error"),
            (NvmeStatus::INTERNAL, "Internal Error"),
            (NvmeStatus::ABORT_REQUESTED, "Command Abort Requested"),
            (NvmeStatus::INVALID_NAMESPACE, "Invalid Namespace or Format"),
            (
                NvmeStatus::HOST_ID_INCONSISTENT_FORMAT,
                "Host Identifier Inconsistent Format",
            ),
            (NvmeStatus::LBA_OUT_OF_RANGE, "LBA Out of Range"),
            (NvmeStatus::NAMESPACE_NOT_READY, "Namespace Not Ready"),
            (NvmeStatus::RESERVATION_CONFLICT, "Reservation Conflict"),
            (NvmeStatus::new(1, 0x0b), "Invalid Format"),
        ];
        NAMES
            .iter()
            .find(|(s, _)| s.same_code(self))
            .map(|(_, n)| *n)
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}")?,
            None => write!(f, "unknown status")?,
        }
        write!(
            f,
            " (status {:#06x}: sct {:#x} sc {:#04x}",
            self.0,
            self.sct(),
            self.sc()
        )?;
        if self.crd() != 0 {
            write!(f, " crd {}", self.crd())?;
        }
        if self.more() {
            write!(f, " more")?;
        }
        if self.dnr() {
            write!(f, " dnr")?;
        }
        write!(f, ")")
    }
}

/// How a passthrough command completed, decoded from the ioctl's return value.
#[derive(Debug)]
#[non_exhaustive]
pub enum Completion {
    /// Return value 0: success; `result` is completion queue entry dword 0.
    Success {
        /// Command specific result (CQE dword 0).
        result: u32,
    },
    /// Positive return value: the controller completed the command with this status.
    /// A reservation conflict arrives here, never as an errno.
    Status(NvmeStatus),
    /// Negative return value: the kernel refused or failed the ioctl itself.
    Os(io::Error),
}

/// Decodes a passthrough ioctl return value: `< 0` is an OS error (`errno` is called
/// to fetch it), `0` is success, `> 0` is an NVMe status (the low 15 bits; DNR and
/// More are kept as flags of [`NvmeStatus`]). The only place the crate interprets the
/// return value.
pub fn decode_return(ret: i32, result: u32, errno: impl FnOnce() -> io::Error) -> Completion {
    match ret {
        r if r < 0 => Completion::Os(errno()),
        0 => Completion::Success { result },
        // The kernel returns the 15-bit status field; anything above is not status.
        r => Completion::Status(NvmeStatus((r & 0x7fff) as u16)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reservation_conflict_with_and_without_flags() {
        // nvmet answers a conflicting write with 0x6083 (DNR | More | 0x83).
        for raw in [0x0083u16, 0x4083, 0x2083, 0x6083, 0x1883] {
            let s = NvmeStatus(raw);
            assert!(s.is_reservation_conflict(), "{raw:#x}");
            assert_eq!((s.sct(), s.sc()), (0, 0x83));
            assert!(!s.is_success());
        }
        let s = NvmeStatus(0x6083);
        assert!(s.dnr() && s.more());
        let s = NvmeStatus(0x0083);
        assert!(!s.dnr() && !s.more());
        // Same SC under another SCT is not a conflict.
        assert!(!NvmeStatus::new(1, 0x83).is_reservation_conflict());
    }

    #[test]
    fn field_layout() {
        let s = NvmeStatus(0x4000 | 0x2000 | (0b10 << 11) | (2 << 8) | 0x81);
        assert_eq!(s.sc(), 0x81);
        assert_eq!(s.sct(), 2);
        assert_eq!(s.crd(), 2);
        assert!(s.more());
        assert!(s.dnr());
        assert_eq!(s.code(), 0x281);
        assert_eq!(NvmeStatus::HOST_ID_INCONSISTENT_FORMAT.with_dnr().0, 0x4018);
        assert_eq!(NvmeStatus::new(1, 0x0b).0, 0x10b);
    }

    #[test]
    fn display_names_code_and_flags() {
        let text = NvmeStatus(0x6083).to_string();
        assert!(text.starts_with("Reservation Conflict"), "{text}");
        assert!(text.contains("0x6083") && text.contains("dnr") && text.contains("more"));
        let text = NvmeStatus(0x0299).to_string();
        assert!(text.starts_with("unknown status"), "{text}");
    }

    #[test]
    fn decode_return_values() {
        let no_errno = || -> io::Error { panic!("errno read for a non-negative return") };
        assert!(matches!(
            decode_return(0, 7, no_errno),
            Completion::Success { result: 7 }
        ));
        match decode_return(0x6083, 0, no_errno) {
            Completion::Status(s) => assert!(s.is_reservation_conflict() && s.dnr()),
            other => panic!("{other:?}"),
        }
        match decode_return(-1, 0, || io::Error::from_raw_os_error(libc::ENOTTY)) {
            Completion::Os(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOTTY)),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #[test]
        fn decode_never_turns_nonzero_into_success(ret in any::<i32>(), result in any::<u32>()) {
            let c = decode_return(ret, result, || io::Error::from_raw_os_error(libc::EIO));
            match c {
                Completion::Success { result: r } => { prop_assert_eq!(ret, 0); prop_assert_eq!(r, result); }
                Completion::Status(s) => {
                    prop_assert!(ret > 0);
                    prop_assert_eq!(s.0, (ret & 0x7fff) as u16);
                }
                Completion::Os(_) => prop_assert!(ret < 0),
            }
        }

        #[test]
        fn flags_never_change_the_code(raw in any::<u16>()) {
            let s = NvmeStatus(raw);
            prop_assert_eq!(s.with_dnr().code(), s.code());
            prop_assert_eq!(s.with_more().code(), s.code());
            prop_assert_eq!(NvmeStatus::new(s.sct(), s.sc()).code(), s.code());
            prop_assert_eq!(s.is_reservation_conflict(), s.sct() == 0 && s.sc() == 0x83);
            let _ = s.to_string();
        }
    }
}
