//! The manifest's layout (format 3) against a real redis-server (started
//! by the shared harness): a one-site change rewrites one bucket's string,
//! a bucket that is not whole records is a typed error for a plan, and a
//! key the manifest cannot record is refused before anything is written.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;

use crate::apply::{self, Outcome};
use crate::gate::{Action, Relation};
use crate::plan::Ancestry;
use crate::state::{Desired, NulInKey};
use crate::test_support::con;
use edgestate::keys;
use edgestate::manifest::BucketError;

async fn apply(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    commit: &str,
) -> anyhow::Result<Outcome> {
    let relate = |_: Option<&str>| Relation::from(Ancestry::Forward);
    apply::apply(
        con,
        desired,
        &crate::test_support::options(commit, Action::Apply),
        None,
        &relate,
    )
    .await
}

/// `n` sites, site `changed` (if any) with another value.
fn sites(n: usize, changed: Option<usize>) -> Desired {
    let pairs: Vec<(String, String)> = (0..n)
        .map(|i| {
            let v = if Some(i) == changed {
                "{\"v\":2}"
            } else {
                "{}"
            };
            (format!("site:s{i:05}.example.com"), v.to_owned())
        })
        .collect();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
    Desired::of_pairs(&refs, true)
}

/// Calls per command since the last `CONFIG RESETSTAT`.
async fn calls(con: &mut MultiplexedConnection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), n))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_site_change_rewrites_its_bucket_string_alone() {
    let r = harness::redis(&[]);
    let mut c = con(r.port).await;
    let all = sites(3000, None);
    apply(&mut c, &all, "c1").await.unwrap();
    let changed = sites(3000, Some(1234));
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut c)
        .await
        .unwrap();
    let out = apply(&mut c, &changed, "c2").await.unwrap();
    let Outcome::Applied { changes, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(changes.changed, ["site:s01234.example.com"]);
    let n = calls(&mut c).await;
    // The document (MSET), its bucket's whole string (one SET), and the
    // digests and meta (HSET): nothing per entry of the manifest.
    assert_eq!(n.get("mset"), Some(&1), "{n:?}");
    assert_eq!(n.get("set"), Some(&2), "the lock and one bucket: {n:?}");
    assert_eq!(n.get("hset"), Some(&2), "{n:?}");
    // What it wrote is the desired bucket's string.
    let b = keys::bucket(b"site:s01234.example.com");
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(keys::manifest_bucket(b))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(stored, changed.bucket_string(b));
    let live = apply::read_live(&mut c, &changed).await.unwrap();
    assert_eq!(live.digest, changed.digest());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_that_is_not_whole_records_is_a_typed_error_for_a_plan() {
    let r = harness::redis(&[]);
    let mut c = con(r.port).await;
    apply(&mut c, &sites(300, None), "c1").await.unwrap();
    let bucket = keys::manifest_bucket(keys::bucket(b"site:s00007.example.com"));
    let mut s: Vec<u8> = redis::cmd("GET")
        .arg(&bucket)
        .query_async(&mut c)
        .await
        .unwrap();
    s.truncate(s.len() - 5);
    let () = redis::cmd("SET")
        .arg(&bucket)
        .arg(&s)
        .query_async(&mut c)
        .await
        .unwrap();
    // A plan of a change in that bucket reads it: a typed error naming
    // the bucket, not a panic and not a plan made of half a bucket.
    let e = apply::read_live(&mut c, &sites(300, Some(7)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.downcast_ref::<BucketError>(),
            Some(BucketError::Truncated { .. })
        ),
        "{e:#}"
    );
    assert!(format!("{e:#}").contains(&bucket), "{e:#}");
    // A bucket of another type: an error too.
    let () = redis::cmd("DEL")
        .arg(&bucket)
        .query_async(&mut c)
        .await
        .unwrap();
    let () = redis::cmd("RPUSH")
        .arg(&bucket)
        .arg("x")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(
        apply::read_live(&mut c, &sites(300, Some(7)))
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_manifest_cannot_record_is_refused_before_any_write() {
    let r = harness::redis(&[]);
    let mut c = con(r.port).await;
    let bad = Desired::of_pairs(&[("site:a.test", "{}"), ("site:b\0.test", "{}")], true);
    let e = apply(&mut c, &bad, "c1").await.unwrap_err();
    let refused = e.downcast_ref::<NulInKey>().expect("a typed refusal");
    assert_eq!(refused.key, "site:b\\u{0}.test");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}
