//! A stateright model of the fencing protocol (issue 8, DESIGN.md invariants 1–5; issue
//! 14, invariant 6).
//!
//! The model is the protocol of `fenced/src` (store/ transactions, controller.rs
//! driver, core/ decisions, agent/ start/run/leave) reduced to what decides
//! safety: which etcd keys exist, which keys the device holds, which I/O gates are open.
//! Everything runs exhaustively (BFS) from one initial state:
//!
//! - 2 nodes, 2 controllers, 1 arena. `n0` is starting (joined, registered, about to
//!   `claim_arena`); `n1` is active and owns and writes `a0`. Both are known (`gen/`).
//! - etcd is linearizable: every transaction of store/ is one atomic model step.
//!   Revisions are modelled only where the code compares them: `mod_revision` of
//!   `fence_pending`/`fence_done`/`departed` (the sweep's `recheck_intent`) and the
//!   claim's `create_revision` (the finishing transaction) are per-key stamps that
//!   change on every write and read 0 when absent, exactly as etcd compares them.
//!   `gen/` is compared by value (it only moves by +1 bumps, so value = revision).
//! - Leases: `membership/<node>` disappears by `lease_expired` (any time, budgeted);
//!   `fence_claim/<node>` disappears by `claim lease expired` — freely once its run is
//!   gone (time passes), and under a live run only as a budgeted fault (the TTL
//!   assumption broken), which the finishing transaction's claim compare must survive.
//! - The membership watch is a per-controller queue of DELETEs. Faults:
//!   `watch_compacted` loses the next event (compacted resume: "restart from now"),
//!   `watch_resume` re-delivers it (resume from an older revision). A crashed controller
//!   loses its queue and its runs; a restarted one watches from now. `sweep` is always
//!   enabled and is the authoritative path.
//! - A controller runs at most one fence per victim at a time (a second concurrent run
//!   of the same controller is the same interleaving as the other controller's run; a
//!   DELETE for a victim with a run in flight waits in the queue).
//! - `crash at any step`: `c*: crash` between any two steps, and `step failed` (an etcd
//!   error or a fail point) ends one run after whatever it already wrote.
//! - The Fencer: NVMe (`sever` preempts; a budgeted fault keeps the key as if the
//!   preempt "succeeded" without effect; `verify` re-reads the report) or none
//!   (single-signal: no severance, arenas never released).
//! - A node "can write" arena `a` when its I/O gate is open, it uses `a`, and the device
//!   holds its key. Self-fencing is possible (lease lost, key preempted) but never
//!   forced: a hung node that keeps writing is the case the protocol exists for.
//! - Agents die only by `self_fence` or leaving; a crash of the agent process is the
//!   same as a `self_fence` after its lease expired. Fresh starts are budgeted.
//! - The host model (`Config::host`, issue 14): the writer is the host's application, a
//!   process apart from the daemon. A daemon that exits (`self_fence` with
//!   `--on-fence exit`, or a `daemon restart` by the service manager, budgeted) leaves
//!   it writing the arenas it had; it writes whenever the device holds the node's key.
//!   Each host has a boot id, recorded by `join`; a `host reboot` (budgeted) kills the
//!   daemon and every writer and changes the boot id. An operator's `unfence`
//!   (budgeted, refused while the node is a member) is modelled with what its audited
//!   reason attests: the node's daemon and applications were stopped first. Without the
//!   host model the writer dies with its daemon (every start is as good as one after a
//!   reboot), which is what the configurations before issue 14 check.
//! - Not modelled: the audit record, the operator-attested fence, the EBS fencer (its
//!   detach+poll is the same sever/verify pair), `drop_stale` as a separate transaction (it is guarded by
//!   live membership and, with `join` deleting intent and mark, has nothing to drop).
//!
//! | model action | implementation step (FenceStep / agent / watch names) | where |
//! |---|---|---|
//! | `n: join` | `join` + `read_own_generation` (one txn: membership on lease, drops `fence_pending`, `fence_done`, `departed`; refused while claimed) | store/membership.rs `join` |
//! | `n: unfence` | `unfence` (register key, WERO if none; host model: the boot id of the registration is recorded first) | agent/mod.rs `unfence` |
//! | `n: claim_arena` | `claim_arena` (adopt `owned_arenas`, claim free ones; open the I/O gate) | agent/mod.rs `claim_arenas` |
//! | `n: quiesce` | `quiesce` | agent/mod.rs `leave` |
//! | `n: release_own_arenas` | `unregister` (our key, checked gone), then `release_own_arenas` | agent/leave.rs `leave_steps`, store/arenas.rs `release_arena` |
//! | `n: depart` | `depart` (txn: membership live → put `departed`, delete membership; host model: `boot/<node>` by `leave` when this instance registered the key) | store/membership.rs `depart`, agent/mod.rs `leave_record` |
//! | `n: self_fence` | `self_fence` (lease lost / key preempted) | agent/mod.rs `run` |
//! | `n: refuse_restart` | `refuse_restart`: at start (fenced since the last join, same boot, no `unfence`: exit before `join`), or at `unfence` (key gone, this boot registered it already, no `unfence`: exit unregistered) | agent/mod.rs `start` |
//! | `n: daemon restart` | the service manager stops the daemon (its writer keeps running) | — |
//! | `n: host reboot` | reboot: new boot id, writers gone | — |
//! | `operator: unfence` | `fenced unfence --node-id N --reason ...` (refused while N is a member) | ops/ |
//! | `etcd: lease_expired` | `lease_expired` | etcd |
//! | `c: watch_delete` | `watch_delete` | controller.rs `watch_loop` |
//! | `c: watch_compacted` | `watch_compacted` | controller.rs `watch_loop` |
//! | `c: watch_resume` | `watch_resume` | controller.rs `watch_loop` |
//! | `c: sweep` | `sweep` (+ `drop_stale`) | controller.rs `sweep_once`, core/sweep.rs `plan_sweep` |
//! | `c: fence [record_intent, claim, recheck_intent?, read_generation]` | the claim txn | store/fence.rs `claim` |
//! | `c: fence [sever]` | `sever` | fencer/nvme.rs |
//! | `c: fence [verify]` | `verify` | fencer/nvme.rs |
//! | `c: fence [bump, mark_done, clear_intent, release_arenas?, release_claim]` | the finishing txn | store/fence.rs `finish` |
//! | `c: fence aborted [release_claim]` | abort txn (intent stays) | store/fence.rs `abort` |
//!
//! Findings against the code at 9866c49 (each has a test below that makes the
//! checker find it, and [`Protocol::SAFE`] has the fix):
//! 1. The watch path's claim ignores `fence_done`: a DELETE processed after another
//!    controller completed the fence re-fences and bumps twice (invariant 2).
//! 2. `release_arena` is conditioned only on the owner: a node whose lease already
//!    expired gives an arena back, another node claims it, and the pending fence's
//!    finishing transaction frees it under the new owner (invariant 1).
//! 3. `claim_arenas` adopts `owned_arenas` by a plain read: a node whose lease expired
//!    between `join` and `unfence` registers after the fence verified, adopts its old
//!    arena, and writes it after the fence released it (invariant 1).
//!
//! Issue 14, part 1 (invariant 6), against the code before it: a restarted daemon
//! joins and registers its key regardless of an earlier fence, so the application
//! its previous instance fed, still running, writes into an arena already handed to
//! another node (invariant 1). [`Protocol::SAFE`] refuses such a start
//! (`refuse_restart_after_fence`). Finding 4 against issue 14's rule as written (the
//! check at start only): an instance that joined before the fence passes the start
//! check and registers after the fence verified; the earlier instance's application
//! writes into the freed arena. [`Protocol::SAFE`] also registers at most once per
//! boot (`register_once_per_boot`, fence_scsi's rule: an instance that finds its key
//! gone on a boot that registered it already exits unregistered).
//!
//! Finding 5, issue 14 part 4: `quiesce` stops only this instance's writes; an
//! application an earlier instance left running still writes the arena `leave` gives
//! back. `unregister_before_release` closes it (in [`Protocol::SAFE`]: agent/leave.rs
//! unregisters the key first). A clean leave then also lets the next start on this
//! boot register again (`leave_allows_register`: the departure transaction writes a
//! `by: leave` boot record), but only when the leaving instance registered the key
//! itself: one that found it registered (an earlier instance's, whose application may
//! still run) keeps the join's record, or a start after its leave re-opens that
//! application's writes (`leave_allows_register_always`, BROKEN).
//!
//! Invariant 6 is checked for what it protects (no writer of the fenced host writes
//! again: I1 with writers that outlive their daemon), not literally. The first
//! registration on a new boot, or the first after an operator's `unfence`, can race a
//! fence (the device call and the etcd check are not one step) and land after it; no
//! writer exists then to use the key (writers start only from an instance that
//! registered, and its `claim_arena` needs live membership), and every later start on
//! that boot is refused. (A scratch ghost property for the literal reading reported
//! such traces as its first counter-examples; it is not kept, as it does not hold.)

