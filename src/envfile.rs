//! `service.env_from`: variables for the service from mounted files, read
//! afresh at every start of the service, so a restart brings a changed
//! Secret into the new process.
//!
//! Theory of operation. Each path is one of two forms:
//! - a regular file of `NAME=value` lines, as Docker's `--env-file`: the
//!   value is everything after the first `=`, verbatim (no quotes removed,
//!   no expansion); blank lines and lines starting with `#` are skipped, and
//!   so is whitespace at the start of a line and a `\r` at its end, and a
//!   UTF-8 byte order mark at the start of the file;
//! - a directory with one variable per regular file, as a Kubernetes Secret
//!   or ConfigMap volume: the file's name is the name, its content, verbatim,
//!   the value. Names starting with `..` are the kubelet's own; when `..data`
//!   is there, the keys are listed and read through one open of it, so every
//!   value comes from the same update of the volume.
//!
//! Names follow Kubernetes' rule for env var names: letters, digits, `_`,
//! `-` and `.`, not starting with a digit. A later path wins over an earlier
//! one, and `service.env` wins over all of them ([`environment`]).
//!
//! This runs on the loop thread, just before the service is spawned, so
//! nothing here may block: every open is `O_NONBLOCK` (a FIFO opens at once,
//! and `fstat` then refuses it), only regular files are read, and all reads
//! together are bounded by [`MAX_BYTES`] and [`MAX_VARIABLES`]: the work of
//! a start is bounded, and signals wait at most that long to be forwarded.
//!
//! Values may be secrets: no error quotes a value, nor any text of a line of
//! an env file (a line that is not `NAME=value` may be part of a key pasted
//! in); errors name the path, the line number and what is wrong.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat};

/// All that env_from reads for one start, files and names together: far
/// above what a Kubernetes Secret can hold (1 MiB), and below the kernel's
/// limit for a process's arguments and environment (2 MiB by default).
pub const MAX_BYTES: usize = 1024 * 1024;

/// The most variables env_from reads for one start, all paths together (a
/// line of an env file or an entry of a directory each counts). Every one is
/// an open, a read and a close on tend's loop: 10,000 keys of a directory
/// take it about 40 ms, while 100,000 small keys, under [`MAX_BYTES`], took
/// half a second and more. No program needs more in its environment.
pub const MAX_VARIABLES: usize = 10_000;

/// At most this many names are shown in the log line of a start.
const NAMES_SHOWN: usize = 10;

/// The kernel's limit for one `NAME=value` string (`MAX_ARG_STRLEN`).
pub const MAX_VARIABLE: usize = 128 * 1024;

/// How often a directory is read again when a key vanished between listing
/// it and opening it (the kubelet removed an old version meanwhile).
const ATTEMPTS: usize = 3;

/// Why env_from could not be read: the service is not started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFromError {
    /// The file at fault as the user names it (a key of a kubelet volume is
    /// named at the top of the volume, not inside `..data`).
    pub path: PathBuf,
    /// The line of an env file, from 1.
    pub line: Option<usize>,
    pub problem: String,
}

impl EnvFromError {
    fn new(path: &Path, problem: impl Into<String>) -> EnvFromError {
        EnvFromError {
            path: path.to_path_buf(),
            line: None,
            problem: problem.into(),
        }
    }

    fn at_line(path: &Path, line: usize, problem: impl Into<String>) -> EnvFromError {
        EnvFromError {
            line: Some(line),
            ..EnvFromError::new(path, problem)
        }
    }
}

impl fmt::Display for EnvFromError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "env_from {}: ", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        f.write_str(&self.problem)
    }
}

impl std::error::Error for EnvFromError {}

/// The service's own variables: those of `env_from`, read now, with `env`
/// on top (as Kubernetes' `env` wins over `envFrom`). Without env_from, `env`
/// itself.
pub fn environment<'a>(
    env_from: &[PathBuf],
    env: &'a BTreeMap<String, String>,
) -> Result<Cow<'a, BTreeMap<String, String>>, EnvFromError> {
    if env_from.is_empty() {
        return Ok(Cow::Borrowed(env));
    }
    let mut vars = read(env_from)?;
    tracing::info!(
        "env_from: {} variable(s) for the service: {}",
        vars.len(),
        some_names(&vars)
    );
    vars.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
    Ok(Cow::Owned(vars))
}

