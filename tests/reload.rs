//! The reload pipeline: checks, actions, invalid configs, coalescing, and
//! readiness (the ready file, the status file, `tend probe`).

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::gate::Gate;
use common::kubelet::project;
use common::*;
use nix::sys::signal::Signal;

fn quiet(s: f64) {
    std::thread::sleep(secs(s));
}

/// A check that records what it saw in `checks.log` and rejects any config
/// containing INVALID, saying why on stderr.
fn validator(sb: &Sandbox, file: &Path) -> String {
    let script = format!(
        "echo checked $(cat {f}) >> {log}; if grep -q INVALID {f}; then echo 'bad value on line 1' >&2; exit 1; fi",
        f = file.display(),
        log = sb.path("checks.log").display()
    );
    sh(&script)
}

fn checks(sb: &Sandbox) -> Vec<String> {
    fs::read_to_string(sb.path("checks.log"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// One kubelet volume at `config/` with app.conf, watched as "app".
fn k8s(sb: &Sandbox, initial: &str, service: &str, watch: &str) -> PathBuf {
    let vol = sb.path("config");
    project(&vol, &[("app.conf", initial)]);
    sb.config(&format!(
        "[service]\ncommand = {}\n{service}\n{}\n[[watch]]\nname = \"app\"\npaths = [{:?}]\n{watch}",
        sb.service_toml(&["--config", &vol.join("app.conf").display().to_string()]),
        sb.readiness_toml(),
        vol.display().to_string(),
    ))
}

fn update(sb: &Sandbox, content: &str) {
    project(&sb.path("config"), &[("app.conf", content)]);
}

#[test]
fn an_invalid_config_leaves_the_service_alone_and_turns_readiness_off() {
    let sb = Sandbox::new();
    let conf = sb.path("config/app.conf");
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!(
            "on_change = \"signal\"\ncheck = {}\n",
            validator(&sb, &conf)
        ),
    );
    let tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(probe(&cfg), (0, "ready (state ready)\n".into()));

    update(&sb, "INVALID");
    sb.wait_ready(false, secs(5.0));
    let st = sb.wait_state("invalid_config", secs(5.0));
    assert_eq!(st["ready"], false);
    assert_eq!(st["watches"][0]["result"], "invalid");
    assert!(
        st["watches"][0]["check_output"]
            .as_str()
            .unwrap()
            .contains("bad value on line 1")
    );
    assert!(
        sb.log("service sig").is_empty(),
        "the service is not told about an invalid config"
    );
    assert_eq!(sb.log("service start").len(), 1, "and keeps running");
    // The log says it too, and carries the check's output.
    tend.wait_stderr_all(
        &["keeps running on the last good one", "bad value on line 1"],
        secs(5.0),
    );
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert!(
        line.contains("invalid_config") && line.contains("bad value on line 1"),
        "{line}"
    );

    update(&sb, "v2");
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    sb.wait_ready(true, secs(5.0));
    sb.wait_state("ready", secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["v2"]);
    assert_eq!(probe(&cfg).0, 0);
}

/// tend started on an invalid config, waiting (not ready) for a valid one.
fn waiting_for_a_valid_config(sb: &Sandbox) -> Tend {
    let conf = sb.path("config/app.conf");
    let watch = format!("on_change = \"signal\"\ncheck = {}\n", validator(sb, &conf));
    let cfg = k8s(sb, "INVALID", "", &watch);
    let tend = sb.tend().config(&cfg).start();
    sb.wait_state("invalid_config", secs(5.0));
    tend
}

#[test]
fn an_invalid_config_at_start_keeps_the_service_from_starting() {
    let sb = Sandbox::new();
    let mut tend = waiting_for_a_valid_config(&sb);
    quiet(0.5);
    assert!(sb.log("service start").is_empty());
    assert!(!sb.is_ready());
    assert!(tend.is_running());
    tend.wait_stderr("not started until a valid config arrives", secs(5.0));
    update(&sb, "v1");
    let starts = sb.wait_log("service start", 1, secs(5.0));
    assert!(starts[0].ends_with("config=v1"), "{starts:?}");
    sb.wait_ready(true, secs(5.0));
    assert!(
        sb.log("service sig").is_empty(),
        "the start applied it; no signal needed"
    );
}

#[test]
fn sigterm_while_waiting_for_a_valid_config_exits_at_once() {
    let sb = Sandbox::new();
    let mut tend = waiting_for_a_valid_config(&sb);
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(5.0)), 143);
}

