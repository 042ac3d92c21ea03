//! Settings of `fenced run` and the etcd address of the operator commands, resolved
//! once, before anything touches etcd or a device.
//!
//! Precedence: a flag, then its environment variable (clap folds `FENCED_*` into the
//! flag, so both arrive here as the command-line layer), then the TOML file
//! (`--config`), then the defaults in [`defaults`]. One struct, [`Layer`], is both the
//! flag set and the file schema, so every key is named once.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use fenced::NodeId;
use fenced::agent::OnFenceConfig;
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
    /// Shortest lease TTL accepted: etcd's own minimum (it silently lengthens
    /// shorter leases).
    pub const MIN_TTL_SECS: u64 = 2;
    /// Self-fence margin, as a multiple of the lease TTL.
    pub const SELF_FENCE_MARGIN_TTLS: u32 = 2;
    /// Fence claim TTL.
    pub const CLAIM_TTL_SECS: u64 = 120;
    /// Reconciliation sweep period.
    pub const SWEEP_SECS: u64 = 30;
    /// Arenas claimed from the free pool.
    pub const ARENAS: usize = 0;
    /// Shortest etcd keepalive timeout accepted.
    pub const MIN_ETCD_KEEPALIVE_TIMEOUT_SECS: u64 = 1;
}

/// The ranges and relations every setting is checked against before `fenced run`
/// touches etcd or a device.
pub mod limits {
    /// Longest lease TTL: a fence starts about one TTL after a death.
    pub const MAX_TTL_SECS: u64 = 600;
    /// Longest self-fence margin.
    pub const MAX_SELF_FENCE_MARGIN_SECS: u64 = 3600;
    /// Shortest fence claim TTL: an etcd lease (2 s) plus the claim and finish round
    /// trips of a fence that severs nothing (`--fencer none`).
    pub const MIN_CLAIM_TTL_SECS: u64 = 3;
    /// Shortest fence claim TTL with the NVMe fencer: a preempt and a report read
    /// must fit in it on a healthy device.
    pub const MIN_NVME_CLAIM_TTL_SECS: u64 = 10;
    /// Longest fence claim TTL: a dead controller's claim blocks the fence this long.
    pub const MAX_CLAIM_TTL_SECS: u64 = 3600;
    /// Shortest sweep period: a sweep reads every key under the root; at 0 one idle
    /// daemon sent 1,833 transactions in 5 s.
    pub const MIN_SWEEP_SECS: u64 = 1;
    /// Longest sweep period: the sweep is what catches a DELETE the watch missed.
    pub const MAX_SWEEP_SECS: u64 = 3600;
    /// Longest wait for etcd at start.
    pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 86_400;
    /// Most etcd endpoints.
    pub const MAX_ENDPOINTS: usize = 16;
    /// Longest key root.
    pub const MAX_ROOT_LEN: usize = 128;
    /// Most bytes of a config file.
    pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
    /// Longest identifier (volume id, region, arena name).
    pub const MAX_NAME_LEN: usize = 128;
    /// Longest `--on-fence exec:` hook run: the daemon exits only after it.
    pub const MAX_ON_FENCE_TIMEOUT_SECS: u64 = 600;
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
    /// Membership lease TTL in seconds (2..=600).
    #[arg(long, env = "FENCED_TTL_SECS")]
    ttl_secs: Option<u64>,
    /// Self-fence when the lease was not renewed for this long (default 2 x TTL; at
    /// least the TTL, at most 3600).
    #[arg(long, env = "FENCED_SELF_FENCE_MARGIN_SECS")]
    self_fence_margin_secs: Option<u64>,
    /// Fence claim TTL in seconds, longer than the longest fence: at least 3 (10 with
    /// the NVMe fencer; more than the EBS fence deadline, 60 s, with EBS), at most 3600.
    #[arg(long, env = "FENCED_CLAIM_TTL_SECS")]
    claim_ttl_secs: Option<u64>,
    /// Reconciliation sweep period in seconds (1..=3600).
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
    /// What to do when this node self-fences or finds its key preempted: `exit`
    /// (default), `reboot` (SysRq b at once) or `exec:COMMAND` (run it, e.g. to stop
    /// the application, then exit). README "Operating it" says which to use when.
    #[arg(long, env = "FENCED_ON_FENCE")]
    on_fence: Option<String>,
    /// How long an `exec:` on-fence hook may run before it is killed (default 30).
    #[arg(long, env = "FENCED_ON_FENCE_TIMEOUT_SECS")]
    on_fence_timeout_secs: Option<u64>,
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
    /// Write our pid here; locked while the daemon runs, removed when it exits. It
    /// names the control socket, so `fenced leave --pid-file` finds the daemon.
    #[arg(long, env = "FENCED_PID_FILE")]
    pub pid_file: Option<PathBuf>,
    /// Listen here for `fenced leave` (a unix socket, mode 0660: root and the daemon's
    /// group). Default: the pid file's path with the extension `.sock`; without either,
    /// only SIGTERM makes the daemon leave.
    #[arg(long, env = "FENCED_CONTROL_SOCKET")]
    pub control_socket: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, env = "FENCED_LOG_JSON")]
    pub log_json: bool,
    /// For tests only: read this host's boot id from this file instead of
    /// /proc/sys/kernel/random/boot_id (a test "reboots" by changing it).
    #[arg(long, env = "FENCED_BOOT_ID_FILE")]
    pub boot_id_file: Option<PathBuf>,
    /// For tests only: the magic SysRq file `--on-fence reboot` writes `b` to, instead
    /// of /proc/sysrq-trigger (a test points it at a temporary file).
    #[arg(long, env = "FENCED_SYSRQ_TRIGGER_FILE")]
    pub sysrq_trigger_file: Option<PathBuf>,
    /// Run with reservations on a namespace that reports neither an NGUID nor an
    /// EUI-64. Without either, fenced cannot tell the shared namespace from another
    /// namespace of the same subsystem (only the subsystem NQN is compared), so it
    /// refuses unless told. Command line / env only, on purpose.
    #[arg(long, env = "FENCED_ALLOW_UNIDENTIFIED_NAMESPACE")]
    pub allow_unidentified_namespace: bool,
    /// Serve Prometheus metrics (`/metrics`), `/healthz` and `/readyz` over HTTP on this
    /// address, e.g. 127.0.0.1:9477.
    #[arg(long, env = "FENCED_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
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
    /// `--on-fence` is not `exit`, `reboot` or `exec:COMMAND`.
    #[error(transparent)]
    OnFence(#[from] fenced::agent::on_fence::InvalidOnFence),
    /// The config path is not a regular file (a FIFO would block, `/dev/zero` never
    /// ends).
    #[error("cannot read config {}: it is a {kind}, not a regular file; point --config at a TOML file", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },
    /// The config file is larger than [`limits::MAX_CONFIG_BYTES`].
    #[error(
        "cannot read config {}: larger than {} bytes (a config file has a few dozen lines); point --config at the right file",
        path.display(), limits::MAX_CONFIG_BYTES
    )]
    TooLarge { path: PathBuf },
    /// A number outside its range.
    #[error("{setting} = {value}: must be {min}..={max}: {why}")]
    OutOfRange {
        setting: &'static str,
        value: u64,
        min: u64,
        max: u64,
        why: &'static str,
    },
    /// A string that breaks its rule.
    #[error("{setting} = {value:?}: {rule}")]
    BadValue {
        setting: &'static str,
        value: String,
        rule: &'static str,
    },
    /// The instance id is not valid.
    #[error("--instance-id: {0}")]
    InstanceId(#[from] fenced::instance::InvalidInstanceId),
}

