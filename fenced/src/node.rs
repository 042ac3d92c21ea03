//! Node identifiers: validated once, so an etcd key can never be ambiguous. The rule
//! itself lives in `nvme_resv::node`, so the `nvme-resv` CLI's `key-for-node` and the
//! daemon accept the same ids.

pub use nvme_resv::node::{InvalidNodeId, MAX_NODE_ID_LEN, NodeId};

/// The local instance id: `/sys/devices/virtual/dmi/id/board_asset_tag` holds the EC2
/// instance id on Nitro instances; otherwise the machine id; otherwise the hostname.
pub fn local_instance_id() -> String {
    let candidates = [
        "/sys/devices/virtual/dmi/id/board_asset_tag",
        "/etc/machine-id",
        "/proc/sys/kernel/hostname",
    ];
    for path in candidates {
        if let Ok(s) = std::fs::read_to_string(path) {
            let s = s.trim();
            if (path.ends_with("board_asset_tag") && s.starts_with("i-"))
                || (!path.ends_with("board_asset_tag") && !s.is_empty())
            {
                return s.to_owned();
            }
        }
    }
    "unknown".to_owned()
}
