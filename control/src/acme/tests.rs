//! Orders against a real pebble, its challenges answered over real HTTP
//! from a real Redis by the `acme:<token>` keys this module writes.

use std::os::unix::fs::PermissionsExt;

use openssl::stack::Stack;
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::{X509, X509StoreContext};

use super::*;
use crate::store::DirStore;

fn now() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn verify(chain: &str, root: &str) {
    let certs = X509::stack_from_pem(chain.as_bytes()).unwrap();
    let mut store = X509StoreBuilder::new().unwrap();
    store
        .add_cert(X509::from_pem(root.as_bytes()).unwrap())
        .unwrap();
    let store = store.build();
    let mut rest = Stack::new().unwrap();
    for c in &certs[1..] {
        rest.push(c.clone()).unwrap();
    }
    let mut ctx = X509StoreContext::new().unwrap();
    let ok = ctx
        .init(
            &store,
            &certs[0],
            &rest,
            openssl::x509::X509StoreContextRef::verify_cert,
        )
        .unwrap();
    assert!(ok, "chain does not verify against pebble's root");
}

fn acme_keys(redis_port: u16) -> Vec<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{redis_port}")).unwrap();
    let mut c = client.get_connection().unwrap();
    redis::cmd("KEYS").arg("acme:*").query(&mut c).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pebble_issues_through_the_redis_keys_and_a_failed_order_keeps_the_old_certificate() {
    let redis = harness::redis(&[]);
    // The real edge answers the challenges from its Redis; down.test's
    // validation fails.
    let (_edge, pebble) = harness::pebble::behind_edge(redis.port);
    let d = tempfile::tempdir().unwrap();
    let store = DirStore::open(&d.path().join("state")).unwrap();
    let settings = Settings {
        directory: pebble.directory(),
        contact: vec!["mailto:ops@example.com".into()],
        ca_file: Some(pebble.tls_ca()),
        order_timeout: ORDER_LIFE,
    };
    let conn = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut sink = RedisSink {
        nodes: vec![("edge-1".into(), conn)],
    };

    // The account is made on first use, kept 0600, and reused.
    let account = account(&store, &settings).await.unwrap();
    let path = d.path().join("state/acme/account.json");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = super::account(&store, &settings).await.unwrap();
    assert_eq!(again.account.id(), account.account.id());

    // A site with aliases: one certificate naming all of them, its chain
    // verifying against pebble's root, kept in the state directory.
    let shop = Request {
        name: "shop".into(),
        hosts: vec!["shop.test".into(), "www.shop.test".into()],
    };
    let cert = issue(&account, &store, &mut sink, &shop, now())
        .await
        .unwrap();
    assert_eq!(cert.names, ["shop.test", "www.shop.test"]);
    let kept = store.certificate("shop").unwrap().unwrap();
    assert_eq!(kept.chain, cert.chain);
    verify(&kept.chain, &pebble.root());
    assert!(acme_keys(redis.port).is_empty(), "challenge keys left");

    // A site with one host.
    let blog = Request {
        name: "blog".into(),
        hosts: vec!["blog.test".into()],
    };
    let b = issue(&account, &store, &mut sink, &blog, now())
        .await
        .unwrap();
    assert_eq!(b.names, ["blog.test"]);
    verify(&b.chain, &pebble.root());

    // An order with a name nobody answers for fails naming that host with
    // the CA's problem, keeps the old certificate, and leaves no key.
    let bad = Request {
        name: "shop".into(),
        hosts: vec!["shop.test".into(), "down.test".into()],
    };
    let failures = issue(&account, &store, &mut sink, &bad, now())
        .await
        .unwrap_err();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].host, "down.test");
    assert!(failures[0].from_ca);
    assert_eq!(failures[0].retry_after, None);
    let problem: serde_json::Value = serde_json::from_str(&failures[0].problem).unwrap();
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .starts_with("urn:ietf:params:acme:error:"),
        "{problem}"
    );
    assert_eq!(store.certificate("shop").unwrap().unwrap(), kept);
    assert!(acme_keys(redis.port).is_empty(), "challenge keys left");
    // The failing host first: the CA may fail it before the next host's
    // challenge is set ready, and refuse that one with the order's
    // problem; still only the failing host is named.
    let bad_first = Request {
        name: "shop".into(),
        hosts: vec!["down.test".into(), "shop.test".into()],
    };
    let failures = issue(&account, &store, &mut sink, &bad_first, now())
        .await
        .unwrap_err();
    let hosts: Vec<&str> = failures.iter().map(|f| f.host.as_str()).collect();
    assert_eq!(hosts, ["down.test"], "{failures:?}");
    assert!(acme_keys(redis.port).is_empty(), "challenge keys left");

    // A failure does not stop the next order.
    let after = issue(&account, &store, &mut sink, &blog, now())
        .await
        .unwrap();
    assert_ne!(after.fingerprint, b.fingerprint);
}

#[test]
fn retry_after_reads_seconds_and_http_dates() {
    let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    assert_eq!(retry_after_secs("120", now), Some(120));
    assert_eq!(retry_after_secs(" 7 ", now), Some(7));
    // 2001-09-09T01:46:40Z is 1_000_000_000.
    assert_eq!(
        retry_after_secs("Sun, 09 Sep 2001 01:47:40 GMT", now),
        Some(60)
    );
    // A date already past: now.
    assert_eq!(
        retry_after_secs("Sun, 09 Sep 2001 01:00:00 GMT", now),
        Some(0)
    );
    for bad in ["", "soon", "-5", "1.5"] {
        assert_eq!(retry_after_secs(bad, now), None, "{bad}");
    }
}

#[test]
fn a_failure_shows_its_problem_and_the_wait_the_ca_asked_for() {
    let f = Failure {
        host: "shop.test".into(),
        problem: r#"{"type":"urn:ietf:params:acme:error:rateLimited"}"#.into(),
        from_ca: true,
        retry_after: Some(42),
    };
    assert_eq!(
        f.to_string(),
        r#"host shop.test got no certificate: {"type":"urn:ietf:params:acme:error:rateLimited"}; retry after 42 s"#
    );
    assert_eq!(f.local_kind(), None);
    let l = Failure::local("shop.test", LocalKind::OrderPending, "stayed pending");
    assert_eq!(l.local_kind().as_deref(), Some("order-pending"));
    assert!(!l.to_string().contains("retry after"));
}
