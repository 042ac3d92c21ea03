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
}

/// Environment variable holding the etcd password (when no password file is given).
pub const ETCD_PASSWORD_ENV: &str = "FENCED_ETCD_PASSWORD";

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
