//! The supervisor's decisions: a pure state machine, events in, commands out.
//!
//! Theory of operation. [`Core::handle`] takes one [`Event`] (a signal, the
//! reaper's exit statuses, a spawn's result, a watch's new content, or time
//! passing) with the current time, changes the state, and returns the
//! [`Command`]s that carry the decision out: spawn, signal, reap, exit. It
//! makes no syscall and reads no clock, so every transition is a unit test
//! with a fake clock (see `tests.rs`). The shell around it (`supervisor.rs`)
//! owns the file descriptors, the reaper and the children's output pipes: it
//! performs the commands in order and feeds back what happened.
//!
//! [`Phase`] is every state tend as a whole can be in; each phase that has a
//! service process holds it as an [`Instance`], so a pid exists in the core
//! exactly while the process does (it is dropped when its exit is reaped, and
//! never signalled after that). The per-watch pipeline is in [`pipeline`].
//!
//! A spawn is a command whose pid comes back as [`Event::Spawned`] before any
//! other event; until then the core knows a spawn is pending and starts
//! nothing else in its place.
//!
//! Generations: a `restart` action with `restart_mode = "overlap"` starts
//! the new instance next to the old one ([`Phase::Overlapping`]), and stops
//! the old one only once the new one is ready; if the new one fails, the old
//! one keeps serving. Every instance being stopped (an old generation, a new
//! one that failed, all of them while tend stops) is in [`Core::stopping`]:
//! it gets no forwarded signals, and tend waits for it before it exits.
//!
//! Readiness of an instance: with `notify` it is ready once it sends
//! READY=1; with `ready_check` once that command exits 0; otherwise at once.
//! An instance not ready within `ready_timeout` has failed.
//!
//! The rules that protect the service:
//! - It starts, and restarts after a crash or a restart action, only when the
//!   newest content of every watch passed its check. Otherwise it stays down
//!   ([`Phase::WaitingForConfig`]) and starts the moment that is true.
//! - tend is ready only while the service runs and every watch's current
//!   config passed its check and its action.

pub mod metrics;
pub mod pipeline;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::config::{self, Action, Restart};
use crate::process::ExitStatus;
use crate::signals::{self, Role};
use crate::status::{ServiceStatus, State, Status, WatchStatus};
use crate::watch::publish::Keep;
use crate::watch::{Candidate, Done, Fingerprint, Report, Restored, SnapshotError, WatchId};
use metrics::{CheckOutcome, Metrics};
use pipeline::{Batch, Observed, Pipeline, Verdict};

/// The first delay before a restart after the service exited on its own.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Restart delays double up to this.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A service that ran this long before it exited starts again from the
/// initial delay.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);
/// How long processes left in the container get to die after SIGKILL before
/// tend exits anyway (the kernel kills them all when PID 1 exits).
pub const DRAIN_KILL_GRACE: Duration = Duration::from_secs(2);

/// The time of an event: the monotonic clock for deadlines, the wall clock
/// for what the status file shows.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub mono: Instant,
    pub wall: SystemTime,
}

/// Something that happened.
#[derive(Debug)]
pub enum Event {
    /// Only time passed (a deadline may be due). Also the first event.
    Tick,
    /// A signal other than SIGCHLD; `code` is the signalfd record's
    /// `ssi_code` (<= 0 when a process sent it with kill(), sigqueue() ...).
    Signal { signo: i32, from: u32, code: i32 },
    /// One pass of the reaper: who exited, and whether tend has no child left.
    Reaped { exits: Vec<Exit>, no_children: bool },
    /// The result of a [`Command::Spawn`] with this token.
    Spawned {
        token: u64,
        result: Result<Pid, SpawnFailure>,
    },
    /// A scan of a watch finished.
    Content(Report),
    /// A datagram on the notify socket. `chain` is the sender's pid and its
    /// ancestors' (nearest first), so the core can tell which instance's
    /// process tree it came from.
    Notify {
        chain: Vec<Pid>,
        message: Notification,
    },
    /// The watcher's answer to a [`Command::Snapshot`], [`Command::Publish`],
    /// [`Command::Rollback`] or [`Command::Withdraw`].
    Done(Done),
}

/// What a service said on NOTIFY_SOCKET (the sd_notify protocol).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notification {
    pub ready: bool,
    pub reloading: bool,
    pub stopping: bool,
    pub status: Option<String>,
}

impl Notification {
    /// Parses newline-separated `KEY=VALUE` assignments; unknown keys (MAINPID,
    /// WATCHDOG, ...) are ignored.
    pub fn parse(datagram: &[u8]) -> Notification {
        let text = String::from_utf8_lossy(datagram);
        let mut n = Notification::default();
        for line in text.split('\n') {
            match line.split_once('=') {
                Some(("READY", "1")) => n.ready = true,
                Some(("RELOADING", "1")) => n.reloading = true,
                Some(("STOPPING", "1")) => n.stopping = true,
                Some(("STATUS", v)) => n.status = Some(v.to_string()),
                _ => {}
            }
        }
        n
    }
}

/// A reaped process.
#[derive(Debug, Clone)]
pub struct Exit {
    pub pid: Pid,
    pub status: ExitStatus,
    /// The tail of its output, for a job whose output tend collected.
    pub output: Option<String>,
}

/// Why a process could not be started.
#[derive(Debug, Clone)]
pub struct SpawnFailure {
    pub message: String,
    /// What a shell would exit with: 127 not found, 126 not executable, 1.
    pub exit_code: i32,
}

/// Something for the shell to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start a process; answer with [`Event::Spawned`] before anything else.
    Spawn {
        token: u64,
        argv: Vec<String>,
        kind: SpawnKind,
        /// Set on top of the environment (`TEND_CANDIDATE` for a check).
        env: Vec<(String, String)>,
    },
    /// Copy watch `watch` into a candidate generation of its `publish`
    /// directory, if its content still has this fingerprint; answered by
    /// [`Done::Snapshot`].
    Snapshot {
        watch: WatchId,
        fingerprint: Fingerprint,
    },
    /// Make this candidate the published generation, keeping one other
    /// to roll back to when asked; answered by [`Done::Published`].
    Publish {
        watch: WatchId,
        fingerprint: Fingerprint,
        candidate: PathBuf,
        keep: Keep,
    },
    /// Publish this earlier generation again: `verify` failed for the
    /// content `fingerprint`. Answered by [`Done::RolledBack`].
    Rollback {
        watch: WatchId,
        fingerprint: Fingerprint,
        generation: PathBuf,
    },
    /// Publish again the generation `kept` to roll back to, and remove the
    /// one published after it, whose change was not applied (its action
    /// failed, or has not run): newer content, `fingerprint`, is copied
    /// next, and the directory holds two generations at most. Answered by
    /// [`Done::Withdrawn`].
    Withdraw {
        watch: WatchId,
        fingerprint: Fingerprint,
        kept: PathBuf,
    },
    /// Remove a candidate that will not be published.
    Discard { watch: WatchId, candidate: PathBuf },
    /// Pass on a signal that tend received (the shell logs it after sending).
    Forward {
        pid: Pid,
        group: bool,
        signo: i32,
        from: u32,
    },
    /// `kill(pid, signo)`, or to the process group `pid` leads.
    Signal { pid: Pid, group: bool, signo: i32 },
    /// `kill(-1, signo)`: as PID 1, every process in the container.
    SignalEveryone(i32),
    /// Run one reaper pass now and report it as [`Event::Reaped`].
    Reap,
    /// tend is done: exit with this code.
    Exit(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnKind {
    /// The service: tend's stdio, the terminal if tend has it.
    Service,
    /// A check or an exec action: output collected, stdin empty.
    Job,
}

/// What the core needs to know of supervisor.toml and of its situation.
#[derive(Debug, Clone)]
pub struct Settings {
    pub argv: Vec<String>,
    pub stop_signal: Signal,
    pub stop_timeout: Duration,
    pub restart: Restart,
    pub process_group: bool,
    /// tend is PID 1: before it exits it stops what is left in the container.
    pub pid1: bool,
    /// Readiness files are written (readiness changes are then logged).
    pub readiness_files: bool,
    /// The service reports readiness with sd_notify (READY=1, RELOADING=1).
    pub notify: bool,
    /// Without notify: the service is ready once this exits 0.
    pub ready_check: Option<Vec<String>>,
    /// A start (or, with notify or ready_check, a signal reload) not ready by
    /// then has failed.
    pub ready_timeout: Duration,
    /// `restart_mode = "overlap"`: a restart starts the new instance first.
    pub overlap: bool,
    /// `[readiness] invalid_config = "ready"`: a rejected change does not
    /// turn readiness off while the service runs its last good config.
    pub ready_when_invalid: bool,
    /// Seeds the random waits of `splay` (from the shell: the core reads no
    /// entropy itself).
    pub seed: u64,
}

impl Settings {
    /// Whether an instance must say it is ready, rather than being ready as
    /// soon as it runs.
    fn gated(&self) -> bool {
        self.notify || self.ready_check.is_some()
    }
}

/// Every state tend as a whole can be in.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Before the first start: the first content of every watch is being
    /// checked. Without watches this lasts no time at all.
    Starting,
    /// The service runs (not necessarily ready yet, or being stopped because
    /// it did not become ready in time).
    Running(Instance),
    /// A stop-start restart: the old instance (in `stopping`) is being
    /// stopped; the service starts again when it is gone.
    Restarting {
        old: Pid,
    },
    /// An overlap restart: the new instance starts next to the old one,
    /// which keeps serving (and gets forwarded signals) until the new one is
    /// ready.
    Overlapping {
        old: Instance,
        new: Instance,
    },
    /// The service exited on its own; the restart policy starts it again then.
    BackingOff {
        until: Instant,
    },
    /// The service is down and starts as soon as the newest content of every
    /// watch passed its check.
    WaitingForConfig,
    /// tend was told to stop: every instance is in `stopping`. tend exits
    /// with the status of `main` (the generation that was serving) once all
    /// are gone.
    Stopping {
        main: Option<Pid>,
        status: Option<ExitStatus>,
    },
    /// The service is gone for good. As PID 1, tend stops whatever is left in
    /// the container before it exits: SIGTERM once `deadline` is set, then
    /// SIGKILL (`killed`) and a short grace.
    Draining {
        status: ExitStatus,
        deadline: Option<Instant>,
        killed: bool,
    },
    Exited,
}