/// The first few names of `vars`, for the log: a summary, however many.
fn some_names(vars: &BTreeMap<String, String>) -> String {
    let shown: Vec<String> = vars
        .keys()
        .take(NAMES_SHOWN)
        .map(|name| match name.char_indices().nth(64) {
            Some((at, _)) => format!("{}…", &name[..at]),
            None => name.clone(),
        })
        .collect();
    match vars.len().saturating_sub(NAMES_SHOWN) {
        0 => shown.join(" "),
        more => format!("{} and {more} more", shown.join(" ")),
    }
}

/// The variables of every path, in order: a later path wins over an
/// earlier one, and a later line over an earlier one.
pub fn read(paths: &[PathBuf]) -> Result<BTreeMap<String, String>, EnvFromError> {
    let mut reader = Reader {
        left: MAX_BYTES,
        count: MAX_VARIABLES,
        vars: BTreeMap::new(),
    };
    for path in paths {
        reader.path(path)?;
    }
    Ok(reader.vars)
}

/// Whether env_from takes `name` as a variable name: Kubernetes' rule,
/// `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_valid_name(name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    name.chars().next().is_some_and(|c| !c.is_ascii_digit()) && name.chars().all(word)
}

struct Reader {
    /// What may still be read, of [`MAX_BYTES`].
    left: usize,
    /// How many variables may still be read, of [`MAX_VARIABLES`].
    count: usize,
    vars: BTreeMap<String, String>,
}

/// Why a directory could not be read: `Vanished` is worth another try.
enum DirError {
    Vanished(EnvFromError),
    Fatal(EnvFromError),
}

impl From<EnvFromError> for DirError {
    fn from(e: EnvFromError) -> DirError {
        DirError::Fatal(e)
    }
}

impl Reader {
    fn path(&mut self, path: &Path) -> Result<(), EnvFromError> {
        let fd = open(AT_FDCWD, path).map_err(|e| match e {
            Errno::ENOENT => EnvFromError::new(
                path,
                "does not exist, and tend does not start the service without its variables: \
                 create it (mount the Secret or ConfigMap), or remove it from env_from",
            ),
            e => EnvFromError::new(path, format!("open() failed: {e}")),
        })?;
        match kind(&fd, path)? {
            Kind::File => {
                let bytes = read_bounded(&fd, path, self.left)?;
                self.left -= bytes.len();
                let vars = parse(path, &bytes, self.count)?;
                self.count -= vars.len();
                self.vars.extend(vars);
                Ok(())
            }
            Kind::Directory => self.directory(&fd, path),
            Kind::Other(what) => Err(EnvFromError::new(
                path,
                format!("is {what}, not a regular file or a directory; tend does not read it"),
            )),
        }
    }

    fn directory(&mut self, dir: &OwnedFd, path: &Path) -> Result<(), EnvFromError> {
        let mut attempt = 1;
        loop {
            match read_directory(dir, path, self.left, self.count) {
                Ok((vars, spent)) => {
                    self.left -= spent;
                    self.count -= vars.len();
                    self.vars.extend(vars);
                    return Ok(());
                }
                Err(DirError::Vanished(_)) if attempt < ATTEMPTS => attempt += 1,
                Err(DirError::Vanished(e) | DirError::Fatal(e)) => return Err(e),
            }
        }
    }
}

