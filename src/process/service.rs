//! The service: the one long-running process tend exists for.
//!
//! `Service` owns the process and is the only code that changes its state.
//! The supervisor tells it what to do (start, signal, stop, exited) and asks it
//! what is due (its deadline); it never holds the service's pid itself, so a
//! pid is never signalled after the reaper has handed back its status.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::ExitStatus;
use super::spawn::{self, Output, SpawnError, Spec};
use crate::config::{self, Restart};
use crate::signals;

/// The first delay before a restart after the service exited on its own.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Delays double up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A service that ran this long before it exited starts again from the
/// initial delay.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not started yet (tend waits for a valid config).
    NotStarted,
    Running {
        pid: Pid,
        since: Instant,
    },
    /// Sent its stop signal; SIGKILL at `kill_at` unless it exits first.
    Stopping {
        pid: Pid,
        since: Instant,
        kill_at: Instant,
        killed: bool,
    },
    /// Exited on its own; starts again at `until`.
    BackingOff {
        until: Instant,
    },
    /// Exited, and will not be started again by the restart policy.
    Exited(ExitStatus),
}

/// What the supervisor should do after the service exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// The restart policy starts it again later (the service is `BackingOff`).
    Restarting,
    /// The restart policy is done with it: tend should end with this status.
    Finished(ExitStatus),
}

pub struct Service {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    working_dir: Option<PathBuf>,
    stop_signal: Signal,
    stop_timeout: Duration,
    restart: Restart,
    process_group: bool,
    take_terminal: bool,
    state: State,
    /// How many times the service was started again, for any reason.
    restarts: u32,
    started_once: bool,
    backoff: Duration,
}

impl Service {
    pub fn new(cfg: &config::Service, argv: Vec<String>, take_terminal: bool) -> Service {
        Service {
            argv,
            env: cfg.env.clone(),
            working_dir: cfg.working_dir.clone(),
            stop_signal: cfg.stop_signal,
            stop_timeout: cfg.stop_timeout,
            restart: cfg.restart,
            process_group: cfg.process_group,
            take_terminal,
            state: State::NotStarted,
            restarts: 0,
            started_once: false,
            backoff: BACKOFF_INITIAL,
        }
    }

    /// Running, and not being stopped.
    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    /// How many times the service was started again, for any reason.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// The pid while the process exists (running or stopping).
    pub fn pid(&self) -> Option<Pid> {
        match self.state {
            State::Running { pid, .. } | State::Stopping { pid, .. } => Some(pid),
            _ => None,
        }
    }

    /// Starts the process. A failure leaves the state unchanged.
    pub fn start(&mut self, now: Instant) -> Result<Pid, SpawnError> {
        let pid = spawn::spawn(Spec {
            argv: &self.argv,
            env: &self.env,
            working_dir: self.working_dir.as_deref(),
            take_terminal: self.take_terminal,
            output: Output::Inherit,
        })?;
        if self.started_once {
            self.restarts += 1;
        }
        self.started_once = true;
        self.state = State::Running { pid, since: now };
        tracing::info!(pid = pid.as_raw(), command = ?self.argv, "service started");
        Ok(pid)
    }

