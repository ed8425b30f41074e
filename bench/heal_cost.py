#!/usr/bin/env python3
"""Where a no-op heal's time goes inside Redis, counted in instructions.

Wall time and CPU time are useless on a shared 2-core machine; callgrind's instruction
counts are the same whatever else runs. Steps: one redis-server, the scale repository
(bench/scale.py's, .bench/scale, 10,000 sites, ~17,900 managed keys) applied to it, saved to
an RDB; a second redis-server loads that RDB under `valgrind --tool=callgrind`; each script
below runs once there and the server's instructions for it are read (callgrind_control -z,
run, callgrind_control -d). Scripts:
  - heal's COMPARE (taken from control/src/heal.rs) over all 256 buckets;
  - fetch only: GET of each bucket's string, its keys parsed, MGET of them (what any
    comparison in Lua pays);
  - SHA-1 of one typical value, once per key (redis.sha1hex);
  - heal's document count (its second script, call after call to the end), with the tree's
    three prefixes and with two (before `tls:*` was counted).
Also the CPU time of the COMPARE script on the plain server (5 runs, median) to turn
instructions into seconds on this machine.

Usage: python3 bench/heal_cost.py [--bin target/release/edgeform]
"""

import argparse
import hashlib
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
from benchlib import cpu_seconds, free_port  # noqa: E402
from push import EDGEFORM, generate  # noqa: E402


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


FETCH = r"""
local call, fmt = redis.call, string.format
local n = 0
for b = 0, 255 do
  -- Format 3: the bucket is one string of `<key> NUL <40 hex>` records.
  local s, keys, at = call('GET', ARGV[1] .. fmt('%02x', b)) or '', {}, 1
  while at <= #s do
    local nul = string.find(s, '\0', at, true)
    keys[#keys + 1] = string.sub(s, at, nul - 1)
    at = nul + 41
  end
  for i = 1, #keys, 500 do
    n = n + #call('MGET', unpack(keys, i, math.min(i + 499, #keys)))
  end
end
return n
"""

SHA1 = r"""
local v, n = redis.call('GET', KEYS[1]), 0
for i = 1, tonumber(ARGV[1]) do n = n + #redis.sha1hex(v) end
return #v
"""

# Heal's document count as the tree runs it (control/src/heal.rs `COUNT`): one SCAN
# step per prefix a call, resumed by cursor until every prefix is done.
COUNT = (ROOT / "control" / "src" / "lua" / "heal_count.lua").read_text()
# Its COUNT per prefix: 8 keys per entry of heal's 512-entry budget, split between the
# prefixes (`count_documents`).
BUDGET = 512


def resp(*args) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def bucket(key: bytes) -> int:
    """edgestate::keys::bucket: the top byte of the key's 32-bit FNV-1a."""
    h = 0x811C9DC5
    for c in key:
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h >> 24


def layouts(port: int):
    """The documents on the server and two ways to write them with their manifest, as RESP in one
    MULTI/EXEC: format 1 (MSET + one manifest hash, 1,000 a command) and format 2 (MSET + the
    fields of each 2 MiB chunk's ~4,000 documents gathered per bucket hash)."""
    cli = lambda *a: subprocess.run(["redis-cli", "-p", str(port), "--raw", *a], capture_output=True).stdout
    keys = sorted(k for k in cli("--scan").split(b"\n") if k.startswith((b"site:", b"suspended:")))
    values = []
    for i in range(0, len(keys), 1000):
        values += cli("MGET", *keys[i:i + 1000]).split(b"\n")[:-1]
    hashes = [hashlib.sha1(v).hexdigest() for v in values]
    pairs = lambda a, b: [x for ab in zip(a, b) for x in ab]
    f1, f2 = [resp("MULTI")], [resp("MULTI")]
    for i in range(0, len(keys), 1000):
        f1 += [resp("MSET", *pairs(keys[i:i + 1000], values[i:i + 1000])),
               resp("HSET", "edgeform:manifest", *pairs(keys[i:i + 1000], hashes[i:i + 1000]))]
    for c in range(0, len(keys), 4000):
        for i in range(c, min(c + 4000, len(keys)), 1000):
            f2.append(resp("MSET", *pairs(keys[i:i + 1000], values[i:i + 1000])))
        by = {}
        for k, h in zip(keys[c:c + 4000], hashes[c:c + 4000]):
            by.setdefault(bucket(k), []).extend([k, h.encode()])
        f2 += [resp("HSET", f"edgeform:manifest:{b:02x}", *f) for b, f in sorted(by.items())]
    return b"".join(f1 + [resp("EXEC")]), b"".join(f2 + [resp("EXEC")]), len(keys)


