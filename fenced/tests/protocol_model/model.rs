//! The model itself: state, actions, transitions and properties. See the crate doc of
//! `protocol_model.rs` for the abstraction choices and the step table.

use std::fmt;

use stateright::{Model, Property};

#[path = "target_reset.rs"]
mod target_reset;
pub use target_reset::*;

/// Nodes (agents). Node `i` is `n{i}`.
pub const N: usize = 2;
/// Controllers. Controller `i` is `c{i}`.
pub const C: usize = 2;
/// Arenas. Arena `i` is `a{i}`.
pub const A: usize = 1;

/// How the Fencer confirms severance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FencerKind {
    /// NVMe: `sever` preempts the victim's key, `verify` re-reads the report.
    Nvme,
    /// Single-signal mode: nothing is severed, arenas are never released.
    None,
}

/// The protocol's decisions that the model can flip: the implementation's choices and
/// the deliberately broken variants the checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Protocol {
    /// The watch path's claim transaction also requires `fence_done/<node>` absent (a
    /// node marked fenced and still not a member was fenced for this absence already).
    pub watch_claim_requires_not_done: bool,
    /// The finishing transaction frees an arena only if `arena_owner/<a>` still names
    /// the victim.
    pub finish_frees_only_victims_arenas: bool,
    /// The agent adopts the arenas recorded as its own only in a transaction
    /// conditioned on its live membership (after `unfence`), not by a plain read.
    pub adopt_requires_live_membership: bool,
    /// The agent's `release_own_arenas` transaction is conditioned on its live
    /// membership (not only on `arena_owner/<a>` naming it).
    pub release_requires_live_membership: bool,
    /// BROKEN variant (the seed's TLC counter-example): the agent gives its arenas back
    /// and writes the departure marker before it quiesces.
    pub depart_before_quiesce: bool,
    /// BROKEN variant: a fence whose `verify` found the key still registered bumps
    /// anyway.
    pub bump_without_confirmation: bool,
    /// BROKEN variant: the `depart` transaction is not conditioned on live membership.
    pub depart_unconditioned: bool,
    /// Invariant 6 (issue 14): a fresh start of a node fenced since its last `join`
    /// (`fence_done/<node>` present: `join` drops it), on the boot recorded at that
    /// `join`, refuses before joining (`refuse_restart`) until the host rebooted or an
    /// operator ran `unfence`. Without it (the code
    /// before issue 14) a restarted daemon joins and registers its key regardless.
    /// Only the host model ([`Config::host`]) distinguishes the two.
    pub refuse_restart_after_fence: bool,
    /// Invariant 6 at `unfence` (model finding 4): the key is registered at most once
    /// per boot (fence_scsi registers only at boot). An instance whose key is gone on
    /// a boot that registered it already refuses to register, unless an operator ran
    /// `unfence` since. Without it, an instance that joined before a fence (the start
    /// check passed) registers after the fence verified, and the application an
    /// earlier instance fed writes again. Host model only.
    pub register_once_per_boot: bool,
    /// Issue 14, part 4 (model finding 5): `leave` unregisters the node's key before
    /// `release_own_arenas`, so an application an earlier instance left running cannot
    /// write an arena once it is given back. Without it, `quiesce` stops only this
    /// instance's writes.
    pub unregister_before_release: bool,
    /// A clean leave lets the next start on this boot register again: the `depart`
    /// transaction rewrites the boot record (`by: leave`) when this instance
    /// registered the key itself (agent/mod.rs `leave_record`). An instance that found
    /// the key registered (an earlier instance's, whose application may still run)
    /// keeps the join's record, so the next start on this boot is refused. Host model.
    pub leave_allows_register: bool,
    /// BROKEN variant of `leave_allows_register`: every clean leave rewrites the
    /// record, also one of an instance that did not register the key itself.
    pub leave_allows_register_always: bool,
    /// Issue 26, hole 1: a fence is confirmed only when a reservation is held (the
    /// evidence rule, `nvme_resv::report::fence_evidence`), and `sever` acquires it
    /// first when none is. Without it (the code before issue 26) `verify` takes "key
    /// gone" as the evidence, and after a release (no reservation: every host may
    /// write) the victim keeps writing the arena the fence frees.
    pub fence_needs_reservation: bool,
    /// Issue 27: what an agent does when the target lost all reservation state
    /// (see `target_reset.rs`).
    pub target_reset: TargetReset,
    /// Issue 26, hole 4: a start that gives up after its `unfence` registered the key
    /// (`claim_arenas` finds the membership lost) unregisters the key it registered
    /// itself, and only that one (agent/start.rs `unregister_after_failed_start`): a
    /// key an earlier instance registered may serve that instance's application, and
    /// the fence that is owed removes it. Without it (the code before issue 26) the
    /// key stays on the device after the node's generation was bumped, and the next
    /// start on this boot is refused, so nothing removes it. Only with
    /// [`Config::failed_start`].
    pub unregister_after_failed_start: bool,
}

impl Protocol {
    /// The protocol as implemented in `fenced/src` at commit 9866c49 (store.rs claim
    /// guards, finish and release transactions, agent.rs `claim_arenas`).
    pub const CODE_AT_9866C49: Self = Self {
        watch_claim_requires_not_done: false,
        finish_frees_only_victims_arenas: false,
        adopt_requires_live_membership: false,
        release_requires_live_membership: false,
        depart_before_quiesce: false,
        bump_without_confirmation: false,
        depart_unconditioned: false,
        refuse_restart_after_fence: false,
        register_once_per_boot: false,
        unregister_before_release: false,
        leave_allows_register: false,
        leave_allows_register_always: false,
        fence_needs_reservation: false,
        target_reset: TargetReset::SelfFence,
        unregister_after_failed_start: false,
    };
    /// The protocol this model proves: the code with the three fixes the model asked
    /// for (the arena fix on the agent's side). All three are now in `fenced/src`:
    /// the watch-path claim requires no fence mark written since the DELETE
    /// (`ClaimGuard::Watch { deleted_rev }`), `release_arena` and `adopt_arenas` are
    /// conditioned on live membership. `CODE_AT_9866C49` is kept as the record of
    /// what the checker found. Issue 14 adds invariant 6's refusals, at start and at
    /// `unfence` (what the model asks of the daemon; see the crate doc), the leave
    /// that unregisters before it gives arenas back (part 4), and the leave's boot
    /// record that lets the next start on this boot register. All in `fenced/src`.
    pub const SAFE: Self = Self {
        watch_claim_requires_not_done: true,
        adopt_requires_live_membership: true,
        release_requires_live_membership: true,
        refuse_restart_after_fence: true,
        register_once_per_boot: true,
        unregister_before_release: true,
        leave_allows_register: true,
        fence_needs_reservation: true,
        target_reset: TargetReset::Recover,
        unregister_after_failed_start: true,
        ..Self::CODE_AT_9866C49
    };
}

/// Fault and event budgets (what may happen, at most how often, in one behaviour).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Membership lease expiries (`lease_expired`).
    pub expiries: u8,
    /// Fresh starts after a node's first one (re-registration).
    pub restarts: u8,
    /// Intentional departures begun (`quiesce`).
    pub departures: u8,
    /// Controller crashes (every in-flight fence of that controller dies with it).
    pub crashes: u8,
    /// A fence step that fails with an etcd error / fail point (the run ends there).
    pub step_errors: u8,
    /// A `sever` that reports success while the registration survives.
    pub sever_failures: u8,
    /// A claim lease that expires under a live fencer (TTL assumption violated).
    pub claim_expiries: u8,
    /// Watch faults: a lost event (`watch_compacted`) or a duplicated one (`watch_resume`
    /// from an older revision).
    pub watch_faults: u8,
    /// Host model only: the service manager restarts a running daemon (it stops; the
    /// host's writer keeps running; the next start is `join` or `refuse_restart`).
    pub daemon_restarts: u8,
    /// Host model only: host reboots (daemon and writers die, new boot id).
    pub reboots: u8,
    /// Host model only: operator `unfence` runs.
    pub unfences: u8,
    /// Issue 26: the reservation is released while every key stays registered (a
    /// holder's `nvme resv-release`, another tool, a target that lost it).
    pub releases: u8,
    /// Issue 27: the target loses all reservation state (no persistence).
    pub target_resets: u8,
}

