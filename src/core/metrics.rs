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

use crate::status::{Status, WatchResult};
use crate::watch::WatchId;

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
    pub fn reloaded(&mut self, outcomes: &[(WatchId, bool)], at: SystemTime) {
        if !outcomes.is_empty() {
            self.generation += 1;
        }
        for &(_, ok) in outcomes {
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
            "Starts of the service after the first.",
        );
        writeln!(o, "tend_service_restarts_total {}", status.service.restarts).unwrap();
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

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}").unwrap();
}

/// A label value in the text format: backslash, double quote and line feed
/// escaped.
fn label(value: &str) -> String {
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
    use std::time::Instant;

    use nix::unistd::Pid;

    use super::*;
    use crate::config::Config;
    use crate::core::{Command, Core, Event, Exit, Now, Settings, SpawnKind};
    use crate::process::ExitStatus;
    use crate::watch::Report;
    use crate::watch::scan::test_fingerprint;

    const EPOCH_T0: u64 = 1_800_000_000;

    /// A core whose spawns get pids at once; jobs are told apart by argv[0].
    struct Run {
        core: Core,
        t0: Instant,
        elapsed: Duration,
        next_pid: i32,
        jobs: Vec<(Pid, String)>,
    }

    impl Run {
        fn new(toml: &str) -> Run {
            let config = Config::parse(toml).unwrap();
            let settings = Settings {
                argv: vec!["svc".into()],
                stop_signal: config.service.stop_signal,
                stop_timeout: config.service.stop_timeout,
                restart: config.service.restart,
                process_group: false,
                pid1: true,
                readiness_files: true,
                notify: false,
                ready_check: None,
                ready_timeout: Duration::from_secs(30),
                overlap: false,
                ready_when_invalid: false,
                seed: 1,
            };
            let mut run = Run {
                core: Core::new(settings, &config.watches),
                t0: Instant::now(),
                elapsed: Duration::ZERO,
                next_pid: 100,
                jobs: Vec::new(),
            };
            run.send(Event::Tick);
            run
        }

        fn now(&self) -> Now {
            Now {
                mono: self.t0 + self.elapsed,
                wall: SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_T0) + self.elapsed,
            }
        }

        fn send(&mut self, event: Event) {
            let mut queue = std::collections::VecDeque::from([event]);
            while let Some(ev) = queue.pop_front() {
                for c in self.core.handle(self.now(), ev) {
                    if let Command::Spawn {
                        token, argv, kind, ..
                    } = c
                    {
                        self.next_pid += 1;
                        let pid = Pid::from_raw(self.next_pid);
                        if kind == SpawnKind::Job {
                            self.jobs.push((pid, argv[0].clone()));
                        }
                        queue.push_back(Event::Spawned {
                            token,
                            result: Ok(pid),
                        });
                    }
                }
            }
        }

        fn content(&mut self, n: u8) {
            self.send(Event::Content(Report {
                watch: WatchId(0),
                fingerprint: test_fingerprint(n),
                changed: Vec::new(),
                files: 1,
                missing: Vec::new(),
                unreadable: Vec::new(),
            }));
        }

        /// The last job started as `program` exits with `code` after `secs`.
        fn finish(&mut self, program: &str, code: i32, secs: f64) {
            let at = self
                .jobs
                .iter()
                .rposition(|(_, p)| p == program)
                .unwrap_or_else(|| panic!("no {program} running"));
            let (pid, _) = self.jobs.remove(at);
            self.elapsed += Duration::from_secs_f64(secs);
            self.send(Event::Reaped {
                exits: vec![Exit {
                    pid,
                    status: ExitStatus::Code(code),
                    output: Some(String::new()),
                }],
                no_children: false,
            });
        }

        fn at_deadline(&mut self) {
            self.elapsed = self.core.deadline().expect("a deadline") - self.t0;
            self.send(Event::Tick);
        }

        /// (reloads, failed, last successful, last success's epoch seconds).
        fn reloads(&self) -> (u64, u64, bool, Option<u64>) {
            let m = self.core.metrics();
            let at = m
                .last_success
                .map(|t| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() - EPOCH_T0);
            (m.reloads, m.failed, m.last_ok, at)
        }

        fn page(&mut self) -> String {
            let status = self.core.status();
            self.core.metrics().render(&status)
        }
    }

    fn watch(action: &str) -> String {
        format!("[[watch]]\nname = \"app\"\npaths = [\"/x\"]\ncheck = [\"chk\"]\n{action}\n")
    }

    fn sample<'a>(page: &'a str, series: &str) -> &'a str {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{page}"))
    }

    #[test]
    fn a_rejected_change_is_a_failed_reload_until_a_good_one_is_applied() {
        let mut r = Run::new(&watch("on_change = \"signal\""));
        assert_eq!(r.reloads(), (0, 0, false, None));
        r.content(0);
        r.finish("chk", 0, 0.02);
        assert_eq!(
            r.reloads(),
            (1, 0, true, Some(0)),
            "starting the service on a config that passed is a reload"
        );
        r.elapsed += Duration::from_secs(10);
        r.content(1);
        r.finish("chk", 1, 0.3);
        assert_eq!(r.reloads(), (2, 1, false, Some(0)));
        let page = r.page();
        assert_eq!(sample(&page, "reloader_last_reload_successful"), "0");
        assert_eq!(
            sample(&page, "reloader_last_reload_success_timestamp_seconds"),
            format!("{EPOCH_T0}.020")
        );
        assert_eq!(
            sample(&page, "tend_watch_result{watch=\"app\",result=\"invalid\"}"),
            "1"
        );
        r.at_deadline();
        r.finish("chk", 1, 0.001);
        assert_eq!(
            r.reloads(),
            (3, 2, false, Some(0)),
            "a recheck counts again"
        );
        r.content(2);
        r.finish("chk", 0, 2.0);
        assert_eq!(r.reloads(), (4, 2, true, Some(13)));
        let page = r.page();
        assert_eq!(sample(&page, "reloader_reloads_total"), "4");
        assert_eq!(sample(&page, "reloader_reloads_failed_total"), "2");
        assert_eq!(sample(&page, "reloader_last_reload_successful"), "1");
        for (result, n) in [("passed", 2), ("failed", 2), ("timed_out", 0)] {
            let series = format!("tend_checks_total{{watch=\"app\",result=\"{result}\"}}");
            assert_eq!(sample(&page, &series), n.to_string(), "{result}");
        }
        let bucket = |le: &str| {
            let series = format!("tend_check_duration_seconds_bucket{{watch=\"app\",le=\"{le}\"}}");
            sample(&page, &series).to_string()
        };
        assert_eq!(bucket("0.005"), "1");
        assert_eq!(bucket("0.025"), "2");
        assert_eq!(bucket("0.5"), "3");
        assert_eq!(bucket("2.5"), "4");
        assert_eq!(bucket("+Inf"), "4");
        assert_eq!(
            sample(&page, "tend_check_duration_seconds_sum{watch=\"app\"}"),
            "2.321"
        );
    }

    #[test]
    fn an_invalid_config_at_start_up_is_not_a_successful_reload() {
        let mut r = Run::new(&watch("on_change = \"signal\""));
        r.content(0);
        r.finish("chk", 1, 0.0);
        assert_eq!(r.reloads(), (1, 1, false, None));
        let page = r.page();
        assert_eq!(sample(&page, "reloader_last_reload_successful"), "0");
        assert_eq!(
            sample(&page, "reloader_last_reload_success_timestamp_seconds"),
            "0.000"
        );
        assert_eq!(sample(&page, "tend_ready"), "0");
    }

    #[test]
    fn a_failed_action_is_a_failed_reload_and_a_restart_counts_once() {
        let mut r = Run::new(&watch("on_change = \"exec\"\nexec = [\"reload\"]"));
        r.content(0);
        r.finish("chk", 0, 0.0);
        r.content(1);
        r.finish("chk", 0, 0.0);
        r.finish("reload", 1, 0.0);
        assert_eq!(r.reloads(), (2, 1, false, Some(0)));
        r.at_deadline();
        r.finish("reload", 0, 0.0);
        assert_eq!(r.reloads(), (3, 1, true, Some(1)), "the retry succeeded");

        let mut r = Run::new(&watch("on_change = \"restart\""));
        r.content(0);
        r.finish("chk", 0, 0.0);
        r.content(1);
        r.finish("chk", 0, 0.0);
        let old = Pid::from_raw(r.next_pid - 1);
        r.send(Event::Reaped {
            exits: vec![Exit {
                pid: old,
                status: ExitStatus::Code(0),
                output: None,
            }],
            no_children: false,
        });
        assert_eq!(r.reloads(), (2, 0, true, Some(0)), "one reload, not two");
        assert_eq!(sample(&r.page(), "tend_service_restarts_total"), "1");
    }

    #[test]
    fn without_watches_there_is_no_reload_to_report() {
        let mut r = Run::new("");
        let page = r.page();
        assert!(!page.contains("reloader_"), "{page}");
        assert!(page.contains("\ntend_ready "), "{page}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(label("line\nbreak"), "line\\nbreak");
        assert_eq!(label("ünïcode {}=,"), "ünïcode {}=,");
    }
}
