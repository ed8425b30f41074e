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
//! ~10 small heap strings each; a document read back from JSON owns
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
    /// The origins tried after `origin`, in order, when it fails (connect
    /// error, timeout, 5xx) for an idempotent request; the same scheme as
    /// `origin` (present only when the site has more than one origin).
    #[serde(
        default,
        deserialize_with = "empty_unless_given",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub fallback_origins: Vec<String>,
    pub geo_codes: String,
    pub geo_mode: Word,
    pub hotlink_mode: Word,
    /// `http` requests get a 301 to `https://` (present only when true).
    #[serde(
        default,
        deserialize_with = "false_unless_true",
        skip_serializing_if = "is_false"
    )]
    pub https_redirect: bool,
    pub ip_list: String,
    pub ip_mode: Word,
    /// The largest request body in bytes (`Content-Length`) the edge
    /// accepts; absent: the edge's default.
    #[serde(
        default,
        deserialize_with = "exact_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_body_size: Option<u64>,
    pub origin: String,
    /// Whether an `https://` origin's certificate is verified (present
    /// only when false: the explicit opt-out).
    #[serde(
        default = "yes",
        deserialize_with = "true_unless_false",
        skip_serializing_if = "is_true"
    )]
    pub origin_tls_verify: bool,
    pub rate_mode: Word,
    /// The present fields an edge whose code does not read them may skip
    /// (docs/operations.md, "Version skew"): [`FieldClass::Skippable`]
    /// fields newer than this list ([`FIELDS_BEFORE_SKIPPABLE`]); set by
    /// [`SiteDoc::mark_skippable`], present only when not empty.
    #[serde(
        default,
        deserialize_with = "empty_unless_list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub skippable: Vec<String>,
    /// How the site's hostnames get a certificate: `certificate:NAME`
    /// (later `acme`); absent: no HTTPS for the site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
    pub waf_mode: Word,
}

// The optional fields are present only when not the default, so a site
// that does not use them gives the seed's document byte for byte (and an
// edge whose code does not read them never sees them). Read back, absent
// and `null` are the default, as the edge's Lua reads them.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_false(v: &bool) -> bool {
    !*v
}
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_true(v: &bool) -> bool {
    *v
}
fn yes() -> bool {
    true
}
fn false_unless_true<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}
fn empty_unless_given<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}
fn exact_int<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<u64>::deserialize(d)? {
        Some(v) if v > MAX_EXACT_INT => Err(serde::de::Error::custom(format_args!(
            "{v} is above 2^53, the largest integer the edge reads exactly"
        ))),
        v => Ok(v),
    }
}

/// 2^53: the largest integer a double (the edge's Lua number) holds
/// exactly, the ceiling of a [`FieldType::OptU64`] field.
pub const MAX_EXACT_INT: u64 = 1 << 53;

fn empty_unless_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(d)?.unwrap_or_default())
}

fn true_unless_false<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(true))
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

/// The JSON type of a document field, as the edge's Lua checks it before
/// it reads the document (`?`: may be absent or `null`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    Array,
    Boolean,
    String,
    /// An optional boolean.
    OptBool,
    /// An optional string.
    OptString,
    /// An optional integer in `0..=u16::MAX`.
    OptU16,
    /// An optional integer in `0..=u32::MAX`.
    OptU32,
    /// An optional integer in `0..=2^53` ([`MAX_EXACT_INT`]: the edge's
    /// Lua holds numbers as doubles).
    OptU64,
    /// An optional list of strings.
    OptStrings,
}

impl FieldType {
    /// The name the edge's Lua (`edge_decide.lua`'s shape check) reads.
    #[must_use]
    pub fn lua_name(self) -> &'static str {
        match self {
            FieldType::Array => "array",
            FieldType::Boolean => "boolean",
            FieldType::String => "string",
            FieldType::OptBool => "boolean?",
            FieldType::OptString => "string?",
            FieldType::OptU16 => "uint16?",
            FieldType::OptU32 => "uint32?",
            FieldType::OptU64 => "uint64?",
            FieldType::OptStrings => "array?",
        }
    }

    /// Whether the field may be absent (or `null`).
    #[must_use]
    pub fn optional(self) -> bool {
        !matches!(
            self,
            FieldType::Array | FieldType::Boolean | FieldType::String
        )
    }
}

