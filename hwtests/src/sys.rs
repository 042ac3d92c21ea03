//! The one raw ioctl the hardware tests issue themselves: an NVMe Write through
//! `NVME_IOCTL_IO_CMD`, to observe how the kernel returns a reservation conflict on the
//! passthrough path (a positive NVMe status, not an errno). Everything else goes through
//! `nvme-resv` and `blockio`. All of this crate's unsafe code lives here.
#![allow(unsafe_code)]

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use nvme_resv::status::{Completion, decode_return};

/// `struct nvme_passthru_cmd` from `<linux/nvme_ioctl.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct NvmePassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}
const _: () = assert!(size_of::<NvmePassthruCmd>() == 72);

/// `_IOWR(type, nr, size)` of `<asm-generic/ioctl.h>`.
const fn iowr(ty: u8, nr: u8, size: usize) -> u32 {
    const READ_WRITE: u32 = 3;
    (READ_WRITE << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// `NVME_IOCTL_IO_CMD = _IOWR('N', 0x43, struct nvme_passthru_cmd)`.
const NVME_IOCTL_IO_CMD: u32 = iowr(b'N', 0x43, size_of::<NvmePassthruCmd>());

/// NVM Command Set opcode of Write.
const NVME_CMD_WRITE: u8 = 0x01;

/// Issues one NVMe Write of `data` at `slba` on namespace `nsid` through the passthrough
/// ioctl. Returns the raw ioctl return value (`0` success, `> 0` an NVMe status with
/// DNR and More, `< 0` never: that is the `Err`) decoded by
/// `nvme_resv::status::decode_return`, and the raw value itself for the log.
///
/// `data.len()` must be exactly one logical block.
pub fn passthru_write_one_block(
    fd: BorrowedFd<'_>,
    nsid: u32,
    slba: u64,
    data: &[u8],
) -> io::Result<(i32, Completion)> {
    let data_len = u32::try_from(data.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "block too large"))?;
    let mut cmd = NvmePassthruCmd {
        opcode: NVME_CMD_WRITE,
        nsid,
        addr: data.as_ptr() as u64,
        data_len,
        cdw10: slba as u32,
        cdw11: (slba >> 32) as u32,
        cdw12: 0, // NLB is zero-based: one block
        ..Default::default()
    };
    // SAFETY: `cmd` is a correctly laid out `nvme_passthru_cmd` (size asserted above)
    // that lives across the call; its `addr`/`data_len` describe `data`, which is
    // borrowed for the whole call and only read by the kernel (a Write transfers host
    // to device); `fd` is a valid open descriptor for the duration of the borrow.
    let ret = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            NVME_IOCTL_IO_CMD as _,
            &mut cmd as *mut NvmePassthruCmd,
        )
    };
    match decode_return(ret, cmd.result, io::Error::last_os_error) {
        Completion::Os(e) => Err(e),
        c => Ok((ret, c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_number_matches_linux_header() {
        // Value of NVME_IOCTL_IO_CMD on x86_64 as printed by a C program including
        // <linux/nvme_ioctl.h>.
        assert_eq!(NVME_IOCTL_IO_CMD, 0xc048_4e43);
    }
}
