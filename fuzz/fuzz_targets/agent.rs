//! Bytes → the agent's inputs from outside: `agent.yaml` (file:line:col
//! errors, never a panic), a command from the broker checked against a
//! fixed action set, and health/status messages into the routing book.
#![no_main]

use std::sync::OnceLock;

use agent::book::Book;
use agentconf::Config;
use libfuzzer_sys::fuzz_target;

fn actions() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        agentconf::parse(
            "agent.yaml",
            "node: n\nregion: r\nredis: {url: redis://x}\nactions:\n  \
             echo:\n    argv: [/usr/bin/echo, \"{w}\"]\n    args: {w: \"[a-z]+\"}\n  \
             peer:\n    argv: [/bin/p, \"{ip}\", \"{zone}\"]\n    args: {ip: \"[0-9a-f.:]+\", zone: \".*\"}\n",
        )
        .expect("the fixed config is valid")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = agentconf::parse("agent.yaml", text) {
            assert!(!e.message.is_empty());
            let _ = e.to_string();
        }
    }
    let config = actions();
    if let Ok(cmd) = serde_json::from_slice::<edgestate::mqtt::Command>(data) {
        for key in [None, Some(&b"k"[..])] {
            if let Ok(argv) = agent::commands::check(&cmd, "n", &config.actions, key, 1_000) {
                // Whatever passed: the program is the configured one and
                // no argument carries a metacharacter.
                assert!(argv[0] == "/usr/bin/echo" || argv[0] == "/bin/p");
                for a in &argv[1..] {
                    assert!(!a.contains(agent::commands::METACHARACTERS));
                }
            }
        }
    }
    let mut book = Book::default();
    for topic in ["p/health/n", "p/status/n", "p/health/x"] {
        let _ = book.take("p", topic, data);
    }
    let _ = book.health();
});
