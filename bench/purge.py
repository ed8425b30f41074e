#!/usr/bin/env python3
"""Purge to N agents: N redis-servers, one mosquitto, N edgeform-agents on loopback.

For each N in --edges (default 30 300): starts one redis-server per edge, one
mosquitto broker every agent connects to (health, status, commands: the
production shape), and one release `edgeform-agent` per edge on its own
Redis. Then:
  - the agents' idle RSS (VmRSS from /proc/<pid>/status) after --settle s,
    median and max, and again after the purges;
  - --runs times (after one warm-up): the object is put back into every edge's
    cache (nginx-format files, both schemes, made once by the `gen-cache`
    example and copied), then the wall time of
    `edgeform purge --site example.com --url /a.mp4 --wait 30`, process start
    to the last node's result; each run must report 2 × N files removed.
Prints p50/p90/p99/max per N.
Goal: p50 < 150 ms, p99 < 500 ms at N = 300; idle RSS < 15 MiB each.

Needs the release binaries (built here if missing):
    cargo build --release --locked -p edgeform -p agent --bins
    cargo build --release --locked -p agent --example gen-cache   # or a debug one (target/debug/examples)

Usage: python3 bench/purge.py [--edges 30 300] [--runs 50] [--settle 3] [--no-files]
                              [--bin LABEL=DIR ...] [--cpu] [--health-interval 60s] [--pause S]

--bin LABEL=DIR (repeatable; default `after=target/release`) runs the same N with the
`edgeform` and `edgeform-agent` in DIR, each set on its own fresh agents, one row each:
e.g. `--bin before=target/purge-before --bin after=target/release` for side-by-side figures.
Where the purge process's time went (its `purge phases` debug line, when the binary logs
one): enqueue done, first/median/last result, in ms since the targets were known (medians
over the runs); `rest` is wall − last result (process start, repository load, exit).
Also the fixed cost (`purge --site no-such.invalid`: start, load, exit 1, nothing sent) and,
with --cpu, the CPU per purge of edgeform, the redis-servers, the agents and the broker, and
what they use idle. --health-interval sets the agents' report interval (every agent hears
every report: N² messages per interval through the one broker).
"""

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import agent_env, cpu_seconds, free_port, wait_port  # noqa: E402
from push import Redis  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
EF = RELEASE / "edgeform"
AGENT = RELEASE / "edgeform-agent"
PHASES = ("enqueue_ms", "first_result_ms", "median_result_ms", "last_result_ms")
GEN = ROOT / "target" / "release" / "examples" / "gen-cache"
KEYS = ["http://example.com/a.mp4", "https://example.com/a.mp4"]
LEVELS = "1:2"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise SystemExit(f"no VmRSS for {pid}")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def mosquitto(work: Path):
    port = free_port()
    conf = work / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\n")
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return port, proc


