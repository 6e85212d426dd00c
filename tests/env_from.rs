//! `service.env_from`: variables from env files and Secret-like directories,
//! read at every start of the service, never shown in tend's log or status.

mod common;

use std::fs;
use std::path::Path;

use common::kubelet::project;
use common::*;
use nix::sys::stat::Mode;

/// The `service env` lines for `name`: its value at each start, in order
/// (escaped as service.py writes it), or "unset".
fn seen(sb: &Sandbox, name: &str) -> Vec<String> {
    sb.log(&format!("service env {name}"))
        .iter()
        .map(|l| {
            let rest = &l[format!("service env {name}").len()..];
            rest.strip_prefix('=').unwrap_or(rest.trim()).to_string()
        })
        .collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// A config running the service with `--env NAME` for each of `names`.
fn config(sb: &Sandbox, names: &[&str], service: &str, rest: &str) -> std::path::PathBuf {
    let mut args = Vec::new();
    for n in names {
        args.extend(["--env", n]);
    }
    sb.config(&format!(
        "[service]\ncommand = {}\n{service}\n{}\n{rest}",
        sb.service_toml(&args),
        sb.readiness_toml()
    ))
}

#[test]
fn an_env_file_gives_the_service_its_variables_verbatim() {
    let sb = Sandbox::new();
    let env = sb.write(
        "app.env",
        "# database\nDB_HOST=db.internal\n\n  DB_OPTS=\"sslmode=require\" # kept\nDB_EMPTY=\n",
    );
    let cfg = config(
        &sb,
        &["DB_HOST", "DB_OPTS", "DB_EMPTY", "OTHER"],
        &format!("env_from = [{:?}]", path(&env)),
        "",
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(seen(&sb, "DB_HOST"), ["db.internal"]);
    assert_eq!(seen(&sb, "DB_OPTS"), ["\"sslmode=require\" # kept"]);
    assert_eq!(seen(&sb, "DB_EMPTY"), [""]);
    assert_eq!(seen(&sb, "OTHER"), ["unset"]);
}

#[test]
fn a_secret_volume_gives_one_variable_per_key_with_its_content_verbatim() {
    let sb = Sandbox::new();
    let vol = sb.path("secret");
    project(
        &vol,
        &[("DB_USER", "app"), ("DB_PASSWORD", "pa ss\nword\n")],
    );
    let cfg = config(
        &sb,
        &["DB_USER", "DB_PASSWORD", "..data"],
        &format!("env_from = [{:?}]", path(&vol)),
        "",
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(seen(&sb, "DB_USER"), ["app"]);
    assert_eq!(seen(&sb, "DB_PASSWORD"), ["pa ss\\nword\\n"]);
    assert_eq!(
        seen(&sb, "..data"),
        ["unset"],
        "the kubelet's own entries are not variables"
    );
}

#[test]
fn env_wins_over_env_from_and_later_paths_over_earlier_ones_and_checks_get_neither() {
    let sb = Sandbox::new();
    let file = sb.write("base.env", "A=file\nB=file\nC=file\n");
    let vol = sb.path("secret");
    project(&vol, &[("B", "secret"), ("C", "secret")]);
    let check_saw = sb.path("check.saw");
    let check = toml_list(&[
        "sh".into(),
        "-c".into(),
        format!(
            "printf '%s %s' \"${{A-unset}}\" \"$C\" > {}",
            path(&check_saw)
        ),
    ]);
    let cfg = config(
        &sb,
        &["A", "B", "C"],
        &format!(
            "env_from = [{:?}, {:?}]\nenv = {{ C = \"env\" }}",
            path(&file),
            path(&vol)
        ),
        &format!(
            "[[watch]]\npaths = [{:?}]\ncheck = {check}\non_change = \"none\"\n",
            path(&file)
        ),
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(seen(&sb, "A"), ["file"]);
    assert_eq!(seen(&sb, "B"), ["secret"]);
    assert_eq!(seen(&sb, "C"), ["env"]);
    assert_eq!(
        fs::read_to_string(&check_saw).unwrap(),
        "unset env",
        "a check gets the service's env, not env_from"
    );
}

#[test]
fn a_restart_action_brings_a_changed_secret_into_the_new_process_and_no_value_is_shown() {
    let sb = Sandbox::new();
    let vol = sb.path("secret");
    let (old, new) = ("old-7f3a9c-secret", "new-e41b02-secret");
    project(&vol, &[("API_TOKEN", old)]);
    let cfg = config(
        &sb,
        &["API_TOKEN"],
        &format!("env_from = [{:?}]", path(&vol)),
        &format!(
            "[[watch]]\nname = \"secret\"\npaths = [{:?}]\non_change = \"restart\"\n",
            path(&vol)
        ),
    );
    let tend = sb
        .tend()
        .config(&cfg)
        .env("TEND_LOG", "trace")
        .start_ready();
    project(&vol, &[("API_TOKEN", new)]);
    sb.wait_log("service start", 2, secs(10.0));
    sb.wait_ready(true, secs(5.0));
    assert_eq!(seen(&sb, "API_TOKEN"), [old, new]);
    let err = tend.wait_stderr(
        "env_from: 1 variable(s) for the service: API_TOKEN",
        secs(1.0),
    );
    let status = fs::read_to_string(sb.path("status.json")).unwrap();
    for secret in [old, new] {
        assert!(!err.contains(secret), "the log shows a value:\n{err}");
        assert!(
            !status.contains(secret),
            "the status shows a value: {status}"
        );
    }
}

#[test]
fn a_bad_line_stops_the_first_start_with_exit_2_naming_file_and_line_but_not_its_text() {
    let sb = Sandbox::new();
    let env = sb.write("app.env", "A=1\nexport TOKEN=hunter2\n");
    let cfg = config(&sb, &[], &format!("env_from = [{:?}]", path(&env)), "");
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot start the service: env_from {}: line 2: starts with `export`",
            path(&env)
        )),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    assert!(sb.log("service start").is_empty(), "nothing was started");
}

#[test]
fn a_missing_env_file_stops_the_first_start_with_exit_2() {
    let sb = Sandbox::new();
    let env = sb.path("not-mounted");
    let cfg = config(&sb, &[], &format!("env_from = [{:?}]", path(&env)), "");
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("env_from {}: does not exist", path(&env))),
        "{err}"
    );
    assert!(sb.log("service start").is_empty(), "nothing was started");
}

