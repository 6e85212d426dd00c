//! Records the git commit tend is built from, for `tend --version`.
//! "unknown" when there is no git or no repository (a crate tarball).

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TEND_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (a checkout) and the ref it
    // points to (a commit). In a worktree .git is a file naming the git dir.
    if let Some(git_dir) = git_path("--git-dir") {
        let head = git_dir.join("HEAD");
        rerun_if_changed(&head);
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let Some(reference) = text.strip_prefix("ref: ") {
                // Refs live in the common dir when HEAD is a worktree's.
                let common = git_path("--git-common-dir").unwrap_or(git_dir.clone());
                for dir in [&git_dir, &common] {
                    rerun_if_changed(&dir.join(reference.trim()));
                }
                rerun_if_changed(&common.join("packed-refs"));
            }
        }
    }
}

fn git_path(flag: &str) -> Option<std::path::PathBuf> {
    let out = Command::new("git")
        .args(["rev-parse", flag])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let path = String::from_utf8(out.stdout).ok()?;
    let path = Path::new(path.trim());
    Some(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// Only for files that exist: cargo reruns the script at every build for a
/// missing one, which would rebuild tend every time.
fn rerun_if_changed(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
