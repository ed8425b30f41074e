//! `edgeform status` and `edgeform exec`: the MQTT side of the CLI.
//!
//! Both read the broker from `cluster.yaml` (`mqtt.url`,
//! `mqtt.topic_prefix`). `status` collects every node's retained health
//! report and status; `exec` publishes one command (QoS 1) and, with
//! `--wait`, prints its result.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Result, bail};
use edgestate::mqtt::{self as wire, Command, CommandResult, HealthReport, Message, Outcome};
use edgestate::untrusted;
use rumqttc::{AsyncClient, Event, EventLoop, Packet, QoS};
use serde::Serialize;

use compiler::workspace::Valid;

/// How the CLI logs in to the broker (the URL is in cluster.yaml).
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// MQTT username; the password is read from [`PASSWORD_ENV`].
    pub mqtt_username: Option<String>,
    /// CA certificate(s) (PEM) for an mqtts:// broker.
    pub mqtt_ca: Option<std::path::PathBuf>,
    /// Give up reaching the broker after this many seconds.
    pub connect_timeout: u64,
}

/// The variable holding the MQTT password for the CLI.
pub const PASSWORD_ENV: &str = "EDGEFORM_MQTT_PASSWORD";
/// The variable holding the command signing key (when set, `exec` signs).
pub const COMMAND_KEY_ENV: &str = "EDGEFORM_COMMAND_KEY";
/// The variable naming the control host's ed25519 private key file
/// (`exec --signing-key`).
pub const SIGNING_KEY_ENV: &str = "EDGEFORM_COMMAND_SIGNING_KEY";

/// How `exec` signs a command and checks its result.
pub enum Signer {
    /// The control host's ed25519 key; results carry the node's result key.
    Ed25519(Box<edgestate::cmdkey::SigningKey>),
    /// The legacy shared HMAC key (migration only).
    Hmac(Vec<u8>),
    /// Unsigned; results cannot be authenticated.
    None,
}

impl Signer {
    /// `--signing-key FILE` when given, else the legacy key from
    /// [`COMMAND_KEY_ENV`], else none.
    ///
    /// # Errors
    /// An unreadable or malformed key file (one line, naming the file).
    pub fn load(signing_key: Option<&std::path::Path>) -> Result<Signer> {
        if let Some(path) = signing_key {
            return Ok(Signer::Ed25519(Box::new(load_signing_key(path)?)));
        }
        Ok(command_key().map_or(Signer::None, Signer::Hmac))
    }

    fn sign(&self, cmd: &mut Command, node: &str) {
        match self {
            Signer::Ed25519(k) => cmd.sign_ed25519(node, k),
            Signer::Hmac(k) => cmd.sign(node, k),
            Signer::None => {}
        }
    }
}

/// Read the control host's ed25519 private key (PKCS8 PEM).
///
/// # Errors
/// One line naming the file: unreadable, or not such a key.
pub fn load_signing_key(path: &std::path::Path) -> Result<edgestate::cmdkey::SigningKey> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the command signing key `{}`: {e}",
            path.display()
        )
    })?;
    let key = edgestate::cmdkey::signing_key_from_pem(&text)
        .map_err(|e| anyhow::anyhow!("`{}`: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "warning: the command signing key `{}` is readable by other users (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
    Ok(key)
}

/// Output of `status`, `history` and `exec`: a human table or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Human,
    Json,
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) struct Session {
    pub(crate) client: AsyncClient,
    events: EventLoop,
    pub(crate) prefix: String,
    url: String,
}

/// Connect (clean session) and wait for the broker's CONNACK.
async fn connect(source: &Valid, flags: &BrokerOptions) -> Result<Session> {
    connect_to(&source.config, flags).await
}

/// [`connect`] from the config alone.
pub(crate) async fn connect_to(
    config: &compiler::Config,
    flags: &BrokerOptions,
) -> Result<Session> {
    let Some(m) = &config.cluster.mqtt else {
        bail!(
            "cluster.yaml has no `mqtt` block (url, topic_prefix): status and exec talk to the nodes through the broker"
        );
    };
    let broker = edgemqtt::Broker {
        url: m.url.clone(),
        username: flags.mqtt_username.clone(),
        password_env: std::env::var_os(PASSWORD_ENV).map(|_| PASSWORD_ENV.to_owned()),
        ca_file: flags.mqtt_ca.clone(),
    };
    let id = format!(
        "edgeform-cli-{:x}-{:x}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    );
    let options = edgemqtt::options(&broker, &id, false)?;
    let (client, mut events) = AsyncClient::new(options, 64);
    let deadline = Duration::from_secs(flags.connect_timeout.max(1));
    let connected = tokio::time::timeout(deadline, async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(edgemqtt::describe(&e)),
            }
        }
    })
    .await;
    match connected {
        Ok(Ok(())) => Ok(Session {
            client,
            events,
            prefix: m.topic_prefix.clone(),
            url: m.url.clone(),
        }),
        Ok(Err(e)) => bail!("cannot reach the MQTT broker {}: {e}", m.url),
        Err(_) => bail!(
            "cannot reach the MQTT broker {}: no answer within {}s",
            m.url,
            deadline.as_secs()
        ),
    }
}

impl Session {
    /// Poll until `done` says so or `limit` passes; `Err` on a lost connection.
    pub(crate) async fn pump(
        &mut self,
        limit: Duration,
        mut on: impl FnMut(&Event) -> bool,
    ) -> Result<bool> {
        let url = self.url.clone();
        let run = async {
            loop {
                match self.events.poll().await {
                    Ok(e) => {
                        if on(&e) {
                            return Ok(());
                        }
                    }
                    Err(e) => {
                        bail!("lost the MQTT broker {url}: {}", edgemqtt::describe(&e))
                    }
                }
            }
        };
        match tokio::time::timeout(limit, run).await {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(false),
        }
    }

    pub(crate) async fn close(mut self) {
        let _ = self.client.try_disconnect();
        let _ = self
            .pump(Duration::from_millis(500), |e| {
                matches!(e, Event::Outgoing(rumqttc::Outgoing::Disconnect))
            })
            .await;
    }
}

