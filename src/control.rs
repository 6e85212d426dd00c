//! The control socket behind `tend signal NAME SIG` and `tend restart NAME`.
//!
//! Theory of operation. A unix stream socket beside the status file
//! (`status.json` has `status.json.sock`), which only tend's own user and
//! root may use: the file has mode 0600 from the moment its name exists (it
//! is bound in a private directory, given its mode there, then renamed into
//! place), and each client's credentials (SO_PEERCRED) are checked too. One
//! request per connection: one line in (`signal NAME SIGNO`, `restart
//! NAME`), one line out (`CODE message`, CODE being the exit code the
//! command returns). The server is the HTTP server's discipline again:
//! non-blocking sockets in the supervisor's one `ppoll`, at most
//! [`MAX_CLIENTS`] connections (a new one closes the oldest), at most
//! [`MAX_REQUEST`] bytes and [`TIMEOUT`] per connection, failed accepts said
//! once a minute. A request becomes an [`Event::Control`] for the core; its
//! [`Command::Answer`](crate::core::Command::Answer) comes back through
//! [`ControlSocket::answer`].
//!
//! A socket left by a tend that was killed is replaced at start, and so is
//! the private directory of a creation that was cut short; the socket is
//! removed when tend exits.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::PollFlags;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, accept4, bind, getsockopt, listen, recv,
    send, socket, sockopt,
};

use crate::core::{ControlRequest, Event};
use crate::signals::SignalName;

/// Connections open at once; one more closes the oldest.
pub const MAX_CLIENTS: usize = 16;
/// The longest request line that is read.
pub const MAX_REQUEST: usize = 512;
/// The longest a connection stays open, from accept to close.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// How long `tend signal` and `tend restart` wait for tend.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections the kernel queues until tend takes them.
const BACKLOG: usize = 16;
/// accept() failed for want of file descriptors or memory: the listener is
/// left alone this long, rather than polled in a busy loop.
const ACCEPT_PAUSE: Duration = Duration::from_millis(250);
/// A failed accept(), or a client of another user, is logged at most this
/// often.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// The name of the socket inside the private directory it is bound in.
const BOUND_AS: &str = "sock";

mod client;
pub use client::{Ask, ask};

/// The control socket of a tend whose status file is `status_file`.
pub fn socket_path(status_file: &Path) -> PathBuf {
    let mut name = status_file.as_os_str().to_owned();
    name.push(".sock");
    PathBuf::from(name)
}

pub struct ControlSocket {
    listener: OwnedFd,
    path: PathBuf,
    /// The socket file's device and inode: at exit it is removed only while
    /// the name is still this socket.
    file: (u64, u64),
    /// tend's effective uid: its clients (and root's) are served.
    uid: u32,
    /// Readable at the last ppoll.
    listener_ready: bool,
    conns: Vec<Conn>,
    next_client: u64,
    /// accept() is not tried again before then (see [`ACCEPT_PAUSE`]).
    paused_until: Option<Instant>,
    /// When a failed accept() or a refused client was last logged.
    warned: Option<Instant>,
}

struct Conn {
    client: u64,
    fd: OwnedFd,
    /// The client's pid, for the log.
    pid: u32,
    opened: Instant,
    stage: Stage,
    /// Ready at the last ppoll (or just accepted).
    ready: bool,
}

enum Stage {
    /// The request line so far.
    Reading(Vec<u8>),
    /// The core has the request; its answer comes next. Not polled.
    Asked,
    /// The answer line, and how much of it was sent.
    Writing(Vec<u8>, usize),
}

