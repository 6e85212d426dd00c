//! A config checked against the host it is about to run on, for what the
//! file alone cannot say. What can never work here is an error: a
//! working_dir that is not there, a command written as one string with
//! spaces (`["nginx -t"]`: there is no shell to split it). What may work
//! later, or works but is likely a mistake, is a warning: a watched path that
//! does not exist yet, a relative one (it depends on the directory tend is
//! started in), a readiness file inside a watched path (tend never takes its
//! own writes for a change, but a check that reads the directory sees them),
//! an env_from path that cannot be read now (it is read again at every start).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Component, Path, PathBuf};

use super::{Action, Config, Spans, at, quote, quote_list};
use crate::envfile;

/// The warnings, or the first error, each naming its line.
pub(super) fn inspect(
    config: &Config,
    spans: &Spans,
    text: &str,
    cwd: &Path,
) -> Result<Vec<String>, String> {
    let mut run_dirs = Vec::with_capacity(config.services.len());
    for i in 0..config.services.len() {
        run_dirs.push(working_dir(config, i, spans, text, cwd)?);
    }
    commands(config, spans, text, &run_dirs)?;
    let mut warnings = readiness_files(config, spans, text, cwd);
    warnings.extend(watched_paths(config, spans, text, cwd));
    for i in 0..config.services.len() {
        warnings.extend(env_from(config, i, spans, text, cwd));
        warnings.extend(user(config, i, spans, text));
    }
    Ok(warnings)
}

/// How the config names service `i` in a message.
fn label(config: &Config, i: usize) -> String {
    match &config.services[i].name {
        Some(name) if config.services.len() > 1 => format!("service {name:?}"),
        _ => "service".to_string(),
    }
}

/// A warning when the user a service runs as is not in this machine's
/// /etc/passwd (the image's may have it).
fn user(config: &Config, i: usize, spans: &Spans, text: &str) -> Option<String> {
    let Some(super::User::Name(name)) = &config.services[i].user else {
        return None;
    };
    match crate::users::Account::look_up(name, Path::new("/")) {
        Ok(_) => None,
        Err(e) => Some(at(
            text,
            spans.services[i].user.clone().unwrap_or_default(),
            &format!(
                "{}.user: {e}; the service cannot start where that is so (check inside the image)",
                label(config, i)
            ),
        )),
    }
}

/// Where commands run (a relative program is found from there); an error
/// when working_dir is not a directory.
fn working_dir(
    config: &Config,
    i: usize,
    spans: &Spans,
    text: &str,
    cwd: &Path,
) -> Result<PathBuf, String> {
    let Some(dir) = &config.services[i].working_dir else {
        return Ok(cwd.to_path_buf());
    };
    let resolved = cwd.join(dir);
    let problem = match fs::metadata(&resolved) {
        Ok(meta) if meta.is_dir() => return Ok(resolved),
        Ok(_) => "is not a directory".to_string(),
        Err(e) => format!("cannot be used: {e}"),
    };
    Err(at(
        text,
        spans.services[i].working_dir.clone().unwrap_or_default(),
        &format!("{}.working_dir {dir:?} {problem}", label(config, i)),
    ))
}

/// An error for the first command written as one string with spaces.
fn commands(
    config: &Config,
    spans: &Spans,
    text: &str,
    run_dirs: &[PathBuf],
) -> Result<(), String> {
    // The service's env is added to tend's, so its PATH wins.
    let search_path = |i: usize| match config.services[i].env.get("PATH") {
        Some(p) => Some(OsString::from(p)),
        None => std::env::var_os("PATH"),
    };
    let mut commands = Vec::new();
    for (i, service) in config.services.iter().enumerate() {
        commands.push((
            i,
            service.command.as_ref(),
            &spans.services[i].command,
            format!("{}.command", label(config, i)),
        ));
    }
    for (w, ws) in config.watches.iter().zip(&spans.watches) {
        commands.push((
            w.service,
            w.check.as_ref(),
            &ws.check,
            format!("watch {:?}: `check`", w.name),
        ));
        if let Action::Exec(argv) = &w.action {
            commands.push((
                w.service,
                Some(argv),
                &ws.exec,
                format!("watch {:?}: `exec`", w.name),
            ));
        }
    }
    for (i, argv, span, key) in commands {
        if let Some(argv) = argv
            && let Some(problem) =
                one_word_with_spaces(argv, &run_dirs[i], search_path(i).as_deref())
        {
            return Err(at(
                text,
                span.clone().unwrap_or_default(),
                &format!("{key} {problem}"),
            ));
        }
    }
    Ok(())
}

