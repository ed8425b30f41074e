//! The challenge page's own script, run by a real JavaScript engine
//! (Node.js), computes a clearance the real edge (nginx + Lua) accepts and
//! `explain` calls valid (docs/edge.md, "Challenged").

use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::Duration;

use harness::nginx::EdgeOptions;

use crate::util::{Fixture, edgeform, stderr};

const SECRET: &str = "page-secret";

/// GET / on strict.test as viewer 81.2.69.142 (through the trusted peer):
/// (status, X-Edgeform-Reason, body).
fn get(port: u16, cookie: Option<&str>) -> (u16, Option<String>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut text = "GET / HTTP/1.1\r\nHost: strict.test\r\nConnection: close\r\n\
                    X-Forwarded-For: 81.2.69.142\r\n"
        .to_owned();
    if let Some(c) = cookie {
        text.push_str(&format!("Cookie: {c}\r\n"));
    }
    text.push_str("\r\n");
    s.write_all(text.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
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
    (status, reason, body.to_owned())
}

/// Run the page's script in Node.js with a minimal `document` and
/// `location`: the cookie it sets before reloading.
fn run_page_script(page: &str) -> String {
    let script = page
        .split("<script>")
        .nth(1)
        .and_then(|r| r.split("</script>").next())
        .expect("a script in the page");
    let stub = "var document = {}; var location = { reload: function () { \
                process.stdout.write(document.cookie); } };\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("page.js");
    std::fs::write(&file, format!("{stub}{script}")).unwrap();
    let out = std::process::Command::new("node")
        .arg(&file)
        .output()
        .expect("node (Debian package nodejs)");
    assert!(
        out.status.success(),
        "node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The script the edge sends finds the proof of work and sets a cookie
/// the edge lets through; the nonce alone stays challenged.
#[test]
fn the_challenge_page_script_computes_a_clearance_the_edge_accepts() {
    let redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
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
    repo.write(
        "sites/strict.yaml",
        format!(
            "host: strict.test\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n\
             rate_mode: strict\n"
        )
        .as_bytes(),
    );
    let out = edgeform(repo.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "apply: {}", stderr(&out));
    let mut o = EdgeOptions::new(redis.port);
    o.cache_dir = Some(cache);
    o.challenge_secret = SECRET.into();
    let edge = harness::nginx::edge(&o);
    let port = edge.process.port;
    std::thread::sleep(Duration::from_millis(300));

    let (status, reason, page) = get(port, None);
    assert_eq!((status, reason.as_deref()), (403, Some("challenge")));
    let set = run_page_script(&page);
    let value = set
        .strip_prefix("edgeform_clearance=")
        .and_then(|r| r.split(';').next())
        .unwrap_or_else(|| panic!("the script set `{set}`"));
    assert!(
        set.ends_with("; Path=/; Max-Age=3600; SameSite=Lax"),
        "{set}"
    );
    // The work is there: explain's twin calls the value valid…
    let viewer: IpAddr = "81.2.69.142".parse().unwrap();
    assert!(edgestate::edge::clearance_valid(
        SECRET.as_bytes(),
        "strict.test",
        viewer,
        0,
        value
    ));
    // …and the edge lets the browser through.
    let cookie = format!("edgeform_clearance={value}");
    let (status, reason, body) = get(port, Some(&cookie));
    assert_eq!((status, reason), (200, None), "{body}");
    // The nonce alone, as a scraper would copy it, is refused.
    let nonce = value.rsplit_once('.').unwrap().0;
    let (status, _, _) = get(port, Some(&format!("edgeform_clearance={nonce}")));
    assert_eq!(status, 403);
}
