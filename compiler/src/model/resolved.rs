//! The validated configuration: defaults applied, networks and addresses
//! parsed, references known to resolve. Built only by
//! [`crate::validate`]; read by [`crate::compile`].

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use edgestate::routing::{GeoSettings, Location};
use edgestate::site::SiteDoc;
use ipnet::IpNet;

pub use super::raw::Role;

/// A whole repository, valid.
#[derive(Debug, Clone)]
pub struct Config {
    pub cluster: Cluster,
    /// In path order.
    pub sites: Vec<Site>,
    /// In path order.
    pub zones: Vec<Zone>,
    /// In path order.
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    pub trusted_proxies: Vec<IpNet>,
    pub mqtt: Option<Mqtt>,
    pub apply: Thresholds,
    /// `apply.freeze`, in file order.
    pub freeze: Vec<FreezeWindow>,
    /// `apply.waves`, `apply.prometheus`, `apply.auto_rollback`,
    /// `apply.gate`: how a new commit rolls out.
    pub rollout: Rollout,
    pub geo: GeoSettings,
    /// `None`: no `anycast` section.
    pub anycast: Option<Anycast>,
    /// `None`: no `acme` section (no site can use `tls: {acme: true}`).
    pub acme: Option<Acme>,
}

/// `cluster.yaml` `acme`: the CA for `tls: {acme: true}` sites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acme {
    pub directory: String,
    pub contact: Vec<String>,
    pub ca_file: Option<String>,
    /// `order_timeout` in seconds ([`ACME_ORDER_TIMEOUT_DEFAULT_S`] when
    /// absent).
    pub order_timeout_s: u64,
}

/// `acme.order_timeout` when absent: ten minutes.
pub const ACME_ORDER_TIMEOUT_DEFAULT_S: u64 = 600;
/// The longest `acme.order_timeout`: a day.
pub const ACME_ORDER_TIMEOUT_MAX_S: u64 = 86_400;

/// The anycast audit's settings (`cluster.yaml` `anycast`): the audit's
/// own types, built by validation.
pub use anycast::{Prefix as AnycastPrefix, Settings as Anycast, Upstream};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mqtt {
    pub url: String,
    pub topic_prefix: String,
}

/// `apply` safety thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub max_delete_percent: u32,
    pub max_change_percent: u32,
    pub min_keys: u64,
}

impl Thresholds {
    /// The thresholds `cluster.yaml`'s `apply` block sets (defaults for
    /// what it leaves out).
    #[must_use]
    pub fn of(apply: Option<&super::raw::Apply>) -> Thresholds {
        let defaults = Thresholds::default();
        apply.map_or(defaults, |a| Thresholds {
            max_delete_percent: a.max_delete_percent.unwrap_or(defaults.max_delete_percent),
            max_change_percent: a.max_change_percent.unwrap_or(defaults.max_change_percent),
            min_keys: a.min_keys.unwrap_or(defaults.min_keys),
        })
    }

    /// Each threshold at the stricter of the two: the lower percentages,
    /// and the lower `min_keys` (the checks apply to smaller targets).
    #[must_use]
    pub fn stricter(self, other: Thresholds) -> Thresholds {
        Thresholds {
            max_delete_percent: self.max_delete_percent.min(other.max_delete_percent),
            max_change_percent: self.max_change_percent.min(other.max_change_percent),
            min_keys: self.min_keys.min(other.min_keys),
        }
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            max_delete_percent: 25,
            max_change_percent: 50,
            min_keys: 10,
        }
    }
}

/// How a new commit rolls out (`cluster.yaml` `apply`): in waves, with
/// the gate between them. No waves: every target at once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rollout {
    /// In order; empty: no rollout, every target at once.
    pub waves: Vec<Wave>,
    /// Roll the applied waves back when the gate halts.
    pub auto_rollback: bool,
    /// The gate between waves.
    pub gate: GateConfig,
}

/// One wave: what it selects and how long it bakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    pub name: String,
    pub nodes: Vec<String>,
    pub regions: Vec<String>,
    pub roles: Vec<Role>,
    /// Seconds.
    pub bake_s: u64,
}

impl Wave {
    /// A wave without selectors: every target no earlier wave selected.
    #[must_use]
    pub fn is_rest(&self) -> bool {
        self.nodes.is_empty() && self.regions.is_empty() && self.roles.is_empty()
    }

    /// Whether this wave's selectors pick `node` (the rest wave picks
    /// every node; earlier waves come first, see [`Rollout::assign`]).
    #[must_use]
    pub fn selects(&self, node: &Node) -> bool {
        self.is_rest()
            || self.nodes.contains(&node.name)
            || self.regions.contains(&node.region)
            || self.roles.iter().any(|r| node.has(*r))
    }
}

/// The longest bake time of a wave: seven days.
pub const WAVE_BAKE_MAX_S: u64 = 7 * 86_400;

