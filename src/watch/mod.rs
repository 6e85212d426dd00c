//! Change detection: inotify on the directories that hold watched paths,
//! turned into "this watch may have changed, scan it at time T".
//!
//! Every scan (see [`scan`]) says which directories to watch and for which
//! names; the watcher adds and removes inotify watches to match, so a path
//! that appears later, a directory that is removed and created again, or a
//! symlink that now points elsewhere is followed from the next scan on.
//!
//! Timing: the rename of `..data` in a kubelet volume completes an update and
//! is scanned at once. Anything else (in-place writes, editor saves, deletes)
//! waits for the watch's `debounce` of quiet. A queue overflow schedules every
//! watch. When inotify is out of instances or watches, the affected watches
//! are scanned every [`POLL_INTERVAL`] instead, and the log says which limit
//! to raise. Otherwise nothing runs on a timer: an idle watcher never wakes.

pub mod scan;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};

pub use scan::{Fingerprint, Scan};
use scan::{HashKey, Interest};

use crate::config;

/// How often a watch that inotify cannot cover is scanned.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long to wait, after a kubelet update, for the symlinks of keys it
/// added before telling the service anyway.
const KEY_WAIT: Duration = Duration::from_secs(2);
/// The least of a watch's max wait (see [`max_wait`]).
const MIN_MAX_WAIT: Duration = Duration::from_secs(1);

const DIR_EVENTS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

/// How soon an event wants its watch scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Urgency {
    /// A kubelet update is complete: scan now.
    Now,
    /// Let the writer finish: scan after the watch's debounce of quiet.
    Settle,
}

struct WatchState {
    name: String,
    paths: Vec<PathBuf>,
    debounce: Duration,
    /// A watch that keeps changing is scanned at the latest this long after
    /// its first unscanned event.
    max_wait: Duration,
    /// When to scan next; None while nothing happened.
    due: Option<Instant>,
    /// The first event since the last scan began.
    first_unscanned: Option<Instant>,
    /// The directories this watch's last scan asked for.
    dirs: BTreeMap<PathBuf, Interest>,
    /// inotify cannot cover this watch: it is scanned on an interval.
    polling: bool,
    /// Waiting until then for the kubelet to publish keys an update added.
    keys_until: Option<Instant>,
    /// Per-path fingerprints of the content last handed to the pipeline.
    previous: Vec<Fingerprint>,
}

struct Registration {
    dir: PathBuf,
    users: Vec<(usize, Interest)>,
}

pub struct Watcher {
    key: HashKey,
    inotify: Option<Inotify>,
    watches: Vec<WatchState>,
    registrations: HashMap<WatchDescriptor, Registration>,
    by_dir: HashMap<PathBuf, WatchDescriptor>,
}

