//! The rule of `fenced attest` (an operator-attested fence), pure: what etcd shows
//! about a node in, a verdict out. No I/O and no clock.
//!
//! Freshness is judged by etcd, never by comparing wall clocks across hosts: the
//! agent records in `liveness/<node>` which lease it renews ([`LivenessRecord`]), and
//! the attesting command asks etcd how long that lease has left
//! (`LeaseTimeToLive`, etcd's own clock). The record only has to *name* the lease, so
//! the agent writes it when it starts and then rarely (see
//! [`LivenessRecord::refresh_ms`]): the lease's renewals are the proof of life, and
//! they cost etcd no revision. A lease etcd still holds was renewed within
//! its TTL: the agent is alive. A lease etcd no longer holds was not renewed for a
//! whole TTL; the agent then self-fences at most its self-fence margin after its last
//! renewal, so without a device fence the command waits `margin - TTL` more (measured
//! on its own monotonic clock, an interval, not a date).
//!
//! A node is **known** when etcd holds any record that only a join, or a fence of a
//! node that joined, writes: `gen/`, `instance/`, `membership/`, `fence_pending/`,
//! `fence_done/`, `departed/` or `liveness/` (the sweep's known set, [`plan_sweep`],
//! plus the records a join writes first). A node with none of them never joined:
//! attesting it is a typo, and "fencing" it would invent a generation.
//!
//! A node is **already fenced** when it is not a member, no fence of it is owed
//! (`fence_pending/` absent) and a fence mark (`fence_done/`) stands: the mark is
//! written by the bump and deleted by the next join, so it says "fenced since its last
//! membership". Attesting it again reports the generation and changes nothing.
//!
//! [`plan_sweep`]: crate::core::plan_sweep

use std::time::Duration;

use crate::core::{SnapshotGuard, Victim};
use crate::node::NodeId;

/// What the agent records in `liveness/<node>`: which lease it renews, and the two
/// durations that bound how long it can outlive that lease. Written when the agent
/// starts and then every [`LivenessRecord::refresh_ms`] (fenced before this field
/// existed rewrote it at every renewal, TTL/3: ~0.6 etcd revisions/s per idle node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LivenessRecord {
    /// The membership lease the agent renews (etcd lease id).
    pub lease: i64,
    /// That lease's TTL in milliseconds.
    pub ttl_ms: u64,
    /// The agent's self-fence margin in milliseconds: it closes its I/O gate when its
    /// lease was not renewed for this long.
    pub margin_ms: u64,
    /// The agent's wall clock when it wrote the record (Unix ms): for people reading
    /// it (`fenced status`, `fenced check` date an owed fence by it), never compared
    /// with another host's clock by `fenced attest`.
    pub unix_ms: u64,
    /// How often the agent rewrites the record (ms): a node that stopped renewing its
    /// lease did so at most this long after `unix_ms` (plus its TTL). 0 in records of
    /// older versions, which rewrote it at every renewal.
    #[serde(default)]
    pub refresh_ms: u64,
}

impl LivenessRecord {
    /// The stored form (JSON).
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a stored record. A bare number is the form older versions wrote (a
    /// wall-clock stamp with no lease): it cannot be judged by etcd's clock.
    pub fn parse(value: &str) -> Result<Self, String> {
        if value.trim().parse::<u64>().is_ok() {
            return Err(format!(
                "{value:?} is a wall-clock stamp written by an older fenced (no lease to ask etcd about)"
            ));
        }
        serde_json::from_str(value).map_err(|e| format!("{value:?}: {e}"))
    }

    /// How long the agent may still run after etcd dropped its lease: it was last
    /// renewed at least a TTL before, and it self-fences a margin after that.
    pub fn outlives_lease_by(&self) -> Duration {
        Duration::from_millis(self.margin_ms.saturating_sub(self.ttl_ms))
    }
}

/// The node's liveness as etcd shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// No `liveness/<node>` record.
    Missing,
    /// A record that names no lease (older format) or does not parse.
    Unjudgeable {
        /// Why, in words.
        why: String,
    },
    /// The record names a lease and etcd answered how long it has left.
    Lease {
        /// The record.
        record: LivenessRecord,
        /// etcd's `LeaseTimeToLive` answer in seconds (<= 0: etcd no longer holds it).
        ttl_left_s: i64,
    },
}