/// A model configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The Fencer.
    pub fencer: FencerKind,
    /// The protocol variant.
    pub protocol: Protocol,
    /// Budgets.
    pub budget: Budget,
    /// Liveness start: `n1` starts expired, still writing to `a0`, with its DELETE on
    /// both watches.
    pub start_expired: bool,
    /// The host model (invariant 6): the writer is the host's application, a process
    /// of its own. A daemon that exits (`self_fence`, `daemon restart`) leaves it
    /// running with the arenas it was writing; it writes whenever the device holds the
    /// node's key, until the host reboots (or the operator stops it before `unfence`).
    /// Each host has a boot id that `join` records. Without the host model the writer
    /// dies with the daemon, so every fresh start is as good as one after a reboot and
    /// the restart refusal never applies.
    pub host: bool,
    /// Issue 26, hole 4: `claim_arena` on a lost membership is the start's failure
    /// (`LostMembership`: the daemon exits, unregistering its key per
    /// [`Protocol::unregister_after_failed_start`]), as in agent/start.rs. Off, the
    /// older abstraction stays: the gate opens with no arena adopted and the agent
    /// exits later by `self_fence`. Off in the configurations pinned before issue 26,
    /// so their state counts stay.
    pub failed_start: bool,
}

/// Agent phase (`fenced/src/agent/`: `start` then `run` then `leave`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not running (never started, exited, self-fenced, left).
    Offline,
    /// `join` (+ `read_own_generation`) done.
    Joined,
    /// `unfence` done: our key is registered.
    Unfenced,
    /// `claim_arena` done, I/O gate open.
    Active,
    /// `quiesce` done: I/O gate closed.
    Quiesced,
    /// `release_own_arenas` done.
    Released,
    /// BROKEN variant only: departed, I/O still open.
    DepartedNotQuiesced,
}

/// One agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Agent {
    /// Phase.
    pub phase: Phase,
    /// Instance number (the membership value; 0 = never started).
    pub instance: u8,
    /// The I/O gate is open.
    pub io: bool,
    /// Arenas this instance writes to.
    pub using: [bool; A],
    /// Generation read at `join`.
    pub gen_read: u8,
    /// Host model: this instance registered the key itself at `unfence` (it was not
    /// on the device).
    pub registered_it: bool,
}

/// One host, apart from its daemon (host model only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Host {
    /// Boot id (the kernel's `boot_id`), changed by a reboot.
    pub boot: u8,
    /// Arenas an application started under an earlier daemon instance still writes
    /// (it outlived that daemon; only a reboot or the operator stops it).
    pub writer: [bool; A],
    /// The oldest generation that application's daemon instance had read at `join`.
    pub writer_gen: u8,
}

/// What started a fence run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// A DELETE seen on the membership watch.
    Watch,
    /// The reconciliation sweep.
    Sweep,
}

/// The claim transaction's guard (`store::ClaimGuard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// Membership absent, no departure marker.
    Watch,
    /// Membership absent, departure marker ignored (the node still owns arenas).
    IgnoreDeparture,
    /// Membership absent, snapshot revisions unchanged (`recheck_intent`).
    Sweep {
        /// `fence_pending` stamp (0: absent).
        pending: u8,
        /// `fence_done` stamp.
        done: u8,
        /// `departed` stamp.
        departed: u8,
    },
}

/// Where a fence run stands (`core::FenceState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Owed: next is the claim transaction.
    Owed {
        /// Its guard.
        guard: Guard,
    },
    /// Claimed: intent recorded, claim held, generation read; next is `sever`.
    Claimed {
        /// Generation read.
        generation: u8,
        /// Our claim's stamp (its create revision).
        claim: u8,
        /// Arenas the victim owned at claim time.
        arenas: [bool; A],
    },
    /// Preempt issued; next is `verify`.
    SeverIssued {
        /// Generation read.
        generation: u8,
        /// Our claim's stamp.
        claim: u8,
        /// Victim's arenas.
        arenas: [bool; A],
    },
    /// The Fencer returned; next is the finishing transaction.
    Confirmed {
        /// Generation read.
        generation: u8,
        /// Our claim's stamp.
        claim: u8,
        /// Victim's arenas.
        arenas: [bool; A],
        /// Severed (release arenas); false in single-signal mode.
        severed: bool,
        /// `verify` really saw the key gone (false only in the broken variant).
        confirmed: bool,
    },
    /// Not confirmed: next is the abort transaction (`release_claim`).
    Aborting {
        /// Our claim's stamp.
        claim: u8,
    },
}

/// One fence run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// Trigger.
    pub trigger: Trigger,
    /// Step.
    pub step: Step,
}

impl Run {
    fn claim_stamp(&self) -> Option<u8> {
        match self.step {
            Step::Owed { .. } => None,
            Step::Claimed { claim, .. }
            | Step::SeverIssued { claim, .. }
            | Step::Confirmed { claim, .. }
            | Step::Aborting { claim } => Some(claim),
        }
    }
}

/// One controller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Controller {
    /// Running.
    pub alive: bool,
    /// Undelivered membership DELETE events (victim node), in revision order.
    pub watch: Vec<u8>,
    /// In-flight fence run per victim.
    pub runs: [Option<Run>; N],
}

/// A fence claim (`fence_claim/<node>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Holder.
    pub ctrl: u8,
    /// Create-revision stamp.
    pub stamp: u8,
}

/// etcd (linearizable: every transaction is one atomic model step).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Etcd {
    /// `membership/<node>` = instance (lease-bound).
    pub member: [Option<u8>; N],
    /// `generation/<node>` exists (the node is known).
    pub known: [bool; N],
    /// `generation/<node>`.
    pub generation: [u8; N],
    /// `fence_pending/<node>` with its mod-revision stamp.
    pub pending: [Option<u8>; N],
    /// `fence_done/<node>` with its stamp.
    pub done: [Option<u8>; N],
    /// `departed/<node>` with its stamp.
    pub departed: [Option<u8>; N],
    /// Stamp source for the three keys above, per node.
    pub ver: [u8; N],
    /// `fence_claim/<node>`.
    pub claim: [Option<Claim>; N],
    /// Stamp source for claims, per node.
    pub claim_ver: [u8; N],
    /// `arena_owner/<a>`.
    pub owner: [Option<u8>; A],
    /// `arena_free/<a>`.
    pub free: [bool; A],
    /// Host model: the boot id recorded with the node's last `join` (durable).
    pub boot: [u8; N],
    /// Host model: an operator's audited `unfence` since the node's last `join`.
    pub unfenced: [bool; N],
    /// Host model: the boot id on which the node last registered its key (0: cleared
    /// by an operator's `unfence`; [`LEFT`]: cleared by a clean leave).
    pub reg_boot: [u8; N],
}

/// `reg_boot` after a clean leave's boot record (`by: leave`): no boot's registration
/// is outstanding.
pub const LEFT: u8 = u8::MAX;

/// How a node's last membership ended (ghost).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// Still a member, or never joined.
    None,
    /// Lease expired.
    Expired,
    /// Departed through the `depart` transaction while a member.
    Departed,
}

/// Witness bits for `sometimes` properties (ghost).
pub mod seen {
    /// A re-registration (`join`) dropped a recorded intent.
    pub const JOIN_DROPPED_INTENT: u32 = 1 << 0;
    /// A sweep-triggered run bumped a node whose fence had been orphaned by a
    /// controller crash after its claim.
    pub const CRASH_RECOVERED_BY_SWEEP: u32 = 1 << 1;
    /// A departure marker was honoured (a run or the sweep saw it and did not fence).
    pub const DEPARTURE_HONOURED: u32 = 1 << 2;
    /// An expired node's `depart` was refused.
    pub const DEPART_REFUSED: u32 = 1 << 3;
    /// A fence was aborted (not confirmed) and the node was later bumped.
    pub const ABORTED_THEN_FENCED: u32 = 1 << 4;
    /// A finishing transaction was refused because the claim was lost.
    pub const CLAIM_LOST_AT_BUMP: u32 = 1 << 5;
    /// A sweep run's `recheck_intent` refused an aged snapshot.
    pub const STALE_SNAPSHOT_REFUSED: u32 = 1 << 6;
    /// A bump completed by a sweep after the watch lost the event.
    pub const LOST_EVENT_FENCED_BY_SWEEP: u32 = 1 << 7;
    /// A fresh start of a fenced node on the same boot was refused.
    pub const RESTART_REFUSED: u32 = 1 << 8;
    /// A fenced node joined again after an operator's `unfence` (same boot).
    pub const UNFENCED_THEN_JOINED: u32 = 1 << 9;
    /// A fenced node joined again after its host rebooted.
    pub const REBOOTED_THEN_JOINED: u32 = 1 << 10;
    /// An instance that joined refused to register a key this boot had registered.
    pub const REGISTER_REFUSED: u32 = 1 << 11;
    /// An instance registered the key again on a boot a clean leave had unregistered.
    pub const LEFT_THEN_REGISTERED: u32 = 1 << 12;
    /// Issue 26, hole 4: a start registered the key after the node's fence was
    /// confirmed, found its membership lost at `claim_arena`, and gave up.
    pub const FAILED_START_AFTER_FENCE: u32 = 1 << 15;
    /// Issue 26, hole 4: a start that gave up found the key registered by an earlier
    /// instance, and left it for the owed fence.
    pub const FAILED_START_KEPT_EARLIER_KEY: u32 = 1 << 14;
}

