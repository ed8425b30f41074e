//! Operator-provided certificates (`tls: {certificate: NAME}`): imported
//! into the state directory ([`crate::store`]) after the checks below,
//! listed, and read back as plain data for `check`, `build`, `diff`,
//! `plan`, `apply` and `reconcile` ([`compiler::tls::Certificates`]: the
//! compiler reads no store).
//!
//! Parsed with OpenSSL (the `openssl` crate; already linked for TLS to
//! Redis): the chain must be PEM certificates, leaf first, each one
//! issued (name and signature) by the next; the key must be the leaf's
//! and unencrypted; every certificate of the chain valid now. What is kept
//! is re-encoded from the parsed values (the certificates' PEM, the key as
//! PKCS#8 PEM), so nothing else in the files — a stray key block in the
//! chain file, comments — is ever stored or pushed.
//!
//! Nothing here prints or returns key material in an error: errors name
//! the certificate, the file and what is wrong.

use std::fmt;
use std::path::Path;

use compiler::model::resolved::{Config, Tls};
use compiler::tls::{Certificate, Certificates};
use openssl::asn1::{Asn1Time, Asn1TimeRef};
use openssl::pkey::{PKey, Private};
use openssl::x509::{X509, X509VerifyResult};
use sha2::{Digest, Sha256};

use crate::store::{MAX_CERT_BYTES, Store, StoreError, StoredCert};

/// What is wrong with a certificate, by kind (logs, exit codes and tests
/// read the kind, never the text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertErrorKind {
    /// The chain file holds no PEM certificate.
    NotPem,
    /// The key file holds no PEM private key.
    KeyNotPem,
    /// The key is encrypted (edges need it in the clear).
    KeyEncrypted,
    /// The key is not the leaf's.
    KeyMismatch,
    /// A certificate is not issued by the next one in the chain.
    ChainOrder,
    /// A certificate of the chain is past its not-after.
    Expired,
    /// A certificate of the chain is before its not-before.
    NotYetValid,
    /// The leaf names none of the site's host or aliases.
    NameMismatch,
    /// A site uses a certificate the state directory does not hold.
    Missing,
    /// The state directory, or a file to import, cannot be read.
    Unreadable,
    /// Not a certificate name.
    Name,
}

impl CertErrorKind {
    /// A stable word for logs and JSON.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotPem => "not-pem",
            Self::KeyNotPem => "key-not-pem",
            Self::KeyEncrypted => "key-encrypted",
            Self::KeyMismatch => "key-mismatch",
            Self::ChainOrder => "chain-order",
            Self::Expired => "expired",
            Self::NotYetValid => "not-yet-valid",
            Self::NameMismatch => "name-mismatch",
            Self::Missing => "missing",
            Self::Unreadable => "unreadable",
            Self::Name => "name",
        }
    }
}

/// A refused certificate: its name, the kind, and a sentence (never key
/// material).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertError {
    pub kind: CertErrorKind,
    pub name: String,
    pub detail: String,
}

impl fmt::Display for CertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "certificate `{}`: {}", self.name, self.detail)
    }
}

impl std::error::Error for CertError {}

fn err(kind: CertErrorKind, name: &str, detail: impl Into<String>) -> CertError {
    CertError {
        kind,
        name: name.to_owned(),
        detail: detail.into(),
    }
}

fn unix(t: &Asn1TimeRef) -> Option<i64> {
    let epoch = Asn1Time::from_unix(0).ok()?;
    let d = epoch.diff(t).ok()?;
    Some(i64::from(d.days) * 86_400 + i64::from(d.secs))
}