/// Everything the rule looks at, read in one etcd transaction (plus the lease's TTL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestView {
    /// Any record of the node's known set exists (see the module docs).
    pub known: bool,
    /// `membership/<node>` exists.
    pub member: bool,
    /// `fence_claim/<node>`'s holder, when a controller holds a claim.
    pub claim: Option<String>,
    /// `gen/<node>` (0 when absent).
    pub generation: u64,
    /// `fence_pending/<node>`: instance id and mod revision.
    pub pending: Option<(String, i64)>,
    /// `fence_done/<node>`: generation marked and mod revision.
    pub done: Option<(u64, i64)>,
    /// `departed/<node>`: instance id and mod revision.
    pub departed: Option<(String, i64)>,
    /// `instance/<node>`: the instance id it last joined with.
    pub instance: Option<String>,
    /// `liveness/<node>` and etcd's answer about its lease.
    pub liveness: Liveness,
    /// Arenas its index `arena_node/<node>/` still lists.
    pub arenas: usize,
}

/// What the operator asked for besides the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttestRequest {
    /// `--force`: fence even when the node's liveness is fresh or unknown.
    pub force: bool,
    /// The attesting host preempts the node's key on the shared device first, so the
    /// node is cut off at once and no wait for its self-fence is needed.
    pub device_fence: bool,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Fence `victim`, with the claim guarded by `guard` (the records judged here are
    /// unchanged), after waiting `wait` for the node's agent to have self-fenced.
    Fence {
        /// The node and its instance id.
        victim: Victim,
        /// The mod revisions the claim compares.
        guard: SnapshotGuard,
        /// How long to wait before the claim (zero with a device fence or `force`).
        wait: Duration,
        /// The liveness evidence, in words, for the audit record.
        liveness: String,
    },
    /// Already fenced at `generation` since its last membership; nothing is owed.
    AlreadyFenced {
        /// Its generation.
        generation: u64,
        /// Arenas it still owns: non-zero only after a single-signal fence (no
        /// severance confirmed, so none were released). Attesting again does not
        /// release them: that would bump a second time for one departure (invariant 2).
        arenas: usize,
    },
}

/// Why an attestation is refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No record of the node exists.
    #[error(
        "refusing to fence {node}: no such node (it never joined: no gen/, instance/, membership/, fence or liveness record under this root); check --node-id and --root"
    )]
    Unknown {
        /// The node.
        node: NodeId,
    },
    /// Its membership key is present.
    #[error(
        "refusing to fence {node}: it is still a member (membership key present); stop it or let its lease expire first"
    )]
    StillMember {
        /// The node.
        node: NodeId,
    },
    /// A controller holds a fence claim on it.
    #[error(
        "refusing to fence {node}: controller {by} is fencing it now (claim held); check `fenced status` and retry if it does not complete"
    )]
    FenceInProgress {
        /// The node.
        node: NodeId,
        /// The claim's holder.
        by: String,
    },
    /// It left cleanly (departure marker, no arena owned): nothing to fence.
    #[error(
        "refusing to fence {node}: it left cleanly (departure marker written by instance {instance:?}, no arena owned), so nobody fences it and nothing is owed; its next start joins as usual. If you know it still writes (it came back outside fenced), use --force: it is then fenced, and its next start on the same boot is refused (exit 5) until a reboot or `fenced unfence --node-id {node}`"
    )]
    Departed {
        /// The node.
        node: NodeId,
        /// The instance that wrote the departure marker.
        instance: String,
    },
    /// Its liveness cannot be judged by etcd.
    #[error(
        "refusing to fence {node}: its liveness is unknown ({why}); use --force if you are certain it is gone"
    )]
    LivenessUnknown {
        /// The node.
        node: NodeId,
        /// Why.
        why: String,
    },
    /// etcd still holds the lease its agent renews: the agent renewed it within its TTL.
    #[error(
        "refusing to fence {node}: its agent is alive by etcd's clock (lease {lease:#x} it renews has {ttl_left_s}s of {ttl_s}s left); use --force if you are certain"
    )]
    LivenessFresh {
        /// The node.
        node: NodeId,
        /// The lease.
        lease: i64,
        /// etcd's answer.
        ttl_left_s: i64,
        /// The lease's TTL.
        ttl_s: u64,
    },
}

