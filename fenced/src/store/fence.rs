//! The controller's transactions: claim (with its spare lease), finish, abort and
//! dropping a live member's stale records.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::{
    EtcdStore, Result, absent, count, id_text, kvs, parse_u64, prefix_keys_only, revision,
};
pub use crate::core::ClaimGuard;
use crate::core::{BumpOutcome, ClaimBudget, ClaimFacts, ClaimOutcome, Victim, claim_outcome};
use crate::keys::Keys;
use crate::node::NodeId;

/// The finishing transaction's request: bump `node`'s generation from `from`, mark
/// the fence done, clear the intent, release `release` (when given), write the audit
/// record and release our claim, guarded by the generation's `generation_rev` and our
/// `claim_rev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish<'a> {
    /// The fenced node.
    pub node: &'a NodeId,
    /// The generation the claim read; the bump writes `from + 1`.
    pub from: u64,
    /// `mod_revision` of `gen/<node>` the claim read (0: absent).
    pub generation_rev: i64,
    /// `create_revision` of our claim.
    pub claim_rev: i64,
    /// The arenas to release with the bump (`None`: keep them).
    pub release: Option<&'a [String]>,
    /// The audit record, as JSON.
    pub audit_json: String,
}

/// A failed fence's request: release our claim on `node` (only if it is still the one
/// created at `claim_rev`) and write the attempt's audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abort<'a> {
    /// The node whose fence failed.
    pub node: &'a NodeId,
    /// `create_revision` of our claim.
    pub claim_rev: i64,
    /// The node's generation (not bumped): the audit record is filed under it.
    pub generation: u64,
    /// When the attempt ended (ms since the Unix epoch): tells apart the audit records
    /// of several failed attempts at one generation.
    pub unix_ms: u64,
    /// The audit record, as JSON.
    pub audit_json: String,
}

/// A won claim: the generation (and its mod revision) from the `generation` read, the
/// victim's arenas from the `arenas` index read, and the claim's revision.
fn won(
    k: &Keys,
    generation: &TxnOpResponse,
    arenas: &TxnOpResponse,
    claim_rev: i64,
    lease_granted: Instant,
) -> Result<ClaimOutcome> {
    let (generation, generation_rev) = match kvs(generation).first() {
        Some(kv) => (parse_u64(kv)?, kv.mod_revision()),
        None => (0, 0),
    };
    let arenas = kvs(arenas)
        .iter()
        .filter_map(|kv| k.arena_node_of(kv.key()).map(|(_, a)| a))
        .collect();
    Ok(ClaimOutcome::Won {
        generation,
        generation_rev,
        claim_rev,
        arenas,
        lease_granted,
    })
}

impl EtcdStore {
    /// Makes sure a fresh spare lease is ready for the next claim (off the critical
    /// path). A spare older than [`ClaimBudget::spare_max_age`] (a quarter of the
    /// claim TTL) is replaced, so a claim always has at least three quarters of its
    /// TTL left when it is won. A spare's age is counted
    /// from before its grant was asked (the lease's TTL runs from the grant on the
    /// server) and is never reset: a spare put back after a refused claim keeps it.
    pub async fn prepare_claim_lease(&self) -> Result<()> {
        let max_age = ClaimBudget::new(self.claim_ttl).spare_max_age();
        {
            let spare = self.spare.lock().await;
            if let Some((_, at)) = *spare
                && at.elapsed() < max_age
            {
                return Ok(());
            }
        }
        let asked = Instant::now();
        let lease = self.grant(self.claim_ttl).await?;
        *self.spare.lock().await = Some((lease, asked));
        Ok(())
    }

    /// A lease for a claim and when its grant was asked: the spare while younger than
    /// [`ClaimBudget::spare_max_age`], else a new one.
    async fn take_claim_lease(&self) -> Result<(i64, Instant)> {
        let taken = self.spare.lock().await.take();
        match taken {
            Some((lease, at))
                if at.elapsed() < ClaimBudget::new(self.claim_ttl).spare_max_age() =>
            {
                Ok((lease, at))
            }
            _ => {
                let asked = Instant::now();
                Ok((self.grant(self.claim_ttl).await?, asked))
            }
        }
    }

    /// `record_intent` + `claim` (+ `recheck_intent`) + `read_generation`, one transaction.
    pub async fn claim(
        &self,
        victim: &Victim,
        controller: &str,
        guard: ClaimGuard,
    ) -> Result<ClaimOutcome> {
        let k = &self.keys;
        let n = &victim.node;
        let (lease, granted) = self.take_claim_lease().await?;
        let txn = claim_txn(k, victim, controller, lease, guard);
        let (resp, attempt) = self.send_claim(n, controller, txn).await?;
        let ops = resp.op_responses();
        if resp.succeeded() {
            return won(k, &ops[2], &ops[3], revision(&resp), granted);
        }
        if let Some(kv) = kvs(&ops[0]).first()
            && attempt > 1
            && kv.lease() == lease
        {
            // An earlier attempt landed. Nothing it read can have moved since: a
            // generation bump and an arena change need this claim or the victim's
            // membership, which a join cannot take while the claim exists.
            tracing::info!(step = "claim", node = %n, attempt, "an earlier claim attempt whose answer was lost had landed: the claim is ours");
            return won(k, &ops[5], &ops[3], kv.create_revision(), granted);
        }
        // The lease was not used: keep it as the spare, with its real age (issue 26,
        // hole 3: restamped here, a lease refused claim after refused claim grew old
        // while looking fresh, so a won claim could expire before the sever that
        // `check_claim_age` allowed; the controller now counts the lease's age from
        // `granted`, returned with a won claim).
        *self.spare.lock().await = Some((lease, granted));
        Ok(not_won(&ops, guard))
    }

