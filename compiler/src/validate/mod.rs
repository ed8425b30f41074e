//! Semantic validation: every rule the schemas cannot express, one file
//! per subject (`site`, `node`, `zone`, `cluster`, `cross`-file), with
//! the shared helpers (`net`: CIDR lists, `urls`: URLs as written).
//!
//! Input: the per-file results of [`crate::parse`]. Output: the resolved
//! [`Config`] when there is no error, and every diagnostic found (errors
//! and warnings), each located in its file. Nothing stops at the first
//! problem; a file that failed its schema is left out of the cross-file
//! rules rather than producing follow-on noise.
//!
//! Per-file rules run in parallel; cross-file rules (uniqueness,
//! references, coverage) run once over the collected names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use edgestate::routing::{Bucket, GeoSettings, Location};
use edgestate::site::{CacheRule, EdgeRule, MAX_ORIGINS, SiteDoc};
use ipnet::IpNet;

use crate::country;
use crate::diagnostic::Diagnostic;
use crate::model::raw::{self, AccessMode, CacheAction, EdgeAction, MatchType, Role};
use crate::model::resolved::{
    Acme, Anycast, AnycastPrefix, CacheSettings, Cluster, Config, FreezeWindow,
    GATE_MAX_5XX_RATIO_INCREASE, GATE_MAX_HIT_RATIO_DROP, GATE_MAX_REFUSAL_RATIO_INCREASE,
    GATE_MIN_REQUESTS, GateConfig, MAX_BODY_CEILING, Mqtt, Node, RedisTarget, Rollout, Site,
    SiteGate, Thresholds, Tls, Upstream, WAVE_BAKE_MAX_S, Wave, Zone,
};
use crate::parse::{ParsedFile, Raw};

mod cluster;
mod cross;
mod net;
mod node;
mod site;
#[cfg(test)]
mod tests;
mod urls;
mod zone;

pub use edgestate::parse_duration_ms;

use self::cluster::*;
use self::cross::*;
use self::net::*;
use self::node::*;
use self::site::*;
pub use self::site::{parse_size, valid_cert_name};
use self::urls::*;
use self::zone::*;

/// Collects the diagnostics of one file.
struct Ctx<'a> {
    file: &'a ParsedFile<'a>,
    out: Vec<Diagnostic>,
}

impl<'a> Ctx<'a> {
    fn new(file: &'a ParsedFile<'a>) -> Self {
        Ctx {
            file,
            out: Vec::new(),
        }
    }

    fn error(&mut self, code: &'static str, pointer: &str, message: String) -> &mut Diagnostic {
        let span = self.file.locate(pointer);
        self.out
            .push(Diagnostic::error(code, &self.file.path, span, message));
        self.out.last_mut().expect("just pushed")
    }

    fn warning(&mut self, code: &'static str, pointer: &str, message: String) -> &mut Diagnostic {
        let span = self.file.locate(pointer);
        self.out
            .push(Diagnostic::warning(code, &self.file.path, span, message));
        self.out.last_mut().expect("just pushed")
    }
}

/// The help of an unknown-name error (zone, region, upstream): the
/// closest known name, else `list: a, b, c`, or `none` when nothing is
/// known and it is given.
fn did_you_mean(name: &str, known: &[&str], list: &str, none: Option<&str>) -> String {
    match crate::parse::suggest(name, known.iter().copied()) {
        Some(s) => format!("did you mean `{s}`?"),
        None => match none {
            Some(none) if known.is_empty() => none.to_owned(),
            _ => format!("{list}: {}", known.join(", ")),
        },
    }
}

fn help(d: &mut Diagnostic, text: impl Into<String>) {
    d.help = Some(text.into());
}

/// A file's typed content after the rules that need that file alone. A
/// site is resolved right away (all its rules are per-file), so its raw
/// value is dropped in the worker that parsed it and the raw values of a
/// large repository are never all held at once. Cluster, zone and
/// node files wait for [`validate`].
#[derive(Debug)]
// Large on purpose: a repository is nearly all sites, and this list's
// allocation is reused in place for the sites' list.
#[allow(clippy::large_enum_variant)]
pub enum Early {
    /// No typed content (the file's shape is wrong, or it is unreadable).
    Nothing,
    /// A cluster, zone or node file (boxed: the list's slots are
    /// site-sized, and become the sites' list in place).
    Raw(Box<Raw>),
    /// The resolved site and its diagnostics (the file's index is the
    /// slot's).
    Site(Site, Vec<Diagnostic>),
}

