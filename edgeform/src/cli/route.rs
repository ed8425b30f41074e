//! `edgeform route`'s flags; the decision and its output are
//! [`ops::route`].

use std::net::IpAddr;
use std::path::PathBuf;

/// Output formats of `route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouteFormat {
    Human,
    Json,
}

/// Arguments of `route`.
#[derive(Debug, Clone, clap::Args)]
pub struct RouteArgs {
    /// The client's IP (the socket peer, unless --peer is given).
    #[arg(long, value_name = "IP")]
    pub ip: Option<IpAddr>,
    /// The stream to play.
    #[arg(long, value_name = "STREAM")]
    pub stream: Option<String>,
    /// The socket peer (e.g. a proxy); with --xff.
    #[arg(long, value_name = "IP")]
    pub peer: Option<IpAddr>,
    /// The X-Forwarded-For header the peer sent (repeatable: several header
    /// lines, in order, as the agent reads them).
    #[arg(long, value_name = "HEADER")]
    pub xff: Vec<String>,
    /// Health snapshot: {"nodes":{"<name>":{"online","play_sessions","out_kbit","streams","vod"}}},
    /// or `mqtt`: the live snapshot from the broker in cluster.yaml (every
    /// node's retained report and status). Without it, every node is
    /// assumed online, idle and carrying the stream.
    #[arg(long, value_name = "FILE|mqtt")]
    pub health: Option<PathBuf>,
    #[command(flatten)]
    pub broker: super::BrokerFlags,
    /// Also make the geo decision (the geo router: strictly nearest online edge).
    #[arg(long, requires = "geoip")]
    pub geo: bool,
    /// Also explain the VOD placement of ASSET (the CDN-zones rule: allowed zones,
    /// then highest revision, then zone order and load), from the
    /// revisions each node reports (`vod` in the health snapshot).
    #[arg(long, value_name = "ASSET")]
    pub vod: Option<String>,
    /// MaxMind City database for --geo.
    #[arg(long, value_name = "DB")]
    pub geoip: Option<PathBuf>,
    /// With --geo: the request is an ACME HTTP-01 challenge
    /// (`/.well-known/acme-challenge/…`) for this Host: a client GeoIP
    /// cannot locate still gets an edge (rendezvous hash of the host).
    #[arg(long, value_name = "HOST", requires = "geo")]
    pub acme_host: Option<String>,
    /// Output: human (the steps) or json (one object).
    #[arg(long, value_enum, default_value = "human")]
    pub format: RouteFormat,
}

impl RouteArgs {
    /// The library's options.
    pub fn options(&self) -> ::ops::route::RouteOptions {
        ::ops::route::RouteOptions {
            ip: self.ip,
            stream: self.stream.clone(),
            peer: self.peer,
            xff: self.xff.clone(),
            health: self.health.clone(),
            broker: self.broker.options(),
            geo: self.geo,
            vod: self.vod.clone(),
            geoip: self.geoip.clone(),
            acme_host: self.acme_host.clone(),
            format: match self.format {
                RouteFormat::Human => ::ops::route::RouteFormat::Human,
                RouteFormat::Json => ::ops::route::RouteFormat::Json,
            },
        }
    }
}
