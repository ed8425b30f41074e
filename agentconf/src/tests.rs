//! The validation, without servers: every rule, the one error list,
//! the positions.

use std::path::Path;
use std::time::Duration;

use edgestate::target::RedisTarget;

use super::*;

#[test]
fn redis_tls_block_with_its_rules_each_located() {
    let c = parse(
        "agent.yaml",
        "node: e\nregion: eu\nredis:\n  url: rediss://10.0.0.5:6380\n  tls: {ca_file: /etc/ca.pem, cert_file: /c.pem, key_file: /k.pem}\n",
    )
    .unwrap();
    let tls = c.redis.tls().unwrap();
    assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
    assert_eq!(tls.key_file.as_deref(), Some(Path::new("/k.pem")));
    // `tls` with redis://, a cert without its key, an unknown key:
    // every error, each located.
    let e = parse(
        "agent.yaml",
        "node: e\nregion: eu\nredis:\n  url: redis://x\n  tls: {cert_file: /c.pem}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("agent.yaml:5:"), "{e}");
    assert!(e.contains("`tls` needs a `rediss://` URL"), "{e}");
    assert!(e.contains("go together"), "{e}");
    let e = parse(
        "agent.yaml",
        "node: e\nregion: eu\nredis:\n  url: rediss://x\n  tls: {ca_fle: /c.pem}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("agent.yaml:5:") && e.contains("ca_fle"), "{e}");
}

#[test]
fn full_and_defaults() {
    let c = parse(
        "agent.yaml",
        "node: edge-1\nregion: eu\nredis:\n  url: redis://127.0.0.1:6379\n",
    )
    .unwrap();
    assert_eq!(c.purge_queue(), "cdn:purge:eu:edge-1");
    assert_eq!(c.cache.levels, "1:2");
    assert_eq!(c.cache.key, "$scheme://$host$request_uri");
    assert_eq!(c.cache.dirs.len(), 4);
    assert!(c.cache.dirs[0].ends_with("static"));
    let c = parse(
        "a.yaml",
        "node: e\nregion: us\nredis: {sentinels: [\"127.0.0.1:26379\"], master: e, password_env: PATH}\n\
         cache: {dirs: [/var/cache/x], levels: \"2\", key: $host$uri}\n",
    )
    .unwrap();
    assert!(matches!(c.redis, RedisTarget::Sentinel { .. }));
    assert_eq!(c.cache.levels, "2");
}

#[test]
fn errors_name_the_line() {
    let e = parse(
        "agent.yaml",
        "node: e\nregion: eu\nredis:\n  url: redis://x\n  pasword_env: X\n",
    )
    .unwrap_err();
    assert_eq!((e.line, e.column), (5, 3), "{e}");
    assert!(
        e.to_string()
            .starts_with("agent.yaml:5:3: unknown field `pasword_env`"),
        "{e}"
    );
    let e = parse(
        "agent.yaml",
        "node: e\nregion: eu\nredis: {url: redis://x}\ncache:\n  levels: \"3:3\"\n",
    )
    .unwrap_err();
    assert_eq!(e.line, 5, "{e}");
    let e = parse("agent.yaml", "node: e\nregion: eu\n").unwrap_err();
    assert!(e.message.contains("redis"), "{e}");
    let e = parse("agent.yaml", "node: e\nregion: eu\nredis: {}\n").unwrap_err();
    assert_eq!(e.line, 3, "{e}");
    let e = parse("agent.yaml", "node: [\n").unwrap_err();
    assert!(e.line >= 1);
    let e = parse(
        "agent.yaml",
        "node: e\nregion: eu\nredis: {url: redis://x}\ncache: {dirs: [relative]}\n",
    )
    .unwrap_err();
    assert_eq!(e.line, 4, "{e}");
}

#[test]
fn mqtt_health_and_actions() {
    let base = "node: e\nregion: eu\nredis: {url: redis://x}\n";
    let c = parse(
        "agent.yaml",
        &format!(
            "{base}mqtt:\n  url: mqtts://broker.example:8884\n  topic_prefix: cdn/prod\n  \
             username: edge\n  password_env: PATH\n  ca_file: /etc/edgeform/ca.pem\n\
             health:\n  interval: 2s\n  play_sessions: {{url: \"http://127.0.0.1:8080/stats\", field: /server/sessions}}\n  \
             streams: {{file: /run/streams.json, field: live}}\n\
             actions:\n  reload:\n    argv: [/usr/sbin/nginx, -s, reload]\n  \
             peer:\n    argv: [/usr/local/bin/peer, add, \"{{ip}}\"]\n    args: {{ip: \"[0-9.]+\"}}\n    timeout: 10s\n"
        ),
    )
    .unwrap();
    let m = c.mqtt.unwrap();
    assert_eq!(m.topic_prefix, "cdn/prod");
    assert_eq!(m.broker.password_env.as_deref(), Some("PATH"));
    assert!(m.command_key.is_none());
    assert_eq!(c.health.interval, Duration::from_secs(2));
    assert_eq!(
        c.health.streams.unwrap().from,
        SourceFrom::File("/run/streams.json".into())
    );
    assert_eq!(c.actions["reload"].timeout, DEFAULT_ACTION_TIMEOUT);
    assert!(c.actions["peer"].args["ip"].is_match("10.0.0.1"));
    assert!(
        !c.actions["peer"].args["ip"].is_match("10.0.0.1x"),
        "anchored"
    );

    // Each mistake is located.
    let cases: &[(&str, u32, &str)] = &[
        ("mqtt: {url: \"http://x\"}\n", 4, "scheme"),
        (
            "mqtt:\n  url: mqtt://x\n  topic_prefix: \"a/#\"\n",
            6,
            "topic prefix",
        ),
        (
            "mqtt:\n  url: mqtt://x\n  command_key_env: EDGEFORM_SURELY_UNSET_KEY\n",
            6,
            "not set",
        ),
        ("mqtt:\n  url: mqtt://x\n  password_env: P\n", 6, "username"),
        (
            "mqtt:\n  url: mqtt://x\n  username: u\n  password_env: EDGEFORM_SURELY_UNSET_PW\n",
            7,
            "not set",
        ),
        ("mqtt:\n  url: mqtt://x\n  ca_file: /ca.pem\n", 6, "mqtts"),
        (
            "mqtt: {url: \"mqtt://x\"}\nrouting: {health_file: /h.json}\n",
            5,
            "both set",
        ),
        ("health: {interval: soon}\n", 4, "not a duration"),
        ("health:\n  streams: {field: x}\n", 5, "exactly one"),
        (
            "health:\n  streams: {url: \"https://x\", field: x}\n",
            5,
            "only http",
        ),
        (
            "health:\n  streams: {file: rel.json, field: x}\n",
            5,
            "absolute",
        ),
        ("actions:\n  a:\n    argv: []\n", 6, "must name a program"),
        ("actions:\n  a:\n    argv: [nginx]\n", 6, "absolute path"),
        (
            "actions:\n  a:\n    argv: [/bin/x, \"{y}\"]\n",
            6,
            "not declared",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x, \"--host={y}\"]\n    args: {y: x}\n",
            6,
            "whole argv element",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x]\n    args: {y: x}\n",
            7,
            "no argv element",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x, \"{y}\"]\n    args: {y: \"(\"}\n",
            7,
            "invalid regex",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x]\n    timeout: forever\n",
            7,
            "not a duration",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x]\n    shell: true\n",
            7,
            "unknown field",
        ),
        (
            "actions:\n  \"a/b\":\n    argv: [/bin/x]\n",
            5,
            "not an action name",
        ),
        (
            "actions:\n  \"edgeform probe\":\n    argv: [/bin/x]\n",
            5,
            "not an action name",
        ),
    ];
    for (text, line, needle) in cases {
        let e = parse("agent.yaml", &format!("{base}{text}")).expect_err(text);
        assert_eq!(e.line, *line, "{text}: {e}");
        assert!(e.message.contains(needle), "{text}: {e}");
    }
}

