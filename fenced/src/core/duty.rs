//! Which controller does what: who claims a death first and who only stands by, and
//! who runs the period's full sweep. Every controller decides alone, from its view of
//! the live controllers ([`Roster`], kept from a watch of `controller/`), with no
//! request and no clock (delays are returned, time since the last sweep arrives as a
//! count of ticks).
//!
//! None of this is safety: the claim transaction stays the only arbiter of who fences,
//! and its guards are unchanged. The order only decides WHO tries WHEN, so that a
//! death costs one claim instead of one per controller, and a period one read of the
//! key space instead of one per controller. Whatever the view gets wrong degrades to
//! more work, never to none: a view that is not in sync claims at once and sweeps; a
//! controller missing from the view ranks itself anyway; a death left to others (rank
//! 3 and beyond) or a fence its standbys found in hand and that then failed stays owed
//! and is the sweep's; a sweeper that stopped sweeping is replaced after [`STALE_TICKS`]
//! ticks.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::node::NodeId;

/// Controllers that act on a death: rank 0 claims at once, ranks 1 and 2 stand by
/// (each checks once, after its delay, and claims if nobody did). Later ranks leave
/// the death to them and to the sweep.
pub const ACTING_RANKS: usize = 3;

/// Ticks without a sweep stamp from another controller after which the controller
/// next in the sweep order sweeps (the one after it waits twice as long, ...).
pub const STALE_TICKS: u32 = 3;

