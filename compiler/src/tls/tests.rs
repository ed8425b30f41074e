//! Certificate rules and documents on a repository built in memory.

use super::*;
use crate::testkit::{line, repo, valid};

const NODE: (&str, &str) = (
    "nodes/edge-1.yaml",
    "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.37, lon: 4.9}\naddresses: [198.51.100.11]\nredis: {url: redis://10.0.0.11:6379}\n",
);
const SITE: (&str, &str) = (
    "sites/shop.yaml",
    "host: shop.example.com\naliases: [www.example.com, example.com]\norigin: https://203.0.113.10\ntls: {certificate: shop}\n",
);
const PLAIN: (&str, &str) = (
    "sites/plain.yaml",
    "host: plain.example.com\norigin: http://203.0.113.10\n",
);
const NOW: i64 = 1_800_000_000;

fn cert(names: &[&str], not_after: i64) -> Certificate {
    Certificate {
        name: "shop".into(),
        chain: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        key: "-----BEGIN PRIVATE KEY-----\nSECRETKEYBYTES\n-----END PRIVATE KEY-----\n".into(),
        fingerprint: "0f".repeat(32),
        not_before: NOW - 86_400,
        not_after,
        names: names.iter().map(|s| (*s).to_owned()).collect(),
        key_matches: true,
    }
}

fn certs(c: Certificate) -> Certificates {
    Certificates {
        by_name: [(c.name.clone(), c)].into_iter().collect(),
    }
}

fn run(c: Option<Certificate>, checking: Checking) -> Vec<String> {
    let files = [NODE, SITE, PLAIN];
    let config = valid(&files);
    let r = repo(&files);
    let store = c.map(certs);
    let known = match &store {
        Some(certs) => Known::Store {
            certs,
            place: "/var/lib/edgeform".into(),
            broken: BTreeMap::new(),
        },
        None => Known::Nothing("no state directory".into()),
    };
    check(&config, &r, &known, NOW, checking)
        .iter()
        .map(line)
        .collect()
}

#[test]
fn a_wildcard_covers_exactly_one_label() {
    assert!(covers("shop.example.com", "shop.example.com"));
    assert!(covers("SHOP.example.com", "shop.example.com"));
    assert!(covers("*.example.com", "shop.example.com"));
    assert!(!covers("*.example.com", "example.com"));
    assert!(!covers("*.example.com", "a.shop.example.com"));
    assert!(!covers("*.com", "example.com"));
    assert!(covers("*.example.com", "*.example.com"));
    assert!(!covers("shop.example.com", "*.example.com"));
    assert!(!covers("*.example.com", ".example.com"));
}

#[test]
fn a_certificate_covering_every_name_passes() {
    let c = cert(&["*.example.com", "example.com"], NOW + 90 * 86_400);
    assert_eq!(run(Some(c), Checking::WorkingTree), Vec::<String>::new());
}

#[test]
fn each_uncovered_name_is_an_error_at_its_place() {
    let c = cert(&["shop.example.com"], NOW + 90 * 86_400);
    let out = run(Some(c), Checking::WorkingTree);
    assert_eq!(out.len(), 2, "{out:#?}");
    assert!(
        out[0].starts_with("sites/shop.yaml:2:11 error certificate-name-mismatch"),
        "{out:#?}"
    );
    assert!(out[0].contains("`www.example.com`"), "{out:#?}");
    assert!(out[1].contains("`example.com`"), "{out:#?}");
}

#[test]
fn expiry_is_an_error_for_the_working_tree_and_a_warning_for_an_old_revision() {
    let c = cert(&["*.example.com", "example.com"], NOW - 1);
    let out = run(Some(c.clone()), Checking::WorkingTree);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert!(out[0].contains("error certificate-expired"), "{out:#?}");
    assert!(out[0].starts_with("sites/shop.yaml:4:20"), "{out:#?}");
    let out = run(Some(c), Checking::Revision);
    assert!(out[0].contains("warning certificate-expired"), "{out:#?}");
}

#[test]
fn under_three_weeks_left_is_a_warning() {
    let c = cert(&["*.example.com", "example.com"], NOW + 20 * 86_400);
    let out = run(Some(c), Checking::WorkingTree);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert!(
        out[0].contains("warning certificate-expiring") && out[0].contains("in 20 days"),
        "{out:#?}"
    );
    let c = cert(&["*.example.com", "example.com"], NOW + 22 * 86_400);
    assert!(run(Some(c), Checking::WorkingTree).is_empty());
}

#[test]
fn a_key_that_does_not_match_is_an_error() {
    let mut c = cert(&["*.example.com", "example.com"], NOW + 90 * 86_400);
    c.key_matches = false;
    let out = run(Some(c), Checking::WorkingTree);
    assert!(
        out[0].contains("error certificate-key-mismatch"),
        "{out:#?}"
    );
}

