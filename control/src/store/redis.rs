//! [`RedisStore`]: the state store in a Redis the control hosts reach, so
//! two reconcilers share it (`--state-store`, env `EDGEFORM_STATE_STORE`).
//!
//! Reached like a node's own Redis (`edgeredis`): by URL or through
//! Sentinels (the master resolved anew on each connection, so a failover
//! is followed), an ACL user, the password only from an environment
//! variable, TLS verified against a CA. The setting is either a
//! `redis://` / `rediss://` URL (user part allowed, never a password: the
//! password then comes from `EDGEFORM_STATE_STORE_PASSWORD` when set), or
//! the path of a YAML file holding a `redis:` block written exactly like a
//! node file's (`url` or `sentinels` + `master`, `username`,
//! `password_env`, `tls: {ca_file, cert_file, key_file}`), for Sentinels
//! and private CAs, which a URL cannot say.
//!
//! Layout (every key under [`PREFIX`]; names only in keys, secret values
//! and key material only in values):
//! - `edgeform:state:secrets:<node>`: a hash, secret name → value;
//! - `edgeform:state:last-good-commit`: a string, a hex commit id;
//! - `edgeform:state:cert:<name>`: a hash, `chain` and `key` (PEM),
//!   replaced whole in one MULTI;
//! - `edgeform:state:acme:account`: a string, the ACME account's JSON;
//! - `edgeform:state:outbox:<node>`: a hash, the purge outbox's entries
//!   (`<sequence>-<job id>` → the kept job, JSON);
//! - `edgeform:state:acme:renewal`: a string, the certificates job's
//!   renewal state (JSON);
//! - `edgeform:state:rollout`: a string, the rollouts' book (JSON,
//!   `crate::rollout::Book`);
//! - `edgeform:state:lease:<name>`: a string with a `PX` expiry, the
//!   holder's token ([`super::lease`]; taken and renewed by one Lua
//!   script, released by compare-and-delete).
//!
//! Each write is one command or one MULTI. The trait is synchronous and
//! callers run inside and outside a tokio runtime, so the connection lives
//! on a thread of its own with its own runtime; a call sends its commands
//! there and waits for the answer (bounded by [`TIMEOUT`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use edgestate::target::{RedisTarget, TargetError, TlsFiles};
use redis::Value;

use super::{
    MAX_CERT_BYTES, MAX_OUTBOX_ENTRY_BYTES, MAX_RENEWAL_STATE_BYTES, MAX_ROLLOUT_STATE_BYTES,
    MAX_SECRET_BYTES, Store, StoreError, StoredCert, kept_commit, stored_secret, valid_cert_name,
    valid_node, valid_outbox_name, valid_secret_name, valid_secret_value,
};

/// Every key of the store starts with this.
pub const PREFIX: &str = "edgeform:state:";
/// The variable holding the password when the setting is a URL.
pub const PASSWORD_ENV: &str = "EDGEFORM_STATE_STORE_PASSWORD";
/// The longest one attempt of a call waits for the store (a call makes
/// at most two).
pub const TIMEOUT: Duration = Duration::from_secs(15);
/// How the store is named in `edgeredis`'s messages.
const WHO: &str = "state-store";

fn secrets_key(node: &str) -> String {
    format!("{PREFIX}secrets:{node}")
}
fn cert_key(name: &str) -> String {
    format!("{PREFIX}cert:{name}")
}
fn last_good_key() -> String {
    format!("{PREFIX}last-good-commit")
}
fn outbox_key(node: &str) -> String {
    format!("{PREFIX}outbox:{node}")
}
fn account_key() -> String {
    format!("{PREFIX}acme:account")
}
fn renewal_key() -> String {
    format!("{PREFIX}acme:renewal")
}
fn rollout_key() -> String {
    format!("{PREFIX}rollout")
}
fn lease_key(name: &str) -> String {
    format!("{PREFIX}lease:{name}")
}

const LEASE_TAKE: &str = include_str!("../lua/lease_take.lua");
const LEASE_RELEASE: &str = include_str!("../lua/lock_release.lua");
const ROLLOUT_REPLACE: &str = include_str!("../lua/rollout_replace.lua");
const IMPORT: &str = include_str!("../lua/import.lua");
const READ_CAPPED: &str = include_str!("../lua/read_capped.lua");
/// The longest lease holder or last good commit read (both far shorter).
const MAX_SHORT_BYTES: usize = 4096;

