//! A key index of the cache dirs, kept current by inotify, so a pattern
//! purge matches keys in memory instead of reading 50,000 headers.
//!
//! # What it holds
//! For every directory below the cache dirs (up to the scan depth): its
//! inotify watch, its subdirectories, and for each cache file in it the
//! file's `KEY: <key>` line. Names that are an md5 (all of nginx's) are
//! stored as 16 bytes: a file costs ~40 bytes plus its key line in a
//! B-tree, a directory a few hundred bytes (measured: 13 MB of RSS for
//! 50,000 files in 15,700 level dirs, most of it per directory).
//!
//! # Why it cannot miss a file
//! The index answers "which files hold a matching key line" for the state
//! of the cache **when the purge starts** (T0). It is right for a name if
//! it has looked at that name after the name's last change before T0:
//! 1. A directory is watched *before* it is listed, and a file's header is
//!    read after that. A change before the watch is in what the listing and
//!    the read see; a change after it queues an event. The kernel queues
//!    an event inside the system call that makes the change (create,
//!    write, close after writing, rename in or out, unlink), so by T0 every
//!    earlier change is in the queue.
//! 2. Every purge first drains the queue until `EAGAIN`, after T0, and for
//!    each name any event mentions re-reads the name from the filesystem
//!    as it is now (`lstat`, then the header): the event only says *where*
//!    to look, never *what* is there, so coalesced, reordered or stale
//!    events cannot mislead it. A new or replaced directory (nginx makes
//!    level dirs lazily) is watched, then scanned — with the files created
//!    in it before its watch existed.
//! 3. Whatever undermines 1–2 makes the index rebuild or step aside: a
//!    queue overflow (`IN_Q_OVERFLOW`) or an unmount rebuilds it from a
//!    full scan on a fresh inotify instance; a watched directory deleted or
//!    moved (`IN_DELETE_SELF`, `IN_MOVE_SELF`, `IN_IGNORED`) is forgotten
//!    and its name re-read; a configured dir replaced (compared by device
//!    and inode at each purge) is rescanned; and a watch that cannot be
//!    added (`fs.inotify.max_user_watches`) or an entry that cannot be read
//!    marks the index incomplete, and purges then use the scan
//!    ([`Layout::purge_matching`]) until a rebuild (retried every minute)
//!    succeeds.
//!
//! Before removing a file the purge reads its header again and matches the
//! fresh line, so the index decides only where to look, never alone what
//! to remove.
//!
//! Limits, shared with any inotify user: changes made through `mmap`, over
//! a network filesystem, or through a hard link outside the cache dirs
//! raise no event here. nginx does none of these.
//!
//! # Keeping the queue short
//! Every purge drains the queue, so nothing is needed for correctness. A
//! busy cache queues an event per write, though, and the kernel's queue
//! (`fs.inotify.max_queued_events`, 16384 by default) overflowing costs a
//! rebuild: call [`Index::refresh`] every second or so from a blocking
//! task.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use super::layout::{MAX_DEPTH, child, remove};
use super::levels::hex_name;
use super::nofollow::{
    DevIno, Examined, Kind, examine, fd_dev_ino, list, open_beneath, open_root, open_subdir,
    path_dev_ino, stat_at,
};
use super::{Failures, Layout, PurgeStats};

/// What a directory watch reports: every way a name in it can appear,
/// change or vanish, and the directory itself going away.
/// `EXCL_UNLINK`: no events from files already unlinked but still open
/// (nginx serving a purged file), which concern no name.
const WATCH: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// Events that change which entry a name denotes (as opposed to changing
/// a file's content).
const STRUCTURAL: ReadFlags = ReadFlags::CREATE
    .union(ReadFlags::DELETE)
    .union(ReadFlags::MOVED_FROM)
    .union(ReadFlags::MOVED_TO);

/// Events about the watched directory itself.
const SELF_GONE: ReadFlags = ReadFlags::DELETE_SELF
    .union(ReadFlags::MOVE_SELF)
    .union(ReadFlags::IGNORED);

/// Room for many events per `read` (each is 16 bytes plus its name).
const EVENT_BUF: usize = 64 * 1024;

/// How often an incomplete index retries a full rebuild.
const RETRY_REBUILD: Duration = Duration::from_secs(60);

