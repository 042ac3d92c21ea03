//! Real servers for the workspace's integration tests and benches, started by the test
//! itself and killed by PID when dropped.
//!
//! - [`etcd::Etcd`]: a single-member etcd on free loopback ports with a temp data dir.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod etcd;

pub use etcd::{Etcd, etcd_binary, free_port, healthy};
