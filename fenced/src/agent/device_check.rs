//! The agent's device check, run off its loop: every `device_check_interval` a
//! reservation report is read on a blocking task (and the reservation acquired when
//! none is held), so a hung device never holds up the lease verdict, the membership
//! watch, conflict notices or the watchdog pet ([`crate::core::device_health`]).

use std::time::Instant;

use nvme_resv::{Key, ReservationType};
use tokio::task::JoinHandle;

use crate::core::{
    DeviceHealth, DeviceVerdict, KeyGoneReport, MissingKey, check_device, device_health,
    missing_key,
};
use crate::device::{Device, hold_if_none, key_registered};
use crate::node::NodeId;

/// The device check in flight, if any, and when it started.
#[derive(Debug, Default)]
pub(super) struct DeviceCheck {
    in_flight: Option<(JoinHandle<Checked>, Instant)>,
    /// The reservation generation of the last report that listed our key (issue 27: a
    /// missing key at a generation not above it was lost with the device's state).
    /// One check runs at a time, so it is handed to the check and updated from its end.
    last_seen: Option<u32>,
}

/// What one check returns: the generation of its report when that listed our key, and
/// the verdict.
type Checked = (Option<u32>, nvme_resv::Result<DeviceVerdict>);

impl DeviceCheck {
    /// Whether the device answers: stalled when a check has been in flight too long.
    pub(super) fn health(&self) -> DeviceHealth {
        device_health(self.in_flight.as_ref().map(|(_, t0)| t0.elapsed()))
    }

    /// Whether a check is in flight.
    pub(super) fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Starts a check of `key` on `device` unless one is in flight.
    pub(super) fn start(&mut self, device: Option<&Device>, key: Key) {
        if self.in_flight.is_some() {
            return;
        }
        let Some(device) = device.cloned() else {
            return;
        };
        let last_seen = self.last_seen;
        let task = tokio::task::spawn_blocking(move || check_once(&device, key, last_seen));
        self.in_flight = Some((task, Instant::now()));
    }

    /// The verdict of the check in flight, when it ends (never, when none is in
    /// flight). Cancel-safe: dropped before the end, the check stays in flight.
    pub(super) async fn finished(&mut self) -> nvme_resv::Result<DeviceVerdict> {
        let Some((task, _)) = self.in_flight.as_mut() else {
            return std::future::pending().await;
        };
        let done = task.await;
        self.in_flight = None;
        match done {
            Ok((seen, v)) => {
                self.last_seen = seen.or(self.last_seen);
                v
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// One check: read the report; acquire the reservation when none is held; tell a
/// lost state from a preempt when our key is gone. Returns the report's generation
/// when it listed our key, beside the verdict.
fn check_once(device: &Device, key: Key, last_seen: Option<u32>) -> Checked {
    let r = match device.report() {
        Ok(r) => r,
        Err(e) => return (None, Err(e)),
    };
    let registered = key_registered(&r, key);
    let seen = registered.then_some(r.generation);
    let mut v = check_device(registered, r.rtype != ReservationType::NONE);
    if v == DeviceVerdict::Preempted {
        let gone = KeyGoneReport {
            generation: r.generation,
            registrants: r.registrants.len(),
            reservation_held: r.rtype != ReservationType::NONE,
            last_seen_with_key: last_seen,
        };
        if missing_key(&gone) == MissingKey::LostState {
            v = DeviceVerdict::LostState;
        }
    }
    if v == DeviceVerdict::Acquire
        && let Err(e) = hold_if_none(device, key, r.rtype)
    {
        return (seen, Err(e));
    }
    (seen, Ok(v))
}

/// What a finished check means for the loop: `Some(reason)` to self-fence.
pub(super) fn on_verdict(
    node: &NodeId,
    key: Key,
    verdict: nvme_resv::Result<DeviceVerdict>,
) -> Option<String> {
    match verdict {
        // Never re-register: only a fresh start that rejoins may.
        Ok(DeviceVerdict::Preempted) => {
            Some(format!("our reservation key {:#x} was preempted", key.0))
        }
        Ok(DeviceVerdict::Acquire) => {
            tracing::info!(node = %node, "no reservation held: acquired Write Exclusive - All Registrants");
            None
        }
        // Handled by the loop first (`Agent::recover_lost_state`).
        Ok(DeviceVerdict::Ok | DeviceVerdict::LostState) => None,
        Err(e) => {
            tracing::warn!(node = %node, error = %e, "reservation report failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nvme_resv::model::{Host, Namespace};
    use nvme_resv::{
        Acquire, HostId, NvmeStatus, Operation, Register, Release, ReservationStatus, Reservations,
    };

    use super::*;
    use crate::device::RESERVATION_TYPE;

    /// Our host on the model, whose acquire a peer beats: the peer acquires first, then
    /// ours is refused.
    #[derive(Debug)]
    struct PeerFirst {
        ours: Host,
        peer: Host,
    }

    impl Reservations for PeerFirst {
        fn register(&self, cmd: &Register) -> nvme_resv::Result<()> {
            self.ours.register(cmd)
        }
        fn acquire(&self, cmd: &Acquire) -> nvme_resv::Result<()> {
            self.peer.acquire(&Acquire {
                crkey: Key(2),
                ..*cmd
            })?;
            self.ours
                .namespace()
                .fail_next(Operation::Acquire, NvmeStatus::RESERVATION_CONFLICT);
            self.ours.acquire(cmd)
        }
        fn release(&self, cmd: &Release) -> nvme_resv::Result<()> {
            self.ours.release(cmd)
        }
        fn report(&self) -> nvme_resv::Result<ReservationStatus> {
            self.ours.report()
        }
    }

    fn registered(host: &Host, key: Key) {
        host.register(&Register::register(key)).unwrap();
    }

    #[test]
    fn a_check_whose_acquire_a_peer_beats_is_no_error() {
        let ns = Namespace::new();
        let (ours, peer) = (ns.host(HostId([1; 16])), ns.host(HostId([2; 16])));
        registered(&ours, Key(1));
        registered(&peer, Key(2));
        let device: Device = Arc::new(PeerFirst { ours, peer });
        let v = check_once(&device, Key(1), None).1.unwrap();
        assert_eq!(v, DeviceVerdict::Acquire);
        assert_eq!(ns.snapshot().rtype, RESERVATION_TYPE);
    }

    #[test]
    fn a_check_whose_acquire_fails_with_nothing_held_reports_the_error() {
        let ns = Namespace::new();
        let ours = ns.host(HostId([1; 16]));
        registered(&ours, Key(1));
        ns.fail_next(Operation::Acquire, NvmeStatus::INTERNAL);
        let device: Device = Arc::new(ours);
        assert!(check_once(&device, Key(1), None).1.is_err());
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
    }
}
