//! What `GET /metrics` counts, and its Prometheus text (format 0.0.4).
//!
//! The core records two things here: the outcome of each watch's reload
//! (its change applied, or rejected by its check, or its action failed), and
//! each check that ran. The rest of the page (readiness, restarts, each
//! watch's result) is read from the [`Status`] when the page is rendered.
//!
//! The `reloader_*` names and meanings are prometheus-config-reloader's, so
//! that kube-prometheus' alert `ConfigReloaderSidecarErrors`
//! (`max_over_time(reloader_last_reload_successful[5m]) == 0`) works as it
//! is: a reload is one watch's change that was applied (at start-up too, when
//! the service starts on it), rejected by its check (a recheck that fails
//! again counts again) or whose action failed (each failed retry counts).
//! `reloader_last_reload_successful` is 0 until a reload succeeds. Without
//! watches nothing is ever reloaded, and the `reloader_*` series are left
//! out: a 0 there would fire that alert for as long as the pod runs.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use crate::core::protocol::WatchId;
use crate::core::status::{Status, WatchResult};

/// Upper bounds of the check duration histogram, in seconds: Prometheus'
/// default buckets, and two more for slow checks (the default
/// `check_timeout` is 10 s).
const BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How a check that ran ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutcome {
    Passed,
    Failed,
    TimedOut,
}

impl CheckOutcome {
    const ALL: [CheckOutcome; 3] = [
        CheckOutcome::Passed,
        CheckOutcome::Failed,
        CheckOutcome::TimedOut,
    ];

