//! The shared namespace: nvme-resv's in-memory model of the NVMe reservation rules
//! (it follows Linux nvmet where the specification leaves room), one `Host` handle per
//! in-process node.

use nvme_resv::Access;
pub use nvme_resv::model::{Host, Namespace};

/// Whether `host` may write now (the model's access matrix).
pub fn can_write(host: &Host) -> bool {
    match host.check(Access::Write) {
        Ok(()) => true,
        Err(e) => {
            assert!(e.is_reservation_conflict(), "unexpected model error: {e}");
            false
        }
    }
}
