//! tend in a real container runtime: podman (with runc) runs the image that
//! Dockerfile.example builds, as a user would.
//!
//! - nginx reloads a ConfigMap-like volume bind-mounted from the host and
//!   updated as the kubelet does; an invalid config is rejected (readiness
//!   off, `invalid_config`, nginx's error in the status and in `tend probe`)
//!   and the fix is applied.
//! - `podman stop`: tend turns the SIGTERM into the service's stop signal,
//!   the service stops gracefully, and the container's exit code is the
//!   service's.
//! - `--user 65534 --read-only` with no capabilities, the readiness files on
//!   a tmpfs, as the examples' Kubernetes manifests run it.
//! - examples/fat-container's image, run as its manifest runs it: php-fpm
//!   serves the page through nginx, `tend status` lists both services, each
//!   ConfigMap reloads its own service, and `podman stop` stops nginx, then
//!   php-fpm.
//! - `podman run -it` in a terminal (tmux): Ctrl-C reaches the shell's job
//!   and not the shell, or ends a service that does not handle it, and a
//!   plain init prints nothing into the terminal.
//! - The example image with nothing but `-p`, as its user and as root; and
//!   with a read-only root and no volume for its readiness files, where the
//!   log and `tend probe` say why and the fix.
//! - The examples' Kubernetes manifests under `podman kube play` (see the
//!   section at the end): each pod serves, its readiness probes pass, and a
//!   stop ends it with its service's status.
//!
//! They need root, podman, runc, tmux and the base images that
//! `scripts/test-podman` builds, so they are ignored by a plain `cargo test`
//! (which counts them as ignored) and run by `sudo scripts/test-podman`
//! (`cargo test --test podman -- --ignored`).
//!
//! No registry is reachable from the test machines, so the images are built
//! from what is here. Dockerfile.example is built unmodified with `podman
//! build`: `--build-context` replaces its builder stage with a directory
//! holding the static tend that this machine built with the Dockerfile's own
//! `cargo build` line, and its `FROM nginx:...` with the local base image (a
//! Debian bookworm root with nginx-light, see scripts/test-podman). Every
//! other line of the Dockerfile runs as written. The examples' Dockerfiles
//! are built the same way.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::http::{free_port, get};
use common::kubelet::project;
use common::static_build::{repo, static_tend};
use common::{Sandbox, secs, wait_every, wait_for};

/// Made by scripts/test-podman; stands in for Dockerfile.example's nginx image.
const BASE: &str = "localhost/tend-nginx-base";
/// Dockerfile.example, built on BASE.
const WEB: &str = "localhost/tend-test-web";
/// tend as a plain init, `ENTRYPOINT ["tend", "--"]`, on BASE.
const PLAIN: &str = "localhost/tend-test-plain";
/// Made by scripts/test-podman; stands in for the `packages` stage of
/// examples/fat-container/Dockerfile (Debian with nginx-light and php8.2-fpm).
const FAT_BASE: &str = "localhost/tend-fat-base";
/// examples/fat-container/Dockerfile, built on FAT_BASE.
const FAT: &str = "localhost/tend-test-fat";

/// podman with runc and tests/support/containers.conf (see that file): what
/// podman needs on the test machines, where crun fails on hybrid cgroups and
/// the default ulimits exceed the hard limits.
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", repo("tests/support/containers.conf"))
        .args(["--runtime", "runc"]);
    c
}

fn podman_output(args: &[&str]) -> Output {
    podman()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e} (run scripts/test-podman)"))
}

/// Runs podman and returns its stdout; panics with its stderr when it fails.
fn podman_ok(args: &[&str]) -> String {
    let out = podman_output(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Like `wait_for`, for conditions that cost a process (podman, tmux) to
/// look at: every 100 ms rather than every 10.
fn wait_slow<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_every(Duration::from_millis(100), what, timeout, f)
}

/// Builds WEB and PLAIN, once per run of this file.
fn images() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(build_images);
}

