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

/// What a test device does before each report it forwards (block, hang, count).
pub trait BeforeReport: Send + Sync + std::fmt::Debug {
    /// Runs on the blocking thread that asked for the report.
    fn before_report(&self);
}

/// A model host whose commands are forwarded unchanged, except that `hook` runs
/// before every report: the one forwarding device the tests build on.
#[derive(Debug)]
pub struct Forwarding<B> {
    /// The host the commands go to.
    pub host: Host,
    /// What runs before each report.
    pub hook: B,
}

impl<B: BeforeReport> nvme_resv::Reservations for Forwarding<B> {
    fn register(&self, cmd: &nvme_resv::Register) -> nvme_resv::Result<()> {
        self.host.register(cmd)
    }
    fn acquire(&self, cmd: &nvme_resv::Acquire) -> nvme_resv::Result<()> {
        self.host.acquire(cmd)
    }
    fn release(&self, cmd: &nvme_resv::Release) -> nvme_resv::Result<()> {
        self.host.release(cmd)
    }
    fn report(&self) -> nvme_resv::Result<nvme_resv::ReservationStatus> {
        self.hook.before_report();
        self.host.report()
    }
}
