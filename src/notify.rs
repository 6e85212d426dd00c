//! The service's notify socket (`NOTIFY_SOCKET`, systemd's sd_notify
//! protocol): where it says `READY=1`, `RELOADING=1`, `STOPPING=1`,
//! `STATUS=...`.
//!
//! A datagram socket in a private directory, with `SO_PASSCRED` on, so the
//! kernel attaches each sender's pid: the core decides whether that pid
//! belongs to the service (see [`ancestry`]). What the messages mean is the
//! core's business; this module only receives them, without ever blocking.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, bind, recvmsg,
    setsockopt, socket, sockopt,
};
use nix::unistd::Pid;

/// The most of one message that is kept; sd_notify messages are a few lines.
pub const MAX_MESSAGE: usize = 4096;

/// At most this many datagrams are taken per [`NotifySocket::recv`], so a
/// service that floods the socket cannot hold up the event loop; the rest
/// stay queued and the socket polls readable again.
const MAX_PER_RECV: usize = 256;

/// How far [`ancestry`] walks up.
const MAX_ANCESTRY: usize = 64;

pub struct NotifySocket {
    fd: OwnedFd,
    dir: PathBuf,
    path: PathBuf,
}

impl NotifySocket {
    /// Binds a new socket at `$TMPDIR/tend-notify-XXXXXX/notify` (or under
    /// /tmp), in a directory of mode 0700 that only tend's user can enter.
    pub fn new() -> io::Result<NotifySocket> {
        let base = std::env::var_os("TMPDIR")
            .filter(|d| Path::new(d).is_absolute())
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let template = base.join("tend-notify-XXXXXX");
        // mkdtemp creates the directory with mode 0700.
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
        match Self::bind(&path) {
            Ok(fd) => Ok(NotifySocket { fd, dir, path }),
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

    /// The datagrams queued now, each with its sender's pid, oldest first.
    /// Never blocks. A message longer than [`MAX_MESSAGE`] is cut there;
    /// one without a sender pid (from outside tend's pid namespace) is
    /// dropped; fds passed along (`FDSTORE=1`) are closed.
    pub fn recv(&self) -> Vec<(Pid, Vec<u8>)> {
        let mut messages = Vec::new();
        let mut buf = [0u8; MAX_MESSAGE];
        while messages.len() < MAX_PER_RECV {
            let mut cmsg = nix::cmsg_space!(libc::ucred, [RawFd; 16]);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let received = recvmsg::<()>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
            );
            let msg = match received {
                Ok(msg) => msg,
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(
                        "recvmsg() on the notify socket {} failed: {e}",
                        self.path.display()
                    );
                    break;
                }
            };
            let len = msg.bytes;
            let mut sender = None;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    match c {
                        ControlMessageOwned::ScmCredentials(cred) if cred.pid() > 0 => {
                            sender = Some(Pid::from_raw(cred.pid()));
                        }
                        ControlMessageOwned::ScmRights(fds) => {
                            for fd in fds {
                                // SAFETY: the kernel just gave tend this fd.
                                drop(unsafe { OwnedFd::from_raw_fd(fd) });
                            }
                        }
                        _ => {}
                    }
                }
            }
            match sender {
                Some(pid) => messages.push((pid, buf[..len.min(MAX_MESSAGE)].to_vec())),
                None => tracing::debug!("a notify message without a sender pid is dropped"),
            }
        }
        messages
    }
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
