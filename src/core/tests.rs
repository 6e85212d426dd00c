//! The core's transitions, against a fake clock and fake processes: every
//! test runs in microseconds, without root, and says what tend does.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::*;
use crate::config::Config;
use crate::core::protocol::{Candidate, Fingerprint, Keep, SnapshotError, test_fingerprint};
use crate::status::{State, WatchResult};

const SVC: &str = "svc";
const TERM: i32 = Signal::SIGTERM as i32;
const KILL: i32 = Signal::SIGKILL as i32;

/// What tests set besides the config.
struct Knobs {
    notify: bool,
    reload_notify: bool,
    ready_check: Option<Vec<String>>,
    ready_timeout: Duration,
    overlap: bool,
    ready_when_invalid: bool,
    seed: u64,
}

/// A core with fake processes: every spawn gets the next pid (or fails when
/// told to), and every command is kept.
struct Fake {
    core: Core,
    t0: Instant,
    elapsed: Duration,
    next_pid: i32,
    fail_next_spawn: Option<i32>,
    /// Every process spawned: pid, argv, kind.
    spawned: Vec<(Pid, Vec<String>, SpawnKind)>,
    /// The extra environment of each, in the same order.
    envs: Vec<Vec<(String, String)>>,
}

impl Fake {
    fn new(toml: &str) -> Fake {
        Fake::with(toml, true)
    }

    fn with(toml: &str, pid1: bool) -> Fake {
        Fake::custom(toml, pid1, |_| {})
    }

    fn custom(toml: &str, pid1: bool, tweak: impl FnOnce(&mut Knobs)) -> Fake {
        let config = Config::parse(toml).unwrap();
        let main = config.service();
        let mut k = Knobs {
            notify: main.notify,
            reload_notify: main.reload_notify,
            ready_check: main.ready_check.clone(),
            ready_timeout: main.ready_timeout,
            overlap: main.restart_mode == crate::config::RestartMode::Overlap,
            ready_when_invalid: false,
            seed: 1,
        };
        tweak(&mut k);
        let services = (0..config.services.len())
            .map(|i| {
                let mut s = if i == config.main {
                    let name = config.services[i].name.clone().unwrap_or(SVC.into());
                    let argv = config.services[i].command.clone();
                    service::Settings::from_config(
                        &config,
                        i,
                        name,
                        argv.unwrap_or(vec![SVC.into()]),
                    )
                } else {
                    let argv = config.services[i].command.clone().unwrap();
                    service::Settings::from_config(&config, i, config.service_name(i, None), argv)
                };
                if i == config.main {
                    s.notify = k.notify;
                    s.reload_notify = k.reload_notify;
                    s.ready_check = k.ready_check.clone();
                    s.ready_timeout = k.ready_timeout;
                    s.overlap = k.overlap;
                }
                s
            })
            .collect();
        let settings = Settings {
            services,
            main: ServiceId(config.main),
            pid1,
            readiness_files: true,
            ready_when_invalid: k.ready_when_invalid,
            seed: k.seed,
        };
        Fake {
            core: Core::new(settings, &config.watches),
            t0: Instant::now(),
            elapsed: Duration::ZERO,
            next_pid: 100,
            fail_next_spawn: None,
            spawned: Vec::new(),
            envs: Vec::new(),
        }
    }

    fn now(&self) -> Now {
        Now {
            mono: self.t0 + self.elapsed,
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + self.elapsed,
        }
    }

    /// Feeds `event`, answering spawns as the shell would; returns every
    /// command in the order the shell would perform them.
    fn send(&mut self, event: Event) -> Vec<Command> {
        let mut all = Vec::new();
        let mut queue = std::collections::VecDeque::from([event]);
        while let Some(ev) = queue.pop_front() {
            for c in self.core.handle(self.now(), ev) {
                if let Command::Spawn {
                    token,
                    argv,
                    kind,
                    env,
                } = &c
                {
                    let result = match self.fail_next_spawn.take() {
                        Some(code) => Err(SpawnFailure {
                            message: format!("cannot run {:?}", argv[0]),
                            exit_code: code,
                        }),
                        None => {
                            self.next_pid += 1;
                            let pid = Pid::from_raw(self.next_pid);
                            self.spawned.push((pid, argv.clone(), *kind));
                            self.envs.push(env.clone());
                            Ok(pid)
                        }
                    };
                    queue.push_back(Event::Spawned {
                        token: *token,
                        result,
                    });
                }
                all.push(c);
            }
        }
        all
    }

    fn tick(&mut self) -> Vec<Command> {
        self.send(Event::Tick)
    }

    /// Lets `secs` pass, then ticks.
    fn after(&mut self, secs: f64) -> Vec<Command> {
        self.elapsed += Duration::from_secs_f64(secs);
        self.tick()
    }

    /// Jumps to the core's next deadline and ticks.
    fn at_deadline(&mut self) -> Vec<Command> {
        let d = self.core.deadline().expect("a deadline is pending");
        self.elapsed = d - self.t0;
        self.tick()
    }

    fn content(&mut self, watch: usize, n: u8) -> Vec<Command> {
        self.send(Event::Content(Report {
            watch: WatchId(watch),
            fingerprint: test_fingerprint(n),
            changed: Vec::new(),
            files: 1,
            missing: Vec::new(),
            unreadable: Vec::new(),
        }))
    }

    fn exit(&mut self, pid: Pid, status: ExitStatus) -> Vec<Command> {
        self.send(Event::Reaped {
            exits: vec![Exit {
                pid,
                status,
                output: Some(String::new()),
            }],
            no_children: false,
        })
    }

    fn exit_with_output(&mut self, pid: Pid, status: ExitStatus, output: &str) -> Vec<Command> {
        self.send(Event::Reaped {
            exits: vec![Exit {
                pid,
                status,
                output: Some(output.into()),
            }],
            no_children: false,
        })
    }

    fn no_children(&mut self) -> Vec<Command> {
        self.send(Event::Reaped {
            exits: vec![],
            no_children: true,
        })
    }

    fn signal(&mut self, signo: i32) -> Vec<Command> {
        self.send(Event::Signal {
            signo,
            from: 7,
            code: 0,
        })
    }

    /// The pids of every service process started.
    fn services(&self) -> Vec<Pid> {
        self.spawned
            .iter()
            .filter(|(_, _, k)| *k == SpawnKind::Service(ServiceId(0)))
            .map(|(p, _, _)| *p)
            .collect()
    }

    fn service(&self) -> Pid {
        *self.services().last().expect("a service was started")
    }

    /// The pid of the last job spawned with `argv[0] == program`.
    fn job(&self, program: &str) -> Pid {
        self.spawned
            .iter()
            .rev()
            .find(|(_, argv, k)| matches!(k, SpawnKind::Job(_)) && argv[0] == program)
            .map(|(p, _, _)| *p)
            .unwrap_or_else(|| panic!("no job {program:?} was started"))
    }

    fn jobs(&self, program: &str) -> usize {
        self.spawned
            .iter()
            .filter(|(_, argv, k)| matches!(k, SpawnKind::Job(_)) && argv[0] == program)
            .count()
    }

    fn state(&mut self) -> (State, bool) {
        let s = self.core.status();
        (s.state, s.ready)
    }

    fn result(&mut self, watch: usize) -> WatchResult {
        self.core.status().watches[watch].result
    }

    /// Starts the service on content 0 of every watch, each passing its check.
    fn started(toml: &str, watches: usize) -> Fake {
        let mut f = Fake::new(toml);
        f.tick();
        for w in 0..watches {
            f.content(w, 0);
        }
        while let Some(pid) = f.running_check() {
            f.exit(pid, OK);
        }
        assert_eq!(f.services().len(), 1, "the service started");
        assert_eq!(f.state(), (State::Ready, true));
        f
    }

    /// The pid of the last instance of the service whose command is
    /// `program`.
    fn pid_of(&self, program: &str) -> Pid {
        self.spawned
            .iter()
            .rev()
            .find(|(_, argv, k)| matches!(k, SpawnKind::Service(_)) && argv[0] == program)
            .map(|(p, _, _)| *p)
            .unwrap_or_else(|| panic!("{program:?} was never started"))
    }

    /// How many instances of the service whose command is `program` started.
    fn starts(&self, program: &str) -> usize {
        self.spawned
            .iter()
            .filter(|(_, argv, k)| matches!(k, SpawnKind::Service(_)) && argv[0] == program)
            .count()
    }

    /// Service `name` as the status file lists it.
    fn service_entry(&mut self, name: &str) -> crate::core::status::ServiceEntry {
        self.core
            .status()
            .services
            .into_iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no service {name:?}"))
    }

    fn service_state(&mut self, name: &str) -> String {
        self.service_entry(name).state
    }

    /// A check job that has not exited yet, if any.
    fn running_check(&self) -> Option<Pid> {
        self.core
            .jobs
            .iter()
            .find(|j| matches!(j.role, JobRole::Check(..)))
            .map(|j| j.pid)
    }
}

const OK: ExitStatus = ExitStatus::Code(0);
const FAIL: ExitStatus = ExitStatus::Code(1);

fn signalled(commands: &[Command], pid: Pid) -> Vec<i32> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Signal { pid: p, signo, .. } if *p == pid => Some(*signo),
            _ => None,
        })
        .collect()
}

/// Whether `commands` ask for SIGCONT to `pid` in case it is stopped.
fn continued(commands: &[Command], pid: Pid) -> bool {
    commands
        .iter()
        .any(|c| matches!(c, Command::ContinueIfStopped { pid: p, .. } if *p == pid))
}

fn exited(commands: &[Command]) -> Option<i32> {
    commands.iter().find_map(|c| match c {
        Command::Exit(code) => Some(*code),
        _ => None,
    })
}

fn spawns(commands: &[Command]) -> Vec<SpawnKind> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Spawn { kind, .. } => Some(*kind),
            _ => None,
        })
        .collect()
}

const CHECKED: &str =
    "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"signal\"\n";
const CHECKED_RESTART: &str = "[service]\nrestart = \"on-failure\"\n[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"signal\"\n";
const TWO: &str = "[[watch]]\nname = \"a\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"signal\"\n\
                   [[watch]]\nname = \"b\"\npaths = [\"/b\"]\ncheck = [\"check\"]\non_change = \"signal\"\n";

// ---------------------------------------------------------------- start

#[test]
fn without_watches_the_service_starts_at_once_and_tend_is_ready() {
    let mut f = Fake::new("");
    assert_eq!(spawns(&f.tick()), vec![SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None, "idle: nothing is due");
}

#[test]
fn the_service_starts_only_once_every_watch_passed_its_check() {
    let mut f = Fake::new(TWO);
    assert!(spawns(&f.tick()).is_empty());
    assert_eq!(f.state(), (State::Starting, false));
    f.content(0, 1);
    let a = f.job("check");
    f.content(1, 1);
    let b = f.job("check");
    assert_ne!(a, b);
    f.exit(a, OK);
    assert!(f.services().is_empty(), "b is still being checked");
    f.exit(b, FAIL);
    assert!(f.services().is_empty(), "b is invalid");
    assert_eq!(f.state(), (State::InvalidConfig, false));
    f.content(1, 2);
    f.exit(f.job("check"), OK);
    assert_eq!(f.services().len(), 1);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.result(1), WatchResult::Applied);
}

#[test]
fn the_first_start_failing_exits_with_the_shells_status_whatever_the_policy() {
    let mut f = Fake::new("[service]\nrestart = \"always\"\n");
    f.fail_next_spawn = Some(127);
    let c = f.tick();
    assert_eq!(
        c,
        vec![
            Command::Spawn {
                token: 1,
                argv: vec![SVC.into()],
                kind: SpawnKind::Service(ServiceId(0)),
                env: Vec::new(),
            },
            Command::Reap
        ]
    );
    assert_eq!(exited(&f.no_children()), Some(127));
}

#[test]
fn a_later_start_failure_follows_the_restart_policy() {
    let mut f = Fake::new("[service]\nrestart = \"always\"\n");
    f.tick();
    f.exit(f.service(), OK);
    f.fail_next_spawn = Some(126);
    f.at_deadline();
    assert_eq!(f.services().len(), 1, "the start failed");
    assert_eq!(f.state(), (State::Restarting, false));
    f.at_deadline();
    assert_eq!(
        f.services().len(),
        2,
        "and is tried again after the back-off"
    );
}

// ---------------------------------------------------------------- checks

#[test]
fn a_failed_check_is_checked_again_with_a_doubling_back_off_until_it_passes() {
    let mut f = Fake::new(CHECKED);
    f.tick();
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    let mut waits = Vec::new();
    for _ in 0..8 {
        let d = f.core.deadline().unwrap() - (f.t0 + f.elapsed);
        waits.push(d.as_secs());
        f.at_deadline();
        f.exit(f.job("check"), FAIL);
    }
    assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60]);
    assert!(f.services().is_empty());
    assert_eq!(f.jobs("check"), 9);
    f.at_deadline();
    f.exit(f.job("check"), OK);
    assert_eq!(
        f.services().len(),
        1,
        "a recheck that passes starts the service"
    );
    assert_eq!(f.core.deadline(), None, "healthy again: nothing is due");
}