/// The id of `image`, if it exists.
fn image_id(image: &str) -> Option<String> {
    let out = podman_output(&["image", "inspect", "--format", "{{.Id}}", image]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The builder stage of `dockerfile` (`FROM <rust image> AS <name>`) made
/// from the static tend this machine built with that stage's own `cargo
/// build` line: a directory holding it where the stage would have, and the
/// `--build-context NAME=DIR` that stands it in for the stage. Also the
/// binary's path in that directory.
fn builder_context(dockerfile: &str) -> (tempfile::TempDir, String, String) {
    let builder: Vec<&str> = dockerfile
        .lines()
        .find(|l| l.starts_with("FROM rust"))
        .expect("a builder stage FROM rust...")
        .split_whitespace()
        .collect();
    assert!(
        builder.len() == 4 && builder[2].eq_ignore_ascii_case("AS"),
        "the builder stage is named: {builder:?}"
    );
    let stage = builder[3];
    let copy: Vec<&str> = dockerfile
        .lines()
        .find(|l| l.starts_with(&format!("COPY --from={stage} ")))
        .unwrap_or_else(|| panic!("a COPY --from={stage} line"))
        .split_whitespace()
        .collect();
    let built_at = copy[2].trim_start_matches('/').to_string();
    let context = tempfile::Builder::new()
        .prefix("tend-podman-")
        .tempdir()
        .unwrap();
    let dest = context.path().join(&built_at);
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    fs::copy(static_tend(), &dest).unwrap();
    let stage_context = format!("{stage}={}", context.path().display());
    (context, stage_context, built_at)
}

/// `podman build` of the repository's `dockerfile` as `image`, each
/// `--build-context` given, nothing pulled.
fn build(dockerfile: &str, contexts: &[&str], image: &str) {
    let mut args = vec!["build", "--pull=never"];
    for c in contexts {
        args.extend(["--build-context", c]);
    }
    let dockerfile = repo(dockerfile).display().to_string();
    let repo_dir = repo("").display().to_string();
    args.extend(["-f", &dockerfile, "-t", image, &repo_dir]);
    podman_ok(&args);
}

/// Removes the images in `previous` that a build replaced (a new tend, a
/// changed file), so that runs do not pile up untagged images.
fn remove_replaced(previous: &[String], images: &[&str]) {
    let current: Vec<String> = images.iter().copied().filter_map(image_id).collect();
    for old in previous.iter().filter(|id| !current.contains(id)) {
        let _ = podman_output(&["image", "rm", old]);
    }
}

fn build_images() {
    let previous: Vec<String> = [WEB, PLAIN].into_iter().filter_map(image_id).collect();
    assert!(
        podman_output(&["image", "exists", BASE]).status.success(),
        "the base image {BASE} is missing: run scripts/test-podman, which builds it"
    );

    // Dockerfile.example: the builder stage, and the image itself, `FROM
    // nginx:...`, copying the binary out of it.
    let dockerfile = fs::read_to_string(repo("Dockerfile.example")).unwrap();
    let froms: Vec<Vec<&str>> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(froms.len(), 2, "a builder stage and the image: {froms:?}");
    let runtime = &froms[1];
    assert!(
        runtime.len() == 2 && runtime[1].starts_with("nginx:"),
        "{BASE} stands in for an nginx image: {runtime:?}"
    );
    let (context, stage_context, built_at) = builder_context(&dockerfile);
    let base_context = format!("{}=container-image://{BASE}", runtime[1]);
    build("Dockerfile.example", &[&stage_context, &base_context], WEB);

    // A plain init: tend in front of any command, without a config. The
    // base image's STOPSIGNAL is nginx's SIGQUIT, as in the official image:
    // an image for another service sets its own, as Dockerfile.example does.
    let containerfile = context.path().join("Containerfile");
    fs::write(
        &containerfile,
        format!(
            "FROM {BASE}\n\
             COPY {built_at} /usr/local/bin/tend\n\
             ENTRYPOINT [\"/usr/local/bin/tend\", \"--\"]\n\
             CMD [\"sh\"]\n\
             STOPSIGNAL SIGTERM\n"
        ),
    )
    .unwrap();
    podman_ok(&[
        "build",
        "--pull=never",
        "-f",
        &containerfile.display().to_string(),
        "-t",
        PLAIN,
        &context.path().display().to_string(),
    ]);
    remove_replaced(&previous, &[WEB, PLAIN]);
}

/// Builds FAT, once per run of this file: examples/fat-container/Dockerfile
/// as written, but for its builder stage (this machine's static tend) and
/// its `packages` stage (FAT_BASE: the same Debian packages, installed by
/// scripts/test-podman, as no registry is reachable here).
fn fat_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let previous: Vec<String> = image_id(FAT).into_iter().collect();
        assert!(
            podman_output(&["image", "exists", FAT_BASE])
                .status
                .success(),
            "the base image {FAT_BASE} is missing: run scripts/test-podman, which builds it"
        );
        let file = "examples/fat-container/Dockerfile";
        let dockerfile = fs::read_to_string(repo(file)).unwrap();
        let froms: Vec<&str> = dockerfile
            .lines()
            .filter(|l| l.starts_with("FROM "))
            .collect();
        assert_eq!(
            froms[1..],
            ["FROM debian:bookworm-slim AS packages", "FROM packages"],
            "{FAT_BASE} stands in for the packages stage"
        );
        let (_context, stage_context, _) = builder_context(&dockerfile);
        let packages = format!("packages=container-image://{FAT_BASE}");
        build(file, &[&stage_context, &packages], FAT);
        remove_replaced(&previous, &[FAT]);
    });
}

/// A container, removed when dropped (its log is shown if the test failed).
struct Container {
    name: String,
}

impl Container {
    /// A name for a container of this test, which is removed if it exists.
    fn named(name: &str) -> Container {
        let c = Container {
            name: format!("tend-test-{name}-{}", std::process::id()),
        };
        let _ = podman_output(&["rm", "-f", "-t", "0", &c.name]);
        c
    }

    /// `podman run -d --name tend-test-NAME-PID OPTIONS... IMAGE ARGS...`
    fn run(name: &str, options: &[&str], image: &str, args: &[&str]) -> Container {
        let c = Container::named(name);
        let mut argv = vec!["run", "-d", "--name", &c.name];
        argv.extend(options);
        argv.push(image);
        argv.extend(args);
        podman_ok(&argv);
        c
    }

    /// Its output so far, stdout and stderr.
    fn logs(&self) -> String {
        Container::logs_of(&self.name)
    }

    /// The output so far of container `name`, stdout and stderr.
    fn logs_of(name: &str) -> String {
        let out = podman_output(&["logs", name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `podman exec`: (exit code, stdout, stderr).
    fn exec(&self, args: &[&str]) -> (i32, String, String) {
        let mut argv = vec!["exec", &self.name];
        argv.extend(args);
        let out = podman_output(&argv);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `tend probe` in the container: (exit code, its line).
    fn probe(&self) -> (i32, String) {
        let (code, out, _) = self.exec(&["/usr/local/bin/tend", "probe"]);
        (code, out)
    }

    /// `podman stop -t timeout`, which sends the image's STOPSIGNAL and
    /// SIGKILL after `timeout` seconds: how long it took, and the exit code.
    fn stop(&self, timeout: u32) -> (Duration, i32) {
        let started = Instant::now();
        podman_ok(&["stop", "-t", &timeout.to_string(), &self.name]);
        let took = started.elapsed();
        let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]);
        (took, code.trim().parse().unwrap())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- podman logs {} ---\n{}--- end ---",
                self.name,
                self.logs()
            );
        }
        let _ = podman_output(&["rm", "-f", "-t", "0", &self.name]);
    }
}

/// examples/nginx's site, answering `body`: the content of the ConfigMap.
fn site(body: &str) -> String {
    let site = fs::read_to_string(repo("examples/nginx/conf.d/app.conf")).unwrap();
    assert!(site.contains("hello from v1") && site.contains("listen 8080;"));
    site.replace("hello from v1", body)
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `-v HOST:CONTAINER[:OPTIONS]`
fn volume(host: &Path, container: &str, options: &str) -> [String; 2] {
    let mut v = format!("{}:{container}", host.display());
    if !options.is_empty() {
        v = format!("{v}:{options}");
    }
    ["-v".into(), v]
}

/// A directory anyone may write to, as an emptyDir.
fn empty_dir(p: PathBuf) -> PathBuf {
    fs::create_dir_all(&p).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o777)).unwrap();
    p
}

