//! namespace (nvme-resv helper: implement).
