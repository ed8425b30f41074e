//! Certificates as the compiler sees them: plain data the caller reads
//! from the control host's state directory (`control::certs`) and hands
//! in — the compiler reads no store. Two uses, both pure:
//!
//! - [`check`]: `edgeform check`'s certificate rules. Where the state
//!   directory holds a site's certificate: it must cover the host and
//!   every alias (a SAN DNS name, a wildcard standing for exactly one
//!   label), its key must match, it must be valid now (an error; only a
//!   warning under `check --rev`, an old commit), and under
//!   [`EXPIRY_WARNING_DAYS`] left is a warning. Where it does not (a pull
//!   request's CI): a warning that the certificate was not checked.
//! - [`docs`]: the `tls:<host>` documents of every site with a
//!   certificate, for [`crate::compile::compile_with`].

use std::collections::BTreeMap;
use std::sync::Arc;

use edgestate::tls::TlsDoc;

use crate::diagnostic::Diagnostic;
use crate::load::Repo;
use crate::model::resolved::{Config, Site, Tls};

/// Fewer days than this before a certificate's not-after: `check` warns.
pub const EXPIRY_WARNING_DAYS: i64 = 21;

/// One certificate from the state directory, parsed.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate {
    /// Its name (`tls: {certificate: NAME}`).
    pub name: String,
    /// The chain, PEM, leaf first.
    pub chain: String,
    /// The private key, PEM. Never shown.
    pub key: String,
    /// Lowercase hex SHA-256 of the leaf's DER.
    pub fingerprint: String,
    /// When the chain is valid, seconds since the epoch: the latest
    /// not-before and the earliest not-after of its certificates (the
    /// leaf's, unless an issuer's is tighter).
    pub not_before: i64,
    pub not_after: i64,
    /// The leaf's DNS names (subjectAltName), lower-case.
    pub names: Vec<String>,
    /// Whether the key is the leaf's.
    pub key_matches: bool,
}

impl std::fmt::Debug for Certificate {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificate")
            .field("name", &self.name)
            .field("fingerprint", &self.fingerprint)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("names", &self.names)
            .field("key_matches", &self.key_matches)
            .finish_non_exhaustive()
    }
}

impl Certificate {
    /// Whether its names cover `host` ([`covers`]).
    #[must_use]
    pub fn covers(&self, host: &str) -> bool {
        self.names.iter().any(|n| covers(n, host))
    }

    /// The `tls:<host>` document.
    #[must_use]
    pub fn doc(&self) -> TlsDoc {
        TlsDoc {
            chain: self.chain.clone(),
            fingerprint: self.fingerprint.clone(),
            key: self.key.clone(),
            not_after: u64::try_from(self.not_after).unwrap_or(0),
        }
    }
}

/// Whether the certificate name `name` (a SAN DNS name) covers the site
/// host `host`: equal (case-insensitively), or `name` is `*.<rest>` and
/// `host` is one label followed by `.<rest>`. A wildcard site host
/// (`*.example.com`) is covered only by the same wildcard name: a
/// certificate for `a.example.com` does not serve every name the wildcard
/// site does.
#[must_use]
pub fn covers(name: &str, host: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    if name == host {
        return true;
    }
    let Some(rest) = name.strip_prefix("*.") else {
        return false;
    };
    // The wildcard stands for one whole label, never several, never part
    // of one, never a wildcard.
    match host.split_once('.') {
        Some((label, after)) => {
            !label.is_empty() && label != "*" && after == rest && rest.contains('.')
        }
        None => false,
    }
}

/// The certificates a command was given, by name.
#[derive(Debug, Clone, Default)]
pub struct Certificates {
    pub by_name: BTreeMap<String, Certificate>,
}

