//! Hostile input never panics: the example repository's files, mutated by a
//! seeded PRNG (byte flips, truncations, splices of YAML-significant
//! tokens, deep nesting, huge numbers, invalid UTF-8, ...), each mutant run
//! through `parse_file`, `check` and the miette renderer. No panic, and
//! every diagnostic points into its file: 1-based line and column, `start
//! <= end <= len` on char boundaries, the line/column agreeing with
//! `start`.
//!
//! Deterministic and dependency-free (a tiny xorshift PRNG). For a longer
//! local soak: `HOSTILE_ITERS=200000 HOSTILE_SEED=7 cargo test -p compiler
//! --release --test it hostile`. The coverage-guided fuzzer lives in
//! `fuzz/` (see `fuzz/README.md`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use compiler::Diagnostic;
use compiler::load::{Kind, Repo, Source};
use compiler::parse::parse_file;
use compiler::report;

/// Mutants per run by default: about 2–4 s in a debug build.
const ITERS: u64 = 2_500;
/// Every this many mutants, the mutant also replaces its file in the whole
/// example repository and goes through `check` (and `compile` when valid).
const CHECK_EVERY: u64 = 10;

/// xorshift64*: small, fast, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Fragments that mean something to a YAML parser (or to edgeform).
#[rustfmt::skip]
const TOKENS: &[&str] = &[
    ": ", ":", "- ", "-", "? ", "[", "]", "{", "}", ",", "[]", "{}", "&a ", "*a", "&a [x]", "*b",
    "!!str ", "!!int ", "!!float ", "!!binary ", "!!map ", "!!seq ", "!custom ", "!<tag:x> ",
    "<<: *a", "---", "\n---\n", "...", "\n...\n", "%YAML 1.2\n", "%TAG ! tag:x,2000:\n", "|",
    "|-", ">+", "|2", "|9", "\t", "\t- ", "\n\t", "#", " #", "'", "\"", "\"\\u00e9\\x", "\\",
    "\n", "\r", "\r\n", "\n  ", "\n    ", "\n- ", "~", "null", "true", "no", ".inf", ".nan",
    "-.inf", "0x", "0o", "0b1", "1e999", "-1e-999", "0x7fffffffffffffff", "0x8000000000000000",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809",
    "99999999999999999999999999999999", "-0", "+1", ".5", "1_000", "é", "€", "😀", "\u{feff}",
    "\u{200b}", "\u{85}", "\u{2028}", "\0", "\u{7f}", "host: ", "name: ", "zone: ", "fallback: ",
    "regions: [", "routes:\n  - ", "roles: [edge, router, origin]", "aliases:\n  - ",
    "0.0.0.0/0", "::/0", "300.1.1.1/33", "fe80::1%eth0", "*.example.com", "xn--", "http://",
    "https://[::1]:99999/", "redis://", "mqtt://", "30s", "0ms", "99999999h",
];

/// Whole values that stress number, string and duration handling.
#[rustfmt::skip]
const VALUES: &[&str] = &[
    "", "~", "null", "-1", "0", "-0", "1.5", "1e308", "1e309", "-1e309", ".nan", ".inf",
    "18446744073709551616", "-9223372036854775808", "0x", "0o9", "[]", "{}", "[[[[]]]]",
    "\"\"", "''", "\"\\0\\a\\e\\N\\_\\L\\P\"", "é", "\u{10ffff}", "true", "yes", "NO",
    "2001-01-01", "2001-01-01T00:00:00Z", "1:2:3:4", "lat", "&x 1", "*x", "!!binary aGk=",
    "a.example.com", "http://", "redis://:@/", "mqtt://x:0", "5", "999999999999", "0s",
];

struct Example {
    kind: Kind,
    path: Arc<str>,
    bytes: Vec<u8>,
}

fn examples() -> Vec<Example> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = vec![Example {
        kind: Kind::Cluster,
        path: "cluster.yaml".into(),
        bytes: std::fs::read(root.join("cluster.yaml")).unwrap(),
    }];
    for (folder, kind) in Kind::FOLDERS {
        let mut names: Vec<_> = std::fs::read_dir(root.join(folder))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        names.sort();
        for name in names {
            let bytes = std::fs::read(root.join(folder).join(&name)).unwrap();
            out.push(Example {
                kind,
                path: format!("{folder}/{name}").into(),
                bytes,
            });
        }
    }
    assert!(out.len() >= 10, "the example repository is missing");
    out
}