/// Per-node ghost state (never read by the protocol, only by properties).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The node's membership expired and it has been neither bumped since nor
    /// re-registered: a fence is owed.
    pub owed: bool,
    /// Bumps since the node last joined.
    pub bumps: u8,
    /// How the last membership ended.
    pub end: End,
    /// A controller crashed holding this node's claim (cleared at bump).
    pub orphaned: bool,
    /// A fence of this node was aborted (cleared at bump).
    pub aborted: bool,
    /// A watch lost this node's DELETE (cleared at bump).
    pub lost: bool,
    /// Issue 26, hole 4: the node's last start gave up at `claim_arena` on a lost
    /// membership ([`Config::failed_start`]; cleared by `join`).
    pub gave_up: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// etcd.
    pub etcd: Etcd,
    /// The shared namespace: key registered per node.
    pub registered: [bool; N],
    /// The shared namespace holds a reservation (Write Exclusive - All Registrants):
    /// only then does an unregistered host's write fail. With none, every host writes.
    pub reservation: bool,
    /// Agents.
    pub agents: [Agent; N],
    /// Hosts (constant without the host model).
    pub hosts: [Host; N],
    /// Controllers.
    pub ctrls: [Controller; C],
    /// Remaining budgets.
    pub budget: Budget,
    /// Per-node ghosts.
    pub ghost: [Ghost; N],
    /// A bump happened without confirmation (ghost).
    pub unconfirmed_bump: bool,
    /// A live member was bumped (ghost).
    pub member_bumped: bool,
    /// Witness bits (ghost).
    pub seen: u32,
    /// Issue 27: lost states so far (what the reservation generation going back shows).
    pub reset_epoch: u8,
    /// Issue 27: the `reset_epoch` each agent last saw with its key registered.
    pub seen_epoch: [u8; N],
    /// Issue 27, BROKEN variant only: the agent checked and will register later.
    pub recover_checked: [bool; N],
}

/// A model action. Names follow the protocol's step names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Agent: `join` + `read_own_generation` (one transaction).
    Join(u8),
    /// Agent: `unfence`.
    Unfence(u8),
    /// Agent: `claim_arena` (adopt own arenas, claim free ones, open the I/O gate).
    ClaimArena(u8),
    /// Agent: `quiesce`.
    Quiesce(u8),
    /// Agent: `release_own_arenas`.
    ReleaseOwnArenas(u8),
    /// Agent: `depart` (unregister own key, then the departure transaction).
    Depart(u8),
    /// Agent: `self_fence` (lease lost or key preempted): stop I/O, exit.
    SelfFence(u8),
    /// Host: the service manager restarts the daemon on the same boot; the daemon
    /// stops, the host's writer keeps running.
    DaemonRestart(u8),
    /// Agent: `refuse_restart`. At start (fenced since its last join, same boot, no
    /// operator `unfence`): exit without joining or registering. At `unfence` (the key
    /// is gone and this boot registered it already, no operator `unfence`): exit
    /// without registering.
    RefuseRestart(u8),
    /// Host: reboot (the daemon and every writer die; new boot id).
    Reboot(u8),
    /// Operator: `fenced unfence --node-id N` (audited; refused while N is a member),
    /// after stopping the node's daemon and applications.
    OperatorUnfence(u8),
    /// etcd: the node's membership lease expires (`lease_expired`).
    LeaseExpired(u8),
    /// etcd: the claim lease on `fence_claim/<node>` expires.
    ClaimLeaseExpired(u8),
    /// Controller: `watch_delete` (deliver the next DELETE, start a watch run).
    WatchDelete(u8),
    /// Controller fault: `watch_compacted` (the resume gap lost the next event).
    WatchCompacted(u8),
    /// Controller fault: `watch_resume` from an older revision re-delivers the next
    /// event (it is delivered now and stays queued).
    WatchResume(u8),
    /// Controller: `sweep` (one range-read snapshot, drop stale, start owed runs).
    Sweep(u8),
    /// Fence: the claim transaction (`record_intent`, `claim`, [`recheck_intent`],
    /// `read_generation`).
    FenceClaim(u8, u8),
    /// Fence: `sever`. The bool is whether the device really drops the key.
    FenceSever(u8, u8, bool),
    /// Fence: `verify`.
    FenceVerify(u8, u8),
    /// Fence: the finishing transaction (`bump`, `mark_done`, `clear_intent`,
    /// `release_arenas`, `release_claim`).
    FenceBump(u8, u8),
    /// Fence: the abort transaction (`release_claim` only; the intent stays).
    FenceAbort(u8, u8),
    /// Fence fault: the run's next step fails (etcd error, fail point); the run ends
    /// and leaves whatever it wrote.
    FenceStepError(u8, u8),
    /// Controller crash: every run of it dies.
    Crash(u8),
    /// Controller restart (watch from now; the sweep covers the gap).
    Restart(u8),
    /// Device: the reservation is released, every key stays registered (issue 26).
    ReservationReleased,
    /// Agent: the periodic device check finds no reservation held and acquires it.
    DeviceCheckAcquire(u8),
    /// Target: all reservation state lost (issue 27).
    TargetLostState,
    /// Agent: after a lost state, register our key again (and acquire if none held).
    Recover(u8),
    /// Agent, BROKEN variant only: the check before a separate `Recover`.
    RecoverCheck(u8),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Join(n) => write!(f, "n{n}: join [join, read_own_generation]"),
            Self::Unfence(n) => write!(f, "n{n}: unfence"),
            Self::ClaimArena(n) => write!(f, "n{n}: claim_arena"),
            Self::Quiesce(n) => write!(f, "n{n}: quiesce"),
            Self::ReleaseOwnArenas(n) => write!(f, "n{n}: release_own_arenas"),
            Self::Depart(n) => write!(f, "n{n}: depart"),
            Self::SelfFence(n) => write!(f, "n{n}: self_fence"),
            Self::DaemonRestart(n) => {
                write!(f, "n{n}: daemon restart (same boot, writer keeps running)")
            }
            Self::RefuseRestart(n) => write!(f, "n{n}: refuse_restart"),
            Self::Reboot(n) => write!(f, "n{n}: host reboot (writers die, new boot id)"),
            Self::OperatorUnfence(n) => {
                write!(f, "operator: unfence n{n} (daemon and writers stopped)")
            }
            Self::LeaseExpired(n) => write!(f, "etcd: lease_expired n{n}"),
            Self::ClaimLeaseExpired(n) => {
                write!(f, "etcd: claim lease of fence_claim/n{n} expired")
            }
            Self::WatchDelete(c) => write!(f, "c{c}: watch_delete"),
            Self::WatchCompacted(c) => write!(f, "c{c}: watch_compacted (event lost)"),
            Self::WatchResume(c) => write!(f, "c{c}: watch_resume (event duplicated)"),
            Self::Sweep(c) => write!(f, "c{c}: sweep"),
            Self::FenceClaim(c, v) => write!(
                f,
                "c{c}: fence n{v} [record_intent, claim, recheck_intent?, read_generation]"
            ),
            Self::FenceSever(c, v, ok) => write!(
                f,
                "c{c}: fence n{v} [sever]{}",
                if ok { "" } else { " (device keeps the key)" }
            ),
            Self::FenceVerify(c, v) => write!(f, "c{c}: fence n{v} [verify]"),
            Self::FenceBump(c, v) => write!(
                f,
                "c{c}: fence n{v} [bump, mark_done, clear_intent, release_arenas?, release_claim]"
            ),
            Self::FenceAbort(c, v) => write!(f, "c{c}: fence n{v} aborted [release_claim]"),
            Self::FenceStepError(c, v) => write!(f, "c{c}: fence n{v} step failed (etcd error)"),
            Self::Crash(c) => write!(f, "c{c}: crash"),
            Self::Restart(c) => write!(f, "c{c}: restart"),
            Self::ReservationReleased => {
                write!(
                    f,
                    "device: reservation released (every key stays registered)"
                )
            }
            Self::DeviceCheckAcquire(n) => {
                write!(f, "n{n}: device check: no reservation held, acquire it")
            }
            Self::TargetLostState | Self::Recover(_) | Self::RecoverCheck(_) => {
                target_reset::fmt_action(self, f)
            }
        }
    }
}

