//! `[http] listen`: tend's own small HTTP/1.1 server, for probes and
//! Prometheus: `GET /ready`, `GET /status` and `GET /metrics`.
//!
//! Theory of operation. There is no thread: the listener and every
//! connection are non-blocking sockets in the supervisor's one `ppoll`, next
//! to the signalfd. After a wake-up the supervisor first hands the signals
//! and exits to the core and carries out what it decided, then calls
//! [`HttpServer::serve`], which does a bounded amount of work (at most
//! [`MAX_CONNECTIONS`] accepts, and a read or write or two per connection
//! that poll said is ready) and never waits. So a slow or hostile client
//! costs PID 1 a few system calls per wake-up, and never delays a signal or
//! a reap.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections are open (a new one
//! closes the oldest, so clients that hang cannot lock the others out); a
//! request head may hold at most [`MAX_REQUEST`] bytes; a connection lives
//! at most [`TIMEOUT`], whatever it does. One request per connection,
//! answered with `Connection: close`. While no client is connected the
//! server adds no timer to the loop: an idle tend still sleeps without one.
//!
//! Requests are parsed by `httparse`. The pages themselves come from the
//! caller ([`Page`] in, [`Reply`] out): this module knows HTTP, not tend.
//! A page is made once and shared by every answer until the caller says the
//! content changed ([`HttpServer::content_changed`]): many clients asking
//! at once cost PID 1 one page, not one each.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::PollFlags;
use nix::sys::socket::{MsgFlags, Shutdown, SockFlag, SockaddrStorage};

use crate::sockets::{self, Listen, SocketSpec};

/// Connections open at once; one more closes the oldest.
pub const MAX_CONNECTIONS: usize = 64;
/// The longest request head (request line and headers) that is read.
pub const MAX_REQUEST: usize = 8 * 1024;
/// The longest a connection stays open, from accept to close.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// After the answer, how long what the client still sends is read and
/// dropped, so that closing does not reset the connection (which could
/// destroy the answer before the client read it).
const LINGER: Duration = Duration::from_secs(1);
/// A request with more headers than this gets 431.
const MAX_HEADERS: usize = 32;
/// accept() failed for want of file descriptors or memory: the listener is
/// left alone this long, rather than polled in a busy loop.
const ACCEPT_PAUSE: Duration = Duration::from_millis(250);
/// Bytes sent per connection and pass: a large page goes out over several
/// wake-ups, with signals handled between them.
const SEND_PER_PASS: usize = 64 * 1024;
/// A failed accept() is logged at most this often.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(60);
/// Bytes read and dropped per connection and pass while lingering.
const DRAIN_PER_PASS: usize = 16 * 1024;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Ready,
    Status,
    Metrics,
}

impl Page {
    const ALLOW: &str = "GET, HEAD";

    fn index(self) -> usize {
        match self {
            Page::Ready => 0,
            Page::Status => 1,
            Page::Metrics => 2,
        }
    }

    /// The page a request target names: its path, in origin form
    /// (`/ready?x`) or absolute form (`http://host:port/ready`, which
    /// RFC 9112 has servers accept).
    fn from_target(target: &str) -> Option<Page> {
        let path = match target.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case("http://") => {
                let rest = &target[7..];
                rest.find(['/', '?']).map_or("/", |at| &rest[at..])
            }
            _ => target,
        };
        // The query (a probe's cache buster) does not matter.
        match path.split_once('?').map_or(path, |(p, _)| p) {
            "/ready" => Some(Page::Ready),
            "/status" => Some(Page::Status),
            "/metrics" => Some(Page::Metrics),
            _ => None,
        }
    }
}

/// A page's answer: its status code, type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(code: u16, line: &str) -> Reply {
        Reply {
            code,
            content_type: "text/plain; charset=utf-8",
            body: format!("{line}\n").into_bytes(),
        }
    }
}

pub struct HttpServer {
    listener: OwnedFd,
    addr: SocketAddr,
    /// Readable at the last ppoll.
    listener_ready: bool,
    conns: Vec<Conn>,
    /// accept() is not tried again before then (see [`ACCEPT_PAUSE`]).
    paused_until: Option<Instant>,
    /// The connection limit was reached (said once until it is not).
    full: bool,
    /// When a failed accept() was last logged (at most once a minute).
    accept_warned: Option<Instant>,
    /// Pages made since the content last changed, by [`Page::index`].
    pages: [Option<Rc<Reply>>; 3],
}

struct Conn {
    fd: OwnedFd,
    opened: Instant,
    deadline: Instant,
    stage: Stage,
    /// Ready at the last ppoll (or just accepted).
    ready: bool,
}

