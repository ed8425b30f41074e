use std::path::Path;

use super::*;

#[test]
fn parses_nginx_syntax() {
    for (input, lens) in [
        ("1", &[1][..]),
        ("2", &[2]),
        ("1:2", &[1, 2]),
        ("2:2", &[2, 2]),
        ("1:1:2", &[1, 1, 2]),
        ("2:2:2", &[2, 2, 2]),
    ] {
        let levels = Levels::parse(input).unwrap();
        assert_eq!(levels.lens(), lens, "{input}");
        assert_eq!(levels.to_string(), input);
        assert_eq!(input.parse::<Levels>().unwrap(), levels);
    }
}

#[test]
fn refuses_what_nginx_refuses() {
    for (input, kind) in [
        ("", LevelsErrorKind::Empty),
        ("1:2:2:1", LevelsErrorKind::TooMany),
        ("3", LevelsErrorKind::BadLevel("3".into())),
        ("3:3", LevelsErrorKind::BadLevel("3".into())),
        ("0", LevelsErrorKind::BadLevel("0".into())),
        ("1:", LevelsErrorKind::BadLevel(String::new())),
        (":1", LevelsErrorKind::BadLevel(String::new())),
        ("1: 2", LevelsErrorKind::BadLevel(" 2".into())),
        ("12", LevelsErrorKind::BadLevel("12".into())),
        ("levels=1:2", LevelsErrorKind::BadLevel("levels=1".into())),
    ] {
        let err = Levels::parse(input).unwrap_err();
        assert_eq!(err.kind(), &kind, "{input:?}");
        assert_eq!(err.input(), input);
        assert!(err.to_string().contains(&format!("`{input}`")), "{err}");
    }
}

/// An example checked against a file a real nginx wrote.
#[test]
fn path_of_real_nginx_file() {
    let levels = Levels::parse("1:2").unwrap();
    let path = levels.path_for(Path::new("/c"), "http://127.0.0.1:18081/index.html");
    assert_eq!(path, Path::new("/c/3/90/562e7f8cbf8ce5fb4bd32f8006a58903"));
}

/// nginx's documented example (`levels=1:2`, md5 `b7f5…029c` → `c/29/`),
/// checked for every levels value through the name alone.
#[test]
fn levels_come_from_the_end_of_the_name() {
    let name = hashed_name(b"http://127.0.0.1:18081/index.html");
    assert_eq!(name.as_str(), "562e7f8cbf8ce5fb4bd32f8006a58903");
    for (levels, dirs) in [
        ("1", &["3"][..]),
        ("2", &["03"]),
        ("1:2", &["3", "90"]),
        ("2:2", &["03", "89"]),
        ("1:1:2", &["3", "0", "89"]),
        ("2:1:2", &["03", "9", "58"]),
    ] {
        let got: Vec<&str> = Levels::parse(levels).unwrap().dir_names(&name).collect();
        assert_eq!(got, dirs, "{levels}");
    }
}

#[test]
fn md5_of_empty_key() {
    assert_eq!(
        hashed_name(b"").as_str(),
        "d41d8cd98f00b204e9800998ecf8427e"
    );
}
