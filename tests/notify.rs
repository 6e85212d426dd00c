//! The notify socket (`tend::notify`): real datagrams, from the test process
//! and from children, arrive with their sender's pid.

mod common;

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command};

use common::alone::alone;
use common::secs;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tend::notify::{self, MAX_MESSAGE, NotifySocket};

/// Waits (bounded) until the socket holds a datagram, then takes them all.
fn receive(socket: &NotifySocket) -> Vec<(Pid, Vec<u8>)> {
    let mut fds = [PollFd::new(socket.fd(), PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::try_from(secs(20.0)).unwrap()).unwrap();
    assert_eq!(ready, 1, "no notify message within 20 s");
    socket.recv()
}

fn python(socket: &NotifySocket, code: &str) -> Child {
    Command::new("python3")
        .args(["-c", code])
        .env("NOTIFY_SOCKET", socket.path())
        .spawn()
        .unwrap()
}

fn finish(mut child: Child) {
    // Bounded by the child: each script only sends and exits.
    assert!(child.wait().unwrap().success());
}

const SD_NOTIFY: &str = r#"
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b"READY=1\nSTATUS=serving", os.environ["NOTIFY_SOCKET"])
"#;

#[test]
fn a_message_from_this_process_carries_its_pid() {
    let socket = NotifySocket::new().unwrap();
    assert!(socket.recv().is_empty(), "nothing queued, and no wait");
    let sender = UnixDatagram::unbound().unwrap();
    sender.send_to(b"STATUS=one", socket.path()).unwrap();
    sender.send_to(b"STATUS=two", socket.path()).unwrap();
    let me = nix::unistd::getpid();
    assert_eq!(
        receive(&socket),
        [(me, b"STATUS=one".to_vec()), (me, b"STATUS=two".to_vec())]
    );
    assert!(socket.recv().is_empty(), "all of them were taken");
}

#[test]
fn a_child_sending_like_sd_notify_is_seen_with_its_own_pid() {
    let socket = NotifySocket::new().unwrap();
    let child = python(&socket, SD_NOTIFY);
    let pid = Pid::from_raw(child.id() as i32);
    let got = receive(&socket);
    finish(child);
    assert_eq!(got, [(pid, b"READY=1\nSTATUS=serving".to_vec())]);
}

#[test]
fn a_long_message_is_cut_and_the_next_one_is_whole() {
    let socket = NotifySocket::new().unwrap();
    let sender = UnixDatagram::unbound().unwrap();
    let long = vec![b'x'; MAX_MESSAGE * 2];
    sender.send_to(&long, socket.path()).unwrap();
    sender.send_to(b"READY=1", socket.path()).unwrap();
    let got = receive(&socket);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, vec![b'x'; MAX_MESSAGE]);
    assert_eq!(got[1].1, b"READY=1");
}

#[test]
fn the_socket_lives_in_a_private_directory_that_goes_with_it() {
    let socket = NotifySocket::new().unwrap();
    let path = socket.path().to_path_buf();
    let dir = path.parent().unwrap().to_path_buf();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    assert!(
        dir.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("tend-notify-"),
        "{}",
        dir.display()
    );
    drop(socket);
    assert!(
        !path.exists() && !dir.exists(),
        "{} is left behind",
        dir.display()
    );
}

#[test]
fn fds_sent_along_a_message_are_closed() {
    alone("fds_sent_along_a_message_are_closed", || {
        let socket = NotifySocket::new().unwrap();
        let open = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let before = open();
        let child = python(
            &socket,
            r#"
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.connect(os.environ["NOTIFY_SOCKET"])
r, w = os.pipe()
socket.send_fds(s, [b"FDSTORE=1"], [r, w])
"#,
        );
        let pid = Pid::from_raw(child.id() as i32);
        let got = receive(&socket);
        finish(child);
        assert_eq!(got, [(pid, b"FDSTORE=1".to_vec())]);
        assert_eq!(open(), before, "the passed pipe is not kept");
    });
}

#[test]
fn ancestry_leads_from_a_grandchild_through_its_parent_to_us() {
    let mut sh = Command::new("sh")
        .args(["-c", "sleep 30 & echo $!; wait"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let parent = Pid::from_raw(sh.id() as i32);
    let mut line = String::new();
    BufReader::new(sh.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let grandchild = Pid::from_raw(line.trim().parse().unwrap());
    let chain = notify::ancestry(grandchild);
    kill(grandchild, Signal::SIGKILL).unwrap();
    sh.wait().unwrap();
    assert_eq!(chain[..3], [grandchild, parent, nix::unistd::getpid()]);
    assert!(chain.len() <= 64);
    assert_eq!(
        notify::ancestry(grandchild),
        [grandchild],
        "gone, so only itself"
    );
}
