//! The apply lease lock on a target (`edgeform:lock`) and who holds it.
//!
//! The token names its holder: `host:pid:start:pidns:nonce` (`start` is
//! the process start time from `/proc/<pid>/stat`, `pidns` the inode of
//! its pid namespace). A lock whose holder is on this host, in this pid
//! namespace, and provably dead (no such process, a zombie, or the pid
//! now belongs to a process started at another time) is taken over at
//! once, atomically (compare-and-set on the token in a Lua script), and
//! logged. A reconcile daemon running under the state store's leader
//! lease ([`crate::store::lease`], set by [`run_under`]) adds its lease
//! token to its locks' tokens (`…:nonce:<host>/<pid>/<nonce>/<lease>`);
//! a lock naming a lease that the store says is no longer held by that
//! token (the daemon was killed, on this host or another, or cut off from
//! the store) is a dead holder's too (for `edgeform unlock` as well, when
//! a shared store is set): taken over at once and logged, instead of blocking the
//! surviving daemon for the lock's lease. Any other lock waits for its
//! lease (5 minutes) or for `edgeform unlock --node N --force`.
//!
//! [`judge`] and [`judge_lease`] are pure; [`Holder::current`] and
//! [`process`] read `/proc`.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::aio::MultiplexedConnection;

use edgestate::keys;

