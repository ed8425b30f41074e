//! The reference edge: nginx with the Lua module, the edge role's template
//! (`roles/edge/nginx.conf.tmpl`, the installed one) rendered into a temp
//! prefix by the installer's engine (`roletmpl`), on a free loopback port,
//! stopped with SIGTERM (a SIGKILLed nginx master leaves its workers).
//!
//! Needs the Debian packages `scripts/test` installs (nginx,
//! libnginx-mod-http-lua, libnginx-mod-http-geoip2, lua-nginx-redis,
//! lua-nginx-dns, lua-cjson).

use std::path::{Path, PathBuf};

use crate::{Process, free_port, spawn, wait_ready};

/// What differs between edges; everything else is the template's.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    pub redis_port: u16,
    /// The cache folder (default: `<prefix>/cache`).
    pub cache_dir: Option<PathBuf>,
    pub cache_levels: String,
    pub cache_key: String,
    pub geoip_db: PathBuf,
    /// `edgeform serve`'s base URL, for Redis misses.
    pub api_url: Option<String>,
    pub api_token: String,
    pub node: String,
    pub challenge_secret: String,
    pub workers: u32,
    /// Replace the Lua folder (the Lua gate's tests use a broken copy).
    pub lua_dir: Option<PathBuf>,
    /// The node's `redis` block (default: `{url: redis://127.0.0.1:<redis_port>}`).
    pub redis: Option<serde_json::Value>,
    /// `redis.password_env`'s variable and its value, given to nginx as
    /// `env NAME=value;` (as the node secrets are).
    pub redis_password: Option<(String, String)>,
    /// The CA file the edge verifies HTTPS origins against in place of
    /// the system's trust store (a test CA; the rendered path is replaced).
    pub origin_ca: Option<PathBuf>,
    /// The node's `install.vars.resolver` (nginx's `resolver`, and the
    /// DNS server a site's several origins are resolved with): default
    /// `127.0.0.1`; a test's DNS server is `127.0.0.1:<port>`
    /// ([`crate::dnsmasq`]).
    pub resolver: String,
    /// The per-site metrics (`install.vars.metrics`, default on).
    pub metrics: bool,
    /// The cap of sites the metrics track by name (`metrics_hosts`).
    pub metrics_hosts: u32,
    /// The JSON access log, `<prefix>/access.log` (default on).
    pub access_log: bool,
    /// One worker reads every document into the shared cache at start
    /// (`install.vars.warm`, default on).
    pub warm: bool,
    /// The size of the shared document cache (`lua_shared_dict
    /// edge_docs`), in place of the template's (a test of a full cache).
    pub docs_dict: Option<String>,
    /// Seconds between each worker's polls of the generation, in place of
    /// cdn_router.lua's 0.2 (a test of what happens between polls).
    pub poll: Option<f64>,
}

impl EdgeOptions {
    /// Defaults for a test: one worker, `1:2`, `$scheme://$host$request_uri`,
    /// MaxMind's test database, no API.
    #[must_use]
    pub fn new(redis_port: u16) -> EdgeOptions {
        EdgeOptions {
            redis_port,
            cache_dir: None,
            cache_levels: "1:2".into(),
            cache_key: "$scheme://$host$request_uri".into(),
            geoip_db: repo_root().join("testdata/geoip/GeoLite2-City-Test.mmdb"),
            api_url: None,
            api_token: String::new(),
            node: "edge-1".into(),
            challenge_secret: "test-challenge-secret".into(),
            workers: 1,
            lua_dir: None,
            redis: None,
            redis_password: None,
            origin_ca: None,
            resolver: "127.0.0.1".into(),
            metrics: true,
            metrics_hosts: 10_000,
            access_log: true,
            warm: true,
            docs_dict: None,
            poll: None,
        }
    }
}

/// The repository's root (where `edge/` is).
#[must_use]
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("harness is in the workspace")
        .to_path_buf()
}

/// A running edge. Dropping it stops nginx (SIGTERM, then SIGKILL).
pub struct Edge {
    pub process: Process,
    pub conf: PathBuf,
    pub cache_dir: PathBuf,
    /// The direct HTTPS listener's port (0: none).
    pub https_port: u16,
    /// The routers' PROXY-protocol HTTPS listener's port (0: none).
    pub proxy_port: u16,
    /// The per-site metrics listener's port (0: none).
    pub metrics_port: u16,
}

