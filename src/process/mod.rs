//! Processes: spawning them clean, reaping every one of them, and the
//! service's lifecycle.
//!
//! There is exactly one reaper ([`reaper::reap`]). Everything else that starts
//! a process gets its pid back from [`spawn::spawn`] synchronously and
//! registers it before the event loop runs again, so no exit status can
//! arrive for a pid nobody knows yet.

pub mod job;
pub mod reaper;
pub mod spawn;

pub use crate::core::protocol::ExitStatus;
