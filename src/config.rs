//! supervisor.toml: its types, defaults and validation.
//!
//! Values that can be checked on their own (durations, signal names, argv) are
//! checked while deserializing, so the TOML parser's error already carries the
//! line and column. Rules that span several keys are checked afterwards from
//! `Spanned` values, so they name a line too. What depends on the host (does
//! working_dir exist, is a watched path there) is checked last, in `host`,
//! by `tend check-config` and before a run, not by `tend probe`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use toml::Spanned;

use crate::signals::SignalName;
use crate::sockets::SocketSpec;

mod duration;
mod host;

pub use crate::users::User;
pub use duration::{format_duration, parse_duration};
pub use host::Place;

/// Where tend looks for its config when neither `--config` nor `$TEND_CONFIG`
/// names one.
pub const DEFAULT_PATH: &str = "/etc/tend/supervisor.toml";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Every service, in the order of the file; at least one.
    pub services: Vec<Service>,
    /// The main service's index: tend exits with its status, forwards
    /// signals to it, and `-- COMMAND` replaces its command.
    pub main: usize,
    pub readiness: Readiness,
    pub watches: Vec<Watch>,
    /// Listening sockets tend holds for the service (fds 3.. in this order).
    pub sockets: Vec<SocketSpec>,
    /// `[http]`: tend's own HTTP server (/ready, /status, /metrics); off
    /// unless configured.
    pub http: Option<Http>,
}

impl Default for Config {
    /// No file: one service, whose command comes after `--`.
    fn default() -> Config {
        Config {
            services: vec![Service::default()],
            main: 0,
            readiness: Readiness::default(),
            watches: Vec::new(),
            sockets: Vec::new(),
            http: None,
        }
    }
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Http {
    pub listen: std::net::SocketAddr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// Given with several services; a single `[service]` without one is
    /// named after its program ([`Config::service_name`]).
    pub name: Option<String>,
    /// None when the file leaves the command to the command line (`-- COMMAND`).
    pub command: Option<Vec<String>>,
    pub working_dir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    /// Env files or directories, read at every start of the service; `env`
    /// wins over them.
    pub env_from: Vec<PathBuf>,
    pub stop_signal: Signal,
    pub stop_timeout: Duration,
    pub restart: Restart,
    pub process_group: bool,
    /// The service reports readiness on NOTIFY_SOCKET (sd_notify).
    pub notify: bool,
    /// Without notify: the service is ready once this exits 0.
    pub ready_check: Option<Vec<String>>,
    pub ready_timeout: Duration,
    pub restart_mode: RestartMode,
    /// Services (indices) that must be ready before this one starts.
    pub after: Vec<usize>,
    /// Runs once to completion: exit 0 counts as ready and done.
    pub oneshot: bool,
    /// Its end ends the container (false: logged and counted).
    pub required: bool,
    pub output: Output,
    /// A signal reload is applied only at RELOADING=1 then READY=1
    /// (systemd's Type=notify-reload); otherwise once the signal is sent.
    pub reload_notify: bool,
    /// The user it runs as; None: tend's own.
    pub user: Option<User>,
}

/// `output`: where a service's stdout and stderr go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// tend's own stdout and stderr, as they are.
    Inherit,
    /// Through tend, each line as `NAME | line`.
    Prefix,
}

impl Output {
    pub fn as_str(self) -> &'static str {
        match self {
            Output::Inherit => "inherit",
            Output::Prefix => "prefix",
        }
    }
}

/// How a `restart` action replaces the running service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartMode {
    /// Stop the old instance, then start the new one.
    StopStart,
    /// Start the new instance, wait until it is ready, then stop the old one.
    Overlap,
}

impl RestartMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartMode::StopStart => "stop-start",
            RestartMode::Overlap => "overlap",
        }
    }
}

impl Default for Service {
    fn default() -> Self {
        Service {
            command: None,
            working_dir: None,
            env: BTreeMap::new(),
            env_from: Vec::new(),
            stop_signal: Signal::SIGTERM,
            stop_timeout: Duration::from_secs(10),
            restart: Restart::Never,
            process_group: false,
            notify: false,
            ready_check: None,
            ready_timeout: Duration::from_secs(30),
            restart_mode: RestartMode::StopStart,
            name: None,
            after: Vec::new(),
            oneshot: false,
            required: true,
            output: Output::Inherit,
            reload_notify: false,
            user: None,
        }
    }
}

/// What happens when the service exits on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    Never,
    OnFailure,
    Always,
}

impl Restart {
    pub fn as_str(self) -> &'static str {
        match self {
            Restart::Never => "never",
            Restart::OnFailure => "on-failure",
            Restart::Always => "always",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Readiness {
    pub file: Option<PathBuf>,
    pub status_file: Option<PathBuf>,
    /// Readiness while a new config is rejected and the service keeps
    /// running its last good one.
    pub invalid_config: InvalidConfig,
}

/// `[readiness] invalid_config`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidConfig {
    /// Not ready: a rollout that waits for readiness stops.
    #[default]
    NotReady,
    /// Ready: every replica that rejects an in-place edit keeps serving.
    Ready,
}

impl InvalidConfig {
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidConfig::NotReady => "not_ready",
            InvalidConfig::Ready => "ready",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Watch {
    pub name: String,
    pub paths: Vec<PathBuf>,
    pub check: Option<Vec<String>>,
    pub check_timeout: Duration,
    /// The first wait before a failed check is run again; it doubles up to
    /// a minute.
    pub recheck: Duration,
    pub action: Action,
    pub debounce: Duration,
    /// `publish`: the directory that holds the last content that passed the
    /// check, laid out like a kubelet volume; the service reads it instead
    /// of the watched paths.
    pub publish: Option<PathBuf>,
    /// Run after the action until it exits 0: the change is applied then.
    pub verify: Option<Vec<String>>,
    /// A verify that has not passed by then has failed: with `publish`, the
    /// previous generation is put back.
    pub verify_timeout: Duration,
    /// A valid change waits a random time in [0, splay) before its action.
    pub splay: Duration,
    /// The service (index) its action, verify and rollback touch.
    pub service: usize,
    /// A path missing at start is fine (an optional ConfigMap).
    pub optional: bool,
    /// Its check gets the service's sockets as fds 3.. with LISTEN_*.
    pub check_sockets: bool,
}

/// What a check's argv writes for the candidate generation's directory.
pub const CANDIDATE: &str = "{candidate}";

/// What a watch does once a changed config passed its check.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Signal(Signal),
    Restart,
    Exec(Vec<String>),
    /// Call a reload endpoint (see http_action.rs).
    Http(HttpAction),
    None,
}

/// `http = { url, method, timeout }` of `on_change = "http"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAction {
    pub url: String,
    pub method: String,
    pub timeout: Duration,
}

/// A config that could not be used; tend exits 2 and starts nothing.
#[derive(Debug)]
pub struct ConfigError {
    pub path: PathBuf,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid config {}: {}",
            self.path.display(),
            self.message
        )
    }
}

impl std::error::Error for ConfigError {}

/// Where values were written, to name the line of a problem found after
/// parsing.
#[derive(Debug, Default)]
struct Spans {
    services: Vec<ServiceSpans>,
    file: Option<Range<usize>>,
    status_file: Option<Range<usize>>,
    watches: Vec<WatchSpans>,
}

#[derive(Debug, Default)]
struct ServiceSpans {
    command: Option<Range<usize>>,
    ready_check: Option<Range<usize>>,
    working_dir: Option<Range<usize>>,
    env_from: Option<Range<usize>>,
    user: Option<Range<usize>>,
}

#[derive(Debug)]
struct WatchSpans {
    name: Option<Range<usize>>,
    paths: Range<usize>,
    check: Option<Range<usize>>,
    exec: Option<Range<usize>>,
    verify: Option<Range<usize>>,
    publish: Option<Range<usize>>,
}

