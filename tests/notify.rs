//! The notify socket (`tend::notify`): real datagrams, from the test process
//! and from children, arrive with their sender's pid.

mod common;

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command};

use common::alone::alone;
use common::{Sandbox, Tend, secs};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tend::notify::{self, MAX_MESSAGE, NotifySocket};

/// Waits (bounded) until the socket holds a datagram, then takes them all.
fn receive(socket: &NotifySocket) -> Vec<(Pid, Vec<u8>)> {
    let mut fds = [PollFd::new(socket.fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::try_from(secs(20.0)).unwrap()).unwrap();
    assert_eq!(ready, 1, "no notify message within 20 s");
    socket.recv()
}

fn python(socket: &NotifySocket, code: &str) -> Child {
    Command::new("python3")
        .args(["-c", code])
        .env("NOTIFY_SOCKET", socket.path())
        .spawn()
        .unwrap()
}

fn finish(mut child: Child) {
    // Bounded by the child: each script only sends and exits.
    assert!(child.wait().unwrap().success());
}

const SD_NOTIFY: &str = r#"
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"READY=1\nSTATUS=serving", os.environ["NOTIFY_SOCKET"])
"#;

#[test]
fn a_message_from_this_process_carries_its_pid() {
    let socket = NotifySocket::new().unwrap();
    assert!(socket.recv().is_empty(), "nothing queued, and no wait");
    let sender = UnixDatagram::unbound().unwrap();
    sender.send_to(b"STATUS=one", socket.path()).unwrap();
    sender.send_to(b"STATUS=two", socket.path()).unwrap();
    let me = nix::unistd::getpid();
    assert_eq!(
        receive(&socket),
        [(me, b"STATUS=one".to_vec()), (me, b"STATUS=two".to_vec())]
    );
    assert!(socket.recv().is_empty(), "all of them were taken");
}

#[test]
fn a_child_sending_like_sd_notify_is_seen_with_its_own_pid() {
    let socket = NotifySocket::new().unwrap();
    let child = python(&socket, SD_NOTIFY);
    let pid = Pid::from_raw(child.id() as i32);
    let got = receive(&socket);
    finish(child);
    assert_eq!(got, [(pid, b"READY=1\nSTATUS=serving".to_vec())]);
}

#[test]
fn a_long_message_is_cut_and_the_next_one_is_whole() {
    let socket = NotifySocket::new().unwrap();
    let sender = UnixDatagram::unbound().unwrap();
    let long = vec![b'x'; MAX_MESSAGE * 2];
    sender.send_to(&long, socket.path()).unwrap();
    sender.send_to(b"READY=1", socket.path()).unwrap();
    let got = receive(&socket);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, vec![b'x'; MAX_MESSAGE]);
    assert_eq!(got[1].1, b"READY=1");
}

/// Any user may send (a service may drop its privileges before READY=1),
/// but only tend's user can list the directory or put anything in it.
#[test]
fn the_socket_is_open_to_all_in_a_directory_that_only_tend_writes_and_that_goes_with_it() {
    let socket = NotifySocket::new().unwrap();
    let path = socket.path().to_path_buf();
    let dir = path.parent().unwrap().to_path_buf();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o711, "{}", dir.display());
    assert_eq!(mode(&path), 0o666, "{}", path.display());
    assert!(
        dir.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("tend-notify-"),
        "{}",
        dir.display()
    );
    drop(socket);
    assert!(
        !path.exists() && !dir.exists(),
        "{} is left behind",
        dir.display()
    );
}

#[test]
fn fds_sent_along_a_message_are_closed() {
    alone("fds_sent_along_a_message_are_closed", || {
        let socket = NotifySocket::new().unwrap();
        let open = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let before = open();
        let child = python(
            &socket,
            r#"
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(os.environ["NOTIFY_SOCKET"])
r, w = os.pipe()
socket.send_fds(s, [b"FDSTORE=1"], [r, w])
"#,
        );
        let pid = Pid::from_raw(child.id() as i32);
        let got = receive(&socket);
        finish(child);
        assert_eq!(got, [(pid, b"FDSTORE=1".to_vec())]);
        assert_eq!(open(), before, "the passed pipe is not kept");
    });
}

