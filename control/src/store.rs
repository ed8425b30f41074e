//! The control host's state: what must never be in git. One interface,
//! [`Store`], for every piece of it — node secrets, the last good signed
//! commit, certificates, the ACME account, the purge outbox — so a shared
//! backend ([`RedisStore`], a Redis the control hosts reach) replaces the
//! directory for two control hosts without touching the callers. [`open`]
//! is where the backend is chosen (`--state-store`, [`STORE_ENV`]).
//!
//! [`DirStore`] keeps it in the state directory (`--state-dir`, env
//! `EDGEFORM_STATE_DIR`, default `/var/lib/edgeform`): folders `0700`,
//! files `0600`, written atomically (a temporary file renamed), read
//! without following links. A directory that others can read or write is
//! refused, never used.
//!
//! Layout: `<state>/secrets/<node>/<NAME>` (one file per secret, the value
//! as written); `<state>/last-good-commit` (the last commit `reconcile
//! --require-signed-by` verified, a hex commit id);
//! `<state>/certs/<NAME>/chain.pem` and `key.pem` (a certificate as
//! `edgeform certs import` checked it; the folder is replaced as a whole);
//! `<state>/acme/account.json`; `<state>/acme/renewal.json` (the
//! certificates job's renewal state); `<state>/outbox/<node>/<sequence>-<id>`;
//! `<state>/leases/<name>` ([`lease`]: the reconcile daemons' lease).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub mod export;
pub mod lease;
pub mod redis;

pub use redis::RedisStore;

/// The variable that names a shared store (as `--state-store`).
pub const STORE_ENV: &str = "EDGEFORM_STATE_STORE";

/// The shared store this process uses, when one is set: chosen once by
/// [`configure`] (the CLI's `--state-store`), else from [`STORE_ENV`].
static SHARED: OnceLock<Option<Arc<RedisStore>>> = OnceLock::new();
/// The `--state-store` value given to [`configure`].
static SETTING: OnceLock<Option<String>> = OnceLock::new();

/// Use the shared store `setting` names (`--state-store`) in this process
/// instead of the state directory; `None` leaves the choice to
/// [`STORE_ENV`]. Only the first call counts.
pub fn configure(setting: Option<&str>) {
    let _ = SETTING.set(setting.map(str::to_owned));
}

/// The shared store's setting: `--state-store`, else [`STORE_ENV`] when
/// set and not empty.
fn setting() -> Option<String> {
    if let Some(Some(s)) = SETTING.get() {
        return Some(s.clone());
    }
    std::env::var(STORE_ENV).ok().filter(|s| !s.is_empty())
}

fn shared() -> Result<Option<Arc<RedisStore>>, StoreError> {
    if let Some(s) = SHARED.get() {
        return Ok(s.clone());
    }
    let made = match setting() {
        None => None,
        Some(s) => Some(Arc::new(RedisStore::new(redis::target(&s)?)?)),
    };
    Ok(SHARED.get_or_init(|| made).clone())
}

/// The shared store, when `--state-store` / [`STORE_ENV`] names one
/// (for what only it can answer, e.g. another host's lease).
///
/// # Errors
/// An unusable setting.
pub fn shared_store() -> Result<Option<Arc<RedisStore>>, StoreError> {
    shared()
}

/// A store shared by handle (the process's one [`RedisStore`]).
impl<T: Store + ?Sized> Store for Arc<T> {
    fn secret(&self, node: &str, name: &str) -> Result<Option<String>, StoreError> {
        (**self).secret(node, name)
    }
    fn secrets(&self, node: &str) -> Result<BTreeMap<String, String>, StoreError> {
        (**self).secrets(node)
    }
    fn set_secret(&self, node: &str, name: &str, value: &str) -> Result<(), StoreError> {
        (**self).set_secret(node, name, value)
    }
    fn remove_secret(&self, node: &str, name: &str) -> Result<bool, StoreError> {
        (**self).remove_secret(node, name)
    }
    fn secret_names(&self) -> Result<BTreeMap<String, Vec<String>>, StoreError> {
        (**self).secret_names()
    }
    fn last_good(&self) -> Result<Option<String>, StoreError> {
        (**self).last_good()
    }
    fn set_last_good(&self, commit: &str) -> Result<(), StoreError> {
        (**self).set_last_good(commit)
    }
    fn certificate(&self, name: &str) -> Result<Option<StoredCert>, StoreError> {
        (**self).certificate(name)
    }
    fn set_certificate(&self, name: &str, cert: &StoredCert) -> Result<(), StoreError> {
        (**self).set_certificate(name, cert)
    }
    fn certificate_names(&self) -> Result<Vec<String>, StoreError> {
        (**self).certificate_names()
    }
    fn acme_account(&self) -> Result<Option<String>, StoreError> {
        (**self).acme_account()
    }
    fn set_acme_account(&self, json: &str) -> Result<(), StoreError> {
        (**self).set_acme_account(json)
    }
    fn outbox(&self, node: &str) -> Result<Vec<(String, String)>, StoreError> {
        (**self).outbox(node)
    }
    fn set_outbox(&self, node: &str, name: &str, text: &str) -> Result<(), StoreError> {
        (**self).set_outbox(node, name, text)
    }
    fn remove_outbox(&self, node: &str, name: &str) -> Result<(), StoreError> {
        (**self).remove_outbox(node, name)
    }
    fn outbox_nodes(&self) -> Result<Vec<String>, StoreError> {
        (**self).outbox_nodes()
    }
    fn renewal_state(&self) -> Result<Option<String>, StoreError> {
        (**self).renewal_state()
    }
    fn set_renewal_state(&self, json: &str) -> Result<(), StoreError> {
        (**self).set_renewal_state(json)
    }
    fn rollout_state(&self) -> Result<Option<String>, StoreError> {
        (**self).rollout_state()
    }
    fn set_rollout_state(&self, json: &str) -> Result<(), StoreError> {
        (**self).set_rollout_state(json)
    }
    fn replace_rollout_state(&self, seen: Option<&str>, json: &str) -> Result<bool, StoreError> {
        (**self).replace_rollout_state(seen, json)
    }
    fn import(&self, snap: &export::Snapshot) -> Result<(), StoreError> {
        (**self).import(snap)
    }
    fn take_lease(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        (**self).take_lease(name, token, ttl)
    }
    fn release_lease(&self, name: &str, token: &str) -> Result<(), StoreError> {
        (**self).release_lease(name, token)
    }
    fn lease_holder(&self, name: &str) -> Result<Option<String>, StoreError> {
        (**self).lease_holder(name)
    }
}

