//! Role-keyed bundles (docs/install.md): every file under `roles/<role>/`
//! is in the bundle of every node with that role — there is no copy list.
//! Files ending in `.tmpl` are templates, rendered per node (the suffix is
//! dropped) from the node's YAML (`{{ node.cache.key }}`) and the instance
//! it runs as (`{{ instance.listen }}`).
//!
//! [`load`] reads the role folders, [`gate`] runs
//! the external tools, [`node`] builds every node's bundle, [`ssh`] reaches
//! the nodes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub mod confine;
pub mod gate;
pub mod load;
pub mod node;
pub mod ssh;

/// The template suffix.
pub const TEMPLATE_SUFFIX: &str = ".tmpl";
/// The largest file a role folder may hold (bytes).
pub const MAX_BUNDLE_FILE_BYTES: u64 = 64 << 20;
/// Where a bundle keeps the candidate renderings of templates that use
/// `instance.*` (the installer runs the candidate from these).
pub const CANDIDATE_DIR: &str = "candidate";
/// The manifest's name inside an installed release.
pub const MANIFEST: &str = "manifest.json";

/// What went wrong with a role folder or a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A symbolic link, wherever it points (role folders hold none).
    Symlink,
    /// A shared object (by its name or its ELF header): `check` would load it.
    SharedObject,
    /// A file larger than [`MAX_BUNDLE_FILE_BYTES`].
    TooLarge,
    /// Not readable, not a regular file or folder, or a linked folder.
    Unreadable,
    /// `roles/<name>` where `<name>` is not a role.
    UnknownRole,
    /// A template names a field the node (or instance) does not have.
    UnknownField,
    /// `{{` without `}}`, an empty or malformed reference, a non-UTF-8 template.
    TemplateSyntax,
    /// Two roles of one node ship the same path.
    PathConflict,
    /// `roles/<role>.smoke.yaml` is not a list of requests.
    BadSmoke,
}

/// One problem, located (`line`/`column` 0: the whole file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for Error {
    /// File names and messages come from the repository (a name, a link's
    /// target): control characters are escaped, never sent to a terminal.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (file, message) = (
            edgestate::untrusted::escape(&self.file),
            edgestate::untrusted::escape(&self.message),
        );
        if self.line > 0 {
            write!(f, "{file}:{}:{}: {message}", self.line, self.column)
        } else {
            write!(f, "{file}: {message}")
        }
    }
}

/// One file of a role folder, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleFile {
    /// `/`-separated, relative to `roles/<role>/`.
    pub path: String,
    /// Permission bits (`0o644`, `0o755`).
    pub mode: u32,
    pub bytes: Vec<u8>,
}

impl RoleFile {
    /// `roles/<role>/<path>`, for messages.
    #[must_use]
    pub fn source(&self, role: &str) -> String {
        format!("roles/{role}/{}", self.path)
    }
}

/// One smoke request: sent to the candidate on the alternate address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmokeRequest {
    /// The path (and query), e.g. `/`.
    pub path: String,
    /// The `Host` header.
    #[serde(default)]
    pub host: Option<String>,
    /// The expected status.
    pub status: u16,
    /// A text the body must contain.
    #[serde(default)]
    pub body: Option<String>,
}

/// Every role folder of the repository.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    /// Role → its files, in path order.
    pub files: BTreeMap<String, Vec<RoleFile>>,
    /// Role → its smoke requests (`roles/<role>.smoke.yaml`).
    pub smoke: BTreeMap<String, Vec<SmokeRequest>>,
}