enum Stage {
    /// The request head so far.
    Reading(Vec<u8>),
    Writing {
        answer: Answer,
        sent: usize,
    },
    /// Answered and shut for writing: what the client still sends is read
    /// and dropped until it closes (see [`LINGER`]).
    Lingering,
}

/// An answer on its way: its head, then the body of a reply (which cached
/// pages share), unless the request was HEAD.
struct Answer {
    head: Vec<u8>,
    body: Option<Rc<Reply>>,
}

impl Answer {
    fn body(&self) -> &[u8] {
        self.body.as_ref().map_or(&[], |r| &r.body)
    }

    fn len(&self) -> usize {
        self.head.len() + self.body().len()
    }

    /// The next bytes to send after `sent`, at most [`SEND_PER_PASS`].
    fn next(&self, sent: usize) -> Vec<IoSlice<'_>> {
        let body = self.body();
        match self.head.get(sent..) {
            Some(head) if !head.is_empty() => {
                let room = SEND_PER_PASS.saturating_sub(head.len());
                vec![
                    IoSlice::new(head),
                    IoSlice::new(&body[..body.len().min(room)]),
                ]
            }
            _ => {
                let rest = &body[sent - self.head.len()..];
                vec![IoSlice::new(&rest[..rest.len().min(SEND_PER_PASS)])]
            }
        }
    }
}

/// Whether a connection stays open after a step.
enum Step {
    Next,
    Wait,
    Close,
}

impl HttpServer {
    /// Binds and listens on `addr` (close-on-exec, non-blocking).
    pub fn bind(addr: SocketAddr) -> Result<HttpServer, String> {
        let fail = |reason: String| format!("cannot listen on {addr} ([http] listen): {reason}");
        let spec = SocketSpec {
            service: 0,
            name: "http".into(),
            listen: Listen::Tcp(addr),
            backlog: None,
            mode: None,
        };
        let listener = sockets::bind(&spec).map_err(fail)?;
        let flags = fcntl(&listener, FcntlArg::F_GETFL)
            .map_err(|e| fail(format!("fcntl(F_GETFL): {}", e.desc())))?;
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        fcntl(&listener, FcntlArg::F_SETFL(flags))
            .map_err(|e| fail(format!("fcntl(F_SETFL, O_NONBLOCK): {}", e.desc())))?;
        let local: SockaddrStorage = nix::sys::socket::getsockname(listener.as_raw_fd())
            .map_err(|e| fail(format!("getsockname(): {}", e.desc())))?;
        let addr = if let Some(v4) = local.as_sockaddr_in() {
            SocketAddr::V4((*v4).into())
        } else if let Some(v6) = local.as_sockaddr_in6() {
            SocketAddr::V6((*v6).into())
        } else {
            addr
        };
        Ok(HttpServer {
            listener,
            addr,
            listener_ready: false,
            conns: Vec::new(),
            paused_until: None,
            full: false,
            accept_warned: None,
            pages: Default::default(),
        })
    }

