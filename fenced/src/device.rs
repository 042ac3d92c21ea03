//! The reservation device, as the agent, the controller's fencer, `fenced attest` and
//! the metrics see it: the [`Device`] handle, the [`RESERVATION_TYPE`] every node
//! holds, the one "unregister our key and check it gone" step
//! ([`unregister_checked`]), the check that a device is the cluster's shared namespace
//! ([`NamespaceCheck`]), and the [`ObservedDevice`] wrapper that times every command.
//!
//! Device names move between boots. A controller whose device is another
//! reservation-capable namespace would find the victim's key absent there and call the
//! fence confirmed while the victim still writes the shared one. Absence of the key is
//! evidence only on the right namespace, so the device is identified (Identify: UUID,
//! NGUID, EUI-64 or the controller's serial number, and the subsystem NQN) at every
//! fence, not only at start.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use nvme_resv::{
    Acquire, AcquireAction, Cptpl, Key, NamespaceIdentity, Register, RegisterAction,
    ReservationStatus, ReservationType, Reservations,
};

use crate::observe::Observer;
use crate::store::EtcdStore;

/// The reservation type the agents hold and the fencer preempts with: Write
/// Exclusive - All Registrants. Every registrant may write, nobody else may: the same
/// write semantics as Write Exclusive - Registrants Only, but with a property fencing
/// needs. With a *Registrants Only* type, a preempt issued by the reservation holder
/// itself only changes the type on Linux nvmet (`drivers/nvme/target/pr.c`,
/// `nvmet_pr_preempt`: `holder == reg` returns before looking at PRKEY), so a
/// controller that happens to be the holder could never remove a victim's key. With
/// an *All Registrants* type, a preempt with a non-zero PRKEY unregisters that key
/// whoever issues it (nvmet and NVMe Base 2.0 §8.19.7 agree), and the reservation
/// survives any one registrant leaving.
pub const RESERVATION_TYPE: ReservationType = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;

/// The reservation device a fencer or agent talks to.
pub type Device = Arc<dyn Reservations + Send + Sync>;

/// Whether `key` is among the report's registrants: [`ReservationStatus::is_registered`]
/// (kept for the agent's call sites).
pub fn key_registered(status: &ReservationStatus, key: Key) -> bool {
    status.is_registered(key)
}

/// Unregisters `key`, then reads a report: whether the key is *still* registered
/// (`Ok(false)`: gone, and from then on the device refuses every write of this host,
/// Write Exclusive - All Registrants). Blocking: call it on `spawn_blocking`. Used by
/// a clean leave and by a start that failed after the register.
pub fn unregister_checked(device: &Device, key: Key) -> nvme_resv::Result<bool> {
    device.register(&Register {
        rrega: RegisterAction::Unregister,
        crkey: key,
        nrkey: Key(0),
        iekey: false,
        cptpl: Cptpl::NoChange,
    })?;
    Ok(key_registered(&device.report()?, key))
}

/// Registers `key` unless `registered` (what the caller's report showed), then
/// acquires [`RESERVATION_TYPE`] if no reservation is held; a peer that acquires in
/// between is fine, our acquire failing then is not an error. Returns the type held
/// afterwards. Blocking: call it on `spawn_blocking`. Used by the unfence at start and
/// by the re-registration after the target lost its reservation state.
pub fn register_and_hold(
    device: &Device,
    key: Key,
    registered: bool,
    cptpl: Cptpl,
) -> nvme_resv::Result<ReservationType> {
    if !registered {
        device.register(&Register {
            rrega: RegisterAction::Register,
            crkey: Key(0),
            nrkey: key,
            iekey: false,
            cptpl,
        })?;
    }
    hold_if_none(device, key, device.report()?.rtype)?;
    Ok(device.report()?.rtype)
}

/// The acquire half of holding the reservation: when `held` (the type the caller's
/// report showed) is none, acquires [`RESERVATION_TYPE`] with our registered `key`. A
/// peer that acquires in between is fine: our acquire failing is an error only when a
/// report read after it still shows no reservation. Blocking: call it on
/// `spawn_blocking`. Used by [`register_and_hold`] and by the agent's device check.
pub fn hold_if_none(device: &Device, key: Key, held: ReservationType) -> nvme_resv::Result<()> {
    if held == ReservationType::NONE
        && let Err(e) = device.acquire(&Acquire {
            racqa: AcquireAction::Acquire,
            rtype: RESERVATION_TYPE,
            crkey: key,
            prkey: Key(0),
            iekey: false,
        })
        && device.report()?.rtype == ReservationType::NONE
    {
        return Err(e);
    }
    Ok(())
}

