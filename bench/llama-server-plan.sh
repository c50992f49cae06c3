#!/usr/bin/env bash
# `spillway model plan`'s figures for a llama-server worker against what
# llama-server itself reports when it loads the file (not in `make test`:
# it needs llama.cpp).
#
#   bench/llama-server-plan.sh [BUILD_DIR]                  (default: build)
#   REF_DIR=/work/llamacpp-ref CTX=2048 SEQS=2 MODELS="a.gguf b.gguf" bench/llama-server-plan.sh
#   LLAMA_SERVER=/path/to/bin/llama-server bench/llama-server-plan.sh   (a build of one's own)
#
# For each file (MODELS; default a gpt-oss-small made here with `spillway
# model make`): the plan's weights, KV and recurrent state for
# `llama-server -c CTX*SEQS -np SEQS --kv-unified`, then that llama-server
# started on the CPU, its "model buffer", "KV buffer" and "RS buffer"
# lines summed, and both printed side by side with the difference in
# percent. Compute buffers are printed as llama-server reports them; the
# plan does not predict them.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin="$build/spillway"
[ -x "$bin" ] || { echo "no $bin (build first)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/spillway
ctx=${CTX:-2048}
seqs=${SEQS:-2}
if [ -n "${LLAMA_SERVER:-}" ]; then
  server=$LLAMA_SERVER
  ref_bin=$(cd "$(dirname "$server")" && pwd)
else
  ref_bin=$(cd "$root" && REF_DIR=${REF_DIR:-build-reference} bench/llamacpp-build.sh)
  ref_bin=$(cd "$root" && cd "$ref_bin" && pwd)
  server="$ref_bin/llama-server"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
models=${MODELS:-}
if [ -z "$models" ]; then
  "$bin" model make -o "$work/gpt-oss-small.gguf" --preset gpt-oss-small >/dev/null
  models="$work/gpt-oss-small.gguf"
fi

mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "-"; else printf "%+.1f%%", (a - b) * 100 / b }'; }
# the sum of llama-server's "<what> buffer size = X MiB" lines, in bytes
reported() {
  { grep -E "$1 buffer size" "$2" || true; } | sed -E 's/.*= *([0-9.]+) MiB.*/\1/' |
    awk '{ s += $1 } END { printf "%.0f", s * 1048576 }'
}

printf '%-28s %-10s %12s %12s %8s\n' file figure plan_MiB server_MiB diff
port=18900
for m in $models; do
  plan=$("$bin" model plan -m "$m" --ctx "$ctx" --seqs "$seqs" --json)
  field() { printf '%s' "$plan" | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', 0))"; }
  weights=$(field weights_bytes)
  [ "$weights" = 0 ] && weights=$(field weights_host_bytes)
  kv=$(field llama_server_kv_bytes)
  state=$(field llama_server_state_bytes)
  log="$work/$(basename "$m").log"
  port=$((port + 1))
  LD_LIBRARY_PATH="$ref_bin" timeout 120 "$server" -m "$m" -c $((ctx * seqs)) -np "$seqs" -kvu \
    --host 127.0.0.1 --port "$port" -t 1 -lv 4 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q "compute buffer size" "$log" && break
    grep -q "failed to load model" "$log" && break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if grep -q "failed to load model" "$log"; then
    printf '%-28s llama-server cannot load it: %s\n' "$(basename "$m")" \
      "$(grep -m1 'error loading model' "$log" | sed 's/.*error loading model: //')"
    continue
  fi
  name=$(basename "$m")
  r_weights=$(reported "model" "$log")
  r_kv=$(reported "KV" "$log")
  r_state=$(reported "RS" "$log")
  r_compute=$(reported "compute" "$log")
  printf '%-28s %-10s %12s %12s %8s\n' "$name" weights "$(mib "$weights")" "$(mib "$r_weights")" \
    "$(pct "$weights" "$r_weights")"
  printf '%-28s %-10s %12s %12s %8s\n' "$name" kv "$(mib "$kv")" "$(mib "$r_kv")" "$(pct "$kv" "$r_kv")"
  printf '%-28s %-10s %12s %12s %8s\n' "$name" state "$(mib "$state")" "$(mib "$r_state")" \
    "$(pct "$state" "$r_state")"
  printf '%-28s %-10s %12s %12s %8s\n' "$name" compute "-" "$(mib "$r_compute")" "-"
done