impl Config {
    /// Reads and validates the file at `path`, without looking at the host
    /// (`tend probe` needs only `[readiness]`).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read(path)?;
        Config::parse(&text).map_err(|message| ConfigError {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Reads and validates the file at `path`, then checks it against this
    /// host, with relative paths taken from `cwd`: what can never work here
    /// is an error, what must be there only where tend runs (`place` says
    /// whether that is here) or is likely a mistake a warning (returned).
    pub fn load_on_host(
        path: &Path,
        cwd: &Path,
        place: Place,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let text = read(path)?;
        Config::parse_on_host(&text, cwd, place).map_err(|message| ConfigError {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses supervisor.toml text; the error names the line.
    pub fn parse(text: &str) -> Result<Config, String> {
        Config::parse_spanned(text).map(|(config, _)| config)
    }

    /// `parse`, then the checks against this host; returns the warnings.
    fn parse_on_host(
        text: &str,
        cwd: &Path,
        place: Place,
    ) -> Result<(Config, Vec<String>), String> {
        let (config, spans) = Config::parse_spanned(text)?;
        let warnings = host::inspect(&config, &spans, text, cwd, place)?;
        Ok((config, warnings))
    }

    fn parse_spanned(text: &str) -> Result<(Config, Spans), String> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| explain_toml_error(&e, text))?;
        let span = |v: &Option<Spanned<PathBuf>>| v.as_ref().map(Spanned::span);
        let (services, main, service_spans) = services(raw.service, text)?;
        let mut spans = Spans {
            services: service_spans,
            file: span(&raw.readiness.file),
            status_file: span(&raw.readiness.status_file),
            watches: Vec::new(),
        };
        let mut watches = Vec::with_capacity(raw.watch.len());
        for w in raw.watch {
            spans.watches.push(WatchSpans {
                name: w.name.as_ref().map(Spanned::span),
                paths: w.paths.span(),
                check: w.check.as_ref().map(Spanned::span),
                exec: w.exec.as_ref().map(Spanned::span),
                verify: w.verify.as_ref().map(Spanned::span),
                publish: w.publish.as_ref().map(Spanned::span),
            });
            let owner = w.service.clone();
            let mut watch = w.into_watch(text)?;
            watch.service = owner_of(&services, main, owner, text, "[[watch]]", &watch.name)?;
            if let Some(prev) = watches.iter().find(|p: &&Watch| p.name == watch.name) {
                // The second one's name, or its first path, which named it.
                let this = &spans.watches[watches.len()];
                return Err(at(
                    text,
                    this.name.clone().unwrap_or_else(|| this.paths.clone()),
                    &format!(
                        "two watches are named {:?}: give each [[watch]] its own `name` ({} and {})",
                        prev.name,
                        prev.paths[0].display(),
                        watch.paths[0].display()
                    ),
                ));
            }
            watches.push(watch);
        }
        publish_dirs(&watches, &spans, text)?;
        let mut sockets: Vec<SocketSpec> = Vec::with_capacity(raw.socket.len());
        for sock in raw.socket {
            let span = sock.span();
            let raw_sock = sock.into_inner();
            let owner = raw_sock.service.clone();
            let mut spec = raw_sock.into_spec(text, span.clone())?;
            spec.service = owner_of(&services, main, owner, text, "[[socket]]", &spec.name)?;
            if sockets.iter().any(|s| s.name == spec.name) {
                return Err(at(
                    text,
                    span,
                    &format!(
                        "two sockets are named {:?}: give each [[socket]] its own `name`",
                        spec.name
                    ),
                ));
            }
            sockets.push(spec);
        }
        let http = match raw.http {
            Some(h) => {
                let span = h.span();
                Some(h.into_inner().into_http(text, span, &sockets)?)
            }
            None => None,
        };
        let config = Config {
            sockets,
            http,
            services,
            main,
            readiness: Readiness {
                file: raw.readiness.file.map(Spanned::into_inner),
                status_file: raw.readiness.status_file.map(Spanned::into_inner),
                invalid_config: raw.readiness.invalid_config.unwrap_or_default(),
            },
            watches,
        };
        readiness_outside_publish(&config, &spans, text)?;
        Ok((config, spans))
    }

    /// The longest a stop can take, and the chain of services that takes
    /// it: a service gets its stop signal once every service after it is
    /// gone, each may use its whole stop_timeout, and as PID 1 tend then
    /// gives what is left in the container the main service's stop_timeout
    /// and 2 s more after SIGKILL.
    pub fn stop_bound(&self) -> (Duration, Vec<usize>) {
        // The longest chain that ends with service i (i stops last in it).
        fn chain(
            config: &Config,
            i: usize,
            memo: &mut Vec<Option<(Duration, Vec<usize>)>>,
        ) -> (Duration, Vec<usize>) {
            if let Some(c) = &memo[i] {
                return c.clone();
            }
            let mut best = (Duration::ZERO, Vec::new());
            for (j, s) in config.services.iter().enumerate() {
                if s.after.contains(&i) {
                    let c = chain(config, j, memo);
                    if c.0 > best.0 {
                        best = c;
                    }
                }
            }
            best.0 += config.services[i].stop_timeout;
            best.1.push(i);
            memo[i] = Some(best.clone());
            best
        }
        let mut memo = vec![None; self.services.len()];
        let longest = (0..self.services.len())
            .map(|i| chain(self, i, &mut memo))
            .max_by_key(|c| c.0)
            .unwrap_or_default();
        let leftovers = self.service().stop_timeout + Duration::from_secs(2);
        (longest.0 + leftovers, longest.1)
    }

    /// The main service.
    pub fn service(&self) -> &Service {
        &self.services[self.main]
    }

    /// Service `i`'s name: its `name`, else (a single `[service]`) its
    /// program's, the last part of `argv[0]` (`argv`: the command it runs,
    /// which `-- COMMAND` may have replaced).
    pub fn service_name(&self, i: usize, argv: Option<&[String]>) -> String {
        if let Some(name) = &self.services[i].name {
            return name.clone();
        }
        argv.or(self.services[i].command.as_deref())
            .and_then(|a| a.first())
            .and_then(|a| a.rsplit('/').next())
            .filter(|n| !n.is_empty())
            .unwrap_or("service")
            .to_string()
    }

    /// What the config means, defaults filled in, as TOML that tend accepts.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let several = self.services.len() > 1;
        for (i, s) in self.services.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(if several {
                "[[service]]\n"
            } else {
                "[service]\n"
            });
            if let Some(name) = &s.name {
                writeln!(out, "name = {}", quote(name)).unwrap();
            }
            if several {
                if i == self.main {
                    out.push_str("main = true\n");
                }
                if !s.after.is_empty() {
                    let after: Vec<String> = s
                        .after
                        .iter()
                        .map(|&j| self.services[j].name.clone().unwrap_or_default())
                        .collect();
                    writeln!(out, "after = {}", quote_list(&after)).unwrap();
                }
                writeln!(out, "required = {}", s.required).unwrap();
            }
            if s.oneshot {
                out.push_str("oneshot = true\n");
            }
            describe_service(&mut out, s);
            if several || s.output != Output::Inherit {
                writeln!(out, "output = {}", quote(s.output.as_str())).unwrap();
            }
        }

        let r = &self.readiness;
        if r.file.is_some()
            || r.status_file.is_some()
            || r.invalid_config != InvalidConfig::NotReady
        {
            out.push_str("\n[readiness]\n");
            if let Some(f) = &r.file {
                writeln!(out, "file = {}", quote(&f.to_string_lossy())).unwrap();
            }
            if let Some(f) = &r.status_file {
                writeln!(out, "status_file = {}", quote(&f.to_string_lossy())).unwrap();
            }
            writeln!(out, "invalid_config = {}", quote(r.invalid_config.as_str())).unwrap();
        }

        for sock in &self.sockets {
            out.push_str("\n[[socket]]\n");
            writeln!(out, "name = {}", quote(&sock.name)).unwrap();
            if several {
                let owner = self.services[sock.service].name.clone().unwrap_or_default();
                writeln!(out, "service = {}", quote(&owner)).unwrap();
            }
            writeln!(out, "listen = {}", quote(&sock.listen.to_string())).unwrap();
            if let Some(b) = sock.backlog {
                writeln!(out, "backlog = {b}").unwrap();
            }
            if let Some(m) = sock.mode {
                writeln!(out, "mode = \"{m:04o}\"").unwrap();
            }
        }

        if let Some(h) = &self.http {
            out.push_str("\n[http]\n");
            writeln!(out, "listen = {}", quote(&h.listen.to_string())).unwrap();
        }

        for w in &self.watches {
            out.push_str("\n[[watch]]\n");
            writeln!(out, "name = {}", quote(&w.name)).unwrap();
            if several {
                let owner = self.services[w.service].name.clone().unwrap_or_default();
                writeln!(out, "service = {}", quote(&owner)).unwrap();
            }
            if w.optional {
                out.push_str("optional = true\n");
            }
            if w.check_sockets {
                out.push_str("check_sockets = true\n");
            }
            let paths: Vec<String> = w.paths.iter().map(|p| p.to_string_lossy().into()).collect();
            writeln!(out, "paths = {}", quote_list(&paths)).unwrap();
            match &w.check {
                Some(argv) => writeln!(out, "check = {}", quote_list(argv)).unwrap(),
                None => out.push_str("# check: none; every change counts as valid\n"),
            }
            writeln!(
                out,
                "check_timeout = {}",
                quote(&format_duration(w.check_timeout))
            )
            .unwrap();
            writeln!(out, "recheck = {}", quote(&format_duration(w.recheck))).unwrap();
            if let Some(dir) = &w.publish {
                writeln!(out, "publish = {}", quote(&dir.to_string_lossy())).unwrap();
            }
            if let Some(argv) = &w.verify {
                writeln!(out, "verify = {}", quote_list(argv)).unwrap();
                writeln!(
                    out,
                    "verify_timeout = {}",
                    quote(&format_duration(w.verify_timeout))
                )
                .unwrap();
            }
            writeln!(out, "splay = {}", quote(&format_duration(w.splay))).unwrap();
            match &w.action {
                Action::Signal(sig) => {
                    out.push_str("on_change = \"signal\"\n");
                    writeln!(out, "signal = {}", quote(sig.as_str())).unwrap();
                }
                Action::Restart => out.push_str("on_change = \"restart\"\n"),
                Action::Exec(argv) => {
                    out.push_str("on_change = \"exec\"\n");
                    writeln!(out, "exec = {}", quote_list(argv)).unwrap();
                }
                Action::Http(h) => {
                    out.push_str("on_change = \"http\"\n");
                    writeln!(
                        out,
                        "http = {{ url = {}, method = {}, timeout = {} }}",
                        quote(&h.url),
                        quote(&h.method),
                        quote(&format_duration(h.timeout))
                    )
                    .unwrap();
                }
                Action::None => out.push_str("on_change = \"none\"\n"),
            }
            writeln!(out, "debounce = {}", quote(&format_duration(w.debounce))).unwrap();
        }
        out
    }
}

/// The keys of one service, defaults filled in.
fn describe_service(out: &mut String, s: &Service) {
    match &s.command {
        Some(argv) => writeln!(out, "command = {}", quote_list(argv)).unwrap(),
        None => out.push_str("# command: none here; give it after `--` on the command line\n"),
    }
    if let Some(dir) = &s.working_dir {
        writeln!(out, "working_dir = {}", quote(&dir.to_string_lossy())).unwrap();
    }
    if !s.env.is_empty() {
        let pairs: Vec<String> = s
            .env
            .iter()
            .map(|(k, v)| format!("{} = {}", quote(k), quote(v)))
            .collect();
        writeln!(out, "env = {{ {} }}", pairs.join(", ")).unwrap();
    }
    if !s.env_from.is_empty() {
        let paths: Vec<String> = s
            .env_from
            .iter()
            .map(|p| p.to_string_lossy().into())
            .collect();
        writeln!(out, "env_from = {}", quote_list(&paths)).unwrap();
    }
    writeln!(out, "stop_signal = {}", quote(s.stop_signal.as_str())).unwrap();
    writeln!(
        out,
        "stop_timeout = {}",
        quote(&format_duration(s.stop_timeout))
    )
    .unwrap();
    writeln!(out, "restart = {}", quote(s.restart.as_str())).unwrap();
    writeln!(out, "process_group = {}", s.process_group).unwrap();
    writeln!(out, "notify = {}", s.notify).unwrap();
    if let Some(argv) = &s.ready_check {
        writeln!(out, "ready_check = {}", quote_list(argv)).unwrap();
    }
    writeln!(
        out,
        "ready_timeout = {}",
        quote(&format_duration(s.ready_timeout))
    )
    .unwrap();
    writeln!(out, "restart_mode = {}", quote(s.restart_mode.as_str())).unwrap();
    if s.notify {
        writeln!(out, "reload_notify = {}", s.reload_notify).unwrap();
    }
    if let Some(user) = &s.user {
        writeln!(out, "user = {}", quote(&user.to_string())).unwrap();
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        path: path.to_path_buf(),
        message: format!("cannot read it: {e}"),
    })
}

// ------------------------------------------------------------------ raw form

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    service: RawServices,
    #[serde(default)]
    readiness: RawReadiness,
    #[serde(default)]
    watch: Vec<RawWatch>,
    #[serde(default)]
    socket: Vec<Spanned<RawSocket>>,
    http: Option<Spanned<RawHttpServer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttpServer {
    listen: Option<Spanned<String>>,
}

