//! Installing bundles over SSH: `install` (and `--rollback`) and
//! `plan --bundles` (docs/install.md).
//!
//! SSH is the OpenSSH client (`ssh`), always with `BatchMode=yes`,
//! `StrictHostKeyChecking=yes` and the `--known-hosts` file: an unknown or
//! changed host key is refused, never accepted. On the node: a new
//! `releases/<id>/`, the gates (`luajit -b`, `nginx -t`), the candidate
//! started on `install.smoke_listen` and smoke-tested, then `current`
//! switched atomically (rename of a new link) and the live server reloaded.
//! Any failure leaves `current` and the live server as they were.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;

use compiler::workspace;

use crate::gate::Gate;
use crate::node::{NodeBundle, load_bundles, run_gates, write_release};
use crate::{Bundle, Install, MANIFEST, Manifest};

/// How ssh reaches the nodes.
#[derive(Debug, Clone, Default)]
pub struct Ssh {
    /// The known_hosts file node host keys are checked against (an
    /// unknown or changed key is refused). `None`: ~/.ssh/known_hosts.
    pub known_hosts: Option<PathBuf>,
    /// The SSH private key (`None`: ssh's own choice).
    pub identity: Option<PathBuf>,
}

/// Which nodes: by name, by role, or all of them.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// These nodes.
    pub nodes: Vec<String>,
    /// Every node with this role.
    pub role: Option<String>,
    /// Every node with a bundle and an `install` block.
    pub all: bool,
}

/// What `install` does.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// The nodes.
    pub select: Selection,
    /// How many nodes at once (at least one).
    pub parallel: usize,
    /// Return to the release before the current one (no upload).
    pub rollback: bool,
    /// Do not run the local gates first (the gates on the node still run).
    pub skip_local_gates: bool,
    /// How ssh reaches the nodes.
    pub ssh: Ssh,
    /// The local gates to skip.
    pub skip_gates: BTreeSet<Gate>,
}

/// A failed step on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Connect,
    Upload,
    Secrets,
    Gate,
    Candidate,
    Smoke,
    Switch,
    Reload,
    Prune,
    Rollback,
    Restart,
}

impl Step {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Connect => "connect",
            Step::Upload => "upload",
            Step::Secrets => "secrets",
            Step::Gate => "gate",
            Step::Candidate => "candidate",
            Step::Smoke => "smoke",
            Step::Switch => "switch",
            Step::Reload => "reload",
            Step::Prune => "prune",
            Step::Rollback => "rollback",
            Step::Restart => "restart",
        }
    }
}

struct Failed {
    step: Step,
    message: String,
}

type StepResult<T> = std::result::Result<T, Failed>;

fn fail(step: Step, message: impl Into<String>) -> Failed {
    Failed {
        step,
        message: message.into(),
    }
}

/// Single-quote for the remote shell.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

struct Remote<'a> {
    install: &'a Install,
    ssh: &'a Ssh,
}

impl Remote<'_> {
    fn command(&self, remote: &str) -> Command {
        let (host, port) = self.install.host_port();
        let mut c = Command::new("ssh");
        c.args(["-p", &port.to_string()])
            .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
            .args(["-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]);
        let kh = self.ssh.known_hosts.clone().unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".ssh/known_hosts")
        });
        c.arg(format!("-oUserKnownHostsFile={}", kh.display()));
        if let Some(id) = &self.ssh.identity {
            c.arg("-i").arg(id).args(["-o", "IdentitiesOnly=yes"]);
        }
        c.arg(format!("{}@{host}", self.install.user)).arg(remote);
        c
    }

    /// Run `script` with `sh -s`; (ok, stdout, stderr).
    fn run(&self, step: Step, script: &str) -> StepResult<(bool, String, String)> {
        let mut child = self
            .command("sh -s")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(step, format!("cannot run ssh: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(script.as_bytes());
        }
        let o = child
            .wait_with_output()
            .map_err(|e| fail(step, format!("ssh: {e}")))?;
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        // 255: ssh itself failed (connection, host key, authentication).
        if o.status.code() == Some(255) {
            return Err(fail(step, ssh_error(&stderr, self.install)));
        }
        Ok((
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr,
        ))
    }

    fn must(&self, step: Step, script: &str) -> StepResult<String> {
        let (ok, out, err) = self.run(step, script)?;
        if ok {
            Ok(out)
        } else {
            Err(fail(step, one_line(&format!("{out}{err}"))))
        }
    }
}

