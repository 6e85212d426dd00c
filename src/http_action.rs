//! `on_change = "http"`: a reload endpoint (Prometheus' and Alertmanager's
//! `/-/reload`, Fluent Bit's) called with plain HTTP, in images without curl.
//!
//! The request is made by tend itself, run as a short-lived child
//! (`tend __http METHOD URL TIMEOUT_MS`) exactly like an `exec` action: PID
//! 1's loop never waits on the network, and the action gets the exec
//! machinery for free (its own process group, the timeout, the output in the
//! log, retries with a back-off). The child prints the status line and the
//! first line of the body, and exits 0 for a 2xx answer, 1 otherwise.
//!
//! Plain HTTP to an IP address (or `localhost`) is all it speaks: the
//! endpoint is the service's own, on loopback or the pod's address, and a
//! static PID 1 makes no DNS query.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The most of an answer that is read: its head and the start of its body.
const MAX_ANSWER: usize = 64 * 1024;

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
        let ip: IpAddr = if host == "localhost" {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .map_err(|_| {
                    format!(
                        "{url:?}: {host:?} is not an IP address (tend makes no DNS query: use the address, or localhost)"
                    )
                })?
        };
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

/// The argv of the child that calls `endpoint` (tend itself, by /proc).
pub fn argv(method: &str, url: &str, timeout: Duration) -> Vec<String> {
    vec![
        "/proc/self/exe".into(),
        "__http".into(),
        method.into(),
        url.into(),
        timeout.as_millis().to_string(),
    ]
}

/// `tend __http METHOD URL TIMEOUT_MS`: makes the request and returns the
/// exit code (0 for a 2xx answer).
pub fn run(args: &[String]) -> i32 {
    let [method, url, timeout] = args else {
        println!("usage: tend __http METHOD URL TIMEOUT_MS");
        return 2;
    };
    let endpoint = match Endpoint::parse(method, url) {
        Ok(e) => e,
        Err(e) => {
            println!("{e}");
            return 2;
        }
    };
    let timeout = Duration::from_millis(timeout.parse().unwrap_or(5000));
    match call(&endpoint, timeout) {
        Ok((code, line)) => {
            println!("{} {url}: HTTP {code}{line}", endpoint.method);
            if (200..300).contains(&code) { 0 } else { 1 }
        }
        Err(e) => {
            println!("{} {url}: {e}", endpoint.method);
            1
        }
    }
}

/// Sends the request; the status code and ": first line of the body".
fn call(endpoint: &Endpoint, timeout: Duration) -> Result<(u16, String), String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("no answer within {timeout:?}"))
    };
    let mut stream = TcpStream::connect_timeout(&endpoint.addr, left()?)
        .map_err(|e| format!("cannot connect to {}: {e}", endpoint.addr))?;
    let request = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tend/{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        endpoint.method,
        endpoint.target,
        endpoint.host,
        env!("CARGO_PKG_VERSION")
    );
    stream
        .set_write_timeout(Some(left()?))
        .and_then(|()| stream.write_all(request.as_bytes()))
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        stream
            .set_read_timeout(Some(left()?))
            .map_err(|e| format!("setsockopt(): {e}"))?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if answer.is_empty() => return Err(format!("no answer: {e}")),
            // The head is there: a reset after it still says what happened.
            Err(_) => 0,
        };
        answer.extend_from_slice(&buf[..n]);
        if n == 0 || answer.len() >= MAX_ANSWER || body_started(&answer) {
            break;
        }
    }
    summarize(&answer)
}

/// Whether the head and a first line of the body (or the whole of a short
/// body) have arrived.
fn body_started(answer: &[u8]) -> bool {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(answer) {
        Ok(httparse::Status::Complete(at)) => answer[at..].contains(&b'\n'),
        _ => false,
    }
}

/// The status code of an answer, and ": its body's first line" (escaped).
fn summarize(answer: &[u8]) -> Result<(u16, String), String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    let at = match response.parse(answer) {
        Ok(httparse::Status::Complete(at)) => at,
        Ok(httparse::Status::Partial) => return Err("the answer ended inside its head".into()),
        Err(e) => return Err(format!("not an HTTP answer: {e}")),
    };
    let code = response.code.unwrap_or(0);
    let body = String::from_utf8_lossy(&answer[at..]);
    let first = body.lines().map(str::trim).find(|l| !l.is_empty());
    let line = first.map_or(String::new(), |l| format!(": {}", crate::text::summary(l)));
    Ok((code, line))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            ("POST", "http://127.0.0.1/a b", "spaces"),
            ("post", "http://127.0.0.1/", "not an HTTP method"),
        ] {
            let err = Endpoint::parse(method, url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn an_answer_is_its_status_and_the_first_line_of_its_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(summarize(ok).unwrap(), (200, String::new()));
        let bad = b"HTTP/1.1 500 Internal Server Error\r\n\r\n\nfailed to reload config: \x1b[31mbad\nmore\n";
        let (code, line) = summarize(bad).unwrap();
        assert_eq!(code, 500);
        assert!(line.starts_with(": failed to reload config: "), "{line}");
        assert!(!line.contains('\x1b'), "escaped: {line}");
        assert!(summarize(b"HTTP/1.1 200").is_err());
        assert!(summarize(b"SSH-2.0-OpenSSH\r\n").is_err());
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
