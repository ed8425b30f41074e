//! The certificate an edge serves for a TLS handshake, and what a viewer
//! gets: a pure function of the ClientHello's SNI, the request's host,
//! the node's `tls:<host>` documents and the clock (no I/O, no X.509
//! parsing: the certificate document names its host by its key, and
//! `check` holds the certificate to the site's hostnames).
//!
//! The edge's Lua twin is `roles/edge/lua/edge_tls_pick.lua` (which key
//! it reads for an SNI, and the outcome given the parsed document and
//! now); both sides run `testdata/edge/tls.jsonl`. `edgeform explain
//! --scheme https` reports [`outcome`] before the request's verdict.
//!
//! Key material is pushed to the edge's Redis and nowhere else: whatever
//! shows a value (`build --out`, `diff`, `plan`) shows [`shown`]'s form,
//! which holds the fingerprint in place of the key.

use serde::{Deserialize, Serialize};

use crate::keys;

/// The certificate document, `tls:<host>`, as the edge reads it:
/// canonical JSON (sorted keys, no whitespace). `build --out` writes the
/// key as [`redacted_key`]; Redis holds the real one.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsDoc {
    /// PEM, leaf first.
    pub chain: String,
    /// Lower-case hex SHA-256 of the leaf's DER.
    pub fingerprint: String,
    /// PEM private key.
    pub key: String,
    /// The leaf's notAfter, Unix seconds (the last second it is valid).
    pub not_after: u64,
}

impl std::fmt::Debug for TlsDoc {
    /// Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsDoc")
            .field("fingerprint", &self.fingerprint)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl TlsDoc {
    /// The canonical JSON text stored in Redis.
    #[must_use]
    pub fn to_canonical_json(&self) -> String {
        // Plain strings and an integer: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The same document with the key replaced by [`redacted_key`].
    #[must_use]
    pub fn redacted(&self) -> TlsDoc {
        TlsDoc {
            key: redacted_key(&self.fingerprint),
            ..self.clone()
        }
    }

    /// Parse a stored value, checking what the edge checks: the four
    /// fields with their types, a fingerprint of 64 lower-case hex
    /// digits, a `not_after` the edge's Lua reads exactly (≤ 2^53).
    ///
    /// # Errors
    /// What is wrong, in words.
    pub fn parse(text: &str) -> Result<TlsDoc, String> {
        let doc: TlsDoc =
            serde_json::from_str(text).map_err(|e| format!("not a certificate document: {e}"))?;
        if !is_fingerprint(&doc.fingerprint) {
            return Err("fingerprint: not 64 lower-case hex digits".into());
        }
        if doc.not_after > crate::site::MAX_EXACT_INT {
            return Err("not_after: above 2^53".into());
        }
        if doc.chain.is_empty() || doc.key.is_empty() {
            return Err("an empty chain or key".into());
        }
        Ok(doc)
    }
}

/// What `build --out` writes in place of the key.
#[must_use]
pub fn redacted_key(fingerprint: &str) -> String {
    format!("redacted (certificate sha256:{fingerprint})")
}

/// Whether `key` names a certificate document.
#[must_use]
pub fn is_cert_key(key: &str) -> bool {
    key.starts_with(crate::keys::TLS_PREFIX)
}

/// The value of `key` as it may be shown: a certificate document with its
/// key redacted; anything else unchanged. A `tls:` value that is not a
/// certificate document (corrupt, truncated, another shape) is never
/// shown at all, since it may hold key material in any form.
#[must_use]
pub fn shown<'a>(key: &str, value: &'a str) -> std::borrow::Cow<'a, str> {
    if !is_cert_key(key) {
        return std::borrow::Cow::Borrowed(value);
    }
    match serde_json::from_str::<TlsDoc>(value) {
        Ok(doc) => std::borrow::Cow::Owned(doc.redacted().to_canonical_json()),
        Err(_) => std::borrow::Cow::Owned(format!(
            "\"not a certificate document ({} bytes, not shown)\"",
            value.len()
        )),
    }
}

