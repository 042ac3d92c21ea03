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

#[cfg(feature = "ebs")]
pub mod ebs;

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

/// What a `fence::<step>` fail point did to the fence that reached it.
///
/// Fail points (feature `failpoints`; without it they compile to nothing) sit before
/// each etcd transaction and device command of a fence and are named after the first
/// protocol step that command performs: `fence::claim` (the claim transaction:
/// `record_intent`, `claim`, `recheck_intent`, `read_generation`), `fence::sever` (the
/// preempt), `fence::verify` (the report re-read), `fence::bump` (the finishing
/// transaction: `bump` … `release_claim`) and `fence::release_claim` (a failed fence
/// giving its claim back). Steps inside one transaction are atomic, so they cannot
/// fail apart.
///
/// A point is configured with the `fail` crate. `return` without an argument fails the
/// step in every controller. `return(TARGET=EFFECT,...)` chooses per controller:
/// TARGET is a controller id, or an id prefix ending in `*`; EFFECT is `error` (the
/// step is not performed and fails), `lost` (the step is performed but its answer is
/// lost: the caller sees a timeout-like error), `sleep:MS` (the fence waits MS
/// milliseconds, without blocking a thread) or `crash` (the fence stops at the point
/// for good, so a test can abort the controller while it is stopped mid-step: a crash
/// at exactly that step). `fail`'s own `sleep(MS)`
/// and `pause` work too, but block the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEffect {
    /// The step failed (the fence stays owed).
    Error,
    /// The step was performed but its answer was lost.
    Lost,
    /// The step was delayed.
    Sleep(std::time::Duration),
    /// The fence stopped at the step, for good.
    Crash,
}

/// One fail point that acted on a fence (feature `failpoints`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultHit {
    /// The controller whose fence reached the point (empty: not run by a controller).
    pub controller: String,
    /// The fence's victim (empty: not run by a controller).
    pub node: String,
    /// The point's step.
    pub step: FenceStep,
    /// What it did.
    pub effect: FaultEffect,
    /// When.
    pub at: std::time::Instant,
}

#[cfg(feature = "failpoints")]
tokio::task_local! {
    /// (controller id, victim) of the fence running in this task.
    static FAULT_SCOPE: (String, String);
}

#[cfg(feature = "failpoints")]
static FAULT_HITS: std::sync::Mutex<Vec<FaultHit>> = std::sync::Mutex::new(Vec::new());

/// The fail point hits so far of the controllers whose id starts with `prefix`
/// (feature `failpoints`).
#[cfg(feature = "failpoints")]
pub fn fault_hits(prefix: &str) -> Vec<FaultHit> {
    FAULT_HITS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|h| h.controller.starts_with(prefix))
        .cloned()
        .collect()
}

/// Runs `f`, controller `controller`'s fence of `victim`, so that fail points can
/// target it.
pub(crate) async fn fault_scope<F: Future>(controller: &str, victim: &Victim, f: F) -> F::Output {
    #[cfg(feature = "failpoints")]
    {
        FAULT_SCOPE
            .scope((controller.to_owned(), victim.node.to_string()), f)
            .await
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = (controller, victim);
        f.await
    }
}

/// The configured argument of `step`'s fail point: `None` when it does not act,
/// `Some(None)` for a bare `return`.
#[cfg(feature = "failpoints")]
fn fault_config(step: FenceStep) -> Option<Option<String>> {
    let name = format!("fence::{}", step.name());
    fail::fail_point!(&name, Some);
    None
}

/// Which effect `arg` (`TARGET=EFFECT,...`) has on `controller`; the first matching
/// entry wins.
#[cfg(feature = "failpoints")]
fn fault_effect(arg: &str, controller: &str) -> Option<FaultEffect> {
    arg.split(',').find_map(|entry| {
        let (target, effect) = entry.trim().split_once('=')?;
        let hit = match target.strip_suffix('*') {
            Some(prefix) => controller.starts_with(prefix),
            None => controller == target,
        };
        if !hit {
            return None;
        }
        Some(match effect.split_once(':') {
            None if effect == "crash" => FaultEffect::Crash,
            None if effect == "lost" => FaultEffect::Lost,
            Some(("sleep", ms)) => FaultEffect::Sleep(std::time::Duration::from_millis(
                ms.parse().unwrap_or_else(|_| {
                    tracing::warn!(entry, "fail point: bad sleep, using 100 ms");
                    100
                }),
            )),
            _ => FaultEffect::Error,
        })
    })
}