/// The protocol model.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    /// Its configuration.
    pub cfg: Config,
}

fn stamp(x: Option<u8>) -> u8 {
    x.unwrap_or(0)
}

fn next_ver(v: &mut u8) -> u8 {
    *v += 1;
    *v
}

impl State {
    /// Node `n` can still write to arena `a`: its I/O gate is open and it uses `a`, or
    /// an application an earlier daemon instance left running writes `a`; and the
    /// device still holds its key.
    pub fn can_write(&self, n: usize, a: usize) -> bool {
        let ag = &self.agents[n];
        (ag.io && ag.using[a] || self.hosts[n].writer[a])
            && (self.registered[n] || !self.reservation)
    }

    /// The generation the oldest writer of node `n` that uses arena `a` had read.
    fn writer_gen(&self, n: usize, a: usize) -> u8 {
        let ag = &self.agents[n];
        let h = &self.hosts[n];
        match (ag.io && ag.using[a], h.writer[a]) {
            (true, true) => ag.gen_read.min(h.writer_gen),
            (false, true) => h.writer_gen,
            _ => ag.gen_read,
        }
    }

    /// Host model: the daemon of node `n` stops; an application it fed keeps writing.
    fn daemon_stops(&mut self, n: usize, host: bool) {
        let ag = self.agents[n];
        if host && ag.io && ag.using.iter().any(|&u| u) {
            let h = &mut self.hosts[n];
            h.writer_gen = if h.writer.iter().any(|&w| w) {
                h.writer_gen.min(ag.gen_read)
            } else {
                ag.gen_read
            };
            for (w, &u) in h.writer.iter_mut().zip(&ag.using) {
                *w |= u;
            }
        }
        self.agents[n] = Agent {
            phase: Phase::Offline,
            io: false,
            using: [false; A],
            ..ag
        };
    }

    /// Invariant 6 at `unfence` (`register_once_per_boot`): the device does not hold
    /// the key, and this boot already registered it once (no operator `unfence` since).
    fn register_refused(&self, n: usize, cfg: &Config) -> bool {
        cfg.host
            && cfg.protocol.register_once_per_boot
            && !self.registered[n]
            && self.etcd.reg_boot[n] == self.hosts[n].boot
    }

    /// Invariant 6: node `n`'s fresh start must refuse to register.
    fn restart_refused(&self, n: usize, cfg: &Config) -> bool {
        cfg.host
            && cfg.protocol.refuse_restart_after_fence
            && self.etcd.done[n].is_some()
            && self.etcd.boot[n] == self.hosts[n].boot
            && !self.etcd.unfenced[n]
    }

    fn owned_by(&self, n: usize) -> [bool; A] {
        let mut out = [false; A];
        for (a, o) in out.iter_mut().enumerate() {
            *o = self.etcd.owner[a] == Some(n as u8);
        }
        out
    }

    fn delete_membership(&mut self, n: usize) {
        self.etcd.member[n] = None;
        for c in &mut self.ctrls {
            if c.alive {
                c.watch.push(n as u8);
            }
        }
    }

    fn has_claim_of_run(&self, v: usize) -> bool {
        let Some(cl) = self.etcd.claim[v] else {
            return false;
        };
        self.ctrls[cl.ctrl as usize].runs[v].and_then(|r| r.claim_stamp()) == Some(cl.stamp)
    }
}

impl ProtocolModel {
    fn init(&self) -> State {
        let mut etcd = Etcd {
            member: [Some(1); N],
            known: [true; N],
            generation: [0; N],
            pending: [None; N],
            done: [None; N],
            departed: [None; N],
            ver: [0; N],
            claim: [None; N],
            claim_ver: [0; N],
            owner: [None; A],
            free: [true; A],
            boot: [1; N],
            unfenced: [false; N],
            reg_boot: [1; N],
        };
        let active = Agent {
            phase: Phase::Active,
            instance: 1,
            io: true,
            using: [false; A],
            gen_read: 0,
            registered_it: true,
        };
        let mut agents = [active; N];
        // n0 is starting (registered, about to claim arenas); n1 owns and writes a0.
        agents[0].phase = Phase::Unfenced;
        agents[0].io = false;
        etcd.owner[0] = Some(1);
        etcd.free[0] = false;
        agents[1].using[0] = true;
        let ctrl = Controller {
            alive: true,
            watch: Vec::new(),
            runs: [None; N],
        };
        let ghost = Ghost {
            owed: false,
            bumps: 0,
            end: End::None,
            orphaned: false,
            aborted: false,
            lost: false,
            gave_up: false,
        };
        let host = Host {
            boot: 1,
            writer: [false; A],
            writer_gen: 0,
        };
        let mut s = State {
            etcd,
            registered: [true; N],
            reservation: true,
            agents,
            hosts: [host; N],
            ctrls: [ctrl.clone(), ctrl],
            budget: self.cfg.budget,
            ghost: [ghost; N],
            unconfirmed_bump: false,
            member_bumped: false,
            seen: 0,
            reset_epoch: 0,
            seen_epoch: [0; N],
            recover_checked: [false; N],
        };
        if self.cfg.start_expired {
            s.delete_membership(1);
            s.ghost[1].owed = true;
            s.ghost[1].end = End::Expired;
        }
        s
    }

