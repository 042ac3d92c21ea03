//! sys (nvme-resv helper: implement).
