//! `edgeform import`: the site documents an edge holds (`site:*`,
//! `suspended:*`) back into `sites/*.yaml` — the inverse of
//! [`crate::compile`] for one edge. Pure: key → value in, files and
//! problems out; the CLI reads Redis and writes files.
//!
//! - Hosts whose documents are byte-identical (and equally suspended)
//!   become one site: the shortest name is `host` (ties: alphabetical), the
//!   others `aliases` — exactly what compile writes for a site with
//!   aliases. `--no-aliases` writes one file per host instead.
//! - The file is `sites/<host>.yaml`; a wildcard `*.example.com` is
//!   `sites/wildcard.example.com.yaml` (the example repository's naming).
//! - Fields at their default are left out (`cached: true`, modes `off`,
//!   empty lists); `regions` cannot be known from one edge and is left out.
//! - What the model cannot express is a [`Problem`] naming the key: a field
//!   the seed's document does not have, a value of the wrong type, a
//!   `suspended:` key without its `site:`, a `suspended:` value other than
//!   `"1"`. The CLI refuses to write unless `--allow-lossy`. A document that
//!   is only not canonical (spacing, key order) is a note: apply rewrites
//!   it with the same content.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::load::Kind;

/// Something the model cannot hold exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

/// The result of importing one edge's documents.
#[derive(Debug, Clone, Default)]
pub struct Imported {
    /// `sites/<host>.yaml` → text, sorted by path.
    pub files: BTreeMap<String, String>,
    /// Lossy: refused without `--allow-lossy`.
    pub problems: Vec<Problem>,
    /// Not lossy: e.g. non-canonical JSON that apply will rewrite.
    pub notes: Vec<Problem>,
}

/// The entries read from an edge (key and value bytes; None: gone since
/// listed) as text, and a problem for each key or value that is not
/// UTF-8 (named escaped): the model holds only text, and one such entry
/// must not stop the import of the rest.
#[must_use]
pub fn text_entries(
    entries: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
) -> (BTreeMap<String, String>, Vec<Problem>) {
    let mut live = BTreeMap::new();
    let mut problems = Vec::new();
    for (key, value) in entries {
        let Some(value) = value else { continue };
        match (String::from_utf8(key), String::from_utf8(value)) {
            (Ok(k), Ok(v)) => {
                live.insert(k, v);
            }
            (Err(e), _) => problems.push(Problem {
                key: crate::diff::escape_bytes(e.as_bytes()),
                message: "the key is not UTF-8; left out (heal removes it)".into(),
            }),
            (Ok(k), Err(e)) => problems.push(Problem {
                key: crate::diff::escape_bytes(k.as_bytes()),
                message: format!(
                    "the value is not UTF-8 (at byte {}); left out",
                    e.utf8_error().valid_up_to()
                ),
            }),
        }
    }
    (live, problems)
}

/// The seed's fields in the model's order, with their YAML defaults.
const FIELDS: &[&str] = &[
    "origin",
    "cached",
    "geo_mode",
    "geo_codes",
    "ip_mode",
    "ip_list",
    "rate_mode",
    "waf_mode",
    "cors_mode",
    "hotlink_mode",
    "cache_rules",
    "edge_rules",
];

/// The file a site with this host is written to.
#[must_use]
pub fn file_name(host: &str) -> String {
    match host.strip_prefix("*.") {
        Some(rest) => format!("sites/wildcard.{rest}.yaml"),
        None => format!("sites/{host}.yaml"),
    }
}

/// Turn an edge's `site:*` / `suspended:*` keys into site files.
/// `group_aliases`: merge hosts with identical documents into one site.
#[must_use]
pub fn import(entries: &BTreeMap<String, String>, group_aliases: bool) -> Imported {
    let mut out = Imported::default();
    // host → (document text, suspended)
    let mut hosts: BTreeMap<&str, (&str, bool)> = BTreeMap::new();
    for (key, value) in entries {
        if let Some(host) = key.strip_prefix(edgestate::keys::SITE_PREFIX) {
            let suspended = entries.contains_key(&edgestate::keys::suspended(host));
            hosts.insert(host, (value.as_str(), suspended));
        } else if let Some(host) = key.strip_prefix(edgestate::keys::SUSPENDED_PREFIX) {
            if !entries.contains_key(&edgestate::keys::site(host)) {
                out.problems.push(Problem {
                    key: key.clone(),
                    message: "suspended, but the edge has no `site:` document for it: a site \
                              needs an origin, so this key is not imported"
                        .into(),
                });
            } else if value != edgestate::keys::SUSPENDED_VALUE {
                out.problems.push(Problem {
                    key: key.clone(),
                    message: format!(
                        "value {value:?}: imported as `suspended: true`, which apply writes as \"1\""
                    ),
                });
            }
        }
    }
    // Group by (document, suspended).
    let mut groups: BTreeMap<(&str, bool), Vec<&str>> = BTreeMap::new();
    for (host, (doc, suspended)) in &hosts {
        if group_aliases {
            groups.entry((doc, *suspended)).or_default().push(host);
        } else {
            out_one(&mut out, &[host], doc, *suspended);
        }
    }
    for ((doc, suspended), mut names) in groups {
        names.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        out_one(&mut out, &names, doc, suspended);
    }
    out
}

