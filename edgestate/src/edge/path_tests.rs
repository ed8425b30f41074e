//! The decision on hostile request shapes: non-canonical paths, what nginx
//! refuses itself, redirect targets built from the path, extension checks,
//! the WAF's normalisation, requests never cached.

use super::*;

fn site(extra: &str) -> Site {
    let mut v: serde_json::Value = serde_json::from_str(
        r#"{"cache_rules":[{"action":"bypass","match_type":"prefix","match_value":"/api/"}],
        "cached":true,"cors_mode":"off","edge_rules":[
          {"action":"block","match_type":"prefix","match_value":"/admin"},
          {"action":"redirect","match_type":"prefix","match_value":"/shop","redirect_status":302,"redirect_to":"https://shop.example.com"},
          {"action":"redirect","match_type":"prefix","match_value":"/old/","redirect_status":301},
          {"action":"redirect","match_type":"prefix","match_value":"/legacy","redirect_status":301,"redirect_to":"/"},
          {"action":"block","match_type":"ext","match_value":".bak"}],
        "geo_codes":"","geo_mode":"off","hotlink_mode":"block","ip_list":"","ip_mode":"off",
        "origin":"http://127.0.0.1:8080","rate_mode":"off","waf_mode":"off"}"#,
    )
    .unwrap();
    let e: serde_json::Value = serde_json::from_str(extra).unwrap();
    for (k, val) in e.as_object().unwrap() {
        v[k] = val.clone();
    }
    Site::parse(&v.to_string()).unwrap()
}

fn ask(site: &Site, method: &str, host: &str, uri: &str, headers: &[(&str, &str)]) -> Decision {
    let h = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| *v)
    };
    let req = Request {
        method,
        host,
        uri,
        client_ip: Some("192.0.2.1".parse().unwrap()),
        referer: h("referer"),
        authorization: h("authorization"),
        ..Request::default()
    };
    decide(
        &req,
        Found::Site {
            key: "shop.test",
            site,
            suspended: false,
        },
        Clearance::default(),
    )
}

fn answer(d: &Decision) -> (u16, Option<&'static str>, Option<&str>) {
    (d.status, d.reason, d.location.as_deref())
}

#[test]
fn a_rule_on_a_path_holds_for_every_spelling_of_it() {
    let s = site("{}");
    for uri in [
        "//admin",
        "/./admin",
        "/%61dmin",
        "/x/../admin",
        "/%2e/admin?q=1",
    ] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(d.verdict, Verdict::Redirect, "{uri}: {:?}", d.reasons);
        let to = d.location.clone().unwrap();
        assert_eq!(
            (d.status, d.reason),
            (308, Some("non-canonical-path")),
            "{uri}"
        );
        assert!(to.starts_with("/admin"), "{uri} → {to}");
        // Following the redirect meets the rule.
        let d = ask(&s, "GET", "shop.test", &to, &[]);
        assert_eq!(answer(&d), (403, Some("edge-rule"), None), "{to}");
    }
    let d = ask(&s, "GET", "shop.test", "/%2e/admin?q=1", &[]);
    assert_eq!(d.location.as_deref(), Some("/admin?q=1"));
}

#[test]
fn what_nginx_refuses_is_400_without_the_edge() {
    let s = site("{}");
    for uri in ["/a/..%00/x", "/a%zz", "/..%2f..%2fetc/passwd", "/a/../../b"] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(answer(&d), (400, Some("bad-request"), None), "{uri}");
    }
    for uri in ["/old/\\evil.com", "/a#b", "/x%2Fy/../.."] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(answer(&d), (400, Some("bad-path"), None), "{uri}");
    }
    // An encoded `/` or `\` is a separator to nginx and origins, never to
    // the rules: refused, in any case, wherever it stands.
    for uri in [
        "/x/..%2Fadmin",
        "/%2Fadmin",
        "/admin%2Fusers",
        "/%2fadmin?q=1",
        "/x/..%5Cadmin",
        "/admin%5cusers",
        "/api%2Fme",
        "/old/%5C%5Cevil.com",
    ] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(answer(&d), (400, Some("bad-path"), None), "{uri}");
        assert!(
            d.reasons.iter().any(|r| r.contains("encoded")),
            "{uri}: {:?}",
            d.reasons
        );
    }
    for method in ["get", "Get", "G1T"] {
        let d = ask(&s, method, "shop.test", "/", &[]);
        assert_eq!(answer(&d), (400, Some("bad-request"), None), "{method}");
    }
    for host in ["a..test", "a/b", ""] {
        let d = ask(&s, "GET", host, "/", &[]);
        assert_eq!(answer(&d), (400, Some("bad-request"), None), "{host}");
    }
    // What nginx reads as the same host is the same site.
    for host in ["SHOP.TEST.", "shop.test:80:90"] {
        let d = ask(&s, "GET", host, "/admin", &[]);
        assert_eq!(answer(&d), (403, Some("edge-rule"), None), "{host}");
    }
}

