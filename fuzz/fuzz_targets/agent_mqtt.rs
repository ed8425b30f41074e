//! Bytes → what any broker client (or a queue writer) can send the agent
//! and `edgeform exec`: health/status messages for any node name, command
//! results, purge jobs.
//!
//! Input: the first line is a node name, the rest a payload. Checks:
//! nothing panics; the book never tracks a node outside its table; a
//! result never verifies without the key; shown text has no control
//! character; a purge job's errors never echo a big job; a pattern the
//! scope guard lets through matches none of its probes.
#![no_main]

use std::collections::BTreeSet;
use std::sync::OnceLock;

use agent::book::Book;
use edgestate::mqtt::{Command, CommandResult};
use edgestate::purge::{self, Job};
use libfuzzer_sys::fuzz_target;

fn command() -> &'static Command {
    static C: OnceLock<Command> = OnceLock::new();
    C.get_or_init(|| {
        let mut c = Command {
            id: "c1".into(),
            action: "echo".into(),
            args: Default::default(),
            issued_at: 1,
            expires_at: 2,
            sig: None,
        };
        c.sign("n", b"k");
        c
    })
}

fuzz_target!(|data: &[u8]| {
    let (name, payload) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let name = String::from_utf8_lossy(name);
    let mut book = Book::for_nodes(BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    for kind in ["health", "status"] {
        let _ = book.take("p", &format!("p/{kind}/{name}"), payload);
        let _ = book.take("p", &format!("p/{kind}/a"), payload);
    }
    let h = book.health();
    assert!(h.nodes.keys().all(|n| n == "a" || n == "b"));

    if let Ok(r) = serde_json::from_slice::<CommandResult>(payload) {
        // No key, no forgery: only a result signed with "k" for this
        // command verifies, and the fuzzer does not have it.
        assert!(!r.verify(command(), "n", b"not-the-key"));
        let shown = edgestate::untrusted::escape(&r.stdout);
        assert!(!shown.chars().any(char::is_control));
        let _ = ops::mqtt::describe(&r);
    }
    let preview = edgestate::untrusted::preview(payload, 200);
    assert!(!preview.chars().any(char::is_control));
    // Worst case: a C0 control shown as `\u{1e}` (6 bytes per input
    // byte), then `…`.
    assert!(preview.len() <= 200 * 6 + 3);

    match Job::parse_bytes(payload) {
        Err(e) => assert!(e.len() < 1000, "an error echoes the job"),
        Ok(job) => {
            if let Some(grep) = &job.grep
                && let Ok(re) = Job::grep_matcher(grep, false)
            {
                for probe in purge::SCOPE_PROBES {
                    assert!(!re.is_match(probe.as_bytes()));
                }
            }
        }
    }
});
