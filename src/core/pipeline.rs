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
//! - The service may (re)start only when it would read checked content
//!   ([`Pipeline::startable`]): the newest content of every watch passed its
//!   check, or, for a watch with `publish`, the published copy (which only
//!   ever holds content that passed) once the newest content's check is
//!   decided.
//!
//! `publish`: the check runs on a candidate copy, and a passing candidate is
//! published before the action ([`Stage::Publishing`]); only then has the
//! content passed. A failed snapshot or publication is a fault of tend's
//! environment (a full disk), reported as action_failed and tried again
//! with the recheck back-off; so is a rollback that cannot put the previous
//! generation back.

use std::path::PathBuf;
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
    /// Passed its check; waits for its `splay` until then, and is published
    /// (or becomes [`Stage::Valid`]) after.
    Splaying(Fingerprint, Instant),
    /// Passed its check on a candidate copy, which is being published.
    Publishing(Fingerprint),
    /// Passed its check; its action waits for the next batch.
    Valid(Fingerprint),
    Acting(Fingerprint),
    /// Applied; `verify` runs until it passes or its time is up.
    Verifying(Fingerprint),
    /// `verify` failed: the previous generation is being put back.
    RollingBack(Fingerprint),
    /// Putting the previous generation back failed (the `publish`
    /// directory cannot be written): it is tried again then.
    RollbackAt(Fingerprint, Instant),
    /// `verify` failed without a generation to go back to: it runs again
    /// then (the failure may have been transient).
    ReverifyAt(Fingerprint, Instant),
    /// The action failed; try it again then.
    RetryAt(Fingerprint, Instant),
    /// The check failed; check the same content again then.
    RecheckAt(Fingerprint, Instant),
}

/// What a `publish` directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Published {
    /// A generation an earlier tend published (it passed its check then).
    Earlier,
    /// This content, published by this tend.
    Now(Fingerprint),
}

/// One watch's part of the pipeline.
struct Entry {
    name: String,
    action: Action,
    recheck: Duration,
    /// The watch has a `publish` directory.
    publish: bool,
    published: Option<Published>,
    /// The candidate copy being checked or published.
    candidate: Option<PathBuf>,
    /// The watch has a `verify`.
    verify: bool,
    /// The generation published before the one being verified, kept to
    /// roll back to, and what it holds.
    previous: Option<(PathBuf, Published)>,
    /// The action runs again to put the service back on the previous
    /// generation; the watch is rolled_back once it did.
    reapplying: bool,
    /// What the status shows of the verify that failed, while its rollback
    /// is on its way.
    verify_output: String,
    /// The end of the splay wait, for the status file.
    action_at: Option<SystemTime>,
    /// The newest content seen.
    seen: Option<Fingerprint>,
    /// The newest content that passed its check.
    passed: Option<Fingerprint>,
    stage: Stage,
    result: WatchResult,
    /// The service runs a config of this watch that passed its check and its
    /// action (readiness needs this of every watch).
    good: bool,
    /// The last output of its check (or verify, or why tend failed), as
    /// the status shows it: escaped once here, not at every status.
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

/// A command's output as the status shows it: every control character but
/// line breaks and tabs escaped.
fn shown(output: &str) -> String {
    crate::text::escape_keeping_lines(output)
}

/// One watch's part of the status file.
pub struct Report<'a> {
    pub name: &'a str,
    pub result: WatchResult,
    /// Escaped already.
    pub check_output: &'a str,
    pub changed_at: Option<SystemTime>,
    pub action_at: Option<SystemTime>,
}

pub struct Pipeline {
    entries: Vec<Entry>,
    /// Reloads that ended since [`Pipeline::take_outcomes`]: the watch, and
    /// whether its change was applied (false: rejected, or its action failed).
    outcomes: Vec<(WatchId, bool)>,
}

