//! What a client can tell about etcd's history and space, and what fenced needs of
//! them (README, "etcd compaction and quota").
//!
//! Every write to etcd keeps a revision of history until etcd compacts it, and the
//! database file keeps the space of compacted revisions until it is defragmented.
//! When the file reaches `--quota-backend-bytes` etcd raises its NOSPACE alarm and
//! refuses every write — a fence's claim and bump included — until an operator
//! compacts, defragments and disarms the alarm. Compaction is etcd's job
//! (`--auto-compaction-mode`/`--auto-compaction-retention`); fenced only checks, once
//! at `fenced run` start and in `fenced check`, the three things a client can see:
//!
//! - the alarms (`Maintenance.Alarm` GET): NOSPACE or CORRUPT raised;
//! - whether history was ever compacted: a read at revision 1 answers "compacted"
//!   once any compaction ran, and otherwise succeeds — then the current revision is
//!   the number of revisions kept;
//! - the answering member's database file against the space in use
//!   (`Maintenance.Status` `dbSize`, `dbSizeInUse`; etcd 3.6 also reports its quota).
//!
//! The verdict, [`judge_space`], is pure; [`EtcdStore::space_report`] gathers the
//! facts and leaves out what etcd would not tell (an older server, a role without the
//! permission).

use etcd_client::{AlarmAction, AlarmType, GetOptions};

use super::{EtcdStore, Result, StoreError};

/// A history this long, never compacted, is worth a warning: with the default
/// 2 GiB quota and records of ~100 bytes, a few million revisions fill it.
pub const HISTORY_WARNING_REVISIONS: i64 = 1_000_000;

/// Warn when the database file is at least this large and more than half of it is
/// free space that only a defragmentation gives back.
const DEFRAG_WARNING_BYTES: i64 = 256 << 20;

/// Warn when the database file holds this share (percent) of etcd's reported quota.
const QUOTA_WARNING_PERCENT: i64 = 80;

/// What etcd told about its history and space; `None` where it would not tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpaceReport {
    /// Alarms raised (member id, alarm), `None` when the alarm list could not be read.
    pub alarms: Option<Vec<(u64, Alarm)>>,
    /// The store's current revision.
    pub revision: i64,
    /// A read at revision 1 answered "compacted": some compaction ran. `None`: the
    /// read failed otherwise.
    pub compacted: Option<bool>,
    /// The answering member's database file size (bytes, 0 when not reported).
    pub db_size: i64,
    /// Of which in use (bytes; 0 when not reported, etcd before 3.4).
    pub db_size_in_use: i64,
    /// The member's `--quota-backend-bytes` (0 when not reported, etcd before 3.6).
    pub db_size_quota: i64,
    /// The answering member's etcd version (`3.4.23`; empty when not reported).
    pub version: String,
}

/// When etcd `version` lacks the fix for a stalled leader revoking live leases
/// (etcd-io/etcd#15247, fixed by PR #16822 in 3.4.31 and 3.5.13), the warning to give;
/// `None` for a fixed or unknown version. Without the fix a leader that stalls longer
/// than a lease TTL and resumes can revoke every lease it saw no renewal for: healthy
/// nodes drop out, self-fence and are fenced (safe, but an outage; README: etcd
/// versions).
pub fn lease_revocation_warning(version: &str) -> Option<String> {
    let mut parts = version.trim().split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let fixed = match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    };
    (!fixed).then(|| {
        format!(
            "etcd {version} lacks the fix for a stalled leader revoking live leases (etcd-io/etcd#15247, in 3.4.31 and 3.5.13): a leader that stalls longer than the lease TTL can drop healthy nodes, which then self-fence and are fenced; upgrade etcd (README: etcd versions)"
        )
    })
}

/// An etcd alarm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alarm {
    /// The backend quota is exhausted: etcd refuses every write.
    NoSpace,
    /// etcd found its store corrupt.
    Corrupt,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpaceLevel {
    /// Fences will fail until an operator acts (`fenced run` refuses to start).
    Error,
    /// Fences work now; act before they do not.
    Warning,
}

/// One finding about etcd's space, with what to do, in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceFinding {
    /// How bad.
    pub level: SpaceLevel,
    /// What, why it matters and what to do.
    pub text: String,
}

