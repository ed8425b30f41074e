#!/usr/bin/env bash
# The reference edge under load (bench/RESULTS.md): wrk against the edge
# serving cache HITs with the Lua access phase (documents cached per
# worker) vs the same nginx.conf without it (access
# phases removed, upstream fixed), same origin, same cache, one worker
# each pinned to CPU 1, wrk pinned to CPU 0. Then `edgeform explain
# --batch` per-request cost over 200,000 requests.
#
#   bench/edge.sh [seconds per round, default 10] [rounds, default 3] [http|https]
#
# https: the same three instances over their TLS listeners (the site has
# a certificate, pushed by apply; every instance keeps the Lua certificate
# phase), h2load -t1 -c32 -m1 keep-alive HTTP/2 instead of wrk: the Lua
# access phase's cost on HTTPS keep-alive requests.
#
# EDGEFORM=PATH uses that binary (no release build; it only applies and
# builds the repository, and `explain --batch` is timed only for a release
# build).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/edgelib.sh
secs=${1:-10}; rounds=${2:-3}; scheme=${3:-http}
case "$scheme" in
  http) need_packages "${BUILD_PACKAGES[@]}" "${EDGE_PACKAGES[@]}" redis-server ;;
  https) need_packages "${BUILD_PACKAGES[@]}" "${EDGE_PACKAGES[@]}" redis-server nghttp2-client ;;
  *) echo "usage: bench/edge.sh [seconds] [rounds] [http|https]" >&2; exit 64 ;;
esac
if [ -z "${EDGEFORM:-}" ]; then
  cargo build --release --quiet --locked -p edgeform
  EDGEFORM=target/release/edgeform
fi
echo "load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
work=$(mktemp -d)
# The origin's worker (not root) reads its body from here.
chmod 755 "$work"
trap 'stop_servers; rm -rf "$work"' EXIT
SERVER_DIR="$work"
free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rport=$(free); oport=$(free); eport=$(free); pport=$(free); hop1=$(free); hop2=$(free)
# The TLS listeners: live (the edge), candidate (without Lua), the empty-phase instance.
ehttps=$(free); eproxy=$(free); phttps=$(free); pproxy=$(free); fhttps=$(free); fproxy=$(free)
start_redis "$rport"

# The origin: nginx answering a fixed 2 KiB body (not what is measured).
mkdir -p "$work/origin"
head -c 2048 /dev/zero | tr '\0' x > "$work/origin/body"
cat > "$work/origin/nginx.conf" <<CONF
worker_processes 1; daemon off; pid $work/origin/nginx.pid; error_log $work/origin/error.log;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$oport; root $work/origin; location / { try_files /body =404; } } }
CONF
nginx -p "$work/origin" -c "$work/origin/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$oport"

# A repository with one site in front of that origin, applied to Redis.
repo="$work/repo"; mkdir -p "$repo/sites" "$repo/nodes"
echo "name: bench" > "$repo/cluster.yaml"
# The edge is the edge role's bundle (roles/edge/, as installed), built
# by `edgeform build`: live on $eport (the edge), candidate on $pport (made
# the edge without Lua below), pid files and logs under $work/root/run/.
cp -r roles "$repo/roles"
edge_node "$repo" "$rport" "$work" "$eport" "$pport" "$hop1" "$hop2" "$ehttps" "$eproxy" "$phttps" "$pproxy"
cat > "$repo/sites/bench.yaml" <<YAML
host: bench.test
origin: http://127.0.0.1:$oport
loopback: true
geo_mode: block
geo_codes: [RU, CN]
waf_mode: detect
cors_mode: permissive
cache_rules:
  - {match_type: ext, match_value: .mp4, action: ttl, ttl: 86400}
edge_rules:
  - {match_type: prefix, match_value: /old/, action: redirect, redirect_status: 301}
