#!/usr/bin/env bash
# The agent's GET /route/<stream> under load, side by side with nginx
# answering `return 302` on the same machine, one worker each (the agent's
# runtime on one thread, nginx with one worker process), both pinned to CPU 1
# and wrk pinned to CPU 0, in alternating rounds. Prints requests/s and
# each server's CPU time per request, medians over the rounds.
#
#   bench/route_http.sh [seconds per round, default 5] [rounds, default 9]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_packages "${BUILD_PACKAGES[@]}" redis-server nginx wrk
secs=${1:-5}
rounds=${2:-9}
cargo build --release --quiet --locked -p edgeform
# The agent as shipped to edges (packaging/systemd/edgeform-agent.service).
cargo build --profile release-lto --quiet --locked -p agent --bins
work=$(mktemp -d)
trap 'stop_servers; rm -rf "$work"' EXIT
SERVER_DIR="$work"

rport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
start_redis "$rport"
# The example repository's routing table, as edge-ams-1 holds it.
target/release/edgeform build --out "$work/out" >/dev/null 2>&1
python3 - "$work/out/edge-ams-1.json" "$rport" <<'PY'
import json, subprocess, sys
table = json.load(open(sys.argv[1]))["edgeform:routing"]
subprocess.run(["redis-cli", "-p", sys.argv[2], "SET", "edgeform:routing", table], check=True, capture_output=True)
subprocess.run(["redis-cli", "-p", sys.argv[2], "HSET", "edgeform:meta", "generation", "1"], check=True, capture_output=True)
PY
cat > "$work/health.json" <<'JSON'
{"nodes": {"edge-ams-1": {"online": true, "play_sessions": 12, "out_kbit": 80000, "streams": ["cam1"]},
           "edge-fra-1": {"online": true, "play_sessions": 3, "out_kbit": 20000, "streams": []},
           "edge-nyc-1": {"online": true, "play_sessions": 0, "out_kbit": 0, "streams": []}}}
JSON
aport=17380; nport=17381
mkdir -p "$work/cache"
cat > "$work/agent.yaml" <<YAML
node: edge-ams-1
region: eu
redis: {url: "redis://127.0.0.1:$rport"}
cache: {dirs: [$work/cache]}
http: {listen: "127.0.0.1:$aport"}
routing: {health_file: $work/health.json}
YAML
# With the shipped unit's environment (its allocator settings).
unit_env=$(sed -n 's/^Environment=\(_RJEM_MALLOC_CONF=.*\)/\1/p' packaging/systemd/edgeform-agent.service)
env ${unit_env:+"$unit_env"} TOKIO_WORKER_THREADS=1 EDGEFORM_LOG=warn taskset -c 1 target/release-lto/edgeform-agent --config "$work/agent.yaml" &
SERVER_PIDS+=($!)
mkdir -p "$work/nginx/logs"
cat > "$work/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
error_log $work/nginx/logs/error.log;
pid $work/nginx/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  server { listen 127.0.0.1:$nport; location / { return 302 https://edge.example.net/cam1; } }
}
CONF
taskset -c 1 nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
SERVER_PIDS+=($!)
wait_port "$aport"; wait_port "$nport"
for _ in $(seq 1 50); do curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$aport/route/cam1" | grep -q 302 && break; sleep 0.1; done
echo "agent: $(curl -s -o /dev/null -w '%{http_code} %{redirect_url}' "http://127.0.0.1:$aport/route/cam1")"
echo "nginx: $(curl -s -o /dev/null -w '%{http_code} %{redirect_url}' "http://127.0.0.1:$nport/route/cam1")"
hz=$(getconf CLK_TCK)
apid=$(pgrep -f "edgeform-agent --config $work/agent.yaml")
npid=$(pgrep -f "nginx: worker process" | head -1)
# One round: requests/s and the server's CPU microseconds per request.
round() {
  local pid=$1 url=$2 t0 t1 out n
  t0=$(ticks "$pid")
  out=$(taskset -c 0 wrk -t1 -c64 -d"${secs}s" "$url")
  t1=$(ticks "$pid")
  n=$(echo "$out" | awk '/requests in/ {print $1}')
  echo "$(echo "$out" | awk '/Requests\/sec/ {print $2}') $(python3 -c "print(($t1 - $t0) / $hz * 1e6 / $n)")"
}
# Alternating rounds: the machine's drift hits both alike; the figure is
# the median of the per-round ratios.
rows=()
for _ in $(seq 1 "$rounds"); do
  rows+=("$(round "$npid" "http://127.0.0.1:$nport/route/cam1") $(round "$apid" "http://127.0.0.1:$aport/route/cam1")")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
n, nc, a, ac = (list(c) for c in zip(*rows))
med = statistics.median
print(f"\n| server (1 worker, pinned) | requests/s (median of {len(rows)}) | CPU per request (median) |\n|---|---:|---:|")
print(f"| nginx `return 302` | {med(n):,.0f} | {med(nc):.1f} µs |")
print(f"| edgeform-agent `GET /route/cam1` (302) | {med(a):,.0f} | {med(ac):.1f} µs |")
ratios = sorted(x / y for x, y in zip(a, n))
print(f"\nagent / nginx requests/s: median of per-round ratios {med(ratios):.2f} (rounds {ratios[0]:.2f}–{ratios[-1]:.2f}); ratio of medians {med(a) / med(n):.2f}")
print(f"nginx / agent CPU per request: {med(nc) / med(ac):.2f}")
'
