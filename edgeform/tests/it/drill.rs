//! The drill: the example cluster on this machine, every part a real
//! process — the control host (the `edgeform reconcile` daemon on a clone
//! of a local bare repository, its state store), a broker, two geo routers
//! (HTTP, and their 443 pools), three edges each with its own Redis (the
//! edge role's persistence) and `edgeform-agent` (with the serving probe),
//! two origins — under a steady load of viewers at a public address (a
//! network namespace) who know both routers and try the other once on a
//! connect error, as a client given two DNS answers does. Faults in turn
//! (kill, hold, restart, settle), each with a purge and an apply during
//! it; a table per fault (docs/operations.md, "The drill").
//!
//! `drill_short` (in `cargo test`) runs a few faults with short holds;
//! `scripts/drill` runs `drill_full`, every fault.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use compiler::compile::{Addresses, StreamOptions, nginx_stream, pool_with};
use harness::Process;
use harness::nginx::{Edge, EdgeOptions, Listeners, RouterOptions};

use crate::util::{Fixture, edgeform_with_state, git};

/// Every agent's `health.interval`. The goal: after a single fault no
/// viewer request fails for longer than this and one second.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// How long a fault's recovery may take (restart to purges delivered,
/// applies converged and every edge routable again).
const SETTLE: Duration = Duration::from_secs(60);

/// The viewers' URLs: a cached object and an uncached page, over HTTP
/// (the routers' geo router) and HTTPS (their 443 pool).
const URLS: &[&str] = &[
    "http://cached.drill.test/a.mp4",
    "http://live.drill.test/index.html",
    "https://cached.drill.test/a.mp4",
    "https://live.drill.test/index.html",
];

/// The viewers' public address (GB in MaxMind's test database: edge-1,
/// in London, is the geo router's choice).
const VIEWER: Ipv4Addr = Ipv4Addr::new(81, 2, 69, 142);

/// A part of the cluster a fault stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// An edge's nginx (master and workers, SIGKILL).
    EdgeNginx(usize),
    /// An edge's Redis (`kill -9`).
    EdgeRedis(usize),
    /// An edge's agent (`kill -9`).
    Agent(usize),
    Broker,
    /// The control host's reconcile daemon.
    Daemon,
    PrimaryOrigin,
    /// A router's nginx: its geo router and its 443 pool.
    Router(usize),
}

/// One fault: the parts stopped at once.
struct Fault {
    name: &'static str,
    parts: &'static [Part],
    /// For a pair: the outcome expected, shown beside the measured one.
    expected: Option<&'static str>,
}

/// Every fault, in the order the drill runs them.
static FAULTS: &[Fault] = &[
    Fault {
        name: "edge-1 nginx",
        parts: &[Part::EdgeNginx(0)],
        expected: None,
    },
    Fault {
        name: "edge-1 Redis (kill -9)",
        parts: &[Part::EdgeRedis(0)],
        expected: None,
    },
    Fault {
        name: "edge-1 agent (kill -9)",
        parts: &[Part::Agent(0)],
        expected: None,
    },
    Fault {
        name: "broker",
        parts: &[Part::Broker],
        expected: None,
    },
    Fault {
        name: "control host's daemon",
        parts: &[Part::Daemon],
        expected: None,
    },
    Fault {
        name: "primary origin",
        parts: &[Part::PrimaryOrigin],
        expected: None,
    },
    Fault {
        name: "router-1",
        parts: &[Part::Router(0)],
        expected: None,
    },
    Fault {
        name: "edge-1 nginx + its agent",
        parts: &[Part::EdgeNginx(0), Part::Agent(0)],
        expected: Some(
            "no gap over 2 s: the routers retry the next edge on the refused connect and \
             drop edge-1 on its last will; the purge waits in edge-1's Redis and runs when \
             the agent is back; converged",
        ),
    },
    Fault {
        name: "broker + daemon",
        parts: &[Part::Broker, Part::Daemon],
        expected: Some(
            "no failed request: routers keep the last health; the purge is queued in each \
             edge's Redis directly; the apply waits for the daemon and converges when it \
             is back",
        ),
    },
    Fault {
        name: "primary origin + edge-1 Redis",
        parts: &[Part::PrimaryOrigin, Part::EdgeRedis(0)],
        expected: Some(
            "no failed request: the edges fetch from the second origin (edge-1 from its \
             last known documents); the purge for edge-1 is SPOOLED and delivered; \
             converged",
        ),
    },
];

/// What the short form (in `cargo test`) runs.
const SHORT: &[&str] = &[
    "edge-1 nginx",
    "edge-1 Redis (kill -9)",
    "edge-1 agent (kill -9)",
    "router-1",
    "broker + daemon",
];

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Wait until `f` holds or `limit` passes; whether it held.
fn until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn redis_con(port: u16) -> Option<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .ok()?
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()
}