#[test]
fn a_change_resets_the_recheck_back_off() {
    let mut f = Fake::new(CHECKED);
    f.tick();
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    f.at_deadline();
    f.exit(f.job("check"), FAIL);
    assert_eq!(
        f.core.deadline().unwrap() - (f.t0 + f.elapsed),
        Duration::from_secs(2)
    );
    // New content that fails too starts again from the first delay.
    f.content(0, 4);
    f.exit(f.job("check"), FAIL);
    assert_eq!(
        f.core.deadline().unwrap() - (f.t0 + f.elapsed),
        Duration::from_secs(1)
    );
    f.content(0, 2);
    f.exit(f.job("check"), OK);
    f.content(0, 3);
    f.exit(f.job("check"), FAIL);
    assert_eq!(
        f.core.deadline().unwrap() - (f.t0 + f.elapsed),
        Duration::from_secs(1)
    );
}

#[test]
fn a_check_past_its_timeout_is_killed_with_its_group_and_counts_as_invalid() {
    let mut f = Fake::started(
        "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\ncheck_timeout = \"5s\"\non_change = \"signal\"\n",
        1,
    );
    f.content(0, 1);
    let check = f.job("check");
    assert_eq!(
        f.core.deadline(),
        Some(f.t0 + f.elapsed + Duration::from_secs(5))
    );
    let c = f.at_deadline();
    assert_eq!(
        c,
        vec![Command::Signal {
            pid: check,
            group: true,
            signo: KILL
        }]
    );
    f.exit_with_output(check, ExitStatus::Signal(KILL), "partial output");
    let st = f.core.status();
    assert_eq!(st.watches[0].result, WatchResult::Invalid);
    assert!(
        st.watches[0].check_output.contains("timed out after 5s"),
        "{}",
        st.watches[0].check_output
    );
    assert!(!st.ready);
    assert!(
        signalled(&f.tick(), f.service()).is_empty(),
        "the service is left alone"
    );
}

#[test]
fn a_burst_of_changes_is_checked_once_more_with_the_newest_content() {
    let mut f = Fake::started(CHECKED, 1);
    f.content(0, 1);
    let first = f.job("check");
    for n in 2..=30 {
        assert!(spawns(&f.content(0, n)).is_empty(), "one check at a time");
    }
    let c = f.exit(first, OK);
    assert_eq!(
        spawns(&c),
        vec![SpawnKind::Job(ServiceId(0))],
        "the stale result is dropped"
    );
    assert!(signalled(&c, f.service()).is_empty());
    let c = f.exit(f.job("check"), OK);
    assert_eq!(signalled(&c, f.service()), vec![Signal::SIGHUP as i32]);
    assert_eq!(
        f.jobs("check"),
        3,
        "start-up, the first of the burst, the last"
    );
}

#[test]
fn the_same_content_is_not_a_change() {
    let mut f = Fake::started(CHECKED, 1);
    assert!(f.content(0, 0).is_empty());
    assert_eq!(f.jobs("check"), 1);
}

// ---------------------------------------------------------------- actions

