//! The NVMe fencer: check that our device is the cluster's namespace, make sure a
//! reservation is held (acquiring it when none is: a preempt without one only
//! unregisters the key, and every host may still write), preempt the victim's
//! registration key, then require the reservation report to be evidence
//! ([`nvme_resv::report::fence_evidence`]: the victim's key gone, ours present, a
//! reservation held that denies the victim; NVMe Base Specification 2.0, §8.19).

use std::fmt;

use nvme_resv::report::{NotCutOff, fence_evidence};
use nvme_resv::{Acquire, AcquireAction, Key, NvmeStatus, ReservationType, Reservations};

use super::{BoxFuture, FenceCause, FenceError, Fencer};
use crate::core::{Confirmation, FenceStep, Victim};
use crate::device::{Device, NamespaceCheck, RESERVATION_TYPE};
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

/// The NVMe fencer: preempt (and abort) the victim's key with our own registered key,
/// then re-read the report and require the victim's key gone.
#[derive(Clone)]
pub struct NvmeFencer {
    device: Device,
    own_key: Key,
    mode: PreemptMode,
    key_of: fn(&str) -> Key,
    namespace: Option<NamespaceCheck>,
}

/// What `sever` sent and what the device answered, for `verify`.
#[derive(Debug)]
struct Preempted {
    /// No reservation was held: `sever` acquired it before the preempt.
    acquired: bool,
    /// The action whose answer is `answer`.
    racqa: AcquireAction,
    /// Preempt and Abort answered Invalid Field (no abort support): its answer; the
    /// fencer then sent a plain Preempt.
    fell_back: Option<nvme_resv::Error>,
    answer: nvme_resv::Result<()>,
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
            namespace: None,
        }
    }

    /// Before every preempt, identify the device and require it to be `check`'s
    /// namespace; otherwise the fence fails at `sever` with
    /// [`FenceCause::WrongNamespace`] and nothing is sent.
    pub fn with_namespace(mut self, check: NamespaceCheck) -> Self {
        self.namespace = Some(check);
        self
    }

    /// Replaces the node-id-to-key function (tests).
    pub fn with_key_fn(mut self, key_of: fn(&str) -> Key) -> Self {
        self.key_of = key_of;
        self
    }

    /// `sever`: preempt (and abort) the victim's key. The device's answer is kept for
    /// `verify`, which decides from the report, not from this answer. A Preempt and
    /// Abort answered Invalid Field (a controller without abort support; the action is
    /// optional to implement in that sense) is sent again as a plain Preempt, and the
    /// fallback is recorded in the evidence.
    fn preempt(&self, victim_key: Key) -> Result<Preempted, FenceError> {
        if victim_key == self.own_key {
            return Err(FenceError::at(
                FenceStep::Sever,
                FenceCause::VictimIsSelf { key: victim_key },
            ));
        }
        let acquired = self.hold_reservation()?;
        let send = |racqa| {
            self.device.acquire(&Acquire {
                racqa,
                rtype: RESERVATION_TYPE,
                crkey: self.own_key,
                prkey: victim_key,
                iekey: false,
            })
        };
        let racqa = self.racqa();
        let answer = send(racqa);
        match answer {
            Err(e)
                if racqa == AcquireAction::PreemptAndAbort
                    && e.status()
                        .is_some_and(|s| s.same_code(NvmeStatus::INVALID_FIELD)) =>
            {
                tracing::warn!(step = "sever", key = format_args!("{:#x}", victim_key.0), answer = %e, "Preempt and Abort answered Invalid Field (no abort support?): falling back to Preempt; the victim's commands already in flight are not aborted");
                Ok(Preempted {
                    acquired,
                    racqa: AcquireAction::Preempt,
                    fell_back: Some(e),
                    answer: send(AcquireAction::Preempt),
                })
            }
            answer => Ok(Preempted {
                acquired,
                racqa,
                fell_back: None,
                answer,
            }),
        }
    }

    /// Before the preempt: a preempt with no reservation held only unregisters the
    /// key (every host may still write), so when the report shows none, acquire it
    /// with our key (we must be a registrant). Whether we acquired it. Fails, and
    /// nothing is preempted, when our key is not registered or no reservation can be
    /// had.
    fn hold_reservation(&self) -> Result<bool, FenceError> {
        let report = |step| {
            self.device
                .report()
                .map_err(|source| FenceError::at(step, FenceCause::Report { source }))
        };
        let before = report(FenceStep::Sever)?;
        if !before.is_registered(self.own_key) {
            return Err(FenceError::at(
                FenceStep::Sever,
                FenceCause::ControllerNotRegistered { key: self.own_key },
            ));
        }
        if before.rtype != ReservationType::NONE {
            return Ok(false);
        }
        match self
            .device
            .acquire(&Acquire::acquire(self.own_key, RESERVATION_TYPE))
        {
            Ok(()) => {
                tracing::warn!(
                    step = "sever",
                    key = format_args!("{:#x}", self.own_key.0),
                    "no reservation was held on the shared namespace (every host could write): acquired {RESERVATION_TYPE} before the preempt"
                );
                Ok(true)
            }
            // A peer may have acquired it between our report and our acquire.
            Err(source) => match report(FenceStep::Sever)? {
                again if again.rtype != ReservationType::NONE => Ok(false),
                _ => Err(FenceError::at(
                    FenceStep::Sever,
                    FenceCause::AcquireReservation {
                        key: self.own_key,
                        rtype: RESERVATION_TYPE,
                        source,
                    },
                )),
            },
        }
    }

    fn racqa(&self) -> AcquireAction {
        match self.mode {
            PreemptMode::PreemptAndAbort => AcquireAction::PreemptAndAbort,
            PreemptMode::Preempt => AcquireAction::Preempt,
        }
    }

    /// `verify`: re-read the report whatever the preempt said, and confirm only on
    /// evidence ([`nvme_resv::report::fence_evidence`]: the victim's key absent, ours
    /// present, a reservation held that denies the victim). A preempt that reports
    /// success while the registration survives is a failed fence, and a preempt of a
    /// key that is already absent (a retry) is a conflict but a confirmed fence when
    /// the reservation holds.
    fn verify(&self, victim_key: Key, preempt: Preempted) -> Result<Confirmation, FenceError> {
        let Preempted {
            acquired,
            racqa,
            fell_back,
            answer,
        } = preempt;
        let report = self
            .device
            .report()
            .map_err(|source| FenceError::at(FenceStep::Verify, FenceCause::Report { source }))?;
        let cut = match fence_evidence(&report, victim_key, self.own_key) {
            Ok(cut) => cut,
            Err(NotCutOff::VictimRegistered(_)) => {
                return Err(match answer {
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
            // We sever others only as a registrant: if our own key is gone we were
            // fenced ourselves, and our word is worth nothing.
            Err(NotCutOff::OwnKeyAbsent(_)) => {
                return Err(FenceError::at(
                    FenceStep::Verify,
                    FenceCause::ControllerNotRegistered { key: self.own_key },
                ));
            }
            // The key is gone but nothing denies the victim (the reservation was
            // released or lost after our check): not a fence.
            Err(why) => {
                return Err(FenceError::at(
                    FenceStep::Verify,
                    FenceCause::NotCutOff {
                        key: victim_key,
                        why,
                    },
                ));
            }
        };
        let mut how = match answer {
            Ok(()) => format!("{racqa:?}"),
            Err(e) => format!("already absent ({racqa:?} answered: {e})"),
        };
        if let Some(e) = fell_back {
            how = format!(
                "{how} (fallback: PreemptAndAbort answered {e}; commands in flight not aborted)"
            );
        }
        Ok(Confirmation {
            fencer: "nvme".to_owned(),
            severed: true,
            evidence: format!(
                "key {:#x} {how}; absent from report (generation {}, {} registrant(s)); reservation {} held{}{}",
                victim_key.0,
                report.generation,
                report.registrants.len(),
                cut.rtype,
                cut.holder.map(|k| format!(" by {k}")).unwrap_or_default(),
                if acquired {
                    " (none was held: acquired before the preempt)"
                } else {
                    ""
                }
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
            if let Some(check) = &self.namespace {
                let device = self.device.clone();
                let found = tokio::task::spawn_blocking(move || device.identity())
                    .await
                    .map_err(|e| lost(FenceStep::Sever, e))?
                    .map_err(|source| {
                        FenceError::at(FenceStep::Sever, FenceCause::Identify { source })
                    })?;
                check
                    .check(found)
                    .await
                    .map_err(|why| FenceError::at(FenceStep::Sever, why.into()))?;
            }
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

    use std::sync::Arc;

    use nvme_resv::{HostId, Register, RegisteredController, Release, ReservationStatus};

    use super::*;
    #[cfg(feature = "failpoints")]
    use crate::fault::{FaultEffect, fault_hits, fault_scope};
    use crate::fencer::tests::victim;

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
        /// What `identity` answers (`None`: the trait's default, Unsupported).
        identity: Option<nvme_resv::NamespaceIdentity>,
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
        fn identity(&self) -> nvme_resv::Result<nvme_resv::NamespaceIdentity> {
            self.identity.clone().ok_or(nvme_resv::Error::Unsupported {
                op: nvme_resv::Operation::IdentifyNamespace,
            })
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

    impl Fake {
        /// Registers the keys of `nodes`.
        fn add_keys(&self, nodes: &[&str]) {
            self.keys
                .lock()
                .unwrap()
                .extend(nodes.iter().map(|n| key_of(n).0));
        }
    }

    /// The fencer of node `a` (its key from [`key_of`]) on `device`.
    fn as_a(device: Device, mode: PreemptMode) -> NvmeFencer {
        NvmeFencer::new(device, key_of("a"), mode).with_key_fn(key_of)
    }

    #[tokio::test]
    async fn preempts_and_verifies() {
        let fake = Arc::new(Fake::default());
        fake.add_keys(&["a", "b"]);
        let f = as_a(fake.clone(), PreemptMode::default());
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
        fake.add_keys(&["a", "b"]);
        let f = as_a(fake, PreemptMode::Preempt);
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
        fake.add_keys(&["a", "b"]);
        let f = as_a(fake, PreemptMode::default());
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
        fake.add_keys(&["a"]);
        let f = as_a(fake.clone(), PreemptMode::Preempt);
        let e = f.fence(&victim("a")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Sever);
        assert!(matches!(e.cause, FenceCause::VictimIsSelf { .. }), "{e:?}");
        assert!(fake.acquires.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn unregistered_controller_cannot_fence() {
        let fake = Arc::new(Fake::default());
        fake.add_keys(&["b"]);
        let f = as_a(fake, PreemptMode::Preempt);
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert!(
            matches!(e.cause, FenceCause::ControllerNotRegistered { key } if key == key_of("a")),
            "{e:?}"
        );
        assert!(e.to_string().contains("our own key"), "{e}");
    }

    /// The spec-accurate model answers the first acquire with Invalid Field, as a
    /// controller without abort support answers Preempt and Abort.
    fn model_without_abort() -> (nvme_resv::model::Namespace, Device, nvme_resv::model::Host) {
        let ns = nvme_resv::model::Namespace::new();
        let (a, b) = (ns.host(HostId([0xa; 16])), ns.host(HostId([0xb; 16])));
        a.register(&Register::register(key_of("a"))).unwrap();
        a.acquire(&Acquire::acquire(key_of("a"), RESERVATION_TYPE))
            .unwrap();
        b.register(&Register::register(key_of("b"))).unwrap();
        ns.fail_next(
            nvme_resv::Operation::Acquire,
            NvmeStatus::INVALID_FIELD.with_dnr(),
        );
        (ns, Arc::new(a), b)
    }

    #[tokio::test]
    async fn preempt_and_abort_refused_with_invalid_field_falls_back_to_preempt() {
        let (ns, a, b) = model_without_abort();
        let f = as_a(a, PreemptMode::PreemptAndAbort);
        let c = f.fence(&victim("b")).await.unwrap();
        assert!(c.severed);
        assert!(!ns.snapshot().is_registered(key_of("b")));
        assert!(
            b.check(nvme_resv::Access::Write)
                .unwrap_err()
                .is_reservation_conflict()
        );
        // The evidence (the audit's fencer_result) says what was sent and why.
        assert!(
            c.evidence.starts_with(&format!(
                "key {:#x} Preempt (fallback: PreemptAndAbort answered Reservation Acquire on namespace 1: Invalid Field in Command",
                key_of("b").0
            )) && c.evidence.contains("commands in flight not aborted"),
            "{}",
            c.evidence
        );
    }

    #[tokio::test]
    async fn invalid_field_to_a_plain_preempt_is_not_retried() {
        let (ns, a, _b) = model_without_abort();
        let f = as_a(a, PreemptMode::Preempt);
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert!(
            matches!(&e.cause, FenceCause::Preempt { racqa: AcquireAction::Preempt, source, .. } if source.status().is_some_and(|s| s.same_code(NvmeStatus::INVALID_FIELD))),
            "{e:?}"
        );
        assert!(ns.snapshot().is_registered(key_of("b")));
    }

    /// Hosts a and b registered on the model, b acquired the reservation and then
    /// released it (issue 26: `nvme resv-release`): no reservation, both registered.
    fn model_released() -> (
        nvme_resv::model::Namespace,
        nvme_resv::model::Host,
        nvme_resv::model::Host,
    ) {
        let ns = nvme_resv::model::Namespace::new();
        let (a, b) = (ns.host(HostId([0xa; 16])), ns.host(HostId([0xb; 16])));
        a.register(&Register::register(key_of("a"))).unwrap();
        b.register(&Register::register(key_of("b"))).unwrap();
        b.acquire(&Acquire::acquire(key_of("b"), RESERVATION_TYPE))
            .unwrap();
        b.release(&Release::release(key_of("b"), RESERVATION_TYPE))
            .unwrap();
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
        (ns, a, b)
    }

    #[tokio::test]
    async fn with_no_reservation_held_the_fence_acquires_it_before_the_preempt() {
        let (ns, a, b) = model_released();
        let f = as_a(Arc::new(a), PreemptMode::default());
        let c = f.fence(&victim("b")).await.unwrap();
        // Confirmed only because the victim really cannot write any more.
        assert!(
            b.check(nvme_resv::Access::Write)
                .unwrap_err()
                .is_reservation_conflict(),
            "confirmed while the victim writes: {}",
            c.evidence
        );
        assert_eq!(ns.snapshot().rtype, RESERVATION_TYPE);
        assert!(
            c.evidence.contains("acquired before the preempt")
                && c.evidence.contains("Write Exclusive - All Registrants"),
            "{}",
            c.evidence
        );
        // A retry (key already absent, reservation held) is confirmed again.
        assert!(f.fence(&victim("b")).await.unwrap().severed);
    }

    #[tokio::test]
    async fn no_reservation_and_none_to_be_had_fails_the_fence_with_the_reason() {
        let (ns, a, b) = model_released();
        ns.fail_next(
            nvme_resv::Operation::Acquire,
            NvmeStatus::RESERVATION_CONFLICT.with_dnr(),
        );
        let f = as_a(Arc::new(a), PreemptMode::default());
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Sever);
        assert!(
            matches!(&e.cause, FenceCause::AcquireReservation { key, .. } if *key == key_of("a")),
            "{e:?}"
        );
        assert!(e.to_string().contains("no reservation is held"), "{e}");
        // Nothing was preempted: the victim is still registered (and still writes,
        // which is why the fence is owed, not confirmed).
        assert!(ns.snapshot().is_registered(key_of("b")));
        assert!(b.check(nvme_resv::Access::Write).is_ok());
    }

    /// Forwards to a model host; after the first preempt, another host (`releaser`,
    /// the holder record) releases the reservation: lost between sever and verify.
    #[derive(Debug)]
    struct ReleasedAfterPreempt {
        host: nvme_resv::model::Host,
        releaser: nvme_resv::model::Host,
        key: Key,
    }

    impl Reservations for ReleasedAfterPreempt {
        fn register(&self, cmd: &Register) -> nvme_resv::Result<()> {
            self.host.register(cmd)
        }
        fn acquire(&self, cmd: &Acquire) -> nvme_resv::Result<()> {
            let r = self.host.acquire(cmd);
            if cmd.racqa != AcquireAction::Acquire {
                self.releaser
                    .release(&Release::release(self.key, RESERVATION_TYPE))
                    .unwrap();
            }
            r
        }
        fn release(&self, cmd: &Release) -> nvme_resv::Result<()> {
            self.host.release(cmd)
        }
        fn report(&self) -> nvme_resv::Result<ReservationStatus> {
            self.host.report()
        }
    }

    #[tokio::test]
    async fn a_reservation_lost_before_the_report_is_not_evidence() {
        let ns = nvme_resv::model::Namespace::new();
        let (a, b, c) = (
            ns.host(HostId([0xa; 16])),
            ns.host(HostId([0xb; 16])),
            ns.host(HostId([0xc; 16])),
        );
        for (h, n) in [(&c, "c"), (&a, "a"), (&b, "b")] {
            h.register(&Register::register(key_of(n))).unwrap();
        }
        c.acquire(&Acquire::acquire(key_of("c"), RESERVATION_TYPE))
            .unwrap();
        let dev = ReleasedAfterPreempt {
            host: a,
            releaser: c,
            key: key_of("c"),
        };
        let f = as_a(Arc::new(dev), PreemptMode::default());
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Verify);
        assert!(
            matches!(&e.cause, FenceCause::NotCutOff { key, why: NotCutOff::NoReservation(_) } if *key == key_of("b")),
            "{e:?}"
        );
        assert!(e.to_string().contains("stays owed"), "{e}");
        assert!(b.check(nvme_resv::Access::Write).is_ok());
    }

    fn identity(b: u8) -> nvme_resv::NamespaceIdentity {
        nvme_resv::NamespaceIdentity {
            nguid: [b; 16],
            eui64: [0; 8],
            subnqn: "nqn.test:s".into(),
            ..nvme_resv::NamespaceIdentity::default()
        }
    }

    #[tokio::test]
    async fn a_device_that_is_not_the_recorded_namespace_is_never_preempted() {
        let fake = Arc::new(Fake {
            identity: Some(identity(2)),
            ..Fake::default()
        });
        fake.add_keys(&["a"]);
        let f = as_a(fake.clone(), PreemptMode::default())
            .with_namespace(crate::fencer::NamespaceCheck::fixed(identity(1)));
        // Without the check the victim's absent key would be "confirmed".
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert_eq!(e.step, FenceStep::Sever);
        assert!(
            matches!(&e.cause, FenceCause::WrongNamespace { expected, found } if **expected == identity(1) && **found == identity(2)),
            "{e:?}"
        );
        assert!(
            fake.acquires.lock().unwrap().is_empty(),
            "a preempt was sent"
        );
        // The right namespace: fenced as usual.
        let fake = Arc::new(Fake {
            identity: Some(identity(1)),
            ..Fake::default()
        });
        fake.add_keys(&["a", "b"]);
        let f = as_a(fake, PreemptMode::default())
            .with_namespace(crate::fencer::NamespaceCheck::fixed(identity(1)));
        assert!(f.fence(&victim("b")).await.unwrap().severed);
    }

    #[tokio::test]
    async fn a_device_that_cannot_be_identified_is_not_preempted() {
        let fake = Arc::new(Fake::default());
        fake.add_keys(&["a"]);
        let f = as_a(fake.clone(), PreemptMode::default())
            .with_namespace(crate::fencer::NamespaceCheck::fixed(identity(1)));
        let e = f.fence(&victim("b")).await.unwrap_err();
        assert!(matches!(e.cause, FenceCause::Identify { .. }), "{e:?}");
        assert!(fake.acquires.lock().unwrap().is_empty());
    }

    #[cfg(feature = "failpoints")]
    #[tokio::test]
    async fn a_crash_point_stops_the_fence_for_good() {
        let scenario = fail::FailScenario::setup();
        fail::cfg("fence::verify", "return(unit-c9=crash)").unwrap();
        let fake = Arc::new(Fake::default());
        fake.add_keys(&["a", "b"]);
        let f = as_a(fake.clone(), PreemptMode::Preempt);
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
