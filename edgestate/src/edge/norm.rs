//! The one normalised form of request text every edge rule reads
//! (`docs/edge.md`, "The normalised path"): the canonical path, the name an
//! `ext` match reads, nginx's `$host`, and the text the WAF reads. The Lua
//! twin is `edge/lua/edge_norm.lua`; both run the vectors of
//! `testdata/edge/paths.jsonl` and `testdata/edge/waf.jsonl`.

/// Why a request path has no canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Does not start with `/` (nginx: 400).
    NotAbsolute,
    /// A raw control byte (below 0x20, or 0x7f) (nginx: 400).
    Control,
    /// `%` not followed by two hex digits (nginx: 400).
    BadEscape,
    /// `%00` (nginx: 400).
    Nul,
    /// Climbs above `/` with `..` once every escape is decoded (nginx: 400).
    AboveRoot,
    /// A raw `\`: browsers turn it into `/`, origins disagree (edge: 400).
    Backslash,
    /// A raw `#`: a fragment is never sent (edge: 400).
    Fragment,
    /// An encoded `/` or `\` (`%2F`, `%5C`, any case): nginx and origins
    /// decode it into a separator the rules never saw (edge: 400).
    EncodedSeparator,
    /// `..` above `/` counted on the canonical segments. Cannot happen
    /// once encoded separators are refused (the segments are nginx's
    /// then); kept so the walk fails closed (edge: 400).
    AboveRootEncoded,
    /// A segment that is empty, `.` or `..` once its `;` parameters are
    /// removed (`/;/admin`, `/.;/admin`, `/public/..;/admin`), other than
    /// a last empty one (`/shop/;jsessionid=1`): an origin that reads path
    /// parameters (Tomcat, Spring, Jetty) removes them and then resolves
    /// the segment, reaching a path the rules never matched (edge: 400).
    SegmentParams,
}

impl PathError {
    /// nginx answers 400 itself, before the edge's Lua runs.
    #[must_use]
    pub fn refused_by_nginx(self) -> bool {
        matches!(
            self,
            PathError::NotAbsolute
                | PathError::Control
                | PathError::BadEscape
                | PathError::Nul
                | PathError::AboveRoot
        )
    }

    /// The kind, as the vectors and the Lua name it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "not-absolute",
            PathError::Control => "control",
            PathError::BadEscape => "bad-escape",
            PathError::Nul => "nul",
            PathError::AboveRoot => "above-root",
            PathError::Backslash => "backslash",
            PathError::Fragment => "fragment",
            PathError::EncodedSeparator => "encoded-separator",
            PathError::AboveRootEncoded => "above-root-encoded",
            PathError::SegmentParams => "segment-params",
        }
    }

    /// In words, for explain.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "the path does not start with /",
            PathError::Control => "the path holds a control byte",
            PathError::BadEscape => "the path holds a % not followed by two hex digits",
            PathError::Nul => "the path holds %00",
            PathError::AboveRoot => "the path climbs above / with ..",
            PathError::Backslash => "the path holds a raw backslash",
            PathError::Fragment => "the path holds a raw #",
            PathError::EncodedSeparator => "the path holds an encoded / or \\ (%2F, %5C)",
            PathError::AboveRootEncoded => "the path climbs above / with .. (segments split at /)",
            PathError::SegmentParams => {
                "a path segment is empty, . or .. before its ;parameters (/;/x, /.;/x, /..;/x)"
            }
        }
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

/// What nginx refuses in a path before any Lua runs: a control byte, a
/// malformed escape, `%00`, or `..` above `/` once every escape (`%2F`
/// included) is decoded.
fn nginx_check(path: &[u8]) -> Result<(), PathError> {
    if path.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    if path.iter().any(|&c| c < 0x20 || c == 0x7f) {
        return Err(PathError::Control);
    }
    let mut decoded = Vec::with_capacity(path.len());
    let mut nul = false;
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' {
            let (Some(h), Some(l)) = (
                path.get(i + 1).copied().and_then(hex_value),
                path.get(i + 2).copied().and_then(hex_value),
            ) else {
                return Err(PathError::BadEscape);
            };
            let v = h * 16 + l;
            nul |= v == 0;
            decoded.push(v);
            i += 3;
        } else {
            decoded.push(path[i]);
            i += 1;
        }
    }
    if nul {
        return Err(PathError::Nul);
    }
    let mut depth = 0usize;
    for seg in decoded.split(|&b| b == b'/').skip(1) {
        match seg {
            b".." => depth = depth.checked_sub(1).ok_or(PathError::AboveRoot)?,
            b"" | b"." => {}
            _ => depth += 1,
        }
    }
    Ok(())
}

