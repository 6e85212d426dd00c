//! Several services: start order, exit policy, stop order, and watches
//! that act on their own service only.

use super::*;

/// `migrate` (a oneshot), then `app` (main), then `web` after `app`.
const CHAIN: &str = "\
[[service]]\nname = \"migrate\"\ncommand = [\"migrate\"]\noneshot = true\n\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"migrate\"]\n\
[[service]]\nname = \"web\"\ncommand = [\"web\"]\nafter = [\"app\"]\n";

#[test]
fn a_oneshot_runs_first_and_what_is_after_it_starts_once_it_exited_0() {
    let mut f = Fake::new(CHAIN);
    f.tick();
    assert_eq!(f.starts("migrate"), 1);
    assert_eq!(f.starts("app"), 0, "app waits for migrate");
    assert_eq!(f.starts("web"), 0);
    assert_eq!(f.state(), (State::Starting, false));
    f.after(120.0);
    assert_eq!(
        f.core.deadline(),
        None,
        "a oneshot may take long: no ready_timeout"
    );
    let migrate = f.pid_of("migrate");
    f.exit(migrate, OK);
    assert_eq!(f.service_state("migrate"), "done");
    assert_eq!(f.starts("app"), 1, "app starts once migrate is done");
    assert_eq!(
        f.starts("web"),
        1,
        "web is after app, which is ready at once"
    );
    assert_eq!(f.state(), (State::Ready, true));
}

#[test]
fn a_failing_required_oneshot_ends_the_container_with_its_status() {
    let mut f = Fake::new(CHAIN);
    f.tick();
    let migrate = f.pid_of("migrate");
    let c = f.exit(migrate, ExitStatus::Code(3));
    assert_eq!(c, vec![Command::Reap], "nothing else runs: drain");
    let c = f.no_children();
    assert_eq!(exited(&c), Some(3));
    assert_eq!(f.starts("app"), 0, "nothing after it started");
    assert_eq!(f.starts("web"), 0);
}

#[test]
fn a_oneshot_with_on_failure_is_retried_with_a_back_off() {
    let toml = CHAIN.replace(
        "oneshot = true\n",
        "oneshot = true\nrestart = \"on-failure\"\n",
    );
    let mut f = Fake::new(&toml);
    f.tick();
    f.exit(f.pid_of("migrate"), ExitStatus::Code(1));
    assert_eq!(f.service_state("migrate"), "backing_off");
    f.at_deadline();
    assert_eq!(f.starts("migrate"), 2, "retried");
    f.exit(f.pid_of("migrate"), OK);
    assert_eq!(f.starts("app"), 1);
}

#[test]
fn the_main_service_ending_stops_the_others_and_tend_exits_with_its_status() {
    let mut f = Fake::new(CHAIN);
    f.tick();
    f.exit(f.pid_of("migrate"), OK);
    let (app, web) = (f.pid_of("app"), f.pid_of("web"));
    let c = f.exit(app, ExitStatus::Code(3));
    assert_eq!(signalled(&c, web), vec![TERM]);
    assert_eq!(exited(&c), None);
    let c = f.exit(web, ExitStatus::Signal(15));
    assert_eq!(c, vec![Command::Reap]);
    assert_eq!(
        exited(&f.no_children()),
        Some(3),
        "the main service's status"
    );
}

#[test]
fn a_required_helper_that_ends_for_good_ends_the_container_with_its_status() {
    let mut f = Fake::new(CHAIN);
    f.tick();
    f.exit(f.pid_of("migrate"), OK);
    let (app, web) = (f.pid_of("app"), f.pid_of("web"));
    let c = f.exit(web, ExitStatus::Signal(9));
    assert_eq!(signalled(&c, app), vec![TERM]);
    f.exit(app, OK);
    assert_eq!(
        exited(&f.no_children()),
        Some(137),
        "128 + SIGKILL, the helper's"
    );
}

#[test]
fn a_helper_that_is_not_required_ends_and_the_container_goes_on() {
    let toml = "\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\n\
[[service]]\nname = \"exporter\"\ncommand = [\"exporter\"]\nrequired = false\n\
[[service]]\nname = \"shipper\"\ncommand = [\"shipper\"]\nafter = [\"exporter\"]\nrequired = false\n";
    let mut f = Fake::new(toml);
    f.tick();
    let exporter = f.pid_of("exporter");
    assert_eq!(f.starts("shipper"), 1);
    let c = f.exit(exporter, ExitStatus::Code(1));
    assert!(exited(&c).is_none() && !c.contains(&Command::Reap));
    assert_eq!(f.service_state("exporter"), "ended");
    assert_eq!(
        f.state(),
        (State::Ready, true),
        "not required: not needed for readiness"
    );
    let st = f.core.status();
    let e = st.services.iter().find(|s| s.name == "exporter").unwrap();
    assert_eq!(
        (e.last_exit.as_deref(), e.last_exit_code),
        (Some("exit code 1"), Some(1))
    );

    // One that cannot even start: what is after it starts anyway.
    let toml = "\
[[service]]\nname = \"exporter\"\ncommand = [\"exporter\"]\nrequired = false\n\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\nmain = true\n\
[[service]]\nname = \"shipper\"\ncommand = [\"shipper\"]\nafter = [\"exporter\"]\nrequired = false\n";
    let mut f = Fake::new(toml);
    f.fail_next_spawn = Some(127);
    let c = f.tick();
    assert!(exited(&c).is_none());
    assert_eq!(f.service_state("exporter"), "ended");
    assert_eq!((f.starts("app"), f.starts("shipper")), (1, 1));
}

