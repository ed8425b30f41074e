//! `edgeform state export|import FILE`: every entry of the state store
//! (the state directory, or the shared store `--state-store` names) to one
//! encrypted file and back ([`control::store::export`]). Backup, restore,
//! and moving a state directory into a shared store: export with the
//! directory, import with `--state-store`. Nothing prints a value.

use std::path::{Path, PathBuf};

use anyhow::Result;

use control::store::export;

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Write every entry (node secrets, certificates and their keys, the
    /// ACME account, the last good commit, the purge outbox) to FILE
    /// (0600), encrypted with AES-GCM (a 256-bit key) under the key in
    /// EDGEFORM_STATE_KEY (32 bytes, base64).
    Export {
        /// The export file to write (replaced whole).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Write every entry of FILE (an export) into the store, replacing
    /// entries of the same name and leaving others. The file is opened
    /// with EDGEFORM_STATE_KEY and checked whole first: another key, an
    /// altered file or an invalid entry imports nothing (exit 1).
    Import {
        /// The export file to read (made by `state export`).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

/// Run `action` on the state store (`dir`: the state directory, when no
/// shared store is set).
///
/// # Errors
/// The store is unusable.
pub fn run(dir: &Path, action: &Action) -> Result<u8> {
    let key = match export::key_from_env() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(1);
        }
    };
    let where_ = control::store::describe(dir);
    match action {
        Action::Export { file } => {
            let Some(store) = control::store::open_existing(dir)? else {
                eprintln!("error: no state store: {where_} does not exist; nothing exported");
                return Ok(1);
            };
            match export::export_to(&*store, file, &key) {
                Ok(snap) => {
                    eprintln!(
                        "exported {} from {where_} to {}",
                        snap.summary(),
                        file.display()
                    );
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("error: {e}; nothing exported");
                    Ok(1)
                }
            }
        }
        Action::Import { file } => {
            let store = control::store::open(dir)?;
            match export::import_from(&*store, file, &key) {
                Ok(snap) => {
                    eprintln!(
                        "imported {} from {} into {where_}",
                        snap.summary(),
                        file.display()
                    );
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("error: {}: {e}", file.display());
                    Ok(1)
                }
            }
        }
    }
}
