//! Starting a process with a clean signal state, in its own process group.
//!
//! Children would inherit tend's signal mask (every handled signal is
//! blocked, for the signalfd) and its ignored dispositions (SIGPIPE,
//! SIGTTIN, SIGTTOU); the child undoes both before it executes.
//!
//! The child is made as `posix_spawn` makes one: `clone` with `CLONE_VM |
//! CLONE_VFORK`, on a stack of its own, sharing tend's memory until it
//! executes. A fork would copy tend's page tables and write-protect every
//! page it wrote, only for exec to throw the copy away; that is most of
//! what a start costs. tend builds argv, the whole environment, the
//! `$PATH` candidates ([`Exec`]) and every other value the child needs
//! beforehand, so that the child only makes system calls: stdio, working
//! directory, process group, terminal, signals, user, descriptors, then
//! `execve(2)`, each checked. Between clone and exec it must not allocate
//! or log (tend's other threads may hold the allocator's lock); a child
//! that fails writes which call failed, and its errno, into a close-on-exec
//! pipe, and the error names it.
//!
//! The service keeps the descriptors tend inherited (as under tini and
//! dumb-init); the commands tend runs on its own behalf get 0-2 only, plus
//! the sockets they are given ([`Fds`]).
//!
//! Every child gets its own process group (`setpgid(0, 0)`, never `setsid`)
//! so a stop or a timeout can reach its whole group, and a terminal's Ctrl-C
//! reaches the service once, not once directly and once forwarded by tend.
//!
//! A service that gets listening sockets needs `LISTEN_PID`, its own pid,
//! which exists only in the child: the child writes its digits into a
//! buffer on its stack and points the prepared environment at it.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::Pid;

use crate::signals::{self, Disposition};
use crate::sockets::{self, Held};

/// What to start, and how.
pub struct Spec<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub working_dir: Option<&'a Path>,
    /// Make the child the terminal's foreground process group (the service,
    /// when tend itself owned the foreground of its stdin terminal).
    pub take_terminal: bool,
    pub output: Output,
    /// The listening sockets, which the child gets as fds 3.. with
    /// `LISTEN_FDS`, `LISTEN_FDNAMES` and `LISTEN_PID` (the service). None,
    /// or none held, for everything else: they stay close-on-exec.
    pub sockets: Option<Sockets<'a>>,
    /// Set after `env`, overriding it (`NOTIFY_SOCKET`).
    pub extra_env: &'a [(String, String)],
    /// With [`Output::Inherit`] or [`Output::Lines`]: stdin is /dev/null
    /// (or at end of file) instead of tend's (a service other than the
    /// main one).
    pub stdin_null: bool,
    /// Run as this user: its groups, gid and uid are set in the child.
    pub user: Option<&'a crate::users::Account>,
    /// The descriptors the child gets besides 0-2 and `sockets`.
    pub fds: Fds,
}

/// Listening sockets a child gets as fds 3, 4, ... in the order of
/// `which` (indices into `held`), with `LISTEN_FDS`, `LISTEN_FDNAMES` and
/// `LISTEN_PID`.
#[derive(Clone, Copy, Debug)]
pub struct Sockets<'a> {
    pub held: &'a Held,
    pub which: &'a [usize],
}

/// Which descriptors a child gets, besides stdin, stdout, stderr and the
/// sockets it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fds {
    /// Every one tend inherited without close-on-exec, as tini and
    /// dumb-init pass them on: the service (`systemd-socket-activate ...
    /// tend -- app`). tend's own are all close-on-exec.
    Inherited,
    /// None: the commands tend runs on its own behalf (checks, verify,
    /// exec actions, ready_check) must not hold what tend inherited.
    None,
}

