//! `edgeform history` reads an edge's `edgeform:history`: text a
//! compromised edge controls. Against a real `redis-server` holding
//! hostile entries, no field reaches the terminal raw.

use crate::util::{Fixture, edgeform, stderr, stdout};

/// Every character a terminal could act on: C0 (but the newline that
/// ends a line), DEL and C1.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect()
}

/// An entry whose every string field carries terminal escapes (an OSC
/// title change, a screen clear, a C1 CSI, a carriage return that would
/// overwrite the line; a commit whose 12th byte is inside a character),
/// and one that is not an entry at all.
fn hostile_entries() -> [String; 2] {
    let entry = serde_json::json!({
        "at": "2026-12-01T00:00:00Z\u{1b}[2J",
        "action": "\u{1b}]0;pwned\u{7}apply\u{9b}31m",
        "commit": "0123456789a€\u{1b}[8m",
        "previous_commit": "\rfedcba987654",
        "generation": 7,
        "applied_by": "mallory@edge\u{1b}[1A\u{7f}",
        "command": "edgeform apply\r\u{1b}[K--yes",
        "forced": false,
        "break_glass": true,
        "freeze": "release\u{1b}[5m",
        "written": 1,
        "deleted": 0,
    });
    [entry.to_string(), "not json \u{1b}[2J\u{9b}H".to_owned()]
}

#[test]
fn history_escapes_every_field_an_edge_wrote() {
    let r = harness::redis(&[]);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
            r.port
        )
        .as_bytes(),
    );
    f.commit("one edge");
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("RPUSH")
        .arg("edgeform:history")
        .arg(&hostile_entries())
        .exec(&mut con)
        .unwrap();

    let out = edgeform(f.path(), &["history", "--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(raw_controls(&text), Vec::<char>::new(), "{text:?}");
    assert_eq!(text.lines().count(), 2, "{text}");
    for shown in [
        "\\u{1b}]0;pwned\\u{7}apply\\u{9b}31m",
        "2026-12-01T00:00:00Z\\u{1b}[2J",
        "→ 0123456789a€  ",
        "\\rfedcba98765",
        "mallory@edge\\u{1b}[1A\\u{7f}",
        "edgeform apply\\r\\u{1b}[K--yes",
        "break-glass (freeze release\\u{1b}[5m)",
        "(unreadable entry: not json \\u{1b}[2J\\u{9b}H)",
    ] {
        assert!(text.contains(shown), "{shown} not in {text}");
    }

    // JSON: the same values, but no raw control character on the way.
    let out = edgeform(
        f.path(),
        &["history", "--node", "edge-1", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(raw_controls(&text), Vec::<char>::new(), "{text:?}");
    let items: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(items[0]["action"], "\u{1b}]0;pwned\u{7}apply\u{9b}31m");
    assert_eq!(items[0]["applied_by"], "mallory@edge\u{1b}[1A\u{7f}");
    assert_eq!(
        items[1]["unreadable"], "not json \\u{1b}[2J\\u{9b}H",
        "an unreadable entry is shown as its escaped text"
    );
}
