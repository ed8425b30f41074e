//! `GET /route/<stream>` over real HTTP, the table from a real Redis.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use edgestate::routing::{GeoSettings, Node, RoutingTable, Zone};

use crate::util::con;

pub fn table(url: &str) -> RoutingTable {
    let node = |zone: &str, public_url: Option<&str>| Node {
        roles: vec!["edge".into()],
        region: "eu".into(),
        zone: Some(zone.into()),
        public_url: public_url.map(str::to_owned),
        location: None,
        addresses: vec!["198.51.100.7".into(), "10.0.0.7".into()],
        playback_session_limit: Some(100),
        playback_bandwidth_kbit: None,
        network_bandwidth_kbit: None,
        drain: false,
    };
    let mut zones = BTreeMap::new();
    zones.insert(
        "eu".into(),
        Zone {
            routes: vec!["192.0.2.0/24".into(), "127.0.0.0/8".into()],
            fallback: Some("backup".into()),
        },
    );
    zones.insert(
        "backup".into(),
        Zone {
            routes: vec![],
            fallback: None,
        },
    );
    let mut nodes = BTreeMap::new();
    nodes.insert("edge-a".into(), node("eu", Some(url)));
    nodes.insert("edge-b".into(), node("backup", None));
    RoutingTable {
        format: 1,
        cluster: "t".into(),
        trusted_proxies: vec![],
        geo: GeoSettings {
            tie_km: 100.0,
            buckets: vec![],
            default_weight: 1,
            max_fails: 3,
            fail_timeout_s: 30,
        },
        zones,
        nodes,
        router_pool: None,
    }
}

pub fn publish(port: u16, t: &RoutingTable, generation: u64) {
    let mut c = con(port);
    redis::cmd("SET")
        .arg("edgeform:routing")
        .arg(serde_json::to_string(t).unwrap())
        .exec(&mut c)
        .unwrap();
    redis::cmd("HSET")
        .arg("edgeform:meta")
        .arg("generation")
        .arg(generation)
        .exec(&mut c)
        .unwrap();
}

