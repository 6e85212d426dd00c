//! Processes: spawning them clean, reaping every one of them, and the
//! service's lifecycle.
//!
//! There is exactly one reaper ([`reaper::reap`]). Everything else that starts
//! a process gets its pid back from [`spawn::spawn`] synchronously and
//! registers it before the event loop runs again, so no exit status can
//! arrive for a pid nobody knows yet.

pub mod job;
pub mod reaper;
pub mod spawn;

use std::fmt;

use crate::signals;

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

    fn from_raw(status: i32) -> Option<ExitStatus> {
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
            ExitStatus::Signal(s) => write!(f, "killed by {}", signals::describe(*s)),
        }
    }
}
