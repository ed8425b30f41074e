//! The semantic rules, one family at a time, on repositories built in
//! memory: each problem's code and `file:line:col`, without files, git or
//! the binary.

use crate::diagnostic::Severity;
use crate::testkit::{EDGE, SITE, ZONE, check, codes, error, lines, valid, warning, with};

const S: &str = "sites/s.yaml";

/// A site file `sites/s.yaml` of `body` after the two required keys
/// (lines 1 and 2), so the body starts on line 3.
fn site(body: &str) -> String {
    format!("host: s.example.com\norigin: http://203.0.113.10\n{body}")
}

fn site_repo(text: &str) -> crate::Checked {
    check(&with(&[(S, text)]))
}

// ---- the repository as a whole ----

#[test]
fn the_small_repository_is_valid_and_resolves_every_file() {
    let config = valid(&with(&[]));
    assert_eq!(config.cluster.name, "edgeform", "the default cluster name");
    assert_eq!(config.sites.len(), 1);
    assert_eq!(config.sites[0].host, "a.example.com");
    assert_eq!(&*config.sites[0].file, "sites/a.example.com.yaml");
    assert_eq!(config.zones.len(), 1);
    assert_eq!(config.nodes.len(), 1);
    assert_eq!(config.nodes[0].region, "eu");
}

#[test]
fn every_problem_of_a_run_is_reported_not_the_first_only() {
    // A shape error and a bad origin in one site, its host served by
    // another too: all three in one run, sorted by file and position.
    let b =
        "host: b.example.com\norigin: http://203.0.113.10/app\ngeo_mode: block\ngeo_codes: [gb]\n";
    let same_host = (
        "sites/c.yaml",
        "host: b.example.com\norigin: http://203.0.113.10\n",
    );
    let c = check(&with(&[("sites/b.yaml", b), same_host]));
    // `gb` fails the schema's pattern and the country rule: one error at
    // one place, the schema's.
    assert_eq!(
        codes(&c),
        ["invalid-url", "invalid-value", "duplicate-host"],
        "{}",
        lines(&c)
    );
    error(&c, "invalid-url", "sites/b.yaml:2:9");
    error(&c, "invalid-value", "sites/b.yaml:4:13");
    error(&c, "duplicate-host", "sites/c.yaml:1:7");
    // A file whose shape cannot be typed (an unknown key) is left out of
    // the other rules: no follow-on noise.
    let untyped = "host: b.example.com\norigin: http://203.0.113.10/app\ncahced: true\n";
    let c = check(&with(&[("sites/b.yaml", untyped), same_host]));
    assert_eq!(codes(&c), ["unknown-key"], "{}", lines(&c));
    error(&c, "unknown-key", "sites/b.yaml:3:1");
}

#[test]
fn warnings_alone_leave_the_repository_valid() {
    let c = site_repo(&site("geo_codes: [FR]\n"));
    let d = warning(&c, "ignored-field", "sites/s.yaml:3:12");
    assert!(d.message.contains("`geo_mode` is `off`"), "{}", d.message);
    assert!(c.is_valid());
}

// ---- sites ----

#[test]
fn an_origin_host_is_used_as_written_and_within_dns_lengths() {
    let long_label = "a".repeat(64);
    let long_name = format!("{}.com", ["abcdefghij"; 25].join("."));
    for (origin, says) in [
        ("http://%41.example.com", "is read as `a.example.com`"),
        (
            "http://b\u{fc}cher.example",
            "is read as `xn--bcher-kva.example`",
        ),
        (&format!("http://{long_label}.example.com"), "labels of 64"),
        (&format!("https://{long_name}"), "278 characters"),
        ("http://a..example.com", "empty label"),
    ] {
        let c = site_repo(&format!("host: s.example.com\norigin: \"{origin}\"\n"));
        let d = error(&c, "invalid-url", "sites/s.yaml:2:9");
        assert!(d.message.contains(says), "{origin}: {}", d.message);
    }
    for origin in [
        "http://Origin.Example.com:8080",
        "https://origin.example.com.",
        "http://[2001:db8::1]:8080",
        "http://203.0.113.10",
        "http://origin_1.example.com",
    ] {
        let c = site_repo(&format!("host: s.example.com\norigin: \"{origin}\"\n"));
        assert!(c.is_valid(), "{origin}: {}", lines(&c));
    }
}

#[test]
fn an_origin_with_a_path_is_an_invalid_url_at_its_value() {
    let c = site_repo("host: s.example.com\norigin: http://203.0.113.10/app\n");
    error(&c, "invalid-url", "sites/s.yaml:2:9");
}

#[test]
fn an_origin_on_loopback_needs_the_loopback_flag() {
    let c = site_repo("host: s.example.com\norigin: http://127.0.0.1:8080\n");
    error(&c, "loopback-target", "sites/s.yaml:2:9");
    let c = site_repo("host: s.example.com\norigin: http://127.0.0.1:8080\nloopback: true\n");
    assert!(c.is_valid(), "{}", lines(&c));
}

