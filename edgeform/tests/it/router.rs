//! The reference geo router (`router/`, nginx + Lua) against
//! `edgeform route --geo`, differentially, with real Redis, mosquitto, the
//! router's agent (in process) and nginx.
//!
//! Every edge is a loopback listener (127.0.0.N, one shared port)
//! answering its own name. The router's table arrives by `edgeform apply`;
//! the edges' health by retained MQTT status messages, which the router's
//! agent turns into the snapshot it shares with nginx
//! (`routing.share_health`). For the first and last address of every
//! network of MaxMind's test database, presented in `X-Forwarded-For` from
//! loopback (a trusted proxy), the edge that answers through the router is
//! the one `edgeform route --geo` names for the same snapshot.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::{Agent, Fixture, edgeform, stderr, stdout};

/// (name, loopback address, location, drained). Two pairs are tied within
/// 100 km for the test database's cities: London/Oxford for 81.2.69.0/24
/// and Seattle/Tacoma for Milton, WA; a drained edge sits in London.
const EDGES: &[(&str, &str, &str, bool)] = &[
    (
        "edge-london",
        "127.0.0.2",
        "{lat: 51.5074, lon: -0.1278}",
        false,
    ),
    (
        "edge-oxford",
        "127.0.0.3",
        "{lat: 51.752, lon: -1.2577}",
        false,
    ),
    (
        "edge-stockholm",
        "127.0.0.4",
        "{lat: 59.3293, lon: 18.0686}",
        false,
    ),
    (
        "edge-seattle",
        "127.0.0.5",
        "{lat: 47.6062, lon: -122.3321}",
        false,
    ),
    (
        "edge-tacoma",
        "127.0.0.6",
        "{lat: 47.2529, lon: -122.4443}",
        false,
    ),
    (
        "edge-shanghai",
        "127.0.0.7",
        "{lat: 31.2304, lon: 121.4737}",
        false,
    ),
    (
        "edge-la",
        "127.0.0.8",
        "{lat: 34.0522, lon: -118.2437}",
        false,
    ),
    (
        "edge-drained",
        "127.0.0.9",
        "{lat: 51.5142, lon: -0.0931}",
        true,
    ),
];

pub fn geoip_db() -> PathBuf {
    crate::util::example_repo().join("testdata/geoip/GeoLite2-City-Test.mmdb")
}

/// The first and last address of every network in the database (IPv4
/// networks as IPv4), deduplicated.
pub fn every_network(db: &Path) -> Vec<IpAddr> {
    let reader = maxminddb::Reader::open_readfile(db).unwrap();
    let mut out = std::collections::BTreeSet::new();
    for r in reader
        .networks(maxminddb::WithinOptions::default())
        .unwrap()
    {
        let net = r.unwrap().network().unwrap();
        out.insert(net.network());
        out.insert(net.broadcast());
    }
    out.into_iter().collect()
}

fn repo(router_redis: u16, broker: u16) -> Fixture {
    let mut files: Vec<(String, String)> = vec![
        ("nodes/edge-1.yaml".into(), String::new()),
        (
            "cluster.yaml".into(),
            format!(
                "name: t\ntrusted_proxies: [127.0.0.1/32]\n\
                 mqtt: {{url: \"mqtt://127.0.0.1:{broker}\"}}\n"
            ),
        ),
        (
            "nodes/router-1.yaml".into(),
            format!(
                "name: router-1\nroles: [router]\nregion: eu\n\
                 location: {{lat: 52.0, lon: 4.0}}\naddresses: [127.0.0.1]\nloopback: true\n\
                 redis: {{url: \"redis://127.0.0.1:{router_redis}\"}}\n"
            ),
        ),
    ];
    for (name, addr, loc, drained) in EDGES {
        let drain = if *drained { "drain: true\n" } else { "" };
        files.push((
            format!("nodes/{name}.yaml"),
            format!(
                "name: {name}\nroles: [edge]\nregion: eu\nlocation: {loc}\n\
                 addresses: [{addr}]\nloopback: true\nredis: {{url: \"redis://127.0.0.1:1\"}}\n{drain}"
            ),
        ));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let f = Fixture::with(&refs);
    f.commit("router fixture");
    f
}

/// A loopback HTTP listener that answers every request with `name`.
pub(super) fn edge_listener(addr: &str, port: u16, name: &'static str) {
    let listener = TcpListener::bind((addr, port)).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
            });
        }
    });
}

