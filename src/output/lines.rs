//! Line framing: where a line ends in what a service wrote, and what tend
//! writes for it. Pure functions, so every edge (a line cut at the bound, a
//! character cut in two, bytes that are not UTF-8) is a unit test.

use serde::Serialize;

use super::Stream;

/// The longest line written as one: a longer one is cut into lines of this
/// many bytes (each with the prefix), never dropped.
pub const MAX_LINE: usize = 16 * 1024;

/// How a service's lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `NAME | line`, the line's bytes as the service wrote them.
    Prefix,
    /// `{"service":NAME,"stream":"stdout","line":"..."}`; bytes that are
    /// not UTF-8 become U+FFFD.
    Json,
}

/// The next line at the start of `bytes`: its length without the newline,
/// and how many bytes it takes up. A line ends at a newline; one longer
/// than [`MAX_LINE`] is cut there (before a UTF-8 character that would be
/// cut in two); with `flush`, what is left is a line without a newline.
pub fn next_line(bytes: &[u8], flush: bool) -> Option<(usize, usize)> {
    let window = &bytes[..bytes.len().min(MAX_LINE + 1)];
    if let Some(at) = memchr::memchr(b'\n', window) {
        return Some((at, at + 1));
    }
    if bytes.len() > MAX_LINE {
        let cut = char_boundary(bytes, MAX_LINE);
        return Some((cut, cut));
    }
    (flush && !bytes.is_empty()).then_some((bytes.len(), bytes.len()))
}

/// `at`, or the start of the UTF-8 character that `at` falls inside (at
/// most 3 bytes before it).
fn char_boundary(bytes: &[u8], at: usize) -> usize {
    let continuation = |b: u8| b & 0xc0 == 0x80;
    if !continuation(bytes[at]) {
        return at;
    }
    let Some(lead) = (at.saturating_sub(3)..at)
        .rev()
        .find(|&i| !continuation(bytes[i]))
    else {
        return at;
    };
    let width = match bytes[lead] {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return at,
    };
    if lead > 0 && lead + width > at {
        lead
    } else {
        at
    }
}

/// Appends line `line` of service `name`'s `stream` to `out`, newline
/// included.
pub fn write(out: &mut Vec<u8>, format: Format, name: &str, stream: Stream, line: &[u8]) {
    match format {
        Format::Prefix => {
            out.reserve(name.len() + 3 + line.len() + 1);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b" | ");
            out.extend_from_slice(line);
        }
        Format::Json => {
            #[derive(Serialize)]
            struct Line<'a> {
                service: &'a str,
                stream: &'a str,
                line: std::borrow::Cow<'a, str>,
            }
            let line = Line {
                service: name,
                stream: stream.as_str(),
                line: String::from_utf8_lossy(line),
            };
            // Writing strings into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, &line);
        }
    }
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line `bytes` holds, as next_line cuts them.
    fn lines(mut bytes: &[u8], flush: bool) -> Vec<&[u8]> {
        let mut out = Vec::new();
        while let Some((len, used)) = next_line(bytes, flush) {
            out.push(&bytes[..len]);
            bytes = &bytes[used..];
        }
        out
    }

    #[test]
    fn lines_end_at_newlines_and_a_partial_one_waits_unless_flushed() {
        assert_eq!(lines(b"a\nbc\n\nd", false), [&b"a"[..], b"bc", b""]);
        assert_eq!(lines(b"a\nbc\n\nd", true), [&b"a"[..], b"bc", b"", b"d"]);
        assert_eq!(lines(b"", true), Vec::<&[u8]>::new());
        assert_eq!(
            lines(b"\r\n", false),
            [&b"\r"[..]],
            "bytes are kept as written"
        );
    }

    #[test]
    fn a_long_line_is_cut_into_lines_of_the_bound_and_none_is_lost() {
        let mut long = vec![b'x'; 3 * MAX_LINE + 5];
        long.push(b'\n');
        let cut = lines(&long, false);
        assert_eq!(
            cut.iter().map(|l| l.len()).collect::<Vec<_>>(),
            [MAX_LINE, MAX_LINE, MAX_LINE, 5]
        );
        // Exactly the bound, then its newline: one line.
        let mut exact = vec![b'y'; MAX_LINE];
        exact.push(b'\n');
        assert_eq!(lines(&exact, false).len(), 1);
        // Longer than the bound and no newline yet: the first part goes
        // out at once, the rest waits.
        assert_eq!(lines(&long[..MAX_LINE + 10], false).len(), 1);
    }

    #[test]
    fn a_cut_never_splits_a_utf8_character() {
        // "é" is 2 bytes: put one across the bound.
        let mut text = vec![b'a'; MAX_LINE - 1];
        text.extend_from_slice("é€".as_bytes());
        text.extend_from_slice(b"tail\n");
        let cut = lines(&text, false);
        assert_eq!(cut[0].len(), MAX_LINE - 1);
        assert!(std::str::from_utf8(cut[0]).is_ok());
        assert!(std::str::from_utf8(cut[1]).is_ok());
        assert_eq!(cut.concat(), text[..text.len() - 1]);
        // Not UTF-8 at the bound: cut at the bound.
        let mut bytes = vec![0x80u8; MAX_LINE + 2];
        bytes.push(b'\n');
        assert_eq!(lines(&bytes, false)[0].len(), MAX_LINE);
    }

    #[test]
    fn prefix_keeps_the_bytes_and_json_replaces_what_is_not_utf8() {
        let mut out = Vec::new();
        write(
            &mut out,
            Format::Prefix,
            "web",
            Stream::Stdout,
            b"GET /\xff \x1b[1m",
        );
        assert_eq!(out, b"web | GET /\xff \x1b[1m\n");
        out.clear();
        write(
            &mut out,
            Format::Json,
            "web",
            Stream::Stderr,
            b"a \"b\"\xff\x1b",
        );
        assert_eq!(out.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"service": "web", "stream": "stderr", "line": "a \"b\"\u{fffd}\u{1b}"})
        );
    }
}
