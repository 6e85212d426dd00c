//! A config checked against the machine it is about to run on, for what the
//! file alone cannot say. Where it is checked ([`Place`]) decides what a
//! missing thing is:
//!
//! - What can never work is an error everywhere: a command written as one
//!   string with spaces (`["nginx -t"]`: there is no shell to split it).
//! - What the image provides (a working_dir, the programs of the service,
//!   its checks, exec, verify and ready_check, a `user`) and what the pod
//!   mounts (a watched path that is not `optional`, an env_from path) is an
//!   error in the container (`check-config --in-image`) and a warning
//!   elsewhere: CI checks the file without the image.
//! - What works but is likely a mistake is a warning: a relative path (it
//!   depends on the directory tend is started in), a readiness file inside a
//!   watched path (tend never takes its own writes for a change, but a
//!   check that reads the directory sees them), two watches of one service
//!   on the same path.
//!
//! When tend starts, a working_dir that is not there is an error (the
//! service could not start); a watched path that is not there keeps tend
//! not ready until it appears (the core's decision), and a program that is
//! not there fails where it is run.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};

use super::{Action, CANDIDATE, Config, Spans, at, quote};
use crate::envfile;

/// Where a config is checked, which says what must be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `tend check-config`, anywhere (CI): what the image or the pod
    /// provides is a warning.
    Anywhere,
    /// `tend check-config --in-image`, in the container as tend will run
    /// (its volumes mounted): what the image or the pod provides and is not
    /// here is an error.
    InImage,
    /// tend starting.
    Run,
}

/// What a warning about something the image or the pod provides adds
/// outside the container.
const ELSEWHERE: &str =
    "a warning outside the container: `tend check-config --in-image` there makes it an error";

/// The warnings, or the first error, each naming its line.
pub(super) fn inspect(
    config: &Config,
    spans: &Spans,
    text: &str,
    cwd: &Path,
    place: Place,
) -> Result<Vec<String>, String> {
    let mut found = Found {
        place,
        warnings: Vec::new(),
    };
    let mut run_dirs = Vec::with_capacity(config.services.len());
    for i in 0..config.services.len() {
        run_dirs.push(working_dir(config, i, spans, text, cwd, &mut found)?);
    }
    commands(config, spans, text, &run_dirs)?;
    if place != Place::Run {
        programs(config, spans, text, &run_dirs, &mut found)?;
    }
    found
        .warnings
        .extend(readiness_files(config, spans, text, cwd));
    watched_paths(config, spans, text, cwd, &mut found)?;
    found
        .warnings
        .extend(shared_paths(config, spans, text, cwd));
    for i in 0..config.services.len() {
        env_from(config, i, spans, text, cwd, &mut found)?;
        user(config, i, spans, text, &mut found)?;
    }
    Ok(found.warnings)
}

/// The warnings so far, and where the config is checked.
struct Found {
    place: Place,
    warnings: Vec<String>,
}

impl Found {
    /// Something the image or the pod provides is not here: an error in
    /// the container, else a warning that says where it must be.
    fn missing_here(&mut self, message: String) -> Result<(), String> {
        match self.place {
            Place::InImage => Err(message),
            Place::Anywhere => {
                self.warnings.push(format!("{message}; {ELSEWHERE}"));
                Ok(())
            }
            Place::Run => {
                self.warnings.push(message);
                Ok(())
            }
        }
    }
}

/// How the config names service `i` in a message.
fn label(config: &Config, i: usize) -> String {
    match &config.services[i].name {
        Some(name) if config.services.len() > 1 => format!("service {name:?}"),
        _ => "service".to_string(),
    }
}

/// The user a service runs as must be in the image's /etc/passwd.
fn user(
    config: &Config,
    i: usize,
    spans: &Spans,
    text: &str,
    found: &mut Found,
) -> Result<(), String> {
    let Some(super::User::Name(name)) = &config.services[i].user else {
        return Ok(());
    };
    match crate::users::Account::look_up(name, Path::new("/")) {
        Ok(_) => Ok(()),
        Err(e) => found.missing_here(at(
            text,
            spans.services[i].user.clone().unwrap_or_default(),
            &format!(
                "{}.user: {e}; the service cannot start where that is so",
                label(config, i)
            ),
        )),
    }
}

