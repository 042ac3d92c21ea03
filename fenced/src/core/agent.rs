//! The agent's decisions: the self-fencing clock ([`Watchdog`], fed by
//! [`lease_reading`]) and the device check ([`check_device`]).

use std::time::{Duration, Instant};

/// The agent's self-fencing clock: when the lease has not been renewed for `margin`
/// (2 × TTL by default), or etcd said the lease is gone, the agent must stop all I/O.
#[derive(Debug, Clone)]
pub struct Watchdog {
    margin: Duration,
    last_renewed: Instant,
    expired: bool,
}

/// The watchdog's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchdogVerdict {
    /// Renewed recently enough.
    Healthy {
        /// Time left before self-fencing.
        left: Duration,
    },
    /// Self-fence now.
    SelfFence {
        /// Time since the last renewal.
        since_renewal: Duration,
        /// Whether etcd reported the lease expired (`lease_expired`).
        lease_expired: bool,
    },
}

impl Watchdog {
    /// A watchdog that considers the lease renewed at `now`.
    pub fn new(margin: Duration, now: Instant) -> Self {
        Self {
            margin,
            last_renewed: now,
            expired: false,
        }
    }

    /// A keepalive response arrived at `now` with the lease's remaining `ttl_secs`.
    pub fn on_keepalive(&mut self, ttl_secs: i64, now: Instant) {
        if ttl_secs <= 0 {
            self.expired = true;
        } else if !self.expired {
            self.last_renewed = now;
        }
    }

    /// The verdict at `now`. Once self-fencing, always self-fencing.
    pub fn verdict(&self, now: Instant) -> WatchdogVerdict {
        let since = now.saturating_duration_since(self.last_renewed);
        if self.expired || since >= self.margin {
            WatchdogVerdict::SelfFence {
                since_renewal: since,
                lease_expired: self.expired,
            }
        } else {
            WatchdogVerdict::Healthy {
                left: self.margin - since,
            }
        }
    }
}

/// What etcd's answer to "how long has this lease left" tells the self-fencing clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseReading {
    /// etcd said the lease has no time left (`left <= 0`): it is gone, self-fence.
    Expired,
    /// The lease was renewed no earlier than `at` and had `left` whole seconds left.
    RenewedNoEarlierThan {
        /// The earliest the renewal can have happened.
        at: Instant,
        /// Seconds left when etcd answered.
        left: i64,
    },
    /// The renewal time is before anything this process's monotonic clock can name:
    /// nothing learned.
    Unknown,
}

/// Reads etcd's answer `left` (whole seconds remaining of a lease whose TTL is `ttl`),
/// given at or after `asked`. etcd rounds down to whole seconds, so the lease was
/// renewed no earlier than `asked - (ttl - left) - 1 s`: the watchdog counts from
/// there, never from a later instant than the truth.
pub fn lease_reading(ttl: Duration, left: i64, asked: Instant) -> LeaseReading {
    if left <= 0 {
        return LeaseReading::Expired;
    }
    let age = ttl.saturating_sub(Duration::from_secs(left.unsigned_abs())) + Duration::from_secs(1);
    match asked.checked_sub(age) {
        Some(at) => LeaseReading::RenewedNoEarlierThan { at, left },
        None => LeaseReading::Unknown,
    }
}

/// A device command unanswered this long is reported as a stalled device (health
/// and metrics). Above a multipath path fail-over's usual queueing (`queue_if_no_path`
/// holds commands for tens of seconds while a path comes back), so a fail-over that
/// completes is not reported.
pub const DEVICE_STALL: Duration = Duration::from_secs(30);

/// What the agent makes of a device command in flight for `in_flight` (`None`: none).
///
/// The rule: a device that does not answer is reported (`Stalled`), never a reason to
/// self-fence on its own, and never waited on. The agent's device commands run off its
/// loop, so the lease verdict, the membership watch and the watchdog go on meanwhile:
/// if the lease is lost the agent self-fences on time whatever the device does. A hung
/// path stalls this host's writes as it stalls the report, so no write of ours lands
/// while it hangs; a peer's preempt (and abort) takes effect on the target whatever our
/// path does, and a write that reaches it afterwards is refused there. Self-fencing on a
/// stall alone would turn every path fail-over into an outage of this node.
pub fn device_health(in_flight: Option<Duration>) -> DeviceHealth {
    match in_flight {
        Some(d) if d >= DEVICE_STALL => DeviceHealth::Stalled { for_: d },
        _ => DeviceHealth::Answering,
    }
}

/// See [`device_health`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceHealth {
    /// No command in flight, or one in flight for less than [`DEVICE_STALL`].
    Answering,
    /// A command has been unanswered for `for_`.
    Stalled {
        /// How long.
        for_: Duration,
    },
}

/// What the agent's periodic device check concludes from a reservation report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceVerdict {
    /// Our key is registered and a reservation is held.
    Ok,
    /// Our key is registered but no reservation is held (e.g. the holder left):
    /// acquire the reservation (Write Exclusive - All Registrants).
    Acquire,
    /// Our key is not registered although this daemon registered it: we were
    /// preempted. Never re-register: self-fence.
    Preempted,
    /// Our key is not registered because the device lost its reservation state (a
    /// target restart without persistence: [`missing_key`](super::missing_key)):
    /// register again only as [`recover`](super::recover) allows, else self-fence.
    LostState,
}

/// Decides from `registered` (is our key in the report) and `reservation_held`.
pub fn check_device(registered: bool, reservation_held: bool) -> DeviceVerdict {
    match (registered, reservation_held) {
        (false, _) => DeviceVerdict::Preempted,
        (true, false) => DeviceVerdict::Acquire,
        (true, true) => DeviceVerdict::Ok,
    }
}