#[test]
fn restart_stops_with_stop_signal_and_starts_on_the_new_config() {
    let sb = Sandbox::new();
    // The service ignores SIGTERM, so the restart takes stop_timeout and its
    // states can be seen.
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"1s\"\n{}\n[[watch]]\npaths = [{:?}]\non_change = \"restart\"\n",
        sb.service_toml(&["--ignore-term", "--config", &vol.join("app.conf").display().to_string()]),
        sb.readiness_toml(),
        vol.display().to_string()
    ));
    let _tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    let st = sb.wait_state("restarting", secs(5.0));
    assert_eq!(st["ready"], false);
    assert!(!sb.is_ready(), "not ready while the service restarts");
    let starts = sb.wait_log("service start", 2, secs(5.0));
    assert!(starts[1].ends_with("config=v1"), "{starts:?}");
    assert_eq!(
        sb.seen_on("SIGTERM"),
        ["v1"],
        "stopped with its stop_signal first"
    );
    sb.wait_ready(true, secs(5.0));
    let st = sb.wait_state("ready", secs(5.0));
    assert_eq!(st["service"]["restarts"], 1);
}

#[test]
fn exec_runs_the_command_once_per_update_and_does_not_signal() {
    let sb = Sandbox::new();
    let marker = sb.path("reloads");
    let exec = sh(&format!("echo ran >> {}", marker.display()));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"exec\"\nexec = {exec}\n"),
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    for i in 1..=3 {
        update(&sb, &format!("v{i}"));
        wait_for("the exec action", secs(5.0), || {
            (fs::read_to_string(&marker)
                .unwrap_or_default()
                .lines()
                .count()
                == i)
                .then_some(())
        });
    }
    quiet(0.5);
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().count(), 3);
    assert!(sb.log("service sig").is_empty());
}

#[test]
fn a_failed_exec_is_reported_and_retried_until_it_succeeds() {
    let sb = Sandbox::new();
    let marker = sb.path("failed-once");
    let exec = sh(&format!(
        "if [ ! -e {m} ]; then touch {m}; echo 'reload refused' >&2; exit 1; fi",
        m = marker.display()
    ));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"exec\"\nexec = {exec}\n"),
    );
    let tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    sb.wait_ready(false, secs(5.0));
    let st = wait_for("result action_failed", secs(5.0), || {
        sb.status()
            .filter(|s| s["watches"][0]["result"] == "action_failed")
    });
    assert_eq!(st["ready"], false);
    let err = tend.wait_stderr("retrying in 1s", secs(5.0));
    assert!(err.contains("reload refused"), "{err}");
    sb.wait_ready(true, secs(5.0));
    assert_eq!(
        sb.wait_state("ready", secs(5.0))["watches"][0]["result"],
        "applied"
    );
}

fn processes_with(token: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(token)
        {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

#[test]
fn a_check_past_its_timeout_is_killed_with_its_whole_group() {
    let sb = Sandbox::new();
    let token = "31.4159";
    let check = sh(&format!("sleep {token} & sleep {token}; true"));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"signal\"\ncheck = {check}\ncheck_timeout = \"300ms\"\n"),
    );
    let _tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(5.0));
    assert!(
        st["watches"][0]["check_output"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{st}"
    );
    wait_for("the check's processes to be gone", secs(3.0), || {
        processes_with(token).is_empty().then_some(())
    });
    assert!(sb.log("service start").is_empty());
}

#[test]
fn a_check_is_done_when_it_exits_even_if_a_grandchild_holds_its_output() {
    let sb = Sandbox::new();
    let token = "27.1828";
    let check = sh(&format!("sleep {token} & echo looks fine"));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"signal\"\ncheck = {check}\n"),
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    sb.wait_log("service sig SIGHUP", 1, secs(3.0));
    wait_for("what the check left behind to be killed", secs(3.0), || {
        processes_with(token).is_empty().then_some(())
    });
}

