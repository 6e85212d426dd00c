//! Durations as supervisor.toml writes them ("500ms", "1m30s", "1.5s").
//!
//! Checks: a duration that parses is at most 100 years and reads back the
//! same from its display form; and any duration of that range, made from
//! the input's first 12 bytes, does too.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tend::config::{format_duration, parse_duration};

/// 100 years, the longest duration tend takes.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 86_400);

fn round_trip(d: Duration) {
    let shown = format_duration(d);
    assert_eq!(parse_duration(&shown), Ok(d), "{d:?} shown as {shown:?}");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(d) = parse_duration(text)
    {
        assert!(d <= LONGEST, "{text:?} is {d:?}");
        round_trip(d);
    }
    if let Some((secs, rest)) = data.split_first_chunk::<8>()
        && let Some(nanos) = rest.first_chunk::<4>()
    {
        let secs = u64::from_le_bytes(*secs) % (LONGEST.as_secs() + 1);
        let nanos = u32::from_le_bytes(*nanos) % 1_000_000_000;
        let d = Duration::new(secs, nanos);
        if d <= LONGEST {
            round_trip(d);
        }
    }
});
