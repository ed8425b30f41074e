//! The reference edge on hostile request shapes, with the real nginx and
//! its Lua in front of a real loopback origin that records every request
//! line: one normalised path for every rule and for what reaches the
//! origin, responses that are never cached, redirects that stay on their
//! host, the hotlink and WAF shapes, purge by any spelling of a path, and
//! the Lua normaliser on the Rust vectors.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::nginx::{Edge, EdgeOptions};

use super::edge::{node_yaml, read_head, start_agent, walk};
use crate::util::{Answer, Fixture, edgeform, exchange, stderr, stdout};

/// What the origin saw, in order: (method, request target, headers).
type Seen = Arc<Mutex<Vec<(String, String, BTreeMap<String, String>)>>>;

/// A loopback origin that records every request and answers by path:
/// `/private/` → `Cache-Control: private`, `/nostore/` → `no-store`,
/// `/setcookie/` → a `Set-Cookie`, else `Cache-Control: max-age=1`; the
/// body counts the origin's answers, so a cached one shows.
struct Origin {
    port: u16,
    seen: Seen,
}

fn origin() -> Origin {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let s = s.clone();
            std::thread::spawn(move || answer_origin(stream, &s));
        }
    });
    Origin { port, seen }
}

fn answer_origin(mut s: TcpStream, seen: &Seen) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    while let Some((head, body_len)) = read_head(&mut s) {
        let mut body = vec![0; body_len];
        if s.read_exact(&mut body).is_err() {
            return;
        }
        let mut lines = head.split("\r\n");
        let mut first = lines.next().unwrap_or_default().split(' ');
        let method = first.next().unwrap_or_default().to_owned();
        let target = first.next().unwrap_or_default().to_owned();
        let headers: BTreeMap<String, String> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let n = {
            let mut v = seen.lock().unwrap();
            v.push((method, target.clone(), headers));
            v.len()
        };
        let extra = if target.contains("/private/") {
            "Cache-Control: private, max-age=600\r\n"
        } else if target.contains("/nostore/") {
            "Cache-Control: no-store\r\n"
        } else if target.contains("/setcookie/") {
            "Set-Cookie: session=victim; Path=/\r\n"
        } else {
            "Cache-Control: max-age=1\r\n"
        };
        let payload = format!("answer {n}\n");
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{extra}Content-Length: {}\r\n\r\n{payload}",
            payload.len()
        );
        if s.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

impl Origin {
    fn targets(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, t, _)| t.clone())
            .collect()
    }
    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

trait Reasons {
    fn reason(&self) -> Option<&str>;
    fn cache(&self) -> Option<&str>;
}

impl Reasons for Answer {
    fn reason(&self) -> Option<&str> {
        self.header("x-edgeform-reason")
    }
    fn cache(&self) -> Option<&str> {
        self.header("x-cache-status")
    }
}

/// One request, its target written as given (raw bytes of the request line).
fn ask(port: u16, host: &str, target: &str, headers: &[(&str, &str)]) -> Answer {
    let mut text = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    exchange(port, &text, Duration::from_secs(10))
}

const SITE: &str = "host: p.test\n\
cache_rules:\n\
\x20 - {match_type: ext, match_value: .jpg, action: ttl, ttl: 3600}\n\
\x20 - {match_type: prefix, match_value: /api/, action: bypass}\n\
edge_rules:\n\
\x20 - {match_type: prefix, match_value: /admin, action: block}\n\
\x20 - {match_type: prefix, match_value: /shop, action: redirect, redirect_status: 302, redirect_to: \"https://shop.example.com\"}\n\
\x20 - {match_type: prefix, match_value: /old/, action: redirect, redirect_status: 301}\n\
\x20 - {match_type: ext, match_value: .bak, action: block}\n";

struct Setup {
    repo: Fixture,
    redis: harness::Process,
    edge: Edge,
    origin: Origin,
}

