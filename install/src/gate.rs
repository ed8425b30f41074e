//! The bundle gates of `edgeform check` (and of `install` before it
//! uploads): every Lua file compiles (`luajit -b`), every node's rendered
//! nginx.conf passes `nginx -t` in a scratch prefix, every rendered
//! `agent.yaml` passes the agent's own validation, systemd units pass
//! `systemd-analyze verify` where it is installed. All problems at once.
//!
//! `nginx -t` runs on a rendering for a scratch folder: the node's
//! absolute paths (its YAML's, `instance.*`) are moved under it, so the
//! gate tests the configuration, not the control host's file system. The
//! modules are the ones the configuration loads (`load_module` with
//! absolute paths: see DEPENDENCIES.md on the `modules-enabled` trap).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{Bundle, Instance, Roles};

/// Which gate found a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gate {
    Lua,
    Nginx,
    Agent,
    Systemd,
}

impl Gate {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Lua => "lua",
            Gate::Nginx => "nginx",
            Gate::Agent => "agent",
            Gate::Systemd => "systemd",
        }
    }

    /// The gate named `name` (`--skip-gate`).
    #[must_use]
    pub fn parse(name: &str) -> Option<Gate> {
        [Gate::Lua, Gate::Nginx, Gate::Agent, Gate::Systemd]
            .into_iter()
            .find(|g| g.as_str() == name)
    }
}

/// One problem a gate found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub gate: Gate,
    /// `roles/<role>/<file>` (with `:line[:col]` where the tool gives one).
    pub location: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (gate {})",
            self.location,
            self.message,
            self.gate.as_str()
        )
    }
}

/// A node to gate: its name, YAML and roles.
pub struct GateNode<'a> {
    pub name: &'a str,
    pub yaml: &'a Value,
    pub roles: Vec<String>,
    pub live: Instance,
    /// The bundle `build` gives it.
    pub bundle: &'a Bundle,
}

/// What ran and what was skipped.
#[derive(Debug, Default)]
pub struct Outcome {
    pub problems: Vec<Problem>,
    /// One line per skipped gate, saying why.
    pub skipped: Vec<String>,
    /// How many checks ran per gate.
    pub ran: Vec<(Gate, usize)>,
    /// How `nginx -t` was confined, when it ran.
    pub sandbox: Option<String>,
}

fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Run every gate not in `skip` over the nodes' bundles.
#[must_use]
pub fn run(nodes: &[GateNode<'_>], roles: &Roles, skip: &BTreeSet<Gate>) -> Outcome {
    let mut out = Outcome::default();
    for g in skip {
        out.skipped
            .push(format!("gate {} skipped (--skip-gate)", g.as_str()));
    }
    let Ok(scratch) = tempfile::tempdir() else {
        out.problems.push(Problem {
            gate: Gate::Nginx,
            location: "roles/".into(),
            message: "cannot create a scratch folder for the gates".into(),
        });
        return out;
    };
    if !skip.contains(&Gate::Lua) {
        lua(nodes, scratch.path(), &mut out);
    }
    if !skip.contains(&Gate::Nginx) {
        nginx(nodes, roles, scratch.path(), &mut out);
    }
    if !skip.contains(&Gate::Agent) {
        agent(nodes, &mut out);
    }
    if !skip.contains(&Gate::Systemd) {
        systemd(nodes, scratch.path(), &mut out);
    }
    out
}

fn missing(out: &mut Outcome, gate: Gate, tool: &str, package: &str) {
    out.problems.push(Problem {
        gate,
        location: "roles/".into(),
        message: format!(
            "`{tool}` not found (install {package}), or skip this gate explicitly with --skip-gate {}",
            gate.as_str()
        ),
    });
}

fn lua(nodes: &[GateNode<'_>], scratch: &Path, out: &mut Outcome) {
    let mut seen = BTreeSet::new();
    let mut todo = Vec::new();
    for n in nodes {
        for f in &n.bundle.files {
            if Path::new(&f.path).extension().is_some_and(|e| e == "lua")
                && seen.insert((f.source.clone(), f.bytes.clone()))
            {
                let shown = if f.source.ends_with(".tmpl") {
                    format!("{} (rendered for {})", f.source, n.name)
                } else {
                    f.source.clone()
                };
                todo.push((shown, f.bytes.clone()));
            }
        }
    }
    if todo.is_empty() {
        return;
    }
    let Some(luajit) = tool("luajit") else {
        return missing(out, Gate::Lua, "luajit", "luajit2, never Debian's luajit");
    };
    for (i, (shown, bytes)) in todo.iter().enumerate() {
        let dir = scratch.join(format!("lua-{i}"));
        let name = shown.split(' ').next().unwrap_or(shown);
        let file = dir.join(name);
        if let Some(parent) = file.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if std::fs::write(&file, bytes).is_err() {
            continue;
        }
        match Command::new(&luajit)
            .args(["-b", name, "/dev/null"])
            .current_dir(&dir)
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stderr);
                let text = text.trim().trim_start_matches("luajit: ");
                // `roles/edge/lua/x.lua:3: unexpected symbol near 'x'`
                let (location, message) =
                    match text.strip_prefix(name).and_then(|r| r.strip_prefix(':')) {
                        Some(r) => match r.split_once(':') {
                            Some((line, msg)) if line.parse::<u32>().is_ok() => {
                                (format!("{name}:{line}"), msg.trim().to_owned())
                            }
                            _ => (name.to_owned(), r.trim().to_owned()),
                        },
                        None => (name.to_owned(), text.to_owned()),
                    };
                let suffix = shown.strip_prefix(name).unwrap_or("");
                out.problems.push(Problem {
                    gate: Gate::Lua,
                    location: format!("{location}{suffix}"),
                    message,
                });
            }
            Err(e) => out.problems.push(Problem {
                gate: Gate::Lua,
                location: shown.clone(),
                message: format!("cannot run luajit: {e}"),
            }),
        }
    }
    out.ran.push((Gate::Lua, todo.len()));
}