#[path = "protocol_model/model.rs"]
mod model;

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use model::*;
use stateright::{Checker, HasDiscoveries, Model};

const NONE: Budget = Budget {
    expiries: 1,
    restarts: 0,
    departures: 0,
    crashes: 0,
    step_errors: 0,
    sever_failures: 0,
    claim_expiries: 0,
    watch_faults: 0,
    daemon_restarts: 0,
    reboots: 0,
    unfences: 0,
    releases: 0,
    target_resets: 0,
};

fn cfg(protocol: Protocol, budget: Budget) -> Config {
    Config {
        fencer: FencerKind::Nvme,
        protocol,
        budget,
        start_expired: false,
        host: false,
        failed_start: false,
    }
}

/// The host model: writers outlive their daemon; boot ids, reboots and `unfence`.
fn host_cfg(protocol: Protocol, budget: Budget) -> Config {
    Config {
        host: true,
        ..cfg(protocol, budget)
    }
}

/// One expiry, one departure.
const ONE_DEPARTURE: Budget = Budget {
    departures: 1,
    ..NONE
};

/// One expiry, one fresh start, one daemon restart, one reboot, one operator unfence.
const HOST: Budget = Budget {
    restarts: 1,
    daemon_restarts: 1,
    reboots: 1,
    unfences: 1,
    ..NONE
};

