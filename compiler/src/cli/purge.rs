//! `edgeform purge`: one job onto every targeted node's own queue.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use edgestate::purge::{self, Job, Request};

use crate::Config;
use crate::model::resolved::{Node, Role, Site};

/// What to purge.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct What {
    /// One URL (`https://host/path?query`) or path (`/path`, both schemes):
    /// an exact-key purge, no scan.
    #[arg(long, value_name = "URL|PATH")]
    pub url: Option<String>,
    /// Every URL whose path starts with PATH.
    #[arg(long, value_name = "PATH")]
    pub prefix: Option<String>,
    /// Every URL whose path (with query) matches RE (`^` anchors at the
    /// path's start).
    #[arg(long, value_name = "RE")]
    pub regex: Option<String>,
    /// Everything cached for the site.
    #[arg(long)]
    pub all: bool,
}

fn job_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

fn find_site<'a>(sites: &'a [Site], host: &str) -> Option<&'a Site> {
    sites
        .iter()
        .find(|s| s.host == host || s.aliases.iter().any(|a| a == host))
}

/// The job for one node (its own cache key template).
///
/// # Errors
/// A pattern the agent's engine refuses, a URL for another site, a key
/// template edgeform cannot compute.
pub fn build_job(id: &str, site: &Site, node: &Node, what: &What) -> Result<Job, String> {
    let template = &node.cache.key;
    let hosts: Vec<&str> = std::iter::once(site.host.as_str())
        .chain(site.aliases.iter().map(String::as_str))
        .collect();
    let mut job = Job {
        id: Some(id.to_owned()),
        site: Some(site.host.clone()),
        grep: None,
        key: None,
        keys: None,
        // Site-scoped, but everything of the site: say so (#12 item 15).
        all: what.all,
    };
    if let Some(url) = &what.url {
        let (schemes, host, uri): (Vec<&str>, Vec<&str>, &str) =
            if let Some(rest) = url.strip_prefix('/').map(|_| url.as_str()) {
                (vec!["http", "https"], hosts.clone(), rest)
            } else {
                let (scheme, rest) = url
                    .split_once("://")
                    .ok_or_else(|| format!("`{url}` is neither a URL nor a /path"))?;
                if scheme != "http" && scheme != "https" {
                    return Err(format!("`{url}`: only http and https URLs are cached"));
                }
                let (host, path) = rest
                    .find('/')
                    .map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
                if !hosts.contains(&host) {
                    return Err(format!("`{host}` is not a hostname of site {}", site.host));
                }
                (vec![scheme], vec![host], path)
            };
        if host.iter().any(|h| h.starts_with("*.")) {
            return Err("a wildcard site needs a full URL with the real hostname for --url".into());
        }
        let mut keys = Vec::new();
        for s in &schemes {
            for h in &host {
                keys.push(purge::expand_key(
                    template,
                    &Request {
                        scheme: s,
                        host: h,
                        request_uri: uri,
                    },
                )?);
            }
        }
        job.keys = Some(keys);
        return Ok(job);
    }
    let uri_regex = if let Some(prefix) = &what.prefix {
        if !prefix.starts_with('/') {
            return Err(format!("--prefix `{prefix}` must start with `/`"));
        }
        regex::escape(prefix)
    } else if let Some(re) = &what.regex {
        purge::matcher(re).map_err(|e| format!("the agent's regex engine refuses `{re}`: {e}"))?;
        match re.strip_prefix('^') {
            Some(anchored) => anchored.to_owned(),
            None => format!("/.*?(?:{re})"),
        }
    } else {
        "/".to_owned()
    };
    let pattern = purge::key_line_regex(template, &hosts, &uri_regex)?;
    // The agent's own verdict: one engine, one size limit, one scope guard.
    Job::grep_matcher(&pattern, job.all)
        .map_err(|e| format!("the built pattern `{pattern}` is refused: {e}"))?;
    job.grep = Some(pattern);
    Ok(job)
}