/// Settings that parse but cannot work, each refused at its value:
/// empty or overlapping cache dirs, an empty or uncomputable cache
/// key, port 0 anywhere an address is given.
#[test]
fn unusable_settings_are_refused_at_their_value() {
    let redis = "redis: {url: redis://x}\n";
    let cases: &[(&str, &str, u32, u32, &str)] = &[
        (redis, "cache:\n  dirs: []\n", 5, 9, "must not be empty"),
        (
            redis,
            "cache:\n  dirs:\n    - /var/cache/a\n    - /var/cache/a/b\n",
            7,
            7,
            "is inside `/var/cache/a` (dirs[0])",
        ),
        (
            redis,
            "cache:\n  dirs:\n    - /var/cache/a/b\n    - /var/cache/a\n",
            7,
            7,
            "holds `/var/cache/a/b` (dirs[0])",
        ),
        (
            redis,
            "cache:\n  dirs:\n    - /var/cache/a\n    - /var//cache/./a/\n",
            7,
            7,
            "is listed twice",
        ),
        (
            redis,
            "cache:\n  dirs:\n    - /var/cache/a\n    - /var/cache/b/../a\n",
            7,
            7,
            "`..` is not allowed",
        ),
        (redis, "cache:\n  key: \"\"\n", 5, 8, "empty"),
        (
            redis,
            "cache:\n  key: $scheme$host$cookie_id$uri\n",
            5,
            8,
            "`$cookie_id`",
        ),
        (
            redis,
            "cache:\n  key: $scheme://$host\n",
            5,
            8,
            "no $request_uri or $uri",
        ),
        (
            redis,
            "cache:\n  key: $scheme$host$request_uri\n",
            5,
            8,
            "`$scheme` directly followed by `$host`",
        ),
        (redis, "http:\n  listen: 127.0.0.1:0\n", 5, 11, "port 0"),
        (redis, "http:\n  listen: \"[::]:0\"\n", 5, 11, "port 0"),
        (
            redis,
            "http:\n  listen: 127.0.0.1:8080\n  metrics: yes\n",
            6,
            12,
            "expected a boolean",
        ),
        (redis, "metrics:\n  listen: 127.0.0.1:0\n", 5, 11, "port 0"),
        ("redis:\n  url: redis://127.0.0.1:0\n", "", 4, 8, "port 0"),
        (
            "redis:\n  sentinels: [\"10.0.0.1:26379\", \"10.0.0.2:0\"]\n  master: m\n",
            "",
            4,
            33,
            "port 0",
        ),
        (redis, "mqtt:\n  url: mqtt://broker:0\n", 5, 8, "port 0"),
    ];
    for (redis, text, line, column, needle) in cases {
        let text = format!("node: e\nregion: eu\n{redis}{text}");
        let e = parse_with("agent.yaml", &text, &|_| None, false).expect_err(&text);
        assert_eq!(e.0.len(), 1, "{text}: {e}");
        assert_eq!((e.line, e.column), (*line, *column), "{text}: {e}");
        assert!(e.message.contains(needle), "{text}: {e}");
    }
}

