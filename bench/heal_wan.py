#!/usr/bin/env python3
"""A one-shot heal of one far-away edge: `reconcile --once heal` through a link with a
round trip of --rtt-ms (bench/latency_proxy.py between edgeform and a real redis-server).

Heal compares inside the edge's Redis in bounded calls (at most 512 manifest entries each), so
a big edge costs many calls: ~350 at 100k sites, ~3,750 at 1M. Made one after another, each
costs a round trip; this shows what the chains of calls over disjoint bucket ranges (made at
once on the one connection) save. For each binary (--bin, repeatable) it prints the no-op
heal's wall time (median of --runs), the edge's part of it (from the run's start line, the
repository loaded and compiled, to the edge's heal line), its calls, and (when the binary logs it) the longest chain
of calls made in turn (`rounds`). The repository is bench/push.py's (--sites sites, under
.bench/wan), applied once through the link.

Usage: python3 bench/heal_wan.py [--sites 100000] [--rtt-ms 20] [--runs 3]
                                 [--bin before=/path/to/edgeform --bin after=target/release/edgeform]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import free_port, wait_port  # noqa: E402
from push import Redis, generate  # noqa: E402

EDGEFORM = ROOT / "target" / "release" / "edgeform"


def heal(binary: str, repo: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run([binary, "--repo", str(repo), "reconcile", "--once", "heal"], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    dt = time.perf_counter() - t0
    if r.returncode != 0 or "heal: no drift" not in r.stderr:
        raise SystemExit(f"the no-op heal failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return dt, r.stderr


def stamp(line: str) -> float:
    """Seconds of the day of a log line's RFC 3339 timestamp."""
    t = re.match(r"\S+T(\d+):(\d+):([\d.]+)Z", line)
    return int(t.group(1)) * 3600 + int(t.group(2)) * 60 + float(t.group(3))


def target_time(log: str) -> float:
    """From the run's start line (repository loaded, desired state built) to the target's
    heal line: the edge's part (its desired state built, the comparison), without loading
    and checking the repository."""
    lines = log.splitlines()
    start = next(l for l in lines if " reconcile commit=" in l)
    end = next(l for l in lines if "heal: no drift" in l)
    return stamp(end) - stamp(start)


def field(log: str, name: str):
    m = re.search(rf"\b{name}=(\d+)", log)
    return int(m.group(1)) if m else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", type=int, default=100_000)
    ap.add_argument("--rtt-ms", type=float, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench" / "wan")
    ap.add_argument("--bin", action="append", default=[],
                    help="LABEL=PATH of an edgeform binary (repeatable); default: after=target/release/edgeform")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin] or [["after", str(EDGEFORM)]]
    generate(a.dir, a.sites)
    work = Path(tempfile.mkdtemp(prefix="edgeform-heal-wan-"))
    server, proxy = Redis(work), None
    rows = []
    try:
        port = free_port()
        proxy = subprocess.Popen([sys.executable, str(ROOT / "bench" / "latency_proxy.py"), "--listen", str(port),
                                  "--to", str(server.port), "--delay-ms", str(a.rtt_ms / 2)])
        wait_port(port)
        for f in (a.dir / "nodes").glob("*.yaml"):
            f.unlink()
        (a.dir / "nodes" / "edge-1.yaml").write_text(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.1, lon: 4.1}\n"
            f"addresses: [198.51.100.1]\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n")
        r = subprocess.run([bins[0][1], "--repo", str(a.dir), "apply", "--yes"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"apply failed:\n{r.stderr[-2000:]}")
        for label, path in bins:
            heal(path, a.dir)  # warm-up (and the scripts loaded)
            load = os.getloadavg()[0]
            times, targets, logs = [], [], []
            for _ in range(a.runs):
                dt, log = heal(path, a.dir)
                times.append(dt)
                targets.append(target_time(log))
                logs.append(log)
            rows.append((label, statistics.median(times), statistics.median(targets),
                         field(logs[-1], "calls"), field(logs[-1], "rounds"), load))
            print(f"{label}: {statistics.median(times):.2f} s", file=sys.stderr)
    finally:
        if proxy:
            proxy.terminate()
            proxy.wait()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n`reconcile --once heal`, one edge of {a.sites} sites, round trip {a.rtt_ms:g} ms "
          f"(bench/latency_proxy.py); medians of {a.runs} runs, wall time of the whole process\n")
    print("| binary | no-op heal, whole process | the edge's heal (log: start line to its heal line) "
          "| server-side calls | calls made in turn (rounds) | load |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, t, target, calls, rounds, load in rows:
        print(f"| {label} | {t:.2f} s | {target:.2f} s | {calls} | {rounds if rounds is not None else calls} "
              f"| {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
