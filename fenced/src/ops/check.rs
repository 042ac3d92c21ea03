//! `fenced check`: a monitoring-plugin style check (Nagios, Icinga, Sensu, a
//! Prometheus textfile script): one summary line, exit 0 OK, 1 WARNING, 2 CRITICAL,
//! 3 UNKNOWN. It reads the one status read, probes each endpoint once and asks etcd
//! about its alarms, history and database size (`fenced::store::space`); nothing is
//! written.

use std::fmt;
use std::process::ExitCode;

use fenced::store::{
    HISTORY_WARNING_REVISIONS, NodeRow, SpaceFinding, SpaceLevel, Status, StoreOptions,
    judge_space, probe_endpoints,
};

use super::OpError;
use crate::config::{self, EtcdArgs, EtcdSettings};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// WARNING when a fence has been owed this long: seconds since the node's last
    /// liveness stamp. The agent refreshes that stamp only every 30 s (not at every
    /// renewal), so a node that just died already counts up to ~35 s (refresh and
    /// TTL): the default stays above that plus a normal fence.
    #[arg(long, default_value_t = 45)]
    owed_warning_secs: u64,
    /// CRITICAL when a fence has been owed this long (same count; default: a fence
    /// stuck for 1.5 to 2 minutes, an EBS force-detach included).
    #[arg(long, default_value_t = 120)]
    owed_critical_secs: u64,
    /// WARNING when fewer nodes than this hold membership.
    #[arg(long)]
    expect_members: Option<usize>,
    /// WARNING when etcd never compacted its history and keeps at least this many
    /// revisions (README: etcd compaction and quota).
    #[arg(long, default_value_t = HISTORY_WARNING_REVISIONS)]
    history_warning_revisions: i64,
    /// Do not warn that this exact etcd version lacks the stalled-leader lease fix
    /// (README: etcd versions), once you have read why and accepted the risk, e.g.
    /// `3.4.23` on Debian 12. Any other version still warns, so an etcd upgrade or
    /// downgrade is judged again.
    #[arg(long, value_name = "VERSION")]
    accept_etcd_version: Option<String>,
    /// Also read the shared namespace through this device (needs the rights `fenced
    /// run` has): WARNING when it cannot keep registrations and the reservation
    /// through a target restart or power loss (no Persist Through Power Loss: RESCAP
    /// bit 0, Get Features 83h), as the kernel NVMe target cannot.
    #[arg(long, value_name = "PATH")]
    block_device: Option<std::path::PathBuf>,
}

/// What `--block-device` adds to the check: a WARNING when the device cannot persist
/// (or its persistence could not be read), nothing when it can.
fn persistence_finding(
    path: &std::path::Path,
    read: Result<fenced::core::Persistence, String>,
) -> Option<SpaceFinding> {
    let text = match read {
        Ok(p) if !p.warn() => return None,
        Ok(p) => format!("{}: {}", path.display(), p.describe()),
        Err(e) => format!("{}: cannot read its persistence: {e}", path.display()),
    };
    Some(SpaceFinding {
        level: SpaceLevel::Warning,
        text,
    })
}

/// RESCAP bit 0 and the Reservation Persistence feature of the namespace at `path`.
fn read_persistence(path: &std::path::Path) -> Result<fenced::core::Persistence, String> {
    let ns = nvme_resv::Namespace::open(path).map_err(|e| e.to_string())?;
    let caps = ns.capabilities().map_err(|e| e.to_string())?;
    Ok(fenced::core::Persistence::from_device(
        caps.ptpl,
        ns.ptpl_state().ok(),
    ))
}

/// A check's result, ordered by severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warning,
    Critical,
    Unknown,
}

impl Level {
    fn code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Warning => 1,
            Self::Critical => 2,
            Self::Unknown => 3,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "OK",
            Self::Warning => "WARNING",
            Self::Critical => "CRITICAL",
            Self::Unknown => "UNKNOWN",
        })
    }
}

/// Thresholds of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// WARNING at an owed fence this old (ms).
    pub owed_warning_ms: u64,
    /// CRITICAL at an owed fence this old (ms).
    pub owed_critical_ms: u64,
    /// WARNING below this many members.
    pub expect_members: Option<usize>,
}

