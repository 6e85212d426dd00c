//! The event loop: one `ppoll` over the signalfd (and the watcher's inotify
//! fd and the checks' output pipes), with a timeout that exists only while a
//! deadline is pending. An idle tend sleeps in `ppoll` with no timeout at all.
//!
//! Every change of tend's state happens here, in response to one of: a signal,
//! an exit status from the reaper, a deadline, or a watch event.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::signal::{Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::unistd::Pid;

use crate::config::Config;
use crate::process::service::{AfterExit, Service};
use crate::process::{ExitStatus, reaper};
use crate::signals;

/// How long processes left in the container get to die after SIGKILL before
/// tend exits anyway (the kernel kills them all when PID 1 exits).
const DRAIN_KILL_GRACE: Duration = Duration::from_secs(2);

/// Every state tend can be in, as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The service runs, or waits out its restart back-off.
    Running,
    /// tend was told to stop (SIGTERM): the service is being stopped.
    Stopping,
    /// The service is gone; as PID 1, tend stops what is left in the
    /// container: SIGTERM, then SIGKILL at `deadline`.
    Draining {
        status: ExitStatus,
        deadline: Instant,
        killed: bool,
    },
    /// tend exits with this code.
    Exited(i32),
}

pub struct Supervisor {
    phase: Phase,
    service: Service,
    signals: SignalFd,
    pid1: bool,
    stop_timeout: Duration,
}

