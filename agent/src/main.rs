//! `edgeform-agent --config agent.yaml`: see the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

/// jemalloc rather than glibc's malloc, tuned by the shipped unit
/// (`_RJEM_MALLOC_CONF` in packaging/systemd/edgeform-agent.service: one
/// arena, thread caches up to 8 KiB objects, dirty pages returned after
/// about a second): an idle summarizer at 1,000 nodes takes and drops a
/// few thousand small allocations a second (reports, summaries, routing
/// snapshots), and with glibc its malloc and free were a quarter of its
/// CPU (bench/RESULTS.md, "The agent over MQTT").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The edgeform node agent: durable cache purges from the node's own
/// Redis, playback routing (`GET /route/<stream>`), health reports and
/// one-shot commands over MQTT.
#[derive(Debug, Parser)]
#[command(name = "edgeform-agent", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("EDGEFORM_COMMIT"), ")"), about)]
struct Args {
    /// The agent's configuration file.
    #[arg(long, value_name = "FILE", default_value = agent::config::DEFAULT_PATH)]
    config: PathBuf,
    /// Only check the configuration and exit (0 valid, 1 invalid).
    #[arg(long)]
    check_config: bool,
    /// Log lines on stderr: text, or json (one JSON object per line).
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "EDGEFORM_LOG_FORMAT",
        value_name = "FORMAT"
    )]
    log_format: LogFormat,
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("EDGEFORM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match args.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
    let config = match agent::config::load(&args.config) {
        Ok(c) => Arc::new(c),
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("error: {e}");
            }
            if errors.0.len() > 1 {
                eprintln!("{} errors in {}", errors.0.len(), args.config.display());
            }
            return ExitCode::from(1);
        }
    };
    if args.check_config {
        eprintln!(
            "{}: valid (node {}, queue {})",
            args.config.display(),
            config.node,
            config.purge_queue()
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(agent::run(config, agent::shutdown::signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