/// A warning when a readiness file lies inside a watched path.
fn readiness_files(config: &Config, spans: &Spans, text: &str, cwd: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    let files = [
        (&config.readiness.file, &spans.file, "[readiness] file"),
        (
            &config.readiness.status_file,
            &spans.status_file,
            "[readiness] status_file",
        ),
    ];
    for (file, span, key) in files {
        let Some(file) = file else { continue };
        for w in &config.watches {
            if let Some(path) = w.paths.iter().find(|p| is_inside(cwd, file, p)) {
                warnings.push(at(
                    text,
                    span.clone().unwrap_or_default(),
                    &format!(
                        "{key} {file:?} is inside {path:?}, which watch {:?} covers: tend never \
                         takes its own writes for a change, but the watch's check sees the file; \
                         consider a place outside every watched path (e.g. /run/tend)",
                        w.name
                    ),
                ));
            }
        }
    }
    warnings
}

/// Warnings for watched paths that are relative or do not exist yet.
fn watched_paths(config: &Config, spans: &Spans, text: &str, cwd: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    for (w, ws) in config.watches.iter().zip(&spans.watches) {
        for path in &w.paths {
            let resolved = cwd.join(path);
            if path.is_relative() {
                warnings.push(at(
                    text,
                    ws.paths.clone(),
                    &format!(
                        "watch {:?}: {path:?} is relative: from the current directory it is {}; \
                         tend resolves it from the directory it is started in",
                        w.name,
                        normalize(&resolved).display()
                    ),
                ));
            }
            if !resolved.exists() {
                warnings.push(at(
                    text,
                    ws.paths.clone(),
                    &format!(
                        "watch {:?}: {} does not exist (yet); tend picks it up when it appears",
                        w.name,
                        normalize(&resolved).display()
                    ),
                ));
            }
        }
        if let (Some(dir), Some(check)) = (&w.publish, &w.check)
            && !check
                .iter()
                .any(|a| a.contains(super::CANDIDATE) || a.contains("TEND_CANDIDATE"))
        {
            warnings.push(at(
                text,
                ws.check.clone().unwrap_or_default(),
                &format!(
                    "watch {:?}: the check names neither {} nor $TEND_CANDIDATE: unless the \
                     program reads $TEND_CANDIDATE itself, it checks the mount, not the copy \
                     that is published to {}",
                    w.name,
                    super::CANDIDATE,
                    dir.display()
                ),
            ));
        }
    }
    warnings
}

/// Warnings for env_from paths that are relative, or that the service's
/// start could not read now (missing, not a file or directory, a bad line).
fn env_from(config: &Config, i: usize, spans: &Spans, text: &str, cwd: &Path) -> Vec<String> {
    let span = spans.services[i].env_from.clone().unwrap_or_default();
    let mut warnings = Vec::new();
    let label = label(config, i);
    for path in &config.services[i].env_from {
        let resolved = normalize(&cwd.join(path));
        if path.is_relative() {
            warnings.push(at(
                text,
                span.clone(),
                &format!(
                    "{label}.env_from: {path:?} is relative: from the current directory it is \
                     {}; tend resolves it from the directory it is started in",
                    resolved.display()
                ),
            ));
        }
        // A published copy is there once tend has run.
        let published = config
            .watches
            .iter()
            .filter_map(|w| w.publish.as_ref())
            .any(|dir| resolved.starts_with(normalize(&cwd.join(dir))));
        if published {
            continue;
        }
        if let Err(e) = envfile::read(&[resolved]) {
            warnings.push(at(
                text,
                span.clone(),
                &format!("{e} (it is read at every start of the service)"),
            ));
        }
    }
    warnings
}

/// Why a one-word command with spaces in it, like `["nginx -t"]`, will not
/// run: tend runs argv without a shell, so that word is the program's name,
/// and no program has it. None when the command is fine, or when a program
/// of that name does exist.
fn one_word_with_spaces(argv: &[String], run_dir: &Path, path: Option<&OsStr>) -> Option<String> {
    let [word] = argv else { return None };
    if !word.contains(char::is_whitespace) || program_exists(word, run_dir, path) {
        return None;
    }
    let shell = [
        '\'', '"', '\\', '$', '`', '|', '&', ';', '<', '>', '(', ')', '*', '?', '~',
    ];
    let suggestion = if word.contains(shell) {
        format!("[\"sh\", \"-c\", {}]", quote(word))
    } else {
        quote_list(
            &word
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>(),
        )
    };
    Some(format!(
        "is the one string {}, and no program has that name: tend runs a command without a \
         shell, so give the program and each argument as its own string: {suggestion}",
        quote(word)
    ))
}

