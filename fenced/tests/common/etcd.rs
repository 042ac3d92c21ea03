//! A real etcd server for one test: the workspace's shared launcher
//! (`test-support`), started on free loopback ports with a temp data dir and killed by
//! PID on drop. The binary is `$FENCED_ETCD` (or `$FENCED_TEST_ETCD`), else
//! `/usr/bin/etcd`.

// Each test binary compiles this module and uses only part of it.
#[allow(unused_imports)]
pub use test_support::etcd::{Etcd, etcd_binary};
