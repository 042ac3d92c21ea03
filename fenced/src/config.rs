//! Settings of `fenced run` and the etcd address of the operator commands, resolved
//! once, before anything touches etcd or a device.
//!
//! Precedence: a flag, then its environment variable (clap folds `FENCED_*` into the
//! flag, so both arrive here as the command-line layer), then the TOML file
//! (`--config`), then the defaults in [`defaults`]. One struct, [`Layer`], is both the
//! flag set and the file schema, so every key is named once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use fenced::NodeId;
use fenced::fencer::PreemptMode;
use fenced::node::InvalidNodeId;
use fenced::store::EtcdSecurity;
use serde::Deserialize;

/// The defaults, in one place.
pub mod defaults {
    /// etcd endpoint when none is configured.
    pub const ETCD_ENDPOINT: &str = "http://127.0.0.1:2379";
    /// Key root.
    pub const ROOT: &str = "/fenced/";
    /// Membership lease TTL.
    pub const TTL_SECS: u64 = 5;
    /// Shortest lease TTL accepted (a smaller value is raised to this).
    pub const MIN_TTL_SECS: u64 = 2;
    /// Self-fence margin, as a multiple of the lease TTL.
    pub const SELF_FENCE_MARGIN_TTLS: u32 = 2;
    /// Fence claim TTL.
    pub const CLAIM_TTL_SECS: u64 = 120;
    /// Reconciliation sweep period.
    pub const SWEEP_SECS: u64 = 30;
    /// Arenas claimed from the free pool.
    pub const ARENAS: usize = 0;
    /// Shortest etcd keepalive timeout accepted (a smaller value is raised to this).
    pub const MIN_ETCD_KEEPALIVE_TIMEOUT_SECS: u64 = 1;
}

/// Which fencer the daemon uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FencerKind {
    /// Preempt the victim's NVMe reservation key, then verify it is gone.
    Nvme,
    /// Single-signal: bump on lease expiry alone (no shared device to cut off).
    None,
    /// Force-detach the shared EBS volume (`--ebs-volume-id`) and confirm with
    /// DescribeVolumes (needs the `ebs` cargo feature). With `--fencer nvme` and a
    /// volume id, EBS is the fallback level instead.
    Ebs,
}

/// The Reservation Acquire action used to fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreemptArg {
    /// Preempt and abort the victim's outstanding commands.
    PreemptAndAbort,
    /// Preempt only.
    Preempt,
}

/// What `fenced run` runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The node agent only (membership, liveness, self-fencing, arenas): fences no one.
    Agent,
    /// The controller only (watch, sweep, fence others): joins nothing, holds no lease.
    Controller,
    /// Both (the default).
    #[default]
    Both,
}

/// Where etcd is: shared by `run` and the operator commands.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EtcdArgs {
    /// etcd endpoints, comma separated.
    #[arg(long, env = "FENCED_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// Key root.
    #[arg(long, env = "FENCED_ROOT")]
    pub root: Option<String>,
    /// Optional TOML config file (keys as the long flags, with underscores).
    #[arg(long, env = "FENCED_CONFIG")]
    pub config: Option<PathBuf>,
    /// CA bundle (PEM) that verifies the etcd servers of https:// endpoints (default:
    /// the system CA store).
    #[arg(long, env = "FENCED_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd; with etcd's --client-cert-auth and
    /// no --etcd-user, its CN is the etcd user.
    #[arg(long, env = "FENCED_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "FENCED_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user (password authentication; the password comes from
    /// --etcd-password-file or FENCED_ETCD_PASSWORD, never from a flag, which `ps`
    /// would show).
    #[arg(long, env = "FENCED_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File whose first line is the etcd user's password.
    #[arg(long, env = "FENCED_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