/// A controller's place in an order: FNV-1a 64 of `subject`, a separator and `id`,
/// finished with a 64-bit mixer (splitmix64's) so ids that differ in one byte land far
/// apart. Deterministic across hosts and builds: every controller computes the same
/// order from the same set.
pub fn rendezvous(subject: &[u8], id: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in subject.iter().chain(&[0xff]).chain(id.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Subject of the sweep order (no node id can be empty, so no death's order is it).
const SWEEP_SUBJECT: &[u8] = b"";

/// The live controllers as one controller sees them (`controller/live/<id>`, each
/// bound to its controller's lease), and the last sweep stamp.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roster {
    /// Whether the view follows etcd (listed, and the watch since then unbroken).
    /// A view out of sync is not used: its owner claims and sweeps as if alone.
    synced: bool,
    /// Controller id -> the node it runs on (`None`: a controller without membership).
    live: BTreeMap<String, Option<NodeId>>,
    /// `controller/sweep_done`: who wrote it and its mod revision.
    stamp: Option<SweepStamp>,
}

/// The last full sweep's stamp (`controller/sweep_done`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepStamp {
    /// The controller that swept.
    pub by: String,
    /// The stamp's mod revision: changes with every sweep.
    pub revision: i64,
}

impl Roster {
    /// A view listed at one revision: `live` (id, node it runs on) and the stamp.
    pub fn listed(
        live: impl IntoIterator<Item = (String, Option<NodeId>)>,
        stamp: Option<SweepStamp>,
    ) -> Self {
        Self {
            synced: true,
            live: live.into_iter().collect(),
            stamp,
        }
    }

    /// The view no longer follows etcd (its watch broke): not used until listed again.
    pub fn lost_sync(&mut self) {
        self.synced = false;
    }

    /// Whether the view follows etcd.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// A controller announced itself (or announced itself again).
    pub fn put(&mut self, id: String, node: Option<NodeId>) {
        self.live.insert(id, node);
    }

    /// A controller's presence is gone (its lease expired or was revoked).
    pub fn remove(&mut self, id: &str) {
        self.live.remove(id);
    }

    /// A sweep was stamped.
    pub fn stamped(&mut self, stamp: SweepStamp) {
        self.stamp = Some(stamp);
    }

    /// The last sweep stamp seen.
    pub fn stamp(&self) -> Option<&SweepStamp> {
        self.stamp.as_ref()
    }

    /// Number of live controllers in the view.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether the view holds no controller.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The ids of the view other than `me`, leaving out the controllers running on
    /// `exclude` (a dead node's own controller died with it), each with its place key
    /// for `subject`: one hash per id.
    fn keyed<'a>(
        &'a self,
        subject: &'a [u8],
        me: &'a str,
        exclude: Option<&'a NodeId>,
    ) -> impl Iterator<Item = (u64, &'a str)> + 'a {
        self.live
            .iter()
            .filter(move |(id, node)| {
                id.as_str() != me && (exclude.is_none() || node.as_ref() != exclude)
            })
            .map(move |(id, _)| (rendezvous(subject, id), id.as_str()))
    }

    /// `me`'s place among the view and `me` ordered by `subject` (ties by id): how
    /// many come before it. O(n): this runs in every controller for every death, so
    /// it does not sort.
    fn position(&self, subject: &[u8], me: &str, exclude: Option<&NodeId>) -> usize {
        let mine = (rendezvous(subject, me), me);
        self.keyed(subject, me, exclude)
            .filter(|k| *k < mine)
            .count()
    }

    /// The first `k` of the view and `me` ordered by `subject` (ties by id).
    fn first<'a>(
        &'a self,
        subject: &'a [u8],
        me: &'a str,
        exclude: Option<&'a NodeId>,
        k: usize,
    ) -> Vec<&'a str> {
        let mut keys: Vec<(u64, &str)> = self
            .keyed(subject, me, exclude)
            .chain(std::iter::once((rendezvous(subject, me), me)))
            .collect();
        if keys.len() > k && k > 0 {
            keys.select_nth_unstable(k - 1);
            keys.truncate(k);
        }
        keys.sort_unstable();
        keys.into_iter().take(k).map(|(_, id)| id).collect()
    }

    /// The controllers that act on the death of `victim`, in rank order (rank 0
    /// first), as `me` sees them: at most [`ACTING_RANKS`].
    pub fn fence_order(&self, me: &str, victim: &NodeId) -> Vec<String> {
        self.first(victim.as_str().as_bytes(), me, Some(victim), ACTING_RANKS)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// `me`'s rank for the death of `victim` (0: claims at once).
    pub fn fence_rank(&self, me: &str, victim: &NodeId) -> usize {
        self.position(victim.as_str().as_bytes(), me, Some(victim))
    }

    /// `me`'s place in the sweep order (0: the sweeper of every period).
    pub fn sweep_position(&self, me: &str) -> usize {
        self.position(SWEEP_SUBJECT, me, None)
    }

    /// The controller that sweeps every period, as `me` sees it.
    pub fn sweeper(&self, me: &str) -> String {
        self.first(SWEEP_SUBJECT, me, None, 1)
            .first()
            .map_or_else(|| me.to_owned(), |id| (*id).to_owned())
    }
}

/// What a controller does about a membership DELETE it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceDuty {
    /// Claim at once (rank 0, or the view is out of sync).
    Claim,
    /// After `after`, check once whether anyone claimed or fenced; claim if not.
    Standby {
        /// This controller's rank (1 or 2).
        rank: usize,
        /// How long to wait first.
        after: Duration,
    },
    /// Nothing: ranks before this one act, and the sweep covers them.
    LeaveToPeers {
        /// This controller's rank (3 or more).
        rank: usize,
    },
}

/// What `me` does about the death of `victim`, from `roster`; rank `k` waits `k`
/// times `step`.
pub fn fence_duty(roster: &Roster, me: &str, victim: &NodeId, step: Duration) -> FenceDuty {
    if !roster.is_synced() {
        return FenceDuty::Claim;
    }
    match roster.fence_rank(me, victim) {
        0 => FenceDuty::Claim,
        rank if rank < ACTING_RANKS => FenceDuty::Standby {
            rank,
            after: step * u32::try_from(rank).unwrap_or(u32::MAX),
        },
        rank => FenceDuty::LeaveToPeers { rank },
    }
}

/// What a standby's check read about the victim (one request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FenceCheck {
    /// `fence_claim/<node>` exists: someone is fencing it now.
    pub claimed: bool,
    /// `mod_revision` of `fence_done/<node>` (0: absent).
    pub done_rev: i64,
    /// `departed/<node>` exists.
    pub departed: bool,
    /// `membership/<node>` exists again.
    pub member: bool,
}

