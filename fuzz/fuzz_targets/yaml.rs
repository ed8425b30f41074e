//! Arbitrary bytes → (when UTF-8) the spanned YAML parser (`yamlspan`):
//! every span of the tree (keys included) or of the error must point into
//! the text; then the JSON conversion and pointer lookups.
#![no_main]

use edgeform_fuzz::Text;
use libfuzzer_sys::fuzz_target;
use yamlspan::{Node, Value};

fn check_tree(text: &Text<'_>, node: &Node) {
    if let Some(problem) = text.problem(node.span) {
        panic!("bad span ({problem}) on {:?}", node.span);
    }
    match &node.value {
        Value::Seq(items) => items.iter().for_each(|n| check_tree(text, n)),
        Value::Map(entries) => {
            for (key, value) in entries {
                if let Some(problem) = text.problem(key.span) {
                    panic!("bad span ({problem}) on key {key:?}");
                }
                check_tree(text, value);
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    edgeform_fuzz::init();
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match yamlspan::parse(text) {
        Ok(Some(tree)) => {
            let lines = Text::new(text);
            check_tree(&lines, &tree);
            let _ = tree.to_json().to_string();
            for pointer in [
                "",
                "/host",
                "/0",
                "/cache_rules/0/ttl",
                "/a~1b",
                "/x/y/z/0/1",
            ] {
                assert!(lines.problem(tree.locate(pointer)).is_none());
                let _ = tree.pointer(pointer);
            }
        }
        Ok(None) => {}
        Err(e) => {
            if let Some(problem) = Text::new(text).problem(e.span) {
                panic!("bad error span ({problem}): {e:?}");
            }
        }
    }
});