/// `/metrics` on the HTTP listener: by default only on loopback.
#[test]
fn metrics_on_the_http_listener_only_on_loopback_by_default() {
    for (http, served) in [
        ("{listen: \"127.0.0.1:8080\"}", true),
        ("{listen: \"[::1]:8080\"}", true),
        ("{listen: \"0.0.0.0:8080\"}", false),
        ("{listen: \"192.0.2.10:80\"}", false),
        ("{listen: \"0.0.0.0:8080\", metrics: true}", true),
        ("{listen: \"127.0.0.1:8080\", metrics: false}", false),
    ] {
        let c = parse(
            "agent.yaml",
            &format!("node: e\nregion: eu\nredis: {{url: redis://x}}\nhttp: {http}\n"),
        )
        .unwrap();
        assert_eq!(c.http.unwrap().metrics, served, "{http}");
    }
}

#[test]
fn every_error_at_once_each_located_and_every_missing_variable() {
    let text = "node: e\nregion: eu\nredis: {url: redis://x, pasword_env: X}\n\
                cache: {levels: \"3:3\", dirs: [relative]}\nhttp: {listen: nowhere}\n\
                mqtt: {url: \"http://x\", command_key_env: K}\n\
                health: {interval: soon}\nactions:\n  a:\n    argv: [nginx]\n";
    let e = parse_with("agent.yaml", text, &|_| None, false).unwrap_err();
    let lines: Vec<u32> = e.0.iter().map(|e| e.line).collect();
    assert_eq!(lines, [3, 4, 4, 5, 6, 7, 10], "{e}");
    assert!(
        e.0[0].message.starts_with("unknown field `pasword_env`"),
        "{e}"
    );
    // The environment: every missing variable, at its key.
    let text = "node: e\nregion: eu\nredis: {url: redis://x, password_env: A}\n\
                mqtt:\n  url: mqtt://x\n  username: u\n  password_env: B\n  command_key_env: C\n";
    let e = parse_with("agent.yaml", text, &|_| None, false).unwrap_err();
    let got: Vec<(u32, bool)> =
        e.0.iter()
            .map(|e| (e.line, e.message.contains("not set")))
            .collect();
    assert_eq!(got, [(3, true), (7, true), (8, true)], "{e}");
    let c = parse_with("agent.yaml", text, &|v| Some(format!("{v}-value")), false).unwrap();
    assert_eq!(
        c.mqtt.unwrap().command_key.as_deref(),
        Some(b"C-value".as_slice())
    );
}

/// The first three lines every case below starts with.
const BASE: &str = "node: e\nregion: eu\nredis: {url: redis://x}\n";

/// Every error of `text` (after [`BASE`]) as (line, column, message),
/// with no environment and no named files read.
fn errors(text: &str) -> Vec<(u32, u32, String)> {
    let text = format!("{BASE}{text}");
    parse_with("agent.yaml", &text, &|_| None, false)
        .expect_err(&text)
        .0
        .into_iter()
        .map(|e| (e.line, e.column, e.message))
        .collect()
}

/// The one error of `text` (after [`BASE`]).
fn one_error(text: &str) -> (u32, u32, String) {
    let mut all = errors(text);
    assert_eq!(all.len(), 1, "{text}: {all:?}");
    all.remove(0)
}

