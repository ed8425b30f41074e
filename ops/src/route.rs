//! `edgeform route`: explain a routing decision offline, from the compiled
//! table and a health snapshot — the same pure code the agent runs.

use std::fmt::Write as _;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use edgestate::route::{Decision, GeoDecision, Health, NodeHealth, Router};
use edgestate::routing::Location;

use compiler::Config;

/// Output formats of `route`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteFormat {
    Human,
    Json,
}

/// Options of `route`.
#[derive(Debug, Clone)]
pub struct RouteOptions {
    /// The client's IP (the socket peer, unless `peer` is given).
    pub ip: Option<IpAddr>,
    /// The stream to play.
    pub stream: Option<String>,
    /// The socket peer (e.g. a proxy); with `xff`.
    pub peer: Option<IpAddr>,
    /// The X-Forwarded-For header lines the peer sent, in order.
    pub xff: Vec<String>,
    /// Health snapshot file, or `mqtt`: the live snapshot from the broker
    /// in cluster.yaml. Without it, every node is assumed online, idle and
    /// carrying the stream.
    pub health: Option<PathBuf>,
    /// How to reach the broker for `health: mqtt`.
    pub broker: crate::mqtt::BrokerOptions,
    /// Also make the geo decision (needs `geoip`).
    pub geo: bool,
    /// Also explain the VOD placement of this asset.
    pub vod: Option<String>,
    /// MaxMind City database for `geo`.
    pub geoip: Option<PathBuf>,
    /// With `geo`: the request is an ACME HTTP-01 challenge for this Host
    /// (a client with no location still gets an edge).
    pub acme_host: Option<String>,
    /// Output: the steps, or one JSON object.
    pub format: RouteFormat,
}

/// Read a health snapshot.
///
/// # Errors
/// Unreadable or not the health format.
pub fn read_health(path: &Path) -> Result<Health> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a health snapshot", path.display()))
}

/// Where MaxMind puts `ip`, if it has coordinates.
///
/// # Errors
/// Unreadable database.
pub fn geo_lookup(db: &Path, ip: IpAddr) -> Result<Option<Location>> {
    let reader = maxminddb::Reader::open_readfile(db)
        .with_context(|| format!("opening {}", db.display()))?;
    let found = reader
        .lookup(ip)
        .with_context(|| format!("looking up {ip}"))?;
    let city: Option<maxminddb::geoip2::City> =
        found.decode().with_context(|| format!("decoding {ip}"))?;
    Ok(
        city.and_then(|c| match (c.location.latitude, c.location.longitude) {
            (Some(lat), Some(lon)) => Some(Location { lat, lon }),
            _ => None,
        }),
    )
}

