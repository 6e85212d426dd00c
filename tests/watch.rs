//! Change detection: kubelet volumes, plain files, paths that appear later,
//! content fingerprints, inotify limits, and an idle tend that never wakes.

mod common;

use std::fs;
use std::path::Path;

use common::kubelet::project;
use common::*;
use nix::sys::signal::Signal;

/// A config whose service logs each SIGHUP with the content of `reads`, and
/// one watch on `paths`.
fn config(sb: &Sandbox, reads: &Path, paths: &[&Path], extra: &str) -> std::path::PathBuf {
    let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    sb.config(&format!(
        "[service]\ncommand = {}\n\n{}\n[[watch]]\nname = \"app\"\npaths = {}\non_change = \"signal\"\n{extra}",
        sb.service_toml(&["--config", &reads.display().to_string()]),
        sb.readiness_toml(),
        toml_list(&paths),
    ))
}

fn quiet(s: f64) {
    std::thread::sleep(secs(s));
}

#[test]
fn each_kubelet_update_signals_once_and_the_service_sees_it() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0"), ("other.conf", "o0")]);
    let cfg = config(&sb, &vol.join("app.conf"), &[&vol], "");
    let tend = sb.tend().config(&cfg).start_ready();
    for i in 1..=5 {
        project(
            &vol,
            &[("app.conf", &format!("v{i}")), ("other.conf", "o0")],
        );
        sb.wait_log("service sig SIGHUP", i, secs(5.0));
    }
    // The kubelet's later steps (new key links, removing the old directory)
    // must not cause a second reload.
    quiet(0.5);
    let seen = sb.seen_on("SIGHUP");
    assert_eq!(
        seen,
        ["v1", "v2", "v3", "v4", "v5"],
        "one SIGHUP per update, each seeing its update"
    );
    tend.wait_stderr("change detected", secs(5.0));
}

#[test]
fn a_key_added_by_an_update_is_visible_when_the_service_is_told() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let cfg = config(&sb, &vol.join("extra.conf"), &[&vol], "");
    let _tend = sb.tend().config(&cfg).start_ready();
    for i in 1..=5 {
        // Each update adds a new key (and drops the previous one).
        let key = format!("extra{i}.conf");
        project(
            &vol,
            &[
                ("app.conf", "v0"),
                (&key, &format!("e{i}")),
                ("extra.conf", &format!("x{i}")),
            ],
        );
        sb.wait_log("service sig SIGHUP", i, secs(5.0));
    }
    quiet(0.5);
    assert_eq!(sb.seen_on("SIGHUP"), ["x1", "x2", "x3", "x4", "x5"]);
}

#[test]
fn a_change_to_another_key_of_the_same_configmap_does_nothing() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0"), ("other.conf", "o0")]);
    let cfg = config(&sb, &vol.join("app.conf"), &[&vol.join("app.conf")], "");
    let _tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "v0"), ("other.conf", "o1")]);
    quiet(1.0);
    assert!(
        sb.log("service sig").is_empty(),
        "other.conf is not watched"
    );
    project(&vol, &[("app.conf", "v1"), ("other.conf", "o1")]);
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"]);
}

#[test]
fn an_in_place_write_is_one_change_settled_by_debounce() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "debounce = \"200ms\"\n");
    let _tend = sb.tend().config(&cfg).start_ready();
    {
        use std::io::Write as _;
        let mut f = fs::File::create(&conf).unwrap(); // truncates: the file is empty now
        for part in ["a", "b", "c", "d"] {
            f.write_all(part.as_bytes()).unwrap();
            f.flush().unwrap();
            quiet(0.05);
        }
    }
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    quiet(0.6);
    assert_eq!(
        sb.seen_on("SIGHUP"),
        ["abcd"],
        "one reload, after the writer finished"
    );
}

#[test]
fn an_editor_save_by_rename_is_one_change_and_the_file_stays_watched() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let _tend = sb.tend().config(&cfg).start_ready();
    for i in 1..=3 {
        let tmp = sb.write(&format!(".app.conf.swp{i}"), &format!("v{i}"));
        fs::rename(tmp, &conf).unwrap();
        sb.wait_log("service sig SIGHUP", i, secs(5.0));
    }
    quiet(0.4);
    assert_eq!(sb.seen_on("SIGHUP"), ["v1", "v2", "v3"]);
}

