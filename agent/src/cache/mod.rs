//! The nginx proxy cache on disk, and purging it.
//!
//! nginx stores each cached response in one file named after the md5 of its
//! cache key, under `levels` directories taken from the end of that name
//! (nginx's `ngx_http_file_cache_header_t`, version 5). The file opens with a 336-byte binary header followed
//! by the line `KEY: <key>`, so a file's key is known after reading a few
//! hundred bytes — never the body.
//!
//! # Layout
//! - [`Levels`] (`levels.rs`): nginx's `levels=1:2`; key → path.
//! - [`read_key`], [`write_cache_file`] (`file.rs`): the header format; the
//!   writer makes realistic files for tests and benchmarks.
//! - [`Layout`] (`layout.rs`): the configured cache dirs; the two purges by
//!   scanning: exact keys in O(1) each, and a parallel scan for patterns.
//! - [`Index`] (`index.rs`): a key index kept current by inotify, for
//!   pattern purges in milliseconds instead of a scan.
//! - `nofollow.rs`: the `openat`/`O_NOFOLLOW` primitives all of them use.
//!
//! # The purge contract (both [`Layout`] and [`Index`])
//! - **What is removed**: regular files below the configured dirs that are
//!   version-5 nginx cache files whose `KEY: <key>` line matches (pattern
//!   purge) or whose key equals one of the keys and which sit at that key's
//!   nginx path (exact purge). Nothing else: no directory, no foreign file,
//!   no file whose md5 collides with the key.
//! - **Never follows a symlink** below a configured dir (to a file or to a
//!   directory), and never removes anything outside the configured dirs.
//!   A configured dir may itself be a symlink: that is configuration.
//! - **Concurrency with nginx**: files appearing, changing or vanishing
//!   during a purge are fine; whether a file written after the purge
//!   started is removed is unspecified (it holds the new content anyway).
//!   A missing configured dir purges nothing.
//! - **Errors**: a purge does all the work it can, then reports the first
//!   failure (with its path; the others are logged) as an `io::Error`, so a
//!   partly failed purge is never reported as done.
//!
//! All of it is blocking I/O, meant to run on `spawn_blocking`.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

mod file;
mod index;
mod layout;
mod levels;
mod nofollow;

pub use file::{HEADER_LEN, KEY_MARKER, VERSION, read_key, write_cache_file};
pub use index::{Index, IndexStats};
pub use layout::Layout;
pub use levels::{Levels, LevelsError, LevelsErrorKind};

/// What a purge did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PurgeStats {
    /// Cache files removed.
    pub removed: u64,
    /// Files looked at: regular files read by a scan or an exact purge;
    /// for [`Index::purge_matching`], the index entries matched against.
    pub scanned: u64,
}

impl std::ops::Add for PurgeStats {
    type Output = PurgeStats;

    fn add(self, other: PurgeStats) -> PurgeStats {
        PurgeStats {
            removed: self.removed + other.removed,
            scanned: self.scanned + other.scanned,
        }
    }
}

impl std::ops::AddAssign for PurgeStats {
    fn add_assign(&mut self, other: PurgeStats) {
        *self = *self + other;
    }
}

impl fmt::Display for PurgeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} removed of {} scanned", self.removed, self.scanned)
    }
}

/// `err`, its message prefixed with `path` (the kind is kept, so callers
/// can still branch on it).
pub(crate) fn with_path(path: &Path, err: &io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

/// Failures met during one purge: it goes on past each (a purge is
/// idempotent, and removing what it can is better than stopping), logs it,
/// and returns the first at the end.
#[derive(Default)]
pub(crate) struct Failures {
    first: Mutex<Option<io::Error>>,
    count: AtomicU64,
}

impl Failures {
    pub(crate) fn record(&self, path: &Path, err: &io::Error) {
        tracing::warn!(path = %path.display(), error = %err, "cache: cannot read or remove an entry");
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self
            .first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert_with(|| with_path(path, err));
    }

    /// The value of `result`, or `None` with the failure recorded.
    pub(crate) fn ok<T>(&self, path: &Path, result: io::Result<T>) -> Option<T> {
        result.map_err(|e| self.record(path, &e)).ok()
    }

    /// `Ok(stats)` if nothing failed, else the first failure.
    pub(crate) fn finish(self, stats: PurgeStats) -> io::Result<PurgeStats> {
        let count = self.count.into_inner();
        match self
            .first
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            None => Ok(stats),
            Some(first) if count == 1 => {
                Err(io::Error::new(first.kind(), format!("{first} ({stats})")))
            }
            Some(first) => Err(io::Error::new(
                first.kind(),
                format!("{first} (and {} more failures, logged; {stats})", count - 1),
            )),
        }
    }
}

#[cfg(test)]
pub(crate) mod testutil;
