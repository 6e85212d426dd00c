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
  tend check-config [--in-image] [--config PATH]
                                               validate supervisor.toml, print what it means
  tend probe [--config PATH]                   exit 0 when ready, 1 when not
  tend status [--config PATH]                  print the status file for a person
  tend signal [--config PATH] NAME SIG         send a signal to service NAME
  tend restart [--config PATH] NAME            restart service NAME
  tend install DIR                             copy tend to DIR/tend (for an init container)
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
Usage: tend check-config [--in-image] [--config PATH]

Validates supervisor.toml and prints it back as TOML with every default filled
in. Warnings go to stderr.

What the image and the pod provide (working_dir; the programs of the service,
check, exec, verify and ready_check; a `user`; watched paths that are not
`optional`; env_from paths) is a warning when it is not on this machine, so CI
can check the file without the image.

  --in-image   check inside the container as tend will run, volumes mounted:
               what is missing there is an error

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

const SIGNAL_HELP: &str = "\
Usage: tend signal [--config PATH] NAME SIG

Asks the running tend to send signal SIG (HUP or SIGHUP, or a number) to
service NAME: to its serving instance, or its process group with
process_group = true. Signals sent to tend itself go to the main service only.
Talks to tend through the control socket beside [readiness] status_file
(status_file + \".sock\"), which only tend's user and root may use.
Exit status: 0 when the signal was sent (the line names the pid), 1 when it
was not (the service is not running, tend is not running, permission denied),
2 for a usage error, an unknown service, or a config without status_file.";

const RESTART_HELP: &str = "\
Usage: tend restart [--config PATH] NAME

Asks the running tend to restart service NAME as a restart action does
(restart_mode, sockets, readiness), once its config passed its check. A
service waiting out a restart back-off starts at once; a oneshot that finished
runs again; a service that ended (not required) starts again. It returns once
the restart is under way: `tend status` shows how it goes.
Exit status: 0 when the restart is under way, 1 when nothing was done (the
line says why: a restart already under way, the service waits for its config,
tend is not running, permission denied), 2 for a usage error, an unknown
service, or a config without status_file.";

const INSTALL_HELP: &str = "\
Usage: tend install DIR

Copies this tend's own binary to DIR/tend (mode 0755), creating DIR when it
is missing: for an init container that puts tend into an emptyDir, so that
an image built without tend runs it as its command:

  initContainers:   image: (an image with tend)   args: [\"install\", \"/tend\"]
  containers:       command: [\"/tend/tend\", \"--\", (the image's ENTRYPOINT)]

The copy is written under a temporary name, synced, then renamed into place:
a container never sees half a binary, and installing again replaces it.
Needs no config. Exit status: 0 when installed, 1 when not (the line says
why: a read-only or full DIR, one tend's user cannot write), 2 for a usage
error.";

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

/// Writes `tend: {message}` to stderr (through the output writer when tend
/// runs as an init), or with `TEND_LOG_FORMAT=json` a JSON line at level
/// ERROR, as the log's: whoever collects the log reads why tend stopped. Nothing is left to tell when that fails (stderr closed
/// or its reader gone), so a failure is ignored.
pub fn complain(message: impl std::fmt::Display) {
    say("ERROR", "", &message.to_string());
}

/// [`complain`] for a warning: `tend: warning: {message}`, or level WARN.
pub fn warn(message: impl std::fmt::Display) {
    say("WARN", "warning: ", &message.to_string());
}

fn say(level: &str, prefix: &str, message: &str) {
    let line = if std::env::var_os("TEND_LOG_FORMAT").is_some_and(|f| f == "json") {
        crate::log::json_record(level, message)
    } else {
        format!("tend: {prefix}{message}\n")
    };
    // Through the output writer when tend runs as an init: never blocks.
    crate::output::tend_lines(&line);
}

#[derive(Debug, PartialEq, Eq)]
pub struct Cli {
    pub config: Option<PathBuf>,
    pub mode: Option<Mode>,
    /// `check-config --in-image`: what the image and the pod provide must be here.
    pub in_image: bool,
    /// The service to run (after `--`); replaces service.command.
    pub command: Vec<String>,
    /// The subcommand's words: NAME (and SIG) of `signal` and `restart`.
    pub operands: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    CheckConfig,
    Probe,
    Status,
    Signal,
    Restart,
    Install,
}

impl Mode {
    fn from_word(word: &str) -> Option<Mode> {
        match word {
            "check-config" => Some(Mode::CheckConfig),
            "probe" => Some(Mode::Probe),
            "status" => Some(Mode::Status),
            "signal" => Some(Mode::Signal),
            "restart" => Some(Mode::Restart),
            "install" => Some(Mode::Install),
            _ => None,
        }
    }

    fn help(self) -> &'static str {
        match self {
            Mode::CheckConfig => CHECK_CONFIG_HELP,
            Mode::Probe => PROBE_HELP,
            Mode::Status => STATUS_HELP,
            Mode::Signal => SIGNAL_HELP,
            Mode::Restart => RESTART_HELP,
            Mode::Install => INSTALL_HELP,
        }
    }

    /// The words it takes after its name, for a usage error.
    fn operands(self) -> &'static [&'static str] {
        match self {
            Mode::Signal => &["NAME", "SIG"],
            Mode::Restart => &["NAME"],
            Mode::Install => &["DIR"],
            _ => &[],
        }
    }

    fn word(self) -> &'static str {
        match self {
            Mode::CheckConfig => "check-config",
            Mode::Probe => "probe",
            Mode::Status => "status",
            Mode::Signal => "signal",
            Mode::Restart => "restart",
            Mode::Install => "install",
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
            in_image: false,
            command: Vec::new(),
            operands: Vec::new(),
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
                "--in-image" => cli.in_image = true,
                _ => {
                    if let Some(mode) = Mode::from_word(&arg).filter(|_| cli.mode.is_none()) {
                        cli.mode = Some(mode);
                    } else if !arg.starts_with('-')
                        && cli
                            .mode
                            .is_some_and(|m| cli.operands.len() < m.operands().len())
                    {
                        cli.operands.push(arg);
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
        if let Some(mode) = cli.mode
            && cli.operands.len() < mode.operands().len()
        {
            let wanted = mode.operands();
            return Err(format!(
                "tend {} needs {}: tend {} {}",
                mode.word(),
                wanted[cli.operands.len()..].join(" and "),
                mode.word(),
                wanted.join(" ")
            ));
        }
        if cli.in_image && cli.mode != Some(Mode::CheckConfig) {
            return Err(
                "--in-image is an option of check-config: tend check-config --in-image".into(),
            );
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
    fn signal_and_restart_take_their_words_with_the_config_flag_anywhere() {
        let cli = parse(&["signal", "--config", "/a", "web", "HUP"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Signal));
        assert_eq!(cli.operands, ["web", "HUP"]);
        assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/a")));
        let cli = parse(&["restart", "web", "--config=/b"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Restart));
        assert_eq!(cli.operands, ["web"]);
        // A service may be named like a subcommand.
        assert_eq!(parse(&["restart", "status"]).unwrap().operands, ["status"]);
        let e = parse(&["signal", "web"]).unwrap_err();
        assert!(e.contains("needs SIG: tend signal NAME SIG"), "{e}");
        let e = parse(&["restart"]).unwrap_err();
        assert!(e.contains("needs NAME: tend restart NAME"), "{e}");
        assert!(parse(&["restart", "web", "php"]).is_err());
        assert!(parse(&["restart", "web", "--", "x"]).is_err());
        assert!(parse(&["status", "web"]).is_err(), "status takes no name");
        for (sub, usage) in [
            ("signal", "Usage: tend signal"),
            ("restart", "Usage: tend restart"),
        ] {
            let text = printed(&[sub, "--help"]);
            assert!(
                text.starts_with(usage) && text.contains("Exit status"),
                "{text}"
            );
        }
    }

    #[test]
    fn in_image_is_an_option_of_check_config_only() {
        let cli = parse(&["check-config", "--in-image"]).unwrap();
        assert!(cli.in_image);
        assert!(parse(&["--in-image", "check-config"]).unwrap().in_image);
        assert!(!parse(&["check-config"]).unwrap().in_image);
        for args in [
            &["--in-image"][..],
            &["probe", "--in-image"],
            &["--in-image", "--", "sh"],
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains("option of check-config"), "{args:?}: {e}");
        }
    }

    #[test]
    fn status_is_a_subcommand() {
        let cli = parse(&["status", "--config", "/a"]).unwrap();
        assert_eq!(cli.mode, Some(Mode::Status));
    }
}
