//! `fenced run`: connect to etcd (retrying), open the device, pick the fencer, start
//! the node agent and the controller, and map how the agent ended to an exit code.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced::agent::{Agent, AgentConfig, AgentError, AgentExit};
use fenced::controller::{Controller, ControllerConfig};
use fenced::fencer::{Device, Fencer, NamespaceCheck, NoneFencer, NvmeFencer};
use fenced::metrics::Observer;
use fenced::metrics::watchdog_loop;
use fenced::node::local_instance_id;
use fenced::notify::{Notifier, NotifyError, check_watchdog_timing};
use fenced::store::{EtcdStore, StoreError, StoreOptions};
use nvme_resv::NamespaceIdentity;

use crate::config::{EtcdSettings, FencerKind, Role, Settings, file_kind};
use crate::control::{ControlError, ControlSocket, Outcome, PidFile};

/// Exit code of a daemon that self-fenced.
pub const EXIT_SELF_FENCED: u8 = 3;
/// Exit code of a leave that could not complete (peers will fence).
pub const EXIT_LEAVE_INCOMPLETE: u8 = 4;
/// Exit code of a start refused because this node was fenced since its last join and
/// the host has not rebooted (nothing written to etcd, no reservation command), or
/// because its key was removed from the device on this boot (the once-per-boot rule:
/// joined, not registered; its membership expires).
pub const EXIT_FENCED_SAME_BOOT: u8 = 5;
/// Longest pause between two attempts to reach etcd.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(10);

/// etcd could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No endpoint answered within the time allowed.
    #[error(
        "etcd unreachable at {endpoints} (from {endpoints_from}) after {waited_s:.0}s, {attempts} attempt{}: {source}; check that etcd runs there, or give --etcd-endpoints (or --config)",
        if *attempts == 1 { "" } else { "s" }
    )]
    Unreachable {
        endpoints: String,
        endpoints_from: String,
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
    /// `--block-device` does not resolve (missing, a dangling link): the OS cause
    /// follows as the source.
    #[error(
        "cannot open {}: {source}; check --block-device: name the shared namespace that exists on this host (/dev/nvmeXnY, /dev/ngXnY, or better a /dev/disk/by-id/ link, which stays the same across boots: `ls -l /dev/disk/by-id/ | grep nvme` lists them)",
        path.display()
    )]
    ResolveDevice {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} ({}) reports no UUID, NGUID or EUI-64 and its controller no serial number ({identity}): fenced cannot tell it from another namespace of its subsystem, so it cannot check that every node and controller uses the same namespace. Give the namespace an identifier (nvmet: configfs device_uuid or device_nguid) or, knowing the risk, pass --allow-unidentified-namespace",
        path.display(), device.display()
    )]
    UnidentifiedNamespace {
        path: PathBuf,
        device: PathBuf,
        identity: Box<NamespaceIdentity>,
    },
    /// `--ebs-volume-id` names one EBS volume and the block device is another.
    #[error(
        "{} ({}) is EBS volume {found} (its serial number {identity}), not the --ebs-volume-id {configured}: the EBS fencer would detach a volume other than the one the reservations are on. Name this host's device of {configured} (/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{}), or the volume of this device",
        path.display(), device.display(), configured.replace('-', "")
    )]
    WrongEbsVolume {
        path: PathBuf,
        device: PathBuf,
        identity: Box<NamespaceIdentity>,
        found: String,
        configured: String,
    },
    #[error("{}", open_message(path, source))]
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
    #[error("cannot seed or check the arena pool: {source}")]
    SeedArenas {
        #[source]
        source: StoreError,
    },
    /// Arena records of the layout before per-node claims: this version neither reads
    /// nor writes them, so running next to them could give an arena two owners.
    #[error(
        "etcd under {root} holds arena records of the layout before per-node claims, which this fenced does not read: {records}; stop every older fenced, then start one fenced with --seed-arenas naming these arenas (controller or root credentials) to convert them"
    )]
    LegacyArenas { root: String, records: String },
    #[cfg(feature = "ebs")]
    #[error("{source}")]
    Ebs {
        #[source]
        source: fenced::ebs::JoinError,
    },
    #[error("{source}")]
    Agent {
        #[source]
        source: AgentError,
    },
    /// etcd refused node `node`'s own keys to the identity this host presented: the
    /// certificate or user of another node.
    #[error(
        "etcd refused node {node}'s own keys to identity {identity:?} (the --etcd-user, else the client certificate's CN): a node's identity may write only its own keys (role fenced-node-{identity}), so it cannot act as node {node}; give this host {node}'s certificate or user, or run it as --node-id {identity}: {source}"
    )]
    NotThisNode {
        node: String,
        identity: String,
        #[source]
        source: Box<AgentError>,
    },
    #[error("{source}")]
    BootId {
        #[source]
        source: fenced::agent::boot::BootIdError,
    },
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Notify(#[from] NotifyError),
    #[error("systemd watchdog: {why}")]
    WatchdogTiming { why: String },
    #[error("cannot serve metrics on {addr}: {source} (choose another --metrics-listen address)")]
    MetricsListen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The instance id the host reports does not satisfy the rule.
    #[error("this host's instance id cannot be used: {source}; set --instance-id")]
    HostInstanceId {
        #[source]
        source: fenced::instance::InvalidInstanceId,
    },
    /// `--on-fence reboot` could not reboot this host (the SysRq trigger).
    #[error("{why}")]
    OnFence { why: String },
    #[error("cannot use watchdog {}: {why}", path.display())]
    Watchdog { path: PathBuf, why: String },
    #[error("cannot install the {signal} handler: {source}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// etcd refuses writes (a raised alarm): no join, claim or bump could be recorded.
    #[error("refusing to start: {what}")]
    EtcdSpace { what: String },
}

