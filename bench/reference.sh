#!/usr/bin/env bash
# The reference engine beside ours, on this machine, now.
#
# bench/engine.sh compares with reference figures measured once on this
# machine kind (its ref_prefill and ref_decode). On a shared VM the memory
# bandwidth a guest gets moves by a factor of two from one hour to the next
# (decode is bound by it), so a ratio against an old figure says as much
# about the neighbours as about the engine. This script measures the
# reference engine itself (llama.cpp's llama-bench, CPU build with AVX2,
# AVX-512, VNNI and BF16) and spillway alternately, run after run, on the
# same GGUF files, so both see the same machine, and prints the ratios of
# the best runs.
#
#   bench/reference.sh [BUILD_DIR]       (default: build)
#   MODELS="small-q8_0 1b-q4_0" RUNS=3 THREADS=2 bench/reference.sh
#
# The reference engine is built by bench/llamacpp-build.sh (from the npm
# registry's node-llama-cpp package, once, into build-reference/; about ten
# minutes on two cores). llama.cpp is only a yardstick: nothing of it is
# linked into spillway.
#
# Measured the same way on both sides: 2 threads, a 128-token prompt
# (prefill tok/s) and 32 generated tokens (decode tok/s). llama-bench times
# its generation from an empty context, ours after the 128-token prompt, so
# each of our decode steps attends over 128 more positions: the comparison
# leans towards the reference.
#
# SPILLWAY_CPU_KERNELS=avx512 measures spillway without the AMX tiles (a
# machine whose kernel does not grant them gets that level anyway); the
# level in use and the load average at the end of each model's runs are
# printed with its row, since on a shared machine both change the figures.
# Under load, llama.cpp's 2-thread figures collapse (its workers spin and
# wait for each other at every step): compare with THREADS=1 then.
set -euo pipefail
build=${1:-build}
bin="$build/spillway"
dir="$build/models"
threads=${THREADS:-2}
runs=${RUNS:-3}
models=${MODELS:-"small-q8_0 1b-q8_0 1b-q4_0 1b-q4_k_m"}
ref_bench="$("$(dirname "$0")/llamacpp-build.sh")/llama-bench"

# llama-bench's CSV: one row per test; the column named avg_ts is tok/s, the
# test is prompt processing when n_gen is 0 and generation when n_prompt is 0.
ref_figures() {
  "$ref_bench" -m "$1" -p 128 -n 32 -t "$threads" -r 2 -o csv 2>/dev/null |
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); col[$i] = i }; next }
             { gsub(/"/, "") ; if ($col["n_gen"] == 0) p = $col["avg_ts"]; else d = $col["avg_ts"] }
             END { print p + 0, d + 0 }'
}
our_figures() {
  local rec
  rec=$("$bin" bench engine -m "$1" --prompt 128 --gen 32 --threads "$threads" --reps 2 --json)
  printf '%s %s\n' "$(printf '%s' "$rec" | grep -o '"prefill_tokens_per_second":[-0-9.e+]*' | cut -d: -f2)" \
    "$(printf '%s' "$rec" | grep -o '"decode_tokens_per_second":[-0-9.e+]*' | cut -d: -f2)"
}
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > a) ? b : a }'; }

mkdir -p "$dir"
"$bin" bench memory --threads "$threads" --bytes 1GiB
isa=$("$bin" bench engine -m "$(dirname "$0")/../../shared/models/stories260K.gguf" --prompt 16 --gen 4 \
  --threads 1 --reps 1 --json 2>/dev/null | grep -o '"isa":"[a-z0-9]*"' | cut -d'"' -f4 || true)
echo "spillway kernels: ${isa:-unknown (../shared/models/stories260K.gguf absent)}, $threads threads"
printf '%-12s %9s %9s %6s %9s %9s %6s  %s\n' model prefill "ref" ratio decode "ref" ratio load
for m in $models; do
  file="$dir/bench-$m.gguf"
  # PRESET-TYPE: the type is after the last '-' (presets may have one: qwen3moe-small)
  [ -f "$file" ] || "$bin" model make --preset "${m%-*}" --type "${m##*-}" -o "$file" >/dev/null
  op=0; od=0; rp=0; rd=0
  for _ in $(seq "$runs"); do
    read -r p d < <(our_figures "$file"); op=$(max "$op" "$p"); od=$(max "$od" "$d")
    read -r p d < <(ref_figures "$file"); rp=$(max "$rp" "$p"); rd=$(max "$rd" "$d")
  done
  awk -v n="$m" -v op="$op" -v od="$od" -v rp="$rp" -v rd="$rd" \
    'function r(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "-" }
     BEGIN { printf "%-12s %9.1f %9.1f %6s %9.1f %9.1f %6s", n, op, rp, r(op, rp), od, rd, r(od, rd) }'
  printf '  %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
done
