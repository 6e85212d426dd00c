//! The static tend of Dockerfile.example: built on this machine with the
//! Dockerfile's own `cargo build` line, into a target directory of its own.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The `RUN RUSTFLAGS=... cargo build ...` line of Dockerfile.example.
pub fn dockerfile_build_command() -> String {
    let dockerfile = fs::read_to_string(repo("Dockerfile.example")).unwrap();
    let line = dockerfile
        .lines()
        .find(|l| l.starts_with("RUN ") && l.contains("cargo build"))
        .expect("a RUN line with cargo build");
    let cmd = line.trim_start_matches("RUN ").to_string();
    assert!(
        cmd.contains("+crt-static") && cmd.contains("--target x86_64-unknown-linux-gnu"),
        "{cmd}"
    );
    cmd
}

/// Runs the Dockerfile's build command (once per test binary) with
/// `CARGO_TARGET_DIR=target/static`, and returns the binary it made.
pub fn static_tend() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = repo("target/static");
            let out = Command::new("sh")
                .args(["-c", &dockerfile_build_command()])
                .current_dir(repo(""))
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            target.join("x86_64-unknown-linux-gnu/release/tend")
        })
        .clone()
}
