//! The fence driver: runs a [`FenceRun`] against the [`FenceStore`] and a [`Fencer`],
//! performing each [`FenceAction`] the run returns and feeding the outcome back. It
//! decides nothing.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Controller;
use crate::clock::unix_ms;
use crate::core::{
    ClaimGuard, ClaimOutcome, Confirmation, FenceAction, FenceFailure, FenceRun, FenceState,
    FenceStep, StepFailure, Trigger, Victim, instance_or_unknown, retry_claim,
};
use crate::fencer::{Fencer, fault, fault_scope};
use crate::ports::FenceStore;
use crate::store::{Abort, Finish, StoreError, count_round_trips};

/// A transaction whose answer a fail point lost: it committed, the caller sees a
/// timeout (the ambiguity a real deadline leaves).
fn answer_lost(op: &'static str) -> StoreError {
    StoreError::Unavailable {
        op,
        source: etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
            "fail point: answer lost",
        )),
    }
}

/// An injected fault as a store error (the step's etcd request was never sent).
fn fault_error(e: crate::fault::FaultInjected) -> StoreError {
    StoreError::Malformed {
        key: "fail point".into(),
        what: e.to_string(),
    }
}

impl<S: FenceStore> Controller<S> {
    async fn claim_with_retry(
        &self,
        victim: &Victim,
        guard: ClaimGuard,
        lose_first_answer: bool,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut delay = Duration::from_millis(50);
        for attempt in 0.. {
            let mut r = self.store.claim(victim, &self.cfg.id, guard).await;
            if lose_first_answer && attempt == 0 {
                r = r.and_then(|_| Err(answer_lost("claim")));
            }
            match r {
                Err(e) if retry_claim(attempt, e.is_retryable()) => {
                    tracing::warn!(step = "claim", node = %victim.node, error = %e, "claim failed, retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                r => return r,
            }
        }
        unreachable!("the loop returns")
    }

    /// `sever` + `verify` through `fencer`, unless the run's claim lease is too old for
    /// a sever to end before it expires ([`FenceRun::may_sever`]): then the fence stays
    /// owed and whoever claims next decides again, with a fresh lease.
    async fn sever(
        &self,
        fencer: &dyn Fencer,
        run: &FenceRun,
    ) -> Result<Confirmation, StepFailure> {
        let victim = run.victim();
        let failed = |step, failure| StepFailure { step, failure };
        let lose = fault(FenceStep::Sever).await.map_err(|m| {
            failed(
                FenceStep::Sever,
                FenceFailure::Injected {
                    what: m.to_string(),
                },
            )
        })?;
        let ttl = self.store.claim_ttl();
        if let Err(failure) = run.may_sever(Instant::now(), ttl) {
            tracing::warn!(step = "sever", node = %victim.node, claim_ttl = ?ttl, error = %failure, "claim may expire before the sever ends: not severing");
            return Err(failed(FenceStep::Sever, failure));
        }
        let r = fencer.fence(victim).await.map_err(|e| {
            if e.cause.needs_operator() {
                tracing::error!(step = "sever", node = %victim.node, error = %e.cause, "this fence needs an operator: it stays owed and this controller does not retry it until the node's record changes (see the error for what to do; `fenced check` turns CRITICAL while it is owed)");
                self.lock_needs_operator()
                    .record(victim.node.clone(), victim.instance.clone());
            }
            failed(
                e.step,
                FenceFailure::Fencer {
                    message: e.cause.to_string(),
                },
            )
        });
        if lose {
            return r.and_then(|_| {
                Err(failed(
                    FenceStep::Sever,
                    FenceFailure::Injected {
                        what: "fail point fence::sever: fencer ran, answer lost".to_owned(),
                    },
                ))
            });
        }
        r
    }

    /// Runs one fence of `victim` to a terminal state. Every `Err` leaves the fence owed.
    pub async fn fence(&self, victim: Victim, trigger: Trigger, guard: ClaimGuard) -> FenceState {
        let fencer = self.fencer.clone();
        self.fence_with(&*fencer, victim, trigger, guard).await
    }

    /// Like [`fence`](Self::fence) with another Fencer (operator attestation).
    pub async fn fence_with(
        &self,
        fencer: &dyn Fencer,
        victim: Victim,
        trigger: Trigger,
        guard: ClaimGuard,
    ) -> FenceState {
        let victim = checked_instance(victim);
        let scope = victim.clone();
        let node = victim.node.to_string();
        self.cfg.observer.fence_started(&node);
        let state = fault_scope(
            &self.cfg.id,
            &scope,
            self.run_fence(fencer, victim, trigger, guard),
        )
        .await;
        self.cfg.observer.fence_ended(&node, trigger, &state);
        state
    }

    async fn run_fence(
        &self,
        fencer: &dyn Fencer,
        victim: Victim,
        trigger: Trigger,
        guard: ClaimGuard,
    ) -> FenceState {
        let mut critical = 0;
        let (mut run, mut action) = FenceRun::new(
            victim.clone(),
            trigger,
            &self.cfg.id,
            fencer.name(),
            Instant::now(),
        );
        let as_failure = |e: StoreError| FenceFailure::Store {
            cause: e.to_string(),
        };
        loop {
            let step_started = Instant::now();
            let step = match &action {
                FenceAction::Claim | FenceAction::ClaimIgnoringDeparture => "claim",
                FenceAction::Sever => "sever",
                FenceAction::Finish { .. } => "finish",
                FenceAction::Abort { .. } => "abort",
                FenceAction::Stop => "stop",
            };
            action = match action {
                FenceAction::Claim => {
                    let (claimed, claim_rts) = count_round_trips(async {
                        let lose = fault(FenceStep::Claim).await.map_err(fault_error)?;
                        self.claim_with_retry(&victim, guard, lose).await
                    })
                    .await;
                    critical += claim_rts;
                    run.on_claim(claimed.map_err(as_failure), Instant::now())
                }
                FenceAction::ClaimIgnoringDeparture => {
                    tracing::info!(step = "claim", node = %victim.node, "departure marker not honoured: the node still owns arenas, claiming with the marker ignored");
                    let claimed = self
                        .claim_with_retry(&victim, guard.ignoring_departure(), false)
                        .await;
                    run.on_claim(claimed.map_err(as_failure), Instant::now())
                }
                FenceAction::Sever => {
                    let r = self.sever(fencer, &run).await;
                    run.on_sever(r, Instant::now(), unix_ms())
                }
                FenceAction::Finish {
                    from,
                    generation_rev,
                    claim_rev,
                    release_arenas,
                    arenas,
                    audit,
                } => {
                    let bump = async {
                        let lose = fault(FenceStep::Bump).await.map_err(fault_error)?;
                        let json = audit.to_json();
                        let r = self
                            .store
                            .finish(Finish {
                                node: &victim.node,
                                from,
                                generation_rev,
                                claim_rev,
                                release: release_arenas.then_some(arenas.as_slice()),
                                audit_json: json,
                            })
                            .await;
                        if lose {
                            return r.and_then(|_| Err(answer_lost("finish")));
                        }
                        r
                    };
                    let (r, finish_rts) = count_round_trips(bump).await;
                    critical += finish_rts;
                    let next = run.on_finish(r.map_err(as_failure));
                    self.stats
                        .last_fence_round_trips
                        .store(critical, Ordering::Relaxed);
                    if let FenceState::Fenced { generation } = run.state() {
                        tracing::info!(
                            target: "fenced::audit",
                            step = "release_claim",
                            node = %victim.node,
                            instance = %victim.instance,
                            generation_before = from,
                            generation_after = generation,
                            fencer = %audit.fencer,
                            fencer_result = %audit.fencer_result,
                            arenas_released = audit.arenas_released.len(),
                            total_ms = audit.total_ms,
                            audit = %audit.to_json(),
                            "node fenced"
                        );
                    }
                    next
                }
                FenceAction::Abort {
                    claim_rev,
                    generation,
                    audit,
                } => {
                    let json = audit.to_json();
                    tracing::error!(
                        target: "fenced::audit",
                        step = "release_claim",
                        node = %victim.node,
                        fencer_result = %audit.fencer_result,
                        audit = %json,
                        "fence NOT confirmed: generation not bumped, fence stays owed (sweep retries)"
                    );
                    let abort = async {
                        let lose = fault(FenceStep::ReleaseClaim).await.map_err(fault_error)?;
                        let r = self
                            .store
                            .abort(Abort {
                                node: &victim.node,
                                claim_rev,
                                generation,
                                unix_ms: audit.unix_ms,
                                audit_json: json,
                            })
                            .await;
                        if lose {
                            return r.and_then(|()| Err(answer_lost("abort")));
                        }
                        r
                    };
                    if let Err(e) = abort.await {
                        tracing::warn!(node = %victim.node, error = %e, "releasing the claim failed; it expires with its lease");
                    }
                    FenceAction::Stop
                }
                FenceAction::Stop => break,
            };
            self.cfg.observer.fence_step(step, step_started.elapsed());
        }
        if run.won_claim() {
            // Refill the spare claim lease, off the critical path.
            let store = self.store.clone();
            tokio::spawn(async move { store.prepare_claim_lease().await });
        }
        let state = run.state().clone();
        match &state {
            FenceState::Fenced { .. } => self.stats.fenced.fetch_add(1, Ordering::Relaxed),
            FenceState::Skipped { why } => {
                tracing::info!(node = %victim.node, trigger = ?trigger, why = %why, "fence skipped");
                self.stats.skipped.fetch_add(1, Ordering::Relaxed)
            }
            other @ (FenceState::Failed { .. }
            | FenceState::Superseded { .. }
            | FenceState::Owed
            | FenceState::Claimed { .. }
            | FenceState::Severed { .. }) => {
                tracing::warn!(node = %victim.node, trigger = ?trigger, state = ?other, "retrying incomplete fence later");
                self.stats.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
        state
    }
}

/// A victim's instance id came from etcd: one outside the rule is fenced as
/// "instance unknown" ([`instance_or_unknown`]), logged here.
pub(super) fn checked_instance(mut victim: Victim) -> Victim {
    let (instance, refused) = instance_or_unknown(std::mem::take(&mut victim.instance));
    if let Some(e) = refused {
        tracing::warn!(node = %victim.node, error = %e, "instance id read from etcd refused: fencing with the instance unknown");
    }
    victim.instance = instance;
    victim
}