/// The per-file rules of a file that need nothing else (see [`Early`]).
#[must_use]
pub fn early(file: &ParsedFile<'_>, raw: Option<Raw>) -> Early {
    match raw {
        Some(Raw::Site(raw)) => {
            let mut ctx = Ctx::new(file);
            let site = site(&mut ctx, &raw);
            Early::Site(site, ctx.out)
        }
        Some(other) => Early::Raw(Box::new(other)),
        None => Early::Nothing,
    }
}

/// Validate every parsed file together. `early[i]` is what [`early`] made
/// of `files[i]`.
#[must_use]
pub fn validate(
    files: &[ParsedFile<'_>],
    mut early: Vec<Early>,
) -> (Option<Config>, Vec<Diagnostic>) {
    assert_eq!(files.len(), early.len(), "one typed value slot per file");
    let mut diagnostics: Vec<Diagnostic> = files
        .iter()
        .flat_map(|f| f.diagnostics.iter().cloned())
        .collect();

    // The few non-site files are taken out first; what is left is sites.
    let mut cluster_raw = None;
    let mut zone_raws = Vec::new();
    let mut node_raws = Vec::new();
    for (i, slot) in early.iter_mut().enumerate() {
        let Early::Raw(raw) = slot else { continue };
        match **raw {
            Raw::Cluster(_) if cluster_raw.is_some() => continue,
            Raw::Site(_) => continue,
            _ => {}
        }
        let Early::Raw(raw) = std::mem::replace(slot, Early::Nothing) else {
            unreachable!("matched above")
        };
        match *raw {
            Raw::Cluster(c) => cluster_raw = Some((i, c)),
            Raw::Zone(z) => zone_raws.push((i, z)),
            Raw::Node(n) => node_raws.push((i, n)),
            Raw::Site(_) => unreachable!("skipped above"),
        }
    }

    let cluster = match &cluster_raw {
        Some((i, raw)) => per_file(&files[*i], raw, cluster, &mut diagnostics).0,
        None => cluster_defaults(),
    };
    // Sites were resolved by `early`; moved out in place (no second list).
    let sites: Vec<(Site, &ParsedFile)> = early
        .into_iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Early::Site(site, mut d) => {
                diagnostics.append(&mut d);
                Some((site, &files[i]))
            }
            _ => None,
        })
        .collect();
    let zones: Vec<(Zone, &ParsedFile)> = zone_raws
        .iter()
        .map(|(i, raw)| per_file(&files[*i], raw, zone, &mut diagnostics))
        .collect();
    let nodes: Vec<(Node, &ParsedFile)> = node_raws
        .iter()
        .map(|(i, raw)| per_file(&files[*i], raw, node, &mut diagnostics))
        .collect();

    // Cross-file rules. Files with per-file errors take part too, so one
    // run reports a duplicate host even in a file with a bad origin.
    unique_hosts(&sites, &mut diagnostics);
    let zone_names = unique_zones(&zones, &mut diagnostics);
    unique_nodes(&nodes, &mut diagnostics);
    references(&sites, &zones, &nodes, &zone_names, &mut diagnostics);
    routes(&zones, &nodes, &mut diagnostics);
    acme_sites_have_a_ca(&sites, &cluster, &mut diagnostics);
    if let Some((i, _)) = &cluster_raw {
        waves_select_targets(&files[*i], &cluster, &nodes, &mut diagnostics);
    }

    crate::diagnostic::sort(&mut diagnostics);
    let config = (!crate::diagnostic::has_errors(&diagnostics)).then(|| Config {
        cluster,
        sites: sites.into_iter().map(|(s, _)| s).collect(),
        zones: zones.into_iter().map(|(z, _)| z).collect(),
        nodes: nodes.into_iter().map(|(n, _)| n).collect(),
    });
    (config, diagnostics)
}

/// Run one per-file rule set, moving its diagnostics into `out`.
fn per_file<'a, R, T>(
    file: &'a ParsedFile<'a>,
    raw: &R,
    rule: fn(&mut Ctx<'_>, &R) -> T,
    out: &mut Vec<Diagnostic>,
) -> (T, &'a ParsedFile<'a>) {
    let mut ctx = Ctx::new(file);
    let value = rule(&mut ctx, raw);
    out.append(&mut ctx.out);
    (value, file)
}
