#!/usr/bin/env bash
# The per-site metrics' cost (docs/edge.md, "Per-site metrics and the
# access log"; bench/RESULTS.md): wrk against the edge role's bundle as
# installed, built by `edgeform build`, live instance with `metrics: on`
# vs its candidate with `metrics: off` (both `access_log: off`, so only
# the metrics differ; everything else byte for byte the same), cache HITs
# of one site, one worker each pinned to CPU 1, wrk pinned to CPU 0,
# rounds alternating. Then the same with `access_log: on` for both
# instances is not measured here: the log's cost is nginx's own.
#
#   bench/site_metrics.sh [seconds per round, default 10] [rounds, default 5]
#
# EDGEFORM=PATH uses that binary (it only applies and builds the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/edgelib.sh
secs=${1:-10}; rounds=${2:-5}
need_packages "${BUILD_PACKAGES[@]}" "${EDGE_PACKAGES[@]}" redis-server wrk
if [ -z "${EDGEFORM:-}" ]; then
  cargo build --release --quiet --locked -p edgeform
  EDGEFORM=target/release/edgeform
fi
echo "load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
work=$(mktemp -d)
chmod 755 "$work"
trap 'stop_servers; rm -rf "$work"' EXIT
SERVER_DIR="$work"
free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rport=$(free); oport=$(free); eport=$(free); pport=$(free); hop1=$(free); hop2=$(free)
start_redis "$rport"

mkdir -p "$work/origin"
head -c 2048 /dev/zero | tr '\0' x > "$work/origin/body"
cat > "$work/origin/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $work/origin/nginx.pid; error_log $work/origin/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$oport; root $work/origin; location / { try_files /body =404; } } }
CONF
nginx -p "$work/origin" -c "$work/origin/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$oport"

repo="$work/repo"; mkdir -p "$repo/sites" "$repo/nodes"
echo "name: bench" > "$repo/cluster.yaml"
cp -r roles "$repo/roles"
EDGE_VARS=', metrics: "on", access_log: "off"' EDGE_CANDIDATE_VARS=', metrics: "off"' \
  edge_node "$repo" "$rport" "$work" "$eport" "$pport" "$hop1" "$hop2"
cat > "$repo/sites/bench.yaml" <<YAML
host: bench.test
origin: http://127.0.0.1:$oport
loopback: true
cache_rules:
  - {match_type: ext, match_value: .mp4, action: ttl, ttl: 86400}
YAML
"$EDGEFORM" --repo "$repo" apply --yes >/dev/null 2>&1 || { "$EDGEFORM" --repo "$repo" apply --yes; exit 1; }
"$EDGEFORM" --repo "$repo" build --out "$work/out" >/dev/null 2>&1
bundle="$work/out/bundles/edge-1"
mkdir -p "$work/cache" "$work/root/run/live" "$work/root/run/candidate"
edge_placeholder "$work"
# The two renderings differ only in listeners, run folder and the switch.
diff <(sed -e "s|$pport|PORT|g; s|$hop2|HOP|g; s|$EDGE_METRICS_CANDIDATE|MPORT|g; s|run/candidate|run/X|g" "$bundle/candidate/nginx.conf") \
     <(sed -e "s|$eport|PORT|g; s|$hop1|HOP|g; s|$EDGE_METRICS_LIVE|MPORT|g; s|run/live|run/X|g" "$bundle/nginx.conf") \
  | grep '^[<>]' | grep -v 'listen 127.0.0.1:[0-9]*\( ssl http2\( proxy_protocol\)\?\)\? default_server;' || true
