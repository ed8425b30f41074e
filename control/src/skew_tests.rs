//! The version-skew gate against real redis-servers (started by the
//! shared harness): an edge whose `edgeform:bundle` declares only the
//! seed's fields refuses documents using a newer field or `tls:*`, and
//! nothing is written to it; an edge that declares them applies the same
//! state.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;

use crate::apply::{self, Outcome};
use crate::gate::{Action, Relation};
use crate::plan::{Ancestry, Refusal, RefusalKind};
use crate::state::Desired;
use crate::test_support::{con, options};
use edgestate::bundle::Bundle;

const SEED_DOC: &str = r#"{"cache_rules":[],"cached":true,"cors_mode":"off","edge_rules":[],"geo_codes":"","geo_mode":"off","hotlink_mode":"off","ip_list":"","ip_mode":"off","origin":"http://o.test","rate_mode":"off","waf_mode":"off"}"#;
const REDIRECT_DOC: &str = r#"{"cache_rules":[],"cached":true,"cors_mode":"off","edge_rules":[],"geo_codes":"","geo_mode":"off","hotlink_mode":"off","https_redirect":true,"ip_list":"","ip_mode":"off","origin":"http://o.test","rate_mode":"off","tls":"certificate:a","waf_mode":"off"}"#;

async fn declare(con: &mut MultiplexedConnection, bundle: &Bundle) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(edgestate::keys::BUNDLE);
    for (k, v) in bundle.to_hash() {
        cmd.arg(k).arg(v);
    }
    let () = cmd.query_async(con).await.unwrap();
}

async fn all_keys(con: &mut MultiplexedConnection) -> Vec<String> {
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query_async(con).await.unwrap();
    k.sort();
    k
}

async fn apply(
    con: &mut MultiplexedConnection,
    desired: &Desired,
    commit: &str,
    action: Action,
) -> anyhow::Result<Outcome> {
    let relate = |_: Option<&str>| Relation::from(Ancestry::Forward);
    apply::apply(con, desired, &options(commit, action), None, &relate).await
}

