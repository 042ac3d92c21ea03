//! The flags of `fenced run` and the etcd flags of every command; [`Layer`] is also the
//! TOML file's schema.

use std::path::PathBuf;

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
    /// This node's id ([A-Za-z0-9._-], at most 63).
    #[arg(long, env = "FENCED_NODE_ID")]
    pub(crate) node_id: Option<String>,
    /// What to run: the node agent, the controller, or both. With etcd RBAC
    /// (`fenced etcd-roles`) an agent needs only its node's role, a controller the
    /// controller role.
    #[arg(long, env = "FENCED_ROLE", value_enum)]
    pub(crate) role: Option<Role>,
    /// Instance id (default: EC2 instance id, else machine id).
    #[arg(long, env = "FENCED_INSTANCE_ID")]
    pub(crate) instance_id: Option<String>,
    /// The shared namespace (/dev/nvmeXnY or /dev/ngXnY).
    #[arg(long, env = "FENCED_BLOCK_DEVICE")]
    pub(crate) block_device: Option<PathBuf>,
    /// Fencer.
    #[arg(long, env = "FENCED_FENCER", value_enum)]
    pub(crate) fencer: Option<FencerKind>,
    /// Reservation Acquire action used to fence.
    #[arg(long, env = "FENCED_PREEMPT", value_enum)]
    pub(crate) preempt: Option<PreemptArg>,
    /// EBS fencer: the shared volume (vol-...). Alone with `--fencer ebs` (the default
    /// when there is no --block-device); after NVMe as the fallback level otherwise.
    #[arg(long, env = "FENCED_EBS_VOLUME_ID")]
    pub(crate) ebs_volume_id: Option<String>,
    /// EBS fencer: the region (default: the standard AWS chain, e.g. AWS_REGION, IMDS).
    #[arg(long, env = "FENCED_EBS_REGION")]
    pub(crate) ebs_region: Option<String>,
    /// EBS fencer: EC2 endpoint override (a VPC endpoint, a test peer).
    #[arg(long, env = "FENCED_EBS_ENDPOINT_URL")]
    pub(crate) ebs_endpoint_url: Option<String>,
    /// Membership lease TTL in seconds (2..=600).
    #[arg(long, env = "FENCED_TTL_SECS")]
    pub(crate) ttl_secs: Option<u64>,
    /// Self-fence when the lease was not renewed for this long (default 2 x TTL; at
    /// least the TTL, at most 3600).
    #[arg(long, env = "FENCED_SELF_FENCE_MARGIN_SECS")]
    pub(crate) self_fence_margin_secs: Option<u64>,
    /// Fence claim TTL in seconds, longer than the longest fence: at least 3 (10 with
    /// the NVMe fencer; more than the EBS fence deadline, 60 s, with EBS), at most 3600.
    #[arg(long, env = "FENCED_CLAIM_TTL_SECS")]
    pub(crate) claim_ttl_secs: Option<u64>,
    /// Reconciliation sweep period in seconds (1..=3600).
    #[arg(long, env = "FENCED_SWEEP_SECS")]
    pub(crate) sweep_secs: Option<u64>,
    /// Arenas to claim from the free pool.
    #[arg(long, env = "FENCED_ARENAS")]
    pub(crate) arenas: Option<usize>,
    /// Arm this hardware watchdog (e.g. /dev/watchdog).
    #[arg(long, env = "FENCED_WATCHDOG")]
    pub(crate) watchdog_device: Option<PathBuf>,
    /// Give up waiting for etcd at start after this many seconds and exit 1 with an
    /// error. Without it the daemon waits as long as it takes: it retries with backoff
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
    /// How long an `exec:` on-fence hook may run before it is killed (default 30).
    #[arg(long, env = "FENCED_ON_FENCE_TIMEOUT_SECS")]
    pub(crate) on_fence_timeout_secs: Option<u64>,
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
    /// Run with reservations on a namespace that reports no UUID, NGUID or EUI-64 and
    /// whose controller reports no serial number either. Without any of them, fenced
    /// cannot tell the shared namespace from another namespace of the same subsystem
    /// (only the subsystem NQN is compared), so it refuses unless told. Not needed for
    /// the kernel target's default namespaces (a UUID) or EBS volumes (a serial
    /// number). Command line / env only, on purpose.
    #[arg(long, env = "FENCED_ALLOW_UNIDENTIFIED_NAMESPACE")]
    pub allow_unidentified_namespace: bool,
    /// Serve Prometheus metrics (`/metrics`), `/healthz` and `/readyz` over HTTP on this
    /// address, e.g. 127.0.0.1:9477.
    #[arg(long, env = "FENCED_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
}