/// The verdict on `r`: errors first. `history_warning` is the number of revisions a
/// never-compacted history may hold before it is a warning
/// ([`HISTORY_WARNING_REVISIONS`] by default).
pub fn judge_space(r: &SpaceReport, history_warning: i64) -> Vec<SpaceFinding> {
    let mut out = Vec::new();
    let mib = |b: i64| b / (1 << 20);
    for (member, alarm) in r.alarms.iter().flatten() {
        let text = match alarm {
            Alarm::NoSpace => format!(
                "etcd member {member:x} raised its NOSPACE alarm: its database reached --quota-backend-bytes, so etcd refuses every write and no fence can be recorded; compact (`etcdctl compact <revision>`), defragment each member (`etcdctl defrag`), then `etcdctl alarm disarm` (README: etcd compaction and quota)"
            ),
            Alarm::Corrupt => format!(
                "etcd member {member:x} raised its CORRUPT alarm: it found its data inconsistent with the cluster's and refuses writes; restore that member from a healthy one (etcd's disaster recovery guide)"
            ),
        };
        out.push(SpaceFinding {
            level: SpaceLevel::Error,
            text,
        });
    }
    if r.compacted == Some(false) && r.revision >= history_warning {
        out.push(SpaceFinding {
            level: SpaceLevel::Warning,
            text: format!(
                "etcd never compacted its history ({} revisions kept): its database grows until the NOSPACE alarm stops every fence; run etcd with --auto-compaction-mode=periodic --auto-compaction-retention=1h (or compact it yourself) and defragment (README: etcd compaction and quota)",
                r.revision
            ),
        });
    }
    if r.db_size_quota > 0 && r.db_size >= r.db_size_quota / 100 * QUOTA_WARNING_PERCENT {
        out.push(SpaceFinding {
            level: SpaceLevel::Warning,
            text: format!(
                "etcd's database file is {} MiB of its {} MiB quota: at the quota etcd refuses every write, fences included; compact and defragment (`etcdctl defrag`) or raise --quota-backend-bytes",
                mib(r.db_size),
                mib(r.db_size_quota)
            ),
        });
    } else if r.db_size_in_use > 0
        && r.db_size >= DEFRAG_WARNING_BYTES
        && r.db_size > 2 * r.db_size_in_use
    {
        out.push(SpaceFinding {
            level: SpaceLevel::Warning,
            text: format!(
                "etcd's database file is {} MiB with {} MiB in use: the rest counts against --quota-backend-bytes until each member is defragmented (`etcdctl defrag`)",
                mib(r.db_size),
                mib(r.db_size_in_use)
            ),
        });
    }
    out.sort_by_key(|f| f.level);
    out
}

