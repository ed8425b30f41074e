use std::sync::Arc;

use super::*;
use crate::state::{Desired, Manifest, Summary, content_hash, legacy_hash};

fn desired(keys: &[(&str, &str)], is_edge: bool) -> Desired {
    let sites: Vec<(Arc<str>, Arc<str>)> = keys
        .iter()
        .map(|(k, v)| (Arc::from(*k), Arc::from(*v)))
        .collect();
    Desired::for_tests(sites, is_edge)
}

fn manifest(d: &Desired) -> Manifest {
    d.iter()
        .map(|(k, _, h)| (k.to_owned(), h.to_owned()))
        .collect()
}

fn live(m: Manifest) -> Live {
    Live {
        managed: m.len(),
        manifest: m,
        ..Live::default()
    }
}

#[test]
fn changes_by_merge_walk() {
    let d = desired(&[("site:a", "1"), ("site:b", "2"), ("site:d", "4")], true);
    let mut m = manifest(&d);
    m.remove("site:a");
    m.insert("site:b".into(), content_hash("old"));
    m.insert("site:c".into(), content_hash("3"));
    m.insert("suspended:z".into(), content_hash("1"));
    let c = changes(&d, &m);
    assert_eq!(c.added, ["site:a"]);
    assert_eq!(c.changed, ["site:b"]);
    assert_eq!(c.removed, ["site:c", "suspended:z"]);
    assert!(changes(&d, &manifest(&d)).is_empty());
}

fn as_refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

fn keys(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("site:s{i:03}"), format!("v{i}")))
        .collect()
}

#[test]
fn thresholds() {
    let all = keys(20);
    let full = desired(&as_refs(&all), true);
    let l = live(manifest(&full)); // 21 managed keys with the routing table
    let t = Thresholds::default();
    let ok = Overrides::default();
    // Delete 5 of 21 (23.8 %): allowed; 6 of 21 (28.6 %): refused.
    for (drop, allowed_) in [(5, true), (6, false)] {
        let d = desired(&as_refs(&all[drop..]), true);
        let c = changes(&d, &l.manifest);
        assert_eq!(c.removed.len(), drop);
        let r = allowed("x", &d, &l, &c, Ancestry::Forward, t, ok);
        assert_eq!(r.is_ok(), allowed_, "{drop}: {r:?}");
        if !allowed_ {
            assert!(matches!(
                r,
                Err(Refusal::Deletes {
                    removed: 6,
                    managed: 21,
                    limit: 25
                })
            ));
            assert!(
                allowed(
                    "x",
                    &d,
                    &l,
                    &c,
                    Ancestry::Forward,
                    t,
                    Overrides { force: true, ..ok }
                )
                .is_ok()
            );
        }
    }
    // Change 10 of 21 (47.6 %): allowed; 11 (52.4 %): refused.
    for (n, allowed_) in [(10, true), (11, false)] {
        let changed: Vec<(String, String)> = all
            .iter()
            .enumerate()
            .map(|(i, (k, v))| (k.clone(), if i < n { format!("{v}!") } else { v.clone() }))
            .collect();
        let d = desired(&as_refs(&changed), true);
        let c = changes(&d, &l.manifest);
        assert_eq!(c.changed.len(), n);
        assert_eq!(
            allowed("x", &d, &l, &c, Ancestry::Forward, t, ok).is_ok(),
            allowed_,
            "{n}"
        );
    }
    // Below min_keys, anything goes.
    let small = desired(&as_refs(&all[..5]), true);
    let l_small = live(manifest(&small));
    let d = desired(&as_refs(&all[..1]), true);
    let c = changes(&d, &l_small.manifest);
    assert!(allowed("x", &d, &l_small, &c, Ancestry::Forward, t, ok).is_ok());
}