/// Reads the TOML config file (`None`: no file, an empty layer). Unknown keys and
/// values of the wrong type are errors naming the key.
pub fn load_file(path: Option<&Path>) -> Result<Layer, ConfigError> {
    let Some(path) = path else {
        return Ok(Layer::default());
    };
    let read = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    // O_NONBLOCK: opening a FIFO does not wait for a writer; the type check below
    // refuses it (and devices, directories) before anything is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(read)?;
    let ft = file.metadata().map_err(read)?.file_type();
    if !ft.is_file() {
        return Err(ConfigError::NotAFile {
            path: path.to_owned(),
            kind: file_kind(ft),
        });
    }
    let mut bytes = Vec::new();
    file.take(limits::MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > limits::MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_owned(),
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ))
    })?;
    parse_file(path, &text)
}

/// What a path that is not a regular file is, for an error line.
pub fn file_kind(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_file() {
        "regular file"
    } else {
        "special file"
    }
}

/// The parser's message on one line (some span several: "invalid string\nexpected
/// `"`, `'`").
fn flat(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn parse_file(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|error| ConfigError::Syntax {
        path: path.to_owned(),
        line: error
            .span()
            .and_then(|s| text.get(..s.start))
            .map_or(1, |before| 1 + before.matches('\n').count()),
        message: flat(error.message()),
    })?;
    // Key by key first: serde's own error does not say which key was wrong.
    for (key, value) in &table {
        let one = toml::Table::from_iter([(key.clone(), value.clone())]);
        if let Err(error) = toml::Value::Table(one).try_into::<Layer>() {
            return Err(ConfigError::Key {
                path: path.to_owned(),
                key: key.clone(),
                message: flat(error.message()),
            });
        }
    }
    toml::Value::Table(table)
        .try_into()
        .map_err(|error: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            line: 1,
            message: flat(error.message()),
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

/// An etcd endpoint: `http://host:port`, `https://host:port` or `host:port` (taken as
/// http), the host a DNS name, an IPv4 address or a bracketed IPv6 address.
fn check_endpoint(e: &str) -> Result<(), ConfigError> {
    let bad = |rule| ConfigError::BadValue {
        setting: "--etcd-endpoints",
        value: e.to_owned(),
        rule,
    };
    const RULE: &str =
        "not an etcd URL: use http://HOST:PORT or https://HOST:PORT (e.g. http://10.0.0.5:2379)";
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .unwrap_or(e);
    if rest.contains("://") {
        return Err(bad("unsupported scheme: use http:// or https://"));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (addr, tail) = v6.split_once(']').ok_or_else(|| bad(RULE))?;
        if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return Err(bad(RULE));
        }
        (addr, tail.strip_prefix(':').ok_or_else(|| bad(RULE))?)
    } else {
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad(RULE))?;
        let dns = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
        if host.is_empty() || !host.chars().all(dns) {
            return Err(bad(RULE));
        }
        (host, port)
    };
    let _ = host;
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.chars().all(|c| c.is_ascii_digit()) => Ok(()),
        _ => Err(bad(RULE)),
    }
}

