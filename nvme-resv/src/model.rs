//! model (nvme-resv helper: implement).