struct Outcome {
    unique: usize,
    total: usize,
    elapsed: Duration,
    discovered: HashSet<&'static str>,
    model: ProtocolModel,
}

fn check(config: Config) -> Outcome {
    let model = ProtocolModel { cfg: config };
    let t = Instant::now();
    let ch = model.clone().checker().spawn_bfs().join();
    let elapsed = t.elapsed();
    let discoveries = ch.discoveries();
    for (name, path) in &discoveries {
        if name.starts_with('I') || name.starts_with('L') {
            eprintln!("VIOLATION {name}:");
            for (_, a) in path.clone().into_vec() {
                if let Some(a) = a {
                    eprintln!("    {a}");
                }
            }
        }
    }
    let out = Outcome {
        unique: ch.unique_state_count(),
        total: ch.state_count(),
        elapsed,
        discovered: discoveries.keys().copied().collect(),
        model,
    };
    eprintln!(
        "states: {} unique, {} generated, max depth {}, {:?}",
        out.unique,
        out.total,
        ch.max_depth(),
        out.elapsed
    );
    out
}

impl Outcome {
    /// No `always`/`eventually` property has a counter-example, and each named
    /// `sometimes` property has an example.
    fn assert_safe(&self, sometimes: &[&str]) {
        let violated: Vec<_> = self
            .discovered
            .iter()
            .filter(|n| n.starts_with('I') || n.starts_with('L'))
            .collect();
        assert!(violated.is_empty(), "violated: {violated:?}");
        for s in sometimes {
            assert!(self.discovered.contains(s), "never reached: {s}");
        }
        // Every safety property was evaluated in this configuration.
        let names: Vec<_> = self.model.properties().iter().map(|p| p.name).collect();
        for inv in [
            I1_ARENA,
            I2_ONCE,
            I2_MONOTONIC,
            I4_NO_SELF_EXEMPTION,
            I5_UNCONFIRMED,
        ] {
            assert!(names.contains(&inv));
        }
    }
}

/// Checks `config` exhaustively: safe, each of `sometimes` reached (see
/// [`Outcome::assert_safe`]), and exactly `states` seen (unique, generated): the
/// pinned size of this configuration's state space.
fn check_safe(config: Config, sometimes: &[&str], states: (usize, usize)) -> Outcome {
    let o = check(config);
    o.assert_safe(sometimes);
    assert_eq!((o.unique, o.total), states, "state count changed");
    o
}

/// The first counter-example of `property` (BFS: a shortest one), or `None`.
fn find(config: Config, property: &'static str) -> Option<Vec<String>> {
    let model = ProtocolModel { cfg: config };
    let ch = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into_iter().collect()))
        .spawn_bfs()
        .join();
    let path = ch.discovery(property)?;
    let steps: Vec<String> = path
        .into_vec()
        .into_iter()
        .filter_map(|(_, a)| a.map(|a| a.to_string()))
        .collect();
    eprintln!("counter-example for {property:?}:");
    for s in &steps {
        eprintln!("    {s}");
    }
    Some(steps)
}

