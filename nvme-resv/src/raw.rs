//! Raw passthrough: any NVMe admin or I/O command on a namespace's block device,
//! through a safe function.
//!
//! For what the typed API ([`Namespace`](crate::Namespace)) does not cover: a test that
//! writes one block through the passthrough path to see the controller's status, a
//! benchmark's floor of bare ioctls. The command layout and the ioctl numbers stay in
//! this crate (its only `unsafe` code); callers build a [`Command`], lend a buffer as
//! [`Data`] and get the decoded [`Completion`] back.
//!
//! ```no_run
//! use std::os::fd::AsFd;
//! use nvme_resv::raw::{self, Command, Data, Queue};
//! use nvme_resv::status::Completion;
//!
//! # fn main() -> std::io::Result<()> {
//! let dev = std::fs::File::open("/dev/nvme0n1")?;
//! let nsid = raw::namespace_id(dev.as_fd())?;
//! // Reservation Report (opcode 0Eh), extended data structure, into 4 KiB.
//! let mut buf = vec![0u8; 4096];
//! let cmd = Command::new(0x0e, nsid).cdw10(4096 / 4 - 1).cdw11(1);
//! let reply = raw::submit(dev.as_fd(), Queue::Io, &cmd, Data::FromDevice(&mut buf));
//! match reply.completion {
//!     Completion::Success { .. } => println!("generation {}", u32::from_le_bytes(buf[..4].try_into().unwrap())),
//!     Completion::Status(s) => println!("device refused: {s}"),
//!     Completion::Os(e) => return Err(e),
//!     other => println!("{other:?}"), // `Completion` is non-exhaustive
//! }
//! # Ok(())
//! # }
//! ```

use std::io;
use std::os::fd::BorrowedFd;

use crate::status::Completion;
use crate::sys;

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
/// controller). [`submit`] refuses [`Data::ToDevice`] for an opcode the kernel would
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

/// Submits `cmd` with `data` on `queue` of the namespace `fd` refers to, and decodes
/// the completion. A reservation conflict arrives as
/// [`Completion::Status`], never as an errno.
///
/// [`Data::ToDevice`] with an opcode whose bit 0 is clear is refused with
/// `Completion::Os` of kind `InvalidInput` (the kernel would write into a shared
/// buffer); so is a buffer of 4 GiB or more.
pub fn submit(fd: BorrowedFd<'_>, queue: Queue, cmd: &Command, data: Data<'_>) -> Reply {
    if matches!(data, Data::ToDevice(_)) && !cmd.is_write() {
        return refused(format!(
            "opcode {:#04x} transfers controller to host (bit 0 clear): pass Data::FromDevice",
            cmd.opcode
        ));
    }
    if u32::try_from(data.len()).is_err() {
        return refused(format!(
            "a {}-byte buffer does not fit the command's 32-bit data length",
            data.len()
        ));
    }
    sys::submit(fd, queue, cmd, data)
}

fn refused(why: String) -> Reply {
    Reply {
        ret: -libc::EINVAL,
        completion: Completion::Os(io::Error::new(io::ErrorKind::InvalidInput, why)),
    }
}

/// `NVME_IOCTL_ID`: the namespace ID of the namespace `fd` refers to (ENOTTY when it
/// is not an NVMe namespace).
pub fn namespace_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    sys::namespace_id(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn command_builder_sets_each_dword() {
        let c = Command::new(0x11, 7)
            .cdw10(10)
            .cdw11(11)
            .cdw12(12)
            .cdw13(13)
            .cdw14(14)
            .cdw15(15)
            .timeout_ms(99);
        assert_eq!(
            (
                c.opcode, c.nsid, c.cdw10, c.cdw11, c.cdw12, c.cdw13, c.cdw14, c.cdw15
            ),
            (0x11, 7, 10, 11, 12, 13, 14, 15)
        );
        assert_eq!(c.timeout_ms, 99);
        assert!(c.is_write() && !Command::new(0x0e, 1).is_write());
    }

    #[test]
    fn shared_buffer_for_a_read_opcode_is_refused_before_the_ioctl() {
        // /dev/null would answer ENOTTY; InvalidInput shows the ioctl was not issued.
        let f = std::fs::File::open("/dev/null").unwrap();
        let buf = [0u8; 64];
        let r = submit(
            f.as_fd(),
            Queue::Io,
            &Command::new(0x0e, 1),
            Data::ToDevice(&buf),
        );
        match r.completion {
            Completion::Os(e) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
                assert!(e.to_string().contains("Data::FromDevice"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.ret, -libc::EINVAL);
    }

    #[test]
    fn write_opcode_with_shared_buffer_reaches_the_kernel() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let buf = [0u8; 16];
        let r = submit(
            f.as_fd(),
            Queue::Io,
            &Command::new(0x11, 1),
            Data::ToDevice(&buf),
        );
        assert!(r.ret < 0);
        match r.completion {
            Completion::Os(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOTTY)),
            other => panic!("{other:?}"),
        }
    }
}
