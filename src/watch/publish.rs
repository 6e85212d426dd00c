//! `publish`: a directory that holds the last content of a watch that passed
//! its check, laid out like a kubelet volume, which the service reads
//! instead of the watched paths.
//!
//! ```text
//! DIR/..data -> ..2026_11_22_10_00_00.123456789     the published generation
//! DIR/..2026_11_22_10_00_00.123456789/nginx.conf    the files, modes kept
//! DIR/nginx.conf -> ..data/nginx.conf               one symlink per key
//! ```
//!
//! A change becomes a *candidate* generation next to the published one: a
//! copy made while the watch is scanned ([`super::scan::scan_copying`]), so
//! what is copied is exactly what is fingerprinted. Only a candidate that
//! passed its check is published, by the kubelet's own sequence: a symlink
//! `..data_tmp` renamed over `..data` (one atomic step: a reader sees the old
//! generation or the new one, never a mix), then the key symlinks the new
//! generation adds, then the removal of those it dropped and of the old
//! generation. A failed candidate is removed. So the directory holds at most
//! two generations: the published one and the one being checked.
//!
//! With `verify`, the generation published before is kept until the new
//! one passed verify, named by the symlink `..previous`; a rollback
//! publishes it again and leaves `..rejected`, a salted digest of what was
//! rejected. Both outlive tend, as the directory does: a tend that starts
//! while `..previous` is there was stopped in the middle of a verify, and
//! rolls back first; and the first content it sees is not applied when it
//! is the rejected one. A change that was not applied (its action failed)
//! and is replaced by newer content is withdrawn before the newer content
//! is copied: the kept generation is published again, so no third one is
//! ever beside them.
//!
//! Every call here is made by the watcher thread (or before the loop
//! starts), never by PID 1's loop.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, symlink};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use crate::core::protocol::{Keep, Restored};

/// The symlink that names the published generation.
pub const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";
const LINK_TMP: &str = "..link_tmp";
/// The symlink that names the generation kept to roll back to.
const PREVIOUS: &str = "..previous";
/// The digest of the content last rolled back.
const REJECTED: &str = "..rejected";

/// Makes `dir` ready for publishing, at start-up: creates it, removes what
/// an earlier tend left half done (candidates, temporary links, a record of
/// rejected content being written), and returns
/// the generation an earlier tend published, if there is one (an emptyDir
/// outlives the container). With `verify`, a change whose verify was cut
/// short is rolled back and counts as rejected; without it, what recorded
/// verifies is dropped. A directory that holds anything tend does not write
/// there is an error: tend never deletes what it did not write, nor follows
/// a symlink it did not make.
pub fn prepare(dir: &Path, verify: bool) -> io::Result<Option<Restored>> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| with_path(e, "cannot create", dir))?;
    for entry in fs::read_dir(dir).map_err(|e| with_path(e, "cannot read", dir))? {
        let entry = entry.map_err(|e| with_path(e, "cannot read", dir))?;
        let name = entry.file_name();
        let kind = entry
            .file_type()
            .map_err(|e| with_path(e, "cannot read", &entry.path()))?;
        if !is_ours(&entry.path(), &name, kind) {
            return Err(io::Error::other(format!(
                "{} holds {name:?}, which tend did not publish: `publish` needs a directory of \
                 its own (an emptyDir such as /run/tend/NAME), and tend never deletes what it \
                 did not write",
                dir.display(),
            )));
        }
    }
    let Some(current) = published(dir) else {
        // Nothing usable: all of it is tend's, and goes.
        for entry in fs::read_dir(dir).map_err(|e| with_path(e, "cannot read", dir))? {
            remove(&entry.map_err(|e| with_path(e, "cannot read", dir))?.path())?;
        }
        return Ok(None);
    };
    let previous = kept(dir).filter(|p| verify && *p != current);
    if let Some(previous) = previous {
        // Stopped while the current generation was verified: it did not
        // pass, so the one before it goes back, and the current one is
        // not published again until the content changes.
        put_back(dir, &dir.join(&current), &dir.join(&previous))?;
        return Ok(Some(Restored {
            generation: previous.to_string_lossy().into_owned(),
            rolled_back: true,
        }));
    }
    if !verify {
        remove(&dir.join(REJECTED))?;
    }
    // A tend killed in the middle of a publication may have left keys
    // unlinked, or a candidate beside it.
    tidy(dir, &dir.join(&current), None)?;
    Ok(Some(Restored {
        generation: current.to_string_lossy().into_owned(),
        rolled_back: false,
    }))
}

