//! Routing decisions: pure functions of the compiled routing table, a
//! health snapshot and the request (README, "Routing decisions, explained offline"). No I/O, no runtime: the
//! agent's `/route` and `edgeform route` call the same code, so `route`
//! explains the very choice the agent makes.
//!
//! **Playback (CDN zones).** The client IP is the socket peer, or — when the
//! peer is a trusted proxy — the last `X-Forwarded-For` entry, whatever the
//! entries before it hold (a malformed last entry: the peer). With no route in any zone, routing is *unrestricted*:
//! eligible edges first, then ingest nodes carrying the stream. Once any
//! route exists it is *restricted*: the longest prefix over all zones picks
//! the zone (no match, or no client IP: 403), and only the nodes of the
//! zone chain (zone, fallback, … stopping at none, a missing or a repeated
//! zone) may serve. In a zone, edge and ingest are equal: the eligible node
//! with the fewest play sessions wins; ties go to the highest rendezvous
//! hash of (client IP, node), spreading clients evenly and statelessly.
//! Nothing eligible anywhere: 503 + Retry-After. A stream no report
//! mentions: 404.
//!
//! **Geo (the :80 router).** Strictly nearest online edge by haversine distance
//! from the client's location; edges within `tie_km` of the nearest are
//! tied and chosen by rendezvous hash of the client IP, so a client stays
//! put when another tied edge goes away.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::lpm::{Lpm, Prefix};
use crate::routing::{Location, Node, RoutingTable, haversine_km};

/// The streams a node carries, shared between its report and every
/// routing snapshot made from it: a snapshot of 1,000 nodes (taken each
/// time health changes) clones a pointer, not each list.
pub type Streams = std::sync::Arc<Vec<String>>;
/// VOD assets a node holds (asset → revisions), shared like [`Streams`].
pub type Vod = std::sync::Arc<BTreeMap<String, Vec<u64>>>;

/// One node's last health report (the fields routing needs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHealth {
    #[serde(default)]
    pub online: Option<bool>,
    #[serde(default)]
    pub play_sessions: Option<u64>,
    #[serde(default)]
    pub out_kbit: Option<u64>,
    #[serde(default)]
    pub streams: Option<Streams>,
    /// The report is the last one known while its source is unreachable.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    /// VOD assets the node holds: asset → the revisions it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vod: Option<Vod>,
    /// Receive + transmit kbit/s of the whole host: what
    /// `network_bandwidth_kbit` (the placement budget) limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_kbit: Option<u64>,
    /// Whether the node's edge answers its agent's probe (absent: the
    /// agent probes nothing). `false` excludes the node like `online:
    /// false`, with the reason "not serving".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
}

impl NodeHealth {
    /// Online and not known to be failing its probe.
    #[must_use]
    pub fn up(&self) -> bool {
        self.online == Some(true) && self.serving != Some(false)
    }
}

/// A health snapshot: `{"nodes": {"<name>": {...}}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeHealth>,
}

/// Seconds a 503 asks the player to wait.
pub const RETRY_AFTER_SECS: u32 = 5;

/// How a chosen node delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// 302 to the node's payload URL.
    Redirect,
    /// No payload URL: the router proxies the media from the node.
    Proxy,
}

/// One node as listed in a decision (JSON view), with why it was or was
/// not eligible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub node: String,
    pub play_sessions: Option<u64>,
    pub eligible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Public addresses only (private ones are left out).
    pub addresses: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// Its health is the last known while the source is unreachable.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
}

/// One zone of the chain with its nodes by increasing load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ZoneListing {
    pub zone: String,
    pub nodes: Vec<Candidate>,
}

/// A playback decision, with every reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// 302, 403, 404 or 503.
    pub status: u16,
    pub node: Option<String>,
    pub zone: Option<String>,
    /// Zone names in chain order (empty when unrestricted).
    pub chain: Vec<String>,
    /// Redirect target (payload URL + stream) when `mode` is redirect.
    pub location: Option<String>,
    pub mode: Option<Mode>,
    pub client_ip: Option<String>,
    /// Each step, and why each node was excluded.
    pub reasons: Vec<String>,
    /// The chain's zones (or the unrestricted tiers) with their nodes.
    pub zones: Vec<ZoneListing>,
}

/// Why a node is not eligible (formatted only when a decision is
/// explained, so the hot path does not allocate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    Drained,
    NoReport,
    OnlineMissing,
    Offline,
    /// Online, but its edge does not answer its agent's probe.
    NotServing,
    NotCarried,
    SessionsMissing,
    SessionLimitZero,
    AtSessionLimit(u64, u64),
    BandwidthZero,
    OutMissing,
    AtBandwidth(u64, u64),
}

impl Why {
    fn text(self, stream: &str) -> String {
        match self {
            Why::Drained => "drained".into(),
            Why::NoReport => "no health report".into(),
            Why::OnlineMissing => "online missing".into(),
            Why::Offline => "offline".into(),
            Why::NotServing => "not serving".into(),
            Why::NotCarried => format!("does not carry {stream}"),
            Why::SessionsMissing => "play_sessions missing".into(),
            Why::SessionLimitZero => "playback_session_limit is 0".into(),
            Why::AtSessionLimit(s, l) => format!("at session limit ({s} >= {l})"),
            Why::BandwidthZero => "playback_bandwidth_kbit is 0".into(),
            Why::OutMissing => "out_kbit missing (needed for playback_bandwidth_kbit)".into(),
            Why::AtBandwidth(o, l) => format!("at bandwidth limit ({o} >= {l} kbit/s)"),
        }
    }
}