/// The state store: the shared one when `--state-store` /
/// [`STORE_ENV`] names one, else the state directory at `state_dir`
/// (created 0700). Every command that reads or writes secrets,
/// certificates, the ACME account, the renewal state, the last good
/// commit, the purge outbox or a lease opens it here, so the backend is
/// chosen in one place.
///
/// # Errors
/// An unusable setting, or [`DirStore::open`]'s.
pub fn open(state_dir: &Path) -> Result<Box<dyn Store>, StoreError> {
    match shared()? {
        Some(s) => Ok(Box::new(s)),
        None => Ok(Box::new(DirStore::open(state_dir)?)),
    }
}

/// Like [`open`], but a state directory that does not exist is `None`
/// (never created: `check` on a pull request's CI must not make one). A
/// shared store always exists.
///
/// # Errors
/// An unusable setting, or [`DirStore::open_existing`]'s.
pub fn open_existing(state_dir: &Path) -> Result<Option<Box<dyn Store>>, StoreError> {
    match shared()? {
        Some(s) => Ok(Some(Box::new(s))),
        None => Ok(DirStore::open_existing(state_dir)?.map(|d| Box::new(d) as Box<dyn Store>)),
    }
}

/// Where the store is, for messages: the shared store's target, else the
/// state directory.
#[must_use]
pub fn describe(state_dir: &Path) -> String {
    match shared() {
        Ok(Some(s)) => format!("the state store {}", s.describe()),
        _ => format!("the state directory {}", state_dir.display()),
    }
}

/// Where `node`'s purge outbox is, for messages: its folder in the
/// state directory, or its key in the shared store.
#[must_use]
pub fn outbox_place(state_dir: &Path, node: &str) -> String {
    match shared() {
        Ok(Some(s)) => format!("{} ({}outbox:{node})", s.describe(), redis::PREFIX),
        _ => state_dir.join(OUTBOX).join(node).display().to_string(),
    }
}

/// The default state directory.
pub const DEFAULT_DIR: &str = "/var/lib/edgeform";
/// The variable that names another one (as `--state-dir`).
pub const DIR_ENV: &str = "EDGEFORM_STATE_DIR";
/// The longest secret value kept.
pub const MAX_SECRET_BYTES: usize = 4096;
/// The largest certificate chain or key file kept.
pub const MAX_CERT_BYTES: usize = 64 * 1024;

/// Why the state cannot be read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// A folder or file others may read or write (or not ours), or a link.
    Unsafe { path: PathBuf, why: String },
    /// The file system said no.
    Io { path: PathBuf, cause: String },
    /// A node name that is not a node's name.
    NodeName(String),
    /// A last good commit that is not a hex commit id.
    Commit(String),
    /// A secret name that is not an environment variable name
    /// (`[A-Z][A-Z0-9_]*`, at most 64).
    SecretName(String),
    /// Empty, too long, or with a control character (a line break).
    SecretValue,
    /// A stored secret that is no secret's value (written into the store
    /// by something else): never used. Where, and the secret's name.
    StoredSecret { place: String, name: String },
    /// A certificate name that is not one (`[a-z0-9][a-z0-9._-]*`, at
    /// most 64).
    CertName(String),
    /// A chain or key file over [`MAX_CERT_BYTES`].
    CertTooLarge(PathBuf),
    /// The shared store (`--state-store`) is not usable as written:
    /// `place` is the flag, or the file, line and column.
    Config { place: String, why: String },
    /// The shared store did not answer or refused (`target` says which,
    /// never with a password).
    Shared { target: String, cause: String },
    /// A lease name or token that is not one (`why`).
    Lease(String),
    /// The renewal state is larger than [`MAX_RENEWAL_STATE_BYTES`].
    RenewalTooLarge(String),
    /// The rollouts' book is larger than [`MAX_ROLLOUT_STATE_BYTES`].
    RolloutTooLarge(String),
    /// A secret or the ACME account file is larger than `cap` bytes (read
    /// whole or not at all: never cut).
    TooLarge { path: PathBuf, cap: usize },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsafe { path, why } => write!(
                f,
                "state directory: {} is not safe to use ({why}); it must be ours, 0700 (files 0600), and no link",
                path.display()
            ),
            Self::Io { path, cause } => write!(f, "state directory: {}: {cause}", path.display()),
            Self::NodeName(n) => write!(
                f,
                "`{n}` is not a node name (lowercase letters, digits, `-`)"
            ),
            Self::SecretName(n) => write!(
                f,
                "`{n}` is not a secret name: an environment variable name, `[A-Z][A-Z0-9_]*` (at most 64)"
            ),
            Self::Commit(c) => write!(
                f,
                "`{}` is not a commit id (40 or 64 hex digits)",
                edgestate::untrusted::escape(c)
            ),
            Self::SecretValue => write!(
                f,
                "a secret is one line of at most {MAX_SECRET_BYTES} bytes, not empty, without control characters"
            ),
            Self::StoredSecret { place, name } => write!(
                f,
                "state store: {place}: the secret {name} is not one line of at most {MAX_SECRET_BYTES} bytes without control characters (written there by something else than `edgeform secrets set`?); not used"
            ),
            Self::CertName(n) => write!(
                f,
                "`{}` is not a certificate name (`[a-z0-9][a-z0-9._-]*`, at most 64)",
                edgestate::untrusted::escape(n)
            ),
            Self::TooLarge { path, cap } => write!(
                f,
                "state store: {} is larger than {cap} bytes",
                path.display()
            ),
            Self::CertTooLarge(p) => write!(
                f,
                "state store: {} is larger than {MAX_CERT_BYTES} bytes",
                p.display()
            ),
            Self::Config { place, why } => write!(f, "state store: {place}: {why}"),
            Self::Shared { target, cause } => write!(f, "state store {target}: {cause}"),
            Self::Lease(why) => write!(f, "state store: {why}"),
            Self::RenewalTooLarge(place) => write!(
                f,
                "state store: {place} (the renewal state) is larger than {MAX_RENEWAL_STATE_BYTES} bytes"
            ),
            Self::RolloutTooLarge(place) => write!(
                f,
                "state store: {place} (the rollouts' book) is larger than {MAX_ROLLOUT_STATE_BYTES} bytes"
            ),
        }
    }
}

