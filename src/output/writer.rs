//! The bounded writer: one thread per destination that writes what the
//! loop (and any thread that logs) queued for tend's stdout and stderr.
//!
//! The queue is a byte buffer of whole lines, each run of bytes tagged with
//! who wrote it (a key: a service's stdout or stderr, or tend's own log) and
//! the stream it goes to. Each key may hold at most [`BOUND`] bytes: a line
//! that would take it past that is dropped whole and counted, so one source
//! can never fill the queue for the others. The thread copies at most
//! [`CHUNK`] bytes out under the lock and writes them with the lock
//! released: the one call that may block (a reader that stopped reading)
//! blocks this thread only, never the loop nor a thread that logs.
//!
//! When tend's stdout and stderr are one file (a terminal, `2>&1`), one
//! thread writes both, so that lines of the two never interleave; else
//! each has its own, so that a stuck stdout does not hold up the log.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::eventfd::EventFd;

use super::Stream;

/// Bytes each key may hold in the queue; a line past it is dropped.
pub const BOUND: usize = 128 * 1024;
/// A pipe is not read while its service holds this much in the queue and
/// the writer is not stuck: the service then waits in its own write, as it
/// would on a pipe of its own, instead of losing lines to a slow reader.
pub const SOFT_BOUND: usize = BOUND / 2;
/// The most one write(2) takes.
pub const CHUNK: usize = 64 * 1024;
/// A write blocked this long means the reader is stuck: the services'
/// pipes are read again and what does not fit is dropped.
pub const STUCK_AFTER: Duration = Duration::from_secs(1);
/// Writes of at most this size are atomic on a pipe (PIPE_BUF).
const PIPE_BUF: usize = 4096;

/// A run of queued bytes from one key, for one stream.
#[derive(Debug, Clone, Copy)]
struct Span {
    key: usize,
    stream: Stream,
    len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thread {
    NotStarted,
    Running,
}

struct Queue {
    bytes: Vec<u8>,
    /// Bytes before this were taken.
    head: usize,
    spans: VecDeque<Span>,
    /// Bytes queued, by key.
    held: Vec<usize>,
    /// Lines dropped, by key: in all, and since the last notice.
    dropped: Vec<u64>,
    unreported: Vec<u64>,
    /// A write has been under way since then.
    writing_since: Option<Instant>,
    thread: Thread,
    /// The thread waits for bytes.
    idle: bool,
    /// The loop waits for room: the next take writes `room`.
    room_wanted: bool,
    room: Option<Arc<EventFd>>,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.head == self.bytes.len()
    }

    /// Drops what was taken, before appending.
    fn compact(&mut self) {
        if self.is_empty() {
            self.bytes.clear();
            self.head = 0;
            // A burst is over: give its memory back.
            if self.bytes.capacity() > 2 * CHUNK {
                self.bytes.shrink_to(CHUNK);
            }
        } else if self.head >= CHUNK {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
    }

    /// Bytes were taken: wakes the loop if it waits for room.
    fn room_made(&mut self) {
        if std::mem::take(&mut self.room_wanted)
            && let Some(room) = &self.room
        {
            // Cannot block: a counter far from overflowing.
            let _ = room.write(1);
        }
    }

    /// Copies the next write into `chunk`: bytes for one stream, at most
    /// [`CHUNK`], and with `atomic` at most [`PIPE_BUF`] ending at a line
    /// end (unless one line is longer). `taken` gets the keys and lengths.
    fn take(
        &mut self,
        chunk: &mut Vec<u8>,
        taken: &mut Vec<(usize, usize)>,
        atomic: bool,
    ) -> Stream {
        let stream = self.spans[0].stream;
        let mut n = 0;
        for s in self.spans.iter().take_while(|s| s.stream == stream) {
            n += s.len;
            if n >= CHUNK {
                break;
            }
        }
        n = n.min(CHUNK);
        let bytes = &self.bytes[self.head..self.head + n];
        if atomic && n > PIPE_BUF {
            n = memchr::memrchr(b'\n', &bytes[..PIPE_BUF])
                .or_else(|| memchr::memchr(b'\n', bytes))
                .map_or(n, |at| at + 1);
        }
        chunk.clear();
        chunk.extend_from_slice(&self.bytes[self.head..self.head + n]);
        self.head += n;
        taken.clear();
        let mut left = n;
        while left > 0 {
            let span = &mut self.spans[0];
            let k = span.len.min(left);
            span.len -= k;
            left -= k;
            self.held[span.key] -= k;
            match taken.last_mut() {
                Some((key, len)) if *key == span.key => *len += k,
                _ => taken.push((span.key, k)),
            }
            if span.len == 0 {
                self.spans.pop_front();
            }
        }
        stream
    }
}

/// Appends lines of one key to the queue, under its lock.
pub struct Sink<'a> {
    q: &'a mut Queue,
    key: usize,
    added: usize,
    dropped: u64,
}

