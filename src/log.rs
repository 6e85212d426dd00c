//! Logging to stderr: one human-readable line per event, or one JSON object
//! per line with `TEND_LOG_FORMAT=json`; `TEND_LOG` sets the level.
//!
//! A small `tracing` subscriber of our own rather than tracing-subscriber:
//! tend uses events only (no spans), one writer and a level filter, and the
//! registry behind tracing-subscriber's formatter cost more of PID 1's
//! resident memory than everything here.

use std::fmt::{self, Write as _};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the subscriber; `default` is the level when TEND_LOG is unset.
/// The error names the variable that is wrong.
pub fn init(default: LevelFilter) -> Result<(), String> {
    let filter = match std::env::var("TEND_LOG") {
        Ok(v) if !v.trim().is_empty() => Filter::parse(&v, default).ok_or_else(|| {
            format!(
                "TEND_LOG={v:?} is not a level or filter: use off, error, warn, info, debug or trace, \
                 or target=level directives separated by commas"
            )
        })?,
        _ => Filter {
            default,
            targets: Vec::new(),
        },
    };
    let json = match std::env::var("TEND_LOG_FORMAT").as_deref() {
        Ok("json") => true,
        Ok("text") | Ok("") | Err(_) => false,
        Ok(other) => {
            return Err(format!(
                "TEND_LOG_FORMAT={other:?}: use \"json\" or \"text\""
            ));
        }
    };
    JSON.store(json, std::sync::atomic::Ordering::Relaxed);
    tracing::subscriber::set_global_default(Logger { filter, json })
        .map_err(|e| format!("cannot install the logger: {e}"))
}

static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether TEND_LOG_FORMAT=json: the services' lines are JSON too.
pub fn json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// env-filter style directives: a default level, and levels for targets
/// (`info,tend::watch=trace`); the longest matching target wins.
#[derive(Debug, Clone, PartialEq)]
struct Filter {
    default: LevelFilter,
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// Every directive must name a level: a bare word that is not one would
    /// otherwise read as a target and silently change nothing. Targets alone
    /// keep `default` for the rest.
    fn parse(text: &str, default: LevelFilter) -> Option<Filter> {
        let level = |l: &str| {
            let l = l.trim().to_ascii_lowercase();
            ["off", "error", "warn", "info", "debug", "trace"]
                .contains(&l.as_str())
                .then(|| l.parse::<LevelFilter>().ok())
                .flatten()
        };
        let mut filter = Filter {
            default,
            targets: Vec::new(),
        };
        let mut default_set = false;
        for directive in text.split(',') {
            match directive.split_once('=') {
                Some((target, l)) if !target.trim().is_empty() => {
                    filter.targets.push((target.trim().to_string(), level(l)?));
                }
                Some(_) => return None,
                None => {
                    filter.default = level(directive)?;
                    default_set = true;
                }
            }
        }
        if !default_set && filter.targets.is_empty() {
            return None;
        }
        filter
            .targets
            .sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        Some(filter)
    }

    fn max(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, LevelFilter::max)
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        let target = meta.target();
        let level = self
            .targets
            .iter()
            .find(|(t, _)| target == t || target.starts_with(&format!("{t}::")))
            .map_or(self.default, |(_, l)| *l);
        *meta.level() <= level
    }
}