YAML
if [ "$scheme" = https ]; then
  # The site's certificate, imported and pushed as on a control host; the
  # edge declares that its code serves certificates (edgeform:bundle, as
  # `edgeform install` writes it).
  export EDGEFORM_STATE_DIR="$work/state"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
    -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
    -keyout "$work/site.key" -out "$work/site.crt" >/dev/null 2>&1
  "$EDGEFORM" certs import bench --repo "$repo" --cert "$work/site.crt" --key "$work/site.key" >/dev/null 2>&1
  echo "tls: {certificate: bench}" >> "$repo/sites/bench.yaml"
  fields=$(python3 -c 'import sys; b = open(sys.argv[1]).read().split("\n  FIELDS = {\n")[1].split("\n  },")[0]
print(",".join(l.strip().split(" = ")[0] for l in b.splitlines() if " = " in l))' roles/edge/lua/edge_tables.lua)
  redis-cli -p "$rport" hset edgeform:bundle site_fields "$fields" tls 1 >/dev/null
fi
"$EDGEFORM" --repo "$repo" apply --yes >/dev/null 2>&1 || { "$EDGEFORM" --repo "$repo" apply --yes; exit 1; }

"$EDGEFORM" --repo "$repo" build --out "$work/out" >/dev/null 2>&1
bundle="$work/out/bundles/edge-1"
mkdir -p "$work/cache" "$work/root/run/live" "$work/root/run/candidate" "$work/edge" "$work/plain" "$work/root/tls"
edge_placeholder "$work"
cp "$bundle/nginx.conf" "$work/edge/nginx.conf"
cp "$bundle/candidate/nginx.conf" "$work/plain/nginx.conf"
# A third instance, from the candidate's: its own ports, TTL hop and run folder.
fport=$(free); hop3=$(free)
mkdir -p "$work/root/run/empty" "$work/empty"
sed -e "s|127.0.0.1:$pport|127.0.0.1:$fport|g" -e "s|$hop2|$hop3|g" \
  -e "s|127.0.0.1:$phttps|127.0.0.1:$fhttps|g" -e "s|127.0.0.1:$pproxy|127.0.0.1:$fproxy|g" \
  -e "s|127.0.0.1:$EDGE_METRICS_CANDIDATE;|127.0.0.1:$(free);|g" \
  -e "s|$work/root/run/candidate|$work/root/run/empty|g" "$bundle/candidate/nginx.conf" > "$work/empty/nginx.conf"
# The same configuration without the Lua access phase; and with an empty
# one (`return`: the fixed cost of running any Lua phase at all).
python3 - "$work/plain/nginx.conf" "$oport" "$work/empty/nginx.conf" <<'PY'
import sys, re
for p, empty in ((sys.argv[1], False), (sys.argv[3], True)):
    port = sys.argv[2]
    s = open(p).read()
    s = re.sub(r'\n\s*access_by_lua_block \{[^}]*\}', '', s)
    s = re.sub(r'\n\s*header_filter_by_lua_block \{[^}]*\}', '', s)
    s = s.replace('set $edge_upstream "";', 'set $edge_upstream "http://127.0.0.1:%s";' % port)
    s = s.replace('set $edge_origin_host "";', 'set $edge_origin_host "bench.test";')
    s = s.replace('set $edge_nocache "1";', 'set $edge_nocache "0";')
    if empty:
        s = s.replace('            proxy_pass $edge_upstream;',
                      '            access_by_lua_block { return }\n            proxy_pass $edge_upstream;', 1)
    open(p, 'w').write(s)
PY
grep -q access_by_lua "$work/plain/nginx.conf" && { echo "plain config still has Lua" >&2; exit 1; }
grep -q 'access_by_lua_block { return }' "$work/empty/nginx.conf" || { echo "no empty Lua phase" >&2; exit 1; }
grep -q "$work/root/run/empty" "$work/empty/nginx.conf" || { echo "the empty instance's run folder" >&2; exit 1; }
# The document lookup alone, timed inside the edge's worker (monotonic clock).
python3 - "$work/edge/nginx.conf" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
bench = r"""
        location = /_bench_lookup {
            content_by_lua_block {
                local ffi = require "ffi"
                pcall(ffi.cdef, "typedef struct { long s; long ns; } bench_ts; int clock_gettime(int, bench_ts *);")
                local t = ffi.new("bench_ts")
                local function us() ffi.C.clock_gettime(1, t) return tonumber(t.s) * 1e6 + tonumber(t.ns) / 1e3 end
                local r = require "cdn_router"
                -- cold: nil (worker cache hit), "worker" (the worker's cache
                -- emptied: from the workers' shared cache), "all" (both
                -- emptied: MGET from Redis).
                local function p50(n, cold)
                    local v = {}
                    for i = 1, n do
                        if cold then r.forget(cold == "all") end
                        local a = us(); r.lookup("bench.test"); v[i] = us() - a
                    end
                    table.sort(v)
                    return v[math.floor(n / 2)], v[math.floor(n * 0.99)]
                end
                r.lookup("bench.test")
                local c50, c99 = p50(100000, nil)
                local s50, s99 = p50(5000, "worker")
                local m50, m99 = p50(5000, "all")
                ngx.say(string.format("cached %.2f %.2f shared %.1f %.1f miss %.1f %.1f",
                    c50, c99, s50, s99, m50, m99))
            }
        }
"""
s = s.replace("        # The control plane's read API", bench + "        # The control plane's read API", 1)
open(p, "w").write(s)
PY
EDGEFORM_CHALLENGE_SECRET=bench taskset -c 1 nginx -p "$bundle/" -c "$work/edge/nginx.conf" & SERVER_PIDS+=($!)
taskset -c 1 nginx -p "$bundle/" -c "$work/plain/nginx.conf" & SERVER_PIDS+=($!)
taskset -c 1 nginx -p "$bundle/" -c "$work/empty/nginx.conf" & SERVER_PIDS+=($!)
wait_port "$eport"; wait_port "$pport"; wait_port "$fport"
sleep 0.5
if [ "$scheme" = https ]; then ports=("$ehttps" "$phttps" "$fhttps"); else ports=("$eport" "$pport" "$fport"); fi
for p in "${ports[@]}"; do
  wait_port "$p"
  url="$scheme://bench.test:$p/a.mp4"
  for _ in 1 2; do curl -sk -o /dev/null --resolve "bench.test:$p:127.0.0.1" "$url"; done
  st=$(curl -sk -o /dev/null -w '%{http_code} %{size_download} ' -D - --resolve "bench.test:$p:127.0.0.1" "$url" \
    | tr -d '\r' | awk -F': ' 'tolower($1)=="x-cache-status"{h=$2} /^[0-9]+ [0-9]+ $/{s=$0} END{print s h}')
  [ "$st" = "200 2048 HIT" ] || { echo "$url: expected 200, 2 KiB, a cache HIT; got '$st'" >&2; exit 1; }
done

read -r _ c50 c99 _ s50 s99 _ m50 m99 < <(curl -s -H 'Host: bench.test' "http://127.0.0.1:$eport/_bench_lookup")
echo "document lookup (per worker cache hit): p50 ${c50} us, p99 ${c99} us"
echo "document lookup (worker cache miss, from the workers' shared cache: copy, parse, prepare): p50 ${s50} us, p99 ${s99} us (goal p50 <= 50 us)"
echo "document lookup (both missed: MGET from local Redis, parse, prepare): p50 ${m50} us, p99 ${m99} us"
# The one worker of an nginx master (not the cache manager/loader).
ew=$(worker_of "$work/root/run/live"); pw=$(worker_of "$work/root/run/candidate"); fw=$(worker_of "$work/root/run/empty")
# One round: requests/s and the worker's CPU microseconds per request
# (utime + stime from /proc: robust when other processes share the CPU).
# https: h2load, keep-alive HTTP/2 over the TLS listener, SNI and
# :authority bench.test, one request at a time per connection as wrk's
# (each run's 32 first requests pay a full handshake: 32 of 32,000).
run_wrk() { # http port, worker-pid
  local t0 t1 out p
  p=$1; [ "$scheme" = https ] && case "$1" in "$eport") p=$ehttps;; "$pport") p=$phttps;; "$fport") p=$fhttps;; esac
  t0=$(ticks "$2")
  if [ "$scheme" = https ]; then
    # Runs of 32 clients x 1,000 requests (nginx ends a keep-alive
    # connection after 1,000: keepalive_requests; h2load's -D never ends
    # once a client reconnects) until $secs s have passed.
    out=""; local end=$((SECONDS + secs))
    while [ "$SECONDS" -lt "$end" ]; do
      out+=$(taskset -c 0 h2load -t1 -c32 -m1 -n 32000 --connect-to="127.0.0.1:$p" https://bench.test/a.mp4 2>&1 || true)
      out+=$'\x01'
    done
  else
    out=$(taskset -c 0 wrk -t1 -c32 -d"${secs}s" -H 'Host: bench.test' "http://127.0.0.1:$p/a.mp4")
  fi
  t1=$(ticks "$2")
  python3 - "$out" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import re, sys
out, t0, t1, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = re.search(r"(\d+) requests in", out)
if m:  # wrk
    n = int(m.group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
else:  # h2load runs: 2xx only, none failed; its own clock, summed
    n = t = 0
    for run in out.split("\x01"):
        if not run.strip():
            continue
        m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", run)
        if not m or int(m.group(1)) == 0 or int(m.group(2)) > 0:
            sys.exit("h2load: " + run[-600:])
        n += int(m.group(1))
        f = re.search(r"finished in ([\d.]+)(m?s)", run)
        t += float(f.group(1)) / (1000 if f.group(2) == "ms" else 1)
    rps = n / t
print(f"{rps:.0f} {(t1 - t0) / hz / n * 1e6:.2f}")
PY
}
if [ "$scheme" = https ]; then
  echo "h2load over TLS (HTTP/2): ${rounds} rounds of ${secs}s each side, interleaved, 1 thread, 32 connections, 1 stream each, cache HITs" >&2
else
  echo "wrk: ${rounds} rounds of ${secs}s each side, interleaved, 1 thread, 32 connections, cache HITs" >&2
fi
ratios=(); cpu_e=(); cpu_p=(); cpu_f=(); rps_e=(); rps_p=(); rps_f=(); diff=(); fixed=()
for i in $(seq 1 "$rounds"); do
  read -r re ce < <(run_wrk "$eport" "$ew"); read -r rp cp < <(run_wrk "$pport" "$pw")
  read -r rf cf < <(run_wrk "$fport" "$fw")
  rps_e+=("$re"); rps_p+=("$rp"); rps_f+=("$rf"); cpu_e+=("$ce"); cpu_p+=("$cp"); cpu_f+=("$cf")
  ratios+=("$(python3 -c "print($re/$rp)")")
  diff+=("$(python3 -c "print($ce-$cp)")"); fixed+=("$(python3 -c "print($cf-$cp)")")
  echo "  round $i: edge $re req/s ($ce us CPU/req), without Lua $rp req/s ($cp us CPU/req), empty Lua phase $rf req/s ($cf us CPU/req)" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
python3 - "$(median "${rps_e[@]}")" "$(median "${rps_p[@]}")" "$(median "${ratios[@]}")" \
  "$(median "${cpu_e[@]}")" "$(median "${cpu_p[@]}")" "$(median "${rps_f[@]}")" "$(median "${cpu_f[@]}")" \
  "$(median "${diff[@]}")" "$(median "${fixed[@]}")" "$scheme" <<'PY'
import sys
e, p, r, ce, cp, f, cf, d, fx = map(float, sys.argv[1:10])
print(f"scheme: {sys.argv[10]}")
print(f"edge (Lua access phase, documents cached): {e:,.0f} req/s, {ce:.1f} us worker CPU per request")
print(f"same nginx.conf without the Lua phase:     {p:,.0f} req/s, {cp:.1f} us worker CPU per request")
print(f"same nginx.conf, an empty Lua phase:       {f:,.0f} req/s, {cf:.1f} us worker CPU per request")
print(f"throughput ratio (median of per-round ratios): {r:.2f} (goal >= 0.85); CPU ratio without/with Lua: {cp/ce:.2f}")
print(f"Lua access phase: {d:.1f} us CPU per request (median of per-round differences; lookup + decision + headers; goal <= 5),"
      f" of which {fx:.1f} us any Lua phase costs (empty phase - none)")
PY

echo "load at the end of the wrk rounds: $(cut -d' ' -f1-3 /proc/loadavg)"

case "$EDGEFORM" in */release/*) ;; *) echo "explain --batch: not timed ($EDGEFORM is not a release build)"; exit 0;; esac
# explain --batch: 200,000 requests after the compile.
python3 - "$work/req.jsonl" <<'PY'
import json, sys, random
r = random.Random(7)
paths = ["/", "/a.mp4", "/old/x?y=1", "/img/p.jpg", "/?q=<script>", "/api/v1"]
ips = ["81.2.69.142", "175.16.199.1", "89.160.20.128", "8.8.8.8", "2001:480:10::1"]
with open(sys.argv[1], "w") as f:
    for i in range(200000):
        f.write(json.dumps({"host": "bench.test", "url": r.choice(paths), "ip": r.choice(ips),
                            "method": "GET", "id": i}) + "\n")
PY
head -1 "$work/req.jsonl" > "$work/one.jsonl"
# Wall and CPU (user + system) seconds of one run.
t() { python3 -c '
import resource, subprocess, sys, time
r0 = resource.getrusage(resource.RUSAGE_CHILDREN); t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
print(time.perf_counter() - t, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))' "$@"; }
geo="$PWD/testdata/geoip/GeoLite2-City-Test.mmdb"
one=(); all=(); onec=(); allc=()
for _ in 1 2 3; do
  read -r w c < <(t "$EDGEFORM" --repo "$repo" explain --batch "$work/one.jsonl" --geoip "$geo"); one+=("$w"); onec+=("$c")
  read -r w c < <(t "$EDGEFORM" --repo "$repo" explain --batch "$work/req.jsonl" --geoip "$geo"); all+=("$w"); allc+=("$c")
done
python3 - "$(median "${one[@]}")" "$(median "${all[@]}")" "$(median "${onec[@]}")" "$(median "${allc[@]}")" <<'PY'
import sys
one, full, onec, fullc = map(float, sys.argv[1:5])
print(f"explain --batch: 200,000 requests in {full:.2f} s wall ({fullc:.2f} s CPU); startup + compile "
      f"{one*1000:.0f} ms; per request {(full-one)/200000*1e6:.2f} us wall, "
      f"{(fullc-onec)/200000*1e6:.2f} us CPU (goal <= 5)")
PY