/// Where the child's stdio goes.
pub enum Output {
    /// stdin, stdout and stderr are tend's own, untouched (the service).
    Inherit,
    /// stdin as with `Inherit`; stdout and stderr go to these pipes, which
    /// tend reads (a service with `output = "prefix"`).
    Lines { stdout: OwnedFd, stderr: OwnedFd },
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

/// Starts `spec` and returns its pid. Its status belongs to the reaper.
///
/// The child shares tend's memory until it executes (`clone` with
/// `CLONE_VM | CLONE_VFORK`, as `posix_spawn` does): nothing of tend's
/// address space is copied or write-protected, which is most of what a
/// start costs a process of tend's size, and tend resumes once the child
/// has executed or failed. [`Child::run`] is all the child does, on a
/// stack of its own, with every value it needs built here beforehand.
pub fn spawn(spec: Spec<'_>) -> Result<Pid, SpawnError> {
    let program = &spec.argv[0];
    if let Some(dir) = spec.working_dir {
        // Checked here too, for a sentence better than chdir's errno.
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

    let other = |source: io::Error| SpawnError::Other {
        program: program.clone(),
        source,
    };
    let mut exec = Exec::new(&spec, spec.sockets.filter(|s| !s.which.is_empty())).map_err(other)?;
    // The fds that become the child's 0, 1 and 2 (None: tend's own), kept
    // open here until the child has them.
    let mut stdio: [Option<OwnedFd>; 3] = [None, None, None];
    match spec.output {
        Output::Inherit => {
            if spec.stdin_null {
                stdio[0] = Some(null_input().map_err(other)?);
            }
        }
        Output::Lines { stdout, stderr } => {
            if spec.stdin_null {
                stdio[0] = Some(null_input().map_err(other)?);
            }
            stdio[1] = Some(stdout);
            stdio[2] = Some(stderr);
        }
        Output::Pipe(fd) => {
            // An empty pipe rather than /dev/null, which a minimal root may
            // not have.
            let (stdin, _closed_at_once) =
                nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| other(e.into()))?;
            stdio[0] = Some(stdin);
            stdio[2] = Some(fd.try_clone().map_err(other)?);
            stdio[1] = Some(fd);
        }
    }
    let working_dir = spec
        .working_dir
        .map(|d| CString::new(d.as_os_str().as_bytes()))
        .transpose()
        .map_err(|_| {
            other(io::Error::new(
                io::ErrorKind::InvalidInput,
                "working_dir holds a NUL byte",
            ))
        })?;

    // The child says here which call failed, and with what errno, before
    // it exits.
    let (report, report_in_child) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
        .map_err(|e| {
            other(io::Error::other(format!(
                "pipe2() for the child's report failed: {e}"
            )))
        })?;
    let mut child = Child {
        stdio: [0, 1, 2].map(|n| stdio[n].as_ref().map_or(-1, |fd| fd.as_raw_fd())),
        working_dir: working_dir.as_deref(),
        take_terminal: spec.take_terminal,
        user: spec.user.map(|a| (a.uid, a.gid, a.groups.as_slice())),
        close_on_exec: match spec.fds {
            Fds::Inherited => None,
            Fds::None => Some(CloseOnExec::prepare()),
        },
        first_realtime: libc::SIGRTMIN(),
        exec: &mut exec,
        report: report_in_child.as_raw_fd(),
    };
    let stack = ChildStack::new().map_err(|e| {
        other(io::Error::new(
            e.kind(),
            format!("mmap() of the child's stack failed: {e}"),
        ))
    })?;
    // SAFETY: the child runs `child_main` on `stack`, which outlives it
    // (CLONE_VFORK: clone returns once the child executed or exited), with
    // `child`, which it only reads and writes as Child::run says.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut child as *mut Child<'_>).cast(),
        )
    };
    if pid == -1 {
        let errno = Errno::last();
        return Err(other(io::Error::new(
            io::Error::from(errno).kind(),
            clone_failed(errno),
        )));
    }
    drop(report_in_child);
    drop(stdio);
    let Some((step, errno)) = Report::read(&report) else {
        return Ok(Pid::from_raw(pid));
    };
    // It failed, and has exited or is about to: its status is of no use
    // to the reaper.
    let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
    let source = io::Error::from_raw_os_error(errno as i32);
    Err(match (step, errno) {
        (Step::Exec, Errno::ENOENT | Errno::ENOTDIR) => SpawnError::NotFound {
            program: program.clone(),
            source,
        },
        (Step::Exec, Errno::EACCES | Errno::EPERM | Errno::ENOEXEC | Errno::EISDIR) => {
            SpawnError::NotExecutable {
                program: program.clone(),
                source,
            }
        }
        (Step::Exec, Errno::EAGAIN) => other(io::Error::new(
            source.kind(),
            format!(
                "execve() in the child failed: {errno}; the service's user has as many \
                 processes as RLIMIT_NPROC allows"
            ),
        )),
        (Step::Chdir, _) => SpawnError::WorkingDir {
            dir: spec
                .working_dir
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            reason: source.to_string(),
        },
        (step, _) => other(io::Error::new(
            source.kind(),
            format!("{step} in the child failed: {errno}"),
        )),
    })
}