fn text_of(bytes: Vec<u8>) -> Result<String, compiler::load::Unreadable> {
    compiler::load::utf8(bytes)
}

/// A byte offset, biased towards line starts (where indentation matters).
fn position(rng: &mut Rng, bytes: &[u8]) -> usize {
    if bytes.is_empty() {
        return 0;
    }
    let at = rng.below(bytes.len() + 1);
    if rng.chance(2) {
        // back to the start of that line
        bytes[..at]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
    } else {
        at
    }
}

fn range(rng: &mut Rng, bytes: &[u8]) -> (usize, usize) {
    let a = rng.below(bytes.len() + 1);
    let len = rng.below(1 + (bytes.len() - a).min(64));
    (a, a + len)
}

/// One mutation, in place. Returns what it did, for the failure message.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, others: &[Example]) -> &'static str {
    match rng.below(16) {
        0 => {
            if let Some(b) = pick_byte(rng, bytes) {
                *b ^= 1 << rng.below(8);
            }
            "bit flip"
        }
        1 => {
            // Mostly ASCII: a high byte makes most files invalid UTF-8.
            let range = if rng.chance(8) { 256 } else { 128 };
            if let Some(b) = pick_byte(rng, bytes) {
                *b = u8::try_from(rng.below(range)).unwrap();
            }
            "byte set"
        }
        2 => {
            let at = rng.below(bytes.len() + 1);
            bytes.truncate(at);
            "truncate"
        }
        3 => {
            let (a, b) = range(rng, bytes);
            bytes.drain(a..b);
            "delete range"
        }
        4..=6 => {
            let at = position(rng, bytes);
            let token = rng.pick(TOKENS).as_bytes();
            bytes.splice(at..at, token.iter().copied());
            "insert token"
        }
        7 => {
            // Replace the value after a `: ` with a hostile one.
            let starts: Vec<usize> = bytes
                .windows(2)
                .enumerate()
                .filter(|(_, w)| w == b": ")
                .map(|(i, _)| i + 2)
                .collect();
            if starts.is_empty() {
                return "replace value (none)";
            }
            let a = *rng.pick(&starts);
            let b = bytes[a..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(bytes.len(), |p| a + p);
            let value = rng.pick(VALUES).as_bytes();
            bytes.splice(a..b, value.iter().copied());
            "replace value"
        }
        8 => {
            let (a, b) = range(rng, bytes);
            let chunk = bytes[a..b].to_vec();
            let at = position(rng, bytes);
            bytes.splice(at..at, chunk);
            "duplicate range"
        }
        9 => {
            let other = &rng.pick(others).bytes;
            let (a, b) = range(rng, other);
            let at = position(rng, bytes);
            bytes.splice(at..at, other[a..b].iter().copied());
            "splice from another file"
        }
        10 => {
            // Deep nesting, flow or block, around the cap of 64 and past it.
            let depth = *rng.pick(&[8, 63, 64, 65, 200, 5_000]);
            let nest: Vec<u8> = match rng.below(4) {
                0 => "[".repeat(depth).into_bytes(),
                1 => format!("{}x{}", "[".repeat(depth), "]".repeat(depth)).into_bytes(),
                2 => "{a: ".repeat(depth).into_bytes(),
                _ => (0..depth.min(300))
                    .flat_map(|i| format!("\n{}- ", "  ".repeat(i)).into_bytes())
                    .collect(),
            };
            let at = position(rng, bytes);
            bytes.splice(at..at, nest);
            "deep nesting"
        }
        11 => {
            // Indentation: add or remove spaces, or a tab, at a line start.
            let at = position(rng, bytes);
            let at = bytes[..at]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            match rng.below(3) {
                0 => {
                    bytes.splice(at..at, b"  ".iter().copied());
                }
                1 => {
                    bytes.insert(at, b'\t');
                }
                _ => {
                    while bytes.get(at) == Some(&b' ') {
                        bytes.remove(at);
                    }
                }
            }
            "indentation"
        }
        12 => {
            // Invalid UTF-8: a lone continuation byte, a cut multi-byte
            // char, an overlong encoding or a surrogate; or the file cut
            // in the middle of its last multi-byte char.
            const BAD: &[&[u8]] = &[
                &[0x80],
                &[0xc3],
                &[0xe2, 0x82],
                &[0xf0, 0x9f, 0x98],
                &[0xc0, 0x80],
                &[0xed, 0xa0, 0x80],
                &[0xff, 0xfe],
            ];
            if rng.chance(2)
                && let Some(cut) = bytes.iter().rposition(|&b| b >= 0x80)
            {
                bytes.truncate(cut);
                return "cut a multi-byte char";
            }
            let bad = *rng.pick(BAD);
            let at = rng.below(bytes.len() + 1);
            bytes.splice(at..at, bad.iter().copied());
            "invalid UTF-8"
        }
        13 => {
            // A multi-byte char (columns count chars, spans count bytes),
            // at a char boundary so the file stays UTF-8.
            let chars = [
                "é", "€", "😀", "\u{feff}", "\u{2028}", "\u{85}", "\u{a0}", "\u{301}",
            ];
            let mut at = position(rng, bytes);
            while at < bytes.len() && (bytes[at] & 0xc0) == 0x80 {
                at += 1;
            }
            bytes.splice(at..at, rng.pick(&chars).bytes());
            "insert a multi-byte char"
        }
        14 => {
            // Swap two lines.
            let mut lines: Vec<Vec<u8>> =
                bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
            if lines.len() > 1 {
                let (i, j) = (rng.below(lines.len()), rng.below(lines.len()));
                lines.swap(i, j);
            }
            *bytes = lines.join(&b'\n');
            "swap lines"
        }
        _ => {
            // Anchor a value and alias it elsewhere (or an unknown alias).
            let at = position(rng, bytes);
            bytes.splice(at..at, b"&a ".iter().copied());
            let at = position(rng, bytes);
            let alias: &[u8] = if rng.chance(3) { b"*zz" } else { b"*a" };
            bytes.splice(at..at, alias.iter().copied());
            "anchor and alias"
        }
    }
}

