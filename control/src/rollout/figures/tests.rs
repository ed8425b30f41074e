use super::*;

const T: Thresholds = Thresholds {
    min_requests: 200,
    max_5xx_ratio_increase: 0.02,
    max_refusal_ratio_increase: 0.05,
    max_hit_ratio_drop: 0.2,
};

/// `requests`, 5xx, refusals `(reason, n)`, hits and misses.
fn counts(requests: f64, e5xx: f64, refusals: &[(&str, f64)], hit: f64, miss: f64) -> Counts {
    let mut cache = BTreeMap::new();
    if hit > 0.0 {
        cache.insert("HIT".to_owned(), hit);
    }
    if miss > 0.0 {
        cache.insert("MISS".to_owned(), miss);
    }
    Counts {
        requests,
        errors_5xx: e5xx,
        refusals: refusals
            .iter()
            .map(|(r, n)| ((*r).to_owned(), *n))
            .collect(),
        cache,
    }
}

fn healthy() -> Counts {
    counts(1000.0, 1.0, &[], 900.0, 100.0)
}

fn windows(before: Counts, applied: Counts, pending: Counts) -> Windows {
    let one = |c: Counts| BTreeMap::from([("a.example.com".to_owned(), c)]);
    Windows {
        before: one(before),
        applied: one(applied),
        pending: one(pending),
    }
}

fn hosts() -> Vec<String> {
    vec!["a.example.com".to_owned()]
}

#[test]
fn a_site_as_healthy_as_before_passes_without_a_note() {
    let w = windows(healthy(), healthy(), healthy());
    assert_eq!(
        compare(&hosts(), &w, |_| T),
        Outcome::Pass { notes: vec![] }
    );
}

#[test]
fn a_5xx_ratio_past_its_threshold_halts_naming_host_figure_and_values() {
    let w = windows(
        healthy(),
        counts(1000.0, 500.0, &[], 900.0, 100.0),
        healthy(),
    );
    let Outcome::Halt(r) = compare(&hosts(), &w, |_| T) else {
        panic!("halts");
    };
    assert_eq!(r.host, "a.example.com");
    assert_eq!(r.figure, "5xx_ratio");
    assert!((r.before - 0.001).abs() < 1e-9, "{r}");
    assert!((r.after - 0.5).abs() < 1e-9, "{r}");
    assert!((r.threshold - 0.02).abs() < 1e-9);
    assert_eq!(
        r.to_string(),
        "a.example.com: 5xx_ratio went from 0.0010 to 0.5000 (threshold 0.02)"
    );
}

#[test]
fn an_increase_within_the_threshold_passes() {
    // 0.1 % → 2 %: +0.019, under 0.02.
    let w = windows(
        healthy(),
        counts(1000.0, 20.0, &[], 900.0, 100.0),
        healthy(),
    );
    assert_eq!(
        compare(&hosts(), &w, |_| T),
        Outcome::Pass { notes: vec![] }
    );
}

#[test]
fn a_refusal_ratio_is_compared_per_reason() {
    let before = counts(1000.0, 0.0, &[("geo-blocked", 10.0)], 900.0, 100.0);
    // The same geo refusals, but a new reason at 30 %.
    let applied = counts(
        1000.0,
        0.0,
        &[("geo-blocked", 10.0), ("geo-not-allowed", 300.0)],
        600.0,
        100.0,
    );
    let w = windows(before.clone(), applied, before);
    let Outcome::Halt(r) = compare(&hosts(), &w, |_| T) else {
        panic!("halts");
    };
    assert_eq!(r.figure, "refusal_ratio:geo-not-allowed");
    assert!((r.after - 0.3).abs() < 1e-9);
    assert!(r.before.abs() < 1e-9);
}

#[test]
fn a_hit_ratio_drop_past_its_threshold_halts() {
    let w = windows(healthy(), counts(1000.0, 0.0, &[], 500.0, 500.0), healthy());
    let Outcome::Halt(r) = compare(&hosts(), &w, |_| T) else {
        panic!("halts");
    };
    assert_eq!(r.figure, "hit_ratio");
    assert!((r.before - 0.9).abs() < 1e-9 && (r.after - 0.5).abs() < 1e-9);
}

#[test]
fn caching_turned_off_counts_as_a_hit_ratio_of_zero() {
    let w = windows(healthy(), counts(1000.0, 0.0, &[], 0.0, 0.0), healthy());
    let Outcome::Halt(r) = compare(&hosts(), &w, |_| T) else {
        panic!("halts");
    };
    assert_eq!((r.figure.as_str(), r.after), ("hit_ratio", 0.0));
}