/// A snapshot that found the content changed is made again after this,
/// should the newer content's scan not come.
const SNAPSHOT_AGAIN: Duration = Duration::from_millis(250);

impl Entry {
    /// Its newest content was rejected, and the service runs the last good
    /// one: a rolled-back change only once the previous generation is back
    /// and applied again.
    fn runs_last_good(&self) -> bool {
        match self.result {
            WatchResult::Invalid => true,
            WatchResult::RolledBack => {
                !self.reapplying
                    && !matches!(self.stage, Stage::RollingBack(_) | Stage::RollbackAt(..))
            }
            _ => false,
        }
    }

    fn startable(&self) -> bool {
        if matches!(self.stage, Stage::RollingBack(_) | Stage::RollbackAt(..)) {
            // It starts on the generation being put back, once it is.
            return false;
        }
        let passed = self.seen.is_some() && self.passed == self.seen;
        if !self.publish {
            return passed;
        }
        // The published copy is what the service reads; but while the
        // newest content is still being decided it may become the copy.
        // Content applied by a restart is verified, and a generation put
        // back is applied again, before newer content: only a start lets
        // them be.
        let decided = passed
            || self.reapplying
            || matches!(self.stage, Stage::Verifying(_))
            || matches!(
                self.result,
                WatchResult::Invalid | WatchResult::ActionFailed | WatchResult::RolledBack
            );
        self.published.is_some() && decided
    }
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
                    publish: w.publish.is_some(),
                    published: None,
                    candidate: None,
                    verify: w.verify.is_some(),
                    previous: None,
                    reapplying: false,
                    verify_output: String::new(),
                    action_at: None,
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

    pub fn result(&self, id: WatchId) -> WatchResult {
        self.entries[id.0].result
    }

    /// An earlier tend published a generation for watch `id`.
    pub fn restore(&mut self, id: WatchId) {
        self.entry(id).published = Some(Published::Earlier);
    }

    pub fn publishes(&self, id: WatchId) -> bool {
        self.entries[id.0].publish
    }

    /// Whether the `publish` directory of watch `id` holds a generation
    /// that passed its check, which a start of the service reads.
    pub fn has_published(&self, id: WatchId) -> bool {
        self.entries[id.0].published.is_some()
    }

    /// Whether the check of `fp` for watch `id` is still wanted.
    pub fn is_checking(&self, id: WatchId, fp: Fingerprint) -> bool {
        self.entries[id.0].stage == Stage::Checking(fp)
    }

    pub fn set_candidate(&mut self, id: WatchId, candidate: PathBuf) {
        self.entry(id).candidate = Some(candidate);
    }

    pub fn take_candidate(&mut self, id: WatchId) -> Option<PathBuf> {
        self.entry(id).candidate.take()
    }

    /// The snapshot of `fp` found newer content: that content's scan
    /// arrives with it and is checked next; should it not (the content
    /// changed back), the snapshot is made again a moment later.
    pub fn snapshot_changed(&mut self, id: WatchId, fp: Fingerprint, now: Instant) {
        let e = self.entry(id);
        if e.stage == Stage::Checking(fp) {
            e.stage = if e.seen == Some(fp) {
                Stage::RecheckAt(fp, now + SNAPSHOT_AGAIN)
            } else {
                Stage::NeedsCheck
            };
        }
    }

    /// Snapshotting or publishing `fp` failed for a reason of tend's own
    /// (`why`: a full disk, permissions): the watch's action failed, and the
    /// whole step is tried again after the recheck back-off. Returns when.
    pub fn fault(&mut self, id: WatchId, fp: Fingerprint, why: String, now: Instant) -> Duration {
        let e = &mut self.entries[id.0];
        let again_in = e.recheck_delay;
        self.outcomes.push((id, false));
        e.check_output = shown(&why);
        e.good = false;
        if e.seen == Some(fp) {
            e.result = WatchResult::ActionFailed;
            e.recheck_delay = (e.recheck_delay * 2).min(RECHECK_MAX.max(e.recheck));
            e.stage = Stage::RecheckAt(fp, now + again_in);
        } else {
            e.stage = Stage::NeedsCheck;
        }
        again_in
    }

