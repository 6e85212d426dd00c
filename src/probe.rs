//! `tend probe`: readiness for `readinessProbe: exec` in images without a
//! shell. It reads what the running tend wrote; it never talks to it.

use std::path::Path;

use crate::config;
use crate::status::{Status, WatchResult};
use crate::text;

/// Prints one line saying whether tend is ready and why not; returns the exit
/// code (0 ready, 1 not). Err when the config gives nothing to probe.
pub fn probe(readiness: &config::Readiness) -> Result<i32, String> {
    let (ready, line) = match (&readiness.status_file, &readiness.file) {
        (Some(status_file), _) => from_status(status_file),
        (None, Some(file)) => from_ready_file(file),
        (None, None) => {
            return Err(
                "[readiness] sets neither `file` nor `status_file`: there is nothing to probe"
                    .into(),
            );
        }
    };
    // The exit code is the verdict; the line only says why, so a stdout
    // that cannot take it changes nothing.
    let _ = crate::cli::print(&format!("{line}\n"));
    Ok(if ready { 0 } else { 1 })
}

fn from_ready_file(file: &Path) -> (bool, String) {
    if file.exists() {
        (true, "ready".into())
    } else {
        (
            false,
            format!("not ready: {} does not exist", file.display()),
        )
    }
}

fn from_status(path: &Path) -> (bool, String) {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return (
                false,
                format!("not ready: cannot read {}: {e}", path.display()),
            );
        }
    };
    let status: Status = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            return (
                false,
                format!(
                    "not ready: {} is not a tend status file: {e}",
                    path.display()
                ),
            );
        }
    };
    verdict(&status)
}

/// Whether `status` is ready, and the line that says so or why not: what
/// `tend probe` prints and `GET /ready` answers.
pub fn verdict(status: &Status) -> (bool, String) {
    let (mut line, problem) = if status.ready {
        // With invalid_config = "ready": the edit that was rejected, and why.
        (
            format!("ready (state {})", status.state.as_str()),
            status.watches.iter().find(|w| w.result.rejected()),
        )
    } else {
        (
            format!("not ready: state {}", status.state.as_str()),
            status
                .watches
                .iter()
                .find(|w| w.result != WatchResult::Applied),
        )
    };
    if let Some(w) = problem {
        line.push_str(&format!("; watch {:?}: {}", w.name, w.result.as_str()));
        let why = text::summary(&w.check_output);
        if !why.is_empty() {
            line.push_str(&format!(": {why}"));
        }
    }
    (status.ready, line)
}
