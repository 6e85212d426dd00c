//! The pipes of the services with `output = "prefix"`, read on the loop:
//! created once, handed to every instance, read without blocking and
//! framed into lines for the writer.

use std::fmt::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::PollFlags;
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::lines::{self, Format};
use super::writer::{CHUNK, STUCK_AFTER, Writer};
use super::{Source, Stream};
use crate::core::status::Status;

/// A partial line (no newline yet) goes out after this much quiet: a
/// prompt, or progress dots.
pub const QUIET: Duration = Duration::from_millis(250);
/// At exit, the longest tend waits for room for the services' last lines
/// while the reader keeps taking them.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// At exit, the most read from one pipe (a daemon that outlived its
/// service may write without end).
const EXIT_READ: usize = 1 << 20;
/// The status shows new drop counts at most this often: a flood with a
/// stuck reader would otherwise rewrite the status file on every wake-up.
const STATUS_REFRESH: Duration = Duration::from_secs(1);

/// One stream of one service.
struct Pipe {
    service: usize,
    stream: Stream,
    name: String,
    writer: &'static Writer,
    read: OwnedFd,
    /// What each instance gets as fd 1 or 2.
    write: OwnedFd,
    /// Read and not yet queued: a partial line, or lines that wait for
    /// room in the queue.
    pending: Vec<u8>,
    last_read: Instant,
    /// The last read found the pipe empty.
    dry: bool,
    /// Whole lines wait in `pending` for room in the queue.
    blocked: bool,
    /// An instance exited: its partial last line goes out once the pipe
    /// is read dry.
    flush_when_dry: bool,
    /// read() failed: the pipe is not read any more.
    broken: bool,
    /// A partial line went out without its newline: a newline that comes
    /// next ends it, and is not a line of its own.
    continued: bool,
}

impl Pipe {
    /// Reads at most one [`CHUNK`] (`limit` at most) into `buf` without
    /// waiting, and queues the lines that are complete; what is left
    /// (a partial line, or lines without room yet) stays in `pending`.
    /// Returns how many bytes came.
    fn feed(
        &mut self,
        buf: &mut Vec<u8>,
        format: Format,
        stuck: bool,
        now: Instant,
        limit: usize,
    ) -> usize {
        let n = self.read(buf, now, limit);
        if n > 0 && self.pending.is_empty() {
            let used = self.frame_slice(buf, format, stuck, false);
            self.pending.extend_from_slice(&buf[used..]);
        } else if n > 0 {
            self.pending.extend_from_slice(buf);
            self.frame(format, stuck, false);
        }
        n
    }

