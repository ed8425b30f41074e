//! What a target holds and what it should hold, as content hashes.
//!
//! Format 3: the manifest (managed key → SHA-1 hex of its value) is
//! split into 256 buckets `edgeform:manifest:<bb>` by [`keys::bucket`],
//! each a string of records sorted by key ([`edgestate::manifest`]);
//! `edgeform:manifest:buckets` holds each bucket's digest and count and
//! the meta the whole manifest's digest, all written in the transaction
//! that writes the documents. A no-op plan reads the meta; a change reads
//! the 256 bucket digests and only the buckets that differ. SHA-1 because
//! Redis's Lua has it (`redis.sha1hex`): heal compares values with the
//! manifest inside the edge's Redis. Format 2 stored each bucket as a
//! hash (read, then rewritten whole as strings by the next write).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use edgestate::keys;
use sha1::Sha1;
use sha2::{Digest, Sha256};

use compiler::compile::{Entries, Target};
use compiler::model::resolved::{Node, Role};

/// Content hash of a value: SHA-1, hex (what `redis.sha1hex` gives).
#[must_use]
pub fn content_hash(value: &str) -> String {
    // RustCrypto's SHA-1 uses the CPU's SHA extensions where it has them:
    // the full apply of 100,000 sites hashes about 100 MB of documents.
    edgestate::hex(&Sha1::digest(value.as_bytes()))
}

/// Format 1's content hash: the first 128 bits of SHA-256, hex. Read only
/// to migrate a target written by format 1.
#[must_use]
pub fn legacy_hash(value: &str) -> String {
    let digest = Sha256::digest(value.as_bytes());
    edgestate::hex(&digest[..16])
}

/// A manifest as read from a target: key → content hash. A hash map: a
/// plan only looks keys up, so 100,000 live entries need no sorting.
pub type Manifest = HashMap<String, String>;

/// The digest of one manifest entry: the first 128 bits of
/// SHA-1(key ‖ 0 ‖ hash). A bucket's digest is the XOR of its entries'
/// (order-independent, so Lua can compute it from HGETALL in any order).
#[must_use]
pub fn entry_digest(key: &[u8], hash: &[u8]) -> u128 {
    let mut h = Sha1::new();
    h.update(key);
    h.update(b"\0");
    h.update(hash);
    let d = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&d[..16]);
    u128::from_be_bytes(first)
}

/// Digest and entry count of each bucket, and of the whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub buckets: Vec<(u128, u32)>,
    pub digest: String,
}

impl Summary {
    /// Summarise `(key, hash)` pairs (any order).
    pub fn of<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Summary {
        let mut buckets = vec![(0u128, 0u32); keys::BUCKETS];
        for (k, h) in entries {
            let b = &mut buckets[usize::from(keys::bucket(k.as_bytes()))];
            b.0 ^= entry_digest(k.as_bytes(), h.as_bytes());
            b.1 += 1;
        }
        let all = buckets.iter().fold(0u128, |a, b| a ^ b.0);
        Summary {
            buckets,
            digest: hex128(all),
        }
    }

    /// Add one entry.
    pub fn add(&mut self, key: &str, hash: &str) {
        let d = entry_digest(key.as_bytes(), hash.as_bytes());
        let b = &mut self.buckets[usize::from(keys::bucket(key.as_bytes()))];
        b.0 ^= d;
        b.1 += 1;
        let all = u128::from_str_radix(&self.digest, 16).unwrap_or(0) ^ d;
        self.digest = hex128(all);
    }

    /// The `edgeform:manifest:buckets` field value of bucket `b`.
    #[must_use]
    pub fn bucket_value(&self, b: usize) -> String {
        let (d, n) = self.buckets[b];
        bucket_value(d, n)
    }
}

/// `<digest hex> <count>`, as stored per bucket.
#[must_use]
pub fn bucket_value(digest: u128, count: u32) -> String {
    format!("{} {count}", hex128(digest))
}

#[must_use]
pub fn hex128(v: u128) -> String {
    format!("{v:032x}")
}

/// A hash over a whole format-1 manifest, given as `(key, hash)` pairs
/// **sorted by key**: what a saved plan recorded for a format-1 target.
#[must_use]
pub fn legacy_digest<'a>(sorted: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
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
    /// The [`Summary`] of this state's manifest, computed once when first
    /// asked for and shared by every target that holds the same state.
    pub summary: Arc<OnceLock<Summary>>,
    /// The [`Summary`] of the site entries alone, shared by every target
    /// that holds the same site list (whatever its routing table).
    pub sites_summary: Arc<OnceLock<Summary>>,
    /// What the documents use beyond the seed (optional fields, `tls:`
    /// keys), found once and shared by every target of the same list.
    pub uses: Arc<OnceLock<edgestate::bundle::Uses>>,
    /// The site entries of each manifest bucket, built once and shared by
    /// every target that holds the same site list: a write renders a
    /// bucket's string from it ([`Desired::bucket_string`]).
    pub buckets: Arc<OnceLock<BucketIndex>>,
}

