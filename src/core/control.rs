//! `tend signal NAME SIG` and `tend restart NAME`: a request from the
//! control socket, decided here and answered with one line and the exit
//! code of the command that asked.
//!
//! A restart goes the way a restart action goes ([`service::Input::Restart`]:
//! restart_mode, sockets, readiness), and only when the service could start
//! again at once: its watches' newest config passed its check and what it
//! is `after` is ready. A service that is not running is started instead:
//! at once when it waits out a back-off, again when it is a oneshot that
//! finished or a service that ended for good (only one that is not required
//! can end while tend runs). A restart under way, a service down until its
//! config passes, and a tend that stops are answered with why nothing was
//! done.

use super::*;

/// The exit codes of the commands.
const DONE: i32 = 0;
const NOT_DONE: i32 = 1;
const NO_SUCH: i32 = 2;

impl Core {
    pub(super) fn on_control(&mut self, client: u64, from: u32, request: ControlRequest, now: Now) {
        let (code, message) = match request {
            ControlRequest::Signal { service, signo } => match self.find(&service) {
                Ok(id) => self.control_signal(id, signo, from),
                Err(e) => e,
            },
            ControlRequest::Restart { service } => match self.find(&service) {
                Ok(id) => self.control_restart(id, from, now),
                Err(e) => e,
            },
        };
        self.out.push(Command::Answer {
            client,
            code,
            message,
        });
    }

    /// The service named `name`, or the answer that lists the names.
    fn find(&self, name: &str) -> Result<ServiceId, (i32, String)> {
        match self.services.iter().position(|s| s.cfg.name == name) {
            Some(i) => Ok(ServiceId(i)),
            None => {
                let names: Vec<&str> = self.services.iter().map(|s| s.cfg.name.as_str()).collect();
                Err((
                    NO_SUCH,
                    format!("no service {name:?}: the services are {}", names.join(", ")),
                ))
            }
        }
    }

    /// The signal goes to the instance that gets forwarded signals (its
    /// process group with `process_group`), also while tend stops it.
    fn control_signal(&mut self, id: ServiceId, signo: i32, from: u32) -> (i32, String) {
        let s = &self.services[id.0];
        let name = s.cfg.name.clone();
        let what = signals::describe(signo);
        let Some(pid) = s.serving_pid() else {
            return (
                NOT_DONE,
                format!(
                    "{name} is not running ({}): {what} was not sent",
                    describe(s)
                ),
            );
        };
        let group = s.cfg.process_group;
        self.out.push(Command::Signal { pid, group, signo });
        tracing::info!(
            from,
            service = name,
            pid = pid.as_raw(),
            "sent {what} to the service (tend signal)"
        );
        let to = if group { "'s process group" } else { "" };
        (
            DONE,
            format!("sent {what} to {name}{to} (pid {})", pid.as_raw()),
        )
    }

    fn control_restart(&mut self, id: ServiceId, from: u32, now: Now) -> (i32, String) {
        let s = &self.services[id.0];
        let name = s.cfg.name.clone();
        if !matches!(self.phase, Phase::Running) {
            return (
                NOT_DONE,
                format!("tend is stopping: {name} is not restarted"),
            );
        }
        let stage = s.stage();
        let refused = match stage {
            Stage::Overlapping | Stage::Restarting => {
                Some(format!("a restart of {name} is already under way"))
            }
            Stage::Failing => Some(format!(
                "{name} is being stopped: it did not become ready within {:?}; its restart \
                 policy decides what follows",
                s.cfg.ready_timeout
            )),
            Stage::Stopping => Some(format!("{name} is being stopped")),
            Stage::Down { .. } => Some(match self.cannot_start(id) {
                Some(why) => format!("{name} is down: it starts as soon as {why}"),
                None => format!("{name} is starting"),
            }),
            Stage::Running { .. }
            | Stage::Reloading
            | Stage::BackingOff
            | Stage::Done
            | Stage::Ended(_) => self.cannot_start(id).map(|why| {
                format!("{name} is not restarted: it would not start again until {why}")
            }),
        };
        if let Some(why) = refused {
            tracing::info!(from, service = name, "tend restart: nothing done: {why}");
            return (NOT_DONE, why);
        }
        let message = match stage {
            Stage::Running { .. } | Stage::Reloading => {
                let pid = s.serving_pid().map_or(0, Pid::as_raw);
                let how = if s.cfg.overlap {
                    "a new instance starts next to it, which it makes way for once the new one is \
                     ready"
                        .to_string()
                } else {
                    format!("{}, then a new instance starts", s.cfg.stop_signal)
                };
                self.tell_service(id, service::Input::Restart, now);
                format!("restarting {name} (pid {pid}): {how}")
            }
            _ => {
                let was = match (stage, s.last_exit()) {
                    (Stage::BackingOff, Some(e)) => {
                        format!("it was waiting out its restart back-off after {e}")
                    }
                    (Stage::Done, _) => "the oneshot had finished".to_string(),
                    (_, Some(e)) => format!("it had ended ({e})"),
                    (_, None) => "it was not running".to_string(),
                };
                self.tell_service(id, service::Input::StartAgain, now);
                format!("starting {name} now: {was}")
            }
        };
        tracing::info!(from, service = name, "tend restart: {message}");
        (DONE, message)
    }

    /// What service `id` waits for before it can start, if anything: its
    /// config, or what it starts after ("as soon as ...", "until ...").
    fn cannot_start(&self, id: ServiceId) -> Option<String> {
        if let Some((watch, result)) = self.gate(id) {
            let why = match result {
                WatchResult::Invalid => "passes its check",
                WatchResult::ActionFailed => "can be published",
                WatchResult::RolledBack => "is rolled back",
                _ => "passes its check (it is not checked yet)",
            };
            return Some(format!("the config of watch {watch:?} {why}"));
        }
        if self.after_ready(id) {
            return None;
        }
        let waits_for = self.services[id.0]
            .cfg
            .after
            .iter()
            .map(|d| &self.services[d.0])
            .find(|d| !d.ready())?;
        Some(format!(
            "{} (which it starts after) is ready",
            waits_for.cfg.name
        ))
    }
}

/// What a service that is not running is doing, for an answer.
fn describe(s: &Service) -> String {
    let entry = service_entry(s, false);
    match entry.last_exit {
        Some(e) => format!("{}, last {e}", entry.state),
        None => entry.state,
    }
}
