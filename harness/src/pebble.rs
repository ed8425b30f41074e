//! A real ACME CA for tests: Debian's `pebble` (Let's Encrypt's test CA)
//! with `pebble-challtestsrv` as its DNS, each on free loopback ports,
//! stopped by pid on drop like every [`Process`].
//!
//! Pebble resolves every name through the challtestsrv, which answers
//! every A query with one address (IPv6 off), and validates HTTP-01 on
//! that address at `http_port`: the test's edge or geo router
//! ([`Pebble::resolve`] points one name elsewhere). `PEBBLE_VA_NOSLEEP=1` (no random validation
//! delay), `PEBBLE_WFE_NONCEREJECT=0` (no random `badNonce`) and
//! `PEBBLE_AUTHZREUSE=0` (every order validates anew), so runs are quick
//! and repeatable.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::Process;

/// A running pebble and its DNS.
pub struct Pebble {
    pub acme: Process,
    pub dns: Process,
    /// The management port (roots, intermediates).
    pub management: u16,
    /// Pebble's configuration (kept while it runs).
    _files: tempfile::TempDir,
    /// Pebble's HTTPS certificate and its CA.
    tls: super::sitecerts::SiteCerts,
}

/// What to start pebble with.
pub struct PebbleOptions {
    /// The port pebble validates HTTP-01 on.
    pub http_port: u16,
    /// The address every test name resolves to.
    pub answer: Ipv4Addr,
    /// Lifetime of the certificates it issues, seconds (pebble's
    /// default, about five years, when `None`).
    pub validity_secs: Option<u64>,
}

impl Pebble {
    /// The ACME directory URL.
    #[must_use]
    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.acme.port)
    }

    /// The PEM file of the CA that signed pebble's own HTTPS certificate
    /// (for the client's `ca_file`).
    #[must_use]
    pub fn tls_ca(&self) -> PathBuf {
        self.tls.file("ca.pem")
    }

    /// Make the DNS resolve `host` to `addr` instead of the default
    /// answer (e.g. where nothing listens, so its validation fails).
    ///
    /// # Panics
    /// When the DNS's management endpoint refuses.
    pub fn resolve(&self, host: &str, addr: Ipv4Addr) {
        let out = std::process::Command::new("curl")
            .args(["-sSf", "-X", "POST", "-d"])
            .arg(serde_json::json!({"host": host, "addresses": [addr.to_string()]}).to_string())
            .arg(format!("http://127.0.0.1:{}/add-a", self.dns.port))
            .output()
            .expect("curl");
        assert!(
            out.status.success(),
            "add-a {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The root that issued certificates chain to, PEM, from pebble's
    /// management endpoint (a new one each pebble run).
    ///
    /// # Panics
    /// When `curl` cannot fetch it.
    #[must_use]
    pub fn root(&self) -> String {
        let out = std::process::Command::new("curl")
            .args(["-sSf", "--cacert"])
            .arg(self.tls_ca())
            .arg(format!("https://127.0.0.1:{}/roots/0", self.management))
            .output()
            .expect("curl");
        assert!(
            out.status.success(),
            "pebble root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("PEM")
    }
}

/// Start pebble and its DNS.
///
/// # Panics
/// When `openssl` fails or either does not come up (its log is shown).
#[must_use]
pub fn pebble(opts: &PebbleOptions) -> Pebble {
    let files = tempfile::tempdir().expect("tempdir");
    let d = files.path();
    // Pebble's own HTTPS certificate, for 127.0.0.1 and localhost.
    let tls = super::sitecerts::SiteCerts::new();
    tls.sign("tls", &["localhost", "127.0.0.1"], 30);
    let dns_port = super::free_port();
    let dns_mgmt = super::free_port();
    let dns = super::program(
        Path::new("/usr/bin/pebble-challtestsrv"),
        vec![
            "-dns01".into(),
            format!("127.0.0.1:{dns_port}"),
            "-http01".into(),
            String::new(),
            "-https01".into(),
            String::new(),
            "-tlsalpn01".into(),
            String::new(),
            "-management".into(),
            format!("127.0.0.1:{dns_mgmt}"),
            "-defaultIPv4".into(),
            opts.answer.to_string(),
            "-defaultIPv6".into(),
            String::new(),
        ],
        Ipv4Addr::LOCALHOST,
        dns_mgmt,
    );
    let port = super::free_port();
    let management = super::free_port();
    let mut config = serde_json::json!({"pebble": {
        "listenAddress": format!("127.0.0.1:{port}"),
        "managementListenAddress": format!("127.0.0.1:{management}"),
        "certificate": tls.file("tls.pem"),
        "privateKey": tls.file("tls.key"),
        "httpPort": opts.http_port,
        "tlsPort": super::free_port(),
        "ocspResponderURL": "",
        "externalAccountBindingRequired": false,
    }});
    if let Some(secs) = opts.validity_secs {
        config["pebble"]["certificateValidityPeriod"] = secs.into();
    }
    let config_path = d.join("pebble.json");
    std::fs::write(&config_path, config.to_string()).expect("write pebble.json");
    let acme = super::program(
        Path::new("/usr/bin/env"),
        vec![
            "PEBBLE_VA_NOSLEEP=1".into(),
            "PEBBLE_WFE_NONCEREJECT=0".into(),
            // No reuse of a valid authorization (pebble's default: half
            // of them): every order validates through the edge.
            "PEBBLE_AUTHZREUSE=0".into(),
            "pebble".into(),
            "-config".into(),
            config_path.display().to_string(),
            "-dnsserver".into(),
            format!("127.0.0.1:{dns_port}"),
        ],
        Ipv4Addr::LOCALHOST,
        port,
    );
    Pebble {
        acme,
        dns,
        management,
        _files: files,
        tls,
    }
}

/// The real edge on the Redis at 127.0.0.1:`redis_port` (its bundle
/// declared: it reads certificates) and pebble validating its HTTP
/// challenges on it: every test name resolves to the edge, but
/// `down.test` resolves where nothing listens, so its validation fails.
#[must_use]
pub fn behind_edge(redis_port: u16) -> (super::nginx::Edge, Pebble) {
    let o = super::nginx::EdgeOptions::new(redis_port);
    super::nginx::declare_bundle(&o);
    let edge = super::nginx::edge(&o);
    let pebble = pebble(&PebbleOptions {
        http_port: edge.process.port,
        answer: Ipv4Addr::LOCALHOST,
        validity_secs: None,
    });
    pebble.resolve("down.test", Ipv4Addr::new(127, 0, 0, 2));
    (edge, pebble)
}
