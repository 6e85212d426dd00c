//! What a user copies: every example is a valid config that keeps the
//! promises its Kubernetes manifest makes, and the static build command in
//! Dockerfile.example produces a binary that runs in an empty root.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use nix::sys::signal::Signal;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn examples() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(repo("examples"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("supervisor.toml").exists())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_example_config_is_valid() {
    let sb = Sandbox::new();
    let dirs = examples();
    assert!(dirs.len() >= 3, "{dirs:?}");
    for dir in dirs {
        let (code, out, err) = sb
            .tend()
            .not_pid1()
            .args(&[
                "check-config",
                "--config",
                &dir.join("supervisor.toml").display().to_string(),
            ])
            .run(secs(10.0));
        assert_eq!(code, 0, "{}: {err}", dir.display());
        assert!(out.contains("[[watch]]"), "{}", dir.display());
    }
}

/// The first number after `key` in `text`.
fn number_after(text: &str, key: &str) -> u64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        + key.len();
    text[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn every_manifest_probes_with_tend_mounts_whole_volumes_and_outlasts_stop_timeout() {
    for dir in examples() {
        let manifest = fs::read_to_string(dir.join("kubernetes.yaml")).unwrap();
        let toml = fs::read_to_string(dir.join("supervisor.toml")).unwrap();
        let name = dir.display();
        assert!(manifest.contains("readinessProbe:"), "{name}");
        assert!(
            manifest.contains("[\"/usr/local/bin/tend\", \"probe\""),
            "{name}: the probe runs tend probe"
        );
        let code: Vec<&str> = manifest
            .lines()
            .map(|l| l.split('#').next().unwrap())
            .collect();
        assert!(
            !code.iter().any(|l| l.contains("subPath")),
            "{name}: a subPath mount never sees updates"
        );
        let grace = number_after(&manifest, "terminationGracePeriodSeconds:");
        let stop = number_after(&toml, "stop_timeout = \"");
        assert!(
            grace > stop,
            "{name}: terminationGracePeriodSeconds {grace} must exceed stop_timeout {stop}s"
        );
        // Every watched path and env_from path is a volume the manifest mounts.
        let config = tend_config(&dir.join("supervisor.toml"));
        let lists = config
            .lines()
            .filter_map(|l| l.strip_prefix("paths = ").or(l.strip_prefix("env_from = ")));
        for path in lists {
            for p in path.trim_matches(|c| c == '[' || c == ']').split(", ") {
                let p = p.trim_matches('"');
                assert!(
                    manifest.contains(&format!("mountPath: {p}")),
                    "{name}: {p} is not mounted"
                );
            }
        }
    }
}

fn tend_config(path: &Path) -> String {
    let out = Command::new(TEND)
        .args(["check-config", "--config"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// The `RUN RUSTFLAGS=... cargo build ...` line of Dockerfile.example.
fn dockerfile_build_command() -> String {
    let dockerfile = fs::read_to_string(repo("Dockerfile.example")).unwrap();
    let line = dockerfile
        .lines()
        .find(|l| l.starts_with("RUN ") && l.contains("cargo build"))
        .expect("a RUN line with cargo build");
    let cmd = line.trim_start_matches("RUN ").to_string();
    assert!(
        cmd.contains("+crt-static") && cmd.contains("--target x86_64-unknown-linux-gnu"),
        "{cmd}"
    );
    cmd
}

#[test]
fn the_dockerfile_builds_a_static_binary_that_runs_in_an_empty_root() {
    let sb = Sandbox::new();
    // The Dockerfile's own command, into a target dir of its own.
    let target = repo("target/static");
    let out = Command::new("sh")
        .args(["-c", &dockerfile_build_command()])
        .current_dir(repo(""))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let binary = target.join("x86_64-unknown-linux-gnu/release/tend");
    let file = Command::new("file").arg(&binary).output().unwrap();
    let file = String::from_utf8_lossy(&file.stdout);
    assert!(
        file.contains("statically linked") || file.contains("static-pie linked"),
        "{file}"
    );
    let size = fs::metadata(&binary).unwrap().len();
    assert!(size < 3 * 1024 * 1024, "the static binary is {size} bytes");

    // An empty root: the binary, a static busybox, and a config.
    let busybox = Command::new("file").arg("/bin/busybox").output().unwrap();
    assert!(
        String::from_utf8_lossy(&busybox.stdout).contains("statically linked"),
        "a static busybox is needed at /bin/busybox: run scripts/install-deps"
    );
    let root = sb.path("root");
    fs::create_dir_all(root.join("conf")).unwrap();
    fs::copy(&binary, root.join("tend")).unwrap();
    fs::copy("/bin/busybox", root.join("busybox")).unwrap();
    fs::write(root.join("conf/app.conf"), "ok v1").unwrap();
    fs::write(
        root.join("supervisor.toml"),
        "[service]\ncommand = [\"/busybox\", \"sh\", \"-c\", \
         \"trap 'echo HUP >> /hups' HUP; echo up > /started; while :; do /busybox sleep 0.05; done\"]\n\
         [readiness]\nfile = \"/run/tend/ready\"\nstatus_file = \"/run/tend/status.json\"\n\
         [[watch]]\npaths = [\"/conf/app.conf\"]\ncheck = [\"/busybox\", \"grep\", \"-q\", \"^ok\", \"/conf/app.conf\"]\n\
         on_change = \"signal\"\n",
    )
    .unwrap();
    let in_root = |args: &[&str]| {
        let out = Command::new("chroot")
            .arg(&root)
            .arg("/tend")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(
        in_root(&["check-config", "--config", "/supervisor.toml"]).0,
        0
    );

    let root_s = root.display().to_string();
    let mut tend = sb
        .tend()
        .wrapped(
            "unshare",
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "chroot",
                &root_s,
                "/tend",
                "--config",
                "/supervisor.toml",
            ],
        )
        .start();
    wait_for("the service in the empty root", secs(10.0), || {
        root.join("started").exists().then_some(())
    });
    wait_for("ready", secs(5.0), || {
        root.join("run/tend/ready").exists().then_some(())
    });
    assert_eq!(in_root(&["probe", "--config", "/supervisor.toml"]).0, 0);
    fs::write(root.join("conf/app.conf"), "ok v2").unwrap();
    wait_for("the SIGHUP", secs(5.0), || {
        root.join("hups").exists().then_some(())
    });
    fs::write(root.join("conf/app.conf"), "broken").unwrap();
    wait_for("not ready", secs(5.0), || {
        (!root.join("run/tend/ready").exists()).then_some(())
    });
    assert_eq!(in_root(&["probe", "--config", "/supervisor.toml"]).0, 1);
    tend.signal(Signal::SIGTERM);
    assert_eq!(
        tend.wait(secs(10.0)),
        128 + 15,
        "sh has no SIGTERM trap: killed by it"
    );
}