    /// Reads into `buf` (cleared first).
    fn read(&mut self, buf: &mut Vec<u8>, now: Instant, limit: usize) -> usize {
        buf.clear();
        if self.broken {
            return 0;
        }
        let want = CHUNK.min(limit);
        buf.reserve(want);
        // SAFETY: read writes at most `want` bytes into the spare capacity
        // reserved above; only what it wrote is then made part of the Vec.
        let n = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), want) };
        if n < 0 {
            match Errno::last() {
                Errno::EAGAIN => self.dry = true,
                Errno::EINTR => {}
                e => {
                    self.broken = true;
                    self.dry = true;
                    tracing::error!(
                        service = self.name.as_str(),
                        "read() on the service's {} pipe failed: {e}; its output is lost from \
                         now on",
                        self.stream.as_str()
                    );
                }
            }
            return 0;
        }
        let n = n as usize;
        // SAFETY: read initialised these n bytes.
        unsafe { buf.set_len(n) };
        self.dry = n < want;
        if n > 0 {
            self.last_read = now;
        }
        n
    }

    /// Queues what `pending` holds: see [`Pipe::frame_slice`].
    fn frame(&mut self, format: Format, stuck: bool, flush: bool) {
        let mut pending = std::mem::take(&mut self.pending);
        let used = self.frame_slice(&pending, format, stuck, flush);
        pending.drain(..used);
        // Lines held back under a flood: give the memory back after.
        if pending.is_empty() && pending.capacity() > 2 * lines::MAX_LINE {
            pending = Vec::new();
        }
        self.pending = pending;
    }

    /// Queues the complete lines at the start of `bytes` (with `flush`, the
    /// partial one too), and returns how many bytes that took. Unless
    /// `stuck`, stops at the soft bound and waits for room; stuck, what
    /// does not fit is dropped.
    fn frame_slice(&mut self, bytes: &[u8], format: Format, stuck: bool, flush: bool) -> usize {
        let key = Source::Service(self.service).key(self.stream);
        let (name, stream) = (self.name.as_str(), self.stream);
        let mut start = 0;
        if self.continued && bytes.first() == Some(&b'\n') {
            start = 1;
        }
        if bytes.len() > start {
            self.continued = false;
        }
        let continued = &mut self.continued;
        let blocked = self.writer.push(key, stream, |sink| {
            loop {
                let rest = &bytes[start..];
                let Some((len, used)) = lines::next_line(rest, flush) else {
                    return false;
                };
                let write =
                    |out: &mut Vec<u8>| lines::write(out, format, name, stream, &rest[..len]);
                if stuck {
                    sink.line(write);
                } else if !sink.room() || !sink.try_line(write) {
                    sink.want_room();
                    return true;
                }
                start += used;
                if start == bytes.len() && used == len && flush {
                    *continued = true;
                }
            }
        });
        self.blocked = blocked;
        start
    }

    /// A partial line waits (every complete one is queued).
    fn partial(&self) -> bool {
        !self.blocked && !self.pending.is_empty()
    }
}

/// Every prefixed service's pipes, and what the status and /metrics say
/// of their dropped lines.
pub struct ServiceOutput {
    pipes: Vec<Pipe>,
    /// By service: whether its output goes through tend.
    prefixed: Vec<bool>,
    format: Format,
    /// Written by the writer when it takes bytes after a pipe found no
    /// room; polled after the pipes.
    room: Option<Arc<EventFd>>,
    /// Readiness of the last `ppoll`, in [`ServiceOutput::poll_fds`] order.
    ready: Vec<bool>,
    /// What each read goes into: one buffer for every pipe.
    buf: Vec<u8>,
    /// Drop counts by service, as the status last showed them, and when.
    shown: Vec<u64>,
    shown_at: Option<Instant>,
    refresh_at: Option<Instant>,
}

