//! One cache file: nginx's binary header up to the `KEY:` line, and a
//! writer of realistic files for tests and benchmarks.
//!
//! The layout (nginx's `ngx_http_file_cache_header_t` in `src/http/ngx_http_cache.h`, version 5,
//! 64-bit builds): a 336-byte binary header, the bytes `"\nKEY: "`, the
//! key, `"\n"`, then the upstream status line and headers up to
//! `body_start`, then the body. `header_start` (u16 at offset 54) points
//! just past the key's `"\n"`, so the key is found without reading — let
//! alone scanning — the body.
//!
//! Only version 5 is accepted: version 4 (nginx before 1.11.10) lacks
//! `updating_sec`/`error_sec`, so its key does not sit at 342 and reading
//! it with this layout would return garbage.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{FileType, Mode, OFlags};

use super::levels::Levels;
use super::with_path;

/// The header version nginx 1.11.10 and later write.
pub const VERSION: u64 = 5;
/// `sizeof(ngx_http_file_cache_header_t)` on 64-bit builds.
pub const HEADER_LEN: usize = 336;
/// What follows the binary header.
pub const KEY_MARKER: &[u8; 6] = b"\nKEY: ";
/// Offset of the key itself.
pub(crate) const KEY_START: usize = HEADER_LEN + KEY_MARKER.len();
/// Offset of the line grep sees, `KEY: <key>` (just past the marker's `\n`).
pub(crate) const LINE_START: usize = HEADER_LEN + 1;

/// Offsets of the header fields this module reads or writes.
const CRC32_AT: usize = 48;
const HEADER_START_AT: usize = 54;
const BODY_START_AT: usize = 56;
const ETAG_LEN_AT: usize = 58;
const ETAG_MAX: usize = 128;

/// Numbers temporary files, so parallel writers never share one.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The first read of a file. One page holds the header and any key of
/// reasonable length; a longer key costs a second read, never a failure.
pub(crate) const FIRST_READ: usize = 4096;

/// What the first bytes of a file say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A cache file; `LINE_START..header_start - 1` is the `KEY: <key>` line.
    Key { header_start: usize },
    /// Looks like a cache file whose key ends past these bytes: read up to
    /// this many bytes and parse again.
    NeedMore(usize),
    /// Not a version-5 cache file (or a truncated one).
    NotCache,
}

/// Parse the start of a file. Total: never panics, whatever the bytes.
pub(crate) fn parse(buf: &[u8]) -> Parsed {
    let (Some(version), Some(marker), Some(header_start), Some(body_start)) = (
        buf.get(..8),
        buf.get(HEADER_LEN..KEY_START),
        buf.get(HEADER_START_AT..HEADER_START_AT + 2),
        buf.get(BODY_START_AT..BODY_START_AT + 2),
    ) else {
        return Parsed::NotCache;
    };
    let version = u64::from_le_bytes(version.try_into().unwrap_or_default());
    let header_start = usize::from(u16::from_le_bytes([header_start[0], header_start[1]]));
    let body_start = usize::from(u16::from_le_bytes([body_start[0], body_start[1]]));
    // nginx writes `header_start = 342 + len(key) + 1` and headers after
    // it; anything else is not a file it wrote.
    if version != VERSION
        || marker != KEY_MARKER
        || header_start <= KEY_START
        || body_start < header_start
    {
        return Parsed::NotCache;
    }
    match buf.get(header_start - 1) {
        None => Parsed::NeedMore(header_start),
        Some(b'\n') => Parsed::Key { header_start },
        Some(_) => Parsed::NotCache,
    }
}

/// Read the `KEY: <key>` line of an open file of `size` bytes into `buf`
/// (reused between calls, to spare an allocation per file) and return its
/// range in `buf`; `None` if the file is not a cache file.
///
/// Reads at most the header: `FIRST_READ` bytes, or `header_start` when
/// the key is longer (at most 64 KiB, as `header_start` is a u16).
pub(crate) fn read_key_line(
    file: &mut File,
    size: u64,
    buf: &mut Vec<u8>,
) -> io::Result<Option<Range<usize>>> {
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let mut want = size.min(FIRST_READ);
    let mut filled = 0;
    loop {
        if buf.len() < want {
            buf.resize(want, 0);
        }
        filled = fill(file, &mut buf[..want], filled)?;
        match parse(&buf[..filled]) {
            Parsed::Key { header_start } => return Ok(Some(LINE_START..header_start - 1)),
            // Only grow once, and only when the file is long enough: a
            // file that shrank under us is simply not a cache file now.
            Parsed::NeedMore(n) if filled == want && want < n && n <= size => want = n,
            Parsed::NeedMore(_) | Parsed::NotCache => return Ok(None),
        }
    }
}

