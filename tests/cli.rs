//! The command line and logs as a person meets them: a quiet plain init,
//! help and version, `tend status`, and typed JSON logs.

mod common;

use common::*;

#[test]
fn a_plain_init_is_silent_unless_asked() {
    let sb = Sandbox::new();
    let (code, out, err) = sb.tend().command(&["sh", "-c", "echo hi"]).run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "hi\n");
    assert_eq!(err, "", "tend wrote to the service's terminal");

    let (code, out, err) = sb
        .tend()
        .env("TEND_LOG", "info")
        .command(&["sh", "-c", "echo hi"])
        .run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "hi\n");
    assert!(
        err.contains("INFO service started") && err.contains("INFO service exited"),
        "{err}"
    );
}

#[test]
fn with_a_config_tend_logs_at_info() {
    let sb = Sandbox::new();
    let config =
        sb.config("[service]\ncommand = [\"sh\", \"-c\", \"echo hi\"]\nrestart = \"never\"\n");
    let (code, out, err) = sb.tend().config(&config).run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "hi\n");
    assert!(err.contains("INFO service started"), "{err}");
}

#[test]
fn the_default_config_takes_a_command_and_says_so_and_dev_null_is_none() {
    let sb = Sandbox::new();
    sb.write(
        "etc/tend/supervisor.toml",
        "[service]\nenv = { FROM = \"the default config\" }\n",
    );
    // /etc/tend/supervisor.toml in a mount namespace of its own.
    let etc = sb.path("etc").display().to_string();
    let run = |args: &[&str]| {
        let mut argv = vec![
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "sh",
            "-c",
            "mount --bind \"$0\" /etc && exec \"$@\"",
            &etc,
            TEND,
        ];
        argv.extend(args);
        argv.extend(["--", "sh", "-c", "echo \"[$FROM]\""]);
        sb.tend().wrapped("unshare", &argv).run(secs(10.0))
    };
    let (code, out, err) = run(&[]);
    assert_eq!((code, out.as_str()), (0, "[the default config]\n"), "{err}");
    assert!(
        err.contains(
            "INFO running COMMAND as the service of /etc/tend/supervisor.toml, the default \
             config (--config /dev/null runs it without one)"
        ),
        "{err}"
    );
    let (code, out, err) = run(&["--config", "/dev/null"]);
    assert_eq!((code, out.as_str()), (0, "[]\n"), "{err}");
    assert!(!err.contains("default config"), "{err}");
}

#[test]
fn a_script_without_a_shebang_runs_with_bin_sh_as_execvp_runs_it() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let script = sb.write(
        "plain-script",
        "echo \"ran with $# arguments: $*\"\nexit 3\n",
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = script.to_str().unwrap().to_string();
    let (code, out, err) = sb.tend().command(&[&script, "a", "b c"]).run(secs(10.0));
    assert_eq!(code, 3, "{err}");
    assert_eq!(out, "ran with 2 arguments: a b c\n", "{err}");
}

#[test]
fn a_plain_init_runs_in_a_directory_that_was_removed() {
    // As tini does: nothing in a plain start needs the working directory.
    let sb = Sandbox::new();
    let gone = sb.path("gone");
    std::fs::create_dir(&gone).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && rmdir \"$PWD\" && exec '{TEND}' -- echo ran",
            gone.display()
        ))
        .env_remove("TEND_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert!(!err.contains("getcwd"), "{err}");
}

