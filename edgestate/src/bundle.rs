//! What an edge's installed code reads (`edgeform:bundle` in its own
//! Redis), and what a set of documents uses: the version-skew gate's two
//! sides (docs/operations.md, "Version skew"). An edge whose code does not
//! know a document field answers that site 502 `bad-document`; `plan` and
//! `apply` refuse to push it such documents ("install first").

use std::collections::{BTreeMap, BTreeSet};

use crate::keys;
use crate::site::{SITE_FIELDS, SITE_OPTIONAL_FIELDS, all_site_fields};

/// The hash's field listing the document fields the code reads.
pub const SITE_FIELDS_FIELD: &str = "site_fields";
/// The hash's field saying the code serves `tls:*` (`"1"`).
pub const TLS_FIELD: &str = "tls";

/// The edge role's declaration of what its code reads, shipped in every
/// edge bundle (`roles/edge/reads.json`, generated from this crate with
/// the Lua tables: [`crate::lua`]): the installer writes it into the
/// edge's `edgeform:bundle` after the switch, so the skew gate knows what
/// the release it installed reads — an older release, an older file.
pub const READS_FILE: &str = "reads.json";

/// What an edge's installed code reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// Document fields (the seed's twelve always among them).
    pub site_fields: BTreeSet<String>,
    /// It serves certificates from `tls:<host>`.
    pub tls: bool,
}

impl Bundle {
    /// An edge that declares nothing: the seed's twelve fields, no `tls`.
    #[must_use]
    pub fn seed() -> Bundle {
        Bundle {
            site_fields: SITE_FIELDS.iter().map(|f| f.0.to_owned()).collect(),
            tls: false,
        }
    }

    /// What the edge code of this build reads: every field of
    /// [`crate::site::SiteDoc`], and `tls:*`.
    #[must_use]
    pub fn current() -> Bundle {
        Bundle {
            site_fields: all_site_fields().iter().map(|f| f.0.to_owned()).collect(),
            tls: true,
        }
    }

    /// The bundle an edge declares in its `edgeform:bundle` hash (absent or
    /// empty: [`Bundle::seed`]). Unknown names are kept (a newer edge);
    /// the seed's fields are always read.
    #[must_use]
    pub fn from_hash(h: &BTreeMap<String, String>) -> Bundle {
        let mut b = Bundle::seed();
        if let Some(list) = h.get(SITE_FIELDS_FIELD) {
            b.site_fields.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(str::to_owned),
            );
        }
        b.tls = h.get(TLS_FIELD).is_some_and(|v| v == "1");
        b
    }

    /// The hash's fields and values, as installers write them.
    #[must_use]
    pub fn to_hash(&self) -> Vec<(&'static str, String)> {
        let fields: Vec<&str> = self.site_fields.iter().map(String::as_str).collect();
        vec![
            (SITE_FIELDS_FIELD, fields.join(",")),
            (TLS_FIELD, if self.tls { "1" } else { "0" }.to_owned()),
        ]
    }

    /// The text of a [`READS_FILE`]: `{"site_fields": [...], "tls": bool}`.
    #[must_use]
    pub fn to_reads_json(&self) -> String {
        let v = serde_json::json!({ "site_fields": self.site_fields, "tls": self.tls });
        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
        text.push('\n');
        text
    }

    /// A [`READS_FILE`]'s bundle (the seed's fields always read); `None`
    /// when it is not that shape.
    #[must_use]
    pub fn from_reads_json(text: &[u8]) -> Option<Bundle> {
        let v: serde_json::Value = serde_json::from_slice(text).ok()?;
        let mut b = Bundle::seed();
        for f in v.get("site_fields")?.as_array()? {
            b.site_fields.insert(f.as_str()?.to_owned());
        }
        b.tls = v.get("tls")?.as_bool()?;
        Some(b)
    }

    /// What `uses` needs that this bundle does not read. A field the
    /// documents list in `skippable` ([`crate::site::listed_when_present`])
    /// is not needed by code that reads the list: it skips it.
    #[must_use]
    pub fn missing(&self, uses: &Uses) -> Uses {
        let skips = self.site_fields.contains(crate::site::SKIPPABLE_FIELD);
        Uses {
            fields: uses
                .fields
                .iter()
                .filter(|(f, _)| {
                    let read = self.site_fields.contains(**f);
                    let skipped = skips && crate::site::listed_when_present(f);
                    !read && !skipped
                })
                .map(|(f, k)| (*f, k.clone()))
                .collect(),
            tls_key: uses.tls_key.clone().filter(|_| !self.tls),
        }
    }

    /// The fields read, comma-joined (for messages).
    #[must_use]
    pub fn describe(&self) -> String {
        let optional: Vec<&str> = SITE_OPTIONAL_FIELDS
            .iter()
            .map(|f| f.0)
            .filter(|f| self.site_fields.contains(*f))
            .collect();
        let fields = if optional.is_empty() {
            "the seed's twelve site fields".to_owned()
        } else {
            format!("the seed's site fields and {}", optional.join(", "))
        };
        format!(
            "{fields}, {}",
            if self.tls { "and tls:*" } else { "no tls:*" }
        )
    }
}

/// What a set of documents uses beyond the seed: each optional field with
/// the first key (in key order) that uses it, and the first `tls:` key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uses {
    pub fields: BTreeMap<&'static str, String>,
    pub tls_key: Option<String>,
}

