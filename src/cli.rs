//! Command-line arguments.
//!
//! Hand-written rather than clap: the grammar is four words, and clap was a
//! tenth of the static binary (which shows in PID 1's resident memory).

use std::ffi::OsString;
use std::io::{ErrorKind, Write as _};
use std::path::PathBuf;

pub const USAGE: &str = "\
Usage:
  tend [--config PATH] [-- COMMAND [ARG...]]   run COMMAND (or service.command) as the service
  tend check-config [--config PATH]            validate supervisor.toml, print what it means
  tend probe [--config PATH]                   exit 0 when ready, 1 when not
  tend status [--config PATH]                  print the status file for a person
  tend help [SUBCOMMAND] | version";

const HELP: &str = "\
tend: PID 1 for containers. Runs the service, forwards signals, reaps zombies,
and reloads the service when its mounted config changes.

Options:
  --config PATH   the supervisor.toml to use
  -h, --help      print this help (after a subcommand: that subcommand's help)
  -V, --version   print the version and the commit it was built from

Config: --config PATH, else $TEND_CONFIG, else /etc/tend/supervisor.toml when it
exists. Without a config, tend is a plain init for COMMAND.

Exit status: the service's exit code, or 128+N when signal N killed it;
2 for a usage or config error (nothing is started); 127 when COMMAND is not
found, 126 when it is not executable; 1 for any other failure of tend.

Logging: TEND_LOG sets the level (error, warn, info, debug, trace; default info
with a config, warn without one), TEND_LOG_FORMAT=json writes JSON lines.
Logs go to stderr.";

const CHECK_CONFIG_HELP: &str = "\
Usage: tend check-config [--config PATH]

Validates supervisor.toml against this machine, as a run would, and prints it
back as TOML with every default filled in. Warnings go to stderr.
Exit status: 0 when the config is valid, 2 when it is not.";

const PROBE_HELP: &str = "\
Usage: tend probe [--config PATH]

For an exec readinessProbe: reads [readiness] status_file (else file) that the
running tend writes, prints one line saying whether it is ready and why not.
With [http] listen, GET /ready gives the same verdict to an httpGet probe.
Exit status: 0 ready, 1 not ready, 2 when the config gives nothing to probe.";

const STATUS_HELP: &str = "\
Usage: tend status [--config PATH]

Prints [readiness] status_file for a person: the state, the service's pid,
restarts and instances, and each watch's result with the line of its check's
output that says why.
Exit status: 0 when the file was read, 1 when it could not be, 2 when the
config names no status_file.";

/// `tend 0.1.0 (commit 1a2b3c4)`; the commit comes from build.rs.
pub fn version() -> String {
    format!(
        "tend {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        env!("TEND_GIT_COMMIT")
    )
}

/// Writes `text` to stdout. A reader that went away (`tend help | head -1`)
/// is not an error: nobody is left to read what was not written.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes `tend: {message}` to stderr, through the output writer when
/// tend runs as an init. Nothing is left to tell when that fails (stderr
/// closed or its reader gone), so a failure is ignored.
pub fn complain(message: impl std::fmt::Display) {
    crate::output::tend_lines(&format!("tend: {message}\n"));
}

#[derive(Debug, PartialEq, Eq)]
pub struct Cli {
    pub config: Option<PathBuf>,
    pub mode: Option<Mode>,
    /// The service to run (after `--`); replaces service.command.
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    CheckConfig,
    Probe,
    Status,
}

impl Mode {
    fn from_word(word: &str) -> Option<Mode> {
        match word {
            "check-config" => Some(Mode::CheckConfig),
            "probe" => Some(Mode::Probe),
            "status" => Some(Mode::Status),
            _ => None,
        }
    }

    fn help(self) -> &'static str {
        match self {
            Mode::CheckConfig => CHECK_CONFIG_HELP,
            Mode::Probe => PROBE_HELP,
            Mode::Status => STATUS_HELP,
        }
    }
}

/// The whole help: usage first, as a person reads it.
fn help() -> String {
    format!("{USAGE}\n\n{HELP}")
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Run(Cli),
    /// Print this on stdout and exit 0 (help, version).
    Print(String),
}

