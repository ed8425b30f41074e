//! `cluster.yaml`: defaults, trusted proxies, MQTT, apply thresholds, geo buckets, the anycast settings.

use super::*;

pub(super) fn cluster_defaults() -> Cluster {
    Cluster {
        name: "edgeform".into(),
        trusted_proxies: Vec::new(),
        mqtt: None,
        apply: Thresholds::default(),
        freeze: Vec::new(),
        rollout: Rollout::default(),
        geo: default_geo(),
        anycast: None,
        acme: None,
    }
}

pub(super) fn default_geo() -> GeoSettings {
    GeoSettings::default()
}

pub(super) fn cluster(ctx: &mut Ctx<'_>, raw: &raw::Cluster) -> Cluster {
    let trusted_proxies = check_nets(ctx, "trusted_proxies", &raw.trusted_proxies);
    let mqtt = raw.mqtt.as_ref().map(|m| {
        check_url(ctx, "/mqtt/url", &m.url, &["mqtt", "mqtts"], true);
        Mqtt {
            url: m.url.clone(),
            topic_prefix: m.topic_prefix.clone().unwrap_or_else(|| "edgeform".into()),
        }
    });
    let apply = Thresholds::of(raw.apply.as_ref());
    let freeze = raw
        .apply
        .as_ref()
        .map(|a| freeze_windows(ctx, &a.freeze))
        .unwrap_or_default();
    let rollout = raw
        .apply
        .as_ref()
        .map(|a| rollout(ctx, a))
        .unwrap_or_default();
    let mut geo = default_geo();
    if let Some(g) = &raw.geo {
        if let Some(t) = g.tie_km {
            geo.tie_km = t;
        }
        if let Some(buckets) = &g.buckets {
            if buckets.windows(2).any(|w| w[0].below_km >= w[1].below_km) {
                let d = ctx.error(
                    "invalid-buckets",
                    "/geo/buckets",
                    "`geo.buckets` must be in strictly increasing `below_km`".into(),
                );
                help(d, "e.g. below_km 500, 2000, 5000");
            }
            geo.buckets = buckets
                .iter()
                .map(|b| Bucket {
                    below_km: b.below_km,
                    weight: b.weight,
                })
                .collect();
        }
        if let Some(w) = g.default_weight {
            geo.default_weight = w;
        }
        if let Some(f) = g.max_fails {
            geo.max_fails = f;
        }
        if let Some(t) = &g.fail_timeout {
            match parse_duration_ms(t) {
                Some(ms) if ms % 1000 == 0 => geo.fail_timeout_s = ms / 1000,
                _ => {
                    ctx.error(
                        "invalid-value",
                        "/geo/fail_timeout",
                        format!("`{t}` is not a whole number of seconds (nginx `fail_timeout`)"),
                    );
                }
            }
        }
    }
    let anycast = raw.anycast.as_ref().map(|a| anycast(ctx, a));
    let acme = raw.acme.as_ref().map(|a| {
        check_url(ctx, "/acme/directory", &a.directory, &["https"], false);
        for (i, c) in a.contact.iter().enumerate() {
            if !c.starts_with("mailto:") || c.len() <= "mailto:".len() {
                let d = ctx.error(
                    "invalid-value",
                    &format!("/acme/contact/{i}"),
                    format!("`{c}` is not a `mailto:` URI"),
                );
                help(d, "e.g. mailto:ops@example.com");
            }
        }
        let order_timeout_s = a
            .order_timeout
            .as_ref()
            .map_or(crate::model::resolved::ACME_ORDER_TIMEOUT_DEFAULT_S, |t| {
                order_timeout(ctx, t)
            });
        Acme {
            directory: a.directory.clone(),
            contact: a.contact.clone(),
            ca_file: a.ca_file.clone(),
            order_timeout_s,
        }
    });
    Cluster {
        name: raw.name.clone().unwrap_or_else(|| "edgeform".into()),
        trusted_proxies,
        mqtt,
        apply,
        freeze,
        rollout,
        geo,
        anycast,
        acme,
    }
}

