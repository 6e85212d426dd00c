//! The files tend writes, in directories others may write to, on disks
//! that may be full or read-only, and what `tend probe` makes of them.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt as _, symlink};
use std::path::{Path, PathBuf};

use common::*;
use nix::sys::signal::Signal;

/// A config whose one watch, "nginx", fails `check` from the start.
fn failing_check(sb: &Sandbox, check: &[String]) -> PathBuf {
    let conf = sb.write("app.conf", "v0");
    sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\nname = \"nginx\"\npaths = [{:?}]\ncheck = {}\non_change = \"signal\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        conf.display().to_string(),
        toml_list(check),
    ))
}

#[test]
fn the_probe_shows_the_line_that_names_the_error() {
    let sb = Sandbox::new();
    let nginx_conf = sb.write(
        "nginx.conf",
        "events {}\nhttp {\n  server { lissen 8080; }\n}\n",
    );
    let check: Vec<String> = ["nginx", "-t", "-e"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            sb.path("error.log").display().to_string(),
            "-c".into(),
            nginx_conf.display().to_string(),
        ])
        .collect();
    let cfg = failing_check(&sb, &check);
    let mut tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(10.0));
    let output = st["watches"][0]["check_output"].as_str().unwrap();
    assert!(output.ends_with("test failed\n"), "{output}");
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        line,
        format!(
            "not ready: state invalid_config; watch \"nginx\": invalid: \
             nginx: [emerg] unknown directive \"lissen\" in {}:3\n",
            nginx_conf.display()
        )
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 143);
}

#[test]
fn terminal_controls_in_a_checks_output_are_shown_escaped() {
    let sb = Sandbox::new();
    let script = r"printf 'step 1\n\033]0;owned\007\033[2Jerror: 10%%\rbad\r\nnext\n'; exit 1";
    let cfg = failing_check(&sb, &["sh".into(), "-c".into(), script.into()]);
    let mut tend = sb.tend().config(&cfg).start();
    let st = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(
        st["watches"][0]["check_output"],
        "step 1\n\\x1b]0;owned\\x07\\x1b[2Jerror: 10%\\rbad\nnext\n",
        "line breaks are kept in the status file, nothing else"
    );
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        line,
        "not ready: state invalid_config; watch \"nginx\": invalid: \
         \\x1b]0;owned\\x07\\x1b[2Jerror: 10%\\rbad\n"
    );
    tend.wait_stderr("check failed", secs(10.0));
    let (code, log) = tend.stop(secs(10.0));
    assert_eq!(code, 143);
    assert!(!log.contains(['\x1b', '\x07', '\r']), "{log:?}");
    assert!(log.contains("\\x1b[2Jerror: 10%\\rbad"), "{log}");
}

fn service_config(sb: &Sandbox, readiness: &str) -> PathBuf {
    sb.config(&format!(
        "[service]\ncommand = {}\n\n[readiness]\n{readiness}",
        sb.service_toml(&[])
    ))
}

