//! Why tend cannot write in a directory it was asked to keep files in (the
//! readiness files, `tend install`'s target), and what fixes it: what tend
//! logs when a write fails, and what `tend probe` finds when the files it
//! reads are not there.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// The fix for a failure of `kind` to write in `dir`, when there is one a
/// person can apply.
pub fn fix(dir: &Path, kind: io::ErrorKind) -> Option<String> {
    let dir = dir.display();
    let uid = euid();
    match kind {
        io::ErrorKind::PermissionDenied => Some(format!(
            "make {dir} a directory that uid {uid} (tend's user) can write to: in Kubernetes an \
             emptyDir mounted there; in an image, one created owned by that user \
             (RUN install -d -o {uid} {dir})"
        )),
        io::ErrorKind::ReadOnlyFilesystem => Some(format!(
            "{dir} is on a read-only file system: mount a writable directory there (an emptyDir \
             in Kubernetes, --tmpfs {dir} with docker or podman run)"
        )),
        io::ErrorKind::StorageFull => Some(format!(
            "the file system of {dir} is full: free space on it (in Kubernetes, a larger \
             sizeLimit for the emptyDir mounted there)"
        )),
        io::ErrorKind::NotADirectory => Some(format!(
            "a file stands where a directory on the way to {dir} should be: remove it, or \
             choose another directory"
        )),
        _ => None,
    }
}

/// Why tend, running as this process's user, cannot write `file`, as far
/// as the file system shows: its directory, or the nearest one above that
/// exists, is not writable by this user (or is read-only). None when tend
/// could write it: then it is not there for another reason (tend has not
/// written it yet, or is not running).
pub fn diagnose(file: &Path) -> Option<String> {
    let dir = parent(file)?;
    let mut existing = dir;
    let meta = loop {
        match std::fs::metadata(existing) {
            Ok(m) => break m,
            // ENOTDIR: a file on the way, which the walk up then finds.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                existing = parent(existing)?
            }
            Err(e) => return Some(with_fix(format!("{}: {e}", existing.display()), dir, &e)),
        }
    };
    if !meta.is_dir() {
        let e = io::Error::from(io::ErrorKind::NotADirectory);
        return Some(with_fix(
            format!("{} is not a directory", existing.display()),
            dir,
            &e,
        ));
    }
    let e = access(existing).err()?;
    let what = if existing == dir {
        format!("uid {} cannot write in {}: {e}", euid(), existing.display())
    } else {
        format!(
            "{} does not exist, and uid {} cannot create it in {}: {e}",
            dir.display(),
            euid(),
            existing.display()
        )
    };
    Some(with_fix(what, dir, &e))
}

fn with_fix(what: String, dir: &Path, e: &io::Error) -> String {
    match fix(dir, e.kind()) {
        Some(fix) => format!("{what}; {fix}"),
        None => what,
    }
}

fn parent(p: &Path) -> Option<&Path> {
    match p.parent() {
        Some(d) if d.as_os_str().is_empty() => Some(Path::new(".")),
        other => other,
    }
}

/// Whether this process's effective user may create files in `dir`.
fn access(dir: &Path) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated path; faccessat reads it and nothing else.
    let r = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no failure and no memory effects.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_writable_directory_or_one_that_can_be_created_is_no_reason() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(diagnose(&d.path().join("status.json")), None);
        assert_eq!(diagnose(&d.path().join("run/tend/status.json")), None);
    }

    #[test]
    fn a_file_in_the_way_is_named() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("run"), "").unwrap();
        let why = diagnose(&d.path().join("run/tend/status.json")).unwrap();
        assert!(
            why.starts_with(&format!(
                "{} is not a directory; ",
                d.path().join("run").display()
            )),
            "{why}"
        );
    }

    #[test]
    fn each_kind_of_failure_has_its_fix() {
        let dir = Path::new("/run/tend");
        let fix = |k| fix(dir, k).unwrap();
        let denied = fix(io::ErrorKind::PermissionDenied);
        assert!(
            denied.contains("emptyDir") && denied.contains(&format!("install -d -o {}", euid())),
            "{denied}"
        );
        assert!(fix(io::ErrorKind::ReadOnlyFilesystem).contains("--tmpfs /run/tend"));
        assert!(fix(io::ErrorKind::StorageFull).contains("sizeLimit"));
        assert_eq!(super::fix(dir, io::ErrorKind::Interrupted), None);
    }
}
