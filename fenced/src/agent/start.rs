//! Starting the agent: the restart rule, the namespace check, the join, the unfence
//! plan on the device (register, then hold the reservation), adopting and claiming
//! arenas; and undoing the register when a start fails after it.

use std::fs::File;
use std::time::{Duration, Instant};

use nvme_resv::Key;

use super::keepalive::spawn_keepalive;
use super::{Agent, AgentConfig, AgentError, IoGate, blocking, boot, dev, identity};
use crate::device::{Device, key_registered, register_and_hold, unregister_checked};
use crate::ports::JoinStore;
use crate::store::{EtcdStore, Joined, RestartState};

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
        let seen = Self::check_restart(&store, &cfg).await?;
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
        let (joined, seen) =
            Self::join_membership(&store, &cfg, lease, seen, || keepalive.abort()).await?;
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
            unregister_checked(&device, key).map(Some)
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
    pub async fn check_restart<S: JoinStore>(
        store: &S,
        cfg: &AgentConfig,
    ) -> Result<RestartState, AgentError> {
        let seen = store.restart_state(&cfg.node).await?;
        if let Some(boot_id) = &cfg.boot_id {
            boot::check_restart(&cfg.node, &seen, boot_id)?;
        }
        Ok(seen)
    }

    /// The join on `lease`, retried every 250 ms while it is refused (a fence claim on
    /// us, our previous membership not expired yet, our generation moved), reading and
    /// checking the restart rule again before each retry (the join is conditioned on
    /// the generation `seen` read). Past [`AgentConfig::join_timeout`], or when the
    /// check refuses, it calls `stop_renewing`, revokes `lease` and fails. Returns the
    /// join and the restart state it was conditioned on.
    pub async fn join_membership<S: JoinStore>(
        store: &S,
        cfg: &AgentConfig,
        lease: i64,
        mut seen: RestartState,
        stop_renewing: impl FnOnce(),
    ) -> Result<(Joined, RestartState), AgentError> {
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
                stop_renewing();
                let _ = store.revoke(lease).await;
                return Err(AgentError::JoinRefused {
                    node: cfg.node.clone(),
                    waited: t0.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            // The join is conditioned on the generation we checked: read and check again.
            seen = match Self::check_restart(store, cfg).await {
                Ok(s) => s,
                Err(e) => {
                    stop_renewing();
                    let _ = store.revoke(lease).await;
                    return Err(e);
                }
            };
        };
        Ok((joined, seen))
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
        let cptpl = self.cfg.cptpl;
        let (registered_before, held) = blocking(move || -> Result<_, AgentError> {
            let before = dev("unfence", device.report())?;
            let was = key_registered(&before, key);
            if let Some(boot_id) = &boot_id {
                boot::check_register(&node, previous.as_ref(), boot_id, was)?;
            }
            // A peer may acquire between our report and our acquire: fine.
            let held = dev("unfence", register_and_hold(&device, key, was, cptpl))?;
            Ok((was, held))
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
}