/// A boxed, sendable future (the same type as `fencer::BoxFuture`).
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where the fencer reads the recorded namespace at fence time.
pub trait NamespaceRecord: Send + Sync + fmt::Debug {
    /// The recorded identity; `Ok(None)` when none is recorded; `Err` with what failed.
    fn recorded(&self) -> BoxFuture<'_, Result<Option<NamespaceIdentity>, String>>;
}

impl NamespaceRecord for EtcdStore {
    fn recorded(&self) -> BoxFuture<'_, Result<Option<NamespaceIdentity>, String>> {
        Box::pin(async move { self.namespace_record().await.map_err(|e| e.to_string()) })
    }
}

/// Why a device is not (or cannot be shown to be) the cluster's shared namespace. The
/// fencer reports it as `FenceCause::WrongNamespace` / `FenceCause::NamespaceRecord`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceMismatch {
    /// The device is another namespace.
    Wrong {
        /// The recorded namespace.
        expected: Box<NamespaceIdentity>,
        /// Our device's.
        found: Box<NamespaceIdentity>,
    },
    /// The recorded namespace could not be read.
    Unreadable {
        /// What failed.
        message: String,
    },
}

/// What the NVMe fencer compares its device with.
#[derive(Debug, Clone)]
pub struct NamespaceCheck {
    /// The identity this daemon checked against the record when it joined: used when
    /// the record has since been deleted.
    pub joined: NamespaceIdentity,
    /// The record, read again at each fence (`None`: compare with `joined` only).
    pub record: Option<Arc<dyn NamespaceRecord>>,
}

impl NamespaceCheck {
    /// Compare with `joined` only.
    pub fn fixed(joined: NamespaceIdentity) -> Self {
        Self {
            joined,
            record: None,
        }
    }

    /// The identity the device must have: the record, else what we joined with.
    pub async fn expected(&self) -> Result<NamespaceIdentity, NamespaceMismatch> {
        let Some(record) = &self.record else {
            return Ok(self.joined.clone());
        };
        match record.recorded().await {
            Ok(Some(id)) => Ok(id),
            Ok(None) => {
                tracing::warn!(joined = %self.joined, "no namespace recorded any more: checking the device against the identity this daemon joined with");
                Ok(self.joined.clone())
            }
            Err(message) => Err(NamespaceMismatch::Unreadable { message }),
        }
    }

    /// `Ok` when `found` (the device's identity now) is the expected namespace.
    pub async fn check(&self, found: NamespaceIdentity) -> Result<(), NamespaceMismatch> {
        let expected = self.expected().await?;
        if expected.same_namespace(&found) {
            Ok(())
        } else {
            Err(NamespaceMismatch::Wrong {
                expected: Box::new(expected),
                found: Box::new(found),
            })
        }
    }
}

/// The EBS volume the namespace is, when it is an EBS volume
/// ([`NamespaceIdentity::ebs_volume_id`]: Amazon's vendor id, model "Amazon Elastic
/// Block Store", serial number `vol…`) other than `volume_id` (`vol-…`, as
/// `--ebs-volume-id` takes it). `None` when it is that volume or not an EBS volume
/// (the NVMe-oF and test targets the EBS fallback level is also used with).
pub fn other_ebs_volume(identity: &NamespaceIdentity, volume_id: &str) -> Option<String> {
    identity.ebs_volume_id().filter(|found| found != volume_id)
}

/// A reservation device whose every command is timed and counted by status
/// (`fenced_device_command_duration_seconds`, `fenced_device_commands_total`); the
/// commands themselves pass through unchanged.
pub struct ObservedDevice {
    inner: Device,
    observer: Observer,
}

impl ObservedDevice {
    /// `inner`, reporting to `observer`.
    pub fn wrap(inner: Device, observer: Observer) -> Device {
        Arc::new(Self { inner, observer })
    }

    fn timed<T>(
        &self,
        command: &'static str,
        f: impl FnOnce() -> nvme_resv::Result<T>,
    ) -> nvme_resv::Result<T> {
        let t0 = Instant::now();
        let r = f();
        self.observer.device_command(command, t0.elapsed(), &r);
        r
    }
}

impl fmt::Debug for ObservedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservedDevice").finish_non_exhaustive()
    }
}