impl std::error::Error for StoreError {}

/// What the control host keeps outside git. Implementations: the state
/// directory ([`DirStore`]) and the shared store ([`RedisStore`]).
pub trait Store: Send + Sync {
    /// `node`'s secret `name`, if set.
    ///
    /// # Errors
    /// The store cannot be read, or the names are invalid.
    fn secret(&self, node: &str, name: &str) -> Result<Option<String>, StoreError>;

    /// Every secret of `node`, by name.
    ///
    /// # Errors
    /// The store cannot be read.
    fn secrets(&self, node: &str) -> Result<BTreeMap<String, String>, StoreError>;

    /// Set `node`'s secret `name` to `value`.
    ///
    /// # Errors
    /// Invalid names or value, or the store cannot be written.
    fn set_secret(&self, node: &str, name: &str, value: &str) -> Result<(), StoreError>;

    /// Remove it; whether it was there.
    ///
    /// # Errors
    /// The store cannot be written.
    fn remove_secret(&self, node: &str, name: &str) -> Result<bool, StoreError>;

    /// The names of every node's secrets (never the values).
    ///
    /// # Errors
    /// The store cannot be read.
    fn secret_names(&self) -> Result<BTreeMap<String, Vec<String>>, StoreError>;

    /// The last commit `reconcile --require-signed-by` verified (signed,
    /// through a signed history), if any: where the next commit's history
    /// is verified from, across restarts and `--once` runs.
    ///
    /// # Errors
    /// The store cannot be read, or holds something else than a commit id.
    fn last_good(&self) -> Result<Option<String>, StoreError>;

    /// Remember `commit` as the last good one.
    ///
    /// # Errors
    /// Not a commit id, or the store cannot be written.
    fn set_last_good(&self, commit: &str) -> Result<(), StoreError>;

    /// The certificate `name` (chain and key, PEM, as imported), if any.
    ///
    /// # Errors
    /// An invalid name, or the store cannot be read.
    fn certificate(&self, name: &str) -> Result<Option<StoredCert>, StoreError>;

    /// Keep `cert` as `name`, replacing any certificate of that name as a
    /// whole. The caller has checked it (`control::certs::import`).
    ///
    /// # Errors
    /// An invalid name, or the store cannot be written.
    fn set_certificate(&self, name: &str, cert: &StoredCert) -> Result<(), StoreError>;

    /// The names of the certificates kept, sorted.
    ///
    /// # Errors
    /// The store cannot be read.
    fn certificate_names(&self) -> Result<Vec<String>, StoreError>;

    /// The ACME account's credentials (JSON, as the ACME client wrote
    /// them), if an account was made.
    ///
    /// # Errors
    /// The store cannot be read.
    fn acme_account(&self) -> Result<Option<String>, StoreError>;

    /// Keep the ACME account's credentials (`acme/account.json`, 0600).
    ///
    /// # Errors
    /// The store cannot be written.
    fn set_acme_account(&self, json: &str) -> Result<(), StoreError>;

    /// `node`'s purge outbox (`crate::outbox`): its entries as (name,
    /// text), in name order (the names sort in the order kept). Text past
    /// [`MAX_OUTBOX_ENTRY_BYTES`] is cut there (and then does not parse).
    ///
    /// # Errors
    /// A bad node name, or the store cannot be read.
    fn outbox(&self, node: &str) -> Result<Vec<(String, String)>, StoreError>;

    /// Keep `text` as `node`'s outbox entry `name`, replacing one of that
    /// name.
    ///
    /// # Errors
    /// A bad node or entry name, or the store cannot be written.
    fn set_outbox(&self, node: &str, name: &str, text: &str) -> Result<(), StoreError>;

    /// Remove `node`'s outbox entry `name` (already gone is no error).
    ///
    /// # Errors
    /// A bad node or entry name, or the store cannot be written.
    fn remove_outbox(&self, node: &str, name: &str) -> Result<(), StoreError>;

    /// The nodes whose outbox may hold entries.
    ///
    /// # Errors
    /// The store cannot be read.
    fn outbox_nodes(&self) -> Result<Vec<String>, StoreError>;

    /// The certificates job's renewal state (JSON, `crate::renew::State`),
    /// if kept: shared, so a failure's backoff holds on either host.
    ///
    /// # Errors
    /// The store cannot be read, or it is over [`MAX_RENEWAL_STATE_BYTES`].
    fn renewal_state(&self) -> Result<Option<String>, StoreError>;

    /// Keep the renewal state (replaced whole).
    ///
    /// # Errors
    /// Over [`MAX_RENEWAL_STATE_BYTES`], or the store cannot be written.
    fn set_renewal_state(&self, json: &str) -> Result<(), StoreError>;

    /// The rollouts' book (JSON, `crate::rollout::Book`: the live or last
    /// rollout and the aborted commits), if kept: shared, so every
    /// reconciler on the store moves the same rollout.
    ///
    /// # Errors
    /// The store cannot be read, or it is over [`MAX_ROLLOUT_STATE_BYTES`].
    fn rollout_state(&self) -> Result<Option<String>, StoreError>;

    /// Keep the rollouts' book (replaced whole).
    ///
    /// # Errors
    /// Over [`MAX_ROLLOUT_STATE_BYTES`], or the store cannot be written.
    fn set_rollout_state(&self, json: &str) -> Result<(), StoreError>;

    /// Keep the rollouts' book `json` only if the store still holds `seen`
    /// (what the caller read; `None`: no book), atomically: whether it was
    /// kept. `false` means another writer (a command, another host)
    /// changed the book since it was read, and nothing was written: the
    /// caller reads it again. Already holding `json` counts as kept (a
    /// retried request).
    ///
    /// # Errors
    /// Over [`MAX_ROLLOUT_STATE_BYTES`], or the store cannot be read or
    /// written.
    fn replace_rollout_state(&self, seen: Option<&str>, json: &str) -> Result<bool, StoreError>;

    /// Write every entry of `snap` (checked by the caller,
    /// [`export::Snapshot::check`]); entries it does not hold are left as
    /// they are. The shared store writes all or nothing (one script: a
    /// key of another type refuses the whole import); the state directory
    /// writes entry by entry.
    ///
    /// # Errors
    /// The store cannot be written.
    fn import(&self, snap: &export::Snapshot) -> Result<(), StoreError> {
        export::import_one_by_one(self, snap)
    }

