use std::collections::BTreeMap;
use std::sync::Arc;

use compiler::model::resolved::{GateConfig, Rollout, Wave};

use super::gate::{GateError, GateErrorKind, Verdict};
use super::*;

fn wave(name: &str, nodes: &[&str], regions: &[&str], bake_s: u64) -> Wave {
    Wave {
        name: name.into(),
        nodes: nodes.iter().map(|n| (*n).into()).collect(),
        regions: regions.iter().map(|r| (*r).into()).collect(),
        roles: Vec::new(),
        bake_s,
    }
}

fn node(name: &str, region: &str, target: bool) -> Node {
    let mut n = Node {
        file: Arc::from(format!("nodes/{name}.yaml")),
        name: name.into(),
        roles: [compiler::model::resolved::Role::Edge].into(),
        region: region.into(),
        zone: None,
        public_url: None,
        location: None,
        addresses: Vec::new(),
        redis: None,
        playback_session_limit: None,
        playback_bandwidth_kbit: None,
        network_bandwidth_kbit: None,
        drain: false,
        cache: Default::default(),
        https: Default::default(),
    };
    if target {
        n.redis = Some(
            edgestate::target::RedisTarget::from_parts(
                Some("redis://127.0.0.1:6379".into()),
                None,
                None,
                None,
                None,
                None,
            )
            .expect("a redis target"),
        );
    }
    n
}

fn rollout() -> Rollout {
    Rollout {
        waves: vec![
            wave("canary", &["edge-ams-1"], &[], 600),
            wave("eu", &[], &["eu"], 1800),
            wave("rest", &[], &[], 0),
        ],
        auto_rollback: false,
        gate: GateConfig::default(),
    }
}

fn nodes() -> Vec<Node> {
    vec![
        node("edge-ams-1", "eu", true),
        node("edge-ams-2", "eu", true),
        node("edge-fra-1", "eu", true),
        node("edge-nyc-1", "us", true),
        node("router-1", "us", false),
    ]
}