#[test]
fn several_origins_are_one_ordered_list_of_one_scheme() {
    // One list, in order: the document's `origin` and `fallback_origins`.
    let c = site_repo(
        "host: s.example.com\norigins:\n  - http://203.0.113.10\n  - http://o2.example.com:8080\n",
    );
    assert!(c.is_valid(), "{}", lines(&c));
    let config = valid(&with(&[(
        S,
        "host: s.example.com\norigins: [http://203.0.113.10, http://o2.example.com]\n",
    )]));
    let doc = &config
        .sites
        .iter()
        .find(|s| s.host == "s.example.com")
        .unwrap()
        .doc;
    assert_eq!(doc.origin, "http://203.0.113.10");
    assert_eq!(doc.fallback_origins, ["http://o2.example.com"]);
    // A list of one is `origin`: the same document, byte for byte.
    let one = valid(&with(&[(
        S,
        "host: s.example.com\norigins: [http://203.0.113.10]\n",
    )]));
    let plain = valid(&with(&[(
        S,
        "host: s.example.com\norigin: http://203.0.113.10\n",
    )]));
    let text = |c: &crate::model::resolved::Config| {
        c.sites
            .iter()
            .find(|s| s.host == "s.example.com")
            .unwrap()
            .doc
            .to_canonical_json()
    };
    assert_eq!(text(&one), text(&plain));
    assert!(!text(&one).contains("fallback_origins"));

    // Mixed schemes, a duplicate, each located at its entry.
    let c = site_repo(
        "host: s.example.com\norigins:\n  - http://203.0.113.10\n  - https://o2.example.com\n  \
         - http://203.0.113.10\n",
    );
    let d = error(&c, "mixed-origin-schemes", "sites/s.yaml:4:5");
    assert!(d.message.contains("`http://`"), "{}", d.message);
    error(&c, "duplicate-value", "sites/s.yaml:5:5");
    assert_eq!(c.diagnostics.len(), 2, "{}", lines(&c));
    // Five origins: the fifth is where the list is too long.
    let c = site_repo(
        "host: s.example.com\norigins: [http://a.example.com, http://b.example.com, \
         http://c.example.com, http://d.example.com, http://e.example.com]\n",
    );
    error(&c, "too-many-origins", "sites/s.yaml:2:99");
    // Both keys, neither, or an empty list.
    let c = site_repo(
        "host: s.example.com\norigin: http://203.0.113.10\norigins: [http://203.0.113.11]\n",
    );
    error(&c, "invalid-value", "sites/s.yaml:3:10");
    let c = site_repo("host: s.example.com\norigins: []\n");
    error(&c, "missing-key", "sites/s.yaml:2:10");
    let c = site_repo("host: s.example.com\ncached: false\n");
    error(&c, "missing-key", "sites/s.yaml:1:1");
    // Each entry is an origin URL and a target as `origin` is.
    let c = site_repo(
        "host: s.example.com\norigins: [http://203.0.113.10, http://127.0.0.1:81, http://x/app]\n",
    );
    error(&c, "loopback-target", "sites/s.yaml:2:32");
    error(&c, "invalid-url", "sites/s.yaml:2:53");
}

#[test]
fn a_country_must_be_assigned_and_uk_is_told_it_is_gb() {
    let c = site_repo(&site("geo_mode: block\ngeo_codes: [GB, UK, GB]\n"));
    let d = error(&c, "invalid-country", "sites/s.yaml:4:17");
    assert_eq!(d.help.as_deref(), Some("the United Kingdom is `GB`"));
    warning(&c, "duplicate-value", "sites/s.yaml:4:21");
}

#[test]
fn an_allow_or_block_mode_needs_its_list() {
    let c = site_repo(&site("geo_mode: allow\nip_mode: block\n"));
    let d = error(&c, "missing-list", "sites/s.yaml:3:11");
    assert_eq!(d.message, "`geo_mode: allow` needs a non-empty `geo_codes`");
    let d = error(&c, "missing-list", "sites/s.yaml:4:10");
    assert_eq!(d.message, "`ip_mode: block` needs a non-empty `ip_list`");
}

#[test]
fn an_ip_list_network_with_host_bits_names_the_network_meant() {
    let c = site_repo(&site(
        "ip_mode: allow\nip_list: [198.51.100.7/24, 10.0.0.0/33, 192.0.2.1]\n",
    ));
    let d = error(&c, "cidr-host-bits", "sites/s.yaml:4:11");
    assert_eq!(
        d.message,
        "`198.51.100.7/24` has host bits set; the network is `198.51.100.0/24`"
    );
    error(&c, "invalid-cidr", "sites/s.yaml:4:28");
    // A bare address is a host route: no diagnostic at 4:41.
    assert_eq!(c.diagnostics.len(), 2, "{}", lines(&c));
}

#[test]
fn cache_rules_need_a_path_or_an_extension_and_a_ttl() {
    let c = site_repo(&site(
        "cache_rules:\n  - match_type: prefix\n    match_value: img/\n    action: ttl\n  - match_type: ext\n    match_value: mp4\n    action: ttl\n    ttl: 60\n",
    ));
    let d = error(&c, "invalid-match-value", "sites/s.yaml:5:18");
    assert_eq!(d.help.as_deref(), Some("write `/img/`"));
    error(&c, "missing-ttl", "sites/s.yaml:6:13");
    let d = error(&c, "invalid-match-value", "sites/s.yaml:8:18");
    assert_eq!(d.message, "`mp4` is not a file extension");
}

#[test]
fn a_ttl_with_bypass_is_ignored_with_a_warning_and_left_out_of_the_document() {
    let c = site_repo(&site(
        "cache_rules:\n  - match_type: ext\n    match_value: .m3u8\n    action: bypass\n    ttl: 5\n",
    ));
    warning(&c, "ignored-field", "sites/s.yaml:7:10");
    let config = c.config.expect("a warning only");
    let rule = &config
        .sites
        .iter()
        .find(|s| s.host == "s.example.com")
        .unwrap()
        .doc
        .cache_rules[0];
    assert_eq!(rule.ttl, None);
    assert_eq!(rule.action, "bypass");
}

