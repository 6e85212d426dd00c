//! The shell around the core: one `ppoll` over the signalfd, the watcher's
//! file descriptors, the output pipes of running jobs and of the services
//! whose lines tend prefixes, with a timeout
//! that exists only while something is due. An idle tend sleeps in `ppoll`
//! with no timeout at all.
//!
//! Everything tend decides is decided by [`Core`]; this file only turns what
//! happened into [`Event`]s and carries out the [`Command`]s that come back,
//! in order. It holds what the core must not: file descriptors, the reaper,
//! the children's output, the readiness files, and the clock.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use anyhow::Context as _;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::time::TimeSpec;
use nix::unistd::Pid;

use crate::config::{Config, InvalidConfig};
use crate::control::ControlSocket;
use crate::core::{
    Answer, Command, Core, Event, Exit, Notification, Now, ServiceId, Settings, SpawnFailure,
    SpawnKind, service,
};
use crate::envfile;
use crate::http_action::Endpoint;
use crate::http_client::{Calls, Finished};
use crate::http_server::{HttpServer, Page, Reply};
use crate::log;
use crate::notify::{self, NotifySocket};
use crate::output::{self, ServiceOutput};
use crate::probe;
use crate::process::job::Job;
use crate::process::reaper;
use crate::process::spawn::{self, Output, Sockets, Spec};
use crate::signals;
use crate::sockets::Held;
use crate::status::ReadinessFiles;
use crate::users::Account;
use crate::watch::{Request, Restored, WatchId, Watcher};

pub struct Supervisor {
    core: Core,
    signals: SignalFd,
    watcher: Watcher,
    readiness: ReadinessFiles,
    /// Checks and exec actions in flight, by pid: their output pipes.
    jobs: Vec<Job>,
    /// Calls of reload endpoints in flight.
    calls: Calls,
    /// How each service starts, by [`ServiceId`].
    services: Vec<Launch>,
    /// Listening sockets, held at fds 3.. for every start of the service.
    sockets: Held,
    /// NOTIFY_SOCKET, when a service has `notify = true`.
    notify: Option<NotifySocket>,
    /// `[http] listen`: /ready, /status and /metrics.
    http: Option<HttpServer>,
    /// `tend signal` and `tend restart`, beside the status file.
    control: Option<ControlSocket>,
    /// The generations of the status, the metrics, the output's drop
    /// counts and the watcher's counts the server's pages were made from.
    served: (u64, u64, u64, u64),
    /// The signals the signalfd reads, for waiting on them alone.
    handled: nix::sys::signal::SigSet,
    /// Whether anything reads the status: readiness files, or watches
    /// (whose "ready" and "not ready" the core logs). A plain init skips it.
    publishes: bool,
    /// The pipes of the services with `output = "prefix"`.
    output: ServiceOutput,
    /// Running instances of services, to tell the output which service's
    /// instance exited.
    instances: Vec<(Pid, ServiceId)>,
    /// Every service's name, by [`ServiceId`].
    names: Vec<String>,
}

/// What the shell needs to start one service, and the jobs run on its
/// behalf (which run with its env and working_dir, as tend's user).
struct Launch {
    env: BTreeMap<String, String>,
    /// Read at every start of the service, under `env`; jobs never get it.
    env_from: Vec<PathBuf>,
    working_dir: Option<PathBuf>,
    /// The main service takes the terminal when tend has it; the others
    /// read /dev/null.
    main: bool,
    take_terminal: bool,
    /// The held sockets it gets as fds 3.., as indices of the config's
    /// `[[socket]]` list.
    sockets: Vec<usize>,
    /// What it gets besides `env`: NOTIFY_SOCKET, its user's HOME, USER and
    /// LOGNAME.
    extra_env: Vec<(String, String)>,
    /// The user it runs as, when tend switches to one.
    user: Option<Account>,
}

