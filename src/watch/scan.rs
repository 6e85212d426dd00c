//! One pass over what a watch covers: the content fingerprint, and the
//! directories and names inotify must watch to see the next change.
//!
//! Paths are resolved one component at a time, as the kernel would, so every
//! symlink on the way is seen: the directory that *holds* a symlink is what
//! gets watched, never the file behind it (a watch on the file would follow
//! the symlink into a kubelet's timestamped directory and die with it).
//!
//! A directory is registered with inotify (through a [`Registrar`]) *before*
//! anything in it is read, so a change made after the read raises an event;
//! a lookup made before its directory was registered is made again.
//!
//! Kubernetes volumes: a directory that holds `..data` is a kubelet volume.
//! Its keys are the entries of `..data`, not the top-level symlinks: the
//! kubelet creates the symlink of a key an update adds only after it renamed
//! `..data`, and removes the symlink of a deleted key only after that. A key
//! present in `..data` counts as present; one whose top-level symlink does not
//! exist yet is reported as `unpublished` so the caller can wait for it before
//! it tells the service. Names that begin with `..` are the kubelet's own and
//! are never walked directly.
//!
//! tend's own files (the ready and status files, the temporary files they
//! are written through, and the `publish` directories) are never covered,
//! wherever a path leads: tend must not reload on its own writes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use sha2::{Digest, Sha256};

/// Symlinks followed while resolving one path before giving up (as ELOOP).
const MAX_SYMLINKS: usize = 40;
/// Directory depth below a watched path.
pub const MAX_DEPTH: usize = 32;

pub use crate::core::protocol::Fingerprint;
#[cfg(test)]
pub use crate::core::protocol::test_fingerprint;

/// The per-process key of every fingerprint.
pub struct HashKey([u8; 32]);

impl HashKey {
    pub fn random() -> HashKey {
        let mut key = [0u8; 32];
        // SAFETY: getrandom writes at most key.len() bytes into key.
        let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
        if n != key.len() as isize {
            // Without randomness fingerprints still work; they are only
            // unkeyed. Say so rather than fail.
            tracing::warn!(
                "getrandom() failed ({}): fingerprints are not keyed",
                io::Error::last_os_error()
            );
        }
        HashKey(key)
    }

    #[cfg(test)]
    pub fn fixed() -> HashKey {
        HashKey([7; 32])
    }
}

/// What a directory watch is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interest {
    /// Everything in it (a covered directory), except the kubelet's `..`
    /// names other than `..data`.
    All,
    /// Only these names (the directory holds a watched path or a symlink on
    /// the way to one).
    Names(BTreeSet<OsString>),
}

impl Interest {
    pub fn matches(&self, name: &OsStr) -> bool {
        match self {
            Interest::All => !is_kubelet_internal(name) || name == "..data",
            Interest::Names(names) => names.contains(name),
        }
    }

    fn merge(&mut self, other: Interest) {
        match (&mut *self, other) {
            (Interest::All, _) => {}
            (_, Interest::All) => *self = Interest::All,
            (Interest::Names(a), Interest::Names(b)) => a.extend(b),
        }
    }
}

/// Registers directories with inotify for a scan, before it reads them.
pub trait Registrar {
    /// The watch descriptor of `dir`, None when nothing registers (the watch
    /// is scanned on an interval), or why inotify_add_watch() failed.
    fn watch_dir(&mut self, dir: &Path) -> Result<Option<i32>, Errno>;
}

/// A directory a scan depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dir {
    pub interest: Interest,
    /// What [`Registrar::watch_dir`] said, before the scan read the directory.
    pub wd: Result<Option<i32>, Errno>,
    /// Names of tend's own files in it: never covered, their events ignored.
    pub own: Vec<OsString>,
}

/// Files tend writes itself (absolute paths).
#[derive(Debug, Clone, Default)]
pub struct OwnFiles(Vec<PathBuf>);

impl OwnFiles {
    pub fn new(paths: Vec<PathBuf>) -> OwnFiles {
        OwnFiles(paths)
    }

    /// (device, inode) of each file's directory as it is now, and its name:
    /// a symlink or a bind mount that leads to the same directory is caught.
    fn locate(&self) -> Vec<((u64, u64), OsString)> {
        self.0
            .iter()
            .filter_map(|p| {
                let name = p.file_name()?.to_os_string();
                let dir = fs::metadata(p.parent()?).ok()?;
                Some(((dir.dev(), dir.ino()), name))
            })
            .collect()
    }
}

/// Whether `name` is tend's own file `own`, or a temporary file it is
/// written through: `.{own}.{16 hex digits}.tmp`, or `.{own}.tmp.{pid}`.
pub fn is_own_name(own: &OsStr, name: &OsStr) -> bool {
    if name == own {
        return true;
    }
    let Some(rest) = name
        .as_bytes()
        .strip_prefix(b".")
        .and_then(|r| r.strip_prefix(own.as_bytes()))
        .and_then(|r| r.strip_prefix(b"."))
    else {
        return false;
    };
    let hex = rest
        .strip_suffix(b".tmp")
        .is_some_and(|h| h.len() == 16 && h.iter().all(u8::is_ascii_hexdigit));
    let pid = rest
        .strip_prefix(b"tmp.")
        .is_some_and(|d| !d.is_empty() && d.iter().all(u8::is_ascii_digit));
    hex || pid
}

