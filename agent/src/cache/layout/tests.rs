use std::fs;
use std::os::unix::fs::symlink;

use regex::bytes::Regex;

use super::*;
use crate::cache::file::{read_key, write_cache_file};
use crate::cache::testutil::{SetOnDrop, tree};

fn levels() -> Levels {
    Levels::parse("1:2").unwrap()
}

/// Two cache dirs and a third that does not exist.
fn layout(tmp: &Path) -> Layout {
    Layout::new(
        vec![tmp.join("static"), tmp.join("dynamic"), tmp.join("missing")],
        levels(),
    )
}

fn seed_regex(host: &str) -> impl Fn(&[u8]) -> bool + Sync {
    let re = Regex::new(&format!("KEY:.*{}", regex::escape(host))).unwrap();
    move |line: &[u8]| re.is_match(line)
}

#[test]
fn exact_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    let a = write_cache_file(&layout.dirs[0], &levels(), "httpexample.com/a", b"a").unwrap();
    let a2 = write_cache_file(&layout.dirs[1], &levels(), "httpexample.com/a", b"a").unwrap();
    let b = write_cache_file(&layout.dirs[0], &levels(), "httpexample.com/b", b"b").unwrap();

    let stats = layout
        .purge_keys(&["httpexample.com/a", "httpexample.com/none"])
        .unwrap();
    assert_eq!(
        stats,
        PurgeStats {
            removed: 2,
            scanned: 2
        }
    );
    assert!(!a.exists() && !a2.exists());
    assert!(b.exists());
    // Idempotent: the second run finds nothing.
    let stats = layout.purge_keys(&["httpexample.com/a"]).unwrap();
    assert_eq!(stats, PurgeStats::default());
}

/// A file at a key's path holding another key (an md5 collision, or a
/// foreign file) is left alone; so is anything that is not a regular file.
#[test]
fn exact_key_checks_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    let dir = &layout.dirs[0];
    let other = write_cache_file(dir, &levels(), "httpexample.com/other", b"o").unwrap();
    let path = levels().path_for(dir, "httpexample.com/x");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::rename(&other, &path).unwrap();
    let stats = layout.purge_keys(&["httpexample.com/x"]).unwrap();
    assert_eq!(
        stats,
        PurgeStats {
            removed: 0,
            scanned: 1
        }
    );
    assert!(path.exists());

    fs::write(&path, b"garbage").unwrap();
    assert_eq!(
        layout.purge_keys(&["httpexample.com/x"]).unwrap().removed,
        0
    );
    assert!(path.exists());
}

#[test]
fn exact_key_never_follows_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    let outside = tmp.path().join("outside");
    let key = "httpexample.com/x";
    let target = write_cache_file(&outside, &levels(), key, b"x").unwrap();

    // A symlink where the file would be.
    let path = levels().path_for(&layout.dirs[0], key);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    symlink(&target, &path).unwrap();
    // A symlinked level directory in the other dir.
    let level1 = layout.dirs[1].join(
        path.parent()
            .unwrap()
            .parent()
            .unwrap()
            .file_name()
            .unwrap(),
    );
    fs::create_dir_all(&layout.dirs[1]).unwrap();
    symlink(target.parent().unwrap().parent().unwrap(), &level1).unwrap();
    assert!(
        levels().path_for(&layout.dirs[1], key).exists(),
        "reachable through the link"
    );

    let stats = layout.purge_keys(&[key]).unwrap();
    assert_eq!(stats, PurgeStats::default());
    assert!(target.exists());
    assert!(fs::symlink_metadata(&path).unwrap().is_symlink());
}

#[test]
fn pattern_purge_matches_the_key_line() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    let mut expect_kept = Vec::new();
    let mut expect_gone = Vec::new();
    for i in 0..40 {
        let dir = &layout.dirs[i % 2];
        let (host, gone) = match i % 4 {
            0 => ("example.com", true),
            1 => ("www.example.com", true),
            2 => ("example.org", false),
            _ => ("examplexcom.net", false),
        };
        // Bodies and upstream headers that mention the host do not count.
        let body = format!("see KEY: http{host}/elsewhere and example.com");
        let path = write_cache_file(
            dir,
            &levels(),
            &format!("https{host}/{i}.js"),
            body.as_bytes(),
        )
        .unwrap();
        if gone {
            expect_gone.push(path)
        } else {
            expect_kept.push(path)
        }
    }
    let stats = layout.purge_matching(seed_regex("example.com")).unwrap();
    assert_eq!(
        stats,
        PurgeStats {
            removed: 20,
            scanned: 40
        }
    );
    assert!(expect_gone.iter().all(|p| !p.exists()));
    assert!(expect_kept.iter().all(|p| p.exists()));
    // The level directories stay: nginx reuses them.
    assert!(expect_gone.iter().all(|p| p.parent().unwrap().is_dir()));
}

