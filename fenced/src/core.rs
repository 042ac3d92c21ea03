//! The decision core: no I/O, no clock. Events in, actions out; time is an argument.
//!
//! The controller's fence of one node is a [`FenceRun`]: the driver (see
//! `controller.rs`) performs each [`FenceAction`] against etcd or a Fencer and feeds
//! the outcome back. Which nodes a sweep owes a fence is [`plan_sweep`]; whether a
//! departure marker is honoured is [`honour_departure`]; the agent's self-fencing
//! clock is [`Watchdog`]; the agent's device checks are [`check_device`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::node::NodeId;

/// One named step of the fence protocol. Several steps share one etcd transaction,
/// but each keeps its name in logs, in the audit record and as a fail point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceStep {
    /// Write `fence_pending/<node>` (durable intent).
    RecordIntent,
    /// Create-only, lease-bound `fence_claim/<node>`.
    Claim,
    /// Sweep path only: the snapshot the sweep decided from is still current.
    RecheckIntent,
    /// Read `gen/<node>` (start of the CAS).
    ReadGeneration,
    /// The Fencer severs the victim's device access.
    Sever,
    /// The Fencer confirms the severance (re-read report: victim key gone).
    Verify,
    /// CAS `gen/<node>` to generation + 1.
    Bump,
    /// Write `fence_done/<node>`.
    MarkDone,
    /// Delete `fence_pending/<node>`.
    ClearIntent,
    /// Return the victim's arenas to the free pool (only when a Fencer confirmed).
    ReleaseArenas,
    /// Delete `fence_claim/<node>`.
    ReleaseClaim,
}

impl FenceStep {
    /// The step's name (shared with the stateright model).
    pub fn name(self) -> &'static str {
        match self {
            Self::RecordIntent => "record_intent",
            Self::Claim => "claim",
            Self::RecheckIntent => "recheck_intent",
            Self::ReadGeneration => "read_generation",
            Self::Sever => "sever",
            Self::Verify => "verify",
            Self::Bump => "bump",
            Self::MarkDone => "mark_done",
            Self::ClearIntent => "clear_intent",
            Self::ReleaseArenas => "release_arenas",
            Self::ReleaseClaim => "release_claim",
        }
    }

    /// The steps the claim transaction performs for `trigger`.
    pub fn claim_txn(trigger: Trigger) -> &'static [FenceStep] {
        match trigger {
            Trigger::Watch | Trigger::Operator => {
                &[Self::RecordIntent, Self::Claim, Self::ReadGeneration]
            }
            Trigger::Sweep => &[
                Self::RecordIntent,
                Self::Claim,
                Self::RecheckIntent,
                Self::ReadGeneration,
            ],
        }
    }

    /// The steps the finishing transaction performs.
    pub fn finish_txn(release_arenas: bool) -> &'static [FenceStep] {
        if release_arenas {
            &[
                Self::Bump,
                Self::MarkDone,
                Self::ClearIntent,
                Self::ReleaseArenas,
                Self::ReleaseClaim,
            ]
        } else {
            &[
                Self::Bump,
                Self::MarkDone,
                Self::ClearIntent,
                Self::ReleaseClaim,
            ]
        }
    }
}

impl fmt::Display for FenceStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What started a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A DELETE of `membership/<node>` seen on the watch.
    Watch,
    /// The reconciliation sweep found the fence owed.
    Sweep,
    /// An operator attested out of band that the node is gone (`fenced attest`).
    Operator,
}

/// The node being fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// Its node id.
    pub node: NodeId,
    /// Its instance id (empty when never known, e.g. a sweep of a node known only by `gen/`).
    pub instance: String,
}

/// What a Fencer established.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Confirmation {
    /// The fencer's name (`nvme`, `ebs`, `none`).
    pub fencer: String,
    /// True when device access was severed and the severance verified; false for
    /// single-signal mode (no second confirmation: arenas are never released).
    pub severed: bool,
    /// Human-readable evidence (e.g. "key 0x… absent from report, generation 7").
    pub evidence: String,
}