/// One row of `status`.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub node: String,
    /// The node's CDN zone from the repository; `None`:
    /// unzoned or not in the repository.
    pub zone: Option<String>,
    pub online: bool,
    pub age_s: Option<u64>,
    pub commit: Option<String>,
    pub desired_commit: Option<String>,
    pub purge_queue: Option<u64>,
    /// Purge jobs kept for the node in this host's outbox (not yet
    /// recorded done on the node), when any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox: Option<usize>,
    pub play_sessions: Option<u64>,
    pub out_kbit: Option<u64>,
    /// `--from redis`: when and by whom the target was last written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied_by: Option<String>,
    /// `--from redis`: why the target could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The installed bundle's version (docs/install.md), when the agent
    /// reports it (`health.bundle_manifest`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_commit: Option<String>,
    /// The agent's serving probe (docs/edge.md, "The serving probe"):
    /// `false` when a listener of the node's edge does not answer; absent
    /// when the agent does not probe (or no report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<bool>,
    /// Version skew (docs/operations.md, "Version skew"): what this
    /// commit's documents for the target use that its installed edge code
    /// (`edgeform:bundle`) does not read — field names, and `tls:*` — so
    /// `apply` refuses the target ("install first"). Empty: none, or the
    /// target's Redis was not read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub install_first: Vec<String>,
    /// The same in words (`site:a.test uses max_body_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skew: Option<String>,
}

/// `status`'s verdict, and its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every node online and every target on the desired commit: exit 0.
    Ok,
    /// Every node online, some target not on the desired commit: exit 2.
    Drift,
    /// Some node offline or unreachable: exit 1.
    Offline,
}

impl Verdict {
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::Drift => 2,
            Verdict::Offline => 1,
        }
    }
}

/// Whether a row counts for the verdict and the table's totals: a target
/// (it has a desired commit), or a node ever heard from.
fn counted(r: &Row, heard: impl Fn(&str) -> bool) -> bool {
    r.desired_commit.is_some() || heard(&r.node)
}

/// The verdict over `rows` (pure). A row counts when it is a target (it
/// has a desired commit) or `heard(node)` (it ever said something: a
/// node with no agent and no Redis is not expected to report). Offline
/// wins over drift.
#[must_use]
pub fn verdict(rows: &[Row], heard: impl Fn(&str) -> bool) -> (Verdict, String) {
    let counts = |r: &&Row| counted(r, &heard);
    let counted = rows.iter().filter(counts);
    let silent: Vec<&str> = rows
        .iter()
        .filter(|r| !counts(r))
        .map(|r| r.node.as_str())
        .collect();
    let offline: Vec<&str> = counted
        .clone()
        .filter(|r| !r.online)
        .map(|r| r.node.as_str())
        .collect();
    // Online (its agent reports) but its edge does not answer: routing
    // already sends nobody there; as bad as offline for the verdict.
    let not_serving: Vec<&str> = counted
        .clone()
        .filter(|r| r.online && r.serving == Some(false))
        .map(|r| r.node.as_str())
        .collect();
    let skewed: Vec<String> = counted
        .clone()
        .filter(|r| !r.install_first.is_empty())
        .map(|r| {
            format!(
                "{} ({})",
                untrusted::escape(&r.node),
                r.install_first.join(", ")
            )
        })
        .collect();
    let behind: Vec<&str> = counted
        .filter(|r| r.desired_commit.is_some() && r.commit != r.desired_commit)
        .map(|r| r.node.as_str())
        .collect();
    let names = |v: &[&str]| {
        v.iter()
            .map(|n| untrusted::escape(n))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if !offline.is_empty() {
        parts.push(format!("offline or unreachable: {}", names(&offline)));
    }
    if !not_serving.is_empty() {
        parts.push(format!("not serving: {}", names(&not_serving)));
    }
    if !behind.is_empty() {
        parts.push(format!("not on the desired commit: {}", names(&behind)));
    }
    if !skewed.is_empty() {
        parts.push(format!("install first: {}", skewed.join(", ")));
    }
    if !offline.is_empty() || !not_serving.is_empty() {
        (Verdict::Offline, parts.join("; "))
    } else if !parts.is_empty() {
        (Verdict::Drift, parts.join("; "))
    } else {
        let mut why = String::from("every node online, every target on the desired commit");
        if !silent.is_empty() {
            why.push_str(&format!(
                " ({} not counted: no Redis and never heard from, so not expected to report)",
                names(&silent)
            ));
        }
        (Verdict::Ok, why)
    }
}

/// Print rows and the verdict; the verdict's exit code.
///
/// # Errors
/// Writing to stdout.
pub fn print_status(
    rows: &[Row],
    heard: impl Fn(&str) -> bool,
    format: Format,
    from_redis: bool,
    soonest: Option<&SoonestExpiry>,
) -> Result<u8> {
    let (v, why) = verdict(rows, &heard);
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => {
            // Rows hold what nodes reported: no raw C1/DEL on the way.
            let mut doc = serde_json::json!({ "nodes": rows, "verdict": v, "why": why });
            if let Some(s) = soonest {
                doc["soonest_certificate_expiry"] = serde_json::to_value(s)?;
            }
            let json = serde_json::to_string_pretty(&doc)?;
            writeln!(out, "{}", untrusted::json_text(&json))?;
        }
        Format::Human => {
            let text = if from_redis {
                table_redis(rows)
            } else {
                table(rows, &heard)
            };
            out.write_all(text.as_bytes())?;
            let word = match v {
                Verdict::Ok => "OK",
                Verdict::Drift => "DRIFT",
                Verdict::Offline => "OFFLINE",
            };
            for r in rows {
                if let Some(n) = r.outbox {
                    writeln!(
                        out,
                        "purge outbox: {} job(s) kept on this host for {} (edgeform purge --flush)",
                        n,
                        untrusted::escape(&r.node)
                    )?;
                }
            }
            for r in rows {
                if let Some(skew) = &r.skew {
                    writeln!(
                        out,
                        "install first: {}'s installed edge code does not read what this commit uses: {} (edgeform install {}, then apply)",
                        untrusted::escape(&r.node),
                        skew,
                        untrusted::escape(&r.node)
                    )?;
                }
            }
            if let Some(s) = soonest {
                writeln!(out, "{}", s.line())?;
            }
            writeln!(out, "verdict: {word}: {why}")?;
        }
    }
    Ok(v.exit_code())
}

/// The certificate, of those the sites use, that expires first (`status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SoonestExpiry {
    /// Its name in the state directory (`acme.<host>` for an ACME site's).
    pub name: String,
    /// The host of the first site (by host) that uses it.
    pub host: String,
    pub not_after: i64,
    pub not_after_rfc3339: String,
    /// Whole days from now to its not-after, rounded toward zero
    /// (negative: expired that many whole days ago).
    pub days_left: i64,
    /// Past its not-after.
    pub expired: bool,
}

