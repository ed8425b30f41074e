//! Table tests of the edge decision (`docs/edge.md`).

use std::net::IpAddr;

use super::*;

fn doc(extra: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(
        r#"{"cache_rules":[],"cached":true,"cors_mode":"off","edge_rules":[],
        "geo_codes":"","geo_mode":"off","hotlink_mode":"off","ip_list":"","ip_mode":"off",
        "origin":"http://127.0.0.1:8080","rate_mode":"off","waf_mode":"off"}"#,
    )
    .unwrap();
    let e: serde_json::Value = serde_json::from_str(extra).unwrap();
    for (k, val) in e.as_object().unwrap() {
        v[k] = val.clone();
    }
    v.to_string()
}

struct Case<'a> {
    extra: &'a str,
    method: &'a str,
    uri: &'a str,
    ip: &'a str,
    country: Option<&'a str>,
    referer: Option<&'a str>,
    origin: Option<&'a str>,
    want: (Verdict, u16, Option<&'a str>),
}

const C: Case<'static> = Case {
    extra: "{}",
    method: "GET",
    uri: "/",
    ip: "192.0.2.1",
    country: None,
    referer: None,
    origin: None,
    want: (Verdict::Proxy, 200, None),
};

fn run(c: &Case<'_>) -> Decision {
    let site = Site::parse(&doc(c.extra)).unwrap();
    let req = Request {
        method: c.method,
        host: "www.example.com:8080",
        uri: c.uri,
        client_ip: Some(c.ip.parse::<IpAddr>().unwrap()),
        country: c.country,
        referer: c.referer,
        origin: c.origin,
        acr_method: if c.method == "OPTIONS" {
            Some("PUT")
        } else {
            None
        },
        cookie: None,
        authorization: None,
        ..Request::default()
    };
    decide(
        &req,
        Found::Site {
            key: "www.example.com",
            site: &site,
            suspended: false,
        },
        Clearance::default(),
    )
}

