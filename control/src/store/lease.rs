//! Leases in the state store: a named right to do some work, held by a
//! token until its time to live passes unless renewed. Two reconcile
//! daemons sharing a store ([`super::RedisStore`], or one state directory
//! on one host) run their side-effecting jobs only while holding the
//! [`RECONCILE`] lease, so exactly one of them syncs, heals, delivers the
//! purge outbox and orders certificates; when the holder dies (kill -9),
//! its lease runs out and the other takes it over.
//!
//! Backends: in Redis `edgeform:state:lease:<name>` (taken with one Lua
//! script: set with `PX` when free or already ours; released by
//! compare-and-delete); in the state directory `<state>/leases/<name>`
//! (`<token> <expiry, Unix ms>`), read and written under an exclusive
//! `flock` of `<state>/leases/.<name>.lock`.
//!
//! [`Leader`] keeps one lease from a thread of its own (the jobs it
//! guards may run longer than the lease). It counts the lease held only
//! until `sent + ttl`, `sent` being the instant before the request that
//! took or renewed it: the store's copy lives at least that long, so a
//! leader cut off from the store stops starting jobs before another can
//! take the lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{DirStore, Store, StoreError};

/// The lease of the reconcile daemon's jobs (sync, heal, the purge
/// outbox, certificates).
pub const RECONCILE: &str = "reconcile";

/// The lease of a daemon that serves the targets `only` (all when
/// empty): [`RECONCILE`], or `reconcile-<16 hex digits>` of the sorted
/// names, so daemons serving the same targets exclude each other and
/// daemons serving other targets (`--node`) do not. Pure.
#[must_use]
pub fn scope(only: &[String]) -> String {
    use sha2::Digest as _;
    if only.is_empty() {
        return RECONCILE.to_owned();
    }
    let mut names: Vec<&str> = only.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let digest = sha2::Sha256::digest(names.join("\n").as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{RECONCILE}-{hex}")
}

/// The folder of the leases, in the state directory.
const LEASES: &str = "leases";

/// Whether `name` can name a lease (`[a-z][a-z0-9-]*`, at most 64).
#[must_use]
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Whether `token` can hold a lease: printable ASCII without spaces or
/// `:` (it is carried in an apply lock's token), at most 200.
#[must_use]
pub fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 200
        && token.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

/// Check a lease's name and token.
///
/// # Errors
/// [`StoreError::Lease`] naming what is wrong.
pub fn check(name: &str, token: Option<&str>) -> Result<(), StoreError> {
    if !valid_name(name) {
        return Err(StoreError::Lease(format!(
            "`{}` is not a lease name",
            edgestate::untrusted::escape(name)
        )));
    }
    if let Some(t) = token
        && !valid_token(t)
    {
        return Err(StoreError::Lease(format!(
            "`{}` is not a lease token",
            edgestate::untrusted::escape(t)
        )));
    }
    Ok(())
}

/// A lease as the state directory keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLease {
    pub token: String,
    /// Unix time in milliseconds it runs out.
    pub expires_ms: u64,
}

impl FileLease {
    /// `<token> <expiry ms>`; anything else is no lease (a torn or foreign
    /// file never holds one).
    #[must_use]
    pub fn parse(text: &str) -> Option<FileLease> {
        let (token, ms) = text.trim().split_once(' ')?;
        if !valid_token(token) {
            return None;
        }
        Some(FileLease {
            token: token.to_owned(),
            expires_ms: ms.trim().parse().ok()?,
        })
    }

    #[must_use]
    pub fn render(&self) -> String {
        format!("{} {}\n", self.token, self.expires_ms)
    }
}

/// Who holds a lease kept as `current` at `now_ms`: none once it ran out.
/// Pure.
#[must_use]
pub fn holder(current: Option<&FileLease>, now_ms: u64) -> Option<&str> {
    current
        .filter(|l| l.expires_ms > now_ms)
        .map(|l| l.token.as_str())
}

