//! One watch's reload pipeline: change -> check -> (splay) -> (publish) ->
//! action -> (verify, or roll back).
//!
//! [`Watch::handle`] is the one way in: the core passes what happened to
//! this watch ([`Input`]) and what its service is doing ([`ServiceView`]),
//! and collects what to do ([`Output`]). A reader lists every state of a
//! watch from [`State`]; each variant holds what that state needs.
//!
//! Rules:
//! - A change arriving while the check or action runs is not lost: when that
//!   finishes, the newest content is checked. Bursts coalesce and the last
//!   state wins.
//! - A failed check is checked again after `recheck`, doubling up to
//!   [`RECHECK_MAX`], until it passes or the content changes: a check that
//!   failed for a transient reason must not keep a pod down for good.
//! - A failed action is retried with a growing back-off.
//! - The service may (re)start only when it would read checked content
//!   ([`Watch::startable`]): the newest content passed its check, or, with
//!   `publish`, the published copy (which only ever holds content that
//!   passed) once the newest content's check is decided.
//!
//! `publish`: the check runs on a candidate copy, and a passing candidate is
//! published before the action ([`State::Publishing`]); only then has the
//! content passed. A failed snapshot or publication is a fault of tend's
//! environment (a full disk), reported as action_failed and tried again
//! with the recheck back-off; so is a rollback that cannot put the previous
//! generation back.
//!
//! `verify`: after the action, the verify command runs until it passes or
//! `verify_timeout` is up ([`State::Verifying`]); with `publish`, a change
//! that fails it is rolled back to the generation kept for that
//! ([`State::RollingBack`]), and the action runs again to put the service
//! back on it.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crate::config::{self, Action};
use crate::core::protocol::{
    Candidate, Command, Fingerprint, Keep, Now, Report, ServiceId, SnapshotError, WatchId,
};
use crate::core::status::{WatchResult, WatchStatus};

/// The first retry of a failed action.
pub const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Retries of failed actions back off up to this.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Rechecks of failed checks back off up to this.
pub const RECHECK_MAX: Duration = Duration::from_secs(60);
/// `verify` runs again after a failure, backing off up to this.
const VERIFY_AGAIN_INITIAL: Duration = Duration::from_millis(250);
const VERIFY_AGAIN_MAX: Duration = Duration::from_secs(2);
/// A snapshot that found the content changed is made again after this,
/// should the newer content's scan not come.
const SNAPSHOT_AGAIN: Duration = Duration::from_millis(250);

/// Where a watch's newest content is in the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Nothing to do until the content changes.
    Idle,
    /// The newest content waits for its check.
    NeedsCheck,
    /// The newest content's check is on its way.
    Checking {
        fp: Fingerprint,
        step: CheckStep,
    },
    /// The check failed; the same content is checked again then.
    RecheckAt {
        fp: Fingerprint,
        at: Instant,
    },
    /// Passed its check; waits for its `splay` (the status shows `wall`),
    /// then is published (`candidate`) or acted on.
    Splaying {
        fp: Fingerprint,
        until: Instant,
        wall: SystemTime,
        candidate: Option<PathBuf>,
    },
    /// Passed its check on a candidate copy, which is being published.
    Publishing {
        fp: Fingerprint,
    },
    /// Passed; its action waits for the next batch of its service. With
    /// `reapply`, the action puts the service back on the generation before
    /// `fp`, which was rolled back.
    Valid {
        fp: Fingerprint,
        reapply: bool,
    },
    Acting {
        fp: Fingerprint,
        reapply: bool,
    },
    /// The action failed; it is tried again then.
    RetryAt {
        fp: Fingerprint,
        at: Instant,
        reapply: bool,
    },
    /// Applied; `verify` runs (once the service serves) until it passes or
    /// its time is up.
    Verifying {
        fp: Fingerprint,
        run: Option<Verification>,
    },
    /// `verify` failed: the previous generation is being put back. What the
    /// failed verify printed is shown once it is.
    RollingBack {
        fp: Fingerprint,
        output: String,
    },
    /// Putting the previous generation back failed (the `publish` directory
    /// cannot be written): it is tried again then.
    RollbackAt {
        fp: Fingerprint,
        at: Instant,
        output: String,
    },
    /// `verify` failed without a generation to go back to: it runs again
    /// then (the failure may have been transient).
    ReverifyAt {
        fp: Fingerprint,
        at: Instant,
    },
}

/// The steps of a check with `publish`: the generation kept to roll back to
/// is published again first when what followed it was never applied, then
/// the content is copied, then the check runs on the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CheckStep {
    Withdrawing,
    Copying,
    Running { candidate: Option<PathBuf> },
}

/// A `verify` in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verification {
    /// Not passed by then: failed.
    deadline: Instant,
    /// When it runs next; None while it runs, or when no run fits before
    /// the deadline.
    next_at: Option<Instant>,
    /// A run is in flight: it is killed at `deadline` (its own timeout),
    /// and what it printed until then is the output the failure shows.
    running: bool,
    delay: Duration,
    output: String,
}

/// What a `publish` directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Published {
    /// A generation an earlier tend published (it passed its check then).
    Earlier,
    /// This content, published by this tend.
    Now(Fingerprint),
}

/// A generation kept to roll back to, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept {
    dir: PathBuf,
    holds: Published,
}

