//! Per-node command authenticity: commands signed with an
//! ed25519 key only the control host holds, results signed with a key of
//! the node's own that no other node can compute.
//!
//! - A command's `sig` is `ed25519:<hex>` over
//!   [`Command::signing_payload`] (which binds the node). Agents hold only
//!   the public key, so no node — whatever it leaks — can sign a command,
//!   for itself or another node.
//! - The legacy scheme, an unprefixed hex HMAC-SHA256 under one key shared
//!   by every node, is accepted only where the agent still configures that
//!   key (`command_key_env`): the migration period (docs/operations.md).
//! - A result answering an ed25519 command is signed `hmac-sha256:` with
//!   the node's **result key**, [`result_key`]: HMAC-SHA256 of the node
//!   name under the control key's secret seed. The control host computes
//!   any node's result key from its private key; a node holds only its
//!   own, and cannot compute another's (HMAC is a PRF), so it cannot forge
//!   another node's results. The result is bound to the command's
//!   signature as before ([`CommandResult::signing_payload`]).
//!
//! Pure: keys are parsed from text the caller read ([`signing_key_from_pem`],
//! [`verifying_key_from_pem`], [`result_key_from_text`]).

use ed25519_dalek::Signer;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use hmac::{KeyInit, Mac};

use crate::mqtt::{Command, CommandResult, RESULT_SIG_HMAC};

/// The scheme prefix of an ed25519 command signature.
pub const SIG_ED25519: &str = "ed25519:";

/// The domain of [`result_key`]'s derivation (bump to rotate every node's
/// result key without a new control key).
pub const RESULT_KEY_CONTEXT: &str = "edgeform result key v1";

/// Why key text was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyErrorKind {
    /// Not the PEM kind expected (e.g. a public key where the private one
    /// belongs, an RSA key).
    NotEd25519Pem,
    /// A result key that is not 64 hex digits.
    NotResultKey,
}

/// A key that could not be read; `message` is one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub kind: KeyErrorKind,
    pub message: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KeyError {}

/// An ed25519 private key in PKCS8 PEM (`-----BEGIN PRIVATE KEY-----`),
/// as `edgeform keygen` and `openssl genpkey -algorithm ed25519` write it.
///
/// # Errors
/// Not such a key.
pub fn signing_key_from_pem(text: &str) -> Result<SigningKey, KeyError> {
    SigningKey::from_pkcs8_pem(text.trim()).map_err(|e| KeyError {
        kind: KeyErrorKind::NotEd25519Pem,
        message: format!(
            "not an ed25519 private key in PKCS8 PEM (-----BEGIN PRIVATE KEY-----): {e}"
        ),
    })
}

/// An ed25519 public key in SPKI PEM (`-----BEGIN PUBLIC KEY-----`), as
/// `edgeform keygen` and `openssl pkey -pubout` write it.
///
/// # Errors
/// Not such a key.
pub fn verifying_key_from_pem(text: &str) -> Result<VerifyingKey, KeyError> {
    VerifyingKey::from_public_key_pem(text.trim()).map_err(|e| KeyError {
        kind: KeyErrorKind::NotEd25519Pem,
        message: format!("not an ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----): {e}"),
    })
}

/// The private key as PKCS8 PEM.
#[must_use]
pub fn signing_key_pem(key: &SigningKey) -> String {
    key.to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .map(|z| z.to_string())
        .unwrap_or_default()
}

/// The public key as SPKI PEM.
#[must_use]
pub fn verifying_key_pem(key: &VerifyingKey) -> String {
    key.to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .unwrap_or_default()
}