/// `step`'s fail point (see [`FaultEffect`]). `Err`: the step fails with this message
/// without being performed; `Ok(true)`: perform the step, then lose its answer.
pub(crate) async fn fault(step: FenceStep) -> Result<bool, String> {
    #[cfg(feature = "failpoints")]
    {
        let Some(arg) = fault_config(step) else {
            return Ok(false);
        };
        let (controller, node) = FAULT_SCOPE.try_with(Clone::clone).unwrap_or_default();
        let effect = match arg.as_deref() {
            None | Some("") => FaultEffect::Error,
            Some(arg) => match fault_effect(arg, &controller) {
                Some(e) => e,
                None => return Ok(false),
            },
        };
        tracing::warn!(step = %step, controller = %controller, node = %node, ?effect, "fail point");
        FAULT_HITS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(FaultHit {
                controller,
                node,
                step,
                effect,
                at: std::time::Instant::now(),
            });
        match effect {
            FaultEffect::Error => return Err(format!("fail point fence::{}", step.name())),
            FaultEffect::Lost => return Ok(true),
            FaultEffect::Sleep(d) => tokio::time::sleep(d).await,
            FaultEffect::Crash => std::future::pending::<()>().await,
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = step;
    Ok(false)
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

    /// `sever`: preempt (and abort) the victim's key. The device's answer is kept for
    /// `verify`, which decides from the report, not from this answer.
    fn preempt(&self, victim_key: Key) -> Result<nvme_resv::Result<()>, FenceError> {
        if victim_key == self.own_key {
            return Err(FenceError::new(
                FenceStep::Sever,
                format!(
                    "victim key {:#x} equals our own key: refusing to preempt ourselves",
                    victim_key.0
                ),
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
        let key = (self.key_of)(victim.node.as_str());
        Box::pin(async move {
            let lost = |step, e: tokio::task::JoinError| {
                FenceError::new(step, format!("fencer task failed: {e}"))
            };
            // (`fence::sever` is the controller's: it decides whether to sever at all.)
            let this = self.clone();
            let preempt = tokio::task::spawn_blocking(move || this.preempt(key))
                .await
                .map_err(|e| lost(FenceStep::Sever, e))??;
            // Between the two device commands: a crash here leaves the key preempted
            // and the fence unconfirmed (the claim expires, another controller retries).
            let lose = fault(FenceStep::Verify)
                .await
                .map_err(|m| FenceError::new(FenceStep::Verify, m))?;
            let this = self.clone();
            let confirmed = tokio::task::spawn_blocking(move || this.verify(key, preempt))
                .await
                .map_err(|e| lost(FenceStep::Verify, e))?;
            if lose {
                return Err(FenceError::new(
                    FenceStep::Verify,
                    "fail point fence::verify: report read, answer lost",
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

    #[cfg(feature = "failpoints")]
    #[test]
    fn fault_arguments_pick_a_controller() {
        use std::time::Duration;
        let arg = "s1-c2=crash,s1-*=sleep:50";
        assert_eq!(fault_effect(arg, "s1-c2"), Some(FaultEffect::Crash));
        assert_eq!(
            fault_effect(arg, "s1-c1"),
            Some(FaultEffect::Sleep(Duration::from_millis(50)))
        );
        assert_eq!(fault_effect(arg, "s10-c1"), None);
        assert_eq!(fault_effect("c1=error", "c1"), Some(FaultEffect::Error));
        assert_eq!(fault_effect("c1=error", ""), None);
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

    #[tokio::test]
    async fn none_fencer_is_single_signal() {
        let c = NoneFencer.fence(&victim("b")).await.unwrap();
        assert!(!c.severed);
    }
}