/// Reasons, collected only when asked for.
struct Notes {
    on: bool,
    list: Vec<String>,
}

impl Notes {
    fn add(&mut self, f: impl FnOnce() -> String) {
        if self.on {
            self.list.push(f());
        }
    }
}

/// Walking a zone chain: zone, fallback, … stopping at none, a missing
/// or a repeated zone (repeats found in O(1) for long chains).
struct Walk<'a> {
    chain: Vec<&'a str>,
    seen: Option<std::collections::HashSet<&'a str>>,
    next: Option<&'a str>,
}

impl<'a> Walk<'a> {
    fn new(start: &'a str) -> Walk<'a> {
        Walk {
            chain: Vec::new(),
            seen: None,
            next: Some(start),
        }
    }

    /// The next zone of the chain, if the chain goes on.
    fn step(&mut self, router: &'a Router, notes: &mut Notes) -> Option<&'a str> {
        let z = self.next.take()?;
        let repeated = match &mut self.seen {
            Some(seen) => seen.contains(z),
            None if self.chain.len() >= 8 => {
                self.seen = Some(self.chain.iter().copied().collect());
                self.chain.contains(&z)
            }
            None => self.chain.contains(&z),
        };
        if repeated {
            notes.add(|| format!("chain stops: zone {z} repeats"));
            return None;
        }
        let Some((name, zone)) = router.table.zones.get_key_value(z) else {
            notes.add(|| format!("chain stops: zone {z} does not exist"));
            return None;
        };
        self.chain.push(name.as_str());
        if let Some(seen) = &mut self.seen {
            seen.insert(name.as_str());
        }
        self.next = zone.fallback.as_deref();
        Some(name.as_str())
    }
}

/// A prepared table: zones indexed for longest-prefix match.
#[derive(Debug, Clone)]
pub struct Router {
    table: RoutingTable,
    zone_names: Vec<String>,
    lpm: Lpm,
    restricted: bool,
    trusted: Vec<Prefix>,
    /// Playback nodes of each zone, by name.
    zone_nodes: BTreeMap<String, Vec<String>>,
    /// Unrestricted tiers: edges, then ingest nodes that are not edges.
    edges: Vec<String>,
    ingest: Vec<String>,
}

/// IPv4-mapped IPv6 addresses are IPv4 clients.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// [`stable_hash`]'s constants: FNV-1a's offset basis and prime, then
/// SplitMix64's two finalizer multipliers.
pub const HASH_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const HASH_PRIME: u64 = 0x0100_0000_01b3;
pub const HASH_MIX1: u64 = 0xbf58_476d_1ce4_e5b9;
pub const HASH_MIX2: u64 = 0x94d0_49bb_1331_11eb;

/// A stable 64-bit hash (FNV-1a, then a SplitMix finalizer): the same on
/// every node and every version, unlike std's hasher.
#[must_use]
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = HASH_OFFSET;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(HASH_PRIME);
        }
        h ^= 0xff;
        h = h.wrapping_mul(HASH_PRIME);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(HASH_MIX1);
    h ^= h >> 27;
    h = h.wrapping_mul(HASH_MIX2);
    h ^ (h >> 31)
}

/// Rendezvous (highest random weight) choice of one name for a client.
/// One name is chosen without hashing; the key is the client's text form
/// (the Lua twin hashes the same bytes), written on the stack.
fn rendezvous<'a>(
    client: Option<IpAddr>,
    mut names: impl ExactSizeIterator<Item = &'a str>,
) -> Option<&'a str> {
    if names.len() <= 1 {
        return names.next();
    }
    let mut buf = [0u8; 64];
    let key = client.map_or(&[][..], |c| ip_text(c, &mut buf));
    names.max_by_key(|n| (stable_hash(&[key, n.as_bytes()]), *n))
}

/// `ip`'s `Display` text in `buf` (an address's text is at most 45 bytes).
fn ip_text(ip: IpAddr, buf: &mut [u8; 64]) -> &[u8] {
    use std::io::Write as _;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    // 64 bytes always hold it; a failed write would leave a shorter key.
    let _ = write!(cursor, "{ip}");
    let end = usize::try_from(cursor.position()).unwrap_or(0);
    &buf[..end]
}

fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_private()
                || a.is_loopback()
                || a.is_link_local()
                || a.is_unspecified()
                || a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64
        }
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

const PLAYBACK_ROLES: [&str; 3] = ["edge", "ingest", "origin"];

fn has_role(node: &Node, role: &str) -> bool {
    node.roles.iter().any(|r| r == role)
}

