//! A table of malformed repositories: each must be refused (exit 1) with
//! the right diagnostic code, file and line — semantic errors included.

use compiler::Severity;

use crate::util::{Fixture, edgeform, stdout};

const EDGE: &str = "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
                    addresses: [198.51.100.1]\nredis: {url: \"redis://127.0.0.1:6379\"}\n";

/// (name, files over BASE, code, file, line)
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
    u32,
);

const CASES: &[Case] = &[
    (
        "yaml syntax",
        &[("sites/a.yaml", "host: a.example.com\norigin: [http://x\n")],
        "yaml-syntax",
        "sites/a.yaml",
        2,
    ),
    (
        "duplicate key",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nhost: b.example.com\n",
        )],
        "yaml-duplicate-key",
        "sites/a.yaml",
        3,
    ),
    (
        "two documents",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\n---\nhost: b.example.com\n",
        )],
        "yaml-multiple-documents",
        "sites/a.yaml",
        3,
    ),
    (
        "empty site file",
        &[("sites/b.yaml", "# nothing here\n")],
        "empty-file",
        "sites/b.yaml",
        1,
    ),
    (
        "not a mapping",
        &[("sites/b.yaml", "- host: b.example.com\n")],
        "wrong-type",
        "sites/b.yaml",
        1,
    ),
    (
        "unknown key (typo)",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ncahced: true\n",
        )],
        "unknown-key",
        "sites/a.yaml",
        3,
    ),
    (
        "missing origin",
        &[("sites/a.yaml", "host: a.example.com\ncached: false\n")],
        "missing-key",
        "sites/a.yaml",
        1,
    ),
    (
        "bool as yes",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ncached: yes\n",
        )],
        "wrong-type",
        "sites/a.yaml",
        3,
    ),
    (
        "bad enum",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nwaf_mode: paranoid\n",
        )],
        "invalid-value",
        "sites/a.yaml",
        3,
    ),
    (
        "upper-case host",
        &[(
            "sites/a.yaml",
            "host: A.Example.com\norigin: http://192.0.2.1\n",
        )],
        "invalid-value",
        "sites/a.yaml",
        1,
    ),
    (
        "duplicate host across files",
        &[(
            "sites/b.yaml",
            "host: a.example.com\norigin: http://192.0.2.2\n",
        )],
        "duplicate-host",
        "sites/b.yaml",
        1,
    ),
    (
        "alias collides with a host",
        &[(
            "sites/b.yaml",
            "host: b.example.com\naliases:\n  - c.example.com\n  - a.example.com\norigin: http://192.0.2.2\n",
        )],
        "duplicate-host",
        "sites/b.yaml",
        4,
    ),
    (
        "unknown country",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ngeo_mode: block\ngeo_codes: [RU, UK]\n",
        )],
        "invalid-country",
        "sites/a.yaml",
        4,
    ),
    (
        "geo mode without codes",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ngeo_mode: allow\n",
        )],
        "missing-list",
        "sites/a.yaml",
        3,
    ),
    (
        "cidr host bits",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nip_mode: allow\nip_list:\n  - 10.0.0.0/8\n  - 198.51.100.7/24\n",
        )],
        "cidr-host-bits",
        "sites/a.yaml",
        6,
    ),
    (
        "invalid cidr",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nip_mode: block\nip_list: [10.0.0.0/33]\n",
        )],
        "invalid-cidr",
        "sites/a.yaml",
        4,
    ),
    (
        "origin with a path",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1/app\n",
        )],
        "invalid-url",
        "sites/a.yaml",
        2,
    ),
    (
        "origin with credentials",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: https://user:hunter2@origin.example.com\n",
        )],
        "inline-secret",
        "sites/a.yaml",
        2,
    ),
    (
        "invalid regex",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ncache_rules:\n  - match_type: regex\n    match_value: \"^/(a|b\"\n    action: bypass\n",
        )],
        "invalid-regex",
        "sites/a.yaml",
        5,
    ),
    (
        "ttl missing",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ncache_rules:\n  - {match_type: ext, match_value: .mp4, action: ttl}\n",
        )],
        "missing-ttl",
        "sites/a.yaml",
        4,
    ),
    (
        "ttl out of range",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ncache_rules:\n  - match_type: ext\n    match_value: .mp4\n    action: ttl\n    ttl: 0\n",
        )],
        "out-of-range",
        "sites/a.yaml",
        7,
    ),
    (
        "redirect without status",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nedge_rules:\n  - match_type: prefix\n    match_value: /old/\n    action: redirect\n",
        )],
        "missing-redirect-status",
        "sites/a.yaml",
        6,
    ),
    (
        "bad redirect status",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nedge_rules:\n  - match_type: prefix\n    match_value: /old/\n    action: redirect\n    redirect_status: 303\n",
        )],
        "invalid-value",
        "sites/a.yaml",
        7,
    ),
    (
        "prefix without slash",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\ncache_rules:\n  - {match_type: prefix, match_value: img/, action: bypass}\n",
        )],
        "invalid-match-value",
        "sites/a.yaml",
        4,
    ),
    (
        "unknown region",
        &[(
            "sites/a.yaml",
            "host: a.example.com\norigin: http://192.0.2.1\nregions: [eu, ue]\n",
        )],
        "unknown-region",
        "sites/a.yaml",
        3,
    ),
    (
        "unknown fallback zone",
        &[(
            "zones/z.yaml",
            "name: z\nroutes: [0.0.0.0/0, \"::/0\"]\nfallback: office-9\n",
        )],
        "unknown-zone",
        "zones/z.yaml",
        3,
    ),
    (
        "duplicate zone",
        &[("zones/a.yaml", "name: z\n"), ("zones/b.yaml", "name: z\n")],
        "duplicate-zone",
        "zones/b.yaml",
        1,
    ),
    (
        "prefix in two zones",
        &[
            ("zones/a.yaml", "name: a\nroutes: [0.0.0.0/0, \"::/0\"]\n"),
            (
                "zones/b.yaml",
                "name: b\nroutes:\n  - 10.0.0.0/8\n  - 0.0.0.0/0\n",
            ),
        ],
        "duplicate-route",
        "zones/b.yaml",
        4,
    ),
    (
        "invalid zone name",
        &[("zones/a.yaml", "name: Office_1\n")],
        "invalid-value",
        "zones/a.yaml",
        1,
    ),
    (
        "node in unknown zone",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nzone: nowhere\nlocation: {lat: 1, lon: 2}\nredis: {url: \"redis://127.0.0.1:1\"}\n",
        )],
        "unknown-zone",
        "nodes/edge-1.yaml",
        4,
    ),
    (
        "duplicate node",
        &[(
            "nodes/edge-2.yaml",
            "name: edge-1\nroles: [ingest]\nregion: eu\n",
        )],
        "duplicate-node",
        "nodes/edge-2.yaml",
        1,
    ),
    (
        "edge without location",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nredis: {url: \"redis://127.0.0.1:1\"}\n",
        )],
        "missing-location",
        "nodes/edge-1.yaml",
        1,
    ),
    (
        "unknown role",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge, cache]\nregion: eu\nlocation: {lat: 1, lon: 2}\n",
        )],
        "invalid-value",
        "nodes/edge-1.yaml",
        2,
    ),
    (
        "redis password inline",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [ingest]\nregion: eu\nredis:\n  url: redis://:s3cret@127.0.0.1:6379\n",
        )],
        "inline-secret",
        "nodes/edge-1.yaml",
        5,
    ),
    (
        "redis password key",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [ingest]\nregion: eu\nredis:\n  url: redis://127.0.0.1:6379\n  password: s3cret\n",
        )],
        "inline-secret",
        "nodes/edge-1.yaml",
        6,
    ),
    (
        "redis url and sentinels",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [ingest]\nregion: eu\nredis:\n  url: redis://127.0.0.1:6379\n  sentinels: [\"127.0.0.1:26379\"]\n  master: m\n",
        )],
        "invalid-redis",
        "nodes/edge-1.yaml",
        5,
    ),
    (
        "invalid address",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [ingest]\nregion: eu\naddresses: [10.0.0.256]\n",
        )],
        "invalid-address",
        "nodes/edge-1.yaml",
        4,
    ),
    (
        "address on two nodes",
        &[(
            "nodes/edge-2.yaml",
            "name: edge-2\nroles: [ingest]\nregion: eu\naddresses:\n  - 198.51.100.1\n",
        )],
        "duplicate-address",
        "nodes/edge-2.yaml",
        5,
    ),
    (
        "latitude out of range",
        &[(
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 91, lon: 4}\n",
        )],
        "out-of-range",
        "nodes/edge-1.yaml",
        4,
    ),
    (
        "bad trusted proxy",
        &[(
            "cluster.yaml",
            "name: c\ntrusted_proxies:\n  - 192.0.2.10/32\n  - 192.0.2.300/32\n",
        )],
        "invalid-cidr",
        "cluster.yaml",
        4,
    ),
    (
        "mqtt credentials",
        &[(
            "cluster.yaml",
            "mqtt:\n  url: mqtt://admin:admin@127.0.0.1:1883\n",
        )],
        "inline-secret",
        "cluster.yaml",
        2,
    ),
    (
        "buckets out of order",
        &[(
            "cluster.yaml",
            "geo:\n  buckets:\n    - {below_km: 2000, weight: 7}\n    - {below_km: 500, weight: 10}\n",
        )],
        "invalid-buckets",
        "cluster.yaml",
        3,
    ),
    (
        "freeze: not a time",
        &[(
            "cluster.yaml",
            "apply:\n  freeze:\n    - name: final\n      start: 2026-12-24 18:00\n      end: \"2026-12-26T06:00:00Z\"\n",
        )],
        "invalid-time",
        "cluster.yaml",
        4,
    ),
    (
        "freeze: ends before it starts",
        &[(
            "cluster.yaml",
            "apply:\n  freeze:\n    - name: final\n      start: \"2026-12-26T06:00:00Z\"\n      end: \"2026-12-24T18:00:00Z\"\n",
        )],
        "invalid-window",
        "cluster.yaml",
        5,
    ),
    (
        "bad duration",
        &[("cluster.yaml", "geo:\n  fail_timeout: 30 seconds\n")],
        "invalid-value",
        "cluster.yaml",
        2,
    ),
    (
        "anycast: duplicate prefix",
        &[(
            "cluster.yaml",
            "anycast:\n  upstreams: [{name: a, asn: 64500}]\n  prefixes:\n    - prefix: 192.0.2.0/24\n    - prefix: 192.0.2.0/24\n",
        )],
        "duplicate-value",
        "cluster.yaml",
        5,
    ),
    (
        "anycast: reserved ASN",
        &[(
            "cluster.yaml",
            "anycast:\n  prefixes: [{prefix: 192.0.2.0/24}]\n  upstreams:\n    - {name: a, asn: 64500}\n    - {name: b, asn: 23456}\n",
        )],
        "invalid-asn",
        "cluster.yaml",
        5,
    ),
    (
        "anycast: ASN out of range",
        &[(
            "cluster.yaml",
            "anycast:\n  prefixes: [{prefix: 192.0.2.0/24}]\n  upstreams:\n    - {name: a, asn: 4294967296}\n",
        )],
        "out-of-range",
        "cluster.yaml",
        4,
    ),
    (
        "anycast: unknown upstream",
        &[(
            "cluster.yaml",
            "anycast:\n  upstreams: [{name: transit-a, asn: 64500}]\n  prefixes:\n    - {prefix: 192.0.2.0/24, upstreams: [transit-b]}\n",
        )],
        "unknown-upstream",
        "cluster.yaml",
        4,
    ),
    (
        "anycast: prefix host bits",
        &[(
            "cluster.yaml",
            "anycast:\n  upstreams: [{name: a, asn: 64500}]\n  prefixes:\n    - prefix: 192.0.2.1/24\n",
        )],
        "cidr-host-bits",
        "cluster.yaml",
        4,
    ),
    (
        "anycast: upstream is our own AS",
        &[(
            "cluster.yaml",
            "anycast:\n  origin_asns: [64496]\n  upstreams: [{name: a, asn: 64496}]\n  prefixes: [{prefix: 192.0.2.0/24}]\n",
        )],
        "invalid-asn",
        "cluster.yaml",
        3,
    ),
    (
        "waves: unknown node",
        &[(
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: canary, nodes: [edge-9]}\n",
        )],
        "unknown-node",
        "cluster.yaml",
        3,
    ),
    (
        "waves: a node in two waves",
        &[(
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: eu, regions: [eu]}\n    - {name: canary, nodes: [edge-1]}\n",
        )],
        "node-in-two-waves",
        "cluster.yaml",
        4,
    ),
    (
        "waves: a wave with no target",
        &[(
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: canary, nodes: [edge-1]}\n    - {name: eu, regions: [eu]}\n",
        )],
        "empty-wave",
        "cluster.yaml",
        4,
    ),
    (
        "waves: rest before the last",
        &[(
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: rest}\n    - {name: canary, nodes: [edge-1]}\n",
        )],
        "rest-not-last",
        "cluster.yaml",
        3,
    ),
    (
        "waves: a role no target has",
        &[(
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: routers, roles: [router]}\n",
        )],
        "unknown-role",
        "cluster.yaml",
        3,
    ),
    (
        "custom tag",
        &[("sites/a.yaml", "host: a.example.com\norigin: !env ORIGIN\n")],
        "yaml-unsupported-tag",
        "sites/a.yaml",
        2,
    ),
];

