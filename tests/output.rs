//! The services' output through tend (`output = "prefix"`): every line
//! named, whole and none lost, across restarts and crashes; and tend's
//! stdout and stderr never holding PID 1, even when nobody reads them.

mod common;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::{free_port, get_with};
use common::kubelet::project;
use common::*;
use nix::sys::signal::Signal;

/// `tests/support/lines.py NAME ARGS...` as a TOML array.
fn lines(name: &str, args: &[&str]) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/lines.py");
    let mut argv = vec![
        "python3".to_string(),
        script.display().to_string(),
        name.into(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    toml_list(&argv)
}

/// A `[[service]]` table.
fn service(name: &str, command: &str, more: &str) -> String {
    format!("[[service]]\nname = {name:?}\ncommand = {command}\n{more}\n")
}

/// A line lines.py wrote, as tend wrote it: `TAG | NAME PID SEQ ....`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Numbered {
    name: String,
    pid: u32,
    seq: u64,
}

/// Parses a prefixed line of lines.py (`size` bytes as written), or says
/// what is wrong with it: a line cut, mixed with another or misnamed.
fn numbered(line: &str, size: usize) -> Result<Numbered, String> {
    let (tag, text) = line
        .split_once(" | ")
        .ok_or_else(|| format!("no prefix: {line:?}"))?;
    let mut words = text.splitn(4, ' ');
    let (name, pid, seq, dots) = (
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
        words.next().unwrap_or(""),
    );
    if name != tag || text.len() + 1 != size || !dots.bytes().all(|b| b == b'.') {
        return Err(format!("not a whole line of {tag}: {line:?}"));
    }
    Ok(Numbered {
        name: name.to_string(),
        pid: pid.parse().map_err(|_| format!("pid in {line:?}"))?,
        seq: seq.parse().map_err(|_| format!("seq in {line:?}"))?,
    })
}

/// Whether `line` is one of tend's own text log lines.
fn tends_own(line: &str) -> bool {
    line.len() > 27 && line.as_bytes()[4] == b'-' && line.as_bytes()[10] == b'T'
}

/// The sequence numbers seen, by (name, pid), checked to be unique.
fn by_process(lines: &[Numbered]) -> BTreeMap<(String, u32), Vec<u64>> {
    let mut out: BTreeMap<(String, u32), Vec<u64>> = BTreeMap::new();
    for l in lines {
        out.entry((l.name.clone(), l.pid)).or_default().push(l.seq);
    }
    for (who, seqs) in &mut out {
        let n = seqs.len();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), n, "a line of {who:?} came out twice");
    }
    out
}

/// 0..=max with no number missing.
fn without_gap(seqs: &[u64]) -> bool {
    seqs.iter().enumerate().all(|(i, &s)| s == i as u64)
}

