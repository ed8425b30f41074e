//! One manifest bucket as stored (format 3): `edgeform:manifest:<bb>` is a
//! string, the bucket's entries sorted by key, each record
//! `<key> NUL <content hash>` with the hash 40 lowercase hex digits (SHA-1
//! of the value, what `redis.sha1hex` gives). Records follow each other
//! with no separator: the NUL ends the key, the hash has a fixed length.
//! Managed keys never contain NUL (the control plane refuses to write one).
//!
//! Pure: building a bucket's string and reading one back. What comes back
//! from an edge's Redis is untrusted: a truncated record, a key with no
//! NUL, a hash that is not hex are [`BucketError`]s, never a panic.

use std::fmt;

/// Length of a content hash in a record: SHA-1 as lowercase hex.
pub const HASH_LEN: usize = 40;

/// Append one record to a bucket's string.
pub fn push_record(out: &mut Vec<u8>, key: &[u8], hash: &[u8]) {
    out.extend_from_slice(key);
    out.push(0);
    out.extend_from_slice(hash);
}

/// Bytes of one record of `key`.
#[must_use]
pub fn record_len(key: &[u8]) -> usize {
    key.len() + 1 + HASH_LEN
}

/// Why a bucket's string is not a sequence of records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketError {
    /// The record starting at this byte offset has no NUL after its key, or
    /// fewer than [`HASH_LEN`] bytes after the NUL (cut short).
    Truncated { offset: usize },
    /// The hash of the record starting at this byte offset is not
    /// lowercase hex.
    NotHex { offset: usize },
}

impl fmt::Display for BucketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BucketError::Truncated { offset } => {
                write!(f, "a record cut short at byte {offset}")
            }
            BucketError::NotHex { offset } => write!(
                f,
                "the record at byte {offset} has a hash that is not {HASH_LEN} lowercase hex digits"
            ),
        }
    }
}

impl std::error::Error for BucketError {}

/// The records of a bucket's string, in stored order: `(key, hash)`.
#[must_use]
pub fn records(bytes: &[u8]) -> Records<'_> {
    Records { bytes, at: 0 }
}

/// Iterator over a bucket's records ([`records`]); stops after the first
/// error.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, BucketError>;

    fn next(&mut self) -> Option<Self::Item> {
        let offset = self.at;
        let rest = self.bytes.get(offset..).filter(|r| !r.is_empty())?;
        let parsed = parse_one(rest).map_err(|e| match e {
            Bad::Truncated => BucketError::Truncated { offset },
            Bad::NotHex => BucketError::NotHex { offset },
        });
        match parsed {
            Ok((key, hash)) => {
                self.at += record_len(key);
                Some(Ok((key, hash)))
            }
            Err(e) => {
                self.at = self.bytes.len();
                Some(Err(e))
            }
        }
    }
}

enum Bad {
    Truncated,
    NotHex,
}

fn parse_one(rest: &[u8]) -> Result<Record<'_>, Bad> {
    let nul = rest.iter().position(|&b| b == 0).ok_or(Bad::Truncated)?;
    let hash = rest
        .get(nul + 1..nul + 1 + HASH_LEN)
        .ok_or(Bad::Truncated)?;
    if !hash.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(Bad::NotHex);
    }
    Ok((&rest[..nul], hash))
}

/// One record: `(key, hash)`, borrowed from the bucket's string.
pub type Record<'a> = (&'a [u8], &'a [u8]);

/// Every record of a bucket's string, or the first error.
///
/// # Errors
/// [`BucketError`] when the string is not a sequence of whole records.
pub fn parse(bytes: &[u8]) -> Result<Vec<Record<'_>>, BucketError> {
    records(bytes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const H1: &[u8] = b"a9993e364706816aba3e25717850c26c9cd0d89d";
    const H2: &[u8] = b"da39a3ee5e6b4b0d3255bfef95601890afd80709";

    fn bucket() -> Vec<u8> {
        let mut out = Vec::new();
        push_record(&mut out, b"edgeform:routing", H1);
        push_record(&mut out, b"site:a.example.com", H2);
        push_record(&mut out, b"", H1);
        out
    }

    #[test]
    fn records_round_trip() {
        let b = bucket();
        assert_eq!(
            b.len(),
            record_len(b"edgeform:routing") + record_len(b"site:a.example.com") + record_len(b"")
        );
        assert_eq!(
            parse(&b).unwrap(),
            vec![
                (&b"edgeform:routing"[..], H1),
                (&b"site:a.example.com"[..], H2),
                (&b""[..], H1)
            ]
        );
        assert_eq!(parse(b"").unwrap(), Vec::<Record>::new());
    }

    #[test]
    fn a_string_cut_anywhere_is_an_error_or_whole_records() {
        let b = bucket();
        let ends = [
            record_len(b"edgeform:routing"),
            record_len(b"edgeform:routing") + record_len(b"site:a.example.com"),
        ];
        for cut in 1..b.len() {
            let got = parse(&b[..cut]);
            if ends.contains(&cut) {
                assert!(got.is_ok(), "cut at {cut}");
            } else {
                let at = if cut < ends[0] {
                    0
                } else if cut < ends[1] {
                    ends[0]
                } else {
                    ends[1]
                };
                assert_eq!(got, Err(BucketError::Truncated { offset: at }), "cut {cut}");
            }
        }
    }

    #[test]
    fn garbage_is_an_error() {
        assert_eq!(
            parse(b"no nul byte at all"),
            Err(BucketError::Truncated { offset: 0 })
        );
        let mut upper = Vec::new();
        push_record(&mut upper, b"k", H1);
        push_record(&mut upper, b"k2", &H1.to_ascii_uppercase());
        assert_eq!(parse(&upper), Err(BucketError::NotHex { offset: 42 }));
        let mut nul_in_hash = Vec::new();
        push_record(&mut nul_in_hash, b"k", &[0; HASH_LEN]);
        assert_eq!(parse(&nul_in_hash), Err(BucketError::NotHex { offset: 0 }));
        // The iterator stops after its first error.
        let mut tail = bucket();
        tail.extend_from_slice(b"site:x\0abc");
        let all: Vec<_> = records(&tail).collect();
        assert_eq!(all.len(), 4);
        assert!(all[3].is_err());
        // Every byte string parses or errs: a sweep of short inputs.
        for n in 0..=255u8 {
            let junk: Vec<u8> = (0..u16::from(n) * 3).map(|i| (i as u8) ^ n).collect();
            let _ = parse(&junk);
        }
        assert_eq!(
            BucketError::Truncated { offset: 7 }.to_string(),
            "a record cut short at byte 7"
        );
    }
}