/// The verdict on what the cluster's records, endpoints and etcd's space
/// ([`judge_space`]) show at `now_ms`: the level and the summary (problems first,
/// worst first). A raised etcd alarm is CRITICAL (etcd refuses every write, a fence's
/// included); a space warning is a WARNING.
pub fn verdict(
    s: &Status,
    endpoints: &[(String, Option<String>)],
    space: &[SpaceFinding],
    t: Thresholds,
    now_ms: u64,
) -> (Level, String) {
    let mut level = Level::Ok;
    let mut problems: Vec<(Level, String)> = Vec::new();
    let mut owed = 0;
    for (node, row) in &s.nodes {
        let Some(o) = &row.owed else { continue };
        owed += 1;
        let (l, age) = match o.since_unix_ms {
            Some(since) => {
                let age = now_ms.saturating_sub(since);
                let l = if age >= t.owed_critical_ms {
                    Level::Critical
                } else if age >= t.owed_warning_ms {
                    Level::Warning
                } else {
                    Level::Ok
                };
                (l, format!("{}s", age / 1000))
            }
            // Never stamped: its age cannot be told; not OK, not proven late.
            None => (Level::Warning, "unknown time".to_owned()),
        };
        if l > Level::Ok {
            let by = o
                .in_progress_by
                .as_deref()
                .map_or(String::new(), |b| format!(", claimed by {b}"));
            problems.push((l, format!("fence of {node} owed for {age} ({}{by})", o.why)));
        }
    }
    let members = s.nodes.values().filter(|r| r.member).count();
    // A node `fenced etcd-roles --apply` seeded (its generation and fence mark) whose
    // agent never started: not a member, but not one that went missing either.
    let never_joined = |r: &NodeRow| {
        !r.member
            && r.liveness_stamp_unix_ms.is_none()
            && r.last_fence.is_none()
            && r.owed.is_none()
            && r.failed_attempts == 0
    };
    if let Some(want) = t.expect_members
        && members < want
    {
        let (unjoined, missing): (Vec<_>, Vec<_>) = s
            .nodes
            .iter()
            .filter(|(_, r)| !r.member)
            .partition(|(_, r)| never_joined(r));
        let names = |rows: &[(&String, &NodeRow)]| {
            rows.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut line = format!(
            "{members} of {want} expected members (not members: {}",
            if missing.is_empty() {
                "none known".to_owned()
            } else {
                names(&missing)
            }
        );
        if !unjoined.is_empty() {
            line.push_str(&format!("; not yet joined: {}", names(&unjoined)));
        }
        line.push(')');
        problems.push((Level::Warning, line));
    }
    let out: Vec<&(String, Option<String>)> =
        endpoints.iter().filter(|(_, t)| t.is_some()).collect();
    for (ep, trouble) in &out {
        problems.push((
            Level::Warning,
            format!(
                "etcd endpoint {ep} out of rotation: {}",
                trouble.as_deref().unwrap_or_default()
            ),
        ));
    }
    for f in space {
        let l = match f.level {
            SpaceLevel::Error => Level::Critical,
            SpaceLevel::Warning => Level::Warning,
        };
        problems.push((l, f.text.clone()));
    }
    if !s.malformed.is_empty() {
        problems.push((
            Level::Warning,
            format!(
                "{} malformed record(s), first {} ({}); see fenced status",
                s.malformed.len(),
                s.malformed[0].key,
                s.malformed[0].why
            ),
        ));
    }
    problems.sort_by_key(|p| std::cmp::Reverse(p.0));
    if let Some((l, _)) = problems.first() {
        level = *l;
    }
    let mut summary: Vec<String> = problems.into_iter().map(|(_, p)| p).collect();
    if summary.is_empty() {
        summary.push("no fence owed beyond thresholds".to_owned());
    }
    let line = format!(
        "FENCED {level} - {} | owed={owed} members={members} malformed={} endpoints_out={}",
        summary.join("; "),
        s.malformed.len(),
        out.len()
    );
    (level, line.replace('\n', " "))
}

/// The WARNING for an etcd `version` that lacks the stalled-leader lease fix
/// ([`fenced::store::lease_revocation_warning`], the same words `fenced run` logs),
/// unless the operator accepted exactly this version.
fn etcd_version_finding(version: &str, accepted: Option<&str>) -> Option<SpaceFinding> {
    if accepted.is_some_and(|a| a.trim() == version.trim()) {
        return None;
    }
    fenced::store::lease_revocation_warning(version).map(|text| SpaceFinding {
        level: SpaceLevel::Warning,
        text: format!("{text}; or, once accepted, --accept-etcd-version {version}"),
    })
}

pub async fn check(args: CheckArgs) -> Result<ExitCode, OpError> {
    let t = Thresholds {
        owed_warning_ms: args.owed_warning_secs.saturating_mul(1000),
        owed_critical_ms: args.owed_critical_secs.saturating_mul(1000),
        expect_members: args.expect_members,
    };
    // Anything that keeps the check from reading the records is UNKNOWN (3), as
    // monitoring plugins report "could not check", never OK.
    let unknown = |e: &(dyn std::error::Error + 'static)| {
        println!("FENCED UNKNOWN - {}", crate::one_line(e));
        Ok(ExitCode::from(Level::Unknown.code()))
    };
    let store = match super::connect(&args.etcd).await {
        Ok(s) => s,
        Err(e) => return unknown(&e),
    };
    let status = match store.status().await {
        Ok(s) => s,
        Err(e) => return unknown(&OpError::store("read the cluster status")(e)),
    };
    let file = match config::load_file(args.etcd.config_path().as_deref()) {
        Ok(f) => f,
        Err(e) => return unknown(&e),
    };
    let settings = match EtcdSettings::resolve(&args.etcd, &file) {
        Ok(s) => s,
        Err(e) => return unknown(&e),
    };
    let endpoints = probe_endpoints(
        &settings.endpoints,
        store.keys().root(),
        &StoreOptions {
            security: settings.security.clone(),
            ..StoreOptions::default()
        },
    )
    .await;
    let mut space = match store.space_report().await {
        Ok(r) => {
            let mut findings = judge_space(&r, args.history_warning_revisions);
            findings.extend(etcd_version_finding(
                &r.version,
                args.accept_etcd_version.as_deref(),
            ));
            findings
        }
        Err(e) => vec![SpaceFinding {
            level: SpaceLevel::Warning,
            text: format!(
                "cannot check etcd's history and space: {}",
                crate::one_line(&e)
            ),
        }],
    };
    if let Some(path) = args.block_device {
        let read = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || read_persistence(&path))
                .await
                .unwrap_or_else(|e| Err(format!("the device read did not finish: {e}")))
        };
        space.extend(persistence_finding(&path, read));
    }
    let (level, line) = verdict(&status, &endpoints, &space, t, fenced::clock::unix_ms());
    println!("{line}");
    Ok(ExitCode::from(level.code()))
}

