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

/// The largest config file read: 64 MiB. A larger file is refused without
/// reading past the limit (a `/dev/zero` or a runaway generator must not
/// exhaust memory).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The most config text one repository may hold (every file together, as
/// sized before reading): about ten times a 1,000,000-site repository. A
/// pull request of many large files is refused file by file past it, not
/// read into memory.
pub const MAX_TOTAL_BYTES: u64 = 1 << 30;

/// The deepest folder read under `sites/`, `zones/` and `nodes/` (working
/// tree or committed tree).
pub const MAX_DEPTH: usize = 32;

/// The most entries (files and folders) walked under one of `sites/`,
/// `zones/` and `nodes/` of a committed tree: twice a 1,000,000-site
/// repository. A commit can repeat one subtree under many names, so a
/// small commit could otherwise name hundreds of millions of paths (a
/// working tree holds what was checked out: no such sharing).
pub const MAX_ENTRIES: usize = 2_000_000;

/// Why a config file's text is not available. Refused entries are never
/// read (links, special files) or read only up to the limit, so no content
/// of anything that is not a config file can reach the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// The bytes are not UTF-8; the first bad byte's offset.
    NotUtf8 { at: usize },
    /// A symbolic link (working tree) or a git link entry (mode 120000).
    Link,
    /// Not a regular file: a fifo, socket or device.
    Special(SpecialKind),
    /// Larger than [`MAX_FILE_BYTES`].
    TooLarge,
    /// Past [`MAX_TOTAL_BYTES`] of the repository's files before it (in
    /// path order).
    OverTotal,
    /// A folder deeper than [`MAX_DEPTH`]: nothing under it is read.
    TooDeep,
    /// A folder walked past [`MAX_ENTRIES`] entries: the rest of it is not
    /// read.
    TooMany,
    /// A committed folder with the same content as one read under another
    /// name: not read again.
    Repeated,
    /// A committed file with the same content (the same blob) as the file
    /// named, read before it in path order: not read again. Two config
    /// files alike are always an error (the same host, zone or node
    /// twice), and one blob named a million times must not cost a million
    /// parses.
    SameAs(String),
    /// A file or folder name that is not UTF-8: refused, never read (it
    /// could not be named in a diagnostic, a key or a diff).
    NameNotUtf8,
    /// A git submodule: committed, a gitlink (mode 160000); in the working
    /// tree, a folder holding its own `.git`. Another repository's files,
    /// never read: left unrefused, the files it stands for would silently
    /// be missing (`--rev`) or read from elsewhere (working tree).
    Submodule,
    /// A folder where a config file is expected (`cluster.yaml`), or a
    /// file where a folder of config files is (`sites`, `zones`, …):
    /// nothing of it is read.
    WrongKind { folder_expected: bool },
    /// The file could not be opened or read.
    Io(std::io::ErrorKind),
}

/// The kind of a non-regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialKind {
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

impl SpecialKind {
    fn of(ft: std::fs::FileType) -> SpecialKind {
        use std::os::unix::fs::FileTypeExt as _;
        if ft.is_fifo() {
            SpecialKind::Fifo
        } else if ft.is_socket() {
            SpecialKind::Socket
        } else if ft.is_char_device() {
            SpecialKind::CharDevice
        } else if ft.is_block_device() {
            SpecialKind::BlockDevice
        } else {
            SpecialKind::Other
        }
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SpecialKind::Fifo => "a fifo",
            SpecialKind::Socket => "a socket",
            SpecialKind::CharDevice => "a character device",
            SpecialKind::BlockDevice => "a block device",
            SpecialKind::Other => "not a regular file",
        }
    }
}