/// A raw HTTP/1.1 GET; returns (status, headers lower-cased, body).
pub fn get(port: u16, path: &str, extra: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn write_health(path: &std::path::Path, a_online: bool, b_online: bool) {
    let h = serde_json::json!({"nodes": {
        "edge-a": {"online": a_online, "play_sessions": 3, "out_kbit": 10, "streams": ["cam1"]},
        "edge-b": {"online": b_online, "play_sessions": 1, "out_kbit": 10, "streams": []},
    }});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, h.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub fn wait_for(mut f: impl FnMut() -> bool, what: &str, log: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn route_over_http_with_real_redis() {
    let mut r = harness::redis(&[]);
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    write_health(&health, true, true);
    publish(r.port, &table("https://a.example.net"), 1);
    let http = harness::free_port();
    let agent = crate::util::Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "http:\n  listen: 127.0.0.1:{http}\n  proxy_url: https://router.example.net/proxy/{{node}}/{{stream}}\n\
             routing:\n  health_file: {}\n  refresh: 100ms\n",
            health.display()
        ),
    );
    let log = || agent.log();
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/healthz", "").0 == 200
        },
        "agent up",
        &log,
    );

    // The client is 127.0.0.1: zone eu, edge-a, redirect to its payload URL.
    let (status, head, _) = get(http, "/route/cam1", "");
    assert_eq!(status, 302, "{head}");
    assert!(
        head.contains("location: https://a.example.net/cam1"),
        "{head}"
    );
    // JSON, by query or by Accept: the chain, nodes by load, private addresses left out.
    for (path, extra) in [
        ("/route/cam1?format=json", ""),
        ("/route/cam1", "Accept: application/json\r\n"),
    ] {
        let (status, _, body) = get(http, path, extra);
        assert_eq!(status, 302);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["node"], "edge-a");
        assert_eq!(v["chain"], serde_json::json!(["eu", "backup"]));
        assert_eq!(
            v["zones"][0]["nodes"][0]["addresses"],
            serde_json::json!(["198.51.100.7"])
        );
        assert_eq!(v["generation"], 1);
    }
    // Unknown stream: 404.
    assert_eq!(get(http, "/route/nope", "").0, 404);
    // edge-a goes offline (health file rewritten): fallback to backup, proxied.
    write_health(&health, false, true);
    wait_for(
        || {
            get(http, "/route/cam1", "")
                .1
                .contains("location: https://router.example.net/proxy/edge-b/cam1")
        },
        "proxy",
        &log,
    );
    // Everything offline: 503 with Retry-After.
    write_health(&health, false, false);
    wait_for(|| get(http, "/route/cam1", "").0 == 503, "503", &log);
    assert!(get(http, "/route/cam1", "").1.contains("retry-after: 5"));
    // A new generation is picked up without a restart.
    write_health(&health, true, true);
    publish(r.port, &table("https://a2.example.net"), 2);
    wait_for(
        || {
            get(http, "/route/cam1", "")
                .1
                .contains("location: https://a2.example.net/cam1")
        },
        "new generation",
        &log,
    );
    // Redis goes away: the last good table keeps answering.
    r.kill();
    std::thread::sleep(Duration::from_millis(400));
    for _ in 0..5 {
        let (status, head, _) = get(http, "/route/cam1", "");
        assert_eq!(status, 302, "{head}");
    }
    // Outside every route (restricted): 403. Through a fresh table whose
    // routes exclude 127.0.0.0/8, published to a new Redis on the same port.
    let r2 = harness::redis_on(r.port, &[]);
    let mut t = table("https://a2.example.net");
    t.zones.get_mut("eu").unwrap().routes = vec!["192.0.2.0/24".into()];
    publish(r2.port, &t, 3);
    wait_for(
        || get(http, "/route/cam1", "").0 == 403,
        "403 outside routes",
        &log,
    );
}

/// An agent with `t` and a health file where edge-a carries `streams`;
/// returns (agent, http port, health dir).
fn agent_with(
    r: &harness::Process,
    t: &RoutingTable,
    streams: &[&str],
) -> (crate::util::Agent, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    let h = serde_json::json!({"nodes": {
        "edge-a": {"online": true, "play_sessions": 3, "out_kbit": 10, "streams": streams},
        "edge-b": {"online": true, "play_sessions": 1, "out_kbit": 10, "streams": []},
    }});
    std::fs::write(&health, h.to_string()).unwrap();
    publish(r.port, t, 1);
    let http = harness::free_port();
    let agent = crate::util::Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "http:\n  listen: 127.0.0.1:{http}\n  proxy_url: https://router.example.net/proxy/{{node}}/{{stream}}\n\
             routing:\n  health_file: {}\n  refresh: 100ms\n",
            health.display()
        ),
    );
    let log = || agent.log();
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/healthz", "").0 == 200
        },
        "agent up",
        &log,
    );
    (agent, http, dir)
}

/// Behind a trusted proxy that appends its own `X-Forwarded-For` line
/// (HAProxy), the client is the last address of the last line: a forged
/// first line changes nothing.
#[test]
fn two_xff_lines_the_last_address_wins() {
    let r = harness::redis(&[]);
    let mut t = table("https://a.example.net");
    t.trusted_proxies = vec!["127.0.0.0/8".into()];
    t.zones.get_mut("eu").unwrap().routes = vec!["192.0.2.0/24".into()];
    let (_agent, http, _dir) = agent_with(&r, &t, &["cam1"]);
    // Forged in-route address first, the proxy's line (outside) last: 403.
    let forged = "X-Forwarded-For: 192.0.2.5\r\nX-Forwarded-For: 203.0.113.9\r\n";
    let (status, head, _) = get(http, "/route/cam1", forged);
    assert_eq!(status, 403, "{head}");
    // The other way round: the proxy saw a client inside the route.
    let real = "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-For: 10.1.1.1, 192.0.2.5\r\n";
    let (status, head, _) = get(http, "/route/cam1", real);
    assert_eq!(status, 302, "{head}");
    // The explanation names the address it used.
    let (_, _, body) = get(http, "/route/cam1?format=json", forged);
    assert!(
        body.contains("203.0.113.9") && !body.contains("entry 192.0.2.5"),
        "{body}"
    );
}