fn one_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines.join(" | ")
}

fn ssh_error(stderr: &str, install: &Install) -> String {
    if stderr.contains("Host key verification failed")
        || stderr.contains("HOST IDENTIFICATION HAS CHANGED")
        || stderr.contains("No ED25519 host key is known")
        || stderr.contains("host key is known")
    {
        format!(
            "host key of {} not verified against known_hosts: refused (add the node's real key to the --known-hosts file)",
            install.ssh
        )
    } else {
        format!("ssh to {}: {}", install.ssh, one_line(stderr))
    }
}

/// `host:port` to reach `listen` from the node itself.
fn local_address(listen: &str) -> String {
    let s = listen.split_whitespace().next().unwrap_or(listen);
    if s.chars().all(|c| c.is_ascii_digit()) {
        return format!("127.0.0.1:{s}");
    }
    if let Some(port) = s.strip_prefix("0.0.0.0:") {
        return format!("127.0.0.1:{port}");
    }
    if let Some(port) = s.strip_prefix("[::]:") {
        return format!("[::1]:{port}");
    }
    s.to_owned()
}

fn release_id(version: &str) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("r{ms:013}-{}", &version[..12.min(version.len())])
}

/// Read the installed manifest (None: nothing installed). Creates the layout.
fn connect(r: &Remote<'_>) -> StepResult<Option<Manifest>> {
    let root = q(&r.install.root);
    let out = r.must(
        Step::Connect,
        &format!(
            "set -e; mkdir -p {root}/releases {root}/run/live {root}/run/candidate\n\
             if [ -f {root}/current/{MANIFEST} ]; then cat {root}/current/{MANIFEST}; fi\n"
        ),
    )?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&out).map(Some).map_err(|e| {
        fail(
            Step::Connect,
            format!("the installed {MANIFEST} is unreadable: {e}"),
        )
    })
}

fn upload(r: &Remote<'_>, b: &NodeBundle, id: &str, commit: Option<&str>) -> StepResult<()> {
    let stage = tempfile::tempdir().map_err(|e| fail(Step::Upload, e.to_string()))?;
    write_release(stage.path(), &b.bundle, commit)
        .map_err(|e| fail(Step::Upload, format!("{e:#}")))?;
    let dir = format!("{}/releases/{id}", r.install.root);
    let remote = format!(
        "set -e; rm -rf {p}; mkdir -p {p}; tar -C {p} -xpf -; mv {p} {d}",
        p = q(&format!("{dir}.part")),
        d = q(&dir)
    );
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(stage.path())
        .args(["-cf", "-", "."])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| fail(Step::Upload, format!("cannot run tar: {e}")))?;
    let stdout = tar.stdout.take().expect("piped");
    let o = r
        .command(&remote)
        .stdin(stdout)
        .output()
        .map_err(|e| fail(Step::Upload, format!("ssh: {e}")))?;
    let _ = tar.wait();
    let stderr = String::from_utf8_lossy(&o.stderr);
    if o.status.code() == Some(255) {
        return Err(fail(Step::Upload, ssh_error(&stderr, r.install)));
    }
    if !o.status.success() {
        return Err(fail(Step::Upload, one_line(&stderr)));
    }
    Ok(())
}

