//! When tend itself fails, it exits 1 and says why.

mod common;

use common::*;

#[test]
fn a_failure_of_tend_itself_exits_1_and_says_why() {
    let sb = Sandbox::new();
    let marker = sb.path("ran");
    // With at most 3 open files, signalfd() has no fd left (EMFILE). stdin
    // and stdout are closed so that the dynamic loader has one to open its
    // libraries with; tend reopens them on /dev/null first.
    let script = "exec prlimit --nofile=3 \"$0\" -- touch \"$1\" <&- >&-";
    let marker_arg = marker.display().to_string();
    let (code, _, err) = sb
        .tend()
        .wrapped(
            "unshare",
            &[
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "sh",
                "-c",
                script,
                TEND,
                &marker_arg,
            ],
        )
        .run(secs(10.0));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("signalfd() failed") && err.contains("Too many open files"),
        "{err}"
    );
    assert!(!marker.exists(), "nothing was started");
}