    /// Take the lease `name` for `token` for `ttl` when it is free (or
    /// ran out), or renew it for `ttl` when `token` holds it; whether
    /// `token` holds it now. Atomic: two callers never both get it
    /// ([`lease`]).
    ///
    /// # Errors
    /// A bad name or token ([`StoreError::Lease`]), or the store cannot be
    /// written.
    fn take_lease(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError>;

    /// Give the lease up when `token` holds it (else nothing).
    ///
    /// # Errors
    /// A bad name or token, or the store cannot be written.
    fn release_lease(&self, name: &str, token: &str) -> Result<(), StoreError>;

    /// Who holds the lease `name` now (its token), none when it is free or
    /// ran out.
    ///
    /// # Errors
    /// A bad name, or the store cannot be read.
    fn lease_holder(&self, name: &str) -> Result<Option<String>, StoreError>;
}

/// A hash's fields and values as `HGETALL` gives them, each value cut one
/// byte past a cap on the server (`lua/hash_capped.lua`).
pub(crate) const HASH_CAPPED: &str = include_str!("lua/hash_capped.lua");

/// The largest renewal state kept.
pub const MAX_RENEWAL_STATE_BYTES: usize = 4 << 20;
/// The largest rollouts' book kept (`rollout.json`).
pub const MAX_ROLLOUT_STATE_BYTES: usize = 4 << 20;
/// The rollouts' book in the state directory.
pub const ROLLOUT_FILE: &str = "rollout.json";

/// The largest purge outbox entry read back: a job is at most
/// `edgestate::purge::MAX_JOB_BYTES`, kept as a JSON string in the entry,
/// where each `"` and `\` of it is escaped again (at most twice its
/// length), plus the envelope. Every job `purge` builds fits.
pub const MAX_OUTBOX_ENTRY_BYTES: usize = 2 * edgestate::purge::MAX_JOB_BYTES + 4096;

/// Whether `name` can name an outbox entry (`<sequence>-<job id>`).
#[must_use]
pub fn valid_outbox_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A certificate as kept: the chain (leaf first) and its private key,
/// PEM. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCert {
    pub chain: String,
    pub key: String,
}

impl fmt::Debug for StoredCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCert")
            .field("chain_bytes", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// The ACME account's folder and file, in the state directory.
const ACME_DIR: &str = "acme";
const ACME_ACCOUNT: &str = "account.json";
/// The certificates job's renewal state, in the ACME folder.
pub const RENEWAL_FILE: &str = "renewal.json";

/// The certificates' folder, in the state directory.
const CERTS: &str = "certs";
/// A certificate's chain file.
const CHAIN_FILE: &str = "chain.pem";
/// A certificate's key file.
const KEY_FILE: &str = "key.pem";

/// A last good commit as kept or given (`text`, surrounding whitespace
/// ignored), checked and in lowercase.
///
/// # Errors
/// Not a full commit id.
pub fn kept_commit(text: &str) -> Result<String, StoreError> {
    let commit = text.trim();
    if !valid_commit(commit) {
        return Err(StoreError::Commit(commit.to_owned()));
    }
    Ok(commit.to_ascii_lowercase())
}

/// Whether `commit` is a full hex commit id (SHA-1 or SHA-256).
#[must_use]
pub fn valid_commit(commit: &str) -> bool {
    matches!(commit.len(), 40 | 64) && commit.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The file of the last good commit, in the state directory.
const LAST_GOOD: &str = "last-good-commit";

/// Whether `name` can be a node's name (as `nodes/*.yaml` allow).
#[must_use]
pub fn valid_node(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

/// Whether `name` can be a secret's name: an environment variable name.
#[must_use]
pub fn valid_secret_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_uppercase()
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

/// Whether `value` can be a secret's value.
#[must_use]
pub fn valid_secret_value(value: &str) -> bool {
    !value.is_empty() && value.len() <= MAX_SECRET_BYTES && !value.chars().any(char::is_control)
}

/// A secret read from a store (`place`: where): refused unless
/// [`valid_secret_value`], so a line break planted in it never reaches a
/// rendered file or a command line.
pub(crate) fn stored_secret(place: &str, name: &str, value: &str) -> Result<(), StoreError> {
    if valid_secret_value(value) {
        return Ok(());
    }
    Err(StoreError::StoredSecret {
        place: place.to_owned(),
        name: name.to_owned(),
    })
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct DirStore {
    root: PathBuf,
}

fn io(path: &Path, e: &std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_owned(),
        cause: e
            .to_string()
            .split(" (os error")
            .next()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// The current user's id (from `/proc/self/status`).
fn my_uid() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

impl DirStore {
    /// The state directory at `root`, created (`0700`) when missing.
    ///
    /// # Errors
    /// It exists and is a link, not a folder, not ours, or open to others;
    /// it cannot be created.
    pub fn open(root: &Path) -> Result<DirStore, StoreError> {
        let store = DirStore {
            root: root.to_owned(),
        };
        store.folder(root)?;
        Ok(store)
    }

    /// Where it is.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Make sure `dir` is a safe folder: created `0700` when missing.
    pub(crate) fn folder(&self, dir: &Path) -> Result<(), StoreError> {
        // Every folder from the root down is checked, not only the last:
        // `secrets` planted as a link must not lead `secrets/<node>` out.
        if let Some(parent) = dir.parent()
            && dir != self.root
        {
            self.folder(parent)?;
        }
        match std::fs::symlink_metadata(dir) {
            Ok(m) => check_safe(dir, &m, true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match std::fs::DirBuilder::new()
                    .recursive(dir == self.root)
                    .mode(0o700)
                    .create(dir)
                {
                    // Another command made it meanwhile: check it instead.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let m = std::fs::symlink_metadata(dir).map_err(|e| io(dir, &e))?;
                        return check_safe(dir, &m, true);
                    }
                    r => r.map_err(|e| io(dir, &e))?,
                }
                // The umask may have taken bits away, never added any; set
                // exactly 0700.
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| io(dir, &e))
            }
            Err(e) => Err(io(dir, &e)),
        }
    }

    /// The certificates' folder held with a `flock` (`exclusive` to
    /// replace a pair, shared to read one) until the file is dropped;
    /// `None` when there is no such folder yet. Locking the folder itself
    /// needs no lock file, so a reader writes nothing.
    fn certs_locked(&self, exclusive: bool) -> Result<Option<std::fs::File>, StoreError> {
        let certs = self.root.join(CERTS);
        let folder = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
            .open(&certs);
        let folder = match folder {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&certs, &e)),
        };
        let meta = folder.metadata().map_err(|e| io(&certs, &e))?;
        check_safe(&certs, &meta, true)?;
        if exclusive {
            folder.lock()
        } else {
            folder.lock_shared()
        }
        .map_err(|e| io(&certs, &e))?;
        Ok(Some(folder))
    }

    /// `<state>/secrets/<node>`, its `secrets` folder checked when it
    /// exists (a link there would lead every node's secrets out).
    fn node_dir(&self, node: &str) -> Result<PathBuf, StoreError> {
        if !valid_node(node) {
            return Err(StoreError::NodeName(node.to_owned()));
        }
        let secrets = self.root.join("secrets");
        self.if_safe(&secrets)?;
        Ok(secrets.join(node))
    }

    /// `dir`, when it exists, is a folder of the store (not a link).
    fn if_safe(&self, dir: &Path) -> Result<(), StoreError> {
        match std::fs::symlink_metadata(dir) {
            Ok(m) => check_safe(dir, &m, true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(dir, &e)),
        }
    }

    /// `node`'s secret files by name (names a secret can have; temporary
    /// files of an interrupted write and anything else left out), its
    /// folder checked safe; their contents unread.
    fn secret_files(&self, node: &str) -> Result<Vec<(String, PathBuf)>, StoreError> {
        let dir = self.node_dir(node)?;
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&dir, &e)),
        };
        let m = std::fs::symlink_metadata(&dir).map_err(|e| io(&dir, &e))?;
        check_safe(&dir, &m, true)?;
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| io(&dir, &e))?;
            if let Some(name) = e.file_name().to_str().filter(|n| valid_secret_name(n)) {
                out.push((name.to_owned(), e.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// A secret or the ACME account: whole, or an error when larger than
    /// [`MAX_SECRET_BYTES`] (never a cut value used as the real one).
    fn read(&self, path: &Path) -> Result<Option<String>, StoreError> {
        let text = self.read_capped(path, MAX_SECRET_BYTES)?;
        if text.as_ref().is_some_and(|t| t.len() > MAX_SECRET_BYTES) {
            return Err(StoreError::TooLarge {
                path: path.to_owned(),
                cap: MAX_SECRET_BYTES,
            });
        }
        Ok(text)
    }

    /// A file of the store, at most `cap` bytes read.
    pub(crate) fn read_capped(
        &self,
        path: &Path,
        cap: usize,
    ) -> Result<Option<String>, StoreError> {
        // Never blocks on a FIFO planted in the store (a reader may hold
        // the certificates' lock): the type is checked on the descriptor.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(path, &e)),
        };
        let meta = file.metadata().map_err(|e| io(path, &e))?;
        check_safe(path, &meta, false)?;
        let mut text = String::new();
        file.take(cap as u64 + 1)
            .read_to_string(&mut text)
            .map_err(|e| io(path, &e))?;
        Ok(Some(text))
    }
}

/// The lock file at `path` (created 0600, never through a link), held
/// with an exclusive `flock` until the file is dropped or unlocked.
pub(crate) fn locked(path: &Path) -> Result<std::fs::File, StoreError> {
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io(path, &e))?;
    lock.lock().map_err(|e| io(path, &e))?;
    Ok(lock)
}

