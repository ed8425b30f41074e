#!/usr/bin/env python3
"""Benchmark `edgeform anycast` against bgpkit-parser's own reader on the same dump.

    python3 bench/anycast.py [--prefixes 1000000] [--peers 24] [--runs 3] [--no-build]

1. `cargo build --release -p edgeform -p anycast --examples` (skip with --no-build);
2. generates a synthetic RIS-like bview with the `mrt_synth` example into
   .bench/anycast/ (plain, and gzip -1 of it), unless already there with the
   same parameters;
3. per file (plain, gzip), --runs rounds interleaved:
   (a) `target/release/edgeform --repo . anycast --format json --mrt FILE`
       (the example repository's `anycast` section: three prefixes);
   (b) `target/release/examples/bgpkit_count FILE`: bgpkit-parser's
       `BgpkitParser` elem iterator over the whole file, as in its
       `count_elems` example, through the same decompressor;
   wall time and peak RSS of each process (getrusage of a fresh wrapper);
4. prints a markdown table: medians, records/s and MB/s (MRT records and
   decompressed bytes, as `edgeform` counts them), ratio bgpkit/edgeform.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"wall": wall, "rc": p.returncode, "maxrss_kib": ru.ru_maxrss,
           "stdout": p.stdout.decode("utf-8", "replace"),
           "stderr": p.stderr.decode("utf-8", "replace")[-2000:]}, sys.stdout)
"""


def measure(cmd: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefixes", type=int, default=1_000_000)
    ap.add_argument("--peers", type=int, default=24)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args()
    os.chdir(ROOT)
    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "edgeform", "--bin", "edgeform"],
                       check=True)
        subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "anycast",
                        "--example", "mrt_synth", "--example", "bgpkit_count"],
                       check=True)
    work = ROOT / ".bench" / "anycast"
    work.mkdir(parents=True, exist_ok=True)
    plain = work / f"bview-{args.prefixes}x{args.peers}.mrt"
    gz = plain.with_suffix(".mrt.gz")
    if not plain.exists():
        subprocess.run(["target/release/examples/mrt_synth", str(plain), str(args.prefixes),
                        str(args.peers)], check=True)
        gz.unlink(missing_ok=True)
    if not gz.exists():
        with open(gz, "wb") as f:
            subprocess.run(["gzip", "-1", "-c", str(plain)], stdout=f, check=True)

    rows = []
    for label, path in (("plain", plain), ("gzip", gz)):
        ours, ref = [], []
        for _ in range(args.runs):
            r = measure(["target/release/edgeform", "--repo", ".", "anycast", "--format", "json",
                         "--mrt", str(path)])
            if r["rc"] not in (0, 2):
                print(r["stderr"], file=sys.stderr)
                return 1
            ours.append(r)
            b = measure(["target/release/examples/bgpkit_count", str(path)])
            if b["rc"] != 0:
                print(b["stderr"], file=sys.stderr)
                return 1
            ref.append(b)
        doc = json.loads(ours[0]["stdout"])
        records = doc["files"][0]["records"]
        mbytes = doc["files"][0]["bytes"] / 1e6
        elems = int(ref[0]["stdout"].strip())
        ow = statistics.median(r["wall"] for r in ours)
        bw = statistics.median(r["wall"] for r in ref)
        orss = statistics.median(r["maxrss_kib"] for r in ours) / 1024
        brss = statistics.median(r["maxrss_kib"] for r in ref) / 1024
        flags = [(p["prefix"], [f["kind"] for f in p["flags"]]) for p in doc["prefixes"]]
        rows.append((label, path.stat().st_size / 1e6, records, mbytes, elems, ow, bw, orss, brss, flags))

    print(f"synthetic bview: {args.prefixes:,} prefixes × {args.peers} peers, medians of {args.runs}\n")
    print("| file | on disk | MRT records | decompressed | reader | wall | records/s | MB/s | peak RSS |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for label, disk, records, mb, elems, ow, bw, orss, brss, _ in rows:
        for name, w, rss in (("`edgeform anycast`", ow, orss), (f"bgpkit elems ({elems:,})", bw, brss)):
            print(f"| {label} | {disk:,.0f} MB | {records:,} | {mb:,.0f} MB | {name} | {w:.2f} s "
                  f"| {records / w:,.0f} | {mb / w:,.0f} | {rss:,.1f} MiB |")
    print()
    for label, *_, ow, bw, _, _, flags in rows:
        print(f"{label}: bgpkit / edgeform wall = {bw / ow:.1f}×; flags: {flags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