#[test]
fn a_redirect_built_from_the_path_stays_on_its_host() {
    let s = site("{}");
    for (uri, want) in [
        ("/shop@evil.com", "https://shop.example.com/@evil.com"),
        ("/shop.evil.com", "https://shop.example.com/.evil.com"),
        ("/shop:1@evil.com", "https://shop.example.com/:1@evil.com"),
        ("/shop/a?x=1", "https://shop.example.com/a?x=1"),
        ("/shop", "https://shop.example.com"),
        ("/old/evil.com", "/evil.com"),
        ("/legacy/evil.com", "/evil.com"),
        ("/legacy", "/"),
    ] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(d.location.as_deref(), Some(want), "{uri}: {:?}", d.reasons);
        assert!(!want.starts_with("//"), "{want}");
    }
    // The shapes that would leave the host never reach the rule.
    let d = ask(&s, "GET", "shop.test", "/old//evil.com", &[]);
    assert_eq!(
        answer(&d),
        (308, Some("non-canonical-path"), Some("/old/evil.com"))
    );
    let d = ask(&s, "GET", "shop.test", "/old/\\evil.com", &[]);
    assert_eq!(answer(&d), (400, Some("bad-path"), None));
    assert_eq!(join_redirect("/", "/x"), "/x");
    assert_eq!(join_redirect("/", "//evil.example"), "/evil.example");
    assert_eq!(join_redirect("/new", "///x"), "/new/x");
    assert_eq!(join_redirect("https://a.test", "//x"), "https://a.test/x");
    // The ;-segments that would have made such a rest never reach the rule.
    let d = ask(&s, "GET", "shop.test", "/old/;/;/evil.example", &[]);
    assert_eq!(answer(&d), (400, Some("bad-path"), None));
    assert_eq!(join_redirect("/new", "/x"), "/new/x");
    assert_eq!(join_redirect("https://a.test/", "/x"), "https://a.test/x");
    assert_eq!(
        join_redirect("https://a.test?q=1", "x"),
        "https://a.test?q=1x"
    );
}

#[test]
fn extensions_are_read_past_parameters_and_trailing_slashes() {
    let s = site("{}");
    let foreign = [("Referer", "https://evil.example/")];
    for uri in ["/a.jpg", "/a.jpg;x", "/a.jpg/", "/A.JPG;v=1/"] {
        let d = ask(&s, "GET", "shop.test", uri, &foreign);
        assert_eq!(answer(&d), (403, Some("hotlink"), None), "{uri}");
    }
    let d = ask(&s, "GET", "shop.test", "/a.jp%67", &foreign);
    assert_eq!(
        answer(&d),
        (308, Some("non-canonical-path"), Some("/a.jpg"))
    );
    for uri in ["/db.bak", "/db.bak;x", "/db.bak/"] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(answer(&d), (403, Some("edge-rule"), None), "{uri}");
    }
    let d = ask(&s, "GET", "shop.test", "/a.jpg.html", &foreign);
    assert_eq!(d.verdict, Verdict::Proxy);
}

#[test]
fn the_waf_reads_through_encodings_comments_and_spacing() {
    let s = site(r#"{"waf_mode":"strict"}"#);
    for (uri, reason) in [
        ("/?q=union/**/select", "waf-sqli"),
        ("/?q=UNION%09SELECT", "waf-sqli"),
        ("/?q=union%0aselect", "waf-sqli"),
        ("/?q=union%2509select", "waf-sqli"),
        ("/p?id=%2527%20or%20%25271%2527%3D%25271", "waf-sqli"),
        ("/p?id=1%20or%201%20=%201", "waf-sqli"),
        ("/?q=sleep%20(5)", "waf-sqli"),
        ("/?x=%3Cimg%20src=x%20onload%20=alert(1)%3E", "waf-xss"),
        ("/?x=%3Cbody%20onerror%09=1%3E", "waf-xss"),
        ("/?x=%253Cscript%253E", "waf-xss"),
    ] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(
            answer(&d),
            (403, Some(reason), None),
            "{uri}: {:?}",
            d.reasons
        );
    }
    for uri in ["/?q=unions%20selected", "/?q=reunion", "/?color=red&size=1"] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(d.verdict, Verdict::Proxy, "{uri}: {:?}", d.reasons);
    }
}

#[test]
fn a_request_with_authorization_is_never_cached() {
    let s = site("{}");
    let d = ask(
        &s,
        "GET",
        "shop.test",
        "/page",
        &[("Authorization", "Bearer x")],
    );
    assert_eq!((d.verdict, d.cache.cached), (Verdict::Proxy, false));
    let d = ask(&s, "GET", "shop.test", "/page", &[]);
    assert!(d.cache.cached);
    let d = ask(&s, "GET", "shop.test", "/api/me", &[]);
    assert!(!d.cache.cached);
}

#[test]
fn rules_read_the_path_without_its_parameters() {
    let s = site("{}");
    // An origin that reads path parameters serves /api/me for both.
    let d = ask(&s, "GET", "shop.test", "/api;x/me", &[]);
    assert_eq!((d.verdict, d.cache.cached), (Verdict::Proxy, false));
    for uri in ["/admin;x", "/admin;x/y"] {
        let d = ask(&s, "GET", "shop.test", uri, &[]);
        assert_eq!(answer(&d), (403, Some("edge-rule"), None), "{uri}");
    }
    let d = ask(&s, "GET", "shop.test", "/old;v=1/a", &[]);
    assert_eq!(answer(&d), (301, None, Some("/a")));
    // An encoded `;` is not a parameter.
    let d = ask(&s, "GET", "shop.test", "/api%3Bx/me", &[]);
    assert!(d.cache.cached);
}
