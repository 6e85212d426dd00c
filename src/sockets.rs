//! Listening sockets that tend binds once and holds across every start of
//! the service (systemd's socket activation protocol).
//!
//! tend binds each `[[socket]]` before the first start and never accepts on
//! it. Every start of the service inherits them as fds 3, 4, ... with
//! `LISTEN_FDS`, `LISTEN_FDNAMES` and `LISTEN_PID`; connections that arrive
//! while no instance accepts (a restart) wait in the kernel's backlog instead
//! of being refused.
//!
//! [`bind_all`] leaves the sockets at exactly fds 3..3+N in tend itself,
//! close-on-exec. Holding those numbers means no later pipe or eventfd can
//! take them, so the child needs no `dup2` between clone and exec (where one
//! onto the number of the pipe it reports failures on would break the spawn): it
//! only clears close-on-exec on them. Checks and other jobs therefore never
//! see them.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, SockaddrStorage, UnixAddr,
    getsockname, setsockopt, socket, sockopt,
};
use nix::sys::stat::Mode;

/// The first fd of the socket activation protocol (`SD_LISTEN_FDS_START`).
pub const FIRST_FD: RawFd = 3;

/// Mode of a unix socket's file when `mode` is not given: anyone may connect,
/// as with systemd's `SocketMode=` default.
pub const DEFAULT_MODE: u32 = 0o666;

/// The longest path a unix socket address holds (`sun_path` less its NUL).
const MAX_UNIX_PATH: usize = 107;

/// Where a socket listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Listen, String> {
        const FORMS: &str = "0.0.0.0:8080, [::]:8080 or unix:/run/app.sock";
        if let Some(path) = s.strip_prefix("unix:") {
            return unix_path(path).map(Listen::Unix);
        }
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(Listen::Tcp(addr));
        }
        if s.is_empty() {
            return Err(format!("empty address: write it like {FORMS}"));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            if s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "{s:?} has no host: write 0.0.0.0:{s} (every IPv4 address), \
                     [::]:{s} (every address) or 127.0.0.1:{s} (this host only)"
                ));
            }
            return Err(format!("{s:?} is not an address: write it like {FORMS}"));
        };
        if port.parse::<u16>().is_err() {
            return Err(format!(
                "{s:?}: the port {port:?} is not a number from 0 to 65535"
            ));
        }
        if host.parse::<IpAddr>().is_ok() {
            // Only an unbracketed IPv6 address gets here ("::1:80").
            return Err(format!(
                "{s:?}: write an IPv6 address in brackets, like [::1]:{port}"
            ));
        }
        let example = if host == "localhost" {
            format!("127.0.0.1:{port} or [::1]:{port}")
        } else {
            format!("0.0.0.0:{port} or [::]:{port}")
        };
        Err(format!(
            "{s:?}: {host:?} is not an IP address; tend does not resolve host names \
             (PID 1 makes no DNS queries), use an address such as {example}"
        ))
    }
}

fn unix_path(path: &str) -> Result<PathBuf, String> {
    if path.is_empty() {
        return Err("\"unix:\" needs a path, like unix:/run/app.sock".into());
    }
    if !path.starts_with('/') {
        return Err(format!(
            "the unix socket path {path:?} must be absolute, like unix:/run/app.sock"
        ));
    }
    if path.contains('\0') {
        return Err(format!("the unix socket path {path:?} contains a NUL byte"));
    }
    if path.len() > MAX_UNIX_PATH {
        return Err(format!(
            "the unix socket path {path:?} is {} bytes long; the limit is {MAX_UNIX_PATH}",
            path.len()
        ));
    }
    Ok(PathBuf::from(path))
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for Listen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A unix socket's `mode`: an octal string such as `"0660"`, permission bits
/// only (no setuid, setgid or sticky bit).
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let octal = !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| (b'0'..=b'7').contains(&b));
    match u32::from_str_radix(s, 8) {
        Ok(mode) if octal && mode <= 0o777 => Ok(mode),
        Ok(_) if octal => Err(format!(
            "mode {s:?} has bits above 0777; a socket's mode holds permission bits only"
        )),
        _ => Err(format!("mode {s:?} is not an octal mode like \"0660\"")),
    }
}