/// Whether a path (every `%` followed by two hex digits) holds an encoded
/// `/` or `\` in any case.
fn has_encoded_separator(path: &[u8]) -> bool {
    path.windows(3).any(|w| {
        w[0] == b'%'
            && (w[1] == b'2' && w[2].eq_ignore_ascii_case(&b'f')
                || w[1] == b'5' && w[2].eq_ignore_ascii_case(&b'c'))
    })
}

/// The canonical form of a request path (the part before `?`):
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`) percent-decoded, other
/// escapes kept with upper-case hex (`%3b` → `%3B`), runs of `/` merged,
/// `.` and `..` segments resolved (RFC 3986 §5.2.4); every other byte
/// (`;`, `+`, non-ASCII) as sent.
///
/// # Errors
/// The shapes nginx refuses itself ([`PathError::refused_by_nginx`]) and
/// those the edge refuses (a raw `\` or `#`, an encoded `/` or `\`, a
/// segment that is empty, `.` or `..` before its `;` parameters).
pub fn canonical_path(path: &str) -> Result<String, PathError> {
    let b = path.as_bytes();
    nginx_check(b)?;
    if b.contains(&b'\\') {
        return Err(PathError::Backslash);
    }
    if b.contains(&b'#') {
        return Err(PathError::Fragment);
    }
    if has_encoded_separator(b) {
        return Err(PathError::EncodedSeparator);
    }
    // Decode the unreserved escapes, upper-case the others.
    let mut text = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let v = hex_value(b[i + 1]).unwrap_or(0) * 16 + hex_value(b[i + 2]).unwrap_or(0);
            if unreserved(v) {
                text.push(v);
            } else {
                text.push(b'%');
                text.extend(b[i + 1..i + 3].iter().map(u8::to_ascii_uppercase));
            }
            i += 3;
        } else {
            text.push(b[i]);
            i += 1;
        }
    }
    // Segments: empty ones (from `//`) merged, dot segments resolved.
    let mut out: Vec<&[u8]> = Vec::new();
    let segments: Vec<&[u8]> = text.split(|&c| c == b'/').skip(1).collect();
    let mut trailing = false;
    for (n, seg) in segments.iter().enumerate() {
        let last = n + 1 == segments.len();
        if let Some(semi) = seg.iter().position(|&c| c == b';') {
            // What an origin reading path parameters resolves: refused
            // unless it is an ordinary name, or the last segment empty.
            match &seg[..semi] {
                b"." | b".." => return Err(PathError::SegmentParams),
                b"" if !last => return Err(PathError::SegmentParams),
                _ => {}
            }
        }
        match *seg {
            b"." | b"" => trailing = last,
            b".." => {
                out.pop().ok_or(PathError::AboveRootEncoded)?;
                trailing = last;
            }
            s => {
                out.push(s);
                trailing = false;
            }
        }
    }
    let mut canon = Vec::with_capacity(text.len());
    for s in &out {
        canon.push(b'/');
        canon.extend_from_slice(s);
    }
    if trailing || out.is_empty() {
        canon.push(b'/');
    }
    // Only ASCII was decoded, and whole UTF-8 sequences are kept as they
    // were: still UTF-8.
    Ok(String::from_utf8(canon).unwrap_or_default())
}

/// The path every rule matches: the canonical path with each segment's
/// parameters (`;` to the segment's end) removed (`/api;x/me` →
/// `/api/me`), as origins that read path parameters (Tomcat, Spring,
/// Jetty) see it; origins that do not see a path the rules match more of.
#[must_use]
pub fn match_path(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains(';') {
        return std::borrow::Cow::Borrowed(path);
    }
    let mut out = String::with_capacity(path.len());
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(seg.split(';').next().unwrap_or_default());
    }
    std::borrow::Cow::Owned(out)
}

