//! Restarts without downtime, end to end under continuous load on loopback:
//! tend holds the listening socket, and with restart_mode = "overlap" starts
//! the new instance (READY=1 on NOTIFY_SOCKET) before it stops the old one.
//! Figures are printed for BENCHMARKS.md (run with --nocapture).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::http::{Load, free_port, wait_up};
use common::kubelet::project;
use common::*;

const RESTARTS: usize = 20;

/// What a run of restarts under load measured.
struct Figures {
    requests: usize,
    failed: Vec<String>,
    steady: Vec<Duration>,
    restarting: Vec<Duration>,
}

impl Figures {
    fn refused(&self) -> usize {
        self.failed.iter().filter(|e| e.contains("refused")).count()
    }

    fn report(&self, what: &str) {
        let p = |v: &[Duration], q: f64| -> String {
            if v.is_empty() {
                return "-".into();
            }
            let mut v = v.to_vec();
            v.sort();
            let i = ((v.len() as f64 - 1.0) * q).round() as usize;
            format!("{:.2}ms", v[i].as_secs_f64() * 1e3)
        };
        eprintln!(
            "{what}: {} requests, {} failed ({} refused); latency steady p50 {} p99 {} max {}; \
             during restarts p50 {} p99 {} max {} ({} requests)",
            self.requests,
            self.failed.len(),
            self.refused(),
            p(&self.steady, 0.5),
            p(&self.steady, 0.99),
            p(&self.steady, 1.0),
            p(&self.restarting, 0.5),
            p(&self.restarting, 0.99),
            p(&self.restarting, 1.0),
            self.restarting.len(),
        );
    }
}

/// Starts tend with `toml`, then changes `greeting` RESTARTS times under a
/// load of 4 clients, waiting each time until the new greeting is served and
/// only one instance is left.
fn restarts_under_load(sb: &Sandbox, port: u16, config: &str) -> Figures {
    let vol = sb.path("app");
    let cfg = sb.config(config);
    let tend = sb.tend().config(&cfg).start();
    assert_eq!(wait_up(port, secs(15.0)), "v0");
    sb.wait_ready(true, secs(10.0));
    let load = Load::workers(4, port, 200_000, secs(180.0), secs(0.002));
    std::thread::sleep(secs(0.5));
    let mut windows = Vec::new();
    for i in 1..=RESTARTS {
        let body = format!("v{i}");
        let swap = Instant::now();
        project(&vol, &[("app.conf", &format!("greeting = {body}\n"))]);
        load.wait_body(&body, swap, secs(15.0));
        wait_for("one instance left", secs(15.0), || {
            sb.status().filter(|s| {
                s["ready"] == true && s["service"]["instances"].as_array().map(Vec::len) == Some(1)
            })
        });
        windows.push((swap, Instant::now()));
    }
    std::thread::sleep(secs(0.5));
    let (records, latencies) = load.finish_timed();
    let during = |t: &Instant| windows.iter().any(|(a, b)| t >= a && t <= b);
    let (restarting, steady): (Vec<_>, Vec<_>) = latencies.iter().partition(|(t, _)| during(t));
    let said = "restarting the service on the new config";
    let err = tend.wait_stderr_count(said, RESTARTS, secs(5.0));
    assert_eq!(err.matches(said).count(), RESTARTS, "{err}");
    Figures {
        requests: records.len(),
        failed: records.into_iter().filter_map(|(_, r)| r.err()).collect(),
        steady: steady.into_iter().map(|(_, d)| d).collect(),
        restarting: restarting.into_iter().map(|(_, d)| d).collect(),
    }
}

fn example_server() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/zero-downtime/server.py")
        .display()
        .to_string()
}

/// The zero-downtime example's server on a held socket, restarted with `mode`.
fn example_config(sb: &Sandbox, port: u16, mode: &str) -> String {
    let vol = sb.path("app");
    project(&vol, &[("app.conf", "greeting = v0\n")]);
    let server = example_server();
    let conf = vol.join("app.conf").display().to_string();
    format!(
        "[service]\ncommand = [\"python3\", {server:?}, {conf:?}]\nnotify = true\nrestart_mode = \"{mode}\"\n\
         [[socket]]\nname = \"http\"\nlisten = \"127.0.0.1:{port}\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\ncheck = [\"python3\", {server:?}, \"--check\", {conf:?}]\n\
         on_change = \"restart\"\n",
        sb.readiness_toml(),
        vol.display().to_string(),
    )
}

#[test]
fn overlap_restarts_of_a_program_on_a_held_socket_drop_no_request() {
    let sb = Sandbox::new();
    let port = free_port();
    let f = restarts_under_load(&sb, port, &example_config(&sb, port, "overlap"));
    f.report("overlap, held socket, notify");
    assert!(f.failed.is_empty(), "failed requests: {:?}", f.failed);
}

#[test]
fn stop_start_restarts_on_a_held_socket_refuse_no_connection() {
    let sb = Sandbox::new();
    let port = free_port();
    let f = restarts_under_load(&sb, port, &example_config(&sb, port, "stop-start"));
    f.report("stop-start, held socket, notify");
    assert_eq!(f.refused(), 0, "refused: {:?}", f.failed);
}