fn out_one(out: &mut Imported, names: &[&str], text: &str, suspended: bool) {
    let host = names[0];
    let key = edgestate::keys::site(host);
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            out.problems.push(Problem {
                key,
                message: format!("not JSON ({e}); not imported"),
            });
            return;
        }
    };
    let Value::Object(doc) = value else {
        out.problems.push(Problem {
            key,
            message: "not a JSON object; not imported".into(),
        });
        return;
    };
    let canonical = serde_json::to_string(&doc).unwrap_or_default();
    if canonical != text {
        out.notes.push(Problem {
            key: key.clone(),
            message: "not canonical JSON (spacing or key order); apply rewrites it with the same \
                      content"
                .into(),
        });
    }
    let mut site = Map::new();
    site.insert("host".into(), host.into());
    if names.len() > 1 {
        site.insert(
            "aliases".into(),
            names[1..].iter().map(|h| Value::from(*h)).collect(),
        );
    }
    for (field, v) in &doc {
        if !FIELDS.contains(&field.as_str()) {
            out.problems.push(Problem {
                key: key.clone(),
                message: format!(
                    "unknown field `{field}` (value {v}): the site model has no place for it"
                ),
            });
        }
    }
    for field in FIELDS {
        let Some(v) = doc.get(*field) else {
            out.notes.push(Problem {
                key: key.clone(),
                message: format!(
                    "no `{field}`: the default is imported and apply writes it explicitly"
                ),
            });
            continue;
        };
        match (*field, v) {
            ("geo_codes" | "ip_list", Value::String(s)) => {
                let items: Vec<Value> = s
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(Value::from)
                    .collect();
                if !items.is_empty() {
                    site.insert((*field).into(), Value::Array(items));
                }
            }
            ("cached", Value::Bool(true)) => {}
            ("cached", Value::Bool(false)) => {
                site.insert("cached".into(), false.into());
            }
            ("origin", Value::String(_)) => {
                site.insert("origin".into(), v.clone());
            }
            (_, Value::String(mode)) if field.ends_with("_mode") => {
                if mode != "off" {
                    site.insert((*field).into(), v.clone());
                }
            }
            ("cache_rules" | "edge_rules", Value::Array(rules)) => {
                // A rule's fields, in the model's order (as `fmt` writes them).
                let fields = crate::fmt::order(Kind::Site, &[field]);
                let mut list = Vec::new();
                for (i, rule) in rules.iter().enumerate() {
                    let Value::Object(rule) = rule else {
                        out.problems.push(Problem {
                            key: key.clone(),
                            message: format!("`{field}[{i}]` is not an object; not imported"),
                        });
                        continue;
                    };
                    let mut r = Map::new();
                    for (k, rv) in rule {
                        if fields.contains(&k.as_str()) {
                            r.insert(k.clone(), rv.clone());
                        } else {
                            out.problems.push(Problem {
                                key: key.clone(),
                                message: format!(
                                    "unknown field `{field}[{i}].{k}` (value {rv}): the rule model \
                                     has no place for it"
                                ),
                            });
                        }
                    }
                    list.push(Value::Object(r));
                }
                if !list.is_empty() {
                    site.insert((*field).into(), Value::Array(list));
                }
            }
            _ => out.problems.push(Problem {
                key: key.clone(),
                message: format!("`{field}` has a value of the wrong type ({v}); not imported"),
            }),
        }
    }
    if suspended {
        site.insert("suspended".into(), true.into());
    }
    let text = crate::fmt::emit(Kind::Site, &Value::Object(site));
    out.files.insert(file_name(host), text);
}