/// `edgeform route`.
///
/// # Errors
/// Missing arguments, unreadable inputs.
pub fn route(config: &Config, args: &RouteOptions) -> Result<u8> {
    let peer = args
        .peer
        .or(args.ip)
        .context("give --ip (or --peer with --xff)")?;
    if args.stream.is_none() && !args.geo && args.vod.is_none() {
        bail!(
            "give --stream for a playback decision, --geo for the geo decision, or --vod for a VOD placement"
        );
    }
    let table = compiler::compile::routing_table(config);
    let router = Router::new(table).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut notes = Vec::new();
    let health = match &args.health {
        Some(p) if p.as_os_str() == "mqtt" => {
            notes.push("health: the live snapshot from the broker".to_owned());
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(crate::mqtt::live_health(config, &args.broker))?
        }
        Some(p) => read_health(p)?,
        None => {
            notes.push(
                "no --health: every node assumed online, 0 sessions, carrying the stream"
                    .to_owned(),
            );
            let streams: edgestate::route::Streams =
                std::sync::Arc::new(args.stream.iter().cloned().collect());
            Health {
                nodes: config
                    .nodes
                    .iter()
                    .map(|n| {
                        (
                            n.name.clone(),
                            NodeHealth {
                                online: Some(true),
                                play_sessions: Some(0),
                                out_kbit: Some(0),
                                streams: Some(streams.clone()),
                                stale: false,
                                vod: None,
                                net_kbit: None,
                                serving: None,
                            },
                        )
                    })
                    .collect(),
            }
        }
    };
    let xff = edgestate::route::join_xff(args.xff.iter().map(String::as_bytes));
    let decision: Option<Decision> = args
        .stream
        .as_deref()
        .map(|s| router.decide(Some(peer), xff.as_deref(), s, &health));
    let vod = args
        .vod
        .as_deref()
        .map(|a| router.vod(Some(peer), xff.as_deref(), a, &health));
    let client = decision
        .as_ref()
        .and_then(|d| d.client_ip.as_deref())
        .and_then(|c| c.parse().ok())
        .unwrap_or(peer);
    // IPv4-mapped IPv6 clients are IPv4 clients (as the agent, the edge and
    // the router see them): the geo tie-break hashes the IPv4 text.
    let client = match client {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(client, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    };
    let geo: Option<(Option<Location>, Option<GeoDecision>)> = match (&args.geoip, args.geo) {
        (Some(db), true) => {
            let loc = geo_lookup(db, client)?;
            let decision = match (loc, &args.acme_host) {
                (Some(l), _) => Some(router.nearest(client, l, &health)),
                (None, Some(host)) => Some(router.acme_unlocated(host, &health)),
                (None, None) => None,
            };
            Some((loc, decision))
        }
        _ => None,
    };
    let mut out = std::io::stdout().lock();
    match args.format {
        RouteFormat::Json => {
            let mut v = match &decision {
                Some(d) => serde_json::to_value(d)?,
                None => serde_json::json!({"client_ip": client.to_string()}),
            };
            if let Some((loc, g)) = &geo {
                v["geo"] = serde_json::json!({"client_location": loc, "decision": g});
            }
            if let Some(d) = &vod {
                v["vod"] = serde_json::to_value(d)?;
            }
            if !notes.is_empty() {
                v["notes"] = serde_json::json!(notes);
            }
            writeln!(out, "{v}")?;
        }
        RouteFormat::Human => {
            let mut text = String::new();
            for n in &notes {
                let _ = writeln!(text, "note: {n}");
            }
            if let Some(d) = &decision {
                // The decision first, then why.
                let verdict = match (d.status, &d.node) {
                    (302, Some(n)) => match &d.location {
                        Some(l) => format!("302 → {n} ({l})"),
                        None => format!("302 → {n} (proxied by the router)"),
                    },
                    (503, _) => format!("503 Retry-After {}", edgestate::route::RETRY_AFTER_SECS),
                    (s, _) => s.to_string(),
                };
                let _ = writeln!(
                    text,
                    "client {}: decision: {verdict}",
                    d.client_ip.as_deref().unwrap_or("unknown")
                );
                let _ = writeln!(text, "why:");
                for (i, r) in d.reasons.iter().enumerate() {
                    let _ = writeln!(text, "  {}. {r}", i + 1);
                }
                for z in &d.zones {
                    let listing: Vec<String> = z
                        .nodes
                        .iter()
                        .map(|c| match &c.reason {
                            None => format!("{} ({})", c.node, c.play_sessions.unwrap_or(0)),
                            Some(r) => format!("{} [{r}]", c.node),
                        })
                        .collect();
                    let _ = writeln!(text, "  {}: {}", z.zone, listing.join(", "));
                }
            }
            if let Some((loc, g)) = &geo {
                match (loc, g) {
                    (Some(l), Some(g)) => {
                        let _ = writeln!(text, "geo: {client} is at {:.4},{:.4}", l.lat, l.lon);
                        for r in &g.reasons {
                            let _ = writeln!(text, "  - {r}");
                        }
                        let _ = writeln!(
                            text,
                            "geo decision: {} ({})",
                            g.node.as_deref().unwrap_or("none"),
                            g.distance_km
                                .map_or_else(String::new, |d| format!("{d:.0} km"))
                        );
                    }
                    (None, Some(g)) => {
                        let _ = writeln!(text, "geo: the database has no location for {client}");
                        for r in &g.reasons {
                            let _ = writeln!(text, "  - {r}");
                        }
                        let _ = writeln!(
                            text,
                            "geo decision: {}",
                            g.node.as_deref().unwrap_or("none (503)")
                        );
                    }
                    _ => {
                        let _ = writeln!(text, "geo: the database has no location for {client}");
                    }
                }
            }
            if let Some(d) = &vod {
                let verdict = match (d.status, &d.node) {
                    (302, Some(n)) => format!(
                        "302 → {n} revision {} ({})",
                        d.revision.unwrap_or(0),
                        d.location.as_deref().unwrap_or("proxied by the router")
                    ),
                    (503, _) => format!("503 Retry-After {}", edgestate::route::RETRY_AFTER_SECS),
                    (s, _) => s.to_string(),
                };
                let _ = writeln!(
                    text,
                    "vod {}: decision: {verdict}",
                    args.vod.as_deref().unwrap_or("")
                );
                let _ = writeln!(text, "why:");
                for (i, r) in d.reasons.iter().enumerate() {
                    let _ = writeln!(text, "  {}. {r}", i + 1);
                }
                for r in &d.replicas {
                    let _ = writeln!(
                        text,
                        "  {} zone {} revision {} sessions {}{}",
                        r.node,
                        r.zone.as_deref().unwrap_or("-"),
                        r.revision,
                        r.play_sessions
                            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                        r.reason
                            .as_ref()
                            .map_or_else(String::new, |w| format!(" [{w}]"))
                    );
                }
            }
            out.write_all(text.as_bytes())?;
        }
    }
    Ok(0)
}
