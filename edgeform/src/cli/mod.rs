//! The `edgeform` command line. Parses flags, runs one command, returns
//! the process exit code (README, "Exit codes"): 0 success / nothing to
//! do, 1 error or invalid, 2 changes pending (`diff`, `plan
//! --detailed-exitcode`) or a flagged prefix (`anycast`), 3 a purge job
//! kept in the outbox (`purge`), 64 usage error.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use compiler::report;
use compiler::workspace::{self, Source, Valid};
use compiler::{Checked, compile, diff};

pub mod anycast;
pub mod certs;
pub mod explain;
pub mod init;
pub mod install;
mod memory;
pub mod ops;
pub mod purge;
pub mod push;
pub mod rollout;
pub mod route;
pub mod secrets;
pub mod serve;
pub mod state;

/// The heading under which `--help` lists the options every subcommand
/// takes, apart from the subcommand's own.
const GLOBAL: &str = "Global options";

/// GitOps control plane for a self-run CDN: validate, compile, diff and push
/// the config repository (sites, zones, nodes) to every edge's own Redis.
#[derive(Debug, Parser)]
#[command(name = "edgeform", version = version(), about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    /// The config repository (folder with cluster.yaml, sites/, zones/, nodes/).
    #[arg(long, global = true, help_heading = GLOBAL, default_value = ".", value_name = "DIR")]
    pub repo: PathBuf,
    /// Read this git revision (through git2, without a checkout) instead of
    /// the working tree.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "REV")]
    pub rev: Option<String>,
    /// Log lines on stderr: text, or json (one JSON object per line, for
    /// log shippers).
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        value_enum,
        default_value = "text",
        env = "EDGEFORM_LOG_FORMAT",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,
    /// Drills and tests: run as if it were TIME (RFC 3339, or Unix seconds)
    /// for freeze windows, certificates' expiry, `explain`'s clearance
    /// cookies and history timestamps. Every history entry written under
    /// it says so (`clock_moved`, with the real time).
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "TIME", value_parser = compiler::clock::parse_flag)]
    pub now: Option<u64>,
    /// The control host's state directory: what never goes in git (node
    /// secrets). Created 0700; refused when others can read it.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = control::store::DIR_ENV,
        default_value = control::store::DEFAULT_DIR,
        value_name = "DIR"
    )]
    pub state_dir: PathBuf,
    /// A shared state store instead of the state directory, so two
    /// control hosts share secrets, certificates, the ACME account, the
    /// last good commit and the purge outbox: a redis:// or rediss:// URL
    /// (password from EDGEFORM_STATE_STORE_PASSWORD), or a YAML file
    /// holding a `redis:` block as a node file writes it (Sentinels, ACL
    /// user, password_env, TLS with a CA). The renewal state stays in
    /// --state-dir.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = control::store::STORE_ENV,
        value_name = "URL|FILE"
    )]
    pub state_store: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the repository: schemas and every semantic rule. Exit 0
    /// valid (warnings allowed), 1 invalid.
    Check {
        /// Output: human (snippets, on stderr), json (`{"diagnostics": […]}`
        /// on stdout) or
        /// github (workflow annotations on stdout).
        #[arg(long, value_enum, default_value = "human")]
        format: CheckFormat,
        /// With `--format github`: the config repo's path inside the
        /// checked-out repository, prefixed to annotation file names.
        #[arg(long, default_value = "", value_name = "PATH")]
        path_prefix: String,
        #[command(flatten)]
        gates: install::GateFlags,
    },
    /// Compile to files: DIR/<node>.json per target (Redis key → value) and
    /// DIR/<router>.nginx.conf per router. Exit 0, or 1 when invalid.
    Build {
        /// Where to write the files (created; files a previous build wrote
        /// there and this one does not are removed, nothing else).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Compare the compiled output of two revisions, per target (no live
    /// state needed). Exit 0 no changes, 2 changes, 1 error.
    Diff {
        /// The revision to compare against (e.g. origin/main).
        #[arg(long, value_name = "REV")]
        base: String,
        /// The revision to compare; default: the working tree (or --rev).
        #[arg(long, value_name = "REV")]
        head: Option<String>,
        /// Output: human, json, or markdown (a pull-request comment).
        #[arg(long, value_enum, default_value = "human")]
        format: DiffFormat,
    },
    /// Compare desired state with each target's live Redis (reads only
    /// the manifest). Exit 0, or 1 when a target failed; with
    /// --detailed-exitcode, 2 when there are changes.
    Plan {
        /// Only these targets (repeatable).
        #[arg(long = "node", value_name = "NODE")]
        nodes: Vec<String>,
        /// Save the plan, to apply exactly it later with `apply --plan`.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Output: human or json (per target: counts, keys, refusals).
        #[arg(long, value_enum, default_value = "human")]
        format: push::PlanFormat,
        /// Exit 2 when there are changes.
        #[arg(long)]
        detailed_exitcode: bool,
        /// How many targets to read at once.
        #[arg(long, default_value_t = 16, value_name = "N", value_parser = push::parallel())]
        parallel: usize,
        /// Compare the bundles (roles/) with each node's installed release
        /// over SSH instead of Redis (docs/install.md).
        #[arg(long)]
        bundles: bool,
        #[command(flatten)]
        ssh: install::SshFlags,
    },
    /// Install each node's bundle over SSH: upload a new release, gates on
    /// the node, candidate on the alternate address smoke-tested, then
    /// switch `current` and reload (docs/install.md). Exit 0 when every
    /// node is done, 1 when any failed (naming the step; it keeps its old
    /// release), 64 usage.
    Install(install::InstallArgs),
    /// Push desired state to each target: per target a lock and one atomic
    /// transaction (documents, prune, manifest, meta). Exit 0 when every
    /// target is done, 1 when any failed (the others are still applied).
    Apply {
        /// Apply a saved plan; refused when a target moved since.
        #[arg(long, value_name = "FILE")]
        plan: Option<PathBuf>,
        /// Only these targets (repeatable).
        #[arg(long = "node", value_name = "NODE")]
        nodes: Vec<String>,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long)]
        yes: bool,
        /// Apply a working tree whose config files are not committed
        /// (recorded as `<commit>+dirty`, which has no ancestry for the
        /// rollback guard to protect). Refused without it.
        #[arg(long)]
        allow_dirty: bool,
        /// Take over a target whose live commit is not in this repository
        /// (an edge moved to git with `import`): the one exception to "a
        /// new commit must descend from the live one", recorded in its
        /// history (`adopted`). An older or diverged commit still needs
        /// --allow-rollback.
        #[arg(long)]
        adopt: bool,
        #[command(flatten)]
        flags: push::PushFlags,
    },
    /// Purge cached objects of a site: one job on every targeted node's own
    /// queue (default: every edge carrying the site). Prints the job id. A
    /// job a node's Redis does not take is kept in the state store's outbox
    /// (`SPOOLED`, exit 3) and delivered by `--flush` or the daemon; exit 1
    /// when a job could not be kept either (`NOT QUEUED`).
    #[command(override_usage = "edgeform purge --site <HOST> [OPTIONS]\n       \
                                edgeform purge --flush [OPTIONS]")]
    Purge {
        /// The site (host or alias).
        #[arg(long, value_name = "HOST", required_unless_present = "flush")]
        site: Option<String>,
        /// Deliver the jobs kept in this host's outbox (in order, each
        /// node's before any newer job) and report per node; exit 3 when a
        /// node's Redis still does not answer.
        #[arg(long, conflicts_with_all = ["site", "nodes", "wait"])]
        flush: bool,
        #[command(flatten)]
        what: purge::What,
        /// Only these nodes (repeatable).
        #[arg(long = "node", value_name = "NODE")]
        nodes: Vec<String>,
        /// Wait up to SECS for every node's result and print the counts;
        /// exit 1 on timeout, naming the nodes still pending.
        #[arg(long, value_name = "SECS", value_parser = push::wait_secs())]
        wait: Option<u64>,
    },
    /// Explain a routing decision offline: the playback decision for a
    /// stream (and with --geo the nearest edge) from the compiled table and
    /// a health snapshot, step by step. Exit 0.
    Route(route::RouteArgs),
    /// Explain the reference edge's decision for a request (docs/edge.md)
    /// offline, from the compiled documents, step by step. Exit 0.
    #[command(
        override_usage = "edgeform explain --host <HOST> --url <URL> --ip <IP> [OPTIONS]\n       \
                                edgeform explain --batch <FILE> [OPTIONS]"
    )]
    Explain(explain::ExplainArgs),
    /// Read-only HTTP API for edges on a Redis miss: GET
    /// /v1/nodes/<node>/keys/<key> → the value `build` gives that node,
    /// from --rev (default HEAD, re-read when it moves). Needs
    /// EDGEFORM_SERVE_TOKEN.
    Serve(serve::ServeArgs),
    /// Format config files canonically: keys in the model's order, one
    /// layout (see docs/operations.md). Comments are kept at the top of a
    /// file and above top-level keys; a file with any other comment is
    /// refused (file:line) and left alone. Exit 0, or 1 when --check finds
    /// files to change or a file was refused.
    Fmt {
        /// Change nothing: list the files that would change, exit 1 if any.
        #[arg(long)]
        check: bool,
        /// Only these files (default: every config file of --repo).
        #[arg(value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Read a live edge's site documents (site:*, suspended:*) from its
    /// Redis and write the equivalent sites/*.yaml into DIR, so a running
    /// system moves to git in one step. The node comes from --repo's
    /// nodes/. Values the model cannot express are reported (with their key)
    /// and nothing is written, unless --allow-lossy. Exit 0 or 1.
    Import {
        /// The node to read (must have a `redis` block).
        #[arg(long, value_name = "NODE")]
        node: String,
        /// Where to write sites/*.yaml (created; a file already there with
        /// other content is never overwritten: nothing is written then).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Write what can be imported even when some values cannot be
        /// expressed exactly (they are still reported).
        #[arg(long)]
        allow_lossy: bool,
        /// One file per host: do not merge hosts with identical documents
        /// into one site with aliases.
        #[arg(long)]
        no_aliases: bool,
    },
    /// Start a config repository in DIR (default: --repo): cluster.yaml,
    /// one site, one zone, one edge node, the reference edge's role and
    /// the JSON Schemas, committed as the first commit; it passes `check`.
    /// DIR must be empty or absent. Exit 0, 1 otherwise.
    Init {
        /// The new repository's folder.
        #[arg(value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Print a shell completion script, e.g.
    /// `edgeform completions bash > /etc/bash_completion.d/edgeform`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Anycast audit from route-collector dumps (RIS bview/updates MRT):
    /// per announced prefix, which upstream each collector peer's best
    /// path goes through, AS-path lengths, and lopsided or longer-path
    /// splits. Exit 0 nothing flagged, 2 a prefix flagged, 1 error.
    Anycast(anycast::AnycastArgs),
    /// The scheduled jobs: sync re-pushes desired state, heal compares the
    /// full live content and repairs drift. Runs until SIGTERM, or once.
    /// Repair back to a target's own commit is free; moving a target to
    /// another commit passes apply's checks (--force, --allow-rollback,
    /// --break-glass as for apply). The daemon runs its jobs only while it
    /// holds the state store's lease: a second daemon on the same store
    /// stands by and takes over within the lease (half the shorter
    /// interval) after the first stops or dies (docs/operations.md, "Two
    /// control hosts").
    Reconcile {
        /// How often the sync job re-pushes desired state (1s to 7d).
        #[arg(long, default_value = "15m", value_name = "DURATION", value_parser = push::interval)]
        sync_every: std::time::Duration,
        /// How often the heal job compares live content and repairs drift
        /// (1s to 7d).
        #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = push::interval)]
        heal_every: std::time::Duration,
        /// How often the certificates job orders missing ACME certificates
        /// and renews due ones (1s to 7d); it also runs once at start.
        #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = push::interval)]
        certs_every: std::time::Duration,
        /// Run one job and exit (for cron or systemd timers): exit 0, or 1
        /// when a target failed or was refused (a move to another commit
        /// over a threshold, the empty state, a rollback, a freeze) or,
        /// for `certs`, when a certificate could not be ordered or pushed.
        #[arg(long, value_enum, value_name = "JOB")]
        once: Option<Once>,
        /// Fetch REMOTE/BRANCH through git2 before each run and push that.
        #[arg(long, value_name = "REMOTE/BRANCH")]
        pull: Option<String>,
        /// Only these targets (repeatable; default: every node with a
        /// `redis` block), e.g. the one edge on this machine.
        #[arg(long = "node", value_name = "NODE")]
        nodes: Vec<String>,
        /// With `--once heal`: list the drift (stdout: node, kind, key) and
        /// any refusal, write nothing. Exit 0 no drift, 2 drift, 1 error.
        #[arg(long, requires = "once")]
        dry_run: bool,
        #[command(flatten)]
        flags: push::PushFlags,
        /// Private remotes and signed commits.
        #[command(flatten)]
        git: GitFlags,
        /// Serve Prometheus metrics on http://ADDR/metrics (e.g.
        /// 127.0.0.1:9431): per target last success, applied commit,
        /// drift, refusals, durations, lock waits.
        #[arg(long, value_name = "ADDR")]
        metrics_listen: Option<std::net::SocketAddr>,
        /// After every run write the metrics to FILE (node_exporter
        /// textfile format, atomically), e.g. for --once from a timer.
        #[arg(long, value_name = "FILE")]
        metrics_textfile: Option<PathBuf>,
        /// The daemon's heal compares only the keys each target's Redis
        /// reported written since it was last found healthy (CLIENT
        /// TRACKING); every N-th heal of a target compares everything
        /// anyway, targets spread over the cycle (default 288: once a day
        /// at the default --heal-every; 1: every heal). `--once` always
        /// compares everything.
        #[arg(long, default_value_t = 288, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        full_heal_every: u32,
    },
    /// Remove a target's apply lock (`edgeform:lock`). An apply takes over
    /// by itself a lock whose holder is provably dead on its own host (no
    /// such process, or the pid now belongs to a newer one); this removes
    /// such a lock too, and with --force any lock, whoever holds it (make
    /// sure that apply is gone). Exit 0 removed or no lock, 1 refused.
    Unlock {
        /// The target whose lock to remove.
        #[arg(long, value_name = "NODE")]
        node: String,
        /// Remove the lock even when its holder may be alive (another
        /// host, or a running process).
        #[arg(long)]
        force: bool,
    },
    /// Every node's last health report over MQTT (or, with `--from
    /// redis`, every target's own meta): online/offline/not serving
    /// (the agent's probe of its edge), report age, applied vs desired
    /// commit (this repo, compiled), installed bundle and version skew
    /// ("install first": documents its edge code cannot read, from its
    /// `edgeform:bundle`), purge queue, play sessions, kbit/s; the
    /// certificate the sites use that expires first (state directory);
    /// then a verdict. Exit 0 all online and on the desired commit, 2 drift (a
    /// target behind, or skewed), 1 a node offline, not serving or
    /// unreachable (or the broker unreachable).
    Status {
        /// Output: human (a table) or json.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
        /// Where to read: the broker's retained reports (mqtt), or each
        /// target's own `edgeform:meta` (redis; no broker needed).
        #[arg(long, value_enum, default_value = "mqtt")]
        from: StatusFrom,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// A target's audit trail (`edgeform:history`, newest first): when,
    /// which command (apply, sync, heal), commit before → after, who
    /// (user@host), forced / break-glass, keys written and deleted.
    /// Exit 0, 1 when the target is unknown or unreachable.
    History {
        /// The target.
        #[arg(long, value_name = "NODE")]
        node: String,
        /// Output: human or json (an array of entries).
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Each site's live figures summed over the edges: requests/s, hit
    /// ratio, 5xx ratio, p95 upstream time, refusals by reason, from the
    /// retained per-site figures the agents publish over MQTT (agent.yaml
    /// `health.edge_metrics`, every health interval, at least every 10 s).
    /// With --site, that site at each edge. Exit 0 printed, 1 no edge has
    /// figures or the broker is unreachable.
    Top {
        /// One site (its host name): its figures at each edge.
        #[arg(long, value_name = "HOST")]
        site: Option<String>,
        /// Sites listed, busiest first.
        #[arg(long, default_value_t = ::ops::top::DEFAULT_LIMIT, value_name = "N")]
        limit: usize,
        /// Output: human (a table) or json.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Send one command to a node's agent over MQTT (only actions its
    /// agent.yaml allows run), signed with the ed25519 key of
    /// --signing-key / EDGEFORM_COMMAND_SIGNING_KEY (`edgeform keygen`;
    /// EDGEFORM_COMMAND_KEY, the legacy shared HMAC, otherwise). Exit 0
    /// sent (with --wait: ran ok), 1 otherwise.
    Exec {
        /// The node whose agent runs the command.
        #[arg(long, value_name = "NODE")]
        node: String,
        /// The action, one of the node's agent.yaml `actions` (e.g.
        /// reload-nginx).
        #[arg(long, value_name = "ACTION")]
        action: String,
        /// An argument for the action (repeatable).
        #[arg(long = "arg", value_name = "NAME=VALUE")]
        args: Vec<String>,
        /// Wait up to SECS for the result and print it.
        #[arg(long, value_name = "SECS", value_parser = push::wait_secs())]
        wait: Option<u64>,
        /// The command expires (is refused by the agent) after this long
        /// (1s to 1d).
        #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = push::ttl)]
        ttl: std::time::Duration,
        /// Output: human or json (the result, with --wait).
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
        #[command(flatten)]
        broker: BrokerFlags,
        /// Sign with this ed25519 private key (PKCS8 PEM, `edgeform
        /// keygen`); results must then carry the node's result key.
        /// Without it, EDGEFORM_COMMAND_KEY (legacy shared HMAC) signs.
        #[arg(long, env = "EDGEFORM_COMMAND_SIGNING_KEY", value_name = "FILE")]
        signing_key: Option<PathBuf>,
    },
    /// Make the command signing key pair (ed25519): FILE, the private key
    /// (PKCS8 PEM, mode 0600) only the control host holds, and FILE.pub
    /// for every agent's `command_public_key_file`. With --result-key
    /// NODE: write that node's result key (its `result_key_file`),
    /// derived from --signing-key. Never overwrites a file. Exit 0, 1 on
    /// error.
    Keygen {
        /// Where to write the key.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Write NODE's result key instead of a new key pair.
        #[arg(long, value_name = "NODE")]
        result_key: Option<String>,
        /// The private key the result key derives from.
        #[arg(long, env = "EDGEFORM_COMMAND_SIGNING_KEY", value_name = "FILE")]
        signing_key: Option<PathBuf>,
    },
    /// Node secrets in the state store (--state-dir, or --state-store),
    /// never in git:
    /// the installer writes them to the node's environment file, which
    /// nginx reads through `env` directives. Values are never printed.
    Secrets {
        #[command(subcommand)]
        action: secrets::Action,
    },
    /// TLS certificates in the state store (--state-dir, or
    /// --state-store), never in git: `import` checks and keeps one, `issue` orders the ACME sites'
    /// from the cluster's CA, `list` shows name, hosts, not-after and
    /// fingerprint. Keys are never printed. Exit 0, 1 refused, a failed
    /// order or a broken certificate.
    Certs {
        #[command(subcommand)]
        action: certs::Action,
    },
    /// Backup and restore of the state store (--state-dir, or
    /// --state-store): `export FILE` writes every entry encrypted with the
    /// key in EDGEFORM_STATE_KEY, `import FILE` writes them back (the
    /// migration path from a state directory to a shared store). Exit 0,
    /// 1 refused (no key, another key, an altered file).
    State {
        #[command(subcommand)]
        action: state::Action,
    },
    /// A commit's rollout in waves (cluster.yaml `apply.waves`): `status`
    /// shows where it stands, `promote` applies the next wave now, `abort`
    /// rolls every applied wave back and remembers the commit as aborted
    /// (the state store). Exit 0, 1 nothing to promote or abort or a
    /// target failed, 64 usage.
    Rollout {
        #[command(subcommand)]
        action: rollout::Action,
    },
}

/// How the CLI logs in to the broker (the URL is in cluster.yaml).
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerFlags {
    /// MQTT username; the password is read from EDGEFORM_MQTT_PASSWORD.
    #[arg(long, env = "EDGEFORM_MQTT_USERNAME", value_name = "USER")]
    pub mqtt_username: Option<String>,
    /// CA certificate(s) (PEM) for an mqtts:// broker.
    #[arg(long, env = "EDGEFORM_MQTT_CA", value_name = "FILE")]
    pub mqtt_ca: Option<std::path::PathBuf>,
    /// Give up reaching the broker after SECS.
    #[arg(long, default_value_t = 5, value_name = "SECS")]
    pub connect_timeout: u64,
}

impl BrokerFlags {
    /// The library's options.
    pub fn options(&self) -> ::ops::mqtt::BrokerOptions {
        ::ops::mqtt::BrokerOptions {
            mqtt_username: self.mqtt_username.clone(),
            mqtt_ca: self.mqtt_ca.clone(),
            connect_timeout: self.connect_timeout,
        }
    }
}

/// Output of `status`, `history` and `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

impl From<Format> for ::ops::mqtt::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Human => ::ops::mqtt::Format::Human,
            Format::Json => ::ops::mqtt::Format::Json,
        }
    }
}

/// Where `status` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFrom {
    Mqtt,
    Redis,
}