#[test]
fn every_field_has_its_effect() {
    let cases = [
        Case { ..C },
        Case {
            extra: r#"{"ip_mode":"allow","ip_list":"198.51.100.0/24"}"#,
            want: (Verdict::Blocked, 403, Some("ip-not-allowed")),
            ..C
        },
        Case {
            extra: r#"{"ip_mode":"allow","ip_list":"198.51.100.0/24,192.0.2.0/24"}"#,
            ..C
        },
        Case {
            extra: r#"{"ip_mode":"block","ip_list":"192.0.2.1"}"#,
            want: (Verdict::Blocked, 403, Some("ip-blocked")),
            ..C
        },
        Case {
            extra: r#"{"ip_mode":"block","ip_list":"2001:db8::/32"}"#,
            ip: "2001:db8::1",
            want: (Verdict::Blocked, 403, Some("ip-blocked")),
            ..C
        },
        Case {
            extra: r#"{"geo_mode":"block","geo_codes":"RU,CN"}"#,
            country: Some("CN"),
            want: (Verdict::Blocked, 403, Some("geo-blocked")),
            ..C
        },
        Case {
            extra: r#"{"geo_mode":"block","geo_codes":"RU,CN"}"#,
            country: None,
            ..C
        },
        Case {
            extra: r#"{"geo_mode":"allow","geo_codes":"GB"}"#,
            country: None,
            want: (Verdict::Blocked, 403, Some("geo-not-allowed")),
            ..C
        },
        Case {
            extra: r#"{"waf_mode":"strict"}"#,
            uri: "/a?q=1%27%20OR%20%271%27%3D%271",
            want: (Verdict::Blocked, 403, Some("waf-sqli")),
            ..C
        },
        Case {
            extra: r#"{"waf_mode":"strict"}"#,
            method: "PROPFIND",
            want: (Verdict::Blocked, 403, Some("waf-bad-method")),
            ..C
        },
        Case {
            extra: r#"{"waf_mode":"detect"}"#,
            uri: "/x?<script>",
            ..C
        },
        Case {
            extra: r#"{"hotlink_mode":"block"}"#,
            uri: "/a.JPG",
            referer: Some("https://evil.example.net/page"),
            want: (Verdict::Blocked, 403, Some("hotlink")),
            ..C
        },
        Case {
            extra: r#"{"hotlink_mode":"block"}"#,
            uri: "/a.jpg",
            referer: Some("https://example.com/page"),
            ..C
        },
        Case {
            extra: r#"{"hotlink_mode":"block"}"#,
            uri: "/page.html",
            referer: Some("https://evil.example.net/"),
            ..C
        },
        Case {
            extra: r#"{"cors_mode":"strict"}"#,
            origin: Some("https://evil.example.net"),
            want: (Verdict::Blocked, 403, Some("cors-origin")),
            ..C
        },
        Case {
            extra: r#"{"cors_mode":"permissive"}"#,
            method: "OPTIONS",
            origin: Some("https://evil.example.net"),
            want: (Verdict::Preflight, 204, Some("cors-preflight")),
            ..C
        },
        Case {
            extra: r#"{"rate_mode":"strict"}"#,
            want: (Verdict::Challenged, 403, Some("challenge")),
            ..C
        },
        Case {
            extra: r#"{"rate_mode":"normal"}"#,
            ..C
        },
        Case {
            extra: r#"{"edge_rules":[{"action":"block","match_type":"regex","match_value":"^/admin"}]}"#,
            uri: "/admin/x",
            want: (Verdict::Blocked, 403, Some("edge-rule")),
            ..C
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let d = run(c);
        assert_eq!(
            (d.verdict, d.status, d.reason),
            c.want,
            "case {i}: {:?}",
            d.reasons
        );
    }
}

#[test]
fn redirects_and_cache() {
    let rules = r#"{"edge_rules":[
        {"action":"redirect","match_type":"prefix","match_value":"/old/","redirect_status":301},
        {"action":"redirect","match_type":"prefix","match_value":"/v1/","redirect_status":302,"redirect_to":"/v2/"},
        {"action":"redirect","match_type":"exact","match_value":"/x","redirect_status":308,"redirect_to":"https://e.test/y?a=1"}],
      "cache_rules":[
        {"action":"ttl","match_type":"ext","match_value":".mp4","ttl":86400},
        {"action":"bypass","match_type":"prefix","match_value":"/api/"}]}"#;
    let table: [(&str, &str, u16, Option<&str>, Cache); 7] = [
        ("GET", "/old/a/b?q=1", 301, Some("/a/b?q=1"), NOCACHE),
        ("GET", "/v1/users", 302, Some("/v2/users"), NOCACHE),
        (
            "GET",
            "/x?b=2",
            308,
            Some("https://e.test/y?a=1&b=2"),
            NOCACHE,
        ),
        (
            "GET",
            "/m/a.MP4",
            200,
            None,
            Cache {
                cached: true,
                ttl: Some(86400),
            },
        ),
        (
            "GET",
            "/api/a.mp4",
            200,
            None,
            Cache {
                cached: true,
                ttl: Some(86400),
            },
        ),
        ("GET", "/api/q", 200, None, NOCACHE),
        ("POST", "/page", 200, None, NOCACHE),
    ];
    for (method, uri, status, location, cache) in table {
        let d = run(&Case {
            extra: rules,
            method,
            uri,
            ..C
        });
        assert_eq!(
            (d.status, d.location.as_deref(), d.cache),
            (status, location, cache),
            "{method} {uri}: {:?}",
            d.reasons
        );
    }
    let d = run(&Case { uri: "/p", ..C });
    assert_eq!(
        d.cache,
        Cache {
            cached: true,
            ttl: None
        }
    );
    assert_eq!(d.origin_host.as_deref(), Some("www.example.com"));
    let d = run(&Case {
        extra: r#"{"origin":"https://o.example.org:8443","cached":false}"#,
        ..C
    });
    assert_eq!(d.origin_host.as_deref(), Some("o.example.org:8443"));
    assert_eq!(d.cache, NOCACHE);
}

