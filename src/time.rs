//! Timestamps as people and tools read them: RFC 3339 in UTC, with
//! milliseconds in the status file and microseconds in the log.

use std::time::SystemTime;

/// `2026-11-21T10:00:00.123Z`, for the status file.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}Z", seconds(d.as_secs()), d.subsec_millis())
}

/// `2026-11-21T10:00:00.123456Z`, for logs.
pub fn rfc3339_micros(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}Z", seconds(d.as_secs()), d.subsec_micros())
}

/// `2026_11_21_10_00_00.123456789`, as the kubelet names the generations
/// of a volume (the `publish` directory's too).
pub fn generation_stamp(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}_{m:02}_{day:02}_{:02}_{:02}_{:02}.{:09}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

fn seconds(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's
/// `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(rfc3339_millis(at(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_millis(at(1_795_255_200_123)),
            "2026-11-21T10:00:00.123Z"
        );
        assert_eq!(
            rfc3339_micros(at(1_795_255_200_123)),
            "2026-11-21T10:00:00.123000Z"
        );
        // A leap day, the last second of a year, and a century that is not a leap year.
        assert_eq!(
            rfc3339_millis(at(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339_millis(at(1_767_225_599_999)),
            "2025-12-31T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339_millis(at(4_107_542_400_000)),
            "2100-03-01T00:00:00.000Z"
        );
        let micros = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_000_001_999);
        assert_eq!(rfc3339_micros(micros), "1970-01-01T00:00:01.000001Z");
    }

    #[test]
    fn a_clock_before_1970_reads_as_the_epoch() {
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339_millis(before), "1970-01-01T00:00:00.000Z");
    }
}