    /// Where it listens (a port 0 becomes the port the kernel chose).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What to poll, in order: the listener, then each connection. Pass the
    /// results to [`HttpServer::set_ready`] in the same order.
    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        let mut fds = Vec::with_capacity(1 + self.conns.len());
        let listen = if self.paused_until.is_some() {
            PollFlags::empty()
        } else {
            PollFlags::POLLIN
        };
        fds.push((self.listener.as_fd(), listen));
        for c in &self.conns {
            let flags = match c.stage {
                Stage::Writing { .. } => PollFlags::POLLOUT,
                Stage::Reading(_) | Stage::Lingering => PollFlags::POLLIN,
            };
            fds.push((c.fd.as_fd(), flags));
        }
        fds
    }

    /// Which of [`HttpServer::poll_fds`] ppoll found ready.
    pub fn set_ready(&mut self, ready: &[bool]) {
        self.listener_ready = ready.first().copied().unwrap_or(false);
        for (c, r) in self.conns.iter_mut().zip(ready.iter().skip(1)) {
            c.ready = *r;
        }
    }

    /// The next time a connection must be closed (or accept() tried again);
    /// None while no client is connected.
    pub fn deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .map(|c| c.deadline)
            .chain(self.paused_until)
            .min()
    }

    /// The content of the pages changed: the next request for each page
    /// has it made again.
    pub fn content_changed(&mut self) {
        self.pages = Default::default();
    }

    /// Accepts, reads, answers and closes what is ready or due, without
    /// waiting. `make` makes a page when a request asks for one that was not
    /// made since the content last changed.
    pub fn serve(&mut self, now: Instant, make: &mut dyn FnMut(Page) -> Reply) {
        if self.paused_until.is_some_and(|at| now >= at) {
            self.paused_until = None;
            self.listener_ready = true;
        }
        if std::mem::take(&mut self.listener_ready) && self.paused_until.is_none() {
            self.accept(now);
        }
        let pages = &mut self.pages;
        let page = &mut |p: Page| -> Rc<Reply> {
            pages[p.index()]
                .get_or_insert_with(|| Rc::new(make(p)))
                .clone()
        };
        self.conns.retain_mut(|c| {
            if now >= c.deadline {
                match c.stage {
                    Stage::Reading(_) => tracing::debug!(
                        "HTTP connection closed: open for {TIMEOUT:?} without a full request"
                    ),
                    Stage::Writing { .. } => tracing::debug!(
                        "HTTP connection closed: open for {TIMEOUT:?} and its answer not all taken"
                    ),
                    // Answered: the client did not close it first.
                    Stage::Lingering => {}
                }
                return false;
            }
            if !std::mem::take(&mut c.ready) {
                return true;
            }
            loop {
                match c.step(now, page) {
                    Step::Next => {}
                    Step::Wait => return true,
                    Step::Close => return false,
                }
            }
        });
        if self.full && self.conns.len() < MAX_CONNECTIONS / 2 {
            self.full = false;
        }
    }

    /// Takes the connections waiting in the backlog, up to a pass's worth.
    fn accept(&mut self, now: Instant) {
        for _ in 0..MAX_CONNECTIONS {
            let fd = nix::sys::socket::accept4(
                self.listener.as_raw_fd(),
                SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            );
            match fd {
                Ok(fd) => {
                    // SAFETY: accept4 returned a new fd that nothing else owns.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    if self.conns.len() >= MAX_CONNECTIONS {
                        self.close_oldest();
                    }
                    self.conns.push(Conn {
                        fd,
                        opened: now,
                        deadline: now + TIMEOUT,
                        stage: Stage::Reading(Vec::new()),
                        // The request often arrives with the connection.
                        ready: true,
                    });
                }
                Err(Errno::EAGAIN) => break,
                // The connection failed before it was taken (accept(2):
                // "treat them like EAGAIN by retrying").
                Err(
                    Errno::ECONNABORTED
                    | Errno::EINTR
                    | Errno::EPROTO
                    | Errno::ENETDOWN
                    | Errno::ENOPROTOOPT
                    | Errno::EHOSTDOWN
                    | Errno::ENONET
                    | Errno::EHOSTUNREACH
                    | Errno::EOPNOTSUPP
                    | Errno::ENETUNREACH,
                ) => {}
                // Out of file descriptors while clients hold some: as at the
                // connection limit, the oldest makes room, so that clients
                // that hang cannot lock a probe out.
                Err(e @ (Errno::EMFILE | Errno::ENFILE)) if !self.conns.is_empty() => {
                    self.warn_accept(now, e, "the oldest connection is closed for each new one");
                    self.close_oldest();
                }
                Err(e) => {
                    self.warn_accept(now, e, &format!("new connections wait {ACCEPT_PAUSE:?}"));
                    self.paused_until = Some(now + ACCEPT_PAUSE);
                    break;
                }
            }
        }
    }

    /// Logs a failed accept(), at most once a minute: the failure may last
    /// as long as a flood of clients does.
    fn warn_accept(&mut self, now: Instant, e: Errno, then: &str) {
        if self
            .accept_warned
            .is_some_and(|at| now.saturating_duration_since(at) < ACCEPT_WARN_EVERY)
        {
            return;
        }
        self.accept_warned = Some(now);
        tracing::warn!(
            "accept() on the HTTP server's {} failed: {e}; {then} (said at most once a minute while it lasts)",
            self.addr
        );
    }

    fn close_oldest(&mut self) {
        if !self.full && self.conns.len() >= MAX_CONNECTIONS {
            self.full = true;
            tracing::warn!(
                "the HTTP server on {} has {MAX_CONNECTIONS} connections open: the oldest is closed for each new one",
                self.addr
            );
        }
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

impl Conn {
    /// One step: a read, a write, or a few reads while lingering.
    fn step(&mut self, now: Instant, page: &mut dyn FnMut(Page) -> Rc<Reply>) -> Step {
        let fd = self.fd.as_raw_fd();
        match &mut self.stage {
            Stage::Reading(buf) => {
                let mut chunk = [0u8; 4096];
                let room = (MAX_REQUEST - buf.len()).min(chunk.len());
                match nix::sys::socket::recv(fd, &mut chunk[..room], MsgFlags::empty()) {
                    Ok(0) => return Step::Close,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(Errno::EAGAIN | Errno::EINTR) => return Step::Wait,
                    Err(_) => return Step::Close,
                }
                match answer(buf, page) {
                    Some(answer) => {
                        self.stage = Stage::Writing { answer, sent: 0 };
                        Step::Next
                    }
                    None => Step::Wait,
                }
            }
            Stage::Writing { answer, sent } => {
                let next = answer.next(*sent);
                match nix::sys::socket::sendmsg::<()>(fd, &next, &[], MsgFlags::MSG_NOSIGNAL, None)
                {
                    Ok(n) => *sent += n,
                    Err(Errno::EAGAIN | Errno::EINTR) => return Step::Wait,
                    Err(_) => return Step::Close,
                }
                if *sent < answer.len() {
                    return Step::Wait;
                }
                if nix::sys::socket::shutdown(fd, Shutdown::Write).is_err() {
                    return Step::Close;
                }
                self.stage = Stage::Lingering;
                self.deadline = self.deadline.min(now + LINGER);
                Step::Next
            }
            Stage::Lingering => {
                let mut chunk = [0u8; 4096];
                for _ in 0..DRAIN_PER_PASS / chunk.len() {
                    match nix::sys::socket::recv(fd, &mut chunk, MsgFlags::empty()) {
                        Ok(0) => return Step::Close,
                        Ok(_) => {}
                        Err(Errno::EAGAIN | Errno::EINTR) => return Step::Wait,
                        Err(_) => return Step::Close,
                    }
                }
                Step::Wait
            }
        }
    }
}

/// The answer to the request head in `buf`, or None while it is
/// incomplete (and shorter than [`MAX_REQUEST`]).
fn answer(buf: &[u8], page: &mut dyn FnMut(Page) -> Rc<Reply>) -> Option<Answer> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let (method, target) = match request.parse(buf) {
        Ok(httparse::Status::Complete(_)) => (
            request.method.unwrap_or_default(),
            request.path.unwrap_or_default(),
        ),
        Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => return None,
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            let why = format!(
                "request head too large: at most {MAX_REQUEST} bytes and {MAX_HEADERS} headers"
            );
            return Some(response(Reply::text(431, &why).into(), false, None));
        }
        Err(e) => {
            let reply = Reply::text(400, &format!("bad request: {e}"));
            return Some(response(reply.into(), false, None));
        }
    };
    let head_only = method == "HEAD";
    let out = match Page::from_target(target) {
        None => response(Reply::text(404, "not found").into(), head_only, None),
        Some(_) if method != "GET" && !head_only => response(
            Reply::text(405, &format!("method {method} not allowed")).into(),
            false,
            Some(Page::ALLOW),
        ),
        Some(p) => response(page(p), head_only, None),
    };
    tracing::debug!(method, target, "HTTP request answered");
    Some(out)
}