/// Why a standby did not claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbySkip {
    /// A claim is held: its holder fences (a failure there stays owed, for the sweep).
    Claimed,
    /// A fence mark was written after the DELETE: done.
    Fenced,
    /// The node is a member again.
    Member,
    /// The node left a departure marker: rank 0 decides whether it is honoured, the
    /// sweep when rank 0 cannot.
    Departed,
}

impl std::fmt::Display for StandbySkip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Claimed => "a peer holds the claim",
            Self::Fenced => "a peer fenced it already",
            Self::Member => "the node is a member again",
            Self::Departed => "the node left a departure marker (the first-ranked controller and the sweep decide)",
        })
    }
}

/// Whether a standby claims the death whose DELETE was at `deleted_rev`, from its
/// check: `Ok(())` claims (the claim transaction decides for real), `Err` skips.
pub fn standby_verdict(check: &FenceCheck, deleted_rev: i64) -> Result<(), StandbySkip> {
    if check.claimed {
        Err(StandbySkip::Claimed)
    } else if check.done_rev > 0 && check.done_rev >= deleted_rev {
        Err(StandbySkip::Fenced)
    } else if check.member {
        Err(StandbySkip::Member)
    } else if check.departed {
        Err(StandbySkip::Departed)
    } else {
        Ok(())
    }
}

/// How long a standby waits for its check's answer: one standby step. A check
/// waiting on a member that stopped answering must not hold the fence up.
pub fn standby_check_timeout(step: Duration) -> Duration {
    step
}

/// Why a standby claims a death.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandbyClaim {
    /// The check found it unclaimed, not fenced since the DELETE, not a member, not
    /// departed.
    Unclaimed,
    /// The check failed or got no answer within [`standby_check_timeout`]: doubt
    /// claims (the claim transaction is the arbiter).
    Doubt,
}

/// Whether a standby claims the death whose DELETE was at `deleted_rev`, from its
/// check's answer (`None`: the check failed or got no answer in time): doubt claims,
/// otherwise [`standby_verdict`] decides.
pub fn standby_decision(
    check: Option<&FenceCheck>,
    deleted_rev: i64,
) -> Result<StandbyClaim, StandbySkip> {
    match check {
        None => Ok(StandbyClaim::Doubt),
        Some(check) => standby_verdict(check, deleted_rev).map(|()| StandbyClaim::Unclaimed),
    }
}

/// Whether a controller runs the full sweep of this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepDuty {
    /// Sweep: the view is out of sync (sweep as if alone).
    SweepUnsynced,
    /// Sweep: this controller is first in the sweep order.
    SweepAsSweeper,
    /// Sweep: no other controller stamped a sweep for `ticks` ticks.
    SweepStale {
        /// Ticks since another controller's stamp last moved.
        ticks: u32,
    },
    /// Leave it to `sweeper`.
    Skip {
        /// Who sweeps.
        sweeper: String,
    },
}

impl SweepDuty {
    /// Whether this tick sweeps.
    pub fn sweeps(&self) -> bool {
        !matches!(self, Self::Skip { .. })
    }
}

/// Counts a controller's sweep ticks since another controller's stamp last moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepClock {
    /// Revision of the last stamp by another controller.
    seen: Option<i64>,
    /// Ticks since it moved.
    ticks: u32,
}

