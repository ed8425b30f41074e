#!/usr/bin/env python3
"""Benchmark the pusher at scale: N edges, each its own redis-server on loopback.

For each N in --edges (default 30, 100, 300) and each binary given (--bin, repeatable:
e.g. main's build as "before" and this tree's as "after"), prints one table:
  - `edgeform check` (the reference);
  - a full `apply` to N empty edges;
  - a no-op `plan`;
  - a no-op `reconcile --once sync`;
  - a no-op `reconcile --once heal`, with the bytes read per target and the slowest
    server-side call when the binary logs them;
  - a one-site change `apply` to the N edges.
Medians of --runs rounds (the full apply: --full-runs). The repository is generated once
(bench/gen_repo.py, --sites sites, region eu) under .bench/scale.

With --daemon SECONDS (at the N in --daemon-at, default 300): the reconcile daemon itself runs
for SECONDS with its periods shortened --speedup times (heal every 300/speedup s, sync every
900/speedup s; the periodic full comparison stays one heal in --full-heal-every, a count). Printed: the tracked heal's
duration (median and max of the runs after the first, from the daemon's `reconcile: run done`
lines), how many of them compared everything, and the daemon's CPU (utime + stime from /proc)
over the window divided by --speedup: its average share of a core at the real periods.

Usage: python3 bench/scale.py [--edges 30 100] [--sites 10000] [--runs 3]
                              [--bin before=/tmp/edgeform-main --bin after=target/release/edgeform]
"""

import argparse
import json
import os
import re
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
from push import Redis, generate  # noqa: E402
from pipe_ref import cli, resp  # noqa: E402
from benchlib import cpu_seconds  # noqa: E402

EDGEFORM = ROOT / "target" / "release" / "edgeform"
PARALLEL = 16  # edgeform's --parallel default: targets worked on at once
ALL_EDGES, BUSIEST = "heal: all edges' Redis CPU", "heal: busiest edge's Redis CPU"


def write_nodes(repo: Path, servers):
    """One edge per server (push.py's addresses stop at 255 edges)."""
    for f in (repo / "nodes").glob("*.yaml"):
        f.unlink()
    for i, r in enumerate(servers, 1):
        (repo / "nodes" / f"edge-{i}.yaml").write_text(
            f"name: edge-{i}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.{i}, lon: 4.{i}}}\n"
            f"addresses: [198.51.{100 + i // 250}.{1 + i % 250}]\nredis: {{url: \"redis://127.0.0.1:{r.port}\"}}\n")


CHILD_CPU = []  # CPU seconds (user + sys) of each run's process, in order