#[test]
fn ancestry_leads_from_a_grandchild_through_its_parent_to_us() {
    let mut sh = Command::new("sh")
        .args(["-c", "sleep 30 & echo $!; wait"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let parent = Pid::from_raw(sh.id() as i32);
    let mut line = String::new();
    BufReader::new(sh.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let grandchild = Pid::from_raw(line.trim().parse().unwrap());
    let chain = notify::ancestry(grandchild);
    kill(grandchild, Signal::SIGKILL).unwrap();
    sh.wait().unwrap();
    assert_eq!(chain[..3], [grandchild, parent, nix::unistd::getpid()]);
    assert!(chain.len() <= 64);
    assert_eq!(
        notify::ancestry(grandchild),
        [grandchild],
        "gone, so only itself"
    );
}

// ------------------------------------------------- tend as PID 1, notify = true

/// A service that says READY=1, waits for SIGUSR1, then sends tend one
/// datagram per argument with that many fds (copies of a pipe's write end),
/// closes its own copy, and says STATUS=closed once the pipe tells that no
/// copy is left open anywhere (STATUS=leaked if one is after 10 s).
const FD_SENDER: &str = r#"
import os, select, signal, socket, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
path = os.environ["NOTIFY_SOCKET"]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(path)
def say(text, fds=()):
    socket.send_fds(s, [text.encode()], list(fds))
say("READY=1\nSTATUS=waiting")
signal.sigwait({signal.SIGUSR1})
r, w = os.pipe()
for n in sys.argv[1:]:
    say("STATUS=sending", [w] * int(n))
os.close(w)
ready, _, _ = select.select([r], [], [], 10)
say("STATUS=" + ("closed" if ready and os.read(r, 1) == b"" else "leaked"))
signal.pause()
"#;

/// The same from a process outside the service's tree: exits 0 once every
/// copy is closed, 1 if one is still open after 10 s.
const OUTSIDE_FD_SENDER: &str = r#"
import os, select, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(sys.argv[1])
r, w = os.pipe()
for n in sys.argv[2:]:
    socket.send_fds(s, [b"READY=1"], [w] * int(n))
os.close(w)
ready, _, _ = select.select([r], [], [], 10)
sys.exit(0 if ready and os.read(r, 1) == b"" else 1)
"#;

/// tend with its notify socket in the sandbox (TMPDIR), so that a tend
/// killed at the end of a test leaves no socket directory behind.
fn tend_in(sb: &Sandbox) -> common::TendBuilder<'_> {
    let tmp = sb.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    sb.tend().env("TMPDIR", &tmp.display().to_string())
}

fn notify_config(sb: &Sandbox, command: &[String]) -> std::path::PathBuf {
    sb.config(&format!(
        "[service]\ncommand = {}\nnotify = true\nready_timeout = \"20s\"\n{}",
        common::toml_list(command),
        sb.readiness_toml()
    ))
}

fn fd_sender(sb: &Sandbox, counts: &[usize]) -> std::path::PathBuf {
    let mut argv = vec!["python3".to_string(), "-c".into(), FD_SENDER.into()];
    argv.extend(counts.iter().map(|n| n.to_string()));
    notify_config(sb, &argv)
}

/// The fds tend has open now.
fn open_fds(tend: &mut Tend) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", tend.pid()))
        .unwrap()
        .count()
}

/// The fds tend holds for good: a status write holds one more for a moment.
fn steady_fds(tend: &mut Tend) -> usize {
    let mut last = open_fds(tend);
    common::wait_every(
        std::time::Duration::from_millis(50),
        "tend's fds to hold still",
        secs(10.0),
        || {
            let now = open_fds(tend);
            (std::mem::replace(&mut last, now) == now).then_some(now)
        },
    )
}

/// Waits until tend has at most `n` fds open again; a leak never goes.
fn wait_open_fds(tend: &mut Tend, n: usize) {
    let mut seen = 0;
    let ok = (0..500).any(|_| {
        seen = open_fds(tend);
        seen <= n || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    });
    assert!(ok, "tend has {seen} fds open, {n} before: they leak");
}

fn service_status(sb: &Sandbox, text: &str) {
    common::wait_for(&format!("STATUS={text}"), secs(20.0), || {
        sb.status()
            .filter(|s| s["service"]["status"] == text || s["service"]["status"] == "leaked")
    });
    assert_eq!(sb.status().unwrap()["service"]["status"], text);
}

/// FDSTORE-style fds are closed, however many come with a datagram: five
/// datagrams of 17 fds each (more than a 16-fd control buffer holds), and
/// one of 253 (the most the kernel lets a message carry).
#[test]
fn every_fd_sent_to_tend_is_closed() {
    let sb = Sandbox::new();
    let cfg = fd_sender(&sb, &[17, 17, 17, 17, 17, 253, 1]);
    let mut tend = tend_in(&sb).config(&cfg).start();
    service_status(&sb, "waiting");
    let before = steady_fds(&mut tend);
    tend.signal(Signal::SIGUSR1);
    service_status(&sb, "closed");
    wait_open_fds(&mut tend, before);
    assert!(
        sb.is_ready(),
        "the datagrams still count: {}",
        tend.stderr()
    );
}

#[test]
fn fds_sent_from_outside_the_service_tree_are_closed_too() {
    let sb = Sandbox::new();
    let cfg = fd_sender(&sb, &[]);
    let mut tend = tend_in(&sb).config(&cfg).start();
    service_status(&sb, "waiting");
    let before = steady_fds(&mut tend);
    let socket = service_env(&mut tend, "NOTIFY_SOCKET");
    let sent = Command::new("nsenter")
        .args(["-t", &tend.pid().to_string(), "-p", "python3", "-c"])
        .args([
            OUTSIDE_FD_SENDER,
            &socket,
            "17",
            "17",
            "17",
            "17",
            "17",
            "253",
        ])
        .status()
        .unwrap();
    assert!(sent.success(), "a copy of the pipe is still open in tend");
    wait_open_fds(&mut tend, before);
    tend.wait_stderr("outside the service's process tree", secs(5.0));
}

/// With tend's fd table nearly full the kernel installs the fds that fit
/// and releases the rest (MSG_CTRUNC): the ones installed are closed, and
/// the cut is said once.
#[test]
fn fds_that_fill_tends_table_are_closed_and_the_cut_is_said_once() {
    let sb = Sandbox::new();
    let cfg = fd_sender(&sb, &[253, 253, 253]);
    let limit = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    let mut tend = tend_in(&sb)
        .config(&cfg)
        .pre_exec(move || {
            // SAFETY: setrlimit is async-signal-safe.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
        .start();
    service_status(&sb, "waiting");
    let before = steady_fds(&mut tend);
    assert!(before < 64, "{before} fds open");
    tend.signal(Signal::SIGUSR1);
    service_status(&sb, "closed");
    wait_open_fds(&mut tend, before);
    assert!(sb.is_ready());
    // Said once; the rest are counted in a line of their own, at most
    // once every 10 s.
    let (_, log) = tend.stop(secs(10.0));
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("(MSG_CTRUNC)") && !l.contains("more notification(s)"))
        .collect();
    assert_eq!(said.len(), 1, "said once, the rest counted:\n{log}");
}

/// A variable of the service's environment.
fn service_env(tend: &mut Tend, name: &str) -> String {
    let pid = common::svc::host_pid_of(tend, "python3");
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let prefix = format!("{name}=");
    env.split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_else(|| panic!("the service has no {name}"))
}

/// Sends READY=1 to argv[1] as fast as it can for argv[2] seconds, creates
/// the file argv[3] once the first ones are sent, and prints how many it
/// sent.
const FLOOD: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(sys.argv[1])
end, sent = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    for _ in range(100):
        s.send(b"READY=1")
    sent += 100
    if sent == 100:
        open(sys.argv[3], "w").close()
print(sent)
"#;

/// tend's CPU time so far (user + system), in clock ticks (10 ms).
fn cpu_ticks(tend: &mut Tend) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", tend.pid())).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// What a flood of READY=1 cost tend.
struct Flooded {
    sent: u64,
    /// Clock ticks of tend's CPU from the flood's start until tend was idle.
    cpu: u64,
    /// Bytes tend logged meanwhile.
    logged: usize,
}

const FLOOD_SECS: u64 = 4;

/// Floods the notify socket of the `fd_sender` service for FLOOD_SECS from a
/// process of tend's PID namespace (`nsenter`), or from this one, outside
/// it; in the middle, the service says STATUS=closed, which must get
/// through before the flood ends.
fn flood(sb: &Sandbox, tend: &mut Tend, in_tends_namespace: bool) -> Flooded {
    let socket = service_env(tend, "NOTIFY_SOCKET");
    let started = sb.path("flood.started");
    // The start's lines are all in before the flood's are counted.
    let log_before = tend.wait_stderr("the service is ready", secs(10.0)).len();
    let cpu_before = cpu_ticks(tend);
    let mut cmd = Command::new("timeout");
    cmd.arg("30");
    if in_tends_namespace {
        cmd.args(["nsenter", "-t", &tend.pid().to_string(), "-p"]);
    }
    let mut flood = cmd
        .args(["python3", "-c", FLOOD, &socket, &FLOOD_SECS.to_string()])
        .arg(&started)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for("the flood to start", secs(10.0), || {
        started.exists().then_some(())
    });
    // The service speaks up in the middle of the flood.
    tend.signal(Signal::SIGUSR1);
    service_status(sb, "closed");
    assert!(
        flood.try_wait().unwrap().is_none(),
        "the service's STATUS= came through only after the flood"
    );
    let done = common::wait_for("the flood to end", secs(30.0), || flood.try_wait().unwrap());
    assert!(done.success(), "{done:?}");
    let mut out = String::new();
    std::io::Read::read_to_string(flood.stdout.as_mut().unwrap(), &mut out).unwrap();
    let sent: u64 = out.trim().parse().unwrap();
    // What was still queued is taken: tend goes idle again.
    let mut last = cpu_ticks(tend);
    common::wait_every(
        std::time::Duration::from_millis(200),
        "tend to go idle",
        secs(10.0),
        || {
            let now = cpu_ticks(tend);
            (std::mem::replace(&mut last, now) == now).then_some(())
        },
    );
    let flooded = Flooded {
        sent,
        cpu: cpu_ticks(tend) - cpu_before,
        logged: tend.stderr().len() - log_before,
    };
    println!(
        "{sent} datagrams in {FLOOD_SECS} s: {} bytes of log, {} ticks of tend's CPU",
        flooded.logged, flooded.cpu
    );
    assert!(sent > 1000, "the flood did not get through: {sent}");
    // A quarter of one core at most, where reading as fast as the sender
    // writes took all of it.
    assert!(
        flooded.cpu < FLOOD_SECS * 100 / 4,
        "tend spent {} ticks on {sent} datagrams in {FLOOD_SECS} s",
        flooded.cpu
    );
    assert!(sb.is_ready(), "the service is unaffected");
    flooded
}

/// A process outside the service's tree (a `kubectl exec` shell) that
/// floods the notify socket gets one warning and a count, not a line per
/// datagram; it costs tend a bounded share of a core; and the service's own
/// notifications still get through while it lasts.
#[test]
fn a_flood_from_outside_the_service_tree_is_said_once_and_costs_little() {
    let sb = Sandbox::new();
    let cfg = fd_sender(&sb, &[]);
    let mut tend = tend_in(&sb).config(&cfg).start();
    service_status(&sb, "waiting");
    let flooded = flood(&sb, &mut tend, true);
    // Once the interval is over, the rest is counted in one more line.
    let log = tend.wait_stderr(
        "from processes outside the service's process tree",
        secs(15.0),
    );
    let lines = log.matches("outside the service's process tree").count();
    assert_eq!(
        lines, 2,
        "one line for the flood and one for the count, not one per datagram:\n{log}"
    );
    // "... ignored N more notification(s) from processes outside ..."
    let held: u64 = log
        .split("ignored ")
        .filter_map(|rest| rest.split_once(" more notification(s)"))
        .find_map(|(n, _)| n.parse().ok())
        .expect("the count of the rest");
    assert_eq!(1 + held, flooded.sent, "every datagram is counted:\n{log}");
}

/// From outside tend's PID namespace the kernel gives no sender pid: such
/// datagrams are dropped, and count against the same bound.
#[test]
fn a_flood_from_outside_tends_pid_namespace_costs_little() {
    let sb = Sandbox::new();
    let cfg = fd_sender(&sb, &[]);
    let mut tend = tend_in(&sb).config(&cfg).start();
    service_status(&sb, "waiting");
    let flooded = flood(&sb, &mut tend, false);
    assert!(flooded.logged < 1024, "{}", tend.stderr());
}

/// Sends READY=1 with the uid it runs as, then waits. /usr/bin/python3: an
/// unprivileged user may not be able to reach the python3 in root's PATH.
const READY_AS_WHOEVER: &str = r#"
import os, signal, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(f"READY=1\nSTATUS=ready as {os.getuid()}".encode(), os.environ["NOTIFY_SOCKET"])
signal.pause()
"#;

/// gosu, su-exec and `setpriv --reuid` switch users before the program
/// that says READY=1 runs.
#[test]
fn a_service_that_drops_its_privileges_before_ready_can_notify() {
    let sb = Sandbox::new();
    let argv: Vec<String> = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/python3",
        "-c",
        READY_AS_WHOEVER,
    ]
    .map(String::from)
    .into();
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nnotify = true\nready_timeout = \"10s\"\nworking_dir = \"/\"\n{}",
        common::toml_list(&argv),
        sb.readiness_toml()
    ));
    // In /tmp: the service, as nobody, cannot enter the sandbox.
    let mut tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(15.0));
    assert_eq!(
        sb.status().unwrap()["service"]["status"],
        "ready as 65534",
        "{}",
        tend.stderr()
    );
    let socket = service_env(&mut tend, "NOTIFY_SOCKET");
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(10.0));
    let dir = std::path::Path::new(&socket).parent().unwrap();
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

