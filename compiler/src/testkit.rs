//! Helpers for the unit tests of the pure stages: a repository built in
//! memory from `(path, text)` pairs (no files, no git), checked by the same
//! [`crate::check`] the CLI runs, and the assertions on its diagnostics.

use std::sync::Arc;

use crate::diagnostic::{Diagnostic, Severity};
use crate::load::{Kind, Repo, Source};
use crate::{Checked, Config};

/// A repository of `files`, each `(path, text)` with its kind taken from
/// its place (`cluster.yaml`, `sites/`, `zones/`, `nodes/`), sorted by
/// path as [`crate::load`] sorts them.
pub(crate) fn repo(files: &[(&str, &str)]) -> Repo {
    let mut sources: Vec<Source> = files
        .iter()
        .map(|(path, text)| Source {
            kind: kind_of(path),
            path: Arc::from(*path),
            text: Ok((*text).to_owned()),
        })
        .collect();
    sources.sort_by(|a, b| a.path.cmp(&b.path));
    Repo {
        sources,
        commit: None,
    }
}

fn kind_of(path: &str) -> Kind {
    if path == Kind::CLUSTER_FILE {
        return Kind::Cluster;
    }
    Kind::FOLDERS
        .iter()
        .find(|(folder, _)| path.starts_with(&format!("{folder}/")))
        .map(|&(_, kind)| kind)
        .unwrap_or_else(|| panic!("`{path}` is not a config file's place"))
}

/// Parse and validate `files` as `edgeform check` does.
pub(crate) fn check(files: &[(&str, &str)]) -> Checked {
    crate::check(&repo(files))
}

/// The resolved config of `files`, which must have no error.
pub(crate) fn valid(files: &[(&str, &str)]) -> Config {
    let checked = check(files);
    let errors: Vec<String> = checked
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Error)
        .map(line)
        .collect();
    assert!(
        errors.is_empty(),
        "unexpected errors:\n{}",
        errors.join("\n")
    );
    checked.config.expect("no error, so a config")
}

/// `file:line:col severity code: message`, for assertion messages.
pub(crate) fn line(d: &Diagnostic) -> String {
    format!(
        "{} {} {}: {}",
        d.location(),
        d.severity.as_str(),
        d.code,
        d.message
    )
}

/// Every diagnostic, one [`line`] each.
pub(crate) fn lines(checked: &Checked) -> String {
    checked
        .diagnostics
        .iter()
        .map(line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one diagnostic with `code` at `location` (`file:line:col`); fails,
/// listing every diagnostic, when there is none or more than one.
pub(crate) fn find<'a>(checked: &'a Checked, code: &str, location: &str) -> &'a Diagnostic {
    let found: Vec<&Diagnostic> = checked
        .diagnostics
        .iter()
        .filter(|d| d.code == code && d.location() == location)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one `{code}` at {location}, got:\n{}",
        lines(checked)
    );
    found[0]
}

/// The error with `code` at `location`; the repository is invalid.
pub(crate) fn error<'a>(checked: &'a Checked, code: &str, location: &str) -> &'a Diagnostic {
    let d = find(checked, code, location);
    assert_eq!(d.severity, Severity::Error, "{}", line(d));
    assert!(!checked.is_valid(), "an error leaves no config");
    d
}

/// The warning with `code` at `location`.
pub(crate) fn warning<'a>(checked: &'a Checked, code: &str, location: &str) -> &'a Diagnostic {
    let d = find(checked, code, location);
    assert_eq!(d.severity, Severity::Warning, "{}", line(d));
    d
}

/// The codes found, in output order.
pub(crate) fn codes(checked: &Checked) -> Vec<&'static str> {
    checked.diagnostics.iter().map(|d| d.code).collect()
}

/// A small valid repository: one zone covering everything, one edge with
/// a Redis target in it, one site. Tests add or replace files.
pub(crate) const ZONE: (&str, &str) = (
    "zones/all.yaml",
    "name: all\nroutes: [0.0.0.0/0, \"::/0\"]\n",
);
pub(crate) const EDGE: (&str, &str) = (
    "nodes/edge-1.yaml",
    "name: edge-1\nroles: [edge]\nregion: eu\nzone: all\nlocation: {lat: 52.37, lon: 4.9}\naddresses: [198.51.100.11]\nredis: {url: redis://10.0.0.5:6379}\n",
);
pub(crate) const SITE: (&str, &str) = (
    "sites/a.example.com.yaml",
    "host: a.example.com\norigin: http://203.0.113.10\n",
);

/// [`ZONE`], [`EDGE`], [`SITE`] and `more`; a file of `more` at a path
/// already there replaces it.
pub(crate) fn with<'a>(more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut files: Vec<(&'a str, &'a str)> = [ZONE, EDGE, SITE]
        .into_iter()
        .filter(|(p, _)| more.iter().all(|(q, _)| q != p))
        .collect();
    files.extend_from_slice(more);
    files
}
