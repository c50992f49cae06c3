#!/usr/bin/env bash
# Cross-checks spillway's /v1/embeddings against llama.cpp's (llama-server
# --embeddings, its OpenAI endpoint, which L2-normalises as spillway does)
# on files made by `spillway model make --pooling ...` (the last-token one
# with --add-eos, as Qwen3-Embedding's files: both engines append EOS and
# pool it): the same texts
# through both servers, compared by cosine similarity and the largest
# |difference| of one component. bench/crosscheck.sh runs it after its
# table; alone:
#
#   bench/crosscheck-embeddings.sh [BUILD_DIR]    (default: build)
#
# Both keep the KV cache in F16 and round differently inside the forward
# pass, so the vectors agree within F16 noise, not bit for bit: a row
# passes with cosine >= 0.9999 and max |difference| <= 0.01. Exits 1 when
# a row fails.
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
here=$(cd "$(dirname "$0")" && pwd)
ref_bin=$(cd "$("$here/llamacpp-build.sh")" && pwd)
work="$build/crosscheck"
mkdir -p "$work"
texts='["Once upon a time there was a little", "The quick brown fox jumps over the lazy dog.", "embeddings"]'
port_a=$((20000 + RANDOM % 20000))
port_b=$((port_a + 1))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_http() { # port
  for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}
# name -> `model make` arguments (pooling as the file declares it)
declare -A made=(
  [embed-qwen3-last]="--arch qwen3 --head-dim 128 --type f32 --pooling last --add-eos"
  [embed-llama-mean]="--type f32 --pooling mean"
  [embed-llama-cls]="--type f16 --pooling cls"
  [embed-qwen2-mean-q8_0]="--arch qwen2 --type q8_0 --pooling mean")
printf '%-28s %8s %12s %12s  %s\n' model inputs "min cos" "max|o-r|" verdict
failed=0
for m in embed-qwen3-last embed-llama-mean embed-llama-cls embed-qwen2-mean-q8_0; do
  f="$work/$m.gguf"
  # shellcheck disable=SC2086 # the table's arguments are words
  [ -f "$f" ] || "$bin" model make -o "$f" --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 \
    --vocab 2048 --seed 3 ${made[$m]} >/dev/null
  "$bin" worker -m "$f" --listen "$port_a" --no-calibrate >"$work/$m.worker.log" 2>&1 &
  pids=($!)
  "$ref_bin/llama-server" -m "$f" --port "$port_b" --embeddings -c 512 -t 2 \
    >"$work/$m.server.log" 2>&1 &
  pids+=($!)
  wait_http "$port_a" && wait_http "$port_b" ||
    { echo "crosscheck-embeddings: a server did not start (see $work/$m.*.log)" >&2; exit 1; }
  body="{\"input\": $texts}"
  curl -sf "http://127.0.0.1:$port_a/v1/embeddings" -d "$body" >"$work/$m.ours.json"
  curl -sf "http://127.0.0.1:$port_b/v1/embeddings" -H 'Content-Type: application/json' \
    -d "$body" >"$work/$m.ref.json"
  cleanup
  wait 2>/dev/null || true
  pids=()
  read -r n cos diff < <(python3 - "$work/$m.ours.json" "$work/$m.ref.json" <<'PY'
import json, math, sys
a = json.load(open(sys.argv[1]))["data"]
b = json.load(open(sys.argv[2]))["data"]
assert len(a) == len(b)
cmin, dmax = 1.0, 0.0
for x, y in zip(a, b):
    u, v = x["embedding"], y["embedding"]
    assert len(u) == len(v)
    dot = sum(p * q for p, q in zip(u, v))
    nu = math.sqrt(sum(p * p for p in u)); nv = math.sqrt(sum(q * q for q in v))
    cmin = min(cmin, dot / (nu * nv))
    dmax = max(dmax, max(abs(p - q) for p, q in zip(u, v)))
print(len(a), f"{cmin:.6f}", f"{dmax:.6f}")
PY
)
  verdict=$(awk -v c="$cos" -v d="$diff" 'BEGIN { print (c >= 0.9999 && d <= 0.01) ? "ok" : "FAIL" }')
  [ "$verdict" = ok ] || failed=1
  printf '%-28s %8s %12s %12s  %s\n' "$m" "$n" "$cos" "$diff" "$verdict"
done
exit "$failed"