impl Supervisor {
    /// `restored`: what an earlier tend published, per watch (see
    /// [`crate::watch::publish::prepare_all`]); `accounts`: each service's
    /// user (see [`accounts`]).
    pub fn new(
        config: &Config,
        argv: Vec<String>,
        sockets: Held,
        http: Option<HttpServer>,
        restored: Vec<Option<Restored>>,
        accounts: Vec<Option<Account>>,
    ) -> anyhow::Result<Supervisor> {
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
        // Only watches resolve paths against it: a plain init also runs in
        // a directory that was removed.
        let cwd = if config.watches.is_empty() {
            PathBuf::new()
        } else {
            std::env::current_dir().context("cannot read the current directory")?
        };
        let readiness = ReadinessFiles::new(&config.readiness);
        let publishes = readiness.configured() || !config.watches.is_empty();
        let notify = if config.services.iter().any(|s| s.notify) {
            Some(NotifySocket::new().context("cannot create the notify socket (notify = true)")?)
        } else {
            None
        };
        let take_terminal = owns_terminal();
        let tend_uid = euid();
        output::arm(config, &argv);
        let names: Vec<String> = (0..config.services.len())
            .map(|i| config.service_name(i, (i == config.main).then_some(argv.as_slice())))
            .collect();
        let prefixed: Vec<bool> = config
            .services
            .iter()
            .map(|s| s.output == crate::config::Output::Prefix)
            .collect();
        let format = if log::json() {
            output::Format::Json
        } else {
            output::Format::Prefix
        };
        let service_output = ServiceOutput::new(&names, &prefixed, format)?;
        let mut launches = Vec::with_capacity(config.services.len());
        let mut services = Vec::with_capacity(config.services.len());
        for (i, (s, account)) in config.services.iter().zip(accounts).enumerate() {
            let main = i == config.main;
            let argv = if main {
                argv.clone()
            } else {
                s.command.clone().unwrap_or_default()
            };
            let mut extra_env = Vec::new();
            if s.notify
                && let Some(n) = &notify
            {
                extra_env.push((
                    "NOTIFY_SOCKET".to_string(),
                    n.path().to_string_lossy().into_owned(),
                ));
            }
            if let Some(a) = &account {
                extra_env.extend(a.variables());
            }
            launches.push(Launch {
                env: s.env.clone(),
                env_from: s.env_from.clone(),
                working_dir: s.working_dir.clone(),
                main,
                take_terminal: main && take_terminal,
                sockets: (0..config.sockets.len())
                    .filter(|&k| config.sockets[k].service == i)
                    .collect(),
                extra_env,
                // tend's own user needs no switch (nor could make one).
                user: account.filter(|a| tend_uid == 0 || a.uid != tend_uid),
            });
            let name = config.service_name(i, Some(&argv));
            services.push(service::Settings::from_config(config, i, name, argv));
        }
        let settings = Settings {
            services,
            main: ServiceId(config.main),
            pid1,
            readiness_files: readiness.configured(),
            ready_when_invalid: config.readiness.invalid_config == InvalidConfig::Ready,
            seed: random_seed(),
        };
        let env_from: Vec<PathBuf> = config
            .services
            .iter()
            .flat_map(|s| s.env_from.iter().cloned())
            .collect();
        // A published copy is its service's user's, which may not read
        // what tend (root) can.
        let owners: Vec<Option<(u32, u32)>> = config
            .watches
            .iter()
            .map(|w| launches[w.service].user.as_ref().map(|a| (a.uid, a.gid)))
            .collect();
        let watcher = Watcher::new(
            &config.watches,
            &env_from,
            &owners,
            &cwd,
            &own_files(&config.readiness, &config.watches),
            Instant::now(),
        )?;
        let mut core = Core::new(settings, &config.watches);
        for (i, r) in restored.iter().enumerate() {
            if let Some(r) = r {
                core.restore(WatchId(i), r);
            }
        }
        let control = config
            .readiness
            .status_file
            .as_deref()
            .and_then(open_control);
        Ok(Supervisor {
            core,
            control,
            signals,
            watcher,
            readiness,
            jobs: Vec::new(),
            calls: Calls::default(),
            services: launches,
            sockets,
            notify,
            publishes: publishes || http.is_some(),
            http,
            served: (0, 0, 0, 0),
            handled: signals::handled(),
            output: service_output,
            instances: Vec::new(),
            names,
        })
    }