/// The variables of a directory and the bytes that cost, of at most `left`
/// bytes and `count` variables.
fn read_directory(
    dir: &OwnedFd,
    path: &Path,
    left: usize,
    count: usize,
) -> Result<(Vec<(String, String)>, usize), DirError> {
    let flags = OFlag::O_DIRECTORY;
    let source = match open_with(dir, "..data", flags) {
        Ok(data) => data,
        // Not a kubelet volume: the directory itself, opened again so each
        // attempt lists it from the start.
        Err(Errno::ENOENT | Errno::ENOTDIR) => open_with(dir, ".", flags)
            .map_err(|e| EnvFromError::new(path, format!("open() of the directory failed: {e}")))?,
        Err(e) => {
            return Err(EnvFromError::new(path, format!("open() of ..data failed: {e}")).into());
        }
    };
    let mut listing = Dir::from_fd(source)
        .map_err(|e| EnvFromError::new(path, format!("fdopendir() failed: {e}")))?;
    let (mut spent, mut listed) = (0, 0);
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| EnvFromError::new(path, format!("readdir() failed: {e}")))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        // Every entry counts, so that a huge directory costs only its
        // listing, and only that far, before a single key is read.
        listed += 1;
        if listed > count {
            return Err(too_many(path).into());
        }
        // The kubelet's `..data`, `..2026_...`.
        if name.starts_with(b"..") {
            continue;
        }
        spent += name.len() + 1;
        if spent > left {
            return Err(too_much(path).into());
        }
        names.push(name.to_vec());
    }
    names.sort();
    let mut vars = Vec::with_capacity(names.len());
    for name in names {
        let shown = path.join(OsStr::from_bytes(&name));
        let Some(var) = std::str::from_utf8(&name).ok().filter(|n| is_valid_name(n)) else {
            return Err(EnvFromError::new(
                &shown,
                format!(
                    "the file name {:?} is not a variable name: {NAME_RULE}",
                    String::from_utf8_lossy(&name)
                ),
            )
            .into());
        };
        let fd = match open(&listing, OsStr::from_bytes(&name)) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                return Err(DirError::Vanished(EnvFromError::new(
                    &shown,
                    "disappeared while the directory was read (is something rewriting it?)",
                )));
            }
            Err(e) => return Err(EnvFromError::new(&shown, format!("open() failed: {e}")).into()),
        };
        match kind(&fd, &shown)? {
            Kind::File => {}
            Kind::Directory => {
                return Err(EnvFromError::new(
                    &shown,
                    format!(
                        "is a directory: env_from takes the files directly in {}, one variable \
                         each; name this directory in env_from itself",
                        path.display()
                    ),
                )
                .into());
            }
            Kind::Other(what) => {
                return Err(EnvFromError::new(
                    &shown,
                    format!("is {what}, not a regular file; tend does not read it"),
                )
                .into());
            }
        }
        let bytes = read_bounded(&fd, &shown, left - spent)?;
        spent += bytes.len();
        let value =
            String::from_utf8(bytes).map_err(|_| EnvFromError::new(&shown, "is not UTF-8 text"))?;
        check_value(var, &value).map_err(|problem| EnvFromError::new(&shown, problem))?;
        vars.push((var.to_string(), value));
    }
    Ok((vars, spent))
}

/// The variables of an env file's text, at most `count` of them. No error
/// quotes the text.
fn parse(path: &Path, bytes: &[u8], count: usize) -> Result<Vec<(String, String)>, EnvFromError> {
    // A byte order mark, as Windows editors write: Docker's --env-file and
    // kubectl's --from-env-file skip it too. Only at the very start.
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut vars = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = std::str::from_utf8(raw)
            .map_err(|_| EnvFromError::at_line(path, n, "is not UTF-8 text"))?
            .trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(EnvFromError::at_line(
                path,
                n,
                "has no `=`: each line is NAME=value (a value with line breaks needs the \
                 directory form, one file per variable)",
            ));
        };
        if !is_valid_name(name) {
            return Err(EnvFromError::at_line(path, n, bad_name(name)));
        }
        check_value(name, value).map_err(|problem| EnvFromError::at_line(path, n, problem))?;
        if vars.len() == count {
            return Err(too_many(path));
        }
        vars.push((name.to_string(), value.to_string()));
    }
    Ok(vars)
}

const NAME_RULE: &str = "use letters, digits, `_`, `-` and `.`, not starting with a digit";

