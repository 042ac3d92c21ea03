//! The fencing protocol on etcd (work in progress).
