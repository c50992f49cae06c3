# llama-server-common.sh - what bench/llama-server-{failover,resume,vision,drill}.sh
# share, sourced after `set -euo pipefail` with the build directory in
# $1: the spillway binary (bin), the model (model: MODEL or stories260K
# from ../shared), llama.cpp's llama-server (server, built by
# bench/llamacpp-build.sh under REF_DIR), a scratch directory (dir,
# removed at exit unless KEEP is set) and the router run in it
# (ls_start_router; router_pid, stopped at exit). free_port prints a free
# TCP port on 127.0.0.1.
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin="$build/spillway"
[ -x "$bin" ] || { echo "no $bin (build first)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/spillway
model=${MODEL:-$root/../shared/models/stories260K.gguf}
[ -f "$model" ] || { echo "no model $model (set MODEL=FILE; spillway model make makes one)" >&2; exit 1; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
ref_bin=$(cd "$root" && REF_DIR=${REF_DIR:-build-reference} bench/llamacpp-build.sh)
ref_bin=$(cd "$root" && cd "$ref_bin" && pwd)
server="$ref_bin/llama-server"
[ -x "$server" ] || { echo "no $server" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/spillway-$(basename "$0" .sh).XXXXXX")
router_pid=
cleanup() {
  [ -n "$router_pid" ] && kill "$router_pid" 2>/dev/null && wait "$router_pid" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts `spillway serve` on $dir/router.ini (log $dir/router.log) and
# waits until it listens; exits with its log when it does not.
ls_start_router() {
  SPILLWAY_LOG=info "$bin" serve --config "$dir/router.ini" > "$dir/router.log" 2>&1 &
  router_pid=$!
  for _ in $(seq 1 600); do
    grep -q "listening on" "$dir/router.log" && break
    kill -0 "$router_pid" 2>/dev/null || { cat "$dir/router.log"; exit 1; }
    sleep 0.2
  done
  grep -q "listening on" "$dir/router.log" || { echo "the router did not start" >&2; cat "$dir/router.log"; exit 1; }
}
