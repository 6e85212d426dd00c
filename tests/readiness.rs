//! The files tend writes and what `tend probe` makes of them.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use nix::sys::signal::Signal;

fn probe(cfg: &Path) -> (i32, String) {
    let out = std::process::Command::new(TEND)
        .args(["probe", "--config"])
        .arg(cfg)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A config whose one watch, "nginx", fails `check` from the start.
fn failing_check(sb: &Sandbox, check: &[String]) -> PathBuf {
    let conf = sb.write("app.conf", "v0");
    sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\nname = \"nginx\"\npaths = [{:?}]\ncheck = {}\non_change = \"signal\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        conf.display().to_string(),
        toml_list(check),
    ))
}

#[test]
fn the_probe_shows_the_line_that_names_the_error() {
    let sb = Sandbox::new();
    let nginx_conf = sb.write(
        "nginx.conf",
        "events {}\nhttp {\n  server { lissen 8080; }\n}\n",
    );
    let check: Vec<String> = ["nginx", "-t", "-e"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            sb.path("error.log").display().to_string(),
            "-c".into(),
            nginx_conf.display().to_string(),
        ])
        .collect();
    let cfg = failing_check(&sb, &check);
    let mut tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(10.0));
    let output = st["watches"][0]["check_output"].as_str().unwrap();
    assert!(output.ends_with("test failed\n"), "{output}");
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        line,
        format!(
            "not ready: state invalid_config; watch \"nginx\": invalid: \
             nginx: [emerg] unknown directive \"lissen\" in {}:3\n",
            nginx_conf.display()
        )
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 143);
}

#[test]
fn terminal_controls_in_a_checks_output_are_shown_escaped() {
    let sb = Sandbox::new();
    let script = r"printf 'step 1\n\033]0;owned\007\033[2Jerror: 10%%\rbad\r\nnext\n'; exit 1";
    let cfg = failing_check(&sb, &["sh".into(), "-c".into(), script.into()]);
    let mut tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(
        st["watches"][0]["check_output"],
        "step 1\n\\x1b]0;owned\\x07\\x1b[2Jerror: 10%\\rbad\nnext\n",
        "line breaks are kept in the status file, nothing else"
    );
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        line,
        "not ready: state invalid_config; watch \"nginx\": invalid: \
         \\x1b]0;owned\\x07\\x1b[2Jerror: 10%\\rbad\n"
    );
    let log = tend.wait_stderr("check failed", secs(10.0));
    assert!(!log.contains(['\x1b', '\x07', '\r']), "{log:?}");
    assert!(log.contains("\\x1b[2Jerror: 10%\\rbad"), "{log}");
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 143);
}