/// The site entries of each manifest bucket, in key order (indices into
/// [`Desired::sites`]), and the first key the manifest cannot record.
#[derive(Debug, Clone, Default)]
pub struct BucketIndex {
    /// `order[starts[b]..starts[b + 1]]` are bucket `b`'s sites.
    starts: Vec<u32>,
    order: Vec<u32>,
    /// The first site key holding a NUL byte (a record's key ends at its
    /// NUL), if any.
    nul_key: Option<u32>,
}

impl BucketIndex {
    fn of(sites: &Entries) -> BucketIndex {
        let mut counts = vec![0u32; keys::BUCKETS + 1];
        let mut bucket_of = Vec::with_capacity(sites.len());
        let mut nul_key = None;
        for (i, (k, _)) in sites.iter().enumerate() {
            let b = usize::from(keys::bucket(k.as_bytes()));
            bucket_of.push(b);
            counts[b + 1] += 1;
            if nul_key.is_none() && k.as_bytes().contains(&0) {
                nul_key = u32::try_from(i).ok();
            }
        }
        for b in 0..keys::BUCKETS {
            counts[b + 1] += counts[b];
        }
        let mut next = counts.clone();
        let mut order = vec![0u32; sites.len()];
        // A stable counting sort: each bucket keeps the sites' key order.
        for (i, b) in bucket_of.into_iter().enumerate() {
            order[next[b] as usize] = u32::try_from(i).unwrap_or(u32::MAX);
            next[b] += 1;
        }
        BucketIndex {
            starts: counts,
            order,
            nul_key,
        }
    }

    fn sites(&self, b: u8) -> &[u32] {
        let b = usize::from(b);
        &self.order[self.starts[b] as usize..self.starts[b + 1] as usize]
    }
}

/// A desired key the manifest cannot record: it holds a NUL byte, which
/// ends a record's key (format 3). Nothing is written to any target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NulInKey {
    /// The key, escaped (`edgestate::untrusted::preview`).
    pub key: String,
}

impl std::fmt::Display for NulInKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the managed key {} holds a NUL byte, which the manifest cannot record; nothing written",
            self.key
        )
    }
}

impl std::error::Error for NulInKey {}

#[cfg(test)]
impl Desired {
    /// A desired state holding `sites` (sorted `(key, value)` pairs) and
    /// the routing table `{}`, for tests.
    pub(crate) fn for_tests(sites: Entries, is_edge: bool) -> Desired {
        let hashes = sites.iter().map(|(_, v)| content_hash(v)).collect();
        Desired {
            node: "e".into(),
            is_edge,
            routing: "{}".into(),
            routing_hash: content_hash("{}"),
            sites: Arc::new(sites),
            site_hashes: Arc::new(hashes),
            summary: Arc::default(),
            sites_summary: Arc::default(),
            uses: Arc::default(),
            buckets: Arc::default(),
        }
    }

