use std::fs;
use std::os::unix::fs::symlink;

use super::*;
use crate::cache::file::write_cache_file;
use crate::cache::levels::Levels;

#[test]
fn never_follows_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, outside) = (tmp.path().join("cache"), tmp.path().join("outside"));
    fs::create_dir_all(cache.join("d")).unwrap();
    let levels = Levels::parse("1").unwrap();
    let target = write_cache_file(&outside, &levels, "httpexample.com/x", b"x").unwrap();
    symlink(&target, cache.join("link")).unwrap();
    symlink(target.parent().unwrap(), cache.join("dirlink")).unwrap();
    fs::write(cache.join("plain"), b"not a cache file").unwrap();

    let root = open_root(&cache).unwrap().unwrap();
    let listing = list(
        open_beneath(root.as_fd(), std::iter::empty::<&CStr>())
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(listing.files, [c"plain".to_owned()]);
    assert_eq!(listing.subdirs, [c"d".to_owned()]);

    let mut buf = Vec::new();
    assert_eq!(
        examine(root.as_fd(), c"link", &mut buf).unwrap(),
        Examined::Skipped
    );
    assert_eq!(
        examine(root.as_fd(), c"d", &mut buf).unwrap(),
        Examined::Skipped
    );
    assert_eq!(
        examine(root.as_fd(), c"gone", &mut buf).unwrap(),
        Examined::Skipped
    );
    assert_eq!(
        examine(root.as_fd(), c"plain", &mut buf).unwrap(),
        Examined::NotCache
    );
    assert!(open_subdir(root.as_fd(), c"dirlink").unwrap().is_none());
    assert!(open_beneath(root.as_fd(), [c"dirlink"]).unwrap().is_none());
    assert!(open_beneath(root.as_fd(), [c"d"]).unwrap().is_some());
    assert_eq!(
        stat_at(root.as_fd(), c"link").unwrap().unwrap().0,
        Kind::Other
    );
    assert!(open_root(&tmp.path().join("missing")).unwrap().is_none());

    // Through the real directory, the same file is a cache file.
    let real = open_root(target.parent().unwrap()).unwrap().unwrap();
    let name = CString::new(target.file_name().unwrap().as_encoded_bytes()).unwrap();
    let Examined::Key(line) = examine(real.as_fd(), &name, &mut buf).unwrap() else {
        panic!("not read as a cache file");
    };
    assert_eq!(&buf[line], b"KEY: httpexample.com/x");

    // Unlinking a symlink's name would remove the link, never the target;
    // the scanners do not even get there, as `examine` skipped it.
    assert!(unlink(root.as_fd(), c"link").unwrap());
    assert!(target.exists());
    assert!(!unlink(root.as_fd(), c"link").unwrap());
    assert!(!unlink(root.as_fd(), c"d").unwrap(), "never a directory");
}