    fn agent_step(&self, s: &State, act: Action) -> Option<State> {
        let p = self.cfg.protocol;
        let mut t = s.clone();
        match act {
            Action::Join(n) => {
                let n = n as usize;
                let ag = &s.agents[n];
                if ag.phase != Phase::Offline || s.budget.restarts == 0 {
                    return None;
                }
                // Refused while a controller holds a fence claim on us or we are a member.
                if s.etcd.claim[n].is_some() || s.etcd.member[n].is_some() {
                    return None;
                }
                // Invariant 6: checked at start, before `join` changes anything.
                if s.restart_refused(n, &self.cfg) {
                    return None;
                }
                t.budget.restarts -= 1;
                let inst = ag.instance + 1;
                if s.etcd.pending[n].is_some() {
                    t.seen |= seen::JOIN_DROPPED_INTENT;
                }
                if self.cfg.host && s.etcd.done[n].is_some() {
                    if s.etcd.unfenced[n] {
                        t.seen |= seen::UNFENCED_THEN_JOINED;
                    } else if s.etcd.boot[n] != s.hosts[n].boot {
                        t.seen |= seen::REBOOTED_THEN_JOINED;
                    }
                }
                t.etcd.member[n] = Some(inst);
                t.etcd.known[n] = true;
                t.etcd.boot[n] = s.hosts[n].boot;
                t.etcd.unfenced[n] = false;
                if s.etcd.pending[n].is_some()
                    || s.etcd.done[n].is_some()
                    || s.etcd.departed[n].is_some()
                {
                    t.etcd.pending[n] = None;
                    t.etcd.done[n] = None;
                    t.etcd.departed[n] = None;
                }
                t.agents[n] = Agent {
                    phase: Phase::Joined,
                    instance: inst,
                    io: false,
                    using: [false; A],
                    gen_read: s.etcd.generation[n],
                    registered_it: false,
                };
                t.ghost[n].owed = false;
                t.ghost[n].bumps = 0;
                t.ghost[n].end = End::None;
                t.ghost[n].orphaned = false;
                t.ghost[n].aborted = false;
                t.ghost[n].lost = false;
                t.ghost[n].gave_up = false;
            }
            Action::Unfence(n) => {
                let n = n as usize;
                if s.agents[n].phase != Phase::Joined || s.register_refused(n, &self.cfg) {
                    return None;
                }
                if self.cfg.host && !s.registered[n] {
                    // Recorded before the device call: a crash between the two only
                    // makes the next start on this boot refuse.
                    if s.etcd.reg_boot[n] == LEFT {
                        t.seen |= seen::LEFT_THEN_REGISTERED;
                    }
                    t.etcd.reg_boot[n] = s.hosts[n].boot;
                    t.agents[n].registered_it = true;
                }
                if self.cfg.failed_start && !s.registered[n] {
                    // Also without the host model: the failed start's unregister
                    // removes only a key this start registered.
                    t.agents[n].registered_it = true;
                }
                t.registered[n] = true;
                t.seen_epoch[n] = s.reset_epoch;
                // agent/mod.rs `unfence`: creates the reservation if none is held.
                t.reservation = true;
                t.agents[n].phase = Phase::Unfenced;
            }
            Action::ClaimArena(n) => {
                let n = n as usize;
                let ag = s.agents[n];
                if ag.phase != Phase::Unfenced {
                    return None;
                }
                let live = s.etcd.member[n] == Some(ag.instance);
                if !live && p.adopt_requires_live_membership && self.cfg.failed_start {
                    return Some(self.failed_start(s, n));
                }
                let mut using = [false; A];
                for (a, u) in using.iter_mut().enumerate() {
                    if s.etcd.owner[a] == Some(n as u8) {
                        // agent/mod.rs `claim_arenas`: `owned_arenas` is a plain read.
                        *u = live || !p.adopt_requires_live_membership;
                    } else if live && s.etcd.free[a] && s.etcd.owner[a].is_none() {
                        t.etcd.free[a] = false;
                        t.etcd.owner[a] = Some(n as u8);
                        *u = true;
                    }
                }
                t.agents[n].using = using;
                t.agents[n].io = true;
                t.agents[n].phase = Phase::Active;
            }
            Action::Quiesce(n) => {
                let n = n as usize;
                let ag = s.agents[n];
                if p.depart_before_quiesce {
                    if ag.phase != Phase::DepartedNotQuiesced {
                        return None;
                    }
                    t.agents[n].io = false;
                    t.agents[n].using = [false; A];
                    t.agents[n].phase = Phase::Offline;
                } else {
                    if ag.phase != Phase::Active || s.budget.departures == 0 {
                        return None;
                    }
                    t.budget.departures -= 1;
                    t.agents[n].io = false;
                    t.agents[n].phase = Phase::Quiesced;
                }
            }
            Action::ReleaseOwnArenas(n) => {
                let n = n as usize;
                let ag = s.agents[n];
                if p.depart_before_quiesce {
                    if ag.phase != Phase::Active || s.budget.departures == 0 {
                        return None;
                    }
                    t.budget.departures -= 1;
                } else if ag.phase != Phase::Quiesced {
                    return None;
                } else if p.unregister_before_release {
                    t.registered[n] = false;
                }
                // One owner-conditioned transaction per arena (store/arenas.rs `release_arena`).
                let live = s.etcd.member[n] == Some(ag.instance);
                for a in 0..A {
                    if s.etcd.owner[a] == Some(n as u8)
                        && (live || !p.release_requires_live_membership)
                    {
                        t.etcd.owner[a] = None;
                        t.etcd.free[a] = true;
                    }
                }
                t.agents[n].phase = Phase::Released;
            }
            Action::Depart(n) => {
                let n = n as usize;
                let ag = s.agents[n];
                if ag.phase != Phase::Released {
                    return None;
                }
                // agent/leave.rs `leave_steps`: unregister our key, then the departure transaction.
                if !p.depart_before_quiesce {
                    t.registered[n] = false;
                }
                let live = s.etcd.member[n] == Some(ag.instance);
                if live || p.depart_unconditioned {
                    t.etcd.departed[n] = Some(next_ver(&mut t.etcd.ver[n]));
                    if live {
                        t.delete_membership(n);
                        t.ghost[n].end = End::Departed;
                        // The same transaction: the leave's boot record (`by: leave`).
                        if self.cfg.host
                            && (p.leave_allows_register_always
                                || p.leave_allows_register && ag.registered_it)
                        {
                            t.etcd.reg_boot[n] = LEFT;
                        }
                    }
                } else {
                    t.seen |= seen::DEPART_REFUSED;
                }
                if p.depart_before_quiesce {
                    t.agents[n].phase = Phase::DepartedNotQuiesced;
                } else {
                    t.agents[n] = Agent {
                        phase: Phase::Offline,
                        io: false,
                        using: [false; A],
                        ..ag
                    };
                }
            }
            Action::SelfFence(n) => {
                let n = n as usize;
                let ag = s.agents[n];
                if ag.phase == Phase::Offline {
                    return None;
                }
                let lease_lost = s.etcd.member[n] != Some(ag.instance);
                let unfenced = !matches!(ag.phase, Phase::Joined);
                // Issue 27: a key lost with the target's state is not a preempt.
                let preempted =
                    unfenced && !s.registered[n] && !s.recovers(n, self.cfg.protocol.target_reset);
                if !(lease_lost || preempted) {
                    return None;
                }
                // `--on-fence exit`: the daemon exits, the application does not.
                t.daemon_stops(n, self.cfg.host);
            }
            Action::DaemonRestart(n) => {
                let n = n as usize;
                if !self.cfg.host
                    || s.agents[n].phase == Phase::Offline
                    || s.budget.daemon_restarts == 0
                {
                    return None;
                }
                t.budget.daemon_restarts -= 1;
                t.daemon_stops(n, true);
            }
            Action::RefuseRestart(n) => {
                let n = n as usize;
                match s.agents[n].phase {
                    Phase::Offline => {
                        if s.budget.restarts == 0 || !s.restart_refused(n, &self.cfg) {
                            return None;
                        }
                        // Nothing changes in etcd or on the device; the start exits.
                        t.seen |= seen::RESTART_REFUSED;
                        if t == *s {
                            return None;
                        }
                    }
                    Phase::Joined => {
                        if !s.register_refused(n, &self.cfg) {
                            return None;
                        }
                        // At `unfence`: the key is gone and this boot registered it
                        // once already. Exit without registering (the membership
                        // expires and the node is fenced as usual).
                        t.seen |= seen::REGISTER_REFUSED;
                        t.daemon_stops(n, true);
                    }
                    _ => return None,
                }
            }
            _ => unreachable!("not an agent action"),
        }
        Some(t)
    }

    /// Issue 26, hole 4: `claim_arena` of node `n` finds its membership lost
    /// (agent/start.rs: `adopt_arenas` answers `LostMembership`) and the start gives
    /// up. No gate was opened, so no writer outlives it; what it may leave is the key.
    fn failed_start(&self, s: &State, n: usize) -> State {
        let mut t = s.clone();
        if self.cfg.protocol.unregister_after_failed_start && s.agents[n].registered_it {
            // `unregister_checked`: unregister, then a report shows the key gone.
            t.registered[n] = false;
        }
        if s.etcd.done[n].is_some() {
            t.seen |= seen::FAILED_START_AFTER_FENCE;
        }
        if s.registered[n] && !s.agents[n].registered_it {
            t.seen |= seen::FAILED_START_KEPT_EARLIER_KEY;
        }
        t.ghost[n].gave_up = true;
        t.daemon_stops(n, self.cfg.host);
        t
    }