/// [`SiteDoc`]'s seed fields and their JSON types: always present, what
/// every edge reads (a unit test holds them, with
/// [`SITE_OPTIONAL_FIELDS`], to the struct).
pub const SITE_FIELDS: [(&str, FieldType); 12] = [
    ("cache_rules", FieldType::Array),
    ("cached", FieldType::Boolean),
    ("cors_mode", FieldType::String),
    ("edge_rules", FieldType::Array),
    ("geo_codes", FieldType::String),
    ("geo_mode", FieldType::String),
    ("hotlink_mode", FieldType::String),
    ("ip_list", FieldType::String),
    ("ip_mode", FieldType::String),
    ("origin", FieldType::String),
    ("rate_mode", FieldType::String),
    ("waf_mode", FieldType::String),
];
/// [`SiteDoc`]'s optional fields: present only when not the default. An
/// edge reads them only when its installed code says so (`edgeform:bundle`,
/// docs/operations.md "Version skew").
pub const SITE_OPTIONAL_FIELDS: [(&str, FieldType); 6] = [
    ("fallback_origins", FieldType::OptStrings),
    ("https_redirect", FieldType::OptBool),
    ("max_body_size", FieldType::OptU64),
    ("origin_tls_verify", FieldType::OptBool),
    ("skippable", FieldType::OptStrings),
    ("tls", FieldType::OptString),
];

/// The most origins a site has: `origin` and up to three
/// `fallback_origins` (each failed one costs a try of the request).
pub const MAX_ORIGINS: usize = 4;

/// What an edge whose code does not read an optional field may do with a
/// document that has it (docs/operations.md, "Version skew"). The edge
/// cannot know an unknown field's class, so the document carries it: the
/// compiler lists the present [`FieldClass::Skippable`] fields in
/// `skippable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldClass {
    /// It restricts or redirects (geo, IP, WAF, rate, body size, a
    /// redirect, the list itself): served without it, the site would be
    /// more open than its owner wrote. Never skipped: the edge answers
    /// the document 502 `bad-document`, and `apply` refuses the target
    /// ("install first").
    Restricts,
    /// Skipping it cannot open a policy (the site is served as if it were
    /// absent: at worst less well, never less guarded). An edge that does
    /// not read it logs and skips it when the document lists it.
    Skippable,
}

/// Every optional field's class (a unit test holds every field of
/// [`SITE_OPTIONAL_FIELDS`] to one).
pub const SITE_FIELD_CLASSES: [(&str, FieldClass); 6] = [
    // Absent, the edge proxies to `origin` alone: no failover, no
    // policy opened.
    ("fallback_origins", FieldClass::Skippable),
    ("https_redirect", FieldClass::Restricts),
    ("max_body_size", FieldClass::Restricts),
    // Absent, the edge verifies the origin's certificate: stricter.
    ("origin_tls_verify", FieldClass::Skippable),
    // An edge that does not know the list cannot know what it may skip.
    ("skippable", FieldClass::Restricts),
    // The certificate's source; the edge serves `tls:<host>` keys alone.
    ("tls", FieldClass::Skippable),
];

/// The list of fields an older edge may skip ([`SiteDoc::skippable`]).
pub const SKIPPABLE_FIELD: &str = "skippable";

/// The optional fields older than `skippable`: every edge that reads the
/// list reads them, so they are never listed (and the documents that use
/// them stay byte for byte what they were).
pub const FIELDS_BEFORE_SKIPPABLE: [&str; 4] = [
    "https_redirect",
    "max_body_size",
    "origin_tls_verify",
    "tls",
];

/// An optional field's class; `None` for a name that is not one.
#[must_use]
pub fn field_class(name: &str) -> Option<FieldClass> {
    SITE_FIELD_CLASSES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, c)| *c)
}

/// Whether an edge that reads `skippable` but not `name` serves a document
/// listing it: a [`FieldClass::Skippable`] field newer than the list.
#[must_use]
pub fn listed_when_present(name: &str) -> bool {
    field_class(name) == Some(FieldClass::Skippable) && !FIELDS_BEFORE_SKIPPABLE.contains(&name)
}

/// Every field of [`SiteDoc`], seed and optional, in the document's
/// (alphabetical) order.
#[must_use]
pub fn all_site_fields() -> Vec<(&'static str, FieldType)> {
    let mut all: Vec<_> = SITE_FIELDS
        .iter()
        .chain(SITE_OPTIONAL_FIELDS.iter())
        .copied()
        .collect();
    all.sort_by_key(|f| f.0);
    all
}

/// [`CacheRule`]'s fields.
pub const CACHE_RULE_FIELDS: [(&str, FieldType); 4] = [
    ("action", FieldType::String),
    ("match_type", FieldType::String),
    ("match_value", FieldType::String),
    ("ttl", FieldType::OptU32),
];
/// [`EdgeRule`]'s fields.
pub const EDGE_RULE_FIELDS: [(&str, FieldType); 5] = [
    ("action", FieldType::String),
    ("match_type", FieldType::String),
    ("match_value", FieldType::String),
    ("redirect_status", FieldType::OptU16),
    ("redirect_to", FieldType::OptString),
];