/// A viewer's plain `GET /route/<stream>` is answered by the quick path;
/// the same request with a query the answer ignores goes through the
/// routes. Both give the same status, headers and body — a redirect, the
/// proxy URL, an unknown stream, with and without `X-Forwarded-For`.
#[test]
fn the_quick_path_answers_exactly_as_the_routes() {
    let r = harness::redis(&[]);
    let mut t = table("https://a.example.net");
    t.trusted_proxies = vec!["127.0.0.0/8".into()];
    let (_agent, http, _dir) = agent_with(&r, &t, &["cam1"]);
    // The header lines, without the date, in any order.
    let strip_date = |head: &str| {
        let mut lines: Vec<String> = head
            .lines()
            .filter(|l| !l.starts_with("date:"))
            .map(str::to_owned)
            .collect();
        lines.sort_unstable();
        lines
    };
    let mut statuses = Vec::new();
    for stream in ["cam1", "cam2", "nothing-carries-this"] {
        for xff in [
            "",
            "X-Forwarded-For: 192.0.2.5\r\n",
            "X-Forwarded-For: 203.0.113.9\r\n",
        ] {
            let quick = get(http, &format!("/route/{stream}"), xff);
            let routed = get(http, &format!("/route/{stream}?via=routes"), xff);
            assert_eq!(quick.0, routed.0, "{stream} {xff}");
            assert_eq!(
                strip_date(&quick.1),
                strip_date(&routed.1),
                "{stream} {xff}"
            );
            assert_eq!(quick.2, routed.2, "{stream} {xff}");
            statuses.push(quick.0);
        }
    }
    // The cases are not all one answer: a redirect and a refusal at least.
    assert!(
        statuses.contains(&302) && statuses.iter().any(|s| *s != 302),
        "{statuses:?}"
    );
}

/// The `Location` header is percent-encoded: a stream name with spaces,
/// non-ASCII or a `/` cannot change the URL (and is not dropped).
#[test]
fn location_is_percent_encoded() {
    let r = harness::redis(&[]);
    let t = table("https://a.example.net/live/");
    let (_agent, http, _dir) = agent_with(&r, &t, &["cam é/x?y"]);
    let (status, head, _) = get(http, "/route/cam%20%C3%A9%2Fx%3Fy", "");
    assert_eq!(status, 302, "{head}");
    assert!(
        head.contains("location: https://a.example.net/live/cam%20%c3%a9%2fx%3fy\r\n"),
        "{head}"
    );
}

