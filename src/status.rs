//! Readiness: the ready file and the status file.
//!
//! The ready file exists exactly while tend is ready. The status file holds
//! tend's state as JSON and is rewritten whenever that state changes.
//!
//! Both often live in a directory others can write to (`/run`, `/tmp`, an
//! emptyDir shared with a sidecar), and tend usually runs as root. So a file
//! is never written in place and never through a name someone could guess:
//! the content goes to a new file created with O_EXCL|O_NOFOLLOW under a
//! random name beside the target (`.status.json.0123456789abcdef.tmp`), which
//! is then renamed over it. A symlink planted anywhere is never followed, and
//! a reader (a probe) never sees half a file. Modes are set explicitly (0644,
//! directories tend creates 0755), whatever the umask.
//!
//! A tend killed while it writes leaves that temporary file: the next start
//! removes those (regular files by exactly such a name), and nothing else.
//!
//! A write that fails (a full or read-only disk) is retried with a back-off
//! until it succeeds; `deadline` says when, and exists only while a retry is
//! pending.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::config;

const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(10);

pub use crate::core::status::{
    InstanceStatus, ServiceStatus, State, Status, WatchResult, WatchStatus,
};

/// Keeps the ready file and the status file saying what tend last
/// published, retrying what could not be written.
pub struct ReadinessFiles {
    file: Option<PathBuf>,
    status_file: Option<PathBuf>,
    /// What the files should say, and since when (RFC 3339).
    wanted: Option<Status>,
    updated_at: String,
    /// Counts the changes of `wanted`.
    generation: u64,
    /// Whether the ready file exists, as far as tend knows; None at first,
    /// so that a ready file left by an earlier run is removed.
    ready_written: Option<bool>,
    /// What the status file says (without `updated_at`).
    status_written: Option<Status>,
    retry: Option<Retry>,
    /// Why the last write failed, and the fix, while it does.
    problem: Option<String>,
}

/// A write failed: try again at `at`; the one after waits `next`.
#[derive(Debug, Clone, Copy)]
struct Retry {
    at: Instant,
    next: Duration,
}

impl ReadinessFiles {
    /// At start-up: removes the temporary files an earlier tend, killed
    /// while it wrote, left beside the files.
    pub fn new(cfg: &config::Readiness) -> ReadinessFiles {
        for path in cfg.file.iter().chain(&cfg.status_file) {
            remove_temporaries(path);
        }
        ReadinessFiles {
            file: cfg.file.clone(),
            status_file: cfg.status_file.clone(),
            wanted: None,
            updated_at: String::new(),
            generation: 0,
            ready_written: None,
            status_written: None,
            retry: None,
            problem: None,
        }
    }

    /// Whether any readiness file is written.
    pub fn configured(&self) -> bool {
        self.file.is_some() || self.status_file.is_some()
    }

    /// Makes the files say `status`, if they do not already.
    pub fn publish(&mut self, status: Status, now: Instant) {
        if self.wanted.as_ref() == Some(&status) {
            return;
        }
        self.wanted = Some(status);
        self.updated_at = crate::time::rfc3339_millis(SystemTime::now());
        self.generation += 1;
        self.write(now);
    }

    /// Changes whenever the status published does, or whether it is written.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The status last published (whether or not any file is configured).
    pub fn current(&self) -> Option<&Status> {
        self.wanted.as_ref()
    }

    /// The status file's content for the status last published: the same
    /// bytes, whether or not a status file is configured.
    pub fn json(&self) -> Option<Vec<u8>> {
        self.wanted.as_ref().map(|s| render(s, &self.updated_at))
    }

    /// When a failed write is to be tried again; None when nothing failed.
    pub fn deadline(&self) -> Option<Instant> {
        self.retry.map(|r| r.at)
    }

    /// Why the files are not written, and the fix, while a write fails.
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    /// Tries the failed writes again once their deadline has come.
    pub fn retry(&mut self, now: Instant) {
        if self.retry.is_some_and(|r| now >= r.at) {
            self.write(now);
        }
    }

