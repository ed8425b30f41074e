//! Regional brokers bridged to a central one (packaging/mosquitto/, as
//! shipped, through `harness::bridge`): three real mosquittos (central, eu,
//! us), three real `edgeform-agent` processes per region on their region's
//! broker, each with its own real Redis; the control side (`edgeform
//! status`, `exec`, `purge --wait`) on the central broker only.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::Process;
use harness::bridge::{Bridged, start_bridged};

use crate::util::{Fixture, edgeform, stderr, stdout};

const REGIONS: [&str; 2] = ["eu", "us"];
const PER_REGION: usize = 3;
/// The agents' health interval, seconds.
const INTERVAL_S: u64 = 1;
/// A viewer of each region's zone (by X-Forwarded-For, the proxy
/// 127.0.0.1 trusted).
const VIEWER: [(&str, &str); 2] = [("eu", "192.0.2.7"), ("us", "198.51.100.7")];

/// The `edgeform-agent` binary, built next to `edgeform`
/// (`cargo build -p agent --bins`: scripts/test does).
fn agent_binary() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_edgeform")).with_file_name("edgeform-agent");
    assert!(
        p.is_file(),
        "{} is missing: `cargo build -p agent --bins` first (scripts/test does)",
        p.display()
    );
    p
}

struct Node {
    name: String,
    http: u16,
    agent: Process,
    _redis: Process,
}

