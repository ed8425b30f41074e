//! The Lua tables the reference edge and the geo router read, generated
//! from this crate's definitions so that the two languages cannot drift:
//! `roles/edge/lua/edge_tables.lua` (methods, WAF rules, hotlink
//! extensions, rate limits, default TTL, the challenge's constants, the
//! document's fields, the reasons) and `router/lua/geo_tables.lua` (the
//! Earth radius, the stable hash's constants, the default tie distance),
//! and `roles/edge/reads.json` (what the edge code reads: the version-skew
//! gate's declaration, [`crate::bundle::READS_FILE`]).
//!
//! The committed files are exactly what [`edge_tables`] and [`geo_tables`]
//! return; a unit test fails when they differ, and rewrites them under
//! `EDGEFORM_BLESS=1` (as the schemas are kept).

use std::fmt::Write as _;

use crate::edge;
use crate::route;
use crate::routing;
use crate::site::{self, FieldType};

/// Where the generated files live, from the workspace root.
pub const EDGE_TABLES_PATH: &str = "roles/edge/lua/edge_tables.lua";
pub const GEO_TABLES_PATH: &str = "router/lua/geo_tables.lua";
/// What the edge role's code reads ([`crate::bundle::READS_FILE`]), kept
/// with its Lua tables.
pub const EDGE_READS_PATH: &str = "roles/edge/reads.json";

const HEADER: &str = "-- Generated from the Rust definitions in edgestate (edgestate/src/lua.rs):\n\
     -- do not edit. `EDGEFORM_BLESS=1 cargo test -p edgestate lua` rewrites it.\n";

/// `s` as a Lua string literal: double-quoted, with `\\`, `"` and every
/// byte outside printable ASCII escaped as `\ddd`.
fn lua_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'"' => out.push_str("\\\""),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\{b:03}");
            }
        }
    }
    out.push('"');
    out
}

fn str_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(lua_str).collect();
    format!("{{ {} }}", items.join(", "))
}

fn fields(list: &[(&str, FieldType)]) -> String {
    let mut out = String::from("{\n");
    for (name, ty) in list {
        let _ = writeln!(out, "    {name} = {},", lua_str(ty.lua_name()));
    }
    out.push_str("  }");
    out
}

/// The text of `roles/edge/lua/edge_tables.lua`.
#[must_use]
pub fn edge_tables() -> String {
    let mut out = String::from(HEADER);
    out.push_str("-- The edge's tables: edgestate::edge and edgestate::site.\n\nreturn {\n");
    let _ = writeln!(
        out,
        "  -- Methods the WAF accepts (edgestate::edge::METHODS).\n  METHODS = {},",
        str_list(edge::METHODS)
    );
    let _ = writeln!(
        out,
        "  -- The WAF's rule for any other method.\n  WAF_BAD_METHOD = {},",
        lua_str(edge::WAF_BAD_METHOD)
    );
    out.push_str("  -- WAF rules, in order: name, needles (as written; edge_norm.waf_fold spells them).\n  WAF_RULES = {\n");
    for (name, needles) in edge::WAF_RULES {
        let _ = writeln!(
            out,
            "    {{ {}, {} }},",
            lua_str(name),
            str_list(needles.iter().copied())
        );
    }
    out.push_str("  },\n");
    out.push_str("  -- The reason of a strict WAF's refusal, by its first matching rule.\n  WAF_REASON = {\n");
    let rules = std::iter::once(edge::WAF_BAD_METHOD).chain(edge::WAF_RULES.iter().map(|r| r.0));
    for rule in rules {
        let _ = writeln!(
            out,
            "    [{}] = {},",
            lua_str(rule),
            lua_str(edge::reason::waf(rule))
        );
    }
    out.push_str("  },\n");
    let _ = writeln!(
        out,
        "  -- Extensions hotlink protection applies to.\n  HOTLINK_EXT = {},",
        str_list(edge::HOTLINK_EXTENSIONS)
    );
    let _ = writeln!(
        out,
        "  -- rate_mode limits: requests per second, burst.\n  RATE = {{ normal = {{ {}, {} }}, strict = {{ {}, {} }} }},",
        edge::RATE_NORMAL.0,
        edge::RATE_NORMAL.1,
        edge::RATE_STRICT.0,
        edge::RATE_STRICT.1
    );
    let statuses: Vec<String> = edge::REDIRECT_STATUSES.iter().map(u16::to_string).collect();
    let _ = writeln!(
        out,
        "  -- The statuses an edge rule may redirect with.\n  REDIRECT_STATUSES = {{ {} }},",
        statuses.join(", ")
    );
    let _ = writeln!(
        out,
        "  -- Seconds a response the origin gives no freshness for is cached.\n  DEFAULT_TTL = {},",
        edge::DEFAULT_TTL_SECS
    );
    let _ = writeln!(
        out,
        "  -- Request body limits (bytes): a site's default max_body_size, and\n  \
         -- the ceiling (nginx's client_max_body_size; a document above it is bad).\n  \
         DEFAULT_MAX_BODY_SIZE = {},\n  MAX_BODY_SIZE_CEILING = {},",
        edge::DEFAULT_MAX_BODY_SIZE,
        edge::MAX_BODY_SIZE_CEILING
    );
    let _ = writeln!(
        out,
        "  -- The most origins a site has (origin and its fallback_origins).\n  MAX_ORIGINS = {},",
        site::MAX_ORIGINS
    );
    let _ = writeln!(
        out,
        "  -- The challenge: its cookie, the proof of work's zero bits, the longest\n  \
         -- expiry and counter (decimal digits) a clearance may carry.\n  \
         CLEARANCE_COOKIE = {},\n  CHALLENGE_BITS = {},\n  MAX_EXPIRY_DIGITS = {},\n  MAX_COUNTER_DIGITS = {},",
        lua_str(edge::CLEARANCE_COOKIE),
        edge::CHALLENGE_BITS,
        edge::MAX_EXPIRY_DIGITS,
        edge::MAX_COUNTER_DIGITS
    );
    let _ = writeln!(
        out,
        "  -- ACME HTTP-01 challenges: the path, the token's shortest and longest.\n  \
         ACME_CHALLENGE_PREFIX = {},\n  ACME_TOKEN_MIN = {},\n  ACME_TOKEN_MAX = {},",
        lua_str(edge::ACME_CHALLENGE_PREFIX),
        edge::ACME_TOKEN_MIN,
        edge::ACME_TOKEN_MAX
    );
    let _ = writeln!(
        out,
        "  -- The site document's fields and JSON types (`?`: may be absent or null).\n  \
         FIELDS = {},\n  CACHE_RULE = {},\n  EDGE_RULE = {},",
        fields(&site::all_site_fields()),
        fields(&site::CACHE_RULE_FIELDS),
        fields(&site::EDGE_RULE_FIELDS)
    );
    out.push_str("  -- X-Edgeform-Reason values (edgestate::edge::reason).\n  REASON = {\n");
    for (name, value) in edge::reason::ALL {
        let _ = writeln!(out, "    {name} = {},", lua_str(value));
    }
    out.push_str("  },\n}\n");
    out
}