impl Certificates {
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Certificate> {
        self.by_name.get(name)
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

/// What `check` knows of the certificates.
#[derive(Debug, Clone)]
pub enum Known<'a> {
    /// No state directory here (a pull request's CI), or one that cannot
    /// be read: nothing is checked; the text says which.
    Nothing(String),
    /// The state directory's certificates (`place`: where it is).
    Store {
        certs: &'a Certificates,
        place: String,
        /// Certificates the store holds but cannot give (unreadable, not
        /// PEM, out of order): name → why.
        broken: BTreeMap<String, String>,
    },
}

/// Whether the revision checked is the one about to be pushed (the
/// working tree) or an old commit (`check --rev`): an expired certificate
/// is an error for the first, a warning for the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checking {
    WorkingTree,
    Revision,
}

/// `check`'s certificate diagnostics for every site with `tls`, at `now`
/// (seconds since the epoch). Pure.
#[must_use]
pub fn check(
    config: &Config,
    repo: &Repo,
    known: &Known<'_>,
    now: i64,
    checking: Checking,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut files = Locator::new(repo);
    for site in &config.sites {
        let Some(tls) = &site.tls else {
            continue;
        };
        let name = tls.certificate();
        let (pointer, get_it) = match tls {
            Tls::Certificate(_) => (
                "/tls/certificate",
                format!("edgeform certs import {name} --cert chain.pem --key key.pem"),
            ),
            Tls::Acme(_) => ("/tls/acme", "edgeform certs issue".to_owned()),
        };
        match known {
            Known::Nothing(why) => {
                let span = files.locate(&site.file, pointer);
                out.push(
                    Diagnostic::warning(
                        "certificate-not-checked",
                        &site.file,
                        span,
                        format!("certificate `{name}` not checked ({why})"),
                    )
                    .with_help(
                        "`check` on the control host (with its state directory) checks that it \
                         covers the site's names, matches its key and is valid",
                    ),
                );
            }
            Known::Store {
                certs,
                place,
                broken,
            } => match certs.get(name) {
                None if broken.contains_key(name) => {
                    let span = files.locate(&site.file, pointer);
                    out.push(
                        Diagnostic::error(
                            "certificate-unusable",
                            &site.file,
                            span,
                            format!("certificate `{name}` in {place}: {}", broken[name]),
                        )
                        .with_help(format!("get it again: {get_it}")),
                    );
                }
                None => {
                    let span = files.locate(&site.file, pointer);
                    out.push(
                        Diagnostic::warning(
                            "certificate-not-checked",
                            &site.file,
                            span,
                            format!(
                                "certificate `{name}` not checked (not in the state directory \
                                 {place}): `apply` refuses a site whose certificate is missing"
                            ),
                        )
                        .with_help(get_it.clone()),
                    );
                }
                Some(cert) => {
                    check_one(&mut out, &mut files, site, cert, now, checking);
                }
            },
        }
    }
    out
}

