//! The service's lifecycle: restart policies, back-off, env and working_dir.

mod common;

use common::*;
use nix::sys::signal::Signal;

fn start_times(sb: &Sandbox, n: usize) -> Vec<f64> {
    sb.wait_log("service start", n, secs(30.0))
        .iter()
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("t="))
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn restart_never_ends_tend_with_the_service_status() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nrestart = \"never\"\n",
        sb.service_toml(&["--exit-after", "0.1", "--exit-code", "4"])
    ));
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 4);
    assert_eq!(sb.log("service start").len(), 1);
    assert!(err.contains("service exited: exit code 4"), "{err}");
}

#[test]
fn on_failure_restarts_a_failed_service_but_not_a_clean_exit() {
    let sb = Sandbox::new();
    let marker = sb.path("failed-once").display().to_string();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nrestart = \"on-failure\"\n",
        sb.service_toml(&["--fail-first", &marker, "--exit-after", "0.3"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    // First run fails (exit 1) and is restarted; the second exits 0 after
    // 0.3 s, which ends tend.
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert_eq!(sb.log("service start").len(), 2);
    let err = tend.stderr();
    assert!(
        err.contains("restarting in 1s (restart = on-failure)"),
        "{err}"
    );
}

#[test]
fn always_restarts_after_a_clean_exit_with_a_growing_back_off() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nrestart = \"always\"\n",
        sb.service_toml(&["--exit-after", "0"])
    ));
    let mut tend = sb.tend().config(&cfg).start();
    let t = start_times(&sb, 3);
    let (first, second) = (t[1] - t[0], t[2] - t[1]);
    assert!(first >= 0.9, "first back-off {first:.2}s");
    assert!(second >= 1.9, "the back-off doubles: second {second:.2}s");
    // The third run has exited and the 4 s back-off has begun.
    let err = tend.wait_stderr("restarting in 4s", secs(10.0));
    assert!(
        err.contains("restarting in 1s") && err.contains("restarting in 2s"),
        "{err}"
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(
        tend.wait(secs(5.0)),
        143,
        "stopped while backing off: no service status to report"
    );
}

#[test]
fn a_missing_working_dir_is_an_error_before_anything_starts() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\ncommand = [\"true\"]\nworking_dir = \"/no/such/dir\"\n");
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2);
    assert!(err.contains("/no/such/dir"), "{err}");
}

#[test]
fn env_and_working_dir_are_applied() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.path("srv")).unwrap();
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"sh\", \"-c\", \"echo $GREETING $PATH_SEEN; pwd\"]\n\
         working_dir = {:?}\nenv = {{ GREETING = \"hello\", PATH_SEEN = \"yes\" }}\n",
        sb.path("srv").display().to_string()
    ));
    let (code, out, _) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, format!("hello yes\n{}\n", sb.path("srv").display()));
}

#[test]
fn a_command_after_the_double_dash_replaces_service_command() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\ncommand = [\"sh\", \"-c\", \"echo from-config\"]\n");
    let (code, out, _) = sb
        .tend()
        .config(&cfg)
        .command(&["echo", "from-cli"])
        .run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "from-cli\n");
}

#[test]
fn the_config_is_found_through_tend_config() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\ncommand = [\"sh\", \"-c\", \"exit 9\"]\n");
    let (code, _, _) = sb
        .tend()
        .env("TEND_CONFIG", &cfg.display().to_string())
        .run(secs(10.0));
    assert_eq!(code, 9);
    let (code, _, err) = sb
        .tend()
        .env("TEND_CONFIG", "/no/such.toml")
        .run(secs(10.0));
    assert_eq!(code, 2);
    assert!(
        err.contains("/no/such.toml") && err.contains("TEND_CONFIG"),
        "{err}"
    );
}

#[test]
fn logs_are_json_lines_with_tend_log_format_json() {
    let sb = Sandbox::new();
    // TEND_LOG: a plain init logs its INFO lines only when asked.
    let (code, _, err) = sb
        .tend()
        .env("TEND_LOG_FORMAT", "json")
        .env("TEND_LOG", "info")
        .command(&["sh", "-c", "exit 0"])
        .run(secs(10.0));
    assert_eq!(code, 0);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let started = lines
        .iter()
        .find(|v| v["message"] == "service started")
        .expect("a start line");
    assert!(started["pid"].as_i64().unwrap() > 0);
    assert_eq!(started["level"], "INFO");
}

#[test]
fn tend_log_sets_the_level_and_a_bad_value_is_a_usage_error() {
    let sb = Sandbox::new();
    let (code, _, err) = sb
        .tend()
        .env("TEND_LOG", "warn")
        .command(&["true"])
        .run(secs(10.0));
    assert_eq!(code, 0);
    assert!(!err.contains("service started"), "{err}");
    let (code, _, err) = sb
        .tend()
        .env("TEND_LOG", "chatty")
        .command(&["true"])
        .run(secs(10.0));
    assert_eq!(code, 2);
    assert!(err.contains("TEND_LOG"), "{err}");
}