impl ControlSocket {
    /// Creates the socket beside `status_file` (and its directory, when
    /// missing), replacing one an earlier tend left there.
    pub fn open(status_file: &Path) -> io::Result<ControlSocket> {
        let path = socket_path(status_file);
        let fail = |what: String, e: io::Error| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot create the control socket {}: {what}: {e}",
                    path.display()
                ),
            )
        };
        let (dir, name) = match (path.parent(), path.file_name()) {
            (Some(d), Some(n)) if !d.as_os_str().is_empty() => (d.to_path_buf(), n.to_owned()),
            (_, Some(n)) => (PathBuf::from("."), n.to_owned()),
            _ => unreachable!("a name with .sock appended has a file name"),
        };
        if !dir.exists() {
            crate::status::create_dirs(&dir).map_err(|e| fail("its directory".into(), e))?;
        }
        remove_leftovers(&dir, &name);
        match fs::symlink_metadata(&path) {
            Ok(m) if !m.file_type().is_socket() => {
                return Err(fail(
                    "rename()".into(),
                    io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "something other than a socket has that name; tend replaces only a \
                         socket an earlier tend left",
                    ),
                ));
            }
            _ => {}
        }
        // A private directory (0700): the socket gets its mode there, before
        // its name is one anybody else can reach.
        let mut template = OsString::from(".");
        template.push(&name);
        template.push(".XXXXXX");
        let private = nix::unistd::mkdtemp(&dir.join(template))
            .map_err(|e| fail(format!("mkdtemp() in {}", dir.display()), e.into()))?;
        let bound = private.join(BOUND_AS);
        let made = Self::bind(&bound).and_then(|listener| {
            fs::set_permissions(&bound, fs::Permissions::from_mode(0o600))
                .map_err(|e| fail(format!("chmod() of {}", bound.display()), e))?;
            let meta = fs::symlink_metadata(&bound)
                .map_err(|e| fail(format!("lstat() of {}", bound.display()), e))?;
            fs::rename(&bound, &path)
                .map_err(|e| fail(format!("rename() from {}", bound.display()), e))?;
            Ok((listener, (meta.dev(), meta.ino())))
        });
        if made.is_err() {
            let _ = fs::remove_file(&bound);
        }
        if let Err(e) = fs::remove_dir(&private) {
            tracing::warn!("cannot remove {}: rmdir() failed: {e}", private.display());
        }
        let (listener, file) = made?;
        Ok(ControlSocket {
            listener,
            path,
            file,
            // SAFETY: geteuid has no failure and no memory effects.
            uid: unsafe { libc::geteuid() },
            listener_ready: false,
            conns: Vec::new(),
            next_client: 1,
            paused_until: None,
            warned: None,
        })
    }

    /// A listening socket bound at `path` (close-on-exec, non-blocking).
    fn bind(path: &Path) -> io::Result<OwnedFd> {
        let fail = |call: &str, e: Errno| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "cannot create the control socket: {call} on {}: {}",
                    path.display(),
                    e.desc()
                ),
            )
        };
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| fail("socket()", e))?;
        let addr = UnixAddr::new(path.as_os_str().as_bytes()).map_err(|e| match e {
            Errno::ENAMETOOLONG => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cannot create the control socket: {} is {} bytes long, and the path of \
                         a unix socket holds at most 107: put status_file in a shorter directory",
                    path.display(),
                    path.as_os_str().len()
                ),
            ),
            e => fail("sockaddr_un", e),
        })?;
        bind(fd.as_raw_fd(), &addr).map_err(|e| fail("bind()", e))?;
        let backlog = nix::sys::socket::Backlog::new(BACKLOG as i32).expect("a small backlog");
        listen(&fd, backlog).map_err(|e| fail("listen()", e))?;
        Ok(fd)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What to poll, in order: the listener, then each connection that
    /// waits for the client. Pass the results to
    /// [`ControlSocket::set_ready`] in the same order.
    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        let listen = if self.paused_until.is_some() {
            PollFlags::empty()
        } else {
            PollFlags::POLLIN
        };
        let mut fds = vec![(self.listener.as_fd(), listen)];
        fds.extend(self.conns.iter().filter_map(|c| {
            let flags = match c.stage {
                Stage::Reading(_) => PollFlags::POLLIN,
                Stage::Writing(..) => PollFlags::POLLOUT,
                Stage::Asked => return None,
            };
            Some((c.fd.as_fd(), flags))
        }));
        fds
    }

    /// Which of [`ControlSocket::poll_fds`] ppoll found ready.
    pub fn set_ready(&mut self, ready: &[bool]) {
        self.listener_ready = ready.first().copied().unwrap_or(false);
        let polled = self
            .conns
            .iter_mut()
            .filter(|c| !matches!(c.stage, Stage::Asked));
        for (c, r) in polled.zip(ready.iter().skip(1)) {
            c.ready = *r;
        }
    }

    /// The next time a connection must be closed (or accept() tried again);
    /// None while no client is connected.
    pub fn deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .map(|c| c.opened + TIMEOUT)
            .chain(self.paused_until)
            .min()
    }

    /// Accepts, reads, writes and closes what is ready or due, without
    /// waiting; each complete request becomes an event.
    pub fn serve(&mut self, now: Instant, events: &mut impl Extend<Event>) {
        if self.paused_until.is_some_and(|at| now >= at) {
            self.paused_until = None;
            self.listener_ready = true;
        }
        if std::mem::take(&mut self.listener_ready) {
            self.accept(now);
        }
        let mut asked = Vec::new();
        self.conns.retain_mut(|c| {
            if now >= c.opened + TIMEOUT {
                tracing::debug!(pid = c.pid, "control connection closed after {TIMEOUT:?}");
                return false;
            }
            if !std::mem::take(&mut c.ready) {
                return true;
            }
            match c.step() {
                Step::Wait => true,
                Step::Close => false,
                Step::Ask(request) => {
                    asked.push(Event::Control {
                        client: c.client,
                        from: c.pid,
                        request,
                    });
                    true
                }
            }
        });
        events.extend(asked);
    }

    /// The core's answer to `client`: written now if the socket takes it,
    /// else once it can.
    pub fn answer(&mut self, client: u64, code: i32, message: &str) {
        let Some(at) = self.conns.iter().position(|c| c.client == client) else {
            // Closed meanwhile: its time was up, or a newer client took its place.
            return;
        };
        let c = &mut self.conns[at];
        c.stage = Stage::Writing(answer_line(code, message), 0);
        if matches!(c.step(), Step::Close) {
            self.conns.swap_remove(at);
        }
    }

    /// Takes the connections waiting in the backlog, up to a pass's worth.
    fn accept(&mut self, now: Instant) {
        for _ in 0..MAX_CLIENTS {
            let fd =
                match accept4(
                    self.listener.as_raw_fd(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                ) {
                    // SAFETY: accept4 returned a new fd that nothing else owns.
                    Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
                    Err(Errno::EAGAIN) => break,
                    Err(Errno::ECONNABORTED | Errno::EINTR | Errno::EPROTO) => continue,
                    Err(e @ (Errno::EMFILE | Errno::ENFILE)) if !self.conns.is_empty() => {
                        self.warn(now, &format!(
                        "accept() on the control socket {} failed: {e}; the oldest connection \
                         is closed for each new one",
                        self.path.display()
                    ));
                        self.close_oldest();
                        continue;
                    }
                    Err(e) => {
                        self.warn(now, &format!(
                        "accept() on the control socket {} failed: {e}; new connections wait \
                         {ACCEPT_PAUSE:?}",
                        self.path.display()
                    ));
                        self.paused_until = Some(now + ACCEPT_PAUSE);
                        break;
                    }
                };
            if self.conns.len() >= MAX_CLIENTS {
                self.close_oldest();
            }
            let client = self.next_client;
            self.next_client += 1;
            let (pid, stage) = match getsockopt(&fd, sockopt::PeerCredentials) {
                Ok(cred) if cred.uid() == self.uid || cred.uid() == 0 => {
                    (cred.pid().max(0) as u32, Stage::Reading(Vec::new()))
                }
                Ok(cred) => {
                    let who = match cred.pid() {
                        pid if pid > 0 => format!("pid {pid}"),
                        _ => "a process outside tend's PID namespace".to_string(),
                    };
                    self.warn(now, &format!(
                        "refused a client of the control socket: {who} runs as uid {}, and only \
                         uid {} (tend's) and root may use it",
                        cred.uid(),
                        self.uid
                    ));
                    let why = format!(
                        "permission denied: only uid {} (tend's user) and root may use the \
                         control socket, and this client is uid {}",
                        self.uid,
                        cred.uid()
                    );
                    (
                        cred.pid().max(0) as u32,
                        Stage::Writing(answer_line(1, &why), 0),
                    )
                }
                Err(e) => {
                    tracing::warn!("getsockopt(SO_PEERCRED) on a control connection failed: {e}");
                    continue;
                }
            };
            self.conns.push(Conn {
                client,
                fd,
                pid,
                opened: now,
                stage,
                // The request often arrives with the connection.
                ready: true,
            });
        }
    }

    /// Logs `line` at most once a minute: what causes it may last as long as
    /// a flood of clients does.
    fn warn(&mut self, now: Instant, line: &str) {
        if self
            .warned
            .is_some_and(|at| now.saturating_duration_since(at) < WARN_EVERY)
        {
            return;
        }
        self.warned = Some(now);
        tracing::warn!("{line} (said at most once a minute)");
    }

    fn close_oldest(&mut self) {
        if let Some(at) = self
            .conns
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.opened)
            .map(|(i, _)| i)
        {
            self.conns.remove(at);
        }
    }
}

