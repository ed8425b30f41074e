#!/usr/bin/env python3
"""Benchmark the pusher: 100,000 sites, 4 targets (real redis-servers on loopback).

Measures, in one run and side by side:
  - `edgeform check` on the repository (the reference for plan);
  - no-op `edgeform plan` against 4 targets that already hold everything
    (goal: <= 1.5 x check);
  - a full `edgeform apply` to 4 empty targets (400,000 documents plus their
    manifests and meta), against `redis-benchmark -P 64 -t set -d 400 -n 400000`
    on the same machine (goal: <= 2 x);
  - a one-site change applied to the 4 targets.
Medians of --runs rounds. Usage: python3 bench/push.py [--runs 5] [--sites 100000]
"""

import argparse
import json
import os
import platform
import random
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
import gen_repo  # noqa: E402
from benchlib import cpu_seconds, free_port  # noqa: E402

EDGEFORM = ROOT / "target" / "release" / "edgeform"


class Redis:
    def __init__(self, workdir: Path):
        self.port = free_port()
        self.dir = workdir / f"redis-{self.port}"
        self.dir.mkdir(parents=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.05)
        raise SystemExit(f"redis-server on {self.port} did not start")

    def cli(self, *args) -> str:
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        return r.stdout

    def cpu(self) -> float:
        """CPU seconds (user + system) the server has used so far."""
        return cpu_seconds(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def generate(repo: Path, n_sites: int, seed: int = 7):
    stamp = repo / ".push-gen.json"
    want = {"sites": n_sites, "seed": seed, "version": gen_repo.GENERATOR_VERSION}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    if repo.exists():
        shutil.rmtree(repo)
    (repo / "sites").mkdir(parents=True)
    (repo / "nodes").mkdir()
    rng = random.Random(seed)
    names = gen_repo.HostNames(rng)
    t0 = time.perf_counter()
    for _ in range(n_sites):
        host, text, _ = gen_repo.write_site(rng, names, ["eu"])
        (repo / "sites" / gen_repo.site_filename(host)).write_text(text, encoding="utf-8")
    stamp.write_text(json.dumps(want))
    print(f"generated {n_sites} sites in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def write_nodes(repo: Path, servers):
    for f in (repo / "nodes").glob("*.yaml"):
        f.unlink()
    for i, r in enumerate(servers, 1):
        (repo / "nodes" / f"edge-{i}.yaml").write_text(
            f"name: edge-{i}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.{i}, lon: 4.{i}}}\n"
            f"addresses: [198.51.100.{i}]\nredis: {{url: \"redis://127.0.0.1:{r.port}\"}}\n")


def timed(args, cwd: Path, ok=(0,)) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode not in ok:
        raise SystemExit(f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return dt


def med(xs):
    return statistics.median(xs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sites", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench" / "push")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--bin", type=Path, default=EDGEFORM, help="the edgeform binary to measure")
    a = ap.parse_args()
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "edgeform"], cwd=ROOT, check=True)
    generate(a.dir, a.sites)
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="edgeform-push-bench-"))
    servers = [Redis(work) for _ in range(4)]
    try:
        write_nodes(a.dir, servers)
        ef = [str(a.bin), "--repo", str(a.dir)]
        timed(ef + ["check"], ROOT)  # warm-up
        check = [timed(ef + ["check"], ROOT) for _ in range(a.runs)]

        full, push, push_cpu = [], [], []
        for _ in range(a.runs):
            for s in servers:
                s.cli("FLUSHALL")
            c0 = sum(s.cpu() for s in servers)
            t0 = time.perf_counter()
            r = subprocess.run(ef + ["apply", "--yes"], cwd=ROOT, capture_output=True, text=True)
            full.append(time.perf_counter() - t0)
            push_cpu.append(sum(s.cpu() for s in servers) - c0)
            m = re.search(r"\(push ([0-9.]+) s\)", r.stdout)
            if r.returncode != 0 or not m:
                raise SystemExit(f"apply failed:\n{r.stdout}\n{r.stderr}")
            push.append(float(m.group(1)))
        keys = int(servers[0].cli("DBSIZE").strip())

        timed(ef + ["plan"], ROOT)  # warm-up
        noop = [timed(ef + ["plan", "--detailed-exitcode"], ROOT) for _ in range(a.runs)]

        # One site changes (its origin flips), applied to the 4 targets.
        site = sorted((a.dir / "sites").glob("*.yaml"))[0]
        original = site.read_text()
        one = []
        try:
            for i in range(a.runs):
                text = re.sub(r"^origin: .*$", f"origin: http://192.0.2.{10 + i}", original, count=1, flags=re.M)
                site.write_text(text)
                one.append(timed(ef + ["apply", "--yes"], ROOT))
        finally:
            site.write_text(original)

        bench, bench_cpu = [], []
        for _ in range(a.runs):
            servers[3].cli("FLUSHALL")
            c0 = servers[3].cpu()
            bench.append(timed(["redis-benchmark", "-p", str(servers[3].port), "-P", "64", "-t", "set",
                                "-d", "400", "-n", "400000", "-q"], ROOT))
            bench_cpu.append(servers[3].cpu() - c0)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)

    load_end = os.getloadavg()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    rows = [
        ("`edgeform check` (reference)", med(check), min(check), max(check), ""),
        ("no-op `edgeform plan`, 4 targets", med(noop), min(noop), max(noop),
         f"{med(noop) / med(check):.2f} x check (goal <= 1.5)"),
        (f"full `apply` to 4 empty targets ({keys} keys each), whole process", med(full), min(full), max(full), ""),
        ("... of which the push (lock, WATCH/MULTI/EXEC to 4 targets)", med(push), min(push), max(push),
         f"{med(push) / med(bench):.2f} x redis-benchmark (goal <= 2)"),
        ("`redis-benchmark -P 64 -t set -d 400 -n 400000`", med(bench), min(bench), max(bench), ""),
        ("one-site change applied to 4 targets", med(one), min(one), max(one), ""),
        ("redis-server CPU time of the full apply (4 servers together)", med(push_cpu), min(push_cpu),
         max(push_cpu), ""),
        ("redis-server CPU time of redis-benchmark (one server)", med(bench_cpu), min(bench_cpu),
         max(bench_cpu), ""),
    ]
    print(f"\n{a.sites} sites, 4 targets; {os.cpu_count()} cores ({cpu}); {platform.system()}; "
          f"medians of {a.runs} runs, wall time of the whole process; load average "
          f"{load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end\n")
    print("| what | median | min | max | ratio |\n|---|---:|---:|---:|---|")
    for name, m, lo, hi, ratio in rows:
        print(f"| {name} | {m:.3f} s | {lo:.3f} s | {hi:.3f} s | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
