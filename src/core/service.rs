//! One service's lifecycle: start, readiness, restarts, stop.
//!
//! [`Service::handle`] is the one way in: the core passes what happened to
//! this service ([`Input`]) and collects what to do ([`Output`]). A reader
//! lists every state of a service from [`State`]; each variant holds what
//! that state needs, and an instance ([`Instance`]) holds its own
//! readiness. A pid exists here exactly while its process does: it is
//! dropped when its exit is reaped, and never signalled after that.
//!
//! Readiness of an instance: with `notify` it is ready once it sends
//! READY=1; with `ready_check` once that command exits 0; otherwise at once.
//! An instance not ready within `ready_timeout` has failed.
//!
//! Generations: a restart with `restart_mode = "overlap"` starts the new
//! instance next to the old one ([`State::Overlapping`]), and stops the old
//! one only once the new one is ready; if the new one fails, the old one
//! keeps serving. Instances being stopped that the state no longer depends
//! on (an old generation, a new one that failed) are `retiring`: they get
//! no forwarded signals, are killed at their stop_timeout, and tend waits
//! for them before it exits.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::config::{Config, Restart, RestartMode};
use crate::core::protocol::{ExitStatus, Notification, ServiceId, SpawnFailure, WatchId};
use crate::core::status::{InstanceStatus, WatchResult};

/// The first delay before a restart after the service exited on its own.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Restart delays double up to this.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A service that ran this long before it exited starts again from the
/// initial delay.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);
/// ready_check runs again after a failure, backing off up to this.
const READY_CHECK_MAX: Duration = Duration::from_secs(1);
const READY_CHECK_INITIAL: Duration = Duration::from_millis(100);

/// What the core needs to know of one `[service]`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub name: String,
    pub argv: Vec<String>,
    pub stop_signal: Signal,
    pub stop_timeout: Duration,
    pub restart: Restart,
    pub process_group: bool,
    /// The service reports readiness with sd_notify (READY=1, RELOADING=1).
    pub notify: bool,
    /// Without notify: the service is ready once this exits 0.
    pub ready_check: Option<Vec<String>>,
    /// A start (or, with notify or ready_check, a signal reload) not ready by
    /// then has failed.
    pub ready_timeout: Duration,
    /// `restart_mode = "overlap"`: a restart starts the new instance first.
    pub overlap: bool,
    /// Services that must be ready before this one starts.
    pub after: Vec<ServiceId>,
    /// Runs once to completion: exit 0 counts as ready and done.
    pub oneshot: bool,
    /// Its end for good ends the container.
    pub required: bool,
    /// With notify: a signal reload is applied only at RELOADING=1 then
    /// READY=1 (Type=notify-reload), not once the signal is sent.
    pub reload_notify: bool,
}

impl Settings {
    /// Service `i` of `config`, named `name`, running `argv` (its command,
    /// or the one given after `--`).
    pub fn from_config(config: &Config, i: usize, name: String, argv: Vec<String>) -> Settings {
        let s = &config.services[i];
        Settings {
            name,
            argv,
            stop_signal: s.stop_signal,
            stop_timeout: s.stop_timeout,
            restart: s.restart,
            process_group: s.process_group,
            notify: s.notify,
            ready_check: s.ready_check.clone(),
            ready_timeout: s.ready_timeout,
            overlap: s.restart_mode == RestartMode::Overlap,
            after: s.after.iter().map(|&j| ServiceId(j)).collect(),
            oneshot: s.oneshot,
            required: s.required,
            reload_notify: s.reload_notify,
        }
    }

    /// Whether an instance must say it is ready, rather than being ready as
    /// soon as it runs.
    pub fn gated(&self) -> bool {
        self.notify || self.ready_check.is_some()
    }

    /// Whether a signal reload is applied only once the service confirms
    /// it: with ready_check (it passes again), or with notify and
    /// `reload_notify` (RELOADING=1 then READY=1).
    pub fn confirms_reloads(&self) -> bool {
        self.ready_check.is_some() || (self.notify && self.reload_notify)
    }
}

/// Every state a service can be in.
#[derive(Debug, Clone)]
enum State {
    /// Not running: it starts once the core lets it (its watches' config
    /// passed its check). Also before the first start.
    Down,
    /// It exited on its own; the restart policy starts it again then.
    BackingOff { until: Instant },
    /// An instance runs (not necessarily ready yet).
    Running(Instance),
    /// An overlap restart: the new instance starts next to the old one,
    /// which keeps serving (and gets forwarded signals) until the new one is
    /// ready.
    Overlapping { old: Instance, new: Instance },
    /// Sent its stop signal; SIGKILL at `kill`'s time. What follows once it
    /// is gone is `then`.
    Stopping {
        inst: Instance,
        kill: Kill,
        then: Then,
    },
    /// A oneshot that exited 0: ready, and done.
    Done,
    /// Gone for good: its restart policy is done with it, or tend stopped it.
    Ended(ExitStatus),
}

