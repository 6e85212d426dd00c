//! Logging to stderr: human-readable lines, or JSON lines with
//! `TEND_LOG_FORMAT=json`; the level comes from `TEND_LOG`.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// Installs the subscriber. The error names the variable that is wrong.
pub fn init() -> Result<(), String> {
    let filter = match std::env::var("TEND_LOG") {
        Ok(v) if !v.trim().is_empty() => v.parse::<Targets>().map_err(|e| {
            format!("TEND_LOG={v:?} is not a level or filter ({e}): use error, warn, info, debug or trace")
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