struct Cluster {
    bridged: Bridged,
    repo: Fixture,
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

fn node_yaml(name: &str, region: &str, i: usize, redis: u16) -> String {
    let lon = if region == "eu" { 4.0 } else { -100.0 };
    format!(
        "name: {name}\nroles: [edge]\nregion: {region}\nzone: {region}\n\
         public_url: https://{name}.example.net\nlocation: {{lat: 45.0, lon: {lon}}}\n\
         addresses: [203.0.113.{}]\nplayback_session_limit: 100\n\
         redis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
         cache: {{key: \"$scheme://$host$request_uri\"}}\n",
        10 + i
    )
}

impl Cluster {
    fn up() -> Cluster {
        let bridged = start_bridged(&REGIONS, "edgeform");
        let dir = tempfile::tempdir().unwrap();
        let streams = dir.path().join("streams.json");
        std::fs::write(&streams, r#"{"live": ["cam1"], "play": 0}"#).unwrap();
        let mut files: Vec<(String, String)> = vec![
            (
                "cluster.yaml".into(),
                format!(
                    "name: bridged\ntrusted_proxies: [127.0.0.1/32]\n\
                     mqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n",
                    bridged.central.port
                ),
            ),
            (
                "zones/eu.yaml".into(),
                "name: eu\nroutes: [192.0.2.0/24]\nfallback: us\n".into(),
            ),
            (
                "zones/us.yaml".into(),
                "name: us\nroutes: [198.51.100.0/24]\nfallback: eu\n".into(),
            ),
            (
                "sites/a.yaml".into(),
                "host: a.example.com\norigin: http://192.0.2.1\n".into(),
            ),
        ];
        let mut redis = Vec::new();
        let mut i = 0;
        for region in REGIONS {
            for n in 1..=PER_REGION {
                let name = format!("{region}-{n}");
                let r = harness::redis(&[]);
                files.push((
                    format!("nodes/{name}.yaml"),
                    node_yaml(&name, region, i, r.port),
                ));
                redis.push((name, region, r));
                i += 1;
            }
        }
        let docs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        let repo = Fixture::empty();
        repo.write_all(&docs);
        let out = edgeform(repo.path(), &["apply", "--yes"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            stdout(&out),
            stderr(&out)
        );
        let nodes = redis
            .into_iter()
            .map(|(name, region, r)| {
                let http = harness::free_port();
                let agent = start_agent(
                    dir.path(),
                    &name,
                    region,
                    r.port,
                    bridged.region(region).port,
                    http,
                    &streams,
                );
                Node {
                    name,
                    http,
                    agent,
                    _redis: r,
                }
            })
            .collect();
        Cluster {
            bridged,
            repo,
            nodes,
            _dir: dir,
        }
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.name == name).unwrap()
    }

    /// `edgeform status --format json` on the central broker: node → its
    /// entry.
    fn status(&self) -> serde_json::Map<String, serde_json::Value> {
        let out = edgeform(self.repo.path(), &["status", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out))
            .unwrap_or_else(|_| panic!("{}{}", stdout(&out), stderr(&out)));
        v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["node"].as_str().unwrap().to_owned(), n.clone()))
            .collect()
    }

    /// Wait (20 s at most) until the central's status satisfies `ok`.
    fn wait_status(
        &self,
        what: &str,
        ok: impl Fn(&serde_json::Map<String, serde_json::Value>) -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status();
            if ok(&s) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {s:?}\ncentral:\n{}",
                self.bridged.central.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn exec(&self, node: &str, word: &str) -> std::process::Output {
        edgeform(
            self.repo.path(),
            &[
                "exec",
                "--node",
                node,
                "--action",
                "echo",
                "--arg",
                &format!("word={word}"),
                "--wait",
                "20",
            ],
        )
    }

    /// `/route/cam1` asked of `node`'s agent for a viewer of `zone`:
    /// the decision as JSON.
    fn route(&self, node: &str, zone: &str) -> serde_json::Value {
        let viewer = VIEWER.iter().find(|(z, _)| *z == zone).unwrap().1;
        let a = crate::util::exchange(
            self.node(node).http,
            &format!(
                "GET /route/cam1?format=json HTTP/1.1\r\nHost: x\r\n\
                 X-Forwarded-For: {viewer}\r\nConnection: close\r\n\r\n"
            ),
            Duration::from_secs(5),
        );
        serde_json::from_str(&a.body).unwrap_or_else(|_| panic!("{}: {a:?}", a.status))
    }

    /// Wait (20 s at most) until `node`'s `/route` for a viewer of
    /// `zone` satisfies `ok`; the last decision.
    fn wait_route(
        &self,
        node: &str,
        zone: &str,
        what: &str,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.route(node, zone);
            if ok(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {v}\n{}",
                self.node(node).agent.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn start_agent(
    dir: &Path,
    name: &str,
    region: &str,
    redis: u16,
    broker: u16,
    http: u16,
    streams: &Path,
) -> Process {
    let cache = dir.join(format!("{name}.cache"));
    let state = dir.join(format!("{name}.state"));
    std::fs::create_dir_all(&cache).unwrap();
    let yaml = format!(
        "node: {name}\nregion: {region}\nredis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
         cache: {{dirs: [\"{}\"], levels: \"1:2\", key: $scheme://$host$request_uri}}\n\
         http: {{listen: \"127.0.0.1:{http}\"}}\n\
         mqtt: {{url: \"mqtt://127.0.0.1:{broker}\"}}\n\
         health: {{interval: {INTERVAL_S}s, streams: {{file: \"{streams}\", field: live}}, play_sessions: {{file: \"{streams}\", field: play}}}}\n\
         state_dir: {}\n\
         actions:\n  echo:\n    argv: [/usr/bin/echo, said, \"{{word}}\"]\n    args: {{word: \"[a-z]+\"}}\n",
        cache.display(),
        state.display(),
        streams = streams.display(),
    );
    let conf = dir.join(format!("{name}.agent.yaml"));
    std::fs::write(&conf, yaml).unwrap();
    harness::program(
        &agent_binary(),
        vec!["--config".into(), conf.display().to_string()],
        Ipv4Addr::LOCALHOST,
        http,
    )
}

fn online(s: &serde_json::Map<String, serde_json::Value>, node: &str) -> bool {
    s.get(node).is_some_and(|n| n["online"] == true)
}

fn fresh(s: &serde_json::Map<String, serde_json::Value>, node: &str) -> bool {
    online(s, node)
        && s[node]["commit"].is_string()
        && s[node]["age_s"].as_u64().is_some_and(|a| a <= 3)
}

/// Whether the node a `/route` decision chose has fresh health (the
/// explanation marks a node whose last report is too old `stale`).
fn chosen_is_fresh(v: &serde_json::Value) -> bool {
    let Some(chosen) = v["node"].as_str() else {
        return false;
    };
    v["zones"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|z| z["nodes"].as_array().into_iter().flatten())
        .any(|n| {
            n["node"] == chosen
                && n["eligible"] == true
                && n.get("stale").is_none_or(|s| s == false)
        })
}

/// A `$SYS` counter of the broker on `port`.
fn sys_counter(port: u16, name: &str) -> u64 {
    let topic = format!("$SYS/broker/{name}");
    let v = harness::bridge::retained(port, &topic, Duration::from_secs(3))
        .unwrap_or_else(|| panic!("no {topic}"));
    String::from_utf8_lossy(&v).trim().parse().unwrap()
}

/// The `$SYS` counters the rates are read from: every packet sent,
/// PUBLISH sent, every packet received.
const COUNTERS: [&str; 3] = [
    "messages/sent",
    "publish/messages/sent",
    "messages/received",
];

/// What the broker on `port` sends and receives per second, averaged over
/// `span` (the `COUNTERS`, which the broker refreshes every second; the
/// sampler's own reads count, one PUBLISH each).
fn rates(port: u16, span: Duration) -> [f64; COUNTERS.len()] {
    let before = COUNTERS.map(|n| sys_counter(port, n));
    std::thread::sleep(span);
    let after = COUNTERS.map(|n| sys_counter(port, n));
    let s = span.as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    std::array::from_fn(|i| after[i].saturating_sub(before[i]) as f64 / s)
}

/// Whether a region's summary reaches the other region's broker (the
/// compact health of every region, published by an elected agent):
/// when it does, an agent routes a viewer to another region's node.
fn summaries_cross(b: &Bridged) -> bool {
    harness::bridge::retained(
        b.region("eu").port,
        "edgeform/summary/us",
        Duration::from_millis(500),
    )
    .is_some()
}

#[test]
fn three_bridged_brokers_carry_health_status_commands_and_purges() {
    let mut c = Cluster::up();
    let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();

    // Every node's health and status reach the central broker.
    c.wait_status("every node reports to the central", |s| {
        names.iter().all(|n| fresh(s, n))
    });
    let out = edgeform(c.repo.path(), &["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("6/6 online"), "{}", stdout(&out));

    // What the brokers send and receive at idle (after the counters,
    // refreshed every second, have counted the status calls above), both
    // sampled at once.
    std::thread::sleep(Duration::from_secs(2));
    let span = Duration::from_secs(5);
    let ports = [
        ("central", c.bridged.central.port),
        ("eu", c.bridged.region("eu").port),
    ];
    let sampled: Vec<_> = ports
        .map(|(name, port)| (name, std::thread::spawn(move || rates(port, span))))
        .into_iter()
        .map(|(name, t)| (name, t.join().unwrap()))
        .collect();
    // Between the two reads of one counter the sampler itself reads
    // `COUNTERS.len()` times: one PUBLISH each.
    #[allow(clippy::cast_precision_loss)]
    let own = COUNTERS.len() as f64 / span.as_secs_f64();
    for (name, [all, sent, received]) in sampled {
        eprintln!(
            "idle, 2 regions x {PER_REGION} agents, health every {INTERVAL_S}s: the {name} broker \
             sends {all:.1} packets/s ({sent:.1} PUBLISH/s, {:.1} without the sampler's own), \
             receives {received:.1} packets/s",
            (sent - own).max(0.0)
        );
    }

    // Each region routes on its own health.
    for (node, zone) in [("eu-1", "eu"), ("us-2", "us")] {
        let v = c.wait_route(node, zone, "a viewer of its zone", |v| {
            v["node"].as_str().is_some_and(|n| n.starts_with(zone))
        });
        assert!(chosen_is_fresh(&v), "{v}");
    }
    // A viewer of the other region: its nodes when the summaries cross
    // (each region's compact health, through the bridges); else the
    // agent knows only its own region's nodes and the zone's fallback
    // (eu) answers.
    let across = summaries_cross(&c.bridged);
    eprintln!("summaries cross the bridges: {across}");
    let want = if across { "us-" } else { "eu-" };
    c.wait_route("eu-1", "us", "a viewer of the other region", |v| {
        v["node"].as_str().is_some_and(|n| n.starts_with(want))
    });

    // exec and purge --wait across the bridges. A command crosses to its
    // node's region only, and reaches it once.
    let watches: Vec<_> = REGIONS
        .iter()
        .map(|r| {
            let port = c.bridged.region(r).port;
            harness::bridge::watch(port, &["edgeform/cmd/#", "edgeform/region/#"])
        })
        .collect();
    for node in ["eu-2", "us-3"] {
        let out = c.exec(node, "hi");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(stdout(&out).contains("said hi"), "{}", stdout(&out));
    }
    for (region, watch) in REGIONS.iter().zip(watches) {
        let want = if *region == "eu" { "eu-2" } else { "us-3" };
        assert_eq!(
            watch.topics(),
            [format!("edgeform/cmd/{want}")],
            "what region {region}'s broker carried on the command topics"
        );
    }
    let out = edgeform(
        c.repo.path(),
        &[
            "purge",
            "--site",
            "a.example.com",
            "--url",
            "/v/a.mp4",
            "--wait",
            "20",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("on 6 node(s)"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );

    // kill -9 of an agent: its last will (offline) reaches the central.
    c.node_mut("eu-3").agent.kill();
    c.wait_status("eu-3's last will at the central", |s| {
        !online(s, "eu-3") && online(s, "eu-1")
    });

    // The central stopped: both regions keep routing on their own health,
    // fresh (their agents still reach their broker).
    c.bridged.central.stop();
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_S + 1));
    for (node, zone) in [("eu-1", "eu"), ("us-1", "us")] {
        c.wait_route(node, zone, "routing on its own region's health", |v| {
            v["node"].as_str().is_some_and(|n| n.starts_with(zone)) && chosen_is_fresh(v)
        });
    }
    // A crash while the bridge is down: the will waits in the region's
    // broker, and reaches the central once it is back.
    c.node_mut("us-3").agent.kill();
    std::thread::sleep(Duration::from_secs(1));
    c.bridged.central.restart();
    for r in REGIONS {
        c.bridged.wait_bridge(r, true);
    }
    c.wait_status("the central catches up", |s| {
        !online(s, "us-3")
            && !online(s, "eu-3")
            && ["eu-1", "eu-2", "us-1", "us-2"].iter().all(|n| fresh(s, n))
    });
    let out = c.exec("us-1", "back");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );

    // One region cut off (its broker without the bridge): a command for
    // it waits on the central and runs when the bridge is back.
    c.bridged.cut("eu");
    c.bridged.wait_bridge("eu", false);
    c.wait_route("eu-2", "eu", "eu routes on its own while cut off", |v| {
        v["node"].as_str().is_some_and(|n| n.starts_with("eu")) && chosen_is_fresh(v)
    });
    // A short wait for a node of the cut region: exec says why no result
    // came (the central's status of the node is from before the cut).
    let out = edgeform(
        c.repo.path(),
        &[
            "exec", "--node", "eu-2", "--action", "echo", "--arg", "word=cut", "--wait", "1",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("region eu's bridge to this broker (edgeform-bridge-eu) is down"),
        "{}",
        stderr(&out)
    );
    let waiting = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .current_dir(c.repo.path())
        .env("NO_COLOR", "1")
        .args([
            "exec",
            "--node",
            "eu-1",
            "--action",
            "echo",
            "--arg",
            "word=queued",
            "--wait",
            "30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    c.bridged.restore("eu");
    let out = waiting.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}\ncentral:\n{}\neu:\n{}\neu-1's agent:\n{}",
        stdout(&out),
        stderr(&out),
        c.bridged.central.log(),
        c.bridged.region("eu").log(),
        c.node("eu-1").agent.log()
    );
    assert!(stdout(&out).contains("said queued"), "{}", stdout(&out));
    c.wait_status("eu reports again after the cut", |s| {
        ["eu-1", "eu-2"].iter().all(|n| fresh(s, n))
    });
}

/// The retained value of `topic` on the broker at `port` becomes `want`
/// within 10 s.
fn wait_retained(port: u16, topic: &str, want: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = harness::bridge::retained(port, topic, Duration::from_millis(300));
        if got.as_deref() == Some(want.as_bytes()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {topic} is {:?}, not {want}",
            got.map(|g| String::from_utf8_lossy(&g).into_owned())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Summaries and their election claims cross both ways, retained, without
/// a loop; one published while its region is cut off reaches the central
/// when the bridge is back (the central ends with the newest), and the
/// region's next one is everywhere. (Under a prefix of its own, so no
/// agent reads these.)
#[test]
fn summaries_cross_both_ways_without_loops_and_catch_up_after_a_cut() {
    let mut b = start_bridged(&REGIONS, "bridgecheck");
    let (eu, us) = (b.region("eu").port, b.region("us").port);
    let central = b.central.port;
    for (port, topic, value) in [
        (eu, "bridgecheck/summary/eu", "eu-1"),
        (us, "bridgecheck/summary-lock/us", "us-claim-1"),
    ] {
        assert!(harness::bridge::publish_retained(
            port,
            topic,
            value.as_bytes()
        ));
    }
    for port in [central, eu, us] {
        wait_retained(port, "bridgecheck/summary/eu", "eu-1", "eu's summary");
        wait_retained(
            port,
            "bridgecheck/summary-lock/us",
            "us-claim-1",
            "us's claim",
        );
    }
    // No loop: after the crossing, the central sends nothing more than
    // the sampler's own reads.
    std::thread::sleep(Duration::from_secs(2));
    let [_, sent, _] = rates(central, Duration::from_secs(2));
    #[allow(clippy::cast_precision_loss)]
    let own = COUNTERS.len() as f64 / 2.0;
    assert!(
        sent <= own + 0.5,
        "the central sends {sent} PUBLISH/s at rest"
    );
    // What is not listed does not cross.
    assert!(harness::bridge::publish_retained(
        eu,
        "bridgecheck/other/eu",
        b"x"
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        harness::bridge::retained(central, "bridgecheck/other/eu", Duration::from_millis(300)),
        None
    );

    // eu cut off: its next summary waits in its broker for the bridge.
    b.cut("eu");
    b.wait_bridge("eu", false);
    assert!(harness::bridge::publish_retained(
        eu,
        "bridgecheck/summary/eu",
        b"eu-2"
    ));
    b.restore("eu");
    for port in [central, us] {
        wait_retained(port, "bridgecheck/summary/eu", "eu-2", "caught up");
    }
    // (The region's broker may hold the central's older copy for a moment:
    // the retained echo of a reconnection, docs/operations.md.) Its next
    // summary is everywhere.
    assert!(harness::bridge::publish_retained(
        eu,
        "bridgecheck/summary/eu",
        b"eu-3"
    ));
    for port in [central, eu, us] {
        wait_retained(port, "bridgecheck/summary/eu", "eu-3", "the next one");
    }
}
