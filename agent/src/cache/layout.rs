//! A node's cache directories, purged by computing paths and by scanning.
//!
//! [`Layout::purge_keys`] needs no scan: a key's path follows from its md5
//! and `levels`. [`Layout::purge_matching`] is the seed's `grep -rlP` done
//! right: every directory is walked in parallel (rayon), and of each file
//! only the header up to the `KEY:` line is read — not the body, which is
//! both most of grep's time and the source of its false matches. It is the
//! reference behaviour [`Index`](super::Index) must reproduce, and its
//! fallback.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::file::{KEY_START, LINE_START};
use super::levels::{HexName, Levels, hashed_name};
use super::nofollow::{Examined, examine, list, open_beneath, open_root, open_subdir, unlink};
use super::{Failures, PurgeStats};

/// How deep below a cache dir the scans look. nginx uses at most three
/// levels; this bounds the recursion on a pathological tree.
pub(crate) const MAX_DEPTH: usize = 16;

/// Above this many files, one directory's files are read in parallel too
/// (a cache without `levels` keeps them all in one directory).
const PAR_FILES: usize = 256;

/// The cache directories of one node and their nginx `levels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The `proxy_cache_path` directories (absolute), each with the same
    /// `levels`.
    pub dirs: Vec<PathBuf>,
    /// Their `levels=` parameter.
    pub levels: Levels,
}

impl Layout {
    /// A layout of `dirs`, all with `levels`.
    #[must_use]
    pub fn new(dirs: Vec<PathBuf>, levels: Levels) -> Layout {
        Layout { dirs, levels }
    }

    /// Remove the cache files of exactly these keys, from every dir.
    ///
    /// O(1) per key and dir: the path follows from the key's md5 and
    /// `levels`. A file is removed only if it is a regular file (reached
    /// without following any symlink) whose header holds exactly this key:
    /// an md5 collision or a foreign file at that path is left alone. A key
    /// with no file is not an error. Files holding the key at another path
    /// (an nginx temp file, another `levels`) are not looked for: nginx
    /// never serves them for this key.
    ///
    /// # Errors
    /// A dir, level dir or file that exists but cannot be opened, read or
    /// removed; every other key and dir is still purged first.
    pub fn purge_keys(&self, keys: &[&str]) -> io::Result<PurgeStats> {
        let failures = Failures::default();
        let names: Vec<HexName> = keys.iter().map(|k| hashed_name(k.as_bytes())).collect();
        let mut stats = PurgeStats::default();
        let mut buf = Vec::new();
        for dir in &self.dirs {
            let root = match open_root(dir) {
                Ok(Some(root)) => root,
                Ok(None) => continue,
                Err(e) => {
                    failures.record(dir, &e);
                    continue;
                }
            };
            for (key, name) in keys.iter().zip(&names) {
                stats +=
                    self.purge_key(root.as_fd(), dir, key.as_bytes(), name, &mut buf, &failures);
            }
        }
        failures.finish(stats)
    }

    fn purge_key(
        &self,
        root: BorrowedFd<'_>,
        dir: &Path,
        key: &[u8],
        name: &HexName,
        buf: &mut Vec<u8>,
        failures: &Failures,
    ) -> PurgeStats {
        let path = || self.levels.path_for_bytes(dir, key);
        let parent = match open_beneath(root, self.levels.dir_names(name)) {
            Ok(Some(parent)) => parent,
            Ok(None) => return PurgeStats::default(),
            Err(e) => {
                failures.record(&path(), &e);
                return PurgeStats::default();
            }
        };
        let name = name.as_c_str();
        match examine(parent.as_fd(), name, buf) {
            Ok(Examined::Skipped) => PurgeStats::default(),
            Ok(Examined::NotCache) => PurgeStats {
                removed: 0,
                scanned: 1,
            },
            Ok(Examined::Key(line)) => {
                let same = buf[line].get(KEY_START - LINE_START..) == Some(key);
                let removed = same && remove(parent.as_fd(), name, &path(), failures);
                PurgeStats {
                    removed: u64::from(removed),
                    scanned: 1,
                }
            }
            Err(e) => {
                failures.record(&path(), &e);
                PurgeStats::default()
            }
        }
    }

