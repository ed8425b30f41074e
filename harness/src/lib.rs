//! One shared test harness for real servers: `redis-server`, Redis
//! Sentinel (`redis-server --sentinel`) and `mosquitto`, each started on a
//! free loopback port in its own temp dir, waited for until it answers,
//! and stopped by pid when dropped. Never a mock.
//!
//! Tests need the Debian packages `redis-server`, `mosquitto`,
//! `openssh-server` (for [`sshd`]), `haproxy` (for [`haproxy`]) and
//! `dnsmasq-base` (for [`dnsmasq`]), `prometheus` (for [`prometheus`]);
//! `scripts/test` installs them.

pub mod sshd;

pub mod bridge;

pub mod nginx;

pub mod acmefault;
pub mod haproxy;
pub mod sitecerts;
pub use sitecerts::SiteCerts;
/// A real ACME CA (pebble) with its DNS.
pub mod pebble;
pub use pebble::{Pebble, PebbleOptions, pebble};

pub mod netns;

/// A real Prometheus scraping given targets.
pub mod prometheus;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound then released; servers retry on a
/// collision).
///
/// Picked below the kernel's ephemeral range (`ip_local_port_range`,
/// 32768–60999 by default): a port from that range can be taken, between
/// this check and the server's bind, by the local end of any outgoing
/// connection on the machine (300 agents connecting in a benchmark were
/// enough). Each process walks the range from its own offset so parallel
/// tests and test processes rarely try the same port; a port in use is
/// skipped. When the range below is too small, the kernel's choice.
///
/// # Panics
/// When no port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral > LOW + 1_000 {
        let span = ephemeral - LOW;
        let seed = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
        let _ = NEXT.compare_exchange(0, seed % span + 1, Ordering::Relaxed, Ordering::Relaxed);
        for _ in 0..span {
            let port = LOW + NEXT.fetch_add(1, Ordering::Relaxed) % span;
            let Ok(port) = u16::try_from(port) else {
                continue;
            };
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind")
}

