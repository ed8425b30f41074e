//! `edgeform history` and `edgeform status --from redis` (the
//! status verdict and the audit trail): what each target's own Redis says, without the broker.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use edgestate::{keys, untrusted};

use crate::mqtt::{Format, Row, print_status};
use compiler::model::resolved::Node;
use compiler::workspace::Valid;
use control::audit::{Entry, parse_history};

/// Every target's installed edge code (`edgeform:bundle`; absent: the
/// seed's), read from its own Redis within `timeout`; a target that does
/// not answer is left out.
pub async fn read_bundles(
    source: &Valid,
    timeout: Duration,
) -> BTreeMap<String, edgestate::bundle::Bundle> {
    let mut set = tokio::task::JoinSet::new();
    for node in source.config.nodes.iter().filter(|n| n.redis.is_some()) {
        let node = node.clone();
        set.spawn(async move {
            let read = tokio::time::timeout(timeout, async {
                let mut con = control::master(&node).await?;
                let h: BTreeMap<String, String> =
                    control::state::hgetall_capped(keys::BUNDLE, control::state::EDGE_FIELD_MAX)
                        .query_async(&mut con)
                        .await?;
                anyhow::Ok(h)
            })
            .await;
            (node.name, read)
        });
    }
    let mut out = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        if let Ok((name, Ok(Ok(h)))) = joined {
            out.insert(name, edgestate::bundle::Bundle::from_hash(&h));
        }
    }
    out
}

/// `edgeform status --from redis`: every target's `edgeform:meta` (and
/// purge queue length, installed edge code), read directly; the verdict
/// as for MQTT. `certs`: as [`crate::mqtt::status`]'s.
///
/// # Errors
/// Writing the output.
pub async fn status_from_redis(
    source: &Valid,
    format: Format,
    timeout: Duration,
    certs: &compiler::tls::Certificates,
) -> Result<u8> {
    let targets: Vec<Arc<Node>> = source
        .config
        .nodes
        .iter()
        .filter(|n| n.redis.is_some())
        .map(|n| Arc::new(n.clone()))
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for node in targets {
        set.spawn(async move {
            let read = tokio::time::timeout(timeout, read_meta(&node)).await;
            let read = read
                .unwrap_or_else(|_| {
                    Err(anyhow::anyhow!(
                        "no answer within {}s",
                        timeout.as_secs().max(1)
                    ))
                })
                .map_err(|e| edgeredis::with_refusal(&node.name, e));
            (node, read)
        });
    }
    let mut rows = Vec::new();
    let mut bundles = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        let Ok((node, read)) = joined else { continue };
        let desired_commit = Some(source.commit.clone());
        rows.push(match read {
            Ok((meta, queue, bundle)) => {
                bundles.insert(
                    node.name.clone(),
                    edgestate::bundle::Bundle::from_hash(&bundle),
                );
                Row {
                    node: node.name.clone(),
                    zone: node.zone.clone(),
                    online: true,
                    age_s: None,
                    commit: meta.get("commit").cloned(),
                    desired_commit,
                    purge_queue: Some(queue),
                    outbox: None,
                    play_sessions: None,
                    out_kbit: None,
                    applied_at: meta.get("applied_at").cloned(),
                    applied_by: meta.get("applied_by").cloned(),
                    error: None,
                    bundle: None,
                    bundle_commit: None,
                    serving: None,
                    install_first: Vec::new(),
                    skew: None,
                }
            }
            Err(e) => Row {
                node: node.name.clone(),
                zone: node.zone.clone(),
                online: false,
                age_s: None,
                commit: None,
                desired_commit,
                purge_queue: None,
                outbox: None,
                play_sessions: None,
                out_kbit: None,
                applied_at: None,
                applied_by: None,
                bundle: None,
                bundle_commit: None,
                serving: None,
                install_first: Vec::new(),
                skew: None,
                error: Some(format!(
                    "unreachable ({}): {}",
                    node.redis_at(),
                    edgeredis::one_line(&e)
                )),
            },
        });
    }
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    let compiled = compiler::compile::compile_with(&source.config, certs);
    crate::mqtt::with_skew(&mut rows, &compiled, &bundles);
    let soonest = crate::mqtt::SoonestExpiry::now(&source.config.sites, certs)?;
    print_status(&rows, |_| false, format, true, soonest.as_ref())
}

type MetaRead = (BTreeMap<String, String>, u64, BTreeMap<String, String>);

async fn read_meta(node: &Node) -> Result<MetaRead> {
    let mut con = control::master(node).await?;
    let cap = control::state::EDGE_FIELD_MAX;
    let read: MetaRead = redis::pipe()
        .add_command(control::state::hgetall_capped(keys::META, cap))
        .cmd("LLEN")
        .arg(keys::purge_queue(&node.region, &node.name))
        .add_command(control::state::hgetall_capped(keys::BUNDLE, cap))
        .query_async(&mut con)
        .await
        .context("reading edgeform:meta")?;
    Ok(read)
}