/// What the watch's service is doing, as far as the pipeline cares.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceView {
    /// tend stops: nothing moves any more.
    pub stopping: bool,
    /// An instance runs (or an overlap restart is under way): a change is
    /// acted on, may wait for its splay, and is verified.
    pub runs: bool,
    /// An instance runs, is ready, and is not being stopped: `verify` can
    /// run.
    pub serving: bool,
    /// Down and waiting for checked config: it starts on the newest
    /// checked content at once, without a splay.
    pub down: bool,
    /// It never started yet.
    pub first: bool,
    /// Its actions can run now: an instance runs, and no stop, restart or
    /// reload confirmation is under way.
    pub can_act: bool,
}

/// What happened that concerns one watch.
#[derive(Debug)]
pub enum Input {
    /// Its newest scan.
    Content(Report),
    /// Its check of `fp` ended (or could not run: not passed).
    Checked {
        fp: Fingerprint,
        passed: bool,
        /// How it ended, for the log ("exit code 1").
        describe: String,
        took: Duration,
        output: String,
    },
    Snapshot {
        fp: Fingerprint,
        result: Result<Candidate, SnapshotError>,
    },
    Published {
        fp: Fingerprint,
        result: Result<Option<PathBuf>, String>,
    },
    RolledBack {
        fp: Fingerprint,
        result: Result<(), String>,
    },
    Withdrawn {
        fp: Fingerprint,
        result: Result<(), String>,
    },
    /// Its `verify` of `fp` ended (or could not run).
    Verified {
        fp: Fingerprint,
        passed: bool,
        describe: String,
        output: String,
    },
    /// Its action ended.
    ActionEnded { ok: bool },
    /// An instance of its service started: it reads the newest checked
    /// content (the published copy, with `publish`).
    ServiceStarted,
    /// Its service exited (`why`) while a change was verified.
    ServiceExited { why: String },
    /// The batch of its service is being made: its action, if one is due,
    /// comes back as [`Output::Act`].
    Act,
    /// Time passed, or something changed: do what is due.
    Tick,
}

/// What a watch asks for.
#[derive(Debug, PartialEq)]
pub enum Output {
    /// A request for the watcher thread (snapshot, publish, roll back,
    /// withdraw, discard).
    Watcher(Command),
    /// Run the check on `fp`.
    Check {
        fp: Fingerprint,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        timeout: Duration,
    },
    /// Run `verify` on `fp`, for at most `timeout`.
    Verify { fp: Fingerprint, timeout: Duration },
    /// Stop its `verify` if one runs: its result no longer matters.
    CancelVerify,
    /// A reload ended: applied (true), or rejected or failed.
    Reloaded(bool),
    /// Its action is due now (an answer to [`Input::Act`]).
    Act(Action),
}

/// What [`Watch::handle`] needs besides the input.
pub struct Cx<'a> {
    pub now: Now,
    pub service: ServiceView,
    /// For splay waits.
    pub rng: &'a mut Rng,
    pub out: &'a mut Vec<Output>,
}

/// splitmix64: no cryptography, just an even spread of splay waits across
/// replicas (seeded from the shell: the core reads no entropy itself).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A uniformly random duration in [0, `below`), to the microsecond.
    pub fn below(&mut self, below: Duration) -> Duration {
        let micros = below.as_micros() as u64;
        if micros == 0 {
            return Duration::ZERO;
        }
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Duration::from_micros(z % micros)
    }
}

/// A command's output as the status shows it: every control character but
/// line breaks and tabs escaped.
fn shown(output: &str) -> String {
    crate::text::escape_keeping_lines(output)
}

pub struct Watch {
    pub id: WatchId,
    pub service: ServiceId,
    cfg: config::Watch,
    state: State,
    /// The newest content seen.
    seen: Option<Fingerprint>,
    /// The newest content that passed its check (and, with `publish`, was
    /// published).
    passed: Option<Fingerprint>,
    /// What the `publish` directory holds.
    published: Option<Published>,
    /// The generation published before the one being verified, kept to
    /// roll back to.
    kept: Option<Kept>,
    result: WatchResult,
    /// The service runs a config of this watch that passed its check and its
    /// action (readiness needs this of every watch).
    good: bool,
    /// The last output of its check (or verify, or why tend failed), as
    /// the status shows it: escaped once here, not at every status.
    output: String,
    changed_at: Option<SystemTime>,
    retry_delay: Duration,
    recheck_delay: Duration,
    /// Its paths that the newest scan did not find, unless the watch is
    /// `optional`: a volume that is not mounted keeps tend not ready.
    absent: Vec<PathBuf>,
}