fn pick_byte<'a>(rng: &mut Rng, bytes: &'a mut [u8]) -> Option<&'a mut u8> {
    if bytes.is_empty() {
        return None;
    }
    let i = rng.below(bytes.len());
    Some(&mut bytes[i])
}

/// The 1-based line of byte `at`, counting `\n`, `\r\n` and a lone `\r`
/// as line breaks (as YAML does), and its 1-based character column. The
/// column is a range: the parser counts a byte order mark (U+FEFF) as a
/// column in some places and skips it in others (at the start of the
/// file, as editors do), so either count is accepted.
fn line_col(text: &str, at: usize) -> (u32, std::ops::RangeInclusive<u32>) {
    let before = &text[..at];
    let mut line = 1;
    let mut line_start = 0;
    let bytes = before.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')) {
            line += 1;
            line_start = i + 1;
        }
    }
    let chars = before[line_start..].chars().count();
    let boms = before[line_start..].matches('\u{feff}').count();
    let col = |n: usize| u32::try_from(n + 1).unwrap();
    (line, col(chars - boms)..=col(chars))
}

/// Every diagnostic points into its file.
fn assert_spans(diagnostics: &[Diagnostic], repo: &Repo) -> Result<(), String> {
    for d in diagnostics {
        let Some(source) = repo.sources.iter().find(|s| s.path == d.file) else {
            return Err(format!(
                "diagnostic for a file not in the repository: {d:?}"
            ));
        };
        let text = source.text.as_deref().unwrap_or("");
        let s = d.span;
        if s.line == 0 || s.column == 0 {
            return Err(format!("0-based position: {d:?}"));
        }
        if !(s.start <= s.end && s.end <= text.len()) {
            return Err(format!(
                "span outside the file ({} bytes): {d:?}",
                text.len()
            ));
        }
        if !text.is_char_boundary(s.start) || !text.is_char_boundary(s.end) {
            return Err(format!("span not on a char boundary: {d:?}"));
        }
        let (line, columns) = line_col(text, s.start);
        if line != s.line || !columns.contains(&s.column) {
            return Err(format!(
                "line:column {}:{} does not match byte {} (which is at {line}:{columns:?}): {d:?}",
                s.line, s.column, s.start
            ));
        }
    }
    Ok(())
}