/// `edgeform history --node N`: the target's `edgeform:history`, newest
/// first.
///
/// # Errors
/// An unknown node, the target unreachable.
pub async fn history_cmd(source: &Valid, node: &str, format: Format) -> Result<u8> {
    let Some(n) = source
        .config
        .nodes
        .iter()
        .find(|n| n.name == node && n.redis.is_some())
    else {
        bail!("--node {node}: no such target (targets are nodes with a redis block)");
    };
    let mut con = control::master(n).await?;
    let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(keys::HISTORY)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .with_context(|| format!("reading {} of {node} ({})", keys::HISTORY, n.redis_at()))?;
    let entries = parse_history(&raw);
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => {
            let items: Vec<serde_json::Value> = entries
                .iter()
                .map(|e| match e {
                    Ok(e) => serde_json::to_value(e).unwrap_or_default(),
                    Err(text) => serde_json::json!({ "unreadable": text }),
                })
                .collect();
            let json = serde_json::to_string_pretty(&items)?;
            writeln!(out, "{}", untrusted::json_text(&json))?;
        }
        Format::Human => out.write_all(render(node, &entries).as_bytes())?,
    }
    Ok(0)
}

/// A commit as the history shows it: its first 12 characters (not bytes:
/// the edge's text need not be hex), escaped.
/// An entry's changes in `apply`'s notation: `+added ~changed -deleted`
/// (an entry recorded before added and changed were kept apart:
/// `+written -deleted`, written being both).
fn counts(e: &Entry) -> String {
    match (e.added, e.changed) {
        (Some(a), Some(c)) => format!("+{a} ~{c} -{}", e.deleted),
        _ => format!("+{} -{}", e.written, e.deleted),
    }
}

fn short(c: &str) -> String {
    let (id, dirty) = c.strip_suffix("+dirty").map_or((c, ""), |i| (i, "+dirty"));
    let head: String = id.chars().take(12).collect();
    untrusted::escape(&format!("{head}{dirty}"))
}

/// The human history: one line per write, newest first. Every field an
/// edge's Redis holds is text from that edge: each string is shown
/// through [`untrusted::escape`] (a compromised edge must not drive the
/// operator's terminal), numbers and flags are ours.
#[must_use]
pub fn render(node: &str, entries: &[Result<Entry, String>]) -> String {
    let mut out = String::new();
    if entries.is_empty() {
        let _ = writeln!(out, "{node}: no history");
        return out;
    }
    for e in entries {
        match e {
            Ok(e) => {
                let mut flags = Vec::new();
                if e.forced {
                    flags.push("forced".to_owned());
                }
                if e.break_glass {
                    flags.push(match &e.freeze {
                        Some(w) => format!("break-glass (freeze {})", untrusted::escape(w)),
                        None => "break-glass".into(),
                    });
                }
                if let Some(why) = &e.urgent_renewal {
                    flags.push(format!(
                        "renewal through freeze {}: {}",
                        untrusted::escape(e.freeze.as_deref().unwrap_or("?")),
                        untrusted::escape(why)
                    ));
                }
                if let Some(live) = &e.adopted {
                    flags.push(format!(
                        "adopted: the live commit {} was not in the repository",
                        untrusted::escape(live)
                    ));
                }
                if let Some(wave) = &e.wave {
                    flags.push(format!("wave {}", untrusted::escape(wave)));
                }
                if let Some(consent) = &e.consent {
                    flags.push(untrusted::escape(consent));
                }
                if let Some(real) = &e.clock_moved {
                    flags.push(format!(
                        "clock moved by --now, real time {}",
                        untrusted::escape(real)
                    ));
                }
                let _ = writeln!(
                    out,
                    "{}  {:<5}  gen {:<4}  {} → {}  {}  {}{}  {}",
                    untrusted::escape(&e.at),
                    untrusted::escape(&e.action),
                    e.generation,
                    e.previous_commit
                        .as_deref()
                        .map_or_else(|| "none".into(), short),
                    short(&e.commit),
                    counts(e),
                    untrusted::escape(&e.applied_by),
                    if flags.is_empty() {
                        String::new()
                    } else {
                        format!("  [{}]", flags.join(", "))
                    },
                    untrusted::escape(&e.command),
                );
            }
            Err(text) => {
                let _ = writeln!(out, "(unreadable entry: {text})");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_urgent_renewal_through_a_freeze_says_so_in_the_human_history() {
        let e = Entry {
            at: "2026-12-02T10:00:00Z".into(),
            action: "renew".into(),
            commit: "a".repeat(40),
            previous_commit: Some("a".repeat(40)),
            generation: 7,
            applied_by: "ops@ctl".into(),
            command: "edgeform reconcile --once certs".into(),
            forced: false,
            break_glass: false,
            freeze: Some("final".into()),
            written: 1,
            deleted: 0,
            added: Some(0),
            changed: Some(1),
            adopted: None,
            clock_moved: None,
            urgent_renewal: Some("shop.test expires 2026-12-03T00:00:00Z\u{1b}[31m".into()),
            wave: None,
            consent: None,
        };
        let older = Entry {
            added: None,
            changed: None,
            ..e.clone()
        };
        let text = render("edge-1", &[Ok(e), Ok(older)]);
        assert!(text.contains("renew"), "{text}");
        // apply's notation; an older entry without the split, its total.
        assert!(text.contains("  +0 ~1 -0  "), "{text}");
        assert!(text.contains("  +1 -0  "), "{text}");
        assert!(
            text.contains("[renewal through freeze final: shop.test expires 2026-12-03T00:00:00Z"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "escaped: {text}");
    }
}
