//! Redis key names. Every key edgeform touches is spelled here once.

/// Prefix of the per-hostname site documents: `site:<host>`.
pub const SITE_PREFIX: &str = "site:";
/// Prefix of the suspension flags: `suspended:<host>` = `"1"`.
pub const SUSPENDED_PREFIX: &str = "suspended:";
/// The compiled routing table (JSON).
pub const ROUTING: &str = "edgeform:routing";
/// Hash: managed key → content hash, written with the documents.
pub const MANIFEST: &str = "edgeform:manifest";
/// Hash: `commit`, `generation`, `applied_at`, `format`.
pub const META: &str = "edgeform:meta";
/// The apply lease lock (`SET NX PX` with an owner token).
pub const LOCK: &str = "edgeform:lock";
/// The value of a `suspended:<host>` key.
pub const SUSPENDED_VALUE: &str = "1";

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

/// The node's purge queue, `cdn:purge:<region>:<node>` (the seed's name).
#[must_use]
pub fn purge_queue(region: &str, node: &str) -> String {
    format!("cdn:purge:{region}:{node}")
}

/// Whether edgeform owns a key of this name on an edge: the documents it
/// pushes. Keys outside this set (queues, locks, anything else) are never
/// pruned or healed.
#[must_use]
pub fn is_document(key: &str) -> bool {
    key == ROUTING || key.starts_with(SITE_PREFIX) || key.starts_with(SUSPENDED_PREFIX)
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
        assert_eq!(suspended("*.example.com"), "suspended:*.example.com");
        assert_eq!(purge_queue("eu", "edge-1"), "cdn:purge:eu:edge-1");
        assert!(is_document("site:a.b"));
        assert!(is_document(ROUTING));
        assert!(!is_document(MANIFEST));
        assert!(!is_document("cdn:purge:eu:edge-1"));
    }
}