#[test]
fn a_site_never_cached_is_not_judged_on_its_hit_ratio() {
    let uncached = counts(1000.0, 0.0, &[], 0.0, 0.0);
    let w = windows(uncached.clone(), uncached.clone(), uncached);
    assert_eq!(
        compare(&hosts(), &w, |_| T),
        Outcome::Pass { notes: vec![] }
    );
}

#[test]
fn under_min_requests_the_site_passes_on_bake_time_alone_with_a_note() {
    let w = windows(healthy(), counts(199.0, 199.0, &[], 0.0, 0.0), healthy());
    let Outcome::Pass { notes } = compare(&hosts(), &w, |_| T) else {
        panic!("passes");
    };
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].starts_with("a.example.com: 199 requests in the bake window")
            && notes[0].ends_with("passed on bake time alone"),
        "{notes:?}"
    );
}

#[test]
fn a_site_with_no_traffic_at_all_passes_with_a_note() {
    let w = Windows::default();
    let Outcome::Pass { notes } = compare(&hosts(), &w, |_| T) else {
        panic!("passes");
    };
    assert!(notes[0].contains("0 requests"), "{notes:?}");
}

#[test]
fn an_outage_the_pending_waves_share_does_not_halt_a_good_change() {
    // The origin fails for every edge: the applied wave is worse than
    // before, but no worse than the pending waves.
    let outage = counts(1000.0, 400.0, &[], 900.0, 100.0);
    let w = windows(healthy(), outage.clone(), outage);
    assert_eq!(
        compare(&hosts(), &w, |_| T),
        Outcome::Pass { notes: vec![] }
    );
}

#[test]
fn pending_waves_with_too_little_traffic_leave_before_as_the_only_reference() {
    let w = windows(
        healthy(),
        counts(1000.0, 400.0, &[], 900.0, 100.0),
        counts(50.0, 20.0, &[], 45.0, 5.0),
    );
    assert!(matches!(compare(&hosts(), &w, |_| T), Outcome::Halt(_)));
}

#[test]
fn without_traffic_before_the_control_group_is_the_reference() {
    let w = windows(
        Counts::default(),
        counts(1000.0, 400.0, &[], 900.0, 100.0),
        healthy(),
    );
    let Outcome::Halt(r) = compare(&hosts(), &w, |_| T) else {
        panic!("halts");
    };
    assert!((r.before - 0.001).abs() < 1e-9, "the control group's: {r}");
}

#[test]
fn without_any_reference_the_site_passes_with_a_note() {
    let w = windows(
        Counts::default(),
        counts(1000.0, 400.0, &[], 900.0, 100.0),
        Counts::default(),
    );
    let Outcome::Pass { notes } = compare(&hosts(), &w, |_| T) else {
        panic!("passes");
    };
    assert!(
        notes[0].contains("too little traffic to compare"),
        "{notes:?}"
    );
}

#[test]
fn a_site_override_loosens_only_its_own_site() {
    let bad = counts(1000.0, 100.0, &[], 900.0, 100.0);
    let mut w = windows(healthy(), bad.clone(), healthy());
    w.before.insert("b.example.com".into(), healthy());
    w.applied.insert("b.example.com".into(), bad);
    w.pending.insert("b.example.com".into(), healthy());
    let hosts = vec!["b.example.com".to_owned(), "a.example.com".to_owned()];
    let loose_a = |h: &str| Thresholds {
        max_5xx_ratio_increase: if h == "a.example.com" { 0.5 } else { 0.02 },
        ..T
    };
    let Outcome::Halt(r) = compare(&hosts, &w, loose_a) else {
        panic!("b halts");
    };
    assert_eq!(r.host, "b.example.com");
}

#[test]
fn sites_are_judged_in_name_order() {
    let bad = counts(1000.0, 100.0, &[], 900.0, 100.0);
    let mut w = Windows::default();
    for h in ["z.example.com", "m.example.com"] {
        w.before.insert(h.into(), healthy());
        w.applied.insert(h.into(), bad.clone());
    }
    let hosts = vec!["z.example.com".to_owned(), "m.example.com".to_owned()];
    let Outcome::Halt(r) = compare(&hosts, &w, |_| T) else {
        panic!("halts");
    };
    assert_eq!(r.host, "m.example.com");
}