/// What a failed clone says: EAGAIN is a limit on processes, which a
/// bare "Resource temporarily unavailable" does not tell.
fn clone_failed(errno: Errno) -> String {
    match errno {
        Errno::EAGAIN => format!(
            "clone() failed: {errno}; the container has as many processes as it may \
             (its cgroup's pids.max, or RLIMIT_NPROC for a tend that is not root)"
        ),
        _ => format!("clone() failed: {errno}"),
    }
}

/// The child's stack: what [`Child::run`] and the C library's wrappers of
/// the calls it makes need (under 2 KiB, measured), many times over.
const CHILD_STACK: usize = 64 * 1024;

/// A stack for the child, mapped for one start and unmapped after it, with
/// a guard page below it: an overflow faults in the child instead of
/// writing over tend's memory, and only the pages the child touched were
/// ever resident (a heap buffer would stay in tend's heap at its full size).
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    fn new() -> io::Result<ChildStack> {
        // SAFETY: sysconf reads a constant.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = page + CHILD_STACK;
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// Where the child's stack pointer starts: the end of the mapping,
    /// which is page-aligned and so 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        self.base.cast::<u8>().wrapping_add(self.len).cast()
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), used by no one once clone
        // returned.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Everything the child needs, built by the parent before `clone`.
struct Child<'a> {
    /// The fd that becomes 0, 1, 2; -1 keeps tend's.
    stdio: [i32; 3],
    working_dir: Option<&'a std::ffi::CStr>,
    take_terminal: bool,
    user: Option<(libc::uid_t, libc::gid_t, &'a [libc::gid_t])>,
    close_on_exec: Option<CloseOnExec>,
    first_realtime: i32,
    exec: &'a mut Exec,
    report: i32,
}

/// The child's entry point, on its own stack.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Child`, alive and untouched by the
    // parent until this child executed or exited (CLONE_VFORK).
    let child = unsafe { &mut *arg.cast::<Child<'_>>() };
    let (step, errno) = child.run();
    let record = Report::encode(step, errno);
    // SAFETY: write and _exit are async-signal-safe; nothing more can be
    // done if the write fails (the parent then sees a child that exited).
    unsafe {
        libc::write(child.report, record.as_ptr().cast(), record.len());
        libc::_exit(127)
    }
}

impl Child<'_> {
    /// In the child: stdio, working directory, process group, terminal,
    /// signal state, user, descriptors, then exec. Returns only what failed.
    ///
    /// It shares tend's memory, and other threads of tend keep running: it
    /// calls only async-signal-safe functions, never allocates, and writes
    /// only to its own stack and `exec`'s buffers. User and groups are set
    /// with raw system calls, as glibc's own wrappers would set them for
    /// every thread of tend, which this process shares memory with.
    fn run(&mut self) -> (Step, Errno) {
        for (target, &fd) in self.stdio.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            // SAFETY: dup2 on descriptor numbers touches no memory. The
            // sources are tend's own fds, all above 2 (0-2 are open).
            if unsafe { libc::dup2(fd, target as i32) } == -1 {
                return (Step::Stdio(target as i32), Errno::last());
            }
        }
        if let Some(dir) = self.working_dir {
            // SAFETY: a NUL-terminated path that outlives the call.
            if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                return (Step::Chdir, Errno::last());
            }
        }
        // SAFETY: setpgid, getpid and tcsetpgrp take integers.
        unsafe {
            if libc::setpgid(0, 0) != 0 {
                return (Step::Setpgid, Errno::last());
            }
            if self.take_terminal && libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpid()) != 0 {
                // SIGTTOU is still ignored here (inherited from tend), so a
                // background group may take the foreground. ENOTTY and ENXIO
                // mean there is no terminal to hand over any more.
                match Errno::last() {
                    Errno::ENOTTY | Errno::ENXIO => {}
                    e => return (Step::Tcsetpgrp, e),
                }
            }
        }
        if let Err(failed) = reset_signal_state(self.first_realtime) {
            return failed;
        }
        if let Some((uid, gid, groups)) = self.user {
            // Groups first, the uid last: after setuid, nothing else may be
            // changed.
            // SAFETY: the kernel reads `groups`, which outlives the call.
            unsafe {
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
                    return (Step::Setgroups, Errno::last());
                }
                if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
                    return (Step::Setgid(gid), Errno::last());
                }
                if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
                    return (Step::Setuid(uid), Errno::last());
                }
            }
        }
        // Before the sockets below take theirs off again.
        if let Some(c) = &self.close_on_exec
            && let Err(failed) = c.apply()
        {
            return failed;
        }
        if let Err(failed) = self.exec.place_sockets() {
            return failed;
        }
        (Step::Exec, self.exec.exec())
    }
}

