use std::path::Path;

use super::*;
use crate::cache::testutil::Rng;

const NGINX_KEY: &str = "http://127.0.0.1:18081/index.html";

#[test]
fn crc32_is_zlibs() {
    assert_eq!(crc32(b""), 0);
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    // Checked against a file a real nginx wrote.
    assert_eq!(crc32(NGINX_KEY.as_bytes()), 0x8880_0c2c);
}

#[test]
fn http_dates() {
    assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
    assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    assert_eq!(http_date(1_767_225_599), "Wed, 31 Dec 2025 23:59:59 GMT");
}

/// The fields checked on a file a real nginx wrote: crc32 and header_start.
#[test]
fn header_matches_nginx_layout() {
    let h = header(NGINX_KEY.as_bytes(), 612, 1_700_000_000).unwrap();
    assert_eq!(u64::from_le_bytes(h[..8].try_into().unwrap()), 5);
    assert_eq!(
        u32::from_le_bytes(h[48..52].try_into().unwrap()),
        0x8880_0c2c
    );
    let header_start = u16::from_le_bytes([h[54], h[55]]);
    let body_start = u16::from_le_bytes([h[56], h[57]]);
    assert_eq!(header_start, 376);
    assert_eq!(usize::from(body_start), h.len());
    assert_eq!(&h[336..342], b"\nKEY: ");
    assert_eq!(&h[342..375], NGINX_KEY.as_bytes());
    assert_eq!(h[375], b'\n');
    assert!(h[376..].starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(h.ends_with(b"\r\n\r\n"));
    let etag_len = usize::from(h[58]);
    assert!(h[59..59 + etag_len].starts_with(b"\"88800c2c-264\""));
    assert_eq!(h[187], 0, "vary_len");
    assert_eq!(parse(&h), Parsed::Key { header_start: 376 });
}

#[test]
fn write_then_read_key() {
    let dir = tempfile::tempdir().unwrap();
    let levels = Levels::parse("1:2").unwrap();
    let path = write_cache_file(dir.path(), &levels, NGINX_KEY, b"<html>hi</html>").unwrap();
    assert_eq!(
        path,
        dir.path().join("3/90/562e7f8cbf8ce5fb4bd32f8006a58903")
    );
    assert_eq!(read_key(&path).unwrap().unwrap(), NGINX_KEY.as_bytes());
    let bytes = fs::read(&path).unwrap();
    assert!(bytes.ends_with(b"\r\n\r\n<html>hi</html>"));
    // Only the file is left behind, no temporary.
    let names: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
    assert_eq!(names.len(), 1);
}

/// A key longer than the first read still comes back whole.
#[test]
fn long_key_needs_a_second_read() {
    let dir = tempfile::tempdir().unwrap();
    let levels = Levels::parse("2").unwrap();
    let key = format!("httpexample.com/{}", "a".repeat(20_000));
    let path = write_cache_file(dir.path(), &levels, &key, b"x").unwrap();
    assert_eq!(read_key(&path).unwrap().unwrap(), key.as_bytes());
}

#[test]
fn key_too_long_for_nginx() {
    let dir = tempfile::tempdir().unwrap();
    let levels = Levels::parse("2").unwrap();
    let key = "k".repeat(70_000);
    let err = write_cache_file(dir.path(), &levels, &key, b"").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn not_cache_files() {
    let dir = tempfile::tempdir().unwrap();
    let valid = header(b"httpexample.com/a", 3, 1_700_000_000).unwrap();
    let mut v4 = valid.clone();
    v4[0] = 4;
    let mut no_marker = valid.clone();
    no_marker[338] = b'x';
    let mut bad_start = valid.clone();
    bad_start[54] = bad_start[54].wrapping_add(1); // header_start past the "\n"
    for (name, bytes) in [
        ("empty", &b""[..]),
        ("text", b"KEY: httpexample.com/a\n"),
        ("v4", &v4),
        ("no-marker", &no_marker),
        ("bad-start", &bad_start),
        ("truncated", &valid[..350]),
    ] {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        assert_eq!(read_key(&path).unwrap(), None, "{name}");
    }
    assert_eq!(read_key(dir.path()).unwrap(), None, "a directory");
    let fifo = dir.path().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        FileType::Fifo,
        Mode::RUSR | Mode::WUSR,
        0,
    )
    .unwrap();
    assert_eq!(read_key(&fifo).unwrap(), None, "a FIFO, without blocking");
}

#[test]
fn errors_name_the_path() {
    let err = read_key(Path::new("/nonexistent/edgeform/x")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains("/nonexistent/edgeform/x"), "{err}");
}

/// `parse` is total: random bytes and mutations of a valid header never
/// panic, and a `Key` answer is always consistent with the bytes.
#[test]
fn parse_never_panics() {
    let mut rng = Rng::new(0x5eed);
    let valid = header(b"httpsexample.com/video/seg-1.m4s", 1000, 1_700_000_000).unwrap();
    let check = |buf: &[u8]| match parse(buf) {
        Parsed::Key { header_start } => {
            assert!(header_start > KEY_START && header_start <= buf.len());
            assert_eq!(buf[header_start - 1], b'\n');
            assert_eq!(&buf[HEADER_LEN..KEY_START], KEY_MARKER);
        }
        Parsed::NeedMore(n) => assert!(n > buf.len()),
        Parsed::NotCache => {}
    };
    for len in 0..=valid.len() {
        check(&valid[..len]);
    }
    for _ in 0..20_000 {
        let mut buf = valid.clone();
        for _ in 0..rng.below(4) + 1 {
            match rng.below(4) {
                0 if !buf.is_empty() => {
                    let at = rng.below(buf.len());
                    buf[at] = rng.byte();
                }
                1 => {
                    // header_start / body_start: the fields that steer reads.
                    let at = [54, 55, 56, 57][rng.below(4)];
                    if let Some(b) = buf.get_mut(at) {
                        *b = rng.byte();
                    }
                }
                2 => buf.truncate(rng.below(buf.len() + 1)),
                _ => buf.extend((0..rng.below(64)).map(|_| rng.byte())),
            }
        }
        check(&buf);
    }
    for _ in 0..2_000 {
        let buf: Vec<u8> = (0..rng.below(1200)).map(|_| rng.byte()).collect();
        check(&buf);
    }
}

/// The same, through the file reader (short reads, `NeedMore` re-reads).
#[test]
fn read_key_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let mut rng = Rng::new(7);
    let valid = header(b"httpexample.com/a.js", 10, 1_700_000_000).unwrap();
    for _ in 0..500 {
        let mut buf = valid.clone();
        let at = [54, 55, 56, 57, rng.below(buf.len())][rng.below(5)];
        buf[at] = rng.byte();
        buf.truncate(rng.below(buf.len() + 1).max(rng.below(buf.len() + 1)));
        fs::write(&path, &buf).unwrap();
        if let Some(key) = read_key(&path).unwrap() {
            assert!(buf.windows(key.len()).any(|w| w == key));
        }
    }
}
