//! Join only the cluster's namespace: before anything is written to etcd or the
//! device, our device's identity is recorded as the shared namespace (first join) or
//! compared with the recorded one.

use nvme_resv::NamespaceIdentity;

use super::AgentError;
use crate::node::NodeId;
use crate::store::EtcdStore;

/// Records `ours` at `<root>/namespace` unless a namespace is recorded already, then
/// requires them to be the same namespace ([`NamespaceIdentity::same_namespace`]).
/// Returns the recorded identity.
pub async fn check_namespace(
    store: &EtcdStore,
    node: &NodeId,
    ours: &NamespaceIdentity,
) -> Result<NamespaceIdentity, AgentError> {
    let key = store.keys().namespace();
    let (recorded, created) = store.record_namespace(ours).await?;
    if created {
        tracing::info!(step = "namespace", node = %node, key = %key, namespace = %recorded, "first join: recorded the shared namespace");
    }
    if !recorded.same_namespace(ours) {
        return Err(AgentError::WrongNamespace {
            node: node.clone(),
            key,
            recorded: Box::new(recorded),
            ours: Box::new(ours.clone()),
        });
    }
    tracing::info!(step = "namespace", node = %node, namespace = %ours, "our device is the recorded shared namespace");
    Ok(recorded)
}
