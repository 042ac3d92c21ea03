//! Who we are in etcd: `<root>/namespace`, which namespace the cluster shares (recorded
//! by the first join, create-only, compared by every later join and every NVMe fence);
//! and the watch on our own membership key.

use etcd_client::{Txn, TxnOp, WatchOptions, WatchStream};
use nvme_resv::{IdentityKind, MatchRule, NamespaceIdentity};
use serde::{Deserialize, Serialize};

use super::{EtcdStore, Result, StoreError, absent, kvs};
use crate::core::Persistence;
use crate::node::NodeId;

/// The stored form: hex digits as nvme-cli prints them, so an operator can compare
/// with `nvme id-ns` / `nvme ns-descs` / `nvme id-ctrl` by eye, and Linux's `wwid`, as
/// `/sys/block/nvmeXnY/wwid` and `/dev/disk/by-id/nvme-<wwid>` show it.
///
/// `kind` says which identifier the record holds (`uuid`, `nguid`, `eui64`,
/// `vid-serial-model-nsid`, or `none` for an unidentified namespace allowed by
/// `--allow-unidentified-namespace`): a device must report that identifier with the
/// same value. `nguid`, `eui64` and `subnqn` are always written, in the form of the
/// records of fenced versions before `kind` existed, so those versions still read a
/// new record; a record without `kind` is such an old one and is compared as they
/// compared it (NGUID, else EUI-64, else neither: [`MatchRule::NguidEui64`]).
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wwid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uuid: Option<String>,
    nguid: String,
    eui64: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vid: Option<u16>,
    /// Serial number, hex of its bytes (padding removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    serial: Option<String>,
    /// Model number, hex of its bytes (padding removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nsid: Option<u32>,
    subnqn: String,
    /// The device's Persist Through Power Loss as the join that wrote the record found
    /// it (`on`, `available`, `unsupported`, `unknown`; issue 27): informational, never
    /// compared. Absent from records written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    persistence: Option<String>,
}

/// `<root>/namespace` as `fenced status` shows it: the shared namespace's identity and
/// its device's persistence as the first join found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedNamespace {
    /// The identity every join and NVMe fence compares with.
    pub identity: NamespaceIdentity,
    /// The persistence recorded with it.
    pub persistence: RecordedPersistence,
}

/// The persistence field of the namespace record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordedPersistence {
    /// What the device reported at the first join.
    Known(Persistence),
    /// The record predates the field (or was written without a device's answer).
    NotRecorded,
    /// A value this version does not know (a newer version wrote it).
    Unrecognized(String),
}

impl std::fmt::Display for RecordedPersistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Known(p) => write!(f, "{} (as the first join found it)", p.describe()),
            Self::NotRecorded => f.write_str(
                "persistence not recorded (the record predates it; `fenced check --block-device DEV` reads it from the device)",
            ),
            Self::Unrecognized(v) => write!(
                f,
                "persistence recorded as {v:?}, unknown to this version (`fenced check --block-device DEV` reads it from the device)"
            ),
        }
    }
}

impl std::fmt::Display for RecordedNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.identity, self.persistence)
    }
}

fn persistence_text(p: Persistence) -> &'static str {
    match p {
        Persistence::On => "on",
        Persistence::Available => "available",
        Persistence::Unsupported => "unsupported",
        Persistence::Unknown => "unknown",
    }
}

fn recorded_persistence(v: Option<&str>) -> RecordedPersistence {
    let known = [
        Persistence::On,
        Persistence::Available,
        Persistence::Unsupported,
        Persistence::Unknown,
    ];
    match v {
        None => RecordedPersistence::NotRecorded,
        Some(v) => known
            .into_iter()
            .find(|&p| persistence_text(p) == v)
            .map_or_else(
                || RecordedPersistence::Unrecognized(v.to_owned()),
                RecordedPersistence::Known,
            ),
    }
}

/// `kind` of an unidentified namespace's record.
const KIND_NONE: &str = "none";

