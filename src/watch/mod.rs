//! Change detection: which watches may have changed, and their scans.
//!
//! Theory of operation. A watcher thread ([`thread`]) owns inotify, the
//! mount table's fd and the watches' timers, and makes every filesystem call
//! of a scan: PID 1's loop never touches the filesystem for a watch, so a
//! large file or a slow or hung filesystem never blocks it. The thread's
//! decisions are in [`books`], which a test drives with a fake clock. The
//! loop polls one eventfd ([`Watcher::poll_fds`]) and takes finished scans
//! as [`Report`]s ([`Watcher::pump`]).
//!
//! No change is lost between a scan and its inotify watches: a scan
//! registers each directory with inotify *before* it reads anything in it
//! (adding the same directory again returns the same wd), and the thread
//! reads events only between scans, so an event raised during a scan is
//! matched against the registrations that scan made. A change after a read
//! raises an event; a change before it is in what was read (an event for it
//! then only costs a scan with the same fingerprint).
//!
//! What inotify cannot see is looked for elsewhere: IN_IGNORED (a directory
//! deleted, or its filesystem unmounted) drops the registration and
//! schedules its watches, whose next scan registers whatever is there now;
//! a mount or unmount anywhere (POLLPRI on `/proc/self/mountinfo`) schedules
//! every watch, since a volume mounted over a watched directory raises no
//! inotify event at all; a queue overflow schedules every watch.
//!
//! Timing: the rename of `..data` in a kubelet volume completes an update and
//! is scanned at once. Anything else (in-place writes, editor saves, deletes)
//! waits for the watch's `debounce` of quiet, and at most max(1 s, 4 x
//! debounce) after the first event not scanned yet. When inotify is out of
//! instances or watches, the affected watches are scanned every
//! [`POLL_INTERVAL`] instead, and the log says which limit to raise.
//! Otherwise nothing runs on a timer: an idle watcher never wakes, and
//! without watches there is no thread at all.
//!
//! Scans run one after another: a watch whose files take seconds to hash
//! delays the scans of the others by as much, never the loop.
//!
//! Why the thread keeps the books rather than the loop: a kubelet update
//! then crosses between threads once (the finished scan) instead of twice
//! (a scan request, then its result), and each crossing to a sleeping
//! thread on another CPU costs tens of microseconds of reload latency.

mod books;
pub mod publish;
pub mod scan;
mod thread;

use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::PollFlags;

pub use crate::core::protocol::Restored;
pub use crate::core::protocol::{Candidate, Done, SnapshotError};
use books::Scanned;
pub use scan::Fingerprint;
use scan::OwnFiles;
pub use thread::Request;
use thread::{Handle, Taken};

use crate::config;
use crate::core::metrics::WatcherCounts;

/// How often a watch that inotify cannot cover is scanned.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

pub use crate::core::protocol::{Report, WatchId};

pub struct Watcher {
    /// None without watches, or once the thread is gone.
    thread: Option<Handle>,
    /// Each watch's absolute paths.
    paths: Vec<Vec<PathBuf>>,
    /// Per-path fingerprints of each watch's last report.
    previous: Vec<Option<Vec<Fingerprint>>>,
    /// What the thread had counted when it ended (counters never go back).
    counted: books::Counts,
}

impl Watcher {
    /// Starts watching `watches` (relative paths are taken from `cwd`),
    /// never covering `own_files` (what tend writes itself); every watch is
    /// scanned at once. A candidate of a `publish` directory that holds
    /// some of the service's `env_from` paths is read as the service's
    /// start would read them, and a candidate of watch `i` is given to
    /// `owners[i]` (uid, gid), the user its service runs as. Without
    /// watches nothing is started: no thread, no fd, no wake-up.
    pub fn new(
        watches: &[config::Watch],
        env_from: &[PathBuf],
        owners: &[Option<(u32, u32)>],
        cwd: &Path,
        own_files: &[PathBuf],
        now: Instant,
    ) -> anyhow::Result<Watcher> {
        let thread = if watches.is_empty() {
            None
        } else {
            let own = OwnFiles::new(own_files.iter().map(|p| cwd.join(p)).collect());
            Some(Handle::start(watches, env_from, owners, cwd, own, now)?)
        };
        Ok(Watcher {
            thread,
            paths: watches
                .iter()
                .map(|w| w.paths.iter().map(|p| cwd.join(p)).collect())
                .collect(),
            previous: vec![None; watches.len()],
            counted: books::Counts::default(),
        })
    }

