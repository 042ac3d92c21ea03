//! Reaching what the daemon and the operator commands (`ops/`) share: etcd
//! ([`connect`], retrying with bounded backoff) and the shared namespace
//! ([`open_device`], [`open_shared_namespace`]: resolved, reservation-capable,
//! identified).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced::device::Device;
use fenced::store::{EtcdStore, StoreError, StoreOptions};
use nvme_resv::NamespaceIdentity;

use crate::config::EtcdSettings;

/// Longest pause between two attempts to reach etcd.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(10);

/// etcd could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No endpoint answered within the time allowed.
    #[error(
        "etcd unreachable at {endpoints} (from {endpoints_from}) after {waited_s:.0}s, {attempts} attempt{}: {source}; check that etcd runs there, or give --etcd-endpoints (or --config)",
        if *attempts == 1 { "" } else { "s" }
    )]
    Unreachable {
        endpoints: String,
        endpoints_from: String,
        waited_s: f32,
        attempts: u32,
        #[source]
        source: StoreError,
    },
    /// The TLS handshake failed or etcd refused the credentials: retrying with the
    /// same files and user fails the same way.
    #[error("etcd at {endpoints} refused the connection (presented: {security}): {source}")]
    Refused {
        endpoints: String,
        security: String,
        #[source]
        source: StoreError,
    },
    /// An error retrying cannot fix (bad URL, a TLS file that cannot be read, ...).
    #[error("cannot use etcd at {endpoints}: {source}")]
    Unusable {
        endpoints: String,
        #[source]
        source: StoreError,
    },
}

/// The shared namespace could not be opened, or cannot be used as the shared one.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `--block-device` does not resolve (missing, a dangling link): the OS cause
    /// follows as the source.
    #[error(
        "cannot open {}: {source}; check --block-device: name the shared namespace that exists on this host (/dev/nvmeXnY, /dev/ngXnY, or better a /dev/disk/by-id/ link, which stays the same across boots: `ls -l /dev/disk/by-id/ | grep nvme` lists them)",
        path.display()
    )]
    ResolveDevice {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} ({}) reports no UUID, NGUID or EUI-64 and its controller no serial number ({identity}): fenced cannot tell it from another namespace of its subsystem, so it cannot check that every node and controller uses the same namespace. Give the namespace an identifier (nvmet: configfs device_uuid or device_nguid) or, knowing the risk, pass --allow-unidentified-namespace",
        path.display(), device.display()
    )]
    UnidentifiedNamespace {
        path: PathBuf,
        device: PathBuf,
        identity: Box<NamespaceIdentity>,
    },
    /// `--ebs-volume-id` names one EBS volume and the block device is another.
    #[error(
        "{} ({}) is EBS volume {found} (its serial number {identity}), not the --ebs-volume-id {configured}: the EBS fencer would detach a volume other than the one the reservations are on. Name this host's device of {configured} (/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{}), or the volume of this device",
        path.display(), device.display(), configured.replace('-', "")
    )]
    WrongEbsVolume {
        path: PathBuf,
        device: PathBuf,
        identity: Box<NamespaceIdentity>,
        found: String,
        configured: String,
    },
    #[error("{}", open_message(path, source))]
    OpenDevice {
        path: PathBuf,
        #[source]
        source: nvme_resv::Error,
    },
    #[error("cannot identify {}: {source}", path.display())]
    Identify {
        path: PathBuf,
        #[source]
        source: nvme_resv::Error,
    },
    #[error(
        "{} does not support NVMe reservations (ONCS bit 5: {oncs}, RESCAP {rescap:#04x}); use --fencer none for single-signal fencing",
        path.display()
    )]
    NoReservations {
        path: PathBuf,
        oncs: bool,
        rescap: u8,
    },
    #[error(
        "{} cannot hold the {rtype} reservation fenced uses to shut out unregistered hosts: it reports RESCAP {rescap:#04x} (types: {types}); use a device that supports it, or --fencer none for single-signal fencing",
        path.display()
    )]
    ReservationTypeUnsupported {
        path: PathBuf,
        rtype: nvme_resv::ReservationType,
        rescap: u8,
        types: String,
    },
}

/// Attempts in a row whose TLS connection the server closed right after accepting it
/// before `connect` takes it for a refused client certificate (a server going away
/// closes one attempt's, not every one's).
const CLOSED_TLS_ATTEMPTS: u32 = 3;