/// etcd's history and space, checked once at start (fenced::store::space; README
/// "etcd compaction and quota"): a raised alarm refuses the start, as every write
/// (a fence's too) would fail; anything else is one warning line. A check that cannot
/// run is a warning, never a refusal.
async fn check_etcd_space(store: &EtcdStore) -> Result<(), DaemonError> {
    use fenced::store::{HISTORY_WARNING_REVISIONS, SpaceLevel, judge_space};
    match store.space_report().await {
        Ok(r) => {
            let findings = judge_space(&r, HISTORY_WARNING_REVISIONS);
            if let Some(f) = findings.iter().find(|f| f.level == SpaceLevel::Error) {
                return Err(DaemonError::EtcdSpace {
                    what: f.text.clone(),
                });
            }
            for f in findings {
                tracing::warn!(step = "etcd_space", "{}", f.text);
            }
            if let Some(w) = fenced::store::lease_revocation_warning(&r.version) {
                tracing::warn!(step = "etcd_version", "{w}");
            }
        }
        Err(e) => {
            tracing::warn!(step = "etcd_space", error = %e, "cannot check etcd's history and space (README: etcd compaction and quota)");
        }
    }
    Ok(())
}

/// Attempts in a row whose TLS connection the server closed right after accepting it
/// before `connect` takes it for a refused client certificate (a server going away
/// closes one attempt's, not every one's).
const CLOSED_TLS_ATTEMPTS: u32 = 3;