fn config_err(place: &str, why: impl Into<String>) -> StoreError {
    StoreError::Config {
        place: place.to_owned(),
        why: why.into(),
    }
}

/// The Redis that `setting` (the `--state-store` value) names: a
/// `redis://` / `rediss://` URL, or the path of a YAML file with a
/// `redis:` block as a node file writes it.
///
/// # Errors
/// [`StoreError::Config`] naming the setting, or the file, line and column.
pub fn target(setting: &str) -> Result<RedisTarget, StoreError> {
    // A URL with a password is refused before anything could echo it.
    if setting.contains("://")
        && let Err(e @ TargetError::UrlPassword) = edgestate::target::url_user(setting)
    {
        return Err(config_err("--state-store", e.to_string()));
    }
    if setting.starts_with("redis://") || setting.starts_with("rediss://") {
        let password_env = std::env::var_os(PASSWORD_ENV).map(|_| PASSWORD_ENV.to_owned());
        return RedisTarget::from_parts(
            Some(setting.to_owned()),
            None,
            None,
            None,
            password_env,
            None,
        )
        .map_err(|errors| {
            let why: Vec<String> = errors.iter().map(ToString::to_string).collect();
            config_err("--state-store", why.join("; "))
        });
    }
    if setting.contains("://") {
        return Err(config_err(
            "--state-store",
            "a redis:// or rediss:// URL, or the path of a YAML file with a `redis:` block \
             (Sentinels, a CA file)",
        ));
    }
    target_file(Path::new(setting))
}

/// The `redis:` block of the YAML file at `path`.
fn target_file(path: &Path) -> Result<RedisTarget, StoreError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| config_err(&shown, format!("cannot read it ({})", e.kind())))?;
    let doc = yamlspan::parse(&text)
        .map_err(|e| {
            config_err(
                &format!("{shown}:{}:{}", e.span.line, e.span.column),
                format!("not YAML: {}", e.message),
            )
        })?
        .ok_or_else(|| config_err(&shown, "empty; it needs a `redis:` block"))?;
    let at = |pointer: &str| {
        let span = doc.locate(pointer);
        format!("{shown}:{}:{}", span.line, span.column)
    };
    let json = doc.to_json();
    let Some(block) = json.get("redis") else {
        return Err(config_err(&at(""), "it needs a `redis:` block"));
    };
    if let Some(other) = json
        .as_object()
        .and_then(|o| o.keys().find(|k| *k != "redis"))
    {
        return Err(config_err(
            &at(&format!("/{other}")),
            format!("`{other}` is not read here; only `redis:`"),
        ));
    }
    let raw: RawRedis = serde_json::from_value(block.clone())
        .map_err(|e| config_err(&at("/redis"), format!("`redis`: {e}")))?;
    if let Some(url) = &raw.url
        && let Err(e @ TargetError::UrlPassword) = edgestate::target::url_user(url)
    {
        return Err(config_err(&at("/redis/url"), e.to_string()));
    }
    // Relative files are relative to the file's folder.
    let base = path.parent().unwrap_or(Path::new("."));
    let file = |p: Option<String>| p.map(|p| base.join(p));
    let tls = raw.tls.map(|t| TlsFiles {
        ca_file: file(t.ca_file),
        cert_file: file(t.cert_file),
        key_file: file(t.key_file),
    });
    RedisTarget::from_parts(
        raw.url,
        raw.sentinels,
        raw.master,
        raw.username,
        raw.password_env,
        tls,
    )
    .map_err(|errors| {
        let first = &errors[0];
        let why: Vec<String> = errors.iter().map(ToString::to_string).collect();
        config_err(&at(&format!("/redis{}", first.pointer())), why.join("; "))
    })
}

/// A node file's `redis:` block, as the state store's file holds it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<String>,
    sentinels: Option<Vec<String>>,
    master: Option<String>,
    username: Option<String>,
    password_env: Option<String>,
    tls: Option<RawTls>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
}

