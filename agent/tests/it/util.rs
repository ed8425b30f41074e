//! Helpers: an agent process with its config, cache files, Redis access.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent::cache::Levels;

/// A temp cache with `static` and `dynamic` dirs, levels 1:2.
pub struct Cache {
    pub root: tempfile::TempDir,
    pub levels: Levels,
}

impl Cache {
    pub fn new() -> Cache {
        let root = tempfile::tempdir().unwrap();
        for d in ["static", "dynamic"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        Cache {
            root,
            levels: Levels::parse("1:2").unwrap(),
        }
    }

    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    pub fn dirs(&self) -> Vec<PathBuf> {
        vec![self.dir("static"), self.dir("dynamic")]
    }

    /// Cache `key` in `dir` with a small body; returns the file.
    pub fn put(&self, dir: &str, key: &str) -> PathBuf {
        agent::cache::write_cache_file(
            &self.dir(dir),
            &self.levels,
            key,
            format!("body of {key}").as_bytes(),
        )
        .unwrap()
    }
}

/// A running agent, killed on drop.
pub struct Agent {
    pub child: Option<Child>,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Extra environment for the process.
    pub env: Vec<(String, String)>,
    /// A command the agent runs under (e.g. `prlimit --nofile=…`).
    pub wrapper: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Agent {
    pub fn start(redis_port: u16, dirs: &[PathBuf]) -> Agent {
        Agent::start_with(redis_port, dirs, "")
    }

    /// With more `agent.yaml` text appended.
    pub fn start_with(redis_port: u16, dirs: &[PathBuf], extra: &str) -> Agent {
        Agent::start_env(redis_port, dirs, extra, &[])
    }

    /// With more `agent.yaml` text and environment variables.
    pub fn start_env(
        redis_port: u16,
        dirs: &[PathBuf],
        extra: &str,
        env: &[(&str, &str)],
    ) -> Agent {
        Agent::start_wrapped(redis_port, dirs, extra, env, &[])
    }

    /// Run under `wrapper` (a command line the agent's is appended to).
    pub fn start_wrapped(
        redis_port: u16,
        dirs: &[PathBuf],
        extra: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Agent {
        let redis = format!("\n  url: redis://127.0.0.1:{redis_port}");
        Agent::start_full(&redis, dirs, extra, env, wrapper)
    }

    /// With `redis` as the `redis:` value (flow or block text).
    pub fn start_redis(redis: &str, dirs: &[PathBuf]) -> Agent {
        Agent::start_full(redis, dirs, "", &[], &[])
    }

    fn start_full(
        redis: &str,
        dirs: &[PathBuf],
        extra: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Agent {
        Agent::start_named("edge-1", redis, dirs, extra, env, wrapper)
    }

    /// Node `node` (agent.yaml `node:`), `redis` as the `redis:` value,
    /// more `agent.yaml` text, environment variables and a wrapper
    /// command.
    pub fn start_named(
        node: &str,
        redis: &str,
        dirs: &[PathBuf],
        extra: &str,
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("agent.yaml");
        let list: Vec<String> = dirs
            .iter()
            .map(|d| format!("    - {}", d.display()))
            .collect();
        std::fs::write(
            &config,
            format!(
                "node: {node}\nregion: eu\nredis: {redis}\n{}cache:\n  dirs:\n{}\n  levels: \"1:2\"\n{extra}",
                // Each agent its own command record, unless the test
                // names one.
                if extra.contains("state_dir:") {
                    String::new()
                } else {
                    format!("state_dir: {}\n", dir.path().join("state").display())
                },
                list.join("\n")
            ),
        )
        .unwrap();
        let log = dir.path().join("agent.log");
        let mut a = Agent {
            child: None,
            config,
            log,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            wrapper: wrapper.iter().map(|w| (*w).to_owned()).collect(),
            _dir: dir,
        };
        a.spawn();
        a
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let bin = env!("CARGO_BIN_EXE_edgeform-agent");
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = command
            .arg("--config")
            .arg(&self.config)
            .env("EDGEFORM_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; returns the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        c.wait().ok()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn con(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap()
}

pub const QUEUE: &str = "cdn:purge:eu:edge-1";

pub fn push_job(port: u16, job: &str) {
    redis::cmd("RPUSH")
        .arg(QUEUE)
        .arg(job)
        .exec(&mut con(port))
        .unwrap();
}

/// Wait for `cdn:purge:done:<id>`'s edge-1 field.
pub fn wait_done(port: u16, id: &str, agent: &Agent) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v: Option<String> = redis::cmd("HGET")
            .arg(format!("cdn:purge:done:{id}"))
            .arg("edge-1")
            .query(&mut con(port))
            .unwrap();
        if let Some(v) = v {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} not done; agent log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn exists(p: &Path) -> bool {
    p.symlink_metadata().is_ok()
}

/// A test MQTT client (clean session): publishes, and collects every
/// message of its subscriptions on a channel.
pub struct Mqtt {
    pub client: rumqttc::Client,
    rx: std::sync::mpsc::Receiver<rumqttc::Publish>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Mqtt {
    pub fn connect(port: u16) -> Mqtt {
        Mqtt::connect_with(port, None)
    }

    /// With a username and password.
    pub fn connect_as(port: u16, user: &str, password: &str) -> Mqtt {
        Mqtt::connect_with(port, Some((user, password)))
    }

    fn connect_with(port: u16, login: Option<(&str, &str)>) -> Mqtt {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = format!(
            "test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(5));
        o.set_max_packet_size(16 << 20, 16 << 20);
        if let Some((user, password)) = login {
            o.set_credentials(user, password);
        }
        let (client, mut connection) = rumqttc::Client::new(o, 64);
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for event in connection.iter() {
                if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                match event {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        if tx.send(p).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        });
        Mqtt { client, rx, stop }
    }

    /// Subscribe and give the broker a moment to deliver retained messages.
    pub fn subscribe(&self, topic: &str) {
        self.client
            .subscribe(topic, rumqttc::QoS::AtLeastOnce)
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }

    pub fn publish(&self, topic: &str, payload: impl Into<Vec<u8>>, retain: bool) {
        self.client
            .publish(topic, rumqttc::QoS::AtLeastOnce, retain, payload.into())
            .unwrap();
    }

    /// The next message on `topic` passing `accept`, within `secs`.
    pub fn wait(
        &self,
        topic: &str,
        secs: u64,
        mut accept: impl FnMut(&[u8]) -> bool,
    ) -> Option<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.rx.recv_timeout(left) {
                Ok(p) if p.topic == topic && accept(&p.payload) => return Some(p.payload.to_vec()),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }
}

impl Mqtt {
    /// The next message on any topic within `secs`: (topic, payload).
    pub fn wait_any(&self, secs: u64) -> Option<(String, Vec<u8>)> {
        self.rx
            .recv_timeout(Duration::from_secs(secs))
            .ok()
            .map(|p| (p.topic.clone(), p.payload.to_vec()))
    }
}

impl Drop for Mqtt {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.client.disconnect();
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A process's resident set size, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}