/// The node's environment file, `<root>/secrets.env` (0600): its secrets
/// from the control host's state directory as `NAME='value'` lines,
/// written through ssh's stdin (never a command line) and replaced
/// atomically; no secrets, an empty file. Whether it changed (the live
/// server then restarts, as nginx reads its environment at start only).
fn write_secrets(r: &Remote<'_>, text: &str) -> StepResult<bool> {
    let root = q(&r.install.root);
    let script = format!(
        "set -e
umask 077
mkdir -p {root}
         cat > {root}/.secrets.env.new <<'EDGEFORM_SECRETS_END'
{text}EDGEFORM_SECRETS_END
         chmod 600 {root}/.secrets.env.new
         if cmp -s {root}/.secrets.env.new {root}/secrets.env; then rm -f {root}/.secrets.env.new; echo same;
         else mv -f {root}/.secrets.env.new {root}/secrets.env; echo changed; fi
"
    );
    let out = r.must(Step::Secrets, &script)?;
    Ok(out.trim() == "changed")
}

/// Shell lines that export the node's secrets to what is started next.
fn with_secrets(root: &str) -> String {
    let f = q(&format!("{root}/secrets.env"));
    format!(
        "set -a; if [ -f {f} ]; then . {f}; fi; set +a
"
    )
}

/// The nginx config the candidate runs: `candidate/nginx.conf` when the
/// template differs per instance.
fn candidate_conf(b: &Bundle) -> &'static str {
    if b.file("candidate/nginx.conf").is_some() {
        "candidate/nginx.conf"
    } else {
        "nginx.conf"
    }
}

fn on_node_gates(r: &Remote<'_>, b: &NodeBundle, dir: &str) -> StepResult<()> {
    let d = q(dir);
    let mut script = format!("cd {d} || exit 1\nfail=0\n");
    script.push_str(
        "if find . -name '*.lua' -type f | grep -q .; then\n\
         if ! command -v luajit >/dev/null; then echo 'luajit not found on the node'; fail=1; else\n\
         for f in $(find . -name '*.lua' -type f | sort); do luajit -b \"$f\" /dev/null 2>&1 || fail=1; done; fi; fi\n",
    );
    if b.bundle.file("nginx.conf").is_some() {
        script.push_str(&format!(
            "nginx -t -q -p {d}/ -c {d}/{} 2>&1 || fail=1\n",
            candidate_conf(&b.bundle)
        ));
    }
    script.push_str("exit $fail\n");
    let (ok, out, err) = r.run(Step::Gate, &script)?;
    if ok {
        Ok(())
    } else {
        let text = format!("{out}{err}").replace(&format!("{dir}/"), "");
        Err(fail(Step::Gate, one_line(&text)))
    }
}

const WAIT_PID: &str = "i=0; while [ ! -s \"$pidf\" ] || ! kill -0 \"$(cat \"$pidf\")\" 2>/dev/null; do \
    i=$((i+1)); if [ $i -gt 100 ]; then exit 1; fi; \
    if [ -n \"${started:-}\" ] && ! kill -0 \"$started\" 2>/dev/null; then exit 1; fi; sleep 0.1; done\n";

fn stop_script(pidf: &str) -> String {
    format!(
        "pidf={pidf}; if [ -s \"$pidf\" ]; then p=$(cat \"$pidf\"); kill -TERM \"$p\" 2>/dev/null || true; \
         i=0; while kill -0 \"$p\" 2>/dev/null && [ $i -lt 50 ]; do i=$((i+1)); sleep 0.1; done; \
         kill -KILL \"$p\" 2>/dev/null || true; rm -f \"$pidf\"; fi\n"
    )
}

fn start_candidate(r: &Remote<'_>, b: &NodeBundle, dir: &str) -> StepResult<()> {
    let run = &b.candidate.run;
    let pidf = q(&format!("{run}/nginx.pid"));
    let d = q(dir);
    let script = format!(
        "{}mkdir -p {run_q}\n{env}\
         setsid nginx -p {d}/ -c {d}/{conf} </dev/null >{run_q}/nginx.out 2>&1 &\nstarted=$!\n\
         pidf={pidf}\n{WAIT_PID}",
        stop_script(&pidf),
        run_q = q(run),
        conf = candidate_conf(&b.bundle),
        env = with_secrets(&r.install.root),
    );
    let (ok, _, _) = r.run(Step::Candidate, &script)?;
    if ok {
        return Ok(());
    }
    let log = r
        .run(
            Step::Candidate,
            &format!(
                "cat {}/nginx.out 2>/dev/null; tail -n 5 {}/error.log 2>/dev/null",
                q(run),
                q(run)
            ),
        )
        .map(|(_, o, _)| o)
        .unwrap_or_default();
    Err(fail(
        Step::Candidate,
        format!(
            "the candidate did not start on {}: {}",
            b.candidate.listen,
            one_line(&log)
        ),
    ))
}