impl Unreadable {
    /// The diagnostic code (docs/diagnostics.md).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Unreadable::NotUtf8 { .. } | Unreadable::NameNotUtf8 => "encoding",
            Unreadable::Link | Unreadable::Special(_) => "not-a-file",
            Unreadable::TooLarge | Unreadable::OverTotal | Unreadable::TooMany => "file-too-large",
            Unreadable::TooDeep
            | Unreadable::Repeated
            | Unreadable::Submodule
            | Unreadable::WrongKind { .. } => "not-a-file",
            Unreadable::SameAs(_) => "repeated-file",
            Unreadable::Io(_) => "unreadable",
        }
    }
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::NotUtf8 { at } => write!(f, "not valid UTF-8 (at byte {at})"),
            Unreadable::Link => f.write_str(
                "a symbolic link; links are refused and never followed (commit the file itself)",
            ),
            Unreadable::Special(kind) => write!(
                f,
                "{}, not a regular file; refused and never read",
                kind.as_str()
            ),
            Unreadable::TooLarge => write!(
                f,
                "larger than {} MiB, the limit for a config file",
                MAX_FILE_BYTES >> 20
            ),
            Unreadable::OverTotal => write!(
                f,
                "past {} GiB of config files in this repository; not read",
                MAX_TOTAL_BYTES >> 30
            ),
            Unreadable::TooMany => write!(
                f,
                "a folder of more than {MAX_ENTRIES} entries (files and folders, nested ones \
                 counted each time they are named); the rest is not read"
            ),
            Unreadable::Repeated => f.write_str(
                "a folder committed with the same content as another folder of this \
                 repository; its files would repeat that folder's, and it is not read",
            ),
            Unreadable::TooDeep => write!(
                f,
                "a folder more than {MAX_DEPTH} levels deep; nothing under it is read"
            ),
            Unreadable::SameAs(first) => write!(
                f,
                "the same content as `{first}` (committed twice: the same host, zone or node \
                 twice); not read again"
            ),
            Unreadable::NameNotUtf8 => f.write_str(
                "a name that is not valid UTF-8 (shown with U+FFFD); refused and never read",
            ),
            Unreadable::Submodule => f.write_str(
                "a git submodule (a gitlink, or a folder holding its own `.git`): another \
                 repository's files; refused and never read (commit the config files themselves)",
            ),
            Unreadable::WrongKind {
                folder_expected: true,
            } => f.write_str("a file where a folder of config files is expected; not read"),
            Unreadable::WrongKind {
                folder_expected: false,
            } => f.write_str("a folder where a config file is expected; not read"),
            Unreadable::Io(kind) => write!(f, "cannot be read ({kind})"),
        }
    }
}

/// One config file's text.
#[derive(Debug, Clone)]
pub struct Source {
    pub kind: Kind,
    /// Relative to the repository root, `/`-separated.
    pub path: Arc<str>,
    /// The bytes, when they are a readable UTF-8 regular file; otherwise
    /// why not.
    pub text: Result<String, Unreadable>,
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

/// A file's bytes as text, or where the first invalid UTF-8 byte is.
///
/// # Errors
/// [`Unreadable::NotUtf8`].
pub fn utf8(bytes: Vec<u8>) -> Result<String, Unreadable> {
    String::from_utf8(bytes).map_err(|e| Unreadable::NotUtf8 {
        at: e.utf8_error().valid_up_to(),
    })
}

/// What a working-tree entry is, from its own metadata (never through a
/// link).
enum Entry {
    Dir,
    File,
    Refused(Unreadable),
    Absent,
}

fn entry_at(path: &Path) -> Entry {
    match std::fs::symlink_metadata(path) {
        Err(_) => Entry::Absent,
        Ok(m) => {
            let ft = m.file_type();
            if ft.is_symlink() {
                Entry::Refused(Unreadable::Link)
            } else if ft.is_dir() {
                Entry::Dir
            } else if ft.is_file() {
                Entry::File
            } else {
                Entry::Refused(Unreadable::Special(SpecialKind::of(ft)))
            }
        }
    }
}

/// Read a regular file without following a link (`O_NOFOLLOW`), without
/// blocking on a fifo swapped in after the walk (`O_NONBLOCK`), checking
/// the opened descriptor is a regular file, and reading at most
/// [`MAX_FILE_BYTES`].
fn read_config(path: &Path) -> Result<String, Unreadable> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    // The walk has already refused links and special files; these flags
    // close the window between the walk and the open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            // ELOOP: the final component is a link.
            if e.raw_os_error() == Some(libc::ELOOP) {
                Unreadable::Link
            } else {
                Unreadable::Io(e.kind())
            }
        })?;
    let meta = file.metadata().map_err(|e| Unreadable::Io(e.kind()))?;
    if !meta.file_type().is_file() {
        return Err(Unreadable::Special(SpecialKind::of(meta.file_type())));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(Unreadable::TooLarge);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Unreadable::Io(e.kind()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Unreadable::TooLarge);
    }
    utf8(bytes)
}