thread_local! {
    /// Lines held by [`hold`] on this thread, until [`release`].
    static HELD: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Holds this thread's log lines until [`release`]: the loop acts first
/// (signals, kills, spawns) and queues what it logged after, in one piece.
/// Lines keep their order and the time they were logged at.
pub fn hold() {
    HELD.with(|held| {
        held.borrow_mut().get_or_insert_with(String::new);
    });
}

/// Queues the lines held since [`hold`] for stderr (see `output`).
pub fn release() {
    if let Some(lines) = HELD.with(|held| held.borrow_mut().take())
        && !lines.is_empty()
    {
        crate::output::tend_lines(&lines);
    }
}

struct Logger {
    filter: Filter,
    json: bool,
}

impl Subscriber for Logger {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        self.filter.enabled(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.filter.max())
    }

    fn event(&self, event: &Event<'_>) {
        let line = if self.json {
            json_line(event)
        } else {
            text_line(event)
        };
        let held = HELD.with(|held| match held.borrow_mut().as_mut() {
            Some(buffer) => {
                buffer.push_str(&line);
                true
            }
            None => false,
        });
        if !held {
            crate::output::tend_lines(&line);
        }
    }

    // tend records no spans.
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// `2026-11-21T10:00:00.123456Z  INFO message key=value key2="text"`
fn text_line(event: &Event<'_>) -> String {
    struct Text {
        message: String,
        fields: String,
    }
    impl Visit for Text {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            if field.name() == "message" {
                let _ = write!(self.message, "{value:?}");
            } else {
                let _ = write!(self.fields, " {}={value:?}", field.name());
            }
        }
    }
    let mut t = Text {
        message: String::new(),
        fields: String::new(),
    };
    event.record(&mut t);
    format!(
        "{} {:>5} {}{}\n",
        crate::time::rfc3339_micros(SystemTime::now()),
        level_name(event.metadata().level()),
        t.message,
        t.fields
    )
}

/// `{"timestamp":"...","level":"INFO","target":"...","message":"...","key":value}`
///
/// Values keep their types: numbers and bools as such, durations as seconds,
/// lists as arrays, and a command's output (which text lines append to the
/// message) as an array of lines in `output`.
fn json_line(event: &Event<'_>) -> String {
    use serde_json::Value;
    struct Json(serde_json::Map<String, Value>);
    impl Visit for Json {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            let text = format!("{value:?}");
            let value = if field.name() == "message" {
                Value::String(text)
            } else {
                typed(text)
            };
            self.0.insert(field.name().into(), value);
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().into(), value.into());
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.0.insert(field.name().into(), value.into());
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0.insert(field.name().into(), value.into());
        }
        fn record_f64(&mut self, field: &Field, value: f64) {
            self.0.insert(field.name().into(), value.into());
        }
        fn record_bool(&mut self, field: &Field, value: bool) {
            self.0.insert(field.name().into(), value.into());
        }
    }
    let mut j = Json(serde_json::Map::new());
    j.0.insert(
        "timestamp".into(),
        crate::time::rfc3339_micros(SystemTime::now()).into(),
    );
    j.0.insert("level".into(), level_name(event.metadata().level()).into());
    j.0.insert("target".into(), event.metadata().target().into());
    event.record(&mut j);
    if let Some(Value::String(message)) = j.0.get_mut("message") {
        if let Some(at) = message.find(crate::text::OUTPUT_MARKER) {
            let lines: Vec<Value> = message[at + crate::text::OUTPUT_MARKER.len()..]
                .split(crate::text::OUTPUT_SEPARATOR)
                .map(Value::from)
                .collect();
            message.truncate(at);
            j.0.insert("output".into(), Value::Array(lines));
        }
    }
    let mut line = Value::Object(j.0).to_string();
    line.push('\n');
    line
}

/// A JSON line like the log's, for what tend says outside of it (a config
/// error before anything starts): `timestamp`, `level`, `target` "tend"
/// and `message`.
pub fn json_record(level: &str, message: &str) -> String {
    let mut line = serde_json::json!({
        "timestamp": crate::time::rfc3339_micros(SystemTime::now()),
        "level": level,
        "target": "tend",
        "message": message,
    })
    .to_string();
    line.push('\n');
    line
}

/// A value recorded with `?`, typed: a Duration's Debug (`1.5s`, `12ms`) as
/// seconds; a Debug that is valid JSON (numbers, plain strings and lists of
/// them, as `Vec<PathBuf>` prints) as that JSON; anything else as its text.
fn typed(debug: String) -> serde_json::Value {
    if let Some(seconds) = duration_seconds(&debug) {
        return seconds.into();
    }
    serde_json::from_str(&debug).unwrap_or(serde_json::Value::String(debug))
}