impl Sink<'_> {
    /// Whether the key holds less than [`SOFT_BOUND`].
    pub fn room(&self) -> bool {
        self.q.held[self.key] + self.added < SOFT_BOUND
    }

    /// Wakes the loop (the room eventfd) when the writer next takes bytes.
    pub fn want_room(&mut self) {
        self.q.room_wanted = true;
    }

    /// Appends the line that `write` appends (newline included), or drops
    /// it whole, and counts it, when the key would hold more than [`BOUND`].
    pub fn line(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        let kept = self.try_line(write);
        if !kept {
            self.dropped += 1;
        }
        kept
    }

    /// [`Sink::line`], but a line that does not fit is left out without
    /// being counted: the caller keeps it for later.
    pub fn try_line(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        let before = self.q.bytes.len();
        write(&mut self.q.bytes);
        let n = self.q.bytes.len() - before;
        let held = self.q.held[self.key] + self.added;
        // A key that holds nothing takes one line of any size (a 16 KiB
        // line as JSON escapes can be 96 KiB), so none waits for ever.
        if held > 0 && held + n > BOUND && !NOTICES.get() {
            self.q.bytes.truncate(before);
            return false;
        }
        self.added += n;
        true
    }
}

thread_local! {
    /// Set on the writer threads, whose only lines are the notices of lines
    /// dropped: those are queued past the bound (a few lines), or the
    /// notice of a full queue would be dropped in its turn.
    static NOTICES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One destination: fd 1, fd 2, or both when they are one file.
pub struct Writer {
    queue: Mutex<Queue>,
    /// The thread waits here for bytes.
    more: Condvar,
    /// Signalled after each write, and when the queue is empty.
    progress: Condvar,
    /// Writes end at a line end within PIPE_BUF: services with output =
    /// "inherit" write to the same pipe.
    atomic: bool,
}

impl Writer {
    pub fn new(keys: usize, atomic: bool) -> Writer {
        Writer {
            queue: Mutex::new(Queue {
                bytes: Vec::new(),
                head: 0,
                spans: VecDeque::new(),
                held: vec![0; keys],
                dropped: vec![0; keys],
                unreported: vec![0; keys],
                writing_since: None,
                thread: Thread::NotStarted,
                idle: false,
                room_wanted: false,
                room: None,
            }),
            more: Condvar::new(),
            progress: Condvar::new(),
            atomic,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the queue's lock is free now (a panic may have come while
    /// this thread held it).
    pub fn lockable(&self) -> bool {
        !matches!(
            self.queue.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// The eventfd that [`Sink::want_room`] has written.
    pub fn set_room(&self, room: Arc<EventFd>) {
        self.lock().room = Some(room);
    }

    /// Runs `fill` with a [`Sink`] for `key`'s lines on `stream`, and wakes
    /// (or starts) the thread. Never waits for a write.
    pub fn push<R>(
        &'static self,
        key: usize,
        stream: Stream,
        fill: impl FnOnce(&mut Sink<'_>) -> R,
    ) -> R {
        let mut q = self.lock();
        q.compact();
        let mut sink = Sink {
            q: &mut q,
            key,
            added: 0,
            dropped: 0,
        };
        let result = fill(&mut sink);
        let (added, dropped) = (sink.added, sink.dropped);
        q.dropped[key] += dropped;
        q.unreported[key] += dropped;
        if added == 0 {
            return result;
        }
        q.held[key] += added;
        match q.spans.back_mut() {
            Some(s) if s.key == key && s.stream == stream => s.len += added,
            _ => q.spans.push_back(Span {
                key,
                stream,
                len: added,
            }),
        }
        let start = q.thread == Thread::NotStarted;
        if start {
            q.thread = Thread::Running;
        } else if q.idle {
            self.more.notify_one();
        }
        drop(q);
        if start {
            self.start();
        }
        result
    }

    /// Starts the thread, on the first line: a plain init that logs
    /// nothing has none. When no thread can be made (a pids limit), this
    /// caller writes what is queued itself, as tend did before it had one,
    /// and the next line tries again.
    fn start(&'static self) {
        let spawned = std::thread::Builder::new()
            .name("tend-output".into())
            .stack_size(256 * 1024)
            .spawn(move || self.run());
        if spawned.is_err() {
            let mut q = self.lock();
            q.thread = Thread::NotStarted;
            let (mut chunk, mut taken) = (Vec::new(), Vec::new());
            while !q.is_empty() {
                let stream = q.take(&mut chunk, &mut taken, self.atomic);
                q.room_made();
                drop(q);
                let _ = write_all(stream.fd(), &chunk);
                q = self.lock();
            }
        }
    }

    fn run(&self) {
        NOTICES.set(true);
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut taken = Vec::new();
        loop {
            let stream = {
                let mut q = self.lock();
                while q.is_empty() {
                    q.idle = true;
                    self.progress.notify_all();
                    q = self.more.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
                q.idle = false;
                let stream = q.take(&mut chunk, &mut taken, self.atomic);
                q.writing_since = Some(Instant::now());
                q.room_made();
                stream
            };
            let written = write_all(stream.fd(), &chunk);
            let notices = {
                let mut q = self.lock();
                q.writing_since = None;
                let notices: Vec<(usize, u64)> = if written == chunk.len() {
                    q.unreported
                        .iter_mut()
                        .enumerate()
                        .filter(|(_, n)| **n > 0)
                        .map(|(key, n)| (key, std::mem::take(n)))
                        .collect()
                } else {
                    // What could not be written is lost: counted, and
                    // not reported on a stream that fails.
                    let mut at = 0;
                    for &(key, len) in &taken {
                        let from = at.max(written);
                        let to = at + len;
                        if from < to {
                            q.dropped[key] +=
                                memchr::memchr_iter(b'\n', &chunk[from..to]).count() as u64;
                        }
                        at = to;
                    }
                    Vec::new()
                };
                self.progress.notify_all();
                notices
            };
            for (key, n) in notices {
                super::report_dropped(key, n);
            }
        }
    }

    /// Since when a write has been blocked, if one is under way.
    pub fn writing_since(&self) -> Option<Instant> {
        self.lock().writing_since
    }

    /// Whether a write has been blocked for [`STUCK_AFTER`] at `now`.
    pub fn stuck(&self, now: Instant) -> bool {
        self.writing_since()
            .is_some_and(|t| now.saturating_duration_since(t) >= STUCK_AFTER)
    }

    /// Lines of `key` dropped so far.
    pub fn dropped(&self, key: usize) -> u64 {
        self.lock().dropped.get(key).copied().unwrap_or(0)
    }

    /// Waits until everything queued was written, or a write has been
    /// blocked for [`STUCK_AFTER`], or `until`.
    pub fn flush(&self, until: Instant) {
        let mut q = self.lock();
        loop {
            let now = Instant::now();
            let stuck = q
                .writing_since
                .is_some_and(|t| now.saturating_duration_since(t) >= STUCK_AFTER);
            if (q.is_empty() && q.writing_since.is_none()) || stuck || now >= until {
                return;
            }
            let wait = until
                .saturating_duration_since(now)
                .min(Duration::from_millis(100));
            q = self
                .progress
                .wait_timeout(q, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until the thread took bytes, or `until`, or it is stuck.
    pub fn wait_progress(&self, until: Instant) {
        let q = self.lock();
        let now = Instant::now();
        if now >= until || q.is_empty() {
            return;
        }
        let wait = until
            .saturating_duration_since(now)
            .min(Duration::from_millis(100));
        drop(self.progress.wait_timeout(q, wait));
    }
}

/// Writes all of `bytes` to `fd`, and returns how many were written: all
/// of them unless the write failed (the reader is gone, the disk is full).
/// A descriptor someone else made non-blocking is waited for with poll.
fn write_all(fd: RawFd, bytes: &[u8]) -> usize {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: the pointer and length are those of a live slice.
        let n = unsafe { libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
        if n >= 0 {
            done += n as usize;
            continue;
        }
        match Errno::last() {
            Errno::EINTR => {}
            Errno::EAGAIN => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one pollfd, alive for the call.
                unsafe { libc::poll(&mut p, 1, -1) };
            }
            _ => return done,
        }
    }
    done
}

impl Stream {
    fn fd(self) -> RawFd {
        match self {
            Stream::Stdout => libc::STDOUT_FILENO,
            Stream::Stderr => libc::STDERR_FILENO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(keys: usize) -> Queue {
        Writer::new(keys, false).queue.into_inner().unwrap()
    }

    fn add(q: &mut Queue, key: usize, stream: Stream, line: &[u8]) -> bool {
        let mut sink = Sink {
            q,
            key,
            added: 0,
            dropped: 0,
        };
        let kept = sink.line(|b| b.extend_from_slice(line));
        let (added, dropped) = (sink.added, sink.dropped);
        q.dropped[key] += dropped;
        q.held[key] += added;
        if added > 0 {
            q.spans.push_back(Span {
                key,
                stream,
                len: added,
            });
        }
        kept
    }

    #[test]
    fn a_key_past_its_bound_drops_whole_lines_and_the_others_still_fit() {
        let mut q = queue(3);
        let line = vec![b'x'; 1000];
        let mut kept = 0;
        while add(&mut q, 0, Stream::Stdout, &line) {
            kept += 1;
        }
        assert_eq!(kept, BOUND / 1000);
        assert_eq!(q.dropped[0], 1);
        assert_eq!(q.bytes.len(), kept * 1000, "nothing of the dropped line");
        assert!(add(&mut q, 1, Stream::Stdout, b"other\n"));
        assert_eq!(q.dropped[1], 0);
        // Empty, a key takes a line longer than the bound.
        assert!(add(&mut q, 2, Stream::Stderr, &vec![b'y'; BOUND + 1]));
        assert!(!add(&mut q, 2, Stream::Stderr, b"then no more\n"));
    }

    #[test]
    fn a_write_takes_one_stream_and_atomic_writes_end_at_a_line_end() {
        let mut q = queue(2);
        let mut line = vec![b'a'; 99];
        line.push(b'\n');
        for _ in 0..100 {
            add(&mut q, 0, Stream::Stdout, &line);
        }
        add(&mut q, 1, Stream::Stderr, b"log\n");
        let (mut chunk, mut taken) = (Vec::new(), Vec::new());
        assert_eq!(q.take(&mut chunk, &mut taken, true), Stream::Stdout);
        assert_eq!(chunk.len(), 4000, "40 lines of 100 bytes fit in 4096");
        assert_eq!(taken, [(0, 4000)]);
        assert_eq!(q.take(&mut chunk, &mut taken, false), Stream::Stdout);
        assert_eq!(chunk.len(), 6000);
        assert_eq!(q.held[0], 0);
        assert_eq!(q.take(&mut chunk, &mut taken, false), Stream::Stderr);
        assert_eq!(chunk, b"log\n");
        assert!(q.is_empty());
    }
}
