//! The reference edge (`edge/`) against `edgeform explain`: the real nginx
//! with its Lua module, in front of real loopback origins, fed by a real
//! `edgeform apply` into a real Redis.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::nginx::{Edge, EdgeOptions};

use crate::util::{Agent, Fixture, edgeform, stderr};

pub(super) const SECRET: &str = "differential-secret";

// ------------------------------------------------------------ the origin

/// What an origin saw: test id → (Host header, method).
pub(super) type Hits = Arc<Mutex<BTreeMap<u64, (String, String)>>>;

/// A loopback HTTP origin recording every request's `X-Test-Id`.
pub(super) struct Origin {
    pub(super) port: u16,
    pub(super) hits: Hits,
}

pub(super) fn origin() -> Origin {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits: Hits = Arc::default();
    let h = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let h = h.clone();
            std::thread::spawn(move || serve_origin(stream, &h));
        }
    });
    Origin { port, hits }
}

fn serve_origin(mut s: TcpStream, hits: &Hits) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    loop {
        let Some((head, body_len)) = read_head(&mut s) else {
            return;
        };
        let mut body = vec![0; body_len];
        if s.read_exact(&mut body).is_err() {
            return;
        }
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let method = request_line
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_owned();
        let mut host = String::new();
        let mut id = None;
        for l in lines {
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("host") {
                    host = v.trim().to_owned();
                } else if k.eq_ignore_ascii_case("x-test-id") {
                    id = v.trim().parse::<u64>().ok();
                }
            }
        }
        if let Some(id) = id {
            hits.lock().unwrap().insert(id, (host, method.clone()));
        }
        let payload = "hello from the origin\n";
        let reply = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{}",
            payload.len(),
            if method == "HEAD" { "" } else { payload }
        );
        if s.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// Read up to the blank line; (head, Content-Length).
pub(super) fn read_head(s: &mut TcpStream) -> Option<(String, usize)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
        if buf.len() > 65536 {
            return None;
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    Some((head, len))
}

// ------------------------------------------------------------ the client

/// One request of the differential test (also a line of `explain --batch`).
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Req {
    pub(super) id: u64,
    pub(super) host: String,
    pub(super) url: String,
    pub(super) ip: String,
    pub(super) method: String,
    pub(super) headers: BTreeMap<String, String>,
    /// `https` (absent: http).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) scheme: Option<String>,
    /// The TLS server name (`""`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) sni: Option<String>,
    /// The PROXY header's address (`ip` is then the router).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) proxy: Option<String>,
}

#[derive(Debug, Default, Clone)]
pub(super) struct Resp {
    pub(super) status: u16,
    pub(super) headers: BTreeMap<String, String>,
}

impl Resp {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

fn send(port: u16, r: &Req) -> Resp {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut text = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nX-Test-Id: {}\r\n",
        r.method, r.url, r.host, r.id
    );
    for (k, v) in &r.headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    if r.method == "POST" {
        text.push_str("Content-Length: 2\r\n\r\nhi");
    } else {
        text.push_str("\r\n");
    }
    s.write_all(text.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Resp { status, headers }
}

// ------------------------------------------------------------ the repository

pub(super) fn node_yaml(redis_port: u16, cache_dir: &Path) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{redis_port}\"}}\n\
         cache:\n  dirs: [\"{}\"]\n  levels: \"1:2\"\n  key: $scheme://$host$request_uri\n",
        cache_dir.display()
    )
}

/// Sites covering every field and mode; `a` and `b` are the two origins.
pub(super) fn sites(a: u16, b: u16) -> Vec<(String, String)> {
    let oa = format!("origin: http://127.0.0.1:{a}\nloopback: true\n");
    let ob = format!("origin: http://127.0.0.1:{b}\nloopback: true\n");
    let rules = "cache_rules:\n\
        \x20 - {match_type: ext, match_value: .mp4, action: ttl, ttl: 3600}\n\
        \x20 - {match_type: prefix, match_value: /api/, action: bypass}\n\
        \x20 - {match_type: exact, match_value: /robots.txt, action: ttl, ttl: 60}\n\
        \x20 - {match_type: regex, match_value: \"^/v[0-9]+/\", action: bypass}\n\
        edge_rules:\n\
        \x20 - {match_type: prefix, match_value: /old/, action: redirect, redirect_status: 301}\n\
        \x20 - {match_type: prefix, match_value: /v1/, action: redirect, redirect_status: 302, redirect_to: /v2/}\n\
        \x20 - {match_type: exact, match_value: /gone, action: block}\n\
        \x20 - {match_type: regex, match_value: \"\\\\.php$\", action: block}\n\
        \x20 - {match_type: ext, match_value: .bak, action: redirect, redirect_status: 308, redirect_to: \"https://archive.test/\"}\n\
        \x20 - {match_type: prefix, match_value: /shop, action: redirect, redirect_status: 302, redirect_to: \"https://shop.example.com\"}\n";
    let list: Vec<(&str, String)> = vec![
        ("plain.test", format!("{oa}aliases: [www.plain.test]\n")),
        ("nocache.test", format!("{ob}cached: false\n")),
        ("rules.test", format!("{oa}{rules}")),
        (
            "geoblock.test",
            format!("{ob}geo_mode: block\ngeo_codes: [CN, RU]\n"),
        ),
        (
            "geoallow.test",
            format!("{oa}geo_mode: allow\ngeo_codes: [GB, SE]\n"),
        ),
        (
            "ipallow.test",
            format!(
                "{ob}ip_mode: allow\nip_list: [81.2.69.0/24, \"2001:480::/32\", 127.0.0.1/32]\n"
            ),
        ),
        (
            "ipblock.test",
            format!("{oa}ip_mode: block\nip_list: [175.16.199.0/24, 10.0.0.0/8]\n"),
        ),
        ("wafdetect.test", format!("{ob}waf_mode: detect\n")),
        ("wafstrict.test", format!("{oa}waf_mode: strict\n")),
        ("corsperm.test", format!("{ob}cors_mode: permissive\n")),
        ("corsstrict.test", format!("{oa}cors_mode: strict\n")),
        ("hotlink.test", format!("{ob}hotlink_mode: block\n")),
        (
            "strict.test",
            format!("{oa}rate_mode: strict\ncors_mode: permissive\n"),
        ),
        ("normal.test", format!("{ob}rate_mode: normal\n")),
        ("suspended.test", format!("{oa}suspended: true\n")),
        ("\"*.wild.test\"", format!("{ob}cached: true\n")),
        (
            "everything.test",
            format!(
                "{oa}geo_mode: block\ngeo_codes: [CN]\nip_mode: block\nip_list: [10.0.0.0/8]\n\
                 waf_mode: strict\ncors_mode: strict\nhotlink_mode: block\nrate_mode: normal\n{rules}"
            ),
        ),
    ];
    list.into_iter()
        .map(|(host, rest)| {
            let file = format!("sites/{}.yaml", host.trim_matches('"').replace('*', "star"));
            (file, format!("host: {host}\n{rest}"))
        })
        .collect()
}

