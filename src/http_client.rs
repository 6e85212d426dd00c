//! The client of `on_change = "http"`: calls of reload endpoints made inside
//! tend's one loop.
//!
//! Theory of operation. Each call is a non-blocking socket in the
//! supervisor's `ppoll`, next to the signalfd: it is connected and its
//! request written at once when the core asks for it (on loopback the
//! connection is usually up by then), and its answer is read when poll
//! says it is there. The work per wake-up is bounded (one request, at most
//! [`MAX_ANSWER`] bytes of answer per call, read in a few `read`s), no call
//! ever waits, and each call ends by its timeout at the latest, so a slow
//! or silent endpoint never delays a signal or a reap. No process is
//! started: a call costs PID 1 a socket and a few system calls.
//!
//! What an answer says (its status, the first line of its body) is read by
//! [`http_action`]'s parser, as far as it arrived.

use std::io::{ErrorKind, Read as _};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, SockaddrIn, SockaddrIn6, connect, send, socket,
};

use crate::http_action::{self, Endpoint, Incomplete};

/// The most of an answer that is read: its head and the start of its body.
pub const MAX_ANSWER: usize = 64 * 1024;

/// What a call came to: the status code and ": the first line of the body"
/// (or nothing), or what went wrong.
pub type Outcome = Result<(u16, String), String>;

/// One call of an endpoint, from connect to the answer.
pub struct Call {
    stream: TcpStream,
    addr: SocketAddr,
    request: Vec<u8>,
    sent: usize,
    /// A byte of the request went out: the connection was made.
    connected: bool,
    answer: Vec<u8>,
    head_only: bool,
    timeout: Duration,
    deadline: Instant,
}

