//! `tend signal` and `tend restart`: what each request does to one service,
//! and what it answers.

use super::*;

impl Fake {
    /// Sends a control request; returns the commands and the answer.
    fn ask(&mut self, request: ControlRequest) -> (Vec<Command>, i32, String) {
        let c = self.send(Event::Control {
            client: 9,
            from: 55,
            request,
        });
        let answers: Vec<(i32, String)> = c
            .iter()
            .filter_map(|c| match c {
                Command::Answer {
                    client: 9,
                    code,
                    message,
                } => Some((*code, message.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(answers.len(), 1, "one answer: {c:?}");
        let (code, message) = answers[0].clone();
        (c, code, message)
    }

    fn restart(&mut self, name: &str) -> (Vec<Command>, i32, String) {
        self.ask(ControlRequest::Restart {
            service: name.into(),
        })
    }

    fn kill(&mut self, name: &str, signo: i32) -> (Vec<Command>, i32, String) {
        self.ask(ControlRequest::Signal {
            service: name.into(),
            signo,
        })
    }
}

/// `app` (main) and a `helper`.
const PAIR: &str = "\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\n\
[[service]]\nname = \"helper\"\ncommand = [\"helper\"]\nstop_signal = \"SIGQUIT\"\n";

fn pair(more: &str) -> Fake {
    let mut f = Fake::new(&format!("{PAIR}{more}"));
    f.tick();
    assert_eq!(f.state(), (State::Ready, true));
    f
}

#[test]
fn a_restart_stops_the_helper_and_starts_it_again_and_leaves_the_main_service_alone() {
    let mut f = pair("");
    let (app, helper) = (f.pid_of("app"), f.pid_of("helper"));
    let (c, code, message) = f.restart("helper");
    assert_eq!(code, 0);
    assert_eq!(
        message,
        format!("restarting helper (pid {helper}): SIGQUIT, then a new instance starts")
    );
    assert_eq!(signalled(&c, helper), vec![Signal::SIGQUIT as i32]);
    assert!(signalled(&c, app).is_empty());
    assert_eq!(f.service_entry("helper").state, "restarting");
    let c = f.exit(helper, ExitStatus::Signal(Signal::SIGQUIT as i32));
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(1))]);
    assert_eq!(f.starts("app"), 1, "the main service keeps running");
    let entry = f.service_entry("helper");
    assert_eq!((entry.state.as_str(), entry.restarts), ("running", 1));
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn an_overlap_restart_starts_the_new_instance_before_the_old_one_stops() {
    let mut f = Fake::new(&format!(
        "{PAIR}restart_mode = \"overlap\"\nready_check = [\"probe\"]\n"
    ));
    f.tick();
    f.exit(f.job("probe"), OK);
    let old = f.pid_of("helper");
    let (c, code, message) = f.restart("helper");
    assert_eq!(code, 0, "{message}");
    assert!(
        message.contains("a new instance starts next to it"),
        "{message}"
    );
    assert_eq!(spawns(&c)[0], SpawnKind::Service(ServiceId(1)));
    assert!(
        signalled(&c, old).is_empty(),
        "the old one serves meanwhile"
    );
    let new = f.pid_of("helper");
    assert_ne!(new, old);
    let (_, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (1, "a restart of helper is already under way")
    );
    let c = f.exit(f.job("probe"), OK);
    assert_eq!(signalled(&c, old), vec![Signal::SIGQUIT as i32]);
    assert_eq!(f.service_entry("helper").pid, Some(new.as_raw()));
}

#[test]
fn a_signal_goes_to_the_serving_instance_of_that_service_and_names_its_pid() {
    let mut f = pair("process_group = true\n");
    let (app, helper) = (f.pid_of("app"), f.pid_of("helper"));
    let (c, code, message) = f.kill("helper", Signal::SIGUSR1 as i32);
    assert_eq!(
        (code, message),
        (
            0,
            format!("sent SIGUSR1 to helper's process group (pid {helper})")
        )
    );
    assert!(c.contains(&Command::Signal {
        pid: helper,
        group: true,
        signo: Signal::SIGUSR1 as i32
    }));
    let (c, code, message) = f.kill("app", Signal::SIGHUP as i32);
    assert_eq!(
        (code, message),
        (0, format!("sent SIGHUP to app (pid {app})"))
    );
    assert_eq!(signalled(&c, app), vec![Signal::SIGHUP as i32]);
    assert!(signalled(&c, helper).is_empty());
}

#[test]
fn an_unknown_name_is_answered_with_the_names_and_nothing_is_done() {
    let mut f = pair("");
    for (c, code, message) in [f.restart("db"), f.kill("db", Signal::SIGHUP as i32)] {
        assert_eq!(
            (code, message.as_str()),
            (2, "no service \"db\": the services are app, helper")
        );
        assert_eq!(c.len(), 1, "the answer only: {c:?}");
    }
}

#[test]
fn a_service_that_is_not_running_gets_no_signal_and_the_answer_says_why() {
    let mut f = pair("restart = \"always\"\n");
    f.exit(f.pid_of("helper"), ExitStatus::Code(3));
    let (c, code, message) = f.kill("helper", Signal::SIGHUP as i32);
    assert_eq!(
        (code, message.as_str()),
        (
            1,
            "helper is not running (backing_off, last exit code 3): SIGHUP was not sent"
        )
    );
    assert_eq!(c.len(), 1);
}

#[test]
fn a_service_backing_off_after_a_crash_is_started_at_once() {
    let mut f = pair("restart = \"always\"\n");
    f.exit(f.pid_of("helper"), ExitStatus::Code(3));
    assert!(f.core.deadline().is_some(), "its back-off");
    let (c, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (
            0,
            "starting helper now: it was waiting out its restart back-off after exit code 3"
        )
    );
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(1))]);
    assert_eq!(f.core.deadline(), None, "no back-off left");
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_finished_oneshot_runs_again_and_the_container_is_not_ready_meanwhile() {
    let mut f = Fake::new(
        "[[service]]\nname = \"migrate\"\ncommand = [\"migrate\"]\noneshot = true\n\
         [[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"migrate\"]\n",
    );
    f.tick();
    f.exit(f.pid_of("migrate"), OK);
    assert_eq!(f.state(), (State::Ready, true));
    let app = f.pid_of("app");
    let (c, code, message) = f.restart("migrate");
    assert_eq!(
        (code, message.as_str()),
        (0, "starting migrate now: the oneshot had finished")
    );
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(0))]);
    assert!(signalled(&c, app).is_empty(), "what is after it runs on");
    assert!(!f.state().1, "a required oneshot that runs is not done");
    f.exit(f.pid_of("migrate"), OK);
    assert_eq!(f.service_entry("migrate").state, "done");
    assert_eq!(f.state(), (State::Ready, true));
    assert_eq!(f.pid_of("app"), app);
}