/// An unknown key anywhere is an error at the key itself, listing the
/// keys that section takes (serde's field list of its raw struct, so the
/// list below is also the agent.yaml reference of SPEC.md).
#[test]
fn unknown_keys_are_refused_at_the_key_with_the_keys_the_section_takes() {
    let cases: &[(&str, u32, u32, &str)] = &[
        (
            "colour: red\n",
            4,
            1,
            "`node`, `region`, `redis`, `cache`, `http`, `routing`, `mqtt`, `health`, `actions`, `metrics`, `state_dir`",
        ),
        (
            "cache:\n  level: \"1:2\"\n",
            5,
            3,
            "`dirs`, `levels`, `key`",
        ),
        (
            "http:\n  listen: 127.0.0.1:8080\n  tls: true\n",
            6,
            3,
            "`listen`, `proxy_url`, `metrics`",
        ),
        (
            "routing:\n  refesh: 1s\n",
            5,
            3,
            "`health_file`, `refresh`, `share_health`",
        ),
        (
            "mqtt:\n  url: mqtt://x\n  password: p\n",
            6,
            3,
            "`url`, `topic_prefix`, `username`, `password_env`, `ca_file`, `command_key_env`, `command_public_key_file`, `result_key_file`",
        ),
        (
            "health:\n  intervall: 5s\n",
            5,
            3,
            "`interval`, `play_sessions`, `streams`, `bundle_manifest`, `vod`, `probe`, `edge_metrics`",
        ),
        (
            "health:\n  vod: {file: /v.json, field: x, every: 1s}\n",
            5,
            34,
            "`url`, `file`, `field`",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x]\n    env: {A: b}\n",
            7,
            5,
            "`argv`, `args`, `timeout`",
        ),
        (
            "metrics:\n  listen: 127.0.0.1:9\n  path: /m\n",
            6,
            3,
            "`listen`",
        ),
    ];
    for (text, line, column, expected) in cases {
        let (l, c, message) = one_error(text);
        assert_eq!((l, c), (*line, *column), "{text}: {message}");
        assert!(message.starts_with("unknown field `"), "{text}: {message}");
        assert!(
            message.ends_with(&format!("expected one of {expected}")),
            "{text}: {message}"
        );
    }
    // The Redis block and its `tls` block, through the whole file.
    let e = parse_with(
        "agent.yaml",
        "node: e\nregion: eu\nredis:\n  url: rediss://x\n  db: 1\n  tls:\n    ca: /c.pem\n",
        &|_| None,
        false,
    )
    .unwrap_err();
    let got: Vec<(u32, u32, bool)> =
        e.0.iter()
            .map(|e| (e.line, e.column, e.message.starts_with("unknown field")))
            .collect();
    assert_eq!(got, [(5, 3, true), (7, 5, true)], "{e}");
    assert!(
        e.0[0]
            .message
            .ends_with("`url`, `sentinels`, `master`, `username`, `password_env`, `tls`"),
        "{e}"
    );
    assert!(
        e.0[1]
            .message
            .ends_with("`ca_file`, `cert_file`, `key_file`"),
        "{e}"
    );
}

/// A value of the wrong type is refused at the value, in the same words
/// everywhere; the other sections are still checked.
#[test]
fn wrong_types_are_refused_at_the_value_and_the_rest_is_still_checked() {
    let cases: &[(&str, u32, u32, &str)] = &[
        (
            "cache: [/a]\n",
            4,
            8,
            "invalid type: a sequence, expected a mapping",
        ),
        (
            "http: 8080\n",
            4,
            7,
            "invalid type: a number, expected a mapping",
        ),
        // `key:` alone is null: a section is never taken as absent.
        ("mqtt:\n", 4, 5, "invalid type: null, expected a mapping"),
        (
            "health:\n  streams:\n",
            5,
            10,
            "invalid type: null, expected a mapping",
        ),
        (
            "actions: [a, b]\n",
            4,
            10,
            "invalid type: a sequence, expected a mapping",
        ),
        (
            "actions:\n  a: /bin/x\n",
            5,
            6,
            "invalid type: a string, expected a mapping",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x]\n    args: [v]\n",
            7,
            11,
            "invalid type: a sequence, expected a mapping",
        ),
        (
            "actions:\n  a:\n    argv: [/bin/x]\n    args: {v: 5}\n",
            7,
            15,
            "invalid type: a number, expected a string",
        ),
        (
            "cache:\n  dirs: [/var/cache/a, 5]\n",
            5,
            24,
            "invalid type: a number, expected a string",
        ),
        (
            "cache:\n  levels: 2\n",
            5,
            11,
            "invalid type: a number, expected a string",
        ),
        (
            "state_dir: true\n",
            4,
            12,
            "invalid type: a boolean, expected a string",
        ),
        (
            "metrics: {listen: [a]}\n",
            4,
            19,
            "invalid type: a sequence, expected a string",
        ),
    ];
    for (text, line, column, message) in cases {
        let (l, c, m) = one_error(text);
        assert_eq!((l, c), (*line, *column), "{text}: {m}");
        assert_eq!(m, *message, "{text}");
    }
    // An `argv` that is not a list is also no program.
    let all = errors("actions:\n  a:\n    argv: /bin/x\n");
    assert_eq!(
        all[0],
        (6, 11, "invalid type: a string, expected a sequence".into())
    );
    assert_eq!(all.len(), 2, "{all:?}");
    // A wrong type in one section, a bad value in another: both.
    let all = errors("cache: {levels: 9}\nhealth: {interval: soon}\n");
    let at: Vec<(u32, u32)> = all.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(at, [(4, 17), (5, 20)], "{all:?}");
    // The whole file must be a mapping.
    let e = parse("agent.yaml", "- node\n- region\n").unwrap_err();
    assert_eq!(
        (e.line, e.column, e.message.as_str()),
        (1, 1, "invalid type: a sequence, expected a mapping")
    );
}

