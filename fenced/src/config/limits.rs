//! The ranges and relations every setting is checked against before `fenced run` touches etcd or a device.

/// Longest lease TTL: a fence starts about one TTL after a death.
pub const MAX_TTL_SECS: u64 = 600;
/// Longest self-fence margin.
pub const MAX_SELF_FENCE_MARGIN_SECS: u64 = 3600;
/// Shortest fence claim TTL: an etcd lease (2 s) plus the claim and finish round
/// trips of a fence that severs nothing (`--fencer none`).
pub const MIN_CLAIM_TTL_SECS: u64 = 3;
/// Shortest fence claim TTL with the NVMe fencer: a preempt and a report read
/// must fit in it on a healthy device.
pub const MIN_NVME_CLAIM_TTL_SECS: u64 = 10;
/// Longest fence claim TTL: a dead controller's claim blocks the fence this long.
pub const MAX_CLAIM_TTL_SECS: u64 = 3600;
/// Shortest sweep period: a sweep reads every key under the root; at 0 one idle
/// daemon sent 1,833 transactions in 5 s.
pub const MIN_SWEEP_SECS: u64 = 1;
/// Longest sweep period: the sweep is what catches a DELETE the watch missed.
pub const MAX_SWEEP_SECS: u64 = 3600;
/// Longest wait for etcd at start.
pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 86_400;
/// Most etcd endpoints.
pub const MAX_ENDPOINTS: usize = 16;
/// Longest key root.
pub const MAX_ROOT_LEN: usize = 128;
/// Most bytes of a config file.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Longest identifier (volume id, region, arena name).
pub const MAX_NAME_LEN: usize = 128;
/// Longest `--on-fence exec:` hook run: the daemon exits only after it.
pub const MAX_ON_FENCE_TIMEOUT_SECS: u64 = 600;