#[test]
fn watches_that_change_together_are_signalled_once() {
    let mut f = Fake::started(TWO, 2);
    f.content(0, 1);
    let a = f.job("check");
    f.content(1, 1);
    let b = f.job("check");
    assert!(
        signalled(&f.exit(a, OK), f.service()).is_empty(),
        "b's check is still to come"
    );
    let c = f.exit(b, OK);
    assert_eq!(signalled(&c, f.service()), vec![Signal::SIGHUP as i32]);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_valid_change_keeps_tend_ready_while_it_is_checked() {
    let mut f = Fake::started(CHECKED, 1);
    f.content(0, 1);
    assert_eq!(f.state(), (State::Reloading, true));
    assert_eq!(f.result(0), WatchResult::Pending);
    f.exit(f.job("check"), OK);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn an_invalid_change_leaves_the_service_alone_and_turns_readiness_off() {
    let mut f = Fake::started(CHECKED, 1);
    f.content(0, 1);
    let c = f.exit_with_output(f.job("check"), FAIL, "line 2: unknown directive");
    assert!(signalled(&c, f.service()).is_empty());
    let st = f.core.status();
    assert_eq!((st.state, st.ready), (State::InvalidConfig, false));
    assert_eq!(st.watches[0].check_output, "line 2: unknown directive");
    f.content(0, 2);
    let c = f.exit(f.job("check"), OK);
    assert_eq!(signalled(&c, f.service()), vec![Signal::SIGHUP as i32]);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_restart_action_stops_the_service_and_starts_it_on_the_new_config() {
    let toml = "[service]\nstop_signal = \"SIGQUIT\"\nstop_timeout = \"3s\"\n[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"restart\"\n";
    let mut f = Fake::started(toml, 1);
    let old = f.service();
    f.content(0, 1);
    let c = f.exit(f.job("check"), OK);
    assert_eq!(signalled(&c, old), vec![Signal::SIGQUIT as i32]);
    assert!(continued(&c, old), "{c:?}");
    assert_eq!(f.state(), (State::Restarting, false));
    let c = f.exit(old, ExitStatus::Code(0));
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.status().service.restarts, 1);
}

#[test]
fn a_change_during_a_restart_is_checked_before_the_service_starts_again() {
    let toml = "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"restart\"\n";
    let mut f = Fake::started(toml, 1);
    let old = f.service();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    f.content(0, 2);
    let c = f.exit(old, OK);
    assert!(
        !spawns(&c).contains(&SpawnKind::Service(ServiceId(0))),
        "content 2 is not checked yet"
    );
    assert_eq!(f.state(), (State::Restarting, false));
    let c = f.exit(f.job("check"), FAIL);
    assert!(spawns(&c).is_empty());
    assert_eq!(f.state(), (State::InvalidConfig, false));
    f.content(0, 3);
    let c = f.exit(f.job("check"), OK);
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_failed_exec_is_retried_with_a_growing_back_off() {
    let toml =
        "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\non_change = \"exec\"\nexec = [\"reload\"]\n";
    let mut f = Fake::started(toml, 1);
    f.content(0, 1);
    let mut waits = Vec::new();
    for _ in 0..6 {
        f.exit(f.job("reload"), FAIL);
        assert_eq!(f.state(), (State::Reloading, false));
        assert_eq!(f.result(0), WatchResult::ActionFailed);
        waits.push((f.core.deadline().unwrap() - (f.t0 + f.elapsed)).as_secs());
        f.at_deadline();
    }
    assert_eq!(waits, vec![1, 2, 4, 8, 16, 30]);
    f.exit(f.job("reload"), OK);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn identical_execs_run_once_for_all_their_watches() {
    let toml = "[[watch]]\nname = \"a\"\npaths = [\"/a\"]\non_change = \"exec\"\nexec = [\"reload\"]\n\
                [[watch]]\nname = \"b\"\npaths = [\"/b\"]\non_change = \"exec\"\nexec = [\"reload\"]\n\
                [[watch]]\nname = \"c\"\npaths = [\"/c\"]\ncheck = [\"check\"]\non_change = \"none\"\n";
    let mut f = Fake::started(toml, 3);
    f.content(2, 1);
    f.content(0, 1);
    f.content(1, 1);
    assert_eq!(f.jobs("reload"), 0, "actions wait for c's check");
    f.exit(f.job("check"), OK);
    assert_eq!(f.jobs("reload"), 1);
    f.exit(f.job("reload"), OK);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_restart_covers_every_other_action() {
    let toml = "[[watch]]\nname = \"a\"\npaths = [\"/a\"]\non_change = \"restart\"\n\
                [[watch]]\nname = \"b\"\npaths = [\"/b\"]\ncheck = [\"check\"]\non_change = \"exec\"\nexec = [\"reload\"]\n";
    let mut f = Fake::started(toml, 2);
    let old = f.service();
    f.content(1, 1);
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    assert_eq!(f.jobs("reload"), 0);
    f.exit(old, OK);
    assert_eq!(f.services().len(), 2);
    assert_eq!(f.state(), (State::Ready, true));
}

// ---------------------------------------------------------------- crashes

#[test]
fn restart_back_off_doubles_and_resets_after_a_long_run() {
    let mut f = Fake::new("[service]\nrestart = \"always\"\n");
    f.tick();
    let mut waits = Vec::new();
    for _ in 0..7 {
        f.after(0.5);
        f.exit(f.service(), OK);
        assert_eq!(f.state(), (State::Restarting, false));
        waits.push((f.core.deadline().unwrap() - (f.t0 + f.elapsed)).as_secs());
        f.at_deadline();
    }
    assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30]);
    f.after(10.0);
    f.exit(f.service(), OK);
    assert_eq!(
        f.core.deadline().unwrap() - (f.t0 + f.elapsed),
        Duration::from_secs(1)
    );
}

#[test]
fn on_failure_ends_tend_on_a_clean_exit() {
    let mut f = Fake::new("[service]\nrestart = \"on-failure\"\n");
    f.tick();
    assert_eq!(f.exit(f.service(), OK), vec![Command::Reap]);
    assert_eq!(exited(&f.no_children()), Some(0));
}

#[test]
fn a_service_that_crashes_while_the_config_is_invalid_stays_down_until_a_valid_one_arrives() {
    let mut f = Fake::started(CHECKED_RESTART, 1);
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    f.exit(f.service(), ExitStatus::Signal(Signal::SIGSEGV as i32));
    f.at_deadline(); // the back-off ends; a recheck is due too
    assert_eq!(
        f.services().len(),
        1,
        "not restarted on the rejected config"
    );
    assert_eq!(f.state(), (State::InvalidConfig, false));
    f.after(300.0);
    f.exit(f.job("check"), FAIL);
    assert_eq!(f.services().len(), 1);
    f.content(0, 2);
    let c = f.exit(f.job("check"), OK);
    assert_eq!(
        spawns(&c),
        vec![SpawnKind::Service(ServiceId(0))],
        "starts as soon as a valid config arrives"
    );
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_service_that_crashes_while_a_check_runs_starts_only_once_it_passed() {
    let mut f = Fake::started(CHECKED_RESTART, 1);
    f.content(0, 1);
    let check = f.job("check");
    f.exit(f.service(), FAIL);
    f.at_deadline();
    assert_eq!(f.services().len(), 1, "content 1 is not checked yet");
    assert!(!f.state().1, "never ready on unchecked content");
    let c = f.exit(check, FAIL);
    assert!(
        spawns(&c)
            .iter()
            .all(|k| *k != SpawnKind::Service(ServiceId(0)))
    );
    assert_eq!(f.state(), (State::InvalidConfig, false));
    // The same content passes a recheck (an upstream name resolves now).
    f.at_deadline();
    let c = f.exit(f.job("check"), OK);
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.state(), (State::Ready, true));
}

// ---------------------------------------------------------------- stopping

#[test]
fn sigterm_stops_the_service_gracefully_then_kills_it() {
    let mut f = Fake::new("[service]\nstop_timeout = \"10s\"\n");
    f.tick();
    let svc = f.service();
    let c = f.signal(TERM);
    assert_eq!(signalled(&c, svc), vec![TERM]);
    assert!(continued(&c, svc), "{c:?}");
    assert_eq!(f.state(), (State::Stopping, false));
    assert_eq!(
        f.core.deadline(),
        Some(f.t0 + f.elapsed + Duration::from_secs(10))
    );
    assert!(
        signalled(&f.signal(TERM), svc).is_empty(),
        "a second SIGTERM changes nothing"
    );
    assert_eq!(signalled(&f.at_deadline(), svc), vec![KILL]);
    assert_eq!(f.core.deadline(), None);
    assert_eq!(f.exit(svc, ExitStatus::Signal(KILL)), vec![Command::Reap]);
    assert_eq!(exited(&f.no_children()), Some(137));
}

#[test]
fn leftovers_in_the_container_get_sigterm_then_sigkill_before_pid1_exits() {
    let mut f = Fake::new("[service]\nstop_timeout = \"4s\"\n");
    f.tick();
    f.exit(f.service(), ExitStatus::Code(3));
    let c = f.send(Event::Reaped {
        exits: vec![],
        no_children: false,
    });
    assert_eq!(c, vec![Command::SignalEveryone(TERM)]);
    assert_eq!(
        f.core.deadline(),
        Some(f.t0 + f.elapsed + Duration::from_secs(4))
    );
    assert_eq!(f.at_deadline(), vec![Command::SignalEveryone(KILL)]);
    assert_eq!(
        f.at_deadline(),
        vec![Command::Exit(3)],
        "exits anyway after the grace"
    );
}

#[test]
fn as_a_subreaper_tend_exits_without_touching_other_processes() {
    let mut f = Fake::with("", false);
    f.tick();
    assert_eq!(
        f.exit(f.service(), ExitStatus::Code(4)),
        vec![Command::Exit(4)]
    );
}

#[test]
fn sigterm_in_every_phase() {
    // Starting, waiting for a valid config.
    let mut f = Fake::new(CHECKED);
    f.tick();
    f.content(0, 1);
    let check = f.job("check");
    let c = f.signal(TERM);
    assert_eq!(signalled(&c, check), vec![KILL], "the check is killed");
    assert!(c.contains(&Command::Reap));
    assert_eq!(exited(&f.no_children()), Some(143));

    // Backing off after a crash.
    let mut f = Fake::new("[service]\nrestart = \"always\"\n");
    f.tick();
    f.exit(f.service(), FAIL);
    f.signal(TERM);
    assert_eq!(exited(&f.no_children()), Some(143));
    assert_eq!(f.services().len(), 1);

    // Waiting for a valid config after a crash.
    let mut f = Fake::started(CHECKED_RESTART, 1);
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    f.exit(f.service(), FAIL);
    f.after(1.0);
    f.signal(TERM);
    assert_eq!(exited(&f.no_children()), Some(143));

    // Restarting: the old instance is already stopping; its status is tend's.
    let toml = "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\non_change = \"restart\"\n";
    let mut f = Fake::started(toml, 1);
    let old = f.service();
    f.content(0, 1);
    assert!(
        signalled(&f.signal(TERM), old).is_empty(),
        "no second stop signal"
    );
    f.exit(old, ExitStatus::Code(0));
    assert_eq!(exited(&f.no_children()), Some(0));
    assert_eq!(f.services().len(), 1, "not started again");

    // Draining: nothing more happens.
    let mut f = Fake::new("");
    f.tick();
    f.exit(f.service(), ExitStatus::Code(5));
    f.send(Event::Reaped {
        exits: vec![],
        no_children: false,
    });
    assert!(f.signal(TERM).is_empty());
    assert_eq!(exited(&f.no_children()), Some(5));
}

#[test]
fn sigint_stops_tend_only_while_no_service_process_exists() {
    let mut f = Fake::new("");
    f.tick();
    let svc = f.service();
    let c = f.signal(Signal::SIGINT as i32);
    assert_eq!(
        c,
        vec![Command::Forward {
            pid: svc,
            group: false,
            signo: Signal::SIGINT as i32,
            from: 7
        }]
    );
    let mut f = Fake::new(CHECKED);
    f.tick();
    f.signal(Signal::SIGINT as i32);
    assert_eq!(exited(&f.no_children()), Some(130));
}

#[test]
fn signals_are_forwarded_to_the_service_or_its_group() {
    let mut f = Fake::new("[service]\nprocess_group = true\n");
    f.tick();
    let svc = f.service();
    for signo in [Signal::SIGHUP as i32, Signal::SIGUSR1 as i32, 34, 36, 64] {
        assert_eq!(
            f.signal(signo),
            vec![Command::Forward {
                pid: svc,
                group: true,
                signo,
                from: 7
            }]
        );
    }
    let c = f.signal(TERM);
    assert_eq!(
        c[..2],
        [
            Command::Signal {
                pid: svc,
                group: true,
                signo: TERM
            },
            Command::ContinueIfStopped {
                pid: svc,
                group: true,
            }
        ]
    );
}

#[test]
fn a_signal_while_no_service_runs_is_dropped() {
    let mut f = Fake::new(CHECKED);
    f.tick();
    assert!(f.signal(Signal::SIGHUP as i32).is_empty());
}

#[test]
fn checks_and_their_results_are_dropped_once_tend_stops() {
    let mut f = Fake::started(CHECKED, 1);
    f.content(0, 1);
    let check = f.job("check");
    let svc = f.service();
    let c = f.signal(TERM);
    assert_eq!(signalled(&c, check), vec![KILL]);
    assert!(
        f.exit(check, FAIL).is_empty(),
        "nothing to say about a killed check"
    );
    assert!(f.content(0, 2).is_empty(), "no new checks while stopping");
    f.exit(svc, OK);
    assert_eq!(exited(&f.no_children()), Some(0));
}

// ---------------------------------------------------------------- generations

const RESTART: &str =
    "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"restart\"\n";
const SIGNAL: &str = "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\non_change = \"signal\"\n";

fn notify(f: &mut Fake, pid: Pid, text: &str) -> Vec<Command> {
    f.send(Event::Notify {
        chain: vec![Pid::from_raw(9999), pid],
        message: Notification::parse(text.as_bytes()),
    })
}

/// A service with notify, started on content 0 and ready.
fn notifying(toml: &str, overlap: bool) -> Fake {
    let mut f = Fake::custom(toml, true, |s| {
        s.notify = true;
        s.overlap = overlap;
        s.ready_timeout = Duration::from_secs(5);
    });
    f.tick();
    f.content(0, 0);
    if let Some(pid) = f.running_check() {
        f.exit(pid, OK);
    }
    assert_eq!(
        f.state(),
        (State::Starting, false),
        "not ready before READY=1"
    );
    let svc = f.service();
    notify(&mut f, svc, "READY=1\nSTATUS=serving\n");
    assert_eq!(f.state(), (State::Ready, true));
    f
}

#[test]
fn notifications_are_parsed_as_sd_notify_assignments() {
    let n = Notification::parse(b"READY=1\nSTATUS=Listening on :8080\nMAINPID=4\n");
    assert!(n.ready && !n.reloading && !n.stopping);
    assert_eq!(n.status.as_deref(), Some("Listening on :8080"));
    assert_eq!(Notification::parse(b"READY=0"), Notification::default());
    assert!(Notification::parse(b"RELOADING=1\nMONOTONIC_USEC=1").reloading);
}

#[test]
fn with_notify_tend_is_ready_only_after_ready_1() {
    let mut f = notifying(SIGNAL, false);
    assert_eq!(f.core.status().service.status.as_deref(), Some("serving"));
    let svc = f.service();
    notify(&mut f, svc, "STOPPING=1");
    assert!(
        !f.state().1,
        "a service that says it is stopping is not ready"
    );
}

#[test]
fn a_notification_from_outside_the_service_tree_is_ignored() {
    let mut f = Fake::custom("", true, |s| s.notify = true);
    f.tick();
    f.send(Event::Notify {
        chain: vec![Pid::from_raw(5000), Pid::from_raw(1)],
        message: Notification::parse(b"READY=1"),
    });
    assert!(!f.state().1);
}

/// The warning for a flood from outside is rate-limited: the count of what
/// was held back is due once the interval is over, and only then is there
/// a timer.
#[test]
fn a_flood_from_outside_the_service_tree_holds_a_timer_only_while_a_count_is_due() {
    let mut f = notifying(SIGNAL, false);
    assert_eq!(f.core.deadline(), None, "ready and idle");
    let outside = |f: &mut Fake| {
        f.send(Event::Notify {
            chain: vec![Pid::from_raw(5000), Pid::from_raw(1)],
            message: Notification::parse(b"READY=1\nSTATUS=not the service"),
        })
    };
    outside(&mut f);
    assert_eq!(f.core.deadline(), None, "the first one is said at once");
    for _ in 0..1000 {
        outside(&mut f);
        f.elapsed += Duration::from_millis(1);
    }
    assert_eq!(
        f.core.ignored_notifications.due(),
        Some(f.t0 + IGNORED_WARN_EVERY)
    );
    assert_eq!(f.core.deadline(), Some(f.t0 + IGNORED_WARN_EVERY));
    f.at_deadline();
    assert_eq!(f.core.deadline(), None, "said: no timer left");
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.status().service.status.as_deref(), Some("serving"));
}

#[test]
fn a_start_not_ready_in_time_is_told_with_what_tend_last_heard_from_it() {
    let mut f = Fake::custom("[service]\nrestart = \"on-failure\"\n", true, |s| {
        s.notify = true;
        s.ready_timeout = Duration::from_secs(5);
    });
    f.tick();
    let svc = f.service();
    let nothing = " (nothing was received on NOTIFY_SOCKET from it)";
    assert_eq!(f.core.last_heard(svc), nothing);
    f.send(Event::Notify {
        chain: vec![Pid::from_raw(5000), Pid::from_raw(1)],
        message: Notification::parse(b"STATUS=from outside"),
    });
    assert_eq!(f.core.last_heard(svc), nothing, "not from the service");
    notify(&mut f, svc, "MAINPID=4");
    assert_eq!(
        f.core.last_heard(svc),
        " (it sent notifications, none with READY=1 or STATUS=)"
    );
    notify(&mut f, svc, "STATUS=loading \x1b[2Jthe cache");
    notify(&mut f, svc, "EXTEND_TIMEOUT_USEC=1");
    assert_eq!(
        f.core.last_heard(svc),
        " (last heard: STATUS=loading \\x1b[2Jthe cache)",
        "the last STATUS=, escaped"
    );
    f.at_deadline();
    f.exit(svc, ExitStatus::Code(0));
    assert_eq!(
        f.core.last_heard(svc),
        nothing,
        "forgotten with the process"
    );
    // Without notify there is nothing to tell.
    let mut f = Fake::custom("", true, |s| s.ready_check = Some(vec!["probe".into()]));
    f.tick();
    assert_eq!(f.core.last_heard(f.service()), "");
}

#[test]
fn a_start_not_ready_within_ready_timeout_has_failed() {
    let mut f = Fake::custom("[service]\nrestart = \"on-failure\"\n", true, |s| {
        s.notify = true;
        s.ready_timeout = Duration::from_secs(5);
    });
    f.tick();
    let svc = f.service();
    assert_eq!(f.core.deadline(), Some(f.t0 + Duration::from_secs(5)));
    let c = f.at_deadline();
    assert_eq!(signalled(&c, svc), vec![TERM]);
    f.exit(svc, ExitStatus::Code(0));
    assert_eq!(f.state(), (State::Restarting, false));
    f.at_deadline();
    assert_eq!(f.services().len(), 2, "the restart policy applies");
}

#[test]
fn with_notify_a_signal_reload_is_applied_once_the_signal_is_sent() {
    // systemd's Type=notify: php-fpm answers SIGUSR2 with READY=1 only,
    // gunicorn answers SIGHUP with nothing.
    let mut f = notifying(SIGNAL, false);
    let svc = f.service();
    let c = f.content(0, 1);
    assert_eq!(signalled(&c, svc), vec![Signal::SIGHUP as i32]);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None, "nothing to wait for");
    notify(&mut f, svc, "READY=1");
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_reload_the_service_announces_takes_readiness_off_until_its_ready_1() {
    let mut f = notifying(SIGNAL, false);
    let svc = f.service();
    f.content(0, 1);
    notify(&mut f, svc, "RELOADING=1");
    assert_eq!(
        f.state(),
        (State::Reloading, false),
        "not ready while it reloads"
    );
    assert_eq!(f.result(0), WatchResult::Applied, "the change was applied");
    notify(&mut f, svc, "READY=1");
    assert_eq!(f.state(), (State::Ready, true));
    // Announced on its own account, and never finished: the instance has
    // failed, as a start that never becomes ready has.
    notify(&mut f, svc, "RELOADING=1");
    assert_eq!(
        f.core.deadline(),
        Some(f.now().mono + Duration::from_secs(5))
    );
    let c = f.at_deadline();
    assert_eq!(signalled(&c, svc), vec![TERM]);
}

#[test]
fn with_reload_notify_a_signal_reload_is_applied_once_the_service_confirms_it() {
    let mut f = notifying(
        &format!("[service]\nnotify = true\nreload_notify = true\n{SIGNAL}"),
        false,
    );
    let svc = f.service();
    let c = f.content(0, 1);
    assert_eq!(signalled(&c, svc), vec![Signal::SIGHUP as i32]);
    assert_eq!(f.result(0), WatchResult::Pending);
    notify(&mut f, svc, "READY=1");
    assert_eq!(
        f.result(0),
        WatchResult::Pending,
        "READY=1 alone is not a reload"
    );
    notify(&mut f, svc, "RELOADING=1");
    notify(&mut f, svc, "READY=1");
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    // Unconfirmed: the action failed after ready_timeout, and is retried.
    f.content(0, 2);
    f.at_deadline();
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    let c = f.at_deadline();
    assert_eq!(signalled(&c, svc), vec![Signal::SIGHUP as i32], "retried");
}

#[test]
fn with_ready_check_the_service_is_ready_once_it_passes() {
    let mut f = Fake::custom("", true, |s| {
        s.ready_check = Some(vec!["probe".into()]);
        s.ready_timeout = Duration::from_secs(10);
    });
    f.tick();
    let first = f.job("probe");
    f.exit(first, FAIL);
    assert!(!f.state().1);
    assert_eq!(f.jobs("probe"), 1, "the next try waits a moment");
    f.after(0.1);
    f.exit(f.job("probe"), FAIL);
    f.after(0.2);
    assert_eq!(f.jobs("probe"), 3);
    f.exit(f.job("probe"), OK);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn an_overlap_restart_stops_the_old_instance_only_once_the_new_one_is_ready() {
    let mut f = notifying(RESTART, true);
    let old = f.service();
    f.content(0, 1);
    let c = f.exit(f.job("check"), OK);
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(0))]);
    assert!(signalled(&c, old).is_empty(), "the old one keeps serving");
    let new = f.service();
    let st = f.core.status();
    assert_eq!((st.state, st.ready), (State::Restarting, true));
    assert_eq!(st.service.pid, Some(old.as_raw()));
    assert_eq!(st.service.instances.len(), 2);
    assert_eq!(
        f.signal(Signal::SIGUSR1 as i32),
        vec![Command::Forward {
            pid: old,
            group: false,
            signo: Signal::SIGUSR1 as i32,
            from: 7
        }],
        "signals go to the generation that serves"
    );
    let c = notify(&mut f, new, "READY=1");
    assert_eq!(signalled(&c, old), vec![TERM]);
    let st = f.core.status();
    assert_eq!((st.state, st.ready), (State::Ready, true));
    assert_eq!(st.service.pid, Some(new.as_raw()));
    assert_eq!(st.watches[0].result, WatchResult::Applied);
    assert!(
        f.exit(old, OK).is_empty(),
        "the old one is gone; nothing else happens"
    );
    assert_eq!(f.core.status().service.instances.len(), 1);
}

#[test]
fn a_new_instance_that_crashes_before_ready_leaves_the_old_one_serving() {
    let mut f = notifying(RESTART, true);
    let old = f.service();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    let new = f.service();
    let c = f.exit(new, FAIL);
    assert!(signalled(&c, old).is_empty());
    let st = f.core.status();
    assert!(!st.ready, "the config was not applied");
    assert_eq!(st.service.pid, Some(old.as_raw()));
    assert_eq!(st.watches[0].result, WatchResult::ActionFailed);
    f.at_deadline();
    assert_eq!(f.services().len(), 3, "the restart is retried");
}