#[test]
fn check_output_is_kept_bounded_to_its_tail() {
    let sb = Sandbox::new();
    let check = sh("head -c 1000000 /dev/zero | tr '\\0' x; echo; echo LAST-LINE >&2; exit 1");
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"signal\"\ncheck = {check}\n"),
    );
    let _tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(5.0));
    let out = st["watches"][0]["check_output"].as_str().unwrap();
    assert!(out.len() <= 4200, "kept {} bytes", out.len());
    assert!(
        out.trim_end().ends_with("LAST-LINE"),
        "{}",
        &out[out.len().saturating_sub(80)..]
    );
}

#[test]
fn a_check_that_writes_without_pause_delays_no_signal_and_no_stop() {
    let sb = Sandbox::new();
    let conf = sb.path("config/app.conf");
    // Passes on v0; on anything else writes without pause until it is killed.
    let check = sh(&format!(
        "[ \"$(cat {})\" = v0 ] && exit 0; exec yes flood",
        conf.display()
    ));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"signal\"\ncheck = {check}\ncheck_timeout = \"60s\"\n"),
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    wait_for("the flooding check", secs(5.0), || {
        (!processes_with("flood").is_empty()).then_some(())
    });
    for n in 1..=5 {
        tend.signal(Signal::SIGUSR1);
        sb.wait_log("service sig SIGUSR1", n, secs(5.0));
    }
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(5.0)), 0, "{}", tend.stderr());
}

/// `k8s` with a check held at `gate` that records what it saw in checks.log.
fn gated_k8s(sb: &Sandbox, gate: &Gate) -> PathBuf {
    let conf = sb.path("config/app.conf");
    let check = sh(&gate.script(&format!(
        "echo checked $(cat {f}) >> {log}",
        f = conf.display(),
        log = sb.path("checks.log").display()
    )));
    k8s(
        sb,
        "v0",
        "",
        &format!("on_change = \"signal\"\ncheck = {check}\n"),
    )
}

#[test]
fn a_change_during_a_check_is_checked_and_applied_after_it() {
    let sb = Sandbox::new();
    let gate = Gate::new(&sb, "check", true);
    let tend = sb.tend().config(&gated_k8s(&sb, &gate)).start_ready();
    gate.close();
    update(&sb, "v1");
    gate.wait_started(2, secs(5.0));
    update(&sb, "v2");
    // tend cannot know of v2 before its scan: wait for it, or v1's check
    // could end first and v1 be applied (rightly) before v2.
    tend.wait_stderr_count("change detected", 2, secs(5.0));
    gate.open();
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    quiet(0.5);
    assert_eq!(
        sb.seen_on("SIGHUP"),
        ["v2"],
        "v1's result was stale: only v2 is applied"
    );
    assert_eq!(checks(&sb), ["checked v0", "checked v2", "checked v2"]);
}

#[test]
fn a_burst_during_a_check_is_applied_once_with_the_last_content() {
    let sb = Sandbox::new();
    let gate = Gate::new(&sb, "check", true);
    let tend = sb.tend().config(&gated_k8s(&sb, &gate)).start_ready();
    gate.close();
    update(&sb, "v1");
    gate.wait_started(2, secs(5.0));
    for i in 2..=29 {
        update(&sb, &format!("v{i}"));
    }
    // The last update adds a key, so that its scan is told from the others'
    // by its file count: tend cannot know of v30 before that scan.
    project(
        &sb.path("config"),
        &[("app.conf", "v30"), ("last.conf", "")],
    );
    tend.wait_stderr("files=2", secs(5.0));
    gate.open();
    sb.wait_log("service sig SIGHUP", 1, secs(10.0));
    quiet(0.5);
    assert_eq!(
        sb.seen_on("SIGHUP"),
        ["v30"],
        "one reload, on the last content"
    );
    assert_eq!(checks(&sb), ["checked v0", "checked v30", "checked v30"]);
}

#[test]
fn a_burst_of_updates_coalesces_and_the_last_one_wins() {
    let sb = Sandbox::new();
    let conf = sb.path("config/app.conf");
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!(
            "on_change = \"signal\"\ncheck = {}\n",
            validator(&sb, &conf)
        ),
    );
    let _tend = sb.tend().config(&cfg).start_ready();
    for i in 1..=30 {
        update(&sb, &format!("v{i}"));
    }
    wait_for("a SIGHUP that sees v30", secs(10.0), || {
        (sb.seen_on("SIGHUP").last().map(String::as_str) == Some("v30")).then_some(())
    });
    quiet(0.5);
    let n = sb.seen_on("SIGHUP").len();
    assert!((1..=30).contains(&n), "{n} SIGHUPs for 30 updates");
    assert_eq!(sb.seen_on("SIGHUP").last().unwrap(), "v30");
}

