//! The watcher's thread: it owns the inotify fd, the mount table's fd and
//! the watches' timers, and makes every filesystem call of a scan
//! (resolving paths, reading directories, opening and hashing files,
//! inotify_add_watch), in its own `ppoll` loop. A large file, a slow or hung
//! filesystem holds up this thread, never PID 1's loop: signals, reaping and
//! deadlines keep flowing while files are hashed.
//!
//! Finished scans are queued for the loop (at most one per watch: a newer
//! one replaces one not taken yet) and an eventfd write wakes the loop's
//! `ppoll`; the loop asks for a scan the same way in the other direction.
//! Each side takes the locks only for a push or a pop, never across a
//! filesystem call, so the loop never waits on the thread. The thread blocks
//! every signal and never touches a process. It ends when the [`Handle`] is
//! dropped and its scan in progress is done; nobody waits for it (tend's
//! exit ends it).
//!
//! A mutex and eventfds rather than std's channels: the same job for a
//! fraction of the code, and the static binary's size is most of PID 1's
//! resident memory.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
use nix::sys::time::TimeSpec;

use super::books::{Books, Counts, Event, Scanned, limit_hint};
use super::publish;
use super::scan::{self, Fingerprint, HashKey, OwnFiles, Registrar};
use super::{POLL_INTERVAL, WatchId};
use crate::config;
use crate::core::protocol::{Candidate, Done, SnapshotError};

/// What the thread's deepest call chain needs (a few KiB per directory
/// level, with [`scan::MAX_DEPTH`] levels at most) with a wide margin; every
/// buffer is on the heap.
const STACK_SIZE: usize = 256 * 1024;

/// read()s of the inotify fd per turn of the loop (4 KiB each), so a flood
/// of events cannot keep due scans waiting.
const MAX_READS: usize = 64;

/// A scan of more files than this lists and sorts enough names to leave
/// the heap larger than tend needs when idle: it is trimmed after.
const TRIM_AFTER_FILES: usize = 1000;

/// What inotify reports for a watched directory.
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

/// The loop's end of the thread.
pub struct Handle {
    shared: Arc<Shared>,
}

/// What the loop and the thread share.
struct Shared {
    /// What the thread has for the loop.
    out: Mutex<Out>,
    /// What the loop asks of the thread.
    asked: Mutex<Asked>,
    /// Written when a scan is queued (and when the thread ends).
    to_loop: EventFd,
    /// Written when the loop asks something.
    to_thread: EventFd,
    /// False once the thread has ended.
    alive: AtomicBool,
    /// What the books counted: events, errors.
    counts: [AtomicU64; 2],
}

/// Under one lock, so the loop sees a snapshot's scan no later than its
/// result.
#[derive(Default)]
struct Out {
    /// Scans, at most one per watch.
    scanned: Vec<Scanned>,
    /// Results of what the loop asked, in order.
    done: Vec<Done>,
}

#[derive(Default)]
struct Asked {
    rescan: Vec<WatchId>,
    /// Snapshots, publications and removals, in the order asked.
    requests: Vec<Request>,
    /// The [`Handle`] was dropped: the thread ends.
    stop: bool,
}

/// What the loop asks of a `publish` directory.
#[derive(Debug)]
pub enum Request {
    /// Copy the watch into a candidate generation, if its content still has
    /// this fingerprint.
    Snapshot(WatchId, Fingerprint),
    /// Make this candidate the published generation; keep the one it
    /// replaces when asked (to roll back to).
    Publish {
        watch: WatchId,
        fingerprint: Fingerprint,
        candidate: PathBuf,
        keep: publish::Keep,
    },
    /// Publish this earlier generation again (`verify` failed for the
    /// content with this fingerprint).
    Rollback(WatchId, Fingerprint, PathBuf),
    /// Publish this kept generation again, and remove the one published
    /// after it, before the content with this fingerprint is copied.
    Withdraw(WatchId, Fingerprint, PathBuf),
    /// Remove this candidate.
    Discard(WatchId, PathBuf),
}

/// What [`Handle::take`] found.
pub enum Taken {
    Some(Vec<Scanned>, Vec<Done>),
    /// The thread ended (it panicked or its `ppoll` failed): no scan will come.
    Gone,
}

