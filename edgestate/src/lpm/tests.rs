//! Tests for [`super::Lpm`]: hand-picked cases as data, then randomized
//! tables checked against a linear scan.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Lpm, LpmError, Prefix};

/// Parses a prefix written in a test.
fn p(s: &str) -> Prefix {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Parses an address written in a test.
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// Builds a table whose values are the route positions.
fn table(routes: &[&str]) -> Lpm {
    Lpm::new(routes.iter().zip(0..).map(|(s, i)| (p(s), i))).unwrap()
}

/// The answer by definition: among the routes containing the address, the
/// longest; IPv4-mapped addresses and routes compare as IPv4. Written
/// without the table's helpers so that a shared mistake cannot hide.
fn naive(routes: &[(Prefix, u32)], addr: IpAddr) -> Option<u32> {
    fn canonical(p: Prefix) -> (IpAddr, u8) {
        match p.addr() {
            IpAddr::V6(a) if p.prefix_len() >= 96 && a.to_ipv4_mapped().is_some() => {
                (IpAddr::V4(a.to_ipv4_mapped().unwrap()), p.prefix_len() - 96)
            }
            a => (a, p.prefix_len()),
        }
    }
    let addr = addr.to_canonical();
    routes
        .iter()
        .filter_map(|(route, v)| {
            let (net, len) = canonical(*route);
            let inside = match (net, addr) {
                (IpAddr::V4(n), IpAddr::V4(a)) => {
                    len == 0 || u32::from(n) >> (32 - len) == u32::from(a) >> (32 - len)
                }
                (IpAddr::V6(n), IpAddr::V6(a)) => {
                    len == 0 || u128::from(n) >> (128 - len) == u128::from(a) >> (128 - len)
                }
                _ => false,
            };
            inside.then_some((len, *v))
        })
        .max_by_key(|&(len, _)| len)
        .map(|(_, v)| v)
}

/// Each case: routes (value = position), then (address, expected route
/// position or `None`).
#[allow(clippy::type_complexity)]
const CASES: &[(&str, &[&str], &[(&str, Option<u32>)])] = &[
    (
        "empty table",
        &[],
        &[("10.0.0.1", None), ("::1", None), ("::ffff:1.2.3.4", None)],
    ),
    (
        "nested /8 /16 /24",
        &["10.0.0.0/8", "10.2.0.0/16", "10.2.77.0/24"],
        &[
            ("10.2.77.5", Some(2)),
            ("10.2.77.0", Some(2)),
            ("10.2.77.255", Some(2)),
            ("10.2.78.0", Some(1)),
            ("10.2.76.255", Some(1)),
            ("10.2.0.0", Some(1)),
            ("10.3.0.0", Some(0)),
            ("10.1.255.255", Some(0)),
            ("10.255.255.255", Some(0)),
            ("11.0.0.0", None),
            ("9.255.255.255", None),
        ],
    ),
    (
        "input order does not matter",
        &["10.2.77.0/24", "10.0.0.0/8", "10.2.0.0/16"],
        &[
            ("10.2.77.5", Some(0)),
            ("10.2.1.1", Some(2)),
            ("10.200.1.1", Some(1)),
        ],
    ),
    (
        "general routes /0",
        &["0.0.0.0/0", "::/0", "192.0.2.0/24", "2001:db8::/32"],
        &[
            ("0.0.0.0", Some(0)),
            ("255.255.255.255", Some(0)),
            ("192.0.2.9", Some(2)),
            ("::", Some(1)),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(1)),
            ("2001:db8:1::1", Some(3)),
            ("2001:db9::", Some(1)),
        ],
    ),
    (
        "host routes /32 /128",
        &[
            "192.0.2.10/32",
            "2001:db8::10/128",
            "255.255.255.255/32",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
            "0.0.0.0/32",
            "::/128",
        ],
        &[
            ("192.0.2.10", Some(0)),
            ("192.0.2.11", None),
            ("192.0.2.9", None),
            ("2001:db8::10", Some(1)),
            ("2001:db8::11", None),
            ("2001:db8::f", None),
            ("255.255.255.255", Some(2)),
            ("255.255.255.254", None),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(3)),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", None),
            ("0.0.0.0", Some(4)),
            ("0.0.0.1", None),
            ("::", Some(5)),
            ("::1", None),
        ],
    ),
    (
        "families stay apart",
        &["0.0.0.0/0", "::/1"],
        &[("1.2.3.4", Some(0)), ("::1", Some(1)), ("8000::", None)],
    ),
    (
        "mapped addresses are IPv4 clients",
        &["10.0.0.0/8", "::/0"],
        &[
            ("::ffff:10.1.2.3", Some(0)),
            ("::ffff:11.1.2.3", None),
            // IPv4-compatible (deprecated) addresses are plain IPv6.
            ("::10.1.2.3", Some(1)),
            ("::fffe:10.1.2.3", Some(1)),
        ],
    ),
    (
        "mapped routes are IPv4 routes",
        &["::ffff:10.0.0.0/104", "::ffff:0.0.0.0/96", "::/0"],
        &[
            ("10.9.9.9", Some(0)),
            ("::ffff:10.9.9.9", Some(0)),
            ("11.0.0.1", Some(1)),
            ("::1", Some(2)),
        ],
    ),
    (
        "IPv6 longer than /64",
        &[
            "2001:db8::/32",
            "2001:db8:0:1::/64",
            "2001:db8:0:1::8000:0/97",
            "2001:db8:0:1::8000:1/128",
            "2001:db8:0:2:8000::/65",
        ],
        &[
            ("2001:db8:0:1::1", Some(1)),
            ("2001:db8:0:1::7fff:ffff", Some(1)),
            ("2001:db8:0:1::8000:0", Some(2)),
            ("2001:db8:0:1::8000:1", Some(3)),
            ("2001:db8:0:1::8000:2", Some(2)),
            ("2001:db8:0:1::ffff:ffff", Some(2)),
            ("2001:db8:0:1::1:0:0", Some(1)),
            ("2001:db8:0:1:ffff:ffff:ffff:ffff", Some(1)),
            ("2001:db8:0:2::", Some(0)),
            ("2001:db8:0:2:7fff:ffff:ffff:ffff", Some(0)),
            ("2001:db8:0:2:8000::", Some(4)),
            ("2001:db8:0:2:ffff:ffff:ffff:ffff", Some(4)),
            ("2001:db8:0:3::", Some(0)),
            ("2001:db8:0:0:ffff::", Some(0)),
            ("2001:db9::", None),
        ],
    ),
    (
        "long routes at the top of the IPv6 space",
        &[
            "ffff:ffff:ffff:ffff:ffff::/80",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124",
        ],
        &[
            ("ffff:ffff:ffff:ffff:ffff::1", Some(0)),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", Some(1)),
            ("ffff:ffff:ffff:ffff:fffe::", None),
            ("ffff:ffff:ffff:fffe::", None),
        ],
    ),
    (
        "adjacent siblings",
        &["10.0.0.0/25", "10.0.0.128/25", "10.0.1.0/24"],
        &[
            ("10.0.0.127", Some(0)),
            ("10.0.0.128", Some(1)),
            ("10.0.0.255", Some(1)),
            ("10.0.1.0", Some(2)),
            ("10.0.2.0", None),
        ],
    ),
];

