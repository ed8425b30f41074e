//! Longest-prefix match: which route covers a viewer's address most
//! specifically (CDN zones; README, "Routing decisions, explained offline").
//!
//! [`Lpm`] maps IPv4 and IPv6 [`Prefix`]es to `u32` values (zone
//! indices) and answers [`Lpm::lookup`] with the value of the longest
//! prefix that contains the address. It is built once from the whole route
//! list and then only read, so threads can share it without locks; a
//! changed route list means a new table. Only std is used.
//!
//! # Semantics
//!
//! - **Longest wins**, across all values: `10.2.77.5` against `10.0.0.0/8`,
//!   `10.2.0.0/16` and `10.2.77.0/24` gets the `/24`'s value.
//! - **`/0` routes** (`0.0.0.0/0`, `::/0`) are ordinary routes: they match
//!   every address of their family, as the seed's "general route" needs.
//! - **Families stay apart**: an IPv4 route never matches an IPv6 address
//!   and the other way round — except for IPv4-mapped IPv6 addresses
//!   (`::ffff:a.b.c.d`), which are the IPv4 client `a.b.c.d` seen through a
//!   dual-stack socket and are looked up as IPv4 (against IPv4 routes
//!   only; `::/0` does not match them). For the same reason an IPv6 route
//!   inside `::ffff:0:0/96` is stored as the equivalent IPv4 route.
//!   IPv4-compatible addresses (`::a.b.c.d`, deprecated) are plain IPv6.
//! - **Duplicate prefixes are an error** ([`LpmError::DuplicatePrefix`],
//!   with both input positions), even with equal values: two zones
//!   claiming one network is a configuration conflict, and letting input
//!   order pick the winner would make routing depend on file order.
//! - Prefixes are canonical (host bits clear): [`Prefix::new`] refuses
//!   `10.0.0.1/8`.
//!
//! # Structure
//!
//! Prefixes nest or are disjoint, so a route list cuts each family's
//! address space into at most `2n + 1` intervals on which the answer is
//! constant (fewer: neighbours with equal values merge). A lookup is then
//! "which interval holds the address", a search in a sorted array of
//! (first address, value) entries — with no per-bit walk, no pointer
//! chasing, and no prefix expansion (a DIR-24-8 table expands every
//! `/25`–`/32` route into a 256-entry chunk: over 300 MiB for a million
//! random routes). The search is made short the way DXR (Zec, Rizzo,
//! Mikuc 2012) does it, with a **directory** indexed by the top bits of
//! the address: a slot holds the position of the interval in effect at
//! the slot's first address, and the address's own interval is that one
//! or one of the next few. A lookup reads the slot, then compares the
//! address with a fixed **window** of 8 entries (64 bytes) from there and
//! counts those that start at or before it — the same work for every
//! address and no branch on the data, so the processor overlaps
//! consecutive lookups instead of stalling on mispredicted comparisons.
//! That is two dependent memory reads per lookup. The few slots that more
//! intervals meet than a window holds are flagged; their runs are halved
//! down to two windows, then counted. (Module `ranges`.)
//!
//! The directory's width follows the number of intervals (about four per
//! slot for IPv4, one for IPv6; at most 2^20 slots), so memory is linear
//! in the routes: about 9 bytes per IPv4 interval and 20 per IPv6 one, and
//! an empty or ten-route table takes a few hundred bytes, with no
//! fixed-size array.
//!
//! IPv6 uses the same tables over the **top 64 bits**: every route up to
//! `/64` starts and ends on a `/64` boundary, so the top table answers
//! those alone. A `/64` block in which a longer route starts or ends gets
//! a table of its own over the low 64 bits, and the top table's interval
//! for that block refers to it (a flag bit in the answer), which costs a
//! second search only for addresses in such blocks.
//!
//! # Cost
//!
//! Build: one sort of the routes, then linear passes. Measured by
//! `cargo bench -p edgestate --bench lpm` (1M random IPv4 prefixes
//! `/8`–`/32` plus 100k random IPv6 prefixes `/16`–`/64`, against
//! `prefix-trie` in the same run; 2-core AMD EPYC VM):
//!
//! | | build | memory | v4 uniform | v4 in-prefix | v6 uniform | v6 in-prefix |
//! |---|---|---|---|---|---|---|
//! | `Lpm` | 0.08 s | 18.7 MiB | ~40 ns | ~45 ns | ~14 ns | ~18 ns |
//! | `prefix-trie` 0.10 | 0.2 s | ~42 MiB | ~140 ns | ~370 ns | ~37 ns | ~300 ns |
//!
//! (Median time per lookup in a stream of independent lookups.) The IPv4
//! part is 14.6 MiB (1.65M intervals, 2 MiB of it directory), the IPv6
//! part 4.0 MiB. While building, the heap peaks at about three times the
//! final size. A table of ten routes takes under 400 bytes and answers
//! in about 5 ns.

