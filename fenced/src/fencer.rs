//! Fencers: the second, out-of-etcd confirmation that a node can no longer write.
//!
//! A [`Fencer`] performs the `sever` and `verify` steps. It is asynchronous (boxed
//! futures, so `Arc<dyn Fencer>` works) because the EBS fencer polls a cloud API; the
//! NVMe fencer's blocking ioctls run on `spawn_blocking`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use nvme_resv::{Acquire, AcquireAction, Key, ReservationStatus, ReservationType, Reservations};

use crate::core::{Confirmation, FenceStep, Victim};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A fence that could not be confirmed. The generation is not bumped.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed: {message}")]
pub struct FenceError {
    /// The step that failed (`sever` or `verify`).
    pub step: FenceStep,
    /// What happened.
    pub message: String,
    /// The underlying error, when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl FenceError {
    /// A failure at `step`.
    pub fn new(step: FenceStep, message: impl Into<String>) -> Self {
        Self {
            step,
            message: message.into(),
            source: None,
        }
    }
}

/// Something that severs a node's access to the shared device and confirms it.
pub trait Fencer: Send + Sync + fmt::Debug {
    /// `nvme`, `ebs`, `none`.
    fn name(&self) -> &'static str;
    /// Sever `victim`'s access and verify it. `Ok` with `severed: false` means
    /// single-signal mode (nothing severed; arenas are never released).
    fn fence<'a>(&'a self, victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>>;
}

/// Single-signal mode: the generation is bumped on lease expiry alone. It stops a node
/// publishing metadata, not writing bytes, so arenas are never released.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoneFencer;

impl Fencer for NoneFencer {
    fn name(&self) -> &'static str {
        "none"
    }
    fn fence<'a>(&'a self, _victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async {
            Ok(Confirmation {
                fencer: "none".to_owned(),
                severed: false,
                evidence: "single-signal: lease expiry only, device access NOT severed".to_owned(),
            })
        })
    }
}

/// Operator-attested fence (seeds 001/002): a person confirmed out of band that the
/// node is gone and supplies the second confirmation. The reason is recorded verbatim
/// in the audit record. It counts as a severance (arenas are released): the operator
/// vouches for it, and `fenced attest` refuses while the node is a member or its
/// liveness is fresh.
#[derive(Debug, Clone)]
pub struct AttestedFencer {
    /// Who attests.
    pub operator: String,
    /// The out-of-band evidence, verbatim.
    pub reason: String,
}

impl Fencer for AttestedFencer {
    fn name(&self) -> &'static str {
        "operator"
    }
    fn fence<'a>(&'a self, _victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async move {
            Ok(Confirmation {
                fencer: "operator".to_owned(),
                severed: true,
                evidence: format!("attested by {}: {}", self.operator, self.reason),
            })
        })
    }
}

/// Which Reservation Acquire action severs the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreemptMode {
    /// Preempt and Abort: also aborts the victim's commands in flight (default).
    #[default]
    PreemptAndAbort,
    /// Preempt only.
    Preempt,
}

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

/// Whether `key` is among the report's registrants.
pub fn key_registered(status: &ReservationStatus, key: Key) -> bool {
    status.registrants.iter().any(|r| r.rkey == key)
}

/// The NVMe fencer: preempt (and abort) the victim's key with our own registered key,
/// then re-read the report and require the victim's key gone.
#[derive(Clone)]
pub struct NvmeFencer {
    device: Device,
    own_key: Key,
    mode: PreemptMode,
    key_of: fn(&str) -> Key,
}

impl fmt::Debug for NvmeFencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmeFencer")
            .field("own_key", &format_args!("{:#x}", self.own_key.0))
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl NvmeFencer {
    /// A fencer acting through `device` as the registrant `own_key`; victims' keys are
    /// `nvme_resv::key_for_node(node)`.
    pub fn new(device: Device, own_key: Key, mode: PreemptMode) -> Self {
        Self {
            device,
            own_key,
            mode,
            key_of: nvme_resv::key_for_node,
        }
    }

    /// Replaces the node-id-to-key function (tests).
    pub fn with_key_fn(mut self, key_of: fn(&str) -> Key) -> Self {
        self.key_of = key_of;
        self
    }

    fn blocking(&self, victim_key: Key) -> Result<Confirmation, FenceError> {
        if victim_key == self.own_key {
            return Err(FenceError::new(
                FenceStep::Sever,
                format!(
                    "victim key {:#x} equals our own key: refusing to preempt ourselves",
                    victim_key.0
                ),
            ));
        }
        let racqa = match self.mode {
            PreemptMode::PreemptAndAbort => AcquireAction::PreemptAndAbort,
            PreemptMode::Preempt => AcquireAction::Preempt,
        };
        let cmd = Acquire {
            racqa,
            rtype: RESERVATION_TYPE,
            crkey: self.own_key,
            prkey: victim_key,
            iekey: false,
        };
        let preempt = self.device.acquire(&cmd);
        fail::fail_point!("fence::verify", |_| Err(FenceError::new(
            FenceStep::Verify,
            "fail point fence::verify"
        )));
        // Verify from the device whatever the preempt said: a preempt that reports
        // success while the registration survives is a failed fence, and a preempt of
        // a key that is already absent (a retry) is a conflict but a confirmed fence.
        let report = self.device.report().map_err(|e| FenceError {
            step: FenceStep::Verify,
            message: format!("reservation report failed: {e}"),
            source: Some(Box::new(e)),
        })?;
        if key_registered(&report, victim_key) {
            return Err(match preempt {
                Err(e) => FenceError {
                    step: FenceStep::Sever,
                    message: format!("{racqa:?} of key {:#x} failed: {e}", victim_key.0),
                    source: Some(Box::new(e)),
                },
                Ok(()) => FenceError::new(
                    FenceStep::Verify,
                    format!(
                        "{racqa:?} of key {:#x} reported success but the key is still registered (generation {})",
                        victim_key.0, report.generation
                    ),
                ),
            });
        }
        if !key_registered(&report, self.own_key) {
            // We sever others only as a registrant: if our own key is gone we were
            // fenced ourselves, and our word is worth nothing.
            return Err(FenceError::new(
                FenceStep::Verify,
                format!(
                    "our own key {:#x} is not registered: we are fenced",
                    self.own_key.0
                ),
            ));
        }
        let how = match preempt {
            Ok(()) => format!("{racqa:?}"),
            Err(e) => format!("already absent ({racqa:?} answered: {e})"),
        };
        Ok(Confirmation {
            fencer: "nvme".to_owned(),
            severed: true,
            evidence: format!(
                "key {:#x} {how}; absent from report (generation {}, {} registrant(s))",
                victim_key.0,
                report.generation,
                report.registrants.len()
            ),
        })
    }
}

