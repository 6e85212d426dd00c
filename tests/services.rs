//! Several services in one container, with tend as PID 1: start order on
//! readiness, the exit policy, stop order, users, and what the status and
//! /metrics say of each service.

mod common;

use std::fs;

use common::svc::{host_pid_of, kill_pid};
use common::*;
use nix::sys::signal::Signal;

/// The instrumented service, logging as `tag` into the sandbox's log.
fn svc(sb: &Sandbox, tag: &str, extra: &[&str]) -> String {
    let mut args = vec!["--tag", tag];
    args.extend(extra);
    sb.service_toml(&args)
}

/// A `[[service]]` table.
fn service(name: &str, command: &str, more: &str) -> String {
    format!("[[service]]\nname = {name:?}\ncommand = {command}\n{more}\n")
}

/// The line numbers of the first log line of each prefix, in log order.
fn order(sb: &Sandbox, prefixes: &[&str]) -> Vec<usize> {
    let log = fs::read_to_string(sb.path("service.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    prefixes
        .iter()
        .map(|p| {
            lines
                .iter()
                .position(|l| l.starts_with(p))
                .unwrap_or_else(|| panic!("no log line {p:?} in\n{log}"))
        })
        .collect()
}

#[test]
fn a_oneshot_runs_before_the_app_which_starts_only_after_it() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "{}{}{}",
        service(
            "migrate",
            &svc(&sb, "migrate", &["--exit-after", "0.3"]),
            "oneshot = true"
        ),
        service("app", &svc(&sb, "app", &[]), "after = [\"migrate\"]"),
        sb.readiness_toml()
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(10.0));
    sb.wait_log("app start", 1, secs(10.0));
    let at = order(&sb, &["migrate start", "migrate exit 0", "app start"]);
    assert!(
        at[0] < at[1] && at[1] < at[2],
        "migrate ran to its end first"
    );
    let st = sb.status().unwrap();
    let states: Vec<_> = st["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("migrate".into(), "done".into()),
            ("app".into(), "running".into())
        ]
    );
    assert_eq!(
        st["service"]["pid"], st["services"][1]["pid"],
        "the main service"
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn a_failing_oneshot_ends_the_container_with_its_status_and_starts_nothing_after_it() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "{}{}",
        service(
            "migrate",
            &svc(&sb, "migrate", &["--exit-after", "0", "--exit-code", "4"]),
            "oneshot = true"
        ),
        service("app", &svc(&sb, "app", &[]), "after = [\"migrate\"]"),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    assert_eq!(tend.wait(secs(10.0)), 4);
    assert!(sb.log("app").is_empty(), "app never started");
    assert!(
        tend.stderr().contains(
            "a required service ended (exit code 4): stopping the others; tend exits with 4"
        ),
        "{}",
        tend.stderr()
    );
}

#[test]
fn the_main_service_exiting_stops_the_helpers_and_ends_tend_with_its_status() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "{}{}",
        service(
            "app",
            &svc(&sb, "app", &["--exit-after", "0.5", "--exit-code", "3"]),
            ""
        ),
        service("helper", &svc(&sb, "helper", &[]), ""),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    assert_eq!(tend.wait(secs(10.0)), 3);
    sb.wait_log("helper sig SIGTERM", 1, secs(1.0));
    let at = order(&sb, &["app exit 3", "helper sig SIGTERM"]);
    assert!(at[0] < at[1]);
    // With several services, each of their lines names the one it is about.
    let err = tend.stderr();
    let said = |what: &str, service: &str| {
        err.lines()
            .any(|l| l.contains(what) && l.contains(&format!("service=\"{service}\"")))
    };
    assert!(
        said("service started", "app") && said("service started", "helper"),
        "{err}"
    );
    assert!(said("stopping the service", "helper"), "{err}");
}

#[test]
fn a_required_helper_killed_for_good_ends_tend_with_137() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "{}{}",
        service("app", &svc(&sb, "app", &[]), ""),
        service("helper", &svc(&sb, "helper", &[]), "restart = \"never\""),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("app start", 1, secs(10.0));
    sb.wait_log("helper start", 1, secs(10.0));
    let helper = host_pid_of(&mut tend, "--tag\0helper");
    kill_pid(helper, Signal::SIGKILL);
    assert_eq!(tend.wait(secs(10.0)), 137);
    sb.wait_log("app sig SIGTERM", 1, secs(1.0));
    let err = tend.stderr();
    assert!(
        err.contains("service=\"helper\"") || err.contains("helper"),
        "the log says which service ended the container: {err}"
    );
}

