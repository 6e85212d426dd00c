//! The core's vocabulary: what happens ([`Event`]), what to do
//! ([`Command`]), and the names of the things they speak of. The shell and
//! the I/O modules (the watcher, the reaper, the spawner) import these; the
//! core imports none of theirs.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use nix::unistd::Pid;

use crate::config::HttpAction;

/// A service: its index in the config's list of services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceId(pub usize);

/// A watch: its index in the config's `[[watch]]` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatchId(pub usize);

/// A keyed SHA-256 of everything a watch covers (see `watch::scan`): equal
/// fingerprints mean the same content.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub fn from_digest(digest: [u8; 32]) -> Fingerprint {
        Fingerprint(digest)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The first 12 hex digits, for logs.
    pub fn short(&self) -> String {
        self.0[..6].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

/// A fingerprint for tests: `n` repeated.
#[cfg(test)]
pub fn test_fingerprint(n: u8) -> Fingerprint {
    Fingerprint([n; 32])
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    /// The status tend itself exits with: the code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }

    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }

    /// From a `waitpid` status; None for a stop or a continue.
    pub fn from_wait_status(status: i32) -> Option<ExitStatus> {
        if libc::WIFEXITED(status) {
            Some(ExitStatus::Code(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ExitStatus::Signal(libc::WTERMSIG(status)))
        } else {
            None
        }
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exit code {c}"),
            ExitStatus::Signal(s) => write!(f, "killed by {}", crate::signals::describe(*s)),
        }
    }
}

/// The time of an event: the monotonic clock for deadlines, the wall clock
/// for what the status file shows.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub mono: Instant,
    pub wall: SystemTime,
}

/// Something that happened.
#[derive(Debug)]
pub enum Event {
    /// Only time passed (a deadline may be due). Also the first event.
    Tick,
    /// A signal other than SIGCHLD; `code` is the signalfd record's
    /// `ssi_code` (<= 0 when a process sent it with kill(), sigqueue() ...).
    Signal { signo: i32, from: u32, code: i32 },
    /// One pass of the reaper: who exited, and whether tend has no child left.
    Reaped { exits: Vec<Exit>, no_children: bool },
    /// The result of a [`Command::Spawn`] with this token.
    Spawned {
        token: u64,
        result: Result<Pid, SpawnFailure>,
    },
    /// A scan of a watch finished.
    Content(Report),
    /// A datagram on the notify socket. `chain` is the sender's pid and its
    /// ancestors' (nearest first), so the core can tell which instance's
    /// process tree it came from.
    Notify {
        chain: Vec<Pid>,
        message: Notification,
    },
    /// The watcher's answer to a [`Command::Snapshot`], [`Command::Publish`],
    /// [`Command::Rollback`] or [`Command::Withdraw`].
    Done(Done),
    /// A request on the control socket (`tend signal`, `tend restart`) from
    /// process `from`; answered by a [`Command::Answer`] to `client`.
    Control {
        client: u64,
        from: u32,
        request: ControlRequest,
    },
    /// The [`Command::CallHttp`] with this token ended after `took`: the
    /// endpoint's answer, or why there is none.
    Called {
        token: u64,
        result: Result<Answer, String>,
        took: Duration,
    },
}

/// What a reload endpoint answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: u16,
    /// The first line of the body with something on it, escaped (may be
    /// empty).
    pub line: String,
}

impl Answer {
    pub fn success(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// What `tend signal` and `tend restart` ask of one service, by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlRequest {
    /// Send signal `signo` to the service's serving instance.
    Signal { service: String, signo: i32 },
    /// Restart the service as a restart action would, or start it again.
    Restart { service: String },
}

/// What a service said on NOTIFY_SOCKET (the sd_notify protocol).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notification {
    pub ready: bool,
    pub reloading: bool,
    pub stopping: bool,
    pub status: Option<String>,
}

impl Notification {
    /// Parses newline-separated `KEY=VALUE` assignments; unknown keys (MAINPID,
    /// WATCHDOG, ...) are ignored.
    pub fn parse(datagram: &[u8]) -> Notification {
        let text = String::from_utf8_lossy(datagram);
        let mut n = Notification::default();
        for line in text.split('\n') {
            match line.split_once('=') {
                Some(("READY", "1")) => n.ready = true,
                Some(("RELOADING", "1")) => n.reloading = true,
                Some(("STOPPING", "1")) => n.stopping = true,
                Some(("STATUS", v)) => n.status = Some(v.to_string()),
                _ => {}
            }
        }
        n
    }
}

/// A reaped process.
#[derive(Debug, Clone)]
pub struct Exit {
    pub pid: Pid,
    pub status: ExitStatus,
    /// The tail of its output, for a job whose output tend collected.
    pub output: Option<String>,
}

/// Why a process could not be started.
#[derive(Debug, Clone)]
pub struct SpawnFailure {
    pub message: String,
    /// What a shell would exit with: 127 not found, 126 not executable, 1.
    pub exit_code: i32,
}

