//! `edgeform explain`'s flags; the explanation is [`ops::explain`].

use std::net::IpAddr;
use std::path::PathBuf;

/// Output formats of `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExplainFormat {
    Human,
    Json,
}

/// Arguments of `explain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// The request's Host.
    #[arg(long, value_name = "HOST", required_unless_present = "batch")]
    pub host: Option<String>,
    /// The request URI (`/path?query`, or a full URL whose path and query
    /// are used).
    #[arg(long, value_name = "URL", required_unless_present = "batch")]
    pub url: Option<String>,
    /// The socket peer's IP (a trusted proxy's X-Forwarded-For, given with
    /// --header, names the client).
    #[arg(long, value_name = "IP", required_unless_present = "batch")]
    pub ip: Option<IpAddr>,
    /// The request method.
    #[arg(long, default_value = "GET", value_name = "METHOD")]
    pub method: String,
    /// A request header, `Name: value` (repeatable): Referer, Origin,
    /// Cookie, Authorization, X-Forwarded-For,
    /// Access-Control-Request-Method. Only X-Forwarded-For may be given
    /// more than once: its lines are one list, in order, as nginx joins
    /// them (`, `).
    #[arg(long = "header", value_name = "'NAME: VALUE'")]
    pub headers: Vec<String>,
    /// The edge whose documents decide (default: the first, by name, that
    /// carries the host).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// MaxMind City/Country database for the client's country (geo_mode).
    /// Without it or --country, a request whose answer depends on the
    /// country is refused (exit 1), never guessed.
    #[arg(long, value_name = "DB")]
    pub geoip: Option<PathBuf>,
    /// The client's country, stated (ISO 3166-1 alpha-2, e.g. GB) instead
    /// of looked up in --geoip.
    #[arg(long, value_name = "XX", conflicts_with = "geoip", value_parser = country_code)]
    pub country: Option<String>,
    /// Output: human (the steps) or json (one object).
    #[arg(long, value_enum, default_value = "human")]
    pub format: ExplainFormat,
    /// Explain every request of FILE (`-`: stdin), one JSON object a line
    /// (`{"host","url","ip","method","headers":{…},"node","scheme","sni",
    /// "proxy","id"}`; a header's value is a string, or for X-Forwarded-For
    /// a list of lines; `"sni":""` is a ClientHello without SNI); prints
    /// one JSON decision a line, in order, with the request's `id`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["host", "url", "ip"])]
    pub batch: Option<PathBuf>,
    /// How the request reaches the edge: with https, the TLS outcome
    /// (`ok`, `no-certificate`, `expired`, `name-mismatch`) comes first.
    #[arg(long, value_enum, default_value = "http")]
    pub scheme: Scheme,
    /// The TLS server name the client sends (default with https: the
    /// host); another name than the host is a misdirected request (421).
    #[arg(long, value_name = "NAME")]
    pub sni: Option<String>,
    /// The request came through a router's 443 pool: ADDR is the viewer
    /// its PROXY-protocol header gives, --ip the router (the peer). The
    /// edge believes it only from a router of the routing table, then
    /// decides on the viewer as on a direct client; from anyone else the
    /// connection is closed (status 444, `proxy-refused`).
    #[arg(long, value_name = "ADDR", requires = "ip")]
    pub proxy: Option<String>,
}

/// `--scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheme {
    Http,
    Https,
}

impl ExplainArgs {
    /// The library's options.
    /// The options, clearance cookies and certificates' expiry judged at
    /// `now` (the global `--now`; default: the system clock).
    pub fn options(&self, now: Option<u64>) -> ::ops::explain::ExplainOptions {
        ::ops::explain::ExplainOptions {
            host: self.host.clone(),
            url: self.url.clone(),
            ip: self.ip,
            method: self.method.clone(),
            headers: self.headers.clone(),
            node: self.node.clone(),
            geoip: self.geoip.clone(),
            country: self.country.clone(),
            format: match self.format {
                ExplainFormat::Human => ::ops::explain::ExplainFormat::Human,
                ExplainFormat::Json => ::ops::explain::ExplainFormat::Json,
            },
            batch: self.batch.clone(),
            now,
            scheme: match self.scheme {
                Scheme::Http => edgestate::edge::Scheme::Http,
                Scheme::Https => edgestate::edge::Scheme::Https,
            },
            sni: self.sni.clone(),
            proxy: self.proxy.clone(),
        }
    }
}

/// `--country`: two ASCII letters, read upper-case as the edge's
/// database gives them.
fn country_code(s: &str) -> Result<String, String> {
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_alphabetic()) {
        Ok(s.to_ascii_uppercase())
    } else {
        Err(format!(
            "`{s}` is not a two-letter country code (ISO 3166-1 alpha-2, e.g. GB)"
        ))
    }
}
