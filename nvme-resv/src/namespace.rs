//! The real device: an NVMe namespace opened by path, driven through the Linux
//! passthrough ioctls.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::cmd::{self, opcode};
use crate::error::{Error, Operation, ReportError, Result};
use crate::identity::{ControllerIds, IdentifyError, NamespaceDescriptors, NamespaceIdentity};
use crate::raw::{Command, Data, Queue};
use crate::report::{self, EXTENDED_ENTRY_LEN, EXTENDED_HEADER_LEN};
use crate::status::{Completion, NvmeStatus};
use crate::sys;
use crate::{Acquire, Cptpl, Register, Release, ReservationStatus, ReservationType, Reservations};

/// Which Reservation Report data structure to request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReportFormat {
    /// Extended data structure (EDS=1): 128-bit host identifiers.
    #[default]
    Extended,
    /// Regular data structure (EDS=0): 64-bit host identifiers. Devices using 128-bit
    /// host identifiers (all NVMe over Fabrics targets) refuse it with Host
    /// Identifier Inconsistent Format.
    Regular,
}

/// What a namespace and its controller support, from Identify Controller (ONCS) and
/// Identify Namespace (RESCAP, FLBAS/LBAF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether reservations can be used: ONCS bit 5 set and at least one type in RESCAP.
    pub reservations: bool,
    /// Identify Controller ONCS bit 5 (Reservations).
    pub oncs_reservations: bool,
    /// Identify Namespace RESCAP (byte 31): bit 0 PTPL, bits 6:1 the six types, bit 7
    /// IEKEY behaviour of revision 1.3 and later.
    pub rescap: u8,
    /// RESCAP bit 7: IEKEY is honoured for Register as revision 1.3 defines it.
    pub iekey: bool,
    /// RESCAP bit 0: Persist Through Power Loss supported.
    pub ptpl: bool,
    /// Logical block size in bytes of the current LBA format (2^LBADS).
    pub lba_size: u32,
    /// Namespace size in logical blocks (NSZE).
    pub nsze: u64,
}

impl Capabilities {
    /// Builds capabilities from the raw Identify fields.
    pub fn from_identify(oncs: u16, rescap: u8, lbads: u8, nsze: u64) -> Self {
        let oncs_reservations = oncs & (1 << 5) != 0;
        Self {
            reservations: oncs_reservations && rescap & 0x7e != 0,
            oncs_reservations,
            rescap,
            iekey: rescap & 0x80 != 0,
            ptpl: rescap & 1 != 0,
            lba_size: 1u32.checked_shl(u32::from(lbads)).unwrap_or(0),
            nsze,
        }
    }

    /// Whether reservations of type `rtype` can be acquired.
    pub fn supports(&self, rtype: ReservationType) -> bool {
        self.oncs_reservations && rtype.rescap_bit().is_some_and(|b| self.rescap & b != 0)
    }

    /// The CPTPL to register with so that registrants and the reservation (and with
    /// them a fence) survive a power loss or target restart where the device can keep
    /// them: [`Cptpl::Persist`] when RESCAP reports Persist Through Power Loss, else
    /// [`Cptpl::NoChange`] (such a device has no persistence to turn on; one may refuse
    /// 11b as an invalid field, the Linux kernel target ignores it).
    pub fn register_cptpl(&self) -> Cptpl {
        if self.ptpl {
            Cptpl::Persist
        } else {
            Cptpl::NoChange
        }
    }

    /// The supported types, in encoding order.
    pub fn types(&self) -> Vec<ReservationType> {
        ReservationType::ALL
            .into_iter()
            .filter(|t| self.supports(*t))
            .collect()
    }
}

/// A reservation-capable NVMe namespace, opened through its block device
/// (`/dev/nvmeXnY`) or generic character device (`/dev/ngXnY`).
///
/// The device is opened read-write: the kernel only passes Reservation Register,
/// Acquire and Release (host-to-controller commands) through an fd opened for
/// writing, unless the caller has CAP_SYS_ADMIN.
#[derive(Debug)]
pub struct Namespace {
    file: File,
    path: PathBuf,
    nsid: u32,
}

/// Initial report buffer: the header and 63 extended entries.
const INITIAL_REPORT_LEN: usize = 4096;
/// Attempts at growing the report buffer when registrants keep being added between
/// reads.
const REPORT_ATTEMPTS: usize = 4;