/// The key root: starts with `/`, printable ASCII without spaces, at most
/// [`limits::MAX_ROOT_LEN`] bytes.
fn check_root(root: &str) -> Result<(), ConfigError> {
    let ok = root.starts_with('/')
        && root.len() <= limits::MAX_ROOT_LEN
        && root.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadValue {
            setting: "--root",
            value: root.to_owned(),
            rule: "a key root starts with / and has at most 128 printable ASCII characters, no spaces (e.g. /fenced/)",
        })
    }
}

/// A name that ends up in an etcd key, a log line or an API call (volume id, region,
/// arena): 1..=[`limits::MAX_NAME_LEN`] characters from `[A-Za-z0-9._:-]`, starting
/// with a letter or digit.
fn check_name(setting: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= limits::MAX_NAME_LEN
        && value.chars().enumerate().all(|(i, c)| {
            c.is_ascii_alphanumeric() || (i > 0 && matches!(c, '.' | '_' | ':' | '-'))
        });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadValue {
            setting,
            value: value.to_owned(),
            rule: "use 1 to 128 of A-Z a-z 0-9 . _ : -, starting with a letter or digit",
        })
    }
}

/// A path the daemon writes into its pid file or logs: no control characters.
fn check_path(setting: &'static str, path: &Path) -> Result<(), ConfigError> {
    let text = path.to_string_lossy();
    if text.is_empty() || text.chars().any(char::is_control) || path.to_str().is_none() {
        return Err(ConfigError::BadValue {
            setting,
            value: text.into_owned(),
            rule: "a path must be UTF-8 without control characters",
        });
    }
    Ok(())
}

