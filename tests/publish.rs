//! `publish`: the service reads a copy of the watched content that passed
//! its check, so neither a crash nor a container restart during an invalid
//! config puts it on content that failed.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::gate::Gate;
use common::kubelet::{project, project_mode};
use common::strace::Strace;
use common::*;
use nix::sys::signal::Signal;

/// Every entry of a directory, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut e: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    e.sort();
    e
}

/// The generation directories in a publish directory.
fn generations(dir: &Path) -> Vec<String> {
    let mut g: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..") && n != "..data")
        .collect();
    g.sort();
    g
}

/// A config that watches the volume `vol`, publishes it to `pub`, checks
/// the candidate's app.conf for "good", and runs the service on the
/// published copy.
fn config(sb: &Sandbox, service: &str, on_change: &str) -> PathBuf {
    sb.config(&format!(
        "[service]\ncommand = {}\n{service}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\n\
         check = {}\n{on_change}\n",
        sb.service_toml(&["--config", &sb.path("pub/app.conf").display().to_string()]),
        sb.readiness_toml(),
        sb.path("vol").display().to_string(),
        sb.path("pub").display().to_string(),
        sh("grep good \"$TEND_CANDIDATE/app.conf\""),
    ))
}

#[test]
fn only_a_checked_copy_is_published_and_the_service_reads_it() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project_mode(&vol, &[("app.conf", "good 1")], 0o400);
    // A Secret's owner, and the group of a pod's fsGroup.
    std::os::unix::fs::chown(vol.join("app.conf"), Some(1234), Some(5678)).unwrap();
    let cfg = config(&sb, "", "on_change = \"signal\"");
    let _tend = sb.tend().config(&cfg).start_ready();
    assert_eq!(
        sb.wait_log("service start", 1, secs(5.0))[0]
            .split(" config=")
            .nth(1),
        Some("good 1")
    );
    let published = sb.path("pub/app.conf");
    let meta = fs::metadata(&published).unwrap();
    let mode = meta.permissions().mode() & 0o777;
    assert_eq!(mode, 0o400, "a Secret's mode is kept: {mode:o}");
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678), "and its owner");
    assert_eq!(
        fs::read_link(&published).unwrap(),
        Path::new("..data/app.conf")
    );

    project_mode(&vol, &[("app.conf", "good 2")], 0o400);
    sb.wait_log("service sig SIGHUP", 1, secs(10.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["good 2"]);

    project_mode(&vol, &[("app.conf", "bad 3")], 0o400);
    let status = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "invalid");
    assert_eq!(fs::read_to_string(&published).unwrap(), "good 2");
    assert_eq!(
        generations(&sb.path("pub")).len(),
        1,
        "the rejected candidate is removed"
    );
    assert_eq!(
        sb.seen_on("SIGHUP").len(),
        1,
        "no action for a rejected config"
    );
}

#[test]
fn a_crash_during_an_invalid_config_restarts_the_service_on_the_last_good_copy() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(&sb, "restart = \"always\"", "on_change = \"restart\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "bad 2")]);
    sb.wait_state("invalid_config", secs(10.0));
    svc::kill(&mut tend, Signal::SIGKILL);
    let starts = sb.wait_log("service start", 2, secs(10.0));
    assert!(starts[1].ends_with(" config=good 1"), "{}", starts[1]);
    let status = sb.wait_state("invalid_config", secs(5.0));
    assert_eq!(status["service"]["restarts"], 1);
    assert!(
        status["service"]["pid"].is_number(),
        "the service runs: {status}"
    );
    assert!(
        !sb.is_ready(),
        "not_ready: the new config is still rejected"
    );

    project(&vol, &[("app.conf", "good 3")]);
    let starts = sb.wait_log("service start", 3, secs(10.0));
    assert!(starts[2].ends_with(" config=good 3"), "{}", starts[2]);
    sb.wait_ready(true, secs(5.0));
}

