//! Compile a validated [`Config`] into what each target holds.
//!
//! A *target* is a node with a `redis` block: the compiler pushes to its
//! own Redis. Every target receives `edgeform:routing`; edges also receive
//! `site:<host>` (host and each alias) and `suspended:<host>` for the sites
//! of their region. Routers get their weighted 443 pool in their routing
//! table and as a whole nginx `stream {}` block ([`nginx_stream`]).
//!
//! **Invariant:** compilation is deterministic: the same `Config` gives
//! byte-identical output, whatever the thread count, because everything is
//! sorted before it is emitted. Edges of one region share one site list
//! (`Arc`), so a 100,000-site repository compiles once, not once per edge.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use edgestate::routing::{self, PoolMember, RoutingTable, haversine_km};
use edgestate::{FORMAT_VERSION, keys};
use rayon::prelude::*;

use crate::model::resolved::{Config, Node, Role};
use crate::tls::Certificates;

/// Key → value pairs, sorted by key.
pub type Entries = Vec<(Arc<str>, Arc<str>)>;

/// Everything one target holds.
#[derive(Debug, Clone)]
pub struct Target {
    pub node: String,
    pub region: String,
    /// `edgeform:routing`'s value.
    pub routing: Arc<str>,
    /// `site:*`, `suspended:*` and `tls:*`, sorted (shared by edges of a
    /// region).
    pub sites: Arc<Entries>,
}

impl Target {
    /// Every key and value, sorted by key. (`edgeform:routing` sorts before
    /// `site:` and `suspended:`.)
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((keys::ROUTING, &*self.routing))
            .chain(self.sites.iter().map(|(k, v)| (&**k, &**v)))
    }

    #[must_use]
    pub fn len(&self) -> usize {
        1 + self.sites.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// [`Self::entries`] as they may be shown: a `tls:*` document with
    /// the fingerprint in place of its key ([`edgestate::tls::shown`]).
    pub fn shown_entries(&self) -> impl Iterator<Item = (&str, std::borrow::Cow<'_, str>)> {
        self.entries()
            .map(|(k, v)| (k, edgestate::tls::shown(k, v)))
    }

    /// The target's file in `build --out`: a sorted JSON object of key →
    /// value, one entry per line, with a final newline. Certificate
    /// documents hold the fingerprint in place of the key: key material
    /// is pushed, never written to disk.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(
            64 + self
                .sites
                .iter()
                .map(|(k, v)| k.len() + v.len() + 16)
                .sum::<usize>(),
        );
        out.push_str("{\n");
        for (i, (k, v)) in self.shown_entries().enumerate() {
            if i > 0 {
                out.push_str(",\n");
            }
            out.push_str("  ");
            out.push_str(&serde_json::to_string(k).unwrap_or_default());
            out.push_str(": ");
            out.push_str(&serde_json::to_string(&*v).unwrap_or_default());
        }
        out.push_str("\n}\n");
        out
    }
}

/// A compiled repository.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    /// By node name.
    pub targets: BTreeMap<String, Target>,
    /// Router node name → nginx `stream {}` block (TLS passthrough on 443).
    pub nginx: BTreeMap<String, String>,
}

/// A key, its value, and the regions it is limited to (`None`: all).
pub(crate) type Placed<'a> = (Arc<str>, Arc<str>, Option<&'a [String]>);

/// Compile without certificates: no `tls:*` key (`serve`, `explain`, and
/// wherever no state directory is at hand). Pure and deterministic.
#[must_use]
pub fn compile(config: &Config) -> Compiled {
    compile_with(config, &Certificates::default())
}