/// Output formats of `check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    Human,
    Json,
    Github,
}

/// Output formats of `diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    Human,
    Json,
    Markdown,
}

/// Which scheduled job `reconcile --once` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Once {
    Sync,
    Heal,
    /// Order missing ACME certificates, renew due ones, push them.
    Certs,
}

impl From<Once> for control::reconcile::Once {
    fn from(once: Once) -> Self {
        match once {
            Once::Sync => control::reconcile::Once::Sync,
            Once::Heal => control::reconcile::Once::Heal,
            Once::Certs => control::reconcile::Once::Certs,
        }
    }
}

/// `reconcile` flags for a private remote and for signed commits.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GitFlags {
    /// SSH private key for `--pull` over SSH (default: the keys in
    /// ssh-agent, through SSH_AUTH_SOCK).
    #[arg(long, value_name = "FILE", env = gitsource::remote::SSH_KEY_ENV)]
    pub ssh_key: Option<PathBuf>,
    /// known_hosts file the SSH server's host key must be in (default:
    /// ~/.ssh/known_hosts). An unknown or different host key is refused.
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// Apply a commit only when it carries an SSH signature by a key in
    /// this allowed-signers file (OpenSSH format, as git's
    /// gpg.ssh.allowedSignersFile); otherwise refuse and keep the last
    /// good commit.
    #[arg(long, value_name = "FILE")]
    pub require_signed_by: Option<PathBuf>,
}

