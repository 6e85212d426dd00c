//! `verify`, rollback and `splay`: a change that passes its check but breaks
//! the service is put back, and replicas adopt a change one after another.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::http::{Load, free_port, wait_up};
use common::kubelet::project;
use common::strace::Strace;
use common::*;
use nix::sys::signal::Signal;

/// Watches `vol`, publishes to `pub`, checks for "good", verifies that the
/// published config is not "broken" (as a health request would find), and
/// sends SIGHUP.
fn config(sb: &Sandbox, extra: &str) -> PathBuf {
    let verify = sh(&format!(
        "if grep broken {}/app.conf; then echo 'HTTP 502 from /healthz'; exit 1; fi",
        sb.path("pub").display()
    ));
    config_verifying(sb, &verify, extra)
}

/// [`config`] with this `verify` (a TOML array).
fn config_verifying(sb: &Sandbox, verify: &str, extra: &str) -> PathBuf {
    let published = sb.path("pub");
    sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\n\
         check = {}\non_change = \"signal\"\nverify = {verify}\n{extra}\n",
        sb.service_toml(&[
            "--config",
            &published.join("app.conf").display().to_string()
        ]),
        sb.readiness_toml(),
        sb.path("vol").display().to_string(),
        published.display().to_string(),
        sh("grep good \"$TEND_CANDIDATE/app.conf\""),
    ))
}

/// tend on "good 1", then an edit to content that passes its check but
/// fails verify: returns the volume, the config, tend, and the status once
/// the edit was rejected.
fn rolled_back_once(sb: &Sandbox) -> (PathBuf, PathBuf, Tend, serde_json::Value) {
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(sb, "verify_timeout = \"1s\"");
    let tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "good but broken 2")]);
    let status = sb.wait_state("invalid_config", secs(10.0));
    (vol, cfg, tend, status)
}

#[test]
fn a_config_that_passes_its_check_but_fails_verify_is_rolled_back() {
    let sb = Sandbox::new();
    let (vol, cfg, mut tend, status) = rolled_back_once(&sb);
    let watch = &status["watches"][0];
    assert_eq!(watch["result"], "rolled_back", "{status}");
    let output = watch["check_output"].as_str().unwrap();
    assert!(
        output.contains("HTTP 502") && output.contains("did not pass within 1s"),
        "{output}"
    );
    // The status says rolled_back as soon as the rollback is decided; the
    // watcher puts the previous generation back a moment later.
    wait_for("the previous generation back", secs(10.0), || {
        (fs::read_to_string(sb.path("pub/app.conf")).ok()? == "good 1").then_some(())
    });
    // Applied, then applied again to put the service back.
    let seen = sb.wait_log("service sig SIGHUP", 2, secs(5.0));
    assert_eq!(
        sb.seen_on("SIGHUP"),
        ["good but broken 2", "good 1"],
        "{seen:?}"
    );
    assert!(!sb.is_ready(), "not_ready: a rejected change");
    let (code, line) = probe(&cfg);
    assert_eq!(code, 1);
    assert!(line.contains("rolled_back"), "{line}");
    tend.wait_stderr("rolling back to the previous config", secs(5.0));

    // A newer good content is applied normally.
    project(&vol, &[("app.conf", "good 3")]);
    sb.wait_log("service sig SIGHUP", 3, secs(10.0));
    assert_eq!(sb.seen_on("SIGHUP")[2], "good 3");
    let status = sb.wait_state("ready", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "applied");
    assert_eq!(
        sb.seen_on("SIGHUP").len(),
        3,
        "the rejected one never again"
    );

    // Idle afterwards (once the kubelet's last events are scanned).
    std::thread::sleep(secs(0.5));
    let before = tend.context_switches();
    std::thread::sleep(secs(1.5));
    assert_eq!(tend.context_switches(), before, "tend woke up while idle");
}

/// The service's start lines since the last restart of tend.
fn starts_since(sb: &Sandbox, earlier: usize) -> Vec<String> {
    sb.log("service start")[earlier..].to_vec()
}

