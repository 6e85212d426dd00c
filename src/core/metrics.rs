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
//! `reloader_last_reload_successful` is 0 until a reload succeeds, and while
//! any watch's latest reload failed (another watch's success does not hide
//! it); `tend_watch_last_reload_successful{watch}` says which. Without
//! watches nothing is ever reloaded, and the `reloader_*` series are left
//! out: a 0 there would fire that alert for as long as the pod runs.
//!
//! The `configmap_reload_*` series are configmap-reload's, for the calls of
//! `on_change = "http"` actions (the `webhook` label is the endpoint's URL).
//! What the watcher thread counts (events, errors) is I/O: the shell hands
//! it in at render time ([`WatcherCounts`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use crate::config::{self, Action};
use crate::core::protocol::{Answer, WatchId};
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

/// What the watcher thread counted (see `watch::Watcher::counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatcherCounts {
    /// Paths of every watch.
    pub paths: usize,
    /// inotify events received.
    pub events: u64,
    /// Queue overflows, inotify calls that failed (a limit hit), and scans
    /// that could not read part of a watch.
    pub errors: u64,
}

/// configmap-reload's books of one endpoint.
#[derive(Debug, Clone, Default)]
struct Webhook {
    url: String,
    /// Answers, by status code.
    answers: BTreeMap<u16, u64>,
    /// Calls with no answer (`client_request_do`).
    unanswered: u64,
    /// Answers other than 2xx (`client_response`).
    refused: u64,
    succeeded: u64,
    /// Of the last call that succeeded.
    last_seconds: Option<f64>,
    /// Whether the last call failed; None before the first.
    last_failed: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct Metrics {
    reloads: u64,
    failed: u64,
    last_success: Option<SystemTime>,
    /// By watch: how its latest reload ended (None: none yet).
    last: Vec<Option<bool>>,
    /// Config apply operations: publications, or actions without `publish`.
    applies: u64,
    applies_failed: u64,
    /// The endpoints of `on_change = "http"`, in config order.
    webhooks: Vec<Webhook>,
    /// By watch.
    checks: Vec<Checks>,
    /// Counts the changes of everything above.
    generation: u64,
}

impl Metrics {
    pub fn new(watches: &[config::Watch]) -> Metrics {
        let mut webhooks: Vec<Webhook> = Vec::new();
        for w in watches {
            if let Action::Http(h) = &w.action
                && !webhooks.iter().any(|k| k.url == h.url)
            {
                webhooks.push(Webhook {
                    url: h.url.clone(),
                    ..Webhook::default()
                });
            }
        }
        Metrics {
            reloads: 0,
            failed: 0,
            last_success: None,
            last: vec![None; watches.len()],
            applies: 0,
            applies_failed: 0,
            webhooks,
            checks: vec![Checks::default(); watches.len()],
            generation: 0,
        }
    }

    /// Changes whenever a count does.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Reloads that ended: each watch's, succeeded or not.
    pub fn reloaded(&mut self, outcomes: &[(WatchId, bool)], at: SystemTime) {
        if !outcomes.is_empty() {
            self.generation += 1;
        }
        for &(id, ok) in outcomes {
            self.reloads += 1;
            if let Some(last) = self.last.get_mut(id.0) {
                *last = Some(ok);
            }
            if ok {
                self.last_success = Some(at);
            } else {
                self.failed += 1;
            }
        }
    }

    /// A config apply operation ended: a publication, or an action of a
    /// watch without `publish`.
    pub fn applied(&mut self, ok: bool) {
        self.generation += 1;
        self.applies += 1;
        if !ok {
            self.applies_failed += 1;
        }
    }

    /// A call of endpoint `url` ended so, after `took`.
    pub fn called(&mut self, url: &str, result: &Result<Answer, String>, took: Duration) {
        let Some(w) = self.webhooks.iter_mut().find(|w| w.url == url) else {
            return;
        };
        self.generation += 1;
        let ok = match result {
            Ok(a) => {
                *w.answers.entry(a.code).or_default() += 1;
                if !a.success() {
                    w.refused += 1;
                }
                a.success()
            }
            Err(_) => {
                w.unanswered += 1;
                false
            }
        };
        if ok {
            w.succeeded += 1;
            w.last_seconds = Some(took.as_secs_f64());
        }
        w.last_failed = Some(!ok);
    }