    fn env_step(&self, s: &State, act: Action) -> Option<State> {
        let mut t = s.clone();
        match act {
            Action::LeaseExpired(n) => {
                let n = n as usize;
                if s.etcd.member[n].is_none() || s.budget.expiries == 0 {
                    return None;
                }
                t.budget.expiries -= 1;
                t.delete_membership(n);
                t.ghost[n].owed = true;
                t.ghost[n].end = End::Expired;
            }
            Action::ClaimLeaseExpired(v) => {
                let v = v as usize;
                s.etcd.claim[v]?;
                if s.has_claim_of_run(v) {
                    // The TTL outlasts a fence: expiring under a live run is a fault.
                    if s.budget.claim_expiries == 0 {
                        return None;
                    }
                    t.budget.claim_expiries -= 1;
                }
                t.etcd.claim[v] = None;
            }
            Action::Crash(c) => {
                let c = c as usize;
                if !s.ctrls[c].alive || s.budget.crashes == 0 {
                    return None;
                }
                t.budget.crashes -= 1;
                for v in 0..N {
                    if s.ctrls[c].runs[v].and_then(|r| r.claim_stamp()).is_some() {
                        t.ghost[v].orphaned = true;
                    }
                }
                t.ctrls[c] = Controller {
                    alive: false,
                    watch: Vec::new(),
                    runs: [None; N],
                };
            }
            Action::Restart(c) => {
                let c = c as usize;
                if s.ctrls[c].alive {
                    return None;
                }
                t.ctrls[c].alive = true;
            }
            Action::ReservationReleased => {
                // Issue 26's case: released before a fence is confirmed. A release
                // after a confirmed fence reopens the fenced host's writes until an
                // agent's device check acquires again (`DeviceCheckAcquire`), which
                // no fence protocol can prevent: the checker finds that trace (I1)
                // if this guard is dropped. Not modelled as a protocol fault.
                let confirmed = s.etcd.generation.iter().any(|&g| g > 0)
                    || s.ctrls.iter().any(|c| {
                        c.runs
                            .iter()
                            .flatten()
                            .any(|r| matches!(r.step, Step::Confirmed { .. }))
                    });
                if !s.reservation || s.budget.releases == 0 || confirmed {
                    return None;
                }
                t.budget.releases -= 1;
                t.reservation = false;
            }
            Action::DeviceCheckAcquire(n) => {
                let n = n as usize;
                // agent/mod.rs `run`, the device tick: a running, registered agent.
                let running = !matches!(s.agents[n].phase, Phase::Offline | Phase::Joined);
                if s.reservation || !running || !s.registered[n] {
                    return None;
                }
                t.reservation = true;
            }
            Action::Reboot(n) => {
                let n = n as usize;
                if !self.cfg.host || s.budget.reboots == 0 {
                    return None;
                }
                t.budget.reboots -= 1;
                t.daemon_stops(n, false);
                t.hosts[n] = Host {
                    boot: s.hosts[n].boot + 1,
                    writer: [false; A],
                    writer_gen: 0,
                };
            }
            Action::OperatorUnfence(n) => {
                let n = n as usize;
                // Refused while a member; only meaningful for a fenced node.
                if !self.cfg.host
                    || s.budget.unfences == 0
                    || s.etcd.member[n].is_some()
                    || s.etcd.done[n].is_none()
                    || s.etcd.unfenced[n]
                {
                    return None;
                }
                t.budget.unfences -= 1;
                // The operator's part, attested by the audited reason: the node's daemon
                // and applications are stopped first.
                t.daemon_stops(n, false);
                t.hosts[n].writer = [false; A];
                t.hosts[n].writer_gen = 0;
                t.etcd.unfenced[n] = true;
                t.etcd.reg_boot[n] = 0;
            }
            _ => unreachable!("not an environment action"),
        }
        Some(t)
    }

    fn watch_step(&self, s: &State, act: Action) -> Option<State> {
        let mut t = s.clone();
        match act {
            Action::WatchDelete(c) | Action::WatchResume(c) => {
                let c = c as usize;
                let ctrl = &s.ctrls[c];
                let &v = ctrl.watch.first()?;
                if !ctrl.alive || ctrl.runs[v as usize].is_some() {
                    return None;
                }
                if matches!(act, Action::WatchResume(_)) {
                    if s.budget.watch_faults == 0 {
                        return None;
                    }
                    t.budget.watch_faults -= 1;
                } else {
                    t.ctrls[c].watch.remove(0);
                }
                t.ctrls[c].runs[v as usize] = Some(Run {
                    trigger: Trigger::Watch,
                    step: Step::Owed {
                        guard: Guard::Watch,
                    },
                });
            }
            Action::WatchCompacted(c) => {
                let c = c as usize;
                let &v = s.ctrls[c].watch.first()?;
                if s.budget.watch_faults == 0 {
                    return None;
                }
                t.budget.watch_faults -= 1;
                t.ctrls[c].watch.remove(0);
                t.ghost[v as usize].lost = true;
            }
            Action::Sweep(c) => {
                let c = c as usize;
                if !s.ctrls[c].alive {
                    return None;
                }
                let e = &s.etcd;
                for v in 0..N {
                    if !e.known[v] {
                        continue;
                    }
                    if e.member[v].is_some() {
                        // drop_stale (a separate transaction guarded by membership).
                        if e.pending[v].is_some() || e.done[v].is_some() {
                            t.etcd.pending[v] = None;
                            t.etcd.done[v] = None;
                        }
                        continue;
                    }
                    let arenas = s.owned_by(v).iter().filter(|&&o| o).count();
                    if e.pending[v].is_none() {
                        if e.done[v].is_some() {
                            continue;
                        }
                        if e.departed[v].is_some() && arenas == 0 {
                            t.seen |= seen::DEPARTURE_HONOURED;
                            continue;
                        }
                    }
                    if e.claim[v].is_some() || s.ctrls[c].runs[v].is_some() {
                        continue;
                    }
                    t.ctrls[c].runs[v] = Some(Run {
                        trigger: Trigger::Sweep,
                        step: Step::Owed {
                            guard: Guard::Sweep {
                                pending: stamp(e.pending[v]),
                                done: stamp(e.done[v]),
                                departed: stamp(e.departed[v]),
                            },
                        },
                    });
                }
                // A sweep that changes nothing is not a step (keeps terminal states).
                let mut cmp = t.clone();
                cmp.seen = s.seen;
                if cmp == *s {
                    return None;
                }
            }
            _ => unreachable!("not a watch action"),
        }
        Some(t)
    }

    fn fence_step(&self, s: &State, act: Action) -> Option<State> {
        let p = self.cfg.protocol;
        let (c, v) = match act {
            Action::FenceClaim(c, v)
            | Action::FenceSever(c, v, _)
            | Action::FenceVerify(c, v)
            | Action::FenceBump(c, v)
            | Action::FenceAbort(c, v)
            | Action::FenceStepError(c, v) => (c as usize, v as usize),
            _ => unreachable!("not a fence action"),
        };
        let run = s.ctrls[c].runs[v]?;
        let mut t = s.clone();
        let ours = |cl: u8| {
            s.etcd.claim[v]
                == Some(Claim {
                    ctrl: c as u8,
                    stamp: cl,
                })
        };
        match (act, run.step) {
            (Action::FenceStepError(..), _) => {
                if s.budget.step_errors == 0 {
                    return None;
                }
                t.budget.step_errors -= 1;
                t.ctrls[c].runs[v] = None;
            }
            (Action::FenceClaim(..), Step::Owed { guard }) => {
                let e = &s.etcd;
                let mut ok = e.claim[v].is_none() && e.member[v].is_none();
                let mut departed_refusal = false;
                match guard {
                    Guard::Watch | Guard::IgnoreDeparture => {
                        if guard == Guard::Watch && e.departed[v].is_some() {
                            departed_refusal = ok;
                            ok = false;
                        }
                        if p.watch_claim_requires_not_done && e.done[v].is_some() {
                            departed_refusal = false;
                            ok = false;
                        }
                    }
                    Guard::Sweep {
                        pending,
                        done,
                        departed,
                    } => {
                        let fresh = stamp(e.pending[v]) == pending
                            && stamp(e.done[v]) == done
                            && stamp(e.departed[v]) == departed;
                        if ok && !fresh {
                            t.seen |= seen::STALE_SNAPSHOT_REFUSED;
                        }
                        ok &= fresh;
                    }
                }
                if ok {
                    t.etcd.pending[v] = Some(next_ver(&mut t.etcd.ver[v]));
                    let cl = next_ver(&mut t.etcd.claim_ver[v]);
                    t.etcd.claim[v] = Some(Claim {
                        ctrl: c as u8,
                        stamp: cl,
                    });
                    t.ctrls[c].runs[v] = Some(Run {
                        step: Step::Claimed {
                            generation: e.generation[v],
                            claim: cl,
                            arenas: s.owned_by(v),
                        },
                        ..run
                    });
                } else if departed_refusal {
                    let arenas = s.owned_by(v).iter().filter(|&&o| o).count();
                    if arenas == 0 {
                        t.seen |= seen::DEPARTURE_HONOURED;
                        t.ctrls[c].runs[v] = None;
                    } else {
                        t.ctrls[c].runs[v] = Some(Run {
                            step: Step::Owed {
                                guard: Guard::IgnoreDeparture,
                            },
                            ..run
                        });
                    }
                } else {
                    t.ctrls[c].runs[v] = None;
                }
            }
            (
                Action::FenceSever(_, _, dev_ok),
                Step::Claimed {
                    generation,
                    claim,
                    arenas,
                },
            ) => match self.cfg.fencer {
                FencerKind::Nvme => {
                    // fencer/nvme.rs `hold_reservation`: no reservation held, acquire
                    // it (the controller is a registrant) before the preempt.
                    if p.fence_needs_reservation {
                        t.reservation = true;
                    }
                    if dev_ok {
                        t.registered[v] = false;
                    } else {
                        if s.budget.sever_failures == 0 || !s.registered[v] {
                            return None;
                        }
                        t.budget.sever_failures -= 1;
                    }
                    t.ctrls[c].runs[v] = Some(Run {
                        step: Step::SeverIssued {
                            generation,
                            claim,
                            arenas,
                        },
                        ..run
                    });
                }
                FencerKind::None => {
                    if !dev_ok {
                        return None;
                    }
                    t.ctrls[c].runs[v] = Some(Run {
                        step: Step::Confirmed {
                            generation,
                            claim,
                            arenas,
                            severed: false,
                            confirmed: true,
                        },
                        ..run
                    });
                }
            },
            (
                Action::FenceVerify(..),
                Step::SeverIssued {
                    generation,
                    claim,
                    arenas,
                },
            ) => {
                // The evidence: the key gone, and (issue 26) a reservation held that
                // denies the victim. Before issue 26, the key gone alone.
                let gone = !s.registered[v] && (s.reservation || !p.fence_needs_reservation);
                let step = if gone || p.bump_without_confirmation {
                    Step::Confirmed {
                        generation,
                        claim,
                        arenas,
                        severed: true,
                        confirmed: gone,
                    }
                } else {
                    Step::Aborting { claim }
                };
                t.ctrls[c].runs[v] = Some(Run { step, ..run });
            }
            (
                Action::FenceBump(..),
                Step::Confirmed {
                    generation,
                    claim,
                    arenas,
                    severed,
                    confirmed,
                },
            ) => {
                t.ctrls[c].runs[v] = None;
                if s.etcd.generation[v] != generation || !ours(claim) {
                    // GenerationMoved / ClaimLost: nothing written, claim left to expire.
                    if !ours(claim) {
                        t.seen |= seen::CLAIM_LOST_AT_BUMP;
                    }
                    return Some(t);
                }
                t.etcd.generation[v] = generation + 1;
                t.etcd.done[v] = Some(next_ver(&mut t.etcd.ver[v]));
                t.etcd.pending[v] = None;
                if severed {
                    for (a, &listed) in arenas.iter().enumerate() {
                        if listed
                            && (!p.finish_frees_only_victims_arenas
                                || s.etcd.owner[a] == Some(v as u8))
                        {
                            t.etcd.owner[a] = None;
                            t.etcd.free[a] = true;
                        }
                    }
                }
                t.etcd.claim[v] = None;
                let g = &mut t.ghost[v];
                if self.cfg.fencer == FencerKind::Nvme && !confirmed {
                    t.unconfirmed_bump = true;
                }
                if s.etcd.member[v].is_some() {
                    t.member_bumped = true;
                }
                if run.trigger == Trigger::Sweep && g.orphaned {
                    t.seen |= seen::CRASH_RECOVERED_BY_SWEEP;
                }
                if run.trigger == Trigger::Sweep && g.lost {
                    t.seen |= seen::LOST_EVENT_FENCED_BY_SWEEP;
                }
                if g.aborted {
                    t.seen |= seen::ABORTED_THEN_FENCED;
                }
                g.bumps = g.bumps.saturating_add(1);
                g.owed = false;
                g.orphaned = false;
                g.aborted = false;
                g.lost = false;
            }
            (Action::FenceAbort(..), Step::Aborting { claim }) => {
                if ours(claim) {
                    t.etcd.claim[v] = None;
                }
                t.ghost[v].aborted = true;
                t.ctrls[c].runs[v] = None;
            }
            _ => return None,
        }
        Some(t)
    }
}

