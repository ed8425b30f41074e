# Shared by scripts/*: messages and installing Debian packages on demand.

# Bold only on a terminal, and never with NO_COLOR set (https://no-color.org).
step() {
  if [ -t 2 ] && [ -z "${NO_COLOR:-}" ]; then
    printf '\n\033[1m==> %s\033[0m\n' "$*" >&2
  else
    printf '\n==> %s\n' "$*" >&2
  fi
}

# need_packages PKG...: install the Debian packages that are missing
# (apt-get update first). Needs root, as on a fresh machine.
# quiet_cargo ARGS...: `cargo ARGS` with its output kept in a log, shown
# only when it fails; on a terminal, one progress line (crates compiled so
# far) instead of cargo's hundreds.
quiet_cargo() {
  local log rc=0 pid n
  log="$(mktemp)"
  cargo "$@" >"$log" 2>&1 &
  pid=$!
  if [ -t 2 ]; then
    while kill -0 "$pid" 2>/dev/null; do
      n=$(grep -c '^ *Compiling ' "$log" || true)
      printf '\r    compiled %s crate(s)…' "$n" >&2
      sleep 2
    done
    printf '\r\033[K' >&2
  fi
  wait "$pid" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "cargo $* failed (exit $rc):" >&2
    tail -n 60 "$log" >&2
  fi
  rm -f "$log"
  return "$rc"
}

need_packages() {
  local missing=()
  for pkg in "$@"; do
    case "$pkg" in
      openssl) command -v openssl >/dev/null 2>&1 || missing+=("$pkg") ;;
      redis-server) command -v redis-server >/dev/null 2>&1 || missing+=("$pkg") ;;
      mosquitto) [ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || missing+=("$pkg") ;;
      *) dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg") ;;
    esac
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  step "installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What building edgeform needs beyond the Rust toolchain (git2 with https
# and ssh fetches links OpenSSL; tikv-jemalloc-sys builds jemalloc with make).
BUILD_PACKAGES=(git pkg-config libssl-dev make)

# The reference edge (edge/, docs/edge.md): nginx with OpenResty's Lua
# module. openssl makes its placeholder and test certificates; iproute2's
# `ip netns` holds the HTTPS test's viewer at a public address. luajit2 is OpenResty's LuaJIT branch the module links against;
# never install Debian's `luajit`, which conflicts and removes the module.
# lua-nginx-dns resolves the names of a site's several origins
# (edge_origins.lua).
EDGE_PACKAGES=(nginx libnginx-mod-http-lua libnginx-mod-http-ndk lua-resty-core
  lua-resty-lrucache luajit2 lua-nginx-redis lua-nginx-dns lua-cjson libnginx-mod-http-geoip2
  libnginx-mod-stream wrk curl openssl iproute2)

# Servers started by the demo, stopped by pid on exit.
SERVER_PIDS=()
SERVER_DIR="${SERVER_DIR:-$(mktemp -d)}"
stop_servers() {
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 200); do
    port_free "$1" || return 0
    sleep 0.05
  done
  echo "nothing answers on 127.0.0.1:$1" >&2
  return 1
}

# ticks PID: the CPU a process has used so far (utime + stime), in clock
# ticks (`getconf CLK_TCK` a second); read after the command name, which
# may hold spaces.
ticks() { local s f; s=$(<"/proc/$1/stat"); s=${s##*) }; read -ra f <<<"$s"; echo $((f[11] + f[12])); }

# worker_of DIR: the worker processes of the nginx master whose pid file is
# DIR/nginx.pid.
worker_of() { local m; m=$(cat "$1/nginx.pid"); for c in $(cat "/proc/$m/task/$m/children"); do
  grep -q "worker process" "/proc/$c/cmdline" 2>/dev/null && echo "$c"; done; true; }

# start_redis PORT [redis.conf lines...]: a throwaway redis-server on loopback.
start_redis() {
  local port=$1; shift
  port_free "$port" || { echo "port $port is taken; stop what runs there first" >&2; return 1; }
  local dir="$SERVER_DIR/redis-$port"
  mkdir -p "$dir"
  { echo "port $port"; echo "bind 127.0.0.1"; echo "save \"\""; echo "dir $dir"; printf '%s\n' "$@"; } > "$dir/redis.conf"
  redis-server "$dir/redis.conf" > "$dir/log" 2>&1 &
  SERVER_PIDS+=($!)
  wait_port "$port"
}

# start_sentinel PORT MASTER_NAME MASTER_PORT
start_sentinel() {
  local port=$1 name=$2 master=$3
  port_free "$port" || { echo "port $port is taken; stop what runs there first" >&2; return 1; }
  local dir="$SERVER_DIR/sentinel-$port"
  mkdir -p "$dir"
  printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %s 1\nsentinel down-after-milliseconds %s 1000\n' \
    "$port" "$dir" "$name" "$master" "$name" > "$dir/sentinel.conf"
  redis-server "$dir/sentinel.conf" --sentinel > "$dir/log" 2>&1 &
  SERVER_PIDS+=($!)
  wait_port "$port"
}

# start_mosquitto PORT: a throwaway MQTT broker on loopback (anonymous,
# loopback only).
start_mosquitto() {
  local port=$1
  port_free "$port" || { echo "port $port is taken (a system mosquitto?); stop what runs there first" >&2; return 1; }
  local dir="$SERVER_DIR/mosquitto-$port" bin
  bin="$(command -v mosquitto || echo /usr/sbin/mosquitto)"
  mkdir -p "$dir"
  # max_queued_messages: see docs/operations.md (a command burst must not be dropped).
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location %s/\nmax_queued_messages 100000\nmax_packet_size 8454144\n' "$port" "$dir" > "$dir/mosquitto.conf"
  "$bin" -c "$dir/mosquitto.conf" > "$dir/log" 2>&1 &
  SERVER_PIDS+=($!)
  wait_port "$port"
}