/// Whether `word` names a file: a path, or a name found in `path`, as
/// execvp() would look for it in `run_dir`.
fn program_exists(word: &str, run_dir: &Path, path: Option<&OsStr>) -> bool {
    if word.contains('/') {
        return run_dir.join(word).exists();
    }
    path.is_some_and(|p| std::env::split_paths(p).any(|dir| run_dir.join(dir).join(word).is_file()))
}

/// Whether `file` is `dir` or lies under it, as written and with symlinks
/// resolved as far as the paths exist.
fn is_inside(cwd: &Path, file: &Path, dir: &Path) -> bool {
    let (file, dir) = (normalize(&cwd.join(file)), normalize(&cwd.join(dir)));
    if file.starts_with(&dir) {
        return true;
    }
    match (resolve(&file), resolve(&dir)) {
        (Some(f), Some(d)) => f.starts_with(d),
        _ => false,
    }
}

/// `path` with its longest existing ancestor resolved (symlinks, `..`).
fn resolve(path: &Path) -> Option<PathBuf> {
    let existing = path.ancestors().find(|a| a.exists())?;
    let rest = path.strip_prefix(existing).ok()?;
    Some(fs::canonicalize(existing).ok()?.join(rest))
}

/// An absolute path without `.` and `..`, taken as written (a `..` after a
/// symlink is resolved by `resolve`, not here).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error or the warnings for `text` with relative paths taken from `cwd`.
    fn inspect_text(text: &str, cwd: &Path) -> Result<Vec<String>, String> {
        Config::parse_on_host(text, cwd).map(|(_, warnings)| warnings)
    }

    #[test]
    fn publish_warns_of_a_check_of_the_mount_and_accepts_env_from_its_copy() {
        let d = dir();
        fs::create_dir(d.path().join("vol")).unwrap();
        let watch = "[[watch]]\npaths = [\"vol\"]\npublish = \"pub\"\non_change = \"restart\"\n";
        let text = format!(
            "[service]\nenv_from = [\"pub\"]\n{watch}check = [\"test\", \"-s\", \"vol/a\"]\n"
        );
        let warnings = inspect_text(&text, d.path()).unwrap();
        let joined = warnings.join("\n");
        assert!(
            joined.contains("names neither {candidate} nor $TEND_CANDIDATE"),
            "{joined}"
        );
        assert!(
            !joined.contains("read at every start"),
            "the copy is not there yet: {joined}"
        );
        for check in [
            "[\"test\", \"-s\", \"{candidate}/a\"]",
            "[\"sh\", \"-c\", \"test -s $TEND_CANDIDATE/a\"]",
        ] {
            let text = format!("{watch}check = {check}\n");
            let warnings = inspect_text(&text, d.path()).unwrap();
            assert!(
                !warnings.join("\n").contains("names neither"),
                "{check}: {warnings:?}"
            );
        }
    }

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_command_written_as_one_string_is_an_error_with_the_fix() {
        let d = dir();
        let e = inspect_text("[service]\ncommand = [\"nginx -t\"]\n", d.path()).unwrap_err();
        assert!(e.starts_with("line 2, column 11: service.command"), "{e}");
        assert!(e.contains("[\"nginx\", \"-t\"]"), "{e}");
        let text = "[[watch]]\npaths = [\"/\"]\ncheck = [\"nginx  -t -q\"]\non_change = \"exec\"\n\
                    exec = [\"kill -HUP $(cat /run/app.pid)\"]\n";
        let e = inspect_text(text, d.path()).unwrap_err();
        assert!(
            e.starts_with("line 3, column 9: watch \"/\": `check`"),
            "{e}"
        );
        assert!(e.contains("[\"nginx\", \"-t\", \"-q\"]"), "{e}");
        let text = "[[watch]]\npaths = [\"/\"]\non_change = \"exec\"\n\
                    exec = [\"kill -HUP $(cat /run/app.pid)\"]\n";
        let e = inspect_text(text, d.path()).unwrap_err();
        assert!(
            e.starts_with("line 4, column 8: watch \"/\": `exec`"),
            "{e}"
        );
        assert!(
            e.contains("[\"sh\", \"-c\", \"kill -HUP $(cat /run/app.pid)\"]"),
            "shell syntax needs a shell: {e}"
        );
    }

    #[test]
    fn a_program_whose_name_has_spaces_is_fine_when_it_exists() {
        let d = dir();
        fs::create_dir(d.path().join("bin")).unwrap();
        fs::write(d.path().join("bin/my tool"), "").unwrap();
        let ok = [
            "[service]\ncommand = [\"./bin/my tool\"]\n".to_string(),
            "[service]\ncommand = [\"my tool\"]\nenv = { PATH = \"/nope:bin\" }\n".to_string(),
            format!(
                "[service]\ncommand = [\"my tool\"]\nworking_dir = {:?}\nenv = {{ PATH = \"bin\" }}\n",
                d.path().display().to_string()
            ),
            "[service]\ncommand = [\"nginx -t\", \"x\"]\n".to_string(),
            "[service]\ncommand = [\"nginx\"]\n".to_string(),
        ];
        for text in ok {
            assert!(inspect_text(&text, d.path()).is_ok(), "{text}");
        }
    }

    #[test]
    fn a_working_dir_that_is_not_there_is_an_error() {
        let d = dir();
        let e = inspect_text("[service]\nworking_dir = \"/no/such/dir\"\n", d.path()).unwrap_err();
        assert!(
            e.starts_with("line 2, column 15: service.working_dir \"/no/such/dir\""),
            "{e}"
        );
        assert!(e.contains("No such file or directory"), "{e}");
        fs::write(d.path().join("file"), "").unwrap();
        let e = inspect_text("[service]\nworking_dir = \"file\"\n", d.path()).unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
        fs::create_dir(d.path().join("srv")).unwrap();
        assert!(inspect_text("[service]\nworking_dir = \"srv\"\n", d.path()).is_ok());
        assert!(
            Config::parse("[service]\nworking_dir = \"/no/such/dir\"\n").is_ok(),
            "parsing alone (tend probe) does not look at the host"
        );
    }

    #[test]
    fn a_readiness_file_inside_a_watched_path_is_a_warning() {
        let d = dir();
        fs::create_dir(d.path().join("conf")).unwrap();
        let watch =
            "[[watch]]\nname = \"app\"\npaths = [\"/etc/x\", \"conf\"]\non_change = \"none\"\n";
        for readiness in [
            "[readiness]\nstatus_file = \"conf/status.json\"\n",
            "[readiness]\nstatus_file = \"./conf/../conf/tend/status.json\"\n",
            "[readiness]\nfile = \"conf\"\n",
            "[readiness]\nfile = \"/etc/x/y/ready\"\n",
        ] {
            let w = inspect_text(&format!("{readiness}{watch}"), d.path()).unwrap();
            let e = &w[0];
            assert!(e.starts_with("line 2, column"), "{readiness}: {e}");
            assert!(e.contains("watch \"app\" covers"), "{readiness}: {e}");
        }
        // Through a symlink to the watched directory.
        std::os::unix::fs::symlink(d.path().join("conf"), d.path().join("link")).unwrap();
        let text = format!("[readiness]\nfile = \"link/ready\"\n{watch}");
        assert!(inspect_text(&text, d.path()).unwrap()[0].contains("covers"));
        // Beside it is fine, and so is a prefix that is not a parent.
        let text =
            format!("[readiness]\nfile = \"ready\"\nstatus_file = \"conf2/s.json\"\n{watch}");
        let w = inspect_text(&text, d.path()).unwrap();
        assert!(w.iter().all(|w| !w.contains("covers")), "{w:?}");
    }

    #[test]
    fn env_from_paths_that_cannot_be_read_now_are_warnings() {
        let d = dir();
        fs::write(d.path().join("good.env"), "A=1\n").unwrap();
        fs::write(d.path().join("bad.env"), "A=1\nexport B=2\n").unwrap();
        let text = format!(
            "[service]\nenv_from = [{:?}, \"/no/such/env\", \"bad.env\"]\n",
            d.path().join("good.env").display().to_string()
        );
        let warnings = inspect_text(&text, d.path()).unwrap();
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings[0].starts_with("line 2, column 12: env_from /no/such/env: does not exist"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("\"bad.env\" is relative"),
            "{warnings:?}"
        );
        assert!(
            warnings[2].contains(&format!(
                "env_from {}: line 2: starts with `export`",
                d.path().join("bad.env").display()
            )),
            "{warnings:?}"
        );
    }

    #[test]
    fn missing_and_relative_watched_paths_are_warnings() {
        let d = dir();
        fs::create_dir(d.path().join("conf")).unwrap();
        let text = "[[watch]]\nname = \"app\"\npaths = [\"conf\", \"/no/such/path\"]\non_change = \"none\"\n";
        let warnings = inspect_text(text, d.path()).unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("line 3, column 9: watch \"app\": \"conf\" is relative"));
        assert!(
            warnings[0].contains(&format!("it is {}", d.path().join("conf").display())),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("/no/such/path does not exist"),
            "{warnings:?}"
        );
        let text = "[[watch]]\npaths = [\"./later\"]\non_change = \"none\"\n";
        let warnings = inspect_text(text, d.path()).unwrap();
        assert_eq!(warnings.len(), 2, "relative, and missing: {warnings:?}");
        assert!(
            warnings[1].contains(&format!(
                "{} does not exist",
                d.path().join("later").display()
            )),
            "{warnings:?}"
        );
    }
}
