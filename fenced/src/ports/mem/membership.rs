//! The twin's membership: the agent's join ([`JoinStore`]) and leave ([`LeaveStore`]),
//! and the controller's watch of `membership/` ([`MembershipFeed`]) as a revisioned
//! log ([`MemWatch`]).

use std::time::Duration;

use super::MemStore;
use crate::node::NodeId;
use crate::ports::{
    JoinStore, LeaveStore, MembershipChange, MembershipEvent, MembershipFeed, MembershipWatch,
    WatchNext,
};
use crate::store::{BootRecord, Joined, RestartState, StoreError};

impl LeaveStore for MemStore {
    async fn owned_arenas(&self, node: &NodeId) -> Result<Vec<String>, StoreError> {
        self.fault("owned_arenas")?;
        Ok(self
            .state()
            .owned
            .get(node)
            .map(|a| a.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn release_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> Result<bool, StoreError> {
        self.fault("release_arena")?;
        let mut s = self.state();
        let ours = s.membership_revs.get(node) == Some(&membership_rev)
            && s.members.contains_key(node)
            && s.owned.get(node).is_some_and(|a| a.contains(arena));
        if ours {
            s.write();
            if let Some(owned) = s.owned.get_mut(node) {
                owned.remove(arena);
            }
            s.free.insert(arena.to_owned());
        }
        Ok(ours)
    }

    async fn depart(
        &self,
        node: &NodeId,
        instance: &str,
        membership_rev: i64,
        boot: Option<&BootRecord>,
    ) -> Result<bool, StoreError> {
        self.fault("depart")?;
        let live = {
            let mut s = self.state();
            let live = s.members.contains_key(node)
                && s.membership_revs.get(node) == Some(&membership_rev);
            if live {
                let rev = s.write();
                s.delete_member(node, rev);
                s.departed.insert(node.clone(), (instance.to_owned(), rev));
                if let Some(b) = boot {
                    s.boots.insert(node.clone(), b.clone());
                }
            }
            live
        };
        self.wake();
        Ok(live)
    }
}

impl JoinStore for MemStore {
    async fn restart_state(&self, node: &NodeId) -> Result<RestartState, StoreError> {
        self.fault("restart_state")?;
        let s = self.state();
        let (boot, boot_rev) = match s.boot_records.get(node) {
            Some((b, rev)) => (Some(b.clone()), *rev),
            None => (None, 0),
        };
        let (generation, generation_rev) = s.generations.get(node).copied().unwrap_or((0, 0));
        Ok(RestartState {
            boot,
            boot_rev,
            generation,
            generation_rev,
            member: s.members.contains_key(node),
            revision: s.revision,
        })
    }

    async fn grant(&self, ttl: Duration) -> Result<i64, StoreError> {
        self.fault("grant")?;
        let mut s = self.state();
        s.last_lease += 1;
        let lease = s.last_lease;
        s.leases.insert(lease, ttl);
        Ok(lease)
    }

    async fn join(
        &self,
        node: &NodeId,
        instance: &str,
        lease: i64,
        seen: &RestartState,
        boot_id: Option<&str>,
    ) -> Result<Option<Joined>, StoreError> {
        self.fault("join")?;
        let joined = {
            let mut s = self.state();
            let generation_rev = s.generations.get(node).map_or(0, |g| g.1);
            if s.claims.contains_key(node)
                || s.members.contains_key(node)
                || generation_rev != seen.generation_rev
            {
                return Ok(None);
            }
            if !s.leases.contains_key(&lease) {
                return Err(StoreError::LeaseGone {
                    op: "join",
                    source: etcd_client::Error::GRpcStatus(tonic::Status::not_found(format!(
                        "in-memory store: lease {lease} not found (expired or revoked)"
                    ))),
                });
            }
            let rev = s.write();
            s.put_member(node, instance, rev, Some(lease));
            s.pending.remove(node);
            s.done.remove(node);
            s.departed.remove(node);
            s.instances.insert(node.clone(), instance.to_owned());
            if seen.generation_rev == 0 {
                s.generations.insert(node.clone(), (0, rev));
            }
            if let Some(boot_id) = boot_id {
                let record = BootRecord {
                    boot_id: boot_id.to_owned(),
                    generation: seen.generation,
                    by: BootRecord::BY_JOIN.to_owned(),
                };
                s.boot_records.insert(node.clone(), (record, rev));
            }
            Joined {
                membership_rev: rev,
                generation: seen.generation,
            }
        };
        self.wake();
        Ok(Some(joined))
    }

    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        self.fault("revoke")?;
        self.expire_lease(lease);
        Ok(())
    }
}

impl MembershipFeed for MemStore {
    type Watch = MemWatch;

    async fn membership_events(&self, from_rev: i64) -> Result<MemWatch, StoreError> {
        self.fault("watch")?;
        let s = self.state();
        Ok(MemWatch {
            store: self.clone(),
            next_rev: if from_rev > 0 {
                from_rev
            } else {
                s.revision + 1
            },
            epoch: s.watch_epoch,
            written: self.written.subscribe(),
        })
    }
}

/// A watch of the twin's membership log, from a revision.
#[derive(Debug)]
pub struct MemWatch {
    store: MemStore,
    /// The first revision not delivered yet.
    next_rev: i64,
    /// [`MemState::watch_epoch`] when opened.
    epoch: u64,
    written: tokio::sync::watch::Receiver<i64>,
}

impl MemWatch {
    /// What the log holds for this watch now (`None`: nothing yet).
    fn poll(&mut self) -> Option<WatchNext> {
        let s = self.store.state();
        if s.watch_epoch != self.epoch {
            return Some(WatchNext::Closed);
        }
        if self.next_rev < s.compacted {
            return Some(WatchNext::Compacted {
                compact_revision: s.compacted,
            });
        }
        let events: Vec<MembershipEvent> = s
            .membership_log
            .iter()
            .filter(|(rev, _, _)| *rev >= self.next_rev)
            .map(|(rev, node, gone)| MembershipEvent {
                revision: *rev,
                change: match gone {
                    None => MembershipChange::Joined { node: node.clone() },
                    // Decoded as the etcd adapter decodes the previous value.
                    Some(instance) => MembershipChange::Gone {
                        node: node.clone(),
                        instance: Some(crate::instance::from_etcd(instance.as_bytes())),
                    },
                },
            })
            .collect();
        let last = events.last()?.revision;
        self.next_rev = last + 1;
        Some(WatchNext::Events(events))
    }
}

impl MembershipWatch for MemWatch {
    async fn next(&mut self) -> WatchNext {
        loop {
            self.written.borrow_and_update();
            if let Some(next) = self.poll() {
                return next;
            }
            if self.written.changed().await.is_err() {
                return WatchNext::Closed;
            }
        }
    }
}
