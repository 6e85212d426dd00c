//! The watcher's decisions, without the OS: which inotify watch descriptor
//! (wd) serves which watch and for which names, which watch is due to be
//! scanned when, and what a finished scan means. Events, scans and the time
//! come in; "scan these now", reports and wds to remove go out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InotifyEvent};

use super::scan::{Fingerprint, Interest, Scan, is_own_name};
use super::{POLL_INTERVAL, WatchId};
use crate::config;

/// How long to wait, after a kubelet update, for the symlinks of keys it
/// added before telling the service anyway.
pub const KEY_WAIT: Duration = Duration::from_secs(2);
/// The least of a watch's max wait (see [`max_wait`]).
const MIN_MAX_WAIT: Duration = Duration::from_secs(1);

/// How soon an event wants its watch scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Urgency {
    /// A kubelet update is complete: scan now.
    Now,
    /// Let the writer finish: scan after the watch's debounce of quiet.
    Settle,
}

/// An inotify event.
#[derive(Debug, Clone)]
pub struct Event {
    pub wd: i32,
    pub mask: AddWatchFlags,
    pub name: Option<OsString>,
}

impl From<InotifyEvent> for Event {
    fn from(ev: InotifyEvent) -> Event {
        Event {
            wd: ev.wd.as_raw(),
            mask: ev.mask,
            name: ev.name,
        }
    }
}

/// A scan to hand to the loop: what [`super::Report`] is made of.
#[derive(Debug)]
pub struct Scanned {
    pub watch: WatchId,
    pub fingerprint: Fingerprint,
    pub per_path: Vec<Fingerprint>,
    pub files: usize,
    pub missing: Vec<PathBuf>,
    pub unreadable: Vec<String>,
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
    /// The wds this watch's last scan registered.
    wds: BTreeSet<i32>,
    /// inotify cannot cover this watch: it is scanned on an interval.
    polling: bool,
    /// Waiting until then for the kubelet to publish keys an update added.
    keys_until: Option<Instant>,
}

/// One inotify watch: a directory, and what each watch needs from it.
struct Registration {
    dir: PathBuf,
    /// Names of tend's own files in it.
    own: Vec<OsString>,
    users: BTreeMap<usize, Interest>,
}

impl Registration {
    fn is_own(&self, name: &OsStr) -> bool {
        self.own.iter().any(|o| is_own_name(o, name))
    }
}

pub struct Books {
    watches: Vec<WatchState>,
    registrations: HashMap<i32, Registration>,
    counts: Counts,
}

/// What the watcher received, for /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// inotify events (a queue overflow is an error, not an event).
    pub events: u64,
    /// Queue overflows; scans for which inotify_add_watch failed (a limit
    /// hit), or that could not read part of the watch; failures of the
    /// inotify fd itself (see [`Books::error`]).
    pub errors: u64,
}