/// The outcome of the claim transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This controller holds the claim; the intent is recorded.
    Won {
        /// The victim's generation.
        generation: u64,
        /// `mod_revision` of `gen/<node>` (0 when absent): the bump's CAS compares it.
        generation_rev: i64,
        /// `create_revision` of our claim: the bump is conditioned on still holding it.
        claim_rev: i64,
        /// Arenas the victim owns, released by the bump when the fence is confirmed.
        arenas: Vec<String>,
    },
    /// Another controller holds the claim.
    Held {
        /// Its value (the holder's controller id).
        by: String,
    },
    /// The guard failed: the victim is a member again, departed cleanly, or (sweep)
    /// the snapshot aged. Nothing was written.
    NotOwed {
        /// Why.
        why: String,
    },
}

/// The outcome of the finishing transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BumpOutcome {
    /// Bumped; done mark, intent, arenas and claim updated in the same transaction.
    Bumped,
    /// The generation moved since it was read (another replica bumped).
    GenerationMoved {
        /// The generation found.
        now: u64,
    },
    /// Our claim is gone (expired): nothing was written.
    ClaimLost,
}

/// Where one fence stands. Each variant says what is already true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceState {
    /// The victim's membership is gone (watch DELETE or sweep snapshot). Nothing has
    /// been written and the device is untouched.
    Owed,
    /// Intent recorded, this controller holds the claim, generation `generation` read.
    /// The device is untouched; the generation is not bumped.
    Claimed {
        /// Generation read.
        generation: u64,
    },
    /// The Fencer confirmed (the victim's key is preempted and verified absent, or
    /// single-signal mode). The generation is not bumped; intent and claim remain.
    Severed {
        /// Generation read before the fence.
        generation: u64,
        /// The Fencer's evidence.
        confirmation: Confirmation,
    },
    /// Generation bumped to `generation`; done mark written, intent cleared, arenas
    /// released iff the Fencer severed, claim released — all in one transaction.
    Fenced {
        /// The new generation.
        generation: u64,
    },
    /// Another controller holds the claim or nothing is owed. This run changed nothing.
    Skipped {
        /// Why.
        why: String,
    },
    /// Failed at `step`: the generation is not bumped and the intent stays, so the fence
    /// is still owed and the sweep retries it. The claim is released (or expires).
    Failed {
        /// The step that failed.
        step: FenceStep,
        /// The error, in words.
        error: String,
    },
    /// The generation CAS failed: another replica bumped it. This run did not bump.
    Superseded {
        /// The generation found.
        now: u64,
    },
}

impl FenceState {
    /// Whether the run is over.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Fenced { .. }
                | Self::Skipped { .. }
                | Self::Failed { .. }
                | Self::Superseded { .. }
        )
    }
}

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceAction {
    /// Run the claim transaction ([`FenceStep::claim_txn`]).
    Claim,
    /// Ask the Fencer to sever and verify.
    Sever,
    /// Run the finishing transaction ([`FenceStep::finish_txn`]) with this audit record.
    Finish {
        /// The generation to CAS from.
        from: u64,
        /// Return the victim's arenas to the free pool (only when severed).
        release_arenas: bool,
        /// The audit record written in the same transaction.
        audit: Box<AuditRecord>,
    },
    /// Delete our claim without bumping (the fence stays owed), then write `audit`.
    Abort {
        /// The audit record of the failed attempt.
        audit: Box<AuditRecord>,
    },
    /// Nothing more.
    Stop,
}

/// The audit record of one fence attempt (stored as JSON under `audit/`, and logged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// The fenced node.
    pub node: String,
    /// Its instance id.
    pub instance: String,
    /// The controller that fenced it.
    pub fenced_by: String,
    /// What started the fence.
    pub trigger: Trigger,
    /// The signals seen (membership expiry, departure marker ignored, device evidence).
    pub signals: Vec<String>,
    /// The fencer and its result.
    pub fencer: String,
    /// `confirmed`, `single_signal` or `failed: …`.
    pub fencer_result: String,
    /// Generation before the fence.
    pub generation_before: u64,
    /// Generation after (equal to before when the fence failed).
    pub generation_after: u64,
    /// Whether arenas were returned to the free pool.
    pub arenas_released: Vec<String>,
    /// Milliseconds per step group: claim transaction, sever+verify.
    pub claim_ms: u64,
    /// Milliseconds spent in the Fencer.
    pub sever_ms: u64,
    /// Milliseconds from the start of the run to the finishing transaction.
    pub total_ms: u64,
    /// Wall-clock time of the decision (Unix milliseconds), supplied by the driver.
    pub unix_ms: u64,
    /// The steps performed, in order.
    pub steps: Vec<FenceStep>,
}