#[test]
fn lines_of_three_services_writing_at_once_come_out_named_whole_and_all() {
    const N: usize = 20_000;
    let sb = Sandbox::new();
    let n = N.to_string();
    let cfg = sb.config(&format!(
        "{}{}{}",
        // Buffered: 8 KiB writes that end in the middle of a line.
        service("a", &lines("a", &["--count", &n, "--buffered"]), ""),
        service(
            "b",
            &lines(
                "b",
                &[
                    "--count",
                    &n,
                    "--buffered",
                    "--stderr-every",
                    "3",
                    "--then",
                    "exit"
                ]
            ),
            "required = false"
        ),
        // One write per line, then killed: its last lines still come out.
        service(
            "c",
            &lines("c", &["--count", &n, "--then", "crash"]),
            "required = false"
        ),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    let count = |t: &Tend| {
        let (out, err) = (t.stdout(), t.stderr());
        out.lines()
            .chain(err.lines())
            .filter(|l| !tends_own(l))
            .count()
    };
    wait_every(Duration::from_millis(100), "every line", secs(60.0), || {
        (count(&tend) >= 3 * N).then_some(())
    });
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);

    let (out, err) = (tend.stdout(), tend.stderr());
    let mut seen = Vec::new();
    for (stream, text) in [("stdout", &out), ("stderr", &err)] {
        for line in text.lines().filter(|l| stream == "stdout" || !tends_own(l)) {
            let l = numbered(line, 100).unwrap_or_else(|e| panic!("{stream}: {e}"));
            let to_stderr = l.name == "b" && l.seq % 3 == 2;
            assert_eq!(stream == "stderr", to_stderr, "{line:?} on {stream}");
            seen.push(l);
        }
    }
    let seen = by_process(&seen);
    assert_eq!(seen.len(), 3, "{:?}", seen.keys());
    for ((name, _), seqs) in &seen {
        assert_eq!(seqs.len(), N, "{name}: every line once");
        assert!(without_gap(seqs), "{name}");
    }
    assert!(
        err.contains("killed by SIGKILL"),
        "c died of SIGKILL after its last line: {err}"
    );
}

/// A service writing without pause is restarted three times with `mode`
/// (each generation has its own pid and counts from 0); every line each
/// generation wrote comes out, whole.
fn every_line_of_every_generation_comes_out(mode: &str) {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v0")]);
    let last = sb.path("last");
    let cfg = sb.config(&format!(
        "[service]\nname = \"app\"\ncommand = {}\noutput = \"prefix\"\nrestart_mode = \"{mode}\"\n\
         ready_check = [\"true\"]\nstop_timeout = \"5s\"\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\non_change = \"restart\"\n",
        lines(
            "app",
            &[
                "--burst",
                "20",
                "--pause",
                "0.001",
                "--last",
                &last.display().to_string()
            ]
        ),
        vol.display().to_string(),
    ));
    let mut tend = sb.tend().config(&cfg).start();
    let pids = |t: &Tend| {
        let mut pids: Vec<u32> = t
            .stdout()
            .lines()
            .filter_map(|l| numbered(l, 100).ok())
            .map(|l| l.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids.len()
    };
    wait_every(
        Duration::from_millis(50),
        "the first lines",
        secs(10.0),
        || (pids(&tend) == 1).then_some(()),
    );
    for v in 1..=3 {
        project(&vol, &[("app.conf", &format!("v{v}"))]);
        wait_every(
            Duration::from_millis(50),
            &format!("lines of generation {}", v + 1),
            secs(10.0),
            || (pids(&tend) == v + 1).then_some(()),
        );
        // Let both write for a while (with overlap, at the same time).
        std::thread::sleep(Duration::from_millis(200));
    }
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);

    let out = tend.stdout();
    let seen: Vec<Numbered> = out
        .lines()
        .map(|l| numbered(l, 100).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let seen = by_process(&seen);
    assert_eq!(seen.len(), 4, "four generations: {:?}", seen.keys());
    let stopped: BTreeMap<u32, i64> = std::fs::read_to_string(&last)
        .unwrap()
        .lines()
        .map(|l| {
            let (pid, seq) = l.split_once(' ').unwrap();
            (pid.parse().unwrap(), seq.parse().unwrap())
        })
        .collect();
    assert_eq!(stopped.len(), 4, "each generation was stopped: {stopped:?}");
    for ((_, pid), seqs) in &seen {
        assert!(without_gap(seqs), "generation {pid}: a line is missing");
        let last_written = stopped[pid];
        assert!(
            *seqs.last().unwrap() as i64 >= last_written,
            "generation {pid} wrote up to {last_written}, {} came out",
            seqs.last().unwrap()
        );
    }
}

#[test]
fn restarts_lose_no_line_of_either_generation() {
    every_line_of_every_generation_comes_out("stop-start");
}

#[test]
fn overlap_restarts_lose_no_line_of_either_generation() {
    every_line_of_every_generation_comes_out("overlap");
}

/// What a test reads of tend's stdout or stderr, once it starts reading.
struct Drain {
    read: Option<OwnedFd>,
    got: Arc<Mutex<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drain {
    /// A pipe whose write end is for tend; nothing reads it yet.
    fn pipe() -> (Drain, Stdio) {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let d = Drain {
            read: Some(read),
            got: Arc::default(),
            thread: None,
        };
        (d, Stdio::from(write))
    }

    /// Reads from now on, until the pipe's end of file.
    fn start(&mut self) {
        let mut f = std::fs::File::from(self.read.take().unwrap());
        let got = self.got.clone();
        self.thread = Some(std::thread::spawn(move || {
            let mut buf = vec![0; 1 << 16];
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        }));
    }

    /// Reads from now on, keeping only the lines `keep` wants and
    /// checking the others as they pass (a flood would fill memory).
    fn start_filtered(&mut self, keep: fn(&str) -> bool, check: fn(&str)) {
        let mut f = std::fs::File::from(self.read.take().unwrap());
        let got = self.got.clone();
        self.thread = Some(std::thread::spawn(move || {
            let (mut buf, mut rest) = (vec![0; 1 << 16], Vec::new());
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                rest.extend_from_slice(&buf[..n]);
                let end = rest
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |at| at + 1);
                for line in String::from_utf8_lossy(&rest[..end]).lines() {
                    if keep(line) {
                        let mut got = got.lock().unwrap();
                        got.extend_from_slice(line.as_bytes());
                        got.push(b'\n');
                    } else {
                        check(line);
                    }
                }
                rest.drain(..end);
            }
        }));
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.got.lock().unwrap()).into_owned()
    }

    /// Everything, once the writers are gone (tend exited).
    fn finish(mut self) -> String {
        if self.thread.is_none() {
            self.start();
        }
        self.thread.take().unwrap().join().unwrap();
        self.text()
    }
}