/// The line handed to `matches` is exactly `KEY: <key>`.
#[test]
fn matcher_sees_grep_line() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    write_cache_file(&layout.dirs[0], &levels(), "httpexample.com/a?b=1", b"x").unwrap();
    let seen = std::sync::Mutex::new(Vec::new());
    layout
        .purge_matching(|line: &[u8]| {
            seen.lock().unwrap().push(line.to_vec());
            false
        })
        .unwrap();
    assert_eq!(
        seen.into_inner().unwrap(),
        [b"KEY: httpexample.com/a?b=1".to_vec()]
    );
    let anchored = Regex::new(r"^KEY: httpexample\.com/a\?b=1$").unwrap();
    assert_eq!(
        layout
            .purge_matching(|l: &[u8]| anchored.is_match(l))
            .unwrap()
            .removed,
        1
    );
}

/// Symlinks to files and to directories outside the cache, foreign files
/// and special files: none is read or removed, nothing outside changes.
#[test]
fn pattern_purge_stays_inside() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    let dir = &layout.dirs[0];
    let outside = tmp.path().join("outside");
    let target = write_cache_file(&outside, &levels(), "httpexample.com/outside", b"o").unwrap();
    write_cache_file(dir, &levels(), "httpexample.com/inside", b"i").unwrap();
    symlink(&target, dir.join("file-link")).unwrap();
    symlink(&outside, dir.join("dir-link")).unwrap();
    fs::write(dir.join("notes.txt"), b"KEY: example.com\n").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        dir.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR,
        0,
    )
    .unwrap();
    let before_outside = tree(&outside);

    let stats = layout.purge_matching(seed_regex("example.com")).unwrap();
    assert_eq!(
        stats,
        PurgeStats {
            removed: 1,
            scanned: 2
        }
    );
    assert_eq!(tree(&outside), before_outside);
    let left = tree(dir);
    for name in ["file-link@", "dir-link@", "notes.txt", "fifo"] {
        assert!(left.contains(name), "{name} in {left:?}");
    }
}

/// Without `levels` all files share one directory: read in parallel chunks.
#[test]
fn flat_and_deep_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("flat");
    let one = Levels::parse("2").unwrap();
    for i in 0..600 {
        write_cache_file(&dir, &one, &format!("httph{}.example/{i}", i % 3), b"x").unwrap();
    }
    // Deeper than nginx ever goes, still within the scan depth.
    let deep = dir.join("a/b/c/d/e");
    write_cache_file(&deep, &one, "httph0.example/deep", b"x").unwrap();
    let layout = Layout::new(vec![dir.clone()], one);
    let stats = layout.purge_matching(seed_regex("h0.example/")).unwrap();
    assert_eq!(stats.removed, 201);
    assert_eq!(stats.scanned, 601);
    assert!(
        read_key(&one.path_for(&dir, "httph1.example/1"))
            .unwrap()
            .is_some()
    );
}

#[test]
fn missing_dirs_are_empty() {
    let layout = Layout::new(vec!["/nonexistent/edgeform".into()], levels());
    assert_eq!(
        layout.purge_matching(|_: &[u8]| true).unwrap(),
        PurgeStats::default()
    );
    assert_eq!(layout.purge_keys(&["x"]).unwrap(), PurgeStats::default());
}

/// A configured dir that is a file is an error naming it; the other dirs
/// are still purged.
#[test]
fn errors_name_the_path_and_do_not_stop_the_purge() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    fs::write(&file, b"").unwrap();
    let good = tmp.path().join("good");
    let path = write_cache_file(&good, &levels(), "httpexample.com/a", b"a").unwrap();
    let layout = Layout::new(vec![file.clone(), good], levels());
    let err = layout.purge_matching(|_: &[u8]| true).unwrap_err();
    assert!(err.to_string().contains(file.to_str().unwrap()), "{err}");
    assert!(err.to_string().contains("1 removed"), "{err}");
    assert!(!path.exists());
    let err = layout.purge_keys(&["httpexample.com/a"]).unwrap_err();
    assert!(err.to_string().contains(file.to_str().unwrap()), "{err}");
}

/// nginx keeps writing and deleting while a purge runs: entries vanishing
/// mid-scan are skipped, never errors.
#[test]
fn concurrent_churn() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path());
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("httpexample.com/{}", i % 500);
                // Like nginx's, a write fails when a purge removed its
                // temporary file (same key) before the rename.
                let written =
                    write_cache_file(&layout.dirs[(i % 2) as usize], &levels(), &key, b"x");
                if let (Ok(path), 0) = (written, i % 3) {
                    let _ = fs::remove_file(path);
                }
                if i.is_multiple_of(200) {
                    let _ = fs::remove_dir_all(layout.dirs[1].join(format!("{:x}", i % 16)));
                }
                i += 1;
            }
        });
        let _stop = SetOnDrop(&stop);
        for _ in 0..30 {
            layout.purge_matching(seed_regex("example.com")).unwrap();
            layout
                .purge_keys(&["httpexample.com/1", "httpexample.com/2"])
                .unwrap();
        }
    });
}
