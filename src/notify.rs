//! The service's notify socket (`NOTIFY_SOCKET`, systemd's sd_notify
//! protocol): where it says `READY=1`, `RELOADING=1`, `STOPPING=1`,
//! `STATUS=...`.
//!
//! A datagram socket that any user may send to, with `SO_PASSCRED` on, so
//! the kernel attaches each sender's pid: the core decides whether that pid
//! belongs to the service (see [`ancestry`]). What the messages mean is the
//! core's business; this module only receives them, without ever blocking.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, UnixAddr, bind, setsockopt, socket, sockopt,
};
use nix::unistd::Pid;

use crate::ratelimit::RateLimit;

/// The most of one message that is kept; sd_notify messages are a few lines.
pub const MAX_MESSAGE: usize = 4096;

/// At most this many datagrams are taken per [`NotifySocket::recv`], and
/// per [`FLOOD_WINDOW`], so a process that floods the socket can neither
/// hold up the event loop nor take all of PID 1's CPU: the rest wait in the
/// kernel, which queues only a few datagrams (`net.unix.max_dgram_qlen`)
/// and makes their senders wait for room. A sender of the service's still
/// gets its turn as room is made.
const MAX_PER_RECV: usize = 256;

/// See [`MAX_PER_RECV`]: 12,800 datagrams a second at most, far above what
/// any service says, and a few percent of a core.
pub const FLOOD_WINDOW: Duration = Duration::from_millis(20);

/// A notification whose control data the kernel cut, or a failed
/// recvmsg(), is said at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// How far [`ancestry`] walks up.
const MAX_ANCESTRY: usize = 64;

pub struct NotifySocket {
    fd: OwnedFd,
    dir: PathBuf,
    path: PathBuf,
    /// Notifications whose control data the kernel cut (MSG_CTRUNC).
    cut_warnings: Cell<RateLimit>,
    /// Failed recvmsg() calls.
    error_warnings: Cell<RateLimit>,
    /// The current [`FLOOD_WINDOW`]: when it began, and the datagrams taken
    /// in it.
    window: Cell<Option<(Instant, usize)>>,
    /// Not read before then: the window's quota is spent, or recvmsg()
    /// failed.
    paused_until: Cell<Option<Instant>>,
}