/// Two volumes, two watches, each with a check held at `gate`, as when one
/// kubelet sync updates both while their checks run.
fn two_volumes(sb: &Sandbox, action: &str, gate: &Gate) -> PathBuf {
    project(&sb.path("a"), &[("a.conf", "a0")]);
    project(&sb.path("b"), &[("b.conf", "b0")]);
    let check = sh(&gate.script("true"));
    sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"a\"\npaths = [{:?}]\ncheck = {check}\non_change = \"{action}\"\n\
         [[watch]]\nname = \"b\"\npaths = [{:?}]\ncheck = {check}\non_change = \"{action}\"\n",
        sb.service_toml(&["--config", &sb.path("b/b.conf").display().to_string()]),
        sb.readiness_toml(),
        sb.path("a").display().to_string(),
        sb.path("b").display().to_string(),
    ))
}

#[test]
fn watches_that_change_together_signal_once() {
    let sb = Sandbox::new();
    let gate = Gate::new(&sb, "check", true);
    let cfg = two_volumes(&sb, "signal", &gate);
    let tend = sb.tend().config(&cfg).start_ready();
    gate.close();
    project(&sb.path("a"), &[("a.conf", "a1")]);
    gate.wait_started(3, secs(5.0));
    project(&sb.path("b"), &[("b.conf", "b1")]);
    gate.wait_started(4, secs(5.0));
    gate.open();
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    quiet(0.8);
    assert_eq!(sb.seen_on("SIGHUP"), ["b1"], "one SIGHUP for both");
    tend.wait_stderr("watch=\"a, b\"", secs(5.0));
}

#[test]
fn watches_that_change_together_restart_once() {
    let sb = Sandbox::new();
    let gate = Gate::new(&sb, "check", true);
    let cfg = two_volumes(&sb, "restart", &gate);
    let _tend = sb.tend().config(&cfg).start_ready();
    gate.close();
    project(&sb.path("a"), &[("a.conf", "a1")]);
    gate.wait_started(3, secs(5.0));
    project(&sb.path("b"), &[("b.conf", "b1")]);
    gate.wait_started(4, secs(5.0));
    gate.open();
    sb.wait_log("service start", 2, secs(5.0));
    sb.wait_ready(true, secs(5.0));
    quiet(0.8);
    assert_eq!(sb.log("service start").len(), 2, "one restart for both");
}

#[test]
fn the_status_file_describes_tend() {
    let sb = Sandbox::new();
    let cfg = k8s(
        &sb,
        "v0",
        "",
        "on_change = \"signal\"\ncheck = [\"true\"]\n",
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    let st = sb.wait_state("ready", secs(5.0));
    assert_eq!(st["ready"], true);
    assert!(st["service"]["pid"].as_i64().unwrap() > 0);
    assert_eq!(st["service"]["restarts"], 0);
    let w = &st["watches"][0];
    assert_eq!(w["name"], "app");
    assert_eq!(w["result"], "applied");
    assert!(w["changed_at"].as_str().unwrap().ends_with('Z'));
    assert!(st["updated_at"].as_str().unwrap().starts_with("20"));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert!(!sb.is_ready(), "the ready file is gone once tend stops");
    assert_eq!(sb.status().unwrap()["state"], "stopping");
}

#[test]
fn probe_needs_something_to_read() {
    let sb = Sandbox::new();
    let cfg = sb.config("[service]\ncommand = [\"true\"]\n");
    let (code, _) = probe(&cfg);
    assert_eq!(code, 2);
    let cfg = sb.config(&format!(
        "[readiness]\nfile = {:?}\n",
        sb.path("ready").display().to_string()
    ));
    assert_eq!(probe(&cfg).0, 1);
    fs::write(sb.path("ready"), "").unwrap();
    assert_eq!(probe(&cfg), (0, "ready\n".into()));
}

#[test]
fn a_restart_during_the_restart_back_off_still_starts_the_service_on_the_new_config() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let marker = sb.path("failed-once").display().to_string();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nrestart = \"on-failure\"\n{}\n[[watch]]\npaths = [{:?}]\non_change = \"restart\"\n",
        sb.service_toml(&["--fail-first", &marker, "--config", &vol.join("app.conf").display().to_string()]),
        sb.readiness_toml(),
        vol.display().to_string()
    ));
    let tend = sb.tend().config(&cfg).start();
    // The first run fails at once; tend waits 1 s before starting it again.
    tend.wait_stderr("restarting in 1s", secs(10.0));
    update(&sb, "v1");
    let starts = sb.wait_log("service start", 2, secs(5.0));
    assert!(starts[1].ends_with("config=v1"), "{starts:?}");
    sb.wait_ready(true, secs(5.0));
}