    /// Removes the ready file (tend is exiting).
    pub fn withdraw(&mut self) {
        if let Some(f) = &self.file
            && self.ready_written != Some(false)
            && let Err(e) = remove(f)
        {
            tracing::error!("{e}");
        }
    }

    /// Writes whatever differs from what the files say; on failure, keeps
    /// what was not written for a retry with a back-off.
    fn write(&mut self, now: Instant) {
        let Some(wanted) = self.wanted.clone() else {
            return;
        };
        // Each failure, with the file it was for.
        let mut errors: Vec<(PathBuf, io::Error)> = Vec::new();
        // The ready file goes last when tend becomes ready and first when it
        // stops being ready, so a reader of both never sees a ready file next
        // to a status that says otherwise.
        let ready = wanted.ready;
        let ready_file = |this: &mut Self, errors: &mut Vec<(PathBuf, io::Error)>| {
            if let Some(f) = &this.file
                && this.ready_written != Some(ready)
            {
                let result = if ready {
                    write_atomically(f, b"ready\n")
                } else {
                    remove(f)
                };
                match result {
                    Ok(()) => this.ready_written = Some(ready),
                    Err(e) => errors.push((f.clone(), e)),
                }
            }
        };
        if !ready {
            ready_file(self, &mut errors);
        }
        if let Some(f) = &self.status_file
            && self.status_written.as_ref() != Some(&wanted)
        {
            match write_atomically(f, &render(&wanted, &self.updated_at)) {
                Ok(()) => self.status_written = Some(wanted.clone()),
                Err(e) => errors.push((f.clone(), e)),
            }
        }
        if ready {
            ready_file(self, &mut errors);
        }
        match (errors.is_empty(), self.retry) {
            (true, None) => {}
            (true, Some(_)) => {
                self.retry = None;
                self.problem = None;
                self.generation += 1;
                tracing::info!("the readiness files are written again");
            }
            (false, previous) => {
                let wait = previous.map_or(RETRY_FIRST, |r| r.next);
                if previous.is_none() {
                    let problem = explain(&errors);
                    tracing::error!(
                        "{problem}; until then `tend probe` says not ready; retrying from \
                         {wait:?} to every {RETRY_MAX:?} until it works"
                    );
                    self.problem = Some(problem);
                    self.generation += 1;
                }
                self.retry = Some(Retry {
                    at: now + wait,
                    next: (wait * 2).min(RETRY_MAX),
                });
            }
        }
    }
}

/// What failed, file by file, and the fix for each directory.
fn explain(errors: &[(PathBuf, io::Error)]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut fixes: Vec<String> = Vec::new();
    for (file, e) in errors {
        let dir = file.parent().unwrap_or(Path::new("."));
        // Both files in one directory often fail alike: said once.
        for (part, list) in [
            (Some(e.to_string()), &mut parts),
            (crate::writable::fix(dir, e.kind()), &mut fixes),
        ] {
            if let Some(part) = part.filter(|p| !list.contains(p)) {
                list.push(part);
            }
        }
    }
    parts.extend(fixes);
    format!(
        "the readiness files cannot be written: {}",
        parts.join("; ")
    )
}

/// The status file's bytes: `status` stamped with `updated_at`.
fn render(status: &Status, updated_at: &str) -> Vec<u8> {
    let mut status = status.clone();
    status.updated_at = updated_at.to_string();
    let mut json = serde_json::to_vec_pretty(&status).expect("a status serializes");
    json.push(b'\n');
    json
}

/// Removes the ready file. One that is not there is not an error, even where
/// unlink() says otherwise (EROFS and EACCES come before the lookup).
fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if not_there(&e) => Ok(()),
        Err(e) => match fs::symlink_metadata(path) {
            Err(gone) if not_there(&gone) => Ok(()),
            _ => Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot remove the ready file {}: unlink() failed: {e}",
                    path.display()
                ),
            )),
        },
    }
}