impl Reservations for ObservedDevice {
    fn register(&self, cmd: &nvme_resv::Register) -> nvme_resv::Result<()> {
        self.timed("register", || self.inner.register(cmd))
    }
    fn acquire(&self, cmd: &nvme_resv::Acquire) -> nvme_resv::Result<()> {
        self.timed("acquire", || self.inner.acquire(cmd))
    }
    fn release(&self, cmd: &nvme_resv::Release) -> nvme_resv::Result<()> {
        self.timed("release", || self.inner.release(cmd))
    }
    fn report(&self) -> nvme_resv::Result<ReservationStatus> {
        self.timed("report", || self.inner.report())
    }
    // Forwarded explicitly: the trait's default answers Unsupported, and a fencer whose
    // device cannot identify itself refuses every fence (the namespace check).
    fn identity(&self) -> nvme_resv::Result<NamespaceIdentity> {
        self.timed("identify", || self.inner.identity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencer::FenceCause;

    fn register(device: &Device, key: Key) {
        device.register(&Register::register(key)).unwrap();
    }

    #[test]
    fn hold_if_none_acquires_only_when_nothing_is_held() {
        let ns = nvme_resv::model::Namespace::new();
        let ours: Device = Arc::new(ns.host(nvme_resv::HostId([1; 16])));
        register(&ours, Key(1));
        // A report that shows a reservation held: nothing is sent.
        ns.fail_next(
            nvme_resv::Operation::Acquire,
            nvme_resv::NvmeStatus::INTERNAL,
        );
        hold_if_none(&ours, Key(1), RESERVATION_TYPE).unwrap();
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
        // None held: acquired (after the queued fault, which fails the first try).
        let e = hold_if_none(&ours, Key(1), ReservationType::NONE).unwrap_err();
        assert!(
            e.status()
                .is_some_and(|s| s.same_code(nvme_resv::NvmeStatus::INTERNAL)),
            "{e}"
        );
        hold_if_none(&ours, Key(1), ReservationType::NONE).unwrap();
        assert_eq!(ns.snapshot().rtype, RESERVATION_TYPE);
    }

    #[derive(Debug)]
    struct Fixed(Result<Option<NamespaceIdentity>, String>);
    impl NamespaceRecord for Fixed {
        fn recorded(&self) -> BoxFuture<'_, Result<Option<NamespaceIdentity>, String>> {
            let r = self.0.clone();
            Box::pin(async move { r })
        }
    }

    fn id(b: u8) -> NamespaceIdentity {
        NamespaceIdentity {
            nguid: [b; 16],
            eui64: [0; 8],
            subnqn: "nqn.test:s".into(),
            ..nvme_resv::NamespaceIdentity::default()
        }
    }

    fn with(r: Result<Option<NamespaceIdentity>, String>) -> NamespaceCheck {
        NamespaceCheck {
            joined: id(1),
            record: Some(Arc::new(Fixed(r))),
        }
    }

    #[tokio::test]
    async fn the_record_decides_then_the_joined_identity() {
        with(Ok(Some(id(2)))).check(id(2)).await.unwrap();
        let e = FenceCause::from(with(Ok(Some(id(2)))).check(id(1)).await.unwrap_err());
        assert!(
            matches!(&e, FenceCause::WrongNamespace { expected, found } if **expected == id(2) && **found == id(1)),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains(&id(2).to_string()) && text.contains(&id(1).to_string()),
            "{text}"
        );
        with(Ok(None)).check(id(1)).await.unwrap();
        assert!(with(Ok(None)).check(id(2)).await.is_err());
        NamespaceCheck::fixed(id(1)).check(id(1)).await.unwrap();
        assert!(NamespaceCheck::fixed(id(1)).check(id(3)).await.is_err());
    }

    #[test]
    fn an_ebs_device_must_be_the_configured_volume() {
        let ebs = |serial: &str, model: &str| NamespaceIdentity {
            vid: nvme_resv::identity::AMAZON_VID,
            serial: serial.as_bytes().to_vec(),
            model: model.as_bytes().to_vec(),
            nsid: 1,
            ..NamespaceIdentity::default()
        };
        let dev = ebs("vol0123456789abcdef0", "Amazon Elastic Block Store");
        // EC2 writes the id without its dash in the serial number.
        assert_eq!(other_ebs_volume(&dev, "vol-0123456789abcdef0"), None);
        assert_eq!(
            other_ebs_volume(&dev, "vol-0fedcba9876543210").as_deref(),
            Some("vol-0123456789abcdef0")
        );
        assert_eq!(
            other_ebs_volume(&dev, "vol0123456789abcdef0").as_deref(),
            Some("vol-0123456789abcdef0")
        );
        // Not an EBS volume (another model, another vendor, an NGUID device): no say.
        let store = ebs("vol0fedcba9876543210", "Amazon EC2 NVMe Instance Storage");
        assert_eq!(other_ebs_volume(&store, "vol-0123456789abcdef0"), None);
        assert_eq!(other_ebs_volume(&id(1), "vol-0123456789abcdef0"), None);
    }

    #[tokio::test]
    async fn an_unreadable_record_is_an_error_not_a_match() {
        let e = FenceCause::from(
            with(Err("etcd unavailable".into()))
                .check(id(1))
                .await
                .unwrap_err(),
        );
        assert!(matches!(e, FenceCause::NamespaceRecord { .. }), "{e:?}");
        assert!(e.to_string().contains("etcd unavailable"), "{e}");
    }
}