/// YAML that is not YAML, and a file with nothing in it.
#[test]
fn empty_and_malformed_files_are_located() {
    let e = parse("agent.yaml", "").unwrap_err();
    assert_eq!((e.line, e.column), (1, 1));
    assert!(
        e.message
            .contains("`node`, `region` and `redis` are required"),
        "{e}"
    );
    let e = parse("agent.yaml", "# only a comment\n").unwrap_err();
    assert!(e.message.starts_with("empty configuration"), "{e}");
    let e = parse("agent.yaml", "node: e\nregion: eu\nredis: {url: [\n").unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    assert!(e.line >= 3, "{e}");
    // Two keys the same: YAML's own error, at the second.
    let e = parse(
        "agent.yaml",
        "node: e\nnode: f\nregion: eu\nredis: {url: redis://x}\n",
    )
    .unwrap_err();
    assert_eq!(e.line, 2, "{e}");
}

/// A required key absent — or present with no value — is named, at the
/// mapping that should hold it.
#[test]
fn required_keys_are_named_at_their_mapping() {
    let e = parse_with(
        "agent.yaml",
        "region: eu\nredis: {url: redis://x}\n",
        &|_| None,
        false,
    )
    .unwrap_err();
    assert_eq!((e.line, e.column), (1, 1), "{e}");
    assert_eq!(e.message, "missing field `node`");
    let e = parse_with(
        "agent.yaml",
        "node:\nregion: eu\nredis: {url: redis://x}\n",
        &|_| None,
        false,
    )
    .unwrap_err();
    assert_eq!(e.message, "missing field `node`", "{e}");
    let e = parse_with(
        "agent.yaml",
        "node: e\nredis: {url: redis://x}\n",
        &|_| None,
        false,
    )
    .unwrap_err();
    assert_eq!(e.message, "missing field `region`", "{e}");
    let e = parse_with(
        "agent.yaml",
        "node: \"\"\nregion: eu\nredis: {url: redis://x}\n",
        &|_| None,
        false,
    )
    .unwrap_err();
    assert_eq!(
        (e.line, e.message.as_str()),
        (1, "`node` and `region` must not be empty")
    );
    for (text, line, column, message) in [
        ("http: {proxy_url: /p}\n", 4, 7, "missing field `listen`"),
        ("mqtt: {topic_prefix: cdn}\n", 4, 7, "missing field `url`"),
        ("metrics: {}\n", 4, 10, "missing field `listen`"),
        (
            "health:\n  vod: {file: /v.json}\n",
            5,
            8,
            "missing field `field`",
        ),
        (
            "actions:\n  a:\n    timeout: 5s\n",
            6,
            5,
            "missing field `argv`",
        ),
    ] {
        let (l, c, m) = one_error(text);
        assert_eq!((l, c, m.as_str()), (line, column, message), "{text}");
    }
}

/// The defaults of every optional key.
#[test]
fn defaults_of_every_optional_key() {
    let c = parse_with("agent.yaml", BASE, &|_| None, false).unwrap();
    assert_eq!(c.state_dir, Path::new(DEFAULT_STATE_DIR));
    assert!(c.http.is_none() && c.mqtt.is_none() && c.metrics_listen.is_none());
    assert_eq!(c.routing.refresh, DEFAULT_REFRESH);
    assert!(c.routing.health_file.is_none() && c.routing.share_health.is_none());
    assert_eq!(c.health.interval, DEFAULT_HEALTH_INTERVAL);
    assert!(c.health.play_sessions.is_none() && c.health.vod.is_none());
    assert!(c.actions.is_empty());
    let defaults = edgestate::purge::CacheDefaults::default();
    assert_eq!(c.cache.levels, defaults.levels);
    assert_eq!(c.cache.key, defaults.key);
    let c = parse_with(
        "agent.yaml",
        &format!(
            "{BASE}http: {{listen: \"127.0.0.1:8080\"}}\nmqtt: {{url: mqtt://b}}\n\
             routing: {{refresh:}}\nhealth: {{interval:}}\nactions:\n  a: {{argv: [/bin/a], timeout:}}\n"
        ),
        &|_| None,
        false,
    )
    .unwrap();
    assert_eq!(c.http.unwrap().proxy_url, "/proxy/{node}/{stream}");
    let m = c.mqtt.unwrap();
    assert_eq!(m.topic_prefix, edgestate::mqtt::DEFAULT_PREFIX);
    assert_eq!(m.broker.url, "mqtt://b");
    // A duration key with no value is the default, like every other
    // optional value.
    assert_eq!(c.routing.refresh, DEFAULT_REFRESH);
    assert_eq!(c.health.interval, DEFAULT_HEALTH_INTERVAL);
    assert_eq!(c.actions["a"].timeout, DEFAULT_ACTION_TIMEOUT);
}

