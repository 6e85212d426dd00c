//! `on_change = "http"`: a reload endpoint (Prometheus' and Alertmanager's
//! `/-/reload`, Fluent Bit's) called with plain HTTP, in images without curl.
//!
//! The request is made by tend's loop itself, on a non-blocking socket
//! polled with everything else (see `http_client`): no process is started,
//! and PID 1 never waits on the network. This module says what an endpoint
//! is and what its answer says: the status and the first line of the body,
//! which go to the log and the status; a 2xx answer is success.
//!
//! Plain HTTP to an IP address (or `localhost`) is all it speaks: the
//! endpoint is the service's own, on loopback or the pod's address, and a
//! static PID 1 makes no DNS query.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// A reload endpoint: where, and with which method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub method: String,
    pub url: String,
    pub addr: SocketAddr,
    /// The request target: path and query.
    pub target: String,
    /// The Host header.
    pub host: String,
}

impl Endpoint {
    /// Parses `http://HOST[:PORT][/PATH]`, where HOST is an IP address
    /// (`[::1]` for IPv6) or `localhost`.
    pub fn parse(method: &str, url: &str) -> Result<Endpoint, String> {
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "method {method:?} is not an HTTP method such as \"POST\" or \"GET\""
            ));
        }
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            if url.starts_with("https://") {
                format!("{url:?}: only plain http:// is supported (a reload endpoint on loopback or the pod's own address)")
            } else {
                format!("{url:?} is not an http:// URL")
            }
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!(
                "{url:?}: the path holds spaces or control characters"
            ));
        }
        let (host, port) = split_host_port(authority).ok_or_else(|| {
            format!("{url:?}: write the host as an address, e.g. http://127.0.0.1:9090/-/reload")
        })?;
        // An IPv6 address is written in brackets, an IPv4 one without.
        let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            _ if host == "localhost" => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            Some(v6) => v6.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6),
            None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        };
        let ip = ip.ok_or_else(|| {
            format!(
                "{url:?}: {host:?} is not an IP address (tend makes no DNS query: use the address, \
                 like 127.0.0.1 or [::1], or localhost)"
            )
        })?;
        if port == 0 {
            return Err(format!("{url:?}: port 0 cannot be connected to"));
        }
        Ok(Endpoint {
            method: method.to_string(),
            url: url.to_string(),
            addr: SocketAddr::new(ip, port),
            target: path.to_string(),
            host: authority.to_string(),
        })
    }
}

/// `host` and `port` of `host[:port]` or `[v6][:port]`; the port defaults to 80.
fn split_host_port(authority: &str) -> Option<(&str, u16)> {
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(end) = authority.find(']') {
        let (host, rest) = authority.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => 80,
    };
    Some((host, port))
}

pub(crate) enum Incomplete {
    /// The head of the final answer is not all there.
    Head,
    Bad(String),
}

/// The status code of the final answer in `answer`, and ": the first line of
/// its body" (escaped).
pub(crate) fn summarize(answer: &[u8], head_only: bool) -> Result<(u16, String), Incomplete> {
    let a = read_final(answer, head_only)
        .map_err(Incomplete::Bad)?
        .ok_or(Incomplete::Head)?;
    let line = first_line(&a.body, true).map_or(String::new(), |l| {
        format!(": {}", crate::text::summary(&String::from_utf8_lossy(l)))
    });
    Ok((a.code, line))
}

/// The final answer in what arrived so far (interim 1xx answers skipped).
pub(crate) struct Final {
    code: u16,
    /// What arrived of the body (without the chunked coding).
    pub body: Vec<u8>,
    /// Whether that is all of it.
    pub complete: bool,
}

/// The final answer in `bytes`, or None while its head is incomplete.
pub(crate) fn read_final(mut bytes: &[u8], head_only: bool) -> Result<Option<Final>, String> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        let at = match response.parse(bytes) {
            Ok(httparse::Status::Complete(at)) => at,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("not an HTTP answer: {e}")),
        };
        let code = response.code.unwrap_or(0);
        let rest = &bytes[at..];
        if (100..200).contains(&code) && code != 101 {
            bytes = rest;
            continue;
        }
        let header = |name: &str| {
            response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
        };
        let (body, complete) = if head_only || code == 204 || code == 304 {
            (Vec::new(), true)
        } else if header("transfer-encoding").is_some_and(|te| te.ends_with("chunked")) {
            dechunk(rest)
        } else if let Some(length) = header("content-length").and_then(|l| l.parse().ok()) {
            let body = &rest[..rest.len().min(length)];
            (body.to_vec(), body.len() == length)
        } else {
            // Until the server closes the connection.
            (rest.to_vec(), false)
        };
        return Ok(Some(Final {
            code,
            body,
            complete,
        }));
    }
}

