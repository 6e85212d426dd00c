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
//! The core routes each event to what it concerns: a service
//! ([`service::Service`], one state machine per service), a watch
//! ([`watch::Watch`], one reload pipeline per watch), or tend as a whole
//! ([`Phase`]: running, stopping, draining the container, exited). It owns
//! what crosses them: the jobs (checks, verifies, exec actions, ready
//! checks) by pid, the spawns whose pid has not come back yet, the batches
//! of actions, readiness, and the exit policy.
//!
//! A spawn is a command whose pid comes back as [`Event::Spawned`] before any
//! other event; until then the core knows a spawn is pending and starts
//! nothing else in its place.
//!
//! The rules that protect the service:
//! - It starts, and restarts after a crash or a restart action, only when the
//!   newest content of every watch of it passed its check. Otherwise it
//!   stays down and starts the moment that is true.
//! - tend is ready only while the service runs and is ready, and every
//!   watch's current config passed its check and its action.

mod control;
pub mod metrics;
pub mod protocol;
pub mod service;
pub mod status;
#[cfg(test)]
mod tests;
pub mod watch;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::config::{self, Action, HttpAction};
use crate::ratelimit::{self, RateLimit};
use crate::signals::{self, Role};
use metrics::{CheckOutcome, Metrics};
pub use protocol::{
    Answer, Command, ControlRequest, Done, Event, Exit, ExitStatus, Notification, Now, Report,
    Restored, ServiceId, SpawnFailure, SpawnKind, WatchId,
};
use service::{Owned, Service, Stage};
use status::{ServiceStatus, State, Status, WatchResult};
use watch::{Rng, ServiceView, Watch};

/// Notifications from outside the service's process tree are said at most
/// this often (a flood from a `kubectl exec` shell), with a count.
const IGNORED_WARN_EVERY: Duration = Duration::from_secs(10);

/// How long processes left in the container get to die after SIGKILL before
/// tend exits anyway (the kernel kills them all when PID 1 exits).
pub const DRAIN_KILL_GRACE: Duration = Duration::from_secs(2);

/// What the core needs to know of supervisor.toml and of its situation.
#[derive(Debug, Clone)]
pub struct Settings {
    pub services: Vec<service::Settings>,
    /// tend exits with this service's status, and forwards signals to it.
    pub main: ServiceId,
    /// tend is PID 1: before it exits it stops what is left in the container.
    pub pid1: bool,
    /// Readiness files are written (readiness changes are then logged).
    pub readiness_files: bool,
    /// `[readiness] invalid_config = "ready"`: a rejected change does not
    /// turn readiness off while the service runs its last good config.
    pub ready_when_invalid: bool,
    /// Seeds the random waits of `splay` (from the shell: the core reads no
    /// entropy itself).
    pub seed: u64,
}

/// Every state tend as a whole can be in.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// The services start, run and restart as their policies say; watches
    /// move their changes along.
    Running,
    /// tend was told to stop: every service is stopped. tend exits with
    /// `status`, or with the status of `main` (the generation of the main
    /// service that was serving) once it is gone, or with `fallback`.
    Stopping {
        main: Option<Pid>,
        status: Option<ExitStatus>,
        fallback: ExitStatus,
    },
    /// Every service is gone for good. As PID 1, tend stops whatever is
    /// left in the container before it exits: SIGTERM once `deadline` is
    /// set, then SIGKILL (`killed`) and a short grace.
    Draining {
        status: ExitStatus,
        deadline: Option<Instant>,
        killed: bool,
    },
    Exited,
}

/// A check, verify, exec action or ready_check in flight.
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
    Check(WatchId, protocol::Fingerprint),
    /// `verify` of this applied content.
    Verify(WatchId, protocol::Fingerprint),
    Exec(Vec<WatchId>),
    /// `ready_check` for this instance of the service.
    ReadyCheck(ServiceId, Pid),
}

/// A call of a reload endpoint in flight, for these watches.
#[derive(Debug)]
struct Call {
    token: u64,
    watches: Vec<WatchId>,
    action: config::HttpAction,
    started: Instant,
}

impl Call {
    /// The shell ends the call by its timeout; this is the backstop.
    fn deadline(&self) -> Instant {
        self.started + self.action.timeout + Duration::from_secs(1)
    }
}

#[derive(Debug, Clone)]
enum Pending {
    /// A new instance; with `overlap`, next to the one that runs.
    Service {
        id: ServiceId,
        overlap: bool,
    },
    Job(JobRole, Duration),
}

/// An action to run as a job, once for every watch of the batch it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exec {
    Command(Vec<String>),
    Http(config::HttpAction),
}

/// What to do for a service's watches whose new config passed its check.
#[derive(Debug, Default)]
struct Batch {
    /// Every watch in the batch.
    watches: Vec<WatchId>,
    /// Restart the service (then nothing else is needed).
    restart: bool,
    /// Send each of these once.
    signals: Vec<Signal>,
    /// Run each once, for the watches listed with it.
    execs: Vec<(Exec, Vec<WatchId>)>,
}

