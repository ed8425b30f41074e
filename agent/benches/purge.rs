//! Pattern purge over a realistic nginx cache: the seed's `grep -rlP`
//! against [`Layout::purge_matching`] (scan) and [`Index::purge_matching`],
//! plus exact-key purges and the index build.
//!
//! ```text
//! cargo bench -p agent --bench purge
//! ```
//!
//! Generates (once) `EDGEFORM_BENCH_FILES` cache files (default 50,000) in
//! four cache dirs (`levels=1:2`) under `EDGEFORM_BENCH_DIR` (default: a
//! temporary directory, removed at the end unless `EDGEFORM_BENCH_KEEP=1`;
//! a kept tree is reused by the next run). Keys are
//! `$scheme://$host$request_uri` over 100 hosts, so one host is ~1% of the
//! files; bodies are random bytes (like compressed media). Sizes, 2 KiB to
//! 1 MiB, follow `EDGEFORM_BENCH_SIZES`: `web` (default; 95% log-uniform in
//! 2–32 KiB, 5% in 32 KiB–1 MiB, ~25 KiB mean, ~1.2 GB for 50,000) or
//! `loguniform` (log-uniform over the whole range, ~165 KiB mean, ~8 GB).
//!
//! Everything is measured warm (the tree is read once first), as medians
//! of `EDGEFORM_BENCH_RUNS` runs (default 5), each purging a different
//! host and recreating its files afterwards. Prints a markdown table.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use agent::cache::{Index, Layout, Levels, PurgeStats, write_cache_file};
use rayon::prelude::*;
use regex::bytes::Regex;

const HOSTS: usize = 100;
const DIRS: [&str; 4] = ["static", "dynamic", "api", "perma"];
const MANIFEST: &str = "edgeform-bench.manifest";

struct Config {
    files: usize,
    runs: usize,
    profile: String,
    base: Option<PathBuf>,
    keep: bool,
}

/// One generated cache file.
struct Entry {
    dir: usize,
    key: String,
    size: usize,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run() -> io::Result<()> {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not,
    // and must not spend minutes writing a gigabyte.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("purge benchmark: run it with `cargo bench -p agent --bench purge`");
        return Ok(());
    }
    let config = Config {
        files: env("EDGEFORM_BENCH_FILES", 50_000),
        runs: env("EDGEFORM_BENCH_RUNS", 5).max(1),
        profile: env("EDGEFORM_BENCH_SIZES", "web".to_owned()),
        base: std::env::var_os("EDGEFORM_BENCH_DIR").map(PathBuf::from),
        keep: env("EDGEFORM_BENCH_KEEP", 0) == 1,
    };
    let entries = plan(&config)?;
    let total: usize = entries.iter().map(|e| e.size).sum();