fn install_first(r: anyhow::Result<Outcome>) -> String {
    let e = r.expect_err("refused");
    let refusal = e.downcast_ref::<Refusal>().expect("a typed refusal");
    assert_eq!(refusal.kind(), RefusalKind::InstallFirst, "{refusal}");
    refusal.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_declaring_the_seed_fields_refuses_https_redirect_another_applies_it() {
    let old = harness::redis(&[]);
    let new = harness::redis(&[]);
    let (mut old_con, mut new_con) = (con(old.port).await, con(new.port).await);
    // The old edge declares nothing: the seed's twelve fields, no tls.
    declare(&mut new_con, &Bundle::current()).await;

    let seed = Desired::of_pairs(&[("site:a.test", SEED_DOC)], true);
    for c in [&mut old_con, &mut new_con] {
        let r = apply(c, &seed, "c1", Action::Apply).await.unwrap();
        assert!(matches!(r, Outcome::Applied { .. }), "{r:?}");
    }

    let redirect = Desired::of_pairs(
        &[("site:a.test", REDIRECT_DOC), ("site:b.test", SEED_DOC)],
        true,
    );
    let before = all_keys(&mut old_con).await;
    let message = install_first(apply(&mut old_con, &redirect, "c2", Action::Apply).await);
    assert!(message.starts_with("install first: e's installed code reads the seed's twelve site fields, no tls:*; this commit's site:a.test uses https_redirect, site:a.test uses tls"), "{message}");
    assert!(message.contains("edgeform install e"), "{message}");
    // Nothing written: the keys, the document and the meta as they were.
    assert_eq!(all_keys(&mut old_con).await, before);
    let doc: String = redis::cmd("GET")
        .arg("site:a.test")
        .query_async(&mut old_con)
        .await
        .unwrap();
    assert_eq!(doc, SEED_DOC);
    let meta: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg("edgeform:meta")
        .query_async(&mut old_con)
        .await
        .unwrap();
    assert_eq!(meta["commit"], "c1");

    // The edge that declares the fields takes the same state.
    let r = apply(&mut new_con, &redirect, "c2", Action::Apply)
        .await
        .unwrap();
    assert!(matches!(r, Outcome::Applied { .. }), "{r:?}");
    let doc: String = redis::cmd("GET")
        .arg("site:a.test")
        .query_async(&mut new_con)
        .await
        .unwrap();
    assert_eq!(doc, REDIRECT_DOC);

    // A heal at the new edge's commit after it was reinstalled with the
    // old code (its bundle back to the seed's): refused too, nothing sent.
    let () = redis::cmd("DEL")
        .arg(edgestate::keys::BUNDLE)
        .query_async(&mut new_con)
        .await
        .unwrap();
    let () = redis::cmd("DEL")
        .arg("site:b.test")
        .query_async(&mut new_con)
        .await
        .unwrap();
    install_first(apply(&mut new_con, &redirect, "c2", Action::Heal).await);
    let gone: Option<String> = redis::cmd("GET")
        .arg("site:b.test")
        .query_async(&mut new_con)
        .await
        .unwrap();
    assert_eq!(gone, None);

    // Certificates: an edge declaring the fields but not tls refuses tls:*.
    let mut fields_only = Bundle::current();
    fields_only.tls = false;
    declare(&mut old_con, &fields_only).await;
    let with_cert = Desired::of_pairs(&[("site:a.test", REDIRECT_DOC), ("tls:a.test", "{}")], true);
    let message = install_first(apply(&mut old_con, &with_cert, "c3", Action::Apply).await);
    assert!(
        message.contains("tls:a.test is a certificate document"),
        "{message}"
    );
    assert!(!message.contains("uses https_redirect"), "{message}");
    // Without the certificate, the same edge takes the new fields.
    let r = apply(&mut old_con, &redirect, "c3", Action::Apply)
        .await
        .unwrap();
    assert!(matches!(r, Outcome::Applied { .. }), "{r:?}");
}

/// A node whose Redis is the server on `port`.
fn node(port: u16) -> compiler::model::resolved::Node {
    compiler::model::resolved::Node {
        file: "nodes/e.yaml".into(),
        name: "e".into(),
        roles: [compiler::model::raw::Role::Edge].into(),
        region: "eu".into(),
        zone: None,
        public_url: None,
        location: None,
        addresses: Vec::new(),
        redis: Some(edgestate::target::RedisTarget::Url {
            url: format!("redis://127.0.0.1:{port}"),
            username: None,
            password_env: None,
            tls: None,
        }),
        playback_session_limit: None,
        playback_bandwidth_kbit: None,
        network_bandwidth_kbit: None,
        drain: false,
        cache: compiler::model::resolved::CacheSettings::default(),
        https: Default::default(),
    }
}

/// What `edgeform install` writes after a switch (and removes after a
/// rollback) is what apply then reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_declares_the_bundle_apply_reads_and_a_rollback_removes_it() {
    let r = harness::redis(&[]);
    let mut c = con(r.port).await;
    let redirect = Desired::of_pairs(&[("site:a.test", REDIRECT_DOC)], true);
    install_first(apply(&mut c, &redirect, "c1", Action::Apply).await);

    crate::declare_bundle(&node(r.port), Some(&Bundle::current()))
        .await
        .unwrap();
    let h: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(edgestate::keys::BUNDLE)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(Bundle::from_hash(&h), Bundle::current());
    let out = apply(&mut c, &redirect, "c1", Action::Apply).await.unwrap();
    assert!(matches!(out, Outcome::Applied { .. }), "{out:?}");

    crate::declare_bundle(&node(r.port), None).await.unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(edgestate::keys::BUNDLE)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!exists);
    let next = Desired::of_pairs(
        &[("site:a.test", REDIRECT_DOC), ("site:b.test", REDIRECT_DOC)],
        true,
    );
    install_first(apply(&mut c, &next, "c2", Action::Apply).await);
}