#[test]
fn a_new_instance_not_ready_in_time_is_stopped_and_the_old_one_keeps_serving() {
    let mut f = notifying(RESTART, true);
    let old = f.service();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    let new = f.service();
    let c = f.at_deadline();
    assert_eq!(signalled(&c, new), vec![TERM]);
    assert!(signalled(&c, old).is_empty());
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    f.exit(new, ExitStatus::Signal(TERM));
    assert_eq!(f.core.status().service.pid, Some(old.as_raw()));
}

#[test]
fn sigterm_during_an_overlap_stops_both_and_exits_with_the_serving_ones_status() {
    let mut f = notifying(RESTART, true);
    let old = f.service();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    let new = f.service();
    let c = f.signal(TERM);
    assert_eq!(signalled(&c, old), vec![TERM]);
    assert_eq!(signalled(&c, new), vec![TERM]);
    assert!(
        f.exit(old, ExitStatus::Code(3)).is_empty(),
        "waits for the new one too"
    );
    assert_eq!(f.exit(new, OK), vec![Command::Reap]);
    assert_eq!(exited(&f.no_children()), Some(3));
}

#[test]
fn a_stop_start_restart_without_notify_still_works_with_generations() {
    let mut f = Fake::custom(RESTART, true, |s| s.overlap = true);
    f.tick();
    f.content(0, 0);
    f.exit(f.job("check"), OK);
    let old = f.service();
    f.content(0, 1);
    let c = f.exit(f.job("check"), OK);
    // Without a readiness signal the new instance is ready at once.
    let new = f.service();
    assert_ne!(old, new);
    assert_eq!(signalled(&c, old), vec![TERM]);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn with_invalid_config_ready_a_rejected_change_keeps_tend_ready() {
    let mut f = Fake::custom(CHECKED, true, |s| s.ready_when_invalid = true);
    f.tick();
    f.content(0, 0);
    f.exit(f.job("check"), OK);
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    let st = f.core.status();
    assert_eq!((st.state, st.ready), (State::InvalidConfig, true));
    assert_eq!(st.watches[0].result, WatchResult::Invalid);
    // Not when the service is down because of it.
    let mut f = Fake::custom(CHECKED, true, |s| s.ready_when_invalid = true);
    f.tick();
    f.content(0, 0);
    f.exit(f.job("check"), FAIL);
    assert_eq!(f.state(), (State::InvalidConfig, false));
}

#[test]
fn with_invalid_config_ready_a_service_down_after_a_crash_is_not_ready() {
    // Without publish: it stays down, since it would start on the rejected config.
    let mut f = Fake::custom(CHECKED_RESTART, true, |s| s.ready_when_invalid = true);
    f.tick();
    f.content(0, 0);
    f.exit(f.job("check"), OK);
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    assert_eq!(f.state(), (State::InvalidConfig, true));
    f.exit(f.service(), ExitStatus::Signal(KILL));
    assert!(!f.state().1, "not ready while it is down");
    f.at_deadline();
    assert!(
        f.services().len() == 1,
        "not started on the rejected config"
    );
    assert_eq!(f.state(), (State::InvalidConfig, false));

    // With publish: down until it runs again on the last good copy.
    let mut f = Fake::custom(PUBLISHED, true, |s| s.ready_when_invalid = true);
    f.tick();
    f.candidate(1, "/pub/..g1", OK);
    f.publication(1, Ok(()));
    f.candidate(2, "/pub/..g2", FAIL);
    assert_eq!(f.state(), (State::InvalidConfig, true));
    f.exit(f.service(), ExitStatus::Signal(KILL));
    assert!(!f.state().1, "not ready while it is down");
    f.at_deadline();
    assert_eq!(f.services().len(), 2);
    assert_eq!(f.state(), (State::InvalidConfig, true));
}

// ---------------------------------------------------------------- publish

const PUBLISHED: &str = "[service]\nrestart = \"on-failure\"\n[[watch]]\nname = \"app\"\npaths = [\"/a\"]\n\
                         publish = \"/pub\"\ncheck = [\"check\", \"{candidate}/app.conf\"]\non_change = \"signal\"\n";

fn restored(generation: &str) -> Restored {
    Restored {
        generation: generation.into(),
        rolled_back: false,
    }
}

fn snapshot_asked(commands: &[Command]) -> Option<Fingerprint> {
    commands.iter().find_map(|c| match c {
        Command::Snapshot { fingerprint, .. } => Some(*fingerprint),
        _ => None,
    })
}

fn published(commands: &[Command]) -> Option<PathBuf> {
    commands.iter().find_map(|c| match c {
        Command::Publish { candidate, .. } => Some(candidate.clone()),
        _ => None,
    })
}

fn discarded(commands: &[Command]) -> Option<PathBuf> {
    commands.iter().find_map(|c| match c {
        Command::Discard { candidate, .. } => Some(candidate.clone()),
        _ => None,
    })
}

impl Fake {
    fn snapshot(&mut self, n: u8, result: Result<&str, SnapshotError>) -> Vec<Command> {
        self.send(Event::Done(Done::Snapshot {
            watch: WatchId(0),
            fingerprint: test_fingerprint(n),
            result: result.map(|dir| Candidate {
                dir: PathBuf::from(dir),
                rejected: false,
            }),
        }))
    }

    fn publication(&mut self, n: u8, result: Result<(), &str>) -> Vec<Command> {
        self.published_over(n, result, None)
    }

    /// The publication of content `n`, which replaced `previous` (kept).
    fn published_over(
        &mut self,
        n: u8,
        result: Result<(), &str>,
        previous: Option<&str>,
    ) -> Vec<Command> {
        self.send(Event::Done(Done::Published {
            watch: WatchId(0),
            fingerprint: test_fingerprint(n),
            result: result
                .map(|()| previous.map(PathBuf::from))
                .map_err(String::from),
        }))
    }

    /// Content `n` arrives, is copied to `candidate`, and its check ends
    /// with `status`; returns the commands after the check.
    fn candidate(&mut self, n: u8, candidate: &str, status: ExitStatus) -> Vec<Command> {
        assert_eq!(
            snapshot_asked(&self.content(0, n)),
            Some(test_fingerprint(n))
        );
        self.snapshot(n, Ok(candidate));
        let check = self.job("check");
        assert_eq!(
            self.spawned.last().unwrap().1,
            ["check", &format!("{candidate}/app.conf")],
            "{{candidate}} is the candidate's directory"
        );
        assert_eq!(
            self.envs.last().unwrap(),
            &[("TEND_CANDIDATE".to_string(), candidate.to_string())]
        );
        self.exit(check, status)
    }

    /// Started on published content 1.
    fn publishing() -> Fake {
        let mut f = Fake::new(PUBLISHED);
        f.tick();
        let c = f.candidate(1, "/pub/..g1", OK);
        assert_eq!(published(&c).as_deref(), Some(Path::new("/pub/..g1")));
        assert!(
            f.services().is_empty(),
            "the service waits for the publication"
        );
        f.publication(1, Ok(()));
        assert_eq!(f.services().len(), 1, "started on the published copy");
        assert_eq!(f.state(), (State::Ready, true));
        assert_eq!(f.result(0), WatchResult::Applied);
        f
    }
}

#[test]
fn a_publishing_watch_checks_a_copy_and_publishes_it_before_its_action() {
    let mut f = Fake::publishing();
    let svc = f.service();
    let c = f.candidate(2, "/pub/..g2", FAIL);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g2")));
    assert!(published(&c).is_none() && signalled(&c, svc).is_empty());
    assert_eq!(f.state(), (State::InvalidConfig, false));
    let c = f.candidate(3, "/pub/..g3", OK);
    assert!(signalled(&c, svc).is_empty(), "not before it is published");
    assert_eq!(published(&c).as_deref(), Some(Path::new("/pub/..g3")));
    let c = f.publication(3, Ok(()));
    assert_eq!(signalled(&c, svc), [Signal::SIGHUP as i32]);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn with_publish_a_crash_during_an_invalid_config_restarts_on_the_published_copy() {
    let mut f = Fake::publishing();
    f.candidate(2, "/pub/..g2", FAIL);
    f.exit(f.service(), ExitStatus::Signal(KILL));
    assert_eq!(spawns(&f.at_deadline()), [SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.services().len(), 2, "restarted on the last good copy");
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert_eq!(f.result(0), WatchResult::Invalid);
}

#[test]
fn a_generation_published_before_starts_the_service_once_the_mount_is_rejected() {
    let mut f = Fake::new(PUBLISHED);
    f.core.restore(WatchId(0), &restored("..g0"));
    f.tick();
    let c = f.candidate(1, "/pub/..g1", FAIL);
    assert_eq!(
        spawns(&c),
        [SpawnKind::Service(ServiceId(0))],
        "started on the earlier copy"
    );
    assert_eq!(f.state(), (State::InvalidConfig, false));
    let c = f.candidate(2, "/pub/..g2", OK);
    assert!(published(&c).is_some());
    let c = f.publication(2, Ok(()));
    assert_eq!(signalled(&c, f.service()), [Signal::SIGHUP as i32]);
    assert_eq!(f.state(), (State::Ready, true));

    // Without one, a rejected mount keeps the service down.
    let mut f = Fake::new(PUBLISHED);
    f.tick();
    f.candidate(1, "/pub/..g1", FAIL);
    assert!(f.services().is_empty());
}

#[test]
fn a_generation_published_before_waits_for_the_mounts_verdict() {
    let mut f = Fake::new(PUBLISHED);
    f.core.restore(WatchId(0), &restored("..g0"));
    f.tick();
    let c = f.candidate(1, "/pub/..g1", OK);
    assert!(spawns(&c).is_empty(), "a valid mount is published first");
    f.publication(1, Ok(()));
    assert_eq!(f.services().len(), 1);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_copy_that_found_newer_content_is_made_again_for_it() {
    let mut f = Fake::publishing();
    f.content(0, 2);
    let c = f.content(0, 3);
    assert_eq!(snapshot_asked(&c), None, "one copy at a time");
    let c = f.snapshot(2, Err(SnapshotError::Changed));
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
    // Content that changed back: copied again a moment later.
    let c = f.snapshot(3, Err(SnapshotError::Changed));
    assert_eq!(snapshot_asked(&c), None);
    assert_eq!(snapshot_asked(&f.at_deadline()), Some(test_fingerprint(3)));
}

#[test]
fn a_copy_or_publication_that_fails_is_an_action_failure_tried_again() {
    let mut f = Fake::publishing();
    let svc = f.service();
    f.content(0, 2);
    f.snapshot(
        2,
        Err(SnapshotError::Failed("No space left on device".into())),
    );
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    assert!(
        f.core.status().watches[0]
            .check_output
            .contains("No space left")
    );
    assert_eq!(snapshot_asked(&f.at_deadline()), Some(test_fingerprint(2)));
    f.snapshot(2, Ok("/pub/..g2"));
    let c = f.exit(f.job("check"), OK);
    assert!(published(&c).is_some());
    let c = f.publication(
        2,
        Err("cannot rename over /pub/..data: Read-only file system"),
    );
    assert!(signalled(&c, svc).is_empty());
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    assert_eq!(snapshot_asked(&f.at_deadline()), Some(test_fingerprint(2)));
}

#[test]
fn a_copy_the_service_could_not_start_with_is_rejected_like_a_failed_check() {
    let mut f = Fake::publishing();
    let svc = f.service();
    let checks = f.jobs("check");
    f.content(0, 2);
    let c = f.snapshot(
        2,
        Err(SnapshotError::Rejected(
            "env_from /pub/2FA: the file name \"2FA\" is not a variable name".into(),
        )),
    );
    assert!(published(&c).is_none() && signalled(&c, svc).is_empty());
    assert_eq!(f.jobs("check"), checks, "no check runs on it");
    assert_eq!(f.result(0), WatchResult::Invalid);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert!(f.core.status().watches[0].check_output.contains("2FA"));
    // A crash restarts the service on the copy published before.
    f.exit(svc, ExitStatus::Signal(KILL));
    f.at_deadline();
    assert_eq!(f.services().len(), 2);
}

#[test]
fn a_publication_that_keeps_failing_is_tried_again_less_and_less_often() {
    let mut f = Fake::publishing();
    f.content(0, 2);
    let mut waits = Vec::new();
    for g in 0..4 {
        f.snapshot(2, Ok(&format!("/pub/..g2_{g}")));
        f.exit(f.job("check"), OK);
        f.publication(
            2,
            Err("cannot rename over /pub/..data: Read-only file system"),
        );
        let before = f.elapsed;
        assert_eq!(snapshot_asked(&f.at_deadline()), Some(test_fingerprint(2)));
        waits.push((f.elapsed - before).as_secs());
    }
    assert_eq!(
        waits,
        [1, 2, 4, 8],
        "the recheck back-off, although the check passes"
    );
    // A publication that works starts the next streak from the first delay.
    f.snapshot(2, Ok("/pub/..g2_4"));
    f.exit(f.job("check"), OK);
    f.publication(2, Ok(()));
    assert_eq!(f.result(0), WatchResult::Applied);
    f.content(0, 3);
    f.snapshot(3, Ok("/pub/..g3"));
    f.exit(f.job("check"), OK);
    f.publication(
        3,
        Err("cannot rename over /pub/..data: Read-only file system"),
    );
    let before = f.elapsed;
    f.at_deadline();
    assert_eq!((f.elapsed - before).as_secs(), 1);
}

#[test]
fn a_candidate_whose_check_result_came_too_late_is_discarded() {
    let mut f = Fake::publishing();
    f.content(0, 2);
    f.snapshot(2, Ok("/pub/..g2"));
    let check = f.job("check");
    f.content(0, 3);
    let c = f.exit(check, OK);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g2")));
    assert!(published(&c).is_none());
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
    // A snapshot answered after tend began to stop is removed.
    f.signal(TERM);
    let c = f.snapshot(3, Ok("/pub/..g3"));
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g3")));
}

// ---------------------------------------------------------------- verify, rollback, splay

const VERIFIED: &str = "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\npublish = \"/pub\"\n\
                        check = [\"check\", \"{candidate}/app.conf\"]\non_change = \"signal\"\n\
                        verify = [\"verify\"]\nverify_timeout = \"5s\"\n";

fn rollback_asked(commands: &[Command]) -> Option<PathBuf> {
    commands.iter().find_map(|c| match c {
        Command::Rollback { generation, .. } => Some(generation.clone()),
        _ => None,
    })
}

impl Fake {
    /// Fails every run of verify until its time is up; returns how many
    /// ran and the commands of the moment it failed for good.
    fn fail_verify_until_its_time_is_up(&mut self, output: &str) -> (usize, Vec<Command>) {
        let mut runs = 0;
        loop {
            if self.result(0) == WatchResult::Verifying
                && self
                    .core
                    .jobs
                    .iter()
                    .any(|j| matches!(j.role, JobRole::Verify(..)))
            {
                runs += 1;
                self.exit_with_output(self.job("verify"), FAIL, output);
            }
            let c = self.at_deadline();
            if self.result(0) != WatchResult::Verifying {
                return (runs, c);
            }
            assert!(runs < 50, "verify never timed out");
        }
    }

    /// Started on published content 1, with `verify`.
    fn verified() -> Fake {
        let mut f = Fake::new(VERIFIED);
        f.tick();
        f.candidate(1, "/pub/..g1", OK);
        f.publication(1, Ok(()));
        assert_eq!(f.services().len(), 1);
        assert_eq!(f.jobs("verify"), 0, "a start is not verified");
        assert_eq!(f.state(), (State::Ready, true));
        f
    }

    /// Content `n` passes its check and is published over `..g1`: the
    /// service gets SIGHUP. Returns those commands.
    fn apply_verified(&mut self, n: u8) -> Vec<Command> {
        let candidate = format!("/pub/..g{n}");
        let c = self.candidate(n, &candidate, OK);
        assert!(
            c.contains(&Command::Publish {
                watch: WatchId(0),
                fingerprint: test_fingerprint(n),
                candidate: PathBuf::from(&candidate),
                keep: Keep::Published,
            }),
            "{c:?}"
        );
        let c = self.published_over(n, Ok(()), Some("/pub/..g1"));
        assert_eq!(signalled(&c, self.service()), [Signal::SIGHUP as i32]);
        c
    }
}

#[test]
fn with_invalid_config_ready_a_failed_verify_is_ready_only_once_the_previous_config_is_back() {
    let mut f = Fake::custom(VERIFIED, true, |s| s.ready_when_invalid = true);
    f.tick();
    f.candidate(1, "/pub/..g1", OK);
    f.publication(1, Ok(()));
    let svc = f.service();
    f.apply_verified(2);
    let (_, last) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert!(rollback_asked(&last).is_some());
    assert_eq!(
        f.state(),
        (State::InvalidConfig, false),
        "the service still runs the rejected config"
    );
    let c = f.send(Event::Done(Done::RolledBack {
        watch: WatchId(0),
        fingerprint: test_fingerprint(2),
        result: Ok(()),
    }));
    assert_eq!(signalled(&c, svc), [Signal::SIGHUP as i32]);
    assert_eq!(
        f.state(),
        (State::InvalidConfig, true),
        "back on the last good"
    );
}

#[test]
fn a_change_that_fails_verify_is_rolled_back_and_not_applied_again() {
    let mut f = Fake::verified();
    let svc = f.service();
    f.apply_verified(2);
    assert_eq!(f.result(0), WatchResult::Verifying);
    assert_eq!(f.state(), (State::Reloading, true), "a change in progress");
    // verify runs again and again until its time is up.
    let (runs, last) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert!(runs >= 3, "verify ran {runs} times");
    assert_eq!(
        rollback_asked(&last).as_deref(),
        Some(Path::new("/pub/..g1"))
    );
    assert_eq!(f.elapsed, Duration::from_secs(5), "verify_timeout");
    assert!(signalled(&last, svc).is_empty(), "not before it is back");
    let c = f.send(Event::Done(Done::RolledBack {
        watch: WatchId(0),
        fingerprint: test_fingerprint(2),
        result: Ok(()),
    }));
    assert_eq!(
        signalled(&c, svc),
        [Signal::SIGHUP as i32],
        "the service reads the previous config again"
    );
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    let status = f.core.status();
    assert!(status.watches[0].check_output.contains("HTTP 502"));
    assert!(
        status.watches[0]
            .check_output
            .contains("did not pass within 5s")
    );
    let verifies = f.jobs("verify");
    // The same content again: nothing happens.
    assert!(f.content(0, 2).is_empty());
    assert_eq!(f.core.deadline(), None, "idle");
    // A newer good content is applied and verified as usual.
    f.apply_verified(3);
    let c = f.exit(f.job("verify"), OK);
    assert!(discarded(&c).is_some(), "the previous generation is let go");
    assert_eq!(f.jobs("verify"), verifies + 1);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_verify_that_passes_late_but_in_time_applies_the_change() {
    let mut f = Fake::verified();
    f.apply_verified(2);
    f.exit(f.job("verify"), FAIL);
    f.at_deadline();
    f.exit(f.job("verify"), FAIL);
    f.at_deadline();
    let c = f.exit(f.job("verify"), OK);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert!(rollback_asked(&c).is_none());
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None, "idle afterwards");
}

#[test]
fn without_publish_a_failed_verify_is_an_action_failure() {
    let toml = "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\non_change = \"signal\"\n\
                verify = [\"verify\"]\nverify_timeout = \"1s\"\n";
    let mut f = Fake::started(toml, 1);
    let c = f.content(0, 1);
    assert_eq!(signalled(&c, f.service()), [Signal::SIGHUP as i32]);
    let (_, c) = f.fail_verify_until_its_time_is_up("no");
    assert!(rollback_asked(&c).is_none());
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    assert!(!f.state().1);
    // The failure may have been transient: verify runs again after a
    // growing back-off (not the action), until it passes.
    let verifies = f.jobs("verify");
    let at = f.elapsed;
    f.at_deadline();
    assert_eq!(f.elapsed - at, Duration::from_secs(1));
    assert_eq!(f.jobs("verify"), verifies + 1);
    let (_, c) = f.fail_verify_until_its_time_is_up("no");
    assert!(signalled(&c, f.service()).is_empty());
    let at = f.elapsed;
    f.at_deadline();
    assert_eq!(f.elapsed - at, Duration::from_secs(2));
    f.exit(f.job("verify"), OK);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None);
}

const SPLAYED: &str = "[[watch]]\nname = \"app\"\npaths = [\"/a\"]\ncheck = [\"check\"]\non_change = \"signal\"\n\
                       splay = \"10s\"\n";

#[test]
fn splay_waits_a_random_time_before_the_action_and_the_newest_content_wins() {
    let mut f = Fake::started(SPLAYED, 1);
    let svc = f.service();
    f.content(0, 1);
    let c = f.exit(f.job("check"), OK);
    assert!(signalled(&c, svc).is_empty(), "not before the wait");
    let due = f.core.deadline().expect("the wait's end");
    let wait = due - (f.t0 + f.elapsed);
    assert!(wait < Duration::from_secs(10), "{wait:?}");
    assert!(f.core.status().watches[0].action_at.is_some());
    assert_eq!(f.state(), (State::Reloading, true));
    // A newer change during the wait replaces it.
    f.content(0, 2);
    let c = f.exit(f.job("check"), OK);
    assert!(signalled(&c, svc).is_empty());
    let c = f.at_deadline();
    assert_eq!(
        signalled(&c, svc),
        [Signal::SIGHUP as i32],
        "once, for the newest"
    );
    assert_eq!(f.state(), (State::Ready, true));
    assert!(f.core.status().watches[0].action_at.is_none());
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn splay_never_delays_a_stop() {
    let mut f = Fake::started(SPLAYED, 1);
    let svc = f.service();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    let c = f.signal(TERM);
    assert_eq!(signalled(&c, svc)[0], TERM, "at once");
    let c = f.exit(svc, ExitStatus::Signal(TERM));
    assert!(
        signalled(&c, svc).is_empty(),
        "the waiting change is dropped"
    );
}

#[test]
fn splay_spreads_replicas_over_the_window() {
    let mut waits = Vec::new();
    for seed in 0..20 {
        let mut f = Fake::custom(SPLAYED, true, |s| s.seed = seed);
        f.tick();
        f.content(0, 0);
        f.exit(f.job("check"), OK);
        f.content(0, 1);
        f.exit(f.job("check"), OK);
        let due = f.core.deadline().unwrap() - (f.t0 + f.elapsed);
        assert!(due < Duration::from_secs(10));
        waits.push(due);
    }
    waits.sort();
    let spread = waits[waits.len() - 1] - waits[0];
    assert!(spread > Duration::from_secs(5), "{waits:?}");
}

#[test]
fn with_publish_a_change_waiting_for_its_splay_is_not_published_yet() {
    let toml = format!("{PUBLISHED}splay = \"10s\"\n");
    let mut f = Fake::new(&toml);
    f.tick();
    // A start never waits.
    let c = f.candidate(1, "/pub/..g1", OK);
    assert!(published(&c).is_some());
    f.publication(1, Ok(()));
    assert_eq!(f.services().len(), 1);
    let c = f.candidate(2, "/pub/..g2", OK);
    assert!(published(&c).is_none(), "waits for its splay");
    // Newer content replaces the waiting candidate, which is removed.
    let c = f.content(0, 3);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g2")));
}

/// A watch with publish and verify (`verify_timeout = "5s"`) and this
/// `on_change`, under this `[service]`.
fn verified_toml(service: &str, on_change: &str, extra: &str) -> String {
    format!(
        "[service]\n{service}\n[[watch]]\nname = \"app\"\npaths = [\"/a\"]\npublish = \"/pub\"\n\
         check = [\"check\", \"{{candidate}}/app.conf\"]\n{on_change}\n\
         verify = [\"verify\"]\nverify_timeout = \"5s\"\n{extra}"
    )
}

impl Fake {
    /// Started on published content 1 with `toml`.
    fn verified_with(toml: &str) -> Fake {
        let mut f = Fake::new(toml);
        f.tick();
        f.candidate(1, "/pub/..g1", OK);
        f.publication(1, Ok(()));
        assert_eq!(f.services().len(), 1);
        assert_eq!(f.state(), (State::Ready, true));
        f
    }

    /// `reloader_last_reload_successful` is 0.
    fn last_reload_failed(&mut self) -> bool {
        let status = self.core.status();
        let page = self
            .core
            .metrics()
            .render(&status, &metrics::WatcherCounts::default());
        page.contains("reloader_last_reload_successful 0")
    }

    /// The previous generation of content `n` is back.
    fn rolled_back(&mut self, n: u8) -> Vec<Command> {
        self.send(Event::Done(Done::RolledBack {
            watch: WatchId(0),
            fingerprint: test_fingerprint(n),
            result: Ok(()),
        }))
    }
}

fn withdraw_asked(commands: &[Command]) -> Option<PathBuf> {
    commands.iter().find_map(|c| match c {
        Command::Withdraw { kept, .. } => Some(kept.clone()),
        _ => None,
    })
}

impl Fake {
    /// The published generation was withdrawn (or not) before content `n`
    /// is copied.
    fn withdrawn(&mut self, n: u8, result: Result<(), &str>) -> Vec<Command> {
        self.send(Event::Done(Done::Withdrawn {
            watch: WatchId(0),
            fingerprint: test_fingerprint(n),
            result: result.map_err(String::from),
        }))
    }
}

fn publish_asked(commands: &[Command]) -> Option<(PathBuf, Keep)> {
    commands.iter().find_map(|c| match c {
        Command::Publish {
            candidate, keep, ..
        } => Some((candidate.clone(), keep.clone())),
        _ => None,
    })
}

#[test]
fn a_stop_start_restart_that_fails_verify_stays_rolled_back_once_restarted() {
    let toml = verified_toml("restart = \"always\"", "on_change = \"restart\"", "");
    let mut f = Fake::verified_with(&toml);
    let old = f.service();
    f.candidate(2, "/pub/..g2", OK);
    let c = f.published_over(2, Ok(()), Some("/pub/..g1"));
    assert_eq!(signalled(&c, old)[0], TERM);
    f.exit(old, ExitStatus::Signal(TERM));
    assert_eq!(f.services().len(), 2);
    assert_eq!(f.result(0), WatchResult::Verifying);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    let new = f.service();
    let c = f.rolled_back(2);
    assert_eq!(signalled(&c, new)[0], TERM, "restarted on the previous one");
    f.exit(new, ExitStatus::Signal(TERM));
    assert_eq!(f.services().len(), 3);
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert!(f.last_reload_failed());
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn a_service_that_crashes_after_a_rollback_restarts_on_the_previous_config_still_rolled_back() {
    let toml = verified_toml("restart = \"always\"", "on_change = \"signal\"", "");
    let mut f = Fake::verified_with(&toml);
    f.apply_verified(2);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    f.rolled_back(2);
    assert_eq!(f.result(0), WatchResult::RolledBack);
    f.exit(f.service(), ExitStatus::Signal(KILL));
    let c = f.at_deadline();
    assert_eq!(
        spawns(&c),
        [SpawnKind::Service(ServiceId(0))],
        "started on the previous copy"
    );
    assert!(published(&c).is_none() && snapshot_asked(&c).is_none());
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert!(f.last_reload_failed());
    // Still not applied again.
    assert!(f.content(0, 2).is_empty());
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn a_crash_during_a_splay_wait_starts_the_service_on_the_checked_content_at_once() {
    let toml = verified_toml(
        "restart = \"always\"",
        "on_change = \"signal\"",
        "splay = \"1000s\"\n",
    );
    let mut f = Fake::new(&toml);
    f.core.rng = watch::Rng(12345); // a wait of minutes
    f.tick();
    f.candidate(1, "/pub/..g1", OK);
    f.publication(1, Ok(()));
    let c = f.candidate(2, "/pub/..g2", OK);
    assert!(published(&c).is_none(), "waits for its splay");
    f.exit(f.service(), ExitStatus::Signal(KILL));
    let c = f.at_deadline();
    assert_eq!(f.elapsed, Duration::from_secs(1), "the restart back-off");
    assert_eq!(published(&c).as_deref(), Some(Path::new("/pub/..g2")));
    let c = f.published_over(2, Ok(()), Some("/pub/..g1"));
    assert_eq!(
        discarded(&c).as_deref(),
        Some(Path::new("/pub/..g1")),
        "a start is not verified"
    );
    assert_eq!(spawns(&c), [SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.state(), (State::Ready, true));
    assert!(f.core.status().watches[0].action_at.is_none());
    assert_eq!(f.jobs("verify"), 0);
    assert_eq!(f.core.deadline(), None);
}

/// A verified watch whose action is the command `reload`.
fn exec_verified_toml() -> String {
    verified_toml("", "on_change = \"exec\"\nexec = [\"reload\"]", "")
}

impl Fake {
    /// Verified content 1 with `toml`, and content 2 published over it, its
    /// action under way.
    fn verified_over_1(toml: &str) -> Fake {
        let mut f = Fake::verified_with(toml);
        f.candidate(2, "/pub/..g2", OK);
        f.published_over(2, Ok(()), Some("/pub/..g1"));
        f
    }
}

#[test]
fn a_rollback_whose_action_fails_is_retried_before_a_newer_change() {
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    f.exit(f.job("reload"), OK);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    f.rolled_back(2);
    let reloads = f.jobs("reload");
    assert_eq!(reloads, 2, "applied, then applied again");
    f.exit(f.job("reload"), FAIL);
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    // A newer change waits until the service is back on the previous one.
    assert!(snapshot_asked(&f.content(0, 3)).is_none());
    f.at_deadline();
    assert_eq!(f.jobs("reload"), reloads + 1, "the rollback's action again");
    let c = f.exit(f.job("reload"), OK);
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
    f.snapshot(3, Ok("/pub/..g3"));
    let c = f.exit(f.job("check"), OK);
    assert_eq!(
        publish_asked(&c),
        Some((PathBuf::from("/pub/..g3"), Keep::Published))
    );
    f.published_over(3, Ok(()), Some("/pub/..g1"));
    f.exit(f.job("reload"), OK);
    assert_eq!(f.result(0), WatchResult::Verifying, "verified as usual");
    f.exit(f.job("verify"), OK);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));

    // Without a newer change, a rollback whose action failed at first is
    // rolled_back once it succeeded.
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    f.exit(f.job("reload"), OK);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    f.rolled_back(2);
    f.exit(f.job("reload"), FAIL);
    f.at_deadline();
    f.exit(f.job("reload"), OK);
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn content_applied_while_newer_content_arrived_is_verified_before_it() {
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    f.content(0, 3);
    f.exit(f.job("reload"), OK);
    assert_eq!(f.jobs("verify"), 1, "content 2 is verified");
    // It fails: the rollback goes to content 1, never to unverified content.
    let (_, c) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    f.rolled_back(2);
    let c = f.exit(f.job("reload"), OK);
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)), "then 3");
}

#[test]
fn the_generation_kept_to_roll_back_to_is_the_last_verified_one() {
    let toml = verified_toml(
        "restart = \"always\"",
        "on_change = \"exec\"\nexec = [\"reload\"]",
        "",
    );
    let mut f = Fake::verified_over_1(&toml);
    f.exit(f.job("reload"), FAIL);
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    // Content 3 replaces 2, whose action failed: 1 stays the one to go
    // back to (published again while 3 is checked).
    assert_eq!(
        withdraw_asked(&f.content(0, 3)).as_deref(),
        Some(Path::new("/pub/..g1"))
    );
    f.withdrawn(3, Ok(()));
    f.snapshot(3, Ok("/pub/..g3"));
    let c = f.exit(f.job("check"), OK);
    assert_eq!(
        publish_asked(&c),
        Some((PathBuf::from("/pub/..g3"), Keep::Published))
    );
    f.published_over(3, Ok(()), Some("/pub/..g1"));
    f.exit(f.job("reload"), OK);
    let (_, c) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));

    // A start on content whose action failed makes it the base instead.
    let mut f = Fake::verified_over_1(&toml);
    f.exit(f.job("reload"), FAIL);
    f.exit(f.service(), ExitStatus::Signal(KILL));
    let c = f.at_deadline();
    assert_eq!(spawns(&c), [SpawnKind::Service(ServiceId(0))]);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(f.state(), (State::Ready, true));
    f.content(0, 3);
    f.snapshot(3, Ok("/pub/..g3"));
    let c = f.exit(f.job("check"), OK);
    assert_eq!(
        publish_asked(&c),
        Some((PathBuf::from("/pub/..g3"), Keep::Published))
    );
}

#[test]
fn a_verify_still_running_at_its_timeout_is_killed_with_its_group_and_its_output_kept() {
    let mut f = Fake::verified();
    f.apply_verified(2);
    let verify = f.job("verify");
    let c = f.at_deadline();
    assert_eq!(f.elapsed, Duration::from_secs(5), "verify_timeout");
    assert!(
        c.contains(&Command::Signal {
            pid: verify,
            group: true,
            signo: KILL
        }),
        "{c:?}"
    );
    assert!(rollback_asked(&c).is_none(), "decided once it is gone");
    assert_eq!(f.core.deadline(), None, "nothing is due until it exits");
    let c = f.exit_with_output(
        verify,
        ExitStatus::Signal(KILL),
        "connecting to 10.0.0.7:5432",
    );
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    let output = f.core.status().watches[0].check_output.clone();
    assert!(
        output.contains("connecting to 10.0.0.7:5432") && output.contains("did not pass within 5s"),
        "{output}"
    );
}

#[test]
fn content_an_earlier_tend_rolled_back_is_not_applied_again_until_it_changes() {
    let mut f = Fake::new(VERIFIED);
    f.core.restore(WatchId(0), &restored("..g0"));
    f.tick();
    f.content(0, 2);
    let c = f.send(Event::Done(Done::Snapshot {
        watch: WatchId(0),
        fingerprint: test_fingerprint(2),
        result: Ok(Candidate {
            dir: PathBuf::from("/pub/..g2"),
            rejected: true,
        }),
    }));
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g2")));
    assert_eq!(f.jobs("check"), 0, "not even checked");
    assert_eq!(
        spawns(&c),
        [SpawnKind::Service(ServiceId(0))],
        "started on ..g0"
    );
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert!(f.last_reload_failed());
    assert_eq!(f.core.deadline(), None);
    // Other content is applied and verified as usual.
    let c = f.candidate(3, "/pub/..g3", OK);
    assert!(published(&c).is_some());
    let c = f.published_over(3, Ok(()), Some("/pub/..g0"));
    assert_eq!(signalled(&c, f.service()), [Signal::SIGHUP as i32]);
    assert_eq!(f.result(0), WatchResult::Verifying);
}

#[test]
fn a_service_that_exits_during_verify_is_rolled_back_at_once_and_restarted_on_the_previous_config()
{
    let toml = verified_toml("restart = \"always\"", "on_change = \"signal\"", "");
    let mut f = Fake::verified_with(&toml);
    f.apply_verified(2);
    let verify = f.job("verify");
    let c = f.exit(f.service(), ExitStatus::Signal(Signal::SIGSEGV as i32));
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert!(
        c.contains(&Command::Signal {
            pid: verify,
            group: true,
            signo: KILL
        }),
        "{c:?}"
    );
    assert_eq!(f.result(0), WatchResult::RolledBack);
    let output = f.core.status().watches[0].check_output.clone();
    assert!(
        output.contains("the service exited while the change was verified"),
        "{output}"
    );
    // Not restarted before the previous generation is back.
    f.at_deadline();
    assert_eq!(f.services().len(), 1);
    let c = f.rolled_back(2);
    assert_eq!(spawns(&c), [SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    f.exit(verify, ExitStatus::Signal(KILL));
    assert_eq!(f.jobs("verify"), 1);
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn a_change_during_verify_or_rollback_is_checked_once_they_are_done() {
    let mut f = Fake::verified();
    f.apply_verified(2);
    assert!(snapshot_asked(&f.content(0, 3)).is_none(), "verify first");
    let c = f.exit(f.job("verify"), OK);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
    f.snapshot(3, Ok("/pub/..g3"));
    f.exit(f.job("check"), OK);
    f.published_over(3, Ok(()), Some("/pub/..g2"));
    let (_, c) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g2")));
    assert!(
        snapshot_asked(&f.content(0, 4)).is_none(),
        "the rollback first"
    );
    let c = f.rolled_back(3);
    assert_eq!(signalled(&c, f.service()), [Signal::SIGHUP as i32]);
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(4)));
}

/// A service with notify, restarted (stop-start) for content 2 over 1:
/// the new instance is started and not ready yet. Returns it.
fn restarting_for_a_verified_change(f: &mut Fake) -> Pid {
    f.tick();
    f.candidate(1, "/pub/..g1", OK);
    f.publication(1, Ok(()));
    let first = f.service();
    notify(f, first, "READY=1");
    assert_eq!(f.state(), (State::Ready, true));
    f.candidate(2, "/pub/..g2", OK);
    f.published_over(2, Ok(()), Some("/pub/..g1"));
    f.exit(first, ExitStatus::Signal(TERM));
    let second = f.service();
    assert_ne!(first, second);
    second
}

fn verified_restarts_with_notify() -> Fake {
    let toml = verified_toml("restart = \"always\"", "on_change = \"restart\"", "");
    Fake::custom(&toml, true, |s| {
        s.notify = true;
        s.ready_timeout = Duration::from_secs(60);
    })
}

#[test]
fn a_restarted_service_is_verified_once_it_is_ready() {
    let mut f = verified_restarts_with_notify();
    let second = restarting_for_a_verified_change(&mut f);
    assert_eq!(f.jobs("verify"), 0, "not before the new instance is ready");
    // It takes longer to start than verify_timeout (5 s).
    f.after(20.0);
    assert!(rollback_asked(&f.tick()).is_none());
    notify(&mut f, second, "READY=1");
    assert_eq!(f.jobs("verify"), 1);
    let c = f.exit(f.job("verify"), OK);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_restarted_service_that_never_becomes_ready_is_rolled_back() {
    let mut f = verified_restarts_with_notify();
    let second = restarting_for_a_verified_change(&mut f);
    // Not ready within ready_timeout: stopped, and that fails the change.
    let c = f.at_deadline();
    assert_eq!(signalled(&c, second)[0], TERM);
    let c = f.exit(second, ExitStatus::Signal(TERM));
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(f.result(0), WatchResult::RolledBack);
    f.rolled_back(2);
    f.at_deadline();
    assert_eq!(
        f.services().len(),
        3,
        "started again, on the previous config"
    );
    let third = f.service();
    notify(&mut f, third, "READY=1");
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert_eq!(f.jobs("verify"), 0);
}

#[test]
fn a_rollback_that_cannot_put_the_previous_generation_back_is_tried_again_until_it_can() {
    let mut f = Fake::verified();
    let svc = f.service();
    f.apply_verified(2);
    let (_, c) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    let why = "cannot create /pub/..rejected.tmp: Operation not permitted";
    let failed = |f: &mut Fake| {
        f.send(Event::Done(Done::RolledBack {
            watch: WatchId(0),
            fingerprint: test_fingerprint(2),
            result: Err(why.into()),
        }))
    };
    let mut waits = Vec::new();
    for _ in 0..3 {
        let c = failed(&mut f);
        assert!(signalled(&c, svc).is_empty(), "nothing to apply yet");
        // The service still runs the rejected config: the status says so.
        assert_eq!(f.result(0), WatchResult::ActionFailed);
        assert_eq!(f.state(), (State::Reloading, false));
        let output = f.core.status().watches[0].check_output.clone();
        assert!(
            output.contains("HTTP 502")
                && output.contains("Operation not permitted")
                && output
                    .matches("cannot put the previous config back")
                    .count()
                    == 1,
            "{output}"
        );
        let before = f.elapsed;
        let c = f.at_deadline();
        waits.push((f.elapsed - before).as_secs());
        assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    }
    assert_eq!(waits, [1, 2, 4], "the back-off of a failed publication");
    // A newer change waits until the previous config is back.
    assert!(snapshot_asked(&f.content(0, 3)).is_none());
    assert!(f.core.deadline().is_none(), "the rollback is on its way");
    let c = f.rolled_back(2);
    assert_eq!(
        signalled(&c, svc),
        [Signal::SIGHUP as i32],
        "applied again once it is back"
    );
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)), "then 3");
    let output = f.core.status().watches[0].check_output.clone();
    assert!(!output.contains("Operation not permitted"), "{output}");

    // Without newer content, the watch is rolled_back once it is back.
    let mut f = Fake::verified();
    f.apply_verified(2);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    failed(&mut f);
    f.at_deadline();
    let c = f.rolled_back(2);
    assert_eq!(signalled(&c, f.service()), [Signal::SIGHUP as i32]);
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert_eq!(f.core.deadline(), None);
    assert!(f.content(0, 2).is_empty(), "not applied again");

    // A service that exits meanwhile starts again once the previous config
    // is back, not on the rejected one.
    let toml = verified_toml("restart = \"always\"", "on_change = \"signal\"", "");
    let mut f = Fake::verified_with(&toml);
    f.apply_verified(2);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    failed(&mut f);
    f.exit(f.service(), ExitStatus::Signal(KILL));
    for _ in 0..3 {
        let c = f.at_deadline();
        assert!(spawns(&c).is_empty(), "{c:?}");
        if rollback_asked(&c).is_some() {
            failed(&mut f);
        }
    }
    assert_eq!(f.services().len(), 1);
    f.at_deadline();
    let c = f.rolled_back(2);
    assert_eq!(spawns(&c), [SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.result(0), WatchResult::RolledBack);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn without_publish_a_restarted_service_that_never_becomes_ready_fails_its_verify() {
    let toml = "[service]\nrestart = \"always\"\n[[watch]]\nname = \"app\"\npaths = [\"/a\"]\n\
                check = [\"check\"]\non_change = \"restart\"\nverify = [\"verify\"]\n\
                verify_timeout = \"5s\"\n";
    let mut f = Fake::custom(toml, true, |s| {
        s.notify = true;
        s.ready_timeout = Duration::from_secs(10);
    });
    f.tick();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    let first = f.service();
    notify(&mut f, first, "READY=1");
    assert_eq!(f.state(), (State::Ready, true));
    f.content(0, 2);
    let c = f.exit(f.job("check"), OK);
    assert_eq!(signalled(&c, first)[0], TERM);
    f.exit(first, ExitStatus::Signal(TERM));
    assert_eq!(f.result(0), WatchResult::Verifying);
    // Every instance on content 2 stays unready: each is stopped at its
    // ready_timeout, and the restart policy starts another.
    for n in 2..5 {
        let svc = f.service();
        let c = f.at_deadline();
        assert_eq!(signalled(&c, svc)[0], TERM, "instance {n}");
        f.exit(svc, ExitStatus::Signal(TERM));
        assert_eq!(f.result(0), WatchResult::ActionFailed, "instance {n}");
        assert!(!f.state().1);
        let output = f.core.status().watches[0].check_output.clone();
        assert!(
            output.contains("did not become ready within 10s"),
            "{output}"
        );
        f.at_deadline();
        assert_eq!(f.services().len(), n + 1, "started again");
        assert_eq!(f.result(0), WatchResult::ActionFailed, "not verifying");
        assert_eq!(f.jobs("verify"), 0);
        let now = f.t0 + f.elapsed;
        assert!(
            f.core.deadline().is_some_and(|d| d > now),
            "nothing overdue that nothing acts on"
        );
    }
    // One becomes ready after all: it is verified.
    let last = f.service();
    notify(&mut f, last, "READY=1");
    assert_eq!(f.result(0), WatchResult::Verifying);
    assert_eq!(f.jobs("verify"), 1);
    f.exit(f.job("verify"), OK);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None);
}

#[test]
fn a_newer_change_withdraws_a_published_one_whose_action_failed_before_it_is_copied() {
    // During the retry back-off of the failed action.
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    f.exit(f.job("reload"), FAIL);
    assert!(f.core.deadline().is_some(), "the action's retry");
    let c = f.content(0, 3);
    assert!(
        snapshot_asked(&c).is_none(),
        "not a third generation: {c:?}"
    );
    assert_eq!(withdraw_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    // The directory cannot be written: tried again, like a publication.
    f.withdrawn(
        3,
        Err("cannot rename over /pub/..data: Read-only file system"),
    );
    assert_eq!(f.result(0), WatchResult::ActionFailed);
    let output = f.core.status().watches[0].check_output.clone();
    assert!(output.contains("Read-only file system"), "{output}");
    let reloads = f.jobs("reload");
    let before = f.elapsed;
    let c = f.at_deadline();
    assert_eq!(f.elapsed - before, Duration::from_secs(1));
    assert_eq!(withdraw_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(f.jobs("reload"), reloads, "2's action is not retried");
    let c = f.withdrawn(3, Ok(()));
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
    f.snapshot(3, Ok("/pub/..g3"));
    f.exit(f.job("check"), FAIL);
    assert_eq!(f.result(0), WatchResult::Invalid);
    // Newer content after that is published as usual, keeping 1.
    assert!(withdraw_asked(&f.content(0, 4)).is_none());
    f.snapshot(4, Ok("/pub/..g4"));
    let c = f.exit(f.job("check"), OK);
    assert_eq!(
        publish_asked(&c),
        Some((PathBuf::from("/pub/..g4"), Keep::Published))
    );
    f.published_over(4, Ok(()), Some("/pub/..g1"));
    f.exit(f.job("reload"), OK);
    let c = f.exit(f.job("verify"), OK);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.core.deadline(), None);

    // While the failing action runs.
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    assert!(
        snapshot_asked(&f.content(0, 3)).is_none(),
        "the action first"
    );
    let c = f.exit(f.job("reload"), FAIL);
    assert!(snapshot_asked(&c).is_none(), "{c:?}");
    assert_eq!(withdraw_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    let c = f.withdrawn(3, Ok(()));
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));

    // Without a generation kept, nothing is withdrawn.
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    f.exit(f.job("reload"), OK);
    f.exit(f.job("verify"), OK);
    assert!(
        f.content(0, 3)
            .iter()
            .all(|c| !matches!(c, Command::Withdraw { .. }))
    );
}

// ---------------------------------------------------------------- metrics

/// The wall clock's seconds at the fake clock's start.
const EPOCH: u64 = 1_800_000_000;

fn metered_watch(action: &str) -> String {
    format!("[[watch]]\nname = \"app\"\npaths = [\"/x\"]\ncheck = [\"chk\"]\n{action}\n")
}

fn sample<'a>(page: &'a str, series: &str) -> &'a str {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{page}"))
}

