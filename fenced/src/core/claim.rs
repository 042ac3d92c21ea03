//! The claim transaction's words and its one outcome rule: what the claim guards on
//! ([`ClaimGuard`]) and, when it was refused, which reason ranks first
//! ([`claim_outcome`]). The etcd adapter and its in-memory twin only gather the facts
//! ([`ClaimFacts`]); both rank them here, so the twin cannot drift from the product.
//! How the claim lease's TTL is shared out between the claim and the sever is
//! [`ClaimBudget`], and whether a stalled controller may still sever is
//! [`check_claim_age`].

use std::time::Duration;

use super::{ClaimOutcome, FenceFailure, Refusal, SnapshotGuard};

/// What the claim transaction guards on besides the claim itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimGuard {
    /// Watch path: membership absent, no departure marker, and no fence mark written
    /// since the membership DELETE at `deleted_rev`. The last compare is what makes a
    /// late or duplicated DELETE harmless: without it, a controller whose event
    /// arrives after another controller finished (and released its claim) wins a
    /// fresh claim and bumps the generation a second time for one departure.
    Watch {
        /// Revision of the membership DELETE this attempt acts on.
        deleted_rev: i64,
    },
    /// Watch path after a departure marker was found not honourable (the node still
    /// owns arenas): membership absent, the marker ignored, same fence-mark guard.
    IgnoreDeparture {
        /// Revision of the membership DELETE this attempt acts on (`i64::MAX`: no
        /// DELETE to anchor to).
        deleted_rev: i64,
    },
    /// Sweep path: membership absent and the snapshot unchanged (`recheck_intent`).
    Sweep(SnapshotGuard),
}

impl ClaimGuard {
    /// The guard of the second claim after a departure marker was found not
    /// honourable: the same DELETE anchors its fence-mark compare. The core asks for
    /// that claim only on the watch path; a sweep's guard carries no DELETE, so its
    /// anchor is `i64::MAX` (no fence mark can be newer: the compare always holds).
    pub fn ignoring_departure(self) -> Self {
        let deleted_rev = match self {
            Self::Watch { deleted_rev } | Self::IgnoreDeparture { deleted_rev } => deleted_rev,
            Self::Sweep(_) => i64::MAX,
        };
        Self::IgnoreDeparture { deleted_rev }
    }
}

/// What a refused claim transaction read back (its `or_else` branch), as facts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimFacts {
    /// `fence_claim/<node>`: the holder's controller id (`None`: no claim).
    pub held_by: Option<String>,
    /// `membership/<node>` exists.
    pub member: bool,
    /// `departed/<node>` exists.
    pub departed: bool,
    /// Arenas the node owns (`arena_node/<node>/…`).
    pub arenas: usize,
    /// `mod_revision` of `fence_done/<node>` (0: absent).
    pub done_rev: i64,
}

/// The outcome of a claim transaction whose guard failed, from what it read back:
/// a held claim first (someone is fencing), then a live member (nothing is owed), then
/// for the watch path a fence mark newer than the DELETE (already fenced), then a
/// departure marker (honoured or not by [`honour_departure`](super::honour_departure)).
/// Anything else (and every refused sweep claim) means the state moved since it was
/// read: [`Refusal::SnapshotAged`]. Never returns [`ClaimOutcome::Won`].
pub fn claim_outcome(guard: ClaimGuard, facts: ClaimFacts) -> ClaimOutcome {
    if let Some(by) = facts.held_by {
        return ClaimOutcome::Held { by };
    }
    if facts.member {
        return ClaimOutcome::Refused(Refusal::Member);
    }
    let fenced_since = |rev: i64| facts.done_rev > 0 && facts.done_rev >= rev;
    ClaimOutcome::Refused(match guard {
        ClaimGuard::Sweep(_) => Refusal::SnapshotAged,
        ClaimGuard::Watch { deleted_rev } | ClaimGuard::IgnoreDeparture { deleted_rev }
            if fenced_since(deleted_rev) =>
        {
            Refusal::AlreadyFenced
        }
        _ if facts.departed => Refusal::Departed {
            arenas: Some(facts.arenas),
        },
        _ => Refusal::SnapshotAged,
    })
}

/// How a claim lease's TTL is shared out between what happens under the claim (issue
/// 26, hole 3). The lease is never renewed and its TTL runs from its grant, not from
/// the claim: a spare is granted ahead, so the claim that wins it may find it
/// [`spare_max_age`](Self::spare_max_age) old; the claim transaction (and its retries)
/// has [`before_sever`](Self::before_sever); the Fencer [`sever`](Self::sever) (every
/// Fencer's deadline must fit in it: the EBS fencer's is checked at start); and
/// [`margin`](Self::margin) is kept between the end of the longest sever and the
/// lease's expiry (a detach the cloud applies a moment after its call, a host clock
/// that runs slow against etcd's). The four add up to the TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimBudget {
    ttl: Duration,
}

