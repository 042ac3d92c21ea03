//! The passthrough request and reply types, shared by the safe entry point
//! ([`raw`](crate::raw), which re-exports them) and the ioctl layer (`sys`), so that
//! neither imports the other.

use crate::status::Completion;

/// Which queue a passthrough command goes to (`NVME_IOCTL_ADMIN_CMD` or
/// `NVME_IOCTL_IO_CMD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Queue {
    /// The admin queue (Identify, Get Log Page, ...).
    Admin,
    /// An I/O queue (Read, Write, the Reservation commands, ...).
    Io,
}

/// The data buffer of a command, lent for the duration of the call.
///
/// The kernel decides the transfer direction from bit 0 of the opcode (set: host to
/// controller). [`submit`](crate::raw::submit) refuses [`Data::ToDevice`] for an opcode the kernel would
/// write into, so a shared buffer is never written.
#[derive(Debug)]
#[non_exhaustive]
pub enum Data<'a> {
    /// No data transfer.
    None,
    /// Host to controller: the kernel only reads it. Needs an opcode with bit 0 set.
    ToDevice(&'a [u8]),
    /// Controller to host: the kernel writes up to its length (or, for an opcode with
    /// bit 0 set, reads it).
    FromDevice(&'a mut [u8]),
}

impl Data<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::None => 0,
            Data::ToDevice(b) => b.len(),
            Data::FromDevice(b) => b.len(),
        }
    }

    /// Whether no bytes are transferred.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The command dwords a caller chooses; the data pointer and length come from
/// [`Data`]. Build with [`Command::new`] and the setters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Command {
    /// Opcode (CDW0 bits 7:0).
    pub opcode: u8,
    /// Namespace ID.
    pub nsid: u32,
    /// Command dwords 10 to 15, command specific.
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
    /// Timeout in milliseconds; 0 is the kernel's default.
    pub timeout_ms: u32,
}

macro_rules! setters {
    ($($field:ident),*) => {$(
        #[doc = concat!("Sets `", stringify!($field), "`.")]
        #[must_use]
        pub const fn $field(mut self, v: u32) -> Self {
            self.$field = v;
            self
        }
    )*};
}

impl Command {
    /// A command with `opcode` for namespace `nsid`, every other dword 0.
    pub const fn new(opcode: u8, nsid: u32) -> Self {
        Self {
            opcode,
            nsid,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
            timeout_ms: 0,
        }
    }

    setters!(cdw10, cdw11, cdw12, cdw13, cdw14, cdw15, timeout_ms);

    /// Whether the kernel treats this command as host to controller (opcode bit 0).
    pub const fn is_write(&self) -> bool {
        self.opcode & 1 == 1
    }
}

/// What a passthrough ioctl returned.
#[derive(Debug)]
#[non_exhaustive]
pub struct Reply {
    /// The ioctl's return value as the kernel gave it (`0` success, `> 0` the NVMe
    /// status field, `< 0` an errno), for logs.
    pub ret: i32,
    /// `ret` decoded ([`status::decode_return`](crate::status::decode_return)).
    pub completion: Completion,
}
