//! Showing text that came from outside: a node's report, a command's
//! output, a queued job. One rule everywhere: control characters (ESC,
//! CR, NUL, …) and invalid UTF-8 are escaped, so a hostile string cannot
//! drive a terminal or forge a log line.

use std::fmt::Write as _;

/// `text` with every control character escaped (`\u{1b}`, `\r`, `\n`, …).
#[must_use]
pub fn escape(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// At most the first `max` bytes of `bytes`, escaped like [`escape`],
/// with invalid UTF-8 as `\xNN` and `…` when cut: what a log or a failed
/// record may show of a hostile payload.
#[must_use]
pub fn preview(bytes: &[u8], max: usize) -> String {
    let cut = &bytes[..bytes.len().min(max)];
    let mut out = String::new();
    for chunk in cut.utf8_chunks() {
        out.push_str(&escape(chunk.valid()));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if bytes.len() > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bad_bytes_are_escaped() {
        assert_eq!(escape("plain é"), "plain é");
        assert_eq!(escape("a\u{1b}[2Jb\r\n\0"), "a\\u{1b}[2Jb\\r\\n\\u{0}");
        assert_eq!(escape("\u{9b}31m"), "\\u{9b}31m", "C1 CSI");
        assert_eq!(preview(b"a\x1b[2J\xffb", 100), "a\\u{1b}[2J\\xffb");
        assert_eq!(preview(b"abcdef", 3), "abc…");
    }
}
