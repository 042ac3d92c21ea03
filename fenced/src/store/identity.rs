//! Who we are in etcd: `<root>/namespace`, which namespace the cluster shares (recorded
//! by the first join, create-only, compared by every later join and every NVMe fence);
//! and the watch on our own membership key.

use etcd_client::{Txn, TxnOp, WatchOptions, WatchStream};
use nvme_resv::NamespaceIdentity;
use serde::{Deserialize, Serialize};

use super::{EtcdStore, Result, StoreError, absent, kvs};
use crate::node::NodeId;

/// The stored form: hex digits as nvme-cli prints them, so an operator can compare
/// with `nvme id-ns` / `nvme id-ctrl` by eye.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    nguid: String,
    eui64: String,
    subnqn: String,
}

fn encode(id: &NamespaceIdentity) -> String {
    serde_json::to_string(&Stored {
        nguid: id.nguid_hex(),
        eui64: id.eui64_hex(),
        subnqn: id.subnqn.clone(),
    })
    .unwrap_or_default()
}

fn decode(key: &str, value: &[u8]) -> Result<NamespaceIdentity> {
    let malformed = |what: String| StoreError::Malformed {
        key: key.to_owned(),
        what,
    };
    let s: Stored = serde_json::from_slice(value).map_err(|e| malformed(e.to_string()))?;
    NamespaceIdentity::from_hex(&s.nguid, &s.eui64, s.subnqn)
        .ok_or_else(|| malformed("nguid must be 32 and eui64 16 hex digits".to_owned()))
}

impl EtcdStore {
    /// Records `ours` as the shared namespace unless one is recorded already, in one
    /// transaction. Returns the recorded identity (ours when we created it) and whether
    /// we created it.
    pub async fn record_namespace(
        &self,
        ours: &NamespaceIdentity,
    ) -> Result<(NamespaceIdentity, bool)> {
        let key = self.keys.namespace();
        let txn = Txn::new()
            .when(vec![absent(key.clone())])
            .and_then(vec![TxnOp::put(key.clone(), encode(ours), None)])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let resp = self.txn("record_namespace", txn).await?;
        if resp.succeeded() {
            return Ok((ours.clone(), true));
        }
        let ops = resp.op_responses();
        match ops.first().and_then(|op| kvs(op).first().cloned()) {
            Some(kv) => Ok((decode(&key, kv.value())?, false)),
            // Deleted between the compare and the get of the same transaction cannot
            // happen; an empty answer is malformed, not "absent".
            None => Err(StoreError::Malformed {
                key,
                what: "transaction said present but returned no value".to_owned(),
            }),
        }
    }

    /// The recorded shared namespace, `None` when no join recorded one yet.
    pub async fn namespace_record(&self) -> Result<Option<NamespaceIdentity>> {
        self.rt();
        let key = self.keys.namespace();
        let r = self
            .client()
            .get(key.clone(), None)
            .await
            .map_err(|e| StoreError::classify("namespace_record", e))?;
        r.kvs()
            .first()
            .map(|kv| decode(&key, kv.value()))
            .transpose()
    }
}

impl EtcdStore {
    /// Watches `membership/<node>` alone from `start_rev` (our join's revision, so a
    /// deletion between the join and the watch is not missed).
    pub async fn watch_own_membership(&self, node: &NodeId, start_rev: i64) -> Result<WatchStream> {
        self.rt();
        let opts = WatchOptions::new().with_start_revision(start_rev);
        self.client()
            .watch(self.keys.membership(node), Some(opts))
            .await
            .map_err(|e| StoreError::classify("watch_own_membership", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_form_round_trips_and_refuses_garbage() {
        let id = NamespaceIdentity {
            nguid: [0xab; 16],
            eui64: [0; 8],
            subnqn: "nqn.2014-08.org.fenced:hwtest".into(),
            ..NamespaceIdentity::default()
        };
        let v = encode(&id);
        assert_eq!(
            v,
            r#"{"nguid":"abababababababababababababababab","eui64":"0000000000000000","subnqn":"nqn.2014-08.org.fenced:hwtest"}"#
        );
        assert_eq!(decode("k", v.as_bytes()).unwrap(), id);
        for bad in [
            &b"not json"[..],
            br#"{"nguid":"ab","eui64":"0000000000000000","subnqn":""}"#,
            br#"{"nguid":"abababababababababababababababab","subnqn":""}"#,
        ] {
            assert!(
                matches!(decode("k", bad), Err(StoreError::Malformed { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