mod prefix;
mod ranges;
#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use prefix::{LpmError, Prefix};
use prefix::{mask4, mask6};
use ranges::{Point, Ranges, Span, boundaries, set_bound};

/// Flag in an IPv6 top-table answer: the rest is the index of the
/// sub-table for the low 64 bits.
const SUB: u32 = 1 << 31;

/// The answer "no route": the one answer below [`SUB`] that is not a
/// value ([`Lpm::MAX_VALUE`] is one less).
const NONE: u32 = SUB - 1;

/// A longest-prefix-match table from IPv4 and IPv6 prefixes to `u32`
/// values, such as zone indices.
///
/// The values live inside the table's intervals, so the lookup's last
/// memory read already holds the answer, in 8 bytes per IPv4 interval.
/// A generic value type would need either a value array indexed by route
/// (a third dependent cache miss per lookup on big tables) or wider
/// entries (an `Option<V>` beside each key); map the value to anything
/// else with a slice (`&zones[value as usize]`).
///
/// See the [module documentation](self) for the matching rules and the
/// structure.
///
/// ```
/// use edgestate::lpm::{Lpm, Prefix};
///
/// let zones = ["eu", "nyc", "v6"];
/// let table = Lpm::new([
///     ("10.0.0.0/8".parse::<Prefix>()?, 0),
///     ("10.2.0.0/16".parse()?, 1),
///     ("::/0".parse()?, 2),
/// ])?;
/// let zone = |ip: &str| table.lookup(ip.parse().unwrap()).map(|z| zones[z as usize]);
/// assert_eq!(zone("10.2.3.4"), Some("nyc"));
/// assert_eq!(zone("10.9.3.4"), Some("eu"));
/// assert_eq!(zone("::ffff:10.9.3.4"), Some("eu"));
/// assert_eq!(zone("2001:db8::1"), Some("v6"));
/// assert_eq!(zone("192.0.2.1"), None);
/// # Ok::<(), edgestate::lpm::LpmError>(())
/// ```
#[derive(Clone)]
pub struct Lpm {
    /// Number of routes the table was built from.
    routes: usize,
    /// One table over IPv4 addresses; answers are values or [`NONE`].
    v4: Ranges<u32, u32>,
    /// Table 0 over the top 64 bits of IPv6 addresses, then one table over
    /// the low 64 bits per `/64` block that holds longer routes; answers
    /// are values, [`NONE`], or (table 0 only) [`SUB`] and a table index.
    v6: Ranges<u64, u32>,
}

impl Lpm {
    /// The most routes one table takes: 2^28, far beyond any routing
    /// table, and small enough that every internal index fits in 31 bits.
    pub const MAX_ROUTES: usize = 1 << 28;

    /// The largest value a route may carry, `2^31 - 2`: the table keeps
    /// one bit and one value for itself.
    pub const MAX_VALUE: u32 = NONE - 1;