impl Books {
    /// Every watch is due at `now`; relative paths are taken from `cwd`.
    /// `polling`: inotify is not available, every watch is scanned on an
    /// interval.
    pub fn new(watches: &[config::Watch], cwd: &Path, polling: bool, now: Instant) -> Books {
        Books {
            watches: watches
                .iter()
                .map(|w| WatchState {
                    name: w.name.clone(),
                    paths: w.paths.iter().map(|p| cwd.join(p)).collect(),
                    debounce: w.debounce,
                    max_wait: max_wait(w.debounce),
                    due: Some(now),
                    first_unscanned: None,
                    wds: BTreeSet::new(),
                    polling,
                    keys_until: None,
                })
                .collect(),
            registrations: HashMap::new(),
            counts: Counts::default(),
        }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Counts an error of inotify itself (its init or a read failed).
    pub fn error(&mut self) {
        self.counts.errors += 1;
    }

    /// Each watch's absolute paths, in config order.
    pub fn paths(&self) -> impl Iterator<Item = &[PathBuf]> {
        self.watches.iter().map(|w| w.paths.as_slice())
    }

    /// The next time a watch is due to be scanned; None while nothing is
    /// pending (an idle watcher never wakes up).
    pub fn deadline(&self) -> Option<Instant> {
        self.watches.iter().filter_map(|w| w.due).min()
    }

    /// The watches due at `now`; their next events count from now on.
    pub fn take_due(&mut self, now: Instant) -> Vec<WatchId> {
        let mut due = Vec::new();
        for (i, w) in self.watches.iter_mut().enumerate() {
            if w.due.is_some_and(|d| d <= now) {
                w.due = None;
                w.first_unscanned = None;
                due.push(WatchId(i));
            }
        }
        due
    }

    /// Scans watch `id` as soon as possible.
    pub fn rescan(&mut self, id: WatchId, now: Instant) {
        self.touch(id.0, Urgency::Now, now);
    }

    /// Something anywhere may have changed (the mount table changed, the
    /// inotify queue overflowed): every watch is scanned once things settle.
    pub fn everything_may_have_changed(&mut self, now: Instant) {
        for i in 0..self.watches.len() {
            self.touch(i, Urgency::Settle, now);
        }
    }

    /// Schedules the watches an inotify event concerns.
    pub fn on_event(&mut self, ev: &Event, now: Instant) {
        if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            self.counts.errors += 1;
            tracing::warn!("the inotify queue overflowed: rescanning every watch");
            self.everything_may_have_changed(now);
            return;
        }
        self.counts.events += 1;
        if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
            // The kernel dropped the watch: its directory was deleted, or its
            // filesystem unmounted (IN_UNMOUNT came first). The next scan
            // registers whatever is there now.
            if let Some(reg) = self.registrations.remove(&ev.wd) {
                for i in reg.users.into_keys() {
                    self.watches[i].wds.remove(&ev.wd);
                    self.touch(i, Urgency::Settle, now);
                }
            }
            return;
        }
        let Some(reg) = self.registrations.get(&ev.wd) else {
            return;
        };
        let touched: Vec<(usize, Urgency)> = reg
            .users
            .iter()
            .filter_map(|(i, interest)| match &ev.name {
                Some(name) if interest.matches(name) && !reg.is_own(name) => {
                    Some((*i, urgency(name, ev.mask)))
                }
                Some(_) => None,
                // The directory itself was deleted or moved, or its
                // filesystem unmounted.
                None => Some((*i, Urgency::Settle)),
            })
            .collect();
        for (i, u) in touched {
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

    /// Takes in a finished scan of `id`, made with inotify when
    /// `with_inotify`: its directories become the watch's registrations, and
    /// the scan is handed on unless a kubelet update is still publishing
    /// the symlinks of keys it added (up to [`KEY_WAIT`]): the update is
    /// complete only once the service can see them.
    pub fn on_scanned(
        &mut self,
        id: WatchId,
        scan: Scan,
        with_inotify: bool,
        now: Instant,
    ) -> Option<Scanned> {
        let i = id.0;
        let Scan {
            fingerprint,
            per_path,
            files,
            missing,
            unreadable,
            unpublished,
            dirs,
        } = scan;
        let mut covered = with_inotify;
        let mut gone = false;
        let mut failed = false;
        let mut wds = BTreeSet::new();
        for (dir, d) in dirs {
            match d.wd {
                Ok(Some(wd)) => {
                    let reg = self
                        .registrations
                        .entry(wd)
                        .or_insert_with(|| Registration {
                            dir: dir.clone(),
                            own: Vec::new(),
                            users: BTreeMap::new(),
                        });
                    reg.dir = dir;
                    reg.own = d.own;
                    reg.users.insert(i, d.interest);
                    wds.insert(wd);
                }
                Ok(None) => covered = false,
                // Gone since the scan looked: scan again once things settle.
                Err(Errno::ENOENT | Errno::ENOTDIR) => gone = true,
                Err(e) => {
                    covered = false;
                    failed = true;
                    let w = &mut self.watches[i];
                    if !w.polling {
                        tracing::warn!(
                            watch = w.name,
                            "inotify_add_watch({}) failed: {e}; {}scanning this watch every {POLL_INTERVAL:?} instead",
                            dir.display(),
                            limit_hint(e)
                        );
                        w.polling = true;
                    }
                }
            }
        }
        self.counts.errors += u64::from(failed) + u64::from(!unreadable.is_empty());
        let old = std::mem::replace(&mut self.watches[i].wds, wds);
        for wd in old.difference(&self.watches[i].wds) {
            if let Some(reg) = self.registrations.get_mut(wd) {
                reg.users.remove(&i);
            }
        }
        if gone {
            self.touch(i, Urgency::Settle, now);
        }
        let w = &mut self.watches[i];
        if covered && w.polling {
            tracing::info!(
                watch = w.name,
                "inotify covers this watch again: it is no longer scanned on an interval"
            );
            w.polling = false;
        }
        if w.polling {
            let next = now + POLL_INTERVAL;
            w.due = Some(w.due.map_or(next, |d| d.min(next)));
        }
        if !unpublished.is_empty() {
            let until = *w.keys_until.get_or_insert(now + KEY_WAIT);
            if now < until {
                tracing::debug!(watch = w.name, keys = ?unpublished, "waiting for the kubelet to link new keys");
                w.due = Some(w.due.map_or(until, |d| d.min(until)));
                return None;
            }
            tracing::warn!(
                watch = w.name,
                keys = ?unpublished,
                "keys of a kubelet update are still not linked after {KEY_WAIT:?}: going on without them"
            );
        }
        w.keys_until = None;
        Some(Scanned {
            watch: id,
            fingerprint,
            per_path,
            files,
            missing,
            unreadable,
        })
    }

    /// Drops the registrations no watch uses any more; the caller removes
    /// their inotify watches. Returns (wd, directory).
    pub fn take_unused(&mut self) -> Vec<(i32, PathBuf)> {
        let unused: Vec<i32> = self
            .registrations
            .iter()
            .filter(|(_, r)| r.users.is_empty())
            .map(|(wd, _)| *wd)
            .collect();
        unused
            .into_iter()
            .filter_map(|wd| Some((wd, self.registrations.remove(&wd)?.dir)))
            .collect()
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
pub fn limit_hint(e: Errno) -> &'static str {
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
    use crate::watch::scan::{Dir, test_fingerprint};

    /// Books of `n` watches on `/w0`, `/w1`, ..., whose first scans
    /// (registering nothing) are done.
    fn books(n: usize, debounce_ms: u64, now: Instant) -> Books {
        let mut toml = String::new();
        for i in 0..n {
            toml += &format!(
                "[[watch]]\nname = \"w{i}\"\npaths = [\"/w{i}\"]\non_change = \"none\"\ndebounce = \"{debounce_ms}ms\"\n"
            );
        }
        let cfg = Config::parse(&toml).unwrap();
        let mut b = Books::new(&cfg.watches, Path::new("/"), false, now);
        let all: Vec<WatchId> = (0..n).map(WatchId).collect();
        assert_eq!(b.take_due(now), all, "every watch is scanned at start");
        for id in all {
            assert!(b.on_scanned(id, scan(&[]), true, now).is_some());
        }
        assert_eq!(b.deadline(), None);
        b
    }

    /// A scan that registered `dirs` as (path, wd, names it needs; empty: all).
    fn scan(dirs: &[(&str, i32, &[&str])]) -> Scan {
        Scan {
            fingerprint: test_fingerprint(1),
            per_path: vec![test_fingerprint(1)],
            files: 1,
            missing: Vec::new(),
            unreadable: Vec::new(),
            unpublished: Vec::new(),
            dirs: dirs
                .iter()
                .map(|(dir, wd, names)| {
                    let interest = if names.is_empty() {
                        Interest::All
                    } else {
                        Interest::Names(names.iter().map(OsString::from).collect())
                    };
                    let d = Dir {
                        interest,
                        wd: Ok(Some(*wd)),
                        own: Vec::new(),
                    };
                    (PathBuf::from(dir), d)
                })
                .collect(),
        }
    }

    fn event(wd: i32, name: Option<&str>, mask: AddWatchFlags) -> Event {
        Event {
            wd,
            mask,
            name: name.map(OsString::from),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn touched(b: &mut Books, i: usize, now: Instant) {
        b.touch(i, Urgency::Settle, now)
    }

    #[test]
    fn debounce_waits_for_quiet() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        touched(&mut b, 0, t0);
        assert_eq!(b.deadline(), Some(t0 + ms(100)));
        touched(&mut b, 0, t0 + ms(60));
        assert_eq!(
            b.deadline(),
            Some(t0 + ms(160)),
            "each event restarts the quiet time"
        );
        assert!(b.take_due(t0 + ms(159)).is_empty());
        assert_eq!(b.take_due(t0 + ms(160)), [WatchId(0)]);
        assert_eq!(b.deadline(), None, "nothing is due once scanned: no timer");
    }

    #[test]
    fn a_watch_that_keeps_changing_is_scanned_within_its_max_wait() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        // A sibling appended every 50 ms never leaves 100 ms of quiet.
        let mut t = t0;
        while b.take_due(t).is_empty() {
            touched(&mut b, 0, t);
            t += ms(50);
            assert!(t <= t0 + ms(1050), "not scanned within its max wait");
        }
        assert_eq!(
            t,
            t0 + ms(1000),
            "max(1 s, 4 x debounce) after the first event"
        );
        // The next max wait counts from the first event after that scan.
        touched(&mut b, 0, t + ms(10));
        assert_eq!(b.deadline(), Some(t + ms(110)));
        assert_eq!(max_wait(ms(2000)), ms(8000));
    }

    #[test]
    fn a_kubelet_commit_is_scanned_at_once_and_later_events_do_not_delay_it() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        b.on_scanned(
            WatchId(0),
            scan(&[("/", 3, &["w0"]), ("/w0", 7, &[])]),
            true,
            t0,
        );
        b.on_event(&event(7, Some("a.conf"), AddWatchFlags::IN_CLOSE_WRITE), t0);
        b.on_event(
            &event(7, Some("..data"), AddWatchFlags::IN_MOVED_TO),
            t0 + ms(10),
        );
        assert_eq!(b.deadline(), Some(t0 + ms(10)));
        // The kubelet links a new key right after the rename.
        b.on_event(
            &event(7, Some("new.conf"), AddWatchFlags::IN_CREATE),
            t0 + ms(10),
        );
        assert_eq!(b.take_due(t0 + ms(10)), [WatchId(0)]);
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

    #[test]
    fn events_count_for_the_names_the_last_scan_needs() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &["a"])]), true, t0);
        b.on_event(&event(7, Some("b"), AddWatchFlags::IN_CLOSE_WRITE), t0);
        b.on_event(&event(8, Some("a"), AddWatchFlags::IN_CLOSE_WRITE), t0);
        assert_eq!(b.deadline(), None, "not a name nor a directory it needs");
        // The next scan needs b too: an event the kernel queued during that
        // scan is read after it, and counts.
        b.rescan(WatchId(0), t0);
        b.take_due(t0);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &["a", "b"])]), true, t0);
        b.on_event(&event(7, Some("b"), AddWatchFlags::IN_CLOSE_WRITE), t0);
        assert_eq!(b.deadline(), Some(t0 + ms(100)));
    }

    #[test]
    fn a_directory_dropped_by_the_kernel_is_scanned_again() {
        let t0 = Instant::now();
        let mut b = books(2, 100, t0);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &[])]), true, t0);
        b.on_scanned(
            WatchId(1),
            scan(&[("/w0", 7, &["a"]), ("/w1", 8, &[])]),
            true,
            t0,
        );
        // Unmounted: IN_UNMOUNT, then IN_IGNORED.
        b.on_event(&event(7, None, AddWatchFlags::IN_UNMOUNT), t0);
        b.on_event(&event(7, None, AddWatchFlags::IN_IGNORED), t0);
        assert!(b.watches.iter().all(|w| w.due == Some(t0 + ms(100))));
        assert!(!b.registrations.contains_key(&7), "a dead wd is not kept");
        assert_eq!(b.watches[1].wds, BTreeSet::from([8]));
        // Events for it, should any still come, concern nobody.
        b.take_due(t0 + ms(100));
        b.on_event(
            &event(7, Some("a"), AddWatchFlags::IN_CLOSE_WRITE),
            t0 + ms(100),
        );
        assert_eq!(b.deadline(), None);
    }

    #[test]
    fn a_directory_deleted_or_moved_schedules_its_watches() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &["a"])]), true, t0);
        b.on_event(&event(7, None, AddWatchFlags::IN_MOVE_SELF), t0);
        assert_eq!(b.deadline(), Some(t0 + ms(100)));
    }

    #[test]
    fn inotify_watches_no_scan_uses_are_handed_back_for_removal() {
        let t0 = Instant::now();
        let mut b = books(2, 100, t0);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &[])]), true, t0);
        b.on_scanned(WatchId(1), scan(&[("/w1", 8, &[])]), true, t0);
        assert!(b.take_unused().is_empty());
        // w0 moved elsewhere; w1 now uses w0's old directory as well.
        b.on_scanned(WatchId(0), scan(&[("/elsewhere", 9, &[])]), true, t0);
        b.on_scanned(
            WatchId(1),
            scan(&[("/w1", 8, &[]), ("/w0", 7, &[])]),
            true,
            t0,
        );
        assert!(b.take_unused().is_empty(), "7 is still used by w1");
        b.on_scanned(WatchId(1), scan(&[("/w1", 8, &[])]), true, t0);
        assert_eq!(b.take_unused(), [(7, PathBuf::from("/w0"))]);
        assert!(!b.registrations.contains_key(&7));
    }

    #[test]
    fn events_for_tends_own_files_schedule_nothing() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        let mut s = scan(&[("/w0", 7, &[])]);
        s.dirs.get_mut(Path::new("/w0")).unwrap().own = vec!["ready".into()];
        b.on_scanned(WatchId(0), s, true, t0);
        for name in ["ready", ".ready.0123456789abcdef.tmp", ".ready.tmp.42"] {
            b.on_event(&event(7, Some(name), AddWatchFlags::IN_MOVED_TO), t0);
        }
        assert_eq!(b.deadline(), None);
        b.on_event(&event(7, Some("app.conf"), AddWatchFlags::IN_MOVED_TO), t0);
        assert_eq!(b.deadline(), Some(t0 + ms(100)));
    }

    #[test]
    fn a_queue_overflow_or_a_mount_change_schedules_every_watch() {
        let t0 = Instant::now();
        let mut b = books(2, 100, t0);
        b.on_event(&event(-1, None, AddWatchFlags::IN_Q_OVERFLOW), t0);
        assert_eq!(b.take_due(t0 + ms(100)), [WatchId(0), WatchId(1)]);
        b.everything_may_have_changed(t0 + ms(200));
        assert_eq!(b.take_due(t0 + ms(300)), [WatchId(0), WatchId(1)]);
    }

    #[test]
    fn a_kubelet_update_is_handed_on_once_its_new_keys_are_linked() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        b.rescan(WatchId(0), t0);
        b.take_due(t0);
        let mut s = scan(&[("/w0", 7, &[])]);
        s.unpublished = vec!["/w0/new.conf".into()];
        assert!(b.on_scanned(WatchId(0), s, true, t0).is_none(), "held back");
        assert_eq!(b.deadline(), Some(t0 + KEY_WAIT));
        // The kubelet links the key: scanned at once, not after the debounce.
        b.on_event(
            &event(7, Some("new.conf"), AddWatchFlags::IN_CREATE),
            t0 + ms(1),
        );
        assert_eq!(b.take_due(t0 + ms(1)), [WatchId(0)]);
        assert!(
            b.on_scanned(WatchId(0), scan(&[("/w0", 7, &[])]), true, t0 + ms(2))
                .is_some()
        );
        // Never linked: handed on after KEY_WAIT anyway.
        b.rescan(WatchId(0), t0 + ms(10));
        b.take_due(t0 + ms(10));
        let mut s = scan(&[("/w0", 7, &[])]);
        s.unpublished = vec!["/w0/other.conf".into()];
        assert!(b.on_scanned(WatchId(0), s, true, t0 + ms(10)).is_none());
        let late = t0 + ms(10) + KEY_WAIT;
        assert_eq!(b.take_due(late), [WatchId(0)]);
        let mut s = scan(&[("/w0", 7, &[])]);
        s.unpublished = vec!["/w0/other.conf".into()];
        assert!(b.on_scanned(WatchId(0), s, true, late).is_some());
    }

    #[test]
    fn a_watch_inotify_cannot_cover_is_scanned_on_an_interval_until_it_can() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        let mut s = scan(&[("/w0", 7, &[])]);
        s.dirs.get_mut(Path::new("/w0")).unwrap().wd = Err(Errno::ENOSPC);
        b.on_scanned(WatchId(0), s, true, t0);
        assert!(b.watches[0].polling);
        assert_eq!(b.deadline(), Some(t0 + POLL_INTERVAL));
        let t1 = t0 + POLL_INTERVAL;
        assert_eq!(b.take_due(t1), [WatchId(0)]);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &[])]), true, t1);
        assert!(!b.watches[0].polling);
        assert_eq!(b.deadline(), None, "no timer once inotify covers it");
    }

    #[test]
    fn without_inotify_every_watch_is_scanned_on_an_interval() {
        let t0 = Instant::now();
        let cfg = Config::parse("[[watch]]\npaths = [\"/w\"]\non_change = \"none\"\n").unwrap();
        let mut b = Books::new(&cfg.watches, Path::new("/"), true, t0);
        b.take_due(t0);
        let mut s = scan(&[]);
        s.dirs.insert(
            PathBuf::from("/w"),
            Dir {
                interest: Interest::All,
                wd: Ok(None),
                own: Vec::new(),
            },
        );
        b.on_scanned(WatchId(0), s, false, t0);
        assert_eq!(b.deadline(), Some(t0 + POLL_INTERVAL));
    }

    #[test]
    fn a_directory_gone_before_it_was_registered_is_scanned_again() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        let mut s = scan(&[("/w0", 7, &[])]);
        s.dirs.get_mut(Path::new("/w0")).unwrap().wd = Err(Errno::ENOENT);
        b.on_scanned(WatchId(0), s, true, t0);
        assert!(!b.watches[0].polling, "not a limit");
        assert_eq!(b.deadline(), Some(t0 + ms(100)));
    }

    #[test]
    fn events_and_errors_are_counted_for_metrics() {
        let t0 = Instant::now();
        let mut b = books(1, 100, t0);
        b.on_scanned(WatchId(0), scan(&[("/w0", 7, &[])]), true, t0);
        b.on_event(&event(7, Some("a"), AddWatchFlags::IN_CREATE), t0);
        b.on_event(&event(7, Some("..data"), AddWatchFlags::IN_MOVED_TO), t0);
        b.on_event(&event(99, Some("b"), AddWatchFlags::IN_CREATE), t0);
        assert_eq!(
            b.counts(),
            Counts {
                events: 3,
                errors: 0
            },
            "every event received, whether it concerns a watch or not"
        );
        b.on_event(&event(-1, None, AddWatchFlags::IN_Q_OVERFLOW), t0);
        assert_eq!(b.counts().errors, 1, "an overflow is an error");
        // A scan with a limit hit on two directories and a file it cannot
        // read: one error each.
        let mut s = scan(&[("/w0", 7, &[]), ("/w0/sub", 8, &[])]);
        for d in s.dirs.values_mut() {
            d.wd = Err(Errno::ENOSPC);
        }
        s.unreadable = vec!["/w0/key: Permission denied".into()];
        b.on_scanned(WatchId(0), s, true, t0);
        assert_eq!(b.counts().errors, 3);
        // A directory that vanished is no error.
        let mut s = scan(&[("/w0", 7, &[])]);
        s.dirs.get_mut(Path::new("/w0")).unwrap().wd = Err(Errno::ENOENT);
        b.on_scanned(WatchId(0), s, true, t0);
        b.error();
        assert_eq!(
            b.counts(),
            Counts {
                events: 3,
                errors: 4
            }
        );
    }
}
