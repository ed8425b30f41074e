//! [`Prefix`], the std-only CIDR block a table is built from, and
//! [`LpmError`], everything that can be wrong with a prefix or a table.
//!
//! The library keeps to std types so that this wire-format crate does not
//! pull `ipnet` into every reader; callers holding an `ipnet::IpNet`
//! convert with `Prefix::new(net.network(), net.prefix_len())`.

use std::error::Error;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP prefix (CIDR block): a network address and a prefix length.
///
/// A `Prefix` is always canonical: the length fits the family (≤ 32 for
/// IPv4, ≤ 128 for IPv6) and every bit after the length is zero, so two
/// prefixes covering the same addresses compare equal. The derived order
/// sorts IPv4 before IPv6, then by address, then shorter first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl Prefix {
    /// The prefix `addr/len`.
    ///
    /// # Errors
    ///
    /// [`LpmError::PrefixTooLong`] if `len` exceeds the family's width and
    /// [`LpmError::HostBitsSet`] if `addr` has bits set after `len` (as in
    /// `10.0.0.1/8`): such input is usually a typo for a host route, so it
    /// is refused rather than silently widened. Use [`Prefix::truncate`]
    /// to clear the host bits on purpose.
    pub fn new(addr: impl Into<IpAddr>, len: u8) -> Result<Self, LpmError> {
        let addr = addr.into();
        let truncated = Self::truncate(addr, len)?;
        if truncated.addr == addr {
            Ok(truncated)
        } else {
            Err(LpmError::HostBitsSet { addr, len })
        }
    }

    /// The prefix of length `len` that contains `addr`: the bits after
    /// `len` are cleared.
    ///
    /// # Errors
    ///
    /// [`LpmError::PrefixTooLong`] if `len` exceeds the family's width.
    pub fn truncate(addr: impl Into<IpAddr>, len: u8) -> Result<Self, LpmError> {
        let addr = addr.into();
        let addr = match addr {
            IpAddr::V4(a) if len <= 32 => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask4(len))),
            IpAddr::V6(a) if len <= 128 => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask6(len))),
            _ => return Err(LpmError::PrefixTooLong { addr, len }),
        };
        Ok(Self { addr, len })
    }

    /// The network address (all host bits zero).
    #[must_use]
    pub const fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits: 0 to 32 for IPv4, 0 to 128 for IPv6.
    #[must_use]
    pub const fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether `addr` lies in this prefix. Families never mix here: an
    /// IPv4-mapped IPv6 address is not in an IPv4 prefix (the table's
    /// lookup, not this method, applies the mapped-address rule).
    #[must_use]
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, addr) {
            (IpAddr::V4(net), IpAddr::V4(a)) => u32::from(a) & mask4(self.len) == u32::from(net),
            (IpAddr::V6(net), IpAddr::V6(a)) => u128::from(a) & mask6(self.len) == u128::from(net),
            _ => false,
        }
    }

    /// The same block as an IPv4 prefix when this is an IPv6 prefix inside
    /// `::ffff:0:0/96` (IPv4-mapped addresses); otherwise `self`. The table
    /// looks mapped addresses up as IPv4, so it stores such routes as IPv4
    /// too.
    pub(super) fn unmapped(self) -> Self {
        match self.addr {
            IpAddr::V6(a) if self.len >= 96 => match a.to_ipv4_mapped() {
                Some(v4) => Self {
                    addr: IpAddr::V4(v4),
                    len: self.len - 96,
                },
                None => self,
            },
            _ => self,
        }
    }
}

/// The network mask of an IPv4 prefix of length `len` (≤ 32).
pub(super) fn mask4(len: u8) -> u32 {
    // `checked_shl` because a shift by the full width (len 0) overflows.
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

/// The network mask of an IPv6 prefix of length `len` (≤ 128).
pub(super) fn mask6(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

impl fmt::Display for Prefix {
    /// `address/length`, the form [`Prefix::from_str`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = LpmError;

    /// Reads `address/length`, e.g. `10.0.0.0/8` or `2a02:6b8::/32`. The
    /// length is required (a bare address is not a route) and must be
    /// plain decimal digits.
    ///
    /// # Errors
    ///
    /// [`LpmError::Syntax`] for text of another shape, and the errors of
    /// [`Prefix::new`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || LpmError::Syntax {
            input: s.to_owned(),
        };
        let (addr, len) = s.split_once('/').ok_or_else(syntax)?;
        // `u8::from_str` would also take "+8"; a CIDR length is digits only.
        if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let addr: IpAddr = addr.parse().map_err(|_| syntax())?;
        let len: u8 = len.parse().map_err(|_| syntax())?;
        Self::new(addr, len)
    }
}

/// Why a prefix or a table was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LpmError {
    /// Text that is not `address/length`.
    Syntax {
        /// The text as given.
        input: String,
    },
    /// A length over 32 for IPv4 or over 128 for IPv6.
    PrefixTooLong {
        /// The address as given.
        addr: IpAddr,
        /// The length as given.
        len: u8,
    },
    /// Bits set after the prefix length, as in `10.0.0.1/8`.
    HostBitsSet {
        /// The address as given.
        addr: IpAddr,
        /// The length as given.
        len: u8,
    },
    /// The same prefix twice in one table. Which of the two should win is
    /// a configuration decision (two zones claiming one network), not
    /// something input order should settle, so the table refuses it.
    DuplicatePrefix {
        /// The prefix, as stored: an IPv4-mapped IPv6 route appears as its
        /// IPv4 equivalent.
        prefix: Prefix,
        /// Position of the earlier occurrence in the input.
        first: usize,
        /// Position of the later occurrence in the input.
        second: usize,
    },
    /// A value above [`crate::lpm::Lpm::MAX_VALUE`].
    ValueTooLarge {
        /// Position of the route in the input.
        position: usize,
        /// The value as given.
        value: u32,
    },
    /// More routes than [`crate::lpm::Lpm::MAX_ROUTES`].
    TooManyRoutes {
        /// The limit that was exceeded.
        max: usize,
    },
}

impl fmt::Display for LpmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax { input } => {
                write!(f, "invalid CIDR prefix {input:?}: expected address/length")
            }
            Self::PrefixTooLong { addr, len } => {
                let max = if addr.is_ipv4() { 32 } else { 128 };
                write!(f, "invalid CIDR prefix {addr}/{len}: length exceeds {max}")
            }
            Self::HostBitsSet { addr, len } => {
                write!(f, "invalid CIDR prefix {addr}/{len}: host bits set")?;
                // Always `Ok` for this variant; a suggestion is only a bonus.
                match Prefix::truncate(*addr, *len) {
                    Ok(net) => write!(f, " (did you mean {net}?)"),
                    Err(_) => Ok(()),
                }
            }
            Self::DuplicatePrefix {
                prefix,
                first,
                second,
            } => write!(
                f,
                "duplicate prefix {prefix} (routes #{first} and #{second})"
            ),
            Self::ValueTooLarge { position, value } => write!(
                f,
                "route #{position}: value {value} exceeds {}",
                crate::lpm::Lpm::MAX_VALUE
            ),
            Self::TooManyRoutes { max } => write!(f, "more than {max} routes in one table"),
        }
    }
}

impl Error for LpmError {}