fn hget(port: u16, key: &str, field: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query(&mut redis_con(port)?)
        .ok()?
}

fn exists(port: u16, key: &str) -> bool {
    redis_con(port)
        .and_then(|mut c| redis::cmd("EXISTS").arg(key).query::<bool>(&mut c).ok())
        .unwrap_or(false)
}

/// A site's origins, primary first (tried in that order on a connect
/// error, timeout or 5xx): the one place the drill writes them.
fn origin_lines(origins: &[u16]) -> String {
    let list: Vec<String> = origins
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    format!("origins: [{}]\nloopback: true\n", list.join(", "))
}

/// One edge node: its Redis, nginx and agent.
struct EdgeNode {
    name: String,
    /// Its address (every listener's).
    addr: String,
    redis: Process,
    nginx: Edge,
    agent: Process,
    _cache: tempfile::TempDir,
}

/// One router node: its Redis and agent (sharing every edge's health
/// with nginx), its geo router and its 443 pool.
struct RouterNode {
    _redis: Process,
    agent: Process,
    http: Edge,
    pool: Edge,
    health: PathBuf,
}

/// The whole cluster.
struct Cluster {
    root: tempfile::TempDir,
    repo: Fixture,
    certs: harness::SiteCerts,
    broker: Process,
    daemon: Process,
    edges: Vec<EdgeNode>,
    routers: Vec<RouterNode>,
    origins: Vec<Edge>,
}

/// The `edgeform-agent` binary, built next to `edgeform`
/// (`cargo build -p agent --bins`: scripts/test and scripts/drill do).
fn agent_binary() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_edgeform")).with_file_name("edgeform-agent");
    assert!(
        p.is_file(),
        "{} is missing: `cargo build -p agent --bins` first (scripts/test does)",
        p.display()
    );
    p
}

/// Start an agent from `yaml` (its `http.listen` on `port`).
fn agent(dir: &Path, name: &str, yaml: &str, port: u16) -> Process {
    let conf = dir.join(format!("{name}.agent.yaml"));
    std::fs::write(&conf, yaml).unwrap();
    harness::program(
        &agent_binary(),
        vec!["--config".into(), conf.display().to_string()],
        Ipv4Addr::LOCALHOST,
        port,
    )
}

/// (name, address, location) of the edges and routers.
const EDGES: &[(&str, &str, &str)] = &[
    ("edge-1", "127.0.0.2", "{lat: 51.5074, lon: -0.1278}"),
    ("edge-2", "127.0.0.3", "{lat: 52.3676, lon: 4.9041}"),
    ("edge-3", "127.0.0.4", "{lat: 50.1109, lon: 8.6821}"),
];
const ROUTERS: &[(&str, &str, &str)] = &[
    ("router-1", "127.0.0.1", "{lat: 51.47, lon: -0.45}"),
    ("router-2", "127.0.0.11", "{lat: 52.31, lon: 4.76}"),
];

