//! Role-keyed bundles and the SSH installer, against a real sshd
//! (harness::sshd) on loopback, a real Redis, and real nginx + Lua. Each
//! node is its own root folder on this machine; its live nginx is the one
//! `edgeform install` starts, stopped here by the pid in its run folder.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::sshd::{Sshd, sshd};

use crate::util::{edgeform, example_repo, stderr, stdout};

/// A config repository with the example's roles/edge, a
/// cluster.yaml and nodes installed through one sshd.
struct Lab {
    repo: tempfile::TempDir,
    /// The control host's state directory (node secrets).
    state: tempfile::TempDir,
    nodes: tempfile::TempDir,
    sshd: Sshd,
    _redis: harness::Process,
    redis_port: u16,
    /// Nodes' own Redis servers ([`Lab::own_redis`]).
    own: Vec<harness::Process>,
    names: Vec<String>,
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        // Follow links: the test repository holds plain copies.
        if std::fs::metadata(e.path()).unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

impl Lab {
    fn new(nodes: usize) -> Lab {
        let repo = tempfile::tempdir().unwrap();
        let example = example_repo();
        std::fs::write(repo.path().join("cluster.yaml"), "name: lab-cdn\n").unwrap();
        std::fs::create_dir_all(repo.path().join("nodes")).unwrap();
        copy_dir(&example.join("roles/edge"), &repo.path().join("roles/edge"));
        std::fs::copy(
            example.join("roles/edge.smoke.yaml"),
            repo.path().join("roles/edge.smoke.yaml"),
        )
        .unwrap();
        let redis = harness::redis(&[]);
        let mut lab = Lab {
            repo,
            state: tempfile::tempdir().unwrap(),
            nodes: tempfile::tempdir().unwrap(),
            sshd: sshd(),
            redis_port: redis.port,
            _redis: redis,
            own: Vec::new(),
            names: Vec::new(),
        };
        for i in 1..=nodes {
            lab.add_node(&format!("edge-{i}"));
        }
        lab
    }

    fn root(&self, node: &str) -> PathBuf {
        self.nodes.path().join(node)
    }

    /// `nodes` edges each with its own Redis (the version-skew gate reads
    /// each edge's `edgeform:bundle`).
    fn own_redis(nodes: usize) -> Lab {
        let mut lab = Lab::new(0);
        for i in 1..=nodes {
            let r = harness::redis(&[]);
            lab.add_node_on(&format!("edge-{i}"), r.port);
            lab.own.push(r);
        }
        lab
    }

    /// nodes/<name>.yaml: its own root, live and smoke ports.
    fn add_node(&mut self, name: &str) {
        self.add_node_on(name, self.redis_port);
    }

    /// [`Lab::add_node`] with the node's Redis on `redis_port`.
    fn add_node_on(&mut self, name: &str, redis_port: u16) {
        let root = self.root(name);
        let port = |_: u8| harness::free_port();
        let yaml = format!(
            "name: {name}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{redis}\"}}\n\
             cache: {{dirs: [\"{root}/var/cache/edge\"], levels: \"1:2\", key: $scheme://$host$request_uri}}\n\
             install:\n  ssh: \"127.0.0.1:{ssh}\"\n  user: {user}\n  root: {root}\n\
             \x20 listen: \"127.0.0.1:{live}\"\n  smoke_listen: \"127.0.0.1:{smoke}\"\n  keep: 3\n\
             \x20 vars: {{workers: \"1\", resolver: 127.0.0.1, cache_max_size: 100m, \
             geoip_db: geoip/GeoLite2-City.mmdb, api: \"false\", api_url: \"http://127.0.0.1:9\", \
             ttl_hop_port: \"{hop}\", metrics_listen: \"127.0.0.1:{ml}\"}}\n\
             \x20 candidate_vars: {{ttl_hop_port: \"{chop}\", https_listen: \"127.0.0.1:{chl}\", \
             proxy_listen: \"127.0.0.1:{cpl}\", metrics_listen: \"127.0.0.1:{cml}\"}}\n\
             \x20 restart_on_change: {{agent.yaml: \"echo restarted >> {root}/agent-restarts\"}}\n\
             https: {{listen: \"127.0.0.1:{hl}\", proxy_listen: \"127.0.0.1:{pl}\"}}\n",
            redis = redis_port,
            root = root.display(),
            ssh = self.sshd.port(),
            user = Sshd::user(),
            live = port(0),
            smoke = port(1),
            hop = port(2),
            chop = port(3),
            hl = port(4),
            pl = port(5),
            chl = port(6),
            cpl = port(7),
            ml = port(8),
            cml = port(9),
        );
        std::fs::write(self.repo.path().join(format!("nodes/{name}.yaml")), yaml).unwrap();
        self.names.push(name.to_owned());
    }