/// A container restart: tend is stopped, and started again with the
/// `publish` directory as it left it (an emptyDir outlives the container).
fn restart_tend(sb: &Sandbox, tend: &mut Tend, cfg: &Path) -> Tend {
    if tend.is_running() {
        tend.signal(Signal::SIGTERM);
    }
    tend.wait(secs(10.0));
    fs::remove_file(sb.path("status.json")).unwrap();
    sb.tend().config(cfg).start()
}

#[test]
fn a_restarted_tend_does_not_apply_again_a_config_it_rolled_back() {
    let sb = Sandbox::new();
    let (vol, cfg, mut tend, status) = rolled_back_once(&sb);
    assert_eq!(status["watches"][0]["result"], "rolled_back");

    let before = sb.log("service start").len();
    let mut tend = restart_tend(&sb, &mut tend, &cfg);
    let status = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "rolled_back", "{status}");
    assert!(status["service"]["pid"].is_number(), "{status}");
    let starts = sb.wait_log("service start", before + 1, secs(10.0));
    assert!(starts[before].ends_with(" config=good 1"), "{starts:?}");
    assert_eq!(
        fs::read_to_string(sb.path("pub/app.conf")).unwrap(),
        "good 1"
    );
    assert!(!sb.is_ready());

    // Other content is applied (and verified) as usual.
    let hups = sb.seen_on("SIGHUP").len();
    project(&vol, &[("app.conf", "good 3")]);
    sb.wait_log("service sig SIGHUP", hups + 1, secs(10.0));
    assert_eq!(sb.seen_on("SIGHUP")[hups], "good 3");
    let status = sb.wait_state("ready", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "applied");
    assert_eq!(starts_since(&sb, before).len(), 1);
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

/// The container is killed while a change is verified (a liveness probe,
/// the OOM killer): the restarted tend starts the service on the config
/// before that change, not on the unverified one.
#[test]
fn a_tend_stopped_during_a_verify_starts_again_on_the_config_before_it() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(&sb, "verify_timeout = \"30s\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "good but broken 2")]);
    wait_for("verifying", secs(10.0), || {
        sb.status()
            .filter(|s| s["watches"][0]["result"] == "verifying")
    });
    tend.signal(Signal::SIGKILL);
    tend.wait(secs(10.0));

    let before = sb.log("service start").len();
    let tend = restart_tend(&sb, &mut tend, &cfg);
    let status = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "rolled_back", "{status}");
    let starts = sb.wait_log("service start", before + 1, secs(10.0));
    assert!(starts[before].ends_with(" config=good 1"), "{starts:?}");
    tend.wait_stderr("tend stopped while a change was verified", secs(5.0));
}

/// A verify that hangs, and leaves a child behind in its process group,
/// does not delay a stop, and nothing of it outlives tend.
#[test]
fn sigterm_during_a_hanging_verify_stops_at_once_and_kills_its_group() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    // Unique to this test: its own processes are found by it.
    let hang = format!("999.{}", std::process::id());
    let verify = sh(&format!("sleep {hang} & sleep {hang}"));
    let cfg = config_verifying(&sb, &verify, "verify_timeout = \"60s\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "good 2")]);
    wait_for("verifying", secs(10.0), || {
        sb.status()
            .filter(|s| s["watches"][0]["result"] == "verifying")
    });
    let hanging = || {
        fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&hang))
            })
            .count()
    };
    wait_for("the verify's two sleeps", secs(10.0), || {
        (hanging() >= 2).then_some(())
    });
    let stop = Instant::now();
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(5.0)), 0);
    assert!(stop.elapsed() < secs(2.0), "{:?}", stop.elapsed());
    assert_eq!(hanging(), 0, "the verify's process group is gone");
}

