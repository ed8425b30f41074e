//! `edgeform anycast`: the anycast audit from route-collector dumps.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Result, bail};

use ::anycast::{Table, Watch, mrt};
use compiler::Config;

/// Output formats of `anycast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AnycastFormat {
    Human,
    Json,
}

/// Arguments of `anycast`.
#[derive(Debug, Clone, clap::Args)]
pub struct AnycastArgs {
    /// MRT dumps: RIS `bview` (TABLE_DUMP_V2) and `updates` (BGP4MP) files,
    /// plain, gzip or bzip2. RIB snapshots are read first, then updates in
    /// time order.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub mrt: Vec<PathBuf>,
    /// Output: human (a table per prefix) or json.
    #[arg(long, value_enum, default_value = "human")]
    pub format: AnycastFormat,
}

/// `edgeform anycast`: exit 0 when no prefix is flagged, 2 when one is.
///
/// # Errors
/// No `anycast` section; unreadable or corrupt dumps.
pub fn anycast(config: &Config, args: &AnycastArgs) -> Result<u8> {
    let Some(settings) = &config.cluster.anycast else {
        bail!("cluster.yaml has no `anycast` section: name the prefixes and upstreams to audit");
    };
    let started = std::time::Instant::now();
    let mut table = Table::new(Watch::new(settings));
    let watch = table.watch().clone();
    let files = mrt::read_all(&args.mrt, &watch, &mut |e| table.apply(e))?;
    let elapsed = started.elapsed();
    let report = ::anycast::analyse(settings, &table);
    let mut stdout = std::io::stdout().lock();
    match args.format {
        AnycastFormat::Human => {
            stdout.write_all(::anycast::render_human(&report).as_bytes())?;
            let records: u64 = files.iter().map(|f| f.records).sum();
            let bytes: u64 = files.iter().map(|f| f.bytes).sum();
            eprintln!(
                "read {records} MRT records ({:.1} MB) from {} file(s) in {:.2} s",
                bytes as f64 / 1e6,
                files.len(),
                elapsed.as_secs_f64()
            );
        }
        AnycastFormat::Json => {
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