impl Uses {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.tls_key.is_none()
    }

    /// Scan `(key, value)` documents (canonical JSON, as compiled): an
    /// optional field is used where a `site:` value has it as a top-level
    /// key (`{"f":` or `,"f":` — inside a JSON string every `"` is
    /// escaped, so the text cannot occur there).
    #[must_use]
    pub fn of<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Uses {
        let needles: Vec<(&'static str, String, String)> = SITE_OPTIONAL_FIELDS
            .iter()
            .map(|f| (f.0, format!("{{\"{}\":", f.0), format!(",\"{}\":", f.0)))
            .collect();
        let mut u = Uses::default();
        for (key, value) in entries {
            if key.starts_with(keys::TLS_PREFIX) {
                if u.tls_key.is_none() {
                    u.tls_key = Some(key.to_owned());
                }
            } else if key.starts_with(keys::SITE_PREFIX) {
                for (name, first, later) in &needles {
                    if !u.fields.contains_key(name)
                        && (value.contains(later.as_str()) || value.starts_with(first.as_str()))
                    {
                        u.fields.insert(name, key.to_owned());
                    }
                }
            }
        }
        u
    }

    /// `self` (what earlier documents use) and then `later`'s: each field
    /// keeps the first document that uses it, as one [`Uses::of`] over
    /// both lists in order would.
    pub fn merge(&mut self, later: Uses) {
        for (field, key) in later.fields {
            self.fields.entry(field).or_insert(key);
        }
        if self.tls_key.is_none() {
            self.tls_key = later.tls_key;
        }
    }

    /// `site:a uses https_redirect, site:b uses max_body_size, tls:a.test
    /// is a certificate`.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .fields
            .iter()
            .map(|(f, k)| format!("{} uses {f}", crate::untrusted::escape(k)))
            .collect();
        if let Some(k) = &self.tls_key {
            parts.push(format!(
                "{} is a certificate document",
                crate::untrusted::escape(k)
            ));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_bundle_reads_the_seed_fields_only() {
        let seed = Bundle::from_hash(&BTreeMap::new());
        assert_eq!(seed, Bundle::seed());
        assert_eq!(seed.site_fields.len(), 12);
        assert!(!seed.tls);
        let cur = Bundle::current();
        let h: BTreeMap<String, String> = cur
            .to_hash()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(Bundle::from_hash(&h), cur);
        assert!(h["site_fields"].contains("https_redirect"));
        assert_eq!(h["tls"], "1");
    }

    #[test]
    fn the_reads_file_round_trips_and_always_holds_the_seed() {
        let cur = Bundle::current();
        assert_eq!(
            Bundle::from_reads_json(cur.to_reads_json().as_bytes()),
            Some(cur)
        );
        let old = Bundle::from_reads_json(br#"{"site_fields": ["https_redirect"], "tls": false}"#)
            .unwrap();
        assert!(old.site_fields.contains("origin") && old.site_fields.contains("https_redirect"));
        assert!(!old.site_fields.contains("max_body_size") && !old.tls);
        for bad in [
            &b"{}"[..],
            b"[]",
            b"{\"site_fields\": [1], \"tls\": true}",
            b"x",
        ] {
            assert_eq!(Bundle::from_reads_json(bad), None);
        }
    }

    #[test]
    fn uses_finds_top_level_fields_and_certificates_only() {
        let plain =
            r#"{"cache_rules":[],"cached":true,"origin":"http://o/\"https_redirect\":true"}"#;
        let redirect = r#"{"cache_rules":[],"cached":true,"https_redirect":true,"origin":"x"}"#;
        let u = Uses::of([
            ("site:a.test", plain),
            ("site:b.test", redirect),
            ("site:c.test", redirect),
            ("tls:b.test", "{}"),
        ]);
        assert_eq!(u.fields.len(), 1);
        assert_eq!(u.fields["https_redirect"], "site:b.test");
        assert_eq!(u.tls_key.as_deref(), Some("tls:b.test"));
        assert!(Uses::of([("site:a.test", plain)]).is_empty());

        let missing = Bundle::seed().missing(&u);
        assert_eq!(missing, u);
        assert_eq!(
            missing.describe(),
            "site:b.test uses https_redirect, tls:b.test is a certificate document"
        );
        assert!(Bundle::current().missing(&u).is_empty());
        let mut old = BTreeMap::new();
        old.insert("site_fields".to_owned(), "https_redirect".to_owned());
        let partial = Bundle::from_hash(&old).missing(&u);
        assert!(partial.fields.is_empty());
        assert!(partial.tls_key.is_some());
    }

    #[test]
    fn merged_uses_name_the_first_document_as_one_scan_does() {
        let docs = [
            ("site:a.test", r#"{"hosts":[],"https_redirect":true}"#),
            ("tls:a.test", "{}"),
            (
                "site:b.test",
                r#"{"https_redirect":false,"max_body_size":"1m"}"#,
            ),
            ("tls:b.test", "{}"),
            ("site:c.test", r#"{"max_body_size":"2m"}"#),
        ];
        let whole = Uses::of(docs);
        for split in 0..=docs.len() {
            let mut merged = Uses::of(docs[..split].iter().copied());
            merged.merge(Uses::of(docs[split..].iter().copied()));
            assert_eq!(merged.describe(), whole.describe(), "split at {split}");
        }
        assert_eq!(
            whole.describe(),
            "site:a.test uses https_redirect, site:b.test uses max_body_size, \
             tls:a.test is a certificate document"
        );
    }
}
