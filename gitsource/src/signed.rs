//! `reconcile --require-signed-by FILE`: only a commit whose SSH
//! signature verifies against an OpenSSH allowed-signers file is applied.
//!
//! - [`AllowedSigners::parse`] (pure) checks the file the way
//!   `ssh-keygen -Y` reads it (principals, options, key type, key), so a
//!   malformed file is one error naming `file:line`, before anything runs.
//! - [`verify`] takes the commit's signature and signed payload from git2
//!   (`extract_signature`) and hands them to OpenSSH's own verifier,
//!   `ssh-keygen -Y find-principals` then `ssh-keygen -Y verify -n git`
//!   (exactly what `git verify-commit` runs with `gpg.format=ssh`),
//!   deciding on exit codes only. Validity options (`valid-after`,
//!   `valid-before`) are checked at the time of verification.
//! - A refused commit is a [`Refusal`] with a stable reason
//!   ([`Refusal::as_str`]) for logs and metrics.
//!
//! The tip is verified, and so is the history that leads to it
//! ([`verify_history`]): every commit reachable from the new commit and
//! not from the one a target has live (or, for a target without one, the
//! last good commit the state directory keeps) must verify, so a signed commit that was never merged (an allowed
//! signer's work in progress, force-pushed to the branch) or a signed tip
//! on top of an unsigned commit is refused. The descent itself (the new
//! commit contains the live one) is the gate's rule
//! ([`super::plan::Ancestry`]). GPG and X.509 signatures are refused
//! (`unsupported_signature`): the allowed-signers file holds SSH keys
//! only.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::remote::{decode_base64, key_type};

/// Key types an allowed-signers line may name.
const KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
];

/// Why an allowed-signers file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignersError {
    /// It cannot be read.
    Unreadable { path: PathBuf, cause: String },
    /// A line is malformed.
    Malformed {
        path: PathBuf,
        line: usize,
        what: LineError,
    },
    /// It names no signer at all (every commit would be refused).
    Empty { path: PathBuf },
}

/// What is wrong with one allowed-signers line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    /// Principals but no key.
    MissingKey,
    /// A key type OpenSSH does not know.
    UnknownKeyType(String),
    /// The key is not base64, or its blob names another type.
    BadKey,
    /// An option other than cert-authority, namespaces=, valid-after=,
    /// valid-before=.
    UnknownOption(String),
    /// An unterminated `"`.
    Unterminated,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingKey => write!(f, "expected `principals [options] key-type base64-key`"),
            Self::UnknownKeyType(t) => write!(f, "unknown key type `{t}`"),
            Self::BadKey => write!(f, "the key is not a valid base64 public key of its type"),
            Self::UnknownOption(o) => write!(
                f,
                "unknown option `{o}` (cert-authority, namespaces=, valid-after=, valid-before=)"
            ),
            Self::Unterminated => write!(f, "unterminated quote"),
        }
    }
}

impl fmt::Display for SignersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreadable { path, cause } => {
                write!(
                    f,
                    "allowed signers {}: cannot read it: {cause}",
                    path.display()
                )
            }
            Self::Malformed { path, line, what } => {
                write!(f, "{}:{line}: allowed signers: {what}", path.display())
            }
            Self::Empty { path } => write!(
                f,
                "allowed signers {}: names no signer, so no commit could be applied",
                path.display()
            ),
        }
    }
}

impl std::error::Error for SignersError {}

/// A checked allowed-signers file.
#[derive(Debug, Clone)]
pub struct AllowedSigners {
    pub path: PathBuf,
    /// How many signer lines it has.
    pub signers: usize,
}

impl AllowedSigners {
    /// Read and check the file.
    ///
    /// # Errors
    /// Unreadable, malformed (file:line) or empty.
    pub fn load(path: &Path) -> Result<Self, SignersError> {
        let text = std::fs::read_to_string(path).map_err(|e| SignersError::Unreadable {
            path: path.to_owned(),
            cause: e
                .to_string()
                .split(" (os error")
                .next()
                .unwrap_or_default()
                .to_owned(),
        })?;
        Self::parse(path, &text)
    }

    /// Pure: check the text of the file at `path`.
    ///
    /// # Errors
    /// The first malformed line, or no signer at all.
    pub fn parse(path: &Path, text: &str) -> Result<Self, SignersError> {
        let mut signers = 0;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            check_line(line).map_err(|what| SignersError::Malformed {
                path: path.to_owned(),
                line: i + 1,
                what,
            })?;
            signers += 1;
        }
        if signers == 0 {
            return Err(SignersError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            signers,
        })
    }
}

/// Split on whitespace, keeping `"…"` (with spaces) inside one field.
fn fields(line: &str) -> Result<Vec<&str>, LineError> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() {
            break;
        }
        let start = i;
        let mut quoted = false;
        while i < bytes.len() && (quoted || !bytes[i].is_ascii_whitespace()) {
            if bytes[i] == b'"' {
                quoted = !quoted;
            }
            i += 1;
        }
        if quoted {
            return Err(LineError::Unterminated);
        }
        out.push(&line[start..i]);
    }
    Ok(out)
}