    // Removed on drop, unless kept.
    let tmp = match &config.base {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("edgeform-bench-")
                .tempdir()?,
        ),
    };
    let base = match (&config.base, &tmp) {
        (Some(base), _) => base.clone(),
        (None, Some(tmp)) => tmp.path().to_path_buf(),
        (None, None) => unreachable!("a temporary dir when none is configured"),
    };
    fs::create_dir_all(&base)?;
    let levels = Levels::parse("1:2").map_err(io::Error::other)?;
    let layout = Layout::new(DIRS.iter().map(|d| base.join(d)).collect(), levels);
    let manifest = base.join(MANIFEST);
    let signature = format!(
        "files={} sizes={} bytes={total}\n",
        config.files, config.profile
    );

    if fs::read_to_string(&manifest).ok().as_deref() == Some(signature.as_str()) {
        eprintln!(
            "reusing {} ({} files, {:.2} GB)",
            base.display(),
            entries.len(),
            gb(total)
        );
    } else {
        check_space(&base, total)?;
        for dir in &layout.dirs {
            let _ = fs::remove_dir_all(dir);
        }
        eprintln!(
            "generating {} files, {:.2} GB, in {} …",
            entries.len(),
            gb(total),
            base.display()
        );
        let t = Instant::now();
        entries
            .par_iter()
            .enumerate()
            .try_for_each(|(i, e)| write(&layout, e, i as u64))?;
        rustix::fs::sync();
        eprintln!("generated in {:.1?}", t.elapsed());
    }
    // Removed while runs take files away, written back once all is restored.
    let _ = fs::remove_file(&manifest);

    let mut by_host: BTreeMap<usize, Vec<&Entry>> = BTreeMap::new();
    for e in &entries {
        by_host.entry(host_of(&e.key)).or_default().push(e);
    }
    let hosts: Vec<usize> = (0..config.runs).map(|r| (r * 37 + 11) % HOSTS).collect();
    let restore = |host: usize| -> io::Result<()> {
        by_host[&host]
            .par_iter()
            .enumerate()
            .try_for_each(|(i, e)| write(&layout, e, i as u64))?;
        // Written back now, so no timed operation waits for it.
        rustix::fs::sync();
        Ok(())
    };

    eprintln!("warming the page cache …");
    grep(&layout, "KEY:.*warm-up-matches-nothing")?;
    layout.purge_matching(|_: &[u8]| false)?;

    let mut rows = Vec::new();

    // 1. The seed: grep lists the matching files (unlinking them is extra).
    let mut times = Vec::new();
    let mut grep_matches = Vec::new();
    for &h in &hosts {
        let t = Instant::now();
        grep_matches.push(grep(&layout, &pattern(h))?.len());
        times.push(t.elapsed());
    }
    let grep_median = median(&mut times);
    rows.push(Row::new(
        "`grep -rlP` (seed, listing only)",
        &mut times,
        grep_matches.clone(),
    ));
    // … and the seed's purge: list, then unlink each (`| xargs rm`).
    let mut times = Vec::new();
    let mut removed = Vec::new();
    for &h in &hosts {
        let t = Instant::now();
        let files = grep(&layout, &pattern(h))?;
        for file in &files {
            fs::remove_file(file)?;
        }
        times.push(t.elapsed());
        removed.push(files.len());
        restore(h)?;
    }
    rows.push(Row::new(
        "`grep -rlP … | xargs rm` (seed's purge)",
        &mut times,
        removed,
    ));

    // 2. Scan-based purge.
    let mut times = Vec::new();
    let mut removed = Vec::new();
    for &h in &hosts {
        let re = Regex::new(&pattern(h)).map_err(io::Error::other)?;
        let t = Instant::now();
        let stats = layout.purge_matching(|line: &[u8]| re.is_match(line))?;
        times.push(t.elapsed());
        removed.push(stats.removed as usize);
        restore(h)?;
    }
    rows.push(Row::new(
        "`Layout::purge_matching` (scan)",
        &mut times,
        removed,
    ));
    // The same walk with nothing to remove: the lookup alone, the part
    // grep's listing compares with (unlinking ~1% costs the same anywhere).
    let nothing = Regex::new(&pattern(HOSTS + 1)).map_err(io::Error::other)?;
    let mut times = Vec::new();
    for _ in &hosts {
        let t = Instant::now();
        layout.purge_matching(|line: &[u8]| nothing.is_match(line))?;
        times.push(t.elapsed());
    }
    let scan_lookup = median(&mut times);
    rows.push(Row::new(
        "… the same, matching nothing",
        &mut times,
        Vec::new(),
    ));

    // 3. The index: build, then purge.
    let rss_before = rss_bytes();
    let mut times = Vec::new();
    let mut index = None;
    for _ in 0..3 {
        drop(index.take());
        let t = Instant::now();
        index = Some(Index::build(layout.clone())?);
        times.push(t.elapsed());
    }
    let index = index.ok_or_else(|| io::Error::other("no index"))?;
    let stats = index.stats();
    let rss = rss_bytes().saturating_sub(rss_before);
    rows.push(Row::new(
        "`Index::build` (full scan + watches)",
        &mut times,
        vec![stats.files as usize],
    ));

    let mut times = Vec::new();
    let mut syncs = Vec::new();
    let mut removed = Vec::new();
    for &h in &hosts {
        let re = Regex::new(&pattern(h)).map_err(io::Error::other)?;
        let t = Instant::now();
        let stats = index.purge_matching(|line: &[u8]| re.is_match(line))?;
        times.push(t.elapsed());
        removed.push(stats.removed as usize);
        restore(h)?;
        // The periodic refresh takes in the ~1% rewritten files.
        let t = Instant::now();
        index.refresh();
        syncs.push(t.elapsed());
    }
    let index_median = median(&mut times);
    rows.push(Row::new("`Index::purge_matching`", &mut times, removed));
    rows.push(Row::new(
        "`Index::refresh` after ~1% rewritten",
        &mut syncs,
        Vec::new(),
    ));
    let mut times = Vec::new();
    for _ in &hosts {
        let t = Instant::now();
        index.purge_matching(|line: &[u8]| nothing.is_match(line))?;
        times.push(t.elapsed());
    }
    let index_lookup = median(&mut times);
    rows.push(Row::new(
        "`Index::purge_matching`, matching nothing",
        &mut times,
        Vec::new(),
    ));

    // 4. Exact keys, one per purge.
    let picks: Vec<&Entry> = entries
        .iter()
        .step_by((entries.len() / 200).max(1))
        .collect();
    let exact =
        |purge: &dyn Fn(&str) -> io::Result<PurgeStats>| -> io::Result<(Vec<Duration>, usize)> {
            let (mut times, mut removed) = (Vec::new(), 0);
            for (i, e) in picks.iter().enumerate() {
                let t = Instant::now();
                removed += purge(&e.key)?.removed as usize;
                times.push(t.elapsed());
                write(&layout, e, i as u64)?;
                rustix::fs::sync();
            }
            Ok((times, removed))
        };
    let (mut times, n) = exact(&|key| layout.purge_keys(&[key]))?;
    rows.push(Row::new(
        "`Layout::purge_keys` (1 key, 4 dirs)",
        &mut times,
        vec![n],
    ));
    let (mut times, n) = exact(&|key| index.purge_keys(&[key]))?;
    rows.push(Row::new(
        "`Index::purge_keys` (1 key, 4 dirs)",
        &mut times,
        vec![n],
    ));
    index.refresh();
    let final_stats = index.stats();
    fs::write(&manifest, &signature)?;

    println!();
    println!(
        "{} files, {:.2} GB ({} sizes), 4 dirs, levels 1:2, {} runs, warm page cache, {} CPUs",
        entries.len(),
        gb(total),
        config.profile,
        config.runs,
        std::thread::available_parallelism().map_or(1, usize::from),
    );
    println!();
    println!("| operation | median | min | max | vs grep | files matched/removed per run |");
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        row.print(grep_median);
    }
    println!();
    println!(
        "index: {} files, {} dirs watched, complete: {}, rebuilds: {}; RSS growth after 3 builds ≈ {:.1} MiB ({:.0} B/file)",
        final_stats.files,
        final_stats.dirs,
        final_stats.complete,
        final_stats.rebuilds,
        rss as f64 / 1_048_576.0,
        rss as f64 / final_stats.files.max(1) as f64,
    );
    let ratio = |d: Duration| grep_median.as_secs_f64() / d.as_secs_f64();
    println!(
        "pattern purge vs grep's listing: scan ×{:.1} (lookup alone ×{:.1}), index ×{:.0} (lookup alone ×{:.0})",
        ratio(rows[2].median),
        ratio(scan_lookup),
        ratio(index_median),
        ratio(index_lookup),
    );
    if config.keep || config.base.is_some() {
        eprintln!(
            "kept {} for the next run (EDGEFORM_BENCH_DIR)",
            base.display()
        );
        if let Some(tmp) = tmp {
            let _ = tmp.keep();
        }
    }
    Ok(())
}

