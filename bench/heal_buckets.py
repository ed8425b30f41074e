#!/usr/bin/env python3
"""How long one call of heal's server-side comparison blocks Redis at 1M sites.

At 1,000,000 sites one edge holds ~1.79M managed keys (1.79 a site, as in bench/scale.py's
repo), so each of the 256 manifest buckets (`edgeform:manifest:<bb>`) holds ~7,000 entries.
Before, a COMPARE call covered at least one whole bucket; now it covers at most a budget of
entries (`PER_CALL` in control/src/heal.rs), splitting a big bucket across calls (format 3:
at a record's byte offset in the bucket's string, read with GETRANGE).

The script fills ONE redis-server with a synthetic edge of that size, written as format 3
writes it (documents, 256 manifest bucket strings of sorted `key NUL sha1-hex` records, the
per-bucket digests in `edgeform:manifest:buckets`) and, for --old-rev's script, the same
manifest as format 2's bucket hashes under `edgeform:manifest2:` (the prefix is the script's
ARGV), then runs each comparison over the whole manifest, driven as control/src/heal.rs
drives it:
  - before: COMPARE from --old-rev (one bucket per call, what `buckets_per_call` gave at this
    size), over the hashes;
  - after: COMPARE from this tree, with each budget of --per-call (the Rust loop: bucket, byte
    offset and the bucket's running digest carried from call to call), over the strings.
Per call it takes the server's own duration (SLOWLOG, µs, threshold 0) and the client's round
trip; it prints the slowest, the 99th percentile and the median call, the totals, and the
redis-server's CPU time over the run (/proc; on a loaded machine wall times include the time
the server waits for a core, CPU time much less so), and checks each run found a healthy
target (no bad bucket, the whole digest right, no drift).

With --callgrind instead: a redis-server under `valgrind --tool=callgrind` holding only bucket
00 of that edge (full size, ~7,000 entries), and the instructions it spends per call of each
comparison over that bucket — the same whatever else runs on the machine.

Usage: python3 bench/heal_buckets.py [--sites 1000000] [--per-call 250,500,1000]
                                     [--old-rev e98c705] [--runs 1] [--callgrind]
"""

import argparse
import hashlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import cpu_seconds, free_port, wait_port  # noqa: E402

PREFIX, INDEX = "edgeform:manifest:", "edgeform:manifest:buckets"
# Format 2's bucket hashes, for --old-rev's script only.
PREFIX2 = "edgeform:manifest2:"


def heal_source(rev: str | None = None) -> str:
    """heal.rs of the working tree (rev None) or of a revision: control/src/heal.rs,
    or compiler/src/push/heal.rs before the control crate existed."""
    for path in ("control/src/heal.rs", "compiler/src/push/heal.rs"):
        if rev is None:
            if (ROOT / path).exists():
                return (ROOT / path).read_text()
            continue
        out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
        if out.returncode == 0:
            return f"// rev {rev}\n" + out.stdout
    raise SystemExit(f"no heal.rs at {rev or 'the working tree'}")


