//! Stopping: SIGTERM, stop_signal, stop_timeout, process groups, and what is
//! left in the container when PID 1 exits.

mod common;

use std::time::Instant;

use common::*;
use nix::sys::signal::Signal;

#[test]
fn sigterm_stops_the_service_and_tend_exits_with_its_status() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n",
        sb.service_toml(&["--term-exit", "7"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 7);
    assert_eq!(sb.log("service sig ").len(), 1);
    assert!(sb.log("service sig ")[0].starts_with("service sig SIGTERM"));
    // The log tells it in the order it happened.
    let err = tend.stderr();
    // Sent from outside the container: there is no pid to name.
    let received = err.find("SIGTERM received: stopping\n").expect(&err);
    let stopping = err.find("stopping the service: SIGTERM").expect(&err);
    assert!(received < stopping, "{err}");
}

#[test]
fn a_service_that_ignores_its_stop_signal_is_killed_after_stop_timeout() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"1s\"\n",
        sb.service_toml(&["--ignore-term"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    let t0 = Instant::now();
    tend.signal(Signal::SIGTERM);
    let code = tend.wait(secs(10.0));
    let took = t0.elapsed();
    assert_eq!(code, 137, "killed by SIGKILL");
    assert!(
        took >= secs(0.9),
        "SIGKILL came after {took:?}, before stop_timeout"
    );
    assert!(took < secs(5.0), "SIGKILL came after {took:?}");
    // The stop signal alone: no SIGCONT for a service that is not stopped.
    let got: Vec<String> = sb
        .log("service sig ")
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert_eq!(got, ["SIGTERM"]);
    assert!(tend.stderr().contains("sending SIGKILL"));
}

#[test]
fn sigterm_is_translated_to_stop_signal() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_signal = \"QUIT\"\nstop_timeout = \"1s\"\n",
        sb.service_toml(&[])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    tend.signal(Signal::SIGTERM);
    sb.wait_log("service sig SIGQUIT", 1, secs(5.0));
    // The service handles SIGQUIT without exiting, so the stop escalates.
    assert_eq!(tend.wait(secs(10.0)), 137);
    assert!(
        sb.log("service sig SIGTERM").is_empty(),
        "SIGTERM is not passed on as is"
    );
}

