#!/usr/bin/env python3
"""Benchmark `edgeform check` against PyYAML/libyaml merely parsing the same files.

    python3 bench/check.py [--runs 5] [--regen] [--dir .bench/synthetic]
    python3 bench/check.py --sites 1000000 --runs 3 [--bin before=PATH --bin after=PATH]

1. `cargo build --release -p edgeform` (skip with --no-build);
2. generates the synthetic repository with bench/gen_repo.py when the folder
   is missing, when --regen is given, or when it was generated with other
   parameters than asked for;
3. runs `edgeform check --repo DIR` once and fails loudly (printing its
   diagnostics) unless it exits 0; warnings are shown and counted;
4. one discarded warm-up of each side, then --runs rounds, interleaved:
   (a) `target/release/edgeform check --repo DIR`, whole process, wall time
       and peak RSS measured by a fresh Python wrapper process
       (getrusage(RUSAGE_CHILDREN).ru_maxrss);
   (b) a fresh Python process listing the same files (cluster.yaml, sites/,
       zones/, nodes/, as edgeform does) and calling
       `yaml.load(f, Loader=yaml.CSafeLoader)` on each; the timer covers
       listing + open + parse, not interpreter start-up or `import yaml`;
5. prints a markdown table (medians, ratio check/parse, peak RSS, machine):
   wall and CPU time (user + sys) of both sides and both ratios; under load
   the CPU-time ratio is the fair one (the load average is printed).

`--parse-runs N` measures the Python parse in the first N rounds only (at
1,000,000 sites one parse takes 10-30 min here).

`--bin NAME=PATH` (repeatable) measures those binaries instead of building
(each gets its rows; runs interleaved: every binary, then the parse). With
`--sites` other than 100,000 and no `--dir`, the repository goes to
`.bench/synthetic-<sites>`; the peak-RSS goal is < 1 GiB up to 100,000
sites and ≤ 2 GiB above (up to 1,000,000 sites).

Standard library plus PyYAML (with libyaml) only. Exit status: 0 measured,
1 build/generation/check failure, 2 with --enforce when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "bench" / "gen_repo.py"

GOAL_RATIO = 0.25
GOAL_RSS_BYTES = 1 << 30
# 1,000,000 sites in at most 2 GiB.
GOAL_RSS_BYTES_LARGE = 2 << 30

# Runs a command and reports its wall time, exit code and resource usage.
# A fresh interpreter per run, so RUSAGE_CHILDREN covers exactly that one
# child (and its descendants).
WRAPPER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"wall": wall, "rc": p.returncode, "maxrss_kib": ru.ru_maxrss,
           "cpu": ru.ru_utime + ru.ru_stime,
           "stdout": p.stdout.decode("utf-8", "replace")[-4000:],
           "stderr": p.stderr.decode("utf-8", "replace")}, sys.stdout)
"""

# Lists the config files the way edgeform's loader does and parses each one
# with libyaml. Timed from listing to the last parse.
PARSER = r"""
import json, os, resource, sys, time
import yaml
root = sys.argv[1]
Loader = yaml.CSafeLoader

def walk(d, out):
    for e in os.scandir(d):
        if e.name.startswith("."):
            continue
        if e.is_dir():
            walk(e.path, out)
        elif e.name.endswith((".yaml", ".yml")):
            out.append(e.path)

t = time.perf_counter()
cpu = time.process_time()
paths = []
c = os.path.join(root, "cluster.yaml")
if os.path.isfile(c):
    paths.append(c)
for folder in ("sites", "zones", "nodes"):
    d = os.path.join(root, folder)
    if os.path.isdir(d):
        walk(d, paths)
for p in paths:
    with open(p, "rb") as f:
        yaml.load(f, Loader=Loader)
wall = time.perf_counter() - t
cpu = time.process_time() - cpu
ru = resource.getrusage(resource.RUSAGE_SELF)
json.dump({"wall": wall, "files": len(paths), "maxrss_kib": ru.ru_maxrss, "cpu": cpu}, sys.stdout)
"""