/// Load the working tree at `root`.
///
/// # Errors
/// When `root` is not a directory or a file cannot be read.
pub fn from_dir(root: &Path) -> Result<Repo> {
    let mut repo = files_of_dir(root)?;
    repo.commit = head_commit(root);
    Ok(repo)
}

/// [`from_dir`] without HEAD's commit (`commit: None`): no git at all —
/// opening the git repository initialises libgit2 and with it OpenSSL's
/// trust store, about half of a small repository's load (`purge`).
///
/// # Errors
/// As [`from_dir`].
pub fn files_of_dir(root: &Path) -> Result<Repo> {
    if !root.is_dir() {
        bail!("{} is not a directory", root.display());
    }
    let mut files: Vec<(Kind, String, Walked)> = Vec::new();
    match entry_at(&root.join(Kind::CLUSTER_FILE)) {
        Entry::File => files.push((
            Kind::Cluster,
            Kind::CLUSTER_FILE.to_owned(),
            Walked::Read(root.join(Kind::CLUSTER_FILE)),
        )),
        Entry::Refused(why) => files.push((
            Kind::Cluster,
            Kind::CLUSTER_FILE.to_owned(),
            Walked::Refused(why),
        )),
        Entry::Dir => files.push((
            Kind::Cluster,
            Kind::CLUSTER_FILE.to_owned(),
            Walked::Refused(Unreadable::WrongKind {
                folder_expected: false,
            }),
        )),
        Entry::Absent => {}
    }
    for (folder, kind) in Kind::FOLDERS {
        let dir = root.join(folder);
        match entry_at(&dir) {
            Entry::Dir => walk(&dir, folder, kind, 1, &mut files)?,
            Entry::Refused(why) => files.push((kind, folder.to_owned(), Walked::Refused(why))),
            Entry::File => files.push((
                kind,
                folder.to_owned(),
                Walked::Refused(Unreadable::WrongKind {
                    folder_expected: true,
                }),
            )),
            Entry::Absent => {}
        }
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    // The total, in path order, from the sizes the walk saw.
    let mut total = 0u64;
    for f in &mut files {
        if let Walked::Read(path) = &f.2 {
            // Only what will be read counts (a file over the per-file
            // limit is refused unread), as in the committed tree.
            let len = std::fs::symlink_metadata(path).map_or(0, |m| m.len());
            if len > MAX_FILE_BYTES {
                continue;
            }
            total = total.saturating_add(len);
            if total > MAX_TOTAL_BYTES {
                f.2 = Walked::Refused(Unreadable::OverTotal);
            }
        }
    }
    let sources = files
        .into_par_iter()
        .map(|(kind, rel, walked)| Source {
            kind,
            path: rel.into(),
            text: match walked {
                Walked::Read(path) => read_config(&path),
                Walked::Refused(why) => Err(why),
            },
        })
        .collect();
    Ok(Repo {
        sources,
        commit: None,
    })
}

/// A config entry found by the walk: a regular file to read, or an entry
/// refused from its metadata alone.
enum Walked {
    Read(PathBuf),
    Refused(Unreadable),
}

/// Whether the folder `dir` is another repository's checkout (it holds a
/// `.git`, as a checked-out submodule does): its files are not this
/// repository's, as `--rev` sees them.
fn is_checkout(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(".git")).is_ok()
}