/// Which process a rendering is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `live` or `candidate` (or `gate` for `check`'s scratch rendering).
    pub name: String,
    /// The address the server listens on.
    pub listen: String,
    /// The folder for its pid file, logs and temp files.
    pub run: String,
    /// The node's root (`install.root`).
    pub root: String,
    /// `install.vars`, with `install.candidate_vars` over them for the candidate.
    pub vars: BTreeMap<String, String>,
    /// The edge's direct HTTPS listener (live: `https.listen`, default
    /// `443`; candidate: the smoke host, the smoke port + 1).
    pub https_listen: String,
    /// The edge's PROXY-protocol listener for the routers (live:
    /// `https.proxy_listen`, default `10443`; candidate: the smoke host,
    /// the smoke port + 2).
    pub proxy_listen: String,
}

impl Instance {
    /// The live and candidate instances of a node's `install` block
    /// (defaults when it has none: root `/srv/edgeform`, listens on 80/8443).
    #[must_use]
    pub fn pair(install: Option<&Install>) -> (Instance, Instance) {
        let root = install.map_or("/srv/edgeform", |i| i.root.as_str());
        let root = root.trim_end_matches('/').to_owned();
        let listen = install.map_or("80", |i| i.listen.as_str()).to_owned();
        let smoke = install
            .map_or("8443", |i| i.smoke_listen.as_str())
            .to_owned();
        let mut vars: BTreeMap<String, String> = DEFAULT_VARS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(i) = install {
            vars.extend(i.vars.clone());
        }
        let mut cvars = vars.clone();
        // The candidate's HTTPS listeners: loopback alternates next to its
        // smoke address, never the live ports.
        let (smoke_host, smoke_port) = match smoke.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse::<u16>().unwrap_or(8443)),
            None => ("127.0.0.1".to_owned(), smoke.parse::<u16>().unwrap_or(8443)),
        };
        let alt = |n: u16| format!("{smoke_host}:{}", smoke_port.saturating_add(n));
        // The candidate's metrics listener: never the live one.
        cvars.insert("metrics_listen".into(), alt(3));
        // The candidate lives for its smoke test: no warm of its shared
        // cache (a SCAN of the node's Redis at every install).
        cvars.insert("warm".into(), "off".into());
        if let Some(i) = install {
            cvars.extend(i.candidate_vars.clone());
        }
        (
            Instance {
                name: "live".into(),
                listen,
                run: format!("{root}/run/live"),
                root: root.clone(),
                vars,
                https_listen: HTTPS_LISTEN.into(),
                proxy_listen: PROXY_LISTEN.into(),
            },
            Instance {
                name: "candidate".into(),
                listen: smoke,
                run: format!("{root}/run/candidate"),
                root,
                vars: cvars,
                https_listen: alt(1),
                proxy_listen: alt(2),
            },
        )
    }

    /// The live instance's HTTPS listeners from the node YAML's `https`
    /// block (defaults `443` and `10443`); the candidate's from
    /// `install.candidate_vars` `https_listen`/`proxy_listen` when given.
    #[must_use]
    pub fn with_https(mut self, node_yaml: &Value) -> Instance {
        if self.name == "candidate" {
            if let Some(l) = self.vars.get("https_listen") {
                self.https_listen.clone_from(l);
            }
            if let Some(l) = self.vars.get("proxy_listen") {
                self.proxy_listen.clone_from(l);
            }
        }
        if self.name == "live" {
            let https = node_yaml.get("https");
            let field = |f: &str| https.and_then(|h| h.get(f)).and_then(Value::as_str);
            if let Some(l) = field("listen") {
                l.clone_into(&mut self.https_listen);
            }
            if let Some(l) = field("proxy_listen") {
                l.clone_into(&mut self.proxy_listen);
            }
        }
        self
    }

    fn to_json(&self) -> Value {
        serde_json::json!({
            "name": self.name, "listen": self.listen, "run": self.run, "root": self.root,
            "vars": self.vars, "https_listen": self.https_listen,
            "proxy_listen": self.proxy_listen,
        })
    }
}