impl RawHttpServer {
    /// `[http] listen`: a TCP address that no `[[socket]]` takes.
    fn into_http(
        self,
        text: &str,
        span: Range<usize>,
        sockets: &[SocketSpec],
    ) -> Result<Http, String> {
        let Some(listen) = self.listen else {
            return Err(at(
                text,
                span,
                "[http] needs `listen`, like listen = \"0.0.0.0:9533\" (leave out [http] for no server)",
            ));
        };
        let span = listen.span();
        let addr = match listen.get_ref().parse::<crate::sockets::Listen>() {
            Ok(crate::sockets::Listen::Tcp(addr)) => addr,
            Ok(crate::sockets::Listen::Unix(_)) => {
                return Err(at(
                    text,
                    span,
                    "[http] listen takes a TCP address like \"0.0.0.0:9533\" or \"[::]:9533\": \
                     probes and Prometheus connect over TCP",
                ));
            }
            Err(e) => return Err(at(text, span, &format!("[http] listen: {e}"))),
        };
        if let Some(s) = sockets.iter().find(
            |s| matches!(s.listen, crate::sockets::Listen::Tcp(a) if a == addr && a.port() != 0),
        ) {
            return Err(at(
                text,
                span,
                &format!(
                    "[http] listen {addr} is the address of [[socket]] {:?}: tend's server needs a port of its own",
                    s.name
                ),
            ));
        }
        Ok(Http { listen: addr })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSocket {
    service: Option<Spanned<String>>,
    name: String,
    listen: Spanned<String>,
    backlog: Option<Spanned<u32>>,
    mode: Option<Spanned<String>>,
}

impl RawSocket {
    fn into_spec(self, text: &str, span: std::ops::Range<usize>) -> Result<SocketSpec, String> {
        let listen_span = self.listen.span();
        let listen = self
            .listen
            .into_inner()
            .parse()
            .map_err(|e: String| at(text, listen_span, &e))?;
        let backlog = match self.backlog {
            Some(b) if *b.get_ref() == 0 => {
                return Err(at(
                    text,
                    b.span(),
                    "`backlog` is 0: the kernel would queue no connection while no instance accepts",
                ));
            }
            b => b.map(Spanned::into_inner),
        };
        let mode = match self.mode {
            Some(m) => {
                let span = m.span();
                Some(crate::sockets::parse_mode(m.get_ref()).map_err(|e| at(text, span, &e))?)
            }
            None => None,
        };
        let spec = SocketSpec {
            service: 0,
            name: self.name,
            listen,
            backlog,
            mode,
        };
        spec.validate().map_err(|e| at(text, span, &e))?;
        Ok(spec)
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawReadiness {
    file: Option<Spanned<PathBuf>>,
    status_file: Option<Spanned<PathBuf>>,
    invalid_config: Option<InvalidConfig>,
}

/// `[service]` (one table) or `[[service]]` (an array of them).
enum RawServices {
    One(Box<RawService>),
    Many(Vec<Spanned<RawService>>),
}

impl Default for RawServices {
    fn default() -> RawServices {
        RawServices::One(Box::default())
    }
}

impl<'de> Deserialize<'de> for RawServices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = RawServices;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a [service] table, or [[service]] tables")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawServices, A::Error> {
                RawService::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|s| RawServices::One(Box::new(s)))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<RawServices, A::Error> {
                let mut all = Vec::new();
                while let Some(s) = seq.next_element::<Spanned<RawService>>()? {
                    all.push(s);
                }
                Ok(RawServices::Many(all))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawService {
    name: Option<Spanned<String>>,
    after: Option<Spanned<Vec<String>>>,
    oneshot: Option<bool>,
    main: Option<Spanned<bool>>,
    required: Option<bool>,
    output: Option<Output>,
    reload_notify: Option<Spanned<bool>>,
    user: Option<Spanned<String>>,
    command: Option<Spanned<Argv>>,
    working_dir: Option<Spanned<PathBuf>>,
    #[serde(default)]
    env: BTreeMap<String, EnvValue>,
    env_from: Option<Spanned<Vec<PathBuf>>>,
    stop_signal: Option<SignalName>,
    stop_timeout: Option<Spanned<Dur>>,
    restart: Option<Restart>,
    process_group: Option<bool>,
    notify: Option<bool>,
    ready_check: Option<Spanned<Argv>>,
    ready_timeout: Option<Spanned<Dur>>,
    restart_mode: Option<RestartMode>,
}

impl RawService {
    /// The service, but for `after` (names, resolved by [`services`]).
    fn into_service(self, text: &str, several: bool) -> Result<Service, String> {
        let d = Service::default();
        let oneshot = self.oneshot.unwrap_or(false);
        let label = match &self.name {
            Some(n) => format!("service {:?}", n.get_ref()),
            None => "[service]".to_string(),
        };
        if oneshot {
            if let Some(restart) = self.restart.filter(|r| *r == Restart::Always) {
                return Err(format!(
                    "{label}: a oneshot with restart = {:?} would run again after it succeeded: \
                     use \"on-failure\" to retry a failed run, or \"never\"",
                    restart.as_str()
                ));
            }
            let gate = match (&self.notify, &self.ready_check) {
                (Some(true), _) => Some("notify"),
                (_, Some(_)) => Some("ready_check"),
                _ => None,
            };
            if let Some(key) = gate {
                return Err(format!(
                    "{label}: `{key}` on a oneshot: a oneshot is ready when it exits 0"
                ));
            }
            if self.restart_mode == Some(RestartMode::Overlap) {
                return Err(format!(
                    "{label}: restart_mode = \"overlap\" on a oneshot: nothing restarts it on a change"
                ));
            }
        }
        if let Some(r) = &self.reload_notify
            && *r.get_ref()
            && self.notify != Some(true)
        {
            return Err(at(
                text,
                r.span(),
                &format!(
                    "{label}: `reload_notify` needs notify = true: the service confirms a reload \
                     with RELOADING=1 then READY=1 on NOTIFY_SOCKET"
                ),
            ));
        }
        let user = match self.user {
            Some(u) => {
                let span = u.span();
                Some(
                    User::parse(u.get_ref())
                        .map_err(|e| at(text, span, &format!("{label}: {e}")))?,
                )
            }
            None => None,
        };
        let env_from = match self.env_from {
            Some(paths) if paths.get_ref().iter().any(|p| p.as_os_str().is_empty()) => {
                return Err(at(
                    text,
                    paths.span(),
                    "`env_from` holds an empty path: name env files or directories",
                ));
            }
            paths => paths.map(Spanned::into_inner).unwrap_or_default(),
        };
        Ok(Service {
            command: self.command.map(|a| a.into_inner().0),
            working_dir: self.working_dir.map(Spanned::into_inner),
            env: self.env.into_iter().map(|(k, v)| (k, v.0)).collect(),
            env_from,
            stop_signal: self.stop_signal.map_or(d.stop_signal, |s| s.0),
            stop_timeout: not_zero(
                text,
                self.stop_timeout,
                d.stop_timeout,
                "`stop_timeout` is 0: the service would get SIGKILL together with stop_signal, \
                 with no time to stop cleanly; to kill it at once, set stop_signal = \"SIGKILL\"",
            )?,
            restart: self.restart.unwrap_or(d.restart),
            process_group: self.process_group.unwrap_or(d.process_group),
            notify: self.notify.unwrap_or(d.notify),
            ready_check: match (self.ready_check, self.notify) {
                (Some(check), Some(true)) => {
                    return Err(at(
                        text,
                        check.span(),
                        "`ready_check` is for services without `notify`: with notify = true, \
                         READY=1 says when the service is ready",
                    ));
                }
                (check, _) => check.map(|a| a.into_inner().0),
            },
            ready_timeout: not_zero(
                text,
                self.ready_timeout,
                d.ready_timeout,
                "`ready_timeout` is 0: no start could ever be ready in time",
            )?,
            restart_mode: self.restart_mode.unwrap_or(d.restart_mode),
            name: self.name.map(Spanned::into_inner),
            after: Vec::new(),
            oneshot,
            required: self.required.unwrap_or(d.required),
            output: self.output.unwrap_or(if several {
                Output::Prefix
            } else {
                Output::Inherit
            }),
            reload_notify: self.reload_notify.is_some_and(|r| r.into_inner()),
            user,
        })
    }
}

/// Validates the services: names, `after` (resolved to indices, without a
/// cycle), and the main one. Returns them, the main's index, and where
/// their values were written.
fn services(
    raw: RawServices,
    text: &str,
) -> Result<(Vec<Service>, usize, Vec<ServiceSpans>), String> {
    let raw: Vec<(RawService, Option<Range<usize>>)> = match raw {
        RawServices::One(s) => vec![(*s, None)],
        RawServices::Many(all) => all
            .into_iter()
            .map(|s| {
                let span = s.span();
                (s.into_inner(), Some(span))
            })
            .collect(),
    };
    if raw.is_empty() {
        return Err("[[service]] is there but holds no service: give at least one".to_string());
    }
    let several = raw.len() > 1;
    let mut services = Vec::with_capacity(raw.len());
    let mut spans = Vec::with_capacity(raw.len());
    let mut afters = Vec::with_capacity(raw.len());
    let mut mains = Vec::new();
    for (i, (r, table)) in raw.into_iter().enumerate() {
        let table = table.unwrap_or_default();
        match &r.name {
            Some(n) => {
                let name = n.get_ref();
                if name.is_empty()
                    || !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    return Err(at(
                        text,
                        n.span(),
                        &format!(
                            "service name {name:?}: use letters, digits, '-' and '_' (it names \
                             the service in logs, metrics and `tend signal NAME`)"
                        ),
                    ));
                }
                if let Some(prev) = services
                    .iter()
                    .position(|s: &Service| s.name.as_deref() == Some(name.as_str()))
                {
                    return Err(at(
                        text,
                        n.span(),
                        &format!(
                            "two services are named {name:?} (the {} and the {} [[service]]): \
                             give each its own `name`",
                            ordinal(prev),
                            ordinal(i)
                        ),
                    ));
                }
            }
            None if several => {
                return Err(at(
                    text,
                    table,
                    &format!(
                        "the {} [[service]] has no `name`: with several services, each needs one \
                         (letters, digits, '-' and '_')",
                        ordinal(i)
                    ),
                ));
            }
            None => {}
        }
        if let Some(m) = &r.main
            && *m.get_ref()
        {
            mains.push((i, m.span()));
        }
        spans.push(ServiceSpans {
            command: r.command.as_ref().map(Spanned::span),
            ready_check: r.ready_check.as_ref().map(Spanned::span),
            working_dir: r.working_dir.as_ref().map(Spanned::span),
            env_from: r.env_from.as_ref().map(Spanned::span),
            user: r.user.as_ref().map(Spanned::span),
        });
        afters.push(r.after.clone());
        services.push(r.into_service(text, several)?);
    }
    // `after`: names of other services, without a cycle.
    for (i, after) in afters.into_iter().enumerate() {
        let Some(after) = after else { continue };
        let span = after.span();
        for name in after.into_inner() {
            let Some(j) = services
                .iter()
                .position(|s| s.name.as_deref() == Some(name.as_str()))
            else {
                let known: Vec<&str> = services.iter().filter_map(|s| s.name.as_deref()).collect();
                return Err(at(
                    text,
                    span,
                    &format!(
                        "`after` names {name:?}, which is no service here (services: {})",
                        known.join(", ")
                    ),
                ));
            };
            if j == i {
                return Err(at(
                    text,
                    span,
                    &format!("service {name:?} is `after` itself: it could never start"),
                ));
            }
            if !services[i].after.contains(&j) {
                services[i].after.push(j);
            }
        }
    }
    if let Some(cycle) = cycle(&services) {
        let names: Vec<&str> = cycle
            .iter()
            .map(|&i| services[i].name.as_deref().unwrap_or("?"))
            .collect();
        let span = spans[cycle[0]].command.clone().unwrap_or_default();
        let _ = span;
        return Err(format!(
            "the services' `after` make a cycle, so none of them could start: {}",
            names.join(" -> ")
        ));
    }
    let main = match mains.as_slice() {
        [] => match services.iter().position(|s| !s.oneshot) {
            Some(i) => i,
            None => {
                return Err(
                    "every service is a oneshot: mark the one whose end ends the \
                            container with main = true"
                        .to_string(),
                );
            }
        },
        [(i, _)] => *i,
        [(first, _), (_, span), ..] => {
            return Err(at(
                text,
                span.clone(),
                &format!(
                    "two services say main = true ({} is the first): there is one main service, \
                     whose end ends the container",
                    services[*first].name.as_deref().unwrap_or("?")
                ),
            ));
        }
    };
    for (i, s) in services.iter().enumerate() {
        if i != main && s.command.is_none() {
            return Err(at(
                text,
                spans[i].command.clone().unwrap_or_default(),
                &format!(
                    "service {:?} has no `command`: only the main service's command may come \
                     after `--` on the command line",
                    s.name.as_deref().unwrap_or("?")
                ),
            ));
        }
    }
    Ok((services, main, spans))
}

/// The first cycle in the services' `after`, as indices, the first one
/// repeated at the end.
fn cycle(services: &[Service]) -> Option<Vec<usize>> {
    // 0: not seen, 1: on the path being walked, 2: done.
    fn walk(
        i: usize,
        services: &[Service],
        mark: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        mark[i] = 1;
        path.push(i);
        for &j in &services[i].after {
            if mark[j] == 1 {
                let from = path.iter().position(|&k| k == j).expect("on the path");
                let mut cycle = path[from..].to_vec();
                cycle.push(j);
                return Some(cycle);
            }
            if mark[j] == 0
                && let Some(c) = walk(j, services, mark, path)
            {
                return Some(c);
            }
        }
        path.pop();
        mark[i] = 2;
        None
    }
    let mut mark = vec![0u8; services.len()];
    (0..services.len()).find_map(|i| {
        if mark[i] == 0 {
            walk(i, services, &mut mark, &mut Vec::new())
        } else {
            None
        }
    })
}

fn ordinal(i: usize) -> String {
    match i + 1 {
        1 => "first".to_string(),
        2 => "second".to_string(),
        3 => "third".to_string(),
        n => format!("{n}th"),
    }
}

/// The service a `[[watch]]` or `[[socket]]` named `what` belongs to:
/// `service`, or the main one.
fn owner_of(
    services: &[Service],
    main: usize,
    service: Option<Spanned<String>>,
    text: &str,
    table: &str,
    what: &str,
) -> Result<usize, String> {
    let (i, span) = match service {
        None => (main, None),
        Some(name) => {
            let span = name.span();
            match services
                .iter()
                .position(|s| s.name.as_deref() == Some(name.get_ref().as_str()))
            {
                Some(i) => (i, Some(span)),
                None => {
                    let known: Vec<&str> =
                        services.iter().filter_map(|s| s.name.as_deref()).collect();
                    return Err(at(
                        text,
                        span,
                        &format!(
                            "{table} {what:?}: `service` names {:?}, which is no service here{}",
                            name.get_ref(),
                            if known.is_empty() {
                                " (a single [service] is named by its `name` key)".to_string()
                            } else {
                                format!(" (services: {})", known.join(", "))
                            }
                        ),
                    ));
                }
            }
        }
    };
    if services[i].oneshot {
        let message = format!(
            "{table} {what:?} belongs to service {:?}, a oneshot: it runs once and is never \
             reloaded or given sockets",
            services[i].name.as_deref().unwrap_or("?")
        );
        return Err(match span {
            Some(span) => at(text, span, &message),
            None => message,
        });
    }
    Ok(i)
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum OnChange {
    Signal,
    Restart,
    Exec,
    Http,
    None,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    url: String,
    method: Option<String>,
    timeout: Option<Spanned<Dur>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWatch {
    service: Option<Spanned<String>>,
    optional: Option<bool>,
    check_sockets: Option<bool>,
    name: Option<Spanned<String>>,
    paths: Spanned<Vec<PathBuf>>,
    check: Option<Spanned<Argv>>,
    check_timeout: Option<Spanned<Dur>>,
    recheck: Option<Spanned<Dur>>,
    on_change: Option<Spanned<OnChange>>,
    signal: Option<Spanned<SignalName>>,
    exec: Option<Spanned<Argv>>,
    http: Option<Spanned<RawHttp>>,
    debounce: Option<Dur>,
    publish: Option<Spanned<PathBuf>>,
    verify: Option<Spanned<Argv>>,
    verify_timeout: Option<Spanned<Dur>>,
    splay: Option<Dur>,
}

impl RawWatch {
    fn into_watch(self, text: &str) -> Result<Watch, String> {
        let paths_span = self.paths.span();
        let paths = self.paths.into_inner();
        if paths.is_empty() {
            return Err(at(
                text,
                paths_span,
                "`paths` is empty: name at least one file or directory",
            ));
        }
        if let Some(p) = paths.iter().find(|p| p.as_os_str().is_empty()) {
            return Err(at(
                text,
                paths_span,
                &format!("`paths` holds an empty path ({p:?})"),
            ));
        }
        let name = self.name.map_or_else(
            || paths[0].to_string_lossy().into_owned(),
            Spanned::into_inner,
        );
        let label = format!("watch {name:?}");

        let Some(on_change) = self.on_change else {
            return Err(at(
                text,
                paths_span,
                &format!(
                    "{label} has no `on_change`: say what a valid change does, one of \
                     \"signal\", \"restart\", \"exec\", \"http\" or \"none\""
                ),
            ));
        };
        let kind = *on_change.get_ref();
        if let (Some(sig), false) = (&self.signal, kind == OnChange::Signal) {
            return Err(at(
                text,
                sig.span(),
                &format!("{label}: `signal` is only used with on_change = \"signal\""),
            ));
        }
        if let (Some(exec), false) = (&self.exec, kind == OnChange::Exec) {
            return Err(at(
                text,
                exec.span(),
                &format!("{label}: `exec` is only used with on_change = \"exec\""),
            ));
        }
        if let (Some(http), false) = (&self.http, kind == OnChange::Http) {
            return Err(at(
                text,
                http.span(),
                &format!("{label}: `http` is only used with on_change = \"http\""),
            ));
        }
        let action = match kind {
            OnChange::Signal => {
                Action::Signal(self.signal.map_or(Signal::SIGHUP, |s| s.into_inner().0))
            }
            OnChange::Restart => Action::Restart,
            OnChange::None => Action::None,
            OnChange::Http => {
                let Some(http) = self.http else {
                    return Err(at(
                        text,
                        on_change.span(),
                        &format!(
                            "{label}: on_change = \"http\" needs `http = {{ url = \"http://127.0.0.1:PORT/PATH\" }}`"
                        ),
                    ));
                };
                let span = http.span();
                let raw = http.into_inner();
                let method = raw.method.unwrap_or_else(|| "POST".into());
                crate::http_action::Endpoint::parse(&method, &raw.url)
                    .map_err(|e| at(text, span.clone(), &format!("{label}: `http`: {e}")))?;
                Action::Http(HttpAction {
                    url: raw.url,
                    method,
                    timeout: not_zero(
                        text,
                        raw.timeout,
                        Duration::from_secs(5),
                        &format!("{label}: `http` timeout is 0: every call would fail"),
                    )?,
                })
            }
            OnChange::Exec => match self.exec {
                Some(argv) => {
                    only_in_check(text, &argv, &label, "exec")?;
                    Action::Exec(argv.into_inner().0)
                }
                None => {
                    return Err(at(
                        text,
                        on_change.span(),
                        &format!("{label}: on_change = \"exec\" needs `exec`, the command to run"),
                    ));
                }
            },
        };
        let check_timeout = not_zero(
            text,
            self.check_timeout,
            Duration::from_secs(10),
            &format!(
                "{label}: `check_timeout` is 0: every check and reload command would be killed \
                 before it could finish"
            ),
        )?;
        let recheck = not_zero(
            text,
            self.recheck,
            Duration::from_secs(1),
            &format!("{label}: `recheck` is 0: a failed check would be run again without pause"),
        )?;
        let publish = match self.publish {
            Some(p) if p.get_ref().as_os_str().is_empty() => {
                return Err(at(
                    text,
                    p.span(),
                    &format!("{label}: `publish` is empty: name the directory the service reads"),
                ));
            }
            Some(p) => Some(p.into_inner()),
            None => None,
        };
        let check = self.check.map(|a| (a.span(), a.into_inner().0));
        if let Some((span, argv)) = &check
            && publish.is_none()
            && argv.iter().any(|a| a.contains(CANDIDATE))
        {
            return Err(at(
                text,
                span.clone(),
                &format!(
                    "{label}: the check names {CANDIDATE}, which exists only with `publish`: \
                     set `publish`, or check the watched paths"
                ),
            ));
        }
        if let Some(argv) = &self.verify {
            only_in_check(text, argv, &label, "verify")?;
        }
        if let (Some(t), None) = (&self.verify_timeout, &self.verify) {
            return Err(at(
                text,
                t.span(),
                &format!("{label}: `verify_timeout` is only used with `verify`"),
            ));
        }
        let verify_timeout = not_zero(
            text,
            self.verify_timeout,
            Duration::from_secs(30),
            &format!("{label}: `verify_timeout` is 0: every change would be rolled back"),
        )?;
        Ok(Watch {
            verify: self.verify.map(|a| a.into_inner().0),
            verify_timeout,
            splay: self.splay.map_or(Duration::ZERO, |d| d.0),
            name,
            paths,
            check: check.map(|(_, argv)| argv),
            check_timeout,
            recheck,
            action,
            debounce: self.debounce.map_or(Duration::from_millis(100), |d| d.0),
            publish,
            service: 0,
            optional: self.optional.unwrap_or(false),
            check_sockets: self.check_sockets.unwrap_or(false),
        })
    }
}

/// `{candidate}` names the copy a check runs on; a command that runs once
/// it is published reads the `publish` directory itself.
fn only_in_check(text: &str, argv: &Spanned<Argv>, label: &str, key: &str) -> Result<(), String> {
    if argv.get_ref().0.iter().any(|a| a.contains(CANDIDATE)) {
        return Err(at(
            text,
            argv.span(),
            &format!(
                "{label}: `{key}` names {CANDIDATE}, which exists only while `check` runs: \
                 name the `publish` directory, which holds the copy once it passed"
            ),
        ));
    }
    Ok(())
}

/// The ready and status files are not in a `publish` directory: tend
/// would find them there at its next start, among what it did not publish,
/// and refuse to start (a container restart would take the pod down).
fn readiness_outside_publish(config: &Config, spans: &Spans, text: &str) -> Result<(), String> {
    let files = [
        ("file", &config.readiness.file, &spans.file),
        (
            "status_file",
            &config.readiness.status_file,
            &spans.status_file,
        ),
    ];
    for (key, file, span) in files {
        let Some(file) = file else { continue };
        let Some(w) = config
            .watches
            .iter()
            .find(|w| w.publish.as_ref().is_some_and(|dir| file.starts_with(dir)))
        else {
            continue;
        };
        return Err(at(
            text,
            span.clone().unwrap_or_default(),
            &format!(
                "readiness.{key} {} is inside the `publish` directory of watch {:?}, which \
                 holds only what tend publishes there: put it elsewhere (e.g. /run/tend/{key})",
                file.display(),
                w.name
            ),
        ));
    }
    Ok(())
}

/// Each `publish` directory belongs to one watch and lies outside every
/// watched path (tend would take its own copies for changes), and no
/// watched path lies inside one.
fn publish_dirs(watches: &[Watch], spans: &Spans, text: &str) -> Result<(), String> {
    for (i, w) in watches.iter().enumerate() {
        let Some(dir) = &w.publish else { continue };
        let span = spans.watches[i].publish.clone().unwrap_or_default();
        for other in watches {
            if let Some(theirs) = &other.publish
                && other.name != w.name
                && (theirs.starts_with(dir) || dir.starts_with(theirs))
            {
                return Err(at(
                    text,
                    span,
                    &format!(
                        "watch {:?}: `publish` {} overlaps the `publish` of watch {:?}: give each \
                         watch its own directory",
                        w.name,
                        dir.display(),
                        other.name
                    ),
                ));
            }
            if let Some(p) = other
                .paths
                .iter()
                .find(|p| p.starts_with(dir) || dir.starts_with(p))
            {
                return Err(at(
                    text,
                    span,
                    &format!(
                        "watch {:?}: `publish` {} overlaps the watched path {}: tend would take \
                         its own copies for changes; publish outside the watched paths (an \
                         emptyDir such as /run/tend/NAME)",
                        w.name,
                        dir.display(),
                        p.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A duration where zero makes no sense: its value or default, or `why`.
fn not_zero(
    text: &str,
    value: Option<Spanned<Dur>>,
    default: Duration,
    why: &str,
) -> Result<Duration, String> {
    match value {
        None => Ok(default),
        Some(d) if d.get_ref().0.is_zero() => Err(at(text, d.span(), why)),
        Some(d) => Ok(d.into_inner().0),
    }
}

// ------------------------------------------------------------ value types

/// A duration written as a string with a unit.
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = StringOnly::deserialize(d, "a duration such as \"500ms\", \"10s\" or \"2m\"")?;
        parse_duration(&s).map(Dur).map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for SignalName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = StringOnly::deserialize(d, "a signal name such as \"SIGHUP\"")?;
        s.parse().map_err(de::Error::custom)
    }
}

/// A command as an argv list: never empty, never run through a shell.
struct Argv(Vec<String>);

impl<'de> Deserialize<'de> for Argv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Vec<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a command as a list of strings, like [\"nginx\", \"-t\"]")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
                let mut argv = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    argv.push(arg);
                }
                Ok(argv)
            }
            // The shape a shell user writes first.
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<String>, E> {
                Err(E::custom(format!(
                    "a command is a list of strings, not one string: tend runs it without a \
                     shell, so give the program and each argument as its own string: {}",
                    suggest_argv(v)
                )))
            }
        }
        let argv = d.deserialize_any(V)?;
        match argv.first() {
            None => Err(de::Error::custom(
                "the command is empty: give the program and its arguments, like [\"nginx\", \"-t\"]",
            )),
            Some(p) if p.is_empty() => {
                Err(de::Error::custom("the command's program name is empty"))
            }
            _ if argv.iter().any(|a| a.contains('\0')) => {
                Err(de::Error::custom("a command argument contains a NUL byte"))
            }
            _ => Ok(Argv(argv)),
        }
    }
}

/// How to write the command `line` (as a shell would read it) as an argv
/// list: the words, and `sh -c` when it uses what only a shell does.
pub(crate) fn suggest_argv(line: &str) -> String {
    const SHELL_ONLY: [char; 11] = ['$', '`', '|', '&', '<', '>', '(', ')', '*', '?', '~'];
    let sh = || quote_list(&["sh".to_string(), "-c".to_string(), line.to_string()]);
    match shlex::split(line) {
        Some(words) if !words.is_empty() && !line.contains(SHELL_ONLY) => {
            let words = quote_list(&words);
            // `;` ends a command unless it is quoted ('daemon off;').
            if line.contains(';') {
                format!("{words}, or, for the shell to read it, {}", sh())
            } else {
                words
            }
        }
        _ => sh(),
    }
}

/// An environment value: a string without NUL bytes.
struct EnvValue(String);

impl<'de> Deserialize<'de> for EnvValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = StringOnly::deserialize(d, "a string (quote numbers: PORT = \"8080\")")?;
        if s.contains('\0') {
            return Err(de::Error::custom("an env value contains a NUL byte"));
        }
        Ok(EnvValue(s))
    }
}

/// Deserializes a string, with an error that says what the string should hold.
struct StringOnly;

impl StringOnly {
    fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
        what: &'static str,
    ) -> Result<String, D::Error> {
        struct V(&'static str);
        impl de::Visitor<'_> for V {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
                Ok(v.to_string())
            }
        }
        d.deserialize_str(V(what))
    }
}

// ------------------------------------------------------------ error text

/// The TOML error as the parser states it (it names line and column and
/// shows the line), plus the fix when the mistake is a known one: an unknown
/// key close to a known one, or that belongs in another table; `[watch]`
/// for `[[watch]]`; one string where a list is needed.
fn explain_toml_error(e: &toml::de::Error, text: &str) -> String {
    let mut out = e.to_string().trim_end().to_string();
    let hint = unknown_key_hint(e.message()).or_else(|| {
        e.span()
            .and_then(|span| shape_hint(e.message(), text, span))
    });
    if let Some(hint) = hint {
        out.push_str("\nhelp: ");
        out.push_str(&hint);
    }
    out
}

/// Every table's keys, to say where a key unknown in one belongs. A test
/// holds them to what the parser accepts.
const TABLE_KEYS: [(&str, &[&str]); 5] = [
    (
        "[service]",
        &[
            "name",
            "after",
            "oneshot",
            "main",
            "required",
            "output",
            "reload_notify",
            "user",
            "command",
            "working_dir",
            "env",
            "env_from",
            "stop_signal",
            "stop_timeout",
            "restart",
            "process_group",
            "notify",
            "ready_check",
            "ready_timeout",
            "restart_mode",
        ],
    ),
    ("[readiness]", &["file", "status_file", "invalid_config"]),
    (
        "[[watch]]",
        &[
            "service",
            "optional",
            "check_sockets",
            "name",
            "paths",
            "check",
            "check_timeout",
            "recheck",
            "on_change",
            "signal",
            "exec",
            "http",
            "debounce",
            "publish",
            "verify",
            "verify_timeout",
            "splay",
        ],
    ),
    (
        "[[socket]]",
        &["service", "name", "listen", "backlog", "mode"],
    ),
    ("[http]", &["listen"]),
];

/// serde states an unknown key as "unknown field `x`, expected one of `a`, `b`".
fn unknown_key_hint(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, expected) = rest.split_once('`')?;
    let expected: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let best = expected
        .iter()
        .map(|candidate| (edit_distance(key, candidate), *candidate))
        .min()?;
    let limit = if key.len() <= 4 { 1 } else { 2 };
    let close = if best.0 <= limit {
        Some(best.1)
    } else {
        // `watches` for `watch`, `services` for `service`.
        expected
            .iter()
            .find(|c| key.starts_with(**c) || c.starts_with(key))
            .copied()
    };
    if let Some(close) = close {
        return Some(format!("did you mean `{close}`?"));
    }
    belongs_elsewhere(key, &expected)
}

