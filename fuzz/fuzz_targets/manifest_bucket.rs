//! Bytes → a manifest bucket's string as an edge's Redis may hold it
//! (format 3: `key NUL 40-hex` records, `edgestate::manifest`).
//!
//! Checks: nothing panics; the records read before any error re-encode
//! to the input's prefix they came from, and a string that parses whole
//! re-encodes to itself; an error's offset is the start of the first
//! record not read.
#![no_main]

use edgestate::manifest::{BucketError, parse, push_record, records};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = Vec::new();
    let mut failed = None;
    for r in records(data) {
        match r {
            Ok((key, hash)) => {
                assert!(!key.contains(&0));
                push_record(&mut out, key, hash);
            }
            Err(e) => failed = Some(e),
        }
    }
    assert_eq!(&data[..out.len()], out.as_slice());
    match failed {
        None => {
            assert_eq!(out.len(), data.len());
            assert!(parse(data).is_ok());
        }
        Some(BucketError::Truncated { offset } | BucketError::NotHex { offset }) => {
            assert_eq!(offset, out.len());
            assert!(parse(data).is_err());
        }
    }
});
