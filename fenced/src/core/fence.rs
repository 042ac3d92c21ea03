//! One fence of one node as a state machine ([`FenceRun`]): what the claim, the
//! Fencer and the finishing transaction returned, in types, and what the driver does
//! next ([`FenceAction`]).

use std::fmt;
use std::time::{Duration, Instant};

use super::{AuditRecord, ClaimBudget, Confirmation, FenceStep, Trigger, Victim, check_claim_age};

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
        /// When the claim's lease was granted, or a little earlier (the moment its
        /// grant was asked): the claim lives at least its TTL from here. A spare lease
        /// granted ahead may be up to [`ClaimBudget::spare_max_age`] old when won.
        lease_granted: Instant,
    },
    /// Another controller holds the claim.
    Held {
        /// Its value (the holder's controller id).
        by: String,
    },
    /// The guard failed: the victim is a member again, left a departure marker, was
    /// fenced already, or (sweep) the snapshot aged. Nothing was written.
    Refused(Refusal),
}

/// Why the claim transaction's guard failed (nothing was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The node holds membership again.
    Member,
    /// The node left a departure marker; `arenas` is the number of arenas it still
    /// owns (`None`: could not be read). Whether it is honoured is
    /// [`honour_departure`]'s decision.
    Departed {
        /// Arenas still owned.
        arenas: Option<usize>,
    },
    /// A fence mark was written after the DELETE this attempt acts on: that departure
    /// is already fenced.
    AlreadyFenced,
    /// The sweep's snapshot aged: the fence completed elsewhere or the state changed.
    SnapshotAged,
}

/// Why a run changed nothing (the fence is not this run's to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Another controller holds the claim (its controller id).
    HeldBy(String),
    /// The claim's guard refused: nothing is owed (see [`Refusal`]).
    NotOwed(Refusal),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HeldBy(by) => write!(f, "fence already claimed by {by}"),
            Self::NotOwed(Refusal::Member) => f.write_str("node is a member again"),
            Self::NotOwed(Refusal::Departed { .. }) => {
                f.write_str("departed cleanly, owns no arena")
            }
            Self::NotOwed(Refusal::AlreadyFenced) => {
                f.write_str("already fenced: a fence mark was written after this DELETE")
            }
            Self::NotOwed(Refusal::SnapshotAged) => {
                f.write_str("sweep snapshot aged: fence completed elsewhere or state changed")
            }
        }
    }
}

/// Why a step of a fence failed. Whatever the variant, the generation is not bumped
/// by this run and the intent (if recorded) stays: the fence is still owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceFailure {
    /// An etcd transaction failed (`cause`: the store's error, in words). A timed-out
    /// transaction may have committed; its claim then expires with its lease.
    Store {
        /// The store's error.
        cause: String,
    },
    /// Not severed: the claim's lease was granted `lease_age` ago, too long for the
    /// longest sever ([`ClaimBudget::sever`]) and the margin to end before it expires;
    /// after it the victim may have started afresh. Nothing was done to the device.
    ClaimMayHaveExpired {
        /// Time since the claim's lease was granted.
        lease_age: Duration,
        /// The claim lease's TTL.
        ttl: Duration,
    },
    /// The Fencer did not confirm (`message`: its evidence or error).
    Fencer {
        /// What the Fencer said.
        message: String,
    },
    /// An injected fault (fail point) stopped the step or lost its answer.
    Injected {
        /// The fail point's description.
        what: String,
    },
    /// Our claim expired before the bump: the finishing transaction wrote nothing.
    ClaimLost,
}