/// One layer of settings: the `run` flags (with their env vars) and the TOML file's
/// schema. `etcd_endpoints`, `root` and the etcd TLS and credential settings are file
/// keys here; their flags are declared by [`EtcdArgs`] (the operator commands take
/// them too).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    #[arg(skip)]
    etcd_endpoints: Option<Vec<String>>,
    #[arg(skip)]
    root: Option<String>,
    #[arg(skip)]
    etcd_ca: Option<PathBuf>,
    #[arg(skip)]
    etcd_cert: Option<PathBuf>,
    #[arg(skip)]
    etcd_key: Option<PathBuf>,
    #[arg(skip)]
    etcd_user: Option<String>,
    #[arg(skip)]
    etcd_password_file: Option<PathBuf>,
    /// This node's id ([A-Za-z0-9._-], at most 63).
    #[arg(long, env = "FENCED_NODE_ID")]
    node_id: Option<String>,
    /// What to run: the node agent, the controller, or both. With etcd RBAC
    /// (`fenced etcd-roles`) an agent needs only its node's role, a controller the
    /// controller role.
    #[arg(long, env = "FENCED_ROLE", value_enum)]
    role: Option<Role>,
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
    /// Arm this hardware watchdog (e.g. /dev/watchdog).
    #[arg(long, env = "FENCED_WATCHDOG")]
    watchdog_device: Option<PathBuf>,
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
}

/// `fenced run`'s flags: the etcd address, the settings layer, and the flags that
/// only the command line sets (not the config file).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    #[command(flatten)]
    pub settings: Layer,
    /// Put these arenas into the free pool (if unowned) at start, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub seed_arenas: Option<Vec<String>>,
    /// Write our pid here (for `fenced leave`).
    #[arg(long, env = "FENCED_PID_FILE")]
    pub pid_file: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, env = "FENCED_LOG_JSON")]
    pub log_json: bool,
}

/// A configuration that cannot be used; each says which setting and what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not TOML.
    #[error("invalid config {}: line {line}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        /// The parser's one-line message (its `Display` is a multi-line snippet).
        message: String,
    },
    /// A key of the config file is unknown or its value has the wrong type.
    #[error("invalid config {}: key `{key}`: {message}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        /// The parser's one-line message (its `Display` is a multi-line snippet).
        message: String,
    },
    /// `run` without a node id.
    #[error("missing --node-id (or FENCED_NODE_ID, or node_id in the config)")]
    MissingNodeId,
    /// The node id is not valid.
    #[error(transparent)]
    NodeId(#[from] InvalidNodeId),
    /// `--fencer nvme` without a device.
    #[error("--fencer nvme needs --block-device (or use --fencer none for single-signal fencing)")]
    NvmeWithoutDevice,
    /// `--fencer ebs` without a volume.
    #[error("--fencer ebs needs --ebs-volume-id")]
    EbsWithoutVolume,
    /// A volume with single-signal fencing.
    #[error("--ebs-volume-id given with --fencer none (single-signal): drop one of them")]
    EbsWithNone,
    /// A controller-only daemon with the NVMe fencer.
    #[error(
        "--role controller cannot use --fencer nvme: the NVMe fencer preempts with this host's own registration, which only the agent makes; use --role both on hosts with the shared namespace (or --fencer ebs/none)"
    )]
    NvmeControllerWithoutAgent,
    /// EBS settings in a build without the fencer.
    #[error("this fenced was built without the EBS fencer: rebuild with `--features ebs`")]
    EbsNotBuilt,
}

/// Reads the TOML config file (`None`: no file, an empty layer). Unknown keys and
/// values of the wrong type are errors naming the key.
pub fn load_file(path: Option<&Path>) -> Result<Layer, ConfigError> {
    let Some(path) = path else {
        return Ok(Layer::default());
    };
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

fn parse_file(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|error| ConfigError::Syntax {
        path: path.to_owned(),
        line: error
            .span()
            .and_then(|s| text.get(..s.start))
            .map_or(1, |before| 1 + before.matches('\n').count()),
        message: error.message().to_owned(),
    })?;
    // Key by key first: serde's own error does not say which key was wrong.
    for (key, value) in &table {
        let one = toml::Table::from_iter([(key.clone(), value.clone())]);
        if let Err(error) = toml::Value::Table(one).try_into::<Layer>() {
            return Err(ConfigError::Key {
                path: path.to_owned(),
                key: key.clone(),
                message: error.message().to_owned(),
            });
        }
    }
    toml::Value::Table(table)
        .try_into()
        .map_err(|error: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            line: 1,
            message: error.message().to_owned(),
        })
}

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
    /// flags (or env), else the file, else the defaults. The password comes from
    /// `--etcd-password-file` (read when connecting), else `FENCED_ETCD_PASSWORD`.
    pub fn resolve(cli: &EtcdArgs, file: &Layer) -> Self {
        let pick = |c: &Option<PathBuf>, f: &Option<PathBuf>| c.clone().or_else(|| f.clone());
        Self {
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
        }
    }
}

