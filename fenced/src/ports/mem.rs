//! [`MemStore`]: the fence path's store as plain maps behind a mutex, with the guards
//! of the etcd transactions and injectable errors. Logic only: revisions are one
//! counter, leases expire when a test says so ([`MemStore::expire_lease`]), and there
//! is no concurrency story beyond the mutex. The membership watch is a revisioned
//! event log ([`MembershipFeed`](super::MembershipFeed): resume from a revision,
//! compaction, a watch that ends; in `membership`, with the agent's join and leave).
//! It exists so the controller's decisions (claim lost, departure refused then
//! re-claimed, an unconfirmed fence stays owed) have unit tests, and so an agent's
//! join and a running controller can meet on it (`tests/twin.rs`); whether the
//! protocol holds on etcd is what the other suites in `tests/` show.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::core::{
    BumpOutcome, ClaimFacts, ClaimOutcome, FenceCheck, SweepSnapshot, Victim, claim_outcome,
};
use crate::node::NodeId;
use crate::store::{Abort, BootRecord, ClaimGuard, Finish, StoreError};

use super::FenceStore;

mod membership;

pub use membership::MemWatch;

/// The key space of the fence path, one map per key prefix. Revisions are one
/// counter, bumped by every write, like etcd's.
#[derive(Debug, Default, Clone)]
pub struct MemState {
    /// Store revision (last write).
    pub revision: i64,
    /// `membership/<node>`: instance id.
    pub members: BTreeMap<NodeId, String>,
    /// `create_revision` of `membership/<node>`.
    pub membership_revs: BTreeMap<NodeId, i64>,
    /// `instance/<node>`: instance id of the last join.
    pub instances: BTreeMap<NodeId, String>,
    /// `gen/<node>`: generation and mod revision.
    pub generations: BTreeMap<NodeId, (u64, i64)>,
    /// `fence_pending/<node>`: instance id and mod revision.
    pub pending: BTreeMap<NodeId, (String, i64)>,
    /// `fence_done/<node>`: mod revision.
    pub done: BTreeMap<NodeId, i64>,
    /// `departed/<node>`: instance id and mod revision.
    pub departed: BTreeMap<NodeId, (String, i64)>,
    /// `boot/<node>` as the departure transaction wrote it.
    pub boots: BTreeMap<NodeId, BootRecord>,
    /// `fence_claim/<node>`: controller id and create revision.
    pub claims: BTreeMap<NodeId, (String, i64)>,
    /// `arena_node/<node>/<arena>`.
    pub owned: BTreeMap<NodeId, BTreeSet<String>>,
    /// Free arenas: `arena_pool/<arena>` with no `arena_claim/<arena>/…`.
    pub free: BTreeSet<String>,
    /// `audit/…` records, in write order: (node, generation, failed, JSON).
    pub audit: Vec<(NodeId, u64, bool, String)>,
    /// `controller/sweep_done` as each completed sweep stamped it, in write order.
    pub sweep_stamps: Vec<String>,
    /// Operations performed (successful or refused, not injected failures), by name:
    /// what a unit test counts instead of etcd round trips.
    pub calls: BTreeMap<&'static str, u64>,
    /// The lease each membership is bound to (joins through [`JoinStore`](super::JoinStore)).
    pub member_leases: BTreeMap<NodeId, i64>,
    /// Leases granted and not yet expired or revoked, with their TTL.
    pub leases: BTreeMap<i64, Duration>,
    /// The last lease id granted.
    pub last_lease: i64,
    /// `boot/<node>` as the last join wrote it, with its mod revision.
    pub boot_records: BTreeMap<NodeId, (BootRecord, i64)>,
    /// Every change of `membership/`, in revision order: (revision, node, the instance
    /// a DELETE removed, `None` for a PUT).
    pub membership_log: Vec<(i64, NodeId, Option<String>)>,
    /// Revisions below this one were compacted away: a watch from before it fails.
    pub compacted: i64,
    /// Bumped by [`MemStore::end_watches`]: every watch opened before ends.
    pub watch_epoch: u64,
}

impl MemState {
    fn write(&mut self) -> i64 {
        self.revision += 1;
        self.revision
    }