/// `apply.waves`, `prometheus`, `auto_rollback`, `gate`: the rules of one
/// file (names unique, `rest` last, bake times, the gate source's URL).
/// Which targets the waves select is checked with the nodes
/// ([`super::waves_select_targets`]).
fn rollout(ctx: &mut Ctx<'_>, raw: &raw::Apply) -> Rollout {
    let mut waves: Vec<Wave> = Vec::with_capacity(raw.waves.len());
    for (i, w) in raw.waves.iter().enumerate() {
        let base = format!("/apply/waves/{i}");
        if let Some(j) = waves.iter().position(|o| o.name == w.name) {
            ctx.error(
                "duplicate-value",
                &format!("{base}/name"),
                format!("wave `{}` is named twice (also item {j})", w.name),
            );
        }
        let bake_s = w.bake.as_ref().map_or(0, |t| match parse_duration_ms(t) {
            Some(ms) if ms % 1000 == 0 && ms / 1000 <= WAVE_BAKE_MAX_S => ms / 1000,
            _ => {
                let d = ctx.error(
                    "invalid-value",
                    &format!("{base}/bake"),
                    format!(
                        "`{}` is not a whole number of seconds up to 168h",
                        edgestate::untrusted::escape(t)
                    ),
                );
                help(d, "e.g. `bake: 10m`");
                0
            }
        });
        for (k, n) in w.nodes.iter().enumerate() {
            if w.nodes[..k].contains(n) {
                ctx.error(
                    "duplicate-value",
                    &format!("{base}/nodes/{k}"),
                    format!("node `{n}` is listed twice in wave `{}`", w.name),
                );
            }
        }
        let wave = Wave {
            name: w.name.clone(),
            nodes: w.nodes.clone(),
            regions: w.regions.clone(),
            roles: w.roles.clone(),
            bake_s,
        };
        if wave.is_rest() && i + 1 < raw.waves.len() {
            let d = ctx.error(
                "rest-not-last",
                &base,
                format!(
                    "wave `{}` selects every target not in an earlier wave (`rest`), so it must be the last",
                    w.name
                ),
            );
            help(d, "give it `nodes`, `regions` or `roles`, or move it last");
        }
        waves.push(wave);
    }
    if let Some(url) = &raw.prometheus {
        check_url(ctx, "/apply/prometheus", url, &["http", "https"], true);
    }
    let gate = raw.gate.as_ref();
    Rollout {
        waves,
        auto_rollback: raw.auto_rollback.unwrap_or(false),
        gate: GateConfig {
            prometheus: raw.prometheus.clone(),
            min_requests: gate
                .and_then(|g| g.min_requests)
                .unwrap_or(GATE_MIN_REQUESTS),
            max_5xx_ratio_increase: gate
                .and_then(|g| g.max_5xx_ratio_increase)
                .unwrap_or(GATE_MAX_5XX_RATIO_INCREASE),
            max_refusal_ratio_increase: gate
                .and_then(|g| g.max_refusal_ratio_increase)
                .unwrap_or(GATE_MAX_REFUSAL_RATIO_INCREASE),
            max_hit_ratio_drop: gate
                .and_then(|g| g.max_hit_ratio_drop)
                .unwrap_or(GATE_MAX_HIT_RATIO_DROP),
        },
    }
}

/// `acme.order_timeout`: whole seconds, from `1s` to a day (the default on
/// error: the error stops the run anyway).
fn order_timeout(ctx: &mut Ctx<'_>, text: &str) -> u64 {
    use crate::model::resolved::{ACME_ORDER_TIMEOUT_DEFAULT_S, ACME_ORDER_TIMEOUT_MAX_S};
    match parse_duration_ms(text) {
        Some(ms) if ms % 1000 == 0 && (1..=ACME_ORDER_TIMEOUT_MAX_S).contains(&(ms / 1000)) => {
            ms / 1000
        }
        _ => {
            let d = ctx.error(
                "invalid-value",
                "/acme/order_timeout",
                format!(
                    "`{}` is not a whole number of seconds from 1s to 24h",
                    edgestate::untrusted::escape(text)
                ),
            );
            help(d, "e.g. `order_timeout: 10m`");
            ACME_ORDER_TIMEOUT_DEFAULT_S
        }
    }
}