#[test]
fn gunicorn_on_a_held_socket_is_restarted_without_a_failed_request() {
    if !Path::new("/usr/bin/gunicorn").exists() {
        panic!("gunicorn is not installed: scripts/install-deps installs Debian's package");
    }
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
             \x20   body = (greeting + '\\n').encode()\n\
             \x20   start_response('200 OK', [('Content-Length', str(len(body)))])\n\
             \x20   return [body]\n"
        ),
    );
    let config = format!(
        "[service]\ncommand = [\"/usr/bin/gunicorn\", \"--chdir\", {:?}, \"--workers\", \"2\", \
         \"--graceful-timeout\", \"10\", \"app:application\"]\nnotify = true\nrestart_mode = \"overlap\"\n\
         [[socket]]\nname = \"http\"\nlisten = \"127.0.0.1:{port}\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\ncheck = [\"grep\", \"-q\", \"^greeting *= *[^ ]\", {conf:?}]\n\
         on_change = \"restart\"\n",
        sb.path("wsgi").display().to_string(),
        sb.readiness_toml(),
        vol.display().to_string(),
    );
    let f = restarts_under_load(&sb, port, &config);
    f.report("gunicorn, overlap, held socket, notify");
    assert!(f.failed.is_empty(), "failed requests: {:?}", f.failed);
}

#[test]
fn a_port_that_is_taken_is_a_start_up_error_naming_it() {
    let sb = Sandbox::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n[[socket]]\nname = \"http\"\nlisten = \"127.0.0.1:{port}\"\n",
        sb.service_toml(&[])
    ));
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot listen on 127.0.0.1:{port} (socket \"http\")"
        )),
        "{err}"
    );
    assert!(sb.log("service start").is_empty(), "nothing started");
    let _ = Duration::ZERO;
}

#[test]
fn a_new_instance_that_crashes_before_ready_leaves_the_old_one_serving_every_request() {
    let sb = Sandbox::new();
    let port = free_port();
    // No check: a config the server refuses at start-up gets through.
    let config = example_config(&sb, port, "overlap")
        .replace("check = [\"python3\"", "# check = [\"python3\"")
        .replace(
            "on_change = \"restart\"",
            "on_change = \"restart\"\nrecheck = \"1s\"",
        );
    let cfg = sb.config(&config);
    let tend = sb.tend().config(&cfg).start();
    assert_eq!(wait_up(port, secs(15.0)), "v0");
    sb.wait_ready(true, secs(10.0));
    let load = Load::workers(4, port, 100_000, secs(60.0), secs(0.002));
    project(&sb.path("app"), &[("app.conf", "no greeting here\n")]);
    tend.wait_stderr("the new instance exited before it was ready", secs(15.0));
    let st = sb.wait_state("reloading", secs(5.0));
    assert_eq!(st["watches"][0]["result"], "action_failed");
    std::thread::sleep(secs(0.5));
    let records = load.finish();
    let failed: Vec<_> = records.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(records.iter().all(|(_, r)| r.as_deref() == Ok("v0")));
    assert_eq!(
        common::http::get(port).as_deref(),
        Ok("v0"),
        "the old one serves"
    );
}

#[test]
fn every_start_gets_the_same_socket_at_fd_3_with_the_activation_variables() {
    let sb = Sandbox::new();
    let vol = sb.path("app");
    project(&vol, &[("app.conf", "v0")]);
    let seen = sb.path("seen");
    let script = format!(
        "echo \"$$ $LISTEN_PID $LISTEN_FDS $LISTEN_FDNAMES $(readlink /proc/self/fd/3) $(readlink /proc/self/fd/4)\" >> {}; exec sleep 600",
        seen.display()
    );
    let sock = sb.path("run/admin.sock");
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"sh\", \"-c\", {script:?}]\n\
         [[socket]]\nname = \"http\"\nlisten = \"127.0.0.1:0\"\n\
         [[socket]]\nname = \"admin\"\nlisten = \"unix:{}\"\nmode = \"0600\"\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"restart\"\n",
        sock.display(),
        sb.readiness_toml(),
        vol.display().to_string(),
    ));
    let _tend = sb.tend().config(&cfg).start();
    let lines = |n| {
        wait_for(&format!("{n} starts"), secs(10.0), || {
            let text = std::fs::read_to_string(&seen).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(String::from).collect();
            (lines.len() >= n).then_some(lines)
        })
    };
    let first = lines(1);
    project(&vol, &[("app.conf", "v1")]);
    let both = lines(2);
    for line in &both {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], f[1], "LISTEN_PID is the service's own pid: {line}");
        assert_eq!(f[2], "2");
        assert_eq!(f[3], "http:admin");
        assert!(
            f[4].starts_with("socket:[") && f[5].starts_with("socket:["),
            "{line}"
        );
    }
    let sockets = |l: &str| {
        l.split_whitespace()
            .skip(4)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        sockets(&first[0]),
        sockets(&both[1]),
        "the same sockets at the same fds"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}
