#!/usr/bin/env bash
# The reference edge's document lookup with traffic spread over many hosts
# (bench/RESULTS.md): N site documents in the edge's Redis, wrk asking for
# a uniformly random Host of them on every request, the edge with 1, 2 and
# 4 workers, each with and without the workers' shared document cache
# (the same nginx.conf with the `lua_shared_dict edge_docs`/`edge_wild`
# lines removed: every worker reads Redis itself, as before the cache).
# Printed per row: requests/s, Redis MGETs per request (from Redis's own
# command counter; each is a document lookup that missed every cache),
# and the hit ratio 1 - MGETs/requests: first while every host is asked
# for once, in order (the fill: every cache starts empty), then in a
# window of uniformly random hosts right after it.
#
#   bench/edge_hosts.sh [hosts, default 100000] [seconds per window, default 10]
#
# The documents are written with redis-cli --pipe in the shape `apply`
# writes (SPEC §2, one `site:<host>` each; the bench site of bench/edge.sh
# with `cached: false`, so every request goes to the origin and no cache
# folder fills up); what is measured is the edge's lookup, not the push.
#
# The edge is the edge role's bundle (`edgeform build`, roles/edge/, as
# installed), copied per row with its worker count, port and run folder;
# these rows turn its warm at start off (`warm = "off"`), so every cache
# starts empty.
#
# Then the warm itself (docs/edge.md "Warming"), 1 worker: nginx started
# with nobody asking, the time until it logs the warm's end and the
# worker's CPU time by then (all of it the warm's); then nginx started
# under the random-Host load for ${secs}s, warm off and on: req/s and
# MGETs/request in that first window after a start. WARM_ONLY=1 runs only
# these rows.
# EDGEFORM=PATH uses that binary instead of a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/edgelib.sh
need_packages "${BUILD_PACKAGES[@]}" "${EDGE_PACKAGES[@]}" redis-server
hosts=${1:-100000}; secs=${2:-10}
if [ -z "${EDGEFORM:-}" ]; then
  cargo build --release --quiet --locked -p edgeform
  EDGEFORM=target/release/edgeform
fi
work=$(mktemp -d)
# The origin's worker (not root) reads its body from here.
chmod 755 "$work"
trap 'stop_servers; rm -rf "$work"' EXIT
SERVER_DIR="$work"
free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rport=$(free); oport=$(free)
start_redis "$rport"
echo "load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"

mkdir -p "$work/origin"
head -c 2048 /dev/zero | tr '\0' x > "$work/origin/body"
cat > "$work/origin/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $work/origin/nginx.pid; error_log $work/origin/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$oport; root $work/origin; location / { try_files /body =404; } } }
CONF
nginx -p "$work/origin" -c "$work/origin/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$oport"

python3 - "$hosts" "$oport" > "$work/docs.resp" <<'PY'
import json, sys
n, port = int(sys.argv[1]), sys.argv[2]
def cmd(*a):
    out = [f"*{len(a)}\r\n"]
    for x in a:
        b = x.encode()
        out.append(f"${len(b)}\r\n"); out.append(x + "\r\n")
    return "".join(out)
w = sys.stdout.write
for i in range(n):
    doc = {"cache_rules": [{"action": "ttl", "match_type": "ext", "match_value": ".mp4", "ttl": 86400}],
           "cached": False, "cors_mode": "permissive",
           "edge_rules": [{"action": "redirect", "match_type": "prefix", "match_value": "/old/",
                           "redirect_status": 301, "redirect_to": None}],
           "geo_codes": "CN,RU", "geo_mode": "block", "hotlink_mode": "off", "ip_list": "", "ip_mode": "off",
           "origin": f"http://127.0.0.1:{port}", "rate_mode": "off", "waf_mode": "detect"}
    w(cmd("SET", f"site:s{i}.bench.test", json.dumps(doc, sort_keys=True, separators=(",", ":"))))
w(cmd("HSET", "edgeform:meta", "generation", "1"))
PY
redis-cli -p "$rport" --pipe < "$work/docs.resp" >/dev/null

# The bundle: a node of its own (no site: `build` only renders the template).
repo="$work/repo"; mkdir -p "$repo/sites" "$repo/nodes"
echo "name: bench" > "$repo/cluster.yaml"
cp -r roles "$repo/roles"
lport=$(free); cport=$(free); hop=$(free); hop2=$(free)
https1=$(free); proxy1=$(free); https2=$(free); proxy2=$(free)
edge_node "$repo" "$rport" "$work" "$lport" "$cport" "$hop" "$hop2" "$https1" "$proxy1" "$https2" "$proxy2"
edge_placeholder "$work"
"$EDGEFORM" --repo "$repo" build --out "$work/out" >/dev/null
bundle="$work/out/bundles/edge-1"
mkdir -p "$work/cache"
cat > "$work/random_host.lua" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/a.mp4", { Host = "s" .. math.random(0, $hosts - 1) .. ".bench.test" })
end
LUA
# Hosts in order from an offset (the fill: runs until every host was asked for).
every_host() { # OFFSET
  cat > "$work/every_host.lua" <<LUA
local i = $1
request = function()
  i = i + 1
  return wrk.format("GET", "/a.mp4", { Host = "s" .. ((i - 1) % $hosts) .. ".bench.test" })
end
LUA
}

