#!/usr/bin/env bash
# The agent's GET /route/<stream> under load, side by side with nginx
# answering `return 302` on the same machine, one worker each (the agent's
# runtime on one thread, nginx with one worker process), both pinned to CPU 1
# and wrk pinned to CPU 0. Prints requests/s medians of 3 rounds each.
#
#   bench/route_http.sh [seconds per round, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_packages "${BUILD_PACKAGES[@]}" redis-server nginx wrk
secs=${1:-10}
cargo build --release --quiet --locked -p edgeform -p agent
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
TOKIO_WORKER_THREADS=1 EDGEFORM_LOG=warn taskset -c 1 target/release/edgeform-agent --config "$work/agent.yaml" &
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
rps() { taskset -c 0 wrk -t1 -c64 -d"${secs}s" "$1" | awk '/Requests\/sec/ {print $2}'; }
a=(); n=()
for _ in 1 2 3; do
  n+=("$(rps "http://127.0.0.1:$nport/route/cam1")")
  a+=("$(rps "http://127.0.0.1:$aport/route/cam1")")
done
python3 - "${a[@]}" "${n[@]}" <<'PY'
import statistics, sys
v = list(map(float, sys.argv[1:])); a, n = v[:3], v[3:]
ma, mn = statistics.median(a), statistics.median(n)
print(f"\n| server (1 worker, pinned) | requests/s (median of 3) | runs |\n|---|---:|---|")
print(f"| nginx `return 302` | {mn:,.0f} | {', '.join(f'{x:,.0f}' for x in n)} |")
print(f"| edgeform-agent `GET /route/cam1` (302) | {ma:,.0f} | {', '.join(f'{x:,.0f}' for x in a)} |")
print(f"\nagent / nginx = {ma / mn:.2f} (goal >= 0.5; ATC's bar is 8,000/s)")
PY