/// The name an `ext` match (and the hotlink check) reads: the path's last
/// segment, trailing `/`s ignored, up to its first `;` (`/a.jpg;x`,
/// `/a.jpg/` → `a.jpg`), so that what an origin serving path parameters
/// or a trailing slash returns is matched by its extension.
#[must_use]
pub fn ext_subject(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    let last = trimmed.rsplit('/').next().unwrap_or_default();
    last.split(';').next().unwrap_or_default()
}

/// nginx's `$host` of a `Host` header: up to the first `:` outside
/// brackets, one trailing dot removed, lower-case; `None` where nginx
/// answers 400 (empty, `..`, a `/`, a NUL, a control or space byte).
#[must_use]
pub fn nginx_host(host: &str) -> Option<String> {
    let b = host.as_bytes();
    let mut end = b.len();
    let mut in_literal = false;
    let mut rest = false;
    let mut dot: Option<usize> = None;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'.' => {
                if i > 0 && dot == Some(i - 1) {
                    return None;
                }
                dot = Some(i);
            }
            b':' if !rest && !in_literal => {
                end = i;
                rest = true;
            }
            b'[' if i == 0 => in_literal = true,
            b']' if in_literal && !rest => {
                end = i + 1;
                rest = true;
                in_literal = false;
            }
            b'/' | 0 => return None,
            c if c <= 0x20 || c == 0x7f => return None,
            _ => {}
        }
    }
    if end > 0 && dot == Some(end - 1) {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    Some(String::from_utf8_lossy(&b[..end]).to_ascii_lowercase())
}

/// nginx accepts a method of upper-case letters, `_` and `-` only (400
/// otherwise, so `get` never reaches the edge).
#[must_use]
pub fn nginx_method(method: &str) -> bool {
    !method.is_empty()
        && method
            .bytes()
            .all(|c| c.is_ascii_uppercase() || c == b'_' || c == b'-')
}

/// What Lua's `%s` is: the whitespace trimmed around an
/// `X-Forwarded-For` entry (ASCII only: U+00A0 is not trimmed).
#[must_use]
pub fn is_lua_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// Rounds of percent-decoding the WAF does at most (`%252527` is three).
pub const WAF_DECODE_ROUNDS: usize = 3;