struct Setup {
    repo: Fixture,
    redis: harness::Process,
    edge: Edge,
    a: Origin,
    b: Origin,
}

fn setup(workers: u32) -> Setup {
    let redis = harness::redis(&[]);
    let (a, b) = (origin(), origin());
    let cache = tempfile::tempdir().unwrap().keep();
    let repo = Fixture::empty();
    repo.write(
        "cluster.yaml",
        b"name: test\ntrusted_proxies: [127.0.0.1/32]\n",
    );
    repo.write(
        "nodes/edge-1.yaml",
        node_yaml(redis.port, &cache).as_bytes(),
    );
    for (file, text) in sites(a.port, b.port) {
        repo.write(&file, text.as_bytes());
    }
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let mut o = EdgeOptions::new(redis.port);
    o.cache_dir = Some(cache);
    o.challenge_secret = SECRET.into();
    o.workers = workers;
    let edge = harness::nginx::edge(&o);
    Setup {
        repo,
        redis,
        edge,
        a,
        b,
    }
}

/// A seeded xorshift: the same requests every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[(self.next() % v.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const HOSTS: &[&str] = &[
    "plain.test",
    "www.plain.test",
    "PLAIN.test:8080",
    "nocache.test",
    "rules.test",
    "geoblock.test",
    "geoallow.test",
    "ipallow.test",
    "ipblock.test",
    "wafdetect.test",
    "wafstrict.test",
    "corsperm.test",
    "corsstrict.test",
    "hotlink.test",
    "strict.test",
    "normal.test",
    "suspended.test",
    "a.wild.test",
    "b.wild.test",
    "everything.test",
    "unknown.test",
    // nginx's `$host`: case, one trailing dot and everything from the
    // first `:` dropped; `..` refused (400).
    "RULES.TEST.",
    "plain.test:80:90",
    "Hotlink.Test.",
    "everything.test.:8080",
    "rules..test",
];

const PATHS: &[&str] = &[
    "/",
    "/index.html",
    "/a.mp4",
    "/media/b.MP4",
    "/img/x.jpg",
    "/old/page?x=1",
    "/old/",
    "/v1/users?id=7",
    "/v3/thing",
    "/api/q",
    "/robots.txt",
    "/gone",
    "/x.php",
    "/file.bak?y=2",
    "/..%2f..%2fetc/passwd",
    "/a/b/..%2f..%2fetc/passwd",
    "/a/b/c/../../x.jpg",
    "/?q=1+union+select+1",
    "/search?q=%3Cscript%3E",
    "/p?id=1%27%20or%20%271%27%3D%271",
    "/fonts/a.woff2",
    // One normalised path: other spellings are redirected to it (308),
    // what nginx or the edge refuses is 400.
    "//gone",
    "/./gone",
    "/%67one",
    "/x/../gone",
    "/a/..%00/x",
    "/a%zz",
    "/a%2Fb",
    "/x/..%2Fgone",
    "/%2fgone",
    "/gone%2Fx",
    "/x/..%5cgone",
    "/gone%5C",
    "/old/%5C%5Cevil.com",
    "/x%252Fgone",
    "/a\\b",
    "/a#b",
    "/x%2Fy/../..",
    "/caf%c3%a9",
    "/img/x.jp%67",
    "/img/x.jpg;x",
    "/img/x.jpg/",
    "/a.bak;x",
    "/old//evil.com",
    "/old/\\evil.com",
    "/shop@evil.com",
    "/shop.evil.com",
    "//api/q",
    "/%2e/api/q",
    "/api;x/q",
    "/gone;x",
    "/old;v=1/a",
    "/v1;x/users",
    "/;/gone",
    "/.;/gone",
    "/x/..;/gone",
    "/%2e;/gone",
    "/old/;/;/evil.com",
    "/gone/;jsessionid=1",
    "/;jsessionid=1",
    "/?q=union/**/select",
    "/?q=union%09select",
    "/s?q=%3Cimg%20onload%20%3D1%3E",
    "/p?id=%2527%20or%20%25271%2527%3D%25271",
];

const CLIENTS: &[&str] = &[
    "81.2.69.142",
    "89.160.20.128",
    "175.16.199.1",
    "216.160.83.57",
    "2001:480:10::1",
    "2a02:cf40::1",
    "8.8.8.8",
    "10.1.2.3",
    "::ffff:81.2.69.142",
];

