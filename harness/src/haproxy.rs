//! HAProxy (Debian's 2.6) as a real reverse proxy in front of a test
//! server: `mode http` with `option forwardfor`, which appends its own
//! `X-Forwarded-For` line (the address it saw) after whatever the client
//! sent. Started in the foreground (`-db`) on a free loopback port, stopped
//! by pid when dropped.
//!
//! Needs the Debian package `haproxy` (`scripts/test` installs it).

use std::net::TcpStream;
use std::path::Path;

use crate::{Process, free_port, spawn, wait_ready};

/// Start HAProxy on a free loopback port in front of `127.0.0.1:backend`.
/// With `accept_proxy`, every client connection must start with a PROXY
/// protocol header (`PROXY TCP4 <src> <dst> <sport> <dport>\r\n`, as an L4
/// load balancer in front of HAProxy sends): HAProxy then takes `<src>` as
/// the client and appends it to `X-Forwarded-For`, so a test can be any
/// viewer address (a GeoIP test address, a blocked network) from loopback.
///
/// # Panics
/// When it does not come up after a few attempts (its output is shown).
#[must_use]
pub fn forwarding(backend: u16, accept_proxy: bool) -> Process {
    let accept = if accept_proxy { " accept-proxy" } else { "" };
    start("haproxy", |dir, port| {
        let conf = format!(
            "global\n    maxconn 512\n\
             defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n\
             \x20   timeout server 30s\n\
             frontend viewers\n    bind 127.0.0.1:{port}{accept}\n    option forwardfor\n\
             \x20   default_backend edge\n\
             backend edge\n    server edge 127.0.0.1:{backend}\n"
        );
        std::fs::write(dir.join("haproxy.cfg"), conf).expect("write haproxy.cfg");
    })
}

/// Start HAProxy on a free loopback port with the `haproxy.cfg` that
/// `configure(dir, port)` writes into its own folder (with any file it
/// needs); a few attempts (a port taken meanwhile), `what` naming it when
/// none comes up.
///
/// # Panics
/// When it does not come up after a few attempts (its output is shown).
#[must_use]
pub fn start(what: &str, configure: impl Fn(&Path, u16)) -> Process {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        configure(dir.path(), port);
        let log = dir.path().join("haproxy.log");
        let args = vec![
            "-db".to_owned(),
            "-f".to_owned(),
            dir.path().join("haproxy.cfg").display().to_string(),
        ];
        let child = spawn("haproxy", &args, dir.path(), &log).expect("spawn haproxy");
        let mut p = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "haproxy".into(),
            addr: std::net::Ipv4Addr::LOCALHOST,
            args,
        };
        if wait_ready(&mut p, |port| {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            return p;
        }
        last = p.log();
    }
    panic!("{what} did not start:\n{last}");
}