/// A stream named `.` or `..` stays one segment of the payload URL (a
/// bare `..` would climb out of it once resolved); a payload URL no header
/// can carry (a hostile table) is a 502, never a 302 without `Location`.
#[test]
fn dot_streams_stay_inside_the_payload_url_and_a_bad_url_is_a_502() {
    let r = harness::redis(&[]);
    let t = table("https://a.example.net/live/");
    let (_agent, http, _dir) = agent_with(&r, &t, &["..", "."]);
    for (path, want) in [("/route/%2E%2E", "/live/%2e%2e"), ("/route/.", "/live/%2e")] {
        let (status, head, _) = get(http, path, "");
        assert_eq!(status, 302, "{path}: {head}");
        assert!(
            head.contains(&format!("location: https://a.example.net{want}\r\n")),
            "{path}: {head}"
        );
    }
    let t = table("https://a.example.net/\r\nSet-Cookie: x=1");
    publish(r.port, &t, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, head, _) = get(http, "/route/..", "");
        if status == 502 {
            assert!(!head.contains("set-cookie"), "{head}");
            assert!(!head.contains("location"), "{head}");
            break;
        }
        assert!(Instant::now() < deadline, "{status}: {head}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const HEADER_TIMEOUT_SECS: u64 = agent::http::HEADER_TIMEOUT.as_secs();

/// Under `ulimit -n 1024` (hard), 1,100 idle connections do not stop
/// `/route`: the connection cap (below the descriptor limit) closes the
/// oldest ones, and an idle connection is closed after the header-read
/// timeout anyway.
#[test]
fn idle_connections_do_not_stop_route() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    // This test process needs descriptors for 1,100 client sockets.
    let mut limit = getrlimit(Resource::Nofile);
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum)
        && soft < 4096
    {
        limit.current = Some(hard.min(8192));
        setrlimit(Resource::Nofile, limit).unwrap();
    }
    let r = harness::redis(&[]);
    let (agent, http, _dir) = agent_limited(&r, 1024);
    let log = || agent.log();
    let first = TcpStream::connect(("127.0.0.1", http)).unwrap();
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..1100 {
        idle.push(TcpStream::connect(("127.0.0.1", http)).unwrap());
    }
    // A little after the flood, /route still answers at once.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        let asked = Instant::now();
        let (status, head, _) = get(http, "/route/cam1", "");
        assert_eq!(status, 302, "{head}\n{}", agent.log());
        assert!(asked.elapsed() < Duration::from_secs(2));
    }
    assert!(log().contains("max_connections=896"), "{}", log());
    // The oldest idle connection was closed by the agent (EOF), and every
    // idle one is within the header-read timeout.
    let mut first = first;
    first
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(first.read(&mut buf).unwrap_or(0), 0);
    let last = idle.last_mut().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let waited = Instant::now();
    let got = last.read(&mut buf);
    eprintln!(
        "idle connections: last idle connection: {got:?} after {:?} (flood started {:?} ago)",
        waited.elapsed(),
        started.elapsed()
    );
    assert_eq!(got.unwrap_or(1), 0, "idle connection kept open");
    assert!(waited.elapsed() < Duration::from_secs(HEADER_TIMEOUT_SECS + 5));
    let (_, _, metrics) = get(http, "/metrics", "");
    assert!(
        metrics.contains("edgeform_agent_http_evicted_total"),
        "{metrics}"
    );
}

/// An agent routing `cam1` on a free port under `prlimit --nofile=N:N`,
/// answering `/route` already.
fn agent_limited(
    r: &harness::Process,
    nofile: u32,
) -> (crate::util::Agent, u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    write_health(&health, true, true);
    publish(r.port, &table("https://a.example.net"), 1);
    let http = harness::free_port();
    let limit = format!("--nofile={nofile}:{nofile}");
    let agent = crate::util::Agent::start_wrapped(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "http:\n  listen: 127.0.0.1:{http}\n  proxy_url: https://router.example.net/p/{{node}}/{{stream}}\n\
             routing:\n  health_file: {}\n  refresh: 100ms\n",
            health.display()
        ),
        &[],
        &["prlimit", &limit, "--"],
    );
    let log = || agent.log();
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/route/cam1", "").0 == 302
        },
        "agent up",
        &log,
    );
    (agent, http, dir)
}