/// A call in the child, between clone and exec, that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Tcsetpgrp,
    RtSigaction(i32),
    Sigprocmask,
    /// Clearing close-on-exec on a listening socket's fd.
    KeepSocket(i32),
    /// Moving the listening socket at this fd to its place from 3 up.
    MoveSocket(i32),
    Setgroups,
    Setgid(u32),
    Setuid(u32),
    /// Setting close-on-exec on every fd from 3 up.
    CloseRange,
    /// Setting close-on-exec on this fd (kernels without CLOSE_RANGE_CLOEXEC).
    CloseOnExec(i32),
    /// Putting the child's stdin, stdout or stderr (0, 1, 2) in place.
    Stdio(i32),
    Chdir,
    Setpgid,
    /// execve itself, of every candidate.
    Exec,
}

impl Step {
    /// Three bytes: which call, and the signal, fd or id it was for.
    fn encode(self) -> [u8; 3] {
        let [lo, hi] = match self {
            Step::RtSigaction(n)
            | Step::KeepSocket(n)
            | Step::MoveSocket(n)
            | Step::CloseOnExec(n)
            | Step::Stdio(n) => (n as u16).to_le_bytes(),
            // Ids above 65535 are reported as 65535: the call is what matters.
            Step::Setgid(n) | Step::Setuid(n) => (n.min(0xffff) as u16).to_le_bytes(),
            Step::Tcsetpgrp
            | Step::Sigprocmask
            | Step::CloseRange
            | Step::Setgroups
            | Step::Chdir
            | Step::Setpgid
            | Step::Exec => [0, 0],
        };
        let call = match self {
            Step::Tcsetpgrp => 1,
            Step::RtSigaction(_) => 2,
            Step::Sigprocmask => 3,
            Step::KeepSocket(_) => 4,
            Step::CloseRange => 5,
            Step::CloseOnExec(_) => 6,
            Step::Setgroups => 7,
            Step::Setgid(_) => 8,
            Step::Setuid(_) => 9,
            Step::MoveSocket(_) => 10,
            Step::Stdio(_) => 11,
            Step::Chdir => 12,
            Step::Setpgid => 13,
            Step::Exec => 14,
        };
        [call, lo, hi]
    }

    fn decode(record: [u8; 3]) -> Option<Step> {
        let n = i32::from(u16::from_le_bytes([record[1], record[2]]));
        match record[0] {
            1 => Some(Step::Tcsetpgrp),
            2 => Some(Step::RtSigaction(n)),
            3 => Some(Step::Sigprocmask),
            4 => Some(Step::KeepSocket(n)),
            5 => Some(Step::CloseRange),
            6 => Some(Step::CloseOnExec(n)),
            7 => Some(Step::Setgroups),
            8 => Some(Step::Setgid(n as u32)),
            9 => Some(Step::Setuid(n as u32)),
            10 => Some(Step::MoveSocket(n)),
            11 => Some(Step::Stdio(n)),
            12 => Some(Step::Chdir),
            13 => Some(Step::Setpgid),
            14 => Some(Step::Exec),
            _ => None,
        }
    }
}

/// What a child that failed writes to the report pipe before it exits: the
/// step, then the errno (native byte order: the reader is tend itself).
struct Report;

impl Report {
    fn encode(step: Step, errno: Errno) -> [u8; 7] {
        let mut record = [0u8; 7];
        record[..3].copy_from_slice(&step.encode());
        record[3..].copy_from_slice(&(errno as i32).to_ne_bytes());
        record
    }

    fn decode(record: [u8; 7]) -> Option<(Step, Errno)> {
        let step = Step::decode([record[0], record[1], record[2]])?;
        let errno = i32::from_ne_bytes([record[3], record[4], record[5], record[6]]);
        Some((step, Errno::from_raw(errno)))
    }

