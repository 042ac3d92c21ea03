//! Real servers for the workspace's integration tests and benches, started by the test
//! itself and killed by PID when dropped.
//!
//! - [`etcd::Etcd`]: a single-member etcd on free loopback ports with a temp data dir.
//! - [`cluster::EtcdCluster`]: an etcd cluster of N members on loopback, members
//!   killed and restarted by PID.
//! - [`tls::Pki`]: a test CA issuing server and client certificates (TLS etcd).
//! - [`etcd::EtcdVersion`]: the version of the etcd under test (`$FENCED_ETCD`), for
//!   the behaviours that differ between releases.
//! - [`process::wait_or_kill`]: a binary under test waited for until a deadline, then
//!   killed.
//! - `seed::put_all` (feature `seed`): a large key space written in batched
//!   transactions.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod cluster;
pub mod etcd;
pub mod process;
#[cfg(feature = "seed")]
pub mod seed;
pub mod tls;

pub use etcd::{Etcd, EtcdOptions, EtcdVersion, etcd_binary, free_port, healthy};