/// `edgeform purge`.
///
/// # Errors
/// Unknown site or node, a refused pattern, every target unreachable.
pub async fn purge(
    config: &Config,
    host: &str,
    what: &What,
    only: &[String],
    wait: Option<u64>,
) -> Result<u8> {
    let site = find_site(&config.sites, host)
        .with_context(|| format!("no site has the hostname `{host}`"))?;
    let carriers: Vec<&Node> = config
        .nodes
        .iter()
        .filter(|n| n.has(Role::Edge) && n.redis.is_some())
        .filter(|n| site.regions.as_ref().is_none_or(|r| r.contains(&n.region)))
        .collect();
    let targets: Vec<&Node> = if only.is_empty() {
        carriers
    } else {
        only.iter()
            .map(|name| {
                carriers
                    .iter()
                    .find(|n| &n.name == name)
                    .copied()
                    .with_context(|| {
                        format!(
                            "--node {name}: not an edge (with a redis block) carrying {}",
                            site.host
                        )
                    })
            })
            .collect::<Result<_>>()?
    };
    if targets.is_empty() {
        bail!(
            "no edge carries {} (edges with a redis block in its regions)",
            site.host
        );
    }
    let id = job_id();
    // Build every node's job first: a refused pattern queues nothing.
    let mut jobs = Vec::new();
    for node in &targets {
        let job = build_job(&id, site, node, what).map_err(|e| anyhow::anyhow!("{e}"))?;
        jobs.push((*node, job));
    }
    let mut queued = Vec::new();
    let mut failed = 0;
    for (node, job) in &jobs {
        let queue = edgestate::keys::purge_queue(&node.region, &node.name);
        let result = async {
            let mut con = node.redis_master().await?;
            redis::cmd("RPUSH")
                .arg(&queue)
                .arg(job.to_json())
                .exec_async(&mut con)
                .await?;
            anyhow::Ok(())
        }
        .await;
        match result {
            Ok(()) => queued.push(*node),
            Err(e) => {
                failed += 1;
                eprintln!(
                    "{}: NOT QUEUED ({}): {}",
                    node.name,
                    node.redis_at(),
                    edgeredis::one_line(&e)
                );
            }
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{id}")?;
    eprintln!(
        "queued purge {id} for {} on {} node(s): {}",
        site.host,
        queued.len(),
        queued
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let Some(secs) = wait else {
        return Ok(u8::from(failed > 0));
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut results: BTreeMap<String, String> = BTreeMap::new();
    let mut connections = BTreeMap::new();
    while results.len() < queued.len() && Instant::now() < deadline {
        for node in &queued {
            if results.contains_key(&node.name) {
                continue;
            }
            if !connections.contains_key(&node.name) {
                match node.redis_master().await {
                    Ok(c) => {
                        connections.insert(node.name.clone(), c);
                    }
                    Err(_) => continue,
                }
            }
            let con = connections.get_mut(&node.name).expect("inserted");
            let v: Option<String> = match redis::cmd("HGET")
                .arg(purge::done_key(&id))
                .arg(&node.name)
                .query_async(con)
                .await
            {
                Ok(v) => v,
                Err(_) => {
                    connections.remove(&node.name);
                    continue;
                }
            };
            if let Some(v) = v {
                results.insert(node.name.clone(), v);
            }
        }
        if results.len() < queued.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut bad = failed;
    for node in &queued {
        match results.get(&node.name) {
            Some(v) if v.starts_with(purge::FAILED_PREFIX) => {
                bad += 1;
                // The agent's text: shown escaped (#12 item 3).
                writeln!(out, "{}: {}", node.name, edgestate::untrusted::escape(v))?;
            }
            Some(v) => writeln!(
                out,
                "{}: {} file(s) removed",
                node.name,
                edgestate::untrusted::escape(v)
            )?,
            None => {}
        }
    }
    let pending: Vec<&str> = queued
        .iter()
        .filter(|n| !results.contains_key(&n.name))
        .map(|n| n.name.as_str())
        .collect();
    if !pending.is_empty() {
        eprintln!(
            "timed out after {secs} s; still pending: {}",
            pending.join(", ")
        );
        return Ok(1);
    }
    Ok(u8::from(bad > 0))
}