impl ClaimBudget {
    /// The budget of a claim lease of `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl }
    }

    /// The claim lease's TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The oldest a spare lease may be when a claim takes it: a quarter of the TTL.
    pub fn spare_max_age(&self) -> Duration {
        self.ttl / 4
    }

    /// From taking the lease to the start of the sever, in the worst case: an eighth.
    pub fn before_sever(&self) -> Duration {
        self.ttl / 8
    }

    /// Kept between the end of the longest sever and the lease's expiry: an eighth.
    pub fn margin(&self) -> Duration {
        self.ttl / 8
    }

    /// The longest a sever may take: the rest, half the TTL.
    pub fn sever(&self) -> Duration {
        self.ttl
            .saturating_sub(self.spare_max_age())
            .saturating_sub(self.before_sever())
            .saturating_sub(self.margin())
    }

    /// The oldest the claim's lease may be when the sever starts (three eighths).
    pub fn latest_sever_start(&self) -> Duration {
        self.spare_max_age() + self.before_sever()
    }

    /// Whether a Fencer whose sever ends within `deadline` fits the budget.
    pub fn fits_sever(&self, deadline: Duration) -> bool {
        !deadline.is_zero() && deadline <= self.sever()
    }

    /// The shortest claim TTL, in whole seconds (etcd's unit), whose budget fits a
    /// sever of `deadline`.
    pub fn min_ttl_secs_for(deadline: Duration) -> u64 {
        let twice = deadline.saturating_mul(2);
        let mut secs = twice.as_secs() + u64::from(twice.subsec_nanos() > 0);
        while !Self::new(Duration::from_secs(secs)).fits_sever(deadline) {
            secs += 1;
        }
        secs
    }
}

/// Whether a controller whose claim's lease was granted `lease_age` ago (claim TTL
/// `ttl`) may still sever: only while the longest sever and the margin end before the
/// lease expires ([`ClaimBudget`]). Once the claim is gone the victim may have
/// started afresh and joined, and the preempt would sever the new, healthy
/// incarnation (found by `tests/fault_schedules.rs`: a 3.4 s stall before `sever`
/// with a 3 s claim TTL). The age counts from the lease's grant, not from the claim:
/// a spare granted ahead is already old when its claim wins (counted from the claim,
/// a stall of half the TTL after a quarter-TTL-old spare left a quarter for a sever
/// of up to half). Past it the fence stays owed and the next claim takes a fresh
/// lease.
///
/// The age is this host's monotonic clock from before the grant was asked, so etcd's
/// lease lives at least as long (it can only have been lengthened, by a leader
/// change); asking etcd for the time left would add a round trip to every fence and
/// could only allow more.
pub fn check_claim_age(lease_age: Duration, ttl: Duration) -> Result<(), FenceFailure> {
    if lease_age > ClaimBudget::new(ttl).latest_sever_start() {
        Err(FenceFailure::ClaimMayHaveExpired { lease_age, ttl })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WATCH: ClaimGuard = ClaimGuard::Watch { deleted_rev: 10 };

    fn refused(r: Refusal) -> ClaimOutcome {
        ClaimOutcome::Refused(r)
    }

    #[test]
    fn a_held_claim_ranks_first_then_membership() {
        let all = ClaimFacts {
            held_by: Some("c2".into()),
            member: true,
            departed: true,
            arenas: 1,
            done_rev: 12,
        };
        for guard in [
            WATCH,
            WATCH.ignoring_departure(),
            ClaimGuard::Sweep(Default::default()),
        ] {
            assert_eq!(
                claim_outcome(guard, all.clone()),
                ClaimOutcome::Held { by: "c2".into() }
            );
            let member = ClaimFacts {
                held_by: None,
                ..all.clone()
            };
            assert_eq!(claim_outcome(guard, member), refused(Refusal::Member));
        }
    }

    #[test]
    fn a_fence_mark_newer_than_the_delete_is_already_fenced_before_a_departure() {
        let facts = |done_rev| ClaimFacts {
            departed: true,
            arenas: 2,
            done_rev,
            ..ClaimFacts::default()
        };
        assert_eq!(
            claim_outcome(WATCH, facts(10)),
            refused(Refusal::AlreadyFenced)
        );
        assert_eq!(
            claim_outcome(WATCH.ignoring_departure(), facts(11)),
            refused(Refusal::AlreadyFenced)
        );
        // A mark from an earlier departure does not count: the marker decides.
        assert_eq!(
            claim_outcome(WATCH, facts(9)),
            refused(Refusal::Departed { arenas: Some(2) })
        );
        assert_eq!(
            claim_outcome(WATCH, facts(0)),
            refused(Refusal::Departed { arenas: Some(2) })
        );
    }

    #[test]
    fn a_refused_sweep_claim_and_an_unexplained_refusal_mean_the_snapshot_aged() {
        let departed = ClaimFacts {
            departed: true,
            done_rev: 50,
            ..ClaimFacts::default()
        };
        let sweep = ClaimGuard::Sweep(Default::default());
        assert_eq!(
            claim_outcome(sweep, departed),
            refused(Refusal::SnapshotAged)
        );
        assert_eq!(
            claim_outcome(WATCH, ClaimFacts::default()),
            refused(Refusal::SnapshotAged)
        );
    }

    #[test]
    fn claiming_past_a_departure_keeps_the_delete_as_anchor() {
        assert_eq!(
            WATCH.ignoring_departure(),
            ClaimGuard::IgnoreDeparture { deleted_rev: 10 }
        );
        assert_eq!(
            ClaimGuard::IgnoreDeparture { deleted_rev: 7 }.ignoring_departure(),
            ClaimGuard::IgnoreDeparture { deleted_rev: 7 }
        );
        assert_eq!(
            ClaimGuard::Sweep(Default::default()).ignoring_departure(),
            ClaimGuard::IgnoreDeparture {
                deleted_rev: i64::MAX
            }
        );
    }
}
