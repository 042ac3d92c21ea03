//! Leaving: the agent's leave loop ([`Agent::leave`]: quiesce, then the steps while
//! the self-fence margin keeps running), the store and device steps of leaving, and
//! why a leave is incomplete ([`LeaveFailure`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::io::Write;

use nvme_resv::Key;

use super::{Agent, AgentExit, blocking};
use crate::core::{Watchdog, WatchdogVerdict};
use crate::device::{Device, unregister_checked};
use crate::node::NodeId;
use crate::ports::LeaveStore;
use crate::store::{BootRecord, StoreError};

/// Why a leave is incomplete (no departure marker was written, or it may have been).
#[derive(Debug, thiserror::Error)]
pub(super) enum LeaveFailure {
    /// An etcd step failed for a reason other than an unreachable etcd, or kept
    /// failing until the leave deadline.
    #[error("{what} failed after {attempts} attempt(s): {source}")]
    Store {
        what: &'static str,
        attempts: u32,
        source: StoreError,
    },
    /// Our reservation key could not be removed (or is still registered after the
    /// unregister): this host may still write, so no arena is returned and no
    /// departure is announced; peers fence the node as usual.
    #[error(
        "our reservation key {key:#x} is not unregistered ({why}): this host may still write, so no arena is returned and no departure is announced"
    )]
    StillRegistered { key: u64, why: String },
    /// An arena we owned was taken over (our membership is no longer the owner's).
    #[error("arena {arena} is not ours any more")]
    ArenaNotOurs { arena: String },
    /// The departure transaction was refused: our membership is not live.
    #[error(
        "membership no longer live: departure refused{}",
        if *answer_lost { " (an earlier attempt's answer was lost, so it may have been applied)" } else { "" }
    )]
    DepartureRefused {
        /// An earlier attempt timed out, so it may have been applied.
        answer_lost: bool,
    },
}

/// Runs `op` until it succeeds, fails for a reason other than an unreachable etcd, or
/// `deadline` passes. `Err` is the reason the leave is incomplete.
async fn retry_unreachable<T, F, Fut>(
    node: &NodeId,
    what: &'static str,
    deadline: Instant,
    mut op: F,
) -> Result<T, LeaveFailure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                if attempts == 1 {
                    tracing::warn!(step = "depart", node = %node, error = %e, "{what}: etcd unreachable while leaving, retrying");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(source) => {
                return Err(LeaveFailure::Store {
                    what,
                    attempts,
                    source,
                });
            }
        }
    }
}

/// Unregisters our key and checks, with a report, that it is gone: from then on the
/// device refuses every write of this host (Write Exclusive - All Registrants).
async fn unregister(device: Device, key: Key) -> Result<(), LeaveFailure> {
    let r = blocking(move || unregister_checked(&device, key)).await;
    match r {
        Ok(false) => Ok(()),
        Ok(true) => Err(LeaveFailure::StillRegistered {
            key: key.0,
            why: "the report still lists it after the unregister".into(),
        }),
        Err(e) => Err(LeaveFailure::StillRegistered {
            key: key.0,
            why: format!("the device refused: {e}"),
        }),
    }
}

/// The etcd and device steps of leaving, after quiescence: unregister our key (so
/// this host can no longer write), return our arenas, write the departure marker.
/// `Err`: why the leave is incomplete.
///
/// The key goes first: an application on this host that ignored the quiesce (another
/// process) could otherwise still write into an arena already handed to another node.
/// Without a device (`--fencer none`, EBS) there is nothing to unregister and the
/// quiesce is all this host can do.
pub(super) async fn leave_steps<S: LeaveStore>(
    store: S,
    node: NodeId,
    instance: String,
    membership_rev: i64,
    device: Option<(Device, Key)>,
    boot: Option<BootRecord>,
    deadline: Instant,
) -> Result<(), LeaveFailure> {
    if let Some((device, key)) = device {
        unregister(device, key).await?;
        tracing::info!(step = "unregister", node = %node, key = format_args!("{:#x}", key.0), "reservation key unregistered: this host can no longer write");
    }
    let owned = retry_unreachable(&node, "reading our arenas", deadline, || {
        store.owned_arenas(&node)
    })
    .await?;
    for arena in &owned {
        let returned = retry_unreachable(&node, "returning an arena", deadline, || {
            store.release_arena(&node, membership_rev, arena)
        })
        .await?;
        if !returned {
            return Err(LeaveFailure::ArenaNotOurs {
                arena: arena.clone(),
            });
        }
        tracing::info!(step = "release_own_arenas", node = %node, arena = %arena, "arena returned");
    }
    // A retried departure whose earlier attempt timed out may have been applied by
    // etcd: then the retry is refused although we departed. Say so rather than guess.
    let lost_answer = std::sync::atomic::AtomicBool::new(false);
    let departed = retry_unreachable(&node, "departure transaction", deadline, || {
        let attempt = store.depart(&node, &instance, membership_rev, boot.as_ref());
        let lost = &lost_answer;
        async move {
            let r = attempt.await;
            if r.as_ref().is_err_and(StoreError::is_retryable) {
                lost.store(true, Ordering::SeqCst);
            }
            r
        }
    })
    .await?;
    if departed {
        Ok(())
    } else {
        Err(LeaveFailure::DepartureRefused {
            answer_lost: lost_answer.load(Ordering::SeqCst),
        })
    }
}

