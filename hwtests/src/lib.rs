//! Helpers shared by the hardware tests in `tests/`.
//!
//! The tests need one reservation-capable NVMe namespace reachable through two or more
//! controllers with distinct host identifiers, each as its own block device:
//! `HWTEST_NVME_HOSTS=/dev/nvme0n1,/dev/nvme1n1,/dev/nvme2n1` (hosts A, B, C in that
//! order). `HWTEST_NVME_NORESV` optionally names a namespace without reservation
//! support. The guest harness (`hwtests/guest/run`) provides both; see the README for
//! real hardware.
//!
//! Every test is `#[ignore]`d by default and run with `--include-ignored
//! --test-threads=1`: they share the namespace's reservation state, and each starts
//! from [`setup`], which removes every registration.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod sys;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nvme_resv::{
    Access, HostId, Key, Namespace, Register, ReservationStatus, ReservationType, Reservations,
    model,
};

/// The variable naming the hosts' block devices, in host order A, B, C, ...
pub const HOSTS_VAR: &str = "HWTEST_NVME_HOSTS";
/// The variable naming a namespace without reservation support.
pub const NORESV_VAR: &str = "HWTEST_NVME_NORESV";
/// Byte offset the access probes read and write (block 256 of 4 KiB; no test data
/// lives there).
pub const PROBE_OFFSET: u64 = 1 << 20;
/// Size of one probe I/O: a multiple of every logical block size in use (512, 4096).
pub const PROBE_LEN: usize = 4096;

/// One host's view of the shared namespace.
#[derive(Debug)]
pub struct Host {
    /// "A", "B", "C", ... in the order of `HWTEST_NVME_HOSTS`.
    pub name: String,
    /// The namespace block device through this host's controller.
    pub path: PathBuf,
    /// The namespace opened through `nvme-resv`.
    pub ns: Namespace,
    /// This host's identifier as the device reports it (learned in [`setup`]).
    pub hostid: HostId,
}

impl Host {
    /// The reservation key this host registers in the tests: distinct per host and
    /// easy to spot in a report (`0xa0..0a` for A, `0xb0..0b` for B, ...).
    pub fn key(&self) -> Key {
        host_key(self.index())
    }

    /// A second key for replace tests.
    pub fn other_key(&self) -> Key {
        Key(host_key(self.index()).0 ^ 0x00ff_0000_0000_0000)
    }

    fn index(&self) -> usize {
        usize::from(self.name.as_bytes()[0] - b'A')
    }

    /// Reads or writes [`PROBE_LEN`] bytes at [`PROBE_OFFSET`] with O_DIRECT.
    pub fn probe(&self, access: Access) -> Outcome {
        probe(&self.path, access)
    }
}

fn host_key(index: usize) -> Key {
    let nibble = 0xa + index as u64;
    Key((nibble << 60) | nibble)
}

/// The result of an access probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The I/O completed.
    Allowed,
    /// The I/O failed with EBADE: the device reported a reservation conflict.
    Denied,
}

impl Outcome {
    /// `Allowed` when `ok`.
    pub fn from_allowed(ok: bool) -> Self {
        if ok { Self::Allowed } else { Self::Denied }
    }
}

/// Opens `path` for O_DIRECT reads and writes.
pub fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// A [`PROBE_LEN`]-byte window of a heap buffer aligned to 4096 (O_DIRECT needs the
/// memory aligned to the logical block size).
struct Aligned {
    buf: Vec<u8>,
    start: usize,
}

impl Aligned {
    fn new(fill: u8) -> Self {
        let buf = vec![fill; PROBE_LEN + 4096];
        let start = buf.as_ptr().align_offset(4096);
        Self { buf, start }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + PROBE_LEN]
    }
}

