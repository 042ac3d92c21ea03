//! How many distinct operators an attested fence needs (`fenced attest`), from the
//! flags (or env), else the file, else the defaults.

use std::time::Duration;

use super::args::Layer;
use super::check::in_range;
use super::defaults;
use super::error::ConfigError;

/// Operator identities an attested fence needs, and how long it waits for the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalSettings {
    /// 1: the attesting operator alone; 2: a second, distinct one approves.
    pub approvals: u32,
    /// How long an attested fence waits for its approval.
    pub timeout: Duration,
}

impl ApprovalSettings {
    /// `--approvals` and `--approval-timeout-secs` (flag or env), else the file's
    /// `approvals` and `approval_timeout_secs`, else 1 and 600 s; each range checked.
    pub fn resolve(
        approvals: Option<u32>,
        timeout_secs: Option<u64>,
        file: &Layer,
    ) -> Result<Self, ConfigError> {
        let approvals = approvals.or(file.approvals).unwrap_or(defaults::APPROVALS);
        in_range(
            "--approvals",
            u64::from(approvals),
            1,
            2,
            "1: the attesting operator alone fences; 2: a second, distinct operator approves (`fenced approve`)",
        )?;
        let timeout = in_range(
            "--approval-timeout-secs",
            timeout_secs
                .or(file.approval_timeout_secs)
                .unwrap_or(defaults::APPROVAL_TIMEOUT_SECS),
            1,
            defaults::MAX_APPROVAL_TIMEOUT_SECS,
            "how long an attested fence waits for its second operator",
        )?;
        Ok(Self { approvals, timeout })
    }
}
