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
//! The rules that protect the service:
//! - It starts, and restarts after a crash or a restart action, only when the
//!   newest content of every watch passed its check. Otherwise it stays down
//!   ([`Phase::WaitingForConfig`]) and starts the moment that is true.
//! - tend is ready only while the service runs and every watch's current
//!   config passed its check and its action.

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
use crate::watch::{Fingerprint, WatchId};
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
    Content(Content),
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

/// What one scan of a watch found.
#[derive(Debug, Clone)]
pub struct Content {
    pub watch: WatchId,
    pub fingerprint: Fingerprint,
    /// Configured paths whose content differs from the previous scan.
    pub changed: Vec<PathBuf>,
    pub files: usize,
    pub missing: Vec<PathBuf>,
}

/// Something for the shell to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start a process; answer with [`Event::Spawned`] before anything else.
    Spawn {
        token: u64,
        argv: Vec<String>,
        kind: SpawnKind,
    },
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
}

/// Every state tend as a whole can be in.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Before the first start: the first content of every watch is being
    /// checked. Without watches this lasts no time at all.
    Starting,
    /// The service runs.
    Running(Instance),
    /// A restart action: the old instance is stopping; the service starts
    /// again when it is gone.
    Restarting {
        old: Instance,
    },
    /// The service exited on its own; the restart policy starts it again then.
    BackingOff {
        until: Instant,
    },
    /// The service is down and starts as soon as the newest content of every
    /// watch passed its check.
    WaitingForConfig,
    /// tend was told to stop: the service is being stopped.
    Stopping(Instance),
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
    /// Sent its stop signal: SIGKILL at `kill_at` unless `killed` already.
    stop: Option<(Instant, bool)>,
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
    Exec(Vec<WatchId>),
}

#[derive(Debug, Clone)]
enum Pending {
    Service,
    Job(JobRole, Duration),
}

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
    out: Vec<Command>,
}

