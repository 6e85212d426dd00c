//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

const AFTER_HELP: &str = "\
Config: --config PATH, else $TEND_CONFIG, else /etc/tend/supervisor.toml when it
exists. Without a config, tend is a plain init for COMMAND.

Exit status: the service's exit code, or 128+N when signal N killed it;
2 for a usage or config error (nothing is started); 127 when COMMAND is not
found, 126 when it is not executable; 1 for any other failure of tend.

Logging: TEND_LOG sets the level (error, warn, info, debug, trace; default info),
TEND_LOG_FORMAT=json writes JSON lines. Logs go to stderr.";

/// PID 1 for containers: runs the service, forwards signals, reaps zombies,
/// and reloads the service when its mounted config changes.
#[derive(Parser, Debug)]
#[command(name = "tend", version, after_help = AFTER_HELP, args_override_self = true)]
pub struct Cli {
    /// The supervisor.toml to use.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub mode: Option<Mode>,

    /// The service to run; replaces service.command from the config.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Validate the config and print what it means, with defaults filled in.
    CheckConfig,
    /// Exit 0 when the running tend is ready, 1 when not (for exec readiness probes).
    Probe,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("tend").chain(args.iter().copied()))
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
        let cli = parse(&["--", "ls", "--config", "-l"]).unwrap();
        assert_eq!(cli.command, ["ls", "--config", "-l"]);
        assert_eq!(cli.config, None);
    }

    #[test]
    fn subcommands_take_the_config_flag_on_either_side() {
        let cli = parse(&["check-config", "--config", "/a"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::CheckConfig));
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/a")));
        let cli = parse(&["--config", "/a", "probe"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Probe));
    }

    #[test]
    fn a_command_without_the_double_dash_is_a_usage_error() {
        let err = parse(&["nginx"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(parse(&["--bogus"]).is_err());
    }
}
