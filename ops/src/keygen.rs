//! `edgeform keygen`: the control host's ed25519 command key
//! pair, and each node's result key derived from it.
//!
//! The same private key can come from `openssl genpkey -algorithm ed25519
//! -out command.key` (and its public half from `openssl pkey -in
//! command.key -pubout -out command.key.pub`); `--result-key` reads
//! either.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use edgestate::cmdkey;

/// Write `text` to a new file `path` with `mode` (never overwriting).
fn create(path: &Path, mode: u32, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::anyhow!("`{}` exists; not overwritten", path.display())
            } else {
                anyhow::anyhow!("cannot create `{}`: {e}", path.display())
            }
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing `{}`", path.display()))
}

/// `edgeform keygen --out FILE [--result-key NODE --signing-key FILE]`.
///
/// # Errors
/// An existing output file, an unreadable or malformed signing key, no
/// randomness from the OS.
pub fn keygen(out: &Path, result_key: Option<&str>, signing_key: Option<&Path>) -> Result<u8> {
    if let Some(node) = result_key {
        if !edgestate::mqtt::is_topic_level(node) {
            bail!("--result-key {node}: not a node name");
        }
        let Some(from) = signing_key else {
            bail!(
                "--result-key needs --signing-key FILE (or EDGEFORM_COMMAND_SIGNING_KEY): the result key derives from the control key"
            );
        };
        let control = crate::mqtt::load_signing_key(from)?;
        let key = cmdkey::result_key(&control, node);
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        create(out, 0o600, &format!("{hex}\n"))?;
        eprintln!(
            "wrote {node}'s result key to {} (mode 0600): install it on {node} only, as agent.yaml mqtt.result_key_file",
            out.display()
        );
        return Ok(0);
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("no randomness from the OS: {e}"))?;
    let key = cmdkey::SigningKey::from_bytes(&seed);
    let public = PathBuf::from(format!("{}.pub", out.display()));
    if public.exists() {
        bail!("`{}` exists; not overwritten", public.display());
    }
    create(out, 0o600, &cmdkey::signing_key_pem(&key))?;
    create(
        &public,
        0o644,
        &cmdkey::verifying_key_pem(&key.verifying_key()),
    )?;
    eprintln!(
        "wrote the command signing key {} (mode 0600; the control host only) and its public key {} (every agent's mqtt.command_public_key_file)",
        out.display(),
        public.display()
    );
    Ok(0)
}