/// A key index of a [`Layout`]'s dirs, kept current by inotify.
///
/// [`Index::purge_matching`] and [`Index::purge_keys`] remove exactly what
/// [`Layout::purge_matching`] and [`Layout::purge_keys`] would (see the
/// module docs for why), a pattern purge in milliseconds instead of a scan.
/// Linux only. Shareable between threads; purges and refreshes serialize.
pub struct Index {
    layout: Layout,
    state: Mutex<State>,
}

/// The index's size and health, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexStats {
    /// Cache files indexed.
    pub files: u64,
    /// Directories watched.
    pub dirs: u64,
    /// `false` while a directory could not be watched or an entry read:
    /// purges then scan instead.
    pub complete: bool,
    /// Full scans since the index was built (overflows, retries).
    pub rebuilds: u64,
}

struct State {
    inotify: OwnedFd,
    events: Vec<MaybeUninit<u8>>,
    /// The node of each configured dir, `None` while it does not exist.
    roots: Vec<Option<NodeId>>,
    /// A configured dir whose scan failed, so it is not retried (nor
    /// logged) at every sync; the periodic rebuild retries it.
    failed_roots: Vec<Option<DevIno>>,
    /// Directories, by id; a freed slot is `None` and reused.
    nodes: Vec<Option<Node>>,
    free: Vec<NodeId>,
    /// Which node each watch belongs to.
    by_wd: HashMap<i32, NodeId>,
    files: u64,
    /// Why the index cannot vouch for the cache, if it cannot.
    incomplete: Option<String>,
    /// A full rebuild must run before the index is used again.
    overflowed: bool,
    last_rebuild: Instant,
    rebuilds: u64,
}

type NodeId = u32;

/// One watched directory.
struct Node {
    /// Index of its configured dir in `Layout::dirs`.
    root: usize,
    parent: Option<NodeId>,
    /// Its name in `parent` (empty for a configured dir).
    name: CString,
    depth: usize,
    /// Device and inode, to notice the directory replaced by another.
    id: DevIno,
    wd: Option<i32>,
    /// Cache files in it → their `KEY: <key>` line.
    files: BTreeMap<FileName, Box<[u8]>>,
    subdirs: BTreeMap<CString, NodeId>,
}

/// A file name, compact for nginx's md5 names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum FileName {
    Md5([u8; 16]),
    Other(Box<CStr>),
}

impl FileName {
    fn new(name: &CStr) -> FileName {
        let bytes = name.to_bytes();
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut md5 = [0u8; 16];
        let is_md5 = bytes.len() == 32
            && md5
                .iter_mut()
                .zip(bytes.chunks_exact(2))
                .all(|(out, pair)| match (nibble(pair[0]), nibble(pair[1])) {
                    (Some(hi), Some(lo)) => {
                        *out = hi << 4 | lo;
                        true
                    }
                    _ => false,
                });
        if is_md5 {
            FileName::Md5(md5)
        } else {
            FileName::Other(name.into())
        }
    }

    fn to_c_string(&self) -> CString {
        match self {
            FileName::Md5(md5) => hex_name(md5).as_c_str().to_owned(),
            FileName::Other(name) => name.as_ref().to_owned(),
        }
    }
}

/// A directory as scanned, before it joins the index.
struct Scanned {
    name: CString,
    id: DevIno,
    wd: Option<i32>,
    files: Vec<(FileName, Box<[u8]>)>,
    subdirs: Vec<Scanned>,
}

impl Index {
    /// Watch and scan every dir of `layout` (in parallel) and index the
    /// key of each cache file. Missing dirs are fine: they are indexed
    /// once they appear.
    ///
    /// # Errors
    /// No inotify instance could be created (`fs.inotify.max_user_instances`);
    /// use the [`Layout`] alone then. Problems with single entries do not
    /// fail the build: they leave the index incomplete (see [`IndexStats`]).
    pub fn build(layout: Layout) -> io::Result<Index> {
        let inotify = new_inotify()?;
        let state = State {
            inotify,
            events: vec![MaybeUninit::uninit(); EVENT_BUF],
            roots: vec![None; layout.dirs.len()],
            failed_roots: vec![None; layout.dirs.len()],
            nodes: Vec::new(),
            free: Vec::new(),
            by_wd: HashMap::new(),
            files: 0,
            incomplete: None,
            overflowed: false,
            last_rebuild: Instant::now(),
            rebuilds: 0,
        };
        let index = Index {
            layout,
            state: Mutex::new(state),
        };
        {
            let mut st = index.lock();
            index.scan_roots(&mut st);
        }
        Ok(index)
    }

