//! The per-file stage on one in-memory file: YAML and schema errors, each
//! located at the offending key or value, and the typed content.

use super::*;
use crate::load::Unreadable;

fn source(path: &str, kind: Kind, text: &str) -> Source {
    Source {
        kind,
        path: Arc::from(path),
        text: Ok(text.to_owned()),
    }
}

fn site(text: &str) -> Source {
    source("sites/s.yaml", Kind::Site, text)
}

/// `line:col code: message` of each diagnostic of one file.
fn found(source: &Source) -> Vec<String> {
    parse_file(source)
        .diagnostics
        .iter()
        .map(|d| {
            format!(
                "{}:{} {}: {}",
                d.span.line, d.span.column, d.code, d.message
            )
        })
        .collect()
}

fn only(source: &Source) -> Diagnostic {
    let file = parse_file(source);
    assert_eq!(file.diagnostics.len(), 1, "{:?}", found(source));
    file.diagnostics.into_iter().next().unwrap()
}

const OK: &str = "host: s.example.com\norigin: http://203.0.113.10\n";

#[test]
fn a_misspelt_key_is_located_at_the_key_with_the_closest_one_suggested() {
    let d = only(&site(&format!("{OK}cahced: true\n")));
    assert_eq!((d.code, d.span.line, d.span.column), ("unknown-key", 3, 1));
    assert_eq!(d.message, "unknown key `cahced` in site");
    assert_eq!(d.help.as_deref(), Some("did you mean `cached`?"));
    assert_eq!(d.location(), "sites/s.yaml:3:1");
}

#[test]
fn a_nested_misspelt_key_is_located_inside_its_mapping() {
    let d = only(&site(&format!(
        "{OK}cache_rules:\n  - match_type: ext\n    match_value: .mp4\n    action: ttl\n    ttl: 60\n    tll: 5\n"
    )));
    assert_eq!((d.code, d.span.line, d.span.column), ("unknown-key", 8, 5));
    assert_eq!(d.help.as_deref(), Some("did you mean `ttl`?"));
}

#[test]
fn a_value_of_the_wrong_type_is_located_at_the_value() {
    let d = only(&site(&format!("{OK}cached: yes\n")));
    assert_eq!((d.code, d.span.line, d.span.column), ("wrong-type", 3, 9));
    assert_eq!(
        d.message,
        "`cached` must be a boolean (true or false), found a string"
    );
}

#[test]
fn a_value_outside_its_set_lists_the_allowed_ones() {
    let d = only(&site(&format!("{OK}waf_mode: paranoid\n")));
    assert_eq!(
        (d.code, d.span.line, d.span.column),
        ("invalid-value", 3, 11)
    );
    assert_eq!(d.message, "`paranoid` is not a valid `waf_mode`");
    assert!(d.help.as_deref().unwrap().starts_with("one of: "), "{d:?}");
}

#[test]
fn a_number_out_of_range_names_the_limit_and_its_place() {
    let d = only(&site(&format!(
        "{OK}cache_rules:\n  - {{match_type: ext, match_value: .mp4, action: ttl, ttl: 0}}\n"
    )));
    assert_eq!(
        (d.code, d.span.line, d.span.column),
        ("out-of-range", 4, 60)
    );
    assert_eq!(
        d.message,
        "`cache_rules[0].ttl` is `0`, below the minimum 1"
    );
}

#[test]
fn a_hostname_in_capitals_is_an_invalid_value_with_the_rule_in_the_help() {
    let d = only(&site("host: Example.com\norigin: http://203.0.113.10\n"));
    assert_eq!(
        (d.code, d.span.line, d.span.column),
        ("invalid-value", 1, 7)
    );
    assert_eq!(
        d.message,
        "`Example.com` is not a valid lower-case hostname"
    );
}

#[test]
fn a_node_folder_that_climbs_or_is_not_absolute_is_an_invalid_value() {
    let node = |dirs: &str, root: &str| {
        source(
            "nodes/e.yaml",
            Kind::Node,
            &format!(
                "name: e\nroles: [edge]\nregion: eu\nlocation: {{lat: 1.0, lon: 2.0}}\n\
                 cache: {{dirs: [\"{dirs}\"]}}\n\
                 install: {{ssh: h, user: u, root: \"{root}\", listen: \"127.0.0.1:80\", \
                 smoke_listen: \"127.0.0.1:81\"}}\n"
            ),
        )
    };
    for good in [
        "/var/cache/edge",
        "/var/cache/edge/",
        "/srv/.hidden/..x/...",
        "/",
    ] {
        let bad: Vec<String> = found(&node(good, good))
            .into_iter()
            .filter(|f| f.contains("absolute path"))
            .collect();
        assert!(bad.is_empty(), "{good}: {bad:?}");
    }
    for bad in ["/var/../etc", "/srv/./x", "/..", "relative", "/a//b"] {
        let said: Vec<String> = found(&node(bad, bad))
            .into_iter()
            .filter(|f| f.contains("is not an absolute path"))
            .collect();
        assert_eq!(said.len(), 2, "{bad}: {said:?}");
    }
}