impl Handle {
    /// Starts the thread for `watches` (relative paths taken from `cwd`),
    /// never covering `own` (what tend writes itself). Every watch is
    /// scanned at once.
    pub fn start(
        watches: &[config::Watch],
        env_from: &[PathBuf],
        owners: &[Option<(u32, u32)>],
        cwd: &Path,
        own: OwnFiles,
        now: Instant,
    ) -> anyhow::Result<Handle> {
        let eventfd = || EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC);
        let shared = Arc::new(Shared {
            out: Mutex::new(Out::default()),
            asked: Mutex::new(Asked::default()),
            to_loop: eventfd()
                .context("eventfd() failed: tend cannot hear from its watcher thread")?,
            to_thread: eventfd()
                .context("eventfd() failed: tend cannot talk to its watcher thread")?,
            alive: AtomicBool::new(true),
            counts: Default::default(),
        });
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::warn!(
                    "inotify_init1() failed: {e}; {}every watch is scanned every {POLL_INTERVAL:?} instead",
                    limit_hint(e)
                );
                None
            }
        };
        // POLLPRI on every change of the mount table: a volume mounted over
        // a watched directory raises no inotify event at all.
        let mount_table = match File::open("/proc/self/mountinfo") {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(
                    "cannot open /proc/self/mountinfo: {e}; a volume mounted or unmounted over a \
                     watched path is not noticed until something changes inside it"
                );
                None
            }
        };
        let mut books = Books::new(watches, cwd, inotify.is_none(), now);
        if inotify.is_none() {
            books.error();
        }
        let publish: Vec<Option<PathBuf>> = watches
            .iter()
            .map(|w| w.publish.as_ref().map(|p| cwd.join(p)))
            .collect();
        let worker = Worker {
            env_from: publish
                .iter()
                .map(|dir| {
                    let Some(dir) = dir else { return Vec::new() };
                    env_from
                        .iter()
                        .filter_map(|p| Some(cwd.join(p).strip_prefix(dir).ok()?.to_path_buf()))
                        .collect()
                })
                .collect(),
            publish,
            owners: owners.to_vec(),
            first: vec![true; watches.len()],
            paths: books.paths().map(<[PathBuf]>::to_vec).collect(),
            books,
            inotify,
            mount_table,
            key: HashKey::random(),
            own,
            shared: shared.clone(),
            requests: Vec::new(),
        };
        one_malloc_arena();
        std::thread::Builder::new()
            .name("watcher".into())
            .stack_size(STACK_SIZE)
            .spawn(move || worker.run())
            .context("cannot start the thread that watches config files")?;
        Ok(Handle { shared })
    }

    /// Polled for POLLIN: scans are waiting.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.shared.to_loop.as_fd()
    }

    /// Takes the scans waiting; `woke`: poll() said the fd was ready, and
    /// its wake-up is cleared (scans queued after this wake the loop again).
    /// Never waits for the thread.
    pub fn take(&self, woke: bool) -> Taken {
        if woke {
            clear(&self.shared.to_loop, "the watcher's eventfd");
        }
        // Whether it ended is read first: its last scans are queued by then.
        let alive = self.shared.alive.load(Ordering::Acquire);
        match self.shared.out.lock() {
            Ok(mut out) if alive || !out.scanned.is_empty() || !out.done.is_empty() => Taken::Some(
                std::mem::take(&mut out.scanned),
                std::mem::take(&mut out.done),
            ),
            _ => Taken::Gone,
        }
    }

    /// What the watcher counted so far.
    pub fn counts(&self) -> Counts {
        let [events, errors] = &self.shared.counts;
        Counts {
            events: events.load(Ordering::Relaxed),
            errors: errors.load(Ordering::Relaxed),
        }
    }

    /// Asks for `request`; its result comes with the scans.
    pub fn ask(&self, request: Request) {
        if let Ok(mut asked) = self.shared.asked.lock() {
            asked.requests.push(request);
            drop(asked);
            wake(&self.shared.to_thread);
        }
    }

    /// Asks for watch `id` to be scanned at once.
    pub fn rescan(&self, id: WatchId) {
        if let Ok(mut asked) = self.shared.asked.lock() {
            if !asked.rescan.contains(&id) {
                asked.rescan.push(id);
            }
            drop(asked);
            wake(&self.shared.to_thread);
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Ok(mut asked) = self.shared.asked.lock() {
            asked.stop = true;
        }
        wake(&self.shared.to_thread);
    }
}

