//! What `check` lets `nginx -t` load and read when it gates a pull
//! request's role folders (docs/install.md, "The nginx gate's sandbox"),
//! and what a role folder may hold: against the real nginx with its Lua
//! module, and a real shared object built here with `cc`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{edgeform, example_repo, stderr};

/// A repository with the example's `roles/edge` and one edge node.
struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let example = example_repo();
        std::fs::write(root.join("cluster.yaml"), "name: gate-lab\n").unwrap();
        std::fs::create_dir_all(root.join("nodes")).unwrap();
        copy_dir(&example.join("roles/edge"), &root.join("roles/edge"));
        std::fs::copy(
            example.join("roles/edge.smoke.yaml"),
            root.join("roles/edge.smoke.yaml"),
        )
        .unwrap();
        std::fs::write(
            root.join("nodes/edge-1.yaml"),
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.0, lon: 4.0}\n\
             redis: {url: \"redis://127.0.0.1:6379\", password_env: EDGEFORM_REDIS_PASSWORD}\n\
             cache: {dirs: [/var/cache/edge], levels: \"1:2\", key: $scheme://$host$request_uri}\n\
             install:\n  ssh: \"127.0.0.1:22\"\n  user: root\n  root: /srv/edgeform\n\
             \x20 listen: \"127.0.0.1:8080\"\n  smoke_listen: \"127.0.0.1:8443\"\n\
             \x20 vars: {workers: \"1\", resolver: 127.0.0.1, cache_max_size: 100m, \
             geoip_db: geoip/GeoLite2-City.mmdb, api: \"false\", api_url: \"http://127.0.0.1:9\", \
             api_token: \"\", challenge_secret: \"\", ttl_hop_port: \"8480\"}\n",
        )
        .unwrap();
        Repo { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn check(&self) -> (Option<i32>, String) {
        let out = edgeform(self.dir.path(), &["check"]);
        (out.status.code(), stderr(&out))
    }

    fn template(&self) -> String {
        std::fs::read_to_string(self.path("roles/edge/nginx.conf.tmpl")).unwrap()
    }

    /// The template with `line` inserted after the `load_module` lines;
    /// returns its line number.
    fn insert(&self, good: &str, line: &str) -> usize {
        let at = good
            .lines()
            .position(|l| l.starts_with("user "))
            .expect("the template has a `user` line");
        let mut lines: Vec<&str> = good.lines().collect();
        lines.insert(at, line);
        std::fs::write(
            self.path("roles/edge/nginx.conf.tmpl"),
            lines.join("\n") + "\n",
        )
        .unwrap();
        at + 1
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if std::fs::metadata(e.path()).unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// A shared object whose constructor writes `marker` (built with `cc`).
fn shared_object(dir: &Path, marker: &Path) -> PathBuf {
    let c = dir.join("compat.c");
    std::fs::write(
        &c,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }} }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let so = dir.join("libcompat.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .expect("cc (build-essential) is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

#[test]
fn check_refuses_shared_objects_and_modules_it_does_not_ship_and_never_runs_them() {
    let repo = Repo::new();
    let (code, err) = repo.check();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("nginx -t sandboxed: no network, uid 65534 (nobody)"),
        "{err}"
    );
    let good = repo.template();
    let build = tempfile::tempdir().unwrap();
    let marker = build.path().join("constructor-ran");
    let so = shared_object(build.path(), &marker);

    // Committed in the role folder and loaded through `lua/../`.
    std::fs::copy(&so, repo.path("roles/edge/libcompat.so")).unwrap();
    repo.insert(&good, "load_module lua/../libcompat.so;");
    let (code, err) = repo.check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("roles/edge/libcompat.so: is a shared object"),
        "{err}"
    );
    // The same bytes under another name: found by their ELF header.
    std::fs::rename(
        repo.path("roles/edge/libcompat.so"),
        repo.path("roles/edge/compat.txt"),
    )
    .unwrap();
    let (code, err) = repo.check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("roles/edge/compat.txt: is a shared object"),
        "{err}"
    );
    std::fs::remove_file(repo.path("roles/edge/compat.txt")).unwrap();

    // Not in the role folder: the gate loads only the shipped modules.
    for line in [
        "load_module lua/../libcompat.so;".to_owned(),
        format!("load_module {};", so.display()),
        "load_module /usr/lib/nginx/modules/ngx_http_perl_module.so;".to_owned(),
        "ssl_engine compat;".to_owned(),
    ] {
        let at = repo.insert(&good, &line);
        let (code, err) = repo.check();
        assert_eq!(code, Some(1), "{line}: {err}");
        assert!(
            err.contains(&format!(
                "roles/edge/nginx.conf.tmpl:{at} (rendered for edge-1): `"
            )),
            "{line}: {err}"
        );
    }
    assert!(!marker.exists(), "the shared object's constructor ran");
    // The shared object does run when loaded: the test would see it.
    Command::new("nginx")
        .args(["-t", "-p"])
        .arg(build.path())
        .args(["-e", "stderr", "-g"])
        .arg(format!("load_module {};", so.display()))
        .args(["-c", "/dev/null"])
        .output()
        .unwrap();
    assert!(
        marker.exists(),
        "nginx loading the object runs its constructor"
    );
}

