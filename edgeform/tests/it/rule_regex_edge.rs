//! Rule regexes (`match_type: regex`) on the real edge — nginx with its Lua
//! module, whose `ngx.re` is PCRE1 — and in `check` (docs/configuration.md,
//! "Rule regexes"): a regex the edge cannot compile makes the document bad,
//! `check` refuses what the two engines read differently, and a small ReDoS
//! corpus is refused by `check` and bounded on the edge
//! (`lua_regex_match_limit`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::util::{Fixture, edgeform, stderr};

/// A loopback origin answering 200 `origin` to everything.
fn origin() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\norigin\n",
                );
            });
        }
    });
    port
}

/// `GET path` with `Host`: (status, `X-Edgeform-Reason`, elapsed).
fn get(port: u16, host: &str, path: &str) -> (u16, Option<String>, Duration) {
    let start = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let elapsed = start.elapsed();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let reason = raw.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("x-edgeform-reason")
            .then(|| v.trim().to_owned())
    });
    (status, reason, elapsed)
}

fn site_yaml(origin: u16, regex: &str) -> String {
    format!(
        "host: re.test\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\nedge_rules:\n\
         \x20 - {{match_type: regex, match_value: '{regex}', action: block}}\n"
    )
}

/// The regexes `check` refuses, with (a part of) the refusal.
const NOT_PORTABLE: [(&str, &str); 6] = [
    (r"\p{Letter}", "Unicode class"),
    (r"^/\pL+$", "Unicode class"),
    (r"\x{263A}", "`\\x{…}`"),
    (r"^/é", "non-ASCII"),
    (r"(?x)^/a b", "`x` flag"),
    (r"(?u)^/\d", "`u` flag"),
];

/// A small ReDoS corpus: each is refused by `check`, and bounded on the
/// edge (30 `a`s and a `!` make each backtrack past PCRE's default limit
/// of 10,000,000 steps: 25-50 ms of a worker's CPU each without the limit).
const REDOS: [(&str, &str); 5] = [
    (r"^/(?:a+){12}$", "inside a repetition"),
    (r"^/(a+)+$", "inside a repetition"),
    (r"^/(a|a)*$", "alternatives"),
    (r"^/(a|aa)+$", "alternatives"),
    (r"^/a*a*a*a*a*a*a*a*$", "in a row"),
];