/// One fence of one node, as a state machine.
#[derive(Debug, Clone)]
pub struct FenceRun {
    victim: Victim,
    trigger: Trigger,
    controller: String,
    fencer: String,
    state: FenceState,
    started: Instant,
    claimed_at: Option<Instant>,
    severed_at: Option<Instant>,
    arenas: Vec<String>,
    signals: Vec<String>,
    steps: Vec<FenceStep>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl FenceRun {
    /// Starts a fence of `victim`; the first action is always [`FenceAction::Claim`].
    pub fn new(
        victim: Victim,
        trigger: Trigger,
        controller: &str,
        fencer: &str,
        now: Instant,
    ) -> (Self, FenceAction) {
        let signal = match trigger {
            Trigger::Watch => "membership DELETE observed on watch",
            Trigger::Sweep => "sweep: not a member, fence owed",
            Trigger::Operator => "operator attestation: not a member",
        };
        let run = Self {
            victim,
            trigger,
            controller: controller.to_owned(),
            fencer: fencer.to_owned(),
            state: FenceState::Owed,
            started: now,
            claimed_at: None,
            severed_at: None,
            arenas: Vec::new(),
            signals: vec![signal.to_owned()],
            steps: Vec::new(),
        };
        (run, FenceAction::Claim)
    }

    /// The current state.
    pub fn state(&self) -> &FenceState {
        &self.state
    }

    /// The victim.
    pub fn victim(&self) -> &Victim {
        &self.victim
    }

    /// The trigger.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }

    /// Adds a signal to the audit record (e.g. "departure marker ignored: owns 2 arenas").
    pub fn add_signal(&mut self, signal: impl Into<String>) {
        self.signals.push(signal.into());
    }

    /// The claim transaction returned `outcome` (or failed).
    pub fn on_claim(&mut self, outcome: Result<ClaimOutcome, String>, now: Instant) -> FenceAction {
        debug_assert_eq!(self.state, FenceState::Owed);
        match outcome {
            Err(error) => {
                // Nothing is known to be written (a timed-out transaction may have
                // landed; its claim then expires with its lease and the intent, if
                // recorded, keeps the fence owed).
                self.state = FenceState::Failed {
                    step: FenceStep::Claim,
                    error,
                };
                FenceAction::Stop
            }
            Ok(ClaimOutcome::Held { by }) => {
                self.state = FenceState::Skipped {
                    why: format!("fence already claimed by {by}"),
                };
                FenceAction::Stop
            }
            Ok(ClaimOutcome::NotOwed { why }) => {
                self.state = FenceState::Skipped { why };
                FenceAction::Stop
            }
            Ok(ClaimOutcome::Won {
                generation, arenas, ..
            }) => {
                self.steps
                    .extend_from_slice(FenceStep::claim_txn(self.trigger));
                self.claimed_at = Some(now);
                self.arenas = arenas;
                self.state = FenceState::Claimed { generation };
                FenceAction::Sever
            }
        }
    }

    /// The Fencer returned.
    pub fn on_sever(
        &mut self,
        result: Result<Confirmation, (FenceStep, String)>,
        now: Instant,
        unix_ms: u64,
    ) -> FenceAction {
        let FenceState::Claimed { generation } = self.state else {
            return FenceAction::Stop;
        };
        self.severed_at = Some(now);
        match result {
            Ok(confirmation) => {
                self.steps.push(FenceStep::Sever);
                if confirmation.severed {
                    self.steps.push(FenceStep::Verify);
                }
                self.signals.push(format!(
                    "{}: {}",
                    confirmation.fencer, confirmation.evidence
                ));
                let release_arenas = confirmation.severed;
                let result = if confirmation.severed {
                    "confirmed"
                } else {
                    "single_signal"
                };
                let mut audit = self.audit(result, generation, generation + 1, now, unix_ms);
                audit
                    .steps
                    .extend_from_slice(FenceStep::finish_txn(release_arenas));
                if release_arenas {
                    audit.arenas_released = self.arenas.clone();
                }
                self.state = FenceState::Severed {
                    generation,
                    confirmation,
                };
                FenceAction::Finish {
                    from: generation,
                    release_arenas,
                    audit: Box::new(audit),
                }
            }
            Err((step, error)) => {
                let mut audit = self.audit(
                    &format!("failed at {step}: {error}"),
                    generation,
                    generation,
                    now,
                    unix_ms,
                );
                audit.steps.push(FenceStep::ReleaseClaim);
                self.state = FenceState::Failed { step, error };
                FenceAction::Abort {
                    audit: Box::new(audit),
                }
            }
        }
    }

    /// The finishing transaction returned.
    pub fn on_finish(&mut self, outcome: Result<BumpOutcome, String>) -> FenceAction {
        let FenceState::Severed { generation, .. } = self.state else {
            return FenceAction::Stop;
        };
        self.state = match outcome {
            Ok(BumpOutcome::Bumped) => FenceState::Fenced {
                generation: generation + 1,
            },
            Ok(BumpOutcome::GenerationMoved { now }) => FenceState::Superseded { now },
            Ok(BumpOutcome::ClaimLost) => FenceState::Failed {
                step: FenceStep::Bump,
                error: "claim lost before the bump (lease expired)".to_owned(),
            },
            Err(error) => FenceState::Failed {
                step: FenceStep::Bump,
                error,
            },
        };
        FenceAction::Stop
    }

    fn audit(
        &self,
        result: &str,
        before: u64,
        after: u64,
        now: Instant,
        unix_ms: u64,
    ) -> AuditRecord {
        let claimed = self.claimed_at.unwrap_or(self.started);
        let severed = self.severed_at.unwrap_or(now);
        AuditRecord {
            node: self.victim.node.to_string(),
            instance: self.victim.instance.clone(),
            fenced_by: self.controller.clone(),
            trigger: self.trigger,
            signals: self.signals.clone(),
            fencer: self.fencer.clone(),
            fencer_result: result.to_owned(),
            generation_before: before,
            generation_after: after,
            arenas_released: Vec::new(),
            claim_ms: ms(claimed.saturating_duration_since(self.started)),
            sever_ms: ms(severed.saturating_duration_since(claimed)),
            total_ms: ms(now.saturating_duration_since(self.started)),
            unix_ms,
            steps: self.steps.clone(),
        }
    }
}

/// Whether a departure marker is honoured: only when the arena records were read and
/// show the node owns nothing. A failed read (`None`) fences.
pub fn honour_departure(arenas_owned: Option<usize>) -> bool {
    arenas_owned == Some(0)
}

/// One range-read view of the cluster, from which a sweep decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepSnapshot {
    /// `gen/<node>`: generation and mod revision.
    pub generations: BTreeMap<NodeId, (u64, i64)>,
    /// `fence_pending/<node>`: instance id and mod revision.
    pub pending: BTreeMap<NodeId, (String, i64)>,
    /// `fence_done/<node>`: mod revision.
    pub done: BTreeMap<NodeId, i64>,
    /// `membership/<node>`: instance id.
    pub members: BTreeMap<NodeId, String>,
    /// `departed/<node>`: instance id and mod revision.
    pub departed: BTreeMap<NodeId, (String, i64)>,
    /// Number of arenas each node owns.
    pub arenas: BTreeMap<NodeId, usize>,
    /// Nodes with a fence claim held right now.
    pub claims: BTreeSet<NodeId>,
    /// `instance/<node>`: the instance id each node last joined with.
    pub instances: BTreeMap<NodeId, String>,
    /// Nodes whose `gen/<node>` exists but does not decode. They stay known: a fence
    /// is owed when one is not a member (it is then attempted and fails at the
    /// generation read, never bumping, until the value is repaired).
    pub unreadable_generations: BTreeSet<NodeId>,
}

