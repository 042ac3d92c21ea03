//! `fenced run`: connect to etcd (retrying), open the device, pick the fencer, start
//! the node agent and the controller, and map how the agent ended to an exit code.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced::agent::{Agent, AgentConfig, AgentError, AgentExit};
use fenced::controller::{Controller, ControllerConfig};
use fenced::fencer::{Device, Fencer, NoneFencer, NvmeFencer};
use fenced::node::local_instance_id;
use fenced::store::{EtcdStore, StoreError, StoreOptions};

use crate::config::{EbsSettings, EtcdSettings, FencerKind, Role, Settings};

/// Exit code of a daemon that self-fenced.
pub const EXIT_SELF_FENCED: u8 = 3;
/// Exit code of a leave that could not complete (peers will fence).
pub const EXIT_LEAVE_INCOMPLETE: u8 = 4;
/// Longest pause between two attempts to reach etcd.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(10);

/// etcd could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No endpoint answered within the time allowed.
    #[error(
        "etcd unreachable at {endpoints} after {waited_s:.0}s ({attempts} attempts; check that etcd runs there and --etcd-endpoints): {source}"
    )]
    Unreachable {
        endpoints: String,
        waited_s: f32,
        attempts: u32,
        #[source]
        source: StoreError,
    },
    /// The TLS handshake failed or etcd refused the credentials: retrying with the
    /// same files and user fails the same way.
    #[error("etcd at {endpoints} refused the connection (presented: {security}): {source}")]
    Refused {
        endpoints: String,
        security: String,
        #[source]
        source: StoreError,
    },
    /// An error retrying cannot fix (bad URL, a TLS file that cannot be read, ...).
    #[error("cannot use etcd at {endpoints}: {source}")]
    Unusable {
        endpoints: String,
        #[source]
        source: StoreError,
    },
}

/// The daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("cannot open {}: {source}", path.display())]
    OpenDevice {
        path: PathBuf,
        #[source]
        source: nvme_resv::Error,
    },
    #[error("cannot identify {}: {source}", path.display())]
    Identify {
        path: PathBuf,
        #[source]
        source: nvme_resv::Error,
    },
    #[error(
        "{} does not support NVMe reservations (ONCS bit 5: {oncs}, RESCAP {rescap:#04x}); use --fencer none for single-signal fencing",
        path.display()
    )]
    NoReservations {
        path: PathBuf,
        oncs: bool,
        rescap: u8,
    },
    #[error("cannot seed the free arenas: {source}")]
    SeedArenas {
        #[source]
        source: StoreError,
    },
    #[cfg(feature = "ebs")]
    #[error("cannot set up the EBS fencer: {source}")]
    Ebs {
        #[source]
        source: fenced::ebs::EbsError,
    },
    #[error("{source}")]
    Agent {
        #[source]
        source: AgentError,
    },
    #[error("cannot write pid file {}: {source}", path.display())]
    PidFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Logging of `run`: `FENCED_LOG` (default `info`), text or JSON lines, on stderr.
pub fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("FENCED_LOG").unwrap_or_else(|_| "info".into());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