pub use crate::util::Answer as Resp;

pub fn get(port: u16, xff: Option<&str>) -> Resp {
    let mut text =
        "GET /live/s.m3u8 HTTP/1.1\r\nHost: cdn.example\r\nConnection: close\r\n".to_owned();
    if let Some(x) = xff {
        text.push_str(&format!("X-Forwarded-For: {x}\r\n"));
    }
    text.push_str("\r\n");
    crate::util::exchange(port, &text, Duration::from_secs(10))
}

/// The router's choice for `ip`: the edge that answered (its body; the
/// header must agree), or None for a 503.
fn router_choice(port: u16, ip: IpAddr) -> Result<Option<String>, String> {
    let r = get(port, Some(&ip.to_string()));
    match r.status {
        200 => {
            let header = r
                .headers
                .get("x-edgeform-edge")
                .cloned()
                .unwrap_or_default();
            if header != r.body {
                return Err(format!("{ip}: header {header} but {} answered", r.body));
            }
            Ok(Some(r.body))
        }
        503 => Ok(None),
        s => Err(format!("{ip}: status {s}: {:?}", r.headers)),
    }
}

/// `edgeform route --geo`'s choice for `ip` with the snapshot in `health`.
fn cli_choice(repo: &Path, ip: IpAddr, health: &Path) -> Option<String> {
    let db = geoip_db();
    let out = edgeform(
        repo,
        &[
            "route",
            "--ip",
            &ip.to_string(),
            "--geo",
            "--geoip",
            db.to_str().unwrap(),
            "--health",
            health.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v["geo"]["decision"]["node"].as_str().map(str::to_owned)
}

/// Publish a retained status for `node` (what its agent's connect and last
/// will do).
fn set_status(broker: u16, node: &str, status: &str) {
    let mut o = rumqttc::MqttOptions::new(format!("test-{node}-{status}"), "127.0.0.1", broker);
    o.set_keep_alive(Duration::from_secs(5));
    let (client, mut connection) = rumqttc::Client::new(o, 16);
    client
        .publish(
            format!("edgeform/status/{node}"),
            rumqttc::QoS::AtLeastOnce,
            true,
            status.as_bytes().to_vec(),
        )
        .unwrap();
    for event in connection.iter() {
        if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) = event {
            break;
        }
        if event.is_err() {
            panic!("publishing {node} {status}: {event:?}");
        }
    }
    let _ = client.disconnect();
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Compare router and CLI for every address; returns the router's choices.
fn differential(
    repo: &Path,
    port: u16,
    ips: &[IpAddr],
    health: &Path,
) -> BTreeMap<IpAddr, Option<String>> {
    let mut disagreements = Vec::new();
    let mut choices = BTreeMap::new();
    for ip in ips {
        let router = router_choice(port, *ip).unwrap_or_else(|e| panic!("{e}"));
        let cli = cli_choice(repo, *ip, health);
        if router != cli {
            disagreements.push(format!("{ip}: router {router:?}, route --geo {cli:?}"));
        }
        choices.insert(*ip, router);
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} addresses disagree:\n{}",
        disagreements.len(),
        ips.len(),
        disagreements.join("\n")
    );
    choices
}

#[test]
fn geo_router_matches_route_geo_for_every_network() {
    let mut redis = harness::redis(&[]);
    let mut broker = harness::mosquitto();
    let f = repo(redis.port, broker.port);
    let out = edgeform(f.path(), &["apply", "--yes", "--node", "router-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let edge_port = harness::free_port();
    for (name, addr, _, _) in EDGES {
        edge_listener(addr, edge_port, name);
    }
    for (name, _, _, _) in EDGES {
        set_status(broker.port, name, "online");
    }

    let (agent, shared, _cache, health) = routing_agent(redis.port, broker.port);

    let router = harness::nginx::router(&harness::nginx::RouterOptions::new(
        redis.port,
        health.clone(),
        edge_port,
    ));
    let port = router.process.port;
    let london: IpAddr = "81.2.69.142".parse().unwrap();
    wait_for("the router to load table and health", 20, || {
        let r = get(port, Some(&london.to_string()));
        r.status == 200 && !r.headers.contains_key("x-edgeform-stale")
    });

    let ips = every_network(&geoip_db());
    let frozen = shared.path().join("phase1.json");
    std::fs::copy(&health, &frozen).unwrap();
    let phase1 = differential(f.path(), port, &ips, &frozen);
    let mut count: BTreeMap<Option<String>, usize> = BTreeMap::new();
    for c in phase1.values() {
        *count.entry(c.clone()).or_default() += 1;
    }
    eprintln!("{} addresses; router choices: {count:?}", ips.len());
    // The ties are exercised: both London edges and both Puget Sound
    // edges are chosen for some clients; the drained one never.
    for e in ["edge-london", "edge-oxford", "edge-seattle", "edge-tacoma"] {
        assert!(count.contains_key(&Some(e.to_owned())), "{e}: {count:?}");
    }
    assert!(!count.contains_key(&Some("edge-drained".to_owned())));
    // The last X-Forwarded-For entry is the client whatever precedes it
    // (docs/router.md): `unknown`, empty or garbage entries change nothing.
    for (ip, c) in phase1.iter().step_by(101) {
        for before in ["unknown, ", ", ", "garbage, , 10.0.0.1 ,\t"] {
            let r = get(port, Some(&format!("{before}{ip}")));
            let edge = (r.status == 200).then(|| r.body.clone());
            assert_eq!(&edge, c, "X-Forwarded-For `{before}{ip}`");
        }
    }

    // Phase 2: a tied edge goes offline (its last will); the listener
    // stays up, so only the agent's health can steer around it.
    let moved: Vec<IpAddr> = phase1
        .iter()
        .filter(|(_, c)| c.as_deref() == Some("edge-london"))
        .map(|(ip, _)| *ip)
        .collect();
    set_status(broker.port, "edge-london", "offline");
    wait_for("the router to skip edge-london", 20, || {
        router_choice(port, moved[0]).unwrap() != Some("edge-london".into())
    });
    std::fs::copy(&health, &frozen).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&frozen).unwrap())
            .unwrap()["nodes"]["edge-london"]["online"],
        false
    );
    let phase2 = differential(f.path(), port, &ips, &frozen);
    for ip in &moved {
        assert_ne!(phase2[ip].as_deref(), Some("edge-london"), "{ip}");
    }
    // Its tied clients go to the other London edge.
    assert!(
        moved
            .iter()
            .any(|ip| phase2[ip].as_deref() == Some("edge-oxford"))
    );
    // Clients of edges far from London stay put. (A client tied between
    // London and Oxford may move even when it was on Oxford: with London
    // gone the tie window starts at the next nearest edge and can take in
    // one more edge — both sides agree on that, as checked above.)
    for (ip, c) in &phase1 {
        if !matches!(c.as_deref(), Some("edge-london" | "edge-oxford")) {
            assert_eq!(&phase2[ip], c, "{ip}");
        }
    }

    // Redis down: the last table keeps routing, marked stale.
    redis.stop();
    wait_for("routing marked stale", 10, || {
        get(port, Some(&london.to_string()))
            .headers
            .get("x-edgeform-stale")
            .is_some_and(|s| s == "routing")
    });
    // The broker down too: the last health, marked stale as well.
    broker.stop();
    wait_for("routing and health marked stale", 20, || {
        get(port, Some(&london.to_string()))
            .headers
            .get("x-edgeform-stale")
            .is_some_and(|s| s == "routing, health")
    });
    for (ip, c) in phase2.iter().step_by(7) {
        assert_eq!(&router_choice(port, *ip).unwrap(), c, "{ip} while stale");
    }
    drop(agent);
    drop(router);
}

