//! Readiness of the service (ready_check, ready_timeout) and overlap
//! restarts: the new instance starts next to the old one, which is stopped
//! only once the new one is ready.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::kubelet::project;
use common::*;

/// `ready_check` passes while `marker` exists.
fn ready_check(marker: &Path) -> String {
    toml_list(&["test".into(), "-e".into(), marker.display().to_string()])
}

/// A kubelet volume at config/ restarting the service with `mode`, ready
/// while `marker` exists.
fn overlap(sb: &Sandbox, marker: &Path, extra: &str) -> PathBuf {
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    sb.config(&format!(
        "[service]\ncommand = {}\nrestart_mode = \"overlap\"\nready_check = {}\n{extra}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"restart\"\n",
        sb.service_toml(&["--config", &vol.join("app.conf").display().to_string()]),
        ready_check(marker),
        sb.readiness_toml(),
        vol.display().to_string(),
    ))
}

/// The pid= of each `service start` line.
fn start_pids(sb: &Sandbox) -> Vec<i64> {
    sb.log("service start")
        .iter()
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("pid="))
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn with_ready_check_tend_is_ready_only_once_it_passes() {
    let sb = Sandbox::new();
    let marker = sb.path("serving");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nready_check = {}\n{}",
        sb.service_toml(&[]),
        ready_check(&marker),
        sb.readiness_toml()
    ));
    let _tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    let st = sb.wait_state("starting", secs(5.0));
    assert_eq!(st["ready"], false);
    assert!(st["service"]["pid"].as_i64().is_some());
    std::thread::sleep(secs(0.3));
    assert!(!sb.is_ready(), "not ready before ready_check passes");
    fs::write(&marker, "").unwrap();
    sb.wait_ready(true, secs(5.0));
}

#[test]
fn a_start_not_ready_within_ready_timeout_has_failed_and_is_restarted() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nready_check = [\"false\"]\nready_timeout = \"500ms\"\nrestart = \"on-failure\"\n{}",
        sb.service_toml(&[]),
        sb.readiness_toml()
    ));
    let tend = sb.tend().config(&cfg).start();
    tend.wait_stderr("did not become ready within 500ms: stopping it", secs(10.0));
    sb.wait_log("service sig SIGTERM", 1, secs(5.0));
    sb.wait_log("service start", 2, secs(10.0));
    assert!(!sb.is_ready());
}

#[test]
fn an_overlap_restart_stops_the_old_instance_only_once_the_new_one_is_ready() {
    let sb = Sandbox::new();
    let marker = sb.path("serving");
    fs::write(&marker, "").unwrap();
    let cfg = overlap(&sb, &marker, "");
    let _tend = sb.tend().config(&cfg).start_ready();
    fs::remove_file(&marker).unwrap();
    project(&sb.path("config"), &[("app.conf", "v1")]);
    sb.wait_log("service start", 2, secs(10.0));
    let st = wait_for("two instances in the status", secs(5.0), || {
        sb.status()
            .filter(|s| s["service"]["instances"].as_array().map(Vec::len) == Some(2))
    });
    assert_eq!(st["state"], "restarting");
    assert_eq!(st["ready"], true, "the old instance still serves");
    std::thread::sleep(secs(0.3));
    assert!(
        sb.log("service sig SIGTERM").is_empty(),
        "the old instance is not stopped before the new one is ready"
    );
    fs::write(&marker, "").unwrap();
    sb.wait_log("service sig SIGTERM", 1, secs(5.0));
    let pids = start_pids(&sb);
    let st = wait_for("the new instance alone", secs(5.0), || {
        sb.status()
            .filter(|s| s["service"]["instances"].as_array().map(Vec::len) == Some(1))
    });
    assert_eq!(st["service"]["pid"].as_i64(), Some(pids[1]));
    assert_eq!(st["watches"][0]["result"], "applied");
    sb.wait_ready(true, secs(5.0));
    assert!(
        sb.log("service start")
            .last()
            .unwrap()
            .ends_with("config=v1")
    );
}

#[test]
fn a_new_instance_never_ready_is_stopped_and_the_old_one_keeps_serving() {
    let sb = Sandbox::new();
    let marker = sb.path("serving");
    fs::write(&marker, "").unwrap();
    let cfg = overlap(&sb, &marker, "ready_timeout = \"1s\"");
    let tend = sb.tend().config(&cfg).start_ready();
    fs::remove_file(&marker).unwrap();
    project(&sb.path("config"), &[("app.conf", "v1")]);
    tend.wait_stderr(
        "the new instance did not become ready within 1s: it is stopped and the old one keeps serving",
        secs(10.0),
    );
    let pids = start_pids(&sb);
    let st = sb.wait_state("reloading", secs(5.0));
    assert_eq!(st["service"]["pid"].as_i64(), Some(pids[0]), "{st}");
    assert_eq!(st["watches"][0]["result"], "action_failed");
    sb.wait_log("service exit", 1, secs(5.0));
    assert_eq!(
        sb.log("service sig SIGTERM").len(),
        1,
        "only the new one was stopped"
    );
}

/// The NOTIFY_SOCKET the service got, from its environment.
fn notify_socket(tend: &mut Tend) -> String {
    let pid = common::svc::host_pid(tend);
    let env = fs::read(format!("/proc/{pid}/environ")).unwrap();
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"NOTIFY_SOCKET="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("the service has NOTIFY_SOCKET")
}