impl EtcdStore {
    /// Reads what [`judge_space`] looks at: the alarm list, a one-key read at
    /// revision 1 under the root (compacted or not), and the answering member's
    /// status. Writes nothing. Only a failure of the status call (the one that
    /// proves etcd answers) is an error; the alarm list and the old read are left
    /// `None` when etcd refuses them (a role without the permission).
    pub async fn space_report(&self) -> Result<SpaceReport> {
        self.rt();
        let status = self
            .client()
            .status()
            .await
            .map_err(|e| StoreError::classify("status", e))?;
        self.rt();
        let alarms = match self
            .client()
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
        {
            Ok(a) => Some(
                a.alarms()
                    .iter()
                    .filter_map(|m| match m.alarm() {
                        AlarmType::Nospace => Some((m.member_id(), Alarm::NoSpace)),
                        AlarmType::Corrupt => Some((m.member_id(), Alarm::Corrupt)),
                        AlarmType::None => None,
                    })
                    .collect(),
            ),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read etcd's alarms");
                None
            }
        };
        self.rt();
        let old = self
            .client()
            .get(
                self.keys.root(),
                Some(GetOptions::new().with_revision(1).with_count_only()),
            )
            .await
            .map_err(|e| StoreError::classify("read_at_revision_1", e));
        let (compacted, revision) = match old {
            Ok(r) => (Some(false), r.header().map_or(0, |h| h.revision())),
            Err(e) if e.is_compacted() => (Some(true), 0),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read at revision 1");
                (None, 0)
            }
        };
        let revision = if revision > 0 {
            revision
        } else {
            status.header().map_or(0, |h| h.revision())
        };
        Ok(SpaceReport {
            alarms,
            revision,
            compacted,
            db_size: status.db_size(),
            db_size_in_use: status.raft_used_db_size(),
            db_size_quota: status.db_size_quota(),
            version: status.version().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> SpaceReport {
        SpaceReport {
            alarms: Some(Vec::new()),
            revision: 5_000_000,
            compacted: Some(true),
            db_size: 300 << 20,
            db_size_in_use: 200 << 20,
            db_size_quota: 0,
            version: "3.5.16".into(),
        }
    }

    #[test]
    fn versions_without_the_lease_revocation_fix_are_named() {
        for old in ["3.4.23", "3.4.30", "3.5.0", "3.5.12", "3.3.27", "2.3.8"] {
            let w = lease_revocation_warning(old).unwrap_or_else(|| panic!("{old}"));
            assert!(w.starts_with(&format!("etcd {old} lacks the fix")), "{w}");
        }
        for fixed in [
            "3.4.31",
            "3.4.35",
            "3.5.13",
            "3.5.16",
            "3.6.0",
            "4.0.0",
            "3.5.13-rc1",
        ] {
            assert_eq!(lease_revocation_warning(fixed), None, "{fixed}");
        }
        // Not reported, or not a version: no claim either way.
        for unknown in ["", "3.5", "x.y.z", "3..1"] {
            assert_eq!(lease_revocation_warning(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn a_compacted_defragmented_etcd_without_alarms_is_fine() {
        assert_eq!(judge_space(&healthy(), HISTORY_WARNING_REVISIONS), []);
        // Nothing known is nothing to report.
        assert_eq!(
            judge_space(&SpaceReport::default(), HISTORY_WARNING_REVISIONS),
            []
        );
    }

    #[test]
    fn an_alarm_is_an_error_that_says_what_to_do() {
        let r = SpaceReport {
            alarms: Some(vec![(0xabc, Alarm::NoSpace), (0xdef, Alarm::Corrupt)]),
            compacted: Some(false),
            revision: 2_000_000,
            ..healthy()
        };
        let f = judge_space(&r, HISTORY_WARNING_REVISIONS);
        assert_eq!(f.len(), 3, "{f:?}");
        assert_eq!(f[0].level, SpaceLevel::Error);
        assert!(f[0].text.contains("member abc raised its NOSPACE alarm"));
        assert!(f[0].text.contains("etcdctl alarm disarm"), "{}", f[0].text);
        assert!(f[1].text.contains("CORRUPT"), "{}", f[1].text);
        assert_eq!(f[2].level, SpaceLevel::Warning);
        assert!(f.iter().all(|f| !f.text.contains('\n')));
    }

    #[test]
    fn a_long_history_never_compacted_is_a_warning() {
        let r = SpaceReport {
            compacted: Some(false),
            revision: HISTORY_WARNING_REVISIONS,
            ..healthy()
        };
        let f = judge_space(&r, HISTORY_WARNING_REVISIONS);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].level, SpaceLevel::Warning);
        assert!(
            f[0].text
                .starts_with("etcd never compacted its history (1000000 revisions kept)")
                && f[0].text.contains("--auto-compaction-mode"),
            "{}",
            f[0].text
        );
        // Shorter, compacted, or unknown: no warning.
        for r in [
            SpaceReport {
                revision: HISTORY_WARNING_REVISIONS - 1,
                ..r.clone()
            },
            SpaceReport {
                compacted: Some(true),
                ..r.clone()
            },
            SpaceReport {
                compacted: None,
                ..r.clone()
            },
        ] {
            assert_eq!(judge_space(&r, HISTORY_WARNING_REVISIONS), [], "{r:?}");
        }
    }

    #[test]
    fn free_space_to_defragment_and_a_near_quota_are_warnings() {
        let r = SpaceReport {
            db_size: 600 << 20,
            db_size_in_use: 100 << 20,
            ..healthy()
        };
        let f = judge_space(&r, HISTORY_WARNING_REVISIONS);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].text.contains("600 MiB with 100 MiB in use"),
            "{}",
            f[0].text
        );
        // A small file is not worth a defragmentation.
        let small = SpaceReport {
            db_size: 20 << 20,
            db_size_in_use: 1 << 20,
            ..healthy()
        };
        assert_eq!(judge_space(&small, HISTORY_WARNING_REVISIONS), []);
        // etcd 3.6 reports its quota: 85% of it is a warning (which subsumes defrag).
        let near = SpaceReport {
            db_size_quota: 700 << 20,
            ..r
        };
        let f = judge_space(&near, HISTORY_WARNING_REVISIONS);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].text.contains("600 MiB of its 700 MiB quota"),
            "{}",
            f[0].text
        );
    }
}
