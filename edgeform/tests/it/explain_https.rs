//! `edgeform explain --scheme https`: the TLS outcome comes first, the
//! decision reads the scheme and the SNI (the `edgeform` binary on a
//! compiled repository; the outcomes against certificate documents are
//! `ops::explain`'s and `edgestate::tls`'s unit tests and shared vectors).

use crate::util::{Fixture, edgeform, stderr, stdout};

fn repo() -> Fixture {
    Fixture::with(&[
        (
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
             redis: {url: \"redis://127.0.0.1:9\"}\n",
        ),
        ("cluster.yaml", "name: test\n"),
        (
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n",
        ),
        (
            "sites/b.yaml",
            "host: b.example.com\norigin: http://192.0.2.2\n",
        ),
    ])
}

fn json(f: &Fixture, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "explain",
        "--url",
        "/x?y=1",
        "--ip",
        "192.0.2.7",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = edgeform(f.path(), &args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn explain_https_reports_tls_first_and_decides_with_the_sni() {
    let f = repo();
    // http: no tls key at all.
    let v = json(&f, &["--host", "a.example.com"]);
    assert!(v.get("tls").is_none(), "{v}");
    assert_eq!(v["verdict"], "proxy", "{v}");
    // https without a certificate document for the name: the handshake
    // fails, said first; the decision had the request arrived follows.
    let v = json(&f, &["--host", "a.example.com", "--scheme", "https"]);
    assert_eq!(v["tls"], "no-certificate", "{v}");
    let out = edgeform(
        f.path(),
        &[
            "explain",
            "--host",
            "a.example.com",
            "--url",
            "/x?y=1",
            "--ip",
            "192.0.2.7",
            "--scheme",
            "https",
            "--format",
            "json",
        ],
    );
    let text = stdout(&out);
    assert!(
        text.starts_with(r#"{"tls":"no-certificate","verdict":"proxy""#),
        "{text}"
    );
    // The SNI of another site on the connection: 421.
    let v = json(
        &f,
        &[
            "--host",
            "b.example.com",
            "--scheme",
            "https",
            "--sni",
            "a.example.com",
        ],
    );
    assert_eq!(
        (v["status"].as_u64(), v["reason"].as_str()),
        (Some(421), Some("misdirected-request")),
        "{v}"
    );
    // The same name in another case, with a trailing dot: served.
    let v = json(
        &f,
        &[
            "--host",
            "B.example.com:443",
            "--scheme",
            "https",
            "--sni",
            "b.EXAMPLE.com.",
        ],
    );
    assert_eq!(v["status"], 200, "{v}");
    // Text: the tls line before the verdict.
    let out = edgeform(
        f.path(),
        &[
            "explain",
            "--host",
            "a.example.com",
            "--url",
            "/",
            "--ip",
            "192.0.2.7",
            "--scheme",
            "https",
        ],
    );
    let text = stdout(&out);
    let tls = text.find("tls: no-certificate").expect(&text);
    assert!(tls < text.find("verdict:").expect(&text), "{text}");
    // --sni without https is refused, loudly.
    let out = edgeform(
        f.path(),
        &[
            "explain",
            "--host",
            "a.example.com",
            "--url",
            "/",
            "--ip",
            "192.0.2.7",
            "--sni",
            "a.example.com",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("--sni needs --scheme https"),
        "{}",
        stderr(&out)
    );
    // A batch line with a scheme the edge does not know: named by line.
    let batch = f.path().join("reqs.jsonl");
    std::fs::write(
        &batch,
        "{\"host\":\"a.example.com\",\"url\":\"/\",\"ip\":\"192.0.2.7\",\"scheme\":\"https\",\"sni\":\"b.example.com\",\"id\":1}\n\
         {\"host\":\"a.example.com\",\"url\":\"/\",\"ip\":\"192.0.2.7\",\"scheme\":\"gopher\"}\n",
    )
    .unwrap();
    let out = edgeform(f.path(), &["explain", "--batch", batch.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    let first: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().next().unwrap_or("null")).unwrap();
    assert_eq!(
        (first["tls"].as_str(), first["status"].as_u64()),
        (Some("no-certificate"), Some(421)),
        "{first}"
    );
    assert!(
        stderr(&out).contains("reqs.jsonl:2: scheme `gopher`"),
        "{}",
        stderr(&out)
    );
}

/// `explain` judges at the global `--now` like every other command, given
/// as RFC 3339 or Unix seconds, before or after the command's name.
#[test]
fn explain_reads_the_global_now_in_either_spelling() {
    let f = repo();
    for now in [
        &["--now", "2026-12-01T00:00:00Z", "--host", "a.example.com"][..],
        &["--now", "1764547200", "--host", "a.example.com"][..],
    ] {
        let v = json(&f, now);
        assert_eq!(v["verdict"], "proxy", "{v}");
    }
    let out = edgeform(
        f.path(),
        &[
            "--now",
            "tomorrow",
            "explain",
            "--host",
            "a.example.com",
            "--url",
            "/",
            "--ip",
            "192.0.2.7",
        ],
    );
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("or Unix seconds"), "{}", stderr(&out));
}
