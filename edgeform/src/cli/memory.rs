//! `EDGEFORM_MEMORY=1`: when each phase span closes (`load`, `parse`,
//! `validate`, `check`, `compile`, …), one stderr line with the process's
//! resident memory now and its peak so far (`VmRSS`, `VmHWM` of
//! `/proc/self/status`), e.g.
//! `memory: after validate: rss 1234 MiB, peak 1300 MiB`. A measuring aid
//! for large repositories; prints nothing where `/proc` is missing.

use tracing::span;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The layer printing the memory line (see the module).
pub(super) struct Memory;

impl<S> Layer<S> for Memory
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        if let Some(status) = std::fs::read_to_string("/proc/self/status").ok()
            && let Some((rss, peak)) = rss_and_peak_kib(&status)
        {
            eprintln!(
                "memory: after {}: rss {} MiB, peak {} MiB",
                span.name(),
                rss / 1024,
                peak / 1024
            );
        }
    }
}

/// `VmRSS` and `VmHWM` (KiB) from the text of `/proc/<pid>/status`.
fn rss_and_peak_kib(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_and_peak() {
        let status = "Name:\tedgeform\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n";
        assert_eq!(rss_and_peak_kib(status), Some((102_400, 204_800)));
        assert_eq!(rss_and_peak_kib("Name:\tx\nVmRSS:\t1 kB\n"), None);
    }
}