fn wait_served(port: u16, body: &str, timeout: Duration) {
    wait_for(&format!("{body:?} on port {port}"), timeout, || {
        (get(port).as_deref() == Ok(body)).then_some(())
    });
}

/// nginx retires the previous generation of workers a moment after a reload,
/// and until then one of them may still answer a new connection: waits until
/// 20 requests in a row get `body`, so that what follows sees tend's doing
/// and not nginx's lag.
fn wait_only_served(port: u16, body: &str, timeout: Duration) {
    wait_for(&format!("only {body:?} on port {port}"), timeout, || {
        (0..20)
            .all(|_| get(port).as_deref() == Ok(body))
            .then_some(())
    });
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn nginx_reloads_a_mounted_configmap_and_stops_gracefully_on_podman_stop() {
    images();
    let sb = Sandbox::new();
    let port = free_port();
    // The ConfigMap volume, read-only in the container as the kubelet mounts
    // it, and /run/tend from the host so the test can watch the ready file.
    let config = sb.path("config");
    project(&config, &[("app.conf", &site("v0"))]);
    let run = empty_dir(sb.path("run"));
    let publish = format!("127.0.0.1:{port}:8080");
    let mut options = vec!["-p".to_string(), publish];
    options.extend(volume(&config, "/etc/nginx/conf.d", "ro"));
    options.extend(volume(&run, "/run/tend", ""));
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let c = Container::run("nginx", &options, WEB, &[]);

    wait_served(port, "v0", secs(60.0));
    let ready = run.join("ready");
    wait_for("the ready file", secs(10.0), || {
        ready.exists().then_some(())
    });

    for i in 1..=3 {
        let body = format!("v{i}");
        project(&config, &[("app.conf", &site(&body))]);
        wait_served(port, &body, secs(10.0));
    }
    wait_only_served(port, "v3", secs(10.0));

    // Rejected by nginx -t: not ready, nginx keeps serving v3.
    project(
        &config,
        &[("app.conf", &site("v4").replace("listen", "lissen"))],
    );
    wait_for("the ready file to go", secs(10.0), || {
        (!ready.exists()).then_some(())
    });
    let status: serde_json::Value = wait_for("state invalid_config", secs(10.0), || {
        serde_json::from_slice::<serde_json::Value>(&fs::read(run.join("status.json")).ok()?)
            .ok()
            .filter(|s| s["state"] == "invalid_config")
    });
    let output = status["watches"][0]["check_output"].as_str().unwrap();
    assert!(output.contains("unknown directive \"lissen\""), "{output}");
    assert_eq!(get(port).as_deref(), Ok("v3"));
    let (code, line) = c.probe();
    assert_eq!(code, 1, "{line}");
    assert!(
        line.contains("[emerg]") && line.contains("unknown directive \"lissen\""),
        "{line}"
    );

    // Fixed: served, ready again.
    project(&config, &[("app.conf", &site("v5"))]);
    wait_served(port, "v5", secs(10.0));
    wait_for("the ready file", secs(10.0), || {
        ready.exists().then_some(())
    });
    assert_eq!(c.probe().0, 0);

    // podman stop sends the image's STOPSIGNAL, SIGTERM; tend stops nginx
    // with its graceful SIGQUIT (examples/nginx/supervisor.toml), long
    // before podman's SIGKILL.
    let stop_signal = podman_ok(&["inspect", "--format", "{{.Config.StopSignal}}", WEB]);
    assert_eq!(stop_signal.trim(), "SIGTERM");
    let (took, code) = c.stop(30);
    assert_eq!(code, 0, "nginx's exit code");
    assert!(took < secs(10.0), "podman stop took {took:?}");
    let logs = c.logs();
    assert!(logs.contains("SIGTERM received"), "{logs}");
    assert!(logs.contains("signal 3 (SIGQUIT) received"), "{logs}");
    assert!(logs.contains("gracefully shutting down"), "{logs}");
    assert!(logs.contains("service stopped: exit code 0"), "{logs}");
    // One reload per applied update: v1, v2, v3 and the fix.
    assert_eq!(
        logs.matches("signal 1 (SIGHUP) received").count(),
        4,
        "{logs}"
    );
    assert!(get(port).is_err(), "nginx is gone");
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn podman_stop_reaches_the_service_and_the_container_exits_with_its_code() {
    images();
    let sb = Sandbox::new();
    let out = empty_dir(sb.path("out"));
    let options = volume(&out, "/out", "");
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let c = Container::run(
        "stop",
        &options,
        PLAIN,
        &[
            "sh",
            "-c",
            "trap 'echo TERM > /out/term; exit 7' TERM; echo up > /out/up; \
             while :; do sleep 1 & wait $!; done",
        ],
    );
    wait_for("the service", secs(60.0), || {
        out.join("up").exists().then_some(())
    });
    let (took, code) = c.stop(30);
    assert_eq!(code, 7, "the service's exit code");
    assert!(took < secs(10.0), "podman stop took {took:?}");
    assert!(out.join("term").exists(), "the service got SIGTERM");
    // A plain init logs warnings and errors only: none here.
    let logs = c.logs();
    assert_eq!(logs, "", "tend's output");
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn a_locked_down_container_keeps_its_readiness_files_on_a_tmpfs() {
    images();
    let sb = Sandbox::new();
    let port = free_port();
    let config = sb.path("config");
    project(&config, &[("app.conf", &site("v0"))]);
    let publish = format!("127.0.0.1:{port}:8080");
    // As examples/nginx/kubernetes.yaml runs it: not root, a read-only root,
    // no capabilities, no privilege escalation, and writable tmpfs (the
    // manifest's emptyDirs) at /run/tend and /tmp only: not podman's own at
    // /run, which a pod has not either (podman 4.3 copies the image's /run
    // into it without the directories' write bits for group and others).
    let mut options: Vec<String> = [
        "--user",
        "65534",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs",
        "/run/tend",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "-p",
        &publish,
    ]
    .map(String::from)
    .into();
    options.extend(volume(&config, "/etc/nginx/conf.d", "ro"));
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let c = Container::run("locked", &options, WEB, &[]);

    wait_served(port, "v0", secs(60.0));
    wait_slow("tend probe to say ready", secs(10.0), || {
        (c.probe().0 == 0).then_some(())
    });
    let (code, out, err) = c.exec(&["sh", "-c", "id -u; stat -c '%u %a %n' /run/tend/*"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "65534\n65534 644 /run/tend/ready\n65534 644 /run/tend/status.json\n\
         65534 600 /run/tend/status.json.sock\n",
        "the readiness files, and the control socket for tend's user only"
    );
    let (code, mounts, _) = c.exec(&["cat", "/proc/mounts"]);
    assert_eq!(code, 0);
    assert!(
        mounts.lines().any(|l| l.starts_with("tmpfs /run/tend ")),
        "{mounts}"
    );
    let (code, _, err) = c.exec(&["touch", "/etc/tend/written"]);
    assert_ne!(code, 0);
    assert!(err.contains("Read-only file system"), "{err}");

    project(&config, &[("app.conf", &site("v1"))]);
    wait_only_served(port, "v1", secs(10.0));
    project(
        &config,
        &[("app.conf", &site("v2").replace("listen", "lissen"))],
    );
    let line = wait_slow("tend probe to say not ready", secs(10.0), || {
        let (code, line) = c.probe();
        (code == 1).then_some(line)
    });
    assert!(line.contains("state invalid_config"), "{line}");
    assert!(line.contains("unknown directive \"lissen\""), "{line}");
    assert_eq!(get(port).as_deref(), Ok("v1"));
    project(&config, &[("app.conf", &site("v3"))]);
    wait_served(port, "v3", secs(10.0));
    wait_slow("tend probe to say ready", secs(10.0), || {
        (c.probe().0 == 0).then_some(())
    });

    let (took, code) = c.stop(30);
    assert_eq!(code, 0);
    assert!(took < secs(10.0), "podman stop took {took:?}");
}

/// tend's log lines at `level` in `logs` (nginx's own lines have other
/// shapes).
fn tend_lines<'a>(logs: &'a str, level: &str) -> Vec<&'a str> {
    logs.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level))
        .collect()
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_example_image_runs_with_nothing_but_a_published_port_as_its_user_and_as_root() {
    images();
    // The image's own user (USER 101), then root: what `docker run -p` and
    // `docker run --user 0 -p` give it, and nothing else.
    for (name, user, uid) in [("as-is", None, "101"), ("as-root", Some("0"), "0")] {
        let port = free_port();
        let publish = format!("127.0.0.1:{port}:8080");
        let mut options = vec!["-p", publish.as_str()];
        if let Some(user) = user {
            options.extend(["--user", user]);
        }
        let c = Container::run(name, &options, WEB, &[]);
        wait_served(port, "hello from v1", secs(60.0));
        wait_slow("tend probe to say ready", secs(10.0), || {
            let (code, line) = c.probe();
            (code == 0).then_some(line)
        });
        assert_eq!(c.probe(), (0, "ready (state ready)\n".to_string()));
        let (code, out, err) = c.exec(&["sh", "-c", "id -u; stat -c '%u %a' /run/tend"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, format!("{uid}\n0 1777\n"), "{name}");
        let logs = c.logs();
        assert_eq!(
            tend_lines(&logs, "ERROR"),
            Vec::<&str>::new(),
            "{name}: {logs}"
        );
        assert_eq!(
            tend_lines(&logs, "WARN"),
            Vec::<&str>::new(),
            "{name}: {logs}"
        );
        assert!(
            tend_lines(&logs, "INFO")
                .iter()
                .any(|l| l.ends_with(" ready")),
            "{name}: {logs}"
        );
        let (took, code) = c.stop(30);
        assert_eq!(code, 0, "{name}: nginx's exit code");
        assert!(took < secs(10.0), "podman stop took {took:?}");
    }
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn a_read_only_root_without_a_volume_gets_the_reason_and_the_fix_from_log_and_probe() {
    images();
    let port = free_port();
    let publish = format!("127.0.0.1:{port}:8080");
    // readOnlyRootFilesystem with an emptyDir for nginx's /tmp and none for
    // /run/tend: podman's own tmpfs at /run is left out, as a pod has none.
    let c = Container::run(
        "read-only",
        &[
            "--read-only",
            "--read-only-tmpfs=false",
            "--tmpfs",
            "/tmp",
            "-p",
            &publish,
        ],
        WEB,
        &[],
    );
    wait_served(port, "hello from v1", secs(60.0));
    let fix = "/run/tend is on a read-only file system: mount a writable directory there (an \
               emptyDir in Kubernetes, --tmpfs /run/tend with docker or podman run)";
    let line = wait_slow("tend probe to say why", secs(10.0), || {
        let (code, line) = c.probe();
        (code == 1 && line.contains("cannot write")).then_some(line)
    });
    assert_eq!(
        line,
        format!(
            "not ready: tend cannot write /run/tend/status.json: uid 101 cannot write in \
             /run/tend: Read-only file system (os error 30); {fix}\n"
        )
    );
    let logs = c.logs();
    let errors = tend_lines(&logs, "ERROR");
    assert!(
        errors
            .iter()
            .any(|l| l.contains("the readiness files cannot be written")
                && l.contains("Read-only file system")
                && l.contains(fix)),
        "{logs}"
    );
    assert!(
        !tend_lines(&logs, "INFO")
            .iter()
            .any(|l| l.ends_with(" ready")),
        "no plain \"ready\": {logs}"
    );
    assert!(
        tend_lines(&logs, "WARN")
            .iter()
            .any(|l| l.contains("ready, but `tend probe` says not ready") && l.contains(fix)),
        "{logs}"
    );
    let (_, code) = c.stop(30);
    assert_eq!(code, 0, "nginx's exit code");
}

/// examples/fat-container's `file`.
fn fat_file(file: &str) -> String {
    fs::read_to_string(repo("examples/fat-container").join(file)).unwrap()
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_fat_container_serves_php_through_nginx_and_reloads_each_service_alone() {
    fat_image();
    let sb = Sandbox::new();
    let port = free_port();
    // The two ConfigMap volumes, read-only, as the kubelet mounts them.
    let site = sb.path("nginx-conf");
    let pool = sb.path("php-pool");
    project(&site, &[("app.conf", &fat_file("conf.d/app.conf"))]);
    project(&pool, &[("www.conf", &fat_file("pool.d/www.conf"))]);
    let publish = format!("127.0.0.1:{port}:8080");
    // As examples/fat-container/kubernetes.yaml runs it: www-data, a
    // read-only root, no capabilities, and tmpfs at its emptyDirs only (not
    // podman's own at /run, which would hide the image's /run/php).
    let mut options: Vec<String> = [
        "--user",
        "33",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs",
        "/run/tend",
        "--tmpfs",
        "/run/php",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "-p",
        &publish,
    ]
    .map(String::from)
    .into();
    options.extend(volume(&site, "/etc/nginx/conf.d", "ro"));
    options.extend(volume(&pool, "/etc/php/8.2/fpm/pool.d", "ro"));
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    let c = Container::run("fat", &options, FAT, &[]);

    wait_served(port, "hello from php v1 | nginx v1", secs(60.0));
    wait_slow("tend probe to say ready", secs(10.0), || {
        (c.probe().0 == 0).then_some(())
    });
    let (code, status, err) = c.exec(&["/usr/local/bin/tend", "status"]);
    assert_eq!(code, 0, "{err}");
    assert!(status.contains("php: running"), "{status}");
    assert!(status.contains("nginx (main): running"), "{status}");

    // Each ConfigMap reloads its own service.
    let pool_v2 = fat_file("pool.d/www.conf").replace("php v1", "php v2");
    project(&pool, &[("www.conf", &pool_v2)]);
    wait_served(port, "hello from php v2 | nginx v1", secs(10.0));
    let site_v2 = fat_file("conf.d/app.conf").replace("nginx v1", "nginx v2");
    project(&site, &[("app.conf", &site_v2)]);
    wait_only_served(port, "hello from php v2 | nginx v2", secs(10.0));
    wait_slow("tend probe to say ready", secs(10.0), || {
        (c.probe().0 == 0).then_some(())
    });

    // podman stop: nginx stops, then php-fpm, both gracefully.
    let (took, code) = c.stop(70);
    assert_eq!(code, 0, "nginx's exit code");
    assert!(took < secs(10.0), "podman stop took {took:?}");
    let logs = c.logs();
    assert_eq!(
        logs.matches("signal 1 (SIGHUP) received").count(),
        1,
        "{logs}"
    );
    assert_eq!(
        logs.matches("NOTICE: Reloading in progress").count(),
        1,
        "{logs}"
    );
    let quit = logs
        .find("signal 3 (SIGQUIT) received")
        .expect("nginx's stop");
    let finishing = logs.find("NOTICE: Finishing ...").expect("php-fpm's stop");
    assert!(quit < finishing, "{logs}");
    assert!(logs.contains("NOTICE: exiting, bye-bye!"), "{logs}");
}

/// A terminal: a detached tmux session on a server of its own, running
/// `command` and then writing its exit status to a file. Every byte the
/// command writes to the terminal is recorded: tmux's pipe-pane is in place
/// before the command starts (it waits on `tmux wait-for`).
struct Terminal {
    /// The tmux server's socket, in the sandbox, so that it goes with it.
    socket: PathBuf,
    output: PathBuf,
    status: PathBuf,
}

/// `s` quoted for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Terminal {
    fn start(sb: &Sandbox, name: &str, command: &[&str]) -> Terminal {
        let t = Terminal {
            socket: sb.path(&format!("{name}.tmux")),
            output: sb.path(&format!("{name}.terminal")),
            status: sb.path(&format!("{name}.status")),
        };
        let argv: Vec<String> = command.iter().map(|a| quote(a)).collect();
        let line = format!(
            "tmux -S {} wait-for go && {}; echo $? > {}",
            quote(&path(&t.socket)),
            argv.join(" "),
            quote(&path(&t.status))
        );
        t.tmux(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "100",
            "-y",
            "30",
            &line,
        ]);
        let record = format!("cat >> {}", quote(&path(&t.output)));
        t.tmux(&["pipe-pane", "-t", "t", &record, ";", "wait-for", "-S", "go"]);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env("CONTAINERS_CONF", repo("tests/support/containers.conf"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Everything written to the terminal so far, with the line
    /// discipline's CR LF as LF.
    fn output(&self) -> String {
        fs::read_to_string(&self.output)
            .unwrap_or_default()
            .replace("\r\n", "\n")
    }

    fn wait_output(&self, what: &str, timeout: Duration, f: impl Fn(&str) -> bool) {
        wait_for(what, timeout, || f(&self.output()).then_some(()));
    }

    /// Types `text` and Enter.
    fn type_line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", text]);
        self.tmux(&["send-keys", "-t", "t", "Enter"]);
    }

    fn ctrl_c(&self) {
        self.tmux(&["send-keys", "-t", "t", "C-c"]);
    }

    /// The command's exit status, once it has exited.
    fn wait_status(&self, timeout: Duration) -> i32 {
        wait_for("the terminal's command to exit", timeout, || {
            fs::read_to_string(&self.status).ok()?.trim().parse().ok()
        })
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- the terminal ---\n{:?}\n--- end ---", self.output());
        }
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// Whether a process runs (on this host, in any container) with exactly `argv`.
fn running(argv: &[&str]) -> bool {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    fs::read_dir("/proc").is_ok_and(|d| {
        d.flatten()
            .any(|e| fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted))
    })
}

/// `podman run --rm -it --name NAME IMAGE ARGS...`, for a terminal.
fn run_it(c: &Container, image: &str, args: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> = ["podman", "--runtime", "runc", "run", "--rm", "-it"]
        .map(String::from)
        .into();
    argv.extend(["--name".to_string(), c.name.clone(), image.to_string()]);
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn podman_run_it_gives_the_shell_the_terminal_and_ctrl_c_stops_its_job() {
    images();
    let sb = Sandbox::new();
    let c = Container::named("shell");
    let argv = run_it(&c, PLAIN, &[]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let term = Terminal::start(&sb, "shell", &argv);
    term.wait_output("the shell's prompt", secs(60.0), |s| s == "# ");

    // Ctrl-C interrupts the shell's job, which is the terminal's foreground
    // process group, and not the shell: it prompts again.
    let sleep = ["sleep", "7654321"];
    term.type_line(&sleep.join(" "));
    wait_for("the job", secs(10.0), || running(&sleep).then_some(()));
    term.ctrl_c();
    wait_for("the job to end", secs(10.0), || {
        (!running(&sleep)).then_some(())
    });
    term.type_line("echo alive-$((6*7))");
    term.wait_output("the shell's answer", secs(10.0), |s| {
        s.contains("\nalive-42\n")
    });
    term.type_line("exit 3");
    assert_eq!(term.wait_status(secs(20.0)), 3, "the shell's exit code");

    // Only the shell and the terminal's echo wrote to it: tend, a plain
    // init, said nothing.
    let expected = "# sleep 7654321\n^C\n# echo alive-$((6*7))\nalive-42\n# exit 3\n";
    term.wait_output(&format!("{expected:?} on the terminal"), secs(5.0), |s| {
        s == expected
    });
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn podman_run_it_ctrl_c_ends_a_service_that_does_not_handle_it() {
    images();
    let sb = Sandbox::new();
    let sleep = ["sleep", "7654322"];
    let c = Container::named("ctrl-c");
    let argv = run_it(&c, PLAIN, &sleep);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let term = Terminal::start(&sb, "ctrl-c", &argv);
    wait_for("the service", secs(60.0), || running(&sleep).then_some(()));
    term.ctrl_c();
    assert_eq!(
        term.wait_status(secs(20.0)),
        130,
        "128 + SIGINT, from the service"
    );
    term.wait_output("only the echo of Ctrl-C", secs(5.0), |s| s == "^C");
}

// ---------------------------------------------------------------- kube play
//
// The examples' Kubernetes manifests, run by `podman kube play`: podman 4.3
// runs a Deployment's pod with its init containers, emptyDir and ConfigMap
// volumes from the same YAML. Its ConfigMap volumes are plain files that
// never swap `..data`, so this tests start-up, the readiness probes as the
// manifests write them, and a stop; updates are the atomic writer's (see the
// tests above and tests/e2e.rs). podman 4.3 does not run readiness probes
// itself (it makes a liveness probe a health check and leaves readiness
// alone), so the tests run each one's exec command in its container.

/// The examples whose manifest the tests play.
const PLAYED: [&str; 5] = [
    "any-image",
    "fat-container",
    "in-place",
    "nginx",
    "zero-downtime",
];

/// The examples whose manifest cannot run here, and why.
const NOT_PLAYED: [(&str, &str); 2] = [
    (
        "restart",
        "a Secret volume, on which podman 4.3's kube play panics (VolumeFromSecret)",
    ),
    (
        "secret-rotation",
        "a Secret volume, on which podman 4.3's kube play panics (VolumeFromSecret)",
    ),
];

/// Pods of two manifests must not run at once: podman 4.3 names an
/// emptyDir's volume after the volume (`tend-run`, `tmp`), so two pods would
/// share one.
static KUBE: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn every_example_manifest_is_played_under_podman_or_says_why_not() {
    let mut examples: Vec<String> = fs::read_dir(repo("examples"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("kubernetes.yaml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    examples.sort();
    let mut listed: Vec<String> = PLAYED
        .iter()
        .copied()
        .chain(NOT_PLAYED.iter().map(|(e, _)| *e))
        .map(String::from)
        .collect();
    listed.sort();
    assert_eq!(examples, listed);
    for example in PLAYED {
        let manifest =
            fs::read_to_string(repo(&format!("examples/{example}/kubernetes.yaml"))).unwrap();
        assert!(!manifest.contains("secret:"), "{example}");
    }
    for (example, _) in NOT_PLAYED {
        let manifest =
            fs::read_to_string(repo(&format!("examples/{example}/kubernetes.yaml"))).unwrap();
        assert!(manifest.contains("secret:"), "{example} could be played");
    }
}

/// The images the tests build for the manifests, as the manifests name them.
const WEB_NGINX: &str = "registry.example.com/web-nginx:1";
const SHOP: &str = "registry.example.com/shop:1";
const TEND_ALONE: &str = "registry.example.com/tend:1";
/// An image built without tend; tests/support/nginx-unprivileged stands in
/// for it.
const UPSTREAM_NGINX: &str = "docker.io/nginxinc/nginx-unprivileged:1.27";
const APP_IN_PLACE: &str = "registry.example.com/app-in-place:1";
const APP_ZERO_DOWNTIME: &str = "registry.example.com/app-zero-downtime:1";
/// Made by scripts/test-podman; stands in for python:3.12-slim-bookworm.
const PYTHON_BASE: &str = "localhost/tend-python-base";

/// Builds `file`, an example's Dockerfile `FROM python:3.12-slim-bookworm`,
/// on PYTHON_BASE as `tag`.
fn build_python_example(file: &str, tag: &str) {
    assert!(
        podman_output(&["image", "exists", PYTHON_BASE])
            .status
            .success(),
        "the base image {PYTHON_BASE} is missing: run scripts/test-podman, which builds it"
    );
    let dockerfile = fs::read_to_string(repo(file)).unwrap();
    assert!(
        dockerfile.contains("\nFROM python:3.12-slim-bookworm\n"),
        "{file}"
    );
    let (_context, stage_context, _) = builder_context(&dockerfile);
    let base = format!("python:3.12-slim-bookworm=container-image://{PYTHON_BASE}");
    build(file, &[&stage_context, &base], tag);
}

/// Builds the images `example`'s manifest names, tagged as it names them:
/// each from the example's own Dockerfile, as the other tests build theirs.
fn manifest_images(example: &str) -> Vec<&'static str> {
    let tags: Vec<&str> = match example {
        "nginx" => vec![WEB_NGINX],
        "fat-container" => vec![SHOP],
        "any-image" => vec![TEND_ALONE, UPSTREAM_NGINX],
        "in-place" => vec![APP_IN_PLACE],
        "zero-downtime" => vec![APP_ZERO_DOWNTIME],
        _ => panic!("{example} is not played"),
    };
    let previous: Vec<String> = tags.iter().copied().filter_map(image_id).collect();
    assert!(
        podman_output(&["image", "exists", BASE]).status.success(),
        "the base image {BASE} is missing: run scripts/test-podman, which builds it"
    );
    match example {
        "nginx" => {
            let file = "examples/nginx/Dockerfile";
            let dockerfile = fs::read_to_string(repo(file)).unwrap();
            assert!(dockerfile.contains("\nFROM nginx:1.27-bookworm\n"));
            let (_context, stage_context, _) = builder_context(&dockerfile);
            let base = format!("nginx:1.27-bookworm=container-image://{BASE}");
            build(file, &[&stage_context, &base], WEB_NGINX);
        }
        "fat-container" => {
            fat_image();
            podman_ok(&["tag", FAT, SHOP]);
        }
        "in-place" => build_python_example("examples/in-place/Dockerfile", APP_IN_PLACE),
        "zero-downtime" => {
            build_python_example("examples/zero-downtime/Dockerfile", APP_ZERO_DOWNTIME)
        }
        _ => {
            let file = "examples/any-image/Dockerfile";
            let dockerfile = fs::read_to_string(repo(file)).unwrap();
            let (_context, stage_context, _) = builder_context(&dockerfile);
            build(file, &[&stage_context], TEND_ALONE);
            let upstream = repo("tests/support/nginx-unprivileged");
            podman_ok(&[
                "build",
                "--pull=never",
                "-f",
                &path(&upstream.join("Containerfile")),
                "-t",
                UPSTREAM_NGINX,
                &path(&upstream),
            ]);
        }
    }
    remove_replaced(&previous, &tags);
    tags
}

/// A manifest's documents, split.
fn documents(manifest: &str) -> Vec<&str> {
    manifest.split("\n---\n").collect()
}

/// The `metadata.name` of the document of `kind`s.
fn names_of(manifest: &str, kind: &str) -> Vec<String> {
    documents(manifest)
        .into_iter()
        .filter(|d| d.lines().any(|l| l == format!("kind: {kind}")))
        .filter_map(|d| {
            let lines: Vec<&str> = d.lines().collect();
            lines
                .windows(2)
                .find_map(|w| (w[0] == "metadata:").then(|| w[1].strip_prefix("  name: "))?)
                .map(String::from)
        })
        .collect()
}

/// `(container, argv)` of each readinessProbe's exec command.
fn readiness_probes(manifest: &str) -> Vec<(String, Vec<String>)> {
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    let mut container = None;
    let mut in_probe = false;
    let mut probes = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let next = lines[i + 1..].iter().find(|l| !l.starts_with('#'));
        if let Some(name) = line.strip_prefix("- name: ")
            && next.is_some_and(|l| l.starts_with("image: "))
        {
            container = Some(name.to_string());
        } else if *line == "readinessProbe:" {
            in_probe = true;
        } else if in_probe && let Some(argv) = line.strip_prefix("command: ") {
            let argv: Vec<String> = serde_json::from_str(argv).unwrap();
            probes.push((container.clone().expect("the probe's container"), argv));
            in_probe = false;
        }
    }
    probes
}

/// The names of the emptyDir volumes.
fn empty_dirs(manifest: &str) -> Vec<String> {
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[1].starts_with("emptyDir:"))
        .filter_map(|w| w[0].strip_prefix("- name: ").map(String::from))
        .collect()
}

/// examples/EXAMPLE/kubernetes.yaml as podman 4.3 can run it on this one
/// host, changed only where podman 4.3 and a cluster differ:
/// - `replicas: 1`: podman runs every replica as a pod on this host;
/// - the container port published on 127.0.0.1:`port` (`hostIP`,
///   `hostPort`): podman 4.3 publishes a containerPort on the host's port of
///   the same number;
/// - `restartPolicy: OnFailure`: podman 4.3 gives init containers the pod's
///   restart policy, and with Always runs one that is done again and again
///   (containers/podman#16343, fixed in 4.6).
///
/// The images are the ones the manifest names (built and tagged so here).
fn podman_manifest(example: &str, port: u16) -> String {
    let manifest =
        fs::read_to_string(repo(&format!("examples/{example}/kubernetes.yaml"))).unwrap();
    let mut out = String::new();
    let (mut ports, mut specs, mut replicas) = (0, 0, 0);
    for line in manifest.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        if line.trim_start().starts_with("replicas: ") {
            out.push_str(&format!("{indent}replicas: 1\n"));
            replicas += 1;
            continue;
        }
        out.push_str(line);
        out.push('\n');
        if let Some(p) = line.trim_start().strip_prefix("- containerPort: ") {
            p.parse::<u16>().expect("a port number");
            out.push_str(&format!(
                "{indent}  hostIP: 127.0.0.1\n{indent}  hostPort: {port}\n"
            ));
            ports += 1;
        }
        // The pod template's spec.
        if line == "    spec:" {
            out.push_str("      restartPolicy: OnFailure\n");
            specs += 1;
        }
    }
    assert_eq!(
        (ports, specs, replicas),
        (1, 1, 1),
        "{example}: one of each"
    );
    assert!(!manifest.contains("restartPolicy"), "{example}");
    out
}

/// A manifest played by `podman kube play`: `kube down` when dropped, and
/// the ConfigMap volumes it leaves removed.
struct Kube {
    file: PathBuf,
    /// The pod of the Deployment's one replica.
    pod: String,
    volumes: Vec<String>,
    probes: Vec<(String, Vec<String>)>,
}

impl Kube {
    fn play(sb: &Sandbox, example: &str, port: u16) -> Kube {
        let text = podman_manifest(example, port);
        let file = sb.path(&format!("{example}.yaml"));
        fs::write(&file, &text).unwrap();
        let deployments = names_of(&text, "Deployment");
        assert_eq!(deployments.len(), 1, "{example}");
        let pod = format!("{}-pod-0", deployments[0]);
        let mut volumes = names_of(&text, "ConfigMap");
        volumes.extend(empty_dirs(&text));
        let kube = Kube {
            file,
            probes: readiness_probes(&text)
                .into_iter()
                .map(|(c, argv)| (format!("{pod}-{c}"), argv))
                .collect(),
            pod,
            volumes,
        };
        // Left by an earlier run: a ConfigMap volume that exists is used as
        // it is.
        kube.remove_volumes();
        podman_ok(&["kube", "play", &path(&kube.file)]);
        kube
    }

    fn remove_volumes(&self) {
        for v in &self.volumes {
            let _ = podman_output(&["volume", "rm", "-f", v]);
        }
    }

    /// Runs each readiness probe's command in its container until it
    /// passes, and returns what each printed.
    fn wait_probes_pass(&self, timeout: Duration) -> Vec<String> {
        assert!(!self.probes.is_empty());
        self.probes
            .iter()
            .map(|(container, argv)| {
                let mut exec = vec!["exec", container.as_str()];
                exec.extend(argv.iter().map(String::as_str));
                wait_slow(&format!("{container}'s readiness probe"), timeout, || {
                    let out = podman_output(&exec);
                    out.status
                        .success()
                        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
                })
            })
            .collect()
    }

    /// `podman pod stop`, which sends each container its stop signal, then
    /// SIGKILL after `timeout` seconds, as the kubelet does (podman 4.3's
    /// `kube down` sends SIGKILL at once: containers/podman#22397, fixed in
    /// 5.1): how long it took, and each probed container's exit code and log.
    fn stop(&self, timeout: u32) -> (Duration, Vec<(i32, String)>) {
        let started = Instant::now();
        podman_ok(&["pod", "stop", "-t", &timeout.to_string(), &self.pod]);
        let took = started.elapsed();
        let exits = self
            .probes
            .iter()
            .map(|(container, _)| {
                let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", container]);
                (code.trim().parse().unwrap(), Container::logs_of(container))
            })
            .collect();
        (took, exits)
    }
}

impl Drop for Kube {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (container, _) in &self.probes {
                eprintln!(
                    "--- podman logs {container} ---\n{}--- end ---",
                    Container::logs_of(container)
                );
            }
        }
        let down = podman_output(&["kube", "down", &path(&self.file)]);
        self.remove_volumes();
        if !std::thread::panicking() {
            assert!(
                down.status.success(),
                "podman kube down: {}",
                String::from_utf8_lossy(&down.stderr)
            );
            let pods = podman_ok(&[
                "pod",
                "ps",
                "-q",
                "--filter",
                &format!("name=^{}$", self.pod),
            ]);
            assert_eq!(pods, "", "the pod is gone");
        }
    }
}

/// Plays `example`'s manifest: the pod serves `body`, its readiness probes
/// pass, and a stop ends each container with its service's status, 0.
fn play(example: &str, body: &str) -> Vec<(i32, String)> {
    let built = manifest_images(example);
    let manifest =
        fs::read_to_string(repo(&format!("examples/{example}/kubernetes.yaml"))).unwrap();
    let mut named: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .map(|i| i.split_whitespace().next().unwrap())
        .collect();
    named.sort();
    let mut built = built.clone();
    built.sort();
    assert_eq!(named, built, "{example}: the images its manifest names");

    let sb = Sandbox::new();
    let port = free_port();
    let _one_at_a_time = KUBE.lock().unwrap_or_else(|e| e.into_inner());
    let kube = Kube::play(&sb, example, port);
    wait_served(port, body, secs(60.0));
    for line in kube.wait_probes_pass(secs(10.0)) {
        assert!(line.starts_with("ready (state ready)"), "{line}");
    }
    let (took, exits) = kube.stop(60);
    assert!(took < secs(10.0), "podman pod stop took {took:?}");
    for (code, logs) in &exits {
        assert_eq!(*code, 0, "{logs}");
        assert!(logs.contains(": exit code 0"), "{logs}");
        assert!(tend_lines(logs, "ERROR").is_empty(), "{logs}");
    }
    assert!(get(port).is_err(), "nothing serves any more");
    exits
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_nginx_manifest_runs_under_podman_kube_play() {
    play("nginx", "hello from v1");
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_fat_container_manifest_runs_under_podman_kube_play() {
    let exits = play("fat-container", "hello from php v1 | nginx v1");
    let logs = &exits[0].1;
    assert!(
        logs.contains("NOTICE: exiting, bye-bye!"),
        "php-fpm stopped: {logs}"
    );
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_any_image_manifest_installs_tend_into_an_image_built_without_it() {
    let exits = play("any-image", "hello from v1");
    let logs = &exits[0].1;
    // The image's own entrypoint ran under tend, and its STOPSIGNAL (SIGQUIT)
    // reached nginx through tend.
    assert!(
        logs.contains("/docker-entrypoint.sh: ready for start up"),
        "{logs}"
    );
    assert!(logs.contains("signal 3 (SIGQUIT) received"), "{logs}");
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_in_place_manifest_runs_under_podman_kube_play() {
    play("in-place", "hello from v1");
}

#[test]
#[ignore = "runs in podman: sudo scripts/test-podman"]
fn the_zero_downtime_manifest_runs_under_podman_kube_play() {
    play("zero-downtime", "hello from v1");
}