/// The thread's state.
struct Worker {
    books: Books,
    paths: Vec<Vec<PathBuf>>,
    /// Each watch's `publish` directory (absolute).
    publish: Vec<Option<PathBuf>>,
    /// Per watch, the service's `env_from` paths inside its `publish`
    /// directory, relative to it: what a candidate must hold readable.
    env_from: Vec<Vec<PathBuf>>,
    /// Per watch, the uid and gid a candidate copy is given: its service's
    /// user's, when tend (root) runs the service as another user.
    owners: Vec<Option<(u32, u32)>>,
    /// Watches not snapshotted yet: their first candidate is compared with
    /// what an earlier tend rolled back.
    first: Vec<bool>,
    inotify: Option<Inotify>,
    mount_table: Option<File>,
    key: HashKey,
    own: OwnFiles,
    shared: Arc<Shared>,
    /// Taken from [`Asked`], served before due scans.
    requests: Vec<Request>,
}

#[derive(Default)]
struct Ready {
    asked: bool,
    inotify: bool,
    mount_table: bool,
}

impl Worker {
    fn run(mut self) {
        // Signals are for the loop's signalfd. The thread starts with the
        // loop's mask (every handled signal blocked), so none can reach it
        // before this.
        if let Err(e) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None) {
            tracing::error!("pthread_sigmask() in the watcher thread failed: {e}");
        }
        // However the thread ends (a panic too), the loop learns it.
        struct Ended(Arc<Shared>);
        impl Drop for Ended {
            fn drop(&mut self) {
                self.0.alive.store(false, Ordering::Release);
                wake(&self.0.to_loop);
            }
        }
        let _ended = Ended(self.shared.clone());
        loop {
            self.serve();
            self.scan_due();
            self.remove_unused();
            self.share_counts();
            let ready = match self.wait() {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::error!(
                        "ppoll() in the watcher thread failed: {e}; changes to watched files are no longer seen"
                    );
                    return;
                }
            };
            let now = Instant::now();
            if ready.asked && !self.take_asked(now) {
                return;
            }
            if ready.inotify {
                self.read_events(now);
            }
            if ready.mount_table {
                tracing::debug!("the mount table changed: scanning every watch again");
                self.books.everything_may_have_changed(now);
            }
        }
    }

    /// Sleeps until something is ready or a watch is due (with nothing due,
    /// for as long as nothing happens).
    fn wait(&self) -> Result<Ready, Errno> {
        let timeout = self
            .books
            .deadline()
            .map(|d| TimeSpec::from_duration(d.saturating_duration_since(Instant::now())));
        let mut fds = vec![PollFd::new(
            self.shared.to_thread.as_fd(),
            PollFlags::POLLIN,
        )];
        if let Some(i) = &self.inotify {
            fds.push(PollFd::new(i.as_fd(), PollFlags::POLLIN));
        }
        if let Some(m) = &self.mount_table {
            fds.push(PollFd::new(m.as_fd(), PollFlags::POLLPRI));
        }
        match ppoll(&mut fds, timeout, None) {
            Ok(_) => {}
            // Every signal is blocked here; were one not, just go round.
            Err(Errno::EINTR) => return Ok(Ready::default()),
            Err(e) => return Err(e),
        }
        let ready = |at: usize| {
            fds.get(at)
                .and_then(PollFd::revents)
                .is_some_and(|r| !r.is_empty())
        };
        let inotify_at = self.inotify.as_ref().map(|_| 1);
        let mount_at = self.mount_table.as_ref().map(|_| fds.len() - 1);
        Ok(Ready {
            asked: ready(0),
            inotify: inotify_at.is_some_and(ready),
            // The poll itself consumed the change: this is the only word of it.
            mount_table: mount_at.is_some_and(ready),
        })
    }

    /// Takes in what the loop asked; false when the thread is to end.
    fn take_asked(&mut self, now: Instant) -> bool {
        clear(&self.shared.to_thread, "the watcher thread's eventfd");
        let Ok(mut asked) = self.shared.asked.lock() else {
            return false;
        };
        if asked.stop {
            return false;
        }
        for id in std::mem::take(&mut asked.rescan) {
            self.books.rescan(id, now);
        }
        self.requests.append(&mut asked.requests);
        true
    }

    /// Carries out what the loop asked of `publish` directories.
    fn serve(&mut self) {
        for request in std::mem::take(&mut self.requests) {
            match request {
                Request::Snapshot(id, fp) => {
                    let result = self.snapshot(id, fp);
                    self.finished(Done::Snapshot {
                        watch: id,
                        fingerprint: fp,
                        result,
                    });
                }
                Request::Publish {
                    watch,
                    fingerprint,
                    candidate,
                    keep,
                } => {
                    let result = match &self.publish[watch.0] {
                        Some(dir) => {
                            publish::publish(dir, &candidate, &keep).map_err(|e| {
                                // A candidate that cannot be published is of no use.
                                let _ = publish::discard(dir, &candidate);
                                e.to_string()
                            })
                        }
                        None => Err("the watch has no `publish` directory".into()),
                    };
                    self.finished(Done::Published {
                        watch,
                        fingerprint,
                        result,
                    });
                }
                Request::Rollback(id, fp, generation) => {
                    let result = match &self.publish[id.0] {
                        Some(dir) => {
                            publish::roll_back(dir, &generation).map_err(|e| e.to_string())
                        }
                        None => Err("the watch has no `publish` directory".into()),
                    };
                    self.finished(Done::RolledBack {
                        watch: id,
                        fingerprint: fp,
                        result,
                    });
                }
                Request::Withdraw(id, fp, kept) => {
                    let result = match &self.publish[id.0] {
                        Some(dir) => publish::withdraw(dir, &kept).map_err(|e| e.to_string()),
                        None => Err("the watch has no `publish` directory".into()),
                    };
                    self.finished(Done::Withdrawn {
                        watch: id,
                        fingerprint: fp,
                        result,
                    });
                }
                Request::Discard(id, candidate) => {
                    if let Some(dir) = &self.publish[id.0]
                        && let Err(e) = publish::discard(dir, &candidate)
                    {
                        tracing::warn!("cannot remove a rejected candidate: {e}");
                    }
                }
            }
        }
    }

    /// Copies watch `id` into a new candidate generation, through the same
    /// scan that fingerprints it: the candidate holds exactly the content
    /// whose fingerprint is `fp`, or there is none. The scan counts as any
    /// scan of the watch.
    fn snapshot(&mut self, id: WatchId, fp: Fingerprint) -> Result<Candidate, SnapshotError> {
        let Some(dir) = self.publish[id.0].clone() else {
            return Err(SnapshotError::Failed(
                "the watch has no `publish` directory".into(),
            ));
        };
        let candidate =
            publish::create_generation(&dir).map_err(|e| SnapshotError::Failed(e.to_string()))?;
        let mut registrar = InotifyRegistrar(self.inotify.as_ref());
        let (scan, copied) = scan::scan_copying(
            &self.paths[id.0],
            &self.key,
            &self.own,
            &mut registrar,
            &candidate,
        );
        let same = scan.fingerprint == fp;
        let with_inotify = self.inotify.is_some();
        if let Some(scanned) = self
            .books
            .on_scanned(id, scan, with_inotify, Instant::now())
        {
            self.post(scanned);
        }
        let unusable = match copy_outcome(copied, same) {
            Ok(()) => {
                let first = std::mem::replace(&mut self.first[id.0], false);
                let owned = match self.owners.get(id.0).copied().flatten() {
                    Some((uid, gid)) => give(&candidate, uid, gid).map_err(|e| {
                        SnapshotError::Failed(format!(
                            "cannot give the copy {} to the service's user (uid {uid}, gid \
                             {gid}): {e}",
                            candidate.display()
                        ))
                    }),
                    None => Ok(()),
                };
                match owned.and_then(|()| {
                    self.env_from_of(id, &dir, &candidate)
                        .map_err(SnapshotError::Rejected)
                }) {
                    Ok(()) => {
                        let rejected = first
                            && publish::was_rejected(&dir, &candidate).unwrap_or_else(|e| {
                                tracing::warn!(
                                    "cannot tell whether the config was rolled back before: {e}"
                                );
                                false
                            });
                        return Ok(Candidate {
                            dir: candidate,
                            rejected,
                        });
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        if let Err(e) = publish::discard(&dir, &candidate) {
            tracing::warn!("cannot remove an unusable candidate: {e}");
        }
        Err(unusable)
    }

    /// Reads the service's `env_from` paths of watch `id` as they are in
    /// `candidate` (of `dir`), as a start of the service would once it is
    /// published; the error names them where the service reads them.
    fn env_from_of(&self, id: WatchId, dir: &Path, candidate: &Path) -> Result<(), String> {
        for rel in &self.env_from[id.0] {
            let at = if rel.as_os_str().is_empty() {
                candidate.to_path_buf()
            } else {
                candidate.join(rel)
            };
            if let Err(mut e) = crate::envfile::read(&[at]) {
                let Ok(inside) = e.path.strip_prefix(candidate).map(Path::to_path_buf) else {
                    return Err(format!("{e}; the service would not start with it"));
                };
                e.path = dir.join(&inside);
                // Named where it is fixed: the watched file it is a copy of.
                return Err(match scan::copied_from(&self.paths[id.0], &inside) {
                    Some(source) => format!(
                        "{} (env_from reads it as {}): {}{}; the service would not start with it",
                        source.display(),
                        e.path.display(),
                        e.line.map(|l| format!("line {l}: ")).unwrap_or_default(),
                        e.problem
                    ),
                    None => format!("{e}; the service would not start with it"),
                });
            }
        }
        Ok(())
    }

    fn finished(&self, done: Done) {
        if let Ok(mut out) = self.shared.out.lock() {
            out.done.push(done);
        }
        wake(&self.shared.to_loop);
    }

    fn read_events(&mut self, now: Instant) {
        let Some(inotify) = &self.inotify else {
            return;
        };
        for _ in 0..MAX_READS {
            match inotify.read_events() {
                Ok(events) => {
                    for ev in events {
                        self.books.on_event(&Event::from(ev), now);
                    }
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::error!("read() on the inotify fd failed: {e}");
                    self.books.error();
                    return;
                }
            }
        }
    }

    /// Scans every watch that is due, one after another, and queues each
    /// scan for the loop as soon as it is done.
    fn scan_due(&mut self) {
        let due = self.books.take_due(Instant::now());
        if due.is_empty() {
            return;
        }
        if self.inotify.is_none() {
            // The instance limit may have been raised since.
            if let Ok(i) = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
                tracing::info!("inotify_init1() works again");
                self.inotify = Some(i);
            }
        }
        let mut files = 0;
        for id in due {
            let mut registrar = InotifyRegistrar(self.inotify.as_ref());
            let scan = scan::scan(&self.paths[id.0], &self.key, &self.own, &mut registrar);
            files += scan.files;
            let with_inotify = self.inotify.is_some();
            if let Some(scanned) = self
                .books
                .on_scanned(id, scan, with_inotify, Instant::now())
            {
                self.post(scanned);
            }
        }
        if files > TRIM_AFTER_FILES {
            give_back_memory();
        }
    }

    /// Hands the books' counts to the loop (before a scan, so that a page
    /// made after the scan counts what led to it).
    fn share_counts(&self) {
        let Counts { events, errors } = self.books.counts();
        let [e, r] = &self.shared.counts;
        e.store(events, Ordering::Relaxed);
        r.store(errors, Ordering::Relaxed);
    }

    fn post(&self, scanned: Scanned) {
        self.share_counts();
        let Ok(mut out) = self.shared.out.lock() else {
            return;
        };
        match out.scanned.iter_mut().find(|s| s.watch == scanned.watch) {
            Some(older) => *older = scanned,
            None => out.scanned.push(scanned),
        }
        drop(out);
        wake(&self.shared.to_loop);
    }

    /// Removes the inotify watches no scan uses any more.
    fn remove_unused(&mut self) {
        for (wd, dir) in self.books.take_unused() {
            let Some(inotify) = &self.inotify else {
                continue;
            };
            // SAFETY: a plain syscall on an fd we own. (nix's rm_watch wants
            // a WatchDescriptor, which it does not let us rebuild from an i32.)
            let rc = unsafe { libc::inotify_rm_watch(inotify.as_fd().as_raw_fd(), wd) };
            if rc == -1 {
                let e = Errno::last();
                // EINVAL: the kernel dropped it already (its directory is gone).
                if e != Errno::EINVAL {
                    tracing::warn!(
                        "inotify_rm_watch() on the watch of {} failed: {e}",
                        dir.display()
                    );
                }
            }
        }
    }
}

/// What a copying scan gave: `copied`, and whether its fingerprint is the
/// one asked for. Content that changed meanwhile explains a failed copy
/// (a file the kubelet removed between its lookup and its open): the newer
/// content is copied next, and nothing failed.
fn copy_outcome(copied: Result<(), String>, same: bool) -> Result<(), SnapshotError> {
    match copied {
        _ if !same => Err(SnapshotError::Changed),
        Err(e) => Err(SnapshotError::Failed(e)),
        Ok(()) => Ok(()),
    }
}

struct InotifyRegistrar<'a>(Option<&'a Inotify>);

impl Registrar for InotifyRegistrar<'_> {
    fn watch_dir(&mut self, dir: &Path) -> Result<Option<i32>, Errno> {
        match self.0 {
            // The same directory again gives the same watch descriptor.
            Some(inotify) => inotify
                .add_watch(dir, DIR_EVENTS)
                .map(|wd| Some(wd.as_raw())),
            None => Ok(None),
        }
    }
}