/// Compile, with `tls:<host>` for the host and each alias of every site
/// whose certificate is in `certs` (read by the caller from the state
/// directory: the compiler reads no store), on every edge carrying the
/// site. Pure and deterministic.
#[must_use]
pub fn compile_with(config: &Config, certs: &Certificates) -> Compiled {
    // Every site document once, host and aliases sharing the text.
    let mut all: Vec<Placed<'_>> = config
        .sites
        .par_iter()
        .flat_map_iter(|site| {
            let doc: Arc<str> = site.doc.to_canonical_json().into();
            let regions = site.regions.as_deref();
            let hosts = std::iter::once(&site.host).chain(site.aliases.iter());
            let mut out = Vec::with_capacity(2 * (1 + site.aliases.len()));
            for host in hosts {
                out.push((Arc::from(keys::site(host)), doc.clone(), regions));
                if site.suspended {
                    out.push((
                        Arc::from(keys::suspended(host)),
                        Arc::from(keys::SUSPENDED_VALUE),
                        regions,
                    ));
                }
            }
            out
        })
        .collect();
    all.extend(crate::tls::docs(config, certs));
    all.par_sort_unstable_by(|a, b| a.0.cmp(&b.0));

    let targets_nodes: Vec<&Node> = config.nodes.iter().filter(|n| n.redis.is_some()).collect();
    // One site list per region that has an edge target; non-edges get none.
    let empty: Arc<Entries> = Arc::new(Vec::new());
    let mut per_region: BTreeMap<&str, Arc<Entries>> = BTreeMap::new();
    for node in &targets_nodes {
        if node.has(Role::Edge) && !per_region.contains_key(node.region.as_str()) {
            let region = node.region.as_str();
            let list: Entries = all
                .iter()
                .filter(|(_, _, regions)| regions.is_none_or(|r| r.iter().any(|x| x == region)))
                .map(|(k, v, _)| (k.clone(), v.clone()))
                .collect();
            per_region.insert(region, Arc::new(list));
        }
    }

    let base = routing_table(config);
    let base_text: Arc<str> = to_json(&base).into();
    let mut targets = BTreeMap::new();
    for node in &targets_nodes {
        let routing = if node.has(Role::Router) {
            let mut table = base.clone();
            table.router_pool = Some(pool(config, node));
            to_json(&table).into()
        } else {
            base_text.clone()
        };
        let sites = if node.has(Role::Edge) {
            per_region
                .get(node.region.as_str())
                .cloned()
                .unwrap_or_else(|| empty.clone())
        } else {
            empty.clone()
        };
        targets.insert(
            node.name.clone(),
            Target {
                node: node.name.clone(),
                region: node.region.clone(),
                routing,
                sites,
            },
        );
    }

    let nginx = config
        .nodes
        .iter()
        .filter(|n| n.has(Role::Router))
        .map(|n| {
            let text = nginx_stream(config, n, &pool(config, n), &StreamOptions::default());
            (n.name.clone(), text)
        })
        .collect();
    Compiled { targets, nginx }
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Edge => "edge",
        Role::Ingest => "ingest",
        Role::Origin => "origin",
        Role::Router => "router",
    }
}

/// The routing table every target receives (without a router pool).
#[must_use]
pub fn routing_table(config: &Config) -> RoutingTable {
    RoutingTable {
        format: FORMAT_VERSION,
        cluster: config.cluster.name.clone(),
        trusted_proxies: config
            .cluster
            .trusted_proxies
            .iter()
            .map(ToString::to_string)
            .collect(),
        geo: config.cluster.geo.clone(),
        zones: config
            .zones
            .iter()
            .map(|z| {
                (
                    z.name.clone(),
                    routing::Zone {
                        routes: z.routes.iter().map(ToString::to_string).collect(),
                        fallback: z.fallback.clone(),
                    },
                )
            })
            .collect(),
        nodes: config
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    routing::Node {
                        roles: n.roles.iter().map(|r| role_name(*r).to_owned()).collect(),
                        region: n.region.clone(),
                        zone: n.zone.clone(),
                        public_url: n.public_url.clone(),
                        location: n.location,
                        addresses: n.addresses.iter().map(ToString::to_string).collect(),
                        playback_session_limit: n.playback_session_limit,
                        playback_bandwidth_kbit: n.playback_bandwidth_kbit,
                        network_bandwidth_kbit: n.network_bandwidth_kbit,
                        drain: n.drain,
                    },
                )
            })
            .collect(),
        router_pool: None,
    }
}

/// Which edge addresses may stand in a router's 443 pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// Public addresses only ([`routing::is_public`]): what `build` and the
    /// routing table use. An edge's first public address is taken; an edge
    /// with none is left out.
    Public,
    /// Any address, its first. Only for tests that render a pool of loopback
    /// edges and run it; nothing in the CLI reaches it.
    Any,
}

/// A router's 443 pool: every edge with a public address and a location,
/// weighted by distance bucket, nearest first (ties by name).
#[must_use]
pub fn pool(config: &Config, router: &Node) -> Vec<PoolMember> {
    pool_with(config, router, Addresses::Public)
}