/// One file on its own: parse (as its own kind and, sometimes, another),
/// check the spans, render.
fn run_file(source: &Source) -> Result<(), String> {
    let parsed = parse_file(source);
    let repo = Repo {
        sources: vec![source.clone()],
        commit: None,
    };
    assert_spans(&parsed.diagnostics, &repo)?;
    let _ = report::diagnostics_human(&parsed.diagnostics, &repo, false);
    let _ = report::diagnostics_json(&parsed.diagnostics);
    let _ = report::diagnostics_github(&parsed.diagnostics, "");
    Ok(())
}

/// The whole repository with one file replaced.
fn run_repo(repo: &Repo) -> Result<bool, String> {
    let checked = compiler::check(repo);
    assert_spans(&checked.diagnostics, repo)?;
    let _ = report::diagnostics_human(&checked.diagnostics, repo, true);
    if let Some(config) = &checked.config {
        let a = compiler::compile::compile(config);
        let b = compiler::compile::compile(config);
        let d = compiler::diff::diff(&a, &b);
        if d.has_changes() {
            return Err("compiling the same config twice gave a non-empty diff".into());
        }
        let _ = report::diff_human(&compiler::diff::diff(&Default::default(), &a), "a", "b");
    }
    Ok(checked.is_valid())
}

fn escaped(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(4_000)];
    let mut s = shown.escape_ascii().to_string();
    if shown.len() < bytes.len() {
        s.push_str(&format!("... ({} bytes in all)", bytes.len()));
    }
    s
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn hostile_mutants_never_panic_and_point_into_their_file() {
    let examples = examples();
    let seed = env_u64("HOSTILE_SEED", 0x5eed_ed6e);
    let iters = env_u64("HOSTILE_ITERS", ITERS);
    let base = Repo {
        sources: examples
            .iter()
            .map(|e| Source {
                kind: e.kind,
                path: e.path.clone(),
                text: text_of(e.bytes.clone()),
            })
            .collect(),
        commit: None,
    };
    assert!(
        compiler::check(&base).is_valid(),
        "the example repository must be valid"
    );

    let kinds = [Kind::Cluster, Kind::Site, Kind::Zone, Kind::Node];
    let mut rng = Rng::new(seed);
    let (mut errors_utf8, mut valid_repos) = (0u32, 0u32);
    for i in 0..iters {
        let which = rng.below(examples.len());
        let example = &examples[which];
        let mut bytes = example.bytes.clone();
        let mut done = Vec::new();
        for _ in 0..=rng.below(4) {
            done.push(mutate(&mut rng, &mut bytes, &examples));
        }
        let kind = if rng.chance(5) {
            *rng.pick(&kinds)
        } else {
            example.kind
        };
        let text = text_of(bytes.clone());
        errors_utf8 += u32::from(text.is_err());
        let source = Source {
            kind,
            path: example.path.clone(),
            text,
        };
        let whole = i % CHECK_EVERY == 0;

        let outcome = catch_unwind(AssertUnwindSafe(|| {
            run_file(&source)?;
            if whole {
                let mut repo = base.clone();
                repo.sources[which] = source.clone();
                return run_repo(&repo);
            }
            Ok(false)
        }));
        let problem = match outcome {
            Ok(Ok(valid)) => {
                valid_repos += u32::from(valid);
                continue;
            }
            Ok(Err(why)) => why,
            Err(panic) => format!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)")
            ),
        };
        panic!(
            "mutant {i} (HOSTILE_SEED={seed}) of {} parsed as {kind:?}{}, after {done:?}: \
             {problem}\ninput: b\"{}\"",
            example.path,
            if whole {
                ", and in the whole repository"
            } else {
                ""
            },
            escaped(&bytes),
        );
    }
    // The mutations must reach both the UTF-8 refusal and compile.
    assert!(errors_utf8 > 0, "no mutant was invalid UTF-8");
    assert!(
        valid_repos > 0 || iters < 100,
        "no mutated repository was valid"
    );
}

