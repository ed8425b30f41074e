//! Regional health summaries with real processes: one mosquitto, five real
//! `edgeform-agent`s in two regions. `/route` on an agent of one region
//! picks a node of the other with that node's exact figures; an agent
//! hears about R summaries per interval, not N reports; a kill -9 of a
//! region's summarizer is taken over within the stated bound and routing
//! stays right; the direct health connection a summarizer reads its
//! region on recovers from being dropped, and a summarizer that cannot
//! open it hands the role over.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use edgestate::mqtt::{LockClaim, Summary};
use edgestate::routing::{GeoSettings, Node, RoutingTable, Zone};

use crate::mqtt::metric;
use crate::route::{get, publish};
use crate::util::{Agent, Mqtt};

const INTERVAL_MS: u64 = 500;

/// Region `ra`: a1..a3 in zone `za` (the viewers', 127.0.0.0/8), falling
/// back to zone `zb`: region `rb`, b1 and b2.
fn two_regions() -> RoutingTable {
    let node = |region: &str, zone: &str, name: &str| Node {
        roles: vec!["edge".into()],
        region: region.into(),
        zone: Some(zone.into()),
        public_url: Some(format!("https://{name}.example.net/")),
        location: None,
        addresses: vec!["198.51.100.7".into()],
        playback_session_limit: Some(100),
        playback_bandwidth_kbit: None,
        network_bandwidth_kbit: None,
        drain: false,
    };
    let mut zones = BTreeMap::new();
    zones.insert(
        "za".into(),
        Zone {
            routes: vec!["127.0.0.0/8".into()],
            fallback: Some("zb".into()),
        },
    );
    zones.insert(
        "zb".into(),
        Zone {
            routes: vec![],
            fallback: None,
        },
    );
    let mut nodes = BTreeMap::new();
    for n in ["a1", "a2", "a3"] {
        nodes.insert(n.to_owned(), node("ra", "za", n));
    }
    for n in ["b1", "b2"] {
        nodes.insert(n.to_owned(), node("rb", "zb", n));
    }
    RoutingTable {
        format: 1,
        cluster: "t".into(),
        trusted_proxies: Vec::new(),
        geo: GeoSettings::default(),
        zones,
        nodes,
        router_pool: None,
    }
}

/// Write a node's metric source: its sessions and streams.
fn stats(path: &Path, sessions: u64, streams: &[&str]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::json!({"sessions": sessions, "live": streams}).to_string(),
    )
    .unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

struct Edge {
    agent: Agent,
    http: u16,
    stats: PathBuf,
}

fn start(node: &str, redis: u16, broker: u16, dir: &Path) -> Edge {
    start_as(node, redis, broker, dir, None)
}

/// [`start`], logging in to the broker as `(username, password)`.
fn start_as(node: &str, redis: u16, broker: u16, dir: &Path, login: Option<(&str, &str)>) -> Edge {
    let http = harness::free_port();
    let stats_file = dir.join(format!("{node}.json"));
    // Over the session limit (100): region ra's nodes are never chosen.
    stats(&stats_file, 500, &[]);
    let user = login.map_or(String::new(), |(u, _)| {
        format!("  username: {u}\n  password_env: EDGEFORM_MQTT_PASSWORD\n")
    });
    let env: Vec<(&str, &str)> = login
        .map(|(_, p)| ("EDGEFORM_MQTT_PASSWORD", p))
        .into_iter()
        .collect();
    let agent = Agent::start_named(
        node,
        &format!("\n  url: redis://127.0.0.1:{redis}"),
        &[dir.join(format!("cache-{node}"))],
        &format!(
            "mqtt:\n  url: mqtt://127.0.0.1:{broker}\n{user}health:\n  interval: {INTERVAL_MS}ms\n  \
             play_sessions: {{file: {s}, field: sessions}}\n  streams: {{file: {s}, field: live}}\n\
             http:\n  listen: 127.0.0.1:{http}\nrouting:\n  refresh: 100ms\n",
            s = stats_file.display()
        ),
        &env,
        &[],
    );
    Edge {
        agent,
        http,
        stats: stats_file,
    }
}

/// Every agent's log, named.
fn logs(edges: &BTreeMap<&str, Edge>) -> String {
    edges
        .iter()
        .map(|(n, e)| format!("--- {n}\n{}", e.agent.log()))
        .collect()
}