pub(super) fn generate(n: u64) -> Vec<Req> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut per_client: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut out = Vec::new();
    for id in 0..n {
        let host = (*rng.pick(HOSTS)).to_owned();
        let mut url = (*rng.pick(PATHS)).to_owned();
        if rng.chance(30) {
            url.push_str(if url.contains('?') { "&n=" } else { "?n=" });
            url.push_str(&(id % 50).to_string());
        }
        let method = (*rng.pick(&[
            "GET", "GET", "GET", "GET", "GET", "HEAD", "POST", "OPTIONS", "DELETE", "PROPFIND",
            "get", "Get",
        ]))
        .to_owned();
        let mut headers = BTreeMap::new();
        // The client: a MaxMind test address, a random one, or the peer.
        let mut client = if rng.chance(15) {
            None
        } else if rng.chance(70) {
            Some((*rng.pick(CLIENTS)).to_owned())
        } else {
            Some(format!(
                "{}.{}.{}.{}",
                1 + rng.next() % 220,
                rng.next() % 256,
                rng.next() % 256,
                1 + rng.next() % 254
            ))
        };
        // Keep every client under its rate limit (tested on its own).
        let site_of = host.to_ascii_lowercase();
        let key = (site_of, client.clone().unwrap_or_else(|| "peer".into()));
        let seen = per_client.entry(key).or_insert(0);
        *seen += 1;
        if *seen > 6 {
            client = Some(format!("198.{}.100.{}", 18 + (id / 250) % 2, 1 + id % 250));
        }
        if let Some(c) = &client {
            let xff = if rng.chance(10) {
                format!("203.0.113.9, {c}")
            } else {
                c.clone()
            };
            headers.insert("X-Forwarded-For".into(), xff);
        } else if rng.chance(20) {
            // Malformed for both: the edge's Lua trims ASCII whitespace only.
            let bad = *rng.pick(&[
                "not-an-ip",
                "81.2.69.142\u{a0}",
                "81.2.69.142\u{2003}",
                "89.160.20.128\u{85}",
                "175.16.199.1\u{3000}",
            ]);
            headers.insert("X-Forwarded-For".into(), bad.into());
        }
        if rng.chance(5) {
            headers.insert("Authorization".into(), "Bearer differential".into());
        }
        let bare = host
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        match rng.next() % 5 {
            0 => {
                headers.insert("Referer".into(), format!("https://{bare}/page"));
            }
            1 => {
                headers.insert("Referer".into(), "https://hotlinker.example/x".into());
            }
            2 => {
                headers.insert("Referer".into(), format!("http://cdn.{bare}/"));
            }
            _ => {}
        }
        match rng.next() % 5 {
            0 => {
                headers.insert("Origin".into(), format!("https://{bare}"));
            }
            1 => {
                headers.insert("Origin".into(), "https://evil.example".into());
            }
            2 => {
                headers.insert("Origin".into(), "null".into());
            }
            _ => {}
        }
        if method == "OPTIONS" && rng.chance(70) {
            headers.insert("Access-Control-Request-Method".into(), "PUT".into());
        }
        if bare == "strict.test" {
            let ip: IpAddr = client.as_deref().unwrap_or("127.0.0.1").parse().unwrap();
            match rng.next() % 4 {
                0 => {
                    let token = edgestate::edge::clearance_token(
                        SECRET.as_bytes(),
                        "strict.test",
                        ip,
                        4_000_000_000,
                    );
                    headers.insert("Cookie".into(), format!("a=1; edgeform_clearance={token}"));
                }
                1 => {
                    headers.insert(
                        "Cookie".into(),
                        "edgeform_clearance=4000000000.0123456789abcdef0123456789abcdef01234567"
                            .into(),
                    );
                }
                2 => {
                    // The page's nonce sent back without the work (a
                    // scraper), or with a counter that may not do it.
                    let nonce = edgestate::edge::challenge_nonce(
                        SECRET.as_bytes(),
                        "strict.test",
                        ip,
                        4_000_000_000,
                    );
                    let value = if rng.chance(50) {
                        nonce
                    } else {
                        format!("{nonce}.{}", rng.next() % 1000)
                    };
                    headers.insert("Cookie".into(), format!("edgeform_clearance={value}"));
                }
                _ => {}
            }
        }
        out.push(Req {
            id,
            host,
            url,
            ip: "127.0.0.1".into(),
            method,
            headers,
            scheme: None,
            sni: None,
            proxy: None,
        });
    }
    out
}

pub(super) fn explain_batch(repo: &Path, reqs: &[Req]) -> Vec<serde_json::Value> {
    explain_batch_in(repo, None, reqs)
}