/// Whether the entry `name` of a publish directory, at `path` and of type
/// `kind` (not followed), is one tend writes: `..data` and the temporary
/// links as symlinks, generations as directories, keys as symlinks to
/// `..data/NAME`.
fn is_ours(path: &Path, name: &OsStr, kind: fs::FileType) -> bool {
    if name == DATA || name == DATA_TMP || name == LINK_TMP || name == PREVIOUS {
        kind.is_symlink()
    } else if name == REJECTED || is_rejected_temporary(name) {
        kind.is_file()
    } else if is_generation_name(name) {
        kind.is_dir()
    } else {
        kind.is_symlink() && is_key_link(path, name)
    }
}

/// `..rejected` being written: a tend killed then leaves it.
fn is_rejected_temporary(name: &OsStr) -> bool {
    crate::status::is_temporary(OsStr::new(REJECTED), name)
}

/// [`prepare`] for the `publish` directory of each of `watches` (relative
/// to `cwd`): what an earlier tend published, per watch.
pub fn prepare_all(
    watches: &[crate::config::Watch],
    cwd: &Path,
) -> anyhow::Result<Vec<Option<Restored>>> {
    use anyhow::Context as _;
    watches
        .iter()
        .map(|w| match &w.publish {
            Some(dir) => prepare(&cwd.join(dir), w.verify.is_some())
                .with_context(|| format!("watch {:?}: `publish`", w.name)),
            None => Ok(None),
        })
        .collect()
}

/// The name of the generation `..data` points to, when it is there (a
/// directory, not a symlink to one).
fn published(dir: &Path) -> Option<OsString> {
    generation_at(dir, DATA)
}

/// The name of the generation kept to roll back to, when it is there.
fn kept(dir: &Path) -> Option<OsString> {
    generation_at(dir, PREVIOUS)
}

/// The generation the symlink `link` of `dir` points to, if it exists.
fn generation_at(dir: &Path, link: &str) -> Option<OsString> {
    let target = fs::read_link(dir.join(link)).ok()?;
    let name = target.as_os_str();
    let ok =
        is_generation_name(name) && fs::symlink_metadata(dir.join(name)).is_ok_and(|m| m.is_dir());
    ok.then(|| name.to_os_string())
}

/// Points the symlink `link` of `dir` at `target`, in one atomic step.
fn relink(dir: &Path, link: &Path, target: &Path) -> io::Result<()> {
    let tmp = dir.join(LINK_TMP);
    remove(&tmp)?;
    symlink(target, &tmp).map_err(|e| with_path(e, "cannot create", &tmp))?;
    fs::rename(&tmp, link).map_err(|e| with_path(e, "cannot rename over", link))
}

/// Creates an empty candidate generation in `dir`; returns its path.
pub fn create_generation(dir: &Path) -> io::Result<PathBuf> {
    let stamp = crate::time::generation_stamp(SystemTime::now());
    for n in 0.. {
        let name = if n == 0 {
            format!("..{stamp}")
        } else {
            format!("..{stamp}_{n}")
        };
        let path = dir.join(name);
        match fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 100 => {}
            Err(e) => return Err(with_path(e, "cannot create", &path)),
        }
    }
    unreachable!("the loop returns")
}

/// Publishes the candidate `generation` (a path made by
/// [`create_generation`] in `dir`), then removes every other generation but
/// the one to `keep`, which is returned when it is there.
pub fn publish(dir: &Path, generation: &Path, keep: &Keep) -> io::Result<Option<PathBuf>> {
    let previous = swap(dir, generation, keep)?;
    // What is published now was not rejected.
    remove(&dir.join(REJECTED))?;
    Ok(previous)
}