impl ServiceOutput {
    /// Pipes for each service whose `prefixed` is true. `names` by
    /// service. [`super::arm`] must have been called.
    pub fn new(
        names: &[String],
        prefixed: &[bool],
        format: Format,
    ) -> anyhow::Result<ServiceOutput> {
        let mut pipes = Vec::new();
        for (i, name) in names.iter().enumerate().filter(|(i, _)| prefixed[*i]) {
            for stream in Stream::BOTH {
                let writer = super::writer(stream)
                    .ok_or_else(|| anyhow::anyhow!("the output writer is not set up"))?;
                let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| {
                    anyhow::anyhow!(
                        "pipe2() for the {} of service {name:?} failed: {e} (output = \"prefix\"); \
                         raise the open file limit, or use output = \"inherit\"",
                        stream.as_str()
                    )
                })?;
                // Only tend's end: the service's stays blocking, as a
                // program expects its stdout to be.
                fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| {
                    anyhow::anyhow!("fcntl(O_NONBLOCK) on the {name:?} output pipe failed: {e}")
                })?;
                pipes.push(Pipe {
                    service: i,
                    stream,
                    name: name.clone(),
                    writer,
                    read,
                    write,
                    pending: Vec::new(),
                    last_read: Instant::now(),
                    dry: true,
                    blocked: false,
                    flush_when_dry: false,
                    broken: false,
                    continued: false,
                });
            }
        }
        let room = if pipes.is_empty() {
            None
        } else {
            let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(|e| anyhow::anyhow!("eventfd() for the output writer failed: {e}"))?;
            let fd = Arc::new(fd);
            for stream in Stream::BOTH {
                if let Some(w) = super::writer(stream) {
                    w.set_room(fd.clone());
                }
            }
            Some(fd)
        };
        Ok(ServiceOutput {
            ready: Vec::new(),
            buf: Vec::new(),
            shown: vec![0; names.len()],
            prefixed: prefixed.to_vec(),
            pipes,
            format,
            room,
            shown_at: None,
            refresh_at: None,
        })
    }

    /// No service's output goes through tend.
    pub fn is_empty(&self) -> bool {
        self.pipes.is_empty()
    }

    /// Service `i`'s stdout and stderr for a new instance, when its output
    /// goes through tend.
    pub fn stdio(&self, service: usize) -> std::io::Result<Option<(OwnedFd, OwnedFd)>> {
        let mut ends = self
            .pipes
            .iter()
            .filter(|p| p.service == service)
            .map(|p| p.write.try_clone());
        match (ends.next(), ends.next()) {
            (Some(out), Some(err)) => Ok(Some((out?, err?))),
            _ => Ok(None),
        }
    }

    /// What to poll: each pipe (for reading while it has room), then the
    /// room eventfd.
    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = self
            .pipes
            .iter()
            .map(|p| {
                let wanted = !p.blocked && !p.broken;
                let flags = if wanted {
                    PollFlags::POLLIN
                } else {
                    PollFlags::empty()
                };
                (p.read.as_fd(), flags)
            })
            .collect();
        fds.extend(self.room.as_ref().map(|r| (r.as_fd(), PollFlags::POLLIN)));
        fds
    }

    /// Which of [`ServiceOutput::poll_fds`] ppoll found ready.
    pub fn set_ready(&mut self, ready: &[bool]) {
        self.ready.clear();
        self.ready.extend_from_slice(ready);
    }

    /// Reads what ppoll found ready (one chunk per pipe), queues lines
    /// where there is room, and flushes partial lines that are due.
    pub fn pump(&mut self, now: Instant) {
        let ready = std::mem::take(&mut self.ready);
        if let Some(room) = &self.room
            && ready.get(self.pipes.len()) == Some(&true)
        {
            // Non-blocking: EAGAIN when another wake-up took it.
            let _ = room.read();
        }
        let stuck = Stream::BOTH.map(|s| super::writer(s).is_some_and(|w| w.stuck(now)));
        for (i, p) in self.pipes.iter_mut().enumerate() {
            let stuck = stuck[p.stream as usize];
            if p.blocked {
                p.frame(self.format, stuck, false);
            }
            if !p.blocked && ready.get(i) == Some(&true) {
                p.feed(&mut self.buf, self.format, stuck, now, CHUNK);
            }
            let quiet = now.saturating_duration_since(p.last_read) >= QUIET;
            if p.partial() && (quiet || (p.flush_when_dry && p.dry)) {
                p.frame(self.format, stuck, true);
            }
            if p.dry && !p.partial() {
                p.flush_when_dry = false;
            }
        }
        self.ready = ready;
    }

    /// An instance of service `i` exited: what it wrote last is read now,
    /// and its partial last line goes out once its pipes are dry.
    pub fn exited(&mut self, service: usize, now: Instant) {
        let stuck = Stream::BOTH.map(|s| super::writer(s).is_some_and(|w| w.stuck(now)));
        for p in self.pipes.iter_mut().filter(|p| p.service == service) {
            p.flush_when_dry = true;
            if p.blocked {
                continue;
            }
            let stuck = stuck[p.stream as usize];
            p.feed(&mut self.buf, self.format, stuck, now, CHUNK);
            if p.dry && p.partial() {
                p.frame(self.format, stuck, true);
            }
        }
    }

    /// At exit: everything left in the pipes, waiting for room while the
    /// writer takes bytes, for at most [`EXIT_DRAIN`].
    pub fn drain_all(&mut self) {
        let until = Instant::now() + EXIT_DRAIN;
        for p in &mut self.pipes {
            let mut read = 0;
            loop {
                let now = Instant::now();
                let stuck = p.writer.stuck(now);
                if p.blocked {
                    p.frame(self.format, stuck, false);
                    if p.blocked {
                        if now >= until {
                            break;
                        }
                        p.writer.wait_progress(until);
                        continue;
                    }
                }
                if read >= EXIT_READ || now >= until {
                    break;
                }
                read += p.feed(&mut self.buf, self.format, stuck, now, EXIT_READ - read);
                if p.dry && !p.blocked {
                    p.frame(self.format, stuck, true);
                    break;
                }
            }
        }
    }

    /// When the loop must look again: a partial line's quiet time, a
    /// blocked pipe's writer turning stuck, new counts for the status.
    pub fn deadline(&self) -> Option<Instant> {
        self.pipes
            .iter()
            .filter_map(|p| {
                if p.blocked {
                    p.writer.writing_since().map(|t| t + STUCK_AFTER)
                } else if p.partial() {
                    Some(p.last_read + QUIET)
                } else {
                    None
                }
            })
            .chain(self.refresh_at)
            .min()
    }

    /// Lines of service `i` dropped, both streams.
    fn dropped(&self, service: usize) -> u64 {
        if !self.prefixed.get(service).copied().unwrap_or(false) {
            return 0;
        }
        Stream::BOTH
            .iter()
            .map(|&s| super::dropped(Source::Service(service), s))
            .sum()
    }

    /// Every count, for telling whether /metrics changed.
    pub fn generation(&self) -> u64 {
        let services: u64 = (0..self.prefixed.len()).map(|i| self.dropped(i)).sum();
        services + super::dropped(Source::Tend, Stream::Stderr)
    }

    /// Puts each service's `dropped_lines` into `status`: new counts at
    /// most once per [`STATUS_REFRESH`].
    pub fn fill_status(&mut self, status: &mut Status, now: Instant) {
        let current: Vec<u64> = (0..self.shown.len()).map(|i| self.dropped(i)).collect();
        self.refresh_at = None;
        if current != self.shown {
            match self.shown_at {
                Some(at) if now < at + STATUS_REFRESH => {
                    self.refresh_at = Some(at + STATUS_REFRESH)
                }
                _ => {
                    self.shown = current;
                    self.shown_at = Some(now);
                }
            }
        }
        for (entry, n) in status.services.iter_mut().zip(&self.shown) {
            entry.dropped_lines = *n;
        }
    }

    /// `tend_output_dropped_lines_total`: tend's own log, and each
    /// prefixed service's two streams.
    pub fn render_metrics(&self, names: &[String], out: &mut String) {
        let m = "tend_output_dropped_lines_total";
        crate::core::metrics::family(
            out,
            m,
            "counter",
            "Whole lines dropped because tend's stdout or stderr was not read, by service \
             (tend: its own log) and stream.",
        );
        let tend = super::dropped(Source::Tend, Stream::Stderr);
        writeln!(out, "{m}{{service=\"tend\",stream=\"stderr\"}} {tend}").unwrap();
        for (i, name) in names.iter().enumerate() {
            if !self.prefixed.get(i).copied().unwrap_or(false) {
                continue;
            }
            let service = crate::core::metrics::label(name);
            for stream in Stream::BOTH {
                let n = super::dropped(Source::Service(i), stream);
                let stream = stream.as_str();
                writeln!(out, "{m}{{service=\"{service}\",stream=\"{stream}\"}} {n}").unwrap();
            }
        }
    }
}
