//! Issue 27 (invariant 9): the target loses all reservation state (a power loss or
//! restart of a target without Persist Through Power Loss, an NVMe-oF fail-over). Every
//! registrant and the reservation vanish at once: every host may write, the fenced
//! host's application too, and every live agent finds its key gone.
//!
//! What an agent sees, and how it tells this from a preempt: a preempt always leaves
//! the preempter registered, a reservation held, and the reservation generation one
//! higher than before; a lost state leaves no registrant and no reservation, and the
//! generation starts again (nvmet: 0). So "my key is gone and the generation is not
//! above the one I last saw with my key present" means the state was lost since I last
//! looked (the first agent to look also finds the device empty; a later one finds the
//! first one's registration, at a lower generation). The model abstracts the generation
//! to `reset_epoch` (counted by [`Action::TargetLostState`]) against the epoch each
//! agent last saw (`seen_epoch`, set when it registers).
//!
//! The rule ([`TargetReset::Recover`]): a running agent whose key is gone after a lost
//! state re-registers its key, and acquires the reservation if none is held, only if
//! its membership is live (same lease) and its generation is the one it joined with,
//! read linearizably — and the check and the registration are one step: the agent
//! does both within its lease (it starts only with the self-fence margin not reached
//! and, should the register complete after it, unregisters and self-fences). A
//! controller fences a node only after its membership is gone, so a live, unchanged
//! member was not fenced; a fenced node (membership lost, generation bumped) never
//! registers again. Anything else self-fences as before.
//!
//! Properties: the window (a lost state with no reservation held yet) is where every
//! host writes and no protocol can prevent it; outside it, invariant 1 holds as
//! everywhere (I1 properties skip the window). And the window closes: the graph check
//! in the tests shows no terminal state with it open and no trap.

use std::fmt;

use super::{Action, N, Phase, ProtocolModel, State};

/// What an agent does when its key is gone after the target lost its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetReset {
    /// The code before issue 27: "key gone" is a preempt, the agent self-fences and
    /// nobody registers or acquires again: the window never closes.
    SelfFence,
    /// The rule: live membership and unchanged generation, checked and registered in
    /// one step within the lease.
    Recover,
    /// BROKEN variant: re-register whenever the key is gone after a lost state,
    /// without the membership and generation check (a fenced node's hung daemon
    /// re-registers).
    RecoverUnchecked,
    /// BROKEN variant: the check and the registration are two steps with no bound
    /// between them (the lease may expire and a fence complete in between).
    RecoverCheckThenRegister,
}

/// Witness: a live agent registered again after a lost state.
pub const SEEN_RECOVERED: u32 = 1 << 16;
/// Witness: a live agent registered again after a peer had already re-acquired.
pub const SEEN_PEER_RECOVERED: u32 = 1 << 17;

/// Reachability: a live agent closed the window.
pub const S_RECOVERED: &str = "a live agent re-registered and re-acquired after a lost state";
/// Reachability: a second live agent re-registered under its peer's reservation.
pub const S_PEER_RECOVERED: &str =
    "a live agent re-registered under a peer's re-acquired reservation";

impl State {
    /// The target lost its state and no reservation is held since: every host writes.
    pub fn window_open(&self) -> bool {
        self.reset_epoch > 0 && !self.reservation
    }

    /// Agent `n`'s device check sees its key gone at a generation not above the one
    /// it last saw (abstracted: a lost state since it last registered).
    fn lost_since_seen(&self, n: usize) -> bool {
        !self.registered[n] && self.seen_epoch[n] != self.reset_epoch
    }

    /// The etcd side of the rule: membership live (this instance's lease) and the
    /// generation unchanged since `join`.
    fn live_and_unchanged(&self, n: usize) -> bool {
        let ag = &self.agents[n];
        self.etcd.member[n] == Some(ag.instance) && self.etcd.generation[n] == ag.gen_read
    }

    /// Under [`TargetReset::Recover`], agent `n`'s device check decides to recover
    /// (so it does not take the missing key for a preempt).
    pub(super) fn recovers(&self, n: usize, rule: TargetReset) -> bool {
        rule == TargetReset::Recover
            && self.running(n)
            && self.lost_since_seen(n)
            && self.live_and_unchanged(n)
    }

    /// Agent `n` registered its key and runs (`unfence` done, not leaving): its
    /// device check is the one that decides.
    fn running(&self, n: usize) -> bool {
        matches!(self.agents[n].phase, Phase::Unfenced | Phase::Active)
    }

    fn register_again(&mut self, n: usize) {
        if self.reservation {
            self.seen |= SEEN_PEER_RECOVERED;
        }
        self.registered[n] = true;
        self.reservation = true;
        self.seen_epoch[n] = self.reset_epoch;
        self.recover_checked[n] = false;
        self.seen |= SEEN_RECOVERED;
    }
}

impl ProtocolModel {
    /// The issue-27 actions: the lost state, and the agents' answer to it.
    pub(super) fn target_reset_step(&self, s: &State, act: Action) -> Option<State> {
        let rule = self.cfg.protocol.target_reset;
        let mut t = s.clone();
        match act {
            Action::TargetLostState => {
                if s.budget.target_resets == 0 {
                    return None;
                }
                t.budget.target_resets -= 1;
                t.registered = [false; N];
                t.reservation = false;
                t.reset_epoch += 1;
            }
            Action::Recover(n) => {
                let n = n as usize;
                let ok = match rule {
                    TargetReset::SelfFence => false,
                    TargetReset::Recover => s.recovers(n, rule),
                    TargetReset::RecoverUnchecked => s.running(n) && s.lost_since_seen(n),
                    TargetReset::RecoverCheckThenRegister => {
                        s.running(n) && s.lost_since_seen(n) && s.recover_checked[n]
                    }
                };
                if !ok {
                    return None;
                }
                t.register_again(n);
            }
            Action::RecoverCheck(n) => {
                let n = n as usize;
                if rule != TargetReset::RecoverCheckThenRegister
                    || s.recover_checked[n]
                    || !s.running(n)
                    || !s.lost_since_seen(n)
                    || !s.live_and_unchanged(n)
                {
                    return None;
                }
                t.recover_checked[n] = true;
            }
            _ => unreachable!("not a target-reset action"),
        }
        Some(t)
    }

    /// Candidate issue-27 actions (next_state has the exact conditions).
    pub(super) fn target_reset_actions(&self, s: &State, out: &mut Vec<Action>) {
        if s.budget.target_resets > 0 {
            out.push(Action::TargetLostState);
        }
        if s.reset_epoch > 0 {
            for n in 0..N as u8 {
                out.extend([Action::Recover(n), Action::RecoverCheck(n)]);
            }
        }
    }
}

/// The issue-27 actions' display.
pub(super) fn fmt_action(act: &Action, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match *act {
        Action::TargetLostState => write!(
            f,
            "target: all reservation state lost (no registrant, no reservation)"
        ),
        Action::Recover(n) => write!(
            f,
            "n{n}: device check: key gone after a lost state, re-register and acquire"
        ),
        Action::RecoverCheck(n) => write!(
            f,
            "n{n}: device check: lost state seen, membership live and generation unchanged"
        ),
        _ => unreachable!("not a target-reset action"),
    }
}
