//! The claim transaction's words and its one outcome rule: what the claim guards on
//! ([`ClaimGuard`]) and, when it was refused, which reason ranks first
//! ([`claim_outcome`]). The etcd adapter and its in-memory twin only gather the facts
//! ([`ClaimFacts`]); both rank them here, so the twin cannot drift from the product.

use super::{ClaimOutcome, Refusal, SnapshotGuard};

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