/// Collects the config files under `dir`. Links and special files are
/// refused whatever their name (never followed, never read); hidden
/// entries are skipped.
fn walk(
    dir: &Path,
    rel: &str,
    kind: Kind,
    depth: usize,
    out: &mut Vec<(Kind, String, Walked)>,
) -> Result<()> {
    if depth > MAX_DEPTH {
        out.push((kind, rel.to_owned(), Walked::Refused(Unreadable::TooDeep)));
        return Ok(());
    }
    if is_checkout(dir) {
        out.push((kind, rel.to_owned(), Walked::Refused(Unreadable::Submodule)));
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            // Refused where it would be read (a folder, or a config file
            // by its extension); any other file is left alone, as it would
            // be with a UTF-8 name.
            let shown = name.to_string_lossy();
            let read = entry.file_type().is_ok_and(|t| t.is_dir()) || is_config_file(&shown);
            if !shown.starts_with('.') && read {
                out.push((
                    kind,
                    format!("{rel}/{shown}"),
                    Walked::Refused(Unreadable::NameNotUtf8),
                ));
            }
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let child_rel = format!("{rel}/{name}");
        // `DirEntry::file_type` does not follow links.
        let file_type = entry.file_type()?;
        let path = entry.path();
        if file_type.is_symlink() {
            out.push((kind, child_rel, Walked::Refused(Unreadable::Link)));
        } else if file_type.is_dir() {
            walk(&path, &child_rel, kind, depth + 1, out)?;
        } else if !file_type.is_file() {
            out.push((
                kind,
                child_rel,
                Walked::Refused(Unreadable::Special(SpecialKind::of(file_type))),
            ));
        } else if is_config_file(name) {
            out.push((kind, child_rel, Walked::Read(path)));
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
    worktree_state(root).0
}

/// [`worktree_commit`], and whether it is a git working tree whose config
/// files differ from HEAD (the `+dirty` case: no commit, so no ancestry).
#[must_use]
pub fn worktree_state(root: &Path) -> (String, bool) {
    let Ok(repo) = git2::Repository::discover(root) else {
        return ("worktree".into(), false);
    };
    let Some(head) = repo.head().ok().and_then(|h| h.peel_to_commit().ok()) else {
        return ("worktree".into(), false);
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
    if dirty {
        (format!("{id}+dirty"), true)
    } else {
        (id, false)
    }
}

/// HEAD's commit id of the git repository containing `root`, if any.
fn head_commit(root: &Path) -> Option<String> {
    let repo = git2::Repository::discover(root).ok()?;
    let head = repo.head().ok()?.peel_to_commit().ok()?;
    Some(head.id().to_string())
}

/// Resolve `rev` in the git repository containing `root` to a full commit
/// id (`edgeform serve` notices a moved `--rev` with it).
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
    let odb = repo.odb()?;
    // A blob's text, or why it is refused: a link (mode 120000) is never
    // read, as in the working tree; a blob over the limit is refused from
    // its header before its content is loaded.
    let mut total = 0u64;
    let mut read = |mode: i32, id: git2::Oid| -> Result<Result<String, Unreadable>> {
        if mode == LINK_MODE {
            return Ok(Err(Unreadable::Link));
        }
        let (size, _) = odb.read_header(id)?;
        if size as u64 > MAX_FILE_BYTES {
            return Ok(Err(Unreadable::TooLarge));
        }
        total = total.saturating_add(size as u64);
        if total > MAX_TOTAL_BYTES {
            return Ok(Err(Unreadable::OverTotal));
        }
        Ok(utf8(repo.find_blob(id)?.content().to_vec()))
    };
    let mut sources = Vec::new();
    // Each committed file's blob, by the first path it was read at.
    let mut first_of: std::collections::HashMap<git2::Oid, String> =
        std::collections::HashMap::new();
    if let Some(entry) = tree.get_name(Kind::CLUSTER_FILE) {
        sources.push(Source {
            kind: Kind::Cluster,
            path: Kind::CLUSTER_FILE.into(),
            text: match entry.kind() {
                Some(git2::ObjectType::Blob) => read(entry.filemode(), entry.id())?,
                Some(git2::ObjectType::Commit) => Err(Unreadable::Submodule),
                _ => Err(Unreadable::WrongKind {
                    folder_expected: false,
                }),
            },
        });
    }
    for (folder, kind) in Kind::FOLDERS {
        let Some(entry) = tree.get_name(folder) else {
            continue;
        };
        let refused = match entry.kind() {
            _ if entry.filemode() == LINK_MODE => Some(Unreadable::Link),
            Some(git2::ObjectType::Tree) => None,
            Some(git2::ObjectType::Commit) => Some(Unreadable::Submodule),
            _ => Some(Unreadable::WrongKind {
                folder_expected: true,
            }),
        };
        if let Some(why) = refused {
            sources.push(Source {
                kind,
                path: folder.into(),
                text: Err(why),
            });
            continue;
        }
        let Ok(sub) = repo.find_tree(entry.id()) else {
            continue;
        };
        // Walked here, not by libgit2's recursive walk: a tree nested
        // 200,000 deep overflowed its stack. Hidden entries are skipped,
        // a folder past MAX_DEPTH is refused whole.
        let mut blobs: Vec<(String, Result<Blob, Unreadable>)> = Vec::new();
        let mut trees = vec![(format!("{folder}/"), sub, 1usize)];
        let mut walked = 0usize;
        // A folder whose content (tree id) was committed under another
        // name already is not walked again: its config files would repeat
        // the first's (refused as duplicates anyway), and a commit nesting
        // one subtree under many names would name millions of paths.
        let mut seen = std::collections::HashSet::new();
        let mut holds_config = std::collections::HashMap::new();
        'walk: while let Some((dir, tree, depth)) = trees.pop() {
            for entry in tree.iter() {
                walked += 1;
                if walked > MAX_ENTRIES {
                    blobs.push((folder.to_owned(), Err(Unreadable::TooMany)));
                    break 'walk;
                }
                let Ok(name) = entry.name() else {
                    let shown = String::from_utf8_lossy(entry.name_bytes());
                    let read = entry.kind() == Some(git2::ObjectType::Tree)
                        || entry.filemode() == LINK_MODE
                        || is_config_file(&shown);
                    if !shown.starts_with('.') && read {
                        blobs.push((format!("{dir}{shown}"), Err(Unreadable::NameNotUtf8)));
                    }
                    continue;
                };
                if name.starts_with('.') {
                    continue;
                }
                match entry.kind() {
                    Some(git2::ObjectType::Tree) if depth >= MAX_DEPTH => {
                        blobs.push((format!("{dir}{name}"), Err(Unreadable::TooDeep)));
                    }
                    Some(git2::ObjectType::Tree) if !seen.insert(entry.id()) => {
                        let holds = config_under(&repo, entry.id(), 0, &mut holds_config);
                        blobs.extend(
                            holds.then(|| (format!("{dir}{name}"), Err(Unreadable::Repeated))),
                        );
                    }
                    Some(git2::ObjectType::Tree) => {
                        if let Ok(t) = repo.find_tree(entry.id()) {
                            trees.push((format!("{dir}{name}/"), t, depth + 1));
                        }
                    }
                    Some(git2::ObjectType::Blob)
                        if entry.filemode() == LINK_MODE || is_config_file(name) =>
                    {
                        blobs.push((format!("{dir}{name}"), Ok((entry.filemode(), entry.id()))));
                    }
                    Some(git2::ObjectType::Commit) => {
                        blobs.push((format!("{dir}{name}"), Err(Unreadable::Submodule)));
                    }
                    _ => {}
                }
            }
        }
        // In path order, as the working tree's total is counted.
        blobs.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, blob) in blobs {
            let text = match blob {
                Ok((mode, id)) if mode != LINK_MODE => match first_of.get(&id) {
                    Some(first) => Err(Unreadable::SameAs(first.clone())),
                    None => {
                        first_of.insert(id, path.clone());
                        read(mode, id)?
                    }
                },
                Ok((mode, id)) => read(mode, id)?,
                Err(why) => Err(why),
            };
            sources.push(Source {
                kind,
                path: path.into(),
                text,
            });
        }
    }
    sources.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Repo {
        sources,
        commit: Some(commit.id().to_string()),
    })
}

/// Whether the committed folder `id` holds a config file (or a link)
/// anywhere under it, not in a hidden folder: memoized by tree id, so a
/// tree repeated under many names is looked at once.
fn config_under(
    repo: &git2::Repository,
    id: git2::Oid,
    depth: usize,
    memo: &mut std::collections::HashMap<git2::Oid, bool>,
) -> bool {
    if let Some(&known) = memo.get(&id) {
        return known;
    }
    let Ok(tree) = repo.find_tree(id) else {
        return false;
    };
    let mut found = false;
    for entry in tree.iter() {
        let Ok(name) = entry.name() else { continue };
        if name.starts_with('.') {
            continue;
        }
        found = match entry.kind() {
            Some(git2::ObjectType::Tree) => {
                depth < MAX_DEPTH && config_under(repo, entry.id(), depth + 1, memo)
            }
            Some(git2::ObjectType::Blob) => entry.filemode() == LINK_MODE || is_config_file(name),
            _ => false,
        };
        if found {
            break;
        }
    }
    memo.insert(id, found);
    found
}

/// A committed file to read: its mode and object id.
type Blob = (i32, git2::Oid);

/// Git's file mode of a symbolic link.
const LINK_MODE: i32 = 0o120_000;

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
