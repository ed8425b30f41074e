//! Import and read-back with real certificates made by `openssl`.

use super::*;
use crate::store::DirStore;
use harness::SiteCerts;

fn now() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn certs() -> SiteCerts {
    let c = SiteCerts::new();
    c.sign("shop", &["shop.example.com", "www.example.com"], 90)
        .sign("wild", &["*.example.com"], 90)
        .sign("old", &["shop.example.com"], -1);
    c
}

#[test]
fn a_good_certificate_is_imported_reencoded_and_read_back() {
    let c = certs();
    let d = tempfile::tempdir().unwrap();
    let store = DirStore::open(&d.path().join("state")).unwrap();
    let cert = import(
        &store,
        "shop",
        &c.file("shop.chain.pem"),
        &c.file("shop.key"),
        now(),
    )
    .unwrap();
    assert_eq!(cert.names, ["shop.example.com", "www.example.com"]);
    assert_eq!(cert.fingerprint.len(), 64);
    assert!(cert.key_matches);
    assert!(cert.not_after > now() + 80 * 86_400);
    assert_eq!(cert.chain.matches("BEGIN CERTIFICATE").count(), 2);
    assert!(cert.key.starts_with("-----BEGIN PRIVATE KEY-----"));
    let listed = list(&store).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.as_ref().unwrap(), &cert);
    // The fingerprint is openssl's own.
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(c.file("shop.pem"))
        .output()
        .unwrap();
    let theirs = String::from_utf8_lossy(&out.stdout)
        .split('=')
        .nth(1)
        .unwrap()
        .trim()
        .replace(':', "")
        .to_ascii_lowercase();
    assert_eq!(cert.fingerprint, theirs);
}