/// What follows a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// A stop-start restart: it starts again on the new config.
    Restart,
    /// It did not become ready within ready_timeout: a failed start, which
    /// the restart policy handles.
    NotReady,
    /// tend stops.
    End,
}

/// When SIGKILL follows the stop signal, and whether it was sent.
#[derive(Debug, Clone, Copy)]
struct Kill {
    at: Instant,
    sent: bool,
}

impl Kill {
    /// Its time has come and it was not sent yet: it is marked sent now.
    fn due(&mut self, now: Instant) -> bool {
        if !self.sent && now >= self.at {
            self.sent = true;
            return true;
        }
        false
    }

    fn deadline(&self) -> Option<Instant> {
        (!self.sent).then_some(self.at)
    }
}

/// A service process.
#[derive(Debug, Clone)]
struct Instance {
    pid: Pid,
    since: Instant,
    readiness: Readiness,
    /// A signal reload it must confirm (notify: RELOADING=1 then READY=1;
    /// ready_check: the check passes again).
    reload: Option<Reload>,
    /// Its ready_check, with `ready_check`.
    probe: Probe,
    /// Its last STATUS= (with notify).
    status: Option<String>,
    /// Something came on NOTIFY_SOCKET from its process tree.
    heard: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    /// Not ready yet: its start has failed if it is not ready by then (a
    /// oneshot has no such time: it may take long).
    Pending {
        by: Option<Instant>,
    },
    Ready,
    /// It said RELOADING=1 on its own account: not ready until READY=1,
    /// which must come by then.
    Reloading {
        by: Instant,
    },
    /// It said STOPPING=1.
    Unready,
}

#[derive(Debug, Clone)]
struct Reload {
    watches: Vec<WatchId>,
    by: Instant,
    seen_reloading: bool,
}

/// When ready_check runs for an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Off,
    Due { at: Instant, delay: Duration },
    Running { delay: Duration },
}

/// A process of the service that tend is stopping, which the state no
/// longer depends on.
#[derive(Debug, Clone, Copy)]
struct Retiring {
    pid: Pid,
    kill: Kill,
}

/// What happened that concerns one service.
#[derive(Debug)]
pub enum Input {
    /// It may start now: its watches' config passed.
    Start,
    /// The spawn it asked for came back.
    Spawned {
        overlap: bool,
        result: Result<Pid, SpawnFailure>,
    },
    /// One of its processes exited.
    Exited { pid: Pid, status: ExitStatus },
    /// One of its current instances (or a process under it) said this.
    Notified { pid: Pid, message: Notification },
    /// Its ready_check for instance `pid` ended, or could not run.
    Probed { pid: Pid, passed: bool },
    /// Restart it on the new config of these watches.
    Restart,
    /// Start it again at once (`tend restart`): from a back-off, after a
    /// oneshot finished, or after it ended for good. It goes down and starts
    /// as any start does.
    StartAgain,
    /// Send these signals to it (a signal reload); with `confirm`, the
    /// watches are applied once it confirms the reload.
    Reload {
        signals: Vec<Signal>,
        watches: Vec<WatchId>,
        confirm: bool,
    },
    /// tend stops: stop it now.
    Stop,
    /// Time passed.
    Tick,
}

/// What a service asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    /// Start an instance; with `overlap`, next to the one that runs.
    Spawn { overlap: bool },
    /// Run ready_check for instance `pid`.
    Probe { pid: Pid, timeout: Duration },
    /// `kill(pid, signo)`, or to its process group.
    Signal { pid: Pid, group: bool, signo: i32 },
    /// SIGCONT, if it (or one of its group) is stopped.
    ContinueIfStopped { pid: Pid, group: bool },
    /// An instance started: it reads the newest checked content.
    Started,
    /// A restart ended: the watches acting on it are applied (or not),
    /// all but those in `except` (a reload still to be confirmed).
    Restarted { ok: bool, except: Vec<WatchId> },
    /// A signal reload of these watches was confirmed, or not in time.
    Confirmed { watches: Vec<WatchId>, ok: bool },
    /// It exited (`why`) while a change could have been verified.
    Exited { why: String },
    /// It is down and waits for checked config before it starts again.
    Down,
    /// It is gone for good, with this status.
    Ended(ExitStatus),
}

/// What [`Service::handle`] needs besides the input.
pub struct Cx<'a> {
    pub now: Instant,
    /// tend stops: a process that exits is not started again.
    pub stopping: bool,
    /// The first of its watches whose config it cannot start on yet, and
    /// why (for the log).
    pub gate: Option<(&'a str, WatchResult)>,
    /// Every watch's name, by id (for the log).
    pub names: &'a [String],
    /// Its name, for its log lines when there are several services.
    pub tag: Option<&'a str>,
    pub out: &'a mut Vec<Output>,
}