/// [`publish`], but for what was recorded as rejected.
fn swap(dir: &Path, generation: &Path, keep: &Keep) -> io::Result<Option<PathBuf>> {
    let name = generation_name(dir, generation)?;
    let previous = match keep {
        Keep::Nothing => None,
        Keep::Published => published(dir),
        Keep::Generation(g) => Some(generation_name(dir, g)?.to_os_string()).filter(|_| g.is_dir()),
    }
    .filter(|p| p != name);
    // Named before the swap: a tend stopped after it knows what to go back
    // to. (Without one to keep, `..previous` goes once the swap is done, by
    // `tidy`: a rollback stopped before it is done again.)
    if let Some(p) = &previous {
        relink(dir, &dir.join(PREVIOUS), Path::new(p))?;
    }
    let tmp = dir.join(DATA_TMP);
    remove_link(&tmp)?;
    symlink(name, &tmp).map_err(|e| with_path(e, "cannot create", &tmp))?;
    fs::rename(&tmp, dir.join(DATA))
        .map_err(|e| with_path(e, "cannot rename over", &dir.join(DATA)))?;
    tidy(dir, generation, previous.as_deref())?;
    Ok(previous.map(|p| dir.join(p)))
}

/// Publishes `generation`, kept by [`publish`], again: the content
/// published now failed verify, and is recorded as rejected. Tried again
/// after a failure, it completes what the failed try left.
pub fn roll_back(dir: &Path, generation: &Path) -> io::Result<()> {
    let name = generation_name(dir, generation)?;
    match published(dir) {
        Some(current) if current != name => put_back(dir, &dir.join(current), generation),
        // An earlier try swapped `..data` already (and recorded what it
        // replaced), then failed: the content now published is not the
        // rejected one.
        _ => swap(dir, generation, &Keep::Nothing).map(drop),
    }
}

/// Publishes `generation`, kept by [`publish`], again, and removes the one
/// published after it: that change was never applied (its action failed),
/// and newer content replaces it. Unlike [`roll_back`], nothing is
/// recorded as rejected.
pub fn withdraw(dir: &Path, generation: &Path) -> io::Result<()> {
    swap(dir, generation, &Keep::Nothing).map(drop)
}

/// Records `rejected` as such, then publishes `previous` again. In this
/// order, a tend stopped in between finds `..previous` and does it again.
fn put_back(dir: &Path, rejected: &Path, previous: &Path) -> io::Result<()> {
    Rejection::of(rejected)?.record(dir)?;
    swap(dir, previous, &Keep::Nothing).map(drop)
}

/// Whether the content of `candidate` is the one recorded as rejected.
pub fn was_rejected(dir: &Path, candidate: &Path) -> io::Result<bool> {
    let Some(recorded) = Rejection::read(dir)? else {
        return Ok(false);
    };
    Ok(Rejection::with_salt(candidate, recorded.salt)? == recorded)
}

/// Content that failed verify, as a salted SHA-256 of the names and bytes
/// of a generation's files (not their modes or owners, which do not make
/// a change either): the directory outlives tend, and holds no copy of it.
#[derive(Debug, PartialEq, Eq)]
struct Rejection {
    salt: [u8; 16],
    digest: [u8; 32],
}

impl Rejection {
    fn of(generation: &Path) -> io::Result<Rejection> {
        let mut salt = [0u8; 16];
        salt[..8].copy_from_slice(&crate::status::random_u64()?.to_ne_bytes());
        salt[8..].copy_from_slice(&crate::status::random_u64()?.to_ne_bytes());
        Rejection::with_salt(generation, salt)
    }