/// Says STATUS= (not READY=1) per argument, then waits.
const NEVER_READY: &str = r#"
import os, signal, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for text in sys.argv[1:]:
    s.sendto(text.encode(), os.environ["NOTIFY_SOCKET"])
signal.pause()
"#;

/// A service that says each of `said`, but never READY=1 (it has 3 s).
fn never_ready(sb: &Sandbox, said: &[&str]) -> std::path::PathBuf {
    // Not a python3 in PATH that may be a shell script: it says what it
    // says well within ready_timeout.
    let mut argv = vec![
        "/usr/bin/python3".to_string(),
        "-c".into(),
        NEVER_READY.into(),
    ];
    argv.extend(said.iter().map(|s| s.to_string()));
    sb.config(&format!(
        "[service]\ncommand = {}\nnotify = true\nready_timeout = \"3s\"\n{}",
        common::toml_list(&argv),
        sb.readiness_toml()
    ))
}

#[test]
fn a_start_not_ready_in_time_says_what_tend_last_heard_from_the_service() {
    let sb = Sandbox::new();
    let cfg = never_ready(
        &sb,
        &[
            "STATUS=opening the database",
            "STATUS=replaying the journal",
        ],
    );
    let tend = tend_in(&sb).config(&cfg).start();
    tend.wait_stderr(
        "the service did not become ready within 3s (last heard: STATUS=replaying the journal): stopping it",
        secs(10.0),
    );
}

