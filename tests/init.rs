//! tend as a plain init: exit codes, signal forwarding, reaping, a clean
//! start for the service, stdio, and the terminal.

mod common;

use std::process::Stdio;

use common::*;
use nix::sys::signal::Signal;

#[test]
fn the_service_exit_code_is_tends_exit_code() {
    let sb = Sandbox::new();
    let (code, _, _) = sb.tend().command(&["sh", "-c", "exit 3"]).run(secs(10.0));
    assert_eq!(code, 3);
    let (code, _, _) = sb.tend().command(&["true"]).run(secs(10.0));
    assert_eq!(code, 0);
}

#[test]
fn a_service_killed_by_signal_n_makes_tend_exit_128_plus_n() {
    let sb = Sandbox::new();
    let (code, _, err) = sb
        .tend()
        .env("TEND_LOG", "info")
        .command(&["sh", "-c", "kill -KILL $$"])
        .run(secs(10.0));
    assert_eq!(code, 137);
    assert!(err.contains("killed by SIGKILL"), "{err}");
    let (code, _, _) = sb
        .tend()
        .command(&["sh", "-c", "kill -USR1 $$"])
        .run(secs(10.0));
    assert_eq!(code, 128 + 10);
}

#[test]
fn a_missing_command_exits_127_and_is_named() {
    let sb = Sandbox::new();
    let (code, _, err) = sb.tend().command(&["no-such-program-here"]).run(secs(10.0));
    assert_eq!(code, 127);
    assert!(
        err.contains("no-such-program-here") && err.contains("not found"),
        "{err}"
    );
    let (code, _, err) = sb.tend().command(&["/no/such/file"]).run(secs(10.0));
    assert_eq!(code, 127);
    assert!(err.contains("/no/such/file"), "{err}");
}

#[test]
fn a_command_that_is_not_executable_exits_126() {
    let sb = Sandbox::new();
    let file = sb.write("not-executable", "#!/bin/sh\n");
    let (code, _, err) = sb
        .tend()
        .command(&[file.display().to_string()])
        .run(secs(10.0));
    assert_eq!(code, 126);
    assert!(err.contains("not executable"), "{err}");
}

#[test]
fn no_command_and_no_config_is_a_usage_error() {
    let sb = Sandbox::new();
    let (code, _, err) = sb.tend().run(secs(10.0));
    assert_eq!(code, 2);
    assert!(err.contains("no command"), "{err}");
    let (code, _, err) = sb.tend().args(&["nginx"]).run(secs(10.0));
    assert_eq!(code, 2, "a command without `--`: {err}");
    let (code, _, _) = sb.tend().args(&["--no-such-flag"]).run(secs(10.0));
    assert_eq!(code, 2);
}

#[test]
fn help_and_version_exit_0() {
    let sb = Sandbox::new();
    let (code, out, _) = sb.tend().args(&["--help"]).not_pid1().run(secs(10.0));
    assert_eq!(code, 0);
    assert!(
        out.contains("check-config") && out.contains("probe") && out.contains("Exit status"),
        "{out}"
    );
    let (code, out, _) = sb.tend().args(&["--version"]).not_pid1().run(secs(10.0));
    assert_eq!(code, 0);
    assert!(out.starts_with("tend "), "{out}");
}

/// Every signal tend forwards, by number, with the name the service logs:
/// the classic catchable ones, the fault signals (sent with kill, they are
/// not about tend), and realtime ones, which nix's `Signal` cannot name.
fn forwarded() -> Vec<(i32, String)> {
    let classic = [
        Signal::SIGHUP,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
        Signal::SIGSTKFLT,
        Signal::SIGCONT,
        Signal::SIGTSTP,
        Signal::SIGURG,
        Signal::SIGXCPU,
        Signal::SIGXFSZ,
        Signal::SIGVTALRM,
        Signal::SIGPROF,
        Signal::SIGWINCH,
        Signal::SIGIO,
        Signal::SIGPWR,
        Signal::SIGSEGV,
        Signal::SIGBUS,
        Signal::SIGILL,
        Signal::SIGFPE,
        Signal::SIGTRAP,
        Signal::SIGABRT,
        Signal::SIGSYS,
    ];
    let mut all: Vec<(i32, String)> = classic
        .iter()
        .map(|&s| (s as i32, s.as_str().to_string()))
        .collect();
    all.extend([
        (libc::SIGRTMIN(), "SIGRTMIN".to_string()),
        (libc::SIGRTMIN() + 2, "SIGRTMIN+2".to_string()),
        (libc::SIGRTMAX(), "SIGRTMAX".to_string()),
    ]);
    all
}

