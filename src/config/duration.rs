//! Durations as supervisor.toml writes them: `"500ms"`, `"10s"`, `"2m"`,
//! `"1h"`, `"1.5s"`, and several run together (`"1m30s"`).
//!
//! Parsed in integer nanoseconds, so `"0.1s"` is exactly 100 ms and a value
//! too large is an error rather than a rounding or a panic later.

use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The longest duration tend accepts. Longer ones mean "never", which no
/// key needs, and would overflow a deadline computed from one.
const LONGEST_SECS: u64 = 100 * 365 * 86_400;

/// Fraction digits beyond this are refused rather than risk overflow; no
/// unit needs more than 13 for nanosecond precision.
const MAX_FRACTION_DIGITS: usize = 18;

/// Parses a duration; the error quotes it and says how to write one.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {s:?}: write a number and a unit, like \"500ms\", \"10s\" or \"2m\""
        )
    };
    let too_long = || format!("duration {s:?} is too long: at most 100 years (\"876000h\")");
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (whole, tail) = split_digits(rest);
        let (fraction, tail) = match tail.strip_prefix('.') {
            Some(after_dot) => split_digits(after_dot),
            None => ("", tail),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(bad());
        }
        let unit_len = tail
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let per_unit: u128 = match unit {
            "ms" => 1_000_000,
            "s" => NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "h" => 3600 * NANOS_PER_SEC,
            _ => return Err(bad()),
        };
        // Only digits: the one error parse() can give is overflow.
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| too_long())?
        };
        let mut nanos = whole.checked_mul(per_unit).ok_or_else(too_long)?;
        let fraction = fraction.trim_end_matches('0');
        if !fraction.is_empty() {
            if fraction.len() > MAX_FRACTION_DIGITS {
                return Err(format!("duration {s:?} is more precise than a nanosecond"));
            }
            let digits: u128 = fraction.parse().map_err(|_| bad())?;
            // At most 10^18 * 3.6 * 10^12: far below u128's limit.
            let scaled = digits * per_unit;
            let scale = 10u128.pow(fraction.len() as u32);
            if scaled % scale != 0 {
                return Err(format!("duration {s:?} is more precise than a nanosecond"));
            }
            nanos += scaled / scale;
        }
        total = total.checked_add(nanos).ok_or_else(too_long)?;
        rest = tail;
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| too_long())?;
    if secs > LONGEST_SECS || (secs == LONGEST_SECS && total % NANOS_PER_SEC != 0) {
        return Err(too_long());
    }
    Ok(Duration::new(secs, (total % NANOS_PER_SEC) as u32))
}

/// The leading ASCII digits of `s`, and the rest.
fn split_digits(s: &str) -> (&str, &str) {
    s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()))
}

/// The shortest exact form of a duration, in the syntax `parse_duration` reads.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() % 1_000_000 != 0 {
        let fraction = format!("{:09}", d.subsec_nanos());
        format!("{}.{}s", d.as_secs(), fraction.trim_end_matches('0'))
    } else if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn durations_parse() {
        for (text, d) in [
            ("500ms", ms(500)),
            ("10s", ms(10_000)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("2h", ms(7_200_000)),
            ("1.5s", ms(1500)),
            ("1m30s", ms(90_000)),
            ("1h1m1s1ms", ms(3_661_001)),
            ("0s", Duration::ZERO),
            (" 10s ", ms(10_000)),
            (".5s", ms(500)),
            ("1.s", ms(1000)),
            ("0010s", ms(10_000)),
        ] {
            assert_eq!(parse_duration(text), Ok(d), "{text:?}");
        }
    }

    #[test]
    fn fractions_are_exact() {
        // An f64 holds about 16 digits: this was 123456789.123456791 s.
        assert_eq!(
            parse_duration("123456789.123456789s"),
            Ok(Duration::new(123_456_789, 123_456_789))
        );
        assert_eq!(parse_duration("0.1s"), Ok(ms(100)));
        assert_eq!(parse_duration("0.3s"), Ok(ms(300)));
        assert_eq!(parse_duration("2.3s"), Ok(ms(2300)));
        assert_eq!(parse_duration("0.1m"), Ok(ms(6000)));
        assert_eq!(parse_duration("1.25h"), Ok(ms(4_500_000)));
        assert_eq!(parse_duration("0.5ms"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("0.000000001s"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("1.500000000000000000000s"), Ok(ms(1500)));
        assert_eq!(
            parse_duration("1.0000000001h"),
            Ok(Duration::new(3600, 360)),
            "ten fraction digits of an hour are still whole nanoseconds"
        );
        // Was silently 0.
        let e = parse_duration("0.0000000001s").unwrap_err();
        assert!(e.contains("more precise than a nanosecond"), "{e}");
    }

    #[test]
    fn malformed_durations_are_rejected() {
        for bad in [
            "", " ", "10", "s", "10 s", "ten s", "5d", "-1s", "+1s", "1..2s", "1.5.5s", ".s", "1S",
            "1sec", "1e3ms", "10s,",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("write a number and a unit"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn too_long_is_an_error_not_an_overflow() {
        for long in [
            "876001h",
            "876000h1ms",
            "99999999999999999999h",
            "999999999999999999999999999999999999999999h",
            "18446744073709551616s",
            "876000h876000h",
            // Each part fits in a Duration, their sum does not: this panicked.
            "5000000000000000h5000000000000000h",
        ] {
            let e = parse_duration(long).unwrap_err();
            assert!(e.contains("too long"), "{long:?}: {e}");
        }
        assert_eq!(
            parse_duration("876000h"),
            Ok(Duration::from_secs(LONGEST_SECS))
        );
    }

    #[test]
    fn durations_format_in_their_shortest_exact_form() {
        for (d, s) in [
            (ms(100), "100ms"),
            (ms(10_000), "10s"),
            (ms(120_000), "2m"),
            (ms(7_200_000), "2h"),
            (ms(1500), "1500ms"),
            (Duration::ZERO, "0s"),
            (Duration::new(1, 500), "1.0000005s"),
            (Duration::from_micros(300), "0.0003s"),
        ] {
            assert_eq!(format_duration(d), s);
            assert_eq!(parse_duration(s), Ok(d), "{s:?} reads back");
        }
    }
}