    /// Sends the claim transaction, retrying while its outcome is unknown; returns the
    /// answer and the number of the attempt that got it.
    ///
    /// An answer lost to a timeout or a dead leader leaves the outcome unknown.
    /// Retry with the same lease: if an earlier attempt landed, the claim found
    /// carries our lease (a lease is used by at most one claim that landed) and is
    /// ours. Without this the claim in doubt blocked the fence until its lease
    /// expired (claim TTL, 120 s by default). An error that reaches the caller
    /// leaves the lease unused or holding a claim that expires with it.
    async fn send_claim(
        &self,
        n: &NodeId,
        controller: &str,
        txn: Txn,
    ) -> Result<(TxnResponse, u32)> {
        let t0 = Instant::now();
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r = self.fence_txn("claim", txn.clone(), attempt).await;
            let r = fail_answer_lost(r, attempt, controller);
            match r {
                Err(e) if e.is_retryable() && t0.elapsed() + delay < self.claim_ttl / 2 => {
                    tracing::warn!(step = "claim", node = %n, attempt, error = %e, "claim transaction failed, retrying (its outcome is checked)");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                r => return Ok((r?, attempt)),
            }
        }
    }

    /// `bump` + `mark_done` + `clear_intent` + `release_arenas` (when `release` is
    /// given) + audit record + `release_claim`, one transaction guarded by the
    /// generation compare and our claim.
    pub async fn finish(&self, req: Finish<'_>) -> Result<BumpOutcome> {
        let Finish {
            node,
            from,
            generation_rev,
            claim_rev,
            release,
            audit_json,
        } = req;
        let k = &self.keys;
        let to = from + 1;
        let mut ops = vec![
            TxnOp::put(k.generation(node), to.to_string(), None),
            TxnOp::put(k.done(node), to.to_string(), None),
            TxnOp::delete(k.pending(node), None),
        ];
        for arena in release.unwrap_or_default() {
            // The victim's claim only (free again: in the pool, unclaimed).
            ops.push(TxnOp::delete(k.arena_claim(arena, node), None));
            ops.push(TxnOp::delete(k.arena_node(node, arena), None));
        }
        ops.push(TxnOp::put(k.audit(node, to), audit_json.clone(), None));
        ops.push(TxnOp::delete(k.claim(node), None));
        let txn = Txn::new()
            .when(vec![
                Compare::mod_revision(k.generation(node), CompareOp::Equal, generation_rev),
                Compare::create_revision(k.claim(node), CompareOp::Equal, claim_rev),
            ])
            .and_then(ops)
            .or_else(vec![
                TxnOp::get(k.generation(node), None),
                TxnOp::get(k.claim(node), None),
                TxnOp::get(k.audit(node, to), None),
            ]);
        // A timeout or a lost leader leaves the outcome unknown: the transaction may
        // have been applied. Retrying is safe (it is conditioned on our claim and the
        // generation we read, both of which it consumes) and our own audit record
        // tells a retry that an earlier attempt applied. Without the retry the fence
        // waits for its claim to expire (claim TTL, 120 s by default) before the
        // sweep may take it up again: measured in tests/etcd_faults.rs, a leader
        // SIGKILLed during a fence dropped the proposal and the finish timed out.
        let t0 = Instant::now();
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        let resp = loop {
            attempt += 1;
            match self.fence_txn("finish", txn.clone(), attempt).await {
                Err(e) if e.is_retryable() && t0.elapsed() + delay < self.claim_ttl => {
                    tracing::warn!(step = "bump", node = %node, error = %e, "finishing transaction failed, retrying (its outcome is checked)");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                r => break r?,
            }
        };
        if resp.succeeded() {
            return Ok(BumpOutcome::Bumped);
        }
        let ops = resp.op_responses();
        if kvs(&ops[2])
            .first()
            .is_some_and(|kv| kv.value() == audit_json.as_bytes())
        {
            // An earlier attempt of ours was applied (its answer was lost).
            return Ok(BumpOutcome::Bumped);
        }
        let now = match kvs(&ops[0]).first() {
            Some(kv) => parse_u64(kv)?,
            None => 0,
        };
        let claim_ok = kvs(&ops[1])
            .first()
            .is_some_and(|kv| kv.create_revision() == claim_rev);
        if claim_ok {
            Ok(BumpOutcome::GenerationMoved { now })
        } else {
            Ok(BumpOutcome::ClaimLost)
        }
    }

    /// A failed fence: `release_claim` (only our own claim) and write the audit record
    /// of the attempt. The intent stays: the fence is still owed.
    pub async fn abort(&self, req: Abort<'_>) -> Result<()> {
        let Abort {
            node,
            claim_rev,
            generation,
            unix_ms,
            audit_json,
        } = req;
        let k = &self.keys;
        let audit_key = format!("{}.failed.{unix_ms}", k.audit(node, generation));
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.claim(node),
                CompareOp::Equal,
                claim_rev,
            )])
            .and_then(vec![
                TxnOp::delete(k.claim(node), None),
                TxnOp::put(audit_key.clone(), audit_json.clone(), None),
            ])
            .or_else(vec![TxnOp::put(audit_key, audit_json, None)]);
        self.txn("abort", txn).await?;
        Ok(())
    }

    /// A departure marker was honoured: nothing to write (the watch path wrote nothing).
    /// The sweep drops the stale intent and mark of a live member with this.
    pub async fn drop_stale(&self, node: &NodeId) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![Compare::version(
                k.membership(node),
                CompareOp::Greater,
                0,
            )])
            .and_then(vec![
                TxnOp::delete(k.pending(node), None),
                TxnOp::delete(k.done(node), None),
            ]);
        Ok(self.txn("drop_stale", txn).await?.succeeded())
    }
}

