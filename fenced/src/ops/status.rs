//! `fenced status`: one row per node (member, lease renewal, generation, owed fence
//! and why, claim holder, last fence and by whom, arenas), from one read; `-o json`
//! is the stable document of fenced/README.md ("Stable JSON").

use std::process::ExitCode;

use fenced::store::{NodeRow, Status};

use super::OpError;
pub use super::format::Output;
use super::format::{JSON_VERSION, fmt_unix_ms};
use crate::config::EtcdArgs;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
}

pub async fn status(args: StatusArgs) -> Result<ExitCode, OpError> {
    let store = super::connect(&args.etcd).await?;
    let s = store
        .status()
        .await
        .map_err(OpError::store("read the cluster status"))?;
    let now = fenced::clock::unix_ms();
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json(&s, now)).unwrap_or_default()
        ),
        Output::Text => {
            print!("{}", text(&s, now));
            // The shared namespace recorded by the first join (what every join and
            // NVMe fence compares its device with) and its device's persistence.
            let ns = store
                .namespace_record_full()
                .await
                .map_err(OpError::store("read the recorded namespace"))?;
            println!(
                "namespace: {}",
                ns.map_or_else(|| "(none recorded)".to_owned(), |n| n.to_string())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The stable JSON document (version [`JSON_VERSION`]).
pub fn json(s: &Status, now_ms: u64) -> serde_json::Value {
    let owners: serde_json::Map<String, serde_json::Value> = s
        .arenas
        .iter()
        .map(|(a, n)| (a.clone(), n.clone().into()))
        .collect();
    serde_json::json!({
        "version": JSON_VERSION,
        "revision": s.revision,
        "read_at_unix_ms": now_ms,
        "nodes": s.nodes,
        "arena_owners": owners,
        "free_arenas": s.free_arenas,
        "audit_records": s.audit_records,
        "malformed": s.malformed,
    })
}

/// "3.2s ago", "5m ago".
fn ago(now_ms: u64, then_ms: u64) -> String {
    let d = now_ms.saturating_sub(then_ms);
    match d {
        0..10_000 => format!("{:.1}s ago", d as f64 / 1000.0),
        10_000..120_000 => format!("{}s ago", d / 1000),
        120_000..7_200_000 => format!("{}m ago", d / 60_000),
        _ => format!("{}h ago", d / 3_600_000),
    }
}

/// The `RENEWED` cell: a member's lease was renewed within its TTL (etcd holds it),
/// whatever its liveness stamp says (refreshed only every `liveness_refresh_ms`);
/// anyone else's last proof of life is that stamp.
fn renewed(r: &NodeRow, now_ms: u64) -> String {
    match (r.member, r.lease_ttl_ms, r.liveness_stamp_unix_ms) {
        (true, Some(ttl), _) => format!("<{}s ago", ttl.div_ceil(1000)),
        (true, None, _) => "<TTL ago".to_owned(),
        (false, _, Some(t)) => ago(now_ms, t),
        (false, _, None) => "-".to_owned(),
    }
}

fn cells(node: &str, r: &NodeRow, now_ms: u64) -> Vec<String> {
    let dash = || "-".to_owned();
    let member = match (r.member, r.departed) {
        (true, _) => "yes".to_owned(),
        (false, true) => "departed".to_owned(),
        (false, false) => "no".to_owned(),
    };
    let owed = r.owed.as_ref().map_or_else(dash, |o| {
        let since = o.since_unix_ms.map_or_else(
            || "age unknown".to_owned(),
            |t| format!("alive {}", ago(now_ms, t)),
        );
        let intent = if o.intent_recorded {
            ", intent recorded"
        } else {
            ""
        };
        format!("OWED ({since}{intent}): {}", o.why)
    });
    let last = r.last_fence.as_ref().map_or_else(dash, |f| {
        format!(
            "{} -> {} at {} by {} ({}, {})",
            f.generation_before,
            f.generation_after,
            fmt_unix_ms(f.unix_ms),
            f.by,
            f.trigger,
            f.result
        )
    });
    let failed = match (&r.last_failure, r.failed_attempts) {
        (Some(f), n) => format!("{n}, last at {} by {}", fmt_unix_ms(f.unix_ms), f.by),
        (None, _) => dash(),
    };
    vec![
        node.to_owned(),
        member,
        r.generation
            .map_or_else(|| "?".to_owned(), |g| g.to_string()),
        r.instance.clone().unwrap_or_else(dash),
        renewed(r, now_ms),
        owed,
        r.claim_holder.clone().unwrap_or_else(dash),
        last,
        failed,
        if r.arenas.is_empty() {
            dash()
        } else {
            r.arenas.join(",")
        },
    ]
}

/// The text view: a summary line, one row per node, then free arenas and malformed
/// records. The first three columns (node, member, generation) never contain a space,
/// so scripts can read them with `awk '$1 == "n3" { print $3 }'`.
pub fn text(s: &Status, now_ms: u64) -> String {
    let members = s.nodes.values().filter(|r| r.member).count();
    let owed = s.nodes.values().filter(|r| r.owed.is_some()).count();
    let mut out = format!(
        "revision {}: {} node(s), {members} member(s), {owed} owed fence(s), {} audit record(s), {} malformed record(s)\n",
        s.revision,
        s.nodes.len(),
        s.audit_records,
        s.malformed.len()
    );
    let mut table = vec![
        [
            "NODE",
            "MEMBER",
            "GEN",
            "INSTANCE",
            "RENEWED",
            "OWED",
            "CLAIM",
            "LAST FENCE",
            "FAILED",
            "ARENAS",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    table.extend(s.nodes.iter().map(|(n, r)| cells(n, r, now_ms)));
    let widths: Vec<usize> = (0..table[0].len())
        .map(|c| {
            table
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "free arenas: {}\n",
        if s.free_arenas.is_empty() {
            "-".to_owned()
        } else {
            s.free_arenas.join(" ")
        }
    ));
    for m in &s.malformed {
        out.push_str(&format!("malformed: {} ({}; {})\n", m.key, m.why, m.effect));
    }
    out
}

#[cfg(test)]
mod tests {
    use fenced::store::{FenceSummary, Owed};

    use super::*;

    /// The JSON document is a documented, versioned format (fenced/README.md, "Stable
    /// JSON"): renaming or dropping a field must fail here and bump the version.
    #[test]
    fn json_fields_are_the_documented_ones() {
        let fence = FenceSummary {
            unix_ms: 1,
            by: "c1".into(),
            trigger: "sweep".into(),
            fencer: "nvme".into(),
            result: "confirmed".into(),
            generation_before: 0,
            generation_after: 1,
        };
        let row = NodeRow {
            owed: Some(Owed {
                why: "w".into(),
                intent_recorded: true,
                in_progress_by: None,
                since_unix_ms: Some(1),
            }),
            last_fence: Some(fence.clone()),
            last_failure: Some(fence),
            ..NodeRow::default()
        };
        let mut s = Status::default();
        s.nodes.insert("n1".into(), row);
        let doc = json(&s, 5);
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k.join(" ")
        };
        assert_eq!(doc["version"], 1);
        assert_eq!(
            keys(&doc),
            "arena_owners audit_records free_arenas malformed nodes read_at_unix_ms revision version"
        );
        let n1 = &doc["nodes"]["n1"];
        assert_eq!(
            keys(n1),
            "arenas claim_holder departed failed_attempts fenced_to generation instance last_failure last_fence last_renewal_unix_ms lease_ttl_ms liveness_refresh_ms liveness_stamp_unix_ms member owed"
        );
        assert_eq!(
            keys(&n1["owed"]),
            "in_progress_by intent_recorded since_unix_ms why"
        );
        assert_eq!(
            keys(&n1["last_fence"]),
            "by fencer generation_after generation_before result trigger unix_ms"
        );
        let text = text(&s, 5);
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("n1 "))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(&row[..3], ["n1", "no", "?"], "{text}");
        assert!(row.contains(&"OWED"), "{text}");
    }

    #[test]
    fn renewed_is_the_lease_for_a_member_and_the_stamp_for_anyone_else() {
        let stamped = NodeRow {
            liveness_stamp_unix_ms: Some(100_000),
            lease_ttl_ms: Some(2_000),
            liveness_refresh_ms: Some(31_667),
            ..NodeRow::default()
        };
        // A member's stamp may be 30 s old: its lease says more.
        let member = NodeRow {
            member: true,
            ..stamped.clone()
        };
        assert_eq!(renewed(&member, 131_000), "<2s ago");
        assert_eq!(renewed(&stamped, 131_000), "31s ago");
        assert_eq!(renewed(&NodeRow::default(), 131_000), "-");
    }
}