    /// Remove every cache file whose `KEY:` line matches, from every dir.
    ///
    /// `matches` gets the line exactly as `grep` sees it in the file: the
    /// bytes `KEY: <key>`, without the newline (so the seed's
    /// `KEY:.*example\.com`, compiled with `regex::bytes`, works as it
    /// did). Unlike grep it never sees the body or the upstream headers,
    /// which grep also matched (over-purging).
    ///
    /// Walks each dir in parallel to any depth up to 16, never following a
    /// symlink (to a file or a directory), reading only regular files and
    /// of each only the header. Files and directories that vanish during
    /// the walk are skipped; a missing dir purges nothing. Only files are
    /// removed, never directories.
    ///
    /// # Errors
    /// An entry that exists but cannot be listed, read or removed (for
    /// example `EACCES`); the rest of the walk still runs first.
    pub fn purge_matching(&self, matches: impl Fn(&[u8]) -> bool + Sync) -> io::Result<PurgeStats> {
        let failures = Failures::default();
        let stats = self
            .dirs
            .par_iter()
            .map(|dir| match open_root(dir) {
                Ok(Some(root)) => purge_tree(root, dir, 0, &matches, &failures),
                Ok(None) => PurgeStats::default(),
                Err(e) => {
                    failures.record(dir, &e);
                    PurgeStats::default()
                }
            })
            .reduce(PurgeStats::default, |a, b| a + b);
        failures.finish(stats)
    }
}

/// The entry `name` of the directory at `dir`.
pub(crate) fn child(dir: &Path, name: &CStr) -> PathBuf {
    dir.join(OsStr::from_bytes(name.to_bytes()))
}

/// Unlink `name`; whether it was removed (a failure is recorded).
pub(crate) fn remove(dir: BorrowedFd<'_>, name: &CStr, path: &Path, failures: &Failures) -> bool {
    unlink(dir, name).unwrap_or_else(|e| {
        failures.record(path, &e);
        false
    })
}

fn purge_tree<F>(
    dir: OwnedFd,
    path: &Path,
    depth: usize,
    matches: &F,
    failures: &Failures,
) -> PurgeStats
where
    F: Fn(&[u8]) -> bool + Sync,
{
    let listing = match list(dir) {
        Ok(listing) => listing,
        Err(e) => {
            failures.record(path, &e);
            return PurgeStats::default();
        }
    };
    let dir = listing.dir.as_fd();
    let files = |names: &[CString]| {
        let mut buf = Vec::new();
        let mut stats = PurgeStats::default();
        for name in names {
            stats += purge_file(dir, path, name, &mut buf, matches, failures);
        }
        stats
    };
    let mut stats = if listing.files.len() > PAR_FILES {
        listing
            .files
            .par_chunks(PAR_FILES)
            .map(files)
            .reduce(PurgeStats::default, |a, b| a + b)
    } else {
        files(&listing.files)
    };
    if depth < MAX_DEPTH {
        stats += listing
            .subdirs
            .par_iter()
            .map(|name| {
                let sub = child(path, name);
                match open_subdir(dir, name.as_c_str()) {
                    Ok(Some(fd)) => purge_tree(fd, &sub, depth + 1, matches, failures),
                    Ok(None) => PurgeStats::default(),
                    Err(e) => {
                        failures.record(&sub, &e);
                        PurgeStats::default()
                    }
                }
            })
            .reduce(PurgeStats::default, |a, b| a + b);
    }
    stats
}

fn purge_file<F>(
    dir: BorrowedFd<'_>,
    path: &Path,
    name: &CStr,
    buf: &mut Vec<u8>,
    matches: &F,
    failures: &Failures,
) -> PurgeStats
where
    F: Fn(&[u8]) -> bool + Sync,
{
    match examine(dir, name, buf) {
        Ok(Examined::Skipped) => PurgeStats::default(),
        Ok(Examined::NotCache) => PurgeStats {
            removed: 0,
            scanned: 1,
        },
        Ok(Examined::Key(line)) => {
            let removed = matches(&buf[line]) && remove(dir, name, &child(path, name), failures);
            PurgeStats {
                removed: u64::from(removed),
                scanned: 1,
            }
        }
        Err(e) => {
            failures.record(&child(path, name), &e);
            PurgeStats::default()
        }
    }
}

#[cfg(test)]
mod tests;