#[test]
fn regex_rules_check_refuses_what_the_edge_reads_otherwise_and_bounds_redos() {
    let redis = harness::redis(&[]);
    let origin = origin();
    let cache = tempfile::tempdir().unwrap();
    let repo = Fixture::empty();
    repo.write("cluster.yaml", b"name: test\n");
    repo.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
             cache:\n  dirs: [\"{}\"]\n  levels: \"1:2\"\n  key: $scheme://$host$request_uri\n",
            redis.port,
            cache.path().display()
        )
        .as_bytes(),
    );

    // check: every non-portable and catastrophic regex refused, named.
    // Past what the edge's PCRE compiles (64 KiB; it copies a group once
    // per count), far under the length and count limits.
    let too_large = [(
        r"^/(?:abcdefghijklmnopqrstuvwxyz0123456789){999}$",
        "too large",
    )];
    for (regex, why) in NOT_PORTABLE.iter().chain(&REDOS).chain(&too_large) {
        repo.write("sites/re.test.yaml", site_yaml(origin, regex).as_bytes());
        let out = edgeform(repo.path(), &["check"]);
        assert_eq!(out.status.code(), Some(1), "{regex}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("invalid-regex") && err.contains(why),
            "{regex}: {err}"
        );
    }
    repo.write(
        "sites/re.test.yaml",
        site_yaml(origin, "^/admin").as_bytes(),
    );
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));

    let edge = harness::nginx::edge(&harness::nginx::EdgeOptions::new(redis.port));
    let port = edge.process.port;
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let good: String = redis::cmd("GET")
        .arg("site:re.test")
        .query(&mut con)
        .unwrap();
    assert!(good.contains(r#""match_value":"^/admin""#), "{good}");
    assert_eq!(get(port, "re.test", "/admin").0, 403);
    assert_eq!(get(port, "re.test", "/x").0, 200);

    // Documents written past `check` (straight into the edge's Redis).
    let put = |con: &mut redis::Connection, host: &str, regex: &str| {
        let doc = good.replace(
            r#""match_value":"^/admin""#,
            &format!(
                r#""match_value":{}"#,
                serde_json::Value::String(regex.into())
            ),
        );
        let _: () = redis::cmd("SET")
            .arg(format!("site:{host}"))
            .arg(&doc)
            .query(con)
            .unwrap();
        doc
    };
    // What PCRE cannot compile, and Unicode classes (PCRE would read them
    // as Latin-1): the document is bad, never "no match", in both.
    for (i, regex) in [r"(?<=a+)b", r"[z-a]", r"\x{263A}", r"^/\pL", r"[\P{Greek}]"]
        .iter()
        .enumerate()
    {
        let host = format!("bad{i}.test");
        let doc = put(&mut con, &host, regex);
        let (status, reason, _) = get(port, &host, "/x");
        assert_eq!(
            (status, reason.as_deref()),
            (502, Some("bad-document")),
            "{regex}: {doc}\n{}",
            edge.error_log()
        );
        // explain reads the same document as bad.
        assert!(edgestate::edge::Site::parse(&doc).is_err(), "{regex}");
    }
    // The ReDoS corpus, past check: each request bounded, answered 502.
    let hostile = format!("/{}!", "a".repeat(30));
    let mut slowest = Duration::ZERO;
    for (i, (regex, _)) in REDOS.iter().enumerate() {
        let host = format!("redos{i}.test");
        put(&mut con, &host, regex);
        get(port, &host, "/warm");
        // The fastest of three: the bound, not this machine's load.
        let mut fastest = Duration::MAX;
        for _ in 0..3 {
            let (status, reason, took) = get(port, &host, &hostile);
            assert_eq!(
                (status, reason.as_deref()),
                (502, Some("bad-document")),
                "{regex}"
            );
            fastest = fastest.min(took);
        }
        slowest = slowest.max(fastest);
        // An ordinary path on the same site still works.
        assert_eq!(get(port, &host, "/x").0, 200, "{regex}");
    }
    eprintln!("slowest ReDoS request under lua_regex_match_limit: {slowest:?}");
    assert!(slowest < Duration::from_millis(20), "{slowest:?}");
    // The dialect reads bytes alike in both engines: `.` is one byte,
    // `\w` and `(?i)` are ASCII.
    for (i, (regex, path, blocked)) in [
        (r"^/.$", "/\u{e9}", false),
        (r"^/..$", "/\u{e9}", true),
        (r"^/\w+$", "/\u{e9}t\u{e9}", false),
        (r"(?i)^/k$", "/\u{212a}", false),
        (r"(?i)^/ADMIN", "/admin", true),
        (r"^/\x41", "/A", true),
    ]
    .iter()
    .enumerate()
    {
        let host = format!("dialect{i}.test");
        let doc = put(&mut con, &host, regex);
        let (status, _, _) = get(port, &host, path);
        assert_eq!(status == 403, *blocked, "{regex} on {path}: edge {status}");
        let site = edgestate::edge::Site::parse(&doc).unwrap();
        let d = edgestate::edge::decide(
            &edgestate::edge::Request {
                method: "GET",
                host: &host,
                uri: path,
                client_ip: None,
                country: None,
                referer: None,
                origin: None,
                acr_method: None,
                cookie: None,
                authorization: None,
                ..edgestate::edge::Request::default()
            },
            edgestate::edge::Found::Site {
                key: &host,
                site: &site,
                suspended: false,
            },
            edgestate::edge::Clearance {
                secret: None,
                now: 0,
            },
        );
        assert_eq!(
            d.status == 403,
            *blocked,
            "{regex} on {path}: explain {}",
            d.status
        );
    }
}

/// A generated corpus of patterns (groups, alternations, classes, counted
/// and unbounded repetitions, nested), compiled by the edge's own PCRE
/// (`scripts/lua/pcre_size.lua`, LuaJIT's FFI on `libpcre.so.3`): `check`'s
/// estimate of the compiled size is never below PCRE's, so every pattern
/// PCRE refuses as too large is refused by `check` as too large.
#[test]
fn the_compiled_size_check_estimates_is_never_below_the_edges_pcre() {
    use compiler::rule_regex::{MAX_COMPILED, compiled_size};
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    fn item(depth: u32, next: &mut dyn FnMut(u64) -> u64) -> String {
        const ATOMS: [&str; 10] = [
            "a", "ab", "xyz", "[a-z]", r"\d", ".", r"\.", "[^/]", "/", r"\w",
        ];
        let item = match if depth == 0 { 0 } else { next(6) } {
            0..=2 => ATOMS[next(ATOMS.len() as u64) as usize].to_owned(),
            3 => format!("(?:{})", seq(depth - 1, next)),
            4 => format!("({})", seq(depth - 1, next)),
            _ => {
                let n = 2 + next(3);
                let branches: Vec<String> = (0..n).map(|_| seq(depth - 1, next)).collect();
                format!("(?:{})", branches.join("|"))
            }
        };
        let big = |next: &mut dyn FnMut(u64) -> u64| {
            if next(3) == 0 {
                100 + next(1100)
            } else {
                next(20)
            }
        };
        match next(8) {
            0 => format!("{item}?"),
            1 => format!("{item}*"),
            2 => format!("{item}+"),
            3 => format!("{item}{{{}}}", big(next)),
            4 => {
                let m = big(next);
                format!("{item}{{{},{m}}}", next(m + 1))
            }
            5 => format!("{item}{{{},}}", next(30)),
            _ => item,
        }
    }
    fn seq(depth: u32, next: &mut dyn FnMut(u64) -> u64) -> String {
        (0..1 + next(3)).map(|_| item(depth, next)).collect()
    }
    let mut patterns = vec![
        String::new(),
        r"^/(?:abcdefghijklmnopqrstuvwxyz){1130}$".to_owned(),
        r"^/(?:abcdefghijklmnopqrstuvwxyz0123456789){999}$".to_owned(),
        r"^/(?:[a-z][0-9]){999}$".to_owned(),
        r"^/(?:ab){1,999}$".to_owned(),
        // The name table is no part of the code's size.
        r"^/(?P<abcdefghijklmnopqrstuvwxyz012345>a)(?P<b>(?:xy){100})$".to_owned(),
    ];
    while patterns.len() < 3000 {
        let p = format!("^/{}", seq(3, &mut next));
        if p.len() <= compiler::rule_regex::MAX_LEN {
            patterns.push(p);
        }
    }
    let script = crate::util::example_repo().join("scripts/lua/pcre_size.lua");
    let input: String = patterns.iter().map(|p| format!("{p}\n")).collect();
    let pcre = crate::util::luajit_lines(&[&script.to_string_lossy()], input.as_bytes());
    assert_eq!(pcre.len(), patterns.len());
    // PCRE_INFO_SIZE holds a header before the code (the script leaves
    // the name table out); the empty pattern's code is its 7 bytes of
    // brackets and end.
    let header = pcre[0].parse::<u64>().unwrap() - compiled_size(&parse(""));
    let (mut compared, mut too_large, mut widest, mut over_refused) = (0, 0, 0f64, 0);
    for (p, got) in patterns.iter().zip(&pcre) {
        let Ok(ast) = regex_syntax::ast::parse::Parser::new().parse(p) else {
            continue;
        };
        let estimate = compiled_size(&ast);
        match got.strip_prefix("! ") {
            Some("regular expression is too large") => {
                too_large += 1;
                assert!(estimate > MAX_COMPILED, "{p}: estimated {estimate}");
                assert!(compiler::rule_regex::check(p).is_err(), "{p}");
            }
            // Refused by PCRE for another reason (`nothing to repeat`).
            Some(_) => {}
            None => {
                let code = got.parse::<u64>().unwrap() - header;
                assert!(estimate >= code, "{p}: estimated {estimate}, PCRE {code}");
                compared += 1;
                widest = widest.max(estimate as f64 / code as f64);
                over_refused += u64::from(estimate > MAX_COMPILED);
            }
        }
    }
    eprintln!(
        "{compared} patterns compiled by PCRE ({over_refused} of them estimated past {MAX_COMPILED} bytes), \
         {too_large} too large for it; estimate at most {widest:.1}× PCRE's size"
    );
    assert!(compared > 1000 && too_large > 10, "{compared} {too_large}");
}

fn parse(p: &str) -> regex_syntax::ast::Ast {
    regex_syntax::ast::parse::Parser::new().parse(p).unwrap()
}
