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
    c.issue("shop", &["shop.example.com", "www.example.com"], 90)
        .issue("wild", &["*.example.com"], 90)
        .issue("old", &["shop.example.com"], -1);
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
    c.issue("other", &["other.example.com"], 90);
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