#[test]
fn a_redirect_needs_its_status_and_a_block_ignores_redirect_fields() {
    let c = site_repo(&site(
        "edge_rules:\n  - match_type: prefix\n    match_value: /old/\n    action: redirect\n  - match_type: exact\n    match_value: /x\n    action: block\n    redirect_to: /y\n",
    ));
    let d = error(&c, "missing-redirect-status", "sites/s.yaml:6:13");
    assert_eq!(d.help.as_deref(), Some("one of 301, 302, 307, 308"));
    let d = warning(&c, "ignored-field", "sites/s.yaml:10:18");
    assert_eq!(
        d.message,
        "`redirect_to` has no effect with `action: block`"
    );
}

#[test]
fn a_rule_regex_outside_the_safe_dialect_is_refused_at_its_value() {
    let c = site_repo(&site(
        "edge_rules:\n  - match_type: regex\n    match_value: '^(a+)+$'\n    action: block\n",
    ));
    let d = error(&c, "invalid-regex", "sites/s.yaml:5:18");
    assert!(d.message.starts_with("`^(a+)+$`: "), "{}", d.message);
}

#[test]
fn a_redirect_that_can_leave_the_host_is_an_open_redirect_warning() {
    // Scheme-relative target: at the target.
    let c = site_repo(&site(
        "edge_rules:\n  - match_type: prefix\n    match_value: /go/\n    action: redirect\n    redirect_status: 302\n    redirect_to: //evil.example\n",
    ));
    warning(&c, "open-redirect", "sites/s.yaml:8:18");
    assert!(c.is_valid());
    // A prefix without `/` before a bare host: at the prefix.
    let c = site_repo(&site(
        "edge_rules:\n  - match_type: prefix\n    match_value: /shop\n    action: redirect\n    redirect_status: 301\n    redirect_to: https://shop.example.com\n",
    ));
    let d = warning(&c, "open-redirect", "sites/s.yaml:5:18");
    assert_eq!(
        d.help.as_deref(),
        Some("end the prefix with `/` or give the target a path: `https://shop.example.com/`")
    );
}

#[test]
fn a_match_value_that_is_not_a_normalised_path_warns_with_the_path_meant() {
    let c = site_repo(&site(
        "edge_rules:\n  - match_type: prefix\n    match_value: /a//b/\n    action: block\n",
    ));
    let d = warning(&c, "non-canonical-match", "sites/s.yaml:5:18");
    assert_eq!(d.help.as_deref(), Some("write `/a/b/`"));
}

#[test]
fn an_alias_listed_twice_in_one_site_is_a_duplicate_host() {
    let c = site_repo(&site("aliases: [b.example.com, s.example.com]\n"));
    let d = error(&c, "duplicate-host", "sites/s.yaml:3:26");
    assert_eq!(d.message, "`s.example.com` is listed twice in this site");
}

#[test]
fn an_empty_regions_list_sends_the_site_nowhere_and_is_refused() {
    let c = site_repo(&site("regions: []\n"));
    error(&c, "invalid-value", "sites/s.yaml:3:10");
}

// ---- nodes ----

const N: &str = "nodes/n.yaml";

fn node_repo(text: &str) -> crate::Checked {
    check(&with(&[(N, text)]))
}

#[test]
fn an_edge_without_location_is_located_at_the_file() {
    let c = node_repo("name: n\nroles: [edge]\nregion: eu\nzone: all\n");
    let d = error(&c, "missing-location", "nodes/n.yaml:1:1");
    assert_eq!(
        d.message,
        "node `n` is an edge or router and needs `location`"
    );
}

#[test]
fn a_role_listed_twice_is_a_duplicate_value() {
    let c = node_repo("name: n\nroles: [ingest, ingest]\nregion: eu\nzone: all\n");
    error(&c, "duplicate-value", "nodes/n.yaml:2:17");
}

#[test]
fn addresses_are_canonical_unique_and_not_internal() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\naddresses: [192.0.2.7, 0:0:0:0:0:0:0:1, nope, 192.0.2.7, 127.0.0.1]\n",
    );
    let d = error(&c, "non-canonical-address", "nodes/n.yaml:5:24");
    assert_eq!(d.help.as_deref(), Some("write `::1`"));
    error(&c, "invalid-address", "nodes/n.yaml:5:41");
    error(&c, "duplicate-address", "nodes/n.yaml:5:47");
    error(&c, "loopback-target", "nodes/n.yaml:5:58");
    assert_eq!(c.diagnostics.len(), 4, "{}", lines(&c));
}

#[test]
fn a_redis_url_host_is_an_ascii_name_as_for_origins() {
    for (url, says) in [
        ("redis://%41.example.com:6379", "not an ASCII name"),
        ("redis://b\u{fc}cher.example:6379", "not an ASCII name"),
    ] {
        let c = node_repo(&format!(
            "name: n\nroles: [edge]\nregion: eu\nzone: all\nlocation: {{lat: 52.37, lon: 4.9}}\n\
             redis: {{url: \"{url}\"}}\n"
        ));
        let d = c
            .diagnostics
            .iter()
            .find(|d| d.code == "invalid-url")
            .unwrap_or_else(|| panic!("{url}: {}", lines(&c)));
        assert!(d.message.contains(says), "{url}: {}", d.message);
    }
    let c = node_repo(
        "name: n\nroles: [edge]\nregion: eu\nzone: all\nlocation: {lat: 52.37, lon: 4.9}\n\
         redis: {url: \"redis://redis-1.Example.net:6379/0\"}\n",
    );
    assert!(
        c.diagnostics.iter().all(|d| d.code != "invalid-url"),
        "{}",
        lines(&c)
    );
}

