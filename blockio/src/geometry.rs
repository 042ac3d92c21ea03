//! What the writer learns about a device or file when opening it: the direct-I/O
//! alignment of offsets, lengths and buffers, and the size.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::error::{Error, Result};
use crate::sys::{self, DioAlign};

/// Geometry learned when opening.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    /// Required alignment of offsets and lengths.
    pub offset_align: usize,
    /// Required alignment of buffer addresses.
    pub mem_align: usize,
    /// Size in bytes of the device, or of the file at open.
    pub size: u64,
    pub block_device: bool,
    /// A regular file on tmpfs: its direct writes are memory copies (done by io_uring
    /// in a worker thread), so the CPU, not a device, is the limit.
    pub tmpfs: bool,
}

/// Maps the failure of `call` on `path` while learning about it.
pub(crate) fn probe_err(call: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Probe { call, path, source }
}

/// Learns the direct-I/O alignment and the size of the opened `file`.
/// Whether a regular file is on tmpfs; only tunes the ring, so a failure is "no".
fn on_tmpfs(file: &File, path: &Path) -> bool {
    sys::on_tmpfs(file.as_fd()).unwrap_or_else(|e| {
        tracing::debug!(path = %path.display(), error = %e, "fstatfs failed; assuming no tmpfs");
        false
    })
}

pub(crate) fn learn_geometry(file: &File, path: &Path) -> Result<Geometry> {
    let meta = file.metadata().map_err(probe_err("fstat", path))?;
    let ft = meta.file_type();
    let dio = sys::statx_dio_align(file.as_fd()).map_err(probe_err("statx", path))?;
    if ft.is_block_device() {
        let lbs =
            sys::logical_block_size(file.as_fd()).map_err(probe_err("BLKSSZGET", path))? as usize;
        let size = sys::block_device_size(file.as_fd()).map_err(probe_err("BLKGETSIZE64", path))?;
        if let Ok(pbs) = sys::physical_block_size(file.as_fd()) {
            tracing::debug!(path = %path.display(), logical = lbs, physical = pbs, "block device sector sizes");
        }
        let (mem, off) = match dio {
            DioAlign::Align { mem, offset } => (mem as usize, (offset as usize).max(lbs)),
            _ => (lbs, lbs),
        };
        if !off.is_power_of_two() || !mem.is_power_of_two() {
            return Err(Error::UnknownAlignment {
                path: path.to_path_buf(),
            });
        }
        Ok(Geometry {
            offset_align: off,
            mem_align: mem,
            size,
            block_device: true,
            tmpfs: false,
        })
    } else if ft.is_file() {
        match dio {
            DioAlign::Align { mem, offset }
                if (mem as usize).is_power_of_two() && (offset as usize).is_power_of_two() =>
            {
                Ok(Geometry {
                    offset_align: offset as usize,
                    mem_align: mem as usize,
                    size: meta.len(),
                    block_device: false,
                    tmpfs: on_tmpfs(file, path),
                })
            }
            DioAlign::Unsupported => Err(Error::DirectIoUnsupported {
                path: path.to_path_buf(),
            }),
            // The open with O_DIRECT succeeded but the file system does not report its
            // alignment (tmpfs, or a kernel before 6.1). Direct I/O alignment never
            // exceeds the file system block size, so that is a safe, stricter rule.
            DioAlign::Unknown if meta.blksize().is_power_of_two() && meta.blksize() >= 512 => {
                let bs = meta.blksize() as usize;
                tracing::debug!(path = %path.display(), block_size = bs, "no STATX_DIOALIGN; aligning to the file system block size");
                Ok(Geometry {
                    offset_align: bs,
                    mem_align: bs,
                    size: meta.len(),
                    block_device: false,
                    tmpfs: on_tmpfs(file, path),
                })
            }
            _ => Err(Error::UnknownAlignment {
                path: path.to_path_buf(),
            }),
        }
    } else {
        Err(Error::NotBlockOrFile {
            path: path.to_path_buf(),
        })
    }
}
