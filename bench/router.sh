#!/usr/bin/env bash
# The geo router under load (bench/RESULTS.md): wrk against the reference
# router (router/: client from X-Forwarded-For, GeoIP2 city lookup,
# haversine to every edge, rendezvous tie-break, balancer_by_lua) vs nginx
# proxying to a fixed upstream, same proxy settings, same upstream (an
# nginx answering a 2 KiB body). Each nginx under test runs one worker
# pinned to CPU 1; wrk (one thread) and the upstream are pinned to CPU 0.
# No Rust build needed: the table is written to Redis with redis-cli.
#
#   bench/router.sh [seconds per round, default 10] [rounds, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_packages "${EDGE_PACKAGES[@]}" redis-server
secs=${1:-10}; rounds=${2:-5}
work=$(mktemp -d)
trap 'stop_servers; rm -rf "$work"' EXIT
SERVER_DIR="$work"
free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rport=$(free); uport=$(free); gport=$(free); pport=$(free)
start_redis "$rport"

# The upstream: every edge of the table is this one nginx (127.0.0.1:uport).
mkdir -p "$work/up"
head -c 2048 /dev/zero | tr '\0' x > "$work/up/body"
cat > "$work/up/nginx.conf" <<CONF
user $(id -un); worker_processes 1; daemon off; pid $work/up/nginx.pid; error_log $work/up/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$uport; root $work/up; location / { try_files /body =404; } } }
CONF
taskset -c 0 nginx -p "$work/up" -c "$work/up/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$uport"

# A routing table with 12 edges around the world (two tied pairs) and
# loopback as the trusted proxy; the agent's health snapshot, kept fresh.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
edges = {"london": (51.5074, -0.1278), "oxford": (51.752, -1.2577), "stockholm": (59.3293, 18.0686),
         "seattle": (47.6062, -122.3321), "tacoma": (47.2529, -122.4443), "shanghai": (31.2304, 121.4737),
         "la": (34.0522, -118.2437), "frankfurt": (50.1109, 8.6821), "nyc": (40.7128, -74.006),
         "tokyo": (35.6762, 139.6503), "sydney": (-33.8688, 151.2093), "saopaulo": (-23.5505, -46.6333)}
nodes = {f"edge-{n}": {"roles": ["edge"], "region": "r", "zone": None, "public_url": None,
                       "location": {"lat": la, "lon": lo}, "addresses": ["127.0.0.1"],
                       "playback_session_limit": None, "playback_bandwidth_kbit": None,
                       "network_bandwidth_kbit": None} for n, (la, lo) in edges.items()}
table = {"format": 2, "cluster": "bench", "trusted_proxies": ["127.0.0.1/32"],
         "geo": {"tie_km": 100.0, "buckets": [], "default_weight": 1, "max_fails": 3, "fail_timeout_s": 30},
         "zones": {}, "nodes": nodes}
open(f"{work}/routing.json", "w").write(json.dumps(table, sort_keys=True, separators=(",", ":")))
open(f"{work}/nodes.txt", "w").write(" ".join(nodes))
PY
redis-cli -p "$rport" -x set edgeform:routing < "$work/routing.json" >/dev/null
redis-cli -p "$rport" hset edgeform:meta generation 1 >/dev/null
write_health() {
  python3 - "$work" "$(date +%s)" <<'PY'
import json, os, sys
work, at = sys.argv[1], int(sys.argv[2])
nodes = open(f"{work}/nodes.txt").read().split()
json.dump({"at": at, "stale": False, "nodes": {n: {"online": True} for n in nodes}}, open(f"{work}/h.tmp", "w"))
os.replace(f"{work}/h.tmp", f"{work}/health.json")
PY
}
write_health
( while sleep 2; do write_health 2>/dev/null || exit 0; done ) & SERVER_PIDS+=($!)

mkdir -p "$work/router" "$work/plain"
router/render "$work/router/nginx.conf" USER="$(id -un)" WORKERS=1 PREFIX="$work/router" ACCESS_LOG=off \
  GEOIP_DB="$PWD/testdata/geoip/GeoLite2-City-Test.mmdb" REDIS="{\"url\": \"redis://127.0.0.1:$rport\"}" REDIS_PASSWORD_ENV=EDGEFORM_REDIS_PASSWORD REDIS_CA_FILE=/etc/ssl/certs/ca-certificates.crt \
  HEALTH_FILE="$work/health.json" EDGE_PORT="$uport" LISTEN="127.0.0.1:$gport"