/// `state_dir`, `routing`, `health`: paths absolute, durations above zero.
#[test]
fn paths_and_durations_are_checked_at_their_value() {
    for (text, line, column, needle) in [
        (
            "state_dir: var/lib/x\n",
            4,
            12,
            "absolute path without `..`",
        ),
        (
            "state_dir: /var/lib/../x\n",
            4,
            12,
            "absolute path without `..`",
        ),
        ("routing: {refresh: 0s}\n", 4, 20, "`0s` is not a duration"),
        (
            "routing: {refresh: 5}\n",
            4,
            20,
            "invalid type: a number, expected a string",
        ),
        ("health: {interval: 1h30}\n", 4, 20, "not a duration"),
        ("health: {interval: 61s}\n", 4, 20, "at most 60s"),
        (
            "health: {bundle_manifest: current/manifest.json}\n",
            4,
            27,
            "absolute path",
        ),
        (
            "health:\n  vod: {file: /v.json, field: \"\"}\n",
            5,
            31,
            "`field` must not be empty",
        ),
        (
            "health:\n  play_sessions: {url: \"http://x/s\", file: /s, field: n}\n",
            5,
            18,
            "exactly one",
        ),
        (
            "metrics: {listen: localhost}\n",
            4,
            19,
            "is not an address:port",
        ),
        (
            "http: {listen: \"127.0.0.1\"}\n",
            4,
            16,
            "is not an address:port",
        ),
        (
            "health: {probe: [\"http://127.0.0.1:80\", \"tls://127.0.0.1:443\"]}\n",
            4,
            41,
            "a probe is `http://IP:PORT`, `https://IP:PORT` or `proxy://IP:PORT`",
        ),
    ] {
        let (l, c, m) = one_error(text);
        assert_eq!((l, c), (line, column), "{text}: {m}");
        assert!(m.contains(needle), "{text}: {m}");
    }
    let c = parse_with(
        "agent.yaml",
        &format!(
            "{BASE}state_dir: /srv/./agent/\nrouting: {{refresh: 250ms, share_health: /run/h.json}}\n\
             health:\n  vod: {{url: \"http://127.0.0.1/v\", field: /vod}}\n  bundle_manifest: /opt/e/current/manifest.json\n  probe: [\"http://127.0.0.1:80\", \"https://127.0.0.1:443\", \"proxy://[::1]:10443\"]\n"
        ),
        &|_| None,
        false,
    )
    .unwrap();
    assert_eq!(c.state_dir, Path::new("/srv/./agent/"));
    assert_eq!(c.routing.refresh, Duration::from_millis(250));
    assert_eq!(
        c.routing.share_health.as_deref(),
        Some(Path::new("/run/h.json"))
    );
    assert_eq!(
        c.health.vod,
        Some(Source {
            from: SourceFrom::Url("http://127.0.0.1/v".into()),
            field: "/vod".into()
        })
    );
    assert_eq!(
        c.health.probe,
        [
            crate::Probe {
                addr: "127.0.0.1:80".parse().unwrap(),
                kind: crate::ProbeKind::Http,
            },
            crate::Probe {
                addr: "127.0.0.1:443".parse().unwrap(),
                kind: crate::ProbeKind::Https,
            },
            crate::Probe {
                addr: "[::1]:10443".parse().unwrap(),
                kind: crate::ProbeKind::Proxy,
            },
        ]
    );
}