/// Whether `token` may take (or renew) a lease kept as `current` at
/// `now_ms`: it is free, ran out, or is already `token`'s. Pure.
#[must_use]
pub fn may_take(current: Option<&FileLease>, token: &str, now_ms: u64) -> bool {
    holder(current, now_ms).is_none_or(|h| h == token)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl DirStore {
    /// Run `f` on the lease file `name` (its lease, if any parses) under
    /// an exclusive lock; `f` says what to write back (`Some(None)`:
    /// remove it).
    fn with_lease<T>(
        &self,
        name: &str,
        f: impl FnOnce(Option<FileLease>) -> (T, Option<Option<FileLease>>),
    ) -> Result<T, StoreError> {
        let dir = self.root().join(LEASES);
        self.folder(&dir)?;
        let lock = super::locked(&dir.join(format!(".{name}.lock")))?;
        let path = dir.join(name);
        // Never through a link, never blocking on a FIFO planted there.
        let current = self
            .read_capped(&path, 512)?
            .and_then(|text| FileLease::parse(&text));
        let (out, write) = f(current);
        let written = match write {
            None => Ok(()),
            Some(Some(l)) => self.write(&dir, name, &l.render()),
            Some(None) => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(super::io(&path, &e)),
                _ => Ok(()),
            },
        };
        let _ = lock.unlock();
        written.map(|()| out)
    }

    pub(super) fn take_lease_file(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        check(name, Some(token))?;
        self.with_lease(name, |current| {
            let now = now_ms();
            if may_take(current.as_ref(), token, now) {
                let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
                let lease = FileLease {
                    token: token.to_owned(),
                    expires_ms: now.saturating_add(ttl),
                };
                (true, Some(Some(lease)))
            } else {
                (false, None)
            }
        })
    }

    pub(super) fn release_lease_file(&self, name: &str, token: &str) -> Result<(), StoreError> {
        check(name, Some(token))?;
        self.with_lease(name, |current| {
            if current.as_ref().is_some_and(|l| l.token == token) {
                ((), Some(None))
            } else {
                ((), None)
            }
        })
    }

    pub(super) fn lease_holder_file(&self, name: &str) -> Result<Option<String>, StoreError> {
        check(name, None)?;
        self.with_lease(name, |current| {
            (holder(current.as_ref(), now_ms()).map(str::to_owned), None)
        })
    }
}

/// The lease's time to live for a daemon that syncs every `sync_every`
/// and heals every `heal_every`: half the shorter interval, at least one
/// second, at most five minutes. With [`renew_every`] a standby takes a
/// dead holder's work over within `ttl + ttl / 3` (two thirds of the
/// interval), then runs a sync at once. Pure.
#[must_use]
pub fn ttl_for(sync_every: Duration, heal_every: Duration) -> Duration {
    (sync_every.min(heal_every) / 2).clamp(Duration::from_secs(1), Duration::from_secs(300))
}

/// How often the holder renews (and a standby tries to take) a lease of
/// `ttl`: a third of it, so two renewals may fail before it runs out.
/// Pure.
#[must_use]
pub fn renew_every(ttl: Duration) -> Duration {
    ttl / 3
}

/// Whether a lease counted held until `until` still is at `now`. Pure.
#[must_use]
pub fn holds(until: Option<Instant>, now: Instant) -> bool {
    until.is_some_and(|u| now < u)
}

/// A new holder token for this process and the lease `name`:
/// `<host>/<pid>/<nonce>/<name>` (the lease's name last, so a lock
/// carrying the token says which lease to check: [`lease_of`]).
#[must_use]
pub fn new_token(name: &str) -> String {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let host: String = crate::lock::hostname()
        .chars()
        .filter(|c| c.is_ascii_graphic() && !matches!(c, ':' | '/'))
        .take(64)
        .collect();
    format!("{host}/{}/{nonce:x}/{name}", std::process::id())
}

/// The lease a holder token made by [`new_token`] is for. Pure.
#[must_use]
pub fn lease_of(token: &str) -> Option<&str> {
    let (_, name) = token.rsplit_once('/')?;
    valid_name(name).then_some(name)
}