/// Connects to etcd, retrying with bounded backoff while no endpoint answers; every
/// attempt is logged with the endpoints. `give_up`: stop after this long (`None`:
/// never). Errors other than "unavailable" (bad URL, a TLS file that cannot be read,
/// a certificate or credentials etcd refuses) are not retried, nor is a TLS
/// connection the server closes at once on [`CLOSED_TLS_ATTEMPTS`] attempts in a row.
/// `etcd`'s TLS files and credentials replace those of `opts`.
pub async fn connect(
    etcd: &EtcdSettings,
    claim_ttl: Duration,
    opts: &StoreOptions,
    give_up: Option<Duration>,
) -> Result<EtcdStore, ConnectError> {
    let opts = &StoreOptions {
        security: etcd.security.clone(),
        ..opts.clone()
    };
    let t0 = Instant::now();
    let mut delay = Duration::from_millis(500);
    let eps = etcd.endpoints.join(",");
    let tls = etcd.endpoints.iter().all(|e| e.starts_with("https://"));
    // Consecutive attempts whose TLS connection the server closed at once.
    let mut closed = 0;
    for attempt in 1.. {
        let attempt_fut = EtcdStore::connect_with(&etcd.endpoints, &etcd.root, claim_ttl, opts);
        // A member that accepts TCP and never answers would hold one attempt for the
        // client's own timeouts: bound it by what is left of the wait.
        let result = match give_up {
            Some(g) => {
                let left = g
                    .saturating_sub(t0.elapsed())
                    .max(Duration::from_millis(200));
                match tokio::time::timeout(left, attempt_fut).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Unavailable {
                        op: "connect",
                        source: etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                            format!("no answer within {:.1}s", left.as_secs_f32()),
                        )),
                    }),
                }
            }
            None => attempt_fut.await,
        };
        closed = match &result {
            Err(e) if tls && e.is_closed_by_server() => closed + 1,
            _ => 0,
        };
        match result {
            Err(e) if closed >= CLOSED_TLS_ATTEMPTS => {
                return Err(ConnectError::Refused {
                    endpoints: eps,
                    security: etcd.security.describe(),
                    source: e.into_tls_refused(),
                });
            }
            Ok(s) => {
                if attempt > 1 {
                    tracing::info!(step = "connect", endpoints = %eps, attempt, waited_s = t0.elapsed().as_secs(), "etcd at {eps} answers; starting");
                }
                return Ok(s);
            }
            Err(e @ StoreError::Unavailable { .. })
                if give_up.is_none_or(|g| t0.elapsed() + delay < g) =>
            {
                let limit = give_up.map_or("no limit".to_owned(), |g| {
                    format!("giving up after {}s", g.as_secs())
                });
                tracing::warn!(
                    step = "connect",
                    endpoints = %eps,
                    attempt,
                    error = %e,
                    "waiting for etcd at {eps}: no endpoint answers (attempt {attempt}, {:.0}s so far, {limit}); retrying in {:.1}s",
                    t0.elapsed().as_secs_f32(),
                    delay.as_secs_f32()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_CONNECT_BACKOFF);
            }
            Err(source @ StoreError::Unavailable { .. }) => {
                return Err(ConnectError::Unreachable {
                    endpoints: eps,
                    endpoints_from: etcd.endpoints_from.clone(),
                    waited_s: t0.elapsed().as_secs_f32(),
                    attempts: attempt,
                    source,
                });
            }
            Err(source @ (StoreError::Tls { .. } | StoreError::Denied { .. })) => {
                return Err(ConnectError::Refused {
                    endpoints: eps,
                    security: etcd.security.describe(),
                    source,
                });
            }
            Err(source) => {
                return Err(ConnectError::Unusable {
                    endpoints: eps,
                    source,
                });
            }
        }
    }
    unreachable!("the loop returns")
}

/// "cannot open <path>: <why>", without repeating the device error's own "cannot
/// open <path>" (its OS cause follows as the error's source).
fn open_message(path: &Path, source: &nvme_resv::Error) -> String {
    let inner = source.to_string();
    if inner.starts_with("cannot open") {
        inner
    } else {
        format!("cannot open {}: {inner}", path.display())
    }
}