    /// The state directory (made 0700 by edgeform inside the temp dir).
    fn state_dir(&self) -> PathBuf {
        self.state.path().join("state")
    }

    fn node_yaml(&self, name: &str) -> String {
        std::fs::read_to_string(self.repo.path().join(format!("nodes/{name}.yaml"))).unwrap()
    }

    fn live_port(&self, name: &str) -> u16 {
        let y = self.node_yaml(name);
        let at = y.find("listen: \"127.0.0.1:").unwrap() + "listen: \"127.0.0.1:".len();
        y[at..at + y[at..].find('"').unwrap()].parse().unwrap()
    }

    fn edgeform(&self, args: &[&str]) -> std::process::Output {
        let state = self.state_dir().display().to_string();
        let mut all = vec!["--state-dir", state.as_str()];
        all.extend_from_slice(args);
        edgeform(self.repo.path(), &all)
    }

    /// `install` (or `plan --bundles`) with the sshd's key and known_hosts.
    fn ssh_args<'a>(&'a self, args: &[&'a str], known_hosts: &'a Path) -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        v.extend([
            "--known-hosts".into(),
            known_hosts.display().to_string(),
            "--identity".into(),
            self.sshd.client_key.display().to_string(),
        ]);
        v
    }

    fn install(&self, args: &[&str]) -> std::process::Output {
        let v = self.ssh_args(args, &self.sshd.known_hosts);
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        let mut all = vec!["install"];
        all.extend(v);
        self.edgeform(&all)
    }

    fn plan_bundles(&self) -> std::process::Output {
        let v = self.ssh_args(
            &["plan", "--bundles", "--detailed-exitcode"],
            &self.sshd.known_hosts,
        );
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        self.edgeform(&v)
    }

    /// The lab's files as the first commit of its repository.
    fn commit(&self) {
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["add", "-A"],
            &["commit", "-qm", "lab"],
        ] {
            crate::util::git(self.repo.path(), args);
        }
    }

    fn write(&self, path: &str, text: &str) {
        let p = self.repo.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.repo.path().join(path)).unwrap()
    }

    fn current(&self, node: &str) -> String {
        std::fs::read_link(self.root(node).join("current"))
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    fn releases(&self, node: &str) -> usize {
        std::fs::read_dir(self.root(node).join("releases")).map_or(0, Iterator::count)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for n in &self.names {
            for inst in ["live", "candidate"] {
                let pid = self.root(n).join(format!("run/{inst}/nginx.pid"));
                if let Ok(p) = std::fs::read_to_string(pid)
                    && !p.trim().is_empty()
                {
                    let _ = std::process::Command::new("kill")
                        .args(["-TERM", p.trim()])
                        .status();
                }
            }
        }
    }
}

/// `GET path` with `Host` on a loopback port: (status, body).
/// Exit status 0, or the output shown.
#[track_caller]
fn succeeded(out: &std::process::Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(out),
        stderr(out)
    );
}

fn get(port: u16, host: &str, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_owned();
    (status, body)
}

/// Poll until `f` holds (a reload takes effect when the old workers exit).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not within 10 s: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `restart_on_change` ran on a node (one line per run).
fn restarts(lab: &Lab, node: &str) -> String {
    std::fs::read_to_string(lab.root(node).join("agent-restarts")).unwrap_or_default()
}

fn serves_old(lab: &Lab, node: &str) {
    let (status, body) = get(lab.live_port(node), "smoke-test.invalid", "/");
    assert_eq!((status, body.as_str()), (404, "unknown host\n"), "{node}");
}

const EXTRA_LUA: &str = "return { hello = \"hello from a new Lua file\" }\n";

