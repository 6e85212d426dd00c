//! An env directory of `env_from` (one variable per file, as a Secret or
//! ConfigMap volume), laid out in a temp dir, plain or as the kubelet does
//! it (`..data` pointing at a timestamped directory, each key a symlink).
//!
//! Input: a flags byte (bit 0: the kubelet's layout), then entries separated
//! by NUL bytes, a name then a content each. A name's first byte says what
//! it is: `f` a file (the content is its text), `d` a directory, `p` a
//! FIFO, `l` a symlink (to the content); anything else is a file too.
#![no_main]

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use tend::envfile;

enum Kind {
    File,
    Dir,
    Fifo,
    Symlink,
}

fn lay_out(dir: &Path, kubelet: bool, entries: &[(Kind, &[u8], &[u8])]) -> std::io::Result<()> {
    let data = if kubelet {
        let data = dir.join("..2026_11_25_19_00_00.1");
        std::fs::create_dir(&data)?;
        std::os::unix::fs::symlink("..2026_11_25_19_00_00.1", dir.join("..data"))?;
        data
    } else {
        dir.to_path_buf()
    };
    for (kind, name, content) in entries {
        let name = std::ffi::OsStr::from_bytes(name);
        let path = data.join(name);
        match kind {
            Kind::File => std::fs::write(&path, content)?,
            Kind::Dir => std::fs::create_dir(&path)?,
            Kind::Fifo => nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU)?,
            Kind::Symlink => {
                // A target the kernel takes: not empty, shorter than PATH_MAX.
                let target = match content.len() {
                    0 => b"missing",
                    n => &content[..n.min(1024)],
                };
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &path)?
            }
        }
        if kubelet {
            let link = Path::new("..data").join(name);
            // A name the kubelet's own (`..x`) is not linked at the top.
            let _ = std::os::unix::fs::symlink(link, dir.join(name));
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let kubelet = flags & 1 == 1;
    let mut fields = rest.split(|&b| b == 0);
    let mut entries = Vec::new();
    let mut names = std::collections::BTreeSet::new();
    while let Some(name) = fields.next() {
        let content = fields.next().unwrap_or_default();
        let (kind, name) = match name.split_first() {
            Some((b'f', n)) => (Kind::File, n),
            Some((b'd', n)) => (Kind::Dir, n),
            Some((b'p', n)) => (Kind::Fifo, n),
            Some((b'l', n)) => (Kind::Symlink, n),
            _ => (Kind::File, name),
        };
        // A file name: not empty, no `/`, not `.` or `..`, and new here.
        if name.is_empty()
            || name.len() > 255
            || name.contains(&b'/')
            || name == b"."
            || name == b".."
            || (kubelet && name.starts_with(b".."))
            || !names.insert(name)
        {
            continue;
        }
        entries.push((kind, name, content));
        if entries.len() == 16 {
            break;
        }
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    lay_out(dir.path(), kubelet, &entries).expect("lay out the env directory");
    let before = tend_fuzz::open_fds();
    let read = envfile::read(&[dir.path().to_path_buf()]);
    assert_eq!(tend_fuzz::open_fds(), before, "env_from left an fd open");
    match read {
        Ok(vars) => {
            // Every variable is a file of the directory, with its content.
            let files: BTreeMap<String, Vec<u8>> = entries
                .iter()
                .filter(|(_, name, _)| !name.starts_with(b".."))
                .filter_map(|(kind, name, content)| match kind {
                    Kind::File => Some((String::from_utf8(name.to_vec()).ok()?, content.to_vec())),
                    _ => None,
                })
                .collect();
            for (name, content) in &files {
                let value = vars.get(name).unwrap_or_else(|| panic!("{name} not read"));
                assert_eq!(value.as_bytes(), &content[..], "value of {name}");
            }
            for name in vars.keys() {
                assert!(envfile::is_valid_name(name), "name {name:?}");
            }
        }
        Err(e) => {
            assert!(
                e.path.starts_with(dir.path()),
                "the error names {} outside the directory",
                e.path.display()
            );
            assert_eq!(e.line, None);
        }
    }
});
