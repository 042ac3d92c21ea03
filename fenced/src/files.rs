//! Small helpers about files, shared by the library and the binary.

use std::os::unix::fs::FileTypeExt;

/// What a path that is not a regular file is, for an error line.
pub fn file_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_file() {
        "regular file"
    } else {
        "special file"
    }
}