/// Wait up to `secs` for `f`.
fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool, log: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "{what}\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/route/camb` on `http`: the node chosen and the sessions it was
/// chosen with (from the explained decision).
fn route(http: u16) -> Option<(String, u64)> {
    std::net::TcpStream::connect(("127.0.0.1", http)).ok()?;
    let (status, _, body) = get(http, "/route/camb?format=json", "");
    if status != 302 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let node = v["node"].as_str()?.to_owned();
    let sessions = v["zones"]
        .as_array()?
        .iter()
        .flat_map(|z| z["nodes"].as_array().cloned().unwrap_or_default())
        .find(|c| c["node"] == node.as_str())?["play_sessions"]
        .as_u64()?;
    Some((node, sessions))
}

/// The retained claim of `region`, as a new subscriber reads it.
fn holder(broker: u16, region: &str) -> LockClaim {
    let m = Mqtt::connect(broker);
    let topic = format!("edgeform/summary-lock/{region}");
    m.subscribe(&topic);
    claim(&m, region, 10, |_| true).unwrap_or_else(|| panic!("no claim for {region}"))
}

fn claim(m: &Mqtt, region: &str, secs: u64, f: impl Fn(&LockClaim) -> bool) -> Option<LockClaim> {
    let topic = format!("edgeform/summary-lock/{region}");
    m.wait(&topic, secs, |p| {
        serde_json::from_slice::<LockClaim>(p).is_ok_and(|c| f(&c))
    })
    .and_then(|p| serde_json::from_slice(&p).ok())
}