#[test]
fn a_fifo_in_place_of_an_env_file_does_not_hang_tend() {
    let sb = Sandbox::new();
    let fifo = sb.path("app.env");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
    let cfg = config(&sb, &[], &format!("env_from = [{:?}]", path(&fifo)), "");
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is a FIFO, not a regular file"), "{err}");
}

#[test]
fn a_secret_that_breaks_at_a_restart_is_a_failed_start_and_the_fix_starts_the_service() {
    let sb = Sandbox::new();
    let vol = sb.path("secret");
    project(&vol, &[("TOKEN", "one")]);
    let cfg = config(
        &sb,
        &["TOKEN"],
        &format!("env_from = [{:?}]\nrestart = \"on-failure\"", path(&vol)),
        &format!(
            "[[watch]]\nname = \"secret\"\npaths = [{:?}]\non_change = \"restart\"\n",
            path(&vol)
        ),
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    // A key that is no variable name: the restart's start fails.
    project(&vol, &[("TOKEN", "two"), ("2FA", "x")]);
    tend.wait_stderr(
        &format!(
            "cannot start the service: env_from {}: the file name \"2FA\" is not a variable name",
            path(&vol.join("2FA"))
        ),
        secs(10.0),
    );
    tend.wait_stderr("the service could not start; restarting in", secs(5.0));
    assert!(!tend.stderr().contains("pid=0"), "{}", tend.stderr());
    assert!(tend.is_running(), "restart = \"on-failure\" tries again");
    assert!(!sb.is_ready());
    project(&vol, &[("TOKEN", "three")]);
    sb.wait_log("service start", 2, secs(10.0));
    sb.wait_ready(true, secs(5.0));
    assert_eq!(seen(&sb, "TOKEN"), ["one", "three"]);
}

/// The README's pattern: env_from reads the published copy of a Secret. A
/// Secret edit that the service could not start with (a key that is no
/// variable name) is rejected like a failed check: the service keeps
/// running, restarts after a crash on the last good values, and the fix
/// brings the new ones.
#[test]
fn a_published_secret_the_service_could_not_start_with_is_rejected_and_a_crash_keeps_the_old_values()
 {
    let sb = Sandbox::new();
    let vol = sb.path("secret");
    let published = sb.path("published");
    let (one, two, three) = ("one-5c1e0a", "two-9d4f27", "three-0b8e63");
    project(&vol, &[("TOKEN", one)]);
    let cfg = config(
        &sb,
        &["TOKEN"],
        &format!(
            "env_from = [{:?}]\nrestart = \"on-failure\"",
            path(&published)
        ),
        &format!(
            "[[watch]]\nname = \"secret\"\npaths = [{:?}]\npublish = {:?}\non_change = \"restart\"\n",
            path(&vol),
            path(&published)
        ),
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("TOKEN", two), ("2FA", "x")]);
    let status = sb.wait_state("invalid_config", secs(10.0));
    let output = status["watches"][0]["check_output"].as_str().unwrap();
    assert!(
        output.contains(&format!(
            "{} (env_from reads it as {}): the file name \"2FA\" is not a variable name",
            path(&vol.join("2FA")),
            path(&published.join("2FA"))
        )) && output.ends_with("; the service would not start with it"),
        "{output}"
    );
    assert!(
        status["service"]["pid"].is_number(),
        "still running: {status}"
    );

    common::svc::kill(&mut tend, nix::sys::signal::Signal::SIGKILL);
    sb.wait_log("service start", 2, secs(10.0));
    assert_eq!(
        seen(&sb, "TOKEN"),
        [one, one],
        "restarted on the last good values"
    );

    project(&vol, &[("TOKEN", three)]);
    sb.wait_log("service start", 3, secs(10.0));
    sb.wait_ready(true, secs(5.0));
    assert_eq!(seen(&sb, "TOKEN"), [one, one, three]);
    let log = tend.stderr();
    let status = fs::read_to_string(sb.path("status.json")).unwrap();
    for value in [one, two, three] {
        assert!(!log.contains(value), "the log shows a value:\n{log}");
        assert!(
            !status.contains(value),
            "the status shows a value: {status}"
        );
    }
}
