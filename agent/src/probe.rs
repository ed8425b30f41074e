//! The serving probe (docs/edge.md, "The serving probe"): every second a
//! request for the reserved host on each configured listener of the
//! node's own edge — plain HTTP, HTTPS (TLS with SNI the reserved host,
//! whose handshake the edge completes with its placeholder certificate),
//! and the routers' PROXY-protocol listener (a `PROXY UNKNOWN` header, then
//! TLS). The edge answers that host from its Lua phase before any lookup
//! (204), so an edge whose Redis is down still passes: it serves its
//! last-known documents. Any listener that does not answer 204 within the
//! timeout makes the node "not serving", and routing treats it like an
//! offline node.
//!
//! TLS is OpenSSL through `tokio-native-tls` (what the agent's Redis and
//! MQTT TLS already use, so no second TLS stack): the placeholder
//! certificate is self-signed and names no host, so the probe does not
//! verify it — it proves the listener's handshake and Lua phase run, not
//! who the edge is (it is the agent's own node, on loopback).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

use crate::config::{Probe, ProbeKind};
use crate::shutdown::Shutdown;

/// The host the edge answers itself (`.invalid`: never a real site).
pub const PROBE_HOST: &str = "edgeform-probe.invalid";

/// How often the edge is probed.
pub const EVERY: Duration = Duration::from_secs(1);

/// One probe's time limit: connect, request and status line.
const TIMEOUT: Duration = Duration::from_millis(800);

/// The last probe's result, shared with the health report; a change
/// wakes the report so routing hears it before the next interval.
#[derive(Default)]
pub struct Serving {
    /// 0: not probed yet, 1: serving, 2: not serving.
    state: AtomicU8,
    pub changed: Notify,
}

impl Serving {
    /// `None` until the first probe (or when no listener is configured).
    #[must_use]
    pub fn get(&self) -> Option<bool> {
        match self.state.load(Ordering::Relaxed) {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        }
    }

    fn set(&self, serving: bool) {
        let new = if serving { 1 } else { 2 };
        if self.state.swap(new, Ordering::Relaxed) != new {
            self.changed.notify_one();
        }
    }
}

/// The TLS client of the `https` and `proxy` probes: no verification
/// (the edge's placeholder certificate is self-signed and names no host).
///
/// # Errors
/// OpenSSL could not make a client context.
pub fn tls_connector() -> Result<tokio_native_tls::TlsConnector, native_tls::Error> {
    let c = native_tls::TlsConnector::builder()
        .danger_accept_invalid_certs(true)
        .danger_accept_invalid_hostnames(true)
        .build()?;
    Ok(tokio_native_tls::TlsConnector::from(c))
}

/// Whether the listener answers the reserved host with 204.
pub async fn probe_once(p: &Probe, tls: &tokio_native_tls::TlsConnector) -> bool {
    tokio::time::timeout(TIMEOUT, connect_and_ask(p, tls))
        .await
        .ok()
        .and_then(Result::ok)
        .is_some_and(|status| status == 204)
}

async fn connect_and_ask(p: &Probe, tls: &tokio_native_tls::TlsConnector) -> std::io::Result<u16> {
    let mut s = tokio::net::TcpStream::connect(p.addr).await?;
    match p.kind {
        ProbeKind::Http => exchange(s).await,
        ProbeKind::Https | ProbeKind::Proxy => {
            if p.kind == ProbeKind::Proxy {
                // A PROXY v1 header without an address: the edge answers
                // the probe host for it before the routers-only check that
                // refuses any other host behind such a header.
                s.write_all(b"PROXY UNKNOWN\r\n").await?;
            }
            let t = tls
                .connect(PROBE_HOST, s)
                .await
                .map_err(std::io::Error::other)?;
            exchange(t).await
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> std::io::Result<u16> {
    let req = format!(
        "GET / HTTP/1.1\r\nHost: {PROBE_HOST}\r\nUser-Agent: edgeform-agent-probe\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    // The status line is all that matters: "HTTP/1.1 204 ...".
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        let n = s.read(&mut buf[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let line = &buf[..got];
    let code = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|c| std::str::from_utf8(c).ok())
        .and_then(|c| c.parse().ok());
    code.ok_or_else(|| std::io::Error::other("no HTTP status line"))
}

/// Probe every listener each second until shutdown; nothing to do when
/// none is configured.
pub async fn run(probes: Vec<Probe>, serving: Arc<Serving>, mut shutdown: Shutdown) {
    if probes.is_empty() {
        return;
    }
    let tls = match tls_connector() {
        Ok(t) => t,
        Err(e) => {
            // Without a TLS client no HTTPS listener can pass: reported as
            // not serving rather than left unprobed.
            tracing::error!(error = %e, "probe: no TLS client; the edge is reported not serving");
            serving.set(false);
            return;
        }
    };
    loop {
        // The listeners at once: one hung listener costs one timeout, not
        // one per listener.
        let mut set = tokio::task::JoinSet::new();
        for p in &probes {
            let (p, tls) = (p.clone(), tls.clone());
            set.spawn(async move { (probe_once(&p, &tls).await, p) });
        }
        let mut all = true;
        while let Some(done) = set.join_next().await {
            let ok = done.as_ref().is_ok_and(|(ok, _)| *ok);
            if !ok {
                if let Ok((_, p)) = &done {
                    tracing::debug!(addr = %p.addr, kind = p.kind.scheme(), "probe: the edge did not answer the reserved host");
                }
                all = false;
            }
        }
        if serving.get() != Some(all) {
            tracing::warn!(serving = all, "probe: the edge's serving state changed");
        }
        serving.set(all);
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = shutdown.wait() => return,
        }
    }
}