class Server:
    def __init__(self, work: Path, valgrind: bool, name: str, rdb: Path | None = None):
        self.port = free_port()
        self.dir = work / name
        self.dir.mkdir()
        if rdb:
            shutil.copy(rdb, self.dir / "dump.rdb")
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.dir)]
        if valgrind:
            args = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dir}/cg.out"] + args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(1200):
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.1)
        raise SystemExit("redis-server did not start")

    def cli(self, *args) -> str:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True).stdout

    def eval(self, text: str, keys=(), args=()) -> str:
        f = self.dir / "s.lua"
        f.write_text(text)
        return self.cli("--eval", str(f), *keys, ",", *args)

    def instructions(self, text: str, keys=(), args=()) -> int:
        return self.measured(lambda: self.eval(text, keys, args))

    def count_instructions(self, prefixes: list[str]) -> tuple[int, int]:
        """Instructions of heal's document count over `prefixes`, call after call to the
        end, and the number of calls."""
        calls = 0

        def run():
            nonlocal calls
            cursors = ["0"] * len(prefixes)
            while True:
                calls += 1
                out = self.eval(COUNT, (), [str(max(8 * BUDGET // len(prefixes), 1)), *cursors,
                                            *(f"{p}*" for p in prefixes)])
                # redis-cli, not on a terminal: one value a line.
                values = out.split()
                if len(values) != len(prefixes) + 1:
                    raise SystemExit(f"the count script answered {out!r}")
                cursors = values[:len(prefixes)]
                if all(c == "done" for c in cursors):
                    return

        return self.measured(run), calls

    def measured(self, run) -> int:
        """The server's instructions while `run()` runs."""
        subprocess.run(["callgrind_control", "-z", str(self.proc.pid)], capture_output=True, check=True)
        run()
        for old in self.dir.glob("cg.out.*"):
            old.unlink()
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], capture_output=True, check=True)
        dump = max(self.dir.glob("cg.out.*"), key=lambda p: p.stat().st_mtime)
        m = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M)
        return int(m.group(1))

    def pipe_instructions(self, payload: bytes) -> int:
        self.cli("FLUSHALL")
        subprocess.run(["callgrind_control", "-z", str(self.proc.pid)], capture_output=True, check=True)
        subprocess.run(["redis-cli", "-p", str(self.port), "--pipe"], input=payload, capture_output=True, check=True)
        for old in self.dir.glob("cg.out.*"):
            old.unlink()
        subprocess.run(["callgrind_control", "-d", str(self.proc.pid)], capture_output=True, check=True)
        dump = max(self.dir.glob("cg.out.*"), key=lambda p: p.stat().st_mtime)
        return int(re.search(r"^(?:summary|totals): (\d+)", dump.read_text(), re.M).group(1))

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", type=Path, default=EDGEFORM)
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench" / "scale")
    a = ap.parse_args()
    generate(a.dir, 10_000)
    source = heal_source()
    work = Path(tempfile.mkdtemp(prefix="edgeform-heal-cost-"))
    servers = []
    try:
        plain = Server(work, False, "plain")
        servers.append(plain)
        repo = work / "repo"
        shutil.copytree(a.dir, repo, ignore=shutil.ignore_patterns("nodes"))
        (repo / "nodes").mkdir()
        (repo / "nodes" / "edge-1.yaml").write_text(
            "name: edge-1\nroles: [edge]\nregion: eu\nlocation: {lat: 52.1, lon: 4.1}\n"
            f"addresses: [198.51.100.2]\nredis: {{url: \"redis://127.0.0.1:{plain.port}\"}}\n")
        subprocess.run([str(a.bin), "--repo", str(repo), "apply", "--yes"],
                       capture_output=True, check=False)
        managed = int(plain.cli("HGET", "edgeform:meta", "managed").strip() or 0)
        if managed == 0:
            raise SystemExit("the apply wrote nothing (see `edgeform apply` in the repo copy)")
        plain.cli("SAVE")
        vg = Server(work, True, "vg", plain.dir / "dump.rdb")
        servers.append(vg)
        # The tree's COMPARE: a budget above the manifest's size covers all 256 buckets in
        # one call.
        heal_args = ["edgeform:manifest:", "edgeform:manifest:buckets", str(10**9), "0", "0",
                     "0" * 32, "0", "256"]
        value_key = plain.cli("--scan", "--pattern", "site:*").split()[0]
        size = int(plain.cli("STRLEN", value_key).strip())
        rows = [
            ("heal's COMPARE, all 256 buckets in one call (GETRANGE windows, MGET per chunk)",
             vg.instructions(script(source, "COMPARE"), (), heal_args)),
        ]
        rows += [
            ("fetch only: GET of each bucket's string + MGET of its keys",
             vg.instructions(FETCH, (), ["edgeform:manifest:"])),
            (f"redis.sha1hex of one {size}-byte value, once per key",
             vg.instructions(SHA1, [value_key], [str(managed)])),
        ]
        for label, prefixes in (("this tree: `site:`, `suspended:`, `tls:`", ["site:", "suspended:", "tls:"]),
                                ("two prefixes, `site:` and `suspended:`", ["site:", "suspended:"])):
            n, calls = vg.count_instructions(prefixes)
            rows.append((f"heal's document count, {label} ({calls} calls)", n))
        cpu = []
        for _ in range(5):
            c0 = cpu_seconds(plain.proc.pid)
            plain.eval(script(source, "COMPARE"), (), heal_args)
            cpu.append(cpu_seconds(plain.proc.pid) - c0)
        cpu_ms = statistics.median(cpu) * 1000
        rate = rows[0][1] / (cpu_ms / 1000)
        print(f"\none edge, {managed} managed keys (bench/scale.py's 10,000 sites); instructions of the "
              f"redis-server (callgrind); COMPARE's CPU time on a plain server: {cpu_ms:.0f} ms "
              f"(median of 5, {rate / 1e9:.1f} G instructions/s)\n")
        print("| script | instructions | per key | × 300 edges, CPU s at that rate |\n|---|---:|---:|---:|")
        for name, n in rows:
            print(f"| {name} | {n / 1e6:.0f} M | {n / managed / 1000:.1f} k | {300 * n / rate:.1f} |")
        # The full apply's server-side cost of the two manifest layouts (the same documents).
        f1, f2, docs = layouts(plain.port)
        one, two = vg.pipe_instructions(f1), vg.pipe_instructions(f2)
        print(f"\nfull apply, server side, {docs} documents in one MULTI/EXEC: format 1 (one manifest hash) "
              f"{one / 1e6:.0f} M instructions, format 2 (256 bucket hashes) {two / 1e6:.0f} M ({two / one:.2f}x)")
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
