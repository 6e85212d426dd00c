//! Runs one test by itself in a fresh process of its own test binary, for
//! tests that take over fd numbers: `sockets::bind_all` puts its sockets at
//! fds 3.., which in a shared test process belong to other tests' files.

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MARK: &str = "TEND_TEST_ALONE";

/// Runs `body` when this process is the fresh one started for `test`;
/// otherwise starts it (with only stdin, stdout and stderr open, as a
/// container's first process) and asserts that exactly that test passed.
pub fn alone(test: &str, body: impl FnOnce()) {
    if std::env::var(MARK).as_deref() == Ok(test) {
        body();
        return;
    }
    // Files, not pipes: a process the test left behind may hold them open.
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(MARK, test)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    // SAFETY: close_range is async-signal-safe; ENOSYS (before Linux 5.9)
    // only leaves inherited fds open.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("start the test binary again");
    drop(cmd);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("{test} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |mut f: &File| {
        let mut s = String::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    let (out, err) = (read(&out), read(&err));
    print!("{out}");
    eprint!("{err}");
    assert!(status.success(), "{test} failed on its own: {status}");
    assert!(
        out.contains("1 passed"),
        "{test} did not run on its own:\n{out}"
    );
}