fn find(binary: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"] {
        let p = Path::new(dir).join(binary);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{binary}` not found: install it (scripts/test does: apt-get install redis-server mosquitto)"
    );
}

/// Send one inline command and return the raw reply (for readiness checks
/// and for poking servers without a client library).
///
/// # Errors
/// Connection or I/O failures.
pub fn raw_command(port: u16, command: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )?;
    s.set_read_timeout(Some(Duration::from_millis(1000)))?;
    s.write_all(format!("{command}\r\n").as_bytes())?;
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A running server process, killed (and waited for) on drop.
pub struct Process {
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    log: PathBuf,
    /// How it was started, for [`Process::restart`]: a program name
    /// (looked up in the system's folders) or a path.
    binary: String,
    args: Vec<String>,
    /// The address it listens on with `port` (readiness and restart).
    addr: std::net::Ipv4Addr,
}

impl Process {
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The server's log, for failure messages.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Freeze it (SIGSTOP): its sockets stay open and the kernel still
    /// takes connections, but it answers nothing (a hung server, or one cut
    /// off without a reset).
    ///
    /// # Panics
    /// When the signal cannot be sent.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Let a frozen one run again (SIGCONT).
    ///
    /// # Panics
    /// When the signal cannot be sent.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let sent = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "kill {sig} {}", self.pid());
    }

    /// Stop now with SIGKILL (a crash, not a shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop with SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Process {
    /// Start it again after [`Process::kill`] or [`Process::stop`] (or
    /// stop it first): same binary, configuration, folder and port — for
    /// mosquitto, the persisted sessions survive.
    ///
    /// # Panics
    /// When it does not come back within 10 s.
    pub fn restart(&mut self) {
        self.stop();
        let mut last = String::new();
        for _ in 0..50 {
            let child =
                spawn(&self.binary, &self.args, self.dir.path(), &self.log).expect("respawn");
            self.child = Some(child);
            let addr = self.addr;
            if wait_ready(self, |port| TcpStream::connect((addr, port)).is_ok()) {
                return;
            }
            // The port may still be in TIME_WAIT or the old process lingering.
            last = self.log();
            self.kill();
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "{} did not restart on port {}:\n{last}",
            self.binary, self.port
        );
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(binary: &str, args: &[String], dir: &Path, log: &Path) -> std::io::Result<Child> {
    let log_file = std::fs::File::create(log)?;
    let program = if binary.contains('/') {
        PathBuf::from(binary)
    } else {
        find(binary)
    };
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
}

fn wait_ready(p: &mut Process, ready: impl Fn(u16) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(c) = p.child.as_mut()
            && let Ok(Some(_)) = c.try_wait()
        {
            return false; // exited (port taken?)
        }
        if ready(p.port) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(15));
    }
    false
}

/// Start a DNS server (Debian's `dnsmasq-base`) on a free loopback port
/// (UDP and TCP) that answers each `(name, IPv4 address)` of `names` —
/// the name and every name under it — with a 30 s TTL, and nothing else
/// (no upstream, no `/etc/hosts`): refused.
///
/// # Panics
/// When it does not come up after a few attempts (the log is shown).
#[must_use]
pub fn dnsmasq(names: &[(&str, &str)]) -> Process {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let log = dir.path().join("dnsmasq.log");
        let mut args = vec![
            "--keep-in-foreground".to_owned(),
            format!("--port={port}"),
            "--listen-address=127.0.0.1".to_owned(),
            "--bind-interfaces".to_owned(),
            "--no-resolv".to_owned(),
            "--no-hosts".to_owned(),
            "--local-ttl=30".to_owned(),
            format!("--pid-file={}", dir.path().join("dnsmasq.pid").display()),
        ];
        for (name, addr) in names {
            args.push(format!("--address=/{name}/{addr}"));
        }
        let child = spawn("dnsmasq", &args, dir.path(), &log).expect("spawn dnsmasq");
        let mut p = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "dnsmasq".to_owned(),
            args,
            addr: std::net::Ipv4Addr::LOCALHOST,
        };
        if wait_ready(&mut p, |port| {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            return p;
        }
        last = p.log();
        p.kill();
    }
    panic!("dnsmasq did not start:\n{last}");
}

/// Start `program` (a path, e.g. a binary this workspace built) with
/// `args` in a new temporary folder (its log there), up when
/// `addr:port` accepts a connection; restartable and killed on drop like
/// every [`Process`].
///
/// # Panics
/// When it does not come up within 10 s (its log is shown).
#[must_use]
pub fn program(program: &Path, args: Vec<String>, addr: std::net::Ipv4Addr, port: u16) -> Process {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("process.log");
    let binary = program.display().to_string();
    let child = spawn(&binary, &args, dir.path(), &log).unwrap_or_else(|e| panic!("{binary}: {e}"));
    let mut p = Process {
        child: Some(child),
        port,
        dir,
        log,
        binary,
        args,
        addr,
    };
    if !wait_ready(&mut p, |port| TcpStream::connect((addr, port)).is_ok()) {
        panic!(
            "{} did not come up on {addr}:{port}:\n{}",
            p.binary,
            p.log()
        );
    }
    p
}

/// Start a Redis server on a free port (`extra` are more config lines,
/// e.g. `requirepass secret`).
///
/// # Panics
/// When it does not come up after a few attempts (the log is shown).
#[must_use]
pub fn redis(extra: &[&str]) -> Process {
    start_redis(extra, None)
}

/// Start a Redis server on a given port (to restart one "in place").
#[must_use]
pub fn redis_on(port: u16, extra: &[&str]) -> Process {
    start_redis(extra, Some(port))
}

fn start_redis(extra: &[&str], fixed: Option<u16>) -> Process {
    let auth = extra
        .iter()
        .find_map(|l| l.strip_prefix("requirepass "))
        .map(str::to_owned);
    start_redis_conf(
        "redis-server",
        fixed,
        |port| {
            let mut lines = vec![format!("port {port}")];
            lines.extend(extra.iter().map(|l| (*l).to_owned()));
            lines
        },
        |port| {
            let cmd = match &auth {
                Some(pw) => format!("AUTH {pw}\r\nPING"),
                None => "PING".to_owned(),
            };
            raw_command(port, &cmd).is_ok_and(|r| r.contains("PONG") || r.starts_with("+OK"))
        },
    )
}

/// Start a redis-server on `fixed` or a free port (retrying on another
/// free one): no persistence, its folder a new temporary one, then
/// `lines(port)`; up when `ready(port)`. `what` names it in the panic.
fn start_redis_conf(
    what: &str,
    fixed: Option<u16>,
    lines: impl Fn(u16) -> Vec<String>,
    ready: impl Fn(u16) -> bool,
) -> Process {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = fixed.unwrap_or_else(free_port);
        let log = dir.path().join("redis.log");
        let mut conf = format!(
            "bind 127.0.0.1\nsave \"\"\nappendonly no\ndaemonize no\n\
             dir {}\nprotected-mode no\n",
            dir.path().display()
        );
        for line in lines(port) {
            conf.push_str(&line);
            conf.push('\n');
        }
        let conf_path = dir.path().join("redis.conf");
        std::fs::write(&conf_path, conf).expect("write conf");
        let args = vec![conf_path.display().to_string()];
        let child = spawn("redis-server", &args, dir.path(), &log).expect("spawn redis-server");
        let mut p = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "redis-server".into(),
            addr: std::net::Ipv4Addr::LOCALHOST,
            args,
        };
        if wait_ready(&mut p, &ready) {
            return p;
        }
        last = p.log();
    }
    panic!("{what} did not start:\n{last}");
}

/// Wait (up to 30 s) until the Sentinel at `sentinel` names the server at
/// `port` as `master_name`'s master and has finished the failover: its
/// `SENTINEL MASTER` entry, which `edgeredis` resolves masters from, is at
/// `port` and flagged neither down nor failing over
/// (`get-master-addr-by-name` names the promoted replica earlier).
///
/// # Panics
/// When it does not within 30 s (the Sentinel's log is shown).
pub fn wait_for_master(sentinel: &Process, master_name: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = raw_command(sentinel.port, &format!("SENTINEL master {master_name}"))
            .unwrap_or_default();
        // The `port` field's value (a bare number could be a millisecond
        // counter's).
        let digits = port.to_string();
        let at_port = reply.contains(&format!("port\r\n${}\r\n{digits}\r\n", digits.len()));
        let settled = ["s_down", "o_down", "failover_in_progress", "promoted"]
            .iter()
            .all(|flag| !reply.contains(flag));
        if at_port && settled {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no failover to {port}: {reply}\n{}",
            sentinel.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Start a Sentinel monitoring `master_name` at 127.0.0.1:`master_port`,
/// with fast failover settings for tests (quorum 1).
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn sentinel(master_name: &str, master_port: u16) -> Process {
    sentinel_with(master_name, master_port, &[])
}

fn sentinel_with(master_name: &str, master_port: u16, extra: &[String]) -> Process {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let log = dir.path().join("sentinel.log");
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {}\nprotected-mode no\n\
             sentinel monitor {master_name} 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds {master_name} 500\n\
             sentinel failover-timeout {master_name} 2000\n\
             sentinel parallel-syncs {master_name} 1\n",
            dir.path().display()
        );
        let mut conf = conf;
        for line in extra {
            conf.push_str(line);
            conf.push('\n');
        }
        let conf_path = dir.path().join("sentinel.conf");
        std::fs::write(&conf_path, conf).expect("write conf");
        let args = vec![conf_path.display().to_string(), "--sentinel".to_owned()];
        let child = spawn("redis-server", &args, dir.path(), &log).expect("spawn sentinel");
        let mut p = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "redis-server".into(),
            addr: std::net::Ipv4Addr::LOCALHOST,
            args,
        };
        let name = master_name.to_owned();
        if wait_ready(&mut p, |port| {
            raw_command(port, &format!("SENTINEL get-master-addr-by-name {name}"))
                .is_ok_and(|r| r.starts_with('*'))
        }) {
            return p;
        }
        last = p.log();
    }
    panic!("sentinel did not start:\n{last}");
}

/// Start mosquitto on a free loopback port (anonymous access, persistence
/// in its temp dir so a restart keeps sessions).
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn mosquitto() -> Process {
    mosquitto_with(None, tempfile::tempdir().expect("tempdir"))
}

/// Restart mosquitto on the same port with the same persistence folder.
#[must_use]
pub fn mosquitto_restart(port: u16, dir: tempfile::TempDir) -> Process {
    mosquitto_with(Some(port), dir)
}

/// A mosquitto with TLS (a CA and a server certificate for 127.0.0.1
/// made with `openssl`) and one user; anonymous access refused. Returns
/// the server and the CA file clients must trust.
///
/// # Panics
/// When `openssl` or `mosquitto_passwd` fail, or it does not come up.
#[must_use]
pub fn mosquitto_tls(user: &str, password: &str) -> (Process, PathBuf) {
    let broker = mosquitto_tries(None, None, |p| {
        make_certs(p, "2");
        run_in(
            p,
            "mosquitto_passwd",
            &["-c", "-b", "passwd", user, password],
        );
        format!(
            "user root\nallow_anonymous false\npassword_file {dir}/passwd\ncafile {dir}/ca.pem\n\
             certfile {dir}/server.pem\nkeyfile {dir}/server.key\n",
            dir = p.display()
        )
    });
    let ca = broker.dir.path().join("ca.pem");
    (broker, ca)
}

fn run_in(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(find(program))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In `dir`, with `openssl`: a CA (`ca.pem`, `ca.key`), a server
/// certificate for 127.0.0.1/localhost (`server.pem`, `server.key`) valid
/// for `server_days` days (`"-1"`: already expired) and a client
/// certificate (`client.pem`, `client.key`), both signed by the CA.
fn make_certs(dir: &Path, server_days: &str) {
    let run = |program: &str, args: &[&str]| run_in(dir, program, args);
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=edgeform test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write san");
    for (name, cn, days) in [
        ("server", "127.0.0.1", server_days),
        ("client", "edgeform client", "2"),
    ] {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let pem = format!("{name}.pem");
        run(
            "openssl",
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &key,
                "-out",
                &csr,
            ],
        );
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                days,
                "-extfile",
                "san.ext",
                "-out",
                &pem,
            ],
        );
    }
}

/// Test certificates made with `openssl` (see [`Certs::new`]), kept in
/// a temporary directory for as long as this lives.
pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    /// A fresh CA, a server certificate for 127.0.0.1 and a client
    /// certificate. Each call makes a different CA.
    ///
    /// # Panics
    /// When `openssl` fails.
    #[must_use]
    pub fn new() -> Certs {
        Certs::with_server_days("2")
    }

    /// Like [`Certs::new`], with a server certificate that expired
    /// yesterday (`openssl x509 -days -1`).
    ///
    /// # Panics
    /// When `openssl` fails.
    #[must_use]
    pub fn expired() -> Certs {
        Certs::with_server_days("-1")
    }

    fn with_server_days(days: &str) -> Certs {
        let dir = tempfile::tempdir().expect("tempdir");
        make_certs(dir.path(), days);
        Certs { dir }
    }

    /// The file `name` (`ca.pem`, `server.pem`, `server.key`,
    /// `client.pem`, `client.key`).
    #[must_use]
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// redis.conf lines serving TLS on `tls_port` with these certificates.
    fn redis_conf(&self, tls_port: u16, auth_clients: &str) -> Vec<String> {
        vec![
            format!("tls-port {tls_port}"),
            format!("tls-cert-file {}", self.file("server.pem").display()),
            format!("tls-key-file {}", self.file("server.key").display()),
            format!("tls-ca-cert-file {}", self.file("ca.pem").display()),
            format!("tls-auth-clients {auth_clients}"),
        ]
    }
}

impl Default for Certs {
    fn default() -> Self {
        Certs::new()
    }
}

/// A redis-server also serving TLS (with `certs`) on the returned port;
/// client certificates optional, or required with `require_client_cert`.
/// Its plain port (`Process::port`) stays open on loopback so tests can
/// check readiness and look at the data without TLS.
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn redis_tls(certs: &Certs, require_client_cert: bool) -> (Process, u16) {
    let tls_port = free_port();
    let auth = if require_client_cert {
        "yes"
    } else {
        "optional"
    };
    let lines = certs.redis_conf(tls_port, auth);
    let extra: Vec<&str> = lines.iter().map(String::as_str).collect();
    let p = redis(&extra);
    // Ready on the plain port means the TLS listener is bound too.
    (p, tls_port)
}

/// A redis-server serving only TLS (with `certs`; `port 0`: no plain
/// listener at all), so a client that reaches it really speaks TLS. The
/// process's `port` is the TLS port; `extra` are more config lines (e.g.
/// `requirepass`). Client certificates optional, or required with
/// `require_client_cert`.
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn redis_tls_only(certs: &Certs, require_client_cert: bool, extra: &[&str]) -> Process {
    let auth = if require_client_cert {
        "yes"
    } else {
        "optional"
    };
    start_redis_conf(
        "redis-server (TLS only)",
        None,
        |port| {
            let mut lines = vec!["port 0".to_owned()];
            lines.extend(certs.redis_conf(port, auth));
            lines.extend(extra.iter().map(|l| (*l).to_owned()));
            lines
        },
        |port| TcpStream::connect(("127.0.0.1", port)).is_ok(),
    )
}

/// A Sentinel serving TLS on the returned port, monitoring `master_name`
/// at 127.0.0.1:`master_tls_port` over TLS (`tls-replication yes`).
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn sentinel_tls(master_name: &str, master_tls_port: u16, certs: &Certs) -> (Process, u16) {
    let tls_port = free_port();
    let mut lines = certs.redis_conf(tls_port, "optional");
    lines.push("tls-replication yes".into());
    lines.push(format!(
        "tls-client-cert-file {}",
        certs.file("client.pem").display()
    ));
    lines.push(format!(
        "tls-client-key-file {}",
        certs.file("client.key").display()
    ));
    (
        sentinel_with(master_name, master_tls_port, &lines),
        tls_port,
    )
}

/// A mosquitto with password logins for `users` and the ACL file
/// `acl` (mosquitto `acl_file` syntax); anonymous access refused.
///
/// # Panics
/// When `mosquitto_passwd` fails, or it does not come up.
#[must_use]
pub fn mosquitto_acl(users: &[(&str, &str)], acl: &str) -> Process {
    mosquitto_tries(None, None, |p| {
        for (i, (user, password)) in users.iter().enumerate() {
            let mut args = vec!["-b", "passwd", user, password];
            if i == 0 {
                args.insert(0, "-c");
            }
            run_in(p, "mosquitto_passwd", &args);
        }
        std::fs::write(p.join("acl"), acl).expect("write acl");
        format!(
            "allow_anonymous false\npassword_file {dir}/passwd\nacl_file {dir}/acl\n",
            dir = p.display()
        )
    })
}

/// A mosquitto with its dynamic-security plugin: anonymous access and
/// every topic allowed, and one login per `(username, password,
/// client id)` that the broker accepts only under that client id (a
/// connection with the same login and another id is refused, CONNACK
/// "not authorised").
///
/// # Panics
/// When `mosquitto_ctrl` fails, the plugin is not installed, or the broker
/// does not come up.
#[must_use]
pub fn mosquitto_bound_ids(clients: &[(&str, &str, &str)]) -> Process {
    let plugin = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(Result::ok)
        .map(|e| e.path().join("mosquitto_dynamic_security.so"))
        .find(|so| so.exists())
        .expect("mosquitto_dynamic_security.so (Debian package mosquitto)");
    let admin = format!("admin-{}", free_port());
    let broker = mosquitto_tries(None, None, |p| {
        let config = p.join("dynsec.json");
        let file = config.display().to_string();
        run_in(
            p,
            "mosquitto_ctrl",
            &["dynsec", "init", &file, "admin", &admin],
        );
        // Everything allowed by default: only the logins are under test.
        let mut dynsec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).expect("read dynsec.json"))
                .expect("dynsec.json");
        for access in dynsec["defaultACLAccess"]
            .as_object_mut()
            .expect("defaultACLAccess")
            .values_mut()
        {
            *access = serde_json::Value::Bool(true);
        }
        std::fs::write(&config, dynsec.to_string()).expect("write dynsec.json");
        format!(
            "user root\nallow_anonymous true\nplugin {}\nplugin_opt_config_file {file}\n",
            plugin.display()
        )
    });
    let port = broker.port.to_string();
    for (username, password, id) in clients {
        run_in(
            broker.dir.path(),
            "mosquitto_ctrl",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-u",
                "admin",
                "-P",
                &admin,
                "dynsec",
                "createClient",
                username,
                "-c",
                id,
                "-p",
                password,
            ],
        );
    }
    broker
}

