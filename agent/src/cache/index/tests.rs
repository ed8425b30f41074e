use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;

use regex::bytes::Regex;

use super::*;
use crate::cache::file::{header, read_key, write_cache_file};
use crate::cache::testutil::{Rng, SetOnDrop, copy_tree, tree};
use crate::cache::{Levels, PurgeStats};

fn levels() -> Levels {
    Levels::parse("1:2").unwrap()
}

fn layout(base: &Path, levels: Levels) -> Layout {
    Layout::new(vec![base.join("static"), base.join("dynamic")], levels)
}

fn host(re: &str) -> impl Fn(&[u8]) -> bool + Sync {
    let re = Regex::new(&format!("KEY:.*{re}")).unwrap();
    move |line: &[u8]| re.is_match(line)
}

/// Write `key`'s file in place (no rename), as `cp` would: truncate, write.
fn write_in_place(path: &Path, key: &str, body: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut bytes = header(key.as_bytes(), body.len(), 1_700_000_000).unwrap();
    bytes.extend_from_slice(body);
    fs::write(path, bytes).unwrap();
}

#[test]
fn indexes_existing_files() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    for i in 0..50 {
        write_cache_file(
            &layout.dirs[i % 2],
            &levels(),
            &format!("httph{}.com/{i}", i % 5),
            b"x",
        )
        .unwrap();
    }
    fs::write(layout.dirs[0].join("junk"), b"not a cache file").unwrap();
    let index = Index::build(layout).unwrap();
    let stats = index.stats();
    assert_eq!(stats.files, 50);
    assert!(stats.complete);
    assert_eq!(stats.rebuilds, 0);
    let purged = index.purge_matching(host(r"h1\.com/")).unwrap();
    assert_eq!(
        purged,
        PurgeStats {
            removed: 10,
            scanned: 50
        }
    );
    assert_eq!(index.stats().files, 40);
    assert_eq!(index.purge_matching(host(r"h1\.com/")).unwrap().removed, 0);
}

/// Files cached after the build — in new level directories (nginx makes
/// them lazily), renamed into place, written in place, or still being
/// written — are purged without any refresh in between.
#[test]
fn files_written_after_the_build_are_purged() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    fs::create_dir_all(&layout.dirs[0]).unwrap();
    let index = Index::build(layout.clone()).unwrap();
    assert_eq!(index.stats().files, 0);

    let renamed = write_cache_file(&layout.dirs[0], &levels(), "httpa.com/renamed", b"x").unwrap();
    let in_place = levels().path_for(&layout.dirs[1], "httpa.com/in-place");
    write_in_place(&in_place, "httpa.com/in-place", b"y");
    // Open, header written, not closed yet.
    let open_path = levels().path_for(&layout.dirs[0], "httpa.com/open");
    fs::create_dir_all(open_path.parent().unwrap()).unwrap();
    let mut open = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&open_path)
        .unwrap();
    open.write_all(&header(b"httpa.com/open", 1, 1_700_000_000).unwrap())
        .unwrap();
    let other = write_cache_file(&layout.dirs[0], &levels(), "httpb.com/kept", b"z").unwrap();

    let stats = index.purge_matching(host(r"a\.com/")).unwrap();
    assert_eq!(stats.removed, 3);
    assert!(!renamed.exists() && !in_place.exists() && !open_path.exists());
    assert!(other.exists());
    drop(open);
}

/// A file whose content changes in place to another key is judged by its
/// new key.
#[test]
fn content_replaced_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    let path = write_cache_file(&layout.dirs[0], &levels(), "httpa.com/x", b"x").unwrap();
    let index = Index::build(layout).unwrap();
    write_in_place(&path, "httpb.com/x", b"x");
    assert_eq!(index.purge_matching(host(r"a\.com/")).unwrap().removed, 0);
    assert!(path.exists());
    assert_eq!(index.purge_matching(host(r"b\.com/")).unwrap().removed, 1);
    assert!(!path.exists());
}

#[test]
fn files_removed_behind_its_back() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    let mut paths = Vec::new();
    for i in 0..20 {
        paths.push(
            write_cache_file(&layout.dirs[0], &levels(), &format!("httpa.com/{i}"), b"x").unwrap(),
        );
    }
    let index = Index::build(layout.clone()).unwrap();
    for path in &paths[..10] {
        fs::remove_file(path).unwrap();
    }
    // A whole level directory too.
    let level = paths[10].parent().unwrap().parent().unwrap();
    let gone = paths[10..].iter().filter(|p| p.starts_with(level)).count() as u64;
    fs::remove_dir_all(level).unwrap();
    let stats = index.purge_matching(host(r"a\.com/")).unwrap();
    assert_eq!(stats.removed, 10 - gone);
    assert_eq!(index.stats().files, 0);
}

