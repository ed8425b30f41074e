//! `edgeform rollout status|promote|abort`: where a commit's rollout in
//! waves stands (`apply.waves`), moving it on, rolling it back
//! ([`control::rollout::cmd`]).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use control::many::Settings;

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// The live (or last) rollout: its commit, each wave with its nodes
    /// and bake deadline, its state (baking, ready, halted with the site
    /// and figure, aborted, complete), and the aborted commits.
    Status {
        /// Output: human or json.
        #[arg(long, value_enum, default_value = "human")]
        format: Format,
    },
    /// Apply the next wave now, before its bake time is over or past a
    /// halt: the operator's call, recorded on the wave (`promoted_by`)
    /// and in each target's history.
    Promote {
        #[command(flatten)]
        flags: Flags,
    },
    /// Roll every applied wave back to each target's previous commit (the
    /// rollback guard's consent recorded in the history as `rollback by
    /// rollout abort`) and remember the commit as aborted: sync never
    /// applies it again; a newer commit starts a new rollout.
    Abort {
        #[command(flatten)]
        flags: Flags,
    },
}

/// `rollout status` output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

/// The writes' flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Flags {
    /// Override the safety thresholds and the empty-state refusal.
    #[arg(long)]
    pub force: bool,
    /// Write through an open `apply.freeze` window; recorded in each
    /// target's history.
    #[arg(long)]
    pub break_glass: bool,
}

impl Flags {
    fn settings(&self) -> Settings {
        Settings {
            force: self.force,
            allow_rollback: false,
            adopt: false,
            parallel: 16,
            lock_wait: Duration::from_secs(60),
            break_glass: self.break_glass,
            dry_run: false,
            signers: None,
            last_good: None,
            metrics: std::sync::Arc::new(control::metrics::Metrics::new(super::version())),
        }
    }
}

/// Run `action` (`root`: the repository, for the commits' configurations).
///
/// # Errors
/// The state store is unusable; loading a commit.
pub fn run(root: &Path, state_dir: &Path, action: &Action) -> Result<u8> {
    match action {
        Action::Status { format } => {
            control::rollout::cmd::status(state_dir, *format == Format::Json)
        }
        Action::Promote { flags } => super::runtime()?.block_on(control::rollout::cmd::promote(
            root,
            state_dir,
            &flags.settings(),
        )),
        Action::Abort { flags } => super::runtime()?.block_on(control::rollout::cmd::abort(
            root,
            state_dir,
            &flags.settings(),
        )),
    }
}