    fn as_str(self) -> &'static str {
        match self {
            CheckOutcome::Passed => "passed",
            CheckOutcome::Failed => "failed",
            CheckOutcome::TimedOut => "timed_out",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Checks {
    /// By [`CheckOutcome::ALL`]'s order.
    count: [u64; 3],
    /// Checks that took at most `BUCKETS[i]`; `+Inf` is the sum of `count`.
    buckets: [u64; BUCKETS.len()],
    seconds: f64,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    reloads: u64,
    failed: u64,
    last_ok: bool,
    last_success: Option<SystemTime>,
    /// By watch.
    checks: Vec<Checks>,
    /// Counts the changes of everything above.
    generation: u64,
}

impl Metrics {
    pub fn new(watches: usize) -> Metrics {
        Metrics {
            reloads: 0,
            failed: 0,
            last_ok: false,
            last_success: None,
            checks: vec![Checks::default(); watches],
            generation: 0,
        }
    }

    /// Changes whenever a count does.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Reloads that ended: each watch's, succeeded or not.
    pub fn reloaded(&mut self, outcomes: &[bool], at: SystemTime) {
        if !outcomes.is_empty() {
            self.generation += 1;
        }
        for &ok in outcomes {
            self.reloads += 1;
            self.last_ok = ok;
            if ok {
                self.last_success = Some(at);
            } else {
                self.failed += 1;
            }
        }
    }

    /// A check of watch `id` ran and ended so, after `took`.
    pub fn checked(&mut self, id: WatchId, outcome: CheckOutcome, took: Duration) {
        let Some(c) = self.checks.get_mut(id.0) else {
            return;
        };
        self.generation += 1;
        let at = CheckOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is listed");
        c.count[at] += 1;
        let seconds = took.as_secs_f64();
        c.seconds += seconds;
        for (bound, n) in BUCKETS.iter().zip(&mut c.buckets) {
            if seconds <= *bound {
                *n += 1;
            }
        }
    }

    /// The `reloader_*` series, prometheus-config-reloader's.
    fn render_reloads(&self, o: &mut String) {
        family(
            o,
            "reloader_reloads_total",
            "counter",
            "Reloads: each watch's change applied, rejected by its check, or whose action failed.",
        );
        writeln!(o, "reloader_reloads_total {}", self.reloads).unwrap();
        family(
            o,
            "reloader_reloads_failed_total",
            "counter",
            "Reloads that failed: rejected by the check, or the action failed.",
        );
        writeln!(o, "reloader_reloads_failed_total {}", self.failed).unwrap();
        family(
            o,
            "reloader_last_reload_successful",
            "gauge",
            "Whether the last reload succeeded (0 until one does).",
        );
        let ok = u8::from(self.last_ok);
        writeln!(o, "reloader_last_reload_successful {ok}").unwrap();
        family(
            o,
            "reloader_last_reload_success_timestamp_seconds",
            "gauge",
            "When the last reload succeeded, in seconds since the epoch (0: never).",
        );
        let at = self
            .last_success
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .unwrap_or_default();
        writeln!(
            o,
            "reloader_last_reload_success_timestamp_seconds {}.{:03}",
            at.as_secs(),
            at.subsec_millis()
        )
        .unwrap();
    }

    /// The page, in the Prometheus text format 0.0.4; `status` gives
    /// readiness, restarts and the watches (in the order of their ids).
    pub fn render(&self, status: &Status) -> String {
        let mut out = String::with_capacity(2048 + 1536 * status.watches.len());
        let o = &mut out;
        if !self.checks.is_empty() {
            self.render_reloads(o);
        }
        family(
            o,
            "tend_ready",
            "gauge",
            "Whether tend is ready (what GET /ready and tend probe say).",
        );
        writeln!(o, "tend_ready {}", u8::from(status.ready)).unwrap();
        family(
            o,
            "tend_service_restarts_total",
            "counter",
            "Starts of each service after its first.",
        );
        for s in &status.services {
            let service = label(&s.name);
            writeln!(
                o,
                "tend_service_restarts_total{{service=\"{service}\"}} {}",
                s.restarts
            )
            .unwrap();
        }
        family(
            o,
            "tend_service_ready",
            "gauge",
            "Whether each service is ready (a oneshot: it exited 0).",
        );
        for s in &status.services {
            let service = label(&s.name);
            writeln!(
                o,
                "tend_service_ready{{service=\"{service}\"}} {}",
                u8::from(s.ready)
            )
            .unwrap();
        }
        family(
            o,
            "tend_watch_result",
            "gauge",
            "Where each watch's newest config stands: 1 for its result, 0 for the others.",
        );
        for w in &status.watches {
            let watch = label(&w.name);
            for result in [
                WatchResult::Pending,
                WatchResult::Applied,
                WatchResult::Invalid,
                WatchResult::ActionFailed,
                WatchResult::Verifying,
                WatchResult::RolledBack,
            ] {
                writeln!(
                    o,
                    "tend_watch_result{{watch=\"{watch}\",result=\"{}\"}} {}",
                    result.as_str(),
                    u8::from(w.result == result)
                )
                .unwrap();
            }
        }
        family(
            o,
            "tend_checks_total",
            "counter",
            "Checks that ran, by watch and how they ended.",
        );
        for (w, c) in status.watches.iter().zip(&self.checks) {
            let watch = label(&w.name);
            for (outcome, n) in CheckOutcome::ALL.iter().zip(c.count) {
                let result = outcome.as_str();
                writeln!(
                    o,
                    "tend_checks_total{{watch=\"{watch}\",result=\"{result}\"}} {n}"
                )
                .unwrap();
            }
        }
        let m = "tend_check_duration_seconds";
        family(o, m, "histogram", "How long checks took, by watch.");
        for (w, c) in status.watches.iter().zip(&self.checks) {
            let watch = label(&w.name);
            for (bound, n) in BUCKETS.iter().zip(c.buckets) {
                writeln!(o, "{m}_bucket{{watch=\"{watch}\",le=\"{bound}\"}} {n}").unwrap();
            }
            let total: u64 = c.count.iter().sum();
            writeln!(o, "{m}_bucket{{watch=\"{watch}\",le=\"+Inf\"}} {total}").unwrap();
            writeln!(o, "{m}_sum{{watch=\"{watch}\"}} {}", c.seconds).unwrap();
            writeln!(o, "{m}_count{{watch=\"{watch}\"}} {total}").unwrap();
        }
        out
    }
}

pub(crate) fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}").unwrap();
}

/// A label value in the text format: backslash, double quote and line feed
/// escaped.
pub(crate) fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // What the core counts is tested with the core, in core/tests.rs.

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(label("line\nbreak"), "line\\nbreak");
        assert_eq!(label("ünïcode {}=,"), "ünïcode {}=,");
    }
}