fn is_fingerprint(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The longest name an SNI may carry (RFC 1035's 253 characters).
pub const MAX_SNI_LEN: usize = 253;

/// An SNI as the edge compares and looks it up: ASCII lower-case, one
/// trailing dot removed; `None` for a name the edge never looks up (empty,
/// longer than [`MAX_SNI_LEN`], a byte outside letters, digits, `-`, `_`
/// and `.`, an empty label).
#[must_use]
pub fn normalize_sni(sni: &str) -> Option<String> {
    let name = sni.strip_suffix('.').unwrap_or(sni);
    if name.is_empty()
        || name.len() > MAX_SNI_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        || name.split('.').any(str::is_empty)
    {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

/// The hosts whose `tls:` keys the edge tries for an SNI, in order: the
/// name, then the wildcard one label up (`a.b.example` →
/// `*.b.example`); nothing for a name it never looks up.
#[must_use]
pub fn lookup_hosts(sni: &str) -> Vec<String> {
    let Some(name) = normalize_sni(sni) else {
        return Vec::new();
    };
    let mut out = vec![name.clone()];
    if let Some((_, rest)) = name.split_once('.') {
        out.push(format!("*.{rest}"));
    }
    out
}

/// Whether the certificate stored under `tls:<cert_host>` covers `host`:
/// the same name, or a wildcard `*.rest` and `host` one label more than
/// `rest` (wildcards by one label).
#[must_use]
pub fn covers(cert_host: &str, host: &str) -> bool {
    if cert_host == host {
        return true;
    }
    match cert_host.strip_prefix("*.") {
        Some(rest) => host
            .strip_suffix(rest)
            .and_then(|h| h.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty() && !label.contains('.')),
        None => false,
    }
}

/// What a viewer gets from the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsOutcome {
    /// A certificate valid now, covering the request's host.
    Ok,
    /// No SNI, an SNI the edge never looks up, no `tls:` document for it,
    /// or a document the edge cannot read: the handshake fails.
    NoCertificate,
    /// The certificate's `not_after` has passed.
    Expired,
    /// The SNI's certificate does not cover the request's host.
    NameMismatch,
}

impl TlsOutcome {
    /// The word explain and the vectors use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TlsOutcome::Ok => "ok",
            TlsOutcome::NoCertificate => "no-certificate",
            TlsOutcome::Expired => "expired",
            TlsOutcome::NameMismatch => "name-mismatch",
        }
    }
}

/// The outcome, with the key read and the steps in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlsAnswer {
    pub tls: TlsOutcome,
    /// The `tls:` key whose certificate the edge serves (`None`: none).
    pub key: Option<String>,
    /// The certificate's fingerprint, when one is served.
    pub fingerprint: Option<String>,
    /// The certificate's `not_after`, when one is served.
    pub not_after: Option<u64>,
    /// Every step, in words.
    pub reasons: Vec<String>,
}