    /// The layout this index covers.
    #[must_use]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Apply the pending inotify events. Not needed for correctness (every
    /// purge does it first); call it every second or so to keep the
    /// kernel's queue from overflowing on a busy cache.
    pub fn refresh(&self) {
        let mut st = self.lock();
        self.sync(&mut st);
    }

    /// Size and health of the index, as of the last refresh or purge.
    #[must_use]
    pub fn stats(&self) -> IndexStats {
        let st = self.lock();
        IndexStats {
            files: st.files,
            dirs: st.nodes.iter().flatten().count() as u64,
            complete: st.incomplete.is_none(),
            rebuilds: st.rebuilds,
        }
    }

    /// [`Layout::purge_matching`], from the index: the same files are
    /// removed, with the same contract; `scanned` counts the index entries
    /// matched.
    ///
    /// Applies all pending events first, matches the indexed key lines in
    /// parallel, then for each hit re-reads the file's header (never
    /// following a symlink) and removes it if the fresh line still
    /// matches. While the index is incomplete it scans instead.
    ///
    /// # Errors
    /// As [`Layout::purge_matching`]: an entry that exists but cannot be
    /// read or removed; all others are still purged first.
    pub fn purge_matching(&self, matches: impl Fn(&[u8]) -> bool + Sync) -> io::Result<PurgeStats> {
        let mut st = self.lock();
        self.sync(&mut st);
        if let Some(reason) = &st.incomplete {
            tracing::debug!(%reason, "cache index incomplete: purging by scan");
            drop(st);
            return self.layout.purge_matching(matches);
        }
        let hits: Vec<(NodeId, Vec<&FileName>)> = st
            .nodes
            .par_iter()
            .enumerate()
            .filter_map(|(id, node)| {
                let node = node.as_ref()?;
                let names: Vec<&FileName> = node
                    .files
                    .iter()
                    .filter(|(_, line)| matches(line))
                    .map(|(n, _)| n)
                    .collect();
                let id = NodeId::try_from(id).ok()?;
                (!names.is_empty()).then_some((id, names))
            })
            .collect();
        let roots: Vec<Option<OwnedFd>> = self
            .layout
            .dirs
            .iter()
            .map(|dir| open_root(dir).ok().flatten())
            .collect();
        let failures = Failures::default();
        let removed: Vec<(NodeId, FileName)> = hits
            .par_iter()
            .flat_map_iter(|(id, names)| {
                let mut removed = Vec::new();
                let path = self.path_of(&st, *id);
                let dir = match self.open_node(&st, &roots, *id) {
                    Ok(Some(dir)) => dir,
                    // Gone since the sync: nothing of it to remove.
                    Ok(None) => return removed,
                    Err(e) => {
                        failures.record(&path, &e);
                        return removed;
                    }
                };
                let mut buf = Vec::new();
                for &name in names {
                    let c_name = name.to_c_string();
                    let file = child(&path, &c_name);
                    match examine(dir.as_fd(), &c_name, &mut buf) {
                        Ok(Examined::Key(line)) if matches(&buf[line.clone()]) => {
                            if remove(dir.as_fd(), &c_name, &file, &failures) {
                                removed.push((*id, name.clone()));
                            }
                        }
                        Ok(_) => {}
                        Err(e) => failures.record(&file, &e),
                    }
                }
                removed
            })
            .collect();
        let stats = PurgeStats {
            removed: removed.len() as u64,
            scanned: st.files,
        };
        drop(hits);
        for (id, name) in removed {
            st.remove_file(id, &name);
        }
        failures.finish(stats)
    }

    /// [`Layout::purge_keys`]: exact keys need no index (their path follows
    /// from the key), so this is the same O(1)-per-key purge; the index
    /// learns of the removals from their events.
    ///
    /// # Errors
    /// As [`Layout::purge_keys`].
    pub fn purge_keys(&self, keys: &[&str]) -> io::Result<PurgeStats> {
        self.layout.purge_keys(keys)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic mid-update may have left the index inconsistent: rebuild.
        self.state.lock().unwrap_or_else(|poisoned| {
            let mut st = poisoned.into_inner();
            st.overflowed = true;
            st
        })
    }