impl SoonestExpiry {
    /// Of `certs` (what the state directory holds for the `sites`), the
    /// one with the earliest not-after, at `now`; its host is the first
    /// site's that uses it (none: its first DNS name). Pure.
    #[must_use]
    pub fn of(
        sites: &[compiler::model::resolved::Site],
        certs: &compiler::tls::Certificates,
        now: i64,
    ) -> Option<SoonestExpiry> {
        let c = certs
            .by_name
            .values()
            .min_by_key(|c| (c.not_after, c.name.as_str()))?;
        let host = sites
            .iter()
            .filter(|s| s.tls.as_ref().is_some_and(|t| t.certificate() == c.name))
            .map(|s| s.host.as_str())
            .min()
            .or_else(|| c.names.first().map(String::as_str))
            .unwrap_or("-")
            .to_owned();
        let left = c.not_after.saturating_sub(now);
        Some(SoonestExpiry {
            name: c.name.clone(),
            host,
            not_after: c.not_after,
            not_after_rfc3339: compiler::clock::rfc3339_signed(c.not_after),
            days_left: left / 86_400,
            expired: left <= 0,
        })
    }

    /// [`SoonestExpiry::of`] at the one clock's now (read only when there
    /// is a certificate).
    ///
    /// # Errors
    /// The clock cannot be read.
    pub fn now(
        sites: &[compiler::model::resolved::Site],
        certs: &compiler::tls::Certificates,
    ) -> Result<Option<SoonestExpiry>> {
        if certs.is_empty() {
            return Ok(None);
        }
        Ok(Self::of(
            sites,
            certs,
            i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX),
        ))
    }

    /// `status`'s line.
    #[must_use]
    pub fn line(&self) -> String {
        let when = match (self.expired, self.days_left) {
            (true, 0) => "EXPIRED less than a day ago".to_owned(),
            (true, d) => format!("EXPIRED {} day(s) ago", -d),
            (false, 0) => "in less than a day".to_owned(),
            (false, d) => format!("in {d} day(s)"),
        };
        format!(
            "soonest certificate expiry: {} ({}) not after {}, {when}",
            untrusted::escape(&self.name),
            untrusted::escape(&self.host),
            self.not_after_rfc3339
        )
    }
}

/// The human table of `status --from redis`.
#[must_use]
pub fn table_redis(rows: &[Row]) -> String {
    let dash = || "-".to_owned();
    let mut lines = vec![[
        "NODE".to_owned(),
        "REDIS".into(),
        "COMMIT".into(),
        "APPLIED".into(),
        "BY".into(),
        "PURGE QUEUE".into(),
        "ERROR".into(),
    ]];
    for r in rows {
        let commit = match (&r.commit, &r.desired_commit) {
            _ if !r.online => dash(),
            (Some(c), Some(d)) if c == d => format!("{} (desired)", short_commit(c)),
            (Some(c), Some(d)) => format!("{} ≠ desired {}", short_commit(c), short_commit(d)),
            (None, Some(d)) => format!("none ≠ desired {}", short_commit(d)),
            (Some(c), None) => short_commit(c),
            (None, None) => dash(),
        };
        lines.push([
            untrusted::escape(&r.node),
            if r.online { "up" } else { "unreachable" }.into(),
            commit,
            r.applied_at.as_deref().map_or_else(dash, untrusted::escape),
            r.applied_by.as_deref().map_or_else(dash, untrusted::escape),
            r.purge_queue.map_or_else(dash, |q| q.to_string()),
            r.error
                .as_deref()
                .map_or_else(String::new, |e| cut(&untrusted::escape(e), ERROR_WIDTH)),
        ]);
    }
    align(&lines)
}

/// The widest error `status --from redis` shows in its table (JSON has it
/// whole).
const ERROR_WIDTH: usize = 60;

/// `text` cut to `max` characters, `…` marking the cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// What `status` heard.
#[derive(Debug, Default)]
pub struct Heard {
    pub reports: BTreeMap<String, HealthReport>,
    pub status: BTreeMap<String, bool>,
}

impl Heard {
    fn take(&mut self, prefix: &str, topic: &str, payload: &[u8]) {
        // What cannot be read is left out (the table shows no report).
        match wire::read_message(prefix, topic, payload) {
            Ok(Some(Message::Report(node, Some(r)))) => {
                self.reports.insert(node.to_owned(), *r);
            }
            Ok(Some(Message::Status(node, Some(online)))) => {
                self.status.insert(node.to_owned(), online);
            }
            _ => {}
        }
    }
}

/// The rows: every node of the repo, then nodes that report but are not in
/// it. Pure: `now` and what was heard in, rows out.
#[must_use]
pub fn rows(source: &Valid, heard: &Heard, now: u64) -> Vec<Row> {
    let mut names: Vec<&str> = source
        .config
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    for n in heard.reports.keys().chain(heard.status.keys()) {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let r = heard.reports.get(name);
            let online = heard.status.get(name).copied().unwrap_or(false);
            Row {
                node: name.to_owned(),
                zone: source
                    .config
                    .nodes
                    .iter()
                    .find(|n| n.name == name)
                    .and_then(|n| n.zone.clone()),
                online,
                age_s: r.map(|r| now.saturating_sub(r.ts)),
                commit: r.and_then(|r| r.config.commit.clone()),
                // Targets are the nodes with a Redis; nothing is pushed to others.
                desired_commit: source
                    .config
                    .nodes
                    .iter()
                    .any(|n| n.name == name && n.redis.is_some())
                    .then(|| source.commit.clone()),
                purge_queue: r.and_then(|r| r.purge.queue),
                outbox: None,
                play_sessions: r.and_then(|r| r.play_sessions),
                out_kbit: r.and_then(|r| r.out_kbit),
                applied_at: None,
                applied_by: None,
                error: None,
                bundle: r
                    .and_then(|r| r.bundle.as_ref())
                    .map(|b| b.version.clone().unwrap_or_else(|| "none installed".into())),
                bundle_commit: r
                    .and_then(|r| r.bundle.as_ref())
                    .and_then(|b| b.commit.clone()),
                serving: r.and_then(|r| r.serving),
                install_first: Vec::new(),
                skew: None,
            }
        })
        .collect()
}

/// Fill each row's purge outbox depth from the state store at
/// `state_dir` (nothing when there is none).
pub fn with_outbox(rows: &mut [Row], state_dir: &std::path::Path) {
    let Ok(Some(store)) = control::store::open_existing(state_dir) else {
        return;
    };
    let Ok(depths) = control::outbox::depths(&*store) else {
        return;
    };
    for r in rows {
        r.outbox = depths.get(&r.node).map(|d| d.waiting + d.delivered);
    }
}