#[test]
fn a_helper_that_is_not_required_dies_and_the_container_goes_on() {
    let sb = Sandbox::new();
    let port = common::http::free_port();
    let cfg = sb.config(&format!(
        "{}{}{}[http]\nlisten = \"127.0.0.1:{port}\"\n",
        service("app", &svc(&sb, "app", &[]), ""),
        service("exporter", &svc(&sb, "exporter", &[]), "required = false"),
        sb.readiness_toml(),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(10.0));
    sb.wait_log("app start", 1, secs(10.0));
    sb.wait_log("exporter start", 1, secs(10.0));
    let exporter = host_pid_of(&mut tend, "--tag\0exporter");
    kill_pid(exporter, Signal::SIGKILL);
    let st = wait_for("the exporter to be ended", secs(10.0), || {
        sb.status().filter(|s| s["services"][1]["state"] == "ended")
    });
    assert_eq!(st["services"][1]["last_exit"], "killed by SIGKILL");
    assert_eq!(st["services"][1]["last_exit_code"], 137);
    assert_eq!(st["ready"], true, "not required: still ready");
    assert!(tend.is_running());
    let page = common::http::get_with(port, "/metrics", &[]).unwrap();
    assert!(
        page.contains("tend_service_ready{service=\"exporter\"} 0"),
        "{page}"
    );
    assert!(
        page.contains("tend_service_ready{service=\"app\"} 1"),
        "{page}"
    );
    tend.signal(Signal::SIGTERM);
    let code = tend.wait(secs(10.0));
    assert_eq!(code, 0, "{}", tend.stderr());
}

#[test]
fn sigterm_stops_services_in_reverse_order_of_after_and_a_stuck_one_is_killed_at_its_timeout() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "{}{}{}",
        service("db", &svc(&sb, "db", &[]), ""),
        service(
            "app",
            &svc(&sb, "app", &[]),
            "after = [\"db\"]\nmain = true"
        ),
        service(
            "stuck",
            &svc(&sb, "stuck", &["--ignore-term"]),
            "stop_timeout = \"1s\"\nafter = [\"db\"]"
        ),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("app start", 1, secs(10.0));
    sb.wait_log("stuck start", 1, secs(10.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0, "app's status");
    let at = order(
        &sb,
        &["app sig SIGTERM", "stuck sig SIGTERM", "db sig SIGTERM"],
    );
    assert!(at[0] < at[2] && at[1] < at[2], "db stops after both");
    assert!(
        tend.stderr().contains("sending SIGKILL"),
        "{}",
        tend.stderr()
    );
}

#[test]
fn a_service_runs_as_its_user_with_its_groups_and_home() {
    let sb = Sandbox::new();
    // The service, as nobody, writes its log here.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = sb.config(&format!(
        "{}{}",
        service(
            "app",
            &svc(
                &sb,
                "app",
                &["--env", "HOME", "--env", "USER", "--env", "LOGNAME"]
            ),
            "user = \"nobody\""
        ),
        service("root", &svc(&sb, "root", &[]), ""),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("app start", 1, secs(10.0));
    let pid = host_pid_of(&mut tend, "--tag\0app");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(field("Uid:"), "65534 65534 65534 65534");
    assert_eq!(field("Gid:"), "65534 65534 65534 65534");
    assert_eq!(field("Groups:"), "65534");
    assert_eq!(sb.log("app env HOME="), ["app env HOME=/nonexistent"]);
    assert_eq!(sb.log("app env USER="), ["app env USER=nobody"]);
    assert_eq!(sb.log("app env LOGNAME="), ["app env LOGNAME=nobody"]);
    let root = host_pid_of(&mut tend, "--tag\0root");
    let status = fs::read_to_string(format!("/proc/{root}/status")).unwrap();
    assert!(
        status.contains("\nUid:\t0\t"),
        "the other service keeps tend's user"
    );
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(10.0));
}

#[test]
fn a_user_at_its_limit_of_processes_is_named_as_the_reason_a_start_failed() {
    // With RLIMIT_NPROC at 0, the first process of a user starts (the kernel
    // counts the user's processes before the switch); the second is refused
    // at execve with EAGAIN. Root, which tend and unshare are, is exempt.
    let sb = Sandbox::new();
    let user = "user = \"61234:61234\"";
    let cfg = sb.config(&format!(
        "{}{}",
        service("first", r#"["sleep", "1000"]"#, user),
        service(
            "second",
            r#"["true"]"#,
            &format!("{user}\nafter = [\"first\"]\nrequired = false")
        ),
    ));
    let mut tend = sb
        .tend()
        .config(&cfg)
        .pre_exec(|| {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: setrlimit reads `none`; async-signal-safe.
            if unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &none) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
        .start();
    let err = tend.wait_stderr("service=\"second\"", secs(10.0));
    assert!(
        err.contains(
            "cannot start \"true\": execve() in the child failed: EAGAIN: Try again; the \
             service's user has as many processes as RLIMIT_NPROC allows"
        ),
        "{err}"
    );
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(10.0));
}

#[test]
fn a_user_that_is_not_there_stops_tend_before_anything_starts() {
    let sb = Sandbox::new();
    let cfg = sb.config(&service(
        "app",
        &svc(&sb, "app", &[]),
        "user = \"no-such-user\"",
    ));
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "service \"app\": user = \"no-such-user\": no user \"no-such-user\" in /etc/passwd"
        ),
        "{err}"
    );
    assert!(sb.log("app").is_empty());
}

#[test]
fn a_published_secret_is_readable_by_the_user_its_service_runs_as() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let sb = Sandbox::new();
    fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o777)).unwrap();
    // A Secret as the kubelet projects it with defaultMode 0400: root's.
    let vol = sb.path("secret");
    common::kubelet::project_mode(&vol, &[("token", "s3cret")], 0o400);
    let published = sb.path("pub");
    let cfg = sb.config(&format!(
        "{}[[watch]]\nname = \"token\"\nservice = \"app\"\npaths = [{:?}]\npublish = {:?}\non_change = \"restart\"\n",
        service(
            "app",
            &svc(&sb, "app", &["--config", &published.join("token").display().to_string()]),
            "user = \"nobody\""
        ),
        vol.display().to_string(),
        published.display().to_string(),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    let start = sb.wait_log("app start", 1, secs(10.0));
    assert!(
        start[0].ends_with("config=s3cret"),
        "{start:?}: nobody reads its copy"
    );
    let file = fs::canonicalize(published.join("token")).unwrap();
    let meta = fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (65534, 65534, 0o400)
    );
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(10.0));
}
