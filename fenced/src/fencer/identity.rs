//! Fence only the cluster's namespace: before preempting, the NVMe fencer checks that
//! its device is the namespace recorded at `<root>/namespace` by the first join.
//!
//! Device names move between boots. A controller whose device is another
//! reservation-capable namespace would find the victim's key absent there and call the
//! fence confirmed while the victim still writes the shared one. Absence of the key is
//! evidence only on the right namespace, so the device is identified (Identify: UUID,
//! NGUID, EUI-64 or the controller's serial number, and the subsystem NQN) at every
//! fence, not only at start.

use std::fmt;
use std::sync::Arc;

use nvme_resv::NamespaceIdentity;

use super::{BoxFuture, FenceCause};
use crate::store::EtcdStore;

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
    pub async fn expected(&self) -> Result<NamespaceIdentity, FenceCause> {
        let Some(record) = &self.record else {
            return Ok(self.joined.clone());
        };
        match record.recorded().await {
            Ok(Some(id)) => Ok(id),
            Ok(None) => {
                tracing::warn!(joined = %self.joined, "no namespace recorded any more: checking the device against the identity this daemon joined with");
                Ok(self.joined.clone())
            }
            Err(message) => Err(FenceCause::NamespaceRecord { message }),
        }
    }

    /// `Ok` when `found` (the device's identity now) is the expected namespace.
    pub async fn check(&self, found: NamespaceIdentity) -> Result<(), FenceCause> {
        let expected = self.expected().await?;
        if expected.same_namespace(&found) {
            Ok(())
        } else {
            Err(FenceCause::WrongNamespace {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = with(Ok(Some(id(2)))).check(id(1)).await.unwrap_err();
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
        let e = with(Err("etcd unavailable".into()))
            .check(id(1))
            .await
            .unwrap_err();
        assert!(matches!(e, FenceCause::NamespaceRecord { .. }), "{e:?}");
        assert!(e.to_string().contains("etcd unavailable"), "{e}");
    }
}