/// The result of one scan.
#[derive(Debug)]
pub struct Scan {
    pub fingerprint: Fingerprint,
    /// One fingerprint per watched path, in the order of `paths`.
    pub per_path: Vec<Fingerprint>,
    /// Regular files whose content went into the fingerprint.
    pub files: usize,
    /// Watched paths that do not exist (yet).
    pub missing: Vec<PathBuf>,
    /// What the scan could not read or would not follow, as "PATH: why"
    /// (never any content): a file tend may not read, a broken symlink, a
    /// directory past [`MAX_DEPTH`].
    pub unreadable: Vec<String>,
    /// Kubelet keys present in `..data` whose top-level symlink is not there yet.
    pub unpublished: Vec<PathBuf>,
    /// Directories to watch, and for what.
    pub dirs: BTreeMap<PathBuf, Dir>,
}

/// Scans `paths` (absolute) and fingerprints them with `key`, registering
/// each directory it depends on with `registrar` before reading it.
pub fn scan(
    paths: &[PathBuf],
    key: &HashKey,
    own: &OwnFiles,
    registrar: &mut dyn Registrar,
) -> Scan {
    scan_into(paths, key, own, registrar, None)
}

/// [`scan`], copying every regular file it hashes into the directory
/// `into` as it reads it, so the copy is exactly what the fingerprint
/// covers: a watched file becomes `into/NAME`, a watched directory's
/// entries become `into`'s. Modes are kept (and owners, as root).
/// Sockets, FIFOs and devices are not copied. The copy fails on the first
/// error: a file tend cannot read or write, two paths that give the same
/// name.
pub fn scan_copying(
    paths: &[PathBuf],
    key: &HashKey,
    own: &OwnFiles,
    registrar: &mut dyn Registrar,
    into: &Path,
) -> (Scan, Result<(), String>) {
    let mut copy = Copy {
        root: into.to_path_buf(),
        prefix: PathBuf::new(),
        error: None,
        dirs: Vec::new(),
        // SAFETY: geteuid() cannot fail and touches no memory.
        as_root: unsafe { libc::geteuid() } == 0,
    };
    let scan = scan_into(paths, key, own, registrar, Some(&mut copy));
    (scan, copy.finish())
}

/// The watched file that `inside` of a copy made by [`scan_copying`] of
/// `paths` was copied from: under a watched directory, or a watched file of
/// that name. None when no watched path has it (any more).
pub fn copied_from(paths: &[PathBuf], inside: &Path) -> Option<PathBuf> {
    let first = inside.components().next()?.as_os_str();
    paths.iter().find_map(|p| {
        if p.is_dir() {
            let source = p.join(inside);
            source.symlink_metadata().is_ok().then_some(source)
        } else {
            let rest = inside.strip_prefix(first).ok()?;
            let source = match rest.as_os_str().is_empty() {
                true => p.clone(),
                false => p.join(rest),
            };
            (p.file_name() == Some(first)).then_some(source)
        }
    })
}

fn scan_into<'a>(
    paths: &[PathBuf],
    key: &HashKey,
    own: &OwnFiles,
    registrar: &'a mut dyn Registrar,
    mut copy: Option<&'a mut Copy>,
) -> Scan {
    let mut s = Scanner::new(registrar, own);
    let mut per_path = Vec::with_capacity(paths.len());
    let mut all = Sha256::new();
    all.update(key.0);
    for path in paths {
        s.hasher = Sha256::new();
        s.hasher.update(key.0);
        s.hasher.update(path.as_os_str().as_bytes());
        s.hasher.update(b"\0");
        match s.resolve_watched(path) {
            Ok(real) => {
                if let Some(c) = copy.as_deref_mut() {
                    // A directory's entries go to the top; a file keeps its name.
                    c.prefix = if real.is_dir() {
                        PathBuf::new()
                    } else {
                        PathBuf::from(path.file_name().unwrap_or_default())
                    };
                }
                s.copy = copy.take();
                s.cover(Path::new(""), &real, 0);
                copy = s.copy.take();
            }
            Err(Unresolved::Own) => s.hasher.update(b"own\0"),
            Err(_) => {}
        }
        let fp = Fingerprint::from_digest(std::mem::take(&mut s.hasher).finalize().into());
        all.update(fp.as_bytes());
        per_path.push(fp);
    }
    Scan {
        fingerprint: Fingerprint::from_digest(all.finalize().into()),
        per_path,
        files: s.files,
        missing: s.missing,
        unreadable: s.unreadable,
        unpublished: s.unpublished,
        dirs: s.dirs,
    }
}

struct Scanner<'r> {
    registrar: &'r mut dyn Registrar,
    /// tend's own files, located when the scan began.
    own: Vec<((u64, u64), OsString)>,
    hasher: Sha256,
    files: usize,
    missing: Vec<PathBuf>,
    unreadable: Vec<String>,
    unpublished: Vec<PathBuf>,
    dirs: BTreeMap<PathBuf, Dir>,
    /// (dev, ino) of directories already covered, against symlink loops.
    visited: HashSet<(u64, u64)>,
    buf: Vec<u8>,
    /// Where `..data` of each kubelet volume pointed when this scan first
    /// read it: every key of a volume is read from that one generation, so
    /// a scan never mixes two updates (the kubelet never changes a
    /// generation in place; it makes a new one and swaps `..data`).
    data_links: HashMap<PathBuf, Option<PathBuf>>,
    /// Set while a scan copies what it reads.
    copy: Option<&'r mut Copy>,
}

/// A copy being made by [`scan_copying`].
struct Copy {
    root: PathBuf,
    /// Where the watched path being covered goes, below `root`.
    prefix: PathBuf,
    error: Option<String>,
    /// Directories made, and the modes they get once the copy is done (a
    /// read-only one must stay writable until then).
    dirs: Vec<(PathBuf, u32)>,
    as_root: bool,
}

impl Copy {
    fn dest(&self, rel: &Path) -> PathBuf {
        // `join("")` would add a trailing slash.
        if rel.as_os_str().is_empty() {
            self.root.join(&self.prefix)
        } else {
            self.root.join(&self.prefix).join(rel)
        }
    }