/// Reads or writes one aligned block at [`PROBE_OFFSET`] of `path` with O_DIRECT and
/// classifies the result: EBADE (the block layer's translation of an NVMe reservation
/// conflict) is `Denied`; any other error fails the test.
pub fn probe(path: &Path, access: Access) -> Outcome {
    let file = open_direct(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut buf = Aligned::new(0x5a);
    let res = match access {
        Access::Read => file.read_at(buf.get(), PROBE_OFFSET),
        Access::Write => file.write_at(buf.get(), PROBE_OFFSET),
    };
    match res {
        Ok(n) if n == PROBE_LEN => Outcome::Allowed,
        Ok(n) => panic!("{access:?} on {}: short transfer {n}", path.display()),
        Err(e) if e.raw_os_error() == Some(libc::EBADE) => Outcome::Denied,
        Err(e) => panic!("{access:?} on {}: unexpected error {e}", path.display()),
    }
}

fn device_paths() -> Vec<PathBuf> {
    let Ok(list) = std::env::var(HOSTS_VAR) else {
        panic!(
            "{HOSTS_VAR} is not set: these tests need a reservation-capable NVMe namespace \
             reachable as two or more block devices with distinct host IDs, e.g. \
             {HOSTS_VAR}=/dev/nvme0n1,/dev/nvme1n1,/dev/nvme2n1 (run hwtests/guest/run to get \
             one in a qemu guest)"
        )
    };
    let paths: Vec<PathBuf> = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect();
    assert!(
        paths.len() >= 2,
        "{HOSTS_VAR}={list}: need at least two hosts (block devices of the same namespace)"
    );
    assert!(
        paths.len() <= 8,
        "{HOSTS_VAR}: at most 8 hosts are supported"
    );
    paths
}

/// Opens every host of `HWTEST_NVME_HOSTS`, removes every registration on the
/// namespace (from each host: unregister with IEKEY), learns each host's identifier by
/// registering and reporting, and leaves the namespace with no registrant and no
/// reservation. Panics with the reason when the environment does not name devices.
pub fn setup() -> Vec<Host> {
    let paths = device_paths();
    let mut hosts = Vec::new();
    for (i, path) in paths.into_iter().enumerate() {
        let ns = Namespace::open(&path)
            .unwrap_or_else(|e| panic!("nvme-resv cannot open {}: {e}", path.display()));
        hosts.push(Host {
            name: char::from(b'A' + i as u8).to_string(),
            path,
            ns,
            hostid: HostId::default(),
        });
    }
    clear_all(&hosts);
    // Learn host IDs from the device itself (works for fabrics and for PCIe
    // controllers whose Host Identifier was set with Set Features).
    for h in &hosts {
        h.ns.register(&Register::register(h.key()))
            .unwrap_or_else(|e| panic!("host {} register: {e}", h.name));
    }
    let status = report(&hosts[0]);
    for h in &mut hosts {
        let reg = status
            .registrants
            .iter()
            .find(|r| r.rkey == h.key())
            .unwrap_or_else(|| panic!("host {}'s key missing from {status:?}", h.name));
        h.hostid = reg.hostid;
    }
    let distinct: std::collections::BTreeSet<_> = hosts.iter().map(|h| h.hostid).collect();
    assert_eq!(
        distinct.len(),
        hosts.len(),
        "the hosts do not have distinct host IDs: {status:?}"
    );
    clear_all(&hosts);
    hosts
}

/// Removes every registration (and so the reservation): each host unregisters with
/// IEKEY, which the device accepts whatever key the host registered. A host that is not
/// registered gets a reservation conflict, which is expected here.
pub fn clear_all(hosts: &[Host]) {
    for h in hosts {
        match h
            .ns
            .register(&Register::unregister(Key(0)).with_iekey(true))
        {
            Ok(()) => {}
            Err(e) if e.is_reservation_conflict() => {}
            Err(e) => panic!("host {}: unregister with IEKEY: {e}", h.name),
        }
    }
    let status = report(&hosts[0]);
    assert!(
        status.registrants.is_empty() && status.rtype == ReservationType::NONE,
        "reservation state not cleared: {status:?}"
    );
}

/// The extended report through `h`, panicking on error.
pub fn report(h: &Host) -> ReservationStatus {
    h.ns.report()
        .unwrap_or_else(|e| panic!("host {} report: {e}", h.name))
}

/// Keys in a report, in report order.
pub fn keys(status: &ReservationStatus) -> Vec<Key> {
    status.registrants.iter().map(|r| r.rkey).collect()
}

/// A report reduced to what two implementations must agree on: registrants by host ID
/// with their key and whether they hold the reservation, and the reservation type.
/// (Controller IDs, PTPL state and the absolute generation may legitimately differ.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Reservation type held (NONE if none).
    pub rtype: ReservationType,
    /// host ID -> (key, holds the reservation).
    pub registrants: BTreeMap<HostId, (Key, bool)>,
}

impl Shape {
    /// Reduces `status`.
    pub fn of(status: &ReservationStatus) -> Self {
        Self {
            rtype: status.rtype,
            registrants: status
                .registrants
                .iter()
                .map(|r| (r.hostid, (r.rkey, r.rcsts & 1 == 1)))
                .collect(),
        }
    }
}

/// The in-memory model with one model host per real host, same host IDs.
#[derive(Debug)]
pub struct Twin {
    /// The model namespace.
    pub ns: model::Namespace,
    /// Model hosts in the real hosts' order.
    pub hosts: Vec<model::Host>,
}

impl Twin {
    /// A fresh model (no registrants) mirroring `hosts`.
    pub fn new(hosts: &[Host]) -> Self {
        let ns = model::Namespace::new();
        let hosts = hosts.iter().map(|h| ns.host(h.hostid)).collect();
        Self { ns, hosts }
    }
}

/// The command that runs nvme-cli (`HWTEST_NVME_CLI`, default `nvme` on PATH).
pub fn nvme_cli() -> Command {
    Command::new(std::env::var("HWTEST_NVME_CLI").unwrap_or_else(|_| "nvme".into()))
}

/// The command that runs the `nvme-resv` CLI (`HWTEST_NVME_RESV_BIN`, default
/// `nvme-resv` on PATH).
pub fn nvme_resv_cli() -> Command {
    Command::new(std::env::var("HWTEST_NVME_RESV_BIN").unwrap_or_else(|_| "nvme-resv".into()))
}

/// Runs `cmd`, requires exit status 0 and returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): stdout {} stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Runs `cmd`, requires exit status 0 and parses stdout as JSON.
pub fn run_json(cmd: &mut Command) -> serde_json::Value {
    let text = run_ok(cmd);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{cmd:?}: not JSON ({e}): {text}"))
}

/// The path of a namespace without reservation support, if the environment names one.
pub fn noresv_path() -> Option<PathBuf> {
    std::env::var_os(NORESV_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_keys_are_distinct_and_nonzero() {
        let keys: std::collections::BTreeSet<_> = (0..8).map(host_key).collect();
        assert_eq!(keys.len(), 8);
        assert!(!keys.contains(&Key(0)));
        assert_eq!(host_key(0), Key(0xa000_0000_0000_000a));
    }

    #[test]
    fn aligned_window_is_aligned() {
        let mut a = Aligned::new(1);
        let w = a.get();
        assert_eq!(w.len(), PROBE_LEN);
        assert_eq!(w.as_ptr() as usize % 4096, 0);
        assert!(w.iter().all(|&b| b == 1));
    }
}