    /// What the child reported, if it reported anything. clone returns
    /// once the child executed or exited, so this never waits: the pipe is
    /// non-blocking, and EAGAIN or end of file means it executed.
    fn read(report: &OwnedFd) -> Option<(Step, Errno)> {
        let mut record = [0u8; 7];
        match nix::unistd::read(report, &mut record) {
            Ok(7) => Report::decode(record),
            Ok(0) | Err(Errno::EAGAIN) => None,
            Ok(n) => {
                tracing::warn!("the spawn report pipe held {n} bytes, not a record");
                None
            }
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
            Step::KeepSocket(fd) => write!(f, "fcntl({fd}, F_SETFD, 0) for a listening socket"),
            Step::MoveSocket(fd) => write!(f, "moving the listening socket at fd {fd} (dup2)"),
            Step::Setgroups => f.write_str("setgroups() for the service's user"),
            Step::Setgid(gid) => write!(f, "setgid({gid}) for the service's user"),
            Step::Setuid(uid) => write!(f, "setuid({uid}) for the service's user"),
            Step::CloseRange => f.write_str("close_range(3, ~0, CLOSE_RANGE_CLOEXEC)"),
            Step::CloseOnExec(fd) => write!(f, "fcntl({fd}, F_SETFD, FD_CLOEXEC)"),
            Step::Stdio(fd) => write!(f, "dup2() onto fd {fd}"),
            Step::Chdir => f.write_str("chdir() to the working directory"),
            Step::Setpgid => f.write_str("setpgid(0, 0)"),
            Step::Exec => f.write_str("execve()"),
        }
    }
}

/// An `execve(2)` prepared in the parent: argv, the whole environment
/// (tend's, then `env`, then `extra_env`, then with sockets `LISTEN_*`) and
/// the paths to try, so that the child only fills in `LISTEN_PID` and
/// executes.
struct Exec {
    /// What execve tries, in order, as execvp would: the program itself when
    /// it holds a '/', else each entry of the child's `$PATH` joined with it.
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    /// execvp's way with a file without `#!` that the kernel refuses
    /// (ENOEXEC): `/bin/sh`, the file (filled in by the child), then the
    /// arguments.
    sh_argv: Vec<*const libc::c_char>,
    _env: Vec<CString>,
    /// NULL-terminated; with sockets, the child points entry `pid_at` at
    /// its `LISTEN_PID`.
    envp: Vec<*const libc::c_char>,
    pid_at: Option<usize>,
    /// The held socket that becomes fd 3, 4, ...: their fds in tend.
    sockets: Vec<i32>,
    /// Where the child puts each of them first when they must move: above
    /// every held socket (filled in by the child, allocated here).
    moved: Vec<i32>,
    /// The lowest fd above every held socket.
    above: i32,
}

// SAFETY: the pointers point into the CStrings that the same Exec owns, whose
// heap buffers never move; only the child writes (to `envp` and `sh_argv`).
unsafe impl Send for Exec {}
unsafe impl Sync for Exec {}

/// glibc's search path when `$PATH` is unset (`confstr(_CS_PATH)`).
pub(crate) const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

const LISTEN_PID: &[u8] = b"LISTEN_PID=";