    /// Runs until tend should exit, and returns its exit code.
    pub fn run(mut self) -> anyhow::Result<i32> {
        // "starting", before any service starts: a directory the files
        // cannot be written in is logged before tend could say it is ready.
        self.publish(clock().mono);
        let mut events = VecDeque::from([Event::Tick]);
        loop {
            let now = clock();
            // What this wake-up logs is written once it was acted on.
            log::hold();
            while let Some(event) = events.pop_front() {
                let commands = self.core.handle(now, event);
                if let Some(code) = self.perform(commands, now) {
                    // What the services wrote last, before tend's last lines.
                    self.output.drain_all();
                    self.publish(now.mono);
                    self.readiness.withdraw();
                    log::release();
                    return Ok(code);
                }
            }
            // The services' lines that the last wait found, read once its
            // signals and exits were acted on.
            self.output.pump(Instant::now());
            self.publish(now.mono);
            // After the signals and exits of this wake-up were acted on, and
            // with the status they led to.
            self.serve_http();
            log::release();
            self.wait(&mut events)?;
            // Every event lets the core act on what is due; a wake-up with
            // none (a deadline) still must.
            if events.is_empty() {
                events.push_back(Event::Tick);
            }
        }
    }

    /// Carries out `commands` in order. Events they cause (a spawn's pid, a
    /// reaper pass) are handled at once, before anything else. Returns the
    /// exit code once the core says to exit.
    fn perform(&mut self, commands: Vec<Command>, now: Now) -> Option<i32> {
        let mut queue = VecDeque::from(commands);
        while let Some(command) = queue.pop_front() {
            let caused = match command {
                Command::Spawn {
                    token,
                    argv,
                    kind,
                    env,
                } => Some(Event::Spawned {
                    token,
                    result: self.spawn(&argv, kind, &env),
                }),
                Command::CallHttp { token, action } => {
                    match Endpoint::parse(&action.method, &action.url) {
                        Ok(endpoint) => self
                            .calls
                            .start(token, &endpoint, action.timeout, Instant::now())
                            .map(called),
                        // The config was checked: this cannot be, but is no panic.
                        Err(e) => Some(Event::Called {
                            token,
                            result: Err(e),
                            took: std::time::Duration::ZERO,
                        }),
                    }
                }
                Command::CancelCall { token } => {
                    self.calls.cancel(token);
                    None
                }
                Command::Snapshot { watch, fingerprint } => {
                    self.watcher.ask(Request::Snapshot(watch, fingerprint));
                    None
                }
                Command::Publish {
                    watch,
                    fingerprint,
                    candidate,
                    keep,
                } => {
                    self.watcher.ask(Request::Publish {
                        watch,
                        fingerprint,
                        candidate,
                        keep,
                    });
                    None
                }
                Command::Rollback {
                    watch,
                    fingerprint,
                    generation,
                } => {
                    self.watcher
                        .ask(Request::Rollback(watch, fingerprint, generation));
                    None
                }
                Command::Withdraw {
                    watch,
                    fingerprint,
                    kept,
                } => {
                    self.watcher
                        .ask(Request::Withdraw(watch, fingerprint, kept));
                    None
                }
                Command::Discard { watch, candidate } => {
                    self.watcher.ask(Request::Discard(watch, candidate));
                    None
                }
                Command::Forward {
                    pid,
                    group,
                    signo,
                    from,
                } => {
                    // Send first, log after: the log line costs time.
                    send(pid, group, signo);
                    tracing::info!(
                        pid = pid.as_raw(),
                        sender_pid = signals::sender(from),
                        "forwarded {} to the service",
                        signals::describe(signo)
                    );
                    None
                }
                Command::Signal { pid, group, signo } => {
                    send(pid, group, signo);
                    None
                }
                Command::ContinueIfStopped { pid, group } => {
                    if stopped(pid, group) {
                        send(pid, group, libc::SIGCONT);
                    }
                    None
                }
                Command::SignalEveryone(signo) => {
                    // kill(-1): every process in the PID namespace but tend.
                    // SAFETY: kill has no memory effects.
                    if unsafe { libc::kill(-1, signo) } == -1 {
                        let e = Errno::last();
                        if e != Errno::ESRCH {
                            tracing::error!("kill(-1, {}) failed: {e}", signals::describe(signo));
                        }
                    }
                    None
                }
                Command::Reap => Some(self.reap()),
                Command::Answer {
                    client,
                    code,
                    message,
                } => {
                    if let Some(c) = &mut self.control {
                        c.answer(client, code, &message);
                    }
                    None
                }
                Command::Exit(code) => return Some(code),
            };
            if let Some(event) = caused {
                queue.extend(self.core.handle(now, event));
            }
        }
        None
    }