/// Revisions the sweep decided from: the claim transaction compares them, which is the
/// `recheck_intent` step (a snapshot that aged is not acted on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotGuard {
    /// `mod_revision` of `fence_pending/<node>` (0: absent).
    pub pending_rev: i64,
    /// `mod_revision` of `fence_done/<node>` (0: absent).
    pub done_rev: i64,
    /// `mod_revision` of `departed/<node>` (0: absent).
    pub departed_rev: i64,
}

/// A fence the sweep owes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOwed {
    /// Who.
    pub victim: Victim,
    /// The snapshot revisions to re-check.
    pub guard: SnapshotGuard,
    /// Why (for the audit record).
    pub reason: String,
}

/// What a sweep does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Live members with a stale intent or done mark: drop them (it re-registered).
    pub drop_stale: Vec<NodeId>,
    /// Departed nodes whose marker is honoured (nothing owed).
    pub honoured: Vec<NodeId>,
    /// Fences owed.
    pub fence: Vec<SweepOwed>,
    /// Owed but claimed by someone right now: left to the claim holder.
    pub claimed: Vec<NodeId>,
}

/// Decides a sweep from a snapshot. Known nodes are those in `gen/` plus those with an
/// intent.
pub fn plan_sweep(s: &SweepSnapshot) -> SweepPlan {
    let mut plan = SweepPlan::default();
    let known: BTreeSet<&NodeId> = s
        .generations
        .keys()
        .chain(&s.unreadable_generations)
        .chain(s.pending.keys())
        .chain(s.done.keys())
        .chain(s.departed.keys())
        .collect();
    for node in known {
        let pending = s.pending.get(node);
        let done = s.done.get(node);
        if s.members.contains_key(node) {
            if pending.is_some() || done.is_some() {
                plan.drop_stale.push(node.clone());
            }
            continue;
        }
        let departed = s.departed.get(node);
        let arenas = s.arenas.get(node).copied().unwrap_or(0);
        let reason = if let Some(p) = pending {
            // The mark is written before the intent is cleared: marked-and-owed is owed.
            let _ = p;
            format!(
                "intent recorded{}",
                if done.is_some() {
                    " (also marked done)"
                } else {
                    ""
                }
            )
        } else if done.is_some() {
            continue; // fenced already, nothing owed
        } else if departed.is_some() && honour_departure(Some(arenas)) {
            plan.honoured.push(node.clone());
            continue;
        } else if departed.is_some() {
            format!("departure marker ignored: still owns {arenas} arena(s)")
        } else {
            "not a member and never fenced".to_owned()
        };
        if s.claims.contains(node) {
            plan.claimed.push(node.clone());
            continue;
        }
        // The intent's instance, else the departure marker's, else the one recorded
        // at join: a node whose membership vanished before anyone recorded an intent
        // (the watch missed or had not yet delivered the DELETE) is still EBS-fencible.
        let instance = [
            pending.map(|(i, _)| i),
            departed.map(|(i, _)| i),
            s.instances.get(node),
        ]
        .into_iter()
        .flatten()
        .find(|i| !i.is_empty())
        .cloned()
        .unwrap_or_default();
        plan.fence.push(SweepOwed {
            victim: Victim {
                node: node.clone(),
                instance,
            },
            guard: SnapshotGuard {
                pending_rev: pending.map_or(0, |p| p.1),
                done_rev: done.copied().unwrap_or(0),
                departed_rev: departed.map_or(0, |d| d.1),
            },
            reason,
        });
    }
    plan
}