/// Compare what the imported repository compiles to for the edge with what
/// the edge holds: every difference is a problem (the import would not be
/// exact), except values equal as JSON (noted as non-canonical above).
#[must_use]
pub fn verify(
    live: &BTreeMap<String, String>,
    compiled: &[(String, String)],
    already: &[Problem],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let reported = |k: &str| already.iter().any(|p| p.key == k);
    let compiled_map: BTreeMap<&str, &str> = compiled
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for (key, value) in live {
        match compiled_map.get(key.as_str()) {
            None if !reported(key) => problems.push(Problem {
                key: key.clone(),
                message: "the imported repository would not write this key to the edge".into(),
            }),
            Some(c) if *c != value && !same_json(c, value) && !reported(key) => {
                problems.push(Problem {
                    key: key.clone(),
                    message: format!("the imported repository would write {c} instead of {value}"),
                });
            }
            _ => {}
        }
    }
    for (key, _) in compiled {
        if !live.contains_key(key) && !reported(key) {
            problems.push(Problem {
                key: key.clone(),
                message: "the imported repository would add this key to the edge".into(),
            });
        }
    }
    problems
}

fn same_json(a: &str, b: &str) -> bool {
    // Missing fields filled with defaults compare as different: they were
    // noted, and apply writes them, so they are not problems either.
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(Value::Object(x)), Ok(Value::Object(y))) => {
            x.iter().all(|(k, v)| y.get(k).is_none_or(|w| w == v))
                && y.keys().all(|k| x.contains_key(k))
        }
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const DOC: &str = r#"{"cache_rules":[{"action":"ttl","match_type":"ext","match_value":".mp4","ttl":86400}],"cached":true,"cors_mode":"strict","edge_rules":[{"action":"redirect","match_type":"prefix","match_value":"/old/","redirect_status":301}],"geo_codes":"RU,CN","geo_mode":"block","hotlink_mode":"block","ip_list":"198.51.100.0/24","ip_mode":"allow","origin":"http://203.0.113.10:80","rate_mode":"strict","waf_mode":"strict"}"#;

    #[test]
    fn groups_aliases_and_writes_the_model_order() {
        let e = entries(&[
            ("site:example.com", DOC),
            ("site:www.example.com", DOC),
            ("suspended:example.com", "1"),
            ("suspended:www.example.com", "1"),
        ]);
        let out = import(&e, true);
        assert!(out.problems.is_empty() && out.notes.is_empty(), "{out:?}");
        assert_eq!(
            out.files["sites/example.com.yaml"],
            "host: example.com\naliases: [www.example.com]\norigin: http://203.0.113.10:80\n\
             suspended: true\ngeo_mode: block\ngeo_codes: [RU, CN]\nip_mode: allow\n\
             ip_list: [198.51.100.0/24]\nrate_mode: strict\nwaf_mode: strict\ncors_mode: strict\n\
             hotlink_mode: block\ncache_rules:\n  - match_type: ext\n    match_value: .mp4\n\
             \x20   action: ttl\n    ttl: 86400\nedge_rules:\n  - match_type: prefix\n\
             \x20   match_value: /old/\n    action: redirect\n    redirect_status: 301\n"
        );
        assert_eq!(import(&e, false).files.len(), 2);
        assert_eq!(
            file_name("*.cdn.example.io"),
            "sites/wildcard.cdn.example.io.yaml"
        );
    }

    #[test]
    fn reports_what_the_model_cannot_hold() {
        let odd = DOC.replace(
            r#""waf_mode":"strict""#,
            r#""waf_mode":"strict","tls":"v1.3""#,
        );
        let e = entries(&[
            ("site:a.example.com", &odd),
            ("suspended:b.example.com", "1"),
            ("site:c.example.com", "not json"),
            (
                "site:d.example.com",
                r#"{"origin": "http://d", "cached": "yes"}"#,
            ),
        ]);
        let out = import(&e, true);
        let msgs: Vec<String> = out
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.key, p.message))
            .collect();
        let has = |s: &str| msgs.iter().any(|m| m.contains(s));
        assert!(has("site:a.example.com: unknown field `tls`"), "{msgs:#?}");
        assert!(has("suspended:b.example.com: suspended, but"), "{msgs:#?}");
        assert!(has("site:c.example.com: not JSON"), "{msgs:#?}");
        assert!(
            has("site:d.example.com: `cached` has a value of the wrong type"),
            "{msgs:#?}"
        );
        assert!(out.notes.iter().any(|n| n.key == "site:d.example.com"));
    }
}