impl Cli {
    /// Parses the arguments after the program name. The error is a usage
    /// error (exit 2), worded for the person who typed the command.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, String> {
        let mut cli = Cli {
            config: None,
            mode: None,
            command: Vec::new(),
        };
        let mut args = args.into_iter();
        let mut first = true;
        while let Some(arg) = args.next() {
            let arg = arg
                .into_string()
                .map_err(|a| format!("argument {a:?} is not valid UTF-8"))?;
            let was_first = std::mem::replace(&mut first, false);
            match arg.as_str() {
                "--" => {
                    if cli.mode.is_some() {
                        return Err("a command after `--` is only for running the service, not with a subcommand".into());
                    }
                    for a in args.by_ref() {
                        cli.command.push(
                            a.into_string().map_err(|a| {
                                format!("command argument {a:?} is not valid UTF-8")
                            })?,
                        );
                    }
                    if cli.command.is_empty() {
                        return Err("`--` must be followed by the command to run".into());
                    }
                }
                "-h" | "--help" => {
                    return Ok(Parsed::Print(
                        cli.mode.map_or_else(help, |m| m.help().to_string()),
                    ));
                }
                "-V" | "--version" => return Ok(Parsed::Print(version())),
                // Subcommands that only print come first, alone.
                "help" if was_first => {
                    let topic = args.next().map(|a| a.to_string_lossy().into_owned());
                    return match topic.as_deref() {
                        None => Ok(Parsed::Print(help())),
                        Some(word) => Mode::from_word(word)
                            .map(|m| Parsed::Print(m.help().to_string()))
                            .ok_or_else(|| {
                                format!("no help on {word:?}: there is no such subcommand")
                            }),
                    };
                }
                "version" if was_first => return Ok(Parsed::Print(version())),
                "--config" => {
                    let path = args.next().ok_or("--config needs a path: --config PATH")?;
                    cli.config = Some(PathBuf::from(path));
                }
                _ => {
                    if let Some(mode) = Mode::from_word(&arg).filter(|_| cli.mode.is_none()) {
                        cli.mode = Some(mode);
                    } else if let Some(path) = arg.strip_prefix("--config=") {
                        cli.config = Some(PathBuf::from(path));
                    } else if arg.starts_with('-') {
                        return Err(format!("unknown option {arg:?}"));
                    } else {
                        return Err(format!(
                            "unexpected argument {arg:?}: the service's command goes after `--` \
                             (tend -- {arg} ...)"
                        ));
                    }
                }
            }
        }
        Ok(Parsed::Run(cli))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        match Cli::parse(args.iter().map(OsString::from))? {
            Parsed::Run(cli) => Ok(cli),
            Parsed::Print(text) => Err(format!("printed: {text}")),
        }
    }

    #[test]
    fn command_follows_the_double_dash() {
        let cli = parse(&["--config", "/x.toml", "--", "nginx", "-g", "daemon off;"]).unwrap();
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/x.toml")));
        assert_eq!(cli.command, ["nginx", "-g", "daemon off;"]);
        assert_eq!(cli.mode, None);
    }

    #[test]
    fn command_arguments_that_look_like_flags_belong_to_the_command() {
        let cli = parse(&["--", "ls", "--config", "-l", "--", "--help"]).unwrap();
        assert_eq!(cli.command, ["ls", "--config", "-l", "--", "--help"]);
        assert_eq!(cli.config, None);
    }

    #[test]
    fn subcommands_take_the_config_flag_on_either_side() {
        let cli = parse(&["check-config", "--config", "/a"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::CheckConfig));
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/a")));
        let cli = parse(&["--config=/b", "probe"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Probe));
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/b")));
    }

    #[test]
    fn usage_errors_say_what_is_wrong() {
        let e = parse(&["nginx"]).unwrap_err();
        assert!(e.contains("after `--`") && e.contains("nginx"), "{e}");
        assert!(parse(&["--bogus"]).unwrap_err().contains("--bogus"));
        assert!(parse(&["--config"]).unwrap_err().contains("needs a path"));
        assert!(parse(&["--"]).unwrap_err().contains("followed by"));
        assert!(parse(&["probe", "--", "x"]).is_err());
        assert!(parse(&["probe", "probe"]).is_err());
    }

    fn printed(args: &[&str]) -> String {
        match Cli::parse(args.iter().map(OsString::from)) {
            Ok(Parsed::Print(text)) => text,
            other => panic!("{args:?} should print, got {other:?}"),
        }
    }

    #[test]
    fn help_starts_with_the_usage() {
        for args in [
            &["-h"][..],
            &["--help"],
            &["help"],
            &["--config", "/x", "--help"],
        ] {
            let text = printed(args);
            assert!(text.starts_with("Usage:\n"), "{args:?}: {text}");
            assert!(text.contains("status") && text.contains("Exit status"));
        }
    }

    #[test]
    fn help_after_a_subcommand_is_that_subcommands_help() {
        for (sub, usage) in [
            ("check-config", "Usage: tend check-config"),
            ("probe", "Usage: tend probe"),
            ("status", "Usage: tend status"),
        ] {
            for args in [&[sub, "--help"][..], &[sub, "-h"], &["help", sub]] {
                let text = printed(args);
                assert!(text.starts_with(usage), "{args:?}: {text}");
                assert!(text.contains("Exit status"), "{args:?}: {text}");
            }
        }
        assert!(parse(&["help", "bogus"]).unwrap_err().contains("bogus"));
    }

    #[test]
    fn version_names_the_commit() {
        for args in [&["-V"][..], &["--version"], &["version"]] {
            let text = printed(args);
            assert!(
                text.starts_with(&format!("tend {} (commit ", env!("CARGO_PKG_VERSION"))),
                "{text}"
            );
        }
    }

    #[test]
    fn help_and_version_are_words_only_in_first_place() {
        // After a subcommand they would be arguments it does not take.
        assert!(parse(&["status", "version"]).is_err());
        assert!(parse(&["probe", "help"]).is_err());
    }

    #[test]
    fn status_is_a_subcommand() {
        let cli = parse(&["status", "--config", "/a"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Status));
    }
}
