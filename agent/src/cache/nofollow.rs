//! Filesystem access below a cache directory that never follows a symlink.
//!
//! Everything below a configured cache dir is reached through directory
//! file descriptors, one component at a time, with `O_NOFOLLOW`: a symlink
//! (to a file or to a directory) is never opened, read, descended into or
//! removed, and no path is ever resolved twice, so an entry swapped for a
//! symlink between two steps cannot redirect a purge outside the cache.
//! Removal is `unlinkat(parent_fd, name)`, which removes the directory
//! entry itself and never what a symlink points to.
//!
//! "Vanished" outcomes (`ENOENT`, and `ELOOP`/`ENOTDIR`/`ENXIO`, which here
//! mean the entry is now a symlink, a non-directory or a socket) are not
//! errors: a cache changes while it is scanned, and such an entry is simply
//! not a cache file (any more).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RawDir};
use rustix::io::Errno;

use super::file::read_key_line;

/// Directory kinds as the scanners care about them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    /// Symlinks, FIFOs, sockets, devices: never touched.
    Other,
}

impl Kind {
    fn of(file_type: FileType) -> Kind {
        match file_type {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            _ => Kind::Other,
        }
    }
}

/// Identity of a directory, to notice one replaced by another at a path.
pub(crate) type DevIno = (u64, u64);

fn vanished(e: Errno) -> bool {
    matches!(e, Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::NXIO)
}

/// Open a configured cache directory. This one path is resolved normally
/// (it may be a symlink: it is the operator's configuration); `None` if it
/// does not exist.
pub(crate) fn open_root(path: &Path) -> io::Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Open the subdirectory `name` of `dir`; `None` if it is gone, is a
/// symlink or is not a directory.
pub(crate) fn open_subdir(
    dir: BorrowedFd<'_>,
    name: impl rustix::path::Arg,
) -> io::Result<Option<OwnedFd>> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if vanished(e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Open the directory reached from `root` through `names`, each opened
/// with `O_NOFOLLOW`; `None` if a component is gone or not a directory.
pub(crate) fn open_beneath<N: rustix::path::Arg>(
    root: BorrowedFd<'_>,
    names: impl IntoIterator<Item = N>,
) -> io::Result<Option<OwnedFd>> {
    let mut fd: Option<OwnedFd> = None;
    for name in names {
        let parent = fd.as_ref().map_or(root, AsFd::as_fd);
        match open_subdir(parent, name)? {
            Some(next) => fd = Some(next),
            None => return Ok(None),
        }
    }
    match fd {
        Some(fd) => Ok(Some(fd)),
        // No component: the root itself, as a descriptor of its own.
        None => rustix::io::fcntl_dupfd_cloexec(root, 0)
            .map(Some)
            .map_err(Into::into),
    }
}

/// What reading one entry as a cache file gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Examined {
    /// Gone, or not a regular file (symlink, FIFO, directory…): not looked at.
    Skipped,
    /// A regular file that is not a cache file.
    NotCache,
    /// A cache file; the range of its `KEY: <key>` line in the buffer.
    Key(Range<usize>),
}

/// Whether `O_NOATIME` is worth trying: it is refused (`EPERM`) for files
/// the agent does not own, and then never tried again.
static NOATIME: AtomicBool = AtomicBool::new(true);

/// Read the `KEY:` line of the regular file `name` in `dir` into `buf`.
///
/// `O_NOATIME` where allowed: a purge scan must not turn every read into an
/// inode write. `O_NONBLOCK`: a FIFO swapped in must not block the scan.
pub(crate) fn examine(dir: BorrowedFd<'_>, name: &CStr, buf: &mut Vec<u8>) -> io::Result<Examined> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let mut opened = Err(Errno::PERM);
    if NOATIME.load(Ordering::Relaxed) {
        opened = rustix::fs::openat(dir, name, flags | OFlags::NOATIME, Mode::empty());
        if matches!(opened, Err(Errno::PERM)) {
            NOATIME.store(false, Ordering::Relaxed);
        }
    }
    if matches!(opened, Err(Errno::PERM)) {
        opened = rustix::fs::openat(dir, name, flags, Mode::empty());
    }
    let fd = match opened {
        Ok(fd) => fd,
        Err(e) if vanished(e) => return Ok(Examined::Skipped),
        Err(e) => return Err(e.into()),
    };
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Ok(Examined::Skipped);
    }
    let range = read_key_line(&mut File::from(fd), stat.st_size.unsigned_abs(), buf)?;
    Ok(range.map_or(Examined::NotCache, Examined::Key))
}

/// Remove the entry `name` of `dir`; `false` if it was already gone (or is
/// now a directory, which a file purge never removes).
pub(crate) fn unlink(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT | Errno::ISDIR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The kind of the entry `name` of `dir` (not following a symlink), and its
/// identity; `None` if it does not exist.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<(Kind, DevIno)>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some((
            Kind::of(FileType::from_raw_mode(st.st_mode)),
            dev_ino(&st),
        ))),
        Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The identity of an open directory.
pub(crate) fn fd_dev_ino(fd: BorrowedFd<'_>) -> io::Result<DevIno> {
    Ok(dev_ino(&rustix::fs::fstat(fd)?))
}

/// The identity of what `path` resolves to (following symlinks, as for a
/// configured root); `None` if nothing is there.
pub(crate) fn path_dev_ino(path: &Path) -> io::Result<Option<DevIno>> {
    match rustix::fs::stat(path) {
        Ok(st) => Ok(Some(dev_ino(&st))),
        Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[allow(
    clippy::useless_conversion,
    reason = "st_dev/st_ino are u32 on some targets"
)]
fn dev_ino(st: &rustix::fs::Stat) -> DevIno {
    (u64::from(st.st_dev), u64::from(st.st_ino))
}

/// The entries of a directory, without `.` and `..`, and the directory's
/// descriptor to open them relative to.
pub(crate) struct Listing {
    pub(crate) dir: OwnedFd,
    pub(crate) files: Vec<CString>,
    pub(crate) subdirs: Vec<CString>,
}

/// List `dir`. Entries whose type the filesystem does not report in
/// `d_type` are `lstat`ed; symlinks and special files are left out.
pub(crate) fn list(dir: OwnedFd) -> io::Result<Listing> {
    // `getdents64` straight into a stack buffer: no allocation per entry
    // but the kept names, and no second descriptor.
    let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
    let mut entries = RawDir::new(dir.as_fd(), &mut buf);
    let (mut files, mut subdirs) = (Vec::new(), Vec::new());
    while let Some(entry) = entries.next() {
        let entry = match entry {
            Ok(entry) => entry,
            // The directory was removed while being listed: it is empty.
            Err(Errno::NOENT) => break,
            Err(e) => return Err(e.into()),
        };
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => match stat_at(dir.as_fd(), name)? {
                Some((kind, _)) => kind,
                None => continue,
            },
            known => Kind::of(known),
        };
        match kind {
            Kind::File => files.push(name.to_owned()),
            Kind::Dir => subdirs.push(name.to_owned()),
            Kind::Other => {}
        }
    }
    Ok(Listing {
        dir,
        files,
        subdirs,
    })
}

#[cfg(test)]
mod tests;
