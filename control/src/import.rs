//! `edgeform import`: an edge's live sites (its Redis) as site files that
//! check clean and compile back to exactly what the edge holds.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use compiler::files::write_atomic;
use compiler::import::{self, Problem};
use compiler::load::{Kind, Source};
use compiler::workspace::Valid;
use compiler::{compile, report};

/// `edgeform import --node N --out DIR` with the repository `source` read
/// from `root` (its cluster, zones and nodes): exit 0 written, 1 nothing
/// written (the sites do not check clean, or are not exact without
/// `allow_lossy`).
///
/// # Errors
/// Redis, I/O, an unknown node, files in the way.
pub async fn import(
    root: &Path,
    source: &Valid,
    node: &str,
    out: &Path,
    allow_lossy: bool,
    group_aliases: bool,
    color: bool,
) -> Result<u8> {
    let Some(n) = source.config.nodes.iter().find(|n| n.name == node) else {
        bail!("--node {node}: no such node in {}", root.display());
    };
    if n.redis.is_none() {
        bail!("--node {node}: the node has no `redis` block, so there is nothing to read");
    }
    let mut con = crate::master(n)
        .await
        .with_context(|| format!("connecting to {node}'s Redis ({})", n.redis_at()))?;
    let keys: Vec<Vec<u8>> = crate::heal::document_keys(&mut con)
        .await
        .with_context(|| format!("listing site:* and suspended:* on {node}"))?
        .into_iter()
        .collect();
    let values = crate::apply::get_raw_values(&mut con, &keys).await?;
    let (live, unreadable) = import::text_entries(keys.into_iter().zip(values));
    let mut imported = import::import(&live, group_aliases);
    imported.problems.extend(unreadable);

    // The imported sites with the repository's cluster, zones and nodes:
    // they must check clean and compile to what the edge holds.
    let mut repo = source.repo.clone();
    repo.sources.retain(|s| s.kind != Kind::Site);
    repo.sources
        .extend(imported.files.iter().map(|(path, text)| Source {
            kind: Kind::Site,
            path: Arc::from(path.as_str()),
            text: Ok(text.clone()),
        }));
    repo.sources.sort_by(|a, b| a.path.cmp(&b.path));
    let checked = compiler::check(&repo);
    let Some(config) = &checked.config else {
        eprint!(
            "{}",
            report::diagnostics_human(&checked.diagnostics, &repo, color)
        );
        eprintln!(
            "error: the sites read from {node} do not pass `check` (each file above is \
             sites/<host>.yaml for the key site:<host>); nothing was written"
        );
        print_problems(&imported.problems, &imported.notes, true);
        return Ok(1);
    };
    let compiled = compile::compile(config);
    let desired: Vec<(String, String)> = compiled
        .targets
        .get(node)
        .map(|t| {
            t.sites
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    let mut problems = imported.problems.clone();
    problems.extend(import::verify(&live, &desired, &imported.problems));
    print_problems(&problems, &imported.notes, !allow_lossy);
    if !problems.is_empty() && !allow_lossy {
        eprintln!(
            "error: {} value(s) on {node} cannot be imported exactly; nothing was written \
             (--allow-lossy writes the rest)",
            problems.len()
        );
        return Ok(1);
    }

    let dir = out.join("sites");
    // Other site files beside the imported ones would serve the same hosts
    // twice: import into a repository without sites.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut others: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| format!("sites/{}", e.file_name().to_string_lossy()))
            .filter(|p| p.ends_with(".yaml") || p.ends_with(".yml"))
            .filter(|p| !imported.files.contains_key(p))
            .collect();
        others.sort();
        if let Some(first) = others.first() {
            bail!(
                "{} already holds other site files ({first}{}); import into a repository \
                 without sites/ (nothing was written)",
                dir.display(),
                if others.len() > 1 {
                    format!(" and {} more", others.len() - 1)
                } else {
                    String::new()
                }
            );
        }
    }
    for (path, text) in &imported.files {
        let file = out.join(path);
        if let Ok(existing) = std::fs::read_to_string(&file)
            && existing != *text
        {
            bail!(
                "{} exists with other content; import into an empty folder (nothing was written)",
                file.display()
            );
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (path, text) in &imported.files {
        write_atomic(&out.join(path), text.as_bytes())?;
    }
    let hosts = live
        .keys()
        .filter(|k| k.starts_with(edgestate::keys::SITE_PREFIX))
        .count();
    eprintln!(
        "imported {} site(s) ({hosts} host(s)) from {node} into {}{}",
        imported.files.len(),
        dir.display(),
        if problems.is_empty() {
            String::new()
        } else {
            format!(" — {} value(s) not exact, see above", problems.len())
        }
    );
    Ok(0)
}

fn print_problems(problems: &[Problem], notes: &[Problem], fatal: bool) {
    let level = if fatal { "error" } else { "warning" };
    for p in problems {
        eprintln!("{level}: {}: {}", p.key, p.message);
    }
    for n in notes {
        eprintln!("note: {}: {}", n.key, n.message);
    }
}
