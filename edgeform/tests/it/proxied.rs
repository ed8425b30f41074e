//! The viewer behind a real reverse proxy: HAProxy (`option forwardfor`,
//! fed the viewer's address by the PROXY protocol) in front of the real
//! reference edge (nginx + Lua, documents applied into a real Redis). The
//! client is the last `X-Forwarded-For` entry — the one HAProxy appended —
//! whatever the viewer put before it (docs/edge.md, "Client, host, path"),
//! and `explain` agrees with the edge on every request.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use harness::nginx::EdgeOptions;

use crate::util::{Fixture, edgeform, stderr};

/// A loopback origin answering 200 to everything.
pub(crate) fn origin() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut byte = [0u8; 1];
                loop {
                    while !buf.ends_with(b"\r\n\r\n") {
                        if s.read(&mut byte).unwrap_or(0) == 0 {
                            return;
                        }
                        buf.push(byte[0]);
                    }
                    buf.clear();
                    let body = "from the origin\n";
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if s.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Status and `X-Edgeform-Reason` of one GET sent to `port`, optionally
/// preceded by a PROXY protocol line naming the viewer `src`.
fn request(port: u16, src: Option<&str>, host: &str, xff: &[&str]) -> (u16, Option<String>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut text = String::new();
    if let Some(src) = src {
        text.push_str(&format!("PROXY TCP4 {src} 127.0.0.1 40000 80\r\n"));
    }
    text.push_str(&format!(
        "GET /page HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    ));
    for line in xff {
        text.push_str(&format!(
            "X-Forwarded-For:{}{line}\r\n",
            if line.is_empty() { "" } else { " " }
        ));
    }
    text.push_str("\r\n");
    s.write_all(text.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let head = raw.split("\r\n\r\n").next().unwrap_or_default();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let reason = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("x-edgeform-reason")
            .then(|| v.trim().to_owned())
    });
    (status, reason)
}

struct Edge {
    repo: Fixture,
    redis: harness::Process,
    edge: harness::nginx::Edge,
}

fn edge_with_sites() -> Edge {
    let redis = harness::redis(&[]);
    let o = origin();
    let cache = tempfile::tempdir().unwrap().keep();
    let repo = Fixture::empty();
    repo.write(
        "cluster.yaml",
        b"name: test\ntrusted_proxies: [127.0.0.1/32]\n",
    );
    repo.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
             cache:\n  dirs: [\"{}\"]\n  levels: \"1:2\"\n  key: $scheme://$host$request_uri\n",
            redis.port,
            cache.display()
        )
        .as_bytes(),
    );
    let origin = format!("origin: http://127.0.0.1:{o}\nloopback: true\ncached: false\n");
    for (host, rest) in [
        (
            "ipblock.test",
            "ip_mode: block\nip_list: [203.0.113.0/24]\n",
        ),
        ("geoblock.test", "geo_mode: block\ngeo_codes: [GB]\n"),
        ("rate.test", "rate_mode: normal\n"),
    ] {
        repo.write(
            &format!("sites/{host}.yaml"),
            format!("host: {host}\n{origin}{rest}").as_bytes(),
        );
    }
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let mut opts = EdgeOptions::new(redis.port);
    opts.cache_dir = Some(cache);
    let edge = harness::nginx::edge(&opts);
    // The first poll has read the trusted proxies.
    std::thread::sleep(Duration::from_millis(400));
    Edge { repo, redis, edge }
}

/// `explain --batch` over (peer, host, X-Forwarded-For lines): status and
/// reason of each.
fn explain(repo: &Path, reqs: &[(&str, &str, Vec<String>)]) -> Vec<(u16, Option<String>)> {
    let file = repo.join("requests.jsonl");
    let text: String = reqs
        .iter()
        .enumerate()
        .map(|(id, (peer, host, xff))| {
            let mut headers = serde_json::Map::new();
            if !xff.is_empty() {
                headers.insert("X-Forwarded-For".into(), serde_json::json!(xff));
            }
            let line = serde_json::json!({
                "host": host, "url": "/page", "ip": peer, "headers": headers, "id": id,
            });
            format!("{line}\n")
        })
        .collect();
    std::fs::write(&file, text).unwrap();
    let geoip = harness::nginx::repo_root().join("testdata/geoip/GeoLite2-City-Test.mmdb");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["explain", "--batch"])
        .arg(&file)
        .arg("--geoip")
        .arg(&geoip)
        .current_dir(repo)
        .output()
        .unwrap();
    assert!(out.status.success(), "explain: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                u16::try_from(v["status"].as_u64().unwrap()).unwrap(),
                v["reason"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// What the viewer itself sends as X-Forwarded-For (HAProxy appends its
/// own line after these): nothing, `unknown`, an empty line, garbage then
/// a forged valid address, several lines.
const SHAPES: &[&[&str]] = &[
    &[],
    &["unknown"],
    &[""],
    &["garbage, 198.51.100.7"],
    &["unknown", "not an ip, , 10.0.0.1"],
];

/// Behind HAProxy, a blocked viewer stays blocked whatever it sends as
/// X-Forwarded-For (`unknown`, empty, garbage then a valid address), for
/// `ip_mode` and `geo_mode`; a viewer that is not blocked passes; and
/// `explain`, given the same header lines, says the same for each.
#[test]
fn a_blocked_viewer_behind_haproxy_stays_blocked_whatever_it_forwards() {
    let e = edge_with_sites();
    let proxy = harness::haproxy::forwarding(e.edge.process.port, true);
    let cases = [
        // (viewer, host, expected status, expected reason)
        ("203.0.113.7", "ipblock.test", 403, Some("ip-blocked")),
        ("198.51.100.7", "ipblock.test", 200, None),
        ("81.2.69.142", "geoblock.test", 403, Some("geo-blocked")),
        ("89.160.20.128", "geoblock.test", 200, None),
    ];
    let mut asked = Vec::new();
    let mut seen = Vec::new();
    for (viewer, host, status, reason) in cases {
        for shape in SHAPES {
            let got = request(proxy.port, Some(viewer), host, shape);
            assert_eq!(
                (got.0, got.1.as_deref()),
                (status, reason),
                "viewer {viewer} on {host} sending X-Forwarded-For {shape:?}\n{}",
                e.edge.error_log()
            );
            // What the edge received: the viewer's lines, then HAProxy's.
            let mut lines: Vec<String> = shape.iter().map(|l| (*l).to_owned()).collect();
            lines.push(viewer.to_owned());
            asked.push(("127.0.0.1", host, lines));
            seen.push(got);
        }
    }
    assert_eq!(explain(e.repo.path(), &asked), seen, "explain ≠ the edge");
}

/// The rate limit counts the viewer HAProxy saw, not the proxy: a viewer
/// sending `X-Forwarded-For: unknown` past its burst gets 429, and another
/// viewer doing the same right after is not limited.
#[test]
fn the_rate_limit_behind_haproxy_counts_the_viewer() {
    let e = edge_with_sites();
    let proxy = harness::haproxy::forwarding(e.edge.process.port, true);
    // rate_mode normal: 20/s, burst 40.
    let answers: Vec<u16> = (0..100)
        .map(|_| request(proxy.port, Some("192.0.2.77"), "rate.test", &["unknown"]).0)
        .collect();
    assert_eq!(answers[0], 200);
    assert!(answers.contains(&429), "{answers:?}");
    for shape in SHAPES {
        assert_eq!(
            request(proxy.port, Some("192.0.2.78"), "rate.test", shape).0,
            200,
            "another viewer sending {shape:?}"
        );
    }
}

/// Directly from the trusted peer: only spaces and tabs around the last
/// entry are trimmed; U+00A0 (or a vertical tab) makes it malformed, so the
/// peer is the client — on the edge and in `explain` alike.
#[test]
fn only_spaces_and_tabs_around_the_last_entry_are_trimmed() {
    let e = edge_with_sites();
    let port = e.edge.process.port;
    let shapes: [(&str, u16); 5] = [
        ("203.0.113.7", 403),
        ("unknown, \t203.0.113.7 \t", 403),
        ("203.0.113.7\u{a0}", 200),
        ("\u{a0}203.0.113.7", 200),
        ("203.0.113.7\u{b}", 200),
    ];
    let mut asked = Vec::new();
    let mut seen = Vec::new();
    for (xff, want) in shapes {
        let got = request(port, None, "ipblock.test", &[xff]);
        assert_eq!(got.0, want, "{xff:?}");
        asked.push(("127.0.0.1", "ipblock.test", vec![xff.to_owned()]));
        seen.push(got);
    }
    assert_eq!(explain(e.repo.path(), &asked), seen, "explain ≠ the edge");
    // The same through --header, repeated.
    let out = edgeform(
        e.repo.path(),
        &[
            "explain",
            "--host",
            "ipblock.test",
            "--url",
            "/page",
            "--ip",
            "127.0.0.1",
            "--header",
            "X-Forwarded-For: unknown",
            "--header",
            "X-Forwarded-For: 203.0.113.7",
            "--format",
            "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["status"].as_u64(), v["client_ip"].as_str()),
        (Some(403), Some("203.0.113.7")),
        "{v}"
    );
    // Any other header given twice is a usage mistake, said so.
    let out = edgeform(
        e.repo.path(),
        &[
            "explain",
            "--host",
            "ipblock.test",
            "--url",
            "/",
            "--ip",
            "127.0.0.1",
            "--header",
            "Referer: a",
            "--header",
            "Referer: b",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("more than once"), "{}", stderr(&out));
}

/// The edge's Lua (`edge_ip.xff_last`, then its address parser) and Rust
/// (`edgestate::route::xff_last`, then `IpAddr`) take the same client from
/// the same `X-Forwarded-For` value, byte for byte — including Unicode
/// whitespace, control characters and bytes that are not UTF-8 (Rust sees
/// those as U+FFFD, as the agent's `join_xff` gives them).
#[test]
fn lua_and_rust_take_the_same_last_entry() {
    let inputs: Vec<Vec<u8>> = [
        "1.2.3.4",
        "unknown, 1.2.3.4",
        ", 1.2.3.4",
        "1.2.3.4, ",
        "1.2.3.4,",
        " \t1.2.3.4\t ",
        "a,b,,c, 2001:db8::1 ",
        "1.2.3.4\u{a0}",
        "\u{a0}1.2.3.4",
        "1.2.3.4\u{2003}",
        "1.2.3.4\u{3000}",
        "1.2.3.4\u{b}",
        "1.2.3.4\u{c}",
        "1.2.3.4\r",
        "1.2.3.4 , 5.6.7.8",
        "[2001:db8::1]",
        "1.2.3.4:80",
        "::ffff:81.2.69.142",
        "",
        ",",
        " ",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .chain([b"\xff, 1.2.3.4".to_vec(), b"1.2.3.4\xff".to_vec()])
    .collect();
    let root = harness::nginx::repo_root();
    let script = format!(
        "package.path = '{}/edge/lua/?.lua;' .. package.path\n\
         local ip = require 'edge_ip'\n\
         for line in io.lines() do\n\
         local raw = line:gsub('%x%x', function(h) return string.char(tonumber(h, 16)) end)\n\
         local b = ip.parse(ip.xff_last(raw))\n\
         print(b and ip.hex(b) or 'nil') end\n",
        root.display()
    );
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let lines: String = inputs.iter().map(|i| format!("{}\n", hex(i))).collect();
    let lua = crate::util::luajit_lines(&["-e", &script], lines.as_bytes());
    assert_eq!(lua.len(), inputs.len(), "{lua:?}");
    for (input, got) in inputs.iter().zip(&lua) {
        let joined = edgestate::route::join_xff([input.as_slice()]).unwrap();
        let rust = match edgestate::route::xff_last(&joined).parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(a)) => hex(&a.octets()),
            Ok(std::net::IpAddr::V6(a)) => match a.to_ipv4_mapped() {
                Some(v4) => hex(&v4.octets()),
                None => hex(&a.octets()),
            },
            Err(_) => "nil".to_owned(),
        };
        assert_eq!(got, &rust, "{:?}", String::from_utf8_lossy(input));
    }
}

/// A routing table the edge cannot read (here refused by an ACL, as a
/// lost connection would fail it) keeps the trusted proxies the edge last
/// read: a blocked viewer forwarded by the trusted proxy stays blocked
/// through a generation that moved meanwhile, the failure is said once in
/// the error log, and the next poll that reads the table says so.
#[test]
fn an_unreadable_routing_table_keeps_the_trusted_proxies_last_read() {
    let e = edge_with_sites();
    let port = e.edge.process.port;
    let redis = e.redis.port;
    let blocked = || request(port, None, "ipblock.test", &["203.0.113.7"]);
    assert_eq!(blocked(), (403, Some("ip-blocked".to_owned())));
    let run = |cmd: &str| {
        let reply = harness::raw_command(redis, cmd).unwrap();
        assert!(!reply.starts_with('-'), "{cmd}: {reply}");
    };
    // Every key the edge reads but the routing table; then an apply's
    // generation, which makes every worker read the table again.
    run("ACL SETUSER default resetkeys ~site:* ~suspended:* ~tls:* ~acme:* ~edgeform:meta");
    run("HINCRBY edgeform:meta generation 1");
    std::thread::sleep(Duration::from_millis(600));
    for _ in 0..10 {
        assert_eq!(
            blocked(),
            (403, Some("ip-blocked".to_owned())),
            "the forwarded viewer, the routing table unreadable\n{}",
            e.edge.error_log()
        );
    }
    let log = e.edge.error_log();
    let said = log.matches("edgeform:routing could not be read").count();
    // Once per worker, not at every poll.
    assert!((1..=2).contains(&said), "said {said} times:\n{log}");
    run("ACL SETUSER default allkeys");
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        e.edge.error_log().contains("edgeform:routing read again"),
        "{}",
        e.edge.error_log()
    );
    assert_eq!(blocked(), (403, Some("ip-blocked".to_owned())));

    // A routing table that is JSON but no object (here `1`): said, the
    // lists last read kept, and the edge still follows applies — the site
    // now blocks another network, and the forwarded viewer is still the
    // one judged.
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{redis}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let doc: String = redis::cmd("GET")
        .arg("site:ipblock.test")
        .query(&mut con)
        .unwrap();
    assert!(doc.contains("203.0.113.0/24"), "{doc}");
    let moved = doc.replace("203.0.113.0/24", "192.0.2.0/24");
    redis::pipe()
        .cmd("SET")
        .arg("edgeform:routing")
        .arg("1")
        .cmd("SET")
        .arg("site:ipblock.test")
        .arg(&moved)
        .cmd("HINCRBY")
        .arg("edgeform:meta")
        .arg("generation")
        .arg(1)
        .exec(&mut con)
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        blocked(),
        (200, None),
        "the apply after a routing table that is no object\n{}",
        e.edge.error_log()
    );
    assert_eq!(
        request(port, None, "ipblock.test", &["192.0.2.9"]),
        (403, Some("ip-blocked".to_owned()))
    );
    assert!(
        e.edge.error_log().contains("edgeform:routing unreadable"),
        "{}",
        e.edge.error_log()
    );
}
