//! A fault-injecting proxy in front of pebble's ACME API, for the CA
//! failures pebble cannot make itself (a 500, a request left unanswered,
//! a certificate that is not the one ordered, an order that stays
//! pending, `rateLimited` with `Retry-After`).
//!
//! It is HAProxy (Debian's 2.6), a real proxy: it terminates TLS with
//! pebble's own HTTPS certificate (so a client trusts it with the same
//! [`Pebble::tls_ca`]) and forwards to pebble over TLS, the `Host` header
//! unchanged — pebble writes its URLs (directory, orders, challenges,
//! certificates) from the request's `Host`, so every URL it hands out
//! points back at the proxy without any rewriting. The fault is one
//! `http-request` rule matched on the method and pebble's path, answered
//! by HAProxy itself (`return`, `tarpit`) instead of pebble. Stopped by
//! pid on drop like every [`Process`].

use std::fmt::Write as _;

use crate::Process;
use crate::pebble::Pebble;

/// What the proxy does instead of forwarding.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Forward everything.
    None,
    /// A new order (`POST /order-plz`) answered 500 with the problem
    /// document `urn:ietf:params:acme:error:serverInternal`.
    NewOrder500,
    /// A new order answered with this HTTP status and a plain-text body,
    /// no problem document (a load balancer's error page).
    NewOrderPlain(u16),
    /// A new order answered 429 with the problem document
    /// `urn:ietf:params:acme:error:rateLimited` and `Retry-After: <value>`
    /// (seconds or an HTTP date, as given).
    RateLimited { retry_after: String },
    /// The first new order only answered like [`Fault::RateLimited`]; the
    /// next ones go to pebble (HAProxy counts them in a stick table).
    RateLimitedFirst { retry_after: String },
    /// Requests whose path starts with this (e.g. `/order-plz`,
    /// `/finalize-order/`) get no answer (HAProxy's `tarpit`, an hour).
    NoAnswer(String),
    /// The certificate download (`POST /certZ/…`) answered with this body
    /// instead of what pebble issued.
    Certificate(String),
    /// A challenge's "ready" (`POST /chalZ/…`) answered `pending` without
    /// telling pebble: pebble never validates and the order stays
    /// `pending`.
    OrderStaysPending,
}

/// The running proxy.
pub struct FaultProxy {
    pub process: Process,
    pebble_port: u16,
}

impl FaultProxy {
    /// The ACME directory URL through the proxy.
    #[must_use]
    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.process.port)
    }

    /// HAProxy's log (its own errors).
    #[must_use]
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// The problem document of a CA error, JSON.
fn problem(kind: &str, detail: &str, status: u16) -> String {
    serde_json::json!({
        "type": format!("urn:ietf:params:acme:error:{kind}"),
        "detail": detail,
        "status": status,
    })
    .to_string()
}

/// HAProxy's configuration for `fault` in `dir` (the body it answers
/// with written beside it), listening on `port`, forwarding to pebble's
/// `pebble_port`.
fn configure(dir: &std::path::Path, port: u16, pebble_port: u16, fault: &Fault) {
    let body = |text: &str| {
        let p = dir.join("body");
        std::fs::write(&p, text).expect("write body");
        p.display().to_string()
    };
    let rule = match fault {
        Fault::None => String::new(),
        Fault::NewOrder500 => format!(
            "    http-request return status 500 content-type application/problem+json \
             file {} if {{ method POST }} {{ path /order-plz }}\n",
            body(&problem(
                "serverInternal",
                "the CA is having a bad day",
                500
            ))
        ),
        Fault::NewOrderPlain(status) => format!(
            "    http-request return status {status} content-type text/plain \
             file {} if {{ method POST }} {{ path /order-plz }}\n",
            body("upstream unavailable\n")
        ),
        Fault::RateLimited { retry_after } => format!(
            "    http-request return status 429 content-type application/problem+json \
             file {} hdr Retry-After \"{retry_after}\" \
             if {{ method POST }} {{ path /order-plz }}\n",
            body(&problem("rateLimited", "too many new orders recently", 429))
        ),
        Fault::RateLimitedFirst { retry_after } => format!(
            "    stick-table type integer size 1 store gpc0\n\
             \x20   http-request track-sc0 int(1) if {{ method POST }} {{ path /order-plz }}\n\
             \x20   http-request sc-inc-gpc0(0) if {{ method POST }} {{ path /order-plz }}\n\
             \x20   http-request return status 429 content-type application/problem+json \
             file {} hdr Retry-After \"{retry_after}\" \
             if {{ method POST }} {{ path /order-plz }} {{ sc_get_gpc0(0) eq 1 }}\n",
            body(&problem("rateLimited", "too many new orders recently", 429))
        ),
        Fault::NoAnswer(prefix) => format!("    http-request tarpit if {{ path_beg {prefix} }}\n"),
        Fault::Certificate(pem) => format!(
            "    http-request return status 200 content-type \
             application/pem-certificate-chain file {} \
             if {{ method POST }} {{ path_beg /certZ/ }}\n",
            body(pem)
        ),
        Fault::OrderStaysPending => format!(
            "    http-request return status 200 content-type application/json \
             file {} if {{ method POST }} {{ path_beg /chalZ/ }}\n",
            body(
                &serde_json::json!({
                    "type": "http-01",
                    "url": "https://127.0.0.1/chalZ/held",
                    "token": "held",
                    "status": "pending",
                })
                .to_string()
            )
        ),
    };
    let mut conf = String::new();
    let _ = write!(
        conf,
        "global\n    maxconn 256\n\
         defaults\n    mode http\n    timeout connect 5s\n    timeout client 1h\n\
         \x20   timeout server 1h\n    timeout tarpit 1h\n\
         frontend acme\n    bind 127.0.0.1:{port} ssl crt {crt} alpn http/1.1\n\
         {rule}    default_backend pebble\n\
         backend pebble\n    server pebble 127.0.0.1:{pebble_port} ssl verify none\n",
        crt = dir.join("proxy.pem").display(),
    );
    std::fs::write(dir.join("haproxy.cfg"), conf).expect("write haproxy.cfg");
}

impl FaultProxy {
    /// Do `fault` from now on: HAProxy restarted on the same port (the
    /// URLs pebble handed out, the account's among them, stay valid).
    ///
    /// # Panics
    /// When it does not come back.
    pub fn set_fault(&mut self, fault: &Fault) {
        configure(
            self.process.dir.path(),
            self.process.port,
            self.pebble_port,
            fault,
        );
        self.process.restart();
    }
}

/// Start HAProxy on a free loopback port in front of `pebble`, doing
/// `fault`.
///
/// # Panics
/// When it does not come up after a few attempts (its output is shown).
#[must_use]
pub fn in_front(pebble: &Pebble, fault: &Fault) -> FaultProxy {
    // Pebble's own HTTPS certificate and key, one file as HAProxy wants.
    let ca = pebble.tls_ca();
    let read = |name: &str| std::fs::read_to_string(ca.with_file_name(name)).expect(name);
    let crt = format!("{}{}", read("tls.pem"), read("tls.key"));
    let process = crate::haproxy::start("haproxy (ACME fault proxy)", |dir, port| {
        std::fs::write(dir.join("proxy.pem"), &crt).expect("write proxy.pem");
        configure(dir, port, pebble.acme.port, fault);
    });
    FaultProxy {
        process,
        pebble_port: pebble.acme.port,
    }
}
