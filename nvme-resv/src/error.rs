//! The crate's error type.
/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
/// Errors (nvme-resv helper: complete).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {}
