#!/usr/bin/env python3
"""What a full write of the manifest costs redis-server, by layout.

One real redis-server on loopback; each payload sent with `redis-cli --pipe` after FLUSHALL,
the server's CPU (user + system, /proc) measured around it; medians of --runs, all layouts
in the same run:
  - documents: MSET of --keys keys with 456-byte values, 500 a command (the reference);
  - format 2: the manifest as 256 hashes, one HSET per bucket (key -> 40-hex SHA-1);
  - format 3: the manifest as 256 strings, one SET per bucket (sorted `key NUL 40-hex`
    records, edgestate::manifest), what apply writes now.
Keys are bucketed as edgestate::keys::bucket does (top byte of the 32-bit FNV-1a).
Also prints the bytes a one-site change rewrites in format 3 (one bucket's string) at
--keys and ten times as many (177,000 keys: bench/push.py's 100k sites; 1.77M: 1M sites).
Usage: python3 bench/manifest_cost.py [--keys 177000] [--runs 3]
"""

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from push import Redis  # noqa: E402


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def bucket(key: bytes) -> int:
    h = 0x811C9DC5
    for c in key:
        h ^= c
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h >> 24


def keys_of(n: int):
    return [f"site:s{i:07d}.example.com".encode() for i in range(n)]


def payloads(keys):
    value = b"x" * 456
    hashes = {k: hashlib.sha1(k + value).hexdigest().encode() for k in keys}
    by_bucket = {}
    for k in sorted(keys):
        by_bucket.setdefault(bucket(k), []).append(k)
    docs = []
    for i in range(0, len(keys), 500):
        args = ["MSET"]
        for k in keys[i:i + 500]:
            args += [k, value]
        docs.append(resp(*args))
    fmt2, fmt3 = [], []
    for b, ks in sorted(by_bucket.items()):
        name = f"edgeform:manifest:{b:02x}"
        args = ["HSET", name]
        for k in ks:
            args += [k, hashes[k]]
        fmt2.append(resp(*args))
        fmt3.append(resp("SET", name, b"".join(k + b"\0" + hashes[k] for k in ks)))
    return {
        "documents (MSET, 456-byte values)": b"".join(docs),
        "format 2: 256 hashes, one HSET per bucket": b"".join(fmt2),
        "format 3: 256 strings, one SET per bucket": b"".join(fmt3),
    }


def bucket_bytes(n_keys: int) -> float:
    """Mean bytes of one bucket's string at n_keys managed keys (a key, NUL, 40 hex)."""
    key = len(f"site:s{0:07d}.example.com")
    return n_keys / 256 * (key + 1 + 40)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=177_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    data = payloads(keys_of(a.keys))
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="edgeform-manifest-cost-"))
    server = Redis(work)
    cpu = {name: [] for name in data}
    try:
        for _ in range(a.runs):
            for name, payload in data.items():
                server.cli("FLUSHALL")
                before = server.cpu()
                r = subprocess.run(["redis-cli", "-p", str(server.port), "--pipe"], input=payload,
                                   capture_output=True)
                if r.returncode != 0 or b"errors: 0" not in r.stdout:
                    raise SystemExit(f"{name}: redis-cli --pipe failed: {r.stdout!r}")
                cpu[name].append(server.cpu() - before)
        version = server.cli("INFO", "server").split("redis_version:")[1].split()[0]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = {name: statistics.median(v) for name, v in cpu.items()}
    names = list(data)
    print(f"\nredis-server {version}, {a.keys} managed keys, one server, `redis-cli --pipe`; "
          f"medians of {a.runs}; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n")
    print("| payload | MB | server CPU (median) | runs |\n|---|---:|---:|---|")
    for name in names:
        print(f"| {name} | {len(data[name]) / 1e6:.1f} | {med[name]:.3f} s | "
              f"{', '.join(f'{x:.3f}' for x in cpu[name])} |")
    f2, f3, docs = med[names[1]], med[names[2]], med[names[0]]
    print(f"| format 3 / format 2 | | **{f3 / f2:.3f}** | |")
    print(f"| format 2 / documents | | {f2 / docs:.2f} | |")
    print(f"| format 3 / documents | | {f3 / docs:.3f} | |")
    for n in (a.keys, 10 * a.keys):
        print(f"\nA one-site change rewrites one bucket's string: ~{bucket_bytes(n) / 1e3:.0f} KB "
              f"at {n:,} managed keys ({n / 256:,.0f} records of {len(keys_of(1)[0]) + 41} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
