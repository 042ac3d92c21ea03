//! Linux NVMe passthrough ABI (`include/uapi/linux/nvme_ioctl.h`): the command layout,
//! the ioctl numbers, and the crate's only unsafe code.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::passthru::{Command, Data, Queue, Reply};
use crate::status::{Completion, decode_return};

/// `struct nvme_passthru_cmd` (also `struct nvme_admin_cmd`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NvmePassthruCmd {
    pub opcode: u8,
    pub flags: u8,
    pub rsvd1: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    pub metadata: u64,
    pub addr: u64,
    pub metadata_len: u32,
    pub data_len: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
    pub timeout_ms: u32,
    pub result: u32,
}

const _: () = assert!(size_of::<NvmePassthruCmd>() == 72);
const _: () = assert!(std::mem::offset_of!(NvmePassthruCmd, addr) == 24);
const _: () = assert!(std::mem::offset_of!(NvmePassthruCmd, cdw10) == 40);
const _: () = assert!(std::mem::offset_of!(NvmePassthruCmd, result) == 68);

// asm-generic/ioctl.h encoding: nr 7:0, type 15:8, size 29:16, dir 31:30.
const IOC_NONE: u32 = 0;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
/// Width of the size field: `_IOC_SIZEBITS`.
const IOC_SIZEBITS: u32 = 14;