#[test]
fn a_verify_that_passes_late_but_in_time_applies_the_change() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let healthy = sb.path("healthy");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\non_change = \"signal\"\n\
         verify = [\"test\", \"-e\", {:?}]\nverify_timeout = \"20s\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        vol.display().to_string(),
        sb.path("pub").display().to_string(),
        healthy.display().to_string(),
    ));
    let _tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "good 2")]);
    wait_for("verifying", secs(10.0), || {
        let s = sb.status()?;
        (s["watches"][0]["result"] == "verifying").then_some(())
    });
    assert!(sb.is_ready(), "a change in progress keeps readiness");
    fs::write(&healthy, "").unwrap();
    let status = sb.wait_state("ready", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "applied");
    assert_eq!(
        fs::read_to_string(sb.path("pub/app.conf")).unwrap(),
        "good 2"
    );
    let generations = || {
        fs::read_dir(sb.path("pub"))
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                let n = n.to_string_lossy();
                n.starts_with("..") && n != "..data"
            })
            .count()
    };
    wait_for("the previous generation to be let go", secs(5.0), || {
        (generations() == 1).then_some(())
    });
}

/// Five replicas share one volume with `splay = "3s"`: one update reaches
/// them all at once, and they apply it one after another over the window.
#[test]
fn splay_spreads_one_change_across_replicas_and_never_delays_a_stop() {
    let vol_sb = Sandbox::new();
    let vol = vol_sb.path("vol");
    project(&vol, &[("app.conf", "v1")]);
    let replicas: Vec<Sandbox> = (0..5).map(|_| Sandbox::new()).collect();
    let mut tends = Vec::new();
    for sb in &replicas {
        let cfg = sb.config(&format!(
            "[service]\ncommand = {}\n{}\n\
             [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"signal\"\nsplay = \"3s\"\n",
            sb.service_toml(&[]),
            sb.readiness_toml(),
            vol.display().to_string(),
        ));
        tends.push(sb.tend().config(&cfg).start());
    }
    for sb in &replicas {
        sb.wait_ready(true, secs(10.0));
        // Its signal handlers are in place once it logged its start.
        sb.wait_log("service start", 1, secs(10.0));
    }
    let swap = Instant::now();
    project(&vol, &[("app.conf", "v2")]);
    let mut at = Vec::new();
    for sb in &replicas {
        sb.wait_log("service sig SIGHUP", 1, secs(10.0));
        at.push(
            fs::metadata(sb.path("service.log"))
                .unwrap()
                .modified()
                .unwrap(),
        );
    }
    let waited = swap.elapsed();
    assert!(
        waited < secs(6.0),
        "every replica within the window: {waited:?}"
    );
    at.sort();
    let spread = at[4].duration_since(at[0]).unwrap();
    assert!(
        spread > secs(0.3),
        "the replicas applied the change together: {spread:?}"
    );
    // No timer is left once the wait is over.
    let status = replicas[1].wait_state("ready", secs(10.0));
    assert!(status["watches"][0]["action_at"].is_null(), "{status}");
    std::thread::sleep(secs(0.5));
    let before = tends[1].context_switches();
    std::thread::sleep(secs(1.5));
    assert_eq!(
        tends[1].context_switches(),
        before,
        "tend woke up while idle"
    );

    // A change waiting for its splay does not delay a stop.
    project(&vol, &[("app.conf", "v3")]);
    let sb = &replicas[0];
    wait_for("the change to wait for its splay", secs(10.0), || {
        let s = sb.status()?;
        s["watches"][0]["action_at"].as_str().map(|_| ())
    });
    let stop = Instant::now();
    tends[0].signal(Signal::SIGTERM);
    assert_eq!(tends[0].wait(secs(5.0)), 0);
    assert!(stop.elapsed() < secs(2.0), "{:?}", stop.elapsed());
}