/// Asserts that no step of the counter-example `steps` contains any of `whats`.
fn assert_no_step(steps: &[String], whats: &[&str]) {
    for w in whats {
        assert!(!steps.iter().any(|s| s.contains(w)), "{w:?} in {steps:?}");
    }
}

// ---------------------------------------------------------------- the safe protocol

#[test]
fn safe_under_controller_crash_sever_failure_and_watch_faults() {
    check_safe(
        cfg(
            Protocol::SAFE,
            Budget {
                crashes: 1,
                sever_failures: 1,
                watch_faults: 1,
                ..NONE
            },
        ),
        &[
            S_FENCED,
            S_CRASH_RECOVERED,
            S_ABORTED_THEN_FENCED,
            S_LOST_EVENT,
            S_STALE_SNAPSHOT,
            S_ARENA_REASSIGNED,
        ],
        (58_694, 200_833),
    );
}

#[test]
fn safe_under_step_errors_claim_expiry_and_rejoin() {
    check_safe(
        cfg(
            Protocol::SAFE,
            Budget {
                restarts: 1,
                step_errors: 1,
                claim_expiries: 1,
                ..NONE
            },
        ),
        &[S_FENCED, S_CLAIM_LOST, S_JOIN_DROPS_INTENT],
        (66_693, 215_535),
    );
}

#[test]
fn safe_under_departure_and_rejoin() {
    check_safe(
        cfg(
            Protocol::SAFE,
            Budget {
                restarts: 1,
                departures: 1,
                ..NONE
            },
        ),
        &[S_FENCED, S_HONOURED, S_DEPART_REFUSED, S_ARENA_REASSIGNED],
        (82_940, 303_587),
    );
}

#[test]
fn safe_under_two_expiries() {
    check_safe(
        cfg(
            Protocol::SAFE,
            Budget {
                expiries: 2,
                ..NONE
            },
        ),
        &[S_FENCED, S_ARENA_REASSIGNED],
        (44_143, 206_587),
    );
}

#[test]
fn single_signal_mode_never_releases_arenas() {
    let o = check_safe(
        Config {
            fencer: FencerKind::None,
            ..cfg(
                Protocol::SAFE,
                Budget {
                    restarts: 1,
                    crashes: 1,
                    ..NONE
                },
            )
        },
        &[S_FENCED],
        (4_853, 15_170),
    );
    assert!(!o.discovered.contains(S_ARENA_REASSIGNED));
}

// ---------------------------------------------------------------- writers outliving their daemon

/// Invariant 6. n1's application outlives its daemon (`self_fence` or a restart by
/// the service manager); after n1 is fenced and `a0` handed to n0, a fresh start on
/// the same boot is refused, and n1 registers again only after its host rebooted or an
/// operator stopped the application and ran `unfence`.
#[test]
fn safe_when_writers_outlive_daemon_restarts() {
    let o = check_safe(
        host_cfg(Protocol::SAFE, HOST),
        &[
            S_FENCED,
            S_ARENA_REASSIGNED,
            S_RESTART_REFUSED,
            S_UNFENCE_REJOIN,
            S_REBOOT_REJOIN,
        ],
        (14_926, 51_203),
    );
    assert!(
        o.model
            .properties()
            .iter()
            .any(|p| p.name == I1_FENCED_NO_WRITE)
    );
}

// ---------------------------------------------------------------- liveness

/// Invariant 3. `n1` starts expired and still writing `a0`, its DELETE queued on both
/// watches. stateright's `eventually` is checked on paths to terminal states only
/// (a path closing a cycle or joining a visited state is not reported), so the same
/// property is also checked on the explicit state graph: every terminal state has no
/// owed fence, and from every reachable state a state with no owed fence is reachable
/// (no trap, under weak fairness of the controllers' steps).
#[test]
fn expired_node_is_eventually_fenced() {
    let config = Config {
        start_expired: true,
        ..cfg(
            Protocol::SAFE,
            Budget {
                expiries: 0,
                restarts: 1,
                crashes: 1,
                sever_failures: 1,
                watch_faults: 1,
                ..NONE
            },
        )
    };
    let o = check(config.clone());
    o.assert_safe(&[S_FENCED, S_CRASH_RECOVERED, S_ABORTED_THEN_FENCED]);
    assert!(o.model.properties().iter().any(|p| p.name == L3_FENCED));

    let g = graph_check(&ProtocolModel { cfg: config });
    eprintln!(
        "graph: {} states, {} terminal, {} settled",
        g.states, g.terminal, g.settled
    );
    assert_eq!(g.states, o.unique);
    assert!(g.terminal > 0);
    assert_eq!(g.terminal_owed, 0, "a terminal state still owes a fence");
    assert_eq!(g.trapped, 0, "states from which no fence can complete");
}

