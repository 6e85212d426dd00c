//! The reload pipeline of every watch: change -> check -> action.
//!
//! Decisions only; it starts nothing. The core tells it what happened (new
//! content, a check's verdict, an action's result) and asks it what to do
//! next (which checks to start, which actions to apply as one batch).
//!
//! Rules:
//! - A change arriving while its watch's check or action runs is not lost:
//!   when that finishes, the newest content is checked. Bursts coalesce and
//!   the last state wins.
//! - Actions wait until no check is waiting or running, then are applied as
//!   one batch: watches that changed together restart the service once or
//!   signal it once (a restart covers every other action).
//! - A failed check is checked again after `recheck`, doubling up to
//!   [`RECHECK_MAX`], until it passes or the content changes: a check that
//!   failed for a transient reason must not keep a pod down for good.
//! - A failed `exec` action is retried with a growing back-off.
//! - The service may (re)start only when the newest content of every watch
//!   passed its check ([`Pipeline::all_passed`]).

use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;

use crate::config::{self, Action};
use crate::status::WatchResult;
use crate::watch::{Fingerprint, WatchId};

/// The first retry of a failed action.
pub const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Retries of failed actions back off up to this.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Rechecks of failed checks back off up to this.
pub const RECHECK_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing to do until the content changes.
    Idle,
    /// The newest content waits for its check.
    NeedsCheck,
    Checking(Fingerprint),
    /// Passed its check; its action waits for the next batch.
    Valid(Fingerprint),
    Acting(Fingerprint),
    /// The action failed; try it again then.
    RetryAt(Fingerprint, Instant),
    /// The check failed; check the same content again then.
    RecheckAt(Fingerprint, Instant),
}

/// One watch's part of the pipeline.
struct Entry {
    name: String,
    action: Action,
    recheck: Duration,
    /// The newest content seen.
    seen: Option<Fingerprint>,
    /// The newest content that passed its check.
    passed: Option<Fingerprint>,
    stage: Stage,
    result: WatchResult,
    /// The service runs a config of this watch that passed its check and its
    /// action (readiness needs this of every watch).
    good: bool,
    check_output: String,
    changed_at: Option<SystemTime>,
    retry_delay: Duration,
    recheck_delay: Duration,
}

/// What a new scan meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The watch's first content.
    First,
    /// The content changed from this.
    Changed(Fingerprint),
    Unchanged,
}

/// What a finished check meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Newer content arrived while it ran: it is checked next.
    Stale,
    Passed,
    /// Failed; the same content is checked again after this long.
    Failed {
        recheck_in: Duration,
    },
}

/// What to do for the watches whose new config passed its check.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Every watch in the batch.
    pub watches: Vec<WatchId>,
    /// Restart the service (then nothing else is needed).
    pub restart: bool,
    /// Send each of these once.
    pub signals: Vec<Signal>,
    /// Run each distinct command once, for the watches listed with it.
    pub execs: Vec<(Vec<String>, Vec<WatchId>)>,
}

/// One watch's part of the status file.
pub struct Report<'a> {
    pub name: &'a str,
    pub result: WatchResult,
    pub check_output: &'a str,
    pub changed_at: Option<SystemTime>,
}

pub struct Pipeline {
    entries: Vec<Entry>,
    /// Reloads that ended since [`Pipeline::take_outcomes`]: the watch, and
    /// whether its change was applied (false: rejected, or its action failed).
    outcomes: Vec<(WatchId, bool)>,
}

impl Pipeline {
    pub fn new(watches: &[config::Watch]) -> Pipeline {
        Pipeline {
            entries: watches
                .iter()
                .map(|w| Entry {
                    name: w.name.clone(),
                    action: w.action.clone(),
                    recheck: w.recheck,
                    seen: None,
                    passed: None,
                    stage: Stage::Idle,
                    result: WatchResult::Pending,
                    good: false,
                    check_output: String::new(),
                    changed_at: None,
                    retry_delay: RETRY_INITIAL,
                    recheck_delay: w.recheck,
                })
                .collect(),
            outcomes: Vec::new(),
        }
    }

    /// The reloads that ended since the last call, in order.
    pub fn take_outcomes(&mut self) -> Vec<(WatchId, bool)> {
        std::mem::take(&mut self.outcomes)
    }