#[test]
fn each_malformed_input_is_refused_where_it_is() {
    assert!(CASES.len() >= 20);
    let mut failures = Vec::new();
    for (name, files, code, file, line) in CASES {
        let f = Fixture::with(files);
        let checked = f.check();
        let hit = checked
            .diagnostics
            .iter()
            .find(|d| d.code == *code && d.severity == Severity::Error);
        match hit {
            None => failures.push(format!(
                "{name}: no `{code}` error; got {:#?}",
                checked.diagnostics
            )),
            Some(d) => {
                if &*d.file != *file || d.span.line != *line || d.span.column < 1 {
                    failures.push(format!(
                        "{name}: `{code}` at {}:{}:{}, expected {file}:{line}",
                        d.file, d.span.line, d.span.column
                    ));
                }
            }
        }
        if checked.is_valid() {
            failures.push(format!("{name}: repository considered valid"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same table through the binary: exit 1 and the JSON contract.
#[test]
fn cli_exit_code_and_json_for_every_case() {
    for (name, files, code, file, line) in CASES {
        let f = Fixture::with(files);
        let out = edgeform(f.path(), &["check", "--format", "json"]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        let found = v["diagnostics"].as_array().unwrap().iter().any(|d| {
            d["code"] == *code
                && d["file"] == *file
                && d["line"] == *line
                && d["severity"] == "error"
        });
        assert!(found, "{name}: {v}");
        for d in v["diagnostics"].as_array().unwrap() {
            let keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(
                keys,
                ["code", "column", "file", "line", "message", "severity"],
                "{name}"
            );
        }
    }
}

#[test]
fn invalid_utf8_is_a_diagnostic() {
    let f = Fixture::with(&[]);
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://\xff\xfe\n",
    );
    let checked = f.check();
    let d = checked
        .diagnostics
        .iter()
        .find(|d| d.code == "encoding")
        .unwrap();
    assert_eq!(&*d.file, "sites/b.yaml");
    assert!(!checked.is_valid());
}

#[test]
fn all_problems_are_reported_in_one_run() {
    let f = Fixture::with(&[
        (
            "sites/b.yaml",
            "host: a.example.com\norigin: http://192.0.2.2/x\n",
        ),
        (
            "sites/c.yaml",
            "host: c.example.com\norigin: http://192.0.2.3\ngeo_mode: block\ngeo_codes: [XX]\nfoo: 1\n",
        ),
        (
            "zones/z.yaml",
            "name: z\nroutes: [10.0.0.1/8]\nfallback: nope\n",
        ),
        ("nodes/n.yaml", "name: n\nroles: [router]\nregion: eu\n"),
    ]);
    let checked = f.check();
    let codes: Vec<&str> = checked.diagnostics.iter().map(|d| d.code).collect();
    for code in [
        "duplicate-host",
        "invalid-url",
        "unknown-key",
        "cidr-host-bits",
        "missing-location",
    ] {
        assert!(codes.contains(&code), "{code} missing from {codes:?}");
    }
    // c.yaml failed its schema (unknown key), so its semantic rules are
    // not run on a half-typed value; z.yaml's fallback is still checked
    // once its routes are fixed, so it must not crash the run either.
    assert!(!checked.is_valid());
}

#[test]
fn warnings_do_not_fail_check() {
    let f = Fixture::with(&[
        ("zones/a.yaml", "name: a\nroutes: [10.0.0.0/8]\n"),
        ("zones/b.yaml", "name: b\nroutes: [10.1.0.0/16]\n"),
        (
            "nodes/n.yaml",
            "name: n\nroles: [ingest]\nregion: eu\nzone: a\n",
        ),
    ]);
    let checked = f.check();
    assert!(checked.is_valid(), "{:#?}", checked.diagnostics);
    let warnings: Vec<(&str, &str)> = checked
        .diagnostics
        .iter()
        .map(|d| {
            assert_eq!(d.severity, Severity::Warning);
            (d.code, &*d.file)
        })
        .collect();
    // 0.0.0.0/0 and ::/0 both uncovered; zone b has no nodes; edge-1 is unzoned.
    assert_eq!(
        warnings
            .iter()
            .filter(|(c, _)| *c == "uncovered-default-route")
            .count(),
        2,
        "{warnings:?}"
    );
    assert!(
        warnings.contains(&("empty-zone", "zones/b.yaml")),
        "{warnings:?}"
    );
    assert!(
        warnings.contains(&("unzoned-node", "nodes/edge-1.yaml")),
        "{warnings:?}"
    );
    let out = edgeform(f.path(), &["check"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn coverage_by_aggregate_counts() {
    // Two halves cover the IPv4 space as well as 0.0.0.0/0 does.
    let f = Fixture::with(&[
        (
            "zones/a.yaml",
            "name: a\nroutes: [0.0.0.0/1, 128.0.0.0/1, \"::/0\"]\n",
        ),
        (
            "nodes/edge-1.yaml",
            &*Box::leak(format!("{EDGE}zone: a\n").into_boxed_str()),
        ),
    ]);
    let checked = f.check();
    assert!(checked.diagnostics.is_empty(), "{:#?}", checked.diagnostics);
}

#[test]
fn typo_gets_a_suggestion_and_a_snippet() {
    let f = Fixture::with(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\ncahced: true\n",
    )]);
    let out = edgeform(f.path(), &["check"]);
    let err = crate::util::stderr(&out);
    assert!(err.contains("did you mean `cached`?"), "{err}");
    assert!(err.contains("sites/a.yaml:3:1"), "{err}");
    assert!(err.contains("cahced: true"), "{err}");
    assert!(err.contains("unknown-key"), "{err}");
}

#[test]
fn github_annotations() {
    let f = Fixture::with(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1/x\n",
    )]);
    let out = edgeform(
        f.path(),
        &["check", "--format", "github", "--path-prefix", "config"],
    );
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "::error file=config/sites/a.yaml,line=2,col=9,title=edgeform invalid-url::"
        ),
        "{text}"
    );
}

/// `regions` keeps the file's order (a list, not a set): an unknown
/// region is located at its own name, not at the name in its sorted place.
#[test]
fn unknown_region_is_located_at_its_name() {
    let f = Fixture::with(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\nregions: [zz, eu]\n",
    )]);
    let checked = f.check();
    let d: Vec<_> = checked
        .diagnostics
        .iter()
        .filter(|d| d.code == "unknown-region")
        .collect();
    assert_eq!(d.len(), 1, "{:#?}", checked.diagnostics);
    assert_eq!((d[0].span.line, d[0].span.column), (3, 11), "{:#?}", d[0]);
    assert!(d[0].message.contains("`zz`"), "{}", d[0].message);
}

