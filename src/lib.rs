//! tend: PID 1 for application containers. See README.md and docs/ for the contract.
//!
//! The binary (`main.rs`) chooses a mode and runs; everything else lives in
//! this library, so that the decisions of the supervisor (`core`) are unit
//! tests that need neither root nor a PID namespace.

pub mod cli;
pub mod config;
pub mod control;
pub mod core;
pub mod envfile;
pub mod http_action;
pub mod http_client;
pub mod http_server;
pub mod install;
pub mod log;
pub mod notify;
pub mod output;
pub mod probe;
pub mod process;
pub mod ratelimit;
pub mod show;
pub mod signals;
pub mod sockets;
pub mod status;
pub mod supervisor;
pub mod text;
pub mod time;
pub mod users;
pub mod watch;
pub mod writable;