/// Connects to etcd, retrying with bounded backoff while no endpoint answers; every
/// attempt is logged with the endpoints. `give_up`: stop after this long (`None`:
/// never). Errors other than "unavailable" (bad URL, a TLS file that cannot be read,
/// a certificate or credentials etcd refuses) are not retried. `etcd`'s TLS files
/// and credentials replace those of `opts`.
pub async fn connect(
    etcd: &EtcdSettings,
    claim_ttl: Duration,
    opts: &StoreOptions,
    give_up: Option<Duration>,
) -> Result<EtcdStore, ConnectError> {
    let opts = &StoreOptions {
        security: etcd.security.clone(),
        ..opts.clone()
    };
    let t0 = Instant::now();
    let mut delay = Duration::from_millis(500);
    let eps = etcd.endpoints.join(",");
    for attempt in 1.. {
        match EtcdStore::connect_with(&etcd.endpoints, &etcd.root, claim_ttl, opts).await {
            Ok(s) => {
                if attempt > 1 {
                    tracing::info!(step = "connect", endpoints = %eps, attempt, waited_s = t0.elapsed().as_secs(), "etcd at {eps} answers; starting");
                }
                return Ok(s);
            }
            Err(e @ StoreError::Unavailable { .. })
                if give_up.is_none_or(|g| t0.elapsed() + delay < g) =>
            {
                let limit = give_up.map_or("no limit".to_owned(), |g| {
                    format!("giving up after {}s", g.as_secs())
                });
                tracing::warn!(
                    step = "connect",
                    endpoints = %eps,
                    attempt,
                    error = %e,
                    "waiting for etcd at {eps}: no endpoint answers (attempt {attempt}, {:.0}s so far, {limit}); retrying in {:.1}s",
                    t0.elapsed().as_secs_f32(),
                    delay.as_secs_f32()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_CONNECT_BACKOFF);
            }
            Err(source @ StoreError::Unavailable { .. }) => {
                return Err(ConnectError::Unreachable {
                    endpoints: eps,
                    waited_s: t0.elapsed().as_secs_f32(),
                    attempts: attempt,
                    source,
                });
            }
            Err(source @ (StoreError::Tls { .. } | StoreError::Denied { .. })) => {
                return Err(ConnectError::Refused {
                    endpoints: eps,
                    security: etcd.security.describe(),
                    source,
                });
            }
            Err(source) => {
                return Err(ConnectError::Unusable {
                    endpoints: eps,
                    source,
                });
            }
        }
    }
    unreachable!("the loop returns")
}

/// Opens the shared namespace and checks that it supports reservations (also used by
/// `fenced attest --block-device`).
pub(crate) fn open_device(path: &Path) -> Result<Device, DaemonError> {
    let ns = nvme_resv::Namespace::open(path).map_err(|source| DaemonError::OpenDevice {
        path: path.to_owned(),
        source,
    })?;
    let caps = ns.capabilities().map_err(|source| DaemonError::Identify {
        path: path.to_owned(),
        source,
    })?;
    if !caps.reservations {
        return Err(DaemonError::NoReservations {
            path: path.to_owned(),
            oncs: caps.oncs_reservations,
            rescap: caps.rescap,
        });
    }
    Ok(Arc::new(ns))
}

/// The daemon's fencer: NVMe, EBS alone, NVMe then EBS (fencing levels: EBS only when
/// the NVMe fence cannot be confirmed), or single-signal. See docs/ebs.md.
/// [`Settings::resolve`] already refused the combinations that cannot work.
#[cfg(feature = "ebs")]
async fn with_ebs(
    nvme: Option<Arc<dyn Fencer>>,
    ebs: &EbsSettings,
    claim_ttl: Duration,
) -> Result<Arc<dyn Fencer>, DaemonError> {
    let Some(volume_id) = &ebs.volume_id else {
        return Ok(nvme.unwrap_or_else(|| Arc::new(NoneFencer)));
    };
    let mut cfg = fenced::ebs::EbsConfig::new(volume_id.clone());
    cfg.region.clone_from(&ebs.region);
    cfg.endpoint_url.clone_from(&ebs.endpoint_url);
    let ebs: Arc<dyn Fencer> = Arc::new(
        fenced::ebs::EbsFencer::connect(&cfg, claim_ttl)
            .await
            .map_err(|source| DaemonError::Ebs { source })?,
    );
    Ok(match nvme {
        Some(nvme) => Arc::new(fenced::ebs::FencingLevels::new(vec![nvme, ebs])),
        None => ebs,
    })
}

/// Without the `ebs` feature: NVMe or single-signal ([`Settings::resolve`] refused
/// EBS settings).
#[cfg(not(feature = "ebs"))]
#[allow(clippy::unused_async)]
async fn with_ebs(
    nvme: Option<Arc<dyn Fencer>>,
    _ebs: &EbsSettings,
    _claim_ttl: Duration,
) -> Result<Arc<dyn Fencer>, DaemonError> {
    Ok(nvme.unwrap_or_else(|| Arc::new(NoneFencer)))
}

