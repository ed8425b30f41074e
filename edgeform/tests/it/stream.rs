//! A router's `stream {}` block, as `build` renders it, run by
//! a real nginx (stream module only) in front of loopback TLS listeners,
//! one per edge, each with its own self-signed certificate (CN = the
//! edge's name).
//!
//! The edges have loopback addresses (127.0.0.2…5, one shared port), which
//! the public pool leaves out; the test renders the pool with
//! `Addresses::Any` and the listeners' port (`StreamOptions`). Everything
//! else in the file (upstream, weights, `least_conn`, `max_fails`,
//! `fail_timeout`, `down`, timeouts) is what `build` writes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use compiler::compile::{Addresses, StreamOptions, nginx_stream, pool, pool_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::util::Fixture;

/// (name, loopback address, location, drained). From the router at
/// (52.0, 4.0): ~34 km → weight 10, ~685 km → 7, ~2,850 km → 4.
const EDGES: &[(&str, &str, &str, bool)] = &[
    ("edge-near", "127.0.0.2", "{lat: 52.0, lon: 4.5}", false),
    ("edge-mid", "127.0.0.3", "{lat: 52.0, lon: 14.0}", false),
    ("edge-far", "127.0.0.4", "{lat: 52.0, lon: 48.0}", false),
    ("edge-drained", "127.0.0.5", "{lat: 52.0, lon: 4.2}", true),
];

fn repo() -> Fixture {
    let mut files: Vec<(String, String)> = vec![
        ("nodes/edge-1.yaml".into(), String::new()),
        (
            "nodes/router-1.yaml".into(),
            "name: router-1\nroles: [router]\nregion: eu\n\
             location: {lat: 52.0, lon: 4.0}\naddresses: [127.0.0.1]\nloopback: true\n"
                .into(),
        ),
    ];
    for (i, (name, addr, loc, drained)) in EDGES.iter().enumerate() {
        let drain = if *drained { "drain: true\n" } else { "" };
        files.push((
            format!("nodes/{name}.yaml"),
            format!(
                "name: {name}\nroles: [edge]\nregion: eu\nlocation: {loc}\n\
                 addresses: [{addr}]\nloopback: true\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n{drain}",
                6401 + i
            ),
        ));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    Fixture::with(&refs)
}

/// A self-signed P-256 certificate with CN = `name`: (cert PEM, key PEM).
fn certificate(dir: &Path, name: &str) -> (Vec<u8>, Vec<u8>) {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .arg("-subj")
        .arg(format!("/CN={name}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (std::fs::read(cert).unwrap(), std::fs::read(key).unwrap())
}

/// One edge's TLS listener: completes the handshake itself (its own
/// certificate), writes its name, closes. Counts finished handshakes.
fn listen_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_native_tls::TlsAcceptor,
    name: &'static str,
    count: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let acceptor = Arc::new(acceptor);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                // The router speaks PROXY protocol v1 first: one line,
                // then the viewer's bytes unchanged.
                let mut tcp = tcp;
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while line.len() < 108 && !line.ends_with(b"\r\n") {
                    if tcp.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    line.push(byte[0]);
                }
                if !line.starts_with(b"PROXY TCP4 127.0.0.1 ") {
                    return;
                }
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = tls.write_all(name.as_bytes()).await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    })
}

/// One TLS connection through the router: (the name the server wrote, the
/// DER of the certificate the client saw).
async fn connect(connector: &tokio_native_tls::TlsConnector, port: u16) -> (String, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut tls = connector.connect("cdn.example.com", tcp).await.unwrap();
    let der = tls
        .get_ref()
        .peer_certificate()
        .unwrap()
        .expect("a certificate")
        .to_der()
        .unwrap();
    let mut name = String::new();
    tls.read_to_string(&mut name).await.unwrap();
    (name, der)
}

