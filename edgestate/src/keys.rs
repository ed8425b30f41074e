//! Redis key names. Every key edgeform touches is spelled here once.

/// Prefix of the per-hostname site documents: `site:<host>`.
pub const SITE_PREFIX: &str = "site:";
/// Prefix of the suspension flags: `suspended:<host>` = `"1"`.
pub const SUSPENDED_PREFIX: &str = "suspended:";
/// The compiled routing table (JSON).
pub const ROUTING: &str = "edgeform:routing";
/// The manifest as a whole (format 1: one hash, managed key → content
/// hash). Format 2 splits it into [`BUCKETS`] hashes, [`manifest_bucket`];
/// format 3 makes each bucket a string of records ([`crate::manifest`]);
/// the name stays the one drift reports and old targets use.
pub const MANIFEST: &str = "edgeform:manifest";
/// Number of manifest buckets (formats 2 and 3).
pub const BUCKETS: usize = 256;
/// Hash: bucket (two hex digits) → `<digest> <count>` of that bucket's
/// manifest entries, written with them (formats 2 and 3).
pub const MANIFEST_BUCKETS: &str = "edgeform:manifest:buckets";
/// Hash: `commit`, `generation`, `applied_at`, `format`.
pub const META: &str = "edgeform:meta";
/// The apply lease lock (`SET NX PX` with an owner token).
pub const LOCK: &str = "edgeform:lock";
/// List: the target's audit trail, newest first, capped;
/// one JSON entry per write, pushed in the write's own MULTI/EXEC.
pub const HISTORY: &str = "edgeform:history";
/// Prefix of the certificate documents: `tls:<host>` (chain, key,
/// not-after, fingerprint; `edgestate::tls::TlsDoc`).
pub const TLS_PREFIX: &str = "tls:";
/// Hash: what the edge's installed code reads (`site_fields`: the
/// comma-joined document fields; `tls`: `"1"` when it serves `tls:*`),
/// written by whatever installs or starts the edge. Absent: the seed's
/// twelve fields and no `tls:*` (docs/operations.md, "Version skew").
pub const BUNDLE: &str = "edgeform:bundle";
/// Prefix of ACME HTTP-01 challenge answers: `acme:<token>` = the key
/// authorization `<token>.<thumbprint>` (a string, written with a TTL by
/// the control plane while the order lives; read by the edge on :80,
/// docs/edge.md "ACME challenges"). Not a document: no manifest entry,
/// never pruned or healed.
pub const ACME_PREFIX: &str = "acme:";
/// The value of a `suspended:<host>` key.
pub const SUSPENDED_VALUE: &str = "1";

/// The bucket of a managed key: the top byte of its 32-bit FNV-1a hash.
#[must_use]
pub fn bucket(key: &[u8]) -> u8 {
    let mut h: u32 = 0x811c_9dc5;
    for b in key {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h >> 24) as u8
}

/// `edgeform:manifest:<bb>`: the manifest entries (managed key → content
/// hash, SHA-1 hex of the value) of the keys of bucket `b`: a string of
/// records sorted by key ([`crate::manifest`], format 3); a hash of them
/// on a target written by format 2.
#[must_use]
pub fn manifest_bucket(b: u8) -> String {
    format!("{MANIFEST}:{b:02x}")
}

/// `site:<host>`.
#[must_use]
pub fn site(host: &str) -> String {
    format!("{SITE_PREFIX}{host}")
}

/// `suspended:<host>`.
#[must_use]
pub fn suspended(host: &str) -> String {
    format!("{SUSPENDED_PREFIX}{host}")
}

/// `tls:<host>`.
#[must_use]
pub fn tls(host: &str) -> String {
    format!("{TLS_PREFIX}{host}")
}

/// `acme:<token>`.
#[must_use]
pub fn acme(token: &str) -> String {
    format!("{ACME_PREFIX}{token}")
}

/// The node's purge queue, `cdn:purge:<region>:<node>` (the seed's name).
#[must_use]
pub fn purge_queue(region: &str, node: &str) -> String {
    format!("cdn:purge:{region}:{node}")
}

/// The prefixes of the documents edgeform pushes, one per host: heal
/// removes a key under them that the desired state does not have.
pub const DOCUMENT_PREFIXES: [&str; 3] = [SITE_PREFIX, SUSPENDED_PREFIX, TLS_PREFIX];

/// Whether edgeform owns a key of this name on an edge: the documents it
/// pushes. Keys outside this set (queues, locks, challenge answers,
/// anything else) are never pruned or healed.
#[must_use]
pub fn is_document(key: &str) -> bool {
    key == ROUTING || DOCUMENT_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// `edgeform:cmd:<id>`: an MQTT command the agent has taken (its result
/// once finished), so a duplicate id never runs twice — not even after a
/// restart. Written by the agent only, with a TTL.
#[must_use]
pub fn command(id: &str) -> String {
    format!("edgeform:cmd:{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(site("example.com"), "site:example.com");
        assert_eq!(acme("tok_EN-1"), "acme:tok_EN-1");
        assert!(!is_document(&acme("tok_EN-1")));
        assert_eq!(suspended("*.example.com"), "suspended:*.example.com");
        assert_eq!(purge_queue("eu", "edge-1"), "cdn:purge:eu:edge-1");
        assert!(is_document("site:a.b"));
        assert!(is_document(ROUTING));
        assert!(is_document(&tls("*.example.com")));
        assert!(!is_document(MANIFEST));
        assert_eq!(manifest_bucket(10), "edgeform:manifest:0a");
        assert_eq!(bucket(b""), 0x81);
        // Spread: 10,000 keys over 256 buckets, none empty or crowded.
        let mut n = [0u32; BUCKETS];
        for i in 0..10_000 {
            n[usize::from(bucket(site(&format!("s{i:05}.example.com")).as_bytes()))] += 1;
        }
        assert!(n.iter().all(|c| (15..80).contains(c)), "{n:?}");
        assert!(!is_document("cdn:purge:eu:edge-1"));
    }
}