fn decode_once(b: &[u8]) -> Option<Vec<u8>> {
    if !b
        .windows(3)
        .any(|w| w[0] == b'%' && hex_value(w[1]).is_some() && hex_value(w[2]).is_some())
    {
        return None;
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex_value),
                b.get(i + 2).copied().and_then(hex_value),
            )
        {
            out.push(h * 16 + l);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fn waf_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The URI (path and query) as the WAF reads it: percent-decoded until
/// nothing changes (at most [`WAF_DECODE_ROUNDS`] times, so `%2527` is a
/// `'`), `+` as a space, ASCII lower-case, then [`waf_fold`].
#[must_use]
pub fn waf_text(uri: &str) -> Vec<u8> {
    let mut text = uri.as_bytes().to_vec();
    for _ in 0..WAF_DECODE_ROUNDS {
        match decode_once(&text) {
            Some(next) => text = next,
            None => break,
        }
    }
    for c in &mut text {
        if *c == b'+' {
            *c = b' ';
        }
        c.make_ascii_lowercase();
    }
    waf_fold(&text)
}

/// The spelling the WAF compares, applied to the text and to every rule's
/// needle alike: SQL comment markers (`/*`, `*/`) as spaces, every run of
/// whitespace (space, tab, CR, LF, VT, FF) one space, `=` with exactly one
/// space on each side, none before `(` (`union/**/select` → `union
/// select`, `onload =` and `onload=` → `onload = `, `sleep (` → `sleep(`).
#[must_use]
pub fn waf_fold(text: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(text.len() + 8);
    let mut pending = false;
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        let two = text.get(i + 1).copied();
        if (c == b'/' && two == Some(b'*')) || (c == b'*' && two == Some(b'/')) {
            pending = true;
            i += 2;
            continue;
        }
        i += 1;
        if waf_space(c) {
            pending = true;
            continue;
        }
        if c == b'(' {
            pending = false;
            out.push(c);
            continue;
        }
        if c == b'=' {
            pending = true;
        }
        if pending && out.last() != Some(&b' ') {
            out.push(b' ');
        }
        out.push(c);
        pending = c == b'=';
    }
    if pending && out.last() != Some(&b' ') {
        out.push(b' ');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One line of `testdata/edge/paths.jsonl`.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PathVector {
        path: String,
        #[serde(default)]
        canonical: Option<String>,
        #[serde(default)]
        refused: Option<String>,
        #[serde(default)]
        ext: Option<String>,
        #[serde(default, rename = "match")]
        matched: Option<String>,
    }

    /// One line of `testdata/edge/waf.jsonl`.
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct WafVector {
        uri: String,
        text: String,
    }

    #[test]
    fn paths_normalise_as_the_vectors_say() {
        let text = include_str!("../../../testdata/edge/paths.jsonl");
        let mut n = 0;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: PathVector =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("paths.jsonl:{}: {e}", i + 1));
            let got = canonical_path(&v.path);
            match (&v.canonical, &v.refused) {
                (Some(c), None) => {
                    assert_eq!(got.as_deref(), Ok(c.as_str()), "`{}`", v.path);
                    // Canonical is a fixed point.
                    assert_eq!(canonical_path(c).as_deref(), Ok(c.as_str()), "`{c}`");
                }
                (None, Some(kind)) => {
                    assert_eq!(
                        got.map_err(PathError::as_str),
                        Err(kind.as_str()),
                        "`{}`",
                        v.path
                    );
                }
                _ => panic!("paths.jsonl:{}: give canonical or refused", i + 1),
            }
            if let Some(e) = &v.ext {
                assert_eq!(ext_subject(&v.path), e, "`{}`", v.path);
            }
            if let Some(m) = &v.matched {
                assert_eq!(match_path(&v.path), m.as_str(), "`{}`", v.path);
            }
            n += 1;
        }
        assert!(n > 40, "{n} vectors");
    }

    #[test]
    fn waf_text_as_the_vectors_say() {
        let text = include_str!("../../../testdata/edge/waf.jsonl");
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: WafVector =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("waf.jsonl:{}: {e}", i + 1));
            assert_eq!(
                String::from_utf8_lossy(&waf_text(&v.uri)),
                v.text,
                "`{}`",
                v.uri
            );
        }
    }

    #[test]
    fn hosts_read_as_nginx_reads_them() {
        for (raw, want) in [
            ("ADM.TEST.", Some("adm.test")),
            ("adm.test:80:90", Some("adm.test")),
            ("A.Test.:8080", Some("a.test")),
            ("[::1]:80", Some("[::1]")),
            (".a.test", Some(".a.test")),
            ("a.test.:", Some("a.test")),
            ("a..b", None),
            ("a.test..", None),
            ("a/b", None),
            ("a b", None),
            ("", None),
            (":80", None),
        ] {
            assert_eq!(nginx_host(raw).as_deref(), want, "`{raw}`");
        }
    }

    #[test]
    fn methods_read_as_nginx_reads_them() {
        for m in ["GET", "PROPFIND", "G-T", "G_T"] {
            assert!(nginx_method(m), "{m}");
        }
        for m in ["get", "Get", "G1T", "", "GET "] {
            assert!(!nginx_method(m), "{m}");
        }
    }

    #[test]
    fn no_input_panics_the_normaliser() {
        let alphabet = [
            "/", "%", "2", "e", "E", ".", "f", "F", "0", "a", "\\", "#", ";", "é",
        ];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            let mut s = String::from("/");
            for _ in 0..(seed % 12) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push_str(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            if let Ok(c) = canonical_path(&s) {
                assert_eq!(
                    canonical_path(&c).as_deref(),
                    Ok(c.as_str()),
                    "`{s}` → `{c}`"
                );
                assert!(
                    !c.contains("//") && !c.contains("/./") && !c.contains("/../"),
                    "{c}"
                );
            }
            let _ = waf_text(&s);
            let _ = ext_subject(&s);
        }
    }
}
