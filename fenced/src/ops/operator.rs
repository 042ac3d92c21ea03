//! Who an operator command records as its operator: one rule for `attest`, `approve`
//! and `unfence`, so an audit record names people the same way whichever command
//! wrote it.

use crate::config::{self, EtcdArgs, EtcdSettings};

use super::OpError;

/// The rule, pure: the identity etcd authenticated (its user, else the client
/// certificate's CN) when the connection is authenticated, because a name anyone can
/// type is not evidence of who acted; else `--operator`; else `$SUDO_USER`, then
/// `$USER` (the person behind `sudo` before root); else the uid.
pub fn operator_identity(
    authenticated: Option<String>,
    flag: Option<String>,
    env: impl Fn(&str) -> Option<String>,
    uid: Option<u32>,
) -> String {
    let named = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.trim().is_empty());
    [authenticated, flag, env("SUDO_USER"), env("USER")]
        .into_iter()
        .find(named)
        .flatten()
        .unwrap_or_else(|| format!("uid {}", uid.map_or("?".into(), |u| u.to_string())))
}

/// The uid of this process.
pub fn uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// [`operator_identity`] for a command with these etcd flags and `--operator`.
pub fn resolve(etcd: &EtcdArgs, flag: Option<String>) -> Result<String, OpError> {
    let file = config::load_file(etcd.config_path().as_deref())?;
    let authenticated = EtcdSettings::resolve(etcd, &file)?.security.identity();
    Ok(operator_identity(
        authenticated,
        flag,
        |name| std::env::var(name).ok(),
        uid(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn authenticated_identity_wins_over_every_claim() {
        let got = operator_identity(
            Some("alice".into()),
            Some("mallory".into()),
            env(&[("SUDO_USER", "bob"), ("USER", "root")]),
            Some(0),
        );
        assert_eq!(got, "alice");
    }

    #[test]
    fn then_the_flag_then_sudo_user_then_user_then_the_uid() {
        let all = [("SUDO_USER", "bob"), ("USER", "root")];
        assert_eq!(
            operator_identity(None, Some("carol".into()), env(&all), Some(0)),
            "carol"
        );
        assert_eq!(operator_identity(None, None, env(&all), Some(0)), "bob");
        assert_eq!(
            operator_identity(None, None, env(&[("USER", "dave")]), Some(0)),
            "dave"
        );
        // No $USER (cron, systemd units): the uid, never a made-up default name.
        assert_eq!(
            operator_identity(None, None, env(&[]), Some(1000)),
            "uid 1000"
        );
        assert_eq!(operator_identity(None, None, env(&[]), None), "uid ?");
    }

    #[test]
    fn empty_values_do_not_count() {
        assert_eq!(
            operator_identity(
                Some(String::new()),
                Some("  ".into()),
                env(&[("SUDO_USER", ""), ("USER", "erin")]),
                Some(0)
            ),
            "erin"
        );
    }
}
