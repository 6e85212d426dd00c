//! examples/fat-container as PID 1: nginx and php-fpm (Debian's php8.2-fpm),
//! php-fpm serving a PHP page to nginx over FastCGI on a unix socket, each
//! with its own ConfigMap volume (projected as the kubelet does), its own
//! check and its own reload signal. The example's own files are run, with
//! their paths and port rewritten into the sandbox, and everything runs as
//! the image runs it: tend, nginx and php-fpm as www-data (uid 33), not root.
//!
//! - a pool change reloads php-fpm alone (SIGUSR2): nginx is not touched, and
//!   not one request fails meanwhile;
//! - a site change reloads nginx alone (SIGHUP): php-fpm is not touched;
//! - a pool change that php-fpm's own check rejects leaves both running:
//!   readiness goes off, and nginx goes on serving the page from the
//!   php-fpm that runs;
//! - php-fpm's READY=1 starts nginx, and SIGTERM stops nginx before php-fpm.
//!
//! They need nginx and php-fpm8.2 (`scripts/install-deps` installs them).

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::http::{Load, Record, free_port, get};
use common::kubelet::project;
use common::static_build::repo;
use common::*;

/// www-data in Debian, the image's USER.
const WWW_DATA: u32 = 33;

fn example(file: &str) -> String {
    let path = repo("examples/fat-container").join(file);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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

/// `text` with every `from` of `pairs` replaced in one pass (a path already
/// rewritten into the sandbox, which is under /tmp too, is not rewritten
/// again), and every replacement counted in `used`.
fn rewrite(text: &str, pairs: &[(String, String)], used: &mut [bool]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while let Some(c) = rest.chars().next() {
        for (i, (from, to)) in pairs.iter().enumerate() {
            if let Some(after) = rest.strip_prefix(from.as_str()) {
                out.push_str(to);
                used[i] = true;
                rest = after;
                continue 'scan;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Where the example's paths are in the image, and what they are here.
const IMAGE_PATHS: [&str; 8] = [
    "/etc/nginx/nginx.conf",
    "/etc/nginx/conf.d",
    "/etc/php/8.2/fpm/php-fpm.conf",
    "/etc/php/8.2/fpm/pool.d",
    "/run/php/",
    "/run/tend/",
    "/tmp/",
    "/var/www/app",
];

/// The example running as PID 1 in a sandbox.
struct Fat {
    sb: Sandbox,
    port: u16,
    cfg: PathBuf,
    /// The example's paths and port, and where they are in the sandbox.
    pairs: Vec<(String, String)>,
    tend: Tend,
}

impl Fat {
    /// Lays the example out in a sandbox, starts it as www-data, and waits
    /// until the page is served and tend is ready.
    fn start() -> Fat {
        require("nginx");
        require("php-fpm8.2");
        let sb = Sandbox::new();
        let port = free_port();
        let at = |rel: &str| sb.path(rel).display().to_string();
        let targets = [
            at("nginx.conf"),
            at("nginx-conf"),
            at("php-fpm.conf"),
            at("php-pool"),
            at("run/php/"),
            at("run/tend/"),
            at("tmp/"),
            at("www"),
        ];
        let mut pairs: Vec<(String, String)> = IMAGE_PATHS
            .iter()
            .zip(targets)
            .map(|(from, to)| (from.to_string(), to))
            .collect();
        pairs.push(("listen 8080".into(), format!("listen 127.0.0.1:{port}")));
        let mut used = vec![false; pairs.len()];

        // What the image holds, and the two ConfigMap volumes.
        for (file, to) in [
            ("supervisor.toml", "supervisor.toml"),
            ("nginx.conf", "nginx.conf"),
            ("php-fpm.conf", "php-fpm.conf"),
            ("www/index.php", "www/index.php"),
        ] {
            sb.write(to, &rewrite(&example(file), &pairs, &mut used));
        }
        let site = rewrite(&example("conf.d/app.conf"), &pairs, &mut used);
        let pool = rewrite(&example("pool.d/www.conf"), &pairs, &mut used);
        project(&sb.path("nginx-conf"), &[("app.conf", &site)]);
        project(&sb.path("php-pool"), &[("www.conf", &pool)]);
        for ((from, _), used) in pairs.iter().zip(&used) {
            assert!(used, "{from:?} is in none of the example's files");
        }
        for dir in sb.path("").ancestors().skip(1) {
            let mode = fs::metadata(dir).unwrap().permissions().mode();
            assert!(
                mode & 0o001 != 0,
                "www-data cannot reach the sandbox through {}: set TMPDIR to a directory it can",
                dir.display()
            );
        }
        // Writable by www-data: what the manifest mounts as emptyDirs, and
        // the sandbox itself ($TMPDIR, where tend makes its notify socket).
        for dir in ["", "run/php", "run/tend", "tmp"] {
            fs::create_dir_all(sb.path(dir)).unwrap();
            chown(sb.path(dir), Some(WWW_DATA), Some(WWW_DATA)).unwrap();
        }
        fs::set_permissions(sb.path(""), fs::Permissions::from_mode(0o755)).unwrap();

        let cfg = sb.path("supervisor.toml");
        let tend = sb.tend().run_as(WWW_DATA, &cfg).start();
        let fat = Fat {
            sb,
            port,
            cfg,
            pairs,
            tend,
        };
        let page = wait_for("the page", secs(20.0), || get(port).ok());
        assert_eq!(page, "hello from php v1 | nginx v1");
        wait_for("the ready file", secs(10.0), || {
            fat.ready().exists().then_some(())
        });
        fat
    }

    fn ready(&self) -> PathBuf {
        self.sb.path("run/tend/ready")
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_slice(&fs::read(self.sb.path("run/tend/status.json")).unwrap()).unwrap()
    }

    /// A ConfigMap update: the example's file, with `(from, to)` replaced.
    fn update(&self, volume: &str, key: &str, file: &str, from: &str, to: &str) {
        let text = example(file);
        assert!(text.contains(from), "{from:?} is not in {file}");
        let mut used = vec![false; self.pairs.len()];
        let text = rewrite(&text.replace(from, to), &self.pairs, &mut used);
        project(&self.sb.path(volume), &[(key, &text)]);
    }

    fn pool(&self, from: &str, to: &str) {
        self.update("php-pool", "www.conf", "pool.d/www.conf", from, to);
    }

    fn site(&self, from: &str, to: &str) {
        self.update("nginx-conf", "app.conf", "conf.d/app.conf", from, to);
    }

    /// The master and worker pids of nginx or php-fpm, as the host sees them.
    fn processes(&mut self, master: &str) -> (i32, Vec<i32>) {
        let pid = common::svc::host_pid_of(&mut self.tend, master);
        (pid, children(pid))
    }

    /// Asserts that php-fpm was not reloaded since `before` (its master and
    /// workers then): the same master, and every worker still there (a
    /// reload replaces them all; pm = dynamic may add one under load).
    fn php_untouched(&mut self, before: &(i32, Vec<i32>)) {
        let now = self.processes("php-fpm: master");
        assert_eq!(now.0, before.0, "php-fpm's master");
        assert!(
            before.1.iter().all(|w| now.1.contains(w)),
            "php-fpm's workers {:?}, then {:?}",
            before.1,
            now.1
        );
    }

    /// SIGTERM: nginx stops first (SIGQUIT, its graceful stop), then
    /// php-fpm (SIGQUIT too); tend exits with nginx's status, 0. Returns
    /// tend's whole output (its own lines, nginx's and php-fpm's), which
    /// only tend's exit makes final.
    fn stop(mut self) -> String {
        let (code, err) = self.tend.stop(secs(30.0));
        assert_eq!(code, 0, "nginx's status");
        let at = |text: &str| {
            err.find(text)
                .unwrap_or_else(|| panic!("no {text:?} in:\n{err}"))
        };
        // The services' own lines, in the order they wrote them (tend's own
        // lines go through a buffer of their own, and may come later): the
        // nginx master said goodbye before php-fpm was asked to finish.
        let quit = at("signal 3 (SIGQUIT) received");
        let master = err[..quit].trim_end().rsplit(' ').next().unwrap(); // "8#8:"
        assert!(master.ends_with(':'), "{master:?}");
        let order = [
            quit,
            at(&format!("{master} exit\n")),
            at("NOTICE: Finishing ..."),
            at("NOTICE: exiting, bye-bye!"),
        ];
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "nginx stops, then php-fpm:\n{err}"
        );
        assert!(get(self.port).is_err(), "nginx is gone");
        err
    }
}

/// Lines of tend's output `err` holding `text`.
fn said(err: &str, text: &str) -> usize {
    err.matches(text).count()
}

/// The children of `pid`, sorted.
fn children(pid: i32) -> Vec<i32> {
    let list = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let mut pids: Vec<i32> = list
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    pids.sort();
    pids
}

/// Asserts that every request of the load was answered, and more than `min`.
fn none_failed(records: &[Record], min: usize) {
    let failures: Vec<&String> = records
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert!(
        records.len() > min,
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
}

#[test]
fn php_fpm_starts_first_and_nginx_once_it_said_ready() {
    let fat = Fat::start();
    // The READY=1 php-fpm sends (notify = true) is what starts nginx
    // (after = ["php"]): tend hears it before it starts nginx.
    let php_says = |l: &str| l.contains("NOTICE: ready to handle connections");
    let php_ready = |l: &str| l.contains("the service is ready");
    let nginx = |l: &str| l.contains("service started") && l.contains("[\"nginx\"");
    let (err, [php_says, php_ready, nginx]) = wait_for("the three lines", secs(10.0), || {
        let err = fat.tend.stderr();
        let at = |what: &dyn Fn(&str) -> bool| err.lines().position(what);
        let found = [at(&php_says)?, at(&php_ready)?, at(&nginx)?];
        Some((err, found))
    });
    assert!(php_says < php_ready, "{err}");
    assert!(php_ready < nginx, "{err}");
    let st = fat.status();
    let services: Vec<(&str, &str, bool)> = st["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap(),
                s["state"].as_str().unwrap(),
                s["ready"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        services,
        [("php", "running", true), ("nginx", "running", true)]
    );
    assert_eq!(st["services"][1]["main"], true);
    let watches: Vec<(&str, &str, &str)> = st["watches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap(),
                w["service"].as_str().unwrap(),
                w["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        watches,
        [
            ("php-pool", "php", "applied"),
            ("nginx", "nginx", "applied")
        ]
    );
    // `tend status` lists both, as a person reads it.
    let out = Command::new(TEND)
        .args(["status", "--config"])
        .arg(&fat.cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("php: running"), "{text}");
    assert!(text.contains("nginx (main): running"), "{text}");
    // Everything runs as www-data.
    let mut fat = fat;
    for master in ["php-fpm: master", "nginx: master"] {
        let (pid, workers) = fat.processes(master);
        assert!(!workers.is_empty(), "{master} has workers");
        for p in std::iter::once(pid).chain(workers) {
            let status = fs::read_to_string(format!("/proc/{p}/status")).unwrap();
            assert!(
                status.contains("\nUid:\t33\t33\t33\t33\n"),
                "{master}: {status}"
            );
        }
    }
    fat.stop();
}

#[test]
fn a_pool_change_reloads_php_fpm_alone_and_no_request_fails() {
    let mut fat = Fat::start();
    let (nginx, nginx_workers) = fat.processes("nginx: master");
    let (php, php_workers) = fat.processes("php-fpm: master");
    let load = Load::workers(2, fat.port, 10_000, secs(60.0), secs(0.002));
    let started = Instant::now();
    wait_for("answers", secs(10.0), || {
        (load.since(started).len() > 50).then_some(())
    });

    let swap = Instant::now();
    fat.pool("hello from php v1", "hello from php v2");
    load.wait_body("hello from php v2 | nginx v1", swap, secs(10.0));
    let after = Instant::now();
    wait_for("more answers", secs(10.0), || {
        (load.since(after).len() > 50).then_some(())
    });
    let records = load.finish();
    none_failed(&records, 100);
    let last = &records[records.len() - 1].1;
    assert_eq!(last.as_deref(), Ok("hello from php v2 | nginx v1"));

    // php-fpm reloaded: new workers under the same master (SIGUSR2 makes it
    // exec itself in place). nginx was not touched: the same master and the
    // same workers.
    let (php_now, php_workers_now) = fat.processes("php-fpm: master");
    assert_eq!(php_now, php);
    assert!(
        php_workers_now.iter().all(|w| !php_workers.contains(w)),
        "{php_workers:?} then {php_workers_now:?}"
    );
    assert_eq!(fat.processes("nginx: master"), (nginx, nginx_workers));
    // php-fpm said READY=1 again after its reload, and tend is ready.
    wait_for("ready", secs(5.0), || fat.ready().exists().then_some(()));
    assert_eq!(fat.status()["watches"][0]["result"], "applied");
    let err = fat.stop();
    assert_eq!(said(&err, "sent SIGUSR2 to the service"), 1, "{err}");
    assert_eq!(said(&err, "NOTICE: Reloading in progress"), 1, "{err}");
    assert_eq!(said(&err, "SIGHUP"), 0, "nginx got no SIGHUP:\n{err}");
}

/// Updates closer together than a reload takes: each SIGUSR2 may reach
/// php-fpm while it is still reloading (it holds them back across its own
/// exec), and the last pool is the one served.
#[test]
fn pool_changes_in_quick_succession_end_on_the_last_one() {
    let mut fat = Fat::start();
    let (php, _) = fat.processes("php-fpm: master");
    let load = Load::workers(2, fat.port, 10_000, secs(60.0), secs(0.002));
    let swap = Instant::now();
    for i in 2..=6 {
        fat.pool("hello from php v1", &format!("hello from php v{i}"));
        std::thread::sleep(secs(0.03));
    }
    load.wait_body("hello from php v6 | nginx v1", swap, secs(10.0));
    wait_for("ready", secs(10.0), || fat.ready().exists().then_some(()));
    let after = Instant::now();
    wait_for("more answers", secs(10.0), || {
        (load.since(after).len() > 20).then_some(())
    });
    let late = load.since(after);
    assert!(
        late.iter()
            .all(|(_, r)| r.as_deref() == Ok("hello from php v6 | nginx v1")),
        "{late:?}"
    );
    none_failed(&load.finish(), 20);
    assert_eq!(fat.processes("php-fpm: master").0, php, "the same master");
    let err = fat.stop();
    assert!(said(&err, "sent SIGUSR2 to the service") >= 1, "{err}");
}

#[test]
fn a_site_change_reloads_nginx_alone() {
    let mut fat = Fat::start();
    let (nginx, nginx_workers) = fat.processes("nginx: master");
    let php = fat.processes("php-fpm: master");
    let load = Load::workers(2, fat.port, 10_000, secs(60.0), secs(0.002));
    let started = Instant::now();
    wait_for("answers", secs(10.0), || {
        (load.since(started).len() > 50).then_some(())
    });

    let swap = Instant::now();
    fat.site("nginx v1", "nginx v2");
    load.wait_body("hello from php v1 | nginx v2", swap, secs(10.0));
    // nginx retires its previous workers a moment after a reload.
    wait_for("the old nginx workers to go", secs(10.0), || {
        let (_, now) = fat.processes("nginx: master");
        now.iter().all(|w| !nginx_workers.contains(w)).then_some(())
    });
    let records = load.finish();
    none_failed(&records, 50);

    assert_eq!(fat.processes("nginx: master").0, nginx);
    // php-fpm was not touched: the same master and the same workers.
    fat.php_untouched(&php);
    wait_for("ready", secs(5.0), || fat.ready().exists().then_some(()));
    let err = fat.stop();
    assert_eq!(said(&err, "sent SIGHUP to the service"), 1, "{err}");
    assert_eq!(said(&err, "signal 1 (SIGHUP) received"), 1, "{err}");
    assert_eq!(said(&err, "SIGUSR2"), 0, "php-fpm got no SIGUSR2:\n{err}");
    assert_eq!(said(&err, "Reloading in progress"), 0, "{err}");
}

#[test]
fn a_rejected_pool_change_leaves_nginx_serving_the_running_php_fpm() {
    let mut fat = Fat::start();
    let php = fat.processes("php-fpm: master");
    let load = Load::workers(2, fat.port, 10_000, secs(60.0), secs(0.002));

    // A misspelt key: `php-fpm8.2 --test` rejects it.
    let broke = Instant::now();
    fat.pool("pm.max_children = 5", "pm.max_childs = 5");
    wait_for("the ready file to go", secs(10.0), || {
        (!fat.ready().exists()).then_some(())
    });
    // The ready file goes before the status file is rewritten.
    let st = wait_for("the status to say invalid_config", secs(5.0), || {
        Some(fat.status()).filter(|st| st["state"] == "invalid_config")
    });
    assert_eq!(st["ready"], false);
    assert_eq!(st["watches"][0]["result"], "invalid", "{st}");
    assert_eq!(st["watches"][1]["result"], "applied", "{st}");
    let output = st["watches"][0]["check_output"].as_str().unwrap();
    assert!(output.contains("unknown entry 'pm.max_childs'"), "{output}");
    let (code, line) = probe(&fat.cfg);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.contains("watch \"php-pool\": invalid") && line.contains("pm.max_childs"),
        "{line}"
    );
    // Both services run on: nginx serves the page from the php-fpm that
    // runs, on its last good pool.
    let services = st["services"].as_array().unwrap();
    assert!(services.iter().all(|s| s["state"] == "running"), "{st}");
    let shown = Instant::now();
    wait_for("more answers", secs(10.0), || {
        (load.since(shown).len() > 50).then_some(())
    });
    let since_broken: Vec<Record> = load.since(broke);
    assert!(
        since_broken
            .iter()
            .all(|(_, r)| r.as_deref() == Ok("hello from php v1 | nginx v1")),
        "{:?}",
        since_broken
            .iter()
            .find(|(_, r)| r.as_deref() != Ok("hello from php v1 | nginx v1"))
    );
    fat.php_untouched(&php);
    // Before the line that says the change was rejected, tend's log would
    // have told of a reload.
    let err = fat
        .tend
        .wait_stderr("the service keeps running on the last good one", secs(5.0));
    assert_eq!(said(&err, "SIGUSR2"), 0, "{err}");

    // Fixed: applied, served, ready again.
    let fixed = Instant::now();
    fat.pool("hello from php v1", "hello from php v3");
    load.wait_body("hello from php v3 | nginx v1", fixed, secs(10.0));
    wait_for("the ready file", secs(10.0), || {
        fat.ready().exists().then_some(())
    });
    none_failed(&load.finish(), 50);
    fat.stop();
}

/// The example's ConfigMaps in kubernetes.yaml hold the example's files.
#[test]
fn the_manifest_holds_the_example_configmaps() {
    let manifest = example("kubernetes.yaml");
    for file in ["conf.d/app.conf", "pool.d/www.conf"] {
        let key = Path::new(file).file_name().unwrap().to_str().unwrap();
        let indented: String = example(file)
            .lines()
            .map(|l| {
                if l.is_empty() {
                    "\n".to_string()
                } else {
                    format!("    {l}\n")
                }
            })
            .collect();
        assert!(
            manifest.contains(&format!("  {key}: |\n{indented}")),
            "kubernetes.yaml holds {file} as it is, under {key}"
        );
    }
}