    fn spawn(
        &mut self,
        argv: &[String],
        kind: SpawnKind,
        extra_env: &[(String, String)],
    ) -> Result<Pid, SpawnFailure> {
        let started = match kind {
            SpawnKind::Service(id) => {
                let launch = &self.services[id.0];
                let env = service_variables(launch)?;
                let output = match self.output.stdio(id.0) {
                    Ok(Some((stdout, stderr))) => Output::Lines { stdout, stderr },
                    Ok(None) => Output::Inherit,
                    Err(e) => {
                        return Err(SpawnFailure {
                            message: format!(
                                "cannot start the service: dup() of its output pipe failed: {e}"
                            ),
                            exit_code: 1,
                        });
                    }
                };
                let started = spawn::spawn(Spec {
                    argv,
                    env: &env,
                    working_dir: launch.working_dir.as_deref(),
                    take_terminal: launch.take_terminal,
                    output,
                    sockets: Some(Sockets {
                        held: &self.sockets,
                        which: &launch.sockets,
                    }),
                    extra_env: &launch.extra_env,
                    stdin_null: !launch.main,
                    user: launch.user.as_ref(),
                    fds: spawn::Fds::Inherited,
                });
                if let Ok(pid) = started {
                    self.instances.push((pid, id));
                }
                started
            }
            SpawnKind::Job(id) | SpawnKind::JobWithSockets(id) => {
                let launch = &self.services[id.0];
                let sockets = matches!(kind, SpawnKind::JobWithSockets(_)).then_some(Sockets {
                    held: &self.sockets,
                    which: &launch.sockets,
                });
                Job::start(
                    argv,
                    &launch.env,
                    extra_env,
                    launch.working_dir.as_deref(),
                    sockets,
                )
                .map(|job| {
                    let pid = job.pid();
                    self.jobs.push(job);
                    pid
                })
            }
        };
        started.map_err(|e| SpawnFailure {
            message: e.to_string(),
            exit_code: e.exit_code(),
        })
    }

    /// One reaper pass, with the output of the jobs among the exits. An
    /// instance's last lines are read before the core hears of its exit.
    fn reap(&mut self) -> Event {
        let reaped = reaper::reap();
        let now = Instant::now();
        for (pid, _) in &reaped.exits {
            if let Some(at) = self.instances.iter().position(|(p, _)| p == pid) {
                let (_, id) = self.instances.swap_remove(at);
                self.output.exited(id.0, now);
            }
        }
        let exits = reaped
            .exits
            .into_iter()
            .map(|(pid, status)| {
                let output = self
                    .jobs
                    .iter()
                    .position(|j| j.pid() == pid)
                    .map(|at| self.jobs.swap_remove(at).finish());
                Exit {
                    pid,
                    status,
                    output,
                }
            })
            .collect();
        Event::Reaped {
            exits,
            no_children: reaped.no_children,
        }
    }