#[test]
fn with_process_group_signals_reach_the_whole_group() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nprocess_group = true\n",
        sb.service_toml(&["--grandchild"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("grandchild start", 1, secs(10.0));
    tend.signal(Signal::SIGUSR1);
    sb.wait_log("service sig SIGUSR1", 1, secs(5.0));
    sb.wait_log("grandchild sig SIGUSR1", 1, secs(5.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    sb.wait_log("grandchild sig SIGTERM", 1, secs(1.0));
}

#[test]
fn with_process_group_a_stopped_member_is_continued_to_act_on_the_stop_signal() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nprocess_group = true\nstop_timeout = \"30s\"\n",
        sb.service_toml(&["--grandchild", "--ignore-term"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("grandchild start", 1, secs(10.0));
    // Its pid as this test sees it: the service's child.
    let service = svc::host_pid(&mut tend);
    let grandchild: i32 =
        std::fs::read_to_string(format!("/proc/{service}/task/{service}/children"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
    svc::kill_pid(grandchild, Signal::SIGSTOP);
    wait_for("the grandchild to be stopped", secs(5.0), || {
        (process_state(grandchild) == Some('T')).then_some(())
    });
    tend.signal(Signal::SIGTERM);
    // Only a continued grandchild can handle its SIGTERM.
    sb.wait_log("grandchild sig SIGTERM", 1, secs(5.0));
    sb.wait_log("service sig SIGTERM", 1, secs(5.0));
    svc::kill(&mut tend, Signal::SIGKILL);
    svc::kill_pid(grandchild, Signal::SIGKILL);
    assert_eq!(tend.wait(secs(10.0)), 137);
}

#[test]
fn without_process_group_signals_reach_only_the_service() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"5s\"\n",
        sb.service_toml(&["--grandchild"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("grandchild start", 1, secs(10.0));
    tend.signal(Signal::SIGUSR1);
    sb.wait_log("service sig SIGUSR1", 1, secs(5.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    // The grandchild got no SIGUSR1; it was left behind, so it got the
    // container-wide SIGTERM before PID 1 exited.
    assert!(sb.log("grandchild sig SIGUSR1").is_empty());
    assert_eq!(sb.log("grandchild sig SIGTERM").len(), 1);
}

#[test]
fn a_daemon_left_in_the_container_gets_sigterm_before_pid1_exits() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"5s\"\n",
        sb.service_toml(&["--daemon", "term"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("daemon start", 1, secs(10.0));
    let t0 = Instant::now();
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert!(
        t0.elapsed() < secs(4.0),
        "the daemon exits on SIGTERM; tend need not wait"
    );
    assert_eq!(sb.log("daemon sig SIGTERM").len(), 1);
    assert!(tend.stderr().contains("still running in the container"));
}

#[test]
fn a_daemon_that_ignores_sigterm_is_killed_after_stop_timeout() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"1s\"\n",
        sb.service_toml(&[
            "--daemon",
            "ignore-term",
            "--exit-after",
            "0.5",
            "--exit-code",
            "5"
        ])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    let code = tend.wait(secs(10.0));
    assert_eq!(
        code, 5,
        "tend exits with the service's status, not the daemon's"
    );
    assert_eq!(sb.log("daemon sig SIGTERM").len(), 1);
    let took = tend.started.elapsed();
    assert!(
        took >= secs(1.4),
        "the daemon gets stop_timeout before SIGKILL; took {took:?}"
    );
    let err = tend.stderr();
    assert!(err.contains("sending SIGKILL"), "{err}");
}

#[test]
fn tend_as_a_subreaper_leaves_other_processes_alone() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n",
        sb.service_toml(&["--daemon", "term", "--exit-after", "0.2"])
    ));
    let (code, _, _) = sb.tend().not_pid1().config(&cfg).run(secs(10.0));
    assert_eq!(code, 0);
    // Not PID 1: killing "everything" would mean the host. The daemon lives on.
    assert!(sb.log("daemon sig").is_empty());
    let pid: i32 = sb.log("daemon start")[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
}

/// dumb-init without setsid: a stop reaches the service alone, and tend as
/// a subreaper exits with the service's status and leaves the rest of its
/// process group alone.
#[test]
fn a_subreaper_stops_only_the_service_and_leaves_its_group_alone() {
    let sb = Sandbox::new();
    let mut tend = sb
        .tend()
        .not_pid1()
        .command(&sb.service(&["--grandchild", "--exit-after", "60"]))
        .start();
    sb.wait_log("grandchild start", 1, secs(10.0));
    let grandchild: i32 = sb.log("grandchild start")[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap();
    // Gone at the end of the test, however it ends.
    let _left = KillOnDrop(grandchild);
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert!(sb.log("grandchild sig").is_empty(), "{:?}", sb.log(""));
    assert!(
        process_state(grandchild).is_some_and(|s| s != 'Z'),
        "the rest of the group lives on"
    );
}

struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), Signal::SIGKILL);
    }
}

#[test]
fn a_stopped_service_gets_sigcont_with_its_stop_signal() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"30s\"\n",
        sb.service_toml(&[])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    svc::kill(&mut tend, Signal::SIGSTOP);
    wait_for("the service to be stopped", secs(5.0), || {
        tend.children()
            .iter()
            .any(|(_, state)| *state == 'T')
            .then_some(())
    });
    let asked = Instant::now();
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(20.0)), 0, "it handled SIGTERM, not SIGKILL");
    assert!(asked.elapsed() < secs(10.0), "well before stop_timeout");
    assert!(sb.log("service sig SIGTERM").len() == 1);
}