impl Call {
    /// Opens a connection to `endpoint` (without waiting for it) and sends
    /// what can be sent at once; the call ends by `now + timeout`.
    pub fn start(endpoint: &Endpoint, timeout: Duration, now: Instant) -> Result<Call, String> {
        let family = match endpoint.addr {
            SocketAddr::V4(_) => AddressFamily::Inet,
            SocketAddr::V6(_) => AddressFamily::Inet6,
        };
        let fd = socket(
            family,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| {
            format!(
                "cannot open a socket: socket(): {}",
                std::io::Error::from(e)
            )
        })?;
        let connected = match endpoint.addr {
            SocketAddr::V4(a) => connect(fd.as_raw_fd(), &SockaddrIn::from(a)),
            SocketAddr::V6(a) => connect(fd.as_raw_fd(), &SockaddrIn6::from(a)),
        };
        match connected {
            Ok(()) | Err(Errno::EINPROGRESS) => {}
            Err(e) => {
                return Err(format!(
                    "cannot connect to {}: {}",
                    endpoint.addr,
                    std::io::Error::from(e)
                ));
            }
        }
        let request = format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tend/{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            endpoint.method,
            endpoint.target,
            endpoint.host,
            env!("CARGO_PKG_VERSION")
        );
        Ok(Call {
            stream: TcpStream::from(fd),
            addr: endpoint.addr,
            request: request.into_bytes(),
            sent: 0,
            connected: false,
            answer: Vec::new(),
            head_only: endpoint.method == "HEAD",
            timeout,
            deadline: now + timeout,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// What to poll for: the socket writable while the request goes out
    /// (a connect that completes makes it so), then readable.
    pub fn interest(&self) -> PollFlags {
        if self.sent < self.request.len() {
            PollFlags::POLLOUT
        } else {
            PollFlags::POLLIN
        }
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Sends and reads what can be without waiting; the outcome once the
    /// call is over. Reads until the answer says what it has to say: its
    /// status and the first line of its body, or all of a shorter body. A
    /// server may keep the connection open (despite `Connection: close`),
    /// so its end is not waited for when the answer's length is known.
    pub fn advance(&mut self) -> Option<Outcome> {
        while self.sent < self.request.len() {
            // MSG_NOSIGNAL: a peer that is gone is an error, not a SIGPIPE.
            match send(
                self.stream.as_raw_fd(),
                &self.request[self.sent..],
                MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(n) => {
                    self.sent += n;
                    self.connected = true;
                }
                Err(Errno::EAGAIN) => return None,
                Err(Errno::EINTR) => {}
                Err(e) if !self.connected => {
                    return Some(Err(format!(
                        "cannot connect to {}: {}",
                        self.addr,
                        std::io::Error::from(e)
                    )));
                }
                Err(e) => {
                    return Some(Err(format!(
                        "cannot send the request: {}",
                        std::io::Error::from(e)
                    )));
                }
            }
        }
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match self.stream.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if self.answer.is_empty() => return Some(Err(format!("no answer: {e}"))),
                // The head may be there: a reset after it still says what happened.
                Err(_) => 0,
            };
            if n == 0 {
                return Some(self.conclude(true));
            }
            let room = MAX_ANSWER - self.answer.len();
            self.answer.extend_from_slice(&buf[..n.min(room)]);
            if self.answer.len() >= MAX_ANSWER {
                return Some(self.conclude(false));
            }
            match http_action::read_final(&self.answer, self.head_only) {
                Err(e) => return Some(Err(e)),
                Ok(Some(a)) if a.complete || http_action::first_line(&a.body, false).is_some() => {
                    return Some(self.conclude(false));
                }
                Ok(_) => {}
            }
        }
    }

    /// The outcome of a call whose time is up: what arrived may say enough.
    pub fn expire(&self) -> Outcome {
        let timeout = self.timeout;
        if !self.connected {
            return Err(format!(
                "cannot connect to {} within {timeout:?}",
                self.addr
            ));
        }
        if self.sent < self.request.len() {
            return Err(format!("no answer within {timeout:?}"));
        }
        match http_action::read_final(&self.answer, self.head_only) {
            Ok(Some(_)) => self.conclude(false),
            Ok(None) if self.answer.is_empty() => Err(format!("no answer within {timeout:?}")),
            Ok(None) => Err(format!("no complete answer within {timeout:?}")),
            Err(e) => Err(e),
        }
    }

    /// The outcome from the answer read; `ended`: the server closed.
    fn conclude(&self, ended: bool) -> Outcome {
        http_action::summarize(&self.answer, self.head_only).map_err(|e| match e {
            Incomplete::Head if ended => "the answer ended inside its head".to_string(),
            Incomplete::Head => format!("the answer's head is larger than {MAX_ANSWER} bytes"),
            Incomplete::Bad(e) => e,
        })
    }
}

/// A call that ended.
#[derive(Debug)]
pub struct Finished {
    pub token: u64,
    pub outcome: Outcome,
    pub took: Duration,
}

/// The calls in flight, by the core's token.
#[derive(Default)]
pub struct Calls {
    calls: Vec<(u64, Instant, Call)>,
    /// From the last `ppoll`, in the order of [`Calls::poll_fds`].
    ready: Vec<bool>,
}

impl Calls {
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Starts call `token` of `endpoint`; when it is over at once (no
    /// socket, a connection refused), its end.
    pub fn start(
        &mut self,
        token: u64,
        endpoint: &Endpoint,
        timeout: Duration,
        now: Instant,
    ) -> Option<Finished> {
        let ended = |outcome| {
            Some(Finished {
                token,
                outcome,
                took: now.elapsed(),
            })
        };
        let mut call = match Call::start(endpoint, timeout, now) {
            Ok(call) => call,
            Err(e) => return ended(Err(e)),
        };
        if let Some(outcome) = call.advance() {
            return ended(outcome);
        }
        self.calls.push((token, now, call));
        None
    }

    /// Drops call `token`, if it is still in flight: its outcome is no
    /// longer wanted.
    pub fn cancel(&mut self, token: u64) {
        self.calls.retain(|(t, _, _)| *t != token);
    }

    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        self.calls
            .iter()
            .map(|(_, _, c)| (c.fd(), c.interest()))
            .collect()
    }

    /// `ready[i]`: `poll_fds()[i]` had revents.
    pub fn set_ready(&mut self, ready: &[bool]) {
        self.ready = ready.to_vec();
    }

    /// The next time a call runs out of time; None while none is in flight.
    pub fn deadline(&self) -> Option<Instant> {
        self.calls.iter().map(|(_, _, c)| c.deadline()).min()
    }

    /// Moves the calls poll said are ready along, and ends those whose time
    /// is up. Returns the calls that ended.
    pub fn pump(&mut self, now: Instant) -> Vec<Finished> {
        let ready = std::mem::take(&mut self.ready);
        let mut finished = Vec::new();
        let mut i = 0;
        let mut at = 0;
        while i < self.calls.len() {
            let (token, started, call) = &mut self.calls[i];
            let mut outcome = None;
            if ready.get(at).copied().unwrap_or(false) {
                outcome = call.advance();
            }
            if outcome.is_none() && now >= call.deadline() {
                outcome = Some(call.expire());
            }
            at += 1;
            match outcome {
                Some(outcome) => {
                    finished.push(Finished {
                        token: *token,
                        outcome,
                        took: now.saturating_duration_since(*started),
                    });
                    self.calls.remove(i);
                }
                None => i += 1,
            }
        }
        finished
    }
}

/// Calls `endpoint` and waits for the outcome (at most `timeout`): the
/// status code and ": first line of the body". The loop never waits like
/// this: it polls [`Call`]s with everything else.
/// Public for the fuzz target that plays the endpoint.
pub fn call(endpoint: &Endpoint, timeout: Duration) -> Result<(u16, String), String> {
    let mut call = Call::start(endpoint, timeout, Instant::now())?;
    loop {
        if let Some(outcome) = call.advance() {
            return outcome;
        }
        let left = call.deadline().saturating_duration_since(Instant::now());
        if left.is_zero() {
            return call.expire();
        }
        let mut fds = [PollFd::new(call.fd(), call.interest())];
        let wait = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, wait) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(format!("poll() failed: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::net::TcpListener;

    #[test]
    fn calls_in_flight_are_polled_and_end_with_their_answer_or_their_timeout() {
        let answering = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = |l: &TcpListener| {
            Endpoint::parse(
                "POST",
                &format!("http://{}/-/reload", l.local_addr().unwrap()),
            )
            .unwrap()
        };
        let t0 = Instant::now();
        let mut calls = Calls::default();
        assert!(
            calls
                .start(1, &endpoint(&answering), Duration::from_secs(30), t0)
                .is_none()
        );
        assert!(
            calls
                .start(2, &endpoint(&silent), Duration::from_millis(200), t0)
                .is_none()
        );
        assert_eq!(calls.deadline(), Some(t0 + Duration::from_millis(200)));
        let (mut conn, _) = answering.accept().unwrap();
        let (_held, _) = silent.accept().unwrap();
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
            .unwrap();
        let mut ended = Vec::new();
        while ended.len() < 2 {
            let mut fds: Vec<nix::poll::PollFd> = calls
                .poll_fds()
                .into_iter()
                .map(|(fd, flags)| nix::poll::PollFd::new(fd, flags))
                .collect();
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(50u16)).unwrap();
            let ready: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            drop(fds);
            calls.set_ready(&ready);
            ended.extend(calls.pump(Instant::now()));
            assert!(t0.elapsed() < Duration::from_secs(10), "{ended:?}");
        }
        assert_eq!(ended[0].token, 1);
        assert_eq!(ended[0].outcome, Ok((200, ": ok".to_string())));
        assert_eq!(ended[1].token, 2);
        assert_eq!(ended[1].outcome, Err("no answer within 200ms".to_string()));
        assert!(ended[1].took >= Duration::from_millis(200));
        assert!(calls.is_empty());
        assert_eq!(calls.deadline(), None, "nothing is due once they ended");
    }

    #[test]
    fn a_call_that_cannot_connect_ends_at_once_and_a_cancelled_one_is_dropped() {
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap();
        drop(closed);
        let e = Endpoint::parse("POST", &format!("http://{addr}/")).unwrap();
        let mut calls = Calls::default();
        let ended = calls
            .start(7, &e, Duration::from_secs(5), Instant::now())
            .expect("refused on loopback at once");
        assert_eq!(ended.token, 7);
        let err = ended.outcome.unwrap_err();
        assert!(
            err.starts_with(&format!("cannot connect to {addr}: ")),
            "{err}"
        );
        assert!(calls.is_empty());

        let listening = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = Endpoint::parse(
            "POST",
            &format!("http://{}/", listening.local_addr().unwrap()),
        )
        .unwrap();
        assert!(
            calls
                .start(8, &e, Duration::from_secs(5), Instant::now())
                .is_none()
        );
        calls.cancel(8);
        assert!(calls.is_empty());
        assert!(calls.poll_fds().is_empty());
    }
}
