//! `edgeform certs issue` against a real ACME CA (pebble, with its DNS
//! resolving every test name to 127.0.0.1), the challenges written to the
//! edge's real Redis as `acme:<token>` and answered by the real edge from
//! it (directly, and through the real geo router); then `apply` pushes
//! the issued certificates as `tls:<host>`.

use std::net::Ipv4Addr;

use crate::util::{Fixture, edge_1_node, edgeform_with_state as run, stderr};

fn get(con: &mut redis::Connection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query(con).unwrap()
}

#[test]
fn certs_issue_orders_each_acme_site_and_names_the_host_that_failed() {
    let r = harness::redis(&[]);
    // The real edge answers the challenges from its Redis; down.test's
    // validation fails.
    let (_edge, pebble) = harness::pebble::behind_edge(r.port);
    let f = Fixture::empty();
    f.write(
        "cluster.yaml",
        crate::util::acme_cluster_yaml(&pebble, "").as_bytes(),
    );
    f.write("nodes/edge-1.yaml", edge_1_node(r.port).as_bytes());
    f.write(
        "sites/shop.test.yaml",
        b"host: shop.test\naliases: [www.shop.test]\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.write(
        "sites/blog.test.yaml",
        b"host: blog.test\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.write(
        "sites/down.test.yaml",
        b"host: down.test\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.commit("acme sites");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");

    // Before the first `certs issue`, apply refuses the sites whose certificate is missing.
    let o = run(f.path(), &state, &["apply", "--yes"]);
    assert!(!o.status.success(), "{}", stderr(&o));

    let o = run(f.path(), &state, &["certs", "issue"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("issued certificate `acme.shop.test`"), "{err}");
    assert!(err.contains("issued certificate `acme.blog.test`"), "{err}");
    assert!(
        err.contains("error: site down.test: host down.test got no certificate: {")
            && err.contains("urn:ietf:params:acme:error:"),
        "{err}"
    );
    let kept = |name: &str| state.join("certs").join(name).join("chain.pem").exists();
    assert!(kept("acme.shop.test") && kept("acme.blog.test") && !kept("acme.down.test"));
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let left: Vec<String> = redis::cmd("KEYS").arg("acme:*").query(&mut con).unwrap();
    assert!(left.is_empty(), "challenge keys left: {left:?}");

    // `--site` orders that site alone; the others keep their certificate.
    let before = std::fs::read_to_string(state.join("certs/acme.shop.test/chain.pem")).unwrap();
    let o = run(f.path(), &state, &["certs", "issue", "--site", "blog.test"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("shop.test"), "{}", stderr(&o));
    let after = std::fs::read_to_string(state.join("certs/acme.shop.test/chain.pem")).unwrap();
    assert_eq!(before, after);

    let o = run(
        f.path(),
        &state,
        &["certs", "issue", "--site", "nosuch.test"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("`nosuch.test`"), "{}", stderr(&o));

    // Without the site nobody answers for, apply pushes the issued
    // certificates like imported ones.
    std::fs::remove_file(f.path().join("sites/down.test.yaml")).unwrap();
    f.commit("drop down.test");
    let o = run(f.path(), &state, &["apply", "--yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for host in ["shop.test", "www.shop.test", "blog.test"] {
        let doc = get(&mut con, &format!("tls:{host}")).unwrap_or_default();
        assert!(doc.contains("BEGIN CERTIFICATE"), "tls:{host}: {doc}");
    }
}

/// SHA-256 fingerprint (lowercase hex) of the first certificate in `pem`.
fn fingerprint(pem: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(pem).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.trim().rsplit('=').next().unwrap_or_default();
    hex.replace(':', "").to_ascii_lowercase()
}

/// The certificate the edge's HTTPS listener presents for `host` when
/// offered h2 by ALPN, and the protocol it chose.
fn served(https_port: u16, host: &str) -> (String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-alpn",
            "h2,http/1.1",
            "-servername",
            host,
            "-connect",
        ])
        .arg(format!("127.0.0.1:{https_port}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(b"");
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let alpn = text
        .lines()
        .find_map(|l| l.strip_prefix("ALPN protocol: "))
        .unwrap_or("none")
        .to_owned();
    (fingerprint(text.as_bytes()), alpn)
}

/// End to end through the real components: pebble validates every
/// HTTP-01 challenge on the real geo router's :80-equivalent port, which
/// sends the unlocated CA (127.0.0.1) to the real edge, which answers from
/// its own Redis; `apply` then pushes the certificates and the same edge
/// workers serve each host over HTTPS with h2 and the issued certificate,
/// verified against pebble's root — no reload.
#[test]
fn certs_issue_through_the_real_router_and_edge_then_served_over_h2() {
    let started = std::time::Instant::now();
    let edge_redis = harness::redis(&[]);
    let router_redis = harness::redis(&[]);
    let origin = crate::proxied::origin();
    let mut o = harness::nginx::EdgeOptions::new(edge_redis.port);
    o.workers = 2;
    harness::nginx::declare_bundle(&o);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        edge_1_node(edge_redis.port)
            .replace("198.51.100.1", "127.0.0.1")
            .replacen("redis:", "loopback: true\nredis:", 1)
            .as_bytes(),
    );
    f.write(
        "nodes/router-1.yaml",
        format!(
            "name: router-1\nroles: [router]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [127.0.0.20]\nloopback: true\n\
             redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
            router_redis.port
        )
        .as_bytes(),
    );
    // A plain-HTTP site the edge serves already.
    f.write(
        "sites/plain.test.yaml",
        format!(
            "host: plain.test\norigin: http://127.0.0.1:{origin}\nloopback: true\ncached: false\n"
        )
        .as_bytes(),
    );
    f.commit("nodes and a plain site");
    let state_root = tempfile::tempdir().unwrap();
    let state = state_root.path().join("state");
    for node in ["edge-1", "router-1"] {
        let out = run(f.path(), &state, &["apply", "--yes", "--node", node]);
        assert!(out.status.success(), "apply {node}: {}", stderr(&out));
    }
    let edge = harness::nginx::edge(&o);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while edge.worker_pids().len() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let workers = edge.worker_pids();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::write(
        &health,
        serde_json::json!({"at": now, "nodes": {"edge-1": {"online": true}}}).to_string(),
    )
    .unwrap();
    let router = harness::nginx::router(&harness::nginx::RouterOptions::new(
        router_redis.port,
        health,
        edge.process.port,
    ));
    let pebble = harness::pebble(&harness::PebbleOptions {
        http_port: router.process.port,
        answer: Ipv4Addr::LOCALHOST,
        validity_secs: None,
    });

    f.write(
        "cluster.yaml",
        crate::util::acme_cluster_yaml(&pebble, "").as_bytes(),
    );
    let hosts: &[(&str, &[&str])] = &[
        ("shop.test", &["www.shop.test", "m.shop.test"]),
        ("blog.test", &[]),
        ("docs.test", &[]),
    ];
    for (host, aliases) in hosts {
        f.write(
            &format!("sites/{host}.yaml"),
            format!(
                "host: {host}\naliases: {aliases:?}\norigin: http://127.0.0.1:{origin}\n\
                 loopback: true\ncached: false\ntls: {{acme: true}}\n"
            )
            .as_bytes(),
        );
    }
    f.commit("acme sites");
    let out = run(f.path(), &state, &["certs", "issue"]);
    assert!(
        out.status.success(),
        "{}\nrouter: {}\nedge: {}",
        stderr(&out),
        router.error_log(),
        edge.error_log()
    );
    let out = run(f.path(), &state, &["apply", "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let root = dir.path().join("root.pem");
    std::fs::write(&root, pebble.root()).unwrap();
    for (host, aliases) in hosts {
        let chain = std::fs::read(state.join(format!("certs/acme.{host}/chain.pem"))).unwrap();
        let issued = fingerprint(&chain);
        assert_eq!(issued.len(), 64, "{host}");
        for name in std::iter::once(host).chain(aliases.iter()) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let (fp, alpn) = loop {
                let got = served(edge.https_port, name);
                if got.0 == issued || std::time::Instant::now() > deadline {
                    break got;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            };
            assert_eq!(fp, issued, "{name}: {}", edge.error_log());
            assert_eq!(alpn, "h2", "{name}");
            // A full h2 request, the chain verified against pebble's root.
            let out = std::process::Command::new("curl")
                .args([
                    "-sS",
                    "--http2",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_version} %{http_code}",
                ])
                .arg("--cacert")
                .arg(&root)
                .arg("--resolve")
                .arg(format!("{name}:{}:127.0.0.1", edge.https_port))
                .arg(format!("https://{name}:{}/", edge.https_port))
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "2 200",
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    assert_eq!(edge.worker_pids(), workers, "the edge reloaded");
    eprintln!(
        "issued through router and edge, served over h2: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The order's bound in the fault tests' cluster.yaml: a request the CA
/// leaves unanswered is given up after half of it.
const ORDER_TIMEOUT_S: u64 = 4;

/// Two ACME sites (one with an alias) issued through the fault proxy in
/// front of pebble and applied to the real edge: the old certificates
/// every fault must leave in place.
struct Issued {
    redis: harness::Process,
    _edge: harness::nginx::Edge,
    _pebble: harness::Pebble,
    proxy: harness::acmefault::FaultProxy,
    f: Fixture,
    _state_root: tempfile::TempDir,
    state: std::path::PathBuf,
}

const HOSTS: [&str; 3] = ["shop.test", "www.shop.test", "blog.test"];

impl Issued {
    fn new() -> Issued {
        let redis = harness::redis(&[]);
        let (edge, pebble) = harness::pebble::behind_edge(redis.port);
        let proxy = harness::acmefault::in_front(&pebble, &harness::acmefault::Fault::None);
        let f = Fixture::empty();
        f.write(
            "cluster.yaml",
            format!(
                "acme:\n  directory: {}\n  contact: [\"mailto:ops@example.com\"]\n  ca_file: {}\n\
                 \x20 order_timeout: {ORDER_TIMEOUT_S}s\n",
                proxy.directory(),
                pebble.tls_ca().display()
            )
            .as_bytes(),
        );
        f.write("nodes/edge-1.yaml", edge_1_node(redis.port).as_bytes());
        f.write(
            "sites/shop.test.yaml",
            b"host: shop.test\naliases: [www.shop.test]\norigin: https://192.0.2.1\ntls: {acme: true}\n",
        );
        f.write(
            "sites/blog.test.yaml",
            b"host: blog.test\norigin: https://192.0.2.1\ntls: {acme: true}\n",
        );
        f.commit("acme sites");
        let state_root = tempfile::tempdir().unwrap();
        let state = state_root.path().join("state");
        let o = run(f.path(), &state, &["certs", "issue"]);
        assert!(o.status.success(), "{}\n{}", stderr(&o), proxy.log());
        let o = run(f.path(), &state, &["apply", "--yes"]);
        assert!(o.status.success(), "{}", stderr(&o));
        Issued {
            redis,
            _edge: edge,
            _pebble: pebble,
            proxy,
            f,
            _state_root: state_root,
            state,
        }
    }

    fn con(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.redis.port))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// The certificates in the state directory and the `tls:` documents
    /// on the edge.
    fn kept(&self) -> (Vec<String>, Vec<Option<String>>) {
        let chains = ["acme.shop.test", "acme.blog.test"]
            .iter()
            .map(|n| {
                std::fs::read_to_string(self.state.join("certs").join(n).join("chain.pem")).unwrap()
            })
            .collect();
        let mut con = self.con();
        let docs = HOSTS
            .iter()
            .map(|h| get(&mut con, &format!("tls:{h}")))
            .collect();
        (chains, docs)
    }

    /// `certs issue` under `fault`: exit 1, every host named with its
    /// problem; the old certificates kept, on the edge too, and no
    /// challenge key left. Each host's problem and `retry after`.
    fn fails(
        &mut self,
        fault: &harness::acmefault::Fault,
    ) -> std::collections::BTreeMap<String, (serde_json::Value, Option<u64>)> {
        self.proxy.set_fault(fault);
        let before = self.kept();
        let o = run(self.f.path(), &self.state, &["certs", "issue"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{fault:?}: {err}");
        assert!(
            err.contains("the sites that failed keep their old certificate"),
            "{fault:?}: {err}"
        );
        let failed = failures(&err);
        let hosts: Vec<&str> = failed.keys().map(String::as_str).collect();
        assert_eq!(
            hosts,
            ["blog.test", "shop.test", "www.shop.test"],
            "{fault:?}: {err}"
        );
        assert_eq!(self.kept(), before, "{fault:?}: something was replaced");
        let left: Vec<String> = redis::cmd("KEYS")
            .arg("acme:*")
            .query(&mut self.con())
            .unwrap();
        assert!(left.is_empty(), "{fault:?}: challenge keys left: {left:?}");
        failed
    }
}

/// `error: site S: host H got no certificate: {problem}[; retry after N s]`
/// lines: host → (problem, retry after).
fn failures(err: &str) -> std::collections::BTreeMap<String, (serde_json::Value, Option<u64>)> {
    let mut out = std::collections::BTreeMap::new();
    for line in err.lines() {
        let Some(rest) = line.strip_prefix("error: site ") else {
            continue;
        };
        let Some((_, rest)) = rest.split_once(": host ") else {
            continue;
        };
        let (host, rest) = rest.split_once(" got no certificate: ").unwrap();
        let (json, after) = match rest.rsplit_once("; retry after ") {
            Some((json, after)) => (
                json,
                Some(after.strip_suffix(" s").unwrap().parse::<u64>().unwrap()),
            ),
            None => (rest, None),
        };
        let problem: serde_json::Value = serde_json::from_str(json).unwrap();
        out.insert(host.to_owned(), (problem, after));
    }
    out
}

/// An HTTP date `secs` from now (`date -R` style, GMT).
fn http_date_in(secs: u64) -> String {
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs;
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{at}"), "+%a, %d %b %Y %H:%M:%S GMT"])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The CA answering 500, an error page, `rateLimited` with `Retry-After`
/// (seconds, then an HTTP date), or not at all: every host of every site
/// fails with the CA's problem document (or, unanswered, a bounded local
/// one), the wait the CA asked for is given, and nothing is replaced. A
/// rate limit on one site's order does not stop the next site's.
#[test]
fn certs_issue_names_each_host_when_the_ca_errs_rate_limits_or_does_not_answer() {
    use harness::acmefault::Fault;
    let started = std::time::Instant::now();
    let mut t = Issued::new();

    let failed = t.fails(&Fault::NewOrder500);
    for (host, (p, after)) in &failed {
        assert_eq!(
            p["type"], "urn:ietf:params:acme:error:serverInternal",
            "{host}"
        );
        assert_eq!(p["status"], 500, "{host}");
        assert_eq!(*after, None, "{host}");
    }

    // An error page, not a problem document: still the CA's answer.
    let failed = t.fails(&Fault::NewOrderPlain(503));
    for (host, (p, after)) in &failed {
        assert_eq!(p["type"], "about:blank", "{host}: {p}");
        assert_eq!(p["status"], 503, "{host}: {p}");
        assert_eq!(*after, None, "{host}");
    }

    let failed = t.fails(&Fault::RateLimited {
        retry_after: "7".into(),
    });
    for (host, (p, after)) in &failed {
        assert_eq!(
            p["type"], "urn:ietf:params:acme:error:rateLimited",
            "{host}"
        );
        assert_eq!(*after, Some(7), "{host}");
    }
    let failed = t.fails(&Fault::RateLimited {
        retry_after: http_date_in(120),
    });
    for (host, (_, after)) in &failed {
        let after = after.unwrap_or_else(|| panic!("{host}: no retry after"));
        assert!((100..=120).contains(&after), "{host}: {after}");
    }

    // Rate-limited on the first order only: that site's hosts fail with
    // the wait, the next site is issued.
    t.proxy.set_fault(&Fault::RateLimitedFirst {
        retry_after: "30".into(),
    });
    let before = t.kept().0;
    let o = run(t.f.path(), &t.state, &["certs", "issue"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let failed = failures(&err);
    let (first, issued) = if failed.contains_key("blog.test") {
        (vec!["blog.test"], "shop.test")
    } else {
        (vec!["shop.test", "www.shop.test"], "blog.test")
    };
    assert_eq!(
        failed.keys().map(String::as_str).collect::<Vec<_>>(),
        first,
        "{err}"
    );
    for (host, (p, after)) in &failed {
        assert_eq!(
            p["type"], "urn:ietf:params:acme:error:rateLimited",
            "{host}"
        );
        assert_eq!(*after, Some(30), "{host}");
    }
    assert!(
        err.contains(&format!("issued certificate `acme.{issued}`")),
        "{err}"
    );
    let after = t.kept().0;
    let failed_name = format!("acme.{}", first[0]);
    for (i, name) in ["acme.shop.test", "acme.blog.test"].iter().enumerate() {
        assert_eq!(before[i] == after[i], *name == failed_name, "{name}");
    }

    // No answer to the new order, or to the finalization (after the
    // challenges were written and validated).
    for path in ["/order-plz", "/finalize-order/"] {
        let asked = std::time::Instant::now();
        let failed = t.fails(&Fault::NoAnswer(path.into()));
        for (host, (p, _)) in &failed {
            assert_eq!(p["kind"], "ca-no-answer", "{path}: {host}: {p}");
        }
        // Two orders, each given up within the order's bound.
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(2 * ORDER_TIMEOUT_S + 5),
            "{path}: {:?}",
            asked.elapsed()
        );
    }

    // The CA back: issuing works again.
    t.proxy.set_fault(&Fault::None);
    let o = run(t.f.path(), &t.state, &["certs", "issue"]);
    assert!(o.status.success(), "{}", stderr(&o));
    eprintln!(
        "CA errors, rate limits, no answer: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// What the CA hands out as the certificate is checked like an imported
/// one: a certificate that is not the one ordered (another key), a chain
/// that does not verify, and garbage each fail every host with a local
/// problem of kind `bad-certificate` naming the check; nothing is
/// replaced.
#[test]
fn certs_issue_refuses_a_certificate_that_is_not_the_one_ordered() {
    use harness::acmefault::Fault;
    let started = std::time::Instant::now();
    let mut t = Issued::new();
    let other = harness::sitecerts::SiteCerts::new();
    other.sign("shop", &["shop.test", "www.shop.test", "blog.test"], 30);
    let stranger = harness::sitecerts::SiteCerts::new();
    let read = |c: &harness::SiteCerts, n: &str| std::fs::read_to_string(c.file(n)).unwrap();
    for (pem, check) in [
        // Right names, a valid chain, another key.
        (read(&other, "shop.chain.pem"), "key-mismatch"),
        // The leaf followed by a CA that did not issue it.
        (
            format!("{}{}", read(&other, "shop.pem"), read(&stranger, "ca.pem")),
            "chain-order",
        ),
        ("this is not a certificate\n".to_owned(), "not-pem"),
    ] {
        let failed = t.fails(&Fault::Certificate(pem));
        for (host, (p, after)) in &failed {
            assert_eq!(p["kind"], "bad-certificate", "{host}: {p}");
            assert_eq!(p["certificate"], check, "{host}: {p}");
            assert_eq!(*after, None);
        }
    }
    eprintln!("bad certificates: {:.1} s", started.elapsed().as_secs_f64());
}

/// An order that stays pending fails, named as such, once the order's
/// bound (`acme.order_timeout`) is over; its challenge keys live no longer
/// than that bound and are removed. Every edge down: `certs issue` starts
/// no order, names the edge, and the old certificate stays.
#[test]
fn certs_issue_gives_up_a_pending_order_at_its_bound_and_needs_the_edges() {
    use harness::acmefault::Fault;
    let started = std::time::Instant::now();
    let mut t = Issued::new();
    t.proxy.set_fault(&Fault::OrderStaysPending);
    // While it runs, the challenge keys' TTL is the order's bound.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["certs", "issue", "--site", "blog.test"])
        .current_dir(t.f.path())
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", &t.state)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut con = t.con();
    // The key lives from the order's start until it is given up (on a
    // loaded machine the command may take seconds to get there).
    let ttl = loop {
        let keys: Vec<String> = redis::cmd("KEYS").arg("acme:*").query(&mut con).unwrap();
        if let Some(k) = keys.first() {
            break redis::cmd("TTL").arg(k).query::<i64>(&mut con).unwrap();
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "no challenge key written while `certs issue` ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        (1..=i64::try_from(ORDER_TIMEOUT_S).unwrap()).contains(&ttl),
        "TTL {ttl}"
    );
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));

    let failed = t.fails(&Fault::OrderStaysPending);
    for (host, (p, _)) in &failed {
        assert_eq!(p["kind"], "order-pending", "{host}: {p}");
    }

    // Every edge down: nothing starts, the edge is named, nothing changes.
    t.proxy.set_fault(&Fault::None);
    let chains = t.kept().0;
    t.redis.stop();
    let o = run(t.f.path(), &t.state, &["certs", "issue"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("edge edge-1") && err.contains("nothing was issued"),
        "{err}"
    );
    let after: Vec<String> = ["acme.shop.test", "acme.blog.test"]
        .iter()
        .map(|n| std::fs::read_to_string(t.state.join("certs").join(n).join("chain.pem")).unwrap())
        .collect();
    assert_eq!(after, chains);
    eprintln!(
        "pending order, edges down: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