# The reference: the same server without the Lua phases, proxying to the
# fixed upstream (same proxy settings, same keepalive pool).
python3 - "$work/router/nginx.conf" "$work/plain/nginx.conf" "$uport" "$pport" "$gport" "$work" <<'PY'
import re, sys
src, dst, up, pport, gport, work = sys.argv[1:7]
s = open(src).read()
s = re.sub(r'\n\s*access_by_lua_block \{[^}]*\}', '', s)
s = re.sub(r'\n\s*balancer_by_lua_block \{[^}]*\}', '', s)
s = s.replace("server 0.0.0.1;   # never used: the balancer sets the peer", f"server 127.0.0.1:{up};")
s = s.replace(f"127.0.0.1:{gport}", f"127.0.0.1:{pport}").replace(f"{work}/router", f"{work}/plain")
open(dst, "w").write(s)
PY
grep -q _by_lua_block "$work/plain/nginx.conf" && grep -q 'access_by_lua\|balancer_by_lua' "$work/plain/nginx.conf" && { echo "plain config still routes" >&2; exit 1; }
taskset -c 1 nginx -p "$work/router" -c "$work/router/nginx.conf" & SERVER_PIDS+=($!)
taskset -c 1 nginx -p "$work/plain" -c "$work/plain/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$gport"; wait_port "$pport"
sleep 0.5

# Clients: addresses of MaxMind's test database all over the world, one
# per request in turn, in X-Forwarded-For.
cat > "$work/xff.lua" <<'LUA'
local ips = {"81.2.69.142", "89.160.20.128", "175.16.199.1", "216.160.83.57", "2001:480:10::1",
             "2a02:cf40::1", "81.2.69.160", "89.160.20.112", "2001:218::1", "67.43.156.1"}
local i = 0
request = function()
  i = i % #ips + 1
  return wrk.format("GET", "/live/s.m3u8", { ["X-Forwarded-For"] = ips[i], Host = "cdn.test" })
end
LUA
for ip in 81.2.69.142 2001:480:10::1; do
  h=$(curl -s -o /dev/null -D - -H "X-Forwarded-For: $ip" "http://127.0.0.1:$gport/" | tr -d '\r')
  grep -q '^HTTP/1.1 200' <<<"$h" && grep -qi '^x-edgeform-edge: edge-' <<<"$h" \
    || { echo "the router does not route $ip:"; echo "$h"; cat "$work/router/error.log"; exit 1; } >&2
  grep -qi '^x-edgeform-stale' <<<"$h" && { echo "the router is stale: $h" >&2; exit 1; }
  echo "$ip → $(awk -F': ' 'tolower($1)=="x-edgeform-edge"{print $2}' <<<"$h")" >&2
done

gw=$(worker_of "$work/router"); pw=$(worker_of "$work/plain")
run_wrk() { # port worker-pid
  local t0 t1 out
  t0=$(ticks "$2")
  out=$(taskset -c 0 wrk -t1 -c32 -d"${secs}s" -s "$work/xff.lua" "http://127.0.0.1:$1/")
  t1=$(ticks "$2")
  python3 - "$out" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import re, sys
out, t0, t1, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n = int(re.search(r"(\d+) requests in", out).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
if bad: sys.exit(f"{bad.group(1)} requests failed:\n{out}")
print(f"{rps:.0f} {(t1 - t0) / hz / n * 1e6:.2f}")
PY
}
echo "wrk: ${rounds} rounds of ${secs}s each side, interleaved, 1 thread, 32 connections" >&2
ratios=(); cpu_g=(); cpu_p=(); rps_g=(); rps_p=()
for i in $(seq 1 "$rounds"); do
  read -r rg cg < <(run_wrk "$gport" "$gw"); read -r rp cp < <(run_wrk "$pport" "$pw")
  rps_g+=("$rg"); rps_p+=("$rp"); cpu_g+=("$cg"); cpu_p+=("$cp")
  ratios+=("$(python3 -c "print($rg/$rp)")")
  echo "  round $i: router $rg req/s ($cg us CPU/req), fixed upstream $rp req/s ($cp us CPU/req)" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
python3 - "$(median "${rps_g[@]}")" "$(median "${rps_p[@]}")" "$(median "${ratios[@]}")" \
  "$(median "${cpu_g[@]}")" "$(median "${cpu_p[@]}")" <<'PY'
import sys
g, p, r, cg, cp = map(float, sys.argv[1:6])
print(f"geo router (12 edges):          {g:,.0f} req/s, {cg:.1f} us worker CPU per request")
print(f"nginx, fixed upstream:          {p:,.0f} req/s, {cp:.1f} us worker CPU per request")
print(f"throughput ratio (median of per-round ratios): {r:.2f} (goal >= 0.8); CPU ratio fixed/router: {cp/cg:.2f}")
print(f"the router's decision: {cg - cp:.1f} us CPU per request")
PY