#[test]
fn with_notify_a_ready_1_from_outside_the_service_is_ignored() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nnotify = true\nready_timeout = \"2s\"\nrestart = \"on-failure\"\n{}",
        sb.service_toml(&[]),
        sb.readiness_toml()
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    let path = notify_socket(&mut tend);
    // From a process in tend's PID namespace, but not of the service's tree
    // (from outside the namespace the kernel gives no sender pid at all,
    // and the message is dropped too).
    let sent = std::process::Command::new("nsenter")
        .args(["-t", &tend.pid().to_string(), "-p", "python3", "-c"])
        .arg(format!(
            "import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'READY=1', {path:?})"
        ))
        .status()
        .unwrap();
    assert!(sent.success());
    tend.wait_stderr("outside the service's process tree", secs(5.0));
    assert!(
        !sb.is_ready(),
        "READY=1 from the test process does not count"
    );
    // The service itself never says READY=1: its start fails.
    tend.wait_stderr(
        "did not become ready within 2s (nothing was received on NOTIFY_SOCKET from it): stopping it",
        secs(10.0),
    );
    sb.wait_log("service start", 2, secs(10.0));
}

/// A service with sd_notify: READY=1 at start; on SIGHUP it says
/// RELOADING=1, rereads its config and says READY=1, unless the config says
/// `hang` (then it says nothing, as gunicorn does) or `stall` (then it says
/// RELOADING=1 and never READY=1).
const NOTIFYING_SERVICE: &str = r#"
import os, signal, socket, sys, time
conf, log = sys.argv[1], sys.argv[2]
def say(m):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(m.encode(), os.environ["NOTIFY_SOCKET"])
def note(line):
    with open(log, "a") as f:
        f.write(line + "\n")
def reload(*_):
    text = open(conf).read().strip()
    note("reload " + text)
    if text == "stall":
        say("RELOADING=1")
    elif text != "hang":
        say("RELOADING=1")
        say("READY=1\nSTATUS=serving " + text)
signal.signal(signal.SIGHUP, reload)
say("READY=1\nSTATUS=serving " + open(conf).read().strip())
while True:
    time.sleep(1)
"#;

#[test]
fn with_notify_a_signal_reload_is_applied_once_sent_and_a_reload_the_service_announces_must_finish()
{
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let script = sb.write("svc.py", NOTIFYING_SERVICE);
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"python3\", {:?}, {:?}, {:?}]\nnotify = true\nready_timeout = \"1s\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"signal\"\nsignal = \"SIGHUP\"\n",
        script.display().to_string(),
        vol.join("app.conf").display().to_string(),
        sb.path("reloads.log").display().to_string(),
        sb.readiness_toml(),
        vol.display().to_string(),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(10.0));
    // A service that says nothing on SIGHUP (gunicorn): applied once sent.
    project(&vol, &[("app.conf", "hang")]);
    tend.wait_stderr("sent SIGHUP to the service: config applied", secs(10.0));
    wait_for("the service's reload", secs(5.0), || {
        std::fs::read_to_string(sb.path("reloads.log"))
            .ok()
            .filter(|l| l.contains("reload hang"))
    });
    let st = sb.wait_state("ready", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "applied");
    // One that announces the reload: not ready until its READY=1.
    project(&vol, &[("app.conf", "v1")]);
    wait_for("serving v1", secs(10.0), || {
        sb.status()
            .filter(|s| s["service"]["status"] == "serving v1" && s["ready"] == true)
    });
    // One that announces it and never finishes: stopped at ready_timeout,
    // and the restart policy (never) ends tend with its status.
    project(&vol, &[("app.conf", "stall")]);
    tend.wait_stderr(
        "sent RELOADING=1 but no READY=1 within 1s (last heard: STATUS=serving v1): stopping it",
        secs(10.0),
    );
    assert_eq!(tend.wait(secs(10.0)), 128 + libc::SIGTERM);
}

#[test]
fn with_reload_notify_a_signal_reload_is_applied_once_the_service_confirms_it() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let script = sb.write("svc.py", NOTIFYING_SERVICE);
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"python3\", {:?}, {:?}, {:?}]\nnotify = true\nreload_notify = true\nready_timeout = \"1s\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"signal\"\nsignal = \"SIGHUP\"\n",
        script.display().to_string(),
        vol.join("app.conf").display().to_string(),
        sb.path("reloads.log").display().to_string(),
        sb.readiness_toml(),
        vol.display().to_string(),
    ));
    let tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(10.0));
    assert_eq!(sb.status().unwrap()["service"]["status"], "serving v0");
    project(&vol, &[("app.conf", "v1")]);
    tend.wait_stderr(
        "the service confirmed the reload: config applied",
        secs(10.0),
    );
    let st = wait_for("serving v1", secs(5.0), || {
        sb.status()
            .filter(|s| s["service"]["status"] == "serving v1")
    });
    assert_eq!(st["watches"][0]["result"], "applied");
    // A reload the service never confirms fails after ready_timeout.
    project(&vol, &[("app.conf", "hang")]);
    tend.wait_stderr("did not confirm the reload within 1s", secs(10.0));
    let st = sb.wait_state("reloading", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "action_failed");
    assert_eq!(st["ready"], false);
}
