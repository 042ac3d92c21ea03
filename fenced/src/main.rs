//! `fenced`: the fencing daemon and its operator CLI.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use fenced::NodeId;
use fenced::agent::{Agent, AgentConfig, AgentExit};
use fenced::controller::{Controller, ControllerConfig};
use fenced::fencer::{Device, Fencer, NoneFencer, NvmeFencer, PreemptMode};
use fenced::node::local_instance_id;
use fenced::store::{EtcdStore, StoreError, StoreOptions};
use serde::Deserialize;

/// Exit code of a daemon that self-fenced.
const EXIT_SELF_FENCED: u8 = 3;
/// Exit code of a leave that could not complete (peers will fence).
const EXIT_LEAVE_INCOMPLETE: u8 = 4;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FencerKind {
    /// Preempt the victim's NVMe reservation key, then verify it is gone.
    Nvme,
    /// Single-signal: bump on lease expiry alone (no shared device to cut off).
    None,
    /// Force-detach the shared EBS volume (`--ebs-volume-id`) and confirm with
    /// DescribeVolumes (needs the `ebs` cargo feature). With `--fencer nvme` and a
    /// volume id, EBS is the fallback level instead.
    Ebs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum PreemptArg {
    PreemptAndAbort,
    Preempt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
struct EtcdArgs {
    /// etcd endpoints, comma separated.
    #[arg(long, env = "FENCED_ETCD_ENDPOINTS", value_delimiter = ',')]
    etcd_endpoints: Option<Vec<String>>,
    /// Key root.
    #[arg(long, env = "FENCED_ROOT")]
    root: Option<String>,
    /// Optional TOML config file (keys as the long flags, with underscores).
    #[arg(long, env = "FENCED_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the node agent and the controller.
    Run(Box<RunArgs>),
    /// Show members, generations, owed fences, claims and arenas.
    Status {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "text")]
        output: Output,
    },
    /// From this host: try one O_DIRECT write (blockio) on the shared device and,
    /// optionally, one metadata transaction guarded by a node's generation. Prints one
    /// line per probe; exit status 10 when anything was refused.
    Probe {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Device to write one block to.
        #[arg(long)]
        block_device: Option<PathBuf>,
        /// Byte offset of the write (default 1 MiB).
        #[arg(long, default_value = "1048576")]
        offset: u64,
        /// Node whose generation guards the metadata transaction.
        #[arg(long, requires = "generation")]
        node_id: Option<String>,
        /// The generation the writer believes it has.
        #[arg(long)]
        generation: Option<u64>,
    },
    /// Operator-attested fence: you confirmed out of band that NODE is gone (powered
    /// off, detached); supply the second confirmation. Refused while NODE is a member
    /// or renewed its liveness within --fresh-secs.
    Attest {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// The node to fence.
        #[arg(long)]
        node_id: String,
        /// Your out-of-band evidence, recorded verbatim in the audit record.
        #[arg(long)]
        reason: String,
        /// Who attests (default $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        operator: String,
        /// Refuse when the node renewed its liveness less than this many seconds ago.
        #[arg(long, default_value = "30")]
        fresh_secs: u64,
        /// Fence even if its liveness is fresh (you are certain).
        #[arg(long)]
        force_ignore_liveness: bool,
    },
    /// Ask the running daemon to leave the cluster (quiesce, return arenas, depart).
    Leave {
        /// The daemon's pid file.
        #[arg(long, env = "FENCED_PID_FILE")]
        pid_file: PathBuf,
        /// How long to wait for the daemon to finish leaving.
        #[arg(long, default_value = "30")]
        timeout_secs: u64,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// This node's id ([A-Za-z0-9._-], at most 63).
    #[arg(long, env = "FENCED_NODE_ID")]
    node_id: Option<String>,
    /// Instance id (default: EC2 instance id, else machine id).
    #[arg(long, env = "FENCED_INSTANCE_ID")]
    instance_id: Option<String>,
    /// The shared namespace (/dev/nvmeXnY or /dev/ngXnY).
    #[arg(long, env = "FENCED_BLOCK_DEVICE")]
    block_device: Option<PathBuf>,
    /// Fencer.
    #[arg(long, env = "FENCED_FENCER", value_enum)]
    fencer: Option<FencerKind>,
    /// Reservation Acquire action used to fence.
    #[arg(long, env = "FENCED_PREEMPT", value_enum)]
    preempt: Option<PreemptArg>,
    /// EBS fencer: the shared volume (vol-...). Alone with `--fencer ebs` (the default
    /// when there is no --block-device); after NVMe as the fallback level otherwise.
    #[arg(long, env = "FENCED_EBS_VOLUME_ID")]
    ebs_volume_id: Option<String>,
    /// EBS fencer: the region (default: the standard AWS chain, e.g. AWS_REGION, IMDS).
    #[arg(long, env = "FENCED_EBS_REGION")]
    ebs_region: Option<String>,
    /// EBS fencer: EC2 endpoint override (a VPC endpoint, a test peer).
    #[arg(long, env = "FENCED_EBS_ENDPOINT_URL")]
    ebs_endpoint_url: Option<String>,
    /// Membership lease TTL in seconds.
    #[arg(long, env = "FENCED_TTL_SECS")]
    ttl_secs: Option<u64>,
    /// Self-fence when the lease was not renewed for this long (default 2 x TTL).
    #[arg(long, env = "FENCED_SELF_FENCE_MARGIN_SECS")]
    self_fence_margin_secs: Option<u64>,
    /// Fence claim TTL in seconds (longer than the longest fence).
    #[arg(long, env = "FENCED_CLAIM_TTL_SECS")]
    claim_ttl_secs: Option<u64>,
    /// Reconciliation sweep period in seconds.
    #[arg(long, env = "FENCED_SWEEP_SECS")]
    sweep_secs: Option<u64>,
    /// Arenas to claim from the free pool.
    #[arg(long, env = "FENCED_ARENAS")]
    arenas: Option<usize>,
    /// Put these arenas into the free pool (if unowned) at start, comma separated.
    #[arg(long, value_delimiter = ',')]
    seed_arenas: Option<Vec<String>>,
    /// Arm this hardware watchdog (e.g. /dev/watchdog).
    #[arg(long, env = "FENCED_WATCHDOG")]
    watchdog_device: Option<PathBuf>,
    /// Write our pid here (for `fenced leave`).
    #[arg(long, env = "FENCED_PID_FILE")]
    pid_file: Option<PathBuf>,
    /// Give up waiting for etcd at start after this many seconds and exit 1 with an
    /// error. Without it the daemon waits as long as it takes: it retries with backoff
    /// (0.5 s doubling up to 10 s) and logs every attempt as "waiting for etcd at
    /// <endpoints>", so a host whose daemon starts before etcd joins once etcd answers.
    #[arg(long, env = "FENCED_CONNECT_TIMEOUT_SECS")]
    connect_timeout_secs: Option<u64>,
    /// Drop an etcd connection whose HTTP/2 PING is not answered within this many
    /// seconds (the client then reconnects, to another endpoint if this one is dead).
    /// Default: the larger of 2 s and TTL/2, so a slow link that still renews the
    /// lease is not torn down (a drop restarts the membership watch, breaks the lease
    /// keepalive stream and fails requests in flight).
    #[arg(long, env = "FENCED_ETCD_KEEPALIVE_TIMEOUT_SECS")]
    etcd_keepalive_timeout_secs: Option<u64>,
    /// Log as JSON lines.
    #[arg(long, env = "FENCED_LOG_JSON")]
    log_json: bool,
}

/// The TOML config file: the same settings as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    etcd_endpoints: Option<Vec<String>>,
    root: Option<String>,
    node_id: Option<String>,
    instance_id: Option<String>,
    block_device: Option<PathBuf>,
    fencer: Option<FencerKind>,
    preempt: Option<PreemptArg>,
    ebs_volume_id: Option<String>,
    ebs_region: Option<String>,
    ebs_endpoint_url: Option<String>,
    ttl_secs: Option<u64>,
    self_fence_margin_secs: Option<u64>,
    claim_ttl_secs: Option<u64>,
    sweep_secs: Option<u64>,
    arenas: Option<usize>,
    watchdog_device: Option<PathBuf>,
    connect_timeout_secs: Option<u64>,
    etcd_keepalive_timeout_secs: Option<u64>,
}