impl Watcher {
    /// Sets up inotify for `watches` (relative paths are taken from `cwd`).
    /// Nothing is scanned yet: every watch is due at once.
    pub fn new(watches: &[config::Watch], cwd: &Path, now: Instant) -> Watcher {
        let inotify = if watches.is_empty() {
            None
        } else {
            match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
                Ok(i) => Some(i),
                Err(e) => {
                    tracing::warn!(
                        "inotify_init1() failed: {e}; {}every watch is scanned every {POLL_INTERVAL:?} instead",
                        limit_hint(e)
                    );
                    None
                }
            }
        };
        let polling = inotify.is_none();
        Watcher {
            key: HashKey::random(),
            inotify,
            watches: watches
                .iter()
                .map(|w| WatchState {
                    name: w.name.clone(),
                    paths: w.paths.iter().map(|p| cwd.join(p)).collect(),
                    debounce: w.debounce,
                    max_wait: max_wait(w.debounce),
                    due: Some(now),
                    first_unscanned: None,
                    dirs: BTreeMap::new(),
                    polling,
                    keys_until: None,
                    previous: Vec::new(),
                })
                .collect(),
            registrations: HashMap::new(),
            by_dir: HashMap::new(),
        }
    }

    /// The inotify fd to poll for readability, if inotify is in use.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.inotify.as_ref().map(|i| i.as_fd())
    }

    /// The next time a watch is due to be scanned.
    pub fn deadline(&self) -> Option<Instant> {
        self.watches.iter().filter_map(|w| w.due).min()
    }

    /// The watches due to be scanned now.
    pub fn take_due(&mut self, now: Instant) -> Vec<usize> {
        let mut due = Vec::new();
        for (i, w) in self.watches.iter_mut().enumerate() {
            if w.due.is_some_and(|d| d <= now) {
                w.due = None;
                w.first_unscanned = None;
                due.push(i);
            }
        }
        due
    }

    /// Reads every queued inotify event and schedules the watches they concern.
    pub fn read_events(&mut self, now: Instant) {
        let Some(inotify) = &self.inotify else { return };
        let mut events = Vec::new();
        loop {
            match inotify.read_events() {
                Ok(batch) => events.extend(batch),
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!("read() on the inotify fd failed: {e}");
                    break;
                }
            }
        }
        for ev in events {
            self.on_event(ev, now);
        }
    }

    fn on_event(&mut self, ev: InotifyEvent, now: Instant) {
        if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            tracing::warn!("the inotify queue overflowed: rescanning every watch");
            for i in 0..self.watches.len() {
                self.touch(i, Urgency::Settle, now);
            }
            return;
        }
        if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
            // The kernel dropped the watch: its directory is gone (or we
            // removed it, and then it is no longer registered).
            if let Some(reg) = self.registrations.remove(&ev.wd) {
                self.by_dir.remove(&reg.dir);
                for (i, _) in reg.users {
                    self.watches[i].dirs.remove(&reg.dir);
                    self.touch(i, Urgency::Settle, now);
                }
            }
            return;
        }
        let Some(reg) = self.registrations.get(&ev.wd) else {
            return;
        };
        let users: Vec<(usize, Urgency)> = reg
            .users
            .iter()
            .filter_map(|(i, interest)| match &ev.name {
                Some(name) if interest.matches(name) => Some((*i, urgency(name, ev.mask))),
                Some(_) => None,
                // The directory itself was deleted or moved.
                None => Some((*i, Urgency::Settle)),
            })
            .collect();
        for (i, u) in users {
            tracing::trace!(watch = self.watches[i].name, name = ?ev.name, mask = ?ev.mask, "inotify event");
            self.touch(i, u, now);
        }
    }

    fn touch(&mut self, i: usize, urgency: Urgency, now: Instant) {
        let w = &mut self.watches[i];
        let scan_now = urgency == Urgency::Now || w.keys_until.is_some();
        let latest = *w.first_unscanned.get_or_insert(now) + w.max_wait;
        w.due = match w.due {
            // A scan already due now stays due now.
            Some(d) if d <= now => Some(d),
            _ if scan_now => Some(now),
            _ => Some((now + w.debounce).min(latest)),
        };
    }

    /// Scans watch `i` and updates its inotify watches to what the scan
    /// found. Returns None while a kubelet update is still publishing the
    /// symlinks of keys it added (up to [`KEY_WAIT`]): the update is complete
    /// only once the service can see them.
    pub fn scan(&mut self, i: usize, now: Instant) -> Option<Scan> {
        let scan = scan::scan(&self.watches[i].paths, &self.key);
        if self.watches[i].polling && self.inotify.is_none() {
            // The instance limit may have been raised since.
            if let Ok(inotify) = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
                tracing::info!("inotify_init1() works again");
                self.inotify = Some(inotify);
            }
        }
        let registered = self.register(i, &scan.dirs, now);
        let w = &mut self.watches[i];
        if registered && w.polling {
            tracing::info!(
                watch = w.name,
                "inotify covers this watch again: it is no longer scanned on an interval"
            );
            w.polling = false;
        }
        if w.polling {
            w.due = Some(
                w.due
                    .map_or(now + POLL_INTERVAL, |d| d.min(now + POLL_INTERVAL)),
            );
        }
        if !scan.unpublished.is_empty() {
            let until = *w.keys_until.get_or_insert(now + KEY_WAIT);
            if now < until {
                tracing::debug!(watch = w.name, keys = ?scan.unpublished, "waiting for the kubelet to link new keys");
                w.due = Some(w.due.map_or(until, |d| d.min(until)));
                return None;
            }
            tracing::warn!(
                watch = w.name,
                keys = ?scan.unpublished,
                "keys of a kubelet update are still not linked after {KEY_WAIT:?}: going on without them"
            );
        }
        w.keys_until = None;
        Some(scan)
    }

    /// Makes inotify watch what `dirs` asks for on behalf of watch `i`.
    /// Returns false when inotify cannot (no instance, or a limit).
    fn register(&mut self, i: usize, dirs: &BTreeMap<PathBuf, Interest>, now: Instant) -> bool {
        let Some(inotify) = self.inotify.take() else {
            return false;
        };
        let ok = self.register_with(&inotify, i, dirs, now);
        self.inotify = Some(inotify);
        ok
    }

    fn register_with(
        &mut self,
        inotify: &Inotify,
        i: usize,
        dirs: &BTreeMap<PathBuf, Interest>,
        now: Instant,
    ) -> bool {
        let mut ok = true;
        let old = std::mem::take(&mut self.watches[i].dirs);
        for dir in old.keys().filter(|d| !dirs.contains_key(*d)) {
            if let Some(wd) = self.by_dir.get(dir).copied() {
                let reg = self
                    .registrations
                    .get_mut(&wd)
                    .expect("by_dir and registrations agree");
                reg.users.retain(|(u, _)| *u != i);
                if reg.users.is_empty() {
                    self.registrations.remove(&wd);
                    self.by_dir.remove(dir);
                    // EINVAL: the kernel already dropped it (directory deleted).
                    let _ = inotify.rm_watch(wd);
                }
            }
        }
        let mut kept = BTreeMap::new();
        for (dir, interest) in dirs {
            let wd = match self.by_dir.get(dir) {
                Some(wd) => *wd,
                None => match inotify.add_watch(dir.as_path(), DIR_EVENTS) {
                    Ok(wd) => {
                        self.by_dir.insert(dir.clone(), wd);
                        self.registrations
                            .entry(wd)
                            .or_insert_with(|| Registration {
                                dir: dir.clone(),
                                users: Vec::new(),
                            });
                        wd
                    }
                    Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => {
                        // Gone since the scan: scan again once things settle.
                        self.touch(i, Urgency::Settle, now);
                        continue;
                    }
                    Err(e) => {
                        ok = false;
                        let w = &mut self.watches[i];
                        if !w.polling {
                            tracing::warn!(
                                watch = w.name,
                                "inotify_add_watch({}) failed: {e}; {}scanning this watch every {POLL_INTERVAL:?} instead",
                                dir.display(),
                                limit_hint(e)
                            );
                            w.polling = true;
                            w.due = Some(now + POLL_INTERVAL);
                        }
                        continue;
                    }
                },
            };
            let reg = self.registrations.get_mut(&wd).expect("registered above");
            match reg.users.iter_mut().find(|(u, _)| *u == i) {
                Some((_, existing)) => *existing = interest.clone(),
                None => reg.users.push((i, interest.clone())),
            }
            kept.insert(dir.clone(), interest.clone());
        }
        self.watches[i].dirs = kept;
        ok
    }

    /// Per-path fingerprints of what watch `i` last saw (see [`Watcher::remember`]).
    pub fn previous(&self, i: usize) -> &[Fingerprint] {
        &self.watches[i].previous
    }

    /// Keeps the per-path fingerprints of a scan, to say which paths the
    /// next change touched.
    pub fn remember(&mut self, i: usize, scan: &Scan) {
        self.watches[i].previous.clone_from(&scan.per_path);
    }

    pub fn paths(&self, i: usize) -> &[PathBuf] {
        &self.watches[i].paths
    }
}

