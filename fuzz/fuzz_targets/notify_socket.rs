//! Datagrams on the notify socket with control data: sent over a real
//! unix datagram socket to a `NotifySocket`, each with a number of fds
//! attached (SCM_RIGHTS, 0 to 40, as a service's `FDSTORE=1` does), then
//! received. Afterwards the process holds exactly the fds it held before:
//! tend closes every fd a service passes it.
//!
//! Input: datagrams separated by NUL NUL; each starts with a byte whose
//! value modulo 41 is the number of fds attached.
#![no_main]

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, sendmsg, socket,
};
use tend::notify::{MAX_MESSAGE, NotifySocket};

struct Pair {
    socket: NotifySocket,
    sender: OwnedFd,
    to: UnixAddr,
}

static PAIR: LazyLock<std::sync::Mutex<Pair>> = LazyLock::new(|| {
    let socket = NotifySocket::new().expect("a notify socket");
    let sender = socket_fd();
    // Non-blocking: a full queue is drained, not waited on.
    nix::fcntl::fcntl(
        &sender,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let to = UnixAddr::new(socket.path()).unwrap();
    std::sync::Mutex::new(Pair { socket, sender, to })
});

fn socket_fd() -> OwnedFd {
    socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket()")
}

/// Datagrams and their fd counts: split on NUL NUL, the first byte of each
/// the count.
fn datagrams(data: &[u8]) -> Vec<(usize, &[u8])> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let end = tail
            .windows(2)
            .position(|w| w == [0, 0])
            .unwrap_or(tail.len());
        out.push((usize::from(n) % 41, &tail[..end]));
        rest = tail.get(end + 2..).unwrap_or_default();
        if out.len() == 16 {
            break;
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let pair = PAIR.lock().unwrap();
    let sent = datagrams(data);
    let before = tend_fuzz::open_fds();
    let mut received = Vec::new();
    for (fds, text) in &sent {
        // What the service passes: fds of its own, closed on its side once sent.
        let passed: Vec<OwnedFd> = (0..*fds).map(|_| socket_fd()).collect();
        let raw: Vec<RawFd> = passed.iter().map(AsRawFd::as_raw_fd).collect();
        let cmsgs = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsgs };
        loop {
            match sendmsg(
                pair.sender.as_raw_fd(),
                &[IoSlice::new(text)],
                cmsgs,
                MsgFlags::empty(),
                Some(&pair.to),
            ) {
                Ok(_) => break,
                // The queue is full (net.unix.max_dgram_qlen): take what is
                // there, once a flood's pause allows.
                Err(nix::errno::Errno::EAGAIN) => {
                    let now = std::time::Instant::now();
                    pair.socket.tick(now);
                    if pair.socket.poll_fd(now).is_none()
                        && let Some(until) = pair.socket.deadline()
                    {
                        std::thread::sleep(until.saturating_duration_since(now));
                        pair.socket.tick(std::time::Instant::now());
                    }
                    received.extend(pair.socket.recv())
                }
                Err(e) => panic!("sendmsg() to the notify socket: {e}"),
            }
        }
    }
    // Everything queued, waiting out a flood's pause as tend's loop does.
    loop {
        let now = std::time::Instant::now();
        pair.socket.tick(now);
        if pair.socket.poll_fd(now).is_none() {
            if let Some(until) = pair.socket.deadline() {
                std::thread::sleep(until.saturating_duration_since(now));
            }
            continue;
        }
        let batch = pair.socket.recv();
        if batch.is_empty() && pair.socket.poll_fd(std::time::Instant::now()).is_some() {
            break;
        }
        received.extend(batch);
    }
    let fds: usize = sent.iter().map(|(n, _)| n).sum();
    assert_eq!(
        tend_fuzz::open_fds(),
        before,
        "fds left open after receiving {fds} passed in {} datagram(s) ({:?} each)",
        sent.len(),
        sent.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    // Every datagram arrives whole (up to MAX_MESSAGE), with its sender,
    // whatever rode along with it.
    assert_eq!(received.len(), sent.len(), "datagrams dropped");
    let me = nix::unistd::getpid();
    for ((pid, got), (_, text)) in received.iter().zip(&sent) {
        assert_eq!(*pid, me);
        assert_eq!(&got[..], &text[..text.len().min(MAX_MESSAGE)]);
    }
});
