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

/// tend as a whole, as the status file's `state` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Starting,
    Ready,
    Reloading,
    InvalidConfig,
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

/// A watch's `result` in the status file.
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    pub pid: Option<i32>,
    pub restarts: u32,
    /// The service's last STATUS= (with notify).
    #[serde(default)]
    pub status: Option<String>,
    /// Every service process: the one serving, a new one starting next to
    /// it (overlap restarts), and those being stopped.
    #[serde(default)]
    pub instances: Vec<InstanceStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub pid: i32,
    /// serving | starting | stopping
    pub state: String,
    pub ready: bool,
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
            status.updated_at = rfc3339(SystemTime::now());
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

    /// When a failed write is retried (none while writes succeed).
    pub fn deadline(&self) -> Option<std::time::Instant> {
        None
    }

    /// Retries a failed write whose time has come.
    pub fn on_deadline(&mut self, _now: std::time::Instant) {}

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

/// `2026-11-21T10:00:00.123Z`, for the status file.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}Z", rfc3339_seconds(d.as_secs()), d.subsec_millis())
}

/// `2026-11-21T10:00:00.123456Z`, for logs.
pub fn rfc3339_micros(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:06}Z", rfc3339_seconds(d.as_secs()), d.subsec_micros())
}

fn rfc3339_seconds(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's
/// `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_255_200_123);
        assert_eq!(rfc3339(t), "2026-11-21T10:00:00.123Z");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_micros(t), "2026-11-21T10:00:00.123000Z");
    }

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
            watches: vec![],
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
}