/// `redis:`: the rules shared with the compiler's node files, each at
/// its value.
#[test]
fn redis_rules_are_located_in_the_agent_file() {
    let at = |redis: &str| -> Vec<(u32, u32, String)> {
        let text = format!("node: e\nregion: eu\nredis:\n{redis}");
        parse_with("agent.yaml", &text, &|_| None, false)
            .expect_err(&text)
            .0
            .into_iter()
            .map(|e| (e.line, e.column, e.message))
            .collect()
    };
    for (redis, line, column, needle) in [
        (
            "  url: redis://x\n  sentinels: [\"a:1\"]\n  master: m\n",
            4,
            3,
            "either `url`, or `sentinels` and `master`",
        ),
        (
            "  url: http://x\n",
            4,
            8,
            "is not a redis:// or rediss:// URL",
        ),
        ("  url: redis://u:secret@x\n", 4, 8, "carries a password"),
        (
            "  url: rediss://x#insecure\n",
            4,
            8,
            "`#insecure` is not allowed",
        ),
        (
            "  url: redis://x\n  username: \"a b\"\n",
            5,
            13,
            "`username` must be",
        ),
        (
            "  sentinels: [\"a:1\", nope]\n  master: m\n",
            4,
            22,
            "`nope` is not `host:port`",
        ),
        ("  sentinels: []\n  master: m\n", 4, 14, "at least one"),
    ] {
        let all = at(redis);
        assert_eq!(all.len(), 1, "{redis}: {all:?}");
        let (l, c, m) = &all[0];
        assert_eq!((*l, *c), (line, column), "{redis}: {m}");
        assert!(m.contains(needle), "{redis}: {m}");
    }
    let c = parse_with(
        "agent.yaml",
        "node: e\nregion: eu\nredis: {url: \"redis://edge@127.0.0.1:6379/2\"}\n",
        &|_| None,
        false,
    )
    .unwrap();
    assert_eq!(c.redis.username(), Some("edge"));
}

/// `mqtt:`: the URL, the key files' pairing and paths.
#[test]
fn mqtt_rules_each_at_their_key() {
    for (text, line, column, needle) in [
        (
            "mqtt: {url: \"mqtt://u@b\"}\n",
            4,
            13,
            "put the username in `username`",
        ),
        ("mqtt: {url: \"mqtt://b/t\"}\n", 4, 13, "no path or query"),
        (
            "mqtt: {url: nothing}\n",
            4,
            13,
            "`nothing` is not a URL: relative URL without a base",
        ),
        (
            "mqtt: {url: \"mqtts://b\", ca_file: ca.pem}\n",
            4,
            35,
            "`ca_file` must be an absolute path",
        ),
        (
            "mqtt: {url: \"mqtt://b\", topic_prefix: \"\"}\n",
            4,
            39,
            "is not a topic prefix",
        ),
        (
            "mqtt: {url: \"mqtt://b\", command_public_key_file: /k.pub}\n",
            4,
            50,
            "needs `result_key_file`",
        ),
        (
            "mqtt: {url: \"mqtt://b\", result_key_file: /r.key}\n",
            4,
            42,
            "set `command_public_key_file` too",
        ),
    ] {
        let (l, c, m) = one_error(text);
        assert_eq!((l, c), (line, column), "{text}: {m}");
        assert!(m.contains(needle), "{text}: {m}");
    }
    let all = errors(
        "mqtt: {url: \"mqtt://b\", command_public_key_file: k.pub, result_key_file: r.key}\n",
    );
    let got: Vec<&str> = all.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(
        got,
        [
            "`command_public_key_file` must be an absolute path",
            "`result_key_file` must be an absolute path"
        ],
        "{all:?}"
    );
}