fn mosquitto_with(fixed: Option<u16>, dir: tempfile::TempDir) -> Process {
    mosquitto_conf(fixed, dir, "allow_anonymous true\n")
}

/// A mosquitto (anonymous access) with mosquitto's per-client limits set:
/// at most `inflight` QoS 1 messages unacknowledged and `queued` more held
/// for a client; past that it drops them (the default is 20 and 1000).
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn mosquitto_limits(inflight: u32, queued: u32) -> Process {
    mosquitto_conf(
        None,
        tempfile::tempdir().expect("tempdir"),
        &format!(
            "allow_anonymous true\nmax_inflight_messages {inflight}\nmax_queued_messages {queued}\n"
        ),
    )
}

/// A mosquitto (anonymous access) that logs every subscription and
/// unsubscription (`<client id> <qos> <topic>`, `<client id> <topic>`).
///
/// # Panics
/// When it does not come up.
#[must_use]
pub fn mosquitto_logging_subscriptions() -> Process {
    mosquitto_conf(
        None,
        tempfile::tempdir().expect("tempdir"),
        "allow_anonymous true\nlog_dest stderr\nlog_type error\nlog_type warning\n\
         log_type subscribe\nlog_type unsubscribe\n",
    )
}

fn mosquitto_conf(fixed: Option<u16>, dir: tempfile::TempDir, listener: &str) -> Process {
    mosquitto_tries(fixed, Some(dir), |_| listener.to_owned())
}