#[test]
fn a_restarted_tend_starts_the_service_on_the_copy_published_before() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(&sb, "", "on_change = \"restart\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);

    // The container restarts while the ConfigMap holds a bad edit.
    project(&vol, &[("app.conf", "bad 2")]);
    let tend = sb.tend().config(&cfg).start();
    let starts = sb.wait_log("service start", 2, secs(10.0));
    assert!(starts[1].ends_with(" config=good 1"), "{}", starts[1]);
    let log = tend.wait_stderr("check failed", secs(5.0));
    assert!(
        log.contains("the service starts on the last good copy") && !log.contains("not started"),
        "the log says what happens:\n{log}"
    );
    let status = sb.wait_state("invalid_config", secs(5.0));
    assert!(
        status["watches"][0]["check_output"]
            .as_str()
            .unwrap()
            .contains("bad")
            || status["watches"][0]["result"] == "invalid",
        "{status}"
    );
    assert!(!sb.is_ready());
    assert_eq!(
        fs::read_to_string(sb.path("pub/app.conf")).unwrap(),
        "good 1"
    );
}

/// tend killed (SIGKILL: an OOM kill of the container) while a candidate
/// of a bad edit is being checked, then started again with the edit still
/// there: the candidate, never checked, is removed, and the service starts
/// on the last good copy.
#[test]
fn a_tend_killed_while_a_candidate_is_checked_restarts_on_the_copy_published_before() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let gate = Gate::new(&sb, "check", true);
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\ncheck = {}\n\
         on_change = \"restart\"\n",
        sb.service_toml(&["--config", &sb.path("pub/app.conf").display().to_string()]),
        sb.readiness_toml(),
        vol.display().to_string(),
        sb.path("pub").display().to_string(),
        sh(&gate.script("grep good \"$TEND_CANDIDATE/app.conf\"")),
    ));
    let mut tend = sb.tend().config(&cfg).start_ready();
    gate.close();
    project(&vol, &[("app.conf", "bad 2")]);
    gate.wait_started(2, secs(10.0));
    assert_eq!(generations(&sb.path("pub")).len(), 2, "a candidate beside");
    tend.signal(Signal::SIGKILL);
    tend.wait(secs(10.0));

    gate.open();
    let _tend = sb.tend().config(&cfg).start();
    let starts = sb.wait_log("service start", 2, secs(10.0));
    assert!(starts[1].ends_with(" config=good 1"), "{}", starts[1]);
    sb.wait_state("invalid_config", secs(5.0));
    assert_eq!(
        generations(&sb.path("pub")).len(),
        1,
        "the candidate is gone"
    );
    assert_eq!(
        fs::read_to_string(sb.path("pub/app.conf")).unwrap(),
        "good 1"
    );
}