/// Opens `path` resolved (a `/dev/disk/by-id/` link names the same namespace across
/// boots) and checks that it supports reservations. Returns the namespace and the
/// device node the path resolved to.
fn open_reservations(
    path: &Path,
) -> Result<(nvme_resv::Namespace, PathBuf, nvme_resv::Capabilities), OpenError> {
    let device = std::fs::canonicalize(path).map_err(|source| OpenError::ResolveDevice {
        path: path.to_owned(),
        source,
    })?;
    let ns = nvme_resv::Namespace::open(&device).map_err(|source| OpenError::OpenDevice {
        path: device.clone(),
        source,
    })?;
    let caps = ns.capabilities().map_err(|source| OpenError::Identify {
        path: device.clone(),
        source,
    })?;
    if !caps.reservations {
        return Err(OpenError::NoReservations {
            path: device,
            oncs: caps.oncs_reservations,
            rescap: caps.rescap,
        });
    }
    check_reservation_type(&device, &caps)?;
    Ok((ns, device, caps))
}

/// `fenced run` refuses a device that cannot hold [`fenced::device::RESERVATION_TYPE`]
/// (issue 27), in one line naming what the device reports.
fn check_reservation_type(device: &Path, caps: &nvme_resv::Capabilities) -> Result<(), OpenError> {
    let rtype = fenced::device::RESERVATION_TYPE;
    if caps.supports(rtype) {
        return Ok(());
    }
    let types = caps.types();
    Err(OpenError::ReservationTypeUnsupported {
        path: device.to_owned(),
        rtype,
        rescap: caps.rescap,
        types: if types.is_empty() {
            "none".into()
        } else {
            types
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        },
    })
}

/// The CPTPL to register with and the persistence line logged at start (issue 27):
/// registrations persist where the device can (RESCAP bit 0); a warning where it
/// cannot, since a target restart then drops every registration and the reservation.
/// Also what it found, for the namespace record (`fenced status` shows it).
fn persistence_at_start(
    ns: &nvme_resv::Namespace,
    caps: &nvme_resv::Capabilities,
) -> (nvme_resv::Cptpl, fenced::core::Persistence) {
    let p = fenced::core::Persistence::from_device(caps.ptpl, ns.ptpl_state().ok());
    if p.warn() {
        tracing::warn!(step = "persistence", device = %ns.path().display(), "{}", p.describe());
    } else {
        tracing::info!(step = "persistence", device = %ns.path().display(), "{}", p.describe());
    }
    (caps.register_cptpl(), p)
}

/// Opens a namespace that supports reservations (`fenced attest --block-device`).
pub(crate) fn open_device(path: &Path) -> Result<Device, OpenError> {
    open_reservations(path).map(|(ns, _, _)| Arc::new(ns) as Device)
}

/// Opens the shared namespace ([`open_reservations`]; both names are logged) and reads
/// its identity for the join and fence checks ([`check_shared_namespace`]); with the
/// CPTPL to register with and the persistence the device reports.
pub(crate) fn open_shared_namespace(
    path: &Path,
    allow_unidentified: bool,
    ebs_volume_id: Option<&str>,
) -> Result<SharedNamespace, OpenError> {
    let (ns, device, caps) = open_reservations(path)?;
    let identity = ns
        .namespace_identity()
        .map_err(|source| OpenError::Identify {
            path: device.clone(),
            source,
        })?;
    check_shared_namespace(path, &device, &identity, allow_unidentified, ebs_volume_id)?;
    tracing::info!(block_device = %path.display(), device = %device.display(), nsid = ns.nsid(), namespace = %identity, kind = identity.kind().map_or("none", |k| k.as_str()), wwid = %identity.wwid(), "shared namespace device");
    let (cptpl, persistence) = persistence_at_start(&ns, &caps);
    Ok((Arc::new(ns), identity, cptpl, persistence))
}

/// What [`open_shared_namespace`] returns: the device, its identity, the CPTPL its
/// registrations use and its persistence.
pub(crate) type SharedNamespace = (
    Device,
    NamespaceIdentity,
    nvme_resv::Cptpl,
    fenced::core::Persistence,
);

