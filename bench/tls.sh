#!/usr/bin/env bash
# The reference edge's TLS (bench/RESULTS.md, "The edge's TLS"), measured
# side by side in one run, one nginx worker each pinned to CPU 1, the load
# generators pinned to CPU 0:
#
# 1. new TLS handshakes: the edge as shipped (certificate by SNI from
#    Redis, ssl_certificate_by_lua, the worker's cache) vs the same
#    nginx.conf with the same certificate as a static `ssl_certificate`
#    (no Lua certificate phase). h2load, HTTP/1.1 over TLS, every request
#    `Connection: close`: full handshakes with one connection per client
#    (-c 100 -n 100, repeated), resumed ones with clients that reconnect
#    (h2load resumes its previous session: a TLS 1.3 ticket). Each request
#    is `GET /_hs` answered `204` by a bench-only location without a Lua
#    phase, so the figure is the handshake's.
# 2. h2 requests/s through the edge (cached HITs, keep-alive, h2load,
#    HTTPS on the edge's TLS listener) vs the same edge over plain HTTP
#    (h2load --h1, keep-alive), and HTTP/1.1 over TLS beside.
# 3. the certificate lookup, timed inside the worker with a monotonic
#    clock: edge_tls.lookup from the worker's cache (100,000 calls), after
#    emptying the worker's caches (MGET from the local Redis + parse), and
#    the whole ssl_certificate_by_lua phase of every handshake of 1.
#
#   bench/tls.sh [seconds per round, default 10] [rounds, default 3]
#
# CPU per handshake/request is the worker's utime + stime from /proc over
# what the client counted: steadier than rates on a shared machine.
# EDGEFORM=PATH uses that binary (it only applies and builds: a debug
# build will do); without it a release build is made.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
. bench/edgelib.sh
need_packages "${BUILD_PACKAGES[@]}" "${EDGE_PACKAGES[@]}" redis-server nghttp2-client python3
secs=${1:-10}; rounds=${2:-3}
if [ -z "${EDGEFORM:-}" ]; then
  cargo build --release --quiet --locked -p edgeform
  EDGEFORM=target/release/edgeform
fi
echo "load at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
work=$(mktemp -d)
trap 'stop_servers; rm -rf "$work"' EXIT
SERVER_DIR="$work"
# The origin's worker runs as nobody: it must reach its folder in here.
chmod 755 "$work"
free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
rport=$(free); oport=$(free)
eport=$(free); ehttps=$(free); eproxy=$(free); hop1=$(free)
sport=$(free); shttps=$(free); sproxy=$(free); hop2=$(free)
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

# The site's certificate: P-256 (as the tests and the placeholder),
# imported and pushed as on a control host (`certs import`, `apply`).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
  -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
  -keyout "$work/site.key" -out "$work/site.crt" >/dev/null 2>&1
repo="$work/repo"; mkdir -p "$repo/sites" "$repo/nodes"
export EDGEFORM_STATE_DIR="$work/state"
echo "name: bench" > "$repo/cluster.yaml"
cp -r roles "$repo/roles"
"$EDGEFORM" certs import bench --repo "$repo" --cert "$work/site.crt" --key "$work/site.key" >/dev/null 2>&1
edge_node "$repo" "$rport" "$work" "$eport" "$sport" "$hop1" "$hop2" "$ehttps" "$eproxy" "$shttps" "$sproxy"
cat > "$repo/sites/bench.yaml" <<YAML
host: bench.test
origin: http://127.0.0.1:$oport
loopback: true
tls: {certificate: bench}
geo_mode: block
geo_codes: [RU, CN]
waf_mode: detect
cors_mode: permissive
cache_rules:
  - {match_type: ext, match_value: .mp4, action: ttl, ttl: 86400}
edge_rules:
  - {match_type: prefix, match_value: /old/, action: redirect, redirect_status: 301}
