//! Arbitrary bytes → (when UTF-8) the spanned YAML parser, and the tree's
//! JSON conversion and pointer lookups.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    edgeform_fuzz::init();
    let Ok(text) = std::str::from_utf8(data) else { return };
    match compiler::yaml::parse(text) {
        Ok(Some(tree)) => {
            let check = |s: compiler::yaml::Span| {
                assert!(s.line >= 1 && s.column >= 1, "0-based position {s:?}");
                assert!(s.start <= s.end && s.end <= text.len(), "span {s:?} out of {}", text.len());
                assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end), "span {s:?}");
            };
            check(tree.span);
            let json = tree.to_json();
            let _ = json.to_string();
            for pointer in ["", "/host", "/0", "/cache_rules/0/ttl", "/a~1b", "/x/y/z/0/1"] {
                check(tree.locate(pointer));
                let _ = tree.pointer(pointer);
            }
        }
        Ok(None) => {}
        Err(e) => {
            let s = e.span;
            assert!(s.line >= 1 && s.column >= 1, "0-based error position {e:?}");
            assert!(s.start <= s.end && s.end <= text.len(), "error span out of {}: {e:?}", text.len());
            assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end), "{e:?}");
        }
    }
});