/// tend killed while it writes the status file (between the temporary file
/// and its rename) and started again: what it left beside the status file
/// is removed, and the status is written again.
#[test]
fn a_tend_killed_while_it_writes_the_status_file_leaves_nothing_behind_once_started_again() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(&sb, "", "on_change = \"signal\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    // The loop's next rename: the status file saying what the edit did.
    let trace = Strace::inject(&mut tend, "tend", "rename", "signal=SIGKILL:when=1");
    project(&vol, &[("app.conf", "bad 2")]);
    tend.wait(secs(15.0));
    let temporaries = || -> Vec<String> {
        entries(&sb.path(""))
            .into_iter()
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    };
    let left = temporaries();
    assert!(
        left.len() == 1 && left[0].starts_with(".status.json."),
        "{left:?}\n{}",
        trace.log()
    );
    drop(trace);

    let mut tend = sb.tend().config(&cfg).start();
    let status = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "invalid", "{status}");
    assert!(temporaries().is_empty(), "{:?}", temporaries());
    tend.wait_stderr("left by a tend stopped while it wrote", secs(5.0));
    // Its signal handlers are in place once it logged its start.
    sb.wait_log("service start", 2, secs(10.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

/// A symlink in the volume that leads into the publish directory: the copy
/// does not cover tend's own copy (which would nest one more level at each
/// publication, each one a change).
#[test]
fn a_symlink_from_the_volume_into_the_publish_directory_is_not_followed() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    // A key of the volume, as a careless init container may leave one.
    std::os::unix::fs::symlink(sb.path("pub"), vol.join("..data/copy")).unwrap();
    std::os::unix::fs::symlink("..data/copy", vol.join("copy")).unwrap();
    let cfg = config(&sb, "", "on_change = \"restart\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    let published = entries(&sb.path("pub/..data"));
    assert_eq!(published, ["app.conf"], "tend's own copy is not copied");
    let status = sb.wait_state("ready", secs(5.0));
    assert_eq!(status["service"]["restarts"], 0, "{status}");
    let (_, err) = tend.stop(secs(10.0));
    assert_eq!(err.matches("published the new config").count(), 1, "{err}");
}

#[test]
fn without_a_copy_published_before_a_rejected_mount_keeps_the_service_down() {
    let sb = Sandbox::new();
    project(&sb.path("vol"), &[("app.conf", "bad 1")]);
    let cfg = config(&sb, "", "on_change = \"restart\"");
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_state("invalid_config", secs(10.0));
    assert!(sb.log("service start").is_empty());
    assert!(tend.is_running());
}

#[test]
fn a_publish_directory_holding_files_tend_did_not_write_is_refused() {
    let sb = Sandbox::new();
    project(&sb.path("vol"), &[("app.conf", "good 1")]);
    sb.write("pub/precious.conf", "keep me");
    let cfg = config(&sb, "", "on_change = \"restart\"");
    let (code, _, stderr) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("precious.conf") && stderr.contains("did not publish"),
        "{stderr}"
    );
    assert_eq!(
        fs::read_to_string(sb.path("pub/precious.conf")).unwrap(),
        "keep me"
    );
}

/// tend as a user that is not root (`runAsNonRoot`) publishing a directory
/// that has a read-only subdirectory: each generation holds a read-only
/// copy of it, and the generation a change replaces is still removed.
#[test]
fn a_tend_that_is_not_root_replaces_generations_holding_read_only_directories() {
    const NOBODY: u32 = 65534;
    let sb = Sandbox::new();
    // The user reaches the sandbox, and writes its log, status and copy.
    fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o777)).unwrap();
    let ro = sb.path("conf/ro");
    sb.write("conf/ro/app.conf", "good 1");
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    fs::create_dir(sb.path("pub")).unwrap();
    std::os::unix::fs::chown(sb.path("pub"), Some(NOBODY), Some(NOBODY)).unwrap();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\non_change = \"signal\"\n",
        sb.service_toml(&[
            "--config",
            &sb.path("pub/ro/app.conf").display().to_string()
        ]),
        sb.readiness_toml(),
        sb.path("conf").display().to_string(),
        sb.path("pub").display().to_string(),
    ));
    let mut tend = sb.tend().run_as(NOBODY, &cfg).start_ready();
    let first = generations(&sb.path("pub"));
    assert_eq!(first.len(), 1, "{first:?}");

    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(ro.join("app.conf"), "good 2").unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(10.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["good 2"]);
    let status = sb.wait_state("ready", secs(5.0));
    assert_eq!(status["watches"][0]["result"], "applied", "{status}");
    let now = generations(&sb.path("pub"));
    assert!(now.len() == 1 && now != first, "{first:?} then {now:?}");
    // setpriv cleared the parent-death signal that unshare gave: tend must
    // be stopped, not left to outlive the test.
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

/// A status file in the publish directory would be found there at the next
/// start, among what tend did not publish: the first start refuses it.
#[test]
fn a_status_file_inside_the_publish_directory_is_a_config_error_at_the_first_start() {
    let sb = Sandbox::new();
    project(&sb.path("vol"), &[("app.conf", "good 1")]);
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n[readiness]\nstatus_file = {:?}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\non_change = \"restart\"\n",
        sb.service_toml(&[]),
        sb.path("pub/status.json").display().to_string(),
        sb.path("vol").display().to_string(),
        sb.path("pub").display().to_string(),
    ));
    let (code, _, stderr) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("readiness.status_file")
            && stderr.contains("inside the `publish` directory of watch \"app\""),
        "{stderr}"
    );
    assert!(sb.log("service start").is_empty());
    assert!(!sb.path("pub").exists(), "nothing was published");
}

