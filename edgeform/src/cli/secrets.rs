//! `edgeform secrets set|list|rm`: node secrets in the control host's
//! state directory ([`control::store`]), never in git. `set` reads the value
//! from stdin (never from the command line, where `ps` and shell history
//! would show it); nothing prints a value.

use std::io::{BufRead, IsTerminal};
use std::path::Path;

use anyhow::{Context, Result};

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Set NODE's secret NAME (an environment variable name, e.g.
    /// EDGEFORM_API_TOKEN) to the first line of stdin.
    Set {
        /// The node (its name in nodes/).
        #[arg(value_name = "NODE")]
        node: String,
        /// The secret's name: the environment variable nginx reads.
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// The names of the secrets set (every node, or --node), never values.
    List {
        /// Only this node's.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
    },
    /// Remove NODE's secret NAME.
    Rm {
        /// The node.
        #[arg(value_name = "NODE")]
        node: String,
        /// The secret's name.
        #[arg(value_name = "NAME")]
        name: String,
    },
}

/// Run `action` on the state directory `dir`.
///
/// # Errors
/// The state directory is unsafe or unusable; invalid names or value.
pub fn run(dir: &Path, action: &Action) -> Result<u8> {
    let store = control::store::open(dir)?;
    match action {
        Action::Set { node, name } => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprintln!("value for {node} {name} (one line, not echoed by edgeform):");
            }
            let mut line = String::new();
            stdin
                .lock()
                .read_line(&mut line)
                .context("reading the value from stdin")?;
            let value = line.strip_suffix('\n').unwrap_or(&line);
            let value = value.strip_suffix('\r').unwrap_or(value);
            store.set_secret(node, name, value)?;
            eprintln!(
                "set {node} {name} in {} (the next `edgeform install` of {node} writes it to the node)",
                control::store::describe(dir)
            );
        }
        Action::List { node } => {
            let all = store.secret_names()?;
            for (n, names) in all
                .iter()
                .filter(|(n, _)| node.as_ref().is_none_or(|want| want == *n))
            {
                for name in names {
                    println!("{n}\t{name}");
                }
            }
        }
        Action::Rm { node, name } => {
            if store.remove_secret(node, name)? {
                eprintln!("removed {node} {name}");
            } else {
                eprintln!("{node} has no secret {name}");
                return Ok(1);
            }
        }
    }
    Ok(0)
}