fn is_permission(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

impl Namespace {
    /// Opens `path` and learns its namespace ID (`NVME_IOCTL_ID`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| {
                if is_permission(&source) {
                    Error::PermissionDenied {
                        path: path.clone(),
                        op: Operation::Open,
                        source,
                    }
                } else {
                    Error::Open {
                        path: path.clone(),
                        source,
                    }
                }
            })?;
        let nsid = match sys::namespace_id(file.as_fd()) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {
                return Err(Error::NotNvme { path });
            }
            Err(source) if is_permission(&source) => {
                return Err(Error::PermissionDenied {
                    path,
                    op: Operation::NamespaceId,
                    source,
                });
            }
            Err(source) => {
                return Err(Error::Ioctl {
                    op: Operation::NamespaceId,
                    nsid: 0,
                    source,
                });
            }
        };
        Ok(Self { file, path, nsid })
    }

    /// The namespace ID.
    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn submit(&self, op: Operation, queue: Queue, cmd: Command, data: Data<'_>) -> Result<u32> {
        match sys::submit(self.file.as_fd(), queue, &cmd, data).completion {
            Completion::Success { result } => Ok(result),
            Completion::Status(status) => Err(Error::Device {
                op,
                nsid: self.nsid,
                status,
            }),
            Completion::Os(source) if is_permission(&source) => Err(Error::PermissionDenied {
                path: self.path.clone(),
                op,
                source,
            }),
            Completion::Os(source) => Err(Error::Ioctl {
                op,
                nsid: self.nsid,
                source,
            }),
        }
    }

    fn identify(&self, op: Operation, cns: u8, nsid: u32) -> Result<Box<[u8; 4096]>> {
        let mut buf = Box::new([0u8; 4096]);
        self.submit(
            op,
            Queue::Admin,
            Command::new(opcode::ADMIN_IDENTIFY, nsid).cdw10(cmd::identify_cdw10(cns)),
            Data::FromDevice(&mut buf[..]),
        )?;
        Ok(buf)
    }

    /// Identify Controller and Identify Namespace, reduced to what reservations need.
    pub fn capabilities(&self) -> Result<Capabilities> {
        // Identify Controller (CNS 01h): ONCS is bytes 521:520.
        let ctrl = self.identify(Operation::IdentifyController, cmd::cns::CONTROLLER, 0)?;
        let oncs = u16::from_le_bytes([ctrl[520], ctrl[521]]);
        // Identify Namespace (CNS 00h), NVM Command Set 1.0c "Identify Namespace Data Structure": NSZE 7:0,
        // FLBAS byte 26 (format index bits 3:0, high bits 6:5), RESCAP byte 31,
        // LBA Format n at 128 + 4n with LBADS in its byte 2.
        let ns = self.identify(Operation::IdentifyNamespace, cmd::cns::NAMESPACE, self.nsid)?;
        let mut nsze = [0u8; 8];
        nsze.copy_from_slice(&ns[0..8]);
        let flbas = ns[26];
        let index = usize::from(flbas & 0x0f) | (usize::from(flbas >> 5 & 0x3) << 4);
        let lbads = ns[128 + 4 * index + 2];
        Ok(Capabilities::from_identify(
            oncs,
            ns[31],
            lbads,
            u64::from_le_bytes(nsze),
        ))
    }

    /// The Namespace Identification Descriptor list (Identify CNS 03h; layout in
    /// [`crate::identity`]). `Ok(None)` when the controller refuses CNS 03h as an
    /// invalid field (it predates revision 1.3, which introduced the list).
    pub fn descriptors(&self) -> Result<Option<NamespaceDescriptors>> {
        let op = Operation::IdentifyDescriptors;
        let buf = match self.identify(op, cmd::cns::DESCRIPTORS, self.nsid) {
            Ok(b) => b,
            Err(Error::Device { status, .. }) if status.same_code(NvmeStatus::INVALID_FIELD) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        crate::identity::parse_descriptors(&buf[..])
            .map(Some)
            .map_err(|source| self.invalid(op, source))
    }

    /// VID, serial number, model number and subsystem NQN from Identify Controller.
    pub fn controller_ids(&self) -> Result<ControllerIds> {
        let op = Operation::IdentifyController;
        let ctrl = self.identify(op, cmd::cns::CONTROLLER, 0)?;
        crate::identity::parse_controller(&ctrl[..]).map_err(|source| self.invalid(op, source))
    }

    fn invalid(&self, op: Operation, source: IdentifyError) -> Error {
        Error::InvalidIdentify {
            op,
            nsid: self.nsid,
            source,
        }
    }

    /// Which namespace this is: NGUID and EUI-64 from Identify Namespace, the UUID (and
    /// NGUID and EUI-64 where the fields are zero) from the descriptor list, the vendor
    /// id, serial and model numbers and the subsystem NQN from Identify Controller
    /// (layouts in [`crate::identity`]).
    pub fn namespace_identity(&self) -> Result<NamespaceIdentity> {
        let ctrl = self.controller_ids()?;
        let op = Operation::IdentifyNamespace;
        let ns = self.identify(op, cmd::cns::NAMESPACE, self.nsid)?;
        let (nguid, eui64) = crate::identity::parse_namespace_ids(&ns[..])
            .map_err(|source| self.invalid(op, source))?;
        let descs = self.descriptors()?.unwrap_or_default();
        NamespaceIdentity::from_parts(self.nsid, nguid, eui64, ctrl, &descs)
            .map_err(|source| self.invalid(Operation::IdentifyDescriptors, source))
    }

    /// The Reservation Persistence feature now (Get Features, FID 83h, current value):
    /// whether reservations and registrants persist through a power loss (PTPL).
    /// Unlike [`Capabilities::ptpl`] (RESCAP: the device *can*), this is whether it
    /// *does*.
    pub fn ptpl_state(&self) -> Result<bool> {
        let dw0 = self.submit(
            Operation::GetFeatures,
            Queue::Admin,
            Command::new(opcode::ADMIN_GET_FEATURES, self.nsid).cdw10(cmd::get_features_cdw10(
                cmd::FID_RESERVATION_PERSISTENCE,
                cmd::FeatureSelect::Current,
            )),
            Data::None,
        )?;
        Ok(cmd::ptpl_from_dword0(dw0))
    }

    /// Fails with [`Error::NoReservationSupport`] unless the namespace supports
    /// reservations.
    pub fn require_reservations(&self) -> Result<Capabilities> {
        let caps = self.capabilities()?;
        if caps.reservations {
            Ok(caps)
        } else {
            Err(Error::NoReservationSupport {
                path: self.path.clone(),
                nsid: self.nsid,
                oncs: caps.oncs_reservations,
                rescap: caps.rescap,
            })
        }
    }

    fn send(&self, op: Operation, opcode: u8, cdw10: u32, data: &[u8]) -> Result<()> {
        self.submit(
            op,
            Queue::Io,
            Command::new(opcode, self.nsid).cdw10(cdw10),
            Data::ToDevice(data),
        )
        .map(drop)
    }

    /// Reservation Report in the given layout, the buffer grown until every
    /// registrant fits.
    pub fn report_with(&self, format: ReportFormat) -> Result<ReservationStatus> {
        let extended = format == ReportFormat::Extended;
        read_report(extended, self.nsid, |buf| {
            let len = buf.len();
            self.submit(
                Operation::Report,
                Queue::Io,
                Command::new(opcode::RESERVATION_REPORT, self.nsid)
                    .cdw10(cmd::report_cdw10(len))
                    .cdw11(cmd::report_cdw11(extended)),
                Data::FromDevice(buf),
            )
            .map(drop)
        })
    }
}