/// Entries that only look like tend's: a kubelet-style `..` name, and a
/// generation that is a symlink out of the directory (with `..data`
/// pointing to it). Neither is removed nor followed, and nothing starts.
#[test]
fn a_publish_directory_with_planted_internal_names_is_refused_and_left_alone() {
    type Plant = fn(&Sandbox);
    let planted: [(&str, Plant); 2] = [
        ("a directory named like the kubelet's own", |sb| {
            sb.write("pub/..backup/app.conf", "keep me");
        }),
        ("a generation that is a symlink elsewhere", |sb| {
            sb.write("elsewhere/app.conf", "planted");
            let generation = "..2026_01_01_00_00_00.000000000";
            std::os::unix::fs::symlink(sb.path("elsewhere"), sb.path("pub").join(generation))
                .unwrap();
            std::os::unix::fs::symlink(generation, sb.path("pub/..data")).unwrap();
        }),
    ];
    for (what, plant) in planted {
        let sb = Sandbox::new();
        project(&sb.path("vol"), &[("app.conf", "bad 1")]);
        fs::create_dir(sb.path("pub")).unwrap();
        plant(&sb);
        let before = entries(&sb.path("pub"));
        let cfg = config(&sb, "", "on_change = \"restart\"");
        let (code, _, stderr) = sb.tend().config(&cfg).run(secs(10.0));
        assert_eq!(code, 2, "{what}: {stderr}");
        assert!(stderr.contains("did not publish"), "{what}: {stderr}");
        assert_eq!(entries(&sb.path("pub")), before, "{what}: left as it was");
        assert!(
            sb.log("service start").is_empty(),
            "{what}: nothing started"
        );
    }
}

/// A kubelet writer projects versions as fast as it can, each with two
/// keys that must agree; every candidate the check sees, and every
/// generation a reader finds published, has both keys from one version.
#[test]
fn a_kubelet_hammering_the_volume_never_yields_a_torn_generation() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("a", "0"), ("b", "0")]);
    let seen = sb.path("checked.log");
    let check = sh(&format!(
        "echo \"$(head -n1 \"$TEND_CANDIDATE/a\") $(head -n1 \"$TEND_CANDIDATE/b\")\" >> {}",
        seen.display()
    ));
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\ncheck = {check}\n\
         on_change = \"none\"\ndebounce = \"1ms\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        vol.display().to_string(),
        sb.path("pub").display().to_string(),
    ));
    let _tend = sb.tend().config(&cfg).start_ready();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, dir) = (stop.clone(), sb.path("pub"));
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                // One generation, read through one resolution of ..data.
                let Ok(generation) = fs::read_link(dir.join("..data")) else {
                    continue;
                };
                let g = dir.join(generation);
                if let (Ok(a), Ok(b)) = (
                    fs::read_to_string(g.join("a")),
                    fs::read_to_string(g.join("b")),
                ) {
                    assert_eq!(a, b, "a published generation mixes two versions");
                    reads += 1;
                }
            }
            reads
        })
    };
    let last = 300;
    for v in 1..=last {
        // Large enough that a copy takes a while: room for a swap mid-copy.
        let v = format!("{v}\n{}", "x".repeat(100_000));
        project(&vol, &[("a", &v), ("b", &v)]);
    }
    let want = format!("{last} {last}");
    wait_for("the last version checked", secs(30.0), || {
        fs::read_to_string(&seen)
            .unwrap_or_default()
            .lines()
            .any(|l| l == want)
            .then_some(())
    });
    let first_line = |key: &str| {
        let text = fs::read_to_string(sb.path("pub").join(key)).ok()?;
        text.lines().next().map(String::from)
    };
    wait_for("the last version published", secs(10.0), || {
        (first_line("a")? == last.to_string()).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0, "the reader read something");
    let checked = fs::read_to_string(&seen).unwrap();
    for line in checked.lines() {
        let (a, b) = line.split_once(' ').unwrap();
        assert_eq!(a, b, "a candidate mixes two versions: {line:?}");
    }
    assert_eq!(first_line("b"), Some(last.to_string()));
    assert!(
        generations(&sb.path("pub")).len() <= 2,
        "{:?}",
        generations(&sb.path("pub"))
    );
    sb.wait_state("ready", secs(10.0));
    assert_eq!(generations(&sb.path("pub")).len(), 1);
}