#[test]
fn a_public_url_on_loopback_needs_the_nodes_loopback_flag() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\npublic_url: http://127.0.0.1:8080\n",
    );
    error(&c, "loopback-target", "nodes/n.yaml:5:13");
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\npublic_url: http://127.0.0.1:8080\nloopback: true\n",
    );
    assert!(c.is_valid(), "{}", lines(&c));
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\npublic_url: http://10.0.0.9:8080/live\n",
    );
    assert!(
        c.is_valid(),
        "a private address and a path are fine: {}",
        lines(&c)
    );
}

#[test]
fn a_public_url_with_a_query_or_fragment_is_refused_since_the_stream_is_appended() {
    for url in [
        "https://cdn.example.net/live?token=",
        "https://cdn.example.net/live#x",
    ] {
        let c = node_repo(&format!(
            "name: n\nroles: [ingest]\nregion: eu\nzone: all\npublic_url: {url}\n"
        ));
        error(&c, "invalid-url", "nodes/n.yaml:5:13");
        assert_eq!(c.diagnostics.len(), 1, "{}", lines(&c));
    }
}

#[test]
fn an_edges_https_listeners_are_listen_addresses_on_two_ports() {
    let edge = |https: &str| {
        node_repo(&format!(
            "name: n\nroles: [edge]\nregion: eu\nzone: all\nlocation: {{lat: 1.0, lon: 2.0}}\nhttps:\n{https}"
        ))
    };
    let c = edge("  listen: 0.0.0.0:443\n  proxy_listen: \"[::]:10443\"\n");
    assert!(c.is_valid(), "{}", lines(&c));
    let c = edge("  listen: \"443\"\n  proxy_listen: 0.0.0.0:443\n");
    error(&c, "https-listen-conflict", "nodes/n.yaml:8:17");
    let c = edge("  proxy_listen: 0.0.0.0:http\n");
    error(&c, "invalid-listen", "nodes/n.yaml:7:17");
    let c =
        node_repo("name: n\nroles: [ingest]\nregion: eu\nzone: all\nhttps: {listen: \"443\"}\n");
    error(&c, "https-not-edge", "nodes/n.yaml:5:8");
}

#[test]
fn the_smoke_listen_must_differ_from_the_live_listen() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\ninstall:\n  ssh: n.example.net:22\n  user: root\n  root: /srv/edgeform\n  listen: 0.0.0.0:80\n  smoke_listen: 0.0.0.0:80\n",
    );
    error(&c, "install-smoke-listen", "nodes/n.yaml:10:17");
}

#[test]
fn an_install_user_or_host_ssh_could_read_as_an_option_is_refused() {
    for (user, ssh, at) in [
        (
            "-oProxyCommand=touch$IFS/tmp/x",
            "n.example.net:22",
            "nodes/n.yaml:7:9",
        ),
        ("-V", "n.example.net:22", "nodes/n.yaml:7:9"),
        ("root@evil", "n.example.net:22", "nodes/n.yaml:7:9"),
        ("root", "-F/etc/passwd", "nodes/n.yaml:6:8"),
        ("root", "evil@n.example.net", "nodes/n.yaml:6:8"),
    ] {
        let c = node_repo(&format!(
            "name: n\nroles: [ingest]\nregion: eu\nzone: all\ninstall:\n  ssh: \"{ssh}\"\n  user: \"{user}\"\n  root: /srv/edgeform\n  listen: 0.0.0.0:80\n  smoke_listen: 127.0.0.1:8443\n"
        ));
        error(&c, "invalid-value", at);
        assert_eq!(c.diagnostics.len(), 1, "{}", lines(&c));
    }
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\ninstall:\n  ssh: \"[2001:db8::1]:2222\"\n  user: deploy_1.x\n  root: /srv/edgeform\n  listen: 0.0.0.0:80\n  smoke_listen: 127.0.0.1:8443\n",
    );
    assert!(c.is_valid(), "{}", lines(&c));
}

#[test]
fn a_secret_in_install_vars_is_refused_and_kept_out_of_the_message() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\ninstall:\n  ssh: n.example.net:22\n  user: root\n  root: /srv/edgeform\n  listen: 0.0.0.0:80\n  smoke_listen: 127.0.0.1:8443\n  vars: {api_token: hunter2, workers: auto}\n",
    );
    let d = error(&c, "inline-secret", "nodes/n.yaml:11:21");
    assert!(!d.message.contains("hunter2"), "{}", d.message);
    assert_eq!(d.secret.as_deref(), Some("hunter2"));
    assert_eq!(c.diagnostics.len(), 1, "{}", lines(&c));
}

#[test]
fn a_redis_block_needs_a_url_or_sentinels_with_a_master() {
    let c = node_repo("name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis: {master: m}\n");
    error(&c, "invalid-redis", "nodes/n.yaml:5:8");
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis:\n  url: redis://10.0.0.5\n  tls: {ca_file: /etc/ca.pem}\n",
    );
    let d = error(&c, "invalid-redis", "nodes/n.yaml:7:8");
    assert_eq!(d.message, "`tls` needs a `rediss://` URL");
}