impl Agent {
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
    pub(super) async fn leave(
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

/// The leave's decisions against the in-memory store: logic only (a real leave is
/// `tests/fencing.rs`, `tests/cli.rs`, `tests/partition.rs`).
#[cfg(test)]
mod tests {
    use nvme_resv::{Register, RegisterAction};

    use super::*;
    use crate::device::key_registered;
    use crate::ports::mem::MemStore;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// [`leave_steps`] of `node`, joined as `instance` at `rev`, with 5 s to go.
    pub(super) async fn leave(
        store: &MemStore,
        node: &str,
        instance: &str,
        rev: i64,
        device: Option<(Device, Key)>,
        boot: Option<BootRecord>,
    ) -> Result<(), LeaveFailure> {
        leave_steps(
            store.clone(),
            n(node),
            instance.into(),
            rev,
            device,
            boot,
            soon(),
        )
        .await
    }

    /// The leave's boot record (`by: leave`) is written with the departure, and not
    /// when the departure is refused (an expired node re-allows nothing).
    #[tokio::test]
    async fn the_leave_record_is_written_only_with_the_departure() {
        let rec = BootRecord {
            boot_id: "b1".into(),
            generation: 0,
            by: BootRecord::BY_LEAVE.into(),
        };
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        leave(&store, "n1", "i-1", rev, None, Some(rec.clone()))
            .await
            .unwrap();
        assert_eq!(store.state().boots.get(&n("n1")), Some(&rec));

        let rev = store.join(&n("n2"), "i-2");
        store.expire(&n("n2"));
        let e = leave(&store, "n2", "i-2", rev, None, Some(rec))
            .await
            .unwrap_err();
        assert!(matches!(e, LeaveFailure::DepartureRefused { .. }), "{e:?}");
        assert!(!store.state().boots.contains_key(&n("n2")));
    }

    #[tokio::test]
    async fn a_leave_returns_its_arenas_then_departs() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.give_arena(&n("n1"), "a1");
        store.give_arena(&n("n1"), "a2");
        leave(&store, "n1", "i-1", rev, None, None).await.unwrap();
        let s = store.state();
        assert!(s.free.contains("a1") && s.free.contains("a2"));
        assert!(!s.members.contains_key(&n("n1")));
        assert_eq!(s.departed.get(&n("n1")).map(|d| d.0.as_str()), Some("i-1"));
    }

    /// A device that records, at our unregister, whether any arena was already back in
    /// the free pool.
    #[derive(Debug)]
    struct Spy {
        host: nvme_resv::model::Host,
        store: MemStore,
        free_at_unregister: std::sync::Mutex<Option<bool>>,
    }

    impl nvme_resv::Reservations for Spy {
        fn register(&self, cmd: &Register) -> nvme_resv::Result<()> {
            if cmd.rrega == RegisterAction::Unregister {
                *self.free_at_unregister.lock().unwrap() =
                    Some(!self.store.state().free.is_empty());
            }
            self.host.register(cmd)
        }
        fn acquire(&self, cmd: &nvme_resv::Acquire) -> nvme_resv::Result<()> {
            self.host.acquire(cmd)
        }
        fn release(&self, cmd: &nvme_resv::Release) -> nvme_resv::Result<()> {
            self.host.release(cmd)
        }
        fn report(&self) -> nvme_resv::Result<nvme_resv::ReservationStatus> {
            self.host.report()
        }
    }

    fn registered_host(key: Key) -> nvme_resv::model::Host {
        use nvme_resv::Reservations;
        let host = nvme_resv::model::Namespace::new().host(nvme_resv::HostId([1; 16]));
        host.register(&Register::register(key)).unwrap();
        host
    }

    #[tokio::test]
    async fn the_key_is_unregistered_before_any_arena_is_returned() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.give_arena(&n("n1"), "a1");
        let key = Key(0x11);
        let spy = std::sync::Arc::new(Spy {
            host: registered_host(key),
            store: store.clone(),
            free_at_unregister: std::sync::Mutex::new(None),
        });
        let device: Device = spy.clone();
        leave(&store, "n1", "i-1", rev, Some((device, key)), None)
            .await
            .unwrap();
        assert_eq!(
            *spy.free_at_unregister.lock().unwrap(),
            Some(false),
            "an arena was returned while this host could still write"
        );
        assert!(!key_registered(&spy.host.namespace().snapshot(), key));
        let s = store.state();
        assert!(s.free.contains("a1") && s.departed.contains_key(&n("n1")));
    }