impl From<&GitFlags> for gitsource::remote::GitOptions {
    fn from(f: &GitFlags) -> Self {
        gitsource::remote::GitOptions {
            ssh_key: f.ssh_key.clone(),
            known_hosts: f.known_hosts.clone(),
            require_signed_by: f.require_signed_by.clone(),
        }
    }
}

/// The part of `--help` that is not about one command.
const AFTER_HELP: &str = "\
Exit codes: 0 valid / done / no changes; 1 invalid, refused or an error;
2 changes pending (diff, plan --detailed-exitcode) or a prefix flagged
(anycast); 3 a purge job kept in the outbox, not delivered yet (purge,
purge --flush); 64 usage error (an unknown flag, a missing or
out-of-range value: nothing was done).

A typical change: edgeform fmt && edgeform check && edgeform diff --base origin/main,
then after merge edgeform plan && edgeform apply --yes (or the reconciler).

Environment: NO_COLOR (plain output), EDGEFORM_LOG (log filter, e.g. debug),
the variables nodes/*.yaml name in `password_env` (Redis passwords),
EDGEFORM_COMMAND_KEY (legacy HMAC signing key for exec),
EDGEFORM_COMMAND_SIGNING_KEY (ed25519 private key file for exec),
EDGEFORM_LOG_FORMAT (text or json).

Every file key: docs/configuration.md. Operating it: docs/operations.md.
`edgeform <command> --help` explains a command's flags.";

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `span`s).
    Json,
}

/// The `--log-format` of this run, set once the arguments are parsed.
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("EDGEFORM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // EDGEFORM_TIMING: every phase span (load, check, parse, validate,
    // commit, compile, jobs, per target connect, reads, MULTI/EXEC) is
    // logged with its duration when it closes.
    let spans = if std::env::var_os("EDGEFORM_TIMING").is_some() {
        tracing_subscriber::fmt::format::FmtSpan::CLOSE
    } else {
        tracing_subscriber::fmt::format::FmtSpan::NONE
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(spans)
        .with_writer(std::io::stderr)
        .with_target(false);
    // EDGEFORM_MEMORY: resident memory and its peak as each span closes.
    let memory = std::env::var_os("EDGEFORM_MEMORY")
        .is_some()
        .then_some(memory::Memory);
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = match LOG_FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Text => builder.with_ansi(color()).finish().with(memory).try_init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .finish()
            .with(memory)
            .try_init(),
    };
}

pub fn version() -> &'static str {
    concat!(
        env!("CARGO_PKG_VERSION"),
        " (",
        env!("EDGEFORM_COMMIT"),
        ")"
    )
}

/// Whether to color output on stderr: a terminal, and `NO_COLOR` unset.
fn color() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stderr().is_terminal()
}

/// Parse the process arguments and run.
#[must_use]
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(usage_exit(e.kind()));
        }
    };
    let _ = LOG_FORMAT.set(cli.log_format);
    if std::env::var_os("EDGEFORM_TIMING").is_some()
        || std::env::var_os("EDGEFORM_MEMORY").is_some()
    {
        init_tracing();
    }
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // A closed pipe (e.g. `| head`) is not a failure.
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            let mut msg = format!("error: {err}");
            for cause in err.chain().skip(1) {
                msg.push_str(&format!("\n  caused by: {cause}"));
            }
            eprintln!("{msg}");
            ExitCode::from(1)
        }
    }
}

/// The exit code of a command line clap refused or answered itself:
/// `--help` and `--version` succeed; anything else is a usage error,
/// [`EX_USAGE`] (BSD `sysexits.h`), apart from every code a command
/// returns.
#[must_use]
pub fn usage_exit(kind: clap::error::ErrorKind) -> u8 {
    use clap::error::ErrorKind;
    match kind {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
        _ => EX_USAGE,
    }
}

/// The exit code of a usage error.
pub const EX_USAGE: u8 = 64;

/// Run one command.
///
/// # Errors
/// I/O and git failures; invalid configuration is not an error here but
/// an exit code with diagnostics.
pub fn run(cli: &Cli) -> Result<u8> {
    if let Some(now) = cli.now {
        compiler::clock::set_now(now);
    }
    control::store::configure(cli.state_store.as_deref());
    match &cli.command {
        Command::Check {
            format,
            path_prefix,
            gates,
        } => check_cmd(cli, *format, path_prefix, gates),
        Command::Install(args) => {
            install::install_cmd(&cli.repo, cli.rev.as_deref(), &cli.state_dir, args)
        }
        Command::Plan {
            nodes,
            detailed_exitcode,
            parallel,
            bundles: true,
            ssh,
            ..
        } => install::plan_bundles(
            &cli.repo,
            cli.rev.as_deref(),
            nodes,
            ssh,
            *detailed_exitcode,
            *parallel,
        ),
        Command::Build { out } => build_cmd(cli, out),
        Command::Diff { base, head, format } => diff_cmd(cli, base, head.as_deref(), *format),
        Command::Plan {
            nodes,
            out,
            format,
            detailed_exitcode,
            parallel,
            ..
        } => {
            compiler::clock::now()?;
            let source = source(&cli.repo, cli.rev.as_deref(), &cli.state_dir, color())?;
            let code = runtime()?.block_on(push::plan(
                &cli.repo,
                &source,
                nodes,
                *format,
                out.as_deref(),
                *detailed_exitcode,
                *parallel,
            ));
            workspace::free_later(source);
            code
        }
        Command::Apply {
            plan,
            nodes,
            yes,
            allow_dirty,
            adopt,
            flags,
        } => {
            // A taken-over lock is logged.
            init_tracing();
            compiler::clock::now()?;
            runtime()?.block_on(push::apply_cmd(
                &cli.repo,
                cli.rev.as_deref(),
                &cli.state_dir,
                nodes,
                plan.as_deref(),
                *yes,
                *allow_dirty,
                *adopt,
                flags,
                color(),
            ))
        }
        Command::Unlock { node, force } => runtime()?.block_on(push::unlock_cmd(
            &cli.repo,
            cli.rev.as_deref(),
            node,
            *force,
            color(),
        )),
        Command::Purge {
            site,
            flush,
            what,
            nodes,
            wait,
        } => {
            // Sites and nodes only: nothing is compiled, and no commit
            // is needed (no git status of the working tree).
            let config = valid_config(&cli.repo, cli.rev.as_deref(), color())?;
            // One thread: 300 connections' small replies cost less CPU
            // without cross-thread wake-ups and work stealing.
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?
                .block_on(async {
                    match site {
                        _ if *flush => {
                            if what.given() {
                                anyhow::bail!("--flush delivers kept jobs; it takes no --url/--prefix/--regex/--all");
                            }
                            ::ops::purge::flush(&config, &cli.state_dir).await
                        }
                        Some(site) if what.given() => {
                            ::ops::purge::purge(
                                &config,
                                site,
                                &what.options(),
                                nodes,
                                *wait,
                                &cli.state_dir,
                            )
                            .await
                        }
                        _ => anyhow::bail!("purge needs one of --url, --prefix, --regex, --all"),
                    }
                })
        }
        Command::Route(args) => {
            let checked = workspace::load(&cli.repo, cli.rev.as_deref())?.check();
            let Some(config) = valid_or_report(&checked) else {
                return Ok(1);
            };
            ::ops::route::route(config, &args.options())
        }
        Command::Explain(args) => {
            let checked = workspace::load(&cli.repo, cli.rev.as_deref())?.check();
            let Some(config) = valid_or_report(&checked) else {
                return Ok(1);
            };
            ::ops::explain::explain(
                &compile::compile_with(config, &shown_certificates(cli, config)),
                &args.options(cli.now),
            )
        }
        Command::Serve(args) => {
            init_tracing();
            runtime()?.block_on(::ops::serve::serve(
                &cli.repo,
                cli.rev.as_deref(),
                &args.options(),
            ))
        }
        Command::Fmt { check, files } => {
            if cli.rev.is_some() {
                anyhow::bail!("fmt works on the working tree; --rev is not supported");
            }
            compiler::files::fmt(&cli.repo, *check, files)
        }
        Command::Import {
            node,
            out,
            allow_lossy,
            no_aliases,
        } => {
            if cli.rev.is_some() {
                anyhow::bail!("import reads the working tree's nodes; --rev is not supported");
            }
            let source = valid(&cli.repo, None, color())?;
            runtime()?.block_on(control::import::import(
                &cli.repo,
                &source,
                node,
                out,
                *allow_lossy,
                !*no_aliases,
                color(),
            ))
        }
        Command::Init { dir } => init::init(dir.as_deref().unwrap_or(&cli.repo)),
        Command::Completions { shell } => Ok(ops::completions(*shell)),
        Command::Anycast(args) => {
            let checked = workspace::load(&cli.repo, cli.rev.as_deref())?.check();
            let Some(config) = valid_or_report(&checked) else {
                return Ok(1);
            };
            ::anycast::audit::audit(
                config.cluster.anycast.as_ref(),
                &args.mrt,
                args.format.into(),
            )
        }
        Command::Status {
            format,
            from,
            broker,
        } => {
            let source = valid(&cli.repo, cli.rev.as_deref(), color())?;
            // The version skew counts the certificates apply would push.
            let (certs, _) = certificates_noted(cli, &source.config);
            match from {
                StatusFrom::Mqtt => runtime()?.block_on(::ops::mqtt::status(
                    &source,
                    &broker.options(),
                    (*format).into(),
                    &cli.state_dir,
                    &certs,
                )),
                StatusFrom::Redis => runtime()?.block_on(::ops::audit::status_from_redis(
                    &source,
                    (*format).into(),
                    std::time::Duration::from_secs(broker.connect_timeout.max(1)),
                    &certs,
                )),
            }
        }
        Command::Top {
            site,
            limit,
            format,
            broker,
        } => {
            let config = valid_config(&cli.repo, cli.rev.as_deref(), color())?;
            let options = ::ops::top::TopOptions {
                site: site.as_deref(),
                limit: *limit,
                format: (*format).into(),
            };
            runtime()?.block_on(::ops::top::top(&config, &broker.options(), &options))
        }
        Command::History { node, format } => {
            let source = valid(&cli.repo, cli.rev.as_deref(), color())?;
            runtime()?.block_on(::ops::audit::history_cmd(&source, node, (*format).into()))
        }
        Command::Exec {
            node,
            action,
            args,
            wait,
            ttl,
            format,
            broker,
            signing_key,
        } => {
            let source = valid(&cli.repo, cli.rev.as_deref(), color())?;
            let exec = ::ops::mqtt::Exec {
                node,
                action,
                args,
                wait: *wait,
                ttl: *ttl,
                format: (*format).into(),
                signing_key: signing_key.as_deref(),
            };
            runtime()?.block_on(::ops::mqtt::exec(&source, &broker.options(), &exec))
        }
        Command::Secrets { action } => secrets::run(&cli.state_dir, action),
        Command::State { action } => state::run(&cli.state_dir, action),
        Command::Rollout { action } => {
            init_tracing();
            compiler::clock::now()?;
            rollout::run(&cli.repo, &cli.state_dir, action)
        }
        Command::Certs { action } => certs::run(&cli.state_dir, action, || {
            valid_config(&cli.repo, cli.rev.as_deref(), color())
        }),
        Command::Keygen {
            out,
            result_key,
            signing_key,
        } => ::ops::keygen::keygen(out, result_key.as_deref(), signing_key.as_deref()),
        Command::Reconcile {
            sync_every,
            heal_every,
            certs_every,
            once,
            pull,
            nodes,
            dry_run,
            flags,
            git,
            metrics_listen,
            metrics_textfile,
            full_heal_every,
        } => {
            init_tracing();
            if *dry_run && *once != Some(Once::Heal) {
                eprintln!(
                    "error: --dry-run goes with --once heal (for sync, `edgeform plan` shows what would change)"
                );
                return Ok(EX_USAGE);
            }
            if flags.break_glass && once.is_none() {
                eprintln!(
                    "error: --break-glass goes with --once (a daemon would ignore every later freeze window)"
                );
                return Ok(EX_USAGE);
            }
            // EDGEFORM_NOW set is an error before anything runs.
            compiler::clock::now()?;
            let mut settings = flags.settings();
            settings.dry_run = *dry_run;
            settings.metrics.set_textfile(metrics_textfile.clone());
            runtime()?.block_on(async {
                if let Some(addr) = metrics_listen {
                    control::metrics::serve(*addr, std::sync::Arc::clone(&settings.metrics))
                        .await?;
                }
                control::reconcile::reconcile(
                    cli.repo.clone(),
                    cli.rev.clone(),
                    nodes.clone(),
                    pull.clone(),
                    *sync_every,
                    *heal_every,
                    *certs_every,
                    once.map(Into::into),
                    settings,
                    git.into(),
                    *full_heal_every,
                    cli.state_dir.clone(),
                )
                .await
            })
        }
    }
}

/// `edgeform check`.
fn check_cmd(
    cli: &Cli,
    format: CheckFormat,
    path_prefix: &str,
    gates: &install::GateFlags,
) -> Result<u8> {
    let mut loaded = workspace::load(&cli.repo, cli.rev.as_deref())?.check();
    // Certificates: checked where the state directory holds them.
    if let Some(config) = &loaded.config {
        let mut found = certificate_diagnostics(cli, config, &loaded.repo)?;
        if !found.is_empty() {
            loaded.diagnostics.append(&mut found);
            compiler::diagnostic::sort(&mut loaded.diagnostics);
            if compiler::diagnostic::has_errors(&loaded.diagnostics) {
                loaded.config = None;
            }
        }
    }
    // Bundles (roles/): built and gated when the rest is valid.
    let bundles_ok = if loaded.config.is_some() {
        match ::install::node::load_bundles(&loaded)? {
            Some((roles, bundles)) => ::install::node::run_gates(&roles, &bundles, &gates.set()),
            None => false,
        }
    } else {
        true
    };
    let workspace::Checked {
        repo,
        diagnostics,
        config,
        ..
    } = loaded;
    let checked = Checked {
        config,
        diagnostics,
    };
    let mut stdout = std::io::stdout().lock();
    match format {
        CheckFormat::Human => {
            let text = report::diagnostics_human(&checked.diagnostics, &repo, color());
            eprint!("{text}");
            let verdict = if checked.is_valid() && bundles_ok {
                "valid"
            } else {
                "invalid"
            };
            // The verdict is the result (stdout); the diagnostics above
            // it are on stderr.
            writeln!(
                stdout,
                "{}: {verdict} ({}{})",
                cli.repo.display(),
                report::summary(&checked.diagnostics, repo.sources.len()),
                if bundles_ok {
                    ""
                } else {
                    "; bundles (roles/) failed, see above"
                }
            )?;
        }
        CheckFormat::Json => {
            stdout.write_all(report::diagnostics_json(&checked.diagnostics).as_bytes())?
        }
        CheckFormat::Github => {
            let prefix = if path_prefix.is_empty() || path_prefix.ends_with('/') {
                path_prefix.to_owned()
            } else {
                format!("{path_prefix}/")
            };
            stdout
                .write_all(report::diagnostics_github(&checked.diagnostics, &prefix).as_bytes())?;
        }
    }
    let code = u8::from(!checked.is_valid() || !bundles_ok);
    // The process ends next: freeing 100,000 files' worth of
    // strings one by one would only delay the exit.
    workspace::free_later((repo, checked));
    Ok(code)
}

/// `check`'s certificate rules ([`compiler::tls::check`]) with what the
/// state directory holds, or a note that nothing was checked.
fn certificate_diagnostics(
    cli: &Cli,
    config: &compiler::Config,
    repo: &compiler::load::Repo,
) -> Result<Vec<compiler::Diagnostic>> {
    if compiler::tls::used(config).is_empty() {
        return Ok(Vec::new());
    }
    let now = i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX);
    let checking = if cli.rev.is_some() {
        compiler::tls::Checking::Revision
    } else {
        compiler::tls::Checking::WorkingTree
    };
    let known = control::certs::known_at(&cli.state_dir, config);
    let place = cli.state_dir.display().to_string();
    Ok(match &known {
        Err(why) => compiler::tls::check(
            config,
            repo,
            &compiler::tls::Known::Nothing(why.clone()),
            now,
            checking,
        ),
        Ok((certs, problems)) => compiler::tls::check(
            config,
            repo,
            &compiler::tls::Known::Store {
                certs,
                place,
                broken: problems
                    .iter()
                    .map(|e| (e.name.clone(), e.detail.clone()))
                    .collect(),
            },
            now,
            checking,
        ),
    })
}

/// The certificates `build`, `diff` and `explain` compile with: what the
/// state directory holds (nothing on a pull request's CI), each problem
/// said once on stderr.
fn shown_certificates(cli: &Cli, config: &compiler::Config) -> compiler::tls::Certificates {
    let (certs, notes) = certificates_noted(cli, config);
    for note in notes {
        eprintln!("{note}");
    }
    certs
}

/// [`shown_certificates`] with its notes returned rather than said (`diff`
/// compiles two revisions and says each note once).
fn certificates_noted(
    cli: &Cli,
    config: &compiler::Config,
) -> (compiler::tls::Certificates, Vec<String>) {
    match control::certs::known_at(&cli.state_dir, config) {
        Ok((certs, problems)) => {
            let mut notes: Vec<String> = problems
                .into_iter()
                .map(|e| format!("warning: {e}: its tls:* keys are left out"))
                .collect();
            let missing: Vec<&str> = compiler::tls::used(config)
                .into_iter()
                .filter(|n| certs.get(n).is_none())
                .collect();
            if !missing.is_empty() {
                notes.push(format!(
                    "note: certificate(s) {} not in the state directory {}: their tls:* keys are left out",
                    missing.join(", "),
                    cli.state_dir.display()
                ));
            }
            (certs, notes)
        }
        Err(why) => (
            compiler::tls::Certificates::default(),
            vec![format!(
                "note: certificates not read ({why}): no tls:* key is compiled"
            )],
        ),
    }
}

/// `edgeform build`.
fn build_cmd(cli: &Cli, out: &Path) -> Result<u8> {
    let checked = workspace::load(&cli.repo, cli.rev.as_deref())?.check();
    let Some(config) = valid_or_report(&checked) else {
        return Ok(1);
    };
    let Some((_, bundles)) = ::install::node::load_bundles(&checked)? else {
        eprintln!("nothing was written");
        return Ok(1);
    };
    let compiled = compile::compile_with(config, &shown_certificates(cli, config));
    let written = write_build(out, &compiled)?;
    let bundles = ::install::node::write_bundles(out, &bundles, checked.repo.commit.as_deref())?;
    eprintln!(
        "wrote {} target(s), {} router snippet(s) and {bundles} bundle(s) to {} ({written} file(s)){}",
        compiled.targets.len(),
        compiled.nginx.len(),
        out.display(),
        checked
            .repo
            .commit
            .as_deref()
            .map(|c| format!(" from {}", &c[..12.min(c.len())]))
            .unwrap_or_default()
    );
    Ok(0)
}

/// `edgeform diff`.
fn diff_cmd(cli: &Cli, base: &str, head: Option<&str>, format: DiffFormat) -> Result<u8> {
    let head_rev = head.or(cli.rev.as_deref());
    let base_checked = workspace::load(&cli.repo, Some(base))?.check();
    let head_checked = workspace::load(&cli.repo, head_rev)?.check();
    let base_label = short(base, base_checked.repo.commit.as_deref());
    let head_label = match head_rev {
        Some(r) => short(r, head_checked.repo.commit.as_deref()),
        None => "working tree".to_owned(),
    };
    let Some(head_config) = valid_or_report(&head_checked) else {
        return Ok(1);
    };
    // An invalid base compiles to nothing: every key shows as added.
    let mut notes = std::collections::BTreeSet::new();
    let base_compiled = match &base_checked.config {
        Some(c) => {
            let (certs, said) = certificates_noted(cli, c);
            notes.extend(said);
            compile::compile_with(c, &certs)
        }
        None => {
            eprintln!(
                "warning: base {base_label} does not pass `check`; diffing against an empty compilation"
            );
            compile::Compiled::default()
        }
    };
    let (head_certs, said) = certificates_noted(cli, head_config);
    notes.extend(said);
    for note in notes {
        eprintln!("{note}");
    }
    let head_compiled = compile::compile_with(head_config, &head_certs);
    let d = diff::diff(&base_compiled, &head_compiled);
    let text = match format {
        DiffFormat::Human => report::diff_human(&d, &base_label, &head_label),
        DiffFormat::Json => report::diff_json(&d, &base_label, &head_label),
        DiffFormat::Markdown => report::diff_markdown(&d, &base_label, &head_label),
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(if d.has_changes() { 2 } else { 0 })
}

fn short(rev: &str, commit: Option<&str>) -> String {
    match commit {
        Some(c) if c.starts_with(rev) || rev.len() >= 40 => c[..12.min(c.len())].to_owned(),
        Some(c) => format!("{rev} ({})", &c[..12.min(c.len())]),
        None => rev.to_owned(),
    }
}

/// Load and check; print the diagnostics when invalid.
///
/// # Errors
/// I/O or git errors, and an invalid repository (nothing is pushed).
pub(crate) fn valid(root: &Path, rev: Option<&str>, color: bool) -> Result<Valid> {
    workspace::load(root, rev)?
        .check()
        .valid()
        .map_err(|invalid| report_invalid(&invalid, color))
}

/// [`valid`]'s config alone, without the commit: a working tree is read
/// without opening git at all (no HEAD, no status).
///
/// # Errors
/// See [`valid`].
pub(crate) fn valid_config(
    root: &Path,
    rev: Option<&str>,
    color: bool,
) -> Result<compiler::Config> {
    workspace::load_files(root, rev)?
        .check()
        .valid_config()
        .map_err(|invalid| report_invalid(&invalid, color))
}

/// Print the diagnostics; the error to return.
fn report_invalid(invalid: &workspace::Invalid, color: bool) -> anyhow::Error {
    eprint!(
        "{}",
        report::diagnostics_human(&invalid.diagnostics, &invalid.repo, color)
    );
    anyhow::anyhow!(
        "{} is invalid ({})",
        invalid.root.display(),
        invalid.summary()
    )
}

/// [`valid`], compiled.
///
/// # Errors
/// See [`valid`].
pub(crate) fn source(
    root: &Path,
    rev: Option<&str>,
    state_dir: &Path,
    color: bool,
) -> Result<Source> {
    let valid = valid(root, rev, color)?;
    let now = i64::try_from(compiler::clock::now()?).unwrap_or(i64::MAX);
    // Every certificate a site uses, valid now, or nothing is pushed.
    let certs =
        control::certs::for_push_from(state_dir, &valid.config, now).map_err(anyhow::Error::new)?;
    Ok(valid.compile_with(&certs))
}

/// The config when valid; otherwise print the diagnostics and `None`.
fn valid_or_report(checked: &workspace::Checked) -> Option<&compiler::Config> {
    if checked.config.is_none() || !checked.diagnostics.is_empty() {
        eprint!(
            "{}",
            report::diagnostics_human(&checked.diagnostics, &checked.repo, color())
        );
    }
    if checked.config.is_none() {
        eprintln!(
            "{}: invalid ({}); nothing was compiled",
            checked.root.display(),
            report::summary(&checked.diagnostics, checked.repo.sources.len())
        );
    }
    checked.config.as_ref()
}

/// The list of files a build wrote, kept in the output folder so the next
/// build removes what it no longer writes (and nothing else).
const BUILD_LIST: &str = ".edgeform-build";

fn write_build(out: &Path, compiled: &compile::Compiled) -> Result<usize> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut names = Vec::new();
    for (name, target) in &compiled.targets {
        let file = format!("{name}.json");
        compiler::files::write_atomic(&out.join(&file), target.to_json().as_bytes())?;
        names.push(file);
    }
    for (router, text) in &compiled.nginx {
        let file = format!("{router}.nginx.conf");
        compiler::files::write_atomic(&out.join(&file), text.as_bytes())?;
        names.push(file);
    }
    let list_path = out.join(BUILD_LIST);
    if let Ok(previous) = std::fs::read_to_string(&list_path) {
        for old in previous.lines() {
            let stale = !names.iter().any(|n| n == old);
            if stale && !old.contains('/') && !old.is_empty() {
                let _ = std::fs::remove_file(out.join(old));
            }
        }
    }
    compiler::files::write_atomic(&list_path, format!("{}\n", names.join("\n")).as_bytes())?;
    Ok(names.len())
}
