//! What a target holds and what it should hold, as content hashes.
//!
//! `edgeform:manifest` maps every key edgeform manages on the target to the
//! hash of its value; a no-op plan reads only that hash (and the meta), not
//! 100,000 documents. Only the heal reads full values.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use crate::compile::{Entries, Target};
use crate::model::resolved::{Node, Role};

/// Content hash of a value: the first 128 bits of SHA-256, hex.
#[must_use]
pub fn content_hash(value: &str) -> String {
    let digest = Sha256::digest(value.as_bytes());
    let mut s = String::with_capacity(32);
    for b in &digest[..16] {
        s.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        s.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    s
}

/// A manifest as read from a target: key → content hash. A hash map: a
/// plan only looks keys up, so 100,000 live entries need no sorting.
pub type Manifest = HashMap<String, String>;

/// A hash over a whole manifest, given as `(key, hash)` pairs **sorted by
/// key**, to tell a saved plan's view from now.
#[must_use]
pub fn manifest_digest<'a>(sorted: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut h = Sha256::new();
    for (k, v) in sorted {
        h.update(k.as_bytes());
        h.update(b"\0");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    let d = h.finalize();
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// What one target must hold: every key, its value and its hash (sorted).
#[derive(Debug, Clone)]
pub struct Desired {
    pub node: String,
    pub is_edge: bool,
    pub routing: Arc<str>,
    pub routing_hash: String,
    pub sites: Arc<Entries>,
    pub site_hashes: Arc<Vec<String>>,
    /// [`manifest_digest`] of this state, computed once when first asked
    /// for and shared by every target that holds the same state.
    pub digest: Arc<OnceLock<String>>,
}

impl Desired {
    /// `(key, value, hash)` for every key, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        std::iter::once((
            edgestate::keys::ROUTING,
            &*self.routing,
            self.routing_hash.as_str(),
        ))
        .chain(
            self.sites
                .iter()
                .zip(self.site_hashes.iter())
                .map(|((k, v), h)| (&**k, &**v, h.as_str())),
        )
    }

    #[must_use]
    pub fn len(&self) -> usize {
        1 + self.sites.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether `key` is one of the desired keys (binary search).
    #[must_use]
    pub fn contains(&self, key: &str) -> bool {
        key == edgestate::keys::ROUTING
            || self.sites.binary_search_by(|(k, _)| (**k).cmp(key)).is_ok()
    }

    /// The digest of the manifest this state gives (what a plan was made
    /// for); equal to a live manifest's digest exactly when they agree.
    #[must_use]
    pub fn digest(&self) -> &str {
        self.digest
            .get_or_init(|| manifest_digest(self.iter().map(|(k, _, h)| (k, h))))
    }

    /// Number of `site:` keys.
    #[must_use]
    pub fn site_count(&self) -> usize {
        self.sites
            .iter()
            .filter(|(k, _)| k.starts_with(edgestate::keys::SITE_PREFIX))
            .count()
    }
}

/// Hashes each shared value list once, and shares the digest between
/// targets that hold the same state (edges of a region).
#[derive(Default)]
pub struct HashCache {
    by_list: HashMap<usize, Arc<Vec<String>>>,
    digests: HashMap<(usize, String), Arc<OnceLock<String>>>,
}

impl HashCache {
    pub fn desired(&mut self, target: &Target, node: &Node) -> Desired {
        let ptr = Arc::as_ptr(&target.sites) as usize;
        let site_hashes = self
            .by_list
            .entry(ptr)
            .or_insert_with(|| {
                use rayon::prelude::*;
                Arc::new(
                    target
                        .sites
                        .par_iter()
                        .map(|(_, v)| content_hash(v))
                        .collect(),
                )
            })
            .clone();
        let routing_hash = content_hash(&target.routing);
        let digest = self
            .digests
            .entry((ptr, routing_hash.clone()))
            .or_default()
            .clone();
        Desired {
            node: node.name.clone(),
            is_edge: node.has(Role::Edge),
            routing_hash,
            routing: target.routing.clone(),
            sites: target.sites.clone(),
            site_hashes,
            digest,
        }
    }
}

/// `edgeform:meta` as read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    pub commit: Option<String>,
    pub generation: u64,
    pub applied_at: Option<String>,
    pub format: Option<u32>,
}

impl Meta {
    #[must_use]
    pub fn from_hash(h: &BTreeMap<String, String>) -> Meta {
        Meta {
            commit: h.get("commit").cloned(),
            generation: h
                .get("generation")
                .and_then(|g| g.parse().ok())
                .unwrap_or(0),
            applied_at: h.get("applied_at").cloned(),
            format: h.get("format").and_then(|f| f.parse().ok()),
        }
    }
}

/// What plan and apply read from a target.
#[derive(Debug, Clone, Default)]
pub struct Live {
    pub manifest: Manifest,
    pub meta: Meta,
}

impl Live {
    /// The live manifest's digest. Sorts the manifest: callers that know it
    /// equals a desired state use [`Desired::digest`] instead.
    #[must_use]
    pub fn digest(&self) -> String {
        let mut sorted: Vec<(&str, &str)> = self
            .manifest
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        sorted.sort_unstable();
        manifest_digest(sorted)
    }
}

/// RFC 3339 UTC timestamp of now, without a date library.
#[must_use]
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Seconds since the epoch → `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian).
#[must_use]
pub fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_dates() {
        assert_eq!(content_hash("abc"), "ba7816bf8f01cfea414140de5dae2223");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