    /// `membership/<node>` = `instance` at `rev` (on `lease`, when given).
    fn put_member(&mut self, node: &NodeId, instance: &str, rev: i64, lease: Option<i64>) {
        self.members.insert(node.clone(), instance.to_owned());
        self.membership_revs.insert(node.clone(), rev);
        match lease {
            Some(l) => self.member_leases.insert(node.clone(), l),
            None => self.member_leases.remove(node),
        };
        self.membership_log.push((rev, node.clone(), None));
    }

    /// Deletes `membership/<node>` at `rev`; the instance it held, if it was a member.
    fn delete_member(&mut self, node: &NodeId, rev: i64) -> Option<String> {
        let instance = self.members.remove(node)?;
        self.member_leases.remove(node);
        self.membership_log
            .push((rev, node.clone(), Some(instance.clone())));
        Some(instance)
    }

    /// Ends `lease` (expiry or revoke): every membership on it is deleted, at one
    /// revision. Whether the lease existed.
    fn end_lease(&mut self, lease: i64) -> bool {
        if self.leases.remove(&lease).is_none() {
            return false;
        }
        let bound: Vec<NodeId> = self
            .member_leases
            .iter()
            .filter(|(_, l)| **l == lease)
            .map(|(n, _)| n.clone())
            .collect();
        if !bound.is_empty() {
            let rev = self.write();
            for node in &bound {
                self.delete_member(node, rev);
            }
        }
        true
    }
}

/// The in-memory [`FenceStore`]. Clones share the state.
#[derive(Debug, Clone)]
pub struct MemStore {
    state: Arc<Mutex<MemState>>,
    faults: Arc<Mutex<BTreeMap<&'static str, u32>>>,
    claim_ttl: Duration,
    /// The store revision after each write that a watch may want: wakes the watches.
    written: Arc<tokio::sync::watch::Sender<i64>>,
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new()
    }
}

/// An unreachable etcd, as the etcd store reports it (retryable).
fn unavailable(op: &'static str) -> StoreError {
    StoreError::Unavailable {
        op,
        source: etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
            "in-memory store: injected error",
        )),
    }
}

impl MemStore {
    /// An empty store with a 3 s claim TTL.
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            faults: Arc::default(),
            claim_ttl: Duration::from_secs(3),
            written: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Wakes the open watches (after a membership change, a compaction, an end).
    fn wake(&self) {
        let rev = self.state().revision;
        self.written.send_replace(rev);
    }

    /// The state, to set up a test or read it back.
    pub fn state(&self) -> MutexGuard<'_, MemState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next `times` calls of `op` (`claim`, `finish`, `abort`, `drop_stale`,
    /// `sweep_snapshot`, `fence_check`, `stamp_sweep`, `owned_arenas`, `release_arena`,
    /// `depart`, `restart_state`, `grant`, `join`, `revoke`, `watch`) fail as if etcd
    /// were unreachable, writing nothing.
    pub fn fail_next(&self, op: &'static str, times: u32) {
        self.faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(op, times);
    }