    fn publish(&mut self, now: Instant) {
        if self.publishes {
            self.core.set_files_problem(self.readiness.problem());
            let mut status = self.core.status();
            self.output.fill_status(&mut status, now);
            self.readiness.publish(status, now);
        }
    }

    /// Sleeps until something happens or is due, and queues what happened.
    fn wait(&mut self, events: &mut VecDeque<Event>) -> anyhow::Result<()> {
        let deadline = [
            self.core.deadline(),
            self.readiness.deadline(),
            self.http.as_ref().and_then(HttpServer::deadline),
            self.calls.deadline(),
            self.notify.as_ref().and_then(NotifySocket::deadline),
            self.control.as_ref().and_then(ControlSocket::deadline),
            self.output.deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        if deadline.is_none()
            && self.jobs.is_empty()
            && self.calls.is_empty()
            && self.notify.is_none()
            && self.http.is_none()
            && self.control.is_none()
            && self.output.is_empty()
            && self.watcher.poll_fds().is_empty()
        {
            return self.wait_for_signal(events);
        }
        let timeout =
            deadline.map(|d| TimeSpec::from_duration(d.saturating_duration_since(Instant::now())));
        let (signals, watcher, notify, jobs, http, control, lines, calls) = {
            let mut fds = vec![PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
            let watcher_fds = self.watcher.poll_fds();
            let watcher_at = fds.len();
            let watcher_n = watcher_fds.len();
            fds.extend(
                watcher_fds
                    .into_iter()
                    .map(|(fd, flags)| PollFd::new(fd, flags)),
            );
            let notify_at = self
                .notify
                .as_ref()
                .and_then(|n| n.poll_fd(Instant::now()))
                .map(|fd| {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                    fds.len() - 1
                });
            let http_fds = self.http.as_ref().map(HttpServer::poll_fds);
            let http_at = fds.len();
            let http_n = http_fds.as_ref().map_or(0, Vec::len);
            fds.extend(
                http_fds
                    .into_iter()
                    .flatten()
                    .map(|(fd, flags)| PollFd::new(fd, flags)),
            );
            let control_fds = self.control.as_ref().map(ControlSocket::poll_fds);
            let control_at = fds.len();
            let control_n = control_fds.as_ref().map_or(0, Vec::len);
            fds.extend(
                control_fds
                    .into_iter()
                    .flatten()
                    .map(|(fd, flags)| PollFd::new(fd, flags)),
            );
            let output_fds = self.output.poll_fds();
            let output_at = fds.len();
            let output_n = output_fds.len();
            fds.extend(
                output_fds
                    .into_iter()
                    .map(|(fd, flags)| PollFd::new(fd, flags)),
            );
            let call_fds = self.calls.poll_fds();
            let call_at = fds.len();
            let call_n = call_fds.len();
            fds.extend(
                call_fds
                    .into_iter()
                    .map(|(fd, flags)| PollFd::new(fd, flags)),
            );
            let mut job_at = Vec::new();
            for (i, j) in self.jobs.iter().enumerate() {
                if let Some(fd) = j.fd() {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                    job_at.push((fds.len() - 1, i));
                }
            }
            match ppoll(&mut fds, timeout, None) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e).context("ppoll() failed"),
            }
            let ready = |at: usize| fds[at].revents().is_some_and(|r| !r.is_empty());
            let jobs: Vec<usize> = job_at
                .into_iter()
                .filter(|(at, _)| ready(*at))
                .map(|(_, i)| i)
                .collect();
            (
                ready(0),
                (watcher_at..watcher_at + watcher_n)
                    .map(ready)
                    .collect::<Vec<bool>>(),
                notify_at.is_some_and(ready),
                jobs,
                (http_at..http_at + http_n)
                    .map(ready)
                    .collect::<Vec<bool>>(),
                (control_at..control_at + control_n)
                    .map(ready)
                    .collect::<Vec<bool>>(),
                (output_at..output_at + output_n)
                    .map(ready)
                    .collect::<Vec<bool>>(),
                (call_at..call_at + call_n)
                    .map(ready)
                    .collect::<Vec<bool>>(),
            )
        };
        // Read once the signals of this wake-up were acted on (run()).
        self.output.set_ready(&lines);
        if let Some(server) = &mut self.http {
            server.set_ready(&http);
        }
        let now = Instant::now();
        // Output first: a reaper pass below may finish these jobs.
        for i in jobs {
            self.jobs[i].read_output();
        }
        if signals {
            self.read_signals(events);
        }
        self.calls.set_ready(&calls);
        events.extend(self.calls.pump(now).into_iter().map(called));
        if let Some(n) = &self.notify {
            if notify {
                // A flood comes from one sender: /proc is read for it once
                // per batch, not once per datagram.
                let mut last: Option<(Pid, Vec<Pid>)> = None;
                for (pid, datagram) in n.recv() {
                    let chain = match &last {
                        Some((p, chain)) if *p == pid => chain.clone(),
                        _ => last.insert((pid, notify::ancestry(pid))).1.clone(),
                    };
                    events.push_back(Event::Notify {
                        chain,
                        message: Notification::parse(&datagram),
                    });
                }
            }
            n.tick(now);
        }
        if let Some(c) = &mut self.control {
            c.set_ready(&control);
            c.serve(now, events);
        }
        self.readiness.retry(now);
        let (scans, done) = self.watcher.pump(&watcher);
        events.extend(scans.into_iter().map(Event::Content));
        events.extend(done.into_iter().map(Event::Done));
        Ok(())
    }