/// Reads a report through `fetch` (which fills the buffer it is given, as the device
/// does: REGCTL counts every registrant, entries stop where the buffer ends), growing
/// the buffer until every registrant fits.
fn read_report(
    extended: bool,
    nsid: u32,
    mut fetch: impl FnMut(&mut [u8]) -> Result<()>,
) -> Result<ReservationStatus> {
    let mut len = INITIAL_REPORT_LEN;
    let mut last = None;
    for _ in 0..REPORT_ATTEMPTS {
        let mut buf = vec![0u8; len];
        fetch(&mut buf)?;
        match report::parse(&buf, extended) {
            Ok(st) => return Ok(st),
            Err(e @ ReportError::Truncated { needed, .. }) => {
                // Room for a few registrants joining between the two reads.
                len = (needed + 4 * EXTENDED_ENTRY_LEN).next_multiple_of(4);
                last = Some(e);
            }
            Err(source) => {
                return Err(Error::InvalidReport {
                    op: Operation::Report,
                    nsid,
                    source,
                });
            }
        }
    }
    Err(Error::InvalidReport {
        op: Operation::Report,
        nsid,
        source: last.unwrap_or(ReportError::TruncatedHeader {
            len: 0,
            header: EXTENDED_HEADER_LEN,
        }),
    })
}

impl Reservations for Namespace {
    fn register(&self, c: &Register) -> Result<()> {
        c.validate()?;
        self.send(
            Operation::Register,
            opcode::RESERVATION_REGISTER,
            c.cdw10(),
            &c.data(),
        )
    }

    fn acquire(&self, c: &Acquire) -> Result<()> {
        self.send(
            Operation::Acquire,
            opcode::RESERVATION_ACQUIRE,
            c.cdw10(),
            &c.data(),
        )
    }

    fn release(&self, c: &Release) -> Result<()> {
        self.send(
            Operation::Release,
            opcode::RESERVATION_RELEASE,
            c.cdw10(),
            &c.data(),
        )
    }

    fn identity(&self) -> Result<NamespaceIdentity> {
        self.namespace_identity()
    }

