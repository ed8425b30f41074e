//! Shared helpers: miniature repositories in temp dirs, and running the
//! `edgeform` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use compiler::Checked;

/// A minimal valid repository: one edge and one site.
pub const BASE: &[(&str, &str)] = &[
    (
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\n",
    ),
    (
        "nodes/edge-1.yaml",
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
         addresses: [198.51.100.1]\nredis: {url: \"redis://127.0.0.1:6379\"}\n",
    ),
];

/// A temp dir holding a config repository.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    /// `BASE` with `files` written over it (an empty text deletes a file).
    pub fn with(files: &[(&str, &str)]) -> Fixture {
        let f = Fixture::empty();
        f.write_all(BASE);
        f.write_all(files);
        f
    }

    pub fn empty() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write_all(&self, files: &[(&str, &str)]) {
        for (name, text) in files {
            self.write(name, text.as_bytes());
        }
    }

    pub fn write(&self, name: &str, bytes: &[u8]) {
        let path = self.path().join(name);
        if bytes.is_empty() {
            let _ = std::fs::remove_file(&path);
            return;
        }
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    pub fn check(&self) -> Checked {
        let repo = compiler::load::from_dir(self.path()).unwrap();
        compiler::check(&repo)
    }

    /// `git init` and commit everything; returns the commit id.
    pub fn commit(&self, message: &str) -> String {
        git(self.path(), &["init", "-q", "-b", "main"]);
        git(self.path(), &["add", "-A"]);
        git(
            self.path(),
            &["commit", "-q", "--allow-empty", "-m", message],
        );
        let out = git(self.path(), &["rev-parse", "HEAD"]);
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

pub fn git(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `edgeform` with `args` in `dir`; `NO_COLOR` set.
pub fn edgeform(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// Run `edgeform` with `args` in `dir`, its state store at `state`
/// (`EDGEFORM_STATE_DIR`); `NO_COLOR` set.
pub fn edgeform_with_state(dir: &Path, state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("EDGEFORM_STATE_DIR", state)
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The project's own example repository (the workspace root).
pub fn example_repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// The agent's library run in-process (what the `edgeform-agent` binary's
/// main calls: `cargo test -p compiler` does not build that binary) from
/// an `agent.yaml` text; stopped and joined on drop.
pub struct Agent {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Its `state_dir` (the command record), its own.
    _state: tempfile::TempDir,
}

impl Agent {
    pub fn start(yaml: &str) -> Agent {
        // `RUST_LOG=agent=debug` shows what the in-process agents did
        // (with the test's output, kept for a failing test).
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let state = tempfile::tempdir().unwrap();
        let yaml = format!("{yaml}\nstate_dir: {}\n", state.path().display());
        let config = std::sync::Arc::new(agent::config::parse("agent.yaml", &yaml).unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(agent::run_with(config, None, async {
                let _ = stopped.await;
            }))
            .unwrap();
        });
        Agent {
            stop: Some(stop),
            thread: Some(thread),
            _state: state,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An HTTP/1.1 answer read off a raw connection: status (0 when none),
/// headers (lower-case names), body.
#[derive(Debug, Default, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: std::collections::BTreeMap<String, String>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Send `request` (raw bytes, `Connection: close`) to 127.0.0.1:`port`
/// and read the whole answer (at most `timeout` per read).
pub fn exchange(port: u16, request: &str, timeout: std::time::Duration) -> Answer {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// `nodes/edge-1.yaml` of a one-edge repository whose Redis is
/// 127.0.0.1:`redis_port`.
pub fn edge_1_node(redis_port: u16) -> String {
    format!(
        "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
         addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{redis_port}\"}}\n"
    )
}

/// `cluster.yaml` whose `acme:` block points at `pebble` (its directory
/// and CA), followed by `extra` (more `acme:` keys, indented, or other
/// top-level keys).
pub fn acme_cluster_yaml(pebble: &harness::pebble::Pebble, extra: &str) -> String {
    format!(
        "acme:\n  directory: {}\n  contact: [\"mailto:ops@example.com\"]\n  ca_file: {}\n{extra}",
        pebble.directory(),
        pebble.tls_ca().display()
    )
}

/// A committed one-edge repository (edge-1's Redis on `redis_port`) with
/// one site, `shop.test`, whose certificate comes from `pebble`.
pub fn acme_site_repo(pebble: &harness::pebble::Pebble, redis_port: u16) -> Fixture {
    let f = Fixture::empty();
    f.write("cluster.yaml", acme_cluster_yaml(pebble, "").as_bytes());
    f.write("nodes/edge-1.yaml", edge_1_node(redis_port).as_bytes());
    f.write(
        "sites/shop.test.yaml",
        b"host: shop.test\norigin: https://192.0.2.1\ntls: {acme: true}\n",
    );
    f.commit("acme site");
    f
}

/// The real `reconcile` daemon on `repo` with `state`: sync every second,
/// heal hourly (out of the way), metrics on a free port. Returns the
/// metrics port and the process.
pub fn sync_daemon(repo: &Path, state: &Path) -> (u16, harness::Process) {
    let metrics = harness::free_port();
    let daemon = harness::program(
        Path::new(env!("CARGO_BIN_EXE_edgeform")),
        [
            "--repo",
            repo.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "reconcile",
            "--sync-every",
            "1s",
            "--heal-every",
            "1h",
            "--metrics-listen",
            &format!("127.0.0.1:{metrics}"),
        ]
        .map(str::to_owned)
        .to_vec(),
        std::net::Ipv4Addr::LOCALHOST,
        metrics,
    );
    (metrics, daemon)
}

/// The shared state store on the redis-server at 127.0.0.1:`port`, as
/// the default user (no password, no TLS).
pub fn plain_store(port: u16) -> control::store::RedisStore {
    control::store::RedisStore::new(edgestate::target::RedisTarget::Url {
        url: format!("redis://127.0.0.1:{port}"),
        username: None,
        password_env: None,
        tls: None,
    })
    .unwrap()
}

/// `luajit ARGS` with `input` on its stdin: its stdout's lines (it must
/// succeed; its stderr is shown otherwise).
pub fn luajit_lines(args: &[&str], input: &[u8]) -> Vec<String> {
    use std::io::Write as _;
    let mut child = Command::new("luajit")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("luajit (apt-get install luajit2)");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}
