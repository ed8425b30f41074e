//! The certificate document, `tls:<host>`: what an edge needs to
//! terminate TLS for a host (the chain, leaf first; the private key; the
//! leaf's not-after and SHA-256 fingerprint). One per host and alias of
//! every site with `tls`, on every edge carrying the site.
//!
//! Key material is pushed to the edge's Redis and nowhere else: whatever
//! shows a value (`build --out`, `diff`, `plan`) shows [`redact`]'s form,
//! which holds the fingerprint in place of the key.

use serde::{Deserialize, Serialize};

/// One certificate document, exactly as the edge reads it. Fields in
/// alphabetical order: serde emits the canonical form (sorted keys, no
/// whitespace).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsDoc {
    /// PEM, the leaf first, then each issuer in turn.
    pub chain: String,
    /// Lowercase hex SHA-256 of the leaf's DER.
    pub fingerprint: String,
    /// The private key, PEM.
    pub key: String,
    /// The leaf's not-after, seconds since the epoch.
    pub not_after: i64,
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
}

/// What stands in place of the key wherever a document is shown.
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

#[cfg(test)]
mod tests {
    use super::*;

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