/// The absolute paths of a rebased node YAML, for their parent folders.
fn strings(v: &Value, into: &mut Vec<String>) {
    match v {
        Value::String(s) => into.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, into)),
        Value::Object(m) => m.values().for_each(|x| strings(x, into)),
        _ => {}
    }
}

/// How `nginx -t` is confined (docs/install.md, "The nginx gate's sandbox").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sandbox {
    /// Run as root: a new network namespace (`unshare --net`), then
    /// `setpriv` to uid/gid 65534 (nobody) with no new privileges.
    NetAndNobody,
    /// Run as an unprivileged user: a new user and network namespace
    /// (`unshare --user --net`), as that user.
    NetAsUser,
    /// An unprivileged user where user namespaces are not permitted: as
    /// that user, with the network (said in the output).
    UserOnly,
    /// Root where network namespaces are not permitted (a container
    /// without `CAP_SYS_ADMIN`): `setpriv` to nobody, with the network
    /// (said in the output).
    NobodyOnly,
    /// Root without `setpriv`: the gate refuses to run nginx.
    Unavailable,
}

/// The uid and gid the gate runs nginx as when started as root.
pub const NOBODY: u32 = 65534;

fn runs(program: &Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Which sandbox this machine allows (probed by running `true` in it).
#[must_use]
pub fn sandbox() -> Sandbox {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    let unshare = tool("unshare");
    if root {
        let Some(setpriv) = tool("setpriv") else {
            return Sandbox::Unavailable;
        };
        let id = NOBODY.to_string();
        let drop: [&str; 8] = [
            "--reuid",
            &id,
            "--regid",
            &id,
            "--clear-groups",
            "--no-new-privs",
            "--",
            "true",
        ];
        let setpriv_text = setpriv.display().to_string();
        let mut in_ns = vec!["--net", "--", setpriv_text.as_str()];
        in_ns.extend(drop);
        if unshare.is_some_and(|u| runs(&u, &in_ns)) {
            Sandbox::NetAndNobody
        } else if runs(&setpriv, &drop) {
            Sandbox::NobodyOnly
        } else {
            Sandbox::Unavailable
        }
    } else if unshare.is_some_and(|u| runs(&u, &["--user", "--net", "--", "true"])) {
        Sandbox::NetAsUser
    } else {
        Sandbox::UserOnly
    }
}

/// Run as root first thing in the gate's own network namespace (the
/// sysctls are per namespace): any port and any address can be bound
/// there, so `nginx -t` as nobody opens the node's listen sockets (`:80`,
/// its public addresses) in an empty network. Then `exec "$@"`.
const OPEN_PORTS: &str = "echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start 2>/dev/null; \
                          echo 1 > /proc/sys/net/ipv4/ip_nonlocal_bind 2>/dev/null; \
                          echo 1 > /proc/sys/net/ipv6/ip_nonlocal_bind 2>/dev/null; \
                          exec \"$@\"";

/// `program` (`nginx`, `systemd-analyze`) wrapped in `sandbox`.
fn sandboxed(sandbox: &Sandbox, program: &Path) -> Option<Command> {
    let mut c = match sandbox {
        Sandbox::NetAndNobody => {
            let mut c = Command::new(tool("unshare")?);
            let id = NOBODY.to_string();
            c.arg("--net")
                .arg("--")
                .arg(tool("sh")?)
                .args(["-c", OPEN_PORTS, "sh"])
                .arg(tool("setpriv")?)
                .args(["--reuid", &id, "--regid", &id, "--clear-groups"])
                .args(["--no-new-privs", "--"])
                .arg(program);
            c
        }
        Sandbox::NetAsUser => {
            let mut c = Command::new(tool("unshare")?);
            c.args(["--user", "--net", "--"]).arg(program);
            c
        }
        Sandbox::NobodyOnly => {
            let mut c = Command::new(tool("setpriv")?);
            let id = NOBODY.to_string();
            c.args(["--reuid", &id, "--regid", &id, "--clear-groups"])
                .args(["--no-new-privs", "--"])
                .arg(program);
            c
        }
        Sandbox::UserOnly => Command::new(program),
        Sandbox::Unavailable => return None,
    };
    c.env_clear().stdin(std::process::Stdio::null());
    Some(c)
}

/// Give the node's scratch folder to the sandbox's user (root only).
fn hand_over(dir: &Path) {
    let _ = std::os::unix::fs::chown(dir, Some(NOBODY), Some(NOBODY));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                hand_over(&p);
            } else {
                let _ = std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY));
            }
        }
    }
}