#[test]
fn without_a_state_directory_the_reference_is_noted_not_checked() {
    let out = run(None, Checking::WorkingTree);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert!(
        out[0].contains("warning certificate-not-checked")
            && out[0].contains("certificate `shop` not checked (no state directory)"),
        "{out:#?}"
    );
    let mut other = cert(&["x.test"], NOW + 90 * 86_400);
    other.name = "other".into();
    let out = run(Some(other), Checking::WorkingTree);
    assert!(out[0].contains("not in the state directory"), "{out:#?}");
}

#[test]
fn every_host_and_alias_gets_the_document_and_build_never_shows_the_key() {
    let files = [NODE, SITE, PLAIN];
    let config = valid(&files);
    let c = cert(&["*.example.com", "example.com"], NOW + 90 * 86_400);
    let compiled = crate::compile::compile_with(&config, &certs(c.clone()));
    let t = &compiled.targets["edge-1"];
    let tls: Vec<(&str, &str)> = t.entries().filter(|(k, _)| k.starts_with("tls:")).collect();
    assert_eq!(
        tls.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [
            "tls:example.com",
            "tls:shop.example.com",
            "tls:www.example.com"
        ]
    );
    assert_eq!(tls[0].1, c.doc().to_canonical_json());
    assert!(tls[0].1.contains("SECRETKEYBYTES"));
    let json = t.to_json();
    assert!(
        !json.contains("SECRETKEYBYTES") && !json.contains("PRIVATE KEY"),
        "{json}"
    );
    assert!(json.contains(&format!("redacted (certificate sha256:{})", c.fingerprint)));
    // Without certificates: no `tls:` key, and the site documents unchanged.
    let plain = crate::compile::compile(&config);
    let p = &plain.targets["edge-1"];
    assert!(p.entries().all(|(k, _)| !k.starts_with("tls:")));
    let sites = |t: &crate::compile::Target| -> Vec<(String, String)> {
        t.entries()
            .filter(|(k, _)| !k.starts_with("tls:"))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    assert_eq!(sites(p), sites(t));
    // A diff shows the certificate by fingerprint, never the key.
    let d = crate::diff::diff(&plain, &compiled);
    let changes = &d.targets[0].changes;
    assert_eq!(changes.len(), 3);
    for ch in changes {
        let after = ch.after.as_deref().unwrap();
        assert!(!after.contains("SECRETKEYBYTES"), "{after}");
        assert!(after.contains("redacted (certificate sha256:"), "{after}");
    }
}

fn site_errors(site: &str) -> Vec<String> {
    let checked = crate::testkit::check(&[NODE, ("sites/s.yaml", site)]);
    checked.diagnostics.iter().map(line).collect()
}

#[test]
fn the_new_site_keys_are_refused_with_their_place() {
    let base = "host: s.example.com\norigin: https://203.0.113.10\n";
    for (extra, want) in [
        (
            "tls: {acme: false}\n",
            "sites/s.yaml:3:13 error invalid-tls",
        ),
        (
            "aliases: [\"*.example.com\"]\ntls: {acme: true}\n",
            "sites/s.yaml:3:11 error acme-wildcard",
        ),
        ("tls: {}\n", "sites/s.yaml:3:6 error invalid-tls"),
        (
            "tls: {certificate: a, acme: true}\n",
            "sites/s.yaml:3:6 error invalid-tls",
        ),
        ("tls: {certificate: Shop}\n", "sites/s.yaml:3:20 error"),
        (
            "https_redirect: true\n",
            "sites/s.yaml:3:17 error redirect-without-tls",
        ),
        (
            "max_body_size: 2g\n",
            "sites/s.yaml:3:16 error invalid-size",
        ),
        (
            "max_body_size: 10 MB\n",
            "sites/s.yaml:3:16 error invalid-size",
        ),
        ("max_body_size: 0\n", "sites/s.yaml:3:16 error invalid-size"),
    ] {
        let out = site_errors(&format!("{base}{extra}"));
        assert!(
            out.iter().any(|l| l.starts_with(want)),
            "{extra}: want {want}, got {out:#?}"
        );
    }
    let out =
        site_errors("host: s.example.com\norigin: http://203.0.113.10\norigin_tls_verify: false\n");
    assert!(
        out.iter()
            .any(|l| l.starts_with("sites/s.yaml:3:20 warning ignored-field")),
        "{out:#?}"
    );
}

#[test]
fn sizes_read_as_nginx_reads_them() {
    use crate::validate::parse_size;
    assert_eq!(parse_size("512k"), Some(512 << 10));
    assert_eq!(parse_size("25M"), Some(25 << 20));
    assert_eq!(parse_size("1g"), Some(1 << 30));
    assert_eq!(parse_size("1048576"), Some(1 << 20));
    for bad in ["", "k", "1.5m", "-1", "10 m", "1t", "99999999999999999999"] {
        assert_eq!(parse_size(bad), None, "{bad}");
    }
}

#[test]
fn the_document_carries_the_new_fields_only_when_not_the_default() {
    let plain = valid(&[NODE, PLAIN]);
    let text = plain.sites[0].doc.to_canonical_json();
    for field in [
        "tls",
        "https_redirect",
        "max_body_size",
        "origin_tls_verify",
    ] {
        assert!(!text.contains(field), "{text}");
    }
    let config = valid(&[
        NODE,
        (
            "sites/s.yaml",
            "host: s.example.com\norigin: https://203.0.113.10\ntls: {certificate: shop}\n\
             https_redirect: true\nmax_body_size: 25m\norigin_tls_verify: false\n",
        ),
    ]);
    let site = &config.sites[0];
    assert_eq!(site.tls, Some(Tls::Certificate("shop".into())));
    let doc: serde_json::Value = serde_json::from_str(&site.doc.to_canonical_json()).unwrap();
    assert_eq!(doc["tls"], "certificate:shop");
    assert_eq!(doc["https_redirect"], true);
    assert_eq!(doc["max_body_size"], 25 << 20);
    assert_eq!(doc["origin_tls_verify"], false);
    // A byte count as written.
    let config = valid(&[
        NODE,
        (
            "sites/s.yaml",
            "host: s.example.com\norigin: https://203.0.113.10\nmax_body_size: 1000\n",
        ),
    ]);
    assert_eq!(config.sites[0].doc.max_body_size, Some(1000));
}

#[test]
fn an_acme_site_names_its_issued_certificate_and_the_cluster_names_the_ca() {
    let config = valid(&[
        NODE,
        (
            "cluster.yaml",
            "acme:\n  directory: https://acme.example.net/dir\n  contact: [\"mailto:ops@example.com\"]\n",
        ),
        (
            "sites/s.yaml",
            "host: s.example.com\naliases: [www.s.example.com]\norigin: https://203.0.113.10\n\
             tls: {acme: true}\nhttps_redirect: true\n",
        ),
    ]);
    let site = &config.sites[0];
    assert_eq!(site.tls, Some(Tls::Acme("acme.s.example.com".into())));
    let doc: serde_json::Value = serde_json::from_str(&site.doc.to_canonical_json()).unwrap();
    assert_eq!(doc["tls"], "certificate:acme.s.example.com");
    let acme = config.cluster.acme.as_ref().unwrap();
    assert_eq!(acme.directory, "https://acme.example.net/dir");
    assert_eq!(acme.contact, ["mailto:ops@example.com"]);
    let checked = crate::testkit::check(&[
        NODE,
        (
            "cluster.yaml",
            "acme:\n  directory: https://a.example.net/dir\n  contact: [ops@example.com]\n",
        ),
    ]);
    let lines: Vec<String> = checked.diagnostics.iter().map(line).collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cluster.yaml:3:13 error invalid-value")),
        "{lines:#?}"
    );
}

