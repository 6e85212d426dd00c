//! The text of a notify datagram (sd_notify's `KEY=VALUE` lines).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tend_fuzz::Notification;

fuzz_target!(|data: &[u8]| {
    let n = Notification::parse(data);
    let text = String::from_utf8_lossy(data);
    let lines: Vec<&str> = text.split('\n').collect();
    assert_eq!(n.ready, lines.contains(&"READY=1"));
    assert_eq!(n.reloading, lines.contains(&"RELOADING=1"));
    assert_eq!(n.stopping, lines.contains(&"STOPPING=1"));
    // The last STATUS= wins.
    let status = lines.iter().rev().find_map(|l| l.strip_prefix("STATUS="));
    assert_eq!(n.status.as_deref(), status);
});