fn load_config(path: Option<&Path>) -> Result<FileConfig, String> {
    let Some(path) = path else {
        return Ok(FileConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("invalid config {}: {}", path.display(), e.message()))
}

fn endpoints(cli: Option<Vec<String>>, file: Option<Vec<String>>) -> Vec<String> {
    cli.or(file)
        .unwrap_or_else(|| vec!["http://127.0.0.1:2379".to_owned()])
}

fn key_root(cli: Option<String>, file: Option<String>) -> String {
    cli.or(file).unwrap_or_else(|| "/fenced/".to_owned())
}

/// How long `status`, `probe` and `attest` wait for etcd before reporting it
/// unreachable.
const CLI_ETCD_WAIT: Duration = Duration::from_secs(5);
/// Claim TTL of the operator commands' store (only `attest` claims).
const CLI_CLAIM_TTL: Duration = Duration::from_secs(120);
/// Longest pause between two attempts to reach etcd.
const MAX_CONNECT_BACKOFF: Duration = Duration::from_secs(10);

/// Connects to etcd, retrying with bounded backoff while no endpoint answers; every
/// attempt is logged with the endpoints. `give_up`: stop after this long (`None`:
/// never). Errors other than "unavailable" (bad URL, ...) are not retried.
async fn connect(
    endpoints: &[String],
    root: &str,
    claim_ttl: Duration,
    opts: &StoreOptions,
    give_up: Option<Duration>,
) -> Result<EtcdStore, String> {
    let t0 = Instant::now();
    let mut delay = Duration::from_millis(500);
    let eps = endpoints.join(",");
    for attempt in 1.. {
        match EtcdStore::connect_with(endpoints, root, claim_ttl, opts).await {
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
            Err(e @ StoreError::Unavailable { .. }) => {
                return Err(format!(
                    "etcd unreachable at {eps} after {:.0}s ({attempt} attempts): {e}",
                    t0.elapsed().as_secs_f32()
                ));
            }
            Err(e) => return Err(format!("cannot use etcd at {eps}: {e}")),
        }
    }
    unreachable!("the loop returns")
}

/// `status`, `probe` and `attest`: endpoints and root from the flags, the environment
/// or the config file; connect, waiting at most [`CLI_ETCD_WAIT`].
async fn connect_from(etcd: EtcdArgs) -> Result<EtcdStore, String> {
    let file = load_config(etcd.config.as_deref())?;
    let eps = endpoints(etcd.etcd_endpoints, file.etcd_endpoints);
    let root = key_root(etcd.root, file.root);
    connect(
        &eps,
        &root,
        CLI_CLAIM_TTL,
        &StoreOptions::default(),
        Some(CLI_ETCD_WAIT),
    )
    .await
}

fn init_logging(json: bool) {
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

fn open_device(path: &Path) -> Result<Device, String> {
    let ns = nvme_resv::Namespace::open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let caps = ns
        .capabilities()
        .map_err(|e| format!("cannot identify {}: {e}", path.display()))?;
    if !caps.reservations {
        return Err(format!(
            "{} does not support NVMe reservations (ONCS bit 5: {}, RESCAP {:#04x}); use --fencer none for single-signal fencing",
            path.display(),
            caps.oncs_reservations,
            caps.rescap
        ));
    }
    Ok(Arc::new(ns))
}

/// The EBS fencer's settings (flags, env or config file).
#[derive(Debug)]
struct EbsArgs {
    volume_id: Option<String>,
    region: Option<String>,
    endpoint_url: Option<String>,
}

/// The daemon's fencer: NVMe, EBS alone, NVMe then EBS (fencing levels: EBS only when
/// the NVMe fence cannot be confirmed), or single-signal. See docs/ebs.md.
#[cfg(feature = "ebs")]
async fn with_ebs(
    kind: FencerKind,
    nvme: Option<Arc<dyn Fencer>>,
    ebs: EbsArgs,
    claim_ttl: Duration,
) -> Result<Arc<dyn Fencer>, String> {
    let Some(volume_id) = ebs.volume_id else {
        if kind == FencerKind::Ebs {
            return Err("--fencer ebs needs --ebs-volume-id".into());
        }
        return Ok(nvme.unwrap_or_else(|| Arc::new(NoneFencer)));
    };
    if kind == FencerKind::None {
        return Err(
            "--ebs-volume-id given with --fencer none (single-signal): drop one of them".into(),
        );
    }
    let mut cfg = fenced::ebs::EbsConfig::new(volume_id);
    cfg.region = ebs.region;
    cfg.endpoint_url = ebs.endpoint_url;
    let ebs: Arc<dyn Fencer> = Arc::new(
        fenced::ebs::EbsFencer::connect(&cfg, claim_ttl)
            .await
            .map_err(|e| e.to_string())?,
    );
    Ok(match nvme {
        Some(nvme) => Arc::new(fenced::ebs::FencingLevels::new(vec![nvme, ebs])),
        None => ebs,
    })
}

/// Without the `ebs` feature: NVMe or single-signal; EBS settings are refused.
#[cfg(not(feature = "ebs"))]
async fn with_ebs(
    kind: FencerKind,
    nvme: Option<Arc<dyn Fencer>>,
    ebs: EbsArgs,
    _claim_ttl: Duration,
) -> Result<Arc<dyn Fencer>, String> {
    if kind == FencerKind::Ebs || ebs.volume_id.is_some() {
        return Err(
            "this fenced was built without the EBS fencer: rebuild with `--features ebs`".into(),
        );
    }
    let _ = (ebs.region, ebs.endpoint_url);
    Ok(nvme.unwrap_or_else(|| Arc::new(NoneFencer)))
}

async fn run(args: RunArgs) -> Result<ExitCode, String> {
    let file = load_config(args.etcd.config.as_deref())?;
    init_logging(args.log_json);
    let node_id = args
        .node_id
        .or(file.node_id)
        .ok_or("missing --node-id (or FENCED_NODE_ID, or node_id in the config)")?;
    let node = NodeId::new(&node_id).map_err(|e| e.to_string())?;
    let instance = args
        .instance_id
        .or(file.instance_id)
        .unwrap_or_else(local_instance_id);
    let root = key_root(args.etcd.root, file.root);
    let ebs = EbsArgs {
        volume_id: args.ebs_volume_id.or(file.ebs_volume_id),
        region: args.ebs_region.or(file.ebs_region),
        endpoint_url: args.ebs_endpoint_url.or(file.ebs_endpoint_url),
    };
    let ebs_only =
        ebs.volume_id.is_some() && args.block_device.is_none() && file.block_device.is_none();
    let fencer_kind = args.fencer.or(file.fencer).unwrap_or(if ebs_only {
        FencerKind::Ebs
    } else {
        FencerKind::Nvme
    });
    let preempt = match args.preempt.or(file.preempt) {
        Some(PreemptArg::Preempt) => PreemptMode::Preempt,
        _ => PreemptMode::PreemptAndAbort,
    };
    let ttl = Duration::from_secs(args.ttl_secs.or(file.ttl_secs).unwrap_or(5).max(2));
    let margin = args
        .self_fence_margin_secs
        .or(file.self_fence_margin_secs)
        .map_or(2 * ttl, Duration::from_secs);
    let claim_ttl = Duration::from_secs(args.claim_ttl_secs.or(file.claim_ttl_secs).unwrap_or(120));
    let sweep = Duration::from_secs(args.sweep_secs.or(file.sweep_secs).unwrap_or(30));
    let block_device = args.block_device.or(file.block_device);
    let device = match (fencer_kind, &block_device) {
        // EBS alone severs by detaching the volume: no reservation device is needed
        // (gp3 and older io2 attachments have none).
        (FencerKind::Ebs, _) => None,
        (FencerKind::Nvme, None) => {
            return Err("--fencer nvme needs --block-device (or use --fencer none for single-signal fencing)".into());
        }
        (_, Some(p)) => Some(open_device(p)?),
        (FencerKind::None, None) => None,
    };
    let own_key = nvme_resv::key_for_node(node.as_str());
    let eps = endpoints(args.etcd.etcd_endpoints, file.etcd_endpoints);
    let mut store_opts = StoreOptions::for_lease_ttl(ttl);
    if let Some(s) = args
        .etcd_keepalive_timeout_secs
        .or(file.etcd_keepalive_timeout_secs)
    {
        store_opts.keepalive_timeout = Duration::from_secs(s.max(1));
    }
    let store = connect(
        &eps,
        &root,
        claim_ttl,
        &store_opts,
        args.connect_timeout_secs
            .or(file.connect_timeout_secs)
            .map(Duration::from_secs),
    )
    .await?;
    if let Some(arenas) = &args.seed_arenas {
        store
            .add_free_arenas(arenas)
            .await
            .map_err(|e| e.to_string())?;
    }
    let nvme: Option<Arc<dyn Fencer>> = match (fencer_kind, &device) {
        (FencerKind::Nvme, Some(d)) => Some(Arc::new(NvmeFencer::new(d.clone(), own_key, preempt))),
        _ => None,
    };
    let fencer = with_ebs(fencer_kind, nvme, ebs, claim_ttl).await?;
    let mut cfg = AgentConfig::new(node.clone(), instance.clone());
    cfg.ttl = ttl;
    cfg.self_fence_margin = margin;
    cfg.arenas = args.arenas.or(file.arenas).unwrap_or(0);
    cfg.watchdog_device = args.watchdog_device.or(file.watchdog_device);
    let agent = Agent::start(store.clone(), cfg, device, own_key)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(p) = &args.pid_file {
        std::fs::write(p, format!("{}\n", std::process::id()))
            .map_err(|e| format!("cannot write pid file {}: {e}", p.display()))?;
    }
    let mut ccfg = ControllerConfig::new(format!("{node}/{instance}"));
    ccfg.sweep_interval = sweep;
    ccfg.own_node = Some(node.clone());
    let controller = Controller::new(store, fencer, ccfg).spawn();
    tracing::info!(node = %node, instance = %instance, generation = agent.generation(), arenas = ?agent.arenas(), "fenced running");
    let leave = async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    let exit = agent.run(leave).await;
    controller.abort();
    if let Some(p) = &args.pid_file {
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

async fn status(etcd: EtcdArgs, output: Output) -> Result<ExitCode, String> {
    let store = connect_from(etcd).await?;
    let s = store.status().await.map_err(|e| e.to_string())?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default()),
        Output::Text => {
            println!("members:       {}", fmt_pairs(&s.members));
            let gens: Vec<String> = s
                .generations
                .iter()
                .map(|(n, g)| format!("{n}={g}"))
                .collect();
            println!("generations:   {}", gens.join(" "));
            println!("owed fences:   {}", fmt_pairs(&s.owed));
            let done: Vec<String> = s.done.iter().map(|(n, g)| format!("{n}={g}")).collect();
            println!("fenced (done): {}", done.join(" "));
            println!("claims:        {}", fmt_pairs(&s.claims));
            println!("departed:      {}", s.departed.join(" "));
            println!("arenas:        {}", fmt_pairs(&s.arenas));
            println!("free arenas:   {}", s.free_arenas.join(" "));
            println!("audit records: {}", s.audit_records);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn fmt_pairs(p: &[(String, String)]) -> String {
    p.iter()
        .map(|(a, b)| format!("{a}({b})"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn leave(pid_file: PathBuf, timeout: Duration) -> Result<ExitCode, String> {
    let text = std::fs::read_to_string(&pid_file).map_err(|e| {
        format!(
            "cannot read pid file {}: {e} (is the daemon running?)",
            pid_file.display()
        )
    })?;
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| format!("pid file {} does not hold a pid", pid_file.display()))?;
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
        .map_err(|e| format!("cannot signal pid {pid}: {e}"))?;
    let t0 = Instant::now();
    // A zombie (exited, not yet reaped by its parent) still answers signal 0.
    let alive = |pid: nix::unistd::Pid| {
        nix::sys::signal::kill(pid, None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
    };
    while alive(pid) {
        if t0.elapsed() > timeout {
            return Err(format!("daemon {pid} still running after {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("daemon {pid} left");
    Ok(ExitCode::SUCCESS)
}

async fn probe(
    etcd: EtcdArgs,
    block_device: Option<PathBuf>,
    offset: u64,
    node_id: Option<String>,
    generation: Option<u64>,
) -> Result<ExitCode, String> {
    let mut refused = false;
    if let Some(dev) = block_device {
        let r = tokio::task::spawn_blocking(move || -> Result<(), blockio::Error> {
            let mut w = blockio::DirectWriter::open(&dev, blockio::Options::default())?;
            let align = w.alignment().max(512);
            let buf = blockio::AlignedBuf::from_slice(&vec![0x5a; align.max(4096)], align)?;
            w.write_at(&buf, offset)?;
            w.flush()
        })
        .await
        .map_err(|e| format!("probe task failed: {e}"))?;
        match r {
            Ok(()) => println!("probe: O_DIRECT write at offset {offset}: ok"),
            Err(e) if e.is_reservation_conflict() => {
                refused = true;
                println!(
                    "probe: O_DIRECT write at offset {offset}: REFUSED: {e} (this host is fenced)"
                );
            }
            Err(e) => return Err(format!("write failed: {e}")),
        }
    }
    if let (Some(node), Some(g)) = (node_id, generation) {
        let node = NodeId::new(&node).map_err(|e| e.to_string())?;
        let store = connect_from(etcd).await?;
        let guard = fenced::guard::GenerationGuard::new(store.keys(), &node, g);
        let key = format!("{}probe/{node}", store.keys().root());
        let resp = store
            .client()
            .txn(guard.txn(vec![etcd_client::TxnOp::put(key, "late write", None)]))
            .await
            .map_err(|e| format!("guarded transaction failed: {e}"))?;
        if fenced::guard::GenerationGuard::refused(&resp) {
            refused = true;
            let now = store.generation(&node).await.map_err(|e| e.to_string())?.0;
            println!(
                "probe: metadata txn guarded by {node}@{g}: REFUSED (generation is now {now})"
            );
        } else {
            println!("probe: metadata txn guarded by {node}@{g}: committed");
        }
    }
    Ok(if refused {
        ExitCode::from(10)
    } else {
        ExitCode::SUCCESS
    })
}

#[allow(clippy::too_many_arguments)]
async fn attest(
    etcd: EtcdArgs,
    node_id: String,
    reason: String,
    operator: String,
    fresh_secs: u64,
    force: bool,
) -> Result<ExitCode, String> {
    let node = NodeId::new(&node_id).map_err(|e| e.to_string())?;
    if reason.trim().is_empty() {
        return Err("--reason must describe your out-of-band evidence".into());
    }
    let store = connect_from(etcd).await?;
    let (liveness, member) = store.liveness(&node).await.map_err(|e| e.to_string())?;
    if member {
        return Err(format!(
            "refusing to fence {node}: it is still a member (membership key present)"
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
    if let Some(ms) = liveness {
        let age = now.saturating_sub(ms) / 1000;
        if age < fresh_secs && !force {
            return Err(format!(
                "refusing to fence {node}: it renewed its liveness {age}s ago (< {fresh_secs}s); use --force-ignore-liveness if you are certain"
            ));
        }
    }
    let instance = store
        .intent_instance(&node)
        .await
        .map_err(|e| e.to_string())?;
    let fencer = Arc::new(fenced::fencer::AttestedFencer {
        operator: operator.clone(),
        reason,
    });
    let controller = Controller::new(
        store,
        fencer,
        ControllerConfig::new(format!("attest/{operator}")),
    );
    let state = controller
        .fence(
            fenced::core::Victim {
                node: node.clone(),
                instance,
            },
            fenced::core::Trigger::Operator,
            // An attestation is its own trigger: there is no DELETE to anchor the
            // fence-mark guard to, and the operator asked for this fence explicitly.
            fenced::store::ClaimGuard::IgnoreDeparture {
                deleted_rev: i64::MAX,
            },
        )
        .await;
    match state {
        fenced::core::FenceState::Fenced { generation } => {
            println!("fenced {node}: generation now {generation} (attested by {operator})");
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("fence of {node} not completed: {other:?}")),
    }
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
        // `run` sets up its own logging (text or JSON); the operator commands log
        // warnings (e.g. waiting for etcd) to stderr.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("FENCED_LOG")
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let r = rt.block_on(async move {
        match cli.cmd {
            Cmd::Run(args) => run(*args).await,
            Cmd::Status { etcd, output } => status(etcd, output).await,
            Cmd::Attest {
                etcd,
                node_id,
                reason,
                operator,
                fresh_secs,
                force_ignore_liveness,
            } => {
                attest(
                    etcd,
                    node_id,
                    reason,
                    operator,
                    fresh_secs,
                    force_ignore_liveness,
                )
                .await
            }
            Cmd::Probe {
                etcd,
                block_device,
                offset,
                node_id,
                generation,
            } => probe(etcd, block_device, offset, node_id, generation).await,
            Cmd::Leave {
                pid_file,
                timeout_secs,
            } => leave(pid_file, Duration::from_secs(timeout_secs)).await,
        }
    });
    match r {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("fenced: {msg}");
            ExitCode::FAILURE
        }
    }
}