fn stop_candidate(r: &Remote<'_>, b: &NodeBundle) {
    let pidf = q(&format!("{}/nginx.pid", b.candidate.run));
    let _ = r.run(Step::Candidate, &stop_script(&pidf));
}

/// Send every smoke request to `listen` from the node; all mismatches.
fn smoke(r: &Remote<'_>, b: &NodeBundle, listen: &str) -> StepResult<()> {
    let addr = local_address(listen);
    let mut bad = Vec::new();
    for s in &b.bundle.smoke {
        let host = s
            .host
            .as_deref()
            .map(|h| format!("-H {}", q(&format!("Host: {h}"))))
            .unwrap_or_default();
        let url = q(&format!("http://{addr}{}", s.path));
        let (_, out, err) = r.run(
            Step::Smoke,
            &format!("curl -sS -m 5 {host} -w '\\n%{{http_code}}' {url} 2>&1\n"),
        )?;
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", out.as_str()));
        let code: u16 = code.trim().parse().unwrap_or(0);
        let shown = format!(
            "GET {}{}",
            s.path,
            s.host
                .as_deref()
                .map(|h| format!(" (Host: {h})"))
                .unwrap_or_default()
        );
        if code != s.status {
            bad.push(format!(
                "{shown}: expected {}, got {}{}",
                s.status,
                code,
                if code == 0 {
                    format!(" ({})", one_line(&format!("{body}{err}")))
                } else {
                    String::new()
                }
            ));
        } else if let Some(want) = &s.body
            && !body.contains(want.as_str())
        {
            bad.push(format!("{shown}: body does not contain {want:?}"));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(fail(Step::Smoke, bad.join("; ")))
    }
}

fn switch(r: &Remote<'_>, target: &str) -> StepResult<()> {
    let root = q(&r.install.root);
    r.must(
        Step::Switch,
        &format!(
            "set -e; cd {root}; ln -sfn {t} .current.new; mv -T .current.new current\n",
            t = q(&format!("releases/{target}"))
        ),
    )
    .map(|_| ())
}

/// Reload the live server (start it when it is not running); waits until
/// the old workers are gone (the new configuration is in effect). With
/// `restart` (its secrets changed: nginx reads its environment only at
/// start) the live server is stopped and started instead.
fn reload(r: &Remote<'_>, b: &NodeBundle, restart: bool) -> StepResult<()> {
    if b.bundle.file("nginx.conf").is_none() {
        return Ok(());
    }
    let run = &b.live.run;
    let cur = q(&format!("{}/current", r.install.root));
    let pidf = q(&format!("{run}/nginx.pid"));
    let script = format!(
        "{stop}pidf={pidf}\n\
         if [ -s \"$pidf\" ] && kill -0 \"$(cat \"$pidf\")\" 2>/dev/null; then\n\
           m=$(cat \"$pidf\"); old=$(ps -o pid= --ppid \"$m\" | tr '\\n' ' ')\n\
           kill -HUP \"$m\"\n\
           i=0; while [ $i -lt 100 ]; do left=0; for w in $old; do kill -0 \"$w\" 2>/dev/null && left=1; done\n\
             [ $left -eq 0 ] && exit 0; i=$((i+1)); sleep 0.1; done\n\
           echo \"the live server did not take the new configuration (old workers still serve): see {run}/error.log\"; exit 1\n\
         fi\n\
         mkdir -p {run_q}\n{env}\
         setsid nginx -p {cur}/ -c {cur}/nginx.conf </dev/null >{run_q}/nginx.out 2>&1 &\nstarted=$!\n\
         {WAIT_PID}",
        run_q = q(run),
        env = with_secrets(&r.install.root),
        stop = if restart {
            stop_script(&pidf)
        } else {
            String::new()
        },
    );
    r.must(Step::Reload, &script).map(|_| ())
}

/// `install.restart_on_change`: the command of every changed file, once each.
fn restart(r: &Remote<'_>, changed: &BTreeSet<String>) -> StepResult<()> {
    let mut done = BTreeSet::new();
    for (file, command) in &r.install.restart_on_change {
        if changed.contains(file) && done.insert(command) {
            r.must(Step::Restart, &format!("{command}\n"))
                .map_err(|e| {
                    fail(
                        Step::Restart,
                        format!("`{command}` ({file} changed): {}", e.message),
                    )
                })?;
        }
    }
    Ok(())
}

fn releases(r: &Remote<'_>, step: Step) -> StepResult<(Vec<String>, Option<String>)> {
    let root = q(&r.install.root);
    let out = r.must(
        step,
        &format!("cd {root} && ls -1 releases; echo '--'; readlink current || true\n"),
    )?;
    let (list, cur) = out.split_once("--\n").unwrap_or((&out, ""));
    let mut list: Vec<String> = list
        .lines()
        .filter(|l| l.starts_with('r') && !l.ends_with(".part"))
        .map(str::to_owned)
        .collect();
    list.sort();
    let cur = cur.trim().strip_prefix("releases/").map(str::to_owned);
    Ok((list, cur))
}

fn prune(r: &Remote<'_>, keep: usize) -> StepResult<usize> {
    let (list, cur) = releases(r, Step::Prune)?;
    let mut gone = Vec::new();
    let excess = list.len().saturating_sub(keep);
    for old in list.iter().take(excess) {
        if Some(old) != cur.as_ref() {
            gone.push(q(&format!("{}/releases/{old}", r.install.root)));
        }
    }
    if !gone.is_empty() {
        r.must(Step::Prune, &format!("rm -rf {}\n", gone.join(" ")))?;
    }
    Ok(gone.len())
}

fn install_one(
    b: &NodeBundle,
    ssh: &Ssh,
    commit: Option<&str>,
    secrets: &str,
) -> StepResult<String> {
    let install = b.install.as_ref().expect("selected nodes have install");
    let r = Remote { install, ssh };
    let installed = connect(&r)?;
    let manifest = b.bundle.manifest(commit);
    let id = release_id(&manifest.version);
    let dir = format!("{}/releases/{id}", install.root);
    upload(&r, b, &id, commit)?;
    let discard = |r: &Remote<'_>| {
        let _ = r.run(Step::Upload, &format!("rm -rf {}\n", q(&dir)));
    };
    let secrets_changed = match write_secrets(&r, secrets) {
        Ok(changed) => changed,
        Err(e) => {
            discard(&r);
            return Err(e);
        }
    };
    if let Err(e) = on_node_gates(&r, b, &dir) {
        discard(&r);
        return Err(e);
    }
    if b.bundle.file("nginx.conf").is_some() {
        start_candidate(&r, b, &dir).inspect_err(|_| {
            stop_candidate(&r, b);
            discard(&r);
        })?;
        let smoked = smoke(&r, b, &b.candidate.listen);
        stop_candidate(&r, b);
        if let Err(e) = smoked {
            discard(&r);
            return Err(e);
        }
    }
    let previous = releases(&r, Step::Switch)?.1;
    let changed: BTreeSet<String> = crate::drift(installed.as_ref(), &manifest)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    switch(&r, &id)?;
    if let Err(e) = reload(&r, b, secrets_changed).and_then(|()| restart(&r, &changed)) {
        // Back to what served before.
        if let Some(p) = previous {
            let _ = switch(&r, &p);
            let _ = reload(&r, b, false);
            let _ = restart(&r, &changed);
        }
        return Err(e);
    }
    let pruned = prune(&r, install.keep())?;
    let from = installed.map_or_else(
        || "nothing installed".to_owned(),
        |m| format!("version {}", &m.version[..12.min(m.version.len())]),
    );
    Ok(format!(
        "installed {id} (version {}, from {from}; {} file(s){})",
        &manifest.version[..12],
        manifest.files.len(),
        if pruned > 0 {
            format!(", {pruned} old release(s) removed")
        } else {
            String::new()
        }
    ))
}