fn encode(id: &NamespaceIdentity, persistence: Option<Persistence>) -> String {
    let kind = id.kind();
    let serial_based = kind == Some(IdentityKind::VidSerialModelNsid);
    serde_json::to_string(&Stored {
        kind: Some(kind.map_or(KIND_NONE, IdentityKind::as_str).to_owned()),
        wwid: kind.map(|_| id.wwid()),
        uuid: (kind == Some(IdentityKind::Uuid)).then(|| id.uuid_text()),
        nguid: id.nguid_hex(),
        eui64: id.eui64_hex(),
        vid: serial_based.then_some(id.vid),
        serial: serial_based.then(|| id.serial_hex()),
        model: serial_based.then(|| id.model_hex()),
        nsid: serial_based.then_some(id.nsid),
        subnqn: id.subnqn.clone(),
        persistence: persistence.map(|p| persistence_text(p).to_owned()),
    })
    .unwrap_or_default()
}

fn decode(key: &str, value: &[u8]) -> Result<NamespaceIdentity> {
    decode_record(key, value).map(|r| r.identity)
}

/// The record with its persistence; a persistence value this version does not know
/// does not make the record malformed (the identity is what joins and fences use).
fn decode_record(key: &str, value: &[u8]) -> Result<RecordedNamespace> {
    let malformed = |what: String| StoreError::Malformed {
        key: key.to_owned(),
        what,
    };
    let s: Stored = serde_json::from_slice(value).map_err(|e| malformed(e.to_string()))?;
    let mut id = NamespaceIdentity::from_hex(&s.nguid, &s.eui64, s.subnqn)
        .ok_or_else(|| malformed("nguid must be 32 and eui64 16 hex digits".to_owned()))?;
    let persistence = recorded_persistence(s.persistence.as_deref());
    let Some(kind) = s.kind else {
        // Written before records said their kind.
        id.rule = MatchRule::NguidEui64;
        return Ok(RecordedNamespace {
            identity: id,
            persistence,
        });
    };
    if let Some(u) = &s.uuid {
        id.uuid = nvme_resv::identity::parse_uuid(u).ok_or_else(|| {
            malformed(format!("uuid {u:?} is not a UUID (8-4-4-4-12 hex digits)"))
        })?;
    }
    if let Some(serial) = &s.serial {
        let hex = |what: &str, v: Option<&str>| {
            v.and_then(nvme_resv::identity::decode_hex)
                .ok_or_else(|| malformed(format!("{what} must be hex digits")))
        };
        id.serial = hex("serial", Some(serial))?;
        id.model = hex("model", s.model.as_deref())?;
        id.vid = s
            .vid
            .ok_or_else(|| malformed("vid is missing".to_owned()))?;
        id.nsid = s
            .nsid
            .ok_or_else(|| malformed("nsid is missing".to_owned()))?;
    }
    // The fields must name the namespace by the kind the record says it holds.
    let named = id.kind().map_or(KIND_NONE, IdentityKind::as_str);
    if named != kind {
        return Err(malformed(format!(
            "kind is {kind:?} but the fields name the namespace by {named}"
        )));
    }
    Ok(RecordedNamespace {
        identity: id,
        persistence,
    })
}