/// Which of its processes a pid is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// One it does not stop (it may get signals, its notifications count).
    Current,
    /// One tend is stopping.
    Stopping,
}

/// What a service is doing, as the status and its watches see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Down: before its first start (`first`), or waiting for checked config.
    Down {
        first: bool,
    },
    BackingOff,
    /// An instance runs; `ready` says whether it said so.
    Running {
        ready: bool,
    },
    /// An instance runs and said RELOADING=1: not ready until READY=1.
    Reloading,
    /// An overlap restart.
    Overlapping,
    /// A stop-start restart.
    Restarting,
    /// Stopped because it did not become ready in time.
    Failing,
    /// tend stops it.
    Stopping,
    /// A oneshot that finished.
    Done,
    /// Gone for good, with this status.
    Ended(ExitStatus),
}

pub struct Service {
    pub id: ServiceId,
    pub cfg: Settings,
    state: State,
    retiring: Vec<Retiring>,
    /// A spawn is on its way: nothing else starts in its place.
    spawning: bool,
    started_once: bool,
    /// Starts after the first.
    restarts: u32,
    backoff: Duration,
    /// How its last instance ended.
    last_exit: Option<ExitStatus>,
}

impl Service {
    pub fn new(id: ServiceId, cfg: Settings) -> Service {
        Service {
            id,
            cfg,
            state: State::Down,
            retiring: Vec::new(),
            spawning: false,
            started_once: false,
            restarts: 0,
            backoff: BACKOFF_INITIAL,
            last_exit: None,
        }
    }

    /// How its last instance ended, if one did.
    pub fn last_exit(&self) -> Option<ExitStatus> {
        self.last_exit
    }

    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Takes what happened to this service; what to do goes to `cx.out`.
    pub fn handle(&mut self, input: Input, cx: &mut Cx<'_>) {
        match input {
            Input::Start => {
                if matches!(self.state, State::Down) && !self.spawning {
                    self.spawning = true;
                    cx.out.push(Output::Spawn { overlap: false });
                }
            }
            Input::Spawned { overlap, result } => {
                self.spawning = false;
                self.on_spawned(overlap, result, cx);
            }
            Input::Exited { pid, status } => self.on_exit(pid, status, cx),
            Input::Notified { pid, message } => self.on_notify(pid, message, cx),
            Input::Probed { pid, passed } => self.on_probed(pid, passed, cx),
            Input::Restart => self.restart(cx),
            Input::StartAgain => {
                if matches!(
                    self.state,
                    State::BackingOff { .. } | State::Done | State::Ended(_)
                ) {
                    self.state = State::Down;
                }
            }
            Input::Reload {
                signals,
                watches,
                confirm,
            } => self.reload(signals, watches, confirm, cx),
            Input::Stop => self.stop_for_good(cx),
            Input::Tick => self.on_time(cx),
        }
    }

    // ------------------------------------------------------------ starts

    fn on_spawned(&mut self, overlap: bool, result: Result<Pid, SpawnFailure>, cx: &mut Cx<'_>) {
        let now = cx.now;
        match result {
            Ok(pid) => {
                if self.started_once {
                    self.restarts += 1;
                }
                self.started_once = true;
                tracing::info!(service = cx.tag,
pid = pid.as_raw(), command = ?self.cfg.argv, "service started");
                let gated = self.cfg.gated();
                let new = Instance {
                    pid,
                    since: now,
                    readiness: if self.cfg.oneshot {
                        Readiness::Pending { by: None }
                    } else if gated {
                        Readiness::Pending {
                            by: Some(now + self.cfg.ready_timeout),
                        }
                    } else {
                        Readiness::Ready
                    },
                    reload: None,
                    probe: self.probe_now(now),
                    status: None,
                    heard: false,
                };
                match std::mem::replace(&mut self.state, State::Down) {
                    State::Running(old) if overlap => {
                        let ready = new.readiness == Readiness::Ready;
                        self.state = State::Overlapping { old, new };
                        if ready {
                            self.on_ready(pid, cx);
                        }
                    }
                    other => {
                        self.state = other;
                        cx.out.push(Output::Started);
                        self.state = State::Running(new);
                    }
                }
            }
            Err(e) if overlap => {
                tracing::error!(
                    service = cx.tag,
                    "{}: the old instance keeps serving",
                    e.message
                );
                self.restarted(false, cx);
            }
            Err(e) => {
                tracing::error!(service = cx.tag, "{}", e.message);
                let status = ExitStatus::Code(e.exit_code);
                if !std::mem::replace(&mut self.started_once, true) {
                    // Nothing ran yet: it ends with the shell's status,
                    // whatever the restart policy.
                    self.end(status, cx);
                } else {
                    self.after_unplanned_exit(status, true, Duration::ZERO, None, cx);
                }
            }
        }
    }

