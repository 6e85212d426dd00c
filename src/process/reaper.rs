//! The one place that calls `waitpid`.
//!
//! SIGCHLDs coalesce, so one signal can stand for many exits: each SIGCHLD
//! drains `waitpid(-1, WNOHANG)` until it reports nothing. The caller routes
//! each status to whoever spawned that pid; pids nobody spawned are orphans
//! the kernel handed to PID 1 (or to the subreaper) and need only be reaped.

use nix::unistd::Pid;

use super::ExitStatus;

/// What one pass of the reaper found.
#[derive(Debug, Default)]
pub struct Reaped {
    pub exits: Vec<(Pid, ExitStatus)>,
    /// True when tend has no children left at all (`ECHILD`).
    pub no_children: bool,
}

pub fn reap() -> Reaped {
    let mut out = Reaped::default();
    loop {
        let mut status = 0;
        // libc rather than nix: nix turns a status it cannot map to its
        // Signal enum (a realtime signal) into an error, after the kernel has
        // already discarded the zombie.
        // SAFETY: waitpid writes only to `status`.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        match pid {
            0 => return out,
            -1 => {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => {
                        out.no_children = true;
                        return out;
                    }
                    _ => {
                        tracing::error!("waitpid(-1, WNOHANG) failed: {err}");
                        return out;
                    }
                }
            }
            pid => {
                if let Some(st) = ExitStatus::from_wait_status(status) {
                    out.exits.push((Pid::from_raw(pid), st));
                }
            }
        }
    }
}