/// [`pool`] with a choice of addresses.
#[must_use]
pub fn pool_with(config: &Config, router: &Node, addresses: Addresses) -> Vec<PoolMember> {
    let Some(from) = router.location else {
        return Vec::new();
    };
    let geo = &config.cluster.geo;
    let mut members: Vec<PoolMember> = config
        .nodes
        .iter()
        .filter(|n| n.has(Role::Edge))
        .filter_map(|edge| {
            let address = edge
                .addresses
                .iter()
                .find(|a| addresses == Addresses::Any || routing::is_public(**a))?;
            let km = haversine_km(from, edge.location?);
            Some(PoolMember {
                node: edge.name.clone(),
                address: address.to_string(),
                distance_km: (km * 10.0).round() / 10.0,
                weight: geo.weight_for(km),
                down: edge.drain,
            })
        })
        .collect();
    members.sort_by(|a, b| {
        a.distance_km
            .total_cmp(&b.distance_km)
            .then_with(|| a.node.cmp(&b.node))
    });
    members
}

/// Where the rendered `stream {}` block listens and connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOptions {
    /// nginx `listen` argument (`443`; a test: `127.0.0.1:<port>`).
    pub listen: String,
    /// The port every edge is reached on; `None` (what `build` writes):
    /// each edge's own `https.proxy_listen` port (default 10443).
    pub edge_port: Option<u16>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            listen: "443".into(),
            edge_port: None,
        }
    }
}

/// The nginx upstream name of the 443 pool.
pub const UPSTREAM: &str = "edgeform_edges_443";

/// A router's whole TLS passthrough: a `stream {}` block for nginx.conf's
/// top level (main context, next to `http {}`, never inside it), with the
/// weighted `least_conn` upstream of `pool` and a `server` that listens on
/// 443 and proxies bytes (no TLS termination: the viewer sees the edge's
/// certificate). Drained edges are `down`. An empty pool gives only
/// comments (nothing listens on 443; `check` warns `router-pool-empty`).
#[must_use]
pub fn nginx_stream(
    config: &Config,
    router: &Node,
    pool: &[PoolMember],
    o: &StreamOptions,
) -> String {
    let geo = &config.cluster.geo;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# edgeform: TLS passthrough of router `{}` (cluster `{}`).",
        router.name, config.cluster.name
    );
    let _ = writeln!(
        out,
        "# Generated from the config repository; do not edit. Include it at the\n\
         # top level of nginx.conf (not inside http {{}}), after\n\
         # `load_module modules/ngx_stream_module.so;` (Debian: libnginx-mod-stream)."
    );
    if pool.is_empty() {
        let _ = writeln!(
            out,
            "# No edge with a public address and a location: nothing listens on 443."
        );
        return out;
    }
    let _ = writeln!(out, "stream {{");
    let _ = writeln!(out, "    upstream {UPSTREAM} {{");
    let _ = writeln!(out, "        least_conn;");
    for m in pool {
        let addr: std::net::IpAddr = m
            .address
            .parse()
            .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
        let host = match addr {
            std::net::IpAddr::V4(a) => a.to_string(),
            std::net::IpAddr::V6(a) => format!("[{a}]"),
        };
        let port = o.edge_port.unwrap_or_else(|| {
            config.nodes.iter().find(|n| n.name == m.node).map_or(
                crate::model::resolved::HttpsListen::default().proxy_port,
                |n| n.https.proxy_port,
            )
        });
        let (down, note) = if m.down {
            (" down", ", drained")
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "        server {host}:{port} weight={} max_fails={} fail_timeout={}s{down};  # {} {:.1} km{note}",
            m.weight, geo.max_fails, geo.fail_timeout_s, m.node, m.distance_km
        );
    }
    let _ = writeln!(out, "    }}");
    let _ = writeln!(out, "    server {{");
    let _ = writeln!(out, "        listen {};", o.listen);
    let _ = writeln!(out, "        proxy_pass {UPSTREAM};");
    let _ = writeln!(
        out,
        "        # The viewer's address to the edge's PROXY-protocol listener\n\
         \x20       # (`https.proxy_listen`; nginx writes PROXY v1)."
    );
    let _ = writeln!(out, "        proxy_protocol on;");
    let _ = writeln!(
        out,
        "        # A dead edge is given up on quickly; the next one is tried."
    );
    let _ = writeln!(out, "        proxy_connect_timeout 3s;");
    let _ = writeln!(out, "        proxy_next_upstream on;");
    let _ = writeln!(out, "        proxy_next_upstream_tries 3;");
    let _ = writeln!(out, "        proxy_next_upstream_timeout 10s;");
    let _ = writeln!(
        out,
        "        # Idle limit between two reads or writes (a paused player)."
    );
    let _ = writeln!(out, "        proxy_timeout 10m;");
    let _ = writeln!(out, "    }}");
    let _ = writeln!(out, "}}");
    out
}

#[cfg(test)]
mod tests;
