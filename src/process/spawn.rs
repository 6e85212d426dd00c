//! Starting a process with a clean signal state, in its own process group.
//!
//! `std::process::Command` children inherit tend's signal mask (every handled
//! signal is blocked, for the signalfd) and its ignored dispositions (only
//! SIGPIPE is reset by std). The `pre_exec` hook undoes both with
//! async-signal-safe calls only: it runs between `fork` and `exec`, where
//! allocating or logging could deadlock. Each call there is checked; std
//! passes only the errno of a failed hook on to the parent, so the child
//! first writes which call failed into a close-on-exec pipe, and the error
//! names it.
//!
//! Every child gets its own process group (`process_group(0)`, never `setsid`)
//! so a stop or a timeout can reach its whole group, and a terminal's Ctrl-C
//! reaches the service once, not once directly and once forwarded by tend.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::Pid;

use crate::signals::{self, Disposition};

/// What to start, and how.
pub struct Spec<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub working_dir: Option<&'a Path>,
    /// Make the child the terminal's foreground process group (the service,
    /// when tend itself owned the foreground of its stdin terminal).
    pub take_terminal: bool,
    pub output: Output,
}

/// Where the child's stdio goes.
pub enum Output {
    /// stdin, stdout and stderr are tend's own, untouched (the service).
    Inherit,
    /// stdin is at end of file; stdout and stderr both go to this pipe (checks).
    Pipe(OwnedFd),
}

/// Why a process could not be started, translated where it enters so that
/// callers see the shell's exit codes and a sentence for the log.
#[derive(Debug)]
pub enum SpawnError {
    NotFound { program: String, source: io::Error },
    NotExecutable { program: String, source: io::Error },
    WorkingDir { dir: String, reason: String },
    Other { program: String, source: io::Error },
}

impl SpawnError {
    /// The status a shell would give: 127 not found, 126 not executable, and
    /// 1 when tend itself failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            SpawnError::NotFound { .. } => 127,
            SpawnError::NotExecutable { .. } => 126,
            SpawnError::WorkingDir { .. } | SpawnError::Other { .. } => 1,
        }
    }
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpawnError::NotFound { program, source } if program.contains('/') => {
                write!(f, "cannot run {program:?}: no such file ({source})")
            }
            SpawnError::NotFound { program, .. } => {
                write!(f, "cannot run {program:?}: command not found in $PATH")
            }
            SpawnError::NotExecutable { program, source } => {
                write!(f, "cannot run {program:?}: not executable ({source})")
            }
            SpawnError::WorkingDir { dir, reason } => {
                write!(f, "cannot use working_dir {dir:?}: {reason}")
            }
            SpawnError::Other { program, source } => {
                write!(f, "cannot start {program:?}: {source}")
            }
        }
    }
}

impl std::error::Error for SpawnError {}

/// Starts `spec` and returns its pid. The `Child` handle is dropped unwaited:
/// its status belongs to the reaper.
pub fn spawn(spec: Spec<'_>) -> Result<Pid, SpawnError> {
    let program = &spec.argv[0];
    if let Some(dir) = spec.working_dir {
        // Checked here because a failed chdir in the child comes back as a
        // bare ENOENT, which would read as "command not found".
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(SpawnError::WorkingDir {
                    dir: dir.display().to_string(),
                    reason: "not a directory".into(),
                });
            }
            Err(e) => {
                return Err(SpawnError::WorkingDir {
                    dir: dir.display().to_string(),
                    reason: e.to_string(),
                });
            }
        }
    }

    let mut cmd = Command::new(program);
    cmd.args(&spec.argv[1..]).envs(spec.env).process_group(0);
    if let Some(dir) = spec.working_dir {
        cmd.current_dir(dir);
    }
    let other = |source: io::Error| SpawnError::Other {
        program: program.clone(),
        source,
    };
    if let Output::Pipe(fd) = spec.output {
        let dup = fd.try_clone().map_err(other)?;
        // An empty pipe rather than Stdio::null(): /dev/null may not exist
        // in a minimal root, and failing to open it would come back as
        // ENOENT, which reads as "command not found".
        let (stdin, _closed_at_once) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| other(e.into()))?;
        cmd.stdin(Stdio::from(stdin))
            .stdout(Stdio::from(fd))
            .stderr(Stdio::from(dup));
    }

    // The child names a failed call here before it gives up: std passes on
    // only the errno, and EPERM from tcsetpgrp would read as "not executable".
    let (report, report_in_child) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .map_err(|e| {
            other(io::Error::other(format!(
                "pipe2() for the child's report failed: {e}"
            )))
        })?;
    let report_fd = report_in_child.as_raw_fd();
    let take_terminal = spec.take_terminal;
    // SAFETY: SIGRTMAX is a plain read of a libc constant, done before fork.
    let last_signal = libc::SIGRTMAX();
    // SAFETY: the hook only calls async-signal-safe functions (tcsetpgrp,
    // getpid, rt_sigaction, sigprocmask, write) on stack values, and never
    // allocates.
    unsafe {
        cmd.pre_exec(move || {
            let failed = |step: Step, errno: Errno| {
                let record = step.encode();
                // Nothing more can be done if this write fails: the parent
                // then reports the errno alone.
                libc::write(report_fd, record.as_ptr().cast(), record.len());
                Err(io::Error::from_raw_os_error(errno as i32))
            };
            if take_terminal && libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid()) != 0 {
                // SIGTTOU is still ignored here (inherited from tend), so a
                // background group may take the foreground. ENOTTY and ENXIO
                // mean there is no terminal to hand over any more.
                match Errno::last() {
                    Errno::ENOTTY | Errno::ENXIO => {}
                    e => return failed(Step::Tcsetpgrp, e),
                }
            }
            match reset_signal_state(last_signal) {
                Ok(()) => Ok(()),
                Err((step, e)) => failed(step, e),
            }
        });
    }

    let result = cmd.spawn();
    drop(report_in_child);
    match result {
        Ok(child) => Ok(Pid::from_raw(child.id() as i32)),
        Err(source) => {
            if let Some(step) = Step::read(&report) {
                let errno = Errno::from_raw(source.raw_os_error().unwrap_or(0));
                return Err(other(io::Error::new(
                    source.kind(),
                    format!("{step} in the child failed: {errno}"),
                )));
            }
            Err(match source.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => SpawnError::NotFound {
                    program: program.clone(),
                    source,
                },
                Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::ENOEXEC)
                | Some(libc::EISDIR) => SpawnError::NotExecutable {
                    program: program.clone(),
                    source,
                },
                _ => other(source),
            })
        }
    }
}

