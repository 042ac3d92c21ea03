//! The NVMe fencer: preempt the victim's registration key, then require the
//! reservation report to show it gone (NVMe Base Specification 2.0, §8.19).

use std::fmt;
use std::sync::Arc;

use nvme_resv::{Acquire, AcquireAction, Key, ReservationStatus, ReservationType, Reservations};

use super::{BoxFuture, FenceCause, FenceError, Fencer};
use crate::core::{Confirmation, FenceStep, Victim};
use crate::fault::fault;

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

/// Whether `key` is among the report's registrants: [`ReservationStatus::is_registered`]
/// (kept for the agent's call sites).
pub fn key_registered(status: &ReservationStatus, key: Key) -> bool {
    status.is_registered(key)
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

    /// `sever`: preempt (and abort) the victim's key. The device's answer is kept for
    /// `verify`, which decides from the report, not from this answer.
    fn preempt(&self, victim_key: Key) -> Result<nvme_resv::Result<()>, FenceError> {
        if victim_key == self.own_key {
            return Err(FenceError::at(
                FenceStep::Sever,
                FenceCause::VictimIsSelf { key: victim_key },
            ));
        }
        let cmd = Acquire {
            racqa: self.racqa(),
            rtype: RESERVATION_TYPE,
            crkey: self.own_key,
            prkey: victim_key,
            iekey: false,
        };
        Ok(self.device.acquire(&cmd))
    }

    fn racqa(&self) -> AcquireAction {
        match self.mode {
            PreemptMode::PreemptAndAbort => AcquireAction::PreemptAndAbort,
            PreemptMode::Preempt => AcquireAction::Preempt,
        }
    }

    /// `verify`: re-read the report whatever the preempt said. A preempt that reports
    /// success while the registration survives is a failed fence, and a preempt of a
    /// key that is already absent (a retry) is a conflict but a confirmed fence.
    fn verify(
        &self,
        victim_key: Key,
        preempt: nvme_resv::Result<()>,
    ) -> Result<Confirmation, FenceError> {
        let racqa = self.racqa();
        let report = self
            .device
            .report()
            .map_err(|source| FenceError::at(FenceStep::Verify, FenceCause::Report { source }))?;
        if report.is_registered(victim_key) {
            return Err(match preempt {
                Err(source) => FenceError::at(
                    FenceStep::Sever,
                    FenceCause::Preempt {
                        racqa,
                        key: victim_key,
                        source,
                    },
                ),
                Ok(()) => FenceError::at(
                    FenceStep::Verify,
                    FenceCause::KeyStillRegistered {
                        racqa,
                        key: victim_key,
                        generation: report.generation,
                    },
                ),
            });
        }
        if !report.is_registered(self.own_key) {
            // We sever others only as a registrant: if our own key is gone we were
            // fenced ourselves, and our word is worth nothing.
            return Err(FenceError::at(
                FenceStep::Verify,
                FenceCause::ControllerNotRegistered { key: self.own_key },
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
        let key = (self.key_of)(victim.node.as_str());
        Box::pin(async move {
            let lost = |step, source| FenceError::at(step, FenceCause::Task { source });
            // (`fence::sever` is the controller's: it decides whether to sever at all.)
            let this = self.clone();
            let preempt = tokio::task::spawn_blocking(move || this.preempt(key))
                .await
                .map_err(|e| lost(FenceStep::Sever, e))??;
            // Between the two device commands: a crash here leaves the key preempted
            // and the fence unconfirmed (the claim expires, another controller retries).
            let lose = fault(FenceStep::Verify).await?;
            let this = self.clone();
            let confirmed = tokio::task::spawn_blocking(move || this.verify(key, preempt))
                .await
                .map_err(|e| lost(FenceStep::Verify, e))?;
            if lose {
                return Err(FenceError::at(
                    FenceStep::Verify,
                    FenceCause::AnswerLost {
                        step: FenceStep::Verify,
                        done: "report read",
                    },
                ));
            }
            confirmed
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nvme_resv::{HostId, Register, RegisteredController, Release};

    use super::*;
    #[cfg(feature = "failpoints")]
    use crate::fault::{FaultEffect, fault_hits, fault_scope};
    use crate::node::NodeId;

    /// A fake device for the fencer's logic (the spec-accurate model lives in
    /// `nvme_resv::model`): registrants by key; `sticky` keys survive preemption (a
    /// device that lies).
    #[derive(Debug, Default)]
    struct Fake {
        keys: Mutex<Vec<u64>>,
        sticky: Vec<u64>,
        /// Every acquire is refused with a Reservation Conflict.
        refuse: bool,
        acquires: Mutex<Vec<Acquire>>,
    }

    impl Reservations for Fake {
        fn register(&self, _: &Register) -> nvme_resv::Result<()> {
            Ok(())
        }
        fn acquire(&self, cmd: &Acquire) -> nvme_resv::Result<()> {
            self.acquires.lock().unwrap().push(*cmd);
            if self.refuse {
                return Err(nvme_resv::Error::Device {
                    op: nvme_resv::Operation::Acquire,
                    nsid: 1,
                    status: nvme_resv::NvmeStatus::RESERVATION_CONFLICT,
                });
            }
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
        assert!(
            matches!(e.cause, FenceCause::KeyStillRegistered { key, .. } if key == key_of("b")),
            "{e:?}"
        );
        assert!(e.to_string().contains("still registered"), "{e}");
    }

    #[tokio::test]
    async fn refused_preempt_fails_sever_with_the_device_answer() {
        let fake = Arc::new(Fake {
            refuse: true,
            ..Fake::default()
        });
        fake.keys
            .lock()
            .unwrap()
            .extend([key_of("a").0, key_of("b").0]);
        let f = NvmeFencer::new(fake, key_of("a"), PreemptMode::default()).with_key_fn(key_of);
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Sever);
        let FenceCause::Preempt { racqa, source, .. } = &e.cause else {
            panic!("{e:?}")
        };
        assert_eq!(*racqa, AcquireAction::PreemptAndAbort);
        assert!(source.is_reservation_conflict(), "{source:?}");
        // The guest demo greps the log for the device's answer.
        assert!(e.to_string().contains("Reservation Conflict"), "{e}");
    }

    #[tokio::test]
    async fn own_key_is_never_preempted() {
        let fake = Arc::new(Fake::default());
        fake.keys.lock().unwrap().push(key_of("a").0);
        let f =
            NvmeFencer::new(fake.clone(), key_of("a"), PreemptMode::Preempt).with_key_fn(key_of);
        let e = f.fence(&victim("a")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Sever);
        assert!(matches!(e.cause, FenceCause::VictimIsSelf { .. }), "{e:?}");
        assert!(fake.acquires.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn unregistered_controller_cannot_fence() {
        let fake = Arc::new(Fake::default());
        fake.keys.lock().unwrap().push(key_of("b").0);
        let f = NvmeFencer::new(fake, key_of("a"), PreemptMode::Preempt).with_key_fn(key_of);
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert!(
            matches!(e.cause, FenceCause::ControllerNotRegistered { key } if key == key_of("a")),
            "{e:?}"
        );
        assert!(e.to_string().contains("our own key"), "{e}");
    }

    #[cfg(feature = "failpoints")]
    #[tokio::test]
    async fn a_crash_point_stops_the_fence_for_good() {
        let scenario = fail::FailScenario::setup();
        fail::cfg("fence::verify", "return(unit-c9=crash)").unwrap();
        let fake = Arc::new(Fake::default());
        fake.keys
            .lock()
            .unwrap()
            .extend([key_of("a").0, key_of("b").0]);
        let f =
            NvmeFencer::new(fake.clone(), key_of("a"), PreemptMode::Preempt).with_key_fn(key_of);
        let v = victim("b");
        let stopped = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            fault_scope("unit-c9", &v, f.fence(&v)),
        )
        .await;
        assert!(stopped.is_err(), "the fence went past a crash point");
        // It stopped between the preempt and the report.
        assert_eq!(*fake.keys.lock().unwrap(), vec![key_of("a").0]);
        let hits = fault_hits("unit-c9");
        assert_eq!(hits.len(), 1);
        assert_eq!(
            (hits[0].step, hits[0].effect),
            (FenceStep::Verify, FaultEffect::Crash)
        );
        assert_eq!(hits[0].node, "b");
        // Other controllers are not targeted.
        assert!(
            fault_scope("unit-c1", &v, f.fence(&v))
                .await
                .unwrap()
                .severed
        );
        scenario.teardown();
    }
}