impl Edge {
    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.process.port)
    }

    /// `http://127.0.0.1:<metrics port>/metrics`: the per-site metrics.
    #[must_use]
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.metrics_port)
    }

    /// The JSON access log's lines (`<prefix>/access.log`).
    #[must_use]
    pub fn access_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.process.dir.path().join("access.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The nginx error log.
    #[must_use]
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.process.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The master's worker processes (not the cache manager or loader),
    /// sorted.
    #[must_use]
    pub fn worker_pids(&self) -> Vec<u32> {
        let pid = self.process.pid();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let mut v: Vec<u32> = children
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("worker process"))
            })
            .collect();
        v.sort_unstable();
        v
    }
}

impl Edge {
    /// `nginx -s reload` (SIGHUP to the master), returning once every
    /// worker is a new one and there are at least as many as before.
    ///
    /// # Panics
    /// No new workers within 10 s.
    pub fn reload(&self) {
        let old = self.worker_pids();
        let status = std::process::Command::new("kill")
            .args(["-HUP", &self.process.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -HUP");
        let t = std::time::Instant::now();
        loop {
            let now = self.worker_pids();
            if !now.is_empty() && now.len() >= old.len() && now.iter().all(|p| !old.contains(p)) {
                return;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "no reload: workers {old:?} then {now:?}\n{}",
                self.error_log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A crash: SIGKILL to the master, then to the children it had
    /// (workers, cache manager), so no worker keeps a listener open (the
    /// master first: it would start a new worker for one killed).
    /// [`Process::restart`] on `process` starts it again.
    pub fn crash(&mut self) {
        let pid = self.process.pid();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        self.process.kill();
        for child in children.split_whitespace() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", child])
                .status();
        }
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        self.process.stop();
    }
}

/// Fill a `{{NAME}}` template (the router's): every `{{NAME}}` from
/// `vars`; an unfilled one is an error naming it.
///
/// # Errors
/// A placeholder without a value.
pub fn render(template: &str, vars: &[(&str, String)]) -> Result<String, String> {
    let mut text = template.to_owned();
    for (k, v) in vars {
        text = text.replace(&format!("{{{{{k}}}}}"), v);
    }
    match text.find("{{") {
        Some(i) => Err(format!(
            "not given: {}",
            &text[i..text[i..].find("}}").map_or(text.len(), |j| i + j + 2)]
        )),
        None => Ok(text),
    }
}

/// The edge role's template, `roles/edge/nginx.conf.tmpl`: the one the
/// installer ships (docs/install.md), rendered here by the same engine.
pub const EDGE_TEMPLATE: &str = "roles/edge/nginx.conf.tmpl";

/// Where a test edge listens: plain HTTP, the TTL hop's port, direct
/// HTTPS and the routers' PROXY-protocol HTTPS (`host:port` each).
#[derive(Debug, Clone)]
pub struct Listeners {
    pub listen: String,
    pub ttl_port: u16,
    pub https_listen: String,
    pub proxy_listen: String,
    /// The per-site metrics listener (`install.vars.metrics_listen`).
    pub metrics_listen: String,
}

/// The template context (`node.*`, `instance.*`, as `install` builds it
/// from a node's YAML) of a test edge: its listeners on loopback, pid
/// file, logs, temp files and the placeholder certificate in `prefix`.
#[must_use]
pub fn edge_context(
    prefix: &Path,
    l: &Listeners,
    cache: &Path,
    o: &EdgeOptions,
) -> serde_json::Value {
    let (listen, ttl_port) = (l.listen.as_str(), l.ttl_port);
    let user = std::env::var("USER").unwrap_or_default();
    let user = if user.is_empty() { "root".into() } else { user };
    let prefix = prefix.display().to_string();
    serde_json::json!({
        "node": {
            "name": o.node,
            "roles": ["edge"],
            "redis": o.redis.clone().unwrap_or_else(
                || serde_json::json!({"url": format!("redis://127.0.0.1:{}", o.redis_port)})
            ),
            "cache": {
                "dirs": [cache.display().to_string()],
                "levels": o.cache_levels,
                "key": o.cache_key,
            },
            "install": {
                "user": user,
                "root": prefix,
                "listen": listen,
                "vars": {
                    "api": o.api_url.is_some().to_string(),
                    "api_url": o.api_url.clone().unwrap_or_else(|| "http://127.0.0.1:9".into()),
                    "cache_max_size": "1g",
                    "geoip_db": o.geoip_db.display().to_string(),
                    "resolver": o.resolver,
                    "ttl_hop_port": ttl_port.to_string(),
                    "workers": o.workers.to_string(),
                },
            },
        },
        "instance": {
            "name": "harness",
            "listen": listen,
            "run": prefix,
            "root": prefix,
            "vars": {
                "ttl_hop_port": ttl_port.to_string(),
                "metrics": if o.metrics { "on" } else { "off" },
                "metrics_hosts": o.metrics_hosts.to_string(),
                "metrics_listen": l.metrics_listen,
                "access_log": if o.access_log { "on" } else { "off" },
                "warm": if o.warm { "on" } else { "off" },
            },
            "https_listen": l.https_listen,
            "proxy_listen": l.proxy_listen,
        },
        "roles": ["edge"],
    })
}

/// Render the edge's nginx.conf (the edge role's template) into `prefix`
/// and return its path and the cache folder. `<prefix>/lua` links to the
/// Lua folder (`roles/edge/lua`, or `o.lua_dir`), as the bundle's `lua/`.
///
/// # Panics
/// Unreadable template, a field the template needs that the context lacks.
#[must_use]
pub fn write_conf(
    prefix: &Path,
    listen: &str,
    ttl_port: u16,
    o: &EdgeOptions,
) -> (PathBuf, PathBuf) {
    let l = Listeners {
        listen: listen.to_owned(),
        ttl_port,
        https_listen: format!("127.0.0.1:{}", free_port()),
        proxy_listen: format!("127.0.0.1:{}", free_port()),
        metrics_listen: format!("127.0.0.1:{}", free_port()),
    };
    write_conf_with(prefix, &l, o)
}

/// The placeholder certificate of the edge's TLS listeners
/// (`<root>/tls/placeholder.crt`, `.key`), made as the installer makes
/// it on a node (`install::placeholder_script`): self-signed, no site
/// name.
///
/// # Panics
/// When `openssl` fails.
pub fn placeholder(root: &Path) {
    let dir = root.join("tls");
    std::fs::create_dir_all(&dir).expect("tls dir");
    let st = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "36500",
            "-subj",
            "/CN=edgeform placeholder",
            "-keyout",
        ])
        .arg(dir.join("placeholder.key"))
        .arg("-out")
        .arg(dir.join("placeholder.crt"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run openssl");
    assert!(st.success(), "openssl: the placeholder certificate");
}

/// [`write_conf`] with every listener given.
///
/// # Panics
/// Unreadable template, a field the template needs that the context lacks.
#[must_use]
pub fn write_conf_with(prefix: &Path, l: &Listeners, o: &EdgeOptions) -> (PathBuf, PathBuf) {
    let root = repo_root();
    let template = std::fs::read_to_string(root.join(EDGE_TEMPLATE)).expect("edge template");
    let cache = o.cache_dir.clone().unwrap_or_else(|| prefix.join("cache"));
    std::fs::create_dir_all(&cache).expect("cache dir");
    let lua = o
        .lua_dir
        .clone()
        .unwrap_or_else(|| root.join("roles/edge/lua"));
    let link = prefix.join("lua");
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(&link).expect("replace the lua link");
    }
    std::os::unix::fs::symlink(&lua, &link).expect("link the lua folder");
    if !prefix.join("tls/placeholder.crt").exists() {
        placeholder(prefix);
    }
    let cx = edge_context(prefix, l, &cache, o);
    let mut text = match roletmpl::render(EDGE_TEMPLATE, &template, &cx) {
        Ok(t) => t,
        Err(es) => panic!(
            "render the edge template: {}",
            es.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    // Node secrets come from nginx's environment (`env NAME;`); the
    // harness gives the values with nginx's own `env NAME=value;` form
    // rather than the environment of a process it shares with every test.
    let mut secrets = vec![
        ("EDGEFORM_CHALLENGE_SECRET", o.challenge_secret.as_str()),
        ("EDGEFORM_API_TOKEN", o.api_token.as_str()),
    ];
    if let Some((name, value)) = &o.redis_password {
        secrets.push((name.as_str(), value.as_str()));
    }
    for (name, value) in secrets {
        text = text.replace(&format!("env {name};"), &format!("env {name}={value};"));
    }
    if let Some(ca) = &o.origin_ca {
        text = text.replace(
            "proxy_ssl_trusted_certificate /etc/ssl/certs/ca-certificates.crt;",
            &format!("proxy_ssl_trusted_certificate {};", ca.display()),
        );
    }
    if let Some(size) = &o.docs_dict {
        let line = "lua_shared_dict edge_docs 256m;";
        assert!(text.contains(line), "the template's edge_docs line changed");
        text = text.replace(line, &format!("lua_shared_dict edge_docs {size};"));
    }
    if let Some(poll) = o.poll {
        let line = "require(\"cdn_router\").init({";
        assert!(
            text.contains(line),
            "the template's cdn_router init changed"
        );
        text = text.replace(line, &format!("{line} poll = {poll},"));
    }
    let conf = prefix.join("nginx.conf");
    std::fs::write(&conf, text).expect("write nginx.conf");
    (conf, cache)
}

/// Run `nginx -p <prefix> -c <conf>` in `dir` and wait until
/// `addr:port` answers. On failure the process is stopped and its output
/// and error log are returned, for the caller's retry and panic message.
fn start(
    dir: tempfile::TempDir,
    prefix: String,
    conf: &Path,
    (addr, port): (std::net::Ipv4Addr, u16),
) -> Result<Process, String> {
    let log = dir.path().join("nginx.out");
    let args = vec![
        "-p".to_owned(),
        prefix,
        "-c".to_owned(),
        conf.display().to_string(),
    ];
    let child = spawn("nginx", &args, dir.path(), &log).expect("spawn nginx");
    let mut p = Process {
        child: Some(child),
        port,
        dir,
        log,
        binary: "nginx".into(),
        addr,
        args,
    };
    if wait_ready(&mut p, |port| {
        std::net::TcpStream::connect((addr, port)).is_ok()
    }) {
        return Ok(p);
    }
    let log = format!(
        "{}\n{}",
        p.log(),
        std::fs::read_to_string(p.dir.path().join("error.log")).unwrap_or_default()
    );
    p.stop();
    Err(log)
}

/// Start an nginx whose whole configuration is `conf_text(prefix, port)`
/// (the prefix folder, a free loopback port it must listen on), retrying
/// on another port when it does not come up; `what` names it in the panic.
fn start_text(what: &str, conf_text: impl Fn(&Path, u16) -> String) -> Edge {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let text = conf_text(dir.path(), port);
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, text).expect("write nginx.conf");
        let prefix = dir.path().display().to_string();
        match start(dir, prefix, &conf, (std::net::Ipv4Addr::LOCALHOST, port)) {
            Ok(process) => {
                let cache_dir = process.dir.path().to_path_buf();
                return Edge {
                    process,
                    conf,
                    cache_dir,
                    https_port: 0,
                    proxy_port: 0,
                    metrics_port: 0,
                };
            }
            Err(log) => last = log,
        }
    }
    panic!("nginx ({what}) did not start:\n{last}");
}

/// The top of a test nginx's configuration: the user, foreground, one
/// worker, its pid and error log in `prefix`.
fn main_head(prefix: &Path, log_level: &str) -> String {
    let user = std::env::var("USER").unwrap_or_default();
    let user = if user.is_empty() { "root".into() } else { user };
    let prefix = prefix.display();
    format!(
        "user {user};\ndaemon off;\nmaster_process on;\nworker_processes 1;\n\
         pid {prefix}/nginx.pid;\nerror_log {prefix}/error.log {log_level};\n"
    )
}

/// Start the reference edge on a free loopback port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn edge(o: &EdgeOptions) -> Edge {
    let mut last = String::new();
    for _ in 0..5 {
        let (port, ttl_port) = (free_port(), free_port());
        let (https_port, proxy_port) = (free_port(), free_port());
        let l = Listeners {
            listen: format!("127.0.0.1:{port}"),
            ttl_port,
            https_listen: format!("127.0.0.1:{https_port}"),
            proxy_listen: format!("127.0.0.1:{proxy_port}"),
            metrics_listen: format!("127.0.0.1:{}", free_port()),
        };
        match edge_on(o, &l) {
            Ok(edge) => return edge,
            Err(log) => last = log,
        }
    }
    panic!("nginx did not start:\n{last}");
}

/// Start the reference edge on the listeners `l` (each `IPv4:port`, e.g.
/// `127.0.0.2:<port>` for one of several edges sharing a port, as a
/// router reaches every edge on the same one); up when its plain
/// listener answers.
///
/// # Errors
/// nginx did not come up: its output and error log.
pub fn edge_on(o: &EdgeOptions, l: &Listeners) -> Result<Edge, String> {
    let split = |hp: &str| -> (std::net::Ipv4Addr, u16) {
        let (h, p) = hp.rsplit_once(':').unwrap_or((hp, "0"));
        (
            h.parse().unwrap_or(std::net::Ipv4Addr::LOCALHOST),
            p.parse().unwrap_or(0),
        )
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (conf, cache_dir) = write_conf_with(dir.path(), l, o);
    let prefix = dir.path().display().to_string();
    let process = start(dir, prefix, &conf, split(&l.listen))?;
    declare_bundle(o);
    Ok(Edge {
        process,
        conf,
        cache_dir,
        https_port: split(&l.https_listen).1,
        proxy_port: split(&l.proxy_listen).1,
        metrics_port: split(&l.metrics_listen).1,
    })
}

/// What the started edge's code reads, written into its Redis as an
/// installed edge's is (`edgeform:bundle`, the version-skew gate's
/// input): the document fields its generated `edge_tables.lua` checks, and
/// `tls` when its Lua has the certificate module (`edge_tls.lua`). Best
/// effort: an edge started before (or without) its Redis declares nothing,
/// and apply then refuses it the newer fields, as on a real edge.
pub fn declare_bundle(o: &EdgeOptions) {
    let lua = o
        .lua_dir
        .clone()
        .unwrap_or_else(|| repo_root().join("roles/edge/lua"));
    let Ok(tables) = std::fs::read_to_string(lua.join("edge_tables.lua")) else {
        return;
    };
    let Some(fields) = tables
        .split_once("\n  FIELDS = {\n")
        .and_then(|(_, rest)| rest.split_once("\n  },"))
        .map(|(block, _)| {
            block
                .lines()
                .filter_map(|l| l.trim().split_once(" = ").map(|(k, _)| k))
                .collect::<Vec<_>>()
        })
    else {
        return;
    };
    let tls = if lua.join("edge_tls.lua").exists() {
        "1"
    } else {
        "0"
    };
    let _ = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &o.redis_port.to_string()])
        .args([
            "HSET",
            "edgeform:bundle",
            "site_fields",
            &fields.join(","),
            "tls",
            tls,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// `nginx -t` on a rendered configuration: (success, output).
#[must_use]
pub fn nginx_t(prefix: &Path, conf: &Path) -> (bool, String) {
    let out = std::process::Command::new("nginx")
        .arg("-t")
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(conf)
        .output()
        .expect("run nginx -t");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An nginx with only the stream module, for a router's 443 passthrough
/// (`edgeform build`'s `<router>.nginx.conf`, a top-level `stream {}`
/// block). `stream_conf(listen)` returns that block for the listen address
/// `127.0.0.1:<free port>`; it is included at the top level. Needs
/// `libnginx-mod-stream`. The process's `port` is the listen port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn stream(stream_conf: impl Fn(&str) -> String) -> Edge {
    start_text("stream", |prefix, port| {
        let include = prefix.join("router.nginx.conf");
        std::fs::write(&include, stream_conf(&format!("127.0.0.1:{port}"))).expect("write");
        format!(
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n{}\
             events {{ worker_connections 1024; }}\ninclude {};\n",
            main_head(prefix, "info"),
            include.display()
        )
    })
}

/// An nginx with the Lua module (as the edge loads it: its PCRE, its
/// `lua_regex_match_limit`) whose every request runs `content_lua`, a
/// `content_by_lua_block` body, with `lua_dirs` on the package path: the
/// pure Lua modules on test input, answered over HTTP. The process's
/// `port` is the listen port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn lua_runner(lua_dirs: &[PathBuf], content_lua: &str) -> Edge {
    lua_runner_with(lua_dirs, "", "", content_lua)
}

/// Like [`lua_runner`], with more directives: `main_conf` at the top level
/// (e.g. `env NAME=value;`), `http_conf` in the `http` block (e.g.
/// `lua_ssl_trusted_certificate`, an `init_by_lua_block`).
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn lua_runner_with(
    lua_dirs: &[PathBuf],
    main_conf: &str,
    http_conf: &str,
    content_lua: &str,
) -> Edge {
    let path: String = lua_dirs
        .iter()
        .map(|d| format!("{}/?.lua;", d.display()))
        .collect();
    start_text("Lua runner", |dir, port| {
        let prefix = dir.display();
        format!(
            "load_module /usr/lib/nginx/modules/ndk_http_module.so;\n\
             load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;\n\
             {}{main_conf}\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {prefix}/client_body;\n{http_conf}\n\
             \x20 client_max_body_size 16m;\n  client_body_buffer_size 16m;\n\
             \x20 lua_package_path \"{path}/usr/share/lua/5.1/?.lua;/usr/share/lua/5.1/?/init.lua;;\";\n\
             \x20 lua_regex_match_limit 100000;\n\
             \x20 server {{\n    listen 127.0.0.1:{port};\n\
             \x20   location / {{ content_by_lua_block {{\n{content_lua}\n    }} }}\n  }}\n}}\n",
            main_head(dir, "notice")
        )
    })
}

/// An HTTPS origin: nginx answering `200 tls origin` over TLS with the
/// certificate `crt`/`key`. The process's `port` is the listen port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn tls_origin(crt: &Path, key: &Path) -> Edge {
    start_text("TLS origin", |dir, port| {
        let prefix = dir.display();
        format!(
            "{}events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {prefix}/client_body;\n\
             \x20 proxy_temp_path {prefix}/proxy_temp;\n\
             \x20 server {{\n    listen 127.0.0.1:{port} ssl;\n\
             \x20   ssl_certificate {};\n    ssl_certificate_key {};\n\
             \x20   location / {{ return 200 \"tls origin\\n\"; }}\n  }}\n}}\n",
            main_head(dir, "notice"),
            crt.display(),
            key.display()
        )
    })
}

/// A plain-HTTP origin: nginx answering every request with `status` and
/// the body `<name> <Host> <method> <URI>` (and `X-Origin: <name>`,
/// `Cache-Control: max-age=1`), logging each request (`<name> <method>
/// <URI>`) to `access.log` in its folder ([`origin_requests`]). The
/// process's `port` is the listen port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn origin(name: &str, status: u16) -> Edge {
    start_text("origin", |dir, port| {
        let prefix = dir.display();
        format!(
            "{}events {{ worker_connections 64; }}\n\
             http {{\n  log_format o \"{name} $request_method $request_uri\";\n\
             \x20 access_log {prefix}/access.log o;\n\
             \x20 client_body_temp_path {prefix}/client_body;\n\
             \x20 proxy_temp_path {prefix}/proxy_temp;\n\
             \x20 server {{\n    listen 127.0.0.1:{port};\n\
             \x20   location / {{\n      add_header X-Origin {name} always;\n\
             \x20     add_header Cache-Control \"max-age=1\" always;\n\
             \x20     return {status} \"{name} $host $request_method $request_uri\\n\";\n    }}\n  }}\n}}\n",
            main_head(dir, "notice"),
        )
    })
}

/// The requests an [`origin`] received: `<name> <method> <URI>` each.
#[must_use]
pub fn origin_requests(origin: &Edge) -> Vec<String> {
    std::fs::read_to_string(origin.process.dir.path().join("access.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What differs between geo routers (`router/`, docs/router.md).
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// The router's own Redis (`edgeform:routing`).
    pub redis_port: u16,
    /// The agent's shared health snapshot (`routing.share_health`).
    pub health_file: PathBuf,
    /// The port every edge listens on (80 in production).
    pub edge_port: u16,
    pub geoip_db: PathBuf,
    pub workers: u32,
    /// The node's `redis` block as JSON (default: `redis://127.0.0.1:<redis_port>`).
    pub redis: Option<String>,
    /// `password_env`'s variable and its value (nginx's `env NAME=value;`).
    pub redis_password: Option<(String, String)>,
    /// The CA the Redis certificate must chain to (default: the system store).
    pub redis_ca: Option<PathBuf>,
}

impl RouterOptions {
    /// One worker, MaxMind's test database.
    #[must_use]
    pub fn new(redis_port: u16, health_file: PathBuf, edge_port: u16) -> RouterOptions {
        RouterOptions {
            redis_port,
            health_file,
            edge_port,
            geoip_db: repo_root().join("testdata/geoip/GeoLite2-City-Test.mmdb"),
            workers: 1,
            redis: None,
            redis_password: None,
            redis_ca: None,
        }
    }
}

/// Render `router/nginx.conf.template` for `listen`.
///
/// # Errors
/// An unreadable template or an unfilled placeholder.
pub fn router_conf(prefix: &Path, listen: &str, o: &RouterOptions) -> Result<String, String> {
    let root = repo_root();
    let template = std::fs::read_to_string(root.join("router/nginx.conf.template"))
        .map_err(|e| format!("router/nginx.conf.template: {e}"))?;
    let user = std::env::var("USER").unwrap_or_default();
    let vars = [
        ("USER", if user.is_empty() { "root".into() } else { user }),
        ("WORKERS", o.workers.to_string()),
        ("PREFIX", prefix.display().to_string()),
        ("ACCESS_LOG", "off".into()),
        ("ROUTER_DIR", root.join("router").display().to_string()),
        ("EDGE_DIR", root.join("edge").display().to_string()),
        ("GEOIP_DB", o.geoip_db.display().to_string()),
        (
            "REDIS",
            o.redis
                .clone()
                .unwrap_or_else(|| format!(r#"{{"url": "redis://127.0.0.1:{}"}}"#, o.redis_port)),
        ),
        (
            "REDIS_PASSWORD_ENV",
            o.redis_password.as_ref().map_or_else(
                || "EDGEFORM_REDIS_PASSWORD".into(),
                |(k, v)| format!("{k}={v}"),
            ),
        ),
        (
            "REDIS_CA_FILE",
            o.redis_ca.as_ref().map_or_else(
                || "/etc/ssl/certs/ca-certificates.crt".into(),
                |p| p.display().to_string(),
            ),
        ),
        ("HEALTH_FILE", o.health_file.display().to_string()),
        ("EDGE_PORT", o.edge_port.to_string()),
        ("LISTEN", listen.to_owned()),
    ];
    render(&template, &vars)
}

/// Start the reference geo router on a free loopback port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn router(o: &RouterOptions) -> Edge {
    router_on(o, "127.0.0.1")
}

/// [`router`] listening on `host` (e.g. `0.0.0.0`: network-namespace
/// viewers reach it at their gateway) and a free port.
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn router_on(o: &RouterOptions, host: &str) -> Edge {
    start_text("router", |dir, port| {
        router_conf(dir, &format!("{host}:{port}"), o).expect("render the router template")
    })
}

/// A static origin: nginx serving the files under `root` on a free
/// loopback port (the process's `port`), restartable like every
/// [`Process`].
///
/// # Panics
/// When nginx does not come up (its error log is shown).
#[must_use]
pub fn static_origin(root: &Path) -> Edge {
    start_text("static origin", |dir, port| {
        let prefix = dir.display();
        format!(
            "{}events {{ worker_connections 256; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {prefix}/client_body;\n\
             \x20 proxy_temp_path {prefix}/proxy_temp;\n\
             \x20 server {{\n    listen 127.0.0.1:{port};\n    root {};\n  }}\n}}\n",
            main_head(dir, "notice"),
            root.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crashed edge leaves nothing listening (no orphaned worker), and
    /// starts again on the same port.
    #[test]
    fn a_crashed_edge_leaves_no_worker_and_restarts() {
        let mut o = EdgeOptions::new(1);
        o.workers = 2;
        let mut e = edge(&o);
        let port = e.process.port;
        e.crash();
        let refused = || std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !refused() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(refused(), "a worker still listens on {port}");
        e.process.restart();
        assert!(!refused());
    }
}