/// The claim transaction on `lease`: `record_intent` + `claim` + `read_generation` and
/// the victim's arena index when the claim is free, the victim not a member and
/// `guard` holds; otherwise it reads what refused it (see [`not_won`]).
fn claim_txn(k: &Keys, victim: &Victim, controller: &str, lease: i64, guard: ClaimGuard) -> Txn {
    let n = &victim.node;
    let mut when = vec![absent(k.claim(n)), absent(k.membership(n))];
    let not_fenced_since = |rev: i64| Compare::mod_revision(k.done(n), CompareOp::Less, rev);
    match guard {
        ClaimGuard::Watch { deleted_rev } => {
            when.push(absent(k.departed(n)));
            when.push(not_fenced_since(deleted_rev));
        }
        ClaimGuard::IgnoreDeparture { deleted_rev } => when.push(not_fenced_since(deleted_rev)),
        ClaimGuard::Sweep(g) => {
            when.push(Compare::mod_revision(
                k.pending(n),
                CompareOp::Equal,
                g.pending_rev,
            ));
            when.push(Compare::mod_revision(
                k.done(n),
                CompareOp::Equal,
                g.done_rev,
            ));
            when.push(Compare::mod_revision(
                k.departed(n),
                CompareOp::Equal,
                g.departed_rev,
            ));
        }
    }
    Txn::new()
        .when(when)
        .and_then(vec![
            TxnOp::put(k.pending(n), victim.instance.clone(), None),
            TxnOp::put(
                k.claim(n),
                controller,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(k.generation(n), None),
            TxnOp::get(k.arena_node_prefix(n), prefix_keys_only()),
        ])
        .or_else(vec![
            TxnOp::get(k.claim(n), None),
            TxnOp::get(k.membership(n), None),
            TxnOp::get(k.departed(n), None),
            TxnOp::get(k.arena_node_prefix(n), prefix_keys_only()),
            TxnOp::get(k.done(n), None),
            TxnOp::get(k.generation(n), None),
        ])
}

/// A claim that neither succeeded nor turned out to be ours, from the reads of the
/// claim transaction's `or_else` branch: the facts, ranked by [`claim_outcome`].
fn not_won(ops: &[TxnOpResponse], guard: ClaimGuard) -> ClaimOutcome {
    let facts = ClaimFacts {
        held_by: kvs(&ops[0]).first().map(id_text),
        member: !kvs(&ops[1]).is_empty(),
        departed: !kvs(&ops[2]).is_empty(),
        arenas: count(&ops[3]).max(kvs(&ops[3]).len()),
        done_rev: kvs(&ops[4]).first().map_or(0, |kv| kv.mod_revision()),
    };
    claim_outcome(guard, facts)
}

/// Fail point `store::claim::answer_lost` (tests; its argument names the controller
/// it applies to): the first attempt of the claim was applied, its answer is "lost".
#[cfg(feature = "failpoints")]
fn fail_answer_lost(r: Result<TxnResponse>, attempt: u32, controller: &str) -> Result<TxnResponse> {
    match r {
        Ok(_)
            if attempt == 1
                && fail::eval("store::claim::answer_lost", |who| {
                    who.as_deref() == Some(controller)
                }) == Some(true) =>
        {
            Err(super::StoreError::Unavailable {
                op: "claim",
                source: etcd_client::Error::GRpcStatus(tonic::Status::cancelled(
                    "fail point store::claim::answer_lost",
                )),
            })
        }
        r => r,
    }
}

/// Without the `failpoints` feature the answer is passed through.
#[cfg(not(feature = "failpoints"))]
fn fail_answer_lost(
    r: Result<TxnResponse>,
    _attempt: u32,
    _controller: &str,
) -> Result<TxnResponse> {
    r
}