def script(source: str, name: str) -> str:
    """A Redis script of heal.rs: an inline `r"..."` string, or the Lua file it
    includes (control/src/lua/, read from the same revision as `source`)."""
    m = re.search(rf'const {name}: &str = r"\n(.*?)\n";', source, re.S)
    if m:
        return m.group(1)
    m = re.search(rf'const {name}: &str = include_str!\("([^"]+)"\);', source)
    if not m:
        raise SystemExit(f"no {name} script in heal.rs")
    rev = re.match(r"// rev (\S+)\n", source)
    path = f"control/src/{m.group(1)}"
    if rev:
        return subprocess.run(["git", "show", f"{rev.group(1)}:{path}"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    return (ROOT / path).read_text()


def per_call_default(source: str) -> int:
    return int(re.search(r"const PER_CALL: usize = (\d+);", source).group(1))


class Redis:
    """A minimal RESP2 client (no Python redis package here)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.f = self.sock.makefile("rb")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self.read()

    def read(self):
        line = self.f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)[:-2]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"bad reply {line!r}")


def bucket(key: bytes) -> int:
    """edgestate::keys::bucket: the top byte of the key's 32-bit FNV-1a."""
    h = 0x811C9DC5
    for c in key:
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h >> 24


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def fill(port: int, keys: int, only: int | None = None) -> tuple[int, list[int]]:
    """Write `keys` documents (456-byte values) and their manifest (format 3's strings, and
    format 2's hashes under PREFIX2); return the whole manifest's digest (XOR of the entries'
    SHA-1(key ‖ 0 ‖ hash) first 128 bits) and each bucket's entry count. `only`: write just the
    keys of that bucket (the others stay empty)."""
    pipe = subprocess.Popen(["redis-cli", "-p", str(port), "--pipe"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    digests, counts = [0] * 256, [0] * 256
    fields: dict[int, list[bytes]] = {}
    # Keys come in increasing order: each bucket's records are sorted as written.
    strings: dict[int, list[bytes]] = {}
    pad = b"x" * 400
    batch = []
    for i in range(keys):
        k = b"site:h%07d.example.com" % i
        v = (b'{"host":"h%07d.example.com","origin":"http://192.0.2.1","p":"' % i + pad)[:454] + b'"}'
        h = hashlib.sha1(v).hexdigest().encode()
        b = bucket(k)
        if only is not None and b != only:
            continue
        digests[b] ^= int.from_bytes(hashlib.sha1(k + b"\0" + h).digest()[:16], "big")
        counts[b] += 1
        batch += [k, v]
        fields.setdefault(b, []).extend([k, h])
        strings.setdefault(b, []).append(k + b"\0" + h)
        if len(batch) >= 2000:
            pipe.stdin.write(resp(b"MSET", *batch))
            batch = []
        if len(fields.get(b, ())) >= 2000:
            pipe.stdin.write(resp(b"HSET", (PREFIX2 + f"{b:02x}").encode(), *fields.pop(b)))
    if batch:
        pipe.stdin.write(resp(b"MSET", *batch))
    for b, f in fields.items():
        pipe.stdin.write(resp(b"HSET", (PREFIX2 + f"{b:02x}").encode(), *f))
    for b, records in strings.items():
        pipe.stdin.write(resp(b"SET", (PREFIX + f"{b:02x}").encode(), b"".join(records)))
    index = []
    for b in range(256):
        index += [f"{b:02x}".encode(), f"{digests[b]:032x} {counts[b]}".encode()]
    pipe.stdin.write(resp(b"HSET", INDEX.encode(), *index))
    pipe.stdin.close()
    if pipe.wait() != 0:
        raise SystemExit("redis-cli --pipe failed")
    whole = 0
    for d in digests:
        whole ^= d
    return whole, counts


def slowlog(r: Redis) -> list[int]:
    """The server-side durations (µs) of the EVALSHA calls since the last reset."""
    return [e[2] for e in r.call("SLOWLOG", "GET", "-1") if e[3][0].upper() == b"EVALSHA"]


def before(r: Redis, sha: str) -> tuple[list[float], int, int]:
    """The old driver: one bucket per call. Client round trips (s), digest, entries."""
    trips, whole, n = [], 0, 0
    for b in range(256):
        t = time.perf_counter()
        missing, changed, bad, digest, count = r.call("EVALSHA", sha, 0, b, b, PREFIX2, INDEX)
        trips.append(time.perf_counter() - t)
        assert not (missing or changed or bad), (b, missing, changed, bad)
        whole ^= int(digest, 16)
        n += count
    return trips, whole, n


def after(r: Redis, sha: str, budget: int) -> tuple[list[float], int, int, int]:
    """heal.rs's driver: resume (bucket, byte offset, running digest, count) call to call. Client
    round trips (s), digest, entries, the most entries one call covered."""
    trips, whole, n, largest = [], 0, 0, 0
    b, offset, carry, carried = 0, 0, "0" * 32, 0
    while b < 256:
        t = time.perf_counter()
        reply = r.call("EVALSHA", sha, 0, PREFIX, INDEX, budget, b, offset, carry, carried, 256)
        trips.append(time.perf_counter() - t)
        missing, changed, bad, digest, count, b, offset, running, carried, done = reply
        assert not (missing or changed or bad), (b, missing, changed, bad)
        whole ^= int(digest, 16)
        n += count
        carry = running.decode()
        largest = max(largest, done)
    return trips, whole, n, largest


def instructions(pid: int, work: Path, run) -> int:
    """The instructions a callgrind'ed redis-server (`pid`) spends while `run()` runs."""
    subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
    run()
    for old in work.glob("cg.out.*"):
        old.unlink()
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    dump = max(work.glob("cg.out.*"), key=lambda p: p.stat().st_mtime)
    return int(re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M).group(1))


def callgrind(keys: int, old: str, new: str, budgets: list[int]) -> None:
    """Instructions per call, load-independent: a redis-server under callgrind holding only
    bucket 00 of the synthetic edge (full size), each comparison over that bucket."""
    work = Path(tempfile.mkdtemp(prefix="edgeform-heal-buckets-cg-"))
    port = free_port()
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/cg.out",
                             "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(work)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 120)
        time.sleep(1)
        _, counts = fill(port, keys, only=0)
        r = Redis(port)
        size = counts[0]
        print(f"\ncallgrind: bucket 00 alone, {size} entries (redis-server instructions)\n")
        print("| comparison | calls | instructions per call (mean) | per entry |\n|---|---:|---:|---:|")
        sha = r.call("SCRIPT", "LOAD", old).decode()
        n = instructions(proc.pid, work, lambda: r.call("EVALSHA", sha, 0, 0, 0, PREFIX2, INDEX))
        print(f"| before: the whole bucket in one call | 1 | {n / 1e6:.1f} M | {n / size / 1000:.1f} k |")
        sha = r.call("SCRIPT", "LOAD", new).decode()
        for budget in budgets:
            calls = []

            def walk():
                b, offset, carry, carried = 0, 0, "0" * 32, 0
                while b == 0:
                    reply = r.call("EVALSHA", sha, 0, PREFIX, INDEX, budget, b, offset, carry, carried, 256)
                    assert not reply[2], reply[2]
                    b, offset, carry, carried = reply[5], reply[6], reply[7].decode(), reply[8]
                    calls.append(reply[9])
            n = instructions(proc.pid, work, walk)
            print(f"| after: budget {budget} | {len(calls)} | {n / len(calls) / 1e6:.1f} M "
                  f"| {n / size / 1000:.1f} k |", flush=True)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", type=int, default=1_000_000)
    ap.add_argument("--keys-per-site", type=float, default=1.79)
    ap.add_argument("--per-call", default=None, help="budgets to run, comma-separated (default: PER_CALL)")
    ap.add_argument("--old-rev", default="e98c705", help="a revision whose COMPARE covers whole buckets")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--callgrind", action="store_true",
                    help="instead: instructions per call on one full-size bucket under callgrind")
    a = ap.parse_args()
    source = heal_source()
    old = heal_source(a.old_rev)
    budgets = [int(x) for x in (a.per_call or str(per_call_default(source))).split(",")]
    keys = int(a.sites * a.keys_per_site)
    if a.callgrind:
        callgrind(keys, script(old, "COMPARE"), script(source, "COMPARE"), budgets)
        return 0
    work = Path(tempfile.mkdtemp(prefix="edgeform-heal-buckets-"))
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(work), "--slowlog-log-slower-than", "0",
                             "--slowlog-max-len", "1000000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 30)
        time.sleep(0.2)
        t = time.time()
        whole, sizes = fill(port, keys)
        r = Redis(port)
        big = r.call("STRLEN", PREFIX + f"{sizes.index(max(sizes)):02x}")
        print(f"{a.sites:,} sites: {keys:,} managed keys in one redis-server, written in {time.time() - t:.0f} s; "
              f"bucket entries min {min(sizes)}, median {int(statistics.median(sizes))}, max {max(sizes)} "
              f"(a string of {big:,} bytes); load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
        runs = [(f"before ({a.old_rev}): ≥ 1 whole bucket a call", script(old, "COMPARE"), None)]
        runs += [(f"after: GETRANGE, budget {n} entries a call", script(source, "COMPARE"), n) for n in budgets]
        print("| comparison | calls | entries/call max | slowest call, server | p99 call, server "
              "| median call, server | all calls, server | all calls, round trips "
              "| server CPU, all calls | server CPU per call (mean) | load avg |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, text, budget in runs:
            sha = r.call("SCRIPT", "LOAD", text).decode()
            for _ in range(a.runs):
                r.call("SLOWLOG", "RESET")
                cpu = cpu_seconds(proc.pid)
                if budget is None:
                    trips, digest, n = before(r, sha)
                    largest = max(sizes)
                else:
                    trips, digest, n, largest = after(r, sha, budget)
                cpu = cpu_seconds(proc.pid) - cpu
                server = slowlog(r)
                p99 = sorted(server)[int(0.99 * (len(server) - 1))]
                assert digest == whole and n == keys, (name, digest, whole, n, keys)
                assert len(server) == len(trips), (len(server), len(trips))
                print(f"| {name} | {len(trips)} | {largest} | {max(server) / 1000:.1f} ms "
                      f"| {p99 / 1000:.1f} ms | {statistics.median(server) / 1000:.1f} ms "
                      f"| {sum(server) / 1e6:.2f} s | {sum(trips):.2f} s | {cpu:.2f} s "
                      f"| {cpu / len(trips) * 1000:.2f} ms | {os.getloadavg()[0]:.1f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