    /// [`Desired::for_tests`] of `(key, value)` pairs, sorted here.
    pub(crate) fn of_pairs(pairs: &[(&str, &str)], is_edge: bool) -> Desired {
        let mut sites: Entries = pairs
            .iter()
            .map(|(k, v)| (Arc::from(*k), Arc::from(*v)))
            .collect();
        sites.sort();
        Desired::for_tests(sites, is_edge)
    }
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
        &self.summary().digest
    }

    /// Per-bucket digests and counts of this state's manifest.
    #[must_use]
    pub fn summary(&self) -> &Summary {
        self.summary.get_or_init(|| {
            let sites = self.sites_summary.get_or_init(|| {
                Summary::of(
                    self.sites
                        .iter()
                        .zip(self.site_hashes.iter())
                        .map(|((k, _), h)| (&**k, h.as_str())),
                )
            });
            let mut all = sites.clone();
            all.add(keys::ROUTING, &self.routing_hash);
            all
        })
    }

    /// The value of a desired key (binary search).
    #[must_use]
    pub fn value(&self, key: &[u8]) -> Option<&str> {
        if key == keys::ROUTING.as_bytes() {
            return Some(&self.routing);
        }
        let i = self
            .sites
            .binary_search_by(|(k, _)| k.as_bytes().cmp(key))
            .ok()?;
        Some(&self.sites[i].1)
    }

    fn bucket_index(&self) -> &BucketIndex {
        self.buckets.get_or_init(|| BucketIndex::of(&self.sites))
    }

    /// Whether every desired key can be recorded in the manifest (none
    /// holds a NUL byte). Checked once per site list.
    ///
    /// # Errors
    /// [`NulInKey`] naming the first key that cannot.
    pub fn check_keys(&self) -> Result<(), NulInKey> {
        match self.bucket_index().nul_key {
            None => Ok(()),
            Some(i) => {
                let k = self.sites[i as usize].0.as_bytes();
                Err(NulInKey {
                    key: edgestate::untrusted::preview(k, k.len()),
                })
            }
        }
    }

    /// The string of manifest bucket `b` (format 3): its desired entries'
    /// records, sorted by key ([`edgestate::manifest`]). Empty when the
    /// bucket has no entry.
    #[must_use]
    pub fn bucket_string(&self, b: u8) -> Vec<u8> {
        let sites = self.bucket_index().sites(b);
        let routing = keys::bucket(keys::ROUTING.as_bytes()) == b;
        let mut size: usize = sites
            .iter()
            .map(|&i| edgestate::manifest::record_len(self.sites[i as usize].0.as_bytes()))
            .sum();
        if routing {
            size += edgestate::manifest::record_len(keys::ROUTING.as_bytes());
        }
        let mut out = Vec::with_capacity(size);
        // The routing table's key sorts before every `site:`/`suspended:`
        // key: it comes first in its bucket.
        if routing {
            edgestate::manifest::push_record(
                &mut out,
                keys::ROUTING.as_bytes(),
                self.routing_hash.as_bytes(),
            );
        }
        for &i in sites {
            let i = i as usize;
            edgestate::manifest::push_record(
                &mut out,
                self.sites[i].0.as_bytes(),
                self.site_hashes[i].as_bytes(),
            );
        }
        out
    }

    /// What the documents use beyond the seed (computed once).
    #[must_use]
    pub fn uses(&self) -> &edgestate::bundle::Uses {
        self.uses.get_or_init(|| {
            use rayon::prelude::*;
            // A scan of every document's text: in parallel (it sits on an
            // apply's path between reading the target and writing it),
            // merged in order, so the first document of each field is
            // the one named.
            self.sites
                .par_chunks(4096)
                .map(|chunk| edgestate::bundle::Uses::of(chunk.iter().map(|(k, v)| (&**k, &**v))))
                .reduce(edgestate::bundle::Uses::default, |mut earlier, later| {
                    earlier.merge(later);
                    earlier
                })
        })
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
    sites_summaries: HashMap<usize, Arc<OnceLock<Summary>>>,
    digests: HashMap<(usize, String), Arc<OnceLock<Summary>>>,
    uses: HashMap<usize, Arc<OnceLock<edgestate::bundle::Uses>>>,
    buckets: HashMap<usize, Arc<OnceLock<BucketIndex>>>,
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
        let summary = self
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
            summary,
            sites_summary: self.sites_summaries.entry(ptr).or_default().clone(),
            uses: self.uses.entry(ptr).or_default().clone(),
            buckets: self.buckets.entry(ptr).or_default().clone(),
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
    /// Formats 2 and 3: the manifest's digest ([`Summary::digest`]).
    pub manifest_digest: Option<String>,
}

impl Meta {
    #[must_use]
    pub fn from_hash(h: &BTreeMap<String, String>) -> Meta {
        // The edge's text, shown in plans, refusals and logs: escaped (a
        // real commit id or time has no control character to escape).
        let text = |f: &str| h.get(f).map(|v| edgestate::untrusted::escape(v));
        Meta {
            commit: text("commit"),
            generation: h
                .get("generation")
                .and_then(|g| g.parse().ok())
                .unwrap_or(0),
            applied_at: text("applied_at"),
            format: h.get("format").and_then(|f| f.parse().ok()),
            manifest_digest: h.get("manifest_digest").cloned(),
        }
    }
}

/// What plan and apply read from a target.
#[derive(Debug, Clone)]
pub struct Live {
    /// The live manifest entries that were read: all of them on a format-1
    /// target, only the buckets that differ from the desired on format 2.
    pub manifest: Manifest,
    pub meta: Meta,
    /// How many keys the live manifest names in all (the thresholds'
    /// base), counted whether or not they were read.
    pub managed: usize,
    /// The live manifest's digest (the stale-plan check compares it).
    pub digest: String,
    /// A format-1 target (one `edgeform:manifest` hash, SHA-256 hashes):
    /// the next apply rewrites its manifest in format 3.
    pub legacy: bool,
    /// A format-2 target (each bucket a hash): the next write rewrites
    /// its manifest whole, each bucket a string (format 3).
    pub hash_buckets: bool,
    /// Formats 2 and 3: the buckets whose manifest was read (they differ).
    pub read_buckets: Vec<u8>,
    /// What the edge's installed code reads (`edgeform:bundle`; absent:
    /// the seed's fields).
    pub bundle: edgestate::bundle::Bundle,
}

