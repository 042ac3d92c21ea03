//! Helpers shared by the integration tests: temp files on a file system that supports
//! `O_DIRECT`, and loop devices (root only).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Directory for temp files: `BLOCKIO_TEST_DIR`, else `/var/tmp` (disk-backed; `/tmp`
/// may be a tmpfs without `O_DIRECT` on older kernels).
pub fn test_dir() -> tempfile::TempDir {
    let base = std::env::var_os("BLOCKIO_TEST_DIR").unwrap_or_else(|| "/var/tmp".into());
    tempfile::Builder::new()
        .prefix("blockio-test-")
        .tempdir_in(base)
        .expect("temp dir")
}

/// Creates a zero-filled file of `len` bytes.
pub fn zero_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(len))
        .expect("create file");
    path
}

/// A loop device attached to a backing file, detached on drop.
#[derive(Debug)]
pub struct LoopDev {
    pub path: PathBuf,
}

impl LoopDev {
    /// Attaches `backing` to a free loop device with `--direct-io=on`, or says why not.
    pub fn attach(backing: &Path) -> Result<LoopDev, String> {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(backing)
            .output()
            .map_err(|e| format!("cannot run losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(LoopDev { path })
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}