impl Fencer for NvmeFencer {
    fn name(&self) -> &'static str {
        "nvme"
    }
    fn fence<'a>(&'a self, victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        let this = self.clone();
        let key = (self.key_of)(victim.node.as_str());
        Box::pin(async move {
            fail::fail_point!("fence::sever", |_| Err(FenceError::new(
                FenceStep::Sever,
                "fail point fence::sever"
            )));
            tokio::task::spawn_blocking(move || this.blocking(key))
                .await
                .map_err(|e| {
                    FenceError::new(FenceStep::Sever, format!("fencer task failed: {e}"))
                })?
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nvme_resv::{HostId, Register, RegisteredController, Release};

    use super::*;
    use crate::node::NodeId;

    /// A fake device for the fencer's logic (the spec-accurate model lives in
    /// `nvme_resv::model`): registrants by key; `sticky` keys survive preemption (a
    /// device that lies).
    #[derive(Debug, Default)]
    struct Fake {
        keys: Mutex<Vec<u64>>,
        sticky: Vec<u64>,
        acquires: Mutex<Vec<Acquire>>,
    }

    impl Reservations for Fake {
        fn register(&self, _: &Register) -> nvme_resv::Result<()> {
            Ok(())
        }
        fn acquire(&self, cmd: &Acquire) -> nvme_resv::Result<()> {
            self.acquires.lock().unwrap().push(*cmd);
            let sticky = self.sticky.contains(&cmd.prkey.0);
            self.keys
                .lock()
                .unwrap()
                .retain(|k| *k != cmd.prkey.0 || sticky);
            Ok(())
        }
        fn release(&self, _: &Release) -> nvme_resv::Result<()> {
            Ok(())
        }
        fn report(&self) -> nvme_resv::Result<ReservationStatus> {
            let keys = self.keys.lock().unwrap();
            Ok(ReservationStatus {
                generation: 1,
                rtype: RESERVATION_TYPE,
                regctl: u16::try_from(keys.len()).unwrap(),
                ptpls: false,
                registrants: keys
                    .iter()
                    .map(|k| RegisteredController {
                        cntlid: 0xffff,
                        rcsts: 0,
                        hostid: HostId::default(),
                        rkey: Key(*k),
                    })
                    .collect(),
                extended: true,
            })
        }
    }

    fn key_of(node: &str) -> Key {
        Key(node.bytes().map(u64::from).sum())
    }

    fn victim(node: &str) -> Victim {
        Victim {
            node: NodeId::new(node).unwrap(),
            instance: String::new(),
        }
    }

    #[tokio::test]
    async fn preempts_and_verifies() {
        let fake = Arc::new(Fake::default());
        fake.keys
            .lock()
            .unwrap()
            .extend([key_of("a").0, key_of("b").0]);
        let f =
            NvmeFencer::new(fake.clone(), key_of("a"), PreemptMode::default()).with_key_fn(key_of);
        let c = f.fence(&victim("b")).await.unwrap();
        assert!(c.severed);
        let acq = fake.acquires.lock().unwrap()[0];
        assert_eq!(acq.racqa, AcquireAction::PreemptAndAbort);
        assert_eq!((acq.crkey, acq.prkey), (key_of("a"), key_of("b")));
        assert_eq!(acq.rtype, RESERVATION_TYPE);
        // A retry of a fence that completed is confirmed again (idempotent).
        assert!(f.fence(&victim("b")).await.unwrap().severed);
    }

    #[tokio::test]
    async fn surviving_registration_is_a_failed_fence() {
        let fake = Arc::new(Fake {
            sticky: vec![key_of("b").0],
            ..Fake::default()
        });
        fake.keys
            .lock()
            .unwrap()
            .extend([key_of("a").0, key_of("b").0]);
        let f = NvmeFencer::new(fake, key_of("a"), PreemptMode::Preempt).with_key_fn(key_of);
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Verify);
        assert!(e.message.contains("still registered"), "{e}");
    }

    #[tokio::test]
    async fn unregistered_controller_cannot_fence() {
        let fake = Arc::new(Fake::default());
        fake.keys.lock().unwrap().push(key_of("b").0);
        let f = NvmeFencer::new(fake, key_of("a"), PreemptMode::Preempt).with_key_fn(key_of);
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert!(e.message.contains("our own key"), "{e}");
    }

    #[tokio::test]
    async fn none_fencer_is_single_signal() {
        let c = NoneFencer.fence(&victim("b")).await.unwrap();
        assert!(!c.severed);
    }
}