impl Drop for ControlSocket {
    /// tend exits: the name goes, unless another tend has put its own there.
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file);
        if ours && let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(
                "cannot remove the control socket {}: unlink() failed: {e}",
                self.path.display()
            );
        }
    }
}

/// What a connection does next.
enum Step {
    Wait,
    Close,
    Ask(ControlRequest),
}

impl Conn {
    /// One read, or one write.
    fn step(&mut self) -> Step {
        let fd = self.fd.as_raw_fd();
        match &mut self.stage {
            Stage::Reading(buf) => {
                let mut chunk = [0u8; MAX_REQUEST];
                let room = MAX_REQUEST - buf.len();
                let eof = match recv(fd, &mut chunk[..room], MsgFlags::empty()) {
                    Ok(0) => true,
                    Ok(n) => {
                        buf.extend_from_slice(&chunk[..n]);
                        false
                    }
                    Err(Errno::EAGAIN | Errno::EINTR) => return Step::Wait,
                    Err(_) => return Step::Close,
                };
                let line = match buf.iter().position(|&b| b == b'\n') {
                    Some(end) => &buf[..end],
                    None if eof && !buf.is_empty() => &buf[..],
                    None if eof => return Step::Close,
                    None if buf.len() < MAX_REQUEST => return Step::Wait,
                    None => {
                        let why = format!("request too long: at most {MAX_REQUEST} bytes");
                        self.stage = Stage::Writing(answer_line(2, &why), 0);
                        return self.step();
                    }
                };
                match parse_request(line) {
                    Ok(request) => {
                        self.stage = Stage::Asked;
                        Step::Ask(request)
                    }
                    Err(why) => {
                        self.stage = Stage::Writing(answer_line(2, &why), 0);
                        self.step()
                    }
                }
            }
            Stage::Asked => Step::Wait,
            Stage::Writing(line, sent) => {
                match send(fd, &line[*sent..], MsgFlags::MSG_NOSIGNAL) {
                    Ok(n) => *sent += n,
                    Err(Errno::EAGAIN | Errno::EINTR) => return Step::Wait,
                    Err(_) => return Step::Close,
                }
                if *sent < line.len() {
                    return Step::Wait;
                }
                // What the client sent past its request is read first: a
                // unix socket closed with unread input resets the client's
                // read after the answer, where it expects its end.
                let mut rest = [0u8; 4096];
                for _ in 0..16 {
                    if !matches!(recv(fd, &mut rest, MsgFlags::empty()), Ok(n) if n > 0) {
                        break;
                    }
                }
                Step::Close
            }
        }
    }
}

