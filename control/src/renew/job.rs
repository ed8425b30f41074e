//! The certificates job of `edgeform reconcile` (`--once certs`, and in
//! the daemon every `--certs-every`): for each `tls: {acme: true}` site,
//! the kept certificate is ordered when missing, renewed when due, held
//! back by a failure's backoff or an open freeze window ([`super::decide`]);
//! what was issued is pushed at once to every target **at its own live
//! commit** ([`crate::many::renew_all`], `gate::Action::Renew`): a renewal
//! is not a commit.
//!
//! The renewal state ([`super::State`]) is kept in the state store
//! (`Store::renewal_state`): in the state directory
//! `<state>/acme/renewal.json` (0600, written atomically), or shared with
//! the other control host in `edgeform:state:acme:renewal`, so a
//! failure's backoff holds whichever daemon runs the job.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use compiler::workspace::{self, Valid};

use super::{Decision, Kept, State};
use crate::acme::{self, Failure, Request};
use crate::audit::UrgentRenewal;
use crate::gate::Frozen;
use crate::many::{self, Settings};
#[cfg(test)]
use crate::store::DirStore;
use crate::store::Store;

/// How long a push waits for a certificate just issued to start (its
/// validity starting at the CA's second of issue, ahead of this run's).
const PUSH_WAIT_SECS: i64 = 5;

/// Where the renewal state is kept under the state directory `root`.
#[must_use]
pub fn state_path(root: &Path) -> std::path::PathBuf {
    root.join("acme").join(crate::store::RENEWAL_FILE)
}

/// The renewal state kept in `store`; none kept is the empty state.
///
/// # Errors
/// The store cannot be read, the state is too large, or it is not the
/// state's JSON (the error names where it is kept).
pub fn load_state(store: &dyn Store) -> Result<State> {
    let Some(text) = store.renewal_state().map_err(|e| anyhow::anyhow!("{e}"))? else {
        return Ok(State::default());
    };
    State::parse(&text)
        .map_err(|e| anyhow::anyhow!("the renewal state ({}): {e}", crate::store::RENEWAL_FILE))
}

