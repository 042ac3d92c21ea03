//! The agent watches its own membership key. When it disappears while we run — its
//! lease expired, or anyone deleted it — the peers treat this node as dead and fence
//! it; with `--fencer none` or EBS nothing on the device stops our writes, so we stop
//! them ourselves. Our own leave stops watching before it deletes the key.

use std::time::Duration;

use etcd_client::EventType;

use crate::node::NodeId;
use crate::store::EtcdStore;

/// Resolves (with the reason) only when `membership/<node>` created at
/// `membership_rev` is gone: deleted, or replaced by another creation. Reconnects after
/// watch failures from the last revision seen, so no event is skipped; after a
/// compaction it asks etcd directly.
pub async fn lost(store: EtcdStore, node: NodeId, membership_rev: i64) -> String {
    let key = store.keys().membership(&node);
    let mut from = membership_rev;
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut stream = match store.watch_own_membership(&node, from).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(node = %node, error = %e, ?backoff, "watch of our own membership failed, retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "watch of our own membership broke, reconnecting");
                    break;
                }
            };
            backoff = Duration::from_millis(100);
            if msg.canceled() {
                if msg.compact_revision() > 0 {
                    match store.is_member(&node, membership_rev).await {
                        Ok(false) => {
                            return format!(
                                "our membership {key} (created at revision {membership_rev}) is gone (found after a watch compaction): peers fence this node"
                            );
                        }
                        Ok(true) => from = msg.compact_revision(),
                        Err(e) => {
                            tracing::warn!(node = %node, error = %e, "cannot read our own membership after a watch compaction, retrying");
                        }
                    }
                }
                break;
            }
            for ev in msg.events() {
                let Some(kv) = ev.kv() else { continue };
                from = from.max(kv.mod_revision() + 1);
                match ev.event_type() {
                    EventType::Delete => {
                        return format!(
                            "our membership {key} was deleted at revision {} while we ran (lease expired or deleted by someone; not our leave): peers fence this node",
                            kv.mod_revision()
                        );
                    }
                    EventType::Put if kv.create_revision() != membership_rev => {
                        return format!(
                            "our membership {key} was replaced at revision {} (created again, not by this agent): peers fence this node",
                            kv.mod_revision()
                        );
                    }
                    EventType::Put => {}
                }
            }
        }
        tokio::time::sleep(backoff).await;
    }
}