impl Supervisor {
    pub fn new(config: &Config, argv: Vec<String>) -> anyhow::Result<Supervisor> {
        let pid1 = nix::unistd::getpid().as_raw() == 1;
        if !pid1 {
            // Orphans of the service come to tend instead of to the real init,
            // so they are reaped here (shareProcessNamespace, docker --init).
            if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
                tracing::warn!(
                    "prctl(PR_SET_CHILD_SUBREAPER) failed: {e}; orphans will not be reaped by tend"
                );
            }
        }
        let signals = SignalFd::with_flags(
            &signals::handled(),
            SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC,
        )
        .context("signalfd() failed: tend cannot receive signals")?;
        Ok(Supervisor {
            phase: Phase::Running,
            service: Service::new(&config.service, argv, owns_terminal()),
            signals,
            pid1,
            stop_timeout: config.service.stop_timeout,
        })
    }

    /// Runs until tend should exit, and returns its exit code.
    pub fn run(mut self) -> anyhow::Result<i32> {
        if let Err(e) = self.service.start(Instant::now()) {
            // The first start: nothing ran yet, so say it plainly and exit with
            // the shell's status, whatever the restart policy.
            tracing::error!("{e}");
            return Ok(e.exit_code());
        }
        loop {
            if let Phase::Exited(code) = self.phase {
                return Ok(code);
            }
            let woke = self.wait(self.deadline())?;
            if woke.signals {
                self.on_signals();
            }
            self.on_deadlines(Instant::now());
        }
    }

    // ------------------------------------------------------------ waiting

    fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Draining { deadline, .. } => Some(deadline),
            _ => self.service.deadline(),
        }
    }

    fn wait(&self, deadline: Option<Instant>) -> anyhow::Result<Woke> {
        let timeout =
            deadline.map(|d| TimeSpec::from_duration(d.saturating_duration_since(Instant::now())));
        let mut fds = [PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
        match ppoll(&mut fds, timeout, None) {
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(Woke::default()),
            Err(e) => return Err(e).context("ppoll() on the signalfd failed"),
        }
        Ok(Woke {
            signals: fds[0].any().unwrap_or(false),
        })
    }

    // ------------------------------------------------------------ signals

    fn on_signals(&mut self) {
        let mut child_exited = false;
        loop {
            let info = match self.signals.read_signal() {
                Ok(Some(info)) => info,
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("read() on the signalfd failed: {e}");
                    break;
                }
            };
            let signo = info.ssi_signo as i32;
            match Signal::try_from(signo) {
                Ok(Signal::SIGCHLD) => child_exited = true,
                Ok(Signal::SIGTERM) => self.on_sigterm(info.ssi_pid),
                _ => self.forward(signo, info.ssi_pid),
            }
        }
        if child_exited {
            self.on_child_exits();
        }
    }

    fn on_sigterm(&mut self, from: u32) {
        match self.phase {
            Phase::Running => {
                tracing::info!(from, "SIGTERM received: stopping");
                if self.service.stop(Instant::now()) {
                    self.phase = Phase::Stopping;
                } else {
                    // No service process (it is backing off): nothing to stop.
                    self.begin_drain(ExitStatus::Signal(Signal::SIGTERM as i32));
                }
            }
            Phase::Stopping | Phase::Draining { .. } | Phase::Exited(_) => {
                tracing::info!(from, "SIGTERM received again: already stopping");
            }
        }
    }

    fn forward(&mut self, signo: i32, from: u32) {
        let name = signals::describe(signo);
        let Ok(sig) = Signal::try_from(signo) else {
            return;
        };
        match self.service.pid() {
            Some(pid) if self.service.signal(sig) => {
                tracing::info!(pid = pid.as_raw(), from, "forwarded {name} to the service");
            }
            _ => tracing::info!(from, "{name} received while no service runs: dropped"),
        }
    }

    // ------------------------------------------------------------ exits

    fn on_child_exits(&mut self) {
        let reaped = reaper::reap();
        let now = Instant::now();
        for (pid, status) in reaped.exits {
            match self.service.on_exit(pid, status, now) {
                Some(after) => self.on_service_exit(after),
                None => tracing::debug!(pid = pid.as_raw(), "reaped an orphan: {status}"),
            }
        }
        if reaped.no_children
            && let Phase::Draining { status, .. } = self.phase
        {
            self.phase = Phase::Exited(status.code());
        }
    }

    fn on_service_exit(&mut self, after: AfterExit) {
        match (self.phase, after) {
            (_, AfterExit::Restarting) => {}
            (Phase::Running | Phase::Stopping, AfterExit::Finished(status)) => {
                self.begin_drain(status)
            }
            (Phase::Draining { .. } | Phase::Exited(_), AfterExit::Finished(_)) => {}
        }
    }

    /// The service is gone for good. As PID 1, tend now stops whatever is
    /// left in the container before it exits (the kernel would SIGKILL it all
    /// without warning); as a subreaper, it simply exits.
    fn begin_drain(&mut self, status: ExitStatus) {
        let code = status.code();
        if !self.pid1 {
            self.phase = Phase::Exited(code);
            return;
        }
        let reaped = reaper::reap();
        for (pid, st) in reaped.exits {
            tracing::debug!(pid = pid.as_raw(), "reaped an orphan: {st}");
        }
        if reaped.no_children {
            self.phase = Phase::Exited(code);
            return;
        }
        tracing::info!(
            "processes are still running in the container: sending them SIGTERM, SIGKILL after {:?}",
            self.stop_timeout
        );
        kill_everyone(Signal::SIGTERM);
        self.phase = Phase::Draining {
            status,
            deadline: Instant::now() + self.stop_timeout,
            killed: false,
        };
    }

    // ------------------------------------------------------------ deadlines

    fn on_deadlines(&mut self, now: Instant) {
        if self.service.on_deadline(now)
            && self.phase == Phase::Running
            && let Err(e) = self.service.start(now)
            && let AfterExit::Finished(status) = self.service.on_start_failure(&e, now)
        {
            self.begin_drain(status);
        }
        if let Phase::Draining {
            status,
            deadline,
            killed,
        } = self.phase
            && now >= deadline
        {
            if killed {
                tracing::warn!("processes are still left after SIGKILL: exiting anyway");
                self.phase = Phase::Exited(status.code());
            } else {
                tracing::warn!(
                    "processes are still running after {:?}: sending SIGKILL",
                    self.stop_timeout
                );
                kill_everyone(Signal::SIGKILL);
                self.phase = Phase::Draining {
                    status,
                    deadline: now + DRAIN_KILL_GRACE,
                    killed: true,
                };
            }
        }
    }
}

#[derive(Default)]
struct Woke {
    signals: bool,
}

/// `kill(-1, sig)`: every process in the PID namespace but tend. Only ever
/// called as PID 1, where "every process" means the container.
fn kill_everyone(sig: Signal) {
    if let Err(e) = kill(Pid::from_raw(-1), sig)
        && e != Errno::ESRCH
    {
        tracing::error!("kill(-1, {sig}) failed: {e}");
    }
}

/// Whether tend's process group is the foreground of the terminal on its
/// stdin; only then does the service get the terminal (`docker run -it`).
/// A tend started in the background must not take the terminal from a shell.
fn owns_terminal() -> bool {
    let stdin = std::io::stdin();
    nix::unistd::isatty(stdin.as_fd()).unwrap_or(false)
        && nix::unistd::tcgetpgrp(stdin.as_fd()).ok() == Some(nix::unistd::getpgrp())
}