#[cfg(test)]
mod tests {
    use fenced::store::{MalformedRecord, NodeRow, Owed};

    use super::*;

    #[test]
    fn persistence_is_a_warning_only_where_the_device_cannot_persist() {
        use fenced::core::Persistence;
        let p = std::path::Path::new("/dev/nvme0n1");
        assert!(persistence_finding(p, Ok(Persistence::On)).is_none());
        assert!(persistence_finding(p, Ok(Persistence::Available)).is_none());
        let w = persistence_finding(p, Ok(Persistence::Unsupported)).unwrap();
        assert!(matches!(w.level, SpaceLevel::Warning));
        assert!(
            w.text
                .starts_with("/dev/nvme0n1: persist through power loss: NOT supported"),
            "{}",
            w.text
        );
        let e = persistence_finding(p, Err("permission denied".into())).unwrap();
        assert!(
            e.text
                .contains("cannot read its persistence: permission denied")
        );
        // In the check's line, as a WARNING.
        let (l, line) = verdict(&Status::default(), &[], &[w], T, 0);
        assert_eq!(l, Level::Warning);
        assert!(line.contains("NOT supported"), "{line}");
    }

    fn status(rows: &[(&str, NodeRow)]) -> Status {
        Status {
            nodes: rows
                .iter()
                .map(|(n, r)| ((*n).to_owned(), r.clone()))
                .collect(),
            ..Status::default()
        }
    }

    fn owed(since: Option<u64>) -> NodeRow {
        NodeRow {
            owed: Some(Owed {
                why: "not a member and never fenced".into(),
                intent_recorded: false,
                in_progress_by: None,
                since_unix_ms: since,
            }),
            ..NodeRow::default()
        }
    }

    const T: Thresholds = Thresholds {
        owed_warning_ms: 10_000,
        owed_critical_ms: 60_000,
        expect_members: Some(2),
    };

    #[test]
    fn an_etcd_without_the_lease_fix_warns_unless_that_version_is_accepted() {
        let f = etcd_version_finding("3.4.23", None).expect("3.4.23 lacks the fix");
        assert_eq!(f.level, SpaceLevel::Warning);
        assert!(
            f.text.starts_with("etcd 3.4.23 lacks the fix"),
            "{}",
            f.text
        );
        assert!(
            f.text.ends_with("--accept-etcd-version 3.4.23"),
            "{}",
            f.text
        );
        assert_eq!(etcd_version_finding("3.4.23", Some("3.4.23")), None);
        // Accepting one version says nothing about another.
        assert!(etcd_version_finding("3.5.12", Some("3.4.23")).is_some());
        // Fixed or unknown: nothing to say.
        assert_eq!(etcd_version_finding("3.5.16", None), None);
        assert_eq!(etcd_version_finding("", None), None);
        // Through the verdict: one WARNING line that names the version.
        let member = NodeRow {
            member: true,
            ..NodeRow::default()
        };
        let s = status(&[("n1", member.clone()), ("n2", member)]);
        let (l, line) = verdict(&s, &[], &[f], T, 100_000);
        assert_eq!(l, Level::Warning, "{line}");
        assert!(
            line.starts_with("FENCED WARNING - etcd 3.4.23 lacks"),
            "{line}"
        );
    }