#[test]
fn ctrl_c_while_waiting_for_a_valid_config_stops_tend() {
    let sb = Sandbox::new();
    let mut tend = waiting_for_a_valid_config(&sb);
    tend.signal(Signal::SIGINT);
    assert_eq!(tend.wait(secs(5.0)), 130);
    assert!(
        tend.stderr()
            .contains("SIGINT received while no service runs: stopping")
    );
}

#[test]
fn on_change_none_tracks_readiness_and_touches_nothing() {
    let sb = Sandbox::new();
    let conf = sb.path("config/app.conf");
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"none\"\ncheck = {}\n", validator(&sb, &conf)),
    );
    let tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    tend.wait_stderr("config accepted (on_change = \"none\")", secs(5.0));
    update(&sb, "INVALID");
    sb.wait_ready(false, secs(5.0));
    update(&sb, "v2");
    sb.wait_ready(true, secs(5.0));
    let st = sb.wait_state("ready", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "applied");
    assert!(
        sb.log("service sig ").is_empty(),
        "the service got no signal"
    );
    assert_eq!(sb.log("service start").len(), 1);
}

#[test]
fn a_kubelet_update_is_acted_on_at_once_even_with_a_long_debounce() {
    let sb = Sandbox::new();
    let cfg = k8s(&sb, "v0", "", "on_change = \"signal\"\ndebounce = \"1m\"\n");
    let _tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"]);
}

#[test]
fn an_exec_past_its_timeout_is_killed_reported_and_retried() {
    let sb = Sandbox::new();
    let works = sb.path("reload-works");
    let exec = sh(&format!("[ -e {} ] || exec sleep 60", works.display()));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"exec\"\nexec = {exec}\ncheck_timeout = \"500ms\"\n"),
    );
    let tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    tend.wait_stderr("reload command failed (timed out after 500ms", secs(10.0));
    // The status said reloading while the exec ran, too: wait for its result.
    let st = wait_for("the exec's failure in the status", secs(5.0), || {
        sb.status()
            .filter(|s| s["watches"][0]["result"] == "action_failed")
    });
    assert_eq!(st["state"], "reloading");
    assert_eq!(st["ready"], false);
    fs::write(&works, "").unwrap();
    sb.wait_ready(true, secs(10.0));
    assert_eq!(sb.status().unwrap()["watches"][0]["result"], "applied");
}

#[test]
fn the_status_says_starting_then_reloading_with_a_pending_result() {
    let sb = Sandbox::new();
    let gate = Gate::new(&sb, "check", false);
    let check = sh(&gate.script("true"));
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"signal\"\ncheck = {check}\n"),
    );
    let _tend = sb.tend().config(&cfg).start();
    gate.wait_started(1, secs(10.0));
    let st = sb.wait_state("starting", secs(5.0));
    assert_eq!(st["ready"], false);
    assert_eq!(st["watches"][0]["result"], "pending");
    assert!(st["service"]["pid"].is_null());
    gate.open();
    sb.wait_log("service start", 1, secs(10.0));
    sb.wait_ready(true, secs(10.0));
    gate.close();
    update(&sb, "v1");
    gate.wait_started(2, secs(5.0));
    let st = sb.wait_state("reloading", secs(5.0));
    assert_eq!(st["ready"], true, "the service still runs a good config");
    assert_eq!(st["watches"][0]["result"], "pending");
    gate.open();
    let st = sb.wait_state("ready", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "applied");
}