/// Up to 5 starts of mosquitto, the first in `first` when given, each
/// other in a fresh folder: `prepare` writes the files its configuration
/// names into the attempt's folder and returns the extra configuration
/// lines.
fn mosquitto_tries(
    fixed: Option<u16>,
    mut first: Option<tempfile::TempDir>,
    prepare: impl Fn(&Path) -> String,
) -> Process {
    let mut last = String::new();
    for _ in 0..5 {
        let d = first
            .take()
            .unwrap_or_else(|| tempfile::tempdir().expect("tempdir"));
        let extra = prepare(d.path());
        match mosquitto_once(fixed, d, &extra) {
            Ok(p) => return p,
            Err(log) => last = log,
        }
    }
    panic!("mosquitto did not start:\n{last}");
}

/// One start of mosquitto in `d`; its log when it does not come up.
/// `max_packet_size` of every broker the harness starts, as in every
/// shipped broker configuration: edgeform's clients' packet limit
/// (`edgestate::mqtt::MAX_PACKET_BYTES`, which the agent's tests check
/// against this and the shipped files).
pub const MOSQUITTO_MAX_PACKET: usize = 8_454_144;

fn mosquitto_once(
    fixed: Option<u16>,
    d: tempfile::TempDir,
    listener: &str,
) -> Result<Process, String> {
    let port = fixed.unwrap_or_else(free_port);
    let log = d.path().join("mosquitto.log");
    // max_queued_messages: the default (1000 per client) drops QoS 1
    // commands beyond it while an agent works through a burst; see
    // docs/operations.md.
    // A caller's own limits (in `listener`) replace the default.
    let queued = if listener.contains("max_queued_messages") {
        ""
    } else {
        "max_queued_messages 100000\n"
    };
    // As every shipped broker configuration: larger packets are refused
    // by the broker, never delivered to a client that would drop them.
    let conf = format!(
        "per_listener_settings false\nlistener {port} 127.0.0.1\n{listener}persistence true\n\
         persistence_location {}/\nautosave_interval 1\n{queued}max_packet_size {}\n",
        d.path().display(),
        MOSQUITTO_MAX_PACKET
    );
    let conf_path = d.path().join("mosquitto.conf");
    std::fs::write(&conf_path, conf).expect("write conf");
    let args = vec!["-c".to_owned(), conf_path.display().to_string()];
    let child = spawn("mosquitto", &args, d.path(), &log).expect("spawn mosquitto");
    let mut p = Process {
        child: Some(child),
        port,
        dir: d,
        log,
        binary: "mosquitto".into(),
        addr: std::net::Ipv4Addr::LOCALHOST,
        args,
    };
    if wait_ready(&mut p, |port| {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    }) {
        Ok(p)
    } else {
        Err(p.log())
    }
}

/// `promtool check metrics` passes `text` (exit 0: not even a lint
/// warning); panics with promtool's words and the text otherwise.
pub fn promtool_check_metrics(text: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