/// The agent's self-fencing clock: when the lease has not been renewed for `margin`
/// (2 × TTL by default), or etcd said the lease is gone, the agent must stop all I/O.
#[derive(Debug, Clone)]
pub struct Watchdog {
    margin: Duration,
    last_renewed: Instant,
    expired: bool,
}

/// The watchdog's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchdogVerdict {
    /// Renewed recently enough.
    Healthy {
        /// Time left before self-fencing.
        left: Duration,
    },
    /// Self-fence now.
    SelfFence {
        /// Time since the last renewal.
        since_renewal: Duration,
        /// Whether etcd reported the lease expired (`lease_expired`).
        lease_expired: bool,
    },
}

impl Watchdog {
    /// A watchdog that considers the lease renewed at `now`.
    pub fn new(margin: Duration, now: Instant) -> Self {
        Self {
            margin,
            last_renewed: now,
            expired: false,
        }
    }

    /// A keepalive response arrived at `now` with the lease's remaining `ttl_secs`.
    pub fn on_keepalive(&mut self, ttl_secs: i64, now: Instant) {
        if ttl_secs <= 0 {
            self.expired = true;
        } else if !self.expired {
            self.last_renewed = now;
        }
    }

    /// The verdict at `now`. Once self-fencing, always self-fencing.
    pub fn verdict(&self, now: Instant) -> WatchdogVerdict {
        let since = now.saturating_duration_since(self.last_renewed);
        if self.expired || since >= self.margin {
            WatchdogVerdict::SelfFence {
                since_renewal: since,
                lease_expired: self.expired,
            }
        } else {
            WatchdogVerdict::Healthy {
                left: self.margin - since,
            }
        }
    }
}