/// Commands for the connection's thread, and where the answer goes.
struct Job {
    pipe: redis::Pipeline,
    reply: mpsc::SyncSender<Result<Vec<Value>, String>>,
}

/// The state store in Redis. See the module documentation.
pub struct RedisStore {
    jobs: mpsc::Sender<Job>,
    described: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.described)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The store at `target`; connects on first use (and again after an
    /// error, resolving the master anew).
    ///
    /// # Errors
    /// No thread could be started.
    pub fn new(target: RedisTarget) -> Result<RedisStore, StoreError> {
        let described = edgeredis::describe(&target);
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("state-store".into())
            .spawn(move || worker(&target, &rx))
            .map_err(|e| StoreError::Shared {
                target: described.clone(),
                cause: format!("cannot start its thread: {e}"),
            })?;
        Ok(RedisStore { jobs, described })
    }

    /// Where it is (for messages; never a password).
    #[must_use]
    pub fn describe(&self) -> &str {
        &self.described
    }

    /// Run `pipe`; one answer per command (a MULTI's answers when atomic).
    fn query(&self, pipe: redis::Pipeline) -> Result<Vec<Value>, StoreError> {
        let fail = |cause: String| StoreError::Shared {
            target: self.described.clone(),
            cause,
        };
        let (reply, answer) = mpsc::sync_channel(1);
        self.jobs
            .send(Job { pipe, reply })
            .map_err(|_| fail("its connection thread stopped".into()))?;
        match answer.recv_timeout(2 * TIMEOUT + Duration::from_secs(1)) {
            Ok(r) => r.map_err(fail),
            Err(_) => Err(fail(format!(
                "no answer within {}s",
                (2 * TIMEOUT).as_secs() + 1
            ))),
        }
    }

    fn one(&self, cmd: &redis::Cmd) -> Result<Value, StoreError> {
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone());
        Ok(self.query(pipe)?.into_iter().next().unwrap_or(Value::Nil))
    }

    /// Every key matching `pattern` (SCAN, never KEYS).
    fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let mut cursor = 0u64;
        let mut keys = Vec::new();
        loop {
            let v = self.one(
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000),
            )?;
            let (next, batch): (u64, Vec<String>) =
                redis::from_redis_value(v).map_err(|e| self.bad(pattern, &e))?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    fn bad(&self, key: &str, e: &redis::ParsingError) -> StoreError {
        StoreError::Shared {
            target: self.described.clone(),
            cause: format!("{key}: unexpected value ({e})"),
        }
    }

    /// A string key, at most `cap` + 1 bytes of it (the caller refuses
    /// what is longer than `cap`): a value planted larger never crosses
    /// the wire whole.
    fn string(&self, key: &str, cap: usize) -> Result<Option<String>, StoreError> {
        let v = self
            .one(redis::cmd("EVAL").arg(READ_CAPPED).arg(1).arg(key).arg(cap))
            .map_err(|e| naming(key, e))?;
        let bytes: Option<Vec<u8>> = redis::from_redis_value(v).map_err(|e| self.bad(key, &e))?;
        bytes.map(|b| self.text(key, b, cap)).transpose()
    }

    /// A value read at most `cap` + 1 bytes long, as text: one longer than
    /// `cap` (maybe cut inside a character) stays longer, for the caller
    /// to refuse; one within it must be UTF-8.
    fn text(&self, key: &str, bytes: Vec<u8>, cap: usize) -> Result<String, StoreError> {
        if bytes.len() > cap {
            // Replacement characters never make it shorter.
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        String::from_utf8(bytes).map_err(|_| StoreError::Shared {
            target: self.described.clone(),
            cause: format!("{key}: unexpected value (not UTF-8)"),
        })
    }

    /// [`Self::string`], refused when longer than `cap`.
    fn whole(&self, key: &str, cap: usize) -> Result<Option<String>, StoreError> {
        let text = self.string(key, cap)?;
        if text.as_ref().is_some_and(|t| t.len() > cap) {
            return Err(StoreError::TooLarge {
                path: key.into(),
                cap,
            });
        }
        Ok(text)
    }

    /// A hash, each value at most `cap` + 1 bytes (as [`Self::string`]).
    fn hash(&self, key: &str, cap: usize) -> Result<BTreeMap<String, String>, StoreError> {
        let v = self
            .one(&crate::state::hgetall_capped(key, cap))
            .map_err(|e| naming(key, e))?;
        let raw: BTreeMap<String, Vec<u8>> =
            redis::from_redis_value(v).map_err(|e| self.bad(key, &e))?;
        raw.into_iter()
            .map(|(field, b)| Ok((field, self.text(key, b, cap)?)))
            .collect()
    }
}