/// The message for every line `nginx -t` refused: nginx's own text is
/// never shown (it can quote files of this machine).
const REFUSED: &str = "nginx -t refused this line (nginx's message is not shown: run \
                       `edgeform build` and `nginx -t` on the bundle to read it)";

/// Line `line` (1-based) of a role file, trimmed and bounded, for messages.
fn source_line(roles: &Roles, source: &str, line: usize) -> Option<String> {
    let rest = source.strip_prefix("roles/")?;
    let (role, path) = rest.split_once('/')?;
    let file = roles.files.get(role)?.iter().find(|f| f.path == path)?;
    let text = String::from_utf8_lossy(&file.bytes);
    let l = text.lines().nth(line.checked_sub(1)?)?.trim();
    let shown: String = l
        .chars()
        .take(120)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    Some(if l.chars().count() > 120 {
        format!("{shown}…")
    } else {
        shown
    })
}

fn with_line(roles: &Roles, source: &str, line: usize, message: &str) -> String {
    match source_line(roles, source, line) {
        Some(l) if !l.is_empty() => format!("{message}: `{l}`"),
        _ => message.to_owned(),
    }
}

/// The most files the confinement reads for one node (`nginx.conf` and
/// what it includes, distinct): past it the bundle is refused, never read
/// in part (nginx would read them all).
pub const MAX_INCLUDED: usize = 256;

/// The confinement check of a node's gate rendering: `nginx.conf` and
/// every bundle file it includes (docs/install.md). `true`: nothing refused.
fn confined(
    n: &GateNode<'_>,
    bundle: &Bundle,
    bounds: &super::confine::Bounds<'_>,
    out: &mut Outcome,
) -> bool {
    // (file, the file and line that include it)
    let mut todo: Vec<(String, Option<(String, usize)>)> = vec![("nginx.conf".to_owned(), None)];
    let mut seen = BTreeSet::new();
    let mut ok = true;
    while let Some((path, by)) = todo.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        if seen.len() > MAX_INCLUDED {
            let location = by.map_or_else(
                || "nginx.conf".to_owned(),
                |(source, line)| format!("{source}:{line}"),
            );
            out.problems.push(Problem {
                gate: Gate::Nginx,
                location: format!("{location} (rendered for {})", n.name),
                message: format!(
                    "the configuration includes more than {MAX_INCLUDED} files: refused (the \
                     gate reads every file nginx would read, or runs nothing)"
                ),
            });
            return false;
        }
        let Some(f) = bundle.file(&path) else {
            continue;
        };
        let text = String::from_utf8_lossy(&f.bytes);
        let (refused, includes) = super::confine::check(&text, bounds);
        for r in refused {
            ok = false;
            out.problems.push(Problem {
                gate: Gate::Nginx,
                location: format!("{}:{} (rendered for {})", f.source, r.line, n.name),
                message: r.message,
            });
        }
        for (inc, line) in includes {
            todo.extend(
                bundle
                    .files
                    .iter()
                    .filter(|b| glob(&inc, &b.path))
                    .map(|b| (b.path.clone(), Some((f.source.clone(), line)))),
            );
        }
    }
    ok
}