impl Router {
    /// Prepare `table` (build the prefix index).
    ///
    /// # Errors
    /// A route or trusted proxy that does not parse (the compiler never
    /// writes one; a hand-edited table might).
    pub fn new(table: RoutingTable) -> Result<Router, String> {
        let zone_names: Vec<String> = table.zones.keys().cloned().collect();
        let mut prefixes = Vec::new();
        for (i, (name, zone)) in table.zones.iter().enumerate() {
            for r in &zone.routes {
                let p: Prefix = r
                    .parse()
                    .map_err(|e| format!("zone {name}: bad route `{r}`: {e}"))?;
                prefixes.push((p, u32::try_from(i).unwrap_or(u32::MAX)));
            }
        }
        let restricted = !prefixes.is_empty();
        let lpm = Lpm::new(prefixes).map_err(|e| format!("zone routes: {e}"))?;
        let trusted = table
            .trusted_proxies
            .iter()
            .map(|t| {
                t.parse::<Prefix>()
                    .map_err(|e| format!("bad trusted proxy `{t}`: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let mut zone_nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, n) in &table.nodes {
            if let Some(z) = &n.zone
                && PLAYBACK_ROLES.iter().any(|r| has_role(n, r))
            {
                zone_nodes.entry(z.clone()).or_default().push(name.clone());
            }
        }
        let edges = table
            .nodes
            .iter()
            .filter(|(_, n)| has_role(n, "edge"))
            .map(|(k, _)| k.clone())
            .collect();
        let ingest = table
            .nodes
            .iter()
            .filter(|(_, n)| has_role(n, "ingest") && !has_role(n, "edge"))
            .map(|(k, _)| k.clone())
            .collect();
        Ok(Router {
            table,
            zone_names,
            lpm,
            restricted,
            trusted,
            zone_nodes,
            edges,
            ingest,
        })
    }

    #[must_use]
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// Whether any zone has a route.
    #[must_use]
    pub fn restricted(&self) -> bool {
        self.restricted
    }

    /// The zone whose route is the longest prefix containing `ip`.
    #[must_use]
    pub fn zone_of(&self, ip: IpAddr) -> Option<&str> {
        self.lpm
            .lookup(canonical(ip))
            .and_then(|i| self.zone_names.get(i as usize))
            .map(String::as_str)
    }

    /// The client address: the peer, or, when the peer is a trusted
    /// proxy, the last `X-Forwarded-For` entry — the address that proxy
    /// appended — whatever the entries before it hold (README, "Routing
    /// decisions, explained offline"; docs/edge.md "Client, host, path").
    /// Several header lines are one list, in order (join them with
    /// [`join_xff`]): a proxy such as HAProxy appends its own line after
    /// the client's. Only a last entry that is not an address (after
    /// [`xff_last`]'s trimming) falls back to the peer.
    #[must_use]
    pub fn client_ip(&self, peer: IpAddr, xff: Option<&str>, reasons: &mut Vec<String>) -> IpAddr {
        let mut notes = Notes {
            on: true,
            list: std::mem::take(reasons),
        };
        let ip = self.client(peer, xff, &mut notes);
        *reasons = notes.list;
        ip
    }

    /// Whether `peer` is a router of the routing table (one of the
    /// addresses of a node with the `router` role): the only peers whose
    /// PROXY-protocol header the edge believes (docs/edge.md, "The
    /// viewer's address through the routers").
    #[must_use]
    pub fn is_router(&self, peer: IpAddr) -> bool {
        let peer = canonical(peer);
        self.table
            .nodes
            .values()
            .filter(|n| has_role(n, "router"))
            .flat_map(|n| n.addresses.iter())
            .any(|a| a.parse::<IpAddr>().is_ok_and(|a| canonical(a) == peer))
    }

    /// The client address of a request that arrived on the edge's
    /// PROXY-protocol listener (`proxy`: the address the header gave) or
    /// on a plain one (`proxy` `None`: [`Router::client_ip`]). Through
    /// PROXY, the peer must be a router ([`Router::is_router`]) and the
    /// header's address stands for the peer — then the same
    /// `X-Forwarded-For` rule; `None`: refused (a non-router's header, or
    /// a header address that does not parse).
    #[must_use]
    pub fn client_ip_proxied(
        &self,
        peer: IpAddr,
        proxy: Option<&str>,
        xff: Option<&str>,
        reasons: &mut Vec<String>,
    ) -> Option<IpAddr> {
        let Some(proxy) = proxy else {
            return Some(self.client_ip(peer, xff, reasons));
        };
        if !self.is_router(peer) {
            reasons.push(format!(
                "peer {} sent a PROXY header but is not a router: refused",
                canonical(peer)
            ));
            return None;
        }
        let Ok(viewer) = proxy.parse::<IpAddr>() else {
            reasons.push(format!(
                "router {} sent a malformed PROXY address `{}`: refused",
                canonical(peer),
                crate::untrusted::escape(proxy)
            ));
            return None;
        };
        reasons.push(format!(
            "router {}: the viewer is the PROXY address {}",
            canonical(peer),
            canonical(viewer)
        ));
        Some(self.client_ip(viewer, xff, reasons))
    }

    fn client(&self, peer: IpAddr, xff: Option<&str>, notes: &mut Notes) -> IpAddr {
        let peer = canonical(peer);
        if !self.trusted.iter().any(|t| t.contains(peer)) {
            if xff.is_some() {
                notes
                    .add(|| format!("peer {peer} is not a trusted proxy: X-Forwarded-For ignored"));
            }
            return peer;
        }
        let Some(header) = xff else {
            notes.add(|| format!("trusted proxy {peer} sent no X-Forwarded-For: using the peer"));
            return peer;
        };
        let last = xff_last(header);
        if let Ok(ip) = last.parse::<IpAddr>() {
            notes.add(|| {
                format!("trusted proxy {peer}: client is the last X-Forwarded-For entry {ip}")
            });
            return canonical(ip);
        }
        notes.add(|| {
            format!(
                "trusted proxy {peer} sent a malformed last X-Forwarded-For entry `{}`: using the peer",
                crate::untrusted::escape(last)
            )
        });
        peer
    }

    /// The zone chain from `start`: its fallbacks, stopping at none, a
    /// missing or a repeated zone.
    #[must_use]
    pub fn chain(&self, start: &str, reasons: &mut Vec<String>) -> Vec<String> {
        let mut notes = Notes {
            on: true,
            list: std::mem::take(reasons),
        };
        let chain = self
            .chain_of(start, &mut notes)
            .into_iter()
            .map(str::to_owned)
            .collect();
        *reasons = notes.list;
        chain
    }

    fn chain_of<'a>(&'a self, start: &'a str, notes: &mut Notes) -> Vec<&'a str> {
        let mut walk = Walk::new(start);
        while walk.step(self, notes).is_some() {}
        walk.chain
    }

    /// Why `node` may not serve `stream` now (`None`: eligible).
    fn exclusion(name: &str, node: &Node, stream: &str, health: &Health) -> Option<Why> {
        if node.drain {
            return Some(Why::Drained);
        }
        let Some(h) = health.nodes.get(name) else {
            return Some(Why::NoReport);
        };
        if h.online != Some(true) {
            return Some(if h.online.is_none() {
                Why::OnlineMissing
            } else {
                Why::Offline
            });
        }
        if h.serving == Some(false) {
            return Some(Why::NotServing);
        }
        let carries = has_role(node, "edge")
            || h.streams
                .as_ref()
                .is_some_and(|s| s.iter().any(|x| x == stream));
        if !carries {
            return Some(Why::NotCarried);
        }
        let Some(sessions) = h.play_sessions else {
            return Some(Why::SessionsMissing);
        };
        match node.playback_session_limit {
            Some(0) => return Some(Why::SessionLimitZero),
            Some(limit) if sessions >= limit => return Some(Why::AtSessionLimit(sessions, limit)),
            _ => {}
        }
        match (node.playback_bandwidth_kbit, h.out_kbit) {
            (Some(0), _) => return Some(Why::BandwidthZero),
            (Some(_), None) => return Some(Why::OutMissing),
            (Some(limit), Some(out)) if out >= limit => return Some(Why::AtBandwidth(out, limit)),
            _ => {}
        }
        None
    }

    /// The winner among `names` (fewest sessions, ties by rendezvous hash)
    /// and, when explaining, the listing by increasing load.
    fn pick<'a>(
        &self,
        names: &'a [String],
        stream: &str,
        health: &Health,
        client: Option<IpAddr>,
        notes: &mut Notes,
        label: (&str, &str),
    ) -> (Option<&'a str>, Vec<Candidate>) {
        let (kind, place) = label;
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut least: Option<u64> = None;
        let mut tied: Vec<&'a str> = Vec::new();
        for name in names {
            let node = &self.table.nodes[name];
            let why = Self::exclusion(name, node, stream, health);
            let sessions = health.nodes.get(name).and_then(|h| h.play_sessions);
            match why {
                Some(w) => {
                    notes.add(|| format!("{kind}{place}: {name} excluded: {}", w.text(stream)))
                }
                None => {
                    let s = sessions.unwrap_or(0);
                    match least {
                        Some(l) if s > l => {}
                        Some(l) if s == l => tied.push(name),
                        _ => {
                            least = Some(s);
                            tied.clear();
                            tied.push(name);
                        }
                    }
                }
            }
            if notes.on {
                candidates.push(Candidate {
                    node: name.clone(),
                    play_sessions: sessions,
                    eligible: why.is_none(),
                    reason: why.map(|w| w.text(stream)),
                    addresses: node
                        .addresses
                        .iter()
                        .filter(|a| a.parse::<IpAddr>().is_ok_and(|ip| !is_private(ip)))
                        .cloned()
                        .collect(),
                    public_url: node.public_url.clone(),
                    stale: health.nodes.get(name).is_some_and(|h| h.stale),
                });
            }
        }
        candidates.sort_by(|a, b| {
            (!a.eligible, a.play_sessions.unwrap_or(u64::MAX), &a.node).cmp(&(
                !b.eligible,
                b.play_sessions.unwrap_or(u64::MAX),
                &b.node,
            ))
        });
        if tied.len() > 1 {
            notes.add(|| {
                format!(
                    "{kind}{place}: {} tied at {} sessions: {}",
                    tied.len(),
                    least.unwrap_or(0),
                    tied.join(", ")
                )
            });
        }
        (rendezvous(client, tied.into_iter()), candidates)
    }

    /// The playback decision for `stream`, explained: every step's reason
    /// and the chain's zones with their nodes.
    #[must_use]
    pub fn decide(
        &self,
        peer: Option<IpAddr>,
        xff: Option<&str>,
        stream: &str,
        health: &Health,
    ) -> Decision {
        self.decide_with(peer, xff, stream, health, true)
    }

    /// The same decision without the explanation — reasons, listings, the
    /// chain and the client's address are left empty (the agent's redirect
    /// path): the status, node, zone, mode and location are identical.
    #[must_use]
    pub fn decide_quick(
        &self,
        peer: Option<IpAddr>,
        xff: Option<&str>,
        stream: &str,
        health: &Health,
    ) -> Decision {
        self.decide_with(peer, xff, stream, health, false)
    }

    fn decide_with(
        &self,
        peer: Option<IpAddr>,
        xff: Option<&str>,
        stream: &str,
        health: &Health,
        explain: bool,
    ) -> Decision {
        let mut notes = Notes {
            on: explain,
            list: Vec::new(),
        };
        let client = peer.map(|p| self.client(p, xff, &mut notes));
        let mut d = Decision {
            status: 503,
            node: None,
            zone: None,
            chain: Vec::new(),
            location: None,
            mode: None,
            // The redirect path (`explain` false) answers from status,
            // node and location alone: no client text, chain or reasons.
            client_ip: if explain {
                client.map(|c| c.to_string())
            } else {
                None
            },
            reasons: Vec::new(),
            zones: Vec::new(),
        };
        let known = health.nodes.values().any(|h| {
            h.streams
                .as_ref()
                .is_some_and(|s| s.iter().any(|x| x == stream))
        });
        if !known {
            notes.add(|| format!("no node reports stream {stream}"));
            d.status = 404;
            d.reasons = notes.list;
            return d;
        }
        let winner: Option<(&str, Option<&str>)> = if self.restricted {
            let Some(client) = client else {
                notes.add(|| "routing is restricted and there is no client IP: refused".into());
                d.status = 403;
                d.reasons = notes.list;
                return d;
            };
            let Some(zone) = self.zone_of(client) else {
                notes.add(|| {
                    format!("routing is restricted and no zone route contains {client}: refused")
                });
                d.status = 403;
                d.reasons = notes.list;
                return d;
            };
            notes.add(|| format!("{client} matches zone {zone} (longest prefix)"));
            // Walk the chain; the quick path stops at the first zone with
            // a winner, the explained one lists the whole chain.
            let mut walk = Walk::new(zone);
            let mut found = None;
            while let Some(z) = walk.step(self, &mut notes) {
                if found.is_some() && !explain {
                    break;
                }
                let names = self.zone_nodes.get(z).map_or(&[][..], Vec::as_slice);
                if names.is_empty() {
                    notes.add(|| format!("zone {z}: no playback nodes"));
                }
                let (w, list) = self.pick(
                    names,
                    stream,
                    health,
                    Some(client),
                    &mut notes,
                    ("zone ", z),
                );
                if explain {
                    d.zones.push(ZoneListing {
                        zone: z.to_owned(),
                        nodes: list,
                    });
                }
                match w {
                    Some(w) if found.is_none() => found = Some((w, Some(z))),
                    None if found.is_none() => {
                        notes.add(|| format!("zone {z}: nothing eligible, next in chain"))
                    }
                    _ => {}
                }
            }
            if explain {
                d.chain = walk.chain.iter().map(|z| (*z).to_owned()).collect();
            }
            found
        } else {
            notes.add(|| "no zone has a route: unrestricted (edges first, then ingest)".into());
            // Edges first; ingest nodes only when no edge is eligible.
            let mut found = None;
            for (tier, names) in [("edges", &self.edges), ("ingest", &self.ingest)] {
                let (w, list) = self.pick(names, stream, health, client, &mut notes, ("", tier));
                if explain {
                    d.zones.push(ZoneListing {
                        zone: tier.into(),
                        nodes: list,
                    });
                }
                if let Some(w) = w {
                    found = Some((w, None));
                    break;
                }
            }
            found
        };
        match winner {
            Some((node, zone)) => {
                let n = &self.table.nodes[node];
                d.status = 302;
                match &n.public_url {
                    Some(url) => {
                        d.mode = Some(Mode::Redirect);
                        d.location = Some(join_location(url, stream));
                        notes.add(|| format!("chose {node}: redirect to its payload URL"));
                    }
                    None => {
                        d.mode = Some(Mode::Proxy);
                        notes.add(|| format!("chose {node}: no payload URL, the router proxies"));
                    }
                }
                d.node = Some(node.to_owned());
                d.zone = zone.map(str::to_owned);
            }
            None => {
                d.status = 503;
                notes.add(|| format!("nothing eligible: 503, Retry-After {RETRY_AFTER_SECS}"));
            }
        }
        d.reasons = notes.list;
        d
    }

    /// The edges geo routing may choose: edge role, a location, an
    /// address (the router proxies to the first), not drained, online and
    /// serving (by name); why the others are not.
    fn geo_candidates(&self, health: &Health, reasons: &mut Vec<String>) -> Vec<(&str, Location)> {
        let mut out = Vec::new();
        for (name, node) in &self.table.nodes {
            if !has_role(node, "edge") {
                continue;
            }
            let Some(loc) = node.location else { continue };
            if node.addresses.first().is_none_or(String::is_empty) {
                reasons.push(format!(
                    "{name} excluded: no address (the router has nowhere to send it)"
                ));
                continue;
            }
            if node.drain {
                reasons.push(format!("{name} excluded: drained"));
                continue;
            }
            match health.nodes.get(name) {
                Some(h) if h.up() => {}
                Some(h) if h.online == Some(true) => {
                    reasons.push(format!("{name} excluded: not serving"));
                    continue;
                }
                _ => {
                    reasons.push(format!("{name} excluded: not online"));
                    continue;
                }
            }
            out.push((name.as_str(), loc));
        }
        out
    }

    /// Geo routing of an ACME HTTP-01 challenge (`GET`/`HEAD` whose
    /// request URI starts with `/.well-known/acme-challenge/`) from a
    /// client GeoIP has no location for (a CA's validation address often
    /// has none): instead of 503, the online edge of highest rendezvous
    /// hash of the request's host (nginx's `$host`: lower-case, no port)
    /// — deterministic (the control plane and `route --geo` predict it),
    /// one edge per host, and a change of health moves only the hosts of
    /// the edge that changed. `host` is as sent (normalised here).
    #[must_use]
    pub fn acme_unlocated(&self, host: &str, health: &Health) -> GeoDecision {
        let mut reasons = Vec::new();
        let candidates = self.geo_candidates(health, &mut reasons);
        let host = crate::edge::normalize_host(host);
        let chosen = candidates
            .iter()
            .map(|(n, _)| *n)
            .max_by_key(|n| (stable_hash(&[host.as_bytes(), n.as_bytes()]), *n))
            .map(str::to_owned);
        match &chosen {
            Some(n) => reasons.push(format!(
                "an ACME challenge from a client with no location: the online edge of \
                 highest rendezvous hash of the host `{host}` among {}: {n}",
                candidates.len()
            )),
            None => reasons.push("no online edge".into()),
        }
        GeoDecision {
            node: chosen,
            distance_km: None,
            tied: Vec::new(),
            reasons,
        }
    }

    /// Geo routing: the strictly nearest online edge to `client_location`;
    /// edges within `tie_km` of the nearest are tied and chosen by
    /// rendezvous hash of the client IP.
    #[must_use]
    pub fn nearest(
        &self,
        client: IpAddr,
        client_location: Location,
        health: &Health,
    ) -> GeoDecision {
        let mut reasons = Vec::new();
        let mut distances: Vec<(String, f64)> = self
            .geo_candidates(health, &mut reasons)
            .into_iter()
            .map(|(name, loc)| (name.to_owned(), haversine_km(client_location, loc)))
            .collect();
        distances.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let Some(nearest) = distances.first().map(|d| d.1) else {
            reasons.push("no online edge".into());
            return GeoDecision {
                node: None,
                distance_km: None,
                tied: Vec::new(),
                reasons,
            };
        };
        let tie = self.table.geo.tie_km;
        let tied: Vec<(String, f64)> = distances
            .iter()
            .filter(|(_, d)| *d - nearest <= tie)
            .cloned()
            .collect();
        let chosen =
            rendezvous(Some(client), tied.iter().map(|(n, _)| n.as_str())).map(str::to_owned);
        if tied.len() > 1 {
            reasons.push(format!(
                "{} edges within {tie} km of the nearest: rendezvous hash of {client}",
                tied.len()
            ));
        }
        let distance_km = chosen
            .as_ref()
            .and_then(|c| tied.iter().find(|(n, _)| n == c))
            .map(|(_, d)| *d);
        GeoDecision {
            node: chosen,
            distance_km,
            tied,
            reasons,
        }
    }
}

/// A geo decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GeoDecision {
    pub node: Option<String>,
    pub distance_km: Option<f64>,
    /// The edges tied with the nearest, with their distances.
    pub tied: Vec<(String, f64)>,
    pub reasons: Vec<String>,
}

/// A VOD placement: a copy of an asset on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub revision: u64,
}