#[test]
fn a_start_not_ready_in_time_says_when_nothing_was_received() {
    let sb = Sandbox::new();
    let cfg = never_ready(&sb, &[]);
    let tend = tend_in(&sb).config(&cfg).start();
    tend.wait_stderr(
        "the service did not become ready within 3s (nothing was received on NOTIFY_SOCKET from it): stopping it",
        secs(10.0),
    );
}

#[test]
fn a_notify_socket_other_users_cannot_reach_is_warned_about() {
    let sb = Sandbox::new();
    let private = sb.path("tmp");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let cfg = never_ready(&sb, &["READY=1"]);
    let tend = sb
        .tend()
        .config(&cfg)
        .env("TMPDIR", &private.display().to_string())
        .start();
    sb.wait_ready(true, secs(10.0));
    tend.wait_stderr(
        &format!(
            "is under {}, which other users cannot enter",
            private.display()
        ),
        secs(5.0),
    );
}

/// recvmsg() that keeps failing (as a seccomp profile can make it) on a
/// socket that stays readable: one warning, and tend does not spin.
#[test]
#[cfg(target_arch = "x86_64")]
fn a_recvmsg_that_keeps_failing_is_said_once_and_does_not_spin() {
    let sb = Sandbox::new();
    let cfg = fd_sender(&sb, &[]);
    // tend's recvmsg on the notify socket alone: by its flags.
    let flags = (libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) as u32;
    let deny = common::DenySyscall::new(libc::SYS_recvmsg, 2, flags, libc::ENOMEM);
    let mut tend = tend_in(&sb)
        .config(&cfg)
        .pre_exec(move || deny.install())
        .start();
    let log = tend.wait_stderr("recvmsg() on the notify socket", secs(10.0));
    assert!(log.contains("failed: ENOMEM"), "{log}");
    let before = cpu_ticks(&mut tend);
    std::thread::sleep(secs(2.0));
    let cpu = cpu_ticks(&mut tend) - before;
    // Once, and again at most once every 10 s, with a count.
    let log = tend.stderr();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("recvmsg() on the notify socket") && !l.contains("since the last such line")
        })
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    // Clock ticks are 10 ms: tend tries again every 20 ms, it does not spin.
    assert!(cpu < 50, "tend spent {cpu} ticks in 2 s");
    assert!(!sb.is_ready());
}

