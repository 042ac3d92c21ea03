//! The store and device steps of leaving, after quiescence, and why a leave is
//! incomplete ([`LeaveFailure`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvme_resv::{Cptpl, Key, Register, RegisterAction};

use super::blocking;
use crate::fencer::Device;
use crate::node::NodeId;
use crate::ports::LeaveStore;
use crate::store::StoreError;

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

/// The etcd and device steps of leaving, after quiescence: return our arenas,
/// unregister our key, write the departure marker. `Err`: why the leave is incomplete.
pub(super) async fn leave_steps<S: LeaveStore>(
    store: S,
    node: NodeId,
    instance: String,
    membership_rev: i64,
    device: Option<(Device, Key)>,
    deadline: Instant,
) -> Result<(), LeaveFailure> {
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
    if let Some((device, key)) = device {
        let r = blocking(move || {
            device.register(&Register {
                rrega: RegisterAction::Unregister,
                crkey: key,
                nrkey: Key(0),
                iekey: false,
                cptpl: Cptpl::NoChange,
            })
        })
        .await;
        if let Err(e) = r {
            tracing::warn!(node = %node, error = %e, "unregistering our key failed");
        }
    }
    // A retried departure whose earlier attempt timed out may have been applied by
    // etcd: then the retry is refused although we departed. Say so rather than guess.
    let lost_answer = std::sync::atomic::AtomicBool::new(false);
    let departed = retry_unreachable(&node, "departure transaction", deadline, || {
        let attempt = store.depart(&node, &instance, membership_rev);
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

/// The leave's decisions against the in-memory store: logic only (a real leave is
/// `tests/fencing.rs`, `tests/cli.rs`, `tests/partition.rs`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::mem::MemStore;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn a_leave_returns_its_arenas_then_departs() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.give_arena(&n("n1"), "a1");
        store.give_arena(&n("n1"), "a2");
        leave_steps(store.clone(), n("n1"), "i-1".into(), rev, None, soon())
            .await
            .unwrap();
        let s = store.state();
        assert!(s.free.contains("a1") && s.free.contains("a2"));
        assert!(!s.members.contains_key(&n("n1")));
        assert_eq!(s.departed.get(&n("n1")).map(|d| d.0.as_str()), Some("i-1"));
    }

    #[tokio::test]
    async fn an_arena_that_cannot_be_returned_stops_the_leave_before_the_marker() {
        let store = MemStore::new();
        let rev = store.join(&n("n1"), "i-1");
        store.give_arena(&n("n1"), "a1");
        // Our lease expired while leaving: a fence may be under way that read a1 as
        // ours; returning it now would let another node take it under live writes.
        store.expire(&n("n1"));
        let e = leave_steps(store.clone(), n("n1"), "i-1".into(), rev, None, soon())
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
        let e = leave_steps(store.clone(), n("n1"), "i-1".into(), rev, None, soon())
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
        let e = leave_steps(store.clone(), n("n1"), "i-1".into(), rev, None, soon())
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
        leave_steps(store.clone(), n("n1"), "i-1".into(), rev, None, soon())
            .await
            .unwrap();
        assert!(store.state().departed.contains_key(&n("n1")));

        let rev = store.join(&n("n2"), "i-2");
        store.fail_next("owned_arenas", 100);
        let e = leave_steps(
            store.clone(),
            n("n2"),
            "i-2".into(),
            rev,
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