/// How long a watch that keeps changing may go unscanned: `debounce` waits
/// for quiet, this bounds the wait (consul-template's `wait { min max }`).
fn max_wait(debounce: Duration) -> Duration {
    (4 * debounce).max(MIN_MAX_WAIT)
}

fn urgency(name: &OsStr, mask: AddWatchFlags) -> Urgency {
    if name == "..data" && mask.intersects(AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CREATE) {
        Urgency::Now
    } else {
        Urgency::Settle
    }
}

/// Which sysctl to raise, for the errors that mean an inotify limit.
fn limit_hint(e: Errno) -> &'static str {
    match e {
        Errno::EMFILE => "raise fs.inotify.max_user_instances (or the fd limit); ",
        Errno::ENOSPC => "raise fs.inotify.max_user_watches; ",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn watcher(debounce_ms: u64, now: Instant) -> Watcher {
        let cfg = Config::parse(&format!(
            "[[watch]]\npaths = [\"/nonexistent\"]\non_change = \"none\"\ndebounce = \"{debounce_ms}ms\"\n"
        ))
        .unwrap();
        let mut w = Watcher::new(&cfg.watches, Path::new("/"), now);
        assert_eq!(w.take_due(now), vec![0], "every watch is scanned at start");
        w
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn debounce_waits_for_quiet() {
        let t0 = Instant::now();
        let mut w = watcher(100, t0);
        w.touch(0, Urgency::Settle, t0);
        assert_eq!(w.deadline(), Some(t0 + ms(100)));
        w.touch(0, Urgency::Settle, t0 + ms(60));
        assert_eq!(
            w.deadline(),
            Some(t0 + ms(160)),
            "each event restarts the quiet time"
        );
        assert!(w.take_due(t0 + ms(159)).is_empty());
        assert_eq!(w.take_due(t0 + ms(160)), vec![0]);
        assert_eq!(w.deadline(), None, "nothing is due once scanned: no timer");
    }

    #[test]
    fn a_watch_that_keeps_changing_is_scanned_within_its_max_wait() {
        let t0 = Instant::now();
        let mut w = watcher(100, t0);
        // A sibling appended every 50 ms never leaves 100 ms of quiet.
        let mut t = t0;
        while w.take_due(t).is_empty() {
            w.touch(0, Urgency::Settle, t);
            t += ms(50);
            assert!(t <= t0 + ms(1050), "not scanned within its max wait");
        }
        assert_eq!(
            t,
            t0 + ms(1000),
            "max(1 s, 4 x debounce) after the first event"
        );
        // The next max wait counts from the first event after that scan.
        w.touch(0, Urgency::Settle, t + ms(10));
        assert_eq!(w.deadline(), Some(t + ms(110)));
        assert_eq!(max_wait(ms(2000)), ms(8000));
    }

    #[test]
    fn a_kubelet_commit_is_scanned_at_once_and_later_events_do_not_delay_it() {
        let t0 = Instant::now();
        let mut w = watcher(100, t0);
        w.touch(0, Urgency::Settle, t0);
        w.touch(
            0,
            urgency(OsStr::new("..data"), AddWatchFlags::IN_MOVED_TO),
            t0 + ms(10),
        );
        assert_eq!(w.deadline(), Some(t0 + ms(10)));
        // The kubelet links a new key right after the rename.
        w.touch(0, Urgency::Settle, t0 + ms(10));
        assert_eq!(w.take_due(t0 + ms(10)), vec![0]);
    }

    #[test]
    fn only_the_rename_of_data_is_urgent() {
        assert_eq!(
            urgency(OsStr::new("..data"), AddWatchFlags::IN_MOVED_TO),
            Urgency::Now
        );
        assert_eq!(
            urgency(OsStr::new("..data"), AddWatchFlags::IN_CREATE),
            Urgency::Now
        );
        assert_eq!(
            urgency(OsStr::new("..data"), AddWatchFlags::IN_DELETE),
            Urgency::Settle
        );
        assert_eq!(
            urgency(OsStr::new("app.conf"), AddWatchFlags::IN_MOVED_TO),
            Urgency::Settle
        );
        assert_eq!(
            urgency(OsStr::new("app.conf"), AddWatchFlags::IN_CLOSE_WRITE),
            Urgency::Settle
        );
    }
}
