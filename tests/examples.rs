//! What a user copies: every example is a valid config that keeps the
//! promises its Kubernetes manifest makes, runs locked down, and has a
//! Dockerfile that builds tend as Dockerfile.example does and copies files
//! that exist; that build command produces a binary that runs in an empty
//! root.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::static_build::{dockerfile_build_command, repo, static_tend};
use common::*;
use nix::sys::signal::Signal;
use tend::config::parse_duration;

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
        let name = dir.display();
        assert!(manifest.contains("readinessProbe:"), "{name}");
        // tend is in the image, or an init container installs it.
        let tend = if installs_tend(&manifest) {
            "/tend/tend"
        } else {
            "/usr/local/bin/tend"
        };
        assert!(
            manifest.contains(&format!("[\"{tend}\", \"probe\"")),
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
        // The longest stop, as check-config says it (each service in stop
        // order, then what is left of the container, then 2 s after
        // SIGKILL), ends before the kubelet's SIGKILL.
        let config = tend_config(&dir.join("supervisor.toml"));
        let grace = number_after(&manifest, "terminationGracePeriodSeconds:");
        let stop = longest_stop(&config);
        assert!(
            Duration::from_secs(grace) > stop,
            "{name}: terminationGracePeriodSeconds {grace} must exceed the longest stop, {stop:?}"
        );
        // Every watched path and env_from path is a volume the manifest
        // mounts, or (env_from) a watch's published copy of one.
        let published: Vec<&str> = config
            .lines()
            .filter_map(|l| Some(l.strip_prefix("publish = ")?.trim_matches('"')))
            .collect();
        let lists = config
            .lines()
            .filter_map(|l| l.strip_prefix("paths = ").or(l.strip_prefix("env_from = ")));
        for path in lists {
            for p in path.trim_matches(|c| c == '[' || c == ']').split(", ") {
                let p = p.trim_matches('"');
                assert!(
                    manifest.contains(&format!("mountPath: {p}")) || published.contains(&p),
                    "{name}: {p} is not mounted"
                );
            }
        }
    }
}

/// Whether an init container of the manifest installs tend into /tend.
fn installs_tend(manifest: &str) -> bool {
    manifest.contains("initContainers:") && manifest.contains("args: [\"install\", \"/tend\"]")
}

/// What `check-config` prints as the longest a stop can take.
fn longest_stop(config: &str) -> Duration {
    let line = config
        .lines()
        .find_map(|l| l.strip_prefix("# A stop (SIGTERM) takes at most "))
        .unwrap_or_else(|| panic!("no longest stop in:\n{config}"));
    parse_duration(line.split(':').next().unwrap()).unwrap()
}

