//! The controller's small rules, decided here so its loops only drive: which nodes it
//! never fences itself ([`is_own_node`]), what a refused instance id becomes
//! ([`instance_or_unknown`]), how often a claim is retried ([`retry_claim`]), and which
//! owed fences wait for an operator instead of being retried ([`OperatorWaits`]).

use std::collections::BTreeMap;

use crate::instance::{InvalidInstanceId, check_instance_id};
use crate::node::NodeId;

/// Whether `node` is the controller's own node (`own_node`), which it never fences:
/// its own agent self-fences when it loses membership, and the peers fence it. Both
/// the watch path and the sweep ask.
pub fn is_own_node(own_node: Option<&NodeId>, node: &NodeId) -> bool {
    own_node == Some(node)
}

/// The instance id a fence runs with, from one read in etcd (a membership value, an
/// intent, `instance/`), where anyone with write access may have put anything. One
/// outside the rule ([`crate::instance`]) is fenced as "instance unknown" (the empty
/// id, which every consumer handles) and never reaches a fencer, an audit record or a
/// log line raw; the refusal is handed back for the caller to log. The empty id is
/// already "unknown" and is kept.
pub fn instance_or_unknown(instance: String) -> (String, Option<InvalidInstanceId>) {
    if instance.is_empty() {
        return (instance, None);
    }
    match check_instance_id(&instance) {
        Ok(()) => (instance, None),
        Err(e) => (String::new(), Some(e)),
    }
}

/// How many times a claim transaction that failed with a retryable store error is
/// sent again (so at most `CLAIM_RETRIES + 1` attempts); past them the fence fails at
/// the claim, still owed, and the sweep takes it up.
pub const CLAIM_RETRIES: u32 = 4;

/// Whether the claim attempt number `attempt` (0 first), which failed (`retryable`:
/// the store says the failure may pass), is sent again.
pub fn retry_claim(attempt: u32, retryable: bool) -> bool {
    retryable && attempt < CLAIM_RETRIES
}

/// Fences only an operator can complete (the fencer said
/// the fencer's `FenceCause::needs_operator`): node -> the
/// instance id it was attempted with. The sweep leaves these owed without trying
/// again until the node's record changes (another instance id), it is no longer owed,
/// or the daemon restarts: one attempt, one audit record, one error line each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OperatorWaits(BTreeMap<NodeId, String>);

impl OperatorWaits {
    /// A fence of `node` as `instance` needs an operator.
    pub fn record(&mut self, node: NodeId, instance: String) {
        self.0.insert(node, instance);
    }

    /// Forgets every node no longer owed a fence (`owed` says which are).
    pub fn keep_owed(&mut self, owed: impl Fn(&NodeId) -> bool) {
        self.0.retain(|node, _| owed(node));
    }

    /// Whether the owed fence of `node` as `instance` waits for an operator (not
    /// retried).
    pub fn waits(&self, node: &NodeId, instance: &str) -> bool {
        self.0.get(node).is_some_and(|i| i == instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn the_own_node_only_is_spared() {
        assert!(is_own_node(Some(&n("self")), &n("self")));
        assert!(!is_own_node(Some(&n("self")), &n("n1")));
        assert!(!is_own_node(None, &n("n1")));
    }

    #[test]
    fn an_instance_id_outside_the_rule_becomes_unknown() {
        assert_eq!(instance_or_unknown("i-1".into()), ("i-1".into(), None));
        assert_eq!(instance_or_unknown(String::new()), (String::new(), None));
        let (id, why) = instance_or_unknown("i-1\nforged".into());
        assert_eq!(id, "");
        assert!(matches!(
            why,
            Some(InvalidInstanceId::BadChar { ch: '\n', .. })
        ));
    }

    #[test]
    fn a_claim_is_tried_five_times_and_only_for_a_retryable_failure() {
        let tries = (0..).take_while(|&a| retry_claim(a, true)).count() + 1;
        assert_eq!(tries, 5);
        assert!(!retry_claim(0, false));
    }

    #[test]
    fn a_fence_waits_for_an_operator_until_its_record_changes_or_it_is_not_owed() {
        let mut w = OperatorWaits::default();
        assert!(!w.waits(&n("n1"), "i-1"));
        w.record(n("n1"), "i-1".into());
        assert!(w.waits(&n("n1"), "i-1"));
        // Another instance id: the record changed, try again.
        assert!(!w.waits(&n("n1"), "i-2"));
        w.keep_owed(|node| *node == n("n1"));
        assert!(w.waits(&n("n1"), "i-1"));
        w.keep_owed(|_| false);
        assert!(!w.waits(&n("n1"), "i-1"));
    }
}
