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
use edgestate::site::{CacheRule, EdgeRule, SiteDoc};
use ipnet::IpNet;
use rayon::prelude::*;

use crate::country;
use crate::diagnostic::Diagnostic;
use crate::model::raw::{self, AccessMode, CacheAction, EdgeAction, MatchType, Role};
use crate::model::resolved::{
    Anycast, AnycastPrefix, CacheSettings, Cluster, Config, FreezeWindow, Mqtt, Node, RedisTarget,
    Site, Thresholds, Upstream, Zone,
};
use crate::parse::{ParsedFile, Raw};

mod cluster;
mod cross;
mod net;
mod node;
mod site;
mod urls;
mod zone;

pub use edgestate::parse_duration_ms;

use self::cluster::*;
use self::cross::*;
use self::net::*;
use self::node::*;
use self::site::*;
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

/// Validate every parsed file together. `raws[i]` is the typed content of
/// `files[i]` (when its shape allowed one); each is dropped as soon as its
/// resolved value is built, so a large repository never holds both whole.
#[must_use]
pub fn validate(
    files: &[ParsedFile<'_>],
    mut raws: Vec<Option<Raw>>,
) -> (Option<Config>, Vec<Diagnostic>) {
    assert_eq!(files.len(), raws.len(), "one typed value slot per file");
    let mut diagnostics: Vec<Diagnostic> = files
        .iter()
        .flat_map(|f| f.diagnostics.iter().cloned())
        .collect();

    // The few non-site files first (taken out, so what is left is sites).
    let mut cluster_raw = None;
    let mut zone_raws = Vec::new();
    let mut node_raws = Vec::new();
    for (i, slot) in raws.iter_mut().enumerate() {
        match slot {
            Some(Raw::Cluster(_)) if cluster_raw.is_none() => {
                cluster_raw = slot.take().map(|r| (i, r))
            }
            Some(Raw::Zone(_)) => zone_raws.extend(slot.take().map(|r| (i, r))),
            Some(Raw::Node(_)) => node_raws.extend(slot.take().map(|r| (i, r))),
            _ => {}
        }
    }

    // Per-file rules (sites in parallel: there may be 1,000,000 of them).
    let cluster = match &cluster_raw {
        Some((i, Raw::Cluster(raw))) => per_file(&files[*i], raw, cluster, &mut diagnostics).0,
        _ => cluster_defaults(),
    };
    let sites: Vec<(Site, Vec<Diagnostic>, &ParsedFile)> = raws
        .into_par_iter()
        .zip(files.par_iter())
        .filter_map(|(raw, f)| match raw {
            Some(Raw::Site(raw)) => {
                let mut ctx = Ctx::new(f);
                // `raw` is dropped here, in the worker.
                Some((site(&mut ctx, &raw), ctx.out, f))
            }
            _ => None,
        })
        .collect();
    let sites: Vec<(Site, &ParsedFile)> = sites
        .into_iter()
        .map(|(s, mut d, f)| {
            diagnostics.append(&mut d);
            (s, f)
        })
        .collect();
    let zones: Vec<(Zone, &ParsedFile)> = zone_raws
        .iter()
        .filter_map(|(i, r)| match r {
            Raw::Zone(raw) => Some(per_file(&files[*i], raw, zone, &mut diagnostics)),
            _ => None,
        })
        .collect();
    let nodes: Vec<(Node, &ParsedFile)> = node_raws
        .iter()
        .filter_map(|(i, r)| match r {
            Raw::Node(raw) => Some(per_file(&files[*i], raw, node, &mut diagnostics)),
            _ => None,
        })
        .collect();

    // Cross-file rules. Files with per-file errors take part too, so one
    // run reports a duplicate host even in a file with a bad origin.
    unique_hosts(&sites, &mut diagnostics);
    let zone_names = unique_zones(&zones, &mut diagnostics);
    unique_nodes(&nodes, &mut diagnostics);
    references(&sites, &zones, &nodes, &zone_names, &mut diagnostics);
    routes(&zones, &nodes, &mut diagnostics);

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
