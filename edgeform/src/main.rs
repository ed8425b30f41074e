//! `edgeform`: the command line ([`edgeform::cli`]).

/// jemalloc rather than glibc's malloc: `check` on 1,000,000 sites holds
/// ~2 million small allocations made in rayon workers while their parse
/// trees come and go, and glibc's per-thread arenas keep the holes
/// (peak RSS 2,085 MiB against 1,697 MiB, user CPU 74.8 s against 56.5 s;
/// bench/RESULTS.md, "`edgeform check` memory").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    edgeform::cli::main()
}
