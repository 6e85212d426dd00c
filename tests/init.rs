//! tend as a plain init: exit codes, signal forwarding, reaping, a clean
//! start for the service, stdio, and the terminal.

mod common;

use std::process::Stdio;

use common::*;
use nix::sys::signal::Signal;

/// tend as PID 1, or as a child subreaper (how dumb-init's own tests run it).
fn as_pid1(tend: TendBuilder<'_>, pid1: bool) -> TendBuilder<'_> {
    if pid1 { tend } else { tend.not_pid1() }
}

#[test]
fn the_service_exit_code_is_tends_exit_code() {
    let sb = Sandbox::new();
    for pid1 in [true, false] {
        for expected in [0, 1, 2, 3, 32, 64, 127, 254, 255] {
            let exit = format!("exit {expected}");
            let (code, _, err) = as_pid1(sb.tend(), pid1)
                .command(&["sh", "-c", &exit])
                .run(secs(10.0));
            assert_eq!(code, expected, "as PID 1: {pid1}; {err}");
        }
    }
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
    for pid1 in [true, false] {
        for signo in [
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGKILL,
            libc::SIGUSR1,
        ] {
            let kill = format!("kill -{signo} $$");
            let (code, _, err) = as_pid1(sb.tend(), pid1)
                .command(&["sh", "-c", &kill])
                .run(secs(10.0));
            assert_eq!(code, 128 + signo, "as PID 1: {pid1}; {err}");
        }
    }
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
        Signal::SIGPIPE,
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
    let mut tend = as_pid1(tend, pid1).start();
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
    // The stop sends SIGTERM alone: SIGCONT only to a service that is
    // stopped, and this one runs.
    let sigs = sb.log("service sig ");
    let after: Vec<&str> = sigs[signals.len()..]
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(after, ["SIGTERM"], "each signal once, then the stop");
    let err = tend.stderr();
    for name in ["SIGUSR1", "SIGPIPE", "SIGSEGV", "SIGRTMIN+2", "SIGRTMAX"] {
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

/// A write of tend's own to a pipe nobody reads (its stderr, here) raises
/// a SIGPIPE that tend keeps, while one sent with kill reaches the service.
fn tends_own_sigpipe_is_not_forwarded(pid1: bool) {
    let sb = Sandbox::new();
    let tend = sb
        .tend()
        // Every forwarded signal is logged, into a pipe whose reader is gone.
        .env("TEND_LOG", "info")
        .pre_exec(|| {
            let mut fds = [0; 2];
            // SAFETY: pipe, dup2 and close are async-signal-safe.
            unsafe {
                if libc::pipe(fds.as_mut_ptr()) != 0 || libc::dup2(fds[1], 2) != 2 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            Ok(())
        })
        .command(&sb.service(&["--exit-after", "60"]));
    let mut tend = as_pid1(tend, pid1).start();
    sb.wait_log("service start", 1, secs(10.0));
    // tend writes "forwarded SIGHUP" after it forwarded it, before it reads
    // its signals again: its SIGPIPE is queued ahead of the SIGWINCH, and
    // would reach the service first.
    tend.signal(Signal::SIGHUP);
    sb.wait_log("service sig SIGHUP", 1, secs(5.0));
    tend.signal(Signal::SIGWINCH);
    sb.wait_log("service sig SIGWINCH", 1, secs(5.0));
    tend.signal(Signal::SIGPIPE);
    sb.wait_log("service sig SIGPIPE", 1, secs(5.0));
    tend.signal(Signal::SIGTERM);
    assert_eq!(tend.wait(secs(10.0)), 0);
    let got: Vec<String> = sb
        .log("service sig ")
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert_eq!(got, ["SIGHUP", "SIGWINCH", "SIGPIPE", "SIGTERM"]);
}

#[test]
fn tends_own_sigpipe_is_not_forwarded_as_pid1() {
    tends_own_sigpipe_is_not_forwarded(true);
}

#[test]
fn tends_own_sigpipe_is_not_forwarded_by_a_subreaper() {
    tends_own_sigpipe_is_not_forwarded(false);
}

/// dumb-init's sequence: signals sent while a stop is under way (the
/// service ignores SIGTERM) still reach it, in order, and nothing else does.
fn signals_during_a_stop_reach_the_service_in_order(pid1: bool) {
    let sb = Sandbox::new();
    let tend = sb.tend().command(&sb.service(&["--ignore-term"]));
    let mut tend = as_pid1(tend, pid1).start();
    sb.wait_log("service start", 1, secs(10.0));
    let sent = [
        Signal::SIGTERM,
        Signal::SIGQUIT,
        Signal::SIGCONT,
        Signal::SIGINT,
    ];
    for (i, sig) in sent.iter().enumerate() {
        tend.signal(*sig);
        sb.wait_log("service sig ", i + 1, secs(5.0));
    }
    svc::kill(&mut tend, Signal::SIGKILL);
    assert_eq!(tend.wait(secs(10.0)), 137);
    let got: Vec<String> = sb
        .log("service sig ")
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert_eq!(got, sent.map(|s| s.as_str()));
}

#[test]
fn signals_during_a_stop_reach_the_service_in_order_as_pid1() {
    signals_during_a_stop_reach_the_service_in_order(true);
}

#[test]
fn signals_during_a_stop_reach_the_service_in_order_by_a_subreaper() {
    signals_during_a_stop_reach_the_service_in_order(false);
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
    // Each orphan lives 0.2 s, some of them while the rest are made.
    sb.wait_log("service orphans 300", 1, secs(30.0));
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
        .command(&sb.service(&["--orphans", "50", "--orphans-hold"]))
        .start();
    // Each orphan's parent has exited and been waited for: the orphans
    // are tend's children now, alive until the service lets them go.
    sb.wait_log("service orphans 50", 1, secs(30.0));
    let kids = tend.children();
    assert_eq!(kids.len(), 51, "the service and its 50 orphans: {kids:?}");
    assert!(kids.iter().all(|(_, s)| *s != 'Z'), "{kids:?}");
    // SIGUSR1 reaches the service, which lets its orphans go.
    tend.signal(Signal::SIGUSR1);
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

/// Runs tend on a terminal of its own, as `docker run -it` starts PID 1 and
/// as dumb-init's tests start it: a new session whose controlling terminal
/// is a pty, on stdin, stdout and stderr. Types `input` (without echo, and
/// without the line discipline's CR), then returns tend's exit code and
/// everything the terminal showed until the last process let go of it.
fn on_a_terminal(pid1: bool, argv: &[&str], input: &[u8]) -> (i32, String) {
    use nix::fcntl::OFlag;
    use nix::sys::termios::{LocalFlags, OutputFlags, SetArg, tcgetattr, tcsetattr};
    use std::io::{Read as _, Write as _};
    use std::os::fd::AsFd;

    let sb = Sandbox::new();
    let master =
        nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC).unwrap();
    nix::pty::grantpt(&master).unwrap();
    nix::pty::unlockpt(&master).unwrap();
    let name = std::ffi::CString::new(nix::pty::ptsname_r(&master).unwrap()).unwrap();
    let mut attrs = tcgetattr(master.as_fd()).unwrap();
    attrs.local_flags.remove(LocalFlags::ECHO);
    attrs.output_flags.remove(OutputFlags::OPOST);
    tcsetattr(master.as_fd(), SetArg::TCSANOW, &attrs).unwrap();
    let tend = sb.tend().pre_exec(move || {
        // Opened in the child only, so that no other process of this test
        // holds the terminal. SAFETY: async-signal-safe calls.
        unsafe {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // A session leader without a terminal gets the first it opens.
            let fd = libc::open(name.as_ptr(), libc::O_RDWR);
            if fd == -1 {
                return Err(std::io::Error::last_os_error());
            }
            for target in 0..3 {
                if libc::dup2(fd, target) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if fd > 2 {
                libc::close(fd);
            }
        }
        Ok(())
    });
    let mut tend = as_pid1(tend, pid1).command(argv).start();
    let mut terminal = std::fs::File::from(std::os::fd::OwnedFd::from(master));
    terminal.write_all(input).unwrap();
    let deadline = std::time::Instant::now() + secs(15.0);
    let mut shown = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "the terminal was not let go of: {shown:?}");
        let mut fds = [nix::poll::PollFd::new(
            terminal.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        nix::poll::poll(&mut fds, ms).unwrap();
        let mut buf = [0u8; 4096];
        match terminal.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => shown.extend_from_slice(&buf[..n]),
            // EIO: no process has the terminal open any more.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read() on the terminal: {e}"),
        }
    }
    let code = tend.wait(secs(10.0));
    (code, String::from_utf8_lossy(&shown).into_owned())
}

#[test]
fn the_service_reads_and_writes_tends_terminal() {
    for pid1 in [true, false] {
        // Two Ctrl-D: the end of the input, once more for good measure.
        let (code, shown) = on_a_terminal(pid1, &["tac"], b"1\n2\n3\n\x04\x04");
        assert_eq!((code, shown.as_str()), (0, "3\n2\n1\n"), "as PID 1: {pid1}");
    }
}

#[test]
fn a_shell_on_tends_terminal_has_job_control() {
    for pid1 in [true, false] {
        let (code, shown) = on_a_terminal(
            pid1,
            &["bash", "--norc", "--noprofile", "-m"],
            b"echo \"flags are: [[$-]]\"\nexit 0\n",
        );
        assert_eq!(code, 0, "as PID 1: {pid1}: {shown}");
        let flags = shown
            .split("flags are: [[")
            .nth(1)
            .and_then(|rest| rest.split("]]").next())
            .unwrap_or_else(|| panic!("as PID 1: {pid1}: {shown}"));
        assert!(
            flags.contains('m'),
            "job control, as PID 1: {pid1}: {shown}"
        );
        assert!(!shown.contains("no job control"), "{shown}");
    }
}

/// A call in the child that fails, made to fail by a seccomp filter as a
/// container runtime's profile could, is named in the error, and exits 1:
/// EPERM alone would read as "not executable" (126).
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

/// A start that meets the container's limit of processes (clone fails with
/// EAGAIN, as it does at the cgroup's pids.max) names clone and the limit.
#[test]
#[cfg(target_arch = "x86_64")]
fn a_start_at_the_limit_of_processes_names_clone_and_the_limit() {
    // Only tend's clone has these flags: unshare forks, and threads are
    // made with other flags.
    let flags = (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u32;
    a_failed_call_in_the_child_is_named(
        DenySyscall::new(libc::SYS_clone, 0, flags, libc::EAGAIN),
        true,
        "cannot start \"true\": clone() failed: EAGAIN: Try again; \
         the container has as many processes as it may (its cgroup's pids.max",
    );
}

#[test]
fn a_signal_from_inside_the_container_names_its_sender() {
    let sb = Sandbox::new();
    // The service (pid 2) sends SIGHUP to tend, which forwards it back.
    let (code, out, err) = sb
        .tend()
        .env("TEND_LOG", "info")
        .command(&[
            "sh",
            "-c",
            "trap 'echo got HUP; exit 0' HUP; kill -HUP 1; while :; do sleep 0.05; done",
        ])
        .run(secs(10.0));
    assert_eq!((code, out.as_str()), (0, "got HUP\n"), "{err}");
    assert!(
        err.contains("INFO forwarded SIGHUP to the service pid=2 sender_pid=2\n"),
        "{err}"
    );
}
