//! `plan`, `apply` and `unlock`: their flags and the value parsers of the
//! duration and count flags, converted into `control::cmd`'s options.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use control::many::Settings;

/// Output formats of `plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Human,
    Json,
}

/// Flags shared by `apply` and `reconcile`.
#[derive(Debug, Clone, clap::Args)]
pub struct PushFlags {
    /// Override the safety thresholds and the empty-state refusal.
    #[arg(long)]
    pub force: bool,
    /// Allow pushing a commit that does not descend from the one live (an
    /// older commit, or another branch).
    #[arg(long)]
    pub allow_rollback: bool,
    /// How many targets to work on at once.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = parallel())]
    pub parallel: usize,
    /// How long to wait for another apply's lock on a target (at most 1h).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = lock_wait)]
    pub lock_wait: Duration,
    /// Write through an open `apply.freeze` window (cluster.yaml); recorded
    /// in each target's history.
    #[arg(long)]
    pub break_glass: bool,
}

impl PushFlags {
    /// The library's settings.
    #[must_use]
    pub fn settings(&self) -> Settings {
        Settings {
            force: self.force,
            allow_rollback: self.allow_rollback,
            adopt: false,
            parallel: self.parallel,
            lock_wait: self.lock_wait,
            break_glass: self.break_glass,
            dry_run: false,
            signers: None,
            last_good: None,
            metrics: std::sync::Arc::new(control::metrics::Metrics::new(super::version())),
        }
    }
}

/// `500ms`, `5s`, `15m`, `1h`, at most 30 days.
///
/// # Errors
/// Anything else.
pub fn duration(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::ZERO, Duration::from_secs(30 * 86_400))
}

/// A duration flag between `min` and `max`, checked at parse time so no
/// later arithmetic (deadlines, timers) can overflow.
fn duration_in(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = compiler::validate::parse_duration_ms(text)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration (e.g. 500ms, 30s, 15m, 1h)"))?;
    if d < min || d > max {
        return Err(format!(
            "`{text}` is out of range ({}..={})",
            human(min),
            human(max)
        ));
    }
    Ok(d)
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `--lock-wait`: up to one hour.
///
/// # Errors
/// Not a duration, or out of range.
pub fn lock_wait(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::ZERO, Duration::from_secs(3600))
}

/// `--sync-every`, `--heal-every`: one second to seven days.
///
/// # Errors
/// Not a duration, or out of range.
pub fn interval(text: &str) -> Result<Duration, String> {
    duration_in(
        text,
        Duration::from_secs(1),
        Duration::from_secs(7 * 86_400),
    )
}

/// `exec --ttl`: one second to one day.
///
/// # Errors
/// Not a duration, or out of range.
pub fn ttl(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::from_secs(1), Duration::from_secs(86_400))
}

/// `--parallel`: 1 to 1024 targets at once.
#[must_use]
pub fn parallel() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024)
}

/// `--wait SECS`: 1 second to one day.
#[must_use]
pub fn wait_secs() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86_400)
}

impl PlanFormat {
    fn options(self) -> control::cmd::PlanFormat {
        match self {
            PlanFormat::Human => control::cmd::PlanFormat::Human,
            PlanFormat::Json => control::cmd::PlanFormat::Json,
        }
    }
}

/// `edgeform plan`.
///
/// # Errors
/// Loading errors (an unreachable target is reported, not an error).
pub async fn plan(
    root: &Path,
    source: &compiler::workspace::Source,
    only: &[String],
    format: PlanFormat,
    out: Option<&Path>,
    detailed: bool,
    parallel: usize,
) -> Result<u8> {
    control::cmd::plan(
        root,
        source,
        only,
        format.options(),
        out,
        detailed,
        parallel,
    )
    .await
}

/// `edgeform apply`.
///
/// # Errors
/// Loading errors, an unreadable plan file, a dirty working tree without
/// `--allow-dirty`. Without `--yes` and a terminal: [`super::EX_USAGE`].
#[allow(clippy::too_many_arguments)]
pub async fn apply_cmd(
    root: &Path,
    rev: Option<&str>,
    state_dir: &Path,
    only: &[String],
    plan_file: Option<&Path>,
    yes: bool,
    allow_dirty: bool,
    adopt: bool,
    flags: &PushFlags,
    color: bool,
) -> Result<u8> {
    // Nobody can answer the confirmation: a usage error, before anything
    // is read.
    if !yes && !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!(
            "error: apply needs --yes when stdin is not a terminal (nobody can confirm);              review with `edgeform plan` first"
        );
        return Ok(super::EX_USAGE);
    }
    let saved = plan_file.map(control::cmd::read_plan).transpose()?;
    // A saved plan applies exactly what it was made from: its commit, or
    // the working tree (checked against the plan's digests).
    let rev = saved.as_ref().and_then(|p| p.rev.as_deref()).or(rev);
    // Only a command that could have pushed says that nothing was.
    let source = super::source(root, rev, state_dir, color)
        .map_err(|e| anyhow::anyhow!("{e:#}; nothing was pushed"))?;
    control::cmd::apply(
        root,
        source,
        saved.as_ref(),
        only,
        yes,
        allow_dirty,
        &Settings {
            adopt,
            ..flags.settings()
        },
        state_dir,
    )
    .await
}

/// `edgeform unlock --node N [--force]`.
///
/// # Errors
/// Invalid repository, unknown node, Redis errors.
pub async fn unlock_cmd(
    root: &Path,
    rev: Option<&str>,
    node: &str,
    force: bool,
    color: bool,
) -> Result<u8> {
    let valid = super::valid(root, rev, color)?;
    control::cmd::unlock(&valid.config, node, force).await
}