    /// Answers the HTTP clients that are ready, from the status just
    /// published.
    fn serve_http(&mut self) {
        let Some(server) = &mut self.http else {
            return;
        };
        let (readiness, core, output, names) =
            (&self.readiness, &self.core, &self.output, &self.names);
        let watcher = self.watcher.counts();
        let current = (
            readiness.generation(),
            core.metrics().generation(),
            output.generation(),
            watcher.events + watcher.errors,
        );
        if std::mem::replace(&mut self.served, current) != current {
            server.content_changed();
        }
        server.serve(Instant::now(), &mut |page| {
            let Some(status) = readiness.current() else {
                return Reply::text(503, "not ready: starting");
            };
            match page {
                Page::Ready => {
                    // The verdict is the services'; the files that failed
                    // are what `tend probe` reads, said here too.
                    let (ready, mut line) = probe::verdict(status);
                    if let Some(problem) = readiness.problem() {
                        line = format!("{line}; {problem}");
                    }
                    Reply::text(if ready { 200 } else { 503 }, &line)
                }
                Page::Status => Reply {
                    code: 200,
                    content_type: "application/json",
                    body: readiness.json().unwrap_or_default(),
                },
                Page::Metrics => {
                    let mut body = core.metrics().render(status, &watcher);
                    output.render_metrics(names, &mut body);
                    Reply {
                        code: 200,
                        content_type: "text/plain; version=0.0.4; charset=utf-8",
                        body: body.into_bytes(),
                    }
                }
            }
        });
    }

    /// Waits for nothing but a signal, as a plain init does most of the time:
    /// one `sigwaitinfo` takes it from the same queue the signalfd reads,
    /// instead of a `ppoll` and a `read`. Signals still queued are taken by
    /// the next call, in the same order.
    fn wait_for_signal(&mut self, events: &mut VecDeque<Event>) -> anyhow::Result<()> {
        // SAFETY: siginfo_t is plain data; sigwaitinfo writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live locals of the right types.
        let signo = unsafe { libc::sigwaitinfo(self.handled.as_ref(), &mut info) };
        match signo {
            -1 if Errno::last() == Errno::EINTR => {}
            -1 => return Err(Errno::last()).context("sigwaitinfo() failed"),
            libc::SIGCHLD => events.push_back(self.reap()),
            // SAFETY: si_pid reads the union as the kill() record, as the
            // signalfd's ssi_pid does for every signal.
            signo => received(signo, info.si_code, unsafe { info.si_pid() } as u32, events),
        }
        Ok(())
    }

