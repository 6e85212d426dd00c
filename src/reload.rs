//! The reload pipeline, per watch: change -> check -> action -> readiness.
//!
//! This is the decision logic only; it starts nothing itself. The supervisor
//! tells it what happened (a new fingerprint, a check's result, an action's
//! result) and asks it what to do next (which checks to start, which actions
//! to apply), so every rule here is a unit test away.
//!
//! Rules:
//! - A change arriving while its watch's check or action runs is not lost:
//!   when that finishes, the newest content is checked again. Bursts coalesce
//!   and the last state wins.
//! - Actions wait until no check is in flight, then are applied as one batch:
//!   watches that changed together restart the service once or signal it once
//!   (a restart covers every other action).
//! - An invalid config leaves the service alone and readiness off until a
//!   newer config passes. A failed `exec` is retried with a growing back-off.

use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;

use crate::config::{self, Action};
use crate::watch::Fingerprint;

const RETRY_INITIAL: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A watch's result, as the status file reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A change is on its way through the pipeline.
    Pending,
    Applied,
    Invalid,
    ActionFailed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pending => "pending",
            Outcome::Applied => "applied",
            Outcome::Invalid => "invalid",
            Outcome::ActionFailed => "action_failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing to do until the content changes.
    Idle,
    NeedsCheck,
    Checking(Fingerprint),
    /// Passed its check; its action waits for the next batch.
    Valid(Fingerprint),
    Acting(Fingerprint),
    /// The action failed; try it again then.
    RetryAt(Fingerprint, Instant),
}

struct Entry {
    name: String,
    action: Action,
    /// The newest content seen.
    seen: Option<Fingerprint>,
    stage: Stage,
    outcome: Outcome,
    /// The service runs on a config of this watch that passed its check and
    /// its action (readiness needs this of every watch).
    good: bool,
    check_output: String,
    changed_at: Option<SystemTime>,
    retry_delay: Duration,
}

/// What to do for a batch of watches whose new config passed its check.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Every watch in the batch.
    pub watches: Vec<usize>,
    /// Restart the service (then nothing else is needed).
    pub restart: bool,
    /// Send each of these once.
    pub signals: Vec<Signal>,
    /// Run each distinct command once, for the watches listed with it.
    pub execs: Vec<(Vec<String>, Vec<usize>)>,
}

/// One watch's part of the status file.
pub struct WatchReport<'a> {
    pub name: &'a str,
    pub outcome: Outcome,
    pub check_output: &'a str,
    pub changed_at: Option<SystemTime>,
}

pub struct Pipeline {
    entries: Vec<Entry>,
}

impl Pipeline {
    pub fn new(watches: &[config::Watch]) -> Pipeline {
        Pipeline {
            entries: watches
                .iter()
                .map(|w| Entry {
                    name: w.name.clone(),
                    action: w.action.clone(),
                    seen: None,
                    stage: Stage::Idle,
                    outcome: Outcome::Pending,
                    good: false,
                    check_output: String::new(),
                    changed_at: None,
                    retry_delay: RETRY_INITIAL,
                })
                .collect(),
        }
    }

    /// Records the content of watch `i`. Returns the previous fingerprint
    /// (None the first time) when it changed, and None when it did not.
    pub fn observe(
        &mut self,
        i: usize,
        fp: Fingerprint,
        at: SystemTime,
    ) -> Option<Option<Fingerprint>> {
        let e = &mut self.entries[i];
        if e.seen == Some(fp) {
            return None;
        }
        let previous = e.seen.replace(fp);
        e.changed_at = Some(at);
        e.outcome = Outcome::Pending;
        match e.stage {
            // Picked up when the running check or action finishes.
            Stage::Checking(_) | Stage::Acting(_) => {}
            Stage::Idle | Stage::NeedsCheck | Stage::Valid(_) | Stage::RetryAt(..) => {
                e.stage = Stage::NeedsCheck;
            }
        }
        Some(previous)
    }