/// Where `key`, unknown in the table whose keys are `expected`, belongs.
fn belongs_elsewhere(key: &str, expected: &[&str]) -> Option<String> {
    let here = TABLE_KEYS.iter().find(|(_, keys)| {
        keys.len() == expected.len() && keys.iter().all(|k| expected.contains(k))
    });
    let homes: Vec<&str> = TABLE_KEYS
        .iter()
        .filter(|(_, keys)| keys.contains(&key))
        .map(|(table, _)| *table)
        .collect();
    if homes.is_empty() {
        return None;
    }
    let mut hint = match here {
        Some((table, _)) => format!(
            "`{key}` is not a key of {table}: it belongs in {}",
            homes.join(" or ")
        ),
        None => format!("`{key}` belongs in {}", homes.join(" or ")),
    };
    if here.is_some_and(|(table, _)| *table == "[[watch]]")
        && matches!(key, "stop_timeout" | "stop_signal")
    {
        hint.push_str(
            " (a restart on a change stops the service with the service's stop_signal and \
             stop_timeout)",
        );
    }
    Some(hint)
}

/// The fix for a value or table of the wrong shape, from what the parser
/// pointed at (`span` of `text`): `[watch]` for `[[watch]]`, `[[http]]`
/// for `[http]`, one string where a list of them is needed.
fn shape_hint(message: &str, text: &str, span: Range<usize>) -> Option<String> {
    let pointed = text.get(span.clone())?.trim();
    if let Some(name) = pointed
        .strip_prefix("[[")
        .and_then(|p| p.strip_suffix("]]"))
        .map(str::trim)
    {
        return matches!(name, "readiness" | "http").then(|| {
            format!("[[{name}]] makes a list of tables, and there is one [{name}]: write [{name}]")
        });
    }
    if let Some(name) = pointed
        .strip_prefix('[')
        .and_then(|p| p.strip_suffix(']'))
        .map(str::trim)
    {
        let plural = match name {
            "watch" => "watches",
            "socket" => "sockets",
            _ => return None,
        };
        return Some(format!(
            "[{name}] is a single table, but {plural} are a list of tables: write [[{name}]] \
             (double brackets) before the keys of each"
        ));
    }
    if message.starts_with("invalid type: string") && message.ends_with("expected a sequence") {
        let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
        let key = text[line_start..span.start].split('=').next()?.trim();
        if !key.is_empty() {
            return Some(format!("`{key}` is a list: {key} = [{pointed}]"));
        }
    }
    None
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// "line L, column C: message", for rules checked after parsing.
fn at(text: &str, span: Range<usize>, message: &str) -> String {
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

/// `s` as a TOML basic string (double quotes), escaped as TOML requires:
/// a JSON string is not always one (TOML takes no raw DEL).
fn quote(s: &str) -> String {
    use toml_writer::ToTomlValue as _;
    toml_writer::TomlStringBuilder::new(s)
        .as_basic()
        .to_toml_value()
}

fn quote_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[{}]", inner.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err()
    }

    const FAT: &str = r#"
[[service]]
name = "migrate"
command = ["app", "migrate"]
oneshot = true

[[service]]
name = "php"
command = ["php-fpm8.2", "-F"]
notify = true
user = "www-data"
after = ["migrate"]

[[service]]
name = "web"
command = ["nginx", "-g", "daemon off;"]
after = ["php"]
main = true

[[socket]]
name = "http"
service = "web"
listen = "127.0.0.1:8080"

[[watch]]
service = "php"
name = "pool"
paths = ["/etc/php"]
on_change = "signal"
signal = "SIGUSR2"

[[watch]]
name = "site"
paths = ["/etc/nginx"]
on_change = "signal"
"#;

    #[test]
    fn several_services_with_their_order_main_sockets_and_watches() {
        let c = Config::parse(FAT).unwrap();
        let names: Vec<_> = c.services.iter().map(|s| s.name.clone().unwrap()).collect();
        assert_eq!(names, ["migrate", "php", "web"]);
        assert_eq!(c.main, 2);
        assert_eq!(c.services[1].after, [0]);
        assert_eq!(c.services[2].after, [1]);
        assert!(c.services[0].oneshot && c.services[0].required);
        assert_eq!(c.services[1].user, Some(User::Name("www-data".into())));
        assert_eq!(
            c.services[1].output,
            Output::Prefix,
            "the default with several"
        );
        assert_eq!(c.sockets[0].service, 2);
        assert_eq!(
            (c.watches[0].service, c.watches[1].service),
            (1, 2),
            "main by default"
        );
        // What check-config prints is a config that means the same.
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
    }

    #[test]
    fn one_service_keeps_its_output_and_is_named_after_its_program() {
        let c =
            Config::parse("[service]\ncommand = [\"/usr/sbin/nginx\", \"-g\", \"daemon off;\"]\n")
                .unwrap();
        assert_eq!(c.service().output, Output::Inherit);
        assert_eq!(c.service_name(0, None), "nginx");
        assert_eq!(c.service_name(0, Some(&["/bin/app".into()])), "app");
        let one = Config::parse("[[service]]\ncommand = [\"x\"]\n").unwrap();
        assert_eq!(one.services.len(), 1, "one [[service]] is one service");
    }

    #[test]
    fn mistakes_with_several_services_name_the_line_and_the_fix() {
        let two = |a: &str, b: &str| {
            format!("[[service]]\ncommand = [\"a\"]\n{a}\n[[service]]\ncommand = [\"b\"]\n{b}\n")
        };
        let e = err(&two("name = \"a\"", ""));
        assert!(e.contains("the second [[service]] has no `name`"), "{e}");
        let e = err(&two("name = \"a\"", "name = \"a\""));
        assert!(
            e.starts_with("line 6") && e.contains("two services are named \"a\""),
            "{e}"
        );
        let e = err(&two("name = \"a b\"", "name = \"b\""));
        assert!(e.contains("use letters, digits"), "{e}");
        let e = err(&two("name = \"a\"\nafter = [\"c\"]", "name = \"b\""));
        assert!(
            e.starts_with("line 4")
                && e.contains("\"c\", which is no service here (services: a, b)"),
            "{e}"
        );
        let e = err(&two(
            "name = \"a\"\nafter = [\"b\"]",
            "name = \"b\"\nafter = [\"a\"]",
        ));
        assert!(
            e.contains("make a cycle") && e.contains("a -> b -> a"),
            "{e}"
        );
        let e = err(&two("name = \"a\"\nafter = [\"a\"]", "name = \"b\""));
        assert!(e.contains("`after` itself"), "{e}");
        let e = err(&two(
            "name = \"a\"\nmain = true",
            "name = \"b\"\nmain = true",
        ));
        assert!(
            e.starts_with("line 8") && e.contains("two services say main = true (a is the first)"),
            "{e}"
        );
        let e = err(&two(
            "name = \"a\"\noneshot = true",
            "name = \"b\"\noneshot = true",
        ));
        assert!(e.contains("every service is a oneshot"), "{e}");
        let e = err(
            "[[service]]\nname = \"a\"\n[[service]]\nname = \"b\"\ncommand = [\"b\"]\nmain = true\n",
        );
        assert!(e.contains("service \"a\" has no `command`"), "{e}");
        let e = err(&format!(
            "{}[[watch]]\nservice = \"c\"\npaths = [\"/x\"]\non_change = \"none\"\n",
            two("name = \"a\"", "name = \"b\"")
        ));
        assert!(
            e.starts_with("line 8") && e.contains("`service` names \"c\""),
            "{e}"
        );
        let e = err(&format!(
            "{}[[socket]]\nname = \"s\"\nservice = \"b\"\nlisten = \"127.0.0.1:1\"\n",
            two("name = \"a\"", "name = \"b\"\noneshot = true")
        ));
        assert!(e.contains("belongs to service \"b\", a oneshot"), "{e}");
        let e = err(&two(
            "name = \"a\"",
            "name = \"b\"\noneshot = true\nnotify = true",
        ));
        assert!(e.contains("`notify` on a oneshot"), "{e}");
        let e = err(&two(
            "name = \"a\"",
            "name = \"b\"\noneshot = true\nrestart = \"always\"",
        ));
        assert!(e.contains("would run again after it succeeded"), "{e}");
        let e = err("[service]\nreload_notify = true\n");
        assert!(e.contains("`reload_notify` needs notify = true"), "{e}");
    }

    #[test]
    fn a_stop_takes_at_most_the_longest_chain_of_stop_timeouts_then_the_leftovers() {
        let c = Config::parse(
            "[[service]]\nname = \"db\"\ncommand = [\"db\"]\nstop_timeout = \"20s\"\n\
             [[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"db\"]\nstop_timeout = \"5s\"\nmain = true\n\
             [[service]]\nname = \"logs\"\ncommand = [\"logs\"]\nstop_timeout = \"30s\"\n",
        )
        .unwrap();
        // app (5s), then db (20s) is 25s; logs (30s) stops alongside.
        assert_eq!(c.stop_bound(), (Duration::from_secs(30 + 5 + 2), vec![2]));
        let c = Config::parse(
            "[[service]]\nname = \"db\"\ncommand = [\"db\"]\nstop_timeout = \"20s\"\n\
             [[service]]\nname = \"app\"\ncommand = [\"app\"]\nafter = [\"db\"]\nstop_timeout = \"15s\"\n",
        )
        .unwrap();
        assert_eq!(
            c.stop_bound(),
            (Duration::from_secs(15 + 20 + 20 + 2), vec![1, 0]),
            "db is main"
        );
        let one = Config::parse("").unwrap();
        assert_eq!(
            one.stop_bound().0,
            Duration::from_secs(22),
            "2 x stop_timeout + 2s"
        );
    }

    #[test]
    fn a_user_is_a_name_or_numeric_ids() {
        let user = |u: &str| {
            Config::parse(&format!("[service]\nuser = \"{u}\"\n"))
                .map(|c| c.service().user.clone().unwrap())
        };
        assert_eq!(user("www-data").unwrap(), User::Name("www-data".into()));
        assert_eq!(user("101:102").unwrap(), User::Ids { uid: 101, gid: 102 });
        assert!(
            user("101:")
                .unwrap_err()
                .contains("neither a user name nor numeric")
        );
        assert!(user("-x").unwrap_err().contains("is not a user name"));
        assert!(user("").unwrap_err().contains("is not a user name"));
    }

    #[test]
    fn an_empty_file_means_all_defaults() {
        let c = Config::parse("").unwrap();
        assert_eq!(c.service(), &Service::default());
        assert!(c.watches.is_empty());
        assert_eq!(c.service().stop_timeout, Duration::from_secs(10));
        assert_eq!(c.service().restart, Restart::Never);
    }

    #[test]
    fn the_contract_example_parses() {
        let c = Config::parse(
            r#"
[service]
command = ["nginx", "-g", "daemon off;"]
working_dir = "/srv"
env = { LOG_LEVEL = "info" }
stop_signal = "SIGQUIT"
stop_timeout = "10s"
restart = "on-failure"
process_group = true

[readiness]
file = "/run/tend/ready"
status_file = "/run/tend/status.json"

[[watch]]
name = "nginx"
paths = ["/etc/nginx/conf.d"]
check = ["nginx", "-t"]
check_timeout = "10s"
on_change = "signal"
signal = "HUP"
debounce = "100ms"

[[watch]]
paths = ["/etc/app/secret"]
on_change = "exec"
exec = ["nginx", "-s", "reload"]
"#,
        )
        .unwrap();
        assert_eq!(c.service().command.as_deref().unwrap()[0], "nginx");
        assert_eq!(c.service().stop_signal, Signal::SIGQUIT);
        assert_eq!(c.service().restart, Restart::OnFailure);
        assert!(c.service().process_group);
        assert_eq!(c.service().env["LOG_LEVEL"], "info");
        assert_eq!(
            c.readiness.file.as_deref(),
            Some(Path::new("/run/tend/ready"))
        );
        assert_eq!(c.watches[0].action, Action::Signal(Signal::SIGHUP));
        assert_eq!(c.watches[1].name, "/etc/app/secret");
        assert_eq!(
            c.watches[1].action,
            Action::Exec(vec!["nginx".into(), "-s".into(), "reload".into()])
        );
        assert_eq!(c.watches[1].debounce, Duration::from_millis(100));
    }

    #[test]
    fn describe_round_trips() {
        let text = r#"
[service]
command = ["a b", "\"quoted\""]
env = { "WEIRD KEY" = "x" }
stop_timeout = "1500ms"
[readiness]
file = "/r"
[[watch]]
name = "w"
paths = ["/p"]
check = ["true"]
on_change = "signal"
signal = "USR1"
debounce = "2m"
"#;
        let c = Config::parse(text).unwrap();
        let again = Config::parse(&c.describe()).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn describe_escapes_what_toml_takes_only_escaped() {
        // DEL and the other control characters are valid in a value but not
        // raw in a TOML string.
        let text = r#"
[service]
command = ["a\u007fb", "x\u001b\t\n"]
env = { "K\u007f" = "v\u007f\"\\" }
"#;
        let c = Config::parse(text).unwrap();
        let described = c.describe();
        assert!(!described.contains('\u{7f}'), "{described}");
        assert_eq!(Config::parse(&described).unwrap(), c);
    }

    #[test]
    fn env_from_is_a_list_of_paths() {
        let c = Config::parse("[service]\nenv_from = [\"/etc/app/env\", \"secrets\"]\n").unwrap();
        assert_eq!(
            c.service().env_from,
            [PathBuf::from("/etc/app/env"), PathBuf::from("secrets")]
        );
        assert!(
            c.describe()
                .contains("\nenv_from = [\"/etc/app/env\", \"secrets\"]\n")
        );
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        assert!(Config::parse("").unwrap().service().env_from.is_empty());
        assert!(!Config::parse("").unwrap().describe().contains("env_from"));
        let e = err("[service]\nenv_from = [\"/a\", \"\"]\n");
        assert!(e.contains("line 2") && e.contains("empty path"), "{e}");
        let e = err("[service]\nenv_from = \"/etc/app/env\"\n");
        assert!(e.contains("line 2") && e.contains("sequence"), "{e}");
    }

    #[test]
    fn a_syntax_error_names_line_and_column() {
        let e = err("[service]\ncommand = [\"true\"]\nstop_timeout = 10s\n");
        assert!(e.contains("line 3"), "{e}");
    }

    #[test]
    fn an_unknown_key_is_named_with_a_suggestion() {
        let e = err("[service]\ncommand = [\"true\"]\nrestrat = \"always\"\n");
        assert!(e.contains("restrat"), "{e}");
        assert!(e.contains("did you mean `restart`"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let e = err("[[watches]]\npaths = [\"/x\"]\n");
        assert!(e.contains("did you mean `watch`"), "{e}");
    }

    #[test]
    fn a_key_of_another_table_says_where_it_belongs() {
        let watch = "[[watch]]\npaths = [\"/x\"]\non_change = \"restart\"\n";
        let e = err(&format!("{watch}stop_timeout = \"20s\"\n"));
        assert!(e.contains("TOML parse error at line 4, column 1"), "{e}");
        assert!(
            e.ends_with(
                "\nhelp: `stop_timeout` is not a key of [[watch]]: it belongs in [service] (a \
                 restart on a change stops the service with the service's stop_signal and \
                 stop_timeout)"
            ),
            "{e}"
        );
        let e = err("stop_timeout = \"20s\"\n[service]\ncommand = [\"x\"]\n");
        assert!(
            e.ends_with("\nhelp: `stop_timeout` belongs in [service]"),
            "{e}"
        );
        let e = err("[service]\ncheck_timeout = \"5s\"\n");
        assert!(
            e.ends_with(
                "\nhelp: `check_timeout` is not a key of [service]: it belongs in [[watch]]"
            ),
            "{e}"
        );
        let e = err("[readiness]\nlisten = \"0.0.0.0:9533\"\n");
        assert!(e.ends_with("it belongs in [[socket]] or [http]"), "{e}");
        // A close match is the likelier fix.
        let e = err(&format!("{watch}chek = [\"true\"]\n"));
        assert!(e.ends_with("\nhelp: did you mean `check`?"), "{e}");
        assert!(!err("[service]\nbogus = 1\n").contains("help:"));
    }

    #[test]
    fn the_table_keys_are_the_keys_each_table_takes() {
        for (table, keys) in TABLE_KEYS {
            let e = err(&format!("{table}\ntend_no_such_key = 1\n"));
            let expected = e
                .split(", expected ")
                .nth(1)
                .unwrap()
                .lines()
                .next()
                .unwrap();
            let mut parsed: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
            let mut listed = keys.to_vec();
            parsed.sort_unstable();
            listed.sort_unstable();
            assert_eq!(parsed, listed, "{table}: {e}");
        }
    }

    #[test]
    fn a_table_written_with_the_wrong_brackets_gets_the_right_ones() {
        let e = err("[watch]\npaths = [\"/x\"]\non_change = \"none\"\n");
        assert!(e.contains("line 1, column 1"), "{e}");
        assert!(
            e.ends_with(
                "\nhelp: [watch] is a single table, but watches are a list of tables: write \
                 [[watch]] (double brackets) before the keys of each"
            ),
            "{e}"
        );
        let e = err(
            "[service]\ncommand = [\"x\"]\n\n[socket]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\n",
        );
        assert!(
            e.contains("line 4") && e.contains("write [[socket]]"),
            "{e}"
        );
        for table in ["readiness", "http"] {
            let e = err(&format!("[[{table}]]\nfile = \"/x\"\n"));
            assert!(
                e.ends_with(&format!(
                    "\nhelp: [[{table}]] makes a list of tables, and there is one [{table}]: \
                     write [{table}]"
                )),
                "{e}"
            );
        }
        Config::parse("[service]\ncommand = [\"x\"]\n").unwrap();
        Config::parse("[[service]]\ncommand = [\"x\"]\n").unwrap();
    }

    #[test]
    fn a_command_written_as_one_string_shows_the_list() {
        let e = err("[service]\ncommand = \"nginx -g 'daemon off;'\"\n");
        assert!(e.contains("line 2, column 11"), "{e}");
        assert!(
            e.contains(
                "a command is a list of strings, not one string: tend runs it without a shell, \
                 so give the program and each argument as its own string: [\"nginx\", \"-g\", \
                 \"daemon off;\"], or, for the shell to read it, [\"sh\", \"-c\", \"nginx -g \
                 'daemon off;'\"]"
            ),
            "{e}"
        );
        let w = "[[watch]]\npaths = [\"/x\"]\n";
        for (text, line, fix) in [
            (
                format!("{w}check = \"nginx -t\"\non_change = \"none\"\n"),
                "line 3",
                "[\"nginx\", \"-t\"]",
            ),
            (
                format!("{w}on_change = \"exec\"\nexec = \"kill -HUP $(cat /run/app.pid)\"\n"),
                "line 4",
                "[\"sh\", \"-c\", \"kill -HUP $(cat /run/app.pid)\"]",
            ),
            (
                format!("{w}on_change = \"none\"\nverify = \"curl -fs 'http://127.0.0.1/a b'\"\n"),
                "line 4",
                "[\"curl\", \"-fs\", \"http://127.0.0.1/a b\"]",
            ),
            (
                "[service]\nready_check = \"pg_isready\"\n".to_string(),
                "line 2",
                "[\"pg_isready\"]",
            ),
        ] {
            let e = err(&text);
            assert!(e.contains(line) && e.contains(fix), "{text}: {e}");
        }
        // Any other type says what a command is.
        let e = err("[service]\ncommand = 3\n");
        assert!(e.contains("a command as a list of strings, like"), "{e}");
        let e = err("[service]\ncommand = [\"a\", 3]\n");
        assert!(e.contains("expected a string"), "{e}");
    }

    #[test]
    fn one_path_where_a_list_is_needed_shows_the_list() {
        let e = err("[[watch]]\npaths = \"/etc/app\"\non_change = \"none\"\n");
        assert!(
            e.contains("line 2, column 9")
                && e.ends_with("\nhelp: `paths` is a list: paths = [\"/etc/app\"]"),
            "{e}"
        );
        let e = err("[service]\nenv_from = '/etc/env'\n");
        assert!(
            e.ends_with("\nhelp: `env_from` is a list: env_from = ['/etc/env']"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_are_errors_with_the_line() {
        let e = err("[service]\nprocess_group = \"yes\"\n");
        assert!(e.contains("line 2") && e.contains("bool"), "{e}");
        let e = err("[service]\nenv = { PORT = 8080 }\n");
        assert!(e.contains("line 2") && e.contains("quote numbers"), "{e}");
        let e = err("[service]\nstop_timeout = 10\n");
        assert!(e.contains("line 2") && e.contains("duration"), "{e}");
    }

    #[test]
    fn bad_values_are_errors_that_name_them() {
        let e = err("[service]\nstop_timeout = \"soon\"\n");
        assert!(e.contains("\"soon\"") && e.contains("line 2"), "{e}");
        let e = err("[service]\nstop_signal = \"SIGBOGUS\"\n");
        assert!(e.contains("SIGBOGUS") && e.contains("line 2"), "{e}");
        let e = err("[service]\ncommand = []\n");
        assert!(e.contains("empty") && e.contains("line 2"), "{e}");
        let e = err("[service]\nrestart = \"sometimes\"\n");
        assert!(e.contains("sometimes") && e.contains("on-failure"), "{e}");
    }

    #[test]
    fn publish_is_a_directory_of_its_own_outside_every_watched_path() {
        let w = "[[watch]]\npaths = [\"/etc/app\"]\non_change = \"restart\"\n";
        let c = Config::parse(&format!(
            "{w}publish = \"/run/tend/app\"\ncheck = [\"app\", \"-t\", \"{{candidate}}/app.conf\"]\n"
        ))
        .unwrap();
        assert_eq!(c.watches[0].publish, Some(PathBuf::from("/run/tend/app")));
        assert!(c.describe().contains("\npublish = \"/run/tend/app\"\n"));
        assert_eq!(Config::parse(w).unwrap().watches[0].publish, None);
        let e = err(&format!("{w}publish = \"\"\n"));
        assert!(
            e.starts_with("line 4") && e.contains("`publish` is empty"),
            "{e}"
        );
        for inside in ["/etc/app/copy", "/etc", "/etc/app"] {
            let e = err(&format!("{w}publish = \"{inside}\"\n"));
            assert!(
                e.starts_with("line 4") && e.contains("overlaps the watched path /etc/app"),
                "{inside}: {e}"
            );
        }
        let two = format!(
            "{w}name = \"a\"\npublish = \"/run/tend\"\n{w}name = \"b\"\npublish = \"/run/tend/b\"\n"
        );
        let e = err(&two);
        assert!(e.contains("overlaps the `publish` of watch \"b\""), "{e}");
        let e = err(&format!(
            "{w}check = [\"app\", \"{{candidate}}/app.conf\"]\n"
        ));
        assert!(
            e.starts_with("line 4") && e.contains("{candidate}, which exists only with `publish`"),
            "{e}"
        );
        let w = "[[watch]]\npaths = [\"/etc/app\"]\npublish = \"/run/tend/app\"\non_change = \"exec\"\n";
        for (key, rest) in [
            (
                "exec",
                "exec = [\"app\", \"--reload\", \"{candidate}/app.conf\"]\n",
            ),
            (
                "verify",
                "exec = [\"true\"]\nverify = [\"test\", \"-s\", \"{candidate}/app.conf\"]\n",
            ),
        ] {
            let e = err(&format!("{w}{rest}"));
            let line = if key == "exec" { "line 5" } else { "line 6" };
            assert!(
                e.starts_with(line)
                    && e.contains(&format!(
                        "`{key}` names {{candidate}}, which exists only while"
                    )),
                "{key}: {e}"
            );
        }
    }

    #[test]
    fn the_ready_and_status_files_are_outside_every_publish_directory() {
        let w = "[[watch]]\nname = \"app\"\npaths = [\"/etc/app\"]\npublish = \"/run/tend\"\non_change = \"restart\"\n";
        for (readiness, key) in [
            ("file = \"/run/tend/ready\"\n", "file"),
            (
                "file = \"/run/ready\"\nstatus_file = \"/run/tend/status.json\"\n",
                "status_file",
            ),
        ] {
            let e = err(&format!("[readiness]\n{readiness}{w}"));
            assert!(
                e.contains(&format!("readiness.{key} /run/tend/"))
                    && e.contains("inside the `publish` directory of watch \"app\""),
                "{e}"
            );
            assert!(
                e.starts_with(if key == "file" { "line 2" } else { "line 3" }),
                "{e}"
            );
        }
        Config::parse(&format!(
            "[readiness]\nfile = \"/run/tend-ready\"\nstatus_file = \"/run/status.json\"\n{w}"
        ))
        .unwrap();
    }

    #[test]
    fn verify_and_splay_are_per_watch() {
        let w = "[[watch]]\npaths = [\"/x\"]\non_change = \"signal\"\n";
        let c = Config::parse(w).unwrap();
        assert_eq!(c.watches[0].verify, None);
        assert_eq!(c.watches[0].splay, Duration::ZERO);
        assert!(c.describe().contains("\nsplay = \"0s\"\n"));
        let c = Config::parse(&format!(
            "{w}verify = [\"curl\", \"-fs\", \"http://127.0.0.1/\"]\nverify_timeout = \"5s\"\nsplay = \"2m\"\n"
        ))
        .unwrap();
        assert_eq!(
            c.watches[0].verify.as_deref(),
            Some(&["curl".to_string(), "-fs".into(), "http://127.0.0.1/".into()][..])
        );
        assert_eq!(c.watches[0].verify_timeout, Duration::from_secs(5));
        assert_eq!(c.watches[0].splay, Duration::from_secs(120));
        let d = c.describe();
        assert!(
            d.contains("\nverify_timeout = \"5s\"\n") && d.contains("\nsplay = \"2m\"\n"),
            "{d}"
        );
        let c = Config::parse(&format!("{w}verify = [\"true\"]\n")).unwrap();
        assert_eq!(c.watches[0].verify_timeout, Duration::from_secs(30));
        let e = err(&format!("{w}verify_timeout = \"5s\"\n"));
        assert!(
            e.starts_with("line 4") && e.contains("only used with `verify`"),
            "{e}"
        );
        let e = err(&format!(
            "{w}verify = [\"true\"]\nverify_timeout = \"0s\"\n"
        ));
        assert!(
            e.starts_with("line 5") && e.contains("`verify_timeout` is 0"),
            "{e}"
        );
    }

    #[test]
    fn watch_rules_across_keys_name_the_line() {
        let e = err("[[watch]]\npaths = [\"/x\"]\n");
        assert!(e.contains("on_change") && e.contains("line 2"), "{e}");
        let e = err("[[watch]]\npaths = [\"/x\"]\non_change = \"exec\"\n");
        assert!(e.contains("needs `exec`") && e.contains("line 3"), "{e}");
        let e = err("[[watch]]\npaths = [\"/x\"]\non_change = \"restart\"\nsignal = \"HUP\"\n");
        assert!(e.contains("only used with") && e.contains("line 4"), "{e}");
        let e = err("[[watch]]\npaths = []\non_change = \"none\"\n");
        assert!(e.contains("empty") && e.contains("line 2"), "{e}");
        let e = err(
            "[[watch]]\npaths = [\"/x\"]\non_change = \"none\"\n[[watch]]\npaths = [\"/x\"]\non_change = \"none\"\n",
        );
        assert!(e.contains("two watches") && e.contains("line 5"), "{e}");
        let e = err(
            "[[watch]]\nname = \"a\"\npaths = [\"/x\"]\non_change = \"none\"\n\n[[watch]]\npaths = [\"/y\"]\nname = \"a\"\non_change = \"none\"\n",
        );
        assert!(e.contains("two watches") && e.contains("line 8"), "{e}");
        let e = err("[[watch]]\npaths = [\"/x\"]\non_change = \"reload\"\n");
        assert!(e.contains("reload") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn a_signal_watch_defaults_to_sighup() {
        let c = Config::parse("[[watch]]\npaths = [\"/x\"]\non_change = \"signal\"\n").unwrap();
        assert_eq!(c.watches[0].action, Action::Signal(Signal::SIGHUP));
        assert_eq!(c.watches[0].check_timeout, Duration::from_secs(10));
        assert_eq!(c.watches[0].recheck, Duration::from_secs(1));
        assert!(c.describe().contains("\nrecheck = \"1s\"\n"));
    }

    #[test]
    fn recheck_is_a_duration_per_watch() {
        let c = Config::parse(
            "[[watch]]\npaths = [\"/x\"]\non_change = \"none\"\nrecheck = \"250ms\"\n",
        )
        .unwrap();
        assert_eq!(c.watches[0].recheck, Duration::from_millis(250));
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        let e = err("[[watch]]\npaths = [\"/x\"]\non_change = \"none\"\nrecheck = \"soon\"\n");
        assert!(e.contains("line 4") && e.contains("\"soon\""), "{e}");
    }

    #[test]
    fn readiness_of_the_service_and_the_restart_mode() {
        let c = Config::parse("").unwrap();
        assert!(!c.service().notify);
        assert_eq!(c.service().ready_timeout, Duration::from_secs(30));
        assert_eq!(c.service().restart_mode, RestartMode::StopStart);
        let c = Config::parse(
            "[service]\nnotify = true\nready_timeout = \"5s\"\nrestart_mode = \"overlap\"\n",
        )
        .unwrap();
        assert!(c.service().notify);
        assert_eq!(c.service().ready_timeout, Duration::from_secs(5));
        assert_eq!(c.service().restart_mode, RestartMode::Overlap);
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        let c =
            Config::parse("[service]\nready_check = [\"curl\", \"-fs\", \"http://127.0.0.1/\"]\n")
                .unwrap();
        assert_eq!(c.service().ready_check.as_ref().unwrap()[0], "curl");
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        let e = err("[service]\nnotify = true\nready_check = [\"true\"]\n");
        assert!(
            e.contains("line 3") && e.contains("without `notify`"),
            "{e}"
        );
        let e = err("[service]\nrestart_mode = \"rolling\"\n");
        assert!(e.contains("overlap") && e.contains("line 2"), "{e}");
        let e = err("[service]\nready_timeout = \"0s\"\n");
        assert!(e.contains("line 2") && e.contains("ready_timeout"), "{e}");
    }

    #[test]
    fn an_http_action_names_an_endpoint_by_address() {
        let c = Config::parse(
            "[[watch]]\npaths = [\"/x\"]\non_change = \"http\"\nhttp = { url = \"http://127.0.0.1:9090/-/reload\" }\n",
        )
        .unwrap();
        assert_eq!(
            c.watches[0].action,
            Action::Http(HttpAction {
                url: "http://127.0.0.1:9090/-/reload".into(),
                method: "POST".into(),
                timeout: Duration::from_secs(5),
            })
        );
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        let w = "[[watch]]\npaths = [\"/x\"]\n";
        for (bad, says) in [
            ("on_change = \"http\"\n", "needs `http"),
            (
                "on_change = \"signal\"\nhttp = { url = \"http://127.0.0.1/\" }\n",
                "only used with",
            ),
            (
                "on_change = \"http\"\nhttp = { url = \"http://prometheus:9090/\" }\n",
                "not an IP address",
            ),
            (
                "on_change = \"http\"\nhttp = { url = \"http://127.0.0.1/\", method = \"post\" }\n",
                "method",
            ),
            (
                "on_change = \"http\"\nhttp = { url = \"http://127.0.0.1/\", timeout = \"0s\" }\n",
                "timeout is 0",
            ),
            (
                "on_change = \"http\"\nhttp = { url = \"http://127.0.0.1/\", headers = 1 }\n",
                "headers",
            ),
        ] {
            let e = err(&format!("{w}{bad}"));
            let line = if bad.contains("http = {") {
                "line 4"
            } else {
                "line 3"
            };
            assert!(e.contains(says) && e.contains(line), "{bad}: {e}");
        }
    }

    #[test]
    fn the_http_server_is_off_unless_it_has_an_address() {
        assert_eq!(Config::parse("").unwrap().http, None);
        assert!(!Config::parse("").unwrap().describe().contains("[http]"));
        for listen in ["0.0.0.0:9533", "[::]:9533", "127.0.0.1:0"] {
            let c = Config::parse(&format!("[http]\nlisten = {listen:?}\n")).unwrap();
            assert_eq!(c.http.as_ref().unwrap().listen, listen.parse().unwrap());
            assert!(
                c.describe()
                    .contains(&format!("\n[http]\nlisten = {listen:?}\n"))
            );
            assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        }
        for (bad, says) in [
            ("[http]\n", "line 1, column 1: [http] needs `listen`"),
            ("[http]\nlisten = \"9533\"\n", "line 2"),
            (
                "[http]\nlisten = \"localhost:9533\"\n",
                "does not resolve host names",
            ),
            ("[http]\nlisten = \"unix:/run/tend.sock\"\n", "TCP address"),
            ("[http]\nlisten = 9533\n", "line 2"),
            (
                "[http]\nlisten = \"0.0.0.0:9533\"\nport = 1\n",
                "unknown field",
            ),
            (
                "[[socket]]\nname = \"web\"\nlisten = \"0.0.0.0:8080\"\n[http]\nlisten = \"0.0.0.0:8080\"\n",
                "line 5, column 10: [http] listen 0.0.0.0:8080 is the address of [[socket]] \"web\"",
            ),
        ] {
            let e = err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn sockets_are_listed_in_order_and_checked() {
        let c = Config::parse(
            "[[socket]]\nname = \"http\"\nlisten = \"0.0.0.0:8080\"\nbacklog = 512\n\
             [[socket]]\nname = \"admin\"\nlisten = \"unix:/run/app/admin.sock\"\nmode = \"0660\"\n",
        )
        .unwrap();
        assert_eq!(c.sockets.len(), 2);
        assert_eq!(c.sockets[0].name, "http");
        assert_eq!(c.sockets[0].backlog, Some(512));
        assert_eq!(c.sockets[1].mode, Some(0o660));
        assert_eq!(Config::parse(&c.describe()).unwrap(), c);
        for (bad, says) in [
            ("listen = \"8080\"", "line 3"),
            ("listen = \"localhost:80\"", "line 3"),
            ("listen = \"unix:\"", "line 3"),
            ("listen = \"127.0.0.1:80\"\nmode = \"0660\"", "mode"),
            ("listen = \"unix:/x.sock\"\nmode = \"999\"", "line 4"),
            ("listen = \"127.0.0.1:80\"\nbacklog = 0", "line 4"),
        ] {
            let e = err(&format!("[[socket]]\nname = \"s\"\n{bad}\n"));
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = err("[[socket]]\nname = \"a:b\"\nlisten = \"127.0.0.1:80\"\n");
        assert!(e.contains("LISTEN_FDNAMES"), "{e}");
        let e = err(
            "[[socket]]\nname = \"s\"\nlisten = \"127.0.0.1:80\"\n[[socket]]\nname = \"s\"\nlisten = \"127.0.0.1:81\"\n",
        );
        assert!(e.contains("two sockets are named"), "{e}");
        let e = err("[[socket]]\nlisten = \"127.0.0.1:80\"\n");
        assert!(e.contains("name"), "{e}");
    }

    #[test]
    fn zero_is_an_error_where_it_makes_no_sense() {
        let e = err("[service]\nstop_timeout = \"0s\"\n");
        assert!(
            e.starts_with("line 2, column 16: `stop_timeout` is 0"),
            "{e}"
        );
        assert!(e.contains("stop_signal = \"SIGKILL\""), "{e}");
        let watch = "[[watch]]\nname = \"app\"\npaths = [\"/x\"]\non_change = \"none\"\n";
        let e = err(&format!("{watch}check_timeout = \"0ms\"\n"));
        assert!(
            e.starts_with("line 5, column 17: watch \"app\": `check_timeout` is 0"),
            "{e}"
        );
        let e = err(&format!("{watch}recheck = \"0s\"\n"));
        assert!(
            e.starts_with("line 5, column 11: watch \"app\": `recheck` is 0"),
            "{e}"
        );
        // Acting at once is a sensible debounce.
        let c = Config::parse(&format!("{watch}debounce = \"0s\"\n")).unwrap();
        assert_eq!(c.watches[0].debounce, Duration::ZERO);
    }
}
