//! `fence_nvme_check`: the watchdog companion (see [`fence_nvme::watchdog`]). Run by
//! the `watchdog` daemon from `/etc/watchdog.d`: exits 2 when this node's key, as
//! `fence_nvme -o on` recorded it, is gone from any device (the node was fenced, so the
//! daemon reboots it), 1 when a device cannot be read, 0 otherwise.

use fence_nvme::watchdog::{self, Variant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = watchdog::run(
        Variant::Check,
        &args,
        &fence_nvme::real_devices(),
        &mut || unreachable_reboot(),
    );
    for l in &out.stderr {
        eprintln!("{l}");
    }
    std::process::exit(out.code);
}

/// The plain check never reboots: [`watchdog::run`] calls this only for
/// [`Variant::HardReboot`].
fn unreachable_reboot() -> std::io::Error {
    std::io::Error::other("fence_nvme_check does not reboot (fence_nvme_check_hardreboot does)")
}
