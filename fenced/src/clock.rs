//! The crate's one wall-clock read for records: Unix milliseconds. The decision core
//! never calls it; drivers pass its value in. Also the one copy of the calendar
//! arithmetic that turns day numbers into UTC dates and back (certificate validity,
//! `fenced audit` / `status` timestamps).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it, `u64::MAX` past
/// 584 million years).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (`month` 1..=12, `day` 1..=31:
/// callers check the ranges; other values give a meaningless number).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    // Count from 0000-03-01 so the leap day is the last day of the year.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date `(year, month, day)` of a day number since 1970-01-01 (inverse of
/// [`days_from_civil`]).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 2, 29), 11_016);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    /// Every day from 1600 to 2400 round-trips, and consecutive days are consecutive
    /// dates.
    #[test]
    fn day_numbers_and_dates_round_trip() {
        let mut prev = civil_from_days(days_from_civil(1600, 1, 1) - 1);
        for days in days_from_civil(1600, 1, 1)..days_from_civil(2400, 1, 1) {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && (1..=31).contains(&d), "{days}");
            assert_eq!(days_from_civil(y, i64::from(m), i64::from(d)), days);
            let next_day = (y, m, d) == (prev.0, prev.1, prev.2 + 1);
            let next_month = d == 1 && (y, m) == (prev.0, prev.1 + 1);
            let next_year = (m, d) == (1, 1) && y == prev.0 + 1 && prev.1 == 12;
            assert!(
                next_day || next_month || next_year,
                "{prev:?} then {:?}",
                (y, m, d)
            );
            prev = (y, m, d);
        }
    }
}