YAML
# What the installed edge's code reads (edgeform:bundle, as `edgeform
# install` declares it; the harness does the same): every document field
# of edge_tables.lua, and certificates.
fields=$(python3 -c 'import sys; b = open(sys.argv[1]).read().split("\n  FIELDS = {\n")[1].split("\n  },")[0]
print(",".join(l.strip().split(" = ")[0] for l in b.splitlines() if " = " in l))' roles/edge/lua/edge_tables.lua)
redis-cli -p "$rport" hset edgeform:bundle site_fields "$fields" tls 1 >/dev/null
"$EDGEFORM" --repo "$repo" apply --yes >/dev/null 2>&1 || { "$EDGEFORM" --repo "$repo" apply --yes; exit 1; }
[ "$(redis-cli -p "$rport" exists tls:bench.test)" = 1 ] || { echo "apply wrote no tls:bench.test" >&2; exit 1; }
"$EDGEFORM" --repo "$repo" build --out "$work/out" >/dev/null 2>&1
bundle="$work/out/bundles/edge-1"
mkdir -p "$work/cache" "$work/root/run/live" "$work/root/run/candidate" "$work/edge" "$work/static" "$work/root/tls"
edge_placeholder "$work"
# edge: the live instance as shipped, plus bench-only locations (/_hs, the
# lookup timer) and a timer around its certificate phase. static: the
# candidate instance (own ports, hop, run folder; the same template) with
# the Lua certificate phase removed and the site's certificate as the
# listener's ssl_certificate.
python3 - "$bundle/nginx.conf" "$work/edge/nginx.conf" "$bundle/candidate/nginx.conf" "$work/static/nginx.conf" \
  "$work/site.crt" "$work/site.key" <<'PY'
import sys
live, edge_out, cand, static_out, crt, key = sys.argv[1:7]
hs = "        location = /_hs { return 204; }\n"
anchor = "        # The control plane's read API"
phase = '        ssl_certificate_by_lua_block { require("edge_tls").certificate() }\n'
timed = r"""        ssl_certificate_by_lua_block {
            local b = package.loaded.bench_tls_timer
            if not b then
                local ffi = require "ffi"
                pcall(ffi.cdef, "typedef struct { long s; long ns; } bench_ts; int clock_gettime(int, bench_ts *);")
                local t = ffi.new("bench_ts")
                b = { n = 0, v = {}, us = function() ffi.C.clock_gettime(1, t) return tonumber(t.s) * 1e6 + tonumber(t.ns) / 1e3 end }
                package.loaded.bench_tls_timer = b
            end
            local a = b.us()
            require("edge_tls").certificate()
            b.n = b.n + 1
            b.v[(b.n - 1) % 200000 + 1] = b.us() - a
        }
"""
report = r"""        location = /_bench_cert {
            content_by_lua_block {
                local ffi = require "ffi"
                pcall(ffi.cdef, "typedef struct { long s; long ns; } bench_ts; int clock_gettime(int, bench_ts *);")
                local t = ffi.new("bench_ts")
                local function us() ffi.C.clock_gettime(1, t) return tonumber(t.s) * 1e6 + tonumber(t.ns) / 1e3 end
                local tls = require "edge_tls"
                local function pct(v)
                    table.sort(v)
                    local n = #v
                    if n == 0 then return 0, 0 end
                    return v[math.max(1, math.floor(n / 2))], v[math.max(1, math.floor(n * 0.99))]
                end
                local args = ngx.req.get_uri_args()
                if args.phase then
                    local b = package.loaded.bench_tls_timer or { n = 0, v = {} }
                    local v = {}
                    for i = 1, #b.v do v[i] = b.v[i] end
                    local p50, p99 = pct(v)
                    ngx.say(string.format("phase %d %.2f %.2f", b.n, p50, p99))
                    return
                end
                -- From the worker's cache, then with the worker's caches
                -- emptied before each call (MGET from Redis, parse, PEMs).
                assert(tls.lookup("bench.test"), "no certificate for bench.test")
                local v = {}
                for i = 1, 100000 do local a = us(); tls.lookup("bench.test"); v[i] = us() - a end
                local c50, c99 = pct(v)
                v = {}
                for i = 1, 2000 do tls.forget(); local a = us(); tls.lookup("bench.test"); v[i] = us() - a end
                local m50, m99 = pct(v)
                -- The miss's steps alone, on the stored text.
                local ssl, pick = require "ngx.ssl", require "edge_tls_pick"
                local r = assert(require("cdn_router").redis())
                local text = r:get("tls:bench.test")
                require("cdn_router").release(r)
                local doc = assert(pick.parse(text))
                local function step(f)
                    local w = {}
                    for i = 1, 500 do local a = us(); f(); w[i] = us() - a end
                    return (pct(w))
                end
                local j = step(function() pick.parse(text) end)
                local c = step(function() assert(ssl.parse_pem_cert(doc.chain)) end)
                local k = step(function() assert(ssl.parse_pem_priv_key(doc.key)) end)
                ngx.say(string.format("cached %.3f %.3f miss %.1f %.1f json %.1f cert %.1f key %.1f", c50, c99, m50, m99, j, c, k))
            }
        }
"""
s = open(live).read()
assert phase in s and anchor in s
s = s.replace(phase, timed, 1).replace(anchor, hs + report + anchor, 1)
open(edge_out, "w").write(s)
s = open(cand).read()
assert phase in s and anchor in s
s = s.replace(phase, "", 1).replace(anchor, hs + anchor, 1)
import re
s, n = re.subn(r"ssl_certificate \S+;", "ssl_certificate %s;" % crt, s)
assert n == 1
s, n = re.subn(r"ssl_certificate_key \S+;", "ssl_certificate_key %s;" % key, s)
assert n == 1
open(static_out, "w").write(s)
PY
grep -q ssl_certificate_by_lua "$work/static/nginx.conf" && { echo "static config still has the Lua certificate phase" >&2; exit 1; }
taskset -c 1 nginx -p "$bundle/" -c "$work/edge/nginx.conf" & SERVER_PIDS+=($!)
taskset -c 1 nginx -p "$bundle/" -c "$work/static/nginx.conf" & SERVER_PIDS+=($!)
for p in "$eport" "$ehttps" "$sport" "$shttps"; do wait_port "$p"; done
sleep 0.5
# Both serve bench.test's certificate and a cached HIT.
fp() { openssl x509 -noout -fingerprint -sha256; }
want=$(fp < "$work/site.crt")
for p in "$ehttps" "$shttps"; do
  got=$(openssl s_client -connect "127.0.0.1:$p" -servername bench.test </dev/null 2>/dev/null | fp)
  [ "$got" = "$want" ] || { echo "port $p: not the site's certificate ($got)" >&2; exit 1; }
done
for url in "http://bench.test:$eport" "https://bench.test:$ehttps"; do
  for _ in 1 2; do curl -sk -o /dev/null --resolve "bench.test:${url##*:}:127.0.0.1" "$url/a.mp4"; done
  st=$(curl -sk -o /dev/null -w '%{http_code} %{size_download} ' -D - --resolve "bench.test:${url##*:}:127.0.0.1" "$url/a.mp4" \
    | tr -d '\r' | awk -F': ' 'tolower($1)=="x-cache-status"{h=$2} /^[0-9]+ [0-9]+ $/{s=$0} END{print s h}')
  [ "$st" = "200 2048 HIT" ] || { echo "$url: expected 200, 2 KiB, a cache HIT; got '$st'" >&2; exit 1; }
done

worker_of() { local m; m=$(cat "$1/nginx.pid"); for c in $(cat "/proc/$m/task/$m/children"); do
  grep -q "worker process" "/proc/$c/cmdline" 2>/dev/null && echo "$c"; done; true; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ew=$(worker_of "$work/root/run/live"); sw=$(worker_of "$work/root/run/candidate")
hz=$(getconf CLK_TCK)

# h2load runs → "<rate> <us worker CPU per unit>", unit = requests (with
# Connection: close, connections), rate from h2load's own clock (the sum
# of its runs' times, not process start-up). `h2loop pid args` repeats a
# run of a fixed -n until $secs s have passed (h2load's -D never ends once
# a client reconnects, and nginx ends a keep-alive connection after 1,000
# requests: keepalive_requests).
h2sum() { # t0 t1 outputs-file
  python3 - "$1" "$2" "$hz" "$3" <<'PY'
import re, sys
t0, t1, hz, outs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), open(sys.argv[4]).read()
n = secs = 0
for run in outs.split("\x00"):
    if not run.strip():
        continue
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", run)
    if not m or int(m.group(2)) == 0 or int(m.group(3)) > 0:
        sys.exit("h2load: " + run[-800:])
    n += int(m.group(2))
    t = re.search(r"finished in ([\d.]+)(m?s)", run)
    secs += float(t.group(1)) / (1000 if t.group(2) == "ms" else 1)
print(f"{n / secs:.0f} {(t1 - t0) / hz / n * 1e6:.1f}")
PY
}
h2loop() { # worker-pid h2load-args...
  local w=$1 t0 t1 end; shift
  : > "$work/h2.out"
  end=$((SECONDS + secs))
  t0=$(ticks "$w")
  while [ "$SECONDS" -lt "$end" ]; do
    taskset -c 0 h2load -t1 "$@" >> "$work/h2.out" 2>&1 || true
    printf '\0' >> "$work/h2.out"
  done
  t1=$(ticks "$w")
  h2sum "$t0" "$t1" "$work/h2.out"
}

read -r _ c50 c99 _ m50 m99 _ sj _ sc _ sk < <(curl -s -H 'Host: bench.test' "http://127.0.0.1:$eport/_bench_cert")
echo "certificate lookup (edge_tls.lookup, worker cache hit): p50 ${c50} us, p99 ${c99} us (goal p50 <= 20 us)"
echo "certificate lookup (worker caches emptied: MGET from local Redis, parse, PEMs): p50 ${m50} us, p99 ${m99} us"
echo "  of which (p50 of 500 each): the document's JSON ${sj} us, parse_pem_cert ${sc} us, parse_pem_priv_key ${sk} us"

# Does a resumed handshake run the certificate phase? Its count around
# one h2load run of 4,000 reconnecting requests.
phase_count() { curl -s -H 'Host: bench.test' "http://127.0.0.1:$eport/_bench_cert?phase=1" | cut -d' ' -f2; }
n0=$(phase_count)
taskset -c 0 h2load -t1 --h1 -c 32 -n 4000 -H 'Connection: close' --connect-to="127.0.0.1:$ehttps" https://bench.test/_hs >/dev/null 2>&1
echo "certificate phases run for 4,000 handshakes of 32 reconnecting clients (h2load resumes its session): $(($(phase_count) - n0))"
# Full handshakes: every h2load client makes one connection (h2load
# resumes its own session when it reconnects), 100 at once.
full=(--h1 -c 100 -n 100 -H 'Connection: close')
# Resumed: 32 clients reconnecting after every request (each the TLS 1.3
# ticket of its previous connection: 32 of every 4,000 handshakes full).
resumed=(--h1 -c 32 -n 4000 -H 'Connection: close')
# Keep-alive: 32 clients of 1,000 requests each (nginx's keepalive_requests;
# its first request pays a full handshake: 32 of 32,000).
keep=(-c 32 -m 1 -n 32000)
echo "${rounds} rounds of ${secs}s per measure and side, interleaved; h2load -t1 on CPU 0" >&2
declare -A A
for i in $(seq 1 "$rounds"); do
  read -r A[hs_e_r$i] A[hs_e_c$i] < <(h2loop "$ew" "${full[@]}" --connect-to="127.0.0.1:$ehttps" https://bench.test/_hs)
  read -r A[hs_s_r$i] A[hs_s_c$i] < <(h2loop "$sw" "${full[@]}" --connect-to="127.0.0.1:$shttps" https://bench.test/_hs)
  read -r A[res_e_r$i] A[res_e_c$i] < <(h2loop "$ew" "${resumed[@]}" --connect-to="127.0.0.1:$ehttps" https://bench.test/_hs)
  read -r A[res_s_r$i] A[res_s_c$i] < <(h2loop "$sw" "${resumed[@]}" --connect-to="127.0.0.1:$shttps" https://bench.test/_hs)
  read -r A[h2_r$i] A[h2_c$i] < <(h2loop "$ew" "${keep[@]}" --connect-to="127.0.0.1:$ehttps" https://bench.test/a.mp4)
  read -r A[h1_r$i] A[h1_c$i] < <(h2loop "$ew" "${keep[@]}" --h1 --connect-to="127.0.0.1:$eport" http://bench.test/a.mp4)
  read -r A[t1_r$i] A[t1_c$i] < <(h2loop "$ew" "${keep[@]}" --h1 --connect-to="127.0.0.1:$ehttps" https://bench.test/a.mp4)
  echo "  round $i: full handshakes/s (us worker CPU each): Lua ${A[hs_e_r$i]} (${A[hs_e_c$i]}), static ${A[hs_s_r$i]} (${A[hs_s_c$i]});" \
    "resumed: Lua ${A[res_e_r$i]} (${A[res_e_c$i]}), static ${A[res_s_r$i]} (${A[res_s_c$i]});" \
    "keep-alive req/s: h2 ${A[h2_r$i]} (${A[h2_c$i]}), http/1.1 ${A[h1_r$i]} (${A[h1_c$i]}), https/1.1 ${A[t1_r$i]} (${A[t1_c$i]})" >&2
done
read -r _ phn p50 p99 < <(curl -s -H 'Host: bench.test' "http://127.0.0.1:$eport/_bench_cert?phase=1")
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
args=()
for k in hs_e_r hs_e_c hs_s_r hs_s_c res_e_r res_e_c res_s_r res_s_c \
  h2_r h2_c h1_r h1_c t1_r t1_c; do
  v=""; for i in $(seq 1 "$rounds"); do v+="${A[$k$i]},"; done; args+=("$k=$v")
done
python3 - "$phn" "$p50" "$p99" "${args[@]}" <<'PY'
import statistics as st, sys
phn, p50, p99 = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
d = {}
for a in sys.argv[4:]:
    k, v = a.split("=")
    d[k] = [float(x) for x in v.split(",") if x]
med = lambda k: st.median(d[k])
ratio = lambda a, b: st.median([x / y for x, y in zip(d[a], d[b])])
print(f"new TLS handshakes (h2load, TLS 1.3, Connection: close): Lua certificate {med('hs_e_r'):,.0f}/s, "
      f"{med('hs_e_c'):.1f} us worker CPU each; static ssl_certificate {med('hs_s_r'):,.0f}/s, {med('hs_s_c'):.1f} us")
print(f"  ratio Lua/static (median of per-round ratios): {ratio('hs_e_r', 'hs_s_r'):.2f} handshakes/s (goal >= 0.9), "
      f"CPU static/Lua {ratio('hs_s_c', 'hs_e_c'):.2f}; Lua phase {st.median([a - b for a, b in zip(d['hs_e_c'], d['hs_s_c'])]):.1f} us CPU per handshake")
print(f"resumed handshakes (TLS 1.3 tickets): Lua {med('res_e_r'):,.0f}/s {med('res_e_c'):.1f} us; "
      f"static {med('res_s_r'):,.0f}/s {med('res_s_c'):.1f} us; ratio Lua/static {ratio('res_e_r', 'res_s_r'):.2f}; "
      f"resumed/full CPU: Lua {ratio('res_e_c', 'hs_e_c'):.2f}, static {ratio('res_s_c', 'hs_s_c'):.2f}")
busy = lambda r, c: st.median([x * y / 1e6 for x, y in zip(d[r], d[c])])
print("share of its core the worker used (rate x CPU; well below 1 the worker waited, on the one-thread client "
      "or for its shared core: compare CPU): " + ", ".join(f"{k} {busy(k + '_r', k + '_c'):.2f}" for k in ("hs_e", "hs_s", "res_e", "res_s", "h2", "h1", "t1")))
print(f"certificate phase per handshake, timed in the worker: {phn} phases, p50 {p50:.1f} us, p99 {p99:.1f} us (goal p50 <= 20 us)")
print(f"edge cached HITs, keep-alive, 32 connections: h2 over TLS {med('h2_r'):,.0f} req/s {med('h2_c'):.1f} us; "
      f"HTTP/1.1 plain {med('h1_r'):,.0f} req/s {med('h1_c'):.1f} us; HTTP/1.1 over TLS {med('t1_r'):,.0f} req/s {med('t1_c'):.1f} us")
print(f"  ratio h2/plain HTTP: {ratio('h2_r', 'h1_r'):.2f} req/s, CPU plain/h2 {ratio('h1_c', 'h2_c'):.2f}; "
      f"https/1.1 / plain: {ratio('t1_r', 'h1_r'):.2f} req/s")
PY