fn tend_config(path: &Path) -> String {
    let out = Command::new(TEND)
        .args(["check-config", "--config"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_dockerfile_builds_a_static_binary_that_runs_in_an_empty_root() {
    let sb = Sandbox::new();
    // The Dockerfile's own command, into a target dir of its own.
    let binary = static_tend();
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
    // In the image, what it provides is there; outside it, not.
    assert_eq!(
        in_root(&["check-config", "--in-image", "--config", "/supervisor.toml"]).0,
        0
    );
    let outside = Command::new(TEND)
        .args(["check-config", "--in-image", "--config"])
        .arg(root.join("supervisor.toml"))
        .output()
        .unwrap();
    assert_eq!(outside.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&outside.stderr).contains("/busybox does not exist"),
        "{}",
        String::from_utf8_lossy(&outside.stderr)
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
    // The ready file goes first, the status file the probe reads just after.
    wait_for("tend probe to say not ready", secs(5.0), || {
        (in_root(&["probe", "--config", "/supervisor.toml"]).0 == 1).then_some(())
    });
    tend.signal(Signal::SIGTERM);
    assert_eq!(
        tend.wait(secs(10.0)),
        128 + 15,
        "sh has no SIGTERM trap: killed by it"
    );
}

/// The example's image: its own Dockerfile; nginx's is also Dockerfile.example.
/// Not an image of tend alone, which an init container installs from.
fn dockerfiles() -> Vec<(PathBuf, PathBuf)> {
    let mut files: Vec<(PathBuf, PathBuf)> = examples()
        .into_iter()
        .filter(|dir| !is_tend_alone(&fs::read_to_string(dir.join("Dockerfile")).unwrap()))
        .map(|dir| (dir.join("Dockerfile"), dir))
        .collect();
    files.push((repo("Dockerfile.example"), repo("examples/nginx")));
    files
}

/// A Dockerfile whose image holds tend and nothing else.
fn is_tend_alone(dockerfile: &str) -> bool {
    dockerfile.lines().any(|l| l == "FROM scratch")
}

/// The lines of the `FROM rust... AS tend` stage, up to the next FROM.
fn tend_stage(dockerfile: &str) -> Vec<&str> {
    dockerfile
        .lines()
        .skip_while(|l| !l.starts_with("FROM rust"))
        .take_while(|l| !l.is_empty())
        .collect()
}

/// The JSON array after `instruction ` in the Dockerfile.
fn exec_form(dockerfile: &str, instruction: &str) -> Vec<String> {
    let line = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{instruction} ")))
        .unwrap_or_else(|| panic!("no {instruction} in:\n{dockerfile}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{instruction} {line}: {e}"))
}

#[test]
fn every_example_has_a_dockerfile_that_builds_tend_as_the_example_does_from_files_in_the_repo() {
    let example = fs::read_to_string(repo("Dockerfile.example")).unwrap();
    let stage = tend_stage(&example);
    assert!(
        stage
            .iter()
            .any(|l| l.trim_start_matches("RUN ") == dockerfile_build_command()),
        "{stage:?}"
    );
    let ignored: Vec<String> = fs::read_to_string(repo(".dockerignore"))
        .expect("a .dockerignore")
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_matches('/').to_string())
        .collect();
    assert!(ignored.iter().any(|p| p == "target"), "{ignored:?}");
    for needed in ["Cargo.toml", "Cargo.lock", "src"] {
        assert!(!ignored.iter().any(|p| p == needed), "{needed} is ignored");
    }

    for (file, dir) in dockerfiles() {
        let name = file.display();
        let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(tend_stage(&text), stage, "{name}: the tend stage differs");
        assert!(
            text.contains(
                "COPY --from=tend /src/target/x86_64-unknown-linux-gnu/release/tend /usr/local/bin/tend\n"
            ),
            "{name}: tend at /usr/local/bin/tend, as the probes run it"
        );
        // Every COPY from the build context names files in the repository,
        // not left out of the context.
        let mut copied = Vec::new();
        for line in text.lines().skip_while(|l| !l.starts_with("FROM rust")) {
            let Some(args) = line.strip_prefix("COPY ") else {
                continue;
            };
            if args.starts_with("--from=") || args == ". ." {
                continue;
            }
            let args: Vec<&str> = args.split_whitespace().collect();
            let (dest, sources) = args.split_last().unwrap();
            for src in sources {
                assert!(repo(src).exists(), "{name}: COPY {src}: no such file");
                let top = src.split('/').next().unwrap();
                assert!(
                    !ignored.iter().any(|p| p == top),
                    "{name}: {src} is ignored"
                );
                copied.push((src.to_string(), dest.to_string()));
            }
        }
        // tend runs the example's own config. With one service, CMD is its
        // command, which `--` lets `docker run IMAGE ARGS` replace; with
        // several, the commands are the config's: no `--`, no CMD.
        let toml_path = dir.join("supervisor.toml");
        let toml_rel = toml_path
            .strip_prefix(repo(""))
            .unwrap()
            .display()
            .to_string();
        let (_, config) = copied
            .iter()
            .find(|(src, _)| *src == toml_rel)
            .unwrap_or_else(|| panic!("{name}: {toml_rel} is not copied"));
        let toml: toml::Table = fs::read_to_string(&toml_path).unwrap().parse().unwrap();
        let argv = |service: &toml::Value| -> Vec<String> {
            service["command"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        };
        let commands: Vec<Vec<String>> = match &toml["service"] {
            toml::Value::Array(services) => {
                assert_eq!(
                    exec_form(&text, "ENTRYPOINT"),
                    ["/usr/local/bin/tend", "--config", config],
                    "{name}"
                );
                assert!(
                    !text.lines().any(|l| l.starts_with("CMD ")),
                    "{name}: a CMD would be taken for tend's arguments"
                );
                services.iter().map(argv).collect()
            }
            service => {
                assert_eq!(
                    exec_form(&text, "ENTRYPOINT"),
                    ["/usr/local/bin/tend", "--config", config, "--"],
                    "{name}"
                );
                let command = argv(service);
                assert_eq!(
                    exec_form(&text, "CMD"),
                    command,
                    "{name}: CMD replaces service.command"
                );
                vec![command]
            }
        };
        // Files the config names are in the image or mounted.
        let manifest = fs::read_to_string(dir.join("kubernetes.yaml")).unwrap();
        for arg in commands.iter().flat_map(|c| &c[1..]) {
            if arg.starts_with('/') {
                let in_image = copied.iter().any(|(_, dest)| dest == arg);
                let mounted = mounts(&manifest)
                    .iter()
                    .any(|(_, at)| Path::new(arg).starts_with(at));
                assert!(
                    in_image || mounted,
                    "{name}: {arg} is neither in the image nor mounted"
                );
            }
        }
        let user = text
            .lines()
            .find_map(|l| l.strip_prefix("USER "))
            .unwrap_or_else(|| panic!("{name}: no USER"));
        assert_ne!(user, "0", "{name}");
        assert_eq!(
            user.parse::<u64>().unwrap(),
            number_after(&manifest, "runAsUser:"),
            "{name}: USER and the manifest's runAsUser"
        );
    }
}

#[test]
fn the_readme_shows_dockerfile_example_as_it_is() {
    let readme = fs::read_to_string(repo("README.md")).unwrap();
    let start = readme.find("```dockerfile\n").expect("a dockerfile block") + 14;
    let end = start + readme[start..].find("```\n").unwrap();
    let example = fs::read_to_string(repo("Dockerfile.example")).unwrap();
    assert_eq!(&readme[start..end], example);
}

#[test]
fn the_readme_shows_the_fat_container_config_as_it_is() {
    let readme = fs::read_to_string(repo("README.md")).unwrap();
    let config = fs::read_to_string(repo("examples/fat-container/supervisor.toml")).unwrap();
    assert!(
        readme.contains(&format!("```toml\n{config}```\n")),
        "README.md shows examples/fat-container/supervisor.toml as it is"
    );
}

/// The `(volume, mountPath)` pairs of every volumeMounts entry.
fn mounts(manifest: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter_map(|w| {
            let volume = w[0].strip_prefix("- name: ")?;
            let at = w[1].strip_prefix("mountPath: ")?;
            Some((volume.split(' ').next()?.to_string(), at.to_string()))
        })
        .collect()
}

/// The paths where the manifest mounts an emptyDir: writable in a read-only
/// root.
fn writable(manifest: &str) -> Vec<String> {
    let lines: Vec<&str> = manifest.lines().map(str::trim).collect();
    let empty: Vec<&str> = lines
        .windows(2)
        .filter_map(|w| {
            w[1].starts_with("emptyDir:")
                .then_some(w[0].strip_prefix("- name: ")?)
        })
        .collect();
    mounts(manifest)
        .into_iter()
        .filter(|(volume, _)| empty.contains(&volume.as_str()))
        .map(|(_, at)| at)
        .collect()
}

#[test]
fn every_manifest_runs_as_non_root_on_a_read_only_root_and_mounts_where_it_writes() {
    for dir in examples() {
        let name = dir.display();
        let manifest = fs::read_to_string(dir.join("kubernetes.yaml")).unwrap();
        for setting in [
            "runAsNonRoot: true",
            "readOnlyRootFilesystem: true",
            "allowPrivilegeEscalation: false",
            "capabilities: { drop: [ALL] }",
        ] {
            assert!(manifest.contains(setting), "{name}: no {setting}");
        }
        assert_ne!(number_after(&manifest, "runAsUser:"), 0, "{name}");
        let writable = writable(&manifest);
        let is_writable = |path: &str| writable.iter().any(|w| Path::new(path).starts_with(w));
        // tend's readiness and status files, its published copies, and its
        // notify socket.
        let config = tend_config(&dir.join("supervisor.toml"));
        for line in config.lines() {
            if let Some(file) = line
                .strip_prefix("file = ")
                .or(line.strip_prefix("status_file = "))
                .or(line.strip_prefix("publish = "))
            {
                let file = file.trim_matches('"');
                assert!(is_writable(file), "{name}: {file} is not writable");
            }
        }
        if config.contains("notify = true") {
            assert!(
                is_writable("/tmp/tend-notify") || manifest.contains("name: TMPDIR"),
                "{name}: the notify socket goes in $TMPDIR or /tmp"
            );
        }
        // nginx: a port a non-root user may bind, and writes only to emptyDirs.
        let nginx = dir.join("nginx.conf");
        if nginx.exists() {
            let mut conf = fs::read_to_string(&nginx).unwrap();
            if let Ok(site) = fs::read_to_string(dir.join("conf.d/app.conf")) {
                conf += &site;
            }
            let directives = conf.lines().map(|l| l.split('#').next().unwrap().trim());
            let mut writes = 0;
            for d in directives {
                let words: Vec<&str> = d.trim_end_matches(';').split_whitespace().collect();
                match words.as_slice() {
                    ["listen", port, ..] => {
                        let port: u16 = port.rsplit(':').next().unwrap().parse().unwrap();
                        assert!(port >= 1024, "{name}: nginx listens on {port}");
                    }
                    [key, path] if *key == "pid" || key.ends_with("_temp_path") => {
                        assert!(is_writable(path), "{name}: nginx writes {path}");
                        writes += 1;
                    }
                    _ => {}
                }
            }
            assert_eq!(writes, 6, "{name}: the pid file and five temporary paths");
        }
        // php-fpm: a pool's unix socket is made where it may write.
        let pools = fs::read_dir(dir.join("pool.d")).into_iter().flatten();
        for pool in pools.flatten() {
            let text = fs::read_to_string(pool.path()).unwrap();
            for at in text.lines().filter_map(|l| l.strip_prefix("listen = ")) {
                assert!(
                    !at.starts_with('/') || is_writable(at),
                    "{name}: php-fpm listens on {at}"
                );
            }
        }
    }
}

/// Every example can be applied to the same namespace: no two manifests
/// name an object of the same kind alike, nor select the same pods.
#[test]
fn no_two_manifests_name_the_same_object_or_select_the_same_pods() {
    let mut seen: Vec<(String, PathBuf)> = Vec::new();
    for dir in examples() {
        let manifest = fs::read_to_string(dir.join("kubernetes.yaml")).unwrap();
        for doc in manifest.split("\n---\n") {
            let lines: Vec<&str> = doc.lines().collect();
            let kind = lines
                .iter()
                .find_map(|l| l.strip_prefix("kind: "))
                .unwrap_or_else(|| panic!("{}: no kind in:\n{doc}", dir.display()));
            let object = lines
                .windows(2)
                .find_map(|w| (w[0] == "metadata:").then(|| w[1].strip_prefix("  name: "))?)
                .unwrap_or_else(|| panic!("{}: no name in:\n{doc}", dir.display()));
            let mut keys = vec![format!("{kind} {object}")];
            keys.extend(
                lines
                    .iter()
                    .filter_map(|l| l.trim().strip_prefix("matchLabels: "))
                    .map(|labels| format!("pods {labels}")),
            );
            for key in keys {
                if let Some((_, other)) = seen.iter().find(|(k, _)| *k == key) {
                    panic!("{} and {}: both have {key}", other.display(), dir.display());
                }
                seen.push((key, dir.clone()));
            }
        }
    }
}

/// The base64 value of `key:` in the manifest, decoded by openssl.
fn secret_value(manifest: &str, key: &str) -> Vec<u8> {
    let value = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key}"));
    let mut child = Command::new("openssl")
        .args(["base64", "-d", "-A"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl: run scripts/install-deps");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(value.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && !out.stdout.is_empty(),
        "{key} is not base64"
    );
    out.stdout
}

/// openssl's output for `args` on `input`, which must succeed.
fn openssl(args: &[&str], input: &Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .arg(input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_tls_secret_holds_a_certificate_and_its_key() {
    let sb = Sandbox::new();
    let manifest = fs::read_to_string(repo("examples/secret-rotation/kubernetes.yaml")).unwrap();
    let crt = sb.path("tls.crt");
    let key = sb.path("tls.key");
    fs::write(&crt, secret_value(&manifest, "tls.crt")).unwrap();
    fs::write(&key, secret_value(&manifest, "tls.key")).unwrap();
    let subject = openssl(&["x509", "-noout", "-subject", "-in"], &crt);
    assert!(subject.contains("CN = example.test"), "{subject}");
    // Valid for ten more years at least: the example does not expire.
    openssl(&["x509", "-noout", "-checkend", "315360000", "-in"], &crt);
    assert_eq!(
        openssl(&["x509", "-noout", "-pubkey", "-in"], &crt),
        openssl(&["pkey", "-pubout", "-in"], &key),
        "the key is the certificate's"
    );
}

/// The block under `key: |` in the manifest, without its indentation.
fn literal_block(manifest: &str, key: &str) -> String {
    let mut lines = manifest.lines();
    let head = lines
        .find(|l| l.trim() == format!("{key}: |"))
        .unwrap_or_else(|| panic!("no {key}: | in the manifest"));
    let indent = head.len() - head.trim_start().len() + 2;
    let mut block = String::new();
    for line in lines {
        if !line.is_empty() && line.len() - line.trim_start().len() < indent {
            break;
        }
        block.push_str(line.get(indent..).unwrap_or(""));
        block.push('\n');
    }
    block
}

#[test]
fn the_any_image_example_installs_tend_from_an_image_of_its_own_and_runs_the_images_entrypoint() {
    let dir = repo("examples/any-image");
    let dockerfile = fs::read_to_string(dir.join("Dockerfile")).unwrap();
    let example = fs::read_to_string(repo("Dockerfile.example")).unwrap();
    assert_eq!(tend_stage(&dockerfile), tend_stage(&example));
    assert!(is_tend_alone(&dockerfile));
    assert!(dockerfile.contains(
        "\nCOPY --from=tend /src/target/x86_64-unknown-linux-gnu/release/tend /usr/local/bin/tend\n"
    ));
    assert_eq!(
        exec_form(&dockerfile, "ENTRYPOINT"),
        ["/usr/local/bin/tend"]
    );

    let manifest = fs::read_to_string(dir.join("kubernetes.yaml")).unwrap();
    assert!(installs_tend(&manifest));
    assert!(manifest.contains("image: registry.example.com/tend:1"));
    // The app container runs the upstream image's ENTRYPOINT and CMD after
    // tend's `--`, with the config the ConfigMap holds: this very file.
    let command = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("command: [\"/tend/tend\""))
        .expect("the app container's command is /tend/tend");
    let command: Vec<String> = serde_json::from_str(&format!("[\"/tend/tend\"{command}")).unwrap();
    assert_eq!(
        command,
        [
            "/tend/tend",
            "--config",
            "/etc/tend/supervisor.toml",
            "--",
            "/docker-entrypoint.sh"
        ]
    );
    assert!(manifest.contains("args: [\"nginx\", \"-g\", \"daemon off;\"]"));
    assert_eq!(
        literal_block(&manifest, "supervisor.toml"),
        fs::read_to_string(dir.join("supervisor.toml")).unwrap(),
        "the ConfigMap holds examples/any-image/supervisor.toml"
    );
    let mounts = mounts(&manifest);
    for (volume, at) in [
        ("tend-bin", "/tend"),
        ("tend-config", "/etc/tend"),
        ("nginx-conf", "/etc/nginx/conf.d"),
    ] {
        assert!(
            mounts.iter().any(|(v, a)| v == volume && a == at),
            "{volume} at {at}: {mounts:?}"
        );
    }
    assert!(
        writable(&manifest).contains(&"/tend".to_string()),
        "an emptyDir at /tend"
    );
}