impl Fake {
    /// A core that has ticked once, with `toml`.
    fn metered(toml: &str) -> Fake {
        let mut f = Fake::new(toml);
        f.tick();
        f
    }

    /// The last job started as `program` exits with `code` after `secs`.
    fn finish(&mut self, program: &str, code: i32, secs: f64) {
        let pid = self.job(program);
        self.elapsed += Duration::from_secs_f64(secs);
        self.exit(pid, ExitStatus::Code(code));
    }

    /// /metrics as it would be served now.
    fn page(&mut self) -> String {
        let status = self.core.status();
        self.core
            .metrics()
            .render(&status, &metrics::WatcherCounts::default())
    }

    /// From the page: (reloads, failed, last successful, seconds from the
    /// fake clock's start to the last success).
    fn reloads(&mut self) -> (u64, u64, bool, Option<u64>) {
        let page = self.page();
        let n = |series: &str| sample(&page, series).parse::<u64>().unwrap();
        let at: f64 = sample(&page, "reloader_last_reload_success_timestamp_seconds")
            .parse()
            .unwrap();
        (
            n("reloader_reloads_total"),
            n("reloader_reloads_failed_total"),
            n("reloader_last_reload_successful") == 1,
            (at > 0.0).then(|| at as u64 - EPOCH),
        )
    }
}

