//! tend: PID 1 for application containers. See README.md and docs/ for the contract.
//!
//! `no_main`: the C library calls [`main`] directly, without std's runtime
//! set-up before it (a read of /proc/self/maps for the main thread's stack
//! guard, an alternate signal stack and SIGSEGV and SIGBUS handlers), which
//! a PID 1 that blocks its signals first has no use for: the signals are
//! blocked from the first instruction of `main`, and start-up makes a
//! dozen fewer system calls. std still reads the arguments (on Linux from
//! glibc's init array); what its set-up did that tend needs, tend does.
#![no_main]

use std::path::{Path, PathBuf};

use tracing::level_filters::LevelFilter;

use tend::cli::{self, Cli, Mode, Parsed};
use tend::config::{self, Config, ConfigError, Place};
use tend::http_server::HttpServer;
use tend::{control, install, log, output, probe, show, signals, sockets, supervisor};

/// Why tend stopped before or instead of running the service.
enum Failure {
    /// Bad command line or config: exit 2, nothing started.
    Usage(String),
    Config(ConfigError),
    /// tend itself failed: exit 1.
    Internal(anyhow::Error),
}

#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    // First, before any thread or child exists: see signals.rs.
    if let Err(e) = signals::take_over() {
        cli::complain(e);
        return 1;
    }
    open_missing_stdio();
    tend_main()
}

/// What std's runtime set-up would have done: a standard stream that tend
/// was started without is opened on /dev/null, so that no file tend opens
/// takes fd 0, 1 or 2 (its log would go into it, or the service would read
/// from it). In a root without /dev/null, `/` holds the number instead:
/// reads and writes on it fail, and nothing blocks or raises SIGPIPE.
fn open_missing_stdio() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD on a descriptor number touches no memory.
        let open = unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
        if open || nix::errno::Errno::last() != nix::errno::Errno::EBADF {
            continue;
        }
        // open() takes the lowest free number, which is `fd`: the ones
        // below it are open by now. Without O_CLOEXEC: the service inherits
        // it, as it would have inherited the stream.
        for (path, flags) in [
            (c"/dev/null", libc::O_RDWR),
            (c"/", libc::O_RDONLY | libc::O_DIRECTORY),
        ] {
            // SAFETY: a NUL-terminated path; the flags create nothing.
            if unsafe { libc::open(path.as_ptr(), flags) } != -1 {
                break;
            }
        }
    }
}

/// Returns tend's exit status.
fn tend_main() -> i32 {
    let cli = match Cli::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(cli)) => cli,
        Ok(Parsed::Print(text)) => {
            return match cli::print(&format!("{text}\n")) {
                Ok(()) => 0,
                Err(e) => {
                    cli::complain(format!("cannot write to stdout: {e}"));
                    1
                }
            };
        }
        Err(e) => {
            cli::complain(format!("{e}\n\n{}", cli::USAGE));
            return 2;
        }
    };
    let code = match run(cli) {
        Ok(code) => code,
        Err(Failure::Usage(msg)) => {
            cli::complain(msg);
            2
        }
        Err(Failure::Config(e)) => {
            cli::complain(e);
            2
        }
        Err(Failure::Internal(e)) => {
            cli::complain(format!("{e:#}"));
            1
        }
    };
    // What is still queued for stdout and stderr, without waiting on a
    // reader that is stuck.
    output::finish();
    code & 0xff
}