    fn with_salt(generation: &Path, salt: [u8; 16]) -> io::Result<Rejection> {
        use sha2::{Digest as _, Sha256};
        fn walk(hasher: &mut Sha256, root: &Path, rel: &Path) -> io::Result<()> {
            let dir = root.join(rel);
            let mut names: Vec<OsString> = fs::read_dir(&dir)
                .map_err(|e| with_path(e, "cannot read", &dir))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()
                .map_err(|e| with_path(e, "cannot read", &dir))?;
            names.sort();
            for name in names {
                let rel = rel.join(&name);
                let path = root.join(&rel);
                let meta =
                    fs::symlink_metadata(&path).map_err(|e| with_path(e, "cannot read", &path))?;
                hasher.update(rel.as_os_str().as_bytes());
                if meta.is_dir() {
                    hasher.update(b"\0d\0");
                    walk(hasher, root, &rel)?;
                } else {
                    let mut file =
                        fs::File::open(&path).map_err(|e| with_path(e, "cannot read", &path))?;
                    hasher.update(b"\0f");
                    hasher.update(meta.len().to_le_bytes());
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        match io::Read::read(&mut file, &mut buf) {
                            Ok(0) => break,
                            Ok(n) => hasher.update(&buf[..n]),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(with_path(e, "cannot read", &path)),
                        }
                    }
                }
            }
            Ok(())
        }
        let mut hasher = Sha256::new();
        hasher.update(salt);
        walk(&mut hasher, generation, Path::new(""))?;
        Ok(Rejection {
            salt,
            digest: hasher.finalize().into(),
        })
    }

    /// Writes `..rejected` in `dir`.
    fn record(&self, dir: &Path) -> io::Result<()> {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let line = format!("{} {}\n", hex(&self.salt), hex(&self.digest));
        crate::status::write_atomically(&dir.join(REJECTED), line.as_bytes())
    }

    /// `..rejected` of `dir`, if there is one.
    fn read(dir: &Path) -> io::Result<Option<Rejection>> {
        let path = dir.join(REJECTED);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(with_path(e, "cannot read", &path)),
        };
        let unhex = |s: &str, out: &mut [u8]| {
            s.len() == out.len() * 2
                && out.iter_mut().enumerate().all(|(i, b)| {
                    u8::from_str_radix(s.get(2 * i..2 * i + 2).unwrap_or("x"), 16)
                        .map(|v| *b = v)
                        .is_ok()
                })
        };
        let mut r = Rejection {
            salt: [0; 16],
            digest: [0; 32],
        };
        let mut words = text.split_whitespace();
        let ok = words.next().is_some_and(|s| unhex(s, &mut r.salt))
            && words.next().is_some_and(|d| unhex(d, &mut r.digest));
        if !ok {
            return Err(io::Error::other(format!(
                "{} is not a record of rejected content",
                path.display()
            )));
        }
        Ok(Some(r))
    }
}

/// Links the keys of the published `generation` at the top of `dir`, then
/// removes the links of keys it does not hold and every other generation
/// (but `keep`). The links are part of the publication; what is removed
/// after is not: a removal that fails is logged, and tried again at the
/// next publication.
fn tidy(dir: &Path, generation: &Path, keep: Option<&OsStr>) -> io::Result<()> {
    let mut keys = Vec::new();
    for entry in fs::read_dir(generation).map_err(|e| with_path(e, "cannot read", generation))? {
        let key = entry
            .map_err(|e| with_path(e, "cannot read", generation))?
            .file_name();
        let link = dir.join(&key);
        let target = Path::new(DATA).join(&key);
        if fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            let tmp = dir.join(LINK_TMP);
            remove_link(&tmp)?;
            symlink(&target, &tmp).map_err(|e| with_path(e, "cannot create", &tmp))?;
            fs::rename(&tmp, &link).map_err(|e| with_path(e, "cannot rename over", &link))?;
        }
        keys.push(key);
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!("{}", with_path(e, "cannot read", dir));
            return Ok(());
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let stale_generation = is_generation_name(&name)
            && name != name_of(generation)
            && Some(name.as_os_str()) != keep;
        let dropped_key = !keys.contains(&name) && is_key_link(&entry.path(), &name);
        // `..previous` names a generation only while one is kept.
        let stale_link =
            name == DATA_TMP || name == LINK_TMP || (name == PREVIOUS && keep.is_none());
        let stale_file =
            is_rejected_temporary(&name) && entry.file_type().is_ok_and(|t| t.is_file());
        let removed = if stale_link {
            remove_link(&entry.path())
        } else if stale_generation || dropped_key || stale_file {
            remove(&entry.path())
        } else {
            Ok(())
        };
        if let Err(e) = removed {
            tracing::warn!("publish: {e}; tried again at the next publication");
        }
    }
    Ok(())
}

/// Removes the candidate `generation` of `dir`, unless it is the one
/// published.
pub fn discard(dir: &Path, generation: &Path) -> io::Result<()> {
    let name = generation_name(dir, generation)?;
    if published(dir).as_deref() == Some(name) {
        return Ok(());
    }
    if kept(dir).as_deref() == Some(name) {
        remove(&dir.join(PREVIOUS))?;
    }
    remove(generation)
}

