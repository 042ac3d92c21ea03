//! The agent's loop: keep the lease verdict (the self-fencing clock), pet the
//! watchdog, watch our membership and conflict notices, check the device off the
//! loop ([`device_check`](super::device_check)), until leave or self-fence.

use std::io::Write;
use std::time::{Duration, Instant};

use super::device_check::{self, DeviceCheck};
use super::{Agent, AgentExit, on_fence, own_membership};
use crate::core::{DeviceHealth, DeviceVerdict, Watchdog, WatchdogVerdict};

impl Agent {
    pub(super) fn pet(&mut self) {
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

    pub(super) fn self_fence(&mut self, reason: String) -> AgentExit {
        self.gate.fence();
        // Stop petting the hardware watchdog (never magic-close it): the host reboots.
        self.watchdog = None;
        tracing::error!(step = "self_fence", node = %self.cfg.node, reason = %reason, "SELF-FENCED: all I/O stopped");
        AgentExit::SelfFenced { reason }
    }

    /// Keeps the lease alive, checks the device, and self-fences when needed, until
    /// `leave` completes (SIGTERM / `fenced leave`), then leaves. After a self-fence
    /// it runs the on-fence action ([`AgentConfig::on_fence`](super::AgentConfig::on_fence)) before returning.
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
        // Off this loop: a hung device never holds up the lease verdict (see
        // `device_check`).
        let mut check = DeviceCheck::default();
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
                    let health = check.health();
                    self.cfg.observer.device_stalled(match health {
                        DeviceHealth::Stalled { for_ } => Some(for_),
                        DeviceHealth::Answering => None,
                    });
                    if let DeviceHealth::Stalled { for_ } = health {
                        tracing::warn!(node = %self.cfg.node, unanswered = ?for_, "the shared device has not answered a reservation report for {:.0}s (a hung path or target): not self-fencing on it, the lease decides", for_.as_secs_f64());
                    }
                    check.start(self.device.as_ref(), self.own_key);
                }
                verdict = check.finished(), if check.in_flight() => {
                    self.cfg.observer.device_stalled(None);
                    if matches!(verdict, Ok(DeviceVerdict::LostState)) {
                        // Issue 27: register again, or self-fence (agent/lost_state.rs).
                        if let Err(reason) = self.recover_lost_state(&watchdog).await {
                            return self.self_fence(reason);
                        }
                    } else if let Some(reason) = device_check::on_verdict(&self.cfg.node, self.own_key, verdict) {
                        return self.self_fence(reason);
                    }
                }
            }
        }
    }
}