/// `install.vars` secrets: by name and by value (a credential under an
/// innocuous name); every flagged secret of a file is masked in every
/// snippet, also where it shows as a neighbour of another diagnostic.
#[test]
fn install_var_secrets_are_refused_and_masked_in_every_snippet() {
    let node = "name: edge-1\nroles: [ingest]\nregion: eu\n\
install:\n  ssh: \"127.0.0.1:22\"\n  user: root\n  root: /srv/edgeform\n\
\x20 listen: \"127.0.0.1:8080\"\n  smoke_listen: \"127.0.0.1:8443\"\n  vars:\n\
\x20   api_token: \"SuperSecretValue123\"\n\
\x20   challenge-Secret: SuperSecretValue456\n\
\x20   apiAuth: \"Bearer c2VjcmV0LWJlYXJlcg\"\n\
\x20   upstreamKeyValue: Xk9fT2pLq8vZ3mN7wR4sYb\n\
\x20   workers: auto\n\
\x20   geoip_db: geoip/GeoLite2-City.mmdb\n";
    let f = Fixture::with(&[("nodes/edge-1.yaml", node)]);
    let mut lines: Vec<u32> = f
        .check()
        .diagnostics
        .iter()
        .filter(|d| d.code == "inline-secret")
        .map(|d| d.span.line)
        .collect();
    lines.sort_unstable();
    assert_eq!(lines, [11, 12, 13, 14]);
    let secrets = [
        "SuperSecretValue123",
        "SuperSecretValue456",
        "c2VjcmV0LWJlYXJlcg",
        "Xk9fT2pLq8vZ3mN7wR4sYb",
    ];
    for args in [
        &["check"][..],
        &["check", "--format", "json"],
        &["check", "--format", "github"],
    ] {
        let out = edgeform(f.path(), args);
        let text = format!("{}{}", stdout(&out), crate::util::stderr(&out));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {text}");
        for s in secrets {
            assert!(!text.contains(s), "{args:?} shows {s}:\n{text}");
        }
        if args == ["check"] {
            // The snippets are there, masked, with the settings around.
            assert!(
                text.contains("api_token: \"*******************\""),
                "{text}"
            );
            assert!(text.contains("workers: auto"), "{text}");
        }
    }
}
