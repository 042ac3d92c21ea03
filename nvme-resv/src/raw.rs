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

pub use crate::passthru::{Command, Data, Queue, Reply};
use crate::status::Completion;
use crate::sys;

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