/// Parse a chain and key (PEM text) into the compiler's plain data. The
/// chain's order and the key's form are checked here; whether the key
/// matches is recorded (`key_matches`), and validity in time is left to
/// the caller ([`check_now`]).
///
/// # Errors
/// Not PEM, an encrypted key, a chain out of order.
pub fn parse(name: &str, chain: &str, key: &str) -> Result<Certificate, CertError> {
    let certs = X509::stack_from_pem(chain.as_bytes()).map_err(|_| {
        err(
            CertErrorKind::NotPem,
            name,
            "the chain is not PEM certificates",
        )
    })?;
    let Some(leaf) = certs.first() else {
        return Err(err(
            CertErrorKind::NotPem,
            name,
            "the chain holds no PEM certificate",
        ));
    };
    if key.contains("ENCRYPTED") {
        return Err(err(
            CertErrorKind::KeyEncrypted,
            name,
            "the key is encrypted; the edges need it unencrypted (e.g. `openssl pkey -in key.pem -out plain.pem`)",
        ));
    }
    // An empty passphrase: an encrypted key fails here instead of OpenSSL
    // asking on the terminal.
    let pkey: PKey<Private> =
        PKey::private_key_from_pem_passphrase(key.as_bytes(), b"").map_err(|_| {
            err(
                CertErrorKind::KeyNotPem,
                name,
                "the key is not a PEM private key",
            )
        })?;
    for (i, pair) in certs.windows(2).enumerate() {
        let (subject, issuer) = (&pair[0], &pair[1]);
        let signed = issuer
            .public_key()
            .ok()
            .and_then(|k| subject.verify(&k).ok())
            .unwrap_or(false);
        if issuer.issued(subject) != X509VerifyResult::OK || !signed {
            return Err(err(
                CertErrorKind::ChainOrder,
                name,
                format!(
                    "the chain is out of order: certificate {} is not issued by certificate {} \
                     (the chain goes leaf first, then each issuer)",
                    i + 1,
                    i + 2
                ),
            ));
        }
    }
    let key_matches = leaf
        .public_key()
        .map(|k| k.public_eq(&pkey))
        .unwrap_or(false);
    let der = leaf
        .to_der()
        .map_err(|_| err(CertErrorKind::NotPem, name, "the leaf cannot be encoded"))?;
    let fingerprint = edgestate::hex(&Sha256::digest(&der));
    let not_before = unix(leaf.not_before()).unwrap_or(i64::MAX);
    let not_after = unix(leaf.not_after()).unwrap_or(i64::MIN);
    let mut names: Vec<String> = leaf
        .subject_alt_names()
        .map(|sans| {
            sans.iter()
                .filter_map(|n| n.dnsname().map(str::to_ascii_lowercase))
                .collect()
        })
        .unwrap_or_default();
    names.dedup();
    let mut chain_pem = String::new();
    for c in &certs {
        let pem = c.to_pem().map_err(|_| {
            err(
                CertErrorKind::NotPem,
                name,
                "a certificate cannot be encoded",
            )
        })?;
        chain_pem.push_str(&String::from_utf8_lossy(&pem));
    }
    let key_pem = pkey
        .private_key_to_pem_pkcs8()
        .map_err(|_| err(CertErrorKind::KeyNotPem, name, "the key cannot be encoded"))?;
    // Every certificate's validity, the tightest window.
    let (mut chain_from, mut chain_until) = (not_before, not_after);
    for c in certs.iter().skip(1) {
        chain_from = chain_from.max(unix(c.not_before()).unwrap_or(i64::MAX));
        chain_until = chain_until.min(unix(c.not_after()).unwrap_or(i64::MIN));
    }
    Ok(Certificate {
        name: name.to_owned(),
        chain: chain_pem,
        key: String::from_utf8_lossy(&key_pem).into_owned(),
        fingerprint,
        not_before: chain_from,
        not_after: chain_until,
        names,
        key_matches,
    })
}

/// The leaf's issuer, on one line, for display: its common name, or
/// (no common name) its distinguished name as `SN=value` pairs joined by
/// `, `. Control characters escaped; `None` when the chain holds no PEM
/// certificate.
#[must_use]
pub fn issuer(cert: &Certificate) -> Option<String> {
    let leaf = X509::from_pem(cert.chain.as_bytes()).ok()?;
    let name = leaf.issuer_name();
    let text = |e: &openssl::x509::X509NameEntryRef| {
        e.data()
            .to_string()
            .unwrap_or_else(|_| String::from_utf8_lossy(e.data().as_slice()).into_owned())
    };
    let cn: Vec<String> = name
        .entries_by_nid(openssl::nid::Nid::COMMONNAME)
        .map(text)
        .collect();
    let line = if cn.is_empty() {
        name.entries()
            .map(|e| {
                let key = e.object().nid().short_name().unwrap_or("?");
                format!("{key}={}", text(e))
            })
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        cn.join(", ")
    };
    Some(edgestate::untrusted::escape(&line))
}