/// The template variables every instance has unless `install.vars` (or,
/// for the candidate, `install.candidate_vars`) gives them: the edge's
/// per-site metrics and JSON access log ("on"/"off"), the cap of sites
/// the metrics track by name, the metrics listener (the candidate's
/// default is the smoke host, the smoke port + 3), and whether the edge
/// warms its shared cache at start ("on"/"off"; the candidate's default
/// is "off").
pub const DEFAULT_VARS: [(&str, &str); 5] = [
    ("access_log", "on"),
    ("metrics", "on"),
    ("metrics_hosts", "10000"),
    ("metrics_listen", "127.0.0.1:9145"),
    ("warm", "on"),
];

/// An edge's default direct HTTPS listener (node YAML `https.listen`).
pub const HTTPS_LISTEN: &str = "443";
/// An edge's default PROXY-protocol listener (`https.proxy_listen`).
pub const PROXY_LISTEN: &str = "10443";

/// The placeholder certificate every TLS listener of an edge needs
/// (`<root>/tls/placeholder.crt` and `.key`; served only to the serving
/// probe's reserved host: docs/edge.md, "HTTPS"): a shell script that makes it with `openssl` in `dir` unless it
/// is there — self-signed, no site name (`CN=edgeform placeholder`),
/// P-256. Run by the installer on the node and by the nginx gate.
#[must_use]
pub fn placeholder_script(dir: &str) -> String {
    format!(
        "mkdir -p {dir} && if [ ! -s {dir}/placeholder.crt ] || [ ! -s {dir}/placeholder.key ]; then \
         openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 36500 \
         -subj '/CN=edgeform placeholder' -keyout {dir}/placeholder.key \
         -out {dir}/placeholder.crt >/dev/null 2>&1 && chmod 600 {dir}/placeholder.key; fi"
    )
}

/// A node's `install` block (docs/install.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Install {
    pub ssh: String,
    pub user: String,
    pub root: String,
    pub listen: String,
    pub smoke_listen: String,
    #[serde(default)]
    pub keep: Option<u32>,
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    #[serde(default)]
    pub candidate_vars: BTreeMap<String, String>,
    #[serde(default)]
    pub restart_on_change: BTreeMap<String, String>,
}

impl Install {
    /// Releases kept on the node (default 5, at least 2).
    #[must_use]
    pub fn keep(&self) -> usize {
        self.keep.map_or(5, |k| (k as usize).max(2))
    }

    /// `(host, port)` of `ssh` (`host`, `host:port`, `[v6]:port`; 22 by default).
    #[must_use]
    pub fn host_port(&self) -> (String, u16) {
        let s = self.ssh.as_str();
        if let Some(rest) = s.strip_prefix('[')
            && let Some((h, p)) = rest.split_once(']')
        {
            let port = p
                .strip_prefix(':')
                .and_then(|p| p.parse().ok())
                .unwrap_or(22);
            return (h.to_owned(), port);
        }
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_owned(), p.parse().unwrap_or(22)),
            _ => (s.to_owned(), 22),
        }
    }
}

/// One file of a node's bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    /// Path inside the release.
    pub path: String,
    pub mode: u32,
    pub bytes: Vec<u8>,
    /// `roles/<role>/<file>` it came from.
    pub source: String,
}

/// A node's bundle: what `build` writes and `install` uploads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub node: String,
    pub roles: Vec<String>,
    /// In path order.
    pub files: Vec<BundleFile>,
    pub smoke: Vec<SmokeRequest>,
}

/// One manifest line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub path: String,
    /// Octal text, e.g. `"0644"`.
    pub mode: String,
    pub sha256: String,
    pub size: u64,
}

