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
EDGEFORM_CHALLENGE_SECRET=bench taskset -c 1 nginx -p "$bundle/" -c "$bundle/nginx.conf" & SERVER_PIDS+=($!)
EDGEFORM_CHALLENGE_SECRET=bench taskset -c 1 nginx -p "$bundle/" -c "$bundle/candidate/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$eport"; wait_port "$pport"
sleep 0.5
for p in "$eport" "$pport"; do
  for _ in 1 2; do curl -s -o /dev/null -H 'Host: bench.test' "http://127.0.0.1:$p/a.mp4"; done
  st=$(curl -s -o /dev/null -D - -H 'Host: bench.test' "http://127.0.0.1:$p/a.mp4" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-cache-status"{print $2}')
  [ "$st" = HIT ] || { echo "port $p: expected a cache HIT, got '$st'" >&2; exit 1; }
done
run_wrk() {
  taskset -c 0 wrk -t1 -c32 -d"${secs}s" -H 'Host: bench.test' "http://127.0.0.1:$1/a.mp4" \
    | awk '/Requests\/sec/{print $2}'
}
on=(); off=(); ratios=()
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then a=$(run_wrk "$eport"); b=$(run_wrk "$pport"); else b=$(run_wrk "$pport"); a=$(run_wrk "$eport"); fi
  on+=("$a"); off+=("$b"); ratios+=("$(python3 -c "print($a/$b)")")
  echo "  round $i: metrics on $a req/s, metrics off $b req/s" >&2
done
# The live instance counted every request (what it served, not a guess).
count=$(curl -s "http://127.0.0.1:$EDGE_METRICS_LIVE/metrics" | awk -F' ' '/^edgeform_site_requests_total\{.*host="bench.test",class="2xx"\}/{print $2}')
off_count=$(curl -s "http://127.0.0.1:$EDGE_METRICS_CANDIDATE/metrics" | grep -c '^edgeform_site_requests_total' || true)
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "metrics on:  $(median "${on[@]}") req/s (median of $rounds); requests counted: $count"
echo "metrics off: $(median "${off[@]}") req/s (median of $rounds); series exported: $off_count"
echo "ratio on/off: $(median "${ratios[@]}") (median of per-round ratios; goal >= 0.93)"
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