#[test]
fn delete_and_recreate_is_one_change() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let _tend = sb.tend().config(&cfg).start_ready();
    fs::remove_file(&conf).unwrap();
    sb.write("app.conf", "v1");
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    quiet(0.5);
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"]);
}

#[test]
fn same_bytes_touch_and_chmod_do_nothing() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "k0")]);
    let cfg = config(&sb, &conf, &[&conf, &vol], "debounce = \"50ms\"\n");
    let _tend = sb.tend().config(&cfg).start_ready();
    fs::write(&conf, "v0").unwrap();
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &conf,
        &nix::sys::time::TimeSpec::UTIME_NOW,
        &nix::sys::time::TimeSpec::UTIME_NOW,
        nix::sys::stat::UtimensatFlags::FollowSymlink,
    )
    .unwrap();
    fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // The kubelet's periodic sync with nothing new only re-links keys.
    assert!(!project(&vol, &[("app.conf", "k0")]));
    quiet(1.0);
    assert!(sb.log("service sig").is_empty());
}

#[test]
fn a_path_that_appears_later_is_picked_up() {
    let sb = Sandbox::new();
    let vol = sb.path("later/config");
    let plain = sb.path("later-plain/app.conf");
    let cfg = config(&sb, &vol.join("app.conf"), &[&vol, &plain], "");
    let tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    // The log says what is missing.
    tend.wait_stderr("missing", secs(5.0));
    project(&vol, &[("app.conf", "v1")]);
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"]);
    fs::create_dir_all(plain.parent().unwrap()).unwrap();
    fs::write(&plain, "p1").unwrap();
    sb.wait_log("service sig SIGHUP", 2, secs(5.0));
}

#[test]
fn a_directory_removed_and_created_again_is_followed() {
    let sb = Sandbox::new();
    let conf = sb.write("etc/app/app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let _tend = sb.tend().config(&cfg).start_ready();
    fs::remove_dir_all(sb.path("etc/app")).unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    sb.write("etc/app/app.conf", "v1");
    sb.wait_log("service sig SIGHUP", 2, secs(5.0));
    sb.write("etc/app/app.conf", "v2");
    sb.wait_log("service sig SIGHUP", 3, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["MISSING", "v1", "v2"]);
}

#[test]
fn a_directory_is_watched_recursively() {
    let sb = Sandbox::new();
    let dir = sb.path("conf.d");
    sb.write("conf.d/a.conf", "a0");
    let deep = sb.write("conf.d/sites/deep/site.conf", "s0");
    let cfg = config(&sb, &deep, &[&dir], "");
    let _tend = sb.tend().config(&cfg).start_ready();
    fs::write(&deep, "s1").unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    // A new subdirectory is covered from its creation on.
    sb.write("conf.d/new/x.conf", "x");
    sb.wait_log("service sig SIGHUP", 2, secs(5.0));
    fs::write(sb.path("conf.d/new/x.conf"), "y").unwrap();
    sb.wait_log("service sig SIGHUP", 3, secs(5.0));
}

#[test]
fn watched_content_is_never_logged_nor_stored() {
    let sb = Sandbox::new();
    let vol = sb.path("secret");
    let token = "s3cr3t-token-4242";
    common::kubelet::project_mode(&vol, &[("tls.key", token)], 0o400);
    let cfg = config(&sb, &sb.path("none"), &[&vol], "check = [\"true\"]\n");
    let mut tend = sb
        .tend()
        .env("TEND_LOG", "trace")
        .config(&cfg)
        .start_ready();
    common::kubelet::project_mode(&vol, &[("tls.key", &format!("{token}-rotated"))], 0o400);
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(10.0));
    let err = tend.stderr();
    assert!(err.contains("change detected"));
    assert!(!err.contains(token), "the log holds the secret");
    assert!(
        !fs::read_to_string(sb.path("status.json"))
            .unwrap()
            .contains(token)
    );
}

#[test]
fn an_idle_tend_does_not_wake_up() {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let conf = sb.write("plain.conf", "p0");
    let cfg = config(
        &sb,
        &vol.join("app.conf"),
        &[&vol, &conf],
        "check = [\"true\"]\n",
    );
    let mut tend = sb.tend().config(&cfg).start_ready();
    // Let the debounce of the start-up settle.
    quiet(0.5);
    // Every thread of tend: the loop's and the watcher's.
    let before = tend.context_switches();
    quiet(3.0);
    assert_eq!(
        tend.context_switches(),
        before,
        "tend woke up while nothing happened"
    );
}