    /// Bring the index up to date with every change queued so far.
    fn sync(&self, st: &mut State) {
        let retry = st.incomplete.is_some() && st.last_rebuild.elapsed() >= RETRY_REBUILD;
        if st.overflowed || retry {
            self.rebuild(st);
            return;
        }
        let pending = st.drain();
        if st.overflowed {
            self.rebuild(st);
            return;
        }
        self.reconcile(st, pending);
        self.scan_roots(st);
    }

    /// Start over on a fresh inotify instance: closing the old one drops
    /// its watches and whatever its queue held, all of which the scan that
    /// follows supersedes.
    fn rebuild(&self, st: &mut State) {
        st.rebuilds += 1;
        st.last_rebuild = Instant::now();
        st.overflowed = false;
        st.incomplete = None;
        st.roots.iter_mut().for_each(|r| *r = None);
        st.failed_roots.iter_mut().for_each(|r| *r = None);
        st.nodes.clear();
        st.free.clear();
        st.by_wd.clear();
        st.files = 0;
        match new_inotify() {
            Ok(fd) => st.inotify = fd,
            Err(e) => {
                st.set_incomplete(format!("cannot create an inotify instance: {e}"));
                return;
            }
        }
        tracing::info!("cache index: rebuilding from a full scan");
        self.scan_roots(st);
    }

    /// Index each configured dir that appeared (or was replaced) since it
    /// was last looked at.
    fn scan_roots(&self, st: &mut State) {
        for (root, dir) in self.layout.dirs.iter().enumerate() {
            let now = match path_dev_ino(dir) {
                Ok(now) => now,
                Err(e) => {
                    st.mark_incomplete(dir, &e);
                    continue;
                }
            };
            if let Some(node) = st.roots[root] {
                if st.node(node).map(|n| n.id) == now {
                    continue;
                }
                st.drop_subtree(node);
                st.roots[root] = None;
            }
            if now.is_none() || st.failed_roots[root] == now {
                continue;
            }
            let failures = Failures::default();
            let scanned = match open_root(dir) {
                Ok(Some(fd)) => scan(
                    st.inotify.as_fd(),
                    fd,
                    dir,
                    CString::default(),
                    0,
                    &failures,
                ),
                Ok(None) => None,
                Err(e) => {
                    failures.record(dir, &e);
                    None
                }
            };
            let failed = st.absorb(failures);
            match scanned {
                Some(scanned) => st.roots[root] = st.insert(scanned, root, None, 0),
                None if failed => st.failed_roots[root] = now,
                // Gone since the `stat`: looked up again at the next sync.
                None => {}
            }
        }
    }

    /// Re-read each name an event mentioned, as the filesystem has it now.
    fn reconcile(&self, st: &mut State, pending: BTreeSet<(NodeId, CString)>) {
        if pending.is_empty() {
            return;
        }
        let roots: Vec<Option<OwnedFd>> = self
            .layout
            .dirs
            .iter()
            .map(|dir| open_root(dir).ok().flatten())
            .collect();
        let mut buf = Vec::new();
        // The directory of the names being re-read (`pending` is sorted by
        // node, so each is opened once), `None` if it is gone.
        let mut open: Option<(NodeId, Option<OwnedFd>)> = None;
        for (id, name) in pending {
            // A node forgotten by an earlier event: its parent's entry for
            // it is pending too, and will rescan whatever is there now.
            if st.node(id).is_none() {
                continue;
            }
            if open.as_ref().is_none_or(|(open_id, _)| *open_id != id) {
                let dir = self.open_node(st, &roots, id).unwrap_or_else(|e| {
                    let path = self.path_of(st, id);
                    st.mark_incomplete(&path, &e);
                    None
                });
                // Gone: the event saying so is queued for the next sync.
                open = Some((id, dir));
            }
            if let Some((_, Some(dir))) = &open {
                self.reconcile_name(st, id, dir.as_fd(), &name, &mut buf);
            }
        }
    }

