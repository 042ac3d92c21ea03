//! Issue 27 (DESIGN.md invariant 9): the target lost every registration and the
//! reservation (a power loss or restart without Persist Through Power Loss, an NVMe-oF
//! target fail-over). Every host may write then — a fenced host's application too —
//! and every live agent finds its key gone. The rules, checked first by the protocol
//! model (`fenced/tests/protocol_model/target_reset.rs`):
//!
//! - [`missing_key`]: a key that is gone is a lost state, not a preempt, when the
//!   device holds no registrant and no reservation, or when its reservation generation
//!   is not above the one this agent last saw with its key registered. A preempt always
//!   leaves the preempter registered with a reservation held, and raises the
//!   generation; a lost state restarts it (the kernel target at 0). A device that keeps
//!   counting across a power loss makes a later agent see a preempt: it self-fences
//!   (an outage, never a split brain).
//! - [`recover`]: after a lost state, an agent registers its key again (and acquires
//!   the reservation if none is held, shutting out every unregistered host, the fenced
//!   one included) only when its membership is still live (the lease it joined with,
//!   read linearizably), its generation is the one it joined with, and its lease has
//!   time left for the device commands (else it waits for the next check): the check and the registration then land
//!   before the lease can expire, hence before any controller may start a fence of it
//!   (a controller fences only a node whose membership is gone). A fenced node never
//!   qualifies: its membership is gone and its generation moved.
//! - [`after_register`]: should the registration complete with less than that time
//!   left, the agent unregisters and self-fences: the registration may have landed
//!   after a fence began.
//!
//! The model's broken variants show why each condition is there: without the
//! generation check a fenced node's hung daemon registers again; with the check and
//! the registration unbounded apart, a fence completes between them.

use std::time::Duration;

/// What a missing key means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingKey {
    /// The device lost its reservation state since this agent last saw its key.
    LostState,
    /// Someone preempted the key (a fence, or an operator): never register again.
    Preempted,
}

/// What the device check saw with our key gone: the report's reservation generation,
/// its number of registrants, whether a reservation is held; and the generation this
/// agent last saw in a report that listed its key (`None`: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyGoneReport {
    /// Reservation generation now.
    pub generation: u32,
    /// Registrants now.
    pub registrants: usize,
    /// A reservation is held now.
    pub reservation_held: bool,
    /// The generation of the last report that listed our key.
    pub last_seen_with_key: Option<u32>,
}

/// Classifies a missing key; see the module doc.
pub fn missing_key(r: &KeyGoneReport) -> MissingKey {
    let empty = r.registrants == 0 && !r.reservation_held;
    // Removing our key takes a register, a preempt or a clear, and each raises the
    // generation: not above the last one seen with our key means it started again.
    let restarted = r.last_seen_with_key.is_some_and(|g| r.generation <= g);
    if empty || restarted {
        MissingKey::LostState
    } else {
        MissingKey::Preempted
    }
}

/// The etcd side and the clock, read after the device check saw a lost state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryFacts {
    /// Our membership key still carries the lease we joined with (linearizable read).
    pub member_live: bool,
    /// Our generation now (linearizable read; `None`: absent).
    pub generation_now: Option<u64>,
    /// The generation read at `join`.
    pub generation_joined: u64,
    /// Time left before the self-fence margin (the watchdog's verdict).
    pub lease_left: Duration,
    /// The time the registration and the acquire may take (the device check's
    /// budget): less than this left, and the agent does not start them.
    pub needed: Duration,
}

/// What to do about a lost state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Register our key again (with CPTPL where the device can persist) and acquire
    /// the reservation if none is held.
    Register,
    /// Not now: too little of the lease is left for the device commands. Nothing is
    /// wrong with us; the next device check (after the next renewal) decides again.
    Wait(String),
    /// Do not register: self-fence with this reason.
    SelfFence(String),
}

/// Decides whether this agent may register its key again after a lost state.
pub fn recover(f: &RecoveryFacts) -> Recovery {
    if !f.member_live {
        return Recovery::SelfFence(
            "the device lost its reservation state and our membership is gone: not registering again"
                .into(),
        );
    }
    match f.generation_now {
        Some(g) if g == f.generation_joined => {}
        Some(g) => {
            return Recovery::SelfFence(format!(
                "the device lost its reservation state and our generation moved from {} to {g} (we were fenced): not registering again",
                f.generation_joined
            ));
        }
        None => {
            return Recovery::SelfFence(
                "the device lost its reservation state and our generation record is gone: not registering again"
                    .into(),
            );
        }
    }
    if f.lease_left < f.needed {
        return Recovery::Wait(format!(
            "our lease has {:?} left, less than the {:?} a registration may take: registering at the next device check",
            f.lease_left, f.needed
        ));
    }
    Recovery::Register
}

/// After the registration: `lease_left` is the time left when it completed (`None`:
/// the margin passed). Whether the registration stands; if not, the agent unregisters
/// its key and self-fences.
pub fn after_register(lease_left: Option<Duration>) -> bool {
    lease_left.is_some_and(|d| d > Duration::ZERO)
}

