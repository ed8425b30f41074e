//! Shared transaction bodies against real redis-servers (started by the
//! shared harness): targets in one state share one encoding and each
//! still gets the whole desired state and its own meta; past the memory
//! cap the others encode the rest themselves; targets in different states
//! never share.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::apply::{self, Options, Outcome};
use crate::bodies::Bodies;
use crate::test_support::con;

fn options(commit: &str, bodies: &Arc<Bodies>) -> Options {
    Options {
        bodies: bodies.clone(),
        ..crate::test_support::options(commit, Action::Apply)
    }
}

use crate::gate::{Action, Relation};
use crate::plan::Ancestry;
use crate::state::Desired;

async fn apply(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    options: &Options,
) -> anyhow::Result<Outcome> {
    let relate = |_: Option<&str>| Relation::from(Ancestry::Forward);
    apply::apply(con, desired, options, None, &relate).await
}

/// `n` sites of ~`size` bytes each, site `changed` (if any) different.
fn sites(n: usize, size: usize, changed: Option<usize>) -> Desired {
    let pairs: Vec<(String, String)> = (0..n)
        .map(|i| {
            let v = format!(
                "{{\"v\":{},\"pad\":\"{}\"}}",
                u8::from(Some(i) == changed),
                "x".repeat(size)
            );
            (format!("site:s{i:05}.example.com"), v)
        })
        .collect();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (&**k, &**v)).collect();
    Desired::of_pairs(&refs, true)
}

/// Every desired value is on the server as desired, the manifest
/// describes it, and the meta names `generation`.
async fn holds(con: &mut MultiplexedConnection, desired: &Desired, generation: u64) {
    let all: Vec<(&str, &str, &str)> = desired.iter().collect();
    for batch in all.chunks(500) {
        let keys: Vec<&str> = batch.iter().map(|(k, _, _)| *k).collect();
        let got: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(con)
            .await
            .unwrap();
        for ((k, v, _), g) in batch.iter().zip(got) {
            assert_eq!(g.as_deref(), Some(*v), "{k}");
        }
    }
    let live = apply::read_live(con, desired).await.unwrap();
    assert_eq!(live.digest, desired.digest());
    assert_eq!(live.meta.generation, generation);
}

