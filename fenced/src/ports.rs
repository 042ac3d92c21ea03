//! What the controller's fence and sweep path needs from the store, as one narrow
//! trait ([`FenceStore`]), implemented by [`EtcdStore`] (the product) and by
//! [`mem::MemStore`] (a logic-only twin for unit tests of the controller, like
//! raft-rs's `MemStorage`). Real-etcd tests (`tests/`) remain the evidence that the
//! protocol holds; the in-memory store only exercises the controller's decisions.
//!
//! [`MembershipFeed`] is the controller's membership watch, in the port's own words
//! ([`MembershipEvent`], [`WatchNext`]: a membership joined or gone at a revision,
//! resume from a revision, compaction): the watch and sweep loops run over any
//! `MembershipFeed` (`Controller::spawn_watch_and_sweep`); only the presence loop (a
//! lease and a watch of `controller/`) stays on [`EtcdStore`] (`Controller::spawn`).
//!
//! [`JoinStore`] is the agent's join (restart read, lease grant, the guarded join,
//! revoke) and [`LeaveStore`] its leave (return arenas, depart). The rest of the agent
//! (the lease keepalive stream, arenas at start, its own-membership watch) stays on
//! [`EtcdStore`].
//!
//! The words of these traits are neutral (no etcd type); [`etcd`] reads etcd's watch
//! stream into them and puts [`EtcdStore`] behind the new traits, [`mem`] is the twin.

pub mod etcd;
pub mod mem;

use std::future::Future;
use std::time::Duration;

use crate::core::{BumpOutcome, ClaimOutcome, FenceCheck, SweepSnapshot, Victim};
use crate::instance::InvalidInstanceId;
use crate::node::NodeId;
use crate::store::{
    Abort, BootRecord, ClaimGuard, EtcdStore, Finish, Joined, RestartState, StoreError,
};

