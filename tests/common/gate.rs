//! A gate that holds checks until the test opens it, so a test can make
//! something happen while a check runs without sleeping for it: the check
//! logs that it started, waits (bounded) for a marker file, then goes on.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use super::{Sandbox, wait_for};

pub struct Gate {
    open: PathBuf,
    log: PathBuf,
}

impl Gate {
    /// A gate named `name` in the sandbox, open or closed.
    pub fn new(sb: &Sandbox, name: &str, open: bool) -> Gate {
        let g = Gate {
            open: sb.path(&format!("{name}.open")),
            log: sb.path(&format!("{name}.started")),
        };
        if open {
            g.open();
        }
        g
    }

    /// A shell command that waits at the gate (at most 20 s), then runs `then`.
    pub fn script(&self, then: &str) -> String {
        format!(
            "echo started >> {log}; i=0; while [ ! -e {open} ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; {then}",
            log = self.log.display(),
            open = self.open.display()
        )
    }

    /// How many checks have reached the gate.
    pub fn started(&self) -> usize {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .count()
    }

    pub fn wait_started(&self, n: usize, timeout: Duration) {
        wait_for(&format!("{n} check(s) at the gate"), timeout, || {
            (self.started() >= n).then_some(())
        });
    }

    pub fn open(&self) {
        fs::write(&self.open, "").unwrap();
    }

    pub fn close(&self) {
        let _ = fs::remove_file(&self.open);
    }
}