#[test]
fn empty_rollback_and_unknown() {
    let t = Thresholds::default();
    let ok = Overrides::default();
    let empty_edge = desired(&[], true);
    let l = live(Manifest::new());
    let c = changes(&empty_edge, &l.manifest);
    assert_eq!(
        allowed("x", &empty_edge, &l, &c, Ancestry::Forward, t, ok),
        Err(Refusal::Empty)
    );
    // A non-edge target holds only the routing table: not "empty".
    let router = desired(&[], false);
    assert!(allowed("x", &router, &l, &c, Ancestry::Forward, t, ok).is_ok());
    let d = desired(&[("site:a", "1")], true);
    let r = allowed("x", &d, &l, &c, Ancestry::Older, t, ok);
    assert!(matches!(r, Err(Refusal::Rollback { .. })));
    assert!(r.unwrap_err().to_string().contains("--allow-rollback"));
    assert!(matches!(
        allowed("x", &d, &l, &c, Ancestry::Unknown, t, ok),
        Err(Refusal::UnknownLive { .. })
    ));
    let roll = Overrides {
        allow_rollback: true,
        ..ok
    };
    assert!(allowed("x", &d, &l, &c, Ancestry::Older, t, roll).is_ok());
}

#[test]
fn desired_digest_is_the_digest_of_the_same_live_manifest() {
    let d = desired(
        &[("site:a", "1"), ("site:b", "2"), ("suspended:b", "1")],
        true,
    );
    let m = manifest(&d);
    // Any order: the digest is a XOR of entry digests.
    let of = |m: &Manifest| Summary::of(m.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    assert_eq!(d.digest(), of(&m).digest);
    let mut m2 = m.clone();
    m2.insert("site:b".into(), content_hash("old"));
    assert_ne!(d.digest(), of(&m2).digest);
    let mut m3 = m;
    m3.insert("site:c".into(), content_hash("3"));
    assert_ne!(d.digest(), of(&m3).digest);
    assert_eq!(d.summary().buckets.iter().map(|b| b.1).sum::<u32>(), 4);
}

// See: #16 (plan reads only the buckets that differ)
#[test]
fn only_differing_buckets_are_read_and_compared() {
    let all = keys(300);
    let d = desired(&as_refs(&all), true);
    let stored: Vec<Option<String>> = (0..edgestate::keys::BUCKETS)
        .map(|b| Some(d.summary().bucket_value(b)))
        .collect();
    assert!(differing_buckets(&d, &stored).is_empty());
    assert_eq!(managed_count(&stored), 301);
    // One site changed: exactly its bucket differs.
    let mut changed = all.clone();
    changed[7].1 = "new".into();
    let d2 = desired(&as_refs(&changed), true);
    let b = edgestate::keys::bucket(all[7].0.as_bytes());
    assert_eq!(differing_buckets(&d2, &stored), [b]);
    // The live manifest of that bucket only: one change, nothing else.
    let m: Manifest = manifest(&d)
        .into_iter()
        .filter(|(k, _)| edgestate::keys::bucket(k.as_bytes()) == b)
        .collect();
    let c = changes_where(
        &d2,
        &m,
        |k| edgestate::keys::bucket(k.as_bytes()) == b,
        false,
    );
    assert_eq!(c.changed, [all[7].0.clone()]);
    assert!(c.added.is_empty() && c.removed.is_empty());
    // Absent bucket values (an empty target) differ everywhere.
    assert_eq!(differing_buckets(&d, &[]).len(), 256);
}

// See: #16 (a format-1 target is compared with its SHA-256 hashes)
#[test]
fn a_format_1_manifest_is_compared_with_legacy_hashes() {
    let d = desired(&[("site:a", "1"), ("site:b", "2")], true);
    let old: Manifest = d
        .iter()
        .map(|(k, v, _)| (k.to_owned(), legacy_hash(v)))
        .collect();
    assert!(changes_where(&d, &old, |_| true, true).is_empty());
    assert_eq!(changes(&d, &old).changed.len(), 3);
}