/// `edgeform route --vod ASSET` explains the placement from the revisions
/// in the health snapshot: a newer forbidden replica does not exclude an
/// older permitted one.
#[test]
fn route_vod_explains_the_placement() {
    let f = Fixture::with(&[
        ("zones/home.yaml", "name: home\nroutes: [10.2.0.0/16]\n"),
        ("zones/other.yaml", "name: other\nroutes: [10.1.0.0/16]\n"),
        (
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nzone: home\nlocation: {lat: 52.0, lon: 4.0}\n\
             public_url: https://e1.example.net\nredis: {url: \"redis://127.0.0.1:6379\"}\n",
        ),
        (
            "nodes/edge-2.yaml",
            "name: edge-2\nroles: [edge]\nregion: eu\nzone: other\nlocation: {lat: 52.0, lon: 4.0}\n\
             redis: {url: \"redis://127.0.0.1:6380\"}\n",
        ),
    ]);
    let health = f.path().join("health.json");
    std::fs::write(
        &health,
        r#"{"nodes": {"edge-1": {"online": true, "play_sessions": 1, "vod": {"movie": [2]}},
                      "edge-2": {"online": true, "play_sessions": 0, "vod": {"movie": [5]}}}}"#,
    )
    .unwrap();
    let h = health.to_str().unwrap();
    let out = edgeform(
        f.path(),
        &[
            "route", "--ip", "10.2.0.9", "--vod", "movie", "--health", h, "--format", "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["vod"]["status"], 302);
    assert_eq!(v["vod"]["node"], "edge-1");
    assert_eq!(v["vod"]["revision"], 2);
    assert_eq!(v["vod"]["location"], "https://e1.example.net/movie");
    let out = edgeform(
        f.path(),
        &["route", "--ip", "10.2.0.9", "--vod", "movie", "--health", h],
    );
    let text = stdout(&out);
    assert!(
        text.contains("vod movie: decision: 302 → edge-1 revision 2"),
        "{text}"
    );
    assert!(
        text.contains("edge-2 (revision 5) excluded: zone other is not allowed for this client"),
        "{text}"
    );
}

/// Publish a retained message.
fn retain(broker: u16, topic: &str, payload: Vec<u8>) {
    let mut o = rumqttc::MqttOptions::new(
        format!("test-retain-{}", topic.replace('/', "-")),
        "127.0.0.1",
        broker,
    );
    o.set_keep_alive(Duration::from_secs(5));
    let (client, mut connection) = rumqttc::Client::new(o, 16);
    client
        .publish(topic, rumqttc::QoS::AtLeastOnce, true, payload)
        .unwrap();
    for event in connection.iter() {
        match event {
            Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => break,
            Err(e) => panic!("publishing {topic}: {e}"),
            _ => {}
        }
    }
    let _ = client.disconnect();
}

/// `edgeform route --health mqtt` takes the live snapshot from a real
/// mosquitto (retained reports and statuses, as agents publish them), and
/// `status` shows each node's zone.
#[test]
fn route_reads_health_from_the_broker_and_status_shows_zones() {
    let broker = harness::mosquitto();
    let edge = |name: &str, port: u16| {
        format!(
            "name: {name}\nroles: [edge]\nregion: eu\nzone: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             addresses: [198.51.100.{}]\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n",
            port - 6300
        )
    };
    let f = Fixture::with(&[
        (
            "cluster.yaml",
            &*format!(
                "name: t\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n",
                broker.port
            ),
        ),
        ("zones/eu.yaml", "name: eu\nroutes: [0.0.0.0/0]\n"),
        ("nodes/edge-1.yaml", &*edge("edge-1", 6301)),
        ("nodes/edge-2.yaml", &*edge("edge-2", 6302)),
    ]);
    let report = |node: &str, sessions: u64, vod: Option<u64>| {
        serde_json::to_vec(&edgestate::mqtt::HealthReport {
            node: node.into(),
            ts: 1,
            interval_ms: Some(5000),
            play_sessions: Some(sessions),
            out_kbit: Some(10),
            streams: Some(vec!["cam".into()].into()),
            vod: vod.map(|r| BTreeMap::from([("movie".to_owned(), vec![r])]).into()),
            net_kbit: Some(10),
            config: edgestate::mqtt::ConfigState::default(),
            purge: edgestate::mqtt::PurgeState::default(),
            redis: edgestate::mqtt::RedisState::default(),
            version: "t".into(),
            bundle: None,
            serving: None,
        })
        .unwrap()
    };
    // edge-1 is the less loaded but its last will says offline; edge-2
    // reports and is online.
    retain(
        broker.port,
        "edgeform/health/edge-1",
        report("edge-1", 0, Some(9)),
    );
    retain(broker.port, "edgeform/status/edge-1", b"offline".to_vec());
    retain(
        broker.port,
        "edgeform/health/edge-2",
        report("edge-2", 7, Some(4)),
    );
    retain(broker.port, "edgeform/status/edge-2", b"online".to_vec());

    let out = edgeform(
        f.path(),
        &[
            "route",
            "--ip",
            "192.0.2.7",
            "--stream",
            "cam",
            "--vod",
            "movie",
            "--health",
            "mqtt",
            "--format",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["node"], "edge-2", "{v}");
    let listing = &v["zones"][0]["nodes"];
    assert!(
        listing
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["node"] == "edge-1" && n["reason"] == "offline"),
        "{v}"
    );
    assert_eq!(v["vod"]["node"], "edge-2");
    assert_eq!(v["vod"]["revision"], 4);

    // The broker away: a clear error, exit 1.
    let mut broker = broker;
    broker.stop();
    let out = edgeform(
        f.path(),
        &[
            "route",
            "--ip",
            "192.0.2.7",
            "--stream",
            "cam",
            "--health",
            "mqtt",
            "--connect-timeout",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot reach the MQTT broker"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn status_shows_each_nodes_zone() {
    let broker = harness::mosquitto();
    let f = Fixture::with(&[
        (
            "cluster.yaml",
            &*format!(
                "name: t\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n",
                broker.port
            ),
        ),
        ("zones/eu.yaml", "name: eu\nroutes: [0.0.0.0/0]\n"),
        (
            "nodes/edge-1.yaml",
            "name: edge-1\nroles: [edge]\nregion: eu\nzone: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
             redis: {url: \"redis://127.0.0.1:6379\"}\n",
        ),
        (
            "nodes/edge-2.yaml",
            "name: edge-2\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
             redis: {url: \"redis://127.0.0.1:6380\"}\n",
        ),
    ]);
    let out = edgeform(f.path(), &["status", "--format", "json"]);
    // Neither target ever reported: the verdict is OFFLINE.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["verdict"], "offline");
    assert_eq!(v["nodes"][0]["node"], "edge-1");
    assert_eq!(v["nodes"][0]["zone"], "eu");
    assert_eq!(v["nodes"][1]["zone"], serde_json::Value::Null);
    let out = edgeform(f.path(), &["status"]);
    let text = stdout(&out);
    assert!(text.starts_with("NODE    ZONE  STATE"), "{text}");
    assert!(text.contains("\nedge-1  eu    offline"), "{text}");
}

/// An IPv4-mapped `--ip` is the IPv4 client for `--geo` (the router
/// canonicalises it; the rendezvous key must be the same text).
#[test]
fn route_geo_canonicalises_ipv4_mapped_clients() {
    let f = repo(1, 1);
    let db = geoip_db();
    let choice = |ip: &str| {
        let out = edgeform(
            f.path(),
            &[
                "route",
                "--ip",
                ip,
                "--geo",
                "--geoip",
                db.to_str().unwrap(),
                "--format",
                "json",
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        (v["client_ip"].clone(), v["geo"]["decision"]["node"].clone())
    };
    for ip in ["81.2.69.142", "81.2.69.160", "216.160.83.57"] {
        assert_eq!(choice(&format!("::ffff:{ip}")), choice(ip), "{ip}");
    }
}

/// The geo router with an edge that refuses connections (no listener) and
/// one whose agent reports it not serving: a connect error is retried once
/// on the next nearest online edge, so the viewer is answered; an edge
/// reported `serving: false` is skipped like an offline one, as
/// `edgeform route --geo` says.
#[test]
fn geo_router_retries_the_next_edge_and_skips_an_edge_not_serving() {
    let redis = harness::redis(&[]);
    let broker = harness::mosquitto();
    let f = repo(redis.port, broker.port);
    let out = edgeform(f.path(), &["apply", "--yes", "--node", "router-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let edge_port = harness::free_port();
    for (name, addr, _, _) in EDGES {
        // edge-london's nginx is dead: nothing listens at its address.
        if *name != "edge-london" {
            edge_listener(addr, edge_port, name);
        }
        set_status(broker.port, name, "online");
    }
    let (_agent, shared, _cache, health) = routing_agent(redis.port, broker.port);
    let router = harness::nginx::router(&harness::nginx::RouterOptions::new(
        redis.port,
        health.clone(),
        edge_port,
    ));
    let port = router.process.port;
    let london: Vec<IpAddr> = every_network(&geoip_db())
        .into_iter()
        .filter(|ip| ip.to_string().starts_with("81.2.69."))
        .collect();
    wait_for("the router to load table and health", 20, || {
        let r = get(port, Some(&london[0].to_string()));
        r.status == 200 && !r.headers.contains_key("x-edgeform-stale")
    });
    let frozen = shared.path().join("all-online.json");
    std::fs::copy(&health, &frozen).unwrap();
    let choices: Vec<(IpAddr, Option<String>)> = london
        .iter()
        .map(|ip| (*ip, cli_choice(f.path(), *ip, &frozen)))
        .collect();
    let mut retried = 0;
    for (ip, cli) in &choices {
        let r = get(port, Some(&ip.to_string()));
        assert_eq!(r.status, 200, "{ip}: {:?}", r.headers);
        if cli.as_deref() == Some("edge-london") {
            // Refused: answered by the next nearest online edge, which
            // the router's header names.
            assert_ne!(r.body, "edge-london");
            assert_eq!(
                r.headers.get("x-edgeform-edge").map(String::as_str),
                Some(r.body.as_str()),
                "{ip}"
            );
            retried += 1;
        } else {
            assert_eq!(Some(&r.body), cli.as_ref(), "{ip}");
        }
    }
    assert!(
        retried > 0,
        "no London client chose edge-london: {choices:?}"
    );

    // edge-oxford's agent reports it not serving (its listener is up: only
    // the report can steer around it).
    let on_oxford: Vec<IpAddr> = choices
        .iter()
        .filter(|(_, c)| c.as_deref() == Some("edge-oxford"))
        .map(|(ip, _)| *ip)
        .collect();
    assert!(!on_oxford.is_empty(), "{choices:?}");
    retain(
        broker.port,
        "edgeform/health/edge-oxford",
        serde_json::to_vec(&edgestate::mqtt::HealthReport {
            node: "edge-oxford".into(),
            ts: 1,
            interval_ms: Some(5000),
            play_sessions: Some(0),
            out_kbit: Some(0),
            streams: None,
            vod: None,
            net_kbit: None,
            config: edgestate::mqtt::ConfigState::default(),
            purge: edgestate::mqtt::PurgeState::default(),
            redis: edgestate::mqtt::RedisState::default(),
            version: "t".into(),
            bundle: None,
            serving: Some(false),
        })
        .unwrap(),
    );
    wait_for("the router to skip edge-oxford", 20, || {
        get(port, Some(&on_oxford[0].to_string())).body != "edge-oxford"
    });
    std::fs::copy(&health, &frozen).unwrap();
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&frozen).unwrap()).unwrap();
    assert_eq!(s["nodes"]["edge-oxford"]["serving"], false, "{s}");
    for ip in &on_oxford {
        let cli = cli_choice(f.path(), *ip, &frozen);
        assert_ne!(cli.as_deref(), Some("edge-oxford"), "{ip}");
        let r = get(port, Some(&ip.to_string()));
        assert_eq!(r.status, 200, "{ip}");
        assert_ne!(r.body, "edge-oxford", "{ip}");
        if cli.as_deref() != Some("edge-london") {
            assert_eq!(Some(&r.body), cli.as_ref(), "{ip}");
        }
    }
}

/// The router node's agent sharing every edge's health (`share_health`)
/// into a file, once the snapshot has every edge online: the agent, the
/// snapshot's folder, its cache folder and the snapshot's path.
/// router-1 applied from [`repo`], every edge of [`EDGES`] listening on
/// one port and marked online: the repository and that port.
fn applied_with_edges_online(redis_port: u16, broker_port: u16) -> (Fixture, u16) {
    let f = repo(redis_port, broker_port);
    let out = edgeform(f.path(), &["apply", "--yes", "--node", "router-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let edge_port = harness::free_port();
    for (name, addr, _, _) in EDGES {
        edge_listener(addr, edge_port, name);
        set_status(broker_port, name, "online");
    }
    (f, edge_port)
}

fn routing_agent(
    redis_port: u16,
    broker_port: u16,
) -> (
    Agent,
    tempfile::TempDir,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let shared = tempfile::tempdir().unwrap();
    let health = shared.path().join("health.json");
    let cache = tempfile::tempdir().unwrap();
    let agent = Agent::start(&format!(
        "node: router-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{redis_port}\"}}\n\
         cache: {{dirs: [{}]}}\nmqtt: {{url: \"mqtt://127.0.0.1:{broker_port}\"}}\n\
         health: {{interval: 500ms}}\n\
         routing: {{refresh: 200ms, share_health: {}}}\n",
        cache.path().display(),
        health.display()
    ));
    let snapshot = || -> serde_json::Value {
        std::fs::read_to_string(&health)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    };
    wait_for("every edge online in the shared snapshot", 20, || {
        let s = snapshot();
        EDGES
            .iter()
            .all(|(n, _, _, _)| s["nodes"][n]["online"] == true)
    });
    (agent, shared, cache, health)
}

/// nginx reloaded (`HUP`: new workers) while Redis is down, then while
/// Redis has lost its data: the new workers begin from the table the old
/// ones routed with (shared by the workers), marked stale while Redis is
/// away, and keep it when Redis comes back empty.
#[test]
fn a_router_reloaded_while_redis_is_down_or_empty_keeps_routing_with_the_table_in_use() {
    let mut redis = harness::redis(&[]);
    let broker = harness::mosquitto();
    let (_f, edge_port) = applied_with_edges_online(redis.port, broker.port);
    let (_agent, _shared, _cache, health) = routing_agent(redis.port, broker.port);
    let mut o = harness::nginx::RouterOptions::new(redis.port, health, edge_port);
    o.workers = 2;
    let router = harness::nginx::router(&o);
    let port = router.process.port;
    let viewer = Some("81.2.69.142");
    wait_for("the router to load table and health", 20, || {
        get(port, viewer).status == 200
    });
    redis.stop();
    router.reload();
    for i in 0..10 {
        let r = get(port, viewer);
        assert_eq!(
            (r.status, r.header("x-edgeform-stale")),
            (200, Some("routing")),
            "#{i} after a reload with Redis down\n{}",
            router.error_log()
        );
    }
    // Back without its data (no persistence here), then another reload.
    redis.restart();
    router.reload();
    let workers = router.worker_pids();
    wait_for("both new workers to see the loss", 10, || {
        let log = router.error_log();
        workers.iter().all(|p| {
            log.lines().any(|l| {
                l.contains(&format!(" {p}#{p}:"))
                    && l.contains("redis lost its data (generation none")
            })
        })
    });
    for i in 0..10 {
        let r = get(port, viewer);
        assert_eq!(
            (r.status, r.header("x-edgeform-stale")),
            (200, None),
            "#{i} after a reload with Redis empty\n{}",
            router.error_log()
        );
    }
}

/// The geo router's Redis going back to an older snapshot (a lower
/// generation) does not replace the routing table in use; the next
/// write (a higher generation than the one in use) does.
/// A router started (or restarted) routes from its first request, not
/// 503 until its timer's first poll; a Redis gone back a generation does
/// not replace the table in use.
#[test]
fn geo_router_routes_from_its_first_request_and_keeps_its_table_when_redis_goes_back() {
    let redis = harness::redis(&[]);
    let broker = harness::mosquitto();
    let (_f, edge_port) = applied_with_edges_online(redis.port, broker.port);
    let (_agent, _shared, _cache, health) = routing_agent(redis.port, broker.port);
    let mut router = harness::nginx::router(&harness::nginx::RouterOptions::new(
        redis.port, health, edge_port,
    ));
    let port = router.process.port;
    let viewer = Some("81.2.69.142");
    wait_for("the router to load table and health", 20, || {
        get(port, viewer).status == 200
    });
    for i in 0..3 {
        router.process.restart();
        let r = get(port, viewer);
        assert_eq!(
            r.status,
            200,
            "restart {i}: {:?}\n{}",
            r.headers,
            router.error_log()
        );
    }
    // Redis down: the table in use keeps routing, marked stale; the outage
    // is logged once, not at each poll (five a second), and so is its end.
    let mut redis = redis;
    let said = |what: &str| {
        router
            .error_log()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    };
    let down = "redis unreachable, routing with the last known table";
    // Saved, so the restarted Redis holds the same data.
    harness::raw_command(redis.port, "SAVE").unwrap();
    redis.stop();
    wait_for("the router to notice Redis is down", 10, || said(down) > 0);
    let r = get(port, viewer);
    assert_eq!(
        (r.status, r.header("x-edgeform-stale")),
        (200, Some("routing")),
        "{}",
        router.error_log()
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(said(down), 1, "{}", router.error_log());
    redis.restart();
    wait_for("the router to say Redis is back", 10, || {
        said("redis reachable again") > 0
    });
    assert_eq!(said(down), 1, "{}", router.error_log());
    let r = get(port, viewer);
    assert_eq!((r.status, r.header("x-edgeform-stale")), (200, None));
    let cmd = |c: &str| harness::raw_command(redis.port, c).unwrap();
    let live: u64 = cmd("HGET edgeform:meta generation")
        .lines()
        .nth(1)
        .and_then(|l| l.parse().ok())
        .unwrap();
    // An older snapshot: a lower generation and a table with no edge.
    cmd(r#"SET edgeform:routing "{\"nodes\":{}}""#);
    cmd(&format!("HSET edgeform:meta generation {}", live - 1));
    wait_for("the router to notice", 10, || {
        router.error_log().contains("redis lost its data")
    });
    for _ in 0..5 {
        assert_eq!(get(port, viewer).status, 200, "the table in use kept");
    }
    // The next write moves it.
    cmd(&format!("HSET edgeform:meta generation {}", live + 1));
    wait_for("the router to load the new table", 10, || {
        get(port, viewer).status == 503
    });
}

/// A routing table in the router's Redis that is not one (a JSON array,
/// `nodes` a list, a node that is not an object next to a trust-everyone
/// `trusted_proxies`, a node name carrying a header line) is refused
/// whole: the table in use keeps routing, marked stale, and nothing of the
/// refused one is applied (no trust widened, no header injected). A good
/// table after them is taken.
#[test]
fn a_hostile_routing_table_is_refused_whole_and_the_table_in_use_kept() {
    let redis = harness::redis(&[]);
    let broker = harness::mosquitto();
    let (_f, edge_port) = applied_with_edges_online(redis.port, broker.port);
    let (_agent, _shared, _cache, health) = routing_agent(redis.port, broker.port);
    let router = harness::nginx::router(&harness::nginx::RouterOptions::new(
        redis.port, health, edge_port,
    ));
    let port = router.process.port;
    let viewer = Some("81.2.69.142");
    wait_for("the router to load table and health", 20, || {
        get(port, viewer).status == 200
    });
    let before = get(port, viewer);
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let good: String = redis::cmd("GET")
        .arg("edgeform:routing")
        .query(&mut con)
        .unwrap();
    let mut put = |text: &str| {
        redis::cmd("SET")
            .arg("edgeform:routing")
            .arg(text)
            .exec(&mut con)
            .unwrap();
        redis::cmd("HINCRBY")
            .arg("edgeform:meta")
            .arg("generation")
            .arg(1)
            .exec(&mut con)
            .unwrap();
    };
    for hostile in [
        "[1,2,3]",
        r#"{"nodes":[1]}"#,
        r#"{"trusted_proxies":["0.0.0.0/0"],"nodes":{"x":1}}"#,
        "{\"nodes\":{\"lon-1\\r\\nSet-Cookie: pwn=1\":{\"roles\":[\"edge\"]}}}",
    ] {
        put(hostile);
        wait_for("the router to refuse it", 10, || {
            get(port, viewer).header("x-edgeform-stale") == Some("routing")
        });
        let r = get(port, viewer);
        assert_eq!(r.status, 200, "{hostile}: {:?}", r.headers);
        assert_eq!(
            r.header("x-edgeform-edge"),
            before.header("x-edgeform-edge"),
            "{hostile}"
        );
        assert!(
            r.header("set-cookie").is_none(),
            "{hostile}: {:?}",
            r.headers
        );
        assert!(
            router.error_log().contains("edgeform:routing unreadable"),
            "{}",
            router.error_log()
        );
    }
    put(&good);
    wait_for("the router to take the good table", 10, || {
        get(port, viewer).header("x-edgeform-stale").is_none()
    });
}
