//! Range tables: the key space cut into intervals with one answer each,
//! found through a directory on the top bits and one fixed-size window.
//!
//! A set of prefixes splits the key space into at most `2n + 1` maximal
//! intervals on which the longest match does not change ([`boundaries`]).
//! A table stores each interval as an [`Entry`] (its first key and the
//! answer), sorted. The top `bits` of a key index a directory whose slot
//! holds the position of the interval in effect at the slot's first key;
//! the key's own interval is that one or one of the next few, so a lookup
//! compares the key with a fixed window of entries from there
//! ([`Ranges::find`]). `bits` grows with the number of intervals, so that
//! few slots see more intervals than a window holds; those few are marked
//! and their runs halved down to two windows before counting.
//!
//! Several tables can share one [`Ranges`] (the IPv6 table keeps one top
//! table plus one per `/64` that holds longer routes), each named by the
//! index of its [`Header`]; sharing the vectors keeps the number of
//! allocations constant however many tables there are.

/// A key type: `u32` for IPv4 addresses, `u64` for either half of an IPv6
/// address.
pub(super) trait Key: Copy + Ord + Default {
    /// The largest key, the key of the padding after a table.
    const MAX: Self;
    /// How many entries a lookup compares at once (see [`Ranges::find`]).
    const WINDOW: usize;
    /// Average number of intervals per directory slot that the sizing aims
    /// at (see [`dir_bits`]).
    const PER_SLOT: usize;
    /// The top `bits` bits (`bits` ≤ [`MAX_DIR_BITS`]) as a slot number.
    fn slot(self, bits: u32) -> usize;
    /// The first key of slot `slot` in a directory of `bits` bits.
    fn slot_start(slot: usize, bits: u32) -> Self;
}

macro_rules! impl_key {
    ($t:ty, window: $w:expr, per_slot: $p:expr) => {
        impl Key for $t {
            const MAX: Self = <$t>::MAX;
            const WINDOW: usize = $w;
            const PER_SLOT: usize = $p;

            #[inline]
            fn slot(self, bits: u32) -> usize {
                // Two shifts rather than `>> (BITS - bits)`: for `bits == 0`
                // that would shift by the full width (an overflow); this way
                // no branch is needed on the lookup path. The result has at
                // most MAX_DIR_BITS bits, so the cast cannot truncate.
                ((self >> 1) >> (<$t>::BITS - 1 - bits)) as usize
            }

            // `slot < 2^MAX_DIR_BITS` fits every key type.
            #[allow(clippy::cast_possible_truncation)]
            fn slot_start(slot: usize, bits: u32) -> Self {
                if bits == 0 {
                    0
                } else {
                    (slot as $t) << (<$t>::BITS - bits)
                }
            }
        }
    };
}
// Tuned with `cargo bench -p edgestate --bench lpm` (1M IPv4 routes give
// 1.65M intervals). IPv4: 8-byte entries, so a window is 64 bytes; four
// intervals per slot keep the directory at 2 MiB, and about 1% of slots
// overflow the window. Two per slot (a 4 MiB directory) was slower: the
// directory competes with the entries for cache. Eight per slot was no
// faster, with a third of the slots overflowing. IPv6: 16-byte entries,
// so a window of 4 is again 64 bytes.
impl_key!(u32, window: 8, per_slot: 4);
impl_key!(u64, window: 4, per_slot: 1);

/// The most directory bits a table gets: 2^20 slots are 4 MiB. Bigger
/// tables get more intervals per slot instead, and more slots take the
/// slower path ([`LONG`]).
pub(super) const MAX_DIR_BITS: u32 = 20;

/// Flag in a directory entry: more intervals meet the slot than a window
/// holds (see [`Ranges::find_long`]).
const LONG: u32 = 1 << 31;

/// One interval of a table: from `key` up to the next entry's key, the
/// answer is `answer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry<K, A> {
    /// First key of the interval.
    key: K,
    /// What a lookup of a key in the interval returns.
    answer: A,
}

/// Where one table lives inside a [`Ranges`].
#[derive(Clone, Copy, Debug)]
struct Header {
    /// Directory width: the top `bits` of a key pick the slot.
    bits: u32,
    /// Index of the table's first directory slot in [`Ranges::dir`].
    dir: u32,
}

/// Storage for one or more range tables over keys `K` with answers `A`.
#[derive(Clone, Debug)]
pub(super) struct Ranges<K, A> {
    /// Per table, `2^bits + 1` entries: for each slot, the index (in
    /// `entries`) of the interval in effect at the slot's first key, with
    /// [`LONG`] set if more than a window of intervals meet the slot; then
    /// the index of the table's last interval (where the last run ends).
    dir: Vec<u32>,
    /// Every table's intervals, sorted, each table followed by
    /// `WINDOW - 1` padding entries ([`Key::MAX`], last answer) so that a
    /// window never reads past its table.
    entries: Vec<Entry<K, A>>,
    /// The tables, by the index [`Ranges::push_table`] returned.
    headers: Vec<Header>,
}