/// `e` naming the key it was about (a WRONGTYPE says nothing of which).
fn naming(key: &str, e: StoreError) -> StoreError {
    match e {
        StoreError::Shared { target, cause } => StoreError::Shared {
            target,
            cause: format!("{key}: {cause}"),
        },
        other => other,
    }
}

fn worker(target: &RedisTarget, jobs: &mpsc::Receiver<Job>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let mut slot: Option<redis::aio::MultiplexedConnection> = None;
    while let Ok(job) = jobs.recv() {
        let answer = rt.block_on(async {
            // One retry on a fresh connection rides over a failover or a
            // restart: only when the connection failed or dropped, or a
            // demoted or loading server said so (every
            // write here is idempotent: SET, HSET, DEL, and scripts that
            // write the same again). Never after the server answered an
            // error, nor after no answer in time: the command may still
            // be running there (a large import's script), and a second
            // one would queue behind it.
            let mut last = String::new();
            for _ in 0..2 {
                let run = async {
                    let con = edgeredis::reuse(target, WHO, &mut slot)
                        .await
                        .map_err(|e| (edgeredis::one_line(&e), true))?;
                    job.pipe.query_async::<Vec<Value>>(con).await.map_err(|e| {
                        let retry = e.is_io_error()
                            || e.is_connection_dropped()
                            || e.is_connection_refusal()
                            || matches!(
                                e.kind(),
                                redis::ErrorKind::Server(
                                    redis::ServerErrorKind::ReadOnly
                                        | redis::ServerErrorKind::BusyLoading
                                        | redis::ServerErrorKind::TryAgain
                                        | redis::ServerErrorKind::MasterDown
                                )
                            );
                        (e.to_string(), retry)
                    })
                };
                match tokio::time::timeout(TIMEOUT, run).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err((e, retry))) => {
                        last = e;
                        slot = None;
                        if !retry {
                            break;
                        }
                    }
                    Err(_) => {
                        slot = None;
                        last = format!("no answer within {}s", TIMEOUT.as_secs());
                        break;
                    }
                }
            }
            Err(last)
        });
        let _ = job.reply.send(answer);
    }
}

impl Store for RedisStore {
    fn import(&self, snap: &super::export::Snapshot) -> Result<(), StoreError> {
        // One script: every key's type checked, then every entry written
        // (a script runs whole): all or nothing.
        let mut keys: Vec<String> = Vec::new();
        let mut ops: Vec<String> = Vec::new();
        let mut op = |kind: &str, key: String, args: Vec<&str>| {
            keys.push(key);
            ops.push(kind.to_owned());
            ops.push(keys.len().to_string());
            ops.push(args.len().to_string());
            ops.extend(args.into_iter().map(str::to_owned));
        };
        for (node, secrets) in &snap.secrets {
            check_node(node)?;
            let args = secrets
                .iter()
                .flat_map(|(n, v)| [n.as_str(), v.as_str()])
                .collect();
            op("H", secrets_key(node), args);
        }
        for (name, pem) in &snap.certificates {
            op(
                "R",
                cert_key(name),
                vec!["chain", pem.chain.as_str(), "key", pem.key.as_str()],
            );
        }
        for (value, key) in [
            (&snap.acme_account, account_key()),
            (&snap.last_good, last_good_key()),
            (&snap.renewal, renewal_key()),
            (&snap.rollouts, rollout_key()),
        ] {
            if let Some(v) = value {
                op("S", key, vec![v.as_str()]);
            }
        }
        for (node, entries) in &snap.outbox {
            check_node(node)?;
            let args = entries
                .iter()
                .flat_map(|(n, t)| [n.as_str(), t.as_str()])
                .collect();
            op("H", outbox_key(node), args);
        }
        if keys.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(IMPORT)
            .arg(keys.len())
            .arg(&keys)
            .arg(&ops);
        let v = self.query(pipe)?.into_iter().next().unwrap_or(Value::Nil);
        match v {
            Value::ServerError(e) => Err(StoreError::Shared {
                target: self.described.clone(),
                cause: format!("the import: {e}"),
            }),
            _ => Ok(()),
        }
    }
    fn secret(&self, node: &str, name: &str) -> Result<Option<String>, StoreError> {
        check_node(node)?;
        if !valid_secret_name(name) {
            return Err(StoreError::SecretName(name.to_owned()));
        }
        Ok(self.secrets(node)?.remove(name))
    }