/// `generation`'s name, once it is sure to be a generation of `dir`: a
/// path from elsewhere is never removed or published.
fn generation_name<'a>(dir: &Path, generation: &'a Path) -> io::Result<&'a OsStr> {
    let name = name_of(generation);
    if generation.parent() != Some(dir) || !is_generation_name(name) {
        return Err(io::Error::other(format!(
            "{} is not a generation of {}",
            generation.display(),
            dir.display()
        )));
    }
    Ok(name)
}

fn name_of(path: &Path) -> &OsStr {
    path.file_name().unwrap_or_default()
}

/// `..2026_11_22_10_00_00.123456789`, maybe with `_N`: the name of a
/// generation (not `..data`, `..data_tmp` or `..link_tmp`).
fn is_generation_name(name: &OsStr) -> bool {
    let Some(stamp) = name.as_bytes().strip_prefix(b"..") else {
        return false;
    };
    stamp.first().is_some_and(u8::is_ascii_digit)
        && stamp
            .iter()
            .all(|b| b.is_ascii_digit() || *b == b'_' || *b == b'.')
}

/// A top-level key: a symlink to `..data/NAME`.
fn is_key_link(path: &Path, name: &OsStr) -> bool {
    fs::read_link(path).is_ok_and(|t| t == Path::new(DATA).join(name))
}

/// Removes a file, symlink or directory tree; what is not there is fine.
fn remove(path: &Path) -> io::Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).or_else(|e| {
            // A copy keeps the modes of the directories it copied: a
            // read-only one (0555) cannot be emptied by a tend that is not
            // root until it is writable again.
            if e.kind() != io::ErrorKind::PermissionDenied {
                return Err(e);
            }
            make_writable(path, 0);
            fs::remove_dir_all(path)
        }),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(with_path(e, "cannot remove", path)),
        _ => Ok(()),
    }
}

/// Gives the owner every permission on `dir` and the directories below it
/// (symlinks are not followed), as deep as a copy goes; what fails shows in
/// the removal that follows.
fn make_writable(dir: &Path, depth: usize) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(m) = fs::symlink_metadata(dir) else {
        return;
    };
    if !m.is_dir() || depth > super::scan::MAX_DEPTH + 1 {
        return;
    }
    let mode = m.permissions().mode() & 0o7777;
    if mode & 0o700 != 0o700 {
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o700));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&entry.path(), depth + 1);
            }
        }
    }
}