impl Core {
    pub fn new(settings: Settings, watches: &[config::Watch]) -> Core {
        Core {
            settings,
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
            out: Vec::new(),
        }
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
        }
        self.on_time(now);
        self.advance(now);
        std::mem::take(&mut self.out)
    }

    /// The next time something is due; None when nothing is (an idle tend
    /// sleeps without a timeout). Only deadlines the current phase acts on
    /// count, or a deadline in the past would make the loop spin.
    pub fn deadline(&self) -> Option<Instant> {
        let (phase, watching, acting) = match &self.phase {
            Phase::Starting | Phase::WaitingForConfig => (None, true, false),
            Phase::Running(_) => (None, true, true),
            Phase::Restarting { old } => (kill_at(old), true, false),
            Phase::BackingOff { until } => (Some(*until), true, false),
            Phase::Stopping(i) => (kill_at(i), false, false),
            Phase::Draining { deadline, .. } => (*deadline, false, false),
            Phase::Exited => (None, false, false),
        };
        let jobs = self
            .jobs
            .iter()
            .filter(|j| !j.timed_out)
            .map(|j| j.started + j.timeout)
            .min();
        [
            phase,
            jobs,
            self.pipeline.recheck_deadline().filter(|_| watching),
            self.pipeline.retry_deadline().filter(|_| acting),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// What the status file should say now. Logs readiness changes.
    pub fn status(&mut self) -> Status {
        let running = matches!(self.phase, Phase::Running(_));
        let ready = running && self.pipeline.all_good();
        let invalid = self.pipeline.any_invalid();
        let state = match &self.phase {
            Phase::Stopping(_) | Phase::Draining { .. } | Phase::Exited => State::Stopping,
            Phase::Restarting { .. } | Phase::BackingOff { .. } => State::Restarting,
            Phase::WaitingForConfig if !invalid => State::Restarting,
            _ if invalid => State::InvalidConfig,
            Phase::Starting => State::Starting,
            _ if ready && !self.pipeline.busy() => State::Ready,
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
        Status {
            state,
            ready,
            service: ServiceStatus {
                pid: self.service_pid().map(Pid::as_raw),
                restarts: self.restarts,
            },
            watches: self
                .pipeline
                .reports()
                .map(|r| WatchStatus {
                    name: r.name.to_string(),
                    result: r.result,
                    check_output: crate::text::escape_keeping_lines(r.check_output),
                    changed_at: r.changed_at.map(crate::time::rfc3339_millis),
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
        match self.phase {
            Phase::Running(mut inst) => {
                tracing::info!(from, "SIGTERM received: stopping");
                self.kill_jobs();
                self.stop(&mut inst, now);
                self.phase = Phase::Stopping(inst);
            }
            Phase::Restarting { old } => {
                tracing::info!(from, "SIGTERM received: stopping");
                self.kill_jobs();
                self.phase = Phase::Stopping(old);
            }
            Phase::Starting | Phase::BackingOff { .. } | Phase::WaitingForConfig => {
                tracing::info!(from, "SIGTERM received: stopping");
                self.drain(ExitStatus::Signal(Signal::SIGTERM as i32));
            }
            Phase::Stopping(_) | Phase::Draining { .. } | Phase::Exited => {
                tracing::info!(from, "SIGTERM received again: already stopping");
            }
        }
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
        if self.service_pid() == Some(exit.pid) {
            self.on_service_exit(exit.status, now);
        } else if let Some(at) = self.jobs.iter().position(|j| j.pid == exit.pid) {
            let job = self.jobs.swap_remove(at);
            // What the job left running in its process group goes with it.
            self.signal_group(job.pid, Signal::SIGKILL as i32);
            self.on_job_exit(job, exit, now);
        } else {
            tracing::debug!(pid = exit.pid.as_raw(), "reaped an orphan: {}", exit.status);
        }
    }

    fn on_service_exit(&mut self, status: ExitStatus, now: Now) {
        match self.phase {
            Phase::Running(inst) => {
                let uptime = now.mono.saturating_duration_since(inst.since);
                self.after_unplanned_exit(status, uptime, Some(inst.pid), now);
            }
            Phase::Restarting { old } => {
                tracing::info!(pid = old.pid.as_raw(), "service stopped: {status}");
                for id in self.pipeline.acting() {
                    self.pipeline.action_finished(id, true, now.mono);
                }
                self.phase = Phase::WaitingForConfig;
                self.explain_waiting();
            }
            Phase::Stopping(inst) => {
                tracing::info!(pid = inst.pid.as_raw(), "service stopped: {status}");
                self.drain(status);
            }
            _ => unreachable!("a service pid exists only in the phases above"),
        }
    }

    /// The service exited (or could not start) without tend asking: the
    /// restart policy decides what happens.
    fn after_unplanned_exit(
        &mut self,
        status: ExitStatus,
        uptime: Duration,
        pid: Option<Pid>,
        now: Now,
    ) {
        let pid = pid.map_or(0, Pid::as_raw);
        let again = match self.settings.restart {
            Restart::Never => false,
            Restart::OnFailure => !status.success(),
            Restart::Always => true,
        };
        if !again {
            tracing::info!(pid, "service exited: {status}, after {uptime:.1?}");
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
            "service exited: {status}, after {uptime:.1?}; restarting in {delay:?} (restart = {}){gate}",
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
                if job.timed_out {
                    output.push_str(&format!(
                        "\n[tend: the check timed out after {took:?} and was killed]"
                    ));
                }
                self.on_check_result(id, fp, passed, &describe, took, output, now);
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
        match self
            .pipeline
            .check_finished(id, fp, passed, output, now.mono)
        {
            Verdict::Stale => tracing::info!(
                watch = name,
                "check result dropped: the config changed while it ran; checking again"
            ),
            Verdict::Passed => tracing::info!(watch = name, took = ?took, "check passed"),
            Verdict::Failed { recheck_in } => {
                let consequence = match self.phase {
                    Phase::Starting => "the service is not started until a valid config arrives",
                    Phase::Running(_) => {
                        "the new config is rejected and the service keeps running on the last good one"
                    }
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
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(token, what);
        self.out.push(Command::Spawn { token, argv, kind });
    }

    fn pending_service(&self) -> Option<u64> {
        self.pending
            .iter()
            .find(|(_, p)| matches!(p, Pending::Service))
            .map(|(t, _)| *t)
    }

    fn start_service(&mut self) {
        if self.pending_service().is_none() {
            self.spawn(
                self.settings.argv.clone(),
                SpawnKind::Service,
                Pending::Service,
            );
        }
    }

    fn on_spawned(&mut self, token: u64, result: Result<Pid, SpawnFailure>, now: Now) {
        let Some(what) = self.pending.remove(&token) else {
            return;
        };
        match (what, result) {
            (Pending::Service, Ok(pid)) => {
                if self.started_once {
                    self.restarts += 1;
                }
                self.started_once = true;
                tracing::info!(pid = pid.as_raw(), command = ?self.settings.argv, "service started");
                self.pipeline.started();
                self.phase = Phase::Running(Instance {
                    pid,
                    since: now.mono,
                    stop: None,
                });
            }
            (Pending::Service, Err(e)) => {
                tracing::error!("{}", e.message);
                if !std::mem::replace(&mut self.started_once, true) {
                    // Nothing ran yet: exit with the shell's status,
                    // whatever the restart policy.
                    self.drain(ExitStatus::Code(e.exit_code));
                } else {
                    self.after_unplanned_exit(
                        ExitStatus::Code(e.exit_code),
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
        }
    }

    // ------------------------------------------------------------ watches

    fn on_content(&mut self, c: Content, now: Now) {
        if !self.pipeline_runs() {
            return;
        }
        let name = self.pipeline.name(c.watch).to_string();
        match self.pipeline.observe(c.watch, c.fingerprint, now.wall) {
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
    }

    /// Whether checks and actions still matter (not once tend stops).
    fn pipeline_runs(&self) -> bool {
        !matches!(
            self.phase,
            Phase::Stopping(_) | Phase::Draining { .. } | Phase::Exited
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
        match self.phase {
            Phase::Restarting { old: mut inst } | Phase::Stopping(mut inst) => {
                if let Some((kill_at, false)) = inst.stop
                    && now.mono >= kill_at
                {
                    tracing::warn!(
                        pid = inst.pid.as_raw(),
                        "the service is still running {:?} after {}: sending SIGKILL",
                        self.settings.stop_timeout,
                        self.settings.stop_signal
                    );
                    inst.stop = Some((kill_at, true));
                    self.signal_service(inst.pid, Signal::SIGKILL as i32);
                    self.phase = match self.phase {
                        Phase::Restarting { .. } => Phase::Restarting { old: inst },
                        _ => Phase::Stopping(inst),
                    };
                }
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
            for id in self.pipeline.rechecks_due(now.mono) {
                tracing::info!(
                    watch = self.pipeline.name(id),
                    "checking the rejected config again"
                );
            }
        }
    }

    /// Says why the service does not start at once, when it does not.
    fn explain_waiting(&self) {
        if let Some((watch, result)) = self.pipeline.first_unpassed() {
            let why = if result == crate::status::WatchResult::Invalid {
                "failed its check"
            } else {
                "is not checked yet"
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
        for (id, fp) in self.pipeline.checks_to_start() {
            self.start_check(id, fp, now);
        }
        match self.phase {
            Phase::Starting | Phase::WaitingForConfig if self.pipeline.all_passed() => {
                self.start_service();
            }
            Phase::Running(_) => {
                if let Some(batch) = self.pipeline.take_batch(now.mono) {
                    self.apply(batch, now);
                }
            }
            _ => {}
        }
    }

    fn start_check(&mut self, id: WatchId, fp: Fingerprint, now: Now) {
        let w = &self.watches[id.0];
        match &w.check {
            None => {
                self.pipeline
                    .check_finished(id, fp, true, String::new(), now.mono);
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

    fn apply(&mut self, batch: Batch, now: Now) {
        let names = self.names(&batch.watches);
        if batch.restart {
            let Phase::Running(mut inst) = self.phase else {
                unreachable!("batches are applied only while the service runs");
            };
            tracing::info!(watch = names, "restarting the service on the new config");
            self.stop(&mut inst, now);
            self.phase = Phase::Restarting { old: inst };
            return;
        }
        let mut done: Vec<WatchId> = batch.watches.clone();
        for (_, users) in &batch.execs {
            done.retain(|i| !users.contains(i));
        }
        if let Some(pid) = self.service_pid() {
            for sig in &batch.signals {
                self.signal_service(pid, *sig as i32);
                tracing::info!(
                    watch = self.names(&done),
                    pid = pid.as_raw(),
                    "sent {sig} to the service: config applied"
                );
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
                .map(|id| self.watches[id.0].check_timeout)
                .max()
                .unwrap_or_default();
            self.spawn(
                argv,
                SpawnKind::Job,
                Pending::Job(JobRole::Exec(users), timeout),
            );
        }
    }

    // ------------------------------------------------------------ helpers

    /// The service process, while one exists.
    fn service_pid(&self) -> Option<Pid> {
        match &self.phase {
            Phase::Running(i) | Phase::Restarting { old: i } | Phase::Stopping(i) => Some(i.pid),
            _ => None,
        }
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

fn kill_at(inst: &Instance) -> Option<Instant> {
    match inst.stop {
        Some((at, false)) => Some(at),
        _ => None,
    }
}