/// A socket directory in `tmp` as a tend killed with SIGKILL leaves it (its
/// socket bound, then closed), or, with `keep`, one whose socket is still
/// listened on; `age` seconds old.
fn socket_dir(tmp: &std::path::Path, name: &str, age: u64, keep: bool) -> Option<UnixDatagram> {
    let dir = tmp.join(name);
    std::fs::create_dir(&dir).unwrap();
    let socket = UnixDatagram::bind(dir.join("notify")).unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
    std::fs::File::open(&dir)
        .unwrap()
        .set_modified(old)
        .unwrap();
    keep.then_some(socket)
}

#[test]
fn socket_directories_earlier_tends_left_behind_are_removed_at_start() {
    let sb = Sandbox::new();
    let tmp = sb.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    socket_dir(&tmp, "tend-notify-AAAAAA", 3600, false);
    let _live = socket_dir(&tmp, "tend-notify-BBBBBB", 3600, true);
    socket_dir(&tmp, "tend-notify-CCCCCC", 0, false);
    std::fs::create_dir(tmp.join("tend-notify-DDDDDD")).unwrap();
    std::fs::write(tmp.join("tend-notify-DDDDDD/notify"), "not a socket").unwrap();
    std::fs::File::open(tmp.join("tend-notify-DDDDDD"))
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    let cfg = notify_config(&sb, &sb.service(&[]));
    let mut tend = tend_in(&sb).config(&cfg).start();
    sb.wait_log("service start", 1, secs(20.0));
    let mut left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left.len(),
        4,
        "{left:?}: its own, and three that are not stale"
    );
    assert!(
        !left.contains(&"tend-notify-AAAAAA".to_string()),
        "the stale one went"
    );
    for kept in [
        "tend-notify-BBBBBB",
        "tend-notify-CCCCCC",
        "tend-notify-DDDDDD",
    ] {
        assert!(
            left.contains(&kept.to_string()),
            "{kept} (live, young, not tend's) stays"
        );
    }
    tend.signal(Signal::SIGTERM);
    tend.wait(secs(20.0));
}
