//! `[http] listen`: /ready agreeing with `tend probe`, /status and
//! /metrics as clients read them, and a server that hostile clients cannot
//! use to slow PID 1 down.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

/// A config with [http] on a port the kernel picks, and one watch of
/// `app.conf` whose check passes while the file says "ok".
fn config(sb: &Sandbox, action: &str) -> PathBuf {
    sb.write("app.conf", "ok 1");
    sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[http]\nlisten = \"127.0.0.1:0\"\n\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\ncheck = [\"grep\", \"-q\", \"ok\", {:?}]\n{action}\n",
        sb.service_toml(&[]),
        sb.readiness_toml(),
        sb.path("app.conf").display().to_string(),
        sb.path("app.conf").display().to_string(),
    ))
}

/// Where tend's server listens, from its log.
fn address(tend: &Tend) -> SocketAddr {
    let log = tend.wait_stderr("HTTP server listening on ", secs(10.0));
    let (_, rest) = log.split_once("HTTP server listening on ").unwrap();
    rest.split(": GET").next().unwrap().parse().unwrap()
}

/// An answer: status code, headers (names in lower case), body.
#[derive(Debug)]
struct Answer {
    code: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// Sends `request` as it is and reads the answer until the server closes.
fn exchange(addr: SocketAddr, request: &[u8]) -> Answer {
    let mut s = TcpStream::connect_timeout(&addr, secs(2.0)).unwrap();
    s.set_read_timeout(Some(secs(10.0))).unwrap();
    s.write_all(request).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete head");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap();
    assert!(status.starts_with("HTTP/1.1 "), "{status}");
    let headers: BTreeMap<String, String> = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").unwrap();
            (k.to_ascii_lowercase(), v.to_string())
        })
        .collect();
    assert_eq!(headers["connection"], "close");
    if !request.starts_with(b"HEAD ") {
        assert_eq!(headers["content-length"], body.len().to_string());
    }
    Answer {
        code: status[9..12].parse().unwrap(),
        headers,
        body: body.to_string(),
    }
}

fn get(addr: SocketAddr, path: &str) -> Answer {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: tend\r\nUser-Agent: kube-probe/1.31\r\n\r\n")
            .as_bytes(),
    )
}

/// The series of a Prometheus text page (format 0.0.4), by name and
/// labels (`name{a="x",b="y"}`, labels sorted), read strictly: every line
/// is a HELP, a TYPE or a sample; names and label values are well formed;
/// each family is declared once, before its samples, which are together.
fn parse_metrics(page: &str) -> BTreeMap<String, f64> {
    fn name_ok(n: &str) -> bool {
        let mut c = n.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    assert!(page.ends_with('\n'), "the page ends with a line feed");
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = HashSet::new();
    let mut done = HashSet::new();
    let mut current: Option<String> = None;
    let mut series = BTreeMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(name_ok(name) && !help.is_empty(), "{line}");
            assert!(helped.insert(name.to_string()), "HELP twice: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name type");
            assert!(name_ok(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.into(), kind.into()).is_none(),
                "TYPE twice: {line}"
            );
            if let Some(previous) = current.replace(name.to_string()) {
                done.insert(previous);
            }
            continue;
        }
        assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => panic!("no value: {line}"),
        };
        assert!(name_ok(name), "{line}");
        let mut labels = Vec::new();
        let value = if let Some(mut rest) = rest.strip_prefix('{') {
            loop {
                let (label, after) = rest.split_once("=\"").expect("label=\"value\"");
                assert!(
                    name_ok(label) && !label.contains(':'),
                    "label name {label:?}: {line}"
                );
                let mut value = String::new();
                let mut chars = after.char_indices();
                let end = loop {
                    match chars.next().expect("a closing quote") {
                        (_, '\\') => match chars.next().expect("an escape").1 {
                            '\\' => value.push('\\'),
                            '"' => value.push('"'),
                            'n' => value.push('\n'),
                            c => panic!("bad escape \\{c}: {line}"),
                        },
                        (i, '"') => break i,
                        (_, '\n') => panic!("a raw line feed: {line}"),
                        (_, c) => value.push(c),
                    }
                };
                labels.push((label.to_string(), value));
                rest = &after[end + 1..];
                if let Some(r) = rest.strip_prefix(',') {
                    rest = r;
                } else {
                    break rest.strip_prefix("} ").expect("} after the labels");
                }
            }
        } else {
            rest.strip_prefix(' ').unwrap()
        };
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value {v:?}: {line}")),
        };
        let family = types
            .keys()
            .find(|f| {
                name == f.as_str()
                    || (types[*f] == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name.strip_suffix(s) == Some(f.as_str())))
            })
            .unwrap_or_else(|| panic!("a sample before its TYPE: {line}"))
            .clone();
        assert!(!done.contains(&family), "samples of {family} apart: {line}");
        assert_eq!(current.as_deref(), Some(family.as_str()), "{line}");
        labels.sort();
        let names: HashSet<&String> = labels.iter().map(|(k, _)| k).collect();
        assert_eq!(names.len(), labels.len(), "a label twice: {line}");
        let key = if labels.is_empty() {
            name.to_string()
        } else {
            let l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            format!("{name}{{{}}}", l.join(","))
        };
        assert!(series.insert(key, value).is_none(), "twice: {line}");
    }
    series
}