/// A folder (`dir`) or file of the store: ours, not a link, nothing for
/// group or others.
fn check_safe(path: &Path, m: &std::fs::Metadata, dir: bool) -> Result<(), StoreError> {
    let unsafe_ = |why: String| StoreError::Unsafe {
        path: path.to_owned(),
        why,
    };
    if m.file_type().is_symlink() {
        return Err(unsafe_("a link".into()));
    }
    if dir && !m.is_dir() {
        return Err(unsafe_("not a folder".into()));
    }
    if !dir && !m.is_file() {
        return Err(unsafe_("not a regular file".into()));
    }
    if let Some(uid) = my_uid()
        && m.uid() != uid
    {
        return Err(unsafe_(format!("owned by uid {}, not {uid}", m.uid())));
    }
    let mode = m.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(unsafe_(format!("mode {mode:04o}")));
    }
    Ok(())
}

impl Store for DirStore {
    fn secret(&self, node: &str, name: &str) -> Result<Option<String>, StoreError> {
        if !valid_secret_name(name) {
            return Err(StoreError::SecretName(name.to_owned()));
        }
        let dir = self.node_dir(node)?;
        if let Ok(m) = std::fs::symlink_metadata(&dir) {
            check_safe(&dir, &m, true)?;
        }
        let path = dir.join(name);
        let value = self.read(&path)?;
        if let Some(v) = &value {
            stored_secret(&path.display().to_string(), name, v)?;
        }
        Ok(value)
    }

    fn secrets(&self, node: &str) -> Result<BTreeMap<String, String>, StoreError> {
        let mut out = BTreeMap::new();
        for (name, path) in self.secret_files(node)? {
            if let Some(v) = self.read(&path)? {
                stored_secret(&path.display().to_string(), &name, &v)?;
                out.insert(name, v);
            }
        }
        Ok(out)
    }

    fn set_secret(&self, node: &str, name: &str, value: &str) -> Result<(), StoreError> {
        if !valid_secret_name(name) {
            return Err(StoreError::SecretName(name.to_owned()));
        }
        if !valid_secret_value(value) {
            return Err(StoreError::SecretValue);
        }
        let dir = self.node_dir(node)?;
        self.write(&dir, name, value)
    }