/// Sends each signal to tend with kill(2) and checks that the service got
/// it, exactly once, and that tend is still there afterwards.
fn each_signal_is_forwarded_once(pid1: bool) {
    let sb = Sandbox::new();
    // --exit-after: a service orphaned by a tend that died is gone soon.
    // TEND_LOG: a plain init logs each forwarded signal only when asked.
    let tend = sb
        .tend()
        .env("TEND_LOG", "info")
        .command(&sb.service(&["--exit-after", "60"]));
    let tend = if pid1 { tend } else { tend.not_pid1() };
    let mut tend = tend.start();
    sb.wait_log("service start", 1, secs(10.0));
    let signals = forwarded();
    for (i, (signo, name)) in signals.iter().enumerate() {
        tend.signal_number(*signo);
        let lines = sb.wait_log("service sig ", i + 1, secs(5.0));
        let last = lines.last().unwrap();
        assert!(
            last.starts_with(&format!("service sig {name} ")),
            "sent {name}, got {last}"
        );
    }
    assert!(tend.is_running(), "tend should survive every signal");
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    // The stop sends SIGTERM with a SIGCONT (in case the service was
    // stopped); nothing else may come after the forwarded ones.
    let sigs = sb.log("service sig ");
    let after: Vec<&str> = sigs[signals.len()..]
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert!(
        after.iter().filter(|s| **s == "SIGTERM").count() == 1
            && after.iter().all(|s| ["SIGTERM", "SIGCONT"].contains(s)),
        "each signal once, then the stop: {sigs:#?}"
    );
    let err = tend.stderr();
    for name in ["SIGUSR1", "SIGSEGV", "SIGRTMIN+2", "SIGRTMAX"] {
        assert!(
            err.contains(&format!("forwarded {name} to the service")),
            "{err}"
        );
    }
}

#[test]
fn every_catchable_signal_is_forwarded_once() {
    each_signal_is_forwarded_once(true);
}

#[test]
fn every_catchable_signal_is_forwarded_once_by_a_subreaper() {
    each_signal_is_forwarded_once(false);
}

#[test]
fn an_inherited_ignored_sigchld_does_not_hide_the_service_exit() {
    for pid1 in [true, false] {
        let sb = Sandbox::new();
        // Ignored SIGCHLD: the kernel would reap the service behind tend's back.
        let tend = sb.tend().ignoring(&[libc::SIGCHLD]);
        let tend = if pid1 { tend } else { tend.not_pid1() };
        let (code, _, err) = tend.command(&["sh", "-c", "exit 3"]).run(secs(10.0));
        assert_eq!(code, 3, "as PID 1: {pid1}; {err}");
    }
}

#[test]
fn an_inherited_ignored_sigchld_does_not_stop_restarts() {
    for pid1 in [true, false] {
        let sb = Sandbox::new();
        let marker = sb.path("failed-once").display().to_string();
        let config = sb.config(&format!(
            "[service]\ncommand = {}\nrestart = \"on-failure\"\n",
            sb.service_toml(&["--fail-first", &marker, "--exit-after", "60"])
        ));
        let tend = sb.tend().ignoring(&[libc::SIGCHLD]).config(&config);
        let tend = if pid1 { tend } else { tend.not_pid1() };
        let mut tend = tend.start();
        // The first start exits 1; the back-off is 1 s.
        sb.wait_log("service start", 2, secs(15.0));
        assert_eq!(sb.log("service exit"), ["service exit 1"]);
        tend.signal(Signal::SIGTERM);
        assert_eq!(tend.wait(secs(10.0)), 0, "as PID 1: {pid1}");
    }
}