/// Seed 002's VOD rule: among placements on nodes of the allowed zones
/// (`chain`, in order), the highest revision first, then the zone's place
/// in the chain, then the lower load. A newer forbidden replica cannot
/// exclude an older permitted one. Drained nodes are never chosen.
#[must_use]
pub fn choose_placement<'a>(
    placements: &'a [Placement],
    chain: &[String],
    nodes: &BTreeMap<String, Node>,
    health: &Health,
) -> Option<&'a Placement> {
    choose_placement_in(placements, Some(chain), nodes, health)
}

/// [`choose_placement`]; `chain` `None` is unrestricted routing (no zone
/// has a route): every node is allowed, all at the same rank, so the
/// highest revision, then the load, decide.
#[must_use]
pub fn choose_placement_in<'a>(
    placements: &'a [Placement],
    chain: Option<&[String]>,
    nodes: &BTreeMap<String, Node>,
    health: &Health,
) -> Option<&'a Placement> {
    placements
        .iter()
        .filter_map(|p| {
            let node = nodes.get(&p.node).filter(|n| !n.drain)?;
            let rank = match chain {
                None => 0,
                Some(chain) => {
                    let zone = node.zone.as_ref()?;
                    chain.iter().position(|z| z == zone)?
                }
            };
            let load = health
                .nodes
                .get(&p.node)
                .and_then(|h| h.play_sessions)
                .unwrap_or(u64::MAX);
            Some((p, rank, load))
        })
        .min_by(|a, b| {
            b.0.revision
                .cmp(&a.0.revision)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(a.0.node.cmp(&b.0.node))
        })
        .map(|(p, _, _)| p)
}