impl Exec {
    fn new(spec: &Spec<'_>, sockets: Option<Sockets<'_>>) -> io::Result<Exec> {
        let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        let pairs = spec
            .env
            .iter()
            .chain(spec.extra_env.iter().map(|(k, v)| (k, v)));
        env.extend(pairs.map(|(k, v)| (OsString::from(k), OsString::from(v))));
        if let Some(sockets) = sockets {
            env.insert("LISTEN_FDS".into(), sockets.which.len().to_string().into());
            env.insert(
                "LISTEN_FDNAMES".into(),
                sockets.held.names(sockets.which).into(),
            );
            env.remove(OsStr::new("LISTEN_PID"));
        }

        let nul = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} holds a NUL byte"),
            )
        };
        let program = spec.argv[0].as_bytes();
        let path = env.get(OsStr::new("PATH")).map(|p| p.as_bytes());
        let candidates = search(program, path.unwrap_or(DEFAULT_PATH))
            .into_iter()
            .map(|c| CString::new(c).map_err(|_| nul("$PATH")))
            .collect::<io::Result<Vec<_>>>()?;
        let owned_argv = spec
            .argv
            .iter()
            .map(|a| CString::new(a.as_bytes()).map_err(|_| nul("the command")))
            .collect::<io::Result<Vec<_>>>()?;
        let owned_env = env
            .into_iter()
            .map(|(k, v)| {
                let mut var = k.into_vec();
                var.push(b'=');
                var.extend(v.into_vec());
                CString::new(var).map_err(|_| nul("the environment"))
            })
            .collect::<io::Result<Vec<_>>>()?;

        let argv: Vec<_> = owned_argv
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let sh_argv = [c"/bin/sh".as_ptr(), std::ptr::null()]
            .into_iter()
            .chain(argv[1..].iter().copied())
            .collect();
        let mut envp: Vec<_> = owned_env.iter().map(|v| v.as_ptr()).collect();
        let pid_at = sockets.map(|_| envp.len());
        envp.extend([std::ptr::null(), std::ptr::null()]);
        let first = sockets::FIRST_FD;
        let (which, above) = match sockets {
            Some(s) => (s.which, first + s.held.count() as i32),
            None => (&[][..], first),
        };
        Ok(Exec {
            candidates,
            argv,
            sh_argv,
            _argv: owned_argv,
            envp,
            _env: owned_env,
            pid_at,
            sockets: which.iter().map(|&i| first + i as i32).collect(),
            moved: vec![-1; which.len()],
            above,
        })
    }

    /// In the child: the sockets at fds 3, 4, ... in their order, without
    /// close-on-exec. All of tend's held sockets sit at 3.. (see
    /// sockets::bind_all); when the child's are all of them in order, only
    /// close-on-exec has to go; otherwise each is first copied above every
    /// held socket, then onto its place, so that no socket is overwritten
    /// before it was copied. The copies, and the held sockets the child
    /// does not get, are close-on-exec. Async-signal-safe: no allocation.
    fn place_sockets(&mut self) -> Result<(), (Step, Errno)> {
        let first = sockets::FIRST_FD;
        let in_place = self
            .sockets
            .iter()
            .enumerate()
            .all(|(j, &fd)| fd == first + j as i32);
        if in_place {
            for &fd in &self.sockets {
                // SAFETY: fcntl on a descriptor number touches no memory.
                if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } == -1 {
                    return Err((Step::KeepSocket(fd), Errno::last()));
                }
            }
            return Ok(());
        }
        for (j, &fd) in self.sockets.iter().enumerate() {
            // SAFETY: as above.
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, self.above) };
            if copy == -1 {
                return Err((Step::MoveSocket(fd), Errno::last()));
            }
            self.moved[j] = copy;
        }
        for (j, &copy) in self.moved.iter().enumerate() {
            let target = first + j as i32;
            // dup2 leaves close-on-exec off on the new descriptor.
            // SAFETY: dup2 of descriptor numbers touches no memory.
            if unsafe { libc::dup2(copy, target) } == -1 {
                return Err((Step::MoveSocket(self.sockets[j]), Errno::last()));
            }
        }
        Ok(())
    }

    /// Executes the first candidate that can be, as execvp does (a file
    /// without `#!` runs with /bin/sh), with `LISTEN_PID` set to the
    /// caller's pid when it gets sockets. Returns only when none could, with
    /// the errno execvp would give: EACCES if some candidate was not
    /// executable, else ENOENT (or the first other error).
    /// Async-signal-safe: no allocation.
    fn exec(&mut self) -> Errno {
        let mut pid_var = [0u8; 24];
        if let Some(at) = self.pid_at {
            // SAFETY: getpid cannot fail.
            write_pid_var(&mut pid_var, unsafe { libc::getpid() });
            self.envp[at] = pid_var.as_ptr().cast();
        }
        let mut denied = false;
        for path in &self.candidates {
            // SAFETY: NUL-terminated strings and NULL-terminated arrays, all
            // alive for the call.
            unsafe { libc::execve(path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
            match Errno::last() {
                Errno::EACCES => denied = true,
                Errno::ENOEXEC => {
                    self.sh_argv[1] = path.as_ptr();
                    // SAFETY: as above.
                    unsafe {
                        libc::execve(self.sh_argv[0], self.sh_argv.as_ptr(), self.envp.as_ptr())
                    };
                    return Errno::ENOEXEC;
                }
                Errno::ENOENT
                | Errno::ENOTDIR
                | Errno::ESTALE
                | Errno::ENODEV
                | Errno::ETIMEDOUT => {}
                other => return other,
            }
        }
        if denied { Errno::EACCES } else { Errno::ENOENT }
    }
}

/// The paths execvp tries for `program` with this `$PATH`.
pub(crate) fn search(program: &[u8], path: &[u8]) -> Vec<Vec<u8>> {
    if program.is_empty() {
        return Vec::new();
    }
    if program.contains(&b'/') {
        return vec![program.to_vec()];
    }
    path.split(|&b| b == b':')
        .map(|dir| match dir {
            // An empty entry is the working directory.
            b"" => program.to_vec(),
            dir => {
                let mut p = dir.to_vec();
                if !dir.ends_with(b"/") {
                    p.push(b'/');
                }
                p.extend_from_slice(program);
                p
            }
        })
        .collect()
}

/// "LISTEN_PID=<pid>\0" into `out`, without allocating.
fn write_pid_var(out: &mut [u8; 24], pid: libc::pid_t) {
    out[..LISTEN_PID.len()].copy_from_slice(LISTEN_PID);
    let mut digits = [0u8; 10];
    let mut n = pid.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        n /= 10;
        len += 1;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[LISTEN_PID.len() + i] = digits[len - 1 - i];
    }
    out[LISTEN_PID.len() + len] = 0;
}

