//! Running one operation on many targets: concurrently (bounded), each
//! outcome kept, one failure never stopping the others.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::Job;
use super::plan::Ancestry;

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
    for job in jobs {
        let limit = limit.clone();
        let fut = f(job.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await;
            (job, fut.await)
        });
    }
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(r) => out.push(r),
            Err(e) => tracing::error!(cause = %e, "target task failed"),
        }
    }
    out.sort_by(|a, b| a.0.node.name.cmp(&b.0.node.name));
    out
}

/// Tells where a desired commit stands relative to a live one, using the
/// git repository at `root`.
pub struct Ancestor {
    repo: Mutex<Option<git2::Repository>>,
    desired: String,
}

impl Ancestor {
    #[must_use]
    pub fn new(root: &Path, desired: &str) -> Ancestor {
        Ancestor {
            repo: Mutex::new(git2::Repository::discover(root).ok()),
            desired: desired.to_owned(),
        }
    }

    /// Where `desired` stands relative to `live`.
    #[must_use]
    pub fn relate(&self, live: Option<&str>) -> Ancestry {
        let clean = |c: &str| c.trim_end_matches("+dirty").to_owned();
        let Some(live) = live.map(clean) else {
            return Ancestry::Forward;
        };
        let desired = clean(&self.desired);
        if live == desired || live.is_empty() {
            return Ancestry::Forward;
        }
        let guard = self
            .repo
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(repo) = guard.as_ref() else {
            return Ancestry::Unknown;
        };
        let (Ok(live_id), Ok(desired_id)) =
            (git2::Oid::from_str(&live), git2::Oid::from_str(&desired))
        else {
            return Ancestry::Unknown;
        };
        if repo.find_commit(live_id).is_err() {
            return Ancestry::Unknown;
        }
        if repo.find_commit(desired_id).is_err() {
            return Ancestry::Unknown;
        }
        match repo.graph_descendant_of(live_id, desired_id) {
            Ok(true) => Ancestry::Older,
            Ok(false) => Ancestry::Forward,
            Err(_) => Ancestry::Unknown,
        }
    }
}