/// `node`'s result key under the control key (32 bytes).
#[must_use]
pub fn result_key(control: &SigningKey, node: &str) -> Vec<u8> {
    let mut m =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(control.as_bytes()).expect("any key length");
    m.update(RESULT_KEY_CONTEXT.as_bytes());
    m.update(&[0]);
    m.update(node.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// A result key file's text: 64 hex digits (surrounding whitespace
/// ignored), as `edgeform keygen --result-key NODE` writes it.
///
/// # Errors
/// Anything else.
pub fn result_key_from_text(text: &str) -> Result<Vec<u8>, KeyError> {
    let t = text.trim();
    match crate::mqtt::unhex(t) {
        Some(k) if k.len() == 32 => Ok(k),
        _ => Err(KeyError {
            kind: KeyErrorKind::NotResultKey,
            message: "not a result key (64 hex digits, from `edgeform keygen --result-key NODE`)"
                .into(),
        }),
    }
}

/// The keys an agent checks commands with.
#[derive(Debug, Clone, Default)]
pub struct CommandKeys {
    /// The control host's public key: `ed25519:` signatures.
    pub ed25519: Option<VerifyingKey>,
    /// The legacy shared HMAC key (migration only): unprefixed signatures.
    pub hmac: Option<Vec<u8>>,
}

/// Which key authenticated a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Ed25519,
    /// The legacy shared key.
    Hmac,
}

/// Why a command's signature was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SigError {
    Unsigned,
    /// A scheme this agent does not accept (HMAC with no shared key
    /// configured, ed25519 with no public key, an unknown prefix).
    SchemeNotAccepted,
    /// The scheme is accepted but the signature does not verify.
    Bad,
}

impl CommandKeys {
    /// Whether commands must be signed at all.
    #[must_use]
    pub fn required(&self) -> bool {
        self.ed25519.is_some() || self.hmac.is_some()
    }

    /// Which accepted key signed `cmd` for `node`.
    ///
    /// # Errors
    /// Unsigned, a scheme not accepted here, or a bad signature.
    pub fn verify(&self, cmd: &Command, node: &str) -> Result<Scheme, SigError> {
        let Some(sig) = cmd.sig.as_deref() else {
            return Err(SigError::Unsigned);
        };
        if let Some(hex) = sig.strip_prefix(SIG_ED25519) {
            let Some(key) = &self.ed25519 else {
                return Err(SigError::SchemeNotAccepted);
            };
            return cmd
                .verify_ed25519(node, key, hex)
                .then_some(Scheme::Ed25519)
                .ok_or(SigError::Bad);
        }
        if sig.contains(':') {
            return Err(SigError::SchemeNotAccepted);
        }
        let Some(key) = &self.hmac else {
            return Err(SigError::SchemeNotAccepted);
        };
        cmd.verify(node, key)
            .then_some(Scheme::Hmac)
            .ok_or(SigError::Bad)
    }
}

impl Command {
    /// Sign for `node` with the control host's ed25519 key.
    pub fn sign_ed25519(&mut self, node: &str, key: &SigningKey) {
        let sig = key.sign(&self.signing_payload(node));
        self.sig = Some(format!("{SIG_ED25519}{}", crate::hex(&sig.to_bytes())));
    }

    fn verify_ed25519(&self, node: &str, key: &VerifyingKey, hex: &str) -> bool {
        let Some(bytes) = crate::mqtt::unhex(hex) else {
            return false;
        };
        let Ok(sig) = ed25519_dalek::Signature::from_slice(&bytes) else {
            return false;
        };
        key.verify_strict(&self.signing_payload(node), &sig).is_ok()
    }
}

