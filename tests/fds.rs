//! The file descriptors tend's children get. A launcher may leave some open
//! without close-on-exec (a shell's 9 and 251, or systemd-socket-activate's
//! sockets at 3..): the service keeps them, as under tini and dumb-init;
//! the commands tend runs on its own behalf (check, exec, verify,
//! ready_check) get stdin, stdout and stderr only.

mod common;

use std::fs;

use common::kubelet::project;
use common::*;

/// Records which fds from 3 to 1023 are open, as `NAME [fd, ...]` in
/// argv[1], before it opens anything; the service then waits.
const PROBE: &str = "import os, sys, time\n\
    def is_open(fd):\n\
    \x20   try:\n\
    \x20       os.fstat(fd)\n\
    \x20       return True\n\
    \x20   except OSError:\n\
    \x20       return False\n\
    fds = [fd for fd in range(3, 1024) if is_open(fd)]\n\
    with open(sys.argv[1], 'a') as f:\n\
    \x20   f.write(f'{sys.argv[2]} {fds}\\n')\n\
    while sys.argv[2] == 'service':\n\
    \x20   time.sleep(60)\n";

const STRAY: [i32; 2] = [9, 251];

/// tend started with /dev/null open at [`STRAY`] without close-on-exec, and
/// nothing else from 3 up (what the test itself inherited is closed at exec).
fn with_stray_fds(tend: TendBuilder<'_>) -> TendBuilder<'_> {
    with_stray_fds_then(tend, || Ok(()))
}

/// [`with_stray_fds`], then `then` (a seccomp filter).
fn with_stray_fds_then(
    tend: TendBuilder<'_>,
    then: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
) -> TendBuilder<'_> {
    tend.pre_exec(move || {
        // SAFETY: close_range, open, dup2 and close are async-signal-safe.
        unsafe {
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            if fd == -1 {
                return Err(std::io::Error::last_os_error());
            }
            for stray in STRAY {
                if libc::dup2(fd, stray) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            libc::close(fd);
        }
        then()
    })
}

fn probe(sb: &Sandbox, name: &str) -> Vec<String> {
    vec![
        "python3".into(),
        "-c".into(),
        PROBE.into(),
        sb.path("fds.log").display().to_string(),
        name.into(),
    ]
}

/// What each probe saw, by name.
fn seen(sb: &Sandbox, name: &str) -> Vec<String> {
    fs::read_to_string(sb.path("fds.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{name} ")).map(String::from))
        .collect()
}

#[test]
fn the_service_keeps_the_fds_tend_inherited() {
    for pid1 in [true, false] {
        let sb = Sandbox::new();
        let tend = with_stray_fds(sb.tend()).command(&probe(&sb, "service"));
        let mut tend = if pid1 { tend } else { tend.not_pid1() }.start();
        wait_for("the service's fds", secs(10.0), || {
            seen(&sb, "service").pop()
        });
        assert_eq!(seen(&sb, "service"), ["[9, 251]"], "as PID 1: {pid1}");
        tend.signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(tend.wait(secs(10.0)), 128 + libc::SIGTERM);
    }
}

#[test]
fn checks_actions_verify_and_ready_check_get_only_stdio() {
    commands_of_tends_own_get_only_stdio(with_stray_fds);
}

/// Kernels before 5.11 refuse close_range's CLOSE_RANGE_CLOEXEC (EINVAL),
/// those before 5.9 and some seccomp profiles close_range itself (ENOSYS,
/// EPERM): tend marks the fds it inherited one by one instead.
#[test]
#[cfg(target_arch = "x86_64")]
fn commands_of_tends_own_get_only_stdio_where_close_range_is_refused() {
    for errno in [libc::EINVAL, libc::ENOSYS, libc::EPERM] {
        commands_of_tends_own_get_only_stdio(|tend| {
            let deny = DenySyscall::new(libc::SYS_close_range, 2, libc::CLOSE_RANGE_CLOEXEC, errno);
            with_stray_fds_then(tend, move || deny.install())
        });
    }
}

fn commands_of_tends_own_get_only_stdio(start: impl FnOnce(TendBuilder<'_>) -> TendBuilder<'_>) {
    let sb = Sandbox::new();
    let vol = sb.path("config");
    project(&vol, &[("app.conf", "v1")]);
    let cfg = sb.config(&format!(
        "[service]\ncommand = {}\nready_check = {}\n{}\n\
         [[watch]]\nname = \"app\"\npaths = [{:?}]\ncheck = {}\n\
         on_change = \"exec\"\nexec = {}\nverify = {}\n",
        toml_list(&probe(&sb, "service")),
        toml_list(&probe(&sb, "ready_check")),
        sb.readiness_toml(),
        vol.display().to_string(),
        toml_list(&probe(&sb, "check")),
        toml_list(&probe(&sb, "exec")),
        toml_list(&probe(&sb, "verify")),
    ));
    let mut tend = start(sb.tend().config(&cfg)).start();
    sb.wait_ready(true, secs(10.0));
    project(&vol, &[("app.conf", "v2")]);
    wait_for("the change's verify", secs(10.0), || {
        seen(&sb, "verify").pop()
    });
    for name in ["check", "ready_check", "exec", "verify"] {
        let seen = seen(&sb, name);
        assert!(
            !seen.is_empty() && seen.iter().all(|fds| fds == "[]"),
            "{name}: {seen:?}"
        );
    }
    assert_eq!(seen(&sb, "service"), ["[9, 251]"]);
    tend.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 128 + libc::SIGTERM);
}
