//! Issue 27 (invariant 9): the device check found our key gone with the device's
//! reservation state (a target restart without persistence), not preempted. Whether we
//! register again is [`crate::core::recover`]'s rule, checked first by the protocol
//! model (`fenced/tests/protocol_model/target_reset.rs`): our membership still the
//! one we joined with, our generation unchanged (both read from etcd now), and time
//! left on the lease for the device commands; then register (with CPTPL where the
//! device can persist) and acquire if no reservation is held, which shuts every
//! unregistered host out again, the fenced one included. A registration that completed
//! past that time is undone ([`crate::core::after_register`]).

use std::time::{Duration, Instant};

use super::{Agent, blocking};
use crate::core::{Recovery, RecoveryFacts, Watchdog, WatchdogVerdict, after_register, recover};
use crate::device::{key_registered, register_and_hold, unregister_checked};

impl Agent {
    /// Time left on our lease now, as the watchdog counts it (from the earliest the
    /// last renewal can have been): the margin left less the part of the margin that
    /// lies past the TTL. Zero once self-fencing.
    fn lease_left(&self, watchdog: &Watchdog) -> Duration {
        match watchdog.verdict(Instant::now()) {
            WatchdogVerdict::Healthy { left } => {
                left.saturating_sub(self.cfg.self_fence_margin.saturating_sub(self.cfg.ttl))
            }
            WatchdogVerdict::SelfFence { .. } => Duration::ZERO,
        }
    }

    /// The registration and the acquire must complete with this much of the lease
    /// left: a quarter of the TTL (the keepalive renews every third of it, and the
    /// watchdog counts from up to a second before each renewal).
    fn recovery_budget(&self) -> Duration {
        self.cfg.ttl / 4
    }

    /// Registers our key again after a lost state, or says why not (`Err`: self-fence
    /// with that reason). An etcd or device error leaves things as they are: the next
    /// device check finds the same state and tries again, the lease decides meanwhile.
    pub(super) async fn recover_lost_state(&mut self, watchdog: &Watchdog) -> Result<(), String> {
        let node = self.cfg.node.clone();
        let key = self.own_key;
        let Some(device) = self.device.clone() else {
            return Ok(());
        };
        tracing::error!(step = "lost_state", node = %node, key = format_args!("{:#x}", key.0), "the shared device lost its reservation state (no persistence: a target restart or power loss): our key is gone and every host may write; checking our membership and generation before registering again");
        let read = async {
            let live = self
                .store
                .is_member(&node, self.joined.membership_rev)
                .await?;
            let (generation, _) = self.store.generation(&node).await?;
            Ok::<_, crate::store::StoreError>((live, generation))
        };
        let (member_live, generation_now) = match read.await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(step = "lost_state", node = %node, error = %e, "cannot read our membership and generation: not registering again yet (next device check retries)");
                return Ok(());
            }
        };
        let facts = RecoveryFacts {
            member_live,
            generation_now: Some(generation_now),
            generation_joined: self.joined.generation,
            lease_left: self.lease_left(watchdog),
            needed: self.recovery_budget(),
        };
        match recover(&facts) {
            Recovery::Register => {}
            Recovery::Wait(why) => {
                tracing::warn!(step = "lost_state", node = %node, "not registering again yet: {why}");
                return Ok(());
            }
            Recovery::SelfFence(reason) => {
                self.cfg.observer.lost_state(false);
                return Err(reason);
            }
        }
        let cptpl = self.cfg.cptpl;
        let registered = blocking(move || {
            let was = key_registered(&device.report()?, key);
            register_and_hold(&device, key, was, cptpl)
        })
        .await;
        let held = match registered {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(step = "lost_state", node = %node, error = %e, "registering our key again failed (next device check retries)");
                return Ok(());
            }
        };
        let left = self.lease_left(watchdog);
        if !after_register(Some(left).filter(|d| !d.is_zero())) {
            let device = self.device.clone();
            if let Some(device) = device {
                let _ = blocking(move || unregister_checked(&device, key)).await;
            }
            self.cfg.observer.lost_state(false);
            return Err("the device lost its reservation state; our registration completed after our lease ran out: unregistered it again".into());
        }
        self.cfg.observer.lost_state(true);
        tracing::error!(step = "lost_state", node = %node, key = format_args!("{:#x}", key.0), generation = self.joined.generation, rtype = held.0, lease_left = ?left, "the shared device lost its reservation state: registered our key again (a live member, generation unchanged) and a reservation is held: every unregistered host, any fenced one included, is refused again");
        Ok(())
    }
}
