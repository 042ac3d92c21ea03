//! The flags of `fenced run` and the etcd flags of every command; [`Layer`] is also the
//! TOML file's schema.

use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde::Deserialize;

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
    /// etcd endpoints, comma separated (default: http://127.0.0.1:2379).
    #[arg(long, env = "FENCED_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// Key root: every key fenced writes is under it (default: /fenced/).
    #[arg(long, env = "FENCED_ROOT")]
    pub root: Option<String>,
    /// TOML config file (keys as the long flags, with underscores). Default: the
    /// package's /etc/fenced/fenced.toml when it exists, else none.
    #[arg(long, env = "FENCED_CONFIG")]
    pub config: Option<PathBuf>,
    /// CA bundle (PEM) that verifies the etcd servers of https:// endpoints (default:
    /// the system CA store).
    #[arg(long, env = "FENCED_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd; with etcd's --client-cert-auth and
    /// no --etcd-user, its CN is the etcd user. Default: none.
    #[arg(long, env = "FENCED_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM) (default: none).
    #[arg(long, env = "FENCED_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user (password authentication; the password comes from
    /// --etcd-password-file or FENCED_ETCD_PASSWORD, never from a flag, which `ps`
    /// would show). Default: none.
    #[arg(long, env = "FENCED_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File whose first line is the etcd user's password (default: none;
    /// FENCED_ETCD_PASSWORD, else no password).
    #[arg(long, env = "FENCED_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

/// The package's config file: every command reads it when no `--config` (or
/// `FENCED_CONFIG`) names another, so an operator command on an installed host talks
/// to the etcd the daemon uses.
pub const PACKAGE_CONFIG: &str = "/etc/fenced/fenced.toml";

impl EtcdArgs {
    /// The config file this command reads: `--config`, else [`PACKAGE_CONFIG`] when it
    /// exists, else none.
    pub fn config_path(&self) -> Option<PathBuf> {
        config_path(self.config.as_deref(), Path::new(PACKAGE_CONFIG).exists())
    }
}

/// [`EtcdArgs::config_path`]'s rule, given whether the package's file exists.
pub(crate) fn config_path(flag: Option<&Path>, package_exists: bool) -> Option<PathBuf> {
    match flag {
        Some(p) => Some(p.to_owned()),
        None => package_exists.then(|| PathBuf::from(PACKAGE_CONFIG)),
    }
}

