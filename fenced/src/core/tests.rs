use std::time::{Duration, Instant};

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
        lease_granted: Instant::now(),
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
        generation_rev,
        claim_rev,
        release_arenas,
        arenas,
        audit,
    } = a
    else {
        panic!("{a:?}")
    };
    assert_eq!((from, release_arenas), (3, true));
    assert_eq!((generation_rev, claim_rev), (5, 9));
    assert_eq!(arenas, vec!["a1".to_owned()]);
    assert_eq!(
        (audit.generation_before, audit.generation_after),
        (Some(3), Some(4))
    );
    assert_eq!(audit.arenas_released, vec!["a1".to_owned()]);
    assert_eq!(
        (audit.claim_ms, audit.sever_ms, audit.total_ms),
        (Some(2), Some(3), Some(5))
    );
    assert!(audit.has_step(FenceStep::Verify));
    assert!(audit.has_step(FenceStep::ReleaseArenas));
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
    assert!(!audit.has_step(FenceStep::ReleaseArenas));
    assert_eq!(audit.fencer_result, "single_signal");
}

#[test]
fn failed_fence_never_bumps_and_stays_owed() {
    let t0 = Instant::now();
    let (mut run, _) = FenceRun::new(victim(), Trigger::Sweep, "c1", "nvme", t0);
    run.on_claim(Ok(won(7)), t0);
    let a = run.on_sever(
        Err(StepFailure {
            step: FenceStep::Verify,
            failure: FenceFailure::Fencer {
                message: "key still registered".into(),
            },
        }),
        t0,
        0,
    );
    let FenceAction::Abort {
        claim_rev,
        generation,
        audit,
    } = a
    else {
        panic!("{a:?}")
    };
    assert_eq!((claim_rev, generation), (9, 7));
    assert_eq!(audit.generation_after, Some(7));
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
        run.on_claim(
            Err(FenceFailure::Store {
                cause: "unavailable".into()
            }),
            t0
        ),
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
fn lease_reading_never_dates_a_renewal_later_than_it_was() {
    let ttl = Duration::from_secs(5);
    let asked = Instant::now() + Duration::from_secs(100);
    assert_eq!(
        lease_reading(ttl, 5, asked),
        LeaseReading::RenewedNoEarlierThan {
            at: asked - Duration::from_secs(1),
            left: 5
        }
    );
    assert_eq!(
        lease_reading(ttl, 2, asked),
        LeaseReading::RenewedNoEarlierThan {
            at: asked - Duration::from_secs(4),
            left: 2
        }
    );
    // More left than the TTL (a lease granted longer): still a second of doubt.
    assert_eq!(
        lease_reading(ttl, 9, asked),
        LeaseReading::RenewedNoEarlierThan {
            at: asked - Duration::from_secs(1),
            left: 9
        }
    );
    assert_eq!(lease_reading(ttl, 0, asked), LeaseReading::Expired);
    assert_eq!(lease_reading(ttl, -1, asked), LeaseReading::Expired);
    // A renewal older than the monotonic clock's origin cannot be named.
    let huge = Duration::from_secs(u64::MAX - 10);
    assert_eq!(lease_reading(huge, 1, asked), LeaseReading::Unknown);
}

#[test]
fn lease_reading_feeds_the_watchdog() {
    let t0 = Instant::now();
    let ttl = Duration::from_secs(5);
    let mut w = Watchdog::new(2 * ttl, t0);
    let asked = t0 + Duration::from_secs(8);
    let LeaseReading::RenewedNoEarlierThan { at, left } = lease_reading(ttl, 1, asked) else {
        panic!()
    };
    w.on_keepalive(left, at);
    // Renewed no earlier than 8 - 4 - 1 = 3 s: the margin of 10 s runs out at 13 s.
    assert!(matches!(
        w.verdict(t0 + Duration::from_millis(12_900)),
        WatchdogVerdict::Healthy { .. }
    ));
    assert!(matches!(
        w.verdict(t0 + Duration::from_secs(13)),
        WatchdogVerdict::SelfFence { .. }
    ));
}

#[test]
fn a_stale_claim_does_not_sever() {
    let ttl = Duration::from_secs(3);
    // Three eighths of the TTL: the oldest a claim's lease may be when the sever starts.
    assert_eq!(check_claim_age(Duration::from_millis(1125), ttl), Ok(()));
    let lease_age = Duration::from_millis(1126);
    let e = check_claim_age(lease_age, ttl).unwrap_err();
    assert_eq!(e, FenceFailure::ClaimMayHaveExpired { lease_age, ttl });
    assert!(
        e.to_string().starts_with(
            "not severed: the claim's lease was granted 1.126s ago, more than 1.125s (TTL 3s)"
        ),
        "{e}"
    );
}

/// The claim TTL is shared out between the spare's age, the time before the sever,
/// the sever and a margin, which add up to the TTL; a Fencer's deadline fits only
/// within the sever's share.
#[test]
fn the_claim_budget_adds_up_to_the_ttl() {
    for ttl in [3, 10, 90, 120, 3600].map(Duration::from_secs) {
        let b = ClaimBudget::new(ttl);
        assert_eq!(
            b.spare_max_age() + b.before_sever() + b.sever() + b.margin(),
            ttl
        );
        assert_eq!(b.latest_sever_start() + b.sever() + b.margin(), ttl);
        assert!(b.fits_sever(b.sever()));
        assert!(!b.fits_sever(b.sever() + Duration::from_millis(1)));
        assert!(!b.fits_sever(Duration::ZERO));
    }
    let b = ClaimBudget::new(Duration::from_secs(120));
    assert_eq!(
        (b.spare_max_age(), b.before_sever(), b.sever(), b.margin()),
        (
            Duration::from_secs(30),
            Duration::from_secs(15),
            Duration::from_secs(60),
            Duration::from_secs(15)
        )
    );
    assert_eq!(ClaimBudget::min_ttl_secs_for(Duration::from_secs(60)), 120);
    assert_eq!(
        ClaimBudget::min_ttl_secs_for(Duration::from_millis(1500)),
        3
    );
    assert_eq!(
        ClaimBudget::min_ttl_secs_for(Duration::from_millis(1501)),
        4
    );
}

/// Issue 26, hole 3: the sever is bounded by the claim lease's age since its grant,
/// not since the claim. A spare a quarter TTL old when the claim is won, then a stall
/// of a third of the TTL (less than the half the old rule allowed from the claim):
/// the lease has less than the sever and the margin left, so no sever.
#[test]
fn a_claim_won_on_an_old_spare_does_not_sever_after_a_stall() {
    let ttl = Duration::from_secs(120);
    let granted = Instant::now();
    let claimed = granted + ttl / 4;
    let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", claimed);
    let outcome = ClaimOutcome::Won {
        generation: 0,
        generation_rev: 0,
        claim_rev: 9,
        arenas: vec![],
        lease_granted: granted,
    };
    assert_eq!(run.on_claim(Ok(outcome), claimed), FenceAction::Sever);
    assert_eq!(run.may_sever(claimed, ttl), Ok(()));
    assert_eq!(run.may_sever(claimed + ttl / 8, ttl), Ok(()));
    let stalled = claimed + ttl / 3;
    assert_eq!(
        run.may_sever(stalled, ttl),
        Err(FenceFailure::ClaimMayHaveExpired {
            lease_age: ttl / 4 + ttl / 3,
            ttl
        })
    );
    // A run that won no claim never severs.
    let (fresh, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", claimed);
    assert!(fresh.may_sever(claimed, ttl).is_err());
}

#[test]
fn an_unhonoured_departure_is_claimed_again_once_on_the_watch_path() {
    let t0 = Instant::now();
    let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
    let departed = |arenas| Ok(ClaimOutcome::Refused(Refusal::Departed { arenas }));
    assert_eq!(
        run.on_claim(departed(Some(2)), t0),
        FenceAction::ClaimIgnoringDeparture
    );
    assert_eq!(run.state(), &FenceState::Owed);
    // The second claim ignores the marker; were it refused again, the run stops.
    assert_eq!(run.on_claim(departed(Some(2)), t0), FenceAction::Stop);
    assert!(matches!(run.state(), FenceState::Skipped { .. }));

    let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
    assert_eq!(
        run.on_claim(departed(None), t0),
        FenceAction::ClaimIgnoringDeparture
    );
    run.on_claim(Ok(won(2)), t0);
    let FenceAction::Finish { audit, .. } = run.on_sever(Ok(confirmed()), t0, 0) else {
        panic!()
    };
    assert!(
        audit
            .signals
            .contains(&"departure marker ignored: arena records show unknown owned".into())
    );

    // Honoured: owns nothing.
    let (mut run, _) = FenceRun::new(victim(), Trigger::Watch, "c1", "nvme", t0);
    assert_eq!(run.on_claim(departed(Some(0)), t0), FenceAction::Stop);
    let FenceState::Skipped { why } = run.state() else {
        panic!()
    };
    assert_eq!(why.to_string(), "departed cleanly, owns no arena");

    // Not the watch path: the sweep decided from its own snapshot.
    let (mut run, _) = FenceRun::new(victim(), Trigger::Sweep, "c1", "nvme", t0);
    assert_eq!(run.on_claim(departed(Some(2)), t0), FenceAction::Stop);
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

#[test]
fn a_silent_device_is_reported_after_the_stall_limit_never_fenced_on() {
    assert_eq!(device_health(None), DeviceHealth::Answering);
    assert_eq!(
        device_health(Some(DEVICE_STALL - Duration::from_millis(1))),
        DeviceHealth::Answering
    );
    assert_eq!(
        device_health(Some(DEVICE_STALL)),
        DeviceHealth::Stalled { for_: DEVICE_STALL }
    );
    // A multipath fail-over queues for tens of seconds: not a stall yet.
    assert!(DEVICE_STALL >= Duration::from_secs(20));
}
