//! Bytes → what a viewer or a proxy sends the agent's `/route`: the
//! stream name (path segment), `X-Forwarded-For` lines, `Accept`.
//!
//! Input: the first byte picks the peer (trusted proxy or not); the rest
//! is split at `\n`: the stream, then XFF lines, and a line starting with
//! `A:` is an `Accept` value. Checks: nothing panics; the quick and the
//! explained decision agree; a `Location` is a valid header value (visible
//! ASCII) that decodes back to the payload URL + the stream; the percent
//! encoding round-trips.
#![no_main]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use edgestate::route::{Health, NodeHealth, Router, encode_segment, join_xff};
use edgestate::routing::{GeoSettings, Node, RoutingTable, Zone};
use libfuzzer_sys::fuzz_target;

fn router() -> &'static Router {
    static R: OnceLock<Router> = OnceLock::new();
    R.get_or_init(|| {
        let node = |zone: &str, url: Option<&str>| Node {
            roles: vec!["edge".into()],
            region: "eu".into(),
            zone: Some(zone.into()),
            public_url: url.map(str::to_owned),
            location: None,
            addresses: vec![],
            playback_session_limit: Some(100),
            playback_bandwidth_kbit: None,
            network_bandwidth_kbit: None,
            drain: false,
        };
        let mut zones = BTreeMap::new();
        zones.insert(
            "eu".into(),
            Zone {
                routes: vec!["192.0.2.0/24".into(), "2001:db8::/32".into()],
                fallback: Some("backup".into()),
            },
        );
        zones.insert(
            "backup".into(),
            Zone {
                routes: vec!["10.0.0.0/8".into()],
                fallback: None,
            },
        );
        let mut nodes = BTreeMap::new();
        nodes.insert(
            "edge-a".into(),
            node("eu", Some("https://a.example.net/live/")),
        );
        nodes.insert("edge-b".into(), node("backup", None));
        Router::new(RoutingTable {
            format: 1,
            cluster: "t".into(),
            trusted_proxies: vec!["127.0.0.0/8".into()],
            geo: GeoSettings {
                tie_km: 100.0,
                buckets: vec![],
                default_weight: 1,
                max_fails: 3,
                fail_timeout_s: 30,
            },
            zones,
            nodes,
            router_pool: None,
        })
        .expect("the fixed table is valid")
    })
}

fn decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let peer = if first & 1 == 0 {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1))
    } else {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9))
    };
    let mut lines = rest.split(|b| *b == b'\n');
    let Some(stream) = lines.next().and_then(|s| std::str::from_utf8(s).ok()) else {
        return;
    };
    let mut xff: Vec<&[u8]> = Vec::new();
    for line in lines {
        if let Some(accept) = line.strip_prefix(b"A:") {
            let _ = agent::http::accepts_json(accept);
        } else {
            xff.push(line);
        }
    }
    let joined = join_xff(xff.iter().copied());
    let mut health = Health::default();
    for n in ["edge-a", "edge-b"] {
        health.nodes.insert(
            n.into(),
            NodeHealth {
                online: Some(true),
                play_sessions: Some(1),
                out_kbit: Some(1),
                streams: Some(vec![stream.to_owned(), "cam1".into()].into()),
                stale: false,
                vod: None,
                net_kbit: None,
                serving: None,
            },
        );
    }
    let r = router();
    let quick = r.decide_quick(Some(peer), joined.as_deref(), stream, &health);
    let full = r.decide(Some(peer), joined.as_deref(), stream, &health);
    assert_eq!(
        (quick.status, &quick.node, &quick.location),
        (full.status, &full.node, &full.location)
    );
    if let Some(l) = &full.location {
        assert!(l.bytes().all(|b| (0x21..0x7f).contains(&b)), "{l:?}");
        let tail = l
            .strip_prefix("https://a.example.net/live/")
            .expect("prefix");
        assert_eq!(decode(tail).as_deref(), Some(stream.as_bytes()));
    }
    let enc = encode_segment(stream);
    assert_eq!(decode(&enc).as_deref(), Some(stream.as_bytes()));
});