def children_cpu() -> float:
    """CPU seconds of this script's reaped children (each `edgeform` run, once waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def ping_rtt_ms(port: int, n: int = 200) -> float:
    """Median round trip of a Redis PING on loopback (one connection, in turn): the floor's
    "one round trip"."""
    import socket
    with socket.create_connection(("127.0.0.1", port)) as s:
        rtts = []
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(b"PING\r\n")
            if s.recv(64) != b"+PONG\r\n":
                raise SystemExit("PING: unexpected answer")
            rtts.append((time.perf_counter() - t) * 1000)
    return statistics.median(rtts)


def group_cpu(pids) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


def bench(n: int, runs: int, settle: float, template: Path, per_edge: int, bins: Path,
          pause: float = 0.0, cpu: bool = False, health: str = ""):
    work = Path(tempfile.mkdtemp(prefix="edgeform-purge-bench-"))
    servers, agents, broker = [], [], None
    try:
        mport, broker = mosquitto(work)
        repo = work / "repo"
        (repo / "sites").mkdir(parents=True)
        (repo / "nodes").mkdir()
        (repo / "sites" / "example.com.yaml").write_text("host: example.com\norigin: http://192.0.2.1\n")
        caches = []
        for i in range(1, n + 1):
            r = Redis(work)
            servers.append(r)
            d = work / f"edge-{i}"
            (d / "cache").mkdir(parents=True)
            (repo / "nodes" / f"edge-{i}.yaml").write_text(
                f"name: edge-{i}\nroles: [edge]\nregion: eu\nlocation: {{lat: 52.{i}, lon: 4.{i}}}\n"
                f"redis: {{url: \"redis://127.0.0.1:{r.port}\"}}\n"
                f"cache: {{dirs: [{d / 'cache'}], levels: \"{LEVELS}\"}}\n")
            (d / "agent.yaml").write_text(
                f"node: edge-{i}\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{r.port}\"}}\n"
                f"cache: {{dirs: [{d / 'cache'}], levels: \"{LEVELS}\"}}\n"
                f"mqtt: {{url: \"mqtt://127.0.0.1:{mport}\"}}\n"
                + (f"health: {{interval: {health}}}\n" if health else ""))
            agents.append(subprocess.Popen([str(bins / "edgeform-agent"), "--config", str(d / "agent.yaml")],
                                           stdout=subprocess.DEVNULL, stderr=open(d / "agent.log", "w"),
                                           env=agent_env()))
            caches.append(d / "cache")
        time.sleep(settle)
        dead = [i + 1 for i, a in enumerate(agents) if a.poll() is not None]
        if dead:
            log = (work / f"edge-{dead[0]}" / "agent.log").read_text()[-2000:]
            raise SystemExit(f"agents exited: {dead[:10]}…\n{log}")
        idle = [rss_kib(a.pid) / 1024 for a in agents]
        times, phases, cpus = [], [], []
        groups = {"redis": [r.proc.pid for r in servers], "agents": [a.pid for a in agents],
                  "mosquitto": [broker.pid]}
        # The idle rate of each group (agents' BLMOVE loops, index refresh, health): CPU/s.
        idle_rate = {}
        if cpu:
            t0, c0 = time.perf_counter(), {k: group_cpu(v) for k, v in groups.items()}
            time.sleep(3.0)
            dt0 = time.perf_counter() - t0
            idle_rate = {k: (group_cpu(v) - c0[k]) / dt0 for k, v in groups.items()}
        rtt = ping_rtt_ms(servers[0].port)
        # The fixed cost: process start, repository load, exit — a site no one has (exit 1, nothing sent).
        fixed = []
        for _ in range(max(5, runs // 2)):
            t = time.perf_counter()
            r = subprocess.run([str(bins / "edgeform"), "--repo", str(repo), "purge", "--site", "no-such.invalid",
                                "--url", "/a.mp4"], capture_output=True, text=True)
            fixed.append((time.perf_counter() - t) * 1000)
            if r.returncode != 1 or "no site has the hostname" not in r.stderr:
                raise SystemExit(f"unexpected: {r.returncode} {r.stderr[-500:]}")
        ef = [str(bins / "edgeform"), "--repo", str(repo), "purge", "--site", "example.com", "--url", "/a.mp4", "--wait", "30"]
        for run in range(runs + 1):
            for c in caches:  # the object is cached on every edge again
                shutil.copytree(template, c, dirs_exist_ok=True)
            if pause:
                time.sleep(pause)
            before = {k: group_cpu(v) for k, v in groups.items()} if cpu else {}
            ef_cpu = children_cpu()
            t = time.perf_counter()
            r = subprocess.run(ef, capture_output=True, text=True,
                               env={**os.environ, "EDGEFORM_TIMING": "1",
                                    "EDGEFORM_LOG": "ops::purge=debug"})
            dt = time.perf_counter() - t
            if cpu and run > 0:
                used = {k: (group_cpu(v) - before[k]) * 1000 for k, v in groups.items()}
                used["edgeform"] = (children_cpu() - ef_cpu) * 1000
                used["idle"] = sum(idle_rate.values()) * dt * 1000
                used.update({f"idle_{k}": v * 1000 for k, v in idle_rate.items()})
                # This machine's floor for one purge: what the edges (their redis-servers and
                # agents) spend on it beyond their idle rate, spread over the cores, plus one
                # round trip.
                spent = (used["redis"] + used["agents"]
                         - (idle_rate["redis"] + idle_rate["agents"]) * dt * 1000)
                used["floor"] = max(0.0, spent) / (os.cpu_count() or 1) + rtt
                # The same with what else holds the cores: edgeform's own CPU, and the cores
                # the idle processes keep busy meanwhile.
                free = (os.cpu_count() or 1) - sum(idle_rate.values())
                used["busy_floor"] = (max(0.0, spent) + used["edgeform"]) / max(free, 0.1) + rtt
                cpus.append(used)
            if r.returncode != 0:
                raise SystemExit(f"purge exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            removed = sum(int(l.split(": ")[1].split()[0]) for l in r.stdout.splitlines() if "file(s) removed" in l)
            if removed != per_edge * n:
                raise SystemExit(f"expected {per_edge * n} files removed, got {removed}:\n{r.stdout[-2000:]}")
            if run > 0:  # the first run warms caches
                times.append(dt * 1000)
                got = {k: float(m.group(1)) for k in PHASES
                       if (m := re.search(rf"\b{k}=(-?[\d.]+)", r.stderr))}
                if len(got) == len(PHASES):
                    got["rest_ms"] = dt * 1000 - got["last_result_ms"]
                    phases.append(got)
        after = [rss_kib(a.pid) / 1024 for a in agents]
        return times, idle, after, phases, cpus, fixed
    finally:
        for a in agents:
            a.terminate()
        for a in agents:
            a.wait()
        for s in servers:
            s.stop()
        if broker:
            broker.terminate()
            broker.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--edges", type=int, nargs="+", default=[30, 300])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--no-files", action="store_true",
                    help="no cached object: each purge removes nothing (no gen-cache build needed)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after the last agent starts")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds between putting the cached object back and the purge (agents index it)")
    ap.add_argument("--health-interval", default="", metavar="DURATION",
                    help="the agents' health.interval (default: theirs, 5s). Every agent subscribes to every "
                         "agent's report: N²/interval messages a second through the one broker")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU per purge: edgeform, the redis-servers, the agents (/proc/<pid>/stat)")
    ap.add_argument("--bin", action="append", metavar="LABEL=DIR",
                    help="a set of binaries (edgeform, edgeform-agent) to run; default after=target/release")
    a = ap.parse_args()
    bins = []
    for b in a.bin or [f"after={RELEASE}"]:
        label, _, d = b.partition("=")
        d = Path(d).resolve()
        for exe in ("edgeform", "edgeform-agent"):
            if not (d / exe).exists() and d != RELEASE:
                raise SystemExit(f"--bin {b}: no {d / exe}")
        bins.append((label, d))
    if not (EF.exists() and AGENT.exists()) and any(d == RELEASE for _, d in bins):
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "edgeform", "-p", "agent", "--bins"],
                       cwd=ROOT, check=True)
    # Any profile's gen-cache writes the same files (a debug one from `cargo test` will do).
    gen = next((g for g in (GEN, ROOT / "target" / "debug" / "examples" / "gen-cache") if g.exists()), GEN)
    if not a.no_files and not gen.exists():
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "agent", "--example", "gen-cache"],
                       cwd=ROOT, check=True)
    tmp = Path(tempfile.mkdtemp(prefix="edgeform-purge-template-"))
    try:
        template = tmp / "cache"
        if a.no_files:
            template.mkdir()
        else:
            subprocess.run([str(gen), str(template), LEVELS, *KEYS], check=True, capture_output=True)
        rows = []
        for n in a.edges:
            for label, d in bins:
                load = os.getloadavg()[0]
                times, idle, after, phases, cpus, fixed = bench(n, a.runs, a.settle, template,
                                                                0 if a.no_files else len(KEYS), d,
                                                                a.pause, a.cpu, a.health_interval)
                rows.append((label, n, times, idle, after, phases, load, os.getloadavg()[0], cpus, fixed))
                print(f"{label} N={n}: p50 {statistics.median(times):.1f} ms, p99 {pct(times, 0.99):.1f} ms, "
                      f"idle RSS median {statistics.median(idle):.1f} MiB max {max(idle):.1f} MiB",
                      file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"\none redis-server per edge, one mosquitto, one edgeform-agent per edge, all on loopback; "
          f"{os.cpu_count()} cores ({cpu}); {a.runs} purges per N after one warm-up; wall time of "
          f"`edgeform purge --site example.com --url /a.mp4 --wait 30`, process start to the last node's result\n")
    files = "no cached object (--no-files)" if a.no_files else f"{len(KEYS)} cached files removed per edge"
    print(f"{files}; load = 1-min load average before / after the row\n")
    print("| binaries | agents | p50 | p90 | p99 | max | idle agent RSS median / max "
          "| RSS after the purges median / max | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, n, times, idle, after, _, load, load2, _, _ in rows:
        print(f"| {label} | {n} | {statistics.median(times):.1f} ms | {pct(times, 0.9):.1f} ms "
              f"| {pct(times, 0.99):.1f} ms | {max(times):.1f} ms | {statistics.median(idle):.1f} / "
              f"{max(idle):.1f} MiB | {statistics.median(after):.1f} / {max(after):.1f} MiB "
              f"| {load:.1f} / {load2:.1f} |")
    if any(r[5] for r in rows):
        print("\nWhere the purge process's time went (medians, ms since the targets were known; "
              "rest = wall − last result: process start, repository load, exit)\n")
        print("| binaries | agents | all enqueued | first result | median result | last result | rest |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, n, _, _, _, phases, _, _, _, _ in rows:
            if not phases:
                print(f"| {label} | {n} | – | – | – | – | – |")
                continue
            m = {k: statistics.median(p[k] for p in phases) for k in (*PHASES, "rest_ms")}
            print(f"| {label} | {n} | {m['enqueue_ms']:.1f} | {m['first_result_ms']:.1f} "
                  f"| {m['median_result_ms']:.1f} | {m['last_result_ms']:.1f} | {m['rest_ms']:.1f} |")
    print("\nFixed cost: wall of `edgeform purge --site no-such.invalid --url /a.mp4` (process start, "
          "repository load, the lookup, exit 1; nothing sent), median / min ms\n")
    print("| binaries | agents | start + load + exit |")
    print("|---|---:|---:|")
    for label, n, *_, fixed in rows:
        print(f"| {label} | {n} | {statistics.median(fixed):.1f} / {min(fixed):.1f} |")
    if any(r[8] for r in rows):
        print("\nCPU per purge (medians, CPU-ms: utime + stime from /proc/<pid>/stat, 10 ms ticks summed "
              "over the processes; idle = what the redis-servers, agents and broker use in the same wall "
              "time when no purge runs, already inside their columns)\n")
        print("| binaries | agents | edgeform | redis-servers | agents | mosquitto | total | of which idle "
              "| floor (edges' CPU / cores + RTT) | wall p50 | p50 / floor "
              "| floor counting edgeform and the idle load | p50 / that floor |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, n, times, *_, cpus, _ in rows:
            if not cpus:
                continue
            m = {k: statistics.median(c[k] for c in cpus) for k in cpus[0]}
            total = statistics.median(sum(c[k] for k in ("edgeform", "redis", "agents", "mosquitto")) for c in cpus)
            p50 = statistics.median(times)
            print(f"| {label} | {n} | {m['edgeform']:.0f} | {m['redis']:.0f} | {m['agents']:.0f} "
                  f"| {m['mosquitto']:.0f} | {total:.0f} | {m['idle']:.0f} | {m['floor']:.0f} ms "
                  f"| {p50:.0f} ms | **{p50 / m['floor']:.2f}** (goal ≤ 1.25) "
                  f"| {m['busy_floor']:.0f} ms | **{p50 / m['busy_floor']:.2f}** |")
        print("\nIdle (no purge running), CPU-ms per second of wall: what the setup costs by itself\n")
        print("| binaries | agents | redis-servers | agents | mosquitto | total (1000 = one core) |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, n, times, *_, cpus, _ in rows:
            if cpus:
                c = cpus[0]
                print(f"| {label} | {n} | {c['idle_redis']:.0f} | {c['idle_agents']:.0f} | {c['idle_mosquitto']:.0f} "
                      f"| {c['idle_redis'] + c['idle_agents'] + c['idle_mosquitto']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