/// Connects to etcd, retrying with bounded backoff while no endpoint answers; every
/// attempt is logged with the endpoints. `give_up`: stop after this long (`None`:
/// never). Errors other than "unavailable" (bad URL, a TLS file that cannot be read,
/// a certificate or credentials etcd refuses) are not retried, nor is a TLS
/// connection the server closes at once on [`CLOSED_TLS_ATTEMPTS`] attempts in a row.
/// `etcd`'s TLS files and credentials replace those of `opts`.
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
    let tls = etcd.endpoints.iter().all(|e| e.starts_with("https://"));
    // Consecutive attempts whose TLS connection the server closed at once.
    let mut closed = 0;
    for attempt in 1.. {
        let attempt_fut = EtcdStore::connect_with(&etcd.endpoints, &etcd.root, claim_ttl, opts);
        // A member that accepts TCP and never answers would hold one attempt for the
        // client's own timeouts: bound it by what is left of the wait.
        let result = match give_up {
            Some(g) => {
                let left = g
                    .saturating_sub(t0.elapsed())
                    .max(Duration::from_millis(200));
                match tokio::time::timeout(left, attempt_fut).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::Unavailable {
                        op: "connect",
                        source: etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                            format!("no answer within {:.1}s", left.as_secs_f32()),
                        )),
                    }),
                }
            }
            None => attempt_fut.await,
        };
        closed = match &result {
            Err(e) if tls && e.is_closed_by_server() => closed + 1,
            _ => 0,
        };
        match result {
            Err(e) if closed >= CLOSED_TLS_ATTEMPTS => {
                return Err(ConnectError::Refused {
                    endpoints: eps,
                    security: etcd.security.describe(),
                    source: e.into_tls_refused(),
                });
            }
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
                    endpoints_from: etcd.endpoints_from.clone(),
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

/// "cannot open <path>: <why>", without repeating the device error's own "cannot
/// open <path>" (its OS cause follows as the error's source).
fn open_message(path: &Path, source: &nvme_resv::Error) -> String {
    let inner = source.to_string();
    if inner.starts_with("cannot open") {
        inner
    } else {
        format!("cannot open {}: {inner}", path.display())
    }
}

/// Opens `path` resolved (a `/dev/disk/by-id/` link names the same namespace across
/// boots) and checks that it supports reservations. Returns the namespace and the
/// device node the path resolved to.
fn open_reservations(path: &Path) -> Result<(nvme_resv::Namespace, PathBuf), DaemonError> {
    let device = std::fs::canonicalize(path).map_err(|source| DaemonError::ResolveDevice {
        path: path.to_owned(),
        source,
    })?;
    let ns = nvme_resv::Namespace::open(&device).map_err(|source| DaemonError::OpenDevice {
        path: device.clone(),
        source,
    })?;
    let caps = ns.capabilities().map_err(|source| DaemonError::Identify {
        path: device.clone(),
        source,
    })?;
    if !caps.reservations {
        return Err(DaemonError::NoReservations {
            path: device,
            oncs: caps.oncs_reservations,
            rescap: caps.rescap,
        });
    }
    Ok((ns, device))
}

/// Opens a namespace that supports reservations (`fenced attest --block-device`).
pub(crate) fn open_device(path: &Path) -> Result<Device, DaemonError> {
    open_reservations(path).map(|(ns, _)| Arc::new(ns) as Device)
}

/// Opens the shared namespace ([`open_reservations`]; both names are logged) and reads
/// its identity for the join and fence checks ([`check_shared_namespace`]).
fn open_shared_namespace(
    path: &Path,
    allow_unidentified: bool,
    ebs_volume_id: Option<&str>,
) -> Result<(Device, NamespaceIdentity), DaemonError> {
    let (ns, device) = open_reservations(path)?;
    let identity = ns
        .namespace_identity()
        .map_err(|source| DaemonError::Identify {
            path: device.clone(),
            source,
        })?;
    check_shared_namespace(path, &device, &identity, allow_unidentified, ebs_volume_id)?;
    tracing::info!(block_device = %path.display(), device = %device.display(), nsid = ns.nsid(), namespace = %identity, kind = identity.kind().map_or("none", |k| k.as_str()), wwid = %identity.wwid(), "shared namespace device");
    Ok((Arc::new(ns), identity))
}

/// Whether the shared namespace's identity lets the daemon start: a namespace named by
/// a UUID, NGUID, EUI-64 or (none of them) its controller's serial number starts with
/// default flags; one with none of these only with `allow_unidentified`. With
/// `--ebs-volume-id`, a namespace that is an EBS volume must be that volume (EC2
/// reports the volume id as the serial number, without the dash).
fn check_shared_namespace(
    path: &Path,
    device: &Path,
    identity: &NamespaceIdentity,
    allow_unidentified: bool,
    ebs_volume_id: Option<&str>,
) -> Result<(), DaemonError> {
    if let Some(configured) = ebs_volume_id {
        if let Some(found) = fenced::fencer::other_ebs_volume(identity, configured) {
            return Err(DaemonError::WrongEbsVolume {
                path: path.to_owned(),
                device: device.to_owned(),
                identity: Box::new(identity.clone()),
                found,
                configured: configured.to_owned(),
            });
        }
    }
    if !identity.is_identified() {
        if !allow_unidentified {
            return Err(DaemonError::UnidentifiedNamespace {
                path: path.to_owned(),
                device: device.to_owned(),
                identity: Box::new(identity.clone()),
            });
        }
        tracing::warn!(block_device = %path.display(), device = %device.display(), namespace = %identity, "--allow-unidentified-namespace: the namespace reports no UUID, NGUID or EUI-64 and its controller no serial number; only its subsystem NQN is checked, another namespace of the same subsystem would pass");
    }
    Ok(())
}

/// With `--ebs-volume-id`: the EBS fencer, and the instance id to join with, checked
/// against the volume's attachments (`fenced::ebs::JoinError`: a wrong id is refused
/// here, before anything is written). Without: the configured or host instance id.
#[cfg(feature = "ebs")]
async fn ebs_join(s: &Settings) -> Result<(String, Option<EbsLevel>), DaemonError> {
    let Some(volume_id) = &s.ebs.volume_id else {
        return Ok((
            s.instance_id.clone().unwrap_or_else(local_instance_id),
            None,
        ));
    };
    let mut cfg = fenced::ebs::EbsConfig::new(volume_id.clone());
    cfg.region.clone_from(&s.ebs.region);
    cfg.endpoint_url.clone_from(&s.ebs.endpoint_url);
    let (fencer, instance) =
        fenced::ebs::connect_and_check(&cfg, s.instance_id.as_deref(), s.claim_ttl)
            .await
            .map_err(|source| DaemonError::Ebs { source })?;
    Ok((instance, Some(fencer)))
}

#[cfg(not(feature = "ebs"))]
#[allow(clippy::unused_async)]
async fn ebs_join(s: &Settings) -> Result<(String, Option<EbsLevel>), DaemonError> {
    // [`Settings::resolve`] refused EBS settings in this build.
    debug_assert!(s.ebs.volume_id.is_none());
    Ok((
        s.instance_id.clone().unwrap_or_else(local_instance_id),
        None,
    ))
}

#[cfg(feature = "ebs")]
type EbsLevel = fenced::ebs::EbsFencer;
#[cfg(not(feature = "ebs"))]
type EbsLevel = std::convert::Infallible;

/// The daemon's fencer: NVMe, EBS alone, NVMe then EBS (fencing levels: EBS only when
/// the NVMe fence cannot be confirmed), or single-signal. See docs/ebs.md. The EBS
/// fencer learns the other nodes' instance ids from `store`.
/// [`Settings::resolve`] already refused the combinations that cannot work.
#[cfg(feature = "ebs")]
fn with_ebs(
    nvme: Option<Arc<dyn Fencer>>,
    ebs: Option<EbsLevel>,
    store: &EtcdStore,
) -> Arc<dyn Fencer> {
    let Some(ebs) = ebs else {
        return nvme.unwrap_or_else(|| Arc::new(NoneFencer));
    };
    let ebs: Arc<dyn Fencer> = Arc::new(ebs.with_known_instances(Arc::new(store.clone())));
    match nvme {
        Some(nvme) => Arc::new(fenced::ebs::FencingLevels::new(vec![nvme, ebs])),
        None => ebs,
    }
}

/// Without the `ebs` feature: NVMe or single-signal ([`Settings::resolve`] refused
/// EBS settings).
#[cfg(not(feature = "ebs"))]
fn with_ebs(
    nvme: Option<Arc<dyn Fencer>>,
    _ebs: Option<EbsLevel>,
    _store: &EtcdStore,
) -> Arc<dyn Fencer> {
    nvme.unwrap_or_else(|| Arc::new(NoneFencer))
}

/// A start refused by the restart rule: the message, and exit status 5.
fn fenced_same_boot(e: &fenced::agent::FencedSameBoot) -> ExitCode {
    tracing::error!(step = "restart_check", node = %e.node, generation = e.generation, joined_generation = e.joined_generation, "refusing to register: fenced since the last join, same boot");
    eprintln!("fenced: {e}");
    ExitCode::from(EXIT_FENCED_SAME_BOOT)
}

/// A registration refused by the once-per-boot rule (joined, key gone from the device,
/// an earlier daemon on this boot registered it): the message, and exit status 5.
fn key_removed_same_boot(e: &fenced::agent::KeyRemovedSameBoot) -> ExitCode {
    tracing::error!(step = "unfence", node = %e.node, boot_id = %e.boot_id, "refusing to register: the key was removed from the device on this boot");
    eprintln!("fenced: {e}");
    ExitCode::from(EXIT_FENCED_SAME_BOOT)
}

/// A watchdog is a character device (or a regular file standing in for one, as in
/// tests: it is warned about). It is opened, and so armed, only by the agent; a FIFO
/// would block that open and a directory cannot be written, so both are refused here,
/// before anything touches etcd.
fn check_watchdog(path: &Path) -> Result<(), DaemonError> {
    let why = match std::fs::metadata(path) {
        Err(e) => e.to_string(),
        Ok(m) if m.file_type().is_char_device() => return Ok(()),
        Ok(m) if m.file_type().is_file() => {
            tracing::warn!(path = %path.display(), "--watchdog-device is a regular file, not a watchdog device: nothing reboots this host if the daemon hangs");
            return Ok(());
        }
        Ok(m) => format!(
            "it is a {}, not a watchdog character device",
            file_kind(m.file_type())
        ),
    };
    Err(DaemonError::Watchdog {
        path: path.to_owned(),
        why: format!("{why}; check --watchdog-device"),
    })
}

/// `source` as the daemon's error; a refusal of the node's own keys names the identity
/// presented and the node it tried to act as, when they differ.
fn agent_error(source: AgentError, node: &fenced::NodeId, etcd: &EtcdSettings) -> DaemonError {
    if let AgentError::Store(StoreError::Denied { .. }) = &source
        && let Some(identity) = etcd.security.identity()
        && identity != node.as_str()
    {
        return DaemonError::NotThisNode {
            node: node.as_str().to_owned(),
            identity,
            source: Box::new(source),
        };
    }
    DaemonError::Agent { source }
}

/// Runs the daemon until it leaves (SIGTERM, SIGINT, `fenced leave`) or self-fences.
///
/// Order: everything that can be refused is checked or set up (instance id, watchdog,
/// the SysRq trigger of `--on-fence reboot`, pid file, control socket, device, etcd connection, EBS client) before the first
/// etcd write (`--seed-arenas`, then the join).
pub async fn run(s: Settings) -> Result<ExitCode, DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    // systemd (Type=notify, WatchdogSec=), metrics and health: set up before anything
    // touches the cluster, so a bad setting fails the start.
    let notifier = Arc::new(Notifier::from_env()?);
    if let Some(wd) = notifier.watchdog() {
        check_watchdog_timing(wd, s.ttl, s.self_fence_margin)
            .map_err(|why| DaemonError::WatchdogTiming { why })?;
    }
    let observer = Observer::new();
    observer.set_notifier(notifier.clone());
    let _metrics = match s.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::MetricsListen { addr, source })?;
            tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
            Some(AbortOnDrop(tokio::spawn(fenced::metrics::serve(
                listener,
                observer.clone(),
            ))))
        }
        None => None,
    };
    if s.instance_id.is_none() {
        fenced::instance::check_instance_id(&local_instance_id())
            .map_err(|source| DaemonError::HostInstanceId { source })?;
    }
    if let Some(w) = &s.watchdog_device {
        check_watchdog(w)?;
    }
    if s.on_fence.action == fenced::agent::OnFence::Reboot {
        fenced::agent::check_reboot(&s.on_fence.sysrq_trigger)
            .map_err(|why| DaemonError::OnFence { why })?;
    }
    let pid_file = match &s.pid_file {
        Some(p) => Some(PidFile::create(p, s.control_socket.as_deref())?),
        None => None,
    };
    let (leave_tx, mut leave_rx) = tokio::sync::mpsc::channel(4);
    let control = match &s.control_socket {
        Some(p) => Some(ControlSocket::bind(p, leave_tx)?),
        None => None,
    };
    // With EBS: the instance id is checked against the volume's attachments (EC2 reads
    // only), still before anything is written.
    let (instance, ebs) = ebs_join(&s).await?;
    let (device, namespace) = match (s.fencer, &s.block_device) {
        // EBS alone severs by detaching the volume: no reservation device is needed
        // (gp3 and older io2 attachments have none).
        (FencerKind::Ebs, _) | (_, None) => (None, None),
        (_, Some(p)) => {
            let (d, id) = open_shared_namespace(
                p,
                s.allow_unidentified_namespace,
                s.ebs.volume_id.as_deref(),
            )?;
            (Some(d), Some(id))
        }
    };
    let device = device.map(|d| fenced::device::ObservedDevice::wrap(d, observer.clone()));
    let own_key = nvme_resv::key_for_node(s.node.as_str());
    let mut store_opts = StoreOptions::for_lease_ttl(s.ttl);
    if let Some(t) = s.etcd_keepalive_timeout {
        store_opts.keepalive_timeout = t;
    }
    let boot_id = fenced::agent::read_boot_id(&s.boot_id_file)
        .map_err(|source| DaemonError::BootId { source })?;
    // Waiting for etcd can take as long as etcd is away: a `fenced leave` meanwhile
    // ends the wait (nothing was joined, nothing is left behind). SIGTERM still has its
    // default action until the agent has joined.
    observer.set_status(format!(
        "waiting for etcd at {}",
        s.etcd.endpoints.join(",")
    ));
    let store = tokio::select! {
        r = connect(&s.etcd, s.claim_ttl, &store_opts, s.connect_timeout) => r?,
        Some(()) = leave_rx.recv() => {
            tracing::info!(step = "leave", "leave requested before joining: exiting");
            if let Some(c) = &control {
                c.answer(&Outcome::Left).await;
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    check_etcd_space(&store).await?;
    let node = s.node;
    let mut cfg = AgentConfig::new(node.clone(), instance.clone());
    // The restart rule, before this daemon writes anything (see fenced::agent::boot).
    cfg.boot_id = Some(boot_id);
    cfg.on_fence = s.on_fence;
    // A controller alone registers no key, so the restart rule does not apply to it.
    if s.role != Role::Controller {
        match Agent::check_restart(&store, &cfg).await {
            Err(AgentError::FencedSameBoot(e)) => return Ok(fenced_same_boot(&e)),
            Err(source) => return Err(agent_error(source, &node, &s.etcd)),
            Ok(_) => {}
        }
    }
    let nvme: Option<Arc<dyn Fencer>> = match (s.fencer, &device, &namespace) {
        (FencerKind::Nvme, Some(d), Some(id)) => Some(Arc::new(
            // Every fence identifies the device again and compares it with the record.
            NvmeFencer::new(d.clone(), own_key, s.preempt).with_namespace(NamespaceCheck {
                joined: id.clone(),
                record: Some(Arc::new(store.clone())),
            }),
        )),
        _ => None,
    };
    let fencer = with_ebs(nvme, ebs, &store);
    // The first etcd write: everything above could still refuse without a trace.
    if let Some(arenas) = &s.seed_arenas {
        store
            .add_free_arenas(arenas)
            .await
            .map_err(|source| DaemonError::SeedArenas { source })?;
    }
    let legacy = store
        .legacy_arenas()
        .await
        .map_err(|source| DaemonError::SeedArenas { source })?;
    if !legacy.is_empty() {
        return Err(DaemonError::LegacyArenas {
            root: store.keys().root().to_owned(),
            records: legacy
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let _endpoints = AbortOnDrop(tokio::spawn(fenced::metrics::follow_endpoints(
        store.clone(),
        observer.clone(),
    )));
    let signal_err = |signal| move |source| DaemonError::Signal { signal, source };
    let mut term = signal(SignalKind::terminate()).map_err(signal_err("SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_err("SIGINT"))?;
    // `--role`: the controller alone joins nothing and runs until told to stop; the
    // agent alone fences no one.
    let mut ccfg = ControllerConfig::new(format!("{node}/{instance}"));
    let leaving = ccfg.leaving.clone();
    let leave = async {
        tokio::select! {
            _ = term.recv() => tracing::info!(step = "leave", "SIGTERM: leaving"),
            _ = int.recv() => tracing::info!(step = "leave", "SIGINT: leaving"),
            Some(()) = leave_rx.recv() => {}
        }
        leaving.store(true, std::sync::atomic::Ordering::Relaxed);
        observer.set_joined(false);
        notifier.stopping(&format!(
            "leaving: {node} quiesces I/O, returns its arenas, departs"
        ));
    };
    ccfg.sweep_interval = s.sweep;
    ccfg.own_node = (s.role == Role::Both).then(|| node.clone());
    ccfg.observer = observer.clone();
    // A controller alone keeps its own presence lease, as long-lived as a membership.
    ccfg.presence_ttl = s.ttl;
    let _watchdog = notifier.watchdog().map(|wd| {
        AbortOnDrop(tokio::spawn(watchdog_loop(
            notifier.clone(),
            observer.clone(),
            wd,
        )))
    });
    if s.role == Role::Controller {
        let controller = Controller::new(store, fencer, ccfg).spawn();
        observer.ready_without_agent(format!("controller {node} running (no membership)"));
        tracing::info!(node = %node, instance = %instance, role = "controller", "fenced running (controller only)");
        leave.await;
        controller.abort();
        if let Some(c) = &control {
            c.answer(&Outcome::Left).await;
        }
        drop(control);
        drop(pid_file);
        return Ok(ExitCode::SUCCESS);
    }
    cfg.ttl = s.ttl;
    cfg.self_fence_margin = s.self_fence_margin;
    cfg.arenas = s.arenas;
    cfg.watchdog_device = s.watchdog_device;
    cfg.namespace = namespace;
    cfg.observer = observer.clone();
    observer.set_status(format!("joining as {node}: unfencing, claiming arenas"));
    let agent = match Agent::start(store.clone(), cfg, device, own_key).await {
        Err(AgentError::FencedSameBoot(e)) => return Ok(fenced_same_boot(&e)),
        Err(AgentError::KeyRemovedSameBoot(e)) => return Ok(key_removed_same_boot(&e)),
        r => r.map_err(|source| agent_error(source, &node, &s.etcd))?,
    };
    // The controller's presence goes with our membership: a dead daemon is never
    // ranked first for a death for longer than its membership outlives it.
    ccfg.presence_lease = Some(agent.lease());
    let controller = (s.role == Role::Both).then(|| Controller::new(store, fencer, ccfg).spawn());
    // Joined, unfenced, arenas claimed: ready.
    observer.ready(format!(
        "member {node} at generation {}",
        agent.generation()
    ));
    tracing::info!(node = %node, instance = %instance, role = ?s.role, generation = agent.generation(), arenas = ?agent.arenas(), "fenced running");
    let exit = agent.run(leave).await;
    observer.set_joined(false);
    if let Some(c) = controller {
        c.abort();
    }
    let outcome = match &exit {
        AgentExit::Left => Outcome::Left,
        AgentExit::LeaveIncomplete { reason } => Outcome::Incomplete(reason.clone()),
        AgentExit::SelfFenced { reason } => Outcome::SelfFenced(reason.clone()),
    };
    if let Some(c) = &control {
        c.answer(&outcome).await;
    }
    drop(control);
    drop(pid_file);
    Ok(match outcome {
        Outcome::Left => ExitCode::SUCCESS,
        Outcome::Incomplete(reason) => {
            observer.set_status(format!("leave incomplete: {reason}"));
            eprintln!(
                "fenced: leave incomplete: {}",
                crate::logging::escape(&reason)
            );
            ExitCode::from(EXIT_LEAVE_INCOMPLETE)
        }
        Outcome::SelfFenced(reason) => {
            observer.set_status(format!("self-fenced: {reason}"));
            eprintln!("fenced: self-fenced: {}", crate::logging::escape(&reason));
            ExitCode::from(EXIT_SELF_FENCED)
        }
    })
}

/// A spawned task that ends with the daemon.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(id: &NamespaceIdentity, allow: bool, ebs: Option<&str>) -> Result<(), DaemonError> {
        check_shared_namespace(
            Path::new("/dev/disk/by-id/x"),
            Path::new("/dev/nvme0n1"),
            id,
            allow,
            ebs,
        )
    }

    fn ebs(volume: &str) -> NamespaceIdentity {
        NamespaceIdentity {
            vid: nvme_resv::identity::AMAZON_VID,
            serial: volume.as_bytes().to_vec(),
            model: nvme_resv::identity::EBS_MODEL.as_bytes().to_vec(),
            nsid: 1,
            ..NamespaceIdentity::default()
        }
    }

    /// Issue 27: the kernel target's default namespace (a UUID only) and an EBS volume
    /// (a serial number only) start with default flags.
    #[test]
    fn uuid_only_and_serial_only_namespaces_start_with_default_flags() {
        let uuid_only = NamespaceIdentity {
            uuid: [0x3c; 16],
            subnqn: "nqn.2014-08.org.fenced:hwtest".into(),
            ..NamespaceIdentity::default()
        };
        check(&uuid_only, false, None).unwrap();
        check(&ebs("vol0123456789abcdef0"), false, None).unwrap();
        check(
            &ebs("vol0123456789abcdef0"),
            false,
            Some("vol-0123456789abcdef0"),
        )
        .unwrap();
    }

    #[test]
    fn only_a_namespace_without_any_identifier_needs_the_override() {
        let e = check(&ebs(""), false, None).unwrap_err();
        assert!(
            matches!(e, DaemonError::UnidentifiedNamespace { .. }),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("no UUID, NGUID or EUI-64 and its controller no serial number")
                && text.contains("--allow-unidentified-namespace"),
            "{text}"
        );
        check(&ebs(""), true, None).unwrap();
    }

    #[test]
    fn an_ebs_volume_other_than_the_configured_one_is_refused() {
        let e = check(
            &ebs("vol0123456789abcdef0"),
            false,
            Some("vol-0fedcba9876543210"),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, DaemonError::WrongEbsVolume { found, .. } if found == "vol-0123456789abcdef0"),
            "{e:?}"
        );
        assert!(
            text.contains("is EBS volume vol-0123456789abcdef0")
                && text.contains("not the --ebs-volume-id vol-0fedcba9876543210")
                && text.contains("nvme-Amazon_Elastic_Block_Store_vol0fedcba9876543210"),
            "{text}"
        );
        // Even with the override: it is about which volume, not whether it is named.
        assert!(
            check(
                &ebs("vol0123456789abcdef0"),
                true,
                Some("vol-0fedcba9876543210")
            )
            .is_err()
        );
    }
}
