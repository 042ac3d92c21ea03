//! What the read-only views (`status`, `audit`, `check`) share: the output format,
//! the stable JSON version, and UTC timestamps in and out.

use clap::ValueEnum;
use fenced::clock::{civil_from_days, days_from_civil};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Version of the JSON documents of `fenced status -o json` and `fenced audit -o json`
/// (fenced/README.md, "Stable JSON"): bumped only when a field is removed or changes
/// meaning; fields may be added within a version.
pub const JSON_VERSION: u32 = 1;

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` in Unix milliseconds (UTC only: `Z`).
pub fn parse_rfc3339_utc(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix('z'))?;
    let (date, time) = s.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-');
    let year: i64 = d.next()?.parse().ok()?;
    let month: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let h: u64 = t.next()?.parse().ok()?;
    let m: u64 = t.next()?.parse().ok()?;
    let sec: u64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let ms: u64 = match frac.len() {
        0 => 0,
        n if frac.bytes().all(|b| b.is_ascii_digit()) => {
            let digits = &frac[..n.min(3)];
            digits.parse::<u64>().ok()? * 10u64.pow(3 - u32::try_from(digits.len()).ok()?)
        }
        _ => return None,
    };
    let days = u64::try_from(days_from_civil(year, i64::from(month), i64::from(day))).ok()?;
    Some(((days * 86_400 + h * 3600 + m * 60 + sec) * 1000) + ms)
}

/// Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn fmt_unix_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let (y, mo, d) = civil_from_days(days);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}