/// One lease kept by this process from a thread of its own. See the
/// module documentation.
pub struct Leader {
    name: String,
    token: String,
    ttl: Duration,
    store: Arc<dyn Store>,
    until: Mutex<Option<Instant>>,
    gained: tokio::sync::Notify,
    stop: AtomicBool,
    /// The store failed the last attempt (said once per streak).
    failing: AtomicBool,
    on_change: Box<dyn Fn(bool) + Send + Sync>,
}

impl Leader {
    /// Start keeping the lease `name` in `store` with `ttl`: one attempt
    /// now (a lone daemon leads from its start), then every
    /// [`renew_every`] on a thread. `on_change` is told when the lease is
    /// taken or lost (a metric).
    ///
    /// # Errors
    /// No thread could be started.
    pub fn start(
        store: Arc<dyn Store>,
        name: &str,
        ttl: Duration,
        on_change: impl Fn(bool) + Send + Sync + 'static,
    ) -> std::io::Result<Arc<Leader>> {
        let leader = Arc::new(Leader {
            name: name.to_owned(),
            token: new_token(name),
            ttl,
            store,
            until: Mutex::new(None),
            gained: tokio::sync::Notify::new(),
            stop: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            on_change: Box::new(on_change),
        });
        leader.attempt(false);
        let keeper = Arc::clone(&leader);
        std::thread::Builder::new()
            .name("lease".into())
            .spawn(move || {
                let every = renew_every(keeper.ttl);
                loop {
                    let next = Instant::now() + every;
                    while Instant::now() < next {
                        if keeper.stop.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(50).min(every));
                    }
                    keeper.attempt(true);
                }
            })?;
        Ok(leader)
    }

    fn until(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take or renew the lease once; `notify`: wake [`Leader::gained`]
    /// when taken (not on the first attempt, which the daemon's start
    /// follows anyway).
    fn attempt(&self, notify: bool) {
        let sent = Instant::now();
        let was = self.held();
        let answer = self.store.take_lease(&self.name, &self.token, self.ttl);
        if answer.is_ok() && self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(lease = %self.name, "lease: the state store answers again");
        }
        match answer {
            Ok(true) => {
                *self.until() = Some(sent + self.ttl);
                if !was {
                    tracing::info!(lease = %self.name, token = %self.token, ttl_ms = self.ttl.as_millis(), "lease taken: this daemon runs the jobs");
                    (self.on_change)(true);
                    if notify {
                        self.gained.notify_one();
                    }
                }
            }
            Ok(false) => {
                *self.until() = None;
                if was {
                    tracing::warn!(lease = %self.name, "lease lost to another daemon: standing by");
                    (self.on_change)(false);
                }
            }
            Err(e) => {
                // Held until it runs out here too.
                let still = self.held();
                if was && !still {
                    (self.on_change)(false);
                }
                let first = !self.failing.swap(true, Ordering::Relaxed);
                if was {
                    tracing::warn!(lease = %self.name, cause = %e, held = still, "lease: cannot renew");
                } else if first {
                    // Once per streak: a standby cut off from the store
                    // must say so, not stay silent.
                    tracing::warn!(lease = %self.name, cause = %e, "lease: cannot take it: the state store does not answer; standing by");
                }
            }
        }
    }

    /// Whether this process holds the lease now.
    #[must_use]
    pub fn held(&self) -> bool {
        holds(*self.until(), Instant::now())
    }

    /// Resolves when the lease is taken (from not held).
    pub async fn gained(&self) {
        self.gained.notified().await;
    }

    /// The lease's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This process's token.
    #[must_use]
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The lease's time to live.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Who holds the lease now, as the store says.
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn current(&self) -> Result<Option<String>, StoreError> {
        self.store.lease_holder(&self.name)
    }

    /// Who holds the lease `name` (maybe another daemon's) in this
    /// leader's store.
    ///
    /// # Errors
    /// A bad name, or the store cannot be read.
    pub fn holder_of(&self, name: &str) -> Result<Option<String>, StoreError> {
        self.store.lease_holder(name)
    }

    /// Stop renewing and give the lease up (a clean stop: the other
    /// daemon takes over at its next attempt, not after the lease).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if self.held() {
            (self.on_change)(false);
        }
        *self.until() = None;
        if let Err(e) = self.store.release_lease(&self.name, &self.token) {
            tracing::warn!(lease = %self.name, cause = %e, "lease: cannot release");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_free_when_missing_run_out_or_ours() {
        let l = FileLease {
            token: "a/1/f".into(),
            expires_ms: 1_000,
        };
        assert!(may_take(None, "b/2/f", 500));
        assert!(may_take(Some(&l), "a/1/f", 500));
        assert!(!may_take(Some(&l), "b/2/f", 999));
        assert!(may_take(Some(&l), "b/2/f", 1_000));
        assert_eq!(holder(Some(&l), 999), Some("a/1/f"));
        assert_eq!(holder(Some(&l), 1_000), None);
        assert_eq!(FileLease::parse(&l.render()), Some(l));
        for bad in ["", "a/1/f", "a:1 5", "a/1/f x", "a b c"] {
            assert_eq!(FileLease::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_lease_follows_the_intervals_within_bounds() {
        let s = Duration::from_secs;
        assert_eq!(ttl_for(s(60), s(300)), s(30));
        assert_eq!(ttl_for(s(2), s(3600)), s(1));
        assert_eq!(ttl_for(s(1), s(1)), s(1));
        assert_eq!(ttl_for(s(3600), s(7200)), s(300));
        assert_eq!(renew_every(s(30)), s(10));
        let now = Instant::now();
        assert!(holds(Some(now + s(1)), now));
        assert!(!holds(Some(now), now));
        assert!(!holds(None, now));
        let t = new_token("reconcile-00ff");
        assert!(valid_token(&t), "{t}");
        assert_eq!(lease_of(&t), Some("reconcile-00ff"));
        assert_eq!(lease_of("h/1/ff/Bad"), None);
        assert_eq!(lease_of("nothing"), None);
        assert!(!valid_name("Reconcile") && !valid_name("") && valid_name(RECONCILE));
        assert_eq!(scope(&[]), "reconcile");
        let ab = scope(&["b".into(), "a".into()]);
        assert_eq!(ab, scope(&["a".into(), "b".into(), "a".into()]));
        assert_ne!(ab, scope(&["a".into()]));
        assert!(
            valid_name(&ab) && ab.len() == "reconcile-".len() + 16,
            "{ab}"
        );
    }

    #[test]
    fn two_holders_on_one_state_directory_exclude_each_other() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        let ttl = Duration::from_millis(300);
        assert!(s.take_lease_file("reconcile", "a/1/1", ttl).unwrap());
        assert!(!s.take_lease_file("reconcile", "b/2/2", ttl).unwrap());
        assert!(s.take_lease_file("reconcile", "a/1/1", ttl).unwrap());
        assert_eq!(
            s.lease_holder_file("reconcile").unwrap().as_deref(),
            Some("a/1/1")
        );
        std::thread::sleep(ttl);
        assert_eq!(s.lease_holder_file("reconcile").unwrap(), None);
        assert!(s.take_lease_file("reconcile", "b/2/2", ttl).unwrap());
        s.release_lease_file("reconcile", "a/1/1").unwrap();
        assert!(!s.take_lease_file("reconcile", "a/1/1", ttl).unwrap());
        s.release_lease_file("reconcile", "b/2/2").unwrap();
        assert!(s.take_lease_file("reconcile", "a/1/1", ttl).unwrap());
        assert!(matches!(
            s.take_lease_file("../x", "a", ttl),
            Err(StoreError::Lease(_))
        ));
        assert!(matches!(
            s.take_lease_file("reconcile", "a:b", ttl),
            Err(StoreError::Lease(_))
        ));
    }

    #[test]
    fn a_fifo_planted_as_the_lease_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        assert!(
            s.take_lease_file("reconcile", "a/1/1", Duration::from_secs(1))
                .unwrap()
        );
        let lease = d.path().join("state").join(LEASES).join("reconcile");
        std::fs::remove_file(&lease).unwrap();
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&lease)
            .status()
            .unwrap();
        assert!(made.success());
        let taken = s.take_lease_file("reconcile", "a/1/1", Duration::from_secs(1));
        assert!(matches!(taken, Err(StoreError::Unsafe { .. })), "{taken:?}");
    }
}