    fn fail(&mut self, what: &str, path: &Path, e: &io::Error) {
        if self.error.is_none() {
            self.error = Some(format!("{what} {}: {e}", path.display()));
        }
    }

    fn dir(&mut self, rel: &Path, meta: &fs::Metadata) {
        if self.error.is_some() || self.prefix.join(rel).as_os_str().is_empty() {
            return;
        }
        let dest = self.dest(rel);
        match fs::DirBuilder::new().mode(0o700).create(&dest) {
            Ok(()) => {
                self.owner(&dest, meta);
                self.dirs.push((dest, meta.mode() & 0o777));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.twice(&dest),
            Err(e) => self.fail("cannot create", &dest, &e),
        }
    }

    /// Opens the copy of a file; None once the copy failed.
    fn file(&mut self, rel: &Path) -> Option<File> {
        if self.error.is_some() {
            return None;
        }
        let dest = self.dest(rel);
        match File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)
        {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.twice(&dest);
                None
            }
            Err(e) => {
                self.fail("cannot create", &dest, &e);
                None
            }
        }
    }

    fn twice(&mut self, dest: &Path) {
        if self.error.is_none() {
            self.error = Some(format!(
                "two watched paths give the same name {:?} in the published copy: \
                 publish one directory, or files with different names",
                dest.strip_prefix(&self.root).unwrap_or(dest)
            ));
        }
    }

    fn owner(&mut self, dest: &Path, meta: &fs::Metadata) {
        if self.as_root
            && let Err(e) = std::os::unix::fs::lchown(dest, Some(meta.uid()), Some(meta.gid()))
        {
            self.fail("cannot set the owner of", dest, &e);
        }
    }

    /// The file `out` (the copy of `rel`, whose metadata is `meta`) is
    /// complete: its mode and owner follow the original.
    fn finish_file(&mut self, out: File, rel: &Path, meta: &fs::Metadata) {
        let dest = self.dest(rel);
        let mode = fs::Permissions::from_mode(meta.mode() & 0o777);
        if let Err(e) = out.set_permissions(mode) {
            return self.fail("cannot set the mode of", &dest, &e);
        }
        self.owner(&dest, meta);
    }

    fn finish(self) -> Result<(), String> {
        if let Some(e) = self.error {
            return Err(e);
        }
        for (dir, mode) in self.dirs.iter().rev() {
            fs::set_permissions(dir, fs::Permissions::from_mode(*mode))
                .map_err(|e| format!("cannot set the mode of {}: {e}", dir.display()))?;
        }
        Ok(())
    }
}

/// Why a path did not resolve.
#[derive(Debug, PartialEq, Eq)]
enum Unresolved {
    /// A name on the way does not exist (or cannot be looked up).
    Missing,
    /// A symlink could not be read, or they loop.
    Broken,
    /// It leads to one of tend's own files.
    Own,
}