struct Graph {
    states: usize,
    terminal: usize,
    terminal_owed: usize,
    settled: usize,
    trapped: usize,
}

/// A cheap hasher for the graph's state index: in an unoptimized test build, SipHash
/// over a state's hundred-odd small fields was most of the graph check's time.
#[derive(Default)]
struct Mix(u64);

impl Hasher for Mix {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64);
    }
}

fn graph_check(m: &ProtocolModel) -> Graph {
    let owed = |s: &State| s.ghost.iter().any(|g| g.owed);
    let mut index: HashMap<State, usize, BuildHasherDefault<Mix>> = HashMap::default();
    let mut states: Vec<State> = Vec::new();
    let mut succ: Vec<Vec<usize>> = Vec::new();
    let mut queue = VecDeque::new();
    for s in m.init_states() {
        index.insert(s.clone(), 0);
        states.push(s);
        succ.push(Vec::new());
        queue.push_back(0);
    }
    let mut actions = Vec::new();
    while let Some(i) = queue.pop_front() {
        let s = states[i].clone();
        actions.clear();
        m.actions(&s, &mut actions);
        let mut next = Vec::new();
        for a in actions.drain(..) {
            if let Some(t) = m.next_state(&s, a) {
                let j = match index.get(&t) {
                    Some(&j) => j,
                    None => {
                        let j = states.len();
                        index.insert(t.clone(), j);
                        states.push(t);
                        succ.push(Vec::new());
                        queue.push_back(j);
                        j
                    }
                };
                next.push(j);
            }
        }
        succ[i] = next;
    }
    // Backward reachability from settled states.
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
    for (i, ns) in succ.iter().enumerate() {
        for &j in ns {
            pred[j].push(i);
        }
    }
    let mut good = vec![false; states.len()];
    let mut work: Vec<usize> = (0..states.len()).filter(|&i| !owed(&states[i])).collect();
    let settled = work.len();
    for &i in &work {
        good[i] = true;
    }
    while let Some(j) = work.pop() {
        for &i in &pred[j] {
            if !good[i] {
                good[i] = true;
                work.push(i);
            }
        }
    }
    let terminal: Vec<usize> = (0..states.len()).filter(|&i| succ[i].is_empty()).collect();
    Graph {
        states: states.len(),
        terminal: terminal.len(),
        terminal_owed: terminal.iter().filter(|&&i| owed(&states[i])).count(),
        settled,
        trapped: good.iter().filter(|g| !**g).count(),
    }
}

// ---------------------------------------------------------------- broken variants

/// The seed's counter-example (specs/FencingDepartureNotQuiescent.cfg): a node that
/// gives its arenas back and publishes its departure before it quiesces. The arena
/// returns to the free pool while its previous owner can still write to it.
#[test]
fn departure_before_quiescence_is_caught() {
    let broken = Protocol {
        depart_before_quiesce: true,
        ..Protocol::SAFE
    };
    let steps = find(cfg(broken, ONE_DEPARTURE), I1_ARENA)
        .expect("the checker must find the arena violation");
    assert!(steps.iter().any(|s| s.contains("release_own_arenas")));
    assert_no_step(&steps, &["quiesce"]);
    // The correct order, same budget: no violation.
    assert!(find(cfg(Protocol::SAFE, ONE_DEPARTURE), I1_ARENA).is_none());
}

/// A fence that bumps although `verify` found the key still registered.
#[test]
fn bump_without_confirmation_is_caught() {
    let broken = Protocol {
        bump_without_confirmation: true,
        ..Protocol::SAFE
    };
    let budget = Budget {
        sever_failures: 1,
        ..NONE
    };
    let steps = find(cfg(broken, budget), I5_UNCONFIRMED).expect("I5 must be violated");
    assert!(steps.iter().any(|s| s.contains("device keeps the key")));
    // And the victim's arena goes to the free pool while the victim still writes it.
    assert!(find(cfg(broken, budget), I1_ARENA).is_some());
}