/// The key matches and the chain is valid at `now`.
///
/// # Errors
/// [`CertErrorKind::KeyMismatch`], [`CertErrorKind::Expired`],
/// [`CertErrorKind::NotYetValid`].
pub fn check_now(cert: &Certificate, now: i64) -> Result<(), CertError> {
    let name = &cert.name;
    if !cert.key_matches {
        return Err(err(
            CertErrorKind::KeyMismatch,
            name,
            "the key is not the leaf certificate's key",
        ));
    }
    if now >= cert.not_after {
        return Err(err(
            CertErrorKind::Expired,
            name,
            format!(
                "expired at {} (sha256:{})",
                compiler::clock::rfc3339_signed(cert.not_after),
                cert.fingerprint
            ),
        ));
    }
    if now < cert.not_before {
        return Err(err(
            CertErrorKind::NotYetValid,
            name,
            format!(
                "not valid before {}",
                compiler::clock::rfc3339_signed(cert.not_before)
            ),
        ));
    }
    Ok(())
}

fn read_file(name: &str, what: &str, path: &Path) -> Result<String, CertError> {
    let unreadable = |why: String| {
        err(
            CertErrorKind::Unreadable,
            name,
            format!("{what} {}: {why}", path.display()),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| unreadable(e.kind().to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    if meta.len() > MAX_CERT_BYTES as u64 {
        return Err(unreadable(format!("larger than {MAX_CERT_BYTES} bytes")));
    }
    let bytes = std::fs::read(path).map_err(|e| unreadable(e.kind().to_string()))?;
    String::from_utf8(bytes).map_err(|_| {
        let kind = if what == "key" {
            CertErrorKind::KeyNotPem
        } else {
            CertErrorKind::NotPem
        };
        err(
            kind,
            name,
            format!("{what} {} is not PEM text", path.display()),
        )
    })
}

fn store_err(name: &str, e: &StoreError) -> CertError {
    let kind = match e {
        StoreError::CertName(_) => CertErrorKind::Name,
        _ => CertErrorKind::Unreadable,
    };
    err(kind, name, e.to_string())
}

/// `edgeform certs import NAME --cert CHAIN --key KEY`: read both files,
/// refuse what [`parse`] and [`check_now`] refuse, and keep the
/// re-encoded pair as `name`.
///
/// # Errors
/// Every refusal, typed; the store cannot be written.
pub fn import(
    store: &dyn Store,
    name: &str,
    chain_path: &Path,
    key_path: &Path,
    now: i64,
) -> Result<Certificate, CertError> {
    if !compiler::validate::valid_cert_name(name) {
        return Err(err(
            CertErrorKind::Name,
            name,
            "not a certificate name (`[a-z0-9][a-z0-9._-]*`, at most 64)",
        ));
    }
    let chain = read_file(name, "chain", chain_path)?;
    let key = read_file(name, "key", key_path)?;
    let cert = parse(name, &chain, &key)?;
    check_now(&cert, now)?;
    if cert.names.is_empty() {
        return Err(err(
            CertErrorKind::NameMismatch,
            name,
            "the leaf has no DNS name (subjectAltName)",
        ));
    }
    store
        .set_certificate(
            name,
            &StoredCert {
                chain: cert.chain.clone(),
                key: cert.key.clone(),
            },
        )
        .map_err(|e| store_err(name, &e))?;
    Ok(cert)
}

/// One certificate of the state directory as read back (an unreadable or
/// broken one is listed with its error).
pub type Listed = (String, Result<Certificate, CertError>);

/// Every certificate of the state directory, by name.
///
/// # Errors
/// The store cannot be listed.
pub fn list(store: &dyn Store) -> Result<Vec<Listed>, StoreError> {
    let mut out = Vec::new();
    for name in store.certificate_names()? {
        out.push((name.clone(), load_one(store, &name)));
    }
    Ok(out)
}

fn load_one(store: &dyn Store, name: &str) -> Result<Certificate, CertError> {
    match store.certificate(name) {
        Ok(Some(c)) => parse(name, &c.chain, &c.key),
        Ok(None) => Err(err(
            CertErrorKind::Missing,
            name,
            "not in the state directory (edgeform certs import NAME --cert chain.pem --key key.pem)",
        )),
        Err(e) => Err(store_err(name, &e)),
    }
}

/// The certificates `config`'s sites use, as they are in the store, with
/// the problem of each one that cannot be read (missing, unreadable,
/// broken): what `check`, `build` and `diff` work from.
#[must_use]
pub fn used(store: &dyn Store, config: &Config) -> (Certificates, Vec<CertError>) {
    let mut certs = Certificates::default();
    let mut problems = Vec::new();
    for name in compiler::tls::used(config) {
        match load_one(store, name) {
            Ok(c) => {
                certs.by_name.insert(name.to_owned(), c);
            }
            Err(e) if e.kind == CertErrorKind::Missing => {}
            Err(e) => problems.push(e),
        }
    }
    (certs, problems)
}

/// The certificates to push `config` with: every one its sites use, each
/// present, well-formed, matching its key, valid at `now` and covering
/// every host and alias of every site that uses it. Anything else refuses
/// the whole push before any target is read ("expiry fails apply").
///
/// # Errors
/// The first problem, typed.
pub fn for_push(store: &dyn Store, config: &Config, now: i64) -> Result<Certificates, CertError> {
    let mut certs = Certificates::default();
    for name in compiler::tls::used(config) {
        let cert = load_one(store, name)?;
        check_now(&cert, now)?;
        certs.by_name.insert(name.to_owned(), cert);
    }
    for site in &config.sites {
        let Some(name) = site.tls.as_ref().map(Tls::certificate) else {
            continue;
        };
        let cert = &certs.by_name[name];
        if let Some(host) = site.hosts().find(|h| !cert.covers(h)) {
            return Err(err(
                CertErrorKind::NameMismatch,
                name,
                format!(
                    "does not cover `{host}` ({}; its names: {})",
                    site.file,
                    cert.names.join(", ")
                ),
            ));
        }
    }
    Ok(certs)
}

/// [`for_push`] from the state directory at `dir`, opened only when a
/// site uses a certificate (a repository without `tls` needs no state
/// directory at all).
///
/// # Errors
/// No state directory while a site needs one ([`CertErrorKind::Missing`]),
/// an unusable one ([`CertErrorKind::Unreadable`]), and [`for_push`]'s.
pub fn for_push_from(dir: &Path, config: &Config, now: i64) -> Result<Certificates, CertError> {
    let used = compiler::tls::used(config);
    let Some(first) = used.first() else {
        return Ok(Certificates::default());
    };
    match crate::store::open_existing(dir) {
        Ok(Some(store)) => for_push(&*store, config, now),
        Ok(None) => Err(err(
            CertErrorKind::Missing,
            first,
            format!(
                "no state directory at {} (--state-dir, EDGEFORM_STATE_DIR) holds the certificates sites use",
                dir.display()
            ),
        )),
        Err(e) => Err(store_err(first, &e)),
    }
}

/// What `check`, `build`, `diff` and `explain` know of the certificates
/// at `dir`: [`used`]'s, or why nothing (no state directory here, as on a
/// pull request's CI; an unusable one).
///
/// # Errors
/// Why nothing is known: no state directory, or an unusable one.
pub fn known_at(dir: &Path, config: &Config) -> Result<(Certificates, Vec<CertError>), String> {
    if compiler::tls::used(config).is_empty() {
        return Ok((Certificates::default(), Vec::new()));
    }
    match crate::store::open_existing(dir) {
        Ok(Some(store)) => Ok(used(&*store, config)),
        Ok(None) => Err("no state directory".into()),
        Err(e) => Err(format!("state store unusable: {e}")),
    }
}

#[cfg(test)]
mod tests;