/// `apply.freeze`: each time an RFC 3339 time, `end` after `start`,
/// names unique.
fn freeze_windows(ctx: &mut Ctx<'_>, raw: &[raw::FreezeWindow]) -> Vec<FreezeWindow> {
    let mut out: Vec<FreezeWindow> = Vec::with_capacity(raw.len());
    for (i, w) in raw.iter().enumerate() {
        let base = format!("/apply/freeze/{i}");
        let time = |ctx: &mut Ctx<'_>, field: &str, text: &str| {
            let t = crate::clock::parse_rfc3339(text.trim());
            if t.is_none() {
                let d = ctx.error(
                    "invalid-time",
                    &format!("{base}/{field}"),
                    format!("`{text}` is not an RFC 3339 time"),
                );
                help(d, "e.g. 2026-12-24T18:00:00Z (seconds and an offset or Z)");
            }
            t
        };
        let start = time(ctx, "start", &w.start);
        let end = time(ctx, "end", &w.end);
        if out.iter().any(|o| o.name == w.name) {
            ctx.error(
                "duplicate-value",
                &format!("{base}/name"),
                format!("freeze window `{}` is named twice", w.name),
            );
        }
        let (Some(start), Some(end)) = (start, end) else {
            continue;
        };
        if end <= start {
            let d = ctx.error(
                "invalid-window",
                &format!("{base}/end"),
                format!("freeze window `{}` ends before it starts", w.name),
            );
            help(d, "`end` must be after `start`");
            continue;
        }
        out.push(FreezeWindow {
            name: w.name.clone(),
            start,
            end,
            reason: w.reason.clone(),
        });
    }
    out
}

/// AS numbers that never appear as a real AS: 0 (RFC 7607), `AS_TRANS`
/// 23456 (RFC 6793), and the last of each range, 65535 and 4294967295
/// (RFC 7300).
pub(super) const RESERVED_ASNS: [u32; 4] = [0, 23_456, 65_535, u32::MAX];

pub(super) fn check_asn(ctx: &mut Ctx<'_>, pointer: &str, asn: u32) {
    if RESERVED_ASNS.contains(&asn) {
        let d = ctx.error(
            "invalid-asn",
            pointer,
            format!("AS{asn} is reserved and never a real AS"),
        );
        help(
            d,
            "write the AS number you exchange routes with, e.g. 64496",
        );
    }
}

pub(super) fn anycast(ctx: &mut Ctx<'_>, raw: &raw::Anycast) -> Anycast {
    for (i, &asn) in raw.origin_asns.iter().enumerate() {
        check_asn(ctx, &format!("/anycast/origin_asns/{i}"), asn);
        if raw.origin_asns[..i].contains(&asn) {
            ctx.error(
                "duplicate-value",
                &format!("/anycast/origin_asns/{i}"),
                format!("AS{asn} is listed twice in `origin_asns`"),
            );
        }
    }
    let mut upstreams: Vec<Upstream> = Vec::with_capacity(raw.upstreams.len());
    for (i, u) in raw.upstreams.iter().enumerate() {
        let base = format!("/anycast/upstreams/{i}");
        check_asn(ctx, &format!("{base}/asn"), u.asn);
        if let Some(j) = upstreams.iter().position(|o| o.name == u.name) {
            ctx.error(
                "duplicate-value",
                &format!("{base}/name"),
                format!("upstream `{}` is named twice (also item {j})", u.name),
            );
        }
        if let Some(j) = upstreams.iter().position(|o| o.asn == u.asn) {
            ctx.error(
                "duplicate-value",
                &format!("{base}/asn"),
                format!("AS{} is listed twice in `upstreams` (also item {j})", u.asn),
            );
        }
        if raw.origin_asns.contains(&u.asn) {
            let d = ctx.error(
                "invalid-asn",
                &format!("{base}/asn"),
                format!("AS{} is one of your `origin_asns`, not an upstream", u.asn),
            );
            help(
                d,
                "an upstream is the provider's AS, the one your routers peer with",
            );
        }
        upstreams.push(Upstream {
            name: u.name.clone(),
            asn: u.asn,
        });
    }
    let mut prefixes: Vec<AnycastPrefix> = Vec::with_capacity(raw.prefixes.len());
    for (i, p) in raw.prefixes.iter().enumerate() {
        let base = format!("/anycast/prefixes/{i}");
        let Some(prefix) = net_at(ctx, &format!("{base}/prefix"), &p.prefix) else {
            continue;
        };
        if let Some(j) = raw.prefixes[..i]
            .iter()
            .position(|o| parse_net(o.prefix.trim()).ok() == Some(prefix))
        {
            ctx.error(
                "duplicate-value",
                &format!("{base}/prefix"),
                format!("`{prefix}` is listed twice in `anycast.prefixes` (also item {j})"),
            );
        }
        if let Some(name) = &p.name
            && let Some(j) = raw.prefixes[..i]
                .iter()
                .position(|o| o.name.as_ref() == Some(name))
        {
            ctx.error(
                "duplicate-value",
                &format!("{base}/name"),
                format!("prefix name `{name}` is used twice (also item {j})"),
            );
        }
        let mut wanted = Vec::new();
        match &p.upstreams {
            None => wanted.extend(0..upstreams.len()),
            Some(names) => {
                for (k, name) in names.iter().enumerate() {
                    let pointer = format!("{base}/upstreams/{k}");
                    match upstreams.iter().position(|u| &u.name == name) {
                        Some(idx) if wanted.contains(&idx) => {
                            ctx.error(
                                "duplicate-value",
                                &pointer,
                                format!("upstream `{name}` is listed twice"),
                            );
                        }
                        Some(idx) => wanted.push(idx),
                        None => {
                            let known: Vec<&str> =
                                upstreams.iter().map(|u| u.name.as_str()).collect();
                            let hint = did_you_mean(name, &known, "known upstreams", None);
                            let d = ctx.error(
                                "unknown-upstream",
                                &pointer,
                                format!("`{name}` names no entry of `anycast.upstreams`"),
                            );
                            help(d, hint);
                        }
                    }
                }
                wanted.sort_unstable();
            }
        }
        prefixes.push(AnycastPrefix {
            prefix,
            name: p.name.clone().unwrap_or_else(|| prefix.to_string()),
            upstreams: wanted,
        });
    }
    Anycast {
        origin_asns: raw.origin_asns.clone(),
        prefixes,
        upstreams,
        lopsided_share: raw.lopsided_share.unwrap_or(0.8),
        longer_path_hops: raw.longer_path_hops.unwrap_or(1.0),
    }
}

