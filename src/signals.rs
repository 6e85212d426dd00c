//! Signal names, and which signals tend forwards, keeps, or ignores.
//!
//! tend receives every signal it handles through a signalfd, with those signals
//! blocked from the first instruction of `main`. Nothing in tend runs in a
//! signal handler, so a child between `fork` and `exec` can never run one either,
//! and PID 1 still receives blocked signals (the kernel only drops signals that
//! PID 1 leaves at their default disposition *and* does not block).
//!
//! Signals are handled by number, not as nix's `Signal`, which has no
//! realtime members. The fault signals are blocked too: a real fault of tend
//! is forced by the kernel (unblocked, reset to the default action), so tend
//! still dies of its own fault, while the same signals sent with kill() reach
//! the signalfd and are forwarded, as dumb-init does.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::str::FromStr;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};

/// A signal named in supervisor.toml (`stop_signal`, a watch's `signal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalName(pub Signal);

impl FromStr for SignalName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let upper = s.trim().to_ascii_uppercase();
        let full = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        Signal::from_str(&full)
            .map(SignalName)
            .map_err(|_| format!("unknown signal {s:?}: use a name such as \"SIGHUP\" or \"HUP\""))
    }
}

impl fmt::Display for SignalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

/// Signals the kernel raises for a fault of the process itself. Sent by
/// someone with kill() they are forwarded like any other; raised by the kernel
/// they are about tend itself.
pub const FAULTS: [i32; 7] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGSYS,
];

/// Signals whose disposition in tend is SIG_IGN, which a child must have
/// reset. SIGPIPE: a write of tend's own to a pipe nobody reads (a closed
/// log pipe) must not kill PID 1, and the write's error says more. It is
/// blocked and read like the forwarded signals all the same, so one that
/// another process sends reaches the service (see [`from_own_write`]).
/// SIGTTIN and SIGTTOU: see [`NOT_FORWARDED`].
pub const IGNORED: [i32; 3] = [libc::SIGPIPE, libc::SIGTTIN, libc::SIGTTOU];

/// Signals tend neither reads nor forwards: SIGTTIN and SIGTTOU. tend is in
/// the background once the service owns the terminal; it must not be
/// stopped, nor forward the terminal's complaints about its own writes to
/// the service.
pub const NOT_FORWARDED: [i32; 2] = [libc::SIGTTIN, libc::SIGTTOU];

/// Whether a signal record is the SIGPIPE of a write of tend's own: the
/// kernel raises it on the writing thread as SI_USER with tend's own pid as
/// the sender (on a thread other than the one that reads the signalfd it
/// stays pending there, blocked and harmless). Any other sender's SIGPIPE
/// is forwarded.
pub fn from_own_write(signo: i32, code: i32, from: u32) -> bool {
    signo == libc::SIGPIPE && code == libc::SI_USER && from == std::process::id()
}

/// What tend does with a signal it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// SIGTERM: stop the service, then exit.
    Stop,
    /// SIGINT: forwarded while the service runs, otherwise a stop (the loop decides).
    Interrupt,
    /// SIGCHLD: something may be left to reap.
    Child,
    /// Passed on to the service unchanged.
    Forward,
    /// Not acted on.
    Ignore,
}

/// The role of signal `signo`, whose signalfd record carries `ssi_code`
/// (<= 0 when a process sent it: SI_USER, SI_QUEUE, SI_TKILL; > 0 when the
/// kernel raised it).
pub fn role(signo: i32, ssi_code: i32) -> Role {
    match signo {
        libc::SIGTERM => Role::Stop,
        libc::SIGINT => Role::Interrupt,
        libc::SIGCHLD => Role::Child,
        libc::SIGKILL | libc::SIGSTOP => Role::Ignore,
        _ if NOT_FORWARDED.contains(&signo) => Role::Ignore,
        // A real fault of tend is forced on it by the kernel and never reaches
        // the signalfd; one that does (a memory error reported ahead of time,
        // BUS_MCEERR_AO) concerns tend, not the service.
        _ if FAULTS.contains(&signo) && ssi_code > 0 => Role::Ignore,
        _ if (1..=31).contains(&signo) || realtime().contains(&signo) => Role::Forward,
        // 32 and 33 (and 34 with musl): the C library's own.
        _ => Role::Ignore,
    }
}

