//! The operator commands: `status`, `audit`, `check`, `probe`, `attest`, `leave`,
//! `etcd-roles`.
//! Each connects (when it needs etcd) with [`connect`], waiting at most
//! [`CLI_ETCD_WAIT`].

pub mod attest;
pub mod audit;
pub mod check;
pub mod format;
pub mod leave;
pub mod operator;
pub mod probe;
pub mod roles;
pub mod status;
pub mod unfence;

use std::time::Duration;

use fenced::store::{EtcdStore, StoreError, StoreOptions};

use crate::config::{self, ConfigError, EtcdArgs, EtcdSettings};
use crate::connect::ConnectError;

/// How long `status`, `probe` and `attest` wait for etcd before reporting it
/// unreachable.
const CLI_ETCD_WAIT: Duration = Duration::from_secs(5);
/// Claim TTL of the operator commands' store (only `attest` claims).
const CLI_CLAIM_TTL: Duration = Duration::from_secs(120);

/// An operator command failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    NodeId(#[from] fenced::node::InvalidNodeId),
    /// An etcd read or write of the command failed.
    #[error("cannot {what}: {source}")]
    Store {
        what: &'static str,
        #[source]
        source: StoreError,
    },
    #[error(transparent)]
    Probe(#[from] probe::ProbeError),
    #[error(transparent)]
    Attest(#[from] attest::AttestError),
    #[error(transparent)]
    Leave(#[from] leave::LeaveError),
    #[error(transparent)]
    Unfence(#[from] unfence::UnfenceError),
}

impl OpError {
    /// Adapter for `map_err`: an etcd operation of the command failed.
    fn store(what: &'static str) -> impl FnOnce(StoreError) -> Self {
        move |source| Self::Store { what, source }
    }
}

/// Endpoints and root from the flags, the environment or the config file; connect,
/// waiting at most [`CLI_ETCD_WAIT`] (or `FENCED_CONNECT_TIMEOUT_SECS`).
async fn connect(etcd: &EtcdArgs) -> Result<EtcdStore, OpError> {
    let file = config::load_file(etcd.config_path().as_deref())?;
    let settings = EtcdSettings::resolve(etcd, &file)?;
    let wait = config::command_wait(CLI_ETCD_WAIT)?;
    Ok(crate::connect::connect(
        &settings,
        CLI_CLAIM_TTL,
        &StoreOptions::default(),
        Some(wait),
    )
    .await?)
}
