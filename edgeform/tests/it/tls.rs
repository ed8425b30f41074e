//! TLS to an edge's Redis and Sentinel, against real
//! `redis-server` processes serving TLS with certificates made by
//! `openssl` in the test (harness `Certs`). The servers keep a plain
//! loopback port too, used here only to look at what was applied.

use std::collections::BTreeMap;
use std::path::Path;

use crate::util::{Fixture, edgeform, stderr, stdout};

fn meta(port: u16) -> BTreeMap<String, String> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query(&mut con)
        .unwrap()
}

fn dbsize(port: u16) -> u64 {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("DBSIZE").query(&mut con).unwrap()
}

/// A repo with two sites on one edge whose `redis` block is `redis`.
fn repo(redis: &str) -> Fixture {
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {redis}\n"
        )
        .as_bytes(),
    );
    for i in 0..2 {
        f.write(
            &format!("sites/s{i}.yaml"),
            format!("host: s{i}.example.com\norigin: http://192.0.2.1\n").as_bytes(),
        );
    }
    f.commit("tls edge");
    f
}

fn url_tls(port: u16, ca: &Path) -> String {
    format!(
        "{{url: \"rediss://127.0.0.1:{port}\", tls: {{ca_file: \"{}\"}}}}",
        ca.display()
    )
}

fn apply(f: &Fixture) -> std::process::Output {
    edgeform(f.path(), &["apply", "--yes"])
}

/// The apply failed for edge-1 with a one-line reason naming the URL.
fn refused(out: &std::process::Output, port: u16, why: &str) {
    let text = format!("{}{}", stdout(out), stderr(out));
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("edge-1: FAILED"))
        .unwrap_or_else(|| panic!("no failure line:\n{text}"));
    assert!(
        line.contains(&format!("rediss://127.0.0.1:{port}")),
        "{line}\n{text}"
    );
    assert!(text.contains(why), "`{why}` not in:\n{text}");
}

#[test]
fn apply_over_tls_verifies_against_the_ca_file() {
    let certs = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    let f = repo(&url_tls(tls, &certs.file("ca.pem")));
    let out = apply(&f);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(meta(r.port)["generation"], "1");
}

#[test]
fn wrong_ca_is_refused_and_nothing_applied() {
    let certs = harness::Certs::new();
    let other = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    let f = repo(&url_tls(tls, &other.file("ca.pem")));
    let out = apply(&f);
    refused(&out, tls, "certificate verify failed");
    assert_eq!(dbsize(r.port), 0);
}

#[test]
fn expired_server_certificate_is_refused() {
    let certs = harness::Certs::expired();
    let (r, tls) = harness::redis_tls(&certs, false);
    let f = repo(&url_tls(tls, &certs.file("ca.pem")));
    let out = apply(&f);
    refused(&out, tls, "expired");
    assert_eq!(dbsize(r.port), 0);
}

#[test]
fn unreadable_ca_file_is_named_and_nothing_applied() {
    let certs = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    let f = repo(&url_tls(tls, Path::new("/nonexistent/ca.pem")));
    let out = apply(&f);
    refused(
        &out,
        tls,
        "cannot read /nonexistent/ca.pem (redis.tls.ca_file)",
    );
    assert_eq!(dbsize(r.port), 0);
}

#[test]
fn a_client_certificate_is_sent_when_the_server_requires_one() {
    let certs = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, true);
    let f = repo(&url_tls(tls, &certs.file("ca.pem")));
    let out = apply(&f);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert_eq!(dbsize(r.port), 0);
    let f = repo(&format!(
        "{{url: \"rediss://127.0.0.1:{tls}\", tls: {{ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\"}}}}",
        certs.file("ca.pem").display(),
        certs.file("client.pem").display(),
        certs.file("client.key").display()
    ));
    let out = apply(&f);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(meta(r.port)["generation"], "1");
}

#[test]
fn sentinel_over_tls_resolves_and_applies() {
    let certs = harness::Certs::new();
    let (r, tls) = harness::redis_tls(&certs, false);
    let (_sentinel, sentinel_tls) = harness::sentinel_tls("edge-1", tls, &certs);
    let f = repo(&format!(
        "{{sentinels: [\"127.0.0.1:{sentinel_tls}\"], master: edge-1, tls: {{ca_file: \"{}\"}}}}",
        certs.file("ca.pem").display()
    ));
    let out = apply(&f);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(meta(r.port)["generation"], "1");
}

#[test]
fn tls_without_rediss_is_a_located_error() {
    let f =
        repo("{url: \"redis://127.0.0.1:6379\", tls: {ca_file: /etc/ca.pem, cert_file: /c.pem}}");
    let out = edgeform(f.path(), &["check"]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("`tls` needs a `rediss://` URL"), "{text}");
    assert!(
        text.contains("`tls.cert_file` and `tls.key_file` go together"),
        "{text}"
    );
    assert!(text.contains("nodes/edge-1.yaml:5:"), "{text}");
}