    /// Builds the table from `(prefix, value)` routes, IPv4 and IPv6 in any
    /// order.
    ///
    /// # Errors
    ///
    /// [`LpmError::DuplicatePrefix`] if a prefix occurs twice (an
    /// IPv4-mapped IPv6 prefix and its IPv4 equivalent count as the same),
    /// [`LpmError::ValueTooLarge`] for a value above [`Lpm::MAX_VALUE`],
    /// [`LpmError::TooManyRoutes`] beyond [`Lpm::MAX_ROUTES`].
    pub fn new<I>(routes: I) -> Result<Self, LpmError>
    where
        I: IntoIterator<Item = (Prefix, u32)>,
    {
        // (network as a number, length, position in the input), per family.
        let mut v4: Vec<(u32, u8, u32)> = Vec::new();
        let mut v6: Vec<(u128, u8, u32)> = Vec::new();
        let mut values: Vec<u32> = Vec::new();
        for (position, (prefix, value)) in routes.into_iter().enumerate() {
            if position >= Self::MAX_ROUTES {
                return Err(LpmError::TooManyRoutes {
                    max: Self::MAX_ROUTES,
                });
            }
            if value > Self::MAX_VALUE {
                return Err(LpmError::ValueTooLarge { position, value });
            }
            // Below MAX_ROUTES (2^28), so the cast is lossless.
            #[allow(clippy::cast_possible_truncation)]
            let position = position as u32;
            let prefix = prefix.unmapped();
            let len = prefix.prefix_len();
            match prefix.addr() {
                IpAddr::V4(a) => v4.push((u32::from(a), len, position)),
                IpAddr::V6(a) => v6.push((u128::from(a), len, position)),
            }
            values.push(value);
        }

        let v4 = spans(
            v4,
            &values,
            |start, len| start | !mask4(len),
            |start, len| Prefix::truncate(Ipv4Addr::from(start), len),
        )?;
        let v6 = spans(
            v6,
            &values,
            |start, len| start | !mask6(len),
            |start, len| Prefix::truncate(Ipv6Addr::from(start), len),
        )?;

        Ok(Self {
            routes: values.len(),
            v4: build_v4(&boundaries(&v4, NONE)),
            v6: build_v6(&boundaries(&v6, NONE)),
        })
    }

    /// The value of the longest prefix containing `addr`, if any.
    /// IPv4-mapped IPv6 addresses are looked up as IPv4 (see the module
    /// documentation).
    #[inline]
    #[must_use]
    pub fn lookup(&self, addr: IpAddr) -> Option<u32> {
        match addr {
            IpAddr::V4(a) => self.lookup_v4(a),
            IpAddr::V6(a) => self.lookup_v6(a),
        }
    }

    /// [`Lpm::lookup`] for an IPv4 address.
    #[inline]
    #[must_use]
    pub fn lookup_v4(&self, addr: Ipv4Addr) -> Option<u32> {
        value(*self.v4.find(0, u32::from(addr)))
    }

    /// [`Lpm::lookup`] for an IPv6 address; an IPv4-mapped one
    /// (`::ffff:a.b.c.d`) is looked up as the IPv4 address.
    #[inline]
    #[must_use]
    pub fn lookup_v6(&self, addr: Ipv6Addr) -> Option<u32> {
        let bits = u128::from(addr);
        // The casts split the address; dropping the upper bits is the point.
        #[allow(clippy::cast_possible_truncation)]
        let (high, low, embedded_v4) = ((bits >> 64) as u64, bits as u64, bits as u32);
        if bits >> 32 == 0xffff {
            return self.lookup_v4(Ipv4Addr::from(embedded_v4));
        }
        let mut answer = *self.v6.find(0, high);
        if answer & SUB != 0 {
            answer = *self.v6.find((answer & !SUB) as usize, low);
        }
        value(answer)
    }

    /// Number of routes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.routes
    }

    /// Whether the table has no routes (every lookup answers `None`).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.routes == 0
    }

    /// Heap bytes held by the table.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.v4.heap_bytes() + self.v6.heap_bytes()
    }
}

/// A final answer (never a [`SUB`] reference) as the caller sees it.
#[inline]
fn value(answer: u32) -> Option<u32> {
    (answer != NONE).then_some(answer)
}

impl Default for Lpm {
    /// The table without routes.
    fn default() -> Self {
        Self {
            routes: 0,
            v4: build_v4(&[(0, NONE)]),
            v6: build_v6(&[(0, NONE)]),
        }
    }
}