/// The value of a series in a /metrics page.
fn metric(page: &str, series: &str) -> Option<u64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The lines dropped that tend's notices report for `service` on `stream`.
fn noticed(log: &str, service: &str, stream: &str) -> u64 {
    log.lines()
        .filter(|l| {
            l.contains("dropped")
                && l.contains(&format!("service=\"{service}\""))
                && l.contains(&format!("stream=\"{stream}\""))
        })
        .filter_map(|l| {
            l.split("dropped=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// tend with two services, "app" (the instrumented service, which records
/// its signals in the sandbox's log) and "flood" (lines without pause, one
/// in two on stderr), an HTTP endpoint, and stdout and stderr pipes that
/// nothing reads yet: once they are full and a write has been blocked for
/// a second, lines are dropped.
fn stuck(sb: &Sandbox) -> (Tend, u16, Drain, Drain) {
    let port = free_port();
    let cfg = sb.config(&format!(
        "{}{}[http]\nlisten = \"127.0.0.1:{port}\"\n{}",
        service(
            "app",
            &sb.service_toml(&["--tag", "app"]),
            "stop_timeout = \"3s\""
        ),
        service(
            "flood",
            &lines("flood", &["--stderr-every", "2"]),
            "stop_timeout = \"3s\""
        ),
        sb.readiness_toml(),
    ));
    let (out, out_w) = Drain::pipe();
    let (err, err_w) = Drain::pipe();
    let tend = sb.tend().config(&cfg).stdio(out_w, err_w).start();
    sb.wait_log("app start", 1, secs(10.0));
    sb.wait_ready(true, secs(10.0));
    // Dropping: the pipes are full and the writer has been stuck a second.
    wait_every(
        Duration::from_millis(100),
        "lines dropped",
        secs(20.0),
        || {
            let page = get_with(port, "/metrics", &[]).ok()?;
            let s = "tend_output_dropped_lines_total{service=\"flood\",stream=\"stdout\"}";
            (metric(&page, s)? > 0).then_some(())
        },
    );
    (tend, port, out, err)
}

#[test]
fn with_nobody_reading_signals_are_forwarded_and_ready_answers_and_the_drops_are_counted() {
    let sb = Sandbox::new();
    let (mut tend, port, mut out, mut err) = stuck(&sb);
    let stuck_since = Instant::now();
    for (i, sig) in [Signal::SIGUSR1, Signal::SIGHUP, Signal::SIGUSR1]
        .into_iter()
        .enumerate()
    {
        let sent = Instant::now();
        tend.signal(sig);
        // Before the output writer, this waited for a reader forever.
        let n = [1, 1, 2][i];
        sb.wait_log(&format!("app sig {}", sig.as_str()), n, secs(1.0));
        eprintln!("{} forwarded after {:?}", sig.as_str(), sent.elapsed());
    }
    assert!(get_with(port, "/ready", &[]).is_ok(), "/ready says ready");
    wait_for("dropped_lines in the status", secs(5.0), || {
        let st = sb.status()?;
        let flood = st["services"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "flood")?;
        (flood["dropped_lines"].as_u64()? > 0).then_some(())
    });
    let shown = std::process::Command::new(TEND)
        .args(["status", "--config"])
        .arg(sb.path("supervisor.toml"))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown
            .lines()
            .any(|l| l.contains("flood") && l.contains("output lines dropped")),
        "tend status: {shown}"
    );
    // Stuck for a few seconds in all, then read again.
    std::thread::sleep(secs(3.0).saturating_sub(stuck_since.elapsed()));
    out.start();
    err.start();
    let series = |stream: &str| {
        format!("tend_output_dropped_lines_total{{service=\"flood\",stream=\"{stream}\"}}")
    };
    // The notices add up to what /metrics counts, once nothing more is
    // dropped (the reader keeps up, so the flood waits instead).
    for stream in ["stdout", "stderr"] {
        wait_every(
            Duration::from_millis(100),
            &format!("notices of the lines dropped on {stream} to match /metrics"),
            secs(15.0),
            || {
                let page = get_with(port, "/metrics", &[]).ok()?;
                let counted = metric(&page, &series(stream))?;
                let said = noticed(&err.text(), "flood", stream);
                (said > 0 && said == counted).then_some(())
            },
        );
    }
    assert!(
        err.text().contains("forwarded SIGUSR1"),
        "tend's own lines of the stuck time came out"
    );
    let page = get_with(port, "/metrics", &[]).unwrap();
    assert_eq!(
        metric(
            &page,
            "tend_output_dropped_lines_total{service=\"app\",stream=\"stdout\"}"
        ),
        Some(0)
    );
    assert!(page.contains("tend_output_dropped_lines_total{service=\"tend\",stream=\"stderr\"}"));

    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    let (out, err) = (out.finish(), err.finish());
    // Every line whole; the ones missing are the ones counted.
    for (stream, text, every) in [("stdout", &out, 0), ("stderr", &err, 1)] {
        let seen: Vec<Numbered> = text
            .lines()
            .filter(|l| !tends_own(l))
            .map(|l| numbered(l, 100).unwrap_or_else(|e| panic!("{stream}: {e}")))
            .collect();
        assert!(seen.iter().all(|l| l.seq % 2 == every), "{stream}");
        let seqs = &by_process(&seen)[&("flood".to_string(), seen[0].pid)];
        let last = *seqs.last().unwrap();
        let missing = (last / 2 + 1) - seqs.len() as u64;
        assert_eq!(
            missing,
            noticed(&err, "flood", stream),
            "{stream}: the lines missing are the lines dropped"
        );
    }
}

#[test]
fn with_nobody_reading_sigterm_stops_every_service_within_its_stop_timeout() {
    let sb = Sandbox::new();
    let (mut tend, _port, out, err) = stuck(&sb);
    let sent = Instant::now();
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(3.0)), 0);
    eprintln!("tend exited {:?} after SIGTERM", sent.elapsed());
    sb.wait_log("app sig SIGTERM", 1, secs(1.0));
    drop((out.finish(), err.finish()));
}

/// A service that takes each queued SIGRTMIN+2 with sigwaitinfo and
/// counts them in its log (a Python handler would merge the ones that
/// arrive together), and records SIGUSR2 and SIGTERM.
const COUNTER: &str = "import signal, sys\n\
    rt = signal.SIGRTMIN + 2\n\
    wanted = {rt, signal.SIGUSR2, signal.SIGTERM}\n\
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)\n\
    log = open(sys.argv[1], 'a', buffering=1)\n\
    log.write('start\\n')\n\
    n = 0\n\
    while True:\n\
    \x20   s = signal.sigwaitinfo(wanted).si_signo\n\
    \x20   if s == rt:\n\
    \x20       n += 1\n\
    \x20       log.write(f'rt {n}\\n')\n\
    \x20   elif s == signal.SIGUSR2:\n\
    \x20       log.write('usr2\\n')\n\
    \x20   else:\n\
    \x20       log.write('term\\n')\n\
    \x20       sys.exit(0)\n";

/// tend as a plain init of [`COUNTER`], logging at info into a stderr pipe
/// that nothing reads, after `n` realtime signals forwarded: each is a
/// log line of about 100 bytes, far more than the pipe holds.
fn plain_init_with_stuck_stderr(sb: &Sandbox, n: usize) -> (Tend, Drain) {
    let (err, err_w) = Drain::pipe();
    let log = sb.path("service.log").display().to_string();
    let mut tend = sb
        .tend()
        .env("TEND_LOG", "info")
        .stdio(Stdio::null(), err_w)
        .command(&["python3", "-c", COUNTER, log.as_str()])
        .start();
    sb.wait_log("start", 1, secs(10.0));
    let rt = libc::SIGRTMIN() + 2;
    for _ in 0..n {
        tend.signal_number(rt);
    }
    sb.wait_log(&format!("rt {n}"), 1, secs(20.0));
    (tend, err)
}

#[test]
fn with_one_service_and_nobody_reading_tends_own_log_never_holds_it() {
    let sb = Sandbox::new();
    let (mut tend, mut err) = plain_init_with_stuck_stderr(&sb, 3000);
    let sent = Instant::now();
    tend.signal(Signal::SIGUSR2);
    // Before the output writer, tend sat in a write after about 66 KiB.
    sb.wait_log("usr2", 1, secs(1.0));
    eprintln!("SIGUSR2 forwarded after {:?}", sent.elapsed());
    // Read again: the lines that did not fit are counted, and said so.
    err.start();
    wait_for("the drop notice", secs(10.0), || {
        err.text().contains("of tend's own log lines").then_some(())
    });
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(5.0)), 0);
    let log = err.finish();
    assert!(
        log.lines().all(tends_own),
        "every line whole: {:?}",
        log.lines().find(|l| !tends_own(l))
    );
    let dropped = noticed(&log, "tend", "stderr");
    let kept = (log.matches("forwarded SIGRTMIN+2").count()
        + log.matches("forwarded SIGUSR2").count()) as u64;
    assert!(dropped > 0, "{dropped} dropped, {kept} kept");
    assert_eq!(kept + dropped, 3001, "every line came out or was counted");
}

