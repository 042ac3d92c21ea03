//! The node agent (one per host that writes the shared namespace): join on a lease,
//! unfence safely, keep the lease alive, self-fence, claim arenas, leave cleanly.
//!
//! One job per file: `start` (the restart rule, join, the unfence plan, arenas),
//! `run` (the loop and the self-fence), `device_check` (the device check off the
//! loop), `leave` (the leave loop and its steps), `keepalive`, `own_membership`,
//! [`boot`] (the restart and once-per-boot rules), [`identity`] (the namespace record
//! at join), [`on_fence`]; here the settings, the [`IoGate`], the errors and the
//! [`Agent`] handle.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use nvme_resv::Key;
use tokio::sync::Notify;

use crate::device::Device;
use crate::guard::GenerationGuard;
use crate::node::NodeId;
use crate::store::{BootRecord, EtcdStore, Joined, StoreError};

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Our node id.
    pub node: NodeId,
    /// Our instance id (membership value).
    pub instance: String,
    /// Membership lease TTL (default 5 s).
    pub ttl: Duration,
    /// Self-fence when the lease was not renewed for this long (default 2 × TTL).
    pub self_fence_margin: Duration,
    /// Arenas to claim after joining.
    pub arenas: usize,
    /// How often the device's reservation report is checked.
    pub device_check_interval: Duration,
    /// Arm this watchdog device (e.g. `/dev/watchdog`): petted while healthy; a
    /// self-fence stops petting it, so the host reboots.
    pub watchdog_device: Option<PathBuf>,
    /// How long to keep retrying a join refused because a fence claim is held on us
    /// or our previous membership has not expired yet.
    pub join_timeout: Duration,
    /// How long leaving keeps retrying etcd requests that failed because etcd was
    /// unreachable (a partition, an election). The self-fence margin still applies
    /// while leaving: a leave that cannot reach etcd self-fences like a running agent.
    pub leave_timeout: Duration,
    /// This boot of the host (`/proc/sys/kernel/random/boot_id`, see [`boot`]). The
    /// join records it; a start on the same boot after a fence since the last join is
    /// refused ([`AgentError::FencedSameBoot`]). `None`: neither recorded nor checked
    /// (library tests that run several "hosts" in one process); the daemon always
    /// sets it.
    pub boot_id: Option<String>,
    /// What to do to the rest of the host when this agent self-fences.
    pub on_fence: OnFenceConfig,
    /// Our device's namespace identity: recorded as the shared namespace at the first
    /// join, compared at every later join (a different namespace is refused before
    /// anything is registered). `None`: no check (no reservation device).
    pub namespace: Option<nvme_resv::NamespaceIdentity>,
    /// Where each tick of the self-fencing clock is reported (lease age, margin left,
    /// keepalive task alive: metrics, `/readyz`, the systemd watchdog).
    pub observer: crate::metrics::Observer,
    /// The CPTPL every registration of our key carries: `Persist` where the device
    /// reports Persist Through Power Loss (`Capabilities::register_cptpl`), so a
    /// target restart keeps the registrations, the reservation and every fence.
    pub cptpl: nvme_resv::Cptpl,
}

impl AgentConfig {
    /// Defaults: TTL 5 s, margin 2 × TTL, no arenas, device check every second, leave
    /// retries for 20 s.
    pub fn new(node: NodeId, instance: impl Into<String>) -> Self {
        let ttl = Duration::from_secs(5);
        Self {
            node,
            instance: instance.into(),
            ttl,
            self_fence_margin: 2 * ttl,
            arenas: 0,
            device_check_interval: Duration::from_secs(1),
            watchdog_device: None,
            join_timeout: Duration::from_secs(30),
            leave_timeout: Duration::from_secs(20),
            boot_id: None,
            on_fence: OnFenceConfig::default(),
            namespace: None,
            observer: crate::metrics::Observer::default(),
            cptpl: nvme_resv::Cptpl::NoChange,
        }
    }
}

pub mod boot;
mod device_check;
pub mod identity;
mod keepalive;
mod leave;
mod lost_state;
pub mod on_fence;
mod own_membership;
mod run;
mod start;

pub use boot::{BOOT_ID_FILE, FencedSameBoot, KeyRemovedSameBoot, read_boot_id};
pub use on_fence::{OnFence, OnFenceConfig, OnFenceOutcome, check_reboot};

const GATE_OPEN: u8 = 0;
const GATE_QUIESCED: u8 = 1;
const GATE_FENCED: u8 = 2;

/// The I/O gate the storage side consults before every write: open, quiesced
/// (leaving) or fenced. A writer that gets `ReservationConflict` reports it here.
#[derive(Debug, Clone, Default)]
pub struct IoGate {
    state: Arc<AtomicU8>,
    conflict: Arc<Notify>,
}