    fn remove_secret(&self, node: &str, name: &str) -> Result<bool, StoreError> {
        if !valid_secret_name(name) {
            return Err(StoreError::SecretName(name.to_owned()));
        }
        let path = self.node_dir(node)?.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path, &e)),
        }
    }

    fn secret_names(&self) -> Result<BTreeMap<String, Vec<String>>, StoreError> {
        let dir = self.root.join("secrets");
        self.if_safe(&dir)?;
        let mut out = BTreeMap::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&dir, &e)),
        };
        for e in entries {
            let e = e.map_err(|e| io(&dir, &e))?;
            let Some(node) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !valid_node(&node) {
                continue;
            }
            // Names only: a value the store refuses to read (a line break
            // added by hand) is still listed, so it can be removed.
            let names: Vec<String> = self
                .secret_files(&node)?
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            if !names.is_empty() {
                out.insert(node, names);
            }
        }
        Ok(out)
    }

    fn last_good(&self) -> Result<Option<String>, StoreError> {
        self.read(&self.root.join(LAST_GOOD))?
            .map(|text| kept_commit(&text))
            .transpose()
    }

    fn set_last_good(&self, commit: &str) -> Result<(), StoreError> {
        self.write(&self.root, LAST_GOOD, kept_commit(commit)?.as_str())
    }

    fn certificate(&self, name: &str) -> Result<Option<StoredCert>, StoreError> {
        if !valid_cert_name(name) {
            return Err(StoreError::CertName(name.to_owned()));
        }
        // Read under a shared lock of the certificates' folder: a pair
        // replaced meanwhile is read whole, old or new, never missing.
        let Some(_lock) = self.certs_locked(false)? else {
            return Ok(None);
        };
        let dir = self.root.join(CERTS).join(name);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) => check_safe(&dir, &m, true)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&dir, &e)),
        }
        let read = |file: &str| -> Result<Option<String>, StoreError> {
            let path = dir.join(file);
            let text = self.read_capped(&path, MAX_CERT_BYTES)?;
            if text.as_ref().is_some_and(|t| t.len() > MAX_CERT_BYTES) {
                return Err(StoreError::CertTooLarge(path));
            }
            Ok(text)
        };
        match (read(CHAIN_FILE)?, read(KEY_FILE)?) {
            (Some(chain), Some(key)) => Ok(Some(StoredCert { chain, key })),
            (None, None) => Ok(None),
            // Half a pair: named, never "not there" (see the shared store).
            (chain, _) => Err(StoreError::Io {
                path: dir.join(if chain.is_some() {
                    KEY_FILE
                } else {
                    CHAIN_FILE
                }),
                cause: "missing: a certificate without its chain or its key".into(),
            }),
        }
    }

    fn set_certificate(&self, name: &str, cert: &StoredCert) -> Result<(), StoreError> {
        if !valid_cert_name(name) {
            return Err(StoreError::CertName(name.to_owned()));
        }
        let certs = self.root.join(CERTS);
        // What the store could not read back is not written (a chain
        // re-encoded by `certs import` can outgrow the file it came from).
        if cert.chain.len() > MAX_CERT_BYTES || cert.key.len() > MAX_CERT_BYTES {
            return Err(StoreError::CertTooLarge(certs.join(name)));
        }
        self.folder(&certs)?;
        // Written whole in a new folder, then swapped in under an
        // exclusive lock of the certificates' folder: a reader (shared
        // lock) sees the old pair or the new one, never none, never a
        // chain with another's key.
        let _lock = self.certs_locked(true)?;
        let pid = std::process::id();
        let fresh = certs.join(format!(".{name}.{pid}.new"));
        let old = certs.join(format!(".{name}.{pid}.old"));
        let _ = std::fs::remove_dir_all(&fresh);
        self.write(&fresh, CHAIN_FILE, &cert.chain)?;
        self.write(&fresh, KEY_FILE, &cert.key)?;
        let dir = certs.join(name);
        let _ = std::fs::remove_dir_all(&old);
        let had = match std::fs::rename(&dir, &old) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(&dir, &e)),
        };
        std::fs::rename(&fresh, &dir).map_err(|e| io(&dir, &e))?;
        if had {
            let _ = std::fs::remove_dir_all(&old);
        }
        Ok(())
    }

    fn acme_account(&self) -> Result<Option<String>, StoreError> {
        self.read(&self.root.join(ACME_DIR).join(ACME_ACCOUNT))
    }

    fn set_acme_account(&self, json: &str) -> Result<(), StoreError> {
        self.write(&self.root.join(ACME_DIR), ACME_ACCOUNT, json)
    }

    fn outbox(&self, node: &str) -> Result<Vec<(String, String)>, StoreError> {
        let dir = self.outbox_dir(node)?;
        let list = match std::fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(StoreError::Io {
                    path: dir,
                    cause: e.kind().to_string(),
                });
            }
        };
        // Temporary files of an interrupted write start with `.`.
        let mut names: Vec<String> = list
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            if let Some(text) = self.read_capped(&dir.join(&name), MAX_OUTBOX_ENTRY_BYTES)? {
                out.push((name, text));
            }
        }
        Ok(out)
    }

    fn set_outbox(&self, node: &str, name: &str, text: &str) -> Result<(), StoreError> {
        let dir = self.outbox_dir(node)?;
        check_outbox_name(name)?;
        self.folder(&self.root.join(OUTBOX))?;
        self.write(&dir, name, text)?;
        sync_dir(&dir);
        Ok(())
    }

    fn remove_outbox(&self, node: &str, name: &str) -> Result<(), StoreError> {
        let dir = self.outbox_dir(node)?;
        check_outbox_name(name)?;
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(x) if x.kind() == std::io::ErrorKind::NotFound => {}
            Err(x) => {
                return Err(StoreError::Io {
                    path,
                    cause: x.kind().to_string(),
                });
            }
        }
        sync_dir(&dir);
        Ok(())
    }

    fn outbox_nodes(&self) -> Result<Vec<String>, StoreError> {
        let Ok(list) = std::fs::read_dir(self.root.join(OUTBOX)) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<String> = list
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| valid_node(n))
            .collect();
        out.sort();
        Ok(out)
    }

    fn renewal_state(&self) -> Result<Option<String>, StoreError> {
        let path = self.root.join(ACME_DIR).join(RENEWAL_FILE);
        let text = self.read_capped(&path, MAX_RENEWAL_STATE_BYTES)?;
        if text
            .as_ref()
            .is_some_and(|t| t.len() > MAX_RENEWAL_STATE_BYTES)
        {
            return Err(StoreError::RenewalTooLarge(path.display().to_string()));
        }
        Ok(text)
    }

    fn rollout_state(&self) -> Result<Option<String>, StoreError> {
        let path = self.root.join(ROLLOUT_FILE);
        let text = self.read_capped(&path, MAX_ROLLOUT_STATE_BYTES)?;
        if text
            .as_ref()
            .is_some_and(|t| t.len() > MAX_ROLLOUT_STATE_BYTES)
        {
            return Err(StoreError::RolloutTooLarge(path.display().to_string()));
        }
        Ok(text)
    }

    fn set_rollout_state(&self, json: &str) -> Result<(), StoreError> {
        if json.len() > MAX_ROLLOUT_STATE_BYTES {
            return Err(StoreError::RolloutTooLarge(
                self.root.join(ROLLOUT_FILE).display().to_string(),
            ));
        }
        self.write(&self.root, ROLLOUT_FILE, json)
    }

    fn replace_rollout_state(&self, seen: Option<&str>, json: &str) -> Result<bool, StoreError> {
        // Read, compare and write under an exclusive `flock`, as leases
        // are: two commands on this host never both replace what they read.
        let lock = locked(&self.root.join(format!(".{ROLLOUT_FILE}.lock")))?;
        let kept = match self.rollout_state() {
            Ok(now) if now.as_deref() == Some(json) => Ok(true),
            Ok(now) if now.as_deref() == seen => self.set_rollout_state(json).map(|()| true),
            Ok(_) => Ok(false),
            Err(e) => Err(e),
        };
        let _ = lock.unlock();
        kept
    }

    fn set_renewal_state(&self, json: &str) -> Result<(), StoreError> {
        let dir = self.root.join(ACME_DIR);
        if json.len() > MAX_RENEWAL_STATE_BYTES {
            return Err(StoreError::RenewalTooLarge(
                dir.join(RENEWAL_FILE).display().to_string(),
            ));
        }
        self.write(&dir, RENEWAL_FILE, json)
    }

    fn take_lease(&self, name: &str, token: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.take_lease_file(name, token, ttl)
    }

    fn release_lease(&self, name: &str, token: &str) -> Result<(), StoreError> {
        self.release_lease_file(name, token)
    }

    fn lease_holder(&self, name: &str) -> Result<Option<String>, StoreError> {
        self.lease_holder_file(name)
    }

    fn certificate_names(&self) -> Result<Vec<String>, StoreError> {
        // Under the shared lock: a pair being replaced is listed (its
        // folder is renamed aside for an instant under the exclusive one).
        let Some(_lock) = self.certs_locked(false)? else {
            return Ok(Vec::new());
        };
        let dir = self.root.join(CERTS);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&dir, &e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|e| io(&dir, &e))?;
            // Folders of an interrupted import start with `.`.
            if let Some(name) = e.file_name().to_str()
                && valid_cert_name(name)
            {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }
}

