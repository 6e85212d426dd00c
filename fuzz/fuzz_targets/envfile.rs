//! An env file of `env_from` (`NAME=value` lines), read from disk as the
//! service's start reads it.
#![no_main]

use std::path::PathBuf;
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use tend::envfile;

static FILE: LazyLock<(tempfile::TempDir, PathBuf)> = LazyLock::new(|| {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("app.env");
    (dir, file)
});

fuzz_target!(|data: &[u8]| {
    let (_, file) = &*FILE;
    std::fs::write(file, data).expect("write the env file");
    let lines = data.split(|&b| b == b'\n').count();
    match envfile::read(std::slice::from_ref(file)) {
        Ok(vars) => {
            // What was read can be written back as an env file that reads
            // the same.
            let mut again = Vec::new();
            for (name, value) in &vars {
                assert!(envfile::is_valid_name(name), "name {name:?}");
                assert!(!value.contains(['\0', '\n']), "value of {name}");
                // CRLF: a value may end with a CR of its own.
                again.extend_from_slice(format!("{name}={value}\r\n").as_bytes());
            }
            std::fs::write(file, &again).expect("write the env file");
            assert_eq!(envfile::read(std::slice::from_ref(file)).unwrap(), vars);
        }
        Err(e) => {
            assert_eq!(&e.path, file);
            if let Some(line) = e.line {
                assert!((1..=lines).contains(&line), "line {line} of {lines}");
            }
        }
    }
});
