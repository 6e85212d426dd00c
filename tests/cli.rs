//! The command line and logs as a person meets them: a quiet plain init,
//! help and version, `tend status`, and typed JSON logs.

mod common;

use common::*;

#[test]
fn a_plain_init_is_silent_unless_asked() {
    let sb = Sandbox::new();
    let (code, out, err) = sb.tend().command(&["sh", "-c", "echo hi"]).run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "hi\n");
    assert_eq!(err, "", "tend wrote to the service's terminal");

    let (code, out, err) = sb
        .tend()
        .env("TEND_LOG", "info")
        .command(&["sh", "-c", "echo hi"])
        .run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "hi\n");
    assert!(
        err.contains("INFO service started") && err.contains("INFO service exited"),
        "{err}"
    );
}

#[test]
fn with_a_config_tend_logs_at_info() {
    let sb = Sandbox::new();
    let config =
        sb.config("[service]\ncommand = [\"sh\", \"-c\", \"echo hi\"]\nrestart = \"never\"\n");
    let (code, out, err) = sb.tend().config(&config).run(secs(10.0));
    assert_eq!(code, 0);
    assert_eq!(out, "hi\n");
    assert!(err.contains("INFO service started"), "{err}");
}