/// The realtime signals applications may use, SIGRTMIN..=SIGRTMAX. The C
/// library keeps the ones below SIGRTMIN for itself.
fn realtime() -> std::ops::RangeInclusive<i32> {
    libc::SIGRTMIN()..=libc::SIGRTMAX()
}

/// Every signal tend acts on when a process sends it: the ones it blocks and
/// reads from its signalfd: what [`role`] says of a signal sent with kill().
fn handled_numbers() -> impl Iterator<Item = i32> {
    (1..=31)
        .chain(realtime())
        .filter(|s| ![libc::SIGKILL, libc::SIGSTOP].contains(s) && !NOT_FORWARDED.contains(s))
}

/// The set tend blocks and reads from its signalfd, realtime signals included
/// (nix's `Signal` has no realtime members, so the set is built by number).
pub fn handled() -> SigSet {
    static HANDLED: std::sync::OnceLock<SigSet> = std::sync::OnceLock::new();
    // SAFETY: sigemptyset and sigaddset write into the local set; every
    // number added is a valid signal that the C library lets callers use.
    *HANDLED.get_or_init(|| unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in handled_numbers() {
            libc::sigaddset(&mut set, s);
        }
        SigSet::from_sigset_t_unchecked(set)
    })
}

/// How many signalfd records one [`read_queued`] takes at most.
pub const BATCH: usize = 16;

/// Reads up to `buf.len()` queued signals from the non-blocking signalfd
/// `fd` in one `read(2)`, and returns how many it got: 0 when none was
/// queued. Fewer than `buf.len()` means the queue was empty after them, so
/// a wake-up costs one read, not one per signal plus one to see EAGAIN.
pub fn read_queued(fd: BorrowedFd<'_>, buf: &mut [libc::signalfd_siginfo]) -> Result<usize, Errno> {
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    loop {
        // SAFETY: the kernel writes at most `size_of_val(buf)` bytes into
        // `buf`, whole records only, and signalfd_siginfo is plain data.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(buf),
            )
        };
        match Errno::result(n) {
            Ok(n) => return Ok(n as usize / size),
            Err(Errno::EAGAIN) => return Ok(0),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A signal's disposition, as set with [`set_disposition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    Default,
    Ignore,
}

/// Sets `signo`'s disposition with the raw `rt_sigaction` syscall, which,
/// unlike glibc's `sigaction`, also reaches the signals the C library reserves.
/// Async-signal-safe: used between clone and exec.
pub fn set_disposition(signo: i32, disposition: Disposition) -> Result<(), Errno> {
    // The kernel's struct sigaction: handler, flags, restorer, mask; no flags
    // and an empty mask.
    let handler = match disposition {
        Disposition::Default => libc::SIG_DFL,
        Disposition::Ignore => libc::SIG_IGN,
    };
    let action = [handler as u64, 0, 0, 0];
    // SAFETY: the kernel reads `action`, sized for its struct sigaction with
    // an 8-byte mask, and writes nothing (no old action is asked for).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signo,
            action.as_ptr(),
            std::ptr::null_mut::<u64>(),
            std::mem::size_of::<u64>(),
        )
    };
    Errno::result(ret).map(drop)
}