fn check_one(
    out: &mut Vec<Diagnostic>,
    files: &mut Locator<'_>,
    site: &Site,
    cert: &Certificate,
    now: i64,
    checking: Checking,
) {
    let name = &cert.name;
    let names = if cert.names.is_empty() {
        "none".to_owned()
    } else {
        cert.names.join(", ")
    };
    for (i, host) in site.hosts().enumerate() {
        if cert.covers(host) {
            continue;
        }
        let pointer = if i == 0 {
            "/host".to_owned()
        } else {
            format!("/aliases/{}", i - 1)
        };
        let span = files.locate(&site.file, &pointer);
        out.push(
            Diagnostic::error(
                "certificate-name-mismatch",
                &site.file,
                span,
                format!("certificate `{name}` does not cover `{host}` (its names: {names})"),
            )
            .with_help(
                "a certificate name covers the same host, or `*.<domain>` one label of it; \
                 import a certificate that covers every host and alias",
            ),
        );
    }
    let at = |pointer: &str, files: &mut Locator<'_>| files.locate(&site.file, pointer);
    if !cert.key_matches {
        let span = at("/tls/certificate", files);
        out.push(
            Diagnostic::error(
                "certificate-key-mismatch",
                &site.file,
                span,
                format!(
                    "the key stored with certificate `{name}` (sha256:{}) is not its key",
                    cert.fingerprint
                ),
            )
            .with_help(format!(
                "import it again with its own key: edgeform certs import {name} --cert \
                 chain.pem --key key.pem"
            )),
        );
    }
    let severity_error = checking == Checking::WorkingTree;
    let invalid = if now >= cert.not_after {
        Some((
            "certificate-expired",
            format!(
                "certificate `{name}` expired at {}",
                crate::clock::rfc3339_signed(cert.not_after)
            ),
        ))
    } else if now < cert.not_before {
        Some((
            "certificate-not-yet-valid",
            format!(
                "certificate `{name}` is not valid before {}",
                crate::clock::rfc3339_signed(cert.not_before)
            ),
        ))
    } else {
        None
    };
    let span = at("/tls/certificate", files);
    if let Some((code, message)) = invalid {
        let message = format!("{message}: `apply` refuses it");
        let d = if severity_error {
            Diagnostic::error(code, &site.file, span, message)
        } else {
            Diagnostic::warning(code, &site.file, span, message)
        };
        out.push(d.with_help(format!(
            "renew it and import it again: edgeform certs import {name} --cert chain.pem --key \
             key.pem"
        )));
    } else if cert.not_after - now < EXPIRY_WARNING_DAYS * 86_400 {
        let days = (cert.not_after - now) / 86_400;
        out.push(
            Diagnostic::warning(
                "certificate-expiring",
                &site.file,
                span,
                format!(
                    "certificate `{name}` expires at {} (in {days} days)",
                    crate::clock::rfc3339_signed(cert.not_after)
                ),
            )
            .with_help(format!(
                "renew it and import it again: edgeform certs import {name} --cert chain.pem \
                 --key key.pem"
            )),
        );
    }
}

/// Spans of pointers in the repository's files, each file parsed once.
struct Locator<'a> {
    repo: &'a Repo,
    trees: BTreeMap<Arc<str>, Option<yamlspan::Node>>,
}

impl<'a> Locator<'a> {
    fn new(repo: &'a Repo) -> Self {
        Locator {
            repo,
            trees: BTreeMap::new(),
        }
    }

    fn locate(&mut self, file: &Arc<str>, pointer: &str) -> yamlspan::Span {
        let repo = self.repo;
        let tree = self.trees.entry(file.clone()).or_insert_with(|| {
            repo.sources
                .iter()
                .find(|s| s.path == *file)
                .and_then(|s| s.text.as_deref().ok())
                .and_then(|t| yamlspan::parse(t).ok().flatten())
        });
        tree.as_ref().map_or(
            yamlspan::Span {
                start: 0,
                end: 0,
                line: 1,
                column: 1,
            },
            |t| t.locate(pointer),
        )
    }
}

/// Every `tls:<host>` document of `config` whose certificate is in
/// `certs`: for the host and each alias of each site with `tls`, with the
/// site's regions. Sites whose certificate is missing get none (the
/// callers that push refuse them first: [`missing`]).
#[must_use]
pub fn docs<'c>(config: &'c Config, certs: &Certificates) -> Vec<crate::compile::Placed<'c>> {
    let mut texts: BTreeMap<&str, Arc<str>> = BTreeMap::new();
    let mut out = Vec::new();
    for site in &config.sites {
        let Some(name) = site.tls.as_ref().map(Tls::certificate) else {
            continue;
        };
        let Some(cert) = certs.get(name) else {
            continue;
        };
        let text = texts
            .entry(cert.name.as_str())
            .or_insert_with(|| cert.doc().to_canonical_json().into())
            .clone();
        for host in site.hosts() {
            out.push((
                Arc::from(edgestate::keys::tls(host)),
                text.clone(),
                site.regions.as_deref(),
            ));
        }
    }
    out
}

/// The certificate names `config`'s sites use, each once.
#[must_use]
pub fn used(config: &Config) -> Vec<&str> {
    let mut names: Vec<&str> = config
        .sites
        .iter()
        .filter_map(|s| s.tls.as_ref().map(Tls::certificate))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests;
