//! strace attached to one thread of a running tend, to kill it at one of
//! its system calls or make that call fail (`--inject`), as a crash or a
//! full disk would, at exactly that moment.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::{Tend, secs, wait_for};

pub struct Strace {
    child: Child,
    log: PathBuf,
    err: PathBuf,
}

impl Strace {
    /// Attaches to tend's thread `thread` ("tend", the loop, or "watcher")
    /// and injects `what` (strace's syntax: `signal=SIGKILL:when=3`,
    /// `error=ENOSPC:when=1`) into its calls of `call`, counted from now.
    /// Returns once strace is attached.
    pub fn inject(tend: &mut Tend, thread: &str, call: &str, what: &str) -> Strace {
        let tid = thread_id(tend.pid(), thread);
        let dir = tempfile::Builder::new()
            .prefix("tend-strace-")
            .tempdir()
            .unwrap()
            .keep();
        let (log, err) = (dir.join("trace"), dir.join("stderr"));
        let child = Command::new("strace")
            .args(["-p", &tid.to_string(), "-y", "-o"])
            .arg(&log)
            .args(["-e", &format!("trace={call}")])
            .args(["-e", &format!("inject={call}:{what}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&err).unwrap())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run strace ({e}): scripts/install-deps installs it")
            });
        let mut s = Strace { child, log, err };
        wait_for("strace to attach", secs(10.0), || {
            let err = fs::read_to_string(&s.err).unwrap_or_default();
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("strace exited ({status}): {err}");
            }
            err.contains("attached").then_some(())
        });
        s
    }

    /// What strace saw of the calls it traced.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

use std::os::unix::process::CommandExt as _;

impl Drop for Strace {
    /// Detaches (the tracee goes on) and removes the log.
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + secs(5.0);
        while self.child.try_wait().ok().flatten().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(secs(0.01));
        }
        if let Some(dir) = self.log.parent() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// The id of the thread of process `pid` named `name`.
fn thread_id(pid: i32, name: &str) -> i32 {
    wait_for(&format!("tend's thread {name:?}"), secs(10.0), || {
        fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
            .find(|t| fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))?
            .file_name()
            .to_str()?
            .parse()
            .ok()
    })
}