/// `value` (seconds) within `min..=max`.
fn in_range(
    setting: &'static str,
    value: u64,
    min: u64,
    max: u64,
    why: &'static str,
) -> Result<Duration, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(Duration::from_secs(value))
    } else {
        Err(ConfigError::OutOfRange {
            setting,
            value,
            min,
            max,
            why,
        })
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
    /// `None`: no control socket (leave by SIGTERM only).
    pub control_socket: Option<PathBuf>,
    pub log_json: bool,
    /// What to do on a self-fence.
    pub on_fence: OnFenceConfig,
    /// Where this boot's id is read.
    pub boot_id_file: PathBuf,
    pub allow_unidentified_namespace: bool,
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl Settings {
    /// Resolves `run`'s settings: `cli` (flags, and the env vars clap folded into
    /// them) over `file` over [`defaults`]. Checks everything that can be checked
    /// without I/O: each value's range or rule, and the relations between them.
    pub fn resolve(cli: &RunArgs, file: Layer) -> Result<Self, ConfigError> {
        let etcd = EtcdSettings::resolve(&cli.etcd, &file)?;
        let l = cli.settings.clone();
        let on_fence = on_fence_config(cli, &l, &file)?;
        let pick = |c: Option<u64>, f: Option<u64>| c.or(f);
        let node_id = l
            .node_id
            .or(file.node_id)
            .ok_or(ConfigError::MissingNodeId)?;
        let node = NodeId::new(&node_id)?;
        let instance_id = l.instance_id.or(file.instance_id);
        if let Some(id) = &instance_id {
            fenced::instance::check_instance_id(id)?;
        }
        let block_device = l.block_device.or(file.block_device);
        let ebs = EbsSettings {
            volume_id: l.ebs_volume_id.or(file.ebs_volume_id),
            region: l.ebs_region.or(file.ebs_region),
            endpoint_url: l.ebs_endpoint_url.or(file.ebs_endpoint_url),
        };
        if let Some(v) = &ebs.volume_id {
            check_name("--ebs-volume-id", v)?;
        }
        if let Some(r) = &ebs.region {
            check_name("--ebs-region", r)?;
        }
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
        let ttl_secs = pick(l.ttl_secs, file.ttl_secs).unwrap_or(defaults::TTL_SECS);
        let ttl = in_range(
            "--ttl-secs",
            ttl_secs,
            defaults::MIN_TTL_SECS,
            limits::MAX_TTL_SECS,
            "etcd lengthens a shorter lease to 2 s, and a fence starts about one TTL after a death",
        )?;
        let self_fence_margin = match pick(l.self_fence_margin_secs, file.self_fence_margin_secs) {
            None => defaults::SELF_FENCE_MARGIN_TTLS * ttl,
            Some(m) => in_range(
                "--self-fence-margin-secs",
                m,
                ttl_secs,
                limits::MAX_SELF_FENCE_MARGIN_SECS,
                "at least --ttl-secs: a shorter margin self-fences a node whose lease is still valid",
            )?,
        };
        let (min_claim, why_claim) = match (fencer, ebs.volume_id.is_some()) {
            (_, true) if cfg!(feature = "ebs") => (
                ebs_deadline_secs() + 1,
                "longer than the EBS fence deadline, so a claim outlives the fence",
            ),
            (FencerKind::Nvme, _) => (
                limits::MIN_NVME_CLAIM_TTL_SECS,
                "longer than an NVMe preempt and report, so a claim outlives the fence",
            ),
            _ => (
                limits::MIN_CLAIM_TTL_SECS,
                "an etcd lease (2 s) plus a fence's round trips; 0 fences nothing",
            ),
        };
        let claim_ttl = in_range(
            "--claim-ttl-secs",
            pick(l.claim_ttl_secs, file.claim_ttl_secs).unwrap_or(defaults::CLAIM_TTL_SECS),
            min_claim,
            limits::MAX_CLAIM_TTL_SECS,
            why_claim,
        )?;
        let sweep = in_range(
            "--sweep-secs",
            pick(l.sweep_secs, file.sweep_secs).unwrap_or(defaults::SWEEP_SECS),
            limits::MIN_SWEEP_SECS,
            limits::MAX_SWEEP_SECS,
            "each sweep reads every key under the root (at 0 an idle daemon sends thousands of transactions a second)",
        )?;
        let connect_timeout = pick(l.connect_timeout_secs, file.connect_timeout_secs)
            .map(|t| {
                in_range(
                    "--connect-timeout-secs",
                    t,
                    1,
                    limits::MAX_CONNECT_TIMEOUT_SECS,
                    "leave it unset to wait for etcd as long as it takes",
                )
            })
            .transpose()?;
        let etcd_keepalive_timeout = pick(
            l.etcd_keepalive_timeout_secs,
            file.etcd_keepalive_timeout_secs,
        )
        .map(|t| {
            in_range(
                "--etcd-keepalive-timeout-secs",
                t,
                defaults::MIN_ETCD_KEEPALIVE_TIMEOUT_SECS,
                ttl_secs,
                "at most --ttl-secs: a dead connection found later than the lease expires costs the node its membership",
            )
        })
        .transpose()?;
        if let Some(arenas) = &cli.seed_arenas {
            for a in arenas {
                check_name("--seed-arenas", a)?;
            }
        }
        for (setting, p) in [
            ("--pid-file", cli.pid_file.as_deref()),
            ("--control-socket", cli.control_socket.as_deref()),
            ("--watchdog-device", l.watchdog_device.as_deref()),
            ("--block-device", block_device.as_deref()),
        ] {
            if let Some(p) = p {
                check_path(setting, p)?;
            }
        }
        let control_socket = cli.control_socket.clone().or_else(|| {
            cli.pid_file
                .as_ref()
                .map(|p| p.with_extension("sock"))
                .filter(|s| Some(s) != cli.pid_file.as_ref())
        });
        Ok(Self {
            etcd,
            node,
            role,
            instance_id,
            block_device,
            fencer,
            preempt,
            ebs,
            ttl,
            self_fence_margin,
            claim_ttl,
            sweep,
            arenas: l.arenas.or(file.arenas).unwrap_or(defaults::ARENAS),
            watchdog_device: l.watchdog_device.or(file.watchdog_device),
            connect_timeout,
            etcd_keepalive_timeout,
            seed_arenas: cli.seed_arenas.clone(),
            pid_file: cli.pid_file.clone(),
            control_socket,
            log_json: cli.log_json,
            on_fence,
            boot_id_file: cli
                .boot_id_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(fenced::agent::BOOT_ID_FILE)),
            allow_unidentified_namespace: cli.allow_unidentified_namespace,
            metrics_listen: cli.metrics_listen,
        })
    }
}

