//! supervisor.toml errors and `tend check-config`.

mod common;

use common::*;

fn check_config(sb: &Sandbox, toml: &str) -> (i32, String, String) {
    let cfg = sb.config(toml);
    sb.tend()
        .not_pid1()
        .args(&["check-config"])
        .config(&cfg)
        .run(secs(10.0))
}

/// `tend check-config --in-image`: checked as in the container tend runs in.
fn check_in_image(sb: &Sandbox, toml: &str) -> (i32, String, String) {
    let cfg = sb.config(toml);
    sb.tend()
        .not_pid1()
        .args(&["check-config", "--in-image"])
        .config(&cfg)
        .run(secs(10.0))
}

#[test]
fn check_config_prints_the_config_with_defaults_filled_in() {
    let sb = Sandbox::new();
    let (code, out, err) = check_config(
        &sb,
        "[service]\ncommand = [\"nginx\", \"-g\", \"daemon off;\"]\n\n\
         [[watch]]\npaths = [\"/etc/nginx\"]\non_change = \"signal\"\n",
    );
    assert_eq!(code, 0, "{err}");
    for expected in [
        "command = [\"nginx\", \"-g\", \"daemon off;\"]",
        "stop_signal = \"SIGTERM\"",
        "stop_timeout = \"10s\"",
        "restart = \"never\"",
        "process_group = false",
        "name = \"/etc/nginx\"",
        "signal = \"SIGHUP\"",
        "check_timeout = \"10s\"",
        "recheck = \"1s\"",
        "debounce = \"100ms\"",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    // What it prints is itself a valid config that means the same.
    let again = sb.write("again.toml", &out);
    let (code, out2, _) = sb
        .tend()
        .not_pid1()
        .args(&["check-config"])
        .config(&again)
        .run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().skip(1).collect::<Vec<_>>(),
        out2.lines().skip(1).collect::<Vec<_>>()
    );
}

#[test]
fn a_syntax_error_exits_2_and_names_line_and_column() {
    let sb = Sandbox::new();
    let (code, _, err) = check_config(&sb, "[service]\ncommand = [\"true\"]\nstop_timeout = 10s\n");
    assert_eq!(code, 2);
    assert!(err.contains("line 3, column 16"), "{err}");
    assert!(
        err.contains("supervisor.toml"),
        "the error names the file: {err}"
    );
}

#[test]
fn an_unknown_key_is_named_with_a_suggestion() {
    let sb = Sandbox::new();
    let (code, _, err) = check_config(
        &sb,
        "[service]\ncommand = [\"true\"]\nrestrat = \"always\"\n",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("restrat") && err.contains("did you mean `restart`?"),
        "{err}"
    );
}

#[test]
fn bad_values_exit_2_and_name_what_is_wrong() {
    let sb = Sandbox::new();
    for (toml, needle) in [
        ("[service]\nstop_timeout = \"soon\"\n", "\"soon\""),
        ("[service]\nstop_signal = \"SIGBOGUS\"\n", "SIGBOGUS"),
        ("[service]\ncommand = []\n", "command is empty"),
        ("[service]\nprocess_group = 1\n", "expected a boolean"),
        ("[service]\nrestart = \"sometimes\"\n", "sometimes"),
        (
            "[[watch]]\npaths = [\"/x\"]\non_change = \"exec\"\n",
            "needs `exec`",
        ),
        (
            "[[watch]]\npaths = [\"/x\"]\non_change = \"signal\"\nsignal = \"SIGNOPE\"\n",
            "SIGNOPE",
        ),
        ("[readiness]\nfile = 3\n", "line 2"),
    ] {
        let (code, _, err) = check_config(&sb, toml);
        assert_eq!(code, 2, "{toml}");
        assert!(
            err.contains(needle),
            "expected {needle:?} for {toml:?} in:\n{err}"
        );
    }
}

#[test]
fn a_bad_config_starts_nothing() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"touch\", {:?}]\nstop_timeout = \"soon\"\n",
        marker.display().to_string()
    ));
    let (code, _, _) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2);
    assert!(!marker.exists());
}

#[test]
fn a_missing_config_file_is_an_error() {
    let sb = Sandbox::new();
    let (code, _, err) = sb
        .tend()
        .not_pid1()
        .args(&["--config", "/no/such/supervisor.toml", "--", "true"])
        .run(secs(10.0));
    assert_eq!(code, 2);
    assert!(err.contains("/no/such/supervisor.toml"), "{err}");
    let (code, _, err) = sb.tend().not_pid1().args(&["check-config"]).run(secs(10.0));
    assert_eq!(code, 2, "nothing to check: {err}");
}