/// A new Lua file (and a location that needs it) in the role folder.
fn add_extra_lua(lab: &Lab) {
    lab.write("roles/edge/lua/edge_extra.lua", EXTRA_LUA);
    let conf = lab.read("roles/edge/nginx.conf.tmpl").replacen(
        "        location / {",
        "        location = /extra { content_by_lua_block { ngx.say(require(\"edge_extra\").hello) } }\n\n        location / {",
        1,
    );
    lab.write("roles/edge/nginx.conf.tmpl", &conf);
}

#[test]
fn install_three_nodes_then_a_new_lua_file_reaches_old_and_fresh_nodes_and_rollback() {
    let mut lab = Lab::new(3);
    let out = lab.install(&["--all", "--parallel", "3"]);
    succeeded(&out);
    for n in ["edge-1", "edge-2", "edge-3"] {
        assert!(
            stdout(&out).contains(&format!("{n}: installed r")),
            "{}",
            stdout(&out)
        );
        serves_old(&lab, n);
        // The cache folder was made, parents included (its parent did not
        // exist: nginx makes the folder, not its parents).
        assert!(lab.root(n).join("var/cache/edge").is_dir());
        // The rendered agent.yaml carries the node's own settings.
        let agent = std::fs::read_to_string(lab.root(n).join("current/agent.yaml")).unwrap();
        assert!(agent.contains(&format!("node: {n}")), "{agent}");
        assert!(
            agent.contains(&format!("{}/var/cache/edge", lab.root(n).display())),
            "{agent}"
        );
    }
    let plan = lab.plan_bundles();
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&plan),
        stderr(&plan)
    );
    assert_eq!(
        stdout(&plan).matches("bundle up to date").count(),
        3,
        "{}",
        stdout(&plan)
    );
    // A new agent.yaml: its restart command ran once.
    assert_eq!(restarts(&lab, "edge-1"), "restarted\n");

    // `build` writes each node's bundle and manifest.
    let built = tempfile::tempdir().unwrap();
    let out = lab.edgeform(&["build", "--out", &built.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(built.path().join("bundles/edge-1/manifest.json")).unwrap(),
    )
    .unwrap();
    let lua = std::fs::read(built.path().join("bundles/edge-1/lua/edge_ip.lua")).unwrap();
    let entry = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "lua/edge_ip.lua")
        .expect("edge_ip.lua in the manifest");
    use sha2::Digest;
    let sha: String = sha2::Sha256::digest(&lua)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(entry["sha256"], sha.as_str());
    assert_eq!(entry["mode"], "0644");

    // A new Lua file: no copy list to update. plan shows the old nodes' drift.
    add_extra_lua(&lab);
    let plan = lab.plan_bundles();
    assert_eq!(
        plan.status.code(),
        Some(2),
        "{}\n{}",
        stdout(&plan),
        stderr(&plan)
    );
    let text = stdout(&plan);
    assert_eq!(
        text.matches("added    lua/edge_extra.lua").count(),
        3,
        "{text}"
    );
    assert_eq!(text.matches("changed  nginx.conf").count(), 3, "{text}");

    // A freshly provisioned node and the old ones all get it.
    lab.add_node("edge-4");
    let out = lab.install(&["--role", "edge", "--parallel", "2"]);
    succeeded(&out);
    for n in ["edge-1", "edge-2", "edge-3", "edge-4"] {
        assert_eq!(
            std::fs::read_to_string(lab.root(n).join("current/lua/edge_extra.lua")).unwrap(),
            EXTRA_LUA
        );
        let port = lab.live_port(n);
        eventually(&format!("{n} serves the new Lua file"), || {
            get(port, "x", "/extra") == (200, "hello from a new Lua file\n".into())
        });
    }
    let plan = lab.plan_bundles();
    assert_eq!(plan.status.code(), Some(0), "{}", stdout(&plan));
    // agent.yaml did not change: not restarted again.
    assert_eq!(restarts(&lab, "edge-1"), "restarted\n");

    // --rollback: edge-1 returns to the release before.
    let before = lab.current("edge-1");
    let out = lab.install(&["--node", "edge-1", "--rollback"]);
    succeeded(&out);
    assert!(
        stdout(&out).contains("rolled back from"),
        "{}",
        stdout(&out)
    );
    assert_ne!(lab.current("edge-1"), before);
    let port = lab.live_port("edge-1");
    eventually("edge-1 serves the old release", || {
        get(port, "x", "/extra").0 == 404
    });
    assert!(
        !lab.root("edge-1")
            .join("current/lua/edge_extra.lua")
            .exists(),
        "the previous release has no edge_extra.lua"
    );
    let plan = lab.plan_bundles();
    assert_eq!(plan.status.code(), Some(2), "{}", stdout(&plan));
    assert!(
        stdout(&plan).contains("edge-1: installed version"),
        "{}",
        stdout(&plan)
    );

    // Keep K: more installs never leave more than `keep` (3) releases.
    for _ in 0..3 {
        let out = lab.install(&["--node", "edge-2"]);
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    }
    assert_eq!(lab.releases("edge-2"), 3);
}