impl EtcdStore {
    /// This store records `persistence` (what our device reports) with the namespace's
    /// identity when it is the first to record one ([`EtcdStore::record_namespace`]).
    #[must_use]
    pub fn with_namespace_persistence(mut self, persistence: Option<Persistence>) -> Self {
        self.namespace_persistence = persistence;
        self
    }

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
            .and_then(vec![TxnOp::put(
                key.clone(),
                encode(ours, self.namespace_persistence),
                None,
            )])
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
        Ok(self.namespace_record_full().await?.map(|r| r.identity))
    }

    /// The recorded shared namespace with the persistence recorded beside it
    /// (`fenced status`), `None` when no join recorded one yet.
    pub async fn namespace_record_full(&self) -> Result<Option<RecordedNamespace>> {
        self.rt();
        let key = self.keys.namespace();
        let r = self
            .client()
            .get(key.clone(), None)
            .await
            .map_err(|e| StoreError::classify("namespace_record", e))?;
        r.kvs()
            .first()
            .map(|kv| decode_record(&key, kv.value()))
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

    /// The record fenced wrote before records said their kind (issue 14's form).
    const OLD_NGUID_RECORD: &str = r#"{"nguid":"abababababababababababababababab","eui64":"0000000000000000","subnqn":"nqn.2014-08.org.fenced:hwtest"}"#;

    fn uuid_only() -> NamespaceIdentity {
        NamespaceIdentity {
            uuid: [0x3c; 16],
            vid: 0,
            serial: b"1b2c3d4e5f60".to_vec(),
            model: b"Linux".to_vec(),
            nsid: 1,
            subnqn: "nqn.2014-08.org.fenced:hwtest".into(),
            ..NamespaceIdentity::default()
        }
    }

    fn ebs(volume: &str) -> NamespaceIdentity {
        NamespaceIdentity {
            vid: 0x1d0f,
            serial: volume.as_bytes().to_vec(),
            model: b"Amazon Elastic Block Store".to_vec(),
            nsid: 1,
            ..NamespaceIdentity::default()
        }
    }

    #[test]
    fn stored_form_round_trips_and_refuses_garbage() {
        let id = NamespaceIdentity {
            nguid: [0xab; 16],
            eui64: [0; 8],
            subnqn: "nqn.2014-08.org.fenced:hwtest".into(),
            ..NamespaceIdentity::default()
        };
        let v = encode(&id, None);
        // The old record's fields, in its form, after the kind and Linux's name.
        assert_eq!(
            v,
            r#"{"kind":"nguid","wwid":"eui.abababababababababababababababab","nguid":"abababababababababababababababab","eui64":"0000000000000000","subnqn":"nqn.2014-08.org.fenced:hwtest"}"#
        );
        assert_eq!(decode("k", v.as_bytes()).unwrap(), id);
        for bad in [
            &b"not json"[..],
            br#"{"nguid":"ab","eui64":"0000000000000000","subnqn":""}"#,
            br#"{"nguid":"abababababababababababababababab","subnqn":""}"#,
            // A kind the fields do not support, an unknown kind, a bad UUID.
            br#"{"kind":"uuid","nguid":"abababababababababababababababab","eui64":"0000000000000000","subnqn":""}"#,
            br#"{"kind":"wwn","nguid":"abababababababababababababababab","eui64":"0000000000000000","subnqn":""}"#,
            br#"{"kind":"uuid","uuid":"3c3c","nguid":"00000000000000000000000000000000","eui64":"0000000000000000","subnqn":""}"#,
            br#"{"kind":"vid-serial-model-nsid","serial":"zz","model":"41","vid":1,"nsid":1,"nguid":"00000000000000000000000000000000","eui64":"0000000000000000","subnqn":""}"#,
            br#"{"kind":"vid-serial-model-nsid","serial":"41","model":"41","nsid":1,"nguid":"00000000000000000000000000000000","eui64":"0000000000000000","subnqn":""}"#,
        ] {
            assert!(
                matches!(decode("k", bad), Err(StoreError::Malformed { .. })),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn each_kind_is_recorded_and_read_back() {
        let u = uuid_only();
        let v = encode(&u, None);
        assert!(
            v.starts_with(r#"{"kind":"uuid","wwid":"uuid.3c3c3c3c-3c3c-3c3c-3c3c-3c3c3c3c3c3c","uuid":"3c3c3c3c-3c3c-3c3c-3c3c-3c3c3c3c3c3c","nguid":"#),
            "{v}"
        );
        let back = decode("k", v.as_bytes()).unwrap();
        assert!(back.same_namespace(&u));
        assert_eq!(back.kind(), Some(IdentityKind::Uuid));
        let mut other = u.clone();
        other.uuid[0] = 1;
        assert!(!back.same_namespace(&other));

        let a = ebs("vol0123456789abcdef0");
        let v = encode(&a, None);
        assert!(v.contains(r#""kind":"vid-serial-model-nsid""#), "{v}");
        assert!(
            v.contains(r#""vid":7439,"serial":"766f6c30313233343536373839616263646566"#),
            "{v}"
        );
        let back = decode("k", v.as_bytes()).unwrap();
        assert_eq!(back, a);
        assert!(back.same_namespace(&a));
        assert!(!back.same_namespace(&ebs("vol0fedcba9876543210")));

        let none = NamespaceIdentity::default();
        let v = encode(&none, None);
        assert!(v.starts_with(r#"{"kind":"none","nguid""#), "{v}");
        assert_eq!(decode("k", v.as_bytes()).unwrap(), none);
    }

    /// Upgrade: a record written before this version, read by it, is compared as it
    /// was; the same device now also reports a UUID (nvmet always has one).
    #[test]
    fn an_old_nguid_record_still_matches_its_device() {
        let old = decode("k", OLD_NGUID_RECORD.as_bytes()).unwrap();
        assert_eq!(old.rule, MatchRule::NguidEui64);
        assert_eq!(
            old.to_string(),
            "NGUID abababababababababababababababab in nqn.2014-08.org.fenced:hwtest"
        );
        let mut now = uuid_only();
        now.nguid = [0xab; 16];
        assert_eq!(now.kind(), Some(IdentityKind::Uuid));
        assert!(old.same_namespace(&now));
        now.nguid[15] = 0;
        assert!(!old.same_namespace(&now));
        // A version before this one reads the new record's NGUID as it always did.
        #[derive(Deserialize)]
        struct Old {
            nguid: String,
            eui64: String,
            subnqn: String,
        }
        let mut id = uuid_only();
        id.nguid = [0xab; 16];
        let o: Old = serde_json::from_str(&encode(&id, Some(Persistence::Unsupported))).unwrap();
        assert_eq!(
            (o.nguid.as_str(), o.eui64.as_str(), o.subnqn.as_str()),
            (
                "abababababababababababababababab",
                "0000000000000000",
                "nqn.2014-08.org.fenced:hwtest"
            )
        );
    }

    /// Issue 27 section 2: the record carries the device's persistence; a record
    /// without it (every record before it) still decodes, with "not recorded"; a value
    /// a newer version wrote leaves the identity usable.
    #[test]
    fn persistence_is_recorded_and_old_records_still_decode() {
        let u = uuid_only();
        for (p, text) in [
            (Persistence::On, "on"),
            (Persistence::Available, "available"),
            (Persistence::Unsupported, "unsupported"),
            (Persistence::Unknown, "unknown"),
        ] {
            let v = encode(&u, Some(p));
            assert!(v.ends_with(&format!(r#","persistence":"{text}"}}"#)), "{v}");
            let r = decode_record("k", v.as_bytes()).unwrap();
            assert_eq!(r.identity, decode("k", v.as_bytes()).unwrap());
            assert!(r.identity.same_namespace(&u));
            assert_eq!(r.persistence, RecordedPersistence::Known(p));
        }
        let r = decode_record("k", encode(&u, Some(Persistence::Unsupported)).as_bytes()).unwrap();
        assert_eq!(
            r.to_string(),
            format!(
                "{}; {} (as the first join found it)",
                u,
                Persistence::Unsupported.describe()
            )
        );
        let old = decode_record("k", OLD_NGUID_RECORD.as_bytes()).unwrap();
        assert_eq!(old.persistence, RecordedPersistence::NotRecorded);
        assert!(
            old.to_string().contains("; persistence not recorded"),
            "{old}"
        );
        let newer = OLD_NGUID_RECORD.replace(r#""subnqn""#, r#""persistence":"mirrored","subnqn""#);
        let r = decode_record("k", newer.as_bytes()).unwrap();
        assert_eq!(
            r.identity,
            decode("k", OLD_NGUID_RECORD.as_bytes()).unwrap()
        );
        assert_eq!(
            r.persistence,
            RecordedPersistence::Unrecognized("mirrored".into())
        );
        // Not a string: malformed, as any mistyped field.
        let bad = OLD_NGUID_RECORD.replace(r#""subnqn""#, r#""persistence":1,"subnqn""#);
        assert!(matches!(
            decode_record("k", bad.as_bytes()),
            Err(StoreError::Malformed { .. })
        ));
    }
}