#[test]
fn cache_dirs_must_not_be_empty() {
    let c = node_repo("name: n\nroles: [ingest]\nregion: eu\nzone: all\ncache: {dirs: []}\n");
    error(&c, "invalid-value", "nodes/n.yaml:5:15");
}

#[test]
fn a_cache_key_that_two_sites_could_share_is_refused_at_its_value() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\ncache: {key: \"$scheme$host$request_uri\"}\n",
    );
    let d = error(&c, "invalid-value", "nodes/n.yaml:5:14");
    assert!(d.message.contains("`sbank.test`"), "{}", d.message);
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\ncache: {key: \"$scheme://$host$request_uri\"}\n",
    );
    assert!(c.is_valid(), "{}", lines(&c));
    let c = node_repo("name: n\nroles: [ingest]\nregion: eu\nzone: all\n");
    assert!(c.is_valid(), "{}", lines(&c));
}

// ---- zones ----

#[test]
fn a_zone_falling_back_to_itself_warns_at_the_fallback() {
    let c = check(&with(&[(
        "zones/all.yaml",
        "name: all\nroutes: [0.0.0.0/0, \"::/0\"]\nfallback: all\n",
    )]));
    let d = warning(&c, "fallback-to-self", "zones/all.yaml:3:11");
    assert_eq!(
        d.message,
        "zone `all` falls back to itself; the chain ends there"
    );
    assert!(c.is_valid());
}

#[test]
fn a_route_twice_in_one_zone_is_a_duplicate_route() {
    let c = check(&with(&[(
        "zones/all.yaml",
        "name: all\nroutes: [0.0.0.0/0, \"::/0\", 10.0.0.0/8, 10.0.0.0/8]\n",
    )]));
    let d = error(&c, "duplicate-route", "zones/all.yaml:2:41");
    assert_eq!(
        d.message,
        "`10.0.0.0/8` is listed twice in `routes` (also item 2)"
    );
}

// ---- cluster.yaml ----

fn cluster_repo(text: &str) -> crate::Checked {
    check(&with(&[("cluster.yaml", text)]))
}

#[test]
fn trusted_proxies_null_clears_the_list_as_the_seed_writes_it() {
    for text in [
        "trusted_proxies: null\n",
        "trusted_proxies: ~\n",
        "trusted_proxies:\n",
    ] {
        let config = valid(&with(&[("cluster.yaml", text)]));
        assert!(config.cluster.trusted_proxies.is_empty(), "{text}");
    }
}

#[test]
fn cluster_settings_resolve_with_defaults_for_what_is_not_written() {
    let config = valid(&with(&[(
        "cluster.yaml",
        "name: demo\ntrusted_proxies: [192.0.2.10/32]\napply: {max_delete_percent: 10}\ngeo: {fail_timeout: 2m}\n",
    )]));
    let c = &config.cluster;
    assert_eq!(c.name, "demo");
    assert_eq!(
        c.trusted_proxies,
        ["192.0.2.10/32".parse::<ipnet::IpNet>().unwrap()]
    );
    assert_eq!(c.apply.max_delete_percent, 10);
    let defaults = crate::model::resolved::Thresholds::default();
    assert_eq!(c.apply.max_change_percent, defaults.max_change_percent);
    assert_eq!(c.apply.min_keys, defaults.min_keys);
    assert_eq!(c.geo.fail_timeout_s, 120);
    assert!(c.mqtt.is_none() && c.anycast.is_none() && c.freeze.is_empty());
}

#[test]
fn geo_buckets_must_increase_and_fail_timeout_is_whole_seconds() {
    let c = cluster_repo(
        "geo:\n  buckets:\n    - {below_km: 500, weight: 10}\n    - {below_km: 500, weight: 5}\n  fail_timeout: 1500ms\n",
    );
    error(&c, "invalid-buckets", "cluster.yaml:3:5");
    let d = error(&c, "invalid-value", "cluster.yaml:5:17");
    assert_eq!(
        d.message,
        "`1500ms` is not a whole number of seconds (nginx `fail_timeout`)"
    );
}

#[test]
fn freeze_windows_need_rfc3339_times_an_end_after_the_start_and_unique_names() {
    let c = cluster_repo(
        "apply:\n  freeze:\n    - {name: a, start: \"2026-12-26T00:00:00Z\", end: \"2026-12-27T00:00:00Z\"}\n    - {name: b, start: 2026-12-24, end: \"2026-12-26T00:00:00Z\"}\n    - {name: c, start: \"2026-12-26T00:00:00Z\", end: \"2026-12-24T00:00:00Z\"}\n    - {name: a, start: \"2026-12-28T00:00:00Z\", end: \"2026-12-29T00:00:00Z\"}\n",
    );
    error(&c, "invalid-time", "cluster.yaml:4:24");
    let d = error(&c, "invalid-window", "cluster.yaml:5:53");
    assert_eq!(d.message, "freeze window `c` ends before it starts");
    let d = error(&c, "duplicate-value", "cluster.yaml:6:14");
    assert_eq!(d.message, "freeze window `a` is named twice");
    assert_eq!(c.diagnostics.len(), 3, "{}", lines(&c));
}

const EDGE_2: (&str, &str) = (
    "nodes/edge-2.yaml",
    "name: edge-2\nroles: [edge]\nregion: us\nzone: all\nlocation: {lat: 40.7, lon: -74.0}\naddresses: [198.51.100.12]\nredis: {url: redis://10.0.0.6:6379}\n",
);
const ROUTER: (&str, &str) = (
    "nodes/router-1.yaml",
    "name: router-1\nroles: [router]\nregion: us\nlocation: {lat: 40.7, lon: -74.0}\naddresses: [198.51.100.13]\n",
);