    /// A ready_check schedule that starts at once, with ready_check.
    fn probe_now(&self, now: Instant) -> Probe {
        if self.cfg.ready_check.is_some() {
            Probe::Due {
                at: now,
                delay: READY_CHECK_INITIAL,
            }
        } else {
            Probe::Off
        }
    }

    fn end(&mut self, status: ExitStatus, cx: &mut Cx<'_>) {
        self.state = State::Ended(status);
        cx.out.push(Output::Ended(status));
    }

    // ------------------------------------------------------------ exits

    fn on_exit(&mut self, pid: Pid, status: ExitStatus, cx: &mut Cx<'_>) {
        if let Some(at) = self.retiring.iter().position(|r| r.pid == pid) {
            self.retiring.swap_remove(at);
            tracing::info!(
                service = cx.tag,
                pid = pid.as_raw(),
                "previous instance stopped: {status}"
            );
            return;
        }
        let now = cx.now;
        self.last_exit = Some(status);
        match std::mem::replace(&mut self.state, State::Down) {
            State::Stopping { inst, then, .. } if inst.pid == pid => match then {
                Then::Restart => {
                    tracing::info!(
                        service = cx.tag,
                        pid = pid.as_raw(),
                        "service stopped: {status}"
                    );
                    self.restarted(true, cx);
                    self.state = State::Down;
                    cx.out.push(Output::Down);
                }
                Then::End => {
                    tracing::info!(
                        service = cx.tag,
                        pid = pid.as_raw(),
                        "service stopped: {status}"
                    );
                    self.state = State::Ended(status);
                }
                Then::NotReady => {
                    // Stopped by tend because it never became ready: a
                    // failure, whatever its exit code.
                    cx.out.push(Output::Exited {
                        why: format!(
                            "the service did not become ready within {:?}",
                            self.cfg.ready_timeout
                        ),
                    });
                    let uptime = now.saturating_duration_since(inst.since);
                    self.after_unplanned_exit(status, true, uptime, Some(pid), cx);
                }
            },
            State::Running(inst) if inst.pid == pid && self.cfg.oneshot && status.success() => {
                let took = now.saturating_duration_since(inst.since);
                tracing::info!(
                    service = self.cfg.name,
                    pid = pid.as_raw(),
                    "oneshot finished after {took:.1?}: {status}"
                );
                self.state = State::Done;
            }
            State::Running(inst) if inst.pid == pid => {
                cx.out.push(Output::Exited {
                    why: format!("the service exited while the change was verified ({status})"),
                });
                if let Some(r) = inst.reload {
                    // Its watches stay acting: the next start reads their
                    // config.
                    drop(r);
                }
                let uptime = now.saturating_duration_since(inst.since);
                self.after_unplanned_exit(status, false, uptime, Some(pid), cx);
            }
            State::Overlapping { old, new } if new.pid == pid => {
                tracing::warn!(
                    service = cx.tag,
                    pid = pid.as_raw(),
                    "the new instance exited before it was ready ({status}): the old one keeps serving"
                );
                self.state = State::Running(old);
                self.restarted(false, cx);
            }
            State::Overlapping { old, new } if old.pid == pid => {
                tracing::warn!(
                    service = cx.tag,
                    pid = old.pid.as_raw(),
                    "the old instance exited during the restart ({status}): the new one takes over"
                );
                self.state = State::Running(new);
                self.restarted(true, cx);
                cx.out.push(Output::Started);
            }
            other => self.state = other,
        }
    }

    /// It exited (or could not start) without tend asking: the restart
    /// policy decides what happens.
    fn after_unplanned_exit(
        &mut self,
        status: ExitStatus,
        failed: bool,
        uptime: Duration,
        pid: Option<Pid>,
        cx: &mut Cx<'_>,
    ) {
        // A start that failed has no pid (the spawn's error was logged).
        let what = match pid {
            Some(_) => format!("service exited: {status}, after {uptime:.1?}"),
            None => "the service could not start".to_string(),
        };
        let pid = pid.map(Pid::as_raw);
        let again = match self.cfg.restart {
            Restart::Never => false,
            Restart::OnFailure => failed || !status.success(),
            Restart::Always => true,
        };
        if !again || cx.stopping {
            tracing::info!(service = cx.tag, pid, "{what}");
            self.end(status, cx);
            return;
        }
        if uptime >= BACKOFF_RESET_AFTER {
            self.backoff = BACKOFF_INITIAL;
        }
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        let gate = match cx.gate {
            Some((watch, _)) => format!(
                "; it starts again only once the config of watch {watch:?} passes its check"
            ),
            None => String::new(),
        };
        tracing::warn!(
            service = cx.tag,
            pid,
            "{what}; restarting in {delay:?} (restart = {}){gate}",
            self.cfg.restart.as_str()
        );
        self.state = State::BackingOff {
            until: cx.now + delay,
        };
    }