/// The `sometimes` property `$name`: a step recorded `seen::$flag`. (A macro: a
/// property's condition is a `fn` pointer, which cannot capture the flag.)
macro_rules! sometimes_seen {
    ($name:expr, $flag:ident) => {
        Property::sometimes($name, |_, s: &State| s.seen & seen::$flag != 0)
    };
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        // Only plausibly enabled actions (next_state has the exact conditions): this is
        // a speed filter, not a semantic one.
        let b = &s.budget;
        for n in 0..N as u8 {
            let i = n as usize;
            match s.agents[i].phase {
                Phase::Offline => out.extend([Action::Join(n), Action::RefuseRestart(n)]),
                Phase::Joined => out.extend([Action::Unfence(n), Action::RefuseRestart(n)]),
                Phase::Unfenced => out.push(Action::ClaimArena(n)),
                Phase::Active => out.extend([Action::Quiesce(n), Action::ReleaseOwnArenas(n)]),
                Phase::Quiesced => out.push(Action::ReleaseOwnArenas(n)),
                Phase::Released => out.push(Action::Depart(n)),
                Phase::DepartedNotQuiesced => out.push(Action::Quiesce(n)),
            }
            if s.agents[i].phase != Phase::Offline {
                out.push(Action::SelfFence(n));
                if b.daemon_restarts > 0 {
                    out.push(Action::DaemonRestart(n));
                }
            }
            if b.reboots > 0 {
                out.push(Action::Reboot(n));
            }
            if b.unfences > 0 && s.etcd.member[i].is_none() && s.etcd.done[i].is_some() {
                out.push(Action::OperatorUnfence(n));
            }
            if b.expiries > 0 && s.etcd.member[i].is_some() {
                out.push(Action::LeaseExpired(n));
            }
            if s.etcd.claim[i].is_some() {
                out.push(Action::ClaimLeaseExpired(n));
            }
            if !s.reservation {
                out.push(Action::DeviceCheckAcquire(n));
            }
        }
        if b.releases > 0 && s.reservation {
            out.push(Action::ReservationReleased);
        }
        self.target_reset_actions(s, out);
        for c in 0..C as u8 {
            let ctrl = &s.ctrls[c as usize];
            if !ctrl.alive {
                out.push(Action::Restart(c));
                continue;
            }
            if !ctrl.watch.is_empty() {
                out.push(Action::WatchDelete(c));
                if b.watch_faults > 0 {
                    out.extend([Action::WatchCompacted(c), Action::WatchResume(c)]);
                }
            }
            out.push(Action::Sweep(c));
            if b.crashes > 0 {
                out.push(Action::Crash(c));
            }
            for v in 0..N as u8 {
                let Some(run) = ctrl.runs[v as usize] else {
                    continue;
                };
                match run.step {
                    Step::Owed { .. } => out.push(Action::FenceClaim(c, v)),
                    Step::Claimed { .. } => out.extend([
                        Action::FenceSever(c, v, true),
                        Action::FenceSever(c, v, false),
                    ]),
                    Step::SeverIssued { .. } => out.push(Action::FenceVerify(c, v)),
                    Step::Confirmed { .. } => out.push(Action::FenceBump(c, v)),
                    Step::Aborting { .. } => out.push(Action::FenceAbort(c, v)),
                }
                if b.step_errors > 0 {
                    out.push(Action::FenceStepError(c, v));
                }
            }
        }
    }

    fn next_state(&self, s: &State, act: Action) -> Option<State> {
        match act {
            Action::Join(_)
            | Action::Unfence(_)
            | Action::ClaimArena(_)
            | Action::Quiesce(_)
            | Action::ReleaseOwnArenas(_)
            | Action::Depart(_)
            | Action::SelfFence(_)
            | Action::DaemonRestart(_)
            | Action::RefuseRestart(_) => self.agent_step(s, act),
            Action::LeaseExpired(_)
            | Action::ClaimLeaseExpired(_)
            | Action::Crash(_)
            | Action::Restart(_)
            | Action::Reboot(_)
            | Action::OperatorUnfence(_)
            | Action::ReservationReleased
            | Action::DeviceCheckAcquire(_) => self.env_step(s, act),
            Action::WatchDelete(_)
            | Action::WatchCompacted(_)
            | Action::WatchResume(_)
            | Action::Sweep(_) => self.watch_step(s, act),
            Action::TargetLostState | Action::Recover(_) | Action::RecoverCheck(_) => {
                self.target_reset_step(s, act)
            }
            _ => self.fence_step(s, act),
        }
    }

    fn format_action(&self, action: &Action) -> String {
        action.to_string()
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            // Issue 27: while the target's lost state leaves no reservation, every host
            // writes; I1 holds again once one is held.
            Property::always(I1_ARENA, |_, s: &State| {
                s.window_open()
                    || (0..N).all(|n| {
                        (0..A).all(|a| {
                            !s.can_write(n, a)
                                || (s.etcd.owner[a] == Some(n as u8) && !s.etcd.free[a])
                        })
                    })
            }),
            Property::always(I2_MONOTONIC, |_, s: &State| {
                // generation only ever moves by the +1 of a counted bump.
                (0..N).all(|n| s.etcd.generation[n] >= s.ghost[n].bumps)
            }),
            Property::always(I2_ONCE, |_, s: &State| {
                (0..N).all(|n| s.ghost[n].bumps <= 1)
            }),
            Property::always(I2_CLEAN_NOT_BUMPED, |_, s: &State| {
                (0..N).all(|n| s.ghost[n].end != End::Departed || s.ghost[n].bumps == 0)
            }),
            Property::always(I2_MEMBER_NOT_BUMPED, |_, s: &State| !s.member_bumped),
            Property::always(I4_NO_SELF_EXEMPTION, |_, s: &State| {
                (0..N).all(|n| s.etcd.departed[n].is_none() || s.ghost[n].end == End::Departed)
            }),
            Property::always(I5_UNCONFIRMED, |_, s: &State| !s.unconfirmed_bump),
            Property::always(I5_STAYS_OWED, |_, s: &State| {
                (0..N).all(|n| !s.ghost[n].owed || s.etcd.done[n].is_none())
            }),
            Property::sometimes(S_FENCED, |_, s: &State| {
                (0..N).any(|n| s.etcd.generation[n] >= 1 && s.etcd.done[n].is_some())
            }),
            sometimes_seen!(S_HONOURED, DEPARTURE_HONOURED),
            sometimes_seen!(S_CRASH_RECOVERED, CRASH_RECOVERED_BY_SWEEP),
            sometimes_seen!(S_JOIN_DROPS_INTENT, JOIN_DROPPED_INTENT),
            sometimes_seen!(S_DEPART_REFUSED, DEPART_REFUSED),
            sometimes_seen!(S_ABORTED_THEN_FENCED, ABORTED_THEN_FENCED),
            sometimes_seen!(S_CLAIM_LOST, CLAIM_LOST_AT_BUMP),
            sometimes_seen!(S_STALE_SNAPSHOT, STALE_SNAPSHOT_REFUSED),
            sometimes_seen!(S_LOST_EVENT, LOST_EVENT_FENCED_BY_SWEEP),
            Property::sometimes(S_ARENA_REASSIGNED, |_, s: &State| {
                s.etcd.owner[0] == Some(0) && s.etcd.generation[1] >= 1
            }),
        ];
        if self.cfg.fencer == FencerKind::Nvme {
            props.push(Property::always(I1_FENCED_NO_WRITE, |_, s: &State| {
                s.window_open()
                    || (0..N).all(|n| {
                        (0..A).all(|a| {
                            !s.can_write(n, a) || s.etcd.generation[n] == s.writer_gen(n, a)
                        })
                    })
            }));
        }
        if self.cfg.host {
            props.push(sometimes_seen!(S_RESTART_REFUSED, RESTART_REFUSED));
            props.push(sometimes_seen!(S_REGISTER_REFUSED, REGISTER_REFUSED));
            props.push(sometimes_seen!(
                S_LEFT_THEN_REGISTERED,
                LEFT_THEN_REGISTERED
            ));
            props.push(sometimes_seen!(S_UNFENCE_REJOIN, UNFENCED_THEN_JOINED));
            props.push(sometimes_seen!(S_REBOOT_REJOIN, REBOOTED_THEN_JOINED));
        }
        if self.cfg.budget.target_resets > 0 {
            props.push(Property::sometimes(S_RECOVERED, |_, s: &State| {
                s.seen & SEEN_RECOVERED != 0
            }));
            props.push(Property::sometimes(S_PEER_RECOVERED, |_, s: &State| {
                s.seen & SEEN_PEER_RECOVERED != 0
            }));
        }
        if self.cfg.failed_start {
            props.push(Property::always(I6_GAVE_UP_NO_KEY, |_, s: &State| {
                (0..N).all(|n| !s.ghost[n].gave_up || !s.registered[n] || s.etcd.done[n].is_none())
            }));
            props.push(sometimes_seen!(
                S_FAILED_START_AFTER_FENCE,
                FAILED_START_AFTER_FENCE
            ));
            props.push(sometimes_seen!(
                S_FAILED_START_KEPT_EARLIER_KEY,
                FAILED_START_KEPT_EARLIER_KEY
            ));
        }
        if self.cfg.start_expired {
            props.push(Property::eventually(L3_FENCED, |_, s: &State| {
                !s.ghost[1].owed
            }));
        }
        props
    }
}

