//! A minimal HTTP/1.0 client on loopback, and a load that sends requests
//! continuously (bounded in count and time) while a test changes config.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET / on 127.0.0.1:port: the body of a 200, or what went wrong.
pub fn get(port: u16) -> Result<String, String> {
    get_with(port, "/", &[])
}

/// GET `path` on 127.0.0.1:port with extra header lines (`"Name: value"`):
/// the body of a 200, or what went wrong (`status 401: ...`).
pub fn get_with(port: u16, path: &str, headers: &[&str]) -> Result<String, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no header end in {text:?}"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("status {status}: {body:?}"));
    }
    Ok(body.trim_end().to_string())
}

/// Waits until `port` answers (the service is up), or panics.
pub fn wait_up(port: u16, timeout: Duration) -> String {
    super::wait_for(&format!("an HTTP answer on port {port}"), timeout, || {
        get(port).ok()
    })
}

pub type Record = (Instant, Result<String, String>);

/// Requests sent one after another from one or more threads, each recorded
/// with the time it completed (and how long it took).
pub struct Load {
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<Record>>>,
    latencies: Arc<Mutex<Vec<(Instant, Duration)>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Load {
    /// At most `max_requests`, for at most `max_time`, with `pause` between them.
    pub fn start(port: u16, max_requests: usize, max_time: Duration, pause: Duration) -> Load {
        Load::workers(1, port, max_requests, max_time, pause)
    }

    /// `workers` threads, each sending at most `max_requests`.
    pub fn workers(
        workers: usize,
        port: u16,
        max_requests: usize,
        max_time: Duration,
        pause: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let handles = (0..workers)
            .map(|_| {
                let (s, r, l) = (stop.clone(), records.clone(), latencies.clone());
                std::thread::spawn(move || {
                    let started = Instant::now();
                    for _ in 0..max_requests {
                        if s.load(Ordering::Relaxed) || started.elapsed() > max_time {
                            break;
                        }
                        let sent = Instant::now();
                        let result = get(port);
                        let done = Instant::now();
                        if result.is_ok() {
                            l.lock().unwrap().push((sent, done - sent));
                        }
                        r.lock().unwrap().push((done, result));
                        std::thread::sleep(pause);
                    }
                })
            })
            .collect();
        Load {
            stop,
            records,
            latencies,
            handles,
        }
    }

    /// Stops the load; returns every record, and when each successful
    /// request was sent and how long it took.
    pub fn finish_timed(self) -> (Vec<Record>, Vec<(Instant, Duration)>) {
        let latencies = self.latencies.clone();
        let records = self.finish();
        let l = std::mem::take(&mut *latencies.lock().unwrap());
        (records, l)
    }

    /// Waits for a successful answer `body` completed after `since`, and
    /// returns when it completed.
    pub fn wait_body(&self, body: &str, since: Instant, timeout: Duration) -> Instant {
        super::wait_for(&format!("an answer {body:?}"), timeout, || {
            self.records
                .lock()
                .unwrap()
                .iter()
                .find(|(t, r)| *t >= since && r.as_deref() == Ok(body))
                .map(|(t, _)| *t)
        })
    }

    /// The answers completed after `since`.
    pub fn since(&self, since: Instant) -> Vec<Record> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t >= since)
            .cloned()
            .collect()
    }

    /// Stops the load and returns every record.
    pub fn finish(mut self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            h.join().unwrap();
        }
        std::mem::take(&mut *self.records.lock().unwrap())
    }
}