    #[test]
    fn levels() {
        let member = NodeRow {
            member: true,
            ..NodeRow::default()
        };
        let ok = status(&[("n1", member.clone()), ("n2", member.clone())]);
        let (l, line) = verdict(&ok, &[], &[], T, 100_000);
        assert_eq!(l, Level::Ok, "{line}");
        assert!(line.starts_with("FENCED OK - "), "{line}");

        // Owed 5 s: still OK (a fence takes a moment); 30 s: WARNING; 70 s: CRITICAL.
        for (since, want) in [
            (95_000, Level::Warning), // members 1 of 2 is a warning too
            (70_000, Level::Warning),
            (30_000, Level::Critical),
        ] {
            let s = status(&[("n1", member.clone()), ("n2", owed(Some(since)))]);
            let (l, line) = verdict(&s, &[], &[], T, 100_000);
            assert_eq!(l, want, "{line}");
        }
        let s = status(&[("n1", member.clone()), ("n2", owed(Some(30_000)))]);
        let (_, line) = verdict(&s, &[], &[], T, 100_000);
        assert!(
            line.starts_with("FENCED CRITICAL - fence of n2 owed for 70s"),
            "{line}"
        );
        assert!(
            line.contains("1 of 2 expected members (not members: n2)"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);

        // Seeded by `etcd-roles --apply` (generation 0, fence mark) but never started:
        // "not yet joined", not a member gone missing.
        let seeded = NodeRow {
            generation: Some(0),
            fenced_to: Some(0),
            ..NodeRow::default()
        };
        let s = status(&[("n1", member.clone()), ("n2", seeded)]);
        let (l, line) = verdict(&s, &[], &[], T, 100_000);
        assert_eq!(l, Level::Warning, "{line}");
        assert!(
            line.contains("1 of 2 expected members (not members: none known; not yet joined: n2)"),
            "{line}"
        );
        let gone = NodeRow {
            liveness_stamp_unix_ms: Some(1),
            ..NodeRow::default()
        };
        let s = status(&[("n1", member.clone()), ("n2", gone)]);
        let (_, line) = verdict(&s, &[], &[], T, 100_000);
        assert!(line.contains("(not members: n2)"), "{line}");

        // Age unknown: WARNING, never OK.
        let s = status(&[
            ("n1", member.clone()),
            ("n2", member.clone()),
            ("n3", owed(None)),
        ]);
        assert_eq!(verdict(&s, &[], &[], T, 100_000).0, Level::Warning);

        // An endpoint out of rotation, a malformed record: WARNING.
        let eps = vec![
            ("http://a".to_owned(), None),
            (
                "http://b".to_owned(),
                Some("refuses connections".to_owned()),
            ),
        ];
        let (l, line) = verdict(&ok, &eps, &[], T, 100_000);
        assert_eq!(l, Level::Warning);
        assert!(line.contains("http://b out of rotation"), "{line}");
        let mut bad = ok.clone();
        bad.malformed.push(MalformedRecord {
            key: "/r/gen/zz".into(),
            why: "not a number".into(),
            effect: "kept",
            mod_revision: 1,
        });
        assert_eq!(verdict(&bad, &[], &[], T, 100_000).0, Level::Warning);
    }

    #[test]
    fn etcd_space_findings_are_reported_an_alarm_as_critical() {
        let member = NodeRow {
            member: true,
            ..NodeRow::default()
        };
        let ok = status(&[("n1", member.clone()), ("n2", member)]);
        let warn = SpaceFinding {
            level: SpaceLevel::Warning,
            text: "etcd never compacted its history (5 revisions kept)".into(),
        };
        let (l, line) = verdict(&ok, &[], std::slice::from_ref(&warn), T, 100_000);
        assert_eq!(l, Level::Warning, "{line}");
        assert!(
            line.starts_with("FENCED WARNING - etcd never compacted its history"),
            "{line}"
        );
        let alarm = SpaceFinding {
            level: SpaceLevel::Error,
            text: "etcd member 1 raised its NOSPACE alarm".into(),
        };
        let (l, line) = verdict(&ok, &[], &[warn, alarm], T, 100_000);
        assert_eq!(l, Level::Critical, "{line}");
        assert!(
            line.starts_with(
                "FENCED CRITICAL - etcd member 1 raised its NOSPACE alarm; etcd never compacted"
            ),
            "{line}"
        );
    }
}