/// `pattern` (nginx's `include` glob: `*`, `?`) matches `path`. A `*`
/// here also crosses `/` (more files checked, never fewer). Backtracking
/// to the last `*` only: `O(pattern × path)` for any pattern a pull
/// request writes, never exponential.
fn glob(pattern: &str, path: &str) -> bool {
    let p: Vec<char> = pattern.chars().take(256).collect();
    let s: Vec<char> = path.chars().collect();
    let (mut i, mut j) = (0, 0);
    // The last `*` seen and where in `path` its match would end next.
    let mut star: Option<(usize, usize)> = None;
    while j < s.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == s[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    star = Some((si, sj + 1));
                    i = si + 1;
                    j = sj + 1;
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

fn nginx(nodes: &[GateNode<'_>], roles: &Roles, scratch: &Path, out: &mut Outcome) {
    let with_conf: Vec<&GateNode<'_>> = nodes
        .iter()
        .filter(|n| n.bundle.file("nginx.conf").is_some())
        .collect();
    if with_conf.is_empty() {
        return;
    }
    let Some(nginx) = tool("nginx") else {
        return missing(
            out,
            Gate::Nginx,
            "nginx",
            "nginx and its modules: scripts/test installs them",
        );
    };
    let sandbox = sandbox();
    match sandbox {
        Sandbox::Unavailable => {
            out.problems.push(Problem {
                gate: Gate::Nginx,
                location: "roles/".into(),
                message: "cannot sandbox `nginx -t` (running as root, it needs `setpriv` from \
                          util-linux to run it as nobody); nginx was not run. Skip this gate \
                          explicitly with --skip-gate nginx"
                    .into(),
            });
            return;
        }
        Sandbox::UserOnly => out.skipped.push(
            "gate nginx ran with the network: user namespaces are not permitted here \
             (`unshare --user --net`); it runs as this (unprivileged) user"
                .into(),
        ),
        Sandbox::NobodyOnly => {
            out.sandbox = Some("uid 65534 (nobody)".into());
            out.skipped.push(
                "gate nginx ran with the network: network namespaces are not permitted here \
                 (`unshare --net`); it runs as nobody"
                    .into(),
            );
        }
        Sandbox::NetAndNobody => out.sandbox = Some("no network, uid 65534 (nobody)".into()),
        Sandbox::NetAsUser => out.sandbox = Some("no network, as this user".into()),
    }
    // The sandbox's user walks into the scratch folder.
    let as_nobody = matches!(sandbox, Sandbox::NetAndNobody | Sandbox::NobodyOnly);
    if as_nobody {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o711));
    }
    let mut ran = 0;
    for n in with_conf {
        let base = scratch.join("nginx").join(n.name);
        let root = base.display().to_string();
        let yaml = super::rebase_paths(n.yaml, &root);
        let gate_instance = Instance {
            name: "gate".into(),
            listen: n.live.listen.clone(),
            run: format!("{root}{}", super::resolved_at_root(&n.live.run)),
            root: format!("{root}{}", super::resolved_at_root(&n.live.root)),
            vars: n.live.vars.clone(),
            https_listen: n.live.https_listen.clone(),
            proxy_listen: n.live.proxy_listen.clone(),
        };
        let bundle = match super::bundle(
            n.name,
            &yaml,
            &n.roles,
            roles,
            &gate_instance,
            &gate_instance,
        ) {
            Ok(Some(b)) => b,
            // Template errors are reported by the build itself.
            _ => continue,
        };
        let release = base.join("release");
        let bounds = super::confine::Bounds {
            prefix: &release,
            scratch: &base,
        };
        if !confined(n, &bundle, &bounds, out) {
            continue;
        }
        let mut paths = Vec::new();
        strings(&yaml, &mut paths);
        paths.push(gate_instance.run.clone());
        // Only folders inside the scratch root, `..` resolved (a value
        // cannot climb out of it).
        let inside = format!("{root}/");
        for p in paths.iter().map(|p| super::resolved_at_root(p)) {
            if p.starts_with(&inside)
                && let Some(parent) = Path::new(&p).parent()
            {
                let _ = std::fs::create_dir_all(parent);
            }
        }
        let _ = std::fs::create_dir_all(&gate_instance.run);
        // The Redis CA (`lua_ssl_trusted_certificate`, loaded by `nginx -t`)
        // is a file of the node, not of the bundle: the system store stands
        // in for it here; the node's own gate reads the real one.
        if let Some(ca) = yaml
            .pointer("/redis/tls/ca_file")
            .and_then(Value::as_str)
            .map(super::resolved_at_root)
            .filter(|p| p.starts_with(&format!("{root}/")) && !Path::new(p).exists())
        {
            let _ = std::fs::copy(roletmpl::SYSTEM_CA_FILE, ca);
        }
        // The edge's TLS listeners need the placeholder certificate the
        // installer makes on the node.
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg(super::placeholder_script(&format!(
                "'{}/tls'",
                gate_instance.root.replace('\'', "'\\''")
            )))
            .status();
        // Lua files stay out: `nginx -t` runs no Lua (the lua gate
        // compiles them), so none of the bundle's code can run here.
        for f in bundle.files.iter().filter(|f| !f.path.ends_with(".lua")) {
            let file = release.join(&f.path);
            if let Some(parent) = file.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::write(&file, &f.bytes);
        }
        let _ = std::fs::create_dir_all(&release);
        if as_nobody {
            hand_over(&base);
        }
        let conf = release.join("nginx.conf");
        let source = bundle
            .file("nginx.conf")
            .map_or_else(|| "nginx.conf".to_owned(), |f| f.source.clone());
        ran += 1;
        let Some(mut command) = sandboxed(&sandbox, &nginx) else {
            continue;
        };
        let o = match command
            .arg("-t")
            .arg("-e")
            .arg("stderr")
            .arg("-p")
            .arg(format!("{}/", release.display()))
            .arg("-c")
            .arg(&conf)
            .current_dir(&release)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                out.problems.push(Problem {
                    gate: Gate::Nginx,
                    location: source,
                    message: format!("cannot run nginx: {}", e.kind()),
                });
                continue;
            }
        };
        if o.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&o.stderr);
        let release_text = format!("{}/", release.display());
        let mut found = BTreeSet::new();
        for line in text.lines() {
            if !["[emerg]", "[alert]", "[crit]"]
                .iter()
                .any(|l| line.contains(l))
            {
                continue;
            }
            // `… in /scratch/release/nginx.conf:12`: only the place is used.
            let place = line
                .rsplit_once(" in ")
                .and_then(|(_, p)| p.strip_prefix(&release_text))
                .and_then(|p| p.rsplit_once(':'))
                .and_then(|(file, l)| Some((file.to_owned(), l.trim().parse::<usize>().ok()?)));
            let (location, message) = match place
                .and_then(|(file, l)| Some((bundle.file(&file)?.source.clone(), l)))
            {
                Some((src, l)) => (format!("{src}:{l}"), with_line(roles, &src, l, REFUSED)),
                None => (
                    source.clone(),
                    "nginx -t refused the configuration at a place outside the bundle (nginx's \
                     message is not shown)"
                        .to_owned(),
                ),
            };
            if found.insert(location.clone()) {
                out.problems.push(Problem {
                    gate: Gate::Nginx,
                    location: format!("{location} (rendered for {})", n.name),
                    message,
                });
            }
        }
        if found.is_empty() {
            out.problems.push(Problem {
                gate: Gate::Nginx,
                location: format!("{source} (rendered for {})", n.name),
                message: format!(
                    "nginx -t failed ({}) without naming a line (nginx's message is not shown)",
                    o.status
                ),
            });
        }
    }
    out.ran.push((Gate::Nginx, ran));
}