/// A `[[socket]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketSpec {
    /// The service (index) it goes to.
    pub service: usize,
    /// Its `LISTEN_FDNAMES` entry.
    pub name: String,
    pub listen: Listen,
    /// `listen(2)`'s backlog; None is `SOMAXCONN` (the kernel caps any value
    /// at `net.core.somaxconn`).
    pub backlog: Option<u32>,
    /// Permission bits of a unix socket's file; None is [`DEFAULT_MODE`].
    pub mode: Option<u32>,
}

impl SocketSpec {
    /// What a config must not hold: a name that `LISTEN_FDNAMES` cannot carry
    /// (systemd's rule: 1 to 255 printable ASCII characters, no ':'), and a
    /// mode on a TCP socket.
    pub fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty() || name.len() > 255 {
            return Err(format!(
                "socket name {name:?} must be 1 to 255 characters long"
            ));
        }
        if let Some(c) = name
            .chars()
            .find(|&c| c == ':' || !(' '..='~').contains(&c))
        {
            return Err(format!(
                "socket name {name:?} cannot hold {c:?}: it goes into LISTEN_FDNAMES, \
                 which takes printable ASCII without ':'"
            ));
        }
        if self.mode.is_some() && matches!(self.listen, Listen::Tcp(_)) {
            return Err(format!(
                "socket {name:?}: mode applies to unix sockets only, not {}",
                self.listen
            ));
        }
        Ok(())
    }
}

/// A socket that could not be set up, named for the person reading the log.
#[derive(Debug)]
pub struct BindError {
    pub name: String,
    pub listen: Listen,
    /// The call that failed and why, e.g. "bind(): Address already in use".
    pub reason: String,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot listen on {} (socket {:?}): {}",
            self.listen, self.name, self.reason
        )
    }
}

impl std::error::Error for BindError {}

/// The sockets tend holds, at fds [`FIRST_FD`]..[`FIRST_FD`]+count, in the
/// order of their specs.
#[derive(Debug)]
pub struct Held {
    fds: Vec<OwnedFd>,
    names: Vec<String>,
}

impl Held {
    /// `LISTEN_FDS`.
    pub fn count(&self) -> usize {
        self.fds.len()
    }