    fn ids(&self) -> impl Iterator<Item = WatchId> + use<> {
        (0..self.entries.len()).map(WatchId)
    }

    fn entry(&mut self, id: WatchId) -> &mut Entry {
        &mut self.entries[id.0]
    }

    pub fn name(&self, id: WatchId) -> &str {
        &self.entries[id.0].name
    }

    /// Records the newest content of a watch.
    pub fn observe(&mut self, id: WatchId, fp: Fingerprint, at: SystemTime) -> Observed {
        let e = self.entry(id);
        if e.seen == Some(fp) {
            return Observed::Unchanged;
        }
        let previous = e.seen.replace(fp);
        e.changed_at = Some(at);
        e.result = WatchResult::Pending;
        // New content is a new config: its rechecks start from the first delay.
        e.recheck_delay = e.recheck;
        match e.stage {
            // Picked up when the running check or action finishes.
            Stage::Checking(_) | Stage::Acting(_) => {}
            Stage::Idle
            | Stage::NeedsCheck
            | Stage::Valid(_)
            | Stage::RetryAt(..)
            | Stage::RecheckAt(..) => e.stage = Stage::NeedsCheck,
        }
        match previous {
            None => Observed::First,
            Some(old) => Observed::Changed(old),
        }
    }

    /// The watches whose newest content should be checked now; each is
    /// checking until [`Pipeline::check_finished`].
    pub fn checks_to_start(&mut self) -> Vec<(WatchId, Fingerprint)> {
        let mut out = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let (Stage::NeedsCheck, Some(fp)) = (e.stage, e.seen) {
                e.stage = Stage::Checking(fp);
                out.push((WatchId(i), fp));
            }
        }
        out
    }

    /// The check of `fp` for watch `id` ended.
    pub fn check_finished(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        passed: bool,
        output: String,
        now: Instant,
    ) -> Verdict {
        let e = &mut self.entries[id.0];
        if e.stage != Stage::Checking(fp) {
            return Verdict::Stale;
        }
        e.check_output = output;
        if e.seen != Some(fp) {
            e.stage = Stage::NeedsCheck;
            return Verdict::Stale;
        }
        if passed {
            e.passed = Some(fp);
            e.stage = Stage::Valid(fp);
            e.recheck_delay = e.recheck;
            Verdict::Passed
        } else {
            let recheck_in = e.recheck_delay;
            e.recheck_delay = (e.recheck_delay * 2).min(RECHECK_MAX.max(e.recheck));
            e.stage = Stage::RecheckAt(fp, now + recheck_in);
            e.result = WatchResult::Invalid;
            e.good = false;
            self.outcomes.push((id, false));
            Verdict::Failed { recheck_in }
        }
    }

    /// Failed checks whose recheck is due are checked again. Returns them.
    pub fn rechecks_due(&mut self, now: Instant) -> Vec<WatchId> {
        let mut due = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let Stage::RecheckAt(_, at) = e.stage
                && at <= now
            {
                e.stage = Stage::NeedsCheck;
                due.push(WatchId(i));
            }
        }
        due
    }

    /// Whether a check is waiting or running: actions wait for it, so that
    /// watches changing together are applied together.
    pub fn checking(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.stage, Stage::NeedsCheck | Stage::Checking(_)))
    }

    /// Whether the newest content of every watch passed its check: only then
    /// may the service (re)start, since a fresh process reads all of it.
    pub fn all_passed(&self) -> bool {
        self.entries
            .iter()
            .all(|e| e.seen.is_some() && e.passed == e.seen)
    }

    /// The first watch whose newest content has not passed its check.
    pub fn first_unpassed(&self) -> Option<(&str, WatchResult)> {
        self.entries
            .iter()
            .find(|e| e.seen.is_none() || e.passed != e.seen)
            .map(|e| (e.name.as_str(), e.result))
    }

    /// The service started: it reads every watch's newest content, which
    /// passed its check ([`Pipeline::all_passed`]), so every pending action
    /// is done.
    pub fn started(&mut self) {
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let Stage::Valid(fp) | Stage::Acting(fp) | Stage::RetryAt(fp, _) = e.stage
                && e.seen == Some(fp)
            {
                e.stage = Stage::Idle;
                e.retry_delay = RETRY_INITIAL;
            }
            if e.stage == Stage::Idle && e.passed.is_some() && e.passed == e.seen {
                if e.result != WatchResult::Applied {
                    self.outcomes.push((WatchId(i), true));
                }
                e.result = WatchResult::Applied;
                e.good = true;
            }
        }
    }

    /// The actions to apply now, if any: every watch whose config passed its
    /// check (or whose retry is due), once no check is in flight. Those
    /// watches are acting until [`Pipeline::action_finished`].
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
            let id = WatchId(i);
            e.stage = Stage::Acting(fp);
            batch.watches.push(id);
            match &e.action {
                Action::Restart => batch.restart = true,
                Action::Signal(sig) if !batch.signals.contains(sig) => batch.signals.push(*sig),
                Action::Signal(_) | Action::None => {}
                Action::Exec(argv) => match batch.execs.iter_mut().find(|(a, _)| a == argv) {
                    Some((_, users)) => users.push(id),
                    None => batch.execs.push((argv.clone(), vec![id])),
                },
                // Tend itself, run as a short-lived child, calls the endpoint.
                Action::Http(h) => {
                    let argv = crate::http_action::argv(&h.method, &h.url, h.timeout);
                    match batch.execs.iter_mut().find(|(a, _)| *a == argv) {
                        Some((_, users)) => users.push(id),
                        None => batch.execs.push((argv, vec![id])),
                    }
                }
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

    /// Every watch whose action is running (a restart in progress).
    pub fn acting(&self) -> Vec<WatchId> {
        self.ids()
            .filter(|id| matches!(self.entries[id.0].stage, Stage::Acting(_)))
            .collect()
    }

    /// The action for watch `id` succeeded or failed.
    pub fn action_finished(&mut self, id: WatchId, ok: bool, now: Instant) {
        let e = &mut self.entries[id.0];
        let Stage::Acting(fp) = e.stage else { return };
        let superseded = e.seen != Some(fp);
        self.outcomes.push((id, ok));
        if ok {
            e.good = true;
            e.retry_delay = RETRY_INITIAL;
            if superseded {
                e.stage = Stage::NeedsCheck;
            } else {
                e.stage = Stage::Idle;
                e.result = WatchResult::Applied;
            }
        } else {
            e.good = false;
            if superseded {
                e.stage = Stage::NeedsCheck;
            } else {
                e.result = WatchResult::ActionFailed;
                e.stage = Stage::RetryAt(fp, now + e.retry_delay);
                e.retry_delay = (e.retry_delay * 2).min(RETRY_MAX);
            }
        }
    }

    /// How long until watch `id`'s failed action is tried again.
    pub fn retry_in(&self, id: WatchId, now: Instant) -> Option<Duration> {
        match self.entries[id.0].stage {
            Stage::RetryAt(_, at) => Some(at.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// When a failed check is next checked again.
    pub fn recheck_deadline(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter_map(|e| match e.stage {
                Stage::RecheckAt(_, at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// When a failed action is next retried.
    pub fn retry_deadline(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter_map(|e| match e.stage {
                Stage::RetryAt(_, at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// Every watch's config is checked and applied; with `invalid_ok`, a
    /// watch whose newest content was rejected counts too (the service
    /// still runs the last good config of it).
    pub fn all_good(&self, invalid_ok: bool) -> bool {
        self.entries
            .iter()
            .all(|e| e.good || (invalid_ok && e.result == WatchResult::Invalid))
    }

    pub fn any_invalid(&self) -> bool {
        self.entries
            .iter()
            .any(|e| e.result == WatchResult::Invalid)
    }

    /// Something is moving through the pipeline (rechecks of a failed check
    /// count only as invalid, not as busy).
    pub fn busy(&self) -> bool {
        self.entries
            .iter()
            .any(|e| !matches!(e.stage, Stage::Idle | Stage::RecheckAt(..)))
    }

    /// The first watch that keeps tend from being ready, and why.
    pub fn first_problem(&self) -> Option<(&str, WatchResult)> {
        self.entries
            .iter()
            .find(|e| !e.good || e.result != WatchResult::Applied)
            .map(|e| (e.name.as_str(), e.result))
    }

    pub fn reports(&self) -> impl Iterator<Item = Report<'_>> {
        self.entries.iter().map(|e| Report {
            name: &e.name,
            result: e.result,
            check_output: &e.check_output,
            changed_at: e.changed_at,
        })
    }
}