impl<K, A> Default for Ranges<K, A> {
    fn default() -> Self {
        Self {
            dir: Vec::new(),
            entries: Vec::new(),
            headers: Vec::new(),
        }
    }
}

impl<K: Key, A: Copy> Ranges<K, A> {
    /// Adds a table and returns its index for [`Ranges::find`].
    ///
    /// `bounds` lists the intervals as (first key, answer), sorted by key
    /// with no key twice; it starts at key 0, so that every key has an
    /// answer ("no route" is an answer too), and so is not empty.
    pub(super) fn push_table(&mut self, bounds: &[(K, A)]) -> usize {
        debug_assert!(bounds.first().is_some_and(|b| b.0 == K::default()));
        debug_assert!(bounds.windows(2).all(|w| w[0].0 < w[1].0));
        let bits = dir_bits::<K>(bounds.len());
        let slots = 1usize << bits;
        self.headers.push(Header {
            bits,
            dir: offset(self.dir.len()),
        });
        let base = self.entries.len();
        self.entries.reserve(bounds.len() + K::WINDOW - 1);
        self.entries
            .extend(bounds.iter().map(|&(key, answer)| Entry { key, answer }));
        if let Some(&(_, last)) = bounds.last() {
            let padding = Entry {
                key: K::MAX,
                answer: last,
            };
            self.entries
                .extend(std::iter::repeat_n(padding, K::WINDOW - 1));
        }
        self.dir.reserve(slots + 1);
        // `first`: the last bound at or before the slot's start; `end`: the
        // first bound in a later slot.
        let mut first = 0;
        let mut end = 0;
        for slot in 0..slots {
            let start = K::slot_start(slot, bits);
            while first + 1 < bounds.len() && bounds[first + 1].0 <= start {
                first += 1;
            }
            end = end.max(first + 1);
            while end < bounds.len() && bounds[end].0.slot(bits) == slot {
                end += 1;
            }
            let long = if end - first > K::WINDOW { LONG } else { 0 };
            self.dir.push(offset(base + first) | long);
        }
        self.dir.push(offset(base + bounds.len().saturating_sub(1)));
        self.headers.len() - 1
    }

    /// Gives back spare capacity once every table is in.
    pub(super) fn shrink_to_fit(&mut self) {
        self.dir.shrink_to_fit();
        self.entries.shrink_to_fit();
        self.headers.shrink_to_fit();
    }

    /// The answer of table `table` for `key`.
    ///
    /// One directory read gives the interval in effect at the start of the
    /// key's slot; the key's interval is among it and the next
    /// `WINDOW - 1`, and the number of those starting at or before the key
    /// is its position. Counting compares the whole window, so the work is
    /// the same for every key and no branch depends on the data: the
    /// processor overlaps consecutive lookups instead of stalling on a
    /// mispredicted comparison (a bisection's branches are coin flips),
    /// and each lookup costs two dependent memory reads, the directory slot
    /// and the window. Slots marked [`LONG`], a few percent when the
    /// directory is sized by [`dir_bits`], take [`Ranges::find_long`].
    #[inline]
    pub(super) fn find(&self, table: usize, key: K) -> &A {
        let header = self.headers[table];
        let slot = header.dir as usize + key.slot(header.bits);
        let first = self.dir[slot];
        if first & LONG != 0 {
            return self.find_long(slot, key);
        }
        let first = first as usize;
        let window = &self.entries[first..first + K::WINDOW];
        let at_or_before: usize = window.iter().map(|e| usize::from(e.key <= key)).sum();
        // At least 1: the window starts with the interval in effect at the
        // slot's start, which is at or before `key`.
        &window[at_or_before - 1].answer
    }

    /// [`Ranges::find`] for a slot whose run exceeds the window: halve the
    /// run down to two windows, then count as `find` does. The counting
    /// avoids the last, least predictable bisection steps; on random
    /// tables most long runs are that short to begin with.
    #[cold]
    #[inline(never)]
    fn find_long(&self, slot: usize, key: K) -> &A {
        let first = (self.dir[slot] & !LONG) as usize;
        // Up to the next slot's first interval, inclusive: that one starts
        // at or after the next slot's start, so after `key`.
        let end = (self.dir[slot + 1] & !LONG) as usize + 1;
        // Invariant: run[0].key <= key, and key's interval is in run.
        let mut run = &self.entries[first..end];
        while run.len() > 2 * K::WINDOW {
            let mid = run.len() / 2;
            run = if run[mid].key <= key {
                &run[mid..]
            } else {
                &run[..mid]
            };
        }
        let at_or_before: usize = run.iter().map(|e| usize::from(e.key <= key)).sum();
        &run[at_or_before - 1].answer
    }