    fn fault(&self, op: &'static str) -> Result<(), StoreError> {
        *self.state().calls.entry(op).or_default() += 1;
        let mut f = self
            .faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match f.get_mut(op) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(unavailable(op))
            }
            _ => Ok(()),
        }
    }

    /// `node` joins with `instance` (membership, instance record, generation key);
    /// returns the membership's create revision.
    pub fn join(&self, node: &NodeId, instance: &str) -> i64 {
        let rev = {
            let mut s = self.state();
            let rev = s.write();
            s.put_member(node, instance, rev, None);
            s.instances.insert(node.clone(), instance.to_owned());
            s.generations.entry(node.clone()).or_insert((0, rev));
            rev
        };
        self.wake();
        rev
    }

    /// `node`'s membership lease expired; returns the revision of the DELETE.
    pub fn expire(&self, node: &NodeId) -> i64 {
        let rev = {
            let mut s = self.state();
            let rev = s.write();
            s.delete_member(node, rev);
            rev
        };
        self.wake();
        rev
    }

    /// `lease` ran out (its TTL passed unrenewed): every membership on it is deleted.
    /// Whether the lease existed.
    pub fn expire_lease(&self, lease: i64) -> bool {
        let existed = self.state().end_lease(lease);
        self.wake();
        existed
    }

    /// The lease `node`'s membership is bound to, if it joined on one.
    pub fn lease_of(&self, node: &NodeId) -> Option<i64> {
        self.state().member_leases.get(node).copied()
    }

    /// Compacts the history below `revision`: a watch resuming from before it is told
    /// so ([`WatchNext::Compacted`](super::WatchNext::Compacted)).
    pub fn compact(&self, revision: i64) {
        {
            let mut s = self.state();
            s.compacted = s.compacted.max(revision);
        }
        self.wake();
    }

    /// Ends every open watch ([`WatchNext::Closed`](super::WatchNext::Closed)), like a
    /// lost connection.
    pub fn end_watches(&self) {
        self.state().watch_epoch += 1;
        self.wake();
    }

    /// `node` left cleanly: departure marker written, membership deleted; returns the
    /// revision of the DELETE.
    pub fn mark_departed(&self, node: &NodeId) -> i64 {
        let rev = {
            let mut s = self.state();
            let rev = s.write();
            if let Some(instance) = s.delete_member(node, rev) {
                s.departed.insert(node.clone(), (instance, rev));
            }
            rev
        };
        self.wake();
        rev
    }

    /// `node` owns `arena` (taken from whoever owned it).
    pub fn give_arena(&self, node: &NodeId, arena: &str) {
        let mut s = self.state();
        s.write();
        for owned in s.owned.values_mut() {
            owned.remove(arena);
        }
        s.free.remove(arena);
        s.owned
            .entry(node.clone())
            .or_default()
            .insert(arena.to_owned());
    }

    /// `node`'s generation (0 when never written).
    pub fn generation(&self, node: &NodeId) -> u64 {
        self.state().generations.get(node).map_or(0, |g| g.0)
    }

    /// Whether a fence of `node` is owed (its intent is recorded).
    pub fn owed(&self, node: &NodeId) -> bool {
        self.state().pending.contains_key(node)
    }

    /// Whether a fence claim on `node` is held.
    pub fn claimed(&self, node: &NodeId) -> bool {
        self.state().claims.contains_key(node)
    }

    /// The claim on `node` expires with its lease.
    pub fn expire_claim(&self, node: &NodeId) {
        let mut s = self.state();
        s.write();
        s.claims.remove(node);
    }

    /// How many times `op` was called (each is one etcd request in the product),
    /// failed ones included.
    pub fn calls(&self, op: &'static str) -> u64 {
        self.state().calls.get(op).copied().unwrap_or(0)
    }

    /// Another controller `by` holds the claim on `node`.
    pub fn hold_claim(&self, node: &NodeId, by: &str) {
        let mut s = self.state();
        let rev = s.write();
        s.claims.insert(node.clone(), (by.to_owned(), rev));
    }
}

impl FenceStore for MemStore {
    fn claim_ttl(&self) -> Duration {
        self.claim_ttl
    }

