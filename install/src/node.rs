//! Every node's bundle from the checked repository, the gates over them
//! (what `check` and `install` run before anything is uploaded) and
//! `build`'s bundles on disk (docs/install.md).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use compiler::workspace;

use crate::gate::{self, Gate, GateNode};
use crate::{Bundle, Install, Instance, MANIFEST, Roles};

/// A node with a bundle.
pub struct NodeBundle {
    pub name: String,
    pub yaml: Value,
    pub roles: Vec<String>,
    pub install: Option<Install>,
    pub live: Instance,
    pub candidate: Instance,
    pub bundle: Bundle,
}

/// Every node's bundle (nodes whose roles have no folder have none).
///
/// # Errors
/// Every role-folder and template problem.
pub fn node_bundles(
    checked: &workspace::Checked,
    roles: &Roles,
) -> Result<Vec<NodeBundle>, Vec<crate::Error>> {
    let Some(config) = &checked.config else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for node in &config.nodes {
        let Some(text) = checked
            .repo
            .sources
            .iter()
            .find(|s| *s.path == *node.file)
            .and_then(|s| s.text.as_ref().ok())
        else {
            continue;
        };
        let Ok(Some(tree)) = yamlspan::parse(text) else {
            continue;
        };
        let yaml = tree.to_json();
        // Only nodes the installer manages (an `install` block) get a bundle.
        let Some(install) = yaml
            .get("install")
            .and_then(|i| serde_json::from_value::<Install>(i.clone()).ok())
        else {
            continue;
        };
        let install = Some(install);
        let (live, candidate) = Instance::pair(install.as_ref());
        let (live, candidate) = (live.with_https(&yaml), candidate.with_https(&yaml));
        let node_roles: Vec<String> = node.roles.iter().map(|r| r.as_str().to_owned()).collect();
        match crate::bundle(&node.name, &yaml, &node_roles, roles, &live, &candidate) {
            Ok(Some(b)) => out.push(NodeBundle {
                name: node.name.clone(),
                yaml,
                roles: node_roles,
                install,
                live,
                candidate,
                bundle: b,
            }),
            Ok(None) => {}
            Err(es) => errors.extend(es),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Read `roles/` and build every bundle; print the problems.
///
/// # Errors
/// I/O. `Ok(None)`: problems, printed.
pub fn load_bundles(checked: &workspace::Checked) -> Result<Option<(Roles, Vec<NodeBundle>)>> {
    if checked.rev.is_some() {
        if checked.root.join("roles").is_dir() {
            eprintln!(
                "note: roles/ (bundles) are read from the working tree only; not checked with --rev"
            );
        }
        return Ok(Some((Roles::default(), Vec::new())));
    }
    let roles = match crate::load::read_roles(&checked.root) {
        Ok(r) => r,
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            return Ok(None);
        }
    };
    match node_bundles(checked, &roles) {
        Ok(b) => Ok(Some((roles, b))),
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            Ok(None)
        }
    }
}

/// Run the gates over the bundles; print problems and skips. `true`: passed.
#[must_use]
pub fn run_gates(roles: &Roles, bundles: &[NodeBundle], skip: &BTreeSet<Gate>) -> bool {
    if bundles.is_empty() {
        return true;
    }
    let nodes: Vec<GateNode<'_>> = bundles
        .iter()
        .map(|b| GateNode {
            name: &b.name,
            yaml: &b.yaml,
            roles: b.roles.clone(),
            live: b.live.clone(),
            bundle: &b.bundle,
        })
        .collect();
    let outcome = gate::run(&nodes, roles, skip);
    for s in &outcome.skipped {
        eprintln!("warning: {s}");
    }
    for p in &outcome.problems {
        eprintln!("error: {p}");
    }
    let ran: Vec<String> = outcome
        .ran
        .iter()
        .map(|(g, n)| format!("{} {n}", g.as_str()))
        .collect();
    let sandbox = outcome
        .sandbox
        .as_ref()
        .map_or_else(String::new, |s| format!(" (nginx -t sandboxed: {s})"));
    eprintln!(
        "bundles: {} node(s); gates ran: {}{sandbox}; {} problem(s)",
        bundles.len(),
        if ran.is_empty() {
            "none".into()
        } else {
            ran.join(", ")
        },
        outcome.problems.len()
    );
    outcome.problems.is_empty()
}

/// `build`: `<out>/bundles/<node>/…` and `manifest.json` per node.
///
/// # Errors
/// I/O.
pub fn write_bundles(out: &Path, bundles: &[NodeBundle], commit: Option<&str>) -> Result<usize> {
    let dir = out.join("bundles");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    for b in bundles {
        write_release(&dir.join(&b.name), &b.bundle, commit)?;
    }
    Ok(bundles.len())
}

pub(crate) fn write_release(dir: &Path, b: &Bundle, commit: Option<&str>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for f in &b.files {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, &f.bytes).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(f.mode))?;
    }
    std::fs::create_dir_all(dir)?;
    let manifest = serde_json::to_string_pretty(&b.manifest(commit))? + "\n";
    std::fs::write(dir.join(MANIFEST), manifest)?;
    Ok(())
}
