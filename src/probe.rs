//! `tend probe`: readiness for `readinessProbe: exec` in images without a
//! shell. It reads what the running tend wrote; it never talks to it.

use std::path::Path;

use crate::config;
use crate::status::{Status, WatchResult, WatchStatus};
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
    } else if let Some(why) = unwritable(file) {
        (false, why)
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
            let why = (e.kind() == std::io::ErrorKind::NotFound)
                .then(|| unwritable(path))
                .flatten();
            return (
                false,
                why.unwrap_or_else(|| format!("not ready: cannot read {}: {e}", path.display())),
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

/// A file tend writes is not there: the line, when tend (as this user)
/// could not have written it.
fn unwritable(file: &Path) -> Option<String> {
    crate::writable::diagnose(file)
        .map(|why| format!("not ready: tend cannot write {}: {why}", file.display()))
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
                .find(|w| !w.missing.is_empty() || w.result != WatchResult::Applied),
        )
    };
    if let Some(w) = problem {
        line.push_str(&format!("; watch {:?}: {}", w.name, watch_problem(w)));
    }
    (status.ready, line)
}

/// Why watch `w` keeps tend from being ready: a path that is not there, or
/// its result and the line of its check's output that says why.
pub fn watch_problem(w: &WatchStatus) -> String {
    if !w.missing.is_empty() {
        return format!(
            "{} {} not exist (mount the volume there, or set optional = true)",
            w.missing.join(", "),
            if w.missing.len() == 1 { "does" } else { "do" }
        );
    }
    let result = w.result.as_str();
    let why = text::summary(&w.check_output);
    // A check that says "invalid: ..." itself needs no second "invalid".
    let repeats = why
        .get(..result.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(result))
        && why[result.len()..].starts_with([':', ' ']);
    match (why.is_empty(), repeats) {
        (true, _) => result.to_string(),
        (false, true) => why,
        (false, false) => format!("{result}: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{ServiceStatus, State};

    fn status(ready: bool, watch: WatchStatus) -> Status {
        Status {
            state: if ready {
                State::Ready
            } else {
                State::InvalidConfig
            },
            ready,
            service: ServiceStatus {
                pid: Some(42),
                restarts: 0,
                status: None,
                instances: vec![],
            },
            services: vec![],
            watches: vec![watch],
            updated_at: String::new(),
        }
    }

    fn watch(result: WatchResult, output: &str, missing: &[&str]) -> WatchStatus {
        WatchStatus {
            name: "app".into(),
            service: String::new(),
            result,
            check_output: output.into(),
            missing: missing.iter().map(|m| m.to_string()).collect(),
            changed_at: None,
            action_at: None,
        }
    }

    #[test]
    fn the_line_says_why_once() {
        for (output, says) in [
            (
                "invalid: key `port` is missing\n",
                "watch \"app\": invalid: key `port` is missing",
            ),
            (
                "Invalid config at line 3\n",
                "watch \"app\": Invalid config at line 3",
            ),
            ("error: line 3\n", "watch \"app\": invalid: error: line 3"),
            (
                "invalidated cache\n",
                "watch \"app\": invalid: invalidated cache",
            ),
            ("", "watch \"app\": invalid"),
        ] {
            let (ready, line) = verdict(&status(false, watch(WatchResult::Invalid, output, &[])));
            assert!(!ready);
            assert_eq!(
                line,
                format!("not ready: state invalid_config; {says}"),
                "{output:?}"
            );
        }
    }

    #[test]
    fn a_missing_path_is_the_reason_before_the_result() {
        let (_, line) = verdict(&status(
            false,
            watch(WatchResult::Applied, "", &["/etc/app/conf.d"]),
        ));
        assert_eq!(
            line,
            "not ready: state invalid_config; watch \"app\": /etc/app/conf.d does not exist \
             (mount the volume there, or set optional = true)"
        );
        let (_, line) = verdict(&status(
            false,
            watch(WatchResult::Invalid, "bad", &["/a", "/b"]),
        ));
        assert!(
            line.ends_with("/a, /b do not exist (mount the volume there, or set optional = true)"),
            "{line}"
        );
    }
}
