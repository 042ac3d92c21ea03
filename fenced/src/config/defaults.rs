//! The defaults, in one place.

/// etcd endpoint when none is configured.
pub const ETCD_ENDPOINT: &str = "http://127.0.0.1:2379";
/// Key root.
pub const ROOT: &str = "/fenced/";
/// Membership lease TTL.
pub const TTL_SECS: u64 = 5;
/// Shortest lease TTL accepted: etcd's own minimum (it silently lengthens
/// shorter leases).
pub const MIN_TTL_SECS: u64 = 2;
/// Self-fence margin, as a multiple of the lease TTL.
pub const SELF_FENCE_MARGIN_TTLS: u32 = 2;
/// Fence claim TTL.
pub const CLAIM_TTL_SECS: u64 = 120;
/// Reconciliation sweep period.
pub const SWEEP_SECS: u64 = 30;
/// Arenas claimed from the free pool.
pub const ARENAS: usize = 0;
/// Distinct operator identities an attested fence needs.
pub const APPROVALS: u32 = 1;
/// How long an attested fence waits for its second operator (`--approvals 2`).
pub const APPROVAL_TIMEOUT_SECS: u64 = 600;
/// Longest approval wait accepted.
pub const MAX_APPROVAL_TIMEOUT_SECS: u64 = 86_400;
/// Shortest etcd keepalive timeout accepted.
pub const MIN_ETCD_KEEPALIVE_TIMEOUT_SECS: u64 = 1;