/// The in-place example end to end: an edit that parses but makes the
/// program answer 503 is restarted on (overlap, held socket), fails verify,
/// and is rolled back the same way; no request is refused or cut off.
#[test]
fn the_in_place_example_rolls_back_an_overlap_restart_that_fails_verify() {
    let sb = Sandbox::new();
    let port = free_port();
    let vol = sb.path("app");
    let conf =
        |greeting: &str, workers: u32| format!("greeting = {greeting}\nworkers = {workers}\n");
    project(&vol, &[("app.conf", &conf("v1", 4))]);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/in-place");
    let mut toml = fs::read_to_string(example.join("supervisor.toml")).unwrap();
    let at = |p: PathBuf| p.display().to_string();
    for (from, to) in [
        ("/app/server.py", at(example.join("server.py"))),
        ("\"/etc/app\"", format!("{:?}", at(vol.clone()))),
        ("/run/tend/app", at(sb.path("published"))),
        ("/run/tend/ready", at(sb.path("ready"))),
        ("/run/tend/status.json", at(sb.path("status.json"))),
        ("0.0.0.0:8080", format!("127.0.0.1:{port}")),
        ("127.0.0.1:8080", format!("127.0.0.1:{port}")),
        ("splay = \"30s\"", "splay = \"1s\"".into()),
        ("verify_timeout = \"10s\"", "verify_timeout = \"3s\"".into()),
    ] {
        assert!(toml.contains(from), "{from} is not in the example");
        toml = toml.replace(from, &to);
    }
    let cfg = sb.config(&toml);
    let mut tend = sb.tend().config(&cfg).start();
    assert_eq!(wait_up(port, secs(10.0)), "v1");
    sb.wait_ready(true, secs(5.0));

    let load = Load::workers(4, port, 1_000_000, secs(60.0), secs(0.002));
    let edit = Instant::now();
    project(&vol, &[("app.conf", &conf("v2", 0))]);
    wait_for("the rollback", secs(20.0), || {
        sb.status()
            .filter(|s| s["watches"][0]["result"] == "rolled_back")
    });
    let status = sb.wait_state("invalid_config", secs(20.0));
    assert_eq!(status["watches"][0]["result"], "rolled_back");
    // Once the previous config's instance took over (not before: the
    // rejected one serves until then), invalid_config = "ready" keeps the
    // replica in its Service.
    sb.wait_ready(true, secs(20.0));
    load.wait_body("v1", Instant::now(), secs(10.0));
    assert_eq!(
        fs::read_to_string(sb.path("published/app.conf")).unwrap(),
        conf("v1", 4)
    );

    // A good edit afterwards is applied and verified.
    project(&vol, &[("app.conf", &conf("v3", 2))]);
    load.wait_body("v3", Instant::now(), secs(20.0));
    let status = sb.wait_state("ready", secs(20.0));
    assert_eq!(status["watches"][0]["result"], "applied");
    let records = load.finish();
    let failed: Vec<&String> = records
        .iter()
        .filter(|(t, _)| *t >= edit)
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    let cut = failed
        .iter()
        .filter(|e| !e.starts_with("status 503"))
        .count();
    eprintln!(
        "{} requests; {} answered 503 by the broken config until the rollback; {cut} refused or cut off",
        records.len(),
        failed.len()
    );
    assert_eq!(cut, 0, "{failed:?}");
    let (_, err) = tend.stop(secs(20.0));
    assert_eq!(
        err.matches("rolling back to the previous config").count(),
        1,
        "{err}"
    );
}

/// Makes a directory writable again when dropped, so a failed test leaves
/// no immutable directory behind.
struct Immutable(PathBuf);

impl Immutable {
    fn lift(&self) {
        let ok = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "chattr -i {}", self.0.display());
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

/// The `publish` directory cannot be written when the rollback comes (here
/// the failing verify makes it immutable): the rollback is tried again,
/// and the status says what fails, until the directory is writable again.
#[test]
fn a_rollback_the_publish_directory_refuses_is_tried_again_until_it_works() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let published = sb.path("pub");
    let lock = Immutable(published.clone());
    let verify = sh(&format!(
        "if grep -q broken {0}/app.conf; then chattr +i {0}; echo 'HTTP 502 from /healthz'; exit 1; fi",
        published.display()
    ));
    let cfg = config_verifying(&sb, &verify, "verify_timeout = \"1s\"");
    let mut tend = sb.tend().config(&cfg).start_ready();

    project(&vol, &[("app.conf", "good but broken 2")]);
    let failing = "cannot put the previous config back";
    let status = wait_for("the rollback to fail", secs(10.0), || {
        sb.status().filter(|s| {
            s["watches"][0]["check_output"]
                .as_str()
                .is_some_and(|o| o.contains(failing))
        })
    });
    let watch = &status["watches"][0];
    assert_eq!(watch["result"], "action_failed", "{status}");
    assert!(
        watch["check_output"].as_str().unwrap().contains("HTTP 502"),
        "{status}"
    );
    // Tried again, and again.
    tend.wait_stderr_count(failing, 2, secs(10.0));
    assert!(!sb.is_ready(), "the service runs the rejected config");
    assert_eq!(
        fs::read_to_string(published.join("app.conf")).unwrap(),
        "good but broken 2"
    );
    assert_eq!(sb.seen_on("SIGHUP"), ["good but broken 2"]);