fn metrics(addr: SocketAddr) -> BTreeMap<String, f64> {
    let a = get(addr, "/metrics");
    assert_eq!(a.code, 200);
    assert_eq!(
        a.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    parse_metrics(&a.body)
}

/// Waits until /metrics says `series` is `value`, and returns the page.
fn wait_metric(addr: SocketAddr, series: &str, value: f64) -> BTreeMap<String, f64> {
    wait_for(&format!("{series} = {value}"), secs(10.0), || {
        let m = metrics(addr);
        (m.get(series) == Some(&value)).then_some(m)
    })
}

#[test]
fn ready_agrees_with_tend_probe_and_metrics_follow_the_reloads() {
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"signal\"\nsignal = \"SIGHUP\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);

    let ready = get(addr, "/ready");
    assert_eq!((ready.code, probe(&cfg)), (200, (0, ready.body.clone())));
    assert_eq!(ready.body, "ready (state ready)\n");
    let m = wait_metric(addr, "reloader_last_reload_successful", 1.0);
    assert_eq!(m["reloader_reloads_total"], 1.0, "the start-up's config");
    assert_eq!(m["reloader_reloads_failed_total"], 0.0);
    let first_success = m["reloader_last_reload_success_timestamp_seconds"];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - first_success).abs() < 60.0, "{first_success} {now}");
    assert_eq!(m["tend_ready"], 1.0);
    assert_eq!(
        m[r#"tend_service_restarts_total{service="python3"}"#], 0.0,
        "a single service is named after its program"
    );
    assert_eq!(m[r#"tend_service_ready{service="python3"}"#], 1.0);
    assert_eq!(m[r#"tend_watch_result{result="applied",watch="app"}"#], 1.0);
    assert_eq!(m[r#"tend_checks_total{result="passed",watch="app"}"#], 1.0);
    assert_eq!(m[r#"tend_check_duration_seconds_count{watch="app"}"#], 1.0);

    // An invalid config: not ready, and a failed reload.
    sb.write("app.conf", "bad");
    sb.wait_state("invalid_config", secs(10.0));
    let ready = get(addr, "/ready");
    let (code, line) = probe(&cfg);
    assert_eq!((ready.code, code), (503, 1));
    assert_eq!(ready.body, line);
    assert!(
        line.starts_with("not ready: state invalid_config; watch \"app\": invalid"),
        "{line}"
    );
    let m = wait_metric(addr, "reloader_last_reload_successful", 0.0);
    assert!(m["reloader_reloads_failed_total"] >= 1.0);
    assert_eq!(
        m["reloader_last_reload_success_timestamp_seconds"],
        first_success
    );
    assert_eq!(m["tend_ready"], 0.0);
    assert_eq!(m[r#"tend_watch_result{result="invalid",watch="app"}"#], 1.0);
    assert_eq!(m[r#"tend_watch_result{result="applied",watch="app"}"#], 0.0);
    assert!(m[r#"tend_checks_total{result="failed",watch="app"}"#] >= 1.0);

    // Valid again: applied with SIGHUP, ready, a successful reload.
    sb.write("app.conf", "ok 2");
    sb.wait_log("service sig SIGHUP", 1, secs(10.0));
    sb.wait_ready(true, secs(10.0));
    let m = wait_metric(addr, "reloader_last_reload_successful", 1.0);
    assert!(m["reloader_last_reload_success_timestamp_seconds"] > first_success);
    assert_eq!(
        m["reloader_reloads_total"],
        m["reloader_reloads_failed_total"] + 2.0
    );
    let ready = get(addr, "/ready");
    assert_eq!((ready.code, probe(&cfg)), (200, (0, ready.body.clone())));

    // /status is the status file, byte for byte.
    let status = get(addr, "/status");
    assert_eq!(status.code, 200);
    assert_eq!(status.headers["content-type"], "application/json");
    assert_eq!(
        status.body,
        std::fs::read_to_string(sb.path("status.json")).unwrap()
    );
    let json: serde_json::Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(json["state"], "ready");

    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn a_failed_action_counts_as_a_failed_reload() {
    let sb = Sandbox::new();
    let marker = sb.path("reload-fails");
    std::fs::write(&marker, "").unwrap();
    let cfg = config(
        &sb,
        &format!(
            "on_change = \"exec\"\nexec = {}",
            sh(&format!("! test -e {}", marker.display()))
        ),
    );
    let tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    wait_metric(addr, "reloader_last_reload_successful", 1.0);
    sb.write("app.conf", "ok 2");
    let m = wait_metric(addr, "reloader_last_reload_successful", 0.0);
    assert_eq!(
        m[r#"tend_watch_result{result="action_failed",watch="app"}"#],
        1.0
    );
    assert_eq!(get(addr, "/ready").code, 503);
    std::fs::remove_file(&marker).unwrap();
    let m = wait_metric(addr, "reloader_last_reload_successful", 1.0);
    assert!(m["reloader_reloads_failed_total"] >= 1.0);
    assert_eq!(get(addr, "/ready").code, 200);
}

/// `promtool check metrics` (Prometheus' own linter) on `page`: it must
/// find nothing to say.
fn promtool_check(page: &str) {
    use std::process::{Command, Stdio};
    let mut child = Command::new("timeout")
        .args(["30", "promtool", "check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(
        out.status.code(),
        Some(127),
        "promtool is not installed (Debian's prometheus package): run scripts/install-deps"
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}\n{page}"
    );
}

#[test]
fn a_rejected_watch_is_not_hidden_by_another_that_applies() {
    let sb = Sandbox::new();
    let mut toml = format!(
        "[service]\ncommand = {}\n{}\n[http]\nlisten = \"127.0.0.1:0\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml()
    );
    for name in ["a", "b"] {
        let file = sb.write(&format!("{name}.conf"), "ok");
        toml.push_str(&format!(
            "\n[[watch]]\nname = \"{name}\"\npaths = [{f:?}]\ncheck = [\"grep\", \"-q\", \"ok\", {f:?}]\n\
             on_change = \"none\"\n",
            f = file.display().to_string()
        ));
    }
    let cfg = sb.config(&toml);
    let tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    let m = wait_metric(addr, "reloader_reloads_total", 2.0);
    assert_eq!(m["reloader_last_reload_successful"], 1.0);

    // a is rejected, then b is applied: kube-prometheus' alert
    // (max_over_time(reloader_last_reload_successful[5m]) == 0) must fire.
    sb.write("a.conf", "bad");
    wait_metric(addr, r#"tend_watch_last_reload_successful{watch="a"}"#, 0.0);
    sb.write("b.conf", "ok 2");
    let m = wait_metric(addr, "reloader_reloads_total", 4.0);
    assert_eq!(m["reloader_reloads_failed_total"], 1.0);
    assert_eq!(m["reloader_last_reload_successful"], 0.0, "b hides nothing");
    assert_eq!(m[r#"tend_watch_last_reload_successful{watch="a"}"#], 0.0);
    assert_eq!(m[r#"tend_watch_last_reload_successful{watch="b"}"#], 1.0);
    promtool_check(&get(addr, "/metrics").body);

    sb.write("a.conf", "ok 3");
    let m = wait_metric(addr, "reloader_last_reload_successful", 1.0);
    assert_eq!(m[r#"tend_watch_last_reload_successful{watch="a"}"#], 1.0);
}

/// A reload endpoint as the service: answers every POST with 200 and
/// appends its request line to LOG.
const ENDPOINT: &str = r#"
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        with open(log, "a") as f:
            f.write(self.requestline + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

#[test]
fn every_reloader_and_configmap_reload_series_is_served_and_promtool_finds_nothing() {
    let sb = Sandbox::new();
    let port = common::http::free_port();
    let script = sb.write("endpoint.py", ENDPOINT);
    let requests = sb.path("requests.log");
    let conf = sb.write("app.conf", "ok 1");
    let extra = sb.write("extra.conf", "x");
    let url = format!("http://127.0.0.1:{port}/-/reload");
    let cfg = sb.config(&format!(
        "[service]\ncommand = [\"python3\", {:?}, \"{port}\", {:?}]\n{}\n[http]\nlisten = \"127.0.0.1:0\"\n\n\
         [[watch]]\nname = \"app\"\npaths = [{c:?}, {e:?}]\ncheck = [\"grep\", \"-q\", \"ok\", {c:?}]\n\
         on_change = \"http\"\nhttp = {{ url = {url:?} }}\n",
        script.display().to_string(),
        requests.display().to_string(),
        sb.readiness_toml(),
        c = conf.display().to_string(),
        e = extra.display().to_string(),
    ));
    let tend = sb.tend().config(&cfg).start();
    sb.wait_ready(true, secs(10.0));
    let addr = address(&tend);
    wait_for("the endpoint to listen", secs(10.0), || {
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let before = wait_metric(addr, "reloader_last_reload_successful", 1.0);
    sb.write("app.conf", "ok 2");
    let webhook = |series: &str, more: &str| format!("{series}{{{more}webhook={url:?}}}");
    let m = wait_metric(
        addr,
        &webhook("configmap_reload_success_reloads_total", ""),
        1.0,
    );
    assert_eq!(
        std::fs::read_to_string(&requests).unwrap(),
        "POST /-/reload HTTP/1.1\n"
    );
    assert_eq!(
        m[&webhook("configmap_reload_requests_total", "status_code=\"200\",")],
        1.0
    );
    for reason in ["client_request_do", "client_response"] {
        let series = format!("reason={reason:?},");
        assert_eq!(
            m[&webhook("configmap_reload_request_errors_total", &series)],
            0.0
        );
    }
    assert_eq!(m[&webhook("configmap_reload_last_reload_error", "")], 0.0);
    let took = m[&webhook("configmap_reload_last_request_duration_seconds", "")];
    assert!(took > 0.0 && took < 5.0, "{took}");
    assert_eq!(m["configmap_reload_watcher_errors_total"], 0.0);
    assert_eq!(m["reloader_watches"], 2.0, "the watch's two paths");
    assert!(
        m["reloader_watch_events_total"] > before["reloader_watch_events_total"],
        "the write was seen: {} then {}",
        before["reloader_watch_events_total"],
        m["reloader_watch_events_total"]
    );
    assert_eq!(m["reloader_watch_errors_total"], 0.0);
    assert_eq!(m["reloader_config_apply_operations_total"], 1.0);
    assert_eq!(m["reloader_config_apply_operations_failed_total"], 0.0);
    assert_eq!(m[r#"tend_watch_last_reload_successful{watch="app"}"#], 1.0);
    for name in [
        "reloader_reloads_total",
        "reloader_reloads_failed_total",
        "reloader_last_reload_successful",
        "reloader_last_reload_success_timestamp_seconds",
    ] {
        assert!(m.contains_key(name), "{name}");
    }
    promtool_check(&get(addr, "/metrics").body);
}

#[test]
fn other_methods_unknown_paths_and_oversize_requests_are_refused() {
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"none\"");
    let tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);

    for method in ["POST", "PUT", "DELETE"] {
        let a = exchange(
            addr,
            format!("{method} /ready HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").as_bytes(),
        );
        assert_eq!(a.code, 405, "{method}");
        assert_eq!(a.headers["allow"], "GET, HEAD");
    }
    assert_eq!(get(addr, "/").code, 404);
    assert_eq!(get(addr, "/healthz").code, 404);
    let head = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!((head.code, head.body.as_str()), (200, ""));
    assert!(head.headers["content-length"].parse::<usize>().unwrap() > 100);
    assert_eq!(exchange(addr, b"GET /ready HTTP/7\r\n\r\n").code, 400);

    // A head larger than 8 KiB is refused, and the answer arrives although
    // the client sent more than was read.
    let mut big = b"GET /ready HTTP/1.1\r\nX-Padding: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 64 * 1024));
    big.extend(b"\r\n\r\n");
    let a = exchange(addr, &big);
    assert_eq!(a.code, 431);

    // Nothing of the watched files is shown anywhere.
    sb.write("app.conf", "ok SECRET-TOKEN-1234");
    sb.wait_state("ready", secs(10.0));
    wait_for("the change to be applied", secs(10.0), || {
        (metrics(addr)["reloader_reloads_total"] >= 2.0).then_some(())
    });
    for path in ["/ready", "/status", "/metrics"] {
        assert!(!get(addr, path).body.contains("SECRET-TOKEN"), "{path}");
    }
}

#[test]
fn unusual_clients_get_one_answer_each() {
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"none\"");
    let tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    let ready = "ready (state ready)\n";
    for request in [
        &b"GET /ready HTTP/1.0\r\n\r\n"[..],
        b"GET /ready?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://10.1.2.3:9533/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /ready HTTP/1.1\nHost: x\n\n",
        // A body on a GET, or a second request after the first: one
        // answer, then the connection closes; nothing after the head is
        // taken for a request.
        b"GET /ready HTTP/1.1\r\nContent-Length: 25\r\n\r\nGET /status HTTP/1.1\r\n\r\n",
        b"GET /ready HTTP/1.1\r\n\r\nGET /status HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n",
        b"GET /ready HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let a = exchange(addr, request);
        assert_eq!(
            (a.code, a.body.as_str()),
            (200, ready),
            "{}",
            String::from_utf8_lossy(request)
        );
    }
    // A client that shuts its side down once it has asked (nc -N).
    let mut s = TcpStream::connect_timeout(&addr, secs(2.0)).unwrap();
    s.set_read_timeout(Some(secs(10.0))).unwrap();
    s.write_all(b"GET /ready HTTP/1.1\r\n\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with(ready), "{answer}");
    // A path that is not UTF-8.
    assert_eq!(exchange(addr, b"GET /ready\xff HTTP/1.1\r\n\r\n").code, 400);
}

#[test]
fn without_an_http_section_nothing_listens() {
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"none\"");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let cfg = sb.config(&text.replace("[http]\nlisten = \"127.0.0.1:0\"\n", ""));
    let mut tend = sb.tend().config(&cfg).start_ready();
    let pid = tend.pid();
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| l.display().to_string())
        .filter(|l| l.starts_with("socket:"))
        .collect();
    // Only the control socket beside the status file (`tend restart`),
    // bound under a private name and then renamed.
    let bound = sb.path(".status.json.sock.").display().to_string();
    let control: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/net/unix"))
        .unwrap()
        .lines()
        .filter(|l| l.contains(&bound))
        .map(|l| format!("socket:[{}]", l.split_whitespace().nth(6).unwrap()))
        .collect();
    assert_eq!(control.len(), 1);
    assert_eq!(sockets, control, "tend holds no other socket");
    let (_, err) = tend.stop(secs(10.0));
    assert!(!err.contains("HTTP server"), "{err}");
}

#[test]
fn a_port_in_use_stops_tend_before_the_service_starts() {
    let sb = Sandbox::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = config(&sb, "on_change = \"none\"");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let cfg = sb.config(&text.replace("127.0.0.1:0", &format!("127.0.0.1:{port}")));
    let (code, _, err) = sb.tend().config(&cfg).run(secs(10.0));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "cannot listen on 127.0.0.1:{port} ([http] listen): bind(): Address already in use"
        )),
        "{err}"
    );
    assert!(sb.log("service start").is_empty());
}

/// The descriptors tend holds.
fn open_fds(tend: &mut Tend) -> usize {
    let pid = tend.pid();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Lets this process hold `n` more sockets.
fn raise_fd_limit(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write `lim`.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max.min(lim.rlim_cur.max(n + 1024));
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    assert!(
        lim.rlim_cur >= n + 256,
        "RLIMIT_NOFILE too low: {}",
        lim.rlim_cur
    );
}

/// CLOCK_MONOTONIC, which the service's `t=` is read from too.
fn monotonic() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes `t`.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) },
        0
    );
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// How long a SIGUSR1 sent to tend takes to reach the service's handler
/// (its `n`-th).
fn signal_latency(sb: &Sandbox, tend: &mut Tend, n: usize) -> Duration {
    let sent = monotonic();
    tend.signal(Signal::SIGUSR1);
    let lines = sb.wait_log("service sig SIGUSR1", n, secs(10.0));
    let t: f64 = lines[n - 1]
        .split(" t=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    Duration::from_secs_f64(t).saturating_sub(sent)
}

#[test]
fn slow_and_numerous_clients_delay_no_signal() {
    const CLIENTS: usize = 1000;
    raise_fd_limit(CLIENTS as u64);
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"none\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    let mut latencies = vec![signal_latency(&sb, &mut tend, 1)];

    // A thousand connections that send nothing and stay open, opened while
    // a signal is sent.
    let opened = Arc::new(AtomicUsize::new(0));
    let flood = {
        let opened = opened.clone();
        std::thread::spawn(move || {
            let mut held = Vec::with_capacity(CLIENTS);
            for _ in 0..CLIENTS {
                held.push(TcpStream::connect_timeout(&addr, secs(10.0)).unwrap());
                opened.fetch_add(1, Ordering::Relaxed);
            }
            held
        })
    };
    wait_for("half of the connections", secs(30.0), || {
        (opened.load(Ordering::Relaxed) >= CLIENTS / 2).then_some(())
    });
    latencies.push(signal_latency(&sb, &mut tend, 2));
    let held = flood.join().unwrap();

    // Then a slowloris among them: a byte of a request head every 100 ms,
    // never finished. The server closes it once its connection is 5 s old.
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let opened = Instant::now();
        let head = b"GET /ready HTTP/1.1\r\nX-Slow: ";
        for b in head.iter().chain(std::iter::repeat(&b'a')) {
            if s.write_all(&[*b]).is_err() || opened.elapsed() > secs(20.0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        opened.elapsed()
    });
    for n in 3..=8 {
        latencies.push(signal_latency(&sb, &mut tend, n));
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("signal latencies with {CLIENTS} connections and a slow client: {latencies:?}");
    let worst = *latencies.iter().max().unwrap();
    assert!(
        worst < secs(1.0),
        "a signal took {worst:?} to reach the service while clients hung: {latencies:?}"
    );

    // The limit holds, and a client that asks gets its answer.
    let fds = open_fds(&mut tend);
    assert!(fds < 64 + 32, "tend holds {fds} descriptors");
    let ready = get(addr, "/ready");
    assert_eq!(
        (ready.code, ready.body.as_str()),
        (200, "ready (state ready)\n")
    );
    let took = slow.join().unwrap();
    assert!(
        took >= secs(4.5) && took < secs(8.0),
        "the slow client was cut off after {took:?}, not after 5 s"
    );
    drop(held);
    tend.wait_stderr(
        "connections open: the oldest is closed for each new one",
        secs(5.0),
    );
    assert!(tend.is_running());
}

#[test]
fn clients_that_use_up_tends_descriptors_do_not_lock_a_probe_out() {
    const LIMIT: u64 = 24;
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"none\"");
    let mut tend = sb
        .tend()
        .config(&cfg)
        .pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            // SAFETY: setrlimit reads `lim`; async-signal-safe.
            match unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        })
        .start_ready();
    let addr = address(&tend);
    let free = LIMIT as usize - open_fds(&mut tend);
    // More clients than tend has descriptors left, all silent.
    let held: Vec<TcpStream> = (0..free + 20)
        .map(|_| TcpStream::connect_timeout(&addr, secs(2.0)).unwrap())
        .collect();
    let asked = Instant::now();
    let ready = get(addr, "/ready");
    let took = asked.elapsed();
    assert_eq!(ready.code, 200);
    // The silent ones would hold their descriptors for 5 s each.
    assert!(
        took < secs(4.0),
        "the probe was answered after {took:?}, behind clients that said nothing"
    );
    drop(held);
    assert!(tend.is_running());
    let (_, log) = tend.stop(secs(10.0));
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("accept() on the HTTP server"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("Too many open files"),
        "{}",
        warnings[0]
    );
}

#[test]
fn metrics_parse_strictly_whatever_the_watch_names() {
    let sb = Sandbox::new();
    let names = ["quote \" and \\ backslash", "line\nbreak"];
    let mut toml = format!(
        "[service]\ncommand = {}\n{}\n[http]\nlisten = \"127.0.0.1:0\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml()
    );
    for (i, name) in names.iter().enumerate() {
        let file = sb.write(&format!("w{i}.conf"), "ok");
        toml.push_str(&format!(
            "\n[[watch]]\nname = {name:?}\npaths = [{f:?}]\ncheck = [\"grep\", \"-q\", \"ok\", {f:?}]\n\
             on_change = \"none\"\n",
            f = file.display().to_string()
        ));
    }
    let cfg = sb.config(&toml);
    let tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    // A rejected change and a good one for the first watch.
    sb.write("w0.conf", "bad");
    wait_metric(addr, "reloader_last_reload_successful", 0.0);
    sb.write("w0.conf", "ok 2");
    let m = wait_metric(addr, "reloader_last_reload_successful", 1.0);

    for name in names {
        let series = |s: &str| format!("{s}{{watch={name:?}}}");
        let labelled = |s: &str, l: &str, v: &str| format!("{s}{{{l}={v:?},watch={name:?}}}");
        let checks: f64 = ["passed", "failed", "timed_out"]
            .iter()
            .map(|r| m[&labelled("tend_checks_total", "result", r)])
            .sum();
        let count = m[&series("tend_check_duration_seconds_count")];
        assert!(count >= 1.0, "{name:?}");
        assert_eq!(checks, count, "{name:?}: every check is in the histogram");
        // Buckets are cumulative and end with +Inf, which is the count.
        let mut buckets: Vec<(f64, f64)> = m
            .iter()
            .filter_map(|(k, v)| {
                let le = k
                    .strip_prefix("tend_check_duration_seconds_bucket{le=\"")?
                    .strip_suffix(&format!("\",watch={name:?}}}"))?;
                Some((le.parse::<f64>().unwrap(), *v))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(buckets.len() > 10, "{name:?}: {buckets:?}");
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{name:?}: not cumulative: {buckets:?}"
        );
        assert_eq!(buckets.last(), Some(&(f64::INFINITY, count)), "{name:?}");
        assert!(m[&series("tend_check_duration_seconds_sum")] >= 0.0);
        let results: f64 = ["pending", "applied", "invalid", "action_failed"]
            .iter()
            .map(|r| m[&labelled("tend_watch_result", "result", r)])
            .sum();
        assert_eq!(results, 1.0, "{name:?}: one result at a time");
    }
    assert_eq!(
        m[&format!(
            "tend_checks_total{{result=\"failed\",watch={:?}}}",
            names[0]
        )],
        1.0
    );
}

#[test]
fn a_stop_is_not_held_up_by_clients() {
    let sb = Sandbox::new();
    sb.write("app.conf", "ok");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nstop_timeout = \"2s\"\n{}\n[http]\nlisten = \"127.0.0.1:0\"\n",
        sb.service_toml(&["--ignore-term"]),
        sb.readiness_toml()
    ));
    let mut tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    // Silent clients, and clients that ask for a page and never read it.
    let mut held = Vec::new();
    for i in 0..40 {
        let mut s = TcpStream::connect_timeout(&addr, secs(2.0)).unwrap();
        if i % 2 == 0 {
            s.write_all(b"GET /status HTTP/1.1\r\n\r\n").unwrap();
        }
        held.push(s);
    }
    let stopped = Instant::now();
    tend.signal(Signal::SIGTERM);
    sb.wait_state("stopping", secs(5.0));
    // Stopping, with the service waiting out its stop_timeout: not ready.
    let ready = get(addr, "/ready");
    assert_eq!(
        (ready.code, ready.body.as_str()),
        (503, "not ready: state stopping\n")
    );
    assert_eq!(tend.wait(secs(10.0)), 128 + 9);
    let took = stopped.elapsed();
    assert!(
        took < secs(4.5),
        "tend took {took:?} to stop with clients connected (stop_timeout 2s)"
    );
    drop(held);
}

/// CPU time tend has used so far (from /proc/PID/schedstat).
fn cpu_time(tend: &mut Tend) -> Duration {
    let pid = tend.pid();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    Duration::from_nanos(stat.split_whitespace().next().unwrap().parse().unwrap())
}

#[test]
fn a_client_that_wakes_tend_often_costs_it_little_however_large_the_status() {
    const WATCHES: usize = 40;
    let sb = Sandbox::new();
    let mut toml = format!(
        "[service]\ncommand = {}\n{}\n[http]\nlisten = \"127.0.0.1:0\"\n",
        sb.service_toml(&[]),
        sb.readiness_toml()
    );
    for i in 0..WATCHES {
        let file = sb.write(&format!("w{i}.conf"), "ok");
        // Each check leaves 4 KiB of output in the status.
        let check = format!(
            "head -c 4096 /dev/zero | tr '\\0' '.'; grep -q ok {}",
            file.display()
        );
        toml.push_str(&format!(
            "\n[[watch]]\nname = \"w{i}\"\npaths = [{:?}]\ncheck = {}\non_change = \"none\"\n",
            file.display().to_string(),
            sh(&check)
        ));
    }
    let cfg = sb.config(&toml);
    let mut tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    let status = get(addr, "/status");
    assert!(status.body.len() > WATCHES * 4096, "{}", status.body.len());

    // A byte every 2 ms, never a whole request: each one wakes tend up.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(b"GET /ready HTTP/1.1\r\nX: ").unwrap();
    let used = cpu_time(&mut tend);
    let started = Instant::now();
    while started.elapsed() < secs(2.0) {
        s.write_all(b"a").unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let share = (cpu_time(&mut tend) - used).as_secs_f64() / started.elapsed().as_secs_f64();
    assert!(
        share < 0.25,
        "tend used {:.0}% of a CPU for a client sending a byte every 2 ms",
        share * 100.0
    );
}

#[test]
fn an_idle_server_does_not_wake_tend_up() {
    let sb = Sandbox::new();
    let cfg = config(&sb, "on_change = \"none\"");
    let mut tend = sb.tend().config(&cfg).start_ready();
    let addr = address(&tend);
    assert_eq!(get(addr, "/ready").code, 200);
    // A client that connects and goes away without a word.
    drop(TcpStream::connect(addr).unwrap());
    let pid = tend.pid();
    let switches = || {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum::<u64>()
    };
    // Let the closes settle.
    std::thread::sleep(secs(0.5));
    let before = switches();
    std::thread::sleep(secs(3.0));
    assert_eq!(
        switches(),
        before,
        "tend's loop woke up with no client connected"
    );
}
