//! Real programs under tend as PID 1, as Debian ships them.
//!
//! haproxy in master-worker mode (`-Ws`) on a socket tend holds (`bind
//! fd@3`): its check needs the socket too (`check_sockets`), and its
//! reloads, which it announces with RELOADING=1 then READY=1, work with
//! either notify semantics. gunicorn says READY=1 at start and nothing on
//! SIGHUP: with notify, its reloads count as applied once the signal is
//! sent (systemd's Type=notify), not as failed.

mod common;

use common::http::{free_port, get};
use common::kubelet::project;
use common::*;
use nix::sys::signal::Signal;

fn haproxy_cfg(body: &str) -> String {
    format!(
        "global\n    log stdout format raw local0\n\
         defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n\
         frontend web\n    bind fd@3\n    http-request return status 200 content-type text/plain string \"{body}\"\n"
    )
}

fn config(sb: &Sandbox, port: u16, check_sockets: bool, reload_notify: bool) -> std::path::PathBuf {
    let cfg = sb.write("haproxy.cfg", &haproxy_cfg("v1"));
    sb.config(&format!(
        "[service]\ncommand = [\"haproxy\", \"-Ws\", \"-f\", {cfg:?}]\nnotify = true\nreload_notify = {reload_notify}\n\
         {}\n[[socket]]\nname = \"http\"\nlisten = \"127.0.0.1:{port}\"\n\
         [[watch]]\nname = \"haproxy\"\npaths = [{cfg:?}]\ncheck = [\"haproxy\", \"-c\", \"-f\", {cfg:?}]\n\
         check_sockets = {check_sockets}\non_change = \"signal\"\nsignal = \"SIGUSR2\"\n",
        sb.readiness_toml(),
    ))
}

#[test]
fn a_check_given_the_services_sockets_passes_and_reloads_are_served_with_either_notify_semantics() {
    for reload_notify in [false, true] {
        let sb = Sandbox::new();
        let port = free_port();
        let cfg = config(&sb, port, true, reload_notify);
        let mut tend = sb.tend().config(&cfg).start();
        sb.wait_ready(true, secs(20.0));
        assert_eq!(get(port).as_deref(), Ok("v1"));
        sb.write("haproxy.cfg", &haproxy_cfg("v2"));
        wait_for("haproxy to serve v2", secs(20.0), || {
            (get(port).as_deref() == Ok("v2")).then_some(())
        });
        let st = wait_for(
            "the reload to be applied and tend ready",
            secs(20.0),
            || {
                sb.status()
                    .filter(|s| s["ready"] == true && s["watches"][0]["result"] == "applied")
            },
        );
        assert_eq!(st["state"], "ready", "reload_notify = {reload_notify}");
        // haproxy's master re-executes itself on a reload: a SIGTERM that
        // lands meanwhile kills it (143) rather than stopping it (0).
        tend.signal(Signal::SIGTERM);
        let code = tend.wait(secs(20.0));
        assert!(code == 0 || code == 143, "{code}");
    }
}

#[test]
fn without_check_sockets_a_check_of_a_socket_activated_haproxy_fails_and_says_why() {
    let sb = Sandbox::new();
    let cfg = config(&sb, free_port(), false, false);
    let mut tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(20.0));
    let output = st["watches"][0]["check_output"].as_str().unwrap();
    assert!(
        output.contains("cannot use file descriptor '3'"),
        "{output}"
    );
    assert!(
        sb.status().unwrap()["service"]["pid"].is_null(),
        "never started on a config that did not pass"
    );
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(20.0));
}

#[test]
fn gunicorn_reloads_on_sighup_with_notify_and_the_reload_counts_as_applied() {
    assert!(
        std::path::Path::new("/usr/bin/gunicorn").exists(),
        "gunicorn is not installed: scripts/install-deps installs Debian's package"
    );
    let sb = Sandbox::new();
    let port = free_port();
    let vol = sb.path("app");
    project(&vol, &[("app.conf", "greeting = v0\n")]);
    let conf = vol.join("app.conf").display().to_string();
    sb.write(
        "wsgi/app.py",
        &format!(
            "greeting = [l.split('=', 1)[1].strip() for l in open({conf:?}) if l.startswith('greeting')][0]\n\
             def application(environ, start_response):\n\
             \x20   body = greeting.encode()\n\
             \x20   start_response('200 OK', [('Content-Length', str(len(body)))])\n\
             \x20   return [body]\n"
        ),
    );
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"/usr/bin/gunicorn\", \"--chdir\", {:?}, \"--workers\", \"2\", \
         \"--graceful-timeout\", \"3\", \"--bind\", \"127.0.0.1:{port}\", \"app:application\"]\n\
         notify = true\nready_timeout = \"20s\"\nstop_timeout = \"20s\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"signal\"\nsignal = \"SIGHUP\"\n",
        sb.path("wsgi").display().to_string(),
        sb.readiness_toml(),
        vol.display().to_string(),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(30.0));
    assert_eq!(get(port).as_deref(), Ok("v0"));
    project(&vol, &[("app.conf", "greeting = v1\n")]);
    wait_for("gunicorn's new workers to serve v1", secs(30.0), || {
        (get(port).as_deref() == Ok("v1")).then_some(())
    });
    // Applied at once: with reload_notify (Type=notify-reload) it would
    // wait for a RELOADING=1 that gunicorn never sends, then fail.
    let st = sb.wait_state("ready", secs(10.0));
    assert_eq!(st["watches"][0]["result"], "applied");
    tend.wait_stderr("sent SIGHUP to the service: config applied", secs(5.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(30.0)), 0);
}
