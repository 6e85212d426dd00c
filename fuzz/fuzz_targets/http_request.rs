//! A request to tend's HTTP server ([http]), sent over TCP as a client
//! would, in pieces the input chooses (see `tend_fuzz::pieces`), to a real
//! `HttpServer` driven as the supervisor drives it (poll, then serve).
//!
//! Checks: the answer does not depend on how the request was cut (the same
//! bytes in one piece get the same answer), it is a well-formed HTTP/1.1
//! answer, and the server holds no connection once the client is gone.
#![no_main]

use std::cell::RefCell;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use nix::poll::{PollFd, PollTimeout, poll};
use nix::sys::socket::{setsockopt, sockopt};
use tend::http_server::{HttpServer, Page, Reply};

thread_local! {
    static SERVER: RefCell<HttpServer> = {
        tend_fuzz::ignore_sigpipe();
        RefCell::new(HttpServer::bind("127.0.0.1:0".parse().unwrap()).expect("bind"))
    };
}

fn page(p: Page) -> Reply {
    match p {
        Page::Ready => Reply::text(200, "ready"),
        Page::Status => Reply::text(503, "starting"),
        Page::Metrics => Reply::text(200, "tend_up 1"),
    }
}

/// One turn of the supervisor's loop for the server: poll (up to `wait`),
/// then serve. Whether anything was ready.
fn turn(server: &mut HttpServer, wait: Duration) -> bool {
    let mut fds: Vec<PollFd> = server
        .poll_fds()
        .into_iter()
        .map(|(fd, flags)| PollFd::new(fd, flags))
        .collect();
    let timeout = PollTimeout::try_from(wait).unwrap();
    // libFuzzer's own timer (SIGALRM) may interrupt the wait: nothing ready.
    match poll(&mut fds, timeout) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => panic!("poll: {e}"),
    }
    let ready: Vec<bool> = fds
        .iter()
        .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
        .collect();
    drop(fds);
    server.set_ready(&ready);
    server.serve(Instant::now(), &mut page);
    ready.contains(&true)
}

/// Turns until nothing is ready (bounded: serve never waits).
fn settle(server: &mut HttpServer) {
    for _ in 0..64 {
        if !turn(server, Duration::ZERO) {
            return;
        }
    }
}

fn read_some(client: &mut TcpStream, answer: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match client.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return true,
        }
    }
}

/// Sends `pieces` one by one, letting the server read each, then ends
/// the request and returns the answer.
fn exchange(server: &mut HttpServer, pieces: &[&[u8]]) -> Vec<u8> {
    let mut client = TcpStream::connect(server.local_addr()).expect("connect");
    client.set_nonblocking(true).unwrap();
    client.set_nodelay(true).unwrap();
    // Closed with a reset: no TIME_WAIT, so ports do not run out.
    setsockopt(
        &client.as_fd(),
        sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    )
    .unwrap();
    settle(server);
    let mut answer = Vec::new();
    let mut ended = false;
    'send: for piece in pieces {
        let mut rest = *piece;
        while !rest.is_empty() {
            match client.write(rest) {
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    turn(server, Duration::from_millis(10));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // The server closed: it answered, or gave up.
                Err(_) => break 'send,
            }
        }
        settle(server);
        ended |= read_some(&mut client, &mut answer);
    }
    let _ = client.shutdown(Shutdown::Write);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ended {
        assert!(
            Instant::now() < deadline,
            "the server neither answered nor closed"
        );
        turn(server, Duration::from_millis(10));
        ended = read_some(&mut client, &mut answer);
    }
    drop(client);
    while server.deadline().is_some() {
        assert!(
            Instant::now() < deadline,
            "the server kept a connection of a client gone"
        );
        turn(server, Duration::from_millis(10));
    }
    answer
}

fn check_answer(request: &[u8], answer: &[u8]) {
    if answer.is_empty() {
        return;
    }
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut head = httparse::Response::new(&mut headers);
    let at = match head.parse(answer) {
        Ok(httparse::Status::Complete(at)) => at,
        other => panic!(
            "not an HTTP answer ({other:?}): {:?}",
            String::from_utf8_lossy(answer)
        ),
    };
    assert_eq!(head.version, Some(1));
    let code = head.code.unwrap();
    assert!(
        [200, 400, 404, 405, 431, 503].contains(&code),
        "code {code}"
    );
    let header = |name: &str| {
        head.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| std::str::from_utf8(h.value).unwrap())
    };
    assert_eq!(header("connection"), Some("close"));
    let length: usize = header("content-length").unwrap().parse().unwrap();
    let body = &answer[at..];
    // As many headers as the server takes: more get 431.
    let mut parsed = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut parsed);
    let complete = matches!(req.parse(request), Ok(httparse::Status::Complete(_)));
    if complete && req.method == Some("HEAD") && [200, 404, 503].contains(&code) {
        assert!(body.is_empty(), "a body for HEAD");
    } else {
        assert_eq!(body.len(), length, "Content-Length");
    }
    if complete && req.method == Some("GET") && req.path == Some("/ready") {
        assert_eq!(code, 200);
    }
    if code == 405 {
        assert_eq!(header("allow"), Some("GET, HEAD"));
    }
}

fuzz_target!(|data: &[u8]| {
    let pieces = tend_fuzz::pieces(data);
    let whole: Vec<u8> = pieces.concat();
    SERVER.with_borrow_mut(|server| {
        let cut = exchange(server, &pieces);
        let at_once = exchange(server, &[&whole]);
        assert_eq!(
            String::from_utf8_lossy(&cut),
            String::from_utf8_lossy(&at_once),
            "the answer depends on how the request was cut"
        );
        check_answer(&whole, &cut);
    });
});