    /// Asks the thread for a snapshot, a publication or a removal in a
    /// `publish` directory; the result comes from [`Watcher::pump`].
    pub fn ask(&self, request: Request) {
        if let Some(thread) = &self.thread {
            thread.ask(request);
        }
    }

    /// What the loop polls for the watcher (nothing without watches).
    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags)> {
        self.thread
            .iter()
            .map(|t| (t.fd(), PollFlags::POLLIN))
            .collect()
    }

    /// Called after every `ppoll` return: `ready[i]` says whether
    /// `poll_fds()[i]` had revents (missing: false). Returns the scans
    /// completed since the last call, the newest of each watch, then the
    /// results of requests (a snapshot's own scan comes before its
    /// result). Never blocks.
    pub fn pump(&mut self, ready: &[bool]) -> (Vec<Report>, Vec<Done>) {
        let Some(thread) = &self.thread else {
            return (Vec::new(), Vec::new());
        };
        match thread.take(ready.first().copied().unwrap_or(false)) {
            Taken::Some(scans, done) => (
                scans
                    .into_iter()
                    .map(|s| {
                        let i = s.watch.0;
                        report(&self.paths[i], &mut self.previous[i], s)
                    })
                    .collect(),
                done,
            ),
            Taken::Gone => {
                self.counted = thread.counts();
                tracing::error!(
                    "the watcher thread is gone: changes to watched files are no longer seen"
                );
                self.thread = None;
                (Vec::new(), Vec::new())
            }
        }
    }

    /// What the watcher counted, for /metrics.
    pub fn counts(&self) -> WatcherCounts {
        let c = self.thread.as_ref().map_or(self.counted, Handle::counts);
        WatcherCounts {
            paths: self.paths.iter().map(Vec::len).sum(),
            events: c.events,
            errors: c.errors,
        }
    }

    /// Scans watch `id` as soon as possible.
    #[allow(dead_code)] // for the loop's core: a failed check is checked again
    pub fn rescan(&self, id: WatchId) {
        if let Some(thread) = &self.thread {
            thread.rescan(id);
        }
    }
}

/// The report of a scan of a watch on `paths`, whose last report had the
/// per-path fingerprints `previous` (now this scan's).
fn report(paths: &[PathBuf], previous: &mut Option<Vec<Fingerprint>>, s: Scanned) -> Report {
    let changed = match previous.as_deref() {
        None => paths.to_vec(),
        Some(before) => paths
            .iter()
            .zip(&s.per_path)
            .zip(before)
            .filter(|((_, new), old)| new != old)
            .map(|((p, _), _)| p.clone())
            .collect(),
    };
    *previous = Some(s.per_path);
    Report {
        watch: s.watch,
        fingerprint: s.fingerprint,
        changed,
        files: s.files,
        missing: s.missing,
        unreadable: s.unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scan::test_fingerprint;

    fn scanned(fps: &[u8]) -> Scanned {
        Scanned {
            watch: WatchId(0),
            fingerprint: test_fingerprint(fps.iter().sum()),
            per_path: fps.iter().map(|n| test_fingerprint(*n)).collect(),
            files: 1,
            missing: Vec::new(),
            unreadable: Vec::new(),
        }
    }

    #[test]
    fn reports_name_the_paths_that_changed() {
        let paths = [PathBuf::from("/a"), PathBuf::from("/b")];
        let mut previous = None;
        let first = report(&paths, &mut previous, scanned(&[1, 2]));
        assert_eq!(first.changed, paths, "all of them in the first report");
        let same = report(&paths, &mut previous, scanned(&[1, 2]));
        assert!(same.changed.is_empty());
        assert_eq!(same.fingerprint, first.fingerprint);
        let next = report(&paths, &mut previous, scanned(&[3, 2]));
        assert_eq!(next.changed, [PathBuf::from("/a")]);
    }
}