#[test]
fn a_service_that_ended_and_is_not_required_is_started_again() {
    let mut f = pair("required = false\n");
    f.exit(f.pid_of("helper"), ExitStatus::Code(1));
    assert_eq!(f.service_entry("helper").state, "ended");
    let (c, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (0, "starting helper now: it had ended (exit code 1)")
    );
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(1))]);
    assert_eq!(f.service_entry("helper").state, "running");
    // It ends again under its own policy, and the container goes on.
    let c = f.exit(f.pid_of("helper"), ExitStatus::Code(1));
    assert_eq!(exited(&c), None);
    assert_eq!(f.service_entry("helper").state, "ended");
}

#[test]
fn a_restart_under_way_is_not_started_twice() {
    let mut f = pair("");
    let helper = f.pid_of("helper");
    f.restart("helper");
    let (c, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (1, "a restart of helper is already under way")
    );
    assert_eq!(c.len(), 1, "{c:?}");
    f.exit(helper, OK);
    assert_eq!(f.starts("helper"), 2, "one new instance");
}

const WATCHED_HELPER: &str = "\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\n\
[[service]]\nname = \"helper\"\ncommand = [\"helper\"]\n\
[[watch]]\nname = \"conf\"\nservice = \"helper\"\npaths = [\"/c\"]\ncheck = [\"check\"]\non_change = \"signal\"\n";

#[test]
fn a_service_down_until_its_config_passes_is_not_started_by_a_restart() {
    let mut f = Fake::new(WATCHED_HELPER);
    f.tick();
    f.content(0, 1);
    f.exit(f.job("check"), FAIL);
    assert_eq!(f.starts("helper"), 0);
    let (c, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (
            1,
            "helper is down: it starts as soon as the config of watch \"conf\" passes its check"
        )
    );
    assert!(spawns(&c).is_empty());
}