/// `manifest.json` of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub node: String,
    pub roles: Vec<String>,
    /// sha256 over the sorted `path mode sha256` lines: the bundle version.
    pub version: String,
    /// The config repository commit it was built from, when known.
    #[serde(default)]
    pub commit: Option<String>,
    pub files: Vec<ManifestFile>,
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Bundle {
    /// The manifest (path, mode, sha256 of every file; the version).
    #[must_use]
    pub fn manifest(&self, commit: Option<&str>) -> Manifest {
        let files: Vec<ManifestFile> = self
            .files
            .iter()
            .map(|f| ManifestFile {
                path: f.path.clone(),
                mode: format!("{:04o}", f.mode),
                sha256: hex(&Sha256::digest(&f.bytes)),
                size: f.bytes.len() as u64,
            })
            .collect();
        let mut h = Sha256::new();
        for f in &files {
            h.update(format!("{} {} {}\n", f.path, f.mode, f.sha256));
        }
        Manifest {
            node: self.node.clone(),
            roles: self.roles.clone(),
            version: hex(&h.finalize()),
            commit: commit.map(str::to_owned),
            files,
        }
    }

    /// The bundle file at `path`.
    #[must_use]
    pub fn file(&self, path: &str) -> Option<&BundleFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

/// How one bundle file differs from the installed manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Added,
    Changed,
    Mode,
    Removed,
}

impl Change {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Changed => "changed",
            Change::Mode => "mode",
            Change::Removed => "removed",
        }
    }
}