struct Row {
    name: &'static str,
    median: Duration,
    min: Duration,
    max: Duration,
    counts: Vec<usize>,
}

impl Row {
    fn new(name: &'static str, times: &mut [Duration], counts: Vec<usize>) -> Row {
        let median = median(times);
        let min = times.iter().min().copied().unwrap_or_default();
        let max = times.iter().max().copied().unwrap_or_default();
        Row {
            name,
            median,
            min,
            max,
            counts,
        }
    }

    fn print(&self, grep: Duration) {
        let ratio = grep.as_secs_f64() / self.median.as_secs_f64();
        let counts = match self.counts.as_slice() {
            [] => String::new(),
            [one] => one.to_string(),
            many => many
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        };
        println!(
            "| {} | {} | {} | {} | ×{} | {counts} |",
            self.name,
            fmt(self.median),
            fmt(self.min),
            fmt(self.max),
            if ratio >= 10.0 {
                format!("{ratio:.0}")
            } else {
                format!("{ratio:.2}")
            },
        );
    }
}

fn fmt(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else if d >= Duration::from_millis(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    }
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn gb(bytes: usize) -> f64 {
    bytes as f64 / 1e9
}

fn host_name(h: usize) -> String {
    format!("site-{h:02}.example.com")
}

fn host_of(key: &str) -> usize {
    key.strip_prefix("httpssite-")
        .and_then(|k| k.get(..2))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The seed's pattern shape, for one host.
fn pattern(h: usize) -> String {
    format!(r"KEY:.*{}/", regex::escape(&host_name(h)))
}

/// The files to generate: deterministic, so a kept tree can be reused.
fn plan(config: &Config) -> io::Result<Vec<Entry>> {
    let mut rng = Rng(0x00ed_9ef0);
    let (lo, hi) = (2048f64.ln(), 1_048_576f64.ln());
    (0..config.files)
        .map(|i| {
            let u = rng.unit();
            let size = match config.profile.as_str() {
                "web" if rng.unit() < 0.95 => (lo + u * (32_768f64.ln() - lo)).exp(),
                "web" => (32_768f64.ln() + u * (hi - 32_768f64.ln())).exp(),
                "loguniform" => (lo + u * (hi - lo)).exp(),
                other => {
                    return Err(io::Error::other(format!(
                        "EDGEFORM_BENCH_SIZES={other}: web or loguniform"
                    )));
                }
            } as usize;
            let ext = match size {
                ..8_192 => ["js", "css", "html", "json"][i % 4],
                8_192..65_536 => ["png", "jpg", "js"][i % 3],
                _ => ["mp4", "m4s", "ts"][i % 3],
            };
            let host = host_name(rng.below(HOSTS));
            let key = format!("https{host}/assets/{:x}/{i}.{ext}", rng.next() % 4096);
            Ok(Entry {
                dir: rng.below(DIRS.len()),
                key,
                size,
            })
        })
        .collect()
}

fn write(layout: &Layout, e: &Entry, seed: u64) -> io::Result<()> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut body = vec![0u8; e.size];
    for chunk in body.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next().to_le_bytes()[..chunk.len()]);
    }
    write_cache_file(&layout.dirs[e.dir], &layout.levels, &e.key, &body).map(drop)
}

