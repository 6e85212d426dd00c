//! A short-lived command tend runs for a watch (a `check`, or an `exec`
//! action) and the output it writes: stdout and stderr on one pipe, of which
//! tend keeps only the last [`OUTPUT_TAIL`] bytes.
//!
//! This is the shell's half of a job: the pipe and its tail. When the job is
//! done, and what happens to its process group, is the core's decision: a
//! job is done when its process exits, not when its pipe reaches EOF (a
//! background grandchild may hold the pipe open forever).

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::unistd::{Pid, pipe2};

use super::spawn::{self, Fds, Output, Sockets, SpawnError, Spec};

/// How much of a job's output is kept: the end, where errors usually are.
pub const OUTPUT_TAIL: usize = 4096;

pub struct Job {
    pid: Pid,
    pipe: Option<OwnedFd>,
    tail: VecDeque<u8>,
    dropped: bool,
}

impl Job {
    pub fn start(
        argv: &[String],
        env: &BTreeMap<String, String>,
        extra_env: &[(String, String)],
        working_dir: Option<&Path>,
        sockets: Option<Sockets<'_>>,
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
            sockets,
            extra_env,
            stdin_null: false,
            user: None,
            // Commands of tend's own: nothing tend inherited.
            fds: Fds::None,
        })?;
        Ok(Job {
            pid,
            pipe: Some(read),
            tail: VecDeque::new(),
            dropped: false,
        })
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The output pipe, while it is open.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.pipe.as_ref().map(|p| p.as_fd())
    }

    /// Reads what the pipe holds now, keeping the tail; at most a pipe's
    /// worth (64 KiB) per call, so a job that writes without pause (`yes`)
    /// cannot keep the loop reading: the rest waits for the next wake-up.
    pub fn read_output(&mut self) {
        let Some(pipe) = &self.pipe else { return };
        let mut buf = [0u8; 4096];
        for _ in 0..16 {
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

    /// The job's process exited: what it wrote, as text.
    pub fn finish(mut self) -> String {
        self.read_output();
        let mut output = String::from_utf8_lossy(self.tail.make_contiguous()).into_owned();
        if self.dropped {
            output.insert_str(0, "[...] ");
        }
        output
    }
}