/// One replica of a VOD asset as a decision lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VodReplica {
    pub node: String,
    pub zone: Option<String>,
    /// The highest revision the node holds.
    pub revision: u64,
    pub play_sessions: Option<u64>,
    /// Whether it could be chosen (online, allowed zone, not drained).
    pub eligible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A VOD placement decision (`GET /vod/<asset>`, `edgeform route --vod`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VodDecision {
    /// 302 (a replica chosen), 403 (restricted, no zone for the client),
    /// 404 (no node reports the asset), 503 (replicas, none allowed or
    /// available).
    pub status: u16,
    pub node: Option<String>,
    pub revision: Option<u64>,
    pub zone: Option<String>,
    /// Allowed zones in order (empty when unrestricted).
    pub chain: Vec<String>,
    pub location: Option<String>,
    pub mode: Option<Mode>,
    pub client_ip: Option<String>,
    pub reasons: Vec<String>,
    /// Every replica, the chosen order first (eligible, revision, zone
    /// rank, load).
    pub replicas: Vec<VodReplica>,
}

/// Why a node is over its placement budget (`network_bandwidth_kbit`,
/// receive + transmit; `None` unlimited, `0` never chosen), like the
/// playback limits: a missing measure excludes a limited node.
fn placement_budget(limit: Option<u64>, net_kbit: Option<u64>) -> Option<String> {
    match (limit, net_kbit) {
        (Some(0), _) => Some("network_bandwidth_kbit is 0".into()),
        (Some(_), None) => Some("net_kbit missing (needed for network_bandwidth_kbit)".into()),
        (Some(l), Some(n)) if n >= l => {
            Some(format!("at placement budget ({n} >= {l} kbit/s RX+TX)"))
        }
        _ => None,
    }
}

impl Router {
    /// Where a viewer gets VOD `asset` (the CDN-zones VOD rule): replicas are the
    /// revisions nodes report holding; only online, undrained nodes of the
    /// allowed zones (the client's zone chain, or every node when routing
    /// is unrestricted) are available; then [`choose_placement_in`].
    #[must_use]
    pub fn vod(
        &self,
        peer: Option<IpAddr>,
        xff: Option<&str>,
        asset: &str,
        health: &Health,
    ) -> VodDecision {
        let mut notes = Notes {
            on: true,
            list: Vec::new(),
        };
        let client = peer.map(|p| self.client(p, xff, &mut notes));
        let mut d = VodDecision {
            status: 503,
            node: None,
            revision: None,
            zone: None,
            chain: Vec::new(),
            location: None,
            mode: None,
            client_ip: client.map(|c| c.to_string()),
            reasons: Vec::new(),
            replicas: Vec::new(),
        };
        // Every replica: the highest revision each node reports.
        let held: Vec<(&str, u64)> = health
            .nodes
            .iter()
            .filter_map(|(name, h)| {
                let revs = h.vod.as_ref()?.get(asset)?;
                revs.iter().max().map(|r| (name.as_str(), *r))
            })
            .collect();
        if held.is_empty() {
            notes.add(|| format!("no node reports VOD asset {asset}"));
            d.status = 404;
            d.reasons = notes.list;
            return d;
        }
        let chain: Option<Vec<String>> = if self.restricted {
            let Some(zone) = client.and_then(|c| self.zone_of(c)) else {
                notes.add(|| match client {
                    Some(c) => {
                        format!("routing is restricted and no zone route contains {c}: refused")
                    }
                    None => "routing is restricted and there is no client IP: refused".into(),
                });
                d.status = 403;
                d.reasons = notes.list;
                return d;
            };
            notes.add(|| {
                format!(
                    "{} matches zone {zone} (longest prefix)",
                    client.map_or_else(String::new, |c| c.to_string())
                )
            });
            Some(
                self.chain_of(zone, &mut notes)
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            )
        } else {
            notes.add(|| "no zone has a route: unrestricted (every node allowed)".into());
            None
        };
        let mut placements = Vec::new();
        for (name, revision) in &held {
            let node = self.table.nodes.get(*name);
            let zone = node.and_then(|n| n.zone.clone());
            let h = &health.nodes[*name];
            let rank = match (&chain, &zone) {
                (None, _) => Some(0),
                (Some(c), Some(z)) => c.iter().position(|x| x == z),
                (Some(_), None) => None,
            };
            let reason = if node.is_none() {
                Some("not in the routing table".to_owned())
            } else if node.is_some_and(|n| n.drain) {
                Some("drained".to_owned())
            } else if h.online != Some(true) {
                Some("offline".to_owned())
            } else if h.serving == Some(false) {
                Some("not serving".to_owned())
            } else if let Some(why) =
                node.and_then(|n| placement_budget(n.network_bandwidth_kbit, h.net_kbit))
            {
                Some(why)
            } else if rank.is_none() {
                Some(match &zone {
                    Some(z) => format!("zone {z} is not allowed for this client"),
                    None => "unzoned: not allowed while routing is restricted".to_owned(),
                })
            } else {
                None
            };
            if let Some(r) = &reason {
                notes.add(|| format!("{name} (revision {revision}) excluded: {r}"));
            } else {
                placements.push(Placement {
                    node: (*name).to_owned(),
                    revision: *revision,
                });
            }
            d.replicas.push(VodReplica {
                node: (*name).to_owned(),
                zone,
                revision: *revision,
                play_sessions: h.play_sessions,
                eligible: reason.is_none(),
                reason,
            });
        }
        let rank_of = |r: &VodReplica| match (&chain, &r.zone) {
            (None, _) => 0,
            (Some(c), Some(z)) => c.iter().position(|x| x == z).unwrap_or(usize::MAX),
            (Some(_), None) => usize::MAX,
        };
        d.replicas.sort_by(|a, b| {
            (!a.eligible)
                .cmp(&!b.eligible)
                .then(b.revision.cmp(&a.revision))
                .then(rank_of(a).cmp(&rank_of(b)))
                .then(
                    a.play_sessions
                        .unwrap_or(u64::MAX)
                        .cmp(&b.play_sessions.unwrap_or(u64::MAX)),
                )
                .then(a.node.cmp(&b.node))
        });
        d.chain = chain.clone().unwrap_or_default();
        let chosen = choose_placement_in(&placements, chain.as_deref(), &self.table.nodes, health);
        match chosen {
            Some(p) => {
                let n = &self.table.nodes[&p.node];
                d.status = 302;
                d.node = Some(p.node.clone());
                d.revision = Some(p.revision);
                d.zone.clone_from(&n.zone);
                notes.add(|| {
                    format!(
                        "chose {} (revision {}): highest available revision, then zone order, then load",
                        p.node, p.revision
                    )
                });
                match &n.public_url {
                    Some(url) => {
                        d.mode = Some(Mode::Redirect);
                        d.location = Some(join_location(url, asset));
                    }
                    None => d.mode = Some(Mode::Proxy),
                }
            }
            None => {
                notes.add(|| {
                    format!("no available replica of {asset}: 503, Retry-After {RETRY_AFTER_SECS}")
                });
            }
        }
        d.reasons = notes.list;
        d
    }
}

#[cfg(test)]
mod tests;

/// The `X-Forwarded-For` lines of one request as one list, in order
/// (RFC 9110 §5.3), joined exactly as nginx 1.22 joins them in
/// `$http_x_forwarded_for`: `", "` between lines. `None` without any line.
/// Bytes that are not UTF-8 become U+FFFD (never part of an address, never
/// a comma): they make only the entry they are in malformed, as on the
/// edge, where the Lua reads the raw bytes.
#[must_use]
pub fn join_xff<'a>(lines: impl IntoIterator<Item = &'a [u8]>) -> Option<String> {
    let mut out: Option<String> = None;
    for line in lines {
        let text = String::from_utf8_lossy(line);
        match &mut out {
            Some(o) => {
                o.push_str(", ");
                o.push_str(&text);
            }
            None => out = Some(text.into_owned()),
        }
    }
    out
}