/// Run the seed's command; the files it lists.
fn grep(layout: &Layout, pattern: &str) -> io::Result<Vec<PathBuf>> {
    let out = Command::new("grep")
        .arg("-rlP")
        .arg(pattern)
        .args(&layout.dirs)
        // grep's fastest setting, so the comparison flatters grep if anything.
        .env("LC_ALL", "C")
        .stderr(Stdio::inherit())
        .output()?;
    // 1: nothing matched; above: an error.
    if out.status.code().is_none_or(|c| c > 1) {
        return Err(io::Error::other(format!("grep failed: {}", out.status)));
    }
    Ok(out
        .stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| PathBuf::from(std::ffi::OsStr::from_bytes(l)))
        .collect())
}

fn check_space(base: &Path, total: usize) -> io::Result<()> {
    let st = rustix::fs::statvfs(base)?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    // Bodies, headers, a block's slack per file, and room to spare.
    let need = (total as u64).saturating_mul(3) / 2 + (1 << 30);
    if free < need {
        return Err(io::Error::other(format!(
            "{}: {:.1} GB free, {:.1} GB needed; set EDGEFORM_BENCH_DIR or EDGEFORM_BENCH_FILES",
            base.display(),
            free as f64 / 1e9,
            need as f64 / 1e9
        )));
    }
    Ok(())
}

/// Resident memory of this process.
fn rss_bytes() -> usize {
    let statm = fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// xorshift64*: fast, deterministic, good enough for sizes and bodies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
