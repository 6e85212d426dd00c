//! Helpers for the integration tests: a sandbox directory, the instrumented
//! service (tests/support/service.py), and tend started as the real PID 1 of a
//! new PID namespace (`unshare --pid --fork --mount-proc`, which needs root).
//!
//! Tests synchronise on files (the service's log, tend's stderr, the ready
//! file) with bounded waits; nothing sleeps for a fixed time unless it is
//! checking that something does *not* happen.

#![allow(dead_code)]

pub mod alone;
pub mod gate;
pub mod http;
pub mod kubelet;
pub mod static_build;
pub mod strace;
pub mod svc;

use std::fs;
use std::io::Read as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TEND: &str = env!("CARGO_BIN_EXE_tend");

/// Waits until `f` returns Some, polling every 10 ms, or panics after
/// `timeout` naming what it waited for.
pub fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_every(Duration::from_millis(10), what, timeout, f)
}

/// [`wait_for`], polling every `interval`.
pub fn wait_every<T>(
    interval: Duration,
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(interval);
    }
}

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the integration tests run tend as PID 1 with `unshare --pid`: run them as root"
        );
        Sandbox {
            dir: tempfile::Builder::new()
                .prefix("tend-test-")
                .tempdir()
                .unwrap(),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.path(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&p, content).unwrap();
        p
    }

    /// Writes supervisor.toml and returns its path.
    pub fn config(&self, toml: &str) -> PathBuf {
        self.write("supervisor.toml", toml)
    }

    /// The argv of the instrumented service, logging to this sandbox.
    pub fn service(&self, extra: &[&str]) -> Vec<String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/service.py");
        let mut argv = vec![
            "python3".to_string(),
            script.display().to_string(),
            "--log".into(),
            self.path("service.log").display().to_string(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        argv
    }

    /// The service's argv as a TOML array.
    pub fn service_toml(&self, extra: &[&str]) -> String {
        toml_list(&self.service(extra))
    }

    /// Lines of the service log that start with `prefix`.
    pub fn log(&self, prefix: &str) -> Vec<String> {
        fs::read_to_string(self.path("service.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(String::from)
            .collect()
    }

    /// Waits for at least `n` lines starting with `prefix` and returns them all.
    pub fn wait_log(&self, prefix: &str, n: usize, timeout: Duration) -> Vec<String> {
        wait_for(&format!("{n} log line(s) {prefix:?}"), timeout, || {
            let lines = self.log(prefix);
            (lines.len() >= n).then_some(lines)
        })
    }

    /// The [readiness] section writing into this sandbox.
    pub fn readiness_toml(&self) -> String {
        format!(
            "[readiness]\nfile = {:?}\nstatus_file = {:?}\n",
            self.path("ready").display().to_string(),
            self.path("status.json").display().to_string()
        )
    }

    pub fn is_ready(&self) -> bool {
        self.path("ready").exists()
    }

    pub fn wait_ready(&self, ready: bool, timeout: Duration) {
        let what = if ready {
            "the ready file"
        } else {
            "the ready file to go"
        };
        wait_for(what, timeout, || (self.is_ready() == ready).then_some(()));
    }

    /// The status file, parsed.
    pub fn status(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&fs::read(self.path("status.json")).ok()?).ok()
    }

    /// Waits until the status file's `state` is `state`, and returns it.
    pub fn wait_state(&self, state: &str, timeout: Duration) -> serde_json::Value {
        wait_for(&format!("status state {state:?}"), timeout, || {
            self.status().filter(|s| s["state"] == state)
        })
    }

    /// The `config=` part of the service's signal lines for `sig`.
    pub fn seen_on(&self, sig: &str) -> Vec<String> {
        self.log(&format!("service sig {sig} "))
            .iter()
            .map(|l| l.split(" config=").nth(1).unwrap_or("").to_string())
            .collect()
    }

    pub fn tend(&self) -> TendBuilder<'_> {
        TendBuilder {
            sandbox: self,
            args: Vec::new(),
            env: Vec::new(),
            pid1: true,
            stdin: None,
            stdio: None,
            pre_exec: None,
            wrapper: None,
            ignored: Vec::new(),
        }
    }
}