#[test]
fn bad_input_is_refused_by_kind_and_nothing_is_stored() {
    let c = certs();
    c.sign("other", &["other.example.com"], 90);
    let d = tempfile::tempdir().unwrap();
    let store = DirStore::open(&d.path().join("state")).unwrap();
    let not_pem = c.dir().join("not.pem");
    std::fs::write(&not_pem, "hello, not a certificate\n").unwrap();
    let reversed = c.dir().join("reversed.pem");
    std::fs::write(
        &reversed,
        [
            std::fs::read_to_string(c.file("ca.pem")).unwrap(),
            std::fs::read_to_string(c.file("shop.pem")).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    let encrypted = c.dir().join("enc.key");
    let out = std::process::Command::new("openssl")
        .args(["pkey", "-aes256", "-passout", "pass:pw", "-in"])
        .arg(c.file("shop.key"))
        .arg("-out")
        .arg(&encrypted)
        .output()
        .unwrap();
    assert!(out.status.success());
    let cases: [(&str, &Path, &Path, CertErrorKind); 7] = [
        ("shop", &not_pem, &c.file("shop.key"), CertErrorKind::NotPem),
        (
            "shop",
            &c.file("shop.chain.pem"),
            &not_pem,
            CertErrorKind::KeyNotPem,
        ),
        (
            "shop",
            &c.file("shop.chain.pem"),
            &c.file("other.key"),
            CertErrorKind::KeyMismatch,
        ),
        (
            "shop",
            &reversed,
            &c.file("shop.key"),
            CertErrorKind::ChainOrder,
        ),
        (
            "old",
            &c.file("old.chain.pem"),
            &c.file("old.key"),
            CertErrorKind::Expired,
        ),
        (
            "shop",
            &c.file("shop.chain.pem"),
            &encrypted,
            CertErrorKind::KeyEncrypted,
        ),
        (
            "Bad/Name",
            &c.file("shop.chain.pem"),
            &c.file("shop.key"),
            CertErrorKind::Name,
        ),
    ];
    for (name, chain, key, kind) in cases {
        let e = import(&store, name, chain, key, now()).unwrap_err();
        assert_eq!(e.kind, kind, "{e}");
        let text = e.to_string();
        assert!(!text.contains("PRIVATE KEY-----"), "{text}");
    }
    // Not yet valid: the clock a day before the chain began.
    let e = import(
        &store,
        "shop",
        &c.file("shop.chain.pem"),
        &c.file("shop.key"),
        now() - 86_400,
    )
    .unwrap_err();
    assert_eq!(e.kind, CertErrorKind::NotYetValid, "{e}");
    assert!(store.certificate_names().unwrap().is_empty());
}

#[test]
fn only_certificates_travel_from_the_chain_file() {
    let c = certs();
    // A chain file that also holds the key: the key block is not kept.
    let combined = c.dir().join("combined.pem");
    std::fs::write(
        &combined,
        [
            std::fs::read_to_string(c.file("shop.chain.pem")).unwrap(),
            std::fs::read_to_string(c.file("shop.key")).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    let d = tempfile::tempdir().unwrap();
    let store = DirStore::open(&d.path().join("state")).unwrap();
    let cert = import(&store, "shop", &combined, &c.file("shop.key"), now()).unwrap();
    assert!(!cert.chain.contains("PRIVATE"), "{}", cert.chain);
    let kept = store.certificate("shop").unwrap().unwrap();
    assert!(!kept.chain.contains("PRIVATE"));
}

/// A repository of one edge and `sites`, checked (in a temp dir).
fn config(sites: &[(&str, &str)]) -> (tempfile::TempDir, Config) {
    let d = tempfile::tempdir().unwrap();
    let mut files = vec![(
        "nodes/edge-1.yaml",
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
         addresses: [198.51.100.1]\nredis: {url: \"redis://127.0.0.1:6379\"}\n",
    )];
    files.extend_from_slice(sites);
    for (path, text) in files {
        let p = d.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let repo = compiler::load::from_dir(d.path()).unwrap();
    let checked = compiler::check(&repo);
    let config = checked.config.expect("valid");
    (d, config)
}

#[test]
fn a_push_needs_every_certificate_present_valid_and_covering_its_sites() {
    let c = certs();
    let d = tempfile::tempdir().unwrap();
    let store = DirStore::open(&d.path().join("state")).unwrap();
    import(
        &store,
        "wild",
        &c.file("wild.chain.pem"),
        &c.file("wild.key"),
        now(),
    )
    .unwrap();
    let (_r, wild_site) = config(&[(
        "sites/a.yaml",
        "host: a.example.com\naliases: [\"*.example.com\"]\norigin: http://192.0.2.1\ntls: {certificate: wild}\n",
    )]);
    // A wildcard certificate covers one label and the same wildcard.
    let certs = for_push(&store, &wild_site, now()).unwrap();
    let docs = compiler::tls::docs(&wild_site, &certs);
    let keys: Vec<&str> = docs.iter().map(|(k, _, _)| &**k).collect();
    assert_eq!(keys, ["tls:a.example.com", "tls:*.example.com"]);
    // Expired by the time of the push: refused, typed.
    let e = for_push(&store, &wild_site, now() + 400 * 86_400).unwrap_err();
    assert_eq!(e.kind, CertErrorKind::Expired, "{e}");
    // Not covering a name.
    let (_r, apex) = config(&[(
        "sites/a.yaml",
        "host: example.com\norigin: http://192.0.2.1\ntls: {certificate: wild}\n",
    )]);
    let e = for_push(&store, &apex, now()).unwrap_err();
    assert_eq!(e.kind, CertErrorKind::NameMismatch, "{e}");
    // Missing, and no state directory at all.
    let (_r, missing) = config(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\ntls: {certificate: nope}\n",
    )]);
    let e = for_push(&store, &missing, now()).unwrap_err();
    assert_eq!(e.kind, CertErrorKind::Missing, "{e}");
    let e = for_push_from(&d.path().join("none"), &missing, now()).unwrap_err();
    assert_eq!(e.kind, CertErrorKind::Missing, "{e}");
    // No site with `tls`: no state directory needed.
    let (_r, plain) = config(&[(
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\n",
    )]);
    assert!(
        for_push_from(&d.path().join("none"), &plain, now())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn the_issuer_is_the_leafs_issuer_common_name_else_its_distinguished_name() {
    let c = certs();
    let shop = parse(
        "shop",
        &std::fs::read_to_string(c.file("shop.chain.pem")).unwrap(),
        &std::fs::read_to_string(c.file("shop.key")).unwrap(),
    )
    .unwrap();
    assert_eq!(issuer(&shop).as_deref(), Some("edgeform test site CA"));

    // A CA named without a common name: its name's entries in order.
    let d = tempfile::tempdir().unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-days",
                "2",
                "-subj",
                "/O=Example Org/C=NL",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-new"][..],
            &ec,
            &["-subj", "/CN=a.test", "-keyout", "a.key", "-out", "a.csr"],
        ]
        .concat(),
    );
    std::fs::write(d.path().join("a.ext"), "subjectAltName=DNS:a.test\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "a.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "a.ext",
        "-out",
        "a.pem",
    ]);
    let read = |f: &str| std::fs::read_to_string(d.path().join(f)).unwrap();
    let a = parse("a", &(read("a.pem") + &read("ca.pem")), &read("a.key")).unwrap();
    assert_eq!(issuer(&a).as_deref(), Some("O=Example Org, C=NL"));

    // No certificate at all: nothing to show.
    let empty = compiler::tls::Certificate {
        chain: String::new(),
        ..a
    };
    assert_eq!(issuer(&empty), None);
}
