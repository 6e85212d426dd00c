//! Starting a process with a clean signal state, in its own process group.
//!
//! `std::process::Command` children inherit tend's signal mask (every handled
//! signal is blocked, for the signalfd) and its ignored dispositions (only
//! SIGPIPE is reset by std). The `pre_exec` hook undoes both with
//! async-signal-safe calls only: it runs between `fork` and `exec`, where
//! allocating or logging could deadlock.
//!
//! Every child gets its own process group (`process_group(0)`, never `setsid`)
//! so a stop or a timeout can reach its whole group, and a terminal's Ctrl-C
//! reaches the service once, not once directly and once forwarded by tend.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::unistd::Pid;

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
    if let Output::Pipe(fd) = spec.output {
        let other = |source: io::Error| SpawnError::Other {
            program: program.clone(),
            source,
        };
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

    let take_terminal = spec.take_terminal;
    // SAFETY: SIGRTMAX is a plain read of a libc constant, done before fork.
    let last_signal = libc::SIGRTMAX();
    // SAFETY: the hook only calls async-signal-safe functions (tcsetpgrp,
    // getpid, rt_sigaction, sigprocmask) on stack values, and never allocates.
    unsafe {
        cmd.pre_exec(move || {
            if take_terminal {
                // SIGTTOU is still ignored here (inherited from tend), so a
                // background group may take the foreground. ENOTTY and ENXIO
                // mean there is no terminal to hand over, which is fine.
                libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid());
            }
            reset_signal_state(last_signal);
            Ok(())
        });
    }

    match cmd.spawn() {
        Ok(child) => Ok(Pid::from_raw(child.id() as i32)),
        Err(source) => Err(match source.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => SpawnError::NotFound {
                program: program.clone(),
                source,
            },
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::ENOEXEC) | Some(libc::EISDIR) => {
                SpawnError::NotExecutable {
                    program: program.clone(),
                    source,
                }
            }
            _ => SpawnError::Other {
                program: program.clone(),
                source,
            },
        }),
    }
}

/// Default dispositions for every signal and an empty mask. Async-signal-safe.
///
/// The raw `rt_sigaction` syscall rather than glibc's `sigaction`: glibc
/// refuses to touch the two signals it reserves (32 and 33), and a parent that
/// ignored them would otherwise pass that on to the service.
fn reset_signal_state(last_signal: i32) {
    // The kernel's struct sigaction: handler, flags, restorer, mask. All zero
    // is SIG_DFL with no flags and an empty mask.
    let dfl = [0u64; 4];
    // SAFETY: rt_sigaction reads `dfl` (sized for the kernel's struct) and
    // sigprocmask reads a zeroed, initialised sigset.
    unsafe {
        for sig in 1..=last_signal {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    std::mem::size_of::<u64>(),
                );
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}