impl IoGate {
    /// Writes may be issued.
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::SeqCst) == GATE_OPEN
    }
    /// The node self-fenced: no write may be issued again by this process.
    pub fn is_fenced(&self) -> bool {
        self.state.load(Ordering::SeqCst) == GATE_FENCED
    }
    fn quiesce(&self) {
        let _ = self.state.compare_exchange(
            GATE_OPEN,
            GATE_QUIESCED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
    fn fence(&self) {
        self.state.store(GATE_FENCED, Ordering::SeqCst);
    }
    /// A write failed with a reservation conflict: this node was fenced. The agent
    /// self-fences (it never re-registers its key).
    pub fn report_conflict(&self) {
        self.fence();
        self.conflict.notify_one();
    }
}

/// Why the agent stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentExit {
    /// Left cleanly: quiesced, arenas returned, departure marker written.
    Left,
    /// Leaving failed part-way (no departure marker): peers will fence us.
    LeaveIncomplete {
        /// What failed.
        reason: String,
    },
    /// Self-fenced: I/O stopped; the process must exit non-zero.
    SelfFenced {
        /// Why.
        reason: String,
    },
}

/// Errors starting the agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// etcd failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The join was refused for longer than the join timeout.
    #[error(
        "join refused for {waited:?}: a fence of {node} is in progress or its previous membership has not expired"
    )]
    JoinRefused {
        /// Our node.
        node: NodeId,
        /// How long we tried.
        waited: Duration,
    },
    /// The device refused a reservation command.
    #[error("unfence on the device failed during {step}: {source}")]
    Device {
        /// `unfence` sub-step.
        step: &'static str,
        /// The device error.
        #[source]
        source: nvme_resv::Error,
    },
    /// The watchdog device could not be opened.
    #[error("cannot arm watchdog {path}: {source}")]
    Watchdog {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Our device is not the namespace recorded as the cluster's shared one.
    #[error(
        "{node} refuses to join: its device is not the cluster's shared namespace (recorded at {key}: {recorded}; this node's device: {ours}); nothing was registered. Point --block-device at the shared namespace (/dev/disk/by-id/ names do not move between boots)"
    )]
    WrongNamespace {
        /// Our node.
        node: NodeId,
        /// The record's key.
        key: String,
        /// The recorded namespace.
        recorded: Box<nvme_resv::NamespaceIdentity>,
        /// Our device's.
        ours: Box<nvme_resv::NamespaceIdentity>,
    },
    /// Our membership was gone before we adopted our arenas: peers will fence us, so
    /// we must not start I/O.
    #[error("membership of {node} lost during start-up (lease expired): not adopting arenas")]
    LostMembership {
        /// Our node.
        node: NodeId,
    },
    /// Fenced since the last join and the host has not rebooted: not registering.
    /// Nothing was written to etcd and no device command was sent.
    #[error(transparent)]
    FencedSameBoot(#[from] FencedSameBoot),
    /// Joined, but our key is gone from the device and an earlier daemon on this boot
    /// registered it (the once-per-boot rule): not registering. Nothing was sent to
    /// the device; our membership expires and the node is fenced as usual.
    #[error(transparent)]
    KeyRemovedSameBoot(#[from] KeyRemovedSameBoot),
}

/// A running node agent.
pub struct Agent {
    store: EtcdStore,
    cfg: AgentConfig,
    device: Option<Device>,
    own_key: Key,
    gate: IoGate,
    joined: Joined,
    /// `boot/<node>` as read before our join rewrote it (the once-per-boot rule).
    previous_boot: Option<BootRecord>,
    /// We registered our key ourselves at `unfence` (it was not on the device): a clean
    /// leave then records `by: leave`, letting the next start on this boot register.
    registered_it: bool,
    lease: i64,
    arenas: Vec<String>,
    watchdog: Option<File>,
    granted_at: Instant,
    renewals: tokio::sync::watch::Receiver<(Instant, i64)>,
    keepalive: tokio::task::JoinHandle<()>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        // A dead agent renews nothing: its lease expires and peers fence it.
        self.keepalive.abort();
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.cfg.node)
            .field("lease", &self.lease)
            .field("joined", &self.joined)
            .field("arenas", &self.arenas)
            .finish_non_exhaustive()
    }
}

fn dev<T>(step: &'static str, r: nvme_resv::Result<T>) -> Result<T, AgentError> {
    r.map_err(|source| AgentError::Device { step, source })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

impl Agent {
    /// Our node id.
    pub fn node(&self) -> &NodeId {
        &self.cfg.node
    }

    /// The I/O gate.
    pub fn gate(&self) -> IoGate {
        self.gate.clone()
    }

    /// Our generation when we joined.
    pub fn generation(&self) -> u64 {
        self.joined.generation
    }

    /// Our membership's `create_revision`.
    pub fn membership_rev(&self) -> i64 {
        self.joined.membership_rev
    }

    /// Our membership lease.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// The arenas we own.
    pub fn arenas(&self) -> &[String] {
        &self.arenas
    }

    /// The generation guard for our metadata transactions.
    pub fn guard(&self) -> GenerationGuard {
        GenerationGuard::new(self.store.keys(), &self.cfg.node, self.joined.generation)
    }
}
