//! Writing the repository's files: `edgeform fmt`'s rewrites (canonical
//! formatting, [`crate::fmt`]) and the atomic write `build` and `import`
//! use.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::load;

/// `edgeform fmt [--check] [FILE...]` over the working tree at `root`
/// (`only` empty: every config file): exit 0 formatted (or already
/// canonical), 1 when `check` finds files to change or a file was refused.
///
/// # Errors
/// I/O errors; a file of `only` that is not a config file.
pub fn fmt(root: &Path, check: bool, only: &[PathBuf]) -> Result<u8> {
    let repo = load::from_dir(root)?;
    let wanted = |path: &str| {
        only.is_empty()
            || only
                .iter()
                .any(|o| Path::new(path) == o || root.join(path) == *o)
    };
    let mut changed = Vec::new();
    let mut refused = 0usize;
    let mut seen = 0usize;
    for source in repo.sources.iter().filter(|s| wanted(&s.path)) {
        seen += 1;
        let text = match &source.text {
            Ok(t) => t,
            Err(why) => {
                eprintln!("{}: {why}", source.path);
                refused += 1;
                continue;
            }
        };
        match crate::fmt::format(source.kind, text) {
            Ok(Some(out)) if out != *text => changed.push((source.path.clone(), out)),
            Ok(_) => {}
            Err(r) => {
                eprintln!("{}:{}: {}", source.path, r.line, r.message);
                refused += 1;
            }
        }
    }
    // Files named on the command line that are not config files: named,
    // and nothing is formatted.
    let strays: Vec<String> = only
        .iter()
        .filter(|o| {
            !repo
                .sources
                .iter()
                .any(|s| Path::new(&*s.path) == *o || root.join(&*s.path) == **o)
        })
        .map(|o| {
            let missing = if root.join(o).exists() || o.exists() {
                ""
            } else {
                " (no such file)"
            };
            format!("{}{missing}", o.display())
        })
        .collect();
    if !strays.is_empty() {
        bail!(
            "not a config file of {} (cluster.yaml, sites/, zones/, nodes/): {}; nothing was formatted",
            root.display(),
            strays.join(", ")
        );
    }
    if check {
        for (path, _) in &changed {
            println!("{path}");
        }
        if !changed.is_empty() {
            eprintln!(
                "{} file(s) not canonically formatted; run `edgeform fmt`",
                changed.len()
            );
        } else if refused == 0 {
            println!("canonical formatting: nothing to change ({seen} files)");
        }
        return Ok(u8::from(!changed.is_empty() || refused > 0));
    }
    for (path, out) in &changed {
        write_atomic(&root.join(&**path), out.as_bytes())?;
        println!("formatted {path}");
    }
    if refused > 0 {
        eprintln!("{refused} file(s) left as they are (see above)");
    } else if changed.is_empty() {
        println!("canonical formatting: nothing to change ({seen} files)");
    }
    Ok(u8::from(refused > 0))
}

/// Write `bytes` to `path` through a temporary file beside it renamed over
/// `path`: a reader sees the old content or the new, never a part.
///
/// # Errors
/// I/O errors, naming the file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir =
            std::env::temp_dir().join(format!("edgeform-write-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("edge-1.json");
        write_atomic(&f, b"old").unwrap();
        write_atomic(&f, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["edge-1.json"]);
        let e = write_atomic(&dir.join("missing/x.json"), b"x").unwrap_err();
        assert!(format!("{e:#}").contains("missing/x.tmp~"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
