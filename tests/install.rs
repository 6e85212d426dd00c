//! `tend install DIR`: the copy an init container puts into an emptyDir for
//! an image built without tend. It runs, it replaces an earlier copy in one
//! step, and a directory that cannot take it (full, read-only) gets a line
//! that says so and the fix, and nothing half-written.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use common::*;

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn tend_install_copies_tend_into_a_new_directory_and_the_copy_runs() {
    let sb = Sandbox::new();
    let dir = sb.path("empty-dir/bin");
    for _ in 0..2 {
        let out = Command::new(TEND)
            .args(["install"])
            .arg(&dir)
            .env_remove("TEND_CONFIG")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.starts_with(&format!("installed {}/tend: tend ", dir.display())),
            "{stdout}"
        );
        assert_eq!(names(&dir), ["tend"], "nothing but the copy");
    }
    let copy = dir.join("tend");
    assert_eq!(fs::read(&copy).unwrap(), fs::read(TEND).unwrap());
    assert_eq!(
        fs::metadata(&copy).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    let version = Command::new(&copy).arg("--version").output().unwrap();
    let ours = Command::new(TEND).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert_eq!(version.stdout, ours.stdout);
}

#[test]
fn tend_install_needs_no_config_even_where_one_is_named() {
    let sb = Sandbox::new();
    let out = Command::new(TEND)
        .args(["install"])
        .arg(sb.path("bin"))
        .env("TEND_CONFIG", sb.path("no-such.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = Command::new(TEND).arg("install").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tend install needs DIR: tend install DIR")
    );
}

/// `tend install DIR` where DIR is a small tmpfs mounted with `options`, in
/// a mount namespace of its own: (exit code, stderr, what DIR holds after).
fn install_on_a_tmpfs(sb: &Sandbox, options: &str) -> (i32, String, String) {
    let dir = sb.path("volume");
    fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "mount -t tmpfs -o {options} tmpfs \"$0\" && {{ \"$1\" install \"$0\"; echo $? >&3; \
         ls -A \"$0\" >&3; }} 3>\"$2\""
    );
    let report = sb.path("report");
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .arg(&dir)
        .arg(TEND)
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report = fs::read_to_string(&report).unwrap();
    let (code, left) = report.split_once('\n').unwrap();
    (
        code.parse().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        left.to_string(),
    )
}

#[test]
fn tend_install_on_a_full_volume_says_so_and_leaves_nothing() {
    let sb = Sandbox::new();
    // Far smaller than tend.
    let (code, err, left) = install_on_a_tmpfs(&sb, "size=64k");
    assert_eq!(code, 1, "{err}");
    let dir = sb.path("volume");
    assert!(
        err.starts_with(&format!(
            "tend: cannot install tend as {}/tend: ",
            dir.display()
        )) && err.contains("No space left on device")
            && err.contains("sizeLimit"),
        "{err}"
    );
    assert_eq!(left, "", "the partial copy is removed");
}

#[test]
fn tend_install_on_a_read_only_volume_says_so_and_the_fix() {
    let sb = Sandbox::new();
    let (code, err, left) = install_on_a_tmpfs(&sb, "ro,size=64k");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Read-only file system")
            && err.contains("mount a writable directory there (an emptyDir"),
        "{err}"
    );
    assert_eq!(left, "");
}