/// The purge outbox's folder, in the state directory.
const OUTBOX: &str = "outbox";

fn check_outbox_name(name: &str) -> Result<(), StoreError> {
    if valid_outbox_name(name) {
        Ok(())
    } else {
        Err(StoreError::NodeName(format!("outbox entry {name}")))
    }
}

/// Flush a folder's entry list to disk (a rename or removal survives a crash).
fn sync_dir(path: &Path) {
    if let Ok(d) = std::fs::File::open(path) {
        let _ = d.sync_all();
    }
}

impl DirStore {
    /// `node`'s outbox folder (`<state>/outbox/<node>`).
    fn outbox_dir(&self, node: &str) -> Result<PathBuf, StoreError> {
        if !valid_node(node) {
            return Err(StoreError::NodeName(node.to_owned()));
        }
        Ok(self.root.join(OUTBOX).join(node))
    }
}

/// Whether `name` can name a certificate (as `tls: {certificate: NAME}`
/// allows).
#[must_use]
pub fn valid_cert_name(name: &str) -> bool {
    compiler::validate::valid_cert_name(name)
}

impl DirStore {
    /// The state directory at `root` when it exists (never created: `check`
    /// on a pull request's CI must not make one); `None` when it does not.
    ///
    /// # Errors
    /// It exists and is a link, not a folder, not ours, or open to others.
    pub fn open_existing(root: &Path) -> Result<Option<DirStore>, StoreError> {
        match std::fs::symlink_metadata(root) {
            Ok(m) => {
                check_safe(root, &m, true)?;
                Ok(Some(DirStore {
                    root: root.to_owned(),
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(root, &e)),
        }
    }
}

impl DirStore {
    /// Write `value` to `dir/name` atomically (`dir` made safe, the file
    /// 0600, a temporary file renamed over it).
    pub(crate) fn write(&self, dir: &Path, name: &str, value: &str) -> Result<(), StoreError> {
        self.folder(dir)?;
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| io(&tmp, &e))?;
        let written = f
            .set_permissions(std::fs::Permissions::from_mode(0o600))
            .and_then(|()| f.write_all(value.as_bytes()))
            .and_then(|()| f.sync_all());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&tmp, &e));
        }
        std::fs::rename(&tmp, &path).map_err(|e| io(&path, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_account_or_secret_file_is_an_error_never_cut() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        s.set_acme_account(&"x".repeat(MAX_SECRET_BYTES + 10))
            .unwrap();
        assert!(matches!(
            s.acme_account(),
            Err(StoreError::TooLarge {
                cap: MAX_SECRET_BYTES,
                ..
            })
        ));
        s.set_acme_account(&"x".repeat(MAX_SECRET_BYTES)).unwrap();
        assert_eq!(
            s.acme_account().unwrap().map(|a| a.len()),
            Some(MAX_SECRET_BYTES)
        );
    }

    #[test]
    fn secrets_round_trip_with_private_modes() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        let s = DirStore::open(&root).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        s.set_secret("edge-1", "EDGEFORM_API_TOKEN", "t0k'en")
            .unwrap();
        s.set_secret("edge-1", "EDGEFORM_CHALLENGE_SECRET", "s3cret")
            .unwrap();
        assert_eq!(mode(&root.join("secrets")), 0o700);
        assert_eq!(mode(&root.join("secrets/edge-1")), 0o700);
        assert_eq!(mode(&root.join("secrets/edge-1/EDGEFORM_API_TOKEN")), 0o600);
        assert_eq!(
            s.secret("edge-1", "EDGEFORM_API_TOKEN").unwrap().as_deref(),
            Some("t0k'en")
        );
        assert_eq!(s.secret("edge-2", "EDGEFORM_API_TOKEN").unwrap(), None);
        let all = s.secrets("edge-1").unwrap();
        assert_eq!(
            all.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
            [
                ("EDGEFORM_API_TOKEN", "t0k'en"),
                ("EDGEFORM_CHALLENGE_SECRET", "s3cret")
            ]
        );
        assert_eq!(
            s.secret_names().unwrap()["edge-1"],
            ["EDGEFORM_API_TOKEN", "EDGEFORM_CHALLENGE_SECRET"]
        );
        assert!(s.remove_secret("edge-1", "EDGEFORM_API_TOKEN").unwrap());
        assert!(!s.remove_secret("edge-1", "EDGEFORM_API_TOKEN").unwrap());
    }

