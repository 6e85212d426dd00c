//! Logging to stderr: human-readable lines, or JSON lines with
//! `TEND_LOG_FORMAT=json`; the level comes from `TEND_LOG`.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// Installs the subscriber. The error names the variable that is wrong.
pub fn init() -> Result<(), String> {
    let filter = match std::env::var("TEND_LOG") {
        Ok(v) if !v.trim().is_empty() => parse_filter(&v).ok_or_else(|| {
            format!(
                "TEND_LOG={v:?} is not a level or filter: use off, error, warn, info, debug or trace, \
                 or target=level directives separated by commas"
            )
        })?,
        _ => Targets::new().with_default(LevelFilter::INFO),
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
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr);
        registry.with(layer).init();
    } else {
        let layer = tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        registry.with(layer).init();
    }
    Ok(())
}

/// env-filter directives, each of which must name a level: `debug`, or
/// `tend=debug,tend::watch=trace`. A bare word that is not a level would be
/// read as a target and silently change nothing, so it is refused.
fn parse_filter(text: &str) -> Option<Targets> {
    let is_level = |l: &str| {
        ["off", "error", "warn", "info", "debug", "trace"]
            .contains(&l.trim().to_ascii_lowercase().as_str())
    };
    let valid = text.split(',').all(|d| match d.split_once('=') {
        Some((target, level)) => !target.trim().is_empty() && is_level(level),
        None => is_level(d),
    });
    if !valid {
        return None;
    }
    text.parse().ok()
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
            assert!(parse_filter(ok).is_some(), "{ok}");
        }
        for bad in ["chatty", "tend=loud", "=info", "info,", "verbose"] {
            assert!(parse_filter(bad).is_none(), "{bad}");
        }
    }
}
