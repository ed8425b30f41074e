# Shared by scripts/*: messages and installing Debian packages on demand.

step() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }

# need_packages PKG...: install the Debian packages whose commands are
# missing (apt-get update first, once). Needs root, as on a fresh machine.
need_packages() {
  local missing=()
  for pkg in "$@"; do
    local cmd="$pkg"
    case "$pkg" in
      redis-server) cmd=redis-server ;;
      redis-sentinel) cmd=redis-sentinel ;;
      mosquitto) cmd=mosquitto ;;
    esac
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  step "installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
