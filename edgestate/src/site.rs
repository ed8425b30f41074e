//! The per-hostname document, `site:<host>`.
//!
//! Field set and spelling are the seed's: the edge's Lua reads them as they
//! are. Fields are declared in alphabetical order so that serde emits the
//! canonical form (sorted keys, no whitespace) without a detour through a
//! map. `geo_codes` and `ip_list` are comma-joined strings because the Lua
//! splits them so.
//!
//! The fields that hold one of a few fixed words (the modes, a rule's
//! `action` and `match_type`) are [`Word`]s: the compiler borrows the
//! `&'static str` of its enums, so a million resolved sites do not carry
//! ~10 small heap strings each (#16); a document read back from JSON owns
//! its words. Either way the JSON is the same.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A field that is one of a few fixed words: borrowed when the compiler
/// builds the document, owned when it was deserialized. Serializes as the
/// plain string; compare it with `==` against a `&str`, read it with `&*`.
pub type Word = Cow<'static, str>;

/// One site document, exactly as the edge reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteDoc {
    pub cache_rules: Vec<CacheRule>,
    pub cached: bool,
    pub cors_mode: Word,
    pub edge_rules: Vec<EdgeRule>,
    pub geo_codes: String,
    pub geo_mode: Word,
    pub hotlink_mode: Word,
    pub ip_list: String,
    pub ip_mode: Word,
    pub origin: String,
    pub rate_mode: Word,
    pub waf_mode: Word,
}

/// A cache rule: `ttl` is present exactly when `action` is `ttl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheRule {
    pub action: Word,
    pub match_type: Word,
    pub match_value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u32>,
}

/// An edge rule: `redirect_status` is present exactly when `action` is
/// `redirect`; `redirect_to` is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeRule {
    pub action: Word,
    pub match_type: Word,
    pub match_value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_to: Option<String>,
}

impl SiteDoc {
    /// The canonical JSON text stored in Redis: sorted keys, no whitespace.
    #[must_use]
    pub fn to_canonical_json(&self) -> String {
        // Serializing plain structs and strings cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's own example document, field for field.
    #[test]
    fn seed_document_round_trips_canonically() {
        let doc = SiteDoc {
            origin: "http://203.0.113.10:80".into(),
            cached: true,
            geo_mode: "block".into(),
            geo_codes: "RU,CN".into(),
            ip_mode: "allow".into(),
            ip_list: "198.51.100.0/24".into(),
            rate_mode: "strict".into(),
            waf_mode: "strict".into(),
            cors_mode: "strict".into(),
            hotlink_mode: "block".into(),
            cache_rules: vec![CacheRule {
                match_type: "ext".into(),
                match_value: ".mp4".into(),
                action: "ttl".into(),
                ttl: Some(86400),
            }],
            edge_rules: vec![EdgeRule {
                match_type: "prefix".into(),
                match_value: "/old/".into(),
                action: "redirect".into(),
                redirect_status: Some(301),
                redirect_to: None,
            }],
        };
        let text = doc.to_canonical_json();
        // Canonical: equal to serde_json's sorted-map rendering.
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(text, serde_json::to_string(&value).unwrap());
        let back: SiteDoc = serde_json::from_str(&text).unwrap();
        assert_eq!(back, doc);
        assert!(text.starts_with(r#"{"cache_rules":[{"action":"ttl","match_type":"ext""#));
        // Built from literals the words are borrowed, read back they are
        // owned; equal either way, and the JSON is the same text.
        assert!(matches!(doc.geo_mode, Cow::Borrowed("block")));
        assert!(matches!(back.geo_mode, Cow::Owned(_)));
        assert!(matches!(back.cache_rules[0].action, Cow::Owned(_)));
        assert_eq!(back.to_canonical_json(), text);
        assert_eq!(back.waf_mode, "strict");
    }
}
