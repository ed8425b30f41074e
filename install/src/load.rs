//! Reading `roles/` from the working tree (the I/O edge of bundles).
//!
//! A symbolic link is refused wherever it points (a link into `.git/`
//! would ship the remote's URL; links to `.` make the walk explode), and so
//! is a shared object (by name or ELF header: `nginx -t` could load it). A
//! file over [`MAX_BUNDLE_FILE_BYTES`] is refused from its metadata, before
//! reading. The walk is bounded ([`MAX_DEPTH`] folders deep,
//! [`MAX_ENTRIES`] entries per role). Every problem is collected.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Error, ErrorKind, MAX_BUNDLE_FILE_BYTES, RoleFile, Roles, SmokeRequest};
use compiler::model::raw::Role;

fn error(kind: ErrorKind, file: String, message: impl Into<String>) -> Error {
    Error {
        kind,
        file,
        line: 0,
        column: 0,
        message: message.into(),
    }
}

const ROLES: [Role; 4] = [Role::Edge, Role::Ingest, Role::Origin, Role::Router];

fn is_role(name: &str) -> bool {
    ROLES.iter().any(|r| r.as_str() == name)
}

/// Read `<root>/roles/` (absent: no roles).
///
/// # Errors
/// Every bad entry (links, shared objects, files too large, folders that
/// are not roles, unreadable files, bad smoke files).
pub fn read_roles(root: &Path) -> Result<Roles, Vec<Error>> {
    let dir = root.join("roles");
    let mut roles = Roles::default();
    let mut errors = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(roles);
    };
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(vec![error(
            ErrorKind::Symlink,
            "roles".into(),
            "is a link; role folders hold no links",
        )]);
    }
    let mut names: Vec<_> = entries.filter_map(Result::ok).collect();
    names.sort_by_key(std::fs::DirEntry::file_name);
    for entry in names {
        let name = entry.file_name().to_string_lossy().into_owned();
        let shown = format!("roles/{name}");
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            errors.push(error(ErrorKind::Unreadable, shown, "cannot be read"));
            continue;
        };
        if meta.is_file() {
            if let Some(role) = name.strip_suffix(".smoke.yaml") {
                if !is_role(role) {
                    errors.push(error(
                        ErrorKind::UnknownRole,
                        shown,
                        format!("`{role}` is not a role (edge, ingest, origin, router)"),
                    ));
                    continue;
                }
                match read_smoke(&entry.path(), &shown) {
                    Ok(s) => {
                        roles.smoke.insert(role.to_owned(), s);
                    }
                    Err(e) => errors.push(e),
                }
            } else {
                errors.push(error(
                    ErrorKind::UnknownRole,
                    shown,
                    "roles/ holds one folder per role (and `<role>.smoke.yaml`)",
                ));
            }
            continue;
        }
        if !meta.is_dir() {
            errors.push(error(
                ErrorKind::Unreadable,
                shown,
                "a role must be a folder (not a link)",
            ));
            continue;
        }
        if !is_role(&name) {
            errors.push(error(
                ErrorKind::UnknownRole,
                shown,
                format!("`{name}` is not a role (edge, ingest, origin, router)"),
            ));
            continue;
        }
        let mut walk = Walk {
            role: &name,
            entries: 0,
            files: Vec::new(),
            errors: &mut errors,
        };
        walk.dir(&entry.path(), "", 0);
        let mut files = walk.files;
        files.sort_by(|a: &RoleFile, b| a.path.cmp(&b.path));
        roles.files.insert(name, files);
    }
    if errors.is_empty() {
        Ok(roles)
    } else {
        Err(errors)
    }
}

/// Folders deeper than this are refused.
pub const MAX_DEPTH: usize = 16;
/// Files and folders one role folder may hold.
pub const MAX_ENTRIES: usize = 10_000;