    #[test]
    fn the_last_good_commit_survives_a_new_store_and_must_be_a_commit_id() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        let s = DirStore::open(&root).unwrap();
        assert_eq!(s.last_good().unwrap(), None);
        let c = "0123456789abcdef0123456789abcdef01234567";
        s.set_last_good(c).unwrap();
        let mode = std::fs::metadata(root.join(LAST_GOOD)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            DirStore::open(&root)
                .unwrap()
                .last_good()
                .unwrap()
                .as_deref(),
            Some(c)
        );
        assert_eq!(
            s.set_last_good("HEAD"),
            Err(StoreError::Commit("HEAD".into()))
        );
        std::fs::write(root.join(LAST_GOOD), "main\n").unwrap();
        std::fs::set_permissions(root.join(LAST_GOOD), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        assert_eq!(s.last_good(), Err(StoreError::Commit("main".into())));
    }

    #[test]
    fn a_certificate_read_while_it_is_replaced_is_the_old_pair_or_the_new_never_none_or_mixed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        let s = DirStore::open(&root).unwrap();
        let pair = |n: u32| StoredCert {
            chain: format!("chain {n}"),
            key: format!("key {n}"),
        };
        s.set_certificate("shop", &pair(0)).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|t| {
            t.spawn(|| {
                // Another process's store on the same folder.
                let w = DirStore::open(&root).unwrap();
                for n in 1..400 {
                    w.set_certificate("shop", &pair(n)).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let mut reads = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || reads < 100 {
                let c = s.certificate("shop").unwrap().expect("never missing");
                let n = c.chain.strip_prefix("chain ").unwrap();
                assert_eq!(c.key, format!("key {n}"), "a chain with another's key");
                reads += 1;
            }
        });
    }

    #[test]
    fn certificates_round_trip_whole_with_private_modes() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        let s = DirStore::open(&root).unwrap();
        assert_eq!(s.certificate("shop").unwrap(), None);
        let one = StoredCert {
            chain: "chain one".into(),
            key: "key one".into(),
        };
        s.set_certificate("shop", &one).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&root.join("certs")), 0o700);
        assert_eq!(mode(&root.join("certs/shop")), 0o700);
        assert_eq!(mode(&root.join("certs/shop/key.pem")), 0o600);
        assert_eq!(mode(&root.join("certs/shop/chain.pem")), 0o600);
        assert_eq!(s.certificate("shop").unwrap(), Some(one));
        let two = StoredCert {
            chain: "chain two".into(),
            key: "key two".into(),
        };
        s.set_certificate("shop", &two).unwrap();
        assert_eq!(s.certificate("shop").unwrap(), Some(two.clone()));
        assert!(!format!("{two:?}").contains("key two"));
        assert_eq!(s.certificate_names().unwrap(), ["shop"]);
        assert_eq!(
            s.set_certificate("../x", &two),
            Err(StoreError::CertName("../x".into()))
        );
        assert_eq!(
            std::fs::read_dir(root.join("certs")).unwrap().count(),
            1,
            "no folder of the replaced pair is left"
        );
        assert!(
            DirStore::open_existing(&d.path().join("nope"))
                .unwrap()
                .is_none()
        );
        assert!(DirStore::open_existing(&root).unwrap().is_some());
    }

    #[test]
    fn bad_names_values_and_open_folders_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        assert_eq!(
            s.set_secret("../x", "A", "v"),
            Err(StoreError::NodeName("../x".into()))
        );
        assert_eq!(
            s.set_secret("edge-1", "a", "v"),
            Err(StoreError::SecretName("a".into()))
        );
        assert_eq!(
            s.set_secret("edge-1", "A", "two\nlines"),
            Err(StoreError::SecretValue)
        );
        assert_eq!(
            s.set_secret("edge-1", "A", ""),
            Err(StoreError::SecretValue)
        );
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            DirStore::open(&open),
            Err(StoreError::Unsafe { .. })
        ));
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path().join("state"), &link).unwrap();
        assert!(matches!(
            DirStore::open(&link),
            Err(StoreError::Unsafe { .. })
        ));
    }

    #[test]
    fn a_secrets_folder_planted_as_a_link_is_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir_all(outside.join("edge-1")).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(
            outside.join("edge-1"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::os::unix::fs::symlink(&outside, d.path().join("state/secrets")).unwrap();
        let unsafe_ = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Unsafe { .. }));
        assert!(unsafe_(s.set_secret("edge-1", "A", "v")));
        assert!(unsafe_(s.secrets("edge-1").map(|_| ())));
        assert!(unsafe_(s.secret("edge-1", "A").map(|_| ())));
        assert!(unsafe_(s.secret_names().map(|_| ())));
        assert!(!outside.join("edge-1/A").exists());
    }

    #[test]
    fn a_certificate_the_store_could_not_read_back_is_not_written() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(&d.path().join("state")).unwrap();
        let big = StoredCert {
            chain: "x".repeat(MAX_CERT_BYTES + 1),
            key: "k".into(),
        };
        assert!(matches!(
            s.set_certificate("big", &big),
            Err(StoreError::CertTooLarge(_))
        ));
        assert_eq!(s.certificate_names().unwrap(), Vec::<String>::new());
        // Half a pair is an error naming the missing file, not "none".
        let pair = StoredCert {
            chain: "c".into(),
            key: "k".into(),
        };
        s.set_certificate("half", &pair).unwrap();
        std::fs::remove_file(
            d.path()
                .join("state")
                .join(CERTS)
                .join("half")
                .join(KEY_FILE),
        )
        .unwrap();
        assert!(
            matches!(s.certificate("half"), Err(StoreError::Io { path, .. }) if path.ends_with(KEY_FILE))
        );
    }

    #[test]
    fn commands_creating_one_folder_at_once_all_succeed() {
        for round in 0..10 {
            let d = tempfile::tempdir().unwrap();
            let s = std::sync::Arc::new(DirStore::open(&d.path().join("state")).unwrap());
            let threads: Vec<_> = (0..16)
                .map(|i| {
                    let s = s.clone();
                    std::thread::spawn(move || s.set_secret("edge-1", &format!("K{i}"), "v"))
                })
                .collect();
            for t in threads {
                assert_eq!(t.join().unwrap(), Ok(()), "round {round}");
            }
        }
    }
}