fn waves_repo(cluster: &str) -> crate::Checked {
    check(&with(&[("cluster.yaml", cluster), EDGE_2, ROUTER]))
}

#[test]
fn waves_resolve_with_bake_times_and_gate_defaults() {
    let config = valid(&with(&[
        (
            "cluster.yaml",
            "apply:\n  waves:\n    - {name: canary, nodes: [edge-1], bake: 10m}\n    - {name: rest}\n  auto_rollback: true\n  gate: {min_requests: 50}\n",
        ),
        EDGE_2,
        ROUTER,
    ]));
    let r = &config.cluster.rollout;
    assert_eq!(r.waves.len(), 2);
    assert_eq!((r.waves[0].bake_s, r.waves[1].bake_s), (600, 0));
    assert!(r.waves[1].is_rest() && r.auto_rollback);
    assert_eq!(r.gate.min_requests, 50);
    assert_eq!(r.gate.max_5xx_ratio_increase, 0.02);
    assert_eq!(r.gate.max_refusal_ratio_increase, 0.05);
    assert_eq!(r.gate.max_hit_ratio_drop, 0.2);
    assert_eq!(r.gate.prometheus, None);
    assert_eq!(
        r.assign(&config.nodes),
        vec![vec!["edge-1".to_owned()], vec!["edge-2".to_owned()]]
    );
}

#[test]
fn no_waves_is_no_rollout() {
    let config = valid(&with(&[]));
    assert!(config.cluster.rollout.waves.is_empty());
    assert!(!config.cluster.rollout.auto_rollback);
}

#[test]
fn waves_name_known_targets_regions_and_roles_at_their_place() {
    let c = waves_repo(
        "apply:\n  waves:\n    - {name: a, nodes: [edge-3, router-1], regions: [ue], roles: [ingest]}\n    - {name: b, nodes: [edge-1]}\n",
    );
    let d = error(&c, "unknown-node", "cluster.yaml:3:25");
    assert_eq!(d.message, "wave `a` names no node `edge-3`");
    assert_eq!(d.help.as_deref(), Some("did you mean `edge-1`?"));
    let d = error(&c, "unknown-node", "cluster.yaml:3:33");
    assert_eq!(
        d.message,
        "node `router-1` has no `redis` block: it is not a target"
    );
    let d = error(&c, "unknown-region", "cluster.yaml:3:54");
    assert_eq!(d.message, "region `ue` has no target");
    error(&c, "unknown-role", "cluster.yaml:3:67");
}

#[test]
fn a_node_in_two_waves_an_empty_wave_and_rest_before_the_last_are_refused() {
    let c = waves_repo(
        "apply:\n  waves:\n    - {name: eu, regions: [eu]}\n    - {name: rest}\n    - {name: canary, nodes: [edge-1]}\n    - {name: eu, nodes: [edge-2, edge-2], bake: 1500ms}\n",
    );
    let d = error(&c, "node-in-two-waves", "cluster.yaml:5:30");
    assert_eq!(d.message, "node `edge-1` is in wave `eu` already (item 0)");
    error(&c, "rest-not-last", "cluster.yaml:4:7");
    let d = error(&c, "empty-wave", "cluster.yaml:5:7");
    assert_eq!(d.message, "wave `canary` selects no target");
    error(&c, "duplicate-value", "cluster.yaml:6:14");
    error(&c, "duplicate-value", "cluster.yaml:6:34");
    error(&c, "invalid-value", "cluster.yaml:6:49");
}

#[test]
fn a_bake_time_is_whole_seconds_up_to_a_week() {
    for (bake, ok) in [
        ("10m", true),
        ("168h", true),
        ("169h", false),
        ("1500ms", false),
    ] {
        let c = waves_repo(&format!(
            "apply:\n  waves:\n    - {{name: a, nodes: [edge-1], bake: {bake}}}\n    - {{name: rest}}\n"
        ));
        assert_eq!(c.is_valid(), ok, "{bake}: {}", lines(&c));
    }
}

#[test]
fn anycast_asns_upstreams_and_prefixes_are_checked() {
    let c = cluster_repo(
        "anycast:\n  origin_asns: [64496, 23456]\n  upstreams:\n    - {name: transit-a, asn: 64496}\n  prefixes:\n    - {prefix: 192.0.2.0/24, upstreams: [transit-b]}\n    - {prefix: 192.0.2.0/24}\n",
    );
    error(&c, "invalid-asn", "cluster.yaml:2:24");
    let d = error(&c, "invalid-asn", "cluster.yaml:4:30");
    assert_eq!(
        d.message,
        "AS64496 is one of your `origin_asns`, not an upstream"
    );
    let d = error(&c, "unknown-upstream", "cluster.yaml:6:42");
    assert_eq!(d.help.as_deref(), Some("did you mean `transit-a`?"));
    error(&c, "duplicate-value", "cluster.yaml:7:16");
}

#[test]
fn cluster_urls_and_networks_are_checked_like_every_other() {
    let c = cluster_repo(
        "trusted_proxies: [192.0.2.10/24]\nmqtt: {url: mqtt://broker.example.net:1883/edge}\n",
    );
    error(&c, "cidr-host-bits", "cluster.yaml:1:19");
    let d = error(&c, "invalid-url", "cluster.yaml:2:13");
    assert_eq!(
        d.message,
        "`mqtt://broker.example.net:1883/edge` has a path, query or fragment (`/edge`)"
    );
}