/// [`explain_batch`] with the certificates of the state directory `state`.
pub(super) fn explain_batch_in(
    repo: &Path,
    state: Option<&Path>,
    reqs: &[Req],
) -> Vec<serde_json::Value> {
    let file = repo.join("requests.jsonl");
    let text: String = reqs
        .iter()
        .map(|r| format!("{}\n", serde_json::to_string(r).unwrap()))
        .collect();
    std::fs::write(&file, text).unwrap();
    let geoip = harness::nginx::repo_root().join("testdata/geoip/GeoLite2-City-Test.mmdb");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"));
    cmd.args(["explain", "--batch"])
        .arg(&file)
        .arg("--geoip")
        .arg(&geoip)
        .current_dir(repo)
        .env("EDGEFORM_CHALLENGE_SECRET", SECRET);
    if let Some(state) = state {
        cmd.env("EDGEFORM_STATE_DIR", state);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "explain: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Compare one observed answer with explain's decision; `None` = agree.
/// `origins`: the two origins the sites proxy to; `scheme`: the cache
/// key's first part.
pub(super) fn compare(
    origins: (&Origin, &Origin),
    scheme: &str,
    r: &Req,
    got: &Resp,
    want: &serde_json::Value,
    cached_keys: &mut BTreeSet<String>,
) -> Option<String> {
    let mut problems = Vec::new();
    let status = want["status"].as_u64().unwrap_or(0);
    if u64::from(got.status) != status {
        problems.push(format!("status {} ≠ explain {status}", got.status));
    }
    if got.header("location") != want["location"].as_str() {
        problems.push(format!(
            "Location {:?} ≠ explain {:?}",
            got.header("location"),
            want["location"]
        ));
    }
    let verdict = want["verdict"].as_str().unwrap_or_default();
    let reason = want["reason"].as_str();
    // nginx's own 400 comes before the edge's Lua: no reason header.
    let want_reason = if verdict == "proxy" || reason == Some("bad-request") {
        None
    } else {
        reason
    };
    if got.header("x-edgeform-reason") != want_reason {
        problems.push(format!(
            "X-Edgeform-Reason {:?} ≠ explain {want_reason:?}",
            got.header("x-edgeform-reason")
        ));
    }
    // WAF detect/strict: the matched rules.
    let want_waf = want["waf"].as_array().map(|v| {
        v.iter()
            .filter_map(|x| x.as_str())
            .collect::<Vec<_>>()
            .join(",")
    });
    if got.header("x-edgeform-waf").map(str::to_owned) != want_waf {
        problems.push(format!(
            "X-Edgeform-Waf {:?} ≠ explain {want_waf:?}",
            got.header("x-edgeform-waf")
        ));
    }
    // Cache status and the origin hit.
    let host = edgestate::edge::normalize_host(&r.host);
    let cache_key = format!("{scheme}{host}{}", r.url);
    let cacheable_method = r.method == "GET" || r.method == "HEAD";
    let expect_cache = match verdict {
        "proxy" if !cacheable_method => None,
        "proxy" if want["cache"]["cached"] == true => Some(if cached_keys.contains(&cache_key) {
            "HIT"
        } else {
            "MISS"
        }),
        "proxy" => Some("BYPASS"),
        _ => None,
    };
    if got.header("x-cache-status") != expect_cache {
        problems.push(format!(
            "X-Cache-Status {:?} ≠ expected {expect_cache:?}",
            got.header("x-cache-status")
        ));
    }
    if expect_cache == Some("MISS") {
        cached_keys.insert(cache_key);
    }
    let (a, b) = origins;
    let hit_a = a.hits.lock().unwrap().get(&r.id).cloned();
    let hit_b = b.hits.lock().unwrap().get(&r.id).cloned();
    let expect_origin = (verdict == "proxy" && expect_cache != Some("HIT")).then(|| {
        (
            want["origin"].as_str().unwrap_or_default().to_owned(),
            want["origin_host"].as_str().unwrap_or_default().to_owned(),
        )
    });
    let observed = match (&hit_a, &hit_b) {
        (Some((h, _)), None) => Some((format!("http://127.0.0.1:{}", a.port), h.clone())),
        (None, Some((h, _))) => Some((format!("http://127.0.0.1:{}", b.port), h.clone())),
        (None, None) => None,
        _ => Some(("both origins".into(), String::new())),
    };
    if observed != expect_origin {
        problems.push(format!(
            "origin hit {observed:?} ≠ explain {expect_origin:?}"
        ));
    }
    (!problems.is_empty()).then(|| {
        format!(
            "request {} {} {} {:?}: {}\n    explain: {}",
            r.method,
            r.host,
            r.url,
            r.headers,
            problems.join("; "),
            want
        )
    })
}

#[test]
fn explain_equals_the_edge() {
    let s = setup(2);
    // The workers read the generation in their first 200 ms.
    std::thread::sleep(Duration::from_millis(400));
    let reqs = generate(1500);
    let decisions = explain_batch(s.repo.path(), &reqs);
    assert_eq!(decisions.len(), reqs.len());
    let mut cached_keys = BTreeSet::new();
    let mut disagreements = Vec::new();
    let mut verdicts: BTreeMap<String, u32> = BTreeMap::new();
    let mut reasons = BTreeSet::new();
    for (r, want) in reqs.iter().zip(&decisions) {
        assert_eq!(want["id"], r.id);
        reasons.insert(want["reason"].as_str().unwrap_or_default().to_owned());
        let got = send(s.edge.process.port, r);
        *verdicts
            .entry(want["verdict"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
        if let Some(p) = compare((&s.a, &s.b), "http", r, &got, want, &mut cached_keys) {
            eprintln!("DISAGREE {p}");
            disagreements.push(p);
        }
    }
    eprintln!(
        "differential: {} requests, {} disagreements, verdicts {verdicts:?}",
        reqs.len(),
        disagreements.len()
    );
    for v in [
        "proxy",
        "redirect",
        "blocked",
        "challenged",
        "not_found",
        "suspended",
        "preflight",
    ] {
        assert!(
            verdicts.get(v).copied().unwrap_or(0) > 0,
            "no {v} verdict generated"
        );
    }
    // The hostile shapes are exercised, not only generated.
    for r in [
        "bad-request",
        "bad-path",
        "non-canonical-path",
        "hotlink",
        "waf-sqli",
        "waf-xss",
        "edge-rule",
    ] {
        assert!(
            reasons.contains(r),
            "no `{r}` answer generated: {reasons:?}"
        );
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} requests disagree (first: {})\n{}",
        disagreements.len(),
        reqs.len(),
        disagreements[0],
        s.edge.error_log()
    );
    let _ = &s.redis;
}

fn get(port: u16, host: &str, url: &str, headers: &[(&str, &str)]) -> Resp {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1_000_000);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    send(
        port,
        &Req {
            id,
            host: host.into(),
            url: url.into(),
            ip: "127.0.0.1".into(),
            method: "GET".into(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            scheme: None,
            sni: None,
            proxy: None,
        },
    )
}

fn get_body(port: u16, host: &str, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut text = format!("GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    s.write_all(text.as_bytes()).unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, raw)
}

#[test]
fn an_apply_changes_the_answer_within_a_second_without_reload() {
    let s = setup(2);
    let port = s.edge.process.port;
    let london = [("X-Forwarded-For", "81.2.69.142")];
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(get(port, "plain.test", "/", &london).status, 200);
    let master = s.edge.process.pid();
    let workers = s.edge.worker_pids();
    assert_eq!(workers.len(), 2, "{workers:?}");
    // The pull request: a geo block on GB.
    let text = format!(
        "host: plain.test\naliases: [www.plain.test]\norigin: http://127.0.0.1:{}\nloopback: true\n\
         geo_mode: block\ngeo_codes: [GB]\n",
        s.a.port
    );
    s.repo.write("sites/plain.test.yaml", text.as_bytes());
    let out = edgeform(s.repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let applied = Instant::now();
    let mut changed = None;
    while applied.elapsed() < Duration::from_secs(3) {
        let r = get(port, "plain.test", "/", &london);
        if r.status == 403 {
            assert_eq!(r.header("x-edgeform-reason"), Some("geo-blocked"));
            changed = Some(applied.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let changed = changed.expect("the edge still answers 200 three seconds after the apply");
    eprintln!("freshness: the edge answered the new document {changed:?} after apply returned");
    assert!(changed < Duration::from_secs(1), "{changed:?}");
    // Every worker sees it (each polls on its own) within the bound the
    // docs give (< 1 s): 20 answers, all 403. Not at once: the other
    // worker may not have polled yet, and www.plain.test was read (by the
    // warm at start) in the old generation, as any host a viewer asked
    // for before the apply.
    if let Some(rest) = Duration::from_secs(1).checked_sub(applied.elapsed()) {
        std::thread::sleep(rest);
    }
    for _ in 0..20 {
        assert_eq!(get(port, "www.plain.test", "/", &london).status, 403);
    }
    assert_eq!(s.edge.process.pid(), master);
    assert_eq!(s.edge.worker_pids(), workers, "a worker was replaced");
    assert!(
        !s.edge.error_log().contains("reconfiguring"),
        "nginx reloaded"
    );
}

// Bad documents.
#[test]
fn bad_documents_fail_alone_and_are_logged_once_per_generation() {
    let s = setup(1);
    let port = s.edge.process.port;
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", s.redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let good: String = redis::cmd("GET")
        .arg("site:plain.test")
        .query(&mut con)
        .unwrap();
    let bad = [
        ("missing.test", good.replace(r#""cached":true,"#, "")),
        (
            "wrongtype.test",
            good.replace(r#""cached":true"#, r#""cached":"yes""#),
        ),
        (
            "badmode.test",
            good.replace(r#""waf_mode":"off""#, r#""waf_mode":"paranoid""#),
        ),
        ("notjson.test", "{not json".to_owned()),
    ];
    for (host, text) in &bad {
        let _: () = redis::cmd("SET")
            .arg(format!("site:{host}"))
            .arg(text)
            .query(&mut con)
            .unwrap();
    }
    for _ in 0..3 {
        for (host, _) in &bad {
            let r = get(port, host, "/", &[]);
            assert_eq!(
                (r.status, r.header("x-edgeform-reason")),
                (502, Some("bad-document")),
                "{host}"
            );
        }
        assert_eq!(get(port, "plain.test", "/", &[]).status, 200);
    }
    let log = s.edge.error_log();
    for (host, _) in &bad {
        let n = log
            .matches(&format!("site:{host} is a bad document"))
            .count();
        assert_eq!(n, 1, "{host} logged {n} times:\n{log}");
    }
    assert!(log.contains("site:missing.test is a bad document: document.cached: missing"));
    assert!(log.contains("unknown mode `paranoid`"));
    // Explain agrees on what a bad document is.
    for (_, text) in &bad {
        assert!(edgestate::edge::Site::parse(text).is_err());
    }
}

// Version skew: listed newer fields.
#[test]
fn listed_newer_fields_are_skipped_and_any_other_unknown_field_is_a_bad_document() {
    let s = setup(1);
    let port = s.edge.process.port;
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", s.redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let good: String = redis::cmd("GET")
        .arg("site:plain.test")
        .query(&mut con)
        .unwrap();
    let with = |extra: &str| good.replacen('{', &format!("{{{extra},"), 1);
    let docs = [
        (
            "skipped.test",
            with(r#""a_newer_field":{"x":1},"skippable":["a_newer_field"]"#),
        ),
        ("unlisted.test", with(r#""a_newer_field":1"#)),
        (
            "mixed.test",
            with(r#""a_newer_field":1,"another":2,"skippable":["a_newer_field"]"#),
        ),
        (
            "limited.test",
            with(r#""max_body_size":1,"skippable":["max_body_size"]"#),
        ),
    ];
    for (host, text) in &docs {
        let _: () = redis::cmd("SET")
            .arg(format!("site:{host}"))
            .arg(text)
            .query(&mut con)
            .unwrap();
    }
    let post = |host: &str| {
        send(
            port,
            &Req {
                id: 7,
                host: host.into(),
                url: "/".into(),
                ip: "127.0.0.1".into(),
                method: "POST".into(),
                headers: BTreeMap::new(),
                scheme: None,
                sni: None,
                proxy: None,
            },
        )
    };
    for _ in 0..3 {
        assert_eq!(get(port, "skipped.test", "/", &[]).status, 200);
        for host in ["unlisted.test", "mixed.test"] {
            let r = get(port, host, "/", &[]);
            assert_eq!(
                (r.status, r.header("x-edgeform-reason")),
                (502, Some("bad-document")),
                "{host}"
            );
        }
        // Listing a field this edge reads changes nothing: it restricts.
        let r = post("limited.test");
        assert_eq!(
            (r.status, r.header("x-edgeform-reason")),
            (413, Some("body-too-large"))
        );
        assert_eq!(post("skipped.test").status, 200);
    }
    let log = s.edge.error_log();
    let skipped = "site:skipped.test skips field(s) this edge's code does not read: a_newer_field";
    assert_eq!(log.matches(skipped).count(), 1, "{log}");
    assert!(!log.contains("site:limited.test skips"), "{log}");
    assert!(
        log.contains(
            "site:unlisted.test is a bad document: document: unknown field `a_newer_field`"
        )
    );
    assert!(log.contains("site:mixed.test is a bad document: document: unknown field `another`"));
    // Explain (the Rust twin) agrees.
    assert!(edgestate::edge::Site::parse(&docs[0].1).is_ok());
    assert!(edgestate::edge::Site::parse(&docs[1].1).is_err());
    assert!(edgestate::edge::Site::parse(&docs[2].1).is_err());
}

// `rate_mode` and the challenge.
#[test]
fn rate_limits_cors_and_the_challenge_cookie() {
    let s = setup(1);
    let port = s.edge.process.port;
    std::thread::sleep(Duration::from_millis(300));
    // normal: 20/s, burst 40 per client.
    let client = [("X-Forwarded-For", "89.160.20.128")];
    let statuses: Vec<u16> = (0..70)
        .map(|_| get(port, "normal.test", "/r", &client).status)
        .collect();
    assert!(statuses[..40].iter().all(|&c| c == 200), "{statuses:?}");
    let limited = get(port, "normal.test", "/r", &client);
    assert_eq!(limited.status, 429, "{statuses:?}");
    assert_eq!(limited.header("x-edgeform-reason"), Some("rate-limited"));
    assert_eq!(limited.header("retry-after"), Some("1"));
    // Another client is not affected.
    assert_eq!(
        get(
            port,
            "normal.test",
            "/r",
            &[("X-Forwarded-For", "81.2.69.142")]
        )
        .status,
        200
    );
    // CORS headers (docs/edge.md): permissive `*`; strict echoes a
    // same-site Origin; a preflight is answered by the edge.
    let r = get(
        port,
        "corsperm.test",
        "/c",
        &[("Origin", "https://a.example")],
    );
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = get(
        port,
        "corsstrict.test",
        "/c",
        &[("Origin", "https://app.corsstrict.test")],
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.corsstrict.test")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    let r = get(port, "plain.test", "/c", &[("Origin", "https://a.example")]);
    assert_eq!(r.header("access-control-allow-origin"), None);
    // strict: a naive client gets the challenge page and no cookie.
    let (status, page) = get_body(port, "strict.test", "/", &client);
    assert_eq!(status, 403);
    assert!(page.contains("X-Edgeform-Reason: challenge"), "{page}");
    assert!(!page.to_ascii_lowercase().contains("set-cookie"), "{page}");
    // The page carries a nonce and the difficulty, not a clearance.
    let nonce = page
        .split("var nonce=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap();
    assert!(
        page.contains(&format!("bits={}", edgestate::edge::CHALLENGE_BITS)),
        "{page}"
    );
    // A scraper sending the nonce back without the work is refused, and so
    // is a counter that does not do it.
    let viewer: IpAddr = "89.160.20.128".parse().unwrap();
    let no_work = (0..)
        .map(|k| format!("{nonce}.{k}"))
        .find(|v| !edgestate::edge::clearance_valid(SECRET.as_bytes(), "strict.test", viewer, 0, v))
        .unwrap();
    for lazy in [nonce.to_owned(), no_work, format!("{nonce}.")] {
        let scraped = format!("edgeform_clearance={lazy}");
        let r = get(
            port,
            "strict.test",
            "/",
            &[("X-Forwarded-For", "89.160.20.128"), ("Cookie", &scraped)],
        );
        assert_eq!(
            (r.status, r.header("x-edgeform-reason")),
            (403, Some("challenge")),
            "{lazy}"
        );
    }
    // A browser runs the script: the proof of work, solved here in Rust.
    let cookie = format!(
        "edgeform_clearance={}",
        edgestate::edge::solve_challenge(nonce)
    );
    let browser = [
        ("X-Forwarded-For", "89.160.20.128"),
        ("Cookie", cookie.as_str()),
    ];
    let statuses: Vec<u16> = (0..30)
        .map(|_| get(port, "strict.test", "/", &browser).status)
        .collect();
    assert!(statuses[..10].iter().all(|&c| c == 200), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    // Only ASCII whitespace around a cookie is dropped: a solved value
    // followed by U+00A0 is refused, by the edge and by explain alike.
    let nbsp = format!("{cookie}\u{a0}");
    let r = get(
        port,
        "strict.test",
        "/",
        &[("X-Forwarded-For", "89.160.20.128"), ("Cookie", &nbsp)],
    );
    assert_eq!(
        (r.status, r.header("x-edgeform-reason")),
        (403, Some("challenge"))
    );
    let said = explain_batch(
        s.repo.path(),
        &[Req {
            id: 1,
            host: "strict.test".into(),
            url: "/".into(),
            ip: "127.0.0.1".into(),
            method: "GET".into(),
            headers: [
                ("X-Forwarded-For".to_owned(), "89.160.20.128".to_owned()),
                ("Cookie".to_owned(), nbsp.clone()),
            ]
            .into(),
            scheme: None,
            sni: None,
            proxy: None,
        }],
    );
    assert_eq!(said[0]["status"], 403, "{}", said[0]);
    // The cookie is bound to the client: another address is challenged.
    let elsewhere = [
        ("X-Forwarded-For", "81.2.69.142"),
        ("Cookie", cookie.as_str()),
    ];
    assert_eq!(get(port, "strict.test", "/", &elsewhere).status, 403);
}

// Redis down: last known documents.
#[test]
fn redis_down_serves_the_last_known_documents() {
    let mut s = setup(1);
    let port = s.edge.process.port;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(port, "plain.test", "/x", &[]).status, 200);
    let t = Instant::now();
    while !s.edge.error_log().contains("warmed the shared cache") {
        assert!(t.elapsed() < Duration::from_secs(10), "no warm");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.redis.kill();
    std::thread::sleep(Duration::from_millis(500));
    let r = get(port, "plain.test", "/y", &[]);
    assert_eq!(r.status, 200, "known document after Redis died");
    // A site the edge warmed at start and no request read: served.
    assert_eq!(get(port, "nocache.test", "/", &[]).status, 200);
    // A host with no document it could have read, no API configured: a
    // defined error, fast.
    let t = Instant::now();
    let r = get(port, "unknown.test", "/", &[]);
    assert_eq!(
        (r.status, r.header("x-edgeform-reason")),
        (503, Some("control-plane-unreachable"))
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // The one worker says so once for the outage, not at each of its polls
    // (five a second), and once when Redis is back.
    std::thread::sleep(Duration::from_millis(1200));
    let said = |what: &str| {
        s.edge
            .error_log()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    };
    let down = "redis unreachable, serving last known documents";
    assert_eq!(said(down), 1, "{}", s.edge.error_log());
    s.redis.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    while said("redis reachable again") == 0 {
        assert!(Instant::now() < deadline, "{}", s.edge.error_log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(said(down), 1, "{}", s.edge.error_log());
    assert_eq!(get(port, "plain.test", "/z", &[]).status, 200);
}

// The Lua gate, and nginx -t in a scratch prefix.
#[test]
fn lua_gate_names_a_broken_file_that_nginx_t_passes() {
    let root = harness::nginx::repo_root();
    let gate = root.join("scripts/lua-gate");
    let ok = std::process::Command::new(&gate)
        .arg(root.join("edge/lua"))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // A broken copy is caught, naming file:line.
    let tmp = tempfile::tempdir().unwrap();
    let lua = tmp.path().join("lua");
    std::fs::create_dir(&lua).unwrap();
    for f in std::fs::read_dir(root.join("edge/lua")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, lua.join(f.file_name().unwrap())).unwrap();
    }
    let broken = lua.join("edge_decide.lua");
    let text = std::fs::read_to_string(&broken).unwrap();
    std::fs::write(&broken, text.replacen("local _M = {}", "local _M = {", 1)).unwrap();
    let bad = std::process::Command::new(&gate)
        .arg(&lua)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{err}");
    assert!(err.contains("edge_decide.lua:"), "{err}");
    // nginx -t does not see it (the seed's sharp edge), which is why the
    // gate exists; the good configuration passes nginx -t.
    let prefix = tempfile::tempdir().unwrap();
    let o = EdgeOptions::new(6379);
    let (conf, _) = harness::nginx::write_conf(prefix.path(), "127.0.0.1:1", 2, &o);
    let (passed, out) = harness::nginx::nginx_t(prefix.path(), &conf);
    assert!(passed, "{out}");
    let mut broken_opts = EdgeOptions::new(6379);
    broken_opts.lua_dir = Some(lua);
    let (conf, _) = harness::nginx::write_conf(prefix.path(), "127.0.0.1:1", 2, &broken_opts);
    let (passed, out) = harness::nginx::nginx_t(prefix.path(), &conf);
    assert!(passed, "nginx -t compiles no Lua: {out}");
}

/// `edgeform serve` on a free port, killed on drop.
struct Serve {
    child: std::process::Child,
    port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TOKEN: &str = "serve-test-token";

fn serve(repo: &Path) -> Serve {
    let port = harness::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .current_dir(repo)
        .env("EDGEFORM_SERVE_TOKEN", TOKEN)
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "edgeform serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Serve { child, port }
}

fn api(port: u16, path: &str, token: Option<&str>) -> (u16, Option<String>, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let (status, raw) = get_body(port, "api", path, &headers);
    let etag = raw
        .lines()
        .find_map(|l| l.strip_prefix("etag: ").map(str::to_owned));
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, etag, body)
}

#[test]
fn serve_answers_what_build_gives_the_node() {
    let s = setup(1);
    let commit = s.repo.commit("sites");
    let api_server = serve(s.repo.path());
    let out_dir = tempfile::tempdir().unwrap();
    let out = edgeform(
        s.repo.path(),
        &[
            "--rev",
            "HEAD",
            "build",
            "--out",
            &out_dir.path().display().to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let built: BTreeMap<String, String> =
        serde_json::from_str(&std::fs::read_to_string(out_dir.path().join("edge-1.json")).unwrap())
            .unwrap();
    for key in [
        "site:plain.test",
        "suspended:suspended.test",
        "edgeform:routing",
        "site:*.wild.test",
    ] {
        let (status, etag, body) = api(
            api_server.port,
            &format!("/v1/nodes/edge-1/keys/{key}"),
            Some(TOKEN),
        );
        assert_eq!(status, 200, "{key}");
        assert_eq!(body, built[key], "{key}");
        assert_eq!(etag.as_deref(), Some(format!("\"{commit}\"").as_str()));
    }
    let k = "/v1/nodes/edge-1/keys/site:plain.test";
    assert_eq!(api(api_server.port, k, None).0, 401);
    assert_eq!(api(api_server.port, k, Some("wrong")).0, 401);
    assert_eq!(
        api(
            api_server.port,
            "/v1/nodes/edge-1/keys/site:nowhere.test",
            Some(TOKEN)
        )
        .0,
        404
    );
    assert_eq!(
        api(
            api_server.port,
            "/v1/nodes/edge-9/keys/site:plain.test",
            Some(TOKEN)
        )
        .0,
        404
    );
    // HEAD moves: the next answer is the new commit's.
    s.repo.write(
        "sites/plain.test.yaml",
        format!(
            "host: plain.test\norigin: http://127.0.0.1:{}\nloopback: true\ncached: false\n",
            s.a.port
        )
        .as_bytes(),
    );
    let second = s.repo.commit("plain: no cache");
    let (status, etag, body) = api(api_server.port, k, Some(TOKEN));
    assert_eq!(status, 200);
    assert_eq!(etag.as_deref(), Some(format!("\"{second}\"").as_str()));
    assert!(body.contains(r#""cached":false"#), "{body}");
}

// Redis miss → API; API down → a defined error in time.
#[test]
fn a_redis_miss_asks_the_api_and_an_api_outage_is_a_fast_error() {
    let redis = harness::redis(&[]);
    let a = origin();
    let repo = Fixture::empty();
    let cache = tempfile::tempdir().unwrap();
    repo.write("cluster.yaml", b"name: test\n");
    repo.write(
        "nodes/edge-1.yaml",
        node_yaml(redis.port, cache.path()).as_bytes(),
    );
    for host in ["inredis.test", "onlyapi.test", "later.test"] {
        repo.write(
            &format!("sites/{host}.yaml"),
            format!(
                "host: {host}\norigin: http://127.0.0.1:{}\nloopback: true\n",
                a.port
            )
            .as_bytes(),
        );
    }
    repo.commit("three sites");
    let api_server = serve(repo.path());
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let value = api(
        api_server.port,
        "/v1/nodes/edge-1/keys/site:inredis.test",
        Some(TOKEN),
    )
    .2;
    // Only one document is in Redis (as on an edge whose apply is late).
    let _: () = redis::cmd("SET")
        .arg("site:inredis.test")
        .arg(&value)
        .query(&mut con)
        .unwrap();
    let mut o = EdgeOptions::new(redis.port);
    o.api_url = Some(format!("http://127.0.0.1:{}", api_server.port));
    o.api_token = TOKEN.into();
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    assert_eq!(get(port, "inredis.test", "/", &[]).status, 200);
    let r = get(port, "onlyapi.test", "/", &[]);
    assert_eq!(r.status, 200, "{}", edge.error_log());
    let r = get(port, "nowhere.test", "/", &[]);
    assert_eq!(
        (r.status, r.header("x-edgeform-reason")),
        (404, Some("unknown-host"))
    );
    // The control plane goes away: a host never read is a fast 503.
    drop(api_server);
    let t = Instant::now();
    let r = get(port, "later.test", "/", &[]);
    let took = t.elapsed();
    assert_eq!(
        (r.status, r.header("x-edgeform-reason")),
        (503, Some("control-plane-unreachable"))
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    // What was read keeps serving.
    assert_eq!(get(port, "onlyapi.test", "/", &[]).status, 200);
}

/// The agent for edge-1, its cache dirs the edge's.
pub(super) fn start_agent(redis: u16, cache: &Path) -> Agent {
    Agent::start(&format!(
        "node: edge-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
         cache: {{dirs: [\"{}\"], levels: \"1:2\", key: \"$scheme://$host$request_uri\"}}\n",
        cache.display()
    ))
}

#[test]
fn purge_through_the_edges_real_cache() {
    let s = setup(1);
    let port = s.edge.process.port;
    std::thread::sleep(Duration::from_millis(300));
    let cache_status = |url: &str| {
        get(port, "plain.test", url, &[])
            .header("x-cache-status")
            .map(str::to_owned)
    };
    for url in ["/p1", "/p2", "/d/p3"] {
        assert_eq!(cache_status(url).as_deref(), Some("MISS"));
        assert_eq!(cache_status(url).as_deref(), Some("HIT"));
    }
    let files = |dir: &Path| walk(dir).into_iter().filter(|p| p.is_file()).count();
    assert_eq!(files(&s.edge.cache_dir), 3);
    let _agent = start_agent(s.redis.port, &s.edge.cache_dir);
    let out = edgeform(
        s.repo.path(),
        &[
            "purge",
            "--site",
            "plain.test",
            "--url",
            "/p1",
            "--wait",
            "20",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(cache_status("/p1").as_deref(), Some("MISS"), "purged");
    assert_eq!(cache_status("/p2").as_deref(), Some("HIT"), "untouched");
    let out = edgeform(
        s.repo.path(),
        &[
            "purge",
            "--site",
            "plain.test",
            "--prefix",
            "/d/",
            "--wait",
            "20",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        cache_status("/d/p3").as_deref(),
        Some("MISS"),
        "purged by prefix"
    );
    assert_eq!(cache_status("/p2").as_deref(), Some("HIT"), "untouched");
}

pub(super) fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

// TLS-capable.
#[test]
fn serve_answers_over_tls() {
    let repo = Fixture::with(&[]);
    repo.commit("base");
    let d = tempfile::tempdir().unwrap();
    let (cert, key) = (d.path().join("cert.pem"), d.path().join("key.pem"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let port = harness::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .current_dir(repo.path())
        .env("EDGEFORM_SERVE_TOKEN", TOKEN)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _serve = Serve { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "edgeform serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = std::process::Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--cacert"])
        .arg(&cert)
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .arg(format!(
            "https://127.0.0.1:{port}/v1/nodes/edge-1/keys/site:a.example.com"
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n200"), "{text}");
    assert!(text.contains(r#""origin":"http://192.0.2.1""#), "{text}");
}

// The Lua address parser is Rust's, string for string.
#[test]
fn lua_addresses_parse_as_rust_does() {
    let inputs = [
        "1.2.3.4",
        "01.2.3.4",
        "256.1.1.1",
        "1.2.3",
        "1.2.3.4.5",
        " 1.2.3.4",
        "::",
        "::1",
        "2001:db8::1",
        "::ffff:1.2.3.4",
        "::ffff:81.2.69.142",
        "1::2::3",
        "fe80::1%eth0",
        "1:2:3:4:5:6:7:8",
        "1:2:3:4:5:6:7:8:9",
        "1:2:3:4:5:6:7::",
        "::1:2:3:4:5:6:7:8",
        "12345::",
        "g::1",
        "::1.2.3.4",
        "1:2:3:4:5:6:1.2.3.4",
        "2001:DB8::A",
        "",
        "x",
    ];
    let root = harness::nginx::repo_root();
    let script = format!(
        "package.path = '{}/edge/lua/?.lua;' .. package.path\n\
         local ip = require 'edge_ip'\n\
         for line in io.lines() do local b = ip.parse(line)\n\
         print(b and ip.hex(b) or 'nil') end\n",
        root.display()
    );
    let lua = crate::util::luajit_lines(&["-e", &script], inputs.join("\n").as_bytes());
    for (i, input) in inputs.iter().enumerate() {
        let rust = match input.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => hex(&a.octets()),
            Ok(IpAddr::V6(a)) => match a.to_ipv4_mapped() {
                Some(v4) => hex(&v4.octets()),
                None => hex(&a.octets()),
            },
            Err(_) => "nil".to_owned(),
        };
        // An empty last line is not read by io.lines: count from the end.
        let got = lua.get(i).map_or("nil", String::as_str);
        assert_eq!(got, rust, "`{input}`");
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