const NOCACHE: Cache = Cache {
    cached: false,
    ttl: None,
};

#[test]
fn challenge_cookie_verifies() {
    let site = Site::parse(&doc(r#"{"rate_mode":"strict"}"#)).unwrap();
    let ip: IpAddr = "81.2.69.142".parse().unwrap();
    let secret = b"s3cret";
    let good = format!(
        "a=b; {CLEARANCE_COOKIE}={}",
        clearance_token(secret, "h.test", ip, 2000)
    );
    let expired = format!(
        "{CLEARANCE_COOKIE}={}",
        clearance_token(secret, "h.test", ip, 999)
    );
    let other = format!(
        "{CLEARANCE_COOKIE}={}",
        clearance_token(b"x", "h.test", ip, 2000)
    );
    let clock = Clearance {
        secret: Some(secret),
        now: 1000,
    };
    for (cookie, clearance, verdict) in [
        (Some(good.as_str()), clock, Verdict::Proxy),
        (
            Some(good.as_str()),
            Clearance::default(),
            Verdict::Challenged,
        ),
        (Some(expired.as_str()), clock, Verdict::Challenged),
        (Some(other.as_str()), clock, Verdict::Challenged),
        (None, clock, Verdict::Challenged),
    ] {
        let req = Request {
            method: "GET",
            host: "h.test",
            uri: "/",
            client_ip: Some(ip),
            cookie,
            ..Request::default()
        };
        let found = Found::Site {
            key: "h.test",
            site: &site,
            suspended: false,
        };
        assert_eq!(
            decide(&req, found, clearance).verdict,
            verdict,
            "{cookie:?}"
        );
    }
    // The nonce alone (what scraping the page gives) is refused.
    let scraped = format!(
        "{CLEARANCE_COOKIE}={}",
        challenge_nonce(secret, "h.test", ip, 2000)
    );
    let req = Request {
        method: "GET",
        host: "h.test",
        uri: "/",
        client_ip: Some(ip),
        cookie: Some(&scraped),
        ..Request::default()
    };
    let found = Found::Site {
        key: "h.test",
        site: &site,
        suspended: false,
    };
    assert_eq!(decide(&req, found, clock).verdict, Verdict::Challenged);
    // RFC 2202 test case 2.
    let mac = hmac_sha1(b"Jefe", b"what do ya want for nothing?");
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
}

#[test]
fn bad_documents_have_a_kind() {
    let missing = doc("{}").replace(r#""cached":true,"#, "");
    let cases = [
        ("not json", DocErrorKind::Shape),
        (missing.as_str(), DocErrorKind::Shape),
        (&*doc(r#"{"cached":"yes"}"#), DocErrorKind::Shape),
        (&*doc(r#"{"extra":1}"#), DocErrorKind::Shape),
        (&*doc(r#"{"waf_mode":"paranoid"}"#), DocErrorKind::Mode),
        (&*doc(r#"{"ip_list":"10.0.0.1/8"}"#), DocErrorKind::Value),
        (&*doc(r#"{"geo_codes":"gb"}"#), DocErrorKind::Value),
    ];
    for (text, kind) in cases {
        assert_eq!(Site::parse(text).unwrap_err().kind, kind, "{text}");
    }
    let bad = Site::parse("{}").unwrap_err();
    let d = decide(
        &Request {
            method: "GET",
            host: "a.test",
            uri: "/",
            ..Request::default()
        },
        Found::Bad {
            key: "a.test",
            error: &bad,
        },
        Clearance::default(),
    );
    assert_eq!(
        (d.verdict, d.status, d.reason),
        (Verdict::Error, 502, Some("bad-document"))
    );
    let get = Request {
        method: "GET",
        host: "a.test",
        uri: "/",
        ..Request::default()
    };
    let d = decide(&get, Found::None, Clearance::default());
    assert_eq!((d.verdict, d.status), (Verdict::NotFound, 404));
    assert_eq!(lookup_hosts("a.b.c"), ["a.b.c", "*.b.c"]);
    assert_eq!(normalize_host("WWW.Example.com:8080"), "www.example.com");
}

/// The clearance needs the proof of work: the nonce alone, the nonce with a
/// counter that does not do the work, a re-dated or moved nonce are
/// refused; the solved value is accepted, and its SHA-1 starts with
/// `CHALLENGE_BITS` zero bits.
#[test]
fn a_clearance_needs_the_proof_of_work() {
    let ip: IpAddr = "2001:db8::7".parse().unwrap();
    let secret = b"s3cret";
    let nonce = challenge_nonce(secret, "h.test", ip, 5000);
    let solved = solve_challenge(&nonce);
    assert!(solved.starts_with(&format!("{nonce}.")));
    let digest = sha1_smol::Sha1::from(solved.as_bytes()).digest().bytes();
    assert_eq!((digest[0], digest[1]), (0, 0), "{solved}");
    assert!(clearance_valid(secret, "h.test", ip, 4999, &solved));
    assert_eq!(clearance_token(secret, "h.test", ip, 5000), solved);
    // Expired, other site, other client, other secret.
    assert!(!clearance_valid(secret, "h.test", ip, 5000, &solved));
    assert!(!clearance_valid(secret, "g.test", ip, 0, &solved));
    let other: IpAddr = "2001:db8::8".parse().unwrap();
    assert!(!clearance_valid(secret, "h.test", other, 0, &solved));
    assert!(!clearance_valid(b"x", "h.test", ip, 0, &solved));
    // The nonce alone, or with a counter that does not do the work.
    assert!(!clearance_valid(secret, "h.test", ip, 0, &nonce));
    let n: u64 = solved.rsplit('.').next().unwrap().parse().unwrap();
    let lazy = (0..n)
        .map(|k| format!("{nonce}.{k}"))
        .find(|v| {
            let d = sha1_smol::Sha1::from(v.as_bytes()).digest().bytes();
            d[0] != 0 || d[1] != 0
        })
        .unwrap_or_else(|| format!("{nonce}.{}", n + 1));
    assert!(!clearance_valid(secret, "h.test", ip, 0, &lazy), "{lazy}");
    // Shapes: leading zeros in the expiry or a counter too long, extra
    // parts, an upper-case HMAC.
    for bad in [
        format!("0{solved}"),
        format!("{nonce}.00000000000000001"),
        format!("{solved}.1"),
        solved.to_ascii_uppercase(),
        String::new(),
        "..".into(),
    ] {
        assert!(!clearance_valid(secret, "h.test", ip, 0, &bad), "{bad}");
    }
    // An IPv4-mapped client is its IPv4 address.
    let v4: IpAddr = "192.0.2.1".parse().unwrap();
    let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
    let t = clearance_token(secret, "h.test", v4, 5000);
    assert!(clearance_valid(secret, "h.test", mapped, 0, &t));
}

/// Version skew (docs/operations.md): an unknown field the document lists
/// in `skippable` is skipped, as the edge's Lua skips it; any other
/// unknown field, a bad list, or a listed field this code reads with a bad
/// value keeps the document bad.
#[test]
fn listed_unknown_fields_are_skipped_and_any_other_is_a_bad_document() {
    assert!(Site::parse(&doc(r#"{"newer":{"x":1},"skippable":["newer"]}"#)).is_ok());
    for bad in [
        r#"{"newer":1}"#,
        r#"{"newer":1,"other":2,"skippable":["newer"]}"#,
        r#"{"max_body_size":"x","skippable":["max_body_size"]}"#,
        r#"{"newer":1,"skippable":"newer"}"#,
        r#"{"newer":1,"skippable":[1]}"#,
    ] {
        assert!(Site::parse(&doc(bad)).is_err(), "{bad}");
    }
    // Listed, a restricting field this code reads is applied.
    let s = Site::parse(&doc(
        r#"{"max_body_size":10,"skippable":["max_body_size"]}"#,
    ))
    .unwrap();
    assert_eq!(s.max_body, 10);
}