/// Takes over tend's own signal state. Called first in `main`, before any
/// thread or child exists, so the mask holds everywhere.
///
/// The handled signals are blocked first, so none of them can take its
/// default action while the dispositions are reset. Every disposition tend
/// inherited goes back to the default (a parent that ignored SIGCHLD would
/// have the kernel reap the service behind tend's back), except the C
/// library's own signals between 31 and SIGRTMIN; [`IGNORED`] are ignored.
pub fn take_over() -> Result<(), String> {
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None)
        .map_err(|e| format!("sigprocmask(SIG_BLOCK) failed: {e}; tend cannot receive signals"))?;
    for signo in (1..=31).chain(realtime()) {
        let disposition = match signo {
            libc::SIGKILL | libc::SIGSTOP => continue,
            _ if IGNORED.contains(&signo) => Disposition::Ignore,
            _ => Disposition::Default,
        };
        set_disposition(signo, disposition).map_err(|e| {
            format!(
                "rt_sigaction({}, {disposition:?}) failed: {e}; tend cannot reset the signal \
                 dispositions it inherited",
                describe(signo)
            )
        })?;
    }
    Ok(())
}

/// The pid of the process that sent a signal, for logs: None when the
/// signalfd record says 0, which is a sender outside tend's PID namespace
/// (the container runtime, the kubelet, `kill` on the host) or the kernel.
pub fn sender(from: u32) -> Option<u32> {
    (from != 0).then_some(from)
}

