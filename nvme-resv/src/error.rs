//! The crate's error type.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::identity::IdentifyError;
use crate::status::NvmeStatus;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The operation an error happened in, for context in [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Opening the device node.
    Open,
    /// `NVME_IOCTL_ID` (learning the namespace ID).
    NamespaceId,
    /// Identify Controller (admin opcode 06h, CNS 01h).
    IdentifyController,
    /// Identify Namespace (admin opcode 06h, CNS 00h).
    IdentifyNamespace,
    /// Identify Namespace Identification Descriptor list (admin opcode 06h, CNS 03h).
    IdentifyDescriptors,
    /// Get Features (admin opcode 0Ah).
    GetFeatures,
    /// Reservation Register (I/O opcode 0Dh).
    Register,
    /// Reservation Report (I/O opcode 0Eh).
    Report,
    /// Reservation Acquire (I/O opcode 11h).
    Acquire,
    /// Reservation Release (I/O opcode 15h).
    Release,
    /// A read command (the model's access check).
    Read,
    /// A write command (the model's access check).
    Write,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Open => "open",
            Self::NamespaceId => "NVME_IOCTL_ID",
            Self::IdentifyController => "Identify Controller",
            Self::IdentifyNamespace => "Identify Namespace",
            Self::IdentifyDescriptors => "Identify Namespace Identification Descriptor list",
            Self::GetFeatures => "Get Features",
            Self::Register => "Reservation Register",
            Self::Report => "Reservation Report",
            Self::Acquire => "Reservation Acquire",
            Self::Release => "Reservation Release",
            Self::Read => "Read",
            Self::Write => "Write",
        })
    }
}

/// Why a Reservation Report data structure could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The buffer is shorter than the header.
    #[error("report of {len} bytes is shorter than its {header}-byte header")]
    TruncatedHeader {
        /// Bytes available.
        len: usize,
        /// Header size of the layout (24 regular, 64 extended).
        header: usize,
    },
    /// REGCTL says more registrants than the buffer holds.
    #[error("report says {regctl} registrants ({needed} bytes) but only {len} bytes arrived")]
    Truncated {
        /// REGCTL from the header.
        regctl: u16,
        /// Bytes the full report needs.
        needed: usize,
        /// Bytes available.
        len: usize,
    },
}

/// Errors of this crate. Match on the classification methods
/// ([`Error::is_reservation_conflict`], [`Error::status`]) rather than on variants
/// where possible; the enum grows.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device node could not be opened.
    #[error("cannot open {}", path.display())]
    Open {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused for lack of privilege (EACCES / EPERM).
    #[error(
        "{op} on {}: permission denied (needs root / CAP_SYS_ADMIN, or a device opened for writing)",
        path.display()
    )]
    PermissionDenied {
        /// The device.
        path: PathBuf,
        /// What was attempted.
        op: Operation,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `NVME_IOCTL_ID` failed with ENOTTY: the path is not an NVMe namespace.
    #[error(
        "{} is not an NVMe namespace (NVME_IOCTL_ID failed with ENOTTY); \
         expected /dev/nvmeXnY or /dev/ngXnY",
        path.display()
    )]
    NotNvme {
        /// The path given.
        path: PathBuf,
    },
    /// The controller or namespace does not support reservations (ONCS bit 5 clear or
    /// RESCAP zero).
    #[error("namespace {nsid} of {} does not support reservations (ONCS bit 5 {oncs}, RESCAP {rescap:#04x})", path.display())]
    NoReservationSupport {
        /// The device.
        path: PathBuf,
        /// Namespace ID.
        nsid: u32,
        /// ONCS Reservations bit.
        oncs: bool,
        /// RESCAP byte.
        rescap: u8,
    },
    /// A command would register the key 0, which this crate never does.
    #[error("{op}: reservation key 0 cannot be registered")]
    ZeroKey {
        /// The refused operation.
        op: Operation,
    },
    /// The device completed the command with a non-success NVMe status.
    #[error("{op} on namespace {nsid}: {status}")]
    Device {
        /// The failed command.
        op: Operation,
        /// Namespace ID.
        nsid: u32,
        /// The completion status.
        status: NvmeStatus,
    },
    /// The ioctl itself failed (negative return).
    #[error("{op} on namespace {nsid}: ioctl failed")]
    Ioctl {
        /// The failed command.
        op: Operation,
        /// Namespace ID (0 when not yet known).
        nsid: u32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The Reservation Report data could not be parsed.
    #[error("{op} on namespace {nsid}: invalid report data")]
    InvalidReport {
        /// The command whose data was bad.
        op: Operation,
        /// Namespace ID.
        nsid: u32,
        /// What was wrong.
        #[source]
        source: ReportError,
    },
    /// Identify data could not be decoded.
    #[error("{op} on namespace {nsid}: invalid identify data")]
    InvalidIdentify {
        /// The Identify command whose data was bad.
        op: Operation,
        /// Namespace ID.
        nsid: u32,
        /// What was wrong.
        #[source]
        source: IdentifyError,
    },
    /// This handle cannot perform the operation (a [`crate::Reservations`]
    /// implementation without it).
    #[error("{op} is not supported by this device handle")]
    Unsupported {
        /// The operation.
        op: Operation,
    },
}

impl Error {
    /// Whether the device answered Reservation Conflict (any flags).
    pub fn is_reservation_conflict(&self) -> bool {
        self.status()
            .is_some_and(NvmeStatus::is_reservation_conflict)
    }

    /// The NVMe status when the device completed the command with an error status.
    pub fn status(&self) -> Option<NvmeStatus> {
        match self {
            Self::Device { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether retrying the same command may succeed: a device status without DNR,
    /// or an interrupted ioctl. Reservation conflicts are never retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Device { status, .. } => !status.dnr() && !status.is_reservation_conflict(),
            Self::Ioctl { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::EINTR | libc::EAGAIN | libc::ETIMEDOUT)
            ),
            _ => false,
        }
    }

    /// Whether this is [`Error::PermissionDenied`].
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Self::PermissionDenied { .. })
    }
}
