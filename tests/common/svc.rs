//! The instrumented service as the host sees it.

use std::fs;

use super::{Tend, secs, wait_for};

/// The host pid of the running service (tend's child running service.py).
pub fn host_pid(tend: &mut Tend) -> i32 {
    host_pid_of(tend, "service.py")
}

/// The host pid of tend's live child whose command line holds `needle`.
pub fn host_pid_of(tend: &mut Tend, needle: &str) -> i32 {
    wait_for(
        &format!("{needle} among tend's children"),
        secs(10.0),
        || {
            tend.children().into_iter().find_map(|(pid, state)| {
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                (state != 'Z' && String::from_utf8_lossy(&cmdline).contains(needle)).then_some(pid)
            })
        },
    )
}

/// Sends `sig` to the service directly, as a crash or an operator would.
pub fn kill(tend: &mut Tend, sig: nix::sys::signal::Signal) {
    kill_pid(host_pid(tend), sig);
}

pub fn kill_pid(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
}
