#!/usr/bin/env python3
"""End-to-end exact-URL purge across 11 edges, each with its own Redis and
its own edgeform-agent on loopback: the wall time of
`edgeform purge --site example.com --url /a.mp4 --wait 10` from start to the
last node's result (process start, repository load, 11 enqueues, 11 agents
purging, polling). Goal: p50 < 150 ms (Fastly/Cloudflare publish ~150 ms).

    python3 bench/purge_e2e.py [--runs 30]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import agent_env, free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
EF = ROOT / "target" / "release" / "edgeform"
AGENT = ROOT / "target" / "release" / "edgeform-agent"
GEN = ROOT / "target" / "release" / "examples" / "gen-cache"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--edges", type=int, default=11)
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "edgeform", "-p", "agent", "--bins", "--examples"],
                   cwd=ROOT, check=True)
    work = Path(tempfile.mkdtemp(prefix="edgeform-purge-e2e-"))
    procs = []
    try:
        repo = work / "repo"
        (repo / "sites").mkdir(parents=True)
        (repo / "nodes").mkdir()
        (repo / "sites" / "example.com.yaml").write_text("host: example.com\norigin: http://192.0.2.1\n")
        caches = []
        for i in range(a.edges):
            port = free_port()
            d = work / f"edge-{i}"
            (d / "cache").mkdir(parents=True)
            procs.append(subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                           "--appendonly", "no", "--dir", str(d)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_port(port)
            (repo / "nodes" / f"edge-{i}.yaml").write_text(
                f"name: edge-{i}\nroles: [edge]\nregion: r{i % 3}\nlocation: {{lat: 50, lon: {i}}}\n"
                f"redis: {{url: \"redis://127.0.0.1:{port}\"}}\ncache: {{dirs: [{d / 'cache'}], levels: \"1:2\"}}\n")
            (d / "agent.yaml").write_text(
                f"node: edge-{i}\nregion: r{i % 3}\nredis: {{url: \"redis://127.0.0.1:{port}\"}}\n"
                f"cache: {{dirs: [{d / 'cache'}], levels: \"1:2\"}}\n")
            procs.append(subprocess.Popen([str(AGENT), "--config", str(d / "agent.yaml")],
                                          stdout=subprocess.DEVNULL, stderr=open(d / "agent.log", "w"),
                                          env=agent_env()))
            caches.append(d / "cache")
        time.sleep(1.0)
        times = []
        for run in range(a.runs + 1):
            for c in caches:  # the object is cached on every edge again
                subprocess.run([str(GEN), str(c), "1:2", "http://example.com/a.mp4", "https://example.com/a.mp4"],
                               check=True, capture_output=True)
            t = time.perf_counter()
            r = subprocess.run([str(EF), "--repo", str(repo), "purge", "--site", "example.com", "--url", "/a.mp4",
                                "--wait", "10"], capture_output=True, text=True)
            dt = time.perf_counter() - t
            if r.returncode != 0:
                raise SystemExit(f"purge failed:\n{r.stdout}\n{r.stderr}")
            removed = sum(int(l.split(": ")[1].split()[0]) for l in r.stdout.splitlines() if "file(s) removed" in l)
            if removed != 2 * len(caches):
                raise SystemExit(f"expected {2 * len(caches)} files removed, got {removed}:\n{r.stdout}")
            if run > 0:  # the first run warms caches
                times.append(dt * 1000)
        times.sort()
        p = lambda q: times[min(len(times) - 1, int(q * len(times)))]
        print(f"\n{a.edges} edges, each with its own redis-server and edgeform-agent; {a.runs} runs")
        print("| `edgeform purge --url /a.mp4 --wait 10`, end to end | p50 | p90 | max |\n|---|---:|---:|---:|")
        print(f"| wall time, process start to the last node's result | {statistics.median(times):.1f} ms | {p(0.9):.1f} ms | {times[-1]:.1f} ms |")
    finally:
        for pr in procs:
            pr.terminate()
        for pr in procs:
            pr.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