/// A flood of slow clients past the connection cap (each sends part of a
/// request head, then nothing): the cap bounds the agent's open sockets,
/// evicted ones included, so it never runs out of descriptors (its Redis,
/// broker and cache keep theirs), and `/route` is answered meanwhile.
#[test]
fn a_flood_of_slow_heads_never_eats_the_descriptor_reserve() {
    let r = harness::redis(&[]);
    let (agent, http, _dir) = agent_limited(&r, 400);
    let log = || agent.log();
    assert!(log().contains("max_connections=272"), "{}", log());
    let pid = agent.child.as_ref().unwrap().id();
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, std::iter::Iterator::count);
    let mut most = 0;
    let mut held = Vec::new();
    for i in 0..700 {
        let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
        let _ = s.write_all(b"GET /route/cam1 HTTP/1.1\r\nHost: x\r\n");
        held.push(s);
        if i % 10 == 0 {
            most = most.max(fds());
        }
    }
    // A viewer behind the flood is answered.
    let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /route/cam1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    for _ in 0..20 {
        most = most.max(fds());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(answer.starts_with("HTTP/1.1 302"), "{answer:?}\n{}", log());
    eprintln!("slow-head flood: at most {most} descriptors open (limit 400, cap 272)");
    assert!(most < 400, "{most} descriptors");
    assert!(!log().contains("Too many open files"), "{}", log());
    drop(held);
}

/// Clients sending request heads longer than the listener buffers are
/// answered 431 and closed: 200 of them holding 200 KiB heads leave the
/// agent's memory where it was (hyper's default buffer kept about 400 KiB
/// for each), and a viewer's `/route` is answered meanwhile.
#[test]
fn long_request_heads_are_refused_without_holding_memory() {
    let r = harness::redis(&[]);
    let t = table("https://a.example.net/live/");
    let (agent, http, _dir) = agent_with(&r, &t, &["cam1"]);
    let pid = agent.child.as_ref().unwrap().id();
    let before = crate::util::rss_kib(pid);
    let padding = format!("X-Padding: {}", "a".repeat(200 * 1024));
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The head never ends: a client that keeps its connection open.
        let _ = write!(s, "GET /route/cam1 HTTP/1.1\r\nHost: x\r\n{padding}");
        held.push(s);
    }
    let after = crate::util::rss_kib(pid);
    // Each is answered 431 and closed (a reset when the close crossed
    // the rest of the client's head), never left open.
    let mut refused = 0;
    for s in &mut held {
        let mut answer = Vec::new();
        match s.read_to_end(&mut answer) {
            Ok(_) => {
                let answer = String::from_utf8_lossy(&answer);
                assert!(
                    answer.starts_with("HTTP/1.1 431"),
                    "{answer:?}\n{}",
                    agent.log()
                );
                refused += 1;
            }
            Err(e) => assert_eq!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset,
                "{}",
                agent.log()
            ),
        }
    }
    assert!(refused > 0, "no 431 seen");
    assert_eq!(get(http, "/route/cam1", "").0, 302);
    // A head just under the limit is still a request.
    let fits = format!("X-Padding: {}\r\n", "a".repeat(8 * 1024));
    assert_eq!(get(http, "/route/cam1", &fits).0, 302, "{}", agent.log());
    eprintln!("200 long heads: RSS {before} KiB -> {after} KiB");
    assert!(
        after < before + 20 * 1024,
        "RSS {before} KiB -> {after} KiB with 200 long heads held"
    );
}