impl NotifySocket {
    /// Binds a new socket at `$TMPDIR/tend-notify-XXXXXX/notify` (or under
    /// /tmp). Any user may send to it (mode 0666), so that a service that
    /// drops its privileges before READY=1 (gosu, su-exec, setpriv) still
    /// can; the sender's place in the process tree is what counts. Its
    /// directory is 0711: entered by all, listed and written by tend's
    /// user alone, so no one else can put anything in the socket's place.
    pub fn new() -> io::Result<NotifySocket> {
        let base = std::env::var_os("TMPDIR")
            .filter(|d| Path::new(d).is_absolute())
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        remove_stale(&base);
        let template = base.join("tend-notify-XXXXXX");
        // mkdtemp creates the directory with mode 0700 (opened once bound).
        let dir = nix::unistd::mkdtemp(&template).map_err(|e| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "mkdtemp({}) for the notify socket: {}",
                    template.display(),
                    e.desc()
                ),
            )
        })?;
        let path = dir.join("notify");
        match Self::bind(&path).and_then(|fd| open_to_all(&path, &dir).map(|()| fd)) {
            Ok(fd) => Ok(NotifySocket {
                fd,
                dir,
                path,
                cut_warnings: Cell::new(RateLimit::new(WARN_EVERY)),
                error_warnings: Cell::new(RateLimit::new(WARN_EVERY)),
                window: Cell::new(None),
                paused_until: Cell::new(None),
            }),
            Err(e) => {
                remove_dir(&dir);
                Err(e)
            }
        }
    }

    fn bind(path: &Path) -> io::Result<OwnedFd> {
        let fail = |call: &str, e: Errno| {
            io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "{call} for the notify socket {}: {}",
                    path.display(),
                    e.desc()
                ),
            )
        };
        let fd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| fail("socket()", e))?;
        // Before bind, so that no datagram arrives without its sender.
        setsockopt(&fd, sockopt::PassCred, &true)
            .map_err(|e| fail("setsockopt(SO_PASSCRED)", e))?;
        let addr =
            UnixAddr::new(path.as_os_str().as_bytes()).map_err(|e| fail("sockaddr_un", e))?;
        bind(fd.as_raw_fd(), &addr).map_err(|e| fail("bind()", e))?;
        Ok(fd)
    }

    /// The value of `NOTIFY_SOCKET`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Readable when datagrams are queued.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The fd to poll now; none while a flood's quota is spent (see
    /// [`MAX_PER_RECV`]).
    pub fn poll_fd(&self, now: Instant) -> Option<BorrowedFd<'_>> {
        let paused = self.paused_until.get().is_some_and(|until| now < until);
        (!paused).then(|| self.fd.as_fd())
    }

    /// The datagrams queued now, each with its sender's pid, oldest first,
    /// at most [`MAX_PER_RECV`] per call and per [`FLOOD_WINDOW`] (once they
    /// are spent, or recvmsg() failed, [`poll_fd`](Self::poll_fd) is none
    /// for a while). Never blocks. A message longer than [`MAX_MESSAGE`] is
    /// cut there; one without a sender pid (from outside tend's pid
    /// namespace) is dropped. Every fd passed along (`FDSTORE=1`) is closed,
    /// whatever the rest of the message is.
    pub fn recv(&self) -> Vec<(Pid, Vec<u8>)> {
        let mut messages = Vec::new();
        let mut buf = [0u8; MAX_MESSAGE];
        let mut control = Control::new();
        let now = Instant::now();
        let (start, mut taken) = match self.window.get() {
            Some((start, taken)) if now < start + FLOOD_WINDOW => (start, taken),
            _ => (now, 0),
        };
        loop {
            if taken == MAX_PER_RECV {
                self.paused_until.set(Some(start + FLOOD_WINDOW));
                break;
            }
            let received = match receive(self.fd.as_fd(), &mut buf, &mut control) {
                Ok(Some(r)) => {
                    taken += 1;
                    r
                }
                Ok(None) => break,
                Err(e) => {
                    // Left alone for a window, so that an error that lasts
                    // (ENOMEM) cannot spin the loop on a readable socket.
                    self.paused_until.set(Some(now + FLOOD_WINDOW));
                    if let Some(held) = allow(&self.error_warnings, now) {
                        tracing::warn!(
                            "recvmsg() on the notify socket {} failed: {e}; tried again in {:?}{}",
                            self.path.display(),
                            FLOOD_WINDOW,
                            crate::ratelimit::held_back(held, WARN_EVERY)
                        );
                    }
                    break;
                }
            };
            if received.fds > 0 {
                tracing::debug!(
                    "closed {} file descriptor(s) sent with a notification: tend keeps none",
                    received.fds
                );
            }
            if received.truncated {
                self.cut(received.fds, now);
            }
            match received.sender {
                Some(pid) => messages.push((pid, buf[..received.len.min(MAX_MESSAGE)].to_vec())),
                None => tracing::debug!("a notify message without a sender pid is dropped"),
            }
        }
        self.window.set(Some((start, taken)));
        messages
    }

    /// The kernel cut a message's control data (MSG_CTRUNC): the fds that did
    /// not fit never reached tend (the kernel released them), and the ones
    /// that did were closed. Said at most once per [`WARN_EVERY`].
    fn cut(&self, fds: usize, now: Instant) {
        if let Some(held) = allow(&self.cut_warnings, now) {
            tracing::warn!(
                "a notification on {} came with more than tend could receive (MSG_CTRUNC): {fds} \
                 file descriptor(s) were received and closed, the kernel dropped the rest (is tend \
                 out of file descriptors?){}",
                self.path.display(),
                crate::ratelimit::held_back(held, WARN_EVERY)
            );
        }
    }

    /// When a flood's pause ends, or a count of cut notifications is due
    /// in the log, if either is.
    pub fn deadline(&self) -> Option<Instant> {
        [self.paused_until.get(), self.cut_warnings.get().due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Time passed: ends a flood's pause that is over, and reports the cut
    /// notifications not said yet once it is time. Called at every wake-up,
    /// so [`deadline`](Self::deadline) never holds a time gone by.
    pub fn tick(&self, now: Instant) {
        if self.paused_until.get().is_some_and(|until| now >= until) {
            self.paused_until.set(None);
        }
        let mut limit = self.cut_warnings.get();
        let held = limit.flush(now);
        self.cut_warnings.set(limit);
        if let Some(held) = held {
            tracing::warn!(
                "{held} more notification(s) on {} came with more than tend could receive \
                 (MSG_CTRUNC); their file descriptors were closed or dropped",
                self.path.display()
            );
        }
    }
}

/// [`RateLimit::allow`] on a limit kept in a `Cell`.
fn allow(limit: &Cell<RateLimit>, now: Instant) -> Option<u64> {
    let mut l = limit.get();
    let held = l.allow(now);
    limit.set(l);
    held
}

/// What came with one datagram.
#[derive(Debug, Default, PartialEq, Eq)]
struct Received {
    /// The bytes of the datagram that fit in the buffer.
    len: usize,
    sender: Option<Pid>,
    /// File descriptors received, all closed by now.
    fds: usize,
    /// The kernel cut the control data (MSG_CTRUNC).
    truncated: bool,
}

/// Room for all the control data one datagram can bring: the sender's
/// credentials, and as many fds as one message can carry (the kernel's
/// SCM_MAX_FD). A buffer any smaller leaves the fds that do not fit to the
/// kernel and sets MSG_CTRUNC (scm_detach_fds).
const CONTROL_SPACE: usize =
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    unsafe {
        libc::CMSG_SPACE(size_of::<libc::ucred>() as u32)
            + libc::CMSG_SPACE((SCM_MAX_FD * size_of::<RawFd>()) as u32)
    } as usize;

/// The most fds one message can carry (include/net/scm.h).
const SCM_MAX_FD: usize = 253;

/// A control buffer aligned for `cmsghdr`.
#[repr(C, align(8))]
struct Control([u8; CONTROL_SPACE]);

impl Control {
    fn new() -> Control {
        Control([0; CONTROL_SPACE])
    }
}

/// Takes one datagram into `buf` (`Ok(None)`: none is queued), closing
/// every fd that came with it.
fn receive(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    control: &mut Control,
) -> Result<Option<Received>, Errno> {
    receive_into(fd, buf, &mut control.0)
}

/// [`receive`] with a control buffer of any size (a smaller one, in the tests,
/// to see what the kernel does with what does not fit). `control` must be
/// aligned for `cmsghdr`.
fn receive_into(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    control: &mut [u8],
) -> Result<Option<Received>, Errno> {
    debug_assert_eq!(
        control.as_ptr().align_offset(align_of::<libc::cmsghdr>()),
        0
    );
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all zeroes is an empty header.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = control.len() as _;
    let n = loop {
        // SAFETY: the header points at `iov`, `buf` and `control`, which
        // live through the call, with their lengths.
        let n = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut header,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        match n {
            -1 if Errno::last() == Errno::EINTR => continue,
            -1 if Errno::last() == Errno::EAGAIN => return Ok(None),
            -1 => return Err(Errno::last()),
            n => break n as usize,
        }
    };
    // SAFETY: the kernel filled `header`'s control data, msg_controllen
    // bytes of `control`, and installed the fds it names in this process.
    let (sender, fds) = unsafe { take_control(&header) };
    Ok(Some(Received {
        len: n,
        sender,
        fds,
        truncated: header.msg_flags & libc::MSG_CTRUNC != 0,
    }))
}

/// Walks the control data that `header` describes with the CMSG_* macros
/// (nix refuses it all when MSG_CTRUNC is set): returns the sender's pid,
/// and closes every fd of every SCM_RIGHTS message, a cut one included,
/// returning how many.
///
/// # Safety
/// `header.msg_control` points at `header.msg_controllen` readable bytes,
/// aligned for `cmsghdr`, and the fds in its SCM_RIGHTS messages belong to
/// this process and to no one else.
unsafe fn take_control(header: &libc::msghdr) -> (Option<Pid>, usize) {
    let start = header.msg_control as usize;
    #[allow(clippy::unnecessary_cast)] // a u32 with musl
    let end = start + header.msg_controllen as usize;
    let (mut sender, mut closed) = (None, 0);
    // SAFETY: the CMSG_* macros stay within msg_controllen; each message's
    // data is read only as far as both its cmsg_len and the buffer go.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(header);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let claimed = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            let len = claimed.min(end.saturating_sub(data as usize));
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for i in 0..len / size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        if fd >= 0 {
                            drop(OwnedFd::from_raw_fd(fd));
                            closed += 1;
                        }
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) if len >= size_of::<libc::ucred>() => {
                    let cred = std::ptr::read_unaligned(data.cast::<libc::ucred>());
                    if cred.pid > 0 {
                        sender = Some(Pid::from_raw(cred.pid));
                    }
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(header, c);
        }
    }
    (sender, closed)
}