// ---- cross-file rules ----

#[test]
fn a_host_served_by_two_sites_names_where_it_was_first() {
    let c = check(&with(&[(
        "sites/b.yaml",
        "host: b.example.com\naliases: [a.example.com]\norigin: http://203.0.113.10\n",
    )]));
    let d = error(&c, "duplicate-host", "sites/b.yaml:2:11");
    assert_eq!(
        d.message,
        "host `a.example.com` is already served by sites/a.example.com.yaml:1:7"
    );
}

#[test]
fn zone_and_node_names_and_addresses_are_unique_across_files() {
    let c = check(&with(&[
        ("zones/copy.yaml", "name: all\n"),
        (
            "nodes/edge-2.yaml",
            "name: edge-1\nroles: [ingest]\nregion: eu\nzone: all\naddresses: [198.51.100.11]\n",
        ),
    ]));
    let d = error(&c, "duplicate-zone", "zones/copy.yaml:1:7");
    assert_eq!(
        d.message,
        "zone `all` is already defined in zones/all.yaml:1:7"
    );
    let d = error(&c, "duplicate-node", "nodes/edge-2.yaml:1:7");
    assert_eq!(
        d.message,
        "node `edge-1` is already defined in nodes/edge-1.yaml:1:7"
    );
    let d = error(&c, "duplicate-address", "nodes/edge-2.yaml:5:13");
    assert_eq!(
        d.message,
        "address `198.51.100.11` also belongs to node `edge-1` (nodes/edge-1.yaml:6:13)"
    );
}

#[test]
fn a_route_in_two_zones_is_a_duplicate_route_naming_the_owner() {
    let c = check(&with(&[("zones/b.yaml", "name: b\nroutes: [\"::/0\"]\n")]));
    let d = error(&c, "duplicate-route", "zones/b.yaml:2:10");
    assert_eq!(
        d.message,
        "route `::/0` is already in zone `all` (zones/all.yaml:2:21)"
    );
}

#[test]
fn an_unknown_zone_or_region_suggests_the_closest_name() {
    let c = check(&with(&[
        (
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nzone: al\nlocation: {lat: 52.37, lon: 4.9}\naddresses: [198.51.100.11]\nredis: {url: redis://10.0.0.5:6379}\n",
        ),
        ("zones/b.yaml", "name: b\nfallback: nowhere\n"),
        (
            "sites/r.yaml",
            "host: r.example.com\norigin: http://203.0.113.10\nregions: [ue]\n",
        ),
    ]));
    let d = error(&c, "unknown-zone", "nodes/edge-1.yaml:4:7");
    assert_eq!(d.message, "zone `al` names no zone");
    assert_eq!(d.help.as_deref(), Some("did you mean `all`?"));
    let d = error(&c, "unknown-zone", "zones/b.yaml:2:11");
    assert_eq!(d.help.as_deref(), Some("known zones: all, b"));
    let d = error(&c, "unknown-region", "sites/r.yaml:3:11");
    assert_eq!(d.help.as_deref(), Some("did you mean `eu`?"));
}

#[test]
fn restricted_routing_warns_of_uncovered_families_empty_zones_and_unzoned_nodes() {
    let c = check(&with(&[
        ("zones/all.yaml", "name: all\nroutes: [10.0.0.0/8]\n"),
        ("zones/far.yaml", "name: far\nroutes: [\"::/0\"]\n"),
        (
            "nodes/ingest-1.yaml",
            "name: ingest-1\nroles: [ingest]\nregion: eu\n",
        ),
    ]));
    let d = warning(&c, "uncovered-default-route", "zones/all.yaml:2:9");
    assert!(
        d.message.contains("`0.0.0.0/0` is not covered"),
        "{}",
        d.message
    );
    warning(&c, "empty-zone", "zones/far.yaml:1:7");
    warning(&c, "unzoned-node", "nodes/ingest-1.yaml:1:7");
    assert!(c.is_valid(), "warnings only:\n{}", lines(&c));
    assert_eq!(c.diagnostics.len(), 3, "{}", lines(&c));
}

#[test]
fn edges_a_router_cannot_use_are_warned_of() {
    let c = check(&with(&[
        (
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nzone: all\nlocation: {lat: 52.37, lon: 4.9}\naddresses: [10.1.2.3]\n",
        ),
        (
            "nodes/edge-2.yaml",
            "name: edge-2\nroles: [edge]\nregion: eu\nzone: all\nlocation: {lat: 52.37, lon: 4.9}\nredis: {url: redis://10.0.0.6:6379}\n",
        ),
        (
            "nodes/router-1.yaml",
            "name: router-1\nroles: [router]\nregion: eu\nlocation: {lat: 52.3, lon: 4.8}\n",
        ),
    ]));
    warning(&c, "edge-without-redis", "nodes/edge-1.yaml:1:7");
    warning(&c, "edge-without-address", "nodes/edge-2.yaml:1:7");
    let d = warning(&c, "router-pool-empty", "nodes/router-1.yaml:1:7");
    assert_eq!(
        d.message,
        "router `router-1` has an empty 443 pool: no edge has a public address"
    );
    assert!(c.is_valid(), "{}", lines(&c));
}

// ---- URLs as written ----

#[test]
fn a_control_character_in_a_url_is_refused_as_written() {
    let c = site_repo("host: s.example.com\norigin: \"http://203.0.113.10\\r\\n\"\n");
    let d = error(&c, "invalid-url", "sites/s.yaml:2:9");
    assert_eq!(
        d.message,
        "`http://203.0.113.10\\r\\n` contains a carriage return (CR) (character 20); URLs are checked as written"
    );
}

#[test]
fn a_password_in_a_redis_url_is_an_inline_secret_masked_in_the_message() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis: {url: \"redis://:s3cret@10.0.0.5\"}\n",
    );
    let d = error(&c, "inline-secret", "nodes/n.yaml:5:14");
    assert_eq!(
        d.message,
        "`redis://…@10.0.0.5` carries credentials; secrets never live in the repository"
    );
    assert_eq!(d.secret.as_deref(), Some(":s3cret"));
}

