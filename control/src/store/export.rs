//! `edgeform state export|import`: every entry of a state store (any
//! backend) to one file and back, for backup and for moving a state
//! directory into a shared store.
//!
//! The file is JSON: `{"format": "edgeform-state/1", "key_id": …,
//! "nonce": …, "sealed": …}`. `sealed` is every entry (node secrets,
//! certificates with their keys, the ACME account, the certificates job's
//! renewal state, the last good commit, the purge outbox, the rollouts'
//! book)
//! as JSON, encrypted and authenticated with AES-GCM (a 256-bit key) under the key in
//! [`KEY_ENV`] (32 bytes, base64); the format and the key id are bound to
//! it as associated data. `key_id` (16 hex digits of a SHA-256 over a
//! label and the key) tells a wrong key from an altered file; it does not
//! reveal the key. A file that does not open is refused whole: nothing is
//! written before every entry has been decrypted and checked.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::Digest as _;

use super::{
    MAX_CERT_BYTES, MAX_OUTBOX_ENTRY_BYTES, Store, StoreError, StoredCert, valid_cert_name,
    valid_commit, valid_node, valid_outbox_name, valid_secret_name, valid_secret_value,
};

/// The variable holding the key (32 bytes, base64).
pub const KEY_ENV: &str = "EDGEFORM_STATE_KEY";
/// The file's format.
pub const FORMAT: &str = "edgeform-state/1";
/// The largest export file read.
pub const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Why an export cannot be written or read. Each kind names what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportError {
    /// [`KEY_ENV`] is not set.
    KeyMissing,
    /// [`KEY_ENV`] is not 32 bytes in base64.
    KeyInvalid,
    /// The file was exported with another key.
    WrongKey,
    /// The file does not open with the key: altered or truncated.
    Tampered,
    /// Not an export file (`why`).
    Format(String),
    /// An entry that the store would refuse (`what` names it).
    Entry(String),
    /// An entry the store holds that no import would take (`what` names
    /// it): nothing is exported, so a backup is never one that cannot be
    /// restored.
    Unrestorable(String),
    /// The file cannot be read or written.
    Io { path: String, cause: String },
    /// The store said no.
    Store(StoreError),
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::KeyMissing => write!(
                f,
                "{KEY_ENV} is not set: it holds the export's key, 32 bytes in base64 \
                 (e.g. `openssl rand -base64 32`)"
            ),
            Self::KeyInvalid => write!(f, "{KEY_ENV} is not 32 bytes in base64"),
            Self::WrongKey => write!(
                f,
                "the file was exported with another key than the one in {KEY_ENV}; nothing imported"
            ),
            Self::Tampered => write!(
                f,
                "the file does not open with the key in {KEY_ENV}: it was altered or cut short; \
                 nothing imported"
            ),
            Self::Format(why) => write!(f, "not an edgeform state export: {why}; nothing imported"),
            Self::Entry(what) => write!(
                f,
                "the export holds an invalid entry ({what}); nothing imported"
            ),
            Self::Unrestorable(what) => write!(
                f,
                "the state store holds an entry no import would take ({what}); nothing \
                 exported: correct or remove it, then export again"
            ),
            Self::Io { path, cause } => write!(f, "{path}: {cause}"),
            Self::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ExportError {}

impl From<StoreError> for ExportError {
    fn from(e: StoreError) -> Self {
        match e {
            // The store refuses to read it, as import would refuse it.
            StoreError::StoredSecret { place, name } => {
                ExportError::Unrestorable(format!("secret {name} in {place}: not one line"))
            }
            e => ExportError::Store(e),
        }
    }
}

/// Every entry of a store. `Debug` shows counts only.
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// Node → secret name → value.
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
    /// Name → chain and key (PEM).
    pub certificates: BTreeMap<String, Pem>,
    pub acme_account: Option<String>,
    pub last_good: Option<String>,
    /// Node → purge outbox entry name → the kept job (JSON).
    #[serde(default)]
    pub outbox: BTreeMap<String, BTreeMap<String, String>>,
    /// The certificates job's renewal state (JSON).
    #[serde(default)]
    pub renewal: Option<String>,
    /// The rollouts' book (JSON): the live rollout and the aborted
    /// commits sync never applies again.
    #[serde(default)]
    pub rollouts: Option<String>,
}

