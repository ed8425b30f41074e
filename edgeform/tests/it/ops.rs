//! Operator workflow: the PR comment (markdown diff snapshot), the
//! plain-shell CI script.

use std::sync::Arc;

use compiler::compile::{Compiled, compile};
use compiler::load::{Kind, Repo, Source};

use crate::util::{Fixture, edgeform, example_repo, git, stderr, stdout};

fn compiled(repo: &Repo) -> Compiled {
    let checked = compiler::check(repo);
    compile(checked.config.as_ref().expect("valid"))
}

/// The example repository with one site changed, one added, one removed.
fn changed_example() -> (Repo, Repo) {
    let base = compiler::load::from_dir(&example_repo()).unwrap();
    let mut head = base.clone();
    head.sources
        .retain(|s| &*s.path != "sites/static.example.org.yaml");
    for s in &mut head.sources {
        if &*s.path == "sites/example.com.yaml" {
            let text = s.text.clone().unwrap();
            s.text = Ok(text.replace("ttl: 86400", "ttl: 3600"));
        }
    }
    head.sources.push(Source {
        kind: Kind::Site,
        path: Arc::from("sites/new.example.com.yaml"),
        text: Ok("host: new.example.com\norigin: https://198.51.100.9\nregions: [us]\n".into()),
    });
    (base, head)
}

#[test]
fn markdown_diff_snapshot() {
    let (base, head) = changed_example();
    let d = compiler::diff::diff(&compiled(&base), &compiled(&head));
    let md = compiler::report::diff_markdown(&d, "origin/main (1111111)", "working tree");
    assert!(md.starts_with("<!-- edgeform-diff -->\n"), "{md}");
    insta::assert_snapshot!("markdown_diff", md);

    let none = compiler::diff::diff(&compiled(&base), &compiled(&base));
    insta::assert_snapshot!(
        "markdown_diff_none",
        compiler::report::diff_markdown(&none, "a", "b")
    );
}

/// `examples/ci/pr-check.sh` on a two-commit repository: check passes, the
/// comment lands in the file, exit 0; an invalid change exits 1.
#[test]
fn plain_shell_pr_check() {
    let f = Fixture::with(&[]);
    f.commit("base");
    git(f.path(), &["branch", "base"]);
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.2\n",
    );
    let script = example_repo().join("examples/ci/pr-check.sh");
    let run = || {
        std::process::Command::new("sh")
            .arg(&script)
            .current_dir(f.path())
            .env("EDGEFORM", env!("CARGO_BIN_EXE_edgeform"))
            .env("EDGEFORM_BASE", "base")
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let out = run();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(f.path().join("edgeform-diff.md")).unwrap();
    assert!(
        md.starts_with("<!-- edgeform-diff -->") && md.contains("site:b.example.com"),
        "{md}"
    );
    f.write("sites/b.yaml", b"host: b.example.com\n");
    assert_eq!(run().status.code(), Some(1));
}

fn copy_example(to: &std::path::Path, with_sites: bool) {
    let from = example_repo();
    std::fs::copy(from.join("cluster.yaml"), to.join("cluster.yaml")).unwrap();
    let dirs: &[&str] = if with_sites {
        &["sites", "zones", "nodes"]
    } else {
        &["zones", "nodes"]
    };
    for dir in dirs {
        std::fs::create_dir_all(to.join(dir)).unwrap();
        for e in std::fs::read_dir(from.join(dir)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(dir).join(e.file_name())).unwrap();
        }
    }
}