#[test]
fn a_missing_required_key_is_located_at_the_files_start() {
    // (`origin` or `origins` is required by the site rules, which see both.)
    let d = only(&site("origin: http://203.0.113.10\n"));
    assert_eq!((d.code, d.span.line, d.span.column), ("missing-key", 1, 1));
    assert_eq!(d.message, "missing required key `host` in site");
}

#[test]
fn a_secret_looking_key_is_an_inline_secret_carrying_its_value_for_masking() {
    let d = only(&site(&format!("{OK}api_token: hunter2\n")));
    assert_eq!(
        (d.code, d.span.line, d.span.column),
        ("inline-secret", 3, 1)
    );
    assert!(!d.message.contains("hunter2"));
    assert_eq!(d.secret.as_deref(), Some("hunter2"));
}

#[test]
fn yaml_errors_have_their_own_codes_and_positions() {
    let d = only(&site("host: s.example.com\norigin: [http://x\n"));
    assert_eq!(d.code, "yaml-syntax");
    assert!(d.span.line >= 2, "{d:?}");
    let d = only(&site(&format!("{OK}host: t.example.com\n")));
    assert_eq!(
        (d.code, d.span.line, d.span.column),
        ("yaml-duplicate-key", 3, 1)
    );
    let d = only(&site(&format!("{OK}---\nhost: t.example.com\n")));
    assert_eq!(d.code, "yaml-multiple-documents");
    let d = only(&site(&format!("{OK}geo_codes: !env [GB]\n")));
    assert_eq!(d.code, "yaml-unsupported-tag");
}

#[test]
fn an_empty_site_is_an_error_but_an_empty_cluster_file_means_defaults() {
    let d = only(&site(""));
    assert_eq!((d.code, d.span.line, d.span.column), ("empty-file", 1, 1));
    assert_eq!(d.message, "this site file is empty");
    assert_eq!(
        d.help.as_deref(),
        Some("a site needs at least `host` and `origin` (or `origins`)")
    );
    let cluster = source("cluster.yaml", Kind::Cluster, "# all defaults\n");
    let (file, raw) = parse_typed(&cluster);
    assert!(file.diagnostics.is_empty());
    assert!(matches!(raw, Some(Raw::Cluster(c)) if c.name.is_none()));
}

#[test]
fn an_unreadable_file_is_reported_by_its_reason_at_its_start() {
    let s = Source {
        kind: Kind::Site,
        path: Arc::from("sites/bin.yaml"),
        text: Err(Unreadable::NotUtf8 { at: 3 }),
    };
    let d = only(&s);
    assert_eq!((d.code, d.span.line, d.span.column), ("encoding", 1, 1));
    assert_eq!(
        d.message,
        "cannot read this file: not valid UTF-8 (at byte 3)"
    );
    let s = Source {
        text: Err(Unreadable::Link),
        ..s
    };
    assert_eq!(only(&s).code, "not-a-file");
}

#[test]
fn a_well_formed_file_is_typed_and_a_later_lookup_still_finds_positions() {
    let s = site(&format!("{OK}aliases: [b.example.com]\n"));
    let (file, raw) = parse_typed(&s);
    assert!(file.diagnostics.is_empty());
    let Some(Raw::Site(site)) = raw else {
        panic!("a site")
    };
    assert_eq!(site.host, "s.example.com");
    assert_eq!(site.aliases, ["b.example.com"]);
    assert_eq!(site.origin.as_deref(), Some("http://203.0.113.10"));
    // The tree was dropped; locating parses again, to the same spans.
    let at = file.locate("/aliases/0");
    assert_eq!((at.line, at.column), (3, 11));
    // A pointer that is not there falls back to its nearest parent.
    let at = file.locate("/aliases/7");
    assert_eq!((at.line, at.column), (3, 10));
}

#[test]
fn a_shape_error_still_types_the_file_so_its_rules_run_too() {
    let s = site("host: Bad.example\norigin: http://203.0.113.10/app\n");
    let (file, raw) = parse_typed(&s);
    assert_eq!(file.diagnostics[0].code, "invalid-value");
    assert!(
        matches!(raw, Some(Raw::Site(s)) if s.origin.as_deref() == Some("http://203.0.113.10/app"))
    );
}

#[test]
fn a_pointer_is_shown_as_a_field_path() {
    assert_eq!(display_pointer("/cache_rules/0/ttl"), "cache_rules[0].ttl");
    assert_eq!(display_pointer("/install/vars/a~1b"), "install.vars.a/b");
    assert_eq!(display_pointer(""), "");
}

#[test]
fn a_suggestion_is_made_only_when_the_key_is_close() {
    let known = ["cached", "cache_rules", "origin"];
    assert_eq!(suggest("cahced", known.into_iter()), Some("cached"));
    assert_eq!(suggest("orgin", known.into_iter()), Some("origin"));
    assert_eq!(suggest("zzzzzz", known.into_iter()), None);
}
