//! What a reload endpoint answers to `on_change = "http"`: a real endpoint
//! on loopback sends the input's bytes, in the input's pieces, to the
//! action's client (`http_client::call`), then closes the connection.
//!
//! Input: a flags byte (bits 0-1: the method, POST, GET, HEAD or PUT; bit
//! 2: close with a reset instead of a FIN), then pieces as in
//! `tend_fuzz::pieces`.
#![no_main]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::LazyLock;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use nix::sys::socket::{setsockopt, sockopt};
use tend::http_action::Endpoint;
use tend::http_client;

/// What the endpoint sends next: the pieces, and whether to reset.
type Script = (Vec<Vec<u8>>, bool);

struct Peer {
    port: u16,
    scripts: Mutex<SyncSender<Script>>,
}

/// The endpoint: a thread that answers one connection per script.
static PEER: LazyLock<Peer> = LazyLock::new(|| {
    tend_fuzz::ignore_sigpipe();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = sync_channel(0);
    std::thread::spawn(move || serve(listener, rx));
    Peer {
        port,
        scripts: Mutex::new(tx),
    }
});

fn serve(listener: TcpListener, scripts: Receiver<Script>) {
    for (pieces, reset) in scripts {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_nodelay(true).unwrap();
        read_request(&mut conn);
        for piece in &pieces {
            // The client may have stopped reading and closed.
            if conn.write_all(piece).is_err() {
                break;
            }
        }
        if reset {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            setsockopt(&conn.as_fd(), sockopt::Linger, &linger).unwrap();
        }
    }
}

/// The request's head, so that closing does not reset what it still holds.
fn read_request(conn: &mut TcpStream) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.ends_with(b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let method = ["POST", "GET", "HEAD", "PUT"][usize::from(flags & 3)];
    let reset = flags & 4 != 0;
    let pieces: Vec<Vec<u8>> = tend_fuzz::pieces(rest)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    let peer = &*PEER;
    let url = format!("http://127.0.0.1:{}/-/reload", peer.port);
    let endpoint = Endpoint::parse(method, &url).unwrap();
    peer.scripts.lock().unwrap().send((pieces, reset)).unwrap();
    match http_client::call(&endpoint, Duration::from_secs(10)) {
        Ok((code, line)) => {
            // Three digits ("050" is 50: not a success, which is right).
            assert!(code < 1000, "code {code}");
            if !line.is_empty() {
                let text = line.strip_prefix(": ").expect("\": \" before the line");
                assert!(!text.trim().is_empty());
                // Escaped, but for tabs, which text::escape keeps.
                assert!(
                    !text.contains(|c: char| c.is_control() && c != '\t'),
                    "{line:?}"
                );
            }
        }
        // The endpoint always closes: no call may wait for its timeout.
        Err(e) => assert!(!e.contains("within"), "{e}"),
    }
});