/// Fill each target's version skew (docs/operations.md, "Version skew"):
/// what the documents `compiled` for it use that its installed edge code
/// (`bundles`: its `edgeform:bundle`, by node) does not read. A target
/// whose bundle was not read is left as it is. Pure.
pub fn with_skew(
    rows: &mut [Row],
    compiled: &compiler::compile::Compiled,
    bundles: &BTreeMap<String, edgestate::bundle::Bundle>,
) {
    // Edges of a region share their documents: scanned once.
    let mut uses: std::collections::HashMap<usize, edgestate::bundle::Uses> =
        std::collections::HashMap::new();
    for r in rows {
        let (Some(t), Some(b)) = (compiled.targets.get(&r.node), bundles.get(&r.node)) else {
            continue;
        };
        let u = uses
            .entry(std::sync::Arc::as_ptr(&t.sites) as *const () as usize)
            .or_insert_with(|| {
                edgestate::bundle::Uses::of(t.sites.iter().map(|(k, v)| (&**k, &**v)))
            });
        let missing = b.missing(u);
        if missing.is_empty() {
            continue;
        }
        r.install_first = missing
            .fields
            .keys()
            .map(|f| (*f).to_owned())
            .chain(missing.tls_key.as_ref().map(|_| "tls:*".to_owned()))
            .collect();
        r.skew = Some(missing.describe());
    }
}

/// `edgeform status`. `certs`: the certificates `apply` would push (the
/// documents' `tls:*` keys count for the version skew).
///
/// # Errors
/// No `mqtt` in cluster.yaml, the broker unreachable.
pub async fn status(
    source: &Valid,
    flags: &BrokerOptions,
    format: Format,
    state_dir: &std::path::Path,
    certs: &compiler::tls::Certificates,
) -> Result<u8> {
    // Each target's installed code is read from its own Redis while the
    // broker's retained reports arrive.
    let bundle_timeout = Duration::from_secs(flags.connect_timeout.clamp(1, 3));
    let (heard, bundles) = tokio::join!(
        listen(&source.config, flags),
        crate::audit::read_bundles(source, bundle_timeout)
    );
    let heard = heard?;
    let mut rows = rows(source, &heard, unix_now());
    with_outbox(&mut rows, state_dir);
    let compiled = compiler::compile::compile_with(&source.config, certs);
    with_skew(&mut rows, &compiled, &bundles);
    let soonest = SoonestExpiry::now(&source.config.sites, certs)?;
    print_status(
        &rows,
        |n| heard.reports.contains_key(n) || heard.status.contains_key(n),
        format,
        false,
        soonest.as_ref(),
    )
}

/// The live health snapshot from the broker (`edgeform route --health
/// mqtt`): every node's retained report and status, read as
/// the agent's health book reads them (online from the status, or from a
/// report when no status was heard; the last will wins).
///
/// # Errors
/// No `mqtt` in cluster.yaml, the broker unreachable.
pub async fn live_health(
    config: &compiler::Config,
    flags: &BrokerOptions,
) -> Result<edgestate::route::Health> {
    let heard = listen(config, flags).await?;
    Ok(health_of(&heard))
}

/// What was heard as a routing health snapshot. Pure.
#[must_use]
pub fn health_of(heard: &Heard) -> edgestate::route::Health {
    let names: std::collections::BTreeSet<&String> =
        heard.reports.keys().chain(heard.status.keys()).collect();
    edgestate::route::Health {
        nodes: names
            .into_iter()
            .map(|name| {
                let r = heard.reports.get(name);
                (
                    name.clone(),
                    edgestate::route::NodeHealth {
                        online: Some(heard.status.get(name).copied().unwrap_or(r.is_some())),
                        play_sessions: r.and_then(|r| r.play_sessions),
                        out_kbit: r.and_then(|r| r.out_kbit),
                        streams: r.and_then(|r| r.streams.clone()),
                        stale: false,
                        vod: r.and_then(|r| r.vod.clone()),
                        net_kbit: r.and_then(|r| r.net_kbit),
                        serving: r.and_then(|r| r.serving),
                    },
                )
            })
            .collect(),
    }
}

/// Subscribe to every node's health and status and collect the retained
/// messages until they have been quiet for a moment.
async fn listen(config: &compiler::Config, flags: &BrokerOptions) -> Result<Heard> {
    let mut s = connect_to(config, flags).await?;
    let prefix = s.prefix.clone();
    s.client
        .subscribe(format!("{prefix}/health/+"), QoS::AtMostOnce)
        .await?;
    s.client
        .subscribe(format!("{prefix}/status/+"), QoS::AtMostOnce)
        .await?;
    // Retained messages follow the SUBACKs; stop once they have been
    // quiet for a moment.
    let mut heard = Heard::default();
    let mut subacks = 0;
    let started = Instant::now();
    let limit = Duration::from_secs(flags.connect_timeout.max(1));
    while started.elapsed() < limit {
        let mut got = false;
        let quiet = if subacks >= 2 { 300 } else { 1000 };
        s.pump(Duration::from_millis(quiet), |e| {
            if let Event::Incoming(p) = e {
                match p {
                    Packet::SubAck(_) => subacks += 1,
                    Packet::Publish(p) => heard.take(&prefix, &p.topic, &p.payload),
                    _ => return false,
                }
                got = true;
                return true;
            }
            false
        })
        .await?;
        if !got && subacks >= 2 {
            break;
        }
    }
    s.close().await;
    Ok(heard)
}

/// Rows as left-aligned columns two spaces apart (widths in characters),
/// each line without trailing blanks.
pub(crate) fn align<const N: usize>(lines: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for l in lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn short_commit(c: &str) -> String {
    if c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()) {
        c[..12].to_owned()
    } else {
        // Reported by the node: shown escaped.
        untrusted::escape(c)
    }
}