impl fmt::Debug for Lpm {
    /// A summary: a big table's contents are no use in a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lpm")
            .field("routes", &self.len())
            .field("heap_bytes", &self.heap_bytes())
            .finish_non_exhaustive()
    }
}

/// Sorts one family's prefixes, outer first for equal starts, refuses
/// duplicates and returns them as key intervals with their values.
/// `end(start, len)` is the last key a prefix covers, `prefix(start, len)`
/// the prefix itself (for the error).
fn spans<P: Point>(
    mut prefixes: Vec<(P, u8, u32)>,
    values: &[u32],
    end: impl Fn(P, u8) -> P,
    prefix: impl Fn(P, u8) -> Result<Prefix, LpmError>,
) -> Result<Vec<Span<P, u32>>, LpmError> {
    prefixes.sort_unstable_by_key(|&(start, len, _)| (start, len));
    if let Some(w) = prefixes
        .windows(2)
        .find(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1))
    {
        let (start, len) = (w[0].0, w[0].1);
        let (first, second) = (w[0].2.min(w[1].2), w[0].2.max(w[1].2));
        return Err(LpmError::DuplicatePrefix {
            prefix: prefix(start, len)?,
            first: first as usize,
            second: second as usize,
        });
    }
    Ok(prefixes
        .into_iter()
        .map(|(start, len, position)| Span {
            start,
            end: end(start, len),
            answer: values[position as usize],
        })
        .collect())
}

/// The IPv4 table from its intervals.
fn build_v4(bounds: &[(u32, u32)]) -> Ranges<u32, u32> {
    let mut ranges = Ranges::default();
    ranges.push_table(bounds);
    ranges.shrink_to_fit();
    ranges
}

/// The IPv6 tables from the intervals over the whole 128-bit space: a top
/// table over the high 64 bits, and a table over the low 64 bits for each
/// `/64` block that an interval starts inside of.
fn build_v6(bounds: &[(u128, u32)]) -> Ranges<u64, u32> {
    #[allow(clippy::cast_possible_truncation)] // the point: split in halves
    let split = |key: u128| ((key >> 64) as u64, key as u64);
    let mut top: Vec<(u64, u32)> = Vec::new();
    // The sub-tables' intervals back to back, and where each one starts.
    let mut sub_bounds: Vec<(u64, u32)> = Vec::new();
    let mut sub_starts: Vec<usize> = Vec::new();
    // The answer in effect just before the block being looked at.
    let mut before = NONE;
    let mut rest = bounds;
    while let Some(&(first, _)) = rest.first() {
        let high = split(first).0;
        let n = rest.iter().take_while(|b| split(b.0).0 == high).count();
        let (block, tail) = rest.split_at(n);
        rest = tail;
        let last = block[n - 1].1;
        if n == 1 && split(first).1 == 0 {
            // Constant over the whole /64 and beyond: an ordinary interval.
            set_bound(&mut top, high, last);
        } else {
            // Something changes inside this /64: the top table sends its
            // addresses to a table of their own over the low 64 bits.
            sub_starts.push(sub_bounds.len());
            if split(first).1 != 0 {
                sub_bounds.push((0, before));
            }
            sub_bounds.extend(block.iter().map(|&(key, v)| (split(key).1, v)));
            // At most one sub-table per IPv6 route end point, below 2^29
            // (`Lpm::MAX_ROUTES`): the cast is lossless.
            #[allow(clippy::cast_possible_truncation)]
            let table = sub_starts.len() as u32;
            set_bound(&mut top, high, SUB | table);
            // The block's last answer carries on at the next /64, unless
            // the next block starts with an interval of its own there.
            if let Some(next) = high.checked_add(1) {
                top.push((next, last));
            }
        }
        before = last;
    }
    // Sub-table references are unique, so only plain answers can merge.
    top.dedup_by(|next, prev| next.1 == prev.1);

    let mut ranges = Ranges::default();
    ranges.push_table(&top);
    sub_starts.push(sub_bounds.len());
    for w in sub_starts.windows(2) {
        ranges.push_table(&sub_bounds[w[0]..w[1]]);
    }
    ranges.shrink_to_fit();
    ranges
}
