//! Heal's decisions over in-memory inputs: when the manifest can be
//! trusted, what a key read back says, whether a server-side walk and a
//! document count describe the desired state, and the repair made of
//! what was found. No Redis.

use super::*;
use crate::state::{content_hash, entry_digest};

const DOC: &str = r#"{"origin":"http://203.0.113.10"}"#;

/// Two sites, one suspended: `edgeform:routing` and four documents.
fn desired() -> Desired {
    Desired::of_pairs(
        &[
            ("site:a.example.com", DOC),
            ("site:b.example.com", DOC),
            ("site:c.example.com", DOC),
            ("suspended:c.example.com", "1"),
        ],
        true,
    )
}

/// The meta of a target that holds `desired`'s manifest in format 3.
fn current_meta(d: &Desired) -> Meta {
    Meta {
        commit: Some("b".into()),
        generation: 3,
        format: Some(3),
        manifest_digest: Some(d.digest().to_owned()),
        ..Meta::default()
    }
}

fn bytes(keys: &[&str]) -> Vec<Vec<u8>> {
    keys.iter().map(|k| k.as_bytes().to_vec()).collect()
}

#[test]
fn the_manifest_is_trusted_only_in_format_3_with_the_desired_digest() {
    let d = desired();
    let meta = current_meta(&d);
    assert!(manifest_is_current(&d, &meta, false));
    // A format-1 manifest still present.
    assert!(!manifest_is_current(&d, &meta, true));
    // Format 2's buckets are hashes: compared from here and rewritten.
    for format in [None, Some(1), Some(2)] {
        let m = Meta {
            format,
            ..meta.clone()
        };
        assert!(!manifest_is_current(&d, &m, false), "{format:?}");
    }
    // Another state's manifest, or none named.
    let other = Desired::of_pairs(&[("site:a.example.com", "{}")], true);
    assert!(!manifest_is_current(&other, &meta, false));
    let m = Meta {
        manifest_digest: None,
        ..meta
    };
    assert!(!manifest_is_current(&d, &m, false));
}

#[test]
fn written_documents_alone_are_compared_unless_the_meta_or_manifest_was_written() {
    let d = desired();
    let meta = current_meta(&d);
    let docs = bytes(&["site:a.example.com", "site:zzz.example.com", "other:key"]);
    assert!(keys_suffice(&d, &meta, false, &docs));
    for bookkeeping in [
        "edgeform:meta",
        "edgeform:manifest",
        "edgeform:manifest:buckets",
        "edgeform:manifest:3f",
    ] {
        let keys = bytes(&["site:a.example.com", bookkeeping]);
        assert!(!keys_suffice(&d, &meta, false, &keys), "{bookkeeping}");
    }
    // A key that only starts like the manifest is not part of it.
    assert!(keys_suffice(
        &d,
        &meta,
        false,
        &bytes(&["edgeform:manifesto"])
    ));
    // An untrusted manifest: everything is compared.
    assert!(!keys_suffice(&d, &meta, true, &docs));
}

#[test]
fn written_keys_split_into_desired_ones_to_read_back_and_strays_to_look_for() {
    let d = desired();
    let keys = bytes(&[
        "site:a.example.com",
        "edgeform:routing",
        "site:stray.example.com",
        "suspended:a.example.com",
        "other:key",
        "edgeform:lock",
    ]);
    let (wanted, strays) = sort_out(&d, &keys);
    let wanted: Vec<(&str, &str)> = wanted
        .iter()
        .map(|(k, v)| (std::str::from_utf8(k).unwrap(), *v))
        .collect();
    assert_eq!(
        wanted,
        [("site:a.example.com", DOC), ("edgeform:routing", "{}")]
    );
    assert_eq!(
        strays,
        [
            b"site:stray.example.com".as_slice(),
            b"suspended:a.example.com".as_slice()
        ]
    );
}

#[test]
fn a_key_read_back_is_missing_changed_or_in_order() {
    let want = "v1";
    assert_eq!(value_drift(None, false, want), Some(DriftKind::Missing));
    // MGET answers nil for a key of another type too: it exists.
    assert_eq!(value_drift(None, true, want), Some(DriftKind::Changed));
    assert_eq!(
        value_drift(Some(b"v2".as_slice()), false, want),
        Some(DriftKind::Changed)
    );
    assert_eq!(value_drift(Some(b"v1".as_slice()), false, want), None);
    // Bytes compared as bytes: a value that is not UTF-8 is changed.
    assert_eq!(
        value_drift(Some(b"v1\xff".as_slice()), false, want),
        Some(DriftKind::Changed)
    );
}

#[test]
fn a_walk_describes_the_desired_state_only_with_its_count_and_digest() {
    let d = desired();
    // What the server-side walk computes: the XOR of every entry's digest.
    let digest = d
        .iter()
        .map(|(k, _, h)| entry_digest(k.as_bytes(), h.as_bytes()))
        .fold(0u128, |a, b| a ^ b);
    assert!(walk_describes(&d, d.len(), digest));
    assert!(!walk_describes(&d, d.len() - 1, digest));
    assert!(!walk_describes(&d, d.len(), digest ^ 1));
    // An entry counted twice (a bucket string naming a key twice) cancels
    // out: not "healthy".
    let twice = digest ^ entry_digest(b"site:a.example.com", content_hash(DOC).as_bytes());
    assert!(!walk_describes(&d, d.len(), twice));
}