/// The text of `router/lua/geo_tables.lua`.
#[must_use]
pub fn geo_tables() -> String {
    let mut out = String::from(HEADER);
    out.push_str(
        "-- The geo router's constants: edgestate::route and edgestate::routing.\n\nreturn {\n",
    );
    let _ = writeln!(
        out,
        "  -- The mean Earth radius of the haversine distance.\n  EARTH_RADIUS_KM = {:?},",
        routing::EARTH_RADIUS_KM
    );
    let _ = writeln!(
        out,
        "  -- stable_hash: FNV-1a's offset basis and prime, SplitMix64's multipliers.\n  \
         HASH_OFFSET = 0x{:x}ULL,\n  HASH_PRIME = 0x{:x}ULL,\n  HASH_MIX1 = 0x{:x}ULL,\n  HASH_MIX2 = 0x{:x}ULL,",
        route::HASH_OFFSET,
        route::HASH_PRIME,
        route::HASH_MIX1,
        route::HASH_MIX2
    );
    let _ = writeln!(
        out,
        "  -- Edges within this many km of the nearest are tied (a table without geo).\n  DEFAULT_TIE_KM = {:?},",
        routing::GeoSettings::default().tie_km
    );
    let _ = writeln!(
        out,
        "  -- Retry-After (seconds) of a 503 without an online edge.\n  RETRY_AFTER = {},",
        route::RETRY_AFTER_SECS
    );
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lua_strings_escape_what_lua_reads_specially() {
        assert_eq!(lua_str("..\\"), r#""..\\""#);
        assert_eq!(lua_str("' or \"x"), r#""' or \"x""#);
        assert_eq!(lua_str("a\nb\u{e9}"), r#""a\010b\195\169""#);
    }

    /// The committed Lua tables are what the Rust definitions generate.
    #[test]
    fn committed_lua_tables_match_the_rust_definitions() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let bless = std::env::var_os("EDGEFORM_BLESS").is_some();
        let mut stale = Vec::new();
        for (path, generated) in [
            (EDGE_TABLES_PATH, edge_tables()),
            (GEO_TABLES_PATH, geo_tables()),
            (
                EDGE_READS_PATH,
                crate::bundle::Bundle::current().to_reads_json(),
            ),
        ] {
            let file = root.join(path);
            let committed = std::fs::read_to_string(&file).unwrap_or_default();
            if committed != generated {
                if bless {
                    std::fs::write(&file, &generated).unwrap();
                } else {
                    stale.push(path);
                }
            }
        }
        assert!(
            stale.is_empty(),
            "{stale:?} differ from the Rust definitions; run \
             `EDGEFORM_BLESS=1 cargo test -p edgestate lua` and commit"
        );
    }
}
