//! `edgeform anycast` on MRT dumps written here with bgpkit-parser's own
//! encoders (and a hand-written BGP4MP state change): known answers for
//! lopsided and balanced splits, IPv6, withdrawals, longer paths, gzip and
//! bzip2, corrupt files.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use bgpkit_parser::BgpElem;
use bgpkit_parser::encoder::{MrtRibEncoder, MrtUpdatesEncoder};
use bgpkit_parser::models::{AsPath, Asn, ElemType};
use serde_json::Value;

use crate::util::{Fixture, edgeform, stderr, stdout};

const US: u32 = 64496;
const ALPHA: u32 = 64500;
const BETA: u32 = 64501;
/// The bview's time; updates come after it.
const T0: f64 = 1_700_000_000.0;

const CLUSTER: &str = "\
anycast:
  origin_asns: [64496]
  prefixes:
    - {prefix: 192.0.2.0/24, name: dns}
    - {prefix: 2001:db8::/32, name: dns-v6}
    - {prefix: 198.51.100.0/24, name: data-a, upstreams: [alpha]}
  upstreams:
    - {name: alpha, asn: 64500}
    - {name: beta, asn: 64501}
";

fn repo() -> Fixture {
    Fixture::with(&[("cluster.yaml", CLUSTER)])
}

/// A route: collector peer number, prefix, path (peer AS first).
struct Route {
    peer: u8,
    prefix: &'static str,
    path: Vec<u32>,
}

fn route(peer: u8, prefix: &'static str, via: &[u32]) -> Route {
    let mut path = vec![peer_asn(peer)];
    path.extend_from_slice(via);
    Route { peer, prefix, path }
}

fn peer_asn(n: u8) -> u32 {
    65000 + u32::from(n)
}

/// IPv4 peers for IPv4 prefixes, IPv6 peers for IPv6 ones (as at RIS).
fn peer_ip(n: u8, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::from([0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, u16::from(n)])
    } else {
        IpAddr::from([10, 0, 0, n])
    }
}

fn elem(peer: u8, prefix: &str, path: Option<&[u32]>, time: f64) -> BgpElem {
    let net: ipnet::IpNet = prefix.parse().unwrap();
    let mut e = BgpElem {
        timestamp: time,
        peer_ip: peer_ip(peer, net.addr().is_ipv6()),
        peer_asn: Asn::new_32bit(peer_asn(peer)),
        elem_type: if path.is_some() {
            ElemType::ANNOUNCE
        } else {
            ElemType::WITHDRAW
        },
        ..Default::default()
    };
    e.prefix.prefix = net;
    e.as_path = path.map(AsPath::from_sequence);
    e.next_hop = Some(e.peer_ip);
    e
}

/// A TABLE_DUMP_V2 bview, with unrelated prefixes around ours.
fn bview(routes: &[Route]) -> Vec<u8> {
    let mut enc = MrtRibEncoder::new();
    for r in routes {
        enc.process_elem(&elem(r.peer, r.prefix, Some(&r.path), T0))
            .unwrap();
    }
    for i in 0..200u8 {
        let noise = format!("203.0.{i}.0/24");
        let e = elem(i % 7, &noise, Some(&[peer_asn(i % 7), 3356, 64999]), T0);
        enc.process_elem(&e).unwrap();
    }
    enc.export_bytes().unwrap().to_vec()
}

/// A BGP4MP updates file: (peer, prefix, Some(path) | None for a
/// withdrawal, seconds after the bview).
fn updates(items: &[(u8, &str, Option<Vec<u32>>, f64)]) -> Vec<u8> {
    let mut enc = MrtUpdatesEncoder::new();
    for (peer, prefix, path, dt) in items {
        enc.process_elem(&elem(*peer, prefix, path.as_deref(), T0 + dt));
    }
    enc.export_bytes().unwrap().to_vec()
}