    /// Drains the signalfd: every signal becomes an event in the order it
    /// came; SIGCHLDs, which coalesce, become one reaper pass after them.
    fn read_signals(&mut self, events: &mut VecDeque<Event>) {
        let mut child = false;
        // SAFETY: signalfd_siginfo is plain data; all zeroes is a valid value.
        let mut queued: [libc::signalfd_siginfo; signals::BATCH] = unsafe { std::mem::zeroed() };
        loop {
            match signals::read_queued(self.signals.as_fd(), &mut queued) {
                Ok(n) => {
                    for info in &queued[..n] {
                        let signo = info.ssi_signo as i32;
                        if signo == libc::SIGCHLD {
                            child = true;
                        } else {
                            received(signo, info.ssi_code, info.ssi_pid, events);
                        }
                    }
                    if n < queued.len() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!("read() on the signalfd failed: {e}");
                    break;
                }
            }
        }
        if child {
            events.push_back(self.reap());
        }
    }
}

/// The event of a call that ended.
fn called(f: Finished) -> Event {
    Event::Called {
        token: f.token,
        result: f.outcome.map(|(code, line)| Answer {
            code,
            line: line.strip_prefix(": ").unwrap_or(&line).to_string(),
        }),
        took: f.took,
    }
}

/// The control socket beside `status_file`; without it, tend runs on and
/// says why `tend signal` and `tend restart` will not reach it.
fn open_control(status_file: &std::path::Path) -> Option<ControlSocket> {
    match ControlSocket::open(status_file) {
        Ok(c) => {
            tracing::debug!(
                "control socket at {}: tend signal, tend restart",
                c.path().display()
            );
            Some(c)
        }
        Err(e) => {
            tracing::error!("{e}; tend signal and tend restart will not reach this tend");
            None
        }
    }
}

/// A service's variables for this start: env_from read now, `env` on top.
/// An env_from that cannot be read is a config error, so the start fails
/// with 2 (tend exits 2 when it was the first; later, the restart policy
/// applies).
fn service_variables(launch: &Launch) -> Result<Cow<'_, BTreeMap<String, String>>, SpawnFailure> {
    envfile::environment(&launch.env_from, &launch.env).map_err(|e| SpawnFailure {
        message: format!("cannot start the service: {e}"),
        exit_code: 2,
    })
}

/// Each service's user, resolved from the image's /etc/passwd and
/// /etc/group: an error names a user that is not there, or one tend cannot
/// switch to because it is not root.
pub fn accounts(config: &Config) -> Result<Vec<Option<Account>>, String> {
    let me = euid();
    let root = me == 0;
    config
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let Some(user) = &s.user else {
                return Ok(None);
            };
            let name = config.service_name(i, None);
            let account = Account::resolve(user, std::path::Path::new("/"))
                .map_err(|e| format!("service {name:?}: user = \"{user}\": {e}"))?;
            if !root && account.uid != me {
                return Err(format!(
                    "service {name:?}: user = \"{user}\" (uid {}): tend runs as uid {me}, not \
                     root, and cannot switch to another user; run tend as root, or remove `user`",
                    account.uid
                ));
            }
            Ok(Some(account))
        })
        .collect()
}

/// tend's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid has no failure and no memory effects.
    unsafe { libc::geteuid() }
}

/// A signal for the core, unless it is the SIGPIPE of a write of tend's own
/// (a log line to a pipe nobody reads): that one is about tend, and the
/// write's error was handled where it happened. Not logged: the line would
/// go to the same pipe and raise the next one.
fn received(signo: i32, code: i32, from: u32, events: &mut VecDeque<Event>) {
    if !signals::from_own_write(signo, code, from) {
        events.push_back(Event::Signal { signo, from, code });
    }
}

