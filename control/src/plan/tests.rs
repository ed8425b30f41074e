use super::*;
use crate::state::{Desired, Manifest, Summary, content_hash, legacy_hash};

fn desired(keys: &[(&str, &str)], is_edge: bool) -> Desired {
    Desired::of_pairs(keys, is_edge)
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
    // Adoption takes over an unknown live commit, and nothing else.
    let adopt = Overrides { adopt: true, ..ok };
    assert!(allowed("x", &d, &l, &c, Ancestry::Unknown, t, adopt).is_ok());
    assert!(matches!(
        allowed("x", &d, &l, &c, Ancestry::Older, t, adopt),
        Err(Refusal::Rollback { .. })
    ));
    assert!(matches!(
        allowed("x", &d, &l, &c, Ancestry::Diverged, t, adopt),
        Err(Refusal::Diverged { .. })
    ));
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

// Plan reads only the buckets that differ
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

// A format-1 target is compared with its SHA-256 hashes
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

#[test]
fn a_share_exactly_at_the_limit_is_allowed_one_key_more_is_refused() {
    let t = Thresholds::default(); // 25 % deletes, 50 % changes, from 10 keys
    let ok = Overrides::default();
    let d = desired(&[("site:a", "1")], true);
    let l = Live {
        managed: 20,
        ..Live::default()
    };
    let removing = |n: usize| Changes {
        removed: (0..n).map(|i| format!("site:x{i}")).collect(),
        ..Changes::default()
    };
    let changing = |n: usize| Changes {
        changed: (0..n).map(|i| format!("site:x{i}")).collect(),
        ..Changes::default()
    };
    assert_eq!(
        allowed("x", &d, &l, &removing(5), Ancestry::Forward, t, ok),
        Ok(())
    );
    assert_eq!(
        allowed("x", &d, &l, &removing(6), Ancestry::Forward, t, ok),
        Err(Refusal::Deletes {
            removed: 6,
            managed: 20,
            limit: 25
        })
    );
    assert_eq!(
        allowed("x", &d, &l, &changing(10), Ancestry::Forward, t, ok),
        Ok(())
    );
    assert_eq!(
        allowed("x", &d, &l, &changing(11), Ancestry::Forward, t, ok),
        Err(Refusal::Changes {
            changed: 11,
            managed: 20,
            limit: 50
        })
    );
    // Both over: the deletes are named first.
    let both = Changes {
        removed: removing(6).removed,
        changed: changing(11).changed,
        ..Changes::default()
    };
    assert_eq!(
        allowed("x", &d, &l, &both, Ancestry::Forward, t, ok)
            .unwrap_err()
            .kind(),
        RefusalKind::Deletes
    );
    // A target with nothing managed yet has no share to exceed.
    let fresh = Live::default();
    assert_eq!(
        allowed("x", &d, &fresh, &removing(6), Ancestry::Forward, t, ok),
        Ok(())
    );
}

#[test]
fn an_unsigned_history_is_refused_whatever_the_overrides() {
    let d = desired(&[("site:a", "1")], true);
    let l = live(Manifest::new());
    let all = Overrides {
        force: true,
        allow_rollback: true,
        adopt: true,
    };
    let r = allowed(
        "x",
        &d,
        &l,
        &Changes::default(),
        Ancestry::Unsigned {
            commit: "c0ffee".into(),
            why: "unsigned",
        },
        Thresholds::default(),
        all,
    );
    assert_eq!(
        r,
        Err(Refusal::UnsignedHistory {
            commit: "c0ffee".into(),
            why: "unsigned"
        })
    );
    // Force alone passes a rollback's thresholds but not its ancestry.
    let force = Overrides {
        force: true,
        allow_rollback: false,
        adopt: false,
    };
    let r = allowed(
        "x",
        &d,
        &l,
        &Changes::default(),
        Ancestry::Diverged,
        Thresholds::default(),
        force,
    );
    assert_eq!(r.unwrap_err().kind(), RefusalKind::Diverged);
}

#[test]
fn every_refusal_names_its_kind_and_the_way_past_it() {
    let cases = [
        (
            Refusal::Rollback {
                live: "l".into(),
                desired: "d".into(),
            },
            "rollback",
            "--allow-rollback",
        ),
        (
            Refusal::UnknownLive { live: "l".into() },
            "unknown-live",
            "--allow-rollback",
        ),
        (Refusal::Empty, "empty", "--force"),
        (
            Refusal::Deletes {
                removed: 6,
                managed: 20,
                limit: 25,
            },
            "deletes",
            "--force",
        ),
        (
            Refusal::Changes {
                changed: 11,
                managed: 20,
                limit: 50,
            },
            "changes",
            "--force",
        ),
        (
            Refusal::Frozen {
                window: "w".into(),
                until: "2026-12-26T06:00:00Z".into(),
            },
            "frozen",
            "--break-glass",
        ),
        (
            Refusal::Diverged {
                live: "l".into(),
                desired: "d".into(),
            },
            "diverged",
            "--allow-rollback",
        ),
    ];
    for (refusal, kind, way) in cases {
        assert_eq!(refusal.kind().as_str(), kind);
        assert_eq!(
            serde_json::to_string(&refusal.kind()).unwrap(),
            format!("\"{kind}\"")
        );
        assert!(refusal.to_string().contains(way), "{refusal}");
    }
    let unsigned = Refusal::UnsignedHistory {
        commit: "c0ffee".into(),
        why: "no signature",
    };
    assert_eq!(unsigned.kind().as_str(), "unsigned-history");
    assert!(unsigned.to_string().contains("commit c0ffee"));
    assert!(unsigned.to_string().contains("(no signature)"));
    assert_eq!(
        Refusal::Deletes {
            removed: 6,
            managed: 20,
            limit: 25
        }
        .to_string(),
        "refusing to delete 6 of 20 managed keys (more than 25 %; use --force)"
    );
}

#[test]
fn against_an_empty_target_every_desired_key_is_added_and_nothing_removed() {
    let d = desired(&[("site:a", "1"), ("suspended:a", "1")], true);
    let c = changes(&d, &Manifest::new());
    assert_eq!(c.added, ["edgeform:routing", "site:a", "suspended:a"]);
    assert!(c.changed.is_empty() && c.removed.is_empty());
    assert_eq!(c.count(), 3);
    assert!(!c.is_empty());
}

#[test]
fn the_managed_count_sums_well_formed_bucket_values_only() {
    let live = [
        Some("00ff 3".to_owned()),
        None,
        Some("abcd 12".to_owned()),
        Some("no-count".to_owned()),
        Some("abcd x".to_owned()),
        Some("abcd -1".to_owned()),
    ];
    assert_eq!(managed_count(&live), 15);
    assert_eq!(managed_count(&[]), 0);
}