pub struct Core {
    services: Vec<Service>,
    watches: Vec<Watch>,
    main: ServiceId,
    pid1: bool,
    readiness_files: bool,
    ready_when_invalid: bool,
    phase: Phase,
    jobs: Vec<Job>,
    calls: Vec<Call>,
    /// Spawns asked for whose pid has not come back yet.
    pending: BTreeMap<u64, Pending>,
    next_token: u64,
    /// Whether tend was ready at the last status, to log changes once.
    was_ready: bool,
    /// Why the readiness files are not written, while they are not (the
    /// shell's): tend's "ready" then says that probes reading them do not.
    files_problem: Option<String>,
    rng: Rng,
    metrics: Metrics,
    /// Every watch's name, by id.
    names: Vec<String>,
    /// Reloads that ended since the last event: the watch's change applied
    /// (true), or rejected or failed.
    outcomes: Vec<(WatchId, bool)>,
    /// The warning for notifications from outside the services' trees.
    ignored_notifications: RateLimit,
    out: Vec<Command>,
}

impl Core {
    /// Each of `watches` belongs to the service its `service` names.
    pub fn new(settings: Settings, watches: &[config::Watch]) -> Core {
        let main = settings.main;
        Core {
            services: settings
                .services
                .into_iter()
                .enumerate()
                .map(|(i, s)| Service::new(ServiceId(i), s))
                .collect(),
            watches: watches
                .iter()
                .enumerate()
                .map(|(i, w)| Watch::new(WatchId(i), ServiceId(w.service), w))
                .collect(),
            names: watches.iter().map(|w| w.name.clone()).collect(),
            main,
            pid1: settings.pid1,
            readiness_files: settings.readiness_files,
            ready_when_invalid: settings.ready_when_invalid,
            phase: Phase::Running,
            jobs: Vec::new(),
            calls: Vec::new(),
            pending: BTreeMap::new(),
            next_token: 1,
            was_ready: false,
            files_problem: None,
            rng: Rng(settings.seed),
            metrics: Metrics::new(watches),
            outcomes: Vec::new(),
            ignored_notifications: RateLimit::new(IGNORED_WARN_EVERY),
            out: Vec::new(),
        }
    }

    /// Why the readiness files cannot be written (None: they are).
    pub fn set_files_problem(&mut self, problem: Option<&str>) {
        if self.files_problem.as_deref() != problem {
            self.files_problem = problem.map(str::to_string);
        }
    }

