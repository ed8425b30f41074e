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
use serde_json::Value;

use compiler::workspace;

use crate::gate::Gate;
use crate::node::{NodeBundle, load_bundles, run_gates, write_release};
use crate::{Bundle, Install, MANIFEST, Manifest, SmokeRequest};

/// The edge role's declaration of what its code reads (the same name as
/// `edgestate::bundle::READS_FILE`; the CLI parses it).
pub const READS_FILE: &str = "reads.json";

/// [`install`]'s `declare(node, rolled_back, reads)`.
pub type Declare<'a> = dyn Fn(&str, bool, Option<&[u8]>) -> Result<(), String> + Sync + 'a;

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
    /// The new release stays live: nothing served before it (a first
    /// install), so there was nothing to go back to.
    no_previous: bool,
}

type StepResult<T> = std::result::Result<T, Failed>;

fn fail(step: Step, message: impl Into<String>) -> Failed {
    Failed {
        step,
        message: message.into(),
        no_previous: false,
    }
}

/// Text from the node (its manifest, its output) as a terminal may show
/// it: no control character or escape sequence gets through.
fn shown(s: &str) -> String {
    edgestate::untrusted::escape(s)
}

/// The first 12 characters of a version or commit read from the node
/// (never cut inside a character), shown safely.
fn head12(s: &str) -> String {
    shown(&s.chars().take(12).collect::<String>())
}

/// Most bytes of a node's output kept (each of stdout and stderr); the
/// rest is read and dropped, so a node printing without end costs no
/// memory.
const OUTPUT_CAP: u64 = 1 << 20;

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
            .args(["-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"])
            // A node that stops answering mid-step is given up after 30 s,
            // not waited for: one stalled node must not hold `--all`.
            .args([
                "-o",
                "ServerAliveInterval=10",
                "-o",
                "ServerAliveCountMax=3",
            ])
            // Only the known_hosts file given (or the user's) vouches for
            // a node, not the system's.
            .args(["-o", "GlobalKnownHostsFile=/dev/null"]);
        let kh = self.ssh.known_hosts.clone().unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".ssh/known_hosts")
        });
        c.arg(format!("-oUserKnownHostsFile={}", kh.display()));
        if let Some(id) = &self.ssh.identity {
            c.arg("-i").arg(id).args(["-o", "IdentitiesOnly=yes"]);
        }
        // `--`: the destination can never be read as an option of ssh's.
        c.arg("--")
            .arg(format!("{}@{host}", self.install.user))
            .arg(remote);
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
        // Both pipes drained at once (a node filling one must not block
        // on the other), each kept up to OUTPUT_CAP.
        let out = drain_capped(child.stdout.take());
        let err = drain_capped(child.stderr.take());
        let status = child.wait().map_err(|e| fail(step, format!("ssh: {e}")))?;
        let stdout = out.join().unwrap_or_default();
        let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
        // 255: ssh itself failed (connection, host key, authentication).
        if status.code() == Some(255) {
            return Err(fail(step, ssh_error(&stderr, self.install)));
        }
        Ok((
            status.success(),
            String::from_utf8_lossy(&stdout).into_owned(),
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

/// A thread reading `pipe` to its end, keeping the first [`OUTPUT_CAP`]
/// bytes (the rest is read and dropped, so the node never blocks on it).
fn drain_capped<R: std::io::Read + Send + 'static>(
    pipe: Option<R>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        if let Some(mut p) = pipe {
            let _ =
                std::io::Read::read_to_end(&mut std::io::Read::take(&mut p, OUTPUT_CAP), &mut kept);
            let _ = std::io::copy(&mut p, &mut std::io::sink());
        }
        kept
    })
}

/// A node's output on one line, shown safely.
fn one_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    shown(&lines.join(" | "))
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