/// ENOENT, or ENOTDIR: a file stands where a directory on the way should be.
fn not_there(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Writes `data` to a new file with a random name beside `path` (created
/// with O_EXCL|O_NOFOLLOW, mode 0644) and renames it over `path`. Creates
/// the missing directories on the way (0755).
pub fn write_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    let context =
        |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot write {}: it names no file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{:016x}.tmp", random_u64()?));
    let tmp = dir.join(tmp_name);
    let mut file = match create_new(&tmp) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create_dirs(dir)?;
            create_new(&tmp)
        }
        other => other,
    }
    .map_err(context(format!(
        "cannot write {}: open(O_CREAT|O_EXCL|O_NOFOLLOW) of {} failed",
        path.display(),
        tmp.display()
    )))?;
    let result = file
        .set_permissions(Permissions::from_mode(FILE_MODE))
        .map_err(context(format!(
            "cannot write {}: fchmod() failed",
            path.display()
        )))
        .and_then(|()| {
            file.write_all(data).map_err(context(format!(
                "cannot write {}: write() to {} failed",
                path.display(),
                tmp.display()
            )))
        })
        .and_then(|()| {
            fs::rename(&tmp, path).map_err(context(format!(
                "cannot write {}: rename() from {} failed",
                path.display(),
                tmp.display()
            )))
        });
    if result.is_err() {
        // Best effort: the name is random and was created by this call.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Whether `name` is one of the temporary names [`write_atomically`] gives
/// a file written to `target` (a file name): `.{target}.{16 hex}.tmp`.
pub fn is_temporary(target: &OsStr, name: &OsStr) -> bool {
    let hex = name
        .as_bytes()
        .strip_prefix(b".")
        .and_then(|r| r.strip_prefix(target.as_bytes()))
        .and_then(|r| r.strip_prefix(b"."))
        .and_then(|r| r.strip_suffix(b".tmp"));
    hex.is_some_and(|h| h.len() == 16 && h.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// Removes the files [`write_atomically`] left beside `path` when it was
/// cut short (tend was killed): regular files by one of its temporary
/// names, nothing else. What cannot be removed is logged.
fn remove_temporaries(path: &Path) {
    let (Some(target), Some(dir)) = (path.file_name(), path.parent()) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        // Not there yet: nothing was left in it.
        Err(e) if not_there(&e) => return,
        Err(e) => {
            tracing::warn!(
                "cannot read {} to remove what a tend stopped while it wrote {} left there: {e}",
                dir.display(),
                path.display()
            );
            return;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if is_temporary(target, &name) && entry.file_type().is_ok_and(|t| t.is_file()) {
            match fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(
                    "removed {}, left by a tend stopped while it wrote {}",
                    entry.path().display(),
                    path.display()
                ),
                Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(FILE_MODE)
        .open(path)
}

/// Creates `dir` and its missing parents with mode 0755. Directories that
/// already exist are left as they are.
pub(crate) fn create_dirs(dir: &Path) -> io::Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty())
        .take_while(
            |d| matches!(fs::symlink_metadata(d), Err(e) if e.kind() == io::ErrorKind::NotFound),
        )
        .collect();
    for d in missing.into_iter().rev() {
        match DirBuilder::new().mode(DIR_MODE).create(d) {
            Ok(()) => {}
            // Created meanwhile by someone else: theirs, not ours to chmod.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot create the directory {}: mkdir() failed: {e}",
                        d.display()
                    ),
                ));
            }
        }
        // The umask may have taken bits away. Through an fd opened without
        // following a symlink, so a directory swapped in meanwhile is not it.
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(d)
            .and_then(|f| f.set_permissions(Permissions::from_mode(DIR_MODE)))
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot set mode 0755 on the new directory {}: {e}",
                        d.display()
                    ),
                )
            })?;
    }
    Ok(())
}