#[test]
fn stop_order_is_the_reverse_of_after_and_unrelated_services_stop_together() {
    let toml = "\
[[service]]\nname = \"db\"\ncommand = [\"db\"]\n\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"db\"]\nmain = true\n\
[[service]]\nname = \"logs\"\ncommand = [\"logs\"]\nstop_timeout = \"3s\"\n";
    let mut f = Fake::new(toml);
    f.tick();
    let (db, app, logs) = (f.pid_of("db"), f.pid_of("app"), f.pid_of("logs"));
    let c = f.signal(TERM);
    assert_eq!(signalled(&c, app), vec![TERM]);
    assert_eq!(signalled(&c, logs), vec![TERM]);
    assert!(
        signalled(&c, db).is_empty(),
        "db waits until app, after it, is gone"
    );
    // logs ignores SIGTERM: killed at its own stop_timeout, not waited for
    // by db.
    let c = f.after(3.0);
    assert_eq!(signalled(&c, logs), vec![KILL]);
    let c = f.exit(app, ExitStatus::Code(0));
    assert_eq!(signalled(&c, db), vec![TERM]);
    f.exit(logs, ExitStatus::Signal(9));
    let c = f.exit(db, OK);
    assert_eq!(c, vec![Command::Reap]);
    assert_eq!(
        exited(&f.no_children()),
        Some(0),
        "the main service's status"
    );
}

#[test]
fn signals_from_outside_go_to_the_main_service_only() {
    let mut f = Fake::new(CHAIN);
    f.tick();
    f.exit(f.pid_of("migrate"), OK);
    let (app, web) = (f.pid_of("app"), f.pid_of("web"));
    let c = f.signal(Signal::SIGHUP as i32);
    assert_eq!(
        c,
        vec![Command::Forward {
            pid: app,
            group: false,
            signo: Signal::SIGHUP as i32,
            from: 7
        }]
    );
    assert!(signalled(&c, web).is_empty());
}

const TWO_WATCHED: &str = "\
[[service]]\nname = \"web\"\ncommand = [\"web\"]\nafter = [\"php\"]\n\
[[service]]\nname = \"php\"\ncommand = [\"php\"]\n\
[[watch]]\nname = \"nginx\"\nservice = \"web\"\npaths = [\"/n\"]\ncheck = [\"nginx-t\"]\non_change = \"signal\"\n\
[[watch]]\nname = \"pool\"\nservice = \"php\"\npaths = [\"/p\"]\ncheck = [\"php-t\"]\non_change = \"signal\"\nsignal = \"SIGUSR2\"\n";

/// Both services started on checked content.
fn two_watched() -> Fake {
    let mut f = Fake::new(TWO_WATCHED);
    f.tick();
    f.content(0, 0);
    f.content(1, 0);
    assert_eq!(f.starts("php"), 0, "not before its config passed");
    f.exit(f.job("php-t"), OK);
    assert_eq!(f.starts("php"), 1);
    assert_eq!(f.starts("web"), 0, "web waits for its own config");
    f.exit(f.job("nginx-t"), OK);
    assert_eq!(f.starts("web"), 1);
    assert_eq!(f.state(), (State::Ready, true));
    f
}

#[test]
fn a_watch_acts_on_its_own_service_and_a_rejected_change_leaves_the_other_alone() {
    let mut f = two_watched();
    let (web, php) = (f.pid_of("web"), f.pid_of("php"));
    f.content(1, 1);
    let c = f.exit(f.job("php-t"), OK);
    assert_eq!(signalled(&c, php), vec![Signal::SIGUSR2 as i32]);
    assert!(signalled(&c, web).is_empty(), "nginx is not touched");
    // Both change at once: each acts on its own.
    f.content(0, 2);
    f.content(1, 2);
    let c = f.exit(f.job("nginx-t"), OK);
    assert_eq!(
        signalled(&c, web),
        vec![Signal::SIGHUP as i32],
        "web does not wait for php's check"
    );
    let c = f.exit(f.job("php-t"), FAIL);
    assert!(signalled(&c, php).is_empty());
    assert_eq!(f.result(1), WatchResult::Invalid);
    assert_eq!(f.result(0), WatchResult::Applied);
    assert_eq!(f.state(), (State::InvalidConfig, false));
    let st = f.core.status();
    assert_eq!(
        (
            st.watches[0].service.as_str(),
            st.watches[1].service.as_str()
        ),
        ("web", "php")
    );
}

#[test]
fn after_orders_starts_only_and_a_restart_waits_again_for_what_it_is_after() {
    let toml = "\
[[service]]\nname = \"db\"\ncommand = [\"db\"]\nrestart = \"always\"\nnotify = true\n\
[[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"db\"]\nmain = true\nrestart = \"always\"\n";
    let mut f = Fake::custom(toml, true, |k| k.notify = false);
    f.tick();
    assert_eq!(f.starts("app"), 0, "app waits for db's READY=1");
    let db = f.pid_of("db");
    f.send(Event::Notify {
        chain: vec![db],
        message: Notification::parse(b"READY=1"),
    });
    assert_eq!(f.starts("app"), 1);
    let app = f.pid_of("app");
    // db restarts: app keeps running.
    let c = f.exit(db, ExitStatus::Code(1));
    assert!(signalled(&c, app).is_empty(), "app is not stopped");
    assert!(!f.state().1, "db is required: not ready without it");
    f.at_deadline();
    assert_eq!(f.starts("db"), 2);
    // app restarts while db is not ready: it waits for db again.
    f.exit(app, ExitStatus::Code(1));
    f.at_deadline();
    assert_eq!(f.starts("app"), 1, "waits for db's READY=1");
    let db = f.pid_of("db");
    f.send(Event::Notify {
        chain: vec![db],
        message: Notification::parse(b"READY=1"),
    });
    assert_eq!(f.starts("app"), 2);
    assert_eq!(f.state(), (State::Ready, true));
}