/// The node's cache folders (`cache.dirs`), parents included: nginx
/// makes a `proxy_cache_path` folder but not its parents, so the node's
/// gate (`nginx -t`) would fail on a fresh machine.
fn make_cache_dirs(r: &Remote<'_>, b: &NodeBundle) -> StepResult<()> {
    let dirs: Vec<String> = b
        .yaml
        .pointer("/cache/dirs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(q)
        .collect();
    if dirs.is_empty() {
        return Ok(());
    }
    r.must(Step::Connect, &format!("mkdir -p {}\n", dirs.join(" ")))
        .map(drop)
}

fn upload(r: &Remote<'_>, b: &NodeBundle, id: &str, commit: Option<&str>) -> StepResult<()> {
    let stage = tempfile::tempdir().map_err(|e| fail(Step::Upload, e.to_string()))?;
    write_release(stage.path(), &b.bundle, commit)
        .map_err(|e| fail(Step::Upload, format!("{e:#}")))?;
    let dir = format!("{}/releases/{id}", r.install.root);
    // An edge's TLS listeners need the placeholder certificate, made once
    // on the node (never shipped: its key stays there).
    let placeholder = if b.roles.iter().any(|r| r == "edge") {
        format!(
            "; {}",
            crate::placeholder_script(&q(&format!("{}/tls", r.install.root)))
        )
    } else {
        String::new()
    };
    let remote = format!(
        // Owned by the user it is extracted as (root on the node), never by
        // whoever ran `install` on the control host: a node account sharing
        // that uid must not be able to rewrite nginx.conf.
        "set -e; rm -rf {p}; mkdir -p {p}; tar --no-same-owner -C {p} -xpf -; mv {p} {d}{placeholder}",
        p = q(&format!("{dir}.part")),
        d = q(&dir)
    );
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(stage.path())
        .args(["--owner=0", "--group=0", "--numeric-owner", "-cf", "-", "."])
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
    let out = r.must(Step::Secrets, &secrets_script(&r.install.root, text))?;
    Ok(out.trim() == "changed")
}

/// [`write_secrets`]' script: prints `changed` or `same`. The here-document
/// ends at a line no secret holds, so a value cannot end it early.
fn secrets_script(root: &str, text: &str) -> String {
    let root = q(root);
    let mut end = "EDGEFORM_SECRETS_END".to_owned();
    while text.lines().any(|l| l == end) {
        end.push('_');
    }
    format!(
        "set -e
umask 077
mkdir -p {root}
         cat > {root}/.secrets.env.new <<'{end}'
{text}{end}
         chmod 600 {root}/.secrets.env.new
         if cmp -s {root}/.secrets.env.new {root}/secrets.env; then rm -f {root}/.secrets.env.new; echo same;
         else mv -f {root}/.secrets.env.new {root}/secrets.env; echo changed; fi
"
    )
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
        let (_, out, err) = r.run(Step::Smoke, &smoke_command(&addr, s))?;
        bad.extend(smoke_mismatch(s, &out, &err));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(fail(Step::Smoke, bad.join("; ")))
    }
}

/// The node's shell command for one smoke request to `addr`: the body,
/// then the status on the last line.
fn smoke_command(addr: &str, s: &SmokeRequest) -> String {
    let host = s
        .host
        .as_deref()
        .map(|h| format!("-H {}", q(&format!("Host: {h}"))))
        .unwrap_or_default();
    let url = q(&format!("http://{addr}{}", s.path));
    // -g: `[` `]` `{` `}` in a path are sent as they are, never globbed.
    format!("curl -sS -g -m 5 {host} -w '\\n%{{http_code}}' {url} 2>&1\n")
}

/// How [`smoke_command`]'s output (`out`, `err`) differs from the request's
/// expectation; `None`: as expected.
fn smoke_mismatch(s: &SmokeRequest, out: &str, err: &str) -> Option<String> {
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", out));
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
        Some(format!(
            "{shown}: expected {}, got {}{}",
            s.status,
            code,
            if code == 0 {
                format!(" ({})", one_line(&format!("{body}{err}")))
            } else {
                String::new()
            }
        ))
    } else if let Some(want) = &s.body
        && !body.contains(want.as_str())
    {
        Some(format!("{shown}: body does not contain {want:?}"))
    } else {
        None
    }
}

fn switch(r: &Remote<'_>, target: &str) -> StepResult<()> {
    r.must(Step::Switch, &switch_script(&r.install.root, target))
        .map(|_| ())
}