/// A shared object's name: `x.so`, `x.so.1`, `x.so.1.2`.
fn shared_object_name(name: &str) -> bool {
    let mut parts = name.split('.').skip(1).skip_while(|p| *p != "so");
    parts.next() == Some("so")
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

struct Walk<'a> {
    role: &'a str,
    entries: usize,
    files: Vec<RoleFile>,
    errors: &'a mut Vec<Error>,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path, rel: &str, depth: usize) {
        let shown_dir = format!("roles/{}/{rel}", self.role);
        let Ok(entries) = std::fs::read_dir(dir) else {
            self.errors.push(error(
                ErrorKind::Unreadable,
                shown_dir,
                "cannot list this folder",
            ));
            return;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                self.errors.push(error(
                    ErrorKind::TooLarge,
                    format!("roles/{}/", self.role),
                    format!("more than {MAX_ENTRIES} files and folders in one role folder"),
                ));
                return;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}{name}");
            let shown = format!("roles/{}/{path}", self.role);
            let p = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                self.errors
                    .push(error(ErrorKind::Unreadable, shown, "cannot be read"));
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                self.errors.push(error(
                    ErrorKind::Symlink,
                    shown,
                    format!(
                        "is a link to `{target}`; role folders hold no links (copy the file \
                         in); nothing was built or installed"
                    ),
                ));
                continue;
            }
            if meta.is_dir() {
                if depth >= MAX_DEPTH {
                    self.errors.push(error(
                        ErrorKind::TooLarge,
                        shown,
                        format!("more than {MAX_DEPTH} folders deep"),
                    ));
                    continue;
                }
                self.dir(&p, &format!("{path}/"), depth + 1);
                continue;
            }
            if !meta.is_file() {
                self.errors
                    .push(error(ErrorKind::Unreadable, shown, "not a regular file"));
                continue;
            }
            if meta.len() > MAX_BUNDLE_FILE_BYTES {
                self.errors.push(error(
                    ErrorKind::TooLarge,
                    shown,
                    format!(
                        "{} bytes, over the limit of {} bytes for a bundle file",
                        meta.len(),
                        MAX_BUNDLE_FILE_BYTES
                    ),
                ));
                continue;
            }
            let shared = |errors: &mut Vec<Error>, shown: String| {
                errors.push(error(
                    ErrorKind::SharedObject,
                    shown,
                    "is a shared object (or another ELF binary); role folders ship no \
                     compiled code (`check` would load it): install modules as packages",
                ));
            };
            if shared_object_name(&name) {
                shared(self.errors, shown);
                continue;
            }
            match read_regular(&p) {
                Ok(bytes) if bytes.len() as u64 > MAX_BUNDLE_FILE_BYTES => self.errors.push(error(
                    ErrorKind::TooLarge,
                    shown,
                    "grew over the size limit while read",
                )),
                Ok(bytes) if bytes.starts_with(b"\x7fELF") => shared(self.errors, shown),
                Ok(bytes) => self.files.push(RoleFile {
                    path,
                    mode: meta.permissions().mode() & 0o777,
                    bytes,
                }),
                Err(e) => self
                    .errors
                    .push(error(ErrorKind::Unreadable, shown, e.to_string())),
            }
        }
    }
}

/// A regular file's bytes, never through a link (`O_NOFOLLOW`), checked
/// regular on the descriptor.
fn read_regular(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(p)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    f.by_ref()
        .take(MAX_BUNDLE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The largest `roles/<role>.smoke.yaml` read.
const MAX_SMOKE_BYTES: usize = 1 << 20;

fn read_smoke(path: &Path, shown: &str) -> Result<Vec<SmokeRequest>, Error> {
    let bad = |line: usize, column: usize, message: String| Error {
        kind: ErrorKind::BadSmoke,
        file: shown.to_owned(),
        line,
        column,
        message,
    };
    // Read as every role file is: never through a link, never a FIFO,
    // at most MAX_SMOKE_BYTES (a list of requests is a few lines).
    let bytes = read_regular(path).map_err(|e| bad(0, 0, e.to_string()))?;
    if bytes.len() > MAX_SMOKE_BYTES {
        return Err(bad(
            0,
            0,
            format!("larger than {} KiB: refused", MAX_SMOKE_BYTES >> 10),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| bad(0, 0, "not UTF-8".into()))?;
    let tree = match yamlspan::parse(&text) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(bad(e.span.line as usize, e.span.column as usize, e.message)),
    };
    let requests: Vec<SmokeRequest> = serde_json::from_value(tree.to_json()).map_err(|e| {
        bad(
            0,
            0,
            format!("a list of {{path, host, status, body}} requests: {e}"),
        )
    })?;
    for (i, r) in requests.iter().enumerate() {
        if let Some(why) = smoke_problem(r) {
            return Err(bad(0, 0, format!("request {}: {why}", i + 1)));
        }
    }
    Ok(requests)
}

/// Why a smoke request cannot be sent as written: its path is appended
/// to the candidate's address (`http://127.0.0.1:8443` + path), so one not
/// starting with `/` would name another host (`@elsewhere/`); path and
/// host are one word of printable ASCII.
fn smoke_problem(r: &SmokeRequest) -> Option<String> {
    let word = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if !r.path.starts_with('/') || !word(&r.path) {
        return Some(format!(
            "path `{}` must start with `/` and hold printable ASCII only, no spaces",
            edgestate::untrusted::escape(&r.path)
        ));
    }
    if let Some(h) = &r.host
        && (!word(h) || h.contains(['/', '@']))
    {
        return Some(format!(
            "host `{}` must be a host name (printable ASCII, no spaces, `/` or `@`)",
            edgestate::untrusted::escape(h)
        ));
    }
    if !(100..=599).contains(&r.status) {
        return Some(format!("status {} is not an HTTP status", r.status));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_smoke_request_naming_another_host_or_holding_spaces_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("edge.smoke.yaml");
        for (yaml, why) in [
            (
                "- {path: \"@evil.test/x\", status: 200}\n",
                "must start with `/`",
            ),
            ("- {path: \"x\", status: 200}\n", "must start with `/`"),
            ("- {path: \"/a b\", status: 200}\n", "no spaces"),
            ("- {path: /, host: \"a\\r\\nX: y\", status: 200}\n", "host"),
            ("- {path: /, host: \"u@evil.test\", status: 200}\n", "host"),
            ("- {path: /, status: 1000}\n", "not an HTTP status"),
        ] {
            std::fs::write(&file, yaml).unwrap();
            let e = read_smoke(&file, "roles/edge.smoke.yaml").expect_err(yaml);
            assert!(e.message.contains(why), "{yaml}: {}", e.message);
        }
        std::fs::write(
            &file,
            "- {path: \"/health?x=1&y=2\", host: a.example, status: 200}\n",
        )
        .unwrap();
        assert_eq!(read_smoke(&file, "roles/edge.smoke.yaml").unwrap().len(), 1);
    }
}