/// A departure transaction not conditioned on live membership lets an expired node
/// exempt itself.
#[test]
fn unconditioned_departure_is_caught() {
    let broken = Protocol {
        depart_unconditioned: true,
        ..Protocol::SAFE
    };
    let steps =
        find(cfg(broken, ONE_DEPARTURE), I4_NO_SELF_EXEMPTION).expect("I4 must be violated");
    let expiry = steps.iter().position(|s| s.contains("lease_expired"));
    let depart = steps.iter().position(|s| s.contains("depart"));
    assert!(expiry < depart, "{steps:?}");
}

/// Finding 1: the watch path's claim without the `fence_done` check bumps twice.
#[test]
fn watch_claim_ignoring_done_mark_double_bumps() {
    let without = Protocol {
        watch_claim_requires_not_done: false,
        ..Protocol::SAFE
    };
    let steps = find(cfg(without, NONE), I2_ONCE).expect("double bump");
    assert!(
        steps.iter().filter(|s| s.contains("[bump")).count() >= 2,
        "{steps:?}"
    );
    assert!(find(cfg(Protocol::SAFE, NONE), I2_ONCE).is_none());
}

/// Finding 2: an expired node's owner-only-conditioned `release_arena`, with the
/// finishing transaction freeing the arenas it read at claim time.
#[test]
fn release_by_expired_node_lets_fence_free_a_reassigned_arena() {
    let without = Protocol {
        release_requires_live_membership: false,
        ..Protocol::SAFE
    };
    let budget = ONE_DEPARTURE;
    let steps = find(cfg(without, budget), I1_ARENA).expect("arena violation");
    assert!(steps.iter().any(|s| s.contains("release_own_arenas")));
    // Either fix closes it: the finishing transaction re-checking the owner...
    let finish_side = Protocol {
        finish_frees_only_victims_arenas: true,
        ..without
    };
    assert!(find(cfg(finish_side, budget), I1_ARENA).is_none());
    // ... or the release conditioned on live membership (SAFE).
    assert!(find(cfg(Protocol::SAFE, budget), I1_ARENA).is_none());
}

/// Finding 3: adopting recorded arenas by a plain read after a late `unfence`.
#[test]
fn adoption_by_plain_read_lets_a_fenced_instance_write() {
    let without = Protocol {
        adopt_requires_live_membership: false,
        ..Protocol::SAFE
    };
    // n1 starts expired; it restarts, rejoins and expires again.
    let config = |p| Config {
        start_expired: true,
        ..cfg(
            p,
            Budget {
                restarts: 1,
                ..NONE
            },
        )
    };
    let steps = find(config(without), I1_FENCED_NO_WRITE).expect("stale writer");
    assert!(steps.iter().any(|s| s.contains("unfence")));
    assert!(find(config(Protocol::SAFE), I1_FENCED_NO_WRITE).is_none());
}

/// Issue 14, part 1 (invariant 6): the code before it let a restarted daemon join and
/// register its key regardless. The application its previous instance fed kept
/// running, so it writes again into `a0`, already handed to n0 (invariant 1).
#[test]
fn restart_that_registers_regardless_lets_the_old_writer_write() {
    let old = Protocol {
        refuse_restart_after_fence: false,
        register_once_per_boot: false,
        ..Protocol::SAFE
    };
    let steps = find(host_cfg(old, HOST), I1_ARENA).expect("stale writer after a restart");
    let at = |what: &str| steps.iter().position(|s| s.contains(what));
    // Fenced (arena freed), then a fresh start on the same boot registers the key.
    let bump = at("[bump").expect("a fence completed");
    let join = at("n1: join").expect("n1 started again");
    assert!(bump < join, "{steps:?}");
    assert!(at("n1: unfence").is_some(), "{steps:?}");
    assert_no_step(&steps, &["reboot", "operator"]);
    assert!(find(host_cfg(old, HOST), I1_FENCED_NO_WRITE).is_some());
    // The refusal closes it, same budget: the one at start (issue 14's rule) alone...
    let start_check_only = Protocol {
        refuse_restart_after_fence: true,
        ..old
    };
    assert!(find(host_cfg(start_check_only, HOST), I1_ARENA).is_none());
    // ... and with the one at `unfence` (SAFE).
    assert!(find(host_cfg(Protocol::SAFE, HOST), I1_ARENA).is_none());
    // Without the host model (the writer dies with its daemon) the old code is safe:
    // the finding needs the writer that outlives the daemon.
    let no_host = Budget {
        daemon_restarts: 0,
        reboots: 0,
        unfences: 0,
        ..HOST
    };
    assert!(find(cfg(old, no_host), I1_ARENA).is_none());
}

