//! The one raw command the hardware tests issue themselves: an NVMe Write through the
//! passthrough ioctl, to observe how the kernel returns a reservation conflict on the
//! passthrough path (a positive NVMe status, not an errno). Built on
//! [`nvme_resv::raw`], which owns the command layout and the ioctl numbers; everything
//! else goes through `nvme-resv`'s typed API and `blockio`.

use std::io;
use std::os::fd::BorrowedFd;

use nvme_resv::raw::{self, Command, Data, Queue};
use nvme_resv::status::Completion;

/// NVM Command Set opcode of Write.
const NVME_CMD_WRITE: u8 = 0x01;

/// Issues one NVMe Write of `data` at `slba` on namespace `nsid` through the passthrough
/// ioctl. Returns the raw ioctl return value (`0` success, `> 0` an NVMe status with
/// DNR and More, `< 0` never: that is the `Err`) and its decoding by
/// `nvme_resv::status::decode_return`.
///
/// `data.len()` must be exactly one logical block.
pub fn passthru_write_one_block(
    fd: BorrowedFd<'_>,
    nsid: u32,
    slba: u64,
    data: &[u8],
) -> io::Result<(i32, Completion)> {
    // NLB (CDW12) is zero-based: 0 is one block.
    let cmd = Command::new(NVME_CMD_WRITE, nsid)
        .cdw10(slba as u32)
        .cdw11((slba >> 32) as u32)
        .cdw12(0);
    let reply = raw::submit(fd, Queue::Io, &cmd, Data::ToDevice(data));
    match reply.completion {
        Completion::Os(e) => Err(e),
        c => Ok((reply.ret, c)),
    }
}