    /// An earlier tend published `restored` for watch `id`: the service
    /// may start on it while the watch's newest content is rejected. Called
    /// before the first event.
    pub fn restore(&mut self, id: WatchId, restored: &Restored) {
        let (watch, generation) = (self.watches[id.0].name(), &restored.generation);
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
        self.watches[id.0].restore();
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
            Event::Content(c) => {
                let id = c.watch;
                self.tell_watch(id, watch::Input::Content(c), now);
            }
            Event::Notify { chain, message } => self.on_notify(&chain, message, now),
            Event::Done(done) => {
                if let Done::Published { result, .. } = &done {
                    self.metrics.applied(result.is_ok());
                }
                let (id, input) = match done {
                    Done::Snapshot {
                        watch,
                        fingerprint: fp,
                        result,
                    } => (watch, watch::Input::Snapshot { fp, result }),
                    Done::Published {
                        watch,
                        fingerprint: fp,
                        result,
                    } => (watch, watch::Input::Published { fp, result }),
                    Done::RolledBack {
                        watch,
                        fingerprint: fp,
                        result,
                    } => (watch, watch::Input::RolledBack { fp, result }),
                    Done::Withdrawn {
                        watch,
                        fingerprint: fp,
                        result,
                    } => (watch, watch::Input::Withdrawn { fp, result }),
                };
                self.tell_watch(id, input, now);
            }
            Event::Control {
                client,
                from,
                request,
            } => self.on_control(client, from, request, now),
            Event::Called {
                token,
                result,
                took,
            } => {
                if let Some(at) = self.calls.iter().position(|c| c.token == token) {
                    let call = self.calls.swap_remove(at);
                    self.on_called(call, result, took, now);
                }
            }
        }
        self.on_time(now);
        self.advance(now);
        if !self.outcomes.is_empty() {
            self.metrics
                .reloaded(&std::mem::take(&mut self.outcomes), now.wall);
        }
        std::mem::take(&mut self.out)
    }

    /// The counters of `GET /metrics`.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The next time something is due; None when nothing is (an idle tend
    /// sleeps without a timeout). Only deadlines something acts on count,
    /// or a deadline in the past would make the loop spin.
    pub fn deadline(&self) -> Option<Instant> {
        let phase = match self.phase {
            Phase::Draining { deadline, .. } => deadline,
            Phase::Exited => return None,
            _ => None,
        };
        let jobs = self
            .jobs
            .iter()
            .filter(|j| !j.timed_out)
            .map(|j| j.started + j.timeout)
            .min();
        let calls = self.calls.iter().map(Call::deadline).min();
        let services = self.services.iter().filter_map(Service::deadline).min();
        let watches = self
            .watches
            .iter()
            .filter_map(|w| w.deadline(self.view(w.service)))
            .min();
        let said = self.ignored_notifications.due();
        [phase, jobs, calls, services, watches, said]
            .into_iter()
            .flatten()
            .min()
    }

    // ------------------------------------------------------------ routing

    /// What the watches of service `id` need to know of it.
    fn view(&self, id: ServiceId) -> ServiceView {
        let s = &self.services[id.0];
        let stage = s.stage();
        ServiceView {
            stopping: !matches!(self.phase, Phase::Running),
            runs: matches!(
                stage,
                Stage::Running { .. } | Stage::Reloading | Stage::Overlapping
            ),
            serving: matches!(stage, Stage::Running { ready: true }),
            down: matches!(stage, Stage::Down { .. }),
            first: matches!(stage, Stage::Down { first: true }),
            can_act: matches!(stage, Stage::Running { .. }) && !s.confirming(),
        }
    }

    fn watches_of(&self, id: ServiceId) -> Vec<WatchId> {
        self.watches
            .iter()
            .filter(|w| w.service == id)
            .map(|w| w.id)
            .collect()
    }

    /// Passes `input` to watch `id` and carries out what it asks for.
    /// Actions it says are due are returned (an answer to
    /// [`watch::Input::Act`]).
    fn tell_watch(&mut self, id: WatchId, input: watch::Input, now: Now) -> Vec<Action> {
        let mut out = Vec::new();
        let view = self.view(self.watches[id.0].service);
        // A config apply operation, without `publish` (with it, each
        // publication is one).
        if let watch::Input::ActionEnded { ok } = input
            && self.watches[id.0].acting()
            && self.watches[id.0].config().publish.is_none()
        {
            self.metrics.applied(ok);
        }
        self.watches[id.0].handle(
            input,
            &mut watch::Cx {
                now,
                service: view,
                rng: &mut self.rng,
                out: &mut out,
            },
        );
        let mut actions = Vec::new();
        for o in out {
            match o {
                watch::Output::Watcher(command) => self.out.push(command),
                watch::Output::Check {
                    fp,
                    argv,
                    env,
                    timeout,
                } => {
                    let w = &self.watches[id.0];
                    let kind = if w.config().check_sockets {
                        SpawnKind::JobWithSockets(w.service)
                    } else {
                        SpawnKind::Job(w.service)
                    };
                    let token = self.token(Pending::Job(JobRole::Check(id, fp), timeout));
                    self.out.push(Command::Spawn {
                        token,
                        argv,
                        kind,
                        env,
                    });
                }
                watch::Output::Verify { fp, timeout } => {
                    let w = &self.watches[id.0];
                    if let Some(argv) = w.config().verify.clone() {
                        let service = w.service;
                        self.spawn_job(
                            argv,
                            Vec::new(),
                            service,
                            Pending::Job(JobRole::Verify(id, fp), timeout),
                        );
                    }
                }
                watch::Output::CancelVerify => {
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
                }
                watch::Output::Reloaded(ok) => self.outcomes.push((id, ok)),
                watch::Output::Act(action) => actions.push(action),
            }
        }
        actions
    }

    /// Passes `input` to service `id` and carries out what it asks for.
    fn tell_service(&mut self, id: ServiceId, input: service::Input, now: Now) {
        let mut out = Vec::new();
        let gate = self.gate(id);
        let stopping = !matches!(self.phase, Phase::Running);
        let tag = (self.services.len() > 1).then(|| self.services[id.0].cfg.name.clone());
        self.services[id.0].handle(
            input,
            &mut service::Cx {
                now: now.mono,
                stopping,
                gate: gate.as_ref().map(|(w, r)| (w.as_str(), *r)),
                names: &self.names,
                tag: tag.as_deref(),
                out: &mut out,
            },
        );
        for o in out {
            match o {
                service::Output::Spawn { overlap } => {
                    let argv = self.services[id.0].cfg.argv.clone();
                    let token = self.token(Pending::Service { id, overlap });
                    self.out.push(Command::Spawn {
                        token,
                        argv,
                        kind: SpawnKind::Service(id),
                        env: Vec::new(),
                    });
                }
                service::Output::Probe { pid, timeout } => {
                    if let Some(argv) = self.services[id.0].cfg.ready_check.clone() {
                        self.spawn_job(
                            argv,
                            Vec::new(),
                            id,
                            Pending::Job(JobRole::ReadyCheck(id, pid), timeout),
                        );
                    }
                }
                service::Output::Signal { pid, group, signo } => {
                    self.out.push(Command::Signal { pid, group, signo })
                }
                service::Output::ContinueIfStopped { pid, group } => {
                    self.out.push(Command::ContinueIfStopped { pid, group })
                }
                service::Output::Started => {
                    for w in self.watches_of(id) {
                        self.tell_watch(w, watch::Input::ServiceStarted, now);
                    }
                }
                service::Output::Restarted { ok, except } => {
                    for w in self.watches_of(id) {
                        if self.watches[w.0].acting() && !except.contains(&w) {
                            self.tell_watch(w, watch::Input::ActionEnded { ok }, now);
                        }
                    }
                }
                service::Output::Confirmed { watches, ok } => {
                    for w in watches {
                        self.tell_watch(w, watch::Input::ActionEnded { ok }, now);
                    }
                }
                service::Output::Exited { why } => {
                    for w in self.watches_of(id) {
                        self.tell_watch(w, watch::Input::ServiceExited { why: why.clone() }, now);
                    }
                }
                service::Output::Down => self.explain_waiting(id),
                service::Output::Ended(status) => self.ended(id, status, now),
            }
        }
    }

    /// Service `id`'s name for its log lines, when there are several.
    fn tag(&self, id: ServiceId) -> Option<&str> {
        (self.services.len() > 1).then(|| self.services[id.0].cfg.name.as_str())
    }

    /// The first watch of service `id` that keeps it from starting, and why.
    fn gate(&self, id: ServiceId) -> Option<(String, WatchResult)> {
        self.watches
            .iter()
            .find(|w| w.service == id && !w.startable())
            .map(|w| (w.name().to_string(), w.result()))
    }

    /// Says why service `id` does not start at once, when it does not.
    fn explain_waiting(&self, id: ServiceId) {
        if let Some((watch, result)) = self.gate(id) {
            let why = match result {
                WatchResult::Invalid => "failed its check",
                // With `publish`: a copy, a publication or a rollback failed.
                WatchResult::ActionFailed => "could not be published yet (see its check_output)",
                WatchResult::RolledBack => "is being rolled back",
                _ => "is not checked yet",
            };
            tracing::warn!(
                service = self.tag(id),
                watch,
                "the service stays down: the config of watch {watch:?} {why}; it starts as soon as a config passes"
            );
        }
    }

    // ------------------------------------------------------------ signals

    fn on_signal(&mut self, signo: i32, from: u32, code: i32, now: Now) {
        match signals::role(signo, code) {
            Role::Stop => self.on_sigterm(from, now),
            Role::Interrupt if self.main_pid().is_none() => self.on_interrupt(from, now),
            Role::Interrupt | Role::Forward => self.forward(signo, from),
            Role::Child => {}
            Role::Ignore => tracing::warn!(
                sender_pid = signals::sender(from),
                code,
                "{} is not for the service (raised by the kernel, or the C library's own): not forwarded",
                signals::describe(signo)
            ),
        }
    }

    fn on_sigterm(&mut self, from: u32, now: Now) {
        if !matches!(self.phase, Phase::Running) {
            tracing::info!(
                sender_pid = signals::sender(from),
                "SIGTERM received again: already stopping"
            );
            return;
        }
        tracing::info!(
            sender_pid = signals::sender(from),
            "SIGTERM received: stopping"
        );
        let main = self.main_pid();
        self.stop(main, None, ExitStatus::Signal(Signal::SIGTERM as i32), now);
    }

    /// SIGINT while no service process exists: there is nothing to interrupt,
    /// so Ctrl-C (docker run -it) stops tend.
    fn on_interrupt(&mut self, from: u32, now: Now) {
        if matches!(self.phase, Phase::Running) {
            tracing::info!(
                sender_pid = signals::sender(from),
                "SIGINT received while no service runs: stopping"
            );
            self.stop(None, None, ExitStatus::Signal(Signal::SIGINT as i32), now);
        }
    }

    fn forward(&mut self, signo: i32, from: u32) {
        match self.main_pid() {
            Some(pid) => self.out.push(Command::Forward {
                pid,
                group: self.services[self.main.0].cfg.process_group,
                signo,
                from,
            }),
            None => tracing::info!(
                sender_pid = signals::sender(from),
                "{} received while no service runs: dropped",
                signals::describe(signo)
            ),
        }
    }

    /// What tend last heard on NOTIFY_SOCKET from instance `pid` of a
    /// service (see [`Service::last_heard`]).
    #[cfg(test)]
    fn last_heard(&self, pid: Pid) -> String {
        self.services
            .iter()
            .find(|s| s.owns(pid).is_some())
            .unwrap_or(&self.services[self.main.0])
            .last_heard(pid)
    }

    /// The process of the main service that gets forwarded signals.
    fn main_pid(&self) -> Option<Pid> {
        self.services[self.main.0].serving_pid()
    }

    // ------------------------------------------------------------ stopping

    /// tend stops: every service is stopped, then tend exits with `status`,
    /// or the status of `main` once it exits, or `fallback`.
    fn stop(
        &mut self,
        main: Option<Pid>,
        status: Option<ExitStatus>,
        fallback: ExitStatus,
        now: Now,
    ) {
        self.kill_jobs();
        self.phase = Phase::Stopping {
            main,
            status,
            fallback,
        };
        self.stop_services(now);
    }

    /// While tend stops: every service gets its stop signal; once none is
    /// left, the container is drained.
    fn stop_services(&mut self, now: Now) {
        let Phase::Stopping {
            status, fallback, ..
        } = self.phase
        else {
            return;
        };
        // A service stops once every service after it is gone: in reverse
        // order of `after`, unrelated ones together.
        for i in 0..self.services.len() {
            let id = ServiceId(i);
            let dependents_gone = self
                .services
                .iter()
                .filter(|s| s.cfg.after.contains(&id))
                .all(Service::gone);
            if dependents_gone {
                self.tell_service(id, service::Input::Stop, now);
            }
        }
        if self.services.iter().all(Service::gone) {
            self.drain(status.unwrap_or(fallback));
        }
    }

    /// Service `id` is gone for good with `status`: the exit policy. The
    /// main service, or a required one, ends the container with its status;
    /// another is logged, and the container goes on.
    fn ended(&mut self, id: ServiceId, status: ExitStatus, now: Now) {
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        let s = &self.services[id.0];
        let several = self.services.len() > 1;
        if id == self.main || s.cfg.required {
            if several {
                let what = if id == self.main {
                    "the main service"
                } else {
                    "a required service"
                };
                tracing::warn!(
                    service = s.cfg.name,
                    "{what} ended ({status}): stopping the others; tend exits with {}",
                    status.code()
                );
            }
            self.stop(None, Some(status), status, now);
        } else {
            tracing::warn!(
                service = s.cfg.name,
                "service {:?} ended ({status}); it is not required (required = false): the \
                 container goes on without it",
                s.cfg.name
            );
        }
    }

    /// Whether what service `id` is `after` lets it start: each is ready (a
    /// oneshot: it exited 0), or ended for good while not required.
    fn after_ready(&self, id: ServiceId) -> bool {
        self.services[id.0].cfg.after.iter().all(|d| {
            let dep = &self.services[d.0];
            dep.ready() || (!dep.cfg.required && dep.ended().is_some())
        })
    }

    /// Every service is gone (or never started): stop what is left and exit
    /// with `status`.
    fn drain(&mut self, status: ExitStatus) {
        self.kill_jobs();
        if !self.pid1 {
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
        let stop_timeout = self.services[self.main.0].cfg.stop_timeout;
        if no_children {
            self.exit(status.code());
        } else if deadline.is_none() {
            tracing::info!(
                "processes are still running in the container: sending them SIGTERM, SIGKILL after {stop_timeout:?}"
            );
            self.phase = Phase::Draining {
                status,
                deadline: Some(now.mono + stop_timeout),
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

    // ------------------------------------------------------------ exits

    fn on_exit(&mut self, exit: Exit, now: Now) {
        if let Some(id) = self
            .services
            .iter()
            .position(|s| s.owns(exit.pid).is_some())
            .map(ServiceId)
        {
            if let Phase::Stopping {
                main: Some(main),
                status,
                fallback,
            } = self.phase
                && main == exit.pid
            {
                self.phase = Phase::Stopping {
                    main: Some(main),
                    status: status.or(Some(exit.status)),
                    fallback,
                };
            }
            self.tell_service(
                id,
                service::Input::Exited {
                    pid: exit.pid,
                    status: exit.status,
                },
                now,
            );
        } else if let Some(at) = self.jobs.iter().position(|j| j.pid == exit.pid) {
            let job = self.jobs.swap_remove(at);
            // What the job left running in its process group goes with it.
            self.signal_group(job.pid, Signal::SIGKILL as i32);
            self.on_job_exit(job, exit, now);
        } else {
            tracing::debug!(pid = exit.pid.as_raw(), "reaped an orphan: {}", exit.status);
        }
    }

    fn on_job_exit(&mut self, job: Job, exit: Exit, now: Now) {
        if !matches!(self.phase, Phase::Running) {
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
                self.tell_watch(
                    id,
                    watch::Input::Checked {
                        fp,
                        passed,
                        describe,
                        took,
                        output,
                    },
                    now,
                );
            }
            JobRole::Verify(id, fp) => {
                self.tell_watch(
                    id,
                    watch::Input::Verified {
                        fp,
                        passed,
                        describe,
                        output,
                    },
                    now,
                );
            }
            JobRole::ReadyCheck(id, pid) => {
                if passed {
                    tracing::debug!(pid = pid.as_raw(), took = ?took, "ready_check passed");
                } else {
                    tracing::debug!(pid = pid.as_raw(), "ready_check failed ({describe})");
                }
                self.tell_service(id, service::Input::Probed { pid, passed }, now);
            }
            JobRole::Exec(ids) => {
                let said = if passed { String::new() } else { describe };
                self.action_ran(&ids, passed, took, &said, &output, now);
            }
        }
    }

    /// The reload command (or call) of watches `ids` ended, `ok` or not,
    /// after `took`: each watch is told, and the log says how (`said`, and
    /// the tail of its `output`).
    fn action_ran(
        &mut self,
        ids: &[WatchId],
        ok: bool,
        took: Duration,
        said: &str,
        output: &str,
        now: Now,
    ) {
        for &id in ids {
            self.tell_watch(id, watch::Input::ActionEnded { ok }, now);
        }
        let names = self.names(ids);
        if ok {
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(" ({said})")
            };
            tracing::info!(watch = names, took = ?took, "reload command succeeded{said}: config applied");
        } else {
            let retry = ids
                .iter()
                .find_map(|&id| self.watches[id.0].retry_in(now.mono));
            tracing::warn!(
                watch = names,
                "reload command failed ({said}); retrying in {:?}{}",
                retry.unwrap_or_default(),
                crate::text::for_log(output)
            );
        }
    }

    /// A call of a reload endpoint ended (or its backstop passed): like an
    /// exec action's end, with the endpoint and its answer in the log.
    fn on_called(&mut self, call: Call, result: Result<Answer, String>, took: Duration, now: Now) {
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        let HttpAction { method, url, .. } = &call.action;
        self.metrics.called(url, &result, took);
        let (ok, said) = match &result {
            Ok(a) if a.line.is_empty() => (a.success(), format!("{method} {url}: HTTP {}", a.code)),
            Ok(a) => (
                a.success(),
                format!("{method} {url}: HTTP {}: {}", a.code, a.line),
            ),
            Err(e) => (false, format!("{method} {url}: {e}")),
        };
        self.action_ran(&call.watches, ok, took, &said, "", now);
    }

    // ------------------------------------------------------------ spawning

    fn token(&mut self, what: Pending) -> u64 {
        let token = self.next_token;
        self.next_token += 1;
        self.pending.insert(token, what);
        token
    }

    fn spawn_job(
        &mut self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        service: ServiceId,
        what: Pending,
    ) {
        let token = self.token(what);
        self.out.push(Command::Spawn {
            token,
            argv,
            kind: SpawnKind::Job(service),
            env,
        });
    }

    fn on_spawned(&mut self, token: u64, result: Result<Pid, SpawnFailure>, now: Now) {
        let Some(what) = self.pending.remove(&token) else {
            return;
        };
        match (what, result) {
            (Pending::Service { id, overlap }, result) => {
                self.tell_service(id, service::Input::Spawned { overlap, result }, now);
            }
            (Pending::Job(..), Ok(pid)) if !matches!(self.phase, Phase::Running) => {
                self.signal_group(pid, Signal::SIGKILL as i32);
            }
            (Pending::Job(role, timeout), Ok(pid)) => {
                match &role {
                    JobRole::Check(id, _) => {
                        let w = self.watches[id.0].config();
                        tracing::info!(watch = w.name, pid = pid.as_raw(), command = ?w.check.as_deref().unwrap_or_default(), "checking the new config");
                    }
                    JobRole::Exec(ids) => {
                        tracing::info!(
                            watch = self.names(ids),
                            pid = pid.as_raw(),
                            "running the reload command"
                        );
                    }
                    JobRole::ReadyCheck(..) => {
                        tracing::debug!(pid = pid.as_raw(), "running ready_check");
                    }
                    JobRole::Verify(id, _) => {
                        tracing::debug!(
                            watch = self.watches[id.0].name(),
                            pid = pid.as_raw(),
                            "running verify"
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
                    watch = self.watches[id.0].name(),
                    "cannot run the check: {}",
                    e.message
                );
                self.tell_watch(
                    id,
                    watch::Input::Checked {
                        fp,
                        passed: false,
                        describe: e.message.clone(),
                        took: Duration::ZERO,
                        output: e.message,
                    },
                    now,
                );
            }
            (Pending::Job(JobRole::Exec(ids), _), Err(e)) => {
                tracing::warn!(
                    watch = self.names(&ids),
                    "cannot run the reload command: {}",
                    e.message
                );
                for id in ids {
                    self.tell_watch(id, watch::Input::ActionEnded { ok: false }, now);
                }
            }
            (Pending::Job(JobRole::Verify(id, fp), _), Err(e)) => {
                self.tell_watch(
                    id,
                    watch::Input::Verified {
                        fp,
                        passed: false,
                        describe: e.message.clone(),
                        output: e.message,
                    },
                    now,
                );
            }
            (Pending::Job(JobRole::ReadyCheck(id, pid), _), Err(e)) => {
                tracing::warn!("cannot run ready_check: {}", e.message);
                self.tell_service(id, service::Input::Probed { pid, passed: false }, now);
            }
        }
    }

    // ------------------------------------------------------------ notify

    fn on_notify(&mut self, chain: &[Pid], message: Notification, now: Now) {
        let mut stopping = false;
        for &pid in chain {
            for i in 0..self.services.len() {
                match self.services[i].owns(pid) {
                    Some(Owned::Current) => {
                        self.tell_service(
                            ServiceId(i),
                            service::Input::Notified { pid, message },
                            now,
                        );
                        return;
                    }
                    Some(Owned::Stopping) => stopping = true,
                    None => {}
                }
            }
        }
        if stopping {
            tracing::debug!("a notification from an instance being stopped: nothing to do");
        } else if let Some(held) = self.ignored_notifications.allow(now.mono) {
            tracing::warn!(
                pid = chain.first().map(|p| p.as_raw()),
                "ignored a notification from a process outside the service's process tree{}",
                ratelimit::held_back(held, IGNORED_WARN_EVERY)
            );
        }
    }

    // ------------------------------------------------------------ time

    fn on_time(&mut self, now: Now) {
        if let Some(held) = self.ignored_notifications.flush(now.mono) {
            tracing::warn!(
                "ignored {held} more notification(s) from processes outside the service's process tree"
            );
        }
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
        let (overdue, calls): (Vec<Call>, Vec<Call>) = std::mem::take(&mut self.calls)
            .into_iter()
            .partition(|c| now.mono >= c.deadline());
        self.calls = calls;
        for call in overdue {
            self.out.push(Command::CancelCall { token: call.token });
            let took = call.deadline() - call.started;
            let why = format!("no outcome within {took:?}: the call was dropped");
            self.on_called(call, Err(why), took, now);
        }
        for i in 0..self.services.len() {
            self.tell_service(ServiceId(i), service::Input::Tick, now);
        }
        if let Phase::Draining {
            status,
            deadline: Some(deadline),
            killed,
        } = self.phase
            && now.mono >= deadline
        {
            if killed {
                tracing::warn!("processes are still left after SIGKILL: exiting anyway");
                self.exit(status.code());
            } else {
                tracing::warn!(
                    "processes are still running after {:?}: sending SIGKILL",
                    self.services[self.main.0].cfg.stop_timeout
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
    }

    // ------------------------------------------------------------ the pipeline

    /// Moves everything along: the watches' due steps (checks, splays,
    /// retries, verifies), the starts of services whose config passed, and
    /// the actions that are ready, as one batch per service.
    fn advance(&mut self, now: Now) {
        if matches!(self.phase, Phase::Stopping { .. }) {
            self.stop_services(now);
        }
        if !matches!(self.phase, Phase::Running) {
            return;
        }
        loop {
            for i in 0..self.watches.len() {
                self.tell_watch(WatchId(i), watch::Input::Tick, now);
            }
            let mut acted = false;
            for i in 0..self.services.len() {
                let id = ServiceId(i);
                let mine = self.watches_of(id);
                match self.services[i].stage() {
                    Stage::Down { .. }
                        if self.after_ready(id)
                            && mine.iter().all(|w| self.watches[w.0].startable()) =>
                    {
                        self.tell_service(id, service::Input::Start, now);
                    }
                    Stage::Running { .. }
                        if !self.services[i].confirming()
                            && !mine.iter().any(|w| self.watches[w.0].checking_now()) =>
                    {
                        let mut batch = Batch::default();
                        for w in mine {
                            for action in self.tell_watch(w, watch::Input::Act, now) {
                                batch.add(w, action);
                            }
                        }
                        if !batch.watches.is_empty() {
                            self.apply(id, batch, now);
                            // An action done at once (a signal) may leave
                            // newer content that waited for it (a
                            // rollback's) to check, and one applied just now
                            // is verified at once.
                            acted = true;
                        }
                    }
                    _ => {}
                }
                if !matches!(self.phase, Phase::Running) {
                    return;
                }
            }
            if !acted {
                break;
            }
        }
    }

    fn apply(&mut self, id: ServiceId, batch: Batch, now: Now) {
        let names = self.names(&batch.watches);
        if batch.restart {
            // A fresh process reads every config: nothing else to do.
            if self.services[id.0].cfg.overlap {
                tracing::info!(
                    service = self.tag(id),
                    watch = names,
                    "restarting the service on the new config: the new instance starts next to the old one"
                );
            } else {
                tracing::info!(
                    service = self.tag(id),
                    watch = names,
                    "restarting the service on the new config"
                );
            }
            self.tell_service(id, service::Input::Restart, now);
            return;
        }
        let mut done: Vec<WatchId> = batch.watches.clone();
        for (_, users) in &batch.execs {
            done.retain(|i| !users.contains(i));
        }
        let confirm = self.services[id.0].cfg.confirms_reloads() && !batch.signals.is_empty();
        let signalled: Vec<WatchId> = done
            .iter()
            .copied()
            .filter(|w| matches!(self.watches[w.0].config().action, Action::Signal(_)))
            .collect();
        if !batch.signals.is_empty() {
            let watches = if confirm {
                done.retain(|w| !signalled.contains(w));
                signalled
            } else {
                done.clone()
            };
            self.tell_service(
                id,
                service::Input::Reload {
                    signals: batch.signals,
                    watches,
                    confirm,
                },
                now,
            );
        }
        for w in done {
            if matches!(self.watches[w.0].config().action, Action::None) {
                tracing::info!(
                    watch = self.watches[w.0].name(),
                    "config accepted (on_change = \"none\")"
                );
            }
            self.tell_watch(w, watch::Input::ActionEnded { ok: true }, now);
        }
        for (exec, users) in batch.execs {
            match exec {
                Exec::Command(argv) => {
                    let timeout = users
                        .iter()
                        .map(|w| self.watches[w.0].config().check_timeout)
                        .max()
                        .unwrap_or_default();
                    let role = Pending::Job(JobRole::Exec(users), timeout);
                    self.spawn_job(argv, Vec::new(), id, role);
                }
                Exec::Http(action) => {
                    let token = self.next_token;
                    self.next_token += 1;
                    tracing::info!(
                        watch = self.names(&users),
                        "calling the reload endpoint: {} {}",
                        action.method,
                        action.url
                    );
                    self.out.push(Command::CallHttp {
                        token,
                        action: action.clone(),
                    });
                    self.calls.push(Call {
                        token,
                        watches: users,
                        action,
                        started: now.mono,
                    });
                }
            }
        }
    }

    // ------------------------------------------------------------ status

    /// What the status file should say now. Logs readiness changes.
    pub fn status(&mut self) -> Status {
        let main = &self.services[self.main.0];
        // Every required service (and the main one) must be ready; one not
        // ready yet, or no more, says whether tend is starting.
        let waiting_for = self
            .services
            .iter()
            .enumerate()
            .find(|(i, s)| (s.cfg.required || *i == self.main.0) && !s.ready())
            .map(|(_, s)| s);
        // A watched path that is not there is a volume not mounted.
        let absent = self.watches.iter().any(|w| !w.absent().is_empty());
        let ready = waiting_for.is_none()
            && !absent
            && self
                .watches
                .iter()
                .all(|w| w.good() || (self.ready_when_invalid && w.runs_last_good()));
        let invalid = self.watches.iter().any(|w| w.result().rejected());
        let busy = self.watches.iter().any(Watch::busy) || main.confirming();
        let state = match (self.phase, main.stage()) {
            (Phase::Stopping { .. } | Phase::Draining { .. } | Phase::Exited, _) => State::Stopping,
            (_, Stage::Stopping | Stage::Ended(_)) => State::Stopping,
            (_, Stage::Restarting | Stage::BackingOff | Stage::Overlapping) => State::Restarting,
            (_, Stage::Down { first: false }) if !invalid => State::Restarting,
            _ if invalid => State::InvalidConfig,
            (_, Stage::Down { first: true }) => State::Starting,
            (_, Stage::Running { ready: false }) if main.restarts() == 0 => State::Starting,
            (_, Stage::Running { ready: false } | Stage::Failing) => State::Restarting,
            (_, Stage::Reloading) => State::Reloading,
            _ if waiting_for.is_some_and(|s| s.restarts() == 0 && s.last_exit().is_none()) => {
                State::Starting
            }
            _ if waiting_for.is_some() => State::Restarting,
            _ if absent && !busy => State::Starting,
            _ if ready && !busy => State::Ready,
            _ => State::Reloading,
        };
        if ready != self.was_ready && (self.readiness_files || !self.watches.is_empty()) {
            self.was_ready = ready;
            if ready {
                match &self.files_problem {
                    None => tracing::info!("ready"),
                    Some(problem) => {
                        tracing::warn!("services ready, but `tend probe` says not ready: {problem}")
                    }
                }
            } else {
                let problem = self
                    .watches
                    .iter()
                    .find_map(|w| w.problem().map(|r| (w.name(), r)));
                match problem {
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
                pid: main.serving_pid().map(Pid::as_raw),
                restarts: main.restarts(),
                status: main.status_text(),
                instances: main.instance_statuses(),
            },
            services: self
                .services
                .iter()
                .enumerate()
                .map(|(i, s)| service_entry(s, i == self.main.0))
                .collect(),
            watches: self
                .watches
                .iter()
                .map(|w| {
                    let mut status = w.status();
                    status.service = self.services[w.service.0].cfg.name.clone();
                    status
                })
                .collect(),
            updated_at: String::new(),
        }
    }

    // ------------------------------------------------------------ helpers

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
        for c in std::mem::take(&mut self.calls) {
            self.out.push(Command::CancelCall { token: c.token });
        }
    }

    fn names(&self, ids: &[WatchId]) -> String {
        ids.iter()
            .map(|&id| self.watches[id.0].name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Service `s` as the status file lists it.
fn service_entry(s: &Service, main: bool) -> status::ServiceEntry {
    let state = match s.stage() {
        Stage::Down { .. } => "waiting",
        Stage::BackingOff => "backing_off",
        Stage::Running { ready: false } => "starting",
        Stage::Running { ready: true } => "running",
        Stage::Reloading => "reloading",
        Stage::Overlapping | Stage::Restarting => "restarting",
        Stage::Failing => "failing",
        Stage::Stopping => "stopping",
        Stage::Done => "done",
        Stage::Ended(_) => "ended",
    };
    status::ServiceEntry {
        name: s.cfg.name.clone(),
        state: state.to_string(),
        pid: s.serving_pid().map(Pid::as_raw),
        ready: s.ready(),
        restarts: s.restarts(),
        main,
        required: s.cfg.required || main,
        last_exit: s.last_exit().map(|e| e.to_string()),
        last_exit_code: s.last_exit().map(ExitStatus::code),
        status: s.status_text(),
        dropped_lines: 0,
    }
}

impl Batch {
    /// Adds watch `w`'s action.
    fn add(&mut self, w: WatchId, action: Action) {
        self.watches.push(w);
        let exec = match action {
            Action::Restart => {
                self.restart = true;
                return;
            }
            Action::Signal(sig) => {
                if !self.signals.contains(&sig) {
                    self.signals.push(sig);
                }
                return;
            }
            Action::None => return,
            Action::Exec(argv) => Exec::Command(argv),
            Action::Http(h) => Exec::Http(h),
        };
        match self.execs.iter_mut().find(|(e, _)| *e == exec) {
            Some((_, users)) => users.push(w),
            None => self.execs.push((exec, vec![w])),
        }
    }
}