/// `--on-fence`, its hook timeout and (tests only) the SysRq file.
fn on_fence_config(cli: &RunArgs, l: &Layer, file: &Layer) -> Result<OnFenceConfig, ConfigError> {
    let mut c = OnFenceConfig::default();
    if let Some(a) = l.on_fence.as_ref().or(file.on_fence.as_ref()) {
        c.action = a.parse()?;
    }
    if let Some(t) = l.on_fence_timeout_secs.or(file.on_fence_timeout_secs) {
        c.hook_timeout = in_range(
            "--on-fence-timeout-secs",
            t,
            1,
            limits::MAX_ON_FENCE_TIMEOUT_SECS,
            "the hook must stop the application quickly; the daemon exits only after it",
        )?;
    }
    if let Some(p) = &cli.sysrq_trigger_file {
        c.sysrq_trigger.clone_from(p);
    }
    Ok(c)
}

/// The EBS fence's deadline in whole seconds (the claim must outlive it).
fn ebs_deadline_secs() -> u64 {
    #[cfg(feature = "ebs")]
    {
        fenced::ebs::DEFAULT_DEADLINE.as_secs()
    }
    #[cfg(not(feature = "ebs"))]
    {
        60
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
    fn values_out_of_range_are_refused_naming_the_setting() {
        let run = |flags: &[&str]| {
            let mut all = vec!["--node-id", "n1", "--fencer", "none"];
            all.extend_from_slice(flags);
            Settings::resolve(&cli(&all), Layer::default())
        };
        for (flags, setting) in [
            (&["--ttl-secs", "1"][..], "--ttl-secs"),
            (&["--ttl-secs", "0"], "--ttl-secs"),
            (&["--ttl-secs", "18446744073709551615"], "--ttl-secs"),
            (&["--claim-ttl-secs", "0"], "--claim-ttl-secs"),
            (&["--claim-ttl-secs", "2"], "--claim-ttl-secs"),
            (&["--sweep-secs", "0"], "--sweep-secs"),
            (&["--sweep-secs", "99999"], "--sweep-secs"),
            (&["--connect-timeout-secs", "0"], "--connect-timeout-secs"),
            (
                &["--etcd-keepalive-timeout-secs", "0"],
                "--etcd-keepalive-timeout-secs",
            ),
            (
                &["--ttl-secs", "5", "--etcd-keepalive-timeout-secs", "6"],
                "--etcd-keepalive-timeout-secs",
            ),
            (
                &["--ttl-secs", "5", "--self-fence-margin-secs", "4"],
                "--self-fence-margin-secs",
            ),
            (
                &["--self-fence-margin-secs", "18446744073709551615"],
                "--self-fence-margin-secs",
            ),
        ] {
            let e = run(flags).unwrap_err();
            assert!(
                matches!(&e, ConfigError::OutOfRange { setting: s, .. } if *s == setting),
                "{flags:?}: {e}"
            );
            let line = e.to_string();
            assert!(line.starts_with(&format!("{setting} = ")), "{line}");
            assert!(line.contains("must be") && line.contains(": "), "{line}");
        }
        // The NVMe fencer needs a longer claim than single-signal fencing.
        let e = Settings::resolve(
            &cli(&[
                "--node-id",
                "n1",
                "--block-device",
                "/dev/nvme1n1",
                "--claim-ttl-secs",
                "5",
            ]),
            Layer::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--claim-ttl-secs = 5: must be 10..="),
            "{e}"
        );
        // The boundaries themselves are accepted.
        let s = run(&[
            "--ttl-secs",
            "2",
            "--claim-ttl-secs",
            "3",
            "--sweep-secs",
            "1",
        ])
        .unwrap();
        assert_eq!(s.ttl, Duration::from_secs(2));
        assert_eq!(s.claim_ttl, Duration::from_secs(3));
        assert_eq!(s.sweep, Duration::from_secs(1));
        let f = file("etcd_keepalive_timeout_secs = 1\n").unwrap();
        let s = Settings::resolve(&cli(&["--node-id", "n1", "--fencer", "none"]), f).unwrap();
        assert_eq!(s.etcd_keepalive_timeout, Some(Duration::from_secs(1)));
    }

    #[test]
    fn untrusted_strings_are_refused_naming_the_setting() {
        let run = |flags: &[&str]| {
            let mut all = vec!["--node-id", "n1", "--fencer", "none"];
            all.extend_from_slice(flags);
            Settings::resolve(&cli(&all), Layer::default())
        };
        for (flags, start) in [
            (
                &["--instance-id", "i-1\nforged"][..],
                "--instance-id: invalid instance id \"i-1\\nforged\"",
            ),
            (
                &["--instance-id", ""],
                "--instance-id: invalid instance id: empty",
            ),
            (
                &["--etcd-endpoints", "ftp://h:1"],
                "--etcd-endpoints = \"ftp://h:1\": unsupported scheme",
            ),
            (
                &["--etcd-endpoints", "http://h"],
                "--etcd-endpoints = \"http://h\": not an etcd URL",
            ),
            (
                &["--etcd-endpoints", "http://h:99999"],
                "--etcd-endpoints = \"http://h:99999\"",
            ),
            (
                &["--etcd-endpoints", "http://a b:1"],
                "--etcd-endpoints = \"http://a b:1\"",
            ),
            (&["--etcd-endpoints", ""], "--etcd-endpoints = \"\""),
            (
                &["--root", "fenced"],
                "--root = \"fenced\": a key root starts with /",
            ),
            (&["--root", "/a\nb"], "--root = \"/a\\nb\""),
            (&["--seed-arenas", "a1,a/2"], "--seed-arenas = \"a/2\""),
            (
                &["--pid-file", "/run/x\ny.pid"],
                "--pid-file = \"/run/x\\ny.pid\"",
            ),
        ] {
            let e = run(flags).unwrap_err();
            let line = e.to_string();
            assert!(line.starts_with(start), "{flags:?}: {line}");
            assert!(!line.contains('\n'), "{line}");
        }
        for ok in [
            "http://127.0.0.1:2379",
            "https://etcd-1.example.com:2379/",
            "10.0.0.5:2379",
            "http://[::1]:2379",
        ] {
            run(&["--etcd-endpoints", ok]).unwrap();
        }
    }

    #[test]
    fn the_control_socket_defaults_to_the_pid_files_name() {
        let run = |flags: &[&str]| {
            let mut all = vec!["--node-id", "n1", "--fencer", "none"];
            all.extend_from_slice(flags);
            Settings::resolve(&cli(&all), Layer::default()).unwrap()
        };
        assert_eq!(
            run(&["--pid-file", "/run/fenced.pid"]).control_socket,
            Some(PathBuf::from("/run/fenced.sock"))
        );
        assert_eq!(
            run(&["--pid-file", "/run/f.pid", "--control-socket", "/run/c"]).control_socket,
            Some(PathBuf::from("/run/c"))
        );
        assert_eq!(run(&[]).control_socket, None);
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
            ttl_secs = 5
            self_fence_margin_secs = 9
            claim_ttl_secs = 90
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

    /// The commented example installed as /etc/fenced/fenced.toml.
    const EXAMPLE: &str = include_str!("../../packaging/fenced.toml");

    /// The example's `# key = value` lines, uncommented.
    fn example_assignments() -> Vec<&'static str> {
        EXAMPLE
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                })
            })
            .collect()
    }

    #[test]
    fn the_example_config_parses_as_shipped_and_with_every_key_set() {
        let path = Path::new("packaging/fenced.toml");
        assert_eq!(
            parse_file(path, EXAMPLE).unwrap(),
            Layer::default(),
            "shipped with every key commented out"
        );
        let all = example_assignments().join("\n");
        // A misspelt key or a value of the wrong type fails here, naming the key.
        let f = parse_file(path, &all).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.node_id.as_deref(), Some("db1"));
        if cfg!(feature = "ebs") {
            let s = Settings::resolve(&cli(&[]), f).unwrap_or_else(|e| panic!("{e}"));
            // "Keys left commented out take the default shown."
            assert_eq!(s.etcd.endpoints, [defaults::ETCD_ENDPOINT]);
            assert_eq!(s.etcd.root, defaults::ROOT);
            assert_eq!(s.ttl, Duration::from_secs(defaults::TTL_SECS));
            assert_eq!(
                s.self_fence_margin,
                defaults::SELF_FENCE_MARGIN_TTLS * s.ttl
            );
            assert_eq!(s.claim_ttl, Duration::from_secs(defaults::CLAIM_TTL_SECS));
            assert_eq!(s.sweep, Duration::from_secs(defaults::SWEEP_SECS));
            assert_eq!(s.arenas, defaults::ARENAS);
            assert_eq!(s.preempt, PreemptMode::PreemptAndAbort);
            assert_eq!(s.fencer, FencerKind::Nvme);
        }
    }

    #[test]
    fn the_example_config_shows_every_key() {
        // The parser's own list of the keys it accepts, from its unknown-key message
        // ("unknown field `x`, expected one of `a`, `b`, ...").
        let e = file("not_a_key = 1").unwrap_err();
        let ConfigError::Key { message, .. } = &e else {
            panic!("{e}");
        };
        let expected = message
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("no key list in {message:?}"))
            .1;
        let keys: Vec<&str> = expected.split(", ").map(|k| k.trim_matches('`')).collect();
        assert!(
            keys.contains(&"node_id") && keys.contains(&"root"),
            "{keys:?}"
        );
        let shown: Vec<&str> = example_assignments()
            .iter()
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
            .collect();
        let missing: Vec<&&str> = keys.iter().filter(|k| !shown.contains(k)).collect();
        assert!(
            missing.is_empty(),
            "packaging/fenced.toml does not show {missing:?}: add a commented `# key = value` line for each"
        );
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

    /// The config parser and the resolver on any text: never a panic; an error is one
    /// line naming the line (syntax) or the key (unknown key, wrong type) or the
    /// setting (out of range).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const KEYS: &[&str] = &[
            "etcd_endpoints",
            "root",
            "node_id",
            "instance_id",
            "block_device",
            "fencer",
            "preempt",
            "ebs_volume_id",
            "ebs_region",
            "ebs_endpoint_url",
            "ttl_secs",
            "self_fence_margin_secs",
            "claim_ttl_secs",
            "sweep_secs",
            "arenas",
            "watchdog_device",
            "connect_timeout_secs",
            "etcd_keepalive_timeout_secs",
            "ttl",
            "pid_file",
        ];

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<u64>().prop_map(|v| v.to_string()),
                any::<i64>().prop_map(|v| v.to_string()),
                (0u64..200).prop_map(|v| v.to_string()),
                "\"[ -~]{0,24}\"",
                "\"[a-z0-9./:-]{0,12}\"",
                Just("true".to_owned()),
                Just("1.5e300".to_owned()),
                "\\[(\"[a-z0-9:/.]{0,12}\", ?){0,3}\\]",
                "[^\n]{0,12}",
            ]
        }

        fn line() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => (prop::sample::select(KEYS), value()).prop_map(|(k, v)| format!("{k} = {v}")),
                1 => "\\[[a-z_.]{0,8}\\]",
                1 => "[^\n]{0,40}",
            ]
        }

        fn check(text: &str) {
            let path = Path::new("/etc/fenced.toml");
            let layer = match parse_file(path, text) {
                Ok(layer) => layer,
                Err(e) => {
                    let msg = e.to_string();
                    assert!(!msg.contains('\n'), "{msg}");
                    match e {
                        ConfigError::Syntax { line, .. } => {
                            assert!(line >= 1 && line <= text.matches('\n').count() + 1, "{msg}");
                        }
                        ConfigError::Key { key, .. } => {
                            // A quoted key may be spelled with escapes.
                            assert!(
                                text.contains(&key) || text.contains('"') || text.contains('\''),
                                "{msg}"
                            );
                        }
                        other => panic!("unexpected error kind: {other}"),
                    }
                    return;
                }
            };
            for flags in [&["--node-id", "n1", "--fencer", "none"][..], &[]] {
                if let Err(e) = Settings::resolve(&cli(flags), layer.clone()) {
                    let msg = e.to_string();
                    assert!(!msg.contains('\n') && !msg.is_empty(), "{msg}");
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn any_text(text in "(?s).{0,300}") {
                check(&text);
            }

            #[test]
            fn toml_like_text(lines in prop::collection::vec(line(), 0..14)) {
                check(&lines.join("\n"));
            }
        }
    }
}
