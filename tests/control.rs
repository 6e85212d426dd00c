//! `tend signal` and `tend restart` against tend as PID 1: one service is
//! acted on through the control socket beside the status file, the others
//! run on; only tend's user may ask; a client that hangs holds up nothing.

mod common;

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::svc::host_pid_of;
use common::*;
use nix::sys::signal::Signal;

/// `[[service]]` tables for `app` (main) and `helper`, the instrumented
/// service tagged with its name; `helper` gets `more`.
fn pair(sb: &Sandbox, more: &str) -> PathBuf {
    sb.config(&format!(
        "[[service]]\nname = \"app\"\ncommand = {}\n\
         [[service]]\nname = \"helper\"\ncommand = {}\n{more}\n{}",
        sb.service_toml(&["--tag", "app"]),
        sb.service_toml(&["--tag", "helper"]),
        sb.readiness_toml()
    ))
}

/// Starts tend on `cfg` and waits until both services run and it is ready.
fn start(sb: &Sandbox, cfg: &Path) -> Tend {
    let tend = sb.tend().config(cfg).start();
    sb.wait_log("app start", 1, secs(10.0));
    sb.wait_log("helper start", 1, secs(10.0));
    sb.wait_ready(true, secs(10.0));
    tend
}

/// Runs `tend ARGS...` (through `wrapper` when given): exit code, stdout,
/// stderr.
fn cli(wrapper: &[&str], args: &[&str]) -> (i32, String, String) {
    let mut argv: Vec<&str> = wrapper.to_vec();
    argv.push(TEND);
    argv.extend(args);
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .env_remove("TEND_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tend_cli(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec![args[0], "--config", cfg.to_str().unwrap()];
    all.extend(&args[1..]);
    cli(&[], &all)
}

/// The pid the status file shows for service `i`.
fn status_pid(sb: &Sandbox, i: usize) -> i64 {
    sb.status().unwrap()["services"][i]["pid"].as_i64().unwrap()
}

fn socket(sb: &Sandbox) -> PathBuf {
    sb.path("status.json.sock")
}

#[test]
fn restart_of_a_helper_starts_it_again_while_the_main_service_runs_on() {
    let sb = Sandbox::new();
    let cfg = pair(&sb, "");
    let mut tend = start(&sb, &cfg);
    let app = host_pid_of(&mut tend, "--tag\0app");
    let (app_pid, helper_pid) = (status_pid(&sb, 0), status_pid(&sb, 1));
    let meta = fs::symlink_metadata(socket(&sb)).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    let (code, out, err) = tend_cli(&cfg, &["restart", "helper"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("restarting helper (pid {helper_pid}): SIGTERM, then a new instance starts\n")
    );
    sb.wait_log("helper start", 2, secs(10.0));
    let st = wait_for("the new helper in the status", secs(10.0), || {
        sb.status()
            .filter(|s| s["services"][1]["state"] == "running" && s["services"][1]["restarts"] == 1)
    });
    assert_ne!(st["services"][1]["pid"], helper_pid);
    assert_eq!(st["services"][0]["pid"], app_pid, "the main service's pid");
    assert_eq!(sb.log("app start").len(), 1);
    assert!(sb.log("app sig").is_empty(), "the main service got nothing");
    assert_eq!(host_pid_of(&mut tend, "--tag\0app"), app);
    sb.wait_ready(true, secs(10.0));

    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert!(!socket(&sb).exists(), "the socket goes when tend exits");
}

#[test]
fn an_overlap_restart_stops_the_old_helper_only_once_the_new_one_is_ready() {
    let sb = Sandbox::new();
    let gate = sb.write("gate", "");
    let cfg = pair(
        &sb,
        &format!(
            "restart_mode = \"overlap\"\nready_check = {}\n",
            sh(&format!("test -e {}", gate.display()))
        ),
    );
    let mut tend = start(&sb, &cfg);
    let old = status_pid(&sb, 1);
    fs::remove_file(&gate).unwrap();
    let (code, out, err) = tend_cli(&cfg, &["restart", "helper"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("a new instance starts next to it"), "{out}");
    sb.wait_log("helper start", 2, secs(10.0));
    // The new one is not ready: the old one serves on.
    std::thread::sleep(secs(0.5));
    assert!(sb.log("helper sig").is_empty());
    let st = sb.status().unwrap();
    assert_eq!(
        (&st["services"][1]["state"], &st["services"][1]["pid"]),
        (&"restarting".into(), &old.into())
    );
    let (code, _, err) = tend_cli(&cfg, &["restart", "helper"]);
    assert_eq!(code, 1);
    assert_eq!(err, "tend: a restart of helper is already under way\n");
    fs::write(&gate, "").unwrap();
    sb.wait_log("helper sig SIGTERM", 1, secs(10.0));
    wait_for("the new helper serving", secs(10.0), || {
        sb.status()
            .filter(|s| s["services"][1]["state"] == "running" && s["services"][1]["pid"] != old)
    });
    assert_eq!(sb.log("app start").len(), 1);
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn signal_reaches_the_named_service_and_sighup_to_tend_still_goes_to_the_main_service_only() {
    let sb = Sandbox::new();
    let cfg = pair(&sb, "");
    let mut tend = start(&sb, &cfg);
    let helper = status_pid(&sb, 1);
    let (code, out, err) = tend_cli(&cfg, &["signal", "helper", "USR1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, format!("sent SIGUSR1 to helper (pid {helper})\n"));
    sb.wait_log("helper sig SIGUSR1", 1, secs(10.0));
    let (code, _, err) = tend_cli(&cfg, &["signal", "helper", "SIGUSR2"]);
    assert_eq!(code, 0, "{err}");
    sb.wait_log("helper sig SIGUSR2", 1, secs(10.0));
    assert!(sb.log("app sig").is_empty());

    tend.signal(Signal::SIGHUP);
    sb.wait_log("app sig SIGHUP", 1, secs(10.0));
    std::thread::sleep(secs(0.3));
    assert!(sb.log("helper sig SIGHUP").is_empty(), "not to the helper");
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn usage_errors_an_unknown_name_and_a_tend_that_is_not_running_are_told_apart() {
    let sb = Sandbox::new();
    let cfg = pair(&sb, "");
    let (code, _, err) = tend_cli(&cfg, &["restart", "helper"]);
    assert_eq!(code, 1);
    assert!(err.contains("is tend running with this config?"), "{err}");

    let mut tend = start(&sb, &cfg);
    let (code, out, err) = tend_cli(&cfg, &["restart", "db"]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert_eq!(
        err,
        "tend: no service \"db\": the services are app, helper\n"
    );
    let (code, _, err) = tend_cli(&cfg, &["signal", "helper", "NOPE"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown signal \"NOPE\""), "{err}");
    let (code, _, err) = tend_cli(&cfg, &["signal", "helper"]);
    assert_eq!(code, 2);
    assert!(err.contains("tend signal NAME SIG"), "{err}");

    let bare = sb.write("bare.toml", "[service]\ncommand = [\"true\"]\n");
    let (code, _, err) = tend_cli(&bare, &["restart", "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("[readiness] status_file"), "{err}");

    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    let (code, _, err) = tend_cli(&cfg, &["restart", "helper"]);
    assert_eq!(code, 1);
    assert!(err.contains("is tend running"), "{err}");
}

#[test]
fn a_client_that_is_not_tends_user_is_refused_by_the_sockets_mode_and_by_its_credentials() {
    let sb = Sandbox::new();
    // nobody reads the config and reaches the socket's directory.
    fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = pair(&sb, "");
    let mut tend = start(&sb, &cfg);
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let args = ["restart", "--config", cfg.to_str().unwrap(), "helper"];
    let (code, _, err) = cli(&nobody, &args);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("permission denied: the control socket")
            && err.contains("is only for the user tend runs as (uid 0) and root"),
        "{err}"
    );
    // With the mode opened up, tend still checks who connected.
    fs::set_permissions(socket(&sb), fs::Permissions::from_mode(0o666)).unwrap();
    let (code, _, err) = cli(&nobody, &args);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err,
        "tend: permission denied: only uid 0 (tend's user) and root may use the control \
         socket, and this client is uid 65534\n"
    );
    let (code, _, err) = cli(
        &nobody,
        &[
            "signal",
            "--config",
            cfg.to_str().unwrap(),
            "helper",
            "KILL",
        ],
    );
    assert_eq!(code, 1, "{err}");
    std::thread::sleep(secs(0.3));
    assert_eq!(sb.log("helper start").len(), 1, "nothing was done");
    assert!(sb.log("helper sig").is_empty());
    tend.wait_stderr("refused a client of the control socket", secs(5.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn clients_that_connect_and_send_nothing_hold_up_neither_requests_nor_signals() {
    let sb = Sandbox::new();
    let cfg = pair(&sb, "");
    let mut tend = start(&sb, &cfg);
    // More than the 16 connections tend keeps: the oldest make way.
    let silent: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(socket(&sb)).unwrap())
        .collect();
    let (code, _, err) = tend_cli(&cfg, &["signal", "helper", "USR1"]);
    assert_eq!(code, 0, "{err}");
    sb.wait_log("helper sig SIGUSR1", 1, secs(10.0));
    tend.signal(Signal::SIGHUP);
    sb.wait_log("app sig SIGHUP", 1, secs(10.0));
    // Half a request, then nothing: closed at the time limit, unanswered.
    let mut half = UnixStream::connect(socket(&sb)).unwrap();
    half.write_all(b"restart hel").unwrap();
    half.set_read_timeout(Some(secs(10.0))).unwrap();
    let mut answer = Vec::new();
    half.read_to_end(&mut answer).unwrap();
    assert!(answer.is_empty(), "{answer:?}");
    let mut last = silent.into_iter().last().unwrap();
    last.set_read_timeout(Some(secs(10.0))).unwrap();
    assert_eq!(last.read(&mut [0u8; 16]).unwrap(), 0, "closed by tend");
    assert_eq!(sb.log("helper start").len(), 1);
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn a_socket_left_by_a_killed_tend_is_replaced_at_start() {
    let sb = Sandbox::new();
    let cfg = pair(&sb, "");
    drop(std::os::unix::net::UnixListener::bind(socket(&sb)).unwrap());
    let (code, _, err) = tend_cli(&cfg, &["restart", "helper"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("nothing listens on") && err.contains("tend is not running"),
        "{err}"
    );
    let mut tend = start(&sb, &cfg);
    let (code, _, err) = tend_cli(&cfg, &["signal", "helper", "10"]);
    assert_eq!(code, 0, "{err}");
    sb.wait_log("helper sig SIGUSR1", 1, secs(10.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}