/// Lets every user send to the socket at `path` and enter `dir`, its
/// directory (not list it); warns, when tend is root, if a directory
/// above keeps other users out anyway.
fn open_to_all(path: &Path, dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "chmod({}, {mode:o}) for the notify socket: {e}",
                    p.display()
                ),
            )
        })
    };
    // The socket first: until the directory opens, no one else reaches it.
    chmod(path, 0o666)?;
    chmod(dir, 0o711)?;
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if root
        && let Some(closed) = dir
            .ancestors()
            .skip(1)
            .find(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
    {
        tracing::warn!(
            "the notify socket {} is under {}, which other users cannot enter: a service that \
             switches to another user cannot send READY=1 to it (set TMPDIR to a directory \
             every user can enter, such as /tmp)",
            path.display(),
            closed.display()
        );
    }
    Ok(())
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(
                "cannot remove the notify socket {}: {e}",
                self.path.display()
            );
        }
        remove_dir(&self.dir);
    }
}

/// A directory of a notify socket is stale once this old with nothing
/// listening in it: the time between mkdtemp and bind is microseconds.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// At most this many entries of the temporary directory are looked at.
const STALE_SCAN_MAX: usize = 10_000;

/// Removes what an earlier tend killed with SIGKILL left in `base`: a
/// `tend-notify-XXXXXX` directory of tend's own user, older than
/// [`STALE_AFTER`], whose socket nobody listens on any more (connect()
/// is refused, or the socket is gone). A live tend's socket accepts the
/// connect and is left alone, as is anything that is not exactly that.
fn remove_stale(base: &Path) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    // SAFETY: geteuid has no failure and no memory effects.
    let me = unsafe { libc::geteuid() };
    let now = std::time::SystemTime::now();
    for entry in entries.take(STALE_SCAN_MAX).flatten() {
        let name = entry.file_name();
        let Some(suffix) = name.to_str().and_then(|n| n.strip_prefix("tend-notify-")) else {
            continue;
        };
        let dir = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if suffix.len() != 6 || !meta.is_dir() || meta.uid() != me || !old {
            continue;
        }
        let socket = dir.join("notify");
        let live = match std::fs::symlink_metadata(&socket) {
            Ok(m) if m.file_type().is_socket() => std::os::unix::net::UnixDatagram::unbound()
                .and_then(|s| s.connect(&socket))
                .map_or_else(|e| e.kind() != io::ErrorKind::ConnectionRefused, |()| true),
            Ok(_) => continue,
            Err(_) => false,
        };
        if live {
            continue;
        }
        let _ = std::fs::remove_file(&socket);
        // Fails, and leaves it, if anything else is in it.
        if std::fs::remove_dir(&dir).is_ok() {
            tracing::debug!(dir = %dir.display(), "removed the notify socket of an earlier tend");
        }
    }
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!("cannot remove {}: {e}", dir.display());
    }
}