/// Where commands run (a relative program is found from there). A
/// working_dir that is not a directory is an error where tend runs.
fn working_dir(
    config: &Config,
    i: usize,
    spans: &Spans,
    text: &str,
    cwd: &Path,
    found: &mut Found,
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
    let message = at(
        text,
        spans.services[i].working_dir.clone().unwrap_or_default(),
        &format!("{}.working_dir {dir:?} {problem}", label(config, i)),
    );
    match found.place {
        Place::Anywhere => found.missing_here(message)?,
        Place::InImage | Place::Run => return Err(message),
    }
    Ok(resolved)
}

/// A command the config gives.
struct Command<'a> {
    /// The service it runs for (its env and working_dir).
    service: usize,
    argv: &'a [String],
    /// Where it is written.
    span: Option<std::ops::Range<usize>>,
    /// How a message names it: `service.command`, `watch "app": `check``.
    key: String,
}

/// Every command of the config.
fn all_commands<'a>(config: &'a Config, spans: &'a Spans) -> Vec<Command<'a>> {
    let mut commands = Vec::new();
    let mut add = |service, argv: &'a [String], span: &Option<_>, key| {
        commands.push(Command {
            service,
            argv,
            span: span.clone(),
            key,
        })
    };
    for (i, service) in config.services.iter().enumerate() {
        let s = &spans.services[i];
        if let Some(argv) = &service.command {
            add(i, argv, &s.command, format!("{}.command", label(config, i)));
        }
        if let Some(argv) = &service.ready_check {
            add(
                i,
                argv,
                &s.ready_check,
                format!("{}.ready_check", label(config, i)),
            );
        }
    }
    for (w, ws) in config.watches.iter().zip(&spans.watches) {
        if let Some(argv) = &w.check {
            add(
                w.service,
                argv,
                &ws.check,
                format!("watch {:?}: `check`", w.name),
            );
        }
        if let Action::Exec(argv) = &w.action {
            add(
                w.service,
                argv,
                &ws.exec,
                format!("watch {:?}: `exec`", w.name),
            );
        }
        if let Some(argv) = &w.verify {
            add(
                w.service,
                argv,
                &ws.verify,
                format!("watch {:?}: `verify`", w.name),
            );
        }
    }
    commands
}

/// The `$PATH` service `i`'s commands are looked up in: its env's, which
/// is added to tend's, else tend's.
fn search_path(config: &Config, i: usize) -> Option<OsString> {
    match config.services[i].env.get("PATH") {
        Some(p) => Some(OsString::from(p)),
        None => std::env::var_os("PATH"),
    }
}

/// An error for the first command written as one string with spaces.
fn commands(
    config: &Config,
    spans: &Spans,
    text: &str,
    run_dirs: &[PathBuf],
) -> Result<(), String> {
    for c in all_commands(config, spans) {
        let path = search_path(config, c.service);
        if let Some(problem) = one_word_with_spaces(c.argv, &run_dirs[c.service], path.as_deref()) {
            return Err(at(
                text,
                c.span.unwrap_or_default(),
                &format!("{} {problem}", c.key),
            ));
        }
    }
    Ok(())
}

/// Every command's program must be found as tend will run it: by its path
/// from the service's working_dir, or in `$PATH`.
fn programs(
    config: &Config,
    spans: &Spans,
    text: &str,
    run_dirs: &[PathBuf],
    found: &mut Found,
) -> Result<(), String> {
    for Command {
        service: i,
        argv,
        span,
        key,
    } in all_commands(config, spans)
    {
        let program = &argv[0];
        // Named through the candidate copy, which exists only while it is checked.
        if program.contains(CANDIDATE) {
            continue;
        }
        let path = search_path(config, i);
        let Err(problem) = find_program(program, &run_dirs[i], path.as_deref()) else {
            continue;
        };
        let message = at(text, span.unwrap_or_default(), &format!("{key}: {problem}"));
        let is_service = key.ends_with(".command");
        if is_service && !config.services[i].env_from.is_empty() {
            // Its PATH may come from env_from, read when it starts.
            found.warnings.push(format!(
                "{message} (unless `env_from` sets a PATH that has it)"
            ));
        } else {
            found.missing_here(message)?;
        }
    }
    Ok(())
}

/// Why a program cannot be executed.
enum NotFound {
    /// A file of that name is there, without an execute bit.
    NotExecutable(PathBuf),
    /// A directory of that name is there, and no program.
    Directory(PathBuf),
    Missing(String),
}

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotFound::NotExecutable(file) => write!(f, "{} is not executable", file.display()),
            NotFound::Directory(dir) => {
                write!(f, "{} is a directory, not a program", dir.display())
            }
            NotFound::Missing(why) => f.write_str(why),
        }
    }
}