impl SiteDoc {
    /// Whether the optional field `name` is present in the JSON (not its
    /// default).
    #[must_use]
    pub fn has_optional(&self, name: &str) -> bool {
        match name {
            "fallback_origins" => !self.fallback_origins.is_empty(),
            "https_redirect" => self.https_redirect,
            "max_body_size" => self.max_body_size.is_some(),
            "origin_tls_verify" => !self.origin_tls_verify,
            "skippable" => !self.skippable.is_empty(),
            "tls" => self.tls.is_some(),
            _ => false,
        }
    }

    /// Set `skippable` from the present fields ([`listed_when_present`]);
    /// the compiler calls it once the fields are set.
    pub fn mark_skippable(&mut self) {
        self.skippable = SITE_OPTIONAL_FIELDS
            .iter()
            .map(|f| f.0)
            .filter(|f| listed_when_present(f) && self.has_optional(f))
            .map(str::to_owned)
            .collect();
    }

    /// [`SiteDoc::mark_skippable`], by value.
    #[must_use]
    pub fn marked(mut self) -> SiteDoc {
        self.mark_skippable();
        self
    }

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

    fn full_doc() -> serde_json::Value {
        serde_json::json!({
            "cache_rules": [{"action": "ttl", "match_type": "ext", "match_value": ".mp4", "ttl": 60}],
            "cached": true, "cors_mode": "off",
            "edge_rules": [{"action": "redirect", "match_type": "prefix", "match_value": "/a",
                            "redirect_status": 301, "redirect_to": "/b"}],
            "fallback_origins": ["https://o2.test"],
            "geo_codes": "", "geo_mode": "off", "hotlink_mode": "off", "https_redirect": true,
            "ip_list": "", "ip_mode": "off", "max_body_size": 1_048_576,
            "origin": "https://o.test", "origin_tls_verify": false, "rate_mode": "off",
            "skippable": ["a_newer_field"], "tls": "certificate:example", "waf_mode": "off"
        })
    }

    /// Every optional field has a class (and `has_optional` knows it);
    /// only classes of real fields; the fields older than the list are
    /// never listed, so the documents compiled before it are unchanged;
    /// a newer skippable field (`fallback_origins`) is listed.
    #[test]
    fn every_optional_field_has_a_class_and_todays_documents_list_nothing() {
        let optional: Vec<&str> = SITE_OPTIONAL_FIELDS.iter().map(|f| f.0).collect();
        let classed: Vec<&str> = SITE_FIELD_CLASSES.iter().map(|f| f.0).collect();
        assert_eq!(
            classed, optional,
            "SITE_FIELD_CLASSES: one per optional field, same order"
        );
        for f in FIELDS_BEFORE_SKIPPABLE {
            assert!(optional.contains(&f), "{f}");
        }
        for (name, class) in SITE_FIELD_CLASSES {
            assert!(field_class(name) == Some(class));
        }
        assert_eq!(field_class("skippable"), Some(FieldClass::Restricts));
        assert_eq!(field_class("geo_mode"), None, "seed fields are always read");
        let mut doc: SiteDoc = serde_json::from_value(full_doc()).unwrap();
        for f in &optional {
            assert!(doc.has_optional(f), "{f}");
        }
        // Every field present: the newer skippable one listed.
        doc.mark_skippable();
        assert_eq!(doc.skippable, ["fallback_origins"]);
        // Without it, nothing listed, and the text is what it was
        // without the list.
        doc.fallback_origins.clear();
        doc.mark_skippable();
        assert!(doc.skippable.is_empty());
        let text = doc.to_canonical_json();
        assert!(!text.contains("skippable"), "{text}");
        let mut v = full_doc();
        v.as_object_mut().unwrap().remove("skippable");
        v.as_object_mut().unwrap().remove("fallback_origins");
        assert_eq!(text, serde_json::to_string(&v).unwrap());
    }

    fn json_type(v: &serde_json::Value) -> FieldType {
        match v {
            serde_json::Value::Array(_) => FieldType::Array,
            serde_json::Value::Bool(_) => FieldType::Boolean,
            serde_json::Value::Number(_) => FieldType::OptU64,
            _ => FieldType::String,
        }
    }