    /// The watches whose newest content should be checked now; each is
    /// `Checking` until [`Pipeline::check_finished`].
    pub fn start_checks(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let (Stage::NeedsCheck, Some(fp)) = (e.stage, e.seen) {
                e.stage = Stage::Checking(fp);
                out.push(i);
            }
        }
        out
    }

    /// The check of watch `i` ended. Returns false when its result no longer
    /// matters because newer content arrived meanwhile (it is checked next).
    pub fn check_finished(&mut self, i: usize, passed: bool, output: String) -> bool {
        let e = &mut self.entries[i];
        let Stage::Checking(fp) = e.stage else {
            return false;
        };
        e.check_output = output;
        if e.seen != Some(fp) {
            e.stage = Stage::NeedsCheck;
            return false;
        }
        if passed {
            e.stage = Stage::Valid(fp);
        } else {
            e.stage = Stage::Idle;
            e.outcome = Outcome::Invalid;
            e.good = false;
        }
        true
    }

    /// Whether a check is waiting or running: actions wait for it, so that
    /// watches changing together are applied together.
    pub fn checking(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.stage, Stage::NeedsCheck | Stage::Checking(_)))
    }

    /// Before the first start: true when every watch's current config passed
    /// its check and nothing is in flight, so the service may start.
    pub fn ready_to_start(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.stage, Stage::Valid(_)))
    }

    /// The service started on the checked configs: they are all applied.
    pub fn started(&mut self) {
        for e in &mut self.entries {
            if let Stage::Valid(fp) = e.stage {
                e.stage = Stage::Idle;
                if e.seen == Some(fp) {
                    e.outcome = Outcome::Applied;
                }
                e.good = true;
            }
        }
    }

    /// The actions to apply now, if any: every watch whose config passed its
    /// check (or whose retry is due), once no check is in flight. Those
    /// watches are `Acting` until [`Pipeline::action_finished`].
    pub fn take_batch(&mut self, now: Instant) -> Option<Batch> {
        if self.checking() {
            return None;
        }
        let mut batch = Batch::default();
        for (i, e) in self.entries.iter_mut().enumerate() {
            let fp = match e.stage {
                Stage::Valid(fp) => fp,
                Stage::RetryAt(fp, at) if at <= now => fp,
                _ => continue,
            };
            e.stage = Stage::Acting(fp);
            batch.watches.push(i);
            match &e.action {
                Action::Restart => batch.restart = true,
                Action::Signal(sig) if !batch.signals.contains(sig) => batch.signals.push(*sig),
                Action::Signal(_) | Action::None => {}
                Action::Exec(argv) => match batch.execs.iter_mut().find(|(a, _)| a == argv) {
                    Some((_, users)) => users.push(i),
                    None => batch.execs.push((argv.clone(), vec![i])),
                },
            }
        }
        if batch.watches.is_empty() {
            return None;
        }
        if batch.restart {
            // A fresh process reads every config: nothing else to do.
            batch.signals.clear();
            batch.execs.clear();
        }
        Some(batch)
    }

    /// The action for watch `i` succeeded or failed.
    pub fn action_finished(&mut self, i: usize, ok: bool, now: Instant) {
        let e = &mut self.entries[i];
        let Stage::Acting(fp) = e.stage else { return };
        let superseded = e.seen != Some(fp);
        if ok {
            e.good = true;
            e.retry_delay = RETRY_INITIAL;
            if superseded {
                e.stage = Stage::NeedsCheck;
            } else {
                e.stage = Stage::Idle;
                e.outcome = Outcome::Applied;
            }
        } else {
            e.good = false;
            if superseded {
                e.stage = Stage::NeedsCheck;
            } else {
                e.outcome = Outcome::ActionFailed;
                e.stage = Stage::RetryAt(fp, now + e.retry_delay);
                e.retry_delay = (e.retry_delay * 2).min(RETRY_MAX);
            }
        }
    }

    /// How long until watch `i`'s failed action is tried again.
    pub fn retry_in(&self, i: usize, now: Instant) -> Option<Duration> {
        match self.entries[i].stage {
            Stage::RetryAt(_, at) => Some(at.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// When a failed action is next due.
    pub fn deadline(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter_map(|e| match e.stage {
                Stage::RetryAt(_, at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// Every watch's config is checked and applied.
    pub fn all_good(&self) -> bool {
        self.entries.iter().all(|e| e.good)
    }

    pub fn any_invalid(&self) -> bool {
        self.entries.iter().any(|e| e.outcome == Outcome::Invalid)
    }

    /// Something is moving through the pipeline.
    pub fn busy(&self) -> bool {
        self.entries.iter().any(|e| e.stage != Stage::Idle)
    }

    /// The first watch that keeps tend from being ready, and why.
    pub fn first_problem(&self) -> Option<(&str, Outcome)> {
        self.entries
            .iter()
            .find(|e| !e.good || e.outcome != Outcome::Applied)
            .map(|e| (e.name.as_str(), e.outcome))
    }

    pub fn name(&self, i: usize) -> &str {
        &self.entries[i].name
    }

    pub fn reports(&self) -> impl Iterator<Item = WatchReport<'_>> {
        self.entries.iter().map(|e| WatchReport {
            name: &e.name,
            outcome: e.outcome,
            check_output: &e.check_output,
            changed_at: e.changed_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn pipeline(toml: &str) -> Pipeline {
        Pipeline::new(&Config::parse(toml).unwrap().watches)
    }

    fn fp(n: u8) -> Fingerprint {
        // Any distinct fingerprints will do; derive them from real scans of
        // nothing with different keys is overkill, so build them directly.
        crate::watch::scan::test_fingerprint(n)
    }

    const ONE: &str = "[[watch]]\nname = \"a\"\npaths = [\"/a\"]\non_change = \"signal\"\n";
    const TWO: &str = "[[watch]]\nname = \"a\"\npaths = [\"/a\"]\non_change = \"signal\"\n\
                       [[watch]]\nname = \"b\"\npaths = [\"/b\"]\non_change = \"signal\"\n";

    fn now() -> Instant {
        Instant::now()
    }

    /// Runs the start-up: the first content of every watch passes its check.
    fn started(p: &mut Pipeline, n: usize) {
        for i in 0..n {
            p.observe(i, fp(0), SystemTime::now());
        }
        for i in p.start_checks() {
            assert!(p.check_finished(i, true, String::new()));
        }
        assert!(p.ready_to_start());
        p.started();
        assert!(p.all_good());
    }

    #[test]
    fn the_same_content_is_not_a_change() {
        let mut p = pipeline(ONE);
        assert_eq!(p.observe(0, fp(1), SystemTime::now()), Some(None));
        assert_eq!(p.observe(0, fp(1), SystemTime::now()), None);
        assert_eq!(p.observe(0, fp(2), SystemTime::now()), Some(Some(fp(1))));
    }

    #[test]
    fn the_service_starts_only_when_every_config_passed() {
        let mut p = pipeline(TWO);
        p.observe(0, fp(1), SystemTime::now());
        p.observe(1, fp(1), SystemTime::now());
        assert_eq!(p.start_checks(), vec![0, 1]);
        p.check_finished(0, true, String::new());
        assert!(!p.ready_to_start(), "b is still being checked");
        p.check_finished(1, false, "bad".into());
        assert!(!p.ready_to_start());
        assert!(p.any_invalid());
        p.observe(1, fp(2), SystemTime::now());
        assert_eq!(p.start_checks(), vec![1]);
        p.check_finished(1, true, String::new());
        assert!(p.ready_to_start());
        p.started();
        assert!(p.all_good());
        assert!(
            p.take_batch(now()).is_none(),
            "the start applied everything"
        );
    }

    #[test]
    fn a_valid_change_is_applied_and_an_invalid_one_is_not() {
        let mut p = pipeline(ONE);
        started(&mut p, 1);
        p.observe(0, fp(1), SystemTime::now());
        assert_eq!(p.start_checks(), vec![0]);
        p.check_finished(0, false, "line 3: bad".into());
        assert!(p.take_batch(now()).is_none());
        assert!(!p.all_good());
        assert_eq!(p.first_problem(), Some(("a", Outcome::Invalid)));
        p.observe(0, fp(2), SystemTime::now());
        p.start_checks();
        p.check_finished(0, true, String::new());
        let b = p.take_batch(now()).unwrap();
        assert_eq!(b.signals, vec![Signal::SIGHUP]);
        p.action_finished(0, true, now());
        assert!(p.all_good());
        assert!(!p.busy());
    }

    #[test]
    fn a_change_during_a_check_is_checked_next_with_the_newest_content() {
        let mut p = pipeline(ONE);
        started(&mut p, 1);
        p.observe(0, fp(1), SystemTime::now());
        p.start_checks();
        p.observe(0, fp(2), SystemTime::now());
        p.observe(0, fp(3), SystemTime::now());
        assert!(p.start_checks().is_empty(), "one check at a time");
        assert!(
            !p.check_finished(0, true, String::new()),
            "the result for fp(1) is stale"
        );
        assert!(p.take_batch(now()).is_none());
        assert_eq!(p.start_checks(), vec![0]);
        assert!(p.check_finished(0, true, String::new()));
        assert!(p.take_batch(now()).is_some());
    }

    #[test]
    fn a_change_during_an_action_is_checked_after_it() {
        let mut p = pipeline(ONE);
        started(&mut p, 1);
        p.observe(0, fp(1), SystemTime::now());
        p.start_checks();
        p.check_finished(0, true, String::new());
        p.take_batch(now()).unwrap();
        p.observe(0, fp(2), SystemTime::now());
        p.action_finished(0, true, now());
        assert_eq!(p.start_checks(), vec![0]);
    }

    #[test]
    fn watches_that_change_together_apply_one_action() {
        let mut p = pipeline(TWO);
        started(&mut p, 2);
        p.observe(0, fp(1), SystemTime::now());
        p.start_checks();
        p.observe(1, fp(1), SystemTime::now());
        p.check_finished(0, true, String::new());
        assert!(p.take_batch(now()).is_none(), "b's check is still to come");
        p.start_checks();
        p.check_finished(1, true, String::new());
        let b = p.take_batch(now()).unwrap();
        assert_eq!(b.watches, vec![0, 1]);
        assert_eq!(b.signals, vec![Signal::SIGHUP], "one signal for both");
    }

    #[test]
    fn a_restart_covers_every_other_action() {
        let mut p = pipeline(
            "[[watch]]\npaths = [\"/a\"]\non_change = \"restart\"\n\
             [[watch]]\npaths = [\"/b\"]\non_change = \"exec\"\nexec = [\"reload\"]\n\
             [[watch]]\npaths = [\"/c\"]\non_change = \"signal\"\n",
        );
        started(&mut p, 3);
        for i in 0..3 {
            p.observe(i, fp(1), SystemTime::now());
        }
        for i in p.start_checks() {
            p.check_finished(i, true, String::new());
        }
        let b = p.take_batch(now()).unwrap();
        assert!(b.restart);
        assert!(b.signals.is_empty() && b.execs.is_empty());
        assert_eq!(b.watches, vec![0, 1, 2]);
    }

    #[test]
    fn identical_execs_run_once_for_all_their_watches() {
        let mut p = pipeline(
            "[[watch]]\nname = \"a\"\npaths = [\"/a\"]\non_change = \"exec\"\nexec = [\"reload\"]\n\
             [[watch]]\nname = \"b\"\npaths = [\"/b\"]\non_change = \"exec\"\nexec = [\"reload\"]\n",
        );
        started(&mut p, 2);
        p.observe(0, fp(1), SystemTime::now());
        p.observe(1, fp(1), SystemTime::now());
        for i in p.start_checks() {
            p.check_finished(i, true, String::new());
        }
        let b = p.take_batch(now()).unwrap();
        assert_eq!(b.execs, vec![(vec!["reload".to_string()], vec![0, 1])]);
    }

    #[test]
    fn a_failed_action_is_retried_with_a_growing_back_off() {
        let mut p =
            pipeline("[[watch]]\npaths = [\"/a\"]\non_change = \"exec\"\nexec = [\"reload\"]\n");
        started(&mut p, 1);
        let t0 = now();
        p.observe(0, fp(1), SystemTime::now());
        p.start_checks();
        p.check_finished(0, true, String::new());
        p.take_batch(t0).unwrap();
        p.action_finished(0, false, t0);
        assert_eq!(p.first_problem(), Some(("/a", Outcome::ActionFailed)));
        assert!(p.take_batch(t0).is_none(), "not before the back-off");
        let t1 = p.deadline().unwrap();
        assert_eq!(t1 - t0, RETRY_INITIAL);
        p.take_batch(t1).unwrap();
        p.action_finished(0, false, t1);
        assert_eq!(p.deadline().unwrap() - t1, RETRY_INITIAL * 2);
        // A newer config supersedes the retry.
        p.observe(0, fp(2), SystemTime::now());
        assert_eq!(p.deadline(), None);
        assert_eq!(p.start_checks(), vec![0]);
    }
}