impl fmt::Display for FenceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Store { cause } => f.write_str(cause),
            Self::ClaimMayHaveExpired { lease_age, ttl } => {
                let b = ClaimBudget::new(*ttl);
                write!(
                    f,
                    "not severed: the claim's lease was granted {lease_age:?} ago, more than {:?} (TTL {ttl:?}), so it could expire before a sever of up to {:?} and a margin of {:?} end; the fence stays owed",
                    b.latest_sever_start(),
                    b.sever(),
                    b.margin()
                )
            }
            Self::Fencer { message } => f.write_str(message),
            Self::Injected { what } => f.write_str(what),
            Self::ClaimLost => f.write_str("claim lost before the bump (lease expired)"),
        }
    }
}

/// A failed step and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailure {
    /// The step that failed.
    pub step: FenceStep,
    /// Why.
    pub failure: FenceFailure,
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
        why: SkipReason,
    },
    /// Failed at `step`: the generation is not bumped and the intent stays, so the fence
    /// is still owed and the sweep retries it. The claim is released (or expires).
    Failed {
        /// The step that failed.
        step: FenceStep,
        /// Why.
        error: FenceFailure,
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

/// What the driver must do next. Each variant says what is already true when it is
/// returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceAction {
    /// Nothing is written yet: run the claim transaction ([`FenceStep::claim_txn`])
    /// with the trigger's guard.
    Claim,
    /// The watch-path claim was refused by a departure marker that is not honoured
    /// (the node still owns arenas, or they could not be read); nothing is written and
    /// the audit signal is recorded. Run the claim again with the marker ignored (same
    /// fence-mark guard).
    ClaimIgnoringDeparture,
    /// We hold the claim (intent recorded, generation read); the device is untouched.
    /// Check the claim lease's age ([`FenceRun::may_sever`]), then ask the Fencer to
    /// sever and verify.
    Sever,
    /// The Fencer confirmed; we still hold the claim. Run the finishing transaction
    /// ([`FenceStep::finish_txn`]) with this audit record.
    Finish {
        /// The generation to CAS from.
        from: u64,
        /// `mod_revision` of `gen/<node>` read by the claim (the bump's CAS compares it).
        generation_rev: i64,
        /// `create_revision` of our claim (the bump is conditioned on it).
        claim_rev: i64,
        /// Return the victim's arenas to the free pool (only when severed).
        release_arenas: bool,
        /// The arenas to return when `release_arenas` (read by the claim).
        arenas: Vec<String>,
        /// The audit record written in the same transaction.
        audit: Box<AuditRecord>,
    },
    /// The sever failed and we still hold the claim: delete it without bumping (the
    /// fence stays owed) and write `audit`. The run is over afterwards, whether the
    /// delete succeeds or not (the claim expires with its lease).
    Abort {
        /// `create_revision` of our claim.
        claim_rev: i64,
        /// The generation the attempt found (and leaves): names the record's key.
        generation: u64,
        /// The audit record of the failed attempt.
        audit: Box<AuditRecord>,
    },
    /// The run is over ([`FenceRun::state`] is terminal).
    Stop,
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
    /// `(generation_rev, claim_rev)` of the claim this run won.
    won: Option<(i64, i64)>,
    /// When the won claim's lease was granted.
    lease_granted: Option<Instant>,
    /// The claim was already retried with the departure marker ignored.
    departure_ignored: bool,
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
            won: None,
            lease_granted: None,
            departure_ignored: false,
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

    /// Whether this run won a claim (its pre-granted claim lease was used up).
    pub fn won_claim(&self) -> bool {
        self.won.is_some()
    }

    /// Whether the claim this run won may still be used to sever at `now`
    /// ([`check_claim_age`] on its lease's age; claim TTL `ttl`). A run that won no
    /// claim may not.
    pub fn may_sever(&self, now: Instant, ttl: Duration) -> Result<(), FenceFailure> {
        let Some(granted) = self.lease_granted else {
            return Err(FenceFailure::ClaimLost);
        };
        check_claim_age(now.saturating_duration_since(granted), ttl)
    }

    /// The claim transaction returned `outcome` (or failed).
    pub fn on_claim(
        &mut self,
        outcome: Result<ClaimOutcome, FenceFailure>,
        now: Instant,
    ) -> FenceAction {
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
                    why: SkipReason::HeldBy(by),
                };
                FenceAction::Stop
            }
            Ok(ClaimOutcome::Refused(Refusal::Departed { arenas }))
                if self.trigger == Trigger::Watch
                    && !self.departure_ignored
                    && !honour_departure(arenas) =>
            {
                self.departure_ignored = true;
                self.signals.push(format!(
                    "departure marker ignored: arena records show {} owned",
                    arenas.map_or("unknown".to_owned(), |n| n.to_string())
                ));
                FenceAction::ClaimIgnoringDeparture
            }
            Ok(ClaimOutcome::Refused(refusal)) => {
                self.state = FenceState::Skipped {
                    why: SkipReason::NotOwed(refusal),
                };
                FenceAction::Stop
            }
            Ok(ClaimOutcome::Won {
                generation,
                generation_rev,
                claim_rev,
                arenas,
                lease_granted,
            }) => {
                self.lease_granted = Some(lease_granted);
                self.steps
                    .extend_from_slice(FenceStep::claim_txn(self.trigger));
                self.claimed_at = Some(now);
                self.arenas = arenas;
                self.won = Some((generation_rev, claim_rev));
                self.state = FenceState::Claimed { generation };
                FenceAction::Sever
            }
        }
    }

    /// The Fencer returned.
    pub fn on_sever(
        &mut self,
        result: Result<Confirmation, StepFailure>,
        now: Instant,
        unix_ms: u64,
    ) -> FenceAction {
        let (FenceState::Claimed { generation }, Some((generation_rev, claim_rev))) =
            (&self.state, self.won)
        else {
            return FenceAction::Stop;
        };
        let generation = *generation;
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
                audit.steps.extend(
                    FenceStep::finish_txn(release_arenas)
                        .iter()
                        .map(|s| s.name().to_owned()),
                );
                if release_arenas {
                    audit.arenas_released = self.arenas.clone();
                }
                self.state = FenceState::Severed {
                    generation,
                    confirmation,
                };
                FenceAction::Finish {
                    from: generation,
                    generation_rev,
                    claim_rev,
                    release_arenas,
                    arenas: if release_arenas {
                        self.arenas.clone()
                    } else {
                        Vec::new()
                    },
                    audit: Box::new(audit),
                }
            }
            Err(StepFailure {
                step,
                failure: error,
            }) => {
                let mut audit = self.audit(
                    &format!("failed at {step}: {error}"),
                    generation,
                    generation,
                    now,
                    unix_ms,
                );
                audit.steps.push(FenceStep::ReleaseClaim.name().to_owned());
                self.state = FenceState::Failed { step, error };
                FenceAction::Abort {
                    claim_rev,
                    generation,
                    audit: Box::new(audit),
                }
            }
        }
    }

    /// The finishing transaction returned.
    pub fn on_finish(&mut self, outcome: Result<BumpOutcome, FenceFailure>) -> FenceAction {
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
                error: FenceFailure::ClaimLost,
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
            trigger: self.trigger.name().to_owned(),
            signals: self.signals.clone(),
            fencer: self.fencer.clone(),
            fencer_result: result.to_owned(),
            generation_before: Some(before),
            generation_after: Some(after),
            arenas_released: Vec::new(),
            claim_ms: Some(ms(claimed.saturating_duration_since(self.started))),
            sever_ms: Some(ms(severed.saturating_duration_since(claimed))),
            total_ms: Some(ms(now.saturating_duration_since(self.started))),
            unix_ms,
            steps: self.steps.iter().map(|s| s.name().to_owned()).collect(),
            ..AuditRecord::default()
        }
    }
}

/// Whether a departure marker is honoured: only when the arena records were read and
/// show the node owns nothing. A failed read (`None`) fences.
pub fn honour_departure(arenas_owned: Option<usize>) -> bool {
    arenas_owned == Some(0)
}