/// The last entry of a (joined) `X-Forwarded-For` value: what follows the
/// last `,`, with spaces and horizontal tabs (RFC 9110's `OWS`) trimmed at
/// both ends — and nothing else: any other character, Unicode whitespace
/// such as U+00A0 included, stays and makes the entry malformed. The edge's
/// Lua (`cdn_router.lua`), the geo router's and this crate trim alike.
#[must_use]
pub fn xff_last(header: &str) -> &str {
    header
        .rsplit(',')
        .next()
        .unwrap_or_default()
        .trim_matches([' ', '\t'])
}

/// `segment` percent-encoded for one URL path segment: everything but
/// RFC 3986's unreserved characters (so `/`, `?`, `#`, `%`, spaces,
/// CR/LF and non-ASCII cannot change the URL or the header).
#[must_use]
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    push_encoded(&mut out, segment);
    out
}

/// [`encode_segment`], appended to `out`. A whole segment `.` or `..` is
/// encoded too (`%2E`, `%2E%2E`): left as is, it would move the URL up a
/// folder once resolved.
fn push_encoded(out: &mut String, segment: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    if segment == "." || segment == ".." {
        for _ in 0..segment.len() {
            out.push_str("%2E");
        }
        return;
    }
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
}

/// A redirect target: the payload URL (without its trailing `/`), `/`,
/// and the stream as one encoded segment.
fn join_location(url: &str, stream: &str) -> String {
    let base = url.trim_end_matches('/');
    let mut out = String::with_capacity(base.len() + 1 + stream.len() * 3);
    out.push_str(base);
    out.push('/');
    push_encoded(&mut out, stream);
    out
}