/// The body in `bytes` of the chunked coding, as far as it arrived, and
/// whether it is all there.
fn dechunk(mut bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(eol) = bytes.windows(2).position(|w| w == b"\r\n") else {
            return (body, false);
        };
        let size = std::str::from_utf8(&bytes[..eol])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok());
        // A size that is not one ends what can be read.
        let Some(size) = size.filter(|s| *s > 0) else {
            return (body, true);
        };
        let data = &bytes[eol + 2..];
        if data.len() < size {
            body.extend_from_slice(data);
            return (body, false);
        }
        body.extend_from_slice(&data[..size]);
        bytes = data[size..].strip_prefix(b"\r\n").unwrap_or_default();
    }
}

/// The first line of `body` with something on it; with `partial`, also one
/// that has not ended yet.
pub(crate) fn first_line(body: &[u8], partial: bool) -> Option<&[u8]> {
    let mut lines = body.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let ended = lines.peek().is_some();
        if !ended && !partial {
            return None;
        }
        // Blank as the summary sees it: a line of only a vertical tab or a
        // no-break space has nothing to show.
        if !String::from_utf8_lossy(line).trim().is_empty() {
            return Some(line.trim_ascii());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_client::call;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    #[test]
    fn endpoints_are_plain_http_to_an_address() {
        let e = Endpoint::parse("POST", "http://127.0.0.1:9090/-/reload").unwrap();
        assert_eq!(e.addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(e.target, "/-/reload");
        assert_eq!(e.host, "127.0.0.1:9090");
        let e = Endpoint::parse("GET", "http://localhost").unwrap();
        assert_eq!(e.addr, "127.0.0.1:80".parse().unwrap());
        assert_eq!(e.target, "/");
        let e = Endpoint::parse("PUT", "http://[::1]:2020/api/v2/reload?x=1").unwrap();
        assert_eq!(e.addr, "[::1]:2020".parse().unwrap());
        assert_eq!(e.target, "/api/v2/reload?x=1");
        for (method, url, says) in [
            ("POST", "https://127.0.0.1/-/reload", "only plain http://"),
            ("POST", "ftp://x", "not an http:// URL"),
            (
                "POST",
                "http://prometheus:9090/-/reload",
                "not an IP address",
            ),
            (
                "POST",
                "http://127.0.0.1:99999/",
                "write the host as an address",
            ),
            (
                "POST",
                "http://user@127.0.0.1/",
                "write the host as an address",
            ),
            ("POST", "http://127.0.0.1:0/", "port 0"),
            ("POST", "http://[127.0.0.1]/", "not an IP address"),
            ("POST", "http://::1/", "not an IP address"),
            ("POST", "http://[::1/", "not an IP address"),
            ("POST", "http://127.0.0.1/a b", "spaces"),
            ("post", "http://127.0.0.1/", "not an HTTP method"),
        ] {
            let err = Endpoint::parse(method, url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    fn summary(answer: &[u8]) -> Result<(u16, String), String> {
        summarize(answer, false).map_err(|e| match e {
            Incomplete::Head => "incomplete".into(),
            Incomplete::Bad(e) => e,
        })
    }

    #[test]
    fn an_answer_is_its_status_and_the_first_line_of_its_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(summary(ok).unwrap(), (200, String::new()));
        let bad = b"HTTP/1.1 500 Internal Server Error\r\n\r\n\nfailed to reload config: \x1b[31mbad\nmore\n";
        let (code, line) = summary(bad).unwrap();
        assert_eq!(code, 500);
        assert!(line.starts_with(": failed to reload config: "), "{line}");
        assert!(!line.contains('\x1b'), "escaped: {line}");
        assert_eq!(summary(b"HTTP/1.1 200").unwrap_err(), "incomplete");
        assert!(
            summary(b"SSH-2.0-OpenSSH\r\n")
                .unwrap_err()
                .contains("not an HTTP answer")
        );
        let chunked = b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n\
                        7\r\nfailed \r\n9;x=1\r\nto reload\r\n1\r\n\n\r\n0\r\n\r\n";
        assert_eq!(
            summary(chunked).unwrap(),
            (500, ": failed to reload".into()),
            "the first line of the body, not a chunk's size"
        );
        let interim =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
        assert_eq!(
            summary(interim).unwrap(),
            (200, ": ok".into()),
            "1xx is skipped"
        );
    }

    #[test]
    fn a_line_of_unicode_blanks_is_not_the_first_line() {
        let blank = "HTTP/1.1 200 OK\r\n\r\n\x0b\n\u{a0}\u{2003}\nreloaded\n";
        assert_eq!(
            summary(blank.as_bytes()).unwrap(),
            (200, ": reloaded".into())
        );
        let only = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\x0b\n";
        assert_eq!(summary(only).unwrap(), (200, String::new()));
    }

    /// Answers the first connection to a new listener with `answer`, then
    /// holds it open until the returned sender is dropped. Returns its URL.
    fn server(answer: &'static [u8], pause: Duration) -> (String, std::sync::mpsc::Sender<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/-/reload", listener.local_addr().unwrap());
        let (hold, held) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut req = [0u8; 1024];
            let _ = conn.read(&mut req);
            for byte in answer {
                if conn.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(pause);
            }
            let _ = held.recv();
        });
        (url, hold)
    }

    fn timed_call(
        url: &str,
        method: &str,
        timeout: Duration,
    ) -> (Result<(u16, String), String>, Duration) {
        let e = Endpoint::parse(method, url).unwrap();
        let started = Instant::now();
        let result = call(&e, timeout);
        (result, started.elapsed())
    }

    #[test]
    fn an_answer_of_known_length_is_not_waited_on_past_its_end() {
        let long = Duration::from_secs(30);
        for (answer, method, expected) in [
            (
                &b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
                "POST",
                (200, ""),
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                "POST",
                (200, ": ok"),
            ),
            (b"HTTP/1.1 204 No Content\r\n\r\n", "POST", (204, "")),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
                "HEAD",
                (200, ""),
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                "POST",
                (200, ": ok"),
            ),
        ] {
            let (url, _hold) = server(answer, Duration::ZERO);
            let (result, took) = timed_call(&url, method, long);
            let (code, line) = result.unwrap();
            assert_eq!((code, line.as_str()), expected);
            assert!(
                took < long / 2,
                "{method} waited {took:?} for the server to close"
            );
        }
    }

    #[test]
    fn a_server_that_does_not_answer_in_time_is_a_timeout() {
        let (url, _hold) = server(b"", Duration::ZERO);
        let (result, took) = timed_call(&url, "POST", Duration::from_millis(300));
        assert_eq!(result.unwrap_err(), "no answer within 300ms");
        assert!(took >= Duration::from_millis(300), "{took:?}");
        // Byte by byte, slower than the timeout allows.
        let (url, _hold) = server(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            Duration::from_millis(50),
        );
        let (result, _) = timed_call(&url, "POST", Duration::from_millis(300));
        assert_eq!(result.unwrap_err(), "no complete answer within 300ms");
        // The head in time: its status counts, the rest of the body is not awaited.
        let (url, _hold) = server(b"HTTP/1.1 500 Oops\r\n\r\nfailed", Duration::ZERO);
        let (result, _) = timed_call(&url, "POST", Duration::from_millis(300));
        assert_eq!(result.unwrap(), (500, ": failed".into()));
    }

    #[test]
    fn an_answer_too_large_to_read_is_an_error_without_waiting_for_the_timeout() {
        let mut head = b"HTTP/1.1 200 OK\r\nX-Pad: ".to_vec();
        head.resize(crate::http_client::MAX_ANSWER + 4096, b'a');
        let head: &'static [u8] = head.leak();
        let (url, _hold) = server(head, Duration::ZERO);
        let (result, took) = timed_call(&url, "POST", Duration::from_secs(30));
        assert_eq!(
            result.unwrap_err(),
            format!(
                "the answer's head is larger than {} bytes",
                crate::http_client::MAX_ANSWER
            )
        );
        assert!(took < Duration::from_secs(15), "{took:?}");
    }

    #[test]
    fn a_real_server_is_called_and_its_answer_summarized() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut req = [0u8; 1024];
            let n = conn.read(&mut req).unwrap();
            conn.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\nnot yet up\r\n",
            )
            .unwrap();
            String::from_utf8_lossy(&req[..n]).into_owned()
        });
        let e = Endpoint::parse("POST", &format!("http://{addr}/-/reload")).unwrap();
        let (code, line) = call(&e, Duration::from_secs(5)).unwrap();
        assert_eq!((code, line.as_str()), (503, ": not yet up"));
        let request = server.join().unwrap();
        assert!(
            request.starts_with("POST /-/reload HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains(&format!("Host: {addr}\r\n")), "{request}");
        // Nobody listening: an error that says so, quickly.
        let closed = Endpoint::parse("POST", &format!("http://{addr}/")).unwrap();
        assert!(
            call(&closed, Duration::from_secs(2))
                .unwrap_err()
                .contains("cannot connect")
        );
    }
}