/// Runs tend in a new user namespace whose inotify limit `limit` is `value`,
/// so that inotify fails for tend as it would on a crowded node.
fn with_inotify_limit(sb: &Sandbox, limit: &str, value: u32, cfg: &Path) -> Tend {
    let script = format!(
        "echo {value} > /proc/sys/user/{limit} && exec {TEND} --config {}",
        cfg.display()
    );
    sb.tend()
        .wrapped(
            "unshare",
            &[
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "sh",
                "-c",
                &script,
            ],
        )
        .start()
}

#[test]
fn without_inotify_instances_watches_are_scanned_on_an_interval() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let tend = with_inotify_limit(&sb, "max_inotify_instances", 0, &cfg);
    sb.wait_log("service start", 1, secs(10.0));
    sb.wait_ready(true, secs(10.0));
    let err = tend.wait_stderr("inotify_init1() failed", secs(5.0));
    assert!(
        err.contains("max_user_instances"),
        "the warning names the limit: {err}"
    );
    fs::write(&conf, "v1").unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(6.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"]);
}

#[test]
fn without_inotify_watches_a_watch_is_scanned_on_an_interval() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let tend = with_inotify_limit(&sb, "max_inotify_watches", 0, &cfg);
    sb.wait_log("service start", 1, secs(10.0));
    sb.wait_ready(true, secs(10.0));
    let err = tend.wait_stderr("inotify_add_watch", secs(5.0));
    assert!(
        err.contains("max_user_watches"),
        "the warning names the limit: {err}"
    );
    fs::write(&conf, "v1").unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(6.0));
}

#[test]
fn a_change_while_stopping_does_not_make_tend_spin() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"3s\"\n\n[[watch]]\npaths = [{:?}]\non_change = \"signal\"\n",
        sb.service_toml(&["--ignore-term"]),
        conf.display().to_string()
    ));
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    let pid = tend.pid();
    tend.signal(Signal::SIGTERM);
    sb.wait_log("service sig SIGTERM", 1, secs(5.0));
    // A change arrives while tend waits for the service to stop.
    fs::write(&conf, "v1").unwrap();
    let cpu = || {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<u64> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        f[10] + f[11] // utime + stime, in clock ticks
    };
    let before = cpu();
    quiet(1.0);
    let used = cpu() - before;
    assert!(
        used < 10,
        "tend used {used} ticks of CPU in 1 s while stopping"
    );
    assert_eq!(tend.wait(secs(10.0)), 137);
}

/// Starts tend with `limit` at 0, raises it as an operator would (in tend's
/// user namespace), and checks that the watch is served by inotify again.
fn returns_to_inotify(limit: &str, warning: &str) {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let mut tend = with_inotify_limit(&sb, limit, 0, &cfg);
    sb.wait_log("service start", 1, secs(10.0));
    tend.wait_stderr(warning, secs(5.0));
    let raised = std::process::Command::new("nsenter")
        .args(["--user", "--target", &tend.pid().to_string(), "sh", "-c"])
        .arg(format!("echo 1000 > /proc/sys/user/{limit}"))
        .status()
        .unwrap();
    assert!(raised.success());
    tend.wait_stderr("inotify covers this watch again", secs(5.0));
    fs::write(&conf, "v1").unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"]);
}

#[test]
fn a_polling_watch_returns_to_inotify_once_the_watch_limit_is_raised() {
    returns_to_inotify("max_inotify_watches", "max_user_watches");
}

#[test]
fn polling_watches_return_to_inotify_once_the_instance_limit_is_raised() {
    returns_to_inotify("max_inotify_instances", "max_user_instances");
}

#[test]
fn a_fifo_swapped_in_for_a_watched_file_never_blocks_tend() {
    let sb = Sandbox::new();
    let conf = sb.write("app.conf", "v0");
    // The service itself must not open the FIFO: it reads another file.
    let other = sb.write("other.conf", "o0");
    let cfg = config(&sb, &other, &[&conf], "debounce = \"0ms\"\n");
    let mut tend = sb.tend().config(&cfg).start_ready();
    // Each swap makes tend scan again; a scan that finds a regular file and
    // then opens what has become a FIFO must not wait for a writer.
    let fifo = sb.path("fifo.tmp");
    let plain = sb.path("plain.tmp");
    let until = std::time::Instant::now() + secs(3.0);
    let mut i = 0;
    while std::time::Instant::now() < until {
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR).unwrap();
        fs::rename(&fifo, &conf).unwrap();
        fs::write(&plain, format!("v{i}")).unwrap();
        fs::rename(&plain, &conf).unwrap();
        i += 1;
    }
    quiet(0.2);
    tend.signal(Signal::SIGUSR1);
    sb.wait_log("service sig SIGUSR1", 1, secs(5.0));
}