#[test]
fn summaries_carry_exact_figures_across_regions_and_fail_over() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    publish(r.port, &two_regions(), 1);
    let mut edges: BTreeMap<&str, Edge> = ["a1", "a2", "a3", "b1", "b2"]
        .into_iter()
        .map(|n| (n, start(n, r.port, broker.port, dir.path())))
        .collect();
    stats(&edges["b1"].stats, 5, &["camb"]);
    stats(&edges["b2"].stats, 2, &["camb"]);

    // a1 (region ra) routes to zone zb's least loaded: b2 with 2 sessions,
    // figures that came in rb's summary.
    let a1 = edges["a1"].http;
    until(
        20,
        "a1 routes to b2 (2 sessions)",
        || route(a1) == Some(("b2".into(), 2)),
        &|| logs(&edges),
    );
    stats(&edges["b2"].stats, 9, &["camb"]);
    until(
        10,
        "a1 routes to b1 once b2 reports 9",
        || route(a1) == Some(("b1".into(), 5)),
        &|| {
            format!(
                "{:?}\n{}",
                get(a1, "/route/camb?format=json", ""),
                logs(&edges)
            )
        },
    );

    // One summarizer per region, each a node of its region.
    let holder_a = holder(broker.port, "ra");
    let holder_b = holder(broker.port, "rb");
    assert!(holder_a.node.starts_with('a') && holder_b.node.starts_with('b'));

    // Health traffic per interval: a non-summarizer agent hears the two
    // regions' summaries (2 per interval), not the five reports; all
    // agents together at most (regions + 2) × N per interval (N² = 25
    // before summaries).
    let counts = |edges: &BTreeMap<&str, Edge>| -> BTreeMap<String, u64> {
        edges
            .iter()
            .map(|(n, e)| {
                (
                    (*n).to_owned(),
                    metric(e.http, "edgeform_agent_health_messages_total"),
                )
            })
            .collect()
    };
    // The window: between two of the broker's own counts of PUBLISH
    // packets sent ($SYS, every 10 s by default).
    let sys = Mqtt::connect(broker.port);
    sys.subscribe("$SYS/broker/publish/messages/sent");
    let count = |p: &[u8]| -> u64 { String::from_utf8_lossy(p).trim().parse().unwrap_or(0) };
    let sent_topic = "$SYS/broker/publish/messages/sent";
    // The first one may be the retained value from before: skip it.
    let _ = sys.wait(sent_topic, 12, |_| true);
    let sent0 = sys.wait(sent_topic, 12, |_| true).map(|p| count(&p));
    let (t0, before) = (Instant::now(), counts(&edges));
    let sent1 = sys.wait(sent_topic, 12, |_| true).map(|p| count(&p));
    let (window, after) = (t0.elapsed(), counts(&edges));
    #[allow(clippy::cast_precision_loss)]
    let intervals = window.as_millis() as f64 / INTERVAL_MS as f64;
    let mut total = 0.0;
    for (n, b) in &before {
        #[allow(clippy::cast_precision_loss)]
        let per_interval = (after[n] - b) as f64 / intervals;
        total += per_interval;
        eprintln!("{n}: {per_interval:.2} health messages per interval");
        if *n != holder_a.node && *n != holder_b.node {
            assert!(
                (1.5..=2.6).contains(&per_interval),
                "{n}: {per_interval} messages per interval, expected the 2 regions' summaries"
            );
        }
    }
    eprintln!("all agents: {total:.2} health messages per interval (N = 5, regions = 2)");
    assert!(total <= 4.0 * 5.0, "{total} per interval");
    // The broker: every PUBLISH it sent (reports to the summarizers,
    // summaries to every agent, this test's $SYS), per interval: at most
    // (regions + 2) × N = 20 with a 10 % margin; N² = 25 before summaries.
    let (Some(sent0), Some(sent1)) = (sent0, sent1) else {
        panic!("no $SYS counts from the broker")
    };
    #[allow(clippy::cast_precision_loss)]
    let broker_per_interval = (sent1 - sent0) as f64 / intervals;
    eprintln!(
        "broker: {broker_per_interval:.2} PUBLISH sent per interval (N = 5, regions = 2; N² = 25)"
    );
    assert!(
        broker_per_interval <= 22.0,
        "{broker_per_interval} per interval"
    );

    // kill -9 of rb's summarizer: the other node of rb takes over within
    // the bound (the last will, at once on a closed socket, + 1 s check +
    // one interval, here with 1 s margin), and routing stays right.
    let survivor = if holder_b.node == "b1" { "b2" } else { "b1" };
    stats(&edges[survivor].stats, 4, &["camb"]);
    until(
        10,
        "a1 sees the survivor's 4 sessions",
        || route(a1) == Some((survivor.into(), 4)),
        &|| logs(&edges),
    );
    let m = Mqtt::connect(broker.port);
    m.subscribe("edgeform/summary-lock/rb");
    m.subscribe("edgeform/summary/rb");
    let killed = Instant::now();
    edges.get_mut(holder_b.node.as_str()).unwrap().agent.kill9();
    let taken = claim(&m, "rb", 10, |c| {
        c.node == survivor && c.epoch > holder_b.epoch
    })
    .unwrap_or_else(|| panic!("no takeover of rb\n{}", logs(&edges)));
    let summary_from_survivor = m
        .wait("edgeform/summary/rb", 10, |p| {
            serde_json::from_slice::<Summary>(p)
                .is_ok_and(|s| s.by == survivor && s.epoch == taken.epoch)
        })
        .is_some();
    let failover = killed.elapsed();
    eprintln!(
        "rb failover: claim and first summary {failover:?} after kill -9 of {}",
        holder_b.node
    );
    assert!(
        summary_from_survivor,
        "no summary from {survivor}\n{}",
        logs(&edges)
    );
    assert!(
        failover <= Duration::from_millis(1000 + INTERVAL_MS + 1000),
        "failover took {failover:?}"
    );
    until(
        10,
        "a1 routes to the survivor",
        || route(a1) == Some((survivor.into(), 4)),
        &|| logs(&edges),
    );
    stats(&edges[survivor].stats, 7, &["camb"]);
    until(
        10,
        "a1 sees the survivor's new figure",
        || route(a1) == Some((survivor.into(), 7)),
        &|| logs(&edges),
    );

    // The survivor reads its region's reports on a second connection of
    // its own: the broker drops it (another client takes its id), it
    // comes back with its subscriptions, and new figures flow again.
    take_client_id(broker.port, &format!("edgeform-agent-{survivor}/health"));
    let survivor_log = || edges[survivor].agent.log();
    until(
        10,
        "the survivor's direct health connection is back",
        || survivor_log().contains("the direct health connection is back"),
        &|| logs(&edges),
    );
    assert!(survivor_log().contains("the direct health connection is lost"));
    stats(&edges[survivor].stats, 3, &["camb"]);
    until(
        10,
        "a1 sees the survivor's figure after its reconnection",
        || route(a1) == Some((survivor.into(), 3)),
        &|| logs(&edges),
    );
}