/// A certificate in the export.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pem {
    pub chain: String,
    pub key: String,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

impl Snapshot {
    /// What it holds, in counts (never a value).
    #[must_use]
    pub fn summary(&self) -> String {
        let secrets: usize = self.secrets.values().map(BTreeMap::len).sum();
        let kept: usize = self.outbox.values().map(BTreeMap::len).sum();
        format!(
            "{secrets} secret(s) of {} node(s), {} certificate(s), {} ACME account, {} last good commit, \
             {kept} purge job(s) kept, {} rollouts' book",
            self.secrets.len(),
            self.certificates.len(),
            if self.acme_account.is_some() {
                "an"
            } else {
                "no"
            },
            if self.last_good.is_some() { "a" } else { "no" },
            if self.rollouts.is_some() { "a" } else { "no" },
        )
    }

    /// Every entry as the store accepts it, or the first that is not.
    ///
    /// # Errors
    /// [`ExportError::Entry`] naming it (never its value).
    pub fn check(&self) -> Result<(), ExportError> {
        let bad = |what: String| Err(ExportError::Entry(what));
        for (node, secrets) in &self.secrets {
            if !valid_node(node) {
                return bad(format!(
                    "node name `{}`",
                    edgestate::untrusted::escape(node)
                ));
            }
            for (name, value) in secrets {
                if !valid_secret_name(name) {
                    return bad(format!(
                        "secret name `{}` of {node}",
                        edgestate::untrusted::escape(name)
                    ));
                }
                if !valid_secret_value(value) {
                    return bad(format!("the value of {node}'s {name}"));
                }
            }
        }
        for (name, pem) in &self.certificates {
            if !valid_cert_name(name) {
                return bad(format!(
                    "certificate name `{}`",
                    edgestate::untrusted::escape(name)
                ));
            }
            if pem.chain.len() > MAX_CERT_BYTES || pem.key.len() > MAX_CERT_BYTES {
                return bad(format!("certificate {name}: over {MAX_CERT_BYTES} bytes"));
            }
            // What `certs import` refuses (not PEM, a key of another
            // certificate); an expired one is kept, as the store keeps it.
            match crate::certs::parse(name, &pem.chain, &pem.key) {
                Err(e) => return bad(format!("certificate {name}: {}", e.detail)),
                Ok(c) if !c.key_matches => {
                    return bad(format!(
                        "certificate {name}: the key is not the leaf certificate's key"
                    ));
                }
                Ok(_) => {}
            }
        }
        if let Some(a) = &self.acme_account
            && (a.len() > super::MAX_SECRET_BYTES
                || !serde_json::from_str::<serde_json::Value>(a).is_ok_and(|v| v.is_object()))
        {
            return bad(format!(
                "the ACME account (a JSON object of at most {} bytes)",
                super::MAX_SECRET_BYTES
            ));
        }
        if let Some(c) = &self.last_good
            && !valid_commit(c)
        {
            return bad("the last good commit".into());
        }
        if self.renewal.as_ref().is_some_and(|r| {
            r.len() > super::MAX_RENEWAL_STATE_BYTES || crate::renew::State::parse(r).is_err()
        }) {
            return bad("the renewal state".into());
        }
        if let Some(r) = &self.rollouts
            && (r.len() > super::MAX_ROLLOUT_STATE_BYTES
                || crate::rollout::Book::parse(Some(r)).is_err())
        {
            return bad("the rollouts' book".into());
        }
        for (node, entries) in &self.outbox {
            if !valid_node(node) {
                return bad(format!(
                    "outbox node `{}`",
                    edgestate::untrusted::escape(node)
                ));
            }
            for (name, text) in entries {
                if !valid_outbox_name(name)
                    || text.len() > MAX_OUTBOX_ENTRY_BYTES
                    || crate::outbox::Entry::read(text).is_err()
                {
                    return bad(format!(
                        "outbox entry `{}` of {node}",
                        edgestate::untrusted::escape(name)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Every entry of `store`.
///
/// # Errors
/// The store cannot be read.
pub fn snapshot(store: &dyn Store) -> Result<Snapshot, StoreError> {
    let mut out = Snapshot::default();
    for node in store.secret_names()?.into_keys() {
        let s = store.secrets(&node)?;
        if !s.is_empty() {
            out.secrets.insert(node, s);
        }
    }
    for name in store.certificate_names()? {
        if let Some(c) = store.certificate(&name)? {
            out.certificates.insert(
                name,
                Pem {
                    chain: c.chain,
                    key: c.key,
                },
            );
        }
    }
    out.acme_account = store.acme_account()?;
    out.renewal = store.renewal_state()?;
    out.last_good = store.last_good()?;
    out.rollouts = store.rollout_state()?;
    for node in store.outbox_nodes()? {
        // An entry whose job edgeform would not queue is never delivered
        // (`outbox::entries` skips it): left out of the backup, named in
        // the log, rather than failing the backup of everything else.
        let entries: BTreeMap<String, String> = store
            .outbox(&node)?
            .into_iter()
            .filter(|(name, text)| {
                let kept = crate::outbox::Entry::read(text);
                if let Err(why) = &kept {
                    tracing::warn!(%node, entry = %edgestate::untrusted::escape(name), cause = %why, "state export: a purge outbox entry edgeform would never deliver is left out");
                }
                kept.is_ok()
            })
            .collect();
        if !entries.is_empty() {
            out.outbox.insert(node, entries);
        }
    }
    Ok(out)
}

/// Write every entry of `snap` into `store` (entries it does not hold are
/// left as they are). Checked first: an invalid entry writes nothing.
///
/// # Errors
/// An invalid entry, or the store cannot be written.
pub fn restore(store: &dyn Store, snap: &Snapshot) -> Result<(), ExportError> {
    snap.check()?;
    store.import(snap)?;
    Ok(())
}

/// [`Store::import`] entry by entry (the state directory's): each entry is
/// written whole, but an error part way leaves the entries before it.
///
/// # Errors
/// The store cannot be written.
pub(crate) fn import_one_by_one<S: Store + ?Sized>(
    store: &S,
    snap: &Snapshot,
) -> Result<(), StoreError> {
    for (node, secrets) in &snap.secrets {
        for (name, value) in secrets {
            store.set_secret(node, name, value)?;
        }
    }
    for (name, pem) in &snap.certificates {
        store.set_certificate(
            name,
            &StoredCert {
                chain: pem.chain.clone(),
                key: pem.key.clone(),
            },
        )?;
    }
    if let Some(a) = &snap.acme_account {
        store.set_acme_account(a)?;
    }
    if let Some(c) = &snap.last_good {
        store.set_last_good(c)?;
    }
    if let Some(r) = &snap.renewal {
        store.set_renewal_state(r)?;
    }
    if let Some(r) = &snap.rollouts {
        store.set_rollout_state(r)?;
    }
    for (node, entries) in &snap.outbox {
        for (name, text) in entries {
            store.set_outbox(node, name, text)?;
        }
    }
    Ok(())
}

/// The key in [`KEY_ENV`].
///
/// # Errors
/// Unset, or not 32 bytes in base64.
pub fn key_from_env() -> Result<[u8; 32], ExportError> {
    let text = std::env::var(KEY_ENV).map_err(|_| ExportError::KeyMissing)?;
    let text = text.trim();
    if text.is_empty() {
        return Err(ExportError::KeyMissing);
    }
    let bytes = B64.decode(text).map_err(|_| ExportError::KeyInvalid)?;
    bytes.try_into().map_err(|_| ExportError::KeyInvalid)
}

fn key_id(key: &[u8; 32]) -> String {
    let mut h = sha2::Sha256::new();
    h.update(b"edgeform state export key id\0");
    h.update(key);
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    format: String,
    key_id: String,
    nonce: String,
    sealed: String,
}

fn cipher(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES key"))
}

fn aad(key_id: &str) -> String {
    format!("{FORMAT}\0{key_id}")
}

/// `snap` sealed under `key`: the export file's text.
///
/// # Errors
/// No random nonce could be drawn.
pub fn seal(snap: &Snapshot, key: &[u8; 32]) -> Result<String, ExportError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| ExportError::Format("no random nonce could be drawn".into()))?;
    let id = key_id(key);
    let mut data = serde_json::to_vec(snap).expect("a snapshot serializes");
    cipher(key)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(&id)),
            &mut data,
        )
        .map_err(|_| ExportError::Format("sealing failed".into()))?;
    let env = Envelope {
        format: FORMAT.into(),
        key_id: id,
        nonce: B64.encode(nonce),
        sealed: B64.encode(&data),
    };
    Ok(serde_json::to_string_pretty(&env).expect("an envelope serializes") + "\n")
}

/// The entries in an export file's `text`, opened with `key` and checked.
///
/// # Errors
/// Not an export, another key, an altered file, an invalid entry.
pub fn unseal(text: &str, key: &[u8; 32]) -> Result<Snapshot, ExportError> {
    let env: Envelope = serde_json::from_str(text)
        .map_err(|e| ExportError::Format(format!("line {}: {e}", e.line())))?;
    if env.format != FORMAT {
        return Err(ExportError::Format(format!(
            "format `{}`, not `{FORMAT}`",
            edgestate::untrusted::escape(&env.format)
        )));
    }
    if env.key_id != key_id(key) {
        return Err(ExportError::WrongKey);
    }
    let nonce: [u8; NONCE_LEN] = B64
        .decode(&env.nonce)
        .ok()
        .and_then(|n| n.try_into().ok())
        .ok_or(ExportError::Tampered)?;
    let mut data = B64.decode(&env.sealed).map_err(|_| ExportError::Tampered)?;
    let plain = cipher(key)
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(&env.key_id)),
            &mut data,
        )
        .map_err(|_| ExportError::Tampered)?;
    let snap: Snapshot = serde_json::from_slice(plain)
        .map_err(|e| ExportError::Format(format!("the sealed entries: {e}")))?;
    snap.check()?;
    Ok(snap)
}

/// Export `store` to `path` (0600, written whole then renamed in place).
///
/// # Errors
/// The key, the store, or the file.
pub fn export_to(store: &dyn Store, path: &Path, key: &[u8; 32]) -> Result<Snapshot, ExportError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let snap = snapshot(store)?;
    // What import checks, checked before anything is written: a backup
    // that import would refuse is no backup.
    snap.check().map_err(|e| match e {
        ExportError::Entry(what) => ExportError::Unrestorable(what),
        other => other,
    })?;
    let text = seal(&snap, key)?;
    let io = |p: &Path, e: &std::io::Error| ExportError::Io {
        path: p.display().to_string(),
        cause: e.kind().to_string(),
    };
    // A file's path: `/`, `dir/` or an existing folder would put the
    // temporary file somewhere else, then fail to rename it.
    let name = match path.file_name() {
        Some(n) if !path.as_os_str().to_string_lossy().ends_with('/') && !path.is_dir() => {
            n.to_string_lossy().into_owned()
        }
        _ => {
            return Err(ExportError::Io {
                path: path.display().to_string(),
                cause: "a folder, not a file name".into(),
            });
        }
    };
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io(&tmp, &e))?;
    if let Err(e) = f.write_all(text.as_bytes()).and_then(|()| f.sync_all()) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&tmp, &e));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(path, &e));
    }
    Ok(snap)
}