def die(msg: str, code: int = 1):
    print(f"bench: {msg}", file=sys.stderr)
    sys.exit(code)


def build() -> float:
    t = time.perf_counter()
    print("bench: cargo build --release -p edgeform", file=sys.stderr, flush=True)
    p = subprocess.run(["cargo", "build", "--release", "-p", "edgeform"], cwd=ROOT)
    if p.returncode != 0:
        die("release build failed")
    return time.perf_counter() - t


def binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    exe = target / "release" / "edgeform"
    if not exe.is_file():
        die(f"{exe} not found (build first, or drop --no-build)")
    return exe


def read_stamp(d: Path) -> dict | None:
    try:
        return json.loads((d / ".gen.json").read_text())
    except (OSError, ValueError):
        return None


def ensure_repo(args) -> tuple[dict, bool]:
    """The stamp of the synthetic repo, generating it if needed; and
    whether it was generated in this run."""
    wanted = {"seed": args.seed, "sites": args.sites, "zones": args.zones,
              "routes": args.routes, "nodes": args.nodes}
    stamp = read_stamp(args.dir)
    reason = None
    if args.regen:
        reason = "--regen"
    elif not args.dir.exists():
        reason = "missing"
    elif stamp is None:
        die(f"{args.dir} exists but has no .gen.json; remove it or pick another --dir")
    elif stamp.get("params") != wanted:
        reason = f"parameters changed ({stamp.get('params')} → {wanted})"
    if reason is None:
        return stamp, False
    print(f"bench: generating {args.dir} ({reason})", file=sys.stderr, flush=True)
    cmd = [sys.executable, str(GEN), "--out", str(args.dir)] + \
          [x for k, v in wanted.items() for x in (f"--{k}", str(v))]
    if subprocess.run(cmd).returncode != 0:
        die("generation failed")
    stamp = read_stamp(args.dir)
    if stamp is None:
        die("generator wrote no .gen.json")
    return stamp, True


def run_json(cmd: list[str]) -> dict:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        die(f"measurement process failed: {' '.join(cmd[:4])} …")
    return json.loads(p.stdout)


def run_check(exe: Path, repo: Path) -> dict:
    return run_json([sys.executable, "-c", WRAPPER, str(exe), "check", "--repo", str(repo)])


def run_parse(repo: Path) -> dict:
    return run_json([sys.executable, "-c", PARSER, str(repo)])


def summary_counts(stderr: str) -> tuple[int, int] | None:
    """(errors, warnings) from check's last line: `DIR: valid (0 errors, 3 warnings in N files)`."""
    for line in reversed(stderr.strip().splitlines()):
        if "error" in line and "warning" in line and " in " in line:
            try:
                inner = line[line.rindex("(") + 1:line.rindex(")")]
                parts = inner.split(",")
                return int(parts[0].split()[0]), int(parts[1].split()[0])
            except (ValueError, IndexError):
                return None
    return None


def repo_size(d: Path) -> tuple[int, int]:
    files = size = 0
    stack = [d / "cluster.yaml"] if (d / "cluster.yaml").is_file() else []
    for p in stack:
        files, size = files + 1, size + p.stat().st_size
    todo = [d / f for f in ("sites", "zones", "nodes") if (d / f).is_dir()]
    while todo:
        for e in os.scandir(todo.pop()):
            if e.name.startswith("."):
                continue
            if e.is_dir():
                todo.append(Path(e.path))
            elif e.name.endswith((".yaml", ".yml")):
                files += 1
                size += e.stat().st_size
    return files, size


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count()
    import yaml
    try:
        from yaml import _yaml
        libyaml = _yaml.get_version_string()
    except Exception:  # noqa: BLE001 - informational only
        libyaml = "?"
    return {"cpu": cpu, "nproc": nproc, "mem": mem, "kernel": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "pyyaml": yaml.__version__, "libyaml": libyaml,
            "with_libyaml": bool(getattr(yaml, "__with_libyaml__", False))}


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def fmt_s(x: float) -> str:
    return f"{x:.3f} s" if x < 10 else f"{x:.2f} s"


def mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=None,
                    help="synthetic repository folder (default .bench/synthetic, or "
                         ".bench/synthetic-<sites> when --sites is not 100000)")
    ap.add_argument("--regen", action="store_true", help="regenerate the repository")
    ap.add_argument("--runs", type=int, default=5, help="measured runs of each side (default 5)")
    ap.add_argument("--parse-runs", type=int, default=None, metavar="N",
                    help="measure the Python parse in the first N rounds only (default: every "
                         "round); below --runs its warm-up is skipped too (edgeform's "
                         "validation run has read every file already). For 1,000,000 sites, "
                         "where one parse takes 10-30 min")
    ap.add_argument("--no-build", action="store_true", help="skip cargo build --release")
    ap.add_argument("--enforce", action="store_true", help="exit 2 when a goal is missed")
    ap.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    ap.add_argument("--bin", action="append", default=[], metavar="NAME=PATH",
                    help="measure this binary (repeatable; implies --no-build)")
    g = ap.add_argument_group("repository size (passed to gen_repo.py)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--sites", type=int, default=100_000)
    g.add_argument("--zones", type=int, default=1_000)
    g.add_argument("--routes", type=int, default=100)
    g.add_argument("--nodes", type=int, default=1_200)
    args = ap.parse_args(argv)
    if args.runs < 1:
        die("--runs must be at least 1")
    if args.parse_runs is None:
        args.parse_runs = args.runs
    if not 1 <= args.parse_runs <= args.runs:
        die("--parse-runs must be between 1 and --runs")
    if args.dir is None:
        name = "synthetic" if args.sites == 100_000 else f"synthetic-{args.sites}"
        args.dir = ROOT / ".bench" / name
    args.dir = args.dir if args.dir.is_absolute() else Path.cwd() / args.dir
    bins = []
    for b in args.bin:
        name, sep, path = b.partition("=")
        if not sep or not name or not path:
            die(f"--bin wants NAME=PATH, got `{b}`", 64)
        if not Path(path).is_file():
            die(f"--bin {name}: {path} is not a file")
        bins.append((name, Path(path)))

    import yaml
    if not getattr(yaml, "__with_libyaml__", False):
        die("PyYAML is installed without libyaml (yaml.CSafeLoader is missing)")

    build_s = None if args.no_build or bins else build()
    if not bins:
        bins = [("", binary())]
    # Measure private copies: a concurrent `cargo build` must not swap a
    # binary between runs.
    tmp = Path(tempfile.mkdtemp(prefix="edgeform-bench-"))
    exes = []
    for i, (name, path) in enumerate(bins):
        exe = tmp / f"edgeform-{i}"
        shutil.copy2(path, exe)
        exes.append((name, exe))
    try:
        return measure(args, exes, build_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args, exes: list[tuple[str, Path]], build_s: float | None) -> int:
    load_start = os.getloadavg()[0]
    if load_start > 0.5:
        print(f"bench: note: load average is {load_start:.2f}; other work on this machine skews the "
              "figures", file=sys.stderr)
    stamp, fresh = ensure_repo(args)
    files, size = repo_size(args.dir)
    goal_rss = GOAL_RSS_BYTES if stamp["counts"]["sites"] <= 100_000 else GOAL_RSS_BYTES_LARGE
    goal_rss_text = "< 1 GiB" if goal_rss == GOAL_RSS_BYTES else "≤ 2 GiB"

    # Validity first (this is also check's warm-up run, discarded).
    warnings = None
    for name, exe in exes:
        print(f"bench: validating (edgeform check{' ' + name if name else ''})", file=sys.stderr,
              flush=True)
        first = run_check(exe, args.dir)
        counts = summary_counts(first["stderr"])
        if first["rc"] != 0:
            sys.stderr.write(first["stderr"])
            die(f"`edgeform check --repo {args.dir}` exited {first['rc']}: the generated repository "
                "is invalid (diagnostics above). Fix bench/gen_repo.py, or report an edgeform bug.")
        warnings = counts[1] if counts else None
        if warnings:
            sys.stderr.write(first["stderr"][-20000:])
            print(f"bench: warning: check reported {warnings} warning(s) (shown above)",
                  file=sys.stderr)

    if args.parse_runs == args.runs:
        print("bench: warm-up parse", file=sys.stderr, flush=True)
        warm_parse = run_parse(args.dir)
        if warm_parse["files"] != files:
            die(f"parser saw {warm_parse['files']} files, expected {files}")

    checks: dict[str, list[dict]] = {name: [] for name, _ in exes}
    parses = []
    for i in range(args.runs):
        done = []
        for name, exe in exes:
            c = run_check(exe, args.dir)
            if c["rc"] != 0:
                sys.stderr.write(c["stderr"])
                die(f"check{' ' + name if name else ''} exited {c['rc']} on run {i + 1}")
            checks[name].append(c)
            done.append(f"check{' ' + name if name else ''} {c['wall']:.3f} s "
                        f"(CPU {c['cpu']:.3f} s, {mib(c['maxrss_kib'])})")
        parsed = ""
        if i < args.parse_runs:
            p = run_parse(args.dir)
            if p["files"] != files:
                die(f"parser saw {p['files']} files, expected {files}")
            parses.append(p)
            parsed = f", parse {p['wall']:.3f} s (CPU {p['cpu']:.3f} s)"
        print(f"bench: run {i + 1}/{args.runs}: {', '.join(done)}{parsed}; "
              f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)

    parse_med = statistics.median(p["wall"] for p in parses)
    parse_cpu_med = statistics.median(p["cpu"] for p in parses)
    parse_rss_kib = max(p["maxrss_kib"] for p in parses)
    m = machine()
    c = stamp["counts"]
    gen_s = stamp.get("generate_seconds")

    yes, no = "✅", "❌"
    vers = []
    for name, exe in exes:
        ver = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout.strip()
        vers.append(f"{name + ': ' if name else ''}{ver}")
    lines = [
        f"**Repository** (`bench/gen_repo.py`, seed {stamp['params']['seed']}): "
        f"{c['sites']:,} sites (+{c['aliases']:,} aliases), {c['zones']:,} zones × "
        f"{stamp['params']['routes']} routes ({c['routes']:,} routes), {c['nodes']:,} nodes — "
        f"{files:,} YAML files, {size / 2**20:.1f} MiB; generated in {gen_s:.1f} s"
        f"{'' if fresh else ' (earlier run)'}.",
        "",
        f"**Machine**: {m['cpu']}, nproc {m['nproc']}"
        + (f", {m['mem'] / 2**30:.0f} GiB RAM" if m["mem"] else "")
        + f", {m['kernel']}; {'; '.join(vers)} (tree `{git_rev()}`); Python {m['python']}, "
        f"PyYAML {m['pyyaml']}, libyaml {m['libyaml']}; load average {load_start:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after.",
        "",
        (f"Median of {args.runs} runs each (interleaved, after one discarded warm-up; warm page cache)."
         if args.parse_runs == args.runs else
         f"edgeform: median of {args.runs} runs (after one discarded warm-up); the Python parse: "
         f"{args.parse_runs} run(s) (`--parse-runs`; no warm-up of its own, edgeform's runs "
         "had read every file); warm page cache."),
        "",
        "CPU time is user + system time of the process (edgeform's threads summed). On a "
        "loaded machine the CPU-time ratio is the fair one: wall time depends on how much of "
        "a core each side got, CPU time much less (edgeform uses every core it gets, the "
        "parser one).",
        "",
        "| measure | median | min | max | goal |",
        "|---|---:|---:|---:|---|",
        f"| PyYAML `CSafeLoader` parse of the same files (wall) | {fmt_s(parse_med)} | "
        f"{fmt_s(min(x['wall'] for x in parses))} | {fmt_s(max(x['wall'] for x in parses))} | |",
        f"| PyYAML parse CPU time (user + sys) | {fmt_s(parse_cpu_med)} | "
        f"{fmt_s(min(x['cpu'] for x in parses))} | {fmt_s(max(x['cpu'] for x in parses))} | |",
        f"| PyYAML parse process peak RSS | {mib(parse_rss_kib)} | | | |",
    ]
    results = {}
    all_ok = True
    for name, _ in exes:
        runs = checks[name]
        tag = f" — {name}" if name else ""
        check_med = statistics.median(x["wall"] for x in runs)
        cpu_med = statistics.median(x["cpu"] for x in runs)
        rss_kib = max(x["maxrss_kib"] for x in runs)
        ratio = check_med / parse_med
        ok_ratio = ratio <= GOAL_RATIO
        ok_rss = rss_kib * 1024 <= goal_rss
        all_ok = all_ok and ok_ratio and ok_rss
        lines += [
            f"| `edgeform check --repo …`{tag} (wall, whole process) | {fmt_s(check_med)} | "
            f"{fmt_s(min(x['wall'] for x in runs))} | {fmt_s(max(x['wall'] for x in runs))} | |",
            f"| `edgeform check`{tag} CPU time (user + sys) | {fmt_s(cpu_med)} | "
            f"{fmt_s(min(x['cpu'] for x in runs))} | {fmt_s(max(x['cpu'] for x in runs))} | |",
            f"| **ratio check / parse**{tag} (wall) | **{ratio:.3f}** | | | ≤ {GOAL_RATIO} "
            f"{yes if ok_ratio else no} |",
            f"| ratio check / parse{tag} (CPU time) | {cpu_med / parse_cpu_med:.3f} | | | |",
            f"| **`edgeform check` peak RSS**{tag} | **{mib(rss_kib)}** | "
            f"{mib(min(x['maxrss_kib'] for x in runs))} | {mib(rss_kib)} | {goal_rss_text} "
            f"{yes if ok_rss else no} |",
        ]
        results[name or "edgeform"] = {
            "check": [{k: x[k] for k in ("wall", "cpu", "maxrss_kib")} for x in runs],
            "check_median_s": check_med, "ratio": ratio, "check_peak_rss_kib": rss_kib,
            "check_cpu_median_s": cpu_med, "cpu_ratio": cpu_med / parse_cpu_med,
        }
    lines.append(f"| `edgeform check` warnings | {warnings if warnings is not None else '?'} | | | 0 |")
    if build_s is not None:
        lines.append("")
        lines.append(f"(release build step: {build_s:.1f} s)")
    print("\n".join(lines))

    if args.json:
        single = results[next(iter(results))]
        args.json.write_text(json.dumps({
            "stamp": stamp, "files": files, "bytes": size, "machine": m, "edgeform": vers,
            "git": git_rev(), "binaries": results,
            "check": single["check"],
            "parse": [{k: x[k] for k in ("wall", "cpu", "maxrss_kib")} for x in parses],
            "check_median_s": single["check_median_s"], "parse_median_s": parse_med,
            "parse_cpu_median_s": parse_cpu_med, "loadavg_end": os.getloadavg()[0],
            "ratio": single["ratio"], "check_peak_rss_kib": single["check_peak_rss_kib"],
            "warnings": warnings, "loadavg_start": load_start,
        }, indent=2) + "\n")
    if args.enforce and not all_ok:
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