#[test]
fn a_running_service_whose_new_config_was_rejected_is_not_taken_down_by_a_restart() {
    let mut f = Fake::new(WATCHED_HELPER);
    f.tick();
    f.content(0, 1);
    f.exit(f.job("check"), OK);
    let helper = f.pid_of("helper");
    f.content(0, 2);
    // Being checked: a new instance would read unchecked content.
    let (c, code, message) = f.restart("helper");
    assert_eq!(code, 1, "{message}");
    assert!(signalled(&c, helper).is_empty());
    f.exit(f.job("check"), FAIL);
    let (c, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (
            1,
            "helper is not restarted: it would not start again until the config of watch \
             \"conf\" passes its check"
        )
    );
    assert!(signalled(&c, helper).is_empty(), "it keeps running");
    // A signal still reaches it.
    let (_, code, _) = f.kill("helper", Signal::SIGUSR2 as i32);
    assert_eq!(code, 0);
}

#[test]
fn a_service_is_not_restarted_while_what_it_starts_after_is_not_ready() {
    let toml = "\
[[service]]\nname = \"db\"\ncommand = [\"db\"]\nrestart = \"always\"\nnotify = true\n\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"db\"]\nmain = true\n";
    let mut f = Fake::custom(toml, true, |k| k.notify = false);
    f.tick();
    let (_, code, message) = f.restart("app");
    assert_eq!(
        (code, message.as_str()),
        (
            1,
            "app is down: it starts as soon as db (which it starts after) is ready"
        )
    );
    f.send(Event::Notify {
        chain: vec![f.pid_of("db")],
        message: Notification::parse(b"READY=1"),
    });
    let app = f.pid_of("app");
    // db restarts; app runs on, and would wait for db if it stopped now.
    f.exit(f.pid_of("db"), ExitStatus::Code(1));
    let (c, code, message) = f.restart("app");
    assert_eq!(
        (code, message.as_str()),
        (
            1,
            "app is not restarted: it would not start again until db (which it starts after) \
             is ready"
        )
    );
    assert!(signalled(&c, app).is_empty());
}

#[test]
fn while_tend_stops_nothing_is_restarted_but_a_signal_still_reaches_a_service() {
    let mut f = pair("stop_timeout = \"30s\"\n");
    let helper = f.pid_of("helper");
    f.signal(TERM);
    let (c, code, message) = f.restart("helper");
    assert_eq!(
        (code, message.as_str()),
        (1, "tend is stopping: helper is not restarted")
    );
    assert!(spawns(&c).is_empty());
    // One that ignores its stop signal can be killed by hand.
    let (c, code, _) = f.kill("helper", KILL);
    assert_eq!(code, 0);
    assert_eq!(signalled(&c, helper), vec![KILL]);
}

#[test]
fn a_restart_of_the_main_service_goes_the_way_of_a_restart_action() {
    let mut f = pair("");
    let (app, helper) = (f.pid_of("app"), f.pid_of("helper"));
    let (c, code, _) = f.restart("app");
    assert_eq!(code, 0);
    assert_eq!(signalled(&c, app), vec![TERM]);
    assert_eq!(f.state(), (State::Restarting, false));
    let c = f.exit(app, ExitStatus::Signal(TERM));
    assert_eq!(exited(&c), None, "a restart does not end the container");
    assert_eq!(spawns(&c), vec![SpawnKind::Service(ServiceId(0))]);
    assert_eq!(f.pid_of("helper"), helper);
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_service_that_reloads_on_its_own_account_can_be_restarted() {
    let mut f = Fake::new(&format!("{PAIR}notify = true\n"));
    f.tick();
    let helper = f.pid_of("helper");
    for message in [&b"READY=1"[..], b"RELOADING=1"] {
        f.send(Event::Notify {
            chain: vec![helper],
            message: Notification::parse(message),
        });
    }
    assert_eq!(f.service_entry("helper").state, "reloading");
    let (c, code, message) = f.restart("helper");
    assert_eq!(code, 0, "{message}");
    assert_eq!(signalled(&c, helper), vec![Signal::SIGQUIT as i32]);
}