/// The files of `desired` that differ from `installed` (path order).
#[must_use]
pub fn drift(installed: Option<&Manifest>, desired: &Manifest) -> Vec<(String, Change)> {
    let old: BTreeMap<&str, &ManifestFile> = installed
        .map(|m| m.files.iter().map(|f| (f.path.as_str(), f)).collect())
        .unwrap_or_default();
    let new: BTreeMap<&str, &ManifestFile> =
        desired.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let mut out = Vec::new();
    for (p, f) in &new {
        match old.get(p) {
            None => out.push(((*p).to_owned(), Change::Added)),
            Some(o) if o.sha256 != f.sha256 => out.push(((*p).to_owned(), Change::Changed)),
            Some(o) if o.mode != f.mode => out.push(((*p).to_owned(), Change::Mode)),
            Some(_) => {}
        }
    }
    for p in old.keys() {
        if !new.contains_key(p) {
            out.push(((*p).to_owned(), Change::Removed));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Render one template (the role templates' engine, `roletmpl`): every
/// `{{ a.b.0 }}` replaced by the value at that path of `context`. Every
/// problem is reported, each at its `file:line:col`.
///
/// # Errors
/// Unknown fields, malformed references.
pub fn render(file: &str, template: &str, context: &Value) -> Result<String, Vec<Error>> {
    roletmpl::render(file, template, context).map_err(|es| {
        es.into_iter()
            .map(|e| Error {
                kind: match e.kind {
                    roletmpl::ErrorKind::UnknownField => ErrorKind::UnknownField,
                    roletmpl::ErrorKind::TemplateSyntax => ErrorKind::TemplateSyntax,
                },
                file: e.file,
                line: e.line,
                column: e.column,
                message: e.message,
            })
            .collect()
    })
}

/// The template context of a node: `node` (its YAML), `instance` (the
/// process this rendering is for), `live` (the live instance in both
/// renderings: what the node's long-running services, such as the
/// agent's serving probe, talk to), `roles`.
#[must_use]
pub fn context(node_yaml: &Value, instance: &Instance, live: &Instance, roles: &[String]) -> Value {
    serde_json::json!({
        "node": node_yaml,
        "instance": instance.to_json(),
        "live": live.to_json(),
        "roles": roles,
    })
}

/// The bundle of one node: the files of every role folder of its roles,
/// templates rendered for the live instance; templates whose candidate
/// rendering differs are added under `candidate/`.
///
/// # Errors
/// Every template problem, and two roles shipping one path.
pub fn bundle(
    node: &str,
    node_yaml: &Value,
    node_roles: &[String],
    roles: &Roles,
    live: &Instance,
    candidate: &Instance,
) -> Result<Option<Bundle>, Vec<Error>> {
    let mine: Vec<String> = node_roles
        .iter()
        .filter(|r| roles.files.contains_key(*r))
        .cloned()
        .collect();
    if mine.is_empty() {
        return Ok(None);
    }
    let live_cx = context(node_yaml, live, live, &mine);
    let cand_cx = context(node_yaml, candidate, live, &mine);
    let mut files: BTreeMap<String, BundleFile> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut add = |f: BundleFile, errors: &mut Vec<Error>| {
        let conflict = if f.path == MANIFEST {
            // The release's own manifest is written there, over it.
            format!(
                "`{MANIFEST}` at a bundle's top is the release's own manifest, written by edgeform: name the file otherwise"
            )
        } else if let Some(other) = files.get(&f.path) {
            format!(
                "node `{node}`: `{}` is also shipped by {}",
                f.path, other.source
            )
        } else {
            files.insert(f.path.clone(), f);
            return;
        };
        errors.push(Error {
            kind: ErrorKind::PathConflict,
            file: f.source,
            line: 0,
            column: 0,
            message: conflict,
        });
    };
    for role in &mine {
        for rf in &roles.files[role] {
            let source = rf.source(role);
            let Some(out_path) = rf.path.strip_suffix(TEMPLATE_SUFFIX) else {
                add(
                    BundleFile {
                        path: rf.path.clone(),
                        mode: rf.mode,
                        bytes: rf.bytes.clone(),
                        source,
                    },
                    &mut errors,
                );
                continue;
            };
            let Ok(text) = std::str::from_utf8(&rf.bytes) else {
                errors.push(Error {
                    kind: ErrorKind::TemplateSyntax,
                    file: source,
                    line: 0,
                    column: 0,
                    message: "a template must be UTF-8 text".into(),
                });
                continue;
            };
            let rendered = render(&source, text, &live_cx)
                .and_then(|l| render(&source, text, &cand_cx).map(|c| (l, c)));
            match rendered {
                Ok((l, c)) => {
                    if l != c {
                        add(
                            BundleFile {
                                path: format!("{CANDIDATE_DIR}/{out_path}"),
                                mode: rf.mode,
                                bytes: c.into_bytes(),
                                source: source.clone(),
                            },
                            &mut errors,
                        );
                    }
                    add(
                        BundleFile {
                            path: out_path.to_owned(),
                            mode: rf.mode,
                            bytes: l.into_bytes(),
                            source,
                        },
                        &mut errors,
                    );
                }
                Err(es) => errors.extend(es.into_iter().map(|mut e| {
                    e.message = format!("{} (node `{node}`)", e.message);
                    e
                })),
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let smoke = mine
        .iter()
        .flat_map(|r| roles.smoke.get(r).cloned().unwrap_or_default())
        .collect();
    Ok(Some(Bundle {
        node: node.to_owned(),
        roles: mine,
        files: files.into_values().collect(),
        smoke,
    }))
}

/// Every string of `v` that is an absolute path, moved under `root` (the
/// local gate renders a node's bundle in a scratch folder, so `nginx -t`
/// tests the configuration, not the control host's file system). Its
/// `..` are resolved first, as at `/` (where `/..` is `/`): a path that
/// climbs (`/../../etc`) stays under `root` too.
#[must_use]
pub fn rebase_paths(v: &Value, root: &str) -> Value {
    match v {
        Value::String(s) if s.starts_with('/') => {
            Value::String(format!("{root}{}", resolved_at_root(s)))
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| rebase_paths(x, root)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), rebase_paths(x, root)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The absolute path `s` with its `.` and `..` resolved lexically, `..`
/// stopping at `/` (a trailing `/` kept).
pub(crate) fn resolved_at_root(s: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in s.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let mut out = format!("/{}", parts.join("/"));
    if s.ends_with('/') && out.len() > 1 {
        out.push('/');
    }
    out
}

/// `NAME='value'` lines for a node's environment file, `<root>/secrets.env`
/// (sourced by `sh`, read by systemd's `EnvironmentFile=`): single quotes,
/// a `'` written as `'\''`. Pure.
#[must_use]
pub fn env_file(secrets: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (name, value) in secrets {
        out.push_str(name);
        out.push_str("='");
        out.push_str(&value.replace('\'', r"'\''"));
        out.push_str("'\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_file_named_like_the_release_manifest_is_refused() {
        let mut roles = Roles::default();
        roles.files.insert(
            "edge".into(),
            vec![RoleFile {
                path: MANIFEST.into(),
                mode: 0o644,
                bytes: b"{}".to_vec(),
            }],
        );
        let (live, candidate) = Instance::pair(None);
        let errors = bundle(
            "e1",
            &serde_json::json!({"name": "e1"}),
            &["edge".to_owned()],
            &roles,
            &live,
            &candidate,
        )
        .expect_err("refused");
        assert_eq!(errors[0].kind, ErrorKind::PathConflict, "{errors:?}");
        assert!(errors[0].message.contains("manifest"), "{errors:?}");
    }

    #[test]
    fn rebased_paths_never_climb_out_of_the_scratch_root() {
        let v = serde_json::json!({"install": {"root": "/../../../../work/x"},
            "cache": {"dirs": ["/var/cache/../../../../etc/", "/a/./b/../c"]}, "name": "e1"});
        assert_eq!(
            rebase_paths(&v, "/scratch"),
            serde_json::json!({"install": {"root": "/scratch/work/x"},
                "cache": {"dirs": ["/scratch/etc/", "/scratch/a/c"]}, "name": "e1"})
        );
        assert_eq!(resolved_at_root("/"), "/");
        assert_eq!(resolved_at_root("/.."), "/");
    }

    #[test]
    fn render_fills_fields_and_reports_every_unknown_one_with_its_position() {
        let cx = serde_json::json!({"node": {"name": "e1", "cache": {"dirs": ["/a", "/b"], "levels": "1:2"}, "n": 3}});
        assert_eq!(
            render(
                "t",
                "x {{ node.name }} {{node.cache.dirs.1}} {{ node.n }}",
                &cx
            )
            .unwrap(),
            "x e1 /b 3"
        );
        assert_eq!(
            render("t", "d: {{ node.cache.dirs }}", &cx).unwrap(),
            r#"d: ["/a","/b"]"#
        );
        let e = render(
            "roles/edge/a.tmpl",
            "ok\n  {{ node.cach.key }} {{ node.cache.nope }}",
            &cx,
        )
        .unwrap_err();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].line, e[0].column), (2, 3));
        assert_eq!(e[0].kind, ErrorKind::UnknownField);
        assert!(
            e[0].to_string()
                .starts_with("roles/edge/a.tmpl:2:3: unknown field `node.cach.key`"),
            "{}",
            e[0]
        );
        assert!(
            e[1].message.contains("`node.cache` has: dirs, levels"),
            "{}",
            e[1]
        );
        let e = render("t", "a {{ node.name", &cx).unwrap_err();
        assert_eq!(e[0].kind, ErrorKind::TemplateSyntax);
    }

    #[test]
    fn drift_lists_added_changed_mode_and_removed_files() {
        let m = |files: &[(&str, &str, &str)]| Manifest {
            node: "n".into(),
            roles: vec![],
            version: String::new(),
            commit: None,
            files: files
                .iter()
                .map(|(p, mode, sha)| ManifestFile {
                    path: (*p).into(),
                    mode: (*mode).into(),
                    sha256: (*sha).into(),
                    size: 0,
                })
                .collect(),
        };
        let old = m(&[("a", "0644", "1"), ("b", "0644", "2"), ("c", "0644", "3")]);
        let new = m(&[("a", "0644", "1"), ("b", "0755", "2"), ("d", "0644", "4")]);
        assert_eq!(
            drift(Some(&old), &new),
            vec![
                ("b".into(), Change::Mode),
                ("c".into(), Change::Removed),
                ("d".into(), Change::Added)
            ]
        );
        assert_eq!(drift(None, &new).len(), 3);
    }
}