fn setup() -> Setup {
    let redis = harness::redis(&[]);
    let origin = origin();
    let cache = tempfile::tempdir().unwrap().keep();
    let repo = Fixture::empty();
    repo.write("cluster.yaml", b"name: test\n");
    repo.write(
        "nodes/edge-1.yaml",
        node_yaml(redis.port, &cache).as_bytes(),
    );
    let o = format!("origin: http://127.0.0.1:{}\nloopback: true\n", origin.port);
    repo.write("sites/p.test.yaml", format!("{SITE}{o}").as_bytes());
    repo.write(
        "sites/hot.test.yaml",
        format!("host: hot.test\nhotlink_mode: block\n{o}").as_bytes(),
    );
    repo.write(
        "sites/waf.test.yaml",
        format!("host: waf.test\nwaf_mode: strict\ncached: false\n{o}").as_bytes(),
    );
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let mut opts = EdgeOptions::new(redis.port);
    opts.cache_dir = Some(cache);
    let edge = harness::nginx::edge(&opts);
    // The worker reads the generation in its first 200 ms.
    std::thread::sleep(Duration::from_millis(300));
    Setup {
        repo,
        redis,
        edge,
        origin,
    }
}

#[test]
fn every_spelling_of_a_path_meets_its_rule_and_the_origin_sees_one_form() {
    let s = setup();
    let port = s.edge.process.port;
    // A block on /admin holds for every spelling: the edge redirects to
    // the normalised path first, where the rule answers.
    for raw in [
        "//admin",
        "/./admin",
        "/%61dmin",
        "/x/../admin",
        "/%2e/admin",
    ] {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!(
            (a.status, a.reason(), a.header("location")),
            (308, Some("non-canonical-path"), Some("/admin")),
            "{raw}"
        );
        let a = ask(port, "p.test", "/admin", &[]);
        assert_eq!((a.status, a.reason()), (403, Some("edge-rule")));
    }
    assert_eq!(s.origin.count(), 0, "{:?}", s.origin.targets());
    // What reaches the origin is the normalised path, byte for byte: a
    // non-canonical spelling never does (308 to its form, which does).
    for (raw, canonical) in [
        ("//x", "/x"),
        ("/./x/", "/x/"),
        ("/%61", "/a"),
        ("/b/../%7Eu?q=1", "/~u?q=1"),
        ("/caf%c3%a9", "/caf%C3%A9"),
    ] {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!(
            (a.status, a.header("location")),
            (308, Some(canonical)),
            "{raw}"
        );
        let a = ask(port, "p.test", canonical, &[]);
        assert_eq!(a.status, 200, "{canonical}");
        assert_eq!(
            s.origin.targets().last().map(String::as_str),
            Some(canonical)
        );
    }
    // Canonical shapes go through exactly as sent.
    for target in ["/a%3Bb", "/a;x", "/a+b?q=%zz&r=//", "/caf%C3%A9/"] {
        assert_eq!(ask(port, "p.test", target, &[]).status, 200, "{target}");
        assert_eq!(s.origin.targets().last().map(String::as_str), Some(target));
    }
    // What the edge refuses, and what nginx refuses before it.
    let before = s.origin.count();
    for raw in ["/old/\\evil.com", "/a#b", "/x%2Fy/../.."] {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!((a.status, a.reason()), (400, Some("bad-path")), "{raw}");
    }
    for raw in ["/a/..%00/x", "/a%zz", "/..%2f..%2fetc/passwd"] {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!((a.status, a.reason()), (400, None), "{raw}");
    }
    assert_eq!(s.origin.count(), before, "{:?}", s.origin.targets());
    let _ = (&s.redis, &s.repo);
}