    fn reconcile_name(
        &self,
        st: &mut State,
        id: NodeId,
        dir: BorrowedFd<'_>,
        name: &CStr,
        buf: &mut Vec<u8>,
    ) {
        let file_name = FileName::new(name);
        let old_subdir = st.node(id).and_then(|n| n.subdirs.get(name).copied());
        let kind = match stat_at(dir, name) {
            Ok(kind) => kind,
            Err(e) => {
                let path = child(&self.path_of(st, id), name);
                st.mark_incomplete(&path, &e);
                return;
            }
        };
        match kind {
            Some((Kind::Dir, now)) => {
                st.remove_file(id, &file_name);
                if let Some(old) = old_subdir {
                    if st.node(old).is_some_and(|n| n.id == now) {
                        // Watched all along: its contents are current.
                        return;
                    }
                    st.drop_subtree(old);
                }
                let Some(node) = st.node(id) else { return };
                let (root, depth) = (node.root, node.depth + 1);
                if depth > MAX_DEPTH {
                    return;
                }
                let path = child(&self.path_of(st, id), name);
                let failures = Failures::default();
                let scanned = match open_subdir(dir, name) {
                    Ok(Some(fd)) => scan(
                        st.inotify.as_fd(),
                        fd,
                        &path,
                        name.to_owned(),
                        depth,
                        &failures,
                    ),
                    Ok(None) => None,
                    Err(e) => {
                        failures.record(&path, &e);
                        None
                    }
                };
                st.absorb(failures);
                if let Some(scanned) = scanned {
                    st.insert(scanned, root, Some(id), depth);
                }
            }
            Some((Kind::File, _)) => {
                if let Some(old) = old_subdir {
                    st.drop_subtree(old);
                }
                match examine(dir, name, buf) {
                    Ok(Examined::Key(line)) => st.set_file(id, file_name, &buf[line]),
                    Ok(Examined::NotCache | Examined::Skipped) => st.remove_file(id, &file_name),
                    Err(e) => {
                        let path = child(&self.path_of(st, id), name);
                        st.mark_incomplete(&path, &e);
                    }
                }
            }
            Some((Kind::Other, _)) | None => {
                if let Some(old) = old_subdir {
                    st.drop_subtree(old);
                }
                st.remove_file(id, &file_name);
            }
        }
    }

    /// The path of a node, for messages.
    fn path_of(&self, st: &State, id: NodeId) -> PathBuf {
        let (root, names) = st.names_to(id);
        let mut path = self.layout.dirs.get(root).cloned().unwrap_or_default();
        for name in names.iter().rev() {
            path = child(&path, name);
        }
        path
    }

    /// Open a node's directory from its (already open) configured dir, one
    /// component at a time without following symlinks.
    fn open_node(
        &self,
        st: &State,
        roots: &[Option<OwnedFd>],
        id: NodeId,
    ) -> io::Result<Option<OwnedFd>> {
        let (root, names) = st.names_to(id);
        match roots.get(root) {
            Some(Some(root)) => {
                open_beneath(root.as_fd(), names.iter().rev().map(|n| n.as_c_str()))
            }
            _ => Ok(None),
        }
    }
}

