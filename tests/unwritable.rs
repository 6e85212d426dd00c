//! Readiness files that tend cannot write (a directory its user may not
//! write in, a read-only root without a volume): tend still runs the
//! service, but its log never says "ready" as if all were well: it says what
//! failed and the fix, and `tend probe` gives that reason instead of "cannot
//! read status.json". GET /ready answers for the services, and says it too.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use common::http::{free_port, get_with};
use common::*;
use nix::sys::signal::Signal;

const NOBODY: u32 = 65534;

/// `tend probe` as nobody, in the mount namespace of `pid` when given.
fn probe_as_nobody(cfg: &Path, pid: Option<i32>) -> (i32, String) {
    let mut argv: Vec<String> = Vec::new();
    if let Some(pid) = pid {
        argv.extend(["nsenter".into(), format!("--mount=/proc/{pid}/ns/mnt")]);
    }
    argv.extend(
        [
            "setpriv",
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            TEND,
            "probe",
            "--config",
        ]
        .map(String::from),
    );
    argv.push(cfg.display().to_string());
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The lines of tend's log at `level`.
fn at_level(log: &str, level: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(level))
        .map(String::from)
        .collect()
}

#[test]
fn a_status_directory_its_user_cannot_create_is_logged_with_the_fix_and_probed_as_the_reason() {
    let sb = Sandbox::new();
    // nobody reaches the sandbox, but /run stays root's.
    fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o777)).unwrap();
    let run = sb.path("run");
    fs::create_dir(&run).unwrap();
    fs::set_permissions(&run, fs::Permissions::from_mode(0o755)).unwrap();
    let dir = run.join("tend");
    let port = free_port();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n[readiness]\nfile = {:?}\nstatus_file = {:?}\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\n",
        sb.service_toml(&[]),
        dir.join("ready").display().to_string(),
        dir.join("status.json").display().to_string(),
    ));
    let mut tend = sb.tend().run_as(NOBODY, &cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    let log = tend.wait_stderr("`tend probe` says not ready", secs(10.0));

    // What failed and the fix, before the service started; then no plain
    // "ready", but what it lacks.
    let errors = at_level(&log, "ERROR");
    let error = errors
        .iter()
        .find(|l| l.contains("the readiness files cannot be written"))
        .unwrap_or_else(|| panic!("{log}"));
    let fix = format!(
        "make {} a directory that uid {NOBODY} (tend's user) can write to: in Kubernetes an \
         emptyDir mounted there",
        dir.display()
    );
    assert!(
        error.contains(&format!(
            "cannot create the directory {}: mkdir() failed: Permission denied",
            dir.display()
        )) && error.contains(&fix),
        "{error}"
    );
    assert!(
        log.find(error.as_str()) < log.find("service started"),
        "{log}"
    );
    assert!(
        !at_level(&log, "INFO").iter().any(|l| l.ends_with(" ready")),
        "{log}"
    );
    let warn = at_level(&log, "WARN");
    assert!(
        warn.iter()
            .any(|l| l.contains("ready, but `tend probe` says not ready: ")
                && l.contains("Permission denied")
                && l.contains(&fix)),
        "{log}"
    );

    // The probe, as tend's user, says why, and the fix.
    let (code, line) = probe_as_nobody(&cfg, None);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.starts_with(&format!(
            "not ready: tend cannot write {}: {} does not exist, and uid {NOBODY} cannot \
             create it in {}: Permission denied",
            dir.join("status.json").display(),
            dir.display(),
            run.display()
        )) && line.contains(&fix),
        "{line}"
    );
    // GET /ready answers for the services, and says what the files lack.
    let ready = get_with(port, "/ready", &[]).unwrap();
    assert!(
        ready.starts_with("ready (state ready); the readiness files cannot be written: ")
            && ready.contains(&fix),
        "{ready}"
    );

    // Fixed: the files are written, and the probe follows them.
    fs::set_permissions(&run, fs::Permissions::from_mode(0o777)).unwrap();
    wait_for("the ready file", secs(20.0), || {
        dir.join("ready").exists().then_some(())
    });
    tend.wait_stderr("the readiness files are written again", secs(5.0));
    assert_eq!(
        probe_as_nobody(&cfg, None),
        (0, "ready (state ready)\n".into())
    );
    assert_eq!(
        get_with(port, "/ready", &[]).as_deref(),
        Ok("ready (state ready)")
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn a_read_only_root_without_a_volume_is_logged_with_the_fix_and_probed_as_the_reason() {
    let sb = Sandbox::new();
    fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o777)).unwrap();
    // As readOnlyRootFilesystem without an emptyDir at /run/tend: the
    // directory that holds it is a read-only mount.
    let root = sb.path("root");
    fs::create_dir(&root).unwrap();
    let dir = root.join("run/tend");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n[readiness]\nstatus_file = {:?}\n",
        sb.service_toml(&[]),
        dir.join("status.json").display().to_string(),
    ));
    let script = "mount -t tmpfs -o ro,size=64k tmpfs \"$0\" && exec \"$@\"";
    let (root_s, cfg_s) = (root.display().to_string(), cfg.display().to_string());
    let mut tend = sb
        .tend()
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
                script,
                &root_s,
                TEND,
                "--config",
                &cfg_s,
            ],
        )
        .start();
    sb.wait_log("service start", 1, secs(10.0));
    let log = tend.wait_stderr("`tend probe` says not ready", secs(10.0));
    let fix = format!(
        "{} is on a read-only file system: mount a writable directory there (an emptyDir in \
         Kubernetes, --tmpfs {} with docker or podman run)",
        dir.display(),
        dir.display()
    );
    assert!(
        at_level(&log, "ERROR")
            .iter()
            .any(|l| l.contains("Read-only file system") && l.contains(&fix)),
        "{log}"
    );
    // The probe, in tend's mount namespace, says the same.
    let (code, line) = probe_as_nobody(&cfg, Some(tend.pid()));
    assert_eq!(code, 1, "{line}");
    assert!(
        line.starts_with(&format!(
            "not ready: tend cannot write {}: {} does not exist, and uid {NOBODY} cannot \
             create it in {}: Read-only file system",
            dir.join("status.json").display(),
            dir.display(),
            root.display()
        )) && line.contains(&fix),
        "{line}"
    );
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}