/// How a child that must not keep what tend inherited gets rid of it: every
/// fd from 3 up is made close-on-exec, not closed, so that the report pipe
/// keeps working until exec, and the held sockets can still be placed.
enum CloseOnExec {
    /// close_range(2) with CLOSE_RANGE_CLOEXEC (Linux 5.11).
    Range,
    /// On older kernels (or where seccomp refuses close_range): fcntl on each
    /// fd that the parent found open without close-on-exec.
    Each(Vec<i32>),
}

impl CloseOnExec {
    /// Chooses the way in the parent, where reading /proc may allocate.
    fn prepare() -> CloseOnExec {
        static RANGE_WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // A range past every open fd changes nothing, and tells whether the
        // kernel takes the flag.
        let works = *RANGE_WORKS.get_or_init(|| close_range_cloexec(u32::MAX).is_ok());
        if works {
            return CloseOnExec::Range;
        }
        CloseOnExec::Each(inheritable_fds())
    }

    /// In the child: async-signal-safe, no allocation.
    fn apply(&self) -> Result<(), (Step, Errno)> {
        match self {
            CloseOnExec::Range => close_range_cloexec(3).map_err(|e| (Step::CloseRange, e)),
            CloseOnExec::Each(fds) => {
                for &fd in fds {
                    // SAFETY: fcntl on an integer fd has no memory effects.
                    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
                        return Err((Step::CloseOnExec(fd), Errno::last()));
                    }
                }
                Ok(())
            }
        }
    }
}

/// `close_range(first, ~0, CLOSE_RANGE_CLOEXEC)`, by its system call number:
/// the C library's wrapper is younger than the kernel call.
fn close_range_cloexec(first: u32) -> Result<(), Errno> {
    // SAFETY: close_range takes integers and touches only the fd table.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    Errno::result(ret).map(drop)
}

/// The fds from 3 up that are open without close-on-exec in tend: what it
/// inherited (everything tend opens itself is close-on-exec). From
/// /proc/self/fd, or by asking each fd below the soft RLIMIT_NOFILE (at
/// most 65536) when /proc is not there.
fn inheritable_fds() -> Vec<i32> {
    let inheritable = |fd: i32| {
        // SAFETY: F_GETFD reads a flag of an integer fd.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        fd >= 3 && flags != -1 && flags & libc::FD_CLOEXEC == 0
    };
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        let listed: Vec<i32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        // The directory's own fd is close-on-exec, and closed by now.
        return listed.into_iter().filter(|&fd| inheritable(fd)).collect();
    }
    let mut limit = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: getrlimit writes into `limit`; on failure it stays 1024.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    let limit = limit.rlim_cur.min(65536) as i32;
    (3..limit).filter(|&fd| inheritable(fd)).collect()
}