#[test]
fn with_one_service_a_stuck_stderr_does_not_hold_sigterm() {
    let sb = Sandbox::new();
    let (mut tend, err) = plain_init_with_stuck_stderr(&sb, 1500);
    let sent = Instant::now();
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(5.0)), 0);
    eprintln!("tend exited {:?} after SIGTERM", sent.elapsed());
    sb.wait_log("term", 1, secs(1.0));
    let log = err.finish();
    assert!(log.lines().all(tends_own), "every line whole");
}

/// A service that writes a 1 MiB line, bytes that are not UTF-8, control
/// bytes on stderr, and a last line without a newline, then exits 3.
fn edge_cases(sb: &Sandbox, json: bool) -> (String, String) {
    let script = "import os, sys\n\
        os.write(1, b'x' * (1 << 20) + b'\\n')\n\
        os.write(1, b'bad \\xff\\xfe utf8\\n')\n\
        os.write(2, b'on stderr \\x1b[31mred\\x1b[0m\\n')\n\
        os.write(1, b'partial last line')\n\
        sys.exit(3)\n";
    let cfg = sb.config(&format!(
        "[service]\nname = \"edge\"\ncommand = {}\noutput = \"prefix\"\n",
        toml_list(&["python3".into(), "-c".into(), script.into()])
    ));
    let mut t = sb.tend().config(&cfg);
    if json {
        t = t.env("TEND_LOG_FORMAT", "json");
    }
    let mut tend = t.start();
    assert_eq!(tend.wait(secs(10.0)), 3);
    let read = |p| std::fs::read(p).unwrap();
    (
        String::from_utf8_lossy(&read(sb.path("tend.stdout"))).into_owned(),
        String::from_utf8_lossy(&read(sb.path("tend.stderr"))).into_owned(),
    )
}