/// `CODE message\n`, the message on one line.
fn answer_line(code: i32, message: &str) -> Vec<u8> {
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("{code} {one_line}\n").into_bytes()
}

/// `signal NAME SIG` or `restart NAME`; the error says what is wrong.
fn parse_request(line: &[u8]) -> Result<ControlRequest, String> {
    let line = std::str::from_utf8(line).map_err(|_| "bad request: not UTF-8".to_string())?;
    let words: Vec<&str> = line.split_whitespace().collect();
    match words[..] {
        ["signal", service, sig] => Ok(ControlRequest::Signal {
            service: service.to_string(),
            signo: parse_signal(sig)?,
        }),
        ["restart", service] => Ok(ControlRequest::Restart {
            service: service.to_string(),
        }),
        _ => Err("bad request: expected `signal NAME SIG` or `restart NAME`".to_string()),
    }
}

/// A signal as the config names one (`HUP`, `SIGHUP`), or its number
/// (realtime signals too: `SIGRTMIN` is 34 on Linux).
pub fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        let max = libc::SIGRTMAX();
        return if (1..=max).contains(&n) {
            Ok(n)
        } else {
            Err(format!("no signal number {n}: signals are 1 to {max}"))
        };
    }
    s.parse::<SignalName>()
        .map(|name| name.0 as i32)
        .map_err(|e| format!("{e}, or a number"))
}

