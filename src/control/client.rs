//! The other end: `tend signal` and `tend restart` send one request to the
//! running tend and print its answer.

use std::fs;
use std::io::{self, BufRead as _, Read as _};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, send, setsockopt, socket,
    sockopt,
};
use nix::sys::time::TimeVal;

use super::{CLIENT_TIMEOUT, socket_path};

/// What `tend signal` and `tend restart` ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    Signal { service: String, signo: i32 },
    Restart { service: String },
}

impl Ask {
    fn line(&self) -> String {
        match self {
            Ask::Signal { service, signo } => format!("signal {service} {signo}\n"),
            Ask::Restart { service } => format!("restart {service}\n"),
        }
    }
}

/// Sends `ask` to the tend whose status file is `status_file`, prints its
/// answer, and returns the exit code (0 done, 1 not done or no answer, 2 a
/// service of that name does not exist).
pub fn ask(status_file: &Path, ask: &Ask) -> i32 {
    let path = socket_path(status_file);
    match exchange(&path, &ask.line()) {
        Ok((0, message)) => match crate::cli::print(&format!("{message}\n")) {
            Ok(()) => 0,
            Err(e) => {
                crate::cli::complain(format!("cannot write to stdout: {e}"));
                1
            }
        },
        Ok((code, message)) => {
            crate::cli::complain(message);
            code
        }
        Err(e) => {
            crate::cli::complain(e);
            1
        }
    }
}

/// One request, one answer: the answer's code and message.
fn exchange(path: &Path, request: &str) -> Result<(i32, String), String> {
    let shown = path.display();
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("socket() failed: {e}"))?;
    let limit = TimeVal::new(CLIENT_TIMEOUT.as_secs() as _, 0);
    // A send timeout bounds connect() too, when tend's backlog is full.
    setsockopt(&fd, sockopt::SendTimeout, &limit)
        .and_then(|()| setsockopt(&fd, sockopt::ReceiveTimeout, &limit))
        .map_err(|e| format!("setsockopt() on a socket for {shown} failed: {e}"))?;
    let addr = UnixAddr::new(path.as_os_str().as_bytes())
        .map_err(|e| format!("{shown} cannot be a socket address: {e}"))?;
    if let Err(e) = connect(fd.as_raw_fd(), &addr) {
        return Err(match e {
            Errno::ENOENT => format!(
                "no control socket at {shown}: is tend running with this config? (a tend that \
                 could not create the socket says why in its log)"
            ),
            Errno::ECONNREFUSED => {
                format!("nothing listens on {shown}: tend is not running")
            }
            Errno::EACCES | Errno::EPERM => {
                let owner = fs::symlink_metadata(path)
                    .map(|m| format!(" (uid {})", m.uid()))
                    .unwrap_or_default();
                format!(
                    "permission denied: the control socket {shown} is only for the user tend \
                     runs as{owner} and root"
                )
            }
            Errno::EAGAIN | Errno::ETIMEDOUT => {
                format!("tend did not take the connection on {shown} within {CLIENT_TIMEOUT:?}")
            }
            e => format!("connect() to {shown} failed: {}", e.desc()),
        });
    }
    // Without SIGPIPE: a tend that refused the client may have answered and
    // closed before the request is sent, and its answer still waits to be read.
    let mut sent = 0;
    let mut unsent = None;
    while sent < request.len() {
        match send(
            fd.as_raw_fd(),
            &request.as_bytes()[sent..],
            MsgFlags::MSG_NOSIGNAL,
        ) {
            Ok(n) => sent += n,
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                return Err(format!(
                    "tend did not take the request within {CLIENT_TIMEOUT:?}"
                ));
            }
            Err(e) => {
                unsent = Some(e);
                break;
            }
        }
    }
    let mut line = String::new();
    io::BufReader::new(UnixStream::from(fd).take(64 * 1024))
        .read_line(&mut line)
        .map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                format!("tend did not answer within {CLIENT_TIMEOUT:?}")
            }
            _ => format!("cannot read the answer from {shown}: {e}"),
        })?;
    if let (Some(e), "") = (unsent, line.as_str()) {
        return Err(format!("cannot send the request to {shown}: {}", e.desc()));
    }
    let line = line.trim_end_matches('\n');
    let (code, message) = line
        .split_once(' ')
        .and_then(|(c, m)| Some((c.parse::<i32>().ok()?, m)))
        .ok_or_else(|| {
            if line.is_empty() {
                "tend closed the connection without an answer".to_string()
            } else {
                format!("not an answer of tend's: {line:?}")
            }
        })?;
    Ok((code.clamp(0, 2), message.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn the_client_reads_an_answer_sent_before_its_request_was() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let refuse = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"1 permission denied\n").unwrap();
        });
        // Longer than a socket buffer: the send fails once tend closed.
        let request = format!("restart {}\n", "x".repeat(1 << 20));
        let answer = exchange(&path, &request);
        refuse.join().unwrap();
        assert_eq!(answer, Ok((1, "permission denied".to_string())));
    }

    #[test]
    fn the_client_says_why_it_got_no_answer() {
        let d = tempfile::tempdir().unwrap();
        let status = d.path().join("status.json");
        let e = exchange(&socket_path(&status), "restart x\n").unwrap_err();
        assert!(e.contains("is tend running"), "{e}");
        // A socket nobody listens on any more.
        drop(std::os::unix::net::UnixListener::bind(socket_path(&status)).unwrap());
        let e = exchange(&socket_path(&status), "restart x\n").unwrap_err();
        assert!(e.contains("tend is not running"), "{e}");
    }
}