/// Directories deleted and re-created (ext4 reuses inode numbers), moved
/// out of the cache (whose files must then be left alone), moved in, and
/// a configured dir replaced or appearing late.
#[test]
fn directories_come_and_go() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = Layout::new(
        vec![tmp.path().join("static"), tmp.path().join("late")],
        levels(),
    );
    let dir = layout.dirs[0].clone();
    let a = write_cache_file(&dir, &levels(), "httpa.com/1", b"x").unwrap();
    let index = Index::build(layout.clone()).unwrap();

    // Re-created level dir with a new file inside.
    let level = a.parent().unwrap().parent().unwrap().to_path_buf();
    fs::remove_dir_all(&level).unwrap();
    fs::create_dir_all(a.parent().unwrap()).unwrap();
    write_in_place(&a, "httpa.com/1", b"again");
    // A level dir moved out of the cache, and one moved in.
    let b = write_cache_file(&dir, &levels(), "httpa.com/moved-out", b"x").unwrap();
    index.refresh();
    let outside = tmp.path().join("outside");
    fs::create_dir_all(&outside).unwrap();
    let b_level = b.parent().unwrap().parent().unwrap();
    let moved_out = outside.join("level");
    let moved_file = moved_out.join(b.strip_prefix(b_level).unwrap());
    if b_level != level {
        fs::rename(b_level, &moved_out).unwrap();
    }
    let incoming = tmp.path().join("incoming");
    let c = write_cache_file(&incoming, &levels(), "httpa.com/moved-in", b"x").unwrap();
    let c_level = c.parent().unwrap().parent().unwrap();
    let c_dest = dir.join(c_level.file_name().unwrap());
    let moved_in = c_dest.join(c.strip_prefix(c_level).unwrap());
    if !c_dest.exists() {
        fs::rename(c_level, &c_dest).unwrap();
    }
    // The late configured dir appears.
    let d = write_cache_file(&layout.dirs[1], &levels(), "httpa.com/late", b"x").unwrap();

    let stats = index.purge_matching(host(r"a\.com/")).unwrap();
    assert!(!a.exists() && !d.exists() && !moved_in.exists());
    if b_level != level {
        assert!(moved_file.exists(), "moved out of the cache: not purged");
        assert_eq!(stats.removed, 3);
    }

    // The configured dir itself replaced by another.
    fs::rename(&dir, tmp.path().join("static.old")).unwrap();
    let e = write_cache_file(&dir, &levels(), "httpa.com/new-root", b"x").unwrap();
    let f = write_cache_file(
        &tmp.path().join("static.old"),
        &levels(),
        "httpa.com/old-root",
        b"x",
    )
    .unwrap();
    let stats = index.purge_matching(host(r"a\.com/")).unwrap();
    assert_eq!(stats.removed, 1);
    assert!(!e.exists() && f.exists());
}

#[test]
fn symlinks_are_not_indexed() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    let outside = tmp.path().join("outside");
    let target = write_cache_file(&outside, &levels(), "httpa.com/outside", b"x").unwrap();
    fs::create_dir_all(&layout.dirs[0]).unwrap();
    symlink(&target, layout.dirs[0].join("before")).unwrap();
    symlink(&outside, layout.dirs[0].join("dir-before")).unwrap();
    let index = Index::build(layout.clone()).unwrap();
    symlink(&target, layout.dirs[0].join("after")).unwrap();
    symlink(&outside, layout.dirs[0].join("dir-after")).unwrap();
    assert_eq!(
        index.purge_matching(|_: &[u8]| true).unwrap(),
        PurgeStats::default()
    );
    assert!(target.exists());
    assert_eq!(index.stats().files, 0);
}

/// More events than the kernel queues (16384 by default): the overflow
/// triggers a rebuild, and the purge is still exact.
#[test]
fn queue_overflow_rebuilds() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    let kept = write_cache_file(&layout.dirs[0], &levels(), "httpb.com/kept", b"x").unwrap();
    let index = Index::build(layout.clone()).unwrap();
    let max: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16_384);
    let dir = kept.parent().unwrap();
    let mut files: Vec<fs::File> = (0..2)
        .map(|i| fs::File::create(dir.join(format!("noise{i}"))).unwrap())
        .collect();
    // Alternate between two files: identical consecutive events merge.
    for i in 0..=max {
        files[i % 2].write_all(b"x").unwrap();
    }
    drop(files);
    let new = write_cache_file(&layout.dirs[1], &levels(), "httpa.com/new", b"x").unwrap();
    let stats = index.purge_matching(host(r"a\.com/")).unwrap();
    assert_eq!(stats.removed, 1);
    assert!(!new.exists() && kept.exists());
    assert_eq!(index.stats().rebuilds, 1);
    assert!(index.stats().complete);
}

