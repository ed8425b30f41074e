//! nginx's `levels=` parameter and the path of a cache key.
//!
//! nginx names a cache file after the lower-case hex md5 of its key and
//! takes the directory names from the **end** of that hex string
//! (`ngx_create_hashed_filename`): with `levels=1:2`, md5
//! `b7f54b2df7773722d382f4809d65029c` lives at `c/29/b7f5…029c`. Knowing
//! this is what makes an exact-key purge O(1): no scan, one path.

use std::ffi::CStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use md5::{Digest, Md5};

/// Most levels nginx accepts (`NGX_MAX_PATH_LEVEL`).
const MAX_LEVELS: usize = edgestate::purge::MAX_LEVELS;

/// Length of a cache file's name: the hex md5 of the key.
pub(crate) const NAME_LEN: usize = 32;

/// A parsed nginx `levels` value such as `1:2`: one to three directory
/// levels, each named by one or two hex characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Levels {
    /// Characters per level, first level first; only `lens[..count]` is used.
    lens: [u8; MAX_LEVELS],
    count: u8,
}

impl Levels {
    /// Parse nginx's syntax: `1`, `2`, `1:2`, `2:2`, `1:1:2`, …
    ///
    /// # Errors
    /// Empty input, more than three levels, or a level other than `1`/`2`
    /// (nginx refuses the same).
    pub fn parse(s: &str) -> Result<Levels, LevelsError> {
        let parsed = edgestate::purge::parse_levels(s)?;
        let mut lens = [0; MAX_LEVELS];
        lens[..parsed.len()].copy_from_slice(&parsed);
        Ok(Levels {
            lens,
            count: u8::try_from(parsed.len()).unwrap_or(0),
        })
    }

    /// Characters per level, first (outermost) level first: `[1, 2]` for
    /// `1:2`.
    #[must_use]
    pub fn lens(&self) -> &[u8] {
        &self.lens[..usize::from(self.count)]
    }

    /// Where nginx stores `key` under the cache directory `dir`:
    /// `dir/<levels…>/<md5 hex>`.
    #[must_use]
    pub fn path_for(&self, dir: &Path, key: &str) -> PathBuf {
        self.path_for_bytes(dir, key.as_bytes())
    }

    /// [`Levels::path_for`] for a key that is not UTF-8 (nginx keys are
    /// bytes).
    #[must_use]
    pub fn path_for_bytes(&self, dir: &Path, key: &[u8]) -> PathBuf {
        let name = hashed_name(key);
        let mut path = dir.to_path_buf();
        for part in self.dir_names(&name) {
            path.push(part);
        }
        path.push(name.as_str());
        path
    }

    /// The level directory names for a file name, outermost first, each
    /// taken from the end of the name as nginx does.
    pub(crate) fn dir_names<'a>(&self, name: &'a HexName) -> impl Iterator<Item = &'a str> {
        let s = name.as_str();
        let mut end = NAME_LEN;
        self.lens().iter().map(move |&len| {
            let start = end - usize::from(len);
            let part = &s[start..end];
            end = start;
            part
        })
    }
}

impl FromStr for Levels {
    type Err = LevelsError;

    fn from_str(s: &str) -> Result<Levels, LevelsError> {
        Levels::parse(s)
    }
}

impl fmt::Display for Levels {
    /// nginx's syntax, so `parse(x.to_string()) == x`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, len) in self.lens().iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{len}")?;
        }
        Ok(())
    }
}

/// The lower-case hex md5 of a key: a cache file's name, NUL-terminated
/// so it can be handed to the `*at` system calls as it is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct HexName([u8; NAME_LEN + 1]);

impl HexName {
    pub(crate) fn as_str(&self) -> &str {
        // Only ever filled with ASCII hex digits by `hashed_name`.
        std::str::from_utf8(&self.0[..NAME_LEN]).unwrap_or_default()
    }

    pub(crate) fn as_c_str(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.0).unwrap_or_default()
    }
}

/// The file name nginx gives `key`: its md5 in lower-case hex.
pub(crate) fn hashed_name(key: &[u8]) -> HexName {
    hex_name(&Md5::digest(key).into())
}

/// The lower-case hex of an md5 digest.
pub(crate) fn hex_name(digest: &[u8; 16]) -> HexName {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0; NAME_LEN + 1];
    for (i, byte) in digest.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 0xf)];
    }
    HexName(out)
}

pub use edgestate::purge::{LevelsError, LevelsErrorKind};

#[cfg(test)]
mod tests;
