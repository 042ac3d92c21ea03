//! The reconciliation sweep's decision: from one read of the key space, which fences
//! are owed, which stale marks to drop, which departures to honour.

use std::collections::{BTreeMap, BTreeSet};

use super::{Victim, honour_departure};
use crate::node::NodeId;

/// One range-read view of the cluster, from which a sweep decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepSnapshot {
    /// `gen/<node>`: generation and mod revision.
    pub generations: BTreeMap<NodeId, (u64, i64)>,
    /// `fence_pending/<node>`: instance id and mod revision.
    pub pending: BTreeMap<NodeId, (String, i64)>,
    /// `fence_done/<node>`: mod revision.
    pub done: BTreeMap<NodeId, i64>,
    /// `membership/<node>`: instance id.
    pub members: BTreeMap<NodeId, String>,
    /// `departed/<node>`: instance id and mod revision.
    pub departed: BTreeMap<NodeId, (String, i64)>,
    /// Number of arenas each node owns.
    pub arenas: BTreeMap<NodeId, usize>,
    /// Nodes with a fence claim held right now.
    pub claims: BTreeSet<NodeId>,
    /// `instance/<node>`: the instance id each node last joined with.
    pub instances: BTreeMap<NodeId, String>,
    /// Nodes whose `gen/<node>` exists but does not decode. They stay known: a fence
    /// is owed when one is not a member (it is then attempted and fails at the
    /// generation read, never bumping, until the value is repaired).
    pub unreadable_generations: BTreeSet<NodeId>,
}

/// Revisions the sweep decided from: the claim transaction compares them, which is the
/// `recheck_intent` step (a snapshot that aged is not acted on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotGuard {
    /// `mod_revision` of `fence_pending/<node>` (0: absent).
    pub pending_rev: i64,
    /// `mod_revision` of `fence_done/<node>` (0: absent).
    pub done_rev: i64,
    /// `mod_revision` of `departed/<node>` (0: absent).
    pub departed_rev: i64,
}

/// A fence the sweep owes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepOwed {
    /// Who.
    pub victim: Victim,
    /// The snapshot revisions to re-check.
    pub guard: SnapshotGuard,
    /// Why (for the audit record).
    pub reason: String,
}

/// What a sweep does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Live members with a stale intent or done mark: drop them (it re-registered).
    pub drop_stale: Vec<NodeId>,
    /// Departed nodes whose marker is honoured (nothing owed).
    pub honoured: Vec<NodeId>,
    /// Fences owed.
    pub fence: Vec<SweepOwed>,
    /// Owed but claimed by someone right now: left to the claim holder.
    pub claimed: Vec<NodeId>,
}

/// Decides a sweep from a snapshot. Known nodes are those in `gen/` plus those with an
/// intent.
pub fn plan_sweep(s: &SweepSnapshot) -> SweepPlan {
    let mut plan = SweepPlan::default();
    let known: BTreeSet<&NodeId> = s
        .generations
        .keys()
        .chain(&s.unreadable_generations)
        .chain(s.pending.keys())
        .chain(s.done.keys())
        .chain(s.departed.keys())
        .collect();
    for node in known {
        let pending = s.pending.get(node);
        let done = s.done.get(node);
        if s.members.contains_key(node) {
            if pending.is_some() || done.is_some() {
                plan.drop_stale.push(node.clone());
            }
            continue;
        }
        let departed = s.departed.get(node);
        let arenas = s.arenas.get(node).copied().unwrap_or(0);
        let reason = if let Some(p) = pending {
            // The mark is written before the intent is cleared: marked-and-owed is owed.
            let _ = p;
            format!(
                "intent recorded{}",
                if done.is_some() {
                    " (also marked done)"
                } else {
                    ""
                }
            )
        } else if done.is_some() {
            continue; // fenced already, nothing owed
        } else if departed.is_some() && honour_departure(Some(arenas)) {
            plan.honoured.push(node.clone());
            continue;
        } else if departed.is_some() {
            format!("departure marker ignored: still owns {arenas} arena(s)")
        } else {
            "not a member and never fenced".to_owned()
        };
        if s.claims.contains(node) {
            plan.claimed.push(node.clone());
            continue;
        }
        // The intent's instance, else the departure marker's, else the one recorded
        // at join: a node whose membership vanished before anyone recorded an intent
        // (the watch missed or had not yet delivered the DELETE) is still EBS-fencible.
        let instance = [
            pending.map(|(i, _)| i),
            departed.map(|(i, _)| i),
            s.instances.get(node),
        ]
        .into_iter()
        .flatten()
        .find(|i| !i.is_empty())
        .cloned()
        .unwrap_or_default();
        plan.fence.push(SweepOwed {
            victim: Victim {
                node: node.clone(),
                instance,
            },
            guard: SnapshotGuard {
                pending_rev: pending.map_or(0, |p| p.1),
                done_rev: done.copied().unwrap_or(0),
                departed_rev: departed.map_or(0, |d| d.1),
            },
            reason,
        });
    }
    plan
}