    /// Holds one field table to its struct: the same names; a required
    /// field's absence refused, an optional one's (and its `null`)
    /// accepted; the declared type the only one accepted (strings for
    /// numbers refused, a number above the width refused).
    fn check_fields<T: serde::de::DeserializeOwned>(
        full: &serde_json::Value,
        fields: &[(&str, FieldType)],
    ) {
        let obj = full.as_object().unwrap();
        let names: Vec<&str> = obj.keys().map(String::as_str).collect();
        let declared: Vec<&str> = fields.iter().map(|f| f.0).collect();
        assert_eq!(names, declared);
        assert!(serde_json::from_value::<T>(full.clone()).is_ok());
        for &(name, ty) in fields {
            let mut without = obj.clone();
            without.remove(name);
            let optional = ty.optional();
            let parsed = serde_json::from_value::<T>(without.into()).is_ok();
            assert_eq!(parsed, optional, "{name}: absent");
            let mut null = obj.clone();
            null.insert(name.into(), serde_json::Value::Null);
            let parsed = serde_json::from_value::<T>(null.into()).is_ok();
            assert_eq!(parsed, optional, "{name}: null");
            let max = match ty {
                FieldType::OptU16 => Some(u64::from(u16::MAX)),
                FieldType::OptU32 => Some(u64::from(u32::MAX)),
                FieldType::OptU64 => Some(MAX_EXACT_INT),
                _ => None,
            };
            if let Some(max) = max {
                let cases: [(serde_json::Value, bool); 3] = [
                    (max.into(), true),
                    ((max + 1).into(), false),
                    ((-1).into(), false),
                ];
                for (v, ok) in cases {
                    let mut o = obj.clone();
                    o.insert(name.into(), v.clone());
                    let parsed = serde_json::from_value::<T>(o.into()).is_ok();
                    assert_eq!(parsed, ok, "{name}: {v}");
                }
                let mut o = obj.clone();
                o.insert(name.into(), "1".into());
                assert!(serde_json::from_value::<T>(o.into()).is_err(), "{name}");
            } else {
                let base = match ty {
                    FieldType::OptBool => FieldType::Boolean,
                    FieldType::OptString => FieldType::String,
                    FieldType::OptStrings => FieldType::Array,
                    other => other,
                };
                assert_eq!(json_type(&obj[name]), base, "{name}");
                for other in [serde_json::json!([]), true.into(), "x".into(), 1.into()] {
                    if json_type(&other) != base {
                        let mut o = obj.clone();
                        o.insert(name.into(), other);
                        let parsed = serde_json::from_value::<T>(o.into()).is_ok();
                        assert!(!parsed, "{name}: wrong type accepted");
                    }
                }
            }
        }
    }

    #[test]
    fn field_tables_describe_the_document_structs() {
        let full = full_doc();
        check_fields::<SiteDoc>(&full, &all_site_fields());
        check_fields::<CacheRule>(&full["cache_rules"][0], &CACHE_RULE_FIELDS);
        check_fields::<EdgeRule>(&full["edge_rules"][0], &EDGE_RULE_FIELDS);
    }

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
            https_redirect: false,
            max_body_size: None,
            origin_tls_verify: true,
            skippable: Vec::new(),
            tls: None,
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
            fallback_origins: Vec::new(),
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
        // The optional fields at their defaults are not in the text.
        for (name, _) in SITE_OPTIONAL_FIELDS {
            assert!(!text.contains(&format!("\"{name}\"")), "{name}");
        }
    }

    /// The optional fields appear only when not the default, in sorted
    /// position; read back, absent and `null` are the default.
    #[test]
    fn optional_fields_appear_only_when_not_the_default() {
        let mut doc: SiteDoc = serde_json::from_value(full_doc()).unwrap();
        assert!(doc.https_redirect && !doc.origin_tls_verify);
        assert_eq!(doc.max_body_size, Some(1_048_576));
        assert_eq!(doc.tls.as_deref(), Some("certificate:example"));
        assert_eq!(doc.fallback_origins, ["https://o2.test"]);
        let text = doc.to_canonical_json();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(text, serde_json::to_string(&value).unwrap());
        assert_eq!(value, full_doc());

        doc.https_redirect = false;
        doc.origin_tls_verify = true;
        doc.max_body_size = None;
        doc.skippable = Vec::new();
        doc.tls = None;
        doc.fallback_origins.clear();
        let text = doc.to_canonical_json();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let seed: Vec<&str> = SITE_FIELDS.iter().map(|f| f.0).collect();
        assert_eq!(keys, seed);

        let mut nulls = full_doc();
        for (name, _) in SITE_OPTIONAL_FIELDS {
            nulls[name] = serde_json::Value::Null;
        }
        let back: SiteDoc = serde_json::from_value(nulls).unwrap();
        assert_eq!(back, doc);
    }
}
