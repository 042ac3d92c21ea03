//! What the controller's fence and sweep path needs from the store, as one narrow
//! trait ([`FenceStore`]), implemented by [`EtcdStore`] (the product) and by
//! [`mem::MemStore`] (a logic-only twin for unit tests of the controller, like
//! raft-rs's `MemStorage`). Real-etcd tests (`tests/`) remain the evidence that the
//! protocol holds; the in-memory store only exercises the controller's decisions.
//!
//! [`LeaveStore`] is the agent's leave (return arenas, depart). The rest of the agent
//! (join, the lease keepalive stream, the device) stays on [`EtcdStore`], as do the
//! membership watch (a stream of etcd-client types): `Controller::spawn` (the watch
//! loop) exists only for `Controller<EtcdStore>`.

pub mod mem;

use std::future::Future;
use std::time::Duration;

use crate::core::{BumpOutcome, ClaimOutcome, FenceCheck, SweepSnapshot, Victim};
use crate::node::NodeId;
use crate::store::{Abort, BootRecord, ClaimGuard, EtcdStore, Finish, StoreError};

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