fn write_pid_file(path: Option<&Path>) -> Result<(), DaemonError> {
    let Some(p) = path else { return Ok(()) };
    std::fs::write(p, format!("{}\n", std::process::id())).map_err(|source| DaemonError::PidFile {
        path: p.to_owned(),
        source,
    })
}

/// Runs the daemon until it leaves (SIGTERM, SIGINT) or self-fences. `--role`:
/// agent only (fences no one), controller only (joins nothing; runs until signalled),
/// or both.
pub async fn run(s: Settings) -> Result<ExitCode, DaemonError> {
    let instance = s.instance_id.clone().unwrap_or_else(local_instance_id);
    let device = match (s.fencer, &s.block_device) {
        // EBS alone severs by detaching the volume: no reservation device is needed
        // (gp3 and older io2 attachments have none).
        (FencerKind::Ebs, _) | (_, None) => None,
        (_, Some(p)) => Some(open_device(p)?),
    };
    let own_key = nvme_resv::key_for_node(s.node.as_str());
    let mut store_opts = StoreOptions::for_lease_ttl(s.ttl);
    if let Some(t) = s.etcd_keepalive_timeout {
        store_opts.keepalive_timeout = t;
    }
    let store = connect(&s.etcd, s.claim_ttl, &store_opts, s.connect_timeout).await?;
    if let Some(arenas) = &s.seed_arenas {
        store
            .add_free_arenas(arenas)
            .await
            .map_err(|source| DaemonError::SeedArenas { source })?;
    }
    let node = s.node;
    let leave = async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    // The controller (roles controller and both): fences others.
    let controller = match s.role {
        Role::Agent => None,
        Role::Controller | Role::Both => {
            let nvme: Option<Arc<dyn Fencer>> = match (s.fencer, &device) {
                (FencerKind::Nvme, Some(d)) => {
                    Some(Arc::new(NvmeFencer::new(d.clone(), own_key, s.preempt)))
                }
                _ => None,
            };
            let fencer = with_ebs(nvme, &s.ebs, s.claim_ttl).await?;
            let mut ccfg = ControllerConfig::new(format!("{node}/{instance}"));
            ccfg.sweep_interval = s.sweep;
            ccfg.own_node = (s.role == Role::Both).then(|| node.clone());
            Some(Controller::new(store.clone(), fencer, ccfg))
        }
    };
    if s.role == Role::Controller {
        write_pid_file(s.pid_file.as_deref())?;
        let task = controller.as_ref().map(Controller::spawn);
        tracing::info!(node = %node, instance = %instance, role = "controller", "fenced running (controller only)");
        leave.await;
        if let Some(t) = task {
            t.abort();
        }
        if let Some(p) = &s.pid_file {
            let _ = std::fs::remove_file(p);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut cfg = AgentConfig::new(node.clone(), instance.clone());
    cfg.ttl = s.ttl;
    cfg.self_fence_margin = s.self_fence_margin;
    cfg.arenas = s.arenas;
    cfg.watchdog_device = s.watchdog_device;
    let agent = Agent::start(store.clone(), cfg, device, own_key)
        .await
        .map_err(|source| DaemonError::Agent { source })?;
    write_pid_file(s.pid_file.as_deref())?;
    let controller = controller.as_ref().map(Controller::spawn);
    tracing::info!(node = %node, instance = %instance, role = ?s.role, generation = agent.generation(), arenas = ?agent.arenas(), "fenced running");
    let exit = agent.run(leave).await;
    if let Some(c) = controller {
        c.abort();
    }
    if let Some(p) = &s.pid_file {
        let _ = std::fs::remove_file(p);
    }
    Ok(match exit {
        AgentExit::Left => ExitCode::SUCCESS,
        AgentExit::LeaveIncomplete { reason } => {
            eprintln!("fenced: leave incomplete: {reason}");
            ExitCode::from(EXIT_LEAVE_INCOMPLETE)
        }
        AgentExit::SelfFenced { reason } => {
            eprintln!("fenced: self-fenced: {reason}");
            ExitCode::from(EXIT_SELF_FENCED)
        }
    })
}