#[test]
fn each_target_is_in_the_first_wave_that_selects_it_and_rest_takes_the_others() {
    let planned = plan(&rollout(), &nodes());
    let names: Vec<(&str, Vec<&str>)> = planned
        .iter()
        .map(|w| {
            (
                w.name.as_str(),
                w.nodes.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("canary", vec!["edge-ams-1"]),
            ("eu", vec!["edge-ams-2", "edge-fra-1"]),
            ("rest", vec!["edge-nyc-1"]),
        ]
    );
    assert_eq!(planned[1].bake_s, 1800);
}

#[test]
fn a_node_without_redis_is_in_no_wave() {
    let r = rollout();
    let all = nodes();
    assert_eq!(r.wave_of(&all[4]), None);
    assert_eq!(r.wave_of(&all[3]), Some(2));
}

#[test]
fn waves_without_rest_leave_unselected_targets_out() {
    let mut r = rollout();
    r.waves.pop();
    let planned = plan(&r, &nodes());
    assert!(
        planned
            .iter()
            .all(|w| !w.nodes.iter().any(|n| n == "edge-nyc-1"))
    );
}

fn record() -> Record {
    let planned = plan(&rollout(), &nodes());
    let previous: BTreeMap<String, Option<String>> = nodes()
        .iter()
        .filter(|n| n.redis.is_some())
        .map(|n| (n.name.clone(), Some("old".to_owned())))
        .collect();
    Record::new(
        "new",
        previous,
        vec!["a.example.com".into()],
        &planned,
        1000,
    )
}

#[test]
fn a_rollout_applies_bakes_judges_and_moves_on_wave_by_wave_then_completes() {
    let mut r = record();
    assert_eq!(r.step(1000), Step::Apply { wave: 0 });
    r.applied(0, 1000);
    assert_eq!(r.state, State::Baking);
    assert_eq!(
        r.step(1599),
        Step::Wait {
            wave: 0,
            until: 1600
        }
    );
    assert_eq!(r.step(1600), Step::Judge { wave: 0 });
    assert_eq!(r.applied_nodes(), vec!["edge-ams-1"]);
    assert_eq!(r.pending_nodes().len(), 3);
    r.judged(Ok(()));
    assert_eq!(r.step(1600), Step::Apply { wave: 1 });
    r.applied(1, 1600);
    r.judged(Ok(()));
    r.applied(2, 3400);
    // The last wave bakes 0 s: judged at once, then complete.
    assert_eq!(r.step(3400), Step::Judge { wave: 2 });
    r.judged(Ok(()));
    assert_eq!(r.state, State::Complete);
    assert_eq!(r.step(3400), Step::Done);
    assert!(r.pending_nodes().is_empty());
}

#[test]
fn a_halt_waits_for_the_operator_and_promote_moves_on_recording_who() {
    let mut r = record();
    r.applied(0, 1000);
    let verdict = Ok(Verdict::Halt {
        host: "a.example.com".into(),
        figure: "5xx_ratio".into(),
        before: 0.0,
        after: 0.5,
        threshold: 0.02,
    });
    r.judged(verdict_state(&verdict));
    let State::Halted { site, figure, .. } = &r.state else {
        panic!("halted: {:?}", r.state)
    };
    assert_eq!(
        (site.as_str(), figure.as_str()),
        ("a.example.com", "5xx_ratio")
    );
    assert_eq!(r.step(99_999), Step::Halted);
    assert_eq!(r.promote("ops@host"), Some(1));
    assert_eq!(r.waves[1].promoted_by.as_deref(), Some("ops@host"));
    assert_eq!(r.step(1000), Step::Apply { wave: 1 });
}

#[test]
fn promote_before_the_bake_ends_moves_on_at_once() {
    let mut r = record();
    r.applied(0, 1000);
    assert!(matches!(r.step(1001), Step::Wait { .. }));
    assert_eq!(r.promote("ops@host"), Some(1));
    assert_eq!(r.step(1001), Step::Apply { wave: 1 });
}

#[test]
fn a_gate_error_halts_naming_its_kind_never_passes() {
    let verdict = Err(GateError {
        kind: GateErrorKind::Unreachable,
        detail: "connection refused".into(),
    });
    let Err(State::Halted { site, figure, .. }) = verdict_state(&verdict) else {
        panic!("a gate error halts");
    };
    assert_eq!((site.as_str(), figure.as_str()), ("", "gate-unreachable"));
}

#[test]
fn one_commit_at_a_time_and_an_aborted_commit_never_starts_again() {
    let mut book = Book::default();
    assert_eq!(blocked(&book, "new"), None);
    let mut r = record();
    r.applied(0, 1000);
    book.current = Some(r);
    assert_eq!(blocked(&book, "new"), None, "its own rollout continues");
    assert_eq!(
        blocked(&book, "newer"),
        Some(Blocked::Busy {
            live: "new".into(),
            state: "baking"
        })
    );
    let live = book.current.as_mut().expect("current");
    live.abort("ops@host");
    book.remember_aborted("new");
    assert_eq!(blocked(&book, "new"), Some(Blocked::Aborted));
    assert_eq!(blocked(&book, "newer"), None, "a newer commit may start");
    let text = book.to_text();
    assert_eq!(Book::parse(Some(&text)).expect("reads back"), book);
}

#[test]
fn the_aborted_list_is_capped_oldest_first() {
    let mut book = Book::default();
    for i in 0..ABORTED_CAP + 5 {
        book.remember_aborted(&format!("c{i}"));
    }
    assert_eq!(book.aborted.len(), ABORTED_CAP);
    assert!(!book.is_aborted("c0") && book.is_aborted(&format!("c{}", ABORTED_CAP + 4)));
}

#[test]
fn a_book_that_is_not_json_is_an_error_not_a_panic() {
    assert!(Book::parse(Some("{\"current\": 3}")).is_err());
    assert!(Book::parse(Some("\u{0}")).is_err());
    assert_eq!(Book::parse(None).expect("empty"), Book::default());
}

#[test]
fn a_book_baking_a_wave_it_never_applied_is_refused_and_never_stepped_into() {
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let text = format!(
        r#"{{"current":{{"commit":"{commit}","previous":{{}},"waves":[],"started_at":0,"state":"baking"}}}}"#
    );
    let err = Book::parse(Some(&text)).expect_err("no applied wave");
    assert!(
        err.to_string().contains("no wave of it was applied"),
        "{err}"
    );
    // Stepped anyway (a record built in memory): halted, not a panic.
    let mut r = record();
    r.state = State::Baking;
    r.waves.clear();
    assert_eq!(r.step(0), Step::Halted);
}

#[test]
fn promote_after_the_last_wave_completes_the_rollout() {
    let mut r = record();
    for wave in 0..3 {
        r.applied(wave, 1000);
        if wave < 2 {
            r.judged(Ok(()));
        }
    }
    r.judged(Err(State::Halted {
        site: "a.example.com".into(),
        figure: "5xx_ratio".into(),
        detail: String::new(),
    }));
    assert_eq!(r.promote("ops@host"), None);
    assert_eq!(r.state, State::Complete);
    assert_eq!(r.step(1000), Step::Done);
}

fn compiled(routing: &str, sites: &[(&str, &str)]) -> compiler::compile::Compiled {
    let entries: compiler::compile::Entries = sites
        .iter()
        .map(|(k, v)| (Arc::from(*k), Arc::from(*v)))
        .collect();
    let entries = Arc::new(entries);
    let mut c = compiler::compile::Compiled::default();
    for node in ["edge-1", "edge-2"] {
        c.targets.insert(
            node.into(),
            compiler::compile::Target {
                node: node.into(),
                region: "eu".into(),
                routing: Arc::from(routing),
                sites: Arc::clone(&entries),
            },
        );
    }
    c
}

#[test]
fn changed_hosts_are_the_sites_whose_value_differs_and_routing_alone_changes_none() {
    let before = compiled(
        "r1",
        &[
            ("site:a.example.com", "{\"o\":1}"),
            ("site:b.example.com", "{}"),
        ],
    );
    let routing_only = compiled(
        "r2",
        &[
            ("site:a.example.com", "{\"o\":1}"),
            ("site:b.example.com", "{}"),
        ],
    );
    assert!(changed_hosts(&before, &routing_only).is_empty());
    let after = compiled(
        "r1",
        &[
            ("site:a.example.com", "{\"o\":2}"),
            ("site:c.example.com", "{}"),
            ("suspended:b.example.com", "1"),
            ("site:b.example.com", "{}"),
        ],
    );
    assert_eq!(
        changed_hosts(&before, &after),
        vec!["a.example.com", "b.example.com", "c.example.com"]
    );
}