    /// A restart ended: the watches acting on it are applied, or failed.
    fn restarted(&mut self, ok: bool, cx: &mut Cx<'_>) {
        let except = match &self.state {
            State::Running(i) => i.reload.iter().flat_map(|r| r.watches.clone()).collect(),
            _ => Vec::new(),
        };
        cx.out.push(Output::Restarted { ok, except });
    }

    // ------------------------------------------------------------ readiness

    fn on_notify(&mut self, pid: Pid, message: Notification, cx: &mut Cx<'_>) {
        let ready_timeout = self.cfg.ready_timeout;
        let Some(inst) = self.current_mut(pid) else {
            return;
        };
        inst.heard = true;
        if let Some(text) = message.status {
            tracing::debug!(
                service = cx.tag,
                pid = pid.as_raw(),
                status = text,
                "service status"
            );
            inst.status = Some(text);
        }
        if message.reloading {
            match &mut inst.reload {
                Some(r) => {
                    tracing::debug!(
                        service = cx.tag,
                        pid = pid.as_raw(),
                        "the service is reloading (RELOADING=1)"
                    );
                    r.seen_reloading = true;
                }
                // Type=notify: a reload the service announces takes it out
                // of readiness until its READY=1.
                None if inst.readiness == Readiness::Ready && !message.ready => {
                    tracing::info!(
                        service = cx.tag,
                        pid = pid.as_raw(),
                        "the service is reloading (RELOADING=1): not ready until it sends READY=1"
                    );
                    inst.readiness = Readiness::Reloading {
                        by: cx.now + ready_timeout,
                    };
                }
                None => {}
            }
        }
        if message.stopping {
            tracing::info!(
                service = cx.tag,
                pid = pid.as_raw(),
                "the service says it is stopping (STOPPING=1)"
            );
            if let State::Running(i) = &mut self.state
                && i.pid == pid
            {
                i.readiness = Readiness::Unready;
            }
        }
        if message.ready {
            self.on_ready(pid, cx);
        }
    }

    /// Instance `pid` said it is ready (READY=1, or ready_check passed).
    fn on_ready(&mut self, pid: Pid, cx: &mut Cx<'_>) {
        let notify = self.cfg.notify;
        if let State::Running(i) = &mut self.state
            && i.pid == pid
            && i.reload
                .as_ref()
                .is_some_and(|r| r.seen_reloading || !notify)
        {
            let r = i.reload.take().expect("checked above");
            i.probe = Probe::Off;
            tracing::info!(
                service = cx.tag,
                watch = cx.names(&r.watches),
                pid = pid.as_raw(),
                "the service confirmed the reload: config applied"
            );
            cx.out.push(Output::Confirmed {
                watches: r.watches,
                ok: true,
            });
        }
        match &mut self.state {
            State::Running(i) if i.pid == pid && i.readiness != Readiness::Ready => {
                if matches!(i.readiness, Readiness::Reloading { .. }) {
                    tracing::info!(
                        service = cx.tag,
                        pid = pid.as_raw(),
                        "the service finished its reload (READY=1)"
                    );
                } else {
                    tracing::info!(service = cx.tag, pid = pid.as_raw(), "the service is ready");
                }
                i.readiness = Readiness::Ready;
                i.probe = Probe::Off;
            }
            State::Overlapping { new, .. } if new.pid == pid => {
                let State::Overlapping { old, mut new } =
                    std::mem::replace(&mut self.state, State::Down)
                else {
                    unreachable!("matched above")
                };
                tracing::info!(
                    service = cx.tag,
                    pid = pid.as_raw(),
                    old = old.pid.as_raw(),
                    "the new instance is ready: stopping the old one"
                );
                new.readiness = Readiness::Ready;
                new.probe = Probe::Off;
                self.retire(old.pid, cx);
                self.state = State::Running(new);
                self.restarted(true, cx);
            }
            _ => {}
        }
    }

    fn on_probed(&mut self, pid: Pid, passed: bool, cx: &mut Cx<'_>) {
        let now = cx.now;
        let Some(inst) = self.current_mut(pid) else {
            return;
        };
        let Probe::Running { delay } = inst.probe else {
            return;
        };
        if passed {
            inst.probe = Probe::Off;
            self.on_ready(pid, cx);
            return;
        }
        // It runs again while the instance (or a reload of it) still has
        // to become ready.
        let waiting = inst.reload.is_some() || matches!(inst.readiness, Readiness::Pending { .. });
        inst.probe = if waiting {
            Probe::Due {
                at: now + delay,
                delay: (delay * 2).min(READY_CHECK_MAX),
            }
        } else {
            Probe::Off
        };
    }

    // ------------------------------------------------------------ actions

