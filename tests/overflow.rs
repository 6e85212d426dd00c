//! An inotify queue overflow makes tend rescan every watch.
//!
//! The queue size (fs.inotify.max_queued_events) is a global sysctl that the
//! kernel reads when an inotify instance is created, so this test lowers it
//! only while tend starts, and lives alone in its own test binary.

mod common;

use std::fs;

use common::*;
use nix::sys::signal::Signal;

const SYSCTL: &str = "/proc/sys/fs/inotify/max_queued_events";

/// Restores the sysctl even when the test fails.
struct Restore(String);

impl Drop for Restore {
    fn drop(&mut self) {
        fs::write(SYSCTL, &self.0).unwrap();
    }
}

#[test]
fn a_queue_overflow_rescans_every_watch() {
    let sb = Sandbox::new();
    let dir = sb.path("conf.d");
    let conf = sb.write("conf.d/app.conf", "v0");
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\n{}\n[[watch]]\npaths = [{:?}]\non_change = \"signal\"\ndebounce = \"50ms\"\n",
        sb.service_toml(&["--config", &conf.display().to_string()]),
        sb.readiness_toml(),
        dir.display().to_string()
    ));
    let restore = Restore(fs::read_to_string(SYSCTL).unwrap());
    fs::write(SYSCTL, "16").unwrap();
    let mut tend = sb.tend().config(&cfg).start_ready();
    drop(restore);

    // Stopped, tend cannot read its queue: 16 events fill it.
    tend.signal(Signal::SIGSTOP);
    for i in 0..40 {
        fs::write(dir.join(format!("noise{i}")), "x").unwrap();
    }
    fs::write(&conf, "v1").unwrap();
    tend.signal(Signal::SIGCONT);

    tend.wait_stderr("the inotify queue overflowed", secs(5.0));
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    std::thread::sleep(secs(0.3));
    assert_eq!(sb.seen_on("SIGHUP"), ["v1"], "one reload after the rescan");
}