/// Finding 4 (invariant 6): the refusal at start alone is not enough. An instance
/// that joined before the fence (so the start check passed) registers its key after
/// the fence verified, and the application an earlier instance fed, still running,
/// writes into the arena the fence freed. Registering at most once per boot
/// (`register_once_per_boot`, fence_scsi's rule) closes it.
#[test]
fn instance_joined_before_the_fence_registers_after_it() {
    let start_check_only = Protocol {
        register_once_per_boot: false,
        ..Protocol::SAFE
    };
    let budget = Budget {
        expiries: 2,
        restarts: 1,
        ..NONE
    };
    let steps = find(host_cfg(start_check_only, budget), I1_ARENA).expect("late registration");
    let at = |what: &str| steps.iter().position(|s| s.contains(what));
    let join = at("n1: join").expect("n1 started again");
    let verify = at("[verify]").expect("the fence verified");
    let unfence = at("n1: unfence").expect("n1 registered");
    assert!(join < verify && verify < unfence, "{steps:?}");
    assert_no_step(&steps, &["reboot", "operator"]);
    // Same budget, registration at most once per boot: safe.
    check_safe(
        host_cfg(Protocol::SAFE, budget),
        &[S_FENCED, S_ARENA_REASSIGNED, S_REGISTER_REFUSED],
        (86_622, 391_273),
    );
}

/// Finding 5 (issue 14, part 4): `quiesce` stops only this instance's writes. An
/// instance that started after its predecessor self-fenced (not fenced yet, so the
/// restart is allowed) adopts `a0`, leaves, and gives `a0` back while the application
/// the predecessor fed still writes it. Unregistering the key before
/// `release_own_arenas` closes it (`Protocol::SAFE`).
#[test]
fn leave_with_an_earlier_application_running_is_caught() {
    let budget = Budget {
        restarts: 1,
        departures: 1,
        ..NONE
    };
    let without = Protocol {
        unregister_before_release: false,
        ..Protocol::SAFE
    };
    let steps = find(host_cfg(without, budget), I1_ARENA).expect("stale writer");
    let at = |what: &str| steps.iter().position(|s| s.contains(what));
    let self_fence = at("n1: self_fence").expect("the first instance exited");
    let release = at("n1: release_own_arenas").expect("n1 gave a0 back");
    assert!(self_fence < release, "{steps:?}");
    assert!(at("[bump").is_none(), "not fenced: {steps:?}");
    check_safe(
        host_cfg(Protocol::SAFE, budget),
        &[S_FENCED, S_HONOURED, S_ARENA_REASSIGNED, S_REGISTER_REFUSED],
        (86_832, 314_493),
    );
}

/// A clean leave lets the next start on this boot register again (`by: leave`), but
/// only when the leaving instance registered the key itself. A daemon restart leaves
/// n1's application writing `a0`; the next instance finds the key registered, adopts
/// `a0`, leaves (unregistering the key, giving `a0` back, n0 claims it). If that leave
/// let the next start register (`leave_allows_register_always`), the application
/// writes `a0` again under n0. SAFE keeps the join's record then: that start is
/// refused, while a start after the leave of an instance that registered registers.
#[test]
fn a_leave_lets_the_next_start_register_only_if_it_registered() {
    let budget = Budget {
        restarts: 2,
        departures: 1,
        daemon_restarts: 1,
        ..NONE
    };
    let always = Protocol {
        leave_allows_register_always: true,
        ..Protocol::SAFE
    };
    let steps = find(host_cfg(always, budget), I1_ARENA).expect("stale writer");
    let at = |what: &str| steps.iter().position(|s| s.contains(what));
    let restart = at("n1: daemon restart").expect("the first daemon stopped");
    let depart = at("n1: depart").expect("n1 left");
    let unfence = steps
        .iter()
        .rposition(|s| s.contains("n1: unfence"))
        .expect("n1 registered again");
    assert!(restart < depart && depart < unfence, "{steps:?}");
    assert_no_step(&steps, &["reboot", "operator", "[bump"]);
    check_safe(
        host_cfg(Protocol::SAFE, budget),
        &[S_HONOURED, S_LEFT_THEN_REGISTERED, S_REGISTER_REFUSED],
        (248_430, 993_954),
    );
}