    fn restart(&mut self, cx: &mut Cx<'_>) {
        let State::Running(inst) = &self.state else {
            return;
        };
        if self.cfg.overlap {
            if !self.spawning {
                self.spawning = true;
                cx.out.push(Output::Spawn { overlap: true });
            }
            return;
        }
        let pid = inst.pid;
        let State::Running(inst) = std::mem::replace(&mut self.state, State::Down) else {
            unreachable!("matched above")
        };
        let kill = self.send_stop(pid, cx);
        self.state = State::Stopping {
            inst,
            kill,
            then: Then::Restart,
        };
    }

    fn reload(
        &mut self,
        signals: Vec<Signal>,
        watches: Vec<WatchId>,
        confirm: bool,
        cx: &mut Cx<'_>,
    ) {
        let now = cx.now;
        let group = self.cfg.process_group;
        let (ready_timeout, probe) = (self.cfg.ready_timeout, self.probe_now(now));
        let State::Running(inst) = &mut self.state else {
            return;
        };
        for sig in signals {
            cx.out.push(Output::Signal {
                pid: inst.pid,
                group,
                signo: sig as i32,
            });
            if confirm {
                tracing::info!(
                    service = cx.tag,
                    watch = cx.names(&watches),
                    pid = inst.pid.as_raw(),
                    "sent {sig} to the service: waiting for it to confirm the reload"
                );
            } else {
                tracing::info!(
                    service = cx.tag,
                    watch = cx.names(&watches),
                    pid = inst.pid.as_raw(),
                    "sent {sig} to the service: config applied"
                );
            }
        }
        if confirm {
            inst.reload = Some(Reload {
                watches,
                by: now + ready_timeout,
                seen_reloading: false,
            });
            inst.probe = probe;
        }
    }

    /// Whether a signal reload of the running instance waits for its
    /// confirmation.
    pub fn confirming(&self) -> bool {
        matches!(&self.state, State::Running(i) if i.reload.is_some())
    }

    // ------------------------------------------------------------ stops

    /// Sends the stop signal: then SIGCONT if the service is stopped (a
    /// stopped process cannot act on its stop signal), and SIGKILL after
    /// stop_timeout.
    fn send_stop(&self, pid: Pid, cx: &mut Cx<'_>) -> Kill {
        let sig = self.cfg.stop_signal;
        tracing::info!(
            service = cx.tag,
            pid = pid.as_raw(),
            "stopping the service: {sig}, then SIGKILL after {:?}",
            self.cfg.stop_timeout
        );
        let group = self.cfg.process_group;
        cx.out.push(Output::Signal {
            pid,
            group,
            signo: sig as i32,
        });
        if !matches!(sig, Signal::SIGCONT | Signal::SIGKILL) {
            cx.out.push(Output::ContinueIfStopped { pid, group });
        }
        Kill {
            at: cx.now + self.cfg.stop_timeout,
            sent: false,
        }
    }

    /// Stops `pid` and keeps it among the retiring until it is gone.
    fn retire(&mut self, pid: Pid, cx: &mut Cx<'_>) {
        let kill = self.send_stop(pid, cx);
        self.retiring.push(Retiring { pid, kill });
    }

    /// tend stops: every process of the service gets its stop signal (once).
    fn stop_for_good(&mut self, cx: &mut Cx<'_>) {
        match std::mem::replace(&mut self.state, State::Down) {
            State::Running(inst) => {
                let kill = self.send_stop(inst.pid, cx);
                self.state = State::Stopping {
                    inst,
                    kill,
                    then: Then::End,
                };
            }
            State::Overlapping { old, new } => {
                let kill = self.send_stop(old.pid, cx);
                self.retire(new.pid, cx);
                self.state = State::Stopping {
                    inst: old,
                    kill,
                    then: Then::End,
                };
            }
            State::Stopping { inst, kill, .. } => {
                self.state = State::Stopping {
                    inst,
                    kill,
                    then: Then::End,
                };
            }
            // Down or backing off: it is not started again.
            State::BackingOff { .. } => self.state = State::Down,
            other => self.state = other,
        }
    }

    // ------------------------------------------------------------ time

