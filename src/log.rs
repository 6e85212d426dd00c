//! Logging to stderr: one human-readable line per event, or one JSON object
//! per line with `TEND_LOG_FORMAT=json`; `TEND_LOG` sets the level.
//!
//! A small `tracing` subscriber of our own rather than tracing-subscriber:
//! tend uses events only (no spans), one writer and a level filter, and the
//! registry behind tracing-subscriber's formatter cost more of PID 1's
//! resident memory than everything here.

use std::fmt::{self, Write as _};
use std::io::Write as _;
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
    tracing::subscriber::set_global_default(Logger { filter, json })
        .map_err(|e| format!("cannot install the logger: {e}"))
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
        // One write per line, so lines from tend never interleave with each
        // other; a failed write to stderr has nowhere to be reported.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
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

/// `{"timestamp":"...","level":"INFO","message":"...","key":value}`
fn json_line(event: &Event<'_>) -> String {
    struct Json(serde_json::Map<String, serde_json::Value>);
    impl Visit for Json {
        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0
                .insert(field.name().into(), format!("{value:?}").into());
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
    let mut line = serde_json::Value::Object(j.0).to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

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
