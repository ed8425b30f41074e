#!/usr/bin/env python3
"""The agent over MQTT: idle cost, and one agent's routing fed
by 300 simulated nodes' health reports. Real redis-server and mosquitto on
free loopback ports; release builds.

1. idle: the agent alone (health every 5 s, routing, purge worker, HTTP),
   CPU (utime+stime from /proc/<pid>/stat) and RSS over --secs seconds.
   Goals: RSS < 30 MiB, CPU < 1 % of a core.
2. fed: 300 simulated nodes publish a report every 5 s (spread over the
   interval) for --secs seconds, with a routing table naming all of them:
   the agent's CPU and RSS, and /route answering from their health.
3. burst: every node publishes 100 reports back to back (30,000
   messages); the agent's intake rate (messages/s, from its
   edgeform_agent_health_messages_total counter) and mosquitto's CPU in
   the same window, for scale.

    python3 bench/agent_mqtt.py [--secs 60] [--nodes 300]

4. health traffic (--scale 100,300,1000): N simulated agents, each its own
   MQTT client (status, last will, a report every 5 s), reading what an
   agent reads: `full` = every node's health (health/+, before regional
   summaries; 1 region), `summary` = the summaries (summary/+) of 4
   regions, each summarized by a real edgeform-agent (agent-r0..r3), plus
   one more real agent (agent-x, region r0) that only receives. Measured
   after a warm-up: the broker's messages sent per second ($SYS, sent by
   sim-nodes), mosquitto's CPU, the summarizer agent-r0's and the
   receiver agent-x's CPU and RSS. Goal: sent ≤ (regions + 2) × N / 5 s.

    python3 bench/agent_mqtt.py --scale 100,300,1000 [--scale-modes full,summary] \
        [--scale-full-max 300] [--scale-secs 30]
"""