/// Whether the shared namespace's identity lets the daemon start: a namespace named by
/// a UUID, NGUID, EUI-64 or (none of them) its controller's serial number starts with
/// default flags; one with none of these only with `allow_unidentified`. With
/// `--ebs-volume-id`, a namespace that is an EBS volume must be that volume (EC2
/// reports the volume id as the serial number, without the dash).
fn check_shared_namespace(
    path: &Path,
    device: &Path,
    identity: &NamespaceIdentity,
    allow_unidentified: bool,
    ebs_volume_id: Option<&str>,
) -> Result<(), OpenError> {
    if let Some(configured) = ebs_volume_id {
        if let Some(found) = fenced::fencer::other_ebs_volume(identity, configured) {
            return Err(OpenError::WrongEbsVolume {
                path: path.to_owned(),
                device: device.to_owned(),
                identity: Box::new(identity.clone()),
                found,
                configured: configured.to_owned(),
            });
        }
    }
    if !identity.is_identified() {
        if !allow_unidentified {
            return Err(OpenError::UnidentifiedNamespace {
                path: path.to_owned(),
                device: device.to_owned(),
                identity: Box::new(identity.clone()),
            });
        }
        tracing::warn!(block_device = %path.display(), device = %device.display(), namespace = %identity, "--allow-unidentified-namespace: the namespace reports no UUID, NGUID or EUI-64 and its controller no serial number; only its subsystem NQN is checked, another namespace of the same subsystem would pass");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_the_reservation_type_is_refused_in_one_line() {
        let dev = Path::new("/dev/nvme0n1");
        // nvmet: all six types.
        let all = nvme_resv::Capabilities::from_identify(0x20, 0xfe, 12, 1 << 14);
        assert!(check_reservation_type(dev, &all).is_ok());
        // Only Write Exclusive and Write Exclusive - Registrants Only.
        let some = nvme_resv::Capabilities::from_identify(0x20, 0b0000_1010, 12, 1 << 14);
        let e = check_reservation_type(dev, &some).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.starts_with(
                "/dev/nvme0n1 cannot hold the Write Exclusive - All Registrants (5) reservation"
            ),
            "{e}"
        );
        assert!(
            e.contains(
                "RESCAP 0x0a (types: Write Exclusive (1), Write Exclusive - Registrants Only (3))"
            ),
            "{e}"
        );
    }

    fn check(id: &NamespaceIdentity, allow: bool, ebs: Option<&str>) -> Result<(), OpenError> {
        check_shared_namespace(
            Path::new("/dev/disk/by-id/x"),
            Path::new("/dev/nvme0n1"),
            id,
            allow,
            ebs,
        )
    }

    fn ebs(volume: &str) -> NamespaceIdentity {
        NamespaceIdentity {
            vid: nvme_resv::identity::AMAZON_VID,
            serial: volume.as_bytes().to_vec(),
            model: nvme_resv::identity::EBS_MODEL.as_bytes().to_vec(),
            nsid: 1,
            ..NamespaceIdentity::default()
        }
    }

    /// Issue 27: the kernel target's default namespace (a UUID only) and an EBS volume
    /// (a serial number only) start with default flags.
    #[test]
    fn uuid_only_and_serial_only_namespaces_start_with_default_flags() {
        let uuid_only = NamespaceIdentity {
            uuid: [0x3c; 16],
            subnqn: "nqn.2014-08.org.fenced:hwtest".into(),
            ..NamespaceIdentity::default()
        };
        check(&uuid_only, false, None).unwrap();
        check(&ebs("vol0123456789abcdef0"), false, None).unwrap();
        check(
            &ebs("vol0123456789abcdef0"),
            false,
            Some("vol-0123456789abcdef0"),
        )
        .unwrap();
    }

    #[test]
    fn only_a_namespace_without_any_identifier_needs_the_override() {
        let e = check(&ebs(""), false, None).unwrap_err();
        assert!(
            matches!(e, OpenError::UnidentifiedNamespace { .. }),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("no UUID, NGUID or EUI-64 and its controller no serial number")
                && text.contains("--allow-unidentified-namespace"),
            "{text}"
        );
        check(&ebs(""), true, None).unwrap();
    }

    #[test]
    fn an_ebs_volume_other_than_the_configured_one_is_refused() {
        let e = check(
            &ebs("vol0123456789abcdef0"),
            false,
            Some("vol-0fedcba9876543210"),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, OpenError::WrongEbsVolume { found, .. } if found == "vol-0123456789abcdef0"),
            "{e:?}"
        );
        assert!(
            text.contains("is EBS volume vol-0123456789abcdef0")
                && text.contains("not the --ebs-volume-id vol-0fedcba9876543210")
                && text.contains("nvme-Amazon_Elastic_Block_Store_vol0fedcba9876543210"),
            "{text}"
        );
        // Even with the override: it is about which volume, not whether it is named.
        assert!(
            check(
                &ebs("vol0123456789abcdef0"),
                true,
                Some("vol-0fedcba9876543210")
            )
            .is_err()
        );
    }
}
