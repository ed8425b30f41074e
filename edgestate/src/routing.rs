//! The compiled routing table, `edgeform:routing`.
//!
//! Everything a node needs to make a playback or geo decision without the
//! control plane: zones with their routes and fallbacks, every node's
//! roles, zone, limits, URLs and location, the trusted proxies, the geo
//! settings, and, on router nodes, their weighted 443 pool.
//!
//! Maps are `BTreeMap`s and lists are emitted in a defined order, so the
//! serialized table is deterministic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole table as stored under [`crate::keys::ROUTING`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingTable {
    /// [`crate::FORMAT_VERSION`] of the writer.
    pub format: u32,
    /// The cluster's name (`cluster.yaml` `name`).
    pub cluster: String,
    /// CIDRs whose `X-Forwarded-For` is believed (one hop).
    pub trusted_proxies: Vec<String>,
    /// Geo routing settings (the :80 traffic router).
    pub geo: GeoSettings,
    /// Zones by name.
    pub zones: BTreeMap<String, Zone>,
    /// Every node by name (not only targets: routing needs all of them).
    pub nodes: BTreeMap<String, Node>,
    /// The 443 pool of the node this table was compiled for, when it is a
    /// router; absent on every other node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_pool: Option<Vec<PoolMember>>,
}

/// A CDN zone (docs/configuration.md, zones/).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Zone {
    /// Normalized CIDRs, as written (v4 and v6 in one list).
    pub routes: Vec<String>,
    /// Next zone of the chain; `None` ends it.
    pub fallback: Option<String>,
}

/// A node as routing sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Subset of `edge`, `ingest`, `origin`, `router`, sorted.
    pub roles: Vec<String>,
    pub region: String,
    pub zone: Option<String>,
    /// Payload URL: viewers are redirected here. `None`: the router proxies.
    pub public_url: Option<String>,
    pub location: Option<Location>,
    pub addresses: Vec<String>,
    /// Maximum active play sessions; `None` = unlimited, `0` = never chosen.
    pub playback_session_limit: Option<u64>,
    /// Outgoing kbit/s of the whole host; `None` = unlimited, `0` = never.
    pub playback_bandwidth_kbit: Option<u64>,
    /// Placement budget (RX+TX); informational for routing.
    pub network_bandwidth_kbit: Option<u64>,
    /// Drained (`drain: true`, the anchors' ADMIN_DOWN): kept in the table
    /// but never chosen for a new viewer (playback, geo, VOD placement) and
    /// `down` in routers' 443 pools. Absent from the JSON when false, so
    /// tables without drained nodes are unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
}

/// A point on the globe, in degrees.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    pub lat: f64,
    pub lon: f64,
}

/// Geo settings (docs/configuration.md, `cluster.yaml` `geo`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeoSettings {
    /// Edges within this many km of the nearest are tied.
    pub tie_km: f64,
    /// Distance buckets for the 443 pool, by increasing `below_km`.
    pub buckets: Vec<Bucket>,
    /// Weight beyond the last bucket.
    pub default_weight: u32,
    pub max_fails: u32,
    /// Seconds.
    pub fail_timeout_s: u64,
}

/// `distance < below_km` → `weight`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    pub below_km: f64,
    pub weight: u32,
}

impl Default for GeoSettings {
    /// The seed's router: ties within 100 km; `<500 km → 10, <2000 → 7,
    /// <5000 → 4, else 1`; `max_fails=3 fail_timeout=30s`.
    fn default() -> Self {
        GeoSettings {
            tie_km: 100.0,
            buckets: vec![
                Bucket {
                    below_km: 500.0,
                    weight: 10,
                },
                Bucket {
                    below_km: 2000.0,
                    weight: 7,
                },
                Bucket {
                    below_km: 5000.0,
                    weight: 4,
                },
            ],
            default_weight: 1,
            max_fails: 3,
            fail_timeout_s: 30,
        }
    }
}

impl GeoSettings {
    /// The 443 pool weight of an edge at `km` from the router.
    #[must_use]
    pub fn weight_for(&self, km: f64) -> u32 {
        self.buckets
            .iter()
            .find(|b| km < b.below_km)
            .map_or(self.default_weight, |b| b.weight)
    }
}

/// One edge in a router's 443 pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolMember {
    pub node: String,
    pub address: String,
    /// Great-circle distance from the router, km (rounded to 0.1).
    pub distance_km: f64,
    pub weight: u32,
    /// The edge is drained: nginx `down`, no new connections.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub down: bool,
}

/// Whether `ip` may stand in a public 443 pool: not private (RFC 1918,
/// ULA `fc00::/7`), link-local, loopback, CGNAT (`100.64.0.0/10`),
/// unspecified, or an IPv4-mapped IPv6 form of one of these. Routers'
/// pools leave out every other address (a viewer cannot reach it).
#[must_use]
pub fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            let cgnat = o[0] == 100 && (o[1] & 0xc0) == 64;
            !(a.is_private()
                || a.is_loopback()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || cgnat)
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = a.segments();
            let ula = (s[0] & 0xfe00) == 0xfc00;
            let link_local = (s[0] & 0xffc0) == 0xfe80;
            !(a.is_loopback() || a.is_unspecified() || ula || link_local)
        }
    }
}

/// The mean Earth radius [`haversine_km`] uses.
pub const EARTH_RADIUS_KM: f64 = 6371.0088;

/// Great-circle distance in km (haversine, mean Earth radius).
#[must_use]
pub fn haversine_km(a: Location, b: Location) -> f64 {
    let (lat1, lat2) = (a.lat.to_radians(), b.lat.to_radians());
    let dlat = lat2 - lat1;
    let dlon = (b.lon - a.lon).to_radians();
    let h = (dlat / 2.0).sin().powi(2) + lat1.cos() * lat2.cos() * (dlon / 2.0).sin().powi(2);
    2.0 * EARTH_RADIUS_KM * h.sqrt().min(1.0).asin()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> GeoSettings {
        GeoSettings::default()
    }

    #[test]
    fn seed_distance_buckets() {
        let g = geo();
        assert_eq!(g.weight_for(0.0), 10);
        assert_eq!(g.weight_for(499.9), 10);
        assert_eq!(g.weight_for(500.0), 7);
        assert_eq!(g.weight_for(1999.0), 7);
        assert_eq!(g.weight_for(2000.0), 4);
        assert_eq!(g.weight_for(4999.0), 4);
        assert_eq!(g.weight_for(5000.0), 1);
        assert_eq!(g.weight_for(20000.0), 1);
    }

    #[test]
    fn public_addresses_only_in_pools() {
        for private in [
            "10.2.0.5",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "127.0.0.1",
            "127.0.0.2",
            "169.254.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "203.0.113.10",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "198.51.100.7",
            "2001:db8::10",
            "2a00:1450::1",
            "::ffff:81.2.69.142",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn haversine_london_linkoping() {
        // 81.2.69.142 (London) and 89.160.20.128 (Linköping) in MaxMind's
        // test data; the great-circle distance is 1,257.7 km (checked with
        // an independent haversine in Python).
        let london = Location {
            lat: 51.5142,
            lon: -0.0931,
        };
        let linkoping = Location {
            lat: 58.4167,
            lon: 15.6167,
        };
        let d = haversine_km(london, linkoping);
        assert!((d - 1257.727).abs() < 0.01, "{d}");
        assert!(haversine_km(london, london).abs() < 1e-9);
    }
}