/// A call in the child, between fork and exec, that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Tcsetpgrp,
    RtSigaction(i32),
    Sigprocmask,
}

impl Step {
    /// Two bytes the child writes to the report pipe: which call, which signal.
    fn encode(self) -> [u8; 2] {
        match self {
            Step::Tcsetpgrp => [1, 0],
            Step::RtSigaction(signo) => [2, signo as u8],
            Step::Sigprocmask => [3, 0],
        }
    }

    fn decode(record: [u8; 2]) -> Option<Step> {
        match record {
            [1, _] => Some(Step::Tcsetpgrp),
            [2, signo] => Some(Step::RtSigaction(i32::from(signo))),
            [3, _] => Some(Step::Sigprocmask),
            _ => None,
        }
    }

    /// What the child reported, if it reported anything. By the time spawn
    /// returns, a child that failed has written its record (before it
    /// exited), so this never waits: the pipe is non-blocking, and EAGAIN
    /// means the child failed elsewhere (exec, chdir) and wrote nothing.
    fn read(report: &OwnedFd) -> Option<Step> {
        let mut record = [0u8; 2];
        match nix::unistd::read(report, &mut record) {
            Ok(2) => Step::decode(record),
            Ok(_) | Err(Errno::EAGAIN) => None,
            Err(e) => {
                tracing::warn!("read() on the spawn report pipe failed: {e}");
                None
            }
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Tcsetpgrp => f.write_str("tcsetpgrp()"),
            Step::RtSigaction(signo) => {
                write!(f, "rt_sigaction({}, SIG_DFL)", signals::describe(*signo))
            }
            Step::Sigprocmask => f.write_str("sigprocmask(SIG_SETMASK, empty)"),
        }
    }
}

/// Default dispositions for every signal and an empty mask. Async-signal-safe.
///
/// Every signal up to SIGRTMAX, the C library's own (32, 33) included: a
/// parent that ignored them would otherwise pass that on to the service.
fn reset_signal_state(last_signal: i32) -> Result<(), (Step, Errno)> {
    for signo in 1..=last_signal {
        if signo != libc::SIGKILL && signo != libc::SIGSTOP {
            signals::set_disposition(signo, Disposition::Default)
                .map_err(|e| (Step::RtSigaction(signo), e))?;
        }
    }
    // SAFETY: sigprocmask reads a zeroed, initialised sigset.
    let ret = unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut())
    };
    Errno::result(ret)
        .map(drop)
        .map_err(|e| (Step::Sigprocmask, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_survives_the_trip_through_the_report_pipe() {
        for step in [
            Step::Tcsetpgrp,
            Step::RtSigaction(1),
            Step::RtSigaction(33),
            Step::RtSigaction(libc::SIGRTMAX()),
            Step::Sigprocmask,
        ] {
            assert_eq!(Step::decode(step.encode()), Some(step));
        }
        assert_eq!(Step::decode([0, 0]), None);
        assert_eq!(
            Step::RtSigaction(libc::SIGRTMIN() + 2).to_string(),
            "rt_sigaction(SIGRTMIN+2, SIG_DFL)"
        );
    }
}
