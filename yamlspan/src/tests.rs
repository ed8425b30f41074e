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
fn aliases_of_a_large_string_are_refused_by_the_text_they_copy() {
    // 1,000 aliases of a 1 MiB string: few values, a gigabyte of text.
    let mut text = format!("x: &s \"{}\"\ny: [", "A".repeat(1 << 20));
    text.push_str(&vec!["*s"; 1000].join(", "));
    text.push_str("]\n");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge);
    assert!(e.message.contains("aliases copy more than 64 MiB"), "{e:?}");
    // At the first alias past the cap, line 2.
    assert_eq!(e.span.line, 2);
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

#[test]
fn tags_are_refused_on_collections_as_on_scalars() {
    for text in [
        "geo_codes: !env [GB]\n",
        "geo_codes: [!env GB]\n",
        "a: !env {b: 1}\n",
        "a: !custom\n  - x\n",
        "a: !custom\n  b: 1\n",
        "a: !!map [x]\n",
        "a: !!seq {b: 1}\n",
        "a: !!str [x]\n",
        "a: !!int abc\n",
        "a: !!binary aGk=\n",
        "a: !!bool 3\n",
        "!env\nb: 1\n",
    ] {
        let e = parse(text).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnsupportedTag, "{text:?}: {e:?}");
        assert!(e.span.line >= 1, "{text:?}");
    }
    let v = json("a: !!seq [1]\nb: !!map {c: 1}\nd: !!str 12\ne: !!int 7\nf: !!float 1\n");
    assert_eq!(v["a"], serde_json::json!([1]));
    assert_eq!(v["b"]["c"], 1);
    assert_eq!(v["d"], "12");
    assert_eq!(v["e"], 7);
    assert_eq!(v["f"], 1.0);
}

/// The YAML test suite's invalid cases the parser accepts by itself
/// (github.com/yaml/yaml-test-suite, `fail: true`), and their valid
/// neighbours.
#[test]
fn yaml_test_suite_wrongly_indented_flow_content_is_refused() {
    // The suite's three the parser accepts: refused by the span check.
    for (case, text, line) in [
        ("9C9N", "---\nflow: [a,\nb,\nc]\n", 3),
        ("DK95/01", "foo: \"bar\n\tbaz\"\n", 2),
        ("QB6E", "---\nquoted: \"a\nb\nc\"\n", 3),
    ] {
        let e = parse(text).unwrap_err();
        assert_eq!(
            (e.kind, e.span.line),
            (ErrorKind::Indentation, line),
            "{case}: {e:?}"
        );
    }
    // Shapes around them: refused by the check or the parser itself.
    for (case, text, line) in [
        ("nested", "a:\n  b: [x,\n  y]\n", 3),
        ("in a sequence", "- [a,\nb]\n", 2),
        ("single quotes", "k: 'a\nb'\n", 2),
        ("flow mapping", "k: {a: 1,\nb: 2}\n", 2),
    ] {
        let e = parse(text).unwrap_err();
        assert!(
            matches!(e.kind, ErrorKind::Indentation | ErrorKind::Syntax),
            "{case}: {e:?}"
        );
        assert_eq!(e.span.line, line, "{case}: {e:?}");
    }
    for (case, text) in [
        ("DK95/02", "foo: \"bar\n  \tbaz\"\n"),
        ("DK95/08", "foo: \"bar\n \t \t baz \t \t \"\n"),
        ("indented flow", "flow: [a,\n b,\n c]\n"),
        ("top-level flow", "[a,\nb]\n"),
        ("blank line", "k: \"a\n\n  b\"\n"),
        ("compact", "- k: [a,\n   b]\n"),
        ("sequence under key", "k:\n- [a,\n b]\n"),
        ("literal", "k: |\n  a\n  b\n"),
    ] {
        assert!(parse(text).is_ok(), "{case}: {:?}", parse(text));
    }
}
