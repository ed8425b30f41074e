//! `edgeform anycast`: the anycast audit from route-collector dumps, as a
//! command (reads the dumps, prints the report, gives the exit code).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::{Settings, Table, Watch, mrt};

/// Output formats of `edgeform anycast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A table per prefix on stdout, the reading's size and time on stderr.
    Human,
    /// One JSON object: the files read, the prefixes, how many flagged.
    Json,
}

/// `edgeform anycast`: exit 0 when no prefix is flagged, 2 when one is.
///
/// # Errors
/// No `anycast` section (`settings`, from cluster.yaml); unreadable or
/// corrupt dumps.
pub fn audit(settings: Option<&Settings>, mrt: &[PathBuf], format: Format) -> Result<u8> {
    let Some(settings) = settings else {
        bail!("cluster.yaml has no `anycast` section: name the prefixes and upstreams to audit");
    };
    let started = std::time::Instant::now();
    let mut table = Table::new(Watch::new(settings));
    let watch = table.watch().clone();
    let files = mrt::read_all(mrt, &watch, &mut |e| table.apply(e))?;
    let elapsed = started.elapsed();
    let report = crate::analyse(settings, &table);
    let mut stdout = std::io::stdout().lock();
    match format {
        Format::Human => {
            stdout.write_all(crate::render_human(&report).as_bytes())?;
            let records: u64 = files.iter().map(|f| f.records).sum();
            let bytes: u64 = files.iter().map(|f| f.bytes).sum();
            eprintln!(
                "read {records} MRT records ({:.1} MB) from {} file(s) in {:.2} s",
                bytes as f64 / 1e6,
                files.len(),
                elapsed.as_secs_f64()
            );
        }
        Format::Json => {
            let doc = serde_json::json!({
                "files": files,
                "prefixes": report.prefixes,
                "flagged": report.flagged,
            });
            serde_json::to_writer_pretty(&mut stdout, &doc)?;
            stdout.write_all(b"\n")?;
        }
    }
    Ok(if report.flagged > 0 { 2 } else { 0 })
}