/// Issue 26, hole 1: the reservation is released while every key stays registered (a
/// holder's `nvme resv-release`). A preempt then only unregisters the victim's key;
/// with no reservation the victim still writes. The code before issue 26 took "key
/// gone" as the evidence and freed the victim's arena while it wrote it (I1). SAFE
/// acquires the reservation before the preempt and confirms only with one held.
#[test]
fn a_fence_confirmed_with_no_reservation_held_is_caught() {
    let before = Protocol {
        fence_needs_reservation: false,
        ..Protocol::SAFE
    };
    let budget = Budget {
        releases: 1,
        ..NONE
    };
    let steps = find(cfg(before, budget), I1_ARENA).expect("I1 must be violated");
    let released = steps
        .iter()
        .position(|s| s.contains("reservation released"));
    let verified = steps.iter().position(|s| s.contains("[verify]"));
    assert!(released.is_some() && released < verified, "{steps:?}");
    // The fix, same budget: every property holds, and fences still complete.
    check(cfg(Protocol::SAFE, budget)).assert_safe(&[S_FENCED]);
    // Also with a crash and a sever failure in the mix.
    let more = Budget {
        releases: 1,
        crashes: 1,
        sever_failures: 1,
        ..NONE
    };
    assert!(find(cfg(Protocol::SAFE, more), I1_ARENA).is_none());
}

#[path = "protocol_model/target_reset_tests.rs"]
mod target_reset_tests;

// ---------------------------------------------------------------- issue 26, hole 4

/// The host model with a failed start ([`Config::failed_start`]): `claim_arena` on a
/// lost membership is the start giving up.
fn failed_start_cfg(protocol: Protocol, budget: Budget) -> Config {
    Config {
        failed_start: true,
        ..host_cfg(protocol, budget)
    }
}

/// Issue 26, hole 4: registration after membership loss. n1 leaves cleanly (so the
/// next start on this boot may register), starts again, and loses its new membership
/// before `unfence`; the fence severs (nothing registered yet) and verifies; then
/// `unfence` registers (its membership check passed before the lease expired), the
/// fence bumps, and `claim_arena` finds the membership lost. The code before issue 26 gave up with
/// the key on the device of a host the cluster had given up on (I6), and the next
/// start on this boot is refused, so nothing removes it. SAFE unregisters the key this
/// start registered (only that one: a key an earlier instance registered is left to
/// the owed fence, which severs it).
#[test]
fn a_start_that_gave_up_after_registering_leaves_no_key() {
    let budget = Budget {
        restarts: 1,
        departures: 1,
        ..NONE
    };
    let before = Protocol {
        unregister_after_failed_start: false,
        ..Protocol::SAFE
    };
    let steps =
        find(failed_start_cfg(before, budget), I6_GAVE_UP_NO_KEY).expect("I6 must be violated");
    let last = |what: &str| steps.iter().rposition(|s| s.contains(what));
    let verify = last("[verify]").expect("the fence confirmed");
    let unfence = last(": unfence").expect("the start registered");
    let claim = last(": claim_arena").expect("the start gave up at claim_arena");
    assert!(verify < unfence && unfence < claim, "{steps:?}");
    assert!(last("[bump").is_some_and(|b| b < claim), "{steps:?}");
    assert_eq!(claim, steps.len() - 1, "{steps:?}");
    assert_no_step(&steps, &["reboot", "operator:"]);
    // Also without the host model.
    let no_host = Config {
        host: false,
        ..failed_start_cfg(before, budget)
    };
    assert!(find(no_host.clone(), I6_GAVE_UP_NO_KEY).is_some());
    // The fix, same budget: every property holds, and a start gives up after its
    // node's fence.
    check_safe(
        failed_start_cfg(Protocol::SAFE, budget),
        &[
            S_FENCED,
            S_HONOURED,
            S_LEFT_THEN_REGISTERED,
            S_FAILED_START_AFTER_FENCE,
        ],
        (98_725, 344_035),
    );
    let no_host = Config {
        protocol: Protocol::SAFE,
        ..no_host
    };
    assert!(find(no_host, I6_GAVE_UP_NO_KEY).is_none());
}

/// Issue 26, hole 4, the other side: a start that found the key registered by an
/// earlier instance (whose application may still write) and then gives up leaves
/// that key to the owed fence, which severs it: no fenced node's key stays, and no
/// writer writes a freed arena (I1), with two expiries and a restart.
#[test]
fn a_start_that_gave_up_leaves_an_earlier_instances_key_to_the_fence() {
    let budget = Budget {
        expiries: 2,
        restarts: 1,
        ..NONE
    };
    check_safe(
        failed_start_cfg(Protocol::SAFE, budget),
        &[
            S_FENCED,
            S_ARENA_REASSIGNED,
            S_FAILED_START_KEPT_EARLIER_KEY,
        ],
        (127_786, 549_037),
    );
}