    fn secrets(&self, node: &str) -> Result<BTreeMap<String, String>, StoreError> {
        check_node(node)?;
        let key = secrets_key(node);
        let mut all = self.hash(&key, MAX_SECRET_BYTES)?;
        all.retain(|k, _| valid_secret_name(k));
        for (name, value) in &all {
            if value.len() > MAX_SECRET_BYTES {
                return Err(StoreError::TooLarge {
                    path: format!("{key} {name}").into(),
                    cap: MAX_SECRET_BYTES,
                });
            }
            stored_secret(&key, name, value)?;
        }
        Ok(all)
    }

    fn set_secret(&self, node: &str, name: &str, value: &str) -> Result<(), StoreError> {
        check_node(node)?;
        if !valid_secret_name(name) {
            return Err(StoreError::SecretName(name.to_owned()));
        }
        if !valid_secret_value(value) {
            return Err(StoreError::SecretValue);
        }
        self.one(
            redis::cmd("HSET")
                .arg(secrets_key(node))
                .arg(name)
                .arg(value),
        )?;
        Ok(())
    }

    fn remove_secret(&self, node: &str, name: &str) -> Result<bool, StoreError> {
        check_node(node)?;
        if !valid_secret_name(name) {
            return Err(StoreError::SecretName(name.to_owned()));
        }
        let key = secrets_key(node);
        let v = self.one(redis::cmd("HDEL").arg(&key).arg(name))?;
        let n: i64 = redis::from_redis_value(v).map_err(|e| self.bad(&key, &e))?;
        Ok(n > 0)
    }

    fn secret_names(&self) -> Result<BTreeMap<String, Vec<String>>, StoreError> {
        let mut out = BTreeMap::new();
        for key in self.scan(&format!("{PREFIX}secrets:*"))? {
            let Some(node) = key.strip_prefix(&format!("{PREFIX}secrets:")) else {
                continue;
            };
            if !valid_node(node) {
                continue;
            }
            let v = self.one(redis::cmd("HKEYS").arg(&key))?;
            let mut names: Vec<String> =
                redis::from_redis_value(v).map_err(|e| self.bad(&key, &e))?;
            names.retain(|n| valid_secret_name(n));
            names.sort();
            if !names.is_empty() {
                out.insert(node.to_owned(), names);
            }
        }
        Ok(out)
    }

    fn last_good(&self) -> Result<Option<String>, StoreError> {
        self.whole(&last_good_key(), MAX_SHORT_BYTES)?
            .map(|text| kept_commit(&text))
            .transpose()
    }

    fn set_last_good(&self, commit: &str) -> Result<(), StoreError> {
        let commit = kept_commit(commit)?;
        self.one(redis::cmd("SET").arg(last_good_key()).arg(commit))?;
        Ok(())
    }

    fn certificate(&self, name: &str) -> Result<Option<StoredCert>, StoreError> {
        if !valid_cert_name(name) {
            return Err(StoreError::CertName(name.to_owned()));
        }
        let key = cert_key(name);
        let mut h = self.hash(&key, MAX_CERT_BYTES)?;
        match (h.remove("chain"), h.remove("key")) {
            (Some(chain), Some(key_pem)) => {
                if chain.len() > MAX_CERT_BYTES || key_pem.len() > MAX_CERT_BYTES {
                    return Err(StoreError::CertTooLarge(key.into()));
                }
                Ok(Some(StoredCert {
                    chain,
                    key: key_pem,
                }))
            }
            (None, None) => Ok(None),
            // Half a pair (written by hand, or by something else): an
            // error naming it, never "not there" — an export would leave
            // it out, and `certs list` would send the operator to import.
            _ => Err(StoreError::Shared {
                target: self.described.clone(),
                cause: format!("{key}: a certificate without its chain or its key"),
            }),
        }
    }