/// What the device reports about Persist Through Power Loss, for the start-up warning
/// and `fenced check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Registrations and the reservation survive a power loss (PTPL state on).
    On,
    /// The device can persist (RESCAP bit 0) but the state is off: registering with
    /// CPTPL 11b turns it on.
    Available,
    /// The device cannot persist (RESCAP bit 0 clear): a target restart drops every
    /// registration and the reservation.
    Unsupported,
    /// The device can persist, its current state could not be read.
    Unknown,
}

impl Persistence {
    /// From RESCAP bit 0 and the Reservation Persistence feature (Get Features 83h;
    /// `None`: not read or refused).
    pub fn from_device(capable: bool, state: Option<bool>) -> Self {
        match (capable, state) {
            (_, Some(true)) => Self::On,
            (false, _) => Self::Unsupported,
            (true, Some(false)) => Self::Available,
            (true, None) => Self::Unknown,
        }
    }

    /// One line for `fenced check`, `status` and the start-up log.
    pub fn describe(self) -> &'static str {
        match self {
            Self::On => {
                "persist through power loss: on (registrations, the reservation and every fence survive a target restart)"
            }
            Self::Available => {
                "persist through power loss: supported, off until fenced registers with CPTPL"
            }
            Self::Unsupported => {
                "persist through power loss: NOT supported: a target restart or power loss drops every registration and the reservation; fenced detects it and re-registers live members (invariant 9), every host may write until then"
            }
            Self::Unknown => {
                "persist through power loss: supported, current state unknown (Get Features 83h failed)"
            }
        }
    }

    /// Whether to warn about it (at start and in `fenced check`).
    pub fn warn(self) -> bool {
        matches!(self, Self::Unsupported | Self::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(generation: u32, registrants: usize, held: bool, last: Option<u32>) -> KeyGoneReport {
        KeyGoneReport {
            generation,
            registrants,
            reservation_held: held,
            last_seen_with_key: last,
        }
    }

    #[test]
    fn missing_key_tells_a_lost_state_from_a_preempt() {
        use MissingKey::*;
        // The first agent to look after nvmet's namespace came back: empty, gen 0.
        assert_eq!(missing_key(&report(0, 0, false, Some(7))), LostState);
        // Empty even with a higher generation (a device that keeps counting, a clear).
        assert_eq!(missing_key(&report(9, 0, false, Some(7))), LostState);
        // A later agent: the first one registered and acquired again (gen 1).
        assert_eq!(missing_key(&report(1, 1, true, Some(7))), LostState);
        // Equal is a restart too: taking our key away would have raised it.
        assert_eq!(missing_key(&report(7, 1, true, Some(7))), LostState);
        // A preempt: the preempter registered, a reservation held, generation up.
        assert_eq!(missing_key(&report(8, 1, true, Some(7))), Preempted);
        // A preempt of a key never seen (the agent has no earlier report): a preempt.
        assert_eq!(missing_key(&report(1, 1, true, None)), Preempted);
        // Registrants left but no reservation, generation up: a preempt with no
        // reservation held (issue 26's case) is still a preempt.
        assert_eq!(missing_key(&report(8, 2, false, Some(7))), Preempted);
    }

    fn facts(live: bool, now: Option<u64>, left_ms: u64) -> RecoveryFacts {
        RecoveryFacts {
            member_live: live,
            generation_now: now,
            generation_joined: 3,
            lease_left: Duration::from_millis(left_ms),
            needed: Duration::from_millis(1000),
        }
    }

    #[test]
    fn only_a_live_unchanged_member_with_time_left_registers_again() {
        assert_eq!(recover(&facts(true, Some(3), 5000)), Recovery::Register);
        let refused = [
            (facts(false, Some(3), 5000), "membership is gone"),
            (facts(true, Some(4), 5000), "moved from 3 to 4"),
            (facts(true, None, 5000), "generation record is gone"),
        ];
        for (f, why) in refused {
            match recover(&f) {
                Recovery::SelfFence(r) => assert!(r.contains(why), "{r}"),
                other => panic!("{other:?}: {f:?}"),
            }
        }
        // Too little lease left: not now, and no self-fence either.
        match recover(&facts(true, Some(3), 999)) {
            Recovery::Wait(r) => assert!(r.contains("less than"), "{r}"),
            other => panic!("{other:?}"),
        }
        // A fenced node with its lease still running locally is refused all the same.
        assert!(matches!(
            recover(&facts(false, Some(4), 5000)),
            Recovery::SelfFence(_)
        ));
    }

    #[test]
    fn persistence_from_rescap_and_the_feature() {
        use Persistence::*;
        assert_eq!(Persistence::from_device(true, Some(true)), On);
        assert_eq!(Persistence::from_device(true, Some(false)), Available);
        assert_eq!(Persistence::from_device(true, None), Unknown);
        // The kernel target: RESCAP bit 0 clear, the feature reads 0.
        assert_eq!(Persistence::from_device(false, Some(false)), Unsupported);
        assert_eq!(Persistence::from_device(false, None), Unsupported);
        assert!(Unsupported.warn() && Unknown.warn() && !On.warn() && !Available.warn());
        assert!(Unsupported.describe().contains("NOT supported"));
    }

    #[test]
    fn a_registration_completed_past_the_margin_is_undone() {
        assert!(after_register(Some(Duration::from_millis(1))));
        assert!(!after_register(Some(Duration::ZERO)));
        assert!(!after_register(None));
    }
}