/// Whether `program` can be executed as execvp would find it from
/// `run_dir` with `path` (`$PATH`); else why not.
fn find_program(program: &str, run_dir: &Path, path: Option<&OsStr>) -> Result<(), NotFound> {
    let path = path.map_or(crate::process::spawn::DEFAULT_PATH, OsStr::as_bytes);
    let (mut not_executable, mut directory) = (None, None);
    for candidate in crate::process::spawn::search(program.as_bytes(), path) {
        let candidate = run_dir.join(OsStr::from_bytes(&candidate));
        match fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => return Ok(()),
            Ok(meta) if meta.is_file() => {
                not_executable.get_or_insert(candidate);
            }
            Ok(meta) if meta.is_dir() => {
                directory.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    Err(match (not_executable, directory) {
        (Some(file), _) => NotFound::NotExecutable(file),
        (None, Some(dir)) => NotFound::Directory(dir),
        (None, None) if program.contains('/') => NotFound::Missing(format!(
            "{} does not exist",
            run_dir.join(program).display()
        )),
        (None, None) => NotFound::Missing(format!(
            "{program:?} is not in $PATH ({})",
            String::from_utf8_lossy(path)
        )),
    })
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

/// Watched paths that are relative (a warning), or that do not exist: a
/// volume that is not mounted.
fn watched_paths(
    config: &Config,
    spans: &Spans,
    text: &str,
    cwd: &Path,
    found: &mut Found,
) -> Result<(), String> {
    for (w, ws) in config.watches.iter().zip(&spans.watches) {
        for path in &w.paths {
            let resolved = cwd.join(path);
            if path.is_relative() {
                found.warnings.push(at(
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
            // tend picks it up when it appears, ready meanwhile or not (the core's).
            if resolved.exists() || w.optional || found.place == Place::Run {
                continue;
            }
            found.missing_here(at(
                text,
                ws.paths.clone(),
                &format!(
                    "watch {:?}: {} does not exist: tend would not be ready until it does; \
                     mount the volume there (check the volumeMount's mountPath), or set \
                     optional = true on the watch if it may be absent",
                    w.name,
                    normalize(&resolved).display()
                ),
            ))?;
        }
        if let (Some(dir), Some(check)) = (&w.publish, &w.check)
            && !check
                .iter()
                .any(|a| a.contains(CANDIDATE) || a.contains("TEND_CANDIDATE"))
        {
            found.warnings.push(at(
                text,
                ws.check.clone().unwrap_or_default(),
                &format!(
                    "watch {:?}: the check names neither {} nor $TEND_CANDIDATE: unless the \
                     program reads $TEND_CANDIDATE itself, it checks the mount, not the copy \
                     that is published to {}",
                    w.name,
                    CANDIDATE,
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Warnings for two watches of one service on the same path, or one inside
/// the other (watches of different services on one ConfigMap are how each
/// service gets its own check and action).
fn shared_paths(config: &Config, spans: &Spans, text: &str, cwd: &Path) -> Vec<String> {
    let mut warnings = Vec::new();
    for (i, w) in config.watches.iter().enumerate() {
        for (j, p) in w.paths.iter().enumerate() {
            let p = normalize(&cwd.join(p));
            if w.paths[..j].iter().any(|q| normalize(&cwd.join(q)) == p) {
                warnings.push(at(
                    text,
                    spans.watches[i].paths.clone(),
                    &format!("watch {:?}: {} is listed twice", w.name, p.display()),
                ));
            }
        }
        for earlier in config.watches[..i]
            .iter()
            .filter(|e| e.service == w.service)
        {
            let overlap = w.paths.iter().find_map(|p| {
                let p = normalize(&cwd.join(p));
                earlier.paths.iter().find_map(|q| {
                    let q = normalize(&cwd.join(q));
                    (p.starts_with(&q) || q.starts_with(&p)).then(|| (p.clone(), q))
                })
            });
            let Some((mine, theirs)) = overlap else {
                continue;
            };
            let how = if mine == theirs {
                format!("as watch {:?} does", earlier.name)
            } else if mine.starts_with(&theirs) {
                format!(
                    "inside {}, which watch {:?} watches",
                    theirs.display(),
                    earlier.name
                )
            } else {
                format!(
                    "which holds {}, which watch {:?} watches",
                    theirs.display(),
                    earlier.name
                )
            };
            warnings.push(at(
                text,
                spans.watches[i].paths.clone(),
                &format!(
                    "watch {:?} watches {}, {how}: every change there runs both watches' \
                     checks and actions on the same service; to check it once and act once, \
                     make them one watch (`paths` takes several paths)",
                    w.name,
                    mine.display()
                ),
            ));
        }
    }
    warnings
}

/// env_from paths that are relative (a warning), or that a start of the
/// service could not read now (missing, not a file or directory, a bad
/// line): an error in the container, where the first start would fail.
fn env_from(
    config: &Config,
    i: usize,
    spans: &Spans,
    text: &str,
    cwd: &Path,
    found: &mut Found,
) -> Result<(), String> {
    let span = spans.services[i].env_from.clone().unwrap_or_default();
    let label = label(config, i);
    for path in &config.services[i].env_from {
        let resolved = normalize(&cwd.join(path));
        if path.is_relative() {
            found.warnings.push(at(
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
            found.missing_here(at(
                text,
                span.clone(),
                &format!("{e} (it is read at every start of the service)"),
            ))?;
        }
    }
    Ok(())
}

/// Why a one-word command with spaces in it, like `["nginx -t"]`, will not
/// run: tend runs argv without a shell, so that word is the program's name,
/// and no program has it. None when the command is fine, or when a program
/// of that name does exist.
fn one_word_with_spaces(argv: &[String], run_dir: &Path, path: Option<&OsStr>) -> Option<String> {
    let [word] = argv else { return None };
    let exists = !matches!(find_program(word, run_dir, path), Err(NotFound::Missing(_)));
    if !word.contains(char::is_whitespace) || exists {
        return None;
    }
    Some(format!(
        "is the one string {}, and no program has that name: tend runs a command without a \
         shell, so give the program and each argument as its own string: {}",
        quote(word),
        super::suggest_argv(word)
    ))
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

    /// The error or the warnings for `text` with relative paths taken from
    /// `cwd`, checked in the container.
    fn inspect_text(text: &str, cwd: &Path) -> Result<Vec<String>, String> {
        inspect_at(text, cwd, Place::InImage)
    }

    fn inspect_anywhere(text: &str, cwd: &Path) -> Result<Vec<String>, String> {
        inspect_at(text, cwd, Place::Anywhere)
    }

    fn inspect_at(text: &str, cwd: &Path, place: Place) -> Result<Vec<String>, String> {
        Config::parse_on_host(text, cwd, place).map(|(_, warnings)| warnings)
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
            assert!(
                inspect_at(&text, d.path(), Place::Anywhere).is_ok(),
                "{text}"
            );
        }
    }

    #[test]
    fn a_working_dir_that_is_not_there_is_an_error_where_tend_runs() {
        let d = dir();
        let text = "[service]\nworking_dir = \"/no/such/dir\"\n";
        for place in [Place::InImage, Place::Run] {
            let e = inspect_at(text, d.path(), place).unwrap_err();
            assert!(
                e.starts_with("line 2, column 15: service.working_dir \"/no/such/dir\""),
                "{e}"
            );
            assert!(e.contains("No such file or directory"), "{e}");
        }
        let w = inspect_at(text, d.path(), Place::Anywhere).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("line 2, column 15: service.working_dir \"/no/such/dir\"")
                && w[0].ends_with(ELSEWHERE),
            "{w:?}"
        );
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
    fn programs_that_are_not_here_are_errors_only_in_the_image() {
        let d = dir();
        fs::create_dir(d.path().join("bin")).unwrap();
        fs::write(d.path().join("bin/lint"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(d.path().join("bin/lint"), fs::Permissions::from_mode(0o644)).unwrap();
        let watch = "[[watch]]\nname = \"app\"\npaths = [\"/etc\"]\n";
        for (text, says) in [
            (
                "[service]\ncommand = [\"tend-no-such-program\", \"-x\"]\n".to_string(),
                "line 2, column 11: service.command: \"tend-no-such-program\" is not in $PATH (",
            ),
            (
                "[service]\nready_check = [\"tend-no-such-curl\"]\n".to_string(),
                "line 2, column 15: service.ready_check: \"tend-no-such-curl\" is not in $PATH",
            ),
            (
                format!("{watch}check = [\"tend-no-such-check\"]\non_change = \"none\"\n"),
                "line 4, column 9: watch \"app\": `check`: \"tend-no-such-check\" is not in $PATH",
            ),
            (
                format!("{watch}on_change = \"exec\"\nexec = [\"./bin/reload\"]\n"),
                "line 5, column 8: watch \"app\": `exec`: ",
            ),
            (
                format!("{watch}on_change = \"none\"\nverify = [\"bin/lint\"]\n"),
                "line 5, column 10: watch \"app\": `verify`: ",
            ),
        ] {
            let e = inspect_text(&text, d.path()).unwrap_err();
            assert!(e.starts_with(says), "{text}: {e}");
            let w = inspect_at(&text, d.path(), Place::Anywhere).unwrap();
            assert_eq!(w.len(), 1, "{text}: {w:?}");
            assert!(w[0].starts_with(says) && w[0].ends_with(ELSEWHERE), "{w:?}");
            assert!(
                inspect_at(&text, d.path(), Place::Run).is_ok(),
                "a run finds out when it runs it: {text}"
            );
        }
        let e = inspect_text(
            &format!("{watch}on_change = \"exec\"\nexec = [\"./bin/reload\"]\n"),
            d.path(),
        )
        .unwrap_err();
        assert!(
            e.ends_with(&format!(
                "{} does not exist",
                d.path().join("./bin/reload").display()
            )),
            "{e}"
        );
        let e = inspect_text(
            &format!("{watch}on_change = \"none\"\nverify = [\"bin/lint\"]\n"),
            d.path(),
        )
        .unwrap_err();
        assert!(e.ends_with("bin/lint is not executable"), "{e}");
        let e = inspect_text(
            &format!("{watch}on_change = \"none\"\nverify = [\"./bin\"]\n"),
            d.path(),
        )
        .unwrap_err();
        assert!(e.ends_with("bin is a directory, not a program"), "{e}");
        // Found: in PATH (the service's env wins over tend's), by a path
        // from the working_dir, or through the candidate copy.
        fs::set_permissions(d.path().join("bin/lint"), fs::Permissions::from_mode(0o755)).unwrap();
        for text in [
            "[service]\ncommand = [\"sh\", \"-c\", \"true\"]\n".to_string(),
            "[service]\ncommand = [\"lint\"]\nenv = { PATH = \"/nope:bin\" }\n".to_string(),
            format!(
                "[service]\ncommand = [\"bin/lint\"]\nworking_dir = {:?}\n",
                d.path().display().to_string()
            ),
            format!(
                "{watch}publish = \"/run/tend/app\"\ncheck = [\"{{candidate}}/check\"]\non_change = \"none\"\n"
            ),
        ] {
            let w = inspect_text(&text, d.path()).unwrap();
            assert!(w.iter().all(|w| !w.contains("$PATH")), "{text}: {w:?}");
        }
        // The service's PATH may come from env_from.
        fs::write(d.path().join("env"), "PATH=/opt/app/bin\n").unwrap();
        let text = "[service]\ncommand = [\"tend-app\"]\nenv_from = [\"env\"]\n";
        let w = inspect_text(text, d.path()).unwrap();
        assert!(
            w.iter().any(|w| w.contains("not in $PATH")
                && w.ends_with("(unless `env_from` sets a PATH that has it)")),
            "{w:?}"
        );
    }

    #[test]
    fn an_unknown_user_is_an_error_only_in_the_image() {
        let d = dir();
        let text = "[service]\nuser = \"tend-no-such-user\"\n";
        let e = inspect_text(text, d.path()).unwrap_err();
        assert!(e.starts_with("line 2, column 8: service.user: "), "{e}");
        let w = inspect_at(text, d.path(), Place::Anywhere).unwrap();
        assert!(
            w[0].starts_with("line 2, column 8: service.user: ") && w[0].ends_with(ELSEWHERE),
            "{w:?}"
        );
        assert!(inspect_text("[service]\nuser = \"root\"\n", d.path()).is_ok());
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
            let w = inspect_anywhere(&format!("{readiness}{watch}"), d.path()).unwrap();
            let e = &w[0];
            assert!(e.starts_with("line 2, column"), "{readiness}: {e}");
            assert!(e.contains("watch \"app\" covers"), "{readiness}: {e}");
        }
        // Through a symlink to the watched directory.
        std::os::unix::fs::symlink(d.path().join("conf"), d.path().join("link")).unwrap();
        let text = format!("[readiness]\nfile = \"link/ready\"\n{watch}");
        assert!(inspect_anywhere(&text, d.path()).unwrap()[0].contains("covers"));
        // Beside it is fine, and so is a prefix that is not a parent.
        let text =
            format!("[readiness]\nfile = \"ready\"\nstatus_file = \"conf2/s.json\"\n{watch}");
        let w = inspect_anywhere(&text, d.path()).unwrap();
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
        let warnings = inspect_anywhere(&text, d.path()).unwrap();
        let e = inspect_text(&text, d.path()).unwrap_err();
        assert!(
            e.starts_with("line 2, column 12: env_from /no/such/env: does not exist"),
            "in the image, the first start would fail: {e}"
        );
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
    fn a_missing_watched_path_is_an_error_in_the_image_unless_optional() {
        let d = dir();
        fs::create_dir(d.path().join("conf")).unwrap();
        let text = "[[watch]]\nname = \"app\"\npaths = [\"conf\", \"/no/such/path\"]\non_change = \"none\"\n";
        let e = inspect_text(text, d.path()).unwrap_err();
        assert_eq!(
            e,
            "line 3, column 9: watch \"app\": /no/such/path does not exist: tend would not be \
             ready until it does; mount the volume there (check the volumeMount's mountPath), \
             or set optional = true on the watch if it may be absent"
        );
        let warnings = inspect_at(text, d.path(), Place::Anywhere).unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("line 3, column 9: watch \"app\": \"conf\" is relative"));
        assert!(
            warnings[0].contains(&format!("it is {}", d.path().join("conf").display())),
            "{warnings:?}"
        );
        assert_eq!(warnings[1], format!("{e}; {ELSEWHERE}"));
        // When tend runs, the core keeps it not ready until the path is there.
        let warnings = inspect_at(text, d.path(), Place::Run).unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        let optional = text.replace("on_change", "optional = true\non_change");
        for place in [Place::InImage, Place::Anywhere] {
            let warnings = inspect_at(&optional, d.path(), place).unwrap();
            assert_eq!(warnings.len(), 1, "only relative: {warnings:?}");
        }
        let text = "[[watch]]\npaths = [\"./later\"]\non_change = \"none\"\n";
        let warnings = inspect_at(text, d.path(), Place::Anywhere).unwrap();
        assert_eq!(warnings.len(), 2, "relative, and missing: {warnings:?}");
        assert!(
            warnings[1].contains(&format!(
                "{} does not exist",
                d.path().join("later").display()
            )),
            "{warnings:?}"
        );
    }

    #[test]
    fn watches_of_one_service_on_the_same_path_are_a_warning() {
        let d = dir();
        let two = |a: &str, b: &str, extra: &str| {
            format!(
                "[[service]]\nname = \"php\"\ncommand = [\"true\"]\n[[service]]\nname = \"web\"\ncommand = [\"true\"]\n\
                 [[watch]]\nname = \"a\"\npaths = [{a:?}]\non_change = \"none\"\n\
                 [[watch]]\nname = \"b\"\npaths = [{b:?}]\non_change = \"none\"\n{extra}"
            )
        };
        let shared = |w: &[String]| -> Vec<String> {
            w.iter()
                .filter(|w| w.contains("both watches"))
                .cloned()
                .collect()
        };
        let w = inspect_at(&two("/", "/", ""), d.path(), Place::Anywhere).unwrap();
        assert_eq!(
            shared(&w),
            [
                "line 13, column 9: watch \"b\" watches /, as watch \"a\" does: every change \
                 there runs both watches' checks and actions on the same service; to check it \
                 once and act once, make them one watch (`paths` takes several paths)"
            ],
            "{w:?}"
        );
        let w = inspect_at(
            &two("/etc", "/etc/../etc/app", ""),
            d.path(),
            Place::Anywhere,
        )
        .unwrap();
        assert!(
            shared(&w)[0]
                .contains("watch \"b\" watches /etc/app, inside /etc, which watch \"a\" watches: "),
            "{w:?}"
        );
        // Two services, each with its own watch on one ConfigMap: as meant.
        let w = inspect_at(
            &two("/", "/", "service = \"web\"\n"),
            d.path(),
            Place::Anywhere,
        )
        .unwrap();
        assert!(shared(&w).is_empty(), "{w:?}");
        let w = inspect_at(&two("/etc", "/etcetera", ""), d.path(), Place::Anywhere).unwrap();
        assert!(shared(&w).is_empty(), "{w:?}");
        let text = "[[watch]]\npaths = [\"/\", \"/.\"]\non_change = \"none\"\n";
        let w = inspect_at(text, d.path(), Place::Anywhere).unwrap();
        assert_eq!(w, ["line 2, column 9: watch \"/\": / is listed twice"]);
    }
}
