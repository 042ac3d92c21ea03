//! Where etcd is and how to reach it, for the daemon and the operator commands.

use std::path::PathBuf;

use fenced::store::EtcdSecurity;

use super::args::*;
use super::check::*;
use super::error::*;
use super::{defaults, limits};

/// Where etcd is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Endpoints, in order.
    pub endpoints: Vec<String>,
    /// Key root.
    pub root: String,
    /// TLS files and credentials (the files are read when connecting).
    pub security: EtcdSecurity,
    /// Where the endpoints came from, for an error that says which etcd was tried and
    /// why that one ("--etcd-endpoints", "config /etc/fenced/fenced.toml", "the
    /// default").
    pub endpoints_from: String,
}

/// Environment variable holding the etcd password (when no password file is given).
pub const ETCD_PASSWORD_ENV: &str = "FENCED_ETCD_PASSWORD";

/// `--connect-timeout-secs`'s variable, which the operator commands read too.
pub const CONNECT_TIMEOUT_ENV: &str = "FENCED_CONNECT_TIMEOUT_SECS";

/// How long an operator command waits for etcd: `FENCED_CONNECT_TIMEOUT_SECS` when
/// set (a slow host, e.g. TLS in an emulated guest, may need more than the default's
/// few seconds), else `default`. Not the file's `connect_timeout_secs`: that is the
/// daemon's start, often minutes, which a command run by hand should not wait.
pub fn command_wait(default: std::time::Duration) -> Result<std::time::Duration, ConfigError> {
    let env = match std::env::var(CONNECT_TIMEOUT_ENV) {
        Ok(v) => Some(v.trim().parse::<u64>().map_err(|_| ConfigError::BadValue {
            setting: "FENCED_CONNECT_TIMEOUT_SECS",
            value: v.clone(),
            rule: "a whole number of seconds, 1 to 86400",
        })?),
        Err(_) => None,
    };
    match env {
        None => Ok(default),
        Some(t) => in_range(
            "--connect-timeout-secs",
            t,
            1,
            limits::MAX_CONNECT_TIMEOUT_SECS,
            "how long a command waits for etcd",
        ),
    }
}

impl EtcdSettings {
    /// The operator commands: endpoints, root, TLS files and credentials from the
    /// flags (or env), else the file, else the defaults; each endpoint and the root
    /// checked. The password comes from `--etcd-password-file` (read when
    /// connecting), else `FENCED_ETCD_PASSWORD`.
    pub fn resolve(cli: &EtcdArgs, file: &Layer) -> Result<Self, ConfigError> {
        let pick = |c: &Option<PathBuf>, f: &Option<PathBuf>| c.clone().or_else(|| f.clone());
        let s = Self {
            security: EtcdSecurity {
                ca: pick(&cli.etcd_ca, &file.etcd_ca),
                cert: pick(&cli.etcd_cert, &file.etcd_cert),
                key: pick(&cli.etcd_key, &file.etcd_key),
                user: cli.etcd_user.clone().or_else(|| file.etcd_user.clone()),
                password_file: pick(&cli.etcd_password_file, &file.etcd_password_file),
                password: std::env::var(ETCD_PASSWORD_ENV).ok(),
            },
            endpoints_from: match (&cli.etcd_endpoints, &file.etcd_endpoints) {
                (Some(_), _) => "--etcd-endpoints or FENCED_ETCD_ENDPOINTS".to_owned(),
                (None, Some(_)) => match cli.config_path() {
                    Some(p) => format!("etcd_endpoints in {}", p.display()),
                    None => "the config file".to_owned(),
                },
                (None, None) => format!(
                    "the default: no --etcd-endpoints, FENCED_ETCD_ENDPOINTS or config file{}",
                    cli.config_path()
                        .map_or(String::new(), |p| format!(" key (read {})", p.display()))
                ),
            },
            endpoints: cli
                .etcd_endpoints
                .clone()
                .or_else(|| file.etcd_endpoints.clone())
                .unwrap_or_else(|| vec![defaults::ETCD_ENDPOINT.to_owned()]),
            root: cli
                .root
                .clone()
                .or_else(|| file.root.clone())
                .unwrap_or_else(|| defaults::ROOT.to_owned()),
        };
        if s.endpoints.is_empty() || s.endpoints.len() > limits::MAX_ENDPOINTS {
            return Err(ConfigError::BadValue {
                setting: "--etcd-endpoints",
                value: s.endpoints.join(","),
                rule: "give 1 to 16 endpoints, comma separated",
            });
        }
        for e in &s.endpoints {
            check_endpoint(e)?;
        }
        check_root(&s.root)?;
        Ok(s)
    }
}