impl State {
    fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id as usize)?.as_ref()
    }

    fn node_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(id as usize)?.as_mut()
    }

    /// The configured dir of a node, and the names leading to it from
    /// there, innermost first.
    fn names_to(&self, mut id: NodeId) -> (usize, Vec<&CString>) {
        let mut names = Vec::new();
        let mut root = 0;
        while let Some(node) = self.node(id) {
            root = node.root;
            match node.parent {
                Some(parent) => {
                    names.push(&node.name);
                    id = parent;
                }
                None => break,
            }
        }
        (root, names)
    }

    fn set_file(&mut self, id: NodeId, name: FileName, line: &[u8]) {
        let Some(node) = self.node_mut(id) else {
            return;
        };
        if node.files.insert(name, line.into()).is_none() {
            self.files += 1;
        }
    }

    fn remove_file(&mut self, id: NodeId, name: &FileName) {
        let Some(node) = self.node_mut(id) else {
            return;
        };
        if node.files.remove(name).is_some() {
            self.files -= 1;
        }
    }

    /// The index cannot vouch for `path`: purges scan until a rebuild
    /// succeeds. Logged once, on becoming incomplete.
    fn mark_incomplete(&mut self, path: &Path, err: &io::Error) {
        self.set_incomplete(format!("{}: {err}", path.display()));
    }

    fn set_incomplete(&mut self, reason: String) {
        if self.incomplete.is_none() {
            tracing::warn!(%reason, "cache index incomplete: purges scan until it is rebuilt");
            self.incomplete = Some(reason);
        }
    }

    /// Take in the failures of a scan; whether there were any.
    fn absorb(&mut self, failures: Failures) -> bool {
        let result = failures.finish(PurgeStats::default());
        if let Err(e) = &result {
            self.set_incomplete(e.to_string());
        }
        result.is_err()
    }

    /// Read every queued event; returns the names to re-read. Forgets, at
    /// once, directories that were deleted, moved or replaced, so no
    /// stale node answers for them.
    fn drain(&mut self) -> BTreeSet<(NodeId, CString)> {
        let mut raw: Vec<(i32, ReadFlags, Option<CString>)> = Vec::new();
        {
            let mut reader = inotify::Reader::new(self.inotify.as_fd(), &mut self.events);
            loop {
                match reader.next() {
                    Ok(event) => raw.push((
                        event.wd(),
                        event.events(),
                        event.file_name().map(CStr::to_owned),
                    )),
                    Err(Errno::AGAIN) => break,
                    Err(Errno::INTR) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cache index: reading inotify failed; rebuilding");
                        self.overflowed = true;
                        break;
                    }
                }
            }
        }
        let mut pending = BTreeSet::new();
        for (wd, mask, name) in raw {
            if mask.intersects(ReadFlags::QUEUE_OVERFLOW | ReadFlags::UNMOUNT) {
                tracing::warn!(?mask, "cache index: inotify lost events; rebuilding");
                self.overflowed = true;
                return pending;
            }
            let Some(&id) = self.by_wd.get(&wd) else {
                continue;
            };
            match name {
                Some(name) => {
                    if mask.intersects(STRUCTURAL) {
                        let subdir = self.node(id).and_then(|n| n.subdirs.get(&name).copied());
                        if let Some(subdir) = subdir {
                            self.drop_subtree(subdir);
                        }
                    }
                    pending.insert((id, name));
                }
                None if mask.intersects(SELF_GONE) => {
                    if let Some(node) = self.node(id)
                        && let Some(parent) = node.parent
                    {
                        pending.insert((parent, node.name.clone()));
                    }
                    // A configured dir is looked up again by `scan_roots`.
                    self.drop_subtree(id);
                }
                None => {}
            }
        }
        pending
    }

    /// Add a scanned directory (and its subtree) under `parent`; returns
    /// its id, `None` in the absurd case of a directory that contains
    /// itself (a bind mount), which is then left out.
    fn insert(
        &mut self,
        scanned: Scanned,
        root: usize,
        parent: Option<NodeId>,
        depth: usize,
    ) -> Option<NodeId> {
        let mut stale = Vec::new();
        let id = self.insert_tree(scanned, root, parent, depth, &mut stale);
        // Dropped only now, so no id is reused while the tree is linked.
        for stale in stale {
            self.drop_subtree(stale);
        }
        self.node(id).is_some().then_some(id)
    }

    fn insert_tree(
        &mut self,
        scanned: Scanned,
        root: usize,
        parent: Option<NodeId>,
        depth: usize,
        stale: &mut Vec<NodeId>,
    ) -> NodeId {
        let Scanned {
            name,
            id: dev_ino,
            wd,
            files,
            subdirs,
        } = scanned;
        self.files += files.len() as u64;
        let node = Node {
            root,
            parent,
            name: name.clone(),
            depth,
            id: dev_ino,
            wd,
            files: files.into_iter().collect(),
            subdirs: BTreeMap::new(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                NodeId::try_from(self.nodes.len() - 1).unwrap_or(NodeId::MAX)
            }
        };
        if let Some(parent) = parent.and_then(|p| self.node_mut(p)) {
            parent.subdirs.insert(name, id);
        }
        if let Some(wd) = wd {
            // The kernel keeps one watch per inode: the same directory
            // indexed elsewhere before (moved since, its events not read
            // yet) is stale there. That node goes; the watch is this one's.
            if let Some(old) = self.by_wd.insert(wd, id)
                && old != id
            {
                stale.push(old);
            }
        }
        for sub in subdirs {
            self.insert_tree(sub, root, Some(id), depth + 1, stale);
        }
        id
    }

    /// Forget a directory and everything below it, removing the watches it
    /// owns, and unlink it from its parent.
    fn drop_subtree(&mut self, id: NodeId) {
        let Some(node) = self.nodes.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        self.free.push(id);
        self.files -= node.files.len() as u64;
        if let Some(wd) = node.wd
            && self.by_wd.get(&wd) == Some(&id)
        {
            self.by_wd.remove(&wd);
            // Fails harmlessly when the kernel already removed it.
            let _ = inotify::remove_watch(&self.inotify, wd);
        }
        if let Some(parent) = node.parent.and_then(|p| self.node_mut(p))
            && parent.subdirs.get(&node.name) == Some(&id)
        {
            parent.subdirs.remove(&node.name);
        }
        for (_, sub) in node.subdirs {
            self.drop_subtree(sub);
        }
        if let Some(root) = self.roots.iter_mut().find(|r| **r == Some(id)) {
            *root = None;
        }
    }
}