    lock.lift();
    let status = sb.wait_state("invalid_config", secs(15.0));
    assert_eq!(status["watches"][0]["result"], "rolled_back", "{status}");
    let output = status["watches"][0]["check_output"].as_str().unwrap();
    assert!(!output.contains(failing), "{output}");
    assert_eq!(
        fs::read_to_string(published.join("app.conf")).unwrap(),
        "good 1"
    );
    sb.wait_log("service sig SIGHUP", 2, secs(5.0));
    assert_eq!(sb.seen_on("SIGHUP"), ["good but broken 2", "good 1"]);
    assert!(!sb.is_ready());
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

/// The generation directories in each listing of `listings`: the
/// `publish` directory as each check saw it (`ls -a`, then `---`).
fn generations_seen(listings: &Path) -> Vec<Vec<String>> {
    fs::read_to_string(listings)
        .unwrap_or_default()
        .split("---\n")
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.lines()
                .filter(|n| {
                    n.strip_prefix("..")
                        .is_some_and(|s| s.starts_with(|c: char| c.is_ascii_digit()))
                })
                .map(String::from)
                .collect()
        })
        .collect()
}

/// A change whose reload command fails stays published while it is
/// retried, and the generation before it is kept to roll back to; a newer
/// change then is copied and checked with no third generation beside them.
#[test]
fn the_publish_directory_never_holds_three_generations_when_a_failed_change_is_replaced() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let published = sb.path("pub");
    let listings = sb.path("listings");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\npublish = {:?}\n\
         check = {}\non_change = \"exec\"\nexec = {}\nverify = [\"true\"]\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        vol.display().to_string(),
        published.display().to_string(),
        sh(&format!(
            "ls -a {0} >> {1}; echo --- >> {1}; grep good \"$TEND_CANDIDATE/app.conf\"",
            published.display(),
            listings.display()
        )),
        sh(&format!(
            "if grep -q 'fails to reload' {}/app.conf; then echo 'reload refused'; exit 1; fi",
            published.display()
        )),
    ));
    let tend = sb.tend().config(&cfg).start_ready();
    project(&vol, &[("app.conf", "good 2 fails to reload")]);
    tend.wait_stderr("reload command failed", secs(10.0));
    let checks = generations_seen(&listings).len();
    project(&vol, &[("app.conf", "good 3")]);
    let status = sb.wait_state("ready", secs(15.0));
    assert_eq!(status["watches"][0]["result"], "applied", "{status}");
    assert_eq!(
        fs::read_to_string(published.join("app.conf")).unwrap(),
        "good 3"
    );
    let seen = generations_seen(&listings);
    assert!(seen.len() > checks, "3 was checked: {seen:?}");
    for generations in &seen {
        assert!(generations.len() <= 2, "{seen:?}");
    }
    wait_for("the kept generation to be let go", secs(5.0), || {
        let now = fs::read_dir(&published)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .strip_prefix("..")
                    .is_some_and(|s| s.starts_with(|c: char| c.is_ascii_digit()))
            })
            .count();
        (now == 1).then_some(())
    });
}

