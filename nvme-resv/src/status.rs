//! status (nvme-resv helper: implement).
