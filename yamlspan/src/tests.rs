use super::*;

fn json(text: &str) -> serde_json::Value {
    parse(text).unwrap().unwrap().to_json()
}

#[test]
fn core_schema_scalars() {
    let v = json(
        "a: off\nb: NO\nc: ~\nd:\ne: 0x1f\nf: 1.5e3\ng: '12'\nh: true\ni: -7\nj: yes\nk: .5\n",
    );
    assert_eq!(v["a"], "off");
    assert_eq!(v["b"], "NO");
    assert!(v["c"].is_null());
    assert!(v["d"].is_null());
    assert_eq!(v["e"], 31);
    assert_eq!(v["f"], 1500.0);
    assert_eq!(v["g"], "12");
    assert_eq!(v["h"], true);
    assert_eq!(v["i"], -7);
    assert_eq!(v["j"], "yes");
    assert_eq!(v["k"], 0.5);
}

#[test]
fn spans_point_at_values() {
    let text = "host: example.com\naliases:\n  - www.example.com\n  - \"cdn.example.com\"\n";
    let root = parse(text).unwrap().unwrap();
    let s = root.locate("/aliases/1");
    assert_eq!((s.line, s.column), (4, 5));
    assert_eq!(&text[s.start..s.end], "\"cdn.example.com\"");
    let s = root.locate("/host");
    assert_eq!((s.line, s.column), (1, 7));
    // A missing key points at its nearest existing ancestor.
    let s = root.locate("/aliases/9");
    assert_eq!(s.line, 3);
    assert_eq!(root.key_span("aliases").unwrap().line, 2);
}

#[test]
fn refusals() {
    let e = parse("a: 1\na: 2\n").unwrap_err();
    assert_eq!((e.kind, e.span.line), (ErrorKind::DuplicateKey, 2));
    let e = parse("a: 1\n---\nb: 2\n").unwrap_err();
    assert_eq!(e.kind, ErrorKind::MultipleDocuments);
    let e = parse("? [a]\n: 1\n").unwrap_err();
    assert_eq!(e.kind, ErrorKind::ComplexKey);
    let e = parse("a: [1, 2\nb: 3\n").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Syntax);
    assert!(e.span.line >= 1);
    let e = parse("a: !custom 1\n").unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnsupportedTag);
    assert_eq!(parse("# only a comment\n").unwrap(), None);
    assert_eq!(parse("").unwrap(), None);
}

#[test]
fn aliases_expand_and_billion_laughs_is_refused() {
    let v = json("a: &x [1, 2]\nb: *x\n");
    assert_eq!(v["b"], serde_json::json!([1, 2]));
    let mut text = String::from("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let prev = i - 1;
        text.push_str(&format!(
            "l{i}: &l{i} [*l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, \
             *l{prev}, *l{prev}, *l{prev}]\n"
        ));
    }
    let e = parse(&text).unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge);
}

#[test]
fn deep_nesting_is_refused() {
    let text = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(parse(&text).is_err());
}

#[test]
fn many_keys_stay_linear_and_duplicates_are_still_found() {
    use std::fmt::Write as _;
    let mut text = String::new();
    for i in 0..100_000 {
        let _ = writeln!(text, "k{i}: {i}");
    }
    let start = std::time::Instant::now();
    assert!(parse(&text).is_ok());
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    text.push_str("k5000: again\n");
    let e = parse(&text).unwrap_err();
    assert_eq!((e.kind, e.span.line), (ErrorKind::DuplicateKey, 100_001));
    assert!(e.message.contains("first at line 5001:1"), "{}", e.message);
}
