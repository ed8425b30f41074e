//! edgeform's compiler: validate a config repository, compile it into what
//! every edge holds in its own Redis, and diff two compilations.
//!
//! # Layout
//! - [`load`]: the only reader of files and git (working tree or `--rev`).
//! - `yamlspan` (crate): a spanned YAML tree, so every diagnostic has a position.
//! - [`parse`]: per file, YAML → JSON Schema ([`schema`]) → [`model::raw`].
//! - [`validate`]: the semantic rules → [`model::resolved::Config`];
//!   [`rule_regex`]: the regex subset rules may use (PCRE on the edge).
//! - [`compile`]: `Config` → per-target Redis key/values and router
//!   nginx snippets. Deterministic.
//! - [`tls`]: certificates handed in as data: `check`'s rules and the
//!   `tls:<host>` documents.
//! - [`diff`]: two compilations → per-target added/changed/removed keys.
//! - [`report`]: rendering diagnostics and diffs (human, json, github,
//!   markdown).
//! - [`fmt`]: canonical YAML of config files (`edgeform fmt`, `import`).
//! - [`import`]: site documents read from an edge → `sites/*.yaml`.
//! - `anycast` (crate): the anycast audit; [`validate`] builds its settings
//!   from `cluster.yaml`, the `edgeform` binary wires it.
//! - [`workspace`]: the one loader: load → check → commit → compile, each
//!   step separate; every subcommand stops at the step it needs.
//!
//! Everything but `load` (and the CLI's writing of results) is pure.

pub mod clock;
pub mod compile;
pub mod country;
pub mod diagnostic;
pub mod diff;
pub mod files;
pub mod fmt;
pub mod import;
pub mod load;
pub mod model;
pub mod parse;
pub mod report;
pub mod rule_regex;
pub mod schema;
#[cfg(test)]
mod testkit;
pub mod tls;
pub mod validate;
pub mod workspace;

use rayon::prelude::*;

pub use diagnostic::{Diagnostic, Severity};
pub use model::resolved::Config;

/// The outcome of checking a repository.
#[derive(Debug)]
pub struct Checked {
    /// Present exactly when there is no error.
    pub config: Option<Config>,
    /// Errors and warnings, sorted by file and position.
    pub diagnostics: Vec<Diagnostic>,
}

impl Checked {
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.config.is_some()
    }
}

/// Parse and validate a loaded repository. Pure; files are parsed in
/// parallel.
#[must_use]
pub fn check(repo: &load::Repo) -> Checked {
    // No file keeps its spanned tree (a file with a problem parses again
    // to locate it) and a site's raw value is dropped as soon as its
    // per-file rules have resolved it, in the same worker, so what stays
    // is the text and the resolved config.
    let (files, early): (Vec<parse::ParsedFile>, Vec<validate::Early>) =
        tracing::info_span!("parse").in_scope(|| {
            repo.sources
                .par_iter()
                .map(|source| {
                    let (file, raw) = parse::parse_typed(source);
                    let early = validate::early(&file, raw);
                    (file, early)
                })
                .unzip()
        });
    let (config, diagnostics) =
        tracing::info_span!("validate").in_scope(|| validate::validate(&files, early));
    Checked {
        config,
        diagnostics,
    }
}