    /// A candidate that waits in no stage any more (newer content replaced
    /// a change in its splay wait): to be removed.
    pub fn orphaned_candidate(&mut self, id: WatchId) -> Option<PathBuf> {
        let e = self.entry(id);
        match e.stage {
            Stage::Checking(_) | Stage::Splaying(..) | Stage::Publishing(_) => None,
            _ => e.candidate.take(),
        }
    }

    /// `fp` passed its check: it waits until `until` (`wall` for the status
    /// file) before it is published or its action runs.
    pub fn hold(&mut self, id: WatchId, fp: Fingerprint, until: Instant, wall: SystemTime) {
        let e = self.entry(id);
        if matches!(e.stage, Stage::Valid(f) | Stage::Publishing(f) if f == fp) {
            e.stage = Stage::Splaying(fp, until);
            e.action_at = Some(wall);
        }
    }

    /// The splay waits that are over (every one, with `all`): those
    /// watches move on (to publishing, returned, or to their action).
    pub fn splays_due(&mut self, now: Instant, all: bool) -> Vec<(WatchId, Fingerprint)> {
        let mut publish = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let Stage::Splaying(fp, at) = e.stage
                && (all || at <= now)
            {
                e.action_at = None;
                if e.publish {
                    e.stage = Stage::Publishing(fp);
                    publish.push((WatchId(i), fp));
                } else {
                    e.stage = Stage::Valid(fp);
                }
            }
        }
        publish
    }

    pub fn splay_deadline(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter_map(|e| match e.stage {
                Stage::Splaying(_, at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// The candidate of `fp` is the published generation now, and the one
    /// published before is `previous` (kept for a rollback, when the watch
    /// verifies); `running`: a service runs, to be told. True when that
    /// was still wanted (it was).
    pub fn published(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        previous: Option<PathBuf>,
        running: bool,
    ) -> bool {
        let e = self.entry(id);
        if e.stage != Stage::Publishing(fp) {
            return false;
        }
        e.previous = match (previous, e.previous.take()) {
            // Still the one kept from before (what replaced it was not
            // verified).
            (Some(dir), Some((kept, what))) if dir == kept => Some((kept, what)),
            (previous, _) => previous.zip(e.published),
        };
        e.published = Some(Published::Now(fp));
        e.passed = Some(fp);
        e.recheck_delay = e.recheck;
        // The service is told even if newer content arrived meanwhile: the
        // copy it reads changed. The newer content is checked after. A
        // service that is down reads the copy when it starts, which waits
        // for the newer content's check.
        e.stage = if running || e.seen == Some(fp) {
            Stage::Valid(fp)
        } else {
            Stage::NeedsCheck
        };
        true
    }

    /// The generation kept to roll back to, if one is.
    pub fn kept(&self, id: WatchId) -> Option<PathBuf> {
        self.entries[id.0]
            .previous
            .as_ref()
            .map(|(dir, _)| dir.clone())
    }

    /// The generation kept to roll back to is published again, and the one
    /// published after it is gone (newer content replaced that change, which
    /// was not applied).
    pub fn withdrawn(&mut self, id: WatchId) {
        let e = self.entry(id);
        if let Some((_, kept)) = e.previous.take() {
            e.published = Some(kept);
            e.passed = match kept {
                Published::Now(p) => Some(p),
                Published::Earlier => None,
            };
        }
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
            Stage::Checking(_)
            | Stage::Publishing(_)
            | Stage::Acting(_)
            | Stage::Verifying(_)
            | Stage::RollingBack(_)
            | Stage::RollbackAt(..) => {}
            // The service goes back to the previous generation first.
            Stage::Valid(_) | Stage::RetryAt(..) if e.reapplying => {}
            // The newer content wins over a change still waiting.
            Stage::Idle
            | Stage::NeedsCheck
            | Stage::Splaying(..)
            | Stage::Valid(_)
            | Stage::RetryAt(..)
            | Stage::ReverifyAt(..)
            | Stage::RecheckAt(..) => {
                e.stage = Stage::NeedsCheck;
                e.action_at = None;
            }
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
        e.check_output = shown(&output);
        if e.seen != Some(fp) {
            e.stage = Stage::NeedsCheck;
            return Verdict::Stale;
        }
        if passed {
            if e.publish {
                // Passed only once published: a publication that keeps
                // failing goes on backing off.
                e.stage = Stage::Publishing(fp);
            } else {
                e.recheck_delay = e.recheck;
                e.passed = Some(fp);
                e.stage = Stage::Valid(fp);
            }
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
        self.entries.iter().any(|e| {
            matches!(
                e.stage,
                Stage::NeedsCheck | Stage::Checking(_) | Stage::Publishing(_)
            )
        })
    }

    /// Whether a fresh service process would read only checked content:
    /// only then may the service (re)start.
    pub fn startable(&self) -> bool {
        self.entries.iter().all(Entry::startable)
    }

    /// The first watch that keeps the service from starting.
    pub fn first_unpassed(&self) -> Option<(&str, WatchResult)> {
        self.entries
            .iter()
            .find(|e| !e.startable())
            .map(|e| (e.name.as_str(), e.result))
    }

    /// The service started: it reads every watch's newest content that
    /// passed its check (the published copy, with `publish`), so every
    /// pending action for that content is done. Returns the generations
    /// kept to roll back to that are no longer needed: a start is not
    /// verified, and what it runs is the base of the next change.
    pub fn started(&mut self) -> Vec<(WatchId, PathBuf)> {
        let mut unkept = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            let read = if e.publish {
                match e.published {
                    Some(Published::Now(fp)) => Some(fp),
                    _ => None,
                }
            } else {
                e.seen
            };
            if e.reapplying
                && let Stage::Valid(fp) | Stage::Acting(fp) | Stage::RetryAt(fp, _) = e.stage
            {
                // It started on the generation put back: that was the point.
                e.reapplying = false;
                e.retry_delay = RETRY_INITIAL;
                if e.seen == Some(fp) {
                    e.result = WatchResult::RolledBack;
                    e.stage = Stage::Idle;
                } else {
                    e.stage = Stage::NeedsCheck;
                }
                continue;
            }
            if let Stage::Valid(fp)
            | Stage::Acting(fp)
            | Stage::RetryAt(fp, _)
            | Stage::Splaying(fp, _) = e.stage
                && read == Some(fp)
            {
                e.action_at = None;
                e.stage = Stage::Idle;
                e.retry_delay = RETRY_INITIAL;
                if let Some((dir, _)) = e.previous.take() {
                    unkept.push((WatchId(i), dir));
                }
            }
            if e.stage == Stage::Idle && e.passed.is_some() && e.passed == e.seen {
                if e.result != WatchResult::Applied {
                    self.outcomes.push((WatchId(i), true));
                }
                e.result = WatchResult::Applied;
                e.good = true;
            }
        }
        unkept
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
        if ok && e.reapplying {
            // Back on the previous generation: the rejected content stays
            // seen, and is not applied again until it changes.
            e.reapplying = false;
            e.retry_delay = RETRY_INITIAL;
            if superseded {
                e.stage = Stage::NeedsCheck;
            } else {
                // Also after a failed try at putting it back.
                e.result = WatchResult::RolledBack;
                e.stage = Stage::Idle;
            }
        } else if ok {
            // With `publish`, content applied is verified even when newer
            // content waits: the generation kept to roll back to must be
            // one that passed its verify.
            let verify = e.verify && (e.publish || !superseded);
            if !verify {
                self.outcomes.push((id, true));
            }
            e.good = true;
            e.retry_delay = RETRY_INITIAL;
            if verify {
                e.stage = Stage::Verifying(fp);
                e.result = WatchResult::Verifying;
            } else if superseded {
                e.stage = Stage::NeedsCheck;
            } else {
                e.stage = Stage::Idle;
                e.result = WatchResult::Applied;
            }
        } else {
            self.outcomes.push((id, false));
            e.good = false;
            if superseded {
                // Newer content replaces the rejected one: it is applied
                // as any change, not as the rollback's action again.
                e.reapplying = false;
                e.stage = Stage::NeedsCheck;
            } else {
                e.result = WatchResult::ActionFailed;
                e.stage = Stage::RetryAt(fp, now + e.retry_delay);
                e.retry_delay = (e.retry_delay * 2).min(RETRY_MAX);
            }
        }
    }

    /// Watches whose `verify` should be running: applied, not yet verified.
    pub fn verifying(&self) -> Vec<(WatchId, Fingerprint)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e.stage {
                Stage::Verifying(fp) => Some((WatchId(i), fp)),
                _ => None,
            })
            .collect()
    }

    /// `verify` passed for `fp`: it is applied. Returns the generation kept
    /// for a rollback, no longer needed.
    pub fn verified(&mut self, id: WatchId, fp: Fingerprint, output: String) -> Option<PathBuf> {
        let e = &mut self.entries[id.0];
        if e.stage != Stage::Verifying(fp) {
            return None;
        }
        e.check_output = shown(&output);
        e.good = true;
        e.retry_delay = RETRY_INITIAL;
        self.outcomes.push((id, true));
        if e.seen == Some(fp) {
            e.result = WatchResult::Applied;
            e.stage = Stage::Idle;
        } else {
            e.result = WatchResult::Pending;
            e.stage = Stage::NeedsCheck;
        }
        e.previous.take().map(|(dir, _)| dir)
    }

    /// `verify` did not pass in time for `fp` (its last `output`). Returns
    /// the generation to put back, when there is one (with `publish`);
    /// otherwise the action failed, the content stays as it is, and verify
    /// runs again after a growing back-off ([`Pipeline::reverify_in`]).
    pub fn verify_failed(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        output: String,
        now: Instant,
    ) -> Option<PathBuf> {
        let e = &mut self.entries[id.0];
        if e.stage != Stage::Verifying(fp) {
            return None;
        }
        self.outcomes.push((id, false));
        e.check_output = shown(&output);
        e.good = false;
        if let Some((dir, _)) = &e.previous {
            e.verify_output = e.check_output.clone();
            e.stage = Stage::RollingBack(fp);
            e.result = WatchResult::RolledBack;
            return Some(dir.clone());
        }
        e.result = WatchResult::ActionFailed;
        e.stage = if e.seen == Some(fp) {
            let at = now + e.retry_delay;
            e.retry_delay = (e.retry_delay * 2).min(RETRY_MAX);
            Stage::ReverifyAt(fp, at)
        } else {
            Stage::NeedsCheck
        };
        None
    }

    /// How long until watch `id`'s failed verify runs again.
    pub fn reverify_in(&self, id: WatchId, now: Instant) -> Option<Duration> {
        match self.entries[id.0].stage {
            Stage::ReverifyAt(_, at) => Some(at.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// Failed verifies whose time to run again has come are verifying again.
    pub fn reverifies_due(&mut self, now: Instant) {
        for e in &mut self.entries {
            if let Stage::ReverifyAt(fp, at) = e.stage
                && at <= now
            {
                e.stage = Stage::Verifying(fp);
                e.result = WatchResult::Verifying;
            }
        }
    }

    /// The previous generation is published again (`Ok`): then the action
    /// runs again, so the service reads it. Or it could not be (`why`):
    /// the service still runs the rejected config, and the rollback is
    /// tried again after the back-off of a failed publication, returned.
    pub fn rolled_back(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        result: Result<(), String>,
        now: Instant,
    ) -> Option<Duration> {
        let e = self.entry(id);
        if e.stage != Stage::RollingBack(fp) {
            return None;
        }
        let output = std::mem::take(&mut e.verify_output);
        match result {
            Ok(()) => {
                let (_, previous) = e.previous.take()?;
                e.published = Some(previous);
                // A start now reads the generation put back: it must not
                // count as applying the rejected content.
                e.passed = match previous {
                    Published::Now(p) => Some(p),
                    Published::Earlier => None,
                };
                e.check_output = output;
                e.result = WatchResult::RolledBack;
                e.recheck_delay = e.recheck;
                e.reapplying = true;
                e.stage = Stage::Valid(fp);
                None
            }
            Err(why) => {
                let again_in = e.recheck_delay;
                e.recheck_delay = (e.recheck_delay * 2).min(RECHECK_MAX.max(e.recheck));
                // `output` is shown already (escaped when the verify ended).
                e.check_output = format!(
                    "{output}{}",
                    shown(&format!(
                        "\n[tend: cannot put the previous config back: {why}; trying again \
                         in {again_in:?}]"
                    ))
                );
                e.verify_output = output;
                e.result = WatchResult::ActionFailed;
                e.stage = Stage::RollbackAt(fp, now + again_in);
                Some(again_in)
            }
        }
    }

    /// Newer content waits for a failed rollback of watch `id`: it is
    /// tried again now, not after its back-off (which may have grown to
    /// [`RECHECK_MAX`] while the disk was full).
    pub fn rollback_now(&mut self, id: WatchId, now: Instant) {
        let e = self.entry(id);
        if let Stage::RollbackAt(fp, at) = e.stage
            && at > now
        {
            e.stage = Stage::RollbackAt(fp, now);
        }
    }

    /// Rollbacks whose next try is due are on their way again: the
    /// watches, the rejected content, and the generation to put back.
    pub fn rollbacks_due(&mut self, now: Instant) -> Vec<(WatchId, Fingerprint, PathBuf)> {
        let mut due = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if let Stage::RollbackAt(fp, at) = e.stage
                && at <= now
                && let Some((dir, _)) = &e.previous
            {
                e.stage = Stage::RollingBack(fp);
                due.push((WatchId(i), fp, dir.clone()));
            }
        }
        due
    }

    /// When a failed rollback is next tried again.
    pub fn rollback_deadline(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter_map(|e| match e.stage {
                Stage::RollbackAt(_, at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// The content `fp`, being checked, is the one an earlier tend rolled
    /// back: it stays rejected until it changes, like one rolled back now.
    pub fn rolled_back_before(&mut self, id: WatchId, fp: Fingerprint) {
        let e = &mut self.entries[id.0];
        if e.stage != Stage::Checking(fp) {
            return;
        }
        e.stage = Stage::Idle;
        e.result = WatchResult::RolledBack;
        e.good = false;
        e.check_output = "[tend: this config was rolled back before tend started: its verify \
                          failed, or was cut short when tend stopped; it is not applied again \
                          until it changes]"
            .to_string();
        self.outcomes.push((id, false));
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

    /// When a failed verify next runs again.
    pub fn reverify_deadline(&self) -> Option<Instant> {
        self.entries
            .iter()
            .filter_map(|e| match e.stage {
                Stage::ReverifyAt(_, at) => Some(at),
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
            .all(|e| e.good || (invalid_ok && e.runs_last_good()))
    }

    /// A watch's newest content was rejected (by its check, or by its
    /// verify and rolled back).
    pub fn any_invalid(&self) -> bool {
        self.entries.iter().any(|e| e.result.rejected())
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
            action_at: e.action_at,
        })
    }
}