#[test]
fn a_rejected_change_is_a_failed_reload_until_a_good_one_is_applied() {
    let mut r = Fake::metered(&metered_watch("on_change = \"signal\""));
    assert_eq!(r.reloads(), (0, 0, false, None));
    r.content(0, 0);
    r.finish("chk", 0, 0.02);
    assert_eq!(
        r.reloads(),
        (1, 0, true, Some(0)),
        "starting the service on a config that passed is a reload"
    );
    r.elapsed += Duration::from_secs(10);
    r.content(0, 1);
    r.finish("chk", 1, 0.3);
    assert_eq!(r.reloads(), (2, 1, false, Some(0)));
    let page = r.page();
    assert_eq!(sample(&page, "reloader_last_reload_successful"), "0");
    assert_eq!(
        sample(&page, "reloader_last_reload_success_timestamp_seconds"),
        format!("{EPOCH}.020")
    );
    assert_eq!(
        sample(&page, "tend_watch_result{watch=\"app\",result=\"invalid\"}"),
        "1"
    );
    r.at_deadline();
    r.finish("chk", 1, 0.001);
    assert_eq!(
        r.reloads(),
        (3, 2, false, Some(0)),
        "a recheck counts again"
    );
    r.content(0, 2);
    r.finish("chk", 0, 2.0);
    assert_eq!(r.reloads(), (4, 2, true, Some(13)));
    let page = r.page();
    assert_eq!(sample(&page, "reloader_reloads_total"), "4");
    assert_eq!(sample(&page, "reloader_reloads_failed_total"), "2");
    assert_eq!(sample(&page, "reloader_last_reload_successful"), "1");
    for (result, n) in [("passed", 2), ("failed", 2), ("timed_out", 0)] {
        let series = format!("tend_checks_total{{watch=\"app\",result=\"{result}\"}}");
        assert_eq!(sample(&page, &series), n.to_string(), "{result}");
    }
    let bucket = |le: &str| {
        let series = format!("tend_check_duration_seconds_bucket{{watch=\"app\",le=\"{le}\"}}");
        sample(&page, &series).to_string()
    };
    assert_eq!(bucket("0.005"), "1");
    assert_eq!(bucket("0.025"), "2");
    assert_eq!(bucket("0.5"), "3");
    assert_eq!(bucket("2.5"), "4");
    assert_eq!(bucket("+Inf"), "4");
    assert_eq!(
        sample(&page, "tend_check_duration_seconds_sum{watch=\"app\"}"),
        "2.321"
    );
}