fn run(cli: Cli) -> Result<i32, Failure> {
    // Needs no config: an init container has none.
    if cli.mode == Some(Mode::Install) {
        return Ok(install::run(Path::new(&cli.operands[0])));
    }
    let asked =
        cli.config.is_some() || std::env::var_os("TEND_CONFIG").is_some_and(|p| !p.is_empty());
    let config_path = find_config(cli.config)?;
    // Without a config tend is a plain init, as quiet as tini: an interactive
    // program under it owns the terminal. A config asks for a supervisor,
    // whose reloads are worth an INFO line each.
    let level = if config_path.is_some() {
        LevelFilter::INFO
    } else {
        LevelFilter::WARN
    };
    log::init(level).map_err(Failure::Usage)?;
    // Lines the loop holds (log::hold) come before the message of a panic,
    // which goes the same way as they do: through the output writer once
    // it is armed, so that a stuck stderr cannot hold a panicking PID 1.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        log::release();
        if output::armed() {
            output::last_words(&format!("tend: {info}\n"));
        } else {
            report(info)
        }
    }));
    match cli.mode {
        Some(Mode::CheckConfig) => check_config(
            config_path,
            if cli.in_image {
                Place::InImage
            } else {
                Place::Anywhere
            },
        ),
        Some(mode @ (Mode::Probe | Mode::Status)) => {
            let Some(path) = config_path else {
                return Err(Failure::Usage(format!(
                    "no config to read the status from: pass --config PATH, set $TEND_CONFIG, \
                     or create {}",
                    config::DEFAULT_PATH
                )));
            };
            let config = Config::load(&path).map_err(Failure::Config)?;
            if mode == Mode::Probe {
                probe::probe(&config.readiness).map_err(Failure::Usage)
            } else {
                show::status(&config.readiness).map_err(Failure::Usage)
            }
        }
        Some(Mode::Install) => unreachable!("handled above"),
        Some(mode @ (Mode::Signal | Mode::Restart)) => {
            let Some(path) = config_path else {
                return Err(Failure::Usage(format!(
                    "no config to find tend's control socket in: pass --config PATH, set \
                     $TEND_CONFIG, or create {}",
                    config::DEFAULT_PATH
                )));
            };
            let config = Config::load(&path).map_err(Failure::Config)?;
            let Some(status_file) = &config.readiness.status_file else {
                return Err(Failure::Usage(format!(
                    "{}: tend signal and tend restart reach tend through a socket beside \
                     [readiness] status_file, which this config does not set: add \
                     status_file = \"/run/tend/status.json\" to [readiness]",
                    path.display()
                )));
            };
            let service = cli.operands[0].clone();
            let ask = if mode == Mode::Signal {
                let signo = control::parse_signal(&cli.operands[1]).map_err(Failure::Usage)?;
                control::Ask::Signal { service, signo }
            } else {
                control::Ask::Restart { service }
            };
            Ok(control::ask(status_file, &ask))
        }
        None => {
            // Without a config nothing needs the working directory: a plain
            // init also runs in one that was removed.
            let (config, cwd) = match &config_path {
                Some(path) => {
                    let cwd = current_dir()?;
                    let config = Config::load_on_host(path, &cwd, Place::Run)
                        .map_err(Failure::Config)?
                        .0;
                    (config, Some(cwd))
                }
                None => (Config::default(), None),
            };
            if let Some(path) = config_path
                .as_ref()
                .filter(|_| !asked && !cli.command.is_empty())
            {
                // `docker run --entrypoint tend IMAGE -- sh` still runs under it.
                tracing::info!(
                    "running COMMAND as the service of {}, the default config (--config \
                     /dev/null runs it without one)",
                    path.display()
                );
            }
            let argv = if !cli.command.is_empty() {
                cli.command
            } else if let Some(argv) = config.service().command.clone() {
                argv
            } else {
                return Err(Failure::Usage(match &config_path {
                    Some(p) => format!(
                        "no command to run: set service.command in {} or give one after `--`",
                        p.display()
                    ),
                    None => {
                        "no command to run: usage is `tend [--config PATH] -- COMMAND [ARG...]` \
                             (see tend --help)"
                            .into()
                    }
                }));
            };
            // Before anything else opens a file descriptor or starts a
            // thread: the sockets take fds 3.. (see sockets.rs).
            let sockets =
                sockets::bind_all(&config.sockets).map_err(|e| Failure::Usage(e.to_string()))?;
            // From here on, nothing tend writes waits for its reader.
            output::arm(&config, &argv);
            // After the sockets, so it takes none of fds 3..; before the
            // service starts, so a port in use stops tend with a clear error.
            let http = match &config.http {
                Some(h) => {
                    let server = HttpServer::bind(h.listen).map_err(Failure::Usage)?;
                    tracing::info!(
                        "HTTP server listening on {}: GET /ready, /status, /metrics",
                        server.local_addr()
                    );
                    Some(server)
                }
                None => None,
            };
            // Before anything starts: a user that is not there stops tend.
            let accounts = supervisor::accounts(&config).map_err(Failure::Usage)?;
            // Before the service first starts: what it reads is there.
            let restored = match &cwd {
                Some(cwd) => tend::watch::publish::prepare_all(&config.watches, cwd)
                    .map_err(|e| Failure::Usage(format!("{e:#}")))?,
                None => Vec::new(),
            };
            supervisor::Supervisor::new(&config, argv, sockets, http, restored, accounts)
                .and_then(|s| s.run())
                .map_err(Failure::Internal)
        }
    }
}

/// `--config`, else `$TEND_CONFIG`, else the default path when it exists.
/// A path that was asked for explicitly must exist.
fn find_config(flag: Option<PathBuf>) -> Result<Option<PathBuf>, Failure> {
    let (path, origin) = match (flag, std::env::var_os("TEND_CONFIG")) {
        (Some(p), _) => (p, "--config"),
        (None, Some(p)) if !p.is_empty() => (PathBuf::from(p), "$TEND_CONFIG"),
        _ => {
            let default = Path::new(config::DEFAULT_PATH);
            return Ok(default.exists().then(|| default.to_path_buf()));
        }
    };
    if !path.exists() {
        return Err(Failure::Usage(format!(
            "config file {} (from {origin}) does not exist",
            path.display()
        )));
    }
    Ok(Some(path))
}

fn check_config(path: Option<PathBuf>, place: Place) -> Result<i32, Failure> {
    let Some(path) = path else {
        return Err(Failure::Usage(format!(
            "no config to check: pass --config PATH, set $TEND_CONFIG, or create {}",
            config::DEFAULT_PATH
        )));
    };
    let (config, warnings) =
        Config::load_on_host(&path, &current_dir()?, place).map_err(Failure::Config)?;
    for w in warnings {
        cli::warn(format!("{}: {w}", path.display()));
    }
    let (bound, chain) = config.stop_bound();
    let chain: Vec<String> = chain
        .iter()
        .map(|&i| {
            format!(
                "{} ({})",
                config.service_name(i, None),
                config::format_duration(config.services[i].stop_timeout)
            )
        })
        .collect();
    cli::print(&format!(
        "# {}: valid. With defaults filled in, it means:\n\n{}\n\
         # A stop (SIGTERM) takes at most {}: {}, then what is left in the container\n\
         # (the main service's stop_timeout, and 2s after SIGKILL). In Kubernetes, set\n\
         # terminationGracePeriodSeconds above it.\n",
        path.display(),
        config.describe(),
        config::format_duration(bound),
        chain.join(", then ")
    ))
    .map_err(|e| Failure::Internal(anyhow::anyhow!("cannot write to stdout: {e}")))?;
    Ok(0)
}

/// Relative paths in the config are taken from here.
fn current_dir() -> Result<PathBuf, Failure> {
    std::env::current_dir().map_err(|e| {
        Failure::Internal(anyhow::anyhow!(
            "getcwd() failed: {e}; relative paths in the config cannot be resolved"
        ))
    })
}