    fn set_certificate(&self, name: &str, cert: &StoredCert) -> Result<(), StoreError> {
        if !valid_cert_name(name) {
            return Err(StoreError::CertName(name.to_owned()));
        }
        let key = cert_key(name);
        if cert.chain.len() > MAX_CERT_BYTES || cert.key.len() > MAX_CERT_BYTES {
            return Err(StoreError::CertTooLarge(key.into()));
        }
        // Replaced whole: a reader sees the old pair or the new one.
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(&key)
            .ignore()
            .cmd("HSET")
            .arg(&key)
            .arg("chain")
            .arg(&cert.chain)
            .arg("key")
            .arg(&cert.key)
            .ignore();
        self.query(pipe)?;
        Ok(())
    }

    fn certificate_names(&self) -> Result<Vec<String>, StoreError> {
        let prefix = format!("{PREFIX}cert:");
        Ok(self
            .scan(&format!("{prefix}*"))?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .filter(|n| valid_cert_name(n))
            .collect())
    }

    fn acme_account(&self) -> Result<Option<String>, StoreError> {
        self.whole(&account_key(), MAX_SECRET_BYTES)
    }

    fn set_acme_account(&self, json: &str) -> Result<(), StoreError> {
        self.one(redis::cmd("SET").arg(account_key()).arg(json))?;
        Ok(())
    }

    fn outbox(&self, node: &str) -> Result<Vec<(String, String)>, StoreError> {
        check_node(node)?;
        Ok(self
            .hash(&outbox_key(node), MAX_OUTBOX_ENTRY_BYTES)?
            .into_iter()
            .filter(|(name, _)| valid_outbox_name(name))
            .map(|(name, mut text)| {
                if text.len() > MAX_OUTBOX_ENTRY_BYTES {
                    let mut cut = MAX_OUTBOX_ENTRY_BYTES;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                }
                (name, text)
            })
            .collect())
    }

    fn set_outbox(&self, node: &str, name: &str, text: &str) -> Result<(), StoreError> {
        check_node(node)?;
        check_entry(name)?;
        self.one(redis::cmd("HSET").arg(outbox_key(node)).arg(name).arg(text))?;
        Ok(())
    }

    fn remove_outbox(&self, node: &str, name: &str) -> Result<(), StoreError> {
        check_node(node)?;
        check_entry(name)?;
        self.one(redis::cmd("HDEL").arg(outbox_key(node)).arg(name))?;
        Ok(())
    }

    fn renewal_state(&self) -> Result<Option<String>, StoreError> {
        let key = renewal_key();
        let text = self.string(&key, MAX_RENEWAL_STATE_BYTES)?;
        if text
            .as_ref()
            .is_some_and(|t| t.len() > MAX_RENEWAL_STATE_BYTES)
        {
            return Err(StoreError::RenewalTooLarge(key));
        }
        Ok(text)
    }

    fn set_renewal_state(&self, json: &str) -> Result<(), StoreError> {
        if json.len() > MAX_RENEWAL_STATE_BYTES {
            return Err(StoreError::RenewalTooLarge(renewal_key()));
        }
        self.one(redis::cmd("SET").arg(renewal_key()).arg(json))?;
        Ok(())
    }

    fn rollout_state(&self) -> Result<Option<String>, StoreError> {
        let key = rollout_key();
        let text = self.string(&key, MAX_ROLLOUT_STATE_BYTES)?;
        if text
            .as_ref()
            .is_some_and(|t| t.len() > MAX_ROLLOUT_STATE_BYTES)
        {
            return Err(StoreError::RolloutTooLarge(key));
        }
        Ok(text)
    }

    fn set_rollout_state(&self, json: &str) -> Result<(), StoreError> {
        if json.len() > MAX_ROLLOUT_STATE_BYTES {
            return Err(StoreError::RolloutTooLarge(rollout_key()));
        }
        self.one(redis::cmd("SET").arg(rollout_key()).arg(json))?;
        Ok(())
    }

