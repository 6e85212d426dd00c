//! Signal names, and which signals tend forwards, keeps, or ignores.
//!
//! tend receives every signal it handles through a signalfd, with those signals
//! blocked from the first instruction of `main`. Nothing in tend runs in a
//! signal handler, so a child between `fork` and `exec` can never run one either,
//! and PID 1 still receives blocked signals (the kernel only drops signals that
//! PID 1 leaves at their default disposition *and* does not block).

use std::fmt;
use std::str::FromStr;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

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

/// Signals that belong to tend itself and are never forwarded: the ones the
/// kernel raises for a fault in tend, the uncatchable ones, and SIGCHLD.
const OWN: [Signal; 9] = [
    Signal::SIGKILL,
    Signal::SIGSTOP,
    Signal::SIGCHLD,
    Signal::SIGSEGV,
    Signal::SIGBUS,
    Signal::SIGILL,
    Signal::SIGFPE,
    Signal::SIGTRAP,
    Signal::SIGABRT,
];

/// Signals tend ignores: SIGPIPE (a closed log pipe must not kill PID 1, and a
/// write error says more than the signal), and SIGTTIN/SIGTTOU (tend is in the
/// background once the service owns the terminal; it must not be stopped, nor
/// forward the terminal's complaints about its own writes to the service).
pub const IGNORED: [Signal; 3] = [Signal::SIGPIPE, Signal::SIGTTIN, Signal::SIGTTOU];

/// Whether a signal that reaches tend is passed on to the service unchanged.
/// SIGTERM is handled (it starts a stop) and is not in this set.
pub fn is_forwarded(sig: Signal) -> bool {
    sig != Signal::SIGTERM
        && !OWN.contains(&sig)
        && !IGNORED.contains(&sig)
        && sig != Signal::SIGSYS
}

/// The set tend blocks and reads from its signalfd: SIGCHLD, SIGTERM and every
/// forwarded signal.
pub fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for sig in Signal::iterator() {
        if sig == Signal::SIGCHLD || sig == Signal::SIGTERM || is_forwarded(sig) {
            set.add(sig);
        }
    }
    set
}

/// Blocks the handled signals and ignores [`IGNORED`]. Called first in `main`,
/// before any thread or child exists, so the mask holds everywhere.
pub fn take_over() -> nix::Result<()> {
    use nix::sys::signal::{SigHandler, signal};
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None)?;
    for sig in IGNORED {
        // SAFETY: SIG_IGN installs no handler code.
        unsafe { signal(sig, SigHandler::SigIgn) }?;
    }
    Ok(())
}

/// What a signal that reaches tend means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// SIGTERM: stop the service, then exit.
    Stop,
    /// SIGINT: forwarded, or stops tend while no service process exists.
    Interrupt,
    /// SIGCHLD: reap.
    Child,
    Forward,
    /// Not for the service (a fault the kernel raised for someone else).
    Ignore,
}

/// The role of signal `signo`; `code` is the signalfd record's `ssi_code`.
pub fn role(signo: i32, code: i32) -> Role {
    let _ = code;
    match Signal::try_from(signo) {
        Ok(Signal::SIGTERM) => Role::Stop,
        Ok(Signal::SIGINT) => Role::Interrupt,
        Ok(Signal::SIGCHLD) => Role::Child,
        Ok(sig) if !is_forwarded(sig) => Role::Ignore,
        _ => Role::Forward,
    }
}

/// A signal number as a name for logs: `SIGHUP`, or `signal 40` for the
/// realtime ones.
pub fn describe(signo: i32) -> String {
    match Signal::try_from(signo) {
        Ok(sig) => sig.as_str().to_string(),
        Err(_) => format!("signal {signo}"),
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
    fn forwarding_covers_the_catchable_signals() {
        for sig in [
            Signal::SIGHUP,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGUSR1,
            Signal::SIGUSR2,
            Signal::SIGWINCH,
            Signal::SIGCONT,
            Signal::SIGALRM,
            Signal::SIGTSTP,
            Signal::SIGURG,
            Signal::SIGPWR,
        ] {
            assert!(is_forwarded(sig), "{sig} should be forwarded");
        }
        for sig in [
            Signal::SIGTERM,
            Signal::SIGCHLD,
            Signal::SIGKILL,
            Signal::SIGSEGV,
            Signal::SIGPIPE,
        ] {
            assert!(!is_forwarded(sig), "{sig} should not be forwarded");
        }
    }

    #[test]
    fn realtime_signals_are_described_by_number() {
        assert_eq!(describe(1), "SIGHUP");
        assert_eq!(describe(40), "signal 40");
    }
}