#[test]
fn an_acme_site_without_the_clusters_ca_is_refused_at_its_tls_line() {
    let out = site_errors("host: s.example.com\norigin: https://203.0.113.10\ntls: {acme: true}\n");
    let want = "sites/s.yaml:3:6 error acme-without-ca";
    let hit = out.iter().find(|l| l.starts_with(want));
    assert!(hit.is_some(), "{out:#?}");
    let hit = hit.unwrap();
    assert!(hit.contains("cluster.yaml has no `acme`"), "{hit}");
    // With the CA named, the same site is valid.
    valid(&[
        NODE,
        (
            "cluster.yaml",
            "acme:\n  directory: https://acme.example.net/dir\n",
        ),
        (
            "sites/s.yaml",
            "host: s.example.com\norigin: https://203.0.113.10\ntls: {acme: true}\n",
        ),
    ]);
}

#[test]
fn the_acme_order_timeout_is_whole_seconds_with_a_ten_minute_default() {
    let timeout = |extra: &str| {
        let config = valid(&[
            NODE,
            (
                "cluster.yaml",
                &format!("acme:\n  directory: https://acme.example.net/dir\n{extra}"),
            ),
        ]);
        config.cluster.acme.unwrap().order_timeout_s
    };
    assert_eq!(timeout(""), 600);
    assert_eq!(timeout("  order_timeout: 3s\n"), 3);
    assert_eq!(timeout("  order_timeout: 2h\n"), 7200);
    for bad in ["0s", "1500ms", "25h"] {
        let checked = crate::testkit::check(&[
            NODE,
            (
                "cluster.yaml",
                &format!(
                    "acme:\n  directory: https://acme.example.net/dir\n  order_timeout: {bad}\n"
                ),
            ),
        ]);
        let lines: Vec<String> = checked.diagnostics.iter().map(line).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("cluster.yaml:3:18 error invalid-value")),
            "{bad}: {lines:#?}"
        );
    }
}
