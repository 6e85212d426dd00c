//! Signal names as supervisor.toml writes them ("SIGHUP", "hup"), and the
//! numbers the signalfd hands over.
//!
//! Checks: a name that parses reads back the same from its display form;
//! any number and code has a role and a description.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tend::signals::{self, SignalName};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(name) = text.parse::<SignalName>()
    {
        let shown = name.to_string();
        assert_eq!(shown.parse::<SignalName>().map(|n| n.0), Ok(name.0));
        assert!(shown.starts_with("SIG"), "{shown}");
    }
    if let Some((signo, rest)) = data.split_first_chunk::<4>()
        && let Some(code) = rest.first_chunk::<4>()
    {
        let signo = i32::from_le_bytes(*signo);
        let _ = signals::role(signo, i32::from_le_bytes(*code));
        assert!(!signals::describe(signo).is_empty());
    }
});