fn check_options(options: &str) -> Result<(), LineError> {
    // Commas inside quotes belong to the value (namespaces="git,file").
    let mut quoted = false;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in options.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&options[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&options[start..]);
    for opt in parts {
        let name = opt.split_once('=').map_or(opt, |(n, _)| n);
        let ok = match name.to_ascii_lowercase().as_str() {
            "cert-authority" => !opt.contains('='),
            "namespaces" | "valid-after" | "valid-before" => {
                opt.split_once('=').is_some_and(|(_, v)| !v.is_empty())
            }
            _ => false,
        };
        if !ok {
            return Err(LineError::UnknownOption(opt.to_owned()));
        }
    }
    Ok(())
}

fn check_line(line: &str) -> Result<(), LineError> {
    let f = fields(line)?;
    // principals [options] type key [comment]
    let (ty, key) = match f.as_slice() {
        [_, ty, key, ..] if KEY_TYPES.contains(ty) => (*ty, *key),
        [_, options, ty, key, ..] if KEY_TYPES.contains(ty) => {
            check_options(options)?;
            (*ty, *key)
        }
        [_, options, ty, _, ..] if options.contains('=') || *options == "cert-authority" => {
            check_options(options)?;
            return Err(LineError::UnknownKeyType((*ty).to_owned()));
        }
        [_, ty, _, ..] => return Err(LineError::UnknownKeyType((*ty).to_owned())),
        _ => return Err(LineError::MissingKey),
    };
    match decode_base64(key) {
        Some(blob) if key_type(&blob) == Some(ty) => Ok(()),
        _ => Err(LineError::BadKey),
    }
}

// ------------------------------------------------------------- verifying

/// Why a commit is not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No signature at all.
    Unsigned,
    /// A GPG or X.509 signature (only SSH signatures are checked).
    UnsupportedSignature,
    /// An SSH signature by a key no allowed signer has (or unreadable).
    UnknownSigner,
    /// An allowed signer's key, but the signature does not verify (the
    /// commit was changed after signing, or the key is outside its
    /// validity or namespaces).
    BadSignature,
    /// Signed, but it does not descend from the last good commit (without
    /// `--allow-rollback`).
    NotDescendant { last_good: String },
    /// Signed, but a commit between the last good commit and it is not (`commit`, and that commit's own refusal reason).
    UnsignedHistory { commit: String, why: &'static str },
}

impl Refusal {
    /// A stable reason, for logs and metrics.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Unsigned => "unsigned",
            Self::UnsupportedSignature => "unsupported_signature",
            Self::UnknownSigner => "unknown_signer",
            Self::BadSignature => "bad_signature",
            Self::NotDescendant { .. } => "not_descendant",
            Self::UnsignedHistory { .. } => "unsigned_history",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotDescendant { last_good } => {
                return write!(
                    f,
                    "the commit does not descend from the last applied commit {last_good} \
                     (a force-moved or unmerged branch; --allow-rollback to move to it)"
                );
            }
            Self::UnsignedHistory { commit, why } => {
                return write!(
                    f,
                    "commit {commit} in its history is not signed by an allowed signer ({why})"
                );
            }
            Self::Unsigned => "the commit is not signed",
            Self::UnsupportedSignature => {
                "the commit has a GPG or X.509 signature; only SSH signatures are accepted"
            }
            Self::UnknownSigner => "the commit is not signed by a key in the allowed signers file",
            Self::BadSignature => "the commit's signature does not verify",
        })
    }
}

/// A commit `reconcile` refused to apply: which, why, and the last good
/// commit kept in its place (none yet in this process). The typed outcome
/// a caller (exit code, metrics) counts; it travels inside `anyhow` and
/// is found with `downcast_ref`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedCommit {
    pub commit: String,
    pub refusal: Refusal,
    pub kept: Option<String>,
}

impl fmt::Display for RefusedCommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused commit {}: {}; ", self.commit, self.refusal)?;
        match &self.kept {
            Some(good) => write!(f, "keeping the last good commit {good}"),
            None => write!(f, "nothing pushed, the edges keep what they have"),
        }
    }
}

impl std::error::Error for RefusedCommit {}

/// A verified commit: who signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub principal: String,
}

