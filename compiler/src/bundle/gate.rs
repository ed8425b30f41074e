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
    let mut ran = 0;
    for n in with_conf {
        let base = scratch.join("nginx").join(n.name);
        let root = base.display().to_string();
        let yaml = super::rebase_paths(n.yaml, &root);
        let gate_instance = Instance {
            name: "gate".into(),
            listen: n.live.listen.clone(),
            run: format!("{root}{}", n.live.run),
            root: format!("{root}{}", n.live.root),
            vars: n.live.vars.clone(),
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
        let mut paths = Vec::new();
        strings(&yaml, &mut paths);
        paths.push(gate_instance.run.clone());
        for p in paths.iter().filter(|p| p.starts_with(&root)) {
            if let Some(parent) = Path::new(p).parent() {
                let _ = std::fs::create_dir_all(parent);
            }
        }
        let _ = std::fs::create_dir_all(&gate_instance.run);
        for f in &bundle.files {
            let file = release.join(&f.path);
            if let Some(parent) = file.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::write(&file, &f.bytes);
        }
        let conf = release.join("nginx.conf");
        let source = bundle
            .file("nginx.conf")
            .map_or_else(|| "nginx.conf".to_owned(), |f| f.source.clone());
        ran += 1;
        let o = match Command::new(&nginx)
            .arg("-t")
            .arg("-p")
            .arg(format!("{}/", release.display()))
            .arg("-c")
            .arg(&conf)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                out.problems.push(Problem {
                    gate: Gate::Nginx,
                    location: source,
                    message: format!("cannot run nginx: {e}"),
                });
                continue;
            }
        };
        if o.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&o.stderr);
        let release_text = format!("{}/", release.display());
        let mut found = false;
        for line in text.lines() {
            let Some(at) = line.find("[emerg]").or_else(|| line.find("[alert]")) else {
                continue;
            };
            found = true;
            let msg = line[at..].split_once(' ').map_or(line, |(_, m)| m);
            // `[emerg] 123#123: message`
            let msg = match msg.split_once(": ") {
                Some((pid, m)) if pid.chars().all(|c| c.is_ascii_digit() || c == '#') => m,
                _ => msg,
            };
            // `unknown directive "x" in /scratch/release/nginx.conf:12`
            let (message, location) = match msg.rsplit_once(" in ") {
                Some((m, place)) => {
                    let place = place.trim_start_matches(&release_text);
                    let location = match place.strip_prefix("nginx.conf:") {
                        Some(line) => format!("{source}:{line}"),
                        None => format!("{source} (in {place})"),
                    };
                    (m.to_owned(), location)
                }
                None => (msg.replace(&release_text, ""), source.clone()),
            };
            out.problems.push(Problem {
                gate: Gate::Nginx,
                location: format!("{location} (rendered for {})", n.name),
                message,
            });
        }
        if !found {
            out.problems.push(Problem {
                gate: Gate::Nginx,
                location: format!("{source} (rendered for {})", n.name),
                message: text.trim().replace(&release_text, ""),
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
        if let Err(errors) = agent::config::parse_with(&shown, &text, &env, false) {
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
    for (i, f) in units.iter().enumerate() {
        let dir = scratch.join(format!("units-{i}"));
        let _ = std::fs::create_dir_all(&dir);
        let name = Path::new(&f.path)
            .file_name()
            .map_or_else(|| f.path.clone(), |n| n.to_string_lossy().into_owned());
        let file = dir.join(&name);
        let _ = std::fs::write(&file, &f.bytes);
        let Ok(o) = Command::new(&analyze).arg("verify").arg(&file).output() else {
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