/// Without `publish`, a restart on a config that keeps the service from
/// ever becoming ready: the restart policy starts it again and again, and
/// the watch says action_failed all along, not verifying.
#[test]
fn without_publish_a_restart_that_never_becomes_ready_is_an_action_failure() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let conf = vol.join("app.conf");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nrestart = \"always\"\nready_timeout = \"1s\"\nready_check = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\ncheck = {}\non_change = \"restart\"\n\
         verify = [\"true\"]\n",
        sb.service_toml(&[]),
        sh(&format!("! grep -q 'never ready' {}", conf.display())),
        sb.readiness_toml(),
        vol.display().to_string(),
        sh(&format!("grep good {}", conf.display())),
    ));
    let mut tend = sb.tend().config(&cfg).start_ready();
    let starts = sb.log("service start").len();
    project(&vol, &[("app.conf", "good but never ready 2")]);
    wait_for("action_failed", secs(10.0), || {
        sb.status()
            .filter(|s| s["watches"][0]["result"] == "action_failed")
    });
    // Two more starts on it, each stopped at its ready_timeout: the result
    // stays the same all along.
    wait_for("two more starts", secs(15.0), || {
        let status = sb.status()?;
        assert_eq!(status["watches"][0]["result"], "action_failed", "{status}");
        assert!(!sb.is_ready(), "{status}");
        (sb.log("service start").len() >= starts + 3).then_some(())
    });
    let output = sb.status().unwrap()["watches"][0]["check_output"].to_string();
    assert!(
        output.contains("did not become ready within 1s"),
        "{output}"
    );

    project(&vol, &[("app.conf", "good 3")]);
    let status = sb.wait_state("ready", secs(15.0));
    assert_eq!(status["watches"][0]["result"], "applied", "{status}");
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(10.0));
}

/// The names in the `publish` directory that are temporary files.
fn temporaries(sb: &Sandbox) -> Vec<String> {
    fs::read_dir(sb.path("pub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// A tend killed while it records the config it rolls back (`..rejected`,
/// written to a temporary file and renamed into place) starts again, as a
/// container restart would: what it left is its own, and is cleaned up,
/// not refused as a file tend did not write (a crash loop).
#[test]
fn a_tend_killed_while_it_records_a_rejected_config_starts_again_on_the_config_before_it() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(&sb, "verify_timeout = \"1s\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    // The watcher's renames from now: `..previous` and `..data` to
    // publish the change, then the record of it being rejected.
    let trace = Strace::inject(&mut tend, "watcher", "rename", "signal=SIGKILL:when=3");
    project(&vol, &[("app.conf", "good but broken 2")]);
    tend.wait(secs(15.0));
    assert!(trace.log().contains("killed by SIGKILL"), "{}", trace.log());
    let left = temporaries(&sb);
    assert!(
        left.len() == 1 && left[0].starts_with("...rejected."),
        "{left:?}\n{}",
        trace.log()
    );
    drop(trace);

    let before = sb.log("service start").len();
    let mut tend = restart_tend(&sb, &mut tend, &cfg);
    let status = sb.wait_state("invalid_config", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "rolled_back", "{status}");
    let starts = sb.wait_log("service start", before + 1, secs(10.0));
    assert!(starts[before].ends_with(" config=good 1"), "{starts:?}");
    assert!(temporaries(&sb).is_empty(), "{:?}", temporaries(&sb));
    assert!(tend.is_running());
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

/// The disk is full for a moment while a config that failed verify is
/// rolled back: the rollback is tried again after a back-off (here 30 s),
/// but a newer change does not wait for that: the rollback is tried again
/// at once, then the newer change is applied.
#[test]
fn a_rollback_that_failed_on_a_full_disk_is_tried_again_as_soon_as_a_newer_change_comes() {
    let sb = Sandbox::new();
    let vol = sb.path("vol");
    project(&vol, &[("app.conf", "good 1")]);
    let cfg = config(&sb, "verify_timeout = \"1s\"\nrecheck = \"30s\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    // The watcher's symlinks from now: `..previous` and `..data` to
    // publish the change, then `..data` to put the previous one back.
    let trace = Strace::inject(&mut tend, "watcher", "symlink", "error=ENOSPC:when=3");
    project(&vol, &[("app.conf", "good but broken 2")]);
    let log = tend.wait_stderr("cannot put the previous config back", secs(10.0));
    assert!(log.contains("No space left on device"), "{log}");
    drop(trace);

    project(&vol, &[("app.conf", "good 3")]);
    let status = sb.wait_state("ready", secs(10.0));
    assert_eq!(status["watches"][0]["result"], "applied", "{status}");
    assert_eq!(
        sb.seen_on("SIGHUP"),
        ["good but broken 2", "good 1", "good 3"],
        "put back, then the newer change"
    );
    assert!(temporaries(&sb).is_empty(), "{:?}", temporaries(&sb));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}