impl Watch {
    pub fn new(id: WatchId, service: ServiceId, cfg: &config::Watch) -> Watch {
        Watch {
            id,
            service,
            state: State::Idle,
            seen: None,
            passed: None,
            published: None,
            kept: None,
            result: WatchResult::Pending,
            good: false,
            output: String::new(),
            changed_at: None,
            retry_delay: RETRY_INITIAL,
            recheck_delay: cfg.recheck,
            absent: Vec::new(),
            cfg: cfg.clone(),
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    pub fn config(&self) -> &config::Watch {
        &self.cfg
    }

    pub fn result(&self) -> WatchResult {
        self.result
    }

    /// An earlier tend published a generation for this watch: the service
    /// may start on it while the newest content is rejected. Before the
    /// first event.
    pub fn restore(&mut self) {
        self.published = Some(Published::Earlier);
    }

    /// Takes what happened to this watch; what to do goes to `cx.out`.
    pub fn handle(&mut self, input: Input, cx: &mut Cx<'_>) {
        match input {
            Input::Content(report) if !cx.service.stopping => self.on_content(report, cx),
            Input::Content(_) => {}
            Input::Checked {
                fp,
                passed,
                describe,
                took,
                output,
            } => {
                if !cx.service.stopping {
                    self.on_checked(fp, passed, &describe, took, output, cx);
                }
            }
            Input::Snapshot { fp, result } => self.on_snapshot(fp, result, cx),
            Input::Published { fp, result } => self.on_published(fp, result, cx),
            Input::RolledBack { fp, result } => self.on_rolled_back(fp, result, cx),
            Input::Withdrawn { fp, result } => {
                if !cx.service.stopping {
                    self.on_withdrawn(fp, result, cx);
                }
            }
            Input::Verified {
                fp,
                passed,
                describe,
                output,
            } => {
                if !cx.service.stopping {
                    self.on_verified(fp, passed, &describe, output, cx);
                }
            }
            Input::ActionEnded { ok } => self.action_ended(ok, cx.now.mono, cx),
            Input::ServiceStarted => self.service_started(cx),
            Input::ServiceExited { why } => {
                if matches!(self.state, State::Verifying { .. }) {
                    cx.out.push(Output::CancelVerify);
                    self.verify_failed(why, cx);
                }
            }
            Input::Act => self.act(cx),
            Input::Tick if cx.service.stopping => {}
            Input::Tick => self.tick(cx),
        }
    }

    // ------------------------------------------------------------ content

    fn on_content(&mut self, c: Report, cx: &mut Cx<'_>) {
        let name = self.cfg.name.clone();
        let fp = c.fingerprint;
        let previous = self.seen;
        if previous == Some(fp) {
            tracing::debug!(watch = name, "scanned: content unchanged");
            // An empty directory where nothing was has the same content.
            self.note_absent(c.missing);
            return;
        }
        self.seen = Some(fp);
        self.changed_at = Some(cx.now.wall);
        self.result = WatchResult::Pending;
        // New content is a new config: its rechecks start from the first delay.
        self.recheck_delay = self.cfg.recheck;
        let now = cx.now.mono;
        match &mut self.state {
            // Picked up when the running check or action finishes.
            State::Checking { .. }
            | State::Publishing { .. }
            | State::Acting { .. }
            | State::Verifying { .. }
            | State::RollingBack { .. } => {}
            // Also, but the previous config must come back first: a
            // rollback that failed (a full disk) is tried again at once,
            // not after its back-off.
            State::RollbackAt { at, .. } => *at = (*at).min(now),
            // The service goes back to the previous generation first.
            State::Valid { reapply: true, .. } | State::RetryAt { reapply: true, .. } => {}
            // The newer content wins over a change still waiting; a
            // candidate that waited for its splay is removed.
            State::Splaying { candidate, .. } => {
                if let Some(candidate) = candidate.take() {
                    cx.out.push(Output::Watcher(Command::Discard {
                        watch: self.id,
                        candidate,
                    }));
                }
                self.state = State::NeedsCheck;
            }
            State::Idle
            | State::NeedsCheck
            | State::Valid { .. }
            | State::RetryAt { .. }
            | State::ReverifyAt { .. }
            | State::RecheckAt { .. } => self.state = State::NeedsCheck,
        }
        match previous {
            None => tracing::info!(
                watch = name,
                fingerprint = fp.short(),
                files = c.files,
                missing = ?c.missing,
                "config found"
            ),
            Some(old) => tracing::info!(
                watch = name,
                paths = ?c.changed,
                files = c.files,
                missing = ?c.missing,
                "change detected: {} -> {}",
                old.short(),
                fp.short()
            ),
        }
        if !c.unreadable.is_empty() {
            tracing::warn!(
                watch = name,
                unreadable = ?c.unreadable,
                "part of the watched config cannot be read; the check decides whether the config is valid without it"
            );
        }
        self.note_absent(c.missing);
    }

    /// Takes the paths the newest scan did not find; says once when one
    /// goes missing, and when it is there again.
    fn note_absent(&mut self, missing: Vec<PathBuf>) {
        if self.cfg.optional {
            return;
        }
        let name = &self.cfg.name;
        for path in missing.iter().filter(|p| !self.absent.contains(p)) {
            tracing::warn!(
                watch = name,
                "{} does not exist: tend is not ready until it does; mount the volume there \
                 (check the volumeMount's mountPath), or set optional = true on the watch if it \
                 may be absent",
                path.display()
            );
        }
        for path in self.absent.iter().filter(|p| !missing.contains(p)) {
            tracing::info!(watch = name, "{} exists now", path.display());
        }
        self.absent = missing;
    }

    // ------------------------------------------------------------ checks

    /// Starts the check of the newest content, or its first step.
    fn start_check(&mut self, fp: Fingerprint, cx: &mut Cx<'_>) {
        if let Some(kept) = &self.kept {
            // What is published now was not applied (its action failed,
            // or has not run): it goes before a third generation comes.
            cx.out.push(Output::Watcher(Command::Withdraw {
                watch: self.id,
                fingerprint: fp,
                kept: kept.dir.clone(),
            }));
            self.state = State::Checking {
                fp,
                step: CheckStep::Withdrawing,
            };
            return;
        }
        if self.cfg.publish.is_some() {
            // The check runs on a copy: the content it checks is the
            // content that is published.
            cx.out.push(Output::Watcher(Command::Snapshot {
                watch: self.id,
                fingerprint: fp,
            }));
            self.state = State::Checking {
                fp,
                step: CheckStep::Copying,
            };
            return;
        }
        self.run_check(fp, None, cx);
    }

    /// Runs the check of `fp` (on `candidate`, with `publish`); without a
    /// check, the content passes at once.
    fn run_check(&mut self, fp: Fingerprint, candidate: Option<PathBuf>, cx: &mut Cx<'_>) {
        let argv = self.cfg.check.clone();
        self.state = State::Checking {
            fp,
            step: CheckStep::Running {
                candidate: candidate.clone(),
            },
        };
        match argv {
            None => self.on_checked(fp, true, "", Duration::ZERO, String::new(), cx),
            Some(argv) => {
                let (argv, env) = match &candidate {
                    Some(dir) => {
                        let dir = dir.to_string_lossy().into_owned();
                        let argv = argv
                            .iter()
                            .map(|a| a.replace(config::CANDIDATE, &dir))
                            .collect();
                        (argv, vec![("TEND_CANDIDATE".to_string(), dir)])
                    }
                    None => (argv, Vec::new()),
                };
                cx.out.push(Output::Check {
                    fp,
                    argv,
                    env,
                    timeout: self.cfg.check_timeout,
                });
            }
        }
    }

    fn on_checked(
        &mut self,
        fp: Fingerprint,
        passed: bool,
        describe: &str,
        took: Duration,
        output: String,
        cx: &mut Cx<'_>,
    ) {
        let name = self.cfg.name.clone();
        let tail = crate::text::for_log(&output);
        let State::Checking {
            fp: checking,
            step: CheckStep::Running { candidate },
        } = &mut self.state
        else {
            return;
        };
        if *checking != fp {
            return;
        }
        let candidate = candidate.take();
        self.output = shown(&output);
        if self.seen != Some(fp) {
            self.state = State::NeedsCheck;
            self.discard(candidate, cx);
            tracing::info!(
                watch = name,
                "check result dropped: the config changed while it ran; checking again"
            );
            return;
        }
        if !passed {
            let recheck_in = self.recheck_delay;
            self.recheck_delay = (self.recheck_delay * 2).min(RECHECK_MAX.max(self.cfg.recheck));
            self.state = State::RecheckAt {
                fp,
                at: cx.now.mono + recheck_in,
            };
            self.result = WatchResult::Invalid;
            self.good = false;
            cx.out.push(Output::Reloaded(false));
            self.discard(candidate, cx);
            let consequence = if cx.service.runs {
                "the new config is rejected and the service keeps running on the last good one"
            } else if self.published.is_some() {
                "the new config is rejected and the service starts on the last good copy, published before"
            } else if cx.service.first {
                "the service is not started until a valid config arrives"
            } else {
                "the service stays down until a valid config arrives"
            };
            tracing::warn!(
                watch = name,
                took = ?took,
                "check failed ({describe}): {consequence}; checking again in {recheck_in:?}{tail}"
            );
            return;
        }
        tracing::info!(watch = name, took = ?took, "check passed");
        if self.cfg.publish.is_none() {
            self.recheck_delay = self.cfg.recheck;
            self.passed = Some(fp);
        }
        // A passing change waits for its splay only while the service runs:
        // a start never waits.
        let wait = if cx.service.runs {
            cx.rng.below(self.cfg.splay)
        } else {
            Duration::ZERO
        };
        if !wait.is_zero() {
            tracing::info!(
                watch = name,
                "the new config waits {wait:.1?} (splay = {:?}) before it is applied",
                self.cfg.splay
            );
            self.state = State::Splaying {
                fp,
                until: cx.now.mono + wait,
                wall: cx.now.wall + wait,
                candidate,
            };
        } else {
            self.passed_on(fp, candidate, cx);
        }
    }

    /// `fp` passed its check (and its splay): it is published, or waits
    /// for its action.
    fn passed_on(&mut self, fp: Fingerprint, candidate: Option<PathBuf>, cx: &mut Cx<'_>) {
        match candidate {
            Some(candidate) => {
                // Passed only once published: a publication that keeps
                // failing goes on backing off. When an action will be
                // verified, the generation to roll back to is kept: the
                // one it replaces. (One kept from before, while what
                // replaced it was not verified, was published again
                // before the candidate was made: see Command::Withdraw.
                // Were it still kept, it would stay the one to go back
                // to.)
                let keep = match (&self.cfg.verify, &self.kept) {
                    (None, _) => Keep::Nothing,
                    (Some(_), None) => Keep::Published,
                    (Some(_), Some(k)) => Keep::Generation(k.dir.clone()),
                };
                cx.out.push(Output::Watcher(Command::Publish {
                    watch: self.id,
                    fingerprint: fp,
                    candidate,
                    keep,
                }));
                self.state = State::Publishing { fp };
            }
            None => {
                self.state = State::Valid { fp, reapply: false };
            }
        }
    }

    fn discard(&self, candidate: Option<PathBuf>, cx: &mut Cx<'_>) {
        if let Some(candidate) = candidate {
            cx.out.push(Output::Watcher(Command::Discard {
                watch: self.id,
                candidate,
            }));
        }
    }

    /// The step of `fp` is not in this state any more (newer content, or
    /// tend stops): its result is not wanted.
    fn checking(&self, fp: Fingerprint, step: &CheckStep) -> bool {
        matches!(&self.state, State::Checking { fp: f, step: s } if *f == fp && std::mem::discriminant(s) == std::mem::discriminant(step))
    }

    /// The candidate copy of `fp` is made (or not): check it.
    fn on_snapshot(
        &mut self,
        fp: Fingerprint,
        result: Result<Candidate, SnapshotError>,
        cx: &mut Cx<'_>,
    ) {
        let name = self.cfg.name.clone();
        let wanted = !cx.service.stopping && self.checking(fp, &CheckStep::Copying);
        let candidate = match result {
            Ok(c) if wanted && !c.rejected => c.dir,
            Ok(c) => {
                if wanted {
                    tracing::warn!(
                        watch = name,
                        fingerprint = fp.short(),
                        "this config was rolled back before tend started (its verify failed, or \
                         was cut short when tend stopped): the previous one stays until the \
                         config changes"
                    );
                    self.state = State::Idle;
                    self.result = WatchResult::RolledBack;
                    self.good = false;
                    self.output = "[tend: this config was rolled back before tend started: its \
                                   verify failed, or was cut short when tend stopped; it is not \
                                   applied again until it changes]"
                        .to_string();
                    cx.out.push(Output::Reloaded(false));
                }
                self.discard(Some(c.dir), cx);
                return;
            }
            Err(_) if !wanted => return,
            Err(SnapshotError::Changed) => {
                tracing::debug!(
                    watch = name,
                    "the config changed while it was copied: copying the newer one"
                );
                // That content's scan arrives with it and is checked next;
                // should it not (the content changed back), the snapshot is
                // made again a moment later.
                self.state = if self.seen == Some(fp) {
                    State::RecheckAt {
                        fp,
                        at: cx.now.mono + SNAPSHOT_AGAIN,
                    }
                } else {
                    State::NeedsCheck
                };
                return;
            }
            Err(SnapshotError::Rejected(why)) => {
                self.state = State::Checking {
                    fp,
                    step: CheckStep::Running { candidate: None },
                };
                self.on_checked(fp, false, "env_from", Duration::ZERO, why, cx);
                return;
            }
            Err(SnapshotError::Failed(why)) => {
                let again = self.fault(fp, why.clone(), cx);
                tracing::error!(
                    watch = name,
                    "cannot copy the new config for publishing: {why}; trying again in {again:?}"
                );
                return;
            }
        };
        tracing::debug!(watch = name, candidate = %candidate.display(), "copied the new config");
        self.run_check(fp, Some(candidate), cx);
    }

    /// Snapshotting, publishing or withdrawing for `fp` failed for a reason
    /// of tend's own (`why`: a full disk, permissions): the watch's action
    /// failed, and the whole step is tried again after the recheck
    /// back-off. Returns when.
    fn fault(&mut self, fp: Fingerprint, why: String, cx: &mut Cx<'_>) -> Duration {
        let again_in = self.recheck_delay;
        cx.out.push(Output::Reloaded(false));
        self.output = shown(&why);
        self.good = false;
        if self.seen == Some(fp) {
            self.result = WatchResult::ActionFailed;
            self.recheck_delay = (self.recheck_delay * 2).min(RECHECK_MAX.max(self.cfg.recheck));
            self.state = State::RecheckAt {
                fp,
                at: cx.now.mono + again_in,
            };
        } else {
            self.state = State::NeedsCheck;
        }
        again_in
    }

    /// The change published after the generation kept to roll back to is
    /// withdrawn (or not): the newer content `fp` is copied now.
    fn on_withdrawn(&mut self, fp: Fingerprint, result: Result<(), String>, cx: &mut Cx<'_>) {
        if !self.checking(fp, &CheckStep::Withdrawing) {
            return;
        }
        let name = self.cfg.name.clone();
        match result {
            Ok(()) => {
                tracing::info!(
                    watch = name,
                    "the published config, not applied, is replaced by a newer one: published \
                     the previous config again while the newer one is checked"
                );
                // The generation kept is the published one again, and the
                // one published after it is gone.
                if let Some(kept) = self.kept.take() {
                    self.published = Some(kept.holds);
                    self.passed = match kept.holds {
                        Published::Now(p) => Some(p),
                        Published::Earlier => None,
                    };
                }
                self.start_check(fp, cx);
            }
            Err(why) => {
                let why = format!(
                    "cannot publish the previous config again before the newer one is checked: \
                     {why}"
                );
                let again = self.fault(fp, why.clone(), cx);
                tracing::error!(watch = name, "{why}; trying again in {again:?}");
            }
        }
    }

    // ------------------------------------------------------------ publishing

    /// The candidate of `fp` is published (or not): its action follows.
    fn on_published(
        &mut self,
        fp: Fingerprint,
        result: Result<Option<PathBuf>, String>,
        cx: &mut Cx<'_>,
    ) {
        let name = self.cfg.name.clone();
        match result {
            Ok(previous) => {
                // Only an action on a running service is verified (and
                // rolled back): a start is not.
                let previous = match previous {
                    Some(p) if !cx.service.runs => {
                        self.discard(Some(p), cx);
                        None
                    }
                    p => p,
                };
                if self.state != (State::Publishing { fp }) {
                    return;
                }
                self.kept = match (previous, self.kept.take()) {
                    // Still the one kept from before (what replaced it was
                    // not verified).
                    (Some(dir), Some(kept)) if dir == kept.dir => Some(kept),
                    (previous, _) => previous
                        .zip(self.published)
                        .map(|(dir, holds)| Kept { dir, holds }),
                };
                self.published = Some(Published::Now(fp));
                self.passed = Some(fp);
                self.recheck_delay = self.cfg.recheck;
                // A running service is told even if newer content arrived
                // meanwhile: the copy it reads changed, and the newer
                // content is checked after. A service that is down starts
                // on the newest content, which is checked first.
                self.state = if cx.service.runs || self.seen == Some(fp) {
                    State::Valid { fp, reapply: false }
                } else {
                    State::NeedsCheck
                };
                tracing::info!(
                    watch = name,
                    fingerprint = fp.short(),
                    "published the new config"
                );
            }
            Err(why) => {
                if self.state != (State::Publishing { fp }) {
                    return;
                }
                let again = self.fault(fp, why.clone(), cx);
                tracing::error!(
                    watch = name,
                    "cannot publish the new config: {why}; trying again in {again:?}"
                );
            }
        }
    }

    // ------------------------------------------------------------ actions

    /// Its action, if one is due: the change passed (or a retry is due).
    fn act(&mut self, cx: &mut Cx<'_>) {
        let (fp, reapply) = match self.state {
            State::Valid { fp, reapply } => (fp, reapply),
            State::RetryAt { fp, at, reapply } if at <= cx.now.mono => (fp, reapply),
            _ => return,
        };
        self.state = State::Acting { fp, reapply };
        cx.out.push(Output::Act(self.cfg.action.clone()));
    }

    /// Whether its action is on its way (a restart in progress).
    pub fn acting(&self) -> bool {
        matches!(self.state, State::Acting { .. })
    }

    fn action_ended(&mut self, ok: bool, now: Instant, cx: &mut Cx<'_>) {
        let State::Acting { fp, reapply } = self.state else {
            return;
        };
        let superseded = self.seen != Some(fp);
        if ok && reapply {
            // Back on the previous generation: the rejected content stays
            // seen, and is not applied again until it changes.
            self.retry_delay = RETRY_INITIAL;
            if superseded {
                self.state = State::NeedsCheck;
            } else {
                // Also after a failed try at putting it back.
                self.result = WatchResult::RolledBack;
                self.state = State::Idle;
            }
        } else if ok {
            // With `publish`, content applied is verified even when newer
            // content waits: the generation kept to roll back to must be
            // one that passed its verify.
            let verify = self.cfg.verify.is_some() && (self.cfg.publish.is_some() || !superseded);
            if !verify {
                cx.out.push(Output::Reloaded(true));
            }
            self.good = true;
            self.retry_delay = RETRY_INITIAL;
            if verify {
                self.state = State::Verifying { fp, run: None };
                self.result = WatchResult::Verifying;
            } else if superseded {
                self.state = State::NeedsCheck;
            } else {
                self.state = State::Idle;
                self.result = WatchResult::Applied;
            }
        } else {
            cx.out.push(Output::Reloaded(false));
            self.good = false;
            if superseded {
                self.state = State::NeedsCheck;
            } else {
                self.result = WatchResult::ActionFailed;
                self.state = State::RetryAt {
                    fp,
                    at: now + self.retry_delay,
                    reapply,
                };
                self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
            }
        }
    }

    /// How long until a failed action is tried again.
    pub fn retry_in(&self, now: Instant) -> Option<Duration> {
        match self.state {
            State::RetryAt { at, .. } => Some(at.saturating_duration_since(now)),
            _ => None,
        }
    }

    /// An instance of the service started: it reads the newest content
    /// that passed its check (the published copy, with `publish`), so every
    /// pending action for that content is done. A generation kept to roll
    /// back to is not needed any more: a start is not verified, and what it
    /// runs is the base of the next change.
    fn service_started(&mut self, cx: &mut Cx<'_>) {
        let read = if self.cfg.publish.is_some() {
            match self.published {
                Some(Published::Now(fp)) => Some(fp),
                _ => None,
            }
        } else {
            self.seen
        };
        match self.state {
            State::Valid {
                fp, reapply: true, ..
            }
            | State::Acting {
                fp, reapply: true, ..
            }
            | State::RetryAt {
                fp, reapply: true, ..
            } => {
                // It started on the generation put back: that was the point.
                self.retry_delay = RETRY_INITIAL;
                if self.seen == Some(fp) {
                    self.result = WatchResult::RolledBack;
                    self.state = State::Idle;
                } else {
                    self.state = State::NeedsCheck;
                }
                return;
            }
            State::Valid { fp, .. }
            | State::Acting { fp, .. }
            | State::RetryAt { fp, .. }
            | State::Splaying { fp, .. }
                if read == Some(fp) =>
            {
                if let State::Splaying {
                    candidate: Some(c), ..
                } = &mut self.state
                {
                    let c = std::mem::take(c);
                    self.discard(Some(c), cx);
                }
                self.state = State::Idle;
                self.retry_delay = RETRY_INITIAL;
                if let Some(kept) = self.kept.take() {
                    self.discard(Some(kept.dir), cx);
                }
            }
            _ => {}
        }
        if self.state == State::Idle && self.passed.is_some() && self.passed == self.seen {
            if self.result != WatchResult::Applied {
                cx.out.push(Output::Reloaded(true));
            }
            self.result = WatchResult::Applied;
            self.good = true;
        }
    }

    // ------------------------------------------------------------ verify

    fn on_verified(
        &mut self,
        fp: Fingerprint,
        passed: bool,
        describe: &str,
        output: String,
        cx: &mut Cx<'_>,
    ) {
        let name = self.cfg.name.clone();
        let State::Verifying {
            fp: verifying,
            run: Some(v),
        } = &mut self.state
        else {
            return;
        };
        if *verifying != fp {
            return;
        }
        if passed {
            tracing::info!(watch = name, "verify passed: config applied");
            self.output = shown(&output);
            self.good = true;
            self.retry_delay = RETRY_INITIAL;
            cx.out.push(Output::Reloaded(true));
            if self.seen == Some(fp) {
                self.result = WatchResult::Applied;
                self.state = State::Idle;
            } else {
                self.result = WatchResult::Pending;
                self.state = State::NeedsCheck;
            }
            if let Some(kept) = self.kept.take() {
                self.discard(Some(kept.dir), cx);
            }
            return;
        }
        let now = cx.now.mono;
        v.running = false;
        v.output = output;
        v.next_at = Some(now + v.delay);
        v.delay = (v.delay * 2).min(VERIFY_AGAIN_MAX);
        if v.next_at.is_some_and(|at| at >= v.deadline) {
            // No time for another run: it has failed at its deadline.
            v.next_at = None;
        }
        tracing::debug!(
            watch = name,
            "verify failed ({describe}){}",
            if v.next_at.is_some() {
                "; running it again"
            } else {
                ""
            }
        );
        if now >= v.deadline {
            self.verify_timed_out(cx);
        }
    }

    fn verify_timed_out(&mut self, cx: &mut Cx<'_>) {
        let timeout = self.cfg.verify_timeout;
        self.verify_failed(format!("verify did not pass within {timeout:?}"), cx);
    }

    /// The verify of the content applied failed, `why`: roll back, or
    /// verify again later.
    fn verify_failed(&mut self, why: String, cx: &mut Cx<'_>) {
        let State::Verifying { fp, run } = &mut self.state else {
            return;
        };
        let fp = *fp;
        let mut output = run.take().map(|v| v.output).unwrap_or_default();
        let name = self.cfg.name.clone();
        let tail = crate::text::for_log(&output);
        output.push_str(&format!("\n[tend: {why}]"));
        cx.out.push(Output::Reloaded(false));
        self.output = shown(&output);
        self.good = false;
        if let Some(kept) = &self.kept {
            let generation = kept.dir.clone();
            self.state = State::RollingBack {
                fp,
                output: self.output.clone(),
            };
            self.result = WatchResult::RolledBack;
            tracing::error!(
                watch = name,
                "{why}: rolling back to the previous config{tail}"
            );
            cx.out.push(Output::Watcher(Command::Rollback {
                watch: self.id,
                fingerprint: fp,
                generation,
            }));
            return;
        }
        self.result = WatchResult::ActionFailed;
        let next = if self.seen == Some(fp) {
            let delay = self.retry_delay;
            self.state = State::ReverifyAt {
                fp,
                at: cx.now.mono + delay,
            };
            self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
            format!("verifying again in {delay:?}, once the service is ready")
        } else {
            self.state = State::NeedsCheck;
            "newer content is checked next".to_string()
        };
        tracing::error!(
            watch = name,
            "{why}: the action failed; without `publish` there is no previous config to \
             roll back to; {next}{tail}"
        );
    }

    /// The previous generation is published again (`Ok`): the action runs
    /// again, so the service reads it. Or it could not be: the service
    /// still runs the rejected config, and the rollback is tried again
    /// after the back-off of a failed publication.
    fn on_rolled_back(&mut self, fp: Fingerprint, result: Result<(), String>, cx: &mut Cx<'_>) {
        let name = self.cfg.name.clone();
        let output = match &mut self.state {
            State::RollingBack { fp: f, output } if *f == fp => std::mem::take(output),
            _ => return,
        };
        match result {
            Ok(()) => {
                let Some(kept) = self.kept.take() else {
                    return;
                };
                self.published = Some(kept.holds);
                // A start now reads the generation put back: it must not
                // count as applying the rejected content.
                self.passed = match kept.holds {
                    Published::Now(p) => Some(p),
                    Published::Earlier => None,
                };
                self.output = output;
                self.result = WatchResult::RolledBack;
                self.recheck_delay = self.cfg.recheck;
                self.state = State::Valid { fp, reapply: true };
                tracing::warn!(
                    watch = name,
                    "put the previous config back: applying it again; the rejected config is not \
                     applied again until it changes"
                );
            }
            Err(why) => {
                let again_in = self.recheck_delay;
                self.recheck_delay =
                    (self.recheck_delay * 2).min(RECHECK_MAX.max(self.cfg.recheck));
                // `output` is shown already (escaped when the verify ended).
                self.output = format!(
                    "{output}{}",
                    shown(&format!(
                        "\n[tend: cannot put the previous config back: {why}; trying again \
                         in {again_in:?}]"
                    ))
                );
                self.result = WatchResult::ActionFailed;
                self.state = State::RollbackAt {
                    fp,
                    at: cx.now.mono + again_in,
                    output,
                };
                tracing::error!(
                    watch = name,
                    "cannot put the previous config back: {why}; the service keeps the rejected one \
                     until it is back; trying again in {again_in:?}"
                );
            }
        }
    }

    // ------------------------------------------------------------ time

    /// What is due: retries of every kind, the splay waits that are over,
    /// the checks of new content, and the runs of `verify`.
    fn tick(&mut self, cx: &mut Cx<'_>) {
        let now = cx.now.mono;
        match &mut self.state {
            State::Verifying { run: Some(v), .. } if !v.running && now >= v.deadline => {
                self.verify_timed_out(cx);
            }
            // Verify runs again only on a service that serves.
            State::ReverifyAt { fp, at } if *at <= now && cx.service.serving => {
                self.state = State::Verifying { fp: *fp, run: None };
                self.result = WatchResult::Verifying;
            }
            State::RollbackAt { fp, at, output } if *at <= now => {
                if let Some(kept) = &self.kept {
                    tracing::info!(
                        watch = self.cfg.name,
                        "trying again to put the previous config back"
                    );
                    let fp = *fp;
                    cx.out.push(Output::Watcher(Command::Rollback {
                        watch: self.id,
                        fingerprint: fp,
                        generation: kept.dir.clone(),
                    }));
                    self.state = State::RollingBack {
                        fp,
                        output: std::mem::take(output),
                    };
                }
            }
            // A start never waits: a service that is down reads every
            // checked change at once.
            State::Splaying {
                fp,
                until,
                candidate,
                ..
            } if cx.service.down || *until <= now => {
                let (fp, candidate) = (*fp, candidate.take());
                self.passed_on(fp, candidate, cx);
            }
            State::RecheckAt { at, .. } if *at <= now => {
                if self.result == WatchResult::Invalid {
                    tracing::info!(watch = self.cfg.name, "checking the rejected config again");
                }
                self.state = State::NeedsCheck;
            }
            _ => {}
        }
        if self.state == State::NeedsCheck
            && let Some(fp) = self.seen
        {
            self.start_check(fp, cx);
        }
        if cx.service.serving {
            self.run_verify(cx);
        }
    }

    /// Starts and runs again the `verify` of the content applied. It starts
    /// once the service serves (a restarted service is ready): its time
    /// counts from then.
    fn run_verify(&mut self, cx: &mut Cx<'_>) {
        let now = cx.now.mono;
        let State::Verifying { fp, run } = &mut self.state else {
            return;
        };
        let v = run.get_or_insert_with(|| Verification {
            deadline: now + self.cfg.verify_timeout,
            next_at: Some(now),
            running: false,
            delay: VERIFY_AGAIN_INITIAL,
            output: String::new(),
        });
        if v.next_at.is_some_and(|at| at <= now) {
            v.next_at = None;
            v.running = true;
            let left = v.deadline.saturating_duration_since(now);
            cx.out.push(Output::Verify {
                fp: *fp,
                timeout: left.max(Duration::from_millis(1)),
            });
        }
    }

    /// The next time something of this watch is due, for a service in the
    /// state `service` says.
    pub fn deadline(&self, service: ServiceView) -> Option<Instant> {
        if service.stopping {
            return None;
        }
        match &self.state {
            // A run is due only on a service that serves; the deadline
            // counts whatever the service does.
            State::Verifying { run: Some(v), .. } => [
                (!v.running).then_some(v.deadline),
                v.next_at.filter(|_| service.serving),
            ]
            .into_iter()
            .flatten()
            .min(),
            State::RecheckAt { at, .. } | State::RollbackAt { at, .. } => Some(*at),
            State::Splaying { until, .. } => Some(*until),
            // A failed action is retried only on a service that runs.
            State::RetryAt { at, .. } if service.can_act => Some(*at),
            // Verify runs again only on a service that serves.
            State::ReverifyAt { at, .. } if service.serving => Some(*at),
            _ => None,
        }
    }

    // ------------------------------------------------------------ what it says

    /// Whether a check of this watch is waiting or running: the actions of
    /// its service wait for it, so that watches changing together are
    /// applied together.
    pub fn checking_now(&self) -> bool {
        matches!(
            self.state,
            State::NeedsCheck | State::Checking { .. } | State::Publishing { .. }
        )
    }

    /// Whether a fresh instance of the service would read only checked
    /// content of this watch: only then may the service (re)start.
    pub fn startable(&self) -> bool {
        if matches!(
            self.state,
            State::RollingBack { .. } | State::RollbackAt { .. }
        ) {
            // It starts on the generation being put back, once it is.
            return false;
        }
        let passed = self.seen.is_some() && self.passed == self.seen;
        if self.cfg.publish.is_none() {
            return passed;
        }
        // The published copy is what the service reads; but while the
        // newest content is still being decided it may become the copy.
        // Content being verified, or the generation put back after a
        // rollback, is the copy: a service down meanwhile starts on it.
        let decided = passed
            || matches!(
                self.result,
                WatchResult::Invalid | WatchResult::ActionFailed | WatchResult::RolledBack
            )
            || matches!(
                self.state,
                State::Verifying { .. }
                    | State::Valid { reapply: true, .. }
                    | State::Acting { reapply: true, .. }
                    | State::RetryAt { reapply: true, .. }
            );
        self.published.is_some() && decided
    }

    /// Whether the `publish` directory holds a generation that passed its
    /// check, which a start of the service reads.
    pub fn has_published(&self) -> bool {
        self.published.is_some()
    }

    /// The service runs a checked and applied config of this watch.
    pub fn good(&self) -> bool {
        self.good
    }

    /// Its newest content was rejected, and the service runs the last good
    /// one: a rolled-back change only once the previous generation is back
    /// and applied again.
    pub fn runs_last_good(&self) -> bool {
        match self.result {
            WatchResult::Invalid => true,
            WatchResult::RolledBack => !matches!(
                self.state,
                State::RollingBack { .. }
                    | State::RollbackAt { .. }
                    | State::Valid { reapply: true, .. }
                    | State::Acting { reapply: true, .. }
                    | State::RetryAt { reapply: true, .. }
            ),
            _ => false,
        }
    }

    /// Something is moving through its pipeline (rechecks of a failed check
    /// count only as invalid, not as busy).
    pub fn busy(&self) -> bool {
        !matches!(self.state, State::Idle | State::RecheckAt { .. })
    }

    /// Its paths that are not there (not with `optional`): tend is not
    /// ready while there are any.
    pub fn absent(&self) -> &[PathBuf] {
        &self.absent
    }

    /// What keeps this watch from being ready, if anything.
    pub fn problem(&self) -> Option<WatchResult> {
        (!self.good || self.result != WatchResult::Applied).then_some(self.result)
    }

    pub fn status(&self) -> WatchStatus {
        WatchStatus {
            name: self.cfg.name.clone(),
            service: String::new(),
            result: self.result,
            check_output: self.output.clone(),
            missing: self
                .absent
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            changed_at: self.changed_at.map(crate::time::rfc3339_millis),
            action_at: match &self.state {
                State::Splaying { wall, .. } => Some(crate::time::rfc3339_millis(*wall)),
                _ => None,
            },
        }
    }
}