/// Connect as MQTT client `id` and leave cleanly: the broker closes the
/// connection that had that id (MQTT 3.1.1, 3.1.4).
fn take_client_id(port: u16, id: &str) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let id_len = u16::try_from(id.len()).unwrap();
    let mut connect = vec![0x10, u8::try_from(12 + id.len()).unwrap()];
    connect.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60]);
    connect.extend_from_slice(&id_len.to_be_bytes());
    connect.extend_from_slice(id.as_bytes());
    s.write_all(&connect).unwrap();
    let mut connack = [0u8; 4];
    s.read_exact(&mut connack).unwrap();
    assert_eq!(connack, [0x20, 2, 0, 0], "CONNACK as {id}");
    s.write_all(&[0xE0, 0]).unwrap();
}

// A summarizer whose direct health connection cannot be opened (the broker
// takes its login only under its main client id) stops summarizing after
// 2 intervals: another agent of the region claims the role and summarizes
// the region, its own exact figures included, and the first one publishes
// no summary after that.
#[test]
fn a_summarizer_that_cannot_read_its_region_hands_the_role_over() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto_bound_ids(&[("a1", "a1-secret", "edgeform-agent-a1")]);
    let dir = tempfile::tempdir().unwrap();
    publish(r.port, &two_regions(), 1);
    let watch = Mqtt::connect(broker.port);
    watch.subscribe("edgeform/summary-lock/ra");
    watch.subscribe("edgeform/summary/ra");
    // a1 alone first: it claims region ra.
    let a1 = start_as(
        "a1",
        r.port,
        broker.port,
        dir.path(),
        Some(("a1", "a1-secret")),
    );
    let first = claim(&watch, "ra", 10, |c| c.node == "a1")
        .unwrap_or_else(|| panic!("a1 never claimed ra\n{}", a1.agent.log()));
    let a2 = start("a2", r.port, broker.port, dir.path());
    stats(&a2.stats, 3, &["cama"]);
    let logs = || format!("--- a1\n{}--- a2\n{}", a1.agent.log(), a2.agent.log());
    // Over a1's claim (a claim of a2's own at a1's epoch, made before it
    // heard a1's, loses to a1 by name and does not count).
    let taken = claim(&watch, "ra", 15, |c| {
        c.node == "a2" && c.epoch > first.epoch
    });
    assert!(taken.is_some(), "a2 never took ra over\n{}", logs());
    // a2's summaries carry its own report, exactly.
    let by_a2 = watch.wait("edgeform/summary/ra", 10, |p| {
        serde_json::from_slice::<Summary>(p).is_ok_and(|s| {
            s.by == "a2"
                && s.nodes.iter().any(|e| {
                    e.node == "a2"
                        && e.report
                            .as_ref()
                            .is_some_and(|r| r.play_sessions == Some(3))
                })
        })
    });
    assert!(by_a2.is_some(), "no summary of ra by a2\n{}", logs());
    // From now on only a2 summarizes ra.
    let by_a1 = watch.wait("edgeform/summary/ra", 2, |p| {
        serde_json::from_slice::<Summary>(p).is_ok_and(|s| s.by == "a1")
    });
    assert!(by_a1.is_none(), "a1 still summarizes\n{}", logs());
    assert!(
        a1.agent
            .log()
            .contains("mqtt: the direct health connection is lost"),
        "{}",
        logs()
    );
}