/// What is wrong with the text before the first `=`, without quoting it.
fn bad_name(name: &str) -> String {
    if name.is_empty() {
        return "has nothing before the `=`: each line is NAME=value".into();
    }
    if let Some(rest) = name.strip_prefix("export")
        && rest.starts_with(char::is_whitespace)
        && is_valid_name(rest.trim())
    {
        return "starts with `export`, which env files here do not take: write NAME=value".into();
    }
    if is_valid_name(name.trim_end()) {
        return "has whitespace before the `=`: write NAME=value (the value is everything after \
                the `=`, verbatim)"
            .into();
    }
    format!("the text before the first `=` is not a variable name: {NAME_RULE}")
}

/// Whether `value` can be passed in an environment, naming the variable.
fn check_value(name: &str, value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err(format!(
            "the value of {name} holds a NUL byte, which no environment variable can"
        ));
    }
    let size = name.len() + value.len() + 2;
    if size > MAX_VARIABLE {
        return Err(format!(
            "{name} is {size} bytes; Linux takes at most 128 KiB per variable"
        ));
    }
    Ok(())
}

enum Kind {
    File,
    Directory,
    Other(&'static str),
}

fn kind(fd: &OwnedFd, path: &Path) -> Result<Kind, EnvFromError> {
    let stat = fstat(fd).map_err(|e| EnvFromError::new(path, format!("fstat() failed: {e}")))?;
    Ok(
        match SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Directory,
            SFlag::S_IFIFO => Kind::Other("a FIFO"),
            SFlag::S_IFSOCK => Kind::Other("a socket"),
            SFlag::S_IFCHR => Kind::Other("a character device"),
            SFlag::S_IFBLK => Kind::Other("a block device"),
            _ => Kind::Other("of an unknown type"),
        },
    )
}

/// Opens `path` (from `dir`) for reading without blocking: O_NONBLOCK makes
/// a FIFO open at once instead of waiting for a writer, O_NOCTTY keeps a
/// terminal from becoming PID 1's controlling terminal. Symlinks are
/// followed (a kubelet volume's keys are symlinks).
fn open<Fd: AsFd>(dir: Fd, path: &(impl nix::NixPath + ?Sized)) -> nix::Result<OwnedFd> {
    open_with(dir, path, OFlag::empty())
}

fn open_with<Fd: AsFd>(
    dir: Fd,
    path: &(impl nix::NixPath + ?Sized),
    extra: OFlag,
) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | extra;
    loop {
        match openat(dir.as_fd(), path, flags, Mode::empty()) {
            Err(Errno::EINTR) => continue,
            result => return result,
        }
    }
}

/// The whole of a regular file, if it holds at most `left` bytes.
fn read_bounded(fd: &OwnedFd, path: &Path, left: usize) -> Result<Vec<u8>, EnvFromError> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => return Ok(bytes),
            Ok(n) => {
                bytes.extend_from_slice(&buf[..n]);
                if bytes.len() > left {
                    return Err(too_much(path));
                }
            }
            Err(Errno::EINTR) => {}
            Err(e) => return Err(EnvFromError::new(path, format!("read() failed: {e}"))),
        }
    }
}

fn too_much(path: &Path) -> EnvFromError {
    EnvFromError::new(
        path,
        format!(
            "env_from holds more than {} KiB in all: it is for variables; mount large \
             content as files and let the service read them",
            MAX_BYTES / 1024
        ),
    )
}