fn new_inotify() -> io::Result<OwnedFd> {
    Ok(inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?)
}

/// Watch the open directory `dir`. Through `/proc/self/fd`, so the watch
/// lands on the very directory that will be listed, whatever happened to
/// its path since it was opened; by path (not following a final symlink)
/// where `/proc` is not mounted. `None`: the directory is gone.
fn watch(inotify: BorrowedFd<'_>, dir: BorrowedFd<'_>, path: &Path) -> io::Result<Option<i32>> {
    static PROC: OnceLock<bool> = OnceLock::new();
    let watched = if *PROC.get_or_init(|| Path::new("/proc/self/fd").is_dir()) {
        let by_fd = format!("/proc/self/fd/{}", dir.as_raw_fd());
        inotify::add_watch(inotify, by_fd.as_str(), WATCH)
    } else {
        inotify::add_watch(inotify, path, WATCH | WatchFlags::DONT_FOLLOW)
    };
    match watched {
        Ok(wd) => Ok(Some(wd)),
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Watch, then list and read, a directory and (in parallel) its
/// subdirectories. Watching first is what makes the index complete: a
/// change after the watch is an event, one before it is in what is read.
fn scan(
    inotify: BorrowedFd<'_>,
    dir: OwnedFd,
    path: &Path,
    name: CString,
    depth: usize,
    failures: &Failures,
) -> Option<Scanned> {
    let id = failures.ok(path, fd_dev_ino(dir.as_fd()))?;
    // A directory that cannot be watched is still listed: the index is
    // incomplete anyway (purges scan), and a rebuild may fix it later.
    let wd = match watch(inotify, dir.as_fd(), path) {
        Ok(Some(wd)) => Some(wd),
        // Removed since it was opened: its parent's event says so.
        Ok(None) => return None,
        Err(e) => {
            failures.record(path, &e);
            None
        }
    };
    let listing = failures.ok(path, list(dir))?;
    let dir = listing.dir.as_fd();
    let read = |names: &[CString]| {
        let mut buf = Vec::new();
        let mut files = Vec::new();
        for name in names {
            match examine(dir, name, &mut buf) {
                Ok(Examined::Key(line)) => files.push((FileName::new(name), buf[line].into())),
                Ok(_) => {}
                Err(e) => failures.record(&child(path, name), &e),
            }
        }
        files
    };
    let files = if listing.files.len() > 256 {
        listing.files.par_chunks(256).flat_map_iter(read).collect()
    } else {
        read(&listing.files)
    };
    let subdirs = if depth < MAX_DEPTH {
        listing
            .subdirs
            .par_iter()
            .filter_map(|sub| {
                let sub_path = child(path, sub);
                match open_subdir(dir, sub.as_c_str()) {
                    Ok(Some(fd)) => scan(inotify, fd, &sub_path, sub.clone(), depth + 1, failures),
                    Ok(None) => None,
                    Err(e) => {
                        failures.record(&sub_path, &e);
                        None
                    }
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    Some(Scanned {
        name,
        id,
        wd,
        files,
        subdirs,
    })
}

#[cfg(test)]
mod tests;