/// Fixed hostile files that random mutation is unlikely to build.
#[test]
fn hostile_fixed_inputs_never_panic() {
    let laughs = {
        let mut s = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            s.push_str(&format!(
                "a{i}: &a{i} [{}]\n",
                vec![format!("*a{}", i - 1); 10].join(", ")
            ));
        }
        s
    };
    let long_line = format!("host: {}\norigin: http://x\n", "a".repeat(200_000));
    let many_keys: String = (0..3_000).map(|i| format!("k{i}: {i}\n")).collect();
    let deep_block: String = (0..100)
        .map(|i| format!("{}- \n", "  ".repeat(i)))
        .collect();
    let cases: Vec<(&str, Result<String, compiler::load::Unreadable>)> = vec![
        ("empty", Ok(String::new())),
        ("only a BOM", Ok("\u{feff}".into())),
        ("only a comment", Ok("# nothing".into())),
        ("nul bytes", Ok("\0\0\0".into())),
        (
            "not UTF-8",
            Err(compiler::load::Unreadable::NotUtf8 { at: 0 }),
        ),
        ("tab indentation", Ok("host: a\n\torigin: b\n".into())),
        ("CR line breaks", Ok("host: a\rorigin: [\r".into())),
        ("CRLF error at end", Ok("host: a\r\norigin: [\r\n".into())),
        (
            "multi-byte before an error",
            Ok("# é€😀\nhost: é\n  : [\n".into()),
        ),
        ("error after multi-byte", Ok("😀😀😀: [}".into())),
        ("unterminated quote", Ok("host: \"abc".into())),
        ("bad escape", Ok("host: \"\\xZZ\\u12\"".into())),
        ("tag", Ok("host: !!python/object x\n".into())),
        ("unknown alias", Ok("host: *nope\n".into())),
        ("self alias", Ok("a: &a [*a]\n".into())),
        ("merge key", Ok("base: &b {host: a}\n<<: *b\n".into())),
        ("two documents", Ok("host: a\n---\nhost: b\n".into())),
        ("document end", Ok("host: a\n...\n".into())),
        ("directive only", Ok("%YAML 1.2\n---\n".into())),
        ("complex key", Ok("? [a, b]\n: c\n".into())),
        ("duplicate key", Ok("host: a\nhost: b\n".into())),
        (
            "flow nesting 65",
            Ok(format!("{}{}", "[".repeat(65), "]".repeat(65))),
        ),
        ("flow nesting 10k", Ok("[".repeat(10_000))),
        ("map nesting 10k", Ok("{a: ".repeat(10_000))),
        ("block nesting 100", Ok(deep_block)),
        (
            "huge int",
            Ok("host: 99999999999999999999999999999999999999\n".into()),
        ),
        ("huge float", Ok("host: 1e999999\n".into())),
        (
            "i64 min",
            Ok("playback_session_limit: -9223372036854775808\n".into()),
        ),
        (
            "u64 max",
            Ok("playback_session_limit: 18446744073709551615\n".into()),
        ),
        ("nan", Ok("location: {lat: .nan, lon: -.inf}\n".into())),
        ("sequence root", Ok("- a\n- b\n".into())),
        ("scalar root", Ok("hello".into())),
        ("key only", Ok("host:".into())),
    ];
    // Big inputs cost a second or so each in a debug build: one kind only.
    let big: Vec<(&str, Result<String, compiler::load::Unreadable>)> = vec![
        ("billion laughs", Ok(laughs)),
        ("long line", Ok(long_line)),
        ("many keys", Ok(many_keys)),
    ];
    let all_kinds = [Kind::Cluster, Kind::Site, Kind::Zone, Kind::Node];
    let runs = cases
        .into_iter()
        .map(|c| (c, &all_kinds[..]))
        .chain(big.into_iter().map(|c| (c, &all_kinds[1..2])));
    for ((name, text), kinds) in runs {
        for &kind in kinds {
            let source = Source {
                kind,
                path: "sites/x.yaml".into(),
                text: text.clone(),
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| run_file(&source)));
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(why)) => panic!("{name} as {kind:?}: {why}"),
                Err(_) => panic!("{name} as {kind:?}: panicked"),
            }
        }
    }
}