    /// `LISTEN_FDNAMES` for the sockets `which` (indices, in that order):
    /// their names joined by ':'.
    pub fn names(&self, which: &[usize]) -> String {
        which
            .iter()
            .map(|&i| self.names[i].as_str())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Where socket `i` actually listens (a TCP port 0 becomes the port the
    /// kernel chose).
    pub fn local_addr(&self, i: usize) -> io::Result<Listen> {
        let fd = self
            .fds
            .get(i)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no socket {i}")))?;
        let addr: SockaddrStorage = getsockname(fd.as_raw_fd())?;
        if let Some(v4) = addr.as_sockaddr_in() {
            Ok(Listen::Tcp(SocketAddr::V4((*v4).into())))
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            Ok(Listen::Tcp(SocketAddr::V6((*v6).into())))
        } else if let Some(path) = addr.as_unix_addr().and_then(|u| u.path()) {
            Ok(Listen::Unix(path.to_path_buf()))
        } else {
            Err(io::Error::other("getsockname() gave an unexpected address"))
        }
    }
}

/// Binds and listens on every socket, then moves them to fds 3.. of tend.
///
/// Call it before tend opens anything else: a fd that sits at 3..3+N then
/// can only be one tend inherited, and it is replaced (the log says so).
pub fn bind_all(specs: &[SocketSpec]) -> Result<Held, BindError> {
    let mut bound = Vec::with_capacity(specs.len());
    for spec in specs {
        let fail = |reason: String| BindError {
            name: spec.name.clone(),
            listen: spec.listen.clone(),
            reason,
        };
        bound.push(bind(spec).map_err(fail)?);
    }
    let fds = place(bound).map_err(|(i, reason)| BindError {
        name: specs[i].name.clone(),
        listen: specs[i].listen.clone(),
        reason,
    })?;
    Ok(Held {
        fds,
        names: specs.iter().map(|s| s.name.clone()).collect(),
    })
}

/// "bind(): Address already in use".
fn call(what: &'static str) -> impl Fn(Errno) -> String {
    move |e| format!("{what}: {}", e.desc())
}

/// One listening socket, close-on-exec, wherever the kernel put it (also
/// tend's own HTTP server's, see http_server.rs).
pub fn bind(spec: &SocketSpec) -> Result<OwnedFd, String> {
    let backlog = spec
        .backlog
        .map_or(libc::SOMAXCONN, |b| i32::try_from(b).unwrap_or(i32::MAX));
    let fd = match &spec.listen {
        Listen::Tcp(addr) => {
            let family = if addr.is_ipv4() {
                AddressFamily::Inet
            } else {
                AddressFamily::Inet6
            };
            let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
                .map_err(call("socket()"))?;
            // So that a restarted tend can bind while connections of the old
            // one are in TIME_WAIT. IPV6_V6ONLY is left to the kernel
            // (net.ipv6.bindv6only, 0 by default: "[::]" takes IPv4 too), as
            // systemd's BindIPv6Only=default does.
            setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(call("setsockopt(SO_REUSEADDR)"))?;
            let bound = match addr {
                SocketAddr::V4(a) => nix::sys::socket::bind(fd.as_raw_fd(), &SockaddrIn::from(*a)),
                SocketAddr::V6(a) => nix::sys::socket::bind(fd.as_raw_fd(), &SockaddrIn6::from(*a)),
            };
            bound.map_err(call("bind()"))?;
            fd
        }
        Listen::Unix(path) => bind_unix(path, spec.mode.unwrap_or(DEFAULT_MODE))?,
    };
    // SAFETY: listen on a socket tend owns.
    let ret = unsafe { libc::listen(fd.as_raw_fd(), backlog) };
    Errno::result(ret).map_err(call("listen()"))?;
    Ok(fd)
}

fn bind_unix(path: &Path, mode: u32) -> Result<OwnedFd, String> {
    match std::fs::symlink_metadata(path) {
        // Left by an earlier tend (a container restarted in place). Anything
        // else at the path is not ours to remove: bind then fails on it.
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the old socket file: {e}"))?,
        Ok(_) => {
            return Err(format!(
                "{} exists and is not a socket (tend removes only an old socket file)",
                path.display()
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("lstat(): {e}")),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(call("socket()"))?;
    let addr = UnixAddr::new(path.as_os_str().as_bytes()).map_err(call("sockaddr_un"))?;
    // bind(2) creates the file with 0777 & ~umask: a umask of exactly the
    // bits to leave out gives it `mode` from the start, where a chmod after
    // bind would follow whatever is at the path by then. The umask is
    // process-wide; bind_all runs before tend starts any thread.
    let old = nix::sys::stat::umask(Mode::from_bits_truncate(!mode & 0o777));
    let bound = nix::sys::socket::bind(fd.as_raw_fd(), &addr);
    nix::sys::stat::umask(old);
    bound.map_err(call("bind()"))?;
    Ok(fd)
}

/// Moves `bound[i]` to fd 3+i, close-on-exec. On failure, says which socket.
///
/// Each socket first goes to a fd at or above 3+N (the lowest free one),
/// then onto its final number with dup3: a socket that the kernel gave
/// number 4 would otherwise be closed by dup3 onto 4 for another socket.
fn place(bound: Vec<OwnedFd>) -> Result<Vec<OwnedFd>, (usize, String)> {
    let above = FIRST_FD + bound.len() as RawFd;
    let mut moved = Vec::with_capacity(bound.len());
    for (i, fd) in bound.into_iter().enumerate() {
        let tmp = fcntl(&fd, FcntlArg::F_DUPFD_CLOEXEC(above))
            .map_err(|e| (i, format!("fcntl(F_DUPFD_CLOEXEC, {above}): {}", e.desc())))?;
        // SAFETY: fcntl returned a new fd that nothing else owns.
        moved.push(unsafe { OwnedFd::from_raw_fd(tmp) });
        // The original closes here, so no OwnedFd is left on a number that
        // dup3 below may take over.
        drop(fd);
    }
    let mut placed = Vec::with_capacity(moved.len());
    for (i, tmp) in moved.into_iter().enumerate() {
        let target = FIRST_FD + i as RawFd;
        // SAFETY: F_GETFD only reads the flags of whatever is at `target`.
        if unsafe { libc::fcntl(target, libc::F_GETFD) } != -1 {
            tracing::warn!("fd {target}, which tend inherited, is replaced by a listening socket");
        }
        // SAFETY: dup3 onto a number that no OwnedFd of tend's holds (see
        // above, and bind_all's contract).
        let ret = unsafe { libc::dup3(tmp.as_fd().as_raw_fd(), target, libc::O_CLOEXEC) };
        Errno::result(ret).map_err(|e| {
            (
                i,
                format!("dup3(fd {}, {target}): {}", tmp.as_raw_fd(), e.desc()),
            )
        })?;
        // SAFETY: dup3 succeeded, so `target` is a fd that tend now owns.
        placed.push(unsafe { OwnedFd::from_raw_fd(target) });
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(s: &str) -> Result<Listen, String> {
        s.parse()
    }

    #[test]
    fn addresses_and_unix_paths_are_accepted() {
        let tcp = |s: &str| Listen::Tcp(s.parse().unwrap());
        assert_eq!(listen("0.0.0.0:8080"), Ok(tcp("0.0.0.0:8080")));
        assert_eq!(listen("[::]:8080"), Ok(tcp("[::]:8080")));
        assert_eq!(listen("127.0.0.1:0"), Ok(tcp("127.0.0.1:0")));
        assert_eq!(listen("[::1]:443"), Ok(tcp("[::1]:443")));
        assert_eq!(
            listen("unix:/run/app.sock"),
            Ok(Listen::Unix("/run/app.sock".into()))
        );
        for s in ["0.0.0.0:8080", "[::]:8080", "unix:/run/app.sock"] {
            assert_eq!(listen(s).unwrap().to_string(), s, "round trip of {s}");
        }
    }

    #[test]
    fn a_bad_address_says_what_to_write() {
        let err = |s: &str| listen(s).unwrap_err();
        assert!(err("8080").contains("0.0.0.0:8080"), "{}", err("8080"));
        let dns = err("localhost:80");
        assert!(dns.contains("does not resolve host names"), "{dns}");
        assert!(dns.contains("127.0.0.1:80"), "{dns}");
        assert!(err("example.com:80").contains("not an IP address"));
        assert!(err("unix:").contains("needs a path"));
        assert!(err("unix:run/app.sock").contains("must be absolute"));
        assert!(err(&format!("unix:/{}", "a".repeat(120))).contains("the limit is 107"));
        assert!(err("0.0.0.0:99999").contains("0 to 65535"));
        assert!(err("::1:80").contains("in brackets"));
        assert!(err("").contains("empty address"));
        assert!(err("http").contains("not an address"));
    }

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0777"), Ok(0o777));
        assert!(
            parse_mode("0999")
                .unwrap_err()
                .contains("not an octal mode")
        );
        assert!(parse_mode("4755").unwrap_err().contains("above 0777"));
        assert!(parse_mode("").is_err());
        assert!(parse_mode("rw-").is_err());
        assert!(parse_mode("+660").is_err());
        assert!(parse_mode("00660").is_err());
    }

    #[test]
    fn names_must_fit_listen_fdnames() {
        let spec = |name: &str, listen: &str, mode: Option<u32>| SocketSpec {
            service: 0,
            name: name.into(),
            listen: listen.parse().unwrap(),
            backlog: None,
            mode,
        };
        assert_eq!(spec("http", "0.0.0.0:80", None).validate(), Ok(()));
        assert_eq!(spec("admin api", "unix:/a", Some(0o600)).validate(), Ok(()));
        assert!(spec("", "0.0.0.0:80", None).validate().is_err());
        assert!(
            spec("a:b", "0.0.0.0:80", None)
                .validate()
                .unwrap_err()
                .contains("':'")
        );
        assert!(spec("é", "0.0.0.0:80", None).validate().is_err());
        let mode = spec("http", "0.0.0.0:80", Some(0o600))
            .validate()
            .unwrap_err();
        assert!(mode.contains("unix sockets only"), "{mode}");
    }
}
