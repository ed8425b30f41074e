//! Reading the small local files the agent is pointed at (the health
//! snapshot, metric sources): regular files only, opened non-blocking so
//! a fifo or a device can neither hang a thread (and with it SIGTERM)
//! nor fill memory, and read up to a bound.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a file could not be read.
#[derive(Debug)]
pub enum FileError {
    Io(std::io::Error),
    /// A fifo, socket, device or directory.
    NotRegular,
    /// Larger than the bound (bytes).
    TooBig(u64),
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::Io(e) => write!(f, "{e}"),
            FileError::NotRegular => write!(
                f,
                "not a regular file (a fifo, device or socket is never read)"
            ),
            FileError::TooBig(max) => write!(f, "larger than {max} bytes"),
        }
    }
}

impl std::error::Error for FileError {}

/// The text of the regular file at `path`, at most `max` bytes.
///
/// # Errors
/// [`FileError`]: cannot open, not a regular file, too big, not UTF-8.
pub fn read_regular(path: &Path, max: u64) -> Result<String, FileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        // Opening a fifo for reading blocks until a writer comes: not with
        // O_NONBLOCK. Reads of a regular file ignore the flag.
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits().cast_signed())
        .open(path)
        .map_err(FileError::Io)?;
    let meta = file.metadata().map_err(FileError::Io)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular);
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(FileError::Io)?;
    if bytes.len() as u64 > max {
        return Err(FileError::TooBig(max));
    }
    String::from_utf8(bytes).map_err(|_| {
        FileError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not UTF-8",
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_and_big_files_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        assert!(matches!(
            read_regular(&fifo, 100),
            Err(FileError::NotRegular)
        ));
        assert!(matches!(
            read_regular(Path::new("/dev/zero"), 100),
            Err(FileError::NotRegular)
        ));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; 101]).unwrap();
        assert!(matches!(
            read_regular(&big, 100),
            Err(FileError::TooBig(100))
        ));
        std::fs::write(&big, "{}").unwrap();
        assert_eq!(read_regular(&big, 100).unwrap(), "{}");
    }
}