fn agent(nodes: &[GateNode<'_>], out: &mut Outcome) {
    let mut ran = 0;
    for n in nodes {
        let Some(f) = n.bundle.file("agent.yaml") else {
            continue;
        };
        ran += 1;
        let shown = format!("{} (rendered for {})", f.source, n.name);
        let text = String::from_utf8_lossy(&f.bytes);
        // Variables are the node's: set there, not here.
        let env = |_: &str| Some("set-on-the-node".to_owned());
        if let Err(errors) = agentconf::parse_unread(&shown, &text, &env) {
            for e in errors.0 {
                out.problems.push(Problem {
                    gate: Gate::Agent,
                    location: format!(
                        "{}:{}:{} (rendered for {})",
                        f.source, e.line, e.column, n.name
                    ),
                    message: e.message,
                });
            }
        }
    }
    if ran > 0 {
        out.ran.push((Gate::Agent, ran));
    }
}

const UNIT_SUFFIXES: [&str; 5] = [".service", ".timer", ".socket", ".path", ".mount"];

fn systemd(nodes: &[GateNode<'_>], scratch: &Path, out: &mut Outcome) {
    let mut seen = BTreeSet::new();
    let units: Vec<_> = nodes
        .iter()
        .flat_map(|n| n.bundle.files.iter())
        .filter(|f| UNIT_SUFFIXES.iter().any(|s| f.path.ends_with(s)))
        .filter(|f| seen.insert((f.source.clone(), f.bytes.clone())))
        .collect();
    if units.is_empty() {
        return;
    }
    let Some(analyze) = tool("systemd-analyze") else {
        out.skipped
            .push("gate systemd skipped: systemd-analyze is not installed here".into());
        return;
    };
    // Confined as `nginx -t` is: `verify` follows what the unit names
    // (its `Documentation=man:` pages went to `man`, whose options a
    // crafted page name can set), so it runs without man pages and
    // generators, as nobody, without network, in its scratch folder.
    let sandbox = sandbox();
    if sandbox == Sandbox::Unavailable {
        out.problems.push(Problem {
            gate: Gate::Systemd,
            location: "roles/".into(),
            message: "cannot sandbox `systemd-analyze verify` (running as root, it needs \
                      `setpriv` from util-linux to run it as nobody); it was not run. Skip this \
                      gate explicitly with --skip-gate systemd"
                .into(),
        });
        return;
    }
    let as_nobody = matches!(sandbox, Sandbox::NetAndNobody | Sandbox::NobodyOnly);
    if as_nobody {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o711));
    }
    for (i, f) in units.iter().enumerate() {
        let dir = scratch.join(format!("units-{i}"));
        let _ = std::fs::create_dir_all(&dir);
        let name = Path::new(&f.path)
            .file_name()
            .map_or_else(|| f.path.clone(), |n| n.to_string_lossy().into_owned());
        let file = dir.join(&name);
        let _ = std::fs::write(&file, &f.bytes);
        if as_nobody {
            hand_over(&dir);
        }
        let Some(mut command) = sandboxed(&sandbox, &analyze) else {
            continue;
        };
        let Ok(o) = command
            .current_dir(&dir)
            .args(["verify", "--man=no", "--generators=no"])
            .arg(&file)
            .output()
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&o.stderr);
        let file_text = file.display().to_string();
        for line in text.lines().filter(|l| l.starts_with(&file_text)) {
            // `/scratch/x.service:3: Unknown key name 'Foo' in section 'Service', ignoring.`
            let rest = &line[file_text.len()..];
            let (location, message) = match rest.strip_prefix(':').and_then(|r| r.split_once(':')) {
                Some((l, m)) if l.parse::<u32>().is_ok() => {
                    (format!("{}:{l}", f.source), m.trim().to_owned())
                }
                _ => (
                    f.source.clone(),
                    rest.trim_start_matches(':').trim().to_owned(),
                ),
            };
            out.problems.push(Problem {
                gate: Gate::Systemd,
                location,
                message,
            });
        }
        if !o.status.success()
            && !out
                .problems
                .iter()
                .any(|p| p.location.starts_with(&f.source))
        {
            out.problems.push(Problem {
                gate: Gate::Systemd,
                location: f.source.clone(),
                message: text.trim().replace(&file_text, &f.source),
            });
        }
    }
    out.ran.push((Gate::Systemd, units.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_globs_match_as_before_and_a_pull_requests_stars_cost_linear_time() {
        for (p, path, want) in [
            ("conf.d/*.conf", "conf.d/a.conf", true),
            ("conf.d/*.conf", "conf.d/a.confx", false),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*a*b", "xaybzb", true),
            ("*a*b", "xaybzc", false),
            ("sites/*", "sites/x/y.conf", true),
        ] {
            assert_eq!(glob(p, path), want, "{p} {path}");
        }
        // 200 stars against a long path that fails at its end: the
        // naive recursion never returned (2^n), this is one pass per star.
        let stars = format!("{}z", "*".repeat(200));
        assert!(!glob(&stars, &"a".repeat(10_000)));
        assert!(glob(&stars, &format!("{}z", "a".repeat(10_000))));
    }
}