/// Default dispositions for every signal and an empty mask. Async-signal-safe.
///
/// exec() gives every signal that has a handler its default action; only an
/// ignored one stays ignored. tend gave every signal its default disposition
/// when it started ([`signals::take_over`]) but two kinds, so those are the
/// ones reset here: [`signals::IGNORED`], and the C library's own signals
/// between 31 and SIGRTMIN (32, 33), which tend leaves to the library and
/// a parent may have ignored. Two system calls per signal would otherwise
/// be spent on signals that are at their default already, on every start
/// of the service and every check.
fn reset_signal_state(first_realtime: i32) -> Result<(), (Step, Errno)> {
    for signo in signals::IGNORED.into_iter().chain(32..first_realtime) {
        signals::set_disposition(signo, Disposition::Default)
            .map_err(|e| (Step::RtSigaction(signo), e))?;
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

/// What a service other than the main one reads: /dev/null, or where a
/// minimal root has none, a pipe at end of file.
fn null_input() -> io::Result<OwnedFd> {
    match std::fs::File::open("/dev/null") {
        Ok(f) => Ok(f.into()),
        Err(_) => {
            let (read, _closed_at_once) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
            Ok(read)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pid_var(pid: libc::pid_t) -> String {
        let mut out = [0xffu8; 24];
        write_pid_var(&mut out, pid);
        std::ffi::CStr::from_bytes_until_nul(&out)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn listen_pid_is_written_as_plain_decimal() {
        assert_eq!(pid_var(1), "LISTEN_PID=1");
        assert_eq!(pid_var(42), "LISTEN_PID=42");
        assert_eq!(pid_var(4_194_304), "LISTEN_PID=4194304");
        assert_eq!(pid_var(i32::MAX), "LISTEN_PID=2147483647");
    }

    #[test]
    fn the_program_is_searched_as_execvp_does() {
        let s = |program: &str, path: &str| -> Vec<String> {
            search(program.as_bytes(), path.as_bytes())
                .into_iter()
                .map(|c| String::from_utf8(c).unwrap())
                .collect()
        };
        assert_eq!(s("app", "/usr/bin:/bin/"), ["/usr/bin/app", "/bin/app"]);
        assert_eq!(s("./app", "/usr/bin"), ["./app"]);
        assert_eq!(s("/opt/app", "/usr/bin"), ["/opt/app"]);
        assert_eq!(s("app", ":/bin"), ["app", "/bin/app"]);
        assert!(s("", "/bin").is_empty());
    }

    #[test]
    fn the_fds_a_child_would_inherit_are_found_and_marked_close_on_exec() {
        use std::os::fd::AsRawFd;
        let (plain, _w) = nix::unistd::pipe().unwrap();
        let (cloexec, _w2) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let found = inheritable_fds();
        assert!(found.contains(&plain.as_raw_fd()), "{found:?}");
        assert!(!found.contains(&cloexec.as_raw_fd()), "{found:?}");
        assert!(found.iter().all(|&fd| fd >= 3), "{found:?}");
        CloseOnExec::Each(vec![plain.as_raw_fd()]).apply().unwrap();
        // SAFETY: F_GETFD reads a flag.
        let flags = unsafe { libc::fcntl(plain.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
    }

    #[test]
    fn a_failed_step_survives_the_trip_through_the_report_pipe() {
        for step in [
            Step::Tcsetpgrp,
            Step::RtSigaction(1),
            Step::RtSigaction(33),
            Step::RtSigaction(libc::SIGRTMAX()),
            Step::Sigprocmask,
            Step::KeepSocket(3),
            Step::KeepSocket(1000),
            Step::CloseRange,
            Step::CloseOnExec(251),
            Step::Stdio(2),
            Step::Chdir,
            Step::Setpgid,
            Step::Setgid(70_000),
            Step::Exec,
        ] {
            let expected = match step {
                Step::Setgid(_) => Step::Setgid(0xffff),
                other => other,
            };
            assert_eq!(Step::decode(step.encode()), Some(expected));
            for errno in [Errno::ENOENT, Errno::EPERM, Errno::EMFILE] {
                assert_eq!(
                    Report::decode(Report::encode(step, errno)),
                    Some((expected, errno))
                );
            }
        }
        assert_eq!(Step::decode([0, 0, 0]), None);
        assert_eq!(Report::decode([0; 7]), None);
        assert_eq!(
            Step::RtSigaction(libc::SIGRTMIN() + 2).to_string(),
            "rt_sigaction(SIGRTMIN+2, SIG_DFL)"
        );
    }
}
