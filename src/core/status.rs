//! What the core says of tend's state: the status file's content, which
//! `tend probe`, `tend status` and the HTTP server read back.

use serde::{Deserialize, Serialize};

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
    /// Applied; `verify` has not passed yet.
    Verifying,
    /// `verify` did not pass in time: the previous generation was put back.
    RolledBack,
}

impl WatchResult {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchResult::Pending => "pending",
            WatchResult::Applied => "applied",
            WatchResult::Invalid => "invalid",
            WatchResult::ActionFailed => "action_failed",
            WatchResult::Verifying => "verifying",
            WatchResult::RolledBack => "rolled_back",
        }
    }

    /// The newest content was rejected: by its check, or by its verify.
    pub fn rejected(self) -> bool {
        matches!(self, WatchResult::Invalid | WatchResult::RolledBack)
    }
}

/// What the status file says. `updated_at` is filled in when the status is
/// published (the time it last changed), so it never makes two statuses
/// differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub ready: bool,
    /// The main service.
    pub service: ServiceStatus,
    /// Every service, the main one too.
    #[serde(default)]
    pub services: Vec<ServiceEntry>,
    pub watches: Vec<WatchStatus>,
    #[serde(default)]
    pub updated_at: String,
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
    /// The service its action touches.
    #[serde(default)]
    pub service: String,
    pub result: WatchResult,
    pub check_output: String,
    /// Its paths that do not exist (not with `optional`): tend is not
    /// ready until they do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    pub changed_at: Option<String>,
    /// A valid change waits for its `splay` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_at: Option<String>,
}

/// One service, as the status file's `services` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceEntry {
    pub name: String,
    /// waiting | starting | running | restarting | backing_off | failing |
    /// stopping | done | ended
    pub state: String,
    pub pid: Option<i32>,
    pub ready: bool,
    pub restarts: u32,
    pub main: bool,
    pub required: bool,
    /// How its last process ended ("exit code 3", "killed by SIGKILL").
    pub last_exit: Option<String>,
    /// The same as tend would exit with: the code, or 128 + the signal.
    pub last_exit_code: Option<i32>,
    /// Its last STATUS= (with notify).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}