fn rollback_one(b: &NodeBundle, ssh: &Ssh) -> StepResult<String> {
    let install = b.install.as_ref().expect("selected nodes have install");
    let r = Remote { install, ssh };
    connect(&r)?;
    let (list, cur) = releases(&r, Step::Rollback)?;
    let Some(cur) = cur else {
        return Err(fail(Step::Rollback, "nothing is installed"));
    };
    let Some(pos) = list.iter().position(|x| *x == cur) else {
        return Err(fail(
            Step::Rollback,
            format!("current points to {cur}, which is not a release"),
        ));
    };
    let Some(prev) = pos.checked_sub(1).map(|p| list[p].clone()) else {
        return Err(fail(
            Step::Rollback,
            format!("{cur} is the oldest release kept; nothing to return to"),
        ));
    };
    switch(&r, &prev)?;
    if let Err(e) = reload(&r, b, false) {
        let _ = switch(&r, &cur);
        let _ = reload(&r, b, false);
        return Err(e);
    }
    // The release rolled away from goes, so a second rollback goes further back.
    let _ = r.run(
        Step::Rollback,
        &format!(
            "rm -rf {}\n",
            q(&format!("{}/releases/{cur}", install.root))
        ),
    );
    Ok(format!("rolled back from {cur} to {prev}"))
}