    /// Sends `sig` to the service (its group with `process_group = true`).
    /// Returns false when there is no process to send it to.
    pub fn signal(&self, sig: Signal) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        self.send(pid, sig);
        true
    }

    /// Sends signal number `signo` to the service, as [`Service::signal`]
    /// does; realtime signals too, which nix's `Signal` cannot name.
    pub fn signal_number(&self, signo: i32) -> bool {
        let Some(pid) = self.pid() else {
            return false;
        };
        self.send_number(pid, signo);
        true
    }

    fn send(&self, pid: Pid, sig: Signal) {
        self.send_number(pid, sig as i32);
    }

    fn send_number(&self, pid: Pid, signo: i32) {
        let target = if self.process_group {
            -pid.as_raw()
        } else {
            pid.as_raw()
        };
        // SAFETY: kill(2) takes two integers and touches no memory.
        if unsafe { libc::kill(target, signo) } != 0 {
            let e = nix::errno::Errno::last();
            // ESRCH: it exited and is not reaped yet; its SIGCHLD is on the way.
            if e != nix::errno::Errno::ESRCH {
                let sig = signals::describe(signo);
                tracing::warn!(pid = pid.as_raw(), "kill({target}, {sig}) failed: {e}");
            }
        }
    }

    /// Begins a graceful stop: stop_signal now, SIGKILL after stop_timeout.
    /// Returns false when no process was running (nothing to wait for).
    pub fn stop(&mut self, now: Instant) -> bool {
        match self.state {
            State::Running { pid, since } => {
                tracing::info!(
                    pid = pid.as_raw(),
                    "stopping the service: {}, then SIGKILL after {:?}",
                    self.stop_signal,
                    self.stop_timeout
                );
                self.send(pid, self.stop_signal);
                self.state = State::Stopping {
                    pid,
                    since,
                    kill_at: now + self.stop_timeout,
                    killed: false,
                };
                true
            }
            State::Stopping { .. } => true,
            // Nothing runs; a pending restart stays pending (a restart action
            // during a back-off is served by the start that ends it).
            State::BackingOff { .. } | State::NotStarted | State::Exited(_) => false,
        }
    }

    /// tend is stopping: a restart the back-off was waiting for will not happen.
    pub fn cancel_restart(&mut self) {
        if let State::BackingOff { .. } = self.state {
            self.state = State::NotStarted;
        }
    }

    /// When the service next needs attention: a SIGKILL or a restart.
    pub fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Stopping {
                kill_at,
                killed: false,
                ..
            } => Some(kill_at),
            State::BackingOff { until } => Some(until),
            _ => None,
        }
    }

    /// Acts on a deadline that has passed. Returns true when a back-off ended
    /// and the service is due to start.
    pub fn on_deadline(&mut self, now: Instant) -> bool {
        match self.state {
            State::Stopping {
                pid,
                since,
                kill_at,
                killed: false,
            } if now >= kill_at => {
                tracing::warn!(
                    pid = pid.as_raw(),
                    "the service is still running {:?} after {}: sending SIGKILL",
                    self.stop_timeout,
                    self.stop_signal
                );
                self.send(pid, Signal::SIGKILL);
                self.state = State::Stopping {
                    pid,
                    since,
                    kill_at,
                    killed: true,
                };
                false
            }
            State::BackingOff { until } => now >= until,
            _ => false,
        }
    }

    /// Routes the reaper's status; returns None when `pid` is not the service.
    /// A service that was being stopped is `Exited`; one that exited on its
    /// own follows the restart policy.
    pub fn on_exit(&mut self, pid: Pid, status: ExitStatus, now: Instant) -> Option<AfterExit> {
        let (since, stopping) = match self.state {
            State::Running { pid: p, since } if p == pid => (since, false),
            State::Stopping { pid: p, since, .. } if p == pid => (since, true),
            _ => return None,
        };
        let uptime = now.duration_since(since);
        if stopping {
            tracing::info!(pid = pid.as_raw(), "service stopped: {status}");
            self.state = State::Exited(status);
            return Some(AfterExit::Finished(status));
        }
        Some(self.after_unplanned_exit(status, uptime, now, Some(pid)))
    }

    /// A start that failed counts as an exit with the shell's status, so the
    /// restart policy applies to it as to any other failure.
    pub fn on_start_failure(&mut self, err: &SpawnError, now: Instant) -> AfterExit {
        tracing::error!("{err}");
        self.after_unplanned_exit(ExitStatus::Code(err.exit_code()), Duration::ZERO, now, None)
    }

    fn after_unplanned_exit(
        &mut self,
        status: ExitStatus,
        uptime: Duration,
        now: Instant,
        pid: Option<Pid>,
    ) -> AfterExit {
        let pid = pid.map_or(0, Pid::as_raw);
        let again = match self.restart {
            Restart::Never => false,
            Restart::OnFailure => !status.success(),
            Restart::Always => true,
        };
        if !again {
            tracing::info!(pid, "service exited: {status}, after {uptime:.1?}");
            self.state = State::Exited(status);
            return AfterExit::Finished(status);
        }
        if uptime >= BACKOFF_RESET_AFTER {
            self.backoff = BACKOFF_INITIAL;
        }
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        tracing::warn!(
            pid,
            "service exited: {status}, after {uptime:.1?}; restarting in {delay:?} (restart = {})",
            self.restart.as_str()
        );
        self.state = State::BackingOff { until: now + delay };
        AfterExit::Restarting
    }
}