impl Rollout {
    /// Pure: which wave each target (a node with a `redis` block) is in,
    /// the first wave that selects it; `None` for a target no wave
    /// selects (it is left out of the rollout: `check` refuses waves that
    /// leave a target out only when the last wave is not `rest`, so such
    /// a target is never moved by a rollout — see docs/operations.md).
    /// One list per wave, node names in `nodes` order.
    #[must_use]
    pub fn assign<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); self.waves.len()];
        for node in nodes.into_iter().filter(|n| n.redis.is_some()) {
            if let Some(i) = self.waves.iter().position(|w| w.selects(node)) {
                out[i].push(node.name.clone());
            }
        }
        out
    }

    /// The wave index of `node` ([`Self::assign`]'s rule).
    #[must_use]
    pub fn wave_of(&self, node: &Node) -> Option<usize> {
        node.redis.as_ref()?;
        self.waves.iter().position(|w| w.selects(node))
    }
}

/// The gate's settings (`apply.prometheus`, `apply.gate`), defaults
/// filled in; consumed by `control::rollout::gate::judge`.
#[derive(Debug, Clone, PartialEq)]
pub struct GateConfig {
    /// `None`: no gate source, a wave passes on its bake time alone.
    pub prometheus: Option<String>,
    /// Default [`GATE_MIN_REQUESTS`].
    pub min_requests: u64,
    /// Default [`GATE_MAX_5XX_RATIO_INCREASE`].
    pub max_5xx_ratio_increase: f64,
    /// Default [`GATE_MAX_REFUSAL_RATIO_INCREASE`].
    pub max_refusal_ratio_increase: f64,
    /// Default [`GATE_MAX_HIT_RATIO_DROP`].
    pub max_hit_ratio_drop: f64,
}

/// A site's own gate thresholds (`rollout:` in its file): each `None`
/// takes the cluster's [`GateConfig`] value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SiteGate {
    pub min_requests: Option<u64>,
    pub max_5xx_ratio_increase: Option<f64>,
    pub max_refusal_ratio_increase: Option<f64>,
    pub max_hit_ratio_drop: Option<f64>,
}

impl GateConfig {
    /// These thresholds with `site`'s override on top.
    #[must_use]
    pub fn for_site(&self, site: Option<&SiteGate>) -> GateConfig {
        let Some(o) = site else {
            return self.clone();
        };
        GateConfig {
            prometheus: self.prometheus.clone(),
            min_requests: o.min_requests.unwrap_or(self.min_requests),
            max_5xx_ratio_increase: o
                .max_5xx_ratio_increase
                .unwrap_or(self.max_5xx_ratio_increase),
            max_refusal_ratio_increase: o
                .max_refusal_ratio_increase
                .unwrap_or(self.max_refusal_ratio_increase),
            max_hit_ratio_drop: o.max_hit_ratio_drop.unwrap_or(self.max_hit_ratio_drop),
        }
    }
}

/// `apply.gate.min_requests` when absent.
pub const GATE_MIN_REQUESTS: u64 = 200;
/// `apply.gate.max_5xx_ratio_increase` when absent.
pub const GATE_MAX_5XX_RATIO_INCREASE: f64 = 0.02;
/// `apply.gate.max_refusal_ratio_increase` when absent.
pub const GATE_MAX_REFUSAL_RATIO_INCREASE: f64 = 0.05;
/// `apply.gate.max_hit_ratio_drop` when absent.
pub const GATE_MAX_HIT_RATIO_DROP: f64 = 0.2;

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            prometheus: None,
            min_requests: GATE_MIN_REQUESTS,
            max_5xx_ratio_increase: GATE_MAX_5XX_RATIO_INCREASE,
            max_refusal_ratio_increase: GATE_MAX_REFUSAL_RATIO_INCREASE,
            max_hit_ratio_drop: GATE_MAX_HIT_RATIO_DROP,
        }
    }
}

/// A freeze window, `[start, end)` in seconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreezeWindow {
    pub name: String,
    pub start: u64,
    pub end: u64,
    pub reason: Option<String>,
}

impl FreezeWindow {
    /// The first window of `windows` open at `now` (pure).
    #[must_use]
    pub fn open_at(windows: &[FreezeWindow], now: u64) -> Option<&FreezeWindow> {
        windows.iter().find(|w| w.start <= now && now < w.end)
    }

    /// The first window of `windows` open at any of `instants` (pure);
    /// see [`crate::clock::freeze_instants`].
    #[must_use]
    pub fn open_at_any<'a>(
        windows: &'a [FreezeWindow],
        instants: &[u64],
    ) -> Option<&'a FreezeWindow> {
        instants.iter().find_map(|&t| Self::open_at(windows, t))
    }
}