/// One layer of settings: the `run` flags (with their env vars) and the TOML file's
/// schema. `etcd_endpoints`, `root` and the etcd TLS and credential settings are file
/// keys here; their flags are declared by [`EtcdArgs`] (the operator commands take
/// them too). So are `approvals` and `approval_timeout_secs`, whose flags are
/// `fenced attest`'s.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    #[arg(skip)]
    pub(crate) etcd_endpoints: Option<Vec<String>>,
    #[arg(skip)]
    pub(crate) root: Option<String>,
    #[arg(skip)]
    pub(crate) etcd_ca: Option<PathBuf>,
    #[arg(skip)]
    pub(crate) etcd_cert: Option<PathBuf>,
    #[arg(skip)]
    pub(crate) etcd_key: Option<PathBuf>,
    #[arg(skip)]
    pub(crate) etcd_user: Option<String>,
    #[arg(skip)]
    pub(crate) etcd_password_file: Option<PathBuf>,
    /// `fenced attest`'s distinct operators (a file key; `attest` takes the flag).
    #[arg(skip)]
    pub(crate) approvals: Option<u32>,
    /// `fenced attest`'s approval wait (a file key; `attest` takes the flag).
    #[arg(skip)]
    pub(crate) approval_timeout_secs: Option<u64>,
    /// This node's id ([A-Za-z0-9._-], at most 63). Required.
    #[arg(long, env = "FENCED_NODE_ID")]
    pub(crate) node_id: Option<String>,
    /// What to run: the node agent, the controller, or both. With etcd RBAC
    /// (`fenced etcd-roles`) an agent needs only its node's role, a controller the
    /// controller role. Default: both.
    #[arg(long, env = "FENCED_ROLE", value_enum)]
    pub(crate) role: Option<Role>,
    /// Instance id (default: EC2 instance id, else machine id).
    #[arg(long, env = "FENCED_INSTANCE_ID")]
    pub(crate) instance_id: Option<String>,
    /// The shared namespace (/dev/nvmeXnY or /dev/ngXnY; a /dev/disk/by-id link is
    /// best). Required with --fencer nvme (default: none).
    #[arg(long, env = "FENCED_BLOCK_DEVICE")]
    pub(crate) block_device: Option<PathBuf>,
    /// Fencer. Default: nvme, or ebs when only --ebs-volume-id is given.
    #[arg(long, env = "FENCED_FENCER", value_enum)]
    pub(crate) fencer: Option<FencerKind>,
    /// Reservation Acquire action used to fence. Default: preempt-and-abort.
    #[arg(long, env = "FENCED_PREEMPT", value_enum)]
    pub(crate) preempt: Option<PreemptArg>,
    /// EBS fencer: the shared volume (vol-...). Alone with `--fencer ebs` (the default
    /// when there is no --block-device); after NVMe as the fallback level otherwise.
    /// Default: none.
    #[arg(long, env = "FENCED_EBS_VOLUME_ID")]
    pub(crate) ebs_volume_id: Option<String>,
    /// EBS fencer: the region (default: the standard AWS chain, e.g. AWS_REGION, IMDS).
    #[arg(long, env = "FENCED_EBS_REGION")]
    pub(crate) ebs_region: Option<String>,
    /// EBS fencer: EC2 endpoint override (a VPC endpoint, a test peer). Default: the
    /// region's public endpoint.
    #[arg(long, env = "FENCED_EBS_ENDPOINT_URL")]
    pub(crate) ebs_endpoint_url: Option<String>,
    /// Membership lease TTL in seconds, 2 to 600 (default: 5).
    #[arg(long, env = "FENCED_TTL_SECS")]
    pub(crate) ttl_secs: Option<u64>,
    /// Self-fence when the lease was not renewed for this long (default 2 x TTL; at
    /// least the TTL, at most 3600).
    #[arg(long, env = "FENCED_SELF_FENCE_MARGIN_SECS")]
    pub(crate) self_fence_margin_secs: Option<u64>,
    /// Fence claim TTL in seconds, longer than the longest fence: at least 3 (10 with
    /// the NVMe fencer; 120, twice the EBS fence deadline of 60 s, with EBS), at most
    /// 3600 (default: 120).
    #[arg(long, env = "FENCED_CLAIM_TTL_SECS")]
    pub(crate) claim_ttl_secs: Option<u64>,
    /// Reconciliation sweep period in seconds, 1 to 3600 (default: 30).
    #[arg(long, env = "FENCED_SWEEP_SECS")]
    pub(crate) sweep_secs: Option<u64>,
    /// How many arenas to claim from the free pool (default: 0). A count:
    /// arenas are named by `--seed-arenas` and `fenced etcd-roles --arenas`. The old
    /// spelling `--arenas` (and `arenas` in the file) still reads as this count.
    #[arg(long, alias = "arenas", env = "FENCED_ARENA_COUNT")]
    #[serde(alias = "arenas")]
    pub(crate) arena_count: Option<usize>,
    /// Arm this hardware watchdog (e.g. /dev/watchdog). Default: none.
    #[arg(long, env = "FENCED_WATCHDOG")]
    pub(crate) watchdog_device: Option<PathBuf>,
    /// Give up waiting for etcd at start after this many seconds and exit 1 with an
    /// error. Without it (the default) the daemon waits as long as it takes: it retries with backoff
    /// (0.5 s doubling up to 10 s) and logs every attempt as "waiting for etcd at
    /// <endpoints>", so a host whose daemon starts before etcd joins once etcd answers.
    #[arg(long, env = "FENCED_CONNECT_TIMEOUT_SECS")]
    pub(crate) connect_timeout_secs: Option<u64>,
    /// Drop an etcd connection whose HTTP/2 PING is not answered within this many
    /// seconds (the client then reconnects, to another endpoint if this one is dead).
    /// Default: the larger of 2 s and TTL/2, so a slow link that still renews the
    /// lease is not torn down (a drop restarts the membership watch, breaks the lease
    /// keepalive stream and fails requests in flight).
    #[arg(long, env = "FENCED_ETCD_KEEPALIVE_TIMEOUT_SECS")]
    pub(crate) etcd_keepalive_timeout_secs: Option<u64>,
    /// What to do when this node self-fences or finds its key preempted: `exit`
    /// (default), `reboot` (SysRq b at once) or `exec:COMMAND` (run it, e.g. to stop
    /// the application, then exit). README "Operating it" says which to use when.
    #[arg(long, env = "FENCED_ON_FENCE")]
    pub(crate) on_fence: Option<String>,
    /// How long an `exec:` on-fence hook may run before it is killed, in seconds
    /// (default: 30).
    #[arg(long, env = "FENCED_ON_FENCE_TIMEOUT_SECS")]
    pub(crate) on_fence_timeout_secs: Option<u64>,
    /// Put these arenas into the free pool (if unowned) at start, comma separated
    /// (default: none).
    #[arg(long, env = "FENCED_SEED_ARENAS", value_delimiter = ',')]
    pub(crate) seed_arenas: Option<Vec<String>>,
    /// Write our pid here; locked while the daemon runs, removed when it exits. It
    /// names the control socket, so `fenced leave --pid-file` finds the daemon.
    /// Default: none.
    #[arg(long, env = "FENCED_PID_FILE")]
    pub(crate) pid_file: Option<PathBuf>,
    /// Listen here for `fenced leave` (a unix socket, mode 0660: root and the daemon's
    /// group). Default: the pid file's path with the extension `.sock`; without either,
    /// only SIGTERM makes the daemon leave.
    #[arg(long, env = "FENCED_CONTROL_SOCKET")]
    pub(crate) control_socket: Option<PathBuf>,
    /// Log as JSON lines (default: text).
    #[arg(long, env = "FENCED_LOG_JSON")]
    #[serde(default)]
    pub(crate) log_json: bool,
    /// Serve Prometheus metrics (`/metrics`), `/healthz` and `/readyz` over HTTP on this
    /// address, e.g. 127.0.0.1:9477 (default: not served).
    #[arg(long, env = "FENCED_METRICS_LISTEN", value_name = "ADDR")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
}