#[test]
fn a_secret_query_parameter_is_an_inline_secret_shown_without_its_value() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis: {url: \"redis://10.0.0.5?db=1&password=hunter2\"}\n",
    );
    let d = error(&c, "inline-secret", "nodes/n.yaml:5:14");
    assert_eq!(
        d.message,
        "`redis://10.0.0.5?db=1&password=…` carries credentials; secrets never live in the repository"
    );
    assert_eq!(d.secret.as_deref(), Some("hunter2"));
    // A user name alone names an ACL user: no secret.
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis: {url: \"redis://edgeform@10.0.0.5\"}\n",
    );
    assert!(c.is_valid(), "{}", lines(&c));
}

#[test]
fn a_host_written_otherwise_than_its_canonical_address_is_refused() {
    let c = site_repo("host: s.example.com\norigin: http://0x7f.1\n");
    let d = error(&c, "non-canonical-address", "sites/s.yaml:2:9");
    assert!(d.message.contains("`0x7f.1`"), "{}", d.message);
}

#[test]
fn a_redis_url_path_must_be_a_database_number() {
    let c = node_repo(
        "name: n\nroles: [ingest]\nregion: eu\nzone: all\nredis: {url: redis://10.0.0.5/abc}\n",
    );
    error(&c, "invalid-url", "nodes/n.yaml:5:14");
}

// ---- networks ----

#[test]
fn a_network_parses_with_host_bits_clear_and_a_bare_address_as_a_host_route() {
    use super::net::{NetError, parse_net};
    let ok = |t: &str| parse_net(t).ok().map(|n| n.to_string());
    assert_eq!(ok("10.0.0.0/8").as_deref(), Some("10.0.0.0/8"));
    assert_eq!(ok("192.0.2.1").as_deref(), Some("192.0.2.1/32"));
    assert_eq!(ok("2001:db8::1").as_deref(), Some("2001:db8::1/128"));
    assert!(matches!(parse_net("10.0.0.0/33"), Err(NetError::Invalid)));
    assert!(matches!(parse_net("example.com"), Err(NetError::Invalid)));
    match parse_net("2001:db8::1/32") {
        Err(NetError::HostBits(n)) => assert_eq!(n.to_string(), "2001:db8::/32"),
        _ => panic!("host bits"),
    }
}

#[test]
fn covering_a_family_takes_the_union_of_its_routes() {
    use super::cross::covers_all;
    let nets = |v: &[&str]| -> Vec<ipnet::IpNet> { v.iter().map(|s| s.parse().unwrap()).collect() };
    assert!(covers_all(&nets(&["0.0.0.0/1", "128.0.0.0/1"]), true));
    assert!(!covers_all(&nets(&["0.0.0.0/1", "::/0"]), true));
    assert!(covers_all(&nets(&["0.0.0.0/1", "::/0"]), false));
    assert!(!covers_all(&[], false));
}

#[test]
fn the_small_repository_fixtures_are_each_valid_alone_where_they_can_be() {
    // The fixtures other tests build on: a site alone is valid (no node
    // needed), and so are the zone with the edge.
    assert!(check(&[SITE]).is_valid());
    let c = check(&[ZONE, EDGE]);
    assert!(c.is_valid(), "{}", lines(&c));
    assert!(
        c.diagnostics
            .iter()
            .all(|d| d.severity == Severity::Warning)
    );
}

// ---- a site's own gate thresholds (`rollout:`) ----

#[test]
fn a_sites_rollout_thresholds_reach_the_control_plane_not_the_edge() {
    let plain = valid(&with(&[(S, &site(""))]));
    let with_gate = valid(&with(&[(
        S,
        &site("rollout: {max_5xx_ratio_increase: 0.1, min_requests: 50}\n"),
    )]));
    let find = |c: &crate::Config| {
        c.sites
            .iter()
            .find(|s| s.host == "s.example.com")
            .cloned()
            .expect("the site")
    };
    let (plain, gated) = (find(&plain), find(&with_gate));
    assert_eq!(plain.rollout, None);
    let gate = gated.rollout.as_deref().expect("its thresholds");
    assert_eq!(gate.max_5xx_ratio_increase, Some(0.1));
    assert_eq!(gate.min_requests, Some(50));
    assert_eq!(gate.max_hit_ratio_drop, None);
    // The edge's document is the same with or without them.
    assert_eq!(plain.doc, gated.doc);
}

#[test]
fn a_sites_rollout_ratio_above_1_is_out_of_range_at_its_key() {
    let c = site_repo(&site("rollout:\n  max_hit_ratio_drop: 1.5\n"));
    assert_eq!(codes(&c), ["out-of-range"], "{}", lines(&c));
    error(&c, "out-of-range", "sites/s.yaml:4:23");
}
