//! `fenced`: the fencing protocol on etcd (seed 000 with the improvements of DESIGN.md).
//!
//! - [`core`]: the decision core (no I/O, no clock): fence state machine, sweep plan,
//!   departure rule, self-fencing watchdog.
//! - [`ports`]: the narrow store traits of the controller's fence path and membership
//!   watch and of the agent's join and leave, for etcd and in memory (the twin: unit
//!   tests of their logic, and `tests/twin.rs`, agents and a controller together).
//! - [`clock`]: the one wall-clock read (Unix milliseconds for records).
//! - [`keys`]: the etcd key layout under a configurable root.
//! - [`node`]: validated node ids; [`instance`]: the instance id rule.
//! - [`fencer`]: the `Fencer` trait and the NVMe, levels, none, attested and (cargo
//!   feature `ebs`, also reachable as `fenced::ebs`) EBS fencers.
//! - [`observe`] (also reachable as `fenced::metrics`): the daemon's Prometheus
//!   metrics, task health and readiness ([`observe::Observer`]), their HTTP endpoint
//!   and the systemd watchdog loop.
//! - [`notify`]: the systemd notification protocol (`READY=1`, `STATUS=`, `WATCHDOG=1`).
//! - [`fault`]: the `fence::<step>` fail points (cargo feature `failpoints`).
//!
//! # Glossary
//!
//! One name per concept. Where older code or the key layout uses another word, the
//! entry says what it means; new code uses the entry's word.
//!
//! - **owed fence** (*owed*): a node whose membership is gone and whose generation
//!   has not been bumped for it yet, so a controller must still fence it
//!   ([`core::FenceState::Owed`], [`store::Owed`] in `fenced status`). A fence stays
//!   owed through every failure until the bump. *Intent* is not a synonym: it is the
//!   durable record that a fence is owed, written by the `record_intent` step and
//!   deleted by `clear_intent` ([`core::FenceStep`]). *Pending* is only the name of
//!   that record's key, `fence_pending/<node>` ([`keys::Keys::pending`]), kept so
//!   existing clusters read the same; do not use it for the concept.
//! - **audit record**: what one fence attempt or one unfence leaves under
//!   `audit/<node>/<generation>` (`…failed.<ms>` for an attempt that did not bump,
//!   `…unfence.<ms>` for an operator's unfence). One type, [`core::AuditRecord`]:
//!   written by the controller's fence run and by `fenced unfence`, logged, and read
//!   back by `fenced audit` and `fenced status` ([`store::decode_audit`]), every field
//!   optional so older records still decode.
//! - **check** names four things, always qualified: `fenced check` (the operator's
//!   monitoring-plugin command, `ops/check.rs`); a *standby check*
//!   ([`core::FenceCheck`], `FenceStore::fence_check`: the one read a standby makes
//!   before claiming a death); a *device check* ([`core::check_device`]: whether the
//!   agent's key and reservation are still held); and the *settings checks* of
//!   `config/check.rs` (one setting against its rule). `check_claim_age` and
//!   `check_instance_id` are rules named for what they check.
//! - **guard** names three things, always qualified: the *generation guard*
//!   ([`guard::GenerationGuard`], the `generation-guard` crate: an application's
//!   metadata transaction conditioned on its node's generation, the second signal of
//!   fencing); the *claim guard* ([`core::ClaimGuard`]: what the claim transaction
//!   compares besides the claim); and the sweep's *snapshot guard*
//!   ([`core::SnapshotGuard`]: the revisions a sweep decided from, compared again by
//!   the `recheck_intent` step).
//! - **twin**: [`ports::mem::MemStore`], the in-memory store behind the same port
//!   traits as [`store::EtcdStore`] (the *adapter*); it holds the same guards and a
//!   revisioned membership log, not etcd's leases, gRPC or timing.
//! - **role** names two things: the *daemon role*, what `fenced run` runs (`agent`,
//!   `controller` or `both`, the `role` setting); and an *etcd role*, an etcd RBAC
//!   role granting one actor's writes (`fenced etcd-roles`, [`store::roles`]). Say
//!   "etcd role" for the second.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod agent;
pub mod clock;
pub mod controller;
pub mod core;
pub mod device;
pub mod fault;
pub mod fencer;
pub mod files;
pub mod guard;
pub mod instance;
pub mod keys;
pub mod node;
pub mod notify;
pub mod observe;
pub mod ports;
pub mod store;

#[cfg(feature = "ebs")]
pub use fencer::ebs;
pub use node::NodeId;
/// The daemon's metrics, task health and readiness under their former path (see
/// [`observe`]).
pub use observe as metrics;