    #[tokio::test]
    async fn a_failed_unregister_returns_nothing_and_announces_no_departure() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.give_arena(&n("n1"), "a1");
        let key = Key(0x11);
        let host = registered_host(key);
        host.namespace().fail_next(
            nvme_resv::Operation::Register,
            nvme_resv::NvmeStatus::INTERNAL,
        );
        let device: Device = std::sync::Arc::new(host.clone());
        let e = leave(&store, "n1", "i-1", rev, Some((device, key)), None)
            .await
            .unwrap_err();
        assert!(
            matches!(e, LeaveFailure::StillRegistered { key: 0x11, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("no departure is announced"), "{e}");
        assert!(key_registered(&host.namespace().snapshot(), key));
        let s = store.state();
        assert!(s.free.is_empty(), "an arena was returned");
        assert!(s.departed.is_empty(), "a departure was announced");
        assert!(s.members.contains_key(&n("n1")));
    }

    #[tokio::test]
    async fn an_arena_that_cannot_be_returned_stops_the_leave_before_the_marker() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.give_arena(&n("n1"), "a1");
        // Our lease expired while leaving: a fence may be under way that read a1 as
        // ours; returning it now would let another node take it under live writes.
        store.expire(&n("n1"));
        let e = leave(&store, "n1", "i-1", rev, None, None)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LeaveFailure::ArenaNotOurs { arena } if arena == "a1"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "arena a1 is not ours any more");
        let s = store.state();
        assert!(s.departed.is_empty() && !s.free.contains("a1"));
    }

    #[tokio::test]
    async fn an_expired_membership_cannot_depart() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.expire(&n("n1"));
        let e = leave(&store, "n1", "i-1", rev, None, None)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "membership no longer live: departure refused"
        );
        assert!(store.state().departed.is_empty());
    }

    #[tokio::test]
    async fn a_refusal_after_a_lost_answer_says_it_may_have_been_applied() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.expire(&n("n1"));
        // The first attempt's answer is lost (unreachable); the retry is refused.
        store.fail_next("depart", 1);
        let e = leave(&store, "n1", "i-1", rev, None, None)
            .await
            .unwrap_err();
        assert!(
            matches!(e, LeaveFailure::DepartureRefused { answer_lost: true }),
            "{e:?}"
        );
        assert!(e.to_string().contains("may have been applied"));
    }

    #[tokio::test]
    async fn an_unreachable_store_is_retried_until_the_deadline() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.fail_next("depart", 2);
        leave(&store, "n1", "i-1", rev, None, None).await.unwrap();
        assert!(store.state().departed.contains_key(&n("n1")));

        let rev = store.join(&n("n2"), "i-2");
        store.fail_next("owned_arenas", 100);
        let e = leave_steps(
            store.clone(),
            n("n2"),
            "i-2".into(),
            rev,
            None,
            None,
            Instant::now(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                e,
                LeaveFailure::Store {
                    what: "reading our arenas",
                    attempts: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(store.state().members.contains_key(&n("n2")));
    }
}
