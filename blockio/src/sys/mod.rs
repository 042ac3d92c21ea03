//! Every system-level detail of the crate, and all of its `unsafe` code: ioctl numbers,
//! `statx`, `pwritev2`, the aligned buffer allocation and the io_uring engine (whose
//! submissions hand buffer addresses to the kernel).
//!
//! The rest of the crate is `#![deny(unsafe_code)]` and reaches the kernel only through
//! the safe functions and types here. Nothing here decides what a result means or when
//! to try again (the writer's judge, `crate::fence`, does); what stays is what soundness
//! needs: the ring keeps every buffer alive and in bounds while the kernel may use it.

pub(crate) mod buf;
pub(crate) mod ring;

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};

// ---- ioctl numbers, computed the way <asm-generic/ioctl.h> does ----

const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = 8;
const IOC_SIZESHIFT: u32 = 16;
const IOC_DIRSHIFT: u32 = 30;
const IOC_NONE: u32 = 0;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)`.
const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    (dir << IOC_DIRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
        | (ty << IOC_TYPESHIFT)
        | (nr << IOC_NRSHIFT)
}

/// `_IO(0x12, 104)`: logical block size, an `int`.
pub(crate) const BLKSSZGET: u32 = ioc(IOC_NONE, 0x12, 104, 0);
/// `_IO(0x12, 123)`: physical block size, an `unsigned int`.
pub(crate) const BLKPBSZGET: u32 = ioc(IOC_NONE, 0x12, 123, 0);
/// `_IOR(0x12, 114, size_t)`: device size in bytes, a `u64`.
pub(crate) const BLKGETSIZE64: u32 = ioc(IOC_READ, 0x12, 114, size_of::<usize>());

/// Logical block size of a block device (`BLKSSZGET`).
pub(crate) fn logical_block_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one c_int through the pointer, which points to a live,
    // writable c_int for the duration of the call; `fd` is a valid open descriptor.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BLKSSZGET as _, &mut v as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Physical block size of a block device (`BLKPBSZGET`).
pub(crate) fn physical_block_size(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut v: libc::c_uint = 0;
    // SAFETY: BLKPBSZGET writes one c_uint through the pointer, which points to a live,
    // writable c_uint; `fd` is a valid open descriptor.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BLKPBSZGET as _, &mut v as *mut libc::c_uint) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Size in bytes of a block device (`BLKGETSIZE64`).
pub(crate) fn block_device_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live,
    // writable u64; `fd` is a valid open descriptor.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64 as _, &mut v as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Direct-I/O alignment reported by `statx(STATX_DIOALIGN)` (Linux 6.1 for regular
/// files, 6.11 for block devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DioAlign {
    /// The kernel does not report it for this file.
    Unknown,
    /// The file does not support direct I/O.
    Unsupported,
    /// Required alignments: of the buffer in memory, and of offsets and lengths.
    Align { mem: u32, offset: u32 },
}

pub(crate) fn statx_dio_align(fd: BorrowedFd<'_>) -> io::Result<DioAlign> {
    let mut st = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a valid NUL-terminated (empty) string; with AT_EMPTY_PATH the
    // call inspects `fd` itself; `st` points to writable memory of the size of `struct
    // statx`, which the kernel fills (and which is zero-initialised, so every field is
    // valid even if the kernel fills less).
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            st.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised above, and all-zero is a valid `statx` (plain integers).
    let st = unsafe { st.assume_init() };
    if st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Ok(DioAlign::Unknown);
    }
    if st.stx_dio_offset_align == 0 {
        return Ok(DioAlign::Unsupported);
    }
    Ok(DioAlign::Align {
        mem: st.stx_dio_mem_align,
        offset: st.stx_dio_offset_align,
    })
}

/// Whether the file lives on tmpfs (`fstatfs` reports `TMPFS_MAGIC`).
pub(crate) fn on_tmpfs(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut st = MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `st` points to writable memory of the size of `struct statfs`, which the
    // kernel fills; `fd` is a valid open descriptor.
    let r = unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised above, and all-zero is a valid `statfs` (plain integers).
    let st = unsafe { st.assume_init() };
    // The field's and the constant's integer types differ between targets.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64 == libc::TMPFS_MAGIC as i64)
}

/// `pwritev2(fd, [buf], offset, flags)`: one write with per-request flags (e.g.
/// `RWF_DSYNC`). Returns the number of bytes written.
pub(crate) fn pwrite2(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    offset: u64,
    flags: i32,
) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let off =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `iov` describes `buf`, which is borrowed (readable, live) for the whole
    // call; the kernel only reads from it for a write; one iovec is passed; `fd` is a
    // valid open descriptor.
    let r = unsafe { libc::pwritev2(fd.as_raw_fd(), &iov, 1, off, flags) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // r >= 0 and at most buf.len().
    Ok(r as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux_headers() {
        // Values from <linux/fs.h> on x86_64/aarch64 (64-bit size_t).
        assert_eq!(BLKSSZGET, 0x1268);
        assert_eq!(BLKPBSZGET, 0x127b);
        assert_eq!(BLKGETSIZE64, 0x8008_1272);
    }

    #[test]
    fn statx_reports_dio_alignment_for_a_regular_file() {
        let dir =
            tempfile::tempdir_in(std::env::var_os("BLOCKIO_TEST_DIR").unwrap_or("/var/tmp".into()))
                .expect("temp dir");
        let f = std::fs::File::create(dir.path().join("f")).expect("create");
        use std::os::fd::AsFd;
        match statx_dio_align(f.as_fd()).expect("statx") {
            DioAlign::Align { mem, offset } => {
                assert!(
                    mem.is_power_of_two() && offset.is_power_of_two(),
                    "{mem} {offset}"
                );
            }
            other => eprintln!("this file system reports {other:?}; nothing more to check"),
        }
    }

    #[test]
    fn tmpfs_is_recognised() {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir_in("/var/tmp").expect("temp dir");
        let f = std::fs::File::create(dir.path().join("f")).expect("create");
        assert!(
            !on_tmpfs(f.as_fd()).expect("fstatfs"),
            "/var/tmp is not tmpfs here"
        );
        match tempfile::tempfile_in("/dev/shm") {
            Ok(f) => assert!(on_tmpfs(f.as_fd()).expect("fstatfs"), "/dev/shm is tmpfs"),
            Err(e) => eprintln!("SKIPPED the tmpfs half: no /dev/shm ({e})"),
        }
    }
}
