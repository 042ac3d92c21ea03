//! The etcd adapter's side of the membership watch and the agent's join: etcd's watch
//! stream read as [`MembershipEvent`]s ([`EtcdMembershipWatch`]), and [`EtcdStore`]'s
//! join transactions behind [`JoinStore`].

use std::time::Duration;

use etcd_client::{EventType, WatchStream};

use super::{
    JoinStore, MembershipChange, MembershipEvent, MembershipFeed, MembershipWatch, WatchNext,
};
use crate::keys::Keys;
use crate::node::NodeId;
use crate::store::{EtcdStore, Joined, RestartState, StoreError};

/// etcd's membership watch stream, read as [`MembershipEvent`]s: the key decoded to a
/// node, the previous value of a DELETE decoded to an instance id.
pub struct EtcdMembershipWatch {
    stream: WatchStream,
    keys: Keys,
}

impl std::fmt::Debug for EtcdMembershipWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMembershipWatch")
            .finish_non_exhaustive()
    }
}

impl MembershipWatch for EtcdMembershipWatch {
    async fn next(&mut self) -> WatchNext {
        let msg = match self.stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return WatchNext::Closed,
            Err(e) => return WatchNext::Failed(StoreError::classify("watch", e)),
        };
        if msg.canceled() {
            return if msg.compact_revision() > 0 {
                WatchNext::Compacted {
                    compact_revision: msg.compact_revision(),
                }
            } else {
                WatchNext::Canceled {
                    reason: msg.cancel_reason().to_owned(),
                }
            };
        }
        let prefix = self.keys.membership_prefix();
        let events = msg
            .events()
            .iter()
            .filter_map(|ev| {
                let kv = ev.kv()?;
                let change = match self.keys.node_of(&prefix, kv.key()) {
                    None => MembershipChange::Foreign,
                    Some(node) if ev.event_type() == EventType::Delete => MembershipChange::Gone {
                        node,
                        instance: ev.prev_kv().map(|p| crate::instance::from_etcd(p.value())),
                    },
                    Some(node) => MembershipChange::Joined { node },
                };
                Some(MembershipEvent {
                    revision: kv.mod_revision(),
                    change,
                })
            })
            .collect();
        WatchNext::Events(events)
    }
}

impl MembershipFeed for EtcdStore {
    type Watch = EtcdMembershipWatch;

    async fn membership_events(&self, from_rev: i64) -> Result<EtcdMembershipWatch, StoreError> {
        Ok(EtcdMembershipWatch {
            stream: self.watch_membership(from_rev).await?,
            keys: self.keys().clone(),
        })
    }
}

impl JoinStore for EtcdStore {
    async fn restart_state(&self, node: &NodeId) -> Result<RestartState, StoreError> {
        EtcdStore::restart_state(self, node).await
    }

    async fn grant(&self, ttl: Duration) -> Result<i64, StoreError> {
        EtcdStore::grant(self, ttl).await
    }

    async fn join(
        &self,
        node: &NodeId,
        instance: &str,
        lease: i64,
        seen: &RestartState,
        boot_id: Option<&str>,
    ) -> Result<Option<Joined>, StoreError> {
        EtcdStore::join(self, node, instance, lease, seen, boot_id).await
    }

    async fn revoke(&self, lease: i64) -> Result<(), StoreError> {
        EtcdStore::revoke(self, lease).await
    }
}