fn select<'a>(bundles: &'a [NodeBundle], s: &Selection) -> Result<Vec<&'a NodeBundle>, String> {
    let chosen: Vec<&NodeBundle> = if s.all {
        bundles.iter().filter(|b| b.install.is_some()).collect()
    } else if let Some(role) = &s.role {
        bundles
            .iter()
            .filter(|b| b.roles.contains(role) && b.install.is_some())
            .collect()
    } else {
        let mut v = Vec::new();
        for n in &s.nodes {
            match bundles.iter().find(|b| b.name == *n) {
                Some(b) if b.install.is_some() => v.push(b),
                Some(_) => {
                    return Err(format!(
                        "node `{n}` has no `install` block (docs/install.md)"
                    ));
                }
                None => {
                    return Err(format!(
                        "node `{n}` is unknown or has no bundle (no roles/<role>/ folder for its roles)"
                    ));
                }
            }
        }
        v
    };
    if chosen.is_empty() {
        return Err("no node selected: --node NODE, --role ROLE or --all (nodes with a bundle and an `install` block)".into());
    }
    Ok(chosen)
}

fn for_each<T: Send>(
    nodes: &[&NodeBundle],
    parallel: usize,
    f: impl Fn(&NodeBundle) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, T)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..parallel.min(nodes.len()).max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(n) = nodes.get(i) else { break };
                    let t = f(n);
                    results.lock().expect("results").push((i, t));
                }
            });
        }
    });
    let mut v = results.into_inner().expect("results");
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, t)| t).collect()
}

