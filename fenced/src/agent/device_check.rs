//! The agent's device check, run off its loop: every `device_check_interval` a
//! reservation report is read on a blocking task (and the reservation acquired when
//! none is held), so a hung device never holds up the lease verdict, the membership
//! watch, conflict notices or the watchdog pet ([`crate::core::device_health`]).

use std::time::Instant;

use nvme_resv::{Acquire, AcquireAction, Key, ReservationType};
use tokio::task::JoinHandle;

use crate::core::{DeviceHealth, DeviceVerdict, check_device, device_health};
use crate::device::{Device, RESERVATION_TYPE, key_registered};
use crate::node::NodeId;

/// The device check in flight, if any, and when it started.
#[derive(Debug, Default)]
pub(super) struct DeviceCheck {
    in_flight: Option<(JoinHandle<nvme_resv::Result<DeviceVerdict>>, Instant)>,
}

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
        let task = tokio::task::spawn_blocking(move || check_once(&device, key));
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
            Ok(v) => v,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// One check: read the report; acquire the reservation when none is held.
fn check_once(device: &Device, key: Key) -> nvme_resv::Result<DeviceVerdict> {
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
        Ok(DeviceVerdict::Ok) => None,
        Err(e) => {
            tracing::warn!(node = %node, error = %e, "reservation report failed");
            None
        }
    }
}