    /// Whether no watch's latest reload failed, and one succeeded.
    fn all_good(&self) -> bool {
        self.last_success.is_some() && !self.last.contains(&Some(false))
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
            "Whether the last reload of every watch succeeded (0 until one does).",
        );
        let ok = u8::from(self.all_good());
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
    /// readiness, restarts and the watches (in the order of their ids),
    /// `watcher` what the watcher thread counted.
    pub fn render(&self, status: &Status, watcher: &WatcherCounts) -> String {
        let mut out =
            String::with_capacity(4096 + 1536 * status.watches.len() + 1024 * self.webhooks.len());
        let o = &mut out;
        if !self.checks.is_empty() {
            self.render_reloads(o);
            self.render_reloader_rest(o, status, watcher);
            self.render_configmap_reload(o, watcher);
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

impl Metrics {
    /// The rest of prometheus-config-reloader's series, and the per-watch
    /// gauge beside its aggregate.
    fn render_reloader_rest(&self, o: &mut String, status: &Status, watcher: &WatcherCounts) {
        let mut counter = |name: &str, help: &str, kind: &str, n: u64| {
            family(o, name, kind, help);
            writeln!(o, "{name} {n}").unwrap();
        };
        counter(
            "reloader_config_apply_operations_total",
            "Config apply operations: generations published (watches with publish), or actions run (without).",
            "counter",
            self.applies,
        );
        counter(
            "reloader_config_apply_operations_failed_total",
            "Config apply operations that failed.",
            "counter",
            self.applies_failed,
        );
        counter(
            "reloader_watches",
            "Paths watched: the paths of every watch.",
            "gauge",
            watcher.paths as u64,
        );
        counter(
            "reloader_watch_events_total",
            "File-system events the watcher received.",
            "counter",
            watcher.events,
        );
        counter(
            "reloader_watch_errors_total",
            "Watcher errors: inotify queue overflows, inotify calls that failed, scans that could not read part of a watch.",
            "counter",
            watcher.errors,
        );
        family(
            o,
            "tend_watch_last_reload_successful",
            "gauge",
            "Whether each watch's last reload succeeded (0 until one does).",
        );
        for (w, last) in status.watches.iter().zip(&self.last) {
            let watch = label(&w.name);
            let ok = u8::from(*last == Some(true));
            writeln!(
                o,
                "tend_watch_last_reload_successful{{watch=\"{watch}\"}} {ok}"
            )
            .unwrap();
        }
    }

    /// configmap-reload's series: one `webhook` per endpoint of an http
    /// action.
    fn render_configmap_reload(&self, o: &mut String, watcher: &WatcherCounts) {
        let m = "configmap_reload_requests_total";
        family(o, m, "counter", "Requests answered, by status code.");
        for w in &self.webhooks {
            let url = label(&w.url);
            for (code, n) in &w.answers {
                writeln!(o, "{m}{{webhook=\"{url}\",status_code=\"{code}\"}} {n}").unwrap();
            }
        }
        let m = "configmap_reload_request_errors_total";
        family(
            o,
            m,
            "counter",
            "Failed requests: no answer (client_request_do), or not 2xx (client_response).",
        );
        for w in &self.webhooks {
            let url = label(&w.url);
            for (reason, n) in [
                ("client_request_do", w.unanswered),
                ("client_response", w.refused),
            ] {
                writeln!(o, "{m}{{webhook=\"{url}\",reason=\"{reason}\"}} {n}").unwrap();
            }
        }
        let m = "configmap_reload_success_reloads_total";
        family(o, m, "counter", "Requests answered 2xx.");
        for w in &self.webhooks {
            let url = label(&w.url);
            writeln!(o, "{m}{{webhook=\"{url}\"}} {}", w.succeeded).unwrap();
        }
        let m = "configmap_reload_last_request_duration_seconds";
        family(
            o,
            m,
            "gauge",
            "How long the last request answered 2xx took.",
        );
        for w in &self.webhooks {
            if let Some(seconds) = w.last_seconds {
                let url = label(&w.url);
                writeln!(o, "{m}{{webhook=\"{url}\"}} {seconds}").unwrap();
            }
        }
        let m = "configmap_reload_last_reload_error";
        family(
            o,
            m,
            "gauge",
            "Whether the last request failed (1) or was answered 2xx (0).",
        );
        for w in &self.webhooks {
            if let Some(failed) = w.last_failed {
                let url = label(&w.url);
                writeln!(o, "{m}{{webhook=\"{url}\"}} {}", u8::from(failed)).unwrap();
            }
        }
        let m = "configmap_reload_watcher_errors_total";
        family(
            o,
            m,
            "counter",
            "Watcher errors (as reloader_watch_errors_total).",
        );
        writeln!(o, "{m} {}", watcher.errors).unwrap();
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
