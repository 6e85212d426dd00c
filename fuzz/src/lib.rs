//! What the fuzz targets share: how an input is cut into pieces, and the
//! process's open file descriptors.
//!
//! Several targets read a small header before the bytes they send: its
//! first byte says how many cut points follow (up to 8), each a fraction of
//! the rest in 256ths. A header of one 0 byte sends the rest in one piece,
//! so a real request or message is a seed once a 0 is put before it.

use std::path::Path;

/// What the notify targets parse; the one place to change if it moves.
pub use tend::core::Notification;

/// The header and the pieces of `data`, as described above.
pub fn pieces(data: &[u8]) -> Vec<&[u8]> {
    let Some((&n, rest)) = data.split_first() else {
        return Vec::new();
    };
    let n = usize::from(n % 9).min(rest.len());
    let (cuts, body) = rest.split_at(n);
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) * body.len() / 256)
        .collect();
    at.sort_unstable();
    let mut out = Vec::with_capacity(n + 1);
    let mut from = 0;
    for to in at.into_iter().chain([body.len()]) {
        if to > from {
            out.push(&body[from..to]);
            from = to;
        }
    }
    out
}

/// How many file descriptors the process has open now.
pub fn open_fds() -> usize {
    // The directory's own fd is counted every time alike.
    std::fs::read_dir(Path::new("/proc/self/fd"))
        .expect("read /proc/self/fd")
        .count()
}

/// A write to a peer that is gone fails with EPIPE instead of killing the
/// fuzzer (libFuzzer's main does not set SIGPIPE aside as Rust's does).
pub fn ignore_sigpipe() {
    // SAFETY: SIG_IGN installs no handler.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .expect("signal(SIGPIPE, SIG_IGN)");
}