/// The store operations of the fence path (`claim` → Fencer → `finish` or `abort`), of
/// the sweep (`sweep_snapshot`, `drop_stale`, `stamp_sweep`) and of a standby
/// (`fence_check`). Every method is one etcd transaction in [`EtcdStore`] (retried
/// inside when its answer is lost), except `sweep_snapshot` past ~1,300 nodes: pages
/// read at one revision.
pub trait FenceStore: Clone + Send + Sync + std::fmt::Debug + 'static {
    /// TTL of the (never renewed) lease a claim is bound to.
    fn claim_ttl(&self) -> Duration;

    /// Pre-grants the spare claim lease, so a claim never waits on a grant.
    fn prepare_claim_lease(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// `record_intent` + `claim` + `read_generation` + read of the victim's arenas,
    /// guarded by `guard`. A refusal is [`ClaimOutcome::Refused`].
    fn claim(
        &self,
        victim: &Victim,
        controller: &str,
        guard: ClaimGuard,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// `bump` + `mark_done` + `clear_intent` + `release_arenas` (when `release` is
    /// given) + audit record + `release_claim`, guarded by the generation compare and
    /// our claim.
    fn finish(
        &self,
        req: Finish<'_>,
    ) -> impl Future<Output = Result<BumpOutcome, StoreError>> + Send;

    /// A failed fence: release our claim (only ours) and write the attempt's audit
    /// record; the intent stays, the fence is still owed.
    fn abort(&self, req: Abort<'_>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Drops the stale intent and fence mark of a live member (`true`: it was a member
    /// and they were dropped).
    fn drop_stale(&self, node: &NodeId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// One read of the key space for the sweep, and its revision.
    fn sweep_snapshot(
        &self,
    ) -> impl Future<Output = Result<(SweepSnapshot, i64), StoreError>> + Send;

    /// A standby's check of `node` before claiming its death: claim held, fence mark,
    /// departure marker, membership (one small read).
    fn fence_check(
        &self,
        node: &NodeId,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// Stamps a completed full sweep by controller `id` (`controller/sweep_done`).
    fn stamp_sweep(&self, id: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// One change of `membership/<node>` the membership watch saw, at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipEvent {
    /// The store revision of the change (the watch resumes after the last one seen).
    pub revision: i64,
    /// What changed.
    pub change: MembershipChange,
}

/// What a [`MembershipEvent`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipChange {
    /// A membership was written (a join).
    Joined {
        /// The member.
        node: NodeId,
    },
    /// A membership is gone (its lease expired or was revoked, or the node departed):
    /// a death, unless a departure marker says otherwise.
    Gone {
        /// The node.
        node: NodeId,
        /// The instance id the membership held, as decoded (`None`: the store did not
        /// say); an id outside the rule is the caller's to handle.
        instance: Option<Result<String, InvalidInstanceId>>,
    },
    /// A key under the membership prefix that names no node: ignored (its revision
    /// still counts).
    Foreign,
}

/// What the membership watch delivers next.
#[derive(Debug)]
pub enum WatchNext {
    /// Changes, in revision order.
    Events(Vec<MembershipEvent>),
    /// The revision the watch started from was compacted away: changes were lost and
    /// resuming from there would fail again.
    Compacted {
        /// The store's compaction revision.
        compact_revision: i64,
    },
    /// The store ended the watch for another reason.
    Canceled {
        /// The store's reason.
        reason: String,
    },
    /// The watch ended without an error (the connection closed).
    Closed,
    /// The watch failed.
    Failed(StoreError),
}

/// An open membership watch ([`MembershipFeed::membership_events`]).
pub trait MembershipWatch: Send + 'static {
    /// Waits for what the watch delivers next.
    fn next(&mut self) -> impl Future<Output = WatchNext> + Send;
}

/// The controller's membership watch: every change of `membership/`, from a revision.
pub trait MembershipFeed: FenceStore {
    /// The open watch.
    type Watch: MembershipWatch;

    /// Opens the membership watch from `from_rev` (0: from now), gone memberships with
    /// the instance id they held.
    fn membership_events(
        &self,
        from_rev: i64,
    ) -> impl Future<Output = Result<Self::Watch, StoreError>> + Send;
}

/// The store operations of the agent's join: the read before any write (the restart
/// rule's facts), the membership lease, the guarded join, and the revoke that gives
/// the lease (and the membership on it) back.
pub trait JoinStore: Clone + Send + Sync + 'static {
    /// `boot/<node>`, `gen/<node>` and whether `node` is a member (one read).
    fn restart_state(
        &self,
        node: &NodeId,
    ) -> impl Future<Output = Result<RestartState, StoreError>> + Send;

    /// Grants a lease of `ttl`.
    fn grant(&self, ttl: Duration) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// `membership/<node>` = `instance` on `lease`, refused (`None`) while a fence
    /// claim on `node` is held, `node` is a member, or its generation moved since
    /// `seen`; records `boot/<node>` when `boot_id` is given.
    fn join(
        &self,
        node: &NodeId,
        instance: &str,
        lease: i64,
        seen: &RestartState,
        boot_id: Option<&str>,
    ) -> impl Future<Output = Result<Option<Joined>, StoreError>> + Send;

    /// Revokes `lease`, deleting every key bound to it.
    fn revoke(&self, lease: i64) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The store operations of the agent's leave, after quiescence: return our arenas,
/// write the departure marker. Each is conditioned on our live membership.
pub trait LeaveStore: Clone + Send + Sync + 'static {
    /// The arenas the records say `node` owns.
    fn owned_arenas(
        &self,
        node: &NodeId,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Gives `arena` back (`false`: not ours, or our membership is gone).
    fn release_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Writes `departed/<node>` (and `boot/<node>` = `boot`, when given) and deletes
    /// our membership (`false`: not a member any more, nothing written).
    fn depart(
        &self,
        node: &NodeId,
        instance: &str,
        membership_rev: i64,
        boot: Option<&BootRecord>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

impl LeaveStore for EtcdStore {
    async fn owned_arenas(&self, node: &NodeId) -> Result<Vec<String>, StoreError> {
        EtcdStore::owned_arenas(self, node).await
    }

    async fn release_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> Result<bool, StoreError> {
        EtcdStore::release_arena(self, node, membership_rev, arena).await
    }

    async fn depart(
        &self,
        node: &NodeId,
        instance: &str,
        membership_rev: i64,
        boot: Option<&BootRecord>,
    ) -> Result<bool, StoreError> {
        EtcdStore::depart(self, node, instance, membership_rev, boot).await
    }
}

impl FenceStore for EtcdStore {
    fn claim_ttl(&self) -> Duration {
        EtcdStore::claim_ttl(self)
    }

    async fn prepare_claim_lease(&self) -> Result<(), StoreError> {
        EtcdStore::prepare_claim_lease(self).await
    }

    async fn claim(
        &self,
        victim: &Victim,
        controller: &str,
        guard: ClaimGuard,
    ) -> Result<ClaimOutcome, StoreError> {
        EtcdStore::claim(self, victim, controller, guard).await
    }

    async fn finish(&self, req: Finish<'_>) -> Result<BumpOutcome, StoreError> {
        EtcdStore::finish(self, req).await
    }

    async fn abort(&self, req: Abort<'_>) -> Result<(), StoreError> {
        EtcdStore::abort(self, req).await
    }

    async fn drop_stale(&self, node: &NodeId) -> Result<bool, StoreError> {
        EtcdStore::drop_stale(self, node).await
    }

    async fn sweep_snapshot(&self) -> Result<(SweepSnapshot, i64), StoreError> {
        EtcdStore::sweep_snapshot(self).await
    }

    async fn fence_check(&self, node: &NodeId) -> Result<FenceCheck, StoreError> {
        EtcdStore::fence_check(self, node).await
    }

    async fn stamp_sweep(&self, id: &str) -> Result<(), StoreError> {
        EtcdStore::stamp_sweep(self, id).await
    }
}