// A new routing table moves a node to another region: its agent stops
// following the old region's summarizer claims (unsubscribes) and takes
// part in the new region's election instead — also when it was moved
// while stopped (its persistent session still follows the old claims).
#[test]
fn an_agent_moved_to_another_region_leaves_the_old_regions_claims() {
    let r = harness::redis(&[]);
    let broker = harness::mosquitto_logging_subscriptions();
    let dir = tempfile::tempdir().unwrap();
    let mut table = two_regions();
    publish(r.port, &table, 1);
    let mut a3 = start("a3", r.port, broker.port, dir.path());
    // How many times the broker logged `line` (`<client> <qos> <topic>`
    // for a subscription, `<client> <topic>` for an unsubscription).
    let said = |line: &str| broker.log().lines().filter(|l| l.ends_with(line)).count();
    let logs = || format!("--- broker\n{}--- a3\n{}", broker.log(), a3.agent.log());
    let follows_ra = "edgeform-agent-a3 0 edgeform/summary-lock/ra";
    until(10, "a3 follows ra's claims", || said(follows_ra) > 0, &logs);
    let first = holder(broker.port, "ra");
    assert_eq!(first.node, "a3", "alone in ra, a3 claims it");

    let moved = table.nodes.get_mut("a3").unwrap();
    moved.region = "rb".into();
    moved.zone = Some("zb".into());
    publish(r.port, &table, 2);
    let leaves_ra = "edgeform-agent-a3 edgeform/summary-lock/ra";
    until(10, "a3 leaves ra's claims", || said(leaves_ra) > 0, &logs);
    let follows_rb = "edgeform-agent-a3 0 edgeform/summary-lock/rb";
    until(10, "a3 follows rb's claims", || said(follows_rb) > 0, &logs);
    let m = Mqtt::connect(broker.port);
    m.subscribe("edgeform/summary-lock/rb");
    assert!(
        claim(&m, "rb", 10, |c| c.node == "a3").is_some(),
        "a3, alone in rb, claims it\n{}",
        logs()
    );

    // Moved back to ra while stopped: the new process starts in ra, and
    // on connecting to its kept session it leaves rb's claims. (A kept
    // session may have sent such an unsubscription at the first start
    // too: counted from here.)
    a3.agent.terminate();
    let moved = table.nodes.get_mut("a3").unwrap();
    moved.region = "ra".into();
    moved.zone = Some("za".into());
    publish(r.port, &table, 3);
    let leaves_rb = "edgeform-agent-a3 edgeform/summary-lock/rb";
    let (left_before, followed_before) = (said(leaves_rb), said(follows_ra));
    a3.agent.spawn();
    let logs = || format!("--- broker\n{}--- a3\n{}", broker.log(), a3.agent.log());
    until(
        10,
        "the restarted a3 leaves rb's claims",
        || said(leaves_rb) > left_before,
        &logs,
    );
    until(
        10,
        "the restarted a3 follows ra's claims",
        || said(follows_ra) > followed_before,
        &logs,
    );
}

/// One retained message larger than any of edgeform's clients takes, on
/// a topic every agent subscribes to (`summary/+`, which the shipped ACL
/// lets any agent write): the broker refuses it (`max_packet_size`, set in
/// every shipped broker configuration and in the harness's), so no agent's
/// connection ends and routing goes on. Without the broker's limit, every
/// agent's connection ended at each reconnection, cluster-wide.
#[test]
fn an_oversized_retained_summary_is_refused_by_the_broker_and_no_agent_drops() {
    let limit = edgestate::mqtt::MAX_PACKET_BYTES;
    assert_eq!(harness::MOSQUITTO_MAX_PACKET, limit);
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/mosquitto");
    for file in ["central.conf", "regional.conf"] {
        let text = std::fs::read_to_string(packaging.join(file)).unwrap();
        let want = format!("max_packet_size {limit}");
        assert!(text.lines().any(|l| l == want), "{file}: no `{want}`");
    }
    let r = harness::redis(&[]);
    let broker = harness::mosquitto();
    let dir = tempfile::tempdir().unwrap();
    publish(r.port, &two_regions(), 1);
    let edges: BTreeMap<&str, Edge> = ["a1", "b1"]
        .into_iter()
        .map(|n| (n, start(n, r.port, broker.port, dir.path())))
        .collect();
    stats(&edges["b1"].stats, 2, &["camb"]);
    let a1 = edges["a1"].http;
    until(
        20,
        "a1 routes to b1",
        || route(a1) == Some(("b1".into(), 2)),
        &|| logs(&edges),
    );

    let huge = vec![b'{'; limit];
    assert!(
        !harness::bridge::publish_retained(broker.port, "edgeform/summary/zz", &huge),
        "the broker took a {limit}-byte payload"
    );
    assert_eq!(
        harness::bridge::retained(broker.port, "edgeform/summary/zz", Duration::from_secs(1)),
        None
    );
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        for (name, e) in &edges {
            assert_eq!(
                metric(e.http, "edgeform_agent_mqtt_connected"),
                1,
                "{name} lost the broker\n{}",
                logs(&edges)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(route(a1), Some(("b1".into(), 2)), "{}", logs(&edges));
}