#[test]
fn a_document_count_off_by_any_key_means_unmanaged_documents() {
    let d = desired();
    // Four documents desired (the routing table is not one).
    assert!(documents_add_up(&d, &[], 4));
    assert!(!documents_add_up(&d, &[], 5));
    assert!(!documents_add_up(&d, &[], 3));
    // Missing documents are not counted present; a missing routing table
    // changes nothing.
    let missing = bytes(&["site:b.example.com", "edgeform:routing"]);
    assert!(documents_add_up(&d, &missing, 3));
    assert!(!documents_add_up(&d, &missing, 4));
    // More missing than desired (a list that cannot be): no underflow.
    let many = bytes(&["site:1", "site:2", "site:3", "site:4", "site:5"]);
    assert!(documents_add_up(&d, &many, 0));
}

#[test]
fn the_in_redis_repair_rewrites_each_drifted_key_once_and_deletes_strays() {
    let missing = bytes(&["site:b.example.com"]);
    // A key named twice by the walk: the repair writes it once.
    let changed = bytes(&["site:a.example.com", "site:a.example.com"]);
    let stray = b"site:evil\x1b[2J\xff".to_vec();
    let (drift, (changes, deletes, rewrite)) =
        in_redis_repair(&missing, &changed, vec![stray.clone()]);
    let found: Vec<(DriftKind, &str)> = drift.iter().map(|d| (d.kind, d.key.as_str())).collect();
    assert_eq!(
        found,
        [
            (DriftKind::Missing, "site:b.example.com"),
            (DriftKind::Changed, "site:a.example.com"),
            (DriftKind::Changed, "site:a.example.com"),
            (DriftKind::Unmanaged, "site:evil\\u{1b}[2J\\xff"),
        ]
    );
    assert_eq!(
        changes.changed,
        ["site:a.example.com", "site:b.example.com"]
    );
    assert!(changes.added.is_empty() && changes.removed.is_empty());
    assert_eq!(deletes, [stray]);
    assert!(!rewrite, "the manifest described the values: kept");
}

#[test]
fn a_comparison_reply_must_move_on_or_the_walk_gives_up() {
    assert!(moves_on(3, 0, 4, 0), "the next bucket");
    assert!(moves_on(3, 0, 3, 1722), "further in a split bucket");
    assert!(!moves_on(3, 1722, 3, 1722), "the same place again");
    assert!(!moves_on(3, 1722, 3, 41), "back within the bucket");
    assert!(!moves_on(3, 0, 2, 0), "backwards");
}

#[test]
fn a_manifest_with_more_entries_than_desired_cannot_describe_it() {
    let counts = [2, 5, 0];
    assert!(!overfull(&counts, 1, 5, 7, 7));
    assert!(overfull(&counts, 1, 6, 7, 7), "a stuffed split bucket");
    assert!(overfull(&counts, 0, 0, 8, 7), "more entries than desired");
    assert!(
        overfull(&counts, 9, 1, 1, 7),
        "a bucket past the desired ones"
    );
    assert!(!overfull(&counts, 9, 0, 7, 7));
}

#[test]
fn drift_is_reported_by_kind_then_key() {
    let d = |key: &str, kind| Drift {
        key: key.into(),
        kind,
    };
    let out = sorted(vec![
        d("edgeform:manifest", DriftKind::Manifest),
        d("site:z", DriftKind::Unmanaged),
        d("site:b", DriftKind::Changed),
        d("site:c", DriftKind::Missing),
        d("site:a", DriftKind::Changed),
    ]);
    let keys: Vec<&str> = out.iter().map(|d| d.key.as_str()).collect();
    assert_eq!(
        keys,
        ["site:c", "site:a", "site:b", "site:z", "edgeform:manifest"]
    );
    assert_eq!(
        serde_json::to_string(&out[3]).unwrap(),
        r#"{"key":"site:z","kind":"unmanaged"}"#
    );
    assert_eq!(DriftKind::Manifest.as_str(), "manifest");
}

#[test]
fn reply_sizes_are_counted_as_resp_bytes() {
    use redis::Value;
    // `$3\r\nabc\r\n`: 9 bytes.
    assert_eq!(resp_len(&Value::BulkString(b"abc".to_vec())), 9);
    // `:42\r\n`: 5 bytes.
    assert_eq!(resp_len(&Value::Int(42)), 5);
    assert_eq!(resp_len(&Value::SimpleString("OK".into())), 5);
    assert_eq!(
        resp_len(&Value::Array(vec![
            Value::BulkString(b"abc".to_vec()),
            Value::Int(42)
        ])),
        4 + 9 + 5
    );
    assert_eq!(resp_len(&Value::Nil), 5);
}

#[test]
fn a_document_count_reply_of_the_wrong_shape_is_an_error_never_a_panic() {
    use redis::Value::{Array, BulkString, Int, Nil};
    let cursor = |s: &str| BulkString(s.as_bytes().to_vec());
    let (c, n) = counted::<3>(Array(vec![
        cursor("12"),
        cursor("done"),
        cursor("0"),
        Int(7),
    ]))
    .unwrap();
    assert_eq!((c, n), (["12".to_owned(), "done".into(), "0".into()], 7));
    for hostile in [
        Nil,
        Int(3),
        Array(vec![]),
        Array(vec![cursor("done"), cursor("done"), Int(1)]),
        Array(vec![
            cursor("done"),
            cursor("done"),
            cursor("done"),
            cursor("done"),
            Int(1),
        ]),
        Array(vec![
            cursor("done"),
            cursor("done"),
            cursor("done"),
            Int(-1),
        ]),
        Array(vec![
            cursor("done"),
            cursor("done"),
            cursor("done"),
            Array(vec![]),
        ]),
    ] {
        assert!(counted::<3>(hostile.clone()).is_err(), "{hostile:?}");
    }
}