/// Check `commit`'s signature against `signers`.
///
/// `Ok(Err(refusal))` is a commit that must not be applied; `Err` is a
/// failure to check at all (no such commit, ssh-keygen missing).
///
/// # Errors
/// The commit cannot be read or `ssh-keygen` cannot run.
pub fn verify(
    repo: &git2::Repository,
    commit: &str,
    signers: &AllowedSigners,
) -> anyhow::Result<Result<Verified, Refusal>> {
    use anyhow::Context;
    let oid = repo
        .revparse_single(commit)
        .with_context(|| format!("no commit {commit}"))?
        .peel_to_commit()?
        .id();
    let (signature, payload) = match repo.extract_signature(&oid, None) {
        Ok(pair) => pair,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(Err(Refusal::Unsigned)),
        Err(e) => return Err(e).context("reading the commit's signature"),
    };
    if !signature.starts_with(b"-----BEGIN SSH SIGNATURE-----") {
        return Ok(Err(Refusal::UnsupportedSignature));
    }
    let dir = tempfile::tempdir().context("temp dir for the signature")?;
    let sig_path = dir.path().join("commit.sig");
    std::fs::write(&sig_path, &*signature).context("writing the signature")?;
    let found = Command::new("ssh-keygen")
        .args(["-Y", "find-principals", "-f"])
        .arg(&signers.path)
        .arg("-s")
        .arg(&sig_path)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .context("running ssh-keygen -Y find-principals (openssh-client)")?;
    if !found.status.success() {
        return Ok(Err(Refusal::UnknownSigner));
    }
    let principals = String::from_utf8_lossy(&found.stdout).into_owned();
    for principal in principals.lines().map(str::trim).filter(|p| !p.is_empty()) {
        let mut child = Command::new("ssh-keygen")
            .args(["-Y", "verify", "-n", "git", "-f"])
            .arg(&signers.path)
            .arg("-I")
            .arg(principal)
            .arg("-s")
            .arg(&sig_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("running ssh-keygen -Y verify (openssh-client)")?;
        if let Some(mut stdin) = child.stdin.take() {
            // A verifier that exits early closes the pipe: its exit code
            // tells.
            let _ = stdin.write_all(&payload);
        }
        if child.wait()?.success() {
            return Ok(Ok(Verified {
                principal: principal.to_owned(),
            }));
        }
    }
    Ok(Err(Refusal::BadSignature))
}

/// Every commit reachable from `to` and not from `from` (oldest first),
/// checked with [`verify`]: `Ok(Err((commit, refusal)))` names the first
/// that does not verify.
///
/// # Errors
/// The history cannot be walked, or `ssh-keygen` cannot run.
pub fn verify_history(
    repo: &git2::Repository,
    from: git2::Oid,
    to: git2::Oid,
    signers: &AllowedSigners,
) -> anyhow::Result<Result<(), (String, Refusal)>> {
    let mut walk = repo.revwalk()?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
    walk.push(to)?;
    walk.hide(from)?;
    for id in walk {
        let id = id?.to_string();
        if let Err(refusal) = verify(repo, &id, signers)? {
            return Ok(Err((id, refusal)));
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIBd3x1KHSv4bd2yJ5ZWJ2aEiS0uqGBv8FUFp4wGz2cGF";

    fn parse(text: &str) -> Result<AllowedSigners, SignersError> {
        AllowedSigners::parse(Path::new("/etc/edgeform/allowed_signers"), text)
    }

    fn line_error(text: &str) -> (usize, LineError) {
        match parse(text).unwrap_err() {
            SignersError::Malformed { line, what, .. } => (line, what),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn good_files_are_counted() {
        let s = parse(&format!(
            "# release managers\n\nalice@example.net ssh-ed25519 {ED} alice laptop\n\
             bob@example.net,carol@example.net namespaces=\"git,file\",valid-after=\"20260101\" \
             ssh-ed25519 {ED}\n*@example.net cert-authority ssh-ed25519 {ED}\n"
        ))
        .unwrap();
        assert_eq!(s.signers, 3);
    }

    #[test]
    fn malformed_lines_are_located() {
        assert_eq!(
            line_error(&format!("a ssh-ed25519 {ED}\nbob@example.net\n")),
            (2, LineError::MissingKey)
        );
        assert_eq!(
            line_error(&format!("a ssh-foo {ED}\n")),
            (1, LineError::UnknownKeyType("ssh-foo".into()))
        );
        assert_eq!(
            line_error("a ssh-ed25519 not*base64\n"),
            (1, LineError::BadKey)
        );
        // The blob names another type than the line.
        assert_eq!(
            line_error(&format!("a ssh-rsa {ED}\n")),
            (1, LineError::BadKey)
        );
        assert_eq!(
            line_error(&format!("a permit-all ssh-ed25519 {ED}\n")),
            (1, LineError::UnknownOption("permit-all".into()))
        );
        assert_eq!(
            line_error(&format!("a namespaces=\"git ssh-ed25519 {ED}\n")),
            (1, LineError::Unterminated)
        );
        let e = parse("a ssh-ed25519\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/edgeform/allowed_signers:1: allowed signers: expected `principals [options] \
             key-type base64-key`"
        );
        assert_eq!(
            parse("# nobody\n").unwrap_err(),
            SignersError::Empty {
                path: "/etc/edgeform/allowed_signers".into()
            }
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let e = AllowedSigners::load(Path::new("/nonexistent/allowed")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "allowed signers /nonexistent/allowed: cannot read it: No such file or directory"
        );
    }
}