    /// Bytes allocated on the heap.
    pub(super) fn heap_bytes(&self) -> usize {
        self.dir.capacity() * size_of::<u32>()
            + self.entries.capacity() * size_of::<Entry<K, A>>()
            + self.headers.capacity() * size_of::<Header>()
    }
}

/// Directory width for a table of `intervals` intervals: at most
/// [`Key::PER_SLOT`] per slot on average, at most [`MAX_DIR_BITS`].
fn dir_bits<K: Key>(intervals: usize) -> u32 {
    let slots = intervals.div_ceil(K::PER_SLOT);
    // ceil(log2(slots)); 0 bits (one slot) for a single one.
    slots.next_power_of_two().trailing_zeros().min(MAX_DIR_BITS)
}

/// An index into `entries` or `dir` as stored. The route limit
/// (`Lpm::MAX_ROUTES`) keeps every table small enough for `u32` without
/// the [`LONG`] bit.
fn offset(n: usize) -> u32 {
    let n = u32::try_from(n).expect("the route limit keeps offsets below 2^31");
    debug_assert!(n & LONG == 0);
    n
}

/// An address as a number while a table is built: `u32` for IPv4, `u128`
/// for IPv6 (split into halves only afterwards). The narrow type keeps the
/// build's temporary vectors small for big IPv4 tables.
pub(super) trait Point: Copy + Ord + Default {
    /// The last address.
    const LAST: Self;
    /// The next address; only called below [`Point::LAST`].
    fn next(self) -> Self;
}

impl Point for u32 {
    const LAST: Self = u32::MAX;
    fn next(self) -> Self {
        self + 1
    }
}

impl Point for u128 {
    const LAST: Self = u128::MAX;
    fn next(self) -> Self {
        self + 1
    }
}

/// A prefix as the closed interval `[start, end]` of addresses it covers,
/// with the answer it gives.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span<P, A> {
    /// First address covered.
    pub(super) start: P,
    /// Last address covered.
    pub(super) end: P,
    /// The prefix's answer.
    pub(super) answer: A,
}

/// Cuts the address space into the maximal intervals on which the longest
/// match is constant: (first address, answer), sorted, starting at 0, no
/// two neighbours with equal answers.
///
/// `spans` must be prefixes (any two are nested or disjoint), sorted by
/// start and, for equal starts, outer (longer span) first, without
/// duplicates. A sweep with a stack of the prefixes that cover the current
/// address then emits an interval start wherever a prefix begins (its
/// answer) or ends (the enclosing prefix's answer, or `none`). Linear
/// after the sort.
pub(super) fn boundaries<P: Point, A: Copy + PartialEq>(
    spans: &[Span<P, A>],
    none: A,
) -> Vec<(P, A)> {
    let mut out = Vec::with_capacity(2 * spans.len() + 1);
    out.push((P::default(), none));
    // The open prefixes (end, answer), outermost first; each is nested in
    // the one below it.
    let mut open: Vec<(P, A)> = Vec::new();
    for span in spans {
        while let Some(&(end, _)) = open.last() {
            if end >= span.start {
                break;
            }
            open.pop();
            let outer = open.last().map_or(none, |o| o.1);
            // `end < span.start`, so `end` is not the last address.
            set_bound(&mut out, end.next(), outer);
        }
        set_bound(&mut out, span.start, span.answer);
        open.push((span.end, span.answer));
    }
    // Close what is left; a prefix ending at the last address has no
    // interval after it.
    while let Some((end, _)) = open.pop() {
        if end < P::LAST {
            let outer = open.last().map_or(none, |o| o.1);
            set_bound(&mut out, end.next(), outer);
        }
    }
    out.dedup_by(|next, prev| next.1 == prev.1);
    out.shrink_to_fit();
    out
}

/// Appends an interval start, or, if the last one starts at the same key,
/// overrides its answer: of several events at one key the last is right
/// (a prefix starting where others end; several nested prefixes ending
/// together, innermost closed first).
pub(super) fn set_bound<T: PartialEq, A>(out: &mut Vec<(T, A)>, key: T, answer: A) {
    match out.last_mut() {
        Some(last) if last.0 == key => last.1 = answer,
        _ => out.push((key, answer)),
    }
}
