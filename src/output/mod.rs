//! Output: the services' lines and tend's own, on tend's stdout and
//! stderr, without ever blocking the loop.
//!
//! Theory of operation. A service with `output = "prefix"` writes into two
//! pipes that tend creates once and holds for as long as it runs
//! ([`ServiceOutput`]): every instance of the service gets the same write
//! ends, so lines survive restarts, overlap restarts (both generations
//! write to one pipe) and crashes. The read ends are non-blocking
//! descriptors of tend's own in the loop's one `ppoll`: each wake-up reads
//! at most one [`writer::CHUNK`] from each pipe, so a service that writes
//! without pause costs the loop a bounded slice of work per wake-up and
//! cannot starve the others or a signal. The loop frames lines
//! ([`lines`]) and queues them for the writer; it never writes to fd 1 or
//! 2 itself. Reading on the loop rather than on a thread of its own keeps
//! the exit of an instance and the end of its output in one place: a
//! partial last line is flushed when the reaper sees the instance exit.
//!
//! The bounded writer ([`writer`]) is a thread per destination that does
//! the one call that may block: write(2) to tend's stdout or stderr,
//! which tend shares with a terminal or a log pipeline and so never makes
//! non-blocking. Every line goes through it: the services' and tend's own
//! log, from the loop and from the watcher thread alike. Each source may
//! queue at most [`writer::BOUND`] bytes. While the reader keeps up, a
//! service that outruns it waits in its own write (tend stops reading its
//! pipe at [`writer::SOFT_BOUND`]), as it would on a pipe of its own, and
//! nothing is lost. Once a write has been blocked for
//! [`writer::STUCK_AFTER`], the reader is stuck: the pipes are read again,
//! whole lines that do not fit are dropped and counted
//! (`tend_output_dropped_lines_total`, `dropped_lines` in the status), and
//! when a write goes through again a log line says how many.

pub mod lines;
mod pipes;
pub mod writer;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use lines::Format;
pub use pipes::ServiceOutput;
use writer::Writer;

use crate::config::{self, Config};

/// One of tend's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Who wrote a line: tend itself (its log), or service `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Tend,
    Service(usize),
}

impl Source {
    /// The writer's key for this source's lines on `stream`.
    fn key(self, stream: Stream) -> usize {
        let source = match self {
            Source::Tend => 0,
            Source::Service(i) => i + 1,
        };
        source * 2 + stream as usize
    }
}

/// How long tend waits at exit for what is queued to be written, when the
/// reader keeps taking it.
const EXIT_FLUSH: Duration = Duration::from_secs(5);

struct Shared {
    /// One, or two when stdout and stderr are different files.
    writers: Vec<Writer>,
    /// Which writer each stream goes through.
    by_stream: [usize; 2],
    /// By source: "tend", then each service's name.
    names: Vec<String>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// From here on tend's own lines go through the writer, which starts its
/// thread on the first one. Called once the sockets are in place (the
/// thread must not exist before, see `sockets::bind_all`); a second call
/// changes nothing.
pub fn arm(config: &Config, argv: &[String]) {
    SHARED.get_or_init(|| {
        let mut names = vec!["tend".to_string()];
        names.extend((0..config.services.len()).map(|i| {
            let argv = (i == config.main).then_some(argv);
            config.service_name(i, argv)
        }));
        // A service that inherits fds 1 and 2 writes there too: tend's
        // writes then stay within PIPE_BUF, so they never split a line of
        // its own in two around the service's.
        let atomic = config
            .services
            .iter()
            .any(|s| s.output == config::Output::Inherit);
        let keys = names.len() * 2;
        let one = same_file(libc::STDOUT_FILENO, libc::STDERR_FILENO);
        let (writers, by_stream) = if one {
            (vec![Writer::new(keys, atomic)], [0, 0])
        } else {
            (
                vec![Writer::new(keys, atomic), Writer::new(keys, atomic)],
                [0, 1],
            )
        };
        Shared {
            writers,
            by_stream,
            names,
        }
    });
}

/// Whether fds `a` and `b` are the same file (a terminal, a pipe, `2>&1`).
fn same_file(a: i32, b: i32) -> bool {
    // SAFETY: fds 0-2 are open for all of tend's life (see main.rs).
    let stat = |fd| nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
    match (stat(a), stat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Whether [`arm`] was called.
pub fn armed() -> bool {
    SHARED.get().is_some()
}

/// The writer of `stream`, once [`arm`]ed.
fn writer(stream: Stream) -> Option<&'static Writer> {
    let shared = SHARED.get()?;
    Some(&shared.writers[shared.by_stream[stream as usize]])
}

/// Writes tend's own `text` (whole lines) to stderr: through the writer
/// once armed, never waiting; before that (and in the commands that are
/// not PID 1: check-config, probe) directly, as one write.
pub fn tend_lines(text: &str) {
    let Some(w) = writer(Stream::Stderr) else {
        use std::io::Write as _;
        // A failed write to stderr has nowhere to be reported.
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
        return;
    };
    w.push(Source::Tend.key(Stream::Stderr), Stream::Stderr, |sink| {
        for line in text.split_inclusive('\n') {
            sink.line(|out| out.extend_from_slice(line.as_bytes()));
        }
    });
}

/// tend's last line, from a panic: through the writer and flushed, unless
/// a lock of the writer is taken (the panic may have come while this
/// thread held it), when it is written directly.
pub fn last_words(text: &str) {
    let Some(shared) = SHARED.get() else {
        return tend_lines(text);
    };
    if shared.writers.iter().all(Writer::lockable) {
        tend_lines(text);
        finish();
    } else {
        use std::io::Write as _;
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }
}

/// Lines of `source` on `stream` dropped so far.
pub fn dropped(source: Source, stream: Stream) -> u64 {
    writer(stream).map_or(0, |w| w.dropped(source.key(stream)))
}

/// Waits, at exit, until what is queued was written: at most
/// [`EXIT_FLUSH`], and not at all once a write has been blocked for
/// [`writer::STUCK_AFTER`] (a reader that is stuck would hold PID 1).
pub fn finish() {
    let Some(shared) = SHARED.get() else {
        return;
    };
    let until = Instant::now() + EXIT_FLUSH;
    for w in &shared.writers {
        w.flush(until);
    }
}

/// The line that says how many lines were dropped; from the writer
/// thread, once a write went through again.
fn report_dropped(key: usize, n: u64) {
    let Some(shared) = SHARED.get() else {
        return;
    };
    let stream = Stream::BOTH[key % 2];
    let name = &shared.names[key / 2];
    let stream = stream.as_str();
    if key / 2 == 0 {
        tracing::warn!(
            service = "tend",
            stream,
            dropped = n,
            "dropped {n} of tend's own log lines: tend's {stream} was not being read"
        );
    } else {
        tracing::warn!(
            service = name.as_str(),
            stream,
            dropped = n,
            "dropped {n} lines that {name} wrote to {stream}: tend's {stream} was not being read"
        );
    }
}