/// The human table with a summary line. A row that does not count (no
/// Redis, never heard from: [`verdict`]'s rule) says so in STATE and is
/// left out of the totals, so the table and the verdict agree.
#[must_use]
pub fn table(rows: &[Row], heard: impl Fn(&str) -> bool) -> String {
    let dash = || "-".to_owned();
    let opt = |v: Option<u64>| v.map_or_else(dash, |v| v.to_string());
    let mut lines = vec![[
        "NODE".to_owned(),
        "ZONE".into(),
        "STATE".into(),
        "AGE".into(),
        "COMMIT".into(),
        "BUNDLE".into(),
        "SESSIONS".into(),
        "KBIT/S".into(),
        "PURGE QUEUE".into(),
    ]];
    let (mut online, mut synced, mut targets, mut not_serving) = (0, 0, 0, 0);
    let mut not_expected = 0;
    for r in rows {
        let counts = counted(r, &heard);
        not_expected += usize::from(!counts);
        online += usize::from(r.online && counts);
        not_serving += usize::from(r.online && r.serving == Some(false));
        let commit = match (&r.commit, &r.desired_commit) {
            _ if r.age_s.is_none() => "(no report)".to_owned(),
            (Some(c), Some(d)) if c == d => {
                synced += 1;
                format!("{} (desired)", short_commit(c))
            }
            (Some(c), Some(d)) => format!("{} ≠ desired {}", short_commit(c), short_commit(d)),
            (None, Some(d)) => format!("none ≠ desired {}", short_commit(d)),
            (Some(c), None) => short_commit(c),
            (None, None) => dash(),
        };
        targets += usize::from(r.desired_commit.is_some());
        lines.push([
            untrusted::escape(&r.node),
            r.zone.clone().unwrap_or_else(dash),
            match (r.online, r.serving) {
                _ if !counts => "— (no agent expected)",
                (true, Some(false)) => "not serving",
                (true, _) => "online",
                (false, _) => "offline",
            }
            .into(),
            r.age_s.map_or_else(dash, |a| format!("{a}s")),
            commit,
            match (&r.bundle, &r.bundle_commit) {
                (Some(v), Some(c)) => format!(
                    "{} (from {})",
                    untrusted::escape(&v.chars().take(12).collect::<String>()),
                    short_commit(c)
                ),
                (Some(v), None) => untrusted::escape(&v.chars().take(12).collect::<String>()),
                _ => dash(),
            },
            opt(r.play_sessions),
            opt(r.out_kbit),
            opt(r.purge_queue),
        ]);
    }
    let mut out = align(&lines);
    let serving = if not_serving > 0 {
        format!(" ({not_serving} not serving)")
    } else {
        String::new()
    };
    let expected = if not_expected > 0 {
        format!(" ({not_expected} with no agent expected not counted)")
    } else {
        String::new()
    };
    out.push_str(&format!(
        "{online}/{} online{serving}{expected}, {synced}/{targets} targets on the desired commit\n",
        rows.len() - not_expected
    ));
    out
}

/// `--arg k=v` pairs.
///
/// # Errors
/// A pair without `=`, an empty or repeated name.
pub fn parse_args(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    let mut args = BTreeMap::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("--arg {p}: write NAME=VALUE");
        };
        if k.is_empty() {
            bail!("--arg {p}: the name is empty");
        }
        if args.insert(k.to_owned(), v.to_owned()).is_some() {
            bail!("--arg {k} is given twice");
        }
    }
    Ok(args)
}

/// What `exec` sends.
pub struct Exec<'a> {
    pub node: &'a str,
    pub action: &'a str,
    pub args: &'a [String],
    pub wait: Option<u64>,
    pub ttl: Duration,
    pub format: Format,
    /// `--signing-key FILE`: the control host's ed25519 private key.
    pub signing_key: Option<&'a std::path::Path>,
}

/// `edgeform exec`.
///
/// # Errors
/// No `mqtt` in cluster.yaml, an unknown node, bad `--arg`, the broker
/// unreachable.
pub async fn exec(source: &Valid, flags: &BrokerOptions, e: &Exec<'_>) -> Result<u8> {
    let Some(region) = source
        .config
        .nodes
        .iter()
        .find(|n| n.name == e.node)
        .map(|n| n.region.as_str())
    else {
        let names: Vec<&str> = source
            .config
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        bail!(
            "--node {}: no such node (nodes: {})",
            e.node,
            names.join(", ")
        );
    };
    let args = parse_args(e.args)?;
    let signer = Signer::load(e.signing_key)?;
    let now = unix_now();
    let wait = e.wait.map(Duration::from_secs);
    let ttl = wait.map_or(e.ttl, |w| w.max(e.ttl));
    let mut cmd = Command {
        id: format!(
            "{:x}-{:x}",
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            std::process::id()
        ),
        action: e.action.to_owned(),
        args,
        issued_at: now,
        expires_at: now + ttl.as_secs(),
        sig: None,
    };
    signer.sign(&mut cmd, e.node);
    let mut s = connect(source, flags).await?;
    let result_topic = wire::result_topic(&s.prefix, e.node, &cmd.id);
    if wait.is_some() {
        s.client.subscribe(&result_topic, QoS::AtLeastOnce).await?;
        let subscribed = s
            .pump(Duration::from_secs(5), |ev| {
                matches!(ev, Event::Incoming(Packet::SubAck(_)))
            })
            .await?;
        if !subscribed {
            bail!("the broker did not confirm the subscription to {result_topic}");
        }
    }
    // Only the node's own answer counts: signed for this command with the
    // key when there is one; anything else on the topic is reported and
    // ignored, and exec keeps waiting. Watched for from the moment the
    // command is sent: an agent refusing it at once can answer before the
    // broker's second acknowledgement arrives.
    let mut result: Option<CommandResult> = None;
    let mut heard = |ev: &Event| {
        if let Event::Incoming(Packet::Publish(p)) = ev
            && p.topic == result_topic
            && result.is_none()
        {
            match accept_result(&p.payload, &cmd, e.node, &signer) {
                Ok(r) => result = Some(r),
                Err(why) => eprintln!("warning: ignored a result on {result_topic}: {why}"),
            }
        }
        result.is_some()
    };
    let mut answered = false;
    let sent = send_command(&s, region, e.node, &cmd).await?;
    let mut acks = 0;
    let acked = s
        .pump(Duration::from_secs(5), |ev| {
            answered |= heard(ev);
            acks += usize::from(matches!(ev, Event::Incoming(Packet::PubAck(_))));
            acks == sent
        })
        .await?;
    if !acked {
        bail!("the broker did not acknowledge the command");
    }
    eprintln!(
        "sent {} to {} (id {}, expires in {}s{})",
        cmd.action,
        e.node,
        cmd.id,
        ttl.as_secs(),
        if cmd.sig.is_some() { ", signed" } else { "" }
    );
    let Some(wait) = wait else {
        s.close().await;
        if e.format == Format::Json {
            println!(
                "{}",
                serde_json::json!({"id": cmd.id, "node": e.node, "queued": true})
            );
        }
        return Ok(0);
    };
    let got = answered || s.pump(wait, heard).await?;
    let result = match result.filter(|_| got) {
        Some(r) => r,
        None => match missing(&mut s, &cmd, (region, e.node), &signer, &result_topic).await? {
            Missing::Late(r) => r,
            why => {
                s.close().await;
                let left = cmd.expires_at.saturating_sub(unix_now());
                eprintln!(
                    "no result from {} within {}s: {}",
                    e.node,
                    wait.as_secs(),
                    why.explain(left)
                );
                if e.format == Format::Json {
                    println!(
                        "{}",
                        serde_json::json!({"id": cmd.id, "node": e.node, "result": null, "missing": why.as_str()})
                    );
                }
                return Ok(1);
            }
        },
    };
    s.close().await;
    let r = result;
    let mut out = std::io::stdout().lock();
    match e.format {
        // The node's output: no raw C1/DEL on the way.
        Format::Json => writeln!(
            out,
            "{}",
            untrusted::json_text(&serde_json::to_string_pretty(&r)?)
        )?,
        Format::Human => out.write_all(describe(&r).as_bytes())?,
    }
    Ok(u8::from(r.status != Outcome::Ok))
}