/// A signal number as a name for logs: `SIGHUP`; realtime ones as `kill -l`
/// names them, `SIGRTMIN+2`, `SIGRTMAX-1`; anything else `signal 32`.
pub fn describe(signo: i32) -> String {
    if let Ok(sig) = Signal::try_from(signo) {
        return sig.as_str().to_string();
    }
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    if !(min..=max).contains(&signo) {
        return format!("signal {signo}");
    }
    // The lower half counts up from SIGRTMIN, the upper half down from SIGRTMAX.
    match (signo - min, max - signo) {
        (0, _) => "SIGRTMIN".to_string(),
        (_, 0) => "SIGRTMAX".to_string(),
        (up, _) if up <= (max - min) / 2 => format!("SIGRTMIN+{up}"),
        (_, down) => format!("SIGRTMAX-{down}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_with_or_without_prefix() {
        assert_eq!("SIGHUP".parse::<SignalName>().unwrap().0, Signal::SIGHUP);
        assert_eq!("HUP".parse::<SignalName>().unwrap().0, Signal::SIGHUP);
        assert_eq!("quit".parse::<SignalName>().unwrap().0, Signal::SIGQUIT);
        assert_eq!(
            "SIGUSR2".parse::<SignalName>().unwrap().to_string(),
            "SIGUSR2"
        );
    }

    #[test]
    fn unknown_names_are_rejected_with_the_name() {
        let err = "SIGBOGUS".parse::<SignalName>().unwrap_err();
        assert!(err.contains("SIGBOGUS"), "{err}");
        assert!("".parse::<SignalName>().is_err());
    }

    #[test]
    fn every_catchable_signal_sent_by_a_process_is_forwarded() {
        for signo in [
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGWINCH,
            libc::SIGCONT,
            libc::SIGALRM,
            libc::SIGPIPE,
            libc::SIGTSTP,
            libc::SIGURG,
            libc::SIGPWR,
            libc::SIGRTMIN(),
            libc::SIGRTMIN() + 2,
            libc::SIGRTMAX(),
        ] {
            for code in [
                libc::SI_USER,
                libc::SI_QUEUE,
                libc::SI_TKILL,
                libc::SI_KERNEL,
            ] {
                assert_eq!(role(signo, code), Role::Forward, "{}", describe(signo));
            }
        }
    }

    #[test]
    fn the_handled_set_is_every_signal_a_process_can_send_that_tend_acts_on() {
        let handled = handled();
        for signo in 1..=libc::SIGRTMAX() {
            // SAFETY: sigismember reads the set.
            let member = unsafe { libc::sigismember(handled.as_ref(), signo) } == 1;
            let acted_on = role(signo, libc::SI_USER) != Role::Ignore;
            assert_eq!(member, acted_on, "{}", describe(signo));
        }
    }

    #[test]
    fn fault_signals_are_forwarded_only_when_a_process_sent_them() {
        for signo in FAULTS {
            for code in [libc::SI_USER, libc::SI_QUEUE, libc::SI_TKILL] {
                assert_eq!(role(signo, code), Role::Forward, "{}", describe(signo));
            }
            // BUS_MCEERR_AO is 4, SEGV_MAPERR 1: raised by the kernel.
            for code in [1, 4, libc::SI_KERNEL] {
                assert_eq!(role(signo, code), Role::Ignore, "{}", describe(signo));
            }
        }
    }

    #[test]
    fn tend_keeps_term_int_and_chld_and_ignores_the_rest() {
        assert_eq!(role(libc::SIGTERM, libc::SI_USER), Role::Stop);
        assert_eq!(role(libc::SIGINT, libc::SI_KERNEL), Role::Interrupt);
        assert_eq!(role(libc::SIGCHLD, libc::CLD_EXITED), Role::Child);
        for signo in [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            32,
            33,
            0,
            libc::SIGRTMAX() + 1,
        ] {
            assert_eq!(role(signo, libc::SI_USER), Role::Ignore, "{signo}");
        }
    }

    #[test]
    fn the_handled_set_holds_faults_realtime_signals_and_sigpipe_but_not_ttin_and_ttou() {
        let set = handled();
        let raw = set.as_ref();
        let has = |s| unsafe { libc::sigismember(raw, s) } == 1;
        for s in FAULTS
            .into_iter()
            .chain([libc::SIGTERM, libc::SIGCHLD, libc::SIGINT, libc::SIGHUP])
            .chain([libc::SIGPIPE])
            .chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
        {
            assert!(has(s), "{} should be handled", describe(s));
        }
        for s in NOT_FORWARDED
            .into_iter()
            .chain([libc::SIGKILL, libc::SIGSTOP])
        {
            assert!(!has(s), "{} should not be handled", describe(s));
        }
    }

    #[test]
    fn only_a_sigpipe_of_tends_own_write_is_told_apart() {
        let own = std::process::id();
        assert!(from_own_write(libc::SIGPIPE, libc::SI_USER, own));
        // Another sender, one outside tend's PID namespace (0), or a
        // queued signal claiming tend's pid: forwarded.
        assert!(!from_own_write(libc::SIGPIPE, libc::SI_USER, own + 1));
        assert!(!from_own_write(libc::SIGPIPE, libc::SI_USER, 0));
        assert!(!from_own_write(libc::SIGPIPE, libc::SI_QUEUE, own));
        assert!(!from_own_write(libc::SIGHUP, libc::SI_USER, own));
    }

    /// The kernel's record of a write to a pipe whose reader is gone, read
    /// back from a signalfd on the writing thread.
    #[test]
    fn a_write_to_a_closed_pipe_raises_a_sigpipe_of_tends_own() {
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        std::thread::spawn(|| {
            let mut only = SigSet::empty();
            only.add(Signal::SIGPIPE);
            only.thread_block().unwrap();
            let sfd = SignalFd::with_flags(&only, SfdFlags::SFD_NONBLOCK).unwrap();
            let (read, write) = nix::unistd::pipe().unwrap();
            drop(read);
            assert_eq!(nix::unistd::write(&write, b"x"), Err(Errno::EPIPE));
            let info = sfd.read_signal().unwrap().expect("a pending SIGPIPE");
            assert_eq!(info.ssi_signo as i32, libc::SIGPIPE);
            assert!(from_own_write(
                info.ssi_signo as i32,
                info.ssi_code,
                info.ssi_pid
            ));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn realtime_signals_are_named_as_kill_names_them() {
        let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        assert_eq!(describe(1), "SIGHUP");
        assert_eq!(describe(min), "SIGRTMIN");
        assert_eq!(describe(min + 2), "SIGRTMIN+2");
        assert_eq!(describe(max), "SIGRTMAX");
        assert_eq!(describe(max - 1), "SIGRTMAX-1");
        // glibc: 34..=49 count up, 50..=64 count down, as bash's `kill -l`.
        assert_eq!(describe(49), "SIGRTMIN+15");
        assert_eq!(describe(50), "SIGRTMAX-14");
        assert_eq!(describe(32), "signal 32");
    }
}
