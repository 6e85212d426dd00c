//! Output of checks and reload commands, made fit to show to people.
//!
//! That output is whatever the command printed: colour codes, carriage
//! returns, cursor movements, bidi overrides. Shown raw in a terminal, a log
//! viewer or `kubectl describe`, it can hide or rewrite what is around it, so
//! every control character is shown as an escape instead (tabs are kept).
//! Invalid UTF-8 was already replaced when the output was read.

/// At most this many characters of a one-line summary, then `…`.
const SUMMARY_MAX: usize = 200;

/// How many of the last lines of a command's output go to the log.
const LOG_LINES: usize = 5;

/// Lines that name the problem, by the words checks use for one, case
/// insensitive. The first such line is the summary: a failed `nginx -t`
/// prints its `[emerg]` line first and "test failed" last.
const TELLING: &[&str] = &[
    "emerg",
    "alert",
    "crit",
    "fatal",
    "error",
    "invalid",
    "unknown",
    "not found",
    "no such",
    "denied",
    "cannot",
    "can't",
    "unable",
    "timed out",
];

/// `s` on one line: every control character escaped, line breaks too.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_escaped(&mut out, c, false);
    }
    out
}

/// `s` with its line breaks kept (CRLF as LF) and every other control
/// character escaped, for the status file's `check_output`.
pub fn escape_keeping_lines(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' && chars.peek() == Some(&'\n') {
            continue;
        }
        push_escaped(&mut out, c, true);
    }
    out
}

/// The one line of `output` that best says what went wrong, escaped and
/// bounded: the first line that names a problem, else the last non-empty one.
pub fn summary(output: &str) -> String {
    let mut lines = output.lines().map(str::trim).filter(|l| !l.is_empty());
    let telling = lines.clone().find(|l| {
        let lower = l.to_lowercase();
        TELLING.iter().any(|word| lower.contains(word))
    });
    let Some(line) = telling.or_else(|| lines.next_back()) else {
        return String::new();
    };
    bounded(&escape(line), SUMMARY_MAX)
}

/// What `for_log` puts before the lines, and what JSON logs split on to
/// give the output a field of its own.
pub const OUTPUT_MARKER: &str = "; output: ";
/// What `for_log` puts between the lines.
pub const OUTPUT_SEPARATOR: &str = " | ";

/// The last lines of a command's output for a log line, as
/// `; output: line | line`, or nothing when it printed nothing.
pub fn for_log(output: &str) -> String {
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<String> = lines[lines.len().saturating_sub(LOG_LINES)..]
        .iter()
        .map(|l| bounded(&escape(l), SUMMARY_MAX))
        .collect();
    format!("{OUTPUT_MARKER}{}", tail.join(OUTPUT_SEPARATOR))
}

