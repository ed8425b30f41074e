//! `agent.yaml`, read from its file: the configuration itself, its raw
//! model and every rule are the `agentconf` crate's (re-exported here).

use std::path::Path;

pub use agentconf::*;

/// Where `edgeform-agent` looks without `--config`.
pub const DEFAULT_PATH: &str = "/etc/edgeform/agent.yaml";

/// Read and validate `path`, the files it names included.
///
/// # Errors
/// Unreadable file, YAML errors, unknown keys, missing or invalid values,
/// unset variables, unreadable named files: all of them, each with its
/// position.
pub fn load(path: &Path) -> Result<Config, Errors> {
    let text = files::read_regular(path, 1 << 20).map_err(|e| {
        let hint = if path == Path::new(DEFAULT_PATH) {
            " (the default; pass --config FILE to use another, e.g. packaging/agent.yaml)"
        } else {
            ""
        };
        at_start(
            &path.display().to_string(),
            format!("cannot read the configuration: {e}{hint}"),
        )
    })?;
    let file = path.display().to_string();
    parse_with(&file, &text, &|var| std::env::var(var).ok(), true)
}