impl SweepClock {
    /// One tick of `me`'s sweep loop: what it does, from `roster`. Position `p` in the
    /// sweep order sweeps every tick when `p` is 0, and otherwise once no other
    /// controller's stamp moved for `p` × [`STALE_TICKS`] ticks (and then every tick,
    /// until another's stamp moves again).
    pub fn tick(&mut self, roster: &Roster, me: &str) -> SweepDuty {
        match roster.stamp() {
            Some(s) if s.by != me && self.seen != Some(s.revision) => {
                self.seen = Some(s.revision);
                self.ticks = 0;
            }
            _ => self.ticks = self.ticks.saturating_add(1),
        }
        if !roster.is_synced() {
            return SweepDuty::SweepUnsynced;
        }
        let position = u32::try_from(roster.sweep_position(me)).unwrap_or(u32::MAX);
        if position == 0 {
            SweepDuty::SweepAsSweeper
        } else if self.ticks >= position.saturating_mul(STALE_TICKS) {
            SweepDuty::SweepStale { ticks: self.ticks }
        } else {
            SweepDuty::Skip {
                sweeper: roster.sweeper(me),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    /// Controllers `c0..c{count}`, controller `ci` running on node `ni`.
    fn roster(count: usize) -> Roster {
        Roster::listed(
            (0..count).map(|i| (format!("c{i}"), Some(n(&format!("n{i}"))))),
            None,
        )
    }

    const STEP: Duration = Duration::from_millis(500);

    #[test]
    fn rendezvous_is_fixed_across_builds() {
        // Pinned (the value computed apart from this code): every controller of a
        // cluster must compute the same order, whatever version it runs.
        assert_eq!(rendezvous(b"n1", "c1"), rendezvous(b"n1", "c1"));
        assert_eq!(rendezvous(b"n1", "c1"), 0xee1b_cb51_0c63_f241);
        assert_ne!(rendezvous(b"n1", "c1"), rendezvous(b"n1c", "1"));
    }

    #[test]
    fn every_controller_agrees_on_the_ranks_of_a_death() {
        let r = roster(6);
        let victim = n("n9");
        let ids: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
        let mut ranks: Vec<usize> = ids.iter().map(|id| r.fence_rank(id, &victim)).collect();
        ranks.sort_unstable();
        assert_eq!(ranks, [0, 1, 2, 3, 4, 5]);
        let order = r.fence_order("c0", &victim);
        assert_eq!(order.len(), ACTING_RANKS);
        for (rank, id) in order.iter().enumerate() {
            assert_eq!(r.fence_rank(id, &victim), rank);
            // Every controller computes the same order.
            assert_eq!(r.fence_order(&ids[5], &victim), order);
        }
        let duties: Vec<FenceDuty> = ids
            .iter()
            .map(|id| fence_duty(&r, id, &victim, STEP))
            .collect();
        let count = |f: fn(&FenceDuty) -> bool| duties.iter().filter(|d| f(d)).count();
        assert_eq!(count(|d| *d == FenceDuty::Claim), 1);
        assert_eq!(count(|d| matches!(d, FenceDuty::Standby { .. })), 2);
        assert_eq!(count(|d| matches!(d, FenceDuty::LeaveToPeers { .. })), 3);
        assert!(duties.contains(&FenceDuty::Standby {
            rank: 2,
            after: 2 * STEP
        }));
    }

    /// The order is the full sort of (key, id) that every version computes, so a
    /// cluster mixing versions agrees on it: the O(n) rank and the partial selection
    /// give the same answers as sorting everything.
    #[test]
    fn ranks_and_orders_match_a_full_sort() {
        let r = roster(40);
        let sorted = |subject: &[u8], exclude: Option<&NodeId>| {
            let mut ids: Vec<String> = (0..40)
                .filter(|i| exclude != Some(&n(&format!("n{i}"))))
                .map(|i| format!("c{i}"))
                .collect();
            ids.sort_by_key(|id| (rendezvous(subject, id), id.clone()));
            ids
        };
        for v in (0..40)
            .map(|v| format!("n{v}"))
            .chain((0..60).map(|v| format!("v{v}")))
        {
            let victim = n(&v);
            let want = sorted(v.as_bytes(), Some(&victim));
            for (rank, id) in want.iter().enumerate() {
                assert_eq!(r.fence_rank(id, &victim), rank, "{id} for {v}");
                assert_eq!(
                    r.fence_order(id, &victim),
                    want[..ACTING_RANKS],
                    "{id} for {v}"
                );
            }
        }
        let want = sorted(SWEEP_SUBJECT, None);
        for (position, id) in want.iter().enumerate() {
            assert_eq!(r.sweep_position(id), position, "{id}");
            assert_eq!(r.sweeper(id), want[0]);
        }
        // A roster of one, and a `me` outside the view.
        let alone = Roster::listed([], None);
        assert_eq!(alone.fence_order("me", &n("n1")), ["me"]);
        assert_eq!(alone.sweeper("me"), "me");
    }

    #[test]
    fn deaths_spread_over_the_controllers() {
        let r = roster(5);
        let mut first = BTreeMap::new();
        for v in 0..500 {
            let order = r.fence_order("c0", &n(&format!("v{v}")));
            *first.entry(order[0].clone()).or_insert(0) += 1;
        }
        assert_eq!(first.len(), 5, "{first:?}");
        assert!(first.values().all(|c| *c > 50), "{first:?}");
    }

    #[test]
    fn the_victims_own_controller_never_ranks() {
        let r = roster(4);
        for v in 0..4 {
            let victim = n(&format!("n{v}"));
            let own = format!("c{v}");
            assert!(!r.fence_order("c0", &victim).contains(&own) || own == "c0");
            // Ranks among the others are 0..3, without gaps.
            let mut ranks: Vec<usize> = (0..4)
                .filter(|i| *i != v)
                .map(|i| r.fence_rank(&format!("c{i}"), &victim))
                .collect();
            ranks.sort_unstable();
            assert_eq!(ranks, [0, 1, 2]);
        }
    }

    #[test]
    fn a_view_out_of_sync_claims_and_sweeps_as_if_alone() {
        let mut r = roster(5);
        r.lost_sync();
        for i in 0..5 {
            assert_eq!(
                fence_duty(&r, &format!("c{i}"), &n("n9"), STEP),
                FenceDuty::Claim
            );
            assert_eq!(
                SweepClock::default().tick(&r, &format!("c{i}")),
                SweepDuty::SweepUnsynced
            );
        }
        // Never listed is out of sync too.
        assert_eq!(
            fence_duty(&Roster::default(), "c0", &n("n9"), STEP),
            FenceDuty::Claim
        );
    }

    #[test]
    fn a_controller_missing_from_the_view_ranks_itself() {
        let r = roster(3);
        let mut seen = r.clone();
        seen.put("newcomer".into(), None);
        // It ranks itself where the others will rank it once they see it.
        for v in 0..50 {
            let victim = n(&format!("v{v}"));
            assert_eq!(
                r.fence_rank("newcomer", &victim),
                seen.fence_rank("newcomer", &victim)
            );
            assert_eq!(
                r.sweep_position("newcomer"),
                seen.sweep_position("newcomer")
            );
        }
        assert_eq!(Roster::listed([], None).fence_rank("alone", &n("n9")), 0);
    }

    #[test]
    fn a_dead_first_rank_leaves_the_death_to_the_next() {
        let mut r = roster(5);
        let victim = n("n9");
        let order = r.fence_order("c0", &victim);
        r.remove(&order[0]);
        assert_eq!(r.fence_rank(&order[1], &victim), 0);
        assert_eq!(fence_duty(&r, &order[1], &victim, STEP), FenceDuty::Claim);
    }

    #[test]
    fn a_standby_claims_only_what_nobody_claimed_or_fenced() {
        let check = |claimed, done_rev, departed, member| FenceCheck {
            claimed,
            done_rev,
            departed,
            member,
        };
        assert_eq!(standby_verdict(&check(false, 0, false, false), 10), Ok(()));
        // A fence mark from an earlier departure does not count.
        assert_eq!(standby_verdict(&check(false, 7, false, false), 10), Ok(()));
        assert_eq!(
            standby_verdict(&check(false, 12, false, false), 10),
            Err(StandbySkip::Fenced)
        );
        assert_eq!(
            standby_verdict(&check(true, 0, false, false), 10),
            Err(StandbySkip::Claimed)
        );
        assert_eq!(
            standby_verdict(&check(false, 0, false, true), 10),
            Err(StandbySkip::Member)
        );
        assert_eq!(
            standby_verdict(&check(false, 0, true, false), 10),
            Err(StandbySkip::Departed)
        );
    }

    #[test]
    fn a_standby_in_doubt_claims_and_an_answer_decides_otherwise() {
        // No answer (failed, or not within the timeout): doubt claims.
        assert_eq!(standby_decision(None, 10), Ok(StandbyClaim::Doubt));
        let unclaimed = FenceCheck::default();
        assert_eq!(
            standby_decision(Some(&unclaimed), 10),
            Ok(StandbyClaim::Unclaimed)
        );
        // An answer that shows the death in hand is left, doubt or not.
        let claimed = FenceCheck {
            claimed: true,
            ..FenceCheck::default()
        };
        assert_eq!(
            standby_decision(Some(&claimed), 10),
            Err(StandbySkip::Claimed)
        );
        let fenced = FenceCheck {
            done_rev: 11,
            ..FenceCheck::default()
        };
        assert_eq!(
            standby_decision(Some(&fenced), 10),
            Err(StandbySkip::Fenced)
        );
    }

    #[test]
    fn a_standby_check_times_out_after_one_step() {
        assert_eq!(standby_check_timeout(STEP), STEP);
        assert_eq!(
            standby_check_timeout(Duration::from_millis(1)),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn one_controller_sweeps_per_tick() {
        let mut r = roster(5);
        let mut clocks: Vec<SweepClock> = vec![SweepClock::default(); 5];
        for tick in 0..20 {
            let sweepers: Vec<usize> = (0..5)
                .filter(|i| clocks[*i].tick(&r, &format!("c{i}")).sweeps())
                .collect();
            assert_eq!(sweepers.len(), 1, "tick {tick}: {sweepers:?}");
            assert_eq!(format!("c{}", sweepers[0]), r.sweeper("c3"));
            r.stamped(SweepStamp {
                by: r.sweeper("c3"),
                revision: tick,
            });
        }
    }

    #[test]
    fn a_sweeper_that_stopped_stamping_is_replaced_by_the_next_in_order() {
        let mut r = roster(5);
        let ids: Vec<String> = (0..5).map(|i| format!("c{i}")).collect();
        let mut by_position = ids.clone();
        by_position.sort_by_key(|id| r.sweep_position(id));
        let (first, second, third) = (&by_position[0], &by_position[1], &by_position[2]);
        let mut clocks: BTreeMap<&str, SweepClock> = ids
            .iter()
            .map(|id| (id.as_str(), SweepClock::default()))
            .collect();
        let mut rev = 100;
        let mut tick_all = |r: &mut Roster, stamping: Option<&str>| -> Vec<String> {
            let swept: Vec<String> = ids
                .iter()
                .filter(|id| clocks.get_mut(id.as_str()).unwrap().tick(r, id).sweeps())
                .cloned()
                .collect();
            for s in &swept {
                if stamping.is_none_or(|who| who == s) {
                    rev += 1;
                    r.stamped(SweepStamp {
                        by: s.clone(),
                        revision: rev,
                    });
                }
            }
            swept
        };
        // The sweeper stamps: nobody else sweeps.
        for _ in 0..10 {
            assert_eq!(tick_all(&mut r, None), std::slice::from_ref(first));
        }
        // It stops stamping (alive but wedged): the second takes over after
        // STALE_TICKS ticks and sweeps every tick from then on; the third never does,
        // as the second's stamps move.
        let mut swept_by_second = 0;
        for t in 1..=12 {
            let swept = tick_all(&mut r, Some(second.as_str()));
            assert!(!swept.contains(third), "tick {t}: {swept:?}");
            if swept.contains(second) {
                swept_by_second += 1;
            } else {
                assert!(t <= STALE_TICKS as usize, "tick {t}: {swept:?}");
            }
        }
        assert_eq!(swept_by_second, 12 - STALE_TICKS as usize);
        // The sweeper's presence goes: the second is first, without waiting.
        r.remove(first);
        assert_eq!(r.sweeper(third), *second);
        let mut fresh = SweepClock::default();
        assert_eq!(fresh.tick(&r, second), SweepDuty::SweepAsSweeper);
    }
}