/// Publish `cmd` for `node` of `region` on both its topics: `<prefix>/cmd/<node>`,
/// which a single broker delivers to the agent, and
/// `<prefix>/region/<region>/cmd/<node>`, which only the region's bridge
/// takes down from a central broker (delivering it there as
/// `<prefix>/cmd/<node>`), so that a command crosses to its own region
/// only. Either way the agent receives one copy. Returns how many
/// publishes await their PUBACK.
async fn send_command(s: &Session, region: &str, node: &str, cmd: &Command) -> Result<usize> {
    let payload = serde_json::to_vec(cmd)?;
    if payload.len() > wire::COMMAND_MAX_BYTES {
        bail!(
            "the command is {} bytes; agents drop commands over {} bytes (shorten its arguments)",
            payload.len(),
            wire::COMMAND_MAX_BYTES
        );
    }
    let topics = [
        wire::cmd_topic(&s.prefix, node),
        wire::region_cmd_topic(&s.prefix, region, node),
    ];
    for topic in &topics {
        s.client
            .publish(topic, QoS::AtLeastOnce, false, payload.clone())
            .await?;
    }
    Ok(topics.len())
}

/// What became of a command whose result did not come within `--wait`.
#[derive(Debug)]
enum Missing {
    /// It came after all, while looking.
    Late(CommandResult),
    /// The agent answered a command sent after it, and never this one:
    /// the broker dropped it.
    Dropped,
    /// The agent is online but answered neither: still busy with earlier
    /// commands (or both were dropped).
    Busy,
    /// The agent is offline (or never reported).
    Offline,
    /// The node's region's bridge to this (central) broker is down.
    RegionCut(String),
}

/// Where a central broker holds the bridge state of `region`'s broker
/// (`1` up, `0` down: the bridge's last will), as packaging/mosquitto/
/// regional.conf names the bridge (`remote_clientid
/// edgeform-bridge-<region>`, `notifications true`).
fn bridge_state_topic(region: &str) -> String {
    format!("$SYS/broker/connection/edgeform-bridge-{region}/state")
}

/// How long `exec` waits for the probe's answer.
const PROBE_WAIT: Duration = Duration::from_secs(10);

impl Missing {
    /// For `--format json`.
    fn as_str(&self) -> &'static str {
        match self {
            Missing::Late(_) => "late",
            Missing::Dropped => "dropped",
            Missing::Busy => "agent-busy",
            Missing::Offline => "agent-offline",
            Missing::RegionCut(_) => "region-cut",
        }
    }

    /// The explanation, with the seconds left before the command expires.
    fn explain(&self, left: u64) -> String {
        const QUEUE: &str = "mosquitto keeps at most `max_queued_messages` (default 1000) QoS 1 messages per client beyond those in flight and silently drops the rest: raise it (docs/operations.md, \"Command bursts\")";
        match self {
            Missing::Late(_) => String::new(),
            Missing::Dropped => format!(
                "DROPPED: its agent answered a command sent after it, and commands are answered in order, so this one never reached it — the broker dropped it ({QUEUE}); send it again"
            ),
            Missing::Busy => format!(
                "its agent is online but answered neither this command nor a later probe within {}s: it is still working through earlier commands (this one stays queued for it until it expires in {left}s), or the broker dropped both ({QUEUE})",
                PROBE_WAIT.as_secs()
            ),
            Missing::Offline => format!(
                "its agent is offline (or never reported): the command stays queued for it until it expires in {left}s, if the broker keeps it ({QUEUE})"
            ),
            Missing::RegionCut(region) => format!(
                "region {region}'s bridge to this broker (edgeform-bridge-{region}) is down: the command waits on this broker and runs once the bridge is back, if before it expires in {left}s ({QUEUE})"
            ),
        }
    }
}

/// Find out why no result came: the node's retained status, then — when
/// it is online — a probe command sent after the first on the same
/// connection and topic (so the broker delivers it after it, and the agent
/// answers in order): the probe answered and the command not means the
/// command was dropped on the way.
async fn missing(
    s: &mut Session,
    cmd: &Command,
    (region, node): (&str, &str),
    signer: &Signer,
    result_topic: &str,
) -> Result<Missing> {
    let status_topic = wire::status_topic(&s.prefix, node);
    // With regional brokers, the central holds the region's bridge state
    // (`notifications true`, packaging/mosquitto/regional.conf): `0` while
    // it is cut off. A single broker has none.
    let bridge_topic = bridge_state_topic(region);
    s.client.subscribe(&bridge_topic, QoS::AtMostOnce).await?;
    s.client.subscribe(&status_topic, QoS::AtLeastOnce).await?;
    let mut online: Option<bool> = None;
    let mut bridge_up: Option<bool> = None;
    let mut late: Option<CommandResult> = None;
    // The retained messages come right after their SUBACKs (none: the
    // node never reported, no bridge); a moment past the last SUBACK is
    // enough.
    let mut subacks = 0;
    let look = |ev: &Event,
                late: &mut Option<CommandResult>,
                online: &mut Option<bool>,
                bridge_up: &mut Option<bool>| {
        let Event::Incoming(Packet::Publish(p)) = ev else {
            return false;
        };
        if p.topic == result_topic {
            *late = accept_result(&p.payload, cmd, node, signer).ok();
            return late.is_some();
        }
        if p.topic == bridge_topic {
            *bridge_up = Some(p.payload.as_ref() != b"0");
            return false;
        }
        if p.topic == status_topic {
            *online = Some(p.payload.as_ref() == wire::ONLINE.as_bytes());
            return true;
        }
        false
    };
    let done = s
        .pump(Duration::from_secs(2), |ev| {
            subacks += usize::from(matches!(ev, Event::Incoming(Packet::SubAck(_))));
            look(ev, &mut late, &mut online, &mut bridge_up) || subacks == 2
        })
        .await?;
    if done && late.is_none() && online.is_none() {
        s.pump(Duration::from_millis(500), |ev| {
            look(ev, &mut late, &mut online, &mut bridge_up)
        })
        .await?;
    }
    if let Some(r) = late {
        return Ok(Missing::Late(r));
    }
    if bridge_up == Some(false) {
        // The central's status of the node is from before the cut.
        return Ok(Missing::RegionCut(region.to_owned()));
    }
    if online != Some(true) {
        return Ok(Missing::Offline);
    }
    let now = unix_now();
    let mut probe = Command {
        id: format!("{}.probe", cmd.id),
        action: wire::PROBE_ACTION.to_owned(),
        args: BTreeMap::new(),
        issued_at: now,
        expires_at: now + PROBE_WAIT.as_secs() + 60,
        sig: None,
    };
    signer.sign(&mut probe, node);
    let probe_topic = wire::result_topic(&s.prefix, node, &probe.id);
    s.client.subscribe(&probe_topic, QoS::AtLeastOnce).await?;
    send_command(s, region, node, &probe).await?;
    let mut answered = false;
    s.pump(PROBE_WAIT, |ev| {
        let Event::Incoming(Packet::Publish(p)) = ev else {
            return false;
        };
        if p.topic == result_topic {
            late = accept_result(&p.payload, cmd, node, signer).ok();
            return late.is_some();
        }
        if p.topic == probe_topic && accept_result(&p.payload, &probe, node, signer).is_ok() {
            answered = true;
            return true;
        }
        false
    })
    .await?;
    if late.is_none() && answered {
        // The command's own result, had it been answered, was published
        // before the probe's: a moment for it to arrive anyway.
        s.pump(Duration::from_secs(1), |ev| {
            let Event::Incoming(Packet::Publish(p)) = ev else {
                return false;
            };
            if p.topic == result_topic {
                late = accept_result(&p.payload, cmd, node, signer).ok();
            }
            late.is_some()
        })
        .await?;
    }
    Ok(match (late, answered) {
        (Some(r), _) => Missing::Late(r),
        (None, true) => Missing::Dropped,
        (None, false) => Missing::Busy,
    })
}