/// The attest rule. Refused (even with `force`) for an unknown node, a member, or a
/// node a controller is fencing; "already fenced" for a node fenced since its last
/// membership; refused (unless `force`) for a node that left cleanly, and while its
/// liveness is unknown or its lease alive; otherwise fenced, guarded by the revisions
/// read.
pub fn judge(node: &NodeId, view: &AttestView, req: AttestRequest) -> Result<Verdict, Refusal> {
    let node = node.clone();
    if !view.known {
        return Err(Refusal::Unknown { node });
    }
    if view.member {
        return Err(Refusal::StillMember { node });
    }
    if let Some(by) = &view.claim {
        return Err(Refusal::FenceInProgress {
            node,
            by: by.clone(),
        });
    }
    if view.pending.is_none()
        && let Some((generation, _)) = view.done
    {
        return Ok(Verdict::AlreadyFenced {
            generation: generation.max(view.generation),
            arenas: view.arenas,
        });
    }
    // A clean departure the controllers honour (no arena owned): fencing it would
    // bump its generation for nothing and refuse its next start on this boot.
    if let Some((instance, _)) = &view.departed
        && view.arenas == 0
        && view.pending.is_none()
        && !req.force
    {
        return Err(Refusal::Departed {
            node,
            instance: instance.clone(),
        });
    }
    let (wait, liveness) = match &view.liveness {
        _ if req.force => (
            Duration::ZERO,
            format!(
                "liveness not checked (--force): {}",
                describe(&view.liveness)
            ),
        ),
        Liveness::Missing => {
            return Err(Refusal::LivenessUnknown {
                node,
                why: "no liveness record".to_owned(),
            });
        }
        Liveness::Unjudgeable { why } => {
            return Err(Refusal::LivenessUnknown {
                node,
                why: why.clone(),
            });
        }
        Liveness::Lease { record, ttl_left_s } if *ttl_left_s > 0 => {
            return Err(Refusal::LivenessFresh {
                node,
                lease: record.lease,
                ttl_left_s: *ttl_left_s,
                ttl_s: record.ttl_ms / 1000,
            });
        }
        Liveness::Lease { record, .. } => (
            if req.device_fence {
                Duration::ZERO
            } else {
                record.outlives_lease_by()
            },
            describe(&view.liveness),
        ),
    };
    // The intent's instance, else the departure marker's, else the one recorded at
    // join (the sweep's order).
    let instance = [
        view.pending.as_ref().map(|(i, _)| i),
        view.departed.as_ref().map(|(i, _)| i),
        view.instance.as_ref(),
    ]
    .into_iter()
    .flatten()
    .find(|i| !i.is_empty())
    .cloned()
    .unwrap_or_default();
    Ok(Verdict::Fence {
        victim: Victim { node, instance },
        guard: SnapshotGuard {
            pending_rev: view.pending.as_ref().map_or(0, |p| p.1),
            done_rev: view.done.map_or(0, |d| d.1),
            departed_rev: view.departed.as_ref().map_or(0, |d| d.1),
        },
        wait,
        liveness,
    })
}