/// A client that sends its request head a byte every two seconds is closed
/// once it has gone [`HEADER_TIMEOUT_SECS`] without a whole head; a
/// keep-alive client that sends a request every three seconds keeps its
/// connection for longer than that.
#[test]
fn slow_heads_are_closed_and_steady_keep_alive_is_kept() {
    let r = harness::redis(&[]);
    let t = table("https://a.example.net/live/");
    let (agent, http, _dir) = agent_with(&r, &t, &["cam1"]);
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
        let started = Instant::now();
        let head = b"GET /route/cam1 HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa";
        for b in head {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(2));
            if started.elapsed() > Duration::from_secs(HEADER_TIMEOUT_SECS + 8) {
                break;
            }
        }
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut rest = Vec::new();
        // EOF, or a reset if the last byte crossed the close: closed either way.
        let closed = match s.read_to_end(&mut rest) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        (closed, started.elapsed())
    });
    let mut steady = TcpStream::connect(("127.0.0.1", http)).unwrap();
    steady
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(HEADER_TIMEOUT_SECS + 5) {
        steady
            .write_all(b"GET /route/cam1 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = steady.read(&mut buf).unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 302"),
            "{}\n{}",
            String::from_utf8_lossy(&buf[..n]),
            agent.log()
        );
        answered += 1;
        std::thread::sleep(Duration::from_secs(3));
    }
    assert!(answered >= 5);
    let (closed, after) = slow.join().unwrap();
    eprintln!("slow head: closed={closed} after {after:?}");
    assert!(closed, "a slow head was kept open for {after:?}");
    // The timeout, a watchdog tick, the grace a closing connection gets and
    // the client's own two-second step.
    assert!(
        after < Duration::from_secs(HEADER_TIMEOUT_SECS + 7),
        "{after:?}"
    );
}

/// `routing.health_file` (and a metric source) on a fifo: the agent does
/// not hang, says why, keeps serving, and stops on SIGTERM.
#[test]
fn a_fifo_health_file_neither_hangs_nor_blocks_sigterm() {
    let r = harness::redis(&[]);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("health.fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        0,
    )
    .unwrap();
    publish(r.port, &table("https://a.example.net"), 1);
    let http = harness::free_port();
    let mut agent = crate::util::Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "http:\n  listen: 127.0.0.1:{http}\nrouting:\n  health_file: {}\n  refresh: 100ms\n",
            fifo.display()
        ),
    );
    let log = || agent.log();
    wait_for(
        || log().contains("not a regular file"),
        "the fifo is refused",
        &log,
    );
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/healthz", "").0 == 200
        },
        "serving",
        &log,
    );
    let asked = Instant::now();
    let status = agent.terminate().unwrap();
    assert!(status.success(), "{status:?}\n{}", agent.log());
    assert!(asked.elapsed() < Duration::from_secs(5));
}

/// `GET /vod/<asset>` over real HTTP: the placement among the revisions
/// nodes report (health `vod`), the CDN-zones VOD order, explained in JSON.
#[test]
fn vod_over_http_with_real_redis() {
    let r = harness::redis(&[]);
    let dir = tempfile::tempdir().unwrap();
    let health = dir.path().join("health.json");
    let write = |h: serde_json::Value| {
        let tmp = health.with_extension("tmp");
        std::fs::write(&tmp, h.to_string()).unwrap();
        std::fs::rename(&tmp, &health).unwrap();
    };
    // edge-a (zone eu, the client's) holds revision 2, edge-b (backup,
    // the fallback) revision 3: the newer permitted fallback replica wins.
    write(serde_json::json!({"nodes": {
        "edge-a": {"online": true, "play_sessions": 0, "vod": {"movie": [1, 2]}},
        "edge-b": {"online": true, "play_sessions": 9, "vod": {"movie": [3]}},
    }}));
    publish(r.port, &table("https://a.example.net"), 1);
    let http = harness::free_port();
    let agent = crate::util::Agent::start_with(
        r.port,
        &[dir.path().join("cache")],
        &format!(
            "http:\n  listen: 127.0.0.1:{http}\n  proxy_url: https://router.example.net/proxy/{{node}}/{{stream}}\n\
             routing:\n  health_file: {}\n  refresh: 100ms\n",
            health.display()
        ),
    );
    let log = || agent.log();
    wait_for(
        || {
            std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
                && get(http, "/vod/movie", "").0 == 302
        },
        "agent up and routing VOD",
        &log,
    );
    let (_, head, _) = get(http, "/vod/movie", "");
    assert!(
        head.contains("location: https://router.example.net/proxy/edge-b/movie"),
        "{head}"
    );
    let (status, _, body) = get(http, "/vod/movie?format=json", "");
    assert_eq!(status, 302);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node"], "edge-b");
    assert_eq!(v["revision"], 3);
    assert_eq!(v["chain"], serde_json::json!(["eu", "backup"]));
    assert_eq!(v["replicas"][1]["node"], "edge-a");
    assert_eq!(v["replicas"][1]["revision"], 2);
    // Same revision everywhere: the client's own zone first (redirect to
    // edge-a's payload URL).
    write(serde_json::json!({"nodes": {
        "edge-a": {"online": true, "play_sessions": 5, "vod": {"movie": [3]}},
        "edge-b": {"online": true, "play_sessions": 0, "vod": {"movie": [3]}},
    }}));
    wait_for(
        || {
            get(http, "/vod/movie", "")
                .1
                .contains("location: https://a.example.net/movie")
        },
        "home zone first",
        &log,
    );
    // Unknown asset: 404. The only replica offline: 503 + Retry-After.
    assert_eq!(get(http, "/vod/nope", "").0, 404);
    write(serde_json::json!({"nodes": {
        "edge-a": {"online": false, "play_sessions": 0, "vod": {"movie": [3]}},
    }}));
    wait_for(|| get(http, "/vod/movie", "").0 == 503, "503", &log);
    assert!(get(http, "/vod/movie", "").1.contains("retry-after: 5"));
    drop(agent);
}

