//! The crate's one wall-clock read for records: Unix milliseconds. The decision core
//! never calls it; drivers pass its value in.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it, `u64::MAX` past
/// 584 million years).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