#[test]
fn with_invalid_config_ready_a_rejected_edit_keeps_the_replica_ready() {
    let sb = Sandbox::new();
    let conf = sb.path("config/app.conf");
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!(
            "on_change = \"signal\"\ncheck = {}\n",
            validator(&sb, &conf)
        ),
    );
    let text = fs::read_to_string(&cfg)
        .unwrap()
        .replace("[readiness]\n", "[readiness]\ninvalid_config = \"ready\"\n");
    fs::write(&cfg, text).unwrap();
    let tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "INVALID");
    let st = sb.wait_state("invalid_config", secs(5.0));
    assert_eq!(
        st["ready"], true,
        "the service still runs its last good config"
    );
    assert!(sb.is_ready());
    assert_eq!(
        probe(&cfg),
        (
            0,
            "ready (state invalid_config); watch \"app\": invalid: bad value on line 1\n".into()
        ),
        "the probe still says what was rejected, and why"
    );
    tend.wait_stderr("check failed", secs(5.0));
    assert!(sb.log("service sig ").is_empty());
}

/// A reload endpoint on `port`: logs each request line to `requests.log`,
/// answers 500 with a reason while `broken` exists, else 200.
const RELOAD_ENDPOINT: &str = r#"
import http.server, os, sys
port, log, broken = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        with open(log, "a") as f:
            f.write(self.requestline + "\n")
        if os.path.exists(broken):
            body = b"failed to reload config: unknown field\nsecond line\n"
            self.send_response(500)
        else:
            body = b"ok\n"
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

#[test]
fn an_http_action_calls_the_reload_endpoint_and_retries_until_it_answers_2xx() {
    let sb = Sandbox::new();
    let port = common::http::free_port();
    let script = sb.write("endpoint.py", RELOAD_ENDPOINT);
    let broken = sb.path("broken");
    let service = toml_list(&[
        "python3".into(),
        script.display().to_string(),
        port.to_string(),
        sb.path("requests.log").display().to_string(),
        broken.display().to_string(),
    ]);
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let cfg = sb.config(&format!(
        "[service]\ncommand = {service}\n{}\n[[watch]]\nname = \"app\"\npaths = [{:?}]\n\
         on_change = \"http\"\nhttp = {{ url = \"http://127.0.0.1:{port}/-/reload\", timeout = \"2s\" }}\n",
        sb.readiness_toml(),
        vol.display().to_string(),
    ));
    let tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(10.0));
    wait_for("the endpoint to listen", secs(10.0), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let requests = || {
        fs::read_to_string(sb.path("requests.log"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    fs::write(&broken, "").unwrap();
    update(&sb, "v1");
    tend.wait_stderr(
        "HTTP 500: failed to reload config: unknown field",
        secs(10.0),
    );
    let st = sb.wait_state("reloading", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "action_failed");
    fs::remove_file(&broken).unwrap();
    sb.wait_ready(true, secs(10.0));
    assert_eq!(sb.status().unwrap()["watches"][0]["result"], "applied");
    let r = requests();
    assert!(r.len() >= 2, "{r:?}");
    assert!(r.iter().all(|l| l == "POST /-/reload HTTP/1.1"), "{r:?}");
}

#[test]
fn an_http_endpoint_that_never_answers_times_out_without_holding_tend_up() {
    let sb = Sandbox::new();
    let endpoint = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/-/reload", endpoint.local_addr().unwrap());
    let cfg = k8s(
        &sb,
        "v0",
        "",
        &format!("on_change = \"http\"\nhttp = {{ url = {url:?}, timeout = \"3s\" }}\n"),
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    update(&sb, "v1");
    // The call is in flight: its connection is taken, and never answered.
    endpoint.set_nonblocking(true).unwrap();
    let held = wait_for("the reload call", secs(10.0), || endpoint.accept().ok());
    let asked = std::time::Instant::now();
    tend.signal(Signal::SIGUSR1);
    sb.wait_log("service sig SIGUSR1", 1, secs(10.0));
    assert!(
        asked.elapsed() < secs(2.0),
        "a signal waited {:?} for the reload endpoint",
        asked.elapsed()
    );
    tend.wait_stderr(&format!("POST {url}: no answer within 3s"), secs(10.0));
    let st = sb.wait_state("reloading", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "action_failed");
    drop(held);
}