#[cfg(test)]
mod hostile_tests {
    use super::*;

    #[test]
    fn a_dot_segment_stays_one_segment_in_a_location() {
        assert_eq!(
            join_location("https://a.example.net/live", ".."),
            "https://a.example.net/live/%2E%2E"
        );
        assert_eq!(
            join_location("https://a.example.net/live/", "."),
            "https://a.example.net/live/%2E"
        );
        assert_eq!(encode_segment("..."), "...");
        assert_eq!(encode_segment("a..b"), "a..b");
        assert_eq!(encode_segment("../x"), "..%2Fx");
    }

    #[test]
    fn xff_lines_join_in_order() {
        let lines: [&[u8]; 2] = [b"192.0.2.66", b"198.51.100.9"];
        assert_eq!(join_xff(lines).as_deref(), Some("192.0.2.66, 198.51.100.9"));
        assert_eq!(join_xff(std::iter::empty()), None);
        // Bytes that are not text spoil only their own entry.
        let bad: [&[u8]; 2] = [b"\xff, 1.2.3.4", b"5.6.7.8"];
        assert_eq!(join_xff(bad).as_deref(), Some("\u{fffd}, 1.2.3.4, 5.6.7.8"));
        let bad_last: [&[u8]; 2] = [b"1.2.3.4", b"5.6.7.8\xff"];
        assert_eq!(xff_last(&join_xff(bad_last).unwrap()), "5.6.7.8\u{fffd}");
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(encode_segment("cam-1_a.b~"), "cam-1_a.b~");
        assert_eq!(encode_segment("a b/c?d#e%"), "a%20b%2Fc%3Fd%23e%25");
        assert_eq!(
            encode_segment("x\r\nSet-Cookie: y"),
            "x%0D%0ASet-Cookie%3A%20y"
        );
        assert_eq!(encode_segment("é"), "%C3%A9");
    }
}