/// `edgeform install` over a checked repository (`checked.config` is
/// `Some`: the caller reports an invalid one). `secrets(node)`: the
/// node's secrets (the control host's state directory), read for every
/// chosen node before anything is installed. The exit code: 0 every node
/// done, 1 a node failed or nothing could be installed.
///
/// # Errors
/// I/O errors and the secrets' errors.
pub fn install(
    checked: &workspace::Checked,
    options: &InstallOptions,
    secrets: &dyn Fn(&str) -> Result<BTreeMap<String, String>>,
) -> Result<u8> {
    let Some((roles, bundles)) = load_bundles(checked)? else {
        eprintln!("nothing was installed");
        return Ok(1);
    };
    let chosen = match select(&bundles, &options.select) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    if !options.rollback {
        if options.skip_local_gates {
            eprintln!(
                "warning: local gates skipped (--skip-local-gates); the gates on each node still run"
            );
        } else if !run_gates(&roles, &bundles, &options.skip_gates) {
            eprintln!(
                "the local gates failed; nothing was installed (--skip-local-gates to rely on the node's gates)"
            );
            return Ok(1);
        }
    }
    let commit = checked.repo.commit.as_deref();
    // Each node's secrets, read before anything is installed: an unsafe
    // or unreadable state directory installs nothing.
    let mut env = BTreeMap::new();
    if !options.rollback {
        for b in &chosen {
            env.insert(b.name.clone(), crate::env_file(&secrets(&b.name)?));
        }
    }
    let results = for_each(&chosen, options.parallel, |b| {
        if options.rollback {
            rollback_one(b, &options.ssh)
        } else {
            let text = env.get(&b.name).map_or("", String::as_str);
            install_one(b, &options.ssh, commit, text)
        }
    });
    let mut failed = 0;
    for (b, r) in chosen.iter().zip(results) {
        if r.is_err() {
            failed += 1;
        }
        println!("{}", outcome_line(&b.name, &r));
    }
    Ok(u8::from(failed > 0))
}

/// What `install` prints for one node.
fn outcome_line(node: &str, r: &StepResult<String>) -> String {
    match r {
        Ok(msg) => format!("{node}: {msg}"),
        Err(e) => format!(
            "{node}: failed at step {}: {}; the previous release keeps serving",
            e.step.as_str(),
            e.message
        ),
    }
}

/// `edgeform plan --bundles`: per node, which bundle files differ from the
/// installed release's manifest (`nodes` empty: every node with an
/// `install` block). Exit 0; 2 with `detailed` when any differ; 1 when a
/// node could not be read. The caller reports an invalid `checked`.
///
/// # Errors
/// I/O errors.
pub fn plan(
    checked: &workspace::Checked,
    nodes: &[String],
    ssh: &Ssh,
    detailed: bool,
    parallel: usize,
) -> Result<u8> {
    let Some((_, bundles)) = load_bundles(checked)? else {
        return Ok(1);
    };
    let select = Selection {
        nodes: nodes.to_vec(),
        role: None,
        all: nodes.is_empty(),
    };
    let chosen = match select_for_plan(&bundles, &select) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    let commit = checked.repo.commit.as_deref();
    let results = for_each(&chosen, parallel, |b| {
        let install = b.install.as_ref().expect("has install");
        connect(&Remote { install, ssh })
    });
    let (mut drifted, mut failed) = (false, false);
    for (b, r) in chosen.iter().zip(results) {
        let desired = b.bundle.manifest(commit);
        match r {
            Err(e) => {
                failed = true;
                println!(
                    "{}: cannot read the installed release ({}: {})",
                    b.name,
                    e.step.as_str(),
                    e.message
                );
            }
            Ok(installed) => {
                let d = crate::drift(installed.as_ref(), &desired);
                let at = installed.as_ref().map_or_else(
                    || "nothing installed".to_owned(),
                    |m| {
                        format!(
                            "installed version {} (commit {})",
                            &m.version[..12.min(m.version.len())],
                            m.commit
                                .as_deref()
                                .map_or("unknown", |c| &c[..12.min(c.len())])
                        )
                    },
                );
                if d.is_empty() {
                    println!("{}: {at}: bundle up to date", b.name);
                } else {
                    drifted = true;
                    println!(
                        "{}: {at}: {} file(s) differ from version {}",
                        b.name,
                        d.len(),
                        &desired.version[..12]
                    );
                    for (path, change) in d {
                        println!("  {:<8} {path}", change.as_str());
                    }
                }
            }
        }
    }
    Ok(if failed {
        1
    } else if drifted && detailed {
        2
    } else {
        0
    })
}

fn select_for_plan<'a>(
    bundles: &'a [NodeBundle],
    s: &Selection,
) -> Result<Vec<&'a NodeBundle>, String> {
    select(bundles, s)
}
