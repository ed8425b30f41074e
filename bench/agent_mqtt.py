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

from benchlib import cpu_seconds, free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "target" / "release" / "edgeform-agent"
SIM = ROOT / "target" / "release" / "examples" / "sim-nodes"


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=60)
    ap.add_argument("--nodes", type=int, default=300)
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "agent", "--bins", "--examples"],
                   cwd=ROOT, check=True)
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
                                 env={**os.environ, "EDGEFORM_LOG": "warn"})
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