/// Seconds in a Duration's Debug output, which is a decimal number and one
/// of the units below. The decimal point is moved in the text, not by a
/// multiplication, so 5.868312ms is 0.005868312 and not 0.0058683120000000005.
fn duration_seconds(debug: &str) -> Option<f64> {
    const UNITS: [(&str, u8); 4] = [("ns", 9), ("µs", 6), ("ms", 3), ("s", 0)];
    let (number, exponent) = UNITS
        .iter()
        .find_map(|(unit, exponent)| Some((debug.strip_suffix(unit)?, *exponent)))?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    format!("{number}e-{exponent}").parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_seconds() {
        use std::time::Duration;
        for (d, s) in [
            (Duration::from_millis(1500), 1.5),
            (Duration::from_micros(12_500), 0.0125),
            (Duration::from_micros(100), 0.0001),
            (Duration::from_nanos(7), 7e-9),
            (Duration::ZERO, 0.0),
            (Duration::from_secs(90), 90.0),
        ] {
            let got = duration_seconds(&format!("{d:?}")).unwrap();
            assert!((got - s).abs() < 1e-12, "{d:?}: {got}");
        }
        // As a JSON number, the digits of the Debug and no rounding noise.
        for (d, text) in [
            (Duration::from_nanos(5_868_312), "0.005868312"),
            (Duration::from_nanos(7), "7e-9"),
            (Duration::from_nanos(1_100_000_001), "1.100000001"),
        ] {
            let json = serde_json::Value::from(duration_seconds(&format!("{d:?}")).unwrap());
            assert_eq!(json.to_string(), text, "{d:?}");
        }
        for not in ["s", "ms", "1.5 s", "-1s", "\"5s\"", "1.5", "mass"] {
            assert_eq!(duration_seconds(not), None, "{not}");
        }
    }

    #[test]
    fn debug_values_keep_their_types() {
        use serde_json::json;
        let paths = vec![std::path::PathBuf::from("/etc/a"), "/etc/b c".into()];
        assert_eq!(typed(format!("{paths:?}")), json!(["/etc/a", "/etc/b c"]));
        assert_eq!(typed(format!("{:?}", ["x"; 0])), json!([]));
        assert_eq!(typed(format!("{:?}", 42)), json!(42));
        assert_eq!(
            typed(format!("{:?}", std::path::Path::new("/p"))),
            json!("/p")
        );
        assert_eq!(
            typed(format!("{:?}", std::time::Duration::from_millis(250))),
            json!(0.25)
        );
        // Not JSON (an escape JSON does not have, a bitflags Debug): the text.
        assert_eq!(typed(format!("{:?}", "a\u{1b}b")), json!("\"a\\u{1b}b\""));
        assert_eq!(
            typed("MODIFY | CLOSE_WRITE".into()),
            json!("MODIFY | CLOSE_WRITE")
        );
    }

    #[test]
    fn filters_must_name_levels() {
        for ok in [
            "info",
            "DEBUG",
            "warn,tend=trace",
            "tend::supervisor=debug",
            "off",
        ] {
            assert!(Filter::parse(ok, LevelFilter::INFO).is_some(), "{ok}");
        }
        for bad in ["chatty", "tend=loud", "=info", "info,", "verbose"] {
            assert!(Filter::parse(bad, LevelFilter::INFO).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_longest_matching_target_sets_the_level() {
        let f = Filter::parse("warn,tend=info,tend::watch=trace", LevelFilter::INFO).unwrap();
        assert_eq!(f.max(), LevelFilter::TRACE);
        assert_eq!(f.targets[0].0, "tend::watch");
        let only = Filter::parse("tend::watch=debug", LevelFilter::WARN).unwrap();
        assert_eq!(
            only.default,
            LevelFilter::WARN,
            "targets alone keep the default level"
        );
    }
}