#[test]
fn orphans_are_reaped_as_pid1() {
    let sb = Sandbox::new();
    let mut tend = sb
        .tend()
        .command(&sb.service(&["--orphans", "300", "--orphan-sleep", "0.2"]))
        .start();
    sb.wait_log("service start", 1, secs(10.0));
    // The service forks all 300 before it idles; each orphan lives 0.2 s.
    wait_for("300 orphans to be adopted and reaped", secs(15.0), || {
        let kids = tend.children();
        let zombies = kids.iter().filter(|(_, s)| *s == 'Z').count();
        (kids.len() == 1 && zombies == 0).then_some(())
    });
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn orphans_are_reaped_by_a_subreaper_when_tend_is_not_pid1() {
    let sb = Sandbox::new();
    let mut tend = sb
        .tend()
        .not_pid1()
        .command(&sb.service(&["--orphans", "50", "--orphan-sleep", "1.0"]))
        .start();
    sb.wait_log("service start", 1, secs(10.0));
    let adopted = wait_for("orphans to be adopted by tend", secs(10.0), || {
        let n = tend.children().len();
        (n >= 40).then_some(n)
    });
    assert!(adopted >= 40, "tend adopted only {adopted} orphans");
    wait_for("adopted orphans to be reaped", secs(10.0), || {
        let kids = tend.children();
        (kids.len() == 1 && kids.iter().all(|(_, s)| *s != 'Z')).then_some(())
    });
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
}

#[test]
fn the_service_starts_with_an_empty_mask_and_default_dispositions() {
    let sb = Sandbox::new();
    // tend itself is started with signals blocked and ignored, as a careless
    // parent might leave them; none of that may reach the service.
    let (code, out, err) = sb
        .tend()
        .pre_exec(|| {
            // SAFETY: sigprocmask and signal are async-signal-safe.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR1);
                libc::sigaddset(&mut set, libc::SIGINT);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::signal(libc::SIGQUIT, libc::SIG_IGN);
                libc::signal(libc::SIGRTMIN() + 2, libc::SIG_IGN);
                // The C library's own, which its signal() refuses.
                let ignore = [libc::SIG_IGN as u64, 0, 0, 0];
                for signo in [32, 33] {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        signo,
                        ignore.as_ptr(),
                        std::ptr::null_mut::<u64>(),
                        8,
                    );
                }
            }
            Ok(())
        })
        .command(&["grep", "-E", "^Sig", "/proc/self/status"])
        .run(secs(10.0));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
    assert!(out.contains("SigIgn:\t0000000000000000"), "{out}");
}

#[test]
fn a_standard_stream_tend_was_started_without_is_dev_null_for_the_service() {
    let sb = Sandbox::new();
    // Without stdin and stdout, the first files tend opens would take fds 0
    // and 1, and the service would read tend's signalfd, or write into it.
    let (code, _, err) = sb
        .tend()
        .pre_exec(|| {
            // SAFETY: close is async-signal-safe.
            unsafe {
                libc::close(0);
                libc::close(1);
            }
            Ok(())
        })
        .command(&[
            "sh",
            "-c",
            "exec 3>&1; readlink /proc/self/fd/0 /proc/self/fd/3 >&2",
        ])
        .run(secs(10.0));
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "/dev/null\n/dev/null\n");
}

#[test]
fn stdin_stdout_and_stderr_are_inherited() {
    let sb = Sandbox::new();
    let input = sb.write("input", "from-stdin\n");
    let (code, out, err) = sb
        .tend()
        .stdin(Stdio::from(std::fs::File::open(input).unwrap()))
        .command(&["sh", "-c", "cat; echo to-stdout; echo to-stderr >&2"])
        .run(secs(10.0));
    assert_eq!(code, 0);
    assert!(out.contains("from-stdin\nto-stdout\n"), "{out}");
    assert!(err.contains("to-stderr"), "{err}");
}