    fn on_time(&mut self, cx: &mut Cx<'_>) {
        let now = cx.now;
        let overdue: Vec<Pid> = self
            .retiring
            .iter_mut()
            .filter_map(|r| r.kill.due(now).then_some(r.pid))
            .collect();
        for pid in overdue {
            self.kill_overdue(pid, cx);
        }
        let ready_timeout = self.cfg.ready_timeout;
        match &mut self.state {
            State::Stopping { inst, kill, .. } if kill.deadline().is_some_and(|at| now >= at) => {
                kill.sent = true;
                let pid = inst.pid;
                self.kill_overdue(pid, cx);
            }
            State::Running(inst) => {
                if let Some(r) = &inst.reload
                    && now >= r.by
                {
                    let r = inst.reload.take().expect("checked above");
                    inst.probe = Probe::Off;
                    tracing::warn!(
                        service = cx.tag,
                        watch = cx.names(&r.watches),
                        pid = inst.pid.as_raw(),
                        "the service did not confirm the reload within {ready_timeout:?} ({}): the action failed",
                        if self.cfg.notify {
                            "RELOADING=1, then READY=1"
                        } else {
                            "ready_check"
                        }
                    );
                    cx.out.push(Output::Confirmed {
                        watches: r.watches,
                        ok: false,
                    });
                }
                let overdue = match inst.readiness {
                    Readiness::Pending { by: Some(by) } if now >= by => {
                        Some("the service did not become ready within")
                    }
                    Readiness::Reloading { by } if now >= by => {
                        Some("the service sent RELOADING=1 but no READY=1 within")
                    }
                    _ => None,
                };
                if let Some(what) = overdue {
                    tracing::error!(
                        service = cx.tag,
                        pid = inst.pid.as_raw(),
                        "{what} {ready_timeout:?}{}: stopping it",
                        last_heard(inst, self.cfg.notify)
                    );
                    let State::Running(mut inst) = std::mem::replace(&mut self.state, State::Down)
                    else {
                        unreachable!("matched above")
                    };
                    inst.probe = Probe::Off;
                    let kill = self.send_stop(inst.pid, cx);
                    self.state = State::Stopping {
                        inst,
                        kill,
                        then: Then::NotReady,
                    };
                }
            }
            State::Overlapping { new, .. } if matches!(new.readiness, Readiness::Pending { by: Some(by) } if now >= by) =>
            {
                let State::Overlapping { old, new } =
                    std::mem::replace(&mut self.state, State::Down)
                else {
                    unreachable!("matched above")
                };
                tracing::error!(
                    service = cx.tag,
                    pid = new.pid.as_raw(),
                    "the new instance did not become ready within {ready_timeout:?}{}: it is stopped and the old one keeps serving",
                    last_heard(&new, self.cfg.notify)
                );
                self.retire(new.pid, cx);
                self.state = State::Running(old);
                self.restarted(false, cx);
            }
            State::BackingOff { until } if now >= *until => {
                self.state = State::Down;
                cx.out.push(Output::Down);
            }
            _ => {}
        }
        // ready_check runs when due.
        let timeout = self.cfg.ready_timeout;
        for inst in self.instances_mut() {
            if let Probe::Due { at, delay } = inst.probe
                && at <= now
            {
                inst.probe = Probe::Running { delay };
                cx.out.push(Output::Probe {
                    pid: inst.pid,
                    timeout,
                });
            }
        }
    }

    /// SIGKILL for a process that outlived its stop_timeout.
    fn kill_overdue(&self, pid: Pid, cx: &mut Cx<'_>) {
        tracing::warn!(
            service = cx.tag,
            pid = pid.as_raw(),
            "the service is still running {:?} after {}: sending SIGKILL",
            self.cfg.stop_timeout,
            self.cfg.stop_signal
        );
        cx.out.push(Output::Signal {
            pid,
            group: self.cfg.process_group,
            signo: Signal::SIGKILL as i32,
        });
    }

    /// The next time something of this service is due.
    pub fn deadline(&self) -> Option<Instant> {
        let mut at: Vec<Instant> = self
            .retiring
            .iter()
            .filter_map(|r| r.kill.deadline())
            .collect();
        match &self.state {
            State::Stopping { kill, .. } => at.extend(kill.deadline()),
            State::Running(i) => {
                match i.readiness {
                    Readiness::Pending { by: Some(by) } | Readiness::Reloading { by } => {
                        at.push(by)
                    }
                    _ => {}
                }
                at.extend(i.reload.as_ref().map(|r| r.by));
            }
            State::Overlapping { new, .. } => {
                if let Readiness::Pending { by: Some(by) } = new.readiness {
                    at.push(by);
                }
            }
            State::BackingOff { until } => at.push(*until),
            _ => {}
        }
        at.extend(self.instances().filter_map(|i| match i.probe {
            Probe::Due { at, .. } => Some(at),
            _ => None,
        }));
        at.into_iter().min()
    }

    // ------------------------------------------------------------ what it says

