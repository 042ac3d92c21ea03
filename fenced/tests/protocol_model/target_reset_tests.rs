//! Issue 27 (invariant 9): the target loses all reservation state. The rule and the
//! variants are in `protocol_model/target_reset.rs`; these are its checks.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use stateright::Model;

use super::model::*;
use super::{Mix, NONE, check, find, host_cfg};

/// One lease expiry (the fenced node: hung, its daemon still "active", or self-fenced
/// with its application still writing) and one lost target state, with the host model
/// (writers outlive their daemon). A controller crash and a sever failure in the mix.
const RESET: Budget = Budget {
    target_resets: 1,
    crashes: 1,
    sever_failures: 1,
    ..NONE
};

struct Window {
    states: usize,
    /// Terminal states with the window open (every host writes, forever).
    terminal_open: usize,
    /// ...of which one in which a fenced node (generation bumped) still writes.
    terminal_open_fenced_writes: usize,
    /// States from which no state with the window closed is reachable.
    trapped: usize,
}

/// The explicit state graph: does the window always close?
fn window_check(m: &ProtocolModel) -> Window {
    let mut index: HashMap<State, usize, BuildHasherDefault<Mix>> = HashMap::default();
    let mut states: Vec<State> = Vec::new();
    let mut succ: Vec<Vec<usize>> = Vec::new();
    let mut queue = VecDeque::new();
    for s in m.init_states() {
        index.insert(s.clone(), states.len());
        queue.push_back(states.len());
        states.push(s);
        succ.push(Vec::new());
    }
    let mut actions = Vec::new();
    while let Some(i) = queue.pop_front() {
        let s = states[i].clone();
        actions.clear();
        m.actions(&s, &mut actions);
        for a in actions.drain(..) {
            let Some(t) = m.next_state(&s, a) else {
                continue;
            };
            let j = *index.entry(t.clone()).or_insert_with(|| {
                queue.push_back(states.len());
                states.push(t);
                succ.push(Vec::new());
                states.len() - 1
            });
            succ[i].push(j);
        }
    }
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
    for (i, ns) in succ.iter().enumerate() {
        for &j in ns {
            pred[j].push(i);
        }
    }
    let mut good: Vec<bool> = states.iter().map(|s| !s.window_open()).collect();
    let mut work: Vec<usize> = (0..states.len()).filter(|&i| good[i]).collect();
    while let Some(j) = work.pop() {
        for &i in &pred[j] {
            if !good[i] {
                good[i] = true;
                work.push(i);
            }
        }
    }
    let open_terminal: Vec<&State> = (0..states.len())
        .filter(|&i| succ[i].is_empty() && states[i].window_open())
        .map(|i| &states[i])
        .collect();
    let fenced_writes =
        |s: &State| (0..N).any(|n| s.etcd.generation[n] > 0 && (0..A).any(|a| s.can_write(n, a)));
    Window {
        states: states.len(),
        terminal_open: open_terminal.len(),
        terminal_open_fenced_writes: open_terminal.iter().filter(|s| fenced_writes(s)).count(),
        trapped: good.iter().filter(|g| !**g).count(),
    }
}

/// The rule: live agents with an unchanged generation re-register (the first one also
/// re-acquires; a later one registers under it), fences still complete, invariant 1
/// holds outside the window, and the window always closes.
#[test]
fn lost_target_state_is_recovered_by_live_members_only() {
    let config = host_cfg(Protocol::SAFE, RESET);
    let o = check(config.clone());
    o.assert_safe(&[S_FENCED, S_RECOVERED, S_PEER_RECOVERED, S_ARENA_REASSIGNED]);
    let names: Vec<_> = o.model.properties().iter().map(|p| p.name).collect();
    assert!(names.contains(&I1_FENCED_NO_WRITE));
    let w = window_check(&ProtocolModel { cfg: config });
    eprintln!(
        "window: {} states, {} terminal open, {} trapped",
        w.states, w.terminal_open, w.trapped
    );
    assert_eq!(w.states, o.unique);
    assert_eq!(
        w.terminal_open, 0,
        "a terminal state with every host writing"
    );
    assert_eq!(w.trapped, 0, "states from which the window never closes");
    assert_eq!(
        (o.unique, o.total),
        (163_036, 612_955),
        "state count changed"
    );
}

/// The code before issue 27: "key gone" is a preempt, every live agent self-fences,
/// nobody registers again (the once-per-boot rule refuses a restart's registration),
/// and the fenced host's application writes forever: the window never closes.
#[test]
fn self_fencing_on_a_lost_state_leaves_the_fenced_host_writing() {
    let before = Protocol {
        target_reset: TargetReset::SelfFence,
        ..Protocol::SAFE
    };
    let w = window_check(&ProtocolModel {
        cfg: host_cfg(before, RESET),
    });
    eprintln!(
        "window (before): {} states, {} terminal open ({} with a fenced node writing), {} trapped",
        w.states, w.terminal_open, w.terminal_open_fenced_writes, w.trapped
    );
    assert!(w.terminal_open_fenced_writes > 0);
    assert!(w.trapped > 0);
}

/// BROKEN: re-registering whenever the key is gone after a lost state, without the
/// membership and generation check: the fenced node's hung daemon registers again and
/// its writes are accepted under the live members' reservation.
#[test]
fn re_registering_without_the_generation_check_is_caught() {
    let broken = Protocol {
        target_reset: TargetReset::RecoverUnchecked,
        ..Protocol::SAFE
    };
    let steps = find(host_cfg(broken, RESET), I1_FENCED_NO_WRITE).expect("I1 must be violated");
    let bump = steps.iter().position(|s| s.contains("[bump"));
    let lost = steps.iter().position(|s| s.contains("state lost"));
    let again = steps
        .iter()
        .position(|s| s.contains("re-register and acquire"));
    assert!(
        bump.is_some() && lost.is_some() && again > lost,
        "{steps:?}"
    );
}

/// BROKEN: the check and the registration as two unbounded steps: the lease expires
/// and the fence completes between them, and the registration lands after the fence.
#[test]
fn checking_then_registering_later_is_caught() {
    let broken = Protocol {
        target_reset: TargetReset::RecoverCheckThenRegister,
        ..Protocol::SAFE
    };
    let steps = find(host_cfg(broken, RESET), I1_FENCED_NO_WRITE).expect("I1 must be violated");
    let checked = steps
        .iter()
        .position(|s| s.contains("generation unchanged"));
    let expired = steps.iter().position(|s| s.contains("lease_expired"));
    let again = steps
        .iter()
        .position(|s| s.contains("re-register and acquire"));
    assert!(checked < expired && expired < again, "{steps:?}");
}