/// The shared body of an empty target, kept for the test's length: the
/// applies below find it however they are scheduled.
async fn keep_empty(
    bodies: &Bodies,
    desired: &Desired,
    commit: &str,
    port: u16,
) -> Arc<crate::bodies::Shared> {
    let live = apply::read_live(&mut con(port).await, desired)
        .await
        .unwrap();
    bodies.body(desired, &live, commit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_in_one_state_share_one_encoding_and_each_gets_its_own_meta() {
    let servers = [
        harness::redis(&[]),
        harness::redis(&[]),
        harness::redis(&[]),
    ];
    // ~6 MB: several 2 MiB chunks.
    let desired = sites(3000, 2000, None);
    let bodies = Arc::new(Bodies::default());
    let o = options("c1", &bodies);
    let _keep = keep_empty(&bodies, &desired, "c1", servers[0].port).await;
    // One target emptied at generation 4 (a meta, no document or
    // manifest): the same state read, its own generation.
    let mut third = con(servers[2].port).await;
    let () = redis::cmd("HSET")
        .arg("edgeform:meta")
        .arg("generation")
        .arg(4)
        .arg("format")
        .arg(edgestate::FORMAT_VERSION)
        .arg("manifest_digest")
        .arg(crate::state::hex128(0))
        .query_async(&mut third)
        .await
        .unwrap();
    for s in &servers {
        let out = apply(&mut con(s.port).await, &desired, &o).await.unwrap();
        assert!(matches!(out, Outcome::Applied { .. }), "{out:?}");
    }
    assert_eq!(
        bodies.counts(),
        (1, 2),
        "one encoding, two targets reused it"
    );
    holds(&mut con(servers[0].port).await, &desired, 1).await;
    holds(&mut con(servers[1].port).await, &desired, 1).await;
    holds(&mut third, &desired, 5).await;
    // Each target's own audit record.
    let history: Vec<String> = redis::cmd("LRANGE")
        .arg("edgeform:history")
        .arg(0)
        .arg(-1)
        .query_async(&mut third)
        .await
        .unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    assert!(history[0].contains("\"generation\":5"), "{history:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_memory_cap_the_others_encode_the_rest_and_write_the_same() {
    let servers = [harness::redis(&[]), harness::redis(&[])];
    let desired = sites(3000, 2000, None);
    // Room for the first chunk only (two MSETs of 1,000 ~2 KB sites:
    // ~4 MB; the rest is ~2 MB more).
    let bodies = Arc::new(Bodies::with_cap(5 << 20));
    let o = options("c1", &bodies);
    let _keep = keep_empty(&bodies, &desired, "c1", servers[0].port).await;
    for s in &servers {
        apply(&mut con(s.port).await, &desired, &o).await.unwrap();
    }
    // The second took the first chunk, then encoded the rest.
    assert_eq!(bodies.counts(), (2, 1));
    for s in &servers {
        holds(&mut con(s.port).await, &desired, 1).await;
    }
    // No room at all: the targets do not share (each encodes its own, as
    // without sharing), the same result.
    let servers = [harness::redis(&[]), harness::redis(&[])];
    let bodies = Arc::new(Bodies::with_cap(0));
    let o = options("c1", &bodies);
    let _keep = keep_empty(&bodies, &desired, "c1", servers[0].port).await;
    for s in &servers {
        apply(&mut con(s.port).await, &desired, &o).await.unwrap();
    }
    assert_eq!(bodies.counts(), (0, 0));
    for s in &servers {
        holds(&mut con(s.port).await, &desired, 1).await;
    }
}

/// The target encoding a body does so at its own pace, not its Redis's:
/// with its Redis stopped (SIGSTOP: every reply withheld), another target
/// of the same body still sends it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_target_does_not_hold_up_the_others_sharing_its_body() {
    let stalled = harness::redis(&[]);
    let healthy = harness::redis(&[]);
    let desired = Arc::new(sites(3000, 2000, None));
    let bodies = Arc::new(Bodies::default());
    let mut quiet = con(healthy.port).await;
    let live = Arc::new(apply::read_live(&mut quiet, &desired).await.unwrap());
    let shared = bodies.body(&desired, &live, "c1");
    let changes = shared.changes(|| apply::live_changes(&desired, &live));
    let mut frozen = con(stalled.port).await;
    let pid = stalled.pid().to_string();
    let signal = |s: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([s, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let encoder = {
        let (desired, live, changes, shared) = (
            desired.clone(),
            live.clone(),
            changes.clone(),
            shared.clone(),
        );
        tokio::spawn(async move {
            let make = || apply::Body::new(&desired, &changes, &live, "c1", 1).without_meta();
            shared.send(&mut frozen, make).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let () = redis::cmd("MULTI").query_async(&mut quiet).await.unwrap();
    let make = || apply::Body::new(&desired, &changes, &live, "c1", 1).without_meta();
    tokio::time::timeout(Duration::from_secs(20), shared.send(&mut quiet, make))
        .await
        .expect("sent while the encoding target's Redis is stopped")
        .unwrap();
    let _: redis::Value = redis::cmd("EXEC").query_async(&mut quiet).await.unwrap();
    assert_eq!(bodies.counts(), (1, 1));
    let first = desired.iter().nth(1).unwrap();
    let got: Option<String> = redis::cmd("GET")
        .arg(first.0)
        .query_async(&mut quiet)
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some(first.1));
    signal("-CONT");
    encoder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_in_different_states_never_share_a_body() {
    let servers = [harness::redis(&[]), harness::redis(&[])];
    let old = sites(2000, 100, Some(7));
    let new = sites(2000, 100, None);
    // The second target holds an older state: one site differs.
    let bodies = Arc::new(Bodies::default());
    apply(
        &mut con(servers[1].port).await,
        &old,
        &options("c0", &Arc::new(Bodies::default())),
    )
    .await
    .unwrap();
    let o = options("c1", &bodies);
    let _keep = keep_empty(&bodies, &new, "c1", servers[0].port).await;
    let mut changed = Vec::new();
    for s in &servers {
        let out = apply(&mut con(s.port).await, &new, &o).await.unwrap();
        let Outcome::Applied { changes, .. } = out else {
            panic!("{out:?}")
        };
        changed.push((changes.added.len(), changes.changed.clone()));
    }
    assert_eq!(bodies.counts(), (2, 0));
    assert_eq!(changed[0].0, new.len());
    assert_eq!(changed[1], (0, vec!["site:s00007.example.com".to_owned()]));
    holds(&mut con(servers[0].port).await, &new, 1).await;
    holds(&mut con(servers[1].port).await, &new, 2).await;
}