impl Cluster {
    fn up() -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_path_buf();
        let state = dir.join("state");
        let www = dir.join("www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("a.mp4"), vec![7u8; 64 * 1024]).unwrap();
        std::fs::write(www.join("index.html"), "hello from the origin\n").unwrap();
        let origins = vec![
            harness::nginx::static_origin(&www),
            harness::nginx::static_origin(&www),
        ];
        let origin_ports: Vec<u16> = origins.iter().map(|o| o.process.port).collect();
        let broker = harness::mosquitto();
        let persistence = format!(
            "include {}",
            harness::nginx::repo_root()
                .join("roles/edge/redis-persistence.conf")
                .display()
        );
        let edge_redis: Vec<Process> = EDGES
            .iter()
            .map(|_| harness::redis(&[persistence.as_str()]))
            .collect();
        let router_redis: Vec<Process> = ROUTERS.iter().map(|_| harness::redis(&[])).collect();
        // Every edge on the same ports at its own address, as routers
        // reach them.
        let (edge_port, https_port, proxy_port) = (
            harness::free_port(),
            harness::free_port(),
            harness::free_port(),
        );

        let repo = Fixture::empty();
        repo.write(
            "cluster.yaml",
            format!(
                "name: drill\ntrusted_proxies: [127.0.0.1/32, 127.0.0.11/32]\n\
                 mqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n",
                broker.port
            )
            .as_bytes(),
        );
        let nodes = EDGES
            .iter()
            .zip(&edge_redis)
            .map(|(node, redis)| (node, "edge", redis))
            .chain(
                ROUTERS
                    .iter()
                    .zip(&router_redis)
                    .map(|(node, redis)| (node, "router", redis)),
            );
        for ((name, addr, loc), role, redis) in nodes {
            repo.write(
                &format!("nodes/{name}.yaml"),
                format!(
                    "name: {name}\nroles: [{role}]\nregion: eu\nlocation: {loc}\n\
                     addresses: [{addr}]\nloopback: true\n\
                     redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
                    redis.port
                )
                .as_bytes(),
            );
        }
        let origin = origin_lines(&origin_ports);
        repo.write(
            "sites/cached.yaml",
            format!(
                "host: cached.drill.test\n{origin}tls: {{certificate: drill}}\n\
                 cache_rules:\n  - {{match_type: ext, match_value: .mp4, action: ttl, ttl: 86400}}\n"
            )
            .as_bytes(),
        );
        repo.write(
            "sites/live.yaml",
            format!("host: live.drill.test\n{origin}tls: {{certificate: drill}}\ncached: false\n")
                .as_bytes(),
        );
        let certs = harness::SiteCerts::new();
        certs.sign("drill", &["cached.drill.test", "live.drill.test"], 30);
        let out = edgeform_with_state(
            repo.path(),
            &state,
            &[
                "certs",
                "import",
                "drill",
                "--cert",
                certs.file("drill.chain.pem").to_str().unwrap(),
                "--key",
                certs.file("drill.key").to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "certs import: {}", err(&out));
        let head = repo.commit("the drill's cluster");
        // The bare repository the control host pulls, and its clone.
        let bare = dir.join("config.git");
        git(
            &dir,
            &[
                "clone",
                "-q",
                "--bare",
                repo.path().to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
        );
        git(
            repo.path(),
            &["remote", "add", "origin", bare.to_str().unwrap()],
        );
        let control = dir.join("control");
        git(
            &dir,
            &[
                "clone",
                "-q",
                bare.to_str().unwrap(),
                control.to_str().unwrap(),
            ],
        );

        // The edges' nginx (each declaring its bundle before the first push).
        let mut edges = Vec::new();
        for ((name, addr, _), redis) in EDGES.iter().zip(edge_redis) {
            let cache = tempfile::tempdir().unwrap();
            let mut o = EdgeOptions::new(redis.port);
            o.node = (*name).to_owned();
            o.cache_dir = Some(cache.path().to_path_buf());
            let l = Listeners {
                listen: format!("{addr}:{edge_port}"),
                ttl_port: harness::free_port(),
                https_listen: format!("{addr}:{https_port}"),
                proxy_listen: format!("{addr}:{proxy_port}"),
                metrics_listen: format!("127.0.0.1:{}", harness::free_port()),
            };
            let nginx = harness::nginx::edge_on(&o, &l)
                .unwrap_or_else(|log| panic!("{name}'s nginx did not start:\n{log}"));
            let http = harness::free_port();
            let agent = agent(
                &dir,
                name,
                &format!(
                    "node: {name}\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
                     cache: {{dirs: [\"{}\"], levels: \"1:2\", key: $scheme://$host$request_uri}}\n\
                     http: {{listen: \"127.0.0.1:{http}\"}}\n\
                     mqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n\
                     health: {{interval: {}s, probe: [\"http://{addr}:{edge_port}\"]}}\n\
                     state_dir: {}\n",
                    redis.port,
                    cache.path().display(),
                    broker.port,
                    HEALTH_INTERVAL.as_secs(),
                    dir.join(format!("{name}.state")).display(),
                ),
                http,
            );
            edges.push(EdgeNode {
                name: (*name).to_owned(),
                addr: (*addr).to_owned(),
                redis,
                nginx,
                agent,
                _cache: cache,
            });
        }

        let metrics = harness::free_port();
        let daemon = harness::program(
            Path::new(env!("CARGO_BIN_EXE_edgeform")),
            [
                "--repo",
                control.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
                "reconcile",
                "--pull",
                "origin/main",
                "--sync-every",
                "1s",
                "--heal-every",
                "10s",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
            ]
            .map(str::to_owned)
            .to_vec(),
            Ipv4Addr::LOCALHOST,
            metrics,
        );

        // The routers: agent, geo router (every address: the viewers reach
        // it at their gateway) and the 443 pool as `build` renders it.
        let checked = repo.check();
        let config = checked
            .config
            .as_ref()
            .expect("the drill's repository is valid");
        let mut routers = Vec::new();
        for ((name, addr, _), redis) in ROUTERS.iter().zip(router_redis) {
            let health = dir.join(format!("{name}.health.json"));
            let http = harness::free_port();
            let agent = agent(
                &dir,
                name,
                &format!(
                    "node: {name}\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
                     cache: {{dirs: [\"{}\"]}}\nhttp: {{listen: \"127.0.0.1:{http}\"}}\n\
                     mqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n\
                     health: {{interval: {}s}}\n\
                     routing: {{refresh: 200ms, share_health: \"{}\"}}\n\
                     state_dir: {}\n",
                    redis.port,
                    dir.join(format!("{name}.cache")).display(),
                    broker.port,
                    HEALTH_INTERVAL.as_secs(),
                    health.display(),
                    dir.join(format!("{name}.state")).display(),
                ),
                http,
            );
            let geo = harness::nginx::router_on(
                &RouterOptions::new(redis.port, health.clone(), edge_port),
                "0.0.0.0",
            );
            let node = config.nodes.iter().find(|n| n.name == *name).unwrap();
            let members = pool_with(config, node, Addresses::Any);
            // The edge believes a PROXY header from a router's address:
            // router-2's pool connects from its own.
            let bind = if *addr == "127.0.0.1" {
                String::new()
            } else {
                format!("\n        proxy_bind {addr};")
            };
            let pool = harness::nginx::stream(|listen| {
                let port = listen.rsplit_once(':').map_or("0", |(_, p)| p);
                let o = StreamOptions {
                    listen: format!("0.0.0.0:{port}"),
                    edge_port: Some(proxy_port),
                };
                nginx_stream(config, node, &members, &o).replace(
                    "proxy_pass edgeform_edges_443;",
                    &format!("proxy_pass edgeform_edges_443;{bind}"),
                )
            });
            routers.push(RouterNode {
                _redis: redis,
                agent,
                http: geo,
                pool,
                health,
            });
        }
        let c = Cluster {
            root,
            repo,
            certs,
            broker,
            daemon,
            edges,
            routers,
            origins,
        };
        assert!(
            until(SETTLE, || c.converged(&head)),
            "the daemon did not push {head} to every edge:\n{}",
            c.daemon.log()
        );
        assert!(
            until(SETTLE, || c.routable()),
            "the routers do not see every edge online and serving"
        );
        c
    }

    /// Every URL fetched once from every edge, over its own plain and
    /// HTTPS listeners (one worker each): every edge has read every site
    /// and certificate, as an edge in service has read its popular names.
    /// An edge whose Redis is down serves what it has read; a name it has
    /// not read meanwhile is refused (docs/edge.md, "Freshness").
    fn warm(&self) {
        for e in &self.edges {
            for url in URLS {
                let host = url.split('/').nth(2).unwrap_or_default();
                let (port, via) = if url.starts_with("https") {
                    (443, e.nginx.https_port)
                } else {
                    (80, e.nginx.process.port)
                };
                let out = std::process::Command::new("curl")
                    .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5"])
                    .arg("--cacert")
                    .arg(self.certs.file("ca.pem"))
                    .arg("--connect-to")
                    .arg(format!("{host}:{port}:{}:{via}", e.addr))
                    .arg(url)
                    .output()
                    .unwrap();
                let code = String::from_utf8_lossy(&out.stdout).into_owned();
                assert_eq!(code, "200", "{url} from {}", e.name);
            }
        }
    }

    /// Every edge's Redis says `commit`.
    fn converged(&self, commit: &str) -> bool {
        self.edges
            .iter()
            .all(|e| hget(e.redis.port, "edgeform:meta", "commit").as_deref() == Some(commit))
    }

    /// Every router's shared health has every edge online and serving.
    fn routable(&self) -> bool {
        (0..self.edges.len()).all(|i| self.routed_to(i) == self.routers.len())
    }

    /// How many routers' shared health has edge `i` online and serving.
    fn routed_to(&self, i: usize) -> usize {
        let name = &self.edges[i].name;
        self.routers
            .iter()
            .filter(|r| {
                let s: serde_json::Value = std::fs::read_to_string(&r.health)
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or_default();
                let n = &s["nodes"][name];
                n["online"] == true && n["serving"] != false
            })
            .count()
    }

    /// Every edge recorded the purge `id` as done.
    fn purged(&self, id: &str) -> usize {
        self.edges
            .iter()
            .filter(|e| exists(e.redis.port, &format!("cdn:purge:done:{id}")))
            .count()
    }

    /// `edgeform purge` of an object on every edge, run on the control
    /// host (its state store: a job an edge's Redis does not take is kept
    /// there and delivered by the daemon). The job id and whether a job
    /// was kept (`SPOOLED`), or why it was neither queued nor kept.
    fn purge(&self, n: usize) -> Result<(String, bool), String> {
        let out = edgeform_with_state(
            self.repo.path(),
            &self.state(),
            &[
                "purge",
                "--site",
                "cached.drill.test",
                "--url",
                &format!("/purged-{n}.mp4"),
            ],
        );
        let id = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        // 0: queued everywhere; 3: some kept in the outbox.
        match out.status.code() {
            Some(c @ (0 | 3)) if !id.is_empty() => Ok((id, c == 3)),
            _ => Err(err(&out)),
        }
    }

    /// A commit (a new site) pushed to the bare repository the daemon
    /// pulls: the commit every edge must end up at.
    fn apply(&self, n: usize) -> String {
        let ports: Vec<u16> = self.origins.iter().map(|o| o.process.port).collect();
        self.repo.write(
            &format!("sites/applied-{n}.yaml"),
            format!(
                "host: applied-{n}.drill.test\n{}cached: false\n",
                origin_lines(&ports)
            )
            .as_bytes(),
        );
        let commit = self.repo.commit(&format!("apply during fault {n}"));
        git(self.repo.path(), &["push", "-q", "origin", "main"]);
        commit
    }

    /// Every process's log into `dir` (nginx: its error log).
    fn keep_logs(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let mut logs = vec![
            ("daemon".to_owned(), self.daemon.log()),
            ("broker".to_owned(), self.broker.log()),
        ];
        for e in &self.edges {
            logs.push((format!("{}.nginx", e.name), e.nginx.error_log()));
            logs.push((format!("{}.agent", e.name), e.agent.log()));
            logs.push((format!("{}.redis", e.name), e.redis.log()));
        }
        for (r, (name, _, _)) in self.routers.iter().zip(ROUTERS) {
            logs.push((format!("{name}.geo"), r.http.error_log()));
            logs.push((format!("{name}.pool"), r.pool.error_log()));
            logs.push((format!("{name}.agent"), r.agent.log()));
        }
        for (name, text) in logs {
            std::fs::write(dir.join(format!("{name}.log")), text).unwrap();
        }
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn kill(&mut self, p: Part) {
        match p {
            Part::EdgeNginx(i) => self.edges[i].nginx.crash(),
            Part::EdgeRedis(i) => self.edges[i].redis.kill(),
            Part::Agent(i) => self.edges[i].agent.kill(),
            Part::Broker => self.broker.kill(),
            Part::Daemon => self.daemon.kill(),
            Part::PrimaryOrigin => self.origins[0].crash(),
            Part::Router(i) => {
                self.routers[i].http.crash();
                self.routers[i].pool.crash();
            }
        }
    }

    fn restart(&mut self, p: Part) {
        match p {
            Part::EdgeNginx(i) => self.edges[i].nginx.process.restart(),
            Part::EdgeRedis(i) => self.edges[i].redis.restart(),
            Part::Agent(i) => self.edges[i].agent.restart(),
            Part::Broker => self.broker.restart(),
            Part::Daemon => self.daemon.restart(),
            Part::PrimaryOrigin => self.origins[0].process.restart(),
            Part::Router(i) => {
                self.routers[i].http.process.restart();
                self.routers[i].pool.process.restart();
            }
        }
    }
}

fn err(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One viewer: forever, each URL in turn through one router (the viewers
/// alternate), the other router once more on a connect error (curl's exit
/// 7), as a client given two DNS answers does; one line per request: its
/// start and end (µs since the epoch), URL, curl's exit code, status (000:
/// none) and the edge the geo router names (HTTP only).
const VIEWER_SH: &str = r#"
n=$VIEWER
fetch() { # url router(addr:port)
  local hostport=${1#*://}; hostport=${hostport%%/*}
  local port=80; [ "${1%%:*}" = https ] && port=443
  curl -s -o /dev/null -w '%{http_code} %header{x-edgeform-edge}' --cacert "$CA" --connect-timeout 1 -m 3 \
    --connect-to "$hostport:$port:$2" "$1"
}
while :; do
  for url in "$@"; do
    if [ "${url%%:*}" = https ]; then a=$TLS_A b=$TLS_B; else a=$HTTP_A b=$HTTP_B; fi
    if [ $((n % 2)) = 1 ]; then t=$a; a=$b; b=$t; fi
    n=$((n + 1))
    start=${EPOCHREALTIME/./}
    got=$(fetch "$url" "$a"); rc=$?
    if [ "$rc" = 7 ]; then got=$(fetch "$url" "$b"); rc=$?; fi
    echo "$start ${EPOCHREALTIME/./} $url $rc $got"
    sleep 0.05
  done
done
"#;

/// One request a viewer made.
#[derive(Debug, Clone)]
struct Rec {
    start: u64,
    end: u64,
    url: String,
    ok: bool,
    /// The edge that answered through a geo router (HTTP).
    edge: Option<String>,
    /// The viewer's line.
    line: String,
}

/// The viewers: processes in a network namespace, their records.
struct Load {
    _viewer: harness::netns::Viewer,
    children: Vec<Child>,
    recs: Arc<Mutex<Vec<Rec>>>,
}

impl Load {
    fn start(c: &Cluster, viewers: usize) -> Load {
        let viewer = harness::netns::Viewer::new(VIEWER);
        let gw = viewer.gateway;
        let at = |e: &Edge| format!("{gw}:{}", e.process.port);
        let recs = Arc::new(Mutex::new(Vec::new()));
        let mut children = Vec::new();
        for i in 0..viewers {
            let mut cmd = viewer.command("bash");
            cmd.arg("-c")
                .arg(VIEWER_SH)
                .arg("viewer")
                .args(URLS)
                .env("VIEWER", i.to_string())
                .env("CA", c.certs.file("ca.pem"))
                .env("HTTP_A", at(&c.routers[0].http))
                .env("HTTP_B", at(&c.routers[1].http))
                .env("TLS_A", at(&c.routers[0].pool))
                .env("TLS_B", at(&c.routers[1].pool))
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            let mut child = cmd.spawn().expect("a viewer in the namespace");
            let out = child.stdout.take().unwrap();
            let recs = recs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { return };
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let (Some(start), Some(end), Some(url), Some(code)) =
                        (f.first(), f.get(1), f.get(2), f.get(4))
                    else {
                        continue;
                    };
                    let (Ok(start), Ok(end)) = (start.parse(), end.parse()) else {
                        continue;
                    };
                    let ok = matches!(code.as_bytes().first(), Some(b'2' | b'3'));
                    recs.lock().unwrap().push(Rec {
                        start,
                        end,
                        url: (*url).to_owned(),
                        ok,
                        edge: f.get(5).map(|e| (*e).to_owned()),
                        line: line.clone(),
                    });
                }
            });
            children.push(child);
        }
        Load {
            _viewer: viewer,
            children,
            recs,
        }
    }

    /// The requests started in `[from, to]` (µs).
    fn between(&self, from: u64, to: u64) -> Vec<Rec> {
        self.recs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.start >= from && r.start <= to)
            .cloned()
            .collect()
    }

    /// Wait until every URL was answered since `from`.
    fn all_answered_since(&self, from: u64) -> bool {
        let recs = self.between(from, u64::MAX);
        URLS.iter()
            .all(|u| recs.iter().any(|r| r.ok && r.url == *u))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The longest run of failures (seconds) among `recs` of one URL each:
/// from the run's first failed request's start to its last one's end.
fn max_gap(recs: &[Rec]) -> f64 {
    let mut by_url: BTreeMap<&str, Vec<&Rec>> = BTreeMap::new();
    for r in recs {
        by_url.entry(&r.url).or_default().push(r);
    }
    let mut worst = 0u64;
    for rs in by_url.values_mut() {
        rs.sort_by_key(|r| r.start);
        let mut run: Option<(u64, u64)> = None;
        for r in rs.iter() {
            if r.ok {
                run = None;
            } else {
                let (s, _) = *run.get_or_insert((r.start, r.end));
                run = Some((s, r.end));
                worst = worst.max(r.end.saturating_sub(s));
            }
        }
    }
    Duration::from_micros(worst).as_secs_f64()
}

/// One fault's measured outcome.
struct Row {
    fault: &'static Fault,
    /// Killed, restarted, settled (µs since the epoch).
    times: [u64; 3],
    sent: usize,
    answered: usize,
    failed: usize,
    /// Failed requests for the cached object.
    cached_failed: usize,
    /// The longest run of failures of one URL.
    gap: f64,
    /// Edges that recorded the purge (None: the purge was lost at once).
    purged: Option<usize>,
    /// An edge stopped: seconds until both routers' health left it out
    /// (`Some(None)`: not within the hold).
    detected: Option<Option<f64>>,
    /// The purge kept a job in the outbox (`SPOOLED`, exit 3).
    spooled: bool,
    /// HTTP requests answered, per edge that answered through the geo
    /// router (`X-Edgeform-Edge`).
    served_by: BTreeMap<String, usize>,
    converged: usize,
    settled: f64,
}

impl Row {
    /// `3/3`, `3/3 (spooled)` or `LOST`.
    fn delivered(&self, edges: usize) -> String {
        let kept = if self.spooled { " (spooled)" } else { "" };
        self.purged
            .map_or_else(|| "LOST".to_owned(), |p| format!("{p}/{edges}{kept}"))
    }

    /// The goals missed: a purge not delivered to every edge, an edge not
    /// converged; after a single fault, a gap over the health
    /// interval + 1 s (a pair's gap is shown beside what is expected).
    fn misses(&self, edges: usize) -> Vec<String> {
        let mut m = Vec::new();
        if self.purged != Some(edges) {
            m.push(format!(
                "purge delivered to {:?} of {edges} edges",
                self.purged
            ));
        }
        if self.converged != edges {
            m.push(format!("{} of {edges} edges converged", self.converged));
        }
        let limit = (HEALTH_INTERVAL + Duration::from_secs(1)).as_secs_f64();
        if self.fault.expected.is_none() && self.gap > limit {
            m.push(format!("a gap of {:.1} s > {limit:.0} s", self.gap));
        }
        m
    }
}

fn run_fault(c: &mut Cluster, load: &Load, n: usize, f: &'static Fault, hold: Duration) -> Row {
    let t0 = now_us();
    let killed = Instant::now();
    for p in f.parts {
        c.kill(*p);
    }
    let purge = c.purge(n);
    if let Err(e) = &purge {
        eprintln!("fault {}: purge not queued nor kept: {e}", f.name);
    }
    let desired = c.apply(n);
    // An edge stopped: how long until both routers' health leaves it out.
    let edge = f.parts.iter().find_map(|p| match p {
        Part::EdgeNginx(i) | Part::Agent(i) => Some(*i),
        _ => None,
    });
    let detected = edge.and_then(|i| {
        until(hold.saturating_sub(killed.elapsed()), || {
            c.routed_to(i) == 0
        })
        .then(|| killed.elapsed().as_secs_f64())
    });
    if let (Some(i), None) = (edge, detected) {
        eprintln!(
            "fault {}: within the hold the routers still route to {}: {}",
            f.name,
            c.edges[i].name,
            std::fs::read_to_string(&c.routers[0].health).unwrap_or_default()
        );
    }
    // The hold is the fault's length, not a wait for something.
    std::thread::sleep(hold.saturating_sub(killed.elapsed()));
    for p in f.parts.iter().rev() {
        c.restart(*p);
    }
    let restarted = Instant::now();
    let t_restart = now_us();
    let purged = purge.as_ref().ok().map(|(id, _)| {
        until(SETTLE, || c.purged(id) == c.edges.len());
        c.purged(id)
    });
    until(SETTLE, || c.converged(&desired));
    let converged = c
        .edges
        .iter()
        .filter(|e| hget(e.redis.port, "edgeform:meta", "commit").as_deref() == Some(&desired))
        .count();
    let routable = until(SETTLE, || c.routable());
    let back = now_us();
    let answered = until(SETTLE, || load.all_answered_since(back));
    if !(routable && answered) {
        eprintln!(
            "fault {}: not recovered (routable {routable}, every URL answered {answered})",
            f.name
        );
    }
    let settled = restarted.elapsed().as_secs_f64();
    let t1 = now_us();
    // Recovered includes warm again: a restarted nginx warms its documents
    // and its certificates itself (docs/edge.md, "Warming"), but in the
    // background, and the next fault (edge-1's Redis after edge-1's nginx)
    // must not depend on how far that got: a name not read yet is refused
    // by design, and the row would measure two faults at once. Outside
    // this row's window and the next one's.
    c.warm();
    let recs = load.between(t0, t1);
    let cached = |u: &str| u.ends_with(".mp4");
    Row {
        fault: f,
        times: [t0, t_restart, t1],
        sent: recs.len(),
        answered: recs.iter().filter(|r| r.ok).count(),
        failed: recs.iter().filter(|r| !r.ok).count(),
        cached_failed: recs.iter().filter(|r| !r.ok && cached(&r.url)).count(),
        gap: max_gap(&recs),
        purged,
        detected: edge.map(|_| detected),
        spooled: purge.as_ref().is_ok_and(|(_, kept)| *kept),
        served_by: recs
            .iter()
            .filter(|r| r.ok)
            .filter_map(|r| r.edge.clone())
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e).or_default() += 1;
                m
            }),
        converged,
        settled,
    }
}

fn table(rows: &[Row], edges: usize, hold: Duration) -> String {
    let mut t = format!(
        "Faults held {} s each; viewers: {} URLs (cached/uncached × HTTP/HTTPS) through both \
         routers; goal: no gap over {} s after a single fault, every purge delivered, \
         every edge converged.\n\n\
         | fault | sent | 2xx/3xx | failed | failed (cached) | max gap s | answered by (HTTP, geo router) | routers left the edge out after s | purges delivered | applies converged | settled s | goal |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
        hold.as_secs(),
        URLS.len(),
        (HEALTH_INTERVAL + Duration::from_secs(1)).as_secs()
    );
    for r in rows {
        let misses = r.misses(edges);
        let goal = if misses.is_empty() {
            "met".to_owned()
        } else if r.fault.expected.is_some() {
            format!("see below: {}", misses.join("; "))
        } else {
            format!("MISSED: {}", misses.join("; "))
        };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {}/{edges} | {:.1} | {goal} |\n",
            r.fault.name,
            r.sent,
            r.answered,
            r.failed,
            r.cached_failed,
            r.gap,
            r.served_by
                .iter()
                .map(|(e, n)| format!("{e} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            match r.detected {
                None => "—".to_owned(),
                Some(None) => "not in the hold".to_owned(),
                Some(Some(s)) => format!("{s:.1}"),
            },
            r.delivered(edges),
            r.converged,
            r.settled,
        ));
    }
    let pairs: Vec<&Row> = rows.iter().filter(|r| r.fault.expected.is_some()).collect();
    if !pairs.is_empty() {
        t.push_str("\n| pair | expected | measured |\n|---|---|---|\n");
        for r in pairs {
            t.push_str(&format!(
                "| {} | {} | {} failed of {} ({} cached), max gap {:.1} s; purge {}; {}/{edges} converged |\n",
                r.fault.name,
                r.fault.expected.unwrap_or_default(),
                r.failed,
                r.sent,
                r.cached_failed,
                r.gap,
                r.delivered(edges),
                r.converged,
            ));
        }
    }
    t
}

/// Every request's line and each fault's kill, restart and settle, in
/// time order: `start end url curl-exit status edge`, `# time fault what`.
fn records(load: &Load, rows: &[Row]) -> String {
    let mut lines: Vec<(u64, String)> = load
        .between(0, u64::MAX)
        .into_iter()
        .map(|r| (r.start, r.line))
        .collect();
    for r in rows {
        for (t, what) in r.times.iter().zip(["killed", "restarted", "settled"]) {
            lines.push((*t, format!("# {t} {} {what}", r.fault.name)));
        }
    }
    lines.sort();
    lines.into_iter().map(|(_, l)| l + "\n").collect()
}

/// Bring the cluster up, run `faults` with `hold` each under load, print
/// the table (and write it to `$EDGEFORM_DRILL_TABLE` when set); fail
/// when a single-fault goal is missed or a purge is lost.
fn drill(faults: &[&'static Fault], hold: Duration) {
    let mut c = Cluster::up();
    c.warm();
    let load = Load::start(&c, 2);
    let started = now_us();
    assert!(
        until(SETTLE, || load.all_answered_since(started)),
        "the viewers are not answered before any fault: {:?}",
        load.between(started, u64::MAX).last()
    );
    let mut rows = Vec::new();
    for (n, f) in faults.iter().enumerate() {
        eprintln!("drill: {}", f.name);
        rows.push(run_fault(&mut c, &load, n, f, hold));
    }
    let edges = c.edges.len();
    let t = table(&rows, edges, hold);
    eprintln!("\n{t}");
    if let Ok(path) = std::env::var("EDGEFORM_DRILL_TABLE") {
        std::fs::write(path, &t).unwrap();
    }
    if let Ok(path) = std::env::var("EDGEFORM_DRILL_RECORDS") {
        std::fs::write(path, records(&load, &rows)).unwrap();
    }
    if let Ok(dir) = std::env::var("EDGEFORM_DRILL_LOGS") {
        c.keep_logs(Path::new(&dir));
    }
    let missed: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.misses(edges)
                .into_iter()
                .map(move |m| format!("{}: {m}", r.fault.name))
        })
        .collect();
    if !missed.is_empty() {
        eprintln!("{}", why_missed(&c, &load, &rows, edges));
    }
    assert!(missed.is_empty(), "goals missed:\n{}", missed.join("\n"));
}

/// What a failing drill shows besides its table (CI keeps only the
/// output): each missed fault's failed requests, and the warnings and
/// errors the edges' and routers' nginx logged.
fn why_missed(c: &Cluster, load: &Load, rows: &[Row], edges: usize) -> String {
    const MAX: usize = 24;
    let mut s = String::from("failed requests (start end url curl-exit status edge):\n");
    for r in rows.iter().filter(|r| !r.misses(edges).is_empty()) {
        s += &format!("{}:\n", r.fault.name);
        let [from, _, to] = r.times;
        for f in load.between(from, to).iter().filter(|f| !f.ok).take(MAX) {
            s += &format!("  {}\n", f.line);
        }
    }
    let logs = c
        .edges
        .iter()
        .map(|e| (format!("{} nginx", e.name), e.nginx.error_log()))
        .chain(
            c.routers
                .iter()
                .zip(ROUTERS)
                .map(|(r, (name, _, _))| (format!("{name} geo router"), r.http.error_log())),
        );
    for (name, log) in logs {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("[error]") || l.contains("[warn]") || l.contains("[crit]"))
            .collect();
        s += &format!("{name}: the last of {} warnings and errors:\n", lines.len());
        for l in &lines[lines.len().saturating_sub(MAX)..] {
            s += &format!("  {l}\n");
        }
    }
    s
}

/// The short form: a few single faults and a pair, 2 s holds.
#[test]
fn drill_short() {
    let faults: Vec<&Fault> = FAULTS.iter().filter(|f| SHORT.contains(&f.name)).collect();
    drill(&faults, Duration::from_secs(2));
}

/// Every fault (or those named in `EDGEFORM_DRILL_ONLY`, comma-separated),
/// 10 s holds (`EDGEFORM_DRILL_HOLD`): `scripts/drill`.
#[test]
#[ignore = "the full drill (minutes): scripts/drill"]
fn drill_full() {
    let hold = std::env::var("EDGEFORM_DRILL_HOLD")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs);
    let only = std::env::var("EDGEFORM_DRILL_ONLY").unwrap_or_default();
    let faults: Vec<&Fault> = FAULTS
        .iter()
        .filter(|f| only.is_empty() || only.split(',').any(|n| n.trim() == f.name))
        .collect();
    assert!(
        !faults.is_empty(),
        "EDGEFORM_DRILL_ONLY names no fault: {only}"
    );
    drill(&faults, hold);
}
