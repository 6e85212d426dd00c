//! The event loop: one `ppoll` over the signalfd, the watcher's fds and the
//! output pipes of running checks, with a timeout that exists only while a
//! deadline is pending (a stop's SIGKILL, a restart back-off, a debounce, a
//! check's timeout, an action's retry). An idle tend sleeps in `ppoll` with
//! no timeout at all.
//!
//! Every change of tend's state happens here, in response to a signal, an
//! exit status from the reaper, a deadline, or a watch event; [`Phase`] lists
//! every state tend as a whole can be in.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::signal::{Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::unistd::Pid;

use crate::config::{self, Config};
use crate::process::job::{Job, Outcome as JobOutcome};
use crate::process::service::{AfterExit, Service};
use crate::process::{ExitStatus, reaper};
use crate::reload::{Batch, Pipeline};
use crate::signals;
use crate::status::{Readiness, ServiceStatus, Status, WatchStatus, rfc3339};
use crate::watch::{Report, Watcher};

/// How long processes left in the container get to die after SIGKILL before
/// tend exits anyway (the kernel kills them all when PID 1 exits).
const DRAIN_KILL_GRACE: Duration = Duration::from_secs(2);

/// Every state tend can be in, as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before the first start: the current config is being checked. An
    /// invalid one keeps tend here until a valid one arrives.
    Starting,
    /// The service runs, or waits out its restart back-off.
    Running,
    /// A `restart` action: the service is being stopped to start it again on
    /// the new config of these watches.
    Restarting { watches: Vec<usize> },
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

/// A check or exec action in flight, and what it is for.
struct RunningJob {
    job: Job,
    kind: JobKind,
}

enum JobKind {
    Check(usize),
    Exec(Vec<usize>),
}

