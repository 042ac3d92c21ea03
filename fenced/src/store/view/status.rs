//! `fenced status`: the key space as the operator sees it, one row per node that any
//! record names (owed fences and why, the last fence and the last failure).

use std::collections::{BTreeMap, HashSet};

use super::{Decoded, Findings, KeySpace, audit_items, effect};
use crate::core::attest::LivenessRecord;
use crate::keys::{AuditKind, Keys, Malformed, decode_node_id};
use crate::node::NodeId;
use crate::store::rows::{AuditItem, FenceSummary, NodeRow, Owed, Status, decode_liveness};

impl KeySpace {
    /// The operator's view: the records as they decode, and those that do not.
    pub(super) fn status(&self, k: &Keys) -> Status {
        let mut d = self.decode(k);
        let mut bad = Findings(std::mem::take(&mut d.malformed));
        let s = &d.snapshot;
        let name = |n: &NodeId| n.as_str().to_owned();
        let mut arenas = Vec::new();
        for kv in &self.arena_claims {
            match k.decode_arena_claim_key(kv.key()) {
                Ok((a, o)) => arenas.push((a, o.as_str().to_owned())),
                Err(e) => bad.add(kv, &e, effect::VIEW),
            }
        }
        let claimed: HashSet<&str> = arenas.iter().map(|(a, _)| a.as_str()).collect();
        let mut free_arenas = Vec::new();
        for kv in &self.arena_pool {
            match k.decode_arena_key(&k.arena_pool_prefix(), kv.key()) {
                Ok(a) if claimed.contains(a.as_str()) => {}
                Ok(a) => free_arenas.push(a),
                Err(e) => bad.add(kv, &e, effect::VIEW),
            }
        }
        for kv in &self.legacy_arenas {
            let owner_prefix = k.legacy_arena_owner_prefix();
            let (prefix, owned) = if kv.key().starts_with(owner_prefix.as_bytes()) {
                (owner_prefix, true)
            } else {
                (k.legacy_arena_free_prefix(), false)
            };
            let decoded = k.decode_arena_key(&prefix, kv.key()).and_then(|_| {
                if owned {
                    decode_node_id(kv.value()).map(|_| ())
                } else {
                    Ok(())
                }
            });
            match decoded {
                Ok(()) => bad.add(kv, &Malformed::LegacyArenaLayout, effect::LEGACY),
                Err(e) => bad.add(kv, &e, effect::VIEW),
            }
        }
        let mut liveness = BTreeMap::new();
        for kv in &self.liveness {
            if let Some(n) = bad.node(k, &k.liveness_prefix(), kv) {
                match decode_liveness(kv.value()) {
                    Ok(r) => {
                        liveness.insert(n, r);
                    }
                    Err(e) => bad.add(kv, &e, effect::VIEW),
                }
            }
        }
        let audits = audit_items(k, &self.audits, &mut bad);
        let nodes = rows(&d, &liveness, &audits);
        Status {
            members: s
                .members
                .iter()
                .map(|(n, i)| (name(n), i.clone()))
                .collect(),
            generations: s.generations.iter().map(|(n, g)| (name(n), g.0)).collect(),
            owed: s
                .pending
                .iter()
                .map(|(n, p)| (name(n), p.0.clone()))
                .collect(),
            done: d
                .done_generations
                .iter()
                .map(|(n, g)| (name(n), *g))
                .collect(),
            claims: d
                .claim_holders
                .iter()
                .map(|(n, h)| (name(n), h.clone()))
                .collect(),
            departed: s.departed.keys().map(name).collect(),
            arenas,
            free_arenas,
            audit_records: self.audit_records.max(self.audits.len()),
            malformed: bad.0,
            revision: self.revision,
            nodes,
        }
    }
}

/// One row per node any record names: the sweep's plan says which fences are owed and
/// why, the audit records which fences happened.
fn rows(
    d: &Decoded,
    liveness: &BTreeMap<NodeId, LivenessRecord>,
    audits: &[AuditItem],
) -> BTreeMap<String, NodeRow> {
    let s = &d.snapshot;
    let mut rows: BTreeMap<String, NodeRow> = BTreeMap::new();
    fn row<'a>(rows: &'a mut BTreeMap<String, NodeRow>, n: &NodeId) -> &'a mut NodeRow {
        rows.entry(n.as_str().to_owned()).or_default()
    }
    for n in s.generations.keys().chain(&s.unreadable_generations) {
        row(&mut rows, n).generation = s.generations.get(n).map(|g| g.0);
    }
    for (n, i) in &s.members {
        let r = row(&mut rows, n);
        r.member = true;
        r.instance = Some(i.clone()).filter(|i| !i.is_empty());
    }
    for (n, i) in &s.instances {
        let r = row(&mut rows, n);
        if r.instance.is_none() {
            r.instance = Some(i.clone()).filter(|i| !i.is_empty());
        }
    }
    for n in s.pending.keys().chain(s.done.keys()).chain(s.claims.iter()) {
        row(&mut rows, n);
    }
    for n in s.departed.keys() {
        row(&mut rows, n).departed = true;
    }
    for (n, g) in &d.done_generations {
        row(&mut rows, n).fenced_to = Some(*g);
    }
    for (n, h) in &d.claim_holders {
        row(&mut rows, n).claim_holder = Some(h.clone()).filter(|h| !h.is_empty());
    }
    for (n, a) in &d.arena_names {
        row(&mut rows, n).arenas = a.clone();
    }
    for (n, l) in liveness {
        let r = row(&mut rows, n);
        // Only an older agent's record, stamped at every renewal, dates a renewal.
        r.last_renewal_unix_ms = Some(l.unix_ms).filter(|_| l.refresh_ms == 0);
        r.liveness_stamp_unix_ms = Some(l.unix_ms);
        r.lease_ttl_ms = Some(l.ttl_ms);
        r.liveness_refresh_ms = Some(l.refresh_ms);
    }
    let plan = crate::core::plan_sweep(s);
    let owed = plan
        .fence
        .iter()
        .map(|o| (&o.victim.node, o.reason.clone()))
        .chain(
            plan.claimed
                .iter()
                .map(|n| (n, "claimed: a fence is in progress".to_owned())),
        );
    for (n, why) in owed {
        let since = liveness.get(n).map(|l| l.unix_ms);
        let r = row(&mut rows, n);
        r.owed = Some(Owed {
            why,
            intent_recorded: s.pending.contains_key(n),
            in_progress_by: r.claim_holder.clone(),
            since_unix_ms: since,
        });
    }
    for a in audits {
        if matches!(a.kind, AuditKind::Unfence { .. }) {
            // An operator's permission to register again, not a fence: `fenced audit`
            // shows it.
            continue;
        }
        let r = rows.entry(a.node.clone()).or_default();
        let summary = FenceSummary::of(&a.record);
        if a.failed {
            r.failed_attempts += 1;
            if r.last_failure
                .as_ref()
                .is_none_or(|l| l.unix_ms <= summary.unix_ms)
            {
                r.last_failure = Some(summary);
            }
        } else if r
            .last_fence
            .as_ref()
            .is_none_or(|l| l.generation_after <= summary.generation_after)
        {
            r.last_fence = Some(summary);
        }
    }
    rows
}
