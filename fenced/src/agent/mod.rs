//! The node agent (one per host that writes the shared namespace): join on a lease,
//! unfence safely, keep the lease alive, self-fence, claim arenas, leave cleanly.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use nvme_resv::{Acquire, AcquireAction, Cptpl, Key, Register, RegisterAction, ReservationType};
use tokio::sync::Notify;

use crate::core::{
    DeviceHealth, DeviceVerdict, Watchdog, WatchdogVerdict, check_device, device_health,
};
use crate::fencer::{Device, RESERVATION_TYPE, key_registered};
use crate::guard::GenerationGuard;
use crate::node::NodeId;
use crate::store::{BootRecord, EtcdStore, Joined, RestartState, StoreError};

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
        }
    }
}

pub mod boot;
pub mod identity;
mod keepalive;
mod leave;
pub mod on_fence;
mod own_membership;

pub use boot::{BOOT_ID_FILE, FencedSameBoot, KeyRemovedSameBoot, read_boot_id};
pub use on_fence::{OnFence, OnFenceConfig, OnFenceOutcome, check_reboot};

use keepalive::spawn_keepalive;
use leave::leave_steps;

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
    /// `join` + `read_own_generation` + `unfence` + `claim_arena`.
    ///
    /// `own_key` is this node's reservation key (`nvme_resv::key_for_node`).
    pub async fn start(
        store: EtcdStore,
        cfg: AgentConfig,
        device: Option<Device>,
        own_key: Key,
    ) -> Result<Self, AgentError> {
        let watchdog = match &cfg.watchdog_device {
            Some(p) => Some(File::options().write(true).open(p).map_err(|source| {
                AgentError::Watchdog {
                    path: p.clone(),
                    source,
                }
            })?),
            None => None,
        };
        // Before any write: a node fenced since its last join does not come back on
        // the same boot.
        let mut seen = Self::check_restart(&store, &cfg).await?;
        if let Some(ours) = &cfg.namespace {
            identity::check_namespace(&store, &cfg.node, ours).await?;
        }
        let lease = store.grant(cfg.ttl).await?;
        let granted_at = Instant::now();
        let (keepalive, renewals) = spawn_keepalive(
            store.clone(),
            cfg.node.clone(),
            lease,
            cfg.ttl,
            cfg.self_fence_margin,
        );
        let t0 = Instant::now();
        let joined = loop {
            if let Some(j) = store
                .join(
                    &cfg.node,
                    &cfg.instance,
                    lease,
                    &seen,
                    cfg.boot_id.as_deref(),
                )
                .await?
            {
                break j;
            }
            if t0.elapsed() > cfg.join_timeout {
                keepalive.abort();
                let _ = store.revoke(lease).await;
                return Err(AgentError::JoinRefused {
                    node: cfg.node.clone(),
                    waited: t0.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            // The join is conditioned on the generation we checked: read and check again.
            seen = match Self::check_restart(&store, &cfg).await {
                Ok(s) => s,
                Err(e) => {
                    keepalive.abort();
                    let _ = store.revoke(lease).await;
                    return Err(e);
                }
            };
        };
        tracing::info!(step = "join", node = %cfg.node, instance = %cfg.instance, lease, membership_rev = joined.membership_rev, "joined membership");
        tracing::info!(step = "read_own_generation", node = %cfg.node, generation = joined.generation, "generation read");
        let mut agent = Self {
            store,
            cfg,
            device,
            own_key,
            gate: IoGate::default(),
            joined,
            previous_boot: seen.boot,
            registered_it: false,
            lease,
            arenas: Vec::new(),
            watchdog,
            granted_at,
            renewals,
            keepalive,
        };
        let started = match agent.unfence().await {
            Ok(()) => agent.claim_arenas().await,
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            // Issue 26, hole 4: a start that fails after the register (membership lost
            // before the arenas were adopted, a device error after the register) must
            // not leave the key on the device: the node is not a member, its
            // generation may already be bumped, and the next start on this boot is
            // refused, so nothing else would remove it.
            agent.unregister_after_failed_start(&e).await;
            return Err(e);
        }
        Ok(agent)
    }

    /// After a failed start: if our key is registered, unregister it and check with a
    /// report that it is gone; logs an error when it cannot be removed.
    async fn unregister_after_failed_start(&self, why: &AgentError) {
        let Some(device) = self.device.clone() else {
            return;
        };
        let key = self.own_key;
        let r = blocking(move || -> nvme_resv::Result<Option<bool>> {
            if !key_registered(&device.report()?, key) {
                return Ok(None);
            }
            device.register(&Register {
                rrega: RegisterAction::Unregister,
                crkey: key,
                nrkey: Key(0),
                iekey: false,
                cptpl: Cptpl::NoChange,
            })?;
            Ok(Some(key_registered(&device.report()?, key)))
        })
        .await;
        let node = &self.cfg.node;
        let key = format_args!("{:#x}", key.0);
        match r {
            Ok(None) => {}
            Ok(Some(false)) => {
                tracing::warn!(step = "unregister", node = %node, key = key, cause = %why, "start failed after the key was registered: key unregistered (checked gone)")
            }
            Ok(Some(true)) => {
                tracing::error!(step = "unregister", node = %node, key = key, cause = %why, "start failed after the key was registered, and the report still lists the key after the unregister: remove it (`nvme-resv register DEVICE --rrega unregister --crkey KEY`) or reboot the host")
            }
            Err(e) => {
                tracing::error!(step = "unregister", node = %node, key = key, cause = %why, error = %e, "start failed after the key was registered, and unregistering it failed: remove it (`nvme-resv register DEVICE --rrega unregister --crkey KEY`) or reboot the host")
            }
        }
    }

    /// The restart rule ([`boot`]): reads the node's boot record and generation (one
    /// read, no write) and refuses with [`AgentError::FencedSameBoot`] when it was
    /// fenced since its last join from this same boot. The daemon calls it before any
    /// etcd write of its own; [`Agent::start`] calls it again.
    pub async fn check_restart(
        store: &EtcdStore,
        cfg: &AgentConfig,
    ) -> Result<RestartState, AgentError> {
        let seen = store.restart_state(&cfg.node).await?;
        if let Some(boot_id) = &cfg.boot_id {
            boot::check_restart(&cfg.node, &seen, boot_id)?;
        }
        Ok(seen)
    }

    async fn unfence(&mut self) -> Result<(), AgentError> {
        let Some(device) = self.device.clone() else {
            return Ok(());
        };
        // Only with live membership, after reading our generation (both done by join).
        if !self
            .store
            .is_member(&self.cfg.node, self.joined.membership_rev)
            .await?
        {
            return Err(AgentError::JoinRefused {
                node: self.cfg.node.clone(),
                waited: Duration::ZERO,
            });
        }
        let key = self.own_key;
        let node = self.cfg.node.clone();
        let boot_id = self.cfg.boot_id.clone();
        let previous = self.previous_boot.clone();
        let (registered_before, held) = blocking(move || -> Result<_, AgentError> {
            let before = dev("unfence", device.report())?;
            let was = key_registered(&before, key);
            if let Some(boot_id) = &boot_id {
                boot::check_register(&node, previous.as_ref(), boot_id, was)?;
            }
            if !was {
                dev(
                    "unfence",
                    device.register(&Register {
                        rrega: RegisterAction::Register,
                        crkey: Key(0),
                        nrkey: key,
                        iekey: false,
                        cptpl: Cptpl::NoChange,
                    }),
                )?;
            }
            let now = dev("unfence", device.report())?;
            if now.rtype == ReservationType::NONE {
                let r = device.acquire(&Acquire {
                    racqa: AcquireAction::Acquire,
                    rtype: RESERVATION_TYPE,
                    crkey: key,
                    prkey: Key(0),
                    iekey: false,
                });
                // A peer may have acquired between our report and our acquire.
                if let Err(e) = r {
                    let again = dev("unfence", device.report())?;
                    if again.rtype == ReservationType::NONE {
                        return Err(AgentError::Device {
                            step: "unfence",
                            source: e,
                        });
                    }
                }
            }
            let after = dev("unfence", device.report())?;
            Ok((was, after.rtype))
        })
        .await?;
        self.registered_it = !registered_before;
        tracing::info!(step = "unfence", node = %self.cfg.node, key = format_args!("{:#x}", key.0), already_registered = registered_before, rtype = held.0, "registered on the device");
        Ok(())
    }

    async fn claim_arenas(&mut self) -> Result<(), AgentError> {
        self.arenas = self
            .store
            .adopt_arenas(&self.cfg.node, self.joined.membership_rev)
            .await?
            .ok_or_else(|| AgentError::LostMembership {
                node: self.cfg.node.clone(),
            })?;
        if self.arenas.len() >= self.cfg.arenas {
            return Ok(());
        }
        for arena in self.store.free_arenas().await? {
            if self.arenas.len() >= self.cfg.arenas {
                break;
            }
            if self
                .store
                .claim_arena(&self.cfg.node, self.joined.membership_rev, &arena)
                .await?
            {
                tracing::info!(step = "claim_arena", node = %self.cfg.node, arena = %arena, "arena claimed");
                self.arenas.push(arena);
            }
        }
        if self.arenas.len() < self.cfg.arenas {
            tracing::warn!(node = %self.cfg.node, wanted = self.cfg.arenas, got = self.arenas.len(), "free pool exhausted");
        }
        Ok(())
    }

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

    fn pet(&mut self) {
        if let Some(w) = &mut self.watchdog {
            let _ = w.write_all(b"\0");
        }
    }

    fn observe(&self, now: Instant, verdict: WatchdogVerdict) {
        let margin = self.cfg.self_fence_margin;
        let (age, left) = match verdict {
            WatchdogVerdict::Healthy { left } => (margin.saturating_sub(left), left),
            WatchdogVerdict::SelfFence { since_renewal, .. } => (since_renewal, Duration::ZERO),
        };
        let keepalive_running = !self.keepalive.is_finished();
        self.cfg
            .observer
            .agent_tick(now, age, left, self.cfg.ttl, keepalive_running);
    }

    fn self_fence(&mut self, reason: String) -> AgentExit {
        self.gate.fence();
        // Stop petting the hardware watchdog (never magic-close it): the host reboots.
        self.watchdog = None;
        tracing::error!(step = "self_fence", node = %self.cfg.node, reason = %reason, "SELF-FENCED: all I/O stopped");
        AgentExit::SelfFenced { reason }
    }

    /// Keeps the lease alive, checks the device, and self-fences when needed, until
    /// `leave` completes (SIGTERM / `fenced leave`), then leaves. After a self-fence
    /// it runs the on-fence action ([`AgentConfig::on_fence`]) before returning.
    pub async fn run(self, leave: impl std::future::Future<Output = ()>) -> AgentExit {
        let on_fence = self.cfg.on_fence.clone();
        let node = self.cfg.node.clone();
        let generation = self.joined.generation;
        let exit = self.run_until_exit(leave).await;
        if let AgentExit::SelfFenced { reason } = &exit {
            on_fence::on_fence(&on_fence, &node, generation, reason).await;
        }
        exit
    }

    async fn run_until_exit(mut self, leave: impl std::future::Future<Output = ()>) -> AgentExit {
        let mut watchdog = Watchdog::new(self.cfg.self_fence_margin, self.granted_at);
        let mut renewals = self.renewals.clone();
        let mut tick_wd = tokio::time::interval(Duration::from_millis(100));
        let mut tick_dev = tokio::time::interval(self.cfg.device_check_interval);
        // The device check in flight and when it started: it runs off this loop, so a
        // hung device never holds up the lease verdict, the membership watch, conflict
        // notices or the watchdog pet (core::device_health).
        let mut check: Option<(
            tokio::task::JoinHandle<nvme_resv::Result<DeviceVerdict>>,
            Instant,
        )> = None;
        let conflict = self.gate.conflict.clone();
        let lost = own_membership::lost(
            self.store.clone(),
            self.cfg.node.clone(),
            self.joined.membership_rev,
        );
        tokio::pin!(leave, lost);
        loop {
            tokio::select! {
                _ = &mut leave => return self.leave(watchdog, renewals).await,
                reason = &mut lost => return self.self_fence(reason),
                _ = conflict.notified() => {
                    return self.self_fence("a write failed with a reservation conflict: this node was fenced".into());
                }
                changed = renewals.changed() => {
                    if changed.is_ok() {
                        let (at, left) = *renewals.borrow_and_update();
                        watchdog.on_keepalive(left, at);
                    }
                }
                _ = tick_wd.tick() => {
                    let now = Instant::now();
                    let verdict = watchdog.verdict(now);
                    self.observe(now, verdict);
                    match verdict {
                        WatchdogVerdict::Healthy { .. } => self.pet(),
                        WatchdogVerdict::SelfFence { since_renewal, lease_expired } => {
                            return self.self_fence(format!(
                                "lease not renewed for {since_renewal:?} (margin {:?}, lease expired: {lease_expired})",
                                self.cfg.self_fence_margin
                            ));
                        }
                    }
                }
                _ = tick_dev.tick() => {
                    let in_flight = check.as_ref().map(|(_, t0)| t0.elapsed());
                    let health = device_health(in_flight);
                    self.cfg.observer.device_stalled(match health {
                        DeviceHealth::Stalled { for_ } => Some(for_),
                        DeviceHealth::Answering => None,
                    });
                    if let DeviceHealth::Stalled { for_ } = health {
                        tracing::warn!(node = %self.cfg.node, unanswered = ?for_, "the shared device has not answered a reservation report for {:.0}s (a hung path or target): not self-fencing on it, the lease decides", for_.as_secs_f64());
                    }
                    if check.is_none()
                        && let Some(device) = self.device.clone()
                    {
                        let key = self.own_key;
                        let task = tokio::task::spawn_blocking(move || -> nvme_resv::Result<DeviceVerdict> {
                            let r = device.report()?;
                            let v = check_device(key_registered(&r, key), r.rtype != ReservationType::NONE);
                            if v == DeviceVerdict::Acquire {
                                device.acquire(&Acquire {
                                    racqa: AcquireAction::Acquire,
                                    rtype: RESERVATION_TYPE,
                                    crkey: key,
                                    prkey: Key(0),
                                    iekey: false,
                                })?;
                            }
                            Ok(v)
                        });
                        check = Some((task, Instant::now()));
                    }
                }
                done = async { (&mut check.as_mut().expect("guarded by is_some").0).await }, if check.is_some() => {
                    check = None;
                    self.cfg.observer.device_stalled(None);
                    let verdict = match done {
                        Ok(v) => v,
                        Err(e) => std::panic::resume_unwind(e.into_panic()),
                    };
                    match verdict {
                        Ok(DeviceVerdict::Preempted) => {
                            // Never re-register: only a fresh start that rejoins may.
                            return self.self_fence(format!(
                                "our reservation key {:#x} was preempted", self.own_key.0
                            ));
                        }
                        Ok(DeviceVerdict::Acquire) => tracing::info!(node = %self.cfg.node, "no reservation held: acquired Write Exclusive - All Registrants"),
                        Ok(DeviceVerdict::Ok) => {}
                        Err(e) => tracing::warn!(node = %self.cfg.node, error = %e, "reservation report failed"),
                    }
                }
            }
        }
    }

    /// The boot record a clean leave writes with its departure: `by: leave`, letting
    /// the next start on this boot register our key again. Only when this instance
    /// registered the key itself: one that found it registered (an earlier instance's,
    /// whose application may still run) leaves the join's record, so the next start on
    /// this boot is refused registration (the once-per-boot rule) until a reboot or
    /// `fenced unfence`.
    fn leave_record(&self) -> Option<BootRecord> {
        match &self.cfg.boot_id {
            Some(boot_id) if self.registered_it => Some(BootRecord {
                boot_id: boot_id.clone(),
                generation: self.joined.generation,
                by: BootRecord::BY_LEAVE.to_owned(),
            }),
            _ => None,
        }
    }

    /// `quiesce` → `release_own_arenas` → `depart`.
    ///
    /// etcd requests that fail because etcd is unreachable are retried until
    /// `leave_timeout`, and the self-fence margin keeps running meanwhile: a leave stuck
    /// behind a partition self-fences at the margin like a running agent (gate fenced,
    /// watchdog no longer petted), then keeps trying to finish. When the link comes back
    /// the departure transaction decides: it succeeds only if our membership survived
    /// (our keepalives reached etcd though their answers did not), and after expiry it is
    /// refused (invariant 4) and logged.
    async fn leave(
        mut self,
        mut watchdog: Watchdog,
        mut renewals: tokio::sync::watch::Receiver<(Instant, i64)>,
    ) -> AgentExit {
        let node = self.cfg.node.clone();
        self.gate.quiesce();
        tracing::info!(step = "quiesce", node = %node, "I/O stopped, leaving");
        let steps = leave_steps(
            self.store.clone(),
            node.clone(),
            self.cfg.instance.clone(),
            self.joined.membership_rev,
            self.device.clone().map(|d| (d, self.own_key)),
            self.leave_record(),
            Instant::now() + self.cfg.leave_timeout,
        );
        tokio::pin!(steps);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut self_fenced: Option<String> = None;
        let outcome = loop {
            tokio::select! {
                r = &mut steps => break r,
                changed = renewals.changed(), if self_fenced.is_none() => {
                    if changed.is_ok() {
                        let (at, left) = *renewals.borrow_and_update();
                        watchdog.on_keepalive(left, at);
                    }
                }
                _ = tick.tick(), if self_fenced.is_none() => {
                    match watchdog.verdict(Instant::now()) {
                        WatchdogVerdict::Healthy { .. } => self.pet(),
                        WatchdogVerdict::SelfFence { since_renewal, lease_expired } => {
                            let reason = format!(
                                "lease not renewed for {since_renewal:?} while leaving (margin {:?}, lease expired: {lease_expired})",
                                self.cfg.self_fence_margin
                            );
                            let _ = self.self_fence(reason.clone());
                            self_fenced = Some(reason);
                        }
                    }
                }
            }
        };
        match (outcome, self_fenced) {
            (Ok(()), None) => {
                let _ = self.store.revoke(self.lease).await;
                if let Some(w) = &mut self.watchdog {
                    let _ = w.write_all(b"V"); // magic close: disarm
                }
                tracing::info!(step = "depart", node = %node, "departed: marker written, membership deleted");
                AgentExit::Left
            }
            (Ok(()), Some(reason)) => {
                // Our membership outlived our view of it: the departure is recorded, but
                // we already stopped I/O and the watchdog as a self-fenced node.
                let _ = self.store.revoke(self.lease).await;
                tracing::warn!(step = "depart", node = %node, "departed after self-fencing: marker written, membership deleted");
                AgentExit::SelfFenced { reason }
            }
            (Err(why), None) => self.leave_incomplete(why.to_string()),
            (Err(why), Some(reason)) => {
                let _ = self.leave_incomplete(why.to_string());
                AgentExit::SelfFenced { reason }
            }
        }
    }

    fn leave_incomplete(&mut self, reason: String) -> AgentExit {
        self.gate.fence();
        tracing::error!(step = "depart", node = %self.cfg.node, reason = %reason, "leave incomplete: no departure marker, peers will fence this node");
        AgentExit::LeaveIncomplete { reason }
    }
}