fn push_escaped(out: &mut String, c: char, keep_lines: bool) {
    match c {
        '\n' if keep_lines => out.push('\n'),
        '\t' => out.push('\t'),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\0'..='\x1f' | '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
        // C1 controls (CSI is U+009B), bidi overrides and isolates, and the
        // Unicode line separators: each can reorder or hide what follows.
        '\u{80}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// At most `max` characters of `s`, ending in `…` when cut.
fn bounded(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real `nginx -t` output (nginx 1.22), with the error log open and
    // without (then nginx prefixes its own name instead of a timestamp).
    const NGINX_UNKNOWN_DIRECTIVE: &str = "nginx: [emerg] unknown directive \"lissen\" in /etc/nginx/conf.d/app.conf:2\n\
         nginx: configuration file /etc/nginx/nginx.conf test failed\n";
    const NGINX_NOT_TERMINATED: &str = "2026/11/22 04:25:53 [emerg] 16661#16661: directive \"listen\" is not terminated by \";\" in /etc/nginx/conf.d/app.conf:5\n\
         nginx: configuration file /etc/nginx/nginx.conf test failed\n";
    const NGINX_WARN_THEN_EMERG: &str = "nginx: [warn] conflicting server name \"a\" on 0.0.0.0:8080, ignored\n\
         nginx: [emerg] unknown directive \"lissen\" in /etc/nginx/conf.d/app.conf:4\n\
         nginx: configuration file /etc/nginx/nginx.conf test failed\n";
    const NGINX_UPSTREAM: &str = "2026/11/22 04:25:53 [emerg] 16663#16663: host not found in upstream \"app.invalid:8080\" in /etc/nginx/conf.d/app.conf:3\n\
         nginx: configuration file /etc/nginx/nginx.conf test failed\n";
    const NGINX_OK: &str = "nginx: the configuration file /etc/nginx/nginx.conf syntax is ok\n\
         nginx: configuration file /etc/nginx/nginx.conf test is successful\n";

    #[test]
    fn the_summary_of_a_failed_nginx_check_is_its_error_line() {
        assert_eq!(
            summary(NGINX_UNKNOWN_DIRECTIVE),
            "nginx: [emerg] unknown directive \"lissen\" in /etc/nginx/conf.d/app.conf:2"
        );
        assert_eq!(
            summary(NGINX_NOT_TERMINATED),
            "2026/11/22 04:25:53 [emerg] 16661#16661: directive \"listen\" is not terminated by \";\" in /etc/nginx/conf.d/app.conf:5"
        );
        assert!(
            summary(NGINX_WARN_THEN_EMERG).contains("[emerg] unknown directive"),
            "a warning before the error is not the summary"
        );
        assert!(summary(NGINX_UPSTREAM).contains("host not found in upstream"));
    }

    #[test]
    fn without_an_error_line_the_summary_is_the_last_line() {
        assert_eq!(
            summary(NGINX_OK),
            "nginx: configuration file /etc/nginx/nginx.conf test is successful"
        );
        assert_eq!(summary("config v2 rejected\n\n  \n"), "config v2 rejected");
        assert_eq!(summary(""), "");
        assert_eq!(summary("\n \n"), "");
    }

    #[test]
    fn the_summary_is_one_bounded_line() {
        let long = format!("error: {}\nsecond line\n", "x".repeat(1000));
        let s = summary(&long);
        assert_eq!(s.chars().count(), SUMMARY_MAX + 1);
        assert!(s.starts_with("error: xxx") && s.ends_with('…'), "{s}");
        let wide = "é".repeat(300);
        assert_eq!(summary(&wide).chars().count(), SUMMARY_MAX + 1);
        assert!(!summary("a\rb\x1b[2Kc").contains(['\r', '\x1b', '\n']));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape("\x1b[31mred\x1b[0m\r\n"),
            "\\x1b[31mred\\x1b[0m\\r\\n"
        );
        assert_eq!(escape("a\tb\0c\x7f"), "a\tb\\x00c\\x7f");
        assert_eq!(escape("\u{9b}2J"), "\\u{9b}2J", "C1 CSI");
        assert_eq!(escape("ok \u{202e}cod.exe"), "ok \\u{202e}cod.exe");
        assert_eq!(escape("plain ünïcode – text"), "plain ünïcode – text");
        assert_eq!(escape("lossy \u{fffd}"), "lossy \u{fffd}");
    }

    #[test]
    fn the_status_keeps_line_breaks_but_not_terminal_controls() {
        assert_eq!(
            escape_keeping_lines(NGINX_UNKNOWN_DIRECTIVE),
            NGINX_UNKNOWN_DIRECTIVE
        );
        assert_eq!(
            escape_keeping_lines("progress 10%\rprogress 100%\n\x1b]0;title\x07"),
            "progress 10%\\rprogress 100%\n\\x1b]0;title\\x07"
        );
        assert_eq!(escape_keeping_lines("dos\r\nlines\r\n"), "dos\nlines\n");
    }

    #[test]
    fn the_log_gets_the_last_lines_on_one_line() {
        assert_eq!(for_log(""), "");
        assert_eq!(for_log("\n  \n"), "");
        assert_eq!(
            for_log(NGINX_UNKNOWN_DIRECTIVE),
            "; output: nginx: [emerg] unknown directive \"lissen\" in /etc/nginx/conf.d/app.conf:2 \
             | nginx: configuration file /etc/nginx/nginx.conf test failed"
        );
        let many: String = (1..=8).map(|i| format!("line {i}\n")).collect();
        assert_eq!(
            for_log(&many),
            "; output: line 4 | line 5 | line 6 | line 7 | line 8"
        );
        assert!(!for_log("\x1b[2J\rgone").contains(['\x1b', '\r']));
    }
}