import argparse
import http.client as http_client
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from benchlib import agent_env, cpu_seconds, free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
# The agent as shipped to edges (packaging/systemd/edgeform-agent.service): the release-lto build.
AGENT = TARGET / "release-lto" / "edgeform-agent"
SIM = TARGET / "release" / "examples" / "sim-nodes"


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric(http, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def window(pid, secs):
    c0, t0 = cpu_seconds(pid), time.time()
    peak = 0.0
    while time.time() - t0 < secs:
        time.sleep(1)
        peak = max(peak, rss_mib(pid))
    dt = time.time() - t0
    return (cpu_seconds(pid) - c0) / dt * 100, peak


def raise_nofile():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


def scale_run(n, mode, secs, warmup=20, regions=4, interval_s=5, keep=None):
    """One health-traffic run; a dict of figures. `keep`: a folder the agents' logs (at info level,
    which costs them some CPU) are copied to, as `<N>-<mode>-<agent>.log`."""
    work = Path(tempfile.mkdtemp(prefix="edgeform-health-scale-"))
    procs = []
    try:
        rport, mport = free_port(), free_port()
        (work / "redis").mkdir()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--dir", str(work / "redis")],
            stdout=subprocess.DEVNULL))
        (work / "mqtt").mkdir()
        (work / "mqtt" / "m.conf").write_text(
            f"listener {mport} 127.0.0.1\nallow_anonymous true\nsys_interval 1\n"
            f"max_queued_messages 100000\n")
        mosq = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        broker = subprocess.Popen([mosq, "-c", str(work / "mqtt" / "m.conf")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, preexec_fn=raise_nofile)
        procs.append(broker)
        wait_port(rport)
        wait_port(mport)
        regions = regions if mode == "summary" else 1
        names = [f"agent-r{k}" for k in range(regions)] if mode == "summary" else []
        region_of = {name: f"r{k}" for k, name in enumerate(names)}
        region_of["agent-x"] = "r0" if mode == "summary" else "eu"
        extra = ",".join(f"{k}:{v}" for k, v in region_of.items())
        sim = subprocess.Popen([str(SIM), "--broker", f"127.0.0.1:{mport}", "--nodes", str(n),
                                "--interval-ms", str(interval_s * 1000), "--seconds", str(warmup + secs),
                                "--warmup", str(warmup), "--regions", str(regions), "--extra", extra,
                                "--mode", mode, "--redis", f"redis://127.0.0.1:{rport}"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=raise_nofile)
        procs.append(sim)
        agents = {}
        for name in names + ["agent-x"]:
            if name == "agent-x":
                time.sleep(interval_s + 3)  # the summarizers claim first
            http = free_port()
            (work / name).mkdir()
            (work / name / "agent.yaml").write_text(
                f"node: {name}\nregion: {region_of[name]}\nredis: {{url: \"redis://127.0.0.1:{rport}\"}}\n"
                f"cache: {{dirs: [{work / name}]}}\nhttp: {{listen: \"127.0.0.1:{http}\"}}\n"
                f"state_dir: {work / name / 'state'}\n"
                f"mqtt: {{url: \"mqtt://127.0.0.1:{mport}\"}}\nhealth: {{interval: {interval_s}s}}\n")
            p = subprocess.Popen([str(AGENT), "--config", str(work / name / "agent.yaml")],
                                 stdout=subprocess.DEVNULL, stderr=open(work / name / "agent.log", "w"),
                                 env={**agent_env(), "EDGEFORM_LOG": "info"} if keep else agent_env())
            procs.append(p)
            agents[name] = (p, http)
        started = time.time()
        time.sleep(max(0.0, warmup - (time.time() - started) - (interval_s + 3 if names else 0)))
        watched = {"broker": broker.pid, **{k: v[0].pid for k, v in agents.items()}}
        c0 = {k: cpu_seconds(pid) for k, pid in watched.items()}
        h0 = {k: metric(v[1], "edgeform_agent_health_messages_total") for k, v in agents.items()}
        t0 = time.time()
        # Measured before the simulated nodes stop (they say offline then).
        time.sleep(max(1.0, secs - 3))
        dt = time.time() - t0
        cpu = {k: (cpu_seconds(pid) - c0[k]) / dt * 100 for k, pid in watched.items()}
        heard = {k: (metric(v[1], "edgeform_agent_health_messages_total") - h0[k]) / dt
                 for k, v in agents.items()}
        rss = {k: rss_mib(v[0].pid) for k, v in agents.items()}
        known = {k: metric(v[1], "edgeform_agent_cluster_nodes_reporting") for k, v in agents.items()}
        out, _ = sim.communicate(timeout=warmup + secs + 120)
        sys_ = json.loads(out.decode().strip().splitlines()[-1])
        return {"n": n, "mode": mode, "regions": regions, "cpu": cpu, "rss": rss, "known": known,
                "heard": heard, **sys_}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            for log in work.glob("*/agent.log"):
                shutil.copy(log, keep / f"{n}-{mode}-{log.parent.name}.log")
        shutil.rmtree(work, ignore_errors=True)


def scale(a):
    sizes = [int(x) for x in a.scale.split(",")]
    print("| N | mode | regions | broker sent/s ($SYS, all) | PUBLISH sent/s | bound (R+2)·N/5s | N²/5s "
          "| mosquitto CPU | agent-r0 (summarizer) CPU, RSS | agent-x (receiver) CPU, RSS | nodes known by agent-x |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        for mode in a.scale_modes.split(","):
            if mode == "full" and n > a.scale_full_max:
                continue
            r = scale_run(n, mode, a.scale_secs, keep=Path(a.keep_logs) if a.keep_logs else None)
            print("  (health messages taken per second: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in r["heard"].items()) +
                  f"; sim nodes received {r['received_per_s']:.0f}/s)", flush=True)
            bound = (r["regions"] + 2) * n / 5 if mode == "summary" else float("nan")
            summ = (f"{r['cpu']['agent-r0']:.2f} %, {r['rss']['agent-r0']:.1f} MiB"
                    if "agent-r0" in r["cpu"] else "—")
            print(f"| {n} | {mode} | {r['regions']} | {r['messages_sent_per_s'] or float('nan'):,.0f} "
                  f"| {r['publish_sent_per_s'] or float('nan'):,.0f} | {bound:,.0f} | {n * n / 5:,.0f} "
                  f"| {r['cpu']['broker']:.1f} % | {summ} "
                  f"| {r['cpu']['agent-x']:.2f} %, {r['rss']['agent-x']:.1f} MiB | {int(r['known']['agent-x'])} |",
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=60)
    ap.add_argument("--nodes", type=int, default=300)
    ap.add_argument("--scale", help="health traffic at these N (e.g. 100,300,1000); only this part runs")
    ap.add_argument("--scale-modes", default="full,summary")
    ap.add_argument("--scale-full-max", type=int, default=300)
    ap.add_argument("--scale-secs", type=int, default=30)
    ap.add_argument("--agent", type=Path,
                    help="the edgeform-agent binary to measure (default: the release-lto build, built first); "
                         "for A/B runs of two builds")
    ap.add_argument("--keep-logs", help="with --scale: copy each run's agent logs (info level) into this folder")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "agent", "--examples"],
                   cwd=ROOT, check=True)
    global AGENT
    if a.agent:
        AGENT = a.agent.resolve()
    else:
        subprocess.run(["cargo", "build", "--profile", "release-lto", "--quiet", "-p", "agent", "--bins"],
                       cwd=ROOT, check=True)
    if a.scale:
        scale(a)
        return
    work = Path(tempfile.mkdtemp(prefix="edgeform-agent-mqtt-"))
    procs = []
    try:
        rport, mport, http = free_port(), free_port(), free_port()
        (work / "redis").mkdir()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--dir", str(work / "redis")],
            stdout=subprocess.DEVNULL))
        (work / "mqtt").mkdir()
        (work / "mqtt" / "m.conf").write_text(f"listener {mport} 127.0.0.1\nallow_anonymous true\n")
        mosq = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        broker = subprocess.Popen([mosq, "-c", str(work / "mqtt" / "m.conf")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        procs.append(broker)
        wait_port(rport)
        wait_port(mport)
        (work / "cache").mkdir()
        (work / "agent.yaml").write_text(
            f"node: sim-bench\nregion: eu\nredis: {{url: \"redis://127.0.0.1:{rport}\"}}\n"
            f"cache: {{dirs: [{work / 'cache'}]}}\nhttp: {{listen: \"127.0.0.1:{http}\"}}\n"
            f"mqtt: {{url: \"mqtt://127.0.0.1:{mport}\"}}\nhealth: {{interval: 5s}}\n")
        agent = subprocess.Popen([str(AGENT), "--config", str(work / "agent.yaml")],
                                 stdout=subprocess.DEVNULL, stderr=open(work / "agent.log", "w"),
                                 env=agent_env())
        procs.append(agent)
        wait_port(http)
        time.sleep(5)
        cpu, rss = window(agent.pid, a.secs)
        print(f"idle ({a.secs}s, health every 5s): agent CPU {cpu:.3f} % of a core, RSS {rss:.1f} MiB "
              f"(goals < 1 %, < 30 MiB)")

        sim = subprocess.Popen([str(SIM), "--broker", f"127.0.0.1:{mport}", "--nodes", str(a.nodes),
                                "--interval-ms", "5000", "--seconds", str(a.secs + 10),
                                "--redis", f"redis://127.0.0.1:{rport}"],
                               stderr=subprocess.DEVNULL)
        procs.append(sim)
        time.sleep(7)
        cpu, rss = window(agent.pid, a.secs)
        nodes = metric(http, "edgeform_agent_cluster_nodes_reporting")
        conn = http_client.HTTPConnection("127.0.0.1", http, timeout=5)
        conn.request("GET", "/route/cam3?format=json")  # not followed: the 302 is the answer
        d = json.load(conn.getresponse())
        listed = sum(len(z["nodes"]) for z in d["zones"])
        print(f"fed by {a.nodes} nodes (a report each every 5s): agent CPU {cpu:.3f} % of a core, "
              f"RSS {rss:.1f} MiB; health known for {int(nodes)} nodes; "
              f"/route/cam3 → {d['status']} {d.get('node')} ({listed} nodes listed on the chain)")
        sim.wait()

        before = metric(http, "edgeform_agent_health_messages_total")
        burst = 100
        total = burst * a.nodes
        c0 = cpu_seconds(agent.pid)
        m0 = cpu_seconds(broker.pid)
        t0 = time.time()
        sim = subprocess.Popen([str(SIM), "--broker", f"127.0.0.1:{mport}", "--nodes", str(a.nodes),
                                "--burst", str(burst)], stderr=subprocess.DEVNULL)
        procs.append(sim)
        got = 0
        while time.time() - t0 < 120:
            got = metric(http, "edgeform_agent_health_messages_total") - before
            if got >= total:
                break
            time.sleep(0.05)
        dt = time.time() - t0
        sim.wait()
        print(f"burst: {int(got)}/{total} reports taken in {dt:.2f}s = {got / dt:,.0f} messages/s; "
              f"agent CPU {cpu_seconds(agent.pid) - c0:.2f}s, mosquitto CPU {cpu_seconds(broker.pid) - m0:.2f}s; "
              f"agent RSS {rss_mib(agent.pid):.1f} MiB")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
