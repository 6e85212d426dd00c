//! supervisor.toml as `tend check-config` reads it: from a file, through
//! validation and the checks against the host, to a Config or an error that
//! names its line; and, for a valid config, what check-config prints.
#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use tend::config::{Config, Place};

/// A directory of its own: the host the config is checked against.
static HOST: LazyLock<(tempfile::TempDir, PathBuf)> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("supervisor.toml");
    (dir, file)
});

fuzz_target!(|data: &[u8]| {
    let (dir, file) = &*HOST;
    std::fs::write(file, data).expect("write supervisor.toml");
    let loaded = Config::load_on_host(file, dir.path(), Place::Anywhere);
    let alone = Config::load(file);
    match (&loaded, &alone) {
        (Ok((config, _)), Ok(same)) => assert_eq!(config, same),
        (Ok(_), Err(e)) => panic!("valid on the host, invalid alone: {e}"),
        (Err(on_host), Err(e)) => assert_eq!(on_host.message, e.message),
        (Err(_), Ok(_)) => {} // the host can refuse what the file allows
    }
    let Ok((config, warnings)) = loaded else {
        let e = loaded.unwrap_err();
        if std::str::from_utf8(data).is_ok() {
            assert!(
                e.message.starts_with("line ")
                    || e.message.starts_with("TOML parse error at line "),
                "an error that names no line: {}",
                e.message
            );
        }
        return;
    };
    for w in &warnings {
        assert!(w.starts_with("line "), "a warning that names no line: {w}");
    }
    // What check-config prints is a config tend reads back as the same.
    let described = config.describe();
    match Config::parse(&described) {
        Ok(again) => assert_eq!(again, config, "describe() changed the config:\n{described}"),
        Err(e) => panic!("describe() wrote a config tend refuses: {e}\n{described}"),
    }
});