#[test]
fn every_file_of_a_large_directory_is_covered() {
    let sb = Sandbox::new();
    let dir = sb.path("many");
    fs::create_dir(&dir).unwrap();
    for i in 0..10_050 {
        fs::write(dir.join(format!("f{i:05}.conf")), "0").unwrap();
    }
    // Last in any order a scan could use.
    let last = dir.join("f10049.conf");
    let cfg = config(&sb, &last, &[&dir], "");
    let tend = sb.tend().config(&cfg).start_ready();
    fs::write(&last, "changed").unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(10.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["changed"]);
    tend.wait_stderr("files=10050", secs(5.0));
}

#[test]
fn a_busy_sibling_delays_a_change_by_at_most_the_max_wait() {
    let sb = Sandbox::new();
    let dir = sb.path("conf.d");
    let quiet_file = sb.write("conf.d/app.conf", "v0");
    let busy = sb.write("conf.d/access.log", "");
    let cfg = config(&sb, &quiet_file, &[&dir], "debounce = \"100ms\"\n");
    let _tend = sb.tend().config(&cfg).start_ready();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Write as _;
            let mut f = fs::File::options().append(true).open(busy).unwrap();
            let until = std::time::Instant::now() + secs(15.0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < until
            {
                f.write_all(b"GET /\n").unwrap();
                std::thread::sleep(secs(0.05));
            }
        })
    };
    quiet(0.5);
    fs::write(&quiet_file, "v1").unwrap();
    let changed = std::time::Instant::now();
    wait_for("a SIGHUP with the new content", secs(12.0), || {
        sb.seen_on("SIGHUP")
            .contains(&"v1".to_string())
            .then_some(())
    });
    let took = changed.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    appender.join().unwrap();
    // The rule: max(1 s, 4 x debounce) after the first unscanned event.
    assert!(
        took < secs(2.5),
        "the change reached the service after {took:?} while a sibling kept changing"
    );
}

/// Whether tend has `file` open (any of its threads).
fn has_open(tend: &mut Tend, file: &Path) -> bool {
    let pid = tend.pid();
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == file))
        })
        .unwrap_or(false)
}

#[test]
fn signals_flow_while_a_large_file_is_hashed() {
    // Large enough that hashing it takes seconds in this build (SHA-256 runs
    // about 25x faster in a release build).
    let size: u64 = if cfg!(debug_assertions) {
        512
    } else {
        12 * 1024
    } << 20;
    let sb = Sandbox::new();
    let big = sb.write("data/big.bin", "small at first");
    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&big, &conf], "");
    let mut tend = sb.tend().config(&cfg).start_ready();
    // Sparse: instant to make, and read from memory, so the time is hashing.
    fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(size)
        .unwrap();
    wait_for("tend to open the large file", secs(10.0), || {
        has_open(&mut tend, &big).then_some(())
    });

    let sent = std::time::Instant::now();
    tend.signal(Signal::SIGUSR1);
    sb.wait_log("service sig SIGUSR1", 1, secs(30.0));
    let forwarded = sent.elapsed();
    assert!(
        forwarded < secs(1.0),
        "SIGUSR1 took {forwarded:?} to reach the service while a file was hashed"
    );
    assert!(
        has_open(&mut tend, &big),
        "the hash finished before the signal arrived: make the file larger for this machine"
    );

    let sent = std::time::Instant::now();
    tend.signal(Signal::SIGTERM);
    let code = tend.wait(secs(60.0));
    let stopped = sent.elapsed();
    assert_eq!(code, 0);
    assert!(
        stopped < secs(2.0),
        "SIGTERM took {stopped:?} to end tend while a file was hashed"
    );
}

#[test]
fn only_a_tend_with_watches_runs_a_watcher_thread() {
    let sb = Sandbox::new();
    // Besides the output writer, which a tend that logs has too.
    let threads = |tend: &mut Tend| {
        let pid = tend.pid();
        fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter(|t| {
                fs::read_to_string(t.path().join("comm")).unwrap_or_default() != "tend-output\n"
            })
            .count()
    };
    let mut plain = sb.tend().command(&sb.service(&[])).start();
    sb.wait_log("service start", 1, secs(10.0));
    assert_eq!(threads(&mut plain), 1, "a plain init is one thread");
    plain.signal(Signal::SIGTERM);
    plain.wait(secs(10.0));

    let conf = sb.write("app.conf", "v0");
    let cfg = config(&sb, &conf, &[&conf], "");
    let mut watching = sb.tend().config(&cfg).start_ready();
    assert_eq!(threads(&mut watching), 2);
}

