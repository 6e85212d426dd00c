//! A short-lived command tend runs for a watch: a `check`, or an `exec`
//! action. It runs in its own process group with stdout and stderr on one
//! pipe, of which tend keeps only the last [`OUTPUT_TAIL`] bytes.
//!
//! A job is done when its process exits, not when its pipe reaches EOF: a
//! background grandchild may hold the pipe open forever. What is left of the
//! job's process group then is killed, and so is the whole group when the job
//! runs past its timeout.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, pipe2};

use super::ExitStatus;
use super::spawn::{self, Output, SpawnError, Spec};

/// How much of a job's output is kept: the end, where errors usually are.
pub const OUTPUT_TAIL: usize = 4096;

pub struct Job {
    pid: Pid,
    pipe: Option<OwnedFd>,
    tail: VecDeque<u8>,
    dropped: bool,
    started: Instant,
    deadline: Instant,
    timeout: Duration,
    timed_out: bool,
}

/// How a job ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub status: ExitStatus,
    pub timed_out: bool,
    pub took: Duration,
    /// The last [`OUTPUT_TAIL`] bytes of stdout and stderr, as text.
    pub output: String,
}

impl Outcome {
    pub fn success(&self) -> bool {
        !self.timed_out && self.status.success()
    }

    /// "exit code 1", "timed out after 500ms".
    pub fn describe(&self) -> String {
        if self.timed_out {
            format!("timed out after {:?} and was killed", self.took)
        } else {
            self.status.to_string()
        }
    }
}

impl Job {
    pub fn start(
        argv: &[String],
        env: &BTreeMap<String, String>,
        working_dir: Option<&Path>,
        timeout: Duration,
        now: Instant,
    ) -> Result<Job, SpawnError> {
        let other = |e: Errno| SpawnError::Other {
            program: argv[0].clone(),
            source: e.into(),
        };
        let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(other)?;
        fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(other)?;
        let pid = spawn::spawn(Spec {
            argv,
            env,
            working_dir,
            take_terminal: false,
            output: Output::Pipe(write),
        })?;
        Ok(Job {
            pid,
            pipe: Some(read),
            tail: VecDeque::new(),
            dropped: false,
            started: now,
            deadline: now + timeout,
            timeout,
            timed_out: false,
        })
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The output pipe, while it is open.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.pipe.as_ref().map(|p| p.as_fd())
    }

    /// The timeout, until it has fired.
    pub fn deadline(&self) -> Option<Instant> {
        (!self.timed_out).then_some(self.deadline)
    }

    /// Reads what the pipe holds now, keeping the tail.
    pub fn read_output(&mut self) {
        let Some(pipe) = &self.pipe else { return };
        let mut buf = [0u8; 4096];
        loop {
            match nix::unistd::read(pipe, &mut buf) {
                Ok(0) => {
                    self.pipe = None;
                    return;
                }
                Ok(n) => {
                    self.tail.extend(&buf[..n]);
                    if self.tail.len() > OUTPUT_TAIL {
                        let excess = self.tail.len() - OUTPUT_TAIL;
                        self.tail.drain(..excess);
                        self.dropped = true;
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(e) => {
                    tracing::warn!(
                        pid = self.pid.as_raw(),
                        "read() on a job's output pipe failed: {e}"
                    );
                    self.pipe = None;
                    return;
                }
            }
        }
    }

    /// Kills the job's whole process group once its timeout has passed.
    pub fn on_deadline(&mut self, now: Instant) {
        if !self.timed_out && now >= self.deadline {
            self.timed_out = true;
            self.kill_group();
        }
    }

    /// Kills the job's process group (on stop, or a timeout).
    pub fn kill_group(&self) {
        // The group outlives its leader while any member is left, so the id
        // is not reused while this can reach anyone.
        if let Err(e) = kill(Pid::from_raw(-self.pid.as_raw()), Signal::SIGKILL)
            && e != Errno::ESRCH
        {
            tracing::warn!(
                pid = self.pid.as_raw(),
                "kill(-{}, SIGKILL) failed: {e}",
                self.pid
            );
        }
    }

    /// The job's process exited with `status`: collect what it wrote, kill
    /// whatever it left running in its group, and report.
    pub fn finish(mut self, status: ExitStatus, now: Instant) -> Outcome {
        self.read_output();
        self.pipe = None;
        self.kill_group();
        let mut output = String::from_utf8_lossy(self.tail.make_contiguous()).into_owned();
        if self.dropped {
            output.insert_str(0, "[...] ");
        }
        let took = if self.timed_out {
            self.timeout
        } else {
            now.duration_since(self.started)
        };
        Outcome {
            status,
            timed_out: self.timed_out,
            took,
            output,
        }
    }
}