/// A service process.
#[derive(Debug, Clone, Copy)]
struct Instance {
    pid: Pid,
    since: Instant,
    /// It said it is ready (always true without notify or ready_check).
    ready: bool,
    /// Not ready by then: its start failed.
    ready_by: Option<Instant>,
    /// Sent its stop signal: SIGKILL at `kill_at` unless `killed` already.
    stop: Option<(Instant, bool)>,
}

impl Instance {
    /// Its stop_timeout has passed and it was not killed yet: it is marked
    /// killed now.
    fn stop_overdue(&mut self, now: Instant) -> bool {
        match self.stop {
            Some((kill_at, false)) if now >= kill_at => {
                self.stop = Some((kill_at, true));
                true
            }
            _ => false,
        }
    }
}

/// A signal reload that the service must confirm (notify: RELOADING=1 then
/// READY=1; ready_check: the check passes again).
#[derive(Debug)]
struct Reload {
    pid: Pid,
    watches: Vec<WatchId>,
    deadline: Instant,
    seen_reloading: bool,
}

/// A check or exec action in flight.
#[derive(Debug)]
struct Job {
    pid: Pid,
    role: JobRole,
    started: Instant,
    timeout: Duration,
    timed_out: bool,
}

#[derive(Debug, Clone)]
enum JobRole {
    Check(WatchId, Fingerprint),
    /// `verify` of this applied content.
    Verify(WatchId, Fingerprint),
    Exec(Vec<WatchId>),
    /// `ready_check` for this instance.
    ReadyCheck(Pid),
}

#[derive(Debug, Clone)]
enum Pending {
    /// A new instance; with `overlap`, next to the one that runs.
    Service {
        overlap: bool,
    },
    Job(JobRole, Duration),
}

/// A watch's `verify` in progress.
#[derive(Debug)]
struct Verification {
    fp: Fingerprint,
    /// Not passed by then: failed.
    deadline: Instant,
    /// When it runs next.
    next_at: Option<Instant>,
    /// A run is in flight: it is killed at `deadline` (its own timeout),
    /// and what it printed until then is the output the failure shows.
    running: bool,
    delay: Duration,
    output: String,
}

/// `verify` runs again after a failure, backing off up to this.
const VERIFY_AGAIN_INITIAL: Duration = Duration::from_millis(250);
const VERIFY_AGAIN_MAX: Duration = Duration::from_secs(2);

/// ready_check runs again after a failure, backing off up to this.
const READY_CHECK_MAX: Duration = Duration::from_secs(1);
const READY_CHECK_INITIAL: Duration = Duration::from_millis(100);

pub struct Core {
    settings: Settings,
    watches: Vec<config::Watch>,
    phase: Phase,
    pipeline: Pipeline,
    jobs: Vec<Job>,
    /// Spawns asked for whose pid has not come back yet.
    pending: BTreeMap<u64, Pending>,
    next_token: u64,
    /// Starts after the first.
    restarts: u32,
    started_once: bool,
    backoff: Duration,
    /// Whether tend was ready at the last status, to log changes once.
    was_ready: bool,
    /// Instances being stopped that are not the phase's own.
    stopping: Vec<Instance>,
    reload: Option<Reload>,
    /// ready_check is due for this instance then.
    ready_check_at: Option<(Pid, Instant)>,
    ready_check_delay: Duration,
    /// The last STATUS= text of each instance.
    statuses: BTreeMap<Pid, String>,
    verifications: BTreeMap<WatchId, Verification>,
    /// splitmix64's state, for splay.
    rng: u64,
    metrics: Metrics,
    out: Vec<Command>,
}

impl Core {
    pub fn new(settings: Settings, watches: &[config::Watch]) -> Core {
        Core {
            watches: watches.to_vec(),
            phase: Phase::Starting,
            pipeline: Pipeline::new(watches),
            jobs: Vec::new(),
            pending: BTreeMap::new(),
            next_token: 1,
            restarts: 0,
            started_once: false,
            backoff: BACKOFF_INITIAL,
            was_ready: false,
            stopping: Vec::new(),
            reload: None,
            ready_check_at: None,
            ready_check_delay: READY_CHECK_INITIAL,
            statuses: BTreeMap::new(),
            verifications: BTreeMap::new(),
            rng: settings.seed,
            metrics: Metrics::new(watches.len()),
            settings,
            out: Vec::new(),
        }
    }

    /// A uniformly random duration in [0, `below`), to the microsecond.
    fn random_below(&mut self, below: Duration) -> Duration {
        let micros = below.as_micros() as u64;
        if micros == 0 {
            return Duration::ZERO;
        }
        // splitmix64: no cryptography, just an even spread across replicas.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Duration::from_micros(z % micros)
    }

    /// An earlier tend published `generation` for watch `id`: the service
    /// may start on it while the watch's newest content is rejected. Called
    /// before the first event.
    pub fn restore(&mut self, id: WatchId, restored: &Restored) {
        let (watch, generation) = (self.pipeline.name(id), &restored.generation);
        if restored.rolled_back {
            tracing::warn!(
                watch,
                generation,
                "tend stopped while a change was verified: put the generation before it back"
            );
        }
        tracing::info!(
            watch,
            generation,
            "found the generation published before: the service can start on it"
        );
        self.pipeline.restore(id);
    }

    /// Takes one event and returns what to do about it, in order.
    pub fn handle(&mut self, now: Now, event: Event) -> Vec<Command> {
        match event {
            Event::Tick => {}
            Event::Signal { signo, from, code } => self.on_signal(signo, from, code, now),
            Event::Reaped { exits, no_children } => {
                // A drain that begins with one of these exits asks for a
                // fresh pass (after it killed the jobs): this one is stale.
                let draining = matches!(self.phase, Phase::Draining { .. });
                for exit in exits {
                    self.on_exit(exit, now);
                }
                if draining {
                    self.after_reap(no_children, now);
                }
            }
            Event::Spawned { token, result } => self.on_spawned(token, result, now),
            Event::Content(c) => self.on_content(c, now),
            Event::Notify { chain, message } => self.on_notify(&chain, message, now),
            Event::Done(Done::Snapshot {
                watch,
                fingerprint,
                result,
            }) => self.on_snapshot(watch, fingerprint, result, now),
            Event::Done(Done::Published {
                watch,
                fingerprint,
                result,
            }) => self.on_published(watch, fingerprint, result, now),
            Event::Done(Done::RolledBack {
                watch,
                fingerprint,
                result,
            }) => self.on_rolled_back(watch, fingerprint, result, now),
            Event::Done(Done::Withdrawn {
                watch,
                fingerprint,
                result,
            }) => self.on_withdrawn(watch, fingerprint, result, now),
        }
        self.on_time(now);
        self.advance(now);
        self.metrics
            .reloaded(&self.pipeline.take_outcomes(), now.wall);
        std::mem::take(&mut self.out)
    }

