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
    /// A git working tree whose config files differ from HEAD (`commit`
    /// ends in `+dirty`): `apply` refuses it without `--allow-dirty`.
    pub dirty: bool,
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
    /// See [`Valid::dirty`].
    pub dirty: bool,
}

/// Why a folder is not a config repository at all (as opposed to an
/// invalid one, which is a diagnostic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotARepo {
    /// None of `cluster.yaml`, `sites/`, `zones/`, `nodes/` holds a config
    /// file: most likely `--repo` names the wrong folder.
    Empty { root: PathBuf, rev: Option<String> },
}

impl std::fmt::Display for NotARepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotARepo::Empty { root, rev } => write!(
                f,
                "{}{} has no cluster.yaml and no config file under sites/, zones/ or nodes/: \
                 is --repo right? (it names the folder that holds cluster.yaml)",
                root.display(),
                rev.as_deref()
                    .map(|r| format!(" at revision `{r}`"))
                    .unwrap_or_default()
            ),
        }
    }
}

impl std::error::Error for NotARepo {}

/// Load the working tree at `root`, or revision `rev`.
///
/// # Errors
/// I/O and git errors, and [`NotARepo`] when the folder holds no config
/// file at all (an unreadable config file is a diagnostic, not an error).
pub fn load(root: &Path, rev: Option<&str>) -> Result<Loaded> {
    let _span = tracing::info_span!("load").entered();
    loaded(root, rev, load::load(root, rev)?)
}

/// [`load`], but a working tree's files alone, without HEAD's commit
/// (`repo.commit` is `None`; no git is opened): for commands that need
/// the config and not which commit it is. A revision is
/// still read through git.
///
/// # Errors
/// As [`load`].
pub fn load_files(root: &Path, rev: Option<&str>) -> Result<Loaded> {
    let _span = tracing::info_span!("load").entered();
    let repo = match rev {
        Some(rev) => load::from_rev(root, rev)?,
        None => load::files_of_dir(root)?,
    };
    loaded(root, rev, repo)
}

fn loaded(root: &Path, rev: Option<&str>, repo: Repo) -> Result<Loaded> {
    if repo.sources.is_empty() {
        return Err(NotARepo::Empty {
            root: root.to_owned(),
            rev: rev.map(str::to_owned),
        }
        .into());
    }
    Ok(Loaded {
        root: root.to_owned(),
        rev: rev.map(str::to_owned),
        repo,
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
    /// The valid config alone: no commit, so no git status of the working
    /// tree (`purge`, it needs the nodes and the site, not which
    /// commit they are).
    ///
    /// # Errors
    /// [`Invalid`] when there is an error.
    pub fn valid_config(self) -> Result<Config, Invalid> {
        match self.config {
            Some(config) => Ok(config),
            None => Err(Invalid {
                root: self.root,
                repo: self.repo,
                diagnostics: self.diagnostics,
            }),
        }
    }

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
        let (commit, dirty) = match &self.rev {
            Some(_) => (
                self.repo
                    .commit
                    .clone()
                    .unwrap_or_else(|| "worktree".into()),
                false,
            ),
            None => load::worktree_state(&self.root),
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
            dirty,
        })
    }
}

impl Valid {
    /// Compile every target, without certificates (no `tls:*` key).
    #[must_use]
    pub fn compile(self) -> Source {
        self.compile_with(&crate::tls::Certificates::default())
    }

    /// Compile every target, with the certificates the caller read
    /// (`tls:<host>` for the sites that use them).
    #[must_use]
    pub fn compile_with(self, certs: &crate::tls::Certificates) -> Source {
        let compiled = {
            let _span = tracing::info_span!("compile").entered();
            compile::compile_with(&self.config, certs)
        };
        Source {
            repo: self.repo,
            config: self.config,
            compiled,
            commit: self.commit,
            rev: self.rev,
            dirty: self.dirty,
        }
    }
}

/// Free `value` on another thread: the 100,000 parsed sites of a large
/// repository take a while to free, and a command that is about to exit
/// need not wait for it. The one way large data is freed late.
pub fn free_later<T: Send + 'static>(value: T) {
    std::thread::spawn(move || drop(value));
}
