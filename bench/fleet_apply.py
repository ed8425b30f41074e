#!/usr/bin/env python3
"""A full apply to N empty edges in one state: what the apply costs per edge.

The repository of bench/scale.py (10,000 sites, ~17,900 keys per edge; .bench/scale), N
redis-servers on loopback, every edge carrying every site (one desired state). For each N
and each binary, alternating, --runs times: FLUSHALL on every server, then
`edgeform apply --yes`, timed as a whole process: wall time, the process's CPU (user +
sys, from wait4) and its peak RSS. One warm-up apply per binary first.

Usage: python3 bench/fleet_apply.py [--edges 30 100 300] [--runs 3]
                                    [--bin LABEL=PATH ...] (default: after=target/release/edgeform)
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from push import EDGEFORM, Redis, generate  # noqa: E402
from scale import write_nodes  # noqa: E402


def apply(binary: str, repo: Path) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MiB of one `apply --yes`."""
    t0 = time.perf_counter()
    p = subprocess.Popen([binary, "--repo", str(repo), "apply", "--yes"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"apply failed:\n{err[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--edges", type=int, nargs="+", default=[30, 100, 300])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sites", type=int, default=10_000)
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench" / "scale")
    ap.add_argument("--bin", action="append", default=[], metavar="LABEL=PATH")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    bins = [b.split("=", 1) for b in a.bin] or [["after", str(EDGEFORM)]]
    generate(a.dir, a.sites)
    rows = []
    for n in a.edges:
        work = Path(tempfile.mkdtemp(prefix="edgeform-fleet-bench-"))
        servers = []
        try:
            servers = [Redis(work) for _ in range(n)]
            write_nodes(a.dir, servers)
            load = os.getloadavg()[0]
            got = {label: [] for label, _ in bins}
            for r in range(a.runs + 1):
                for label, path in bins:
                    for s in servers:
                        s.cli("FLUSHALL")
                    m = apply(path, a.dir)
                    if r > 0:
                        got[label].append(m)
            keys = int(servers[-1].cli("DBSIZE").strip())
            for label, _ in bins:
                rows.append((n, label, keys, got[label], load))
                print(f"N={n} {label}: {got[label]}", file=sys.stderr)
        finally:
            for s in servers:
                s.stop()
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.sites} sites, one redis-server per edge on loopback, every edge in one state; "
          f"{os.cpu_count()} cores; medians of {a.runs} alternating runs after a warm-up each\n")
    print("| edges | binary | keys per edge | wall | edgeform CPU | CPU per edge | peak RSS | runs (wall) | load |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---:|")
    for n, label, keys, ms, load in rows:
        wall, cpu, rss = (statistics.median(x[i] for x in ms) for i in range(3))
        print(f"| {n} | {label} | {keys} | {wall:.2f} s | {cpu:.2f} s | {1000 * cpu / n:.1f} ms "
              f"| {rss:.0f} MiB | {', '.join(f'{x[0]:.2f}' for x in ms)} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