/// `systemd-analyze verify` checks a unit's `Documentation=man:` pages by
/// running `man`, whose options a page name can set (`-C` a config that
/// redefines `nroff`): the gate runs it without man pages, as nobody,
/// without network, and nothing of the pull request runs.
#[test]
fn the_systemd_gate_never_runs_what_a_units_man_page_names() {
    let repo = Repo::new();
    let marker = tempfile::tempdir().unwrap();
    let ran = marker.path().join("ran");
    std::fs::write(
        repo.path("roles/edge/man.conf"),
        format!(
            "NOCACHE\nDEFINE nroff /bin/sh -c 'touch {}; cat'\n",
            ran.display()
        ),
    )
    .unwrap();
    std::fs::write(
        repo.path("roles/edge/edgeform-x.service"),
        "[Unit]\nDocumentation=man:ls(-Croles/edge/man.conf)\n\n[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    let (_, err) = repo.check();
    assert!(err.contains("systemd"), "the gate ran: {err}");
    assert!(!ran.exists(), "man ran the pull request's nroff: {err}");
}

/// The nginx gate renders a node's absolute paths under its scratch folder
/// with their `..` resolved at `/`: a value that climbs (`/../../..`)
/// creates nothing outside it. (`install.root` and `cache.dirs` with a
/// `..` folder are refused by `check` itself; an `install.vars` value is
/// free text.)
#[test]
fn the_nginx_gate_creates_nothing_outside_its_scratch_folder() {
    let repo = Repo::new();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("escaped");
    let climb = format!("/../../../../../../../..{}", target.display());
    let node = std::fs::read_to_string(repo.path("nodes/edge-1.yaml"))
        .unwrap()
        .replace(
            "ttl_hop_port: \"8480\"}",
            &format!("ttl_hop_port: \"8480\", spare: \"{climb}/file\"}}"),
        );
    assert!(node.contains("spare"));
    std::fs::write(repo.path("nodes/edge-1.yaml"), node).unwrap();
    // A template that names none of the paths: the confinement check of
    // the rendered nginx.conf has nothing to refuse.
    std::fs::write(
        repo.path("roles/edge/nginx.conf.tmpl"),
        "events {}\nhttp {}\n",
    )
    .unwrap();
    let (_, err) = repo.check();
    assert!(err.contains("gates ran"), "{err}");
    assert!(
        !target.exists(),
        "created outside the scratch folder: {err}"
    );
}

#[test]
fn check_never_shows_files_of_this_machine_or_nginx_messages() {
    let repo = Repo::new();
    let good = repo.template();
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("credentials");
    std::fs::write(&secret, "edgeformsecretword7731 hunter2;\n").unwrap();

    for line in [
        format!("include {};", secret.display()),
        format!(
            "include lua/../../../../../../../../..{};",
            secret.display()
        ),
        format!(
            "http {{ geoip2 {} {{ $x country iso_code; }} }}",
            secret.display()
        ),
    ] {
        let at = repo.insert(&good, &line);
        let (code, err) = repo.check();
        assert_eq!(code, Some(1), "{line}: {err}");
        assert!(
            err.contains(&format!(
                "roles/edge/nginx.conf.tmpl:{at} (rendered for edge-1)"
            )),
            "{line}: {err}"
        );
        assert!(!err.contains("edgeformsecretword7731"), "{line}: {err}");
    }

    // A bundle file nginx refuses: located there, nginx's text not shown.
    std::fs::write(
        repo.path("roles/edge/extra.conf"),
        "# extra\nno_such_directive_here on;\n",
    )
    .unwrap();
    repo.insert(&good, "include extra.conf;");
    let (code, err) = repo.check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "roles/edge/extra.conf:2 (rendered for edge-1): nginx -t refused this line \
             (nginx's message is not shown"
        ) && err.contains("`no_such_directive_here on;`"),
        "{err}"
    );
    assert!(!err.contains("unknown directive"), "{err}");
}