/// One completed scan of a watch (also when nothing changed).
#[derive(Debug)]
pub struct Report {
    pub watch: WatchId,
    pub fingerprint: Fingerprint,
    /// Configured paths whose own fingerprint differs from the previous
    /// report of this watch; all of them in the first.
    pub changed: Vec<PathBuf>,
    /// Regular files whose content went into the fingerprint.
    pub files: usize,
    /// Configured paths that do not exist (yet).
    pub missing: Vec<PathBuf>,
    /// What the scan could not read, as "PATH: why" (never any content).
    pub unreadable: Vec<String>,
}

/// How a request to the watcher went.
#[derive(Debug)]
pub enum Done {
    Snapshot {
        watch: WatchId,
        fingerprint: Fingerprint,
        result: Result<Candidate, SnapshotError>,
    },
    Published {
        watch: WatchId,
        fingerprint: Fingerprint,
        /// With the generation published before, when it was kept.
        result: Result<Option<PathBuf>, String>,
    },
    RolledBack {
        watch: WatchId,
        fingerprint: Fingerprint,
        result: Result<(), String>,
    },
    Withdrawn {
        watch: WatchId,
        fingerprint: Fingerprint,
        result: Result<(), String>,
    },
}

/// A candidate generation, copied from the watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub dir: PathBuf,
    /// It is the content an earlier tend rolled back (its verify failed,
    /// or was cut short): it is not applied again until it changes.
    pub rejected: bool,
}

/// Why there is no candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The content changed since the fingerprint asked for: its scan is
    /// reported as usual.
    Changed,
    /// The copy could not be made.
    Failed(String),
    /// The copy holds an `env_from` path of the service that the service's
    /// start could not read (a key that is no variable name): it is
    /// rejected like content that failed its check.
    Rejected(String),
}

/// Which generation a publication keeps besides the new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    Nothing,
    /// The one published until now.
    Published,
    /// This generation of the directory (one published before, still kept).
    Generation(PathBuf),
}

/// What an earlier tend left published for a watch, found at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The published generation's directory name.
    pub generation: String,
    /// It was stopped while a change was verified: the generation before
    /// the change was published again.
    pub rolled_back: bool,
}

/// What a process is started as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnKind {
    /// An instance of this service: its stdio, the terminal if tend has it
    /// and it is the main service, its sockets, its user.
    Service(ServiceId),
    /// A check, verify, exec action or ready_check on behalf of this
    /// service: its environment and working_dir, tend's user, output
    /// collected, stdin empty.
    Job(ServiceId),
    /// A check with `check_sockets`: a job that also gets the service's
    /// listening sockets as fds 3.. with `LISTEN_*`.
    JobWithSockets(ServiceId),
}

/// Something for the shell to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start a process; answer with [`Event::Spawned`] before anything else.
    Spawn {
        token: u64,
        argv: Vec<String>,
        kind: SpawnKind,
        /// Set on top of the environment (`TEND_CANDIDATE` for a check).
        env: Vec<(String, String)>,
    },
    /// Call an HTTP endpoint as a reload action, within `action.timeout`;
    /// answered by [`Event::Called`].
    CallHttp { token: u64, action: HttpAction },
    /// Drop the call with this token, if it is still in flight: its answer
    /// is no longer wanted (tend stops, or the core's own deadline passed).
    CancelCall { token: u64 },
    /// Copy watch `watch` into a candidate generation of its `publish`
    /// directory, if its content still has this fingerprint; answered by
    /// [`Done::Snapshot`].
    Snapshot {
        watch: WatchId,
        fingerprint: Fingerprint,
    },
    /// Make this candidate the published generation, keeping one other
    /// to roll back to when asked; answered by [`Done::Published`].
    Publish {
        watch: WatchId,
        fingerprint: Fingerprint,
        candidate: PathBuf,
        keep: Keep,
    },
    /// Publish this earlier generation again: `verify` failed for the
    /// content `fingerprint`. Answered by [`Done::RolledBack`].
    Rollback {
        watch: WatchId,
        fingerprint: Fingerprint,
        generation: PathBuf,
    },
    /// Publish again the generation `kept` to roll back to, and remove the
    /// one published after it, whose change was not applied (its action
    /// failed, or has not run): newer content, `fingerprint`, is copied
    /// next, and the directory holds two generations at most. Answered by
    /// [`Done::Withdrawn`].
    Withdraw {
        watch: WatchId,
        fingerprint: Fingerprint,
        kept: PathBuf,
    },
    /// Remove a candidate that will not be published.
    Discard { watch: WatchId, candidate: PathBuf },
    /// Pass on a signal that tend received (the shell logs it after sending).
    Forward {
        pid: Pid,
        group: bool,
        signo: i32,
        from: u32,
    },
    /// `kill(pid, signo)`, or to the process group `pid` leads.
    Signal { pid: Pid, group: bool, signo: i32 },
    /// SIGCONT as [`Command::Signal`] does, only if the process (or one of
    /// its group) is stopped: the shell looks, the core cannot.
    ContinueIfStopped { pid: Pid, group: bool },
    /// `kill(-1, signo)`: as PID 1, every process in the container.
    SignalEveryone(i32),
    /// Run one reaper pass now and report it as [`Event::Reaped`].
    Reap,
    /// Answer a [`Event::Control`] request: one line, and the exit code of
    /// the command that asked (0 done, 1 not done, 2 a request that names
    /// nothing).
    Answer {
        client: u64,
        code: i32,
        message: String,
    },
    /// tend is done: exit with this code.
    Exit(i32),
}
