# What the edge benches (edge.sh, edge_hosts.sh, tls.sh) share; sourced.

# edge_node REPO REDIS_PORT WORK LIVE SMOKE HOP HOP2 [HTTPS PROXY SMOKE_HTTPS SMOKE_PROXY]
# Writes REPO/nodes/edge-1.yaml: the edge role installed under WORK/root,
# live on 127.0.0.1:LIVE, its candidate on :SMOKE, TTL hops on HOP/HOP2,
# the cache in WORK/cache, the repository's test GeoIP database; with the
# four HTTPS ports, the live and candidate HTTPS and PROXY listeners too.
# The per-site metrics listeners on free ports: EDGE_METRICS_LIVE and
# EDGE_METRICS_CANDIDATE; EDGE_VARS and EDGE_CANDIDATE_VARS (", key: value"
# each) add template variables.
edge_node() {
  local repo=$1 rport=$2 work=$3 live=$4 smoke=$5 hop=$6 hop2=$7
  EDGE_METRICS_LIVE=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  EDGE_METRICS_CANDIDATE=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  local cm="metrics_listen: \"127.0.0.1:$EDGE_METRICS_CANDIDATE\"${EDGE_CANDIDATE_VARS:-}"
  local candidate="{ttl_hop_port: \"$hop2\", $cm}" https=""
  if [ $# -ge 11 ]; then
    candidate="{ttl_hop_port: \"$hop2\", https_listen: \"127.0.0.1:${10}\", proxy_listen: \"127.0.0.1:${11}\", $cm}"
    https="https: {listen: \"127.0.0.1:$8\", proxy_listen: \"127.0.0.1:$9\"}"
  fi
  cat > "$repo/nodes/edge-1.yaml" <<YAML
name: edge-1
roles: [edge]
region: eu
location: {lat: 52.0, lon: 4.0}
redis: {url: "redis://127.0.0.1:$rport"}
cache: {dirs: ["$work/cache"], levels: "1:2", key: \$scheme://\$host\$request_uri}
install:
  ssh: 127.0.0.1:22
  user: $(id -un)
  root: $work/root
  listen: 127.0.0.1:$live
  smoke_listen: 127.0.0.1:$smoke
  vars: {api: "false", api_url: "http://127.0.0.1:9", cache_max_size: 1g, geoip_db: "$PWD/testdata/geoip/GeoLite2-City-Test.mmdb", resolver: 127.0.0.1, ttl_hop_port: "$hop", workers: "1", metrics_listen: "127.0.0.1:$EDGE_METRICS_LIVE"${EDGE_VARS:-}}
  candidate_vars: $candidate
$https
YAML
}

# edge_placeholder WORK: the TLS listeners' placeholder certificate under
# WORK/root/tls, as `edgeform install` makes it on a node.
edge_placeholder() {
  mkdir -p "$1/root/tls"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 36500 \
    -subj '/CN=edgeform placeholder' -keyout "$1/root/tls/placeholder.key" \
    -out "$1/root/tls/placeholder.crt" >/dev/null 2>&1
}