impl<'r> Scanner<'r> {
    fn new(registrar: &'r mut dyn Registrar, own: &OwnFiles) -> Scanner<'r> {
        Scanner {
            registrar,
            own: own.locate(),
            hasher: Sha256::default(),
            files: 0,
            missing: Vec::new(),
            unreadable: Vec::new(),
            unpublished: Vec::new(),
            dirs: BTreeMap::new(),
            visited: HashSet::new(),
            buf: vec![0; 64 * 1024],
            data_links: HashMap::new(),
            copy: None,
        }
    }

    /// Where `dir/..data` points, read once per scan.
    fn data_link(&mut self, dir: &Path) -> io::Result<PathBuf> {
        if let Some(known) = self.data_links.get(dir) {
            return known
                .clone()
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT));
        }
        let target = fs::read_link(dir.join("..data"));
        self.data_links
            .insert(dir.to_path_buf(), target.as_ref().ok().cloned());
        target
    }

    /// The directory that holds a kubelet volume's keys, when `dir` is one.
    fn data_dir(&mut self, dir: &Path) -> Option<PathBuf> {
        let data = dir.join("..data");
        match fs::symlink_metadata(&data) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = dir.join(self.data_link(dir).ok()?);
                target.is_dir().then_some(target)
            }
            Ok(m) if m.is_dir() => Some(data),
            _ => None,
        }
    }

    /// Watches `dir` for `interest`. Returns true when `dir` was registered
    /// just now: what was read in it before is to be read again.
    fn watch(&mut self, dir: &Path, interest: Interest) -> bool {
        // A kubelet snapshot directory never changes in place and is deleted
        // on the next update: the `..data` rename in its parent says it all.
        if dir
            .components()
            .any(|c| matches!(c, Component::Normal(n) if is_kubelet_internal(n)))
        {
            return false;
        }
        if let Some(existing) = self.dirs.get_mut(dir) {
            existing.interest.merge(interest);
            return false;
        }
        let wd = self.registrar.watch_dir(dir);
        let own = if self.own.is_empty() {
            Vec::new()
        } else {
            let id = fs::metadata(dir).map(|m| (m.dev(), m.ino())).ok();
            self.own
                .iter()
                .filter(|(d, _)| Some(*d) == id)
                .map(|(_, name)| name.clone())
                .collect()
        };
        self.dirs
            .insert(dir.to_path_buf(), Dir { interest, wd, own });
        true
    }

    fn watch_name(&mut self, dir: &Path, name: &OsStr) -> bool {
        self.watch(dir, Interest::Names(BTreeSet::from([name.to_os_string()])))
    }

    fn is_own(&self, dir: &Path, name: &OsStr) -> bool {
        self.dirs
            .get(dir)
            .is_some_and(|d| d.own.iter().any(|o| is_own_name(o, name)))
    }

    /// Resolves a watched `path` (absolute) to a real path; a missing one is
    /// reported as missing.
    fn resolve_watched(&mut self, path: &Path) -> Result<PathBuf, Unresolved> {
        let problems = self.unreadable.len();
        let found = self.resolve(PathBuf::from("/"), components(path));
        if found == Err(Unresolved::Missing) {
            // Said as missing, not as what made it so.
            self.unreadable.truncate(problems);
            self.missing.push(path.to_path_buf());
        }
        found
    }

    /// Resolves `names` below the real directory `cur` component by
    /// component to a real path, watching the directory that holds the path
    /// itself, each symlink on the way, and a name that is missing.
    fn resolve(
        &mut self,
        mut cur: PathBuf,
        mut queue: VecDeque<OsString>,
    ) -> Result<PathBuf, Unresolved> {
        let mut hops = 0;
        while let Some(name) = queue.pop_front() {
            if name == ".." {
                cur.pop();
                continue;
            }
            let last = queue.is_empty();
            if last {
                // The path itself: watch its directory for it being
                // replaced, written, or removed.
                self.watch_name(&cur, &name);
                if self.is_own(&cur, &name) {
                    return Err(Unresolved::Own);
                }
            }
            let cand = cur.join(&name);
            let mut looked_up = fs::symlink_metadata(&cand);
            let plain_dir = looked_up
                .as_ref()
                .is_ok_and(|m| !m.file_type().is_symlink());
            if !last && !plain_dir && self.watch_name(&cur, &name) {
                // Looked up before its directory was watched: again, so a
                // change in between is not missed.
                looked_up = fs::symlink_metadata(&cand);
            }
            let meta = match looked_up {
                Ok(m) => m,
                Err(e) => {
                    self.watch_name(&cur, &name);
                    if e.kind() == io::ErrorKind::NotFound
                        && !is_kubelet_internal(&name)
                        && self.data_dir(&cur).is_some_and(|d| d.join(&name).exists())
                    {
                        // A key the kubelet committed but has not linked yet.
                        self.unpublished.push(cand);
                        self.watch_name(&cur, OsStr::new("..data"));
                        let mut rest = VecDeque::from([OsString::from("..data"), name]);
                        rest.extend(queue.drain(..));
                        queue = rest;
                        continue;
                    }
                    self.record_problem(&cand, &e);
                    return Err(Unresolved::Missing);
                }
            };
            if meta.file_type().is_symlink() {
                self.watch_name(&cur, &name);
                hops += 1;
                let target = if name == "..data" {
                    self.data_link(&cur)
                } else {
                    fs::read_link(&cand)
                };
                let target = match target {
                    Ok(t) if hops <= MAX_SYMLINKS => t,
                    Ok(_) => {
                        self.record_problem(&cand, &io::Error::from_raw_os_error(libc::ELOOP));
                        return Err(Unresolved::Broken);
                    }
                    Err(e) => {
                        self.record_problem(&cand, &e);
                        return Err(Unresolved::Broken);
                    }
                };
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                let mut rest = components(&target);
                rest.extend(queue.drain(..));
                queue = rest;
                continue;
            }
            cur = cand;
        }
        Ok(cur)
    }

    /// Hashes what a resolved path covers. `rel` names it in the fingerprint.
    fn cover(&mut self, rel: &Path, real: &Path, depth: usize) {
        let meta = match fs::metadata(real) {
            Ok(m) => m,
            Err(e) => return self.record_problem(real, &e),
        };
        if meta.is_file() {
            self.hash_file(rel, real);
        } else if !meta.is_dir() {
            // Sockets, FIFOs and devices are not config: never opened (a
            // FIFO would block, a device may act on open).
            self.not_regular(rel);
        } else {
            if depth > MAX_DEPTH {
                self.unreadable.push(format!(
                    "{}: more than {MAX_DEPTH} directory levels below the watched path, not covered",
                    real.display()
                ));
                return;
            }
            if !self.visited.insert((meta.dev(), meta.ino())) {
                return;
            }
            self.watch(real, Interest::All);
            if let Some(c) = self.copy.as_deref_mut() {
                c.dir(rel, &meta);
            }
            // In a kubelet volume the keys are what `..data` holds.
            let listed = match self.data_dir(real) {
                Some(data) => {
                    self.watch_name(real, OsStr::new("..data"));
                    data
                }
                None => real.to_path_buf(),
            };
            let mut names: Vec<OsString> = match fs::read_dir(&listed) {
                Ok(entries) => entries.flatten().map(|e| e.file_name()).collect(),
                Err(e) => return self.record_problem(&listed, &e),
            };
            names.retain(|n| !is_kubelet_internal(n) && !self.is_own(real, n));
            names.sort();
            for name in names {
                let child_rel = rel.join(&name);
                self.hasher.update(b"entry\0");
                self.hasher.update(child_rel.as_os_str().as_bytes());
                self.hasher.update(b"\0");
                // From the real directory, not from `/` again: its ancestors
                // were resolved already.
                let problems = self.unreadable.len();
                match self.resolve(real.to_path_buf(), VecDeque::from([name.clone()])) {
                    Ok(child) => self.cover(&child_rel, &child, depth + 1),
                    Err(_) => {
                        // Named as the user knows it: the entry, then where
                        // its symlinks led.
                        let entry = real.join(&name);
                        for p in &mut self.unreadable[problems..] {
                            *p = format!("{} -> {p}", entry.display());
                        }
                    }
                }
            }
        }
    }

    fn hash_file(&mut self, rel: &Path, real: &Path) {
        // What was a regular file when it was looked up may be a FIFO by
        // now (renamed over it): O_NONBLOCK makes open() of a FIFO return at
        // once instead of waiting for a writer, and what counts is what the
        // fd that was opened is.
        let opened = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(real)
            .and_then(|f| Ok((f.metadata()?, f)));
        let (meta, mut f) = match opened {
            Ok((meta, f)) if meta.is_file() => (meta, f),
            Ok(_) => return self.not_regular(rel),
            Err(e) => {
                self.file_header(rel);
                if let Some(c) = self.copy.as_deref_mut() {
                    c.fail("cannot read", real, &e);
                }
                return self.record_problem(real, &e);
            }
        };
        self.files += 1;
        self.file_header(rel);
        let mut out = self.copy.as_deref_mut().and_then(|c| c.file(rel));
        let mut len: u64 = 0;
        loop {
            match f.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.hasher.update(&self.buf[..n]);
                    len += n as u64;
                    if let (Some(o), Some(c)) = (&mut out, self.copy.as_deref_mut())
                        && let Err(e) = o.write_all(&self.buf[..n])
                    {
                        c.fail("cannot write", &c.dest(rel), &e);
                        out = None;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if let Some(c) = self.copy.as_deref_mut() {
                        c.fail("cannot read", real, &e);
                    }
                    return self.record_problem(real, &e);
                }
            }
        }
        self.hasher.update(len.to_le_bytes());
        if let (Some(o), Some(c)) = (out, self.copy.as_deref_mut()) {
            c.finish_file(o, rel, &meta);
        }
    }

    fn file_header(&mut self, rel: &Path) {
        self.hasher.update(b"file\0");
        self.hasher.update(rel.as_os_str().as_bytes());
        self.hasher.update(b"\0");
    }

    /// A socket, FIFO or device: its name counts, it is never read.
    fn not_regular(&mut self, rel: &Path) {
        self.hasher.update(b"not a regular file\0");
        self.hasher.update(rel.as_os_str().as_bytes());
        self.hasher.update(b"\0");
    }

    /// A path that cannot be read is part of what the watch sees: it changes
    /// the fingerprint, and the check decides what it means.
    fn record_problem(&mut self, path: &Path, e: &io::Error) {
        self.hasher.update(b"error\0");
        self.hasher
            .update(e.raw_os_error().unwrap_or(-1).to_le_bytes());
        self.unreadable.push(format!("{}: {e}", path.display()));
    }
}

fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// `..data`, `..data_tmp`, `..2026_11_21_10_00_00.123`: the kubelet's own.
pub fn is_kubelet_internal(name: &OsStr) -> bool {
    name.as_bytes().starts_with(b"..")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A scan without inotify.
    struct Unregistered;

    impl Registrar for Unregistered {
        fn watch_dir(&mut self, _: &Path) -> Result<Option<i32>, Errno> {
            Ok(None)
        }
    }

    fn plain_scan(paths: &[PathBuf], key: &HashKey) -> Scan {
        scan(paths, key, &OwnFiles::default(), &mut Unregistered)
    }

    fn fp(paths: &[PathBuf]) -> Fingerprint {
        plain_scan(paths, &HashKey::fixed()).fingerprint
    }

    /// The kubelet's AtomicWriter, reduced to its filesystem operations.
    fn project(dir: &Path, files: &[(&str, &str)], version: u32) {
        fs::create_dir_all(dir).unwrap();
        let ts = format!("..2026_11_21_10_00_{version:02}.000");
        let ts_path = dir.join(&ts);
        for (key, content) in files {
            let p = ts_path.join(key);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, content).unwrap();
        }
        let old = fs::read_link(dir.join("..data")).ok();
        symlink(&ts, dir.join("..data_tmp")).unwrap();
        fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        for (key, _) in files {
            let top = key.split('/').next().unwrap();
            if fs::symlink_metadata(dir.join(top)).is_err() {
                symlink(Path::new("..data").join(top), dir.join(top)).unwrap();
            }
        }
        if let Some(old) = old {
            fs::remove_dir_all(dir.join(old)).unwrap();
        }
    }

    #[test]
    fn the_same_bytes_give_the_same_fingerprint() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.conf");
        fs::write(&f, "x=1").unwrap();
        let before = fp(std::slice::from_ref(&f));
        fs::write(&f, "x=1").unwrap();
        assert_eq!(
            fp(std::slice::from_ref(&f)),
            before,
            "rewriting the same bytes"
        );
        fs::write(&f, "x=2").unwrap();
        assert_ne!(fp(std::slice::from_ref(&f)), before, "new content");
    }

    #[test]
    fn a_copied_file_is_traced_to_the_watched_file_it_comes_from() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        project(&vol, &[("app.env", "A=1")], 1);
        let file = d.path().join("extra.env");
        fs::write(&file, "B=2").unwrap();
        let paths = [vol.clone(), file.clone()];
        assert_eq!(
            copied_from(&paths, Path::new("app.env")),
            Some(vol.join("app.env"))
        );
        let traced = copied_from(&paths, Path::new("extra.env")).unwrap();
        assert_eq!(traced.as_os_str(), file.as_os_str(), "as written");
        assert_eq!(copied_from(&paths, Path::new("gone.env")), None);
        assert_eq!(copied_from(&paths, Path::new("")), None);
    }

    #[test]
    fn a_missing_path_is_reported_and_differs_from_an_empty_file() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("later.conf");
        let s = plain_scan(std::slice::from_ref(&f), &HashKey::fixed());
        assert_eq!(s.missing, vec![f.clone()]);
        assert_eq!(
            s.dirs[d.path()].interest,
            Interest::Names(BTreeSet::from(["later.conf".into()]))
        );
        fs::write(&f, "").unwrap();
        assert_ne!(fp(&[f]), s.fingerprint);
    }

    #[test]
    fn what_cannot_be_read_is_named_and_a_missing_path_only_as_missing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("conf.d");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("app.conf"), "x").unwrap();
        symlink("/nonexistent/target", dir.join("dangling.conf")).unwrap();
        let mut deep = dir.join("deep");
        for i in 0..=MAX_DEPTH {
            deep = deep.join(i.to_string());
        }
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("too-deep.conf"), "x").unwrap();
        let missing = d.path().join("later.conf");
        let s = plain_scan(&[dir.clone(), missing.clone()], &HashKey::fixed());
        assert_eq!(s.files, 1);
        assert_eq!(s.missing, vec![missing]);
        assert_eq!(s.unreadable.len(), 2, "{:?}", s.unreadable);
        assert!(
            s.unreadable[0].starts_with(&format!(
                "{}/dangling.conf -> /nonexistent: No such file or directory",
                dir.display()
            )),
            "{:?}",
            s.unreadable
        );
        assert!(
            s.unreadable[1].ends_with(&format!(
                "/{}: more than {MAX_DEPTH} directory levels below the watched path, not covered",
                MAX_DEPTH - 1
            )),
            "{:?}",
            s.unreadable
        );
    }

    #[test]
    fn a_missing_directory_is_watched_from_its_nearest_parent() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("sub/dir/app.conf");
        let s = plain_scan(&[f], &HashKey::fixed());
        assert_eq!(s.dirs.len(), 1);
        assert_eq!(
            s.dirs[d.path()].interest,
            Interest::Names(BTreeSet::from(["sub".into()]))
        );
    }

    #[test]
    fn directories_are_covered_recursively_with_names_in_the_fingerprint() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("conf/sub")).unwrap();
        fs::write(d.path().join("conf/a"), "1").unwrap();
        fs::write(d.path().join("conf/sub/b"), "2").unwrap();
        let s = plain_scan(&[d.path().join("conf")], &HashKey::fixed());
        assert_eq!(s.files, 2);
        assert_eq!(s.dirs[&d.path().join("conf")].interest, Interest::All);
        assert_eq!(s.dirs[&d.path().join("conf/sub")].interest, Interest::All);
        // Renaming a file changes the fingerprint even with the same bytes.
        fs::rename(d.path().join("conf/sub/b"), d.path().join("conf/sub/c")).unwrap();
        assert_ne!(fp(&[d.path().join("conf")]), s.fingerprint);
    }

    #[test]
    fn a_symlinked_file_watches_the_directories_that_hold_each_link() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("real")).unwrap();
        fs::write(d.path().join("real/app.conf"), "v1").unwrap();
        symlink(d.path().join("real/app.conf"), d.path().join("app.conf")).unwrap();
        let s = plain_scan(&[d.path().join("app.conf")], &HashKey::fixed());
        assert_eq!(s.files, 1);
        assert!(s.dirs[d.path()].interest.matches(OsStr::new("app.conf")));
        assert!(
            s.dirs[&d.path().join("real")]
                .interest
                .matches(OsStr::new("app.conf"))
        );
    }

    #[test]
    fn a_symlink_loop_is_not_followed_forever() {
        let d = tempfile::tempdir().unwrap();
        symlink("b", d.path().join("a")).unwrap();
        symlink("a", d.path().join("b")).unwrap();
        fs::create_dir(d.path().join("dir")).unwrap();
        symlink("..", d.path().join("dir/up")).unwrap();
        let s = plain_scan(
            &[d.path().join("a"), d.path().join("dir")],
            &HashKey::fixed(),
        );
        assert_eq!(s.files, 0);
    }

    #[test]
    fn a_copying_scan_copies_what_it_fingerprints_with_names_and_modes() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        project(&vol, &[("app.conf", "v1"), ("tls/key.pem", "secret")], 1);
        fs::set_permissions(
            fs::read_link(vol.join("..data"))
                .map(|g| vol.join(g).join("tls/key.pem"))
                .unwrap(),
            fs::Permissions::from_mode(0o400),
        )
        .unwrap();
        let single = d.path().join("extra.conf");
        fs::write(&single, "x").unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let paths = [vol.clone(), single.clone(), fifo.clone()];
        let into = d.path().join("copy");
        fs::create_dir(&into).unwrap();
        let key = HashKey::fixed();
        let (copied, result) =
            scan_copying(&paths, &key, &OwnFiles::default(), &mut Unregistered, &into);
        assert_eq!(result, Ok(()));
        assert_eq!(
            copied.fingerprint,
            fp(&paths),
            "the same fingerprint as a scan"
        );
        assert_eq!(fs::read_to_string(into.join("app.conf")).unwrap(), "v1");
        assert_eq!(fs::read_to_string(into.join("extra.conf")).unwrap(), "x");
        let key_pem = into.join("tls/key.pem");
        assert_eq!(fs::read_to_string(&key_pem).unwrap(), "secret");
        let mode = fs::metadata(&key_pem).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400, "a Secret's mode is kept: {mode:o}");
        assert!(
            !into.join("fifo").exists(),
            "a FIFO is never opened nor copied"
        );
        assert!(
            !into.join("..data").exists(),
            "kubelet internals are not copied"
        );
    }

    #[test]
    fn a_copying_scan_fails_on_a_name_given_twice() {
        let d = tempfile::tempdir().unwrap();
        for sub in ["a", "b"] {
            fs::create_dir(d.path().join(sub)).unwrap();
            fs::write(d.path().join(sub).join("same.conf"), sub).unwrap();
        }
        let into = d.path().join("copy");
        fs::create_dir(&into).unwrap();
        let paths = [d.path().join("a/same.conf"), d.path().join("b/same.conf")];
        let (_, result) = scan_copying(
            &paths,
            &HashKey::fixed(),
            &OwnFiles::default(),
            &mut Unregistered,
            &into,
        );
        let e = result.unwrap_err();
        assert!(
            e.contains("\"same.conf\"") && e.contains("same name"),
            "{e}"
        );
    }

    #[test]
    fn every_key_of_a_volume_is_read_from_the_generation_first_seen() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        project(&vol, &[("a", "1"), ("b", "1")], 1);
        let first = fs::read_link(vol.join("..data")).unwrap();
        let own = OwnFiles::default();
        let mut registrar = Unregistered;
        let mut s = Scanner::new(&mut registrar, &own);
        let a = s.resolve_watched(&vol.join("a")).unwrap();
        // The kubelet swaps `..data` (and keeps the old generation a moment).
        let ts = "..2026_11_21_10_00_02.000";
        fs::create_dir(vol.join(ts)).unwrap();
        fs::write(vol.join(ts).join("a"), "2").unwrap();
        fs::write(vol.join(ts).join("b"), "2").unwrap();
        symlink(ts, vol.join("..data_tmp")).unwrap();
        fs::rename(vol.join("..data_tmp"), vol.join("..data")).unwrap();
        let b = s.resolve_watched(&vol.join("b")).unwrap();
        assert_eq!(a, vol.join(&first).join("a"));
        assert_eq!(b, vol.join(&first).join("b"), "not a mix of two updates");
    }

    #[test]
    fn kubelet_volume_keys_come_from_data_and_internals_are_not_walked() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        project(&vol, &[("app.conf", "v1"), ("other.conf", "o1")], 1);
        let s = plain_scan(std::slice::from_ref(&vol), &HashKey::fixed());
        assert_eq!(s.files, 2);
        assert!(s.unpublished.is_empty());
        assert!(
            s.dirs
                .keys()
                .all(|p| !p.to_string_lossy().contains("..2026")),
            "{:?}",
            s.dirs.keys()
        );
        assert!(s.dirs[&vol].interest.matches(OsStr::new("..data")));
        assert!(!s.dirs[&vol].interest.matches(OsStr::new("..data_tmp")));
    }

    #[test]
    fn a_watched_key_ignores_other_keys_of_the_same_volume() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        project(&vol, &[("app.conf", "v1"), ("other.conf", "o1")], 1);
        let key = vec![vol.join("app.conf")];
        let before = plain_scan(&key, &HashKey::fixed());
        assert_eq!(
            before.dirs[&vol].interest,
            Interest::Names(BTreeSet::from(["app.conf".into(), "..data".into()]))
        );
        project(&vol, &[("app.conf", "v1"), ("other.conf", "o2")], 2);
        assert_eq!(fp(&key), before.fingerprint);
        project(&vol, &[("app.conf", "v2"), ("other.conf", "o2")], 3);
        assert_ne!(fp(&key), before.fingerprint);
    }

    #[test]
    fn a_key_in_data_counts_as_present_before_its_symlink_exists() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        project(&vol, &[("app.conf", "v1")], 1);
        // The state just after the rename: ..data has extra.conf, the
        // top-level symlink is not there yet.
        fs::create_dir(vol.join("..2026_11_21_10_00_02.000")).unwrap();
        fs::write(vol.join("..2026_11_21_10_00_02.000/app.conf"), "v1").unwrap();
        fs::write(vol.join("..2026_11_21_10_00_02.000/extra.conf"), "e1").unwrap();
        symlink("..2026_11_21_10_00_02.000", vol.join("..data_tmp")).unwrap();
        fs::rename(vol.join("..data_tmp"), vol.join("..data")).unwrap();

        let whole = plain_scan(std::slice::from_ref(&vol), &HashKey::fixed());
        let key = plain_scan(&[vol.join("extra.conf")], &HashKey::fixed());
        assert_eq!(whole.files, 2);
        assert_eq!(whole.unpublished, vec![vol.join("extra.conf")]);
        assert_eq!(key.files, 1);
        assert!(key.missing.is_empty());
        assert_eq!(key.unpublished, vec![vol.join("extra.conf")]);

        // Once the kubelet links it, nothing changed.
        symlink("..data/extra.conf", vol.join("extra.conf")).unwrap();
        let whole_after = plain_scan(std::slice::from_ref(&vol), &HashKey::fixed());
        assert!(whole_after.unpublished.is_empty());
        assert_eq!(whole_after.fingerprint, whole.fingerprint);
        assert_eq!(fp(&[vol.join("extra.conf")]), key.fingerprint);
    }

    #[test]
    fn fifos_are_never_opened() {
        let d = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&d.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        fs::write(d.path().join("a"), "1").unwrap();
        let s = plain_scan(&[d.path().to_path_buf()], &HashKey::fixed());
        assert_eq!(s.files, 1);
    }

    #[test]
    fn a_fifo_renamed_over_a_file_after_it_was_looked_up_is_not_waited_for() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("app.conf");
        nix::unistd::mkfifo(&f, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // As if the lookup had found a regular file: hash it directly.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = f.clone();
        std::thread::spawn(move || {
            let mut unregistered = Unregistered;
            let mut s = Scanner::new(&mut unregistered, &OwnFiles::default());
            s.hash_file(Path::new("app.conf"), &path);
            tx.send((s.files, s.hasher.finalize())).unwrap();
        });
        let (files, raced) = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("hashing a FIFO blocked");
        assert_eq!(files, 0, "a FIFO is not a covered file");
        // The same as when the lookup sees the FIFO, so the race does not
        // make a change of its own.
        let mut unregistered = Unregistered;
        let mut seen = Scanner::new(&mut unregistered, &OwnFiles::default());
        seen.cover(Path::new("app.conf"), &f, 0);
        assert_eq!(seen.hasher.finalize(), raced);
    }

    /// Makes a change in each directory at the moment it is registered,
    /// as a writer racing the scan would.
    struct ChangeOnRegister(Vec<(PathBuf, &'static str)>);

    impl Registrar for ChangeOnRegister {
        fn watch_dir(&mut self, dir: &Path) -> Result<Option<i32>, Errno> {
            for (file, content) in &self.0 {
                if file.parent() == Some(dir) {
                    fs::write(file, content).unwrap();
                }
            }
            Ok(Some(1))
        }
    }

    #[test]
    fn a_directory_is_registered_before_it_is_read() {
        let d = tempfile::tempdir().unwrap();
        let conf = d.path().join("conf");
        fs::create_dir(&conf).unwrap();
        fs::write(conf.join("a.conf"), "1").unwrap();
        let late = conf.join("late.conf");
        let mut registrar = ChangeOnRegister(vec![(late.clone(), "x")]);
        let s = scan(
            std::slice::from_ref(&conf),
            &HashKey::fixed(),
            &OwnFiles::default(),
            &mut registrar,
        );
        assert_eq!(
            s.files, 2,
            "a file made once the directory is watched is read"
        );
        assert_eq!(s.dirs[&conf].wd, Ok(Some(1)));
        assert_eq!(s.fingerprint, fp(&[conf]));
    }

    #[test]
    fn a_path_that_appears_as_its_directory_is_registered_is_found() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("sub");
        let link = d.path().join("link");
        fs::create_dir(&sub).unwrap();
        // The file itself, and a symlink on the way to it.
        let direct = d.path().join("app.conf");
        let through = link.join("b.conf");
        let mut registrar = ChangeOnRegister(vec![(direct.clone(), "a")]);
        let s = scan(
            std::slice::from_ref(&direct),
            &HashKey::fixed(),
            &OwnFiles::default(),
            &mut registrar,
        );
        assert!(s.missing.is_empty(), "{:?}", s.missing);
        assert_eq!(s.files, 1);
        fs::write(sub.join("b.conf"), "b").unwrap();
        struct LinkOnRegister(PathBuf, PathBuf);
        impl Registrar for LinkOnRegister {
            fn watch_dir(&mut self, dir: &Path) -> Result<Option<i32>, Errno> {
                if self.1.parent() == Some(dir) && !self.1.exists() {
                    symlink(&self.0, &self.1).unwrap();
                }
                Ok(Some(1))
            }
        }
        let s = scan(
            std::slice::from_ref(&through),
            &HashKey::fixed(),
            &OwnFiles::default(),
            &mut LinkOnRegister(sub.clone(), link.clone()),
        );
        assert!(s.missing.is_empty(), "{:?}", s.missing);
        assert_eq!(s.files, 1);
    }

    #[test]
    fn registration_failures_are_reported_per_directory() {
        struct Full;
        impl Registrar for Full {
            fn watch_dir(&mut self, _: &Path) -> Result<Option<i32>, Errno> {
                Err(Errno::ENOSPC)
            }
        }
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a"), "1").unwrap();
        let s = scan(
            &[d.path().to_path_buf()],
            &HashKey::fixed(),
            &OwnFiles::default(),
            &mut Full,
        );
        assert_eq!(s.files, 1, "the scan goes on");
        assert_eq!(s.dirs[d.path()].wd, Err(Errno::ENOSPC));
    }

    #[test]
    fn tends_own_files_are_never_covered_even_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let run = d.path().join("run");
        fs::create_dir(&run).unwrap();
        fs::write(run.join("app.conf"), "1").unwrap();
        let before = fp(std::slice::from_ref(&run));
        let own = OwnFiles::new(vec![run.join("ready"), run.join("status.json")]);
        let link = d.path().join("conf");
        symlink(&run, &link).unwrap();
        for name in [
            "ready",
            "status.json",
            ".ready.0123456789abcdef.tmp",
            ".status.json.tmp.42",
        ] {
            fs::write(run.join(name), "tend's").unwrap();
        }
        let s = scan(
            &[run.clone(), link.join("ready")],
            &HashKey::fixed(),
            &own,
            &mut Unregistered,
        );
        assert_eq!(s.files, 1);
        assert!(s.missing.is_empty());
        assert_eq!(
            s.dirs[&run].own,
            [OsString::from("ready"), OsString::from("status.json")],
            "their events are ignored"
        );
        let only_run = scan(
            std::slice::from_ref(&run),
            &HashKey::fixed(),
            &own,
            &mut Unregistered,
        );
        assert_eq!(
            only_run.fingerprint, before,
            "as if tend's files were not there"
        );
    }

    #[test]
    fn own_names_are_the_file_and_its_temporary_files() {
        let own = OsStr::new("ready");
        for name in ["ready", ".ready.0123456789abcdef.tmp", ".ready.tmp.1234"] {
            assert!(is_own_name(own, OsStr::new(name)), "{name}");
        }
        for name in [
            "ready.conf",
            ".ready",
            ".ready.0123456789abcdeg.tmp",
            ".ready.0123.tmp",
            ".ready.tmp.",
            ".ready.tmp.12a",
            ".readyx.0123456789abcdef.tmp",
        ] {
            assert!(!is_own_name(own, OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn fingerprints_are_keyed() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("secret");
        fs::write(&f, "hunter2").unwrap();
        let a = plain_scan(std::slice::from_ref(&f), &HashKey::fixed()).fingerprint;
        let b = plain_scan(&[f], &HashKey::random()).fingerprint;
        assert_ne!(a, b);
    }
}
