//! `edgeform anycast`'s flags; the audit is [`anycast::audit`].

use std::path::PathBuf;

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

impl From<AnycastFormat> for ::anycast::audit::Format {
    fn from(f: AnycastFormat) -> Self {
        match f {
            AnycastFormat::Human => ::anycast::audit::Format::Human,
            AnycastFormat::Json => ::anycast::audit::Format::Json,
        }
    }
}
