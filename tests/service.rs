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
    let (code, _, err) = sb
        .tend()
        .env("TEND_LOG_FORMAT", "json")
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
