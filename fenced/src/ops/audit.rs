//! `fenced audit`: the fence records, failed attempts and unfences included, readable — who fenced
//! whom, what started it, the signals, the fencer's evidence, step durations, the
//! generation before and after. One range read; nothing is written.

use std::process::ExitCode;
use std::time::Duration;

use fenced::NodeId;
use fenced::keys::AuditKind;
use fenced::store::{AuditItem, AuditView};

use super::OpError;
use super::format::{JSON_VERSION, Output, fmt_unix_ms, parse_rfc3339_utc};
use crate::config::EtcdArgs;

#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Only the records of this node.
    #[arg(long)]
    node: Option<String>,
    /// Only records from this time on: an age (`90s`, `15m`, `12h`, `7d`), an RFC 3339
    /// UTC time (`2026-12-01T12:00:00Z`) or Unix seconds (`@1764590400`).
    #[arg(long, value_parser = parse_since)]
    since: Option<Since>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    output: Output,
}

/// A `--since` bound: an age or an absolute time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// This long before now.
    Ago(Duration),
    /// Unix milliseconds.
    At(u64),
}

impl Since {
    /// The bound in Unix milliseconds, given `now_ms`.
    pub fn unix_ms(self, now_ms: u64) -> u64 {
        match self {
            Self::Ago(d) => now_ms.saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            Self::At(ms) => ms,
        }
    }
}

/// Parses `--since`.
pub fn parse_since(s: &str) -> Result<Since, String> {
    let bad = || {
        format!(
            "{s:?} is not a time: use an age (90s, 15m, 12h, 7d), an RFC 3339 UTC time (2026-12-01T12:00:00Z) or Unix seconds (@1764590400)"
        )
    };
    if let Some(secs) = s.strip_prefix('@') {
        let secs: u64 = secs.parse().map_err(|_| bad())?;
        return secs.checked_mul(1000).map(Since::At).ok_or_else(bad);
    }
    if let Some(ms) = parse_rfc3339_utc(s) {
        return Ok(Since::At(ms));
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(per)
        .map(|secs| Since::Ago(Duration::from_secs(secs)))
        .ok_or_else(bad)
}

/// The records of `view` at or after `since_ms`, oldest first.
fn selected(view: &AuditView, since_ms: u64) -> Vec<&AuditItem> {
    let mut items: Vec<&AuditItem> = view
        .records
        .iter()
        .filter(|i| i.record.unix_ms >= since_ms)
        .collect();
    items.sort_by_key(|i| (i.record.unix_ms, i.key.clone()));
    items
}

/// A number the record may lack: `?` when it does (never a made-up 0).
fn shown(n: Option<u64>) -> String {
    n.map_or_else(|| "?".to_owned(), |n| n.to_string())
}

/// One record as text: a headline, then the evidence.
pub fn render(item: &AuditItem) -> String {
    let a = &item.record;
    if matches!(item.kind, AuditKind::Unfence { .. }) {
        return format!(
            "{}  {} UNFENCED at generation {} by {}{}: {}\n    record: {}\n",
            fmt_unix_ms(a.unix_ms),
            item.node,
            shown(a.generation),
            if a.operator.is_empty() {
                "?"
            } else {
                &a.operator
            },
            if a.host.is_empty() {
                String::new()
            } else {
                format!(" on {}", a.host)
            },
            a.reason,
            item.key
        );
    }
    let outcome = if item.failed {
        format!(
            "FAILED attempt, generation stays {}",
            shown(a.generation_before)
        )
    } else {
        format!(
            "fenced, generation {} -> {}",
            shown(a.generation_before),
            shown(a.generation_after)
        )
    };
    let steps = &a.steps;
    let mut out = format!(
        "{}  {} (instance {}) {} by {}, trigger {}\n",
        fmt_unix_ms(a.unix_ms),
        item.node,
        if a.instance.is_empty() {
            "unknown"
        } else {
            &a.instance
        },
        outcome,
        a.fenced_by,
        if a.trigger.is_empty() {
            "?"
        } else {
            &a.trigger
        },
    );
    out.push_str(&format!(
        "    fencer {}: {}\n",
        if a.fencer.is_empty() { "?" } else { &a.fencer },
        a.fencer_result
    ));
    if !a.signals.is_empty() {
        out.push_str(&format!("    signals: {}\n", a.signals.join("; ")));
    }
    out.push_str(&format!(
        "    steps: {} (claim {} ms, fencer {} ms, total {} ms)\n",
        steps.join(" > "),
        shown(a.claim_ms),
        shown(a.sever_ms),
        shown(a.total_ms)
    ));
    if !a.arenas_released.is_empty() {
        out.push_str(&format!(
            "    arenas released: {}\n",
            a.arenas_released.join(" ")
        ));
    }
    out.push_str(&format!("    record: {}\n", item.key));
    out
}

pub async fn audit(args: AuditArgs) -> Result<ExitCode, OpError> {
    let node = args.node.as_deref().map(NodeId::new).transpose()?;
    let store = super::connect(&args.etcd).await?;
    let view = store
        .audit_view(node.as_ref())
        .await
        .map_err(OpError::store("read the audit records"))?;
    let since_ms = args
        .since
        .map_or(0, |s| s.unix_ms(fenced::clock::unix_ms()));
    let items = selected(&view, since_ms);
    match args.output {
        Output::Json => {
            let doc = serde_json::json!({
                "version": JSON_VERSION,
                "revision": view.revision,
                "records": items,
                "malformed": view.malformed,
            });
            println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        }
        Output::Text => {
            if items.is_empty() {
                println!(
                    "no fence records{}",
                    match &node {
                        Some(n) => format!(" for {n}"),
                        None => String::new(),
                    }
                );
            }
            for i in &items {
                print!("{}", render(i));
            }
            for m in &view.malformed {
                println!("malformed record {}: {} ({})", m.key, m.why, m.effect);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_forms() {
        assert_eq!(parse_since("90s"), Ok(Since::Ago(Duration::from_secs(90))));
        assert_eq!(parse_since("2h"), Ok(Since::Ago(Duration::from_secs(7200))));
        assert_eq!(parse_since("@1764590400"), Ok(Since::At(1_764_590_400_000)));
        assert_eq!(
            parse_since("2026-12-01T12:00:00Z"),
            Ok(Since::At(1_796_126_400_000))
        );
        assert_eq!(parse_since("1970-01-01T00:00:01.5Z"), Ok(Since::At(1500)));
        for bad in [
            "",
            "x",
            "5y",
            "-5m",
            "2026-13-01T00:00:00Z",
            "@x",
            "99999999999999999999d",
        ] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
        assert_eq!(Since::Ago(Duration::from_secs(2)).unix_ms(5000), 3000);
        assert_eq!(Since::Ago(Duration::from_secs(9)).unix_ms(5000), 0);
    }

    #[test]
    fn times_round_trip() {
        assert_eq!(fmt_unix_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(fmt_unix_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        for ms in [0, 1, 951_782_400_123, 1_796_126_400_000, 4_102_444_800_999] {
            assert_eq!(parse_rfc3339_utc(&fmt_unix_ms(ms)), Some(ms));
        }
    }
}