#[test]
fn hand_picked_cases() {
    for (name, routes, queries) in CASES {
        let lpm = table(routes);
        let reference: Vec<(Prefix, u32)> =
            routes.iter().zip(0..).map(|(s, i)| (p(s), i)).collect();
        for &(addr, expected) in *queries {
            let addr = ip(addr);
            assert_eq!(lpm.lookup(addr), expected, "{name}: {addr}");
            // The cases double as a check of the reference itself.
            assert_eq!(naive(&reference, addr), expected, "{name}: naive {addr}");
        }
    }
}

#[test]
fn duplicates_are_refused_with_both_positions() {
    let err = Lpm::new([
        (p("10.0.0.0/8"), 7),
        (p("10.2.0.0/16"), 8),
        (p("10.0.0.0/8"), 9),
    ])
    .unwrap_err();
    assert_eq!(
        err,
        LpmError::DuplicatePrefix {
            prefix: p("10.0.0.0/8"),
            first: 0,
            second: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "duplicate prefix 10.0.0.0/8 (routes #0 and #2)"
    );

    // A mapped IPv6 route is the same route as its IPv4 equivalent.
    let err = Lpm::new([(p("::ffff:10.0.0.0/104"), 1), (p("10.0.0.0/8"), 2)]).unwrap_err();
    assert!(
        matches!(err, LpmError::DuplicatePrefix { prefix, first: 0, second: 1 } if prefix == p("10.0.0.0/8")),
        "{err:?}"
    );

    // Same length, other family, or other length: not duplicates.
    assert!(Lpm::new([(p("0.0.0.0/0"), 1), (p("::/0"), 2), (p("0.0.0.0/1"), 3)]).is_ok());
}

#[test]
fn values_are_checked_and_merged() {
    let err = Lpm::new([(p("10.0.0.0/8"), 1), (p("::/0"), Lpm::MAX_VALUE + 1)]).unwrap_err();
    assert_eq!(
        err,
        LpmError::ValueTooLarge {
            position: 1,
            value: Lpm::MAX_VALUE + 1
        }
    );
    let max = Lpm::new([(p("::/0"), Lpm::MAX_VALUE), (p("0.0.0.0/0"), 0)]).unwrap();
    assert_eq!(max.lookup(ip("::1")), Some(Lpm::MAX_VALUE));
    assert_eq!(max.lookup(ip("1.1.1.1")), Some(0));

    // Nested and adjacent routes of one zone need no intervals of their
    // own: this table is as small as the one with only the /8.
    let one_zone = Lpm::new([
        (p("10.0.0.0/8"), 3),
        (p("10.2.0.0/16"), 3),
        (p("11.0.0.0/8"), 3),
    ])
    .unwrap();
    let single = Lpm::new([(p("10.0.0.0/7"), 3)]).unwrap();
    assert_eq!(one_zone.heap_bytes(), single.heap_bytes());
    assert_eq!(one_zone.lookup(ip("11.1.1.1")), Some(3));
    assert_eq!(one_zone.lookup(ip("12.0.0.0")), None);
}

#[test]
fn prefixes_parse_strictly() {
    assert_eq!(p("10.0.0.0/8").to_string(), "10.0.0.0/8");
    assert_eq!(p("2A02:6B8::/32").to_string(), "2a02:6b8::/32");
    assert_eq!(p("0.0.0.0/0").prefix_len(), 0);
    assert_eq!(p("::/0").addr(), ip("::"));
    for bad in [
        "10.0.0.0",
        "10.0.0.0/",
        "10.0.0.0/+8",
        "10.0.0.0/08x",
        "10.0.0/8",
        "/8",
        "x/8",
        "10.0.0.0/1000",
        " 10.0.0.0/8",
    ] {
        assert_eq!(
            bad.parse::<Prefix>(),
            Err(LpmError::Syntax { input: bad.into() }),
            "{bad}"
        );
    }
    assert_eq!(
        "10.0.0.0/33".parse::<Prefix>(),
        Err(LpmError::PrefixTooLong {
            addr: ip("10.0.0.0"),
            len: 33
        })
    );
    assert_eq!(
        "::/129".parse::<Prefix>(),
        Err(LpmError::PrefixTooLong {
            addr: ip("::"),
            len: 129
        })
    );
    let err = "10.0.0.1/8".parse::<Prefix>().unwrap_err();
    assert_eq!(
        err,
        LpmError::HostBitsSet {
            addr: ip("10.0.0.1"),
            len: 8
        }
    );
    assert_eq!(
        err.to_string(),
        "invalid CIDR prefix 10.0.0.1/8: host bits set (did you mean 10.0.0.0/8?)"
    );
    assert!("2001:db8::1/64".parse::<Prefix>().is_err());
    assert_eq!(Prefix::truncate(ip("10.1.2.3"), 8), Ok(p("10.0.0.0/8")));
    assert_eq!(Prefix::truncate(ip("2001:db8::1"), 0), Ok(p("::/0")));
    assert_eq!(
        Prefix::new(ip("2001:db8::1"), 128),
        Ok(p("2001:db8::1/128"))
    );
}

#[test]
fn contains_keeps_families_apart() {
    assert!(p("10.0.0.0/8").contains(ip("10.255.0.1")));
    assert!(!p("10.0.0.0/8").contains(ip("11.0.0.0")));
    assert!(p("0.0.0.0/0").contains(ip("1.2.3.4")));
    assert!(!p("0.0.0.0/0").contains(ip("::ffff:1.2.3.4")));
    assert!(!p("::/0").contains(ip("1.2.3.4")));
    assert!(p("::/0").contains(ip("::ffff:1.2.3.4")));
}

#[test]
fn small_tables_stay_small() {
    let empty = Lpm::default();
    assert!(empty.is_empty());
    assert_eq!(empty.lookup(ip("1.2.3.4")), None);
    assert!(empty.heap_bytes() < 256, "{}", empty.heap_bytes());
    assert_eq!(Lpm::new([]).unwrap().heap_bytes(), empty.heap_bytes());

    let ten = table(&[
        "10.0.0.0/8",
        "10.2.0.0/16",
        "10.2.77.0/24",
        "192.0.2.0/24",
        "198.51.100.0/24",
        "0.0.0.0/0",
        "::/0",
        "2001:db8::/32",
        "2a02:6b8::/32",
        "2001:db8:0:1::/64",
    ]);
    assert_eq!(ten.len(), 10);
    // The seed-sized table must not cost what a million-route one does:
    // no fixed-size directory.
    assert!(ten.heap_bytes() < 1024, "{}", ten.heap_bytes());
    assert_eq!(
        format!("{ten:?}"),
        format!("Lpm {{ routes: 10, heap_bytes: {}, .. }}", ten.heap_bytes())
    );
}

/// Random prefixes that nest, touch and overlap: some fully random, some
/// grown from or cut down from earlier ones, some crowded into a small
/// region (dense directory slots, IPv6 sub-tables), some IPv4-mapped.
struct Generator {
    rng: fastrand::Rng,
}

impl Generator {
    fn length(&mut self, max: u8) -> u8 {
        match self.rng.u8(0..10) {
            0 => 0,
            1 => max,
            2 => max - self.rng.u8(0..=max.min(8)),
            _ => self.rng.u8(0..=max),
        }
    }

    fn prefix(&mut self, earlier: &[(Prefix, u32)], crowded: bool) -> Prefix {
        let rng = &mut self.rng;
        // From an earlier one: a sub-prefix, a super-prefix or a sibling.
        if !earlier.is_empty() && rng.u8(0..3) != 0 {
            let base = earlier[rng.usize(0..earlier.len())].0;
            let max = if base.addr().is_ipv4() { 32 } else { 128 };
            let len = base.prefix_len();
            return match rng.u8(0..3) {
                0 if len < max => {
                    let longer = rng.u8(len + 1..=max);
                    let noise = self.address(base.addr().is_ipv4(), false);
                    let bits = merge(base.addr(), noise, len);
                    Prefix::truncate(bits, longer).unwrap()
                }
                1 if len > 0 => Prefix::truncate(base.addr(), rng.u8(0..len)).unwrap(),
                _ if len > 0 => {
                    let flip = match base.addr() {
                        IpAddr::V4(a) => {
                            IpAddr::V4(Ipv4Addr::from(u32::from(a) ^ (1 << (32 - len))))
                        }
                        IpAddr::V6(a) => {
                            IpAddr::V6(Ipv6Addr::from(u128::from(a) ^ (1 << (128 - len))))
                        }
                    };
                    Prefix::truncate(flip, len).unwrap()
                }
                _ => base,
            };
        }
        let v4 = self.rng.bool();
        let addr = self.address(v4, crowded);
        let len = self.length(if v4 { 32 } else { 128 });
        if !v4 && self.rng.u8(0..8) == 0 {
            // An IPv4-mapped route.
            let mapped = Ipv6Addr::from(0xffff_0000_0000 | u128::from(self.rng.u32(..)));
            return Prefix::truncate(mapped, 96 + self.rng.u8(0..=32)).unwrap();
        }
        Prefix::truncate(addr, len).unwrap()
    }

    /// A random address; `crowded` keeps it to a few bits of variation
    /// (inside 10.0.0.0/16 or one or two IPv6 /64s).
    fn address(&mut self, v4: bool, crowded: bool) -> IpAddr {
        if v4 {
            let r = self.rng.u32(..);
            IpAddr::V4(Ipv4Addr::from(if crowded {
                0x0a00_0000 | (r & 0xffff)
            } else {
                r
            }))
        } else {
            let r = self.rng.u128(..);
            let r = if crowded {
                0x2001_0db8_0000_0000_0000_0000_0000_0000 | (r & 0x1_ffff_ffff_ffff_ffff)
            } else {
                r
            };
            IpAddr::V6(Ipv6Addr::from(r))
        }
    }
}

/// The first `len` bits of `net`, the rest of `rest` (same family).
fn merge(net: IpAddr, rest: IpAddr, len: u8) -> IpAddr {
    match (net, rest) {
        (IpAddr::V4(n), IpAddr::V4(r)) => {
            let m = super::mask4(len);
            IpAddr::V4(Ipv4Addr::from((u32::from(n) & m) | (u32::from(r) & !m)))
        }
        (IpAddr::V6(n), IpAddr::V6(r)) => {
            let m = super::mask6(len);
            IpAddr::V6(Ipv6Addr::from((u128::from(n) & m) | (u128::from(r) & !m)))
        }
        _ => unreachable!("same family"),
    }
}

/// Addresses to ask about: each route's first and last address and their
/// outside neighbours, a random one inside, IPv4 ones also in mapped form,
/// uniform random ones and the ends of both spaces.
fn queries(g: &mut Generator, routes: &[(Prefix, u32)], uniform: usize) -> Vec<IpAddr> {
    let mut out = vec![
        ip("0.0.0.0"),
        ip("255.255.255.255"),
        ip("::"),
        ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        ip("::ffff:0.0.0.0"),
        ip("::ffff:255.255.255.255"),
        ip("::fffe:ffff:ffff"),
        ip("::1:0:0:0"),
    ];
    for (route, _) in routes {
        match route.addr() {
            IpAddr::V4(a) => {
                let start = u32::from(a);
                let end = start | !super::mask4(route.prefix_len());
                let inside = start | (g.rng.u32(..) & !super::mask4(route.prefix_len()));
                for x in [
                    start,
                    end,
                    start.wrapping_sub(1),
                    end.wrapping_add(1),
                    inside,
                ] {
                    out.push(IpAddr::V4(Ipv4Addr::from(x)));
                    out.push(IpAddr::V6(Ipv4Addr::from(x).to_ipv6_mapped()));
                }
            }
            IpAddr::V6(a) => {
                let start = u128::from(a);
                let end = start | !super::mask6(route.prefix_len());
                let inside = start | (g.rng.u128(..) & !super::mask6(route.prefix_len()));
                for x in [
                    start,
                    end,
                    start.wrapping_sub(1),
                    end.wrapping_add(1),
                    inside,
                ] {
                    out.push(IpAddr::V6(Ipv6Addr::from(x)));
                }
            }
        }
    }
    for _ in 0..uniform {
        let v4 = g.rng.bool();
        let crowded = g.rng.bool();
        out.push(g.address(v4, crowded));
    }
    out
}

/// A route's value: its position, or one of three "zones", so that both
/// distinct answers and neighbours with the same answer (merged intervals)
/// occur.
fn value(rng: &mut fastrand::Rng, position: usize) -> u32 {
    if rng.bool() {
        u32::try_from(position).unwrap()
    } else {
        rng.u32(0..3)
    }
}

/// Builds `cases` random tables of up to `max_routes` routes and compares
/// every query with the reference. Routes that repeat an earlier prefix are
/// dropped, except in one table in ten, which keeps one to check the error.
fn random_tables(seed: u64, cases: usize, max_routes: usize, uniform: usize) {
    let mut g = Generator {
        rng: fastrand::Rng::with_seed(seed),
    };
    for case in 0..cases {
        let n = g.rng.usize(0..=max_routes);
        let crowded = g.rng.bool();
        let mut routes: Vec<(Prefix, u32)> = Vec::with_capacity(n);
        let mut seen = BTreeSet::new();
        // One table in ten keeps one repeated prefix, to check the error.
        let mut want_duplicate = g.rng.u8(0..10) == 0;
        let mut duplicate = None;
        while routes.len() < n {
            let prefix = g.prefix(&routes, crowded);
            if !seen.insert(prefix.unmapped()) {
                if want_duplicate {
                    want_duplicate = false;
                    duplicate = Some(routes.len());
                    routes.push((prefix, value(&mut g.rng, routes.len())));
                }
                continue;
            }
            routes.push((prefix, value(&mut g.rng, routes.len())));
        }
        let built = Lpm::new(routes.iter().copied());
        if let Some(second) = duplicate {
            let err = built.unwrap_err();
            let LpmError::DuplicatePrefix {
                prefix, second: s, ..
            } = err
            else {
                panic!("case {case}: {err:?}");
            };
            assert_eq!(prefix, routes[second].0.unmapped(), "case {case}");
            assert!(s == second, "case {case}: second {s}, expected {second}");
            continue;
        }
        let lpm = built.unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(lpm.len(), routes.len());
        for addr in queries(&mut g, &routes, uniform) {
            assert_eq!(
                lpm.lookup(addr),
                naive(&routes, addr),
                "seed {seed} case {case}: {addr} in {routes:?}"
            );
        }
    }
}

#[test]
fn random_small_tables_match_the_reference() {
    random_tables(1, 3000, 40, 50);
}

#[test]
fn random_large_tables_match_the_reference() {
    // Big enough for multi-bit directories and long runs in crowded slots.
    random_tables(2, 4, 2000, 2000);
}

#[test]
fn crowded_ipv6_block_gets_a_full_sub_table() {
    // Hundreds of routes longer than /64 inside one /64: the block's
    // sub-table gets a directory of its own.
    let mut rng = fastrand::Rng::with_seed(3);
    let mut seen = BTreeSet::new();
    let mut routes = vec![(p("2001:db8::/64"), 0), (p("2001:db8::/48"), 1)];
    while routes.len() < 600 {
        let addr =
            Ipv6Addr::from(0x2001_0db8_0000_0000_0000_0000_0000_0000 | u128::from(rng.u64(..)));
        let prefix = Prefix::truncate(addr, rng.u8(65..=128)).unwrap();
        if seen.insert(prefix) {
            routes.push((prefix, value(&mut rng, routes.len())));
        }
    }
    let lpm = Lpm::new(routes.iter().copied()).unwrap();
    let mut g = Generator { rng };
    for addr in queries(&mut g, &routes, 1000) {
        assert_eq!(lpm.lookup(addr), naive(&routes, addr), "{addr}");
    }
}