#[test]
fn a_volume_mounted_over_a_watched_directory_is_followed() {
    let sb = Sandbox::new();
    let dir = sb.path("mnt");
    let conf = sb.write("mnt/app.conf", "v0");
    let cfg = config(&sb, &conf, &[&dir], "");
    let mut tend = sb.tend().config(&cfg).start_ready();
    // In tend's own mount namespace, as a volume (re)mounted in a container.
    let pid = tend.pid().to_string();
    let in_tend = |script: &str| {
        let status = std::process::Command::new("nsenter")
            .args(["-t", &pid, "-m", "sh", "-ec", script])
            .status()
            .unwrap();
        assert!(status.success(), "{script}");
    };
    let dir_s = dir.display().to_string();
    in_tend(&format!(
        "mount -t tmpfs tend-test {dir_s} && echo v1 > {dir_s}/app.conf"
    ));
    wait_for("a SIGHUP with the mounted content", secs(5.0), || {
        (sb.seen_on("SIGHUP").last().map(String::as_str) == Some("v1")).then_some(())
    });
    // The new volume is watched, not only scanned once.
    let n = sb.log("service sig SIGHUP").len();
    in_tend(&format!("echo v2 > {dir_s}/app.conf"));
    sb.wait_log("service sig SIGHUP", n + 1, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP").last().unwrap(), "v2");
    // Unmounted: the directory underneath is what the service reads again.
    in_tend(&format!("umount {dir_s}"));
    sb.wait_log("service sig SIGHUP", n + 2, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP").last().unwrap(), "v0");
}

#[test]
fn tends_own_files_never_cause_a_reload() {
    let sb = Sandbox::new();
    let run = sb.path("run");
    let conf = sb.path("conf");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n\n[readiness]\nfile = {:?}\nstatus_file = {:?}\n\n\
         [[watch]]\npaths = [{:?}]\non_change = \"signal\"\n",
        sb.service_toml(&["--config", &conf.join("app.conf").display().to_string()]),
        run.join("ready").display().to_string(),
        run.join("status.json").display().to_string(),
        conf.display().to_string(),
    ));
    let _tend = sb.tend().config(&cfg).start();
    sb.wait_log("service start", 1, secs(10.0));
    // Not ready while the watched path is missing: only the status file.
    wait_for("the status file", secs(10.0), || {
        run.join("status.json").exists().then_some(())
    });
    // The watched path appears as a symlink to the directory tend writes in,
    // where tend then writes the ready file and the status again.
    std::os::unix::fs::symlink(&run, &conf).unwrap();
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    wait_for("the ready file", secs(10.0), || {
        run.join("ready").exists().then_some(())
    });
    quiet(2.0);
    assert_eq!(
        sb.log("service sig SIGHUP").len(),
        1,
        "tend reloaded on its own writes to the ready and status files"
    );
    fs::write(run.join("app.conf"), "v1").unwrap();
    sb.wait_log("service sig SIGHUP", 2, secs(5.0));
    quiet(1.0);
    assert_eq!(sb.seen_on("SIGHUP"), ["MISSING", "v1"]);
}

#[test]
fn what_a_scan_cannot_read_is_named_in_the_log() {
    let sb = Sandbox::new();
    let dir = sb.path("conf.d");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("app.conf"), "v0").unwrap();
    let cfg = config(&sb, &dir.join("app.conf"), &[&dir], "");
    let tend = sb.tend().config(&cfg).start_ready();
    // The first scan is acted on, and logged, before the service starts.
    let err = tend.wait_stderr("service started", secs(5.0));
    assert!(!err.contains("cannot be read"), "{err}");
    std::os::unix::fs::symlink("/nonexistent/target", dir.join("extra.conf")).unwrap();
    tend.wait_stderr(
        &format!(
            "part of the watched config cannot be read; the check decides whether the config is valid without it watch=\"app\" unreadable=[\"{}/extra.conf -> /nonexistent: No such file or directory (os error 2)\"]",
            dir.display()
        ),
        secs(5.0),
    );
}