impl CommandResult {
    /// Whether this is `node`'s answer to an ed25519-signed `cmd`: signed
    /// with `node`'s result key, derived from the control key.
    #[must_use]
    pub fn verify_for_control(&self, cmd: &Command, node: &str, control: &SigningKey) -> bool {
        self.sig
            .as_deref()
            .is_some_and(|s| s.starts_with(RESULT_SIG_HMAC))
            && self.verify(cmd, node, &result_key(control, node))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::mqtt::Outcome;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn cmd() -> Command {
        Command {
            id: "1".into(),
            action: "reload".into(),
            args: BTreeMap::from([("zone".into(), "eu".into())]),
            issued_at: 10,
            expires_at: 20,
            sig: None,
        }
    }

    #[test]
    fn only_the_control_key_signs_and_only_accepted_schemes_pass() {
        let control = key(1);
        let keys = CommandKeys {
            ed25519: Some(control.verifying_key()),
            hmac: None,
        };
        assert!(keys.required());
        let mut c = cmd();
        assert_eq!(keys.verify(&c, "n"), Err(SigError::Unsigned));
        c.sign_ed25519("n", &control);
        assert!(c.sig.as_deref().unwrap().starts_with("ed25519:"));
        assert_eq!(keys.verify(&c, "n"), Ok(Scheme::Ed25519));
        assert_eq!(keys.verify(&c, "m"), Err(SigError::Bad), "another node");
        let mut t = c.clone();
        t.args.insert("zone".into(), "us".into());
        assert_eq!(keys.verify(&t, "n"), Err(SigError::Bad), "tampered");
        // Another key pair (e.g. one a node made for itself).
        let mut forged = cmd();
        forged.sign_ed25519("n", &key(2));
        assert_eq!(keys.verify(&forged, "n"), Err(SigError::Bad));
        // A node's own material: its result key, or the old shared key,
        // as an HMAC signature: not accepted without a shared key.
        let mut hm = cmd();
        hm.sign("n", &result_key(&control, "m"));
        assert_eq!(keys.verify(&hm, "n"), Err(SigError::SchemeNotAccepted));
        let mut hm = cmd();
        hm.sign("n", b"old shared key");
        assert_eq!(keys.verify(&hm, "n"), Err(SigError::SchemeNotAccepted));
        let mut odd = cmd();
        odd.sig = Some("rsa:00".into());
        assert_eq!(keys.verify(&odd, "n"), Err(SigError::SchemeNotAccepted));
        // Migration: both accepted while the shared key is configured.
        let both = CommandKeys {
            ed25519: Some(control.verifying_key()),
            hmac: Some(b"old shared key".to_vec()),
        };
        assert_eq!(both.verify(&hm, "n"), Ok(Scheme::Hmac));
        assert_eq!(both.verify(&c, "n"), Ok(Scheme::Ed25519));
        let mut bad = cmd();
        bad.sign("n", b"guess");
        assert_eq!(both.verify(&bad, "n"), Err(SigError::Bad));
        // No keys: nothing required (unsigned commands run, as before).
        assert!(!CommandKeys::default().required());
    }

    // A node cannot forge another node's result.
    #[test]
    fn result_keys_are_per_node() {
        let control = key(1);
        let (kn, km) = (result_key(&control, "n"), result_key(&control, "m"));
        assert_ne!(kn, km);
        assert_eq!(kn, result_key(&control, "n"), "deterministic");
        assert_ne!(kn, result_key(&key(3), "n"), "bound to the control key");
        let mut c = cmd();
        c.sign_ed25519("n", &control);
        let mut r = CommandResult {
            id: "1".into(),
            node: "n".into(),
            action: "reload".into(),
            status: Outcome::Ok,
            exit_code: Some(0),
            stdout: String::new(),
            stderr: String::new(),
            duration_ms: 1,
            reason: None,
            finished_at: 11,
            sig: None,
        };
        r.sign(&c, &kn);
        assert!(r.verify_for_control(&c, "n", &control));
        // Node m signing n's result with its own key: rejected.
        let mut forged = r.clone();
        forged.sign(&c, &km);
        assert!(!forged.verify_for_control(&c, "n", &control));
        // The text form round-trips; junk is refused with a kind.
        let text = crate::hex(&kn);
        assert_eq!(result_key_from_text(&format!(" {text}\n")).unwrap(), kn);
        assert_eq!(
            result_key_from_text("abc").unwrap_err().kind,
            KeyErrorKind::NotResultKey
        );
    }

    #[test]
    fn pem_round_trip_and_wrong_kinds() {
        let k = key(9);
        let private = signing_key_pem(&k);
        let public = verifying_key_pem(&k.verifying_key());
        assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert_eq!(
            signing_key_from_pem(&private).unwrap().to_bytes(),
            k.to_bytes()
        );
        assert_eq!(verifying_key_from_pem(&public).unwrap(), k.verifying_key());
        assert_eq!(
            signing_key_from_pem(&public).unwrap_err().kind,
            KeyErrorKind::NotEd25519Pem
        );
        assert!(verifying_key_from_pem(&private).is_err());
        assert!(verifying_key_from_pem("junk").is_err());
        assert!(!signing_key_from_pem("").unwrap_err().message.contains('\n'));
    }
}