/// Import the export at `path` into `store`: opened and checked whole
/// first, so a wrong key or an altered file writes nothing.
///
/// # Errors
/// The key, the file, an entry, or the store.
pub fn import_from(
    store: &dyn Store,
    path: &Path,
    key: &[u8; 32],
) -> Result<Snapshot, ExportError> {
    use std::io::Read as _;
    let io = |e: &std::io::Error| ExportError::Io {
        path: path.display().to_string(),
        cause: e.kind().to_string(),
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(|e| io(&e))?
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| io(&e))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(ExportError::Format(format!("over {MAX_FILE_BYTES} bytes")));
    }
    let snap = unseal(&text, key)?;
    restore(store, &snap)?;
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DirStore;

    /// A certificate for shop.example.com and its key (PEM), signed by a
    /// fresh test CA (a fresh key each call).
    fn pair() -> (String, String) {
        let certs = harness::SiteCerts::new();
        certs.sign("shop", &["shop.example.com"], 30);
        let read = |f: &str| std::fs::read_to_string(certs.file(f)).unwrap();
        (read("shop.chain.pem"), read("shop.key"))
    }

    fn filled(root: &Path) -> DirStore {
        let s = DirStore::open(root).unwrap();
        s.set_secret("edge-1", "EDGEFORM_API_TOKEN", "t0ken")
            .unwrap();
        let (chain, key) = pair();
        s.set_certificate("shop", &StoredCert { chain, key })
            .unwrap();
        s.set_acme_account(r#"{"id":"acct"}"#).unwrap();
        s.set_last_good("0123456789abcdef0123456789abcdef01234567")
            .unwrap();
        crate::outbox::spool(&s, "edge-1", "job-1", r#"{"id":"job-1","key":"k"}"#).unwrap();
        s.set_renewal_state(r#"{"certificates":{}}"#).unwrap();
        s.set_rollout_state(
            r#"{"current":null,"aborted":["0123456789abcdef0123456789abcdef01234567"]}"#,
        )
        .unwrap();
        s
    }

    #[test]
    fn sealed_entries_round_trip_and_never_show_in_the_file() {
        let d = tempfile::tempdir().unwrap();
        let from = filled(&d.path().join("a"));
        let key = [7u8; 32];
        let file = d.path().join("state.export");
        let snap = export_to(&from, &file, &key).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        for secret in ["t0ken", "PRIVATE KEY", "acct", "edge-1", "shop", "job-1"] {
            assert!(!text.contains(secret), "{secret} in the file");
        }
        assert!(!format!("{snap:?}").contains("t0ken"));
        let to = DirStore::open(&d.path().join("b")).unwrap();
        import_from(&to, &file, &key).unwrap();
        assert_eq!(snapshot(&to).unwrap(), snapshot(&from).unwrap());
        assert_eq!(
            to.renewal_state().unwrap().as_deref(),
            Some(r#"{"certificates":{}}"#),
            "the renewal state travels too"
        );
        let book = crate::rollout::Book::parse(to.rollout_state().unwrap().as_deref()).unwrap();
        assert_eq!(
            book.aborted,
            ["0123456789abcdef0123456789abcdef01234567"],
            "the aborted commits travel too: sync never applies them on the new host either"
        );
        // A file from before the renewal state was exported still opens.
        let mut old: serde_json::Value = serde_json::to_value(snapshot(&from).unwrap()).unwrap();
        old.as_object_mut().unwrap().remove("renewal");
        old.as_object_mut().unwrap().remove("rollouts");
        let old: Snapshot = serde_json::from_value(old).unwrap();
        assert_eq!((old.renewal, old.rollouts), (None, None));
    }

    #[test]
    fn an_import_of_entries_the_store_would_refuse_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let good = snapshot(&filled(&d.path().join("a"))).unwrap();
        let key = [7u8; 32];
        type Spoil = fn(&mut Snapshot);
        let bad: [(&str, Spoil); 6] = [
            ("garbage certificate", |s| {
                s.certificates.get_mut("shop").unwrap().chain = "garbage".into();
            }),
            ("key of another certificate", |s| {
                let (_, other) = pair();
                s.certificates.get_mut("shop").unwrap().key = other;
            }),
            ("huge account", |s| {
                s.acme_account = Some(format!("{{\"x\":\"{}\"}}", "a".repeat(5000)))
            }),
            ("renewal not its JSON", |s| s.renewal = Some("nope".into())),
            ("outbox not JSON", |s| {
                s.outbox
                    .get_mut("edge-1")
                    .unwrap()
                    .values_mut()
                    .for_each(|v| *v = "EVIL".into());
            }),
            ("outbox job of another id", |s| {
                for v in s.outbox.get_mut("edge-1").unwrap().values_mut() {
                    *v = v.replace(r#"\"id\":\"job-1\""#, r#"\"id\":\"other\""#);
                }
            }),
        ];
        for (what, spoil) in bad {
            let mut snap = good.clone();
            spoil(&mut snap);
            assert_ne!(snap, good, "{what}: spoiled");
            let file = d.path().join("bad.export");
            std::fs::write(&file, seal(&snap, &key).unwrap()).unwrap();
            let to =
                DirStore::open(&d.path().join(format!("to-{}", what.replace(' ', "-")))).unwrap();
            let err = import_from(&to, &file, &key).expect_err(what);
            assert!(matches!(err, ExportError::Entry(_)), "{what}: {err}");
            assert_eq!(
                snapshot(&to).unwrap(),
                Snapshot::default(),
                "{what}: nothing written"
            );
        }
    }

    #[test]
    fn a_store_entry_no_import_would_take_fails_the_export_and_writes_no_file() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("a");
        let from = filled(&root);
        // Edited by hand, with the newline an editor adds.
        std::fs::write(root.join("secrets/edge-1/EDGEFORM_API_TOKEN"), "t0ken\n").unwrap();
        let file = d.path().join("state.export");
        let err = export_to(&from, &file, &[7u8; 32]).expect_err("unrestorable");
        assert!(
            matches!(&err, ExportError::Unrestorable(what) if what.contains("EDGEFORM_API_TOKEN")),
            "{err}"
        );
        assert!(err.to_string().contains("nothing exported"), "{err}");
        assert!(!file.exists());
    }

    #[test]
    fn another_key_or_an_altered_byte_is_refused_and_writes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let from = filled(&d.path().join("a"));
        let text = seal(&snapshot(&from).unwrap(), &[1u8; 32]).unwrap();
        assert_eq!(unseal(&text, &[2u8; 32]), Err(ExportError::WrongKey));
        let mut env: serde_json::Value = serde_json::from_str(&text).unwrap();
        let sealed = env["sealed"].as_str().unwrap().to_owned();
        let mut bytes = B64.decode(&sealed).unwrap();
        bytes[3] ^= 1;
        env["sealed"] = B64.encode(&bytes).into();
        let altered = env.to_string();
        assert_eq!(unseal(&altered, &[1u8; 32]), Err(ExportError::Tampered));
        let file = d.path().join("x");
        std::fs::write(&file, &altered).unwrap();
        let to = DirStore::open(&d.path().join("b")).unwrap();
        assert!(import_from(&to, &file, &[1u8; 32]).is_err());
        assert_eq!(snapshot(&to).unwrap(), Snapshot::default());
        assert!(matches!(
            unseal("{}", &[1u8; 32]),
            Err(ExportError::Format(_))
        ));
    }
}