/// Invariant 1: no arena is free or owned by another node while a previous owner can
/// still write to it.
pub const I1_ARENA: &str =
    "I1 an arena is free or reassigned only once no previous owner can write";
/// Invariant 1 (NVMe): a node whose generation moved past the one it joined with
/// cannot write.
pub const I1_FENCED_NO_WRITE: &str = "I1 a fenced instance cannot write";
/// Invariant 2: the generation only moves by counted +1 bumps.
pub const I2_MONOTONIC: &str = "I2 generation monotonic";
/// Invariant 2: at most one bump per membership loss (the liveness check gives at
/// least one).
pub const I2_ONCE: &str = "I2 each departure bumps at most once";
/// Invariant 2: a clean departure is never bumped.
pub const I2_CLEAN_NOT_BUMPED: &str = "I2 a clean departure is never bumped";
/// A live member is never bumped.
pub const I2_MEMBER_NOT_BUMPED: &str = "I2 a live member is never bumped";
/// Invariant 4.
pub const I4_NO_SELF_EXEMPTION: &str = "I4 an expired node cannot exempt itself";
/// Invariant 5: a bump only after a confirmed severance (NVMe).
pub const I5_UNCONFIRMED: &str = "I5 an unconfirmed fence never bumps";
/// Invariant 5: an owed fence is never marked done without a bump.
pub const I5_STAYS_OWED: &str = "I5 an owed fence stays owed until bumped";
/// Invariant 6 (issue 26, hole 4): once a start gave up on a lost membership, the
/// device does not hold the node's key while its fence is confirmed (generation
/// bumped, `fence_done` written). The key is the host's, not the daemon's: any process
/// of a host the cluster gave up on writes with it, so the property is stated on the
/// key, not on the model's writers (none outlives a start that gave up).
pub const I6_GAVE_UP_NO_KEY: &str =
    "I6 a start that gave up leaves no key of a fenced node on the device";
/// Liveness (invariant 3).
pub const L3_FENCED: &str = "L3 an expired non-departed node is eventually fenced";
/// Reachability witnesses.
pub const S_FENCED: &str = "a fence completed";
/// Reachability.
pub const S_HONOURED: &str = "a departure honoured";
/// Reachability.
pub const S_CRASH_RECOVERED: &str = "a controller crash mid-fence recovered by the sweep";
/// Reachability.
pub const S_JOIN_DROPS_INTENT: &str = "a re-registration dropped the intent";
/// Reachability.
pub const S_DEPART_REFUSED: &str = "an expired node's departure refused";
/// Reachability.
pub const S_ABORTED_THEN_FENCED: &str = "an unconfirmed fence stayed owed and was completed";
/// Reachability.
pub const S_CLAIM_LOST: &str = "a bump refused because the claim was lost";
/// Reachability.
pub const S_STALE_SNAPSHOT: &str = "recheck_intent refused an aged sweep snapshot";
/// Reachability.
pub const S_LOST_EVENT: &str = "a lost watch event fenced by the sweep";
/// Reachability.
pub const S_ARENA_REASSIGNED: &str = "a fenced node's arena reassigned";
/// Reachability (host model).
pub const S_RESTART_REFUSED: &str = "a fenced node's restart on the same boot refused";
/// Reachability (host model).
pub const S_UNFENCE_REJOIN: &str = "a fenced node rejoined after an operator's unfence";
/// Reachability (host model).
pub const S_REBOOT_REJOIN: &str = "a fenced node rejoined after its host rebooted";
/// Reachability (host model).
pub const S_LEFT_THEN_REGISTERED: &str =
    "a start after a clean leave registered again on the same boot";
/// Reachability ([`Config::failed_start`]).
pub const S_FAILED_START_AFTER_FENCE: &str =
    "a start registered after its node's fence, lost its membership and gave up";
/// Reachability ([`Config::failed_start`]).
pub const S_FAILED_START_KEPT_EARLIER_KEY: &str =
    "a start that gave up left the key an earlier instance registered to the fence";
/// Reachability (host model).
pub const S_REGISTER_REFUSED: &str =
    "an instance that joined before a fence refused to register after it";
