//! Running one operation on many targets: concurrently (bounded), each
//! outcome kept, one failure never stopping the others.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Job;
use super::gate::{Frozen, Relation};
use super::plan::Ancestry;
use compiler::model::resolved::{FreezeWindow, Thresholds};

/// Run `f` on every job with at most `parallel` at a time; results in job
/// name order.
pub async fn each<T, F, Fut>(jobs: Vec<Job>, parallel: usize, f: F) -> Vec<(Job, Result<T>)>
where
    T: Send + 'static,
    F: Fn(Job) -> Fut,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(parallel.max(1)));
    let mut set = JoinSet::new();
    // Which job each task runs: a task that panicked is that target's
    // failure, never a target missing from the results.
    let mut running = HashMap::new();
    for job in jobs {
        let limit = limit.clone();
        let fut = f(job.clone());
        let id = set
            .spawn({
                let job = job.clone();
                async move {
                    let _permit = limit.acquire_owned().await;
                    let done = fut.await;
                    let done = done.map_err(|e| edgeredis::with_refusal(&job.node.name, e));
                    (job, done)
                }
            })
            .id();
        running.insert(id, job);
    }
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(r) => out.push(r),
            Err(e) => {
                let why = edgestate::untrusted::escape(&e.to_string());
                tracing::error!(cause = %why, "target task failed");
                if let Some(job) = running.remove(&e.id()) {
                    out.push((
                        job,
                        Err(anyhow::anyhow!(
                            "edgeform failed on this target ({why}), a bug (please report it): what it wrote there before is unknown; run `edgeform plan`"
                        )),
                    ));
                }
            }
        }
    }
    out.sort_by(|a, b| a.0.node.name.cmp(&b.0.node.name));
    out
}

/// Tells where a desired commit stands relative to a live one, using the
/// git repository at `root`: its ancestry (with signed commits required,
/// whether the history between them is signed throughout) and the freeze
/// window the live commit's own `cluster.yaml` has open. One per run;
/// answers are kept per live commit.
pub struct Ancestor {
    repo: Mutex<Option<git2::Repository>>,
    root: std::path::PathBuf,
    desired: String,
    signers: Option<gitsource::signed::AllowedSigners>,
    /// The last good commit, checked from when a target has no live one.
    since: Option<String>,
    /// The other targets' live commits, learnt when a target has none:
    /// their freeze windows are in force for it too.
    others: Mutex<Vec<String>>,
    /// Whether `others` was learnt (once per run).
    pub(super) learnt: tokio::sync::OnceCell<()>,
    /// The instants the live commit's freeze windows are checked at.
    instants: Vec<u64>,
    known: Mutex<HashMap<Option<String>, Relation>>,
}