#[test]
fn a_config_without_a_command_needs_one_after_the_double_dash() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\nstop_timeout = \"1s\"\n");
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2);
    assert!(err.contains("service.command"), "{err}");
    let (code, _, _) = sb.tend().config(&cfg).command(&["true"]).run(secs(10.0));
    assert_eq!(code, 0);
}

#[test]
fn configs_that_can_never_work_here_exit_2_naming_key_and_line() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.path("conf")).unwrap();
    let watch = "[[watch]]\nname = \"app\"\npaths = [\"conf\"]\non_change = \"none\"\n";
    for (toml, needles) in [
        (
            "[service]\ncommand = [\"nginx -t\"]\n".to_string(),
            &["line 2, column 11: service.command", "[\"nginx\", \"-t\"]"][..],
        ),
        (
            format!("{watch}check = [\"nginx -t -q\"]\n"),
            &[
                "line 5",
                "watch \"app\": `check`",
                "[\"nginx\", \"-t\", \"-q\"]",
            ],
        ),
        (
            format!("{watch}check_timeout = \"0s\"\n"),
            &["line 5", "`check_timeout` is 0"],
        ),
        (
            format!("{watch}recheck = \"0s\"\n"),
            &["line 5", "`recheck` is 0"],
        ),
        (
            "[service]\nstop_timeout = \"0ms\"\n".to_string(),
            &["line 2", "`stop_timeout` is 0"],
        ),
    ] {
        let (code, out, err) = check_config(&sb, &toml);
        assert_eq!(code, 2, "{toml}\n{out}");
        for needle in needles {
            assert!(
                err.contains(needle),
                "expected {needle:?} for {toml:?} in:\n{err}"
            );
        }
    }
}

#[test]
fn a_command_written_as_one_string_starts_nothing() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"touch {}\"]\n",
        marker.display()
    ));
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("service.command"), "{err}");
    assert!(!marker.exists());
}

#[test]
fn what_the_image_and_the_pod_provide_is_a_warning_outside_and_an_error_in_the_image() {
    let sb = Sandbox::new();
    let watch = "[[watch]]\nname = \"app\"\npaths = [\"/etc/tend-test-no-such-volume\"]\n";
    for (toml, says) in [
        (
            "[service]\ncommand = [\"true\"]\nworking_dir = \"/no/such/dir\"\n".to_string(),
            "line 3, column 15: service.working_dir \"/no/such/dir\" cannot be used",
        ),
        (
            "[service]\ncommand = [\"tend-no-such-server\", \"-f\"]\n".to_string(),
            "line 2, column 11: service.command: \"tend-no-such-server\" is not in $PATH (",
        ),
        (
            "[service]\ncommand = [\"true\"]\nready_check = [\"tend-no-such-curl\"]\n".to_string(),
            "line 3, column 15: service.ready_check: \"tend-no-such-curl\" is not in $PATH",
        ),
        (
            "[service]\ncommand = [\"true\"]\nuser = \"tend-no-such-user\"\n".to_string(),
            "line 3, column 8: service.user: ",
        ),
        (
            "[service]\ncommand = [\"true\"]\n[[watch]]\nname = \"app\"\npaths = [\"/\"]\n\
             check = [\"/usr/sbin/tend-no-such-check\", \"-t\"]\non_change = \"exec\"\n\
             exec = [\"true\"]\nverify = [\"true\"]\n"
                .to_string(),
            "line 6, column 9: watch \"app\": `check`: /usr/sbin/tend-no-such-check does not exist",
        ),
        (
            format!("[service]\ncommand = [\"true\"]\n{watch}on_change = \"none\"\n"),
            "line 5, column 9: watch \"app\": /etc/tend-test-no-such-volume does not exist: tend \
             would not be ready until it does; mount the volume there (check the volumeMount's \
             mountPath), or set optional = true on the watch if it may be absent",
        ),
    ] {
        let (code, out, err) = check_config(&sb, &toml);
        assert_eq!(code, 0, "outside the image: {toml}\n{err}");
        assert!(out.contains("[service]"), "{out}");
        let warning = format!(
            "tend: warning: {}: {says}",
            sb.path("supervisor.toml").display()
        );
        assert!(
            err.contains(&warning),
            "expected {warning:?} for {toml:?} in:\n{err}"
        );
        assert!(
            err.contains("a warning outside the container: `tend check-config --in-image` there makes it an error"),
            "{err}"
        );
        let (code, out, err) = check_in_image(&sb, &toml);
        assert_eq!(code, 2, "in the image: {toml}\n{out}");
        assert!(out.is_empty(), "{out}");
        let error = format!(
            "tend: invalid config {}: {says}",
            sb.path("supervisor.toml").display()
        );
        assert!(
            err.starts_with(&error),
            "expected {error:?} for {toml:?} in:\n{err}"
        );
    }
    // An optional volume may be absent; what is there passes in the image.
    let (code, _, err) = check_in_image(
        &sb,
        &format!(
            "[service]\ncommand = [\"sh\", \"-c\", \"true\"]\nworking_dir = \"/\"\n{watch}optional = true\non_change = \"none\"\n"
        ),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "");
}