/// `pid`, its parent, its grandparent, ... as /proc says now, up to pid 1 or
/// at most 64 deep. Stops early when a process is gone (or /proc cannot be
/// read), so a sender that already exited yields just itself.
pub fn ancestry(pid: Pid) -> Vec<Pid> {
    let mut chain = vec![pid];
    let mut at = pid;
    while chain.len() < MAX_ANCESTRY && at.as_raw() > 1 {
        match parent(at) {
            Some(p) if p.as_raw() > 0 => {
                chain.push(p);
                at = p;
            }
            _ => break,
        }
    }
    chain
}

/// The parent pid from /proc/PID/stat: the field after the state, which
/// follows the last ')' (the command name in parentheses may hold anything).
fn parent(pid: Pid) -> Option<Pid> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_parent(&stat)
}

fn parse_parent(stat: &[u8]) -> Option<Pid> {
    let after = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[after + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok().map(Pid::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::io::IoSlice;
    use std::os::unix::net::UnixDatagram;

    /// A pipe whose write end is sent around: once every copy of it is
    /// closed, the read end polls POLLHUP. Race-free where counting this
    /// process's fds is not (other tests open theirs meanwhile).
    struct Probe {
        read: OwnedFd,
        write: Option<OwnedFd>,
    }

    impl Probe {
        fn new() -> Probe {
            let (read, write) = nix::unistd::pipe().unwrap();
            Probe {
                read,
                write: Some(write),
            }
        }

        fn raw(&self) -> RawFd {
            self.write.as_ref().unwrap().as_raw_fd()
        }

        /// Closes the test's own copy, then waits (at most `secs`) until no
        /// copy is left anywhere.
        fn all_closed(&mut self, secs: u16) -> bool {
            self.write = None;
            let mut fds = [PollFd::new(self.read.as_fd(), PollFlags::POLLIN)];
            poll(&mut fds, PollTimeout::from(secs * 1000)).unwrap() == 1
                && fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLHUP))
        }
    }

    /// A connected pair whose receiving end gets its senders' credentials.
    fn pair() -> (UnixDatagram, UnixDatagram) {
        let (tx, rx) = UnixDatagram::pair().unwrap();
        setsockopt(&rx, sockopt::PassCred, &true).unwrap();
        (tx, rx)
    }

    fn send_fds(tx: &UnixDatagram, text: &[u8], fds: &[RawFd]) {
        let cmsg = [ControlMessage::ScmRights(fds)];
        sendmsg::<()>(
            tx.as_raw_fd(),
            &[IoSlice::new(text)],
            &cmsg,
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    #[test]
    fn every_fd_of_a_message_is_closed_up_to_the_most_one_can_carry() {
        let (tx, rx) = pair();
        for n in [1, 16, 17, SCM_MAX_FD] {
            let mut probe = Probe::new();
            send_fds(&tx, b"FDSTORE=1", &vec![probe.raw(); n]);
            let mut buf = [0u8; MAX_MESSAGE];
            let got = receive(rx.as_fd(), &mut buf, &mut Control::new())
                .unwrap()
                .unwrap();
            assert_eq!(
                got,
                Received {
                    len: 9,
                    sender: Some(nix::unistd::getpid()),
                    fds: n,
                    truncated: false,
                },
                "{n} fds"
            );
            assert_eq!(&buf[..9], b"FDSTORE=1");
            assert!(probe.all_closed(5), "{n} fds: a copy is still open");
        }
        let mut buf = [0u8; MAX_MESSAGE];
        assert_eq!(receive(rx.as_fd(), &mut buf, &mut Control::new()), Ok(None));
    }

    /// What the kernel does when the control buffer is too small for the fds
    /// (scm_detach_fds): it installs those that fit, writes an SCM_RIGHTS
    /// message for them, releases the rest itself and sets MSG_CTRUNC. The
    /// ones installed must still be closed, and the message still counts.
    #[test]
    fn fds_of_a_cut_message_are_closed_and_the_message_keeps_its_sender() {
        let (tx, rx) = pair();
        // Room for the credentials and 16 fds, as nix's cmsg_space! sized it.
        // SAFETY: CMSG_SPACE is arithmetic.
        let room =
            unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) + libc::CMSG_SPACE(16 * 4) }
                as usize;
        let mut probe = Probe::new();
        send_fds(&tx, b"READY=1", &[probe.raw(); 17]);
        let mut control = Control::new();
        let mut buf = [0u8; MAX_MESSAGE];
        let got = receive_into(rx.as_fd(), &mut buf, &mut control.0[..room])
            .unwrap()
            .unwrap();
        assert_eq!(
            got,
            Received {
                len: 7,
                sender: Some(nix::unistd::getpid()),
                fds: 16,
                truncated: true,
            }
        );
        assert!(
            probe.all_closed(5),
            "the 16 fds that fit are not all closed"
        );
        // No room for any fd: the kernel keeps none of them.
        let mut probe = Probe::new();
        send_fds(&tx, b"READY=1", &[probe.raw(); 3]);
        // SAFETY: as above.
        let room = unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as u32) } as usize;
        let got = receive_into(rx.as_fd(), &mut buf, &mut control.0[..room])
            .unwrap()
            .unwrap();
        assert_eq!((got.fds, got.truncated), (0, true));
        assert!(got.sender.is_some());
        assert!(probe.all_closed(5));
    }

    /// Writes control messages into `control` as the kernel lays them out;
    /// returns the length used.
    fn lay_out(control: &mut Control, messages: &[(i32, &[u8])]) -> usize {
        let mut at = 0;
        for (kind, data) in messages {
            // SAFETY: CMSG_LEN and CMSG_SPACE are arithmetic; the header
            // and data are written within the buffer (asserted).
            unsafe {
                let len = libc::CMSG_LEN(data.len() as u32) as usize;
                let space = libc::CMSG_SPACE(data.len() as u32) as usize;
                assert!(at + space <= CONTROL_SPACE);
                let header = control.0.as_mut_ptr().add(at).cast::<libc::cmsghdr>();
                (*header).cmsg_len = len as _;
                (*header).cmsg_level = libc::SOL_SOCKET;
                (*header).cmsg_type = *kind;
                let body = libc::CMSG_DATA(header);
                std::ptr::copy_nonoverlapping(data.as_ptr(), body, data.len());
                at += space;
            }
        }
        at
    }

    fn fd_bytes(fds: &[RawFd]) -> Vec<u8> {
        fds.iter().flat_map(|fd| fd.to_ne_bytes()).collect()
    }

    fn header_over(control: &mut Control, len: usize) -> libc::msghdr {
        // SAFETY: msghdr is plain data.
        let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
        header.msg_control = control.0.as_mut_ptr().cast();
        header.msg_controllen = len as _;
        header
    }

    fn dups(probe: &Probe, n: usize) -> Vec<RawFd> {
        (0..n)
            .map(|_| {
                // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an fd the probe owns.
                unsafe { libc::fcntl(probe.raw(), libc::F_DUPFD_CLOEXEC, 0) }
            })
            .inspect(|fd| assert!(*fd >= 0))
            .collect()
    }

    #[test]
    fn every_scm_rights_message_is_closed_and_credentials_are_found_after_them() {
        let mut probe = Probe::new();
        let fds = dups(&probe, 5);
        let cred = libc::ucred {
            pid: 4242,
            uid: 0,
            gid: 0,
        };
        // SAFETY: ucred is plain data.
        let cred_bytes = unsafe {
            std::slice::from_raw_parts((&raw const cred).cast::<u8>(), size_of::<libc::ucred>())
        };
        let (a, b) = (fd_bytes(&fds[..2]), fd_bytes(&fds[2..]));
        let mut control = Control::new();
        let len = lay_out(
            &mut control,
            &[
                (libc::SCM_RIGHTS, &a),
                (libc::SCM_RIGHTS, &b),
                (libc::SCM_CREDENTIALS, cred_bytes),
            ],
        );
        let header = header_over(&mut control, len);
        // SAFETY: the buffer is laid out above; its fds are the test's own.
        let (sender, closed) = unsafe { take_control(&header) };
        assert_eq!((sender, closed), (Some(Pid::from_raw(4242)), 5));
        assert!(probe.all_closed(5));
    }

    #[test]
    fn a_message_cut_short_has_the_fds_within_the_buffer_closed_and_no_more() {
        let mut probe = Probe::new();
        let fds = dups(&probe, 4);
        let mut control = Control::new();
        lay_out(&mut control, &[(libc::SCM_RIGHTS, &fd_bytes(&fds))]);
        // The buffer ends after two of the four fds its message claims.
        // SAFETY: CMSG_LEN is arithmetic.
        let cut = unsafe { libc::CMSG_LEN(8) } as usize;
        let header = header_over(&mut control, cut);
        // SAFETY: as above; the two fds past the end are not read.
        let (sender, closed) = unsafe { take_control(&header) };
        assert_eq!((sender, closed), (None, 2));
        // The two past the end are still open: close them here.
        for fd in &fds[2..] {
            // SAFETY: the test's own dups, open still (asserted by close).
            assert_eq!(unsafe { libc::close(*fd) }, 0);
        }
        assert!(probe.all_closed(5));
        // A header too short to be one, or no control data: nothing.
        let mut control = Control::new();
        let header = header_over(&mut control, 0);
        // SAFETY: no control data.
        assert_eq!(unsafe { take_control(&header) }, (None, 0));
        let len = lay_out(&mut control, &[(libc::SCM_RIGHTS, &[])]);
        // SAFETY: zeroes for a cmsg_len: the walk stops.
        unsafe { (*control.0.as_mut_ptr().cast::<libc::cmsghdr>()).cmsg_len = 0 };
        let header = header_over(&mut control, len + 64);
        // SAFETY: as above.
        assert_eq!(unsafe { take_control(&header) }, (None, 0));
    }

    #[test]
    fn the_parent_is_read_past_any_command_name() {
        assert_eq!(
            parse_parent(b"42 (sh) S 7 42 42 0 -1 4194560"),
            Some(Pid::from_raw(7))
        );
        assert_eq!(
            parse_parent(b"42 (a) b) (c) R 9 42 1"),
            Some(Pid::from_raw(9))
        );
        assert_eq!(parse_parent(b"1 (tend) S 0 1 1"), Some(Pid::from_raw(0)));
        assert_eq!(parse_parent(b"garbage"), None);
        assert_eq!(parse_parent(b"42 (sh) S"), None);
    }

    #[test]
    fn ancestry_walks_up_to_the_first_process() {
        let me = nix::unistd::getpid();
        let chain = ancestry(me);
        assert_eq!(chain[0], me);
        assert_eq!(chain.get(1), Some(&nix::unistd::getppid()));
        assert!(chain.len() <= MAX_ANCESTRY);
    }

    #[test]
    fn a_gone_process_is_its_own_ancestry() {
        // Above the kernel's pid_max limit (2^22), so never a live pid.
        let gone = Pid::from_raw(5_000_000);
        assert_eq!(ancestry(gone), vec![gone]);
    }
}
