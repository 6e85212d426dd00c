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
    config_with(sb, None, names, service, rest)
}

/// [`config`], with the service run by the `python` given: with thousands
/// of variables, a python3 in PATH that is a shell script (pyenv's shim)
/// takes seconds to start.
fn config_with(
    sb: &Sandbox,
    python: Option<&str>,
    names: &[&str],
    service: &str,
    rest: &str,
) -> std::path::PathBuf {
    let mut args = Vec::new();
    for n in names {
        args.extend(["--env", n]);
    }
    let mut argv = sb.service(&args);
    if let Some(python) = python {
        argv[0] = python.into();
    }
    sb.config(&format!(
        "[service]\ncommand = {}\n{service}\n{}\n{rest}",
        toml_list(&argv),
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

/// As Windows editors save it: a byte order mark, CRLF line ends.
#[test]
fn an_env_file_saved_with_a_byte_order_mark_gives_its_variables() {
    let sb = Sandbox::new();
    let env = sb.write("app.env", "\u{feff}DB_HOST=db.internal\r\nDB_PORT=5432\r\n");
    let cfg = config(
        &sb,
        &["DB_HOST", "DB_PORT"],
        &format!("env_from = [{:?}]", path(&env)),
        "",
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(seen(&sb, "DB_HOST"), ["db.internal"]);
    assert_eq!(seen(&sb, "DB_PORT"), ["5432"]);
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
    let mut tend = sb
        .tend()
        .config(&cfg)
        .env("TEND_LOG", "trace")
        .start_ready();
    project(&vol, &[("API_TOKEN", new)]);
    sb.wait_log("service start", 2, secs(10.0));
    sb.wait_ready(true, secs(5.0));
    assert_eq!(seen(&sb, "API_TOKEN"), [old, new]);
    let status = fs::read_to_string(sb.path("status.json")).unwrap();
    // The whole log, once tend exited.
    let (_, err) = tend.stop(secs(10.0));
    assert!(
        err.contains("env_from: 1 variable(s) for the service: API_TOKEN"),
        "{err}"
    );
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
    assert!(tend.is_running(), "restart = \"on-failure\" tries again");
    assert!(!sb.is_ready());
    project(&vol, &[("TOKEN", "three")]);
    sb.wait_log("service start", 2, secs(10.0));
    sb.wait_ready(true, secs(5.0));
    assert_eq!(seen(&sb, "TOKEN"), ["one", "three"]);
    // The start that failed had no process to name.
    let (_, err) = tend.stop(secs(10.0));
    assert!(!err.contains("pid=0"), "{err}");
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
    let status = fs::read_to_string(sb.path("status.json")).unwrap();
    let (_, log) = tend.stop(secs(10.0));
    for value in [one, two, three] {
        assert!(!log.contains(value), "the log shows a value:\n{log}");
        assert!(
            !status.contains(value),
            "the status shows a value: {status}"
        );
    }
}

/// The system's python3, a program (scripts/install-deps installs it).
const PYTHON: &str = "/usr/bin/python3";

/// A directory of `n` small keys K00000, K00001, ...
fn keys(sb: &Sandbox, name: &str, n: usize) -> std::path::PathBuf {
    let dir = sb.path(name);
    fs::create_dir(&dir).unwrap();
    for i in 0..n {
        fs::write(dir.join(format!("K{i:05}")), "value").unwrap();
    }
    dir
}

/// A volume of 100,000 small keys (under the 1 MiB bound) is refused at
/// once, without reading a key, and the log stays short.
#[test]
fn more_variables_than_env_from_takes_stop_the_first_start_with_exit_2() {
    let sb = Sandbox::new();
    let vol = keys(&sb, "huge", 100_000);
    let cfg = config(&sb, &[], &format!("env_from = [{:?}]", path(&vol)), "");
    let (code, _, err) = sb.tend().config(&cfg).run(secs(20.0));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot start the service: env_from {}: env_from holds more than 10000 variables in all, its limit",
            path(&vol)
        )),
        "{err}"
    );
    assert!(err.len() < 4096, "{} bytes of log", err.len());
    assert!(sb.log("service start").is_empty(), "nothing was started");
}

#[test]
fn the_log_names_a_few_variables_of_a_large_env_from_and_counts_the_rest() {
    let sb = Sandbox::new();
    let vol = keys(&sb, "keys", tend::envfile::MAX_VARIABLES);
    let cfg = config_with(
        &sb,
        Some(PYTHON),
        &["K09999"],
        &format!("env_from = [{:?}]", path(&vol)),
        "",
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(seen(&sb, "K09999"), ["value"]);
    let summary = "env_from: 10000 variable(s) for the service: K00000 K00001 K00002 K00003 \
         K00004 K00005 K00006 K00007 K00008 K00009 and 9990 more";
    let (_, err) = tend.stop(secs(10.0));
    assert!(err.contains(summary), "{err}");
    assert!(err.len() < 4096, "{} bytes of log:\n{err}", err.len());
}

/// CLOCK_MONOTONIC, which the service's `t=` is read from too.
fn monotonic() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes `t`.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) },
        0
    );
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Whether tend holds `dir` open now: it is reading it.
fn reading(tend: &mut Tend, dir: &Path) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{}/fd", tend.pid())) else {
        return false;
    };
    fds.flatten()
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|target| target == dir))
}

/// env_from is read on tend's loop at every start; at its limit that must
/// still leave signals forwarded: a SIGUSR1 that arrives while a restart
/// reads 10,000 keys reaches the instance that serves (an overlap restart:
/// the old one serves until the new one passes ready_check).
#[test]
fn a_signal_sent_while_a_start_reads_the_largest_env_from_is_forwarded() {
    let sb = Sandbox::new();
    let vol = keys(&sb, "keys", tend::envfile::MAX_VARIABLES);
    let conf = sb.write("app.conf", "v0");
    let serving = sb.write("serving", "");
    let cfg = config_with(
        &sb,
        Some(PYTHON),
        &["K09999"],
        &format!(
            "env_from = [{:?}]\nrestart_mode = \"overlap\"\nready_check = [\"test\", \"-e\", {:?}]\n\
             ready_timeout = \"60s\"",
            path(&vol),
            path(&serving)
        ),
        &format!(
            "[[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"restart\"\n",
            path(&conf)
        ),
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    // The new instance will not pass ready_check: the old one serves on.
    fs::remove_file(&serving).unwrap();
    fs::write(&conf, "v1").unwrap();
    let sent = wait_every(
        std::time::Duration::from_micros(200),
        "tend to read env_from for the new instance",
        secs(20.0),
        || {
            assert_eq!(
                sb.log("service start").len(),
                1,
                "the read was over before it was seen"
            );
            reading(&mut tend, &vol).then(|| {
                tend.signal(nix::sys::signal::Signal::SIGUSR1);
                monotonic()
            })
        },
    );
    let line = sb.wait_log("service sig SIGUSR1", 1, secs(10.0)).remove(0);
    sb.wait_log("service start", 2, secs(10.0));
    let t: f64 = line
        .split(" t=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap();
    println!(
        "SIGUSR1 reached the service {:.1} ms after it was sent",
        (t - sent.as_secs_f64()) * 1000.0
    );
    assert_eq!(seen(&sb, "K09999"), ["value", "value"]);
}