    fn replace_rollout_state(&self, seen: Option<&str>, json: &str) -> Result<bool, StoreError> {
        if json.len() > MAX_ROLLOUT_STATE_BYTES {
            return Err(StoreError::RolloutTooLarge(rollout_key()));
        }
        let key = rollout_key();
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(ROLLOUT_REPLACE)
            .arg(1)
            .arg(&key)
            .arg(if seen.is_some() { "1" } else { "0" })
            .arg(seen.unwrap_or(""))
            .arg(json);
        let v = self.query(pipe)?.into_iter().next().unwrap_or(Value::Nil);
        let kept: i64 = redis::from_redis_value(v).map_err(|e| self.bad(&key, &e))?;
        Ok(kept == 1)
    }

    fn take_lease(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        super::lease::check(name, Some(token))?;
        let key = lease_key(name);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        // Retried once on a fresh connection by the worker: harmless, the
        // script is idempotent for our token.
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(LEASE_TAKE)
            .arg(1)
            .arg(&key)
            .arg(token)
            .arg(ttl_ms);
        let v = self.query(pipe)?.into_iter().next().unwrap_or(Value::Nil);
        let took: i64 = redis::from_redis_value(v).map_err(|e| self.bad(&key, &e))?;
        Ok(took == 1)
    }

    fn release_lease(&self, name: &str, token: &str) -> Result<(), StoreError> {
        super::lease::check(name, Some(token))?;
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(LEASE_RELEASE)
            .arg(1)
            .arg(lease_key(name))
            .arg(token);
        self.query(pipe)?;
        Ok(())
    }

    fn lease_holder(&self, name: &str) -> Result<Option<String>, StoreError> {
        super::lease::check(name, None)?;
        self.whole(&lease_key(name), MAX_SHORT_BYTES)
    }

    fn outbox_nodes(&self) -> Result<Vec<String>, StoreError> {
        let prefix = format!("{PREFIX}outbox:");
        Ok(self
            .scan(&format!("{prefix}*"))?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .filter(|n| valid_node(n))
            .collect())
    }
}

fn check_entry(name: &str) -> Result<(), StoreError> {
    if valid_outbox_name(name) {
        Ok(())
    } else {
        Err(StoreError::NodeName(format!("outbox entry {name}")))
    }
}

fn check_node(node: &str) -> Result<(), StoreError> {
    if valid_node(node) {
        Ok(())
    } else {
        Err(StoreError::NodeName(node.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_urls_or_a_node_style_block_and_mistakes_are_located() {
        let t = target("redis://store@127.0.0.1:6390/2").unwrap();
        assert_eq!(t.username(), Some("store"));
        let e = target("redis://store:hunter2@127.0.0.1:6390").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert!(matches!(e, StoreError::Config { .. }));
        assert!(matches!(target("http://x"), Err(StoreError::Config { .. })));

        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("store.yaml");
        std::fs::write(
            &file,
            "redis:\n  sentinels: [\"10.0.0.1:26379\"]\n  master: state\n  username: ctl\n  \
             password_env: PW\n  tls: {ca_file: ca.pem}\n",
        )
        .unwrap();
        let t = target(file.to_str().unwrap()).unwrap();
        assert_eq!(t.password_env(), Some("PW"));
        assert_eq!(
            t.tls().unwrap().ca_file.as_deref(),
            Some(d.path().join("ca.pem").as_path())
        );
        for (text, at) in [
            (
                "redis:\n  url: redis://h:1\n  sentinels: [\"a:1\"]\n",
                "store.yaml:2:",
            ),
            (
                "redis:\n  sentinels: [nope]\n  master: m\n",
                "store.yaml:2:",
            ),
            ("redis:\n  url: redis://a:p4ss@h:1\n", "store.yaml:2:"),
            ("redis:\n  url: redis://h:1\n  colour: red\n", "store.yaml:"),
            ("other: 1\n", "store.yaml:1:"),
            ("redis: [\n", "store.yaml:"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = target(file.to_str().unwrap()).unwrap_err().to_string();
            assert!(e.contains(at), "{text}: {e}");
            assert!(!e.contains("p4ss"), "{e}");
        }
        let e = target(d.path().join("missing.yaml").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("missing.yaml"), "{e}");
    }
}
