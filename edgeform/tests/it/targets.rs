//! Where an edge or a router may be sent (docs/diagnostics.md,
//! `loopback-target`, `non-canonical-address`): origins, a node's
//! `public_url` and `addresses` on the machine's own loopback, link-local
//! (the cloud metadata service), unspecified addresses, port 0 and odd
//! spellings are refused by `check` unless the site or node says
//! `loopback: true`; private (RFC 1918, ULA) ones pass.

use crate::util::{Fixture, edgeform, stderr};

const NODE: &str = "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
                    redis: {url: \"redis://127.0.0.1:6379\"}\n";

fn check(files: &[(&str, &str)]) -> (Option<i32>, String) {
    let f = Fixture::with(files);
    let out = edgeform(f.path(), &["check"]);
    (out.status.code(), stderr(&out))
}

#[test]
fn loopback_link_local_and_oddly_spelled_targets_need_the_loopback_flag() {
    let refused = [
        ("http://127.0.0.1", "loopback-target"),
        ("http://127.1.2.3:8080", "loopback-target"),
        ("http://169.254.169.254", "loopback-target"),
        ("http://169.254.1.1", "loopback-target"),
        ("http://0.0.0.0", "loopback-target"),
        ("http://[::1]", "loopback-target"),
        ("http://[::ffff:127.0.0.1]", "loopback-target"),
        ("http://[fe80::1]", "loopback-target"),
        ("http://localhost:8080", "loopback-target"),
        ("http://api.localhost", "loopback-target"),
        ("http://0x7f.1", "non-canonical-address"),
        ("http://2130706433", "non-canonical-address"),
        ("http://127.000.000.001", "non-canonical-address"),
        ("http://[0:0:0:0:0:0:0:1]", "non-canonical-address"),
        ("http://192.0.2.1:0", "invalid-url"),
        ("http://a..b", "invalid-url"),
    ];
    for (origin, code) in refused {
        let site = format!("host: a.example.com\norigin: {origin}\n");
        let (status, err) = check(&[("sites/a.yaml", &site), ("nodes/edge-1.yaml", NODE)]);
        assert_eq!(status, Some(1), "{origin}: {err}");
        assert!(
            err.contains(code) && err.contains("sites/a.yaml:2:"),
            "{origin}: {err}"
        );
        // The flag allows the internal addresses, never the odd spellings.
        let flagged = format!("{site}loopback: true\n");
        let (status, err) = check(&[("sites/a.yaml", &flagged), ("nodes/edge-1.yaml", NODE)]);
        let want = if code == "loopback-target" {
            Some(0)
        } else {
            Some(1)
        };
        assert_eq!(status, want, "{origin} with loopback: true: {err}");
    }
    for origin in [
        "http://10.1.2.3:8080",
        "http://192.168.0.10",
        "http://172.16.5.5",
        "http://[fd00::5]",
        "https://origin.example.com",
        "http://192.0.2.1",
    ] {
        let site = format!("host: a.example.com\norigin: {origin}\n");
        let (status, err) = check(&[("sites/a.yaml", &site), ("nodes/edge-1.yaml", NODE)]);
        assert_eq!(status, Some(0), "{origin}: {err}");
    }

    // A node's addresses (a router's pool) and public_url.
    let site = (
        "sites/a.yaml",
        "host: a.example.com\norigin: http://192.0.2.1\n",
    );
    for (extra, code) in [
        ("addresses: [127.0.0.1]\n", "loopback-target"),
        ("addresses: [169.254.169.254]\n", "loopback-target"),
        ("addresses: [\"::\"]\n", "loopback-target"),
        (
            "addresses: [\"0:0:0:0:0:0:0:1\"]\n",
            "non-canonical-address",
        ),
        ("public_url: http://127.0.0.1:8080\n", "loopback-target"),
        ("public_url: http://2130706433\n", "non-canonical-address"),
    ] {
        let node = format!("{NODE}{extra}");
        let (status, err) = check(&[site, ("nodes/edge-1.yaml", &node)]);
        assert_eq!(status, Some(1), "{extra}: {err}");
        assert!(err.contains(code), "{extra}: {err}");
        let flagged = format!("{node}loopback: true\n");
        let (status, err) = check(&[site, ("nodes/edge-1.yaml", &flagged)]);
        let want = if code == "loopback-target" {
            Some(0)
        } else {
            Some(1)
        };
        assert_eq!(status, want, "{extra} with loopback: true: {err}");
    }
    let node = format!("{NODE}addresses: [10.0.0.5, \"fd00::5\"]\n");
    let (status, err) = check(&[site, ("nodes/edge-1.yaml", &node)]);
    assert_eq!(status, Some(0), "{err}");
}