    fn instances(&self) -> impl Iterator<Item = &Instance> {
        let (a, b) = match &self.state {
            State::Running(i) => (Some(i), None),
            State::Overlapping { old, new } => (Some(old), Some(new)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }

    fn instances_mut(&mut self) -> impl Iterator<Item = &mut Instance> {
        let (a, b) = match &mut self.state {
            State::Running(i) => (Some(i), None),
            State::Overlapping { old, new } => (Some(old), Some(new)),
            _ => (None, None),
        };
        a.into_iter().chain(b)
    }

    /// The instance `pid`, when it is one tend does not stop.
    fn current_mut(&mut self, pid: Pid) -> Option<&mut Instance> {
        self.instances_mut().find(|i| i.pid == pid)
    }

    /// Whether `pid` is one of its processes, and which kind.
    pub fn owns(&self, pid: Pid) -> Option<Owned> {
        if self.instances().any(|i| i.pid == pid) {
            return Some(Owned::Current);
        }
        let stopping = matches!(&self.state, State::Stopping { inst, .. } if inst.pid == pid)
            || self.retiring.iter().any(|r| r.pid == pid);
        stopping.then_some(Owned::Stopping)
    }

    /// The process that gets forwarded signals: the generation that serves,
    /// also while tend stops it.
    pub fn serving_pid(&self) -> Option<Pid> {
        match &self.state {
            State::Running(i) | State::Overlapping { old: i, .. } => Some(i.pid),
            State::Stopping { inst, .. } => Some(inst.pid),
            _ => None,
        }
    }

    /// Whether it has no process left.
    pub fn gone(&self) -> bool {
        self.retiring.is_empty()
            && !self.spawning
            && matches!(
                self.state,
                State::Down | State::BackingOff { .. } | State::Done | State::Ended(_)
            )
    }

    /// Whether its serving instance is ready (a oneshot: it exited 0).
    pub fn ready(&self) -> bool {
        match &self.state {
            State::Running(i) | State::Overlapping { old: i, .. } => {
                i.readiness == Readiness::Ready
            }
            State::Done => true,
            _ => false,
        }
    }

    /// Its status once it ended for good.
    pub fn ended(&self) -> Option<ExitStatus> {
        match self.state {
            State::Ended(status) => Some(status),
            _ => None,
        }
    }

    pub fn stage(&self) -> Stage {
        match &self.state {
            State::Down => Stage::Down {
                first: !self.started_once,
            },
            State::BackingOff { .. } => Stage::BackingOff,
            State::Running(i) if matches!(i.readiness, Readiness::Reloading { .. }) => {
                Stage::Reloading
            }
            State::Running(i) => Stage::Running {
                ready: i.readiness == Readiness::Ready,
            },
            State::Overlapping { .. } => Stage::Overlapping,
            State::Stopping { then, .. } => match then {
                Then::Restart => Stage::Restarting,
                Then::NotReady => Stage::Failing,
                Then::End => Stage::Stopping,
            },
            State::Done => Stage::Done,
            State::Ended(status) => Stage::Ended(*status),
        }
    }

    /// What tend last heard on NOTIFY_SOCKET from instance `pid`, for the
    /// line that says it was not ready in time (nothing without notify).
    pub fn last_heard(&self, pid: Pid) -> String {
        let inst = self
            .instances()
            .find(|i| i.pid == pid)
            .or(match &self.state {
                State::Stopping { inst, .. } if inst.pid == pid => Some(inst),
                _ => None,
            });
        match inst {
            Some(i) => last_heard(i, self.cfg.notify),
            None if self.cfg.notify => NOTHING_HEARD.to_string(),
            None => String::new(),
        }
    }

    /// The last STATUS= of the serving instance.
    pub fn status_text(&self) -> Option<String> {
        match &self.state {
            State::Running(i) | State::Overlapping { old: i, .. } => i.status.clone(),
            State::Stopping { inst, .. } => inst.status.clone(),
            _ => None,
        }
    }

    /// Every process of the service, as the status file lists them.
    pub fn instance_statuses(&self) -> Vec<InstanceStatus> {
        let status = |i: &Instance, state: &str| InstanceStatus {
            pid: i.pid.as_raw(),
            state: state.to_string(),
            ready: i.readiness == Readiness::Ready,
        };
        let mut out = Vec::new();
        match &self.state {
            State::Running(i) => out.push(status(i, "serving")),
            State::Overlapping { old, new } => {
                out.push(status(old, "serving"));
                out.push(status(new, "starting"));
            }
            State::Stopping { inst, .. } => out.push(status(inst, "stopping")),
            _ => {}
        }
        out.extend(self.retiring.iter().map(|r| InstanceStatus {
            pid: r.pid.as_raw(),
            state: "stopping".to_string(),
            ready: false,
        }));
        out
    }
}

const NOTHING_HEARD: &str = " (nothing was received on NOTIFY_SOCKET from it)";

/// What tend last heard from `inst`, as the end of a log line.
fn last_heard(inst: &Instance, notify: bool) -> String {
    if !notify {
        return String::new();
    }
    match &inst.status {
        Some(status) => format!(" (last heard: STATUS={})", crate::text::summary(status)),
        None if inst.heard => " (it sent notifications, none with READY=1 or STATUS=)".into(),
        None => NOTHING_HEARD.into(),
    }
}

impl Cx<'_> {
    /// Watch names for the log.
    fn names(&self, ids: &[WatchId]) -> String {
        ids.iter()
            .map(|id| self.names[id.0].as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
