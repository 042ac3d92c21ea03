//! Checks of single settings: endpoints, key root, names, paths, ranges.

use std::path::Path;
use std::time::Duration;

use super::error::*;
use super::limits;

/// An etcd endpoint: `http://host:port`, `https://host:port` or `host:port` (taken as
/// http), the host a DNS name, an IPv4 address or a bracketed IPv6 address.
pub(crate) fn check_endpoint(e: &str) -> Result<(), ConfigError> {
    let bad = |rule| ConfigError::BadValue {
        setting: "--etcd-endpoints",
        value: e.to_owned(),
        rule,
    };
    const RULE: &str =
        "not an etcd URL: use http://HOST:PORT or https://HOST:PORT (e.g. http://10.0.0.5:2379)";
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .unwrap_or(e);
    if rest.contains("://") {
        return Err(bad("unsupported scheme: use http:// or https://"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (addr, tail) = v6.split_once(']').ok_or_else(|| bad(RULE))?;
        if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return Err(bad(RULE));
        }
        (addr, tail.strip_prefix(':').ok_or_else(|| bad(RULE))?)
    } else {
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad(RULE))?;
        let dns = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
        if host.is_empty() || !host.chars().all(dns) {
            return Err(bad(RULE));
        }
        (host, port)
    };
    let _ = host;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.chars().all(|c| c.is_ascii_digit()) => Ok(()),
        _ => Err(bad(RULE)),
    }
}

/// The key root: starts with `/`, printable ASCII without spaces, at most
/// [`limits::MAX_ROOT_LEN`] bytes.
pub(crate) fn check_root(root: &str) -> Result<(), ConfigError> {
    let ok = root.starts_with('/')
        && root.len() <= limits::MAX_ROOT_LEN
        && root.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadValue {
            setting: "--root",
            value: root.to_owned(),
            rule: "a key root starts with / and has at most 128 printable ASCII characters, no spaces (e.g. /fenced/)",
        })
    }
}

/// A name that ends up in an etcd key, a log line or an API call (volume id, region,
/// arena): 1..=[`limits::MAX_NAME_LEN`] characters from `[A-Za-z0-9._:-]`, starting
/// with a letter or digit.
pub(crate) fn check_name(setting: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= limits::MAX_NAME_LEN
        && value.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphanumeric() || (i > 0 && matches!(c, '.' | '_' | ':' | '-'))
        });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadValue {
            setting,
            value: value.to_owned(),
            rule: "use 1 to 128 of A-Z a-z 0-9 . _ : -, starting with a letter or digit",
        })
    }
}

/// A path the daemon writes into its pid file or logs: no control characters.
pub(crate) fn check_path(setting: &'static str, path: &Path) -> Result<(), ConfigError> {
    let text = path.to_string_lossy();
    if text.is_empty() || text.chars().any(char::is_control) || path.to_str().is_none() {
        return Err(ConfigError::BadValue {
            setting,
            value: text.into_owned(),
            rule: "a path must be UTF-8 without control characters",
        });
    }
    Ok(())
}

/// `value` (seconds) within `min..=max`.
pub(crate) fn in_range(
    setting: &'static str,
    value: u64,
    min: u64,
    max: u64,
    why: &'static str,
) -> Result<Duration, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(Duration::from_secs(value))
    } else {
        Err(ConfigError::OutOfRange {
            setting,
            value,
            min,
            max,
            why,
        })
    }
}