fn point_nyc_at(dir: &std::path::Path, port: u16) {
    let path = dir.join("nodes/edge-nyc-1.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("redis://127.0.0.1:6403"));
    std::fs::write(
        &path,
        text.replace(
            "redis://127.0.0.1:6403",
            &format!("redis://127.0.0.1:{port}"),
        ),
    )
    .unwrap();
}

/// Apply the example repository to a real Redis, import from it into a
/// repository without sites, and that repository checks clean and plans
/// no change against the edge.
#[test]
fn import_round_trip_against_a_live_edge() {
    let r = harness::redis(&[]);
    let src = Fixture::empty();
    copy_example(src.path(), true);
    point_nyc_at(src.path(), r.port);
    let out = edgeform(src.path(), &["apply", "--yes", "--node", "edge-nyc-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let dst = Fixture::empty();
    copy_example(dst.path(), false);
    point_nyc_at(dst.path(), r.port);
    let out = edgeform(
        dst.path(),
        &["import", "--node", "edge-nyc-1", "--out", "."],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("imported 5 site(s) (9 host(s)) from edge-nyc-1"),
        "{}",
        stderr(&out)
    );
    let example = std::fs::read_to_string(dst.path().join("sites/example.com.yaml")).unwrap();
    assert!(
        example.starts_with("host: example.com\naliases: [www.example.com]\n"),
        "{example}"
    );
    let shop = std::fs::read_to_string(dst.path().join("sites/shop.example.net.yaml")).unwrap();
    assert!(shop.contains("suspended: true"), "{shop}");
    assert!(
        dst.path()
            .join("sites/wildcard.cdn.example.io.yaml")
            .is_file()
    );

    let out = edgeform(dst.path(), &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The verdict is the result, on stdout; diagnostics go to stderr.
    assert!(
        stdout(&out).contains(": valid (0 errors, 0 warnings"),
        "{}",
        stdout(&out)
    );
    let out = edgeform(
        dst.path(),
        &["plan", "--node", "edge-nyc-1", "--detailed-exitcode"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    // The imported files are already canonically formatted.
    for e in std::fs::read_dir(dst.path().join("sites")).unwrap() {
        let p = e.unwrap().path();
        let rel = format!("sites/{}", p.file_name().unwrap().to_str().unwrap());
        let out = edgeform(dst.path(), &["fmt", "--check", &rel]);
        assert_eq!(out.status.code(), Some(0), "{rel}: {}", stderr(&out));
    }
    // Importing again over the same files is fine (same content); into a
    // repository with other site files it is refused.
    let out = edgeform(
        dst.path(),
        &["import", "--node", "edge-nyc-1", "--out", "."],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = edgeform(
        src.path(),
        &["import", "--node", "edge-nyc-1", "--out", "."],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("already holds other site files (sites/static.example.org.yaml"),
        "{}",
        stderr(&out)
    );
}

/// A seed-style edge, written by hand: pretty-printed JSON (a note, not a
/// problem), an unknown field and an orphan `suspended:` (reported, nothing
/// written), then `--allow-lossy` writes the rest and still reports.
#[test]
fn import_reports_what_the_model_cannot_express() {
    let r = harness::redis(&[]);
    let f = Fixture::empty();
    f.write(
        "nodes/edge-1.yaml",
        format!(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.0, lon: 4.0}}\n\
             redis: {{url: \"redis://127.0.0.1:{}\"}}\n",
            r.port
        )
        .as_bytes(),
    );
    let seed = r#"{
  "origin": "http://203.0.113.10:80",
  "cached": true,
  "geo_mode": "block",  "geo_codes": "RU,CN",
  "ip_mode":  "allow",  "ip_list":  "198.51.100.0/24",
  "rate_mode": "strict", "waf_mode": "strict",
  "cors_mode": "strict", "hotlink_mode": "block",
  "cache_rules": [{"match_type":"ext","match_value":".mp4",
                   "action":"ttl","ttl":86400}],
  "edge_rules":  [{"match_type":"prefix","match_value":"/old/",
                   "action":"redirect","redirect_status":301}]
}"#;
    let odd = r#"{"origin":"http://192.0.2.7","cached":false,"geo_mode":"off","geo_codes":"","ip_mode":"off","ip_list":"","rate_mode":"off","waf_mode":"off","cors_mode":"off","hotlink_mode":"off","cache_rules":[],"edge_rules":[],"brotli":true}"#;
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{}", r.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("MSET")
        .arg("site:example.com")
        .arg(seed)
        .arg("suspended:example.com")
        .arg("1")
        .arg("site:odd.example.com")
        .arg(odd)
        .arg("suspended:gone.example.com")
        .arg("1")
        .arg("cdn:purge:eu:edge-1:unrelated")
        .arg("x")
        .query(&mut c)
        .unwrap();

    let out = edgeform(f.path(), &["import", "--node", "edge-1", "--out", "."]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: site:odd.example.com: unknown field `brotli` (value true)"),
        "{err}"
    );
    assert!(
        err.contains("error: suspended:gone.example.com: suspended, but the edge has no `site:`"),
        "{err}"
    );
    assert!(
        err.contains("note: site:example.com: not canonical JSON"),
        "{err}"
    );
    assert!(!f.path().join("sites").exists(), "nothing written");

    let out = edgeform(
        f.path(),
        &["import", "--node", "edge-1", "--out", ".", "--allow-lossy"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning: site:odd.example.com: unknown field `brotli`"),
        "{err}"
    );
    let odd = std::fs::read_to_string(f.path().join("sites/odd.example.com.yaml")).unwrap();
    assert_eq!(
        odd,
        "host: odd.example.com\norigin: http://192.0.2.7\ncached: false\n"
    );
    assert_eq!(edgeform(f.path(), &["check"]).status.code(), Some(0));
}

/// The example repository is canonically formatted, and formatting is
/// idempotent on every one of its files.
#[test]
fn fmt_example_is_canonical_and_idempotent() {
    let out = edgeform(&example_repo(), &["fmt", "--check"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let repo = compiler::load::from_dir(&example_repo()).unwrap();
    for s in &repo.sources {
        let text = s.text.as_ref().unwrap();
        let once = compiler::fmt::format(s.kind, text).unwrap().unwrap();
        assert_eq!(&once, text, "{}", s.path);
        let twice = compiler::fmt::format(s.kind, &once).unwrap().unwrap();
        assert_eq!(once, twice, "{}", s.path);
    }
}

/// `fmt --check` lists what would change (exit 1, nothing written); `fmt`
/// rewrites it, keeps comments above keys, refuses a file with a trailing
/// comment (file:line) and leaves it alone; a second run changes nothing.
#[test]
fn fmt_check_rewrite_and_refusal() {
    let messy = "# yaml-language-server: $schema=../schemas/site.schema.json\n\
                 origin: 'http://192.0.2.1'\n# the name\nhost: a.example.com\naliases:\n- www.a.example.com\n";
    let trailing = "host: b.example.com\norigin: http://192.0.2.2  # old origin\n";
    let f = Fixture::with(&[("sites/a.yaml", messy), ("sites/b.yaml", trailing)]);
    let out = edgeform(f.path(), &["fmt", "--check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("sites/a.yaml"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("sites/b.yaml:2: a comment here cannot be kept"),
        "{}",
        stderr(&out)
    );
    let read = |p: &str| std::fs::read_to_string(f.path().join(p)).unwrap();
    assert_eq!(read("sites/a.yaml"), messy, "--check writes nothing");

    let out = edgeform(f.path(), &["fmt"]);
    assert_eq!(out.status.code(), Some(1), "b.yaml was refused");
    assert_eq!(
        read("sites/a.yaml"),
        "# yaml-language-server: $schema=../schemas/site.schema.json\n# the name\n\
         host: a.example.com\naliases: [www.a.example.com]\norigin: http://192.0.2.1\n"
    );
    assert_eq!(read("sites/b.yaml"), trailing);
    f.write(
        "sites/b.yaml",
        b"host: b.example.com\norigin: http://192.0.2.2\n",
    );
    assert_eq!(edgeform(f.path(), &["fmt"]).status.code(), Some(0));
    let out = edgeform(f.path(), &["fmt", "--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(edgeform(f.path(), &["check"]).status.code(), Some(0));
}

/// The canonical key order lists exactly the schema's properties.
#[test]
fn fmt_key_order_matches_the_schemas() {
    use compiler::load::Kind;
    for (kind, path) in compiler::fmt::ORDERED_PATHS {
        let schema = compiler::schema::generate(*kind);
        let mut at = &schema;
        for key in *path {
            at = resolve(&schema, &at["properties"][*key]);
            if let Some(items) = at.get("items") {
                at = resolve(&schema, items);
            }
        }
        let at = resolve(&schema, at);
        let mut props: Vec<&str> = at["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{kind:?} {path:?}: {at}"))
            .keys()
            .map(String::as_str)
            .collect();
        let mut order: Vec<&str> = compiler::fmt::order(*kind, path).to_vec();
        props.sort_unstable();
        order.sort_unstable();
        assert_eq!(order, props, "{kind:?} {path:?}");
    }
    let _ = Kind::Site;
}

fn resolve<'a>(root: &'a serde_json::Value, v: &'a serde_json::Value) -> &'a serde_json::Value {
    if let Some(r) = v.get("$ref").and_then(|r| r.as_str()) {
        let name = r.trim_start_matches("#/$defs/");
        return resolve(root, &root["$defs"][name]);
    }
    for alt in ["anyOf", "oneOf"] {
        if let Some(list) = v.get(alt).and_then(|l| l.as_array()) {
            for item in list {
                let r = resolve(root, item);
                if r.get("properties").is_some() || r.get("items").is_some() {
                    return r;
                }
            }
        }
    }
    v
}

/// `edgeform completions <shell>` prints a script for each shell that
/// names the subcommands.
#[test]
fn completions_generate_for_each_shell() {
    for (shell, marker) in [
        ("bash", "_edgeform()"),
        ("zsh", "#compdef edgeform"),
        ("fish", "complete -c edgeform"),
    ] {
        let out = edgeform(&example_repo(), &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = stdout(&out);
        assert!(text.contains(marker), "{shell}: {text}");
        for sub in ["check", "import", "fmt", "reconcile"] {
            assert!(text.contains(sub), "{shell} lacks {sub}");
        }
    }
    let out = edgeform(&example_repo(), &["--version"]);
    let v = stdout(&out);
    assert!(
        v.starts_with("edgeform 0.0.0 (") && v.trim_end().ends_with(')'),
        "{v}"
    );
}

/// `drain: true` on edge-ams-1 of the example: the routing table carries
/// it, routers mark it `down` in their 443 pool, `edgeform route` explains
/// it as `drained` and geo sends London to the next nearest edge.
#[test]
fn drain_reaches_the_table_the_routers_and_route() {
    let f = Fixture::empty();
    copy_example(f.path(), true);
    let path = f.path().join("nodes/edge-ams-1.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("zone: eu\n", "zone: eu\ndrain: true\n")).unwrap();
    let out = edgeform(f.path(), &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = edgeform(f.path(), &["fmt", "--check"]);
    assert_eq!(out.status.code(), Some(0), "drain's place is canonical");

    let out = edgeform(f.path(), &["build", "--out", "out"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let nginx = std::fs::read_to_string(f.path().join("out/router-ams.nginx.conf")).unwrap();
    let line = nginx.lines().find(|l| l.contains("edge-ams-1")).unwrap();
    assert!(
        line.contains(" down;") && line.ends_with("drained"),
        "{nginx}"
    );
    assert!(
        nginx
            .lines()
            .filter(|l| l.contains("server "))
            .filter(|l| l.contains(" down;"))
            .count()
            == 1,
        "{nginx}"
    );
    let target: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(f.path().join("out/router-ams.json")).unwrap(),
    )
    .unwrap();
    let table: serde_json::Value =
        serde_json::from_str(target["edgeform:routing"].as_str().unwrap()).unwrap();
    assert_eq!(table["nodes"]["edge-ams-1"]["drain"], true);
    assert!(
        table["nodes"]["edge-fra-1"].get("drain").is_none(),
        "absent when false"
    );
    let pool = table["router_pool"].as_array().unwrap();
    assert!(
        pool.iter()
            .any(|m| m["node"] == "edge-ams-1" && m["down"] == true)
    );

    let db = example_repo().join("testdata/geoip/GeoLite2-City-Test.mmdb");
    let out = edgeform(
        f.path(),
        &[
            "route",
            "--ip",
            "81.2.69.142",
            "--geo",
            "--geoip",
            db.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["geo"]["decision"]["node"], "edge-fra-1", "{v}");
    let health = f.path().join("health.json");
    std::fs::write(
        &health,
        r#"{"nodes":{
            "edge-ams-1":{"online":true,"play_sessions":0,"out_kbit":0,"streams":["cam1"]},
            "edge-fra-1":{"online":true,"play_sessions":5,"out_kbit":0,"streams":["cam1"]}}}"#,
    )
    .unwrap();
    let out = edgeform(
        f.path(),
        &[
            "route",
            "--ip",
            "81.2.69.142",
            "--stream",
            "cam1",
            "--health",
            health.to_str().unwrap(),
        ],
    );
    let text = stdout(&out);
    assert!(text.contains("edge-ams-1 excluded: drained"), "{text}");
    assert!(text.contains("edge-fra-1"), "{text}");
}
