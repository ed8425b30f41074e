//! The serving probe against a real nginx edge (its Lua, its TLS
//! listeners), a real agent, Redis and mosquitto: the agent probes every
//! listener (plain HTTP, HTTPS, the routers' PROXY-protocol port) and
//! reports `serving`; the edge's Redis being down is still serving; a
//! stopped nginx is "not serving" within about a second and `/route`
//! stops sending viewers to it; an HTTPS listener that does not speak TLS
//! while plain HTTP works is not serving either.

use std::time::{Duration, Instant};

use edgestate::mqtt::HealthReport;

use crate::route::{get, publish, table, wait_for};
use crate::util::{Agent, Mqtt};

fn serving(p: &[u8]) -> Option<bool> {
    serde_json::from_slice::<HealthReport>(p)
        .ok()
        .and_then(|r| r.serving)
}

#[test]
fn a_stopped_edge_is_not_serving_and_not_routed_to_but_a_dead_redis_is() {
    let mut r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    // edge-1 (this agent's node) is the only node of its zone.
    let mut t = table("https://a.example.net");
    let mut one = t.nodes.remove("edge-a").unwrap();
    one.public_url = Some("https://one.example.net".into());
    t.nodes.insert("edge-1".into(), one);
    publish(r.port, &t, 1);
    let mut edge = harness::nginx::edge(&harness::nginx::EdgeOptions::new(r.port));
    let stats = dir.path().join("stats.json");
    std::fs::write(&stats, r#"{"sessions": 0, "live": ["cam1"]}"#).unwrap();
    let http = harness::free_port();
    // A long interval: a change of `serving` must be reported at once.
    let yaml = format!(
        "mqtt:\n  url: mqtt://127.0.0.1:{}\nhealth:\n  interval: 30s\n  play_sessions: {{file: {}, field: sessions}}\n  streams: {{file: {}, field: live}}\n  probe: [\"http://127.0.0.1:{}\", \"https://127.0.0.1:{}\", \"proxy://127.0.0.1:{}\"]\nhttp:\n  listen: 127.0.0.1:{http}\nrouting:\n  refresh: 100ms\n",
        broker.port,
        stats.display(),
        stats.display(),
        edge.process.port,
        edge.https_port,
        edge.proxy_port,
    );
    let m = Mqtt::connect(broker.port);
    m.subscribe("edgeform/health/edge-1");
    let agent = Agent::start_with(r.port, &[dir.path().join("cache")], &yaml);
    let log = || agent.log();
    assert!(
        m.wait("edgeform/health/edge-1", 15, |p| serving(p) == Some(true))
            .is_some(),
        "never serving:\n{}\n{}",
        agent.log(),
        edge.error_log()
    );
    let one_routed = || {
        let (status, head, _) = get(http, "/route/cam1", "");
        status == 302 && head.contains("location: https://one.example.net")
    };
    wait_for(one_routed, "routed to edge-1 while serving", &|| {
        format!(
            "{:?}\n{}",
            get(http, "/route/cam1?format=json", ""),
            agent.log()
        )
    });

    // The edge's Redis down: the edge still answers the probe (and serves
    // its last-known documents), so the node stays serving.
    r.stop();
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        m.wait("edgeform/health/edge-1", 5, |p| serving(p) == Some(false))
            .is_none(),
        "a dead Redis made the edge not serving:\n{}",
        agent.log()
    );
    r.restart();
    wait_for(one_routed, "routed to edge-1 after Redis returned", &log);

    // nginx stopped: reported at once (not at the next 30 s report), and
    // `/route` no longer sends viewers there.
    let stopped = Instant::now();
    edge.process.stop();
    assert!(
        m.wait("edgeform/health/edge-1", 5, |p| serving(p) == Some(false))
            .is_some(),
        "never reported not serving:\n{}",
        agent.log()
    );
    wait_for(
        || get(http, "/route/cam1", "").0 == 503,
        "not routed to a stopped edge",
        &log,
    );
    let took = stopped.elapsed();
    eprintln!("stopped edge out of /route after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let (_, _, body) = get(http, "/route/cam1?format=json", "");
    assert!(body.contains("not serving"), "{body}");
}

fn probe(kind: agentconf::ProbeKind, port: u16) -> bool {
    let p = agentconf::Probe {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        kind,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = agent::probe::tls_connector().unwrap();
        agent::probe::probe_once(&p, &tls).await
    })
}

/// Each listener answers the probe spoken its own way — the HTTPS one
/// with the placeholder certificate for the reserved name, the PROXY one
/// after a `PROXY UNKNOWN` header — and no other way; an HTTPS listener
/// that does not speak TLS (while plain HTTP answers) makes the agent
/// report not serving.
#[test]
fn every_listener_is_probed_its_own_way_and_a_broken_https_listener_is_not_serving() {
    use agentconf::ProbeKind::{Http, Https, Proxy};
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let edge = harness::nginx::edge(&harness::nginx::EdgeOptions::new(r.port));
    let (plain, https, proxy) = (edge.process.port, edge.https_port, edge.proxy_port);
    assert!(probe(Http, plain), "{}", edge.error_log());
    assert!(probe(Https, https), "{}", edge.error_log());
    assert!(probe(Proxy, proxy), "{}", edge.error_log());
    // Spoken the wrong way, or nobody there: no.
    assert!(!probe(Https, plain));
    assert!(!probe(Http, https));
    assert!(!probe(Https, proxy), "the PROXY listener needs its header");
    assert!(!probe(Proxy, https));
    assert!(!probe(Http, harness::free_port()));
    // A site's name still gets no certificate from the placeholder: only
    // the reserved host does.
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{https}"))
        .args(["-servername", "a.example.net"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("edgeform placeholder"),
        "the placeholder was served to a site's name"
    );

    // The agent: plain HTTP answers, the "HTTPS" listener is the plain
    // one (it answers, but not with TLS): not serving, never serving.
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "mqtt:\n  url: mqtt://127.0.0.1:{}\nhealth:\n  interval: 30s\n  probe: [\"http://127.0.0.1:{plain}\", \"https://127.0.0.1:{plain}\"]\n",
        broker.port
    );
    let m = Mqtt::connect(broker.port);
    m.subscribe("edgeform/health/edge-1");
    let agent = Agent::start_with(r.port, &[dir.path().join("cache")], &yaml);
    assert!(
        m.wait("edgeform/health/edge-1", 10, |p| serving(p) == Some(false))
            .is_some(),
        "a broken HTTPS listener was not reported:\n{}",
        agent.log()
    );
    assert!(
        m.wait("edgeform/health/edge-1", 3, |p| serving(p) == Some(true))
            .is_none(),
        "serving with a broken HTTPS listener:\n{}",
        agent.log()
    );
}