/// `tend probe --config cfg`: its exit code and its line.
pub fn probe(cfg: &Path) -> (i32, String) {
    let out = std::process::Command::new(TEND)
        .args(["probe", "--config"])
        .arg(cfg)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `["sh", "-c", script]` as a TOML array: a command that needs a shell.
pub fn sh(script: &str) -> String {
    toml_list(&["sh".into(), "-c".into(), script.to_string()])
}

pub fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

pub struct TendBuilder<'a> {
    sandbox: &'a Sandbox,
    args: Vec<String>,
    env: Vec<(String, String)>,
    pid1: bool,
    stdin: Option<Stdio>,
    stdio: Option<(Stdio, Stdio)>,
    pre_exec: Option<Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>>,
    wrapper: Option<Vec<String>>,
    ignored: Vec<i32>,
}

/// Sets the signals in argv[1] (comma-separated numbers) to SIG_IGN and execs
/// argv[2..] in place, which keeps them ignored. Python's own SIGPIPE and
/// SIGXFSZ are put back to the default first.
const IGNORE_AND_EXEC: &str = "import os, signal, sys\n\
    for s in (signal.SIGPIPE, signal.SIGXFSZ): signal.signal(s, signal.SIG_DFL)\n\
    for s in sys.argv[1].split(','): signal.signal(int(s), signal.SIG_IGN)\n\
    os.execv(sys.argv[2], sys.argv[2:])\n";

impl TendBuilder<'_> {
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Self {
        self.args
            .extend(args.iter().map(|s| s.as_ref().to_string()));
        self
    }

    pub fn config(self, path: &Path) -> Self {
        self.args(&["--config", &path.display().to_string()])
    }

    /// `-- COMMAND...`
    pub fn command<S: AsRef<str>>(self, argv: &[S]) -> Self {
        self.args(&["--"]).args(argv)
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Runs tend directly (as a subreaper) rather than as PID 1.
    pub fn not_pid1(mut self) -> Self {
        self.pid1 = false;
        self
    }

    pub fn stdin(mut self, stdin: Stdio) -> Self {
        self.stdin = Some(stdin);
        self
    }

    /// tend's stdout and stderr, instead of the sandbox's tend.stdout and
    /// tend.stderr files (which then stay empty).
    pub fn stdio(mut self, stdout: Stdio, stderr: Stdio) -> Self {
        self.stdio = Some((stdout, stderr));
        self
    }

    /// Runs `program args...` instead, which is to fork and exec tend as
    /// its only child (unshare with a user namespace, a chroot); tend's own
    /// arguments are ignored.
    pub fn wrapped(mut self, program: &str, args: &[&str]) -> Self {
        let mut argv = vec![program.to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        self.wrapper = Some(argv);
        self
    }

    /// tend as PID 1 of a new PID namespace, running as `uid` (its group
    /// too, no supplementary groups) with config `cfg`, as an image whose
    /// `USER` is not root runs it.
    pub fn run_as(self, uid: u32, cfg: &Path) -> Self {
        let (reuid, regid) = (format!("--reuid={uid}"), format!("--regid={uid}"));
        let cfg = cfg.display().to_string();
        self.wrapped(
            "unshare",
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "setpriv",
                &reuid,
                &regid,
                "--clear-groups",
                TEND,
                "--config",
                &cfg,
            ],
        )
    }

    /// Runs in the child before exec (before unshare, which passes on what it inherited).
    pub fn pre_exec(
        mut self,
        f: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.pre_exec = Some(Box::new(f));
        self
    }

    /// Starts tend with these signals ignored (SIG_IGN), as a careless parent
    /// might: a launcher ignores them and execs tend in place, after
    /// `unshare`, which itself resets SIGCHLD for its own sake.
    pub fn ignoring(mut self, signals: &[i32]) -> Self {
        self.ignored.extend(signals);
        self
    }

    pub fn start(self) -> Tend {
        let out = self.sandbox.path("tend.stdout");
        let err = self.sandbox.path("tend.stderr");
        let mut tend = vec![TEND.to_string()];
        if !self.ignored.is_empty() {
            let list: Vec<String> = self.ignored.iter().map(|s| s.to_string()).collect();
            tend.splice(
                0..0,
                ["python3", "-c", IGNORE_AND_EXEC, &list.join(",")].map(String::from),
            );
        }
        let mut cmd = if let Some(argv) = &self.wrapper {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        } else if self.pid1 {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--kill-child", "--mount-proc"]);
            c.args(&tend).args(&self.args);
            c
        } else {
            let mut c = Command::new(&tend[0]);
            c.args(&tend[1..]).args(&self.args);
            c
        };
        // What tend makes in $TMPDIR (the notify socket's directory) goes
        // with the sandbox, even when a test ends by killing tend.
        cmd.current_dir(self.sandbox.path(""))
            .env("TMPDIR", self.sandbox.path(""))
            .env_remove("TEND_CONFIG")
            .env_remove("TEND_LOG")
            .env_remove("TEND_LOG_FORMAT")
            .envs(self.env)
            .stdin(self.stdin.unwrap_or(Stdio::null()));
        let (stdout, stderr) = self.stdio.unwrap_or_else(|| {
            (
                fs::File::create(&out).unwrap().into(),
                fs::File::create(&err).unwrap().into(),
            )
        });
        cmd.stdout(stdout).stderr(stderr);
        if let Some(f) = self.pre_exec {
            // SAFETY: test-only hooks, documented as async-signal-safe by their callers.
            unsafe { cmd.pre_exec(f) };
        } else {
            cmd.process_group(0);
        }
        let child = cmd.spawn().expect("start tend");
        let started = Instant::now();
        Tend {
            child,
            pid1: self.pid1,
            host_pid: None,
            out,
            err,
            started,
        }
    }

    /// Starts tend and waits until the service has logged its start (its
    /// signal handlers are in place) and tend is ready.
    pub fn start_ready(self) -> Tend {
        let sb = self.sandbox;
        let tend = self.start();
        sb.wait_log("service start", 1, secs(10.0));
        sb.wait_ready(true, secs(10.0));
        tend
    }

    /// Starts tend and waits for it to exit: (exit code, stdout, stderr).
    pub fn run(self, timeout: Duration) -> (i32, String, String) {
        let mut t = self.start();
        let code = t.wait(timeout);
        (code, t.stdout(), t.stderr())
    }
}