/// The command key from [`COMMAND_KEY_ENV`], when set and not empty.
fn command_key() -> Option<Vec<u8>> {
    std::env::var(COMMAND_KEY_ENV)
        .ok()
        .filter(|k| !k.is_empty())
        .map(String::into_bytes)
}

/// Whether `payload` is `node`'s answer to `cmd`: a result for this id and
/// node, and — with a key — signed for this very command. Without a key
/// results cannot be authenticated (docs/operations.md says so).
///
/// # Errors
/// Why it is not (shown escaped: it is the sender's text).
pub fn accept_result(
    payload: &[u8],
    cmd: &Command,
    node: &str,
    signer: &Signer,
) -> Result<CommandResult, String> {
    let r: CommandResult =
        serde_json::from_slice(payload).map_err(|e| format!("not a command result: {e}"))?;
    if r.id != cmd.id || r.node != node {
        return Err(format!(
            "it answers {} on {}, not {} on {node}",
            untrusted::escape(&r.id),
            untrusted::escape(&r.node),
            cmd.id
        ));
    }
    let verified = match signer {
        Signer::Ed25519(k) => Some(r.verify_for_control(cmd, node, k)),
        Signer::Hmac(k) => Some(r.verify(cmd, node, k)),
        Signer::None => None,
    };
    if verified == Some(false) {
        return Err(format!(
            "{} (it claims: {}{})",
            if r.sig.is_some() {
                "its signature does not verify: forged, or signed with another key"
            } else {
                "it is unsigned: not from an agent holding the command key (or its result key)"
            },
            r.status.as_str(),
            r.reason
                .as_deref()
                .map(|x| format!(": {}", untrusted::escape(x)))
                .unwrap_or_default()
        ));
    }
    Ok(r)
}