    /// The extended report; if the device refuses the extended structure with Invalid
    /// Field in Command (it has no 128-bit host identifiers), the regular one.
    fn report(&self) -> Result<ReservationStatus> {
        match self.report_with(ReportFormat::Extended) {
            Err(Error::Device { status, .. }) if status.same_code(NvmeStatus::INVALID_FIELD) => {
                self.report_with(ReportFormat::Regular)
            }
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::encode;
    use crate::{HostId, Key, RegisteredController};

    fn status_with(n: u16) -> ReservationStatus {
        ReservationStatus {
            generation: 1,
            rtype: ReservationType::WRITE_EXCLUSIVE,
            regctl: n,
            ptpls: false,
            registrants: (0..n)
                .map(|i| RegisteredController {
                    cntlid: 0xffff,
                    rcsts: u8::from(i == 0),
                    hostid: HostId([i as u8; 16]),
                    rkey: Key(u64::from(i) + 1),
                })
                .collect(),
            extended: true,
        }
    }

    /// Like nvmet: the full encoding truncated to the buffer, REGCTL the full count.
    fn device(st: &ReservationStatus, buf: &mut [u8]) {
        let full = encode(st);
        let n = full.len().min(buf.len());
        buf[..n].copy_from_slice(&full[..n]);
    }

    #[test]
    fn report_buffer_grows_until_every_registrant_fits() {
        // 200 registrants need 64 + 200 * 64 bytes, more than the first 4 KiB read.
        let st = status_with(200);
        let mut sizes = Vec::new();
        let got = read_report(true, 1, |buf| {
            sizes.push(buf.len());
            device(&st, buf);
            Ok(())
        })
        .unwrap();
        assert_eq!(got, st);
        assert_eq!(sizes.len(), 2, "{sizes:?}");
        assert_eq!(sizes[0], INITIAL_REPORT_LEN);
        assert!(sizes[1] >= 64 + 200 * 64 && sizes[1] % 4 == 0, "{sizes:?}");
        // Few registrants: one read.
        let mut calls = 0;
        read_report(true, 1, |buf| {
            calls += 1;
            device(&status_with(3), buf);
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 1);
    }

    #[test]
    fn report_that_never_fits_is_an_error_not_a_loop() {
        let mut n = 100u16;
        let err = read_report(true, 7, |buf| {
            // Registrants keep joining faster than the buffer grows.
            n += 100;
            device(&status_with(n), buf);
            Ok(())
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidReport {
                    nsid: 7,
                    source: ReportError::Truncated { .. },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn report_device_error_is_passed_through() {
        let err = read_report(false, 1, |_| {
            Err(Error::Device {
                op: Operation::Report,
                nsid: 1,
                status: NvmeStatus::HOST_ID_INCONSISTENT_FORMAT.with_dnr(),
            })
        })
        .unwrap_err();
        assert!(
            err.status()
                .unwrap()
                .same_code(NvmeStatus::HOST_ID_INCONSISTENT_FORMAT)
        );
    }

    #[test]
    fn capabilities_from_identify_fields() {
        // nvmet with resv_enable: ONCS has bit 5, RESCAP all six types + IEKEY.
        let c = Capabilities::from_identify(0x0020, 0xfe, 12, 1 << 14);
        assert!(c.reservations && c.oncs_reservations && c.iekey && !c.ptpl);
        assert_eq!(c.register_cptpl(), Cptpl::NoChange, "nothing to persist");
        assert_eq!(c.lba_size, 4096);
        // SPDK with a PTPL file: RESCAP bit 0 set, register with CPTPL 11b.
        let c = Capabilities::from_identify(0x0020, 0xff, 12, 1 << 14);
        assert!(c.ptpl);
        assert_eq!(c.register_cptpl(), Cptpl::Persist);
        assert_eq!(
            Register::register(crate::Key(1))
                .with_cptpl(c.register_cptpl())
                .cdw10()
                >> 30,
            0b11
        );
        assert_eq!(c.types(), ReservationType::ALL.to_vec());
        // RESCAP 0: no reservations even if the controller bit is set.
        let c = Capabilities::from_identify(0x0020, 0, 9, 0);
        assert!(!c.reservations);
        assert!(ReservationType::ALL.iter().all(|t| !c.supports(*t)));
        assert_eq!(c.lba_size, 512);
        // Only WE and WE-RO.
        let c = Capabilities::from_identify(0xffff, 0b0000_1010, 9, 0);
        assert_eq!(
            c.types(),
            [
                ReservationType::WRITE_EXCLUSIVE,
                ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY
            ]
        );
        // ONCS bit clear: nothing, whatever RESCAP says.
        let c = Capabilities::from_identify(0x001f, 0xff, 9, 0);
        assert!(!c.reservations && c.types().is_empty());
    }
}