#[test]
fn an_invalid_config_at_start_up_is_not_a_successful_reload() {
    let mut r = Fake::metered(&metered_watch("on_change = \"signal\""));
    r.content(0, 0);
    r.finish("chk", 1, 0.0);
    assert_eq!(r.reloads(), (1, 1, false, None));
    let page = r.page();
    assert_eq!(sample(&page, "reloader_last_reload_successful"), "0");
    assert_eq!(
        sample(&page, "reloader_last_reload_success_timestamp_seconds"),
        "0.000"
    );
    assert_eq!(sample(&page, "tend_ready"), "0");
}

#[test]
fn a_failed_action_is_a_failed_reload_and_a_restart_counts_once() {
    let mut r = Fake::metered(&metered_watch("on_change = \"exec\"\nexec = [\"reload\"]"));
    r.content(0, 0);
    r.finish("chk", 0, 0.0);
    r.content(0, 1);
    r.finish("chk", 0, 0.0);
    r.finish("reload", 1, 0.0);
    assert_eq!(r.reloads(), (2, 1, false, Some(0)));
    r.at_deadline();
    r.finish("reload", 0, 0.0);
    assert_eq!(r.reloads(), (3, 1, true, Some(1)), "the retry succeeded");

    let mut r = Fake::metered(&metered_watch("on_change = \"restart\""));
    r.content(0, 0);
    r.finish("chk", 0, 0.0);
    r.content(0, 1);
    r.finish("chk", 0, 0.0);
    let old = r.services()[0];
    r.exit(old, OK);
    assert_eq!(r.reloads(), (2, 0, true, Some(0)), "one reload, not two");
    assert_eq!(
        sample(&r.page(), "tend_service_restarts_total{service=\"svc\"}"),
        "1"
    );
}

#[test]
fn without_watches_there_is_no_reload_to_report() {
    let mut r = Fake::metered("");
    let page = r.page();
    assert!(!page.contains("reloader_"), "{page}");
    assert!(page.contains("\ntend_ready "), "{page}");
}

// ---------------------------------------------------------------- changes, faults and crashes in any order

fn rollback_failed(f: &mut Fake, n: u8) -> Vec<Command> {
    f.send(Event::Done(Done::RolledBack {
        watch: WatchId(0),
        fingerprint: test_fingerprint(n),
        result: Err("cannot create /pub/..data_tmp: No space left on device".into()),
    }))
}

#[test]
fn newer_content_has_a_failed_rollback_tried_again_at_once_not_after_its_back_off() {
    let toml = verified_toml("", "on_change = \"signal\"", "recheck = \"30s\"");
    let mut f = Fake::verified_with(&toml);
    let svc = f.service();
    f.apply_verified(2);
    let (_, c) = f.fail_verify_until_its_time_is_up("HTTP 502");
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    rollback_failed(&mut f, 2);
    let failed_at = f.elapsed;
    assert_eq!(
        f.core.deadline(),
        Some(f.t0 + failed_at + Duration::from_secs(30)),
        "the back-off of a failed publication"
    );
    // The disk has room again, and a newer change comes: it waits for the
    // previous config, which is tried again now.
    f.after(2.0);
    let c = f.content(0, 3);
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    let c = f.rolled_back(2);
    assert_eq!(signalled(&c, svc), [Signal::SIGHUP as i32]);
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
}