/// Fill `buf[from..]` from `file`; returns how much of `buf` is filled
/// (less than its length only at end of file).
fn fill(file: &mut File, buf: &mut [u8], mut filled: usize) -> io::Result<usize> {
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The key of the cache file at `path`, or `None` if it is not a version-5
/// nginx cache file (too short, another version, no `KEY:` marker, an
/// inconsistent `header_start`, or not a regular file at all).
///
/// Reads only the header (see [`FIRST_READ`](self)), never the body.
/// Follows a symlink at `path`, like `cat`; the purge functions never do.
///
/// # Errors
/// The file cannot be opened or read (the error names `path`).
pub fn read_key(path: &Path) -> io::Result<Option<Vec<u8>>> {
    // NONBLOCK: opening a FIFO must not hang; NOCTTY: nor adopt a terminal.
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let read = || -> io::Result<Option<Vec<u8>>> {
        let fd = rustix::fs::open(path, flags, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        let mut buf = Vec::new();
        let range = read_key_line(&mut File::from(fd), stat.st_size.unsigned_abs(), &mut buf)?;
        Ok(range.map(|line| buf[KEY_START..line.end].to_vec()))
    };
    read().map_err(|e| with_path(path, &e))
}

/// Write a cache file for `key` exactly as nginx lays it out, at
/// `levels.path_for(dir, key)`, creating the level directories; returns
/// its path. **Test and benchmark support**: the agent itself never writes
/// cache files.
///
/// The header is plausible, not just parseable: version 5, `valid_sec`
/// ten minutes ahead, `date`/`last_modified` from the clock, the key's
/// CRC-32, an ETag, no Vary, then `"\nKEY: <key>\n"`, an HTTP/1.1 status
/// line and headers (with `Content-Length`), and `body`. Like nginx, it
/// writes a temporary file in the same directory and renames it into
/// place, so a reader never sees a half-written file at the final path.
///
/// # Errors
/// A key too long for nginx's u16 offsets (`InvalidInput`), or any I/O
/// error creating the directories or the file (the error names the path).
pub fn write_cache_file(
    dir: &Path,
    levels: &Levels,
    key: &str,
    body: &[u8],
) -> io::Result<PathBuf> {
    let path = levels.path_for(dir, key);
    let bytes = header(key.as_bytes(), body.len(), unix_now())?;
    let parent = path.parent().unwrap_or(dir);
    fs::create_dir_all(parent).map_err(|e| with_path(parent, &e))?;
    let tmp = path.with_extension(format!(
        "{}.{}.tmp",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let write = || -> io::Result<()> {
        let mut file = File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.write_all(body)?;
        drop(file);
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        with_path(&path, &e)
    })?;
    Ok(path)
}

/// The bytes nginx writes before the body: binary header, key line, HTTP
/// status line and headers.
pub(crate) fn header(key: &[u8], body_len: usize, now: i64) -> io::Result<Vec<u8>> {
    let crc = crc32(key);
    let etag = format!("\"{crc:x}-{body_len:x}\"");
    let http = format!(
        "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: {date}\r\nContent-Type: {ctype}\r\n\
         Content-Length: {body_len}\r\nLast-Modified: {modified}\r\nConnection: close\r\n\
         ETag: {etag}\r\nCache-Control: max-age=600\r\nAccept-Ranges: bytes\r\n\r\n",
        date = http_date(now),
        ctype = content_type(key),
        modified = http_date(now - 86_400),
    );
    let too_long = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "cache key too long for nginx's header",
        )
    };
    let header_start = u16::try_from(KEY_START + key.len() + 1).map_err(|_| too_long())?;
    let body_start =
        u16::try_from(usize::from(header_start) + http.len()).map_err(|_| too_long())?;

    let mut out = Vec::with_capacity(usize::from(body_start));
    out.extend_from_slice(&VERSION.to_le_bytes());
    // valid_sec, updating_sec, error_sec, last_modified, date.
    for field in [now + 600, 0, 0, now - 86_400, now] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    debug_assert_eq!(out.len(), CRC32_AT);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // valid_msec
    out.extend_from_slice(&header_start.to_le_bytes());
    out.extend_from_slice(&body_start.to_le_bytes());
    debug_assert_eq!(out.len(), ETAG_LEN_AT);
    let etag = &etag.as_bytes()[..etag.len().min(ETAG_MAX)];
    out.push(etag.len().try_into().unwrap_or(0));
    out.extend_from_slice(etag);
    // The rest — etag padding, vary_len = 0, vary, variant and the struct
    // padding — is zero, as nginx's calloc'd header has it without Vary.
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(KEY_MARKER);
    out.extend_from_slice(key);
    out.push(b'\n');
    out.extend_from_slice(http.as_bytes());
    Ok(out)
}

/// A plausible `Content-Type` from the key's extension.
fn content_type(key: &[u8]) -> &'static str {
    let ext = key.rsplit(|&b| b == b'.').next().unwrap_or_default();
    match ext {
        b"html" | b"htm" => "text/html",
        b"css" => "text/css",
        b"js" => "application/javascript",
        b"json" => "application/json",
        b"jpg" | b"jpeg" => "image/jpeg",
        b"png" => "image/png",
        b"mp4" | b"m4s" => "video/mp4",
        b"ts" => "video/mp2t",
        b"m3u8" => "application/vnd.apple.mpegurl",
        _ => "application/octet-stream",
    }
}

fn unix_now() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) for unix time `t`.
pub(crate) fn http_date(t: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days, for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        DAYS[usize::try_from(days.rem_euclid(7)).unwrap_or(0)],
        MONTHS[usize::try_from(month - 1).unwrap_or(0)],
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
    )
}

/// zlib's CRC-32 (reflected, polynomial 0xEDB88320), as nginx stores for
/// the key. A byte-wise table: the keys are short.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut bit = 0;
            while bit < 8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                bit += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data
        .iter()
        .fold(!0u32, |c, &b| TABLE[usize::from(c as u8 ^ b)] ^ (c >> 8))
}

#[cfg(test)]
mod tests;
