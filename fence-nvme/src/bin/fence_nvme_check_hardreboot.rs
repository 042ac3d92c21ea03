//! `fence_nvme_check_hardreboot`: `fence_nvme_check` that, when this node's key is gone
//! from a device (exit 2), reboots the host at once: `reboot(2)` with `RB_AUTOBOOT`,
//! which the kernel performs without syncing file systems (only the `reboot` command
//! and the watchdog daemon's shutdown sync first); if that is refused, sysrq `b`
//! ("reboot immediately, without syncing or unmounting"). See [`fence_nvme::watchdog`].
//!
//! A separate binary, not a name `fence_nvme_check` looks at: watchdog runs
//! `/etc/watchdog.d` entries by their link name, which need not be the target's.

use std::io;

use fence_nvme::watchdog::{self, Variant};
use nix::sys::reboot::{RebootMode, reboot};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = watchdog::run(
        Variant::HardReboot,
        &args,
        &fence_nvme::real_devices(),
        &mut hard_reboot,
    );
    for l in &out.stderr {
        eprintln!("{l}");
    }
    std::process::exit(out.code);
}

/// Reboots now, unsynced; returns only when neither way worked. (In a PID namespace
/// other than the host's, `reboot(2)` ends that namespace's init instead: the
/// "node" a container or a test namespace stands for.)
fn hard_reboot() -> io::Error {
    let first = match reboot(RebootMode::RB_AUTOBOOT) {
        Ok(never) => match never {},
        Err(e) => io::Error::from(e),
    };
    match std::fs::write("/proc/sysrq-trigger", b"b") {
        // The write returns only if the kernel did not reboot (sysrq compiled out).
        Ok(()) => io::Error::other(format!(
            "reboot(2) RB_AUTOBOOT: {first}; sysrq b was written but the host is still up"
        )),
        Err(e) => io::Error::other(format!(
            "reboot(2) RB_AUTOBOOT: {first}; /proc/sysrq-trigger: {e}"
        )),
    }
}