/// Chi-square of `observed` against `weights` (same order).
fn chi_square(observed: &[usize], weights: &[u32]) -> f64 {
    let n: usize = observed.iter().sum();
    let w: u32 = weights.iter().sum();
    observed
        .iter()
        .zip(weights)
        .map(|(&o, &wi)| {
            let e = n as f64 * f64::from(wi) / f64::from(w);
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_passthrough_follows_weights_and_skips_down_edges() {
    let f = repo();
    let checked = f.check();
    let config = checked.config.as_ref().expect("valid");
    // The public pool leaves loopback out: empty, and `check` says so.
    assert!(
        checked
            .diagnostics
            .iter()
            .any(|d| d.code == "router-pool-empty"),
        "{:#?}",
        checked.diagnostics
    );
    let router = config.nodes.iter().find(|n| n.name == "router-1").unwrap();
    assert!(pool(config, router).is_empty());
    let public = nginx_stream(config, router, &[], &StreamOptions::default());
    assert!(!public.contains("stream {"), "{public}");

    let members = pool_with(config, router, Addresses::Any);
    let weights: BTreeMap<&str, (u32, bool)> = members
        .iter()
        .map(|m| (m.node.as_str(), (m.weight, m.down)))
        .collect();
    assert_eq!(weights["edge-near"], (10, false));
    assert_eq!(weights["edge-mid"], (7, false));
    assert_eq!(weights["edge-far"], (4, false));
    assert_eq!(weights["edge-drained"], (10, true));

    // The edges: one TLS listener each, on one port.
    let certs = tempfile::tempdir().unwrap();
    let port = harness::free_port();
    let mut by_der: BTreeMap<Vec<u8>, &str> = BTreeMap::new();
    let mut counts: BTreeMap<&str, Arc<AtomicUsize>> = BTreeMap::new();
    let mut tasks = BTreeMap::new();
    for (name, addr, _, _) in EDGES {
        let (cert, key) = certificate(certs.path(), name);
        let der = native_tls::Certificate::from_pem(&cert)
            .unwrap()
            .to_der()
            .unwrap();
        by_der.insert(der, name);
        let identity = native_tls::Identity::from_pkcs8(&cert, &key).unwrap();
        let acceptor =
            tokio_native_tls::TlsAcceptor::from(native_tls::TlsAcceptor::new(identity).unwrap());
        let listener = tokio::net::TcpListener::bind((*addr, port)).await.unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        counts.insert(name, count.clone());
        tasks.insert(*name, listen_tls(listener, acceptor, name, count));
    }

    let options = StreamOptions {
        listen: String::new(),
        edge_port: Some(port),
    };
    let nginx = harness::nginx::stream(|listen| {
        let o = StreamOptions {
            listen: listen.to_owned(),
            ..options.clone()
        };
        nginx_stream(config, router, &members, &o)
    });
    let conf = std::fs::read_to_string(nginx.process.dir.path().join("router.nginx.conf")).unwrap();
    assert!(
        conf.contains("least_conn;") && conf.contains(" down;"),
        "{conf}"
    );
    let proxy = nginx.process.port;
    let connector = tokio_native_tls::TlsConnector::from(
        native_tls::TlsConnector::builder()
            .danger_accept_invalid_certs(true)
            .danger_accept_invalid_hostnames(true)
            .build()
            .unwrap(),
    );

    // Phase 1: 1,000 connections, every edge up.
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..1000 {
        let (name, der) = connect(&connector, proxy).await;
        let cert_of = by_der
            .get(&der)
            .copied()
            .expect("an edge's own certificate");
        // Not terminated: the certificate is the one of the edge that answered.
        assert_eq!(cert_of, name);
        *seen.entry(cert_of).or_default() += 1;
    }
    let got = |m: &BTreeMap<&str, usize>, n: &str| m.get(n).copied().unwrap_or(0);
    let observed = [
        got(&seen, "edge-near"),
        got(&seen, "edge-mid"),
        got(&seen, "edge-far"),
    ];
    let chi = chi_square(&observed, &[10, 7, 4]);
    eprintln!("phase 1 (weights 10/7/4, expected 476/333/190): {seen:?}, chi-square {chi:.3}");
    assert_eq!(got(&seen, "edge-drained"), 0, "{seen:?}");
    // df = 2, p = 0.001.
    assert!(chi < 13.816, "{seen:?} chi-square {chi}");
    for (name, n) in &seen {
        assert_eq!(
            counts[name].load(Ordering::SeqCst),
            *n,
            "{name}: server and client agree"
        );
    }

    // Phase 2: edge-near's listener stops; it receives nothing more and
    // every connection still succeeds (nginx tries the next edge).
    let task = tasks.remove("edge-near").unwrap();
    task.abort();
    let _ = task.await;
    let before = counts["edge-near"].load(Ordering::SeqCst);
    let mut after: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..300 {
        let (name, der) = connect(&connector, proxy).await;
        assert_eq!(by_der[&der], name);
        *after.entry(by_der[&der]).or_default() += 1;
    }
    eprintln!("phase 2 (edge-near down): {after:?}");
    assert_eq!(got(&after, "edge-near"), 0, "{after:?}");
    assert_eq!(got(&after, "edge-drained"), 0, "{after:?}");
    assert_eq!(counts["edge-near"].load(Ordering::SeqCst), before);
    assert_eq!(after.values().sum::<usize>(), 300);
    let chi = chi_square(&[got(&after, "edge-mid"), got(&after, "edge-far")], &[7, 4]);
    assert!(chi < 10.828, "{after:?} chi-square {chi}"); // df = 1, p = 0.001
    drop(nginx);
}
