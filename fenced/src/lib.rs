//! `fenced`: the fencing protocol on etcd (seed 000 with the improvements of DESIGN.md).
//!
//! - [`core`]: the decision core (no I/O, no clock): fence state machine, sweep plan,
//!   departure rule, self-fencing watchdog.
//! - [`ports`]: the narrow store trait of the controller's fence path, for etcd and
//!   in memory (unit tests of the controller's logic).
//! - [`clock`]: the one wall-clock read (Unix milliseconds for records).
//! - [`keys`]: the etcd key layout under a configurable root.
//! - [`node`]: validated node ids.
//! - `ebs` (cargo feature `ebs`): the EBS force-detach fencer and fencing levels.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod agent;
pub mod clock;
pub mod controller;
pub mod core;
#[cfg(feature = "ebs")]
pub mod ebs;
pub mod fencer;
pub mod guard;
pub mod keys;
pub mod node;
pub mod ports;
pub mod store;

pub use node::NodeId;