/// Removes one of tend's temporary symlinks; anything else by that name
/// was not made by tend, and stays.
fn remove_link(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_symlink() => Err(io::Error::other(format!(
            "{} is not a symlink tend made: tend never deletes what it did not write",
            path.display()
        ))),
        _ => remove(path),
    }
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn generation(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
        let g = create_generation(dir).unwrap();
        for (name, text) in files {
            fs::write(g.join(name), text).unwrap();
        }
        g
    }

    /// `a` = 1 published, then `a` = 2 published over it with 1 kept, as
    /// while a change is verified. Returns both generations.
    fn verified_over(dir: &Path) -> (PathBuf, PathBuf) {
        let g1 = generation(dir, &[("a", "1")]);
        publish(dir, &g1, &Keep::Published).unwrap();
        let g2 = generation(dir, &[("a", "2")]);
        publish(dir, &g2, &Keep::Published).unwrap();
        (g1, g2)
    }

    fn read(dir: &Path, key: &str) -> String {
        fs::read_to_string(dir.join(key)).unwrap()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn generations_are_named_like_the_kubelets() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::new(1_795_334_400, 123_456_789);
        assert_eq!(
            crate::time::generation_stamp(t),
            "2026_11_22_08_00_00.123456789"
        );
        let d = tempfile::tempdir().unwrap();
        let a = create_generation(d.path()).unwrap();
        let b = create_generation(d.path()).unwrap();
        assert_ne!(a, b);
        assert!(is_generation_name(name_of(&a)) && is_generation_name(name_of(&b)));
        assert!(!is_generation_name(OsStr::new(DATA)));
        assert!(!is_generation_name(OsStr::new(DATA_TMP)));
    }

    #[test]
    fn publishing_swaps_data_links_the_keys_and_keeps_one_generation() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("pub");
        assert_eq!(prepare(&dir, false).unwrap(), None, "created empty");
        let g1 = generation(&dir, &[("a.conf", "1"), ("b.conf", "1")]);
        publish(&dir, &g1, &Keep::Nothing).unwrap();
        assert_eq!(read(&dir, "a.conf"), "1");
        assert_eq!(
            fs::read_link(dir.join("a.conf")).unwrap(),
            Path::new("..data/a.conf")
        );
        let g2 = generation(&dir, &[("a.conf", "2"), ("c.conf", "2")]);
        assert_eq!(read(&dir, "a.conf"), "1", "a candidate is not published");
        publish(&dir, &g2, &Keep::Nothing).unwrap();
        assert_eq!(read(&dir, "a.conf"), "2");
        assert_eq!(read(&dir, "c.conf"), "2");
        assert!(
            !dir.join("b.conf").exists(),
            "a dropped key's link is removed"
        );
        let gen2 = name_of(&g2).to_string_lossy().into_owned();
        assert_eq!(entries(&dir), [gen2.as_str(), "..data", "a.conf", "c.conf"]);
    }

    #[test]
    fn the_previous_generation_can_be_kept_and_put_back() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1"), ("only-in-1", "x")]);
        assert_eq!(
            publish(&dir, &g1, &Keep::Published).unwrap(),
            None,
            "nothing before"
        );
        let g2 = generation(&dir, &[("a", "2")]);
        assert_eq!(
            publish(&dir, &g2, &Keep::Published).unwrap(),
            Some(g1.clone())
        );
        assert_eq!(read(&dir, "a"), "2");
        assert!(g1.exists(), "kept for a rollback");
        // The rollback: the previous generation, published again.
        assert_eq!(publish(&dir, &g1, &Keep::Nothing).unwrap(), None);
        assert_eq!(read(&dir, "a"), "1");
        assert_eq!(read(&dir, "only-in-1"), "x");
        assert!(!g2.exists(), "the rejected generation is removed");
    }

    #[test]
    fn a_rollback_records_the_rejected_content_until_other_content_is_published() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1")]);
        publish(&dir, &g1, &Keep::Published).unwrap();
        let g2 = generation(&dir, &[("a", "2"), ("b", "2")]);
        publish(&dir, &g2, &Keep::Published).unwrap();
        assert_eq!(
            kept(&dir).as_deref(),
            Some(name_of(&g1)),
            "named while verified"
        );
        roll_back(&dir, &g1).unwrap();
        assert_eq!(read(&dir, "a"), "1");
        assert!(!g2.exists() && kept(&dir).is_none());
        assert!(dir.join(REJECTED).exists());
        // The same names and bytes, whatever their modes: rejected.
        let same = generation(&dir, &[("a", "2"), ("b", "2")]);
        fs::set_permissions(same.join("a"), fs::Permissions::from_mode(0o400)).unwrap();
        assert!(was_rejected(&dir, &same).unwrap());
        let other = generation(&dir, &[("a", "2"), ("b", "3")]);
        assert!(!was_rejected(&dir, &other).unwrap());
        let renamed = generation(&dir, &[("a", "2"), ("c", "2")]);
        assert!(!was_rejected(&dir, &renamed).unwrap());
        // It outlives a restart of tend, not the publication of other content.
        prepare(&dir, true).unwrap();
        assert!(dir.join(REJECTED).exists());
        let g3 = generation(&dir, &[("a", "3")]);
        publish(&dir, &g3, &Keep::Published).unwrap();
        assert!(!dir.join(REJECTED).exists());
        assert!(!was_rejected(&dir, &g3).unwrap());
    }

    #[test]
    fn a_rollback_tried_again_after_it_swapped_data_records_what_was_rejected_not_what_is_back() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let (g1, g2) = verified_over(&dir);
        // A first try that recorded 2 and swapped `..data`, then failed
        // before the rest (the keys' links: a full disk).
        Rejection::of(&g2).unwrap().record(&dir).unwrap();
        relink(&dir, &dir.join(DATA), Path::new(name_of(&g1))).unwrap();
        roll_back(&dir, &g1).unwrap();
        assert_eq!(read(&dir, "a"), "1");
        assert!(!g2.exists() && kept(&dir).is_none());
        let again = generation(&dir, &[("a", "2")]);
        assert!(was_rejected(&dir, &again).unwrap(), "2 stays rejected");
        let back = generation(&dir, &[("a", "1")]);
        assert!(!was_rejected(&dir, &back).unwrap(), "1 is not");
    }

    #[test]
    fn a_change_withdrawn_for_a_newer_one_leaves_the_kept_generation_published() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1"), ("only-in-1", "x")]);
        publish(&dir, &g1, &Keep::Published).unwrap();
        let g2 = generation(&dir, &[("a", "2")]);
        publish(&dir, &g2, &Keep::Published).unwrap();
        withdraw(&dir, &g1).unwrap();
        assert_eq!(read(&dir, "a"), "1");
        assert_eq!(read(&dir, "only-in-1"), "x");
        assert!(!g2.exists() && kept(&dir).is_none());
        assert!(!dir.join(REJECTED).exists(), "nothing was rejected");
        let g1_name = name_of(&g1).to_string_lossy().into_owned();
        assert_eq!(
            entries(&dir),
            [g1_name.as_str(), "..data", "a", "only-in-1"]
        );
        assert!(!prepare(&dir, true).unwrap().unwrap().rolled_back);
    }

    #[test]
    fn a_tend_stopped_while_a_change_was_verified_rolls_it_back_at_start_up() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let (g1, g2) = verified_over(&dir);
        let restored = prepare(&dir, true).unwrap().unwrap();
        assert_eq!(restored.generation, name_of(&g1).to_string_lossy());
        assert!(restored.rolled_back);
        assert_eq!(read(&dir, "a"), "1");
        assert!(!g2.exists() && kept(&dir).is_none());
        let again = generation(&dir, &[("a", "2")]);
        assert!(was_rejected(&dir, &again).unwrap());
        assert!(!prepare(&dir, true).unwrap().unwrap().rolled_back, "once");

        // Without verify (any more), what is published stays.
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let (g1, g2) = verified_over(&dir);
        let restored = prepare(&dir, false).unwrap().unwrap();
        assert_eq!(restored.generation, name_of(&g2).to_string_lossy());
        assert!(!restored.rolled_back && !g1.exists());
        assert_eq!(entries(&dir).len(), 3, "{:?}", entries(&dir));
    }

    #[test]
    fn a_discarded_kept_generation_is_no_longer_named() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let (g1, _) = verified_over(&dir);
        discard(&dir, &g1).unwrap();
        assert!(!g1.exists() && kept(&dir).is_none());
        assert!(!prepare(&dir, true).unwrap().unwrap().rolled_back);
        assert_eq!(read(&dir, "a"), "2");
    }

    #[test]
    fn a_discarded_candidate_is_removed_but_never_the_published_one() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1")]);
        publish(&dir, &g1, &Keep::Nothing).unwrap();
        let g2 = generation(&dir, &[("a", "2")]);
        discard(&dir, &g2).unwrap();
        assert!(!g2.exists());
        discard(&dir, &g1).unwrap();
        assert!(g1.exists(), "the published generation stays");
        assert!(discard(&dir, Path::new("/etc")).is_err());
        assert!(
            discard(&dir, &dir.join("a")).is_err(),
            "a key is not a generation"
        );
    }

    #[test]
    fn an_earlier_generation_is_restored_and_leftovers_removed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1")]);
        publish(&dir, &g1, &Keep::Nothing).unwrap();
        let left = generation(&dir, &[("a", "2")]);
        symlink("..nothing", dir.join(DATA_TMP)).unwrap();
        let restored = prepare(&dir, false)
            .unwrap()
            .expect("a generation was published");
        assert_eq!(restored.generation, name_of(&g1).to_string_lossy());
        assert!(!left.exists() && !dir.join(DATA_TMP).exists());
        assert_eq!(read(&dir, "a"), "1");
    }

    #[test]
    fn a_publication_cut_short_is_completed_at_start_up() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1"), ("gone", "1")]);
        publish(&dir, &g1, &Keep::Nothing).unwrap();
        // Killed after the ..data swap, before the keys were linked.
        let g2 = generation(&dir, &[("a", "2"), ("new", "2")]);
        symlink(name_of(&g2), dir.join(DATA_TMP)).unwrap();
        fs::rename(dir.join(DATA_TMP), dir.join(DATA)).unwrap();
        assert!(!dir.join("new").exists());
        prepare(&dir, false).unwrap().expect("g2 is published");
        assert_eq!(read(&dir, "new"), "2");
        assert!(!dir.join("gone").exists() && !g1.exists());
    }

    #[test]
    fn a_record_of_rejected_content_cut_short_is_removed_at_start_up() {
        for verify in [true, false] {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().to_path_buf();
            let (g1, g2) = verified_over(&dir);
            // Killed while it recorded 2 as rejected, before the rename.
            let left = dir.join("...rejected.0123456789abcdef.tmp");
            fs::write(&left, "0123").unwrap();
            let restored = prepare(&dir, verify).unwrap().unwrap();
            assert!(!left.exists(), "verify = {verify}");
            let back = if verify { &g1 } else { &g2 };
            assert_eq!(restored.generation, name_of(back).to_string_lossy());
            // Nothing is left that a later start refuses.
            prepare(&dir, verify).unwrap().unwrap();
        }
        // And with nothing published.
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("...rejected.fedcba9876543210.tmp"), "").unwrap();
        assert_eq!(prepare(d.path(), true).unwrap(), None);
        assert!(entries(d.path()).is_empty());
    }

    #[test]
    fn a_broken_data_link_restores_nothing_and_clears_the_keys() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_path_buf();
        let g1 = generation(&dir, &[("a", "1")]);
        publish(&dir, &g1, &Keep::Nothing).unwrap();
        fs::remove_dir_all(&g1).unwrap();
        assert_eq!(prepare(&dir, false).unwrap(), None);
        assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
    }

    #[test]
    fn a_directory_with_files_tend_did_not_write_is_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("precious"), "x").unwrap();
        let e = prepare(d.path(), false).unwrap_err().to_string();
        assert!(
            e.contains("\"precious\"") && e.contains("did not publish"),
            "{e}"
        );
        assert!(d.path().join("precious").exists());
    }

    #[test]
    fn what_tend_does_not_write_is_refused_by_name_and_by_type_and_left_alone() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("a"), "planted").unwrap();
        let gen_name = "..2026_01_01_00_00_00.000000000";
        type Plant<'a> = &'a dyn Fn(&Path);
        let plant: [(&str, Plant); 11] = [
            ("a directory of the kubelet's style", &|d| {
                fs::create_dir(d.join("..precious")).unwrap();
                fs::write(d.join("..precious/file"), "x").unwrap();
            }),
            ("..data as a directory", &|d| {
                fs::create_dir(d.join(DATA)).unwrap();
                fs::write(d.join("..data/file"), "x").unwrap();
            }),
            ("a temporary link's name on a file", &|d| {
                fs::write(d.join(DATA_TMP), "x").unwrap();
            }),
            ("a generation's name on a file", &|d| {
                fs::write(d.join(gen_name), "x").unwrap();
            }),
            ("a generation's name on a symlink", &|d| {
                symlink(outside.path(), d.join(gen_name)).unwrap();
                symlink(gen_name, d.join(DATA)).unwrap();
            }),
            ("a name like a generation's", &|d| {
                fs::create_dir(d.join("..2026-backup")).unwrap();
            }),
            ("..previous as a directory", &|d| {
                fs::create_dir(d.join(PREVIOUS)).unwrap();
            }),
            ("..rejected as a symlink", &|d| {
                symlink(outside.path().join("a"), d.join(REJECTED)).unwrap();
            }),
            ("a temporary name of ..rejected on a symlink", &|d| {
                symlink(
                    outside.path().join("a"),
                    d.join("...rejected.0123456789abcdef.tmp"),
                )
                .unwrap();
            }),
            ("a temporary name of ..rejected on a directory", &|d| {
                fs::create_dir(d.join("...rejected.0123456789abcdef.tmp")).unwrap();
            }),
            ("a name like a temporary one", &|d| {
                fs::write(d.join("...rejected.0123456789ABCDEF.tmp"), "x").unwrap();
            }),
        ];
        for (what, plant) in plant {
            let d = tempfile::tempdir().unwrap();
            plant(d.path());
            let before = entries(d.path());
            let e = prepare(d.path(), true).expect_err(what).to_string();
            assert!(e.contains("did not publish"), "{what}: {e}");
            assert_eq!(entries(d.path()), before, "{what}: nothing removed");
            assert!(!d.path().join("a").exists(), "{what}: no key linked");
        }
        assert_eq!(entries(outside.path()), ["a"]);
    }

    #[test]
    fn the_directory_is_created_readable() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/b");
        prepare(&dir, false).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o555, 0o555, "{mode:o}");
    }
}