#[test]
fn purge_keys_is_the_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = layout(tmp.path(), levels());
    let index = Index::build(layout.clone()).unwrap();
    let a = write_cache_file(&layout.dirs[1], &levels(), "httpa.com/1", b"x").unwrap();
    assert_eq!(
        index.purge_keys(&["httpa.com/1"]).unwrap(),
        PurgeStats {
            removed: 1,
            scanned: 1
        }
    );
    assert!(!a.exists());
    index.refresh();
    assert_eq!(index.stats().files, 0);
}

#[test]
fn file_names() {
    let md5 = c"562e7f8cbf8ce5fb4bd32f8006a58903";
    assert!(matches!(FileName::new(md5), FileName::Md5(_)));
    assert_eq!(FileName::new(md5).to_c_string().as_c_str(), md5);
    for other in [
        c"562E7F8CBF8CE5FB4BD32F8006A58903",
        c"562e7f8c.tmp",
        c"",
        c"562e7f8cbf8ce5fb4bd32f8006a5890g",
    ] {
        assert!(
            matches!(FileName::new(other), FileName::Other(_)),
            "{other:?}"
        );
        assert_eq!(FileName::new(other).to_c_string().as_c_str(), other);
    }
}

/// The contract: on random workloads — files added, rewritten, removed,
/// renamed, truncated; level dirs removed, moved in and out; symlinks and
/// junk — the index removes exactly what a scan of an identical copy
/// removes, and leaves no matching cache file behind.
///
/// `EDGEFORM_INDEX_SEEDS=200` runs more seeds than the default six.
#[test]
fn random_workloads_match_the_scan() {
    let seeds = std::env::var("EDGEFORM_INDEX_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    for seed in 0..seeds {
        random_workload(seed);
    }
}

fn random_workload(seed: u64) {
    let mut rng = Rng::new(seed);
    // tmpfs where there is one: creating files on a loaded disk is slow,
    // and the inotify behaviour is the same.
    let tmp = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let lv = Levels::parse(["1", "1:1", "1:2", "2"][rng.below(4)]).unwrap();
    let live = tmp.path().join("live");
    let layout = layout(&live, lv);
    let outside = tmp.path().join("outside");
    let outside_file = write_cache_file(&outside, &lv, "httph0.com/outside", b"x").unwrap();
    let key = |rng: &mut Rng| format!("httph{}.com/{}", rng.below(5), rng.below(300));
    for _ in 0..150 {
        let k = key(&mut rng);
        write_cache_file(&layout.dirs[rng.below(2)], &lv, &k, b"initial").unwrap();
    }
    let index = Index::build(layout.clone()).unwrap();

    for round in 0..10 {
        for _ in 0..rng.below(60) {
            let dir = &layout.dirs[rng.below(2)];
            let k = key(&mut rng);
            let path = lv.path_for(dir, &k);
            let existing: Vec<String> = tree(dir)
                .into_iter()
                .filter(|p| !p.ends_with('/'))
                .collect();
            let pick = |rng: &mut Rng| existing.get(rng.below(existing.len())).map(|p| dir.join(p));
            match rng.below(12) {
                0..=2 => drop(write_cache_file(dir, &lv, &k, b"new")),
                3 => write_in_place(&path, &k, b"in place"),
                // A foreign key at this path (as an md5 collision would be).
                4 => write_in_place(&path, &key(&mut rng), b"collision"),
                5 => {
                    if let Some(p) = pick(&mut rng) {
                        let _ = fs::remove_file(p);
                    }
                }
                6 => {
                    // nginx's temporary names, or a file moved elsewhere.
                    if let Some(p) = pick(&mut rng) {
                        let _ = fs::rename(&p, p.with_extension("0000000001"));
                    }
                }
                7 => {
                    if let Some(p) = pick(&mut rng) {
                        let _ = OpenOptions::new()
                            .write(true)
                            .open(p)
                            .and_then(|f| f.set_len(rng.below(400) as u64));
                    }
                }
                8 => {
                    let entries: Vec<_> =
                        fs::read_dir(dir).into_iter().flatten().flatten().collect();
                    if let Some(e) = entries.get(rng.below(entries.len())) {
                        if rng.below(2) == 0 {
                            let _ = fs::remove_dir_all(e.path());
                        } else {
                            let _ = fs::rename(
                                e.path(),
                                outside.join(format!("moved-{round}-{}", rng.below(1000))),
                            );
                        }
                    }
                }
                9 => {
                    // A level dir moved in from outside, full of cache files.
                    let staging = tmp.path().join(format!("staging-{}", rng.next_u64()));
                    for _ in 0..5 {
                        write_cache_file(&staging, &lv, &key(&mut rng), b"moved in").unwrap();
                    }
                    for e in fs::read_dir(&staging).unwrap().flatten() {
                        let _ = fs::create_dir_all(dir);
                        if !dir.join(e.file_name()).exists() {
                            fs::rename(e.path(), dir.join(e.file_name())).unwrap();
                        }
                    }
                }
                10 => {
                    let _ = fs::create_dir_all(dir);
                    let name = format!("link-{}", rng.next_u64());
                    let target = if rng.below(2) == 0 {
                        outside_file.clone()
                    } else {
                        outside.clone()
                    };
                    symlink(target, dir.join(name)).unwrap();
                }
                _ => {
                    let _ = fs::create_dir_all(dir);
                    let _ = fs::write(
                        dir.join(format!("junk-{}", rng.below(50))),
                        b"KEY: httph0.com/x\n",
                    );
                }
            }
        }
        if rng.below(3) == 0 {
            index.refresh();
        }
        let copy = tmp.path().join(format!("copy-{round}"));
        copy_tree(&live, &copy);
        let scan = layout_of(&copy, lv);

        let (index_stats, scan_stats) = if rng.below(4) == 0 {
            let keys: Vec<String> = (0..5).map(|_| key(&mut rng)).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            (
                index.purge_keys(&keys).unwrap(),
                scan.purge_keys(&keys).unwrap(),
            )
        } else {
            let re = format!(r"h{}\.com/{}", rng.below(5), ["", "1", "2"][rng.below(3)]);
            (
                index.purge_matching(host(&re)).unwrap(),
                scan.purge_matching(host(&re)).unwrap(),
            )
        };
        assert_eq!(
            index_stats.removed, scan_stats.removed,
            "seed {seed} round {round}"
        );
        assert_eq!(tree(&live), tree(&copy), "seed {seed} round {round}");
        assert!(outside_file.exists());
        fs::remove_dir_all(&copy).unwrap();
    }
    // And what is left is exactly what the index holds.
    index.refresh();
    let cache_files = layout
        .dirs
        .iter()
        .flat_map(|d| tree(d).into_iter().map(move |p| d.join(p)))
        .filter(|p| {
            fs::symlink_metadata(p).is_ok_and(|m| m.is_file()) && read_key(p).unwrap().is_some()
        })
        .count() as u64;
    assert_eq!(index.stats().files, cache_files, "seed {seed}");
}

