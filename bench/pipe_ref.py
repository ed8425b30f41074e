#!/usr/bin/env python3
"""Full apply vs the fair reference: `check` + `redis-cli --pipe` of the same entries.

100,000 sites (bench/push.py's repository, .bench/push), 4 real redis-servers on loopback.
In one run, side by side, medians of --runs:
  - `edgeform check` (the reference's first half: the apply has to parse and compile too);
  - a full `edgeform apply --yes` to the 4 servers after FLUSHALL, whole process;
  - `redis-cli --pipe` mass insertion of the same entries into the same 4 servers, in
    parallel, after FLUSHALL: every key edgeform wrote to the first server (strings as SET:
    the documents and each manifest bucket, format 3; `edgeform:manifest:buckets` and the
    meta as one HSET each), read back once from that server and encoded as RESP up front
    (not timed);
    the 4 servers hold the same sites, so one file serves all 4 (the routing table and the
    meta differ by a few bytes per node).
Goal: apply <= 1.0 x (check + pipe). Usage:
    python3 bench/pipe_ref.py [--runs 3] [--sites 100000] [--bin [LABEL=]PATH ...]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from push import EDGEFORM, Redis, generate, timed, write_nodes  # noqa: E402


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def cli(port: int, *args) -> bytes:
    return subprocess.run(["redis-cli", "-p", str(port), "--raw", *args], capture_output=True, check=True).stdout


def entries_of(port: int) -> bytes:
    """Every key on the server as RESP write commands (strings and hashes only)."""
    keys = [k for k in cli(port, "--scan").split(b"\n") if k]
    out = []
    strings, hashes = [], []
    for k in keys:
        t = cli(port, "TYPE", k).strip() if not k.startswith((b"site:", b"suspended:")) else b"string"
        (strings if t == b"string" else hashes).append(k)
    for i in range(0, len(strings), 1000):
        batch = strings[i:i + 1000]
        # Values are one-line JSON or "1": --raw prints one per line.
        values = cli(port, "MGET", *batch).split(b"\n")[:-1]
        if len(values) != len(batch):
            raise SystemExit("a value spans lines; cannot read it back with --raw")
        out += [resp("SET", k, v) for k, v in zip(batch, values)]
    for h in hashes:
        flat = cli(port, "HGETALL", h).split(b"\n")[:-1]
        out.append(resp("HSET", h, *flat))
    return b"".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sites", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench" / "push")
    ap.add_argument("--bin", action="append", metavar="[LABEL=]PATH",
                    help="the edgeform binary (repeatable: each run times every one in turn, "
                         "against the same pipe)")
    a = ap.parse_args()
    bins = []
    for b in a.bin or [str(EDGEFORM)]:
        label, _, path = b.rpartition("=")
        bins.append((label or path, Path(path)))
    generate(a.dir, a.sites)
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="edgeform-pipe-bench-"))
    servers = [Redis(work) for _ in range(4)]
    try:
        write_nodes(a.dir, servers)
        timed([str(bins[0][1]), "--repo", str(a.dir), "check"], ROOT)  # warm-up
        check = {label: [] for label, _ in bins}
        full = {label: [] for label, _ in bins}
        pipe = []
        payload = None
        for _ in range(a.runs):
            for label, path in bins:
                ef = [str(path), "--repo", str(a.dir)]
                check[label].append(timed(ef + ["check"], ROOT))
                for s in servers:
                    s.cli("FLUSHALL")
                full[label].append(timed(ef + ["apply", "--yes"], ROOT))
            if payload is None:
                payload = work / "entries.resp"
                payload.write_bytes(entries_of(servers[0].port))
                keys = int(servers[0].cli("DBSIZE").strip())
                size = payload.stat().st_size
            for s in servers:
                s.cli("FLUSHALL")
            t0 = time.perf_counter()
            procs = [subprocess.Popen(["redis-cli", "-p", str(s.port), "--pipe"], stdin=open(payload, "rb"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for s in servers]
            if any(p.wait() != 0 for p in procs):
                raise SystemExit("redis-cli --pipe failed")
            pipe.append(time.perf_counter() - t0)
            if int(servers[3].cli("DBSIZE").strip()) != keys:
                raise SystemExit("the pipe did not write every key")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    runs = lambda v: ", ".join(f"{x:.2f}" for x in v)
    mp = statistics.median(pipe)
    print(f"\n{a.sites} sites, 4 redis-servers, {keys} keys each ({size / 1e6:.0f} MB of RESP per server); {os.cpu_count()} cores; "
          f"medians of {a.runs}; load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n")
    print(f"`redis-cli --pipe` of the same entries, 4 servers in parallel: {mp:.2f} s ({runs(pipe)})\n")
    print("| binary | `edgeform check` | full `edgeform apply --yes` to the 4 empty servers | "
          "apply / (check + pipe), of the medians | per run |\n|---|---:|---:|---:|---|")
    for label, _ in bins:
        mc, ma = statistics.median(check[label]), statistics.median(full[label])
        per_run = [f / (c + p) for c, f, p in zip(check[label], full[label], pipe)]
        print(f"| {label} | {mc:.2f} s ({runs(check[label])}) | {ma:.2f} s ({runs(full[label])}) | "
              f"**{ma / (mc + mp):.2f}** | {runs(per_run)} (median {statistics.median(per_run):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