# The log phase's Lua alone, timed inside the live worker (monotonic
# clock, 100,000 calls in one request: $edge_metrics read and counted).
python3 - "$bundle/nginx.conf" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
bench = r"""
        location = /_bench_metrics_log {
            content_by_lua_block {
                local ffi = require "ffi"
                pcall(ffi.cdef, "typedef struct { long s; long ns; } bench_ts; int clock_gettime(int, bench_ts *);")
                local t = ffi.new("bench_ts")
                local function us() ffi.C.clock_gettime(1, t) return tonumber(t.s) * 1e6 + tonumber(t.ns) / 1e3 end
                local m = require "edge_metrics"
                local n = 100000
                local a = us()
                for _ = 1, n do m.log() end
                local per = (us() - a) / n
                local f = us(); m.flush(); local fl = us() - f
                ngx.say(string.format("%.3f %.0f", per, fl))
            }
        }
"""
s = s.replace("        # The control plane's read API", bench + "        # The control plane's read API", 1)
open(p, "w").write(s)
PY
EDGEFORM_CHALLENGE_SECRET=bench taskset -c 1 nginx -p "$bundle/" -c "$bundle/nginx.conf" & SERVER_PIDS+=($!)
EDGEFORM_CHALLENGE_SECRET=bench taskset -c 1 nginx -p "$bundle/" -c "$bundle/candidate/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$eport"; wait_port "$pport"
sleep 0.5
for p in "$eport" "$pport"; do
  for _ in 1 2; do curl -s -o /dev/null -H 'Host: bench.test' "http://127.0.0.1:$p/a.mp4"; done
  st=$(curl -s -o /dev/null -D - -H 'Host: bench.test' "http://127.0.0.1:$p/a.mp4" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-cache-status"{print $2}')
  [ "$st" = HIT ] || { echo "port $p: expected a cache HIT, got '$st'" >&2; exit 1; }
done
read -r per_log flush_us < <(curl -s -H 'Host: bench.test' "http://127.0.0.1:$eport/_bench_metrics_log")
echo "log phase's Lua (read \$edge_metrics, count it): ${per_log} us per request (100,000 in one worker); the flush after them: ${flush_us} us"
ew=$(worker_of "$work/root/run/live"); pw=$(worker_of "$work/root/run/candidate")
# One round: requests/s and the worker's CPU microseconds per request
# (robust when other processes share the machine).
run_wrk() { # port worker-pid
  local t0 t1 out
  t0=$(ticks "$2")
  out=$(taskset -c 0 wrk -t1 -c32 -d"${secs}s" -H 'Host: bench.test' "http://127.0.0.1:$1/a.mp4")
  t1=$(ticks "$2")
  python3 - "$out" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import re, sys
out, t0, t1, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n = int(re.search(r"(\d+) requests in", out).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
print(f"{rps:.0f} {(t1 - t0) / hz / n * 1e6:.2f}")
PY
}
on=(); off=(); ratios=(); con=(); coff=(); cdiff=()
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then
    read -r a ca < <(run_wrk "$eport" "$ew"); read -r b cb < <(run_wrk "$pport" "$pw")
  else
    read -r b cb < <(run_wrk "$pport" "$pw"); read -r a ca < <(run_wrk "$eport" "$ew")
  fi
  on+=("$a"); off+=("$b"); con+=("$ca"); coff+=("$cb")
  ratios+=("$(python3 -c "print($a/$b)")"); cdiff+=("$(python3 -c "print($ca-$cb)")")
  echo "  round $i: metrics on $a req/s ($ca us CPU/req), metrics off $b req/s ($cb us CPU/req)" >&2
done
# The live instance counted every request (what it served, not a guess).
count=$(curl -s "http://127.0.0.1:$EDGE_METRICS_LIVE/metrics" | awk -F' ' '/^edgeform_site_requests_total\{.*host="bench.test",class="2xx"\}/{print $2}')
off_count=$(curl -s "http://127.0.0.1:$EDGE_METRICS_CANDIDATE/metrics" | grep -c '^edgeform_site_requests_total' || true)
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "rounds: $rounds x ${secs}s each side, alternating, wrk -t1 -c32, cache HITs"
echo "metrics on:  $(median "${on[@]}") req/s (median of $rounds); requests counted: $count"
echo "metrics off: $(median "${off[@]}") req/s (median of $rounds); series exported: $off_count"
echo "ratio on/off: $(median "${ratios[@]}") (median of per-round ratios; goal >= 0.93)"
echo "worker CPU per request: on $(median "${con[@]}") us, off $(median "${coff[@]}") us; the metrics' cost $(median "${cdiff[@]}") us (median of per-round differences)"
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