/// A site with its compiled document.
#[derive(Debug, Clone)]
pub struct Site {
    pub file: Arc<str>,
    pub host: String,
    pub aliases: Vec<String>,
    pub suspended: bool,
    /// `None`: every region. As written in the file (in its order, so
    /// `regions[i]` locates the i-th name); a list, not a `BTreeSet`,
    /// whose node would cost ~300 bytes per site even for one region
    /// (at 1,000,000 sites). Membership is all that is asked of it.
    pub regions: Option<Box<[String]>>,
    /// How its hostnames get a certificate (`None`: plain HTTP only).
    pub tls: Option<Tls>,
    /// Its own gate thresholds (`rollout:`), `None` for most sites.
    pub rollout: Option<Box<SiteGate>>,
    /// The canonical JSON of the document (shared by host and aliases).
    pub doc: SiteDoc,
}

impl Site {
    /// The host, then each alias.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.host.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// How a site's hostnames get a certificate (`tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tls {
    /// An operator-provided certificate, by its name in the state
    /// directory (`edgeform certs import NAME`).
    Certificate(String),
    /// A certificate from the cluster's ACME CA (`tls: {acme: true}`),
    /// issued by `edgeform certs issue` into the state directory under
    /// this name ([`acme_certificate_name`]), covering host and aliases.
    Acme(String),
}

impl Tls {
    /// The certificate's name in the state directory, however it got there.
    #[must_use]
    pub fn certificate(&self) -> &str {
        match self {
            Tls::Certificate(name) | Tls::Acme(name) => name,
        }
    }

    /// The document's spelling (`"certificate:NAME"`: the edge serves an
    /// issued certificate like an imported one).
    #[must_use]
    pub fn doc_value(&self) -> String {
        format!("certificate:{}", self.certificate())
    }
}

/// The state directory's name for the certificate of an ACME site whose
/// host is `host`: `acme.<host>` (valid as a certificate name while the
/// host is at most 59 bytes; longer ones are refused by `check`).
#[must_use]
pub fn acme_certificate_name(host: &str) -> String {
    format!("acme.{host}")
}

/// The edge-wide ceiling of `max_body_size` (1 GiB).
pub const MAX_BODY_CEILING: u64 = 1 << 30;
/// The edge's body size limit when a site sets none (100 MiB).
pub const DEFAULT_BODY_SIZE: u64 = 100 << 20;

#[derive(Debug, Clone)]
pub struct Zone {
    pub file: Arc<str>,
    pub name: String,
    pub routes: Vec<IpNet>,
    pub fallback: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub file: Arc<str>,
    pub name: String,
    pub roles: BTreeSet<Role>,
    pub region: String,
    pub zone: Option<String>,
    pub public_url: Option<String>,
    pub location: Option<Location>,
    pub addresses: Vec<IpAddr>,
    pub redis: Option<RedisTarget>,
    pub playback_session_limit: Option<u64>,
    pub playback_bandwidth_kbit: Option<u64>,
    pub network_bandwidth_kbit: Option<u64>,
    /// Excluded from new routing decisions, kept in the config.
    pub drain: bool,
    pub cache: CacheSettings,
    /// The edge's HTTPS listeners.
    pub https: HttpsListen,
}

/// An edge's HTTPS listeners (`https:` of its YAML, defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpsListen {
    /// Direct viewers (nginx `listen`, default `443`).
    pub listen: String,
    /// The routers' PROXY-protocol listener (default `10443`).
    pub proxy_listen: String,
    /// `proxy_listen`'s port: where the routers' 443 pool connects.
    pub proxy_port: u16,
}

/// The default direct HTTPS listener of an edge.
pub const HTTPS_LISTEN: &str = "443";
/// The default PROXY-protocol listener of an edge (the routers' pool).
pub const PROXY_LISTEN: &str = "10443";

impl Default for HttpsListen {
    fn default() -> Self {
        HttpsListen {
            listen: HTTPS_LISTEN.into(),
            proxy_listen: PROXY_LISTEN.into(),
            proxy_port: 10443,
        }
    }
}

/// The port of an nginx `listen` address `[host:]port` (`[v6]:port`);
/// `None` when it has none.
#[must_use]
pub fn listen_port(listen: &str) -> Option<u16> {
    let port = match listen.rsplit_once(':') {
        Some((host, p)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => p,
        Some(_) => return None,
        None => listen,
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse::<u16>().ok().filter(|p| *p > 0)
}

impl Node {
    #[must_use]
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// Where this node's Redis is, for messages.
    #[must_use]
    pub fn redis_at(&self) -> String {
        self.redis
            .as_ref()
            .map_or_else(|| "no redis".into(), edgestate::target::describe)
    }
}

pub use edgestate::target::RedisTarget;

/// The nginx cache the purge worker cleans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    pub dirs: Vec<String>,
    pub levels: String,
    pub key: String,
}

impl Default for CacheSettings {
    /// The seed's layout.
    fn default() -> Self {
        let d = edgestate::purge::CacheDefaults::default();
        CacheSettings {
            dirs: d.dirs.iter().map(|s| (*s).to_owned()).collect(),
            levels: d.levels.into(),
            key: d.key.into(),
        }
    }
}