mget_calls() { redis-cli -p "$rport" info commandstats | tr -d '\r' | awk -F'[=,:]' '/^cmdstat_mget:/{print $3}' | grep . || echo 0; }
row() { # WORKERS SHARED(yes|no)
  local dir="$work/root/run/edge-$1-$2" port; port=$(free); mkdir -p "$dir"
  sed -e "s|^worker_processes 1;|worker_processes $1;|" -e "s|127.0.0.1:$lport|127.0.0.1:$port|" \
    -e "s|$work/root/run/live|$dir|g" "$bundle/nginx.conf" > "$dir/nginx.conf"
  grep -q "^worker_processes $1;" "$dir/nginx.conf" || { echo "worker_processes not set" >&2; exit 1; }
  if [ "$2" = no ]; then sed -i '/lua_shared_dict edge_docs\|lua_shared_dict edge_wild/d' "$dir/nginx.conf"; fi
  sed -i 's|warm = "on",|warm = "off",|' "$dir/nginx.conf"
  grep -q 'warm = "off",' "$dir/nginx.conf" || { echo "warm not turned off" >&2; exit 1; }
  nginx -p "$bundle/" -c "$dir/nginx.conf" & local pid=$!
  wait_port "$port"; sleep 0.5
  local line="| $1 | $2 |"
  local m0 m1 out n=0 rps=0 t0 t1
  # The fill: every host once, in order (windows of ${secs}s until done).
  m0=$(mget_calls); t0=$(date +%s.%N)
  while [ "$n" -lt "$hosts" ]; do
    every_host "$n"
    out=$(wrk -t1 -c32 -d"${secs}s" -s "$work/every_host.lua" "http://127.0.0.1:$port/a.mp4")
    n=$((n + $(grep -oP '\d+(?= requests in)' <<<"$out")))
  done
  m1=$(mget_calls); t1=$(date +%s.%N)
  line+=$(python3 -c "n,m=$n,$m1-$m0; print(f' {n/($t1-$t0):,.0f} | {m/n:.3f} | {max(0.0, 1-m/n):.3f} |')")
  # Then uniformly random hosts.
  m0=$(mget_calls)
  out=$(wrk -t1 -c32 -d"${secs}s" -s "$work/random_host.lua" "http://127.0.0.1:$port/a.mp4")
  m1=$(mget_calls)
  n=$(grep -oP '\d+(?= requests in)' <<<"$out"); rps=$(grep -oP 'Requests/sec:\s+\K[\d.]+' <<<"$out")
  line+=$(python3 -c "n,m=$n,$m1-$m0; print(f' {float($rps):,.0f} | {m/n:.3f} | **{max(0.0, 1-m/n):.3f}** |')")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$line"
}
# The warm at start (1 worker): nobody asking, or the random-Host load from
# the start. WARM=on|off; LOAD=no|yes.
worker_cpu() { # NGINX_PID: the CPU seconds of its worker process(es)
  local total=0 w
  for w in $(cat "/proc/$1/task/$1/children"); do
    grep -q "worker process" "/proc/$w/cmdline" 2>/dev/null || continue
    total=$(python3 -c "import os; f=open('/proc/$w/stat').read().rsplit(')',1)[1].split(); print($total + (int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))")
  done
  echo "$total"
}
warm_row() { # WARM LOAD
  local dir="$work/root/run/warm-$1-$2-$RANDOM" port; port=$(free); mkdir -p "$dir"
  sed -e "s|127.0.0.1:$lport|127.0.0.1:$port|" -e "s|$work/root/run/live|$dir|g" \
    -e "s|warm = \"on\",|warm = \"$1\",|" "$bundle/nginx.conf" > "$dir/nginx.conf"
  grep -q "warm = \"$1\"," "$dir/nginx.conf" || { echo "warm not set" >&2; exit 1; }
  local m0 m1 out n rps line t0
  m0=$(mget_calls)
  nginx -p "$bundle/" -c "$dir/nginx.conf" & local pid=$!
  t0=$(date +%s.%N)
  wait_port "$port"
  if [ "$2" = no ]; then
    while ! grep -q "warmed the shared cache" "$dir/error.log" 2>/dev/null; do
      sleep 0.05
      python3 -c "import sys,time; sys.exit(time.time() - $t0 > 300)" || { echo "no warm in 300 s" >&2; exit 1; }
    done
    line=$(grep -o "warmed the shared cache.*s" "$dir/error.log" | head -1)
    echo "| warm, nobody asking | $line | worker CPU $(worker_cpu "$pid") s |"
  else
    out=$(wrk -t1 -c32 -d"${secs}s" -s "$work/random_host.lua" "http://127.0.0.1:$port/a.mp4")
    m1=$(mget_calls)
    n=$(grep -oP '\d+(?= requests in)' <<<"$out"); rps=$(grep -oP 'Requests/sec:\s+\K[\d.]+' <<<"$out")
    echo "| warm $1, random Hosts from the start | $(python3 -c "print(f'{float($rps):,.0f} req/s | {($m1-$m0)/$n:.3f} MGETs/request')") | worker CPU $(worker_cpu "$pid") s |"
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
if [ -z "${WARM_ONLY:-}" ]; then
  echo "$hosts hosts: each once in order (fill), then a uniformly random Host per request for ${secs}s"
  echo "| workers | shared cache | fill: req/s | MGETs/request | hit ratio | random: req/s | MGETs/request | hit ratio |"
  echo "|---:|---|---:|---:|---:|---:|---:|---:|"
  for w in 1 2 4; do row "$w" no; row "$w" yes; done
fi
echo "$hosts hosts, 1 worker: the warm at start"
for i in 1 2 3; do warm_row on no; done
for i in 1 2 3; do warm_row off yes; warm_row on yes; done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
