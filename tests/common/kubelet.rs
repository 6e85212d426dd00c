//! The kubelet's AtomicWriter (pkg/volume/util/atomic_writer.go), reduced to
//! its filesystem operations in their order, to project a ConfigMap or Secret
//! volume the way a pod sees it:
//!
//! ```text
//! <dir>/..2026_11_21_10_00_00.123456/   the data, one directory per version
//! <dir>/..data -> ..2026_11_21_10_00_00.123456
//! <dir>/app.conf -> ..data/app.conf     one symlink per top-level key
//! ```
//!
//! An update writes a new timestamped directory, points `..data_tmp` at it,
//! renames `..data_tmp` over `..data` (the commit point), creates symlinks
//! for new keys, removes symlinks of keys that are gone, and then removes the
//! previous timestamped directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

fn files_under(root: &Path, rel: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
    for entry in fs::read_dir(root.join(rel)).unwrap().flatten() {
        let r = rel.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            files_under(root, &r, out);
        } else {
            out.insert(
                r.to_string_lossy().into_owned(),
                fs::read(root.join(&r)).unwrap(),
            );
        }
    }
}

fn top(key: &str) -> &str {
    key.split('/').next().unwrap()
}

/// Projects `payload` (key -> content) into `dir` with file mode `mode`.
/// Returns false when nothing changed (only missing key symlinks are made).
pub fn project_mode(dir: &Path, payload: &[(&str, &str)], mode: u32) -> bool {
    fs::create_dir_all(dir).unwrap();
    let data = dir.join("..data");
    let new: BTreeMap<String, Vec<u8>> = payload
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect();
    let new_tops: BTreeSet<&str> = new.keys().map(|k| top(k)).collect();
    let old_ts = fs::read_link(&data).ok();
    let mut stale = BTreeSet::new();
    if let Some(old) = &old_ts {
        let mut old_files = BTreeMap::new();
        files_under(&dir.join(old), Path::new(""), &mut old_files);
        stale = old_files
            .keys()
            .map(|k| top(k).to_string())
            .filter(|t| !new_tops.contains(t.as_str()))
            .collect();
        if old_files == new && stale.is_empty() {
            link_visible(dir, &new_tops);
            return false;
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let ts_dir = tempfile::Builder::new()
        .prefix(&format!("..{}.", now.as_secs()))
        .tempdir_in(dir)
        .unwrap()
        .keep();
    fs::set_permissions(&ts_dir, fs::Permissions::from_mode(0o755)).unwrap();
    for (key, content) in &new {
        let p = ts_dir.join(key);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    symlink(ts_dir.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
    fs::rename(dir.join("..data_tmp"), &data).unwrap();
    link_visible(dir, &new_tops);
    for t in stale {
        let _ = fs::remove_file(dir.join(t));
    }
    if let Some(old) = old_ts {
        fs::remove_dir_all(dir.join(old)).unwrap();
    }
    true
}

pub fn project(dir: &Path, payload: &[(&str, &str)]) -> bool {
    project_mode(dir, payload, 0o644)
}

fn link_visible(dir: &Path, tops: &BTreeSet<&str>) {
    for t in tops {
        let visible = dir.join(t);
        if fs::symlink_metadata(&visible).is_err() {
            symlink(Path::new("..data").join(t), visible).unwrap();
        }
    }
}