/// The EBS fencer's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbsSettings {
    /// The shared volume; `None`: no EBS fencer.
    pub volume_id: Option<String>,
    /// Region override.
    pub region: Option<String>,
    /// EC2 endpoint override.
    pub endpoint_url: Option<String>,
}

/// Everything `fenced run` needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub etcd: EtcdSettings,
    pub node: NodeId,
    pub role: Role,
    /// `None`: ask the host (EC2 instance id, else machine id) when the daemon starts.
    pub instance_id: Option<String>,
    pub block_device: Option<PathBuf>,
    pub fencer: FencerKind,
    pub preempt: PreemptMode,
    pub ebs: EbsSettings,
    pub ttl: Duration,
    pub self_fence_margin: Duration,
    pub claim_ttl: Duration,
    pub sweep: Duration,
    pub arenas: usize,
    pub watchdog_device: Option<PathBuf>,
    /// `None`: wait for etcd as long as it takes.
    pub connect_timeout: Option<Duration>,
    /// `None`: the store's default for the lease TTL.
    pub etcd_keepalive_timeout: Option<Duration>,
    pub seed_arenas: Option<Vec<String>>,
    pub pid_file: Option<PathBuf>,
    pub log_json: bool,
}

impl Settings {
    /// Resolves `run`'s settings: `cli` (flags, and the env vars clap folded into
    /// them) over `file` over [`defaults`]. Checks everything that can be checked
    /// without I/O.
    pub fn resolve(cli: &RunArgs, file: Layer) -> Result<Self, ConfigError> {
        let etcd = EtcdSettings::resolve(&cli.etcd, &file);
        let l = cli.settings.clone();
        let pick = |c: Option<u64>, f: Option<u64>| c.or(f);
        let node_id = l
            .node_id
            .or(file.node_id)
            .ok_or(ConfigError::MissingNodeId)?;
        let node = NodeId::new(&node_id)?;
        let block_device = l.block_device.or(file.block_device);
        let ebs = EbsSettings {
            volume_id: l.ebs_volume_id.or(file.ebs_volume_id),
            region: l.ebs_region.or(file.ebs_region),
            endpoint_url: l.ebs_endpoint_url.or(file.ebs_endpoint_url),
        };
        let fencer = l.fencer.or(file.fencer).unwrap_or(
            if ebs.volume_id.is_some() && block_device.is_none() {
                FencerKind::Ebs
            } else {
                FencerKind::Nvme
            },
        );
        check_fencer(fencer, block_device.is_some(), ebs.volume_id.is_some())?;
        let role = l.role.or(file.role).unwrap_or_default();
        if role == Role::Controller && fencer == FencerKind::Nvme {
            return Err(ConfigError::NvmeControllerWithoutAgent);
        }
        let preempt = match l.preempt.or(file.preempt) {
            Some(PreemptArg::Preempt) => PreemptMode::Preempt,
            Some(PreemptArg::PreemptAndAbort) | None => PreemptMode::PreemptAndAbort,
        };
        let ttl = Duration::from_secs(
            pick(l.ttl_secs, file.ttl_secs)
                .unwrap_or(defaults::TTL_SECS)
                .max(defaults::MIN_TTL_SECS),
        );
        Ok(Self {
            etcd,
            node,
            role,
            instance_id: l.instance_id.or(file.instance_id),
            block_device,
            fencer,
            preempt,
            ebs,
            ttl,
            self_fence_margin: pick(l.self_fence_margin_secs, file.self_fence_margin_secs)
                .map_or(defaults::SELF_FENCE_MARGIN_TTLS * ttl, Duration::from_secs),
            claim_ttl: Duration::from_secs(
                pick(l.claim_ttl_secs, file.claim_ttl_secs).unwrap_or(defaults::CLAIM_TTL_SECS),
            ),
            sweep: Duration::from_secs(
                pick(l.sweep_secs, file.sweep_secs).unwrap_or(defaults::SWEEP_SECS),
            ),
            arenas: l.arenas.or(file.arenas).unwrap_or(defaults::ARENAS),
            watchdog_device: l.watchdog_device.or(file.watchdog_device),
            connect_timeout: pick(l.connect_timeout_secs, file.connect_timeout_secs)
                .map(Duration::from_secs),
            etcd_keepalive_timeout: pick(
                l.etcd_keepalive_timeout_secs,
                file.etcd_keepalive_timeout_secs,
            )
            .map(|s| Duration::from_secs(s.max(defaults::MIN_ETCD_KEEPALIVE_TIMEOUT_SECS))),
            seed_arenas: cli.seed_arenas.clone(),
            pid_file: cli.pid_file.clone(),
            log_json: cli.log_json,
        })
    }
}