fn describe(l: &Liveness) -> String {
    match l {
        Liveness::Missing => "no liveness record".to_owned(),
        Liveness::Unjudgeable { why } => format!("liveness unknown: {why}"),
        Liveness::Lease { record, ttl_left_s } if *ttl_left_s > 0 => format!(
            "lease {:#x} alive in etcd ({ttl_left_s}s left)",
            record.lease
        ),
        Liveness::Lease { record, .. } => format!(
            "lease {:#x} gone from etcd (TTL {} ms, self-fence margin {} ms)",
            record.lease, record.ttl_ms, record.margin_ms
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n1() -> NodeId {
        NodeId::new("n1").unwrap()
    }

    const RECORD: LivenessRecord = LivenessRecord {
        lease: 0x1234,
        ttl_ms: 5_000,
        margin_ms: 10_000,
        unix_ms: 1_800_000_000_000,
        refresh_ms: 30_000,
    };

    /// A node that joined, was a member, and whose lease etcd no longer holds.
    fn gone() -> AttestView {
        AttestView {
            known: true,
            member: false,
            claim: None,
            generation: 4,
            pending: None,
            done: None,
            departed: None,
            instance: Some("i-1".to_owned()),
            liveness: Liveness::Lease {
                record: RECORD,
                ttl_left_s: -1,
            },
            arenas: 0,
        }
    }

    const PLAIN: AttestRequest = AttestRequest {
        force: false,
        device_fence: false,
    };
    const FORCE: AttestRequest = AttestRequest {
        force: true,
        device_fence: false,
    };

    #[test]
    fn an_unknown_node_is_refused_even_with_force() {
        let view = AttestView {
            known: false,
            liveness: Liveness::Missing,
            instance: None,
            generation: 0,
            ..gone()
        };
        for req in [PLAIN, FORCE] {
            let e = judge(&n1(), &view, req).unwrap_err();
            assert_eq!(e, Refusal::Unknown { node: n1() });
            assert!(e.to_string().contains("no such node"), "{e}");
        }
    }

    #[test]
    fn a_member_or_a_fence_in_progress_is_refused_even_with_force() {
        for req in [PLAIN, FORCE] {
            let e = judge(
                &n1(),
                &AttestView {
                    member: true,
                    ..gone()
                },
                req,
            )
            .unwrap_err();
            assert!(e.to_string().contains("still a member"), "{e}");
            let e = judge(
                &n1(),
                &AttestView {
                    claim: Some("n2/i-2".to_owned()),
                    ..gone()
                },
                req,
            )
            .unwrap_err();
            assert!(
                matches!(&e, Refusal::FenceInProgress { by, .. } if by == "n2/i-2"),
                "{e}"
            );
        }
    }

    #[test]
    fn missing_or_unjudgeable_liveness_is_refused_unless_forced() {
        for liveness in [
            Liveness::Missing,
            Liveness::Unjudgeable {
                why: "old format".to_owned(),
            },
        ] {
            let view = AttestView { liveness, ..gone() };
            let e = judge(&n1(), &view, PLAIN).unwrap_err();
            assert!(matches!(e, Refusal::LivenessUnknown { .. }), "{e}");
            assert!(e.to_string().contains("use --force"), "{e}");
            let v = judge(&n1(), &view, FORCE).unwrap();
            assert!(
                matches!(&v, Verdict::Fence { wait, liveness, .. } if wait.is_zero() && liveness.contains("--force")),
                "{v:?}"
            );
        }
    }

    #[test]
    fn a_lease_etcd_still_holds_is_fresh_whatever_the_stamp_says() {
        // The stamp is from 1970 (a victim with a broken clock): only etcd's answer
        // about the lease counts.
        let view = AttestView {
            liveness: Liveness::Lease {
                record: LivenessRecord {
                    unix_ms: 0,
                    ..RECORD
                },
                ttl_left_s: 3,
            },
            ..gone()
        };
        let e = judge(&n1(), &view, PLAIN).unwrap_err();
        assert_eq!(
            e,
            Refusal::LivenessFresh {
                node: n1(),
                lease: 0x1234,
                ttl_left_s: 3,
                ttl_s: 5
            }
        );
        assert!(e.to_string().contains("alive by etcd's clock"), "{e}");
        assert!(judge(&n1(), &view, FORCE).is_ok());
    }

    #[test]
    fn a_lease_etcd_dropped_waits_out_the_self_fence_margin_unless_the_device_is_fenced() {
        // A stamp far in the future changes nothing either.
        let mut view = gone();
        if let Liveness::Lease { record, .. } = &mut view.liveness {
            record.unix_ms = u64::MAX;
        }
        let Verdict::Fence {
            victim,
            guard,
            wait,
            liveness,
        } = judge(&n1(), &view, PLAIN).unwrap()
        else {
            panic!("not fenced")
        };
        assert_eq!(wait, Duration::from_secs(5));
        assert_eq!(victim.instance, "i-1");
        assert_eq!(guard, SnapshotGuard::default());
        assert!(liveness.contains("gone from etcd"), "{liveness}");
        let req = AttestRequest {
            force: false,
            device_fence: true,
        };
        assert!(matches!(
            judge(&n1(), &view, req).unwrap(),
            Verdict::Fence { wait, .. } if wait.is_zero()
        ));
    }

    #[test]
    fn a_node_fenced_since_its_last_membership_is_already_fenced() {
        let view = AttestView {
            done: Some((5, 40)),
            generation: 5,
            arenas: 2,
            ..gone()
        };
        for req in [PLAIN, FORCE] {
            assert_eq!(
                judge(&n1(), &view, req).unwrap(),
                Verdict::AlreadyFenced {
                    generation: 5,
                    arenas: 2
                }
            );
        }
        // Marked done but an intent recorded since: a fence is owed, guarded by both.
        let view = AttestView {
            pending: Some((String::new(), 41)),
            departed: Some(("i-0".to_owned(), 7)),
            ..view
        };
        let Verdict::Fence { victim, guard, .. } = judge(&n1(), &view, PLAIN).unwrap() else {
            panic!("not fenced")
        };
        assert_eq!(victim.instance, "i-0");
        assert_eq!(
            guard,
            SnapshotGuard {
                pending_rev: 41,
                done_rev: 40,
                departed_rev: 7
            }
        );
    }

    #[test]
    fn a_node_that_left_cleanly_is_refused_unless_forced() {
        let view = AttestView {
            departed: Some(("i-9".to_owned(), 12)),
            ..gone()
        };
        let e = judge(&n1(), &view, PLAIN).unwrap_err();
        assert!(matches!(e, Refusal::Departed { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("left cleanly") && text.contains("--force"),
            "{text}"
        );
        assert!(text.contains("fenced unfence --node-id n1"), "{text}");
        // Forced: fenced, guarded by the marker's revision.
        let Verdict::Fence { guard, .. } = judge(&n1(), &view, FORCE).unwrap() else {
            panic!("not fenced")
        };
        assert_eq!(guard.departed_rev, 12);
        // A departure the controllers do not honour (arenas still owned) is fenced.
        let owning = AttestView { arenas: 1, ..view };
        assert!(matches!(
            judge(&n1(), &owning, PLAIN).unwrap(),
            Verdict::Fence { .. }
        ));
    }

    #[test]
    fn records_round_trip_and_the_old_format_is_unjudgeable() {
        assert_eq!(LivenessRecord::parse(&RECORD.encode()), Ok(RECORD));
        let e = LivenessRecord::parse("1800000000000").unwrap_err();
        assert!(e.contains("older fenced"), "{e}");
        assert!(LivenessRecord::parse("{").is_err());
        // What the previous version wrote at every renewal (no `refresh_ms`) still
        // names its lease.
        let per_renewal =
            r#"{"lease":4660,"ttl_ms":5000,"margin_ms":10000,"unix_ms":1800000000000}"#;
        assert_eq!(
            LivenessRecord::parse(per_renewal),
            Ok(LivenessRecord {
                refresh_ms: 0,
                ..RECORD
            })
        );
        assert_eq!(RECORD.outlives_lease_by(), Duration::from_secs(5));
        let odd = LivenessRecord {
            margin_ms: 1,
            ..RECORD
        };
        assert_eq!(odd.outlives_lease_by(), Duration::ZERO);
    }
}