impl Default for Live {
    fn default() -> Live {
        Live {
            manifest: Manifest::default(),
            meta: Meta::default(),
            managed: 0,
            digest: String::new(),
            legacy: false,
            hash_buckets: false,
            read_buckets: Vec::new(),
            bundle: edgestate::bundle::Bundle::seed(),
        }
    }
}

impl Live {
    /// Whether the next write rewrites the whole manifest in format 3 (a
    /// format-1 or format-2 target).
    #[must_use]
    pub fn rewrites_manifest(&self) -> bool {
        self.legacy || self.hash_buckets
    }

    /// A format-1 target's state from its whole manifest.
    #[must_use]
    pub fn legacy(manifest: Manifest, meta: Meta) -> Live {
        let mut sorted: Vec<(&str, &str)> = manifest
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        sorted.sort_unstable();
        let digest = legacy_digest(sorted);
        Live {
            managed: manifest.len(),
            manifest,
            meta,
            digest,
            legacy: true,
            hash_buckets: false,
            read_buckets: Vec::new(),
            bundle: edgestate::bundle::Bundle::seed(),
        }
    }
}

/// The longest value read of a field of an edge's `edgeform:meta` or
/// `edgeform:bundle` (each is a few dozen bytes to a few KiB): one
/// longer is cut there on the edge's side, so a planted 500 MB field
/// never crosses the wire.
pub const EDGE_FIELD_MAX: usize = 64 * 1024;

/// `HGETALL key` with each value cut one byte past `cap` on the server (a
/// script: the control ACL allows `EVAL`); the reply has HGETALL's shape.
#[must_use]
pub fn hgetall_capped(key: &str, cap: usize) -> redis::Cmd {
    let mut c = redis::cmd("EVAL");
    c.arg(crate::store::HASH_CAPPED).arg(1).arg(key).arg(cap);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes() {
        assert_eq!(
            content_hash("abc"),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        // FIPS 180's two-block vector, and a million bytes.
        assert_eq!(
            content_hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        assert_eq!(
            content_hash(&"a".repeat(1_000_000)),
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
        );
        assert_eq!(legacy_hash("abc"), "ba7816bf8f01cfea414140de5dae2223");
    }

    #[test]
    fn each_bucket_string_holds_its_entries_sorted_and_agrees_with_the_summary() {
        let pairs: Vec<(String, String)> = (0..3000)
            .map(|i| (format!("site:s{i:05}.example.com"), format!("v{i}")))
            .chain((0..50).map(|i| (format!("suspended:s{i:05}.example.com"), "1".into())))
            .collect();
        let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
        let d = Desired::of_pairs(&refs, true);
        let summary = d.summary().clone();
        let mut seen = 0;
        for b in 0..=u8::MAX {
            let string = d.bucket_string(b);
            let records = edgestate::manifest::parse(&string).unwrap();
            assert!(records.windows(2).all(|w| w[0].0 < w[1].0), "{b}: sorted");
            let mut digest = 0u128;
            for (k, h) in &records {
                assert_eq!(keys::bucket(k), b);
                let key = std::str::from_utf8(k).unwrap();
                assert_eq!(*h, content_hash(d.value(k).unwrap()).as_bytes(), "{key}");
                digest ^= entry_digest(k, h);
            }
            let count = u32::try_from(records.len()).unwrap();
            assert_eq!(summary.buckets[usize::from(b)], (digest, count), "{b}");
            seen += records.len();
        }
        // Every entry once, the routing table's among them.
        assert_eq!(seen, d.len());
        let routing = d.bucket_string(keys::bucket(keys::ROUTING.as_bytes()));
        assert!(routing.starts_with(b"edgeform:routing\0"));
        assert!(d.check_keys().is_ok());
    }

    #[test]
    fn a_key_holding_nul_is_refused_by_name() {
        let d = Desired::of_pairs(&[("site:a", "1"), ("site:b\0x", "1")], true);
        let e = d.check_keys().unwrap_err();
        assert_eq!(e.key, "site:b\\u{0}x");
        assert!(e.to_string().contains("NUL"), "{e}");
    }
}