/// An HTTP/1.1 answer that closes the connection.
fn response(content: Rc<Reply>, head_only: bool, allow: Option<&str>) -> Answer {
    let reason = match content.code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n",
        content.code,
        content.content_type,
        content.body.len()
    );
    if let Some(allow) = allow {
        head.push_str(&format!("Allow: {allow}\r\n"));
    }
    head.push_str("\r\n");
    Answer {
        head: head.into_bytes(),
        body: (!head_only).then_some(content),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(p: Page) -> Reply {
        match p {
            Page::Ready => Reply::text(503, "not ready: state starting"),
            Page::Status => Reply {
                code: 200,
                content_type: "application/json",
                body: b"{}\n".to_vec(),
            },
            Page::Metrics => Reply::text(200, "m 1"),
        }
    }

    fn ask(request: &str) -> Option<String> {
        answer(request.as_bytes(), &mut |p| Rc::new(pages(p))).map(|a| {
            let mut out = a.head.clone();
            out.extend_from_slice(a.body());
            String::from_utf8(out).unwrap()
        })
    }

    #[test]
    fn each_page_is_answered_with_its_content_and_then_closed() {
        let out = ask("GET /ready HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: 26\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n\
             not ready: state starting\n"
        );
        let out = ask("GET /status HTTP/1.0\r\n\r\n").unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.contains("Content-Type: application/json\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n{}\n"), "{out}");
        let out = ask("GET /metrics?x=1 HTTP/1.1\r\n\r\n").unwrap();
        assert!(out.ends_with("\r\n\r\nm 1\n"), "{out}");
    }

    #[test]
    fn an_absolute_target_names_its_path() {
        for target in [
            "http://tend:9533/ready",
            "HTTP://10.0.0.1/ready?x=1",
            "http://[::1]:9533/ready",
        ] {
            let out = ask(&format!("GET {target} HTTP/1.1\r\n\r\n")).unwrap();
            assert!(
                out.ends_with("not ready: state starting\n"),
                "{target}: {out}"
            );
        }
    }

    #[test]
    fn head_gets_the_headers_without_the_body() {
        let out = ask("HEAD /metrics HTTP/1.1\r\n\r\n").unwrap();
        assert!(out.contains("Content-Length: 4\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "{out}");
    }

    #[test]
    fn other_methods_get_405_and_unknown_paths_404() {
        for method in ["POST", "PUT", "DELETE", "OPTIONS", "BREW"] {
            let out = ask(&format!(
                "{method} /ready HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
            ))
            .unwrap();
            assert!(
                out.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
                "{out}"
            );
            assert!(out.contains("\r\nAllow: GET, HEAD\r\n"), "{out}");
        }
        for path in [
            "/",
            "/readyz",
            "/ready/",
            "/../status",
            "http://x/readyz",
            "http://x",
            "ftp://x/ready",
            "*",
        ] {
            let out = ask(&format!("GET {path} HTTP/1.1\r\n\r\n")).unwrap();
            assert!(
                out.starts_with("HTTP/1.1 404 Not Found\r\n"),
                "{path}: {out}"
            );
        }
    }

    #[test]
    fn an_incomplete_head_waits_and_a_bad_one_gets_400() {
        assert_eq!(ask("GET /ready HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(ask("GE"), None);
        let out = ask("GET /ready HTTP/9\r\n\r\n").unwrap();
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        let out = ask("\x16\x03\x01\x02\x00\x01\x00\x01").unwrap();
        assert!(out.starts_with("HTTP/1.1 400 "), "TLS: {out}");
    }

    /// Serves `server` until `done` says so (or panics after 10 s).
    fn drive(
        server: &mut HttpServer,
        page: &mut dyn FnMut(Page) -> Reply,
        done: &dyn Fn() -> bool,
    ) {
        use nix::poll::{PollFd, PollTimeout, poll};
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "the clients were not all answered"
            );
            let ready: Vec<bool> = {
                let mut fds: Vec<PollFd> = server
                    .poll_fds()
                    .into_iter()
                    .map(|(fd, flags)| PollFd::new(fd, flags))
                    .collect();
                poll(&mut fds, PollTimeout::from(10u8)).unwrap();
                fds.iter()
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect()
            };
            server.set_ready(&ready);
            server.serve(Instant::now(), page);
        }
    }

    #[test]
    fn a_page_is_made_once_however_many_clients_ask_for_it() {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let mut server = HttpServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = server.local_addr();
        let mut made = Vec::new();
        let body = "x".repeat(100_000);
        let mut page = |p: Page| {
            made.push(p);
            Reply::text(200, &body)
        };
        let ask_all = |clients: usize, done: &Arc<AtomicUsize>| {
            for _ in 0..clients {
                let done = done.clone();
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /status HTTP/1.1\r\n\r\n").unwrap();
                std::thread::spawn(move || {
                    let mut answer = Vec::new();
                    s.read_to_end(&mut answer).unwrap();
                    assert!(answer.ends_with(b"xxx\n"), "a whole answer");
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        };
        let done = Arc::new(AtomicUsize::new(0));
        ask_all(MAX_CONNECTIONS, &done);
        drive(&mut server, &mut page, &|| {
            done.load(Ordering::SeqCst) == MAX_CONNECTIONS
        });
        server.content_changed();
        let done = Arc::new(AtomicUsize::new(0));
        ask_all(3, &done);
        drive(&mut server, &mut page, &|| done.load(Ordering::SeqCst) == 3);
        assert_eq!(made, [Page::Status, Page::Status], "once per content");
    }

    #[test]
    fn a_head_too_large_gets_431() {
        let mut big = "GET /ready HTTP/1.1\r\nX: ".to_string();
        big.push_str(&"a".repeat(MAX_REQUEST));
        let out = ask(&big[..MAX_REQUEST]).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        let many: String = (0..=MAX_HEADERS).map(|i| format!("H{i}: v\r\n")).collect();
        let out = ask(&format!("GET /ready HTTP/1.1\r\n{many}\r\n")).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    }
}
