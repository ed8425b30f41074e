"""Helpers shared by the process benchmarks in this folder."""

import functools
import os
import socket
import time
from pathlib import Path


def free_port():
    """A free TCP port on 127.0.0.1 (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10.0):
    """Wait until something accepts connections on 127.0.0.1:port."""
    t = time.time() + timeout
    while time.time() < t:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing on {port}")


def cpu_seconds(pid):
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


AGENT_UNIT = Path(__file__).resolve().parent.parent / "packaging" / "systemd" / "edgeform-agent.service"


@functools.cache
def _unit_env():
    env = {}
    for line in AGENT_UNIT.read_text().splitlines():
        if line.startswith("Environment="):
            key, _, value = line[len("Environment="):].partition("=")
            if key != "EDGEFORM_LOG":
                env[key] = value
    return env


def agent_env():
    """The environment a bench's agent runs with: this process's, the shipped unit's `Environment=`
    lines (its allocator settings; benches run the agent as edges do) and warnings-only logs."""
    return {**os.environ, **_unit_env(), "EDGEFORM_LOG": "warn"}