/// Point `<root>/current` at `releases/<target>`: a new link renamed over
/// the old one, so `current` is never missing.
fn switch_script(root: &str, target: &str) -> String {
    format!(
        "set -e; cd {root}; ln -sfn {t} .current.new; mv -T .current.new current\n",
        root = q(root),
        t = q(&format!("releases/{target}"))
    )
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
           echo \"the live server did not take the new configuration (old workers still serve): see \"{run_q}\"/error.log\"; exit 1\n\
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
    for (file, command) in restarts(r.install, changed) {
        r.must(Step::Restart, &format!("{command}\n"))
            .map_err(|e| {
                fail(
                    Step::Restart,
                    format!("`{command}` ({file} changed): {}", e.message),
                )
            })?;
    }
    Ok(())
}

/// The `restart_on_change` commands the changed files call for, each once
/// (with the first changed file naming it), in file order.
fn restarts<'a>(install: &'a Install, changed: &BTreeSet<String>) -> Vec<(&'a str, &'a str)> {
    let mut done = BTreeSet::new();
    install
        .restart_on_change
        .iter()
        .filter(|(file, command)| changed.contains(*file) && done.insert(command.as_str()))
        .map(|(file, command)| (file.as_str(), command.as_str()))
        .collect()
}

fn releases(r: &Remote<'_>, step: Step) -> StepResult<(Vec<String>, Option<String>)> {
    let root = q(&r.install.root);
    let out = r.must(
        step,
        &format!("cd {root} && ls -1 releases; echo '--'; readlink current || true\n"),
    )?;
    Ok(parse_releases(&out))
}

/// The releases (oldest first; unfinished `.part` uploads left out) and
/// the one `current` points to, from `ls -1 releases; echo --; readlink current`.
fn parse_releases(out: &str) -> (Vec<String>, Option<String>) {
    let (list, cur) = out.split_once("--\n").unwrap_or((out, ""));
    let mut list: Vec<String> = list
        .lines()
        .filter(|l| l.starts_with('r') && !l.ends_with(".part"))
        .map(str::to_owned)
        .collect();
    list.sort();
    let cur = cur.trim().strip_prefix("releases/").map(str::to_owned);
    (list, cur)
}

/// The releases beyond the newest `keep` (never the current one).
fn prunable<'a>(list: &'a [String], cur: Option<&str>, keep: usize) -> Vec<&'a str> {
    let excess = list.len().saturating_sub(keep);
    list.iter()
        .take(excess)
        .map(String::as_str)
        .filter(|old| Some(*old) != cur)
        .collect()
}

/// The release a rollback from `cur` returns to: the one before it.
fn rollback_target(list: &[String], cur: Option<&str>) -> Result<String, String> {
    let Some(cur) = cur else {
        return Err("nothing is installed".to_owned());
    };
    let Some(pos) = list.iter().position(|x| *x == cur) else {
        return Err(format!("current points to {cur}, which is not a release"));
    };
    pos.checked_sub(1)
        .map(|p| list[p].clone())
        .ok_or_else(|| format!("{cur} is the oldest release kept; nothing to return to"))
}

