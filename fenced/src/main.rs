//! `fenced`: the fencing daemon and its operator CLI. Parses the command line and
//! dispatches; the settings live in [`config`], the daemon's wiring in [`daemon`],
//! the operator commands in [`ops`].
//!
//! These modules belong to the binary, not the library: they are the command line's
//! contract (flags, env vars, config keys, exit codes, error lines), while the library
//! is the protocol API other tools link against.

mod config;
mod connect;
mod control;
mod daemon;
mod generate;
mod logging;
mod ops;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::config::{ConfigError, RunArgs, Settings};
use crate::daemon::DaemonError;
use crate::ops::OpError;

#[derive(Debug, Parser)]
#[command(
    name = "fenced",
    version,
    about = "Fencing daemon: etcd membership leases, NVMe reservation preemption, generation bumps"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the node agent and the controller.
    Run(Box<RunArgs>),
    /// One row per node: member, lease renewal, generation, owed fence and why, claim
    /// holder, last fence and by whom, arenas; records that do not decode.
    Status(ops::status::StatusArgs),
    /// The fence records, failed attempts included: who fenced whom, trigger, signals,
    /// fencer evidence, step durations, generation before and after.
    Audit(ops::audit::AuditArgs),
    /// Monitoring-plugin check, one summary line: exit 0 OK, 1 WARNING, 2 CRITICAL,
    /// 3 UNKNOWN (owed fences older than a threshold, members missing, etcd endpoints
    /// out of rotation, malformed records, etcd alarms, history never compacted).
    Check(ops::check::CheckArgs),
    /// From this host: read one block of the shared device and write the same bytes
    /// back with O_DIRECT (blockio), so the data is unchanged, and, optionally, one
    /// metadata transaction guarded by a node's generation. Prints one line per probe;
    /// exit status 10 when anything was refused.
    Probe(ops::probe::ProbeArgs),
    /// Operator-attested fence: you confirmed out of band that NODE is gone (powered
    /// off, detached); supply the second confirmation. Refused for a node that never
    /// joined, while NODE is a member or being fenced, and (unless --force) while its
    /// liveness is unknown or etcd still holds the lease its agent renews. With
    /// --block-device, NODE's key is preempted and verified gone first. A node already
    /// fenced since its last membership is reported ("already fenced at generation
    /// G", exit 0) and not bumped again.
    Attest(ops::attest::AttestArgs),
    /// Approve another operator's pending `fenced attest --approvals 2` of NODE (as a
    /// different identity, with your own reason).
    Approve(ops::attest::ApproveArgs),
    /// Ask the running daemon to leave the cluster (quiesce, return arenas, depart)
    /// over its control socket; no process is signalled.
    Leave(ops::leave::LeaveArgs),
    /// Let a node fenced since its last join register again on its next start without
    /// a reboot of its host (audited; refused while the node is a member). Only once
    /// nothing on that host still writes the shared device.
    Unfence(ops::unfence::UnfenceArgs),
    /// Print the etcd roles that confine each node to its own keys (one per node, a
    /// controller role, an operator role) as etcdctl commands; --apply creates them
    /// (and a certificate-identified user per node) through etcd's auth API.
    EtcdRoles(ops::roles::RolesArgs),
    /// Man pages and shell completions, for packaging.
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

/// Why a command failed; printed as one line `fenced: ...` with its causes.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Leave(#[from] ops::leave::LeaveError),
    #[error(transparent)]
    Generate(#[from] generate::GenerateError),
}

/// The error and its causes on one line; a cause already quoted by the message
/// before it is not repeated.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cur = e;
    // A StoreError says its etcd cause in words; under it is the etcd client's own
    // error, whose text is Rust debug output.
    while cur.downcast_ref::<fenced::store::StoreError>().is_none()
        && let Some(c) = cur.source()
    {
        let text = c.to_string();
        if !line.contains(&text) {
            line = format!("{line}: {text}");
        }
        cur = c;
    }
    logging::escape(&line)
}

async fn dispatch(cmd: Cmd) -> Result<ExitCode, Error> {
    Ok(match cmd {
        Cmd::Run(args) => {
            let file = config::load_file(args.etcd.config_path().as_deref())?;
            let settings = Settings::resolve(&args, file)?;
            logging::init(settings.log_json, "info");
            daemon::run(settings).await?
        }
        Cmd::Status(args) => ops::status::status(args).await?,
        Cmd::Audit(args) => ops::audit::audit(args).await?,
        Cmd::Check(args) => ops::check::check(args).await?,
        Cmd::Probe(args) => ops::probe::probe(args).await?,
        Cmd::Attest(args) => ops::attest::attest(args).await?,
        Cmd::Approve(args) => ops::attest::approve(args).await?,
        Cmd::Leave(args) => ops::leave::leave(args).await?,
        Cmd::Unfence(args) => ops::unfence::unfence(args).await?,
        Cmd::EtcdRoles(args) => ops::roles::etcd_roles(args).await?,
        Cmd::Generate(args) => {
            generate::generate(args, Cli::command())?;
            ExitCode::SUCCESS
        }
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Test builds only: fail points configured by `FAILPOINTS` (e.g.
    // `FAILPOINTS='fence::bump=return(a/*=crash)'`, see `fenced::fencer::FaultEffect`),
    // so tests can stop a real daemon process at one protocol step and kill it there.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fenced: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !matches!(cli.cmd, Cmd::Run(_)) {
        // `run` sets up its own logging (text or JSON). The operator commands say what
        // went wrong in their one error line; `FENCED_LOG=warn` shows more (each
        // attempt to reach etcd, blockio's engine choice).
        logging::init(false, "error");
    }
    let code = match rt.block_on(dispatch(cli.cmd)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fenced: {}", one_line(&e));
            ExitCode::FAILURE
        }
    };
    // A device command stuck in the kernel (a hung path) holds a blocking thread that
    // cannot be cancelled: exit without waiting for it (a self-fence must not wait on
    // the device it could not reach).
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