pub struct Supervisor {
    phase: Phase,
    service: Service,
    signals: SignalFd,
    watches: Vec<config::Watch>,
    watcher: Watcher,
    pipeline: Pipeline,
    jobs: Vec<RunningJob>,
    readiness: Readiness,
    /// Checks and exec actions run with the service's env and working_dir.
    env: BTreeMap<String, String>,
    working_dir: Option<PathBuf>,
    pid1: bool,
    stop_timeout: Duration,
    /// The next start is the first: if it fails, tend exits with the shell's status.
    first_start: bool,
    /// Whether tend was ready when it last published, to log changes once.
    ready: bool,
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
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        let now = Instant::now();
        // tend's own files: the watcher never covers them.
        let own_files: Vec<PathBuf> = config
            .readiness
            .file
            .iter()
            .chain(&config.readiness.status_file)
            .cloned()
            .collect();
        let watcher = Watcher::new(&config.watches, &cwd, &own_files, now)?;
        Ok(Supervisor {
            phase: Phase::Starting,
            service: Service::new(&config.service, argv, owns_terminal()),
            signals,
            watches: config.watches.clone(),
            watcher,
            pipeline: Pipeline::new(&config.watches),
            jobs: Vec::new(),
            readiness: Readiness::new(&config.readiness),
            env: config.service.env.clone(),
            working_dir: config.service.working_dir.clone(),
            pid1,
            stop_timeout: config.service.stop_timeout,
            first_start: true,
            ready: false,
        })
    }

    /// Runs until tend should exit, and returns its exit code.
    pub fn run(mut self) -> anyhow::Result<i32> {
        if !self.watches.is_empty() {
            tracing::info!(
                "checking the config of {} watch(es) before starting the service",
                self.watches.len()
            );
        }
        let mut now = Instant::now();
        loop {
            self.advance(now);
            self.publish();
            if let Phase::Exited(code) = self.phase {
                self.readiness.withdraw();
                return Ok(code);
            }
            let woke = self.wait(self.deadline())?;
            now = Instant::now();
            // Output first: handling signals may reap a job and move the others.
            for i in woke.jobs {
                self.jobs[i].job.read_output();
            }
            if woke.signals {
                self.on_signals(now);
            }
            for report in self.watcher.pump(&woke.watcher) {
                // Watches are acted on only while tend starts or runs.
                if matches!(
                    self.phase,
                    Phase::Starting | Phase::Running | Phase::Restarting { .. }
                ) {
                    self.observe(&report);
                }
            }
            self.on_deadlines(now);
        }
    }

    // ------------------------------------------------------------ waiting

    /// The next deadline that something will act on. Actions are retried
    /// only while tend runs: their deadlines outside that phase would wake
    /// the loop for nothing, and once past, make it spin. (The watcher keeps
    /// its timers on its own thread.)
    fn deadline(&self) -> Option<Instant> {
        let (drain, acting) = match self.phase {
            Phase::Draining { deadline, .. } => (Some(deadline), false),
            Phase::Starting | Phase::Restarting { .. } => (None, false),
            Phase::Running => (None, true),
            Phase::Stopping | Phase::Exited(_) => (None, false),
        };
        [
            drain,
            self.service.deadline(),
            self.pipeline.deadline().filter(|_| acting),
            self.jobs.iter().filter_map(|j| j.job.deadline()).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn wait(&self, deadline: Option<Instant>) -> anyhow::Result<Woke> {
        let timeout =
            deadline.map(|d| TimeSpec::from_duration(d.saturating_duration_since(Instant::now())));
        let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
        let watcher_fds = self.watcher.poll_fds();
        let watcher_at = fds.len();
        let watcher_n = watcher_fds.len();
        fds.extend(
            watcher_fds
                .into_iter()
                .map(|(fd, flags)| PollFd::new(fd, flags)),
        );
        let mut job_at = Vec::new();
        for (i, j) in self.jobs.iter().enumerate() {
            if let Some(fd) = j.job.fd() {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                job_at.push((fds.len() - 1, i));
            }
        }
        match ppoll(&mut fds, timeout, None) {
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(Woke::default()),
            Err(e) => return Err(e).context("ppoll() failed"),
        }
        let ready = |at: usize| fds[at].revents().is_some_and(|r| !r.is_empty());
        Ok(Woke {
            signals: ready(0),
            watcher: (watcher_at..watcher_at + watcher_n).map(ready).collect(),
            jobs: job_at
                .into_iter()
                .filter(|(at, _)| ready(*at))
                .map(|(_, i)| i)
                .collect(),
        })
    }

    // ------------------------------------------------------------ signals

    fn on_signals(&mut self, now: Instant) {
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
                Ok(Signal::SIGTERM) => self.on_sigterm(info.ssi_pid, now),
                // Nothing to interrupt: Ctrl-C (docker run -it) stops tend.
                Ok(Signal::SIGINT) if self.service.pid().is_none() => {
                    self.on_interrupt(info.ssi_pid, now)
                }
                _ => self.forward(signo, info.ssi_pid),
            }
        }
        if child_exited {
            self.on_child_exits(now);
        }
    }

    fn on_sigterm(&mut self, from: u32, now: Instant) {
        match self.phase {
            Phase::Starting | Phase::Running | Phase::Restarting { .. } => {
                tracing::info!(from, "SIGTERM received: stopping");
                for j in &self.jobs {
                    j.job.kill_group();
                }
                if self.service.stop(now) {
                    self.phase = Phase::Stopping;
                } else {
                    // No service process (not started, or backing off).
                    self.service.cancel_restart();
                    self.begin_drain(ExitStatus::Signal(Signal::SIGTERM as i32), now);
                }
            }
            Phase::Stopping | Phase::Draining { .. } | Phase::Exited(_) => {
                tracing::info!(from, "SIGTERM received again: already stopping");
            }
        }
    }

    fn on_interrupt(&mut self, from: u32, now: Instant) {
        if matches!(self.phase, Phase::Starting | Phase::Running) {
            tracing::info!(from, "SIGINT received while no service runs: stopping");
            self.service.cancel_restart();
            self.begin_drain(ExitStatus::Signal(Signal::SIGINT as i32), now);
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

    fn on_child_exits(&mut self, now: Instant) {
        let reaped = reaper::reap();
        for (pid, status) in reaped.exits {
            self.route_exit(pid, status, now);
        }
        if reaped.no_children
            && let Phase::Draining { status, .. } = self.phase
        {
            self.phase = Phase::Exited(status.code());
        }
    }

    /// Hands an exit status to whoever started that pid: the service, a
    /// check or exec job, or nobody (an orphan, just reaped).
    fn route_exit(&mut self, pid: Pid, status: ExitStatus, now: Instant) {
        if let Some(after) = self.service.on_exit(pid, status, now) {
            self.on_service_exit(after, now);
        } else if let Some(at) = self.jobs.iter().position(|j| j.job.pid() == pid) {
            let RunningJob { job, kind } = self.jobs.swap_remove(at);
            let outcome = job.finish(status, now);
            self.on_job_exit(kind, outcome, now);
        } else {
            tracing::debug!(pid = pid.as_raw(), "reaped an orphan: {status}");
        }
    }

    fn on_service_exit(&mut self, after: AfterExit, now: Instant) {
        match (&self.phase, after) {
            (_, AfterExit::Restarting) => {}
            (Phase::Restarting { watches }, AfterExit::Finished(_)) => {
                let watches = watches.clone();
                self.phase = Phase::Running;
                self.start_service(now);
                for i in watches {
                    self.pipeline.action_finished(i, true, now);
                }
            }
            (Phase::Starting | Phase::Running | Phase::Stopping, AfterExit::Finished(status)) => {
                self.begin_drain(status, now)
            }
            (Phase::Draining { .. } | Phase::Exited(_), AfterExit::Finished(_)) => {}
        }
    }

    fn on_job_exit(&mut self, kind: JobKind, outcome: JobOutcome, now: Instant) {
        if !matches!(
            self.phase,
            Phase::Starting | Phase::Running | Phase::Restarting { .. }
        ) {
            return;
        }
        match kind {
            JobKind::Check(i) => self.on_check_result(i, outcome),
            JobKind::Exec(watches) => {
                let ok = outcome.success();
                for &i in &watches {
                    self.pipeline.action_finished(i, ok, now);
                }
                let names = self.names(&watches);
                if ok {
                    tracing::info!(watch = names, took = ?outcome.took, "reload command succeeded: config applied");
                } else {
                    let retry = watches.iter().find_map(|&i| self.pipeline.retry_in(i, now));
                    tracing::warn!(
                        watch = names,
                        "reload command failed ({}); retrying in {:?}{}",
                        outcome.describe(),
                        retry.unwrap_or_default(),
                        output_for_log(&outcome.output)
                    );
                }
            }
        }
    }

    fn on_check_result(&mut self, i: usize, outcome: JobOutcome) {
        let passed = outcome.success();
        let mut output = outcome.output.clone();
        if outcome.timed_out {
            output.push_str(&format!(
                "\n[tend: the check timed out after {:?} and was killed]",
                outcome.took
            ));
        }
        let name = self.watches[i].name.clone();
        if !self.pipeline.check_finished(i, passed, output) {
            tracing::info!(
                watch = name,
                "check result dropped: the config changed while it ran; checking again"
            );
        } else if passed {
            tracing::info!(watch = name, took = ?outcome.took, "check passed");
        } else {
            let consequence = if self.phase == Phase::Starting {
                "the service is not started until a valid config arrives"
            } else {
                "the new config is rejected and the service keeps running on the last good one"
            };
            tracing::warn!(
                watch = name,
                took = ?outcome.took,
                "check failed ({}): {consequence}{}",
                outcome.describe(),
                output_for_log(&outcome.output)
            );
        }
    }

    /// The service is gone for good. As PID 1, tend now stops whatever is
    /// left in the container before it exits (the kernel would SIGKILL it all
    /// without warning); as a subreaper, it simply exits.
    fn begin_drain(&mut self, status: ExitStatus, now: Instant) {
        for j in &self.jobs {
            j.job.kill_group();
        }
        let code = status.code();
        if !self.pid1 {
            self.phase = Phase::Exited(code);
            return;
        }
        let reaped = reaper::reap();
        for (pid, st) in reaped.exits {
            self.route_exit(pid, st, now);
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
            deadline: now + self.stop_timeout,
            killed: false,
        };
    }

    // ------------------------------------------------------------ deadlines

    fn on_deadlines(&mut self, now: Instant) {
        if self.service.on_deadline(now) && self.phase == Phase::Running {
            self.start_service(now);
        }
        for j in &mut self.jobs {
            j.job.on_deadline(now);
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

    fn start_service(&mut self, now: Instant) {
        let first = std::mem::replace(&mut self.first_start, false);
        let Err(e) = self.service.start(now) else {
            return;
        };
        if first {
            // Nothing ran yet: say it plainly and exit with the shell's
            // status, whatever the restart policy.
            tracing::error!("{e}");
            self.begin_drain(ExitStatus::Code(e.exit_code()), now);
        } else if let AfterExit::Finished(status) = self.service.on_start_failure(&e, now) {
            self.begin_drain(status, now);
        }
    }

    // ------------------------------------------------------------ the pipeline

    /// Moves every watch along: scans what is due, starts checks, and applies
    /// the actions that are ready (or, before the first start, starts the
    /// service once every config passed).
    fn advance(&mut self, now: Instant) {
        if !matches!(
            self.phase,
            Phase::Starting | Phase::Running | Phase::Restarting { .. }
        ) {
            return;
        }
        for i in self.pipeline.start_checks() {
            self.start_check(i, now);
        }
        match self.phase {
            Phase::Starting if self.pipeline.ready_to_start() => {
                self.phase = Phase::Running;
                self.pipeline.started();
                self.start_service(now);
            }
            Phase::Running => {
                if let Some(batch) = self.pipeline.take_batch(now) {
                    self.apply(batch, now);
                }
            }
            _ => {}
        }
    }

    fn observe(&mut self, scan: &Report) {
        let i = scan.watch.0;
        let Some(previous) = self
            .pipeline
            .observe(i, scan.fingerprint, SystemTime::now())
        else {
            tracing::debug!(watch = self.watches[i].name, "scanned: content unchanged");
            return;
        };
        let w = &self.watches[i];
        match previous {
            None => tracing::info!(
                watch = w.name,
                fingerprint = scan.fingerprint.short(),
                files = scan.files,
                missing = ?scan.missing,
                "config found"
            ),
            Some(old) => {
                let changed: Vec<_> = scan
                    .changed
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                tracing::info!(
                    watch = w.name,
                    paths = ?changed,
                    files = scan.files,
                    missing = ?scan.missing,
                    "change detected: {} -> {}",
                    old.short(),
                    scan.fingerprint.short()
                );
            }
        }
    }

    fn start_check(&mut self, i: usize, now: Instant) {
        let w = &self.watches[i];
        let Some(argv) = &w.check else {
            self.pipeline.check_finished(i, true, String::new());
            return;
        };
        match Job::start(
            argv,
            &self.env,
            self.working_dir.as_deref(),
            w.check_timeout,
            now,
        ) {
            Ok(job) => {
                tracing::info!(watch = w.name, pid = job.pid().as_raw(), command = ?argv, "checking the new config");
                self.jobs.push(RunningJob {
                    job,
                    kind: JobKind::Check(i),
                });
            }
            Err(e) => {
                tracing::error!(watch = w.name, "cannot run the check: {e}");
                self.pipeline.check_finished(i, false, e.to_string());
            }
        }
    }

    fn apply(&mut self, batch: Batch, now: Instant) {
        let names = self.names(&batch.watches);
        if batch.restart {
            if self.service.stop(now) {
                tracing::info!(watch = names, "restarting the service on the new config");
                self.phase = Phase::Restarting {
                    watches: batch.watches,
                };
            } else {
                tracing::info!(
                    watch = names,
                    "the service is not running: it starts on the new config"
                );
                for i in batch.watches {
                    self.pipeline.action_finished(i, true, now);
                }
            }
            return;
        }
        let mut done: Vec<usize> = batch.watches.clone();
        for (_, users) in &batch.execs {
            done.retain(|i| !users.contains(i));
        }
        for sig in &batch.signals {
            let pid = self.service.pid();
            if self.service.signal(*sig) {
                let watch = self.names(&done);
                tracing::info!(
                    watch,
                    pid = pid.map(Pid::as_raw),
                    "sent {sig} to the service: config applied"
                );
            } else {
                tracing::info!(
                    watch = names,
                    "the service is not running: it starts on the new config"
                );
            }
        }
        for i in done {
            if matches!(self.watches[i].action, config::Action::None) {
                tracing::info!(
                    watch = self.watches[i].name,
                    "config accepted (on_change = \"none\")"
                );
            }
            self.pipeline.action_finished(i, true, now);
        }
        for (argv, users) in batch.execs {
            let timeout = users
                .iter()
                .map(|&i| self.watches[i].check_timeout)
                .max()
                .unwrap_or_default();
            match Job::start(&argv, &self.env, self.working_dir.as_deref(), timeout, now) {
                Ok(job) => {
                    tracing::info!(watch = self.names(&users), pid = job.pid().as_raw(), command = ?argv, "running the reload command");
                    self.jobs.push(RunningJob {
                        job,
                        kind: JobKind::Exec(users),
                    });
                }
                Err(e) => {
                    tracing::warn!(
                        watch = self.names(&users),
                        "cannot run the reload command: {e}"
                    );
                    for i in users {
                        self.pipeline.action_finished(i, false, now);
                    }
                }
            }
        }
    }

    fn names(&self, watches: &[usize]) -> String {
        watches
            .iter()
            .map(|&i| self.pipeline.name(i))
            .collect::<Vec<_>>()
            .join(", ")
    }

    // ------------------------------------------------------------ readiness

    fn publish(&mut self) {
        let service_up = self.service.is_running();
        let ready = self.phase == Phase::Running && service_up && self.pipeline.all_good();
        let state = match self.phase {
            Phase::Stopping | Phase::Draining { .. } | Phase::Exited(_) => "stopping",
            Phase::Restarting { .. } => "restarting",
            Phase::Running if !service_up => "restarting",
            _ if self.pipeline.any_invalid() => "invalid_config",
            Phase::Starting => "starting",
            _ if ready && !self.pipeline.busy() => "ready",
            _ => "reloading",
        };
        let status = Status {
            state: state.to_string(),
            ready,
            service: ServiceStatus {
                pid: self.service.pid().map(Pid::as_raw),
                restarts: self.service.restarts(),
            },
            watches: self
                .pipeline
                .reports()
                .map(|r| WatchStatus {
                    name: r.name.to_string(),
                    result: r.outcome.as_str().to_string(),
                    check_output: r.check_output.to_string(),
                    changed_at: r.changed_at.map(rfc3339),
                })
                .collect(),
            updated_at: String::new(),
        };
        if ready != self.ready && (self.readiness.configured() || !self.watches.is_empty()) {
            self.ready = ready;
            if ready {
                tracing::info!("ready");
            } else {
                match self.pipeline.first_problem() {
                    Some((watch, outcome)) if !matches!(state, "stopping" | "restarting") => {
                        tracing::info!(state, watch, result = outcome.as_str(), "not ready")
                    }
                    _ => tracing::info!(state, "not ready"),
                }
            }
        }
        self.readiness.publish(status);
    }
}

#[derive(Default)]
struct Woke {
    signals: bool,
    /// Per fd of `Watcher::poll_fds`: whether it had revents.
    watcher: Vec<bool>,
    jobs: Vec<usize>,
}

/// The last lines of a command's output, for a log line.
fn output_for_log(output: &str) -> String {
    let trimmed = output.trim();
    if trimmed.is_empty() {
        return String::new();
    }
    let lines: Vec<&str> = trimmed.lines().collect();
    let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
    format!("; output: {tail}")
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