fn layout_of(base: &Path, levels: Levels) -> Layout {
    layout(base, levels)
}

/// What the index cannot vouch for (here a configured dir that is a file),
/// it leaves to the scan: same removals, same error.
#[test]
fn incomplete_index_falls_back_to_the_scan() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    fs::write(&file, b"").unwrap();
    let good = tmp.path().join("good");
    let a = write_cache_file(&good, &levels(), "httpa.com/1", b"x").unwrap();
    let index = Index::build(Layout::new(vec![file.clone(), good], levels())).unwrap();
    assert!(!index.stats().complete);
    let err = index.purge_matching(host(r"a\.com/")).unwrap_err();
    assert!(err.to_string().contains(file.to_str().unwrap()), "{err}");
    assert!(!a.exists());
}

/// Purging while nginx-like writers and deleters run: no error, no panic,
/// and afterwards the index agrees with the disk.
#[test]
fn concurrent_churn() {
    let tmp = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let layout = layout(tmp.path(), levels());
    let index = Index::build(layout.clone()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("httph{}.com/{}", i % 3, i % 400);
                let dir = &layout.dirs[(i % 2) as usize];
                if let (Ok(path), 0) = (write_cache_file(dir, &levels(), &key, b"x"), i % 5) {
                    let _ = fs::remove_file(path);
                }
                if i.is_multiple_of(300) {
                    let _ = fs::remove_dir_all(dir.join(format!("{:x}", i % 16)));
                }
                i += 1;
            }
        });
        let _stop = SetOnDrop(&stop);
        for i in 0..20 {
            index
                .purge_matching(host(&format!(r"h{}\.com/", i % 3)))
                .unwrap();
            if i % 4 == 0 {
                index.refresh();
            }
        }
    });
    // Quiet now: one more purge must leave no matching file behind.
    index.purge_matching(host(r"h1\.com/")).unwrap();
    let scan = layout.purge_matching(host(r"h1\.com/")).unwrap();
    assert_eq!(scan.removed, 0);
    assert!(index.stats().complete);
}