/// The fencer's requirements: NVMe needs a device; EBS needs a volume (and the `ebs`
/// feature); single-signal takes no volume.
fn check_fencer(kind: FencerKind, device: bool, volume: bool) -> Result<(), ConfigError> {
    if cfg!(not(feature = "ebs")) && (kind == FencerKind::Ebs || volume) {
        return Err(ConfigError::EbsNotBuilt);
    }
    match kind {
        FencerKind::Ebs if !volume => Err(ConfigError::EbsWithoutVolume),
        FencerKind::None if volume => Err(ConfigError::EbsWithNone),
        FencerKind::Nvme if !device => Err(ConfigError::NvmeWithoutDevice),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    fn cli(flags: &[&str]) -> RunArgs {
        Run::try_parse_from(std::iter::once("run").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    fn file(text: &str) -> Result<Layer, ConfigError> {
        parse_file(Path::new("/etc/fenced.toml"), text)
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_the_defaults() {
        let f = file(
            "node_id = \"from-file\"\nttl_secs = 9\nsweep_secs = 7\nfencer = \"none\"\n\
             etcd_endpoints = [\"http://file:2379\"]\nroot = \"/file/\"\n",
        )
        .unwrap();
        let c = cli(&[
            "--node-id",
            "from-cli",
            "--ttl-secs",
            "3",
            "--root",
            "/cli/",
        ]);
        let s = Settings::resolve(&c, f).unwrap();
        assert_eq!(s.node.as_str(), "from-cli");
        assert_eq!(s.ttl, Duration::from_secs(3));
        assert_eq!(s.self_fence_margin, Duration::from_secs(6), "2 x the TTL");
        assert_eq!(s.sweep, Duration::from_secs(7), "file over default");
        assert_eq!(s.fencer, FencerKind::None);
        assert_eq!(s.etcd.root, "/cli/");
        assert_eq!(s.etcd.endpoints, ["http://file:2379"]);
        assert_eq!(s.claim_ttl, Duration::from_secs(defaults::CLAIM_TTL_SECS));
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let s = Settings::resolve(
            &cli(&["--node-id", "n1", "--fencer", "none"]),
            Layer::default(),
        )
        .unwrap();
        assert_eq!(
            s.etcd,
            EtcdSettings {
                endpoints: vec![defaults::ETCD_ENDPOINT.into()],
                root: defaults::ROOT.into(),
                security: EtcdSecurity {
                    password: std::env::var(ETCD_PASSWORD_ENV).ok(),
                    ..EtcdSecurity::default()
                },
            }
        );
        assert_eq!(s.ttl, Duration::from_secs(5));
        assert_eq!(s.self_fence_margin, Duration::from_secs(10));
        assert_eq!(s.sweep, Duration::from_secs(30));
        assert_eq!(s.arenas, 0);
        assert_eq!(s.preempt, PreemptMode::PreemptAndAbort);
        assert_eq!(s.connect_timeout, None);
        assert_eq!(s.etcd_keepalive_timeout, None);
        assert_eq!(s.instance_id, None);
        assert_eq!(s.role, Role::Both);
    }

    #[test]
    fn small_values_are_raised_to_the_minimum() {
        let c = cli(&["--node-id", "n1", "--fencer", "none", "--ttl-secs", "1"]);
        let f = file("etcd_keepalive_timeout_secs = 0\n").unwrap();
        let s = Settings::resolve(&c, f).unwrap();
        assert_eq!(s.ttl, Duration::from_secs(2));
        assert_eq!(s.etcd_keepalive_timeout, Some(Duration::from_secs(1)));
    }

    #[test]
    fn every_file_key_is_accepted() {
        let f = file(
            r#"
            etcd_endpoints = ["http://a:2379", "http://b:2379"]
            root = "/r/"
            node_id = "n1"
            instance_id = "i-1"
            block_device = "/dev/nvme1n1"
            fencer = "nvme"
            preempt = "preempt"
            ebs_volume_id = "vol-1"
            ebs_region = "eu-west-1"
            ebs_endpoint_url = "http://127.0.0.1:5000"
            ttl_secs = 4
            self_fence_margin_secs = 9
            claim_ttl_secs = 60
            sweep_secs = 2
            arenas = 3
            watchdog_device = "/dev/watchdog"
            connect_timeout_secs = 11
            etcd_keepalive_timeout_secs = 5
            "#,
        )
        .unwrap();
        assert_eq!(f.etcd_endpoints.as_ref().map(Vec::len), Some(2));
        assert_eq!(f.preempt, Some(PreemptArg::Preempt));
        assert_eq!(f.etcd_keepalive_timeout_secs, Some(5));
        if cfg!(feature = "ebs") {
            let s = Settings::resolve(&cli(&[]), f).unwrap();
            assert_eq!(s.node.as_str(), "n1");
            assert_eq!(s.preempt, PreemptMode::Preempt);
            assert_eq!(s.self_fence_margin, Duration::from_secs(9));
            assert_eq!(s.connect_timeout, Some(Duration::from_secs(11)));
            assert_eq!(s.ebs.region.as_deref(), Some("eu-west-1"));
        }
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let e = file("node_id = \"n1\"\nttl = 5\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Key { key, .. } if key == "ttl"),
            "{e}"
        );
        assert!(e.to_string().contains("key `ttl`: unknown field"), "{e}");
        // Command-line-only flags are not config keys.
        for k in [
            "pid_file = \"/run/f.pid\"",
            "log_json = true",
            "config = \"x\"",
        ] {
            assert!(matches!(file(k), Err(ConfigError::Key { .. })), "{k}");
        }
    }

    #[test]
    fn bad_values_are_errors_naming_the_key() {
        let e = file("node_id = \"n1\"\nttl_secs = \"five\"\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Key { key, .. } if key == "ttl_secs"),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("invalid config /etc/fenced.toml: key `ttl_secs`: ")
        );
        let e = file("fencer = \"scsi\"\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Key { key, .. } if key == "fencer"),
            "{e}"
        );
        let e = file("root = \"/r/\"\nthis is not toml\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { line: 2, .. }), "{e}");
        let e = Settings::resolve(
            &cli(&["--fencer", "none"]),
            file("node_id = \"a/b\"").unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("invalid node id \"a/b\""), "{e}");
    }

    #[test]
    fn fencer_requirements_are_checked_before_any_io() {
        let e = Settings::resolve(&cli(&["--node-id", "n1"]), Layer::default()).unwrap_err();
        assert!(matches!(e, ConfigError::NvmeWithoutDevice), "{e}");
        let e = Settings::resolve(&cli(&[]), Layer::default()).unwrap_err();
        assert!(matches!(e, ConfigError::MissingNodeId), "{e}");
        let ebs = cli(&["--node-id", "n1", "--ebs-volume-id", "vol-1"]);
        let none = cli(&[
            "--node-id",
            "n1",
            "--fencer",
            "none",
            "--ebs-volume-id",
            "v",
        ]);
        if cfg!(feature = "ebs") {
            let s = Settings::resolve(&ebs, Layer::default()).unwrap();
            assert_eq!(
                s.fencer,
                FencerKind::Ebs,
                "a volume and no device: EBS alone"
            );
            let e = Settings::resolve(&none, Layer::default()).unwrap_err();
            assert!(matches!(e, ConfigError::EbsWithNone), "{e}");
            let e = Settings::resolve(
                &cli(&["--node-id", "n", "--fencer", "ebs"]),
                Layer::default(),
            )
            .unwrap_err();
            assert!(matches!(e, ConfigError::EbsWithoutVolume), "{e}");
        } else {
            let e = Settings::resolve(&ebs, Layer::default()).unwrap_err();
            assert!(matches!(e, ConfigError::EbsNotBuilt), "{e}");
        }
    }
}