/// Removes what a creation of the socket cut short left beside it: private
/// directories `.NAME.XXXXXX` of tend's user holding at most the socket.
fn remove_leftovers(dir: &Path, name: &std::ffi::OsStr) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut prefix = b".".to_vec();
    prefix.extend_from_slice(name.as_bytes());
    prefix.push(b'.');
    // SAFETY: geteuid has no failure and no memory effects.
    let uid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(suffix) = file.as_bytes().strip_prefix(&prefix[..]) else {
            continue;
        };
        let mine = fs::symlink_metadata(entry.path())
            .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0);
        if suffix.len() != 6 || !suffix.iter().all(u8::is_ascii_alphanumeric) || !mine {
            continue;
        }
        let left = entry.path();
        let bound = left.join(BOUND_AS);
        if fs::symlink_metadata(&bound).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = fs::remove_file(&bound);
        }
        match fs::remove_dir(&left) {
            Ok(()) => tracing::info!(
                "removed {}, left by a tend stopped while it created its control socket",
                left.display()
            ),
            Err(e) => tracing::warn!("cannot remove {}: rmdir() failed: {e}", left.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_socket_is_beside_the_status_file() {
        assert_eq!(
            socket_path(Path::new("/run/tend/status.json")),
            Path::new("/run/tend/status.json.sock")
        );
    }

    #[test]
    fn requests_are_one_line_of_words() {
        assert_eq!(
            parse_request(b"signal web HUP"),
            Ok(ControlRequest::Signal {
                service: "web".into(),
                signo: libc::SIGHUP
            })
        );
        assert_eq!(
            parse_request(b"signal web 10"),
            Ok(ControlRequest::Signal {
                service: "web".into(),
                signo: 10
            })
        );
        assert_eq!(
            parse_request(b"restart php"),
            Ok(ControlRequest::Restart {
                service: "php".into()
            })
        );
        for bad in [
            &b""[..],
            b"restart",
            b"restart a b",
            b"signal web",
            b"stop web",
            b"\xff",
        ] {
            assert!(parse_request(bad).is_err(), "{bad:?}");
        }
        assert!(
            parse_request(b"signal web HUPP")
                .unwrap_err()
                .contains("HUPP")
        );
    }

    #[test]
    fn signals_are_names_as_in_the_config_or_numbers() {
        assert_eq!(parse_signal("HUP"), Ok(libc::SIGHUP));
        assert_eq!(parse_signal("sigusr1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("34"), Ok(34));
        let max = libc::SIGRTMAX();
        assert_eq!(parse_signal(&max.to_string()), Ok(max));
        for bad in ["0", "-1", &(max + 1).to_string(), "NOPE", ""] {
            assert!(parse_signal(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_answer_is_one_line() {
        assert_eq!(answer_line(1, "a\nb\rc"), b"1 a b c\n");
    }

    /// Serves `server` once a client has connected and returns the events.
    fn serve_once(server: &mut ControlSocket) -> Vec<Event> {
        use nix::poll::{PollFd, PollTimeout, poll};
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd> = server
                .poll_fds()
                .into_iter()
                .map(|(fd, flags)| PollFd::new(fd, flags))
                .collect();
            poll(&mut fds, PollTimeout::from(1000u16)).unwrap();
            fds.iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        };
        server.set_ready(&ready);
        let mut events = Vec::new();
        server.serve(Instant::now(), &mut events);
        events
    }

    #[test]
    fn a_request_is_answered_with_the_cores_line_and_the_socket_goes_at_exit() {
        let d = tempfile::tempdir().unwrap();
        let status = d.path().join("run/status.json");
        let mut server = ControlSocket::open(&status).unwrap();
        let path = socket_path(&status);
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, 0o600);
        let mut client = UnixStream::connect(&path).unwrap();
        client.write_all(b"restart web\n").unwrap();
        let events = serve_once(&mut server);
        let client_id = match &events[..] {
            [
                Event::Control {
                    client,
                    from,
                    request: ControlRequest::Restart { service },
                },
            ] => {
                assert_eq!(service, "web");
                assert_eq!(*from, std::process::id());
                *client
            }
            other => panic!("{other:?}"),
        };
        server.answer(client_id, 0, "restarting web");
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "0 restarting web\n");
        assert!(server.conns.is_empty(), "one request per connection");

        // A bad request is answered by the socket itself.
        let mut client = UnixStream::connect(&path).unwrap();
        client.write_all(b"reboot\n").unwrap();
        assert!(serve_once(&mut server).is_empty());
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("2 bad request"), "{answer}");

        // A line longer than a request can be is not read on.
        let mut client = UnixStream::connect(&path).unwrap();
        client.write_all(&[b'x'; MAX_REQUEST + 100]).unwrap();
        assert!(serve_once(&mut server).is_empty());
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "2 request too long: at most 512 bytes\n");

        drop(server);
        assert!(!path.exists(), "removed at exit");
        assert_eq!(
            fs::read_dir(d.path().join("run")).unwrap().count(),
            0,
            "nothing else is left"
        );
    }

    #[test]
    fn a_socket_left_by_an_earlier_tend_is_replaced_and_so_is_a_cut_short_creation() {
        let d = tempfile::tempdir().unwrap();
        let status = d.path().join("status.json");
        let first = ControlSocket::open(&status).unwrap();
        // Killed: its socket and a private directory of a creation stay.
        std::mem::forget(first);
        let left = d.path().join(".status.json.sock.Ab12Cd");
        fs::create_dir(&left).unwrap();
        fs::set_permissions(&left, fs::Permissions::from_mode(0o700)).unwrap();
        let _stale = std::os::unix::net::UnixListener::bind(left.join(BOUND_AS)).unwrap();
        // Not tend's names: left alone.
        fs::create_dir(d.path().join(".status.json.sock.toolong1")).unwrap();
        fs::write(d.path().join(".status.json.sock.Xy12Zw"), "theirs").unwrap();

        let server = ControlSocket::open(&status).unwrap();
        assert!(!left.exists());
        let mut client = UnixStream::connect(socket_path(&status)).unwrap();
        client.write_all(b"restart x\n").unwrap();
        drop(server);
        let mut names: Vec<String> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [".status.json.sock.Xy12Zw", ".status.json.sock.toolong1"]
        );
    }

    #[test]
    fn what_is_not_a_socket_is_not_replaced() {
        let d = tempfile::tempdir().unwrap();
        let status = d.path().join("status.json");
        fs::write(socket_path(&status), "data").unwrap();
        let e = ControlSocket::open(&status).err().unwrap().to_string();
        assert!(e.contains("other than a socket"), "{e}");
        assert_eq!(fs::read_to_string(socket_path(&status)).unwrap(), "data");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1, "no leftovers");
    }
}