impl Layer {
    /// Every key of the config file, as the file spells it (the long flag with
    /// underscores); a misspelt key is answered with the nearest of these.
    pub(crate) const KEYS: &'static [&'static str] = &[
        "etcd_endpoints",
        "root",
        "etcd_ca",
        "etcd_cert",
        "etcd_key",
        "etcd_user",
        "etcd_password_file",
        "approvals",
        "approval_timeout_secs",
        "node_id",
        "role",
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
        "arena_count",
        "watchdog_device",
        "connect_timeout_secs",
        "etcd_keepalive_timeout_secs",
        "on_fence",
        "on_fence_timeout_secs",
        "seed_arenas",
        "pid_file",
        "control_socket",
        "log_json",
        "metrics_listen",
    ];
}

/// `fenced run`'s flags: the etcd address, the settings layer (every flag there has an
/// environment variable and a config key), and the flags that only the command line
/// and the environment set, on purpose: two test-only overrides and
/// `--allow-unidentified-namespace`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    #[command(flatten)]
    pub settings: Layer,
    /// For tests only: read this host's boot id from this file instead of
    /// /proc/sys/kernel/random/boot_id (a test "reboots" by changing it). Default:
    /// that file.
    #[arg(long, env = "FENCED_BOOT_ID_FILE")]
    pub boot_id_file: Option<PathBuf>,
    /// For tests only: the magic SysRq file `--on-fence reboot` writes `b` to, instead
    /// of /proc/sysrq-trigger (a test points it at a temporary file). Default: that file.
    #[arg(long, env = "FENCED_SYSRQ_TRIGGER_FILE")]
    pub sysrq_trigger_file: Option<PathBuf>,
    /// Run with reservations on a namespace that reports no UUID, NGUID or EUI-64 and
    /// whose controller reports no serial number either. Without any of them, fenced
    /// cannot tell the shared namespace from another namespace of the same subsystem
    /// (only the subsystem NQN is compared), so it refuses unless told. Not needed for
    /// the kernel target's default namespaces (a UUID) or EBS volumes (a serial
    /// number). Command line / env only, on purpose. Default: off.
    #[arg(long, env = "FENCED_ALLOW_UNIDENTIFIED_NAMESPACE")]
    pub allow_unidentified_namespace: bool,
}