#[test]
fn an_encoded_slash_or_backslash_never_reaches_the_origin() {
    let s = setup();
    let port = s.edge.process.port;
    // nginx and origins decode `%2F`/`%5C` into a separator the rules
    // never saw: `/x/..%2Fadmin` is `/admin` to them. The edge refuses
    // every such path, in any case, before the rules and the origin.
    let shapes = [
        "/x/..%2Fadmin",
        "/%2Fadmin",
        "/admin%2Fusers",
        "/x/..%2fadmin",
        "/%2fadmin",
        "/x/..%5Cadmin",
        "/%5cadmin",
        "/admin%5cusers",
        "/api%2Fme",
        "//%2Fadmin?q=1",
        "/old/%5C%5Cevil.com",
        "/a.jpg%2F",
    ];
    for raw in shapes {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!(
            (a.status, a.reason(), a.header("location")),
            (400, Some("bad-path"), None),
            "{raw}"
        );
    }
    // explain says the same.
    let batch: String = shapes
        .iter()
        .enumerate()
        .map(|(id, url)| {
            let line = serde_json::json!({"id": id, "host": "p.test", "url": url,
                "ip": "127.0.0.1", "method": "GET", "headers": {}});
            format!("{line}\n")
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("requests.jsonl");
    std::fs::write(&file, batch).unwrap();
    let out = edgeform(
        s.repo.path(),
        &["explain", "--batch", file.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "explain: {}", stderr(&out));
    let answers: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), shapes.len());
    for (raw, v) in shapes.iter().zip(&answers) {
        assert_eq!(
            (v["status"].as_u64(), v["reason"].as_str()),
            (Some(400), Some("bad-path")),
            "explain {raw}: {v}"
        );
    }
    assert_eq!(s.origin.count(), 0, "{:?}", s.origin.targets());
    // A double-encoded one is a `%` followed by `2F` to every reader: an
    // ordinary segment, and the rule on `/admin` is not walked around.
    let a = ask(port, "p.test", "/x%252Fy", &[]);
    assert_eq!(a.status, 200);
    assert_eq!(s.origin.targets(), ["/x%252Fy"]);
    // The edge never caches such a path, so purge refuses it too.
    let out = edgeform(
        s.repo.path(),
        &["purge", "--site", "p.test", "--url", "/a%2Fb.jpg"],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("encoded"), "{}", stderr(&out));
    let _ = &s.redis;
}

#[test]
fn personal_and_private_responses_are_never_cached() {
    let s = setup();
    let port = s.edge.process.port;
    let cookie = [("Cookie", "session=victim")];
    // Web cache deception: `//api/` does not walk around the bypass rule.
    let a = ask(port, "p.test", "//api/me", &cookie);
    assert_eq!((a.status, a.header("location")), (308, Some("/api/me")));
    assert_eq!(a.cache(), None, "a redirect is not cached");
    // Nor do path parameters (an origin reading them serves /api/me).
    for target in ["/api/me", "/api/me", "/api;x/me", "/api;jsessionid=1/me"] {
        let a = ask(port, "p.test", target, &cookie);
        assert_eq!((a.status, a.cache()), (200, Some("BYPASS")), "{target}");
    }
    // A response setting a cookie: never stored, by default or under a
    // `ttl` rule.
    for path in ["/setcookie/page", "/setcookie/a.jpg"] {
        let first = ask(port, "p.test", path, &cookie);
        let second = ask(port, "p.test", path, &[]);
        assert_eq!(first.cache(), Some("MISS"), "{path}");
        assert_eq!(second.cache(), Some("MISS"), "{path}: {second:?}");
        assert_ne!(first.body, second.body, "{path}: served from the cache");
    }
    // Cache-Control private / no-store under a `ttl` rule: the rule sets
    // freshness, not publicness.
    for path in ["/account/private/x.jpg", "/account/nostore/x.jpg"] {
        let victim = ask(port, "p.test", path, &cookie);
        let other = ask(port, "p.test", path, &[]);
        assert_eq!(victim.status, 200);
        assert_eq!(other.cache(), Some("MISS"), "{path}: {other:?}");
        assert_ne!(
            victim.body, other.body,
            "{path}: the victim's answer was served"
        );
        assert_eq!(
            other.header("cache-control"),
            s.origin_cache_control(path).as_deref(),
            "{path}: the origin's Cache-Control reaches the viewer"
        );
    }
    // A public response under a `ttl` rule: cached for the rule's ttl,
    // whatever the origin's max-age=1 says.
    let first = ask(port, "p.test", "/pub/a.jpg", &[]);
    std::thread::sleep(Duration::from_millis(1500));
    let later = ask(port, "p.test", "/pub/a.jpg", &[]);
    assert_eq!((first.cache(), later.cache()), (Some("MISS"), Some("HIT")));
    assert_eq!(first.body, later.body);
    // A request with Authorization: neither read from nor written to the
    // cache.
    let auth = [("Authorization", "Bearer victim")];
    assert_eq!(
        ask(port, "p.test", "/pub/a.jpg", &auth).cache(),
        Some("BYPASS")
    );
    let a = ask(port, "p.test", "/page", &auth);
    assert_eq!(a.cache(), Some("BYPASS"));
    let b = ask(port, "p.test", "/page", &[]);
    assert_eq!(
        b.cache(),
        Some("MISS"),
        "the Authorization answer was stored"
    );
    assert_ne!(a.body, b.body);
}

impl Setup {
    fn origin_cache_control(&self, path: &str) -> Option<String> {
        if path.contains("/private/") {
            Some("private, max-age=600".into())
        } else if path.contains("/nostore/") {
            Some("no-store".into())
        } else {
            None
        }
    }
}

#[test]
fn redirects_built_from_the_path_stay_on_their_host() {
    let s = setup();
    let port = s.edge.process.port;
    for (raw, status, location) in [
        ("/shop@evil.com", 302, "https://shop.example.com/@evil.com"),
        ("/shop.evil.com", 302, "https://shop.example.com/.evil.com"),
        ("/shop/a?x=1", 302, "https://shop.example.com/a?x=1"),
        ("/old//evil.com", 308, "/old/evil.com"),
        ("/old/evil.com", 301, "/evil.com"),
    ] {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!(
            (a.status, a.header("location")),
            (status, Some(location)),
            "{raw}"
        );
    }
    let a = ask(port, "p.test", "/old/\\evil.com", &[]);
    assert_eq!((a.status, a.header("location")), (400, None));
    // `check` warns about the rule that could leave the host, at its line.
    let out = edgeform(s.repo.path(), &["check"]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = SITE
        .lines()
        .position(|l| l.contains("/shop,"))
        .map(|i| i + 1)
        .unwrap();
    let at = format!("sites/p.test.yaml:{line}:");
    assert!(
        text.lines()
            .any(|l| l.contains("open-redirect") && l.contains(&at))
            || text.contains(&at) && text.contains("open-redirect"),
        "{text}"
    );
}

#[test]
fn hotlink_and_waf_shapes_do_not_walk_around_their_checks() {
    let s = setup();
    let port = s.edge.process.port;
    let foreign = [("Referer", "https://leech.example/")];
    for raw in ["/a.jpg", "/a.jpg;x", "/a.jpg/", "/A.JPG;v=2/"] {
        let a = ask(port, "hot.test", raw, &foreign);
        assert_eq!((a.status, a.reason()), (403, Some("hotlink")), "{raw}");
    }
    let a = ask(port, "hot.test", "/a.jp%67", &foreign);
    assert_eq!((a.status, a.header("location")), (308, Some("/a.jpg")));
    assert_eq!(ask(port, "hot.test", "/a.jpg;x", &[]).status, 200);
    // An ext rule reads the same name.
    for raw in ["/db.bak", "/db.bak;x", "/db.bak/", "/admin;x", "/admin;x/y"] {
        let a = ask(port, "p.test", raw, &[]);
        assert_eq!((a.status, a.reason()), (403, Some("edge-rule")), "{raw}");
    }
    for (raw, reason) in [
        ("/?q=union/**/select", "waf-sqli"),
        ("/?q=union%09select", "waf-sqli"),
        ("/?q=UNION%250aSELECT", "waf-sqli"),
        ("/p?id=%2527%20or%20%25271%2527%3D%25271", "waf-sqli"),
        ("/p?id=1%20or%201%20=%201", "waf-sqli"),
        ("/?x=%3Cimg%20src=x%20onload%20=alert(1)%3E", "waf-xss"),
        ("/?x=%253Cscript%253E", "waf-xss"),
    ] {
        let a = ask(port, "waf.test", raw, &[]);
        assert_eq!((a.status, a.reason()), (403, Some(reason)), "{raw}");
    }
    for raw in ["/?q=reunion&select=1", "/?color=red", "/a%20b"] {
        assert_eq!(ask(port, "waf.test", raw, &[]).status, 200, "{raw}");
    }
}

#[test]
fn purge_of_a_path_removes_what_any_spelling_of_it_cached() {
    let s = setup();
    let port = s.edge.process.port;
    let files = |dir: &Path| walk(dir).into_iter().filter(|p| p.is_file()).count();
    // `//d/p.jpg` is answered with a redirect and caches nothing; what is
    // cached (an hour, the `.jpg` rule) is the normalised `/d/p.jpg`.
    let a = ask(port, "p.test", "//d/p.jpg", &[]);
    assert_eq!((a.status, a.header("location")), (308, Some("/d/p.jpg")));
    assert_eq!(files(&s.edge.cache_dir), 0);
    for url in ["/d/p.jpg", "/d/q.jpg", "/d/r.jpg"] {
        assert_eq!(ask(port, "p.test", url, &[]).cache(), Some("MISS"));
        assert_eq!(ask(port, "p.test", url, &[]).cache(), Some("HIT"));
    }
    assert_eq!(files(&s.edge.cache_dir), 3);
    let _agent = start_agent(s.redis.port, &s.edge.cache_dir);
    for (spelling, path) in [("//d/p.jpg", "/d/p.jpg"), ("/d/./x/../q.jpg", "/d/q.jpg")] {
        let out = edgeform(
            s.repo.path(),
            &[
                "purge", "--site", "p.test", "--url", spelling, "--wait", "20",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            ask(port, "p.test", path, &[]).cache(),
            Some("MISS"),
            "purge --url {spelling}"
        );
    }
    assert_eq!(
        ask(port, "p.test", "/d/r.jpg", &[]).cache(),
        Some("HIT"),
        "untouched"
    );
    // A path the edge refuses is refused by purge too, naming why.
    let out = edgeform(
        s.repo.path(),
        &["purge", "--site", "p.test", "--url", "/a\\b"],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("backslash"), "{}", stderr(&out));
}

/// The Lua normaliser (`edge/lua/edge_norm.lua`, plain LuaJIT) on the
/// vectors the Rust unit tests read, and on Rust's own answers.
#[test]
fn the_lua_normaliser_agrees_with_the_vectors_and_rust() {
    let root = harness::nginx::repo_root();
    let read = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(root.join("testdata/edge").join(name))
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let paths = read("paths.jsonl");
    let waf = read("waf.jsonl");
    let hex = |s: &str| -> String { s.bytes().map(|b| format!("{b:02x}")).collect() };
    // Lines in: `p <hex>` (canonical path and ext name) or `w <hex>` (WAF
    // text); lines out: hex answers, `!kind` for a refusal.
    let mut input = String::new();
    for v in &paths {
        input.push_str(&format!("p {}\n", hex(v["path"].as_str().unwrap())));
    }
    for v in &waf {
        input.push_str(&format!("w {}\n", hex(v["uri"].as_str().unwrap())));
    }
    let script = format!(
        "package.path = '{}/edge/lua/?.lua;' .. package.path\n\
         local norm = require 'edge_norm'\n\
         local function unhex(h) return (h:gsub('..', function(x) return string.char(tonumber(x, 16)) end)) end\n\
         local function tohex(s) return (s:gsub('.', function(c) return string.format('%02x', c:byte()) end)) end\n\
         for line in io.lines() do\n\
           local kind, h = line:match('^(%a) (%x*)$')\n\
           local text = unhex(h)\n\
           if kind == 'p' then\n\
             local c, err = norm.canonical_path(text)\n\
             print((c and tohex(c) or ('!' .. err)) .. ' ' .. tohex(norm.ext_subject(text)) .. ' ' .. tohex(norm.match_path(text)) .. ' ' .. (norm.is_plain(text) and 'plain' or '-'))\n\
           else print(tohex(norm.waf_text(text))) end\n\
         end\n",
        root.display()
    );
    let lua = crate::util::luajit_lines(&["-e", &script], input.as_bytes());
    assert_eq!(lua.len(), paths.len() + waf.len());
    for (v, got) in paths.iter().zip(&lua) {
        let path = v["path"].as_str().unwrap();
        let rust = match edgestate::edge::norm::canonical_path(path) {
            Ok(c) => hex(&c),
            Err(e) => format!("!{}", e.as_str()),
        };
        let want = match (v["canonical"].as_str(), v["refused"].as_str()) {
            (Some(c), _) => hex(c),
            (None, Some(k)) => format!("!{k}"),
            _ => panic!("{v}"),
        };
        let ext = hex(edgestate::edge::norm::ext_subject(path));
        let matched = hex(&edgestate::edge::norm::match_path(path));
        if let Some(m) = v["match"].as_str() {
            assert_eq!(matched, hex(m), "Rust on `{path}`");
        }
        // The Lua's fast path (no canonical_path at all) only where the
        // path is its own canonical form.
        let (got, plain) = got.rsplit_once(' ').unwrap();
        if plain == "plain" {
            assert_eq!(want, hex(path), "Lua's is_plain on `{path}`");
        }
        assert_eq!(got, format!("{want} {ext} {matched}"), "Lua on `{path}`");
        assert_eq!(rust, want, "Rust on `{path}`");
    }
    for (v, got) in waf.iter().zip(&lua[paths.len()..]) {
        let uri = v["uri"].as_str().unwrap();
        let rust = hex(&String::from_utf8_lossy(&edgestate::edge::norm::waf_text(
            uri,
        )));
        assert_eq!(got, &hex(v["text"].as_str().unwrap()), "Lua on `{uri}`");
        assert_eq!(&rust, got, "Rust on `{uri}`");
    }
}

/// `check` on rules that could send a viewer off the site, or that can
/// never match a normalised path: warnings, located at line and column.
#[test]
fn check_warns_about_redirects_off_the_host_and_unnormalised_rules() {
    let site = "host: a.example.com\norigin: http://192.0.2.1\n\
edge_rules:\n\
\x20 - {match_type: exact, match_value: /x, action: redirect, redirect_status: 302, redirect_to: \"//evil.example/\"}\n\
\x20 - {match_type: exact, match_value: /y, action: redirect, redirect_status: 302, redirect_to: \"https://a.example.com@evil.example/\"}\n\
\x20 - {match_type: prefix, match_value: /shop, action: redirect, redirect_status: 302, redirect_to: \"https://shop.example.com\"}\n\
\x20 - {match_type: prefix, match_value: /shop2/, action: redirect, redirect_status: 302, redirect_to: \"https://shop.example.com\"}\n\
\x20 - {match_type: prefix, match_value: /%61dmin, action: block}\n\
cache_rules:\n\
\x20 - {match_type: prefix, match_value: //api/, action: bypass}\n";
    let repo = Fixture::with(&[("sites/a.yaml", site)]);
    let checked = repo.check();
    assert!(checked.is_valid(), "warnings only");
    let found: Vec<(&str, u32, u32)> = checked
        .diagnostics
        .iter()
        .filter(|d| d.code == "open-redirect" || d.code == "non-canonical-match")
        .map(|d| (d.code, d.span.line, d.span.column))
        .collect();
    let codes: Vec<(&str, u32)> = found.iter().map(|(c, l, _)| (*c, *l)).collect();
    assert_eq!(
        codes,
        [
            ("open-redirect", 4),
            ("open-redirect", 5),
            ("open-redirect", 6),
            ("non-canonical-match", 8),
            ("non-canonical-match", 10),
        ],
        "{:?}",
        checked.diagnostics
    );
    assert!(found.iter().all(|(_, _, col)| *col > 1), "{found:?}");
    let out = edgeform(repo.path(), &["check"]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("sites/a.yaml:6:"), "{text}");
    assert!(text.contains("write `/admin`"), "{text}");
}

/// What the edge's (and the geo router's) Lua reads of a viewer's headers
/// costs time linear in their length: 1 MiB of hostile text (a long
/// `X-Forwarded-For` entry before the last comma, a long Referer user-info,
/// a run of spaces inside a cookie) takes milliseconds. A Lua pattern that
/// rescans (`"([^,]*)$"`, `"^(.-)%s*$"`) took 0.3–0.7 s per 8 KiB header
/// and would take hours here, so the generous limit below separates the
/// two by orders of magnitude; it is not a benchmark.
#[test]
fn hostile_header_text_costs_the_lua_linear_time() {
    let root = harness::nginx::repo_root();
    let script = format!(
        "package.path = '{}/roles/edge/lua/?.lua;' .. package.path\n\
         local ip = require 'edge_ip'\n\
         local decide = require 'edge_decide'\n\
         local n = 1024 * 1024\n\
         assert(ip.xff_last(string.rep('a', n) .. ', 81.2.69.142') == '81.2.69.142')\n\
         assert(ip.xff_last('a,' .. string.rep(' ', n) .. 'b' .. string.rep(' ', n)) == 'b')\n\
         assert(ip.xff_last(' 1.2.3.4 ') == '1.2.3.4' and ip.xff_last('a, ') == '')\n\
         assert(decide.url_host('https://' .. string.rep('a', n) .. '@shop.test/x') == 'shop.test')\n\
         assert(decide.url_host('https://u@v@shop.test') == 'shop.test')\n\
         local c = 'edge_clearance=a' .. string.rep(' ', n) .. 'b  '\n\
         assert(decide.cookie_value(c, 'edge_clearance') == 'a' .. string.rep(' ', n) .. 'b')\n\
         print('ok')\n",
        root.display()
    );
    let mut child = std::process::Command::new("luajit")
        .args(["-e", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the Lua took over 30 s on 1 MiB of header text: quadratic");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