/// Runs `tend ARGS...` directly (not as PID 1): (exit code, stdout, stderr).
fn tend(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(TEND)
        .args(args)
        .env_remove("TEND_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_and_version_follow_the_usual_words() {
    for args in [&["--help"][..], &["-h"], &["help"]] {
        let (code, out, _) = tend(args);
        assert_eq!(code, 0, "{args:?}");
        assert!(out.starts_with("Usage:\n"), "{args:?}: {out}");
    }
    for sub in ["check-config", "probe", "status"] {
        for args in [&[sub, "--help"][..], &[sub, "-h"], &["help", sub]] {
            let (code, out, _) = tend(args);
            assert_eq!(code, 0, "{args:?}");
            let usage = out.lines().next().unwrap_or_default();
            assert!(
                usage.starts_with(&format!("Usage: tend {sub} "))
                    && usage.ends_with(" [--config PATH]"),
                "{args:?}: {out}"
            );
        }
    }
    for args in [&["--version"][..], &["-V"], &["version"]] {
        let (code, out, _) = tend(args);
        assert_eq!(code, 0, "{args:?}");
        let commit = out
            .strip_prefix(&format!("tend {} (commit ", env!("CARGO_PKG_VERSION")))
            .and_then(|rest| rest.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("{args:?}: {out}"));
        assert!(
            commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
            "{out}"
        );
    }
}

#[test]
fn status_shows_the_state_and_why_a_watch_is_invalid() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let check = [
        "sh",
        "-c",
        "echo checking; echo 'error: line 3 is wrong'; exit 1",
    ];
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\nname = \"app\"\npaths = [{:?}]\n\
         check = {}\non_change = \"signal\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        conf.display().to_string(),
        toml_list(&check.map(String::from)),
    ));
    let cfg_arg = cfg.display().to_string();
    let (code, _, err) = tend(&["status", "--config", &cfg_arg]);
    assert_eq!(code, 1, "no status file yet: {err}");
    assert!(
        err.contains("cannot read") && err.contains("status.json"),
        "{err}"
    );

    let mut t = sb.tend().config(&cfg).start();
    sb.wait_state("invalid_config", secs(10.0));
    let (code, out, _) = tend(&["status", "--config", &cfg_arg]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("state       invalid_config\nready       no (watch \"app\": invalid)\n"),
        "{out}"
    );
    assert!(
        out.contains("service     not running, 0 restarts\n"),
        "{out}"
    );
    assert!(
        out.contains("watch       app: invalid\n  check     error: line 3 is wrong\n  changed   "),
        "{out}"
    );
    t.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(t.wait(secs(10.0)), 143);

    let no_status = sb.config("[service]\ncommand = [\"true\"]\n");
    let (code, _, err) = tend(&["status", "--config", &no_status.display().to_string()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("status_file"), "{err}");
}

#[test]
fn json_logs_keep_the_types_of_their_fields() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "bad");
    let check = format!(
        "grep -q good {} || {{ echo 'error: not good'; exit 1; }}",
        conf.display()
    );
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\nname = \"app\"\npaths = [{:?}]\n\
         check = [\"sh\", \"-c\", {check:?}]\non_change = \"signal\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        conf.display().to_string(),
    ));
    let mut t = sb
        .tend()
        .env("TEND_LOG_FORMAT", "json")
        .config(&cfg)
        .start();
    sb.wait_state("invalid_config", secs(10.0));
    sb.write("app.conf", "good");
    sb.wait_state("ready", secs(10.0));
    t.signal(nix::sys::signal::Signal::SIGTERM);
    t.wait(secs(10.0));

    let lines: Vec<serde_json::Value> = t
        .stderr()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l["message"].as_str().unwrap().starts_with(message))
            .unwrap_or_else(|| panic!("no {message:?} in {lines:#?}"))
    };
    let failed = find("check failed");
    assert_eq!(failed["output"], serde_json::json!(["error: not good"]));
    assert!(failed["took"].is_f64(), "{failed}");
    assert!(!failed["message"].as_str().unwrap().contains("output"));
    assert_eq!(failed["watch"], "app");

    let changed = find("change detected");
    assert_eq!(
        changed["paths"],
        serde_json::json!([conf.display().to_string()])
    );
    assert_eq!(changed["missing"], serde_json::json!([]));
    assert!(changed["files"].is_u64(), "{changed}");

    let started = find("service started");
    assert!(started["pid"].is_i64(), "{started}");
    assert!(
        started["command"].as_array().unwrap()[0].is_string(),
        "{started}"
    );
    assert!(find("check passed")["took"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_reader_that_goes_away_is_not_a_crash() {
    let sb = Sandbox::new();
    let cfg = sb.config("[readiness]\nstatus_file = \"/nonexistent/status.json\"\n");
    let cfg = cfg.display().to_string();
    for args in [
        &["help"][..],
        &["--version"],
        &["probe", "--help"],
        &["check-config", "--config", &cfg],
        &["probe", "--config", &cfg],
    ] {
        // `tend help | head -0`: the pipe's reader is gone before tend writes.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(TEND)
            .args(args)
            .env_remove("TEND_CONFIG")
            .stdout(writer)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let expected = if args[0] == "probe" && args[1] != "--help" {
            1
        } else {
            0
        };
        assert_eq!(out.status.code(), Some(expected), "{args:?}: {err}");
    }
}