#[test]
fn lua_nginx_and_agent_errors_stop_check_and_the_node_gate_and_a_failing_smoke_test_keeps_the_old_release()
 {
    let lab = Lab::new(1);
    let out = lab.install(&["--node", "edge-1"]);
    succeeded(&out);
    serves_old(&lab, "edge-1");
    let current = lab.current("edge-1");

    // A Lua syntax error: check names file:line; install stops before uploading.
    let good_lua = lab.read("roles/edge/lua/edge_ip.lua");
    lab.write(
        "roles/edge/lua/edge_ip.lua",
        &format!("-- broken\nlocal x = = 1\n{good_lua}"),
    );
    let line = 2;
    let check = lab.edgeform(&["check"]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        stderr(&check).contains(&format!(
            "roles/edge/lua/edge_ip.lua:{line}: unexpected symbol"
        )),
        "{}",
        stderr(&check)
    );
    let out = lab.install(&["--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("nothing was installed"),
        "{}",
        stderr(&out)
    );
    // Forced past the local gate: the node's own gate stops it.
    let out = lab.install(&["--node", "edge-1", "--skip-local-gates"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("edge-1: failed at step gate")
            && stdout(&out).contains(&format!("edge_ip.lua:{line}")),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("local gates skipped"),
        "{}",
        stderr(&out)
    );
    assert_eq!(lab.current("edge-1"), current);
    serves_old(&lab, "edge-1");
    lab.write("roles/edge/lua/edge_ip.lua", &good_lua);

    // An nginx.conf error: check names the template's line, the node refuses it.
    let good_conf = lab.read("roles/edge/nginx.conf.tmpl");
    let bad_conf = good_conf.replacen(
        "    server_tokens off;",
        "    server_tokens off;\n    no_such_directive on;",
        1,
    );
    let line = bad_conf
        .lines()
        .position(|l| l.contains("no_such_directive"))
        .unwrap()
        + 1;
    lab.write("roles/edge/nginx.conf.tmpl", &bad_conf);
    let check = lab.edgeform(&["check"]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        stderr(&check).contains(&format!(
            "roles/edge/nginx.conf.tmpl:{line} (rendered for edge-1): nginx -t refused this line"
        )) && stderr(&check).contains("`no_such_directive on;`"),
        "{}",
        stderr(&check)
    );
    let out = lab.install(&["--node", "edge-1", "--skip-local-gates"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("edge-1: failed at step gate")
            && stdout(&out).contains("unknown directive \"no_such_directive\""),
        "{}",
        stdout(&out)
    );
    assert_eq!(lab.current("edge-1"), current);
    serves_old(&lab, "edge-1");
    lab.write("roles/edge/nginx.conf.tmpl", &good_conf);

    // agent.yaml fails the agent's own validation: located in the template.
    let good_agent = lab.read("roles/edge/agent.yaml.tmpl");
    lab.write(
        "roles/edge/agent.yaml.tmpl",
        &format!("{good_agent}no_such_key: 1\n"),
    );
    let check = lab.edgeform(&["check"]);
    assert_eq!(check.status.code(), Some(1));
    let line = good_agent.lines().count() + 1;
    assert!(
        stderr(&check).contains(&format!(
            "roles/edge/agent.yaml.tmpl:{line}:1 (rendered for edge-1)"
        )),
        "{}",
        stderr(&check)
    );
    // Skipping a gate is explicit and said.
    let check = lab.edgeform(&["check", "--skip-gate", "agent"]);
    assert_eq!(check.status.code(), Some(0), "{}", stderr(&check));
    assert!(
        stderr(&check).contains("gate agent skipped"),
        "{}",
        stderr(&check)
    );
    lab.write("roles/edge/agent.yaml.tmpl", &good_agent);

    // A smoke test that fails on the candidate: the old release stays live.
    lab.write(
        "roles/edge.smoke.yaml",
        "- {path: /, host: smoke-test.invalid, status: 200}\n",
    );
    let out = lab.install(&["--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(
            "edge-1: failed at step smoke: GET / (Host: smoke-test.invalid): expected 200, got 404"
        ),
        "{}",
        stdout(&out)
    );
    assert_eq!(lab.current("edge-1"), current);
    serves_old(&lab, "edge-1");
    // The candidate is gone, and so is its release.
    assert!(!lab.root("edge-1").join("run/candidate/nginx.pid").exists());
    assert_eq!(lab.releases("edge-1"), 1);
}

#[test]
fn unknown_host_key_and_bad_role_folders_install_nothing() {
    let lab = Lab::new(1);
    let root = lab.root("edge-1");

    // A host key that is not the server's: refused at connect.
    let v = lab.ssh_args(
        &["install", "--node", "edge-1"],
        &lab.sshd.other_known_hosts,
    );
    let v: Vec<&str> = v.iter().map(String::as_str).collect();
    let out = lab.edgeform(&v);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("edge-1: failed at step connect: host key of 127.0.0.1:")
            && stdout(&out).contains("refused"),
        "{}",
        stdout(&out)
    );
    assert!(!root.exists(), "nothing reached the node");

    // A link leaving the repository.
    let outside = tempfile::NamedTempFile::new().unwrap();
    let link = lab.repo.path().join("roles/edge/secret");
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let out = lab.install(&["--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("roles/edge/secret: is a link to")
            && stderr(&out).contains("role folders hold no links"),
        "{}",
        stderr(&out)
    );
    let check = lab.edgeform(&["check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stderr(&check));
    std::fs::remove_file(&link).unwrap();

    // A file over the size limit (sparse: nothing is written).
    let big = lab.repo.path().join("roles/edge/huge.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(install::MAX_BUNDLE_FILE_BYTES + 1)
        .unwrap();
    let out = lab.install(&["--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("roles/edge/huge.bin: 67108865 bytes, over the limit"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&big).unwrap();

    // A template naming a field the node does not have.
    let conf = lab.read("roles/edge/agent.yaml.tmpl");
    lab.write(
        "roles/edge/agent.yaml.tmpl",
        &format!("{conf}# {{{{ node.cach.key }}}}\n"),
    );
    let line = conf.lines().count() + 1;
    let out = lab.install(&["--node", "edge-1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "roles/edge/agent.yaml.tmpl:{line}:3: unknown field `node.cach.key`"
        )),
        "{}",
        stderr(&out)
    );
    let out = lab.edgeform(&[
        "build",
        "--out",
        &lab.nodes.path().join("out").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!root.exists(), "nothing was installed");
}

/// `status`: the installed bundle's version (read by the agent from
/// `health.bundle_manifest`, the node's `current/manifest.json`) next to
/// the applied commit; an edge whose listener does not answer the agent's
/// probe is `not serving` in the table, the verdict and the JSON.
#[test]
fn status_shows_the_installed_bundle_next_to_the_applied_commit() {
    use crate::util::{Agent, Fixture};
    let redis = harness::redis(&[]);
    let broker = harness::mosquitto();
    let f = Fixture::with(&[
        (
            "nodes/edge-1.yaml",
            &*format!(
                "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
                 redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
                redis.port
            ),
        ),
        (
            "cluster.yaml",
            &format!(
                "name: test\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n",
                broker.port
            ),
        ),
    ]);
    let out = edgeform(f.path(), &["apply", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let node = tempfile::tempdir().unwrap();
    let version = "9e01aa7c44f2b1d0c3e5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f7a8b";
    let manifest = node.path().join("manifest.json");
    std::fs::write(
        &manifest,
        format!(
            "{{\"node\":\"edge-1\",\"roles\":[\"edge\"],\"version\":\"{version}\",\
             \"commit\":\"5be1c2d09a7e5be1c2d09a7e5be1c2d09a7e5be1\",\"files\":[]}}"
        ),
    )
    .unwrap();
    let _agent = Agent::start(&format!(
        "node: edge-1\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{}\"}}\n\
         cache: {{dirs: [{}]}}\nmqtt: {{url: \"mqtt://127.0.0.1:{}\"}}\n\
         health: {{interval: 500ms, bundle_manifest: {}, probe: [\"http://127.0.0.1:{}\"]}}\n",
        redis.port,
        node.path().join("cache").display(),
        broker.port,
        manifest.display(),
        harness::free_port()
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    let row = loop {
        let out = edgeform(f.path(), &["status", "--format", "json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        let row = v["nodes"][0].clone();
        if row["bundle"].is_string() && row["commit"].is_string() && row["serving"] == false {
            break row;
        }
        assert!(Instant::now() < deadline, "no bundle reported: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(row["bundle"], version);
    assert_eq!(
        row["bundle_commit"],
        "5be1c2d09a7e5be1c2d09a7e5be1c2d09a7e5be1"
    );
    assert_eq!(row["commit"], row["desired_commit"]);
    let out = edgeform(f.path(), &["status"]);
    let text = stdout(&out);
    assert!(text.contains("BUNDLE"), "{text}");
    assert!(text.contains("9e01aa7c44f2 (from 5be1c2d09a7e)"), "{text}");
    // Nothing listens where the agent probes: online, not serving.
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("\nedge-1  -     not serving"), "{text}");
    assert!(text.contains("1/1 online (1 not serving)"), "{text}");
    assert!(
        text.contains("verdict: OFFLINE: not serving: edge-1"),
        "{text}"
    );
}

/// The live nginx master's pid.
fn live_pid(lab: &Lab, node: &str) -> String {
    std::fs::read_to_string(lab.root(node).join("run/live/nginx.pid"))
        .unwrap()
        .trim()
        .to_owned()
}

/// `edgeform serve` for the lab's repository with `token`; killed on drop.
struct Api(std::process::Child);

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn api(lab: &Lab, port: u16, token: &str) -> Api {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .current_dir(lab.repo.path())
        .env("EDGEFORM_SERVE_TOKEN", token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "serve did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Api(child)
}

/// `edgeform secrets set NODE NAME` with `value` on stdin.
fn set_secret(lab: &Lab, node: &str, name: &str, value: &str) {
    let state = lab.state_dir().display().to_string();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["--state-dir", &state, "secrets", "set", node, name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains(value) && !stderr(&out).contains(value));
}

/// Every file under `dir` holding `needle`.
fn files_with(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            out.extend(files_with(&p, needle));
        } else if m.is_file()
            && std::fs::read(&p)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
        {
            out.push(p);
        }
    }
    out
}

/// Node secrets live in the control host's state directory (0700/0600),
/// reach the node as an environment file (0600) that nginx is started
/// with — the edge's read-API calls carry the token from it — never the
/// bundle; a changed secret restarts the live server; `check` refuses a
/// secret in `install.vars`, located and masked.
#[test]
fn node_secrets_reach_nginx_through_an_environment_file_and_never_the_bundle() {
    let lab = Lab::new(1);
    let (token, secret) = ("api-token-7f3a9c", "challenge-secret-5be1c2");
    // The edge asks the read API (edgeform serve, which needs the token)
    // on a Redis miss; its Redis holds nothing.
    let api_port = harness::free_port();
    let yaml = lab
        .node_yaml("edge-1")
        .replace("api: \"false\"", "api: \"true\"")
        .replace(
            "http://127.0.0.1:9",
            &format!("http://127.0.0.1:{api_port}"),
        );
    lab.write("nodes/edge-1.yaml", &yaml);
    lab.write(
        "sites/viaapi.yaml",
        "host: viaapi.example.com\norigin: http://192.0.2.1\n",
    );
    lab.commit();
    set_secret(&lab, "edge-1", "EDGEFORM_API_TOKEN", token);
    set_secret(&lab, "edge-1", "EDGEFORM_CHALLENGE_SECRET", secret);
    let mode = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().mode() & 0o777
    };
    let kept = lab.state_dir().join("secrets/edge-1/EDGEFORM_API_TOKEN");
    assert_eq!(mode(&kept), 0o600);
    assert_eq!(mode(kept.parent().unwrap()), 0o700);
    assert_eq!(mode(&lab.state_dir()), 0o700);
    let out = lab.edgeform(&["secrets", "list"]);
    assert_eq!(
        stdout(&out),
        "edge-1\tEDGEFORM_API_TOKEN\nedge-1\tEDGEFORM_CHALLENGE_SECRET\n"
    );
    let serve = api(&lab, api_port, token);
    // The smoke test's unknown host goes through the API too: it passes
    // only with the token.
    let out = lab.install(&["--all"]);
    succeeded(&out);
    serves_old(&lab, "edge-1");
    let port = lab.live_port("edge-1");
    // A host only the API knows: its document arrives (the origin, a
    // documentation address, does not answer: 502 or 504, not 503).
    let via_api = || get(port, "viaapi.example.com", "/").0;
    let status = via_api();
    assert!(matches!(status, 502 | 504), "{status}");
    let env_file = lab.root("edge-1").join("secrets.env");
    assert_eq!(mode(&env_file), 0o600);
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap(),
        format!("EDGEFORM_API_TOKEN='{token}'\nEDGEFORM_CHALLENGE_SECRET='{secret}'\n")
    );
    // No secret in any release, nor in what `build` writes.
    for needle in [token, secret] {
        let found = files_with(&lab.root("edge-1").join("releases"), needle);
        assert!(found.is_empty(), "{found:?}");
    }
    let built = tempfile::tempdir().unwrap();
    let out = lab.edgeform(&["build", "--out", &built.path().display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for needle in [token, secret] {
        assert!(files_with(built.path(), needle).is_empty());
    }
    // The token rotated on both sides: the live server restarts with it
    // (a reload would keep the old environment: the API would answer 401
    // and the edge 503).
    let pid = live_pid(&lab, "edge-1");
    drop(serve);
    let rotated = "api-token-rotated-0c44";
    let _serve = api(&lab, api_port, rotated);
    set_secret(&lab, "edge-1", "EDGEFORM_API_TOKEN", rotated);
    let out = lab.install(&["--all"]);
    succeeded(&out);
    assert_ne!(live_pid(&lab, "edge-1"), pid, "restarted");
    let status = via_api();
    assert!(matches!(status, 502 | 504), "{status}");
    serves_old(&lab, "edge-1");
    // A secret in install.vars: refused at its line, masked.
    let yaml = lab.node_yaml("edge-1").replace(
        "ttl_hop_port:",
        "api_token: \"leaked-token-1\", ttl_hop_port:",
    );
    lab.write("nodes/edge-1.yaml", &yaml);
    let out = lab.edgeform(&["check", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let d = &v["diagnostics"][0];
    assert_eq!(d["code"], "inline-secret", "{v}");
    assert_eq!(d["file"], "nodes/edge-1.yaml", "{v}");
    assert_eq!(d["line"], 14, "{v}");
    assert!(!stdout(&out).contains("leaked-token-1"), "{v}");
    let out = lab.edgeform(&["check"]);
    assert!(!stderr(&out).contains("leaked-token-1"), "{}", stderr(&out));
}

/// A field of `edgeform:bundle` on a Redis.
fn bundle_field(redis_port: u16, field: &str) -> String {
    let out = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis_port.to_string(),
            "HGET",
            "edgeform:bundle",
            field,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The version-skew gate with the real installer: edge-1 gets an older
/// edge bundle (its `reads.json` and its Lua know no `max_body_size`),
/// edge-2 the current one. A site using `max_body_size` is refused on
/// edge-1 only — the typed `install-first` refusal, nothing written
/// there — and applied on edge-2; `status` shows the skew per node (table,
/// verdict and JSON); installing the current bundle on edge-1 clears it.
#[test]
fn an_edge_with_an_older_bundle_is_refused_what_it_cannot_read_and_status_shows_the_skew() {
    let lab = Lab::own_redis(2);
    let (r1, r2) = (lab.own[0].port, lab.own[1].port);
    let current_reads = lab.read("roles/edge/reads.json");
    let current_tables = lab.read("roles/edge/lua/edge_tables.lua");
    // The older release: no max_body_size in what it declares or reads.
    let older_reads = current_reads.replace("    \"max_body_size\",\n", "");
    let older_tables = current_tables.replace("    max_body_size = \"uint64?\",\n", "");
    assert!(older_reads != current_reads && older_tables != current_tables);
    lab.write("roles/edge/reads.json", &older_reads);
    lab.write("roles/edge/lua/edge_tables.lua", &older_tables);
    let out = lab.install(&["--node", "edge-1"]);
    succeeded(&out);
    lab.write("roles/edge/reads.json", &current_reads);
    lab.write("roles/edge/lua/edge_tables.lua", &current_tables);
    let out = lab.install(&["--node", "edge-2"]);
    succeeded(&out);
    assert!(!bundle_field(r1, "site_fields").contains("max_body_size"));
    assert!(bundle_field(r2, "site_fields").contains("max_body_size"));
    // The installed agent.yaml probes the live edge's three listeners (one
    // rendering: no candidate copy).
    let current = lab.root("edge-2").join("current");
    let agent_yaml = std::fs::read_to_string(current.join("agent.yaml")).unwrap();
    let y = lab.node_yaml("edge-2");
    let https = y.lines().find(|l| l.starts_with("https:")).unwrap();
    let port_of = |text: &str, key: &str| {
        let at = text.find(key).unwrap() + key.len();
        text[at..at + text[at..].find('"').unwrap()].to_owned()
    };
    for (scheme, port) in [
        ("http", port_of(&y, "  listen: \"127.0.0.1:")),
        ("https", port_of(https, "{listen: \"127.0.0.1:")),
        ("proxy", port_of(https, "proxy_listen: \"127.0.0.1:")),
    ] {
        let want = format!("- \"{scheme}://127.0.0.1:{port}\"");
        assert!(agent_yaml.contains(&want), "{want}\n{agent_yaml}");
    }
    assert!(!current.join("candidate/agent.yaml").exists());

    lab.write(
        "sites/upload.yaml",
        "host: upload.example.com\norigin: http://192.0.2.1\nmax_body_size: 1m\n",
    );
    lab.commit();
    let out = lab.edgeform(&["plan", "--format", "json"]);
    let plan = stdout(&out);
    assert!(plan.contains("install-first"), "{plan}\n{}", stderr(&out));
    let out = lab.edgeform(&["apply", "--yes"]);
    let text = format!("{}\n{}", stdout(&out), stderr(&out));
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("install first: edge-1's installed code reads the seed's site fields and fallback_origins, https_redirect, origin_tls_verify, skippable, tls, and tls:*; this commit's site:upload.example.com uses max_body_size"),
        "{text}"
    );
    assert!(!text.contains("install first: edge-2"), "{text}");
    // edge-2 serves the site (its origin, a documentation address, does not
    // answer); edge-1 was not written: the host is unknown there, never a
    // 502 bad-document.
    let (status, _) = get(lab.live_port("edge-2"), "upload.example.com", "/");
    assert!(matches!(status, 502 | 504), "{status}");
    assert_eq!(
        get(lab.live_port("edge-1"), "upload.example.com", "/"),
        (404, "unknown host\n".to_owned())
    );

    let out = lab.edgeform(&["status", "--from", "redis", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["nodes"][0]["node"], "edge-1");
    assert_eq!(
        v["nodes"][0]["install_first"],
        serde_json::json!(["max_body_size"])
    );
    assert!(v["nodes"][1].get("install_first").is_none(), "{v}");
    assert_eq!(v["verdict"], "drift");
    let out = lab.edgeform(&["status", "--from", "redis"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("install first: edge-1's installed edge code does not read what this commit uses: site:upload.example.com uses max_body_size"),
        "{text}"
    );
    assert!(
        text.contains("install first: edge-1 (max_body_size)"),
        "{text}"
    );

    // The current bundle on edge-1: the skew is gone, apply converges.
    let out = lab.install(&["--node", "edge-1"]);
    succeeded(&out);
    let out = lab.edgeform(&["apply", "--yes"]);
    succeeded(&out);
    let out = lab.edgeform(&["status", "--from", "redis", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["verdict"], "ok", "{v}");
}