fn prune(r: &Remote<'_>, keep: usize) -> StepResult<usize> {
    let (list, cur) = releases(r, Step::Prune)?;
    let gone: Vec<String> = prunable(&list, cur.as_deref(), keep)
        .into_iter()
        .map(|old| q(&format!("{}/releases/{old}", r.install.root)))
        .collect();
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
    make_cache_dirs(&r, b)?;
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
    if let Err(mut e) = reload(&r, b, secrets_changed).and_then(|()| restart(&r, &changed)) {
        // Back to what served before.
        if let Some(p) = previous {
            let _ = switch(&r, &p);
            let _ = reload(&r, b, false);
            let _ = restart(&r, &changed);
        } else {
            e.no_previous = true;
        }
        return Err(e);
    }
    let pruned = prune(&r, install.keep())?;
    let from = installed.map_or_else(
        || "nothing installed".to_owned(),
        |m| format!("version {}", head12(&m.version)),
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
    let prev = rollback_target(&list, cur.as_deref()).map_err(|e| fail(Step::Rollback, e))?;
    let cur = cur.unwrap_or_default();
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
/// `declare(node, rolled_back, reads)` runs on each edge after its
/// switch, with the installed bundle's `reads.json` (the role's
/// declaration of what its code reads; `None` when the bundle has none):
/// it records that in the edge's Redis (`edgeform:bundle`, the
/// version-skew gate's input). Its failure is a warning on the node's
/// line (the release is installed; apply refuses the new fields there).
pub fn install(
    checked: &workspace::Checked,
    options: &InstallOptions,
    secrets: &dyn Fn(&str) -> Result<BTreeMap<String, String>>,
    declare: &Declare<'_>,
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
        let done = if options.rollback {
            rollback_one(b, &options.ssh)
        } else {
            let text = env.get(&b.name).map_or("", String::as_str);
            install_one(b, &options.ssh, commit, text)
        }?;
        if !b.roles.iter().any(|r| r == "edge") {
            return Ok(done);
        }
        // The release serves whatever happens here; a bundle not recorded
        // only makes apply refuse the new fields there (safe), so it is a
        // warning on the node's line, not a failed install.
        let reads = b.bundle.file(READS_FILE).map(|f| f.bytes.as_slice());
        Ok(match declare(&b.name, options.rollback, reads) {
            Ok(()) => done,
            Err(e) => format!(
                "{done}; warning: edgeform:bundle was not written: {e} (apply refuses documents \
                 with newer fields there until it is: run install again)"
            ),
        })
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
        Err(e) if e.no_previous => format!(
            "{node}: failed at step {}: {}; nothing served before (a first install): this release stays in place",
            e.step.as_str(),
            e.message
        ),
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
                            head12(&m.version),
                            m.commit.as_deref().map_or_else(|| "unknown".into(), head12)
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
                        println!("  {:<8} {}", change.as_str(), shown(&path));
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

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::Instance;

    /// Strings a remote shell must receive unchanged.
    const AWKWARD: &[&str] = &[
        "plain",
        "",
        "it's",
        "'",
        "''",
        "$(touch pwned)",
        "`touch pwned`",
        "a b\tc",
        "\"double\"",
        "back\\slash",
        "new\nline",
        "semi; rm -rf /",
        "$HOME ${HOME} *",
    ];

    fn sh(script: &str, cwd: &std::path::Path) -> std::process::Output {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(cwd)
            .output()
            .expect("sh runs")
    }

    fn install_block(extra: serde_json::Value) -> Install {
        let mut v = serde_json::json!({
            "ssh": "edge-1.example.net:2222",
            "user": "deploy",
            "root": "/srv/edge form",
            "listen": "0.0.0.0:80",
            "smoke_listen": "127.0.0.1:8443",
        });
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        serde_json::from_value(v).expect("an install block")
    }

    fn node(name: &str, roles: &[&str], install: bool) -> NodeBundle {
        let install = install.then(|| install_block(serde_json::json!({})));
        let (live, candidate) = Instance::pair(install.as_ref());
        let roles: Vec<String> = roles.iter().map(|r| (*r).to_owned()).collect();
        NodeBundle {
            name: name.to_owned(),
            yaml: serde_json::json!({ "name": name }),
            roles: roles.clone(),
            install,
            live,
            candidate,
            bundle: Bundle {
                node: name.to_owned(),
                roles,
                files: Vec::new(),
                smoke: Vec::new(),
            },
        }
    }

    fn names(v: &[&NodeBundle]) -> Vec<String> {
        v.iter().map(|b| b.name.clone()).collect()
    }

    #[test]
    fn quoted_words_reach_the_shell_unchanged() {
        let d = tempfile::tempdir().unwrap();
        for s in AWKWARD {
            let o = sh(&format!("printf %s {}", q(s)), d.path());
            assert!(o.status.success(), "{s:?}");
            assert_eq!(String::from_utf8_lossy(&o.stdout), *s, "{s:?}");
        }
        assert!(!d.path().join("pwned").exists());
        assert_eq!(q("it's"), r"'it'\''s'");
    }

    #[test]
    fn ssh_refuses_unknown_host_keys_and_never_prompts() {
        let install = install_block(serde_json::json!({}));
        let ssh = Ssh {
            known_hosts: Some(PathBuf::from("/etc/edge/known_hosts")),
            identity: Some(PathBuf::from("/etc/edge/id_ed25519")),
        };
        let c = Remote {
            install: &install,
            ssh: &ssh,
        }
        .command("sh -s");
        assert_eq!(c.get_program(), "ssh");
        let args: Vec<&OsStr> = c.get_args().collect();
        let has = |pair: [&str; 2]| {
            args.windows(2)
                .any(|w| w[0] == OsStr::new(pair[0]) && w[1] == OsStr::new(pair[1]))
        };
        assert!(has(["-p", "2222"]), "{args:?}");
        assert!(has(["-o", "BatchMode=yes"]), "{args:?}");
        assert!(has(["-o", "StrictHostKeyChecking=yes"]), "{args:?}");
        assert!(has(["-i", "/etc/edge/id_ed25519"]), "{args:?}");
        assert!(has(["-o", "IdentitiesOnly=yes"]), "{args:?}");
        assert!(args.contains(&OsStr::new("-oUserKnownHostsFile=/etc/edge/known_hosts")));
        // The destination, then the remote command, last.
        assert_eq!(
            &args[args.len() - 2..],
            [OsStr::new("deploy@edge-1.example.net"), OsStr::new("sh -s")]
        );
        // Without --identity, ssh's own choice: no -i.
        let plain = Ssh {
            known_hosts: Some(PathBuf::from("/k")),
            identity: None,
        };
        let c = Remote {
            install: &install,
            ssh: &plain,
        }
        .command("true");
        assert!(!c.get_args().any(|a| a == "-i"));
    }

    #[test]
    fn release_ids_sort_by_time_and_carry_the_version() {
        let a = release_id("0123456789abcdef0123");
        let (ms, version) = a.strip_prefix('r').unwrap().split_once('-').unwrap();
        assert_eq!(ms.len(), 13);
        assert!(ms.chars().all(|c| c.is_ascii_digit()));
        assert_eq!(version, "0123456789ab");
        assert!(release_id("abc").ends_with("-abc"));
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = release_id("0123456789abcdef0123");
        assert!(b > a, "{b} after {a}");
        // What `releases` lists as a release.
        assert_eq!(parse_releases(&format!("{b}\n{a}\n--\n")).0, [a, b]);
    }

    #[test]
    fn the_node_reaches_its_own_listen_address_on_loopback() {
        assert_eq!(local_address("8443"), "127.0.0.1:8443");
        assert_eq!(local_address("0.0.0.0:8443"), "127.0.0.1:8443");
        assert_eq!(local_address("[::]:8443"), "[::1]:8443");
        assert_eq!(local_address("10.0.0.5:80 reuseport"), "10.0.0.5:80");
        assert_eq!(local_address("127.0.0.1:8443 ssl"), "127.0.0.1:8443");
    }

    #[test]
    fn the_release_listing_leaves_out_unfinished_uploads() {
        let out = "r0000000000002-b\nr0000000000001-a\nr0000000000003-c.part\nlost+found\n--\nreleases/r0000000000002-b\n";
        let (list, cur) = parse_releases(out);
        assert_eq!(list, ["r0000000000001-a", "r0000000000002-b"]);
        assert_eq!(cur.as_deref(), Some("r0000000000002-b"));
        assert_eq!(parse_releases("--\n"), (Vec::new(), None));
        assert_eq!(parse_releases("r1\n--\n").1, None);
    }

    #[test]
    fn pruning_keeps_the_newest_and_never_the_current_release() {
        let list: Vec<String> = ["r1", "r2", "r3", "r4"].map(String::from).to_vec();
        assert_eq!(prunable(&list, Some("r4"), 2), ["r1", "r2"]);
        assert_eq!(prunable(&list, Some("r1"), 2), ["r2"]);
        assert_eq!(prunable(&list, None, 5), Vec::<&str>::new());
        assert_eq!(prunable(&list, Some("r4"), 4), Vec::<&str>::new());
    }

    #[test]
    fn rollback_returns_to_the_release_before_the_current_one() {
        let list: Vec<String> = ["r1", "r2", "r3"].map(String::from).to_vec();
        assert_eq!(rollback_target(&list, Some("r3")).unwrap(), "r2");
        assert_eq!(rollback_target(&list, Some("r2")).unwrap(), "r1");
        assert_eq!(
            rollback_target(&list, Some("r1")).unwrap_err(),
            "r1 is the oldest release kept; nothing to return to"
        );
        assert_eq!(
            rollback_target(&list, None).unwrap_err(),
            "nothing is installed"
        );
        assert_eq!(
            rollback_target(&list, Some("elsewhere")).unwrap_err(),
            "current points to elsewhere, which is not a release"
        );
    }

    #[test]
    fn selection_by_name_role_or_all_takes_only_installable_nodes() {
        let nodes = [
            node("edge-1", &["edge"], true),
            node("edge-2", &["edge"], true),
            node("router-1", &["router"], true),
            node("lab-1", &["edge"], false),
        ];
        let all = Selection {
            all: true,
            ..Selection::default()
        };
        assert_eq!(
            names(&select(&nodes, &all).unwrap()),
            ["edge-1", "edge-2", "router-1"]
        );
        let edge = Selection {
            role: Some("edge".into()),
            ..Selection::default()
        };
        assert_eq!(names(&select(&nodes, &edge).unwrap()), ["edge-1", "edge-2"]);
        let named = Selection {
            nodes: vec!["router-1".into(), "edge-2".into()],
            ..Selection::default()
        };
        assert_eq!(
            names(&select(&nodes, &named).unwrap()),
            ["router-1", "edge-2"]
        );
        let no_block = Selection {
            nodes: vec!["edge-1".into(), "lab-1".into()],
            ..Selection::default()
        };
        assert_eq!(
            select(&nodes, &no_block).err().unwrap(),
            "node `lab-1` has no `install` block (docs/install.md)"
        );
        let unknown = Selection {
            nodes: vec!["edge-9".into()],
            ..Selection::default()
        };
        assert!(
            select(&nodes, &unknown)
                .err()
                .unwrap()
                .starts_with("node `edge-9` is unknown or has no bundle")
        );
        let nobody = Selection {
            role: Some("cache".into()),
            ..Selection::default()
        };
        assert!(
            select(&nodes, &nobody)
                .err()
                .unwrap()
                .starts_with("no node selected")
        );
    }

    #[test]
    fn text_from_the_node_is_cut_by_character_and_escaped() {
        assert_eq!(head12("aaaaaaaaaaaébbbb"), "aaaaaaaaaaaé");
        assert_eq!(head12("ab"), "ab");
        assert_eq!(head12("\u{1b}]0;x\u{7}"), "\\u{1b}]0;x\\u{7}");
        assert_eq!(one_line("ok\n\u{1b}[2J fake\n"), "ok | \\u{1b}[2J fake");
        let mut first = fail(Step::Restart, "`exit 3`");
        first.no_previous = true;
        assert!(
            outcome_line("edge-4", &Err(first))
                .ends_with("nothing served before (a first install): this release stays in place")
        );
    }

    #[test]
    fn each_node_reports_its_release_or_the_step_that_failed() {
        assert_eq!(
            outcome_line("edge-1", &Ok("installed r1-abc".to_owned())),
            "edge-1: installed r1-abc"
        );
        assert_eq!(
            outcome_line(
                "edge-2",
                &Err(fail(Step::Smoke, "GET /: expected 200, got 502"))
            ),
            "edge-2: failed at step smoke: GET /: expected 200, got 502; the previous release keeps serving"
        );
        let steps = [
            Step::Connect,
            Step::Upload,
            Step::Secrets,
            Step::Gate,
            Step::Candidate,
            Step::Smoke,
            Step::Switch,
            Step::Reload,
            Step::Prune,
            Step::Rollback,
            Step::Restart,
        ]
        .map(Step::as_str);
        assert_eq!(
            steps,
            [
                "connect",
                "upload",
                "secrets",
                "gate",
                "candidate",
                "smoke",
                "switch",
                "reload",
                "prune",
                "rollback",
                "restart"
            ]
        );
    }

    #[test]
    fn a_host_key_ssh_cannot_verify_is_reported_as_refused() {
        let install = install_block(serde_json::json!({}));
        let e = ssh_error("Host key verification failed.\r\n", &install);
        assert!(
            e.starts_with("host key of edge-1.example.net:2222 not verified"),
            "{e}"
        );
        assert!(e.contains("refused"), "{e}");
        let e = ssh_error(
            "ssh: connect to host edge-1 port 2222: Connection refused\n\n",
            &install,
        );
        assert_eq!(
            e,
            "ssh to edge-1.example.net:2222: ssh: connect to host edge-1 port 2222: Connection refused"
        );
    }

    #[test]
    fn several_lines_of_output_become_one() {
        assert_eq!(one_line("  a \n\n b\n"), "a | b");
        assert_eq!(one_line(""), "");
    }

    #[test]
    fn the_switch_replaces_current_in_one_rename() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("it's a root");
        for r in ["r1", "r2"] {
            std::fs::create_dir_all(root.join("releases").join(r)).unwrap();
        }
        let root_s = root.to_str().unwrap();
        for target in ["r1", "r2", "r1"] {
            let o = sh(&switch_script(root_s, target), d.path());
            assert!(o.status.success(), "{o:?}");
            assert_eq!(
                std::fs::read_link(root.join("current")).unwrap(),
                PathBuf::from(format!("releases/{target}"))
            );
        }
        assert!(!root.join(".current.new").exists());
    }

    #[test]
    fn secrets_are_written_private_and_reach_the_server_unchanged() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("node root");
        let root_s = root.to_str().unwrap();
        let mut secrets = BTreeMap::new();
        for (i, v) in AWKWARD.iter().enumerate() {
            secrets.insert(format!("S{i}"), (*v).to_owned());
        }
        // A value holding the here-document's end line does not end it.
        secrets.insert(
            "TRICKY".into(),
            "x\nEDGEFORM_SECRETS_END\ntouch pwned".into(),
        );
        let text = crate::env_file(&secrets);
        let o = sh(&secrets_script(root_s, &text), d.path());
        assert!(o.status.success(), "{o:?}");
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "changed");
        let file = root.join("secrets.env");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!d.path().join("pwned").exists());
        let o = sh(&secrets_script(root_s, &text), d.path());
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "same");
        assert!(!root.join(".secrets.env.new").exists());
        // What the started server sees.
        for (name, value) in &secrets {
            let o = sh(
                &format!("{}printf %s \"${name}\"", with_secrets(root_s)),
                d.path(),
            );
            assert_eq!(String::from_utf8_lossy(&o.stdout), *value, "{name}");
        }
        assert!(!d.path().join("pwned").exists());
        // No secrets: an empty file.
        let o = sh(&secrets_script(root_s, ""), d.path());
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "changed");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "");
    }

    #[test]
    fn smoke_requests_quote_the_host_and_judge_status_then_body() {
        let s = SmokeRequest {
            path: "/health?x=1&y=2".into(),
            host: Some("it's.example".into()),
            status: 200,
            body: Some("ok".into()),
        };
        assert_eq!(
            smoke_command("127.0.0.1:8443", &s),
            "curl -sS -g -m 5 -H 'Host: it'\\''s.example' -w '\\n%{http_code}' 'http://127.0.0.1:8443/health?x=1&y=2' 2>&1\n"
        );
        assert_eq!(smoke_mismatch(&s, "all ok\n200", ""), None);
        assert_eq!(
            smoke_mismatch(&s, "down\n200", "").unwrap(),
            "GET /health?x=1&y=2 (Host: it's.example): body does not contain \"ok\""
        );
        assert_eq!(
            smoke_mismatch(&s, "bad gateway\n502", "").unwrap(),
            "GET /health?x=1&y=2 (Host: it's.example): expected 200, got 502"
        );
        // curl could not connect: status 000, its message shown.
        assert_eq!(
            smoke_mismatch(&s, "curl: (7) Failed to connect\n000", "").unwrap(),
            "GET /health?x=1&y=2 (Host: it's.example): expected 200, got 0 (curl: (7) Failed to connect)"
        );
    }

    #[test]
    fn a_restart_command_runs_once_however_many_of_its_files_changed() {
        let install = install_block(serde_json::json!({
            "restart_on_change": {
                "agent.yaml": "systemctl restart edgeform-agent",
                "agent.env": "systemctl restart edgeform-agent",
                "router.conf": "systemctl reload router",
            }
        }));
        let changed: BTreeSet<String> = ["agent.env", "agent.yaml"].map(String::from).into();
        assert_eq!(
            restarts(&install, &changed),
            [("agent.env", "systemctl restart edgeform-agent")]
        );
        assert!(restarts(&install, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn nodes_run_in_parallel_and_report_in_selection_order() {
        let nodes: Vec<NodeBundle> = (0..7)
            .map(|i| node(&format!("edge-{i}"), &["edge"], true))
            .collect();
        let chosen: Vec<&NodeBundle> = nodes.iter().collect();
        for parallel in [1, 3, 64] {
            let out = for_each(&chosen, parallel, |b| b.name.clone());
            assert_eq!(out, names(&chosen), "parallel {parallel}");
        }
    }
}