/// A kubelet volume with app.conf, checked by a validator that rejects
/// INVALID, behind `gate`; the service restarts on failure.
fn crashing_on(sb: &Sandbox, gate: &gate::Gate) -> std::path::PathBuf {
    let vol = sb.path("config");
    let conf = vol.join("app.conf");
    kubelet::project(&vol, &[("app.conf", "v0")]);
    let check = gate.script(&format!("! grep -q INVALID {}", conf.display()));
    sb.config(&format!(
        "[service]\ncommand = {}\nrestart = \"on-failure\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\ncheck = {}\non_change = \"signal\"\n",
        sb.service_toml(&["--config", &conf.display().to_string()]),
        sb.readiness_toml(),
        vol.display().to_string(),
        sh(&check),
    ))
}

fn update(sb: &Sandbox, content: &str) {
    kubelet::project(&sb.path("config"), &[("app.conf", content)]);
}

#[test]
fn a_service_that_crashes_on_a_rejected_config_stays_down_until_a_valid_one_arrives() {
    let sb = Sandbox::new();
    let gate = gate::Gate::new(&sb, "check", true);
    let cfg = crashing_on(&sb, &gate);
    let mut tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "INVALID");
    sb.wait_state("invalid_config", secs(10.0));
    svc::kill(&mut tend, Signal::SIGKILL);
    tend.wait_stderr("the service stays down", secs(10.0));
    // The log line comes first; the status file is written after it.
    let st = wait_for("the status without a service", secs(5.0), || {
        sb.status()
            .filter(|s| s["service"]["pid"].is_null() && s["state"] == "invalid_config")
    });
    assert_eq!(st["state"], "invalid_config");
    assert_eq!(st["ready"], false);
    assert!(st["service"]["pid"].is_null(), "{st}");
    // Rechecks of the rejected config fail again; nothing starts on it.
    tend.wait_stderr("checking the rejected config again", secs(10.0));
    assert_eq!(sb.log("service start").len(), 1, "not restarted on INVALID");
    update(&sb, "v2");
    let starts = sb.wait_log("service start", 2, secs(10.0));
    assert!(starts[1].ends_with("config=v2"), "{starts:?}");
    sb.wait_ready(true, secs(10.0));
}

#[test]
fn a_service_that_crashes_while_a_change_is_checked_waits_for_the_verdict() {
    let sb = Sandbox::new();
    let gate = gate::Gate::new(&sb, "check", true);
    let cfg = crashing_on(&sb, &gate);
    let mut tend = sb.tend().config(&cfg).start_ready();
    gate.close();
    update(&sb, "INVALID");
    gate.wait_started(2, secs(10.0));
    svc::kill(&mut tend, Signal::SIGKILL);
    let err = tend.wait_stderr("the service stays down", secs(10.0));
    assert!(err.contains("is not checked yet"), "{err}");
    assert!(!sb.is_ready(), "never ready while the content is unchecked");
    assert_eq!(sb.log("service start").len(), 1);
    gate.open();
    sb.wait_state("invalid_config", secs(10.0));
    quiet(0.3);
    assert_eq!(sb.log("service start").len(), 1, "not started on INVALID");
    assert!(!sb.is_ready());
    // What the log says of the failed check, in place of that.
    let err = tend.wait_stderr(
        "the service stays down until a valid config arrives",
        secs(5.0),
    );
    assert!(
        !err.contains("keeps running on the last good one"),
        "the service is down, the log must not say it runs: {err}"
    );
    update(&sb, "v2");
    let starts = sb.wait_log("service start", 2, secs(10.0));
    assert!(starts[1].ends_with("config=v2"), "{starts:?}");
    sb.wait_ready(true, secs(10.0));
}

#[test]
fn a_check_that_failed_for_a_transient_reason_is_checked_again_until_it_passes() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    kubelet::project(&vol, &[("app.conf", "v0")]);
    let resolvable = sb.path("upstream-resolves");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\nname = \"app\"\npaths = [{:?}]\n\
         check = [\"test\", \"-e\", {:?}]\non_change = \"signal\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        vol.display().to_string(),
        resolvable.display().to_string(),
    ));
    let tend = sb.tend().config(&cfg).start();
    tend.wait_stderr("checking again in 1s", secs(10.0));
    tend.wait_stderr("checking again in 2s", secs(10.0));
    assert!(sb.log("service start").is_empty());
    std::fs::write(&resolvable, "").unwrap();
    sb.wait_log("service start", 1, secs(10.0));
    sb.wait_ready(true, secs(5.0));
}

#[test]
fn the_default_config_is_etc_tend_supervisor_toml() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\ncommand = [\"sh\", \"-c\", \"exit 7\"]\n");
    // A private /etc in a new mount namespace holds the default config.
    let script = format!(
        "mount -t tmpfs tmpfs /etc && mkdir /etc/tend && cp {} /etc/tend/supervisor.toml && exec {TEND}",
        cfg.display()
    );
    let (code, _, err) = sb
        .tend()
        .wrapped(
            "unshare",
            &[
                "--mount",
                "--pid",
                "--fork",
                "--mount-proc",
                "sh",
                "-c",
                &script,
            ],
        )
        .run(secs(10.0));
    assert_eq!(code, 7, "{err}");
}

fn quiet(s: f64) {
    std::thread::sleep(secs(s));
}
