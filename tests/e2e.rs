//! Real services under tend, each configured from its directory in
//! examples/ (paths and ports rewritten into the test's sandbox): nginx
//! reloading with SIGHUP under continuous load, a program that can only be
//! restarted (on a new config, and on a new token from a Secret given as an
//! environment variable), and nginx rotating a TLS certificate from a Secret
//! volume.
//!
//! They need nginx and openssl (`scripts/install-deps` installs them).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::http::{Load, free_port, get, get_with, wait_up};
use common::kubelet::{project, project_mode};
use common::*;
use nix::sys::signal::Signal;

fn example(name: &str, file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
        .join(file);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` with each `(from, to)` replaced; each `from` must occur.
fn rewrite(text: &str, pairs: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (from, to) in pairs {
        assert!(out.contains(from), "{from:?} is not in:\n{text}");
        out = out.replace(from, to);
    }
    out
}

fn require(program: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "{program} is not installed: run scripts/install-deps"
    );
}

fn path(p: PathBuf) -> String {
    p.display().to_string()
}

/// The site config of examples/nginx, answering `body` on `port`.
fn site(port: u16, body: &str) -> String {
    rewrite(
        &example("nginx", "conf.d/app.conf"),
        &[
            ("listen 8080", &format!("listen 127.0.0.1:{port}")),
            ("hello from v1", body),
        ],
    )
}

/// examples/nginx, moved into the sandbox: nginx.conf, the ConfigMap volume
/// at conf.d/, and supervisor.toml.
fn nginx_sandbox(sb: &Sandbox, port: u16) -> PathBuf {
    require("nginx");
    let vol = sb.path("conf.d");
    project(&vol, &[("app.conf", &site(port, "v0"))]);
    sb.write(
        "nginx.conf",
        &rewrite(
            &example("nginx", "nginx.conf"),
            &[
                // First: the paths rewritten after it are under /tmp too.
                ("/tmp/", &path(sb.path(""))),
                ("/etc/nginx/conf.d", &path(vol.clone())),
            ],
        ),
    );
    sb.config(&rewrite(
        &example("nginx", "supervisor.toml"),
        &[
            ("/etc/nginx/nginx.conf", &path(sb.path("nginx.conf"))),
            ("/etc/nginx/conf.d", &path(vol)),
            ("/run/tend/ready", &path(sb.path("ready"))),
            ("/run/tend/status.json", &path(sb.path("status.json"))),
        ],
    ))
}

#[test]
fn nginx_serves_every_update_within_a_second_and_no_request_fails() {
    let sb = Sandbox::new();
    let port = free_port();
    let cfg = nginx_sandbox(&sb, port);
    let mut tend = sb.tend().config(&cfg).start();
    assert_eq!(wait_up(port, secs(10.0)), "v0");
    sb.wait_ready(true, secs(5.0));

    let load = Load::start(port, 200_000, secs(120.0), secs(0.001));
    let mut worst = secs(0.0);
    for i in 1..=20 {
        let body = format!("v{i}");
        let swap = Instant::now();
        project(&sb.path("conf.d"), &[("app.conf", &site(port, &body))]);
        let seen = load.wait_body(&body, swap, secs(5.0));
        worst = worst.max(seen - swap);
    }
    assert!(worst < secs(1.0), "an update took {worst:?} to be served");

    // nginx retires the previous generation of workers a moment after a
    // reload; with updates this close together, wait until only v20 answers.
    wait_for("nginx to answer only v20", secs(5.0), || {
        let recent = load.since(Instant::now() - secs(0.2));
        (recent.len() > 20 && recent.iter().all(|(_, r)| r.as_deref() == Ok("v20"))).then_some(())
    });

    // A broken config: nginx -t rejects it, nginx keeps serving v20.
    let broken = site(port, "v21").replace("listen", "lissen");
    let before_break = Instant::now();
    project(&sb.path("conf.d"), &[("app.conf", &broken)]);
    sb.wait_ready(false, secs(5.0));
    let st = sb.wait_state("invalid_config", secs(5.0));
    let output = st["watches"][0]["check_output"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        output.contains("unknown directive \"lissen\""),
        "nginx's error in the status: {output}"
    );
    std::thread::sleep(secs(0.5));
    let served: Vec<_> = load
        .since(before_break)
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    assert!(served.len() > 20);
    assert!(
        served.iter().all(|r| r.as_deref() == Ok("v20")),
        "the last good config is still served: {:?}",
        served.iter().find(|r| r.as_deref() != Ok("v20"))
    );
    tend.wait_stderr("keeps running on the last good one", secs(5.0));

    // Fixed: served, and ready again.
    let fixed = Instant::now();
    project(&sb.path("conf.d"), &[("app.conf", &site(port, "v22"))]);
    load.wait_body("v22", fixed, secs(5.0));
    sb.wait_ready(true, secs(5.0));

    let records = load.finish();
    let failures: Vec<_> = records
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert!(
        records.len() > 100,
        "the load sent only {} requests",
        records.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} requests failed, first: {}",
        failures.len(),
        records.len(),
        failures[0]
    );
    // nginx itself says it reloaded once per applied update.
    let sighup = "signal 1 (SIGHUP) received";
    tend.wait_stderr_count(sighup, 21, secs(5.0));

    // SIGTERM: nginx gets SIGQUIT (its graceful stop), and exits 0.
    let (code, err) = tend.stop(secs(20.0));
    assert_eq!(code, 0);
    assert!(err.contains("signal 3 (SIGQUIT) received"), "{err}");
    assert!(get(port).is_err(), "nginx is gone");
    assert_eq!(
        err.matches(sighup).count(),
        21,
        "nginx reloads: 20 updates and the fix"
    );
}

#[test]
fn a_program_that_cannot_reload_is_restarted_on_the_new_config() {
    let sb = Sandbox::new();
    let port = free_port();
    let vol = sb.path("app");
    let conf = |greeting: &str| format!("greeting = {greeting}\nport = {port}\n");
    project(&vol, &[("app.conf", &conf("v0"))]);
    let secrets = sb.path("app-secrets");
    project(&secrets, &[("API_TOKEN", "token-1")]);
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/restart/server.py");
    let cfg = sb.config(&rewrite(
        &example("restart", "supervisor.toml"),
        &[
            ("/app/server.py", &path(server)),
            ("/etc/app\"", &format!("{}\"", path(vol.clone()))),
            ("/etc/app-secrets", &path(secrets.clone())),
            ("/run/tend/app", &path(sb.path("published/app"))),
            ("/run/tend/secrets", &path(sb.path("published/secrets"))),
            ("/run/tend/ready", &path(sb.path("ready"))),
            ("/run/tend/status.json", &path(sb.path("status.json"))),
        ],
    ));
    let tend = sb.tend().config(&cfg).start();
    assert_eq!(wait_up(port, secs(10.0)), "v0");
    sb.wait_ready(true, secs(5.0));

    let load = Load::start(port, 100_000, secs(60.0), secs(0.001));
    let mut windows = Vec::new();
    for i in 1..=5 {
        let body = format!("v{i}");
        let swap = Instant::now();
        project(&vol, &[("app.conf", &conf(&body))]);
        load.wait_body(&body, swap, secs(10.0));
        sb.wait_ready(true, secs(5.0));
        // The gap: from the last answer of the old process to the first of
        // the new one. Requests in it are refused, or reset when the old
        // process dies holding them.
        let records = load.since(swap);
        let first_new = records
            .iter()
            .find(|(_, r)| r.as_deref() == Ok(body.as_str()))
            .unwrap()
            .0;
        let old = format!("v{}", i - 1);
        let last_old = records
            .iter()
            .rev()
            .find(|(t, r)| *t < first_new && r.as_deref() == Ok(old.as_str()));
        windows.push((last_old.map_or(swap, |r| r.0), first_new));
    }
    let records = load.finish();
    let in_gap = |t: &Instant| windows.iter().any(|(from, to)| t > from && t < to);
    let stray: Vec<_> = records
        .iter()
        .filter(|(t, r)| r.is_err() && !in_gap(t))
        .collect();
    assert!(
        stray.is_empty(),
        "requests failed outside a restart: {stray:?}"
    );
    let failed: Vec<&String> = records
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    let refused = failed.iter().filter(|e| e.contains("refused")).count();
    let gaps: Vec<_> = windows.iter().map(|(from, to)| *to - *from).collect();
    for gap in &gaps {
        assert!(
            *gap < secs(3.0),
            "a restart left the service unreachable for {gap:?}"
        );
    }
    eprintln!(
        "restart gaps {gaps:?}; {} requests failed in them ({refused} refused, {} reset or cut off), of {}",
        failed.len(),
        failed.len() - refused,
        records.len()
    );
    let restarting = "restarting the service on the new config";
    let err = tend.wait_stderr_count(restarting, 5, secs(5.0));
    assert_eq!(err.matches(restarting).count(), 5);

    // A rotated token reaches the program with one more restart.
    let private = |token: &str| {
        get_with(
            port,
            "/private",
            &[&format!("Authorization: Bearer {token}")],
        )
    };
    assert_eq!(private("token-1").as_deref(), Ok("private"));
    project(&secrets, &[("API_TOKEN", "token-2")]);
    wait_for("the new token to be accepted", secs(10.0), || {
        private("token-2").ok()
    });
    assert!(private("token-1").unwrap_err().starts_with("status 401"));
    assert_eq!(get(port).as_deref(), Ok("v5"));
    let err = tend.wait_stderr_count(restarting, 6, secs(5.0));
    assert_eq!(err.matches(restarting).count(), 6);

    // A bad edit, then the program crashes: it comes back on the last good
    // config, which it reads from the published copy.
    project(&vol, &[("app.conf", &conf(""))]);
    sb.wait_state("invalid_config", secs(10.0));
    let mut tend = tend;
    let program = svc::host_pid_of(&mut tend, "server.py");
    svc::kill_pid(program, Signal::SIGKILL);
    wait_for(
        "the program back on the last good config",
        secs(10.0),
        || (get(port).ok()? == "v5").then_some(()),
    );
    assert_eq!(private("token-2").as_deref(), Ok("private"));
    let status = sb.wait_state("invalid_config", secs(5.0));
    assert_eq!(status["service"]["restarts"], 7, "{status}");
    let (_, err) = tend.stop(secs(10.0));
    assert!(!err.contains("token-"), "a value in tend's log:\n{err}");
}

/// A self-signed certificate and key for `cn`, as PEM text.
fn certificate(sb: &Sandbox, cn: &str) -> (String, String) {
    require("openssl");
    let (crt, key) = (sb.path(&format!("{cn}.crt")), sb.path(&format!("{cn}.key")));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
        ])
        .args(["-subj", &format!("/CN={cn}"), "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        fs::read_to_string(crt).unwrap(),
        fs::read_to_string(key).unwrap(),
    )
}

/// The certificate nginx presents on `port`, as PEM.
fn served_certificate(port: u16) -> Option<String> {
    let out = Command::new("python3")
        .args([
            "-c",
            &format!("import ssl; print(ssl.get_server_certificate(('127.0.0.1', {port})))"),
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn a_rotated_tls_secret_reloads_nginx_once_per_rotation() {
    let sb = Sandbox::new();
    let port = free_port();
    let tls = sb.path("tls");
    let certs: Vec<(String, String)> = (0..4).map(|i| certificate(&sb, &format!("v{i}"))).collect();
    let secret = |i: usize| {
        [
            ("tls.crt", certs[i].0.as_str()),
            ("tls.key", certs[i].1.as_str()),
        ]
    };
    project_mode(&tls, &secret(0), 0o400);
    sb.write(
        "nginx.conf",
        &rewrite(
            &example("secret-rotation", "nginx.conf"),
            &[
                ("/tmp/", &path(sb.path(""))),
                ("listen 8443 ssl", &format!("listen 127.0.0.1:{port} ssl")),
                ("/etc/tls/", &format!("{}/", path(tls.clone()))),
            ],
        ),
    );
    let cfg = sb.config(&rewrite(
        &example("secret-rotation", "supervisor.toml"),
        &[
            ("/etc/nginx/nginx.conf", &path(sb.path("nginx.conf"))),
            ("/etc/tls", &path(tls.clone())),
            ("/run/tend/ready", &path(sb.path("ready"))),
            ("/run/tend/status.json", &path(sb.path("status.json"))),
        ],
    ));
    let same = |pem: &str, i: usize| pem.split_whitespace().eq(certs[i].0.split_whitespace());
    let mut tend = sb.tend().config(&cfg).start();
    wait_for("nginx to serve v0's certificate", secs(10.0), || {
        served_certificate(port).filter(|p| same(p, 0))
    });
    sb.wait_ready(true, secs(5.0));

    for i in 1..4 {
        project_mode(&tls, &secret(i), 0o400);
        wait_for(
            &format!("nginx to serve v{i}'s certificate"),
            secs(5.0),
            || served_certificate(port).filter(|p| same(p, i)),
        );
    }
    // A half-done rotation (v1's key with v3's certificate) is refused.
    project_mode(
        &tls,
        &[("tls.crt", &certs[3].0), ("tls.key", &certs[1].1)],
        0o400,
    );
    let st = sb.wait_state("invalid_config", secs(5.0));
    assert!(
        st["watches"][0]["check_output"]
            .as_str()
            .unwrap()
            .contains("key values mismatch"),
        "{st}"
    );
    assert!(
        served_certificate(port).is_some_and(|p| same(&p, 3)),
        "nginx keeps the last good pair"
    );

    let (_, err) = tend.stop(secs(10.0));
    assert_eq!(
        err.matches("sent SIGHUP").count(),
        3,
        "one reload per rotation"
    );
    assert_eq!(
        err.matches("signal 1 (SIGHUP) received").count(),
        3,
        "nginx reloaded once per rotation"
    );
}
