//! The application layer's one way to read a repository: load → check →
//! (commit) → compile, each a separate step, like ruff's configuration →
//! settings. Every subcommand goes through it and stops at the step it
//! needs: `check` at [`Checked`], `purge`, `status`, `exec` and `unlock`
//! at [`Valid`] (nodes and sites, no compile), `plan`/`apply`/`reconcile`
//! and `diff`/`build` at [`Source`] / a compilation.
//!
//! Nothing here prints: the CLI renders [`Invalid`] the way its command
//! wants.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::compile::{self, Compiled};
use crate::diagnostic::Diagnostic;
use crate::load::{self, Repo};
use crate::{Config, report};

/// A loaded repository: the files' text, not yet checked.
pub struct Loaded {
    pub root: PathBuf,
    /// The revision asked for (`None`: the working tree).
    pub rev: Option<String>,
    pub repo: Repo,
}

/// A checked repository: every diagnostic, and the config when valid.
pub struct Checked {
    pub root: PathBuf,
    pub rev: Option<String>,
    pub repo: Repo,
    /// Errors and warnings, sorted by file and position.
    pub diagnostics: Vec<Diagnostic>,
    /// Present exactly when there is no error.
    pub config: Option<Config>,
}

/// Why a repository is not usable: its diagnostics, and the files they
/// point into (for snippets).
pub struct Invalid {
    pub root: PathBuf,
    pub repo: Repo,
    pub diagnostics: Vec<Diagnostic>,
}

impl Invalid {
    /// `N errors, M warnings in K files`.
    #[must_use]
    pub fn summary(&self) -> String {
        report::summary(&self.diagnostics, self.repo.sources.len())
    }
}

/// A valid repository and the commit it is, not compiled: what commands
/// that read nodes and sites need (`status`, `exec`, `purge`, `unlock`).
pub struct Valid {
    pub repo: Repo,
    pub config: Config,
    /// Written to `edgeform:meta` as `commit`: the revision's commit, or
    /// HEAD with `+dirty` for a working tree that differs from it.
    pub commit: String,
    /// The commit it was read from (`None`: the working tree).
    pub rev: Option<String>,
}

/// A valid, compiled repository: what every push command works from.
pub struct Source {
    pub repo: Repo,
    pub config: Config,
    pub compiled: Compiled,
    /// See [`Valid::commit`].
    pub commit: String,
    /// See [`Valid::rev`].
    pub rev: Option<String>,
}

/// Load the working tree at `root`, or revision `rev`.
///
/// # Errors
/// I/O and git errors (an unreadable config file is a diagnostic, not an
/// error).
pub fn load(root: &Path, rev: Option<&str>) -> Result<Loaded> {
    let _span = tracing::info_span!("load").entered();
    Ok(Loaded {
        root: root.to_owned(),
        rev: rev.map(str::to_owned),
        repo: load::load(root, rev)?,
    })
}

impl Loaded {
    /// Parse and validate (pure).
    #[must_use]
    pub fn check(self) -> Checked {
        let _span = tracing::info_span!("check").entered();
        let crate::Checked {
            config,
            diagnostics,
        } = crate::check(&self.repo);
        Checked {
            root: self.root,
            rev: self.rev,
            repo: self.repo,
            diagnostics,
            config,
        }
    }
}

impl Checked {
    /// The valid repository and the commit it is.
    ///
    /// # Errors
    /// [`Invalid`] when there is an error.
    pub fn valid(self) -> Result<Valid, Invalid> {
        let Some(config) = self.config else {
            return Err(Invalid {
                root: self.root,
                repo: self.repo,
                diagnostics: self.diagnostics,
            });
        };
        let _span = tracing::info_span!("commit").entered();
        let commit = match &self.rev {
            Some(_) => self
                .repo
                .commit
                .clone()
                .unwrap_or_else(|| "worktree".into()),
            None => load::worktree_commit(&self.root),
        };
        let rev = self
            .rev
            .as_ref()
            .map(|_| self.repo.commit.clone().unwrap_or_default());
        Ok(Valid {
            repo: self.repo,
            config,
            commit,
            rev,
        })
    }
}

impl Valid {
    /// Compile every target.
    #[must_use]
    pub fn compile(self) -> Source {
        let compiled = {
            let _span = tracing::info_span!("compile").entered();
            compile::compile(&self.config)
        };
        Source {
            repo: self.repo,
            config: self.config,
            compiled,
            commit: self.commit,
            rev: self.rev,
        }
    }
}

/// Free `value` on another thread: the 100,000 parsed sites of a large
/// repository take a while to free, and a command that is about to exit
/// need not wait for it. The one way large data is freed late.
pub fn free_later<T: Send + 'static>(value: T) {
    std::thread::spawn(move || drop(value));
}