fn too_many(path: &Path) -> EnvFromError {
    EnvFromError::new(
        path,
        format!(
            "env_from holds more than {MAX_VARIABLES} variables in all, its limit: each one is \
             read at every start; mount a volume with more keys as files for the service to read"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn read_one(path: &Path) -> Result<BTreeMap<String, String>, EnvFromError> {
        read(&[path.to_path_buf()])
    }

    /// The error for an env file holding `text`.
    fn file_error(text: &str) -> EnvFromError {
        let d = dir();
        let p = d.path().join("env");
        fs::write(&p, text).unwrap();
        read_one(&p).unwrap_err()
    }

    #[test]
    fn an_env_file_is_name_equals_value_lines_taken_verbatim() {
        let d = dir();
        let p = d.path().join("env");
        fs::write(
            &p,
            "# a comment\n\nA=1\n  B=two words \nC=\"quoted\"\nD=x=y\nE=\n   # indented comment\n\
             F=${A} $HOME # not a comment\r\nkube.key-name=ok\nA=later wins\n",
        )
        .unwrap();
        assert_eq!(
            read_one(&p).unwrap(),
            vars(&[
                ("A", "later wins"),
                ("B", "two words "),
                ("C", "\"quoted\""),
                ("D", "x=y"),
                ("E", ""),
                ("F", "${A} $HOME # not a comment"),
                ("kube.key-name", "ok"),
            ])
        );
    }

    #[test]
    fn a_bad_line_is_an_error_with_its_number_that_never_quotes_it() {
        for (text, line, says) in [
            ("A=1\nsecret-without-equals\n", 2, "has no `=`"),
            ("export SECRET=hunter2\n", 1, "`export`"),
            ("SECRET =hunter2\n", 1, "whitespace before the `=`"),
            ("\n\n1SECRET=hunter2\n", 3, "not a variable name"),
            ("SE CRET=hunter2\n", 1, "not a variable name"),
            ("=hunter2\n", 1, "nothing before the `=`"),
            (
                "A=ok\nNAME=hunter2\0\n",
                2,
                "value of NAME holds a NUL byte",
            ),
        ] {
            let e = file_error(text);
            assert_eq!(e.line, Some(line), "{text:?}: {e}");
            let shown = e.to_string();
            assert!(shown.contains(says), "{text:?}: {shown}");
            assert!(
                !shown.contains("hunter2")
                    && !shown.contains("SECRET")
                    && !shown.contains("secret"),
                "the error quotes the line: {shown}"
            );
            assert!(
                shown.starts_with(&format!("env_from {}", e.path.display())),
                "{shown}"
            );
        }
        let d = dir();
        let p = d.path().join("env");
        fs::write(&p, b"A=1\nB=\xff\n").unwrap();
        let e = read_one(&p).unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.problem.contains("UTF-8"), "{e}");
    }

    #[test]
    fn a_byte_order_mark_at_the_start_of_an_env_file_is_skipped_and_nowhere_else() {
        let d = dir();
        let p = d.path().join("env");
        fs::write(&p, "\u{feff}A=1\r\nB=\u{feff}kept\r\n").unwrap();
        assert_eq!(
            read_one(&p).unwrap(),
            vars(&[("A", "1"), ("B", "\u{feff}kept")])
        );
        let e = file_error("A=1\n\u{feff}B=2\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.problem.contains("not a variable name"), "{e}");
        // In the directory form a value is taken verbatim, a mark included.
        fs::remove_file(&p).unwrap();
        fs::write(d.path().join("TOKEN"), "\u{feff}x").unwrap();
        assert_eq!(read_one(d.path()).unwrap(), vars(&[("TOKEN", "\u{feff}x")]));
    }

    #[test]
    fn names_follow_the_kubernetes_rule() {
        for ok in [
            "A",
            "_a",
            "a1",
            "tls.crt",
            "my-key",
            ".dockerconfigjson",
            "-x",
        ] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A B", "A=B", "ä", "A\tB", "A:B", "A/B"] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_directory_is_one_variable_per_file_with_the_content_verbatim() {
        let d = dir();
        fs::write(d.path().join("DB_PASSWORD"), "s3cret\n").unwrap();
        fs::write(d.path().join("tls.crt"), "line 1\nline 2").unwrap();
        fs::write(d.path().join("EMPTY"), "").unwrap();
        fs::write(d.path().join("..hidden_by_kubelet_rule"), "x").unwrap();
        fs::write(d.path().join("target"), "through a link").unwrap();
        symlink("target", d.path().join("LINKED")).unwrap();
        assert_eq!(
            read_one(d.path()).unwrap(),
            vars(&[
                ("DB_PASSWORD", "s3cret\n"),
                ("EMPTY", ""),
                ("LINKED", "through a link"),
                ("target", "through a link"),
                ("tls.crt", "line 1\nline 2"),
            ])
        );
    }

    /// A kubelet volume as the kubelet leaves it: keys in a timestamped
    /// directory, `..data` pointing at it, one symlink per key.
    fn kubelet_volume(root: &Path, keys: &[(&str, &str)], version: u32) {
        let ts = format!("..2026_01_01_00_00_0{version}.000");
        fs::create_dir_all(root.join(&ts)).unwrap();
        for (k, v) in keys {
            fs::write(root.join(&ts).join(k), v).unwrap();
            let _ = symlink(Path::new("..data").join(k), root.join(k));
        }
        let _ = fs::remove_file(root.join("..data_tmp"));
        symlink(&ts, root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    }

    #[test]
    fn a_kubelet_volume_is_read_through_data() {
        let d = dir();
        kubelet_volume(d.path(), &[("USER", "app"), ("PASSWORD", "one")], 1);
        // A key in the new ..data before its top-level link exists counts.
        kubelet_volume(d.path(), &[("USER", "app"), ("PASSWORD", "two")], 2);
        fs::create_dir(d.path().join("..2026_01_01_00_00_09.000")).unwrap();
        let ts = fs::read_link(d.path().join("..data")).unwrap();
        fs::write(d.path().join(&ts).join("NEW"), "added").unwrap();
        assert_eq!(
            read_one(d.path()).unwrap(),
            vars(&[("NEW", "added"), ("PASSWORD", "two"), ("USER", "app")])
        );
    }

    #[test]
    fn what_is_not_a_regular_file_is_an_error_and_a_fifo_never_blocks() {
        let d = dir();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_one(&fifo).unwrap_err();
        assert!(e.problem.contains("is a FIFO"), "{e}");

        let vol = d.path().join("vol");
        fs::create_dir(&vol).unwrap();
        fs::write(vol.join("A"), "1").unwrap();
        nix::unistd::mkfifo(&vol.join("PIPE"), Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_one(&vol).unwrap_err();
        assert_eq!(e.path, vol.join("PIPE"));
        assert!(e.problem.contains("is a FIFO"), "{e}");

        let vol = d.path().join("nested");
        fs::create_dir_all(vol.join("sub")).unwrap();
        let e = read_one(&vol).unwrap_err();
        assert_eq!(e.path, vol.join("sub"));
        assert!(e.problem.contains("is a directory"), "{e}");

        let e = read_one(Path::new("/dev/null")).unwrap_err();
        assert!(e.problem.contains("character device"), "{e}");
    }

    #[test]
    fn a_bad_file_name_in_a_directory_is_named() {
        let d = dir();
        fs::write(d.path().join("1ST"), "x").unwrap();
        let e = read_one(d.path()).unwrap_err();
        assert_eq!(e.path, d.path().join("1ST"));
        assert!(e.problem.contains("\"1ST\" is not a variable name"), "{e}");
        let d = dir();
        fs::write(d.path().join("KEY"), b"\xff").unwrap();
        assert!(
            read_one(d.path())
                .unwrap_err()
                .problem
                .contains("not UTF-8")
        );
    }

    #[test]
    fn a_missing_path_is_an_error_that_says_what_it_would_mean() {
        let d = dir();
        let e = read_one(&d.path().join("nope")).unwrap_err();
        assert!(e.problem.contains("does not exist"), "{e}");
        assert!(e.problem.contains("not start the service without"), "{e}");
        symlink("nowhere", d.path().join("dangling")).unwrap();
        assert!(
            read_one(&d.path().join("dangling"))
                .unwrap_err()
                .problem
                .contains("does not exist")
        );
    }

    #[test]
    fn reads_are_bounded() {
        let d = dir();
        let big = d.path().join("big");
        fs::write(&big, vec![b'#'; MAX_BYTES + 1]).unwrap();
        let e = read_one(&big).unwrap_err();
        assert!(e.problem.contains("more than 1024 KiB"), "{e}");
        // The bound is for all paths together.
        let half = d.path().join("half");
        fs::write(&half, vec![b'#'; MAX_BYTES / 2 + 1]).unwrap();
        assert!(read_one(&half).is_ok());
        let e = read(&[half.clone(), half.clone()]).unwrap_err();
        assert!(e.problem.contains("more than"), "{e}");
        // One variable longer than the kernel takes.
        let long = d.path().join("long");
        fs::write(&long, format!("A={}", "x".repeat(MAX_VARIABLE))).unwrap();
        let e = read_one(&long).unwrap_err();
        assert!(e.problem.contains("at most 128 KiB per variable"), "{e}");
    }

    /// A directory of `n` keys K00000, K00001, ...
    fn keys(n: usize) -> tempfile::TempDir {
        let d = dir();
        for i in 0..n {
            fs::write(d.path().join(format!("K{i:05}")), "v").unwrap();
        }
        d
    }

    #[test]
    fn the_number_of_variables_is_bounded_for_all_paths_together() {
        let full = keys(MAX_VARIABLES);
        assert_eq!(read_one(full.path()).unwrap().len(), MAX_VARIABLES);
        // Entries that are no variables count too: the listing is bounded.
        fs::write(full.path().join("..kubelet_like"), "v").unwrap();
        let e = read_one(full.path()).unwrap_err();
        assert_eq!(e.path, full.path());
        assert_eq!(e.line, None);
        assert!(
            e.to_string()
                .contains("holds more than 10000 variables in all, its limit"),
            "{e}"
        );

        let d = dir();
        let lines = |n: usize| (0..n).map(|i| format!("V{i}=x\n")).collect::<String>();
        let file = d.path().join("env");
        fs::write(&file, lines(MAX_VARIABLES)).unwrap();
        assert_eq!(read_one(&file).unwrap().len(), MAX_VARIABLES);
        fs::write(
            &file,
            format!("# comments do not count\n{}", lines(MAX_VARIABLES + 1)),
        )
        .unwrap();
        assert!(
            read_one(&file)
                .unwrap_err()
                .problem
                .contains("more than 10000 variables")
        );
        // A line that sets a name again counts again: the work is the bound.
        fs::write(&file, "A=1\n".repeat(MAX_VARIABLES + 1)).unwrap();
        assert!(read_one(&file).is_err());

        // All paths together: a full file, then one key more.
        fs::write(&file, lines(MAX_VARIABLES)).unwrap();
        let other = keys(1);
        let e = read(&[file, other.path().to_path_buf()]).unwrap_err();
        assert_eq!(e.path, other.path(), "where the limit was crossed");
    }

    #[test]
    fn the_log_shows_a_few_names_and_how_many_more() {
        let some = |names: &[String]| {
            some_names(&names.iter().map(|n| (n.clone(), String::new())).collect())
        };
        assert_eq!(some(&["B".into(), "A".into()]), "A B");
        let many: Vec<String> = (0..100_000).map(|i| format!("K{i:06}")).collect();
        assert_eq!(
            some(&many),
            "K000000 K000001 K000002 K000003 K000004 K000005 K000006 K000007 K000008 K000009 \
             and 99990 more"
        );
        let long = "L".repeat(100_000);
        assert_eq!(some(&[long]), format!("{}…", "L".repeat(64)));
    }

    #[test]
    fn later_paths_win_and_env_wins_over_all() {
        let d = dir();
        let first = d.path().join("first");
        let second = d.path().join("second");
        fs::write(&first, "A=first\nB=first\nC=first\n").unwrap();
        fs::create_dir(&second).unwrap();
        fs::write(second.join("B"), "second").unwrap();
        fs::write(second.join("C"), "second").unwrap();
        let env = vars(&[("C", "env")]);
        let all = environment(&[first, second], &env).unwrap();
        assert_eq!(*all, vars(&[("A", "first"), ("B", "second"), ("C", "env")]));
        assert!(matches!(environment(&[], &env).unwrap(), Cow::Borrowed(_)));
    }
}