/// What the agent's periodic device check concludes from a reservation report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceVerdict {
    /// Our key is registered and a reservation is held.
    Ok,
    /// Our key is registered but no reservation is held (e.g. the holder left):
    /// acquire the reservation (Write Exclusive - All Registrants).
    Acquire,
    /// Our key is not registered although this daemon registered it: we were
    /// preempted. Never re-register: self-fence.
    Preempted,
}

/// Decides from `registered` (is our key in the report) and `reservation_held`.
pub fn check_device(registered: bool, reservation_held: bool) -> DeviceVerdict {
    match (registered, reservation_held) {
        (false, _) => DeviceVerdict::Preempted,
        (true, false) => DeviceVerdict::Acquire,
        (true, true) => DeviceVerdict::Ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn victim() -> Victim {
        Victim {
            node: n("n1"),
            instance: "i-1".into(),
        }
    }

    fn won(generation: u64) -> ClaimOutcome {
        ClaimOutcome::Won {
            generation,
            generation_rev: 5,
            claim_rev: 9,
            arenas: vec!["a1".into()],
        }
    }

    fn confirmed() -> Confirmation {
        Confirmation {
            fencer: "nvme".into(),
            severed: true,
            evidence: "key gone".into(),
        }
    }

    #[test]
    fn confirmed_fence_bumps_and_releases_arenas() {
        let t0 = Instant::now();
        let (mut run, a) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
        assert_eq!(a, FenceAction::Claim);
        assert_eq!(
            run.on_claim(Ok(won(3)), t0 + Duration::from_millis(2)),
            FenceAction::Sever
        );
        assert_eq!(run.state(), &FenceState::Claimed { generation: 3 });
        let a = run.on_sever(Ok(confirmed()), t0 + Duration::from_millis(5), 1000);
        let FenceAction::Finish {
            from,
            release_arenas,
            audit,
        } = a
        else {
            panic!("{a:?}")
        };
        assert_eq!((from, release_arenas), (3, true));
        assert_eq!((audit.generation_before, audit.generation_after), (3, 4));
        assert_eq!(audit.arenas_released, vec!["a1".to_owned()]);
        assert_eq!((audit.claim_ms, audit.sever_ms, audit.total_ms), (2, 3, 5));
        assert!(audit.steps.contains(&FenceStep::Verify));
        assert!(audit.steps.contains(&FenceStep::ReleaseArenas));
        assert!(!run.state().is_terminal());
        assert_eq!(run.on_finish(Ok(BumpOutcome::Bumped)), FenceAction::Stop);
        assert_eq!(run.state(), &FenceState::Fenced { generation: 4 });
    }

    #[test]
    fn single_signal_never_releases_arenas() {
        let t0 = Instant::now();
        let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "none", t0);
        run.on_claim(Ok(won(0)), t0);
        let c = Confirmation {
            fencer: "none".into(),
            severed: false,
            evidence: "lease expiry only".into(),
        };
        let FenceAction::Finish {
            release_arenas,
            audit,
            ..
        } = run.on_sever(Ok(c), t0, 0)
        else {
            panic!()
        };
        assert!(!release_arenas);
        assert!(audit.arenas_released.is_empty());
        assert!(!audit.steps.contains(&FenceStep::ReleaseArenas));
        assert_eq!(audit.fencer_result, "single_signal");
    }

    #[test]
    fn failed_fence_never_bumps_and_stays_owed() {
        let t0 = Instant::now();
        let (mut run, _) = FenceRun::new(victim(), Trigger::Sweep, "c1", "nvme", t0);
        run.on_claim(Ok(won(7)), t0);
        let a = run.on_sever(
            Err((FenceStep::Verify, "key still registered".into())),
            t0,
            0,
        );
        let FenceAction::Abort { audit } = a else {
            panic!("{a:?}")
        };
        assert_eq!(audit.generation_after, 7);
        assert!(audit.fencer_result.contains("verify"));
        assert!(matches!(
            run.state(),
            FenceState::Failed {
                step: FenceStep::Verify,
                ..
            }
        ));
        // A late finish is ignored: a failed fence never bumps.
        assert_eq!(run.on_finish(Ok(BumpOutcome::Bumped)), FenceAction::Stop);
        assert!(matches!(run.state(), FenceState::Failed { .. }));
    }

    #[test]
    fn lost_claim_and_cas_are_not_fences() {
        let t0 = Instant::now();
        let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
        assert_eq!(
            run.on_claim(Ok(ClaimOutcome::Held { by: "c2".into() }), t0),
            FenceAction::Stop
        );
        assert!(matches!(run.state(), FenceState::Skipped { .. }));

        let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
        run.on_claim(Ok(won(1)), t0);
        run.on_sever(Ok(confirmed()), t0, 0);
        run.on_finish(Ok(BumpOutcome::GenerationMoved { now: 2 }));
        assert_eq!(run.state(), &FenceState::Superseded { now: 2 });

        let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
        run.on_claim(Ok(won(1)), t0);
        run.on_sever(Ok(confirmed()), t0, 0);
        run.on_finish(Ok(BumpOutcome::ClaimLost));
        assert!(matches!(
            run.state(),
            FenceState::Failed {
                step: FenceStep::Bump,
                ..
            }
        ));
    }

    #[test]
    fn claim_error_is_a_failure() {
        let t0 = Instant::now();
        let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
        assert_eq!(
            run.on_claim(Err("unavailable".into()), t0),
            FenceAction::Stop
        );
        assert!(matches!(
            run.state(),
            FenceState::Failed {
                step: FenceStep::Claim,
                ..
            }
        ));
    }

    #[test]
    fn departure_needs_a_successful_empty_read() {
        assert!(honour_departure(Some(0)));
        assert!(!honour_departure(Some(1)));
        assert!(!honour_departure(None));
    }

    #[test]
    fn sweep_plan() {
        let mut s = SweepSnapshot::default();
        // n1: live member with a stale intent and mark -> drop.
        s.generations.insert(n("n1"), (2, 10));
        s.members.insert(n("n1"), "i-1".into());
        s.pending.insert(n("n1"), ("i-1".into(), 11));
        s.done.insert(n("n1"), 12);
        // n2: gone, never fenced -> owed.
        s.generations.insert(n("n2"), (0, 3));
        // n3: gone, fenced already -> nothing.
        s.generations.insert(n("n3"), (1, 4));
        s.done.insert(n("n3"), 13);
        // n4: gone, marked done AND intent left (mark written before intent cleared) -> owed.
        s.generations.insert(n("n4"), (1, 5));
        s.done.insert(n("n4"), 14);
        s.pending.insert(n("n4"), ("i-4".into(), 15));
        // n5: departed cleanly, owns nothing -> honoured.
        s.generations.insert(n("n5"), (0, 6));
        s.departed.insert(n("n5"), ("i-5".into(), 16));
        // n6: departed but still owns an arena -> owed.
        s.generations.insert(n("n6"), (0, 7));
        s.departed.insert(n("n6"), ("i-6".into(), 17));
        s.arenas.insert(n("n6"), 1);
        // n7: owed but claimed right now -> left to the claimant.
        s.pending.insert(n("n7"), (String::new(), 18));
        s.claims.insert(n("n7"));
        let plan = plan_sweep(&s);
        assert_eq!(plan.drop_stale, vec![n("n1")]);
        assert_eq!(plan.honoured, vec![n("n5")]);
        assert_eq!(plan.claimed, vec![n("n7")]);
        let owed: Vec<_> = plan.fence.iter().map(|o| o.victim.node.as_str()).collect();
        assert_eq!(owed, vec!["n2", "n4", "n6"]);
        let n4 = &plan.fence[1];
        assert_eq!(n4.victim.instance, "i-4");
        assert_eq!(
            n4.guard,
            SnapshotGuard {
                pending_rev: 15,
                done_rev: 14,
                departed_rev: 0
            }
        );
        assert_eq!(plan.fence[2].guard.departed_rev, 17);
    }

    #[test]
    fn a_node_whose_generation_does_not_decode_is_still_owed_a_fence() {
        let mut s = SweepSnapshot::default();
        // n1: `gen/n1` is garbage and n1 is gone: owed (the fence then fails at the
        // generation read and stays owed; it is never dropped from the sweep).
        s.unreadable_generations.insert(n("n1"));
        // n2: garbage generation but a live member: nothing to do.
        s.unreadable_generations.insert(n("n2"));
        s.members.insert(n("n2"), "i-2".into());
        let plan = plan_sweep(&s);
        let owed: Vec<_> = plan.fence.iter().map(|o| o.victim.node.as_str()).collect();
        assert_eq!(owed, vec!["n1"]);
        assert!(plan.drop_stale.is_empty());
    }

    #[test]
    fn sweep_victim_instance_falls_back_to_the_one_recorded_at_join() {
        let mut s = SweepSnapshot::default();
        // n1: gone before any intent: only `instance/` knows its attachment.
        s.generations.insert(n("n1"), (0, 3));
        s.instances.insert(n("n1"), "i-1".into());
        // n2: an intent recorded without an instance (an older sweep) does not hide it.
        s.generations.insert(n("n2"), (0, 4));
        s.pending.insert(n("n2"), (String::new(), 9));
        s.instances.insert(n("n2"), "i-2".into());
        // n3: the intent's instance wins over the join record.
        s.generations.insert(n("n3"), (0, 5));
        s.pending.insert(n("n3"), ("i-3-intent".into(), 10));
        s.instances.insert(n("n3"), "i-3-join".into());
        // n4: nothing known anywhere: empty (the EBS fencer refuses it, loudly).
        s.generations.insert(n("n4"), (0, 6));
        let plan = plan_sweep(&s);
        let got: Vec<_> = plan
            .fence
            .iter()
            .map(|o| (o.victim.node.as_str(), o.victim.instance.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("n1", "i-1"),
                ("n2", "i-2"),
                ("n3", "i-3-intent"),
                ("n4", "")
            ]
        );
    }

    #[test]
    fn watchdog() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = Watchdog::new(10 * s, t0);
        assert_eq!(
            w.verdict(t0 + 4 * s),
            WatchdogVerdict::Healthy { left: 6 * s }
        );
        w.on_keepalive(5, t0 + 5 * s);
        assert!(matches!(
            w.verdict(t0 + 14 * s),
            WatchdogVerdict::Healthy { .. }
        ));
        assert!(matches!(
            w.verdict(t0 + 15 * s),
            WatchdogVerdict::SelfFence {
                lease_expired: false,
                ..
            }
        ));
        w.on_keepalive(0, t0 + 6 * s);
        w.on_keepalive(5, t0 + 7 * s); // a later renewal cannot undo an expiry
        assert!(matches!(
            w.verdict(t0 + 7 * s),
            WatchdogVerdict::SelfFence {
                lease_expired: true,
                ..
            }
        ));
    }

    #[test]
    fn device_check() {
        assert_eq!(check_device(true, true), DeviceVerdict::Ok);
        assert_eq!(check_device(true, false), DeviceVerdict::Acquire);
        assert_eq!(check_device(false, true), DeviceVerdict::Preempted);
        assert_eq!(check_device(false, false), DeviceVerdict::Preempted);
    }
}