def run(args, ok=(0,)):
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CHILD_CPU.append(c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime)
    if r.returncode not in ok:
        raise SystemExit(f"{' '.join(map(str, args))} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return dt, r


def measure(binary: Path, repo: Path, servers, runs: int, full_runs: int):
    ef = [str(binary), "--repo", str(repo)]
    out = {}
    run(ef + ["check"])  # warm-up
    out["check"] = [run(ef + ["check"])[0] for _ in range(runs)]
    full = []
    for _ in range(full_runs):
        for s in servers:
            s.cli("FLUSHALL")
        full.append(run(ef + ["apply", "--yes"])[0])
    out["full apply"] = full
    out["no-op plan"] = [run(ef + ["plan", "--detailed-exitcode"])[0] for _ in range(runs)]
    out["no-op sync"] = [run(ef + ["reconcile", "--once", "sync"])[0] for _ in range(runs)]
    sync_cpu = statistics.median(CHILD_CPU[-runs:])
    heal, per_target, slowest = [], [], []
    # The server-side time of each script call, on one server: its slowlog
    # with every command logged.
    probe = servers[0]
    probe.cli("CONFIG", "SET", "slowlog-log-slower-than", "0")
    probe.cli("CONFIG", "SET", "slowlog-max-len", "100000")
    probe.cli("SLOWLOG", "RESET")
    edges_cpu, busiest = [], []
    for _ in range(runs):
        before = [s.cpu() for s in servers]
        dt, r = run(ef + ["reconcile", "--once", "heal"])
        spent = [s.cpu() - b for s, b in zip(servers, before)]
        edges_cpu.append(sum(spent))
        busiest.append(max(spent))
        heal.append(dt)
        if "heal: no drift" not in r.stderr or "drift repaired" in r.stderr:
            raise SystemExit(f"the no-op heal found drift:\n{r.stderr[-2000:]}")
        per_target += [int(b) for b in re.findall(r"\bbytes=(\d+)", r.stderr)]
    log = json.loads(probe.cli("--json", "SLOWLOG", "GET", "100000") or "[]")
    slowest = [e[2] / 1000 for e in log if e[3] and str(e[3][0]).lower() == "evalsha"]
    probe.cli("CONFIG", "SET", "slowlog-log-slower-than", "10000")
    probe.cli("SLOWLOG", "RESET")
    out["no-op heal"] = heal
    heal_cpu = statistics.median(CHILD_CPU[-runs:])
    # Where the one-shot heal's time goes: it hashes every value inside each
    # edge's Redis, and here all N servers share this machine's cores.
    out["heal: edgeform CPU"] = CHILD_CPU[-runs:]
    out[ALL_EDGES] = edges_cpu
    out[BUSIEST] = busiest
    # The same heal of one edge alone (the machine's cores to itself): what one
    # wave of --parallel targets costs when each edge has its own CPU.
    out["heal: one edge alone"] = [run(ef + ["reconcile", "--once", "heal", "--node", "edge-1"])[0]
                                   for _ in range(runs)]
    # The reconcile daemon does these runs: a heal every 5 min, a sync every 15 min;
    # its average CPU (control host only, a no-op cluster) is about this share of a core.
    out["daemon CPU %"] = [100 * (heal_cpu / 300 + sync_cpu / 900)]
    site = sorted((repo / "sites").glob("*.yaml"))[0]
    original = site.read_text()
    one = []
    before = contents(servers[0].port)
    try:
        for i in range(runs):
            text = re.sub(r"^origin: .*$", f"origin: http://192.0.2.{10 + i}", original, count=1, flags=re.M)
            site.write_text(text)
            dt, r = run(ef + ["apply", "--yes"])
            # One site file: its document (and any alias's), maybe the routing table.
            if not re.search(r"\(\+0 ~[1-5] -0\)", r.stdout):
                raise SystemExit(f"not a one-site change:\n{r.stdout[-2000:]}")
            one.append(dt)
            if i == 0:
                after = contents(servers[0].port)
                writes = writes_between(before, after)
    finally:
        site.write_text(original)
    run(ef + ["apply", "--yes"])
    out["one-site change apply"] = one
    # The reference: the first change's writes, sent again by redis-cli to every server at once
    # (the values written are the same ones; the servers end where the apply left them, and the
    # apply just after puts the original back).
    pipe, ping = cli_reference(servers, writes, runs, Path(tempfile.mkdtemp(prefix="edgeform-scale-ref-")))
    out["redis-cli writes"] = pipe
    out["redis-cli ping"] = ping
    out["writes bytes"] = [len(writes)]
    run(ef + ["apply", "--yes"])
    return out, per_target, slowest


def contents(port: int) -> dict:
    """Every key on the server: (type, value) for strings, hashes (flat list) and lists."""
    keys = [k for k in cli(port, "--scan").split(b"\n") if k]
    out = {}
    strings = []
    for k in keys:
        t = b"string" if k.startswith((b"site:", b"suspended:")) else cli(port, "TYPE", k).strip()
        if t == b"string":
            strings.append(k)
        elif t == b"hash":
            out[k] = ("hash", cli(port, "HGETALL", k).split(b"\n")[:-1])
        elif t == b"list":
            out[k] = ("list", cli(port, "LRANGE", k, "0", "-1").split(b"\n")[:-1])
    for i in range(0, len(strings), 1000):
        batch = strings[i:i + 1000]
        values = cli(port, "MGET", *batch).split(b"\n")[:-1]
        if len(values) != len(batch):
            raise SystemExit("a value spans lines; cannot read it back with --raw")
        out.update((k, ("string", v)) for k, v in zip(batch, values))
    return out


def writes_between(before: dict, after: dict) -> bytes:
    """The RESP writes that take `before` to `after`: SET a changed string, HSET a hash's
    changed fields, LPUSH + LTRIM a list's new head (the history), DEL what went."""
    out = []
    for k in sorted(after):
        kind, v = after[k]
        was = before.get(k)
        if was == (kind, v):
            continue
        if kind == "string":
            out.append(resp("SET", k, v))
        elif kind == "hash":
            old = dict(zip(was[1][::2], was[1][1::2])) if was and was[0] == "hash" else {}
            new = dict(zip(v[::2], v[1::2]))
            changed = [x for f, val in new.items() if old.get(f) != val for x in (f, val)]
            if changed:
                out.append(resp("HSET", k, *changed))
            gone = [f for f in old if f not in new]
            if gone:
                out.append(resp("HDEL", k, *gone))
        else:
            old = was[1] if was and was[0] == "list" else []
            fresh = next((i for i in range(len(v) + 1) if v[i:] == old[:len(v) - i]), len(v))
            out.append(resp("LPUSH", k, *reversed(v[:fresh])) + resp("LTRIM", k, "0", str(len(v) - 1)))
    out += [resp("DEL", k) for k in sorted(before) if k not in after]
    return b"".join(out)


def all_at_once(commands) -> float:
    """Start every command at once, wait for all: the wall time."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, stdin=i, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for c, i in commands]
    bad = [p.args for p in procs if p.wait() != 0]
    dt = time.perf_counter() - t0
    if bad:
        raise SystemExit(f"{len(bad)} redis-cli runs failed, e.g. {bad[0]}")
    return dt


def cli_reference(servers, writes: bytes, runs: int, work: Path):
    """`redis-cli --pipe` of `writes` to every server at once, and N PINGs at once (the floor)."""
    path = work / "one-site-writes.resp"
    path.write_bytes(writes)
    pipe, ping = [], []
    for _ in range(runs):
        files = [open(path, "rb") for _ in servers]
        try:
            pipe.append(all_at_once([(["redis-cli", "-p", str(s.port), "--pipe"], f)
                                     for s, f in zip(servers, files)]))
        finally:
            for f in files:
                f.close()
        ping.append(all_at_once([(["redis-cli", "-p", str(s.port), "PING"], subprocess.DEVNULL)
                                 for s in servers]))
    return pipe, ping


def daemon(binary: Path, repo: Path, seconds: float, speedup: float, full_every=None):
    """The reconcile daemon for `seconds`, periods shortened `speedup` times (a no-op cluster)."""
    heal_every, sync_every = 300 / speedup, 900 / speedup
    log_path = Path(tempfile.mkstemp(prefix="edgeform-daemon-", suffix=".log")[1])
    with open(log_path, "w") as log:
        p = subprocess.Popen([str(binary), "--repo", str(repo), "reconcile",
                              "--heal-every", f"{heal_every:g}s", "--sync-every", f"{sync_every:g}s"]
                             + (["--full-heal-every", str(full_every)] if full_every else []),
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "NO_COLOR": "1"})

    def done(job, text=None):
        text = log_path.read_text() if text is None else text
        return [int(m) for m in re.findall(rf'run done job="?{job}"? exit=\d+ elapsed_ms=(\d+)', text)]

    try:
        # The start: a sync and a first (full) heal.
        deadline = time.time() + 600
        while not done("heal"):
            if p.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the daemon did not heal:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        first = len(done("heal"))
        start = len(log_path.read_text())
        c0, t0 = cpu_seconds(p.pid), time.time()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(p.pid), time.time()
        text = log_path.read_text()
    finally:
        p.terminate()
        p.wait()
    heals = done("heal", text)[first:]
    full = len(re.findall(r"compared=everything", text[start:]))
    if not heals:
        raise SystemExit(f"no heal in the window:\n{text[-3000:]}")
    cpu = c1 - c0
    return {
        "heals": len(heals),
        "heal median s": statistics.median(heals) / 1000,
        "heal max s": max(heals) / 1000,
        "targets compared everything": full,
        "cpu s": cpu,
        "window s": t1 - t0,
        "cpu % at real periods": 100 * cpu / (t1 - t0) / speedup,
        "drift": "drift repaired" in text,
        "log": str(log_path),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--edges", type=int, nargs="+", default=[30, 100, 300])
    ap.add_argument("--sites", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--full-runs", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=ROOT / ".bench" / "scale")
    ap.add_argument("--daemon", type=float, default=0, metavar="SECONDS",
                    help="also run the reconcile daemon this long (600: ten minutes)")
    ap.add_argument("--daemon-at", type=int, default=300, metavar="N")
    ap.add_argument("--speedup", type=float, default=10)
    ap.add_argument("--full-heal-every", type=int, default=None, metavar="N",
                    help="the daemon's --full-heal-every (default: the binary's, 288)")
    ap.add_argument("--only-daemon", action="store_true",
                    help="skip the --once table: apply once, then the daemon")
    ap.add_argument("--bin", action="append", default=[],
                    help="LABEL=PATH of an edgeform binary (repeatable); default: after=target/release/edgeform")
    a = ap.parse_args()
    # 1,000 edges: edgeform keeps a connection to each, and this script a pipe to each redis-cli.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    bins = [b.split("=", 1) for b in a.bin] or [["after", str(EDGEFORM)]]
    generate(a.dir, a.sites)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    rows, daemons = [], []
    for n in a.edges:
        work = Path(tempfile.mkdtemp(prefix="edgeform-scale-bench-"))
        servers = []
        try:
            servers = [Redis(work) for _ in range(n)]
            write_nodes(a.dir, servers)
            for label, path in bins:
                load = os.getloadavg()[0]
                if not a.only_daemon:
                    t, per_target, slowest = measure(Path(path), a.dir, servers, a.runs, a.full_runs)
                    rows.append((n, label, t, per_target, slowest, load))
                    print(f"N={n} {label}: " + ", ".join(f"{k} {statistics.median(v):.2f}" + ("" if k.endswith("%") else " s")
                                                   for k, v in t.items()),
                          file=sys.stderr)
                if a.daemon and n == a.daemon_at:
                    run([str(path), "--repo", str(a.dir), "apply", "--yes"])
                    d = daemon(Path(path), a.dir, a.daemon, a.speedup, a.full_heal_every)
                    daemons.append((n, label, d, os.getloadavg()[0]))
                    print(f"N={n} {label} daemon: {d}", file=sys.stderr)
                for s in servers:
                    s.cli("FLUSHALL")
        finally:
            for s in servers:
                s.stop()
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.sites} sites, one redis-server per edge on loopback; {os.cpu_count()} cores ({cpu}); "
          f"medians of {a.runs} runs ({a.full_runs} for the full apply), wall time of the whole process\n")
    print("| edges | binary | check | full apply | no-op plan | no-op sync | no-op heal | heal bytes/target "
          "| server-side heal call (one edge) | one-site apply | daemon CPU (est.) | load |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ref_rows = []
    for n, label, t, per_target, slowest, load in rows:
        m = {k: statistics.median(v) for k, v in t.items()}
        b = f"{statistics.median(per_target):.0f}" if per_target else "n/a (reads every value)"
        s = (f"{max(slowest):.2f} ms max, {statistics.median(slowest):.2f} ms median of {len(slowest)}"
             if slowest else "n/a")
        print(f"| {n} | {label} | {m['check']:.2f} s | {m['full apply']:.2f} s | {m['no-op plan']:.2f} s "
              f"| {m['no-op sync']:.2f} s | {m['no-op heal']:.2f} s | {b} | {s} "
              f"| {m['one-site change apply']:.2f} s | {m['daemon CPU %']:.2f} % | {load:.1f} |")
        ref_rows.append((n, label, m))
    print("\nThe fair reference for the no-op and one-site runs: check + the one-site apply's writes "
          "sent by `redis-cli --pipe` to the N servers at once (goal: one-site apply <= check + 1.5 x "
          "writes; no-op plan/sync <= check + writes); N `redis-cli PING`s at once is that "
          "reference's floor (process start-up)\n")
    print("| edges | binary | writes sent | redis-cli writes, N at once | N PINGs at once | one-site apply "
          "| check + 1.5 x writes | no-op plan | no-op sync | check + writes | goals |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, label, m in ref_rows:
        one_goal = m["check"] + 1.5 * m["redis-cli writes"]
        noop_goal = m["check"] + m["redis-cli writes"]
        ok = (m["one-site change apply"] <= one_goal, m["no-op plan"] <= noop_goal, m["no-op sync"] <= noop_goal)
        print(f"| {n} | {label} | {m['writes bytes']:.0f} B | {m['redis-cli writes']:.2f} s "
              f"| {m['redis-cli ping']:.2f} s | {m['one-site change apply']:.2f} s | {one_goal:.2f} s "
              f"| {m['no-op plan']:.2f} s | {m['no-op sync']:.2f} s | {noop_goal:.2f} s "
              f"| {' '.join('met' if x else 'missed' for x in ok)} |")
    print(f"\n`reconcile --once heal` (compares every value), where the time goes: the CPU "
          f"of edgeform and of the N edges' redis-servers during the heal, the heal of one edge "
          f"alone, and what N edges with a CPU each would take: check + ceil(N / {PARALLEL}) waves "
          f"(`--parallel` default) x (one edge alone - check)\n")
    print("| edges | binary | wall | edgeform CPU | all edges' Redis CPU | busiest edge's Redis CPU "
          "| one edge alone | modelled, one CPU per edge |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for n, label, t, _, _, _ in rows:
        m = {k: statistics.median(v) for k, v in t.items()}
        waves = -(-n // PARALLEL)
        model = m["check"] + waves * max(0.0, m["heal: one edge alone"] - m["check"])
        print(f"| {n} | {label} | {m['no-op heal']:.2f} s | {m['heal: edgeform CPU']:.2f} s "
              f"| {m[ALL_EDGES]:.2f} s | {m[BUSIEST]:.2f} s "
              f"| {m['heal: one edge alone']:.2f} s | {model:.2f} s |")
    if daemons:
        print(f"\nThe reconcile daemon for {a.daemon:g} s, periods {a.speedup:g}x shorter "
              f"(heal every {300 / a.speedup:g} s, sync every {900 / a.speedup:g} s, "
              f"--full-heal-every {a.full_heal_every or 'default'}), CPU scaled back:\n")
        print("| edges | binary | tracked heals | heal (median / max) | compared everything (targets) "
              "| daemon CPU over the window | CPU at 5/15 min periods | load |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for n, label, d, load in daemons:
            print(f"| {n} | {label} | {d['heals']} | {d['heal median s']:.2f} s / {d['heal max s']:.2f} s "
                  f"| {d['targets compared everything']} | {d['cpu s']:.1f} CPU-s in {d['window s']:.0f} s "
                  f"| {d['cpu % at real periods']:.2f} % | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