/// 64 random bits for a temporary file's name.
pub(crate) fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    // GRND_NONBLOCK: PID 1 must not wait for the entropy pool (possible only
    // early at boot); the write fails instead and is retried.
    // SAFETY: getrandom writes at most bytes.len() bytes into bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    if n == bytes.len() as isize {
        Ok(u64::from_ne_bytes(bytes))
    } else {
        let e = if n < 0 {
            io::Error::last_os_error()
        } else {
            io::Error::other("short read")
        };
        Err(io::Error::new(
            e.kind(),
            format!("getrandom() failed, so no temporary file can be named: {e}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn status(ready: bool) -> Status {
        Status {
            state: if ready { State::Ready } else { State::Starting },
            ready,
            service: ServiceStatus {
                pid: Some(42),
                restarts: 0,
                status: None,
                instances: vec![],
            },
            services: vec![],
            watches: vec![WatchStatus {
                name: "nginx".into(),
                service: "nginx".into(),
                result: WatchResult::ActionFailed,
                check_output: "ok\n".into(),
                missing: vec![],
                changed_at: None,
                action_at: None,
            }],
            updated_at: String::new(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_ready_file_exists_exactly_while_ready() {
        let d = tempfile::tempdir().unwrap();
        let cfg = config::Readiness {
            invalid_config: Default::default(),
            file: Some(d.path().join("run/ready")),
            status_file: Some(d.path().join("run/status.json")),
        };
        fs::create_dir_all(d.path().join("run")).unwrap();
        fs::write(d.path().join("run/ready"), "stale").unwrap();
        let now = Instant::now();
        let mut r = ReadinessFiles::new(&cfg);
        r.publish(status(false), now);
        assert!(
            !d.path().join("run/ready").exists(),
            "a stale ready file is removed"
        );
        r.publish(status(true), now);
        assert!(d.path().join("run/ready").exists());
        let written: Status =
            serde_json::from_slice(&fs::read(d.path().join("run/status.json")).unwrap()).unwrap();
        assert!(written.ready);
        assert_eq!(written.state, State::Ready);
        assert!(written.updated_at.ends_with('Z'));
        r.publish(status(false), now);
        assert!(!d.path().join("run/ready").exists());
        assert_eq!(
            names(&d.path().join("run")),
            ["status.json"],
            "no temp files left"
        );
        assert_eq!(r.deadline(), None, "no wake-ups while the writes succeed");
    }

    #[test]
    fn the_json_keeps_its_documented_shape() {
        let json = serde_json::to_value(status(true)).unwrap();
        assert_eq!(json["state"], "ready");
        assert_eq!(json["watches"][0]["result"], "action_failed");
        assert_eq!(json["service"]["pid"], 42);
        let mut s = status(false);
        s.state = State::InvalidConfig;
        assert_eq!(serde_json::to_value(&s).unwrap()["state"], "invalid_config");
        for state in [
            State::Starting,
            State::Ready,
            State::Reloading,
            State::InvalidConfig,
            State::Restarting,
            State::Stopping,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        for result in [
            WatchResult::Pending,
            WatchResult::Applied,
            WatchResult::Invalid,
            WatchResult::ActionFailed,
        ] {
            assert_eq!(serde_json::to_value(result).unwrap(), result.as_str());
        }
    }

    #[test]
    fn temp_files_have_random_names_beside_the_target() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("status.json");
        // Fail the rename (a directory is in the way) to see the temp file's
        // name in the error; it is removed again.
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), "").unwrap();
        let e = write_atomically(&target, b"x").unwrap_err().to_string();
        let tmp = e
            .split_whitespace()
            .find(|w| w.contains(".status.json."))
            .unwrap();
        let name = Path::new(tmp).file_name().unwrap().to_str().unwrap();
        let hex = name
            .strip_prefix(".status.json.")
            .and_then(|n| n.strip_suffix(".tmp"))
            .unwrap();
        assert_eq!(hex.len(), 16, "{name}");
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{name}"
        );
        assert_eq!(names(d.path()), ["status.json"], "the temp file is removed");
    }

    #[test]
    fn temporary_files_left_by_a_killed_tend_are_removed_at_start_up_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        fs::create_dir(&run).unwrap();
        let left = [
            ".ready.0123456789abcdef.tmp",
            ".status.json.fedcba9876543210.tmp",
        ];
        for name in left {
            fs::write(run.join(name), "{\"sta").unwrap();
        }
        let others = [
            ".other.0123456789abcdef.tmp",
            ".ready.0123456789ABCDEF.tmp",
            ".ready.0123.tmp",
            ".status.json.0123456789abcdef.tmp.x",
            "status.json.0123456789abcdef.tmp",
        ];
        for name in others {
            fs::write(run.join(name), "theirs").unwrap();
        }
        fs::create_dir(run.join(".ready.1111111111111111.tmp")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", run.join(".ready.2222222222222222.tmp")).unwrap();
        ReadinessFiles::new(&config::Readiness {
            invalid_config: Default::default(),
            file: Some(run.join("ready")),
            status_file: Some(run.join("status.json")),
        });
        let mut kept: Vec<&str> = others.to_vec();
        kept.extend([".ready.1111111111111111.tmp", ".ready.2222222222222222.tmp"]);
        kept.sort();
        assert_eq!(names(&run), kept);
        // A directory that is not there yet holds nothing to remove.
        ReadinessFiles::new(&config::Readiness {
            invalid_config: Default::default(),
            file: Some(d.path().join("no/such/ready")),
            status_file: None,
        });
    }

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let target = d.path().join("ready");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_atomically(&target, b"ready\n").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!fs::symlink_metadata(&target).unwrap().is_symlink());
        assert_eq!(fs::read_to_string(&target).unwrap(), "ready\n");
    }

    #[test]
    fn modes_do_not_depend_on_the_umask() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("a/b/status.json");
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        for umask in [0o000, 0o077] {
            let _ = fs::remove_dir_all(d.path().join("a"));
            // SAFETY: umask() cannot fail. No other test looks at modes.
            let old = unsafe { libc::umask(umask) };
            let result = write_atomically(&target, b"{}");
            unsafe { libc::umask(old) };
            result.unwrap();
            assert_eq!(mode(&target), 0o644, "umask {umask:03o}");
            assert_eq!(mode(&d.path().join("a")), 0o755, "umask {umask:03o}");
            assert_eq!(mode(&d.path().join("a/b")), 0o755, "umask {umask:03o}");
        }
    }

    #[test]
    fn a_failed_write_is_retried_with_a_back_off_until_it_works() {
        let d = tempfile::tempdir().unwrap();
        // A file where the directory should be: every write fails.
        fs::write(d.path().join("run"), "in the way").unwrap();
        let cfg = config::Readiness {
            invalid_config: Default::default(),
            file: Some(d.path().join("run/ready")),
            status_file: Some(d.path().join("run/status.json")),
        };
        let t0 = Instant::now();
        let mut r = ReadinessFiles::new(&cfg);
        r.publish(status(true), t0);
        assert_eq!(r.deadline(), Some(t0 + RETRY_FIRST));
        r.retry(t0 + Duration::from_millis(50));
        assert_eq!(r.deadline(), Some(t0 + RETRY_FIRST), "not due yet");
        let t1 = t0 + RETRY_FIRST;
        r.retry(t1);
        assert_eq!(r.deadline(), Some(t1 + 2 * RETRY_FIRST), "the wait doubles");
        let mut t = t1;
        for _ in 0..20 {
            t = r.deadline().unwrap();
            r.retry(t);
        }
        assert_eq!(r.deadline(), Some(t + RETRY_MAX), "up to a limit");

        fs::remove_file(d.path().join("run")).unwrap();
        r.retry(r.deadline().unwrap());
        assert_eq!(r.deadline(), None);
        assert!(d.path().join("run/ready").exists());
        let written: Status =
            serde_json::from_slice(&fs::read(d.path().join("run/status.json")).unwrap()).unwrap();
        assert!(written.ready);
    }

    #[test]
    fn removing_a_ready_file_that_is_not_there_is_not_an_error() {
        let d = tempfile::tempdir().unwrap();
        assert!(remove(&d.path().join("ready")).is_ok());
        assert!(remove(&d.path().join("no/such/dir/ready")).is_ok());
        fs::write(d.path().join("file"), "").unwrap();
        assert!(
            remove(&d.path().join("file/ready")).is_ok(),
            "ENOTDIR: not there either"
        );
    }
}