/// The outcome of a handshake with `sni` for a request to `host` (nginx's
/// `$host`: lower-case, no port), reading the node's documents through
/// `get` (`tls:<host>` key → its stored text), at `now` (Unix seconds).
///
/// The edge reads `tls:<sni>`, then `tls:*.<sni minus its first label>`;
/// the first key present is the certificate, good or bad (a bad one is
/// no certificate: the handshake fails, no other key is tried). Then:
/// expired when `now > not_after`, else a name mismatch when that
/// certificate's host does not cover `host`, else ok.
pub fn outcome<'a>(
    sni: Option<&str>,
    host: &str,
    now: u64,
    get: impl Fn(&str) -> Option<&'a str>,
) -> TlsAnswer {
    let mut a = TlsAnswer {
        tls: TlsOutcome::NoCertificate,
        key: None,
        fingerprint: None,
        not_after: None,
        reasons: Vec::new(),
    };
    let Some(sni) = sni.filter(|s| !s.is_empty()) else {
        a.reasons
            .push("no SNI: the edge has no certificate to choose (handshake fails)".into());
        return a;
    };
    let hosts = lookup_hosts(sni);
    if hosts.is_empty() {
        a.reasons.push(format!(
            "SNI `{}` is not a name the edge looks up (handshake fails)",
            crate::untrusted::escape(sni)
        ));
        return a;
    }
    let found = hosts.iter().find_map(|h| {
        let key = keys::tls(h);
        get(&key).map(|text| (h.as_str(), key, text))
    });
    let Some((cert_host, key, text)) = found else {
        let tried: Vec<String> = hosts.iter().map(|h| keys::tls(h)).collect();
        a.reasons.push(format!(
            "no certificate: {} absent (handshake fails)",
            tried.join(", ")
        ));
        return a;
    };
    let doc = match TlsDoc::parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            a.reasons
                .push(format!("{key} is unreadable: {e} (handshake fails)"));
            return a;
        }
    };
    a.key = Some(key.clone());
    a.fingerprint = Some(doc.fingerprint.clone());
    a.not_after = Some(doc.not_after);
    a.reasons.push(format!(
        "certificate {key} (sha256:{}, not after {})",
        doc.fingerprint,
        crate::time::rfc3339(doc.not_after)
    ));
    if now > doc.not_after {
        a.tls = TlsOutcome::Expired;
        a.reasons.push(format!(
            "expired: not after {}, now {}",
            crate::time::rfc3339(doc.not_after),
            crate::time::rfc3339(now)
        ));
    } else if !covers(cert_host, host) {
        a.tls = TlsOutcome::NameMismatch;
        a.reasons.push(format!(
            "the certificate for `{cert_host}` does not cover `{host}`"
        ));
    } else {
        a.tls = TlsOutcome::Ok;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_normalisation_and_lookup_order() {
        assert_eq!(
            lookup_hosts("A.Example.COM."),
            ["a.example.com", "*.example.com"]
        );
        assert_eq!(lookup_hosts("localhost"), ["localhost"]);
        for bad in [
            "",
            ".",
            "a..b",
            "a b",
            "é.example",
            "a/b",
            "*.example.com",
            "a.b..",
        ] {
            assert!(lookup_hosts(bad).is_empty(), "{bad:?}");
        }
        let long = format!("{}.example", "a".repeat(250));
        assert!(lookup_hosts(&long).is_empty());
    }

    #[test]
    fn wildcards_cover_one_label() {
        assert!(covers("*.example.com", "a.example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("*.example.com", "aexample.com"));
        assert!(covers("example.com", "example.com"));
        assert!(!covers("example.com", "www.example.com"));
    }

    #[test]
    fn certificate_document_is_canonical_and_checked() {
        let doc = TlsDoc {
            chain: "-----BEGIN CERTIFICATE-----\n".into(),
            fingerprint: "ab".repeat(32),
            key: "k".into(),
            not_after: 1_800_000_000,
        };
        let text = doc.to_canonical_json();
        assert!(text.starts_with(r#"{"chain":"#), "{text}");
        assert_eq!(TlsDoc::parse(&text), Ok(doc.clone()));
        let upper = text.replace(&"ab".repeat(32), &"AB".repeat(32));
        assert!(TlsDoc::parse(&upper).is_err());
        assert!(TlsDoc::parse(&text[..text.len() - 1]).is_err());
        assert!(TlsDoc::parse(r#"{"chain":"c","fingerprint":"","key":"k"}"#).is_err());
    }

    fn doc() -> TlsDoc {
        TlsDoc {
            chain: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            fingerprint: "ab".repeat(32),
            key: "-----BEGIN PRIVATE KEY-----\nMC4CAQ\n-----END PRIVATE KEY-----\n".into(),
            not_after: 1_900_000_000,
        }
    }

    #[test]
    fn canonical_json_has_sorted_keys_and_no_whitespace() {
        let text = doc().to_canonical_json();
        assert!(text.starts_with("{\"chain\":"), "{text}");
        let fields: Vec<&str> = ["\"chain\"", "\"fingerprint\"", "\"key\"", "\"not_after\""]
            .into_iter()
            .collect();
        let at: Vec<usize> = fields.iter().map(|f| text.find(f).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(serde_json::from_str::<TlsDoc>(&text).unwrap(), doc());
    }

    #[test]
    fn shown_values_never_hold_the_key() {
        let text = doc().to_canonical_json();
        let shown_text = shown("tls:a.example", &text);
        assert!(!shown_text.contains("PRIVATE KEY"), "{shown_text}");
        assert!(shown_text.contains(&format!(
            "redacted (certificate sha256:{})",
            "ab".repeat(32)
        )));
        assert!(shown_text.contains("BEGIN CERTIFICATE"));
        // Corrupt or truncated: nothing of it.
        let cut = &text[..text.len() - 3];
        assert!(!shown("tls:a.example", cut).contains("PRIVATE"));
        // Other keys are shown as they are.
        assert_eq!(shown("site:a.example", "{\"key\":1}"), "{\"key\":1}");
        assert!(!format!("{:?}", doc()).contains("PRIVATE"));
    }
}