    /// The counters of `GET /metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The next time something is due; None when nothing is (an idle tend
    /// sleeps without a timeout). Only deadlines the current phase acts on
    /// count, or a deadline in the past would make the loop spin.
    pub fn deadline(&self) -> Option<Instant> {
        let (phase, watching, acting) = match &self.phase {
            Phase::Starting | Phase::WaitingForConfig | Phase::Restarting { .. } => {
                (None, true, false)
            }
            Phase::Running(i) => (
                [i.ready_by.filter(|_| !i.ready), kill_at(i)]
                    .into_iter()
                    .flatten()
                    .min(),
                true,
                true,
            ),
            Phase::Overlapping { new, .. } => (new.ready_by, true, false),
            Phase::BackingOff { until } => (Some(*until), true, false),
            Phase::Stopping { .. } => (None, false, false),
            Phase::Draining { deadline, .. } => (*deadline, false, false),
            Phase::Exited => (None, false, false),
        };
        let jobs = self
            .jobs
            .iter()
            .filter(|j| !j.timed_out)
            .map(|j| j.started + j.timeout)
            .min();
        let stopping = self.stopping.iter().filter_map(kill_at).min();
        let readiness = [
            self.reload.as_ref().map(|r| r.deadline),
            self.ready_check_at
                .filter(|_| !self.ready_check_running())
                .map(|(_, at)| at),
        ]
        .into_iter()
        .flatten()
        .min()
        .filter(|_| watching);
        let verifying = self
            .verifications
            .values()
            .flat_map(|v| [(!v.running).then_some(v.deadline), v.next_at])
            .flatten()
            .min()
            .filter(|_| watching);
        [
            phase,
            jobs,
            stopping,
            readiness,
            verifying,
            self.pipeline.recheck_deadline().filter(|_| watching),
            self.pipeline.splay_deadline().filter(|_| watching),
            self.pipeline.retry_deadline().filter(|_| acting),
            // Verify runs again only on a service that serves.
            self.pipeline.reverify_deadline().filter(|_| self.serving()),
            self.pipeline.rollback_deadline().filter(|_| watching),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// What the status file should say now. Logs readiness changes.
    pub fn status(&mut self) -> Status {
        let serving = match &self.phase {
            Phase::Running(i) => i.ready && i.stop.is_none(),
            Phase::Overlapping { old, .. } => old.ready,
            _ => false,
        };
        let ready = serving && self.pipeline.all_good(self.settings.ready_when_invalid);
        let invalid = self.pipeline.any_invalid();
        let state = match &self.phase {
            Phase::Stopping { .. } | Phase::Draining { .. } | Phase::Exited => State::Stopping,
            Phase::Restarting { .. } | Phase::BackingOff { .. } | Phase::Overlapping { .. } => {
                State::Restarting
            }
            Phase::WaitingForConfig if !invalid => State::Restarting,
            _ if invalid => State::InvalidConfig,
            Phase::Starting => State::Starting,
            Phase::Running(i) if !i.ready && self.restarts == 0 => State::Starting,
            Phase::Running(i) if !i.ready || i.stop.is_some() => State::Restarting,
            _ if ready && !self.pipeline.busy() && self.reload.is_none() => State::Ready,
            _ => State::Reloading,
        };
        if ready != self.was_ready && (self.settings.readiness_files || !self.watches.is_empty()) {
            self.was_ready = ready;
            if ready {
                tracing::info!("ready");
            } else {
                match self.pipeline.first_problem() {
                    Some((watch, result))
                        if !matches!(state, State::Stopping | State::Restarting) =>
                    {
                        tracing::info!(
                            state = state.as_str(),
                            watch,
                            result = result.as_str(),
                            "not ready"
                        )
                    }
                    _ => tracing::info!(state = state.as_str(), "not ready"),
                }
            }
        }
        let mut instances = Vec::new();
        match &self.phase {
            Phase::Running(i) => instances.push(instance_status(i, "serving")),
            Phase::Overlapping { old, new } => {
                instances.push(instance_status(old, "serving"));
                instances.push(instance_status(new, "starting"));
            }
            _ => {}
        }
        instances.extend(self.stopping.iter().map(|i| instance_status(i, "stopping")));
        Status {
            state,
            ready,
            service: ServiceStatus {
                pid: self.service_pid().map(Pid::as_raw),
                restarts: self.restarts,
                status: self
                    .service_pid()
                    .and_then(|p| self.statuses.get(&p).cloned()),
                instances,
            },
            watches: self
                .pipeline
                .reports()
                .map(|r| WatchStatus {
                    name: r.name.to_string(),
                    result: r.result,
                    check_output: r.check_output.to_string(),
                    changed_at: r.changed_at.map(crate::time::rfc3339_millis),
                    action_at: r.action_at.map(crate::time::rfc3339_millis),
                })
                .collect(),
            updated_at: String::new(),
        }
    }

    // ------------------------------------------------------------ signals

    fn on_signal(&mut self, signo: i32, from: u32, code: i32, now: Now) {
        match signals::role(signo, code) {
            Role::Stop => self.on_sigterm(from, now),
            Role::Interrupt if self.service_pid().is_none() => self.on_interrupt(from),
            Role::Interrupt | Role::Forward => self.forward(signo, from),
            Role::Child => {}
            Role::Ignore => tracing::warn!(
                from,
                code,
                "{} is not for the service (raised by the kernel, or the C library's own): not forwarded",
                signals::describe(signo)
            ),
        }
    }

    fn on_sigterm(&mut self, from: u32, now: Now) {
        if matches!(
            self.phase,
            Phase::Stopping { .. } | Phase::Draining { .. } | Phase::Exited
        ) {
            tracing::info!(from, "SIGTERM received again: already stopping");
            return;
        }
        tracing::info!(from, "SIGTERM received: stopping");
        let main = match self.phase {
            Phase::Running(inst) => {
                self.retire(inst, now);
                Some(inst.pid)
            }
            Phase::Overlapping { old, new } => {
                self.retire(old, now);
                self.retire(new, now);
                Some(old.pid)
            }
            Phase::Restarting { old } => Some(old),
            Phase::Starting | Phase::BackingOff { .. } | Phase::WaitingForConfig => {
                self.drain(ExitStatus::Signal(Signal::SIGTERM as i32));
                return;
            }
            Phase::Stopping { .. } | Phase::Draining { .. } | Phase::Exited => return,
        };
        self.kill_jobs();
        self.reload = None;
        self.ready_check_at = None;
        self.phase = Phase::Stopping { main, status: None };
    }

    /// SIGINT while no service process exists: there is nothing to interrupt,
    /// so Ctrl-C (docker run -it) stops tend.
    fn on_interrupt(&mut self, from: u32) {
        if matches!(
            self.phase,
            Phase::Starting | Phase::BackingOff { .. } | Phase::WaitingForConfig
        ) {
            tracing::info!(from, "SIGINT received while no service runs: stopping");
            self.drain(ExitStatus::Signal(Signal::SIGINT as i32));
        }
    }

    fn forward(&mut self, signo: i32, from: u32) {
        match self.service_pid() {
            Some(pid) => self.out.push(Command::Forward {
                pid,
                group: self.settings.process_group,
                signo,
                from,
            }),
            None => tracing::info!(
                from,
                "{} received while no service runs: dropped",
                signals::describe(signo)
            ),
        }
    }

    // ------------------------------------------------------------ exits

    fn on_exit(&mut self, exit: Exit, now: Now) {
        self.statuses.remove(&exit.pid);
        if let Some(at) = self.stopping.iter().position(|i| i.pid == exit.pid) {
            self.stopping.swap_remove(at);
            self.on_stopped(exit.pid, exit.status, now);
        } else if self.current_pids().contains(&exit.pid) {
            self.on_service_exit(exit.pid, exit.status, now);
        } else if let Some(at) = self.jobs.iter().position(|j| j.pid == exit.pid) {
            let job = self.jobs.swap_remove(at);
            // What the job left running in its process group goes with it.
            self.signal_group(job.pid, Signal::SIGKILL as i32);
            self.on_job_exit(job, exit, now);
        } else {
            tracing::debug!(pid = exit.pid.as_raw(), "reaped an orphan: {}", exit.status);
        }
    }

    /// An instance tend was stopping is gone.
    fn on_stopped(&mut self, pid: Pid, status: ExitStatus, now: Now) {
        match self.phase {
            Phase::Restarting { old } if old == pid => {
                tracing::info!(pid = pid.as_raw(), "service stopped: {status}");
                self.finish_acting(true, now);
                self.phase = Phase::WaitingForConfig;
                self.explain_waiting();
            }
            Phase::Stopping { main, status: st } => {
                tracing::info!(pid = pid.as_raw(), "service stopped: {status}");
                let st = if main == Some(pid) { Some(status) } else { st };
                self.phase = Phase::Stopping { main, status: st };
                if self.stopping.is_empty() {
                    let status = st.unwrap_or(ExitStatus::Signal(Signal::SIGTERM as i32));
                    self.drain(status);
                }
            }
            _ => tracing::info!(pid = pid.as_raw(), "previous instance stopped: {status}"),
        }
    }

    /// A current instance exited without tend asking it to.
    fn on_service_exit(&mut self, pid: Pid, status: ExitStatus, now: Now) {
        if self.reload.as_ref().is_some_and(|r| r.pid == pid) {
            // Its watches stay acting: the next start reads their config.
            self.reload = None;
        }
        match self.phase {
            Phase::Running(inst) => {
                // Stopped by tend (it never became ready), or on its own.
                let why = if inst.stop.is_some() {
                    format!(
                        "the service did not become ready within {:?}",
                        self.settings.ready_timeout
                    )
                } else {
                    format!("the service exited while the change was verified ({status})")
                };
                self.verifications_cut_short(why, now);
                let uptime = now.mono.saturating_duration_since(inst.since);
                // Stopped by tend because it never became ready: a failure,
                // whatever its exit code.
                let failed = inst.stop.is_some();
                self.after_unplanned_exit(status, failed, uptime, Some(inst.pid), now);
            }
            Phase::Overlapping { old, new } if new.pid == pid => {
                tracing::warn!(
                    pid = pid.as_raw(),
                    "the new instance exited before it was ready ({status}): the old one keeps serving"
                );
                self.phase = Phase::Running(old);
                self.finish_acting(false, now);
            }
            Phase::Overlapping { old, new } => {
                tracing::warn!(
                    pid = old.pid.as_raw(),
                    "the old instance exited during the restart ({status}): the new one takes over"
                );
                self.phase = Phase::Running(new);
                self.finish_acting(true, now);
                self.started();
            }
            _ => unreachable!("current pids exist only in the phases above"),
        }
    }

    /// The service exited (or could not start) without tend asking: the
    /// restart policy decides what happens.
    fn after_unplanned_exit(
        &mut self,
        status: ExitStatus,
        failed: bool,
        uptime: Duration,
        pid: Option<Pid>,
        now: Now,
    ) {
        // A start that failed has no pid (the spawn's error was logged).
        let what = match pid {
            Some(_) => format!("service exited: {status}, after {uptime:.1?}"),
            None => "the service could not start".to_string(),
        };
        let pid = pid.map(Pid::as_raw);
        let again = match self.settings.restart {
            Restart::Never => false,
            Restart::OnFailure => failed || !status.success(),
            Restart::Always => true,
        };
        if !again {
            tracing::info!(pid, "{what}");
            self.drain(status);
            return;
        }
        if uptime >= BACKOFF_RESET_AFTER {
            self.backoff = BACKOFF_INITIAL;
        }
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        let gate = match self.pipeline.first_unpassed() {
            Some((watch, _)) => format!(
                "; it starts again only once the config of watch {watch:?} passes its check"
            ),
            None => String::new(),
        };
        tracing::warn!(
            pid,
            "{what}; restarting in {delay:?} (restart = {}){gate}",
            self.settings.restart.as_str()
        );
        self.phase = Phase::BackingOff {
            until: now.mono + delay,
        };
    }

    fn on_job_exit(&mut self, job: Job, exit: Exit, now: Now) {
        if !self.pipeline_runs() {
            return;
        }
        let took = if job.timed_out {
            job.timeout
        } else {
            now.mono.saturating_duration_since(job.started)
        };
        let passed = !job.timed_out && exit.status.success();
        let describe = if job.timed_out {
            format!("timed out after {took:?} and was killed")
        } else {
            exit.status.to_string()
        };
        let mut output = exit.output.unwrap_or_default();
        match job.role {
            JobRole::Check(id, fp) => {
                let outcome = match (job.timed_out, passed) {
                    (true, _) => CheckOutcome::TimedOut,
                    (false, true) => CheckOutcome::Passed,
                    (false, false) => CheckOutcome::Failed,
                };
                self.metrics.checked(id, outcome, took);
                if job.timed_out {
                    output.push_str(&format!(
                        "\n[tend: the check timed out after {took:?} and was killed]"
                    ));
                }
                self.on_check_result(id, fp, passed, &describe, took, output, now);
            }
            JobRole::Verify(id, fp) => {
                self.on_verify_result(id, fp, passed, &describe, output, now)
            }
            JobRole::ReadyCheck(pid) => {
                if passed {
                    tracing::debug!(pid = pid.as_raw(), took = ?took, "ready_check passed");
                    self.ready_check_at = None;
                    self.on_ready(pid, now);
                } else {
                    tracing::debug!(pid = pid.as_raw(), "ready_check failed ({describe})");
                    self.ready_check_failed(pid, now);
                }
            }
            JobRole::Exec(ids) => {
                for &id in &ids {
                    self.pipeline.action_finished(id, passed, now.mono);
                }
                let names = self.names(&ids);
                if passed {
                    tracing::info!(watch = names, took = ?took, "reload command succeeded: config applied");
                } else {
                    let retry = ids
                        .iter()
                        .find_map(|&id| self.pipeline.retry_in(id, now.mono));
                    tracing::warn!(
                        watch = names,
                        "reload command failed ({describe}); retrying in {:?}{}",
                        retry.unwrap_or_default(),
                        crate::text::for_log(&output)
                    );
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_check_result(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        passed: bool,
        describe: &str,
        took: Duration,
        output: String,
        now: Now,
    ) {
        let name = self.pipeline.name(id).to_string();
        let tail = crate::text::for_log(&output);
        let verdict = self
            .pipeline
            .check_finished(id, fp, passed, output, now.mono);
        self.after_verdict(id, fp, verdict, now);
        match verdict {
            Verdict::Stale => tracing::info!(
                watch = name,
                "check result dropped: the config changed while it ran; checking again"
            ),
            Verdict::Passed => tracing::info!(watch = name, took = ?took, "check passed"),
            Verdict::Failed { recheck_in } => {
                let consequence = match self.phase {
                    Phase::Running(_) => {
                        "the new config is rejected and the service keeps running on the last good one"
                    }
                    _ if self.pipeline.has_published(id) => {
                        "the new config is rejected and the service starts on the last good copy, published before"
                    }
                    Phase::Starting => "the service is not started until a valid config arrives",
                    _ => "the service stays down until a valid config arrives",
                };
                tracing::warn!(
                    watch = name,
                    took = ?took,
                    "check failed ({describe}): {consequence}; checking again in {recheck_in:?}{tail}"
                );
            }
        }
    }

    /// What follows a check's verdict: a passing change waits for its
    /// splay (only while the service runs: a start never waits), then is
    /// published; a rejected candidate is removed.
    fn after_verdict(&mut self, id: WatchId, fp: Fingerprint, verdict: Verdict, now: Now) {
        let running = matches!(self.phase, Phase::Running(_) | Phase::Overlapping { .. });
        let splay = self.watches[id.0].splay;
        let wait = if verdict == Verdict::Passed && running {
            self.random_below(splay)
        } else {
            Duration::ZERO
        };
        if !wait.is_zero() {
            tracing::info!(
                watch = self.pipeline.name(id),
                "the new config waits {wait:.1?} (splay = {splay:?}) before it is applied"
            );
            self.pipeline.hold(id, fp, now.mono + wait, now.wall + wait);
        } else if verdict == Verdict::Passed {
            self.publish(id, fp);
        } else if let Some(candidate) = self.pipeline.take_candidate(id) {
            self.out.push(Command::Discard {
                watch: id,
                candidate,
            });
        }
    }

    /// The service is gone for good (or never started): stop what is left
    /// and exit with `status`.
    fn drain(&mut self, status: ExitStatus) {
        self.kill_jobs();
        if !self.settings.pid1 {
            self.exit(status.code());
            return;
        }
        self.phase = Phase::Draining {
            status,
            deadline: None,
            killed: false,
        };
        self.out.push(Command::Reap);
    }

    /// After a reaper pass while draining: exit once no process is left,
    /// else stop what is left, gracefully first.
    fn after_reap(&mut self, no_children: bool, now: Now) {
        let Phase::Draining {
            status, deadline, ..
        } = self.phase
        else {
            return;
        };
        if no_children {
            self.exit(status.code());
        } else if deadline.is_none() {
            tracing::info!(
                "processes are still running in the container: sending them SIGTERM, SIGKILL after {:?}",
                self.settings.stop_timeout
            );
            self.phase = Phase::Draining {
                status,
                deadline: Some(now.mono + self.settings.stop_timeout),
                killed: false,
            };
            self.out
                .push(Command::SignalEveryone(Signal::SIGTERM as i32));
        }
    }

    fn exit(&mut self, code: i32) {
        self.phase = Phase::Exited;
        self.out.push(Command::Exit(code));
    }

    // ------------------------------------------------------------ spawning

    fn spawn(&mut self, argv: Vec<String>, kind: SpawnKind, what: Pending) {
        self.spawn_with(argv, Vec::new(), kind, what);
    }

    fn spawn_with(
        &mut self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        kind: SpawnKind,
        what: Pending,
    ) {
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(token, what);
        self.out.push(Command::Spawn {
            token,
            argv,
            kind,
            env,
        });
    }

    fn pending_service(&self) -> Option<u64> {
        self.pending
            .iter()
            .find(|(_, p)| matches!(p, Pending::Service { .. }))
            .map(|(t, _)| *t)
    }

    fn start_service(&mut self) {
        if self.pending_service().is_none() {
            self.spawn(
                self.settings.argv.clone(),
                SpawnKind::Service,
                Pending::Service { overlap: false },
            );
        }
    }

    fn on_spawned(&mut self, token: u64, result: Result<Pid, SpawnFailure>, now: Now) {
        let Some(what) = self.pending.remove(&token) else {
            return;
        };
        match (what, result) {
            (Pending::Service { overlap }, Ok(pid)) => {
                if self.started_once {
                    self.restarts += 1;
                }
                self.started_once = true;
                tracing::info!(pid = pid.as_raw(), command = ?self.settings.argv, "service started");
                let gated = self.settings.gated();
                let new = Instance {
                    pid,
                    since: now.mono,
                    ready: !gated,
                    ready_by: gated.then(|| now.mono + self.settings.ready_timeout),
                    stop: None,
                };
                if self.settings.ready_check.is_some() {
                    self.ready_check_at = Some((pid, now.mono));
                    self.ready_check_delay = READY_CHECK_INITIAL;
                }
                match (overlap, self.phase) {
                    (true, Phase::Running(old)) => {
                        self.phase = Phase::Overlapping { old, new };
                        if new.ready {
                            self.on_ready(pid, now);
                        }
                    }
                    _ => {
                        self.started();
                        self.phase = Phase::Running(new);
                    }
                }
            }
            (Pending::Service { overlap: true }, Err(e)) => {
                tracing::error!("{}: the old instance keeps serving", e.message);
                self.finish_acting(false, now);
            }
            (Pending::Service { overlap: false }, Err(e)) => {
                tracing::error!("{}", e.message);
                if !std::mem::replace(&mut self.started_once, true) {
                    // Nothing ran yet: exit with the shell's status,
                    // whatever the restart policy.
                    self.drain(ExitStatus::Code(e.exit_code));
                } else {
                    self.after_unplanned_exit(
                        ExitStatus::Code(e.exit_code),
                        true,
                        Duration::ZERO,
                        None,
                        now,
                    );
                }
            }
            (Pending::Job(..), Ok(pid)) if !self.pipeline_runs() => {
                self.signal_group(pid, Signal::SIGKILL as i32);
            }
            (Pending::Job(role, timeout), Ok(pid)) => {
                match &role {
                    JobRole::Check(id, _) => {
                        let w = &self.watches[id.0];
                        tracing::info!(watch = w.name, pid = pid.as_raw(), command = ?w.check.as_deref().unwrap_or_default(), "checking the new config");
                    }
                    JobRole::Exec(ids) => {
                        tracing::info!(
                            watch = self.names(ids),
                            pid = pid.as_raw(),
                            "running the reload command"
                        );
                    }
                    JobRole::ReadyCheck(_) => {
                        tracing::debug!(pid = pid.as_raw(), "running ready_check");
                    }
                    JobRole::Verify(id, _) => {
                        let w = &self.watches[id.0];
                        tracing::debug!(watch = w.name, pid = pid.as_raw(), "running verify");
                    }
                }
                self.jobs.push(Job {
                    pid,
                    role,
                    started: now.mono,
                    timeout,
                    timed_out: false,
                });
            }
            (Pending::Job(JobRole::Check(id, fp), _), Err(e)) => {
                tracing::error!(
                    watch = self.pipeline.name(id),
                    "cannot run the check: {}",
                    e.message
                );
                let msg = e.message.clone();
                self.on_check_result(id, fp, false, &msg, Duration::ZERO, e.message, now);
            }
            (Pending::Job(JobRole::Exec(ids), _), Err(e)) => {
                tracing::warn!(
                    watch = self.names(&ids),
                    "cannot run the reload command: {}",
                    e.message
                );
                for id in ids {
                    self.pipeline.action_finished(id, false, now.mono);
                }
            }
            (Pending::Job(JobRole::Verify(id, fp), _), Err(e)) => {
                let msg = e.message.clone();
                self.on_verify_result(id, fp, false, &msg, e.message, now);
            }
            (Pending::Job(JobRole::ReadyCheck(pid), _), Err(e)) => {
                tracing::warn!("cannot run ready_check: {}", e.message);
                self.ready_check_failed(pid, now);
            }
        }
    }

    // ------------------------------------------------------------ watches

    fn on_content(&mut self, c: Report, now: Now) {
        if !self.pipeline_runs() {
            return;
        }
        let name = self.pipeline.name(c.watch).to_string();
        let observed = self.pipeline.observe(c.watch, c.fingerprint, now.wall);
        match observed {
            Observed::Unchanged => {
                tracing::debug!(watch = name, "scanned: content unchanged")
            }
            Observed::First => tracing::info!(
                watch = name,
                fingerprint = c.fingerprint.short(),
                files = c.files,
                missing = ?c.missing,
                "config found"
            ),
            Observed::Changed(old) => tracing::info!(
                watch = name,
                paths = ?c.changed,
                files = c.files,
                missing = ?c.missing,
                "change detected: {} -> {}",
                old.short(),
                c.fingerprint.short()
            ),
        }
        if !c.unreadable.is_empty() && !matches!(observed, Observed::Unchanged) {
            tracing::warn!(
                watch = name,
                unreadable = ?c.unreadable,
                "part of the watched config cannot be read; the check decides whether the config is valid without it"
            );
        }
        if !matches!(observed, Observed::Unchanged) {
            self.pipeline.rollback_now(c.watch, now.mono);
        }
        // A candidate that waited for its splay is replaced by the newer one.
        if let Some(candidate) = self.pipeline.orphaned_candidate(c.watch) {
            self.out.push(Command::Discard {
                watch: c.watch,
                candidate,
            });
        }
    }

    /// Whether checks and actions still matter (not once tend stops).
    fn pipeline_runs(&self) -> bool {
        !matches!(
            self.phase,
            Phase::Stopping { .. } | Phase::Draining { .. } | Phase::Exited
        )
    }

    // ------------------------------------------------------------ time

    fn on_time(&mut self, now: Now) {
        let mut overdue = Vec::new();
        for j in &mut self.jobs {
            if !j.timed_out && now.mono >= j.started + j.timeout {
                j.timed_out = true;
                overdue.push(j.pid);
            }
        }
        for pid in overdue {
            self.signal_group(pid, Signal::SIGKILL as i32);
        }
        let overdue: Vec<Pid> = self
            .stopping
            .iter_mut()
            .filter_map(|i| i.stop_overdue(now.mono).then_some(i.pid))
            .collect();
        for pid in overdue {
            self.kill_overdue(pid);
        }
        if let Some(r) = &self.reload
            && now.mono >= r.deadline
        {
            let r = self.reload.take().expect("checked above");
            tracing::warn!(
                watch = self.names(&r.watches),
                pid = r.pid.as_raw(),
                "the service did not confirm the reload within {:?} ({}): the action failed",
                self.settings.ready_timeout,
                if self.settings.notify {
                    "RELOADING=1, then READY=1"
                } else {
                    "ready_check"
                }
            );
            for id in r.watches {
                self.pipeline.action_finished(id, false, now.mono);
            }
        }
        match self.phase {
            Phase::Running(mut inst) => {
                if inst.stop_overdue(now.mono) {
                    self.kill_overdue(inst.pid);
                    self.phase = Phase::Running(inst);
                } else if !inst.ready
                    && inst.stop.is_none()
                    && inst.ready_by.is_some_and(|by| now.mono >= by)
                {
                    tracing::error!(
                        pid = inst.pid.as_raw(),
                        "the service did not become ready within {:?}: stopping it",
                        self.settings.ready_timeout
                    );
                    self.ready_check_at = None;
                    self.stop(&mut inst, now);
                    self.phase = Phase::Running(inst);
                }
            }
            Phase::Overlapping { old, mut new }
                if new.ready_by.is_some_and(|by| now.mono >= by) =>
            {
                tracing::error!(
                    pid = new.pid.as_raw(),
                    "the new instance did not become ready within {:?}: it is stopped and the old one keeps serving",
                    self.settings.ready_timeout
                );
                new.ready_by = None;
                self.ready_check_at = None;
                self.retire(new, now);
                self.phase = Phase::Running(old);
                self.finish_acting(false, now);
            }
            Phase::BackingOff { until } if now.mono >= until => {
                self.phase = Phase::WaitingForConfig;
                self.explain_waiting();
            }
            Phase::Draining {
                status,
                deadline: Some(deadline),
                killed,
            } if now.mono >= deadline => {
                if killed {
                    tracing::warn!("processes are still left after SIGKILL: exiting anyway");
                    self.exit(status.code());
                } else {
                    tracing::warn!(
                        "processes are still running after {:?}: sending SIGKILL",
                        self.settings.stop_timeout
                    );
                    self.phase = Phase::Draining {
                        status,
                        deadline: Some(now.mono + DRAIN_KILL_GRACE),
                        killed: true,
                    };
                    self.out
                        .push(Command::SignalEveryone(Signal::SIGKILL as i32));
                }
            }
            _ => {}
        }
        if self.pipeline_runs() {
            let overdue: Vec<WatchId> = self
                .verifications
                .iter()
                .filter(|(_, v)| !v.running && now.mono >= v.deadline)
                .map(|(id, _)| *id)
                .collect();
            for id in overdue {
                self.verify_timed_out(id, now);
            }
            // A start never waits: a service that is down reads every
            // checked change at once.
            let down = matches!(self.phase, Phase::Starting | Phase::WaitingForConfig);
            if self.serving() {
                self.pipeline.reverifies_due(now.mono);
            }
            for (watch, fingerprint, generation) in self.pipeline.rollbacks_due(now.mono) {
                tracing::info!(
                    watch = self.pipeline.name(watch),
                    "trying again to put the previous config back"
                );
                self.out.push(Command::Rollback {
                    watch,
                    fingerprint,
                    generation,
                });
            }
            for (id, fp) in self.pipeline.splays_due(now.mono, down) {
                self.publish(id, fp);
            }
            for id in self.pipeline.rechecks_due(now.mono) {
                if self.pipeline.result(id) == crate::status::WatchResult::Invalid {
                    tracing::info!(
                        watch = self.pipeline.name(id),
                        "checking the rejected config again"
                    );
                }
            }
        }
    }

    /// A service instance started (or took over): see [`Pipeline::started`].
    fn started(&mut self) {
        for (watch, candidate) in self.pipeline.started() {
            self.out.push(Command::Discard { watch, candidate });
        }
    }

    /// Says why the service does not start at once, when it does not.
    fn explain_waiting(&self) {
        if let Some((watch, result)) = self.pipeline.first_unpassed() {
            let why = match result {
                crate::status::WatchResult::Invalid => "failed its check",
                // With `publish`: a copy, a publication or a rollback failed.
                crate::status::WatchResult::ActionFailed => {
                    "could not be published yet (see its check_output)"
                }
                crate::status::WatchResult::RolledBack => "is being rolled back",
                _ => "is not checked yet",
            };
            tracing::warn!(
                watch,
                "the service stays down: the config of watch {watch:?} {why}; it starts as soon as a config passes"
            );
        }
    }

    // ------------------------------------------------------------ the pipeline

    /// Moves every watch along: starts the checks that are due, and applies
    /// the actions that are ready (or starts the service once every config
    /// passed).
    fn advance(&mut self, now: Now) {
        if !self.pipeline_runs() {
            return;
        }
        if let Some((pid, at)) = self.ready_check_at
            && at <= now.mono
            && !self.ready_check_running()
            && let Some(argv) = self.settings.ready_check.clone()
        {
            self.spawn(
                argv,
                SpawnKind::Job,
                Pending::Job(JobRole::ReadyCheck(pid), self.settings.ready_timeout),
            );
        }
        loop {
            for (id, fp) in self.pipeline.checks_to_start() {
                self.start_check(id, fp, now);
            }
            match self.phase {
                Phase::Starting | Phase::WaitingForConfig if self.pipeline.startable() => {
                    self.start_service();
                }
                Phase::Running(i) if i.stop.is_none() && self.reload.is_none() => {
                    if let Some(batch) = self.pipeline.take_batch(now.mono) {
                        self.apply(batch, now);
                        // An action done at once (a signal) may leave newer
                        // content that waited for it (a rollback's) to check.
                        continue;
                    }
                }
                _ => {}
            }
            break;
        }
        // After the actions: one applied just now is verified at once.
        self.run_verifications(now);
    }

    fn start_check(&mut self, id: WatchId, fp: Fingerprint, now: Now) {
        if let Some(kept) = self.pipeline.kept(id) {
            // What is published now was not applied (its action failed,
            // or has not run): it goes before a third generation comes.
            self.out.push(Command::Withdraw {
                watch: id,
                fingerprint: fp,
                kept,
            });
            return;
        }
        if self.pipeline.publishes(id) {
            // The check runs on a copy: the content it checks is the
            // content that is published.
            self.out.push(Command::Snapshot {
                watch: id,
                fingerprint: fp,
            });
            return;
        }
        let w = &self.watches[id.0];
        match &w.check {
            None => {
                let verdict = self
                    .pipeline
                    .check_finished(id, fp, true, String::new(), now.mono);
                self.after_verdict(id, fp, verdict, now);
            }
            Some(argv) => {
                let (argv, timeout) = (argv.clone(), w.check_timeout);
                self.spawn(
                    argv,
                    SpawnKind::Job,
                    Pending::Job(JobRole::Check(id, fp), timeout),
                );
            }
        }
    }

    /// The previous generation is published again (or not): the action
    /// runs again so the service reads it, or the rollback is tried again.
    fn on_rolled_back(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        result: Result<(), String>,
        now: Now,
    ) {
        let name = self.pipeline.name(id).to_string();
        let failed = result.as_ref().err().cloned();
        match (self.pipeline.rolled_back(id, fp, result, now.mono), failed) {
            (Some(again), Some(why)) => tracing::error!(
                watch = name,
                "cannot put the previous config back: {why}; the service keeps the rejected one \
                 until it is back; trying again in {again:?}"
            ),
            (None, None) => tracing::warn!(
                watch = name,
                "put the previous config back: applying it again; the rejected config is not \
                 applied again until it changes"
            ),
            _ => {}
        }
    }

    /// The change published after the generation kept to roll back to is
    /// withdrawn (or not): the newer content `fp` is copied now.
    fn on_withdrawn(&mut self, id: WatchId, fp: Fingerprint, result: Result<(), String>, now: Now) {
        if !self.pipeline_runs() || !self.pipeline.is_checking(id, fp) {
            return;
        }
        let name = self.pipeline.name(id).to_string();
        match result {
            Ok(()) => {
                tracing::info!(
                    watch = name,
                    "the published config, not applied, is replaced by a newer one: published \
                     the previous config again while the newer one is checked"
                );
                self.pipeline.withdrawn(id);
                self.start_check(id, fp, now);
            }
            Err(why) => {
                let why = format!(
                    "cannot publish the previous config again before the newer one is checked: \
                     {why}"
                );
                let again = self.pipeline.fault(id, fp, why.clone(), now.mono);
                tracing::error!(watch = name, "{why}; trying again in {again:?}");
            }
        }
    }

    /// A `verify` run ended.
    fn on_verify_result(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        passed: bool,
        describe: &str,
        output: String,
        now: Now,
    ) {
        let name = self.pipeline.name(id).to_string();
        let Some(v) = self.verifications.get_mut(&id).filter(|v| v.fp == fp) else {
            return;
        };
        if passed {
            self.verifications.remove(&id);
            tracing::info!(watch = name, "verify passed: config applied");
            if let Some(previous) = self.pipeline.verified(id, fp, output) {
                self.out.push(Command::Discard {
                    watch: id,
                    candidate: previous,
                });
            }
            return;
        }
        v.running = false;
        v.output = output;
        v.next_at = Some(now.mono + v.delay);
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
        if now.mono >= v.deadline {
            self.verify_timed_out(id, now);
        }
    }

    /// `verify` of watch `id` did not pass within `verify_timeout`.
    fn verify_timed_out(&mut self, id: WatchId, now: Now) {
        let Some(fp) = self.verifications.get(&id).map(|v| v.fp) else {
            return;
        };
        let timeout = self.watches[id.0].verify_timeout;
        self.verify_failed(
            id,
            fp,
            format!("verify did not pass within {timeout:?}"),
            now,
        );
    }

    /// The service exited while changes were verified (on its own, or
    /// stopped because it never became ready, `why`): they failed, the
    /// likeliest reason for the exit being the change. With a generation to
    /// go back to, they are rolled back; without one they are action_failed
    /// while the restart policy starts the service again on them, and
    /// verified again once an instance is ready.
    fn verifications_cut_short(&mut self, why: String, now: Now) {
        for (id, fp) in self.pipeline.verifying() {
            if let Some(j) = self
                .jobs
                .iter_mut()
                .find(|j| matches!(j.role, JobRole::Verify(w, _) if w == id))
            {
                // Its result no longer matters.
                j.timed_out = true;
                let pid = j.pid;
                self.signal_group(pid, Signal::SIGKILL as i32);
            }
            self.verify_failed(id, fp, why.clone(), now);
        }
    }

    /// The `verify` of `fp` for watch `id` failed, `why`: roll back, or
    /// verify again later.
    fn verify_failed(&mut self, id: WatchId, fp: Fingerprint, why: String, now: Now) {
        let mut output = self
            .verifications
            .remove(&id)
            .map(|v| v.output)
            .unwrap_or_default();
        let name = self.pipeline.name(id).to_string();
        let tail = crate::text::for_log(&output);
        output.push_str(&format!("\n[tend: {why}]"));
        match self.pipeline.verify_failed(id, fp, output, now.mono) {
            Some(generation) => {
                tracing::error!(
                    watch = name,
                    "{why}: rolling back to the previous config{tail}"
                );
                self.out.push(Command::Rollback {
                    watch: id,
                    fingerprint: fp,
                    generation,
                });
            }
            None => {
                let next = match self.pipeline.reverify_in(id, now.mono) {
                    Some(delay) => {
                        format!("verifying again in {delay:?}, once the service is ready")
                    }
                    None => "newer content is checked next".to_string(),
                };
                tracing::error!(
                    watch = name,
                    "{why}: the action failed; without `publish` there is no previous config to \
                     roll back to; {next}{tail}"
                );
            }
        }
    }

    /// Starts and runs again the `verify` of every watch that needs it. A
    /// verify starts once the service serves (a restarted service is ready):
    /// its time counts from then.
    fn run_verifications(&mut self, now: Now) {
        let serving = self.serving();
        for (id, fp) in self.pipeline.verifying() {
            if serving && self.verifications.get(&id).is_none_or(|v| v.fp != fp) {
                self.verifications.insert(
                    id,
                    Verification {
                        fp,
                        deadline: now.mono + self.watches[id.0].verify_timeout,
                        next_at: Some(now.mono),
                        running: false,
                        delay: VERIFY_AGAIN_INITIAL,
                        output: String::new(),
                    },
                );
            }
        }
        let due: Vec<(WatchId, Fingerprint, Duration)> = self
            .verifications
            .iter_mut()
            .filter_map(|(id, v)| {
                let at = v.next_at?;
                (at <= now.mono).then(|| {
                    v.next_at = None;
                    v.running = true;
                    (*id, v.fp, v.deadline.saturating_duration_since(now.mono))
                })
            })
            .collect();
        for (id, fp, left) in due {
            let Some(argv) = self.watches[id.0].verify.clone() else {
                continue;
            };
            self.spawn(
                argv,
                SpawnKind::Job,
                Pending::Job(JobRole::Verify(id, fp), left.max(Duration::from_millis(1))),
            );
        }
    }

    /// The candidate copy of `fp` is made (or not): check it.
    fn on_snapshot(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        result: Result<Candidate, SnapshotError>,
        now: Now,
    ) {
        let name = self.pipeline.name(id).to_string();
        let wanted = self.pipeline_runs() && self.pipeline.is_checking(id, fp);
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
                    self.pipeline.rolled_back_before(id, fp);
                }
                self.out.push(Command::Discard {
                    watch: id,
                    candidate: c.dir,
                });
                return;
            }
            Err(_) if !wanted => return,
            Err(SnapshotError::Changed) => {
                tracing::debug!(
                    watch = name,
                    "the config changed while it was copied: copying the newer one"
                );
                self.pipeline.snapshot_changed(id, fp, now.mono);
                return;
            }
            Err(SnapshotError::Rejected(why)) => {
                self.on_check_result(id, fp, false, "env_from", Duration::ZERO, why, now);
                return;
            }
            Err(SnapshotError::Failed(why)) => {
                let again = self.pipeline.fault(id, fp, why.clone(), now.mono);
                tracing::error!(
                    watch = name,
                    "cannot copy the new config for publishing: {why}; trying again in {again:?}"
                );
                return;
            }
        };
        tracing::debug!(watch = name, candidate = %candidate.display(), "copied the new config");
        self.pipeline.set_candidate(id, candidate.clone());
        let w = &self.watches[id.0];
        match &w.check {
            None => {
                self.on_check_result(id, fp, true, "", Duration::ZERO, String::new(), now);
            }
            Some(argv) => {
                let dir = candidate.to_string_lossy().into_owned();
                let argv = argv
                    .iter()
                    .map(|a| a.replace(config::CANDIDATE, &dir))
                    .collect();
                let timeout = w.check_timeout;
                self.spawn_with(
                    argv,
                    vec![("TEND_CANDIDATE".to_string(), dir)],
                    SpawnKind::Job,
                    Pending::Job(JobRole::Check(id, fp), timeout),
                );
            }
        }
    }

    /// Publishes the candidate of `fp` of watch `id`, if it has one. When
    /// an action will be verified, the generation to roll back to is kept:
    /// the one it replaces. (One kept from before, while what replaced it
    /// was not verified, was published again before the candidate was
    /// made: see [`Command::Withdraw`]. Were it still kept, it would stay
    /// the one to go back to.)
    fn publish(&mut self, id: WatchId, fp: Fingerprint) {
        if let Some(candidate) = self.pipeline.take_candidate(id) {
            let keep = match (&self.watches[id.0].verify, self.pipeline.kept(id)) {
                (None, _) => Keep::Nothing,
                (Some(_), None) => Keep::Published,
                (Some(_), Some(dir)) => Keep::Generation(dir),
            };
            self.out.push(Command::Publish {
                watch: id,
                fingerprint: fp,
                candidate,
                keep,
            });
        }
    }

    /// The candidate of `fp` is published (or not): its action follows.
    fn on_published(
        &mut self,
        id: WatchId,
        fp: Fingerprint,
        result: Result<Option<PathBuf>, String>,
        now: Now,
    ) {
        let name = self.pipeline.name(id).to_string();
        match result {
            Ok(previous) => {
                // Only an action on a running service is verified (and
                // rolled back): a start is not.
                let acting = matches!(self.phase, Phase::Running(_) | Phase::Overlapping { .. });
                let previous = match previous {
                    Some(p) if !acting => {
                        self.out.push(Command::Discard {
                            watch: id,
                            candidate: p,
                        });
                        None
                    }
                    p => p,
                };
                if self.pipeline.published(id, fp, previous, acting) {
                    tracing::info!(
                        watch = name,
                        fingerprint = fp.short(),
                        "published the new config"
                    );
                }
            }
            Err(why) => {
                let again = self.pipeline.fault(id, fp, why.clone(), now.mono);
                tracing::error!(
                    watch = name,
                    "cannot publish the new config: {why}; trying again in {again:?}"
                );
            }
        }
    }

    fn apply(&mut self, batch: Batch, now: Now) {
        let names = self.names(&batch.watches);
        let Phase::Running(inst) = self.phase else {
            unreachable!("batches are applied only while the service runs");
        };
        if batch.restart {
            if self.settings.overlap {
                tracing::info!(
                    watch = names,
                    "restarting the service on the new config: the new instance starts next to the old one"
                );
                self.spawn(
                    self.settings.argv.clone(),
                    SpawnKind::Service,
                    Pending::Service { overlap: true },
                );
            } else {
                tracing::info!(watch = names, "restarting the service on the new config");
                self.retire(inst, now);
                self.phase = Phase::Restarting { old: inst.pid };
            }
            return;
        }
        let mut done: Vec<WatchId> = batch.watches.clone();
        for (_, users) in &batch.execs {
            done.retain(|i| !users.contains(i));
        }
        let confirm = self.settings.gated() && !batch.signals.is_empty();
        let signalled: Vec<WatchId> = done
            .iter()
            .copied()
            .filter(|id| matches!(self.watches[id.0].action, Action::Signal(_)))
            .collect();
        for sig in &batch.signals {
            self.signal_service(inst.pid, *sig as i32);
            if confirm {
                tracing::info!(
                    watch = self.names(&signalled),
                    pid = inst.pid.as_raw(),
                    "sent {sig} to the service: waiting for it to confirm the reload"
                );
            } else {
                tracing::info!(
                    watch = self.names(&done),
                    pid = inst.pid.as_raw(),
                    "sent {sig} to the service: config applied"
                );
            }
        }
        if confirm {
            done.retain(|id| !signalled.contains(id));
            self.reload = Some(Reload {
                pid: inst.pid,
                watches: signalled,
                deadline: now.mono + self.settings.ready_timeout,
                seen_reloading: false,
            });
            if self.settings.ready_check.is_some() {
                self.ready_check_at = Some((inst.pid, now.mono));
                self.ready_check_delay = READY_CHECK_INITIAL;
            }
        }
        for id in done {
            if matches!(self.watches[id.0].action, Action::None) {
                tracing::info!(
                    watch = self.pipeline.name(id),
                    "config accepted (on_change = \"none\")"
                );
            }
            self.pipeline.action_finished(id, true, now.mono);
        }
        for (argv, users) in batch.execs {
            let timeout = users
                .iter()
                .map(|id| match &self.watches[id.0].action {
                    // The child bounds the call itself; this is the backstop.
                    Action::Http(h) => h.timeout + Duration::from_secs(1),
                    _ => self.watches[id.0].check_timeout,
                })
                .max()
                .unwrap_or_default();
            self.spawn(
                argv,
                SpawnKind::Job,
                Pending::Job(JobRole::Exec(users), timeout),
            );
        }
    }

    // ------------------------------------------------------------ readiness

    fn on_notify(&mut self, chain: &[Pid], message: Notification, now: Now) {
        let Some(pid) = chain
            .iter()
            .copied()
            .find(|p| self.current_pids().contains(p))
        else {
            if chain
                .iter()
                .any(|p| self.stopping.iter().any(|i| i.pid == *p))
            {
                tracing::debug!("a notification from an instance being stopped: nothing to do");
            } else {
                tracing::warn!(
                    pid = chain.first().map(|p| p.as_raw()),
                    "ignored a notification from a process outside the service's process tree"
                );
            }
            return;
        };
        if let Some(text) = message.status {
            tracing::debug!(pid = pid.as_raw(), status = text, "service status");
            self.statuses.insert(pid, text);
        }
        if message.reloading
            && let Some(r) = &mut self.reload
            && r.pid == pid
        {
            tracing::debug!(pid = pid.as_raw(), "the service is reloading (RELOADING=1)");
            r.seen_reloading = true;
        }
        if message.stopping {
            tracing::info!(
                pid = pid.as_raw(),
                "the service says it is stopping (STOPPING=1)"
            );
            if let Phase::Running(mut i) = self.phase
                && i.pid == pid
            {
                i.ready = false;
                i.ready_by = None;
                self.phase = Phase::Running(i);
            }
        }
        if message.ready {
            self.on_ready(pid, now);
        }
    }

    /// Instance `pid` said it is ready (READY=1, or ready_check passed).
    fn on_ready(&mut self, pid: Pid, now: Now) {
        if let Some(r) = &self.reload
            && r.pid == pid
            && (r.seen_reloading || !self.settings.notify)
        {
            let r = self.reload.take().expect("checked above");
            tracing::info!(
                watch = self.names(&r.watches),
                pid = pid.as_raw(),
                "the service confirmed the reload: config applied"
            );
            for id in r.watches {
                self.pipeline.action_finished(id, true, now.mono);
            }
        }
        match self.phase {
            Phase::Running(mut i) if i.pid == pid && !i.ready && i.stop.is_none() => {
                tracing::info!(pid = pid.as_raw(), "the service is ready");
                i.ready = true;
                i.ready_by = None;
                self.phase = Phase::Running(i);
            }
            Phase::Overlapping { old, mut new } if new.pid == pid => {
                tracing::info!(
                    pid = pid.as_raw(),
                    old = old.pid.as_raw(),
                    "the new instance is ready: stopping the old one"
                );
                new.ready = true;
                new.ready_by = None;
                self.retire(old, now);
                self.phase = Phase::Running(new);
                self.finish_acting(true, now);
            }
            _ => {}
        }
    }

    fn ready_check_failed(&mut self, pid: Pid, now: Now) {
        let waiting = self.reload.as_ref().is_some_and(|r| r.pid == pid)
            || match self.phase {
                Phase::Running(i) => i.pid == pid && !i.ready && i.stop.is_none(),
                Phase::Overlapping { new, .. } => new.pid == pid,
                _ => false,
            };
        self.ready_check_at = waiting.then(|| (pid, now.mono + self.ready_check_delay));
        self.ready_check_delay = (self.ready_check_delay * 2).min(READY_CHECK_MAX);
    }

    fn ready_check_running(&self) -> bool {
        self.jobs
            .iter()
            .any(|j| matches!(j.role, JobRole::ReadyCheck(_)))
            || self
                .pending
                .values()
                .any(|p| matches!(p, Pending::Job(JobRole::ReadyCheck(_), _)))
    }

    /// A restart action ended: its watches are applied, or failed.
    fn finish_acting(&mut self, ok: bool, now: Now) {
        for id in self.pipeline.acting() {
            if self
                .reload
                .as_ref()
                .is_some_and(|r| r.watches.contains(&id))
            {
                continue;
            }
            self.pipeline.action_finished(id, ok, now.mono);
        }
    }

    // ------------------------------------------------------------ helpers

    /// One instance runs, is ready, and is not being stopped: what a
    /// `verify` checks.
    fn serving(&self) -> bool {
        matches!(self.phase, Phase::Running(i) if i.ready && i.stop.is_none())
    }

    /// The process that gets forwarded signals: the generation that serves.
    fn service_pid(&self) -> Option<Pid> {
        match &self.phase {
            Phase::Running(i) | Phase::Overlapping { old: i, .. } => Some(i.pid),
            Phase::Restarting { old } => Some(*old),
            Phase::Stopping { main, .. } => {
                main.filter(|p| self.stopping.iter().any(|i| i.pid == *p))
            }
            _ => None,
        }
    }

    /// The instances that are not being stopped.
    fn current_pids(&self) -> Vec<Pid> {
        match &self.phase {
            Phase::Running(i) => vec![i.pid],
            Phase::Overlapping { old, new } => vec![old.pid, new.pid],
            _ => Vec::new(),
        }
    }

    /// Stops `inst` and keeps it in `stopping` until it is gone.
    fn retire(&mut self, mut inst: Instance, now: Now) {
        if inst.stop.is_none() {
            self.stop(&mut inst, now);
        }
        self.stopping.push(inst);
    }

    /// Begins a graceful stop: stop_signal, then SIGCONT in case the service
    /// was stopped (a stopped process cannot act on its stop signal), and
    /// SIGKILL after stop_timeout.
    fn stop(&mut self, inst: &mut Instance, now: Now) {
        let sig = self.settings.stop_signal;
        tracing::info!(
            pid = inst.pid.as_raw(),
            "stopping the service: {sig}, then SIGKILL after {:?}",
            self.settings.stop_timeout
        );
        self.signal_service(inst.pid, sig as i32);
        if !matches!(sig, Signal::SIGCONT | Signal::SIGKILL) {
            self.signal_service(inst.pid, Signal::SIGCONT as i32);
        }
        inst.stop = Some((now.mono + self.settings.stop_timeout, false));
    }

    /// SIGKILL for an instance that outlived its stop_timeout.
    fn kill_overdue(&mut self, pid: Pid) {
        tracing::warn!(
            pid = pid.as_raw(),
            "the service is still running {:?} after {}: sending SIGKILL",
            self.settings.stop_timeout,
            self.settings.stop_signal
        );
        self.signal_service(pid, Signal::SIGKILL as i32);
    }

    fn signal_service(&mut self, pid: Pid, signo: i32) {
        self.out.push(Command::Signal {
            pid,
            group: self.settings.process_group,
            signo,
        });
    }

    fn signal_group(&mut self, pid: Pid, signo: i32) {
        self.out.push(Command::Signal {
            pid,
            group: true,
            signo,
        });
    }

    fn kill_jobs(&mut self) {
        for j in std::mem::take(&mut self.jobs) {
            self.signal_group(j.pid, Signal::SIGKILL as i32);
        }
    }

    fn names(&self, ids: &[WatchId]) -> String {
        ids.iter()
            .map(|&id| self.pipeline.name(id))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn instance_status(i: &Instance, state: &str) -> crate::status::InstanceStatus {
    crate::status::InstanceStatus {
        pid: i.pid.as_raw(),
        state: state.to_string(),
        ready: i.ready,
    }
}

fn kill_at(inst: &Instance) -> Option<Instant> {
    match inst.stop {
        Some((at, false)) => Some(at),
        _ => None,
    }
}
