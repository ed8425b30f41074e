//! Reading a config repository: from the working tree, or from any git
//! revision through git2 without checking it out.
//!
//! This module is the compiler's only file-system and git reader. It
//! returns the raw text of every config file; parsing and validation are
//! pure functions over that ([`crate::check`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use rayon::prelude::*;

/// What a config file describes, by its place in the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Cluster,
    Site,
    Zone,
    Node,
}

impl Kind {
    /// The folder a kind lives in (`cluster.yaml` lives at the root).
    pub const FOLDERS: [(&'static str, Kind); 3] = [
        ("sites", Kind::Site),
        ("zones", Kind::Zone),
        ("nodes", Kind::Node),
    ];
    pub const CLUSTER_FILE: &'static str = "cluster.yaml";
}

/// One config file's text.
#[derive(Debug, Clone)]
pub struct Source {
    pub kind: Kind,
    /// Relative to the repository root, `/`-separated.
    pub path: Arc<str>,
    /// The bytes, when they are valid UTF-8; otherwise the reason.
    pub text: Result<String, String>,
}

/// A loaded repository: its files in path order, and the commit they came
/// from (when read from git).
#[derive(Debug, Clone, Default)]
pub struct Repo {
    pub sources: Vec<Source>,
    /// Full hex id of the commit, when loaded with `--rev`, or HEAD's id
    /// when the working tree is in a git repository (`dirty` tells whether
    /// the tree may differ from it).
    pub commit: Option<String>,
}

fn is_config_file(name: &str) -> bool {
    !name.starts_with('.')
        && (Path::new(name)
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml"))
}

fn utf8(bytes: Vec<u8>) -> Result<String, String> {
    String::from_utf8(bytes)
        .map_err(|e| format!("not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()))
}

/// Load the working tree at `root`.
///
/// # Errors
/// When `root` is not a directory or a file cannot be read.
pub fn from_dir(root: &Path) -> Result<Repo> {
    if !root.is_dir() {
        bail!("{} is not a directory", root.display());
    }
    let mut files: Vec<(Kind, String, PathBuf)> = Vec::new();
    let cluster = root.join(Kind::CLUSTER_FILE);
    if cluster.is_file() {
        files.push((Kind::Cluster, Kind::CLUSTER_FILE.to_owned(), cluster));
    }
    for (folder, kind) in Kind::FOLDERS {
        let dir = root.join(folder);
        if dir.is_dir() {
            walk(&dir, folder, kind, &mut files)?;
        }
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    let sources = files
        .into_par_iter()
        .map(|(kind, rel, path)| {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            Ok(Source {
                kind,
                path: rel.into(),
                text: utf8(bytes),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let commit = head_commit(root);
    Ok(Repo { sources, commit })
}

fn walk(dir: &Path, rel: &str, kind: Kind, out: &mut Vec<(Kind, String, PathBuf)>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue;
        }
        let child_rel = format!("{rel}/{name}");
        let file_type = entry.file_type()?;
        let path = entry.path();
        // Follow a symlink only to learn what it points at.
        let is_dir = file_type.is_dir() || (file_type.is_symlink() && path.is_dir());
        if is_dir {
            walk(&path, &child_rel, kind, out)?;
        } else if is_config_file(name) {
            out.push((kind, child_rel, path));
        }
    }
    Ok(())
}

/// What a working tree's content is, for `edgeform:meta`: HEAD's commit id,
/// with `+dirty` when a config file differs from it (modified, added or
/// deleted under `cluster.yaml`, `sites/`, `zones/`, `nodes/`), or
/// `worktree` outside git.
#[must_use]
pub fn worktree_commit(root: &Path) -> String {
    let Ok(repo) = git2::Repository::discover(root) else {
        return "worktree".into();
    };
    let Some(head) = repo.head().ok().and_then(|h| h.peel_to_commit().ok()) else {
        return "worktree".into();
    };
    let prefix = match (
        repo.workdir().and_then(|w| w.canonicalize().ok()),
        root.canonicalize().ok(),
    ) {
        (Some(w), Some(r)) => r
            .strip_prefix(&w)
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        _ => PathBuf::new(),
    };
    let mut options = git2::StatusOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false);
    for part in [Kind::CLUSTER_FILE, "sites", "zones", "nodes"] {
        options.pathspec(prefix.join(part));
    }
    let dirty = repo.statuses(Some(&mut options)).map_or(true, |s| {
        s.iter().any(|e| {
            e.path().is_ok_and(|p| {
                Path::new(p)
                    .extension()
                    .is_some_and(|x| x == "yaml" || x == "yml")
            })
        })
    });
    let id = head.id().to_string();
    if dirty { format!("{id}+dirty") } else { id }
}

/// HEAD's commit id of the git repository containing `root`, if any.
fn head_commit(root: &Path) -> Option<String> {
    let repo = git2::Repository::discover(root).ok()?;
    let head = repo.head().ok()?.peel_to_commit().ok()?;
    Some(head.id().to_string())
}

/// Resolve `rev` in the git repository containing `root` to a full commit id.
///
/// # Errors
/// When there is no repository or the revision does not name a commit.
pub fn resolve_rev(root: &Path, rev: &str) -> Result<String> {
    let repo = git2::Repository::discover(root)
        .with_context(|| format!("{} is not inside a git repository", root.display()))?;
    let commit = repo
        .revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .with_context(|| format!("revision `{rev}` does not name a commit"))?;
    Ok(commit.id().to_string())
}

/// Load the repository at `root` as of git revision `rev`, reading blobs
/// from the object database (no checkout, the working tree is untouched).
/// When `root` is a subfolder of the git repository, that subfolder of the
/// revision's tree is read.
///
/// # Errors
/// When there is no repository, the revision is unknown, or a blob cannot
/// be read.
pub fn from_rev(root: &Path, rev: &str) -> Result<Repo> {
    let repo = git2::Repository::discover(root)
        .with_context(|| format!("{} is not inside a git repository", root.display()))?;
    let commit = repo
        .revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .with_context(|| format!("revision `{rev}` does not name a commit"))?;
    let mut tree = commit.tree()?;
    if let Some(workdir) = repo.workdir() {
        let workdir = workdir.canonicalize()?;
        let root = root.canonicalize()?;
        let prefix = root.strip_prefix(&workdir).unwrap_or(Path::new(""));
        if !prefix.as_os_str().is_empty() {
            let entry = tree.get_path(prefix).with_context(|| {
                format!("{} does not exist at revision `{rev}`", prefix.display())
            })?;
            tree = repo.find_tree(entry.id())?;
        }
    }
    let mut sources = Vec::new();
    if let Some(entry) = tree.get_name(Kind::CLUSTER_FILE)
        && entry.kind() == Some(git2::ObjectType::Blob)
    {
        let blob = repo.find_blob(entry.id())?;
        sources.push(Source {
            kind: Kind::Cluster,
            path: Kind::CLUSTER_FILE.into(),
            text: utf8(blob.content().to_vec()),
        });
    }
    for (folder, kind) in Kind::FOLDERS {
        let Some(entry) = tree.get_name(folder) else {
            continue;
        };
        let Ok(sub) = repo.find_tree(entry.id()) else {
            continue;
        };
        let mut blobs: Vec<(String, git2::Oid)> = Vec::new();
        sub.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if let Ok(name) = entry.name()
                && entry.kind() == Some(git2::ObjectType::Blob)
                && entry.filemode() != 0o120_000
                && is_config_file(name)
                && !dir.split('/').any(|part| part.starts_with('.'))
            {
                blobs.push((format!("{folder}/{dir}{name}"), entry.id()));
            }
            git2::TreeWalkResult::Ok
        })?;
        for (path, id) in blobs {
            let blob = repo.find_blob(id)?;
            sources.push(Source {
                kind,
                path: path.into(),
                text: utf8(blob.content().to_vec()),
            });
        }
    }
    sources.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Repo {
        sources,
        commit: Some(commit.id().to_string()),
    })
}

/// Load the working tree, or `rev` when given.
///
/// # Errors
/// See [`from_dir`] and [`from_rev`].
pub fn load(root: &Path, rev: Option<&str>) -> Result<Repo> {
    match rev {
        Some(rev) => from_rev(root, rev),
        None => from_dir(root),
    }
}