/// A BGP4MP_STATE_CHANGE_AS4 record (RFC 6396 4.4.4): IPv4 peer `n`
/// leaves Established.
fn session_down(n: u8, dt: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&peer_asn(n).to_be_bytes());
    body.extend_from_slice(&64496u32.to_be_bytes()); // local AS
    body.extend_from_slice(&0u16.to_be_bytes()); // interface
    body.extend_from_slice(&1u16.to_be_bytes()); // AFI IPv4
    body.extend_from_slice(&[10, 0, 0, n]);
    body.extend_from_slice(&[10, 0, 0, 254]);
    body.extend_from_slice(&6u16.to_be_bytes()); // Established
    body.extend_from_slice(&1u16.to_be_bytes()); // → Idle
    let mut rec = Vec::new();
    rec.extend_from_slice(&(T0 as u32 + dt).to_be_bytes());
    rec.extend_from_slice(&16u16.to_be_bytes()); // BGP4MP
    rec.extend_from_slice(&5u16.to_be_bytes()); // STATE_CHANGE_AS4
    rec.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    rec.extend_from_slice(&body);
    rec
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn bzip2(bytes: &[u8]) -> Vec<u8> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// `edgeform anycast --format json --mrt FILES…`: (exit code, JSON).
fn audit(f: &Fixture, files: &[&Path]) -> (i32, Value) {
    let mut args = vec!["anycast", "--format", "json", "--mrt"];
    args.extend(files.iter().map(|p| p.to_str().unwrap()));
    let out = edgeform(f.path(), &args);
    let code = out.status.code().unwrap();
    assert_ne!(code, 1, "{}", stderr(&out));
    (code, serde_json::from_str(&stdout(&out)).unwrap())
}

fn prefix<'a>(doc: &'a Value, p: &str) -> &'a Value {
    doc["prefixes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["prefix"] == p)
        .unwrap_or_else(|| panic!("{p} not in {doc:#}"))
}