    async fn prepare_claim_lease(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn claim(
        &self,
        victim: &Victim,
        controller: &str,
        guard: ClaimGuard,
    ) -> Result<ClaimOutcome, StoreError> {
        self.fault("claim")?;
        let n = &victim.node;
        let mut s = self.state();
        let rev_of = |m: Option<i64>| m.unwrap_or(0);
        let done_rev = rev_of(s.done.get(n).copied());
        let fenced_since = |deleted_rev: i64| done_rev >= deleted_rev && done_rev > 0;
        let guard_holds = !s.claims.contains_key(n)
            && !s.members.contains_key(n)
            && match guard {
                ClaimGuard::Watch { deleted_rev } => {
                    !s.departed.contains_key(n) && !fenced_since(deleted_rev)
                }
                ClaimGuard::IgnoreDeparture { deleted_rev } => !fenced_since(deleted_rev),
                ClaimGuard::Sweep(g) => {
                    rev_of(s.pending.get(n).map(|p| p.1)) == g.pending_rev
                        && done_rev == g.done_rev
                        && rev_of(s.departed.get(n).map(|d| d.1)) == g.departed_rev
                }
            };
        let arenas: Vec<String> = s
            .owned
            .get(n)
            .map(|a| a.iter().cloned().collect())
            .unwrap_or_default();
        if guard_holds {
            let rev = s.write();
            s.pending.insert(n.clone(), (victim.instance.clone(), rev));
            s.claims.insert(n.clone(), (controller.to_owned(), rev));
            let (generation, generation_rev) = s.generations.get(n).copied().unwrap_or((0, 0));
            return Ok(ClaimOutcome::Won {
                generation,
                generation_rev,
                claim_rev: rev,
                arenas,
                lease_granted: std::time::Instant::now(),
            });
        }
        let facts = ClaimFacts {
            held_by: s.claims.get(n).map(|(by, _)| by.clone()),
            member: s.members.contains_key(n),
            departed: s.departed.contains_key(n),
            arenas: arenas.len(),
            done_rev,
        };
        Ok(claim_outcome(guard, facts))
    }

    async fn finish(&self, req: Finish<'_>) -> Result<BumpOutcome, StoreError> {
        self.fault("finish")?;
        let node = req.node;
        let mut s = self.state();
        let (now, gen_rev) = s.generations.get(node).copied().unwrap_or((0, 0));
        let claim_ok = s.claims.get(node).is_some_and(|c| c.1 == req.claim_rev);
        if gen_rev != req.generation_rev || !claim_ok {
            return Ok(if claim_ok {
                BumpOutcome::GenerationMoved { now }
            } else {
                BumpOutcome::ClaimLost
            });
        }
        let rev = s.write();
        let to = req.from + 1;
        s.generations.insert(node.clone(), (to, rev));
        s.done.insert(node.clone(), rev);
        s.pending.remove(node);
        for arena in req.release.unwrap_or_default() {
            if let Some(owned) = s.owned.get_mut(node) {
                owned.remove(arena);
            }
            s.free.insert(arena.clone());
        }
        s.audit.push((node.clone(), to, false, req.audit_json));
        s.claims.remove(node);
        Ok(BumpOutcome::Bumped)
    }

    async fn abort(&self, req: Abort<'_>) -> Result<(), StoreError> {
        self.fault("abort")?;
        let mut s = self.state();
        s.write();
        if s.claims.get(req.node).is_some_and(|c| c.1 == req.claim_rev) {
            s.claims.remove(req.node);
        }
        s.audit
            .push((req.node.clone(), req.generation, true, req.audit_json));
        Ok(())
    }

    async fn drop_stale(&self, node: &NodeId) -> Result<bool, StoreError> {
        self.fault("drop_stale")?;
        let mut s = self.state();
        if !s.members.contains_key(node) {
            return Ok(false);
        }
        s.write();
        s.pending.remove(node);
        s.done.remove(node);
        Ok(true)
    }

    async fn sweep_snapshot(&self) -> Result<(SweepSnapshot, i64), StoreError> {
        self.fault("sweep_snapshot")?;
        let s = self.state();
        let snap = SweepSnapshot {
            generations: s.generations.clone(),
            pending: s.pending.clone(),
            done: s.done.clone(),
            members: s.members.clone(),
            departed: s.departed.clone(),
            arenas: s
                .owned
                .iter()
                .filter(|(_, a)| !a.is_empty())
                .map(|(n, a)| (n.clone(), a.len()))
                .collect(),
            claims: s.claims.keys().cloned().collect(),
            instances: s.instances.clone(),
            // The twin stores generations as numbers: none can be unreadable.
            unreadable_generations: Default::default(),
        };
        Ok((snap, s.revision))
    }

    async fn fence_check(&self, node: &NodeId) -> Result<FenceCheck, StoreError> {
        self.fault("fence_check")?;
        Ok(self.check(node))
    }

    async fn stamp_sweep(&self, id: &str) -> Result<(), StoreError> {
        self.fault("stamp_sweep")?;
        let mut s = self.state();
        s.write();
        s.sweep_stamps.push(id.to_owned());
        Ok(())
    }
}

impl MemStore {
    fn check(&self, node: &NodeId) -> FenceCheck {
        let s = self.state();
        FenceCheck {
            claimed: s.claims.contains_key(node),
            done_rev: s.done.get(node).copied().unwrap_or(0),
            departed: s.departed.contains_key(node),
            member: s.members.contains_key(node),
        }
    }
}
