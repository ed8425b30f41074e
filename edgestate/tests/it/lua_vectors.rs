//! The edge's shared vectors (`testdata/edge/decide.jsonl`) on the Lua side
//! inside a real nginx: the lines plain LuaJIT cannot run (`"lua": "nginx"`:
//! `regex` rules need nginx's PCRE, a clearance cookie checked against a
//! secret needs its HMAC and SHA-1) and every other Lua line again, through
//! `scripts/lua/vectors.lua` in a `content_by_lua` runner. edgestate's unit
//! tests hold the Rust side to the same `want`s.

use std::io::{Read, Write};

use serde_json::Value;

const FIELDS: [&str; 10] = [
    "verdict",
    "status",
    "reason",
    "location",
    "cached",
    "ttl",
    "origin",
    "origin_host",
    "fallback_origins",
    "waf",
];

/// A decision in the compared form (absent: `null`; `cached`: `false`;
/// `waf`: `[]`).
fn normalized(v: &Value) -> Vec<Value> {
    FIELDS
        .iter()
        .map(|f| match (*f, v.get(*f).cloned().unwrap_or(Value::Null)) {
            ("cached", Value::Null) => Value::Bool(false),
            ("waf", Value::Null) => Value::Array(Vec::new()),
            (_, x) => x,
        })
        .collect()
}

/// POST `body` to the runner; the response body.
fn post(port: u16, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /edge HTTP/1.0\r\nHost: runner\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    body.to_owned()
}

#[test]
fn lua_edge_decisions_in_nginx_match_the_shared_vectors() {
    let root = harness::nginx::repo_root();
    let runner = harness::nginx::lua_runner(
        &[
            root.join("roles/edge/lua"),
            root.join("router/lua"),
            root.join("scripts/lua"),
        ],
        "ngx.req.read_body()\n\
         local body = ngx.req.get_body_data() or ''\n\
         local lines = {}\n\
         for l in (body .. '\\n'):gmatch('([^\\n]*)\\n') do lines[#lines + 1] = l end\n\
         ngx.print(require('vectors').edge_json(lines, true))",
    );
    let text = std::fs::read_to_string(root.join("testdata/edge/decide.jsonl")).unwrap();
    let answer = post(runner.process.port, &text);
    let vectors: Vec<(usize, Value)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str::<Value>(l).unwrap()))
        .filter(|(_, v)| v.get("base_doc").is_none())
        .collect();
    let answers: Vec<Value> = answer
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        answers.len(),
        vectors.len(),
        "{answer}\n{}",
        runner.error_log()
    );
    let (mut failures, mut with_nginx, mut ran) = (Vec::new(), 0, 0);
    for ((line, v), got) in vectors.iter().zip(&answers) {
        let where_ = v.get("lua").and_then(Value::as_str).unwrap_or("plain");
        let at = format!("decide.jsonl:{line} ({})", v["name"]);
        if got.is_null() {
            assert_eq!(where_, "none", "{at}: not run in nginx");
            continue;
        }
        assert_ne!(where_, "none", "{at}: nginx refuses it before any Lua");
        if let Some(e) = got.get("lua_error") {
            failures.push(format!("{at}: Lua error {e}"));
            continue;
        }
        ran += 1;
        if where_ == "nginx" {
            with_nginx += 1;
        }
        if normalized(got) != normalized(&v["want"]) {
            failures.push(format!("{at}: got {got}, want {}", v["want"]));
        }
    }
    assert!(with_nginx >= 10, "only {with_nginx} nginx-only vectors ran");
    assert!(ran > 150, "only {ran} vectors ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