impl Ancestor {
    #[must_use]
    pub fn new(root: &Path, desired: &str) -> Ancestor {
        Ancestor {
            repo: Mutex::new(git2::Repository::discover(root).ok()),
            root: root.to_owned(),
            desired: desired.to_owned(),
            signers: None,
            since: None,
            others: Mutex::new(Vec::new()),
            learnt: tokio::sync::OnceCell::new(),
            // The CLI checked the clock before the run.
            instants: compiler::clock::freeze_instants(),
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Require every commit from a live one to the desired one to be
    /// signed by one of `signers` (`reconcile --require-signed-by`).
    #[must_use]
    pub fn signed_by(mut self, signers: Option<gitsource::signed::AllowedSigners>) -> Ancestor {
        self.signers = signers;
        self
    }

    /// Check a target without a live commit (its `edgeform:meta` lost or
    /// never written) from `last_good` instead — descent, signed history
    /// and its freeze window — so a lost meta is no free pass.
    #[must_use]
    pub fn since(mut self, last_good: Option<String>) -> Ancestor {
        self.since = last_good.filter(|c| !c.is_empty());
        self
    }

    /// The live commits of the other targets of the run (see
    /// [`Ancestor::relate`]).
    pub fn learn(&self, commits: Vec<String>) {
        *self
            .others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = commits;
    }

    /// Where `desired` stands relative to `live` (without one, the last
    /// good commit), and that commit's open freeze window — for a target
    /// without a live commit, else the first one open among the other
    /// targets' live commits ([`Ancestor::learn`]).
    #[must_use]
    pub fn relate(&self, live: Option<&str>) -> Relation {
        let lost = live.is_none_or(str::is_empty);
        let live = live.filter(|c| !c.is_empty()).or(self.since.as_deref());
        let key = live.map(str::to_owned);
        let known = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(known) = known {
            return known;
        }
        let guard = self
            .repo
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let others = if lost {
            self.others
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        } else {
            Vec::new()
        };
        let relation = Relation {
            ancestry: self.ancestry(guard.as_ref(), live),
            frozen: guard.as_ref().and_then(|repo| {
                live.into_iter()
                    .chain(others.iter().map(String::as_str))
                    .find_map(|c| self.live_freeze(repo, c))
            }),
            // The stricter over every commit the target is held to (its
            // live one; without one, the others'); one whose cluster.yaml
            // cannot be read counts as the defaults, never as no limit.
            thresholds: guard.as_ref().and_then(|repo| {
                live.into_iter()
                    .chain(others.iter().map(String::as_str))
                    .map(|c| {
                        let apply = git2::Oid::from_str(&clean(c))
                            .ok()
                            .and_then(|id| live_apply_at(repo, &self.root, id));
                        Thresholds::of(apply.flatten().as_ref())
                    })
                    .reduce(Thresholds::stricter)
            }),
        };
        drop(guard);
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, relation.clone());
        relation
    }

    fn ancestry(&self, repo: Option<&git2::Repository>, live: Option<&str>) -> Ancestry {
        let Some(live) = live.map(clean) else {
            return Ancestry::Forward;
        };
        let desired = clean(&self.desired);
        if live == desired || live.is_empty() {
            return Ancestry::Forward;
        }
        let Some(repo) = repo else {
            return Ancestry::Unknown;
        };
        let (Ok(live_id), Ok(desired_id)) =
            (git2::Oid::from_str(&live), git2::Oid::from_str(&desired))
        else {
            return Ancestry::Unknown;
        };
        if repo.find_commit(live_id).is_err() || repo.find_commit(desired_id).is_err() {
            return Ancestry::Unknown;
        }
        let ancestry = if matches!(repo.graph_descendant_of(live_id, desired_id), Ok(true)) {
            Ancestry::Older
        } else {
            match repo.graph_descendant_of(desired_id, live_id) {
                Ok(true) => Ancestry::Forward,
                Ok(false) => Ancestry::Diverged,
                Err(_) => return Ancestry::Unknown,
            }
        };
        let Some(signers) = &self.signers else {
            return ancestry;
        };
        match gitsource::signed::verify_history(repo, live_id, desired_id, signers) {
            Ok(Ok(())) => ancestry,
            Ok(Err((commit, refusal))) => Ancestry::Unsigned {
                commit,
                why: refusal.as_str(),
            },
            Err(e) => {
                tracing::error!(cause = %edgeredis::one_line(&e), "cannot verify the signed history");
                Ancestry::Unsigned {
                    commit: desired,
                    why: "unverifiable",
                }
            }
        }
    }

    /// The freeze window open now in the live commit's `cluster.yaml`
    /// (the config repository's folder of that commit).
    fn live_freeze(&self, repo: &git2::Repository, live: &str) -> Option<Frozen> {
        let id = git2::Oid::from_str(&clean(live)).ok()?;
        let windows = freeze_windows(live_apply_at(repo, &self.root, id).flatten());
        FreezeWindow::open_at_any(&windows, &self.instants).map(|w| Frozen {
            window: w.name.clone(),
            until: compiler::clock::rfc3339(w.end),
        })
    }
}

fn clean(commit: &str) -> String {
    commit.trim_end_matches("+dirty").to_owned()
}

/// The `apply` block of `cluster.yaml` at commit `id`, in the folder of
/// the repository that `root` is: `None` when that commit is unknown or
/// its `cluster.yaml` cannot be read or parsed (the commit was checked
/// when it was applied), `Some(None)` when it has no `cluster.yaml` or no
/// `apply` block (every default).
fn live_apply_at(
    repo: &git2::Repository,
    root: &Path,
    id: git2::Oid,
) -> Option<Option<compiler::model::raw::Apply>> {
    let tree = repo.find_commit(id).ok()?.tree().ok()?;
    let workdir = repo.workdir()?.canonicalize().ok()?;
    let root = root.canonicalize().ok()?;
    let prefix = root.strip_prefix(&workdir).unwrap_or(Path::new(""));
    let Ok(entry) = tree.get_path(&prefix.join("cluster.yaml")) else {
        // No cluster.yaml: that commit ran with every default.
        return Some(None);
    };
    if entry.filemode() != i32::from(git2::FileMode::Blob)
        && entry.filemode() != i32::from(git2::FileMode::BlobExecutable)
    {
        return None;
    }
    let blob = repo.find_blob(entry.id()).ok()?;
    let text = String::from_utf8(blob.content().to_vec()).ok();
    let source = compiler::load::Source {
        kind: compiler::load::Kind::Cluster,
        path: "cluster.yaml".into(),
        text: Ok(text?),
    };
    let Some(compiler::parse::Raw::Cluster(raw)) = compiler::parse::parse_typed(&source).1 else {
        return None;
    };
    Some(raw.apply)
}

/// The freeze windows of an `apply` block (those whose times parse).
fn freeze_windows(apply: Option<compiler::model::raw::Apply>) -> Vec<FreezeWindow> {
    apply
        .map(|a| a.freeze)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|w| {
            Some(FreezeWindow {
                start: compiler::clock::parse_rfc3339(w.start.trim())?,
                end: compiler::clock::parse_rfc3339(w.end.trim())?,
                name: w.name,
                reason: w.reason,
            })
        })
        .collect()
}
