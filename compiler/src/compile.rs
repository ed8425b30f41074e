//! Compile a validated [`Config`] into what each target holds.
//!
//! A *target* is a node with a `redis` block: the compiler pushes to its
//! own Redis. Every target receives `edgeform:routing`; edges also receive
//! `site:<host>` (host and each alias) and `suspended:<host>` for the sites
//! of their region. Routers get their weighted 443 pool in their routing
//! table and as an nginx `stream` upstream snippet.
//!
//! **Invariant:** compilation is deterministic: the same `Config` gives
//! byte-identical output, whatever the thread count, because everything is
//! sorted before it is emitted. Edges of one region share one site list
//! (`Arc`), so a 100,000-site repository compiles once, not once per edge.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use edgestate::routing::{self, PoolMember, RoutingTable, haversine_km};
use edgestate::{FORMAT_VERSION, keys};
use rayon::prelude::*;

use crate::model::resolved::{Config, Node, Role};

/// Key → value pairs, sorted by key.
pub type Entries = Vec<(Arc<str>, Arc<str>)>;

/// Everything one target holds.
#[derive(Debug, Clone)]
pub struct Target {
    pub node: String,
    pub region: String,
    /// `edgeform:routing`'s value.
    pub routing: Arc<str>,
    /// `site:*` and `suspended:*`, sorted (shared by edges of a region).
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

    /// The target's file in `build --out`: a sorted JSON object of key →
    /// value, one entry per line, with a final newline.
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
        for (i, (k, v)) in self.entries().enumerate() {
            if i > 0 {
                out.push_str(",\n");
            }
            out.push_str("  ");
            out.push_str(&serde_json::to_string(k).unwrap_or_default());
            out.push_str(": ");
            out.push_str(&serde_json::to_string(v).unwrap_or_default());
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
    /// Router node name → nginx `stream` upstream snippet.
    pub nginx: BTreeMap<String, String>,
}

/// A key, its value, and the regions it is limited to (`None`: all).
type Placed<'a> = (Arc<str>, Arc<str>, Option<&'a BTreeSet<String>>);

/// Compile. Pure and deterministic.
#[must_use]
pub fn compile(config: &Config) -> Compiled {
    // Every site document once, host and aliases sharing the text.
    let mut all: Vec<Placed<'_>> = config
        .sites
        .par_iter()
        .flat_map_iter(|site| {
            let doc: Arc<str> = site.doc.to_canonical_json().into();
            let regions = site.regions.as_ref();
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
                .filter(|(_, _, regions)| regions.is_none_or(|r| r.contains(region)))
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
        .map(|n| (n.name.clone(), nginx_upstream(config, n, &pool(config, n))))
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

/// A router's 443 pool: every edge with an address, weighted by distance
/// bucket, nearest first (ties by name).
#[must_use]
pub fn pool(config: &Config, router: &Node) -> Vec<PoolMember> {
    let Some(from) = router.location else {
        return Vec::new();
    };
    let geo = &config.cluster.geo;
    let mut members: Vec<PoolMember> = config
        .nodes
        .iter()
        .filter(|n| n.has(Role::Edge))
        .filter_map(|edge| {
            let address = edge.addresses.first()?;
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

/// The nginx `stream` upstream for a router's 443 pool.
#[must_use]
pub fn nginx_upstream(config: &Config, router: &Node, pool: &[PoolMember]) -> String {
    let geo = &config.cluster.geo;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# edgeform: TLS passthrough pool of router `{}` (cluster `{}`).",
        router.name, config.cluster.name
    );
    let _ = writeln!(
        out,
        "# Generated from the config repository; do not edit. Include it in `stream {{}}`."
    );
    if pool.is_empty() {
        let _ = writeln!(
            out,
            "# No edge with an address and a location: no upstream is defined."
        );
        return out;
    }
    let _ = writeln!(out, "upstream edgeform_edges_443 {{");
    let _ = writeln!(out, "    least_conn;");
    for m in pool {
        let addr: std::net::IpAddr = m
            .address
            .parse()
            .unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
        let host = match addr {
            std::net::IpAddr::V4(a) => a.to_string(),
            std::net::IpAddr::V6(a) => format!("[{a}]"),
        };
        let (down, note) = if m.down {
            (" down", ", drained")
        } else {
            ("", "")
        };
        let _ = writeln!(
            out,
            "    server {host}:443 weight={} max_fails={} fail_timeout={}s{down};  # {} {:.1} km{note}",
            m.weight, geo.max_fails, geo.fail_timeout_s, m.node, m.distance_km
        );
    }
    let _ = writeln!(out, "}}");
    out
}
