//! `tend status`: the status file, for a person at a shell in the container.
//! Like `tend probe`, it reads what the running tend wrote and never talks
//! to it.

use std::fmt::Write as _;
use std::path::Path;

use crate::config;
use crate::status::{Status, WatchResult};
use crate::text;

/// Prints the status file; returns the exit code (0 when it was read, 1 when
/// not). Err when the config names no status file.
pub fn status(readiness: &config::Readiness) -> Result<i32, String> {
    let Some(path) = &readiness.status_file else {
        return Err("[readiness] sets no `status_file`: tend writes no status to show".into());
    };
    match read(path) {
        Ok(status) => match crate::cli::print(&render(&status)) {
            Ok(()) => Ok(0),
            Err(e) => {
                crate::cli::complain(format!("cannot write to stdout: {e}"));
                Ok(1)
            }
        },
        Err(e) => {
            crate::cli::complain(e);
            Ok(1)
        }
    }
}

fn read(path: &Path) -> Result<Status, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let why = (e.kind() == std::io::ErrorKind::NotFound)
            .then(|| crate::writable::diagnose(path))
            .flatten();
        match why {
            Some(why) => format!(
                "cannot read {}: {e}; tend cannot write it: {why}",
                path.display()
            ),
            None => format!(
                "cannot read {}: {e} (is tend running with this config?)",
                path.display()
            ),
        }
    })?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a tend status file: {e}", path.display()))
}

/// One `name  value` line per fact; a watch's check output as its one
/// telling line (the file has all of it).
fn render(s: &Status) -> String {
    let mut out = String::new();
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let _ = writeln!(out, "state       {}", s.state.as_str());
    // Why not, when a watch says: the service itself may well be ready.
    let why_not = s
        .watches
        .iter()
        .find(|w| !w.missing.is_empty() || w.result != WatchResult::Applied)
        .filter(|_| !s.ready)
        .map(|w| {
            let what = if w.missing.is_empty() {
                w.result.as_str().to_string()
            } else {
                format!("{} does not exist", w.missing.join(", "))
            };
            format!(" (watch {:?}: {what})", w.name)
        })
        .unwrap_or_default();
    let _ = writeln!(out, "ready       {}{why_not}", yes_no(s.ready));
    let pid = s
        .service
        .pid
        .map_or_else(|| "not running".to_string(), |p| format!("pid {p}"));
    let _ = writeln!(
        out,
        "service     {pid}, {} restart{}",
        s.service.restarts,
        if s.service.restarts == 1 { "" } else { "s" }
    );
    if let Some(status) = &s.service.status {
        let _ = writeln!(out, "  status    {}", text::escape(status));
    }
    for i in &s.service.instances {
        let _ = writeln!(
            out,
            "  instance  pid {} {}{}",
            i.pid,
            i.state,
            if i.ready { ", service ready" } else { "" }
        );
    }
    if s.services.len() > 1 {
        for svc in &s.services {
            let mut facts = vec![svc.state.clone()];
            facts.extend(svc.pid.map(|p| format!("pid {p}")));
            if svc.ready {
                facts.push("ready".into());
            }
            facts.push(format!(
                "{} restart{}",
                svc.restarts,
                if svc.restarts == 1 { "" } else { "s" }
            ));
            if let Some(e) = &svc.last_exit {
                facts.push(format!("last {e}"));
            }
            if let Some(status) = &svc.status {
                facts.push(format!("status {}", text::escape(status)));
            }
            if svc.dropped_lines > 0 {
                facts.push(format!("{} output lines dropped", svc.dropped_lines));
            }
            let role = match (svc.main, svc.required) {
                (true, _) => " (main)",
                (false, false) => " (not required)",
                (false, true) => "",
            };
            let _ = writeln!(out, "  {}{role}: {}", svc.name, facts.join(", "));
        }
    }
    for w in &s.watches {
        let owner = if s.services.len() > 1 && !w.service.is_empty() {
            format!(" (service {})", w.service)
        } else {
            String::new()
        };
        let _ = writeln!(out, "watch       {}{owner}: {}", w.name, w.result.as_str());
        for path in &w.missing {
            let _ = writeln!(out, "  missing   {path} (not ready until it exists)");
        }
        let why = text::summary(&w.check_output);
        if !why.is_empty() {
            let _ = writeln!(out, "  check     {why}");
        }
        if let Some(at) = &w.changed_at {
            let _ = writeln!(out, "  changed   {at}");
        }
    }
    if !s.updated_at.is_empty() {
        let _ = writeln!(out, "updated     {}", s.updated_at);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{InstanceStatus, ServiceStatus, State, WatchStatus};

    #[test]
    fn every_fact_a_person_needs_is_on_its_own_line() {
        let s = Status {
            state: State::InvalidConfig,
            ready: false,
            service: ServiceStatus {
                pid: Some(42),
                restarts: 1,
                status: Some("Serving".into()),
                instances: vec![InstanceStatus {
                    pid: 42,
                    state: "serving".into(),
                    ready: true,
                }],
            },
            services: vec![],
            watches: vec![WatchStatus {
                name: "nginx".into(),
                service: "nginx".into(),
                result: WatchResult::Invalid,
                check_output: "nginx: [emerg] unknown directive \"x\"\ntest failed\n".into(),
                missing: vec![],
                changed_at: Some("2026-01-02T03:04:05Z".into()),
                action_at: None,
            }],
            updated_at: "2026-01-02T03:04:06Z".into(),
        };
        assert_eq!(
            render(&s),
            "state       invalid_config\n\
             ready       no (watch \"nginx\": invalid)\n\
             service     pid 42, 1 restart\n  \
               status    Serving\n  \
               instance  pid 42 serving, service ready\n\
             watch       nginx: invalid\n  \
               check     nginx: [emerg] unknown directive \"x\"\n  \
               changed   2026-01-02T03:04:05Z\n\
             updated     2026-01-02T03:04:06Z\n"
        );
    }

    #[test]
    fn a_missing_path_is_why_tend_is_not_ready() {
        let s = Status {
            state: State::Starting,
            ready: false,
            service: ServiceStatus {
                pid: Some(42),
                restarts: 0,
                status: None,
                instances: vec![],
            },
            services: vec![],
            watches: vec![WatchStatus {
                name: "app".into(),
                service: "app".into(),
                result: WatchResult::Applied,
                check_output: String::new(),
                missing: vec!["/etc/app/conf.d".into()],
                changed_at: None,
                action_at: None,
            }],
            updated_at: String::new(),
        };
        assert_eq!(
            render(&s),
            "state       starting\n\
             ready       no (watch \"app\": /etc/app/conf.d does not exist)\n\
             service     pid 42, 0 restarts\n\
             watch       app: applied\n  \
               missing   /etc/app/conf.d (not ready until it exists)\n"
        );
    }

    #[test]
    fn a_stopped_service_says_so() {
        let s = Status {
            state: State::Restarting,
            ready: false,
            service: ServiceStatus {
                pid: None,
                restarts: 3,
                status: None,
                instances: vec![],
            },
            services: vec![],
            watches: vec![],
            updated_at: String::new(),
        };
        assert_eq!(
            render(&s),
            "state       restarting\nready       no\nservice     not running, 3 restarts\n"
        );
    }
}