/// GET `path` through HAProxy's PROXY-protocol front end as viewer `src`,
/// with the viewer's own `X-Forwarded-For` lines: (status, body).
fn via_haproxy(port: u16, src: &str, path: &str, xff: &[&str]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut text = format!(
        "PROXY TCP4 {src} 127.0.0.1 40000 80\r\nGET {path} HTTP/1.1\r\nHost: a\r\n\
         Connection: close\r\n"
    );
    for line in xff {
        text.push_str("X-Forwarded-For:");
        if !line.is_empty() {
            text.push(' ');
            text.push_str(line);
        }
        text.push_str("\r\n");
    }
    text.push_str("\r\n");
    s.write_all(text.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, raw)
}

/// Behind a real HAProxy (`option forwardfor`), the viewer HAProxy saw is
/// the client of `/route` whatever the viewer sent before HAProxy's line:
/// `unknown`, an empty line, garbage then a forged in-route address.
#[test]
fn route_behind_haproxy_uses_the_viewer_haproxy_saw() {
    let r = harness::redis(&[]);
    let mut t = table("https://a.example.net");
    t.trusted_proxies = vec!["127.0.0.0/8".into()];
    t.zones.get_mut("eu").unwrap().routes = vec!["192.0.2.0/24".into()];
    let (_agent, http, _dir) = agent_with(&r, &t, &["cam1"]);
    let proxy = harness::haproxy::forwarding(http, true);
    let shapes: [&[&str]; 5] = [
        &[],
        &["unknown"],
        &[""],
        &["garbage, 203.0.113.50"],
        &["unknown", "not an ip, , 10.0.0.1"],
    ];
    for shape in shapes {
        // A viewer inside the zone's route is sent to its edge...
        let (status, raw) = via_haproxy(proxy.port, "192.0.2.5", "/route/cam1", shape);
        assert_eq!(status, 302, "in-route viewer sending {shape:?}: {raw}");
        // ...and one outside it is refused, even when it forges an
        // in-route address.
        let mut forged = shape.to_vec();
        forged.push("192.0.2.5");
        let (status, raw) = via_haproxy(proxy.port, "203.0.113.9", "/route/cam1", &forged);
        assert_eq!(status, 403, "outside viewer sending {forged:?}: {raw}");
    }
    // The explanation names the viewer HAProxy saw.
    let (_, body) = via_haproxy(
        proxy.port,
        "192.0.2.5",
        "/route/cam1?format=json",
        &["unknown"],
    );
    assert!(body.contains("\"client_ip\":\"192.0.2.5\""), "{body}");
}