#[test]
fn a_long_line_is_cut_bytes_pass_unchanged_and_a_partial_last_line_comes_out() {
    let sb = Sandbox::new();
    edge_cases(&sb, false);
    let out = std::fs::read(sb.path("tend.stdout")).unwrap();
    let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').collect();
    let long = vec![b'x'; 16 * 1024];
    for l in &lines[..64] {
        assert_eq!(*l, [b"edge | ".as_slice(), &long].concat());
    }
    assert_eq!(lines[64], b"edge | bad \xff\xfe utf8");
    assert_eq!(lines[65], b"edge | partial last line");
    assert_eq!(
        lines[66], b"",
        "one newline after the partial line, nothing more"
    );
    assert_eq!(lines.len(), 67);
    let err = std::fs::read_to_string(sb.path("tend.stderr")).unwrap();
    assert!(
        err.lines()
            .any(|l| l == "edge | on stderr \x1b[31mred\x1b[0m"),
        "{err}"
    );
}

#[test]
fn with_json_logs_every_line_is_an_object_jq_reads() {
    let sb = Sandbox::new();
    let (out, err) = edge_cases(&sb, true);
    for (file, stream) in [("tend.stdout", "stdout"), ("tend.stderr", "stderr")] {
        let jq = std::process::Command::new("jq")
            .args(["-c", "."])
            .stdin(std::fs::File::open(sb.path(file)).unwrap())
            .output()
            .expect("jq (scripts/install-deps installs it)");
        assert!(
            jq.status.success(),
            "{stream} is JSON lines: {}",
            String::from_utf8_lossy(&jq.stderr)
        );
    }
    let objects = |text: &str| -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let out = objects(&out);
    assert_eq!(out.len(), 66);
    assert!(
        out.iter()
            .all(|o| o["service"] == "edge" && o["stream"] == "stdout")
    );
    assert!(
        out[..64]
            .iter()
            .all(|o| o["line"].as_str().unwrap().len() == 16 * 1024)
    );
    assert_eq!(out[64]["line"], "bad \u{fffd}\u{fffd} utf8");
    assert_eq!(out[65]["line"], "partial last line");
    let err = objects(&err);
    assert!(err.iter().any(|o| o["service"] == "edge"
        && o["stream"] == "stderr"
        && o["line"] == "on stderr \u{1b}[31mred\u{1b}[0m"));
    assert!(
        err.iter().any(|o| o["level"] == "INFO"),
        "tend's own lines too"
    );
}