#[test]
fn the_service_gets_the_terminal_and_ctrl_c_reaches_it_once() {
    use std::io::Write as _;
    use std::os::fd::{AsRawFd, IntoRawFd};

    let sb = Sandbox::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = pty.slave.into_raw_fd();
    let report = sb.path("tty");
    let probe = format!(
        "import os, signal, sys, time\n\
         got = []\n\
         signal.signal(signal.SIGINT, lambda *a: got.append(1))\n\
         open({report:?}, 'w').write(str(os.tcgetpgrp(0) == os.getpgrp()))\n\
         deadline = time.monotonic() + 10\n\
         while not got and time.monotonic() < deadline: time.sleep(0.01)\n\
         time.sleep(0.3)\n\
         sys.exit(len(got))\n"
    );
    let mut tend = sb
        .tend()
        .pre_exec(move || {
            // A new session whose controlling terminal is the pty, as
            // `docker run -it` gives PID 1. SAFETY: async-signal-safe calls.
            unsafe {
                libc::setsid();
                libc::dup2(slave, 0);
                if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
        .command(&["python3", "-c", &probe])
        .start();
    let owns = wait_for("the service to report its terminal", secs(10.0), || {
        std::fs::read_to_string(&report)
            .ok()
            .filter(|s| !s.is_empty())
    });
    assert_eq!(
        owns, "True",
        "the service should be the terminal's foreground group"
    );
    // Ctrl-C on the terminal: the line discipline signals the foreground group.
    let mut master = std::fs::File::from(pty.master);
    master.write_all(&[3]).unwrap();
    let code = tend.wait(secs(15.0));
    assert_eq!(
        code,
        1,
        "SIGINT should reach the service exactly once (fd {})",
        master.as_raw_fd()
    );
}

/// A call in the child that fails, made to fail by a seccomp filter as a
/// container runtime's profile could, is named in the error, and exits 1:
/// std alone would report only EPERM, which reads as "not executable" (126).
#[cfg(target_arch = "x86_64")]
fn a_failed_call_in_the_child_is_named(deny: DenySyscall, pid1: bool, expected: &str) {
    let sb = Sandbox::new();
    let tend = sb.tend().pre_exec(move || deny.install());
    let tend = if pid1 { tend } else { tend.not_pid1() };
    let (code, _, err) = tend.command(&["true"]).run(secs(10.0));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(expected), "{err}");
    assert!(!err.contains("not executable"), "{err}");
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_failed_reset_of_a_signal_in_the_child_fails_the_start() {
    // Signal 33 is glibc's own: tend never touches it for itself, and resets
    // it in the child only.
    a_failed_call_in_the_child_is_named(
        DenySyscall::new(libc::SYS_rt_sigaction, 0, 33, libc::EPERM),
        true,
        "cannot start \"true\": rt_sigaction(signal 33, SIG_DFL) in the child failed: EPERM",
    );
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_failed_unblocking_of_signals_in_the_child_fails_the_start() {
    // Not as PID 1: unshare's own child sets its mask with SIG_SETMASK too.
    a_failed_call_in_the_child_is_named(
        DenySyscall::new(
            libc::SYS_rt_sigprocmask,
            0,
            libc::SIG_SETMASK as u32,
            libc::EPERM,
        ),
        false,
        "cannot start \"true\": sigprocmask(SIG_SETMASK, empty) in the child failed: EPERM",
    );
}

#[test]
#[cfg(target_arch = "x86_64")]
fn a_failed_handover_of_the_terminal_fails_the_start() {
    use std::os::fd::IntoRawFd;

    let sb = Sandbox::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = pty.slave.into_raw_fd();
    let deny = DenySyscall::new(libc::SYS_ioctl, 1, libc::TIOCSPGRP as u32, libc::EPERM);
    let (code, _, err) = sb
        .tend()
        .pre_exec(move || {
            // tend owns a terminal, as under `docker run -it`; then nothing
            // may set a terminal's foreground group. SAFETY: async-signal-safe.
            unsafe {
                libc::setsid();
                libc::dup2(slave, 0);
                if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            deny.install()
        })
        .command(&["true"])
        .run(secs(10.0));
    drop(pty.master);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot start \"true\": tcsetpgrp() in the child failed: EPERM"),
        "{err}"
    );
}