/// A result as a few lines of text; every string from the node is
/// shown with control characters escaped.
#[must_use]
pub fn describe(r: &CommandResult) -> String {
    let status = r.status.as_str();
    let mut out = format!(
        "{}: {} {status}",
        untrusted::escape(&r.node),
        untrusted::escape(&r.action)
    );
    if let Some(code) = r.exit_code {
        out.push_str(&format!(", exit {code}"));
    }
    out.push_str(&format!(" in {} ms\n", r.duration_ms));
    if let Some(reason) = &r.reason {
        out.push_str(&format!("  reason: {}\n", untrusted::escape(reason)));
    }
    for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        if !text.is_empty() {
            out.push_str(&format!("  {name}:\n"));
            // A tab stays a tab (columns, as `du` prints them): it
            // cannot drive a terminal. Every other control is escaped.
            for line in text.lines() {
                let shown: Vec<String> = line.split('\t').map(untrusted::escape).collect();
                out.push_str(&format!("    {}\n", shown.join("\t")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args() {
        let a = parse_args(&["zone=eu".into(), "url=http://x/?a=b".into()]).unwrap();
        assert_eq!(a["url"], "http://x/?a=b", "split at the first =");
        assert!(parse_args(&["novalue".into()]).is_err());
        assert!(parse_args(&["=x".into()]).is_err());
        assert!(parse_args(&["a=1".into(), "a=2".into()]).is_err());
    }

    #[test]
    fn a_results_output_keeps_its_tabs_and_escapes_every_other_control() {
        let r = CommandResult {
            id: "1".into(),
            node: "edge-1".into(),
            action: "cache-usage".into(),
            status: Outcome::Ok,
            exit_code: Some(0),
            stdout: "12345\t/var/cache/nginx\n\u{1b}[2Jx\ry\n".into(),
            stderr: String::new(),
            duration_ms: 3,
            reason: None,
            finished_at: 0,
            sig: None,
        };
        let text = describe(&r);
        assert!(text.contains("    12345\t/var/cache/nginx\n"), "{text}");
        assert!(text.contains("\\u{1b}[2Jx\\ry"), "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text}");
    }

    #[test]
    fn status_rows_carry_the_outbox_depth_of_this_host() {
        let dir =
            std::env::temp_dir().join(format!("edgeform-status-outbox-{}", std::process::id()));
        let store = control::store::DirStore::open(&dir).unwrap();
        control::outbox::spool(&store, "a", "1-1", r#"{"id":"1-1","key":"k"}"#).unwrap();
        control::outbox::spool(&store, "a", "2-1", r#"{"id":"2-1","key":"k"}"#).unwrap();
        let row = |node: &str| Row {
            node: node.into(),
            zone: None,
            online: true,
            age_s: None,
            commit: None,
            desired_commit: None,
            purge_queue: None,
            outbox: None,
            play_sessions: None,
            bundle: None,
            bundle_commit: None,
            serving: None,
            install_first: Vec::new(),
            skew: None,
            out_kbit: None,
            applied_at: None,
            applied_by: None,
            error: None,
        };
        let mut rows = vec![row("a"), row("b")];
        with_outbox(&mut rows, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(rows[0].outbox, Some(2));
        assert_eq!(rows[1].outbox, None);
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["outbox"], 2);
        assert!(json[1].get("outbox").is_none());
    }

    #[test]
    fn table_summarises() {
        let rows = vec![
            Row {
                node: "a".into(),
                zone: Some("eu".into()),
                online: true,
                age_s: Some(2),
                commit: Some("c1".into()),
                desired_commit: Some("c1".into()),
                purge_queue: Some(0),
                outbox: None,
                play_sessions: Some(5),
                bundle: None,
                bundle_commit: None,
                serving: None,
                install_first: Vec::new(),
                skew: None,
                out_kbit: Some(1200),
                applied_at: None,
                applied_by: None,
                error: None,
            },
            Row {
                node: "b".into(),
                zone: None,
                online: false,
                age_s: None,
                commit: None,
                desired_commit: Some("c1".into()),
                purge_queue: None,
                outbox: None,
                play_sessions: None,
                bundle: None,
                bundle_commit: None,
                serving: None,
                install_first: Vec::new(),
                skew: None,
                out_kbit: None,
                applied_at: None,
                applied_by: None,
                error: None,
            },
        ];
        let t = table(&rows, |_| false);
        assert!(t.contains("c1 (desired)"), "{t}");
        // Each node's zone has its column.
        assert!(t.starts_with("NODE  ZONE  STATE"), "{t}");
        assert!(t.contains("\na     eu    online"), "{t}");
        assert!(t.contains("\nb     -     offline"), "{t}");
        assert!(t.contains("(no report)"), "{t}");
        assert!(
            t.ends_with("1/2 online, 1/2 targets on the desired commit\n"),
            "{t}"
        );
    }

    fn row(node: &str, online: bool, commit: Option<&str>, target: bool) -> Row {
        Row {
            node: node.into(),
            zone: None,
            online,
            age_s: None,
            commit: commit.map(Into::into),
            desired_commit: target.then(|| "c2".into()),
            purge_queue: None,
            outbox: None,
            play_sessions: None,
            out_kbit: None,
            applied_at: None,
            applied_by: None,
            error: None,
            bundle: None,
            bundle_commit: None,
            serving: None,
            install_first: Vec::new(),
            skew: None,
        }
    }

    /// A node with no Redis never heard from (an origin, a router) is
    /// marked in the table and left out of its totals, as the verdict
    /// leaves it out: both say every node online.
    #[test]
    fn the_table_and_the_verdict_agree_on_nodes_with_no_agent_expected() {
        let rows = [
            row("a", true, Some("c2"), true),
            row("origin-1", false, None, false),
        ];
        let nobody = |_: &str| false;
        let t = table(&rows, nobody);
        assert!(t.contains("origin-1  -     — (no agent expected)"), "{t}");
        assert!(
            t.contains("\n1/1 online (1 with no agent expected not counted), "),
            "{t}"
        );
        assert_eq!(verdict(&rows, nobody).0, Verdict::Ok);
        // Once heard from (its last will), it counts: offline in both.
        let t = table(&rows, |n| n == "origin-1");
        assert!(t.contains("offline") && t.contains("1/2 online,"), "{t}");
    }

    /// `status --from redis`: an unreachable node's error has its own
    /// column, cut, never the COMMIT column.
    #[test]
    fn an_unreachable_redis_error_has_its_own_column_cut() {
        let mut down = row("b", false, None, true);
        down.error = Some(format!("connection refused {}", "x".repeat(200)));
        let t = table_redis(&[row("a", true, Some("c2"), true), down]);
        let header = t.lines().next().unwrap();
        assert!(header.trim_end().ends_with("ERROR"), "{t}");
        let line = t.lines().find(|l| l.starts_with("b ")).unwrap();
        assert!(line.contains("unreachable  -"), "{t}");
        assert!(
            line.ends_with('…') && line.contains("connection refused"),
            "{t}"
        );
        assert!(line.chars().count() < 140, "{t}");
    }

    // The verdict: offline before drift, drift before ok.
    #[test]
    fn the_soonest_expiry_says_how_far_off_it_is() {
        let certs = |left: i64| {
            let c = compiler::tls::Certificate {
                name: "acme.a.test".into(),
                chain: String::new(),
                key: String::new(),
                fingerprint: String::new(),
                not_before: 0,
                not_after: 1_000_000 + left,
                names: vec!["a.test".into()],
                key_matches: true,
            };
            compiler::tls::Certificates {
                by_name: [(c.name.clone(), c)].into(),
            }
        };
        let s = |left: i64| SoonestExpiry::of(&[], &certs(left), 1_000_000).unwrap();
        assert!(s(12 * 86_400 + 5).line().ends_with(", in 12 day(s)"));
        assert!(s(5).line().ends_with(", in less than a day"));
        assert!(s(0).line().ends_with(", EXPIRED less than a day ago"));
        assert!(s(-5).line().ends_with(", EXPIRED less than a day ago"));
        assert!(
            s(-3 * 86_400 - 5)
                .line()
                .ends_with(", EXPIRED 3 day(s) ago")
        );
        assert_eq!(
            s(86_400).line(),
            "soonest certificate expiry: acme.a.test (a.test) not after 1970-01-13T13:46:40Z, in 1 day(s)"
        );
    }

    #[test]
    fn verdicts() {
        let nobody = |_: &str| false;
        let ok = [
            row("a", true, Some("c2"), true),
            row("o", false, None, false),
        ];
        // An origin with no agent that never said anything is not expected.
        let (v, why) = verdict(&ok, nobody);
        assert_eq!(v, Verdict::Ok);
        assert_eq!(
            why,
            "every node online, every target on the desired commit (o not counted: no Redis \
             and never heard from, so not expected to report)"
        );
        // ... but once heard (its last will: offline), it counts.
        assert_eq!(verdict(&ok, |n| n == "o").0, Verdict::Offline);
        let behind = [row("a", true, Some("c1"), true), row("b", true, None, true)];
        let (v, why) = verdict(&behind, nobody);
        assert_eq!((v, v.exit_code()), (Verdict::Drift, 2));
        assert_eq!(why, "not on the desired commit: a, b");
        let both = [
            row("a", true, Some("c1"), true),
            row("b", false, None, true),
        ];
        let (v, why) = verdict(&both, nobody);
        assert_eq!((v, v.exit_code()), (Verdict::Offline, 1));
        assert_eq!(
            why,
            "offline or unreachable: b; not on the desired commit: a, b"
        );
        assert_eq!(Verdict::Ok.exit_code(), 0);
    }
}