/// `apply.waves` against the nodes: every name a target (a node with a
/// `redis` block), every region one some target is in, no node in two
/// waves (named twice, or named after an earlier wave selected it), and
/// no wave left without a target.
pub(super) fn waves_select_targets(
    file: &ParsedFile<'_>,
    cluster: &Cluster,
    nodes: &[(Node, &ParsedFile<'_>)],
    out: &mut Vec<Diagnostic>,
) {
    let waves = &cluster.rollout.waves;
    if waves.is_empty() {
        return;
    }
    let mut ctx = Ctx::new(file);
    let targets: Vec<&Node> = nodes
        .iter()
        .map(|(n, _)| n)
        .filter(|n| n.redis.is_some())
        .collect();
    let target_names: Vec<&str> = targets.iter().map(|n| n.name.as_str()).collect();
    let regions: BTreeSet<&str> = targets.iter().map(|n| n.region.as_str()).collect();
    for (i, w) in waves.iter().enumerate() {
        let base = format!("/apply/waves/{i}");
        for (k, name) in w.nodes.iter().enumerate() {
            let pointer = format!("{base}/nodes/{k}");
            let Some(node) = targets.iter().find(|n| n.name == *name) else {
                let is_node = nodes.iter().any(|(n, _)| n.name == *name);
                let d = ctx.error(
                    "unknown-node",
                    &pointer,
                    if is_node {
                        format!("node `{name}` has no `redis` block: it is not a target")
                    } else {
                        format!("wave `{}` names no node `{name}`", w.name)
                    },
                );
                help(
                    d,
                    did_you_mean(
                        name,
                        &target_names,
                        "targets",
                        Some("no node has a `redis` block"),
                    ),
                );
                continue;
            };
            if let Some(j) = waves[..i].iter().position(|e| e.selects(node)) {
                ctx.error(
                    "node-in-two-waves",
                    &pointer,
                    format!(
                        "node `{name}` is in wave `{}` already (item {j})",
                        waves[j].name
                    ),
                );
            }
        }
        for (k, region) in w.regions.iter().enumerate() {
            if !regions.contains(region.as_str()) {
                let known: Vec<&str> = regions.iter().copied().collect();
                let d = ctx.error(
                    "unknown-region",
                    &format!("{base}/regions/{k}"),
                    format!("region `{region}` has no target"),
                );
                help(
                    d,
                    did_you_mean(region, &known, "regions with targets", None),
                );
            }
        }
        for (k, role) in w.roles.iter().enumerate() {
            if !targets.iter().any(|n| n.has(*role)) {
                ctx.error(
                    "unknown-role",
                    &format!("{base}/roles/{k}"),
                    format!("no target has the role `{}`", role.as_str()),
                );
            }
        }
    }
    for (i, members) in cluster
        .rollout
        .assign(nodes.iter().map(|(n, _)| n))
        .iter()
        .enumerate()
    {
        if members.is_empty() {
            let d = ctx.error(
                "empty-wave",
                &format!("/apply/waves/{i}"),
                format!("wave `{}` selects no target", waves[i].name),
            );
            help(
                d,
                "every target it names is in an earlier wave, or it names none",
            );
        }
    }
    out.append(&mut ctx.out);
}