/// What tend writes itself, which no watch may cover: the ready and status
/// files, and the `publish` directories (a symlink in a watched tree that
/// leads into one would have each publication copy the one before).
fn own_files(
    readiness: &crate::config::Readiness,
    watches: &[crate::config::Watch],
) -> Vec<PathBuf> {
    readiness
        .file
        .iter()
        .chain(&readiness.status_file)
        .chain(watches.iter().filter_map(|w| w.publish.as_ref()))
        .cloned()
        .collect()
}

/// A seed for the splay waits, different in every replica.
fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        tracing::warn!(
            "getrandom() failed ({}): splay waits use the clock as their seed",
            std::io::Error::last_os_error()
        );
        return SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
    }
    u64::from_ne_bytes(bytes)
}

fn clock() -> Now {
    Now {
        mono: Instant::now(),
        wall: SystemTime::now(),
    }
}

/// `kill(pid, signo)`, or to the process group `pid` leads. The core asks
/// only for pids it has not seen reaped; ESRCH means the process exited and
/// its SIGCHLD is on the way.
fn send(pid: Pid, group: bool, signo: i32) {
    let target = if group { -pid.as_raw() } else { pid.as_raw() };
    // SAFETY: kill has no memory effects.
    if unsafe { libc::kill(target, signo) } == -1 {
        let e = Errno::last();
        if e != Errno::ESRCH {
            tracing::warn!(
                pid = pid.as_raw(),
                "kill({target}, {}) failed: {e}",
                signals::describe(signo)
            );
        }
    }
}

/// Whether `pid` (with `group`, any process of the group it leads) is
/// stopped: state `T` in /proc/PID/stat. When /proc cannot tell (not
/// mounted, or a PID namespace other than tend's, where the same number
/// is another process), it says yes: a needless SIGCONT is better than a
/// graceful stop that waits for SIGKILL.
fn stopped(pid: Pid, group: bool) -> bool {
    let ours = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id());
    if !ours {
        return true;
    }
    let state = |pid: &str| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat_state(&stat)
    };
    if !group {
        return state(&pid.to_string()).is_some_and(|(s, _)| s == 'T');
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|name| state(&name))
        .any(|(s, pgrp)| s == 'T' && pgrp == pid.as_raw())
}

/// The state letter and the process group of a /proc/PID/stat line:
/// `PID (COMM) STATE PPID PGRP ...`, where COMM may hold spaces and ')'.
fn stat_state(stat: &str) -> Option<(char, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}

/// Whether tend's process group is the foreground of the terminal on its
/// stdin; only then does the service get the terminal (`docker run -it`).
/// A tend started in the background must not take the terminal from a shell.
fn owns_terminal() -> bool {
    // Not std's stdin, which would allocate its 8 KiB buffer for two ioctls.
    // SAFETY: fd 0 is open for all of tend's life (see main.rs).
    let stdin = unsafe { BorrowedFd::borrow_raw(libc::STDIN_FILENO) };
    nix::unistd::isatty(stdin).unwrap_or(false)
        && nix::unistd::tcgetpgrp(stdin).ok() == Some(nix::unistd::getpgrp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_and_group_are_read_past_a_command_name_with_parentheses() {
        assert_eq!(
            stat_state("42 (sh) T 1 42 42 0 -1 4194560 0"),
            Some(('T', 42))
        );
        assert_eq!(stat_state("7 (a) b (c)) S 1 9 9 0 -1"), Some(('S', 9)));
        assert_eq!(stat_state("7 (x"), None);
        assert_eq!(stat_state(""), None);
    }

    #[test]
    fn a_stopped_child_is_seen_as_stopped_and_a_running_one_is_not() {
        use nix::sys::signal::{Signal, kill};
        use nix::sys::wait::{WaitPidFlag, waitpid};
        use std::os::unix::process::CommandExt as _;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert!(!stopped(pid, false));
        assert!(!stopped(pid, true));
        kill(pid, Signal::SIGSTOP).unwrap();
        waitpid(pid, Some(WaitPidFlag::WUNTRACED)).unwrap();
        assert!(stopped(pid, false));
        assert!(stopped(pid, true));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