pub struct Tend {
    child: Child,
    pid1: bool,
    host_pid: Option<i32>,
    out: PathBuf,
    err: PathBuf,
    pub started: Instant,
}

impl Tend {
    /// tend's pid as this test sees it (under unshare or a wrapper, the
    /// child of the process the test started).
    pub fn pid(&mut self) -> i32 {
        if let Some(p) = self.host_pid {
            return p;
        }
        let p = if self.pid1 {
            let unshare = self.child.id();
            wait_for("tend to start under unshare", secs(10.0), || {
                fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                    .ok()?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
        } else {
            self.child.id() as i32
        };
        self.host_pid = Some(p);
        p
    }

    pub fn signal(&mut self, sig: nix::sys::signal::Signal) {
        let pid = self.pid();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
    }

    /// Sends signal number `signo` with kill(2): realtime signals too.
    pub fn signal_number(&mut self, signo: i32) {
        let pid = self.pid();
        // SAFETY: kill(2) takes two integers.
        let ret = unsafe { libc::kill(pid, signo) };
        assert_eq!(
            ret,
            0,
            "kill({pid}, {signo}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// Waits for tend to exit and returns its exit code (128+N for a signal).
    pub fn wait(&mut self, timeout: Duration) -> i32 {
        let status = wait_for("tend to exit", timeout, || self.child.try_wait().unwrap());
        use std::os::unix::process::ExitStatusExt;
        status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap())
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits until tend's log contains `needle`, and returns the log.
    ///
    /// tend's lines reach its stderr through a writer thread, a moment
    /// after what they tell (a status file, a ready file, a service's own
    /// log) changed: a test that saw that change and asserts a line while
    /// tend runs waits for it here. What the log must *not* hold is only
    /// final once tend exited (it flushes its queue at exit), or once a
    /// later line is there.
    pub fn wait_stderr(&self, needle: &str, timeout: Duration) -> String {
        self.wait_stderr_count(needle, 1, timeout)
    }

    /// Waits until tend's log contains each of `needles`, and returns it.
    pub fn wait_stderr_all(&self, needles: &[&str], timeout: Duration) -> String {
        wait_for(&format!("{needles:?} in tend's log"), timeout, || {
            let e = self.stderr();
            needles.iter().all(|n| e.contains(n)).then_some(e)
        })
    }

    /// Waits until tend's log contains `needle` at least `n` times, and
    /// returns it.
    pub fn wait_stderr_count(&self, needle: &str, n: usize, timeout: Duration) -> String {
        wait_for(
            &format!("{n} time(s) {needle:?} in tend's log"),
            timeout,
            || {
                let e = self.stderr();
                (e.matches(needle).count() >= n).then_some(e)
            },
        )
    }

    /// SIGTERM, then waits for tend to exit: its exit code and its whole
    /// log, final (tend flushes its queue at exit).
    pub fn stop(&mut self, timeout: Duration) -> (i32, String) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let code = self.wait(timeout);
        (code, self.stderr())
    }

    /// Host pids of tend's children, with their state letter (R, S, Z, ...).
    /// Context switches of every thread of tend so far: unchanged while
    /// tend sleeps.
    pub fn context_switches(&mut self) -> u64 {
        let pid = self.pid();
        let mut n = 0;
        for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
            n += status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        }
        n
    }

    pub fn children(&mut self) -> Vec<(i32, char)> {
        let tend = self.pid();
        let mut out = Vec::new();
        for entry in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let mut stat = String::new();
            if fs::File::open(format!("/proc/{pid}/stat"))
                .and_then(|mut f| f.read_to_string(&mut stat))
                .is_err()
            {
                continue;
            }
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
            let ppid: i32 = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            if ppid == tend {
                out.push((pid, state));
            }
        }
        out
    }
}

impl Drop for Tend {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- tend's stderr ---\n{}--- end of tend's stderr ---",
                self.stderr()
            );
        }
        // Everything the test started goes: tend (as PID 1 its namespace
        // with it) and all below it, which as a subreaper or under setpriv
        // (which clears the parent-death signal) would otherwise live on.
        if self.child.try_wait().ok().flatten().is_none() {
            kill_tree(self.child.id() as i32);
            let _ = self.child.wait();
        }
        if let Some(p) = self.host_pid {
            kill_tree(p);
        }
    }
}

