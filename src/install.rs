//! `tend install DIR`: copies tend's own binary to DIR/tend, for an init
//! container that puts tend into an emptyDir which the application's
//! container, from an image built without tend, then runs as its command.
//!
//! The copy is made as tend's other files are: a new file under a random
//! name beside the target (O_EXCL|O_NOFOLLOW), written, made 0755, synced,
//! then renamed over DIR/tend, so a container that starts from DIR never
//! finds half a binary, and a second install (an init container run again)
//! replaces the first in one step and removes what a killed one left.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::status::{create_dirs, random_u64};
use crate::writable;

const MODE: u32 = 0o755;

/// Installs the running tend as `dir`/tend and prints what it did; returns
/// the exit code (0 installed, 1 not, with the reason on stderr).
pub fn run(dir: &Path) -> i32 {
    let result = own_binary().and_then(|mut source| copy_into(&mut source, dir));
    match result {
        Ok((target, size)) => {
            let _ = crate::cli::print(&format!(
                "installed {}: {}, {size} bytes\n",
                target.display(),
                crate::cli::version()
            ));
            0
        }
        Err(e) => {
            crate::cli::complain(e);
            1
        }
    }
}

/// The binary of the running process: /proc/self/exe, which is that file
/// even if its name was replaced or removed since; without /proc, the path
/// it was started by.
fn own_binary() -> Result<File, String> {
    match File::open("/proc/self/exe") {
        Ok(f) => Ok(f),
        Err(proc_error) => {
            let argv0 = std::env::args_os().next().map(PathBuf::from);
            match argv0.filter(|p| p.as_os_str().as_encoded_bytes().contains(&b'/')) {
                Some(path) => File::open(&path).map_err(|e| {
                    format!(
                        "cannot open tend's own binary: /proc/self/exe: {proc_error}, and {}: {e}",
                        path.display()
                    )
                }),
                None => Err(format!(
                    "cannot open tend's own binary: /proc/self/exe: {proc_error} (is /proc \
                     mounted?), and tend was started by a name without a path: start it by its \
                     path (/usr/local/bin/tend install DIR)"
                )),
            }
        }
    }
}

/// Copies `source` to `dir`/tend (creating `dir`), atomically; returns the
/// target and the number of bytes copied. The error says which call failed
/// on what, and the fix when there is one.
pub fn copy_into(source: &mut File, dir: &Path) -> Result<(PathBuf, u64), String> {
    let target = dir.join("tend");
    let fail = |what: String, e: &io::Error| {
        let mut msg = format!("cannot install tend as {}: {what}{e}", target.display());
        if let Some(fix) = writable::fix(dir, e.kind()) {
            msg.push_str("; ");
            msg.push_str(&fix);
        }
        msg
    };
    if let Err(e) = create_dirs(dir) {
        // Its message names the call and the directory.
        return Err(fail(String::new(), &e));
    }
    remove_leftovers(dir);
    let mut name = OsString::from(".tend.");
    name.push(format!(
        "{:016x}.tmp",
        random_u64().map_err(|e| fail("naming the temporary file: ".into(), &e))?
    ));
    let tmp = dir.join(name);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o700)
        .open(&tmp)
        .map_err(|e| {
            fail(
                format!("open(O_CREAT|O_EXCL|O_NOFOLLOW) of {}: ", tmp.display()),
                &e,
            )
        })?;
    let result = io::copy(source, &mut file)
        .map_err(|e| fail(format!("copying into {}: ", tmp.display()), &e))
        .and_then(|size| {
            // Whatever the umask: the container that runs it may be another user.
            file.set_permissions(Permissions::from_mode(MODE))
                .map_err(|e| fail(format!("fchmod() of {}: ", tmp.display()), &e))?;
            file.sync_all()
                .map_err(|e| fail(format!("fsync() of {}: ", tmp.display()), &e))?;
            drop(file);
            fs::rename(&tmp, &target).map_err(|e| {
                fail(
                    format!("rename() from {} to {}: ", tmp.display(), target.display()),
                    &e,
                )
            })?;
            Ok(size)
        });
    match result {
        Ok(size) => {
            // The rename is durable once the directory is synced; a failure
            // here leaves a complete binary, so it is only worth a warning.
            if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                crate::cli::warn(format!("fsync() of {} failed: {e}", dir.display()));
            }
            Ok((target, size))
        }
        Err(e) => {
            // Best effort: the name is random and was created here.
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Removes the temporary files an install killed in the middle left in
/// `dir` (regular files named exactly as `copy_into` names them): an init
/// container run again does not pile them up in its emptyDir.
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let ours = name
            .to_str()
            .and_then(|n| n.strip_prefix(".tend.")?.strip_suffix(".tmp"))
            .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
        if ours && entry.file_type().is_ok_and(|t| t.is_file()) {
            // Best effort: what is left only takes room.
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn source(d: &Path, content: &[u8]) -> File {
        let p = d.join("source");
        fs::write(&p, content).unwrap();
        File::open(p).unwrap()
    }

    #[test]
    fn the_copy_is_executable_whole_and_alone_in_a_new_directory() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/b");
        let (target, size) = copy_into(&mut source(d.path(), b"\x7fELF binary"), &dir).unwrap();
        assert_eq!(target, dir.join("tend"));
        assert_eq!(size, 11);
        assert_eq!(fs::read(&target).unwrap(), b"\x7fELF binary");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o755);
        assert_eq!(names(&dir), ["tend"], "no temporary file is left");
    }

    #[test]
    fn a_second_install_replaces_the_first_and_a_planted_symlink_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("bin");
        copy_into(&mut source(d.path(), b"old"), &dir).unwrap();
        copy_into(&mut source(d.path(), b"new"), &dir).unwrap();
        assert_eq!(fs::read(dir.join("tend")).unwrap(), b"new");
        let victim = d.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        fs::remove_file(dir.join("tend")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("tend")).unwrap();
        copy_into(&mut source(d.path(), b"newer"), &dir).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!fs::symlink_metadata(dir.join("tend")).unwrap().is_symlink());
        assert_eq!(names(&dir), ["tend"]);
    }

    #[test]
    fn what_an_install_killed_in_the_middle_left_is_removed_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("bin");
        fs::create_dir(&dir).unwrap();
        for name in [
            ".tend.0123456789abcdef.tmp",
            ".tend.tmp",
            "app.0123456789abcdef.tmp",
        ] {
            fs::write(dir.join(name), "x").unwrap();
        }
        fs::create_dir(dir.join(".tend.fedcba9876543210.tmp")).unwrap();
        copy_into(&mut source(d.path(), b"tend"), &dir).unwrap();
        assert_eq!(
            names(&dir),
            [
                ".tend.fedcba9876543210.tmp",
                ".tend.tmp",
                "app.0123456789abcdef.tmp",
                "tend"
            ]
        );
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_an_error_that_names_it() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("file");
        fs::write(&dir, "in the way").unwrap();
        let e = copy_into(&mut source(d.path(), b"x"), &dir).unwrap_err();
        assert!(
            e.starts_with(&format!("cannot install tend as {}/tend: ", dir.display())),
            "{e}"
        );
        assert!(e.contains("Not a directory"), "{e}");
    }

    #[test]
    fn a_directory_where_the_binary_should_be_is_an_error_and_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("bin");
        fs::create_dir_all(dir.join("tend/inside")).unwrap();
        let e = copy_into(&mut source(d.path(), b"x"), &dir).unwrap_err();
        assert!(e.contains("rename() from"), "{e}");
        assert_eq!(names(&dir), ["tend"], "the temporary file is removed");
    }
}
