//! Command-line arguments.
//!
//! Hand-written rather than clap: the grammar is four words, and clap was a
//! tenth of the static binary (which shows in PID 1's resident memory).

use std::ffi::OsString;
use std::path::PathBuf;

pub const USAGE: &str = "\
Usage:
  tend [--config PATH] [-- COMMAND [ARG...]]   run COMMAND (or service.command) as the service
  tend check-config [--config PATH]            validate supervisor.toml, print what it means
  tend probe [--config PATH]                   exit 0 when ready, 1 when not
  tend --help | --version";

const HELP: &str = "\
tend: PID 1 for containers. Runs the service, forwards signals, reaps zombies,
and reloads the service when its mounted config changes.

Options:
  --config PATH   the supervisor.toml to use
  -h, --help      print this help
  -V, --version   print the version

Config: --config PATH, else $TEND_CONFIG, else /etc/tend/supervisor.toml when it
exists. Without a config, tend is a plain init for COMMAND.

Exit status: the service's exit code, or 128+N when signal N killed it;
2 for a usage or config error (nothing is started); 127 when COMMAND is not
found, 126 when it is not executable; 1 for any other failure of tend.

Logging: TEND_LOG sets the level (error, warn, info, debug, trace; default info
with a config, warn without one),
TEND_LOG_FORMAT=json writes JSON lines. Logs go to stderr.";

#[derive(Debug, PartialEq, Eq)]
pub struct Cli {
    pub config: Option<PathBuf>,
    pub mode: Option<Mode>,
    /// The service to run (after `--`); replaces service.command.
    pub command: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Mode {
    CheckConfig,
    Probe,
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Run(Cli),
    /// Print this on stdout and exit 0 (--help, --version).
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
        while let Some(arg) = args.next() {
            let arg = arg
                .into_string()
                .map_err(|a| format!("argument {a:?} is not valid UTF-8"))?;
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
                "-h" | "--help" => return Ok(Parsed::Print(format!("{HELP}\n\n{USAGE}"))),
                "-V" | "--version" => {
                    return Ok(Parsed::Print(format!("tend {}", env!("CARGO_PKG_VERSION"))));
                }
                "--config" => {
                    let path = args.next().ok_or("--config needs a path: --config PATH")?;
                    cli.config = Some(PathBuf::from(path));
                }
                "check-config" | "probe" if cli.mode.is_none() => {
                    cli.mode = Some(if arg == "probe" {
                        Mode::Probe
                    } else {
                        Mode::CheckConfig
                    });
                }
                _ => {
                    if let Some(path) = arg.strip_prefix("--config=") {
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

    #[test]
    fn help_and_version_are_printed() {
        for flag in ["-h", "--help"] {
            let Ok(Parsed::Print(text)) = Cli::parse([OsString::from(flag)]) else {
                panic!()
            };
            assert!(text.contains("check-config") && text.contains("Exit status"));
        }
        let Ok(Parsed::Print(text)) = Cli::parse([OsString::from("-V")]) else {
            panic!()
        };
        assert!(text.starts_with("tend "));
    }
}