/// Sends SIGKILL to `root` and every process below it, until none is left
/// (bounded: two seconds).
pub fn kill_tree(root: i32) {
    let deadline = Instant::now() + secs(2.0);
    loop {
        let mut tree = vec![root];
        let mut i = 0;
        let parents = parent_pids();
        while i < tree.len() {
            let parent = tree[i];
            tree.extend(
                parents
                    .iter()
                    .filter(|(_, ppid)| *ppid == parent)
                    .map(|(pid, _)| *pid),
            );
            i += 1;
        }
        let alive: Vec<i32> = tree
            .into_iter()
            .filter(|p| process_state(*p).is_some_and(|s| s != 'Z'))
            .collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return;
        }
        for p in alive {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// (pid, parent pid) of every process this test can see.
fn parent_pids() -> Vec<(i32, i32)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat_fields(pid)?.1)))
        .collect()
}

/// The state letter of `pid` (R, S, T, Z, ...), while it exists.
pub fn process_state(pid: i32) -> Option<char> {
    stat_fields(pid).map(|(state, _)| state)
}

/// State and parent pid from /proc/PID/stat.
fn stat_fields(pid: i32) -> Option<(char, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// A seccomp filter that makes one system call fail with `errno` whenever its
/// argument number `arg` equals `value` (its low 32 bits), and allows
/// everything else: what a container runtime's seccomp profile can do. It is
/// inherited by tend and everything tend starts.
#[cfg(target_arch = "x86_64")]
pub struct DenySyscall {
    program: Vec<libc::sock_filter>,
}

#[cfg(target_arch = "x86_64")]
impl DenySyscall {
    pub fn new(syscall: libc::c_long, arg: u32, value: u32, errno: i32) -> DenySyscall {
        const LD_ABS_W: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
        const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
        const RET_K: u16 = 0x06; // BPF_RET | BPF_K
        const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
        const RET_ERRNO: u32 = 0x0005_0000;
        const RET_ALLOW: u32 = 0x7fff_0000;
        let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
        // struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low half first).
        DenySyscall {
            program: vec![
                op(LD_ABS_W, 0, 0, 4),
                op(JEQ_K, 0, 5, AUDIT_ARCH_X86_64),
                op(LD_ABS_W, 0, 0, 0),
                op(JEQ_K, 0, 3, syscall as u32),
                op(LD_ABS_W, 0, 0, 16 + 8 * arg),
                op(JEQ_K, 0, 1, value),
                op(RET_K, 0, 0, RET_ERRNO | errno as u32),
                op(RET_K, 0, 0, RET_ALLOW),
            ],
        }
    }

    /// Installs the filter on the calling process. Async-signal-safe, for a
    /// pre_exec hook.
    pub fn install(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: prctl reads `prog`, which points into `self.program`.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
