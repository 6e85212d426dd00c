//! Readiness: the ready file and the status file.
//!
//! The ready file exists exactly while tend is ready. The status file holds
//! tend's state as JSON and is rewritten whenever that state changes. Both are
//! written to a temporary file in the same directory and renamed into place,
//! so a reader (a probe) never sees half a file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::config;
use crate::reload::Outcome;

/// tend as a whole, as the status file and `tend probe` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Checking the config before the first start.
    Starting,
    Ready,
    /// A change is being checked or applied, or a failed action retried.
    Reloading,
    InvalidConfig,
    /// A restart action, or the service waits out its restart back-off.
    Restarting,
    Stopping,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Reloading => "reloading",
            State::InvalidConfig => "invalid_config",
            State::Restarting => "restarting",
            State::Stopping => "stopping",
        }
    }
}

/// Where a watch's newest config stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchResult {
    /// A change is on its way through the pipeline.
    Pending,
    Applied,
    Invalid,
    ActionFailed,
}

impl WatchResult {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchResult::Pending => "pending",
            WatchResult::Applied => "applied",
            WatchResult::Invalid => "invalid",
            WatchResult::ActionFailed => "action_failed",
        }
    }
}

impl From<Outcome> for WatchResult {
    fn from(o: Outcome) -> WatchResult {
        match o {
            Outcome::Pending => WatchResult::Pending,
            Outcome::Applied => WatchResult::Applied,
            Outcome::Invalid => WatchResult::Invalid,
            Outcome::ActionFailed => WatchResult::ActionFailed,
        }
    }
}

/// What the status file says. `updated_at` is left out of the comparison
/// that decides whether anything changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub ready: bool,
    pub service: ServiceStatus,
    pub watches: Vec<WatchStatus>,
    #[serde(default)]
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    pub pid: Option<i32>,
    pub restarts: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchStatus {
    pub name: String,
    pub result: WatchResult,
    pub check_output: String,
    pub changed_at: Option<String>,
}

pub struct Readiness {
    file: Option<PathBuf>,
    status_file: Option<PathBuf>,
    last: Option<Status>,
    /// The last write error, logged once until a write succeeds again.
    failing: bool,
}

impl Readiness {
    /// Prepares the files' directories and removes a ready file left by an
    /// earlier run: tend is not ready until it says so.
    pub fn new(cfg: &config::Readiness) -> Readiness {
        let r = Readiness {
            file: cfg.file.clone(),
            status_file: cfg.status_file.clone(),
            last: None,
            failing: false,
        };
        for path in r.file.iter().chain(&r.status_file) {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                && let Err(e) = fs::create_dir_all(dir)
            {
                tracing::error!(
                    "cannot create {} for {}: {e}",
                    dir.display(),
                    path.display()
                );
            }
        }
        if let Some(f) = &r.file {
            remove(f);
        }
        r
    }

    /// Whether any readiness file is written.
    pub fn configured(&self) -> bool {
        self.file.is_some() || self.status_file.is_some()
    }

    /// Writes the files if `status` differs from what they say.
    pub fn publish(&mut self, mut status: Status) {
        if self.last.as_ref() == Some(&status) {
            return;
        }
        let was_ready = self.last.as_ref().is_some_and(|s| s.ready);
        let mut result = Ok(());
        if let Some(f) = &self.file {
            if status.ready && !was_ready {
                result = result.and(write_atomically(f, b"ready\n"));
            } else if !status.ready {
                remove(f);
            }
        }
        if let Some(f) = &self.status_file {
            status.updated_at = crate::time::rfc3339_millis(SystemTime::now());
            let mut json = serde_json::to_vec_pretty(&status).expect("status serializes");
            json.push(b'\n');
            result = result.and(write_atomically(f, &json));
            status.updated_at.clear();
        }
        match result {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::error!("cannot write the readiness files: {e}");
            }
            Err(_) => {}
        }
        self.last = Some(status);
    }

    /// Removes the ready file (tend is exiting).
    pub fn withdraw(&mut self) {
        if let Some(f) = &self.file {
            remove(f);
        }
    }
}

fn remove(path: &Path) {
    if let Err(e) = fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::error!("cannot remove the ready file {}: {e}", path.display());
    }
}

/// Writes `data` to a temporary file beside `path` and renames it over `path`.
pub fn write_atomically(path: &Path, data: &[u8]) -> io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    let result = fs::write(&tmp, data).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(ready: bool) -> Status {
        Status {
            state: if ready { State::Ready } else { State::Starting },
            ready,
            service: ServiceStatus {
                pid: Some(42),
                restarts: 0,
            },
            watches: vec![WatchStatus {
                name: "nginx".into(),
                result: WatchResult::ActionFailed,
                check_output: "ok\n".into(),
                changed_at: None,
            }],
            updated_at: String::new(),
        }
    }

    #[test]
    fn the_ready_file_exists_exactly_while_ready() {
        let d = tempfile::tempdir().unwrap();
        let cfg = config::Readiness {
            file: Some(d.path().join("run/ready")),
            status_file: Some(d.path().join("run/status.json")),
        };
        fs::create_dir_all(d.path().join("run")).unwrap();
        fs::write(d.path().join("run/ready"), "stale").unwrap();
        let mut r = Readiness::new(&cfg);
        assert!(
            !d.path().join("run/ready").exists(),
            "a stale ready file is removed"
        );
        r.publish(status(false));
        assert!(!d.path().join("run/ready").exists());
        r.publish(status(true));
        assert!(d.path().join("run/ready").exists());
        let written: Status =
            serde_json::from_slice(&fs::read(d.path().join("run/status.json")).unwrap()).unwrap();
        assert!(written.ready);
        assert_eq!(written.state, State::Ready);
        assert!(written.updated_at.ends_with('Z'));
        r.publish(status(false));
        assert!(!d.path().join("run/ready").exists());
        let leftovers: Vec<_> = fs::read_dir(d.path().join("run"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            leftovers,
            vec![std::ffi::OsString::from("status.json")],
            "no temp files left"
        );
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
}
