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

/// JSON text (as `serde_json` writes it) with every control character
/// left raw escaped as `\uXXXX`: `serde_json` escapes U+0000–U+001F but
/// writes DEL and the C1 controls (U+007F–U+009F, e.g. CSI U+009B) as
/// they are. Outside strings its output holds no control character but
/// the pretty printer's newlines, which are kept; inside a string
/// `\uXXXX` means the same character, so the JSON reads the same.
#[must_use]
pub fn json_text(json: &str) -> String {
    if !json.chars().any(|c| c.is_control() && c != '\n') {
        return json.to_owned();
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if c.is_control() && c != '\n' {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
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

    #[test]
    fn json_keeps_its_meaning_without_raw_controls() {
        let v = serde_json::json!({"a": "x\u{9b}31m\u{7f}\u{1b}[2J", "b": [1, 2]});
        let text = json_text(&serde_json::to_string_pretty(&v).unwrap());
        assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text}");
        assert!(text.contains("\\u009b31m\\u007f\\u001b[2J"), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