#[test]
fn links_in_role_folders_are_refused_and_a_link_loop_ends_quickly() {
    let repo = Repo::new();
    std::fs::create_dir_all(repo.path(".git")).unwrap();
    std::fs::write(
        repo.path(".git/config"),
        "[remote \"origin\"]\n\turl = https://user:token@example.com/x.git\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("../../.git/config", repo.path("roles/edge/README.txt")).unwrap();
    for name in ["a", "b", "c"] {
        std::os::unix::fs::symlink(".", repo.path(&format!("roles/edge/{name}"))).unwrap();
    }
    let start = Instant::now();
    let (code, err) = repo.check();
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(code, Some(1), "{err}");
    for (link, target) in [
        ("README.txt", "../../.git/config"),
        ("a", "."),
        ("b", "."),
        ("c", "."),
    ] {
        assert!(
            err.contains(&format!("roles/edge/{link}: is a link to `{target}`")),
            "{link}: {err}"
        );
    }
    assert!(!err.contains("token@"), "{err}");
    let out = edgeform(
        repo.dir.path(),
        &["build", "--out", &repo.path("out").display().to_string()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!repo.path("out/bundles").exists());
}

#[test]
fn a_sentinel_edge_with_tls_and_a_password_is_bundled_and_passes_the_nginx_gate() {
    let repo = Repo::new();
    let node = |redis: &str| {
        let text = std::fs::read_to_string(repo.path("nodes/edge-1.yaml")).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("redis:"))
            .unwrap()
            .to_owned();
        std::fs::write(
            repo.path("nodes/edge-1.yaml"),
            text.replace(&line, &format!("redis: {redis}")),
        )
        .unwrap();
    };
    // The CA file is the node's (absent here): the gate stands the system
    // store in for it.
    node(
        "{sentinels: [\"10.0.0.5:26379\", \"10.0.0.6:26379\"], master: edge-1, username: edge, \
         password_env: EDGE1_REDIS_PASSWORD, tls: {ca_file: /etc/edgeform/redis-ca.pem}}",
    );
    let (code, err) = repo.check();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !err.contains("nginx gate") || !err.contains("refused"),
        "{err}"
    );
    let out = edgeform(
        repo.dir.path(),
        &["build", "--out", &repo.path("out").display().to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let conf = std::fs::read_to_string(repo.path("out/bundles/edge-1/nginx.conf")).unwrap();
    for want in [
        "env EDGE1_REDIS_PASSWORD;",
        "lua_ssl_trusted_certificate /etc/edgeform/redis-ca.pem;",
        r#"redis = {master = "edge-1", password_env = "EDGE1_REDIS_PASSWORD", sentinels = {"10.0.0.5:26379", "10.0.0.6:26379"}, tls = {ca_file = "/etc/edgeform/redis-ca.pem"}, username = "edge"},"#,
    ] {
        assert!(conf.contains(want), "{want}\n{conf}");
    }
    // A value written to end the string and the block: data all the same.
    node("{sentinels: [\"10.0.0.5:26379\"], master: \"a\\\"]]}) os.exit() --{\"}");
    let (code, err) = repo.check();
    assert_eq!(code, Some(0), "{err}");
    let out = edgeform(
        repo.dir.path(),
        &["build", "--out", &repo.path("out2").display().to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let conf = std::fs::read_to_string(repo.path("out2/bundles/edge-1/nginx.conf")).unwrap();
    assert!(
        conf.contains(r#"master = "a\034\093\093\125) os.exit() --\123""#),
        "{conf}"
    );
}

/// A node's YAML is data: a value written into the edge's nginx.conf as
/// it is must stay one word (refused by `check` at the template's
/// reference, naming the node, otherwise), and the `api` switch reaches
/// the Lua block only as a string.
#[test]
fn node_values_cannot_add_nginx_directives_or_lua_code_to_the_bundle() {
    let repo = Repo::new();
    let good = std::fs::read_to_string(repo.path("nodes/edge-1.yaml")).unwrap();
    for (from, to) in [
        ("workers: \"1\"", "workers: \"auto; user root\""),
        (
            "dirs: [/var/cache/edge]",
            "dirs: [\"/var/cache/edge levels=1:2 keys_zone=x:1m;\\n add_header X 1;\"]",
        ),
        (
            "resolver: 127.0.0.1",
            "resolver: \"127.0.0.1 valid=1s; include /etc/passwd\"",
        ),
    ] {
        assert!(good.contains(from), "{from}");
        std::fs::write(repo.path("nodes/edge-1.yaml"), good.replace(from, to)).unwrap();
        let (code, err) = repo.check();
        assert_eq!(code, Some(1), "{to}: {err}");
        assert!(
            err.contains("roles/edge/nginx.conf.tmpl:")
                && err.contains("must be one word")
                && err.contains("(node `edge-1`)"),
            "{to}: {err}"
        );
    }
    // Two resolvers are words.
    std::fs::write(
        repo.path("nodes/edge-1.yaml"),
        good.replace("resolver: 127.0.0.1", "resolver: \"10.0.0.2 10.0.0.3\"")
            .replace("api: \"false\"", "api: \"false, _pwn = os.execute('id')\""),
    )
    .unwrap();
    let (code, err) = repo.check();
    assert_eq!(code, Some(0), "{err}");
    let out = edgeform(
        repo.dir.path(),
        &["build", "--out", &repo.path("out").display().to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let conf = std::fs::read_to_string(repo.path("out/bundles/edge-1/nginx.conf")).unwrap();
    assert!(
        conf.contains("resolver 10.0.0.2 10.0.0.3 valid=30s"),
        "{conf}"
    );
    assert!(
        conf.contains(r#"api = "false, _pwn = os.execute(\039id\039)" == "true","#),
        "{conf}"
    );
}

#[test]
fn check_passes_on_a_copy_of_the_example_repository_with_the_nginx_gate_on() {
    // Its nodes listen on `0.0.0.0:80`: the gate, as nobody in its own
    // network namespace, still opens that port.
    let dir = tempfile::tempdir().unwrap();
    let example = example_repo();
    std::fs::copy(
        example.join("cluster.yaml"),
        dir.path().join("cluster.yaml"),
    )
    .unwrap();
    for d in ["nodes", "sites", "roles", "zones"] {
        copy_dir(&example.join(d), &dir.path().join(d));
    }
    let out = edgeform(dir.path(), &["check"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("nginx -t sandboxed: no network, uid 65534 (nobody)"),
        "{err}"
    );
    assert!(err.contains("gates ran: lua"), "{err}");
    assert!(!err.contains("--skip-gate nginx skipped"), "{err}");
}

#[test]
fn check_refuses_words_it_cannot_split_as_nginx_does_and_never_runs_what_they_hide() {
    let repo = Repo::new();
    let good = repo.template();
    std::fs::create_dir_all(repo.path("tools")).unwrap();
    let marker = repo.path("constructor-ran");
    let so = shared_object(&repo.path("tools"), &marker);
    // nginx ends `${x` at the `;`: the `load_module` is a directive there.
    for line in [
        format!("pid ${{x;load_module {};}};", so.display()),
        format!("pid ${{x load_module {};}};", so.display()),
        format!("worker_priority 0}};load_module {};", so.display()),
    ] {
        let at = repo.insert(&good, &line);
        let (code, err) = repo.check();
        assert_eq!(code, Some(1), "{line}: {err}");
        assert!(
            err.contains(&format!(
                "roles/edge/nginx.conf.tmpl:{at} (rendered for edge-1): cannot be read exactly \
                 as nginx reads it"
            )),
            "{line}: {err}"
        );
        assert!(
            !marker.exists(),
            "{line}: the shared object's constructor ran"
        );
    }
}

#[test]
fn check_refuses_a_configuration_including_more_files_than_it_reads() {
    let repo = Repo::new();
    let good = repo.template();
    std::fs::create_dir_all(repo.path("tools")).unwrap();
    let marker = repo.path("constructor-ran");
    let so = shared_object(&repo.path("tools"), &marker);
    let inc = repo.path("roles/edge/inc");
    std::fs::create_dir_all(&inc).unwrap();
    std::fs::write(
        inc.join("000.conf"),
        format!("load_module {};\n", so.display()),
    )
    .unwrap();
    for i in 1..=300 {
        std::fs::write(inc.join(format!("{i:03}.conf")), "# padding\n").unwrap();
    }
    let at = repo.insert(&good, "include inc/*.conf;");
    let (code, err) = repo.check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "roles/edge/nginx.conf.tmpl:{at} (rendered for edge-1): the configuration includes \
             more than 256 files: refused"
        )),
        "{err}"
    );
    assert!(!marker.exists(), "the shared object's constructor ran");
    // Under the bound every included file is read: the module is refused there.
    for i in 200..=300 {
        std::fs::remove_file(inc.join(format!("{i:03}.conf"))).unwrap();
    }
    let (code, err) = repo.check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("roles/edge/inc/000.conf:1 (rendered for edge-1): `load_module"),
        "{err}"
    );
    assert!(!marker.exists(), "the shared object's constructor ran");
}

#[test]
fn check_refuses_a_lua_block_whose_end_nginx_could_read_elsewhere_and_never_runs_what_it_hides() {
    let repo = Repo::new();
    let good = repo.template();
    std::fs::create_dir_all(repo.path("tools")).unwrap();
    let marker = repo.path("constructor-ran");
    let so = shared_object(&repo.path("tools"), &marker);
    let at = good
        .lines()
        .position(|l| l.starts_with("http {"))
        .expect("the template has an `http` block")
        + 1;
    // A raw line feed in a Lua string: lua-nginx-module ends the block at
    // the `}` of the next line, so the `server` is a directive for nginx
    // (its engine key loads the shared object) and Lua for a reader that
    // keeps the string open.
    let hidden = format!(
        "header_filter_by_lua_block {{ local s = \"\n}}\nserver {{ listen 127.0.0.1:1 ssl; \
         ssl_certificate /etc/ssl/certs/ca-certificates.crt; ssl_certificate_key \
         engine:{}:x; }}\nlog_by_lua_block {{\n--\"\n}}",
        so.display()
    );
    for block in [
        hidden,
        "header_filter_by_lua_block { local s = \"}\" }".to_owned(),
        "header_filter_by_lua_block { -- }\n}".to_owned(),
    ] {
        let mut lines: Vec<&str> = good.lines().collect();
        lines.insert(at, &block);
        std::fs::write(
            repo.path("roles/edge/nginx.conf.tmpl"),
            lines.join("\n") + "\n",
        )
        .unwrap();
        let (code, err) = repo.check();
        assert_eq!(code, Some(1), "{block}: {err}");
        assert!(
            err.contains(&format!(
                "roles/edge/nginx.conf.tmpl:{} (rendered for edge-1): cannot be read exactly \
                 as nginx reads it",
                at + 1
            )),
            "{block}: {err}"
        );
        assert!(
            !marker.exists(),
            "{block}: the shared object's constructor ran"
        );
    }
}