/// `_IOC(dir, type, nr, size)`. A size that does not fit the 14-bit field is a
/// compile-time error (the ioctl numbers are consts), as the kernel's
/// `_IOC_TYPECHECK` makes it; masking it would silently name another ioctl.
const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    assert!(
        size < 1 << IOC_SIZEBITS,
        "ioctl argument too large for _IOC"
    );
    (dir << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

const fn io(ty: u8, nr: u8) -> u32 {
    ioc(IOC_NONE, ty, nr, 0)
}

const fn iowr<T>(ty: u8, nr: u8) -> u32 {
    ioc(IOC_READ | IOC_WRITE, ty, nr, size_of::<T>())
}

/// `_IO('N', 0x40)`: returns the namespace ID of the fd's namespace.
pub(crate) const NVME_IOCTL_ID: u32 = io(b'N', 0x40);
/// `_IOWR('N', 0x41, struct nvme_admin_cmd)`.
pub(crate) const NVME_IOCTL_ADMIN_CMD: u32 = iowr::<NvmePassthruCmd>(b'N', 0x41);
/// `_IOWR('N', 0x43, struct nvme_passthru_cmd)`.
pub(crate) const NVME_IOCTL_IO_CMD: u32 = iowr::<NvmePassthruCmd>(b'N', 0x43);

/// Issues the raw passthrough ioctl `req` with `cmd`; returns the ioctl's return value
/// (negative: see errno).
///
/// # Safety
/// `cmd.addr` / `cmd.data_len` must describe memory valid for the whole call: readable
/// for a host-to-controller command, writable for a controller-to-host one (the kernel
/// writes up to `data_len` bytes there); likewise `metadata` / `metadata_len`. `req`
/// must be one of the passthrough requests taking a `NvmePassthruCmd`.
pub(crate) unsafe fn passthru_raw(fd: BorrowedFd<'_>, req: u32, cmd: &mut NvmePassthruCmd) -> i32 {
    // SAFETY: `cmd` is a valid, exclusively borrowed `nvme_passthru_cmd` for the
    // kernel to read and update; the caller guarantees the buffers it points to.
    unsafe { libc::ioctl(fd.as_raw_fd(), req as libc::Ioctl, std::ptr::from_mut(cmd)) }
}

/// Submits `cmd` with `data` on `queue` and decodes the completion. Safe: the buffer
/// is borrowed for the whole call and its pointer and length come from the slice; a
/// shared (`ToDevice`) buffer is only passed with an opcode the kernel reads from
/// (checked here, whatever the caller checked).
pub(crate) fn submit(fd: BorrowedFd<'_>, queue: Queue, cmd: &Command, data: Data<'_>) -> Reply {
    let (addr, len) = match data {
        Data::None => (0u64, 0usize),
        // The kernel maps the buffer for reading only when opcode bit 0 is set
        // (`nvme_is_write`); otherwise it would write into a shared borrow.
        Data::ToDevice(b) if cmd.is_write() => (b.as_ptr() as u64, b.len()),
        Data::ToDevice(_) => return einval(),
        Data::FromDevice(b) => (b.as_mut_ptr() as u64, b.len()),
    };
    let Ok(data_len) = u32::try_from(len) else {
        return einval();
    };
    let mut raw = NvmePassthruCmd {
        opcode: cmd.opcode,
        nsid: cmd.nsid,
        addr,
        data_len,
        cdw10: cmd.cdw10,
        cdw11: cmd.cdw11,
        cdw12: cmd.cdw12,
        cdw13: cmd.cdw13,
        cdw14: cmd.cdw14,
        cdw15: cmd.cdw15,
        timeout_ms: cmd.timeout_ms,
        ..NvmePassthruCmd::default()
    };
    let req = match queue {
        Queue::Admin => NVME_IOCTL_ADMIN_CMD,
        Queue::Io => NVME_IOCTL_IO_CMD,
    };
    // SAFETY: `addr`/`data_len` come from a slice borrowed (mutably for FromDevice,
    // and shared only for an opcode the kernel reads from) until this function
    // returns, so the memory is valid for the kernel's access in the direction the
    // opcode implies; no metadata buffer is passed.
    let ret = unsafe { passthru_raw(fd, req, &mut raw) };
    let completion = decode_return(ret, raw.result, io::Error::last_os_error);
    Reply { ret, completion }
}

fn einval() -> Reply {
    Reply {
        ret: -libc::EINVAL,
        completion: Completion::Os(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// `NVME_IOCTL_ID`: the namespace ID of the namespace `fd` refers to.
pub(crate) fn namespace_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: NVME_IOCTL_ID takes no argument and touches no user memory.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), NVME_IOCTL_ID as libc::Ioctl) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of the uapi header's macros on x86_64 / aarch64 (asm-generic encoding).
    #[test]
    fn ioctl_numbers_are_pinned() {
        assert_eq!(NVME_IOCTL_ID, 0x4e40);
        assert_eq!(NVME_IOCTL_ADMIN_CMD, 0xc048_4e41);
        assert_eq!(NVME_IOCTL_IO_CMD, 0xc048_4e43);
    }

    /// The one `_IOC` of this crate against hand-computed encodings, including the
    /// largest size the field holds (a larger one does not compile).
    #[test]
    fn ioc_encodes_each_field() {
        assert_eq!(ioc(IOC_NONE, 0x12, 104, 0), 0x1268); // BLKSSZGET
        assert_eq!(ioc(IOC_READ, b'N', 1, 8), 0x8008_4e01);
        assert_eq!(ioc(IOC_WRITE, 0, 0, (1 << IOC_SIZEBITS) - 1), 0x7fff_0000);
        assert_eq!(iowr::<u64>(b'N', 0xff), 0xc008_4eff);
    }

    #[test]
    fn nvme_ioctl_id_on_a_regular_file_is_enotty() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        use std::os::fd::AsFd;
        let e = namespace_id(f.as_fd()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTTY));
    }

    #[test]
    fn passthrough_on_a_non_nvme_fd_is_an_os_error_not_success() {
        use std::os::fd::AsFd;
        let f = std::fs::File::open("/dev/null").unwrap();
        let mut buf = [0u8; 64];
        let c = submit(
            f.as_fd(),
            Queue::Io,
            &Command::new(0x0e, 1).cdw10(15).cdw11(1),
            Data::FromDevice(&mut buf),
        );
        assert!(c.ret < 0);
        match c.completion {
            Completion::Os(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOTTY)),
            other => panic!("{other:?}"),
        }
    }
}