/// Keep `state` in `store` (replaced whole).
///
/// # Errors
/// The store cannot be written.
pub fn save_state(store: &dyn Store, state: &State) -> Result<()> {
    store
        .set_renewal_state(&state.to_json())
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// One certificate of the run: its request and what the store holds.
struct Cert {
    req: Request,
    kept: Option<compiler::tls::Certificate>,
}

/// The kept certificate `name`, parsed (none when missing; a stored one
/// that does not parse is logged and ordered again).
fn kept(store: &dyn Store, name: &str) -> Option<compiler::tls::Certificate> {
    match store.certificate(name) {
        Ok(Some(c)) => match crate::certs::parse(name, &c.chain, &c.key) {
            Ok(cert) => Some(cert),
            Err(e) => {
                tracing::warn!(certificate = name, kind = e.kind.as_str(), cause = %e, "renewal: the kept certificate cannot be read; ordering a new one");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(certificate = name, cause = %e, "renewal: the kept certificate cannot be read; ordering a new one");
            None
        }
    }
}

/// Each failed host's problem on one line (`host: problem; …`), escaped.
fn problems(failures: &[Failure]) -> String {
    failures
        .iter()
        .map(|f| {
            format!(
                "{}: {}",
                edgestate::untrusted::escape(&f.host),
                edgestate::untrusted::escape(&f.problem)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The checked configuration of `commit`.
fn load_commit(root: &Path, commit: &str) -> Result<Valid> {
    match workspace::load(root, Some(commit))?.check().valid() {
        Ok(v) => Ok(v),
        Err(invalid) => anyhow::bail!("commit {commit} is invalid ({})", invalid.summary()),
    }
}

/// `reconcile --once certs` (and the daemon's certificates job) on the
/// repository at `rev` (the revision the sync job would push): exit 0
/// when nothing failed (nothing due included), 1 otherwise.
pub async fn run(
    root: &Path,
    rev: Option<&str>,
    only: &[String],
    flags: &Settings,
    state_dir: &Path,
) -> u8 {
    match certs(root, rev, only, flags, state_dir).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(cause = %edgeredis::one_line(&e), "renewal: nothing ordered or pushed");
            1
        }
    }
}

#[allow(clippy::too_many_lines)]
async fn certs(
    root: &Path,
    rev: Option<&str>,
    only: &[String],
    flags: &Settings,
    state_dir: &Path,
) -> Result<u8> {
    let valid = crate::reconcile::checked(root, rev, "")?;
    let config = &valid.config;
    let requests = acme::requests(config, None);
    if requests.is_empty() {
        tracing::info!("renewal: no site has `tls: {{acme: true}}`");
        return Ok(0);
    }
    let now = i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX);
    // The renewal state, the certificates and the ACME account are in the
    // state store (shared when `--state-store` names one).
    let store = crate::store::open(state_dir)?;
    let mut code = 0;
    let mut state = match load_state(&*store) {
        Ok(s) => s,
        Err(e) => {
            // Started again from no failures: at worst one attempt early.
            tracing::error!(cause = %e, "renewal: the renewal state cannot be read; starting from none (it is written again)");
            code = 1;
            State::default()
        }
    };
    let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
    state.retain(&names);

    let certs: Vec<Cert> = requests
        .into_iter()
        .map(|req| Cert {
            kept: kept(&*store, &req.name),
            req,
        })
        .collect();
    let decide = |c: &Cert, frozen: bool| {
        let k = c.kept.as_ref().map(|k| Kept {
            not_before: k.not_before,
            not_after: k.not_after,
            covers: c.req.hosts.iter().all(|h| k.covers(h)),
        });
        super::decide(k, state.certificates.get(&c.req.name), now, frozen)
    };

    // The targets and their live commits: where a renewal is pushed, and
    // whose freeze windows are in force with the repository's.
    for n in only {
        if !config
            .nodes
            .iter()
            .any(|node| &node.name == n && node.redis.is_some())
        {
            anyhow::bail!("--node {n}: no such target (a node with a redis block)");
        }
    }
    let targets: Vec<_> = config
        .nodes
        .iter()
        .filter(|n| n.redis.is_some())
        .filter(|n| only.is_empty() || only.contains(&n.name))
        .cloned()
        .collect();
    let wanted = certs.iter().any(|c| decide(c, false).orders());
    let live = if wanted {
        many::live_commits(&targets).await
    } else {
        many::LiveCommits::new()
    };
    // Each distinct live commit's configuration, loaded once (its freeze
    // windows now, its compile for the push later).
    let mut at_commit: BTreeMap<String, Result<Valid, String>> = BTreeMap::new();
    for commit in live
        .values()
        .filter_map(|r| r.as_ref().ok().cloned().flatten())
    {
        if at_commit.contains_key(&commit) {
            continue;
        }
        let loaded = if commit == valid.commit {
            None
        } else if crate::store::valid_commit(&commit) {
            Some(load_commit(root, &commit).map_err(|e| edgeredis::one_line(&e).to_string()))
        } else {
            Some(Err(format!(
                "`{}` is not a commit of the repository (a working tree was applied)",
                edgestate::untrusted::escape(&commit)
            )))
        };
        if let Some(l) = loaded {
            at_commit.insert(commit, l);
        }
    }
    let frozen: Option<Frozen> = many::frozen_in(config).or_else(|| {
        at_commit
            .values()
            .filter_map(|v| v.as_ref().ok())
            .find_map(|v| many::frozen_in(&v.config))
    });

    // Decide, then order what is due, one site after the other.
    let mut due: Vec<Request> = Vec::new();
    // Why each certificate ordered inside an open window may go through it.
    let mut urgent_notes: BTreeMap<String, String> = BTreeMap::new();
    for c in &certs {
        let name = &c.req.name;
        let d = decide(c, frozen.is_some());
        match d {
            Decision::NotDue { at } => {
                tracing::info!(certificate = %name, renew_at = %compiler::clock::rfc3339_signed(at), "renewal: not due");
            }
            Decision::Wait { until } => {
                // Still failing: the run is not fine.
                code = 1;
                let a = state.certificates.get(name).cloned().unwrap_or_default();
                tracing::warn!(
                    certificate = %name,
                    failures = a.failures,
                    last_problem = %edgestate::untrusted::escape(&a.last_problem),
                    "renewal: waiting until {} (backoff after a failure)",
                    compiler::clock::rfc3339_signed(until)
                );
            }
            Decision::Frozen => {
                if let Some(f) = &frozen {
                    tracing::warn!(
                        certificate = %name,
                        window = %f.window,
                        until = %f.until,
                        "renewal: due, waiting for the freeze window to close (it does not expire within 72 hours)"
                    );
                }
            }
            Decision::Issue | Decision::Renew { .. } => {
                tracing::info!(certificate = %name, hosts = %c.req.hosts.join(","), issue = d == Decision::Issue, "renewal: ordering");
                if frozen.is_some() {
                    let note = match &c.kept {
                        Some(k) => format!(
                            "{} expires {}",
                            c.req.hosts.first().map_or("", String::as_str),
                            compiler::clock::rfc3339_signed(k.not_after)
                        ),
                        None => format!(
                            "{} has no certificate",
                            c.req.hosts.first().map_or("", String::as_str)
                        ),
                    };
                    urgent_notes.insert(name.clone(), note);
                }
                due.push(c.req.clone());
            }
        }
    }
    let mut issued: Vec<String> = Vec::new();
    // The latest start of a certificate issued now (a CA may start it at
    // the second it issues it, after this run's `now`).
    let mut latest_start = i64::MIN;
    if !due.is_empty() {
        let outcomes: Vec<(Request, Result<(), Vec<Failure>>)> =
            match acme::issue_requests(config, &*store, &due, now).await {
                Ok(outcomes) => due
                    .iter()
                    .cloned()
                    .zip(outcomes)
                    .map(|(req, (_, r))| {
                        let r = match r {
                            Ok(cert) => {
                                latest_start = latest_start.max(cert.not_before);
                                tracing::info!(
                                    certificate = %req.name,
                                    not_after = %compiler::clock::rfc3339_signed(cert.not_after),
                                    fingerprint = %format!("sha256:{}", cert.fingerprint),
                                    "renewal: issued"
                                );
                                Ok(())
                            }
                            Err(f) => Err(f),
                        };
                        (req, r)
                    })
                    .collect(),
                // Nothing could start (no CA section, an edge unreachable,
                // the account): every due certificate failed with it.
                Err(e) => due
                    .iter()
                    .cloned()
                    .map(|req| {
                        let f = req
                            .hosts
                            .iter()
                            .map(|h| {
                                Failure {
                            host: h.clone(),
                            problem:
                                serde_json::json!({"type": "about:blank", "detail": e.to_string()})
                                    .to_string(),
                            from_ca: false,
                            retry_after: None,
                        }
                            })
                            .collect();
                        (req, Err(f))
                    })
                    .collect(),
            };
        for (req, r) in outcomes {
            match r {
                Ok(()) => {
                    state.succeeded(&req.name);
                    issued.push(req.name.clone());
                }
                Err(failures) => {
                    code = 1;
                    for f in &failures {
                        tracing::error!(
                            certificate = %req.name,
                            host = %edgestate::untrusted::escape(&f.host),
                            from_ca = f.from_ca,
                            problem = %edgestate::untrusted::escape(&f.problem),
                            "renewal failed; the old certificate is kept"
                        );
                        flags.metrics.renewal_failed(&f.host);
                    }
                    let retry_after = failures.iter().filter_map(|f| f.retry_after).max();
                    // The jitter: std's per-process random keys.
                    let jitter = edgestate::backoff::random_seed();
                    state.failed(&req.name, now, &problems(&failures), retry_after, jitter);
                    if let Some(a) = state.certificates.get(&req.name) {
                        tracing::warn!(
                            certificate = %req.name,
                            failures = a.failures,
                            "renewal: next attempt at {}",
                            compiler::clock::rfc3339_signed(a.next_attempt)
                        );
                    }
                }
            }
        }
    }
    if let Err(e) = save_state(&*store, &state) {
        tracing::error!(cause = %e, "renewal: cannot keep the renewal state");
        code = 1;
    }

    // The expiry of every kept certificate (what is served once pushed);
    // a host no ACME site has any more is no longer exported.
    let mut expiries = Vec::new();
    for c in &certs {
        let now_kept = if issued.contains(&c.req.name) {
            kept(&*store, &c.req.name)
        } else {
            c.kept.clone()
        };
        if let Some(k) = now_kept {
            for h in &c.req.hosts {
                expiries.push((h.clone(), k.not_after));
            }
        }
    }
    flags.metrics.certificate_expiries(&expiries);

    if issued.is_empty() {
        return Ok(code);
    }
    let urgent = frozen.as_ref().map(|f| UrgentRenewal {
        window: f.window.clone(),
        // The certificates issued (a failed one is not pushed).
        hosts: issued
            .iter()
            .filter_map(|n| urgent_notes.get(n).cloned())
            .collect::<Vec<_>>()
            .join(", "),
    });
    // Pushed once valid: a certificate starting a few seconds ahead (the
    // CA's second of issue) is waited for, briefly.
    let mut now = i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX);
    if latest_start > now && latest_start - now <= PUSH_WAIT_SECS {
        let wait = u64::try_from(latest_start - now).unwrap_or(0);
        tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
        now = latest_start;
    }
    let head = valid.commit.clone();
    at_commit.insert(head, Ok(valid));
    if push(
        root, &live, at_commit, &issued, flags, state_dir, now, urgent,
    )
    .await
    {
        Ok(code)
    } else {
        Ok(1)
    }
}

/// Push the certificates `issued` to every target at its own live commit
/// (`live`; `at_commit`: the loaded configuration of each live commit).
/// Whether every target that carries one got it.
#[allow(clippy::too_many_arguments)]
async fn push(
    root: &Path,
    live: &many::LiveCommits,
    mut at_commit: BTreeMap<String, Result<Valid, String>>,
    issued: &[String],
    flags: &Settings,
    state_dir: &Path,
    now: i64,
    urgent: Option<UrgentRenewal>,
) -> bool {
    let mut ok = true;
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (node, commit) in live {
        match commit {
            Ok(Some(c)) => groups.entry(c.clone()).or_default().push(node.clone()),
            Ok(None) => {
                tracing::warn!(target = %node, "renewal: the target's meta names no commit; left to the next sync");
            }
            Err(e) => {
                tracing::error!(target = %node, cause = %e, "renewal: not pushed (left to the next sync)");
                ok = false;
            }
        }
    }
    for (commit, nodes) in groups {
        let valid = at_commit
            .remove(&commit)
            .unwrap_or_else(|| Err("not loaded".into()));
        let valid = match valid {
            Ok(v) => v,
            Err(e) => {
                for node in &nodes {
                    tracing::warn!(target = %node, %commit, cause = %e, "renewal: its live commit cannot be compiled; left to the next sync");
                }
                continue;
            }
        };
        let used = compiler::tls::used(&valid.config);
        if !issued.iter().any(|n| used.contains(&n.as_str())) {
            tracing::info!(%commit, targets = nodes.len(), "renewal: no site of this live commit uses a renewed certificate");
            continue;
        }
        let certs = match crate::certs::for_push_from(state_dir, &valid.config, now) {
            Ok(c) => c,
            Err(e) => {
                for node in &nodes {
                    tracing::error!(target = %node, %commit, kind = e.kind.as_str(), cause = %e, "renewal: not pushed (left to the next sync)");
                }
                ok = false;
                continue;
            }
        };
        let source = valid.compile_with(&certs);
        let jobs = crate::jobs(&source.config, &source.compiled, &nodes);
        for node in &nodes {
            if !jobs.iter().any(|j| &j.node.name == node) {
                tracing::warn!(target = %node, %commit, "renewal: not a target at its live commit; left to the next sync");
            }
        }
        if jobs.is_empty() {
            continue;
        }
        tracing::info!(%commit, targets = jobs.len(), "renewal: pushing at the targets' own commit");
        let report = many::renew_all(&source, jobs, flags, root, urgent.clone()).await;
        if report.exit_code() != 0 {
            ok = false;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_renewal_state_is_kept_0600_and_a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirStore::open(&dir.path().join("state")).unwrap();
        // None kept: the empty state.
        assert_eq!(load_state(&store).unwrap(), State::default());
        let mut s = State::default();
        s.failed(
            "acme.shop.test",
            1_000,
            "shop.test: {\"type\":\"x\"}",
            Some(90),
            7,
        );
        save_state(&store, &s).unwrap();
        assert_eq!(load_state(&store).unwrap(), s);
        let path = state_path(store.root());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Not the state's JSON: an error naming the file, never a panic.
        std::fs::write(&path, b"{\"certificates\": 3}").unwrap();
        let e = load_state(&store).unwrap_err().to_string();
        assert!(e.contains("renewal.json"), "{e}");
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(load_state(&store).is_err());
    }
}
