//! Real servers for the workspace's integration tests and benches, started by the test
//! itself and killed by PID when dropped.
//!
//! - [`etcd::Etcd`]: a single-member etcd on free loopback ports with a temp data dir.
//! - [`etcd::EtcdVersion`]: the version of the etcd under test (`$FENCED_ETCD`), for
//!   the behaviours that differ between releases.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod etcd;

pub use etcd::{Etcd, EtcdVersion, etcd_binary, free_port, healthy};
