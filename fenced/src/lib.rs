//! `fenced`: the fencing protocol on etcd (seed 000 with the improvements of DESIGN.md).
//!
//! - [`core`]: the decision core (no I/O, no clock): fence state machine, sweep plan,
//!   departure rule, self-fencing watchdog.
//! - [`ports`]: the narrow store traits of the controller's fence path and the agent's
//!   leave, for etcd and in memory (unit tests of their logic).
//! - [`clock`]: the one wall-clock read (Unix milliseconds for records).
//! - [`keys`]: the etcd key layout under a configurable root.
//! - [`node`]: validated node ids; [`instance`]: the instance id rule.
//! - [`fencer`]: the `Fencer` trait and the NVMe, levels, none, attested and (cargo
//!   feature `ebs`, also reachable as `fenced::ebs`) EBS fencers.
//! - [`metrics`]: the daemon's Prometheus metrics, task health and readiness
//!   ([`metrics::Observer`]) and their HTTP endpoint.
//! - [`notify`]: the systemd notification protocol (`READY=1`, `STATUS=`, `WATCHDOG=1`).
//! - [`fault`]: the `fence::<step>` fail points (cargo feature `failpoints`).
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod agent;
pub mod clock;
pub mod controller;
pub mod core;
pub mod fault;
pub mod fencer;
pub mod files;
pub mod guard;
pub mod instance;
pub mod keys;
pub mod metrics;
pub mod node;
pub mod notify;
pub mod ports;
pub mod store;

#[cfg(feature = "ebs")]
pub use fencer::ebs;
pub use node::NodeId;
