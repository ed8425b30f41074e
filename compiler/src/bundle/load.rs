//! Reading `roles/` from the working tree (the I/O edge of bundles).
//!
//! A symbolic link is followed only when its target is inside the
//! repository (and is a file); one leaving it is an error. A file over
//! [`MAX_BUNDLE_FILE_BYTES`] is refused from its metadata, before reading.
//! Every problem is collected.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Error, ErrorKind, MAX_BUNDLE_FILE_BYTES, RoleFile, Roles, SmokeRequest};
use crate::model::raw::Role;

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
/// Every bad entry (links leaving the repository, files too large, folders
/// that are not roles, unreadable files, bad smoke files).
pub fn read_roles(root: &Path) -> Result<Roles, Vec<Error>> {
    let dir = root.join("roles");
    let mut roles = Roles::default();
    let mut errors = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(roles);
    };
    let repo = match root.canonicalize() {
        Ok(r) => r,
        Err(e) => {
            return Err(vec![error(
                ErrorKind::Unreadable,
                root.display().to_string(),
                e.to_string(),
            )]);
        }
    };
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
        let mut files = Vec::new();
        walk(&repo, &entry.path(), "", &name, 0, &mut files, &mut errors);
        files.sort_by(|a: &RoleFile, b| a.path.cmp(&b.path));
        roles.files.insert(name, files);
    }
    if errors.is_empty() {
        Ok(roles)
    } else {
        Err(errors)
    }
}

/// Folders deeper than this are refused (links can loop).
const MAX_DEPTH: usize = 16;

fn walk(
    repo: &Path,
    dir: &Path,
    rel: &str,
    role: &str,
    depth: usize,
    files: &mut Vec<RoleFile>,
    errors: &mut Vec<Error>,
) {
    let shown_dir = format!("roles/{role}/{rel}");
    let Ok(entries) = std::fs::read_dir(dir) else {
        errors.push(error(
            ErrorKind::Unreadable,
            shown_dir,
            "cannot list this folder",
        ));
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = format!("{rel}{name}");
        let shown = format!("roles/{role}/{path}");
        let p = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            errors.push(error(ErrorKind::Unreadable, shown, "cannot be read"));
            continue;
        };
        let meta = if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&p)
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            match p.canonicalize() {
                Ok(real) if real.starts_with(repo) => match std::fs::metadata(&real) {
                    Ok(m) if m.is_file() || m.is_dir() => m,
                    _ => {
                        errors.push(error(
                            ErrorKind::Unreadable,
                            shown,
                            format!("links to `{target}`, which is not a file or folder"),
                        ));
                        continue;
                    }
                },
                Ok(_) => {
                    errors.push(error(ErrorKind::SymlinkEscapes, shown, format!("is a link to `{target}`, outside the repository; nothing was built or installed")));
                    continue;
                }
                Err(_) => {
                    errors.push(error(
                        ErrorKind::Unreadable,
                        shown,
                        format!("is a link to `{target}`, which does not exist"),
                    ));
                    continue;
                }
            }
        } else {
            meta
        };
        if meta.is_dir() {
            if depth >= MAX_DEPTH {
                errors.push(error(
                    ErrorKind::Unreadable,
                    shown,
                    format!("more than {MAX_DEPTH} folders deep (a link loop?)"),
                ));
                continue;
            }
            walk(
                repo,
                &p,
                &format!("{path}/"),
                role,
                depth + 1,
                files,
                errors,
            );
            continue;
        }
        if !meta.is_file() {
            errors.push(error(ErrorKind::Unreadable, shown, "not a regular file"));
            continue;
        }
        if meta.len() > MAX_BUNDLE_FILE_BYTES {
            errors.push(error(
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
        match std::fs::read(&p) {
            Ok(bytes) if bytes.len() as u64 <= MAX_BUNDLE_FILE_BYTES => files.push(RoleFile {
                path,
                mode: meta.permissions().mode() & 0o777,
                bytes,
            }),
            Ok(_) => errors.push(error(
                ErrorKind::TooLarge,
                shown,
                "grew over the size limit while read",
            )),
            Err(e) => errors.push(error(ErrorKind::Unreadable, shown, e.to_string())),
        }
    }
}

fn read_smoke(path: &Path, shown: &str) -> Result<Vec<SmokeRequest>, Error> {
    let bad = |line: usize, column: usize, message: String| Error {
        kind: ErrorKind::BadSmoke,
        file: shown.to_owned(),
        line,
        column,
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(0, 0, e.to_string()))?;
    let tree = match yamlspan::parse(&text) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => return Err(bad(e.span.line as usize, e.span.column as usize, e.message)),
    };
    serde_json::from_value(tree.to_json()).map_err(|e| {
        bad(
            0,
            0,
            format!("a list of {{path, host, status, body}} requests: {e}"),
        )
    })
}