#[test]
fn a_partial_line_goes_out_after_a_quiet_time_and_its_newline_makes_no_empty_line() {
    let sb = Sandbox::new();
    let gate = common::gate::Gate::new(&sb, "go", false);
    let cfg = sb.config(&format!(
        "[service]\nname = \"p\"\ncommand = {}\noutput = \"prefix\"\n",
        sh(&format!(
            "printf 'Password: '; {}",
            gate.script("echo; echo next")
        ))
    ));
    let mut tend = sb.tend().config(&cfg).start();
    // The prompt comes out while the service still waits, without its
    // newline.
    wait_for("the prompt", secs(5.0), || {
        (tend.stdout() == "p | Password: \n").then_some(())
    });
    gate.open();
    assert_eq!(tend.wait(secs(10.0)), 0);
    assert_eq!(tend.stdout(), "p | Password: \np | next\n");
}

#[test]
fn a_service_writing_without_pause_starves_neither_another_service_nor_the_loop() {
    let sb = Sandbox::new();
    let cfg = sb.config(&format!(
        "{}{}{}{}",
        service("app", &sb.service_toml(&["--tag", "app"]), ""),
        service("flood", &lines("flood", &[]), ""),
        service(
            "tick",
            &lines(
                "tick",
                &["--count", "40", "--burst", "1", "--pause", "0.05"]
            ),
            "required = false"
        ),
        sb.readiness_toml(),
    ));
    let (mut out, out_w) = Drain::pipe();
    let mut tend = sb
        .tend()
        .config(&cfg)
        .stdio(
            out_w,
            Stdio::from(std::fs::File::create(sb.path("tend.stderr")).unwrap()),
        )
        .start();
    // The flood's lines are checked as they pass (whole, in order), and
    // only the others are kept.
    out.start_filtered(
        |l| !l.starts_with("flood | "),
        |l| {
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let l = numbered(l, 100).unwrap_or_else(|e| panic!("{e}"));
            let want = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(l.seq, want, "the flood's lines in order, none missing");
        },
    );
    sb.wait_log("app start", 1, secs(10.0));
    // The ticks are written over 2 s, while the flood writes without pause.
    wait_every(
        Duration::from_millis(50),
        "every line of tick",
        secs(15.0),
        || {
            (out.text()
                .lines()
                .filter(|l| l.starts_with("tick | "))
                .count()
                == 40)
                .then_some(())
        },
    );
    let sent = Instant::now();
    tend.signal(Signal::SIGUSR1);
    sb.wait_log("app sig SIGUSR1", 1, secs(1.0));
    eprintln!("SIGUSR1 forwarded after {:?}", sent.elapsed());
    let st = sb.status().unwrap();
    for s in st["services"].as_array().unwrap() {
        assert_eq!(s["dropped_lines"], 0, "{s}");
    }
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    let kept = out.finish();
    let ticks: Vec<Numbered> = kept
        .lines()
        .map(|l| numbered(l, 100).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let seqs = &by_process(&ticks)[&("tick".to_string(), ticks[0].pid)];
    assert!(without_gap(seqs) && seqs.len() == 40);
}