#[test]
fn relative_watched_paths_are_warnings() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.path("conf")).unwrap();
    let (code, out, err) = check_in_image(
        &sb,
        "[[watch]]\nname = \"app\"\npaths = [\"conf\"]\non_change = \"none\"\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[[watch]]"), "{out}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].ends_with(&format!(
            "line 3, column 9: watch \"app\": \"conf\" is relative: from the current directory it is {}; tend resolves it from the directory it is started in",
            sb.path("conf").display()
        )),
        "{err}"
    );
}

#[test]
fn mistakes_a_newcomer_makes_are_named_with_the_fix() {
    let sb = Sandbox::new();
    for (toml, says) in [
        (
            "[service]\ncommand = [\"true\"]\n\n[watch]\npaths = [\"/etc/app\"]\non_change = \"signal\"\n",
            "help: [watch] is a single table, but watches are a list of tables: write [[watch]] \
             (double brackets) before the keys of each",
        ),
        (
            "[service]\ncommand = \"nginx -g 'daemon off;'\"\n",
            "give the program and each argument as its own string: [\"nginx\", \"-g\", \"daemon off;\"]",
        ),
        (
            "[service]\ncommand = [\"true\"]\n[[watch]]\npaths = [\"/\"]\non_change = \"restart\"\nstop_timeout = \"20s\"\n",
            "help: `stop_timeout` is not a key of [[watch]]: it belongs in [service]",
        ),
    ] {
        let (code, _, err) = check_config(&sb, toml);
        assert_eq!(code, 2, "{toml}");
        assert!(
            err.contains(says),
            "expected {says:?} for {toml:?} in:\n{err}"
        );
    }
    // Two watches of one service on one path: accepted, with why it is
    // likely a mistake.
    let (code, _, err) = check_config(
        &sb,
        "[service]\ncommand = [\"true\"]\n[[watch]]\nname = \"a\"\npaths = [\"/\"]\non_change = \"signal\"\n\
         [[watch]]\nname = \"b\"\npaths = [\"/\"]\non_change = \"restart\"\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("line 9, column 9: watch \"b\" watches /, as watch \"a\" does: every change there runs both watches' checks and actions on the same service"),
        "{err}"
    );
}

#[test]
fn with_json_logs_a_config_error_is_a_json_line() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\ncommand = [\"true\"]\n[watch]\npaths = [\"/\"]\n");
    let (code, _, err) = sb
        .tend()
        .env("TEND_LOG_FORMAT", "json")
        .config(&cfg)
        .run(secs(10.0));
    assert_eq!(code, 2);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(line["level"], "ERROR", "{line}");
    let message = line["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "invalid config {}: TOML parse error at line 3",
            cfg.display()
        )) && message.contains("write [[watch]]"),
        "{line}"
    );
    assert!(line["timestamp"].is_string(), "{line}");
    let (code, _, err) = sb
        .tend()
        .not_pid1()
        .env("TEND_LOG_FORMAT", "json")
        .args(&["check-config"])
        .config(&sb.config("[service]\ncommand = [\"true\"]\nworking_dir = \"/no/such/dir\"\n"))
        .run(secs(10.0));
    assert_eq!(code, 0, "{err}");
    let line: serde_json::Value = serde_json::from_str(err.trim_end()).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert!(
        line["message"].as_str().unwrap().contains("working_dir"),
        "{line}"
    );
}

#[test]
fn a_readiness_file_inside_a_watched_path_is_a_warning() {
    let sb = Sandbox::new();
    std::fs::create_dir(sb.path("conf")).unwrap();
    let (code, _, err) = check_config(
        &sb,
        "[readiness]\nstatus_file = \"conf/status.json\"\n\
         [[watch]]\nname = \"app\"\npaths = [\"conf\"]\non_change = \"none\"\n",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("tend: warning: ")
            && err.contains("line 2")
            && err.contains("inside \"conf\", which watch \"app\" covers"),
        "{err}"
    );
}
