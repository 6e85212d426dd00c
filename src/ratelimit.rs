//! A log line that a flood could repeat without end (a process outside the
//! service's tree that floods the notify socket, a kernel that keeps cutting
//! control data) is written at most once per interval; the lines held back
//! meanwhile are counted, and the count is said with the next line written,
//! or by [`RateLimit::flush`] once the interval is over.
//!
//! The caller passes the time in, so the core, which reads no clock, can
//! use it, and the tests need no sleep.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct RateLimit {
    every: Duration,
    /// When the last line was written.
    last: Option<Instant>,
    /// Lines held back since then.
    held: u64,
}

impl RateLimit {
    pub const fn new(every: Duration) -> RateLimit {
        RateLimit {
            every,
            last: None,
            held: 0,
        }
    }

    /// The interval.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Whether to write the line now: `Some(held)`, with the number of lines
    /// held back since the last one written, or `None`, and it is counted.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < self.every)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }

    /// When [`flush`](Self::flush) has a count to report; None while no
    /// line is held back, so an idle caller needs no timer.
    pub fn due(&self) -> Option<Instant> {
        match self.last {
            Some(at) if self.held > 0 => Some(at + self.every),
            _ => None,
        }
    }

    /// The number of lines held back, once the interval after the last line
    /// written is over; reporting it counts as writing a line.
    pub fn flush(&mut self, now: Instant) -> Option<u64> {
        if now < self.due()? {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

/// The end of a line written through a limit: how many were held back
/// before it, and how often such a line is written.
pub fn held_back(held: u64, every: Duration) -> String {
    match held {
        0 => format!(" (said at most once every {every:?})"),
        n => format!(" ({n} more since the last such line; said at most once every {every:?})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_secs(10);

    fn at(t0: Instant, secs: f64) -> Instant {
        t0 + Duration::from_secs_f64(secs)
    }

    #[test]
    fn the_first_line_is_written_and_a_flood_gives_one_line_per_interval_with_its_count() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(EVERY);
        assert_eq!(limit.allow(t0), Some(0));
        assert_eq!(limit.due(), None, "nothing held back: no timer");
        let written: Vec<(f64, u64)> = (1..=25_000)
            .map(|i| f64::from(i) / 1000.0)
            .filter_map(|s| limit.allow(at(t0, s)).map(|held| (s, held)))
            .collect();
        // 25 s of a line every millisecond: one line at 10 s, one at 20 s.
        assert_eq!(written, [(10.0, 9_999), (20.0, 9_999)]);
        assert_eq!(limit.due(), Some(at(t0, 30.0)));
    }

    #[test]
    fn what_was_held_back_is_reported_once_the_interval_is_over() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(EVERY);
        assert_eq!(limit.allow(t0), Some(0));
        for i in 1..=500 {
            assert_eq!(limit.allow(at(t0, f64::from(i) / 1000.0)), None);
        }
        assert_eq!(limit.flush(at(t0, 9.9)), None, "not before the interval");
        assert_eq!(limit.flush(at(t0, 10.0)), Some(500));
        assert_eq!(limit.due(), None);
        assert_eq!(limit.flush(at(t0, 30.0)), None, "reported once");
        // The report counted as a line: the next one waits its interval.
        assert_eq!(limit.allow(at(t0, 12.0)), None);
        assert_eq!(limit.allow(at(t0, 20.0)), Some(1));
    }

    #[test]
    fn a_clock_that_goes_back_holds_lines_back_instead_of_writing_them() {
        let t0 = Instant::now() + Duration::from_secs(100);
        let mut limit = RateLimit::new(EVERY);
        assert_eq!(limit.allow(t0), Some(0));
        assert_eq!(limit.allow(t0 - Duration::from_secs(50)), None);
    }
}
