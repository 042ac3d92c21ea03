//! `fenced run`: connect to etcd (retrying), open the device, pick the fencer, start
//! the node agent and the controller, and map how the agent ended to an exit code.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use fenced::agent::{Agent, AgentConfig, AgentError, AgentExit};
use fenced::controller::{Controller, ControllerConfig};
use fenced::device::{Device, NamespaceCheck};
use fenced::fencer::{Fencer, NoneFencer, NvmeFencer};
use fenced::metrics::Observer;
use fenced::metrics::watchdog_loop;
use fenced::node::local_instance_id;
use fenced::notify::{Notifier, NotifyError, check_watchdog_timing};
use fenced::store::{EtcdStore, StoreError, StoreOptions};
use nvme_resv::NamespaceIdentity;

use crate::config::{EtcdSettings, FencerKind, Role, Settings, file_kind};
use crate::connect::{ConnectError, OpenError, connect, open_shared_namespace};
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

/// The daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The shared namespace could not be opened or used.
    #[error(transparent)]
    Open(#[from] OpenError),
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
/// the SysRq trigger of `--on-fence reboot`, pid file, control socket, device, etcd
/// connection, EBS client) before the first etcd write (`--seed-arenas`, then the
/// join). The steps, in order: [`prepare_host`], [`ebs_join`], [`open_namespace`],
/// [`wait_for_etcd`], [`check_etcd_space`], the restart rule, [`pick_fencer`],
/// [`first_writes`]; then [`run_controller_alone`] or the agent (with the controller
/// beside it for `--role both`), and [`finish`].
pub async fn run(s: Settings) -> Result<ExitCode, DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let Host {
        notifier,
        observer,
        metrics: _metrics,
        pid_file,
        control,
        mut leave_rx,
    } = prepare_host(&s).await?;
    // With EBS: the instance id is checked against the volume's attachments (EC2 reads
    // only), still before anything is written.
    let (instance, ebs) = ebs_join(&s).await?;
    let (device, namespace, cptpl, persistence) = open_namespace(&s, &observer)?;
    let own_key = nvme_resv::key_for_node(s.node.as_str());
    let boot_id = fenced::agent::read_boot_id(&s.boot_id_file)
        .map_err(|source| DaemonError::BootId { source })?;
    let Some(store) = wait_for_etcd(&s, &observer, &mut leave_rx, control.as_ref()).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    // A first join records it with the namespace's identity (`fenced status` shows it).
    let store = store.with_namespace_persistence(persistence);
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
    let fencer = pick_fencer(
        s.fencer,
        s.preempt,
        device.as_ref(),
        namespace.as_ref(),
        own_key,
        ebs,
        &store,
    );
    first_writes(s.seed_arenas.as_deref(), &store).await?;
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
        return Ok(run_controller_alone(controller, leave, control, pid_file).await);
    }
    cfg.ttl = s.ttl;
    cfg.self_fence_margin = s.self_fence_margin;
    cfg.arenas = s.arenas;
    cfg.watchdog_device = s.watchdog_device;
    cfg.namespace = namespace;
    cfg.cptpl = cptpl;
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
    Ok(finish(&exit, &observer, control, pid_file).await)
}

/// What [`prepare_host`] set up on this host; dropped when the daemon ends.
struct Host {
    notifier: Arc<Notifier>,
    observer: Observer,
    /// The `/metrics` server.
    metrics: Option<AbortOnDrop>,
    pid_file: Option<PidFile>,
    control: Option<ControlSocket>,
    /// `fenced leave` on the control socket.
    leave_rx: tokio::sync::mpsc::Receiver<()>,
}