fn flags(doc: &Value, p: &str) -> Vec<(String, String)> {
    prefix(doc, p)["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_owned(),
                f["upstream"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn vantage(doc: &Value, p: &str, upstream: usize) -> u64 {
    prefix(doc, p)["upstreams"][upstream]["vantage_points"]
        .as_u64()
        .unwrap()
}

/// 192.0.2.0/24: 9 of 10 peers through alpha (lopsided). 2001:db8::/32:
/// 3 and 3 (balanced). 198.51.100.0/24: only alpha, as configured.
fn lopsided_bview() -> Vec<u8> {
    let mut routes = Vec::new();
    for n in 0..10 {
        let via = if n < 9 { ALPHA } else { BETA };
        routes.push(route(n, "192.0.2.0/24", &[3356, via, US]));
    }
    for n in 0..6 {
        let via = if n % 2 == 0 { ALPHA } else { BETA };
        routes.push(route(n, "2001:db8::/32", &[6939, via, US, US]));
    }
    for n in 0..4 {
        routes.push(route(n, "198.51.100.0/24", &[ALPHA, US]));
    }
    bview(&routes)
}

#[test]
fn lopsided_split_is_flagged_and_balanced_ipv6_is_not() {
    let f = repo();
    let mrt = write(f.path(), "bview.mrt", &lopsided_bview());
    let (code, doc) = audit(&f, &[&mrt]);
    assert_eq!(code, 2, "{doc:#}");
    assert_eq!(doc["flagged"], 1);
    assert_eq!(
        flags(&doc, "192.0.2.0/24"),
        [("lopsided".into(), "alpha".into())]
    );
    let dns = prefix(&doc, "192.0.2.0/24");
    assert_eq!(dns["vantage_points"], 10);
    assert_eq!(dns["upstreams"][0]["share"], 0.9);
    assert_eq!(dns["upstreams"][0]["path_len"]["median"], 4.0);
    assert_eq!(vantage(&doc, "2001:db8::/32", 0), 3);
    assert_eq!(vantage(&doc, "2001:db8::/32", 1), 3);
    // prepends count: peer, 6939, upstream, us, us
    assert_eq!(
        prefix(&doc, "2001:db8::/32")["upstreams"][1]["path_len"]["max"],
        5
    );
    assert!(flags(&doc, "2001:db8::/32").is_empty());
    assert!(flags(&doc, "198.51.100.0/24").is_empty());
    assert_eq!(doc["files"][0]["kind"], "rib");
    // 1 peer table + 3 of ours + 200 others; only ours were parsed
    assert_eq!(doc["files"][0]["records"], 204);
    assert_eq!(doc["files"][0]["matched"], 3);

    let out = edgeform(f.path(), &["anycast", "--mrt", mrt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(text.contains("FLAG lopsided: 9 of 10 vantage points reach 192.0.2.0/24 through alpha (AS64500): 90 % > 80 %"), "{text}");
    assert!(text.contains("3 prefix(es), 1 flagged"), "{text}");
}

#[test]
fn balanced_split_exits_zero() {
    let f = repo();
    let routes: Vec<Route> = (0..8)
        .map(|n| route(n, "192.0.2.0/24", &[if n < 4 { ALPHA } else { BETA }, US]))
        .collect();
    let mrt = write(f.path(), "bview.mrt", &bview(&routes));
    let (code, doc) = audit(&f, &[&mrt]);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["flagged"], 0);
    assert_eq!(vantage(&doc, "192.0.2.0/24", 0), 4);
    assert_eq!(prefix(&doc, "2001:db8::/32")["vantage_points"], 0);
}

#[test]
fn withdrawals_and_session_downs_in_updates_change_the_split() {
    let f = repo();
    // bview: 5 and 5.
    let routes: Vec<Route> = (0..10)
        .map(|n| route(n, "192.0.2.0/24", &[if n < 5 { ALPHA } else { BETA }, US]))
        .collect();
    let rib = write(f.path(), "bview.mrt", &bview(&routes));
    // then beta's peers 5, 6, 7 withdraw; peer 8 re-announces through
    // alpha; an announcement older than the bview is ignored.
    let mut items: Vec<(u8, &str, Option<Vec<u32>>, f64)> =
        (5..8).map(|n| (n, "192.0.2.0/24", None, 60.0)).collect();
    items.push((8, "192.0.2.0/24", Some(vec![peer_asn(8), ALPHA, US]), 61.0));
    items.push((0, "192.0.2.0/24", Some(vec![peer_asn(0), BETA, US]), -60.0));
    let upd = write(f.path(), "updates.mrt", &updates(&items));
    // Given before the bview: the bview is still applied first.
    let (code, doc) = audit(&f, &[&upd, &rib]);
    assert_eq!(doc["files"][0]["kind"], "rib");
    assert_eq!(doc["files"][1]["kind"], "updates");
    assert_eq!(vantage(&doc, "192.0.2.0/24", 0), 6);
    assert_eq!(vantage(&doc, "192.0.2.0/24", 1), 1);
    assert_eq!(prefix(&doc, "192.0.2.0/24")["vantage_points"], 7);
    // 6 of 7 = 86 %
    assert_eq!(code, 2);
    assert_eq!(
        flags(&doc, "192.0.2.0/24"),
        [("lopsided".into(), "alpha".into())]
    );

    // Sessions of alpha's peers 0 and 1 go down: 4 alpha, 1 beta → 80 %,
    // not more than the threshold.
    let mut down = updates(&items);
    down.extend(session_down(0, 120));
    down.extend(session_down(1, 121));
    let upd2 = write(f.path(), "updates2.mrt", &down);
    let (code, doc) = audit(&f, &[&rib, &upd2]);
    assert_eq!(vantage(&doc, "192.0.2.0/24", 0), 4);
    assert_eq!(code, 0, "{doc:#}");
}

#[test]
fn longer_paths_through_a_reseller_are_flagged() {
    let f = repo();
    // IPv6 split 5/5, but beta is reached through two more ASes.
    let routes: Vec<Route> = (0..10)
        .map(|n| {
            if n < 5 {
                route(n, "2001:db8::/32", &[ALPHA, US])
            } else {
                route(n, "2001:db8::/32", &[174, 64510, BETA, US])
            }
        })
        .collect();
    let mrt = write(f.path(), "bview.mrt", &bview(&routes));
    let (code, doc) = audit(&f, &[&mrt]);
    assert_eq!(code, 2);
    assert_eq!(
        flags(&doc, "2001:db8::/32"),
        [("longer_path".into(), "beta".into())]
    );
    let p = prefix(&doc, "2001:db8::/32");
    assert_eq!(p["upstreams"][0]["path_len"]["median"], 3.0);
    assert_eq!(p["upstreams"][1]["path_len"]["median"], 5.0);
}

#[test]
fn more_specifics_and_other_paths_are_reported() {
    let f = repo();
    let routes = vec![
        route(1, "192.0.2.0/24", &[ALPHA, US]),
        route(2, "192.0.2.0/24", &[BETA, US]),
        route(1, "192.0.2.128/25", &[64510, US]),
    ];
    let mrt = write(f.path(), "bview.mrt", &bview(&routes));
    let (_, doc) = audit(&f, &[&mrt]);
    let ms = prefix(&doc, "192.0.2.128/25");
    assert_eq!(ms["more_specific_of"], "192.0.2.0/24");
    assert_eq!(ms["other"][0]["via_asn"], 64510);
    assert_eq!(ms["other"][0]["share"], 1.0);
}

#[test]
fn gzip_and_bzip2_dumps_read_the_same() {
    let f = repo();
    let raw = lopsided_bview();
    let plain = write(f.path(), "bview", &raw);
    let gz = write(f.path(), "bview.gz", &gzip(&raw));
    // the compression is told by content, not by name
    let bz = write(f.path(), "bview.bin", &bzip2(&raw));
    let (_, a) = audit(&f, &[&plain]);
    let (_, b) = audit(&f, &[&gz]);
    let (_, c) = audit(&f, &[&bz]);
    assert_eq!(a["prefixes"], b["prefixes"]);
    assert_eq!(a["prefixes"], c["prefixes"]);
    assert_eq!(a["files"][0]["bytes"], c["files"][0]["bytes"]);
}

#[test]
fn corrupt_and_truncated_files_are_one_line_errors() {
    let f = repo();
    let raw = lopsided_bview();
    // cut inside the last record
    let cut = write(f.path(), "cut.mrt", &raw[..raw.len() - 5]);
    let out = edgeform(f.path(), &["anycast", "--mrt", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cut.mrt: byte "), "{err}");
    assert!(err.contains("truncated MRT record"), "{err}");

    // a truncated gzip stream
    let gz = gzip(&raw);
    let cutgz = write(f.path(), "cut.gz", &gz[..gz.len() / 2]);
    let out = edgeform(f.path(), &["anycast", "--mrt", cutgz.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("cut.gz: byte ") && err.contains("decompressed stream"),
        "{err}"
    );

    // not MRT at all
    let junk = write(
        f.path(),
        "junk.mrt",
        b"this is not a route collector dump, not at all\n",
    );
    let out = edgeform(f.path(), &["anycast", "--mrt", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("junk.mrt: byte 0"),
        "{}",
        stderr(&out)
    );

    // a RIB record whose body is damaged (inside one of our prefixes)
    let mut bad = lopsided_bview();
    let at = find_rib(&bad, &[192, 0, 2]).expect("our record");
    bad[at + 12 + 8] = 0xff; // entry count, high byte
    let badp = write(f.path(), "bad.mrt", &bad);
    let out = edgeform(f.path(), &["anycast", "--mrt", badp.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("bad.mrt: byte {at}: corrupt MRT record")),
        "{err}"
    );

    let missing = f.path().join("nope.mrt");
    let out = edgeform(f.path(), &["anycast", "--mrt", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("nope.mrt"));
}

/// The offset of the IPv4 RIB record for `prefix24`.
fn find_rib(bytes: &[u8], prefix24: &[u8; 3]) -> Option<usize> {
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let subtype = u16::from_be_bytes([bytes[at + 6], bytes[at + 7]]);
        let body = &bytes[at + 12..at + 12 + len];
        if subtype == 2 && body[4] == 24 && &body[5..8] == prefix24 {
            return Some(at);
        }
        at += 12 + len;
    }
    None
}

#[test]
fn without_an_anycast_section_it_says_so() {
    let f = Fixture::with(&[]);
    let mrt = write(f.path(), "bview.mrt", &lopsided_bview());
    let out = edgeform(f.path(), &["anycast", "--mrt", mrt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no `anycast` section"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn compressed_dump_truncated_before_its_first_record_is_an_error() {
    let f = repo();
    let raw = lopsided_bview();
    let gz = gzip(&raw);
    let bz = bzip2(&raw);
    for (name, bytes) in [
        ("head.gz", &gz[..10]),
        ("short.gz", &gz[..14]),
        ("head.bz2", &bz[..4]),
        ("short.bz2", &bz[..12]),
    ] {
        let p = write(f.path(), name, bytes);
        let out = edgeform(f.path(), &["anycast", "--mrt", p.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}{}", stdout(&out));
        assert!(err.contains(name), "{name}: {err}");
        assert!(!stdout(&out).contains("0 flagged"), "{name}");
    }
}