/// Who holds (or would hold) a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub host: String,
    pub pid: u32,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`);
    /// absent in tokens written before it was recorded.
    pub start: Option<u64>,
    /// Inode of the pid namespace (`/proc/<pid>/ns/pid`).
    pub pidns: Option<u64>,
    /// The token of the leader lease the holder ran under (a reconcile
    /// daemon), if any.
    pub lease: Option<String>,
}

/// The leader lease this process runs under, when it is a reconcile
/// daemon ([`run_under`]).
static LEADER: OnceLock<Arc<crate::store::lease::Leader>> = OnceLock::new();

/// This process runs its applies under `leader`: its lock tokens name the
/// lease, and locks naming a lease no longer held are taken over. Only
/// the first call counts.
pub fn run_under(leader: Arc<crate::store::lease::Leader>) {
    let _ = LEADER.set(leader);
}

/// What `/proc` says about a pid on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    pub start: u64,
    /// Killed but not yet reaped: dead.
    pub zombie: bool,
}

/// Whether a holder is provably dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Dead(Dead),
    /// Running, or not provable from here.
    NotProvable(Why),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dead {
    NoSuchProcess,
    Zombie,
    PidReused,
    /// Its daemon's leader lease is no longer its own.
    LeaseLost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Running,
    OtherHost,
    OtherPidNamespace,
    UnknownToken,
}

impl Dead {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Dead::NoSuchProcess => "no such process",
            Dead::Zombie => "the process has exited",
            Dead::PidReused => "the pid belongs to a newer process",
            Dead::LeaseLost => {
                "its daemon's lease in the state store ran out (the daemon was killed or cut off)"
            }
        }
    }
}

impl Why {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Running => "the holder is running",
            Why::OtherHost => "the holder is on another host",
            Why::OtherPidNamespace => "the holder is in another pid namespace",
            Why::UnknownToken => "the token does not name a holder",
        }
    }
}

impl Holder {
    /// This process. Reads `/proc`.
    #[must_use]
    pub fn current() -> Holder {
        let pid = std::process::id();
        Holder {
            host: hostname(),
            pid,
            start: process(pid).map(|p| p.start),
            pidns: pidns("self"),
            lease: LEADER.get().map(|l| l.token().to_owned()),
        }
    }

    /// The lock token: the holder and a nonce unique to this acquisition.
    #[must_use]
    pub fn token(&self, nonce: u128) -> String {
        let opt = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
        let token = format!(
            "{}:{}:{}:{}:{nonce}",
            self.host,
            self.pid,
            opt(self.start),
            opt(self.pidns)
        );
        match &self.lease {
            Some(lease) => format!("{token}:{lease}"),
            None => token,
        }
    }

    /// The holder a token names (`host:pid:start:pidns:nonce`, with
    /// `:lease` from a daemon under a leader lease, or the older
    /// `host:pid:nonce`).
    #[must_use]
    pub fn parse(token: &str) -> Option<Holder> {
        let parts: Vec<&str> = token.split(':').collect();
        let num = |s: &str| -> Option<Option<u64>> {
            if s.is_empty() {
                Some(None)
            } else {
                s.parse().ok().map(Some)
            }
        };
        match parts[..] {
            [host, pid, start, pidns, _nonce] if !host.is_empty() => Some(Holder {
                host: host.to_owned(),
                pid: pid.parse().ok()?,
                start: num(start)?,
                pidns: num(pidns)?,
                lease: None,
            }),
            [host, pid, start, pidns, _nonce, lease]
                if !host.is_empty() && crate::store::lease::valid_token(lease) =>
            {
                Some(Holder {
                    host: host.to_owned(),
                    pid: pid.parse().ok()?,
                    start: num(start)?,
                    pidns: num(pidns)?,
                    lease: Some(lease.to_owned()),
                })
            }
            [host, pid, _nonce] if !host.is_empty() => Some(Holder {
                host: host.to_owned(),
                pid: pid.parse().ok()?,
                start: None,
                pidns: None,
                lease: None,
            }),
            _ => None,
        }
    }
}

/// Whether `holder` is provably dead, seen from `here` with `process`
/// what `/proc` says about `holder.pid` (None: no such process). Pure.
#[must_use]
pub fn judge(holder: &Holder, here: &Holder, process: Option<Process>) -> Liveness {
    if holder.host != here.host {
        return Liveness::NotProvable(Why::OtherHost);
    }
    if holder.pidns.is_some() && here.pidns.is_some() && holder.pidns != here.pidns {
        return Liveness::NotProvable(Why::OtherPidNamespace);
    }
    match process {
        None => Liveness::Dead(Dead::NoSuchProcess),
        Some(p) if p.zombie => Liveness::Dead(Dead::Zombie),
        Some(p) if holder.start.is_some_and(|s| s != p.start) => Liveness::Dead(Dead::PidReused),
        Some(_) => Liveness::NotProvable(Why::Running),
    }
}

/// A holder not provably dead from `/proc` (`seen`) that ran under a
/// leader lease which `current` (who holds that lease now, as the state
/// store says; None: not known) shows is no longer its own is dead: its
/// daemon was killed or cut off, and a daemon stops starting applies
/// before the store lets its lease go. Pure.
#[must_use]
pub fn judge_lease(seen: Liveness, holder: &Holder, current: Option<Option<&str>>) -> Liveness {
    match (seen, holder.lease.as_deref(), current) {
        (Liveness::NotProvable(_), Some(lease), Some(now)) if now != Some(lease) => {
            Liveness::Dead(Dead::LeaseLost)
        }
        _ => seen,
    }
}

/// Judge a token seen on a target, from this process. Reads `/proc`, and
/// the state store when this process runs under a leader lease.
#[must_use]
pub fn judge_token(token: &str) -> Liveness {
    let Some(holder) = Holder::parse(token) else {
        return Liveness::NotProvable(Why::UnknownToken);
    };
    let here = Holder::current();
    let seen = if holder.host == here.host {
        process(holder.pid)
    } else {
        None
    };
    let seen = judge(&holder, &here, seen);
    if !matches!(seen, Liveness::NotProvable(_)) {
        return seen;
    }
    let Some(name) = holder
        .lease
        .as_deref()
        .and_then(crate::store::lease::lease_of)
    else {
        return seen;
    };
    // The daemon's own store, else (`edgeform unlock`) the shared one.
    let current = match LEADER.get() {
        Some(leader) => leader.holder_of(name),
        None => match crate::store::shared_store() {
            Ok(Some(store)) => crate::store::Store::lease_holder(&*store, name),
            _ => return seen,
        },
    };
    match current {
        Ok(now) => judge_lease(seen, &holder, Some(now.as_deref())),
        Err(e) => {
            tracing::warn!(cause = %e, lease = name, "cannot read a lease to judge a target's lock");
            seen
        }
    }
}

/// `/proc/<pid>/stat`'s start time and state; None when there is no such
/// process.
#[must_use]
pub fn process(pid: u32) -> Option<Process> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// Fields after the command name (which may hold spaces and parentheses):
/// state is field 3, starttime field 22.
fn parse_stat(stat: &str) -> Option<Process> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = *fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    Some(Process {
        start,
        zombie: matches!(state, "Z" | "X" | "x"),
    })
}

fn pidns(of: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{of}/ns/pid")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "host".into(), |h| h.trim().to_owned())
}

const RELEASE: &str = include_str!("lua/lock_release.lua");
const TAKE_OVER: &str = include_str!("lua/lock_take_over.lua");

/// A held lock.
pub struct Lock {
    token: String,
}

impl Lock {
    /// Take the lock, waiting up to `wait` for another holder to finish;
    /// a provably dead holder's lock is taken over at once.
    ///
    /// # Errors
    /// Still held by someone else after `wait` (the holder is named).
    pub async fn acquire(
        con: &mut MultiplexedConnection,
        lease: Duration,
        wait: Duration,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Lock> {
        let token = Holder::current().token(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let start = Instant::now();
        // Jittered: appliers waiting on one lock retry apart.
        let mut pause = edgestate::backoff::Backoff::random(
            Duration::from_millis(20),
            Duration::from_millis(500),
        );
        let mut judged: Option<String> = None;
        let mut waited = false;
        let counted = |waited: bool| {
            if waited {
                metrics.lock_waited(start.elapsed());
            }
        };
        loop {
            let ok: Option<String> = redis::cmd("SET")
                .arg(keys::LOCK)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .query_async(con)
                .await?;
            if ok.is_some() {
                counted(waited);
                return Ok(Lock { token });
            }
            let holder: Option<String> = redis::cmd("GET")
                .arg(keys::LOCK)
                .query_async(con)
                .await
                .with_context(|| format!("reading {}", keys::LOCK))?;
            if let Some(held) = &holder
                && judged.as_ref() != Some(held)
            {
                judged = Some(held.clone());
                if let Liveness::Dead(why) = judge_token(held) {
                    let took: i64 = redis::Script::new(TAKE_OVER)
                        .key(keys::LOCK)
                        .arg(held)
                        .arg(&token)
                        .arg(lease_ms)
                        .invoke_async(con)
                        .await?;
                    if took == 1 {
                        tracing::warn!(holder = %edgestate::untrusted::escape(held), reason = why.as_str(), "took over the apply lock of a dead holder");
                        counted(waited);
                        return Ok(Lock { token });
                    }
                }
            }
            if start.elapsed() >= wait {
                bail!(
                    "locked by another apply ({}) for more than {:?}; if that apply is gone, \
                     `edgeform unlock --node <node> --force`",
                    // The edge's text: escaped.
                    holder.map_or_else(|| "unknown".into(), |h| edgestate::untrusted::escape(&h)),
                    wait
                );
            }
            waited = true;
            tokio::time::sleep(pause.next_delay()).await;
        }
    }

    /// Release the lock if it is still ours.
    pub async fn release(self, con: &mut MultiplexedConnection) {
        let _: Result<i64, _> = redis::Script::new(RELEASE)
            .key(keys::LOCK)
            .arg(&self.token)
            .invoke_async(con)
            .await;
    }
}

/// What `edgeform unlock` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unlocked {
    NoLock,
    /// Removed: the holder's token, and why it was provably dead (None:
    /// removed by `--force`).
    Removed {
        holder: String,
        dead: Option<Dead>,
    },
    /// Left alone: the holder may be alive.
    Refused {
        holder: String,
        why: Why,
    },
}

/// Remove a target's lock when its holder is provably dead, or with
/// `force` whoever holds it. Compare-and-delete: a lock taken by someone
/// else in between is never removed.
///
/// # Errors
/// Redis errors.
pub async fn unlock(con: &mut MultiplexedConnection, force: bool) -> Result<Unlocked> {
    let holder: Option<String> = redis::cmd("GET")
        .arg(keys::LOCK)
        .query_async(con)
        .await
        .with_context(|| format!("reading {}", keys::LOCK))?;
    let Some(holder) = holder else {
        return Ok(Unlocked::NoLock);
    };
    let dead = match judge_token(&holder) {
        Liveness::Dead(d) => Some(d),
        Liveness::NotProvable(why) if !force => return Ok(Unlocked::Refused { holder, why }),
        Liveness::NotProvable(_) => None,
    };
    let removed: i64 = redis::Script::new(RELEASE)
        .key(keys::LOCK)
        .arg(&holder)
        .invoke_async(con)
        .await?;
    if removed == 1 {
        Ok(Unlocked::Removed { holder, dead })
    } else {
        Ok(Unlocked::NoLock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> Holder {
        Holder {
            host: "h1".into(),
            pid: 10,
            start: Some(500),
            pidns: Some(4_026_531_836),
            lease: None,
        }
    }

    #[test]
    fn a_holder_whose_lease_is_gone_is_dead_and_one_whose_lease_holds_is_not() {
        let mut h = here();
        h.host = "h2".into();
        h.lease = Some("h2/77/abc/reconcile".into());
        assert_eq!(Holder::parse(&h.token(9)), Some(h.clone()));
        let away = Liveness::NotProvable(Why::OtherHost);
        // The lease ran out, or another daemon holds it now.
        assert_eq!(
            judge_lease(away, &h, Some(None)),
            Liveness::Dead(Dead::LeaseLost)
        );
        assert_eq!(
            judge_lease(away, &h, Some(Some("h1/10/def/reconcile"))),
            Liveness::Dead(Dead::LeaseLost)
        );
        // Still its own, or the store not known: wait.
        assert_eq!(
            judge_lease(away, &h, Some(Some("h2/77/abc/reconcile"))),
            away
        );
        assert_eq!(judge_lease(away, &h, None), away);
        // No lease named (an `apply` from a shell): the lease says nothing.
        let mut plain = h.clone();
        plain.lease = None;
        assert_eq!(judge_lease(away, &plain, Some(None)), away);
        // Provably dead from /proc stays so.
        let dead = Liveness::Dead(Dead::NoSuchProcess);
        assert_eq!(
            judge_lease(dead, &h, Some(Some("h2/77/abc/reconcile"))),
            dead
        );
        // A lease token with a `:` would break the token: never parsed.
        assert_eq!(Holder::parse("h2:1:2:3:4:a:b"), None);
    }

    #[test]
    fn tokens_round_trip_and_old_tokens_parse() {
        let h = here();
        assert_eq!(Holder::parse(&h.token(42)), Some(h));
        let old = Holder::parse("h1:77:1700000000000000000").unwrap();
        assert_eq!((old.pid, old.start, old.pidns), (77, None, None));
        assert_eq!(Holder::parse("garbage"), None);
        assert_eq!(Holder::parse("h1:x:1:2:3"), None);
    }

    #[test]
    fn only_a_provably_dead_holder_on_this_host_is_dead() {
        let me = here();
        let other = |f: &dyn Fn(&mut Holder)| {
            let mut h = here();
            h.pid = 20;
            f(&mut h);
            h
        };
        let alive = Some(Process {
            start: 500,
            zombie: false,
        });
        let h = other(&|_| {});
        assert_eq!(judge(&h, &me, None), Liveness::Dead(Dead::NoSuchProcess));
        assert_eq!(judge(&h, &me, alive), Liveness::NotProvable(Why::Running));
        let zombie = Some(Process {
            start: 500,
            zombie: true,
        });
        assert_eq!(judge(&h, &me, zombie), Liveness::Dead(Dead::Zombie));
        let reused = Some(Process {
            start: 900,
            zombie: false,
        });
        assert_eq!(judge(&h, &me, reused), Liveness::Dead(Dead::PidReused));
        // Without a recorded start time a running pid is not provably dead.
        let old = other(&|h| h.start = None);
        assert_eq!(
            judge(&old, &me, reused),
            Liveness::NotProvable(Why::Running)
        );
        let remote = other(&|h| h.host = "h2".into());
        assert_eq!(
            judge(&remote, &me, None),
            Liveness::NotProvable(Why::OtherHost)
        );
        let container = other(&|h| h.pidns = Some(1));
        assert_eq!(
            judge(&container, &me, None),
            Liveness::NotProvable(Why::OtherPidNamespace)
        );
    }

    #[test]
    fn stat_with_parentheses_in_the_name() {
        let stat =
            "123 (a) b (c)) S 1 123 123 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(
            parse_stat(stat),
            Some(Process {
                start: 98765,
                zombie: false
            })
        );
        let me = process(std::process::id()).unwrap();
        assert!(!me.zombie);
        assert_eq!(Holder::current().start, Some(me.start));
    }
}
