//! `edgeform serve` under slow or broken conditions, against the real
//! binary: idle TCP connections that never send a ClientHello do not
//! hold up a valid request (each handshake is its own task, with a
//! timeout), slow headers are cut, and a HEAD that fails `check` is
//! compiled once and then remembered while the last good revision keeps
//! serving.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::Fixture;

const TOKEN: &str = "serve-test-token";
const KEY: &str = "/v1/nodes/edge-1/keys/site:a.example.com";

/// `edgeform serve` on a free port (with `extra` args), stderr to `log`;
/// killed on drop.
struct Serve {
    child: Child,
    port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(repo: &Path, extra: &[&str], log: &Path) -> Serve {
    let port = harness::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_edgeform"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .current_dir(repo)
        .env("EDGEFORM_SERVE_TOKEN", TOKEN)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "edgeform serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Serve { child, port }
}

/// One plain HTTP GET: status and ETag.
fn get(port: u16) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {KEY} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let etag = raw
        .lines()
        .find_map(|l| l.strip_prefix("etag: "))
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    (status, etag)
}

fn certificate(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// Whether the server closes `s` (EOF) within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn idle_connections_never_delay_a_request_over_tls() {
    let repo = Fixture::with(&[]);
    repo.commit("base");
    let d = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(d.path());
    let s = serve(
        repo.path(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &d.path().join("serve.log"),
    );
    // Connections that never send a ClientHello.
    let mut idle: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect(("127.0.0.1", s.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let out = Command::new("curl")
        .args(["-s", "-m", "20", "-w", "\n%{http_code}", "--cacert"])
        .arg(&cert)
        .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
        .arg(format!("https://127.0.0.1:{}{KEY}", s.port))
        .output()
        .unwrap();
    let took = start.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n200"), "{text}");
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    // The idle ones are dropped once the handshake time is up (5 s).
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(12)),
        "an idle connection was kept"
    );
    idle.clear();
}

#[test]
fn slow_headers_are_cut_and_do_not_delay_others() {
    let repo = Fixture::with(&[]);
    repo.commit("base");
    let d = tempfile::tempdir().unwrap();
    let s = serve(repo.path(), &[], &d.path().join("serve.log"));
    // Half a request line, never finished.
    let mut slow: Vec<TcpStream> = (0..12)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            c.write_all(b"GET /v1/nodes/edge-1/keys/").unwrap();
            c
        })
        .collect();
    let start = Instant::now();
    assert_eq!(get(s.port).0, 200);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(
        closed_within(&mut slow[0], Duration::from_secs(12)),
        "a connection that never finished its headers was kept"
    );
    slow.clear();
}

#[test]
fn a_head_that_fails_check_is_compiled_once_and_the_last_good_keeps_serving() {
    let repo = Fixture::with(&[]);
    let good = repo.commit("base");
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("serve.log");
    let s = serve(repo.path(), &[], &log);
    assert_eq!(get(s.port), (200, good.clone()));
    repo.write("sites/a.yaml", b"host: a.example.com\norigin: not a url\n");
    let broken = repo.commit("broken");
    // Many requests, several at once: all answered from the last good
    // revision, and the broken one compiled once.
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| (0..10).map(|_| get(s.port)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(answers.len(), 40);
    assert!(
        answers.iter().all(|a| *a == (200, good.clone())),
        "{answers:?}"
    );
    let refused = |log: &Path| {
        std::fs::read_to_string(log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("fails check"))
            .count()
    };
    assert_eq!(
        refused(&log),
        1,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(
        std::fs::read_to_string(&log).unwrap().contains(&broken),
        "the refusal names the commit"
    );
    // HEAD moves again, to a good commit: served at once.
    repo.write(
        "sites/a.yaml",
        b"host: a.example.com\norigin: http://192.0.2.9\n",
    );
    let fixed = repo.commit("fixed");
    assert_eq!(get(s.port), (200, fixed));
    assert_eq!(refused(&log), 1);
}