/// The command key files are read with the configuration: missing ones
/// refused at their key, good ones loaded into the keys commands are
/// checked with (the HMAC key too, from its variable).
#[test]
fn command_key_files_are_read_and_checked() {
    let dir = std::env::temp_dir().join(format!("agentconf-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let control = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let public = dir.join("command.key.pub");
    let result = dir.join("result.key");
    std::fs::write(
        &public,
        edgestate::cmdkey::verifying_key_pem(&control.verifying_key()),
    )
    .unwrap();
    std::fs::write(&result, "ab".repeat(32)).unwrap();
    let text = |public: &Path, result: &Path| {
        format!(
            "{BASE}mqtt:\n  url: mqtt://b\n  command_key_env: K\n  command_public_key_file: {}\n  result_key_file: {}\n",
            public.display(),
            result.display()
        )
    };
    let c = parse_with(
        "agent.yaml",
        &text(&public, &result),
        &|_| Some("hmac".into()),
        false,
    )
    .unwrap();
    let m = c.mqtt.unwrap();
    assert_eq!(m.keys.ed25519, Some(control.verifying_key()));
    assert_eq!(m.result_key.as_deref(), Some([0xab; 32].as_slice()));
    assert_eq!(m.keys.hmac.as_deref(), Some(b"hmac".as_slice()));
    // A missing public key, the private key where the result key belongs.
    std::fs::write(&result, edgestate::cmdkey::signing_key_pem(&control)).unwrap();
    let e = parse_with(
        "agent.yaml",
        &text(&dir.join("missing.pub"), &result),
        &|_| Some("hmac".into()),
        false,
    )
    .unwrap_err();
    let got: Vec<(u32, bool)> =
        e.0.iter()
            .map(|e| (e.line, e.message.contains(&dir.display().to_string())))
            .collect();
    assert_eq!(got, [(7, true), (8, true)], "{e}");
    assert!(
        e.0[0]
            .message
            .starts_with("cannot read the command public key"),
        "{e}"
    );
    // A configuration from a pull request (the bundle gate): its key file
    // names are never read, so they cannot probe this host's files.
    let unread = parse_unread(
        "agent.yaml",
        &text(&dir.join("missing.pub"), &result),
        &|_| Some("hmac".into()),
    )
    .unwrap();
    assert_eq!(unread.mqtt.unwrap().keys.ed25519, None);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The MQTT CA is read only when asked (`--check-config`, start), never
/// by the compiler's gate, which has no such file.
#[test]
fn the_mqtt_ca_file_is_read_only_when_asked() {
    let dir = std::env::temp_dir().join(format!("agentconf-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    let text = format!(
        "{BASE}mqtt: {{url: \"mqtts://b\", ca_file: {}}}\n",
        ca.display()
    );
    assert!(parse_with("agent.yaml", &text, &|_| None, false).is_ok());
    let e = parse_with("agent.yaml", &text, &|_| None, true).unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    assert!(e.message.starts_with("cannot read the MQTT CA file"), "{e}");
    std::fs::write(&ca, "not a certificate").unwrap();
    let e = parse_with("agent.yaml", &text, &|_| None, true).unwrap_err();
    assert!(e.message.contains("holds no PEM certificate"), "{e}");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    assert!(parse_with("agent.yaml", &text, &|_| None, true).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `actions:`: the program is never a placeholder; a name is one topic
/// level without spaces.
#[test]
fn action_names_and_programs() {
    let all = errors("actions:\n  a:\n    argv: [\"{p}\"]\n    args: {p: x}\n");
    let got: Vec<(u32, u32, &str)> = all.iter().map(|(l, c, m)| (*l, *c, m.as_str())).collect();
    assert_eq!(
        got,
        [
            (
                6,
                12,
                "action `a`: the program must be an absolute path (no PATH lookup), not `{p}`"
            ),
            (6, 12, "action `a`: the program cannot be an argument"),
        ]
    );
    let all = errors("actions:\n  \"a+\":\n    argv: [/bin/x]\n  b c:\n    argv: [/bin/x]\n");
    let at: Vec<(u32, u32)> = all.iter().map(|(l, c, _)| (*l, *c)).collect();
    assert_eq!(at, [(5, 3), (7, 3)], "{all:?}");
    let c = parse_with(
        "agent.yaml",
        &format!("{BASE}actions:\n  peer-add:\n    argv: [/bin/p, \"{{ip}}\", --fixed]\n    args: {{ip: \"[0-9.]+|[0-9a-f:]+\"}}\n"),
        &|_| None,
        false,
    )
    .unwrap();
    let a = &c.actions["peer-add"];
    assert_eq!(a.argv, ["/bin/p", "{ip}", "--fixed"]);
    assert!(a.args["ip"].is_match("::1") && !a.args["ip"].is_match("1.2.3.4 ::1"));
}

/// One list: sorted by position, each problem once, one per line when
/// shown; the list dereferences to its first error.
#[test]
fn the_error_list_is_sorted_deduplicated_and_shown_one_per_line() {
    let text = "node: e\nregion: eu\nredis: {url: redis://x}\nhealth: {interval: soon}\ncache: {levels: \"0\"}\nzzz: 1\n";
    let e = parse_with("a.yaml", text, &|_| None, false).unwrap_err();
    let at: Vec<(u32, u32)> = e.0.iter().map(|e| (e.line, e.column)).collect();
    assert_eq!(at, [(4, 20), (5, 17), (6, 1)], "{e}");
    assert_eq!(e.line, 4);
    let shown = e.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert!(
        lines[0].starts_with("a.yaml:4:20: `soon` is not a duration"),
        "{shown}"
    );
    assert!(
        lines[1].starts_with("a.yaml:5:17: invalid `levels`: levels `0`"),
        "{shown}"
    );
    assert!(
        lines[2].starts_with("a.yaml:6:1: unknown field `zzz`"),
        "{shown}"
    );
}

#[test]
fn durations_are_shown_as_written_and_placeholders_are_whole_elements() {
    assert_eq!(show_duration(Duration::from_secs(120)), "2m");
    assert_eq!(show_duration(Duration::from_secs(5)), "5s");
    assert_eq!(show_duration(Duration::from_millis(1500)), "1500ms");
    assert_eq!(show_duration(Duration::ZERO), "0s");
    assert_eq!(placeholder("{host}"), Some("host"));
    assert_eq!(placeholder("{a_b-1}"), Some("a_b-1"));
    for not in ["{}", "host", "{a b}", "x{a}", "{a}x", "{a.b}"] {
        assert_eq!(placeholder(not), None, "{not}");
    }
}