fn wake(fd: &EventFd) {
    // EAGAIN only if the counter were near 2^64: the other side reads it.
    if let Err(e) = fd.write(1) {
        tracing::error!("write() on an eventfd of the watcher failed: {e}");
    }
}

fn clear(fd: &EventFd, what: &str) {
    match fd.read() {
        Ok(_) | Err(Errno::EAGAIN) => {}
        Err(e) => tracing::error!("read() on {what} failed: {e}"),
    }
}

/// Returns the heap's free pages to the kernel: a large scan's names are
/// garbage once it is done, and nothing per file is kept.
fn give_back_memory() {
    // SAFETY: malloc_trim only walks glibc's own heap.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// glibc gives each thread that allocates its own malloc arena (64 MiB of
/// address space, and pages that are rarely given back); the watcher thread
/// allocates little, so it shares the main one.
fn one_malloc_arena() {
    // SAFETY: mallopt only sets a tunable; called before the thread exists.
    #[cfg(target_env = "gnu")]
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) } != 1 {
        tracing::debug!(
            "mallopt(M_ARENA_MAX, 1) failed: the watcher thread gets its own malloc arena"
        );
    }
}

/// Gives `dir` and everything under it to `uid`:`gid`, without following a
/// symlink: a copy the service reads as its own user, with the modes the
/// kubelet gave the files.
fn give(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if std::fs::symlink_metadata(&path)?.is_dir() {
            give(&path, uid, gid)?;
        } else {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use nix::poll::{PollTimeout, poll};
    use std::fs;

    fn start(dir: &Path) -> Handle {
        let cfg = Config::parse(&format!(
            "[[watch]]\npaths = [{:?}]\non_change = \"none\"\ndebounce = \"10ms\"\n",
            dir.display().to_string()
        ))
        .unwrap();
        Handle::start(
            &cfg.watches,
            &[],
            &[None],
            Path::new("/"),
            OwnFiles::default(),
            Instant::now(),
        )
        .unwrap()
    }

    fn next_scan(handle: &Handle) -> Scanned {
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mut fds = [PollFd::new(handle.fd(), PollFlags::POLLIN)];
            let woke = poll(&mut fds, PollTimeout::from(100u16)).unwrap() > 0;
            match handle.take(woke) {
                Taken::Some(mut scans, _) if !scans.is_empty() => return scans.remove(0),
                Taken::Some(..) => {}
                Taken::Gone => panic!("the watcher thread ended"),
            }
            assert!(Instant::now() < deadline, "no scan came");
        }
    }

    #[test]
    fn a_copy_that_failed_while_the_content_changed_is_no_failure() {
        let failed = || Err("cannot read /vol/..2026_x/a: No such file or directory".to_string());
        assert_eq!(copy_outcome(failed(), false), Err(SnapshotError::Changed));
        assert!(matches!(
            copy_outcome(failed(), true),
            Err(SnapshotError::Failed(_))
        ));
        assert_eq!(copy_outcome(Ok(()), false), Err(SnapshotError::Changed));
        assert_eq!(copy_outcome(Ok(()), true), Ok(()));
    }

    #[test]
    fn the_thread_scans_the_deepest_tree_a_watch_may_cover_on_its_small_stack() {
        let d = tempfile::tempdir().unwrap();
        let mut deep = d.path().join("conf");
        for i in 0..=scan::MAX_DEPTH {
            deep.push(format!("level{i}"));
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("app.conf"), "x").unwrap();
        fs::write(d.path().join("conf/top.conf"), "y").unwrap();
        let handle = start(&d.path().join("conf"));
        let first = next_scan(&handle);
        assert_eq!(first.watch, WatchId(0));
        assert_eq!(
            first.files, 1,
            "the file past the depth limit is not covered"
        );
    }

    #[test]
    fn a_change_is_scanned_and_handed_to_the_loop() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("app.conf"), "v0").unwrap();
        let handle = start(d.path());
        let first = next_scan(&handle);
        fs::write(d.path().join(".app.conf.new"), "v1").unwrap();
        fs::rename(d.path().join(".app.conf.new"), d.path().join("app.conf")).unwrap();
        let second = next_scan(&handle);
        assert_ne!(second.fingerprint, first.fingerprint);
        // Asked for, a scan comes without a change.
        handle.rescan(WatchId(0));
        assert_eq!(next_scan(&handle).fingerprint, second.fingerprint);
    }
}