#[test]
fn a_change_that_arrives_while_the_first_config_is_published_is_checked_before_the_service_starts()
{
    for newer in [OK, FAIL] {
        let mut f = Fake::new(PUBLISHED);
        f.tick();
        let c = f.candidate(1, "/pub/..g1", OK);
        assert!(published(&c).is_some());
        f.content(0, 2);
        let c = f.publication(1, Ok(()));
        assert!(f.services().is_empty(), "2 is newer and not checked yet");
        assert_eq!(snapshot_asked(&c), Some(test_fingerprint(2)));
        f.snapshot(2, Ok("/pub/..g2"));
        let c = f.exit(f.job("check"), newer);
        if newer == OK {
            assert!(published(&c).is_some());
            assert!(f.services().is_empty(), "not before 2 is published");
            f.publication(2, Ok(()));
            assert_eq!(f.result(0), WatchResult::Applied);
        } else {
            assert_eq!(f.result(0), WatchResult::Invalid);
        }
        assert_eq!(f.services().len(), 1, "started on what is published");
    }
}

#[test]
fn a_restart_for_content_that_newer_content_replaced_still_starts_the_service_and_verifies_it() {
    let toml = verified_toml("restart = \"always\"", "on_change = \"restart\"", "");
    let mut f = Fake::verified_with(&toml);
    let first = f.service();
    f.candidate(2, "/pub/..g2", OK);
    f.content(0, 3);
    let c = f.published_over(2, Ok(()), Some("/pub/..g1"));
    assert_eq!(signalled(&c, first)[0], TERM, "restarted for 2");
    f.exit(first, ExitStatus::Signal(TERM));
    assert_eq!(f.services().len(), 2, "started again, on 2");
    assert_eq!(f.jobs("verify"), 1, "2 is verified before 3 is checked");
    let c = f.exit(f.job("verify"), OK);
    assert_eq!(discarded(&c).as_deref(), Some(Path::new("/pub/..g1")));
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
}

#[test]
fn a_service_that_crashed_on_a_change_starts_again_on_the_config_put_back_while_newer_content_waits()
 {
    let toml = verified_toml("restart = \"always\"", "on_change = \"signal\"", "");
    let mut f = Fake::verified_with(&toml);
    let svc = f.service();
    f.apply_verified(2);
    let c = f.exit(svc, FAIL);
    assert_eq!(rollback_asked(&c).as_deref(), Some(Path::new("/pub/..g1")));
    f.rolled_back(2);
    // Newer content comes while the restart backs off.
    f.content(0, 3);
    let c = f.at_deadline();
    assert_eq!(
        f.services().len(),
        2,
        "started again, on the config put back"
    );
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)), "then 3");
}

#[test]
fn newer_content_after_a_failed_rollback_action_is_applied_and_verified_as_any_change() {
    let mut f = Fake::verified_over_1(&exec_verified_toml());
    f.exit(f.job("reload"), OK);
    f.fail_verify_until_its_time_is_up("HTTP 502");
    f.rolled_back(2);
    f.content(0, 3);
    // The rollback's action fails; 3 is newer.
    let c = f.exit(f.job("reload"), FAIL);
    assert_eq!(snapshot_asked(&c), Some(test_fingerprint(3)));
    f.snapshot(3, Ok("/pub/..g3"));
    let c = f.exit(f.job("check"), OK);
    assert!(published(&c).is_some());
    f.published_over(3, Ok(()), Some("/pub/..g1"));
    f.exit(f.job("reload"), OK);
    assert_eq!(f.result(0), WatchResult::Verifying, "3 is no rollback");
    f.exit(f.job("verify"), OK);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::Ready, true));
}

const FULL: &str = "No space left on device";

/// What a content does to the pipeline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Good,
    /// Fails its check.
    Bad,
    /// Passes its check, fails verify.
    Broken,
}

/// tend's surroundings: answers every command as the watcher thread and
/// the processes would, in an order a seed chooses, with a full disk that
/// fails one `publish` directory request in three while `faults` is on,
/// and (with `restart = "always"`) a service that crashes now and then.
struct World {
    f: Fake,
    rng: u64,
    /// The kind of content `n`.
    kinds: Vec<Kind>,
    /// Candidate generations and the content each holds.
    candidates: Vec<(PathBuf, u8)>,
    published: Option<PathBuf>,
    /// The watcher thread's answers, in order.
    answers: std::collections::VecDeque<Event>,
    /// Processes running: pid and argv.
    running: Vec<(Pid, Vec<String>)>,
    /// Processes signalled to end, to be reaped.
    ending: Vec<(Pid, i32)>,
    /// Spawns answered so far.
    spawns: usize,
    crashes: bool,
    faults: bool,
    log: Vec<String>,
}

impl World {
    fn new(toml: &str, seed: u64) -> World {
        let mut w = World {
            f: Fake::new(toml),
            rng: seed,
            kinds: vec![Kind::Good, Kind::Good],
            candidates: Vec::new(),
            published: None,
            answers: Default::default(),
            running: Vec::new(),
            ending: Vec::new(),
            spawns: 0,
            crashes: toml.contains("restart = \"always\""),
            faults: true,
            log: Vec::new(),
        };
        let c = w.f.tick();
        w.take(c);
        let c = w.f.content(0, 1);
        w.take(c);
        w
    }

    /// splitmix64.
    fn random(&mut self, below: u64) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % below
    }

    fn fails(&mut self) -> bool {
        self.faults && self.random(3) == 0
    }

    fn content_of(&self, dir: &Path) -> u8 {
        self.candidates
            .iter()
            .find(|(d, _)| d == dir)
            .map(|(_, n)| *n)
            .expect("a candidate of the world")
    }

    fn answer(&mut self, done: Done) {
        self.answers.push_back(Event::Done(done));
    }

    /// Takes the commands the core gave.
    fn take(&mut self, commands: Vec<Command>) {
        for c in commands {
            self.log.push(format!("{:?} -> {c:?}", self.f.elapsed));
            match c {
                Command::Snapshot { watch, fingerprint } => {
                    let result = if self.fails() {
                        Err(SnapshotError::Failed(FULL.into()))
                    } else {
                        let dir = PathBuf::from(format!("/pub/..g{}", self.candidates.len()));
                        let n = (0..self.kinds.len() as u8)
                            .find(|n| test_fingerprint(*n) == fingerprint)
                            .expect("content of the world");
                        self.candidates.push((dir.clone(), n));
                        Ok(Candidate {
                            dir,
                            rejected: false,
                        })
                    };
                    self.answer(Done::Snapshot {
                        watch,
                        fingerprint,
                        result,
                    });
                }
                Command::Publish {
                    watch,
                    fingerprint,
                    candidate,
                    keep,
                } => {
                    let result = if self.fails() {
                        Err(FULL.to_string())
                    } else {
                        let previous = match keep {
                            Keep::Nothing => None,
                            Keep::Published => self.published.clone(),
                            Keep::Generation(g) => Some(g),
                        }
                        .filter(|p| *p != candidate);
                        self.published = Some(candidate);
                        Ok(previous)
                    };
                    self.answer(Done::Published {
                        watch,
                        fingerprint,
                        result,
                    });
                }
                Command::Rollback {
                    watch,
                    fingerprint,
                    generation,
                } => {
                    let result = if self.fails() {
                        Err(FULL.to_string())
                    } else {
                        self.published = Some(generation);
                        Ok(())
                    };
                    self.answer(Done::RolledBack {
                        watch,
                        fingerprint,
                        result,
                    });
                }
                Command::Withdraw {
                    watch,
                    fingerprint,
                    kept,
                } => {
                    let result = if self.fails() {
                        Err(FULL.to_string())
                    } else {
                        self.published = Some(kept);
                        Ok(())
                    };
                    self.answer(Done::Withdrawn {
                        watch,
                        fingerprint,
                        result,
                    });
                }
                Command::Spawn { .. } => {
                    let (pid, argv, _) = self.f.spawned[self.spawns].clone();
                    self.spawns += 1;
                    self.running.push((pid, argv));
                }
                Command::Signal { pid, signo, .. } if signo == KILL || signo == TERM => {
                    if let Some(i) = self.running.iter().position(|(p, _)| *p == pid) {
                        self.running.remove(i);
                        self.ending.push((pid, signo));
                    }
                }
                _ => {}
            }
        }
    }

    fn exit(&mut self, pid: Pid, status: ExitStatus) {
        self.log
            .push(format!("{:?} {pid} exits: {status}", self.f.elapsed));
        let c = self.f.exit(pid, status);
        self.take(c);
    }

    /// Ends the job at `i` of `running` as its content says.
    fn end_job(&mut self, i: usize) {
        let (pid, argv) = self.running.remove(i);
        let passes =
            |w: &World, dir: &Path, fails: Kind| w.kinds[w.content_of(dir) as usize] != fails;
        let ok = match argv[0].as_str() {
            "check" => passes(self, Path::new(&argv[1]).parent().unwrap(), Kind::Bad),
            "verify" => self
                .published
                .clone()
                .is_some_and(|p| passes(self, &p, Kind::Broken)),
            _ => true,
        };
        self.exit(pid, if ok { OK } else { FAIL });
    }

    /// One thing happens: the thread answers, a process ends, or time
    /// passes to the core's next deadline. False when nothing is left to
    /// happen.
    fn step(&mut self) -> bool {
        if !self.ending.is_empty() && self.random(2) == 0 {
            let (pid, signo) = self.ending.remove(0);
            self.exit(pid, ExitStatus::Signal(signo));
            return true;
        }
        if self.crashes && self.faults && self.random(20) == 0 {
            if let Some(i) = self.running.iter().position(|(_, a)| a[0] == SVC) {
                let (pid, _) = self.running.remove(i);
                self.exit(pid, FAIL);
                return true;
            }
        }
        // Services run until they are stopped; jobs end, mostly before
        // their timeouts.
        let jobs: Vec<usize> = (0..self.running.len())
            .filter(|i| self.running[*i].1[0] != SVC)
            .collect();
        let answers = self.answers.len().min(1) as u64;
        let choices = answers + jobs.len() as u64;
        let late = choices == 0 || (self.faults && self.random(8) == 0);
        let deadline = self.f.core.deadline().is_some() && late;
        if choices == 0 && !deadline {
            let Some((pid, signo)) = self.ending.pop() else {
                return false;
            };
            self.exit(pid, ExitStatus::Signal(signo));
            return true;
        }
        let pick = self.random(choices + deadline as u64);
        if pick < answers {
            let e = self.answers.pop_front().unwrap();
            self.log.push(format!("{:?} <- {e:?}", self.f.elapsed));
            let c = self.f.send(e);
            self.take(c);
        } else if pick < choices {
            self.end_job(jobs[(pick - answers) as usize]);
        } else {
            let c = self.f.at_deadline();
            self.take(c);
        }
        true
    }

    fn content(&mut self, n: u8) {
        self.log.push(format!(
            "{:?} content {n} {:?}",
            self.f.elapsed, self.kinds[n as usize]
        ));
        let c = self.f.content(0, n);
        self.take(c);
    }

    fn change(&mut self, kind: Kind) -> u8 {
        self.kinds.push(kind);
        let n = self.kinds.len() as u8 - 1;
        self.content(n);
        n
    }
}

/// Changes of every kind (and back to earlier content) arrive at any
/// moment, the `publish` directory fails now and then, the service crashes:
/// once the faults stop, a good change is applied, verified and ready, for
/// every order of events a seed makes (TEND_CORE_SEEDS runs more).
#[test]
fn no_order_of_changes_faults_and_crashes_leaves_a_watch_unable_to_take_the_next_change() {
    let seeds: u64 = std::env::var("TEND_CORE_SEEDS").map_or(1000, |s| s.parse().unwrap());
    for toml in [
        VERIFIED.to_string(),
        exec_verified_toml(),
        verified_toml("restart = \"always\"", "on_change = \"restart\"", ""),
        verified_toml("restart = \"always\"", "on_change = \"signal\"", ""),
        verified_toml("", "on_change = \"signal\"", "splay = \"3s\""),
    ] {
        for seed in 0..seeds {
            let mut w = World::new(&toml, seed);
            for _ in 0..(5 + w.random(30)) {
                match w.random(5) {
                    0 => {
                        let kind = [Kind::Good, Kind::Bad, Kind::Broken][w.random(3) as usize];
                        w.change(kind);
                    }
                    1 => {
                        let n = 1 + w.random(w.kinds.len() as u64 - 1) as u8;
                        w.content(n);
                    }
                    _ => {
                        w.step();
                    }
                }
            }
            w.faults = false;
            let last = w.change(Kind::Good);
            let mut steps = 0;
            while w.step() {
                steps += 1;
                assert!(steps < 500, "seed {seed}: no end\n{}", w.log.join("\n"));
            }
            let published = w.published.clone().map(|p| w.content_of(&p));
            assert!(
                w.f.result(0) == WatchResult::Applied
                    && published == Some(last)
                    && w.f.state() == (State::Ready, true),
                "{toml}\nseed {seed}: {:?}, {:?}, published {published:?}, not {last}\n{}",
                w.f.result(0),
                w.f.state(),
                w.log.join("\n")
            );
        }
    }
}
mod control;
mod paths;
mod reloads;
mod services;