/// Step 1, before anything touches the cluster, so a bad setting fails the start:
/// systemd (Type=notify, WatchdogSec=), metrics and health, the instance id, the
/// watchdog device, the SysRq trigger, the pid file and the control socket.
async fn prepare_host(s: &Settings) -> Result<Host, DaemonError> {
    let notifier = Arc::new(Notifier::from_env()?);
    if let Some(wd) = notifier.watchdog() {
        check_watchdog_timing(wd, s.ttl, s.self_fence_margin)
            .map_err(|why| DaemonError::WatchdogTiming { why })?;
    }
    let observer = Observer::new();
    observer.set_notifier(notifier.clone());
    let metrics = match s.metrics_listen {
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
    let (leave_tx, leave_rx) = tokio::sync::mpsc::channel(4);
    let control = match &s.control_socket {
        Some(p) => Some(ControlSocket::bind(p, leave_tx)?),
        None => None,
    };
    Ok(Host {
        notifier,
        observer,
        metrics,
        pid_file,
        control,
        leave_rx,
    })
}

/// The shared namespace as [`open_namespace`] found it: the device, its identity, the
/// CPTPL its registrations use and its persistence (recorded with the identity at the
/// first join, shown by `fenced status`).
type OpenedNamespace = (
    Option<Device>,
    Option<NamespaceIdentity>,
    nvme_resv::Cptpl,
    Option<fenced::core::Persistence>,
);

/// Step 3: the shared namespace, opened and identified (and the CPTPL its registrations
/// use: persist where the device can), its commands timed
/// ([`fenced::device::ObservedDevice`]); none for EBS alone or without
/// `--block-device`.
fn open_namespace(s: &Settings, observer: &Observer) -> Result<OpenedNamespace, DaemonError> {
    match (s.fencer, &s.block_device) {
        // EBS alone severs by detaching the volume: no reservation device is needed
        // (gp3 and older io2 attachments have none).
        (FencerKind::Ebs, _) | (_, None) => Ok((None, None, nvme_resv::Cptpl::NoChange, None)),
        (_, Some(p)) => {
            let (d, id, cptpl, persistence) = open_shared_namespace(
                p,
                s.allow_unidentified_namespace,
                s.ebs.volume_id.as_deref(),
            )?;
            let d = fenced::device::ObservedDevice::wrap(d, observer.clone());
            Ok((Some(d), Some(id), cptpl, Some(persistence)))
        }
    }
}

/// Step 4: connect to etcd. Waiting for etcd can take as long as etcd is away: a
/// `fenced leave` meanwhile ends the wait (`None`: nothing was joined, nothing is left
/// behind). SIGTERM still has its default action until the agent has joined.
async fn wait_for_etcd(
    s: &Settings,
    observer: &Observer,
    leave_rx: &mut tokio::sync::mpsc::Receiver<()>,
    control: Option<&ControlSocket>,
) -> Result<Option<EtcdStore>, DaemonError> {
    let mut store_opts = StoreOptions::for_lease_ttl(s.ttl);
    if let Some(t) = s.etcd_keepalive_timeout {
        store_opts.keepalive_timeout = t;
    }
    observer.set_status(format!(
        "waiting for etcd at {}",
        s.etcd.endpoints.join(",")
    ));
    tokio::select! {
        r = connect(&s.etcd, s.claim_ttl, &store_opts, s.connect_timeout) => Ok(Some(r?)),
        Some(()) = leave_rx.recv() => {
            tracing::info!(step = "leave", "leave requested before joining: exiting");
            if let Some(c) = control {
                c.answer(&Outcome::Left).await;
            }
            Ok(None)
        }
    }
}

/// Step 6: the fencer. With NVMe, every fence identifies the device again and compares
/// it with the record; EBS joins as a level ([`with_ebs`]).
fn pick_fencer(
    kind: FencerKind,
    preempt: fenced::fencer::PreemptMode,
    device: Option<&Device>,
    namespace: Option<&NamespaceIdentity>,
    own_key: nvme_resv::Key,
    ebs: Option<EbsLevel>,
    store: &EtcdStore,
) -> Arc<dyn Fencer> {
    let nvme: Option<Arc<dyn Fencer>> = match (kind, device, namespace) {
        (FencerKind::Nvme, Some(d), Some(id)) => Some(Arc::new(
            NvmeFencer::new(d.clone(), own_key, preempt).with_namespace(NamespaceCheck {
                joined: id.clone(),
                record: Some(Arc::new(store.clone())),
            }),
        )),
        _ => None,
    };
    with_ebs(nvme, ebs, store)
}

/// Step 7, the first etcd writes (everything before could still refuse without a
/// trace): `--seed-arenas`, then refuse arena records of the older layout.
async fn first_writes(seed: Option<&[String]>, store: &EtcdStore) -> Result<(), DaemonError> {
    if let Some(arenas) = seed {
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
    Ok(())
}

/// `--role controller`: runs until told to leave, then answers `fenced leave`.
async fn run_controller_alone(
    controller: tokio::task::JoinHandle<()>,
    leave: impl std::future::Future<Output = ()>,
    control: Option<ControlSocket>,
    pid_file: Option<PidFile>,
) -> ExitCode {
    leave.await;
    controller.abort();
    if let Some(c) = &control {
        c.answer(&Outcome::Left).await;
    }
    drop(control);
    drop(pid_file);
    ExitCode::SUCCESS
}

/// How the agent ended, answered on the control socket and mapped to an exit code.
async fn finish(
    exit: &AgentExit,
    observer: &Observer,
    control: Option<ControlSocket>,
    pid_file: Option<PidFile>,
) -> ExitCode {
    let outcome = match exit {
        AgentExit::Left => Outcome::Left,
        AgentExit::LeaveIncomplete { reason } => Outcome::Incomplete(reason.clone()),
        AgentExit::SelfFenced { reason } => Outcome::SelfFenced(reason.clone()),
    };
    if let Some(c) = &control {
        c.answer(&outcome).await;
    }
    drop(control);
    drop(pid_file);
    match outcome {
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
    }
}

/// A spawned task that ends with the daemon.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
