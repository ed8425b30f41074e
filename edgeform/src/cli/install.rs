//! `install`, `plan --bundles` and the bundle gates on the command line:
//! the flags, converted into `install`'s options (the SSH engine and the
//! bundles are in the `install` crate, docs/install.md).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Result;

use compiler::workspace;
use install::gate::Gate;

/// `--known-hosts`, `--identity`.
#[derive(Debug, Clone, clap::Args)]
pub struct SshFlags {
    /// The known_hosts file node host keys are checked against (an unknown
    /// or changed key is refused). Default: ~/.ssh/known_hosts.
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// The SSH private key (default: ssh's own choice).
    #[arg(long, value_name = "FILE")]
    pub identity: Option<PathBuf>,
}

impl SshFlags {
    fn options(&self) -> install::ssh::Ssh {
        install::ssh::Ssh {
            known_hosts: self.known_hosts.clone(),
            identity: self.identity.clone(),
        }
    }
}

/// Which gates `check` (and `install` before uploading) skips.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GateFlags {
    /// Skip one external-tool gate of the bundles: lua, nginx, agent,
    /// systemd (repeatable; said so in the output).
    #[arg(long = "skip-gate", value_name = "GATE", value_parser = gate_name)]
    pub skip_gate: Vec<String>,
}

fn gate_name(s: &str) -> Result<String, String> {
    Gate::parse(s)
        .map(|_| s.to_owned())
        .ok_or_else(|| format!("`{s}` is not a gate (lua, nginx, agent, systemd)"))
}

impl GateFlags {
    /// The gates to skip.
    #[must_use]
    pub fn set(&self) -> BTreeSet<Gate> {
        self.skip_gate
            .iter()
            .filter_map(|g| Gate::parse(g))
            .collect()
    }
}

/// Which nodes: `--node`, `--role`, `--all`.
#[derive(Debug, Clone, clap::Args)]
pub struct Select {
    /// This node (repeatable).
    #[arg(long = "node", value_name = "NODE")]
    pub nodes: Vec<String>,
    /// Every node with this role.
    #[arg(long, value_name = "ROLE")]
    pub role: Option<String>,
    /// Every node with a bundle and an `install` block.
    #[arg(long)]
    pub all: bool,
}

/// `edgeform install` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub select: Select,
    /// How many nodes at once.
    #[arg(long, default_value_t = 1, value_name = "K", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Return to the release before the current one (no upload).
    #[arg(long)]
    pub rollback: bool,
    /// Do not run the local gates (check's) first; the gates on the node
    /// still run. Said so in the output.
    #[arg(long)]
    pub skip_local_gates: bool,
    #[command(flatten)]
    pub ssh: SshFlags,
    #[command(flatten)]
    pub gates: GateFlags,
}

/// `edgeform install`.
///
/// # Errors
/// I/O and git errors.
pub fn install_cmd(
    root: &Path,
    rev: Option<&str>,
    state_dir: &Path,
    args: &InstallArgs,
) -> Result<u8> {
    if !args.select.all && args.select.role.is_none() && args.select.nodes.is_empty() {
        eprintln!("error: install needs --node NODE, --role ROLE or --all");
        return Ok(super::EX_USAGE);
    }
    let checked = workspace::load(root, rev)?.check();
    if checked.config.is_none() {
        let _ = super::valid(root, rev, false);
        eprintln!("nothing was installed");
        return Ok(1);
    }
    let options = install::ssh::InstallOptions {
        select: install::ssh::Selection {
            nodes: args.select.nodes.clone(),
            role: args.select.role.clone(),
            all: args.select.all,
        },
        parallel: usize::from(args.parallel),
        rollback: args.rollback,
        skip_local_gates: args.skip_local_gates,
        ssh: args.ssh.options(),
        skip_gates: args.gates.set(),
    };
    // The secrets come from the control host's state directory.
    let secrets = |node: &str| -> Result<std::collections::BTreeMap<String, String>> {
        Ok(control::store::open(state_dir)?.secrets(node)?)
    };
    // After an edge's switch: what its code reads — the installed
    // bundle's own declaration (`reads.json`, the edge role's; a bundle
    // without one reads the seed's fields only) — in its own Redis (the
    // version-skew gate); after a rollback, removed (the older release is
    // assumed to read the seed's fields only).
    let rt = super::runtime()?;
    let nodes = checked.config.as_ref().map(|c| &c.nodes);
    let declare = |name: &str, rolled_back: bool, reads: Option<&[u8]>| -> Result<(), String> {
        let node = nodes
            .and_then(|n| n.iter().find(|n| n.name == name))
            .ok_or_else(|| format!("node {name} is not in the configuration"))?;
        let bundle = match reads {
            None => edgestate::bundle::Bundle::seed(),
            Some(text) => edgestate::bundle::Bundle::from_reads_json(text).ok_or_else(|| {
                format!(
                    "the bundle's {} is not a reads declaration",
                    install::ssh::READS_FILE
                )
            })?,
        };
        rt.block_on(control::declare_bundle(
            node,
            (!rolled_back).then_some(&bundle),
        ))
        .map_err(|e| format!("{e:#}"))
    };
    install::ssh::install(&checked, &options, &secrets, &declare)
}

/// `edgeform plan --bundles`.
///
/// # Errors
/// I/O and git errors.
pub fn plan_bundles(
    root: &Path,
    rev: Option<&str>,
    nodes: &[String],
    ssh: &SshFlags,
    detailed: bool,
    parallel: usize,
) -> Result<u8> {
    let checked = workspace::load(root, rev)?.check();
    if checked.config.is_none() {
        let _ = super::valid(root, rev, false);
        return Ok(1);
    }
    install::ssh::plan(&checked, nodes, &ssh.options(), detailed, parallel)
}