#[test]
fn symlinks_planted_at_every_predictable_name_are_not_followed() {
    let sb = Sandbox::new();
    let victim = sb.write("victim", "precious\n");
    // The names a writer could be expected to use: the files themselves and
    // temp files named after them and tend's pid (1, as PID 1).
    for name in [
        "ready",
        "status.json",
        ".ready.tmp",
        ".status.json.tmp",
        ".ready.tmp.1",
        ".status.json.tmp.1",
        "ready.tmp",
        "status.json.tmp",
    ] {
        symlink(&victim, sb.path(name)).unwrap();
    }
    let cfg = service_config(
        &sb,
        &format!(
            "file = {:?}\nstatus_file = {:?}\n",
            sb.path("ready").display().to_string(),
            sb.path("status.json").display().to_string()
        ),
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    sb.wait_state("ready", secs(10.0));
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    for name in ["ready", "status.json"] {
        let meta = fs::symlink_metadata(sb.path(name)).unwrap();
        assert!(meta.is_file(), "{name} is tend's own file now");
    }
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[test]
fn files_are_0644_and_new_directories_0755_under_umask_000() {
    let sb = Sandbox::new();
    let cfg = service_config(
        &sb,
        &format!(
            "file = {:?}\nstatus_file = {:?}\n",
            sb.path("run/tend/ready").display().to_string(),
            sb.path("run/tend/status.json").display().to_string()
        ),
    );
    let mut tend = sb
        .tend()
        .config(&cfg)
        .pre_exec(|| {
            // SAFETY: umask() is async-signal-safe and cannot fail.
            unsafe { libc::umask(0) };
            Ok(())
        })
        .start();
    sb.wait_log("service start", 1, secs(10.0));
    wait_for("the ready file", secs(10.0), || {
        sb.path("run/tend/ready").exists().then_some(())
    });
    let mode = |rel: &str| fs::metadata(sb.path(rel)).unwrap().mode() & 0o7777;
    assert_eq!(mode("run"), 0o755);
    assert_eq!(mode("run/tend"), 0o755);
    assert_eq!(mode("run/tend/ready"), 0o644);
    assert_eq!(mode("run/tend/status.json"), 0o644);
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

/// tend as PID 1 in its own mount namespace, where `dir` is a small tmpfs
/// mounted with `options`, filled up with a file named `filler` when `fill`.
/// The test reaches that tmpfs through /proc/PID/root.
fn on_a_tmpfs(sb: &Sandbox, dir: &Path, options: &str, fill: bool, cfg: &Path) -> Tend {
    fs::create_dir_all(dir).unwrap();
    let fill = if fill {
        // cat stops at ENOSPC, as meant.
        " && { cat /dev/zero > \"$0/filler\" 2>/dev/null; true; }"
    } else {
        ""
    };
    let script = format!("mount -t tmpfs -o {options} tmpfs \"$0\"{fill} && exec \"$@\"");
    let dir = dir.display().to_string();
    let cfg = cfg.display().to_string();
    sb.tend()
        .wrapped(
            "unshare",
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
                "--mount-proc",
                "sh",
                "-c",
                &script,
                &dir,
                TEND,
                "--config",
                &cfg,
            ],
        )
        .start()
}

/// `path` as tend sees it, in its mount namespace.
fn seen_by(tend: &mut Tend, path: &Path) -> PathBuf {
    Path::new(&format!("/proc/{}/root", tend.pid())).join(path.strip_prefix("/").unwrap())
}

#[test]
fn files_that_cannot_be_written_on_a_full_disk_appear_once_there_is_room() {
    let sb = Sandbox::new();
    let disk = sb.path("disk");
    let cfg = service_config(
        &sb,
        &format!(
            "file = {:?}\nstatus_file = {:?}\n",
            disk.join("ready").display().to_string(),
            disk.join("status.json").display().to_string()
        ),
    );
    let mut tend = on_a_tmpfs(&sb, &disk, "size=64k", true, &cfg);
    sb.wait_log("service start", 1, secs(10.0));
    tend.wait_stderr("No space left on device", secs(10.0));
    let ready = seen_by(&mut tend, &disk.join("ready"));
    let status = seen_by(&mut tend, &disk.join("status.json"));
    assert!(!ready.exists() && !status.exists());

    // Room again, and nothing else changes: the writes are retried.
    fs::remove_file(seen_by(&mut tend, &disk.join("filler"))).unwrap();
    wait_for("the ready file", secs(20.0), || {
        ready.exists().then_some(())
    });
    let st: serde_json::Value = wait_for("the status file", secs(10.0), || {
        serde_json::from_slice(&fs::read(&status).ok()?).ok()
    });
    assert_eq!(st["state"], "ready", "{st}");
    let log = tend.wait_stderr("written again", secs(5.0));
    assert_eq!(
        log.lines()
            .filter(|l| l.contains(" ERROR ") && l.contains("No space left"))
            .count(),
        1,
        "one error per failure streak:\n{log}"
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn a_ready_file_that_is_not_there_is_never_reported_as_unremovable() {
    let sb = Sandbox::new();
    let disk = sb.path("disk");
    // A read-only disk: unlink() fails with EROFS even for a file that does
    // not exist.
    let cfg = service_config(
        &sb,
        &format!(
            "file = {:?}\nstatus_file = {:?}\n",
            disk.join("ready").display().to_string(),
            sb.path("status.json").display().to_string()
        ),
    );
    let mut tend = on_a_tmpfs(&sb, &disk, "ro,size=64k", false, &cfg);
    sb.wait_log("service start", 1, secs(10.0));
    sb.wait_state("ready", secs(10.0));
    tend.wait_stderr("Read-only file system", secs(10.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    let log = tend.stderr();
    assert!(!log.contains("cannot remove"), "{log}");
    assert_eq!(
        log.lines().filter(|l| l.contains("Read-only")).count(),
        1,
        "one error per failure streak:\n{log}"
    );
}

/// A watch on `path`, "app", optional or not, for a service without a check.
fn watching(sb: &Sandbox, path: &Path, optional: bool) -> PathBuf {
    sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\nname = \"app\"\npaths = [{:?}]\noptional = {optional}\non_change = \"signal\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        path.display().to_string(),
    ))
}

#[test]
fn a_watched_path_that_does_not_exist_keeps_tend_not_ready_until_it_appears() {
    let sb = Sandbox::new();
    let vol = sb.path("conf.d");
    let cfg = watching(&sb, &vol, false);
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    let log = tend.wait_stderr("does not exist", secs(10.0));
    assert!(
        log.contains(&format!(
            " WARN {} does not exist: tend is not ready until it does; mount the volume there \
             (check the volumeMount's mountPath), or set optional = true on the watch if it may \
             be absent watch=\"app\"",
            vol.display()
        )),
        "{log}"
    );
    let st = wait_for("the service to run without the path", secs(10.0), || {
        sb.status().filter(|s| s["service"]["pid"].is_number())
    });
    assert_eq!(st["state"], "starting", "{st}");
    assert_eq!(st["ready"], false, "{st}");
    assert_eq!(
        st["watches"][0]["missing"],
        serde_json::json!([vol.display().to_string()])
    );
    assert!(!sb.is_ready());
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        line,
        format!(
            "not ready: state starting; watch \"app\": {} does not exist (mount the volume \
             there, or set optional = true)\n",
            vol.display()
        )
    );
    let status = std::process::Command::new(TEND)
        .args(["status", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains(&format!(
            "ready       no (watch \"app\": {} does not exist)\n",
            vol.display()
        )) && status.contains(&format!(
            "  missing   {} (not ready until it exists)\n",
            vol.display()
        )),
        "{status}"
    );

    // A volume with no keys: an empty directory.
    fs::create_dir(&vol).unwrap();
    sb.wait_ready(true, secs(5.0));
    tend.wait_stderr(&format!("INFO {} exists now", vol.display()), secs(5.0));
    let st = sb.wait_state("ready", secs(5.0));
    assert!(st["watches"][0].get("missing").is_none(), "{st}");
    let (code, log) = tend.stop(secs(10.0));
    assert_eq!(code, 0, "the service's status");
    assert_eq!(log.matches("does not exist").count(), 1, "{log}");
}

#[test]
fn an_optional_watch_is_ready_without_its_path() {
    let sb = Sandbox::new();
    let vol = sb.path("conf.d");
    let cfg = watching(&sb, &vol, true);
    let mut tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(probe(&cfg), (0, "ready (state ready)\n".into()));
    let (code, log) = tend.stop(secs(10.0));
    assert_eq!(code, 0, "the service's status");
    assert!(!log.contains("WARN"), "{log}");
}
